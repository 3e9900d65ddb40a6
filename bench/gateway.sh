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
# and prints requests per second with p50/p99 latency for each, then the
# medians of the rounds and the ratios against their targets: (d) >= 1.0x
# (b) and (c) >= 0.5x (b). A missed target is reported, not a failure; the
# script fails only when a run fails (an answer that is not 2xx).
#
# Environment: BENCH_SECONDS (per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_CONNECTIONS (default 32), BENCH_PG (default 1).
set -eu
if [ $# -ne 1 ]; then
  echo "usage: sh bench/gateway.sh PATH_TO_IDEM" >&2
  exit 2
fi
IDEM=$1
case $IDEM in */*) ;; *) IDEM=./$IDEM ;; esac
IDEM=$(cd "$(dirname "$IDEM")" && pwd)/$(basename "$IDEM")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-32}
BENCH_PG=${BENCH_PG:-1}
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
trap cleanup EXIT INT TERM

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
UP_PORT=$(port)
PX_PORT=$(port)
mkdir -p "$W/nginx"
cat > "$W/nginx.conf" <<EOF
worker_processes 2;
pid $W/nginx.pid;
error_log $W/nginx/error.log warn;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $W/nginx/body;
  proxy_temp_path $W/nginx/proxy;
  fastcgi_temp_path $W/nginx/fastcgi;
  uwsgi_temp_path $W/nginx/uwsgi;
  scgi_temp_path $W/nginx/scgi;
  keepalive_requests 1000000;
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
    location / {
      proxy_pass http://tool;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
"$NGINX" -c "$W/nginx.conf" -p "$W/nginx" 2>"$W/nginx.err" &
PIDS="$PIDS $!"
n=0
until curl -s -o /dev/null "http://127.0.0.1:$UP_PORT/" || [ $n -gt 100 ]; do sleep 0.05; n=$((n + 1)); done

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

# gateway NAME STORE: starts idem serve; sets GW_URL and GW_PID.
gateway() {
  "$IDEM" serve --listen 127.0.0.1:0 --upstream "http://127.0.0.1:$UP_PORT" \
    --store "$2" 2>"$W/$1.err" &
  GW_PID=$!
  n=0
  while ! grep -q 'listening on' "$W/$1.err" && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
  GW_URL=$(sed -n 's/.*listening on \(http:[^,]*\),.*/\1/p' "$W/$1.err")
  [ -n "$GW_URL" ] || { cat "$W/$1.err" >&2; exit 1; }
}

# run NAME URL SCRIPT: one wrk run; appends "rps p50_ms p99_ms" to $W/NAME.
run() {
  out=$(wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s "$3" "$2" 2>&1) || {
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

r=1
while [ $r -le "$ROUNDS" ]; do
  echo "round $r of $ROUNDS ($SECS s per run, $CONNS connections, wrk -t2)"
  run a_upstream "http://127.0.0.1:$UP_PORT/tickets" "$W/post.lua"
  run b_nginx_proxy "http://127.0.0.1:$PX_PORT/tickets" "$W/post.lua"
  gateway sqlite "sqlite:$W/gw-$r.db"
  run c_idem_fresh_sqlite "$GW_URL/tickets" "$W/fresh.lua"
  curl -s -o /dev/null -X POST -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: bench-replayed-key' \
    --data '{"title":"bench","priority":"normal"}' "$GW_URL/tickets"
  run d_idem_replay "$GW_URL/tickets" "$W/replay.lua"
  kill -TERM $GW_PID; wait $GW_PID || true
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
ratio("c_idem_fresh_sqlite", 0.5)
ratio("e_idem_fresh_postgresql", 0.5)
print(f"  a_upstream / b_nginx_proxy = {med['a_upstream'][0] / ref:.2f}x (the upstream alone)")
print("the floor: the store's own work for a fresh key, in-process (idem bench):")
for gw, fl in (("c_idem_fresh_sqlite", "f_floor_sqlite"),
               ("e_idem_fresh_postgresql", "f_floor_postgresql")):
    if gw in med and fl in med:
        print(f"  {fl} / b_nginx_proxy = {med[fl][0] / ref:.2f}x: the most any "
              f"gateway on this store reaches here")
        print(f"  {gw} / {fl} = {med[gw][0] / med[fl][0]:.2f}x")
if "fsync_per_s" in med:
    print(f"  fsync rate of the SQLite store's disk: {med['fsync_per_s'][0]:.0f}/s")
EOF
