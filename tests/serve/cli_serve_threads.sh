#!/bin/sh
# idem serve's threads (issue 20, part 1): a fixed few plus two per core,
# however many keyed forwards are in flight, and the claims of many fresh
# keys at once share the store's group commit without a thread each. The
# upstream holds every answer until the test releases them, so the count
# is read while all the forwards wait.
IDEM=$1
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

N=96
CORES=$(nproc)
# The fixed few: the main thread, libmicrohttpd's listener and the
# admin's, the upstream loop, the guard's ticker, the lease scheduler and
# the store's checkpointer and writers; and per core two of
# libmicrohttpd's and one fingerprint worker.
MAX=$((10 + 3 * CORES))

threads() { sed -n 's/^Threads:[[:space:]]*//p' "/proc/$GW_PID/status"; }
# How many of the gateway's threads bear NAME (as ps and top show them).
named() {
  n=0
  for t in /proc/"$GW_PID"/task/*/comm; do
    [ "$(cat "$t" 2>/dev/null)" = "$1" ] && n=$((n + 1))
  done
  echo $n
}
# Every thread by name with its count, for a failure to say which.
names() {
  for t in /proc/"$GW_PID"/task/*/comm; do cat "$t" 2>/dev/null; done |
    sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}'
}
held() {
  curl -s "$UP/_held" | python3 -c 'import json,sys; print(json.load(sys.stdin)["held"].get(sys.argv[1], 0))' "$1"
}

start_upstream up || { finish; exit 1; }
start_gateway gw --upstream "$UP" --store "$TMP/gw.db" || { finish; exit 1; }
idle=$(threads)
echo "threads idle: $idle (at most $MAX on $CORES cores)"

# 1. N fresh keys at once, each held by the upstream.
i=0 posts=""
while [ $i -lt $N ]; do
  post "k$i" "key-$i" "{\"title\":\"t$i\"}" "/tickets?hold=crowd" &
  posts="$posts $!"
  i=$((i + 1))
done
wait_eq $N held crowd
expect_eq "all $N forwards reached the upstream and wait there" $N "$(held crowd)"
busy=$(threads)
echo "threads with $N forwards in flight: $busy"
expect_eq "threads with $N in flight: at most $MAX" yes "$([ "$busy" -le $MAX ] && echo yes || echo "no ($busy: $(names))")"
expect_eq "threads idle: at most $MAX" yes "$([ "$idle" -le $MAX ] && echo yes || echo "no ($idle)")"
# Each thread says whose it is: libmicrohttpd's workers are its pool (2 a
# core by default) and no more; the store's threads made on a request's
# behalf are libidem's, not named after the thread that made them.
POOL=$((2 * $(getconf _NPROCESSORS_ONLN))) # the gateway's default --threads
expect_eq "threads named MHD-worker: libmicrohttpd's $POOL" $POOL "$(named MHD-worker)"
expect_eq "the store's group-commit leaders are named" 2 "$(named idem-leader)"
expect_eq "the fingerprint workers, one per core, are named" \
  "$(getconf _NPROCESSORS_ONLN)" "$(named idem-fprint)"
expect_eq "the lease scheduler is named" 1 "$(named idem-leases)"
expect_eq "the upstream loop is named" 1 "$(named idem-upstream)"
release crowd
# shellcheck disable=SC2086 # one PID per word
wait $posts

# 2. Each key acted once and got its own ticket; a replay gets the same.
ok_all=0 ids=""
i=0
while [ $i -lt $N ]; do
  [ "$(code "k$i")" = 201 ] && [ "$(json "k$i" key)" = "key-$i" ] && ok_all=$((ok_all + 1))
  ids="$ids $(json "k$i" ticket_id)"
  i=$((i + 1))
done
expect_eq "all $N answered 201 with their own key" $N $ok_all
expect_eq "$N distinct tickets" $N "$(echo $ids | tr ' ' '\n' | sort -u | wc -l)"
expect_eq "the upstream acted $N times" $N "$(upstream_field requests)"
for i in 0 47 95; do
  post "r$i" "key-$i" "{\"title\":\"t$i\"}" "/tickets?hold=crowd"
  expect_eq "replay $i: 201" 201 "$(code "r$i")"
  expect_eq "replay $i: the first ticket" "$(json "k$i" ticket_id)" "$(json "r$i" ticket_id)"
  expect_eq "replay $i: one effect" 1 "$(effects "key-$i")"
done
# The store's runner threads (libidem's idem-runner, at most 16) are made
# only for the calls its queue cannot take; on a loaded machine, where the
# upstream held the forwards past a third of their lease, a completion can
# meet its lease's renewal and wait on one. They are counted apart.
runners=$(named idem-runner)
expect_eq "threads after: at most $MAX, the store's runners aside" yes "$([ $(($(threads) - runners)) -le $MAX ] && [ "$runners" -le 16 ] && echo yes || echo "no ($(threads): $(names))")"

stop_gateway "$GW_PID"
expect_eq "SIGTERM: exit 0" 0 "$STOPPED"
finish
