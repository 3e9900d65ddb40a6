#!/bin/sh
# idem run: at-most-once commands, driven through the real program.
IDEM=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/run_lib.sh"
export IDEM_STORE="$TMP/run.db"

# The commands append a line to a file (the side effect) and print; the
# tests count the lines.

# 1. Twice with one key: one execution, the same output and status.
for status in 0 7; do
  f="$TMP/effect-$status"
  : > "$f"
  out1=$("$IDEM" run --key "twice-$status" -- sh -c 'echo ran >> "$1"; echo "out $2"; echo "err $2" >&2; exit $3' x "$f" hello "$status" 2>"$TMP/e1" </dev/null)
  s1=$?
  out2=$("$IDEM" run --key "twice-$status" -- sh -c 'echo ran >> "$1"; echo "out $2"; echo "err $2" >&2; exit $3' x "$f" hello "$status" 2>"$TMP/e2" </dev/null)
  s2=$?
  expect_eq "status of the first run ($status)" "$status" "$s1"
  expect_eq "status of the replay ($status)" "$status" "$s2"
  expect_eq "stdout of the first run" "out hello" "$out1"
  expect_eq "stdout replayed" "$out1" "$out2"
  expect_eq "stderr replayed" "$(cat "$TMP/e1")" "$(cat "$TMP/e2")"
  expect_eq "executions ($status)" 1 "$(wc -l < "$f")"
done

# 2. Eight concurrent runs with one key: one execution; the others are told
#    it is in flight (75) or get the replay.
: > "$TMP/conc"
i=0
while [ $i -lt 8 ]; do
  ( "$IDEM" run --key concurrent -- sh -c 'echo ran >> "$1"; sleep 1; echo done' x "$TMP/conc" \
      >"$TMP/conc.out.$i" 2>/dev/null </dev/null; echo $? > "$TMP/conc.st.$i" ) &
  i=$((i + 1))
done
wait
expect_eq "concurrent executions" 1 "$(wc -l < "$TMP/conc")"
zeros=0; tempfails=0; i=0
while [ $i -lt 8 ]; do
  st=$(cat "$TMP/conc.st.$i")
  if [ "$st" = 0 ]; then
    zeros=$((zeros + 1))
    expect_eq "concurrent output $i" "done" "$(cat "$TMP/conc.out.$i")"
  elif [ "$st" = 75 ]; then tempfails=$((tempfails + 1))
  else fail "concurrent run $i exited $st"; fi
  i=$((i + 1))
done
expect_eq "concurrent: every run got 0 or 75" 8 $((zeros + tempfails))
expect_match "concurrent: at least the executing run got 0" '^[1-8]$' "$zeros"
out=$("$IDEM" run --key concurrent -- sh -c 'echo ran >> "$1"; sleep 1; echo done' x "$TMP/conc" </dev/null 2>/dev/null)
expect_eq "after the race: replay" "done" "$out"

# 3. Same key, other argv: refused with 3, nothing runs.
: > "$TMP/argv"
"$IDEM" run --key argv-key -- sh -c 'echo ran >> "$1"' x "$TMP/argv" </dev/null
msg=$("$IDEM" run --key argv-key -- sh -c 'echo ran >> "$1"; echo changed' x "$TMP/argv" </dev/null 2>&1)
expect_eq "changed argv: exit status" 3 "$?"
expect_match "changed argv: message names the key" "argv-key" "$msg"
expect_eq "changed argv: executions" 1 "$(wc -l < "$TMP/argv")"

# 4. Standard input is part of the request.
out=$(echo first | "$IDEM" run --key stdin-key -- cat)
expect_eq "stdin reaches the command" "first" "$out"
echo second | "$IDEM" run --key stdin-key -- cat >/dev/null 2>&1
expect_eq "other stdin: conflict" 3 "$?"
out=$(echo first | "$IDEM" run --key stdin-key -- cat)
expect_eq "same stdin: replay" "first" "$out"

