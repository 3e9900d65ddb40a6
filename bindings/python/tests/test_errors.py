"""Every way a call can end other than by acting once: the errors, the
exceptions of the function itself, keys in flight, dead holders, and what
decides whether two calls are the same request.

Effects are lines in a file (helpers.Effects): a count there is the number
of times a function really ran.
"""
import asyncio
import inspect
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

import idem
from helpers import TICKET, act_then_hang, records, resolve_completed

SPAWN = multiprocessing.get_context("spawn")


def ticket_tool(store, operation, effects, **options):
    """A decorated tool whose ticket number is the count of its effects."""
    @store.idempotent(operation, key="request_id", **options)
    def create_ticket(project, title, request_id, priority="normal"):
        effects.add(title)
        return {"ticket": effects.count(), "title": title}
    return create_ticket


def states(store_url, operation):
    return [r["state"] for r in records(store_url, operation)]


# --- Conflict, in flight, unknown ---------------------------------------------


def test_same_key_with_other_arguments_is_a_conflict(store, operation, effects):
    create = ticket_tool(store, operation, effects)
    first = create("demo", "Backlog", request_id="k-1")

    with pytest.raises(idem.Conflict) as caught:
        create("demo", "Another title", request_id="k-1")

    assert isinstance(caught.value, idem.Error)
    assert caught.value.code == "IDEM_CONFLICT"
    assert caught.value.message
    assert effects.count() == 1
    assert create("demo", "Backlog", request_id="k-1") == first == {"ticket": 1,
                                                                    "title": "Backlog"}


def test_key_in_flight_without_wait_raises_in_flight(store, operation, effects):
    entered, release = threading.Event(), threading.Event()

    @store.idempotent(operation, key="request_id", lease="20s")
    def create_ticket(title, request_id):
        effects.add(title)
        entered.set()
        assert release.wait(30)
        return {"ticket": 1}

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(create_ticket, "t", "k-1")
        try:
            assert entered.wait(30)
            with pytest.raises(idem.InFlight) as caught:
                create_ticket("t", request_id="k-1")
        finally:
            release.set()
        assert holder.result(30) == {"ticket": 1}

    assert isinstance(caught.value, idem.Error)
    assert caught.value.code.startswith("IDEM_")
    assert isinstance(caught.value.retry_after, float)
    assert 0 < caught.value.retry_after <= 20
    assert effects.count() == 1
    assert create_ticket("t", request_id="k-1") == {"ticket": 1}


def test_other_exception_marks_the_key_unknown(store, store_url, operation, effects):
    @store.idempotent(operation, key="request_id")
    def send_email(to, request_id):
        effects.add(to)
        raise RuntimeError("connection reset after the request was sent")

    with pytest.raises(RuntimeError, match="connection reset"):
        send_email("a@example.com", request_id="k-1")
    with pytest.raises(idem.OutcomeUnknown) as caught:
        send_email("a@example.com", request_id="k-1")

    assert isinstance(caught.value, idem.Error)
    assert caught.value.code.startswith("IDEM_")
    assert effects.count() == 1
    assert states(store_url, operation) == ["unknown"]


def test_replay_of_a_body_an_operator_stored(store, store_url, operation, effects, tmp_path):
    # Bodies the binding did not write: JSON with white space about it is
    # replayed as that JSON; one that is not JSON is refused, said so.
    @store.idempotent(operation, key="request_id")
    def send_email(to, request_id):
        effects.add(to)
        raise RuntimeError("connection reset after the request was sent")

    for key in ("k-spaced", "k-text"):
        with pytest.raises(RuntimeError):
            send_email("a@example.com", request_id=key)
    spaced, text = tmp_path / "spaced.json", tmp_path / "text"
    spaced.write_text(' \n{"sent": "a@example.com", "id": 7}\n')
    text.write_text("sent, id 7")
    resolve_completed(store_url, operation, "k-spaced", spaced)
    resolve_completed(store_url, operation, "k-text", text)

    for _ in range(2):  # the second from the replay cache
        out = send_email.outcome("a@example.com", request_id="k-spaced")
        assert (out.value, out.replayed) == ({"sent": "a@example.com", "id": 7}, True)
        with pytest.raises(idem.Error) as caught:
            send_email("a@example.com", request_id="k-text")
        assert caught.value.code == "IDEM_ECORRUPT"
        assert "not JSON" in str(caught.value)
        out = store.execute_local(operation, "k-spaced", {"to": "a@example.com"},
                                  lambda tx: 1)
        assert out.replayed and out.value == {"sent": "a@example.com", "id": 7}
    assert effects.count() == 2


