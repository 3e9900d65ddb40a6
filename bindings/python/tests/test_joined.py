"""conn=: the application's own transaction.

A decorated function (or execute_local()) given the application's
connection writes its record there, inside the transaction the
application has open: the application's commit keeps the effect and the
record, its rollback drops both and frees the key. Cases: a Flask handler
whose later step fails, a psycopg transaction, SQLAlchemy's connection, two
transactions on one key (the second waits, then replays the first one's
answer), an exception in the function, and what is refused. Every case
counts the orders written (the effect) and checks the order ids answered.
"""
import sqlite3
import threading
import time

import pytest

import idem
from conftest import pg_url
from helpers import unique


def psycopg_or_fail():
    try:
        import psycopg
    except ImportError as e:
        pytest.fail("psycopg 3 is needed for this case (Debian's python3-psycopg: "
                    "scripts/deps.sh check installs it): %s" % e, pytrace=False)
    return psycopg


def connect(backend, store_url):
    """The application's own connection to the store's database."""
    if backend == "sqlite":
        return sqlite3.connect(store_url[len("sqlite:"):], timeout=60,
                               check_same_thread=False)
    return psycopg_or_fail().connect(store_url)


def q(backend, sql):
    """SQL in SQLite's style (?) for the connection's driver (%s)."""
    return sql if backend == "sqlite" else sql.replace("?", "%s")


@pytest.fixture
def orders(backend, store_url, store):
    """A table of orders beside the store, and a way to count them on a
    connection of their own."""
    name = unique("orders")
    with connect(backend, store_url) as c:
        c.execute("CREATE TABLE %s (id %s, item TEXT NOT NULL)" % (
            name, "INTEGER PRIMARY KEY" if backend == "sqlite" else "BIGSERIAL PRIMARY KEY"))
        c.commit()

    def count(where="TRUE" if backend == "postgresql" else "1"):
        c = connect(backend, store_url)
        try:
            return c.execute("SELECT COUNT(*) FROM %s WHERE %s" % (name, where)).fetchone()[0]
        finally:
            c.close()
    yield name, count
    with connect(backend, store_url) as c:
        c.execute("DROP TABLE %s" % name)
        c.commit()


def order_function(store, backend, operation, table, runs, **conn):
    """A decorated function that writes one order through the
    application's connection db and returns its id."""
    @store.idempotent(operation, key="request_id", **conn)
    def place_order(db, item, request_id):
        runs.append(request_id)
        cur = db.execute(q(backend, "INSERT INTO %s (item) VALUES (?) RETURNING id" % table),
                         (item,))
        return {"order_id": cur.fetchone()[0]}
    return place_order


def test_the_application_s_rollback_drops_the_record_and_the_effect(
        backend, store_url, store, orders, operation):
    table, count = orders
    runs = []
    place_order = order_function(store, backend, operation, table, runs, conn="db")
    db = connect(backend, store_url)
    try:
        # The application writes first (on SQLite it then holds the write
        # lock, which the record needs too: it is written on this same
        # connection, so nothing waits).
        db.execute(q(backend, "INSERT INTO %s (item) VALUES (?)" % table), ("audit",))
        first = place_order(db, "book", request_id="r-1")
        assert first["order_id"] > 0
        assert count() == 0 and store.get(operation, "r-1") is None  # not committed
        db.rollback()
        assert count() == 0
        assert store.get(operation, "r-1") is None  # the key is free again
        # The retry acts, once; committed, both are kept.
        second = place_order.outcome(db, "book", request_id="r-1")
        assert not second.replayed
        db.commit()
        assert count() == 1 and runs == ["r-1", "r-1"]
        record = store.get(operation, "r-1")
        assert record.state == "completed"
        assert record.value == second.value
        # A retry after the commit replays it, in a transaction or not.
        again = place_order.outcome(db, "book", request_id="r-1")
        db.commit()
        assert again.replayed and again.value == second.value
        assert count() == 1 and len(runs) == 2
        # Other arguments under the key: Conflict, nothing written.
        with pytest.raises(idem.Conflict):
            place_order(db, "lamp", request_id="r-1")
        db.commit()
        assert count() == 1 and len(runs) == 2
    finally:
        db.close()