# 5. Binary output replayed byte for byte.
head -c 300000 /dev/urandom > "$TMP/blob"
"$IDEM" run --key binary -- cat "$TMP/blob" > "$TMP/blob.1" </dev/null
"$IDEM" run --key binary -- cat "$TMP/blob" > "$TMP/blob.2" </dev/null
cmp -s "$TMP/blob" "$TMP/blob.1" && ok || fail "binary output, first run"
cmp -s "$TMP/blob" "$TMP/blob.2" && ok || fail "binary output, replay"

# 6. A command ended by a signal: 128+N, stored and replayed.
"$IDEM" run --key signalled -- sh -c 'kill -TERM $$' </dev/null
expect_eq "signal status" 143 "$?"
"$IDEM" run --key signalled -- sh -c 'kill -TERM $$' </dev/null
expect_eq "signal status replayed" 143 "$?"

# 7. SIGKILL of idem run mid-command: the command dies with it, the record
#    stays in progress; after the lease a retry is refused as unknown (4),
#    and --on-unknown rerun runs it.
: > "$TMP/killed"
"$IDEM" run --key killed --lease 500ms -- sh -c 'echo started >> "$1"; sleep 2; echo finished >> "$1"' x "$TMP/killed" </dev/null &
pid=$!
wait_for "$TMP/killed" || fail "killed: the command did not start"
kill -KILL $pid
wait $pid 2>/dev/null
sleep 2.2
expect_eq "killed: the command died with idem run" "started" "$(cat "$TMP/killed")"
msg=$("$IDEM" run --key killed --lease 500ms -- sh -c 'echo started >> "$1"; sleep 2; echo finished >> "$1"' x "$TMP/killed" </dev/null 2>&1)
expect_eq "killed: retry refused as unknown" 4 "$?"
expect_match "killed: message says outcome unknown" "outcome unknown" "$msg"
expect_match "killed: message allows for a holder still alive" "may still be running or may have died" "$msg"
"$IDEM" run --key killed --lease 500ms --on-unknown rerun -- sh -c 'echo started >> "$1"; sleep 2; echo finished >> "$1"' x "$TMP/killed" </dev/null 2>/dev/null
expect_eq "killed: rerun exit status" 0 "$?"
expect_eq "killed: rerun ran the command" "started started finished" "$(tr '\n' ' ' < "$TMP/killed" | sed 's/ $//')"

# 7b. SIGTERM to idem run: the command is terminated too, idem run exits
#     128+15, and the key is marked unknown: the command may have acted.
: > "$TMP/termed"
"$IDEM" run --key termed --lease 5s -- sh -c 'echo started >> "$1"; sleep 2; echo finished >> "$1"' x "$TMP/termed" </dev/null 2>/dev/null &
pid=$!
wait_for "$TMP/termed" || fail "SIGTERM: the command did not start"
kill -TERM $pid
wait $pid
expect_eq "SIGTERM: idem run exits 143" 143 "$?"
sleep 2
expect_eq "SIGTERM: the command was terminated" "started" "$(cat "$TMP/termed")"
"$IDEM" run --key termed --lease 5s -- sh -c 'echo started >> "$1"; sleep 2; echo finished >> "$1"' x "$TMP/termed" </dev/null 2>/dev/null
expect_eq "SIGTERM: a retry is refused as unknown" 4 "$?"

# 8. A command that runs past its lease is renewed, never taken over.
: > "$TMP/long"
"$IDEM" run --key long --lease 300ms -- sh -c 'echo ran >> "$1"; sleep 3; echo long-done' x "$TMP/long" >"$TMP/long.out" </dev/null &
pid=$!
wait_for "$TMP/long" || fail "long: the command did not start"
sleep 0.6 # two leases of 300 ms: alive only because it is renewed
"$IDEM" run --key long --lease 300ms -- sh -c 'echo ran >> "$1"; sleep 3; echo long-done' x "$TMP/long" >/dev/null 2>&1 </dev/null
expect_eq "long: a second run while it lives is in flight" 75 "$?"
wait $pid
expect_eq "long: first run status" 0 "$?"
expect_eq "long: executions" 1 "$(wc -l < "$TMP/long")"
out=$("$IDEM" run --key long --lease 300ms -- sh -c 'echo ran >> "$1"; sleep 3; echo long-done' x "$TMP/long" </dev/null)
expect_eq "long: replay afterwards" "long-done" "$out"

