#!/bin/sh
# idem run and the processes of its command: the command runs in a process
# group of its own, which idem run signals as a whole, drains and renews
# while it stops, and kills after --kill-after; when idem run itself is
# killed, the command's group goes too.
IDEM=$1
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/run_lib.sh"
export IDEM_STORE="$TMP/procs.db"

# A command that starts a grandchild which appends "tick" to a file every
# tenth of a second ($1), writes its pid to $2, says "start" in $3 and
# waits. With IGNORE=1 the grandchild ignores SIGTERM.
ticker='if [ "$4" = 1 ]; then trap "" TERM; fi
(while :; do echo tick >> "$1"; sleep 0.1; done) &
echo $! > "$2"; echo start >> "$3"; wait'

# start_ticker NAME IGNORE [OPTION...]: runs idem run with the ticker in the
# background; sets pid (idem run), child and grandchild.
start_ticker() {
  _name=$1 _ign=$2
  shift 2
  : > "$TMP/$_name.ticks"; : > "$TMP/$_name.start"; rm -f "$TMP/$_name.gpid"
  "$IDEM" run --key "$_name" "$@" -- sh -c "$ticker" x "$TMP/$_name.ticks" "$TMP/$_name.gpid" "$TMP/$_name.start" "$_ign" </dev/null 2>"$TMP/$_name.err" &
  pid=$!
  wait_for "$TMP/$_name.start" || fail "$_name: the command did not start"
  wait_for "$TMP/$_name.gpid" || fail "$_name: no grandchild"
  grandchild=$(cat "$TMP/$_name.gpid")
  child=$(pgrep -P $pid -x sh)
  wait_lines "$TMP/$_name.ticks" 2 || fail "$_name: no ticks"
}

# 1. SIGTERM to idem run reaches the whole group at once (well before
#    --kill-after): the grandchild goes too; idem run exits 143 and the key
#    is left unknown, not completed.
start_ticker term 0 --kill-after 20s
kill -TERM $pid
wait_dead $pid 100 || fail "term: idem run still runs 10 s after SIGTERM"
wait $pid
expect_eq "term: exit status" 143 "$?"
wait_dead "$grandchild" 30 || fail "term: the grandchild outlived idem run"
still "$TMP/term.ticks" || fail "term: ticks go on"
expect_eq "term: key left unknown" unknown "$(state term)"
expect_match "term: message" "signal 15" "$(cat "$TMP/term.err")"

# 2. A grandchild that ignores SIGTERM is killed after --kill-after.
start_ticker stubborn 1 --kill-after 500ms
kill -TERM $pid
wait_dead $pid 100 || fail "stubborn: idem run still runs 10 s after SIGTERM"
wait $pid
expect_eq "stubborn: exit status" 143 "$?"
wait_dead "$grandchild" 30 || fail "stubborn: the grandchild outlived idem run"
still "$TMP/stubborn.ticks" || fail "stubborn: ticks go on"
expect_match "stubborn: message says it was killed" "SIGKILL" "$(cat "$TMP/stubborn.err")"

# 3. A command that ignores SIGTERM and writes without pause: idem run keeps
#    draining its output, kills it after --kill-after and exits.
: > "$TMP/flood.start"
sh -c 'echo $$ > "$1"; shift; exec "$@"' x "$TMP/flood.pid" \
  "$IDEM" run --key flood --kill-after 500ms -- sh -c 'trap "" TERM; echo $$ >> "$1"; exec yes flood' x "$TMP/flood.start" </dev/null 2>"$TMP/flood.err" | tail -c 100 >/dev/null &
wait_for "$TMP/flood.start" || fail "flood: the command did not start"
pid=$(cat "$TMP/flood.pid")
yes_pid=$(cat "$TMP/flood.start")
sleep 0.3
kill -TERM $pid
wait_dead $pid 150 || { fail "flood: idem run still runs 15 s after SIGTERM"; kill -KILL $pid; }
wait
alive "$yes_pid" && fail "flood: the command outlived idem run"
expect_match "flood: message" "SIGKILL" "$(cat "$TMP/flood.err")"

# 4. SIGINT (Ctrl-C) is passed on to the command's group; the command may
#    handle it. idem run exits 130. (A shell starts background commands with
#    SIGINT ignored; python3 restores its default first.)
: > "$TMP/int"
python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
  "$IDEM" run --key int -- sh -c 'trap "echo got-int >> \"\$1\"; exit 3" INT; echo start >> "$1"; while :; do sleep 0.1; done' x "$TMP/int" </dev/null 2>/dev/null &
