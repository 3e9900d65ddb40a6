#!/bin/sh
# bench/run.sh -- what `make bench` runs: idem against the lab seed's
# create_ticket (bench/seed_reference.py), measured in the same run.
#
# Usage: sh bench/run.sh PATH_TO_IDEM
#        BASE=<commit> [ROUNDS=5] sh bench/run.sh PATH_TO_IDEM
#
# With BASE set, only the side-by-side mode runs: this idem against a build
# of that commit, in alternating pairs (bench/compare.sh says how).
#
# Three rounds. Each round runs, interleaved so that both sides see the same
# machine state:
#   reference fresh, 1 worker      idem bench, 1 worker
#   reference fresh, 16 workers    idem bench, 16 workers
#   reference replay, 1 worker
#   idem bench, 16 workers, and beside it a second process with 1 worker on
#   the same SQLite file: whether writers of other processes still get in
# Then the PostgreSQL section: a throwaway cluster (scripts/pg.sh: Unix
# socket in a temporary folder, fsync=on, stopped at exit) and, interleaved,
# for the same number of rounds:
#   idem bench --store postgresql://... --workers 16
#   pgbench -n -f ticket.sql -c 16 -j 2 -T SECS   one-row INSERT into its own
#                                                 table, the floor that a
#                                                 durable write costs there
#   pgbench -M prepared -f pg_idem_shape.sql ...  idem's own statements for a
#                                                 local action, sent as idem
#                                                 sends them: what idem adds
#                                                 to its SQL
# Then it prints the median of the rounds for every number and the ratios
# idem / reference (and idem / pgbench) against their targets. A missed
# target is reported, never a failure; the script exits non-zero only when a
# run itself failed (a crash, or a call with an unexpected outcome).
#
# With BENCH_OUT set (make bench sets it), every run's JSON is also left in
# BENCH_OUT/run/ for bench/plot.py, and each round also measures idem and the
# reference at the other worker counts of BENCH_WORKERS_SWEEP (default
# "1 2 4 8 16 32") for its chart.
#
# Environment: BENCH_SECONDS (per phase, default 2), BENCH_ROUNDS (default 3),
# BENCH_PG (0 skips the PostgreSQL section; default 1), BENCH_SQLITE (0
# skips the SQLite section; default 1), TMPDIR (where the stores are made;
# both sides use the same directory).
set -eu

. "$(dirname "$0")/idem_arg.sh"
# The side-by-side mode: this build against a build of BASE (bench/compare.sh).
if [ -n "${BASE:-}" ] || [ -n "${BASE_IDEM:-}" ]; then
  exec sh "$HERE/compare.sh" "$IDEM"
fi
REF=$HERE/seed_reference.py
SECS=${BENCH_SECONDS:-2}
ROUNDS=${BENCH_ROUNDS:-3}
BENCH_PG=${BENCH_PG:-1}
BENCH_SQLITE=${BENCH_SQLITE:-1}
SWEEP=${BENCH_WORKERS_SWEEP:-1 2 4 8 16 32}
for v in "BENCH_PG=$BENCH_PG" "BENCH_SQLITE=$BENCH_SQLITE"; do
  case ${v#*=} in
    0 | 1) ;;
    *) echo "bench: ${v%%=*} must be 0 or 1, not '${v#*=}'" >&2; exit 2 ;;
  esac
done

# The PostgreSQL cluster, if one is started, is stopped at exit whatever
# happens (pg_stop is a no-op when none was).
. "$HERE/../scripts/pg.sh"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-run.XXXXXX")
trap 'pg_stop; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
mkdir "$WORK/tmp" "$WORK/out"
failed=0

# step NAME CMD...: runs one measurement, its output into out/NAME.json
# (pgbench's text, for the pgbench steps).
step() {
  name=$1
  shift
  printf '  %-22s' "$name" >&2
  if TMPDIR="$WORK/tmp" "$@" >"$WORK/out/$name.json" 2>"$WORK/out/$name.err"; then
    echo "ok" >&2
  else
    rc=$?
    failed=1
    echo "FAILED (exit $rc)" >&2
    sed 's/^/    /' "$WORK/out/$name.err" >&2
  fi
}