@pytest.mark.parametrize("raised, options", [
    (idem.NotDone("validation failed: no such project"), {}),
    (KeyError("no such project"), {"release_on": (LookupError,)}),
], ids=["NotDone", "release_on"])
def test_function_that_did_not_act_releases_the_key(store, store_url, operation, effects,
                                                    raised, options):
    @store.idempotent(operation, key="request_id", **options)
    def create_ticket(project, request_id):
        effects.add(project)
        if effects.count() == 1:
            raise raised
        return {"ticket": effects.count()}

    with pytest.raises(type(raised)):
        create_ticket("demo", request_id="k-1")
    assert records(store_url, operation) == []

    retry = create_ticket.outcome("demo", request_id="k-1")

    assert (retry.value, retry.replayed, retry.recovered) == ({"ticket": 2}, False, False)
    assert effects.count() == 2
    assert states(store_url, operation) == ["completed"]


def test_exception_outside_release_on_still_marks_unknown(store, store_url, operation, effects):
    @store.idempotent(operation, key="request_id", release_on=(LookupError,))
    def create_ticket(project, request_id):
        effects.add(project)
        raise ConnectionError("timed out after sending")

    with pytest.raises(ConnectionError):
        create_ticket("demo", request_id="k-1")
    with pytest.raises(idem.OutcomeUnknown):
        create_ticket("demo", request_id="k-1")
    assert effects.count() == 1
    assert states(store_url, operation) == ["unknown"]


def test_unserialisable_return_marks_unknown_and_raises_type_error(store, store_url, operation,
                                                                   effects):
    @store.idempotent(operation, key="request_id")
    def create_ticket(project, request_id):
        effects.add(project)
        return {"ticket": object()}

    with pytest.raises(TypeError):
        create_ticket("demo", request_id="k-1")
    with pytest.raises(idem.OutcomeUnknown):
        create_ticket("demo", request_id="k-1")
    assert effects.count() == 1
    assert states(store_url, operation) == ["unknown"]


def test_keyboard_interrupt_marks_unknown_not_released(store, store_url, operation, effects):
    @store.idempotent(operation, key="request_id")
    def create_ticket(project, request_id):
        effects.add(project)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        create_ticket("demo", request_id="k-1")
    with pytest.raises(idem.OutcomeUnknown):
        create_ticket("demo", request_id="k-1")
    assert effects.count() == 1
    assert states(store_url, operation) == ["unknown"]


# --- Keys and stores that are refused -----------------------------------------

BAD_KEYS = ["has space", "line\nbreak", "", "x" * 256]


@pytest.mark.parametrize("key", BAD_KEYS, ids=["space", "newline", "empty", "too-long"])
def test_bad_key_is_refused_before_anything_runs(store, store_url, operation, effects, key):
    create = ticket_tool(store, operation, effects)

    with pytest.raises(idem.Error) as decorated:
        create("demo", "Backlog", request_id=key)
    with pytest.raises(idem.Error) as local:
        store.execute_local(operation, key, {"title": "Backlog"},
                            lambda tx: effects.add("local"))
    with pytest.raises(idem.Error) as plain:
        store.execute(operation, key, {"title": "Backlog"}, lambda: effects.add("plain"))

    for caught in (decorated, local, plain):
        assert caught.value.code == "IDEM_EKEY"
        assert isinstance(caught.value, ValueError)
    assert effects.count() == 0
    assert records(store_url, operation) == []


def test_unreachable_postgresql_is_store_unavailable():
    with pytest.raises(idem.StoreUnavailable) as caught:
        idem.open("postgresql://idem@127.0.0.1:1/x?connect_timeout=2")

    assert isinstance(caught.value, idem.Error)
    assert caught.value.code == "IDEM_EUNAVAILABLE"
    assert "127.0.0.1" in caught.value.message


