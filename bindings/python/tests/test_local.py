"""The cursor that execute_local() hands to its function: statements on the
store's own connection, in the store's parameter style, and the values
that come back from each store.
"""
import json
import os

import pytest

import idem
from helpers import records


def test_store_names_its_backend(store, backend):
    assert store.backend == backend


def test_store_is_a_context_manager(store_url, operation):
    with idem.open(store_url) as s:
        out = s.execute(operation, "k-1", {"n": 1}, lambda: {"done": True})
    assert isinstance(out, idem.Outcome)
    assert (out.value, out.replayed, out.recovered) == ({"done": True}, False, False)
    assert [r["state"] for r in records(store_url, operation)] == ["completed"]


def test_closed_store_refuses_calls(store_url, operation):
    s = idem.open(store_url)
    # Its names seen before, as in a running program: execute_local() then
    # goes whole in C, which must refuse as Python does.
    s.execute_local(operation, "k-0", {}, lambda tx: 0)

    @s.idempotent(operation, key="key")
    def act(n, key):
        return {"done": n}

    s.close()
    s.close()  # harmless

    for call in (lambda: s.execute(operation, "k-1", {"n": 1}, lambda: {"done": True}),
                 lambda: s.execute_local(operation, "k-1", {}, lambda tx: 1),
                 lambda: s.execute_local(operation, "k-0", {}, lambda tx: 0),
                 lambda: act(1, key="k-1")):
        with pytest.raises(idem.Error, match="the store is closed") as e:
            call()
        assert e.value.code == "IDEM_ESTATE"
    assert [r["key"] for r in records(store_url, operation)] == ["k-0"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_child_of_fork_is_refused_its_parents_store(store_url, operation):
    """A store crosses fork() as a copy of the parent's connections: the
    child's calls are refused, whichever way they go, and the parent's
    store goes on."""
    s = idem.open(store_url)
    try:
        s.execute_local(operation, "k-0", {}, lambda tx: 0)  # names seen: whole in C

        @s.idempotent(operation, key="key")
        def act(n, key):
            return {"done": n}

        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            try:
                said = []
                for call in (lambda: s.execute_local(operation, "k-1", {}, lambda tx: 1),
                             lambda: s.execute_local(operation, "k-0", {}, lambda tx: 0),
                             lambda: s.execute(operation, "k-2", {}, lambda: 2),
                             lambda: act(3, key="k-3")):
                    try:
                        call()
                        said.append("ran")
                    except idem.Error as e:
                        said.append("%s %s" % (e.code, "opened by process %d" % os.getppid()
                                               in str(e)))
                os.write(w, json.dumps(said).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = json.loads(f.read().decode() or "null")
        assert os.waitpid(pid, 0)[1] == 0
        assert said == ["IDEM_ESTATE True"] * 4
        out = s.execute_local(operation, "k-1", {}, lambda tx: 1)
        assert (out.value, out.replayed) == (1, False)
        assert sorted(r["key"] for r in records(store_url, operation)) == ["k-0", "k-1"]
    finally:
        s.close()


def test_cursor_fetches_counts_and_numbers_rows(store, db, backend, operation):
    table = db.create_table("items", db.id_column + ", name TEXT NOT NULL, n INTEGER NOT NULL")

    def fill(tx):
        first = tx.execute(db.sql("INSERT INTO %s (name, n) VALUES (?, ?)" % table), ("a", 1))
        for name, n in [("b", 2), ("c", 3)]:
            tx.execute(db.sql("INSERT INTO %s (name, n) VALUES (?, ?)" % table), (name, n))
        bumped = tx.execute(db.sql("UPDATE %s SET n = n * 10 WHERE n >= ?" % table), (2,))
        rows = tx.execute("SELECT name, n FROM %s ORDER BY id" % table).fetchall()
        one = tx.execute("SELECT COUNT(*) FROM %s" % table).fetchone()
        none = tx.execute("SELECT name FROM %s WHERE n < 0" % table).fetchone()
        return {"lastrowid": first.lastrowid, "rowcount": bumped.rowcount,
                "rows": [list(r) for r in rows], "count": one[0], "none": none}

    out = store.execute_local(operation, "k-1", {"fill": table}, fill)

    assert out.value == {"lastrowid": 1 if backend == "sqlite" else None, "rowcount": 2,
                         "rows": [["a", 1], ["b", 20], ["c", 30]], "count": 3, "none": None}
    assert db.rows("SELECT id, n FROM %s ORDER BY id" % table) == [(1, 1), (2, 20), (3, 30)]


def test_parameters_and_values_round_trip(store, db, backend, operation):
    blob = "BLOB" if backend == "sqlite" else "BYTEA"
    table = db.create_table("vals", "i BIGINT, f DOUBLE PRECISION, s TEXT, b %s, z TEXT" % blob)
    sent = (2 ** 40 + 1, 2.5, "h\u00e9llo \u2713", b"\x00\xff\x10", None)
    got = {}

    def round_trip(tx):
        tx.execute(db.sql("INSERT INTO %s VALUES (?, ?, ?, ?, ?)" % table), sent)
        got["row"] = tx.execute("SELECT i, f, s, b, z FROM %s" % table).fetchone()
        return {"stored": True}

    out = store.execute_local(operation, "k-1", {"vals": table}, round_trip)

    assert out.value == {"stored": True}
    assert tuple(got["row"]) == sent
    assert [type(v) for v in got["row"]] == [int, float, str, bytes, type(None)]


def test_postgresql_types_come_back_as_python_types(store, backend, operation):
    if backend != "postgresql":
        pytest.skip("PostgreSQL's own types")
    got = {}

    def select(tx):
        got["row"] = tx.execute("SELECT 7::int4, 8::int8, 1.5::numeric, 2.25::float8, "
                                "'x'::text, '\\x0102'::bytea, TRUE, FALSE, NULL").fetchone()
        got["param"] = tx.execute("SELECT $1::int8 + 1, $2::text || '!'", (41, "hi")).fetchone()
        return {}

    store.execute_local(operation, "k-1", {}, select)

    assert tuple(got["row"]) == (7, 8, 1.5, 2.25, "x", b"\x01\x02", True, False, None)
    assert [type(v) for v in got["row"][:4]] == [int, int, float, float]
    assert (type(got["row"][6]), type(got["row"][7])) == (bool, bool)
    assert tuple(got["param"]) == (42, "hi!")


def test_replay_runs_no_statement(store, db, operation):
    table = db.tickets_table()
    calls = []

    def insert(tx):
        calls.append(1)
        tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?)" % table), ("{}",))
        return {"ticket_id": tx.execute("SELECT MAX(id) FROM %s" % table).fetchone()[0]}

    first = store.execute_local(operation, "k-1", {"t": 1}, insert, tenant="alpha")
    again = store.execute_local(operation, "k-1", {"t": 1}, insert, tenant="alpha")

    assert (first.value, first.replayed) == ({"ticket_id": 1}, False)
    assert (again.value, again.replayed) == ({"ticket_id": 1}, True)
    assert calls == [1]
    assert db.count(table) == 1


def test_tx_is_valid_only_inside_its_function(store, operation):
    kept = {}

    def keep(tx):
        kept["tx"] = tx
        return {"kept": True}

    store.execute_local(operation, "k-1", {}, keep)

    with pytest.raises(idem.Error):
        kept["tx"].execute("SELECT 1")


def test_sql_error_rolls_back_and_releases(store, store_url, db, operation):
    table = db.tickets_table()

    def insert_then_fail(tx):
        tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?)" % table), ("{}",))
        tx.execute("SELECT * FROM no_such_table_%s" % table)

    with pytest.raises(idem.Error) as caught:
        store.execute_local(operation, "k-1", {"t": 1}, insert_then_fail)

    assert "no_such_table" in caught.value.message
    assert db.count(table) == 0
    assert records(store_url, operation) == []


def test_one_statement_per_execute(store, db, backend, operation):
    # A second statement after the first would be skipped without a word
    # (SQLite prepares one at a time; PostgreSQL refuses several with
    # parameters): refused, and the whole action rolled back.
    table = db.create_table("items", db.id_column + ", n INTEGER NOT NULL")

    def two(tx):
        tx.execute("INSERT INTO %s (n) VALUES (1); DELETE FROM %s" % (table, table))
        return "both ran"

    with pytest.raises(idem.Error):
        store.execute_local(operation, "k-two", {"n": 1}, two)
    assert db.count(table) == 0
    assert records(store.url, operation) == []

    # A trailing semicolon or comment is not a second statement.
    out = store.execute_local(operation, "k-one", {"n": 1}, lambda tx: tx.execute(
        "INSERT INTO %s (n) VALUES (1); -- one row" % table).rowcount)
    assert (out.value, out.replayed) == (1, False)
    assert db.count(table) == 1


def test_bad_options_fail_where_they_are_written(store, operation):
    with pytest.raises(idem.InvalidArgument):
        store.idempotent(operation, key="key", lease="3 weeks")
