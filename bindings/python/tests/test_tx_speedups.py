"""tx.execute() through idem._speedups (SQLite and PostgreSQL) must answer
exactly as the Python way does: the same rows, rowcount, lastrowid and errors, for every
kind of parameter and statement; what it leaves to Python (other types, an
empty statement) must go there and nowhere else; its statements are kept
per text and connection, and finalized when the store closes.

Each case runs twice in its own execute_local() call: once as a user runs
it (C, unless it leaves the call to Python), once with the C way turned off.
"""
import enum
import itertools
import re

import pytest

import idem
from idem import _tx

_keys = itertools.count()


@pytest.fixture
def sqlite_only(backend):
    if backend != "sqlite":
        pytest.skip("idem._speedups runs SQLite's statements")


class Count(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


def run(store, operation, monkeypatch, statements, python):
    """Runs statements, a list of (sql, params), in one execute_local();
    what each returned (rows, rowcount, lastrowid) or the error that ended
    the call, and how many the C way answered."""
    answered = []
    fast, fast_pg = _tx._fast_sqlite, _tx._fast_pg

    def counting(*args):
        got = fast(*args)
        answered.append(got.__class__ is _tx.Cursor)
        return got

    def counting_pg(*args):
        got = fast_pg(*args)
        answered.append(got[0].__class__ is _tx.Cursor)
        return got

    monkeypatch.setattr(_tx, "_fast_sqlite", (lambda *a: NotImplemented) if python
                        else counting)
    monkeypatch.setattr(_tx, "_fast_pg", None if python else counting_pg)
    results = []

    def fn(tx):
        for sql, params in statements:
            cur = tx.execute(sql, params)
            results.append((cur.fetchall(), cur.rowcount, cur.lastrowid))
        raise idem.NotDone()  # rolled back: each side starts from the same rows

    try:
        store.execute_local(operation, "k-%d" % next(_keys), {}, fn)
    except idem.NotDone:
        pass
    except Exception as e:  # noqa: B902 - compared between the two ways
        results.append((type(e).__name__, getattr(e, "code", None), str(e)))
    finally:
        monkeypatch.setattr(_tx, "_fast_sqlite", fast)
        monkeypatch.setattr(_tx, "_fast_pg", fast_pg)
    return results, sum(answered)


def both(store, operation, monkeypatch, statements):
    c, answered = run(store, operation, monkeypatch, statements, False)
    py, _ = run(store, operation, monkeypatch, statements, True)
    # repr(): NaN is not equal to itself; a prepared statement's name is the
    # cache's, whichever way ran it.
    assert _same(c) == _same(py)
    return c, answered


def _same(results):
    return re.sub(r'prepared statement \\?"[a-z_0-9]*\\?"', "prepared statement", repr(results))


@pytest.fixture
def items(store, db, operation, sqlite_only):
    table = db.create_table("items", db.id_column + ", n INTEGER UNIQUE, v")
    store.execute_local(operation, "fill", {}, lambda tx: [
        tx.execute("INSERT INTO %s (n, v) VALUES (?, ?)" % table, (n, "v%d" % n))
        for n in range(5)] and 5)
    return table


VALUES = [
    0, 1, -1, (1 << 63) - 1, -(1 << 63), 2.5, -0.0, 1e308, float("inf"), -float("inf"),
    "", "plain", "é ü 中 \U0001f600", "nul \x00 inside", "x" * 100000,
    b"", b"\x00\xff bytes", None,
]


def test_values_come_back_as_the_python_way_reads_them(store, operation, monkeypatch,
                                                        sqlite_only):
    marks = ", ".join("?" for _ in VALUES)
    (got, answered) = both(store, operation, monkeypatch, [
        ("SELECT " + marks, tuple(VALUES)),
        ("SELECT " + marks, list(VALUES)),
        ("SELECT typeof(?), typeof(?), typeof(?)", (7, 7.0, b"7")),
    ])
    assert answered == 3
    row = got[0][0][0]
    assert row[:4] == (0, 1, -1, (1 << 63) - 1) and row[-3:] == (b"", b"\x00\xff bytes", None)
    assert row[12:15] == ("é ü 中 \U0001f600", "nul \x00 inside", "x" * 100000)
    assert got[1] == got[0]
    assert got[2][0] == [("integer", "real", "blob")]


def test_text_that_is_not_utf8_is_read_with_replacement(store, operation, monkeypatch,
                                                         sqlite_only):
    got, answered = both(store, operation, monkeypatch, [
        ("SELECT CAST(x'ff41' AS TEXT), x'', CAST(NULL AS TEXT)", ())])
    assert answered == 1
    assert got[0][0] == [("\ufffdA", b"", None)]


@pytest.mark.parametrize("sql,params,rowcount", [
    ("INSERT INTO {t} (n, v) VALUES (?, ?)", (10, "ten"), 1),
    ("  \n insert into {t} (n, v) VALUES (?, ?)", (11, "eleven"), 1),
    ("UPDATE {t} SET v = ? WHERE n < ?", ("low", 3), 3),
    ("DELETE FROM {t} WHERE n >= ?", (2,), 3),
    ("REPLACE INTO {t} (n, v) VALUES (?, ?)", (1, "one"), 1),
    ("WITH s(k) AS (SELECT 4) UPDATE {t} SET v = ? WHERE n IN s", ("four",), 1),
    ("WITH s(k) AS (SELECT 4) SELECT * FROM s", (), -1),
    ("SELECT n, v FROM {t} WHERE n > ? ORDER BY n", (2,), -1),
    ("INSERT INTO {t} (n, v) VALUES (?, ?) RETURNING id, v", (12, "twelve"), -1),
    ("CREATE TABLE {t}_more (x)", (), -1),
    ("SELECT 1; -- a comment after the statement", (), -1),
])
def test_rowcount_and_lastrowid_as_the_python_way(store, operation, monkeypatch, items,
                                                  sql, params, rowcount):
    got, answered = both(store, operation, monkeypatch, [(sql.format(t=items), params)])
    assert answered == 1
    assert got[0][1] == rowcount


@pytest.mark.parametrize("sql,params,code,words", [
    ("SELEC 1", (), "IDEM_ESTORE", "syntax error"),
    ("SELECT * FROM no_such_table", (), "IDEM_ESTORE", "no such table"),
    ("INSERT INTO {t} (n, v) VALUES (?, ?)", (1, "again"), "IDEM_ESTORE", "UNIQUE"),
    ("SELECT ?, ?", (1,), "IDEM_EINVAL", "do not match the 1 given"),
    ("SELECT ?", (1, 2), "IDEM_EINVAL", "do not match the 2 given"),
    ("SELECT 1; SELECT 2", (), "IDEM_EINVAL", "runs one statement"),
    ("SELECT 1; SELEC 2", (), "IDEM_EINVAL", "runs one statement"),
])
def test_errors_as_the_python_way(store, operation, monkeypatch, items, sql, params, code,
                                  words):
    got, _ = both(store, operation, monkeypatch, [(sql.format(t=items), params)])
    name, got_code, msg = got[-1]
    assert (name, got_code) == ("DatabaseError", code) and words in msg


@pytest.mark.parametrize("params", [
    (True,), (Count.ONE,), (Text("sub"),), (bytearray(b"ba"),), (memoryview(b"mv"),),
    (1 << 63,), (-(1 << 63) - 1,), ("lone \ud800 surrogate",), (object(),),
    "a str", {"a": 1},
], ids=lambda p: type(p).__name__ if not isinstance(p, tuple) else type(p[0]).__name__)
def test_what_c_leaves_to_python_goes_there(store, operation, monkeypatch, sqlite_only,
                                            params):
    got, answered = both(store, operation, monkeypatch, [("SELECT ?", params)])
    assert answered == 0


@pytest.mark.parametrize("sql", ["", ";", "-- nothing but a comment", "  "])
def test_empty_statement_goes_the_python_way(store, operation, monkeypatch, sqlite_only,
                                             sql):
    got, answered = both(store, operation, monkeypatch, [(sql, ())])
    assert answered == 0
    assert got == [([], -1, got[0][2])]


def test_statements_are_kept_per_text_and_finalized_at_close(store_url, operation,
                                                             sqlite_only):
    store = idem.open(store_url)
    kept = store._statements._c_kept
    texts = ["SELECT ? + %d" % i for i in range(3)]

    def fn(tx):
        return [tx.execute(sql, (1,)).fetchone()[0] for sql in texts + texts]

    assert store.execute_local(operation, "a", {}, fn).value == [1, 2, 3, 1, 2, 3]
    assert len(kept) == 3 and {sql for _, sql in kept} == set(texts)
    first = dict(kept)
    assert store.execute_local(operation, "b", {}, fn).value == [1, 2, 3, 1, 2, 3]
    assert kept == first  # the same statements, run again
    # A statement that failed is not kept.
    with pytest.raises(idem.DatabaseError):
        store.execute_local(operation, "c", {}, lambda tx: tx.execute(
            "SELECT abs(?)", (-(1 << 63),)).fetchall())
    assert "SELECT abs(?)" not in {sql for _, sql in kept}
    store.close()  # SQLite refuses to close a connection with statements left
    assert kept == {}
    again = idem.open(store_url)
    try:
        assert again.execute_local(operation, "a", {}, fn).replayed
    finally:
        again.close()


def test_at_most_limit_statements_are_kept(store, operation, sqlite_only):
    limit = _tx.Statements.LIMIT
    texts = ["SELECT %d" % i for i in range(limit + 10)]
    out = store.execute_local(operation, "many", {}, lambda tx: [
        tx.execute(sql).fetchone()[0] for sql in texts])
    assert out.value == list(range(limit + 10))
    assert len(store._statements._c_kept) == limit


# ------------------------------------------------------------ PostgreSQL

@pytest.fixture
def pg_only(backend):
    if backend != "postgresql":
        pytest.skip("PostgreSQL's statements")


def test_pg_parameters_as_the_python_way(store, operation, monkeypatch, pg_only):
    sql = ("SELECT $1::bigint, $2::bigint, $3::float8, $4::float8, $5::float8, "
           "$6::float8, $7::float8, $8::numeric, $9::text, $10::text, $11::bytea, "
           "$12::bytea, $13::bool, $14::bool, $15::text, $16::int")
    params = ((1 << 63) - 1, -(1 << 63), 2.5, -0.0, 1e308, float("inf"), float("nan"),
              0.1, "é ü 中 \U0001f600", "", b"\x00\xff bytes", b"", True, False, None, 7)
    # The same again, past the 16 parameters kept on the stack.
    wide = "SELECT " + ", ".join("$%d::text" % (i + 1) for i in range(40))
    got, answered = both(store, operation, monkeypatch, [
        (sql, params), (sql, list(params)), (wide, tuple("p%d" % i for i in range(40)))])
    assert answered == 3
    row = got[0][0][0]
    assert row[:3] == ((1 << 63) - 1, -(1 << 63), 2.5) and row[5] == float("inf")
    assert row[7] == 0.1 and row[8:] == ("é ü 中 \U0001f600", "", b"\x00\xff bytes", b"",
                                         True, False, None, 7)
    assert got[2][0] == [tuple("p%d" % i for i in range(40))]


def test_pg_types_read_as_the_python_way(store, operation, monkeypatch, pg_only):
    sql = ("SELECT 1::int2, 2::int4, 3::int8, 4::oid, 1.5::float4, 2.5::float8, "
           "3.25::numeric, 'NaN'::float8, '-Infinity'::float8, true, false, "
           "'\\x00ff'::bytea, ''::bytea, 'text', NULL, ARRAY[1, 2], "
           "'2026-01-02'::date, '{\"a\": 1}'::jsonb, convert_from('\\xc3a9'::bytea, 'UTF8')")
    got, answered = both(store, operation, monkeypatch, [(sql, ())])
    assert answered == 1
    row = got[0][0][0]
    assert row[:7] == (1, 2, 3, 4, 1.5, 2.5, 3.25) and row[7] != row[7]
    assert row[8:] == (-float("inf"), True, False, b"\x00\xff", b"", "text", None, "{1,2}",
                       "2026-01-02", '{"a": 1}', "é")


@pytest.mark.parametrize("sql,params,rowcount", [
    ("INSERT INTO {t} (n, v) VALUES ($1, $2)", (10, "ten"), 1),
    ("UPDATE {t} SET v = $1 WHERE n < $2", ("low", 3), 3),
    ("DELETE FROM {t} WHERE n >= $1", (2,), 3),
    ("SELECT n, v FROM {t} WHERE n > $1 ORDER BY n", (2,), 2),
    ("INSERT INTO {t} (n, v) VALUES ($1, $2) RETURNING n, v", (12, "twelve"), 1),
    ("CREATE TABLE {t}_more (x int)", (), -1),
])
def test_pg_rowcount_as_the_python_way(store, db, operation, monkeypatch, pg_only, sql,
                                       params, rowcount):
    table = db.create_table("items", db.id_column + ", n INTEGER UNIQUE, v text")
    store.execute_local(operation, "fill", {}, lambda tx: [
        tx.execute("INSERT INTO %s (n, v) VALUES ($1, $2)" % table, (n, "v%d" % n))
        for n in range(5)] and 5)
    # Three times, each in its own call: sent with its text, prepared, then
    # run prepared.
    for _ in range(3):
        got, answered = both(store, operation, monkeypatch, [(sql.format(t=table), params)])
        assert answered == 1
        assert got[0][1] == rowcount


@pytest.mark.parametrize("sql,params,words", [
    ("SELEC 1", (), "syntax error"),
    ("SELECT * FROM no_such_table", (), "does not exist"),
    ("SELECT 1 / $1::int", (0,), "division by zero"),
    ("SELECT $1::int, $2::int", (1,), "bind message supplies 1 parameters"),
    ("SELECT $1::int", ("not a number",), "invalid input syntax"),
])
def test_pg_errors_as_the_python_way(store, operation, monkeypatch, pg_only, sql, params,
                                     words):
    got, answered = both(store, operation, monkeypatch, [(sql, params)])
    assert answered == 0
    name, code, msg = got[-1]
    assert (name, code) == ("DatabaseError", "IDEM_ESTORE") and words in msg


@pytest.mark.parametrize("params", [
    (Count.ONE,), (Text("sub"),), (bytearray(b"ba"),), (memoryview(b"mv"),),
    (1 << 63,), (-(1 << 63) - 1,), ("nul \x00 inside",), ("lone \ud800 surrogate",),
    (object(),), "a str", {"a": 1},
], ids=lambda p: type(p).__name__ if not isinstance(p, tuple) else type(p[0]).__name__)
def test_pg_what_c_leaves_to_python_goes_there(store, operation, monkeypatch, pg_only,
                                               params):
    got, answered = both(store, operation, monkeypatch, [("SELECT $1::text", params)])
    assert answered == 0
