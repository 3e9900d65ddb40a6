#!/bin/sh
# make chaos: the long kill -9 campaign. CHAOS_TRIALS trials (default
# 10000) of each kind: the library on SQLite, the library on PostgreSQL (a
# server of its own, restarted every CHAOS_RESTART_EVERY trials), and idem
# run on SQLite and on PostgreSQL; CHAOS_KINDS="lib-sqlite lib-postgresql
# run-sqlite run-postgresql" picks some. Prints each campaign's summary line; exits 1 when any found a
# violation. The build folder is the first argument (default build).
set -eu
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TRIALS=${CHAOS_TRIALS:-10000}
KINDS=${CHAOS_KINDS:-lib-sqlite lib-postgresql run-sqlite run-postgresql}
cmake --build "$BUILD" --target chaos idem >/dev/null
status=0
for kind in $KINDS; do
  mode=${kind%%-*}
  store=${kind#*-}
  echo "== chaos $mode $store: $TRIALS trials"
  # libpq's notices of sessions ended by a restart or a cut go to stderr.
  if ! nice -n 10 sh "$ROOT/tests/chaos/chaos.sh" "$mode" "$store" "$TRIALS" \
    "$BUILD/tests/chaos/chaos" "$BUILD/idem" 2>"$BUILD/chaos-$kind.log"; then
    status=1
    grep -v "^WARNING\|^FATAL\|^$" "$BUILD/chaos-$kind.log" | tail -20 >&2 || true
  fi
done
exit $status
