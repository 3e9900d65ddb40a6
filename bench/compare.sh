#!/bin/sh
# bench/compare.sh -- bench/run.sh's side-by-side mode: this build of idem
# against a build of another commit, on the same machine in the same minutes.
#
# Usage: BASE=<commit> sh bench/run.sh PATH_TO_IDEM   (or make bench BASE=...)
#        BASE=<commit> sh bench/compare.sh PATH_TO_IDEM
#
# Builds BASE in a temporary git worktree (only the idem target, with the
# build type of PATH_TO_IDEM's build folder, RelWithDebInfo if unknown, as
# the Makefile does), then runs ROUNDS pairs: in each pair, for each worker
# count, `idem bench --json` with the base build and with this one, the
# base first in odd pairs and second in even ones, then SQLite's floor
# (bench/sqlite_floor.c: the fresh and claim + complete phases' rows written
# by plain SQLite, with full group commits). Prints, for every phase of idem
# bench (fresh keys, claim + complete, replays, conflicts) and worker count:
# the median ops/s of each side, their ratio current / base, and the median
# and range of the ratios within pairs; then the floor's medians, against
# both builds (a target of current / base above floor / base is above what
# SQLite itself reaches on the machine). Then runs
# bench/stat_fsync.c (what reading the -wal file's times cost a commit).
# Figures are reported, never judged; the exit status is non-zero only when
# a build or a run failed.
#
# Environment: BASE (a commit, tag or branch), BASE_IDEM (an idem already
# built, instead of building BASE; BASE is then only its label), ROUNDS
# (pairs, default 5; BENCH_ROUNDS is read too), BENCH_SECONDS (per phase,
# default 2), BENCH_WORKERS (default "1 16"), BASE_JOBS (build jobs, default
# 1, run under nice), BENCH_STAT_FSYNC (0 skips stat_fsync), BENCH_FLOOR
# (0 skips SQLite's floor, bench/sqlite_floor.c, run after each pair and
# printed against both builds), BENCH_WAIT
# (before each run, wait up to this many seconds while a compiler, cc1, runs
# or the CPUs are more than BENCH_BUSY percent busy over a second, default
# 50: on a shared machine, others' builds and tests are the noise; default
# 600, 0 never waits), BENCH_OUT (a folder that receives every run's JSON,
# p<pair>.<base|cur>.w<workers>.json), TMPDIR.
set -eu

BENCH_USAGE_PREFIX="BASE=<commit> "
. "$(dirname "$0")/idem_arg.sh"
BASE=${BASE:-}
BASE_IDEM=${BASE_IDEM:-}
if [ -z "$BASE" ] && [ -z "$BASE_IDEM" ]; then
  echo "bench: set BASE=<commit> (or BASE_IDEM=<path to an idem>)" >&2
  exit 2
fi
REPO=$(git -C "$HERE/.." rev-parse --show-toplevel)
ROUNDS=${ROUNDS:-${BENCH_ROUNDS:-5}}
SECS=${BENCH_SECONDS:-2}
WORKERS=${BENCH_WORKERS:-1 16}
JOBS=${BASE_JOBS:-1}
WAIT=${BENCH_WAIT:-600}
BUSY=${BENCH_BUSY:-50}
case $ROUNDS in '' | *[!0-9]* | 0) echo "bench: ROUNDS must be a positive number" >&2; exit 2 ;; esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-compare.XXXXXX")
WT=
cleanup() {
  if [ -n "$WT" ]; then
    git -C "$REPO" worktree remove --force "$WT" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir "$WORK/tmp" "$WORK/out"

# The build type of the build being measured, for the base build too, and
# the commit it was built from (its source folder's; "+changes" when that
# folder differs from it).
CACHE=$(dirname "$IDEM")/CMakeCache.txt
TYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$CACHE" 2>/dev/null || true)
TYPE=${TYPE:-RelWithDebInfo}
SRC=$(sed -n 's/^CMAKE_HOME_DIRECTORY:[A-Z]*=//p' "$CACHE" 2>/dev/null || true)
CUR=$(git -C "${SRC:-$REPO}" log -1 --format=%h HEAD 2>/dev/null || echo '?')
git -C "${SRC:-$REPO}" diff --quiet HEAD 2>/dev/null || CUR="$CUR+changes"

if [ -n "$BASE_IDEM" ]; then
  [ -x "$BASE_IDEM" ] || { echo "bench: BASE_IDEM=$BASE_IDEM is not an executable" >&2; exit 2; }
  BASE=${BASE:-$BASE_IDEM}
  BIN=$BASE_IDEM
else
  SHA=$(git -C "$REPO" rev-parse --verify --quiet "$BASE^{commit}") || {
    echo "bench: BASE=$BASE is not a commit of $REPO" >&2
    exit 2
  }
  short=$(git -C "$REPO" log -1 --format=%h "$SHA")
  case $short in "$BASE"*) BASE=$short ;; *) BASE="$BASE ($short)" ;; esac
  WT=$WORK/src
  echo "bench: building $BASE in a temporary worktree ($TYPE, idem only)" >&2
  git -C "$REPO" worktree add --detach "$WT" "$SHA" >/dev/null 2>&1 || {
    WT=
    echo "bench: git worktree add failed for $BASE" >&2
    exit 1
  }
  if ! { cmake -S "$WT" -B "$WORK/build" -DCMAKE_BUILD_TYPE="$TYPE" \
           -DBUILD_TESTING=OFF &&
         nice cmake --build "$WORK/build" -j "$JOBS" --target idem; } \
       >"$WORK/build.log" 2>&1; then
    tail -n 30 "$WORK/build.log" >&2
    echo "bench: the build of $BASE failed" >&2
    exit 1
  fi
  BIN=$WORK/build/idem
