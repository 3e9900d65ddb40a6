"""tx.execute(): the caller's statements on the store's own connection,
inside the transaction that also writes the record."""
import threading
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

    def take(self, conn: Any, sql: bytes) -> Any:
        return self._kept.pop((conn, sql), ffi.NULL)  # atomic under the GIL

    def give(self, conn: Any, sql: bytes, stmt: Any, keep: bool) -> None:
        if keep and len(self._kept) < self.LIMIT and \
                self._kept.setdefault((conn, sql), stmt) is stmt:
            return
        lib.sqlite3_finalize(stmt)

    def close(self) -> None:
        kept, self._kept = self._kept, {}
        for stmt in kept.values():
            lib.sqlite3_finalize(stmt)


class Transaction:
    """Valid only while the function it was given to runs."""

    def __init__(self, backend: str, conn: Any, statements: Optional[Statements] = None) -> None:
        self.backend = backend
        self._conn = conn
        self._open = True
        self._statements = statements if statements is not None else Statements()
        self._thread = threading.get_ident()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if not self._open:
            raise DatabaseError("IDEM_ESTATE", "the transaction has ended: use tx "
                                "only inside the function it was given to")
        if threading.get_ident() != self._thread:
            raise DatabaseError("IDEM_ESTATE", "tx.execute() from another thread: the "
                                "store's connection is used by one thread at a time, the "
                                "one running the function")
        if isinstance(params, (str, bytes, bytearray, dict)):
            raise TypeError("params: a sequence (a tuple or a list) of values, not %s"
                            % type(params).__name__)
        if self.backend == "sqlite":
            return _sqlite_execute(self._conn, sql, params, self._statements)
        return _pg_execute(ffi.cast("PGconn *", self._conn), sql, params)

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
        if out.more:
            raise DatabaseError("IDEM_EINVAL", "tx.execute() runs one statement; this "
                                "text has more after the first")
        raise DatabaseError("IDEM_EINVAL", "the statement's parameters do not match the "
                            "%d given" % n)
    raise DatabaseError("IDEM_ESTORE", _sqlite_error(conn))


def _is_dml(sql: bytes) -> bool:
    """Whether a statement changes rows (its rowcount means something):
    INSERT, UPDATE, DELETE or REPLACE, perhaps after a WITH clause."""
    word = sql.lstrip()[:7].upper()
    return word.startswith((b"INSERT", b"UPDATE", b"DELETE", b"REPLACE")) or (
        word.startswith(b"WITH") and any(w in sql.upper() for w in (
            b"INSERT", b"UPDATE", b"DELETE", b"REPLACE")))


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


def _pg_execute(conn: Any, sql: str, params: Sequence[Any]) -> Cursor:
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
    res = lib.PQexecParams(conn, sql.encode("utf-8"), n, ffi.NULL, values, lengths,
                           formats, 0)
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
