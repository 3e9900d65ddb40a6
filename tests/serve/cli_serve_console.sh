#!/bin/sh
# The operator console on idem serve's admin listener (--console-token-file):
# a gateway's unknown outcomes, settled through the console's API, and what
# the client's retry gets after each choice. Every scenario counts the
# upstream's effects and checks the identifiers the client gets.
#  - completed: the retry is answered the operator's status and body,
#    marked replayed; the upstream acts no more.
#  - failed: the retry is answered 502 resolved-failed; no more effects.
#  - released: the retry is forwarded and acts once more.
#  - the console's counts and call rates follow; the audit log names the
#    operator, the key and the address; without the token nothing is served.
#  - the console's token and the admin token are two: neither opens the
#    other's paths, one token for both is refused, and wrong admin tokens
#    are limited per client as the console's are.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

start_upstream up || { finish; exit 1; }
DB=$TMP/gw.db
printf 'console-token-0123456789\n' > "$TMP/token"
T=console-token-0123456789
printf 'admin-token-9876543210\n' > "$TMP/admin-token"
A=admin-token-9876543210
AUDIT=$TMP/audit.log

# api NAME PATH [JSON]: the console's API with the token; the status into
# $TMP/NAME.code and the body into $TMP/NAME.b.
api() {
  n=$1 path=$2
  if [ $# -ge 3 ]; then
    curl -s -o "$TMP/$n.b" -w '%{http_code}' -H "Authorization: Bearer $T" \
      -H 'X-Idem-Operator: carol' -H 'Content-Type: application/json' \
      --data-binary "$3" "$ADMIN$path" > "$TMP/$n.code"
  else
    curl -s -o "$TMP/$n.b" -w '%{http_code}' -H "Authorization: Bearer $T" \
      "$ADMIN$path" > "$TMP/$n.code"
  fi
}
# tmetric NAME_WITH_LABELS: a value from /metrics, with the token.
tmetric() { curl -s -H "Authorization: Bearer $A" "$ADMIN/metrics" | grep -F "$1 " | grep -v '^#' | awk '{print $NF}'; }
# field NAME EXPR: a Python expression over the JSON body j.
field() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$TMP/$1.b" "$2"; }

start_gateway console --upstream "$UP" --store "$DB" --upstream-timeout 1s \
  --lease 1s --on-unknown fail --admin-token-file "$TMP/admin-token" \
  --console-token-file "$TMP/token" --console-audit-log "$AUDIT" || { finish; exit 1; }

# Nothing without the token: the page, the API, the admin's own paths.
for p in / /api/records /api/metrics /metrics /healthz; do
  expect_eq "no token: $p is 401" 401 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN$p")"
done
# The admin token (a scraper's, a load balancer's) does not open the
# console, which settles records; the console's does not open /metrics.
expect_eq "the admin token on the console's API: 401" 401 \
  "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A" "$ADMIN/api/records")"
expect_eq "the admin token on /metrics: 200" 200 \
  "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A" "$ADMIN/metrics")"
expect_eq "the console's token on /metrics: 401" 401 \
  "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $T" "$ADMIN/metrics")"

# unknown KEY: a key whose upstream acted and whose answer was lost (held
# past --upstream-timeout), refused as unknown after its lease.
unknown() {
  post "$1-a" "$1" '{"title":"U"}' "/tickets?hold=$1"
  release "$1"
  post_past_lease "$1-b" "$1" '{"title":"U"}' "/tickets?hold=$1"
  expect_eq "$1: unknown after its lease, one effect" "504 409 urn:idem:problem:outcome-unknown 1" \
    "$(code "$1-a") $(code "$1-b") $(json "$1-b" type) $(effects "$1")"
}
unknown u-done
unknown u-fail
unknown u-release
post ok1 plain-1 '{"title":"P"}'
expect_eq "a plain key: 201, one effect" "201 1" "$(code ok1) $(effects plain-1)"

# The console lists the three unknown outcomes, and counts them.
api l1 '/api/records?state=unknown'
expect_eq "console: the unknown outcomes listed" "200 3 ['u-done', 'u-fail', 'u-release']" \
  "$(code l1) $(field l1 'j["total"]') $(field l1 'sorted(r["key"] for r in j["records"])')"
expect_eq "console: each is a gateway operation" "['POST /tickets']" \
  "$(field l1 'sorted(set(r["operation"] for r in j["records"]))')"
api m1 /api/metrics
expect_eq "console: counts" "3 1" "$(field m1 'j["records"]["unknown"]') $(field m1 'j["records"]["completed"]')"
expect_eq "console: the gateway's calls, as /metrics counts them" \
  "$(tmetric 'idem_gateway_requests_total{outcome="proceed"}') $(tmetric 'idem_gateway_requests_total{outcome="unknown"}')" \
  "$(field m1 'j["calls"]["proceed"]') $(field m1 'j["calls"]["unknown"]')"
expect_eq "console: three unknown refusals counted" 3 "$(field m1 'j["calls"]["unknown"]')"
expect_eq "console: in progress with the lease ended is listed as waiting" "True True True" \
  "$(field l1 'all(r["lease_ended"] for r in j["records"])') $(field l1 'all(r["state"]=="in_progress" for r in j["records"])') $(field l1 'j["records"][0]["age_ms"] >= 0')"

