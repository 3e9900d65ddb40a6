"""async def without a thread per waiter: tasks that wait for a key in
flight (wait=) hold no thread, and a call on another key is not kept
behind them.

A holder task runs its function until the test sets a gate; a thousand
tasks then call the same key with wait=, and while they wait the test
counts the process's threads (/proc/self/task), against the count after a
first round of the same on another key (the store's pools, which have
fixed bounds, grown as far as that load takes them), and makes a call on an
unrelated key, which must finish while the holder still holds. Then the
gate opens: every waiter gets the holder's result, replayed, and the
function ran once for the key. Cancelled waiters and a cancelled holder
leave the key as it should be.
"""
import asyncio
import os

import idem


def os_threads():
    return len(os.listdir("/proc/self/task"))


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def until(pred, what, timeout=30):
    """Waits (on the loop) until pred() holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "never: " + what
        await asyncio.sleep(0.002)


def test_thousand_waiters_take_no_thread(store, operation):
    runs = []
    gates = {}

    @store.idempotent(operation, key="order_id", wait="60s")
    async def place(order_id):
        runs.append(order_id)
        if order_id in gates:
            await gates[order_id].wait()
        return {"order_id": order_id, "n": len(runs)}

    async def main():
        gate = gates["hot"] = asyncio.Event()
        # Warm: the store's own threads (group commit, its runners, at most
        # a fixed number each) exist, grown as far as this load takes them:
        # a first round of the same thousand waiters on another key.
        await asyncio.gather(*(place("warm-%d" % i) for i in range(32)))
        warm_gate = gates["warm-hot"] = asyncio.Event()
        warm_holder = asyncio.create_task(place("warm-hot"))
        await until(lambda: "warm-hot" in runs, "the warm holder runs")
        warm = [asyncio.create_task(place("warm-hot")) for _ in range(1000)]
        await asyncio.sleep(0.5)
        warm_gate.set()
        await asyncio.gather(warm_holder, *warm)
        before = os_threads()
        holder = asyncio.create_task(place("hot"))
        await until(lambda: "hot" in runs, "the holder runs")
        waiters = [asyncio.create_task(place("hot")) for _ in range(1000)]
        # Every waiter has asked at least once and is waiting: the loop
        # turned over many times, and none has an answer.
        for _ in range(200):
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        during = os_threads()
        assert not any(w.done() for w in waiters)
        other = await asyncio.wait_for(place("unrelated"), 10)
        assert not holder.done() and not any(w.done() for w in waiters), \
            "the unrelated call finished while the key was still held"
        during = max(during, os_threads())
        gate.set()
        results = await asyncio.gather(holder, *waiters)
        return before, during, other, results

    before, during, other, results = run(main())
    # The thread count is unchanged by a thousand waiting tasks (the old
    # binding gave each a thread of a 256-thread pool).
    assert during <= before + 1, (before, during)
    assert other["order_id"] == "unrelated"
    assert runs.count("hot") == 1
    assert {r["order_id"] for r in results} == {"hot"}
    assert len({r["n"] for r in results}) == 1  # the holder's result, replayed
    outcomes = run(place.outcome("hot"))
    assert outcomes.replayed and outcomes.value == results[0]


def test_cancelled_waiters_and_holder(store, operation):
    """Waiters cancelled while they wait end nothing: the holder's result
    reaches the others, and the function ran once."""
    runs = []
    gate = None

    @store.idempotent(operation, key="k", wait="60s")
    async def act(k):
        runs.append(k)
        await gate.wait()
        return {"k": k}

    async def main():
        nonlocal gate
        gate = asyncio.Event()
        holder = asyncio.create_task(act("a"))
        await until(lambda: runs == ["a"], "the holder runs")
        waiters = [asyncio.create_task(act("a")) for _ in range(50)]
        await asyncio.sleep(0.1)
        for w in waiters[:25]:
            w.cancel()
        gate.set()
        got = await asyncio.gather(holder, *waiters[25:])
        cancelled = await asyncio.gather(*waiters[:25], return_exceptions=True)
        again = await act("a")
        return got, cancelled, again

    got, cancelled, again = run(main())
    assert runs == ["a"]
    assert all(g == {"k": "a"} for g in got) and again == {"k": "a"}
    assert all(isinstance(c, asyncio.CancelledError) for c in cancelled)


def test_holder_cancelled_in_function_marks_unknown(store, operation):
    gate = None

    @store.idempotent(operation, key="k")
    async def act(k):
        await gate.wait()
        return {"k": k}

    async def main():
        nonlocal gate
        gate = asyncio.Event()
        t = asyncio.create_task(act("x"))
        await asyncio.sleep(0.2)
        t.cancel()
        await asyncio.gather(t, return_exceptions=True)
        try:
            await act("x")
        except idem.OutcomeUnknown:
            return "unknown"
        return "ran"

    assert run(main()) == "unknown"
