#!/bin/sh
# idem serve when things fail: the upstream down, too slow, or dropping the
# connection after it acted; the gateway killed with SIGKILL mid-request
# and restarted; an https:// upstream. A retry acts again only where the
# rules say: after the lease, with --on-unknown forward, and then with the
# same key. Every wait is for an event: the upstream holds its answer until
# the test releases it (upstream.py ?hold=NAME), and a lease's end is
# waited for by retrying while the answer is 409 in-flight (the gateways
# that show the lease run with --attach-wait 0, so that a retry inside it
# is told so at once instead of waiting for it: cli_serve_attach.sh).
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

start_upstream up || { finish; exit 1; }
DB=$TMP/gw.db
# The key the upstream saw last.
last_key() {
  upstream_field last_headers | python3 -c 'import json,sys; print(json.load(sys.stdin).get("Idempotency-Key"))'
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# 1. Upstream refuses the connection: 502, nothing stored, the key free.
start_gateway down --upstream "http://127.0.0.1:$(free_port)" --store "$DB" || { finish; exit 1; }
post d1 down-1 '{"title":"D"}'
expect_eq "upstream down: 502" "502 urn:idem:problem:upstream-unreachable" "$(code d1) $(json d1 type)"
expect_eq "upstream down: nothing stored" "" "$("$IDEM" keys list --store "$DB" 2>&1 | grep down-1)"
post d2 down-1 '{"title":"D"}'
expect_eq "upstream down: a retry is 502 again" 502 "$(code d2)"
stop_gateway "$GW_PID"
start_gateway up1 --upstream "$UP" --store "$DB" || { finish; exit 1; }
post d3 down-1 '{"title":"D"}'
expect_eq "upstream back: the retry proceeds" "201 D 1" "$(code d3) $(json d3 title) $(effects down-1)"
stop_gateway "$GW_PID"

# 2. Upstream slower than --upstream-timeout: 504; the key stays in
#    progress (409) until its lease ends; then a retry RECOVERs and is
#    forwarded again with the same key. The lease leaves a loaded machine
#    seconds to make the calls inside it.
start_gateway slow --upstream "$UP" --store "$DB" --upstream-timeout 1s --lease 8s --attach-wait 0 || { finish; exit 1; }
post s1 slow-1 '{"title":"S"}' /tickets?hold=slow-1
expect_eq "timeout: 504" "504 urn:idem:problem:upstream-timeout 8" "$(code s1) $(json s1 type) $(header s1 Retry-After)"
# The upstream acted and still holds its answer, which nobody waits for
# now: let it go, and the forward after the lease answers at once.
wait_held slow-1 || fail "timeout: the upstream never held the request"
release slow-1
post s2 slow-1 '{"title":"S"}' /tickets?hold=slow-1
expect_eq "timeout: in progress" "409 urn:idem:problem:in-flight" "$(code s2) $(json s2 type)"
expect_match "timeout: Retry-After" '^[1-8]$' "$(header s2 Retry-After)"
expect_match "timeout: idem keys shows it in progress" "in_progress" \
  "$("$IDEM" keys list --store "$DB" 2>&1 | grep slow-1)"
expect_eq "timeout: one effect so far" 1 "$(effects slow-1)"
post_past_lease s3 slow-1 '{"title":"S"}' /tickets?hold=slow-1
expect_eq "after the lease: recovered and forwarded again" "201 S 2" "$(code s3) $(json s3 title) $(effects slow-1)"
expect_eq "after the lease: the upstream saw the same key" slow-1 "$(last_key)"
post s4 slow-1 '{"title":"S"}' /tickets?hold=slow-1
expect_eq "after the recovery: replayed" "201 true $(json s3 ticket_id) 2" \
  "$(code s4) $(header s4 Idempotent-Replayed) $(json s4 ticket_id) $(effects slow-1)"
expect_match "metrics: a recover counted" '^1$' "$(metric 'idem_gateway_requests_total{outcome="recover"}')"

# 3. The connection lost after the upstream acted: 502, key in progress.
#    A lease of a minute, so that a loaded machine slow between the two
#    calls does not see the lease end (after which the retry recovers and
#    acts again, as section 2 checks).
stop_gateway "$GW_PID"
start_gateway drop --upstream "$UP" --store "$DB" --lease 60s || { finish; exit 1; }
post l1 drop-1 '{"title":"L"}' /tickets?drop_first=1
expect_eq "dropped connection: 502" "502 urn:idem:problem:upstream-failed 1" "$(code l1) $(json l1 type) $(effects drop-1)"
post l2 drop-1 '{"title":"L"}' /tickets?drop_first=1
expect_eq "dropped connection: the retry waits for the lease" "409 1" "$(code l2) $(effects drop-1)"
stop_gateway "$GW_PID"

# 3b. The same on a connection the gateway had used before: libcurl would
#    send the request again on a new connection when a reused one dies
#    before any answer; the gateway must not let it (the upstream acted).
start_gateway reuse --upstream "$UP" --store "$DB" --threads 1 || { finish; exit 1; }
post re1 reuse-0 '{"title":"R"}'
post re2 reuse-1 '{"title":"R"}' /tickets?drop_first=1
post re3 reuse-2 '' /tickets?drop_first=1
expect_eq "dropped reused connection: one effect each" "201 502 502 1 1" \
  "$(code re1) $(code re2) $(code re3) $(effects reuse-1) $(effects reuse-2)"
stop_gateway "$GW_PID"

# 4. --on-unknown fail: after the lease, 409 until an operator resolves it.
start_gateway fail --upstream "$UP" --store "$DB" --upstream-timeout 1s --lease 1s --on-unknown fail || { finish; exit 1; }
post f1 fail-1 '{"title":"F"}' /tickets?hold=fail-1
expect_eq "fail: 504" 504 "$(code f1)"
release fail-1
post_past_lease f2 fail-1 '{"title":"F"}' /tickets?hold=fail-1
expect_eq "fail: refused after the lease" "409 urn:idem:problem:outcome-unknown 1" "$(code f2) $(json f2 type) $(effects fail-1)"
expect_match "fail: the detail names idem keys resolve" "idem keys resolve" "$(json f2 detail)"
"$IDEM" keys resolve fail-1 --store "$DB" --operation 'POST /tickets' --failed >/dev/null 2>&1
expect_eq "fail: resolved by an operator" 0 "$?"
post f3 fail-1 '{"title":"F"}' /tickets?hold=fail-1
expect_eq "fail: after resolve --failed, forwarded again" "201 2" "$(code f3) $(effects fail-1)"
# An operator may also settle it with an answer of their own, replayed.
post f4 fail-2 '{"title":"F"}' /tickets?hold=fail-2
release fail-2
post_past_lease f4b fail-2 '{"title":"F"}' /tickets?hold=fail-2
expect_eq "fail: the second key unknown after its lease" "504 409 urn:idem:problem:outcome-unknown" \
  "$(code f4) $(code f4b) $(json f4b type)"
printf '{"resolved":"by hand"}' > "$TMP/answer.json"
"$IDEM" keys resolve fail-2 --store "$DB" --operation 'POST /tickets' --completed \
  --status 202 --body "$TMP/answer.json" >/dev/null 2>&1
expect_eq "fail: resolved --completed with an HTTP status" 0 "$?"
post f5 fail-2 '{"title":"F"}' /tickets?hold=fail-2
expect_eq "fail: the operator's answer is replayed" '202 true {"resolved":"by hand"} 1' \
  "$(code f5) $(header f5 Idempotent-Replayed) $(body f5) $(effects fail-2)"
# Without an HTTP status, idem keys refuses to settle a gateway's key (it
# would store status 0, which no retry could be answered with).
post f6 fail-3 '{"title":"F"}' /tickets?hold=fail-3
release fail-3
post_past_lease f6b fail-3 '{"title":"F"}' /tickets?hold=fail-3
out=$("$IDEM" keys resolve fail-3 --store "$DB" --operation 'POST /tickets' --completed 2>&1)
expect_eq "fail: resolve --completed without --status: refused" 2 "$?"
expect_match "fail: resolve without --status: says why" "needs --status" "$out"
post f7 fail-3 '{"title":"F"}' /tickets?hold=fail-3
expect_eq "fail: so the key is still unknown" "409 urn:idem:problem:outcome-unknown 1" \
  "$(code f7) $(json f7 type) $(effects fail-3)"
stop_gateway "$GW_PID"

# 5. The gateway killed with SIGKILL while the upstream works; restarted
#    on the same store. No second effect inside the lease; after it, with
#    --on-unknown forward, one more with the same key; with fail, none.
for mode in forward fail; do
  start_gateway "kill-$mode" --upstream "$UP" --store "$DB" --lease 10s --on-unknown $mode --attach-wait 0 || { finish; exit 1; }
  # The upstream holds its answer until released: the kill always comes
  # first, however loaded the machine.
  post "k-$mode" "kill-$mode" '{"title":"K"}' "/tickets?hold=kill-$mode" &
  cpid=$!
  wait_held "kill-$mode" || fail "SIGKILL ($mode): the request never reached the upstream"
  kill -KILL "$GW_PID"
  wait "$GW_PID" 2>/dev/null
  wait $cpid
  expect_eq "SIGKILL ($mode): the client got no answer" "000 1" "$(code "k-$mode") $(effects "kill-$mode")"
  release "kill-$mode"
  start_gateway "kill-$mode-2" --upstream "$UP" --store "$DB" --lease 10s --on-unknown $mode --attach-wait 0 || { finish; exit 1; }
  post "k2-$mode" "kill-$mode" '{"title":"K"}' "/tickets?hold=kill-$mode"
  expect_eq "SIGKILL ($mode): in flight inside the lease" "409 1" "$(code "k2-$mode") $(effects "kill-$mode")"
  post_past_lease "k3-$mode" "kill-$mode" '{"title":"K"}' "/tickets?hold=kill-$mode"
  if [ $mode = forward ]; then
    expect_eq "SIGKILL (forward): after the lease, forwarded once more" "201 2 kill-forward" \
      "$(code "k3-$mode") $(effects "kill-$mode") $(last_key)"
  else
    expect_eq "SIGKILL (fail): after the lease, refused" "409 urn:idem:problem:outcome-unknown 1" \
      "$(code "k3-$mode") $(json "k3-$mode" type) $(effects "kill-$mode")"
  fi
  stop_gateway "$GW_PID"
  expect_eq "SIGKILL ($mode): restarted gateway stops cleanly" 0 "$STOPPED"
done

# 6. An https:// upstream, its certificate trusted with --upstream-cacert.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$TMP/key.pem" -out "$TMP/cert.pem" >/dev/null 2>&1 \
  || fail "openssl could not make a certificate"
plain=$UP
start_upstream tls --tls "$TMP/cert.pem" "$TMP/key.pem" || { finish; exit 1; }
UPS="https://127.0.0.1:$(cat "$TMP/tls.port")"
start_gateway tls --upstream "$UPS" --store "$DB" --upstream-cacert "$TMP/cert.pem" || { finish; exit 1; }
post h1 tls-1 '{"title":"TLS"}'
post h2 tls-1 '{"title":"TLS"}'
UP=$UPS
expect_eq "https upstream: forwarded once, replayed" "201 TLS true 1" \
  "$(code h1) $(json h1 title) $(header h2 Idempotent-Replayed) $(curl -s --cacert "$TMP/cert.pem" "$UP/_counts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["effects"].get("tls-1",0))')"
stop_gateway "$GW_PID"
start_gateway tls-untrusted --upstream "$UPS" --store "$DB" || { finish; exit 1; }
post h3 tls-2 '{"title":"TLS"}'
expect_eq "https upstream, untrusted certificate: 502, nothing sent" "502 urn:idem:problem:upstream-unreachable" "$(code h3) $(json h3 type)"
stop_gateway "$GW_PID"
UP=$plain

finish
