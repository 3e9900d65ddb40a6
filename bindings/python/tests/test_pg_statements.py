"""tx.execute() on PostgreSQL prepares a statement the second time a
session runs it, and must never answer from a statement whose meaning a
change of schema or of session state has moved: a change made by the
function's own session is seen before the next run; one made by another
session fails at most one call, which releases its key, and the retry runs
the text afresh.

The store has one connection here, so that every call runs in one server
session whose prepared statements the tests can read
(pg_prepared_statements).
"""
import pytest

import idem
from helpers import Database, records, unique


@pytest.fixture
def pg(store_url, backend):
    if backend != "postgresql":
        pytest.skip("PostgreSQL's statement cache")
    s = idem.open(store_url, max_connections=1)
    db = Database(backend, store_url)
    yield s, db
    s.close()
    db.drop_tables()


def prepared(tx):
    """The texts this session holds prepared by the binding."""
    return sorted(r[0] for r in tx.execute(
        "SELECT statement FROM pg_prepared_statements WHERE name LIKE 'idem_py_%'"
    ).fetchall())


def test_second_run_prepares_and_the_rest_reuse(pg, operation):
    store, db = pg
    table = db.create_table("items", db.id_column + ", n BIGINT NOT NULL")
    insert = "INSERT INTO %s (n) VALUES ($1) RETURNING id" % table
    seen = []
    for i in range(5):
        out = store.execute_local(operation, "k%d" % i, {"i": i}, lambda tx, i=i: (
            seen.append(prepared(tx)), tx.execute(insert, (i,)).fetchone()[0])[1])
        assert (out.value, out.replayed) == (i + 1, False)
    # Before the first run nothing; before the second nothing of it; from
    # the third on, the insert is prepared, once.
    assert [insert in s for s in seen] == [False, False, True, True, True]
    assert all(s.count(insert) <= 1 for s in seen)
    names = {n for (n,) in rows(store, operation, "SELECT name FROM pg_prepared_statements "
                                "WHERE statement = '%s'" % insert.replace("'", "''"))}
    assert len(names) == 1
    assert db.rows("SELECT id, n FROM %s ORDER BY id" % table) == [(i + 1, i) for i in range(5)]


def rows(store, operation, sql):
    return store.execute_local(operation, unique("read"), {},
                               lambda tx: [list(r) for r in tx.execute(sql).fetchall()]).value


def test_another_session_changes_the_result_type(pg, operation):
    """ALTER TABLE from another session changes SELECT *'s columns: at most
    one call fails (the key is released, nothing is written), and its retry
    sees the new column."""
    store, db = pg
    table = db.create_table("items", "a BIGINT NOT NULL")
    db.run("INSERT INTO %s VALUES (1)" % table)
    select = "SELECT * FROM %s" % table
    ran = []

    def read(tx):
        ran.append(1)
        return [list(r) for r in tx.execute(select).fetchall()]

    for i in range(3):
        assert store.execute_local(operation, "before-%d" % i, {}, read).value == [[1]]
    db.run("ALTER TABLE %s ADD COLUMN b TEXT DEFAULT 'x'" % table)
    failed = 0
    for attempt in range(2):
        try:
            out = store.execute_local(operation, "after", {}, read)
            break
        except idem.DatabaseError as e:
            failed += 1
            assert "cached plan" in str(e)
            assert [r for r in records(store.url, operation) if r["key"] == "after"] == []
    assert failed <= 1
    assert (out.value, out.replayed) == ([[1, "x"]], False)
    # And the new text is prepared again in time.
    for i in range(3):
        assert store.execute_local(operation, "again-%d" % i, {}, read).value == [[1, "x"]]
    held = rows(store, operation, "SELECT statement FROM pg_prepared_statements "
                "WHERE name LIKE 'idem_py_%'")
    # The stale one stays on the server until the session ends, beside the
    # new one.
    assert held.count([select]) == 1 + failed
    assert failed == 1  # PostgreSQL refuses a cached plan whose columns changed


def test_own_session_changes_are_seen_at_once(pg, operation):
    """DDL and SET run through tx.execute() make the session's statements
    be sent afresh: no call fails."""
    store, db = pg
    table = db.create_table("items", "a BIGINT NOT NULL")
    db.run("INSERT INTO %s VALUES (1)" % table)
    select = "SELECT * FROM %s" % table

    def read(tx):
        return [list(r) for r in tx.execute(select).fetchall()]

    for i in range(3):
        assert store.execute_local(operation, "r%d" % i, {}, read).value == [[1]]
    out = store.execute_local(operation, "alter", {}, lambda tx: (
        tx.execute("ALTER TABLE %s ADD COLUMN b BIGINT DEFAULT 7" % table),
        [list(r) for r in tx.execute(select).fetchall()])[1])
    assert out.value == [[1, 7]]
    assert store.execute_local(operation, "after", {}, read).value == [[1, 7]]
    # A table of the same name in a schema put first in search_path, by SET
    # LOCAL: seen in its transaction, and gone with it.
    schema = unique("s")
    db.run("CREATE SCHEMA %s" % schema)
    try:
        db.run("CREATE TABLE %s.%s (z TEXT)" % (schema, table))
        db.run("INSERT INTO %s.%s VALUES ('shadow')" % (schema, table))

        def shadowed(tx):
            path = tx.execute("SHOW search_path").fetchone()[0]
            tx.execute("SET LOCAL search_path TO %s, %s" % (schema, path))
            return [[list(r) for r in tx.execute(select).fetchall()] for _ in range(3)]

        for i in range(2):
            out = store.execute_local(operation, "local-%d" % i, {}, shadowed)
            assert out.value == [[["shadow"]]] * 3
            for j in range(3):
                assert store.execute_local(operation, "back-%d-%d" % (i, j), {},
                                           read).value == [[1, 7]]
    finally:
        db.run("DROP SCHEMA %s CASCADE" % schema)


