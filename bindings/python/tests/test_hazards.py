"""What a careless or unlucky caller does to the binding, and what it must
survive: calls nested inside calls, exceptions at awkward moments, threads
sharing what they should not, a store closed under a running call,
exceptions crossing process boundaries, values a store cannot take.

Each case crashed the interpreter, held a key for the life of the process,
or answered wrongly before the binding was hardened against it.
"""
import enum
import multiprocessing
import os
import pickle
import signal
import threading

import pytest

import idem
from idem import _tx
from helpers import records, unique

SPAWN = multiprocessing.get_context("spawn")


def test_function_that_calls_another_store_then_raises(store, store_url, tmp_path, operation):
    # The function runs inside libidem's call; the other store's call it
    # makes on the same thread must not reuse what the outer call is still
    # waiting to read.
    other = idem.open("sqlite:%s/other.db" % tmp_path)
    try:
        @other.idempotent("audit", key="key")
        def audit(key):
            return {"audited": key}

        def fn(tx):
            assert audit(key="a-1") == {"audited": "a-1"}
            raise ValueError("rejected after the audit")

        for n in range(3):
            with pytest.raises(ValueError):
                store.execute_local(operation, "k-%d" % n, {"n": n}, fn)
        out = store.execute_local(operation, "k-ok", {"n": 9}, lambda tx: audit(key="a-1"))
        assert (out.value, out.replayed) == ({"audited": "a-1"}, False)
    finally:
        other.close()
    assert [r["key"] for r in records(store_url, operation)] == ["k-ok"]


def test_function_that_calls_its_own_store_is_refused(store, operation):
    # It would wait for the transaction it runs in, for ever.
    def fn(tx):
        store.execute_local(operation, "inner", {}, lambda tx2: 1)

    with pytest.raises(idem.Error) as e:
        store.execute_local(operation, "outer", {}, fn)
    assert e.value.code == "IDEM_ESTATE"
    out = store.execute_local(operation, "outer", {}, lambda tx: "ran")
    assert (out.value, out.replayed) == ("ran", False)  # rolled back, released


def test_exception_while_rows_are_read_leaves_the_store_writable(
        store, db, backend, operation, monkeypatch):
    if backend != "sqlite":
        pytest.skip("SQLite's statements are kept prepared; PostgreSQL's are not")
    table = db.create_table("items", db.id_column + ", n INTEGER NOT NULL")
    store.execute_local(operation, "fill", {}, lambda tx: [
        tx.execute("INSERT INTO %s (n) VALUES (?)" % table, (n,)) for n in range(10)] and 10)
    real_row = _tx._sqlite_row
    seen = []

    def row_then_interrupt(stmt):
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt("as if Ctrl-C came while rows were read")
        return real_row(stmt)

    monkeypatch.setattr(_tx, "_sqlite_row", row_then_interrupt)
    # The Python way (what idem._speedups leaves to it); its own way below.
    monkeypatch.setattr(_tx, "_fast_sqlite", lambda *a: NotImplemented)
    with pytest.raises(KeyboardInterrupt):
        store.execute_local(operation, "read", {}, lambda tx: tx.execute(
            "SELECT n FROM %s ORDER BY n" % table).fetchall())
    monkeypatch.setattr(_tx, "_sqlite_row", real_row)
    monkeypatch.undo()

    # Another connection writes; the store's own writer must still be able
    # to begin (a statement left mid-step would pin an old snapshot).
    db.run("INSERT INTO %s (n) VALUES (100)" % table)
    out = store.execute_local(operation, "after", {}, lambda tx: tx.execute(
        "INSERT INTO %s (n) VALUES (?)" % table, (101,)).rowcount)
    assert (out.value, out.replayed) == (1, False)
    assert db.count(table) == 12


def _still_writable(store, db, table, operation, rows):
    """Another connection writes; then the store's own writer must still be
    able to begin (a statement left mid-step would pin an old snapshot)."""
    db.run("INSERT INTO %s (n) VALUES (100)" % table)
    out = store.execute_local(operation, "after", {}, lambda tx: tx.execute(
        "INSERT INTO %s (n) VALUES (?)" % table, (101,)).rowcount)
    assert (out.value, out.replayed) == (1, False)
    assert db.count(table) == rows + 2