def test_execute_local_with_conn_runs_tx_on_the_application_s_connection(
        backend, store_url, store, orders, operation):
    table, count = orders
    db = connect(backend, store_url)
    try:
        def place(tx):
            sql = "INSERT INTO %s (item) VALUES (?) RETURNING id" % table
            if backend == "postgresql":
                sql = sql.replace("?", "$1")
            return {"order_id": tx.execute(sql, ("pen",)).fetchone()[0]}
        out = store.execute_local(operation, "k-1", {"item": "pen"}, place, conn=db)
        assert not out.replayed
        assert count() == 0
        db.commit()
        assert count() == 1
        again = store.execute_local(operation, "k-1", {"item": "pen"}, place, conn=db)
        db.commit()
        assert again.replayed and again.value == out.value
        # And through the store's own connection.
        assert store.execute_local(operation, "k-1", {"item": "pen"}, place).value == out.value
        assert count() == 1
    finally:
        db.close()


def test_an_exception_in_the_function_frees_the_key_and_keeps_the_transaction(
        backend, store_url, store, orders, operation):
    table, count = orders
    db = connect(backend, store_url)
    try:
        @store.idempotent(operation, key="request_id", conn="db")
        def place_order(db, item, request_id):
            db.execute(q(backend, "INSERT INTO %s (item) VALUES (?)" % table), (item,))
            raise ValueError("out of stock")

        db.execute(q(backend, "INSERT INTO %s (item) VALUES (?)" % table), ("before",))
        with pytest.raises(ValueError, match="out of stock"):
            place_order(db, "book", request_id="r-9")
        db.commit()
        # The application's own write stays; the function's went with its
        # savepoint, and so did the record.
        assert count() == 1
        assert count("item = 'before'") == 1
        assert store.get(operation, "r-9") is None
    finally:
        db.close()


def test_a_flask_handler_whose_later_step_fails_leaves_no_order_and_no_record(
        backend, store_url, store, orders, operation):
    from test_context import flask_or_fail
    flask, _ = flask_or_fail()
    table, count = orders
    runs = []
    app = flask.Flask(__name__)

    # The connection comes from the request (conn= a callable): no
    # argument carries it.
    @store.idempotent(operation, key="request_id", conn=lambda: flask.g.db)
    def place_order(item, request_id):
        runs.append(request_id)
        cur = flask.g.db.execute(
            q(backend, "INSERT INTO %s (item) VALUES (?) RETURNING id" % table), (item,))
        return {"order_id": cur.fetchone()[0]}

    # The application's usual shape: a connection per request, committed
    # when the handler returns, rolled back when it raises.
    @app.before_request
    def open_db():
        flask.g.db = connect(backend, store_url)

    @app.teardown_request
    def close_db(exc):
        db = flask.g.pop("db")
        if exc is None:
            db.commit()
        else:
            db.rollback()
        db.close()

    @app.post("/orders")
    def create():
        body = flask.request.get_json()
        key = flask.request.headers["Idempotency-Key"]
        out = place_order.outcome(body["item"], request_id=key)
        if body.get("card") == "declined":  # a later step of the same request
            raise RuntimeError("payment declined")
        return {"order": out.value, "replayed": out.replayed}

    app.config["PROPAGATE_EXCEPTIONS"] = False
    client = app.test_client()
    declined = client.post("/orders", json={"item": "book", "card": "declined"},
                           headers={"Idempotency-Key": "k-7"})
    assert declined.status_code == 500
    assert count() == 0
    assert store.get(operation, "k-7") is None
    assert runs == ["k-7"]
    ok = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-7"})
    assert ok.status_code == 200 and ok.json["replayed"] is False
    order_id = ok.json["order"]["order_id"]
    assert count() == 1 and runs == ["k-7", "k-7"]
    again = client.post("/orders", json={"item": "book"}, headers={"Idempotency-Key": "k-7"})
    assert again.status_code == 200
    assert again.json == {"order": {"order_id": order_id}, "replayed": True}
    assert count() == 1 and len(runs) == 2