fi

# The floor: SQLite itself doing only the writes of the fresh and claim +
# complete phases, with full group commits (bench/sqlite_floor.c), from the
# current build's folder (built there when missing), run after each pair.
FLOOR=
if [ "${BENCH_FLOOR:-1}" != 0 ]; then
  FLOOR=$(dirname "$IDEM")/bench/sqlite_floor
  if [ ! -x "$FLOOR" ] &&
     ! cmake --build "$(dirname "$IDEM")" --target sqlite_floor \
       >"$WORK/floor.log" 2>&1; then
    tail -n 30 "$WORK/floor.log" >&2
    echo "bench: could not build bench/sqlite_floor.c (skip it: BENCH_FLOOR=0)" >&2
    exit 1
  fi
fi

compiling() { pgrep -x cc1 >/dev/null 2>&1; }
# busy: whether a compiler runs or the CPUs were more than BUSY% busy
# during the last second (/proc/stat; idle and iowait count as idle).
cpu_times() { awk '/^cpu /{t = 0; for (i = 2; i <= NF; i++) t += $i; print t, $5 + $6}' /proc/stat; }
busy() {
  compiling && return 0
  [ -r /proc/stat ] || return 1
  a=$(cpu_times)
  sleep 1
  b=$(cpu_times)
  echo "$a $b" | awk -v max="$BUSY" '{ t = $3 - $1; i = $4 - $2;
    exit !(t > 0 && 100 * (t - i) / t > max) }'
}

failed=0
noisy=0
# run SIDE PAIR WORKERS: one idem bench, its JSON in out/.
run() {
  bin=$BIN
  [ "$1" = cur ] && bin=$IDEM
  f=$WORK/out/p$2.$1.w$3
  waited=0
  while [ "$waited" -lt "$WAIT" ] && busy; do
    [ "$waited" = 0 ] && echo "  (the machine is busy: waiting)" >&2
    sleep 1
    waited=$((waited + 2))
  done
  printf '  pair %s, %-4s %2s worker(s) ' "$2" "$1" "$3" >&2
  if if [ "$1" = floor ]; then
       "$FLOOR" "$WORK/tmp" "$3" "$SECS" 200
     else
       TMPDIR="$WORK/tmp" "$bin" bench --workers "$3" --seconds "$SECS" --json
     fi >"$f.json" 2>"$f.err"; then
    if compiling; then
      noisy=$((noisy + 1))
      echo "ok (a compiler started meanwhile)" >&2
    else
      echo ok >&2
    fi
  else
    rc=$?
    failed=1
    echo "FAILED (exit $rc)" >&2
    sed 's/^/    /' "$f.err" >&2
  fi
}

echo "bench: $ROUNDS pairs, $SECS s per phase, workers: $WORKERS" >&2
echo "  base:    $BASE: $BIN" >&2
echo "  current: $CUR: $IDEM" >&2
p=1
while [ "$p" -le "$ROUNDS" ]; do
  for w in $WORKERS; do
    if [ $((p % 2)) = 1 ]; then run base "$p" "$w"; run cur "$p" "$w"
    else run cur "$p" "$w"; run base "$p" "$w"; fi
    if [ -n "$FLOOR" ]; then run floor "$p" "$w"; fi
  done
  cut -d' ' -f1 /proc/loadavg >"$WORK/out/p$p.load" 2>/dev/null || true
  p=$((p + 1))
