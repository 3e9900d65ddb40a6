#!/usr/bin/env python3
"""bench/python.py -- calls per second through the Python binding (import
idem) beside `idem bench --workers 1` on the same kind of store, in one run.

Usage: python3 bench/python.py BUILD_DIR [--store URL] [--rounds N]
                               [--seconds S]
       (make bench runs it with the python3 on PATH)

It builds the package from BUILD_DIR's libidem.a into a temporary folder
(bindings/python/_backend/idem_backend.py inplace), then runs ROUNDS rounds,
each one `idem bench` and the same shapes through the binding, one thread,
each in a process of its own, C first in odd rounds and Python first in even
ones, so that both see the same machine:

  C       idem bench --workers 1 --seconds S --json --store URL: its fresh
          (execute_local, a one-row INSERT into bench_tickets per call),
          claim_complete and replay (1000 completed keys, cycled) phases
  Python  the same calls, one thread, S seconds each:
    local fresh       store.execute_local("create_ticket", new_key, request,
                      fn, tenant="bench"), fn inserting the canonical
                      request into bench_tickets through tx.execute and
                      returning {"ticket_id": N}, as idem bench's fresh does
    decorator fresh   @store.idempotent("create_ticket", key="request_id",
                      tenant="bench") on a new key per call: a claim and a
                      completion, the two durable writes of idem bench's
                      claim_complete phase (the function itself writes
                      nothing)
    local replay      execute_local on 1000 keys completed beforehand
                      (through execute_local, 16 threads), cycled
    decorator replay  the decorated function on the same 1000 keys (the
                      decorator's fingerprint, its arguments but the key,
                      is idem bench's request)
  The request is idem bench's: {"project": "demo-agent", "title":
  "Investigate a synthetic queue backlog", "priority": "normal"}; keys are
  RUNID-f-w0-N for fresh calls and RUNID-r-K for the prepared ones, tenant
  "bench", operation "create_ticket".

The store is SQLite, a new file per run in a temporary folder, with its
defaults (synchronous=FULL, group commit); with --store postgresql://... or
IDEM_BENCH_PG_URL set, the same rounds also run on that PostgreSQL server,
each run in a new schema of its own (idem_schema, and bench_tickets in the
search_path), dropped with psql after its round (a URL that sets
idem_schema or options itself is used as it is, and its rows are left).
Then each round runs the async path (async_child): an async def beside the
same function as a plain def, one call at a time, on fresh keys and on
replays (ratios reported), and 1,000 tasks waiting (wait=) for one held key:
the threads they add (target 0) and an unrelated call's time with them
beside its time without.

Then it prints each round, the medians and the ratios Python / C against
the targets (fresh >= 0.85x, replay >= 0.25x): PASS or MISS. A missed
target is reported, never a failure; it exits non-zero only when a run
failed.

Environment: BENCH_SECONDS (per phase, default 1), BENCH_ROUNDS (default 9),
IDEM_BENCH_PG_URL, TMPDIR.
"""
import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(HERE)
BACKEND = os.path.join(TREE, "bindings", "python", "_backend", "idem_backend.py")

# idem bench's request (src/bench/cmd_bench.c, payload_json), tenant and operation.
REQUEST = {"project": "demo-agent",
           "title": "Investigate a synthetic queue backlog",
           "priority": "normal"}
TENANT = "bench"
OPERATION = "create_ticket"
PREPARED_KEYS = 1000
PREP_THREADS = 16

# (label, the Python phase, the C phase it is measured against, target)
CHECKS = (
    ("fresh: execute_local / C fresh", "local_fresh", "fresh", 0.85),
    ("fresh: decorator / C claim+complete", "decorator_fresh", "claim_complete", 0.85),
    ("fresh: decorator / C fresh", "decorator_fresh", "fresh", None),
    ("replay: decorator / C replay", "decorator_replay", "replay", 0.25),
    ("replay: execute_local / C replay", "local_replay", "replay", 0.25),
    ("fresh: Python's floor / C fresh", "floor_fresh", "fresh", None),
    ("fresh: execute_local / Python's floor", "local_fresh", "floor_fresh", None),
    ("replay: Python's floor / C replay", "floor_replay", "replay", None),
    ("replay: decorator / Python's floor", "decorator_replay", "floor_replay", None),
)


