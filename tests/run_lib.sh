# Sourced by the `idem run` tests after lib.sh: waiting on processes and
# files with bounded polling, so that a loaded machine slows the tests down
# instead of failing them.

# alive PID: the process exists and is not a zombie (whoever reaps orphans
# here may be slow to, or may never).
alive() {
  _s=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [ -n "$_s" ] && [ "$_s" != Z ]
}

# wait_dead PID TENTHS: polls until PID is gone, for at most TENTHS tenths
# of a second. 0 when it is gone.
wait_dead() {
  _n=0
  while alive "$1" && [ $_n -lt "$2" ]; do sleep 0.1; _n=$((_n + 1)); done
  ! alive "$1"
}

# wait_lines FILE N: waits (up to 20 s) until FILE has at least N lines.
wait_lines() {
  _n=0
  while [ "$(lines "$1")" -lt "$2" ] && [ $_n -lt 200 ]; do
    sleep 0.1
    _n=$((_n + 1))
  done
  [ "$(lines "$1")" -ge "$2" ]
}

# lines FILE: its number of lines (0 when absent).
lines() {
  if [ -f "$1" ]; then wc -l < "$1" | tr -d ' '; else echo 0; fi
}

# words FILE: its lines joined by spaces ("start end").
words() {
  tr '\n' ' ' < "$1" | sed 's/ $//'
}

# still FILE: 0 when FILE does not grow for half a second (what wrote to
# it has stopped).
still() {
  _a=$(lines "$1")
  sleep 0.5
  [ "$(lines "$1")" = "$_a" ]
}

# state KEY: the record's state as `idem keys show` prints it, or "absent".
state() {
  _o=$("$IDEM" keys show "$1" 2>/dev/null) || { echo absent; return; }
  printf '%s\n' "$_o" | sed -n 's/^state:[[:space:]]*//p'
}
