#!/bin/sh
# idem serve between curl and a counting upstream, on loopback: replays,
# conflicts, concurrency, tenants, keys, 5xx, limits, headers, the admin
# listener, the access log and a graceful stop. Every case checks how many
# times the upstream acted and what the client was answered. Waits are for
# events: the upstream holds an answer until the test releases it
# (upstream.py ?hold=NAME).
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

start_upstream up || { finish; exit 1; }
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" --log "$TMP/access.log" || { finish; exit 1; }
expect_eq "nothing but the new store and the addresses at start" "" \
  "$(grep -v '^idem serve: \(new store\|listening on\|admin on\|principal none$\)' "$TMP/gw.err")"

# 1. A lost response: the client gives up after the upstream acted; its
#    retry gets the first answer, and the upstream acted once.
curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
  -H 'Idempotency-Key: lost-1' --data '{"title":"Printer"}' "$GW/tickets?hold=lost-1" &
cpid=$!
wait_held lost-1 || fail "lost response: the request never reached the upstream"
kill $cpid
wait $cpid 2>/dev/null # no "Terminated": the test killed it
expect_eq "lost response: the client gave up" 143 "$?"
release lost-1
wait_eq completed state "$TMP/gw.db" lost-1 || fail "lost response: never completed"
post r1 lost-1 '{"title":"Printer"}' /tickets?hold=lost-1
expect_eq "lost response: retry status" 201 "$(code r1)"
expect_eq "lost response: replayed" true "$(header r1 Idempotent-Replayed)"
expect_eq "lost response: the stored ticket" "lost-1 Printer" "$(json r1 key) $(json r1 title)"
first=$(body r1)
post r2 lost-1 '{"title":"Printer"}' /tickets?hold=lost-1
expect_eq "lost response: a second retry, same body" "$first" "$(body r2)"
expect_eq "lost response: upstream effects" 1 "$(effects lost-1)"
expect_eq "lost response: stored header replayed" "$(json r1 ticket_id)" "$(header r2 X-Ticket)"
expect_eq "lost response: content type replayed" "application/json" "$(header r2 Content-Type)"

# 2. The same JSON written otherwise is a replay; another value is 422 and
#    reaches nothing.
post a1 json-1 '{"title":"Disk","n":1.0,"tags":["a","b"]}'
expect_eq "first answer" 201 "$(code a1)"
expect_eq "first answer is not a replay" "" "$(header a1 Idempotent-Replayed)"
post a2 json-1 '{ "tags" : [ "a", "b" ],
  "n": 1, "title": "Disk" }'
expect_eq "reordered JSON: replay" "201 true" "$(code a2) $(header a2 Idempotent-Replayed)"
expect_eq "reordered JSON: same body" "$(body a1)" "$(body a2)"
post a3 json-1 '{"title":"Disk","n":2,"tags":["a","b"]}'
expect_eq "changed value: 422" 422 "$(code a3)"
expect_eq "changed value: problem+json" "application/problem+json" "$(header a3 Content-Type)"
expect_eq "changed value: problem status" 422 "$(json a3 status)"
expect_match "changed value: detail says what to do" "new key" "$(json a3 detail)"
expect_eq "changed value: problem type" "urn:idem:problem:key-reused" "$(json a3 type)"
post a4 json-1 '{"title":"Disk","n":1,"tags":["a","b"]}' /tickets/other
expect_eq "same key, other path: a new operation" 201 "$(code a4)"
post a5 json-1 '{"title":"Disk","n":1,"tags":["a","b"]}' /tickets?x=1
expect_eq "same key and body, other query: 422" 422 "$(code a5)"
expect_eq "json: upstream effects" 2 "$(effects json-1)"
# Long paths: two that differ only past 1100 bytes are two operations
# (not one, as when the path was cut to fit a buffer).
stem=/tickets/$(printf '%01100d' 0)
post lp1 long-path-1 '{"title":"L"}' "$stem/a"
post lp2 long-path-1 '{"title":"L"}' "$stem/b"
post lp3 long-path-1 '{"title":"L"}' "$stem/a"
expect_eq "long paths: two operations, the first replayed" "201 201 true 2" \
  "$(code lp1) $(code lp2) $(header lp3 Idempotent-Replayed) $(effects long-path-1)"
