#!/bin/sh
# idem keys: the operators' view, driven through the real program.
IDEM=$1
PUT_RECORD=$2 # writes a record through libidem: see put_record.c
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
expect_eq "prune removes the expired record" "pruned 1 expired completed records" "$out"
out=$("$IDEM" keys list --json --tenant acme)
expect_match "prune kept the live record" '"key":"done-1"' "$out"

"$IDEM" keys list --store "sqlite:$TMP/no/such/dir/x.db" 2>/dev/null
expect_eq "unopenable store: exit 1" 1 "$?"

# --- Tenants: checked before anything is opened, for every action --------
# Each is a usage error (exit 2) that says what is wrong, never a store
# error, and never a listing of nothing.
big=$(head -c 10240 /dev/zero | tr '\0' t)
for args in "list" "show done-1" "resolve done-1 --failed"; do
  # shellcheck disable=SC2086
  msg=$("$IDEM" keys $args --tenant "$big" 2>&1)
  expect_eq "keys $args: a 10 KB tenant is a usage error" 2 "$?"
  expect_match "keys $args: a 10 KB tenant: why" \
    '^idem keys: --tenant: 10240 bytes; at most 255$' "$msg"
  msg=$("$IDEM" keys $args --tenant "$(printf 'ac\nme')" 2>&1)
  expect_eq "keys $args: a tenant with a newline is a usage error" 2 "$?"
  expect_match "keys $args: a tenant with a newline: why" \
    'control character U\+000A at byte 2' "$msg"
done
msg=$("$IDEM" keys list --tenant "$(printf 'ac\302\205me')" 2>&1)
expect_eq "a tenant with a C1 control (U+0085): exit 2" 2 "$?"
expect_match "a tenant with a C1 control: why" 'control character U\+0085' "$msg"
msg=$("$IDEM" keys show done-1 --tenant "$(printf 'ac\342\200\256me')" 2>&1)
expect_eq "a tenant with a right-to-left override (U+202E): exit 2" 2 "$?"
expect_match "a tenant with U+202E: why" \
  'invisible or reordering character U\+202E at byte 2' "$msg"
"$IDEM" keys list --tenant "$(printf '\342\201\246acme\342\201\251')" 2>/dev/null
expect_eq "a tenant with a bidi isolate (U+2066): exit 2" 2 "$?"
"$IDEM" keys list --tenant "$(printf 'ac\377me')" 2>/dev/null
expect_eq "a tenant that is not UTF-8: exit 2" 2 "$?"
out=$("$IDEM" keys list --tenant "$(printf 'caf\303\251 \302\240x')" 2>&1)
expect_eq "a tenant with accents and U+00A0 is fine" 0 "$?"
"$IDEM" keys list --operation "$big" 2>/dev/null
expect_eq "a 10 KB operation is a usage error" 2 "$?"

# --- Stored text is escaped on output --------------------------------------
# Records written by other programs (libidem accepts these names) must not
# reorder or hide what an operator sees, nor drive the terminal.
spoof_db="sqlite:$TMP/spoof.db"
"$PUT_RECORD" "$spoof_db" "$(printf 'acme\342\200\256evil')" \
  "$(printf 'op\302\23331m')" spoof-1 \
  "$(printf 'req\033[2J\342\201\246line1\nline2\\')"
expect_eq "put_record wrote a record with a spoofing tenant" 0 "$?"
out=$("$IDEM" keys list --store "$spoof_db")
expect_eq "list of a spoofing record: exit 0" 0 "$?"
expect_match "list: U+202E in the tenant is escaped" 'acme\\u202eevil' "$out"
expect_match "list: U+009B in the operation is escaped" 'op\\u009b31m' "$out"
printf '%s' "$out" | LC_ALL=C grep -q "$(printf '\342\200\256')" &&
  fail "list: the raw U+202E reached the output" || ok
printf '%s' "$out" | LC_ALL=C grep -q "$(printf '\302\233')" &&
  fail "list: the raw U+009B reached the output" || ok
out=$("$IDEM" keys list --store "$spoof_db" --json)
expect_match "list --json: U+202E as a JSON escape" 'acme\\u202eevil' "$out"
printf '%s' "$out" | LC_ALL=C grep -q "$(printf '\342\200\256')" &&
  fail "list --json: the raw U+202E reached the output" || ok