def test_statement_failing_mid_read_in_c_leaves_the_store_writable(
        store, store_url, db, backend, operation):
    # idem._speedups reads the rows: SQLite fails on the fourth (abs() of
    # the least 64-bit integer overflows) after three were read.
    if backend != "sqlite":
        pytest.skip("idem._speedups runs SQLite's statements")
    table = db.create_table("items", db.id_column + ", n INTEGER NOT NULL")
    store.execute_local(operation, "fill", {}, lambda tx: [
        tx.execute("INSERT INTO %s (n) VALUES (?)" % table, (n,)) for n in range(10)] and 10)
    sql = ("SELECT CASE WHEN n = 3 THEN abs(-9223372036854775807 - 1) ELSE n END "
           "FROM %s ORDER BY n" % table)
    effects = []

    def fn(tx):
        effects.append(tx.execute("INSERT INTO %s (n) VALUES (?)" % table, (50,)).rowcount)
        return tx.execute(sql).fetchall()

    for attempt in range(2):  # the second: a statement kept from the first?
        with pytest.raises(idem.DatabaseError) as e:
            store.execute_local(operation, "read", {}, fn)
        assert e.value.code == "IDEM_ESTORE" and "overflow" in str(e.value)
    assert effects == [1, 1]  # each ran its insert, and each was rolled back
    assert db.count(table) == 10
    assert [r["key"] for r in records(store_url, operation)] == ["fill"]  # released
    _still_writable(store, db, table, operation, 10)


def test_ctrl_c_in_a_long_read_in_c_stops_it(store, store_url, db, backend, operation):
    # A read that never ends (each row counts 10,000 combinations), in
    # idem._speedups' loop: SIGINT must reach Python there, as it does
    # between rows read the Python way, roll back and leave the key free and
    # the store writable. Without that, this test never ends.
    if backend != "sqlite":
        pytest.skip("idem._speedups runs SQLite's statements")
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    table = db.create_table("items", db.id_column + ", n INTEGER NOT NULL")
    store.execute_local(operation, "fill", {}, lambda tx: [
        tx.execute("INSERT INTO %s (n) VALUES (?)" % table, (n,)) for n in range(10)] and 10)
    endless = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
               "SELECT x, (SELECT count(*) FROM {t} a, {t} b, {t} d, {t} e "
               "WHERE a.n + b.n + d.n + e.n <> x) FROM c").format(t=table)
    started = []

    def fn(tx):
        tx.execute("INSERT INTO %s (n) VALUES (?)" % table, (50,))
        started.append(True)
        signal.setitimer(signal.ITIMER_REAL, 0.05)  # once the read is under way
        return tx.execute(endless).fetchall()

    def interrupt(signum, frame):
        raise KeyboardInterrupt("Ctrl-C while rows were read")

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            store.execute_local(operation, "endless", {}, fn)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert started == [True]
    assert db.count(table) == 10  # its insert rolled back
    # Rolled back with the record: the key is free again.
    assert [r["key"] for r in records(store_url, operation)] == ["fill"]
    _still_writable(store, db, table, operation, 10)


def test_tx_from_another_thread_is_refused(store, db, operation):
    table = db.create_table("items", db.id_column + ", n INTEGER NOT NULL")
    errors = []

    def fn(tx):
        def other():
            try:
                tx.execute(db.sql("INSERT INTO %s (n) VALUES (?)" % table), (1,))
            except idem.DatabaseError as e:
                errors.append(e.code)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        return tx.execute(db.sql("INSERT INTO %s (n) VALUES (?)" % table), (2,)).rowcount

    out = store.execute_local(operation, "k", {}, fn)
    assert errors == ["IDEM_ESTATE"]
    assert out.value == 1
    assert db.rows("SELECT n FROM %s" % table) == [(2,)]


def test_result_too_deep_to_store_marks_the_key_unknown(store, operation):
    calls = []

    @store.idempotent(operation, key="key", lease="30s")
    def deep(key):
        calls.append(key)
        value = []
        for _ in range(100000):
            value = [value]
        return value

    with pytest.raises(RecursionError):
        deep(key="k")
    # Not held by a lease renewed for ever: unknown, at once.
    with pytest.raises(idem.OutcomeUnknown):
        deep(key="k")
    assert calls == ["k"]


def test_errors_cross_process_boundaries(store, operation):
    store.execute(operation, "k", {"n": 1}, lambda: "first")
    with pytest.raises(idem.Conflict) as e:
        store.execute(operation, "k", {"n": 2}, lambda: "second")
    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is idem.Conflict
    assert (again.code, again.message, str(again)) == (e.value.code, e.value.message,
                                                       str(e.value))
    held = idem.InFlight("IDEM_IN_FLIGHT", "held", 2.5)
    back = pickle.loads(pickle.dumps(held))
    assert (type(back), back.retry_after) == (idem.InFlight, 2.5)


def _conflict_in_worker(url, operation):
    with idem.open(url) as s:
        return s.execute(operation, "k", {"n": 2}, lambda: "second")


def test_pool_worker_raising_an_idem_error(store, store_url, operation):
    store.execute(operation, "k", {"n": 1}, lambda: "first")
    with SPAWN.Pool(1) as pool:
        with pytest.raises(idem.Conflict):
            pool.apply_async(_conflict_in_worker, (store_url, operation)).get(timeout=60)