# two_processes: one idem bench process with 16 workers and, started while
# it runs, a second with 1 worker, on the same SQLite file: whether writers
# of other processes still get the write lock. One JSON object: both runs.
two_processes() {
  d=$(mktemp -d "$WORK/tmp/two.XXXXXX")
  "$IDEM" bench --store "sqlite:$d/store.db" --workers 1 --seconds 0.2 \
    >/dev/null || return 1
  "$IDEM" bench --store "sqlite:$d/store.db" --workers 16 \
    --seconds "$(awk "BEGIN { print $SECS * 2 }")" --json >"$d/busy.json" &
  busy=$!
  sleep "$(awk "BEGIN { print $SECS / 2 }")"
  "$IDEM" bench --store "sqlite:$d/store.db" --workers 1 --seconds "$SECS" \
    --json >"$d/second.json" || { wait "$busy"; return 1; }
  wait "$busy" || return 1
  python3 -c 'import json, sys
print(json.dumps({"busy": json.load(open(sys.argv[1])),
                  "second": json.load(open(sys.argv[2]))}))' \
    "$d/busy.json" "$d/second.json"
}

echo "bench: $ROUNDS rounds, $SECS s per phase; idem: $IDEM" >&2
r=1
[ "$BENCH_SQLITE" = 1 ] || r=$((ROUNDS + 1))
while [ "$r" -le "$ROUNDS" ]; do
  echo "round $r" >&2
  step "r$r.ref_fresh_1" python3 "$REF" --mode fresh --workers 1 --seconds "$SECS" --json
  step "r$r.idem_1" "$IDEM" bench --workers 1 --seconds "$SECS" --json
  step "r$r.ref_fresh_16" python3 "$REF" --mode fresh --workers 16 --seconds "$SECS" --json
  step "r$r.idem_16" "$IDEM" bench --workers 16 --seconds "$SECS" --json
  step "r$r.ref_replay_1" python3 "$REF" --mode replay --workers 1 --seconds "$SECS" --json
  step "r$r.two_processes" two_processes
  # The other worker counts of the chart (bench/plot.py), only when asked
  # for (BENCH_OUT): 1 and 16 are the runs above.
  if [ -n "${BENCH_OUT:-}" ]; then
    for w in $SWEEP; do
      case " 1 16 " in *" $w "*) continue ;; esac
      step "r$r.sweep_ref_$w" python3 "$REF" --mode fresh --workers "$w" --seconds "$SECS" --json
      step "r$r.sweep_idem_$w" "$IDEM" bench --workers "$w" --seconds "$SECS" --json
    done
  fi
  r=$((r + 1))
done

pg_ran=0
if [ "$BENCH_PG" = 1 ]; then
  echo "PostgreSQL: idem bench and pgbench, 16 clients each" >&2
  if ! pg_start >&2; then
    failed=1
    echo "bench: could not start PostgreSQL (install it: sh scripts/deps.sh bench; or skip: BENCH_PG=0)" >&2
  else
    PGBENCH=$PG_BIN/pgbench
    [ -x "$PGBENCH" ] || PGBENCH=$(command -v pgbench || echo pgbench)
    PSQL=$PG_BIN/psql
    [ -x "$PSQL" ] || PSQL=$(command -v psql || echo psql)
    # pgbench -T takes whole seconds; BENCH_SECONDS may be a fraction.
    PGB_T=$(python3 -c 'import sys; print(max(1, round(float(sys.argv[1]))))' "$SECS")
    # The same ticket as idem's, in its canonical form, in a table shaped
    # like bench_tickets.
    cat >"$WORK/ticket.sql" <<'SQL'