def await_waiting(backend, store_url, second, traced):
    """Until the second transaction waits for the first: PostgreSQL shows
    its backend waiting on a lock; SQLite's trace shows it sent the
    statement that takes the write lock."""
    deadline = time.monotonic() + 60
    if backend == "postgresql":
        pid = second.info.backend_pid
        with connect(backend, store_url) as watcher:
            watcher.autocommit = True
            while time.monotonic() < deadline:
                if watcher.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = %s "
                                   "AND wait_event_type = 'Lock'", (pid,)).fetchone()[0]:
                    return
                time.sleep(0.01)
    elif traced.wait(60):
        return
    pytest.fail("the second transaction never waited for the first")


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_second_transaction_on_the_key_waits_for_the_first(
        backend, store_url, store, orders, operation, first_ends):
    table, count = orders
    runs = []
    place_order = order_function(store, backend, operation, table, runs, conn="db")
    first, second = connect(backend, store_url), connect(backend, store_url)
    traced = threading.Event()
    if backend == "sqlite":
        second.set_trace_callback(
            lambda sql: traced.set() if sql.startswith(("BEGIN", "UPDATE idem_meta")) else None)
    got = {}

    def in_second():
        try:
            got["out"] = place_order.outcome(second, "book", request_id="r-2")
            second.commit()
        except BaseException as e:  # noqa: B902 - reported below
            got["error"] = e
    try:
        mine = place_order.outcome(first, "book", request_id="r-2")
        thread = threading.Thread(target=in_second)
        thread.start()
        await_waiting(backend, store_url, second, traced)
        getattr(first, first_ends)()
        thread.join(60)
        assert not thread.is_alive()
        assert "error" not in got, got.get("error")
        out = got["out"]
        if first_ends == "commit":
            assert out.replayed and out.value == mine.value
            assert runs == ["r-2"]
        else:
            assert not out.replayed
            assert runs == ["r-2", "r-2"]
        assert count("id = %d" % out.value["order_id"]) == 1
        assert count() == 1
        assert store.get(operation, "r-2").value == out.value
    finally:
        first.close()
        second.close()


def test_a_psycopg_transaction(operation):
    psycopg = psycopg_or_fail()
    store_pg = idem.open(pg_url())
    table = unique("payments")
    runs = []
    try:
        with psycopg.connect(pg_url(), autocommit=True) as conn:
            conn.execute("CREATE TABLE %s (id BIGSERIAL PRIMARY KEY, cents INTEGER)" % table)

            @store_pg.idempotent(operation, key="key", conn="conn")
            def charge(conn, cents, key):
                runs.append(key)
                row = conn.execute("INSERT INTO %s (cents) VALUES (%%s) RETURNING id" % table,
                                   (cents,)).fetchone()
                return {"payment_id": row[0]}

            # Autocommit with no transaction: refused, nothing written.
            with pytest.raises(idem.InvalidArgument, match="autocommit"):
                charge(conn, 500, key="p-1")
            # Rolled back by an exception after the charge: nothing kept.
            with pytest.raises(RuntimeError):
                with conn.transaction():
                    charge(conn, 500, key="p-1")
                    raise RuntimeError("the receipt could not be written")
            assert conn.execute("SELECT COUNT(*) FROM %s" % table).fetchone()[0] == 0
            assert store_pg.get(operation, "p-1") is None
            with conn.transaction():
                paid = charge(conn, 500, key="p-1")
            with conn.transaction():
                assert charge(conn, 500, key="p-1") == paid
            assert conn.execute("SELECT COUNT(*) FROM %s" % table).fetchone()[0] == 1
            assert runs == ["p-1", "p-1"]
            assert store_pg.get(operation, "p-1").value == paid
            conn.execute("DROP TABLE %s" % table)
    finally:
        store_pg.close()


