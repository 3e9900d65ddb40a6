#!/bin/sh
# bench/run.sh -- what `make bench` runs: idem against the lab seed's
# create_ticket (bench/seed_reference.py), measured in the same run.
#
# Usage: sh bench/run.sh PATH_TO_IDEM
#
# Three rounds. Each round runs, interleaved so that both sides see the same
# machine state:
#   reference fresh, 1 worker      idem bench, 1 worker
#   reference fresh, 16 workers    idem bench, 16 workers
#   reference replay, 1 worker
# Then it prints the median of the rounds for every number and the ratios
# idem / reference against their targets. A missed target is reported, never
# a failure; the script exits non-zero only when a run itself failed (a crash,
# or a call with an unexpected outcome).
#
# Environment: BENCH_SECONDS (per phase, default 2), BENCH_ROUNDS (default 3),
# TMPDIR (where the stores are made; both sides use the same directory).
set -eu

if [ $# -ne 1 ]; then
  echo "usage: sh bench/run.sh PATH_TO_IDEM" >&2
  exit 2
fi
IDEM=$1
case $IDEM in */*) ;; *) IDEM=./$IDEM ;; esac
if [ ! -x "$IDEM" ]; then
  echo "bench: $IDEM is not an executable (build it first: make build)" >&2
  exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
REF=$HERE/seed_reference.py
SECS=${BENCH_SECONDS:-2}
ROUNDS=${BENCH_ROUNDS:-3}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
mkdir "$WORK/tmp" "$WORK/out"
failed=0

# step NAME CMD...: runs one measurement, its JSON into out/NAME.json.
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

echo "bench: $ROUNDS rounds, $SECS s per phase; idem: $IDEM" >&2
r=1
while [ "$r" -le "$ROUNDS" ]; do
  echo "round $r" >&2
  step "r$r.ref_fresh_1" python3 "$REF" --mode fresh --workers 1 --seconds "$SECS" --json
  step "r$r.idem_1" "$IDEM" bench --workers 1 --seconds "$SECS" --json
  step "r$r.ref_fresh_16" python3 "$REF" --mode fresh --workers 16 --seconds "$SECS" --json
  step "r$r.idem_16" "$IDEM" bench --workers 16 --seconds "$SECS" --json
  step "r$r.ref_replay_1" python3 "$REF" --mode replay --workers 1 --seconds "$SECS" --json
  r=$((r + 1))
done

python3 - "$WORK/out" "$ROUNDS" <<'EOF'
import json, os, statistics, sys

out, rounds = sys.argv[1], int(sys.argv[2])

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

def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b

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
]
print()
print('%-48s %8s %8s  %s' % ('ratio', 'x', 'target', 'result'))
missed = 0
for label, x, target in checks:
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
    print('%-48s %8s %8s  %s' % (label, '-' if x is None else '%.1f' % x,
                                 '-' if target is None else '>= %d' % target,
                                 verdict))
if fs:
    for w, runs in ((1, idem1), (16, idem16)):
        f = med(runs, 'fresh_ops_per_s')
        if f is not None:
            print('idem fresh, %d worker%s: %.2f durable calls per fsync'
                  % (w, '' if w == 1 else 's', f / fs))
errs = sum(r.get('errors', 0) for r in idem1 + idem16 + ref1 + ref16 + refr)
print()
print('%d target%s missed; %d calls with errors' % (missed, '' if missed == 1 else 's', errs))
EOF

if [ "$failed" -ne 0 ]; then
  echo "bench: some runs failed (see above)" >&2
  exit 1
fi
exit 0