# A body that is not JSON is fingerprinted by its bytes.
POST_TYPE=text/plain post t1 text-1 'a  b'
POST_TYPE=text/plain post t2 text-1 'a  b'
POST_TYPE=text/plain post t3 text-1 'a b'
POST_TYPE=
expect_eq "text body: proceed, replay, conflict" "201 201 true 422" \
  "$(code t1) $(code t2) $(header t2 Idempotent-Replayed) $(code t3)"
post j1 bad-json-1 '{"title":' 
post j2 bad-json-1 '{"title":'
expect_eq "malformed JSON: forwarded once, then replayed" "201 true 1" \
  "$(code j1) $(header j2 Idempotent-Replayed) $(effects bad-json-1)"

# 3. 32 concurrent requests with one key: one effect; the other 31 attach
#    to the one at the upstream (--attach-wait), which holds its answer
#    until all 31 wait, and every one gets its answer: the same body, 31 of
#    them marked replayed. (tests/serve/cli_serve_attach.sh: the bound,
#    a released key, two gateways.)
i=0 pids=""
while [ $i -lt 32 ]; do
  post "c$i" conc-1 '{"title":"Race"}' /tickets?hold=conc-1 &
  pids="$pids $!"
  i=$((i + 1))
done
wait_held conc-1 || fail "concurrent: nothing reached the upstream"
wait_eq 31 metric idem_gateway_attached ||
  fail "concurrent: $(metric idem_gateway_attached) attached while one was held"
release conc-1
wait $pids
ok2=0 replayed=0 bodies=""
i=0
while [ $i -lt 32 ]; do
  if [ "$(code "c$i")" = 201 ]; then
    ok2=$((ok2 + 1))
    bodies="$bodies$(body "c$i")
"
  fi
  [ "$(header "c$i" Idempotent-Replayed)" = true ] && replayed=$((replayed + 1))
  i=$((i + 1))
done
expect_eq "concurrent: upstream effects" 1 "$(effects conc-1)"
expect_eq "concurrent: 32 answered 201, 31 of them replayed" "32 31" "$ok2 $replayed"
expect_eq "concurrent: one distinct body" 1 "$(printf '%s' "$bodies" | sort -u | grep -c .)"
expect_match "concurrent: the body is a ticket" '"ticket_id": [0-9]' "$bodies"

# 4. Two credentials, one key: two records, two effects (the default
#    principal rule, credential:authorization, on a second gateway on the
#    same store). GET passes through.
GW1=$GW GW1_PID=$GW_PID ADMIN1=$ADMIN
start_gateway cred --upstream "$UP" --store "$TMP/gw.db" \
  --principal credential:authorization || { finish; exit 1; }
expect_eq "the rule is said at start" "idem serve: principal credential:authorization" \
  "$(grep '^idem serve: principal' "$TMP/cred.err")"
post u1 shared-1 '{"title":"T"}' -H 'Authorization: Bearer alice'
post u2 shared-1 '{"title":"T"}' -H 'Authorization: Bearer bob'
post u3 shared-1 '{"title":"T"}' -H 'Authorization: Bearer alice'
stop_gateway "$GW_PID"
GW=$GW1 GW_PID=$GW1_PID ADMIN=$ADMIN1
expect_eq "tenants: two effects" 2 "$(effects shared-1)"
expect_eq "tenants: alice's retry replays alice's ticket" "$(json u1 ticket_id) true" \
  "$(json u3 ticket_id) $(header u3 Idempotent-Replayed)"
