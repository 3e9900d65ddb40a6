#!/bin/sh
# bench/gateway.sh -- idem serve against nginx, measured side by side with wrk.
#
# Usage: sh bench/gateway.sh PATH_TO_IDEM
#
# One nginx (2 workers) plays two parts: the upstream, answering a fixed
# JSON body to any POST (so the upstream is never the bottleneck), and the
# reference, a plain reverse proxy to that upstream with keep-alive
# connections, which is what any proxy costs. Each round runs, interleaved:
#   (a) wrk -> upstream
#   (b) wrk -> nginx proxy -> upstream
#   (c) wrk -> idem serve -> upstream, a fresh key per request, on the
#       default durable SQLite store (synchronous=FULL, group commit)
#   (d) wrk -> idem serve, one key replayed
#   (e) (c) on PostgreSQL (a throwaway cluster, fsync on; BENCH_PG=0 skips)
#   (f) the floor of (c) and (e): `idem bench` doing in-process only the
#       store's share of a fresh keyed request, a claim and a completion
#       (two durable commits), with as many workers as wrk has connections,
#       on the same disk or server; no HTTP at all. A gateway can approach
#       this figure, never pass it; the fsync rate it reports is the
#       disk's own limit.
#   (g) the gateway floor of (c): bench/gateway_floor (the build tree's
#       bench/gateway_floor, when built) in front of the same upstream on
#       its own store of the same kind: a thread per connection that reads
#       a request whole, claims its key, forwards it, records the answer
#       and writes it back; the least a gateway with this store does, with
#       the HTTP hops that (f) leaves out
#   (h) (d) through a gateway that checks the caller before each keyed
#       request (--principal credential:authorization --replay-check-url
#       /replay-check, a GET the upstream answers 201; TTL 5 s, the
#       default: one check per 5 s for wrk's one credential), wrk sending
#       Authorization: Bearer bench
# and prints requests per second with p50/p99 latency for each, then the
# medians of the rounds and the ratios against their targets: (d) >= 1.0x
# (b), (h) >= 1.0x (b) (and (h) / (d): what the check costs a replay),
# (c) >= 0.5x (b) and (c) >= 0.8x (f) (said to be above the floor
# where (g) misses 0.8x (f) itself and (c) comes within 0.8x of (g)). A missed target is reported, not a failure; the
# script fails only when a run fails (an answer that is not 2xx).
#
# Then the "slow upstream" scenario: tool APIs take seconds, and a gateway
# in front of them must hold thousands of calls in flight as nginx does.
# bench/slow_upstream.py answers each POST after 1 s (GETs at once);
# bench/slow_client.py sends N concurrent POSTs, a connection and a distinct
# key each, and waits for every answer. For each N (1,000 and 8,000), the
# medians of the rounds' wall times: the upstream alone, nginx as a reverse
# proxy to it, and `idem serve --upstream` it (default options, SQLite in
# a temporary folder, a fresh gateway per run); answers that are not 2xx or
# never came, per target. While idem holds the N calls, its peak Threads
# and VmRSS (from /proc/PID/status) and its VmHWM at the end. Last, with
# 1,000 slow calls in flight through each proxy, the latency of quick
# requests on other connections: GETs (passed through to the upstream's
# immediate GET) and, through idem, replays of a key completed before the
# burst. Targets: idem within 1.5x nginx's wall time at N=1,000; no errors;
# threads at most a fixed few plus 2 per core; at most 200 MB RSS at
# N=8,000; probe p99 at most 50 ms. A missed target is reported; the script
# fails, after its tables, when a slow run had errors or ran out of time
# (BENCH_SLOW_TIMEOUT: a stuck gateway fails the run instead of hanging it).
#
# Then the "slowloris" scenario: N slow header senders (default 1,000;
# bench/slowloris.py hold), each a connection that sends a request head 2
# bytes a second, their turns spread over the second, and never finishes
# it, against nginx (a reverse proxy as above) and then idem serve, one
# after the other in the same round. Once a target holds them all (by its
# own count: nginx's stub_status, idem's idem_gateway_connections), a probe
# (bench/slowloris.py probe) sends 1,000 ordinary GETs one after another,
# one every 10 ms, each on a fresh connection, as a client without a pool
# would (the time from connect() to the answer's last byte); both pass
# them through to the upstream. Both are set alike: the same deadline for
# a whole request head (nginx's client_header_timeout, idem's
# --header-timeout), and no limit that would refuse one of the N (see
# slowloris_scenario). Two variants: "held", a deadline longer than a run
# (BENCH_SLOWLORIS_HEADER_TIMEOUT), so that every slow sender is held
# while the probe runs; "cut", a deadline of BENCH_SLOWLORIS_CUT_TIMEOUT
# (2 s), and each sender cut off comes back at once, as slowloris does, so
# that the probe also meets the servers cutting a thousand heads off and
# taking as many connections again, five times in its 10 s. Per run: the probe's p50/p90/p99; then
# per variant the medians of the rounds and idem p99 / nginx p99 (target
# <= 2x). The run fails, after its table, when a target did not hold all
# N (or, held, lost one during the probe) or a probe request failed.
#
# BENCH_ONLY=bigjson, large keyed JSON bodies (issue 52), nothing else:
# bench/bigjson.py writes a JSON array of random integers (fixed seed;
# BENCH_BIGJSON_BYTES, default 900000; mostly ids within 2^53, 15% beyond).
# Per round, a fresh idem serve (SQLite in the bench's folder):
#   cost   one client POSTs those bytes BENCH_BIGJSON_N times (default 30),
#          one after another on a keep-alive connection, a fresh key each
#          (a claim, a forward and a record: never a replay), once as
#          application/json and once as application/octet-stream, through
#          idem serve and through the nginx proxy; per batch the median
#          latency and the server's CPU time per request (the sum of its
#          threads' /proc/PID/task/TID/schedstat run time over the batch;
#          /proc/PID/stat's utime + stime if a thread came or went;
#          nginx's: both workers, which also play the upstream);
#   probe  small keyed POSTs (fresh keys, a fresh connection each, one
#          every 10 ms for BENCH_BIGJSON_PROBE_SECONDS, default 10, at most
#          BENCH_BIGJSON_PROBES, default 1000; late ones catch up for at
#          most as long again) alone, then while
#          BENCH_BIGJSON_HEAVY clients (default 4) send the keyed JSON
#          body back to back with fresh keys: whether heavy bodies hold the
#          gateway's HTTP threads. Once with each heavy request on a fresh
#          connection (Connection: close, as a client without a pool:
#          each lands on whichever HTTP thread is free), once with a
#          keep-alive connection per heavy client (which thread each
#          connection was bound to at connect decides whether one stays
#          free); BENCH_BIGJSON_HEAVY_CONNECTIONS, default "fresh
#          keepalive", picks.
# Then the medians of the rounds, json / octet of CPU and latency (target:
# the gateway's CPU for JSON <= BENCH_BIGJSON_TARGET, 8, times octet's) and
# the probe's p50/p99 with and without the heavy clients. The run fails
# only when an answer is not 2xx (or a replay where a fresh key was sent).
#
# Environment: BENCH_SECONDS (per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_CONNECTIONS (default 32), BENCH_PG (default 1); BENCH_ONLY (fast:
# the wrk scenarios only, slow: the slow upstream only, slowloris: the
# slowloris scenario only; default all three; replaycheck: only (a), (b),
# (d) and (h), at 1 connection (wrk -t1) and at BENCH_CONNECTIONS, with
# the ratios (h) / (a), (h) / (d) and (h) / (b) at each; bigjson: above),
# BENCH_SLOW_N (default "1000 8000"), BENCH_SLOW_DELAY (seconds per POST,
# default 1), BENCH_SLOW_TIMEOUT (seconds per slow run, default 120),
# BENCH_SLOW_PROBE_N (slow calls in flight during the probe, default 1000;
# 0 skips it), BENCH_SLOW_PROBES (requests of each kind, default 200),
# BENCH_SLOW_FIXED_THREADS (the "fixed few" of the threads target: at most
# that many plus 2 per core; default 8); BENCH_SLOWLORIS_N (slow header
# senders, default 1000), BENCH_SLOWLORIS_PROBES (probe requests per
# target and round, default 1000), BENCH_SLOWLORIS_HEADER_TIMEOUT (seconds,
# default 120), BENCH_SLOWLORIS_CUT_TIMEOUT (seconds, default 2),
# BENCH_SLOWLORIS_VARIANTS (default "none held cut"; none: the probe
# alone, no slow sender, the floor each target's own request path sets), BENCH_SLOWLORIS_INTERVAL
# and BENCH_SLOWLORIS_CHUNK (each sender sends CHUNK bytes every INTERVAL
# seconds; default 2 every 1); BENCH_REPLAY_CHECK_TTL ((h)'s
# --replay-check-ttl; default the gateway's, 5s; 0: every replay checked).
set -eu
. "$(dirname "$0")/idem_arg.sh"
ROOT=$(cd "$HERE/.." && pwd)
SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-32}
BENCH_PG=${BENCH_PG:-1}
BENCH_ONLY=${BENCH_ONLY:-}
SLOW_N=${BENCH_SLOW_N:-1000 8000}
SLOW_DELAY=${BENCH_SLOW_DELAY:-1}
SLOW_TIMEOUT=${BENCH_SLOW_TIMEOUT:-120}
PROBE_N=${BENCH_SLOW_PROBE_N:-1000}
PROBES=${BENCH_SLOW_PROBES:-200}
FEW_THREADS=${BENCH_SLOW_FIXED_THREADS:-8}
LORIS_N=${BENCH_SLOWLORIS_N:-1000}
LORIS_PROBES=${BENCH_SLOWLORIS_PROBES:-1000}
LORIS_TIMEOUT=${BENCH_SLOWLORIS_HEADER_TIMEOUT:-120}
LORIS_INTERVAL=${BENCH_SLOWLORIS_INTERVAL:-1}
LORIS_CHUNK=${BENCH_SLOWLORIS_CHUNK:-2}
LORIS_CUT_TIMEOUT=${BENCH_SLOWLORIS_CUT_TIMEOUT:-2}
LORIS_VARIANTS=${BENCH_SLOWLORIS_VARIANTS:-none held cut}
BJ_N=${BENCH_BIGJSON_N:-30}
BJ_BYTES=${BENCH_BIGJSON_BYTES:-900000}
BJ_HEAVY=${BENCH_BIGJSON_HEAVY:-4}
BJ_PROBES=${BENCH_BIGJSON_PROBES:-1000}
BJ_PROBE_SECONDS=${BENCH_BIGJSON_PROBE_SECONDS:-10}
BJ_TARGET=${BENCH_BIGJSON_TARGET:-8}
BJ_HEAVY_CONNECTIONS=${BENCH_BIGJSON_HEAVY_CONNECTIONS:-fresh keepalive}
RCHECK=0 BIGJ=0
case $BENCH_ONLY in
  "") FAST=1 SLOW=1 LORIS=1 ;;
  fast) FAST=1 SLOW=0 LORIS=0 ;;
  slow) FAST=0 SLOW=1 LORIS=0 ;;
  slowloris) FAST=0 SLOW=0 LORIS=1 ;;
  replaycheck) FAST=0 SLOW=0 LORIS=0 RCHECK=1 ;;
  bigjson) FAST=0 SLOW=0 LORIS=0 BIGJ=1 ;;
  *) echo "bench: BENCH_ONLY is fast, slow, slowloris, replaycheck or bigjson," \
       "not $BENCH_ONLY" >&2; exit 2 ;;