printf '%s' "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(r["tenant"] != "acme\u202eevil")'
expect_eq "list --json: still the same JSON value" 0 "$?"
"$PUT_RECORD" "$spoof_db" "" "$(printf 'op\342\200\256')" spoof-2 \
  "$(printf 'req\033[2J\342\201\246line1\nline2\\')"
out=$("$IDEM" keys show spoof-2 --store "$spoof_db" \
  --operation "$(printf 'op\342\200\256')")
expect_eq "show of a record with escapes: exit 0" 0 "$?"
expect_match "show: the operation is escaped" '^operation: +op\\u202e$' \
  "$(printf '%s\n' "$out" | grep '^operation:')"
expect_eq "show: the request is escaped, on one line" \
  'request:     req\x1b[2J\u2066line1\nline2\\' \
  "$(printf '%s\n' "$out" | grep '^request:')"
printf '%s' "$out" | LC_ALL=C grep -q "$(printf '\033')" &&
  fail "show: a raw ESC reached the output" || ok

# --- Arguments that do not belong ------------------------------------------
msg=$("$IDEM" keys prune extra 2>&1)
expect_eq "keys prune takes no KEY: exit 2" 2 "$?"
expect_match "keys prune extra: why" "unexpected argument 'extra'" "$msg"
"$IDEM" keys list extra 2>/dev/null
expect_eq "keys list takes no KEY: exit 2" 2 "$?"
"$IDEM" keys show done-1 extra --tenant acme 2>/dev/null
expect_eq "keys show takes one KEY: exit 2" 2 "$?"
msg=$("$IDEM" keys list --foo 2>&1)
expect_eq "keys list --foo: exit 2" 2 "$?"
expect_eq "keys list --foo: an unknown option" "idem keys: unknown option '--foo'" "$msg"
msg=$("$IDEM" keys list --tenant acme --foo 2>&1)
expect_eq "keys list --foo after an option: exit 2" 2 "$?"
expect_eq "keys list --foo after an option: unknown option" \
  "idem keys: unknown option '--foo'" "$msg"
msg=$("$IDEM" keys list --tenant 2>&1)
expect_eq "keys list --tenant without a value: exit 2" 2 "$?"
expect_eq "keys list --tenant without a value: why" \
  "idem keys: --tenant needs a value" "$msg"
msg=$("$IDEM" keys prune --tenant acme 2>&1)
expect_eq "keys prune --tenant (prune has no filter): exit 2" 2 "$?"
expect_match "keys prune --tenant: why" "--tenant is not an option of 'keys prune'" "$msg"
"$IDEM" keys show done-1 --tenant acme --state completed 2>/dev/null
expect_eq "keys show --state: exit 2" 2 "$?"
"$IDEM" keys resolve dying --failed --status 3 2>/dev/null
expect_eq "resolve --failed --status: exit 2" 2 "$?"
msg=$("$IDEM" keys list --store '' 2>&1)
expect_eq "--store '': exit 2" 2 "$?"
expect_eq "--store '': why" "idem keys: --store: empty store URL" "$msg"
for st in -1 256 1000 99999999999 x 1.5 ''; do
  "$IDEM" keys resolve dying --completed --status "$st" 2>/dev/null
  expect_eq "resolve --status '$st': exit 2" 2 "$?"
done
"$IDEM" run --key st-255 --lease 200ms -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up255" </dev/null &
pid=$!
wait_for "$TMP/up255" || fail "the st-255 run did not start"
kill -KILL $pid; wait $pid 2>/dev/null; sleep 0.4  # past the 200ms lease
"$IDEM" keys resolve st-255 --completed --status 255 >/dev/null
expect_eq "resolve --status 255 is fine" 0 "$?"
"$IDEM" run --key st-255 -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up255" </dev/null
expect_eq "and replays as exit status 255" 255 "$?"
out=$("$IDEM" keys list -- 2>&1)
expect_eq "keys list --: exit 0" 0 "$?"

# --- Durations: keys resolve --retention, and idem run --------------------
for d in nan inf 0x10 1e3 -5s ''; do
  msg=$("$IDEM" keys resolve dying --completed --retention "$d" 2>&1)
  expect_eq "resolve --retention '$d': exit 2" 2 "$?"
  expect_eq "resolve --retention '$d': why" \
    "idem keys: --retention: '$d' is not a duration (such as 250ms, 30s, 5m, 24h or 7d)" \
    "$msg"