def test_sqlite_store_in_a_missing_folder_fails_clearly(tmp_path):
    path = tmp_path / "missing" / "idem.db"

    with pytest.raises(idem.Error) as caught:
        idem.open("sqlite:%s" % path)

    assert caught.value.code.startswith("IDEM_E")
    assert str(path) in caught.value.message
    assert not path.parent.exists()


# --- A holder that dies, and one that is still running ------------------------


def test_holder_killed_mid_call_is_taken_over_after_its_lease(store, store_url, operation,
                                                              effects):
    parent_end, child_end = SPAWN.Pipe()
    holder = SPAWN.Process(target=act_then_hang,
                           args=(store_url, operation, "k-1", effects.path, child_end))
    holder.start()

    @store.idempotent(operation, key="request_id")
    def impatient(title, request_id):
        effects.add("impatient")

    try:
        ready = multiprocessing.connection.wait([parent_end, holder.sentinel], timeout=60)
        assert parent_end in ready, "the holder ended (%s) before acting" % holder.exitcode
        assert parent_end.recv() == "acting"
        # Alive, it keeps renewing its 1 s lease: the key is in flight.
        with pytest.raises(idem.InFlight):
            impatient(TICKET["title"], request_id="k-1")
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
    assert holder.exitcode == -signal.SIGKILL

    @store.idempotent(operation, key="request_id", wait="10s")
    def create_ticket(title, request_id):
        effects.add("retry")
        return {"ticket": effects.count()}

    retry = create_ticket.outcome(TICKET["title"], request_id="k-1")
    later = create_ticket.outcome(TICKET["title"], request_id="k-1")

    assert (retry.value, retry.replayed, retry.recovered) == ({"ticket": 2}, False, True)
    assert (later.value, later.replayed, later.recovered) == ({"ticket": 2}, True, True)
    assert effects.lines() == ["pid %d" % holder.pid, "retry"]
    (record,) = records(store_url, operation)
    assert (record["state"], record["attempt"], record["recovered"]) == ("completed", 2, True)


def test_wait_returns_the_result_of_a_call_in_flight(store, operation, effects):
    entered, go = threading.Event(), threading.Event()

    def create_ticket(title, request_id):
        effects.add(title)
        entered.set()
        assert go.wait(30)
        return {"ticket": 1}

    holder_call = store.idempotent(operation, key="request_id")(create_ticket)
    waiter_call = store.idempotent(operation, key="request_id", wait=10)(create_ticket)

    with ThreadPoolExecutor(max_workers=2) as pool:
        holder = pool.submit(holder_call, "t", "k-1")
        try:
            assert entered.wait(30)
            waiter = pool.submit(waiter_call.outcome, "t", request_id="k-1")
            # It waits for the holder, rather than answering in flight.
            with pytest.raises(FutureTimeout):
                waiter.result(timeout=0.3)
        finally:
            go.set()
        out = waiter.result(30)
        assert holder.result(30) == {"ticket": 1}

    assert (out.value, out.replayed, out.recovered) == ({"ticket": 1}, True, False)
    assert effects.count() == 1


def test_wait_that_runs_out_raises_in_flight(store, operation, effects):
    entered, go = threading.Event(), threading.Event()

    @store.idempotent(operation, key="request_id")
    def hold(request_id):
        effects.add("holder")
        entered.set()
        assert go.wait(30)
        return {"ticket": 1}

    @store.idempotent(operation, key="request_id", wait="300ms")
    def impatient(request_id):
        effects.add("waiter")

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(hold, "k-1")
        try:
            assert entered.wait(30)
            started = time.monotonic()
            with pytest.raises(idem.InFlight) as caught:
                impatient(request_id="k-1")
            waited = time.monotonic() - started
        finally:
            go.set()
        assert holder.result(30) == {"ticket": 1}

    assert waited >= 0.25
    assert caught.value.retry_after > 0
    assert effects.lines() == ["holder"]


# --- What makes two calls the same request ------------------------------------