esac
[ "$FAST" = 1 ] || BENCH_PG=0
# Every process started here inherits the limit: 8,000 calls in flight are
# 8,000 descriptors at the client and the upstream and twice that in a
# proxy. As servers do, the soft limit goes up to the hard one (about
# 20,000 on these machines).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
NOFILE=$(ulimit -n)
[ "$NOFILE" = unlimited ] && NOFILE=1048576
for t in nginx wrk; do
  command -v $t >/dev/null 2>&1 || [ -x /usr/sbin/$t ] || {
    echo "bench: $t is missing (make bench installs it)" >&2; exit 2; }
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

W=$(mktemp -d /tmp/idem-gwbench.XXXXXX)
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null || true; done
  if [ -n "${PG_DIR:-}" ]; then pg_stop || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
# A signal says so: a run that stops without a word cannot be told from one
# that failed.
trap 'echo "bench: stopped by a signal" >&2; exit 1' INT TERM HUP

# wait_file FILE PID WHAT: waits until FILE exists, as long as PID lives.
wait_file() {
  while [ ! -e "$1" ]; do
    kill -0 "$2" 2>/dev/null || { echo "bench: $3 ended before it was ready" >&2; exit 1; }
    sleep 0.01
  done
}

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP_PORT=$(port)
PX_PORT=$(port)
SLOW_NGINX=""
if [ "$SLOW" = 1 ]; then
  python3 "$HERE/slow_upstream.py" "$W/slow.port" "$SLOW_DELAY" 2>"$W/slow_upstream.err" &
  SLOW_PID=$!
  PIDS="$PIDS $SLOW_PID"
  wait_file "$W/slow.port" $SLOW_PID "the slow upstream"
  SLOW_PORT=$(cat "$W/slow.port")
  SX_PORT=$(port)
  # nginx's own listen backlog is 511: as deep as the kernel allows instead
  # (net.core.somaxconn), or 8,000 connects at once would meet SYNs dropped
  # and retried a second later, a cost of the configuration, not of nginx.
  SOMAXCONN=$(cat /proc/sys/net/core/somaxconn 2>/dev/null || echo 4096)
  SLOW_NGINX="
  upstream slow { server 127.0.0.1:$SLOW_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$SX_PORT backlog=$SOMAXCONN;
    location / {
      proxy_pass http://slow;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
  }"
fi
# The slowloris scenario's "cut" variant: a proxy as the one below, with
# a header timeout shorter than a run.
LORIS_NGINX=""
if [ "$LORIS" = 1 ]; then
  LX_PORT=$(port)
  LORIS_NGINX="
  server {
    listen 127.0.0.1:$LX_PORT;
    client_header_timeout ${LORIS_CUT_TIMEOUT}s;
    location / {
      proxy_pass http://tool;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
    }
    location = /__nginx_status { stub_status; }
  }"
fi
# bigjson's bodies: kept in memory by the proxy (its default 16 KB buffer
# would write each to a temporary file in a folder the workers, another
# user, may not write: 500).
BIGJ_NGINX=""
if [ "$BIGJ" = 1 ]; then
  BIGJ_NGINX="
  client_body_buffer_size $((BJ_BYTES / 1000000 + 2))m;
  client_max_body_size $((BJ_BYTES / 1000000 + 2))m;"
fi
# A worker may get most of 8,000 clients and holds an upstream connection
# for each: as many connections as its descriptors allow.
NGX_CONNS=$((NOFILE > 4196 ? NOFILE - 100 : 4096))
mkdir -p "$W/nginx"
cat > "$W/nginx.conf" <<EOF
worker_processes 2;
worker_rlimit_nofile $NOFILE;
pid $W/nginx.pid;
error_log $W/nginx/error.log warn;
daemon off;
events { worker_connections $NGX_CONNS; }
http {
  access_log off;
  client_body_temp_path $W/nginx/body;
  proxy_temp_path $W/nginx/proxy;
  fastcgi_temp_path $W/nginx/fastcgi;
  uwsgi_temp_path $W/nginx/uwsgi;
  scgi_temp_path $W/nginx/scgi;
  keepalive_requests 1000000;$BIGJ_NGINX
  upstream tool { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server {
    listen 127.0.0.1:$UP_PORT;
    location / {
      default_type application/json;
      return 201 '{"ticket_id":1,"status":"open","title":"bench"}';
    }
  }
  server {
    listen 127.0.0.1:$PX_PORT;
    # The slowloris scenario's deadline for a whole request head in its
    # "held" variant, as idem serve's --header-timeout there (nginx's
    # timer, like idem's, is not restarted by each byte of the head).
    client_header_timeout ${LORIS_TIMEOUT}s;
    location / {
      proxy_pass http://tool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    # How many client connections nginx holds (the slowloris scenario
    # waits until it holds every slow sender).
    location = /__nginx_status { stub_status; }
  }$SLOW_NGINX$LORIS_NGINX
}
EOF
"$NGINX" -c "$W/nginx.conf" -p "$W/nginx" 2>"$W/nginx.err" &
PIDS="$PIDS $!"
n=0
until curl -s -o /dev/null "http://127.0.0.1:$UP_PORT/" || [ $n -gt 100 ]; do sleep 0.05; n=$((n + 1)); done
# (h)'s check: a GET the upstream answers 2xx at once.
CHECK_PATH=/replay-check
case $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$UP_PORT$CHECK_PATH") in
  2??) ;;
  *) echo "bench: the upstream does not answer GET $CHECK_PATH 2xx" >&2; exit 1 ;;
esac

cat > "$W/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"title":"bench","priority":"normal"}'
wrk.headers["Content-Type"] = "application/json"
EOF
cat > "$W/replay.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"title":"bench","priority":"normal"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replayed-key"
EOF
cat > "$W/replay_checked.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"title":"bench","priority":"normal"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replayed-key"
wrk.headers["Authorization"] = "Bearer bench"
EOF
cat > "$W/fresh.lua" <<'EOF'
-- A fresh key per request: the thread's number, a random run id, a counter.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
function init(args)
  math.randomseed(os.time() * 1000 + id)
  run = string.format("%x", math.random(0, 2^30))
  n = 0
  wrk.method = "POST"
  wrk.body = '{"title":"bench","priority":"normal"}'
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  n = n + 1
  wrk.headers["Idempotency-Key"] = string.format("k-%s-%d-%d", run, id, n)
  return wrk.format()
end
EOF

# wait_listening FILE PID: waits until FILE says where PID listens ("listening
# on"), as long as PID lives and for a minute at most.
wait_listening() {
  n=0
  while ! grep -qs 'listening on' "$1" && [ $n -lt 1200 ]; do
    kill -0 "$2" 2>/dev/null || break
    sleep 0.05; n=$((n + 1))
  done
}

# gateway NAME STORE [UPSTREAM_PORT [OPTION...]]: starts idem serve with
# those options (and --principal none unless they name one); sets GW_URL
# and GW_PID. It waits up to a minute for the
# gateway to say where it listens (a busy machine, a store on a slow disk).
gateway() {
  gw_name=$1 gw_store=$2 gw_up=${3:-$UP_PORT}
  shift 2
  [ $# -gt 0 ] && shift
  # The last run's file goes first: the shell may truncate it in the child
  # only after the loop below has read the old "listening on" line, and the
  # clients then went to the last gateway's port (every connection refused).
  rm -f "$W/$gw_name.err"
  gw_principal="--principal none"
  for a in "$@"; do [ "$a" != --principal ] || gw_principal=""; done
  # shellcheck disable=SC2086 # gw_principal: two words or none
  "$IDEM" serve --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$gw_up" \
    --store "$gw_store" $gw_principal "$@" 2>"$W/$gw_name.err" &
  GW_PID=$!
  set -- "$gw_name"
  wait_listening "$W/$1.err" $GW_PID
  GW_URL=$(sed -n 's/.*listening on \(http:[^,]*\),.*/\1/p' "$W/$1.err")
  [ -n "$GW_URL" ] || {
    cat "$W/$1.err" >&2
    st=0; kill -0 $GW_PID 2>/dev/null || wait $GW_PID || st=$?
    echo "bench: idem serve did not start ($1; exit status $st, 0 if still running)" >&2
    exit 1; }
}

# bench/gateway_floor.c needs libidem: the build tree's, built with the
# tests (or cmake --build BUILD --target gateway_floor).
GW_FLOOR=$(dirname "$IDEM")/bench/gateway_floor
if [ ! -x "$GW_FLOOR" ]; then
  [ "$FAST" = 0 ] ||
    echo "bench: no $GW_FLOOR (cmake --build BUILD --target gateway_floor): no gateway floor" >&2
  GW_FLOOR=""
fi

# gateway_floor STORE: starts bench/gateway_floor in front of the upstream;
# sets GF_URL and GF_PID.
gateway_floor() {
  rm -f "$W/gf.err"
  "$GW_FLOOR" "$1" "$UP_PORT" 2>"$W/gf.err" &
  GF_PID=$!
  PIDS="$PIDS $GF_PID"
  wait_listening "$W/gf.err" $GF_PID
  GF_URL=$(sed -n 's/.*listening on \(http:.*\)/\1/p' "$W/gf.err")
  [ -n "$GF_URL" ] || { cat "$W/gf.err" >&2; echo "bench: gateway_floor did not start" >&2; exit 1; }
}

# run NAME URL SCRIPT: one wrk run; appends "rps p50_ms p99_ms" to $W/NAME.
# RUN_CONNS connections (default CONNS) on 2 threads (1 for 1 connection).
run() {
  rc=${RUN_CONNS:-$CONNS}
  out=$(wrk -t"$((rc < 2 ? 1 : 2))" -c"$rc" -d"${SECS}s" --latency -s "$3" "$2" 2>&1) || {
    echo "$out" >&2; echo "bench: wrk failed for $1" >&2; exit 1; }
  if printf '%s' "$out" | grep -q 'Non-2xx'; then
    echo "$out" >&2
    echo "bench: $1 got answers that are not 2xx" >&2
    exit 1
  fi
  printf '%s\n' "$out" | awk -v name="$1" '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0;
                     if (v ~ /s$/) return v * 1000; return v }
    $1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) }
    $1 == "Requests/sec:" { rps = $2 }
    END { printf "%s %.0f %.2f %.2f\n", name, rps, p50, p99 }' | tee -a "$W/results" |
    awk '{ printf "  %-34s %8s req/s   p50 %6s ms   p99 %7s ms\n", $1, $2, $3, $4 }'
}