done
msg=$("$IDEM" keys resolve dying --completed --retention 99999999999999999999d 2>&1)
expect_eq "resolve --retention 99999999999999999999d: exit 2" 2 "$?"
expect_eq "resolve --retention 99999999999999999999d: too large" \
  "idem keys: --retention: '99999999999999999999d' is too large (at most 36525d)" \
  "$msg"
msg=$("$IDEM" keys resolve dying --completed --retention 36526d 2>&1)
expect_eq "resolve --retention past a century: too large" \
  "idem keys: --retention: '36526d' is too large (at most 36525d)" "$msg"
msg=$("$IDEM" keys resolve dying --completed --retention 0 2>&1)
expect_eq "resolve --retention 0: too short" \
  "idem keys: --retention: '0' is too short (at least 1ms)" "$msg"
for d in nan inf -inf 0x10 1e3 ''; do
  msg=$("$IDEM" run --key dur --lease "$d" -- true 2>&1 </dev/null)
  expect_eq "run --lease '$d': exit 2" 2 "$?"
  expect_match "run --lease '$d': says --lease" '^idem run: --lease' "$msg"
done
msg=$("$IDEM" run --key dur --retention 99999999999999999999d -- true 2>&1 </dev/null)
expect_eq "run --retention 99999999999999999999d: exit 2" 2 "$?"
"$IDEM" keys show dur 2>/dev/null
expect_eq "no record was written by the refused runs" 1 "$?"

# --- The table fits its fields -----------------------------------------------
long_key=k-$(head -c 60 /dev/zero | tr '\0' x)
long_tenant=tenant-$(head -c 30 /dev/zero | tr '\0' y)
"$IDEM" run --key "$long_key" --tenant "$long_tenant" -- true </dev/null
"$IDEM" run --key short --tenant "$long_tenant" -- true </dev/null
out=$("$IDEM" keys list --tenant "$long_tenant")
expect_eq "list of long fields: a header and two rows" 3 "$(printf '%s\n' "$out" | wc -l)"
col=$(printf '%s\n' "$out" | head -n 1 | awk '{print index($0, "STATE")}')
bad=$(printf '%s\n' "$out" | tail -n +2 | awk -v c="$col" 'substr($0, c, 10) != "completed " {print}')
expect_eq "every row's state sits under STATE" "" "$bad"
expect_match "the long key is whole" "$long_key " "$out"
bad=$(printf '%s\n' "$out" | awk '{ if (NF != 7) print }')
expect_eq "every line has seven fields" "" "$bad"
# Past the first 512 rows (the ones the columns are fitted to), rows are
# printed as they come: one header, every row, a long field kept whole.
many_db="sqlite:$TMP/many.db"
"$PUT_RECORD" "$many_db" "" op key x 600
expect_eq "put_record wrote 600 records" 0 "$?"
"$PUT_RECORD" "$many_db" "" op "$long_key" x
out=$("$IDEM" keys list --store "$many_db")
expect_eq "a long listing: one header and 601 rows" 602 "$(printf '%s\n' "$out" | wc -l)"
expect_eq "a long listing: one header" 1 "$(printf '%s\n' "$out" | grep -c '^TENANT ')"
expect_match "a long listing: the last row whole" \
  "^- +op +$long_key completed +1 " "$(printf '%s\n' "$out" | tail -n 1)"
bad=$(printf '%s\n' "$out" | awk '{ if (NF != 7) print }')
expect_eq "a long listing: every line has seven fields" "" "$bad"
# A holder inside its lease may still be acting: resolve refuses it unless
# --force, and leaves it as it was.
live_db="sqlite:$TMP/live.db"
"$IDEM" run --store "$live_db" --key live --lease 30s -- sh -c 'echo up >> "$1"; sleep 30' x "$TMP/uplive" </dev/null >/dev/null 2>&1 &
lpid=$!
wait_for "$TMP/uplive" || fail "the live run did not start"
msg=$("$IDEM" keys resolve live --failed --store "$live_db" 2>&1)
expect_eq "resolve of a live holder: exit 1" 1 "$?"
expect_match "resolve of a live holder: why" "may still be acting.*force" "$msg"
out=$("$IDEM" keys list --store "$live_db" --state in_progress --json)
expect_match "the live holder is untouched" '"key":"live"' "$out"
"$IDEM" run --store "$live_db" --key live --lease 30s -- sh -c 'echo up >> "$1"; sleep 30' x "$TMP/uplive" </dev/null >/dev/null 2>&1
expect_eq "and a retry meanwhile is in flight" 75 "$?"
"$IDEM" keys resolve live --failed --force --store "$live_db" >/dev/null
expect_eq "resolve --force: exit 0" 0 "$?"
kill -TERM $lpid 2>/dev/null; wait $lpid 2>/dev/null
expect_eq "the live run's command ran once" "up" "$(cat "$TMP/uplive")"

