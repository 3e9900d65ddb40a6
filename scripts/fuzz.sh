#!/bin/sh
# make fuzz: builds the libFuzzer drivers of tests/fuzz with clang (in a
# build folder of their own) and runs each in turn for FUZZ_SECONDS
# (default 60), niced. FUZZ_DRIVERS="canon numfmt" runs only those.
#
# Each driver's new inputs go to FUZZ_BUILD/corpus/NAME (kept between runs;
# the committed seeds in tests/fuzz/corpus/NAME are read, never written).
# A crash is written to FUZZ_BUILD/crashes/NAME/; to make it a regression
# test, fix the defect and copy the file into tests/fuzz/corpus/NAME/, which
# ctest's fuzz_NAME replays in every build. Prints one line per driver:
# executions, coverage (libFuzzer's cov and ft) and corpus size; exits 1
# when a driver found a crash.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FUZZ_BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
JOBS=${JOBS:-2}
CC_FUZZ=${CC_FUZZ:-clang}

cmake -S "$ROOT" -B "$FUZZ_BUILD" -DCMAKE_C_COMPILER="$CC_FUZZ" -DIDEM_FUZZ=ON \
  -DBUILD_TESTING=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$FUZZ_BUILD" --target fuzz_drivers -j "$JOBS"

status=0
summary=""
while read -r name bin corpus seeds; do
  [ -n "$name" ] || continue
  if [ -n "${FUZZ_DRIVERS:-}" ]; then
    case " $FUZZ_DRIVERS " in *" $name "*) ;; *) continue ;; esac
  fi
  work="$FUZZ_BUILD/corpus/$name"
  crashes="$FUZZ_BUILD/crashes/$name"
  log="$FUZZ_BUILD/fuzz-$name.log"
  mkdir -p "$work" "$crashes"
  echo "== fuzz $name: ${FUZZ_SECONDS}s (log: $log)"
  # shellcheck disable=SC2086
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    nice -n 10 "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$crashes/" "$work" "$corpus" $seeds >"$log" 2>&1; then
    result=ok
  else
    result="CRASH (inputs in $crashes)"
    status=1
    tail -40 "$log" >&2
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1)
  units=$(ls "$work" | wc -l)
  line="$name: $result, ${execs:-?} executions, ${cov:-cov ?}, corpus $units"
  echo "$line"
  summary="$summary$line
"
done <"$FUZZ_BUILD/fuzz_drivers.txt"
echo "== fuzz summary (${FUZZ_SECONDS}s each)"
printf '%s' "$summary"
exit $status