# floor NAME [--store URL]: idem bench's claim_complete phase, in the same
# results format (its p50/p99 in ms).
floor() {
  name=$1; shift
  "$IDEM" bench --workers "$CONNS" --seconds "$SECS" --json "$@" >"$W/floor.json" 2>"$W/floor.err" || {
    cat "$W/floor.err" >&2; echo "bench: idem bench failed" >&2; exit 1; }
  python3 - "$W/floor.json" "$name" <<'PY' | tee -a "$W/results" |
import json, sys
j = json.load(open(sys.argv[1]))
ph = j["phases"]["claim_complete"]
print("%s %.0f %.2f %.2f" % (sys.argv[2], ph["ops_per_s"], ph["p50_us"] / 1000, ph["p99_us"] / 1000))
print("fsync_per_s %.0f 0 0" % j["fsync_per_s"], file=open(sys.argv[1] + ".fsync", "w"))
PY
    awk '{ printf "  %-34s %8s req/s   p50 %6s ms   p99 %7s ms\n", $1, $2, $3, $4 }'
  [ "$name" = f_floor_sqlite ] && cat "$W/floor.json.fsync" >>"$W/results"
  return 0
}

if [ "$BENCH_PG" = 1 ]; then
  . "$ROOT/scripts/pg.sh"
  PG_PORT=${BENCH_PG_PORT:-54359}
  pg_start >/dev/null
  # fsync as a production server has it (pg.sh's cluster is for tests).
  PG_STORE=$IDEM_TEST_PG_URL
