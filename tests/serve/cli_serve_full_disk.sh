#!/bin/sh
# idem serve on a real full disk: the store on a small tmpfs, mounted in a
# mount namespace of this test's own (a user namespace too when not root),
# filled with a ballast file. Two gateways share the store, one with the
# default --on-unknown forward, one with --on-unknown fail. Every case
# checks what reached the upstream (its effects), the answers (statuses,
# problem types, Idem-Record, ticket numbers) and the record.
#
# a. The claim does not fit: 503 store-unavailable, nothing forwarded, no
#    record; once there is room the same request is forwarded, once.
# b. The claim fits and the answer's record does not (issue 50, section 5).
#    The answer is passed on with Idem-Record: unknown; store-failed or
#    not-stored; store-failed, as the key's state, which depends on whether
#    the unknown mark that follows the failed completion finds room in the
#    log:
#    b1. it does (the completion's own failed write left the log room: an
#        answer far larger than the disk, with some room left before the
#        request): the key is unknown; every retry, with either
#        --on-unknown, is 409 outcome-unknown until an operator resolves
#        it, during the lease and after it;
#    b2. it does not (the disk filled while the upstream held its answer,
#        with the log ending at the claim): the key stays in progress, its
#        lease no longer renewed. Retries are 409 in-flight during the
#        lease; after it, with --on-unknown fail, 409 outcome-unknown;
#        with forward, 503 while the disk is full and, once there is room,
#        forwarded again: two effects, the second answer and its replays
#        marked Idem-Record: recovered.
#    b3. as b2, settled by an operator inside the lease (idem keys resolve
#        --force): its retries replay the operator's answer; one effect.
# c. With room again the gateways work: a new key acts once, its replay
#    does not; an operator's resolve settles the unknown key of b1.
#
# Every wait is for an event: the upstream holds an answer until the test
# releases it (upstream.py ?hold=NAME), and a lease's end is waited for by
# retrying while the answer is 409 in-flight. (The gateways run with
# --attach-wait 0, so that a retry inside a lease tells the key's state at
# once; one that attaches waits for the lease's end and then gets what a
# retry after it gets: cli_serve_attach.sh.)
#
# Whether a write fits on a full disk depends on the store's log (the -wal
# file): SQLite starts it over from its beginning once a checkpoint has
# copied every frame, and a write then overwrites frames the disk already
# holds. So where a case needs a write to find no room (a, b2, b3), a reader
# holds a read transaction open on the store, so that the log cannot start
# over, and small keyed requests (pad-N) are sent until the log file grows:
# from then on the log ends at the last write, and every write must grow
# the file.
IDEM=$1
if [ "${IDEM_IN_NAMESPACE:-}" != 1 ]; then
  # Run this very script again inside a mount namespace.
  if [ "$(id -u)" = 0 ]; then ns="-m"; else ns="-r -m"; fi
  # shellcheck disable=SC2086
  IDEM_IN_NAMESPACE=1 exec unshare $ns sh "$0" "$IDEM"
fi
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/serve_lib.sh"

small_disk 4m
DB=$SMALL/gw.db
WAL=$DB-wal
# Long enough that the calls made inside a lease are made inside it on a
# busy machine; the test waits for it to end once (b2).
LEASE=10s

