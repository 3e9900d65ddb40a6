#!/bin/sh
# Two idem serve processes on one PostgreSQL store act as one gateway; a
# store that becomes unreachable makes the gateway answer 503 and forward
# nothing, /readyz say why (while /healthz, liveness, stays 200), and the
# reason reach the log. Start-up names the store without its password.
# Needs IDEM_TEST_PG_URL (scripts/check.sh starts a server); the test
# fails, never skips, without one.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"
. "$(dirname "$0")/../pg_proxy.sh"

if [ -z "${IDEM_TEST_PG_URL:-}" ]; then
  fail "IDEM_TEST_PG_URL is not set: no PostgreSQL server for this test"
  finish
  exit 1
fi
# The store is reached through a proxy that can take the server away.
pg_proxy_start
PIDS="$PIDS $PG_PROXY_PID"
# With a password, which no message may show (the server trusts the
# socket and never asks for it).
STORE=$(printf '%s' "$PG_PROXY_URL" | sed 's|^postgresql://idem@|postgresql://idem:s3cret-pw@|')
# Records stay in the server between runs: this run's tenant is its own.
T="serve-$$-$(date +%s%N)"

start_upstream up || { finish; exit 1; }
start_gateway a --upstream "$UP" --store "$STORE" --tenant-header X-Tenant || { finish; exit 1; }
GW_A=$GW ADMIN_A=$ADMIN PID_A=$GW_PID
start_gateway b --upstream "$UP" --store "$STORE" --tenant-header X-Tenant || { finish; exit 1; }
GW_B=$GW ADMIN_B=$ADMIN PID_B=$GW_PID
expect_match "gateway on PostgreSQL, named without its password" \
  "store postgresql://idem:\*\*\*@/postgres\?host=" "$(cat "$TMP/a.err")"
expect_eq "the password is nowhere in the log" "" "$(grep s3cret "$TMP/a.err")"

# 1. 32 concurrent requests with one key, split between two gateways:
#    one effect. The upstream holds the one it gets until the other 31
#    have attached to it (--attach-wait: the gateway that does not hold the
#    key hears of its end through LISTEN/NOTIFY), and then every one gets
#    its answer: one body, 31 of them marked replayed.
i=0 pids=""
while [ $i -lt 32 ]; do
  if [ $((i % 2)) = 0 ]; then GW=$GW_A; else GW=$GW_B; fi
  post "c$i" pg-conc '{"title":"Race"}' /tickets?hold=pg-conc -H "X-Tenant: $T" &
  pids="$pids $!"
  i=$((i + 1))
done
attached_both() {
  echo $(($(ADMIN=$ADMIN_A metric idem_gateway_attached) + $(ADMIN=$ADMIN_B metric idem_gateway_attached)))
}
wait_held pg-conc || fail "two gateways: nothing reached the upstream"
wait_eq 31 attached_both || fail "two gateways: $(attached_both) attached while one was held"
release pg-conc
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
expect_eq "two gateways: one effect" 1 "$(effects pg-conc)"
expect_eq "two gateways: 32 answered 201, 31 of them replayed" "32 31" "$ok2 $replayed"
expect_eq "two gateways: one distinct body" 1 "$(printf '%s' "$bodies" | sort -u | grep -c .)"
expect_match "two gateways: the body is a ticket" '"ticket_id": [0-9]' "$bodies"
GW=$GW_B post r1 pg-conc '{"title":"Race"}' /tickets?hold=pg-conc -H "X-Tenant: $T"
GW=$GW_A post r2 pg-conc '{"title":"Race"}' /tickets?hold=pg-conc -H "X-Tenant: $T"
expect_eq "two gateways: both replay the one answer" "true true 1" \
  "$(header r1 Idempotent-Replayed) $(header r2 Idempotent-Replayed) $(effects pg-conc)"
expect_eq "two gateways: the same body" "$(body r1)" "$(body r2)"
GW=$GW_B post r3 pg-conc '{"title":"Race"}' /tickets?hold=pg-conc -H "X-Tenant: $T-other"
expect_eq "another tenant header: a record of its own" "201 2" "$(code r3) $(effects pg-conc)"

# 2. The store unreachable: 503 with Retry-After, nothing forwarded,
#    logged with the reason; /readyz says so, /healthz (liveness) not:
#    restarting the gateway would mend nothing. Once the store is back the
#    retry proceeds.
GW=$GW_A ADMIN=$ADMIN_A
down
post s1 pg-down '{"title":"D"}' -H "X-Tenant: $T"
expect_eq "store down: 503" "503 urn:idem:problem:store-unavailable" "$(code s1) $(json s1 type)"
expect_match "store down: Retry-After" '^[0-9]+$' "$(header s1 Retry-After)"
expect_eq "store down: nothing forwarded" 0 "$(effects pg-down)"
expect_eq "store down: not ready" 503 "$(curl -s -o "$TMP/readyz.b" -w '%{http_code}' "$ADMIN/readyz")"
expect_match "store down: readyz says why, problem+json" \
  '"type":"urn:idem:problem:store-unavailable".*IDEM_EUNAVAILABLE' "$(cat "$TMP/readyz.b")"
expect_eq "store down: alive" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/healthz")"
expect_match "store down: logged with the reason" "store error \(claim\): IDEM_EUNAVAILABLE: postgresql" "$(cat "$TMP/a.err")"
g=$(curl -s -o /dev/null -w '%{http_code}' "$GW/tickets/1")
expect_eq "store down: requests without a key still pass" 200 "$g"
up
post s2 pg-down '{"title":"D"}' -H "X-Tenant: $T"
expect_eq "store back: the retry proceeds" "201 1" "$(code s2) $(effects pg-down)"
expect_eq "store back: ready" 200 "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/readyz")"
expect_match "metrics: errors counted" '^[1-9]' "$(metric 'idem_gateway_requests_total{outcome="error"}')"

stop_gateway "$PID_A"
expect_eq "gateway a stops cleanly" 0 "$STOPPED"
stop_gateway "$PID_B"
expect_eq "gateway b stops cleanly" 0 "$STOPPED"
finish
