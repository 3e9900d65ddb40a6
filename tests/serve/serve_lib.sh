# Sourced by the gateway's tests (after lib.sh): a counting upstream
# (upstream.py), gateways on loopback ports the kernel picks, and curl.
HERE_SERVE=$(cd "$(dirname "$0")" && pwd)
PIDS=""
cleanup_serve() {
  for p in $PIDS; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$TMP"
}
trap cleanup_serve EXIT

# start_upstream NAME [--tls CERT KEY]: sets UP (its base URL) and UP_PID.
start_upstream() {
  name=$1; shift
  python3 "$HERE_SERVE/upstream.py" "$TMP/$name.port" "$@" &
  UP_PID=$!
  PIDS="$PIDS $UP_PID"
  wait_for "$TMP/$name.port" || { fail "upstream $name did not start"; return 1; }
  UP="http://127.0.0.1:$(cat "$TMP/$name.port")"
}

# start_gateway NAME ARGS...: idem serve on a free port, its admin listener
# on another; sets GW, ADMIN and GW_PID. The log is $TMP/NAME.err. Without
# a --principal (or --tenant-header) of the test's own, --principal none:
# the counting upstream takes no credential.
start_gateway() {
  name=$1; shift
  case " $* " in
    *" --principal "*|*" --tenant-header "*) ;;
    *) set -- "$@" --principal none ;;
  esac
  : > "$TMP/$name.err"
  "$IDEM" serve --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 "$@" 2>"$TMP/$name.err" &
  GW_PID=$!
  PIDS="$PIDS $GW_PID"
  n=0 # 20 s at most: a loaded machine starts it later, not never
  while ! grep -q 'listening on' "$TMP/$name.err" && [ $n -lt 400 ]; do
    kill -0 $GW_PID 2>/dev/null || break
    sleep 0.05; n=$((n + 1))
  done
  GW=$(sed -n 's/.*listening on \(http:[^,]*\),.*/\1/p' "$TMP/$name.err")
  ADMIN=$(sed -n 's/.*admin on \(http:.*\)$/\1/p' "$TMP/$name.err")
  [ -n "$GW" ] || { fail "gateway $name did not start: $(cat "$TMP/$name.err")"; return 1; }
}

# effects KEY: how many times the upstream acted for KEY.
effects() {
  curl -s "$UP/_counts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["effects"].get(sys.argv[1], 0))' "$1"
}
# upstream_field NAME: a field of the upstream's /_counts.
upstream_field() {
  curl -s "$UP/_counts" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)[sys.argv[1]]))' "$1"
}

# post NAME KEY BODY [PATH] [CURL ARGS...]: POSTs JSON to the gateway (PATH
# default /tickets; KEY - sends no key, '' an empty one); the status into
# $TMP/NAME.code, headers into $TMP/NAME.h, the body into $TMP/NAME.b.
post() {
  name=$1 key=$2 body=$3 path=/tickets; shift 3
  case ${1:-} in /*) path=$1; shift ;; esac
  case $key in
    -) set -- -H 'X-No-Key: 1' "$@" ;;
    '') set -- -H 'Idempotency-Key;' "$@" ;;
    *) set -- -H "Idempotency-Key: $key" "$@" ;;
  esac
  curl -s -o "$TMP/$name.b" -D "$TMP/$name.h" -w '%{http_code}' -X POST \
    -H "Content-Type: ${POST_TYPE:-application/json}" --data-binary "$body" "$@" \
    "$GW$path" >"$TMP/$name.code"
}
code() { cat "$TMP/$1.code"; }
body() { cat "$TMP/$1.b"; }
# header NAME HEADER: one header's value, without the line end.
header() { sed -n "s/^$2: *//Ip" "$TMP/$1.h" | tr -d '\r' | head -1; }
# json NAME FIELD: a field of a JSON body.
json() { python3 -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print(v if not isinstance(v,(dict,list)) else json.dumps(v))' "$TMP/$1.b" "$2"; }
# metric NAME_WITH_LABELS: a value from /metrics.
metric() { curl -s "$ADMIN/metrics" | grep -F "$1 " | grep -v '^#' | awk '{print $NF}'; }

# wait_eq EXPECTED CMD...: runs CMD until it prints EXPECTED (20 s at
# most), so that a loaded machine makes a test slower, not wrong.
wait_eq() {
  want=$1; shift
  n=0
  while [ "$("$@")" != "$want" ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n + 1)); done
  [ "$("$@")" = "$want" ]
}
# state DB KEY: the state of the gateway's record of KEY (POST /tickets).
state() {
  "$IDEM" keys show "$2" --store "$1" --operation 'POST /tickets' --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null
}

# stop_gateway: SIGTERM, and its exit status in $STOPPED.
stop_gateway() {
  kill -TERM "$1"
  wait "$1"
  STOPPED=$?
}

# The test upstream's held answers (upstream.py ?hold=NAME), so that a test
# waits for events instead of times.
# wait_held NAME: waits until a request has acted and holds under NAME.
wait_held() {
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$UP/_held?wait=$1")" = 200 ]
}
# release NAME: the requests held under NAME answer, and later ones do not
# hold.
release() { curl -s -o /dev/null -X POST "$UP/_release?name=$1"; }

# post_past_lease NAME KEY BODY [PATH] [CURL ARGS...]: post(), again while
# the answer is 409 in-flight, so that a test waits for the key's lease to
# end, not for a time (30 s at most: the status is then still 409).
post_past_lease() {
  m=0
  while post "$@" && [ "$(code "$1")" = 409 ] &&
    [ "$(json "$1" type)" = urn:idem:problem:in-flight ] && [ $m -lt 600 ]; do
    sleep 0.05
    m=$((m + 1))
  done
}

# small_disk SIZE: a tmpfs of SIZE (2m, 4m) at $TMP/small, in the mount
# namespace the test re-ran itself in (unshare -m); sets SMALL. The test
# fails, never skips, when it cannot mount one. At exit: the processes
# first, then the tmpfs (lazily: one may still be dying), then the files.
small_disk() {
  SMALL=$TMP/small
  mkdir "$SMALL"
  mount --make-rprivate / 2>/dev/null
  if ! mount -t tmpfs -o size="$1" tmpfs "$SMALL"; then
    fail "cannot mount a small tmpfs (needs root or user namespaces)"
    finish
    exit 1
  fi
  trap 'for p in $PIDS; do kill -KILL "$p" 2>/dev/null; done
    umount -l "$SMALL" 2>/dev/null; rm -rf "$TMP"' EXIT
}

# refused_start ERR ARGS...: idem serve with ARGS, expected to refuse to
# start; waits until it exits or (wrongly) listens, whichever comes first
# (killed then). Its standard error in ERR; returns its exit status.
refused_start() {
  rs_err=$1; shift
  "$IDEM" serve "$@" 2>"$rs_err" &
  rs_pid=$!
  PIDS="$PIDS $rs_pid"
  rs_n=0
  while kill -0 $rs_pid 2>/dev/null && ! grep -q 'listening on' "$rs_err" &&
    [ $rs_n -lt 400 ]; do
    sleep 0.05
    rs_n=$((rs_n + 1))
  done
  grep -q 'listening on' "$rs_err" && kill -KILL $rs_pid
  wait $rs_pid
}