fi

# replay_checked NAME STORE: (h): a gateway that checks its callers
# (--principal credential:authorization --replay-check-url, TTL 5 s), one
# key completed with wrk's Authorization, then replayed by wrk.
replay_checked() {
  gateway checked "$2" "$UP_PORT" --principal credential:authorization \
    --replay-check-url "$CHECK_PATH" \
    ${BENCH_REPLAY_CHECK_TTL:+--replay-check-ttl "$BENCH_REPLAY_CHECK_TTL"}
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: bench-replayed-key' -H 'Authorization: Bearer bench' \
    --data '{"title":"bench","priority":"normal"}' "$GW_URL/tickets"
  run "$1" "$GW_URL/tickets" "$W/replay_checked.lua"
  kill -TERM $GW_PID; wait $GW_PID || true
}

# BENCH_ONLY=replaycheck: (a), (b), (d) and (h) only, at 1 connection and
# at CONNS (the names in $W/results end in .cN).
replaycheck_scenario() {
  r=1
  while [ $r -le "$ROUNDS" ]; do
    for RUN_CONNS in 1 $CONNS; do
      echo "round $r of $ROUNDS ($SECS s per run, $RUN_CONNS connection(s), wrk -t$((RUN_CONNS < 2 ? 1 : 2)))"
      c=c$RUN_CONNS
      run "a_upstream.$c" "http://127.0.0.1:$UP_PORT/tickets" "$W/post.lua"
      run "b_nginx_proxy.$c" "http://127.0.0.1:$PX_PORT/tickets" "$W/post.lua"
      gateway sqlite "sqlite:$W/gw-$r-$c.db"
      curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
        -H 'Idempotency-Key: bench-replayed-key' \
        --data '{"title":"bench","priority":"normal"}' "$GW_URL/tickets"
      run "d_idem_replay.$c" "$GW_URL/tickets" "$W/replay.lua"
      kill -TERM $GW_PID; wait $GW_PID || true
      replay_checked "h_idem_replay_checked.$c" "sqlite:$W/gwc-$r-$c.db"
    done
    r=$((r + 1))
  done
  RUN_CONNS=""
  echo
  echo "medians of $ROUNDS rounds (h: replay check TTL ${BENCH_REPLAY_CHECK_TTL:-5s}):"
  python3 - "$W/results" "$CONNS" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99 = line.split()
    rows.setdefault(name, []).append((float(rps), float(p50), float(p99)))
med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3))
       for k, v in rows.items()}
for k in sorted(med, key=lambda k: (int(k.rsplit(".c", 1)[1]), k)):
    rps, p50, p99 = med[k]
    print(f"  {k:34s} {rps:8.0f} req/s   p50 {p50:6.2f} ms   p99 {p99:7.2f} ms"
          f"   rounds: {', '.join('%.0f' % x[0] for x in rows[k])}")
print("ratios (requests per second, of the medians):")
for c in dict.fromkeys(("1", sys.argv[2])):
    m = {k.rsplit(".c", 1)[0]: v[0] for k, v in med.items() if k.endswith(".c" + c)}
    h, d, a, b = (m.get(n) for n in ("h_idem_replay_checked", "d_idem_replay",
                                     "a_upstream", "b_nginx_proxy"))
    if not (h and d and a and b):
        continue
    print(f"  {c} connection{'' if c == '1' else 's'}:")
    print(f"    h_idem_replay_checked / a_upstream    = {h / a:.2f}x"
          f"   (d_idem_replay / a_upstream = {d / a:.2f}x)")
    print(f"    h_idem_replay_checked / d_idem_replay = {h / d:.2f}x"
          f"   (what the check costs a replay)")
    print(f"    h_idem_replay_checked / b_nginx_proxy = {h / b:.2f}x"
          f"   (d_idem_replay / b_nginx_proxy = {d / b:.2f}x; target >= 1.0x:"
          f" {'meets' if h / b >= 1 else 'MISSES'})")
EOF
}

# bj_cost TARGET BODY URL CONTENT_TYPE --pids PID | --children PID: one
# batch of bigjson_scenario's cost; appends its line to $W/bigjson.
bj_cost() {
  python3 "$HERE/bigjson.py" cost "$3" "$W/big.json" "$4" "$BJ_N" "$5" "$6" \
    --label "{\"kind\": \"cost\", \"target\": \"$1\", \"body\": \"$2\", \"round\": $r}" \
    >>"$W/bigjson" || { echo "bench: the bigjson client failed ($1, $2)" >&2; exit 1; }
}

# bj_probe TARGET URL HEAVY [CONNECTION]: the probe, alone (HEAVY 0) or
# beside HEAVY clients sending the keyed JSON body, each on a fresh
# connection per request or on a keep-alive connection of its own
# (CONNECTION fresh or keepalive); appends its line to $W/bigjson.
bj_probe() {
  bh_out=-
  if [ "$3" -gt 0 ]; then
    rm -f "$W/bj.ready" "$W/bj.stop"
    bh_out=$W/bj-heavy.json
    python3 "$HERE/bigjson.py" heavy "$2" "$W/big.json" "$3" --stop-file "$W/bj.stop" \
      --ready-file "$W/bj.ready" --connection "$4" >"$bh_out" &
    bh=$!
    PIDS="$PIDS $bh"
    wait_file "$W/bj.ready" $bh "the heavy clients"
  fi
  python3 "$HERE/bigjson.py" probe "$2" --n "$BJ_PROBES" --seconds "$BJ_PROBE_SECONDS" \
    --label "{\"kind\": \"probe\", \"target\": \"$1\", \"heavy\": $3, \"connection\": \"${4:-}\", \"round\": $r}" \
    >"$W/bj-probe.json" || { echo "bench: the bigjson probe failed ($1)" >&2; exit 1; }
  if [ "$3" -gt 0 ]; then
    : >"$W/bj.stop"
    wait $bh || { echo "bench: the heavy clients failed ($1)" >&2; exit 1; }
  fi
  python3 "$HERE/bigjson.py" record "$W/bj-probe.json" "$bh_out" "$W/bigjson"
}