def test_payload_pointers_choose_what_is_fingerprinted(store, operation, effects):
    @store.idempotent(operation, key="request_id", payload=["/project", "/title"])
    def create_ticket(project, title, priority, request_id):
        effects.add(title)
        return {"ticket": effects.count(), "priority": priority}

    first = create_ticket("demo", "Backlog", "normal", request_id="k-1")
    # priority is outside the payload: a replay of the first result.
    again = create_ticket.outcome("demo", "Backlog", "urgent", request_id="k-1")
    # title is inside it: another request under the same key.
    with pytest.raises(idem.Conflict):
        create_ticket("demo", "Another title", "normal", request_id="k-1")

    assert first == {"ticket": 1, "priority": "normal"}
    assert (again.value, again.replayed) == (first, True)
    assert effects.count() == 1


def test_payload_pointers_reach_into_nested_arguments(store, operation, effects):
    @store.idempotent(operation, key="request_id", payload=["/ticket/title"])
    def create_ticket(ticket, request_id):
        effects.add(ticket["title"])
        return {"ticket": effects.count()}

    first = create_ticket({"title": "Backlog", "labels": ["ops"]}, request_id="k-1")
    again = create_ticket.outcome({"title": "Backlog", "labels": ["ops", "p1"]},
                                  request_id="k-1")
    with pytest.raises(idem.Conflict):
        create_ticket({"title": "Other", "labels": ["ops"]}, request_id="k-1")

    assert (again.value, again.replayed) == (first, True)
    assert effects.count() == 1


def test_defaults_are_part_of_the_fingerprint(store, operation, effects):
    create = ticket_tool(store, operation, effects)

    first = create("demo", "Backlog", "k-1")
    spelled_out = create.outcome("demo", "Backlog", "k-1", priority="normal")
    by_keyword = create.outcome(title="Backlog", project="demo", request_id="k-1")
    with pytest.raises(idem.Conflict):
        create("demo", "Backlog", "k-1", priority="urgent")

    assert (spelled_out.value, spelled_out.replayed) == (first, True)
    assert (by_keyword.value, by_keyword.replayed) == (first, True)
    assert effects.count() == 1


def test_tenants_keep_one_key_apart(store, store_url, operation, effects):
    def create_ticket(title, request_id):
        effects.add(title)
        return {"ticket": effects.count()}

    alpha = store.idempotent(operation, key="request_id", tenant="alpha")(create_ticket)
    beta = store.idempotent(operation, key="request_id", tenant="beta")(create_ticket)

    a = alpha("t", request_id="k-1")
    b = beta("t", request_id="k-1")

    assert (a, b) == ({"ticket": 1}, {"ticket": 2})
    assert alpha("t", request_id="k-1") == a
    assert beta("t", request_id="k-1") == b
    assert effects.count() == 2
    assert sorted(r["tenant"] for r in records(store_url, operation)) == ["alpha", "beta"]


def test_tenant_from_a_callable(store, store_url, operation, effects):
    @store.idempotent(operation, key="request_id", tenant=lambda args: args["customer"])
    def create_ticket(customer, title, request_id):
        effects.add(customer)
        return {"ticket": effects.count(), "customer": customer}

    acme = create_ticket("acme", "t", request_id="k-1")
    globex = create_ticket("globex", "t", request_id="k-1")
    acme_again = create_ticket.outcome("acme", "t", request_id="k-1")

    assert (acme, globex) == ({"ticket": 1, "customer": "acme"},
                              {"ticket": 2, "customer": "globex"})
    assert (acme_again.value, acme_again.replayed) == (acme, True)
    assert effects.count() == 2
    assert sorted(r["tenant"] for r in records(store_url, operation)) == ["acme", "globex"]


def test_key_from_a_callable(store, store_url, operation, effects):
    @store.idempotent(operation, key=lambda args: "%s-%d" % (args["project"], args["number"]))
    def create_ticket(project, number, title):
        effects.add(title)
        return {"ticket": effects.count()}

    first = create_ticket("demo", 7, "Backlog")
    again = create_ticket.outcome("demo", 7, "Backlog")
    other = create_ticket("demo", 8, "Backlog")
    # The key takes no argument out of the fingerprint.
    with pytest.raises(idem.Conflict):
        create_ticket("demo", 7, "Another title")

    assert (again.value, again.replayed) == (first, True)
    assert (first, other) == ({"ticket": 1}, {"ticket": 2})
    assert effects.count() == 2
    assert sorted(r["key"] for r in records(store_url, operation)) == ["demo-7", "demo-8"]


