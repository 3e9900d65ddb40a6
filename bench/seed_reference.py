#!/usr/bin/env python3
"""The reference idem is measured against: the lab seed's create_ticket.

What the seed's lab.py does for one call, as published: a new SQLite
connection (timeout 10 s, autocommit), BEGIN IMMEDIATE, a look-up of the key
in `requests`, then an INSERT into `tickets` and an INSERT into `requests`,
COMMIT. The database keeps SQLite's defaults, as the seed does: rollback
journal (journal_mode=DELETE) and synchronous=FULL. No WAL, no tuning.

Modes:
  fresh   a new key per call (a ticket is created)
  replay  keys created beforehand, cycled (the stored response is returned)

Standard library only. Run by bench/run.sh; also usable by hand:
  python3 bench/seed_reference.py --mode fresh --workers 16 --seconds 2 --json
"""
import argparse
from contextlib import closing
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time

# The seed's fixture payload.
PAYLOAD = {
    'project': 'demo-agent',
    'title': 'Investigate a synthetic queue backlog',
    'priority': 'normal',
}

SCHEMA = '''
    CREATE TABLE tickets (id INTEGER PRIMARY KEY, payload TEXT NOT NULL);
    CREATE TABLE requests (
        key TEXT PRIMARY KEY, payload TEXT NOT NULL, response TEXT NOT NULL
    );
'''


class Conflict(ValueError):
    """The key was used before with another payload."""


def encode(value):
    return json.dumps(value, sort_keys=True, separators=(',', ':'),
                      allow_nan=False)


def create_schema(path):
    with closing(sqlite3.connect(path)) as db:
        db.executescript(SCHEMA)


def create_ticket(path, payload, key):
    """One call as the seed makes it; returns (response, replayed)."""
    body = encode(payload)
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        db.execute('BEGIN IMMEDIATE')
        try:
            row = db.execute('SELECT payload, response FROM requests '
                             'WHERE key = ?', (key,)).fetchone()
            if row is not None:
                if row[0] != body:
                    raise Conflict(key)
                result, replayed = json.loads(row[1]), True
            else:
                cur = db.execute('INSERT INTO tickets (payload) VALUES (?)',
                                 (body,))
                result, replayed = {'ticket_id': cur.lastrowid}, False
                db.execute('INSERT INTO requests (key, payload, response) '
                           'VALUES (?, ?, ?)', (key, body, encode(result)))
            db.execute('COMMIT')
        except BaseException:
            if db.in_transaction:
                db.execute('ROLLBACK')
            raise
    finally:
        db.close()
    return result, replayed


def prepare(path, count):
    """Stores count completed keys at once; what replay mode reuses."""
    body = encode(PAYLOAD)
    keys = ['ref-prepared-%d' % i for i in range(count)]
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute('BEGIN IMMEDIATE')
        for key in keys:
            cur = db.execute('INSERT INTO tickets (payload) VALUES (?)',
                             (body,))
            db.execute('INSERT INTO requests VALUES (?, ?, ?)',
                       (key, body, encode({'ticket_id': cur.lastrowid})))
        db.execute('COMMIT')
    return keys


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values),
                      int(p * len(sorted_values) + 0.999999)))
    return sorted_values[rank - 1]


def run(path, mode, workers, seconds, keys):
    start_gate = threading.Barrier(workers + 1)
    counts = [0] * workers
    errors = [0] * workers
    latencies = [[] for _ in range(workers)]
    state = {}
    first_error = []

    def worker(index):
        n = 0
        mine = latencies[index]
        cursor = (len(keys) * index // workers) if keys else 0
        start_gate.wait()
        deadline = state['deadline']
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline:
                break
            if mode == 'fresh':
                key = 'ref-%d-w%d-%d' % (os.getpid(), index, n)
            else:
                key = keys[cursor]
                cursor = (cursor + 1) % len(keys)
            try:
                _, replayed = create_ticket(path, PAYLOAD, key)
                if replayed != (mode == 'replay'):
                    raise AssertionError('key %s: replayed=%s in %s mode'
                                         % (key, replayed, mode))
            except Exception as e:  # counted, first one shown
                errors[index] += 1
                if not first_error:
                    first_error.append('%s: %s' % (type(e).__name__, e))
                n += 1
                continue
            mine.append((time.perf_counter() - t0) * 1e6)
            counts[index] += 1
            n += 1

    threads = [threading.Thread(target=worker, args=(i,))
               for i in range(workers)]
    for t in threads:
        t.start()
    state['start'] = time.perf_counter()
    state['deadline'] = state['start'] + seconds
    start_gate.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - state['start']
    lat = sorted(v for part in latencies for v in part)
    ops = sum(counts)
    if first_error:
        print('seed_reference: %d errors; first: %s'
              % (sum(errors), first_error[0]), file=sys.stderr)
    return {
        'mode': mode,
        'workers': workers,
        'ops_per_s': round(ops / elapsed, 1) if elapsed > 0 else 0.0,
        'ops': ops,
        'errors': sum(errors),
        'seconds': seconds,
        'p50_us': round(percentile(lat, 0.50), 1),
        'p99_us': round(percentile(lat, 0.99), 1),
    }


def settings(path):
    with closing(sqlite3.connect(path)) as db:
        return (db.execute('PRAGMA journal_mode').fetchone()[0],
                db.execute('PRAGMA synchronous').fetchone()[0])


def main():
    ap = argparse.ArgumentParser(
        description='The lab seed\'s create_ticket, measured.')
    ap.add_argument('--mode', choices=('fresh', 'replay'), default='fresh')
    ap.add_argument('--workers', type=int, default=1,
                    help='threads; each call still opens its own connection')
    ap.add_argument('--seconds', type=float, default=3.0)
    ap.add_argument('--keys', type=int, default=1000,
                    help='completed keys that replay mode cycles through')
    ap.add_argument('--json', action='store_true',
                    help='print one JSON object')
    args = ap.parse_args()
    if args.workers < 1 or args.seconds <= 0 or args.keys < 1:
        ap.error('--workers, --seconds and --keys must be positive')

    # A fresh database per run, in $TMPDIR like the seed's temporary folder.
    with tempfile.TemporaryDirectory(prefix='idem-ref-') as folder:
        path = os.path.join(folder, 'reference.sqlite')
        create_schema(path)
        keys = prepare(path, args.keys) if args.mode == 'replay' else []
        result = run(path, args.mode, args.workers, args.seconds, keys)
        journal, sync = settings(path)
    result['journal_mode'] = journal
    result['synchronous'] = {0: 'OFF', 1: 'NORMAL', 2: 'FULL',
                             3: 'EXTRA'}.get(sync, str(sync))
    result['sqlite_version'] = sqlite3.sqlite_version
    result['python'] = sys.version.split()[0]

    if args.json:
        print(json.dumps(result))
    else:
        print('reference (lab seed create_ticket): mode %s, %d worker%s, '
              '%g s' % (args.mode, args.workers,
                        '' if args.workers == 1 else 's', args.seconds))
        print('SQLite %s, journal_mode=%s, synchronous=%s'
              % (result['sqlite_version'], journal, result['synchronous']))
        print('%d ops, %.1f ops/s, p50 %.0f us, p99 %.0f us, %d errors'
              % (result['ops'], result['ops_per_s'], result['p50_us'],
                 result['p99_us'], result['errors']))
    return 1 if result['errors'] else 0


if __name__ == '__main__':
    sys.exit(main())
