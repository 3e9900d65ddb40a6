#!/bin/sh
# idem serve against requests it cannot frame without doubt (RFC 9112 §6,
# §5, §3.2), targets that leave the upstream's base path, and targets that
# differ only in how they are percent-encoded (RFC 3986 §6.2.2). Raw bytes
# on a socket (raw_http.py); what reaches the upstream is captured byte for
# byte by an upstream of the test's own.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"
RAW="$HERE_SERVE/raw_http.py"

# The capturing upstream, behind a gateway whose base has a path.
python3 "$RAW" capture "$TMP/cap.port" "$TMP/cap.log" &
PIDS="$PIDS $!"
wait_for "$TMP/cap.port" || { fail "capturing upstream did not start"; finish; exit 1; }
CAP="http://127.0.0.1:$(cat "$TMP/cap.port")"
start_gateway gwb --upstream "$CAP/public/api" --store "$TMP/gwb.db" || { finish; exit 1; }
GWB=$GW
ADDR=${GWB#http://}
seen() { python3 "$RAW" count "$TMP/cap.log"; }

# A request the upstream would act on, and one a lenient server would read
# as a second request if the gateway took the hostile one's framing wrong.
SMUGGLED='GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n'
POST1='POST /tickets HTTP/1.1\r\nHost: x\r\n'

# refused WHAT STATUS TYPE BYTES: BYTES, with SMUGGLED pipelined behind it
# on the same connection, get one problem+json answer with STATUS and
# urn:idem:problem:TYPE that closes the connection; the request behind it
# is never answered, and nothing reaches the upstream.
refused() {
  before=$(seen)
  expect_eq "$1: $2, connection closed, the request behind it unanswered" \
    "$2 application/problem+json urn:idem:problem:$3 close closed 1" \
    "$(python3 "$RAW" exchange "$ADDR" "$4$SMUGGLED")"
  expect_eq "$1: nothing reached the upstream" "$before" "$(seen)"
}

# 1. Message framing (RFC 9112 §6.1-6.3).
refused "Content-Length with Transfer-Encoding" 400 bad-framing \
  "${POST1}Idempotency-Key: f-1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
refused "two Content-Length headers" 400 bad-framing \
  "${POST1}Idempotency-Key: f-2\r\nContent-Length: 5\r\nContent-Length: 30\r\n\r\nhello"
refused "two equal Content-Length headers" 400 bad-framing \
  "${POST1}Idempotency-Key: f-3\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"
refused "Content-Length not digits, with Transfer-Encoding" 400 bad-framing \
  "${POST1}Content-Length: 5x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
for te in xchunked gzip 'gzip, chunked' 'chunked, chunked' 'chunked;q=1'; do
  refused "Transfer-Encoding: $te" 501 unsupported-transfer-coding \
    "${POST1}Idempotency-Key: f-te\r\nTransfer-Encoding: $te\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
done
refused "Transfer-Encoding not ASCII" 501 unsupported-transfer-coding \
  "${POST1}Transfer-Encoding: chunked\xe9\r\n\r\n0\r\n\r\n"
refused "Transfer-Encoding twice" 501 unsupported-transfer-coding \
  "${POST1}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
refused "Transfer-Encoding in HTTP/1.0" 400 bad-framing \
  'POST /tickets HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n'

# libmicrohttpd 0.9.75 answers a Content-Length it cannot read itself,
# before the gateway sees the request: a 400 (HTML, its status line and
# headers sent twice, see docs/gateway.md), then it closes. What the
# gateway can still promise: nothing forwarded, nothing behind it answered.
for cl in 5x '5, 5' ' ' '+5' '-1'; do
  before=$(seen)
  got=$(python3 "$RAW" exchange "$ADDR" "${POST1}Content-Length: $cl\r\n\r\nhello$SMUGGLED")
  expect_eq "Content-Length '$cl': 400 and closed" "400 closed" \
    "$(echo "$got" | cut -d' ' -f1,5)"
  expect_eq "Content-Length '$cl': the request behind it unanswered" 0 \
    "$(python3 "$RAW" exchange "$ADDR" "${POST1}Content-Length: $cl\r\n\r\nhello$SMUGGLED" --raw | grep -c 'HTTP/1.1 2')"
  expect_eq "Content-Length '$cl': nothing reached the upstream" "$before" "$(seen)"
done

# 2. Header lines (RFC 9110 §5.1, 5.5; RFC 9112 §5).
refused "space before the colon" 400 bad-header \
  "${POST1}Transfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhello"
refused "space in a header name" 400 bad-header \
  "${POST1}X Foo: 1\r\nContent-Length: 5\r\n\r\nhello"
refused "header name not ASCII" 400 bad-header \
  "${POST1}X-Caf\xe9: 1\r\nContent-Length: 5\r\n\r\nhello"
refused "empty header name" 400 bad-header \
  "${POST1}: v\r\nContent-Length: 5\r\n\r\nhello"
refused "folded line (obs-fold)" 400 bad-header \
  "${POST1}Idempotency-Key: fold-a\r\n fold-b\r\nContent-Length: 5\r\n\r\nhello"
refused "folded line with a tab" 400 bad-header \
  "${POST1}X-A: a\r\n\tb\r\nContent-Length: 5\r\n\r\nhello"
refused "NUL in the key" 400 bad-header \
  "${POST1}Idempotency-Key: a\x00b\r\nContent-Length: 5\r\n\r\nhello"
refused "NUL in a header value" 400 bad-header \
  "${POST1}X-A: a\x00\r\nContent-Length: 5\r\n\r\nhello"
refused "control character in a value" 400 bad-header \
  "${POST1}X-A: a\x01b\r\nContent-Length: 5\r\n\r\nhello"
refused "bare CR in a value" 400 bad-header \
  "${POST1}X-A: a\rb\r\nContent-Length: 5\r\n\r\nhello"
refused "DEL in the key" 400 bad-header \
  "${POST1}Idempotency-Key: a\x7fb\r\nContent-Length: 5\r\n\r\nhello"

# 3. Host (RFC 9112 §3.2), the method and the target (RFC 9112 §3).
refused "HTTP/1.1 without Host" 400 bad-host \
  'POST /tickets HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello'
refused "two Host headers" 400 bad-host \
  'GET /tickets HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n'
refused "Host not a host" 400 bad-host \
  'GET /tickets HTTP/1.1\r\nHost: x/y@z\r\n\r\n'
refused "method not a token" 400 bad-method \
  'PO(ST /tickets HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello'
refused "NUL in the path" 400 bad-target \
  'POST /tick\x00ets HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello'
refused "NUL in the query" 400 bad-target \
  'POST /tickets?a=\x00b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello'
refused "control character in the path" 400 bad-target \
  'GET /tick\x01ets HTTP/1.1\r\nHost: x\r\n\r\n'
refused "control character in the query" 400 bad-target \
  'GET /tickets?a=\x1b HTTP/1.1\r\nHost: x\r\n\r\n'
refused "space in the target" 400 bad-target \
  'GET /tick ets HTTP/1.1\r\nHost: x\r\n\r\n'
refused "two spaces after the method" 400 bad-target \
  'GET  /tickets HTTP/1.1\r\nHost: x\r\n\r\n'
refused "fragment in the target" 400 bad-target \
  'GET /tickets#x HTTP/1.1\r\nHost: x\r\n\r\n'
refused "bad percent-encoding" 400 bad-target \
  'GET /tickets%zz HTTP/1.1\r\nHost: x\r\n\r\n'

# 4. Path confinement: nothing outside the base path, however it is spelt.
for p in /../../internal/admin/delete-all /%2e%2e/%2e%2e/internal/admin/delete-all \
    /%2E./internal /.%2e/internal /a/./b /a/%2E/b /a/.. /tickets/..%2f..%2finternal \
    '/tickets/..\\internal' /tickets/..%5cinternal \
    '/tickets/..;/internal' '/tickets/..;x=1/internal' '/a/.;/b' \
    /tickets/%2e%2e%3b/internal '/tickets/.%2e;jsessionid=1/internal'; do
  refused "dot segment $p" 400 dot-segment \
    "POST $p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: dot\r\nContent-Length: 2\r\n\r\n{}"
done
before=$(seen)
curl -s -o "$TMP/c1.b" -D "$TMP/c1.h" -w '%{http_code}' --path-as-is -X POST \
  -H 'Idempotency-Key: confine-1' --data '{}' \
  "$GWB/../../internal/admin/delete-all" >"$TMP/c1.code"
expect_eq "curl --path-as-is ../../internal: 400 problem+json" \
  "400 urn:idem:problem:dot-segment" "$(code c1) $(json c1 type)"
curl -s -o "$TMP/c2.b" -w '%{http_code}' --path-as-is -X POST \
  -H 'Idempotency-Key: confine-2' --data '{}' \
  "$GWB/%2e%2e/%2E%2e/internal/admin/delete-all" >"$TMP/c2.code"
expect_eq "curl --path-as-is %2e%2e: 400" 400 "$(code c2)"
expect_eq "path confinement: nothing reached the upstream" "$before" "$(seen)"

# 5. What the upstream sees: exactly the base and the client's path,
#    normalised; well-formed header lines only; no header that the
#    Connection header names.
curl -s -o "$TMP/n1.b" -w '%{http_code}' -X POST -H 'Idempotency-Key: seen-1' \
  -H 'Connection: X-Secret' -H 'X-Secret: s3cret' -H 'X-Kept: 1' \
  --data '{}' "$GWB/tickets/a%7eb/%7Bc%7d/%2f?q=%7E%2fx&r=%41" >"$TMP/n1.code"
n=$(seen)
expect_eq "normal path: forwarded" 201 "$(code n1)"
expect_eq "normal path: the base, then the path normalised" \
  "POST /public/api/tickets/a~b/%7Bc%7D/%2F?q=~%2Fx&r=A HTTP/1.1" \
  "$(python3 "$RAW" lines "$TMP/cap.log" | sed -n "${n}p")"
expect_eq "hop-by-hop: X-Secret (named by Connection) not passed on" "" \
  "$(python3 "$RAW" headers "$TMP/cap.log" "$n" | grep -i '^x-secret')"
expect_eq "hop-by-hop: other headers passed on" "X-Kept: 1" \
  "$(python3 "$RAW" headers "$TMP/cap.log" "$n" | grep -i '^x-kept')"
expect_eq "the upstream got only well-formed header lines" "" \
  "$(python3 "$RAW" malformed "$TMP/cap.log")"
expect_eq "of all requests above, only this one reached the upstream" 1 "$n"
stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"

# 6. Normalisation (RFC 3986 §6.2.2): targets that differ only in how
#    unreserved characters, or the hex digits of others, are encoded are one
#    resource: one record, one effect. /tickets and /tickets/ stay two.
start_upstream up || { finish; exit 1; }
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" || { finish; exit 1; }
post m1 norm-1 '{"title":"N"}' '/t%7Eickets'
post m2 norm-1 '{"title":"N"}' '/t~ickets'
expect_eq "%7E then ~: one record, the second replayed" "201 201 true 1" \
  "$(code m1) $(code m2) $(header m2 Idempotent-Replayed) $(effects norm-1)"
post m3 norm-2 '{"title":"N"}' '/t%7eickets'
post m4 norm-2 '{"title":"N"}' '/t%7Eickets'
expect_eq "%7e then %7E: one record, the second replayed" "201 201 true 1" \
  "$(code m3) $(code m4) $(header m4 Idempotent-Replayed) $(effects norm-2)"
post m5 norm-3 '{"title":"N"}' '/tickets/%2fx?a=%2f'
post m6 norm-3 '{"title":"N"}' '/tickets/%2Fx?a=%2F'
expect_eq "%2f then %2F (reserved, kept encoded): one record" "201 201 true 1" \
  "$(code m5) $(code m6) $(header m6 Idempotent-Replayed) $(effects norm-3)"
post m7 norm-4 '{"title":"N"}' '/tickets'
post m8 norm-4 '{"title":"N"}' '/tickets/'
expect_eq "/tickets then /tickets/: two resources, no replay" "201 " \
  "$(code m7) $(header m8 Idempotent-Replayed)"
stop_gateway "$GW_PID"
expect_eq "stopped cleanly" 0 "$STOPPED"
finish
