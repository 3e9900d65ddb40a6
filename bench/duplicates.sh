#!/bin/sh
# bench/duplicates.sh -- duplicate executions: how many intentions of an
# agent act more than once when its connection is cut mid-call and it
# retries as agents on the MCP SDKs do, without idem and through idem mcp.
#
# Usage: sh bench/duplicates.sh PATH_TO_IDEM     (make bench runs it)
#        BENCH_QUICK=1 sh bench/duplicates.sh build/idem   (a short run)
#
# The tool server is bench/dup_server.mjs (the 1.x SDK's McpServer, over
# stdio or Streamable HTTP): create_ticket {intent_id, title, work_ms}
# makes its ticket at once (one line in the server's effects log), then
# takes work_ms to answer. Most calls are quick (DUP_FAST ms); a share
# (DUP_SLOW_SHARE) take DUP_SLOW ms, long enough to be cut mid-call. Every
# effect is counted from that log, never from what the agents were told.
#
# The agents (bench/dup_agent.mjs) are the SDKs' own Client classes: 1.x
# (@modelcontextprotocol/sdk 1.32.2) and 2.x (@modelcontextprotocol/client
# 2.4.0), over stdio and over Streamable HTTP. DUP_AGENTS_STDIO or
# DUP_AGENTS_HTTP agents per cell, each doing its share of the cell's
# intentions one after the other; an intention is one ticket to make, its
# arguments carrying its own id.
#
# The cuts, one kind per client:
#   -http         bench/dup_relay.mjs between the client and the server
#                 (direct) or idem mcp --listen: it destroys every TCP
#                 connection DUP_LIFE ms after it opened (uniform in the
#                 range), as a balancer with a connection lifetime does,
#                 whatever is in flight on it. A call whose stream is cut
#                 gets no answer: neither SDK resumes it (no event ids), so
#                 the agent sees its request timeout.
#   -stdio        each client lives DUP_LIFE ms, then the agent closes it
#                 with the SDK's own close(), as an editor reloading its
#                 servers does: the child's standard input is closed, and
#                 the SDK sends it SIGTERM 2 s later if it has not exited
#                 (SIGKILL 2 s after that; both SDKs). A call still running
#                 2 s after the close dies with the child (idem passes the
#                 SIGTERM on to the server).
#   -stdio-crash  the same lives, but the agent's host dies instead: the
#                 child's pipes close, no signal, and the agent gives up its
#                 call in flight at once (a crashed or killed host whose
#                 successor retries).
# On a timeout or a transport error the agent drops its client, connects
# a new one (a new child over stdio, a new session over HTTP) and sends the
# same call again; on idem's -31902/-31903/-31904 it waits retryAfterMs and
# sends it again (an unknown outcome without retryAfterMs, which only an
# operator settles, is a failure); it gives up after DUP_ATTEMPTS attempts.
# Its request timeout is DUP_TIMEOUT ms (the SDKs' default is 60 s:
# shortened, so that a cut stream costs seconds, not a minute).
#
# The modes (each a cell per client, a new SQLite store and effects log):
#   direct    no idem, no key
#   keys      idem mcp; params._meta.idempotencyKey, a UUID per intention
#   offer     idem mcp --offer-key-argument idempotency_key; the agent
#             passes the argument the listed schema offers, one UUID per
#             intention, as a model told by its description would
#   implicit  idem mcp --implicit-keys DUP_IMPLICIT_WINDOW; no key (skipped,
#             and said so, when this idem has no --implicit-keys)
# idem runs with its defaults (durable SQLite store, --lease 30s,
# --attach-wait 25s, --on-unknown forward), --principal none over HTTP.
#
# It prints a table: mode x client -> intentions, intentions that acted
# more than once and their share, intentions that never acted (of them,
# those whose agent was told it failed), agents told their intention
# failed, the median and p99 time per intention (from its first attempt to
# its last answer); then, per client, the idem modes together against the
# target: 0 intentions acted twice of at least 1,000. Through idem an
# intention that acted twice is shown with its attempts and effects. A
# missed target is reported, not a failure; it exits non-zero only when a
# cell failed to run.
#
# The cells of one client run side by side (DUP_PARALLEL_HTTP at a time
# over HTTP, DUP_PARALLEL_STDIO over stdio, where every client and reload
# starts processes): most of a cell's time is waiting, not CPU.
#
# Environment (defaults in brackets):
#   BENCH_QUICK=1         a short run, to see that it works: 30 intentions
#                         per cell, 8 agents each, slow calls of 500-2000 ms,
#                         lives of 1000-3000 ms, a 4 s timeout, idem
#                         --lease 5s (its figures are not the benchmark's)
#   DUP_INTENTIONS        per cell [1000 / the number of idem modes, up]
#   DUP_AGENTS_STDIO      agents per stdio cell [8]: each client and
#                         reload starts a process pair (0.4 s of CPU)
#   DUP_AGENTS_HTTP       agents per HTTP cell [16]
#   DUP_CLIENTS           [sdk1-stdio sdk2-stdio sdk1-stdio-crash
#                         sdk2-stdio-crash sdk1-http sdk2-http]
#   DUP_MODES             [direct keys offer implicit]
#   DUP_SLOW_SHARE        [0.1]     DUP_SLOW  ms, a range ["1000 4000"]
#   DUP_FAST              ms ["5 50"]
#   DUP_LIFE              a connection's or a stdio client's life, ms
#                         ["2000 6000"]
#   DUP_TIMEOUT           the agent's request timeout, ms [8000]
#   DUP_ATTEMPTS          attempts per intention before it gives up [10]
#   DUP_IMPLICIT_WINDOW   [10m]     DUP_SEED [53]
#   DUP_IDEM_OPTS         more options for idem mcp [none]
#   DUP_PARALLEL_HTTP [4], DUP_PARALLEL_STDIO [4]
#   DUP_KEEP=DIR          keep every cell's files (effects logs, stores,
#                         idem's standard error, each intention's attempts)
#                         in DIR
# About 6 minutes with the defaults on 2 busy cores (most of it the slowest
# agent of each cell: a cut stream costs DUP_TIMEOUT, an unknown outcome
# over stdio one lease); BENCH_QUICK=1 about 2 minutes.
set -eu
. "$(dirname "$0")/idem_arg.sh"
for tool in node npm; do
  command -v $tool >/dev/null 2>&1 || {
    echo "bench: $tool is missing (sh scripts/deps.sh bench installs it)" >&2
    exit 2
  }
