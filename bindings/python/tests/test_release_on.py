"""release_on= with predicates (issue 54, item 11): a worker framework's
retry (Celery's autoretry_for, a plain retry loop) must find the key free
after a failure that proves nothing was done (a 502 from the API before it
acted), and refused after one that may have acted. A predicate, or a mix
of exception classes and predicates, says which is which; on both stores,
sync and async, the decorator's C path and its Python path, and execute().

Effects are lines in a file (helpers.Effects): a count there is the number
of times a function really ran.
"""
import asyncio

import pytest

import idem
from idem import _store
from helpers import records


class HTTPError(Exception):
    def __init__(self, status):
        super().__init__("HTTP %d" % status)
        self.status = status


def server_error(e):
    """The API answered 5xx before it acted (what the caller knows of it)."""
    return isinstance(e, HTTPError) and e.status >= 500


def flaky(effects, failures):
    """An action that raises failures' items one by one, then succeeds;
    each attempt counted."""
    def act(order, request_id):
        effects.add("attempt %s" % request_id)
        if failures:
            raise failures.pop(0)
        return {"charged": order, "attempt": effects.count()}
    return act


def decorate(store, operation, act, way, release_on):
    if way == "async":
        async def run(order, request_id):
            return act(order, request_id)
        fn = store.idempotent(operation, key="request_id", release_on=release_on)(run)
        return lambda *a: asyncio.run(fn.outcome(*a))
    return store.idempotent(operation, key="request_id", release_on=release_on)(act).outcome


def python_way(monkeypatch):
    """The decorator's call made in Python, both C ways turned off."""
    monkeypatch.setattr(_store, "_once_call", lambda *a: NotImplemented)
    monkeypatch.setattr(_store, "_fast_once", lambda *a: NotImplemented)


WAYS = ["c", "python", "async"]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("release_on", [
    server_error,
    (server_error,),
    [ConnectionRefusedError, lambda e: isinstance(e, HTTPError) and e.status in (502, 503)],
    HTTPError,
], ids=["predicate", "tuple", "mixed", "class-alone"])
def test_a_matched_exception_releases_the_key(store, operation, effects, monkeypatch, way,
                                             release_on):
    if way == "python":
        python_way(monkeypatch)
    call = decorate(store, operation, flaky(effects, [HTTPError(502), HTTPError(503)]), way,
                    release_on)

    raised = []
    for _ in range(2):  # what a worker's retries see
        with pytest.raises(HTTPError) as e:
            call("o-1", "k-1")
        raised.append(e.value.status)
        assert records(store.url, operation) == []  # released: nothing kept
    done = call("o-1", "k-1")
    again = call("o-1", "k-1")

    assert raised == [502, 503]
    assert (done.value, done.replayed) == ({"charged": "o-1", "attempt": 3}, False)
    assert (again.value, again.replayed) == (done.value, True)
    assert effects.lines() == ["attempt k-1"] * 3
    assert [r["state"] for r in records(store.url, operation)] == ["completed"]


@pytest.mark.parametrize("way", WAYS)
def test_an_unmatched_exception_marks_the_key_unknown(store, operation, effects, monkeypatch,
                                                      way):
    if way == "python":
        python_way(monkeypatch)
    release_on = (ConnectionRefusedError, server_error)
    call = decorate(store, operation, flaky(effects, [HTTPError(400), HTTPError(502)]), way,
                    release_on)

    with pytest.raises(HTTPError) as e:
        call("o-1", "k-1")
    with pytest.raises(idem.OutcomeUnknown):
        call("o-1", "k-1")

    assert e.value.status == 400
    assert effects.lines() == ["attempt k-1"]
    assert [r["state"] for r in records(store.url, operation)] == ["unknown"]
    # The class in the mix still releases.
    call2 = decorate(store, operation + "_refused",
                     flaky(effects, [ConnectionRefusedError("no route")]), way, release_on)
    with pytest.raises(ConnectionRefusedError):
        call2("o-2", "k-2")
    assert call2("o-2", "k-2").value == {"charged": "o-2", "attempt": 3}
    assert effects.count() == 3


@pytest.mark.parametrize("way", WAYS)
def test_a_predicate_that_raises_marks_the_key_unknown(store, operation, effects, monkeypatch,
                                                       way):
    # It cannot tell: the safe side, and the function's own exception
    # propagates, with a note that says what happened.
    if way == "python":
        python_way(monkeypatch)

    def broken(e):
        return e.status >= 500   # an AttributeError for anything but HTTPError

    call = decorate(store, operation, flaky(effects, [TimeoutError("no answer")]), way, broken)
    with pytest.raises(TimeoutError) as e:
        call("o-1", "k-1")
    with pytest.raises(idem.OutcomeUnknown):
        call("o-1", "k-1")
    assert effects.count() == 1
    assert [r["state"] for r in records(store.url, operation)] == ["unknown"]
    notes = getattr(e.value, "__notes__", None)
    if notes is not None:  # Python 3.11 and later
        assert len(notes) == 1 and "release_on" in notes[0] and "AttributeError" in notes[0]


def test_execute_takes_predicates_too(store, operation, effects):
    failures = [HTTPError(502), HTTPError(409)]

    def send():
        effects.add("attempt")
        if failures:
            raise failures.pop(0)
        return {"sent": True}

    with pytest.raises(HTTPError):
        store.execute(operation, "k-1", {"to": "ana"}, send, release_on=server_error)
    assert records(store.url, operation) == []
    with pytest.raises(HTTPError):
        store.execute(operation, "k-1", {"to": "ana"}, send,
                      release_on=[KeyError, server_error])
    with pytest.raises(idem.OutcomeUnknown):
        store.execute(operation, "k-1", {"to": "ana"}, send, release_on=server_error)
    assert effects.count() == 2
    assert [r["state"] for r in records(store.url, operation)] == ["unknown"]


def test_a_plain_retry_loop(store, operation, effects):
    # docs/python-examples.md's loop: retry what released the key, stop at the rest.
    failures = [HTTPError(503), ConnectionRefusedError("down"), HTTPError(502)]

    @store.idempotent(operation, key="payment_id",
                      release_on=(ConnectionRefusedError, server_error))
    def charge(account, cents, payment_id):
        effects.add("attempt")
        if failures:
            raise failures.pop(0)
        return {"charged": cents}

    attempts = 0
    for attempt in range(5):
        try:
            result = charge("acct-1", 500, "pay-1")
            break
        except (ConnectionRefusedError, HTTPError) as e:
            if isinstance(e, HTTPError) and not server_error(e):
                raise
            attempts += 1
    assert (result, attempts) == ({"charged": 500}, 3)
    assert charge.outcome("acct-1", 500, "pay-1").replayed
    assert effects.count() == 4


@pytest.mark.parametrize("bad", ["502", 502, (ValueError, None), [Exception, "x"]],
                         ids=["str", "int", "None-in-tuple", "str-in-list"])
def test_what_is_neither_a_class_nor_a_predicate_is_refused(store, operation, bad):
    with pytest.raises(TypeError, match="release_on"):
        store.idempotent(operation, key="request_id", release_on=bad)(lambda request_id: 1)
    with pytest.raises(TypeError, match="release_on"):
        store.execute(operation, "k-1", {}, lambda: 1, release_on=bad)
    assert records(store.url, operation) == []
