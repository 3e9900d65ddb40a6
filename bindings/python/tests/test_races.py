"""Many callers racing one key on the decorator: threads sharing a store,
processes with a store each, asyncio tasks. Exactly one effect (counted in
a file, which outlives every process), and every caller gets the same
value. The callers pass `wait`, so those that find the key in flight wait
for the holder's result instead of failing.
"""
import asyncio
import inspect
import multiprocessing
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from helpers import TICKET, race_in_process

SPAWN = multiprocessing.get_context("spawn")


def check_one_effect(effects, outs):
    """One effect; every caller has its value; one caller ran it."""
    values = [value for value, replayed in outs]
    assert effects.count() == 1
    assert all(v == values[0] for v in values), values
    assert [replayed for value, replayed in outs].count(False) == 1


def test_sixteen_threads_one_key_one_effect(store, operation, effects):
    @store.idempotent(operation, key="request_id", wait="30s")
    def create_ticket(project, title, request_id):
        effects.add(threading.current_thread().name)
        time.sleep(0.05)  # an effect that takes a while: the others find it in flight
        return {"ticket": uuid.uuid4().hex, "pid": os.getpid()}

    barrier = threading.Barrier(16, timeout=30)

    def caller(_):
        barrier.wait()
        out = create_ticket.outcome(TICKET["project"], TICKET["title"], request_id="race-1")
        return out.value, out.replayed

    with ThreadPoolExecutor(max_workers=16) as pool:
        outs = list(pool.map(caller, range(16), timeout=60))

    check_one_effect(effects, outs)
    assert create_ticket(TICKET["project"], TICKET["title"], request_id="race-1") == outs[0][0]


def test_sixteen_threads_on_one_store_one_local_mutation(store, db, operation):
    table = db.tickets_table()

    def insert(tx):
        ticket_id = tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?) RETURNING id"
                                      % table), ("{}",)).fetchone()[0]
        return {"ticket_id": ticket_id}

    barrier = threading.Barrier(16, timeout=30)

    def caller(_):
        barrier.wait()
        out = store.execute_local(operation, "race-1", TICKET, insert, wait="30s")
        return out.value, out.replayed

    with ThreadPoolExecutor(max_workers=16) as pool:
        outs = list(pool.map(caller, range(16), timeout=60))

    assert [value for value, replayed in outs] == [{"ticket_id": 1}] * 16
    assert [replayed for value, replayed in outs].count(False) == 1
    assert db.count(table) == 1


def test_eight_processes_one_key_one_effect(store_url, operation, effects):
    barrier = SPAWN.Barrier(8, timeout=60)
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=race_in_process,
                           args=(store_url, operation, "race-1", effects.path, barrier, results))
             for _ in range(8)]
    for p in procs:
        p.start()
    outs = [results.get(timeout=90) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0

    check_one_effect(effects, [(value, replayed) for value, replayed, recovered in outs])
    assert [recovered for value, replayed, recovered in outs] == [False] * 8
    # The one that acted is the process that wrote the effect.
    assert effects.lines() == ["pid %d" % outs[0][0]["pid"]]


def test_sixteen_asyncio_tasks_one_key_one_effect(store, operation, effects):
    @store.idempotent(operation, key="request_id", wait="30s")
    async def create_ticket(project, title, request_id):
        effects.add("task %s" % id(asyncio.current_task()))
        await asyncio.sleep(0.05)  # the others find it in flight meanwhile
        return {"ticket": uuid.uuid4().hex, "pid": os.getpid()}

    assert inspect.iscoroutinefunction(create_ticket)

    async def main():
        async def caller():
            out = await create_ticket.outcome(TICKET["project"], TICKET["title"],
                                              request_id="race-1")
            return out.value, out.replayed
        return await asyncio.gather(*[caller() for _ in range(16)])

    outs = asyncio.run(asyncio.wait_for(main(), 60))

    check_one_effect(effects, outs)


def test_a_waiting_task_does_not_block_the_event_loop(store, operation, effects):
    # The holder can only finish when the event loop runs it again: a waiter
    # that blocked the loop would keep it from finishing, and time out.
    events = {}

    @store.idempotent(operation, key="request_id", wait="10s")
    async def create_ticket(title, request_id):
        effects.add("holder")
        events["entered"].set()
        await events["go"].wait()
        return {"ticket": 1}

    async def main():
        events.update(entered=asyncio.Event(), go=asyncio.Event())
        holder = asyncio.create_task(create_ticket("t", request_id="k-1"))
        await events["entered"].wait()
        waiter = asyncio.create_task(create_ticket.outcome("t", request_id="k-1"))
        await asyncio.sleep(0)  # the waiter starts its call
        events["go"].set()
        return await holder, await waiter

    started = time.monotonic()
    value, waited = asyncio.run(asyncio.wait_for(main(), 30))

    assert value == {"ticket": 1}
    assert (waited.value, waited.replayed) == ({"ticket": 1}, True)
    assert effects.lines() == ["holder"]
    assert time.monotonic() - started < 9, "the waiter ran out its wait"
