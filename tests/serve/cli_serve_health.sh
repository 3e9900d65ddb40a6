#!/bin/sh
# idem serve's health, and what its operators see. /healthz is liveness;
# /readyz says whether a claim can be written, and answers 503 with the
# reason when the store's folder is read-only, its disk full, or the store
# file deleted. Store errors are logged with their reason, at most a line a
# second, counting the lines left out. Start-up names the store. A store
# deleted under a running gateway stops keyed requests, and a restart does
# not make an empty store in its place unless told to (--create-store).
# idem keys finds a gateway key without --operation, and asks for the HTTP
# status when it resolves one. /metrics counts 422 apart from
# outcome-unknown, 502, 503 and 504 apart, and the records in progress and
# unknown; the access log's numbers have no float noise. Every case checks
# the answers and what reached the upstream.
#
# The store lives on a small tmpfs that the test fills up, in a mount
# namespace of its own (a user namespace too when not root).
IDEM=$1
if [ "${IDEM_IN_NAMESPACE:-}" != 1 ]; then
  if [ "$(id -u)" = 0 ]; then ns="-m"; else ns="-r -m"; fi
  # shellcheck disable=SC2086
  IDEM_IN_NAMESPACE=1 exec unshare $ns sh "$0" "$IDEM"
fi
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

small_disk 2m
DB=$SMALL/gw.db
MARKER=$SMALL/.gw.db.idem-serve

start_upstream up || { finish; exit 1; }
readyz() { curl -s -o "$TMP/readyz.b" -w '%{http_code}' "$ADMIN/readyz"; }
healthz() { curl -s -o /dev/null -w '%{http_code}' "$ADMIN/healthz"; }
# store_errors NAME: the store-error lines of gateway NAME's standard error.
store_errors() { grep -c 'store error' "$TMP/$1.err"; }

# 1. The first start makes the store, says where, and leaves a marker.
start_gateway gw --upstream "$UP" --store "$DB" --log "$TMP/access.log" \
  --max-response 1M --upstream-timeout 1s --lease 60s || { finish; exit 1; }
expect_match "start-up names the store" "listening on .*, store sqlite:$DB\$" \
  "$(grep 'listening on' "$TMP/gw.err")"
expect_match "start-up says the store is new" "new store sqlite:$DB" "$(cat "$TMP/gw.err")"
expect_eq "a marker beside the store" yes "$([ -f "$MARKER" ] && echo yes || echo no)"
expect_eq "ready" "200 200" "$(readyz) $(healthz)"

# 2. Traffic of every kind, then /metrics and the access log.
post a1 key-a '{"title":"A"}'
post a2 key-a '{"title":"A"}'
post a3 key-a '{"title":"B"}'
expect_eq "proceed, replay, 422" "201 true 422 1" \
  "$(code a1) $(header a2 Idempotent-Replayed) $(code a3) $(effects key-a)"
post b1 key-a '{"title":"A"}' /other
expect_eq "the same key on another path" 201 "$(code b1)"
post l1 large-1 '{"title":"L"}' /tickets?bytes=1100000
post l2 large-1 '{"title":"L"}' /tickets?bytes=1100000
expect_eq "too large to store, then outcome-unknown" "201 409 urn:idem:problem:outcome-unknown 1" \
  "$(code l1) $(code l2) $(json l2 type) $(effects large-1)"
post d1 drop-1 '{"title":"D"}' /tickets?drop_first=1
expect_eq "connection dropped after acting: 502" "502 1" "$(code d1) $(effects drop-1)"
post t1 slow-1 '{"title":"T"}' /tickets?hold=slow-1
expect_eq "upstream too slow: 504" "504 urn:idem:problem:upstream-timeout 1" \
  "$(code t1) $(json t1 type) $(effects slow-1)"
