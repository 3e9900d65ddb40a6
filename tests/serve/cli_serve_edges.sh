#!/bin/sh
# idem serve with requests at the edges of HTTP: request targets that are
# not a path, and other odd input. Every case checks what reached which
# upstream and what the client was answered.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

start_upstream other || { finish; exit 1; }
OTHER=$UP
start_upstream up || { finish; exit 1; }
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" || { finish; exit 1; }

# 1. A request target that is not a path ("@host:port/x") must not make
#    the gateway talk to another host: appended to the upstream's base URL
#    it would read as user info and a host of the client's choosing.
target="@${OTHER#http://}/tickets"
post t1 target-1 '{"title":"T"}' /tickets --request-target "$target"
curl -s -o "$TMP/t2.b" -w '%{http_code}' --request-target "@${OTHER#http://}/x" "$GW/x" >"$TMP/t2.code"
expect_eq "target not a path: POST refused" "400 urn:idem:problem:bad-target" "$(code t1) $(json t1 type)"
expect_eq "target not a path: GET refused" 400 "$(code t2)"
expect_eq "target not a path: the other host saw nothing" "0 0" \
  "$(curl -s "$OTHER/_counts" | python3 -c 'import json,sys; c=json.load(sys.stdin); print(c["total"], c["requests"])')" 
expect_eq "target not a path: nothing forwarded" "0" "$(effects target-1)"
post t3 target-1 '{"title":"T"}'
expect_eq "target not a path: the key is free" "201 T 1" "$(code t3) $(json t3 title) $(effects target-1)"

# 2. A header value that is not UTF-8 (obs-text, ISO-8859-1) is replayed
#    byte for byte, not dropped from the stored answer.
curl -s -o /dev/null -D "$TMP/l1.h" -X POST -H 'Idempotency-Key: latin-1' \
  --data x "$GW/tickets?latin1=1"
curl -s -o /dev/null -D "$TMP/l2.h" -X POST -H 'Idempotency-Key: latin-1' \
  --data x "$GW/tickets?latin1=1"
cd_line() { grep -a -i '^Content-Disposition:' "$TMP/$1.h" | od -An -tx1 | tr -d ' \n'; }
expect_eq "latin-1 header: passed on byte for byte" \
  "$(printf 'Content-Disposition: attachment; filename="caf\351.txt"\r\n' | od -An -tx1 | tr -d ' \n')" "$(cd_line l1)"
expect_eq "latin-1 header: replayed" true "$(header l2 Idempotent-Replayed)"
expect_eq "latin-1 header: the replay has it, byte for byte" "$(cd_line l1)" "$(cd_line l2)"
expect_eq "latin-1 header: one effect" 1 "$(effects latin-1)"

# 3. Many X-Forwarded-For lines: the gateway appends the client's address
#    to each (its own HTTP/1.1 client, this upstream being at an IP
#    address); the request it writes once outgrew the buffer sized for it,
#    and one request crashed the gateway. 90 lines (within the upstream's
#    limit of 100 headers) reach it, each with the address; 400 lines get
#    the upstream's own refusal; the gateway answers on.
xff=""
i=0
while [ $i -lt 90 ]; do xff="$xff -H X-Forwarded-For:1"; i=$((i + 1)); done
# shellcheck disable=SC2086
curl -s -o "$TMP/x1.b" -w '%{http_code}' $xff "$GW/xff-90" >"$TMP/x1.code"
expect_eq "90 X-Forwarded-For lines: the upstream's answer" 200 "$(code x1)"
expect_eq "90 X-Forwarded-For lines: each with the client's address" \
  "1, 127.0.0.1" \
  "$(curl -s "$UP/_counts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_headers"]["X-Forwarded-For"])')"
while [ $i -lt 400 ]; do xff="$xff -H X-Forwarded-For:1"; i=$((i + 1)); done
# shellcheck disable=SC2086
curl -s -o "$TMP/x2.b" -w '%{http_code}' $xff "$GW/xff-400" >"$TMP/x2.code"
expect_eq "400 X-Forwarded-For lines: the upstream's refusal, passed on" \
  431 "$(code x2)"
kill -0 "$GW_PID" 2>/dev/null && ok || fail "400 X-Forwarded-For lines: the gateway died"
curl -s -o "$TMP/x3.b" -w '%{http_code}' "$GW/after-xff" >"$TMP/x3.code"
expect_eq "after them: the gateway answers the next request" "200 True" \
  "$(code x3) $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["get"])' "$TMP/x3.b")"

# Methods: one longer than the gateway forwards whole (39 bytes) is
# answered 501 by the gateway (it was cut to its first 39 bytes, another
# method); one of 39 bytes reaches the upstream, whose own answer is
# passed on.
m40=$(printf 'M%.0s' $(seq 40))
m39=$(printf 'M%.0s' $(seq 39))
curl -s -o "$TMP/m1.b" -w '%{http_code}' -X "$m40" "$GW/long-method" >"$TMP/m1.code"
expect_eq "a 40-byte method: 501 from the gateway" \
  "501 urn:idem:problem:method-not-implemented" "$(code m1) $(json m1 type)"