# 9. A command that is not found: 127, and the key is free again.
"$IDEM" run --key missing -- /nonexistent/command </dev/null 2>/dev/null
expect_eq "missing command: 127" 127 "$?"
out=$("$IDEM" run --key missing -- /nonexistent/command </dev/null 2>&1)
expect_match "missing command: not stored, tried again" "No such file" "$out"

# 9b. An argument that is not UTF-8: the request is still JSON, that
#     argument's bytes in hex, so it is kept for operators; one byte more
#     is another request.
: > "$TMP/latin1"
arg=$(printf 'caf\351')
"$IDEM" run --key latin1 -- sh -c 'echo ran >> "$1"' x "$TMP/latin1" "$arg" </dev/null
expect_eq "non-UTF-8 argument: status" 0 "$?"
"$IDEM" run --key latin1 -- sh -c 'echo ran >> "$1"' x "$TMP/latin1" "$arg" </dev/null
expect_eq "non-UTF-8 argument: replay" 0 "$?"
"$IDEM" run --key latin1 -- sh -c 'echo ran >> "$1"' x "$TMP/latin1" "$arg$arg" </dev/null 2>/dev/null
expect_eq "non-UTF-8 argument: another one conflicts" 3 "$?"
expect_eq "non-UTF-8 argument: executions" 1 "$(lines "$TMP/latin1")"
expect_match "non-UTF-8 argument: the request is kept" '\{"hex":"636166e9"\}' "$("$IDEM" keys show latin1)"

# 10. Usage errors.
"$IDEM" run -- true 2>/dev/null
expect_eq "no key: usage" 2 "$?"
"$IDEM" run --key 'bad key' -- true 2>/dev/null
expect_eq "bad key: usage" 2 "$?"
"$IDEM" run --key ok-key 2>/dev/null
expect_eq "no command: usage" 2 "$?"
# Options are checked before any store is opened or anything runs.
: > "$TMP/usage"
for bad in "--tenant $(printf 'a\001b')" "--store ''" "--lease 31d" "--lease 50ms" \
    "--retention 0" "--kill-after -1s" "--stdin-wait 0"; do
  eval "set -- $bad"
  msg=$("$IDEM" run --key usage-key "$@" -- sh -c 'echo ran >> "$1"' x "$TMP/usage" </dev/null 2>&1)
  expect_eq "usage: $bad" 2 "$?"
  expect_match "usage: $bad: message names the option" "$1" "$msg"
done
expect_eq "usage: nothing ran" 0 "$(lines "$TMP/usage")"

# 11. A command that closes its output is renewed until it exits: a retry
#     meanwhile, even with --on-unknown rerun, finds it in flight (75) and
#     does not run it beside the first.
closed_cmd='echo start >> "$1"; exec >/dev/null 2>&1; while [ ! -e "$2" ]; do sleep 0.05; done; echo end >> "$1"'
: > "$TMP/closed"
"$IDEM" run --key closed --lease 300ms -- sh -c "$closed_cmd" x "$TMP/closed" "$TMP/closed.go" </dev/null &
pid=$!
wait_for "$TMP/closed" || fail "closed output: the command did not start"
sleep 1 # three leases of 300 ms
"$IDEM" run --key closed --lease 300ms --on-unknown rerun -- sh -c "$closed_cmd" x "$TMP/closed" "$TMP/closed.go" </dev/null 2>/dev/null
expect_eq "closed output: a retry while it runs is in flight" 75 "$?"
: > "$TMP/closed.go"
wait $pid
expect_eq "closed output: status" 0 "$?"
expect_eq "closed output: executions" "start end" "$(words "$TMP/closed")"