pid=$!
wait_for "$TMP/int" || fail "int: the command did not start"
kill -INT $pid
wait_dead $pid 100 || fail "int: idem run still runs 10 s after SIGINT"
wait $pid
expect_eq "int: exit status" 130 "$?"
expect_eq "int: the command saw SIGINT" "start got-int" "$(words "$TMP/int")"
expect_eq "int: key left unknown" unknown "$(state int)"

# 5. SIGKILL of idem run: its direct child dies (PR_SET_PDEATHSIG) and the
#    rest of the group is killed by idem run's watchdog. The key stays in
#    progress; after the lease a retry is refused as unknown (4).
start_ticker killed 1 --lease 500ms
kill -KILL $pid
wait $pid 2>/dev/null
wait_dead "$child" 50 || fail "killed: the direct child outlived idem run"
wait_dead "$grandchild" 50 || fail "killed: the grandchild outlived idem run"
still "$TMP/killed.ticks" || fail "killed: ticks go on"
sleep 0.6
"$IDEM" run --key killed --lease 500ms -- sh -c "$ticker" x "$TMP/killed.ticks" "$TMP/killed.gpid" "$TMP/killed.start" 1 </dev/null 2>/dev/null
expect_eq "killed: retry refused as unknown" 4 "$?"
expect_eq "killed: one start" 1 "$(lines "$TMP/killed.start")"

# 6. SIGKILL to idem run's whole process group (as `timeout -s KILL` or a
#    job control shell sends it): the command's group, which is another
#    one, goes too.
: > "$TMP/group.ticks"; : > "$TMP/group.start"; rm -f "$TMP/group.gpid"
setsid sh -c 'echo $$ > "$1"; shift; exec "$@"' x "$TMP/group.pid" \
  "$IDEM" run --key group -- sh -c "$ticker" x "$TMP/group.ticks" "$TMP/group.gpid" "$TMP/group.start" 1 </dev/null 2>/dev/null &
wait_for "$TMP/group.gpid" || fail "group: no grandchild"
grandchild=$(cat "$TMP/group.gpid")
pid=$(cat "$TMP/group.pid")
kill -s KILL -- "-$pid"
wait_dead "$pid" 50 || fail "group: idem run survived SIGKILL"
wait_dead "$grandchild" 50 || fail "group: the grandchild outlived idem run"
still "$TMP/group.ticks" || fail "group: ticks go on"

# 7. Processes the command leaves behind after a normal end, with their
#    output closed, are not waited for and not killed.
: > "$TMP/left"
"$IDEM" run --key left -- sh -c '(exec >/dev/null 2>&1; sleep 1; echo late >> "$1") & echo main >> "$1"' x "$TMP/left" </dev/null
expect_eq "left behind: status" 0 "$?"
wait_lines "$TMP/left" 2 || fail "left behind: the background process was killed"
expect_eq "left behind: lines" "main late" "$(words "$TMP/left")"

# 8. On a terminal (a pseudo-terminal here): the command reads /dev/null,
#    not the terminal, and Ctrl-C reaches it through idem run, which exits
#    130 and leaves the key unknown. A terminal is no input: the same run
#    with </dev/null is the same request (4, not a conflict). The command
#    says cat-done once its trap is set, so that Ctrl-C never comes first.
tty_cmd='cat; trap "echo got-int; exit 3" INT; echo cat-done; while :; do sleep 0.1; done'
python3 - "$IDEM" "$tty_cmd" > "$TMP/tty.out" 2>&1 <<'PY'
import os, pty, select, sys, time
idem, cmd = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execvp(idem, [idem, "run", "--key", "tty", "--", "sh", "-c", cmd])
out = b""
def read_until(want, seconds):
    global out
    end = time.time() + seconds
    while want not in out and time.time() < end:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                return
read_until(b"cat-done", 20)
os.write(fd, b"\x03")
read_until(b"idem run: stopped", 20)
_, st = os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
print("exit", os.waitstatus_to_exitcode(st))
PY
out=$(cat "$TMP/tty.out")
expect_match "terminal: the command read /dev/null" "cat-done" "$out"
expect_match "terminal: Ctrl-C reached the command" "got-int" "$out"
expect_match "terminal: idem run exits 130" "exit 130" "$out"
expect_eq "terminal: key left unknown" unknown "$(state tty)"
"$IDEM" run --key tty -- sh -c "$tty_cmd" </dev/null 2>/dev/null
expect_eq "terminal and /dev/null: the same request" 4 "$?"

finish
