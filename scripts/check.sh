#!/bin/sh
# make check: build twice (normal, then ASan+UBSan) and run every test on both,
# then the engine's tests in a third build with ThreadSanitizer.
# A throwaway PostgreSQL cluster is started for the PostgreSQL tests and
# stopped at the end, also when a test fails.
set -eu
BUILD=${1:-build}
ASAN_BUILD=${2:-build-asan}
JOBS=${3:-2}
TSAN_BUILD=${4:-build-tsan}
ROOT=$(cd "$(dirname "$0")/.." && pwd)

. "$ROOT/scripts/pg.sh"
pg_start
trap 'pg_stop' EXIT INT TERM

status=0
# BUILD_TESTING=ON: a build folder configured without the tests must not
# make this run none.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON >/dev/null
cmake --build "$BUILD" -j "$JOBS"
echo "== tests (RelWithDebInfo) =="
(cd "$BUILD" && ctest --output-on-failure --no-tests=error -j "$JOBS") || status=1

cmake -S "$ROOT" -B "$ASAN_BUILD" -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON \
  -DBUILD_TESTING=ON >/dev/null
cmake --build "$ASAN_BUILD" -j "$JOBS"
echo "== tests (ASan+UBSan) =="
(cd "$ASAN_BUILD" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --no-tests=error -j "$JOBS") || status=1

sh "$ROOT/scripts/tsan.sh" "$TSAN_BUILD" "$JOBS" || status=1
exit $status
