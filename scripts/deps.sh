#!/bin/sh
# Installs the Debian packages idem needs, only when some are missing.
# Usage: scripts/deps.sh build|check|bench|fuzz
set -eu
want="gcc make cmake pkg-config libjansson-dev libsqlite3-dev libssl-dev libpq-dev"
case "${1:-build}" in
  check) want="$want libcmocka-dev postgresql python3 sqlite3" ;;
  bench) want="$want postgresql postgresql-contrib python3" ;;
  fuzz) want="$want clang libclang-rt-dev" ;;
esac
missing=""
for p in $want; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done
[ -z "$missing" ] && exit 0
echo "deps: installing$missing" >&2
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
