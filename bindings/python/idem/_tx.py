"""tx.execute(): the caller's statements on the store's own connection,
inside the transaction that also writes the record."""
import itertools
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

from . import _speedups
from ._errors import DatabaseError
from ._native import ffi, lib

_SQLITE_ROW = 100
_SQLITE_DONE = 101
_SQLITE_INTEGER, _SQLITE_FLOAT, _SQLITE_TEXT, _SQLITE_BLOB, _SQLITE_NULL = 1, 2, 3, 4, 5

# PostgreSQL type oids whose text the cursor turns into Python values.
_PG_INT = {20, 21, 23, 26}
_PG_FLOAT = {700, 701, 1700}
_PG_BOOL = 16
_PG_BYTEA = 17
_PGRES_COMMAND_OK, _PGRES_TUPLES_OK = 1, 2
_PG_DIAG_SQLSTATE = ord("C")
# Errors of a prepared statement that a change of schema or of session
# state can cause, where the same text sent afresh may run: a result type
# that changed (0A000), a statement the session no longer has (26000),
# names and types resolved otherwise now (class 42).
_PG_STALE = (b"0A", b"26", b"42")
# Commands after which a session's prepared statements may resolve their
# names or types otherwise, or be gone.
_PG_RESETS = (b"CREATE", b"ALTER", b"DROP", b"SET", b"RESET", b"DISCARD",
              b"DEALLOCATE")


class Cursor:
    """The rows of one statement, read whole when it ran."""

    def __init__(self, rows: List[Tuple[Any, ...]], rowcount: int,
                 lastrowid: Optional[int]) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self) -> Optional[Tuple[Any, ...]]:
        """The next row, or None when there is none left."""
        if self._next >= len(self._rows):
            return None
        row = self._rows[self._next]
        self._next += 1
        return row

    def fetchall(self) -> List[Tuple[Any, ...]]:
        """The rows not read yet."""
        rows = self._rows[self._next:]
        self._next = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        return iter(self.fetchall())

    def __repr__(self) -> str:
        return "<idem.Cursor rowcount=%d lastrowid=%r rows left=%d>" % (
            self.rowcount, self.lastrowid, len(self._rows) - self._next)


