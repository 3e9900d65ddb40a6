# Sourced: starts and stops a throwaway PostgreSQL cluster in a temporary
# folder, listening on a Unix socket there (and nowhere else). Exports
# IDEM_TEST_PG_URL for the tests. Running as root, the cluster runs as the
# unprivileged "postgres" user (or "nobody"), as PostgreSQL requires.
pg_bindir() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

pg_as() {
  if [ "$(id -u)" = 0 ]; then
    su -s /bin/sh "$PG_USER" -c "$*"
  else
    sh -c "$*"
  fi
}

pg_start() {
  PG_BIN=$(pg_bindir) || { echo "pg.sh: PostgreSQL (initdb) not found" >&2; return 1; }
  PG_DIR=$(mktemp -d /tmp/idem-pg.XXXXXX)
  PG_USER=postgres
  id "$PG_USER" >/dev/null 2>&1 || PG_USER=nobody
  [ "$(id -u)" = 0 ] && chown "$PG_USER" "$PG_DIR"
  chmod 755 "$PG_DIR"
  PG_PORT=${PG_PORT:-54329}
  pg_as "'$PG_BIN/initdb' -D '$PG_DIR/data' -U idem -A trust --no-sync -E UTF8 >'$PG_DIR/initdb.log' 2>&1" \
    || { cat "$PG_DIR/initdb.log" >&2; return 1; }
  pg_as "'$PG_BIN/pg_ctl' -D '$PG_DIR/data' -l '$PG_DIR/server.log' -w -t 60 \
    -o \"-c listen_addresses='' -c unix_socket_directories='$PG_DIR' -p $PG_PORT -c max_connections=200 -c fsync=on\" start" >/dev/null \
    || { cat "$PG_DIR/server.log" >&2; return 1; }
  export PG_BIN PG_DIR PG_PORT PG_USER
  export IDEM_TEST_PG_URL="postgresql://idem@/postgres?host=$PG_DIR&port=$PG_PORT"
  export IDEM_TEST_PG_CTL="$PG_BIN/pg_ctl -D $PG_DIR/data"
  echo "pg.sh: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on $PG_DIR:$PG_PORT"
}

pg_stop() {
  [ -n "${PG_DIR:-}" ] || return 0
  pg_as "'$PG_BIN/pg_ctl' -D '$PG_DIR/data' -m immediate -w stop" >/dev/null 2>&1 || true
  rm -rf "$PG_DIR"
  PG_DIR=""
}
