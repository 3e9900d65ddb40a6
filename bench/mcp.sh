#!/bin/sh
# bench/mcp.sh -- keyed tools/call round trips per second through `idem mcp`
# against the same calls made directly to the same server.
#
# Usage: sh bench/mcp.sh PATH_TO_IDEM      (make bench runs it; make
#                                           bench-mcp runs only it)
#
# The server is @modelcontextprotocol/server-everything and its echo tool,
# the client a plain JSON-RPC client (bench/mcp_client.mjs), the server from tests/mcp/package-lock.json (installed
# with npm ci into a temporary folder, or taken from the build tree's
# tests/mcp when `make check` installed them there). Each round runs,
# interleaved so that all three see the same machine state, one client
# making one call at a time for BENCH_SECONDS:
#   direct   the client talks to the server itself
#   fresh    through idem mcp, a new key per call (claim, forward, store)
#   replay   through idem mcp, one key for every call (answered from the
#            store; nothing reaches the server)
#   floor    `idem bench --workers 1`: claim + complete on the same kind of
#            store without any proxy or server, the two durable commits a
#            fresh key costs (shown for scale; no target)
#   attach   a keyed call of 2 s to tests/mcp/slow_server.mjs and a retry
#            sent while it runs: the milliseconds between the two answers
#            (target: at most 50)
# The store is SQLite with its default, durable settings (synchronous=FULL)
# in TMPDIR. Then it prints the median of the rounds and the ratios against
# the targets (replay >= 2x direct, fresh >= 0.7x direct). A missed target
# is reported, never a failure; it exits non-zero only when a run failed.
#
# Environment: BENCH_SECONDS (default 3), BENCH_ROUNDS (default 3), TMPDIR.
set -eu
if [ $# -ne 1 ]; then
  echo "usage: sh bench/mcp.sh PATH_TO_IDEM" >&2
  exit 2
fi
IDEM=$1
case $IDEM in /*) ;; *) IDEM=$(pwd)/$IDEM ;; esac
if [ ! -x "$IDEM" ]; then
  echo "bench: $IDEM is not an executable (build it first: make build)" >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
SECS=${BENCH_SECONDS:-3}
ROUNDS=${BENCH_ROUNDS:-3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-mcp.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

for tool in node npm; do
  command -v $tool >/dev/null 2>&1 || {
    echo "bench: $tool is missing (sh scripts/deps.sh bench installs it)" >&2
    exit 2
  }
done
# The npm packages: the build tree's when they match the lockfile, else a
# fresh install.
BUILT=$(dirname "$IDEM")/tests/mcp
if [ -f "$BUILT/node_modules/.idem-installed" ] &&
  cmp -s "$BUILT/package-lock.json" "$HERE/../tests/mcp/package-lock.json"; then
  ln -s "$BUILT/node_modules" "$WORK/node_modules"
else
  echo "bench: npm ci (tests/mcp/package-lock.json)" >&2
  cp "$HERE/../tests/mcp/package.json" "$HERE/../tests/mcp/package-lock.json" "$WORK/"
  (cd "$WORK" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
cp "$HERE/mcp_client.mjs" "$HERE/mcp_attach.mjs" "$HERE/../tests/mcp/slow_server.mjs" "$WORK/"
SERVER=$WORK/node_modules/@modelcontextprotocol/server-everything/dist/index.js
mkdir "$WORK/out"
failed=0

step() {
  name=$1
  shift
  printf '  %-16s' "$name" >&2
  if "$@" >"$WORK/out/$name.json" 2>"$WORK/out/$name.err"; then
    echo "ok" >&2
  else
    failed=1
    echo "FAILED (exit $?)" >&2
    sed 's/^/    /' "$WORK/out/$name.err" "$WORK/out/$name.json" >&2
    rm -f "$WORK/out/$name.json"
  fi
}

echo "idem mcp: $ROUNDS rounds of ${SECS}s per run" >&2
r=1
while [ $r -le "$ROUNDS" ]; do
  echo "round $r" >&2
  step "r$r.direct" node "$WORK/mcp_client.mjs" direct "$SECS" "$SERVER"
  step "r$r.fresh" node "$WORK/mcp_client.mjs" fresh "$SECS" "$SERVER" \
    "$IDEM" "$WORK/r$r.fresh.db"
  step "r$r.replay" node "$WORK/mcp_client.mjs" replay "$SECS" "$SERVER" \
    "$IDEM" "$WORK/r$r.replay.db"
  step "r$r.floor" "$IDEM" bench --store "$WORK/r$r.floor.db" --workers 1 \
    --seconds 1 --json
  step "r$r.attach" node "$WORK/mcp_attach.mjs" "$WORK/slow_server.mjs" \
    "$IDEM" "$WORK/r$r.attach.db"
  r=$((r + 1))
done

python3 - "$WORK/out" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def value(mode, doc):
    return doc['claim_complete_ops_per_s' if mode == 'floor' else 'ops_per_s']
def runs(mode):
    xs = []
    for r in range(1, rounds + 1):
        p = os.path.join(out, 'r%d.%s.json' % (r, mode))
        if os.path.exists(p):
            xs.append(value(mode, json.load(open(p))))
    return xs
MODES = ('direct', 'fresh', 'replay', 'floor')
med = {m: (statistics.median(runs(m)) if runs(m) else None) for m in MODES}
print('idem mcp: keyed tools/call round trips, one client, one call at a time')
print('server-everything echo over stdio; durable SQLite store (synchronous=FULL)')
print('medians of %d rounds (calls/s):' % rounds)
for m in MODES:
    xs = runs(m)
    print('  %-8s %10s   rounds: %s' % (m, '%.0f' % med[m] if med[m] else '-',
          ', '.join('%.0f' % x for x in xs)))
print('%-36s %8s %8s  %s' % ('ratio', 'x', 'target', 'result'))
missed = 0
for label, a, target in (('replay / direct', 'replay', 2.0),
                         ('fresh / direct', 'fresh', 0.7)):
    if med[a] is None or not med['direct']:
        print('%-36s %8s %8s  %s' % (label, '-', '>= %.1f' % target, 'no data'))
        continue
    x = med[a] / med['direct']
    ok = x >= target
    missed += not ok
    print('%-36s %8.2f %8s  %s' % (label, x, '>= %.1f' % target,
                                   'met' if ok else 'MISSED'))
if med['floor'] and med['fresh']:
    print('%-36s %8.2f %8s  %s' % ('fresh / floor (two durable commits)',
                                   med['fresh'] / med['floor'], '-', ''))
    print('%-36s %8.2f %8s  %s' % ('floor / direct', med['floor'] / med['direct'],
                                   '-', 'the best fresh / direct this disk allows'))
att = []
for r in range(1, rounds + 1):
    p = os.path.join(out, 'r%d.attach.json' % r)
    if os.path.exists(p):
        att.append(json.load(open(p))['attach_ms'])
if att:
    x = statistics.median(att)
    ok = x <= 50
    missed += not ok
    print('%-36s %8.1f %8s  %s' % ('attach: retry after the call (ms)', x,
                                   '<= 50', 'met' if ok else 'MISSED'))
    print('  a retry sent during a 2 s call, answered after the call; rounds: %s'
          % ', '.join('%.1f' % v for v in att))
print('targets missed: %d' % missed)
PY
exit $failed