INSERT INTO pgbench_ticket (payload) VALUES ('{"priority":"normal","project":"demo-agent","title":"Investigate a synthetic queue backlog"}');
SQL
    if "$PSQL" -X -q -v ON_ERROR_STOP=1 -h "$PG_DIR" -p "$PG_PORT" -U idem postgres \
      -c "CREATE TABLE IF NOT EXISTS pgbench_ticket (id bigserial PRIMARY KEY, payload text NOT NULL)" >&2; then
      pg_ran=1
      r=1
      while [ "$r" -le "$ROUNDS" ]; do
        echo "round $r" >&2
        step "r$r.idem_pg_16" "$IDEM" bench --store "$IDEM_TEST_PG_URL" --workers 16 --seconds "$SECS" --json
        step "r$r.pgbench_16" "$PGBENCH" -n -f "$WORK/ticket.sql" -c 16 -j 2 -T "$PGB_T" \
          -h "$PG_DIR" -p "$PG_PORT" -U idem postgres
        step "r$r.pgbench_shape_16" "$PGBENCH" -n -M prepared -f "$HERE/pg_idem_shape.sql" \
          -c 16 -j 2 -T "$PGB_T" -h "$PG_DIR" -p "$PG_PORT" -U idem postgres
        r=$((r + 1))
      done
    else
      failed=1
      echo "bench: could not create pgbench_ticket" >&2
    fi
  fi
  pg_stop
fi

python3 - "$WORK/out" "$ROUNDS" "$BENCH_PG" "$pg_ran" "$BENCH_SQLITE" <<'EOF'
import json, os, re, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])
pg_wanted, pg_ran = sys.argv[3] == '1', sys.argv[4] == '1'
sqlite_wanted = sys.argv[5] == '1'

def load(name):
    vals = []
    for r in range(1, rounds + 1):
        path = os.path.join(out, 'r%d.%s.json' % (r, name))
        try:
            with open(path) as f:
                vals.append(json.loads(f.read()))
        except (OSError, ValueError):
            pass  # a run that printed nothing: reported above
    return vals

def med(runs, field):
    xs = [r[field] for r in runs if isinstance(r.get(field), (int, float))]
    return statistics.median(xs) if xs else None

ref1, ref16, refr = load('ref_fresh_1'), load('ref_fresh_16'), load('ref_replay_1')
idem1, idem16 = load('idem_1'), load('idem_16')

def fmt(x, unit=''):
    return '-' if x is None else '%.1f%s' % (x, unit)

def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b

def print_ratios(rows, digits):
    """Prints (label, ratio, target) rows; returns how many targets missed."""
    print()
    print('%-48s %8s %8s  %s' % ('ratio', 'x', 'target', 'result'))
    missed = 0
    for label, x, target in rows:
        if target is None:
            verdict = 'reported'
        elif x is None:
            verdict = 'NO DATA'
            missed += 1
        elif x >= target:
            verdict = 'met'
        else:
            verdict = 'MISSED'
            missed += 1
        print('%-48s %8s %8s  %s' % (label,
                                     '-' if x is None else '%.*f' % (digits, x),
                                     '-' if target is None else '>= %g' % target,
                                     verdict))
    return missed

missed = 0
if not sqlite_wanted:
    print()
    print('SQLite section skipped (BENCH_SQLITE=0)')