done

QUICK=${BENCH_QUICK:-0}
AGENTS_HTTP=${DUP_AGENTS_HTTP:-16}
AGENTS_STDIO=${DUP_AGENTS_STDIO:-8}
[ "$QUICK" != 1 ] || AGENTS_HTTP=${DUP_AGENTS_HTTP:-8}
CLIENTS=${DUP_CLIENTS:-sdk1-stdio sdk2-stdio sdk1-stdio-crash sdk2-stdio-crash sdk1-http sdk2-http}
MODES=${DUP_MODES:-direct keys offer implicit}
SLOW_SHARE=${DUP_SLOW_SHARE:-0.1}
SLOW=${DUP_SLOW:-1000 4000}
FAST=${DUP_FAST:-5 50}
LIFE=${DUP_LIFE:-2000 6000}
TIMEOUT=${DUP_TIMEOUT:-8000}
ATTEMPTS=${DUP_ATTEMPTS:-10}
WINDOW=${DUP_IMPLICIT_WINDOW:-10m}
SEED=${DUP_SEED:-53}
IDEM_OPTS=${DUP_IDEM_OPTS:-}
PAR_HTTP=${DUP_PARALLEL_HTTP:-4}
PAR_STDIO=${DUP_PARALLEL_STDIO:-4}
if [ "$QUICK" = 1 ]; then
  # Shorter waits all round: slow calls, lives, the timeout, and the lease
  # an unknown outcome holds its key for.
  SLOW=${DUP_SLOW:-500 2000}
  LIFE=${DUP_LIFE:-1000 3000}
  TIMEOUT=${DUP_TIMEOUT:-4000}
  IDEM_OPTS=${DUP_IDEM_OPTS:---lease 5s}
fi

# --implicit-keys: only with an idem that has it.
if ! "$IDEM" mcp --help 2>&1 | grep -q -- '--implicit-keys'; then
  case " $MODES " in
    *" implicit "*)
      echo "bench: $IDEM has no --implicit-keys (idem mcp --help): the implicit mode is skipped" >&2
      MODES=$(echo " $MODES " | sed 's/ implicit / /; s/^ *//; s/ *$//') ;;
  esac
fi
n_idem=0
for m in $MODES; do [ "$m" = direct ] || n_idem=$((n_idem + 1)); done
if [ -n "${DUP_INTENTIONS:-}" ]; then
  N=$DUP_INTENTIONS
elif [ "$QUICK" = 1 ]; then
  N=30
elif [ "$n_idem" -gt 0 ]; then
  N=$(( (1000 + n_idem - 1) / n_idem ))
else
  N=334
fi

if [ -n "${DUP_KEEP:-}" ]; then
  WORK=$DUP_KEEP
  mkdir -p "$WORK"
  KEEP=1
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-dup.XXXXXX")
  KEEP=0
