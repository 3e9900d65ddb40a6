#!/usr/bin/env python3
"""bench/canon_gen.py -- the documents of bench/canon.sh, deterministic.

Usage: python3 bench/canon_gen.py DIR SHAPE SIZE_MB [SEED]

Writes DIR/SHAPE-SIZE_MBmb.json, a JSON text of about SIZE_MB * 1,000,000
bytes (it stops at the first element past the size), the same bytes for
the same SHAPE, SIZE_MB and SEED (default 8785) on any machine:

  ints     an array of integers of 1 to 25 digits, a third negative, some
           beyond 2^53 (read as doubles by every JSON canonicalizer: their
           canonical form is the double's, 1e+21 and up in exponent form)
  doubles  an array of doubles from 1e-310 (subnormal) to 1e+300 written
           with Python's repr (shortest round trip, 1e-05, 1.5e+300, 3.0),
           some integral, a third negative
  strings  an array of objects of 3 to 12 string members each, keys from
           ASCII words, accented and CJK letters and an astral character
           (whose UTF-16 order differs from its code point order), values
           with escapes (\\n, \\t, \\", \\\\, \\/, \\u0001, \\u00e9,
           \\ud83d\\ude00) and raw non-ASCII text
  nested   an array of chains nested 100 to 250 deep (idem canon's limit is
           256), each level an array or an object of a few members beside
           the next level: mostly structure, short leaves

Nothing in a document needs more than IEEE doubles: no lone surrogates,
no duplicate names, no numbers out of range.
"""

import os
import random
import sys

WORDS = [
    "id", "name", "value", "type", "created_at", "updated_at", "amount",
    "currency", "status", "items", "user", "email", "tags", "meta", "a", "b",
    "z", "Zeta", "_x", "key", "idempotency", "request", "response", "count",
]
NON_ASCII_KEYS = [
    "\u00e9t\u00e9", "\u00fcber", "\u00c5ngstr\u00f6m", "na\u00efve",
    "\u65e5\u672c", "\u4e2d\u6587", "\u0391\u03b2\u03b3", "\u0436\u0443\u043a",
    "\U0001f600smile", "\ufb01ligature", "\u20acuro", "\u00df",
]
FRAGMENTS = [
    "hello", " world", "\n", "\t", '"', "\\", "/", "\u0001", "\u001f",
    "\u00e9", "\u65e5\u672c\u8a9e", "\U0001f600", "\u20ac", "\u007f", "\r",
    "\u2028", "plain ascii text ", "0123456789", "\u00a0",
]


def dump_string(rng, s):
    """A JSON string for s, written the many ways JSON allows."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "/":
            out.append("\\/" if rng.random() < 0.5 else "/")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t" if rng.random() < 0.5 else "\\u0009")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20:
            out.append("\\u%04x" % o)
        elif o > 0xFFFF:
            if rng.random() < 0.5:
                v = o - 0x10000
                out.append("\\ud%03x\\ud%03x" % (0x800 | (v >> 10),
                                                 0xC00 | (v & 0x3FF)))
            else:
                out.append(ch)
        elif o > 0x7F and rng.random() < 0.3:
            out.append("\\u%04X" % o if rng.random() < 0.5 else "\\u%04x" % o)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def gen_int(rng):
    r = rng.random()
    if r < 0.4:
        digits = rng.randint(1, 6)
    elif r < 0.8:
        digits = rng.randint(7, 15)
    elif r < 0.92:
        digits = 16  # around 2^53 = 9007199254740992
    else:
        digits = rng.randint(17, 25)
    n = rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1)
    return str(-n if rng.random() < 0.33 else n)


def gen_double(rng):
    r = rng.random()
    if r < 0.05:
        x = float(rng.randint(0, 10 ** 6))  # integral: 3.0 becomes 3
    elif r < 0.08:
        x = rng.uniform(1, 10) * 1e-310  # subnormal
    elif r < 0.40:
        x = round(rng.uniform(0, 1000), rng.randint(1, 4))  # prices, 0.1
    else:
        x = rng.uniform(1, 10) * 10.0 ** rng.randint(-300, 299)
    if rng.random() < 0.33:
        x = -x
    return repr(x)


def gen_text(rng, lo, hi):
    n = rng.randint(lo, hi)
    return "".join(rng.choice(FRAGMENTS) if rng.random() < 0.3 else
                   rng.choice(WORDS) for _ in range(n))


def gen_key(rng):
    r = rng.random()
    if r < 0.6:
        k = rng.choice(WORDS)
    elif r < 0.9:
        k = rng.choice(NON_ASCII_KEYS)
    else:
        k = gen_text(rng, 1, 3)
    return k + ("" if rng.random() < 0.5 else str(rng.randint(0, 99)))


def gen_object(rng):
    keys = []
    seen = set()
    for _ in range(rng.randint(3, 12)):
        k = gen_key(rng)
        if k not in seen:
            seen.add(k)
            keys.append(k)
    return "{" + ",".join(dump_string(rng, k) + ":" +
                          dump_string(rng, gen_text(rng, 0, 8))
                          for k in keys) + "}"


def gen_leaf(rng):
    r = rng.random()
    if r < 0.3:
        return str(rng.randint(-1000, 100000))
    if r < 0.45:
        return repr(round(rng.uniform(-100, 100), 2))
    if r < 0.75:
        return dump_string(rng, rng.choice(WORDS))
    return rng.choice(["true", "false", "null", "[]", "{}"])


def gen_chain(rng):
    """A chain nested 100 to 250 deep, built from the inside out."""
    depth = rng.randint(100, 250)
    inner = gen_leaf(rng)
    for _ in range(depth - 1):
        parts = [gen_leaf(rng) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.5:
            parts.insert(rng.randint(0, len(parts)), inner)
            inner = "[" + ",".join(parts) + "]"
        else:
            keys = rng.sample(WORDS, len(parts) + 1)
            parts.insert(rng.randint(0, len(parts)), inner)
            inner = "{" + ",".join(dump_string(rng, k) + ":" + v
                                   for k, v in zip(keys, parts)) + "}"
    return inner


GENERATORS = {
    "ints": gen_int,
    "doubles": gen_double,
    "strings": gen_object,
    "nested": gen_chain,
}


def generate(shape, size_bytes, seed):
    rng = random.Random("%s/%d/%d" % (shape, size_bytes, seed))
    gen = GENERATORS[shape]
    parts, n = [], 2
    while n < size_bytes:
        p = gen(rng)
        parts.append(p)
        n += len(p.encode("utf-8")) + 1
    return "[" + ",".join(parts) + "]"


def main(argv):
    if len(argv) not in (4, 5) or argv[2] not in GENERATORS:
        sys.stderr.write(__doc__)
        return 2
    folder, shape, size_mb = argv[1], argv[2], argv[3]
    seed = int(argv[4]) if len(argv) == 5 else 8785
    text = generate(shape, int(float(size_mb) * 1000000), seed)
    path = os.path.join(folder, "%s-%smb.json" % (shape, size_mb))
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