[ "$(json u1 ticket_id)" != "$(json u2 ticket_id)" ] && ok || fail "tenants: one ticket for two credentials"
before=$(upstream_field requests)
g1=$(curl -s -H 'Idempotency-Key: get-1' "$GW/tickets/1")
g2=$(curl -s -H 'Idempotency-Key: get-1' "$GW/tickets/1")
after=$(upstream_field requests)
expect_eq "GET passes through every time" 2 "$((after - before))"
[ "$g1" != "$g2" ] && ok || fail "GET: the second answer was a replay"

# 5. Keys: missing (passes through unprotected), empty, too long, control
#    characters, a quoted structured-field string.
before=$(effects "")
post k1 - '{"title":"nokey"}'
post k2 - '{"title":"nokey"}'
expect_eq "no key: passed through twice" "201 201 2" "$(code k1) $(code k2) $(($(effects "") - before))"
post k3 '' '{"title":"x"}'
expect_eq "empty key: 400" "400 urn:idem:problem:bad-key" "$(code k3) $(json k3 type)"
long=$(printf '%0300d' 7)
post k4 "$long" '{"title":"x"}'
expect_eq "300-byte key: 400" 400 "$(code k4)"
post k5 "$(printf 'a\001b')" '{"title":"x"}'
expect_eq "control character in key: 400" 400 "$(code k5)"
post k6 'has space' '{"title":"x"}'
expect_eq "space in key: 400" 400 "$(code k6)"
curl -s -o "$TMP/k7.b" -w '%{http_code}' -X POST -H 'Idempotency-Key: dup-a' \
  -H 'Idempotency-Key: dup-b' --data '{}' "$GW/tickets" >"$TMP/k7.code"
expect_eq "two key headers: 400" 400 "$(code k7)"
post q1 '"quoted-1"' '{"title":"q"}'
post q2 'quoted-1' '{"title":"q"}'
expect_eq "quoted key: the same record as the bare one" "201 true 1" \
  "$(code q1) $(header q2 Idempotent-Replayed) $(effects '"quoted-1"')"
expect_eq "quoted key: forwarded unchanged" '"quoted-1"' \
  "$(upstream_field last_headers | python3 -c 'import json,sys; print(json.load(sys.stdin)["Idempotency-Key"])')"
expect_eq "bad keys reached nothing" "0 0 0 $((before + 2))" \
  "$(effects 'has space') $(effects dup-a) $(effects "$long") $(effects '')"

# 6. 5xx answers are stored and replayed (the upstream may have acted).
post f1 fail-1 '{"title":"F"}' /tickets?status=500
post f2 fail-1 '{"title":"F"}' /tickets?status=500
expect_eq "5xx: stored and replayed" "500 500 true 1" \
  "$(code f1) $(code f2) $(header f2 Idempotent-Replayed) $(effects fail-1)"

# 6b. 429, 408 and 425 say the request was not processed (too many
#     requests, too slow, too early): not stored, the key released, so that
#     a client that retries as told gets through; that answer is stored.
for st in 429 408 425; do
  post "n${st}a" "not-processed-$st" '{"title":"N"}' "/tickets?status_first=$st"
  expect_match "$st: the answer says it was not stored" "not-stored; released" \
    "$(header "n${st}a" Idem-Record)"
  post "n${st}b" "not-processed-$st" '{"title":"N"}' "/tickets?status_first=$st"
  post "n${st}c" "not-processed-$st" '{"title":"N"}' "/tickets?status_first=$st"
  expect_eq "$st: passed on, then the retry forwarded, then replayed" \
    "$st 201  201 true 2 $(json "n${st}b" ticket_id)" \
    "$(code "n${st}a") $(code "n${st}b") $(header "n${st}b" Idempotent-Replayed) $(code "n${st}c") $(header "n${st}c" Idempotent-Replayed) $(effects "not-processed-$st") $(json "n${st}c" ticket_id)"
done