def test_fingerprint_is_canonical_json_with_exact_numbers(store, operation, effects):
    @store.idempotent(operation, key="request_id")
    def create_ticket(fields, count, request_id):
        effects.add(repr(count))
        return {"ticket": effects.count()}

    first = create_ticket({"title": "t", "labels": ["a"]}, 2 ** 70, request_id="k-1")
    # Member order and 1.0 for 1 are the same canonical JSON: a replay.
    reordered = create_ticket.outcome({"labels": ["a"], "title": "t"}, 2 ** 70,
                                      request_id="k-1")
    # An integer a double cannot tell from 2**70 is still another request.
    with pytest.raises(idem.Conflict):
        create_ticket({"title": "t", "labels": ["a"]}, 2 ** 70 + 1, request_id="k-1")
    create_ticket({"title": "t"}, 1, request_id="k-2")
    as_float = create_ticket.outcome({"title": "t"}, 1.0, request_id="k-2")

    assert first == {"ticket": 1}
    assert (reordered.value, reordered.replayed) == (first, True)
    assert (as_float.value, as_float.replayed) == ({"ticket": 2}, True)
    assert effects.count() == 2


def test_first_call_returns_what_its_replays_return(store, operation, effects):
    # The value is stored as JSON: the first call answers it JSON-decoded
    # too, so a caller never sees a tuple first and a list later.
    @store.idempotent(operation, key="request_id")
    def create_ticket(request_id):
        effects.add("ran")
        return (1, {2: "two"}, None)

    first = create_ticket("k-1")
    replay = create_ticket.outcome("k-1")

    assert first == [1, {"2": "two"}, None]
    assert (replay.value, replay.replayed) == (first, True)
    assert effects.count() == 1


def test_arguments_that_are_not_json_run_nothing(store, store_url, operation, effects):
    create = ticket_tool(store, operation, effects)

    with pytest.raises(TypeError):
        create("demo", object(), request_id="k-1")

    assert effects.count() == 0
    assert records(store_url, operation) == []


@pytest.mark.parametrize("option", [{"lease": "soon"}, {"wait": -1}, {"retention": "10"},
                                    {"lease": "31d"}], ids=["word", "negative", "no-unit",
                                                            "past-bound"])
def test_invalid_periods_are_refused(store, store_url, operation, effects, option):
    with pytest.raises(idem.Error) as caught:
        create = ticket_tool(store, operation, effects, **option)
        create("demo", "Backlog", request_id="k-1")

    assert caught.value.code == "IDEM_EINVAL"
    assert effects.count() == 0
    assert records(store_url, operation) == []


@pytest.mark.parametrize("lease, retention, wait, kept_ms", [
    (20, 3600, 0.5, 3600 * 1000),
    (2.5, "2m", "500ms", 120 * 1000),
    ("30s", "24h", "1s", 24 * 3600 * 1000),
], ids=["seconds", "fractions-and-units", "units"])
def test_periods_as_numbers_or_strings(store, store_url, operation, effects, lease, retention,
                                       wait, kept_ms):
    create = ticket_tool(store, operation, effects, lease=lease, retention=retention, wait=wait)

    first = create("demo", "Backlog", "k-1")
    again = create.outcome("demo", "Backlog", "k-1")

    assert (again.value, again.replayed) == (first, True)
    assert effects.count() == 1
    (record,) = records(store_url, operation)
    assert abs(record["expires_ms"] - record["updated_ms"] - kept_ms) < 1000


# --- async, and the calls without a decorator ---------------------------------