# 12. One output cap shared by both streams: what is kept of stdout and
#     stderr together never exceeds --max-output (what is cut is still
#     shown live), and the result is stored.
"$IDEM" run --key cap-small --max-output 100k -- sh -c 'yes e | head -c 80000 >&2; yes o | head -c 80000' </dev/null >"$TMP/cap.out" 2>"$TMP/cap.err"
expect_eq "shared cap: status" 0 "$?"
expect_eq "shared cap: stdout shown whole" 80000 "$(wc -c < "$TMP/cap.out" | tr -d ' ')"
"$IDEM" run --key cap-small --max-output 100k -- sh -c 'yes e | head -c 80000 >&2; yes o | head -c 80000' </dev/null >"$TMP/cap.out2" 2>"$TMP/cap.err2"
expect_eq "shared cap: replay status" 0 "$?"
expect_eq "shared cap: stdout kept is what the cap left" $((102400 - 80000)) "$(wc -c < "$TMP/cap.out2" | tr -d ' ')"
expect_eq "shared cap: stderr kept whole" "$(yes e | head -c 80000 | cksum)" "$(head -c 80000 "$TMP/cap.err2" | cksum)"
expect_match "shared cap: the replay says it was cut" "truncated" "$(cat "$TMP/cap.err2")"
# The default cap (8M): 8M to stderr then 8M to stdout, and 6M + 6M.
for split in 8388608:8388608 6000000:6000000; do
  e=${split%:*}; o=${split#*:}
  "$IDEM" run --key "cap-$e" -- sh -c 'head -c "$1" /dev/zero >&2; head -c "$2" /dev/zero' x "$e" "$o" </dev/null >/dev/null 2>&1
  expect_eq "default cap $e+$o: status" 0 "$?"
  "$IDEM" run --key "cap-$e" -- sh -c 'head -c "$1" /dev/zero >&2; head -c "$2" /dev/zero' x "$e" "$o" </dev/null >"$TMP/cap.o" 2>"$TMP/cap.e"
  expect_eq "default cap $e+$o: replayed" 0 "$?"
  kept_o=$(wc -c < "$TMP/cap.o" | tr -d ' ')
  kept_e=$(tr -d '\000' < "$TMP/cap.e" | wc -c | tr -d ' ')
  kept_e=$(($(wc -c < "$TMP/cap.e" | tr -d ' ') - kept_e))
  expect_eq "default cap $e+$o: kept stdout+stderr" 8388608 $((kept_o + kept_e))
done

# 13. The command ran but its result could not be stored (here a trigger
#     refuses the completion, as a full disk would): exit 5, never 0; the
#     key is marked unknown, so a retry does not run it again (4).
sqlite3 "$IDEM_STORE" "CREATE TRIGGER refuse_unstored BEFORE UPDATE OF state ON idem_records WHEN NEW.key = 'unstored' AND NEW.state = 2 BEGIN SELECT RAISE(ABORT, 'no space left (simulated)'); END;"
: > "$TMP/unstored"
"$IDEM" run --key unstored -- sh -c 'echo ran >> "$1"; echo out' x "$TMP/unstored" </dev/null >"$TMP/unstored.out" 2>"$TMP/unstored.err"
expect_eq "unstored: exit status" 5 "$?"
expect_eq "unstored: output shown live" out "$(cat "$TMP/unstored.out")"
expect_match "unstored: message" "ran but its result was not recorded" "$(cat "$TMP/unstored.err")"
expect_match "unstored: message says the key is unknown" "marked unknown" "$(cat "$TMP/unstored.err")"
expect_eq "unstored: key marked unknown" unknown "$(state unstored)"
"$IDEM" run --key unstored -- sh -c 'echo ran >> "$1"; echo out' x "$TMP/unstored" </dev/null >/dev/null 2>&1
expect_eq "unstored: retry refused as unknown" 4 "$?"
expect_eq "unstored: executions" 1 "$(lines "$TMP/unstored")"

finish