# 7. Set-Cookie is passed on, but not stored for replays.
post s1 cookie-1 '{"title":"C"}' /tickets?cookie=1
post s2 cookie-1 '{"title":"C"}' /tickets?cookie=1
expect_match "Set-Cookie on the first answer" "session=s" "$(header s1 Set-Cookie)"
expect_eq "no Set-Cookie on the replay" "true " "$(header s2 Idempotent-Replayed) $(header s2 Set-Cookie)"

# 7b. Headers a Connection header names are hop-by-hop, both ways.
post hop1 hop-1 '{"title":"H"}' /tickets?hop=1 -H 'Connection: X-Client-Hop' -H 'X-Client-Hop: 1' -H 'X-End-To-End: 1'
post hop2 hop-1 '{"title":"H"}' /tickets?hop=1
expect_eq "hop-by-hop: not passed on, not replayed" "201  true " \
  "$(code hop1) $(header hop1 X-Hop-Only) $(header hop2 Idempotent-Replayed) $(header hop2 X-Hop-Only)"
expect_eq "hop-by-hop: the client's named header stays here" "None 1" \
  "$(upstream_field last_headers | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h.get("X-Client-Hop"), h.get("X-End-To-End"))')"

# 7c. The console's session cookie is never passed on (a browser sends it
# to every port of the console's host name); the other cookies are.
post ck1 ck-1 '{"title":"C"}' -H 'Cookie: a=1; idem_console=SECRET1; b=2' -H 'Cookie: idem_console=SECRET2'
expect_eq "Cookie: the console's session is not passed on" "201 a=1; b=2 0" \
  "$(code ck1) $(upstream_field last_headers | python3 -c 'import json,sys; h=json.load(sys.stdin); print(h.get("Cookie"), json.dumps(h).count("SECRET"))')"
post ck2 ck-2 '{"title":"C"}' -H 'Cookie: idem_console_x=1;idem_console ; c=3'
expect_eq "Cookie: only the console's own name" "201 idem_console_x=1; c=3" \
  "$(code ck2) $(upstream_field last_headers | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Cookie"))')"

# 8. Transfer-Encoding: chunked and Expect: 100-continue request bodies.
post e1 chunked-1 '{"title":"chunks"}' -H 'Transfer-Encoding: chunked'
post e2 chunked-1 '{"title":"chunks"}'
expect_eq "chunked body: forwarded, then replayed" "201 chunks true" \
  "$(code e1) $(json e1 title) $(header e2 Idempotent-Replayed)"
post e3 expect-1 '{"title":"continue"}' -H 'Expect: 100-continue'
expect_eq "Expect: 100-continue" "201 continue 1" "$(code e3) $(json e3 title) $(effects expect-1)"

# 8b. Limits of the server library: headers too large are refused before
#     anything is claimed; keep-alive: one connection for several requests.
big=$(head -c 45000 /dev/zero | tr '\0' a)
post hb big-header-1 '{"title":"x"}' -H "X-Big: $big"
expect_eq "headers over the server's limit: 431, nothing forwarded" "431 0" "$(code hb) $(effects big-header-1)"
reused=$(curl -sv -X POST -H 'Content-Type: application/json' -H 'Idempotency-Key: ka-1' \
  --data '{"title":"ka"}' "$GW/tickets" "$GW/tickets" 2>&1 | grep -c 'Re-using existing connection')
expect_eq "keep-alive: the second request reuses the connection" 1 "$reused"
expect_eq "keep-alive: one effect for the key" 1 "$(effects ka-1)"

