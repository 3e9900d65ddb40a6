"""idem._speedups: the C path of a call (the request written as JSON, the
claim, a replay decoded) must answer exactly as the Python path does.

A value the C encoder leaves to Python's json goes the Python way; a retry
that goes one way must replay the first call that went the other, since
both fingerprints are taken of the canonical JSON (RFC 8785); a replay the C
path cannot decode (white space about the body, a body past the buffer) is
read by Python.
"""
import enum
import json
import math

import pytest

import idem
from idem import _speedups, _store
from helpers import delete_record, records

LEFT_TO_PYTHON = [
    1 << 64,                    # past 64 bits
    -(1 << 63) - 1,
    {1: "a"},                   # json writes the key as "1"
    {"a": {2.5: "b"}},
    [True, {None: 1}],
]


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def nested(depth):
    v = "leaf"
    for _ in range(depth):
        v = [v]
    return v


WRITTEN_IN_C = [
    None, True, False, 0, -1, (1 << 63) - 1, -(1 << 63),
    0.0, -0.0, 0.1, 1.5, 1e16, 1e-7, 5e-324, 1.7976931348623157e308, -2.5e-300,
    "", "plain", "quote \" backslash \\ slash /", "\x00\x01\x1f\x7f tab\t nl\n",
    "é ü 𝄞 \u2028 \ufeff", "x" * 5000,
    [], {}, (1, "two", 3.0), {"a": [1, {"b": None}], "é": {"": []}},
    {"z": 1, "a": 2, "m": [3, 2, 1]}, nested(64),
]


@pytest.mark.parametrize("value", WRITTEN_IN_C, ids=range(len(WRITTEN_IN_C)))
def test_c_encoder_writes_the_value_json_reads(value):
    text = _speedups.dumps(value)
    assert text is not NotImplemented
    want = json.loads(json.dumps(value))
    got = json.loads(text.decode("utf-8"))
    assert got == want
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    if isinstance(value, float):  # the same double, with its sign
        assert math.copysign(1.0, got) == math.copysign(1.0, value)


@pytest.mark.parametrize("value", LEFT_TO_PYTHON + [
    float("nan"), float("inf"), Color.RED, Name("n"), "\ud800", nested(65),
    {"s": {1, 2}}, b"bytes", [object()]], ids=range(len(LEFT_TO_PYTHON) + 9))
def test_c_encoder_leaves_other_values_to_python(value):
    assert _speedups.dumps(value) is NotImplemented


def counting(monkeypatch, name):
    """Wraps _store's fast call name; counts its replays and its refusals
    of a value (NotImplemented)."""
    seen = {"replays": 0, "left": 0, "calls": 0}
    real = getattr(_store, name)

    def wrapper(*args):
        out = real(*args)
        seen["calls"] += 1
        if out is NotImplemented:
            seen["left"] += 1
        elif out.__class__ is idem.Outcome and out.replayed:
            seen["replays"] += 1
        return out

    monkeypatch.setattr(_store, name, wrapper)
    return seen


def once_in_python(monkeypatch):
    """The decorator's call made in Python, both C ways turned off."""
    monkeypatch.setattr(_store, "_once_call", lambda *a: NotImplemented)
    monkeypatch.setattr(_store, "_fast_once", lambda *a: NotImplemented)


@pytest.mark.parametrize("value", WRITTEN_IN_C + LEFT_TO_PYTHON + [Color.RED, Name("n")],
                         ids=range(len(WRITTEN_IN_C) + len(LEFT_TO_PYTHON) + 2))
