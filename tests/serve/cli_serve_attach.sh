#!/bin/sh
# idem serve: a retry that arrives while the first request with its key is
# still at the upstream attaches to it (--attach-wait, default 25 s): it
# waits for that request's answer and gets it, marked replayed, instead of
# 409 with the whole lease as Retry-After. Past the bound it is 409 as
# before; a key the first request released is forwarded by the retry
# itself; --attach-wait 0 answers 409 at once. The upstream (upstream.py)
# holds its answers until the test releases them, and the test waits for
# the gateway's idem_gateway_attached gauge, never for a time.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

attached() { metric idem_gateway_attached; }
# bg NAME KEY BODY PATH: post() in the background; its pid in $BG.
bg() { post "$@" & BG=$!; }

start_upstream up || { finish; exit 1; }
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" || { finish; exit 1; }

# 1. One retry while the first request is held at the upstream: it waits,
#    then gets the first answer (same ticket), marked replayed; one effect.
bg a0 k-a '{"title":"a"}' '/tickets?hold=a'
FIRST=$BG
wait_held a || fail "the first request never reached the upstream"
bg a1 k-a '{"title":"a"}' '/tickets?hold=a'
RETRY=$BG
wait_eq 1 attached || fail "the retry did not attach: attached=$(attached)"
expect_eq "attach: still waiting while the first is held" "1 1" \
  "$(effects k-a) $(attached)"
release a
wait "$FIRST" "$RETRY"
expect_eq "attach: the retry gets the first answer, replayed, one effect" \
  "201 201 true $(json a0 ticket_id) 1" \
  "$(code a0) $(code a1) $(header a1 Idempotent-Replayed) $(json a1 ticket_id) $(effects k-a)"
expect_eq "attach: the first answer is not marked replayed" "" \
  "$(header a0 Idempotent-Replayed)"
expect_eq "attach: none waiting after" 0 "$(attached)"

# 2. A hundred retries at once on one held key (more than the library's
#    threads for waiting claims): every one gets the first answer.
bg m0 k-m '{"title":"m"}' '/tickets?hold=m'
FIRST=$BG
wait_held m || fail "the first request of 100 never reached the upstream"
i=1 PIDS_M=
while [ $i -le 100 ]; do
  bg "m$i" k-m '{"title":"m"}' '/tickets?hold=m'
  PIDS_M="$PIDS_M $BG"
  i=$((i + 1))
done
wait_eq 100 attached || fail "retries did not attach: attached=$(attached)"
release m
# shellcheck disable=SC2086
wait "$FIRST" $PIDS_M
n=0 same=0 i=1
while [ $i -le 100 ]; do
  [ "$(code "m$i") $(header "m$i" Idempotent-Replayed)" = "201 true" ] && n=$((n + 1))
  [ "$(json "m$i" ticket_id)" = "$(json m0 ticket_id)" ] && same=$((same + 1))
  i=$((i + 1))
done
case $(json m0 ticket_id) in ''|None|*[!0-9]*) fail "100 attached: the first has no ticket" ;; *) ok ;; esac
expect_eq "100 attached: all replayed with the first ticket, one effect" \
  "201 100 100 1" "$(code m0) $n $same $(effects k-m)"

# 3. The first request's answer releases its key (a 503 with
#    --no-store-5xx): the attached retry is forwarded itself, and gets its
#    own answer: two effects, the second answer the retry's.
start_gateway g5 --upstream "$UP" --store "$TMP/g5.db" --no-store-5xx || { finish; exit 1; }
bg r0 k-r '{"title":"r"}' '/tickets?hold=r&status_first=503'
FIRST=$BG
wait_held r || fail "the released key's first request never reached the upstream"
bg r1 k-r '{"title":"r"}' '/tickets?hold=r&status_first=503'
RETRY=$BG
wait_eq 1 attached || fail "the retry of a released key did not attach"
release r
wait "$FIRST" "$RETRY"
expect_eq "released: the first 503 not stored, the retry forwarded: 201, two effects" \
  "503 201 $(($(json r0 ticket_id) + 1)) 2" \
  "$(code r0) $(code r1) $(json r1 ticket_id) $(effects k-r)"
expect_eq "released: the retry's answer is its own, not a replay" "" \
  "$(header r1 Idempotent-Replayed)"

