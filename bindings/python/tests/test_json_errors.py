"""A value that neither JSON nor idem's rule holds (a class of the
application's own), written by Python's json encoder (which the binding
builds once and shares): every failure is the same TypeError, and leaves
nothing behind in the encoder, neither memory nor a mark that would make
the next encoding of the same object a "Circular reference".
"""
import gc
import tracemalloc

import pytest

import idem
from helpers import records


class Opaque:
    """What no rule writes."""


WHEN = Opaque()
HELP = idem._values.HELP  # says how, standing alone (no file to look up)
NO_FORM = "a value of type Opaque has no JSON form: pass encoder= to turn it into one " + HELP


def message(excinfo):
    return str(excinfo.value)


def test_the_same_request_fails_alike_every_time(store, operation, effects):
    request = {"order": {"item": "book", "at": WHEN}}

    def act():
        effects.add("acted")
        return {"ok": True}

    got = []
    for _ in range(3):
        with pytest.raises(TypeError) as e:
            store.execute(operation, "k-1", request, act)
        got.append(message(e))
    assert got == ["the request cannot be written as JSON: " + NO_FORM] * 3
    # A request that holds itself is still a circular reference.
    loop = {"item": "book"}
    loop["self"] = loop
    for _ in range(2):
        with pytest.raises(TypeError, match="Circular reference detected"):
            store.execute(operation, "k-2", loop, act)
    assert effects.lines() == []
    assert records(store.url, operation) == []
    # The request in JSON's terms goes through, once.
    request["order"]["at"] = "2024-05-01T12:00:00"
    outs = [store.execute(operation, "k-1", request, act) for _ in range(2)]
    assert [(o.value, o.replayed) for o in outs] == [({"ok": True}, False), ({"ok": True}, True)]
    assert effects.lines() == ["acted"]


def test_the_same_argument_fails_alike_every_time(store, operation, effects):
    @store.idempotent(operation, key="request_id")
    def place(order, request_id):
        effects.add("placed %s" % request_id)
        return {"placed": request_id}

    order = {"item": "book", "at": WHEN}
    got = []
    for key in ("r-1", "r-1", "r-2"):
        with pytest.raises(TypeError) as e:
            place(order, key)
        got.append(message(e))
    assert got == ["the arguments cannot be written as JSON for the fingerprint: " +
                   NO_FORM] * 3
    assert effects.lines() == []
    assert records(store.url, operation) == []


def test_the_same_result_fails_alike_every_time(store, operation, effects):
    result = {"ticket": 7, "at": WHEN}

    @store.idempotent(operation, key="request_id")
    def open_ticket(title, request_id):
        effects.add("opened %s" % request_id)
        return result

    got = []
    for key in ("r-1", "r-2"):
        with pytest.raises(TypeError) as e:
            open_ticket("t", key)
        got.append(message(e))
    assert got == ["the function acted, but its result cannot be stored as JSON (the key "
                   "is marked unknown): a value of type Opaque has no JSON form: pass "
                   "encoder= to turn it into one, and decoder= to rebuild it " + HELP] * 2
    assert effects.lines() == ["opened r-1", "opened r-2"]
    assert sorted((r["key"], r["state"]) for r in records(store.url, operation)) == [
        ("r-1", "unknown"), ("r-2", "unknown")]
    with pytest.raises(idem.OutcomeUnknown):
        open_ticket("t", "r-1")
    assert effects.count() == 2


def test_failed_encodings_keep_no_memory(store, operation, effects):
    # The case (then a datetime, which idem's rule now writes): an
    # argument with no JSON form, a new one (and a new dict of arguments)
    # each call.
    @store.idempotent(operation, key="request_id")
    def place(item, at, request_id):
        effects.add("placed")
        return {"placed": request_id}

    def fail(n):
        refused = 0
        for i in range(n):
            try:
                place("book", Opaque(), "r-%d" % i)
            except TypeError as e:
                assert "a value of type Opaque has no JSON form" in str(e)
                refused += 1
        return refused

    fail(1000)  # what is made once (names, caches) is made now
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        refused = fail(20000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert refused == 20000
    assert grown < 64 * 1024, "%d bytes kept after 20000 failed encodings (%.0f a call)" % (
        grown, grown / 20000.0)
    assert effects.lines() == []
    assert records(store.url, operation) == []