def test_a_retry_by_either_path_replays_the_first(store, operation, monkeypatch, value):
    ran = []

    @store.idempotent(operation, key="key")
    def act(value, key):
        ran.append(key)
        return {"ran": key, "n": len(ran)}

    seen = counting(monkeypatch, "_once_call")  # the whole call in C
    first = act.outcome(value, key="c-first")
    again = act.outcome(value, key="c-first")
    assert (first.value, first.replayed) == ({"ran": "c-first", "n": 1}, False)
    assert (again.value, again.replayed) == ({"ran": "c-first", "n": 1}, True)
    in_c = _speedups.dumps({"value": value}) is not NotImplemented
    assert seen == {"calls": 2, "replays": 1 if in_c else 0, "left": 0 if in_c else 2}

    # The same arguments the other way: Python's json for the C-written
    # call's retry, and C for the one Python wrote (when C can write it).
    once_in_python(monkeypatch)
    out = act.outcome(value, key="c-first")
    assert (out.value, out.replayed) == ({"ran": "c-first", "n": 1}, True)
    monkeypatch.undo()
    once_in_python(monkeypatch)
    act.outcome(value, key="py-first")
    monkeypatch.undo()
    seen = counting(monkeypatch, "_once_call")
    out = act.outcome(value, key="py-first")
    assert (out.value, out.replayed) == ({"ran": "py-first", "n": 2}, True)
    assert seen["replays"] == (1 if in_c else 0)
    assert ran == ["c-first", "py-first"]
    # Other arguments under a used key: a conflict, whichever path.
    with pytest.raises(idem.Conflict):
        act.outcome([value, "other"], key="c-first")
    assert len(ran) == 2


def test_arguments_json_cannot_write_are_refused_before_a_claim(store, operation):
    ran = []

    @store.idempotent(operation, key="key")
    def act(value, key):
        ran.append(value)

    for bad in (float("nan"), "\ud800", {"s": 1j}):
        with pytest.raises(TypeError, match="cannot be written as JSON for the fingerprint"):
            act(bad, key="k")
    with pytest.raises(TypeError, match="request cannot be written as JSON"):
        store.execute_local(operation, "l", {"x": float("inf")}, lambda tx: 1)
    assert ran == []
    assert records(store.url, operation) == []


def test_execute_local_replays_by_either_path(store, operation, monkeypatch):
    calls = []

    def fn(tx):
        calls.append(1)
        return {"n": len(calls)}

    for request in ({"a": 1, "b": [1.5, "é"]}, {1: "int key"}, {"big": 1 << 70}):
        key = "k%d" % len(calls)
        first = store.execute_local(operation, key, request, fn)
        seen = counting(monkeypatch, "_local_call")  # the whole call in C
        again = store.execute_local(operation, key, request, fn)
        monkeypatch.undo()
        monkeypatch.setattr(_store, "_local_call", lambda *a: NotImplemented)
        monkeypatch.setattr(_store, "_fast_local", lambda *a: NotImplemented)
        python = store.execute_local(operation, key, request, fn)
        monkeypatch.undo()
        assert first.value == again.value == python.value == {"n": len(calls)}
        assert (first.replayed, again.replayed, python.replayed) == (False, True, True)
        in_c = _speedups.dumps(request) is not NotImplemented
        assert seen["replays"] == (1 if in_c else 0)
    assert len(calls) == 3


def test_large_requests_and_results(store, operation, monkeypatch):
    """A request past the encoder's stack buffer, and a result past the
    claim's 64 KiB buffer (left to Python, which reads it from the call)."""
    big_arg = {"text": "é" * 40000, "list": list(range(5000))}

    @store.idempotent(operation, key="key")
    def act(arg, size, key):
        return {"blob": "y" * size, "len": len(arg["text"])}

    seen = counting(monkeypatch, "_once_call")
    for size, key in ((10, "small"), (200000, "large")):
        first = act.outcome(big_arg, size, key=key)
        again = act.outcome(big_arg, size, key=key)
        assert first.value == again.value == {"blob": "y" * size, "len": 40000}
        assert (first.replayed, again.replayed) == (False, True)
    # The small result replayed in C, the large one in Python.
    assert seen == {"calls": 4, "replays": 1, "left": 0}



@pytest.mark.parametrize("way", ["c", "python"])
def test_an_ending_that_fails_keeps_the_value(store, operation, monkeypatch, way):
    """The function ran, but its record was deleted meanwhile (an
    operator's act): storing the result fails, and the error raised carries
    what the function returned, decoded as stored, by either path."""
    if way == "python":
        once_in_python(monkeypatch)
    ran = []

    @store.idempotent(operation, key="key")
    def act(n, key):
        ran.append(n)
        delete_record(store.url, operation, key)
        return {"n": n, "t": (1, 2)}

    with pytest.raises(idem.Error) as info:
        act(5, key="gone")
    assert info.value.value == {"n": 5, "t": [1, 2]}
    assert info.value.code != "IDEM_OK" and info.value.message
    assert ran == [5]
    assert records(store.url, operation) == []