# fill: the tmpfs full, to its last page (one ballast file, written until
# the disk refuses). free_room: the ballast gone.
fill() { dd if=/dev/zero of="$SMALL/ballast" bs=4k 2>/dev/null; }
free_room() { rm -f "$SMALL/ballast"; }
room() { df -k "$SMALL" | awk 'NR == 2 {print $4}'; }
# The reader: a read transaction on the store, held until the reader is
# stopped.
start_reader() {
  rm -f "$TMP/reader.ready"
  python3 -c '
import signal, sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN")
c.execute("SELECT count(*) FROM sqlite_master").fetchone()
open(sys.argv[2], "w").write("reading\n")
while True:
    signal.pause()' "$DB" "$TMP/reader.ready" &
  READER=$!
  PIDS="$PIDS $READER"
  wait_for "$TMP/reader.ready"
}
stop_reader() {
  kill -TERM "$READER"
  wait "$READER" 2>/dev/null
}
# log_at_end: keyed requests until the log file grows (the reader holding
# it); fails when it never does.
PADS=0
log_at_end() {
  size=$(stat -c %s "$WAL")
  n=0
  while [ "$(stat -c %s "$WAL")" = "$size" ] && [ $n -lt 1000 ]; do
    post pad "pad-$PADS" '{"title":"P"}'
    PADS=$((PADS + 1))
    n=$((n + 1))
  done
  [ "$(stat -c %s "$WAL")" != "$size" ]
}
# record KEY: "STATE attempt=N recovered=BOOL" of KEY's record (POST
# /tickets), or "none".
record() {
  "$IDEM" keys show "$1" --store "$DB" --operation 'POST /tickets' --json 2>/dev/null |
    python3 -c 'import json,sys
r = json.load(sys.stdin)
print("%s attempt=%d recovered=%s" % (r["state"], r["attempt"], str(r["recovered"]).lower()))' 2>/dev/null ||
    echo none
}
# via URL NAME KEY BODY [PATH]: post() to the gateway at URL.
via() {
  via_saved=$GW
  GW=$1
  shift
  post "$@"
  via_rc=$?
  GW=$via_saved
  return $via_rc
}
# pf NAME KEY BODY [PATH]: post() to the --on-unknown fail gateway.
pf() { via "$GWF" "$@"; }
# start_maker NAME: another --on-unknown forward gateway on the store, whose
# first store error will be the one of the request it makes (a gateway logs
# at most one store error a second); sets MAKER.
start_maker() {
  gw_saved=$GW admin_saved=$ADMIN pid_saved=$GW_PID
  start_gateway "$1" --upstream "$UP" --store "$DB" --lease "$LEASE" --attach-wait 0 \
    --max-body 2M --max-response 8M --log "$TMP/$1.log" || return 1
  MAKER=$GW MAKERS="${MAKERS:-} $GW_PID"
  GW=$gw_saved ADMIN=$admin_saved GW_PID=$pid_saved
}
# outcome NAME: "STATUS TYPE Idem-Record" of an answer (problem+json type,
# "-" for none).
outcome() {
  t=$(json "$1" type 2>/dev/null)
  case $t in urn:*) ;; *) t=- ;; esac
  r=$(header "$1" Idem-Record)
  echo "$(code "$1") $t ${r:--}"
}
# replayed NAME: outcome NAME, Idempotent-Replayed and the ticket number.
replayed() {
  echo "$(outcome "$1") $(header "$1" Idempotent-Replayed) $(json "$1" ticket_id)"
}
readyz() { curl -s -o /dev/null -w '%{http_code}' "$1/readyz"; }
# store_errors NAME: gateway NAME's "store error" lines.
store_errors() { grep 'store error' "$TMP/$1.err"; }

start_upstream up || { finish; exit 1; }
start_gateway gwf --upstream "$UP" --store "$DB" --lease "$LEASE" --attach-wait 0 \
  --on-unknown fail --max-body 2M --max-response 8M || { finish; exit 1; }
GWF=$GW ADMINF=$ADMIN GWF_PID=$GW_PID
start_gateway gw --upstream "$UP" --store "$DB" --lease "$LEASE" --attach-wait 0 \
  --max-body 2M --max-response 8M --log "$TMP/access.log" || { finish; exit 1; }

post w1 warm-1 '{"title":"W"}'
expect_eq "the store works" "201 - - 1" "$(outcome w1) $(effects warm-1)"

# a. Full before the claim, the log ending at its last write.
start_reader || fail "the reader did not start"
log_at_end || fail "a: the log never grew"
fill
expect_eq "a: the disk is full" 0 "$(room)"
post a1 full-a '{"title":"A"}'
expect_eq "a: full before the claim: 503, not forwarded" \
  "503 urn:idem:problem:store-unavailable - 1 0" \
  "$(outcome a1) $(header a1 Retry-After) $(effects full-a)"
expect_eq "a: no record" none "$(record full-a)"
expect_match "a: logged with the reason" "store error \(claim\): IDEM_EIO: .*full" \
  "$(store_errors gw)"
free_room
post a2 full-a '{"title":"A"}'
expect_eq "a: room again: the same request is forwarded once" "201 - - 1" \
  "$(outcome a2) $(effects full-a)"
post a3 full-a '{"title":"A"}'
expect_eq "a: its retry replays it" "201 true $(json a2 ticket_id) 1" \
  "$(code a3) $(header a3 Idempotent-Replayed) $(json a3 ticket_id) $(effects full-a)"

# b1. The claim fits, the answer's record cannot (5 MB on a 4 MB disk); the
#     completion's failed write leaves the log the room that the unknown
#     mark needs.
start_maker gb1 || { finish; exit 1; }
fill
truncate -s -256K "$SMALL/ballast"
via "$MAKER" b1 full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
expect_eq "b1: the answer passed on, said not stored" \
  "201 - unknown; store-failed 5000000 1" \
  "$(outcome b1) $(wc -c < "$TMP/b1.b") $(effects full-b1)"
