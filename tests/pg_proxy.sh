# Sourced by the tests that take a PostgreSQL server away (after lib.sh):
# pg_proxy_start runs tests/pg_proxy.py in front of the server named by
# IDEM_TEST_PG_URL and sets PG_PROXY_URL (a store URL through the proxy)
# and PG_PROXY_PID; down and up make the server unreachable, or reachable
# again, and return once the proxy has acted. Refused connections are
# noted in $TMP/refused.
PG_PROXY_PY="$(dirname "$0")/pg_proxy.py"
[ -f "$PG_PROXY_PY" ] || PG_PROXY_PY="$(dirname "$0")/../pg_proxy.py"

pg_proxy_start() {
  host=$(printf '%s' "$IDEM_TEST_PG_URL" | sed -n 's/.*[?&]host=\([^&]*\).*/\1/p')
  port=$(printf '%s' "$IDEM_TEST_PG_URL" | sed -n 's/.*[?&]port=\([0-9]*\).*/\1/p')
  port=${port:-5432}
  mkdir "$TMP/proxy"
  : > "$TMP/refused"
  python3 "$PG_PROXY_PY" "$TMP/proxy/.s.PGSQL.$port" "$host/.s.PGSQL.$port" "$TMP/down" "$TMP/refused" &
  PG_PROXY_PID=$!
  n=0
  while [ ! -S "$TMP/proxy/.s.PGSQL.$port" ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
  PG_PROXY_URL="postgresql://idem@/postgres?host=$TMP/proxy&port=$port"
}

down() {
  : > "$TMP/down"
  n=0
  while [ ! -e "$TMP/down.cut" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
}
up() {
  rm -f "$TMP/down"
  n=0
  while [ -e "$TMP/down.cut" ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
}
