#!/bin/sh
# idem run and its standard input: read within a bound, never waited on
# forever, and an empty input is the same request as no input.
IDEM=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/run_lib.sh"
export IDEM_STORE="$TMP/stdin.db"
export TMPDIR="$TMP"

# 1. Input larger than --max-input: refused before anything runs (125),
#    nothing stored, and idem run does not go on reading it.
: > "$TMP/big"
yes | "$IDEM" run --key big --max-input 1M -- sh -c 'echo ran >> "$1"; head -1' x "$TMP/big" >/dev/null 2>"$TMP/big.err"
expect_eq "input over --max-input: exit status" 125 "$?"
expect_match "input over --max-input: message" "larger than --max-input" "$(cat "$TMP/big.err")"
expect_eq "input over --max-input: nothing ran" 0 "$(lines "$TMP/big")"
expect_eq "input over --max-input: no record" absent "$(state big)"
# The default bound holds too (`yes` never ends).
yes | "$IDEM" run --key big -- sh -c 'echo ran >> "$1"; head -1' x "$TMP/big" >/dev/null 2>"$TMP/big.err"
expect_eq "input over the default bound: exit status" 125 "$?"
expect_eq "input over the default bound: nothing ran" 0 "$(lines "$TMP/big")"
expect_eq "input over the default bound: no spooled copy left" "" "$(ls "$TMP" | grep idem-run-stdin)"
# Within the bound, the input is passed on whole.
out=$(head -c 1048576 /dev/zero | "$IDEM" run --key big --max-input 1M -- sh -c 'echo ran >> "$1"; wc -c' x "$TMP/big")
expect_eq "input within --max-input: status" 0 "$?"
expect_eq "input within --max-input: passed on" 1048576 "$(echo $out)"
expect_eq "input within --max-input: ran" 1 "$(lines "$TMP/big")"

# 2. Standard input that stays open without sending anything, or goes
#    quiet without ending: idem run gives up after --stdin-wait (125),
#    nothing runs, nothing is stored.
mkfifo "$TMP/fifo"
for feed in quiet half; do
  if [ $feed = quiet ]; then sleep 60 > "$TMP/fifo" &
  else (echo part; exec sleep 60) > "$TMP/fifo" &
  fi
  holder=$!
  : > "$TMP/$feed"
  "$IDEM" run --key "$feed" --stdin-wait 300ms -- sh -c 'echo ran >> "$1"' x "$TMP/$feed" < "$TMP/fifo" 2>"$TMP/$feed.err" &
  pid=$!
  wait_dead $pid 100 || { fail "$feed stdin: idem run still waits"; kill -KILL $pid; }
  wait $pid
  expect_eq "$feed stdin: exit status" 125 "$?"
  expect_match "$feed stdin: message" "standard input.*--stdin ignore" "$(cat "$TMP/$feed.err")"
  expect_eq "$feed stdin: nothing ran" 0 "$(lines "$TMP/$feed")"
  expect_eq "$feed stdin: no record" absent "$(state "$feed")"
  pkill -KILL -P $holder 2>/dev/null; kill -KILL $holder 2>/dev/null; wait $holder 2>/dev/null
done

# 3. --stdin ignore: standard input is neither read nor part of the
#    request; the command gets /dev/null. The same request as no input.
sleep 60 > "$TMP/fifo" &
holder=$!
: > "$TMP/ignored"
out=$("$IDEM" run --key ignored --stdin ignore -- sh -c 'echo ran >> "$1"; cat; echo done' x "$TMP/ignored" < "$TMP/fifo")
expect_eq "--stdin ignore: status" 0 "$?"
expect_eq "--stdin ignore: the command read nothing" done "$out"
kill -KILL $holder; wait $holder 2>/dev/null
out=$("$IDEM" run --key ignored -- sh -c 'echo ran >> "$1"; cat; echo done' x "$TMP/ignored" </dev/null)
expect_eq "--stdin ignore then </dev/null: replay" done "$out"
expect_eq "--stdin ignore: executions" 1 "$(lines "$TMP/ignored")"

# 4. An empty standard input, /dev/null and a closed one are one request
#    (a cron retry must not conflict with a run from elsewhere); input with
#    bytes in it is another.
: > "$TMP/empty"
"$IDEM" run --key empty -- sh -c 'echo ran >> "$1"; echo once' x "$TMP/empty" </dev/null >/dev/null
expect_eq "empty: first run" 0 "$?"
out=$(: | "$IDEM" run --key empty -- sh -c 'echo ran >> "$1"; echo once' x "$TMP/empty")
expect_eq "empty pipe after /dev/null: replay" "0 once" "$? $out"
out=$("$IDEM" run --key empty -- sh -c 'echo ran >> "$1"; echo once' x "$TMP/empty" <&-)
expect_eq "closed stdin after /dev/null: replay" "0 once" "$? $out"
printf x | "$IDEM" run --key empty -- sh -c 'echo ran >> "$1"; echo once' x "$TMP/empty" >/dev/null 2>&1
expect_eq "one byte of input: another request" 3 "$?"
expect_eq "empty: executions" 1 "$(lines "$TMP/empty")"

# 5. Usage errors.
"$IDEM" run --key u --stdin maybe -- true </dev/null 2>/dev/null
expect_eq "--stdin maybe: usage" 2 "$?"
"$IDEM" run --key u --max-input lots -- true </dev/null 2>/dev/null
expect_eq "--max-input lots: usage" 2 "$?"
"$IDEM" run --key u --stdin-wait soon -- true </dev/null 2>/dev/null
expect_eq "--stdin-wait soon: usage" 2 "$?"

finish
