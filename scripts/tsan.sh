#!/bin/sh
# make tsan: the engine's tests (the store contract suites, on both stores)
# in a ThreadSanitizer build; any report fails the test that caused it.
# Usage: scripts/tsan.sh BUILD JOBS. Starts its own PostgreSQL unless
# IDEM_TEST_PG_URL names one (scripts/check.sh's).
set -eu
BUILD=${1:-build-tsan}
JOBS=${2:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${IDEM_TEST_PG_URL:-}" ]; then
  . "$ROOT/scripts/pg.sh"
  pg_start
  trap 'pg_stop' EXIT INT TERM
fi
# The store contract programs (tests/CMakeLists.txt, idem_store_test()).
TESTS="engine records concurrency stores leases execute holding api recovered schema clock seal joined"
targets=""
names=""
for t in $TESTS; do
  targets="$targets test_$t"
  names="$names|$t"
done
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DIDEM_TSAN=ON \
  -DBUILD_TESTING=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target $targets
echo "== tests (TSan) =="
# die_after_fork=0: some tests fork a holder process from a threaded one;
# the child uses its own store, as a program would.
cd "$BUILD" && TSAN_OPTIONS=halt_on_error=1:abort_on_error=1:die_after_fork=0:second_deadlock_stack=1 \
  ctest --output-on-failure --no-tests=error -j "$JOBS" -R "^(${names#|})_(sqlite|postgresql)\$"
