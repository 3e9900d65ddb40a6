# bench/idem_arg.sh -- what the benchmark scripts that take the idem program
# as their one argument share. Sourced (`. "$(dirname "$0")/idem_arg.sh"`),
# it reads the script's own arguments and sets IDEM (the program's absolute
# path) and HERE (bench/), or exits 2 with a usage line that names the
# script (BENCH_USAGE_PREFIX, such as "BASE=<commit> ", goes before it).
if [ $# -ne 1 ]; then
  echo "usage: ${BENCH_USAGE_PREFIX:-}sh bench/$(basename "$0") PATH_TO_IDEM" >&2
  exit 2
fi
IDEM=$1
if [ ! -x "$IDEM" ]; then
  echo "bench: $IDEM is not an executable (build it first: make build)" >&2
  exit 2
fi
IDEM=$(cd "$(dirname "$IDEM")" && pwd)/$(basename "$IDEM")
HERE=$(cd "$(dirname "$0")" && pwd)