else:
    print()
    info = (idem1 or idem16 or [{}])[0]
    refinfo = (ref1 or refr or [{}])[0]
    print('idem %s (store %s, SQLite %s, synchronous=FULL, group commit) vs the '
          'lab seed reference' % (info.get('idem_version', '?'),
                                  info.get('store', '?'),
                                  info.get('sqlite_version', '?')))
    print('reference: Python %s, SQLite %s, journal_mode=%s, synchronous=%s, '
          'a connection per call' % (refinfo.get('python', '?'),
                                     refinfo.get('sqlite_version', '?'),
                                     refinfo.get('journal_mode', '?'),
                                     refinfo.get('synchronous', '?')))
    print('medians of %d rounds (ops/s; latency p50/p99 in us)' % rounds)
    print()
    print('%-34s %12s %10s %10s' % ('measurement', 'ops/s', 'p50 us', 'p99 us'))
    rows = [
        ('reference fresh, 1 worker', ref1, 'ops_per_s', None),
        ('reference fresh, 16 workers', ref16, 'ops_per_s', None),
        ('reference replay, 1 worker', refr, 'ops_per_s', None),
    ]
    for label, runs, field, _ in rows:
        print('%-34s %12s %10s %10s' % (label, fmt(med(runs, field)),
                                         fmt(med(runs, 'p50_us')),
                                         fmt(med(runs, 'p99_us'))))
    for w, runs in ((1, idem1), (16, idem16)):
        for phase in ('fresh', 'claim_complete', 'replay', 'conflict'):
            ph = [r['phases'][phase] for r in runs if phase in r.get('phases', {})]
            label = 'idem %s, %d worker%s' % (phase, w, '' if w == 1 else 's')
            print('%-34s %12s %10s %10s' % (label, fmt(med(runs, phase + '_ops_per_s')),
                                             fmt(med(ph, 'p50_us')),
                                             fmt(med(ph, 'p99_us'))))
    fs = med(idem1 + idem16, 'fsync_per_s')
    print('%-34s %12s' % ('fsync rate (4 KiB + fdatasync)', fmt(fs)))
    # The second process's fresh phase runs while the busy one writes.
    two = [r['second'] for r in load('two_processes') if 'second' in r]
    two_ph = [r['phases']['fresh'] for r in two if 'fresh' in r.get('phases', {})]
    print('%-34s %12s %10s %10s' % ('idem fresh, 1 worker, beside 16',
                                     fmt(med(two, 'fresh_ops_per_s')),
                                     fmt(med(two_ph, 'p50_us')),
                                     fmt(med(two_ph, 'p99_us'))))

    checks = [
        ('fresh, 1 worker: idem / ref 1 worker',
         ratio(med(idem1, 'fresh_ops_per_s'), med(ref1, 'ops_per_s')), 4),
        ('fresh, 16 workers: idem / ref 1 worker',
         ratio(med(idem16, 'fresh_ops_per_s'), med(ref1, 'ops_per_s')), 15),
        ('fresh, 16 workers: idem / ref 16 workers',
         ratio(med(idem16, 'fresh_ops_per_s'), med(ref16, 'ops_per_s')), 15),
        ('replay, 1 worker: idem / ref',
         ratio(med(idem1, 'replay_ops_per_s'), med(refr, 'ops_per_s')), 20),
        ('claim+complete, 1 worker: idem / ref fresh 1',
         ratio(med(idem1, 'claim_complete_ops_per_s'), med(ref1, 'ops_per_s')), None),
        ('claim+complete, 16 workers: idem / ref fresh 1',
         ratio(med(idem16, 'claim_complete_ops_per_s'), med(ref1, 'ops_per_s')), None),
        ('a second process beside 16 workers / alone',
         ratio(med(two, 'fresh_ops_per_s'), med(idem1, 'fresh_ops_per_s')), None),
    ]
    missed += print_ratios(checks, 1)
    if fs:
        for w, runs in ((1, idem1), (16, idem16)):
            f = med(runs, 'fresh_ops_per_s')
            if f is not None:
                print('idem fresh, %d worker%s: %.2f durable calls per fsync'
                      % (w, '' if w == 1 else 's', f / fs))