class Statements:
    """Statements prepared on a store's connections, kept for the next
    transaction (preparing one costs more than running it). Statements of
    one connection are used by one transaction at a time, since the store
    runs them there one after the other.

    SQLite: the sqlite3_stmt itself; close() finalizes them all, before the
    store closes its connections.

    PostgreSQL: the name of a statement prepared in a server session (a
    session is its connection and its server process, so that a
    connection libidem reset prepares again). A text is prepared the second
    time a session runs it (the first goes unprepared, as DDL and one-off
    statements stay). Like other drivers' statement caches, it forgets a
    session's statements after a command of this session that may change
    what they mean (ALTER, DROP, SET search_path...; _PG_RESETS), and one
    statement after it failed in a way such a change from another session
    causes (_PG_STALE): that call fails (sent afresh, it would have run),
    its key is released, and the retry sends the text afresh. A forgotten statement
    stays on the server until the session ends; a session that has
    forgotten LIMIT of them prepares no more. At most PG_LIMIT statements
    are kept over all sessions; a connection's earlier sessions are
    dropped from the cache when it prepares in a new one."""

    LIMIT = 64
    PG_LIMIT = 1024

    def __init__(self) -> None:
        self._kept: Dict[Tuple[Any, bytes], Any] = {}
        # idem._speedups' own: (the connection's address, sql): the statement's
        self._c_kept: Dict[Tuple[int, str], int] = {}
        self._pg: Dict[Tuple[Any, int, bytes], bytes] = {}  # session, text: name
        self._pg_seen: Dict[Tuple[Any, int, bytes], bool] = {}  # run once
        self._pg_forgotten: Dict[Tuple[Any, int], int] = {}
        self._names = itertools.count(1)  # next() is atomic

    def take(self, conn: Any, sql: bytes) -> Any:
        return self._kept.pop((conn, sql), ffi.NULL)  # atomic under the GIL

    def give(self, conn: Any, sql: bytes, stmt: Any, keep: bool) -> None:
        if keep and len(self._kept) < self.LIMIT and \
                self._kept.setdefault((conn, sql), stmt) is stmt:
            return
        lib.sqlite3_finalize(stmt)

    def close(self) -> None:
        kept, self._kept = self._kept, {}
        c_kept, self._c_kept = self._c_kept, {}
        self._pg, self._pg_seen, self._pg_forgotten = {}, {}, {}
        for stmt in kept.values():
            lib.sqlite3_finalize(stmt)
        for addr in c_kept.values():
            lib.sqlite3_finalize(ffi.cast("sqlite3_stmt *", addr))
        c_kept.clear()

    def pg_name(self, conn: Any, sql: bytes) -> Optional[bytes]:
        """The name of sql prepared in this PostgreSQL session, preparing it
        on its second run; None: send it unprepared. A text the server
        refuses raises DatabaseError, as running it would."""
        session = (conn, lib.PQbackendPID(conn))
        key = session + (sql,)
        name = self._pg.get(key)
        if name is not None:
            return name
        if key not in self._pg_seen:
            if len(self._pg_seen) < self.PG_LIMIT:
                self._pg_seen[key] = True
            return None
        self._drop_old_sessions(session)
        if len(self._pg) >= self.PG_LIMIT or \
                self._pg_forgotten.get(session, 0) >= self.LIMIT:
            return None
        name = b"idem_py_%d" % next(self._names)
        res = lib.PQprepare(conn, name, sql, 0, ffi.NULL)
        try:
            if lib.PQresultStatus(res) != _PGRES_COMMAND_OK:
                # What running it would have said (and, as then, the
                # transaction is now aborted).
                raise DatabaseError("IDEM_ESTORE", _pg_message(res))
        finally:
            lib.PQclear(res)
        self._pg[key] = name
        return name

    def _drop_old_sessions(self, session: Tuple[Any, int]) -> None:
        """Forgets the earlier sessions of session's connection (libidem
        reset it): their statements went with them."""
        conn, pid = session
        for d in (self._pg, self._pg_seen, self._pg_forgotten):
            table = cast(Dict[Tuple[Any, ...], Any], d)
            for k in [k for k in list(table) if k[0] == conn and k[1] != pid]:
                table.pop(k, None)

    def pg_ran(self, conn: Any, sql: bytes, ok: bool, resets: bool, state: Optional[bytes],
               prepared: bool) -> bool:
        """Forgets what a statement's result says may have changed: its own
        name after a stale failure (state, its SQLSTATE, or None), the
        session's after a command that changes what names mean (resets). True
        after such a command: until its transaction ends (a rollback undoes
        it, and a SET LOCAL ends with it), nothing is prepared."""
        if ok:
            if not resets:
                return False
            session = (conn, lib.PQbackendPID(conn))
            keys = [k for k in list(self._pg) if k[:2] == session]
        else:
            if not prepared:
                return False
            if state is not None and state[:2] not in _PG_STALE:
                return False
            session = (conn, lib.PQbackendPID(conn))
            keys = [session + (sql,)]
        for k in keys:
            if self._pg.pop(k, None) is not None:
                self._pg_forgotten[session] = self._pg_forgotten.get(session, 0) + 1
        return ok


