#!/bin/sh
# idem keys: the operators' view, driven through the real program.
IDEM=$1
. "$(dirname "$0")/lib.sh"
export IDEM_STORE="sqlite:$TMP/keys.db"

"$IDEM" run --key done-1 --tenant acme -- echo one >/dev/null </dev/null
"$IDEM" run --key done-2 --tenant other -- echo two >/dev/null </dev/null
# A run that dies holding its key leaves an in-progress record.
"$IDEM" run --key dying --lease 200ms -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up" </dev/null &
pid=$!
wait_for "$TMP/up" || fail "the dying run did not start"
kill -KILL $pid; wait $pid 2>/dev/null

out=$("$IDEM" keys list)
expect_eq "list: three records and a header" 4 "$(printf '%s\n' "$out" | wc -l)"
out=$("$IDEM" keys list --tenant acme --json)
expect_eq "list --tenant: one record" 1 "$(printf '%s\n' "$out" | wc -l)"
expect_match "list --json: the record" '"key":"done-1".*"state":"completed"' "$out"
out=$("$IDEM" keys list --state in_progress --json)
expect_match "list --state in_progress" '"key":"dying"' "$out"
out=$("$IDEM" keys show done-1 --tenant acme --json)
expect_match "show --json: the stored output" '"body": "one\\n"' "$out"
"$IDEM" keys show nosuch 2>/dev/null
expect_eq "show of a missing key: exit 1" 1 "$?"
"$IDEM" keys bogus 2>/dev/null
expect_eq "unknown action: exit 2" 2 "$?"
"$IDEM" keys resolve dying 2>/dev/null
expect_eq "resolve needs --completed or --failed" 2 "$?"

sleep 0.3
"$IDEM" run --key dying -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up" </dev/null 2>/dev/null
expect_eq "the dead run's key is unknown" 4 "$?"
printf 'settled by hand\n' > "$TMP/body"
"$IDEM" keys resolve dying --completed --status 0 --body "$TMP/body" >/dev/null
expect_eq "resolve --completed" 0 "$?"
out=$("$IDEM" run --key dying -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up" </dev/null)
expect_eq "after resolve: the given response replays" "settled by hand" "$out"
"$IDEM" keys resolve dying --failed 2>/dev/null
expect_eq "a completed record cannot be resolved again" 1 "$?"

"$IDEM" run --key brief --retention 100ms -- echo brief >/dev/null </dev/null
sleep 0.3
out=$("$IDEM" keys prune)
expect_eq "prune removes the expired record" "pruned 1 expired records" "$out"
out=$("$IDEM" keys list --json --tenant acme)
expect_match "prune kept the live record" '"key":"done-1"' "$out"

"$IDEM" keys list --store "sqlite:$TMP/no/such/dir/x.db" 2>/dev/null
expect_eq "unopenable store: exit 1" 1 "$?"
finish
