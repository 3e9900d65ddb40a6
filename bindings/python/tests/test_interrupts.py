"""Ctrl-C, and what the binding does with a key it was given meanwhile.

A SIGINT that reaches a caller blocked in libidem (waiting for a key in
flight) is raised by Python as soon as the claim returns: if the claim got
the key, nothing has run yet, and the key must be let go at once rather
than held (and renewed) until the process ends.
"""
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import idem
from helpers import records, unique

# Run apart from pytest, whose own SIGINT handling must not see the signal.
CHILD = textwrap.dedent('''
    import os, signal, sys, threading
    import idem

    url, operation, key = sys.argv[1:4]
    store = idem.open(url)
    main = threading.main_thread().ident
    ran = []
    held = threading.Event()

    @store.idempotent(operation, key="key", wait="60s")
    def job(n, key):
        ran.append(threading.current_thread().name)
        if threading.current_thread().name == "holder":
            held.set()
            # Once the main thread is blocked in the claim, waiting for this
            # key: SIGINT it, then let the key go without acting.
            while True:
                frame = sys._current_frames().get(main)
                if frame is not None and frame.f_code.co_name in ("_begin", "_once_in_c", "run"):
                    break
                threading.Event().wait(0.005)
            os.kill(os.getpid(), signal.SIGINT)
            raise idem.NotDone("the holder did not act")
        return "the waiter ran"

    def holder():
        try:
            job(1, key)
        except idem.NotDone:
            pass

    t = threading.Thread(target=holder, name="holder")
    try:
        t.start()
        held.wait(60)  # the holder has the key: this call waits for it
        print("returned", job(1, key))
    except KeyboardInterrupt:
        print("interrupted")
    t.join()
    print("ran", ",".join(ran))
''')


def test_ctrl_c_while_waiting_lets_go_of_the_key_it_got(store_url, effects):
    operation, key = unique("op"), unique("key")
    child = subprocess.run([sys.executable, "-c", CHILD, store_url, operation, key],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.split("\n")
    assert "interrupted" in lines, child.stdout
    assert "ran holder" in lines, child.stdout  # the waiter never ran its function

    # Another process finds the key free at once: no lease to wait out.
    with idem.open(store_url) as store:
        calls = []

        @store.idempotent(operation, key="key")
        def job(n, key):
            calls.append(n)
            return "another process ran"

        out = job.outcome(1, key)
    assert (out.value, out.replayed, out.recovered) == ("another process ran", False, False)
    assert calls == [1]


# A caller blocked in a claim that waits (wait=30) for a key held elsewhere.
WAITER = textwrap.dedent('''
    import sys, time
    import idem

    url, operation, key, way = sys.argv[1:5]
    store = idem.open(url)

    @store.idempotent(operation, key="key", wait=30)
    def job(key):
        print("ran", flush=True)
        return "the waiter ran"

    try:
        print("calling", flush=True)
        if way == "decorator":
            job(key)
        elif way == "execute":
            store.execute(operation, key, {}, lambda: print("ran", flush=True), wait=30)
        else:
            store.execute_local(operation, key, {}, lambda tx: print("ran", flush=True),
                                wait=30)
        print("returned", flush=True)
    except KeyboardInterrupt:
        print("interrupted %.6f" % time.monotonic(), flush=True)
''')


def _interrupt_waiter(store_url, operation, key, way):
    """Starts a waiter, SIGINTs it once it waits, and returns the seconds
    from the signal to its KeyboardInterrupt."""
    child = subprocess.Popen([sys.executable, "-c", WAITER, store_url, operation, key, way],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "calling\n"
        # Into its wait: the claim is asked, finds the key in flight and
        # waits (this is the time the item is about, not a race to win).
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        # On the code before the fix the wait ends only after 30 s: the
        # check below fails on that, not on a timeout.
        import select
        ready, _, _ = select.select([child.stdout], [], [], 20)
        assert ready, "no answer 20 s after SIGINT: the wait was not interrupted"
        line = child.stdout.readline()
        took = time.monotonic() - sent
        assert line.startswith("interrupted "), line + child.stderr.read()
        # Measured in the child too: from the signal sent to the exception.
        took = min(took, float(line.split()[1]) - sent)
        assert child.wait(60) == 0
        return took
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.parametrize("way", ["decorator", "execute", "execute_local"])
def test_ctrl_c_during_wait_is_honoured_at_once(store, store_url, way, effects):
    operation, key = unique("op"), unique("key")
    entered, release = threading.Event(), threading.Event()

    @store.idempotent(operation, key="key")
    def holder(key):
        entered.set()
        release.wait(120)
        effects.add("holder")
        return "the holder's"

    t = threading.Thread(target=holder, args=(key,))
    t.start()
    try:
        assert entered.wait(60)
        (before,) = records(store_url, operation)  # as libidem's program reads it
        assert (before["state"], before["attempt"]) == ("in_progress", 1)
        times = [_interrupt_waiter(store_url, operation, key, way) for _ in range(3)]
        times.sort()
        print("SIGINT to KeyboardInterrupt (%s, %s): median %.0f ms, all %s"
              % (way, store.backend, times[1] * 1000,
                 ", ".join("%.0f" % (x * 1000) for x in times)))
        assert times[-1] < 2.0, times  # 0.1 s unloaded; CI is loaded
        (after,) = records(store_url, operation)  # the key as it was: the holder's
        assert {k: v for k, v in after.items() if k not in ("lease_expires_ms", "updated_ms")} \
            == {k: v for k, v in before.items() if k not in ("lease_expires_ms", "updated_ms")}
    finally:
        release.set()
        t.join(60)
    assert effects.lines() == ["holder"]  # no waiter ran
    out = holder.outcome(key)
    assert (out.value, out.replayed, out.recovered) == ("the holder's", True, False)
