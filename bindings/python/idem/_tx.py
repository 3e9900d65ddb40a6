"""tx.execute(): the caller's statements on the store's own connection,
inside the transaction that also writes the record."""
from typing import Any, List, Optional, Sequence, Tuple

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


class Transaction:
    """Valid only while the function it was given to runs."""

    def __init__(self, backend: str, conn: Any) -> None:
        self.backend = backend
        self._conn = conn
        self._open = True

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        if not self._open:
            raise DatabaseError("IDEM_ESTATE", "the transaction has ended: use tx "
                                "only inside the function it was given to")
        if self.backend == "sqlite":
            return _sqlite_execute(ffi.cast("sqlite3 *", self._conn), sql, params)
        return _pg_execute(ffi.cast("PGconn *", self._conn), sql, params)

    def _close(self) -> None:
        self._open = False


def _sqlite_execute(db: Any, sql: str, params: Sequence[Any]) -> Cursor:
    stmt_p = ffi.new("sqlite3_stmt **")
    tail_p = ffi.new("const char **")
    encoded = sql.encode("utf-8")
    buf = ffi.from_buffer(encoded)
    if lib.sqlite3_prepare_v2(db, buf, len(encoded), stmt_p, tail_p) != 0:
        raise DatabaseError("IDEM_ESTORE", ffi.string(lib.sqlite3_errmsg(db)).decode(
            "utf-8", "replace"))
    stmt = stmt_p[0]
    if stmt == ffi.NULL:  # only a comment or white space
        return Cursor([], -1, None)
    rest = encoded[ffi.cast("char *", tail_p[0]) - ffi.cast("char *", buf):]
    if rest.strip() and _has_statement(db, rest):
        lib.sqlite3_finalize(stmt)
        raise DatabaseError("IDEM_EINVAL", "tx.execute() runs one statement; this text "
                            "has more after the first: %r" % rest.decode("utf-8", "replace")[:80])
    try:
        want = lib.sqlite3_bind_parameter_count(stmt)
        if want != len(params):
            raise DatabaseError("IDEM_EINVAL", "the statement takes %d parameter(s), "
                                "%d given" % (want, len(params)))
        for i, v in enumerate(params, 1):
            _sqlite_bind(db, stmt, i, v)
        rows = []
        while True:
            rc = lib.sqlite3_step(stmt)
            if rc == _SQLITE_ROW:
                rows.append(_sqlite_row(stmt))
            elif rc == _SQLITE_DONE:
                break
            else:
                raise DatabaseError("IDEM_ESTORE", ffi.string(
                    lib.sqlite3_errmsg(db)).decode("utf-8", "replace"))
        writes = lib.sqlite3_column_count(stmt) == 0
        return Cursor(rows, lib.sqlite3_changes(db) if writes else -1,
                      lib.sqlite3_last_insert_rowid(db))
    finally:
        lib.sqlite3_finalize(stmt)


def _has_statement(db: Any, text: bytes) -> bool:
    """Whether text holds a statement (not only comments, white space or
    semicolons)."""
    stmt_p = ffi.new("sqlite3_stmt **")
    rc = lib.sqlite3_prepare_v2(db, text, len(text), stmt_p, ffi.NULL)
    if stmt_p[0] != ffi.NULL:
        lib.sqlite3_finalize(stmt_p[0])
        return True
    return rc != 0


def _sqlite_bind(db: Any, stmt: Any, i: int, v: Any) -> None:
    if v is None:
        rc = lib.sqlite3_bind_null(stmt, i)
    elif isinstance(v, bool) or isinstance(v, int):
        rc = lib.sqlite3_bind_int64(stmt, i, int(v))
    elif isinstance(v, float):
        rc = lib.sqlite3_bind_double(stmt, i, v)
    elif isinstance(v, str):
        b = v.encode("utf-8")
        rc = lib.idem_py_bind_text(stmt, i, b, len(b))
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        rc = lib.idem_py_bind_blob(stmt, i, b, len(b))
    else:
        raise TypeError("parameter %d: %s is not one of int, float, str, bytes "
                        "or None" % (i, type(v).__name__))
    if rc != 0:
        raise DatabaseError("IDEM_ESTORE", ffi.string(lib.sqlite3_errmsg(db)).decode(
            "utf-8", "replace"))


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