expect_match "b1: logged: the key is marked unknown" \
  "store error \(record\): IDEM_EIO: .*key 'full-b1'.*full.*; the key is marked unknown" \
  "$(store_errors gb1)"
expect_match "b1: the access log's note" '"outcome":"proceed","status":201,.*"note":"unknown; store-failed"' \
  "$(cat "$TMP/gb1.log")"
expect_eq "b1: the record is unknown" "unknown attempt=1 recovered=false" "$(record full-b1)"
post b1d full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
pf b1f full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
expect_eq "b1: a retry, forward and fail alike: 409 outcome-unknown" \
  "409 urn:idem:problem:outcome-unknown - 409 urn:idem:problem:outcome-unknown - 1" \
  "$(outcome b1d) $(outcome b1f) $(effects full-b1)"
free_room

# b2. The claim fits; then the disk fills while the upstream holds its
#     answer, and the log ends at the claim's frames: neither the
#     completion nor the unknown mark finds room.
start_maker gb2 || { finish; exit 1; }
log_at_end || fail "b2: the log never grew"
via "$MAKER" b2 full-b2 '{"title":"B2"}' '/tickets?hold=b2' &
b2pid=$!
wait_held b2 || fail "b2: the upstream was never asked"
fill
expect_eq "b2: the disk is full while the upstream holds the answer" 0 "$(room)"
release b2
wait $b2pid
first=$(json b2 ticket_id)
expect_eq "b2: the answer passed on, said not stored" \
  "201 - not-stored; store-failed full-b2 1" \
  "$(outcome b2) $(json b2 key) $(effects full-b2)"
expect_match "b2: logged: the unknown mark failed too" \
  "store error \(record\): IDEM_EIO: .*key 'full-b2'.*full.*marking the key unknown failed too: it stays in progress" \
  "$(store_errors gb2)"
expect_match "b2: the access log's note" '"outcome":"proceed","status":201,.*"note":"not-stored; store-failed"' \
  "$(cat "$TMP/gb2.log")"
expect_eq "b2: the record stays in progress" "in_progress attempt=1 recovered=false" \
  "$(record full-b2)"
post b2d full-b2 '{"title":"B2"}' '/tickets?hold=b2'
pf b2f full-b2 '{"title":"B2"}' '/tickets?hold=b2'
expect_eq "b2: during the lease, forward and fail alike: 409 in-flight" \
  "409 urn:idem:problem:in-flight - 409 urn:idem:problem:in-flight - 1" \
  "$(outcome b2d) $(outcome b2f) $(effects full-b2)"
ra=$(header b2d Retry-After)
[ "${ra:-0}" -ge 1 ] && [ "$ra" -le 10 ] && ok || fail "b2: in-flight Retry-After [$ra]"
post_past_lease b2e full-b2 '{"title":"B2"}' '/tickets?hold=b2'
expect_eq "b2: after the lease, disk still full, forward: 503, not forwarded" \
  "503 urn:idem:problem:store-unavailable - 1 1" \
  "$(outcome b2e) $(header b2e Retry-After) $(effects full-b2)"
pf b2g full-b2 '{"title":"B2"}' '/tickets?hold=b2'
expect_eq "b2: after the lease, disk still full, fail: 409 outcome-unknown" \
  "409 urn:idem:problem:outcome-unknown - 1" "$(outcome b2g) $(effects full-b2)"
# b1's key was claimed before b2's: its lease, had it one, is over too.
post b1e full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
pf b1g full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
expect_eq "b1: after the lease, forward and fail alike: still 409 outcome-unknown" \
  "409 urn:idem:problem:outcome-unknown - 409 urn:idem:problem:outcome-unknown - 1" \
  "$(outcome b1e) $(outcome b1g) $(effects full-b1)"
stop_reader
free_room
pf b2h full-b2 '{"title":"B2"}' '/tickets?hold=b2'
expect_eq "b2: room again, fail: still 409 outcome-unknown, nothing written" \
  "409 urn:idem:problem:outcome-unknown - 1 in_progress attempt=1 recovered=false" \
  "$(outcome b2h) $(effects full-b2) $(record full-b2)"
expect_match "b2: an operator finds the key in progress" "full-b2" \
  "$("$IDEM" keys list --store "$DB" --state in_progress 2>&1)"
expect_match "b1: an operator finds the key unknown" "full-b1" \
  "$("$IDEM" keys list --store "$DB" --state unknown 2>&1)"
post b2i full-b2 '{"title":"B2"}' '/tickets?hold=b2'
second=$(json b2i ticket_id)
expect_eq "b2: room again, forward: forwarded again, marked recovered" \
  "201 - recovered 2" "$(outcome b2i) $(effects full-b2)"
