#!/bin/sh
# bench/engine.sh -- the engine's own figures (docs/bench.md, "The engine"):
# builds bench/engine_bench.c in BUILD_DIR and runs it. `make bench` runs it
# after bench/run.sh.
#
# Usage: sh bench/engine.sh BUILD_DIR [ENGINE_BENCH_ARGS...]
#
# engine_bench prints, each measured side by side in one process:
#   (a) idem_execute() against idem_claim() + idem_complete(): calls/s, 1 and
#       16 workers, ENGINE_ROUNDS rounds (default 5) of BENCH_SECONDS
#       (default 2) per run, medians and the ratio;
#   (b) 10,000 idem_execute() calls in flight at once (a thread each, 64 KiB
#       stacks), leases of 1500 ms, actions of 5 s: the library's threads at
#       the peak, leases lost, time taken;
#   (c) how soon a claim waiting with wait_ms hears of the holder's
#       completion: same process, another process.
# Every part runs on SQLite (stores in TMPDIR) and, unless BENCH_PG=0, on a
# throwaway PostgreSQL cluster (scripts/pg.sh), or on the server of
# IDEM_BENCH_PG_URL when that is set. BENCH_SQLITE=0 skips SQLite. A missed
# target is reported, never a failure; the exit status is non-zero only when
# a call failed or answered an unexpected outcome.
set -eu

if [ $# -lt 1 ]; then
  echo "usage: sh bench/engine.sh BUILD_DIR [ENGINE_BENCH_ARGS...]" >&2
  exit 2
fi
BUILD=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH_PG=${BENCH_PG:-1}
BENCH_SQLITE=${BENCH_SQLITE:-1}

cmake --build "$BUILD" --target engine_bench >/dev/null
BIN=$BUILD/bench/engine_bench

. "$HERE/../scripts/pg.sh"
trap 'pg_stop' EXIT
trap 'exit 130' INT TERM
stores=
[ "$BENCH_SQLITE" = 0 ] || stores=sqlite
if [ "$BENCH_PG" != 0 ]; then
  if [ -z "${IDEM_BENCH_PG_URL:-}" ]; then
    if pg_start >&2; then
      IDEM_BENCH_PG_URL=$IDEM_TEST_PG_URL
      export IDEM_BENCH_PG_URL
    else
      echo "bench: could not start PostgreSQL (install it: sh scripts/deps.sh bench; or skip: BENCH_PG=0)" >&2
      exit 1
    fi
  fi
  stores=${stores:+$stores,}postgresql
fi
if [ -z "$stores" ]; then
  echo "bench: BENCH_SQLITE=0 and BENCH_PG=0: nothing to run" >&2
  exit 2
fi
"$BIN" --stores "$stores" --rounds "${ENGINE_ROUNDS:-5}" \
  --seconds "${BENCH_SECONDS:-2}" "$@"
