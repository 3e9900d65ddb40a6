#!/usr/bin/env python3
"""idem canon on a 16 MiB document: the right output, and a memory peak
near the input's size.

usage: canon_memory.py IDEM [SANITIZE]

The document is generated (the same every run): pretty-printed records with
members in shuffled order, strings with escapes and non-ASCII characters
(written as \\uXXXX escapes, surrogate pairs included), nested objects and
arrays, integers and binary fractions. On that domain Python's own
json.dumps(sort_keys=True) writes exactly RFC 8785's form (no member name
above U+FFFF, no number that ECMAScript writes differently), so it is the
reference.

The peak is the child's maximum resident set size. The canonical form is
returned whole by idem_canonicalize(), so input plus output is the floor; the
bound allows a third copy and the program's baseline. Under the sanitizers
the allocator keeps freed memory in quarantine and adds shadow memory, so
there the figure is printed and the bound is not applied (the test says so).
"""
import hashlib
import json
import random
import resource
import subprocess
import sys
import tempfile
import os

SIZE = 16 * 1024 * 1024 - 4096  # under the 16 MiB limit of idem canon

passed = failed = 0


def ok():
    global passed
    passed += 1


def fail(msg):
    global failed
    failed += 1
    print("FAIL: " + msg, file=sys.stderr)


def record(rng, i):
    words = ["alpha", "beta", "gamma", "caf\u00e9", "\u20ac 12", "\u4e2d\u6587",
             "tab\there", "quote\"d", "back\\slash", "line\nbreak",
             "ctl\u0001\u001f", "slash/ok", "del\u007f", "\U0001f602 smile",
             "\ue000 private"]
    r = {
        "id": i,
        "name": "item-%d %s" % (i, rng.choice(words)),
        "price": rng.randint(0, 10 ** 6) + rng.choice([0.25, 0.5, 0.75]),
        "count": rng.randint(-10 ** 12, 10 ** 12),
        "active": rng.random() < 0.5,
        "note": None if rng.random() < 0.3 else rng.choice(words) * rng.randint(1, 4),
        "tags": [rng.choice(words) for _ in range(rng.randint(0, 5))],
        "dims": {"w": rng.randint(1, 500), "h": rng.randint(1, 500),
                 "unit\u00b5": rng.choice(["mm", "cm"])},
        "history": [{"at": rng.randint(0, 2 ** 40), "by": rng.choice(words),
                     "delta": rng.randint(-99, 99) + 0.5}
                    for _ in range(rng.randint(0, 3))],
    }
    keys = list(r)
    rng.shuffle(keys)
    return {k: r[k] for k in keys}


def generate(tmp):
    """Writes big.json and the SHA-256 of its canonical form (want.sha256)."""
    rng = random.Random(8785)
    # Records until the next one would pass SIZE.
    parts, size, i = [], 2, 0
    while True:
        text = json.dumps(record(rng, i), indent=1, ensure_ascii=True)
        if size + len(text) + 2 > SIZE:
            break
        parts.append(text)
        size += len(text) + 2
        i += 1
    doc = "[\n" + ",\n".join(parts) + "\n]"
    with open(os.path.join(tmp, "big.json"), "w", encoding="ascii") as f:
        f.write(doc)
    want = json.dumps(json.loads(doc), sort_keys=True, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")
    with open(os.path.join(tmp, "want.sha256"), "w") as f:
        f.write("%s %d %d\n" % (hashlib.sha256(want).hexdigest(), len(want), i))


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    idem = sys.argv[1]
    sanitize = len(sys.argv) > 2 and sys.argv[2] == "ON"
    with tempfile.TemporaryDirectory(prefix="idem-canon-mem.") as tmp:
        # The document is made by another process: a child's peak counts
        # the memory of the process it was started from, so this one must
        # stay small until the measured run is over.
        subprocess.check_call([sys.executable, __file__, "--generate", tmp])
        path = os.path.join(tmp, "big.json")
        out_path = os.path.join(tmp, "out")
        with open(os.path.join(tmp, "want.sha256")) as f:
            want_hash, want_len, records = f.read().split()
        in_size = os.path.getsize(path)
        print("input: %d bytes, %s records; canonical form: %s bytes"
              % (in_size, records, want_len))

        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        pid = os.posix_spawn(idem, [idem, "canon", "-n", path], os.environ,
                             file_actions=[(os.POSIX_SPAWN_DUP2, fd, 1)])
        os.close(fd)
        _, status, usage = os.wait4(pid, 0)
        peak = usage.ru_maxrss * 1024
        rc = os.waitstatus_to_exitcode(status)
        if rc == 0:
            ok()
        else:
            fail("idem canon exited %d" % rc)
        got_hash = file_sha256(out_path)
        if got_hash == want_hash and os.path.getsize(out_path) == int(want_len):
            ok()
        else:
            fail("the canonical form (%d bytes, %s) differs from the reference "
                 "(%s bytes, %s)" % (os.path.getsize(out_path), got_hash,
                                     want_len, want_hash))
        got = subprocess.run([idem, "canon", "--hash", path],
                             stdout=subprocess.PIPE).stdout.decode().strip()
        if got == want_hash:
            ok()
        else:
            fail("--hash: %s, want %s" % (got, want_hash))

        print("peak resident memory: %.1f MB, %.2f times the input"
              % (peak / 1e6, peak / in_size))
        bound = 3 * in_size + 16 * 1024 * 1024
        if sanitize:
            print("memory bound (%.1f MB) not applied under the sanitizers"
                  % (bound / 1e6))
        elif peak <= bound:
            ok()
        else:
            fail("peak resident memory %.1f MB is above %.1f MB (three times "
                 "the input, plus 16 MiB)" % (peak / 1e6, bound / 1e6))
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--generate":
        generate(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