# completed: the operator's answer is replayed.
api r1 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"u-done","outcome":"completed","status":201,"body":"{\"ticket_id\":777,\"by\":\"operator\"}"}'
expect_eq "resolve completed: 200" "200 completed" "$(code r1) $(field r1 'j["resolved"]')"
post d1 u-done '{"title":"U"}' /tickets?hold=u-done
expect_eq "completed: the retry gets the operator's answer, replayed; no new effect" \
  "201 true 777 operator 1" \
  "$(code d1) $(header d1 Idempotent-Replayed) $(json d1 ticket_id) $(json d1 by) $(effects u-done)"

# failed: an error is replayed, the upstream is not called.
api r2 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"u-fail","outcome":"failed"}'
expect_eq "resolve failed: 200" 200 "$(code r2)"
post f1 u-fail '{"title":"U"}' /tickets?hold=u-fail
expect_eq "failed: the retry gets 502 resolved-failed; no new effect" \
  "502 urn:idem:problem:resolved-failed 1" "$(code f1) $(json f1 type) $(effects u-fail)"

# released: the next call acts, once.
api r3 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"u-release","outcome":"released"}'
expect_eq "resolve released: 200" 200 "$(code r3)"
post e1 u-release '{"title":"U"}' /tickets?hold=u-release
post e2 u-release '{"title":"U"}' /tickets?hold=u-release
expect_eq "released: the retry acts once more, then is replayed" \
  "201 201 2 true" "$(code e1) $(code e2) $(effects u-release) $(header e2 Idempotent-Replayed)"
expect_eq "released: the same ticket both times" "$(json e1 ticket_id)" "$(json e2 ticket_id)"

# Resolving again, or a record that is not there: refused, nothing changes.
api r4 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"u-done","outcome":"released"}'
expect_eq "resolve a completed record: 409" 409 "$(code r4)"
post d2 u-done '{"title":"U"}' /tickets?hold=u-done
expect_eq "after the refused resolve: still the operator's answer" "201 777 1" \
  "$(code d2) $(json d2 ticket_id) $(effects u-done)"
api r5 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"nope","outcome":"released"}'
expect_eq "resolve a missing record: 404" 404 "$(code r5)"
api r6 /api/records/resolve '{"tenant":"","operation":"POST /tickets","key":"u-fail","outcome":"completed","status":99}'
expect_eq "resolve with a status no HTTP client takes: 400" 400 "$(code r6)"

# The counts follow (counted at most once a second): no unknown outcome
# left.
unknown_count() { api m2 /api/metrics; field m2 'j["records"]["unknown"]'; }
wait_eq 0 unknown_count
expect_eq "console: no unknown outcome left" 0 "$(field m2 'j["records"]["unknown"]')"

# The audit log: one line per action, naming the operator, key, address.
expect_eq "audit: three resolutions and two refusals by carol" \
  "completed failed released refused refused" \
  "$(python3 -c 'import json,sys; print(" ".join(json.loads(l)["outcome"] for l in open(sys.argv[1]) if json.loads(l)["action"]=="resolve" and json.loads(l)["operator"]=="carol" and json.loads(l)["address"]=="127.0.0.1"))' "$AUDIT")"
expect_eq "audit: the keys" "u-done u-fail u-release u-done nope" \
  "$(python3 -c 'import json,sys; print(" ".join(json.loads(l)["key"] for l in open(sys.argv[1]) if json.loads(l)["action"]=="resolve"))' "$AUDIT")"

# Wrong admin tokens are limited per client: at most 20 in a minute (one
# was sent above; a minute may begin meanwhile), then 429, the right token
# too, until the minute ends.
n=0
while [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer wrong-$n" "$ADMIN/healthz")" = 401 ] &&
  [ $n -lt 45 ]; do n=$((n + 1)); done
# 19 or 20 wrong tokens answered 401 (up to 39 when a minute began among
# them), then 429.
[ $n -ge 19 ] && [ $n -lt 40 ] && ok ||
  fail "wrong admin tokens: $n answered 401 before a 429 (19-39 expected)"
expect_eq "then the right admin token: 429" 429 \
  "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $A" "$ADMIN/healthz")"

# The admin listener without a console token serves no console.
stop_gateway "$GW_PID"
start_gateway plain --upstream "$UP" --store "$DB" || { finish; exit 1; }
expect_eq "no --console-token-file: no console at /" 404 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/")"
expect_eq "no --console-token-file: no console API" 404 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/api/records")"
out=$("$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$DB" --admin-listen 127.0.0.1:0 --console-audit-log "$TMP/x.log" 2>&1)
expect_eq "--console-audit-log without a console token: usage error" 2 "$?"
expect_match "--console-audit-log without a console token: says why" "needs --console-token-file" "$out"
out=$("$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" --store "$DB" --admin-listen 127.0.0.1:0 \
  --admin-token-file "$TMP/token" --console-token-file "$TMP/token" 2>&1)
expect_eq "one token for the admin listener and the console: usage error" 2 "$?"
expect_match "one token for both: says why" "same token as --admin-token-file" "$out"
stop_gateway "$GW_PID"
finish