def test_other_errors_keep_the_statement(pg, operation):
    """A unique violation is the data's, not the statement's: the
    statement stays prepared, under the same name."""
    store, db = pg
    table = db.create_table("items", "k TEXT PRIMARY KEY")
    insert = "INSERT INTO %s (k) VALUES ($1)" % table
    names = "SELECT name FROM pg_prepared_statements WHERE statement = '%s'" % insert
    for i in range(3):
        store.execute_local(operation, "k%d" % i, {}, lambda tx, i=i: tx.execute(
            insert, ("v%d" % i,)).rowcount)
    before = rows(store, operation, names)
    assert len(before) == 1
    with pytest.raises(idem.DatabaseError, match="duplicate key"):
        store.execute_local(operation, "dup", {}, lambda tx: tx.execute(insert, ("v0",)))
    for i in range(3, 5):
        store.execute_local(operation, "k%d" % i, {}, lambda tx, i=i: tx.execute(
            insert, ("v%d" % i,)).rowcount)
    # Not prepared again under a new name: the one statement served them all.
    assert rows(store, operation, names) == before
    assert db.rows("SELECT COUNT(*) FROM %s" % table) == [(5,)]


def test_a_new_server_session_prepares_again(pg, operation):
    """The store's connection is cut (its server process ended): libidem
    connects again, and the statements of the old session are not asked
    for in the new one (a prepared name that does not exist there would
    fail the call)."""
    store, db = pg
    table = db.create_table("items", db.id_column + ", n BIGINT NOT NULL")
    insert = "INSERT INTO %s (n) VALUES ($1) RETURNING id" % table

    def add(n):
        return lambda tx: [tx.execute(insert, (n,)).fetchone()[0],
                           tx.execute("SELECT pg_backend_pid()").fetchone()[0]]

    pids = {store.execute_local(operation, "a%d" % i, {}, add(i)).value[1] for i in range(3)}
    assert len(pids) == 1
    (old,) = pids
    db.run("SELECT pg_terminate_backend(%d)" % old)
    outcomes = []
    for i in range(3, 8):
        try:
            outcomes.append(store.execute_local(operation, "b%d" % i, {}, add(i)).value)
        except (idem.StoreUnavailable, idem.DatabaseError) as e:
            # The call that finds the connection cut, at most; never a
            # statement the new session does not have.
            assert "does not exist" not in str(e)
            outcomes.append(None)
    assert outcomes.count(None) <= 1
    done = [o for o in outcomes if o is not None]
    assert len(done) >= 4 and all(pid != old for _, pid in done)
    ids = [i for i, _ in done]
    assert db.rows("SELECT COUNT(*) FROM %s" % table) == [(3 + len(done),)]
    assert ids == sorted(ids)


def test_threads_share_the_cache_across_sessions(store_url, backend, operation):
    """16 threads on a store of 4 connections run the same texts while
    another session alters the table once: every call ends with its row or
    a released key, a failed call's retry runs, and each key acts once."""
    if backend != "postgresql":
        pytest.skip("PostgreSQL's statement cache")
    import threading
    store = idem.open(store_url, max_connections=4)
    db = Database(backend, store_url)
    try:
        table = db.create_table("items", db.id_column + ", k TEXT NOT NULL UNIQUE")
        insert = "INSERT INTO %s (k) VALUES ($1) RETURNING *" % table
        failures, errors = [], []
        altering = threading.Event()

        def worker(w):
            try:
                for i in range(40):
                    key = "w%d-%d" % (w, i)
                    if w == 0 and i == 20:
                        altering.set()  # before: other calls may see it first
                        db.run("ALTER TABLE %s ADD COLUMN extra TEXT DEFAULT 'x'" % table)
                    for attempt in range(3):
                        try:
                            out = store.execute_local(operation, key, {"k": key}, lambda tx: list(
                                tx.execute(insert, (key,)).fetchone()))
                            break
                        except idem.DatabaseError as e:
                            assert "cached plan" in str(e), e
                            failures.append(key)
                    else:
                        raise AssertionError("%s failed three times" % key)
                    assert out.value[1] == key and not out.replayed
                    # The new column only once the ALTER was sent.
                    assert len(out.value) == 2 or (len(out.value) == 3 and altering.is_set())
            except BaseException as e:  # noqa: B902 - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert db.rows("SELECT COUNT(*), COUNT(DISTINCT k) FROM %s" % table) == [(640, 640)]
        # At most one failed call per server session (4) and statement.
        assert len(failures) <= 4
        assert len(set(failures)) == len(failures)
        assert len(records(store_url, operation)) == 640
        last = store.execute_local(operation, "last", {"k": "last"}, lambda tx: list(
            tx.execute(insert, ("last",)).fetchone()))
        assert last.value[1:] == ["last", "x"]
    finally:
        store.close()
        db.drop_tables()