release slow-1
expect_eq "metrics: 422 counted as a conflict" 1 "$(metric 'idem_gateway_requests_total{outcome="conflict"}')"
expect_eq "metrics: outcome-unknown counted apart" 1 "$(metric 'idem_gateway_requests_total{outcome="unknown"}')"
expect_eq "metrics: answers by status" "4 1 1 1 1" \
  "$(metric 'idem_gateway_responses_total{code="201"}') $(metric 'idem_gateway_responses_total{code="422"}') $(metric 'idem_gateway_responses_total{code="409"}') $(metric 'idem_gateway_responses_total{code="502"}') $(metric 'idem_gateway_responses_total{code="504"}')"
expect_eq "metrics: records in progress and unknown" "2 1" \
  "$(metric 'idem_gateway_store_records{state="in_progress"}') $(metric 'idem_gateway_store_records{state="unknown"}')"
python3 - "$TMP/access.log" <<'PY' && ok || fail "access log: a number with float noise"
import re, sys
n = 0
for line in open(sys.argv[1]):
    for v in re.findall(r'"(?:upstream|total)_ms":([^,}]*)', line):
        n += 1
        if not re.fullmatch(r'[0-9]+(\.[0-9])?', v):
            sys.exit("%s in %s" % (v, line))
if n < 10:
    sys.exit("only %d numbers" % n)
PY

# 3. idem keys finds a gateway key without --operation, and wants an HTTP
#    status to resolve one.
out=$("$IDEM" keys show key-a --store "$DB" 2>&1)
expect_eq "keys show, no --operation: found" 0 "$?"
expect_match "keys show, no --operation: both operations" "operation: +POST /other.*operation: +POST /tickets|operation: +POST /tickets.*operation: +POST /other" \
  "$(printf '%s' "$out" | tr '\n' ' ')"
out=$("$IDEM" keys show large-1 --store "$DB" --json 2>&1)
expect_eq "keys show --json, no --operation: the record" "unknown POST /tickets" \
  "$(printf '%s' "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["state"], r["operation"])')"
out=$("$IDEM" keys show nothing-1 --store "$DB" 2>&1)
expect_eq "keys show of a key nowhere: exit 1" 1 "$?"
out=$("$IDEM" keys resolve large-1 --store "$DB" --completed 2>&1)
expect_eq "resolve --completed of a gateway key without --status: usage" 2 "$?"
expect_match "resolve without --status: says why" "--status" "$out"
expect_eq "resolve without --status: still unknown" 1 "$(metric 'idem_gateway_store_records{state="unknown"}')"
out=$("$IDEM" keys resolve large-1 --store "$DB" --completed --status 99 2>&1)
expect_eq "resolve with a status HTTP does not have: usage" 2 "$?"
printf '{"resolved":"by hand"}' > "$TMP/answer.json"
out=$("$IDEM" keys resolve large-1 --store "$DB" --completed --status 202 --body "$TMP/answer.json" 2>&1)
expect_eq "resolve with --status, no --operation: done" 0 "$?"
post l3 large-1 '{"title":"L"}' /tickets?bytes=1100000
expect_eq "resolved: the operator's answer replayed" '202 true {"resolved":"by hand"} 1' \
  "$(code l3) $(header l3 Idempotent-Replayed) $(body l3) $(effects large-1)"
# (Counted at most once a second: waited for, not read at once.)
wait_eq 0 metric 'idem_gateway_store_records{state="unknown"}' &&
  ok || fail "metrics: still unknown: $(metric 'idem_gateway_store_records{state="unknown"}')"
out=$("$IDEM" keys resolve key-a --store "$DB" --failed 2>&1)
expect_eq "resolve of a key under two operations: refused" 1 "$?"
expect_match "resolve of a key under two operations: names them" "POST /other.*POST /tickets|POST /tickets.*POST /other" \
  "$(printf '%s' "$out" | tr '\n' ' ')"

