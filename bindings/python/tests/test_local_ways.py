"""execute_local() runs the caller's function one of two ways: from
idem._speedups' own callback (the request written by its encoder) or from
idem_py_local() through cffi (a request it leaves to Python's json). Both
must behave alike in everything a caller sees: the value, the flags, what a
raised exception carries, what is stored, what tx allows, and the guard
against a function that calls back into its own store.

Every case runs each way (see the way fixture): "whole" and "c" as a user
runs it (and the Python way must not be taken), "python" with the C way
turned off.
"""
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading

import pytest

import idem
from idem import _store
from helpers import TICKET, act_then_hang, records

SPAWN = multiprocessing.get_context("spawn")

WAYS = ["whole", "c", "python"]


@pytest.fixture(params=WAYS)
def way(request, monkeypatch, operation):
    """The way execute_local() runs the function, with a count of the calls
    each way answered: "whole", the call whole in C (local_call(): no
    options, and the names seen before, as in a running program), counted
    as "c" and as "whole"; "c", that way off, so that C runs the function
    from the call made in Python (local()); "python", both off."""
    seen = {"c": 0, "python": 0, "whole": 0, "way": request.param}
    real_fast, real_python = _store._fast_local, _store._local_python
    real_whole = _store._local_call

    def python(*args):
        seen["python"] += 1
        return real_python(*args)

    def kept_clean():
        # No call left its claim's call to free in a spare pair (a result
        # too large for the buffer leaves one until Python has read it):
        # the next call would overwrite it.
        assert [p for p in _store._SPARES if p[0].call != _store.ffi.NULL] == []

    def fast(*args):
        seen["c"] += 1  # also when it raises what fn raised
        out = real_fast(*args)
        assert out is not NotImplemented, "the C way left a plain request to Python"
        return out

    def whole(*args):
        # Counted when it answered, or raised what fn raised.
        try:
            out = real_whole(*args)
        except BaseException:
            seen["c"] += 1
            seen["whole"] += 1
            raise
        finally:
            kept_clean()
        if out is not NotImplemented:
            seen["c"] += 1
            seen["whole"] += 1
        return out

    def off(*args):
        return NotImplemented

    if request.param == "whole":
        _store._name(operation, "operation")
        _store._name("", "tenant")
    monkeypatch.setattr(_store, "_fast_local", off if request.param == "python" else fast)
    monkeypatch.setattr(_store, "_local_python", python)
    monkeypatch.setattr(_store, "_local_call", whole if request.param == "whole" else off)
    yield ("python" if request.param == "python" else "c"), seen
    if request.param == "whole":
        assert seen["whole"] > 0, "no call went whole in C"
    kept_clean()


def answered(way, calls, options=0):
    """The counts of calls each way answered, after calls calls (of which
    options passed options: they go the "c" way when the "whole" one is
    on)."""
    name, seen = way
    assert (seen["c"], seen["python"]) == ((calls, 0) if name == "c" else (0, calls))
    if seen["way"] == "whole":
        assert seen["whole"] == calls - options


def stored(store, operation):
    """{key: (state, response body decoded)} of the operation's records."""
    out = {}
    for r in records(store.url, operation):
        body = r["response"]["body"] if r.get("response") else None
        out[r["key"]] = (r["state"], json.loads(body) if body is not None else None)
    return out


RESULTS = [
    ({"id": 7, "tags": ["a", "é"], "n": None}, {"id": 7, "tags": ["a", "é"], "n": None}),
    ((1, 2.5, True), [1, 2.5, True]),
    ({1: "int key", "s": "x"}, {"1": "int key", "s": "x"}),   # left to Python's json
    (1 << 70, 1 << 70),                                        # likewise
    ("\x00\n\u2028 𝄞", "\x00\n\u2028 𝄞"),
    (None, None),
    ({"blob": "y" * 100000}, {"blob": "y" * 100000}),          # past the 64 KiB buffer
]


@pytest.mark.parametrize("result,value", RESULTS, ids=range(len(RESULTS)))
def test_the_result_as_stored_and_replayed(store, operation, way, result, value):
    ran = []

    def fn(tx):
        assert isinstance(tx, idem.Transaction)
        assert tx.backend == store.backend
        ran.append(1)
        return result

    first = store.execute_local(operation, "k", {"a": 1}, fn)
    again = store.execute_local(operation, "k", {"a": 1}, fn)
    assert (first.value, first.replayed, first.recovered) == (value, False, False)
    assert (again.value, again.replayed) == (value, True)
    assert type(first.value) is type(value)
    assert ran == [1]
    assert stored(store, operation) == {"k": ("completed", value)}
    answered(way, 2)


class Odd(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)
        self.extra = b


@pytest.mark.parametrize("raised", [ValueError("no"), Odd("x", 2), idem.NotDone("not now"),
                                    KeyboardInterrupt(), SystemExit(3)],
                         ids=["ValueError", "Odd", "NotDone", "KeyboardInterrupt", "SystemExit"])
def test_what_the_function_raises_propagates_and_releases(store, operation, way, db, raised):
    side = db.create_table("side", "v TEXT NOT NULL")

    def fn(tx):
        tx.execute(db.sql("INSERT INTO %s (v) VALUES (?)" % side), ("written",))
        raise raised

    with pytest.raises(type(raised)) as info:
        store.execute_local(operation, "k", {"a": 1}, fn)
    assert info.value is raised  # the very object, with its arguments
    # The traceback reaches into fn.
    frames = []
    tb = info.value.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    assert "fn" in frames
    assert db.count(side) == 0  # rolled back with the record
    assert stored(store, operation) == {}
    out = store.execute_local(operation, "k", {"a": 1}, lambda tx: "second")
    assert (out.value, out.replayed) == ("second", False)
    answered(way, 2)