fi
cleanup() { [ "$KEEP" = 1 ] || rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# The npm packages: the build tree's when they match the lockfile, else a
# fresh install (as bench/mcp.sh).
BUILT=$(dirname "$IDEM")/tests/mcp
if [ -f "$BUILT/node_modules/.idem-installed" ] &&
  cmp -s "$BUILT/package-lock.json" "$HERE/../tests/mcp/package-lock.json"; then
  ln -sfn "$BUILT/node_modules" "$WORK/node_modules"
elif [ ! -d "$WORK/node_modules" ]; then
  echo "bench: npm ci (tests/mcp/package-lock.json)" >&2
  cp "$HERE/../tests/mcp/package.json" "$HERE/../tests/mcp/package-lock.json" "$WORK/"
  (cd "$WORK" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp "$HERE/dup_agent.mjs" "$HERE/dup_server.mjs" "$HERE/dup_relay.mjs" "$WORK/"
mkdir -p "$WORK/cells"
: >"$WORK/cells.jsonl"

echo "duplicate executions: agents on the MCP SDKs' clients, connections cut mid-call"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg); node $(node --version)"
echo "$N intentions per cell, $AGENTS_STDIO agents over stdio, $AGENTS_HTTP over HTTP; slow share $SLOW_SHARE (${SLOW% *}-${SLOW#* } ms), others ${FAST% *}-${FAST#* } ms;"
echo "life ${LIFE% *}-${LIFE#* } ms (a relay's connection; a stdio client, then the SDK's close() or, -crash, its pipes closed);"
echo "request timeout $TIMEOUT ms (the SDKs' default: 60 s), up to $ATTEMPTS attempts; seed $SEED"
echo "$("$IDEM" --version) mcp${IDEM_OPTS:+ $IDEM_OPTS} (else its defaults); $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')"
echo

# run_cell CLIENT MODE: one cell, its JSON line in out/MODE.CLIENT.json and
# its standard error in out/MODE.CLIENT.err.
run_cell() {
  rc_client=$1 rc_mode=$2
  case $rc_client in
    sdk1-stdio | sdk2-stdio) rc_t=stdio rc_cut=reload ;;
    sdk1-stdio-crash | sdk2-stdio-crash) rc_t=stdio rc_cut=crash ;;
    sdk1-http | sdk2-http) rc_t=http rc_cut=reload ;;
  esac
  rc_agents=$AGENTS_HTTP
  [ "$rc_t" = http ] || rc_agents=$AGENTS_STDIO
  rc_sdk=${rc_client#sdk}
  rc_sdk=${rc_sdk%%-*}
  rc_idem=$IDEM_OPTS
  [ "$rc_mode" != direct ] || rc_idem=
  node "$WORK/dup_agent.mjs" cell --mode "$rc_mode" --sdk "$rc_sdk" \
    --transport "$rc_t" --stdio-cut "$rc_cut" --idem "$IDEM" \
    --idem-opts "$rc_idem" --work "$WORK/cells" --intentions "$N" \
    --agents "$rc_agents" --slow-share "$SLOW_SHARE" --slow "$SLOW" \
    --fast "$FAST" --life "$LIFE" --timeout "$TIMEOUT" \
    --attempts "$ATTEMPTS" --seed "$SEED" --implicit-window "$WINDOW" \
    >"$WORK/out/$rc_mode.$rc_client.json" 2>"$WORK/out/$rc_mode.$rc_client.err"
}

# The cells of one client run side by side, DUP_PARALLEL_HTTP (stdio:
# DUP_PARALLEL_STDIO) at a time: they see the same moments of the machine,
# and most of a cell's time is waiting (slow calls, timeouts, leases), not
# CPU. A stdio cell starts a process pair per client and reload, so fewer
# of those run at once.
mkdir -p "$WORK/out"
failed=0
for client in $CLIENTS; do
  case $client in
    sdk1-stdio | sdk2-stdio | sdk1-stdio-crash | sdk2-stdio-crash) par=$PAR_STDIO ;;
    sdk1-http | sdk2-http) par=$PAR_HTTP ;;
    *) echo "bench: no client $client" >&2; exit 2 ;;
  esac
  set -- $MODES
  while [ $# -gt 0 ]; do
    group=""
    pids=""
    k=0
    while [ $# -gt 0 ] && [ $k -lt "$par" ]; do
      run_cell "$client" "$1" &
      pids="$pids $!"
      group="$group $1"
      k=$((k + 1))
      shift
    done
    t0=$(date +%s)
    codes=""
    for p in $pids; do
      if wait "$p"; then codes="$codes 0"; else codes="$codes 1"; fi
    done
    t1=$(date +%s)
    set -- $codes "$@"
    for mode in $group; do
      code=$1
      shift
      f="$WORK/out/$mode.$client"
      printf '  %-9s %-17s' "$mode" "$client" >&2
      if [ "$code" = 0 ]; then
        cat "$f.json" >>"$WORK/cells.jsonl"
        echo "ok (group of$group: $((t1 - t0)) s)" >&2
        # Through idem, an intention that acted twice: how (its attempts
        # and the effects the server logged).
        sed 's/^/    /' "$f.err" >&2
      else
        failed=1
        echo "FAILED" >&2
        sed 's/^/    /' "$f.err" "$f.json" >&2
      fi
    done
  done
done
echo >&2

node "$WORK/dup_agent.mjs" table "$WORK/cells.jsonl"
[ "$KEEP" = 1 ] && echo "(every cell's files are in $WORK/cells)"
exit $failed