# 4. The store's folder read-only: not ready, with the reason; alive.
mount --bind -o ro "$SMALL" "$SMALL" || fail "cannot make the folder read-only"
expect_eq "read-only folder: not ready" 503 "$(readyz)"
expect_match "read-only folder: problem+json with the reason" \
  '"type":"urn:idem:problem:store-unavailable".*not writable' "$(cat "$TMP/readyz.b")"
expect_eq "read-only folder: alive" 200 "$(healthz)"
umount "$SMALL"
expect_eq "folder writable again: ready" 200 "$(readyz)"

# 5. The disk full: not ready. A new key whose answer needs room: either
#    its claim does not fit (503, forwarded nowhere) or, when the claim
#    fits in log space the disk already holds, the answer is passed on,
#    said not stored, and the key is unknown from then on; logged either
#    way. Replays are still answered; ready again once there is room.
i=0
while dd if=/dev/zero of="$SMALL/ballast.$i" bs=4k count=1 2>/dev/null; do
  i=$((i + 1))
done
expect_eq "disk full: not ready" 503 "$(readyz)"
expect_match "disk full: the reason" "full|No space" "$(cat "$TMP/readyz.b")"
post f1 full-1 '{"title":"F"}' /tickets?bytes=900000
case $(code f1) in
503)
  expect_eq "disk full: the claim did not fit: not forwarded" \
    "urn:idem:problem:store-unavailable 0" "$(json f1 type) $(effects full-1)"
  after_full="201 1" ;;
201)
  expect_match "disk full: the answer did not fit: passed on, said so" \
    "^(unknown|not-stored); store-failed 1$" "$(header f1 Idem-Record) $(effects full-1)"
  after_full="409 1" ;;
*) fail "disk full: a new key answered $(code f1)" ;;
esac
post f2 key-a '{"title":"A"}'
expect_eq "disk full: a replay still answered" "201 true" "$(code f2) $(header f2 Idempotent-Replayed)"
expect_match "disk full: logged with the reason" "store error.*(full|No space)" "$(cat "$TMP/gw.err")"
rm -f "$SMALL"/ballast.*
expect_eq "room again: ready" 200 "$(readyz)"
post f3 full-1 '{"title":"F"}' /tickets?bytes=900000
expect_eq "room again: that key as its first answer said" "$after_full" \
  "$(code f3) $(effects full-1)"
post f4 full-2 '{"title":"F"}' /tickets?bytes=900000
expect_eq "room again: a new key proceeds" "201 1" "$(code f4) $(effects full-2)"

stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"

# 6. The store file deleted under a running gateway: not ready, new keys
#    503 and logged (a line a second at most, the rest counted), replays
#    still answered. A gateway of its own, so that its log has only these
#    errors; it starts on the existing store without a word about it.
start_gateway gwd --upstream "$UP" --store "$DB" || { finish; exit 1; }
expect_eq "a later start on the existing store: nothing new" "" \
  "$(grep 'new store' "$TMP/gwd.err")"
post r1 key-a '{"title":"A"}'
expect_eq "a later start: the store kept" "201 true" "$(code r1) $(header r1 Idempotent-Replayed)"
rm "$DB"
expect_eq "store deleted: not ready" 503 "$(readyz)"
expect_match "store deleted: the reason" "deleted" "$(cat "$TMP/readyz.b")"
expect_eq "store deleted: alive" 200 "$(healthz)"
i=0 pids=""
while [ $i -lt 20 ]; do
  post "g$i" "gone-$i" '{"title":"G"}' &
  pids="$pids $!"
  i=$((i + 1))
done
wait $pids
codes=$(i=0; while [ $i -lt 20 ]; do code "g$i"; echo; i=$((i + 1)); done | sort | uniq -c | tr -s ' ')
expect_eq "store deleted: every new key 503" " 20 503" "$codes"
expect_eq "store deleted: nothing forwarded" "0 0" "$(effects gone-0) $(effects gone-19)"
post g20 key-a '{"title":"A"}'
expect_eq "store deleted: a replay still answered" "201 true" "$(code g20) $(header g20 Idempotent-Replayed)"
# More errors until a line counts the ones left out (the next second).
sent=20 n=0
while ! grep -q 'store error.*more store errors' "$TMP/gwd.err" && [ $n -lt 400 ]; do
  post gx gone-x '{"title":"G"}'
  sent=$((sent + 1)) n=$((n + 1))
  sleep 0.05