# An unknown outcome past its retention is overdue, never pruned.
od_db="sqlite:$TMP/overdue.db"
"$IDEM" run --store "$od_db" --key od --lease 200ms --retention 300ms -- sh -c 'echo up >> "$1"; sleep 5' x "$TMP/upod" </dev/null >/dev/null 2>&1 &
opid=$!
wait_for "$TMP/upod" || fail "the overdue run did not start"
kill -KILL $opid; wait $opid 2>/dev/null
sleep 0.5
out=$("$IDEM" keys prune --store "$od_db")
expect_eq "prune leaves the abandoned record" "pruned 0 expired completed records" "$out"
out=$("$IDEM" keys list --overdue --json --store "$od_db")
expect_match "list --overdue shows it" '"key":"od".*"state":"in_progress"' "$out"
"$IDEM" run --store "$od_db" --key od -- sh -c 'echo up >> "$1"; sleep 5' x "$TMP/upod" </dev/null >/dev/null 2>&1
expect_eq "and a retry still says unknown" 4 "$?"
expect_eq "the command did not run again" "up" "$(cat "$TMP/upod")"
"$IDEM" keys list --overdue --expired --store "$od_db" 2>/dev/null
expect_eq "--overdue with --expired: exit 2" 2 "$?"

# delete removes any one record.
"$IDEM" keys delete od --store "$od_db" >/dev/null
expect_eq "delete: exit 0" 0 "$?"
"$IDEM" keys show od --store "$od_db" 2>/dev/null
expect_eq "deleted: gone" 1 "$?"
"$IDEM" keys delete od --store "$od_db" 2>/dev/null
expect_eq "delete of a missing key: exit 1" 1 "$?"

# A response completed by a run that took the key over (--on-unknown rerun
# after a run died holding it) is marked recovered; a first run's is not.
rec_db="sqlite:$TMP/recovered.db"
# The same command both times (the fingerprint is its argv): the first run
# hangs, the second finds the first one's mark and ends.
rec_cmd='if [ -s "$1" ]; then echo again; else echo up >> "$1"; sleep 5; fi'
"$IDEM" run --store "$rec_db" --key rec --lease 200ms -- sh -c "$rec_cmd" x "$TMP/uprec" </dev/null >/dev/null 2>&1 &
rpid=$!
wait_for "$TMP/uprec" || fail "the run to recover did not start"
kill -KILL $rpid; wait $rpid 2>/dev/null
sleep 0.4 # past the 200ms lease
out=$("$IDEM" run --store "$rec_db" --key rec --on-unknown rerun -- sh -c "$rec_cmd" x "$TMP/uprec" </dev/null 2>/dev/null)
expect_eq "the run that took over: exit 0" 0 "$?"
expect_eq "the run that took over: its output" "again" "$out"
"$IDEM" run --store "$rec_db" --key first -- echo first </dev/null >/dev/null
out=$("$IDEM" keys show rec --store "$rec_db")
expect_eq "show: a recovered completion" "recovered:   yes" \
  "$(printf '%s\n' "$out" | grep '^recovered:')"
expect_eq "show: its attempt" "attempt:     2" \
  "$(printf '%s\n' "$out" | grep '^attempt:')"
out=$("$IDEM" keys show first --store "$rec_db")
expect_eq "show: a first run's completion" "recovered:   no" \
  "$(printf '%s\n' "$out" | grep '^recovered:')"
out=$("$IDEM" keys show rec --store "$rec_db" --json)
expect_match "show --json: recovered" '"recovered": true' "$out"
out=$("$IDEM" keys show first --store "$rec_db" --json)
expect_match "show --json: not recovered" '"recovered": false' "$out"
out=$("$IDEM" keys list --store "$rec_db" --json)
expect_match "list --json: recovered" '"key":"rec".*"recovered":true' "$out"
expect_match "list --json: not recovered" '"key":"first".*"recovered":false' "$out"

# Listing never creates a store.
"$IDEM" keys list --store "sqlite:$TMP/none.db" 2>/dev/null
expect_eq "list of a missing store: exit 1" 1 "$?"
[ -e "$TMP/none.db" ] && fail "list created a store" || ok
finish
