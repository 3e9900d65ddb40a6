"""The caller's context (contextvars) inside the function idem runs for it.

With SQLite's group commit, the thread that commits a batch runs every
caller's execute_local() function: each must still see its own caller's
context variables (a request's user, a logging context, Flask's g), never
another caller's nor the committing thread's. It runs in a copy of the
caller's context taken at the call, as asyncio.to_thread() runs a
function: what it sets there is seen neither by its caller nor by the
thread that ran it.

Every case counts the rows written, checks the identifiers each call got
back against the rows, and the user under which each row was written.
"""
import asyncio
import contextvars
import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from idem import _store

USER = contextvars.ContextVar("user", default=None)
# What a function sets in its context: seen by no one after it ran.
TOUCHED = contextvars.ContextVar("touched", default="untouched")

THREADS, CALLS = 8, 25


@pytest.fixture(params=["whole", "c", "python"])
def way(request, monkeypatch):
    """How execute_local() runs the function: whole in C (local_call()), in
    C from the call made in Python (local()), or from cffi's callback
    (idem_py_local()); the ways off are answered NotImplemented."""
    def off(*args):
        return NotImplemented

    if request.param in ("c", "python"):
        monkeypatch.setattr(_store, "_local_call", off)
    if request.param == "python":
        monkeypatch.setattr(_store, "_fast_local", off)
    return request.param


def orders_table(db):
    return db.create_table("orders", db.id_column + ", user_no INTEGER NOT NULL, "
                           "call_no INTEGER NOT NULL")


def insert_order(db, table, call_no):
    """An execute_local() function that writes an order under the user of
    the context it runs in, and says which user and thread that was."""
    def insert(tx):
        user = USER.get()
        TOUCHED.set("set by user %s's function" % user)
        order_id = tx.execute(db.sql("INSERT INTO %s (user_no, call_no) VALUES (?, ?) "
                                     "RETURNING id" % table), (user, call_no)).fetchone()[0]
        return {"order_id": order_id, "user": user}
    return insert


def check_orders(db, table, got):
    """got: (user, call_no, value) of every call. Every call got its own
    order, under its own user, and every row is one of them."""
    wrong = sum(1 for user, call_no, value in got if value["user"] != user)
    assert wrong == 0, "%d of %d calls ran under another user's context" % (wrong, len(got))
    rows = {order_id: (user_no, call_no) for order_id, user_no, call_no in
            db.rows("SELECT id, user_no, call_no FROM %s" % table)}
    assert len(rows) == len(got)
    assert sorted(v["order_id"] for _, _, v in got) == sorted(rows)
    for user, call_no, value in got:
        assert rows[value["order_id"]] == (user, call_no)


def request_of(user, call_no, way):
    request = {"user": user, "call": call_no}
    if way == "python":
        request["big"] = 1 << 70  # a value idem._speedups leaves to Python's json
    return request


def test_each_thread_s_function_runs_in_its_own_context(store, db, operation, way):
    table = orders_table(db)
    barrier = threading.Barrier(THREADS, timeout=30)

    def caller(user):
        USER.set(user)
        barrier.wait()
        got = []
        for i in range(CALLS):
            call_no = user * 1000 + i
            out = store.execute_local(operation, "order-%d" % call_no,
                                      request_of(user, call_no, way),
                                      insert_order(db, table, call_no))
            assert (out.replayed, out.recovered) == (False, False)
            got.append((user, call_no, out.value))
            # Neither the caller nor (for another caller's function) the
            # committing thread sees what a function set.
            if (USER.get(), TOUCHED.get()) != (user, "untouched"):
                touched.append((user, USER.get(), TOUCHED.get()))
        return got

    touched = []
    with ThreadPoolExecutor(THREADS) as pool:
        got = [g for part in pool.map(caller, range(1, THREADS + 1), timeout=120)
               for g in part]

    assert len(got) == THREADS * CALLS
    check_orders(db, table, got)
    assert touched == [], "%d of %d calls left their function's context variables set " \
        "in the caller's context" % (len(touched), len(got))
    # A replay runs nothing and answers the first call's order.
    user, call_no, value = got[0]
    USER.set(99)
    out = store.execute_local(operation, "order-%d" % call_no, request_of(user, call_no, way),
                              insert_order(db, table, call_no))
    assert (out.value, out.replayed) == (value, True)
    assert db.count(table) == THREADS * CALLS


