#!/bin/sh
# idem serve keeps no request body at rest: a keyed JSON POST with a card
# number and its CVC leaves only the request's fingerprint in the store
# (no copy of the digits in the database, its WAL or its shared memory
# file, while the gateway runs and after it stops); a retry still replays
# and a changed body is still 422. --keep-requests keeps the request for
# operators (idem keys show) and a 422 that names what differed.
# --seal-key seals the stored answers (AES-256-GCM): no copy of an answer's
# text in the store's files; replays and idem keys show open them with the
# key, after a rotation too (a new key first, the old one after it), and a
# gateway without the old key replays nothing of its records.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

CARD=4111111111111111
BODY='{"title":"Pay","card":"'$CARD'","cvc":"737"}'
# copies DB: copies of the card number in the store's files.
copies() {
  n=0
  for f in "$1" "$1-wal" "$1-shm"; do
    [ -f "$f" ] && n=$((n + $(grep -a -o "$CARD" "$f" | wc -l)))
  done
  echo $n
}

start_upstream up || { finish; exit 1; }
for mode in default keep; do
  DB=$TMP/$mode.db
  if [ $mode = keep ]; then
    start_gateway "$mode" --upstream "$UP" --store "$DB" --keep-requests || { finish; exit 1; }
  else
    start_gateway "$mode" --upstream "$UP" --store "$DB" || { finish; exit 1; }
  fi
  post "$mode-1" "pay-$mode" "$BODY"
  post "$mode-2" "pay-$mode" '{"cvc":"737","card":"'$CARD'","title":"Pay"}'
  post "$mode-3" "pay-$mode" '{"title":"Pay","card":"'$CARD'","cvc":"738"}'
  expect_eq "$mode: forwarded once, replayed, a changed body refused" \
    "201 201 true $(json "$mode-1" ticket_id) 422 1" \
    "$(code "$mode-1") $(code "$mode-2") $(header "$mode-2" Idempotent-Replayed) $(json "$mode-2" ticket_id) $(code "$mode-3") $(effects "pay-$mode")"
  running=$(copies "$DB")
  stop_gateway "$GW_PID"
  stopped=$(copies "$DB")
  shown=$("$IDEM" keys show "pay-$mode" --store "$DB" --operation 'POST /tickets' --json)
  if [ $mode = default ]; then
    expect_eq "default: no copy of the card number in the store, running or stopped" \
      "0 0" "$running $stopped"
    expect_eq "default: idem keys show: completed, no request" "completed None" \
      "$(printf '%s' "$shown" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["state"], r.get("request"))')"
    expect_match "default: the 422 does not guess what differed" \
      "the query or the body differed" "$(json "$mode-3" detail)"
  else
    [ "$stopped" -ge 1 ] && ok || fail "keep: the request is not in the store"
    expect_match "keep: idem keys show prints the request" "$CARD" "$shown"
    expect_match "keep: the 422 names what differed" "the body differed" \
      "$(json "$mode-3" detail)"
  fi
done

# ---- sealed answers -------------------------------------------------------
SECRET=answer-text-$(date +%s%N)
head -c 32 /dev/urandom >"$TMP/k1"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/k2"
chmod 600 "$TMP/k1" "$TMP/k2"
answer_copies() {
  n=0
  for f in "$1" "$1-wal" "$1-shm"; do
    [ -f "$f" ] && n=$((n + $(grep -a -o "$SECRET" "$f" | wc -l)))
  done
  echo $n
}
DB=$TMP/sealed.db
start_gateway s1 --upstream "$UP" --store "$DB" --seal-key "$TMP/k1" || { finish; exit 1; }
post s1a seal-1 '{"title":"'$SECRET'"}'
post s1b seal-1 '{"title":"'$SECRET'"}'
expect_eq "sealed: forwarded once, then replayed, the answer whole" \
  "201 201 true $SECRET $(json s1a ticket_id) 1" \
  "$(code s1a) $(code s1b) $(header s1b Idempotent-Replayed) $(json s1b title) $(json s1b ticket_id) $(effects seal-1)"
running=$(answer_copies "$DB")
stop_gateway "$GW_PID"
expect_eq "sealed: no copy of the answer in the store, running or stopped" \
  "0 0" "$running $(answer_copies "$DB")"
expect_match "sealed: idem keys show without the key says so" \
  "sealed with key [0-9a-f]{16}; pass --seal-key" \
  "$("$IDEM" keys show seal-1 --store "$DB" --operation 'POST /tickets' 2>&1)"
expect_match "sealed: idem keys show with the key opens it" "$SECRET" \
  "$("$IDEM" keys show seal-1 --store "$DB" --operation 'POST /tickets' --seal-key "$TMP/k1" 2>&1)"
# Rotation: k2 seals from now on, k1 still opens.
start_gateway s2 --upstream "$UP" --store "$DB" --seal-key "$TMP/k2" --seal-key "$TMP/k1" ||
  { finish; exit 1; }
post s2a seal-1 '{"title":"'$SECRET'"}'
post s2b seal-2 '{"title":"'$SECRET'"}'
stop_gateway "$GW_PID"
expect_eq "rotated: the old record replays, a new one acts" \
  "201 true $(json s1a ticket_id) 201 1 1" \
  "$(code s2a) $(header s2a Idempotent-Replayed) $(json s2a ticket_id) $(code s2b) $(effects seal-1) $(effects seal-2)"
kid() { "$IDEM" keys show "$1" --store "$DB" --operation 'POST /tickets' --json 2>/dev/null |
  python3 -c 'import json,sys; print(json.load(sys.stdin).get("seal_key_id"))'; }
k1=$(kid seal-1) k2=$(kid seal-2)
[ -n "$k1" ] && [ "$k1" != None ] && [ -n "$k2" ] && [ "$k2" != None ] && [ "$k1" != "$k2" ] && ok ||
  fail "rotated: the new record is sealed with the new key ($k1, $k2)"
expect_eq "rotated: still no copy of the answer" 0 "$(answer_copies "$DB")"
# Without k1, seal-1 is not replayed (nor forwarded again); seal-2 is.
start_gateway s3 --upstream "$UP" --store "$DB" --seal-key "$TMP/k2" || { finish; exit 1; }
post s3a seal-1 '{"title":"'$SECRET'"}'
post s3b seal-2 '{"title":"'$SECRET'"}'
stop_gateway "$GW_PID"
expect_eq "without the old key: an error, not a replay, not a second action; the new key's record replays" \
  "500 false 1 201 true" \
  "$(code s3a) $(grep -q "$SECRET" "$TMP/s3a.b" && echo true || echo false) $(effects seal-1) $(code s3b) $(header s3b Idempotent-Replayed)"
chmod 644 "$TMP/k1"
"$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$DB" --seal-key "$TMP/k1" \
  --principal none 2>"$TMP/perm.err"
expect_eq "a key file others may read: refused at start" 2 "$?"
expect_match "a key file others may read: says the chmod" "chmod 600" "$(cat "$TMP/perm.err")"

finish