def test_close_waits_for_a_running_call(store_url, operation):
    s = idem.open(store_url)
    entered, release = threading.Event(), threading.Event()
    results = []

    @s.idempotent(operation, key="key")
    def slow(key):
        entered.set()
        release.wait(60)
        return {"done": key}

    worker = threading.Thread(target=lambda: results.append(slow.outcome(key="k")))
    worker.start()
    entered.wait(60)
    closer = threading.Thread(target=s.close)
    closer.start()
    with pytest.raises(idem.Error):  # refused at once: the store is closing
        s.execute(operation, "other", {}, lambda: 1)
    release.set()
    worker.join(60)
    closer.join(60)
    assert not closer.is_alive()
    assert [(o.value, o.replayed) for o in results] == [({"done": "k"}, False)]
    with idem.open(store_url) as again:  # stored before the store closed
        @again.idempotent(operation, key="key")
        def slow_again(key):
            return "ran again"

        out = slow_again.outcome(key="k")
        assert (out.value, out.replayed) == ({"done": "k"}, True)


def test_close_waits_for_a_running_execute_local(store_url, operation):
    """The same with execute_local() whole in C (its names seen before):
    the call is counted for close(), which waits for it, and calls made
    while it closes are refused."""
    s = idem.open(store_url)
    s.execute_local(operation, "k-0", {}, lambda tx: 0)
    entered, release = threading.Event(), threading.Event()
    results = []

    def slow(tx):
        entered.set()
        release.wait(60)
        return {"done": "k"}

    worker = threading.Thread(target=lambda: results.append(
        s.execute_local(operation, "k", {}, slow)))
    worker.start()
    assert entered.wait(60)
    closer = threading.Thread(target=s.close)
    closer.start()
    while not s._closing:  # close() has begun (and waits for the call)
        threading.Event().wait(0.001)
    with pytest.raises(idem.Error, match="the store is closed"):
        s.execute_local(operation, "other", {}, lambda tx: 1)
    assert closer.is_alive()  # still waiting for the running call
    release.set()
    worker.join(60)
    closer.join(60)
    assert not closer.is_alive()
    assert [(o.value, o.replayed) for o in results] == [({"done": "k"}, False)]
    with idem.open(store_url) as again:  # stored before the store closed
        out = again.execute_local(operation, "k", {}, lambda tx: "ran again")
        assert (out.value, out.replayed) == ({"done": "k"}, True)
    assert sorted(r["key"] for r in records(store_url, operation)) == ["k", "k-0"]


class Color(enum.IntEnum):
    RED = 1


def test_values_a_store_cannot_take(store, db, backend, operation):
    table = db.create_table("items", db.id_column + ", n BIGINT, t TEXT")
    ins = db.sql("INSERT INTO %s (n, t) VALUES (?, ?)" % table)
    with pytest.raises(idem.DatabaseError):  # past 64 bits
        store.execute_local(operation, "big", {}, lambda tx: tx.execute(ins, (1 << 64, "x")))
    if backend == "postgresql":  # PostgreSQL text cannot hold NUL
        with pytest.raises(idem.DatabaseError):
            store.execute_local(operation, "nul", {}, lambda tx: tx.execute(ins, (1, "a\x00b")))
    with pytest.raises(TypeError):  # a mapping is not a list of parameters
        store.execute_local(operation, "map", {}, lambda tx: tx.execute(ins, {"n": 1}))
    out = store.execute_local(operation, "enum", {}, lambda tx: tx.execute(
        ins, (Color.RED, "ok")).rowcount)
    assert out.value == 1
    assert db.rows("SELECT n FROM %s" % table) == [(1,)]
    assert records(store.url, operation) and all(
        r["key"] == "enum" for r in records(store.url, operation))


def test_store_closes_its_file_after_a_refused_parameter(tmp_path, operation):
    path = str(tmp_path / "idem.db")
    s = idem.open("sqlite:" + path)
    s.execute_local(operation, "t", {}, lambda tx: tx.execute("CREATE TABLE t (n INTEGER)")
                    and None)
    ok = s.execute_local(operation, "a", {}, lambda tx: tx.execute(
        "INSERT INTO t VALUES (?)", (5,)).rowcount)
    assert ok.value == 1
    with pytest.raises(idem.DatabaseError):
        s.execute_local(operation, "b", {}, lambda tx: tx.execute(
            "INSERT INTO t VALUES (?)", (1 << 63,)))
    s.close()
    held = [f for f in os.listdir("/proc/self/fd")
            if os.path.realpath("/proc/self/fd/" + f).startswith(path)]
    assert held == []


def test_rowcount_is_of_the_statement_itself(store, db, backend, operation):
    table = unique("items")

    def fn(tx):
        counts = [tx.execute("CREATE TABLE %s (n INTEGER)" % table).rowcount]
        counts.append(tx.execute(db.sql("INSERT INTO %s VALUES (?)" % table), (1,)).rowcount)
        counts.append(tx.execute("CREATE INDEX %s_n ON %s (n)" % (table, table)).rowcount)
        counts.append(tx.execute("DROP TABLE %s" % table).rowcount)
        return counts

    out = store.execute_local(operation, "k", {}, fn)
    if backend == "sqlite":
        assert out.value == [-1, 1, -1, -1]
    else:  # the server's own count: none for DDL
        assert out.value[1] == 1