def test_sqlalchemy_s_connection_joins_too(tmp_path, operation):
    try:
        import sqlalchemy
    except ImportError as e:
        pytest.fail("SQLAlchemy is needed for this case (Debian's python3-sqlalchemy): %s"
                    % e, pytrace=False)
    path = tmp_path / "app.db"
    store = idem.open("sqlite:%s" % path)
    engine = sqlalchemy.create_engine("sqlite:///%s" % path)
    runs = []
    try:
        with engine.begin() as conn:
            conn.execute(sqlalchemy.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, "
                                         "item TEXT)"))

        @store.idempotent(operation, key="key", conn="conn")
        def place(conn, item, key):
            runs.append(key)
            result = conn.execute(sqlalchemy.text(
                "INSERT INTO orders (item) VALUES (:item) RETURNING id"), {"item": item})
            return {"order_id": result.scalar_one()}

        with pytest.raises(RuntimeError):
            with engine.begin() as conn:
                place(conn, "book", key="s-1")
                raise RuntimeError("rolled back")
        assert store.get(operation, "s-1") is None
        with engine.begin() as conn:
            first = place(conn, "book", key="s-1")
        # The pool's raw DB-API connection is taken as well.
        raw = engine.raw_connection()
        try:
            assert store.execute_local(operation, "s-1", {"item": "book"},
                                       lambda tx: None, conn=raw).value == first
            raw.commit()
        finally:
            raw.close()
        with engine.connect() as conn:
            assert conn.execute(sqlalchemy.text("SELECT COUNT(*) FROM orders")).scalar() == 1
        assert runs == ["s-1", "s-1"]
    finally:
        engine.dispose()
        store.close()


def test_what_conn_refuses(backend, store_url, store, orders, operation, tmp_path):
    table, count = orders
    with pytest.raises(TypeError, match="conn="):
        store.execute_local(operation, "x", {}, lambda tx: 1, conn=object())
    with pytest.raises(TypeError, match="no argument"):
        store.idempotent(operation, key="k", conn="database")(lambda db, k: 1)
    with pytest.raises(TypeError, match="payload="):
        store.idempotent(operation, key="k", conn="db", payload=["/item"])(
            lambda db, item, k: 1)
    with pytest.raises(TypeError, match="async"):
        @store.idempotent(operation, key="k", conn="db")
        async def later(db, k):
            return 1
    if backend == "sqlite":
        other = sqlite3.connect(tmp_path / "other.db")
        try:
            with pytest.raises(idem.InvalidArgument, match="another file"):
                store.execute_local(operation, "x", {}, lambda tx: 1, conn=other)
            assert other.in_transaction is False
        finally:
            other.close()
        auto = sqlite3.connect(store_url[len("sqlite:"):], isolation_level=None)
        try:
            with pytest.raises(idem.InvalidArgument, match="autocommit"):
                store.execute_local(operation, "x", {}, lambda tx: 1, conn=auto)
        finally:
            auto.close()
    else:
        wrong = sqlite3.connect(tmp_path / "other.db")
        try:
            with pytest.raises(idem.InvalidArgument, match="PostgreSQL store"):
                store.execute_local(operation, "x", {}, lambda tx: 1, conn=wrong)
        finally:
            wrong.close()
        psycopg = psycopg_or_fail()
        with psycopg.connect(store_url.replace("/postgres?", "/template1?")) as elsewhere:
            with pytest.raises(idem.InvalidArgument, match="another database"):
                store.execute_local(operation, "x", {}, lambda tx: 1, conn=elsewhere)
        with psycopg.connect(store_url) as reader:
            with reader.transaction():
                reader.execute("SET TRANSACTION READ ONLY")
                with pytest.raises(idem.InvalidArgument, match="read-only"):
                    store.execute_local(operation, "x", {}, lambda tx: 1, conn=reader)
                assert reader.execute("SELECT 1").fetchone()[0] == 1  # still usable
    assert store.get(operation, "x") is None
    assert count() == 0


