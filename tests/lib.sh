# Sourced by the command-line tests: assertions that count and report.
# Each test script ends with `finish`, which prints "N passed, N failed".
PASSED=0
FAILED=0
TMP=$(mktemp -d /tmp/idem-test.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

ok() { PASSED=$((PASSED + 1)); }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*" >&2; }

# expect_eq WHAT EXPECTED ACTUAL
expect_eq() {
  if [ "$2" = "$3" ]; then ok; else fail "$1: expected [$2], got [$3]"; fi
}

# expect_match WHAT PATTERN TEXT (grep -E)
expect_match() {
  if printf '%s' "$3" | grep -Eq -- "$2"; then ok; else fail "$1: [$3] does not match /$2/"; fi
}

# wait_for FILE: waits (up to 20 s) until FILE is not empty; a loaded
# machine may take a while to start a process.
wait_for() {
  n=0
  while [ ! -s "$1" ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done
  [ -s "$1" ]
}

finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" = 0 ]
}