[ -n "$second" ] && [ "$second" != "$first" ] && ok ||
  fail "b2: the second effect's ticket [$second] is the first's [$first]"
expect_eq "b2: the record completed by the takeover" "completed attempt=2 recovered=true" \
  "$(record full-b2)"
post b2j full-b2 '{"title":"B2"}' '/tickets?hold=b2'
pf b2k full-b2 '{"title":"B2"}' '/tickets?hold=b2'
expect_eq "b2: its replays, on both gateways" \
  "201 - recovered true $second 201 - recovered true $second 2" \
  "$(replayed b2j) $(replayed b2k) $(effects full-b2)"

# b3. As b2, and an operator settles the key left in progress once there is
#     room, inside its lease (which needs --force): its retries, with
#     either --on-unknown, replay the operator's answer; one effect.
start_reader || fail "b3: the reader did not start"
log_at_end || fail "b3: the log never grew"
post b3 full-b3 '{"title":"B3"}' '/tickets?hold=b3' &
b3pid=$!
wait_held b3 || fail "b3: the upstream was never asked"
fill
release b3
wait $b3pid
expect_eq "b3: the answer passed on, said not stored; the key in progress" \
  "201 - not-stored; store-failed 1 in_progress attempt=1 recovered=false" \
  "$(outcome b3) $(effects full-b3) $(record full-b3)"
stop_reader
free_room
printf '{"resolved":"b3"}' > "$TMP/b3.json"
"$IDEM" keys resolve full-b3 --store "$DB" --completed --status 201 \
  --body "$TMP/b3.json" >/dev/null 2>"$TMP/b3.err"
expect_eq "b3: resolve inside the lease: refused without --force" \
  "1 in_progress" "$? $(record full-b3 | cut -d' ' -f1)"
expect_match "b3: resolve says why" "lease ends in .*force" "$(cat "$TMP/b3.err")"
"$IDEM" keys resolve full-b3 --store "$DB" --completed --status 201 --force \
  --body "$TMP/b3.json" >/dev/null 2>"$TMP/b3.err"
expect_eq "b3: resolve --force" "0 " "$? $(cat "$TMP/b3.err")"
post b3d full-b3 '{"title":"B3"}' '/tickets?hold=b3'
pf b3f full-b3 '{"title":"B3"}' '/tickets?hold=b3'
expect_eq "b3: its retries replay the operator's answer; one effect" \
  '201 true {"resolved":"b3"} 201 true {"resolved":"b3"} 1' \
  "$(code b3d) $(header b3d Idempotent-Replayed) $(body b3d) $(code b3f) $(header b3f Idempotent-Replayed) $(body b3f) $(effects full-b3)"

# c. Room again: the gateways are ready and work; an operator settles b1.
expect_eq "c: both gateways ready" "200 200" "$(readyz "$ADMIN") $(readyz "$ADMINF")"
post c1 room-c '{"title":"C"}'
pf c2 room-c '{"title":"C"}'
expect_eq "c: a new key acts once, its replay does not" \
  "201 - - 201 true $(json c1 ticket_id) 1" \
  "$(outcome c1) $(code c2) $(header c2 Idempotent-Replayed) $(json c2 ticket_id) $(effects room-c)"
printf '{"resolved":"by hand"}' > "$TMP/answer.json"
"$IDEM" keys resolve full-b1 --store "$DB" --completed --status 201 \
  --body "$TMP/answer.json" >/dev/null 2>"$TMP/resolve.err"
expect_eq "c: the operator resolves b1's key" "0 " "$? $(cat "$TMP/resolve.err")"
post c3 full-b1 '{"title":"B1"}' '/tickets?bytes=5000000'
expect_eq "c: b1's retry replays the operator's answer" \
  '201 true {"resolved":"by hand"} 1' \
  "$(code c3) $(header c3 Idempotent-Replayed) $(body c3) $(effects full-b1)"
expect_eq "c: the upstream's effects in all (pad-N apart)" \
  "{'warm-1': 1, 'full-a': 1, 'full-b1': 1, 'full-b2': 2, 'full-b3': 1, 'room-c': 1} $PADS" \
  "$(upstream_field effects | python3 -c 'import json,sys
e = json.load(sys.stdin)
print({k: v for k, v in e.items() if not k.startswith("pad-")},
      sum(v for k, v in e.items() if k.startswith("pad-")))')"

stopped=""
for p in $GW_PID $GWF_PID $MAKERS; do
  stop_gateway "$p"
  stopped="$stopped $STOPPED"
done
expect_eq "the gateways stop cleanly" " 0 0 0 0" "$stopped"
finish