# BENCH_ONLY=bigjson (see the header): per round a fresh gateway, the cost
# batches through it and through the nginx proxy (json and octet, which
# goes first changing from round to round), then the probe alone and
# beside the heavy clients.
bigjson_scenario() {
  : >"$W/bigjson"
  python3 "$HERE/bigjson.py" gen "$W/big.json" "$BJ_BYTES"
  bj_opts=""
  [ "$BJ_BYTES" -lt 1000000 ] || bj_opts="--max-body $((BJ_BYTES / 1000000 + 2))M"
  echo "bigjson: a JSON array of integers, $(wc -c <"$W/big.json") bytes; $BJ_N requests" \
    "per batch; probe: up to $BJ_PROBE_SECONDS s, one every 10 ms, alone and beside" \
    "$BJ_HEAVY heavy clients"
  ngx_master=$(cat "$W/nginx.pid")
  r=1
  while [ $r -le "$ROUNDS" ]; do
    echo "bigjson, round $r of $ROUNDS"
    # shellcheck disable=SC2086 # bj_opts: two words or none
    gateway bigj "sqlite:$W/bigj-$r.db" "$UP_PORT" $bj_opts
    PIDS="$PIDS $GW_PID"
    if [ $((r % 2)) = 1 ]; then bj_order="json octet"; else bj_order="octet json"; fi
    for t in idem nginx; do
      for b in $bj_order; do
        ct=application/json
        [ "$b" = octet ] && ct=application/octet-stream
        if [ $t = idem ]; then
          bj_cost idem "$b" "$GW_URL/tickets" "$ct" --pids "$GW_PID"
        else
          bj_cost nginx "$b" "http://127.0.0.1:$PX_PORT/tickets" "$ct" --children "$ngx_master"
        fi
      done
    done
    bj_probe idem "$GW_URL/tickets" 0
    for c in $BJ_HEAVY_CONNECTIONS; do
      bj_probe idem "$GW_URL/tickets" "$BJ_HEAVY" "$c"
    done
    kill -TERM $GW_PID; wait $GW_PID || true
    r=$((r + 1))
  done
  echo
  echo "bigjson ($(wc -c <"$W/big.json") bytes of JSON integers), medians of $ROUNDS rounds:"
  python3 "$HERE/bigjson.py" summary "$W/bigjson" "$BJ_TARGET"
}

# The wrk scenarios, (a) to (h).
fast_scenario() {
  r=1
  while [ $r -le "$ROUNDS" ]; do
    echo "round $r of $ROUNDS ($SECS s per run, $CONNS connections, wrk -t2)"
    run a_upstream "http://127.0.0.1:$UP_PORT/tickets" "$W/post.lua"
    run b_nginx_proxy "http://127.0.0.1:$PX_PORT/tickets" "$W/post.lua"
    gateway sqlite "sqlite:$W/gw-$r.db"
    run c_idem_fresh_sqlite "$GW_URL/tickets" "$W/fresh.lua"
    if [ -n "$GW_FLOOR" ]; then
      gateway_floor "sqlite:$W/gf-$r.db"
      run g_gateway_floor_sqlite "$GF_URL/tickets" "$W/fresh.lua"
      kill -TERM $GF_PID; wait $GF_PID 2>/dev/null || true
    fi
    curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
      -H 'Idempotency-Key: bench-replayed-key' \
      --data '{"title":"bench","priority":"normal"}' "$GW_URL/tickets"
    run d_idem_replay "$GW_URL/tickets" "$W/replay.lua"
    kill -TERM $GW_PID; wait $GW_PID || true
    replay_checked h_idem_replay_checked "sqlite:$W/gwc-$r.db"
    TMPDIR=$W floor f_floor_sqlite
    if [ "$BENCH_PG" = 1 ]; then
      gateway pg "$PG_STORE"
      run e_idem_fresh_postgresql "$GW_URL/tickets" "$W/fresh.lua"
      kill -TERM $GW_PID; wait $GW_PID || true
      floor f_floor_postgresql --store "$PG_STORE"
    fi
    r=$((r + 1))
  done

  echo
  echo "medians of $ROUNDS rounds:"
  python3 - "$W/results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rps, p50, p99 = line.split()
    rows.setdefault(name, []).append((float(rps), float(p50), float(p99)))
med = {k: tuple(statistics.median(x[i] for x in v) for i in range(3))
       for k, v in rows.items()}
for k in sorted(med):
    if k == "fsync_per_s":
        continue
    rps, p50, p99 = med[k]
    print(f"  {k:34s} {rps:8.0f} req/s   p50 {p50:6.2f} ms   p99 {p99:7.2f} ms")
ref = med["b_nginx_proxy"][0]
def ratio(name, target):
    if name not in med:
        return
    r = med[name][0] / ref
    verdict = "meets" if r >= target else "MISSES"
    print(f"  {name} / b_nginx_proxy = {r:.2f}x (target >= {target}x: {verdict})")
print("ratios (requests per second):")
ratio("d_idem_replay", 1.0)
ratio("h_idem_replay_checked", 1.0)
if "h_idem_replay_checked" in med:
    h = med["h_idem_replay_checked"][0]
    print(f"  h_idem_replay_checked / d_idem_replay = {h / med['d_idem_replay'][0]:.2f}x"
          f" (what the replay check costs a replay)")
    print(f"  h_idem_replay_checked / a_upstream = {h / med['a_upstream'][0]:.2f}x"
          f" (d_idem_replay / a_upstream = {med['d_idem_replay'][0] / med['a_upstream'][0]:.2f}x)")
ratio("c_idem_fresh_sqlite", 0.5)
ratio("e_idem_fresh_postgresql", 0.5)
print(f"  a_upstream / b_nginx_proxy = {med['a_upstream'][0] / ref:.2f}x (the upstream alone)")
print("the floor: the store's own work for a fresh key, in-process (idem bench):")
for gw, fl in (("c_idem_fresh_sqlite", "f_floor_sqlite"),
               ("e_idem_fresh_postgresql", "f_floor_postgresql")):
    if gw in med and fl in med:
        print(f"  {fl} / b_nginx_proxy = {med[fl][0] / ref:.2f}x: the store's "
              f"share alone, without HTTP")
        x = med[gw][0] / med[fl][0]
        verdict = "meets" if x >= 0.8 else "MISSES"
        gf = "g_gateway_floor_sqlite" if gw == "c_idem_fresh_sqlite" else None
        if x < 0.8 and gf in med:
            g = med[gf][0]
            if g / med[fl][0] < 0.8 and med[gw][0] / g >= 0.8:
                verdict = f"MISSES, above the floor ({gf} / {fl} {g / med[fl][0]:.2f}x)"
        print(f"  {gw} / {fl} = {x:.2f}x (target >= 0.8x: {verdict})")
if "g_gateway_floor_sqlite" in med and "f_floor_sqlite" in med:
    g = med["g_gateway_floor_sqlite"][0]
    print(f"  g_gateway_floor_sqlite / f_floor_sqlite = {g / med['f_floor_sqlite'][0]:.2f}x: "
          f"the least gateway on this store, against the store alone")
    if "c_idem_fresh_sqlite" in med:
        print(f"  c_idem_fresh_sqlite / g_gateway_floor_sqlite = "
              f"{med['c_idem_fresh_sqlite'][0] / g:.2f}x: idem serve against the least gateway")
if "fsync_per_s" in med:
    print(f"  fsync rate of the SQLite store's disk: {med['fsync_per_s'][0]:.0f}/s")
EOF
}