# ---------------------------------------------------------------- the child

def timed(step, seconds):
    """Calls step(n), n = 0, 1, ..., for seconds; step says whether the call
    answered as it should. Calls per second and latencies of those that
    did."""
    now = time.perf_counter_ns
    lat = []
    errors = 0
    n = 0
    start = now()
    deadline = start + int(seconds * 1e9)
    while True:
        t0 = now()
        if t0 >= deadline:
            break
        ok = step(n)
        n += 1
        if ok:
            lat.append(now() - t0)
        else:
            errors += 1
    elapsed = (now() - start) / 1e9
    lat.sort()

    def pct(p):
        if not lat:
            return 0.0
        rank = min(len(lat), max(1, int(p * len(lat) + 0.999999)))
        return round(lat[rank - 1] / 1000.0, 1)

    return {"ops": len(lat), "ops_per_s": round(len(lat) / elapsed, 1),
            "p50_us": pct(0.50), "p99_us": pct(0.99), "errors": errors,
            "elapsed_s": elapsed}


def child(url: str, seconds: float, warmup: float, floor_url: str = "") -> int:
    """Runs the Python side once against url and prints one JSON object."""
    from concurrent.futures import ThreadPoolExecutor

    import cffi
    import idem

    run_id = "py%d.%x" % (os.getpid(), time.time_ns() // 1000)
    store = idem.open(url)
    pg = store.backend == "postgresql"
    # The canonical request: what idem bench's action inserts. The request
    # is the same on every call, so it is written once here.
    payload = json.dumps(REQUEST, sort_keys=True, separators=(",", ":"))
    if pg:
        create = ("CREATE TABLE IF NOT EXISTS bench_tickets (id bigserial "
                  "PRIMARY KEY, payload text NOT NULL)")
        insert = "INSERT INTO bench_tickets (payload) VALUES ($1::text) RETURNING id"

        def insert_ticket(tx):
            return {"ticket_id": tx.execute(insert, (payload,)).fetchone()[0]}
    else:
        create = ("CREATE TABLE IF NOT EXISTS bench_tickets (id INTEGER "
                  "PRIMARY KEY, payload TEXT NOT NULL)")
        insert = "INSERT INTO bench_tickets (payload) VALUES (?)"

        def insert_ticket(tx):
            return {"ticket_id": tx.execute(insert, (payload,)).lastrowid}

    def create_table(tx):
        tx.execute(create)

    # The table, in a transaction of the store's like the caller's own.
    store.execute_local("bench_setup", run_id, {}, create_table, tenant=TENANT)

    @store.idempotent(OPERATION, key="request_id", tenant=TENANT)
    def create_ticket(project, title, priority, request_id):
        return {"ticket_id": 0}

    def local(key):
        return store.execute_local(OPERATION, key, REQUEST, insert_ticket, tenant=TENANT)

    def decorated(key):
        return create_ticket.outcome(REQUEST["project"], REQUEST["title"],
                                     REQUEST["priority"], request_id=key)

    def phase(call, keys, want_replayed, secs):
        """Calls call(key) for secs seconds; ops/s and latencies."""
        reported = []

        def step(n):
            key = keys(n)
            try:
                out = call(key)
            except idem.Error as e:
                if len(reported) < 5:
                    reported.append(key)
                    print("bench: key %s: %s" % (key, e), file=sys.stderr)
                return False
            return out.replayed == want_replayed and isinstance(out.value, dict)

        return timed(step, secs)

    def fresh(tag):
        return lambda n: "%s-%s-w0-%d" % (run_id, tag, n)

    phases = {}
    if warmup > 0:  # PostgreSQL: open the pool's connections, as idem bench does
        phase(local, fresh("warm"), False, warmup)
    phases["local_fresh"] = phase(local, fresh("f"), False, seconds)
    phases["decorator_fresh"] = phase(decorated, fresh("d"), False, seconds)

    prepared = ["%s-r-%d" % (run_id, k) for k in range(PREPARED_KEYS)]
    with ThreadPoolExecutor(PREP_THREADS) as pool:
        outs = list(pool.map(local, prepared))
    if any(o.replayed for o in outs):
        print("bench: a prepared key was not fresh", file=sys.stderr)
        return 1
    phases["local_replay"] = phase(local, lambda n: prepared[n % PREPARED_KEYS], True,
                                   seconds)
    phases["decorator_replay"] = phase(decorated, lambda n: prepared[n % PREPARED_KEYS],
                                       True, seconds)
    phases["floor_replay"] = floor(store, prepared, seconds)
    if floor_url:
        # The floor's fresh calls on a store of their own, new as the one
        # execute_local's fresh phase began on (and C's): the store the
        # phases above grew would flatter it.
        store.close()
        store = idem.open(floor_url)
        store.execute_local("bench_setup", run_id, {}, create_table, tenant=TENANT)
        if warmup > 0:
            floor_fresh(store, payload, fresh("zw"), warmup, pg)
    phases["floor_fresh"] = floor_fresh(store, payload, fresh("z"), seconds, pg)
    store.close()
    errors = sum(p["errors"] for p in phases.values())
    doc = {"python": "%s %s" % (sys.implementation.name, sys.version.split()[0]),
           "executable": sys.executable, "cffi": cffi.__version__,
           "idem_version": idem.__version__, "libidem_version": idem.libidem_version(),
           "store": "postgresql" if pg else "sqlite", "seconds": seconds,
           "errors": errors, "phases": phases}
    for name, p in phases.items():
        doc[name + "_ops_per_s"] = p["ops_per_s"]
    print(json.dumps(doc))
    return 1 if errors else 0


def async_child(url: str, seconds: float) -> int:
    """The async path against url, one process: async def beside the same
    function as a plain def (the reference) on fresh keys and on replays,
    one call at a time; then 1,000 tasks waiting for one held key (wait=):
    the process's threads before and while they wait, and a call on an
    unrelated key with and without them. Prints one JSON object."""
    import asyncio

    import idem

    run_id = "pa%d.%x" % (os.getpid(), time.time_ns() // 1000)
    store = idem.open(url)

    @store.idempotent(OPERATION, key="request_id", tenant=TENANT)
    def plain(project, title, priority, request_id):
        return {"ticket_id": 0}

    @store.idempotent(OPERATION, key="request_id", tenant=TENANT)
    async def coro(project, title, priority, request_id):
        return {"ticket_id": 0}

    gate = asyncio.Event()

    @store.idempotent("waited", key="k", tenant=TENANT, wait="60s")
    async def held(k):
        if k == "hot":
            await gate.wait()
        return {"k": k}

    def os_threads():
        return len(os.listdir("/proc/self/task"))

    async def arun(call, keys, secs):
        now = time.perf_counter_ns
        lat, n = [], 0
        deadline = now() + int(secs * 1e9)
        start = now()
        while now() < deadline:
            t0 = now()
            await call(keys(n))
            lat.append(now() - t0)
            n += 1
        elapsed = (now() - start) / 1e9
        lat.sort()
        return {"ops_per_s": round(n / elapsed, 1),
                "p50_us": round(lat[len(lat) // 2] / 1000.0, 1) if lat else 0}

    def args(key):
        return (REQUEST["project"], REQUEST["title"], REQUEST["priority"], key)

    async def main():
        out = {}
        fresh = lambda tag: lambda n: "%s-%s-%d" % (run_id, tag, n)  # noqa: E731

        async def sync_call(key):
            plain(*args(key))

        async def async_call(key):
            await coro(*args(key))

        out["sync_fresh"] = await arun(sync_call, fresh("s"), seconds)
        out["async_fresh"] = await arun(async_call, fresh("a"), seconds)
        done = ["%s-a-%d" % (run_id, n) for n in range(200)]
        out["sync_replay"] = await arun(sync_call, lambda n: done[n % 200], seconds)
        out["async_replay"] = await arun(async_call, lambda n: done[n % 200], seconds)

        async def unrelated(tag, count=20):
            lat = []
            for i in range(count):
                t0 = time.perf_counter_ns()
                await held("%s-%s-%d" % (run_id, tag, i))
                lat.append(time.perf_counter_ns() - t0)
            lat.sort()
            return lat[len(lat) // 2] / 1000.0

        await asyncio.gather(*(held("%s-warm-%d" % (run_id, i)) for i in range(32)))
        out["unrelated_alone_us"] = await unrelated("alone")
        before = os_threads()
        holder = asyncio.create_task(held("hot"))
        for _ in range(10):  # the holder claims the key and runs
            await asyncio.sleep(0)
        waiters = [asyncio.create_task(held("hot")) for _ in range(1000)]
        await asyncio.sleep(0.3)
        during = os_threads()
        out["unrelated_waiters_us"] = await unrelated("busy")
        during = max(during, os_threads())
        pending = sum(not w.done() for w in waiters)
        gate.set()
        results = await asyncio.gather(holder, *waiters)
        out["threads_before"], out["threads_waiting"] = before, during
        out["waiters_pending"] = pending
        out["waiters_same_result"] = len({json.dumps(r) for r in results}) == 1
        return out

    doc = asyncio.run(main())
    store.close()
    doc["store"] = "postgresql" if url.startswith("postgres") else "sqlite"
    print(json.dumps(doc))
    return 0 if doc["waiters_same_result"] and doc["waiters_pending"] == 1000 else 1


def async_report(title, runs):
    """Prints the async path's medians and its targets; the targets missed."""
    print()
    print("%s, async def (medians of %d rounds, one task at a time)" % (title, len(runs)))
    print()
    missed = 0
    rows = []
    for name in ("fresh", "replay"):
        a = med([r["async_" + name]["ops_per_s"] for r in runs])
        b = med([r["sync_" + name]["ops_per_s"] for r in runs])
        rows.append(("%s: async def / plain def" % name, a, b, a / b if b else 0))
    # Reported: each async call crosses to libidem's thread and back to the
    # loop twice (claim, ending), which a plain call, blocking in C, does
    # not; the price of never blocking the loop.
    print("%-40s %10s %10s %6s  %s" % ("ratio", "async/s", "plain/s", "x", "result"))
    for label, a, b, x in rows:
        print("%-40s %10.0f %10.0f %6.2f  reported" % (label, a, b, x))
    added = med([r["threads_waiting"] - r["threads_before"] for r in runs])
    slow = med([r["unrelated_waiters_us"] / r["unrelated_alone_us"] for r in runs])
    print()
    print("1,000 tasks waiting for one held key (wait=):")
    print("  threads added (median)                 %6d    target 0     %s"
          % (added, "PASS" if added <= 0 else "MISS"))
    print("  an unrelated call, with them / without %6.2fx   (p50 %.0f us / %.0f us)"
          % (slow, med([r["unrelated_waiters_us"] for r in runs]),
             med([r["unrelated_alone_us"] for r in runs])))
    missed += added > 0
    return missed


def floor(store, prepared, seconds):
    """The least a replay through libidem costs from Python, with none of the
    binding's own work: the arguments written as JSON (the fingerprint needs
    them), one call into libidem's claim (idem_execute_begin, as the
    decorator makes), the stored result read back from JSON, each step
    through cffi and Python's json. The binding's replay goes below it:
    idem._speedups does the JSON and the call in one crossing, so that
    decorator / floor above 1 is what that saves."""
    from idem import _store
    from idem._native import ffi, lib

    encode, decode = _store._encode, _store._decode
    handle = store._handle()
    claim = ffi.new("idem_py_claim *")
    cap = 64 * 1024
    buf = ffi.new("char[]", cap)
    opts = ffi.new("idem_execute_options *")
    tenant, operation = TENANT.encode(), OPERATION.encode()
    args = dict(REQUEST)

    def step(n):
        request = encode(args).encode()
        lib.idem_py_begin(handle, tenant, operation,
                          prepared[n % PREPARED_KEYS].encode(), request, len(request),
                          opts, claim, buf, cap, ffi.NULL)  # NULL: no wait sliced
        value = decode(ffi.unpack(claim.body, claim.body_len).decode())
        return claim.outcome == 2 and claim.call == ffi.NULL and isinstance(value, dict)

    return timed(step, seconds)


_FLOOR_NAMES = itertools.count(1)


def floor_fresh(store, payload, keys, seconds, pg):
    """The least a fresh local call costs from Python: the request written
    as JSON, one call into libidem's local run whose callback, in Python,
    inserts the row on a statement kept prepared (what C's fresh does) and
    returns its JSON result, and that result decoded. SQLite: one C call
    runs the statement; PostgreSQL: PQexecPrepared (the statement prepared
    once per server session), the id read with PQgetvalue. What this costs
    beside C's fresh is Python's; the binding's execute_local() runs its
    function from idem._speedups' own callback instead of cffi's, and its
    tx.execute() in C, so it may go below this."""
    from idem import _store
    from idem._native import ffi, lib

    encode, decode = _store._encode, _store._decode
    handle = store._handle()
    claim = ffi.new("idem_py_claim *")
    cap = 64 * 1024
    buf = ffi.new("char[]", cap)
    opts = ffi.new("idem_call_options *")
    tenant, operation = TENANT.encode(), OPERATION.encode()
    sql = b"INSERT INTO bench_tickets (payload) VALUES (?)"
    text = payload.encode()
    ptrs = [ffi.from_buffer(text)]
    kept = {}
    out = ffi.new("idem_py_sql *")
    pg_sql = b"INSERT INTO bench_tickets (payload) VALUES ($1::text) RETURNING id"
    pg_text = ffi.new("char[]", text)
    pg_values = ffi.new("char *[]", [pg_text])
    sessions = set()
    name = b"bench_floor_%d" % next(_FLOOR_NAMES)  # one per call: a session may outlive it

    def insert_pg(tx):
        conn = ffi.cast("PGconn *", tx._conn)
        pid = lib.PQbackendPID(conn)
        if pid not in sessions:
            lib.PQclear(lib.PQprepare(conn, name, pg_sql, 0, ffi.NULL))
            sessions.add(pid)
        res = lib.PQexecPrepared(conn, name, 1, pg_values, ffi.NULL, ffi.NULL, 0)
        try:
            return {"ticket_id": int(ffi.string(lib.PQgetvalue(res, 0, 0)))}
        finally:
            lib.PQclear(res)

    def insert(tx):
        db = ffi.cast("sqlite3 *", tx._conn)
        lib.idem_py_sqlite_run(db, kept.get("stmt", ffi.NULL), sql, len(sql), 1, b"3",
                               ffi.NULL, ffi.NULL, ptrs, [len(text)], out)
        kept["stmt"] = out.stmt
        return {"ticket_id": out.last_rowid}

    import contextvars

    local = _store._LocalCall()
    local.fn, local.store = insert_pg if pg else insert, store
    # The caller's context, which the binding runs the function in.
    local.context = contextvars.copy_context()
    ctx = local.ctx
    args = dict(REQUEST)

    def step(n):
        request = encode(args).encode()
        lib.idem_py_local_run(handle, tenant, operation, keys(n).encode(), request,
                              len(request), opts, ctx, claim, buf, cap, ffi.NULL)
        value = decode(local.body.decode())
        return claim.outcome == 1 and isinstance(value, dict)

    try:
        return timed(step, seconds)
    finally:
        if "stmt" in kept:
            lib.sqlite3_finalize(kept["stmt"])


# ---------------------------------------------------------------- the driver

def redact(url: str) -> str:
    """url without its password."""
    if "://" in url and "@" in url.split("://", 1)[1].split("/", 1)[0]:
        scheme, rest = url.split("://", 1)
        auth, host = rest.split("@", 1)
        if ":" in auth:
            auth = auth.split(":", 1)[0] + ":***"
        return "%s://%s@%s" % (scheme, auth, host)
    return url


def pg_fresh(url, tag, name=False):
    """url with a schema of its own for one run (idem's tables, with
    idem_schema, and bench_tickets, first in the search_path), so that each
    run starts from empty tables as SQLite's runs start from a new file: the
    rows earlier runs left would otherwise slow every later one. A URL that
    sets idem_schema or options itself is used as it is. name: the
    schema's name instead (None when the URL is used as it is)."""
    query = url.split("?", 1)[1] if "?" in url else ""
    if any(p.split("=", 1)[0] in ("idem_schema", "options") for p in query.split("&")):
        return None if name else url
    schema = "idem_bench_py%d_%s" % (os.getpid(), tag)
    if name:
        return schema
    return "%s%sidem_schema=%s&options=-csearch_path%%3D%s" % (
        url, "&" if "?" in url else "?", schema, schema)


def pg_drop(url, schemas):
    """Drops the runs' schemas with psql (left in place, and said, without
    it)."""
    schemas = [s for s in schemas if s]
    if not schemas:
        return
    # psql takes the URL without idem's own parameters (there are none here).
    cmd = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-c",
           "DROP SCHEMA IF EXISTS %s CASCADE" % ", ".join(schemas)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True)
    except OSError:
        p = None
    if p is None or p.returncode != 0:
        print("bench: schemas %s left in place (psql: %s)" % (
            ", ".join(schemas), "not found" if p is None else p.stderr.strip()),
            file=sys.stderr)


def step(name, cmd, env=None):
    """Runs one measurement; its JSON, or None (reported) when it failed."""
    sys.stderr.write("  %-22s" % name)
    sys.stderr.flush()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    doc = None
    if p.returncode == 0:
        try:
            doc = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
    if doc is None:
        sys.stderr.write("FAILED (exit %d)\n" % p.returncode)
        for line in (p.stderr + p.stdout).splitlines():
            sys.stderr.write("    %s\n" % line)
        return None
    sys.stderr.write("ok\n")
    return doc


def med(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def report(title, runs_c, runs_py, rounds):
    """Prints one store's rounds, medians and ratios; the targets missed."""
    cinfo = (runs_c or [{}])[0]
    pinfo = (runs_py or [{}])[0]
    print()
    print("%s: idem %s; C: idem bench --workers 1; Python: %s, cffi %s, one thread"
          % (title, cinfo.get("idem_version", "?"), pinfo.get("python", "?"),
             pinfo.get("cffi", "?")))
    print("medians of %d rounds (calls/s; p50 in us)" % rounds)
    print()
    rows = (("C fresh (execute_local)", runs_c, "fresh"),
            ("C claim+complete", runs_c, "claim_complete"),
            ("C replay", runs_c, "replay"),
            ("py execute_local fresh", runs_py, "local_fresh"),
            ("py decorator fresh", runs_py, "decorator_fresh"),
            ("py execute_local replay", runs_py, "local_replay"),
            ("py decorator replay", runs_py, "decorator_replay"),
            ("py floor replay", runs_py, "floor_replay"),
            ("py floor fresh", runs_py, "floor_fresh"))
    print("%-26s %10s %8s   %s" % ("measurement", "calls/s", "p50 us", "rounds"))
    fs = [r.get("fsync_per_s") for r in runs_c]
    print("%-26s %10s %8s   %s" % ("fsync/s before C's run", "-" if med(fs) is None
                                   else "%.0f" % med(fs), "",
                                   ", ".join("%.0f" % v for v in fs if v is not None)))
    medians = {}
    for label, runs, ph in rows:
        vals = [r.get(ph + "_ops_per_s") for r in runs]
        p50 = [r["phases"][ph]["p50_us"] for r in runs if ph in r.get("phases", {})]
        m = med(vals)
        medians[ph] = m
        print("%-26s %10s %8s   %s" % (
            label, "-" if m is None else "%.0f" % m,
            "-" if med(p50) is None else "%.1f" % med(p50),
            ", ".join("%.0f" % v for v in vals if v is not None) or "-"))
    # Each round's own ratio as well: the two sides of a round ran on the
    # same machine minutes apart, so their ratio moves less than either.
    per_round = {}
    for _, runs, ph in rows:
        per_round[ph] = [r.get(ph + "_ops_per_s") for r in runs]
    print()
    print("%-38s %8s %8s %8s  %s" % ("ratio", "x", "rounds x", "target", "result"))
    missed = 0
    for label, py, c, target in CHECKS:
        a, b = medians.get(py), medians.get(c)
        x = None if a is None or not b else a / b
        pairs = [u / v for u, v in zip(per_round.get(py, []), per_round.get(c, []))
                 if isinstance(u, (int, float)) and isinstance(v, (int, float)) and v]
        px = med(pairs)
        if target is None:
            verdict = "reported"
        elif x is None:
            verdict = "NO DATA"
            missed += 1
        elif x >= target:
            verdict = "PASS"
        else:
            verdict = "MISS"
            missed += 1
        print("%-38s %8s %8s %8s  %s" % (label, "-" if x is None else "%.3f" % x,
                                          "-" if px is None else "%.3f" % px,
                                          "-" if target is None else ">= %g" % target,
                                          verdict))
    print("x: the ratio of the medians (the verdict); rounds x: the median of each "
          "round's own ratio")
    return missed


def main(argv):
    p = argparse.ArgumentParser(prog="bench/python.py",
                                description="idem's Python binding beside idem bench")
    p.add_argument("build", nargs="?", default=os.path.join(TREE, "build"),
                   help="the CMake build folder (idem, libidem.a); default build/")
    p.add_argument("--store", action="append", default=[],
                   help="also run on this postgresql:// store (IDEM_BENCH_PG_URL too)")
    # Many short rounds: C and Python alternate within seconds of each other,
    # while the disk's sync rate and the server drift by 10-30% over a
    # minute; each round's own ratio pairs them (see docs/bench.md).
    p.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", 9)))
    p.add_argument("--seconds", type=float,
                   default=float(os.environ.get("BENCH_SECONDS", 1)))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--floor-store", default="", help=argparse.SUPPRESS)
    p.add_argument("--async-child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return child(a.child, a.seconds, a.warmup, a.floor_store)
    if a.async_child:
        return async_child(a.async_child, a.seconds)

    build = os.path.abspath(a.build)
    idem_bin = os.path.join(build, "idem")
    if not os.access(idem_bin, os.X_OK):
        print("bench: %s is not an executable (build it first: make build)" % idem_bin,
              file=sys.stderr)
        return 2
    pg_urls = list(a.store)
    env_pg = os.environ.get("IDEM_BENCH_PG_URL")
    if env_pg and env_pg not in pg_urls:
        pg_urls.append(env_pg)
    for u in pg_urls:
        if not u.startswith(("postgresql://", "postgres://")):
            print("bench: --store %s: a postgresql:// URL (SQLite always runs, in a "
                  "temporary folder)" % redact(u), file=sys.stderr)
            return 2

    work = tempfile.mkdtemp(prefix="idem-bench-python.", dir=os.environ.get("TMPDIR"))
    try:
        pkg = os.path.join(work, "pkg")
        b = subprocess.run([sys.executable, BACKEND, "inplace", "--build-dir", build,
                            "--out", pkg], capture_output=True, text=True)
        if b.returncode != 0:
            sys.stderr.write(b.stdout + b.stderr)
            print("bench: could not build the Python package (python3-dev, "
                  "python3-cffi and a C compiler are needed)", file=sys.stderr)
            return 1
        env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
        me = os.path.abspath(__file__)
        secs = "%g" % a.seconds
        failed = False
        stores = [("sqlite", None)] + [("pg", u) for u in pg_urls]
        results = {}
        print("idem python: %d rounds of %ss per phase" % (a.rounds, secs), file=sys.stderr)
        sys.stdout.flush()
        for label, url in stores:
            runs_c, runs_py = [], []
            for r in range(1, a.rounds + 1):
                print("round %d (%s)" % (r, "SQLite" if url is None else
                                         "PostgreSQL " + redact(url)), file=sys.stderr)
                c_url = url and pg_fresh(url, "r%d_c" % r) or \
                    "sqlite:" + os.path.join(work, "r%d.c.db" % r)
                py_url = url and pg_fresh(url, "r%d_py" % r) or \
                    "sqlite:" + os.path.join(work, "r%d.py.db" % r)
                c_cmd = [idem_bin, "bench", "--workers", "1", "--seconds", secs,
                         "--json", "--store", c_url]
                floor_url = url and pg_fresh(url, "r%d_floor" % r) or \
                    "sqlite:" + os.path.join(work, "r%d.floor.db" % r)
                py_cmd = [sys.executable, me, "--child", py_url, "--seconds", secs,
                          "--warmup", "0.5" if url else "0", "--floor-store", floor_url]
                order = [("c", c_cmd), ("python", py_cmd)]
                if r % 2 == 0:
                    order.reverse()
                for side, cmd in order:
                    doc = step("r%d.%s_%s" % (r, label, side), cmd, env)
                    if doc is None:
                        failed = True
                    else:
                        (runs_c if side == "c" else runs_py).append(doc)
                for f in os.listdir(work):  # the round's SQLite files
                    if f.startswith("r%d." % r):
                        os.unlink(os.path.join(work, f))
                if url:  # and its PostgreSQL schemas
                    pg_drop(url, [pg_fresh(url, "r%d_%s" % (r, side), name=True)
                                  for side in ("c", "py", "floor")])
            runs_async = []
            for r in range(1, a.rounds + 1):
                a_url = url and pg_fresh(url, "r%d_async" % r) or \
                    "sqlite:" + os.path.join(work, "r%d.async.db" % r)
                doc = step("r%d.%s_async" % (r, label),
                           [sys.executable, me, "--async-child", a_url, "--seconds", secs],
                           env)
                if doc is None:
                    failed = True
                else:
                    runs_async.append(doc)
                for f in os.listdir(work):
                    if f.startswith("r%d.async" % r):
                        os.unlink(os.path.join(work, f))
                if url:
                    pg_drop(url, [pg_fresh(url, "r%d_async" % r, name=True)])
            results[label] = (url, runs_c, runs_py, runs_async)

        missed = 0
        for label, (url, runs_c, runs_py, runs_async) in results.items():
            title = ("SQLite (a new file per run in TMPDIR, synchronous=FULL, group commit)"
                     if url is None else "PostgreSQL %s (a new schema per run)" % redact(url))
            missed += report(title, runs_c, runs_py, a.rounds)
            if runs_async:
                missed += async_report(title, runs_async)
        print()
        print("%d target%s missed" % (missed, "" if missed == 1 else "s"))
        sys.stdout.flush()
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