# 9. The admin listener: /healthz, /readyz, /metrics moved by the above.
expect_eq "healthz" "200" "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/healthz")"
expect_eq "readyz" "200" "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/readyz")"
replays=$(metric 'idem_gateway_requests_total{outcome="replay"}')
post m1 json-1 '{"title":"Disk","n":1,"tags":["a","b"]}'
expect_eq "metrics: a replay counted" "$((replays + 1))" "$(metric 'idem_gateway_requests_total{outcome="replay"}')"
expect_match "metrics: conflicts counted" '^[1-9]' "$(metric 'idem_gateway_requests_total{outcome="conflict"}')"
expect_match "metrics: passthrough counted" '^[1-9]' "$(metric 'idem_gateway_requests_total{outcome="passthrough"}')"
expect_match "metrics: rejected counted" '^[1-9]' "$(metric 'idem_gateway_requests_total{outcome="rejected"}')"
expect_match "metrics: upstream latency observed" '^[1-9]' "$(metric 'idem_gateway_upstream_seconds_count')"
expect_match "metrics: store latency observed" '^[1-9]' "$(metric 'idem_gateway_store_seconds_count')"
expect_match "metrics: stored bytes" '^[1-9]' "$(metric 'idem_gateway_stored_bytes_total')"
expect_eq "metrics: nothing in flight" 0 "$(metric 'idem_gateway_in_flight')"
expect_eq "admin: unknown path" 404 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/nope")"
# The path is quoted in the problem's detail, cut to 200 bytes: the cut
# falls between two characters (here inside the first U+00E9, at bytes 199
# and 200 of the path as libmicrohttpd decodes it), and bytes that are no
# UTF-8 are escaped, so the detail is always JSON.
long="/$(printf 'a%.0s' $(seq 198))$(printf '%%C3%%A9%.0s' $(seq 20))"
for path in "$long" "/%FF%FE" "/a%C3"; do
  rm -f "$TMP/admin404.b"
  curl -s -o "$TMP/admin404.b" -w '%{http_code}' "$ADMIN$path" >"$TMP/admin404.code"
  expect_eq "admin: unknown path $(printf %.20s "$path"): 404" 404 "$(cat "$TMP/admin404.code")"
  python3 - "$TMP/admin404.b" "$path" <<'PY' && ok || fail "admin: unknown path $(printf %.20s "$path"): the problem's detail: $(head -c 400 "$TMP/admin404.b")"
import json, sys, urllib.parse
p = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))
raw = urllib.parse.unquote_to_bytes(sys.argv[2])
shown = p["detail"].split(": not found")[0]
assert p["status"] == 404 and p["type"] == "urn:idem:problem:not-found", p
assert len(shown.encode()) <= 200, shown
if raw.startswith(b"/aaa"):
    assert shown == "/" + "a" * 198, shown
else:
    assert shown == raw.decode("utf-8", "backslashreplace"), shown
PY
done

# 10. The access log: one JSON line per request, no raw key or credential.
lines=$(wc -l < "$TMP/access.log")
python3 - "$TMP/access.log" <<'PY' && ok || fail "access log: lines are not the expected JSON"
import json, sys
need = {"time", "method", "path", "outcome", "status", "upstream_ms"}
for line in open(sys.argv[1]):
    o = json.loads(line)
    assert need <= set(o), o
    assert "lost-1" not in line and "alice" not in line, line
