#!/bin/sh
# The kill -9 campaign on one store (see chaos.c for what it does and
# checks). Usage:
#   chaos.sh lib|run sqlite|postgresql TRIALS CHAOS_PROGRAM IDEM_PROGRAM
# SQLite: a store file in a temporary folder. PostgreSQL: a server of the
# campaign's own (scripts/pg.sh, in a folder of its own, so that restarting
# it with `pg_ctl restart -m immediate` disturbs no other test); without
# PostgreSQL the campaign fails, never skips. CHAOS_SEED fixes the seed
# (printed by every run, so that a failing run can be repeated);
# CHAOS_RESTART_EVERY how many trials between restarts (default 10). A run
# with a violation keeps its folder and says where it is. CHAOS_SABOTAGE=1
# runs callers that break the rules and passes only when the checker
# reports violations.
set -eu
MODE=$1
STORE=$2
TRIALS=$3
CHAOS=$4
IDEM=$5
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SEED=${CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
TMP=$(mktemp -d /tmp/idem-chaos.XXXXXX)
keep=0
cleanup() {
  [ "$STORE" = postgresql ] && pg_stop
  if [ $keep = 1 ]; then
    echo "chaos.sh: the files of the failing trials are in $TMP" >&2
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT INT TERM

set -- "$MODE" --trials "$TRIALS" --seed "$SEED" --dir "$TMP" --idem "$IDEM"
case "$STORE" in
  sqlite)
    set -- "$@" --store "sqlite:$TMP/chaos.db"
    ;;
  postgresql)
    . "$ROOT/scripts/pg.sh"
    pg_start >/dev/null
    restart="'$PG_BIN/pg_ctl' -D '$PG_DIR/data' -w -t 60 -m immediate restart"
    if [ "$(id -u)" = 0 ]; then
      restart="su -s /bin/sh $PG_USER -c \"$restart\""
    fi
    set -- "$@" --store "$IDEM_TEST_PG_URL" --pg-restart "$restart" \
      --restart-every "${CHAOS_RESTART_EVERY:-10}"
    ;;
  *)
    echo "chaos.sh: sqlite or postgresql" >&2
    exit 2
    ;;
esac
if [ "${CHAOS_SABOTAGE:-0}" = 1 ]; then
  # The checker's own test: callers that break the rules must be caught.
  out=$("$CHAOS" "$@" --sabotage) && rc=0 || rc=$?
  printf '%s\n' "$out" | tail -1
  if [ $rc = 1 ] && printf '%s\n' "$out" | grep -q "^VIOLATION: " &&
    printf '%s\n' "$out" | tail -1 | grep -Eq "violations [1-9][0-9]*$"; then
    echo "chaos.sh: the checker caught the sabotage"
    exit 0
  fi
  echo "chaos.sh: the sabotage went unnoticed (exit $rc)" >&2
  exit 1
fi
if "$CHAOS" "$@"; then
  exit 0
fi
keep=1
exit 1
