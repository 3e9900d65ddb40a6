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

finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" = 0 ]
}