def test_async_function_is_a_coroutine_function_that_replays(store, store_url, operation,
                                                             effects):
    @store.idempotent(operation, key="request_id")
    async def create_ticket(title, request_id):
        await asyncio.sleep(0)
        effects.add(title)
        return {"ticket": effects.count()}

    @store.idempotent(operation + "_failing", key="request_id")
    async def send_email(to, request_id):
        effects.add(to)
        raise RuntimeError("timed out after sending")

    assert inspect.iscoroutinefunction(create_ticket)
    assert inspect.iscoroutinefunction(create_ticket.outcome)

    async def main():
        first = await create_ticket("t", request_id="k-1")
        again = await create_ticket.outcome("t", request_id="k-1")
        with pytest.raises(RuntimeError):
            await send_email("a@example.com", request_id="k-1")
        with pytest.raises(idem.OutcomeUnknown):
            await send_email("a@example.com", request_id="k-1")
        return first, again

    first, again = asyncio.run(main())

    assert first == {"ticket": 1}
    assert isinstance(again, idem.Outcome)
    assert (again.value, again.replayed, again.recovered) == (first, True, False)
    assert effects.lines() == ["t", "a@example.com"]
    assert states(store_url, operation + "_failing") == ["unknown"]


def test_cancelled_async_function_marks_unknown(store, store_url, operation, effects):
    events = {}

    @store.idempotent(operation, key="request_id")
    async def send_email(to, request_id):
        effects.add(to)
        events["sending"].set()
        await asyncio.Event().wait()  # never set: the caller gives up first

    async def main():
        events["sending"] = asyncio.Event()
        task = asyncio.create_task(send_email("a@example.com", request_id="k-1"))
        await events["sending"].wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(idem.OutcomeUnknown):
            await send_email("a@example.com", request_id="k-1")

    asyncio.run(asyncio.wait_for(main(), 30))

    assert effects.count() == 1
    assert states(store_url, operation) == ["unknown"]


def test_cancelled_waiting_task_leaves_the_key_free(store, store_url, operation, effects):
    # A task cancelled while it waits for a key in flight: its claim goes on
    # in a thread, and whatever it gets must be given back.
    events = {}

    @store.idempotent(operation, key="request_id", wait="10s")
    async def create_ticket(request_id):
        effects.add("run %d" % (effects.count() + 1))
        if effects.count() == 1:
            events["entered"].set()
            await events["go"].wait()
            raise idem.NotDone("gave up before acting")
        return {"ticket": effects.count()}

    async def main():
        events.update(entered=asyncio.Event(), go=asyncio.Event())
        holder = asyncio.create_task(create_ticket("k-1"))
        await events["entered"].wait()
        waiter = asyncio.create_task(create_ticket("k-1"))
        await asyncio.sleep(0)  # the waiter starts its call
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        events["go"].set()
        with pytest.raises(idem.NotDone):
            await holder
        return await create_ticket.outcome("k-1")

    final = asyncio.run(asyncio.wait_for(main(), 30))

    assert (final.value, final.replayed) == ({"ticket": 2}, False)
    assert effects.lines() == ["run 1", "run 2"]
    assert states(store_url, operation) == ["completed"]


def test_cancelled_waiting_task_whose_loop_ended_leaves_the_key_free(store, store_url,
                                                                     operation, effects):
    # As above, but the event loop is gone when the claim comes back: the
    # key must still be given back, not held (and its lease renewed) by a
    # claim nobody will end.
    entered, go = threading.Event(), threading.Event()

    @store.idempotent(operation, key="request_id")
    def hold(request_id):
        effects.add("holder")
        entered.set()
        assert go.wait(30)
        raise idem.NotDone("gave up before acting")

    @store.idempotent(operation, key="request_id", wait="10s")
    async def wait_for_it(request_id):
        effects.add("cancelled waiter")

    @store.idempotent(operation, key="request_id", wait="3s")
    def create_ticket(request_id):
        effects.add("final")
        return {"ticket": 1}

    async def wait_then_give_up():
        waiter = asyncio.create_task(wait_for_it("k-1"))
        await asyncio.sleep(0)  # the waiter starts its call
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    with ThreadPoolExecutor(max_workers=1) as pool:
        holder = pool.submit(hold, "k-1")
        try:
            assert entered.wait(30)
            asyncio.run(wait_then_give_up())
        finally:
            go.set()
        with pytest.raises(idem.NotDone):
            holder.result(30)

    final = create_ticket.outcome("k-1")

    assert (final.value, final.replayed) == ({"ticket": 1}, False)
    assert effects.lines() == ["holder", "final"]
    assert states(store_url, operation) == ["completed"]