def test_a_function_that_closes_the_connection_fails_cleanly(
        backend, store_url, store, orders, operation):
    # A use of the connection's handle after it was freed would crash (or
    # corrupt memory): the call fails instead, and nothing is stored.
    table, count = orders
    for begin in (False, True):
        db = connect(backend, store_url)
        if begin:
            db.execute(q(backend, "INSERT INTO %s (item) VALUES (?)" % table), ("before",))

        def place(tx):
            db.execute(q(backend, "INSERT INTO %s (item) VALUES (?)" % table), ("book",))
            db.close()
            return {"order_id": 1}
        with pytest.raises(idem.Error, match="closed the caller's connection"):
            store.execute_local(operation, "c-%s" % begin, {}, place, conn=db)
        assert store.get(operation, "c-%s" % begin) is None
    assert count() == 0
    # The store goes on.
    db = connect(backend, store_url)
    try:
        assert store.execute_local(operation, "c-ok", {}, lambda tx: 7, conn=db).value == 7
        db.commit()
    finally:
        db.close()
    assert store.get(operation, "c-ok").value == 7


def test_an_answer_without_action_leaves_the_holder_s_row_unlocked(operation):
    # IN_FLIGHT inside a transaction must not keep the holder's row locked
    # until that transaction ends: the holder could not complete meanwhile.
    # (PostgreSQL: SQLite's write lock is the transaction's by nature.)
    psycopg = psycopg_or_fail()
    store_url = pg_url()
    store = idem.open(store_url)
    started, finish = threading.Event(), threading.Event()

    def slow():
        started.set()
        assert finish.wait(60)
        return {"done": True}
    holder = threading.Thread(target=lambda: store.execute(operation, "h-1", {}, slow))
    holder.start()
    try:
        assert started.wait(60)
        with psycopg.connect(store_url) as db:
            with pytest.raises(idem.InFlight):
                store.execute_local(operation, "h-1", {}, lambda tx: 1, conn=db)
            assert db.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            with psycopg.connect(store_url, autocommit=True) as side:
                locked = side.execute(
                    "SELECT COUNT(*) FROM (SELECT 1 FROM idem.idem_records WHERE "
                    "operation = %s AND key = 'h-1' FOR UPDATE SKIP LOCKED) r",
                    (operation,)).fetchone()[0]
            assert locked == 1  # not skipped: nobody holds its lock
            finish.set()
            holder.join(60)
            assert not holder.is_alive()
            db.rollback()
        assert store.get(operation, "h-1").value == {"done": True}
    finally:
        finish.set()
        holder.join(60)
        store.close()


def test_a_session_s_time_zone_and_date_style_change_nothing(operation):
    psycopg = psycopg_or_fail()
    store = idem.open(pg_url())
    try:
        with psycopg.connect(pg_url()) as db:
            db.execute("SET TimeZone = 'America/New_York'")
            db.execute("SET DateStyle = 'SQL, DMY'")
            db.commit()
            assert store.execute_local(operation, "tz", {}, lambda tx: 3, conn=db).value == 3
            db.commit()
        assert store.get(operation, "tz").value == 3
    finally:
        store.close()


def test_temp_tables_of_idem_s_names_do_not_take_the_record(tmp_path, operation):
    store_url = "sqlite:%s" % (tmp_path / "idem.db")
    store = idem.open(store_url)
    db = connect("sqlite", store_url)
    try:
        db.execute("CREATE TEMP TABLE idem_records AS SELECT * FROM main.idem_records "
                   "WHERE 0")
        db.execute("CREATE UNIQUE INDEX temp.r ON idem_records (tenant, operation, key)")
        db.execute("CREATE TEMP TABLE idem_meta AS SELECT * FROM main.idem_meta")
        assert store.execute_local(operation, "t-1", {}, lambda tx: 5, conn=db).value == 5
        db.commit()
        assert db.execute("SELECT COUNT(*) FROM temp.idem_records").fetchone()[0] == 0
        assert store.get(operation, "t-1").value == 5
    finally:
        db.close()
        store.close()
