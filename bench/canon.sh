#!/bin/sh
# bench/canon.sh -- idem canon against node's JSON.parse + JSON.stringify
# and Python's json.dumps(json.loads(x), sort_keys=True,
# separators=(',', ':')), side by side, on integer-heavy, double-heavy,
# string-heavy and deeply nested documents of 1 and 8 MB.
#
# Usage: sh bench/canon.sh PATH_TO_IDEM     (make bench runs it)
#
# bench/canon_gen.py writes the documents into a temporary folder, the
# same bytes on every run (a fixed seed):
#   ints     integers of 1 to 25 digits, a third negative, some beyond 2^53
#   doubles  doubles from subnormals to 1e+300, written with Python's repr
#   strings  objects of 3 to 12 string members: ASCII, accented, CJK and
#            astral names, values with escapes and raw non-ASCII text
#   nested   chains of arrays and objects 100 to 250 deep (idem canon's
#            default limit is 256), short leaves
# First each shape is checked once, on its first size: idem canon's output
# must be byte for byte bench/canon_node.mjs canon's (JSON.parse, then
# JSON.stringify for every string and number, members sorted by UTF-16
# code units: RFC 8785 built from V8's parts). A difference fails the
# script, before anything is timed.
#
# Then bench/canon_run.py runs BENCH_ROUNDS rounds; in each, for each
# document, the three tools one after the other, their order rotating:
#   idem    `idem canon FILE` as a process, timed from outside (start-up
#           included; idem canon on `{}` is timed too and printed)
#   node    one node process reads the file, runs JSON.stringify(JSON.parse(
#           text)) once untimed, then times it (start-up not timed)
#   python  the same in one python3 process with json.dumps(json.loads())
# each taking up to BENCH_CANON_ITERS timed passes per round (stopping
# early once BENCH_CANON_ROUND_SECONDS have gone into them), the round's
# figure their median. A tool whose timed passes of one document add up
# to BENCH_CANON_BUDGET seconds skips it in later rounds: a run stays
# within minutes even when one tool takes seconds a pass (the table says
# how many rounds each median has). It prints, per document, the medians
# of the rounds in MB/s (10^6 bytes of input per second; idem's also net
# of its start-up, the time of `{}`) and the ratios idem/node, net/node
# and idem/python; then the targets: idem canon >= 1.0x node on every
# document (moonshot 2.0x), on the process's figure and on the net one. A
# missed target is reported, not a failure. Python's output is not RFC 8785
# (it escapes non-ASCII, keeps big integers exact, sorts by code point): it
# is there for scale only.
#
# Environment: BENCH_ROUNDS (default 5), BENCH_CANON_SIZES (MB, default
# "1 8"), BENCH_CANON_SHAPES (default "ints doubles strings nested"),
# BENCH_CANON_ITERS (timed passes per tool, document and round, default 3),
# BENCH_CANON_ROUND_SECONDS (default 2), BENCH_CANON_BUDGET (seconds,
# default 10), BENCH_CANON_VERIFY (first: each shape's first size, the
# default; all: every document), BENCH_CANON_SEED (default 8785),
# BENCH_CANON_DIR (keep the documents in this folder, and reuse those
# already there, instead of a temporary folder). About 3 minutes with the
# defaults on 2 cores while idem canon formats numbers at about 1 MB/s
# (its 8 MB number documents then take seconds a pass, hence the budget),
# less once it keeps up with node. Exits non-zero only when a run fails or
# an output differs from node's canonical form.
set -eu

. "$(dirname "$0")/idem_arg.sh"
ROUNDS=${BENCH_ROUNDS:-5}
SIZES=${BENCH_CANON_SIZES:-1 8}
SHAPES=${BENCH_CANON_SHAPES:-ints doubles strings nested}
ITERS=${BENCH_CANON_ITERS:-3}
ROUND_S=${BENCH_CANON_ROUND_SECONDS:-2}
BUDGET=${BENCH_CANON_BUDGET:-10}
VERIFY=${BENCH_CANON_VERIFY:-first}
SEED=${BENCH_CANON_SEED:-8785}

for tool in node python3; do
  command -v $tool >/dev/null 2>&1 ||
    { echo "bench/canon.sh: $tool not found" >&2; exit 1; }
done

if [ -n "${BENCH_CANON_DIR:-}" ]; then
  W=$BENCH_CANON_DIR
  mkdir -p "$W"
  KEEP=1
else
  W=$(mktemp -d /tmp/idem-canonbench.XXXXXX)
  KEEP=0
fi
cleanup() {
  rm -f "$W/out.idem" "$W/out.node"
  [ "$KEEP" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'echo "bench: stopped by a signal" >&2; exit 1' INT TERM HUP

# The documents: only those asked for are in the folder the rounds read.
mkdir -p "$W/docs"
rm -f "$W/docs/"*mb.json
printf '{}' >"$W/docs/empty.json"
for shape in $SHAPES; do
  for size in $SIZES; do
    f="$W/$shape-${size}mb-$SEED.json"
    [ -s "$f" ] || {
      python3 "$HERE/canon_gen.py" "$W" "$shape" "$size" "$SEED" >/dev/null
      mv "$W/$shape-${size}mb.json" "$f"
    }
    d="$W/docs/$shape-${size}mb.json"
    ln -f "$f" "$d" 2>/dev/null || cp "$f" "$d"
  done
done

V8=$(node -p process.versions.v8)
PY=$(python3 -c 'import platform; print(platform.python_version())')
echo "idem canon against node (JSON.parse + JSON.stringify, V8 $V8) and"
echo "python $PY (json.loads + json.dumps);"
echo "$(nproc) CPUs, $ROUNDS rounds of up to $ITERS passes each, medians; $(date -u '+%Y-%m-%d %H:%M UTC')"
echo

# Correctness: idem canon against RFC 8785 built from V8's parse and
# number and string serialization.
bad=0
for shape in $SHAPES; do
  for size in $SIZES; do
    f="$W/docs/$shape-${size}mb.json"
    if ! "$IDEM" canon -n "$f" >"$W/out.idem"; then
      echo "FAIL $shape ${size} MB: idem canon exited non-zero" >&2
      bad=1
    elif ! node "$HERE/canon_node.mjs" canon "$f" >"$W/out.node"; then
      echo "FAIL $shape ${size} MB: canon_node.mjs failed" >&2
      bad=1
    elif ! cmp -s "$W/out.idem" "$W/out.node"; then
      echo "FAIL $shape ${size} MB: idem canon differs from node's canonical form: $(cmp "$W/out.idem" "$W/out.node" 2>&1 | head -n 1)" >&2
      python3 - "$W/out.idem" "$W/out.node" <<'EOF' >&2
import sys
a, b = (open(p, "rb").read() for p in sys.argv[1:3])
i = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
print("  idem: ...%r..." % a[max(0, i - 40):i + 40])
print("  node: ...%r..." % b[max(0, i - 40):i + 40])
EOF
      bad=1
    else
      echo "ok   $shape ${size} MB: idem canon = node's canonical form ($(wc -c <"$W/out.idem") bytes)"
    fi
    [ "$VERIFY" = all ] || break
  done
done
rm -f "$W/out.idem" "$W/out.node"
if [ "$bad" != 0 ]; then
  echo "bench/canon.sh: idem canon's output differs from the reference" >&2
  exit 1
fi
echo

python3 "$HERE/canon_run.py" run "$IDEM" "$W/docs" "$ROUNDS" "$ITERS" "$ROUND_S" "$BUDGET"
