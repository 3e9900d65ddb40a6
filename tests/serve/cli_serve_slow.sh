#!/bin/sh
# idem serve with slow and greedy clients (issue 20, part 5): a crowd of
# connections that send their request head a byte at a time must not keep
# others out; a head that does not arrive within --header-timeout closes
# its connection; one client address cannot take every connection. The
# raw-socket work is slow_clients.py's; each check here looks at what the
# clients were answered and what reached the upstream.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"
SLOW="python3 $(dirname "$0")/slow_clients.py"

# requests: how many requests reached the upstream so far.
requests() { upstream_field requests; }
# run NAME SCENARIO ARGS...: slow_clients.py's JSON into $TMP/NAME.b.
run() {
  name=$1 scenario=$2; shift 2
  $SLOW "$scenario" "$GW" "$ADMIN" "$@" >"$TMP/$name.b" 2>"$TMP/$name.py.err" ||
    fail "$name: slow_clients.py failed: $(cat "$TMP/$name.py.err")"
  echo "$name: $(cat "$TMP/$name.b")"
}

start_upstream up || { finish; exit 1; }

# 0. The options, and values that are not.
"$IDEM" serve --help >"$TMP/help.out"
for opt in --header-timeout --max-connections --max-connections-per-client; do
  expect_eq "--help explains $opt" 1 "$(grep -c -- "^  $opt " "$TMP/help.out")"
done
for bad in "--header-timeout 0" "--header-timeout x" "--max-connections 0" \
    "--max-connections-per-client -1"; do
  # shellcheck disable=SC2086 # the option and its value, split on purpose
  "$IDEM" serve --listen 127.0.0.1:0 --upstream "$UP" $bad 2>/dev/null
  expect_eq "$bad: a usage error" 2 $?
done

# 1. 2,000 connections from 127.0.0.2-9 (250 from each: under the default
#    per-client limit) send a head a byte every 3 s. --header-timeout is
#    longer than the test, so they all stay: the gateway must hold them
#    and still answer probes from 127.0.0.1 (their times are printed, for
#    the record, not checked: a loaded machine makes them slower).
#    Both the gateway (by its default --max-connections) and the clients
#    need a descriptor per connection, under the same hard limit: where it
#    is too low for 2,000, fewer, and the figure says so.
N=2000
hard=$(python3 -c 'import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[1])')
if [ "$hard" -ge 0 ] && [ "$hard" -lt 4400 ]; then
  N=$(((hard - 400) / 2))
  echo "crowd: the hard descriptor limit is $hard: $N slow connections, not 2,000"
fi
start_gateway crowd --upstream "$UP" --store "$TMP/crowd.db" \
  --header-timeout 10m || { finish; exit 1; }
before=$(requests)
run crowd crowd $N
expect_eq "crowd: the gateway holds all $N" $N "$(json crowd held | cut -d. -f1)"
expect_eq "crowd: no slow connection refused" 0 "$(json crowd connect_errors)"
expect_eq "crowd: five probes answered 200" '[200, 200, 200, 200, 200]' "$(json crowd probe_status)"
expect_eq "crowd: while all $N are still open" "{\"open\": $N}" "$(json crowd slow_states)"
expect_eq "crowd: probes before the crowd answered 200" '[200, 200, 200, 200, 200]' "$(json crowd idle_status)"
expect_eq "crowd: only the probes reached the upstream" 10 $(($(requests) - before))
echo "crowd: probe latency with $N slow connections (ms): $(json crowd probe_ms) (idle: $(json crowd idle_ms))"
stop_gateway "$GW_PID"
expect_eq "crowd: stopped cleanly" 0 "$STOPPED"

# 2. --header-timeout 2s: a head sent a byte a second is cut off, on a new
#    connection and on a keep-alive one; a whole head is answered, and a
#    keep-alive connection idle for longer than the header timeout (but
#    within the idle timeout) still is. Nothing is logged per connection:
#    the metric counts them.
start_gateway slow --upstream "$UP" --store "$TMP/slow.db" --header-timeout 2s ||
  { finish; exit 1; }
before=$(requests)
lines=$(wc -l <"$TMP/slow.err")
run deadline deadline
expect_eq "header timeout: a slow head is closed" closed "$(json deadline a)"
expect_eq "header timeout: a slow head after an answer is closed" closed "$(json deadline d2)"
expect_eq "header timeout: a whole head is answered" "200 200" "$(json deadline b1) $(json deadline d1)"
expect_eq "header timeout: a keep-alive connection idle past it is served" 200 "$(json deadline b2)"
expect_eq "header timeout: slow heads never reached the upstream" 3 $(($(requests) - before))
expect_eq "header timeout: counted in /metrics" 3 "$(metric idem_gateway_header_timeouts_total)"
expect_eq "header timeout: nothing logged per connection" "$lines" "$(wc -l <"$TMP/slow.err")"
echo "header timeout 2s: closed after (s): a $(json deadline a_after_s), c $(json deadline c_after_s), d2 $(json deadline d2_after_s)"
stop_gateway "$GW_PID"

# 3. --max-connections-per-client 10: the 11th connection from one address
#    is closed unanswered; another address is served; a freed slot is
#    taken again.
start_gateway perclient --upstream "$UP" --store "$TMP/pc.db" \
  --max-connections-per-client 10 || { finish; exit 1; }
before=$(requests)
run perclient perclient 10
expect_eq "per client: ten served" '[200, 200, 200, 200, 200, 200, 200, 200, 200, 200]' \
  "$(json perclient held)"
expect_match "per client: the 11th is closed unanswered" '^(closed|reset)$' "$(json perclient over)"
expect_eq "per client: another address is served" 200 "$(json perclient other)"
expect_eq "per client: a freed slot is served again" 200 "$(json perclient again)"
expect_eq "per client: the refused one never reached the upstream" 12 $(($(requests) - before))
expect_eq "per client: refusals counted" 1 "$(json perclient refused | cut -d. -f1)"
stop_gateway "$GW_PID"

# 4. --max-connections 4: a fifth connection waits (the kernel's listen
#    queue) until one of the four closes, then is served.
start_gateway overall --upstream "$UP" --store "$TMP/ov.db" --max-connections 4 ||
  { finish; exit 1; }
before=$(requests)
run overall overall 4
expect_eq "overall: four served" '[200, 200, 200, 200]' "$(json overall held)"
expect_eq "overall: the fifth waits while four are open" timeout "$(json overall while_full)"
expect_eq "overall: the fifth is served once one closes" 200 "$(json overall after_close)"
expect_eq "overall: five reached the upstream" 5 $(($(requests) - before))
stop_gateway "$GW_PID"
finish