class Transaction:
    """Valid only while the function it was given to runs."""

    def __init__(self, backend: str, addr: int,
                 statements: Optional[Statements] = None) -> None:
        self.backend = backend
        self._addr = addr  # the store's connection (sqlite3 *, PGconn *)
        self._open = True
        self._statements = statements if statements is not None else Statements()
        self._thread = threading.get_ident()
        self._pg_unsettled = False  # see Statements.pg_ran()
        self._pg_conn: Any = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """Runs one SQL statement in the store's transaction, on its
        connection, with params bound to its placeholders (? for SQLite,
        $1, $2... for PostgreSQL): None, bool, int, float, str, bytes. It
        commits with the record, or rolls back with it when the function
        raises. Only inside the function given to execute_local(), on its
        thread; errors are idem.DatabaseError."""
        if not self._open:
            raise DatabaseError("IDEM_ESTATE", "the transaction has ended: use tx "
                                "only inside the function it was given to")
        if threading.get_ident() != self._thread:
            raise DatabaseError("IDEM_ESTATE", "tx.execute() from another thread: the "
                                "store's connection is used by one thread at a time, the "
                                "one running the function")
        if self.backend == "sqlite":
            # In one crossing (idem._speedups), unless it leaves the call here.
            got = _fast_sqlite(self._addr, sql, params, self._statements._c_kept)
            if got.__class__ is Cursor:
                return got  # type: ignore[no-any-return]
            if got is not NotImplemented:
                raise _sqlite_refused(got, len(params))
        else:
            got = self._pg_fast(sql, params)
            if got is not NotImplemented:
                return got  # type: ignore[no-any-return]
        if isinstance(params, (str, bytes, bytearray, dict)):
            raise TypeError("params: a sequence (a tuple or a list) of values, not %s"
                            % type(params).__name__)
        if self.backend == "sqlite":
            return _sqlite_execute(self._conn, sql, params, self._statements)
        return _pg_execute(ffi.cast("PGconn *", self._addr), sql, params, self)

    def _pg_fast(self, sql: Any, params: Any) -> Any:
        """tx.execute() on PostgreSQL in one crossing (idem._speedups): its
        Cursor, or NotImplemented before anything was sent."""
        if _fast_pg is None or sql.__class__ is not str or not _pg_simple(params):
            return NotImplemented  # before the cache counts a run
        conn = self._pg_conn
        if conn is None:
            conn = self._pg_conn = ffi.cast("PGconn *", self._addr)
        encoded = sql.encode("utf-8")
        cache = self._statements
        name = None if self._pg_unsettled else cache.pg_name(conn, encoded)
        got = _fast_pg(self._addr, encoded, name, params)
        cursor = got[0]
        if cursor is not None:
            if got[1] and cache.pg_ran(conn, encoded, True, True, None, name is not None):
                self._pg_unsettled = True
            return cursor
        cache.pg_ran(conn, encoded, False, False, got[1], name is not None)
        raise DatabaseError("IDEM_ESTORE", got[2])

    @property
    def _conn(self) -> Any:
        """The connection as a void * (cdata pointers hash and compare by
        address: it keys the Python way's statement cache)."""
        return ffi.cast("void *", self._addr)

    def __repr__(self) -> str:
        return "<idem.Transaction %s %s>" % (self.backend, "open" if self._open else
                                            "ended: use tx only inside its function")

    def _close(self) -> None:
        self._open = False


def _sqlite_execute(conn: Any, sql: str, params: Sequence[Any], cache: Statements) -> Cursor:
    """conn: the store's sqlite3 *, as the void * it came in (cdata pointers
    hash and compare by address, so it also keys the statement cache)."""
    n = len(params)
    kinds = bytearray(b"0" * n)
    ints = doubles = ptrs = lens = ffi.NULL
    for i, v in enumerate(params):
        if v is None:
            continue
        cls = v.__class__
        if cls is str or isinstance(v, str):
            b = v.encode("utf-8")
            kind = 3
        elif cls is int or isinstance(v, int):  # bool too
            if not -(1 << 63) <= v < (1 << 63):
                raise DatabaseError("IDEM_EINVAL", "parameter %d: %d does not fit SQLite's "
                                    "64-bit integers" % (i + 1, v))
            if ints == ffi.NULL:
                ints = [0] * n
            ints[i] = int(v)
            kinds[i] = 0x31
            continue
        elif cls is float or isinstance(v, float):
            if doubles == ffi.NULL:
                doubles = [0.0] * n
            doubles[i] = v
            kinds[i] = 0x32
            continue
        elif isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
            kind = 4
        else:
            raise TypeError("parameter %d: %s is not one of int, float, str, bytes "
                            "or None" % (i + 1, type(v).__name__))
        if ptrs == ffi.NULL:
            ptrs, lens = [ffi.NULL] * n, [0] * n
        ptrs[i] = ffi.from_buffer(b)
        lens[i] = len(b)
        kinds[i] = 0x30 + kind
    encoded = sql.encode("utf-8")
    kinds_b = bytes(kinds)
    out = ffi.new("idem_py_sql *")
    rows = []
    rc = -2
    cached = cache.take(conn, encoded)
    try:
        rc = lib.idem_py_sqlite_run(conn, cached, encoded, len(encoded), n, kinds_b, ints,
                                    doubles, ptrs, lens, out)
        cached = ffi.NULL  # now out.stmt
        if rc == _SQLITE_ROW:
            rows.append(_sqlite_row(out.stmt))
            while True:
                rc = lib.sqlite3_step(out.stmt)
                if rc == _SQLITE_ROW:
                    rows.append(_sqlite_row(out.stmt))
                elif rc == _SQLITE_DONE:
                    break
                else:
                    raise DatabaseError("IDEM_ESTORE", _sqlite_error(conn))
    finally:
        stmt = out.stmt or cached
        if stmt:
            # Reset whatever happened (an exception while rows were read
            # included): a statement left mid-step holds a read transaction
            # on the store's connection.
            lib.sqlite3_reset(stmt)
            cache.give(conn, encoded, stmt, rc == _SQLITE_DONE)
    if rc == _SQLITE_DONE:
        if rows or out.columns:
            return Cursor(rows, -1, out.last_rowid)
        return Cursor([], out.changes if _is_dml(encoded) else -1, out.last_rowid)
    if rc == -1:
        raise _sqlite_refused((-2 if out.more else -1, None), n)
    raise DatabaseError("IDEM_ESTORE", _sqlite_error(conn))


