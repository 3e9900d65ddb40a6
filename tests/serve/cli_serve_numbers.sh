#!/bin/sh
# idem serve with numbers that a double cannot hold: a key reused for
# another account (12345678901234567, then 12345678901234568, one double
# under RFC 8785) is refused and reaches nothing, while the same value
# written otherwise (1, 1.0) is a replay. Every case checks what the
# upstream saw and what the client was answered.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

start_upstream up || { finish; exit 1; }
# --keep-requests: a 422 names what differed.
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" --keep-requests || { finish; exit 1; }

# 1. Another account under the same key: 422, and the upstream saw one
#    request, the first.
post a1 account-1 '{"title":"pay","account":12345678901234567}'
post a2 account-1 '{"title":"pay","account":12345678901234568}'
expect_eq "first account: forwarded" "201 " \
  "$(code a1) $(header a1 Idempotent-Replayed)"
expect_eq "another account, same key: 422 key-reused" \
  "422 urn:idem:problem:key-reused" "$(code a2) $(json a2 type)"
expect_eq "another account: not a replay" "" "$(header a2 Idempotent-Replayed)"
expect_match "another account: the detail says the body differed" \
  "to POST /tickets: the body differed" "$(json a2 detail)"
# The same bytes as another media type, and another query: each said.
curl -s -o "$TMP/a4.b" -w '%{http_code}' -X POST -H 'Idempotency-Key: account-1' \
  -H 'Content-Type: text/plain' --data-binary '{"title":"pay","account":12345678901234567}' \
  "$GW/tickets" >"$TMP/a4.code"
expect_match "same bytes, text/plain: the Content-Type differed" \
  "422 .*the Content-Type \\(JSON or not\\) differed" "$(code a4) $(json a4 detail)"
post a5 account-1 '{"title":"pay","account":12345678901234567}' '/tickets?x=1'
expect_match "another query: the query differed" \
  "422 .*: the query differed" "$(code a5) $(json a5 detail)"
post a6 account-1 '{"title":"pay","account":12345678901234567}' -H 'Content-Type: text/plain'
expect_eq "two Content-Type headers: refused" "400 urn:idem:problem:bad-header" \
  "$(code a6) $(json a6 type)"
expect_eq "none reached the upstream" "1" "$(effects account-1)"
expect_eq "another account: the upstream saw exactly one request" "1 1" \
  "$(effects account-1) $(upstream_field total)"
# The first account again, its digits written otherwise: the replay.
post a3 account-1 '{ "account" : 1.2345678901234567e16, "title":"pay" }'
expect_eq "first account again: replayed" "201 true" \
  "$(code a3) $(header a3 Idempotent-Replayed)"
expect_eq "first account again: the first answer" "$(body a1)" "$(body a3)"

# 2. Other numbers one double holds: 0.1 and 0.10000000000000001, and two
#    amounts too small for any double but zero.
post t1 tenth-1 '{"title":"t","amount":0.1}'
post t2 tenth-1 '{"title":"t","amount":0.10000000000000001}'
expect_eq "0.1, then 0.10000000000000001: 201, 422" "201 422" \
  "$(code t1) $(code t2)"
post u1 tiny-1 '{"title":"u","amount":1e-400}'
post u2 tiny-1 '{"title":"u","amount":2e-400}'
expect_eq "1e-400, then 2e-400: 201, 422" "201 422" "$(code u1) $(code u2)"
expect_eq "one effect each" "1 1" "$(effects tenth-1) $(effects tiny-1)"

# 3. One value written otherwise: 1, then 1.0 (and 10E-1): replays.
post o1 one-1 '{"title":"o","n":1}'
post o2 one-1 '{"title":"o","n":1.0}'
post o3 one-1 '{"n":10E-1,"title":"o"}'
expect_eq "1, then 1.0 and 10E-1: 201, replays" "201 201 true 201 true" \
  "$(code o1) $(code o2) $(header o2 Idempotent-Replayed) $(code o3) $(header o3 Idempotent-Replayed)"
expect_eq "1, then 1.0: the first answer" "$(body o1)" "$(body o2)"
expect_eq "1, then 1.0: one effect" 1 "$(effects one-1)"

# 4. Operators still see the request's canonical form (RFC 8785), its
#    numbers as doubles.
expect_eq "stored request: RFC 8785" \
  '{"body":{"account":12345678901234568,"title":"pay"},"method":"POST","path":"/tickets","query":""}' \
  "$("$IDEM" keys show account-1 --store "$TMP/gw.db" --operation 'POST /tickets' --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("request"))')"

# 5. A body over 64 KiB is fingerprinted by a fingerprint worker, off the
#    HTTP threads, from the same one pass: members reordered and spaced
#    replay, a last digit changed past a double's precision is 422, and
#    the record keeps the same canonical request as a small body's.
big() { # big FIRST LAST: 20,000 integers between two given numbers
  python3 -c 'import json,sys
ns=list(range(20000))
print(json.dumps({"title":"big","first":int(sys.argv[1]),"ns":ns,"last":int(sys.argv[2])},separators=(sys.argv[3],":")))' "$@"
}
big 1 12345678901234567 , >"$TMP/big1"
big 1 12345678901234567 ", " >"$TMP/big2"
big 1 12345678901234568 , >"$TMP/big3"
[ "$(wc -c <"$TMP/big1")" -gt 65536 ] && ok || fail "the big body is not over 64 KiB"
post g1 big-1 "$(cat "$TMP/big1")"
post g2 big-1 "$(cat "$TMP/big2")"
post g3 big-1 "$(cat "$TMP/big3")"
expect_eq "a big body: 201, the same spaced otherwise replays, one digit changed 422" \
  "201 201 true 422 1" \
  "$(code g1) $(code g2) $(header g2 Idempotent-Replayed) $(code g3) $(effects big-1)"
# The fingerprint the record holds is the one the small-body path would
# take of the same request (its text, whole, through idem's own hash).
fp=$("$IDEM" keys show big-1 --store "$TMP/gw.db" --operation 'POST /tickets' --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["fingerprint"])')
# RFC 8785 with integers exact is Python's sorted, compact dump here: the
# keys are ASCII, the numbers integers.
want=$(python3 -c 'import hashlib,json,sys
body=json.load(open(sys.argv[1]))
req={"method":"POST","path":"/tickets","query":"","body":body}
print(hashlib.sha256(json.dumps(req,sort_keys=True,separators=(",",":")).encode()).hexdigest())' "$TMP/big1")
expect_eq "a big body: the fingerprint of the whole request" "$want" "$fp"

stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"
finish
