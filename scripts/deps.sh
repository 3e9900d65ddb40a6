#!/bin/sh
# Installs the Debian packages idem needs, only when some are missing.
# Usage: scripts/deps.sh build|check|bench|fuzz|deb
set -eu
want="gcc make cmake pkg-config libjansson-dev libsqlite3-dev libssl-dev libpq-dev
  libmicrohttpd-dev libcurl4-openssl-dev"
case "${1:-build}" in
  # zlib1g-dev, libc6-dev, binutils: the install tests link programs with
  # `pkg-config --static --libs idem` (SQLite's -lz; a fully static one
  # without PostgreSQL needs libc.a) and read them with readelf.
  # python3-*: the Python binding (bindings/python) is built with cffi and
  # tested with pytest (python3-flask: a Flask app's request context;
  # python3-pydantic: Pydantic models as arguments and results;
  # python3-mypy: mypy --strict on the package and on a typed program;
  # python3-psycopg, python3-sqlalchemy: conn=, the application's own
  # transaction on a psycopg or SQLAlchemy connection), and
  # installed into venvs by tests/python/install.sh.
  # groff-base, man-db, bsdextrautils (col): the manual pages' tests;
  # bash-completion and zsh: the completions'; systemd: systemd-analyze
  # checks the unit (no running systemd needed). chromium: the console's
  # browser test (driven by puppeteer-core from npm), with a font
  # (fonts-liberation: without recommends, chromium has none and its pages
  # crash).
  check) want="$want libcmocka-dev postgresql python3 sqlite3 curl openssl
    zlib1g-dev libc6-dev binutils python3-dev python3-cffi python3-pytest
    python3-flask python3-pydantic python3-venv python3-pip python3-mypy
    python3-psycopg python3-sqlalchemy groff-base man-db bsdextrautils bash-completion zsh systemd chromium
    fonts-liberation" ;;
  bench) want="$want postgresql postgresql-contrib python3 curl nginx wrk
    python3-dev python3-cffi gnuplot-nox" ;;
  fuzz) want="$want clang libclang-rt-dev" ;;
  # make deb: CPack's DEB generator runs dpkg-shlibdeps (dpkg-dev) and
  # file; lintian checks the package.
  deb) want="$want dpkg-dev file gzip lintian" ;;
esac
# The idem mcp tests and bench/mcp.sh run real MCP servers from npm:
# Node.js and npm, from Debian when the machine has neither.
if [ "${1:-build}" = check ] || [ "${1:-build}" = bench ]; then
  command -v node >/dev/null 2>&1 || want="$want nodejs"
  command -v npm >/dev/null 2>&1 || want="$want npm"
fi
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