def test_tasks_calling_execute_local_through_threads(store, db, operation, way):
    # The asyncio way to call execute_local(): asyncio.to_thread(), which
    # runs it in a copy of the task's context.
    table = orders_table(db)

    async def task(user):
        USER.set(user)
        got = []
        for i in range(CALLS // 5):
            call_no = user * 1000 + i
            out = await asyncio.to_thread(store.execute_local, operation,
                                          "order-%d" % call_no, request_of(user, call_no, way),
                                          insert_order(db, table, call_no))
            assert not out.replayed
            got.append((user, call_no, out.value))
        assert TOUCHED.get() == "untouched"
        return got

    async def main():
        parts = await asyncio.gather(*[task(u) for u in range(1, 2 * THREADS + 1)])
        return [g for part in parts for g in part]

    got = asyncio.run(asyncio.wait_for(main(), 120))
    assert len(got) == 2 * THREADS * (CALLS // 5)
    check_orders(db, table, got)


def test_decorated_functions_see_their_caller_s_context(store, operation, effects):
    # The decorator runs the function in the caller's thread (sync) or task
    # (async): each sees its caller's user, and the record is its own.
    @store.idempotent(operation + "_sync", key="order_key")
    def ship(item, order_key):
        effects.add("sync %s %s" % (USER.get(), order_key))
        return {"user": USER.get(), "order_key": order_key}

    @store.idempotent(operation + "_async", key="order_key")
    async def ship_async(item, order_key):
        await asyncio.sleep(0)  # the other tasks run meanwhile
        effects.add("async %s %s" % (USER.get(), order_key))
        return {"user": USER.get(), "order_key": order_key}

    barrier = threading.Barrier(THREADS, timeout=30)

    def caller(user):
        USER.set(user)
        barrier.wait()
        return [ship.outcome("book", "s-%d-%d" % (user, i)) for i in range(5)]

    with ThreadPoolExecutor(THREADS) as pool:
        outs = {u: part for u, part in zip(range(1, THREADS + 1),
                                           pool.map(caller, range(1, THREADS + 1), timeout=60))}

    async def task(user):
        USER.set(user)
        return [await ship_async.outcome("book", "a-%d-%d" % (user, i)) for i in range(5)]

    async def main():
        return await asyncio.gather(*[task(u) for u in range(1, THREADS + 1)])

    async_outs = dict(zip(range(1, THREADS + 1), asyncio.run(asyncio.wait_for(main(), 60))))
    for prefix, by_user in (("s", outs), ("a", async_outs)):
        for user, part in by_user.items():
            assert [(o.value, o.replayed) for o in part] == [
                ({"user": user, "order_key": "%s-%d-%d" % (prefix, user, i)}, False)
                for i in range(5)]
    lines = effects.lines()
    assert len(lines) == 2 * THREADS * 5
    assert sorted(lines) == sorted(
        "%s %d %s-%d-%d" % (way_, u, p, u, i) for way_, p in (("sync", "s"), ("async", "a"))
        for u in range(1, THREADS + 1) for i in range(5))


# --- A Flask app --------------------------------------------------------------


def flask_or_fail():
    try:
        import flask
        import werkzeug.serving
    except ImportError as e:
        pytest.fail("Flask is needed for this case (Debian's python3-flask: "
                    "scripts/deps.sh check installs it): %s" % e, pytrace=False)
    return flask, werkzeug.serving


def test_a_flask_app_writes_each_order_under_its_request_s_user(store, db, operation,
                                                                effects):
    # A threaded server (a thread per request, 8 clients at once): each
    # request sets its user in flask.g and in a ContextVar, and writes its
    # order through execute_local(), then sends its receipt through a
    # decorated function; both read the user from the request's context.
    flask, serving = flask_or_fail()
    table = orders_table(db)
    app = flask.Flask(__name__)

    @store.idempotent(operation + "_receipt", key="order_key")
    def send_receipt(order_id, order_key):
        effects.add("%s %s %d" % (flask.g.user, order_key, order_id))
        return {"receipt_for": flask.g.user}

    @app.before_request
    def who():
        flask.g.user = int(flask.request.headers["X-User"])
        USER.set(flask.g.user)

    @app.post("/orders/<key>")
    def place_order(key):
        def insert(tx):
            user = flask.g.user
            order_id = tx.execute(
                db.sql("INSERT INTO %s (user_no, call_no) VALUES (?, ?) RETURNING id"
                       % table), (user, flask.request.json["call"])).fetchone()[0]
            return {"order_id": order_id, "user": user, "var_user": USER.get()}
        out = store.execute_local(operation, key, flask.request.json, insert)
        receipt = send_receipt(out.value["order_id"], key)
        return flask.jsonify(order=out.value, replayed=out.replayed, receipt=receipt)

    server = serving.make_server("127.0.0.1", 0, app, threaded=True)
    serving_thread = threading.Thread(target=server.serve_forever, daemon=True)
    serving_thread.start()
    base = "http://127.0.0.1:%d" % server.server_port
    barrier = threading.Barrier(THREADS, timeout=30)

    def client(user):
        barrier.wait()
        got = []
        for i in range(20):
            call_no = user * 1000 + i
            req = urllib.request.Request(
                "%s/orders/order-%d" % (base, call_no), method="POST",
                data=json.dumps({"call": call_no}).encode(),
                headers={"X-User": str(user), "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer = json.loads(resp.read())
            assert answer["replayed"] is False
            assert answer["receipt"] == {"receipt_for": user}
            got.append((user, call_no, answer["order"]))
        return got

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            got = [g for part in pool.map(client, range(1, THREADS + 1), timeout=120)
                   for g in part]
    finally:
        server.shutdown()
        serving_thread.join(30)

    assert len(got) == THREADS * 20
    check_orders(db, table, got)
    assert [v["var_user"] for _, _, v in got] == [user for user, _, _ in got]
    assert sorted(effects.lines()) == sorted(
        "%d order-%d %d" % (user, call_no, value["order_id"]) for user, call_no, value in got)
