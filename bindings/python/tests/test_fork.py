"""fork() while other threads use a store.

A parent whose threads keep a store busy forks children that open a store
of their own, as the guide says: each child's claim ends (no IDEM_EBUSY,
no deadlock). The tests wait for events with a bound, never for a fixed
time: a child that does not answer within the bound is a deadlock, and is
killed.

SQLite keeps its locks of a file once per process, in memory a child
inherits, so a child of a process that had the file open cannot use that
file safely: idem.open() refuses it at once (IDEM_ESTATE), naming the way
that works (a "forkserver" or "spawn" pool, also tested here).
"""
import multiprocessing
import os
import select
import signal
import threading
import time

import pytest

import idem
from helpers import unique, worker_claim, worker_open

CHILDREN = int(os.environ.get("IDEM_TEST_FORK_CHILDREN", "24"))
CHILD_BOUND = 20.0  # seconds a child may take: more is a deadlock


class Hammer:
    """Threads calling a decorated function on store until stopped."""

    def __init__(self, store, threads=2):
        self.stop = threading.Event()
        self.calls = 0
        ready = threading.Barrier(threads + 1)
        op = unique("hammer")

        def loop(t):
            @store.idempotent(op, key="k")
            def work(k, x):
                return x
            work("t%d-first" % t, -1)
            ready.wait()  # every thread has made a call
            i = 0
            while not self.stop.is_set():
                work("t%d-%d" % (t, i), i)
                i += 1
                self.calls += 1

        self.threads = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
        for t in self.threads:
            t.start()
        ready.wait()

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def fork_child(child_url, operation, n):
    """Forks a child that opens child_url and claims one key: the child's
    answer ("ok", an error code, or "deadlock" when it gave none within
    CHILD_BOUND) and how long it took."""
    r, w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        code = "ok"
        try:
            os.close(r)
            with idem.open(child_url, busy_timeout="5s") as s:
                s.execute(operation, "child-%d" % n, {"n": n}, lambda: n)
        except idem.Error as e:
            code = e.code
        except BaseException as e:  # noqa: B902 - reported to the parent
            code = repr(e)
        finally:
            os.write(w, code.encode()[:500])
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], CHILD_BOUND)
        if ready:
            code = os.read(r, 1000).decode() or "died"
        else:
            code = "deadlock"
            if os.environ.get("IDEM_TEST_FORK_GDB"):  # where the child waits
                import subprocess
                with open(os.environ["IDEM_TEST_FORK_GDB"], "a") as f:
                    f.write(subprocess.run(["gdb", "-batch", "-p", str(pid), "-ex",
                                            "thread apply all bt 30"], capture_output=True,
                                           text=True).stdout)
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return code, time.monotonic() - start


@pytest.fixture
def busy_store(store_url):
    """A store that two threads of this process keep calling."""
    s = idem.open(store_url)
    hammer = Hammer(s)
    yield s
    hammer.close()
    assert hammer.calls > 0
    s.close()


def test_forked_children_open_their_own_store(busy_store, backend, store_url, tmp_path):
    """The guide's way: a child opens a store of its own. On PostgreSQL,
    the same store; on SQLite, a file the parent does not have open (see
    the next test for the parent's own file). Before the fork handlers
    (SQLite's mutexes held across fork()), 5 children in 32 deadlocked in
    sqlite3_malloc() on a mutex a thread of the parent held at the fork."""
    child_url = store_url if backend == "postgresql" else "sqlite:%s/child.db" % tmp_path
    op = unique("child")
    got = [fork_child(child_url, op, n)[0] for n in range(CHILDREN)]
    assert got == ["ok"] * CHILDREN


def test_forked_child_refuses_the_parents_sqlite_file(request, backend, store_url):
    """The parent's own SQLite file: refused at once with the way that
    works, rather than IDEM_EBUSY after the busy timeout (6 in 16 before)
    or a deadlock (1 in 16)."""
    if backend != "sqlite":
        pytest.skip("a PostgreSQL store has no per-process locks")
    request.getfixturevalue("busy_store")
    op = unique("child")
    for n in range(4):
        code, took = fork_child(store_url, op, n)
        assert code == "IDEM_ESTATE"
        assert took < 5.0  # at once: not after the 5 s busy timeout
    # The message names the way out.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            idem.open(store_url)
            msg = "opened"
        except BaseException as e:  # noqa: B902
            msg = str(e)
        os.write(w, msg.encode()[:2000])
        os._exit(0)
    os.close(w)
    ready, _, _ = select.select([r], [], [], CHILD_BOUND)
    msg = os.read(r, 4000).decode() if ready else "deadlock"
    os.close(r)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert "forkserver" in msg and "spawn" in msg and "process %d" % os.getpid() in msg


def test_forked_child_may_open_a_file_closed_before_the_fork(store_url, backend, tmp_path):
    """A store the parent closed before forking is no longer the parent's."""
    if backend != "sqlite":
        pytest.skip("SQLite only")
    idem.open(store_url).close()
    code, _ = fork_child(store_url, unique("child"), 0)
    assert code == "ok"


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_pool_workers_share_the_busy_file(busy_store, backend, store_url, method):
    """The safe way for the parent's own SQLite file (and any store): a pool
    whose workers start afresh and open the store in an initializer."""
    op = unique("pool")
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2, initializer=worker_open, initargs=(store_url,)) as pool:
        got = pool.starmap_async(worker_claim, [(op, n) for n in range(8)]).get(60)
    assert got == list(range(8))