def _sqlite_refused(got: Tuple[int, Optional[str]], n: int) -> DatabaseError:
    """The error of a statement refused: got is (SQLite's code, its message),
    or (-1, None) when the parameters do not match it, (-2, None) when the
    text holds a second statement."""
    code, msg = got
    if code == -2:
        return DatabaseError("IDEM_EINVAL", "tx.execute() runs one statement; this "
                             "text has more after the first")
    if code == -1:
        return DatabaseError("IDEM_EINVAL", "the statement's parameters do not match "
                             "the %d given" % n)
    return DatabaseError("IDEM_ESTORE", msg or "SQLite error %d" % code)


def _is_dml(sql: bytes) -> bool:
    """Whether a statement changes rows (its rowcount means something):
    INSERT, UPDATE, DELETE or REPLACE, perhaps after a WITH clause."""
    word = sql.lstrip()[:7].upper()
    return word.startswith((b"INSERT", b"UPDATE", b"DELETE", b"REPLACE")) or (
        word.startswith(b"WITH") and any(w in sql.upper() for w in (
            b"INSERT", b"UPDATE", b"DELETE", b"REPLACE")))


def _sqlite_error(conn: Any) -> str:
    msg = lib.sqlite3_errmsg(ffi.cast("sqlite3 *", conn))
    return str(ffi.string(msg).decode("utf-8", "replace"))


def _sqlite_row(stmt: Any) -> Tuple[Any, ...]:
    row = []
    for c in range(lib.sqlite3_column_count(stmt)):
        t = lib.sqlite3_column_type(stmt, c)
        if t == _SQLITE_INTEGER:
            row.append(lib.sqlite3_column_int64(stmt, c))
        elif t == _SQLITE_FLOAT:
            row.append(lib.sqlite3_column_double(stmt, c))
        elif t == _SQLITE_TEXT:
            p = lib.sqlite3_column_text(stmt, c)
            n = lib.sqlite3_column_bytes(stmt, c)
            row.append(ffi.unpack(ffi.cast("char *", p), n).decode("utf-8", "replace"))
        elif t == _SQLITE_BLOB:
            p = lib.sqlite3_column_blob(stmt, c)
            n = lib.sqlite3_column_bytes(stmt, c)
            row.append(ffi.unpack(ffi.cast("char *", p), n) if n else b"")
        else:
            row.append(None)
    return tuple(row)


def _pg_message(res: Any) -> str:
    msg = lib.PQresultErrorMessage(res) if res != ffi.NULL else ffi.NULL
    return str(ffi.string(msg).decode("utf-8", "replace").strip()) if msg != ffi.NULL \
        else "no result"