# 4. Past --attach-wait: 409 in-flight with Retry-After, after waiting at
#    least the bound; once the first answers, a retry replays it.
start_gateway g1 --upstream "$UP" --store "$TMP/g1.db" --attach-wait 1s || { finish; exit 1; }
bg b0 k-b '{"title":"b"}' '/tickets?hold=b'
FIRST=$BG
wait_held b || fail "the bounded case's first request never reached the upstream"
t0=$(date +%s%N)
post b1 k-b '{"title":"b"}' '/tickets?hold=b'
t1=$(date +%s%N)
expect_eq "past --attach-wait: 409 in-flight, one effect" \
  "409 urn:idem:problem:in-flight 1" "$(code b1) $(json b1 type) $(effects k-b)"
expect_eq "past --attach-wait: counted as in_flight in /metrics" 1 \
  "$(metric 'idem_gateway_requests_total{outcome="in_flight"}')"
ra=$(header b1 Retry-After)
[ "${ra:-0}" -ge 1 ] && [ "$ra" -le 30 ] && ok || fail "past --attach-wait: Retry-After [$ra]"
[ $(((t1 - t0) / 1000000)) -ge 900 ] && ok ||
  fail "past --attach-wait: answered after $(((t1 - t0) / 1000000)) ms, before the 1 s bound"
release b
wait "$FIRST"
post b2 k-b '{"title":"b"}' '/tickets?hold=b'
expect_eq "past --attach-wait: a later retry replays the first answer" \
  "201 true $(json b0 ticket_id) 1" \
  "$(code b2) $(header b2 Idempotent-Replayed) $(json b2 ticket_id) $(effects k-b)"

# 5. --attach-wait 0: 409 at once, as before attaching existed.
start_gateway g0 --upstream "$UP" --store "$TMP/g0.db" --attach-wait 0 || { finish; exit 1; }
bg z0 k-z '{"title":"z"}' '/tickets?hold=z'
FIRST=$BG
wait_held z || fail "the no-attach case's first request never reached the upstream"
post z1 k-z '{"title":"z"}' '/tickets?hold=z'
expect_eq "--attach-wait 0: 409 in-flight, never attached, one effect" \
  "409 urn:idem:problem:in-flight 0 1" \
  "$(code z1) $(json z1 type) $(attached) $(effects k-z)"
release z
wait "$FIRST"

# 6. Two gateways on one SQLite store (two processes): a retry to the
#    second attaches to the request the first holds, and gets its answer.
start_gateway p1 --upstream "$UP" --store "$TMP/shared.db" || { finish; exit 1; }
GW1=$GW
start_gateway p2 --upstream "$UP" --store "$TMP/shared.db" || { finish; exit 1; }
GW2=$GW
GW=$GW1
bg s0 k-s '{"title":"s"}' '/tickets?hold=s'
FIRST=$BG
wait_held s || fail "the shared store's first request never reached the upstream"
GW=$GW2
bg s1 k-s '{"title":"s"}' '/tickets?hold=s'
RETRY=$BG
wait_eq 1 attached || fail "the retry on the second gateway did not attach"
release s
wait "$FIRST" "$RETRY"
expect_eq "two gateways: the retry on the other gets the first answer, one effect" \
  "201 201 true $(json s0 ticket_id) 1" \
  "$(code s0) $(code s1) $(header s1 Idempotent-Replayed) $(json s1 ticket_id) $(effects k-s)"

# 7. A first request whose gateway was killed: the retry waits for the
#    dead holder's lease to end (no 409 on the way), then takes the key
#    over and is forwarded again with it, marked recovered: two effects,
#    never silently.
start_gateway k1 --upstream "$UP" --store "$TMP/kill.db" --lease 2s || { finish; exit 1; }
bg d0 k-d '{"title":"d"}' '/tickets?hold=d'
FIRST=$BG
wait_held d || fail "the killed gateway's request never reached the upstream"
kill -KILL "$GW_PID"
wait "$FIRST"
release d
start_gateway k2 --upstream "$UP" --store "$TMP/kill.db" --lease 2s || { finish; exit 1; }
post d1 k-d '{"title":"d"}' '/tickets?hold=d'
expect_eq "dead holder: the retry waited out its lease, forwarded again, marked" \
  "000 201 recovered 2 $(upstream_field total)" \
  "$(code d0) $(code d1) $(header d1 Idem-Record) $(effects k-d) $(json d1 ticket_id)"

finish