done
if [ -n "${BENCH_OUT:-}" ]; then
  mkdir -p "$BENCH_OUT" && cp "$WORK"/out/*.json "$BENCH_OUT"/ || failed=1
fi

python3 - "$WORK/out" "$ROUNDS" "$WORKERS" "$BASE" "$CUR" "$SECS" "$TYPE" "$noisy" <<'EOF'
import json, os, statistics, sys

out, rounds, workers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
base, cur, secs, btype, noisy = sys.argv[4:9]

def get(side, p, w):
    try:
        with open(os.path.join(out, 'p%d.%s.w%s.json' % (p, side, w))) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

loads = []
for p in range(1, rounds + 1):
    try:
        loads.append(float(open(os.path.join(out, 'p%d.load' % p)).read()))
    except (OSError, ValueError):
        pass
print()
print('idem bench side by side: current %s against base %s (%s, SQLite '
      'store, %s s per phase)' % (cur, base, btype, secs))
print('%d alternating pairs; medians of ops/s; load average after each pair: '
      '%s' % (rounds, ' '.join('%.1f' % l for l in loads) or '?'))
print('runs that ended with a compiler running: %s of %d'
      % (noisy, 2 * rounds * len(workers)))
print()
print('%-30s %11s %11s %8s   %s' % ('phase', 'base', 'current', 'cur/base',
                                    'within pairs: median (min..max)'))
errors = 0
for w in workers:
    for phase in ('fresh', 'claim_complete', 'replay', 'conflict'):
        b, c, pr = [], [], []
        for p in range(1, rounds + 1):
            rb, rc = get('base', p, w), get('cur', p, w)
            for r in (rb, rc):
                if r and phase == 'fresh':
                    errors += r.get('errors', 0)
            xb = rb and rb.get(phase + '_ops_per_s')
            xc = rc and rc.get(phase + '_ops_per_s')
            if xb:
                b.append(xb)
            if xc:
                c.append(xc)
            if xb and xc:
                pr.append(xc / xb)
        mb = statistics.median(b) if b else None
        mc = statistics.median(c) if c else None
        label = '%s, %s worker%s' % (phase.replace('_', ' + '), w,
                                     '' if w == '1' else 's')
        print('%-30s %11s %11s %8s   %s' % (
            label,
            '-' if mb is None else '%.1f' % mb,
            '-' if mc is None else '%.1f' % mc,
            '-' if not (mb and mc) else '%.2fx' % (mc / mb),
            '-' if not pr else '%.2fx (%.2f..%.2f)' % (
                statistics.median(pr), min(pr), max(pr))))
print()
print('%d calls with unexpected results' % errors)

# The floor's rows: what SQLite itself reaches with only the writes.
floor = [(w, phase) for w in workers for phase in ('fresh', 'claim_complete')
         if any(get('floor', p, w) for p in range(1, rounds + 1))]
if floor:
    print()
    print("SQLite's floor (bench/sqlite_floor.c: the same rows written by plain "
          "SQLite, one")
    print('transaction and one fsync per batch of every caller queued, 200 us '
          'to gather)')
    print('%-30s %11s %11s %11s %11s' % ('phase', 'floor', 'floor/base',
                                         'cur/floor', 'batch'))
    for w, phase in floor:
        f, b, c, n = [], [], [], []
        for p in range(1, rounds + 1):
            rf, rb, rc = get('floor', p, w), get('base', p, w), get('cur', p, w)
            if rf and rf.get(phase + '_ops_per_s'):
                f.append(rf[phase + '_ops_per_s'])
                n.append(rf.get(phase + '_batch', 0))
                errors += rf.get('errors', 0)
            for r, acc in ((rb, b), (rc, c)):
                if r and r.get(phase + '_ops_per_s'):
                    acc.append(r[phase + '_ops_per_s'])
        mf = statistics.median(f)
        label = '%s, %s worker%s' % (phase.replace('_', ' + '), w,
                                     '' if w == '1' else 's')
        print('%-30s %11.1f %10.2fx %10.2fx %11.1f' % (
            label, mf, mf / statistics.median(b) if b else 0,
            statistics.median(c) / mf if c else 0, statistics.median(n)))
    print('(a target of the current build above floor/base is above what '
          'SQLite itself reaches here)')
EOF

if [ "${BENCH_STAT_FSYNC:-1}" = 1 ]; then
  echo
  if ${CC:-cc} -std=c11 -O2 -o "$WORK/stat_fsync" "$HERE/stat_fsync.c" 2>"$WORK/sf.err"; then
    "$WORK/stat_fsync" "$WORK/tmp" || failed=1
  else
    cat "$WORK/sf.err" >&2
    echo "bench: could not build bench/stat_fsync.c (skip it: BENCH_STAT_FSYNC=0)" >&2
    failed=1
  fi
fi

if [ "$failed" -ne 0 ]; then
  echo "bench: some runs failed (see above)" >&2
  exit 1
fi
exit 0