PY
expect_match "access log: a replay line with hashes" '"outcome":"replay".*"key_hash":"[0-9a-f]{16}","tenant_hash"' "$(cat "$TMP/access.log")"
mv "$TMP/access.log" "$TMP/access.log.1"
kill -HUP "$GW_PID"
n=0; while [ ! -e "$TMP/access.log" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done
post h1 json-1 '{"title":"Disk","n":1,"tags":["a","b"]}'
expect_eq "SIGHUP: the log reopened" 1 "$(wc -l < "$TMP/access.log")"
[ "$lines" -ge 60 ] && ok || fail "access log: only $lines lines"

# 11. SIGTERM lets a request in flight finish, then exits 0.
post d1 drain-1 '{"title":"slow"}' /tickets?hold=drain-1 &
cpid=$!
wait_held drain-1 || fail "draining: the request never reached the upstream"
kill -TERM "$GW_PID"
wait_eq 503 curl -s -o /dev/null -w '%{http_code}' "$ADMIN/readyz"
expect_eq "draining: readyz 503" 503 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/readyz")"
release drain-1
wait $cpid
wait "$GW_PID"
expect_eq "SIGTERM: exit status" 0 "$?"
expect_eq "SIGTERM: the request in flight was answered" "201 slow" "$(code d1) $(json d1 title)"

# 12. Every record is in the store for operators.
out=$("$IDEM" keys list --store "$TMP/gw.db" --state completed 2>&1)
expect_match "idem keys lists the gateway's records" "POST /tickets.*lost-1" "$out"

# 13. IPv6, a --max-body, --require-key, --no-store-5xx, a too-large answer.
start_gateway gw2 --listen '[::1]:0' --upstream "$UP" --store "$TMP/gw2.db" \
  --require-key --no-store-5xx --max-body 64 --max-response 1k || { finish; exit 1; }
expect_match "IPv6 listen address" '^http://\[::1\]:[0-9]+$' "$GW"
post n1 - '{"title":"x"}'
expect_eq "--require-key: 400" "400 urn:idem:problem:key-required" "$(code n1) $(json n1 type)"
curl -s -o /dev/null -w '%{http_code}' "$GW/tickets/1" >"$TMP/n2.code"
expect_eq "--require-key: GET still passes" 200 "$(code n2)"
big=$(printf '{"title":"%0100d"}' 1)
post b1 big-1 "$big"
expect_eq "--max-body: 413" "413 urn:idem:problem:body-too-large 0" "$(code b1) $(json b1 type) $(effects big-1)"
post b2 big-1 "$big" -H 'Transfer-Encoding: chunked'
expect_eq "--max-body, chunked: 413" "413 0" "$(code b2) $(effects big-1)"
post b3 big-1 '{"title":"small"}'
expect_eq "after a 413, the key is free" "201 1" "$(code b3) $(effects big-1)"
post x1 nostore-1 '{"title":"F"}' /tickets?status=503
post x2 nostore-1 '{"title":"F"}' /tickets?status=503
expect_eq "--no-store-5xx: forwarded again" "503 503 2" "$(code x1) $(code x2) $(effects nostore-1)"
expect_match "--no-store-5xx: said so" "released" "$(header x2 Idem-Record)"
post l1 large-1 '{"title":"L"}' /tickets?bytes=4000
expect_eq "too large to store: passed on" "201 4000" "$(code l1) $(wc -c < "$TMP/l1.b")"
expect_match "too large to store: said so" "unknown" "$(header l1 Idem-Record)"
post l2 large-1 '{"title":"L"}' /tickets?bytes=4000
expect_eq "too large to store: a retry is refused" "409 urn:idem:problem:outcome-unknown 1" \
  "$(code l2) $(json l2 type) $(effects large-1)"
out=$("$IDEM" keys list --store "$TMP/gw2.db" --state unknown 2>&1)
expect_match "too large to store: idem keys shows it" "large-1" "$out"
kill -INT "$GW_PID"
wait "$GW_PID"
expect_eq "SIGINT: gw2 stopped cleanly" 0 "$?"


# Without --store and without IDEM_STORE, the store is ./idem.db, as
# --help says (and as idem run, mcp and keys do).
mkdir -p "$TMP/defstore"
(cd "$TMP/defstore" && exec env -u IDEM_STORE "$IDEM" serve --listen 127.0.0.1:0 \
  --upstream "$UP" --principal none) 2>"$TMP/defstore.err" &
dpid=$!
PIDS="$PIDS $dpid"
n=0
while ! grep -q 'listening on' "$TMP/defstore.err" && [ $n -lt 400 ] &&
  kill -0 $dpid 2>/dev/null; do sleep 0.05; n=$((n + 1)); done
expect_match "no --store, no IDEM_STORE: ./idem.db" "store sqlite:.*defstore/idem.db" \
  "$(cat "$TMP/defstore.err")"
[ -f "$TMP/defstore/idem.db" ] && ok || fail "no --store: ./idem.db was not made"
kill -TERM $dpid 2>/dev/null
wait $dpid 2>/dev/null

finish