# slow_run TARGET N URL [CLIENT_OPTION...]: one burst of N slow calls
# through URL; appends "TARGET N JSON" to $W/slow and prints a line. With
# --watch-pid, the gateway's stderr lines are counted too (a gateway out of
# descriptors may flood it).
slow_run() {
  sr_target=$1 sr_n=$2 sr_url=$3
  shift 3
  # The client gives up at SLOW_TIMEOUT by itself; timeout(1) is for a
  # client that would not.
  timeout $((SLOW_TIMEOUT + 30)) python3 "$HERE/slow_client.py" burst "$sr_url" "$sr_n" \
    --timeout "$SLOW_TIMEOUT" --stats-url "$STATS_URL" "$@" >"$W/burst.json" || {
    echo "bench: the slow client failed ($sr_target, N=$sr_n)" >&2; exit 1; }
  errlines=0
  [ "$sr_target" = idem ] && errlines=$(wc -l <"$W/slow.err")
  python3 - "$W/burst.json" "$sr_target" "$errlines" "$W/slow" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["target"], j["stderr_lines"] = sys.argv[2], int(sys.argv[3])
with open(sys.argv[4], "a") as f:
    f.write(json.dumps(j) + "\n")
line = (f"  {j['target']:8s} N={j['n']:<5d} wall {j['wall_s']:7.2f} s"
        f"{' (ran out of time)' if j['timed_out'] else ''}   errors {j['errors']}"
        f"   at the upstream at once: {j.get('upstream_peak')}")
w = j.get("watch")
if w:
    line += (f"   threads {w['threads']}  VmRSS {w['rss_mb']} MB  VmHWM {w['hwm_mb']} MB"
             f"  fds {w['fds']}  stderr {j['stderr_lines']} lines")
    if w["exited"]:
        line += "  EXITED during the run"
print(line)
if j["failures"] or set(j["statuses"]) - {"200", "201"}:
    print(f"           answers {j['statuses']}  failures {j['failures']}")
EOF
  # The next run starts with no call left at the upstream.
  python3 "$HERE/slow_client.py" idle "$STATS_URL" --timeout 60
}

# slow_gateway_stop: ends the slow scenario's gateway, at once after a run
# that ran out of time (a drain would wait for its queue). A gateway that
# had died is reported.
slow_gateway_stop() {
  if grep -q '"timed_out": true' "$W/burst.json"; then
    kill -KILL $GW_PID 2>/dev/null || true
  else
    kill -TERM $GW_PID 2>/dev/null || true
  fi
  st=0
  wait $GW_PID || st=$?
  case $st in
    0 | 137 | 143) ;;
    *) echo "  idem exited with status $st; its stderr ends:" >&2
       tail -5 "$W/slow.err" >&2
       echo "idem exited with status $st" >>"$W/slow-failed" ;;
  esac
}

# slow_probe TARGET BASE_URL REPLAYS: PROBE_N slow calls in flight through
# BASE_URL, then on other connections PROBES GETs and REPLAYS replays of
# slow-probe-key (two keep-alive connections per kind, a request at a time
# each), until the burst is over; appends "TARGET JSON" to $W/probes.
slow_probe() {
  rm -f "$W/sent" "$W/done"
  timeout $((SLOW_TIMEOUT + 30)) python3 "$HERE/slow_client.py" burst "$2/tickets" "$PROBE_N" \
    --timeout "$SLOW_TIMEOUT" --sent-file "$W/sent" --done-file "$W/done" >"$W/burst.json" &
  bp=$!
  wait_file "$W/sent" $bp "the probe's burst"
  python3 "$HERE/slow_client.py" probe "$2/tickets" --gets "$PROBES" --replays "$3" \
    --replay-key slow-probe-key --parallel 2 --stop-file "$W/done" \
    --stats-url "$STATS_URL" >"$W/probe.json" || {
    echo "bench: the probe failed ($1)" >&2; exit 1; }
  wait $bp || { echo "bench: the slow client failed ($1, probe)" >&2; exit 1; }
  python3 - "$W/probe.json" "$W/burst.json" "$1" "$W/probes" <<'EOF'
import json, sys
p, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
p["target"], p["burst"] = sys.argv[3], b
with open(sys.argv[4], "a") as f:
    f.write(json.dumps(p) + "\n")
for kind in ("get", "replay"):
    k = p[kind]
    if k["n"] or k["timeouts"]:
        print(f"  {p['target']:6s} {kind:7s} {k['n']:4d} answered  p50 {k['p50_ms']} ms"
              f"  p99 {k['p99_ms']} ms  max {k['max_ms']} ms  timeouts {k['timeouts']}"
              f"  errors {k['errors'] or 0}")
print(f"         in flight at the upstream {p['inflight_start']} -> {p['inflight_end']},"
      f" probe {p['seconds']} s, burst {b['wall_s']} s, errors {b['errors']}")
EOF
  python3 "$HERE/slow_client.py" idle "$STATS_URL" --timeout 60
}

