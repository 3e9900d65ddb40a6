"""tx.execute(): the caller's statements on the store's own connection,
inside the transaction that also writes the record."""
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


class Cursor:
    """The rows of one statement, read whole when it ran."""

    def __init__(self, rows: List[Tuple[Any, ...]], rowcount: int,
                 lastrowid: Optional[int]) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    def fetchone(self) -> Optional[Tuple[Any, ...]]:
        if self._next >= len(self._rows):
            return None
        row = self._rows[self._next]
        self._next += 1
        return row

    def fetchall(self) -> List[Tuple[Any, ...]]:
        rows = self._rows[self._next:]
        self._next = len(self._rows)
        return rows

    def __iter__(self):
        return iter(self.fetchall())


class Statements:
    """SQLite statements prepared on a store's connection, kept for the next
    transaction (preparing one costs more than running it). Statements of
    one connection are used by one transaction at a time, since the store
    runs them there one after the other; close() finalizes them all, before
    the store closes its connections."""

    LIMIT = 64

    def __init__(self) -> None:
        self._kept: Dict[Tuple[Any, bytes], Any] = {}
        self._pg: Dict[Tuple[Any, int, bytes], bytes] = {}  # PostgreSQL: names
        self._count = 0

    def take(self, conn: Any, sql: bytes) -> Any:
        return self._kept.pop((conn, sql), ffi.NULL)  # atomic under the GIL

    def give(self, conn: Any, sql: bytes, stmt: Any, keep: bool) -> None:
        if keep and len(self._kept) < self.LIMIT and \
                self._kept.setdefault((conn, sql), stmt) is stmt:
            return
        lib.sqlite3_finalize(stmt)

    def pg_name(self, conn: Any, sql: bytes) -> Optional[bytes]:
        """The name of sql prepared on this PostgreSQL session, preparing it
        the first time; None when the cache is full (the caller then sends
        it unprepared). A statement the server refuses raises
        DatabaseError, as running it would. A session is known by its
        connection and its server process: a connection that libidem reset
        is a new session, whose statements are prepared again."""
        key = (conn, lib.PQbackendPID(conn), sql)
        name = self._pg.get(key)
        if name is not None or len(self._pg) >= self.LIMIT:
            return name  # type: ignore[no-any-return]
        self._count += 1
        name = b"idem_py_%d" % self._count
        res = lib.PQprepare(conn, name, sql, 0, ffi.NULL)
        try:
            if lib.PQresultStatus(res) != _PGRES_COMMAND_OK:
                # What running it would have said (and, as then, the
                # transaction is now aborted).
                msg = lib.PQresultErrorMessage(res) if res != ffi.NULL else ffi.NULL
                raise DatabaseError("IDEM_ESTORE", ffi.string(msg).decode(
                    "utf-8", "replace").strip() if msg != ffi.NULL else "no result")
        finally:
            lib.PQclear(res)
        self._pg[key] = name
        return name

    def close(self) -> None:
        kept, self._kept = self._kept, {}
        self._pg = {}
        for stmt in kept.values():
            lib.sqlite3_finalize(stmt)


class Transaction:
    """Valid only while the function it was given to runs."""

    def __init__(self, backend: str, conn: Any, statements: Optional[Statements] = None) -> None:
        self.backend = backend
        self._conn = conn
        self._open = True
        self._statements = statements if statements is not None else Statements()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if not self._open:
            raise DatabaseError("IDEM_ESTATE", "the transaction has ended: use tx "
                                "only inside the function it was given to")
        if self.backend == "sqlite":
            return _sqlite_execute(self._conn, sql, params, self._statements)
        return _pg_execute(ffi.cast("PGconn *", self._conn), sql, params, self._statements)

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
    out = ffi.new("idem_py_sql *")
    cached = cache.take(conn, encoded)
    rc = lib.idem_py_sqlite_run(conn, cached, encoded, len(encoded), n, bytes(kinds), ints,
                                doubles, ptrs, lens, out)
    stmt = out.stmt
    rows = []
    try:
        if rc == _SQLITE_ROW:
            rows.append(_sqlite_row(stmt))
            while True:
                rc = lib.sqlite3_step(stmt)
                if rc == _SQLITE_ROW:
                    rows.append(_sqlite_row(stmt))
                elif rc == _SQLITE_DONE:
                    break
                else:
                    raise DatabaseError("IDEM_ESTORE", _sqlite_error(conn))
            lib.sqlite3_reset(stmt)
    finally:
        if stmt:
            cache.give(conn, encoded, stmt, rc == _SQLITE_DONE or rc == _SQLITE_ROW)
    if rc == _SQLITE_DONE:
        if rows:
            return Cursor(rows, -1, out.last_rowid)
        return Cursor([], out.changes if out.columns == 0 else -1, out.last_rowid)
    if rc == -1:
        if out.more:
            raise DatabaseError("IDEM_EINVAL", "tx.execute() runs one statement; this "
                                "text has more after the first")
        raise DatabaseError("IDEM_EINVAL", "the statement's parameters do not match the "
                            "%d given" % n)
    raise DatabaseError("IDEM_ESTORE", _sqlite_error(conn))


def _sqlite_error(conn: Any) -> str:
    msg = lib.sqlite3_errmsg(ffi.cast("sqlite3 *", conn))
    return ffi.string(msg).decode("utf-8", "replace")


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


def _pg_execute(conn: Any, sql: str, params: Sequence[Any], cache: Statements) -> Cursor:
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
        elif isinstance(v, (int, float)):
            b = repr(v).encode()
        elif isinstance(v, str):
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
    name = cache.pg_name(conn, encoded)
    if name is not None:
        res = lib.PQexecPrepared(conn, name, n, values, lengths, formats, 0)
    else:
        res = lib.PQexecParams(conn, encoded, n, ffi.NULL, values, lengths, formats, 0)
    try:
        status = lib.PQresultStatus(res)
        if status not in (_PGRES_COMMAND_OK, _PGRES_TUPLES_OK):
            msg = lib.PQresultErrorMessage(res) if res != ffi.NULL else ffi.NULL
            text = ffi.string(msg).decode("utf-8", "replace").strip() if msg != ffi.NULL \
                else "no result"
            raise DatabaseError("IDEM_ESTORE", text)
        rows = []
        types = [lib.PQftype(res, c) for c in range(lib.PQnfields(res))]
        for r in range(lib.PQntuples(res)):
            row = []
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