@pytest.mark.parametrize("result", [float("nan"), object(), {"s": 1j}, "\ud800"],
                         ids=["nan", "object", "complex", "surrogate"])
def test_a_result_json_cannot_write_rolls_back(store, operation, way, db, result):
    side = db.create_table("side", "v TEXT NOT NULL")

    def fn(tx):
        tx.execute(db.sql("INSERT INTO %s (v) VALUES (?)" % side), ("written",))
        return result

    with pytest.raises(TypeError, match="the function's result cannot be stored as JSON"):
        store.execute_local(operation, "k", {"a": 1}, fn)
    assert db.count(side) == 0
    assert stored(store, operation) == {}
    answered(way, 1)


def test_tx_ends_with_the_function(store, operation, way):
    kept = []
    store.execute_local(operation, "k", {}, lambda tx: kept.append(tx) or 1)
    with pytest.raises(idem.DatabaseError, match="the transaction has ended") as info:
        kept[0].execute("SELECT 1")
    assert info.value.code == "IDEM_ESTATE"
    # Also when the function raised.
    def fail(tx):
        kept.append(tx)
        raise ValueError("x")
    with pytest.raises(ValueError):
        store.execute_local(operation, "k2", {}, fail)
    with pytest.raises(idem.DatabaseError, match="the transaction has ended"):
        kept[1].execute("SELECT 1")
    answered(way, 2)


def test_a_function_calling_its_own_store_is_refused(store, store_url, operation, way,
                                                      tmp_path):
    """Its own store: refused (it would wait for the transaction it runs
    in); another store: allowed, and the guard is the outer store's again
    after it."""
    other_url = "sqlite:%s/other.db" % tmp_path
    seen = []
    with idem.open(other_url) as other:
        def inner(tx):
            with pytest.raises(idem.Error, match="calls its own store"):
                other.execute_local(operation, "nested", {}, lambda t: 1)
            return "inner"

        def fn(tx):
            with pytest.raises(idem.Error, match="calls its own store") as e:
                store.execute_local(operation, "nested", {}, lambda t: 1)
            seen.append(e.value.code)
            with pytest.raises(idem.Error, match="close\\(\\) inside a function"):
                store.close()
            seen.append(other.execute_local(operation, "o", {}, inner).value)
            with pytest.raises(idem.Error, match="calls its own store"):
                store.execute(operation, "nested2", {}, lambda: 1)
            seen.append("after")
            return "outer"

        out = store.execute_local(operation, "k", {}, fn)
    assert out.value == "outer"
    assert seen == ["IDEM_ESTATE", "inner", "after"]
    # Outside the function, the store is usable again on this thread.
    assert store.execute_local(operation, "k3", {}, lambda tx: 3).value == 3
    assert set(stored(store, operation)) == {"k", "k3"}
    name, counts = way
    assert counts[name] >= 3


def test_threads_each_run_their_own(store, operation, way):
    """16 threads, a key each and one shared: the guard is per thread (a
    function running on one thread does not refuse another thread's
    calls), and the shared key acts once."""
    ran = []
    lock = threading.Lock()
    barrier = threading.Barrier(16)
    errors = []

    def fn_for(i):
        def fn(tx):
            with lock:
                ran.append(i)
            return {"by": i}
        return fn

    def worker(i):
        try:
            barrier.wait()
            own = store.execute_local(operation, "own-%d" % i, {"i": i}, fn_for(i))
            shared = store.execute_local(operation, "shared", {}, fn_for(i), wait=30)
            assert own.value == {"by": i} and not own.replayed
            results.append(shared.value)
        except BaseException as e:  # noqa: B902
            errors.append(e)

    results = []
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 16 and len({json.dumps(r) for r in results}) == 1
    assert len(ran) == 17
    keys = stored(store, operation)
    assert len(keys) == 17 and keys["shared"] == ("completed", results[0])


def test_a_takeover_is_told_recovered(store, store_url, operation, way, effects):
    """A holder (a decorated call in another process, lease 1 s) acts and is
    killed; execute_local() with the same request takes the key over once
    the lease has run out and is told recovered, and so is its replay."""
    parent_end, child_end = SPAWN.Pipe()
    holder = SPAWN.Process(target=act_then_hang,
                           args=(store_url, operation, "k-1", effects.path, child_end))
    holder.start()
    try:
        ready = multiprocessing.connection.wait([parent_end, holder.sentinel], timeout=60)
        assert parent_end in ready, "the holder ended (%s) before acting" % holder.exitcode
        assert parent_end.recv() == "acting"
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
    assert holder.exitcode == -signal.SIGKILL

    def fn(tx):
        effects.add("retry")
        return {"ticket": effects.count()}

    request = {"title": TICKET["title"]}  # the decorated call's arguments but the key
    retry = store.execute_local(operation, "k-1", request, fn, wait="10s")
    later = store.execute_local(operation, "k-1", request, fn)
    assert (retry.value, retry.replayed, retry.recovered) == ({"ticket": 2}, False, True)
    assert (later.value, later.replayed, later.recovered) == ({"ticket": 2}, True, True)
    assert effects.lines() == ["pid %d" % holder.pid, "retry"]
    (record,) = records(store_url, operation)
    assert (record["state"], record["attempt"], record["recovered"]) == ("completed", 2, True)
    answered(way, 2, options=1)