curl -s -o "$TMP/m2.b" -D "$TMP/m2.h" -w '%{http_code}' -X "$m39" "$GW/long-method" >"$TMP/m2.code"
expect_eq "a 39-byte method: the upstream's own answer" "501 text/html" \
  "$(code m2) $(header m2 Content-Type | cut -d ';' -f 1)"

stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"

# 4. A tenant header sent twice (a front proxy that appends its own to the
#    client's) is refused: read first, the client's would pick the tenant
#    and replay another tenant's answer.
start_gateway gwt --upstream "$UP" --store "$TMP/gwt.db" --tenant-header X-Tenant || { finish; exit 1; }
post a1 tenant-1 '{"title":"alice only"}' -H 'X-Tenant: alice'
post a2 tenant-1 '{"title":"alice only"}' -H 'X-Tenant: alice' -H 'X-Tenant: mallory'
expect_eq "tenant header twice: 400" "400 urn:idem:problem:bad-tenant" "$(code a2) $(json a2 type)"
expect_eq "tenant header twice: alice's answer not replayed" "" "$(header a2 Idempotent-Replayed)"
post a3 tenant-1 '{"title":"alice only"}' -H 'X-Tenant: mallory'
expect_eq "tenant header once: mallory's own record" "201 alice only " \
  "$(code a3) $(json a3 title) $(header a3 Idempotent-Replayed)"
post a4 tenant-1 '{"title":"alice only"}' -H 'X-Tenant: alice'
expect_eq "tenant header once: alice's replay" "201 true $(json a1 ticket_id)" \
  "$(code a4) $(header a4 Idempotent-Replayed) $(json a4 ticket_id)"
expect_eq "tenant header: two effects, one per tenant" 2 "$(effects tenant-1)"
# Under a header rule (--tenant-header is --principal header:NAME), a keyed
# request without the header names no principal: 401, never the tenant of
# its credential or "" (the front proxy that sets the header must
# authenticate every keyed request).
post b0 tenant-2 '{"title":"bob"}' -H 'Authorization: Bearer bob'
expect_eq "tenant header missing: 401 no-principal, nothing forwarded" \
  "401 urn:idem:problem:no-principal 0" \
  "$(code b0) $(json b0 type) $(effects tenant-2)"
stop_gateway "$GW_PID"
# The default rule, credential:authorization: two credentials never share
# a record.
start_gateway gwa --upstream "$UP" --store "$TMP/gwt.db" \
  --principal credential:authorization || { finish; exit 1; }
post b1 tenant-2 '{"title":"bob"}' -H 'Authorization: Bearer bob'
post b2 tenant-2 '{"title":"bob"}' -H 'Authorization: Bearer eve'
expect_eq "credentials: eve does not get bob's answer" "201 " \
  "$(code b2) $(header b2 Idempotent-Replayed)"
expect_eq "credentials: eve's own ticket" "true" \
  "$(python3 -c 'import sys; print(str(sys.argv[1] != sys.argv[2]).lower())' "$(json b1 ticket_id)" "$(json b2 ticket_id)")"
post b3 tenant-2 '{"title":"bob"}' -H 'Authorization: Bearer bob'
expect_eq "credentials: bob's retry replays his" "201 true $(json b1 ticket_id)" \
  "$(code b3) $(header b3 Idempotent-Replayed) $(json b3 ticket_id)"
expect_eq "credentials: two effects, one per credential" 2 "$(effects tenant-2)"
post z1 auth-1 '{"title":"Z"}' -H 'Authorization: Bearer a' -H 'Authorization: Bearer b'
expect_eq "Authorization twice: 400, nothing forwarded" "400 urn:idem:problem:bad-tenant 0" \
  "$(code z1) $(json z1 type) $(effects auth-1)"
stop_gateway "$GW_PID"
# A tenant header's value never names a credential's tenant: bob's is
# authorization:SHA-256("Bearer bob"), and mallory sends that to a gateway
# on the same store whose rule is header:X-Tenant; its tenant is
# header:authorization:..., a record of its own.
start_gateway gwt2 --upstream "$UP" --store "$TMP/gwt.db" --tenant-header X-Tenant ||
  { finish; exit 1; }
bobs=authorization:$(printf 'Bearer bob' | sha256sum | cut -d' ' -f1)
post b5 tenant-2 '{"title":"bob"}' -H "X-Tenant: $bobs"
expect_eq "a tenant header shaped like a credential's tenant: bob's answer not replayed" \
  "201  3" "$(code b5) $(header b5 Idempotent-Replayed) $(effects tenant-2)"
stop_gateway "$GW_PID"
finish