def _pg_execute(conn: Any, sql: str, params: Sequence[Any], tx: Transaction) -> Cursor:
    if not hasattr(lib, "PQexecParams"):
        raise DatabaseError("IDEM_EINVAL", "this idem package was built without libpq")
    n = len(params)
    keep = []
    values = ffi.new("char *[]", max(n, 1))
    lengths = ffi.new("int[]", max(n, 1))
    formats = ffi.new("int[]", max(n, 1))
    for i, v in enumerate(params):
        if v is None:
            values[i] = ffi.NULL
            continue
        if isinstance(v, bool):
            b = b"true" if v else b"false"
        elif isinstance(v, int):  # subclasses (IntEnum...) as their value
            b = int.__repr__(v).encode()
        elif isinstance(v, float):
            b = float.__repr__(v).encode()
        elif isinstance(v, str):
            if "\x00" in v:
                raise DatabaseError("IDEM_EINVAL", "parameter %d: PostgreSQL text cannot "
                                    "hold a NUL character" % (i + 1))
            b = v.encode("utf-8")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            b = bytes(v)
            formats[i] = 1  # binary: sent as it is
        else:
            raise TypeError("parameter %d: %s is not one of int, float, str, bytes "
                            "or None" % (i + 1, type(v).__name__))
        buf = ffi.new("char[]", b)
        keep.append(buf)
        values[i] = buf
        lengths[i] = len(b)
    encoded = sql.encode("utf-8")
    cache = tx._statements
    name = None if tx._pg_unsettled else cache.pg_name(conn, encoded)
    if name is not None:
        res = lib.PQexecPrepared(conn, name, n, values, lengths, formats, 0)
    else:
        res = lib.PQexecParams(conn, encoded, n, ffi.NULL, values, lengths, formats, 0)
    try:
        status = lib.PQresultStatus(res) if res != ffi.NULL else -1
        ok = status in (_PGRES_COMMAND_OK, _PGRES_TUPLES_OK)
        state = lib.PQresultErrorField(res, _PG_DIAG_SQLSTATE) if res != ffi.NULL \
            and not ok else ffi.NULL
        if cache.pg_ran(conn, encoded, ok,
                        ok and ffi.string(lib.PQcmdStatus(res)).startswith(_PG_RESETS),
                        ffi.string(state) if state != ffi.NULL else None,
                        name is not None):
            tx._pg_unsettled = True
        if not ok:
            raise DatabaseError("IDEM_ESTORE", _pg_message(res))
        rows = []
        types = [lib.PQftype(res, c) for c in range(lib.PQnfields(res))]
        for r in range(lib.PQntuples(res)):
            row: List[Any] = []
            for c, oid in enumerate(types):
                if lib.PQgetisnull(res, r, c):
                    row.append(None)
                    continue
                raw = ffi.unpack(lib.PQgetvalue(res, r, c), lib.PQgetlength(res, r, c))
                row.append(_pg_value(oid, raw))
            rows.append(tuple(row))
        tuples = ffi.string(lib.PQcmdTuples(res))
        rowcount = int(tuples) if tuples else -1
        return Cursor(rows, rowcount, None)
    finally:
        lib.PQclear(res)


def _pg_value(oid: int, raw: bytes) -> Any:
    if oid in _PG_INT:
        return int(raw)
    if oid in _PG_FLOAT:
        return float(raw)
    if oid == _PG_BOOL:
        return raw == b"t"
    if oid == _PG_BYTEA:
        return bytes.fromhex(raw[2:].decode()) if raw.startswith(b"\\x") else raw
    return raw.decode("utf-8", "replace")


# tx.execute() on SQLite in one crossing: idem._speedups calls the SQLite
# idem._native was linked with, through its table.
_speedups.sqlite_setup(int(ffi.cast("uintptr_t", lib.idem_py_sqlite_fns())), Cursor,
                       Statements.LIMIT)
_fast_sqlite = _speedups.sqlite_execute
# And on PostgreSQL, when the package has libpq.
_fast_pg = None
if hasattr(lib, "idem_py_pg_fns"):
    _speedups.pg_setup(int(ffi.cast("uintptr_t", lib.idem_py_pg_fns())))
    _fast_pg, _pg_simple = _speedups.pg_execute, _speedups.pg_simple
