#!/bin/sh
# idem run when its hold on the key ends while the command runs: the lease
# is lost (taken over, or the record removed by an operator), or the result
# cannot be recorded. The command is stopped or the failure is reported
# with exit status 5; never a silent 0.
IDEM=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/run_lib.sh"
export IDEM_STORE="$TMP/store.db"

# Says "start" in $1, then appends "tick" to $2 every tenth of a second,
# TICKS times (default: for ever, nearly).
ticker='echo start >> "$1"; n=${TICKS:-100000}
while [ $n -gt 0 ]; do echo tick >> "$2"; sleep 0.1; n=$((n - 1)); done; echo done'

# 1. An operator removes the in-progress record (`idem keys resolve
#    --failed --force`): the next renewal finds the lease gone, idem run
#    stops the command and exits 5.
: > "$TMP/removed.start"; : > "$TMP/removed.ticks"
"$IDEM" run --key removed --lease 600ms -- sh -c "$ticker" x "$TMP/removed.start" "$TMP/removed.ticks" </dev/null 2>"$TMP/removed.err" &
pid=$!
wait_lines "$TMP/removed.ticks" 2 || fail "removed: the command did not start"
"$IDEM" keys resolve removed --failed --force >/dev/null
expect_eq "removed: resolved" 0 "$?"
wait_dead $pid 100 || { fail "removed: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "removed: exit status" 5 "$?"
expect_match "removed: message" "lease.*lost" "$(cat "$TMP/removed.err")"
still "$TMP/removed.ticks" || fail "removed: the command goes on"
expect_eq "removed: one start" 1 "$(lines "$TMP/removed.start")"

# 2. idem run stopped (SIGSTOP) past its lease while its command goes on;
#    another run takes the key over (--on-unknown rerun) and completes.
#    When the first resumes, its renewal is refused as stale: it stops its
#    command and exits 5, and the key keeps the second run's result.
: > "$TMP/taken.start"; : > "$TMP/taken.ticks"; : > "$TMP/taken.second"
"$IDEM" run --key taken --lease 500ms -- sh -c "$ticker" x "$TMP/taken.start" "$TMP/taken.ticks" </dev/null 2>"$TMP/taken.err" &
pid=$!
wait_lines "$TMP/taken.ticks" 2 || fail "taken: the command did not start"
# Stopped while it holds the store's write lock (its renewal's commit), it
# would keep every other writer out, the takeover included: each try then
# waited out the busy timeout (10 s, 100 tries), as seen under stress-ng.
# So it is stopped at a moment when a writer can get in.
unlocked() {
  python3 -c '
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)
try:
    c.execute("BEGIN IMMEDIATE")
    c.execute("ROLLBACK")
except sqlite3.OperationalError:
    sys.exit(1)' "$IDEM_STORE"
}
n=0
while :; do
  kill -STOP $pid
  unlocked && break
  kill -CONT $pid
  n=$((n + 1))
  [ $n -lt 100 ] || { fail "taken: the store stayed locked"; break; }
done
n=0
while :; do
  out=$(TICKS=1 "$IDEM" run --key taken --lease 500ms --on-unknown rerun -- sh -c "$ticker" x "$TMP/taken.start" "$TMP/taken.ticks" </dev/null 2>/dev/null)
  st=$?
  [ $st = 75 ] && [ $n -lt 100 ] || break
  sleep 0.1; n=$((n + 1))
done
kill -CONT $pid
wait_dead $pid 100 || { fail "taken: the first run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "taken: the first run exits 5" 5 "$?"
expect_match "taken: message" "lease.*lost" "$(cat "$TMP/taken.err")"
still "$TMP/taken.ticks" || fail "taken: the first command goes on"
expect_eq "taken: the second run took over and completed" "0 done" "$st $out"
expect_eq "taken: two starts (the takeover ran it again)" 2 "$(lines "$TMP/taken.start")"
out=$("$IDEM" run --key taken --lease 500ms -- sh -c "$ticker" x "$TMP/taken.start" "$TMP/taken.ticks" </dev/null)
expect_eq "taken: replay of the second run" "0 done" "$? $out"

# 3. The record is removed while the command runs, and the command ends
#    before the next renewal: the completion is refused as stale; idem run
#    says the result was not recorded and exits 5.
: > "$TMP/late"
"$IDEM" run --key late --lease 60s -- sh -c 'echo start >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; echo late-done' x "$TMP/late" "$TMP/late.go" </dev/null >"$TMP/late.out" 2>"$TMP/late.err" &
pid=$!
wait_for "$TMP/late" || fail "late: the command did not start"
"$IDEM" keys resolve late --failed --force >/dev/null
: > "$TMP/late.go"
wait_dead $pid 100 || { fail "late: idem run still runs"; kill -KILL $pid; }
wait $pid
expect_eq "late: exit status" 5 "$?"
expect_eq "late: output shown" late-done "$(cat "$TMP/late.out")"
expect_match "late: message" "ran but its result was not recorded" "$(cat "$TMP/late.err")"

# 4. A signal while the key is being claimed (here the claim waits for a
#    write lock held by another process): idem run is not ended by it
#    midway (even when it reaches one of the store's threads), the claim
#    finishes, the command is not started, the key is freed, and idem run
#    exits 128+15.
: > "$TMP/claiming"
(printf 'BEGIN IMMEDIATE;\n.shell touch %s\n.shell sleep 2\nCOMMIT;\n' "$TMP/locked" | sqlite3 "$IDEM_STORE") &
locker=$!
wait_for_file() { n=0; while [ ! -e "$1" ] && [ $n -lt 200 ]; do sleep 0.1; n=$((n + 1)); done; }
wait_for_file "$TMP/locked"
"$IDEM" run --key claiming -- sh -c 'echo ran >> "$1"' x "$TMP/claiming" </dev/null 2>"$TMP/claiming.err" &
pid=$!
sleep 0.5
kill -TERM $pid
wait $pid
expect_eq "signal while claiming: exit status" 143 "$?"
wait $locker
expect_eq "signal while claiming: nothing ran" 0 "$(lines "$TMP/claiming")"
expect_eq "signal while claiming: no record" absent "$(state claiming)"
expect_match "signal while claiming: idem run saw it through" "signal 15 before the command started" "$(cat "$TMP/claiming.err")"

finish