# The slow upstream scenario.
slow_scenario() {
  STATS_URL=http://127.0.0.1:$SLOW_PORT/__stats
  : >"$W/slow"
  : >"$W/probes"
  echo "slow upstream: $SLOW_DELAY s per POST; descriptors per process: $NOFILE"
  r=1
  while [ $r -le "$ROUNDS" ]; do
    # (gateway() counts with $n: another name here.)
    for sn in $SLOW_N; do
      echo "slow upstream, round $r of $ROUNDS, N=$sn"
      slow_run upstream "$sn" "http://127.0.0.1:$SLOW_PORT/tickets"
      slow_run nginx "$sn" "http://127.0.0.1:$SX_PORT/tickets"
      # A gateway that ran out of time once would again: its later rounds
      # are skipped, not waited for.
      if [ -e "$W/slow-skip-$sn" ]; then
        echo "  idem     N=$sn skipped: an earlier round ran out of time"
        continue
      fi
      gateway slow "sqlite:$W/slow-$r-$sn.db" "$SLOW_PORT"
      slow_run idem "$sn" "$GW_URL/tickets" --watch-pid "$GW_PID"
      grep -q '"timed_out": true' "$W/burst.json" && : >"$W/slow-skip-$sn"
      slow_gateway_stop
    done
    r=$((r + 1))
  done
  if [ "$PROBE_N" -gt 0 ]; then
    echo "latency probe: $PROBES requests of each kind while $PROBE_N slow calls are in flight"
    slow_probe nginx "http://127.0.0.1:$SX_PORT" 0
    gateway slow "sqlite:$W/slow-probe.db" "$SLOW_PORT"
    # The key replayed during the burst, completed before it.
    python3 "$HERE/slow_client.py" seed "$GW_URL/tickets" slow-probe-key
    slow_probe idem "$GW_URL" "$PROBES"
    slow_gateway_stop
  fi

  echo
  echo "slow upstream ($SLOW_DELAY s per POST), medians of $ROUNDS rounds:"
  python3 - "$W/slow" "$W/probes" "$(nproc)" "$W/slow-failed" "$FEW_THREADS" <<'EOF'
import json, os, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
probes = [json.loads(l) for l in open(sys.argv[2])]
cores = int(sys.argv[3])
failed = []
def med(target, n, key="wall_s"):
    v = [r[key] for r in runs if r["target"] == target and r["n"] == n]
    return statistics.median(v) if v else None
def errs(target, n):
    v = [r for r in runs if r["target"] == target and r["n"] == n]
    return sum(r["errors"] for r in v), any(r["timed_out"] for r in v)
def fmt(x, out):
    return "-" if x is None else f"{'>' if out else ''}{x:.2f}"
print("  |     N | upstream s | nginx s | idem s | idem/nginx | nginx errors | idem errors |"
      " idem at the upstream at once |")
print("  | ----: | ---------: | ------: | -----: | ---------: | -----------: | ----------: |"
      " ---------------------------: |")
ns = sorted({r["n"] for r in runs})
for n in ns:
    up, ng, gw = med("upstream", n), med("nginx", n), med("idem", n)
    ne, nt = errs("nginx", n)
    ie, it = errs("idem", n)
    peak = max((r.get("upstream_peak") or 0 for r in runs
                if r["target"] == "idem" and r["n"] == n), default=None)
    ratio = f"{'>' if it else ''}{gw / ng:.2f}x" if gw and ng else "-"
    print(f"  | {n:5d} | {fmt(up, False):>10s} | {fmt(ng, nt):>7s} | {fmt(gw, it):>6s} |"
          f" {ratio:>10s} | {ne:12d} | {ie:11d} | {peak:28d} |")
    for t, e, out in (("nginx", ne, nt), ("idem", ie, it), ("upstream", *errs("upstream", n))):
        if e or out:
            failed.append(f"{t} at N={n}: {e} errors{' (ran out of time)' if out else ''}")
    if n == 1000 and gw and ng:
        print(f"  target at N=1000: idem/nginx <= 1.5x: "
              f"{'meets' if gw / ng <= 1.5 and not it else 'MISSES'}")
few = int(sys.argv[5])
print(f"idem while the N calls were in flight (threads: the most over the rounds; a"
      f" fixed few taken as {few}, {cores} cores: threads target <= {few + 2 * cores};"
      f" memory: each round's peak, the larger of VmRSS and VmHWM, and their median,"
      f" the verdict, as the targets' medians of rounds):")
for n in ns:
    ws = [r["watch"] for r in runs if r["target"] == "idem" and r["n"] == n and "watch" in r]
    if not ws:
        continue
    th = max(w["threads"] for w in ws)
    names = max(ws, key=lambda w: w["threads"]).get("thread_names", {})
    peaks = sorted(max(w["rss_mb"], w["hwm_mb"]) for w in ws)
    peak = peaks[len(peaks) // 2] if len(peaks) % 2 else \
        (peaks[len(peaks) // 2 - 1] + peaks[len(peaks) // 2]) / 2
    fds = max(w["fds"] for w in ws)
    line = (f"  N={n:<5d} threads {th} ({'meets' if th <= few + 2 * cores else 'MISSES'})"
            f"   memory peaks {', '.join(f'{p:.1f}' for p in peaks)} MB, median {peak:.1f} MB")
    if n >= 8000:
        line += f" (target <= 200 MB: {'meets' if peak <= 200 else 'MISSES'})"
    line += f"   descriptors {fds}"
    line += "\n         threads at the peak: " + ", ".join(
        f"{v} {k}" for k, v in sorted(names.items(), key=lambda kv: -kv[1]))
    if any(w["exited"] for w in ws):
        line += "   the gateway EXITED during a run"
        failed.append(f"idem exited during a run at N={n}")
    print(line)
if probes:
    print(f"latency probe, on other connections while {probes[0]['burst']['n']} slow calls"
          f" are in flight (target p99 <= 50 ms):")
    print("  | through | request | answered | p50 ms | p99 ms | max ms | timeouts | errors |"
          " in flight at the upstream, start -> end |")
    print("  | ------- | ------- | -------: | -----: | -----: | -----: | -------: | -----: |"
          " --------------------------------------: |")
    for p in probes:
        for kind in ("get", "replay"):
            k = p[kind]
            if not (k["n"] or k["timeouts"]):
                continue
            e = sum(k["errors"].values())
            print(f"  | {p['target']:7s} | {kind:7s} | {k['n']:8d} | {k['p50_ms']!s:>6s} |"
                  f" {k['p99_ms']!s:>6s} | {k['max_ms']!s:>6s} | {k['timeouts']:8d} | {e:6d} |"
                  f" {str(p['inflight_start']) + ' -> ' + str(p['inflight_end']):>39s} |")
            if p["target"] == "idem":
                ok = k["p99_ms"] is not None and k["p99_ms"] <= 50 and not k["timeouts"]
                print(f"  target: idem {kind} p99 <= 50 ms: {'meets' if ok else 'MISSES'}")
            if e or k["timeouts"]:
                failed.append(f"probe {p['target']} {kind}: {e} errors, {k['timeouts']} timeouts")
        if p["burst"]["errors"]:
            failed.append(f"probe burst through {p['target']}: {p['burst']['errors']} errors")
if os.path.exists(sys.argv[4]):
    failed += open(sys.argv[4]).read().split("\n")[:-1]
if failed:
    print("bench: slow upstream runs that failed: " + "; ".join(failed), file=sys.stderr)
    sys.exit(1)
EOF
}

# loris_run VARIANT TARGET URL HELD_URL: one slowloris run against TARGET:
# the N slow senders, held by URL's server (HELD_URL says how many it
# holds), then the probe; appends a JSON line (variant, target, round, the
# senders' and the probe's figures) to $W/loris. In the variant "cut" the
# senders a server cuts off come back at once.
loris_run() {
  rm -f "$W/loris.ready" "$W/loris.stop"
  if [ "$1" = none ]; then
    # No slow sender: the probe alone, the floor of the target's own
    # request path, measured beside the variants with senders.
    echo '{"n": 0, "held": 0, "connect_errors": 0, "closed_during_hold": 0,
      "answered_during_hold": 0, "reopened": 0}' >"$W/loris-hold.json"
    python3 "$HERE/slowloris.py" probe "$3/probe" --n "$LORIS_PROBES" --every 10 \
      >"$W/loris-probe.json" || { echo "bench: the slowloris probe failed ($1, $2)" >&2; exit 1; }
    loris_record "$1" "$2"
    return
  fi
  lr=0
  [ "$1" = cut ] && lr=1
  # The senders' own bound, should this script die: a run's hold is far
  # shorter.
  python3 "$HERE/slowloris.py" hold "$3/slowloris" "$LORIS_N" --held-url "$4" \
    --interval "$LORIS_INTERVAL" --chunk "$LORIS_CHUNK" --reopen $lr \
    --ready-file "$W/loris.ready" --stop-file "$W/loris.stop" \
    --timeout $((LORIS_TIMEOUT * 2)) >"$W/loris-hold.json" &
  lh=$!
  PIDS="$PIDS $lh"
  wait_file "$W/loris.ready" $lh "the slow senders"
  python3 "$HERE/slowloris.py" probe "$3/probe" --n "$LORIS_PROBES" --every 10 \
    >"$W/loris-probe.json" || { echo "bench: the slowloris probe failed ($1, $2)" >&2; exit 1; }
  : >"$W/loris.stop"
  wait $lh || { echo "bench: the slow senders failed ($1, $2)" >&2; exit 1; }
  loris_record "$1" "$2"
}

# loris_record VARIANT TARGET: the run's line in $W/loris, and printed.
loris_record() {
  python3 - "$1" "$2" "$r" "$W/loris-hold.json" "$W/loris-probe.json" "$W/loris" <<'EOF'
import json, sys
variant, target, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
h, p = json.load(open(sys.argv[4])), json.load(open(sys.argv[5]))
with open(sys.argv[6], "a") as f:
    f.write(json.dumps({"variant": variant, "target": target, "round": rnd,
                        "hold": h, "probe": p}) + "\n")
bad = p["errors"] or set(p["statuses"]) - {"200", "201"}
print(f"  {variant:4s} {target:6s} p50 {p['p50_ms']:6.2f} ms  p90 {p['p90_ms']:6.2f} ms"
      f"  p99 {p['p99_ms']:6.2f} ms  max {p['max_ms']:7.2f} ms   held {h['held']} of {h['n']},"
      f" cut off during the hold {h['closed_during_hold'] + h['answered_during_hold']}"
      f"{' (back at once)' if h['reopened'] else ''}"
      f"{'   answers ' + json.dumps(p['statuses']) + ' errors ' + json.dumps(p['errors']) if bad else ''}")
EOF
}

# loris_gateway TIMEOUT: a fresh idem serve for one slowloris run, with
# --header-timeout TIMEOUT; sets GW_URL, GW_PID and GW_ADMIN.
loris_gateway() {
  gateway loris "sqlite:$W/loris-$r-$1.db" "$UP_PORT" --header-timeout "${1}s" \
    --max-connections-per-client 0 --admin-listen 127.0.0.1:0
  PIDS="$PIDS $GW_PID"
  # The admin listener's line follows the listener's.
  n=0
  while ! grep -qs 'admin on' "$W/loris.err" && [ $n -lt 1200 ]; do
    kill -0 $GW_PID 2>/dev/null || break
    sleep 0.05; n=$((n + 1))
  done
  GW_ADMIN=$(sed -n 's/.*admin on \(http:.*\)/\1/p' "$W/loris.err")
  [ -n "$GW_ADMIN" ] || { cat "$W/loris.err" >&2; echo "bench: no admin listener" >&2; exit 1; }
}

# The slowloris scenario, in two variants, each against nginx, then idem:
#   held  the header timeout (LORIS_TIMEOUT, on both) is longer than a
#         run: every slow sender is held from before the probe to its end;
#   cut   the header timeout is LORIS_CUT_TIMEOUT (on both), shorter than
#         a run, and the senders cut off come back at once, as slowloris
#         itself does: the probe meets the servers cutting heads off, and
#         as many connections opened again (with 2 s, five times during
#         the probe).
# The limits, so that both admit all N senders (every one from 127.0.0.1)
# and the probe beside them: nginx has no per-address limit (limit_conn is
# not set) and worker_connections is NGX_CONNS per worker; idem serve gets
# --max-connections-per-client 0, no per-address limit as nginx (its
# default, nine tenths of --max-connections, admits 1,000 where
# descriptors are plenty, but not under a low descriptor limit), and its
# default --max-connections, what the descriptors allow (printed below). A
# fresh gateway per run, on SQLite in the bench's folder; the probe's GETs
# never reach the store.
slowloris_scenario() {
  : >"$W/loris"
  lt=$((2 * $(nproc)))
  lc=$(((NOFILE - 64 - 2 * lt) / 2))
  [ $lc -gt 16384 ] && lc=16384
  echo "slowloris: $LORIS_N slow header senders, $LORIS_CHUNK bytes every $LORIS_INTERVAL s" \
    "each; a whole head due within $LORIS_TIMEOUT s (held) or $LORIS_CUT_TIMEOUT s (cut)," \
    "nginx client_header_timeout and idem --header-timeout alike; probe: $LORIS_PROBES" \
    "GETs, one every 10 ms, a fresh connection each; idem --max-connections $lc" \
    "(its default here), --max-connections-per-client 0"
  r=1
  while [ $r -le "$ROUNDS" ]; do
    echo "slowloris, round $r of $ROUNDS"
    for v in $LORIS_VARIANTS; do
      if [ "$v" = held ] || [ "$v" = none ]; then
        t=$LORIS_TIMEOUT p=$PX_PORT
      else
        t=$LORIS_CUT_TIMEOUT p=$LX_PORT
      fi
      loris_run "$v" nginx "http://127.0.0.1:$p" "http://127.0.0.1:$p/__nginx_status"
      loris_gateway "$t"
      loris_run "$v" idem "$GW_URL" "$GW_ADMIN/metrics"
      kill -TERM $GW_PID; wait $GW_PID || true
    done
    r=$((r + 1))
  done

  echo
  echo "slowloris ($LORIS_N slow header senders), medians of $ROUNDS rounds:"
  python3 - "$W/loris" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
failed = []
print("  | variant | target | p50 ms | p90 ms | p99 ms | max ms | p99 by round |")
print("  | ------- | ------ | -----: | -----: | -----: | -----: | ------------ |")
ratios = []
for v in dict.fromkeys(x["variant"] for x in runs):
    med = {}
    for t in ("nginx", "idem"):
        rs = [x for x in runs if x["variant"] == v and x["target"] == t]
        if not rs:
            continue
        m = {k: statistics.median(x["probe"][k] for x in rs)
             for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")}
        med[t] = (m, rs)
        print(f"  | {v:7s} | {t:6s} | {m['p50_ms']:6.2f} | {m['p90_ms']:6.2f} |"
              f" {m['p99_ms']:6.2f} | {m['max_ms']:6.2f} |"
              f" {', '.join('%.1f' % x['probe']['p99_ms'] for x in rs)} |")
        for x in rs:
            h, p = x["hold"], x["probe"]
            where = f"{v} {t} round {x['round']}"
            if h["connect_errors"] or (h["held"] or 0) < h["n"]:
                failed.append(f"{where}: held {h['held']} of {h['n']}"
                              f" (connect errors {h['connect_errors']})")
            # Held: none may go. Cut: each comes back; none may be answered.
            if h["answered_during_hold"] or (h["closed_during_hold"] and v == "held"):
                failed.append(f"{where}: {h['closed_during_hold']} slow senders closed and"
                              f" {h['answered_during_hold']} answered during the hold")
            if p["errors"] or set(p["statuses"]) - {"200", "201"}:
                failed.append(f"{where}: probe answers {p['statuses']}, errors {p['errors']}")
    if "nginx" in med and "idem" in med:
        ratio = med["idem"][0]["p99_ms"] / med["nginx"][0]["p99_ms"]
        by_round = [i["probe"]["p99_ms"] / n["probe"]["p99_ms"]
                    for i, n in zip(med["idem"][1], med["nginx"][1])]
        ratios.append(f"  {v}: idem p99 / nginx p99 = {ratio:.2f}x, of the medians (by round:"
                      f" {', '.join('%.2f' % x for x in by_round)}; target <= 2x:"
                      f" {'meets' if ratio <= 2 else 'MISSES'})")
print("\n".join(ratios))
# What the slow senders add to each target's own floor (variant none).
floor = {t: [x["probe"]["p99_ms"] for x in runs if x["variant"] == "none" and x["target"] == t]
         for t in ("nginx", "idem")}
if floor["nginx"] and floor["idem"]:
    for v in [v for v in dict.fromkeys(x["variant"] for x in runs) if v != "none"]:
        adds = []
        for t in ("nginx", "idem"):
            with_ = [x["probe"]["p99_ms"] for x in runs if x["variant"] == v and x["target"] == t]
            if with_:
                adds.append(f"{t} {statistics.median(with_) / statistics.median(floor[t]):.2f}x")
        print(f"  {v}: p99 with the slow senders / without (none): {', '.join(adds)}")
if failed:
    print("bench: slowloris runs that failed: " + "; ".join(failed), file=sys.stderr)
    sys.exit(1)
EOF
}

[ "$FAST" = 1 ] && fast_scenario
[ "$RCHECK" = 1 ] && replaycheck_scenario
[ "$BIGJ" = 1 ] && bigjson_scenario
if [ "$SLOW" = 1 ]; then
  [ "$FAST" = 1 ] && echo
  slow_scenario
fi
if [ "$LORIS" = 1 ]; then
  if [ "$FAST" = 1 ] || [ "$SLOW" = 1 ]; then echo; fi
  slowloris_scenario
fi
# For bench/plot.py's chart (make bench sets BENCH_OUT).
if [ -n "${BENCH_OUT:-}" ] && [ -s "$W/slow" ]; then
  mkdir -p "$BENCH_OUT" && cp "$W/slow" "$BENCH_OUT/gateway_slow.jsonl"
fi