def test_execute_runs_an_action_once_without_a_transaction(store, store_url, operation,
                                                           effects):
    def send():
        effects.add("sent")
        return {"message": "queued", "n": effects.count()}

    request = {"to": "a@example.com", "subject": "Your ticket"}
    first = store.execute(operation, "k-1", request, send)
    # Member order is not part of the request: canonical JSON sorts it.
    again = store.execute(operation, "k-1", {"subject": "Your ticket", "to": "a@example.com"},
                          send)
    with pytest.raises(idem.Conflict):
        store.execute(operation, "k-1", {**request, "subject": "Another"}, send)

    assert (first.value, first.replayed) == ({"message": "queued", "n": 1}, False)
    assert (again.value, again.replayed) == (first.value, True)
    assert effects.count() == 1
    assert states(store_url, operation) == ["completed"]


def test_execute_payload_pointers_choose_what_is_fingerprinted(store, operation, effects):
    def send():
        effects.add("sent")
        return {"n": effects.count()}

    request = {"to": "a@example.com", "trace": "attempt-1"}
    first = store.execute(operation, "k-1", request, send, payload=["/to"])
    again = store.execute(operation, "k-1", {**request, "trace": "attempt-2"}, send,
                          payload=["/to"])
    with pytest.raises(idem.Conflict):
        store.execute(operation, "k-1", {**request, "to": "b@example.com"}, send,
                      payload=["/to"])

    assert (first.value, again.value, again.replayed) == ({"n": 1}, {"n": 1}, True)
    assert effects.count() == 1


def test_execute_treats_exceptions_as_the_decorator_does(store, store_url, operation, effects):
    def not_done():
        effects.add("not done")
        raise idem.NotDone("rejected before sending")

    def crashes():
        effects.add("crashed")
        raise RuntimeError("timed out after sending")

    with pytest.raises(idem.NotDone):
        store.execute(operation, "k-1", {"n": 1}, not_done)
    assert records(store_url, operation) == []
    with pytest.raises(RuntimeError):
        store.execute(operation, "k-1", {"n": 1}, crashes)
    with pytest.raises(idem.OutcomeUnknown):
        store.execute(operation, "k-1", {"n": 1}, crashes)

    assert effects.lines() == ["not done", "crashed"]
    assert states(store_url, operation) == ["unknown"]


def test_execute_local_exception_rolls_back_and_releases(store, store_url, db, operation):
    tickets = db.tickets_table()
    calls = []

    def insert(tx):
        calls.append("insert")
        ticket_id = tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?) RETURNING id"
                                      % tickets), ("{}",)).fetchone()[0]
        if len(calls) == 1:
            raise ConnectionError("fails after its write")  # not NotDone: still released
        return {"ticket_id": ticket_id}

    with pytest.raises(ConnectionError):
        store.execute_local(operation, "k-1", {"title": "t"}, insert)
    assert db.count(tickets) == 0
    assert records(store_url, operation) == []

    retry = store.execute_local(operation, "k-1", {"title": "t"}, insert)
    replay = store.execute_local(operation, "k-1", {"title": "t"}, insert)

    assert retry.replayed is False
    assert (replay.value, replay.replayed) == (retry.value, True)
    assert calls == ["insert", "insert"]  # the replay ran nothing
    assert db.rows("SELECT id FROM %s" % tickets) == [(retry.value["ticket_id"],)]
    assert states(store_url, operation) == ["completed"]


def test_execute_local_unserialisable_result_rolls_back_and_releases(store, store_url, db,
                                                                    operation):
    tickets = db.tickets_table()
    results = [{"at": object()}, {"ticket": 1}]

    def insert(tx):
        tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?)" % tickets), ("{}",))
        return results.pop(0)

    with pytest.raises(TypeError):
        store.execute_local(operation, "k-1", {"title": "t"}, insert)
    assert db.count(tickets) == 0
    assert records(store_url, operation) == []

    retry = store.execute_local(operation, "k-1", {"title": "t"}, insert)

    assert (retry.value, retry.replayed) == ({"ticket": 1}, False)
    assert db.count(tickets) == 1
