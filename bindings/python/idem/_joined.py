"""conn=: the application's own connection, whose open transaction a local
action joins (libidem's idem_execute_in()).

A sqlite3.Connection on the store's file, a psycopg 3 Connection to the
store's database, or a SQLAlchemy connection of either (engine.connect(),
engine.raw_connection(), session.connection()). What libidem needs of it
is the C handle under it (a sqlite3 *, a PGconn *), and that handle must
belong to the very library copy libidem calls: a handle of another copy
(a wheel that bundles its own) is refused, never used.
"""
import ctypes
import importlib
import sqlite3
import sys
from typing import Any, Callable, Optional, Tuple

from ._errors import InvalidArgument
from ._native import ffi, lib

# CPython's sqlite3.Connection keeps its sqlite3 * first after the object
# header, in every version this package builds on (3.10 to 3.13).
_SQLITE_DB_OFFSET = object.__basicsize__
_SUPPORTED = sys.implementation.name == "cpython" and (3, 10) <= sys.version_info[:2] <= (3, 13)


def _refuse(why: str) -> InvalidArgument:
    return InvalidArgument("IDEM_EINVAL", "conn=: " + why)


def _unwrap(conn: Any) -> Any:
    """The DB-API connection under a SQLAlchemy Connection or pooled
    connection (a few levels at most)."""
    for _ in range(4):
        if isinstance(conn, sqlite3.Connection) or _is_psycopg(conn):
            return conn
        inner = getattr(conn, "driver_connection", None)
        if inner is None:
            inner = getattr(conn, "dbapi_connection", None)
        if inner is None:
            inner = getattr(conn, "connection", None)  # SQLAlchemy's Connection
        if inner is None or inner is conn:
            return conn
        conn = inner
    return conn


def _is_psycopg(conn: Any) -> bool:
    mod = type(conn).__module__ or ""
    return mod == "psycopg" or mod.startswith("psycopg.")


_sqlite_same: Optional[bool] = None


def _sqlite_library_is_ours() -> bool:
    """Whether Python's sqlite3 module calls the SQLite that libidem calls
    (the same sqlite3_libversion() in this process)."""
    global _sqlite_same
    if _sqlite_same is None:
        try:
            module = importlib.import_module("_sqlite3")  # the sqlite3 module's C part
            theirs = ctypes.cast(ctypes.CDLL(module.__file__).sqlite3_libversion,
                                 ctypes.c_void_p).value
        except (ImportError, OSError, AttributeError):
            theirs = None
        ours = int(ffi.cast("uintptr_t", lib.idem_py_sqlite_lib()))
        _sqlite_same = theirs is not None and theirs == ours
    return _sqlite_same


def _sqlite_handle(conn: sqlite3.Connection) -> int:
    if not _SUPPORTED:
        raise _refuse("a sqlite3.Connection is read on CPython 3.10 to 3.13 only")
    if not _sqlite_library_is_ours():
        raise _refuse("Python's sqlite3 module uses another copy of SQLite than idem "
                      "(same version or not); a connection of one cannot be used by the "
                      "other")
    try:
        in_tx = conn.in_transaction
        rows = conn.execute("PRAGMA database_list").fetchall()
    except sqlite3.ProgrammingError as e:  # closed, or another thread's
        raise _refuse(str(e)) from None
    autocommit = getattr(conn, "autocommit", None)  # Python 3.12
    if not in_tx and (autocommit is True or conn.isolation_level is None):
        raise _refuse("the connection is in autocommit mode with no transaction open: "
                      "BEGIN first (or use isolation_level's default), so that "
                      "your COMMIT decides")
    main = next((r[2] for r in rows if r[1] == "main"), "")
    addr = ctypes.c_void_p.from_address(id(conn) + _SQLITE_DB_OFFSET).value
    if not addr:
        raise _refuse("the sqlite3.Connection has no open database")
    named = lib.sqlite3_db_filename(ffi.cast("sqlite3 *", addr), b"main")
    if named == ffi.NULL or ffi.string(named).decode("utf-8", "replace") != main:
        raise _refuse("cannot read the sqlite3.Connection's handle")
    return int(addr)


def _psycopg_handle(conn: Any) -> int:
    import psycopg
    if isinstance(conn, getattr(psycopg, "AsyncConnection", ())):
        raise TypeError("conn=: a psycopg.AsyncConnection is not supported; use a "
                        "psycopg.Connection")
    if not isinstance(conn, psycopg.Connection):
        raise TypeError("conn=: not a psycopg.Connection: %s" % type(conn).__name__)
    if conn.closed:
        raise _refuse("the psycopg connection is closed")
    if not hasattr(lib, "idem_py_pq_lib"):
        raise _refuse("this idem was built without PostgreSQL")
    impl = getattr(psycopg.pq, "__impl__", "")
    if impl == "binary":
        raise _refuse("psycopg[binary] carries its own libpq; install psycopg's "
                      "python or c implementation, which use the system's libpq as "
                      "idem does")
    if psycopg.pq.version() != lib.PQlibVersion():
        raise _refuse("psycopg uses libpq %d and idem libpq %d"
                      % (psycopg.pq.version(), lib.PQlibVersion()))
    if impl == "python":
        try:
            pq: Any = psycopg.pq
            theirs = ctypes.cast(pq._pq_ctypes.pq.PQlibVersion, ctypes.c_void_p).value
        except AttributeError:
            theirs = None
        if theirs is not None and \
                theirs != int(ffi.cast("uintptr_t", lib.idem_py_pq_lib())):
            raise _refuse("psycopg calls another copy of libpq than idem")
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if idle and conn.autocommit:
        raise _refuse("the connection is in autocommit mode with no transaction open: "
                      "use `with conn.transaction():`, so that its end decides")
    pgconn: Any = conn.pgconn
    return int(pgconn.pgconn_ptr)


def closed_check(raw: Any) -> Callable[[], bool]:
    """A function telling whether the DB-API connection raw was closed."""
    if isinstance(raw, sqlite3.Connection):
        def sqlite_closed() -> bool:
            try:
                raw.total_changes
            except sqlite3.ProgrammingError:
                return True
            return False
        return sqlite_closed
    return lambda: bool(raw.closed)


def handle(conn: Any, backend: str) -> Tuple[int, Any]:
    """(the address of conn's sqlite3 * or PGconn *, the DB-API connection)
    for the store of backend ("sqlite" or "postgresql"); a TypeError or an
    InvalidArgument saying why not."""
    raw = _unwrap(conn)
    if isinstance(raw, sqlite3.Connection):
        if backend != "sqlite":
            raise _refuse("a sqlite3.Connection, for a PostgreSQL store")
        return _sqlite_handle(raw), raw
    if _is_psycopg(raw):
        if backend != "postgresql":
            raise _refuse("a psycopg connection, for a SQLite store")
        return _psycopg_handle(raw), raw
    raise TypeError("conn= takes a sqlite3.Connection, a psycopg.Connection or a "
                    "SQLAlchemy connection of one, not %s" % type(conn).__name__)
