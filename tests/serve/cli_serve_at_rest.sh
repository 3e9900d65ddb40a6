#!/bin/sh
# idem serve keeps no request body at rest: a keyed JSON POST with a card
# number and its CVC leaves only the request's fingerprint in the store
# (no copy of the digits in the database, its WAL or its shared memory
# file, while the gateway runs and after it stops); a retry still replays
# and a changed body is still 422. --keep-requests keeps the request for
# operators (idem keys show) and a 422 that names what differed.
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

finish
