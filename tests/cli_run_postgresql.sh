#!/bin/sh
# idem run on PostgreSQL when the server becomes unreachable while the
# command runs and when its result is to be recorded: the lease is kept
# and the completion retried until the server answers again. The server
# is reached through a proxy of the test's own (tests/pg_proxy.py) that
# cuts every connection and refuses new ones while a flag file exists.
# Needs IDEM_TEST_PG_URL (scripts/check.sh starts a server); the test
# fails, never skips, without one.
IDEM=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/run_lib.sh"
. "$(dirname "$0")/pg_proxy.sh"

if [ -z "${IDEM_TEST_PG_URL:-}" ]; then
  fail "IDEM_TEST_PG_URL is not set: no PostgreSQL server for this test"
  # 3. SIGTERM while the completion is being retried: idem run does not die
#    between the command's end and the record; the result is recorded,
#    idem run exits with the command's status and says the signal came.
: > "$TMP/refused"
cmd='echo start >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo pg-term'
"$IDEM" run --tenant "$tenant" --key term-at-end --lease 2s -- sh -c "$cmd" x "$TMP/term" "$TMP/term.go" </dev/null >"$TMP/term.out" 2>"$TMP/term.err" &
pid=$!
wait_for "$TMP/term" || fail "term at end: the command did not start"
down
: > "$TMP/term.go"
wait_for "$TMP/refused" || fail "term at end: no completion was tried"
kill -TERM $pid
sleep 0.5
up
wait_dead $pid 450 || { fail "term at end: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "term at end: exit status" 0 "$?"
expect_match "term at end: the signal is mentioned" "signal 15" "$(cat "$TMP/term.err")"
out=$("$IDEM" run --tenant "$tenant" --key term-at-end --lease 2s -- sh -c "$cmd" x "$TMP/term" "$TMP/term.go" </dev/null)
expect_eq "term at end: replay" "0 pg-term" "$? $out"
expect_eq "term at end: executions" 1 "$(lines "$TMP/term")"

finish
  exit 1
fi
pg_proxy_start
proxy=$PG_PROXY_PID
trap 'kill $proxy 2>/dev/null; rm -rf "$TMP"' EXIT
export IDEM_STORE="$PG_PROXY_URL"
tenant="cli-run-$$-$(date +%s)"

# 1. The server goes away as the command ends and comes back 1.5 s later:
#    the completion is retried and the result recorded; exit 0, replayed.
cmd='echo start >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo pg-done'
"$IDEM" run --tenant "$tenant" --key at-end --lease 2s -- sh -c "$cmd" x "$TMP/at-end" "$TMP/at-end.go" </dev/null >"$TMP/at-end.out" 2>"$TMP/at-end.err" &
pid=$!
wait_for "$TMP/at-end" || fail "at end: the command did not start"
down
: > "$TMP/at-end.go"
sleep 1.5
up
wait_dead $pid 450 || { fail "at end: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "at end: exit status" 0 "$?"
cat "$TMP/at-end.err" >&2
expect_eq "at end: output" pg-done "$(cat "$TMP/at-end.out")"
expect_match "at end: the store was unreachable meanwhile" '^[1-9]' "$(lines "$TMP/refused")"
out=$("$IDEM" run --tenant "$tenant" --key at-end --lease 2s -- sh -c "$cmd" x "$TMP/at-end" "$TMP/at-end.go" </dev/null)
expect_eq "at end: replay" "0 pg-done" "$? $out"
expect_eq "at end: executions" 1 "$(lines "$TMP/at-end")"

# 2. The server is away for less than a lease while the command runs: the
#    command is not stopped, and its result is recorded.
: > "$TMP/refused"
cmd='echo start >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo pg-mid'
"$IDEM" run --tenant "$tenant" --key midway --lease 3s -- sh -c "$cmd" x "$TMP/midway" "$TMP/midway.go" </dev/null >"$TMP/midway.out" 2>"$TMP/midway.err" &
pid=$!
wait_for "$TMP/midway" || fail "midway: the command did not start"
down
sleep 1.5
up
: > "$TMP/midway.go"
wait_dead $pid 450 || { fail "midway: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "midway: exit status" 0 "$?"
cat "$TMP/midway.err" >&2
expect_eq "midway: output" pg-mid "$(cat "$TMP/midway.out")"
out=$("$IDEM" run --tenant "$tenant" --key midway --lease 3s -- sh -c "$cmd" x "$TMP/midway" "$TMP/midway.go" </dev/null)
expect_eq "midway: replay" "0 pg-mid" "$? $out"
expect_eq "midway: executions" 1 "$(lines "$TMP/midway")"

# 3. SIGTERM while the completion is being retried: idem run does not die
#    between the command's end and the record; the result is recorded,
#    idem run exits with the command's status and says the signal came.
: > "$TMP/refused"
cmd='echo start >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo pg-term'
"$IDEM" run --tenant "$tenant" --key term-at-end --lease 2s -- sh -c "$cmd" x "$TMP/term" "$TMP/term.go" </dev/null >"$TMP/term.out" 2>"$TMP/term.err" &
pid=$!
wait_for "$TMP/term" || fail "term at end: the command did not start"
down
: > "$TMP/term.go"
wait_for "$TMP/refused" || fail "term at end: no completion was tried"
kill -TERM $pid
sleep 0.5
up
wait_dead $pid 450 || { fail "term at end: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "term at end: exit status" 0 "$?"
expect_match "term at end: the signal is mentioned" "signal 15" "$(cat "$TMP/term.err")"
out=$("$IDEM" run --tenant "$tenant" --key term-at-end --lease 2s -- sh -c "$cmd" x "$TMP/term" "$TMP/term.go" </dev/null)
expect_eq "term at end: replay" "0 pg-term" "$? $out"
expect_eq "term at end: executions" 1 "$(lines "$TMP/term")"

finish
