#!/bin/sh
# idem serve: a replay goes only to the principal that made the call, and
# only while the upstream would answer it. In front of an API that knows
# its callers by X-API-Key, by a session cookie or by a bearer JWT:
#   - a keyed request with no credential is 401 before the store is
#     touched (it was alice's replay, 200, when every such request shared
#     the tenant ""); bob's key never gets alice's answer;
#   - a refreshed JWT (new bytes, same issuer and subject) replays the
#     first answer instead of acting again; a forged, expired or foreign
#     token is 401 and acts nothing;
#   - a revoked credential gets the upstream's 401 (--replay-check-url),
#     within --replay-check-ttl; a check that cannot be made is 502;
#   - header: rules are namespaced: a tenant header whose value is a
#     credential's tenant reads nothing of that credential's;
#   - unkeyed requests pass through without a principal.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

python3 "$HERE_SERVE/auth_upstream.py" "$TMP/auth.port" &
PIDS="$PIDS $!"
wait_for "$TMP/auth.port" || { fail "auth upstream did not start"; finish; exit 1; }
UP="http://127.0.0.1:$(cat "$TMP/auth.port")"
allow() { curl -s -o /dev/null -X POST "$UP/_allow?cred=$1"; }
revoke() { curl -s -o /dev/null -X POST "$UP/_revoke?cred=$1"; }
effects_now() { curl -s "$UP/_counts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["effects"])'; }
checks_now() { curl -s "$UP/_counts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["checks"])'; }
allow k-alice; allow k-bob; allow s-alice; allow s-bob

# ---- 1. credential:x-api-key --------------------------------------------
start_gateway key --upstream "$UP" --store "$TMP/key.db" \
  --principal credential:x-api-key || { finish; exit 1; }
post k1 order-1 '{"title":"a"}' -H 'X-API-Key: k-alice'
post k2 order-1 '{"title":"a"}'
post k3 order-1 '{"title":"a"}' -H 'X-API-Key: k-bob'
post k4 order-1 '{"title":"a"}' -H 'X-API-Key: k-alice'
post k5 order-1 '{"title":"a"}' -H 'X-API-Key: k-nobody'
expect_eq "x-api-key: alice acts; no credential 401; bob acts for bob; alice replays" \
  "201 alice 401 urn:idem:problem:no-principal 201 k-bob 201 true $(json k1 ticket_id)" \
  "$(code k1) $(json k1 owner | sed 's/k-//') $(code k2) $(json k2 type) $(code k3) $(json k3 owner) $(code k4) $(header k4 Idempotent-Replayed) $(json k4 ticket_id)"
expect_eq "x-api-key: an unknown key is the upstream's 401, never a replay" \
  "401 unknown caller" "$(code k5) $(json k5 error)"
expect_eq "x-api-key: two effects (alice, bob)" 2 "$(effects_now)"
post k6 order-1 '{"title":"a"}' -H 'X-API-Key: k-alice' -H 'X-API-Key: k-bob'
expect_eq "x-api-key: sent twice is 400, nothing claimed" "400 2" \
  "$(code k6) $(effects_now)"
# Unkeyed requests need no principal: the upstream decides.
post k7 - '{"title":"u"}'
expect_eq "x-api-key: an unkeyed request passes through to the upstream's 401" \
  "401 2" "$(code k7) $(effects_now)"
stop_gateway "$GW_PID"

# ---- 2. credential:cookie:session ---------------------------------------
start_gateway cookie --upstream "$UP" --store "$TMP/cookie.db" \
  --principal credential:cookie:session || { finish; exit 1; }
post c1 order-2 '{"title":"c"}' -H 'Cookie: theme=dark; session=s-alice'
post c2 order-2 '{"title":"c"}' -H 'Cookie: theme=dark'
post c3 order-2 '{"title":"c"}' -H 'Cookie: session=s-bob'
post c4 order-2 '{"title":"c"}' -H 'Cookie: session=s-alice; theme=light'
post c5 order-2 '{"title":"c"}' -H 'Cookie: session=s-alice; session=s-bob'
expect_eq "cookie: alice acts; no session 401; bob acts for bob; alice replays; two sessions 400" \
  "201 s-alice 401 201 s-bob 201 true $(json c1 ticket_id) 400" \
  "$(code c1) $(json c1 owner) $(code c2) $(code c3) $(json c3 owner) $(code c4) $(header c4 Idempotent-Replayed) $(json c4 ticket_id) $(code c5)"
expect_eq "cookie: two more effects" 4 "$(effects_now)"
stop_gateway "$GW_PID"

# ---- 3. jwt: refresh, forgery, expiry, audience -------------------------
JT="node $HERE_SERVE/jwt_tool.mjs"
$JT keys "$TMP/jwk" >/dev/null || fail "jwt_tool keys"
NOW=$(date +%s)
sign() { $JT sign "$TMP/jwk" "$1" "$2"; }
T1=$(sign rsa1 '{"iss":"https://issuer.test","sub":"alice","aud":"tickets","exp":'$((NOW + 600))',"iat":'$NOW'}')
T2=$(sign ec1 '{"iss":"https://issuer.test","sub":"alice","aud":"tickets","exp":'$((NOW + 1200))',"iat":'$((NOW + 1))'}')
TB=$(sign ed1 '{"iss":"https://issuer.test","sub":"bob","aud":["other","tickets"],"exp":'$((NOW + 600))'}')
TX=$(sign rsa1 '{"iss":"https://issuer.test","sub":"alice","aud":"tickets","exp":'$((NOW - 3600))'}')
TA=$(sign rsa1 '{"iss":"https://issuer.test","sub":"alice","aud":"billing","exp":'$((NOW + 600))'}')
TI=$(sign rsa1 '{"iss":"https://evil.test","sub":"alice","aud":"tickets","exp":'$((NOW + 600))'}')
TF=$($JT forge "$T1")
start_gateway jwt --upstream "$UP" --store "$TMP/jwt.db" --principal jwt \
  --jwks "$TMP/jwk/jwks.json" --issuer https://issuer.test --audience tickets ||
  { finish; exit 1; }
post j1 order-3 '{"title":"j"}' -H "Authorization: Bearer $T1"
post j2 order-3 '{"title":"j"}' -H "Authorization: Bearer $T2"
post j3 order-3 '{"title":"j"}' -H "Authorization: Bearer $TB"
expect_eq "jwt: alice acts; her refreshed token replays; bob acts for himself" \
  "201 201 true $(json j1 ticket_id) 201 5 6" \
  "$(code j1) $(code j2) $(header j2 Idempotent-Replayed) $(json j2 ticket_id) $(code j3) $(json j1 ticket_id) $(json j3 ticket_id)"
for t in TF TX TA TI; do
  eval "tok=\$$t"
  post "j$t" order-3 '{"title":"j"}' -H "Authorization: Bearer $tok"
done
expect_eq "jwt: forged, expired, foreign audience, foreign issuer: 401, no replay" \
  "401 401 401 401" "$(code jTF) $(code jTX) $(code jTA) $(code jTI)"
expect_match "jwt: the forged token's 401 says why" "signature" "$(json jTF detail)"
expect_match "jwt: the expired token's 401 says why" "expired" "$(json jTX detail)"
expect_eq "jwt: 401s carry a bearer challenge" "Bearer" \
  "$(header jTF WWW-Authenticate | cut -d' ' -f1)"
post j4 order-3 '{"title":"j"}'
expect_eq "jwt: no token is 401" 401 "$(code j4)"
expect_eq "jwt: two effects in all (alice once, bob once)" 6 "$(effects_now)"
stop_gateway "$GW_PID"
expect_match "jwt: the tenant is the issuer's hash and the subject" \
  'jwt:[0-9a-f]{16}:alice' "$("$IDEM" keys list --store "$TMP/jwt.db" 2>&1)"

# ---- 4. revocation: --replay-check-url ---------------------------------
allow k-carol
start_gateway rc --upstream "$UP" --store "$TMP/rc.db" \
  --principal credential:x-api-key --replay-check-url /me \
  --replay-check-ttl 0 || { finish; exit 1; }
post r1 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
post r2 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
revoke k-carol
post r3 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
allow k-carol
post r4 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
expect_eq "check: acts, replays; revoked: the upstream's 401, not the answer; allowed again: replays" \
  "201 201 true 401 unknown caller 201 true 7" \
  "$(code r1) $(code r2) $(header r2 Idempotent-Replayed) $(code r3) $(json r3 error) $(code r4) $(header r4 Idempotent-Replayed) $(effects_now)"
expect_eq "check: the revoked 401 passes the upstream's challenge on" \
  'Bearer realm="tickets"' "$(header r3 WWW-Authenticate)"
curl -s -o /dev/null "$UP/_down?on=1"
post r5 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
curl -s -o /dev/null "$UP/_down?on=0"
expect_eq "check: a check answered 500 is 502, nothing replayed" \
  "502 urn:idem:problem:replay-check-failed" "$(code r5) $(json r5 type)"
stop_gateway "$GW_PID"

# With a TTL the check is made once per credential per TTL, and a
# revocation is seen once it has passed.
start_gateway ttl --upstream "$UP" --store "$TMP/rc.db" \
  --principal credential:x-api-key --replay-check-url /me \
  --replay-check-ttl 300ms || { finish; exit 1; }
c0=$(checks_now)
post t1 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
post t2 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'
c1=$(checks_now)
[ $((c1 - c0)) -ge 1 ] && [ $((c1 - c0)) -le 2 ] && ok ||
  fail "ttl: two replays within the TTL made $((c1 - c0)) checks (1, or 2 on a slow machine)"
revoke k-carol
replay_refused() { post t3 order-4 '{"title":"r"}' -H 'X-API-Key: k-carol'; code t3; }
wait_eq 401 replay_refused && ok || fail "ttl: a revoked key still replays past the TTL: $(code t3)"
expect_eq "ttl: still one effect for carol" 7 "$(effects_now)"
stop_gateway "$GW_PID"

# ---- 5. header: rules, namespaced ----------------------------------------
start_gateway cred --upstream "$UP" --store "$TMP/shared.db" \
  --principal credential:authorization || { finish; exit 1; }
T5=$(sign rsa1 '{"iss":"https://issuer.test","sub":"dave","aud":"tickets","exp":'$((NOW + 600))'}')
post h1 order-5 '{"title":"h"}' -H "Authorization: Bearer $T5"
stop_gateway "$GW_PID"
HASH=$(printf 'Bearer %s' "$T5" | sha256sum | cut -d' ' -f1)
start_gateway hdr --upstream "$UP" --store "$TMP/shared.db" \
  --principal header:X-User || { finish; exit 1; }
post h2 order-5 '{"title":"h"}' -H "X-User: authorization:$HASH" -H "Authorization: Bearer $T5"
post h3 order-5 '{"title":"h"}' -H "Authorization: Bearer $T5"
post h4 order-5 '{"title":"h"}' -H 'X-User: a' -H 'X-User: b' -H "Authorization: Bearer $T5"
expect_eq "header: a value naming a credential's tenant acts anew (no replay); missing 401; repeated 400" \
  "201 201 $(($(json h1 ticket_id) + 1)) 401 400" \
  "$(code h1) $(code h2) $(json h2 ticket_id) $(code h3) $(code h4)"
expect_eq "header: no replay header on the new action" "" "$(header h2 Idempotent-Replayed)"
stop_gateway "$GW_PID"

# ---- 6. none, and the default ------------------------------------------
start_gateway none --upstream "$UP" --store "$TMP/none.db" --principal none ||
  { finish; exit 1; }
post n1 order-6 '{"title":"n"}' -H "Authorization: Bearer $T5"
post n2 order-6 '{"title":"n"}' -H "Authorization: Bearer $T1"
expect_eq "none: one tenant: another caller's retry replays" "201 201 true" \
  "$(code n1) $(code n2) $(header n2 Idempotent-Replayed)"
stop_gateway "$GW_PID"
expect_eq "none on the loopback: no warning" "" \
  "$(grep -c 'warning: --principal none' "$TMP/none.err" | grep -v '^0$')"
# On every address, the rule none replays to anyone: said at start.
"$IDEM" serve --listen 0.0.0.0:0 --upstream "$UP" --store "$TMP/none.db" \
  --principal none 2>"$TMP/open.err" &
OPEN_PID=$!
n=0
while ! grep -q 'principal none' "$TMP/open.err" && [ $n -lt 400 ]; do
  sleep 0.05; n=$((n + 1))
done
kill "$OPEN_PID"; wait "$OPEN_PID" 2>/dev/null
expect_match "none on every address: a warning at start" \
  "warning: --principal none on 0.0.0.0:0, which is not the loopback" \
  "$(cat "$TMP/open.err")"
"$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$TMP/dflt.db" \
  --principal bogus:x 2>"$TMP/bogus.err"
expect_eq "a bad rule is a usage error" 2 "$?"
expect_match "a bad rule says which rules there are" "credential:NAME" "$(cat "$TMP/bogus.err")"
"$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$TMP/dflt.db" \
  --principal jwt --jwks "$TMP/jwk/jwks.json" 2>"$TMP/nojwt.err"
expect_eq "jwt without --issuer and --audience is a usage error" 2 "$?"

finish