# ---- PostgreSQL: idem bench against pgbench on the same server ----------
def load_pgbench(name):
    runs = []
    for r in range(1, rounds + 1):
        try:
            with open(os.path.join(out, 'r%d.%s.json' % (r, name))) as f:
                text = f.read()
        except OSError:
            continue
        run = {'errors': 0}
        for field, pat in (('tps', r'^tps = ([0-9.]+)'),
                           ('latency_ms', r'^latency average = ([0-9.]+) ms'),
                           ('transactions', r'^number of transactions actually processed: ([0-9]+)'),
                           ('failed', r'^number of failed transactions: ([0-9]+)'),
                           ('version', r'^pgbench \((.*)\)')):
            m = re.search(pat, text, re.M)
            if m:
                run[field] = m.group(1) if field == 'version' else float(m.group(1))
        if 'tps' in run:
            run['errors'] = int(run.get('failed', 0))
            runs.append(run)
    return runs

idem_pg, pgb = load('idem_pg_16'), load_pgbench('pgbench_16')
shape = load_pgbench('pgbench_shape_16')
if not pg_wanted:
    print()
    print('PostgreSQL section skipped (BENCH_PG=0)')
elif not pg_ran:
    print()
    print('PostgreSQL section: the cluster could not be set up (see above)')
else:
    pinfo = (idem_pg or [{}])[0]
    print()
    print('PostgreSQL %s (throwaway cluster, Unix socket, fsync=on, '
          'synchronous_commit=%s): idem bench --workers 16 vs pgbench -c 16 '
          '-j 2, a one-row INSERT per transaction (%s, simple protocol)'
          % (pinfo.get('postgresql_version', '?'),
             pinfo.get('synchronous_commit', '?'),
             'pgbench ' + (pgb or [{}])[0].get('version', '?')))
    print('medians of %d rounds (ops/s; latency p50/p99 in us; pgbench: '
          'average latency)' % rounds)
    print()
    print('%-34s %12s %10s %10s' % ('measurement', 'ops/s', 'p50 us', 'p99 us'))
    for phase in ('fresh', 'claim_complete', 'replay', 'conflict'):
        ph = [r['phases'][phase] for r in idem_pg if phase in r.get('phases', {})]
        print('%-34s %12s %10s %10s' % ('idem pg %s, 16 workers' % phase,
                                         fmt(med(idem_pg, phase + '_ops_per_s')),
                                         fmt(med(ph, 'p50_us')),
                                         fmt(med(ph, 'p99_us'))))
    lat = med(pgb, 'latency_ms')
    print('%-34s %12s %10s %10s' % ('pgbench one-row insert, 16 clients',
                                     fmt(med(pgb, 'tps')),
                                     '-' if lat is None else 'avg %.0f' % (lat * 1000),
                                     '-'))
    lat = med(shape, 'latency_ms')
    print('%-34s %12s %10s %10s' % ('pgbench, idem\'s statements',
                                     fmt(med(shape, 'tps')),
                                     '-' if lat is None else 'avg %.0f' % (lat * 1000),
                                     '-'))
    tps = med(pgb, 'tps')
    pg_checks = [
        ('pg fresh, 16 workers: idem / pgbench',
         ratio(med(idem_pg, 'fresh_ops_per_s'), tps), 0.5),
        ('pg: pgbench running idem\'s statements / pgbench',
         ratio(med(shape, 'tps'), tps), None),
        ('pg fresh: idem / pgbench running idem\'s statements',
         ratio(med(idem_pg, 'fresh_ops_per_s'), med(shape, 'tps')), None),
        ('pg claim+complete, 16 workers: idem / pgbench',
         ratio(med(idem_pg, 'claim_complete_ops_per_s'), tps), None),
    ]
    missed += print_ratios(pg_checks, 2)

errs = sum(r.get('errors', 0) for r in idem1 + idem16 + ref1 + ref16 + refr + idem_pg + pgb + shape)
print()
print('%d target%s missed; %d calls with errors' % (missed, '' if missed == 1 else 's', errs))
EOF

if [ -n "${BENCH_OUT:-}" ]; then
  mkdir -p "$BENCH_OUT/run" && cp "$WORK"/out/*.json "$BENCH_OUT/run/" || failed=1
fi
if [ "$failed" -ne 0 ]; then
  echo "bench: some runs failed (see above)" >&2
  exit 1
fi
exit 0
