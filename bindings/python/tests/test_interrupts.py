"""Ctrl-C, and what the binding does with a key it was given meanwhile.

A SIGINT that reaches a caller blocked in libidem (waiting for a key in
flight) is raised by Python as soon as the claim returns: if the claim got
the key, nothing has run yet, and the key must be let go at once rather
than held (and renewed) until the process ends.
"""
import subprocess
import sys
import textwrap

import idem
from helpers import unique

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