done
lines=$(store_errors gwd)
[ "$lines" -ge 2 ] && [ "$lines" -lt "$sent" ] && ok || fail "store errors: $lines lines for $sent errors"
expect_match "store errors: the reason" "store error.*deleted" "$(cat "$TMP/gwd.err")"
counted=$(grep 'store error' "$TMP/gwd.err" |
  sed -n 's/.*(\([0-9][0-9]*\) more store errors.*/\1/p' | awk '{s += $1} END {print s + 0}')
expect_eq "store errors: every one logged or counted" "$sent" "$((lines + counted))"
stop_gateway "$GW_PID"
expect_eq "store deleted: the gateway stops cleanly" 0 "$STOPPED"

# 7. A restart does not make an empty store where one was deleted.
refused_start "$TMP/again.err" --listen 127.0.0.1:0 --upstream "$UP" --store "$DB"
expect_eq "restart without the store: refused" 1 "$?"
expect_match "restart without the store: says why and what to do" "missing.*--create-store" \
  "$(tr '\n' ' ' < "$TMP/again.err")"
expect_eq "restart without the store: none made" no "$([ -e "$DB" ] && echo yes || echo no)"
start_gateway gw2 --upstream "$UP" --store "$DB" --create-store || { finish; exit 1; }
expect_match "--create-store: a new store" "new store sqlite:$DB" "$(cat "$TMP/gw2.err")"
post n1 new-1 '{"title":"N"}'
expect_eq "--create-store: it works" "201 1" "$(code n1) $(effects new-1)"
stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"

# 8. The admin listener beyond the loopback: refused without a token, at
#    start (every interface, 0.0.0.0, [::]); with --admin-token-file, it
#    answers only requests with the token (401 otherwise, with
#    WWW-Authenticate), on every path.
for where in ':0' '0.0.0.0:0' '[::]:0'; do
  refused_start "$TMP/adm.err" --listen 127.0.0.1:0 --upstream "$UP" \
    --store "$TMP/adm.db" --admin-listen "$where"
  expect_eq "admin on $where without a token: refused (usage)" 2 "$?"
  expect_match "admin on $where: says why and what to do" "not a loopback address.*--admin-token-file" \
    "$(cat "$TMP/adm.err")"
done
printf 'short\n' >"$TMP/short.token"
"$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$TMP/adm.db" \
  --admin-listen 127.0.0.1:0 --admin-token-file "$TMP/short.token" 2>"$TMP/adm.err"
expect_eq "a token under 16 characters: refused" 2 "$?"
TOKEN=t0ken-$(date +%s%N)-abcdef
printf '%s\n' "$TOKEN" >"$TMP/admin.token"
start_gateway tok --upstream "$UP" --store "$TMP/adm.db" --create-store \
  --admin-listen 0.0.0.0:0 --admin-token-file "$TMP/admin.token" || { finish; exit 1; }
ADMIN=http://127.0.0.1:${ADMIN##*:}
for path in /metrics /readyz /healthz; do
  expect_eq "token: $path without it, with another, with it" "401 401 200" \
    "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN$path") $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${TOKEN}x" "$ADMIN$path") $(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $TOKEN" "$ADMIN$path")"
done
expect_match "token: 401 says how" "WWW-Authenticate: Bearer" \
  "$(curl -s -D - -o /dev/null "$ADMIN/metrics")"
expect_match "token: /metrics with it" "idem_gateway_in_flight" \
  "$(curl -s -H "Authorization: Bearer $TOKEN" "$ADMIN/metrics")"
stop_gateway "$GW_PID"
finish
