"""idem: run side-effecting functions at most once per key.

    import idem
    store = idem.open("sqlite:./idem.db")

    @store.idempotent("create_ticket", key="request_id")
    def create_ticket(project, title, priority, request_id): ...

A retry with the same key returns the first call's result without running
the function again; see docs/python.md.
"""
from ._errors import (Conflict, DatabaseError, Error, InFlight, InvalidArgument, LeaseLost,
                      NotDone, OutcomeUnknown, StoreUnavailable)
from ._native import ffi as _ffi, lib as _lib
from ._records import Record
from ._store import Outcome, Store, open
from ._tx import Cursor, Transaction

__version__ = "0.3.0"


def libidem_version() -> str:
    """The version of libidem this package runs on."""
    return _ffi.string(_lib.idem_version()).decode()


__all__ = ["open", "Store", "Outcome", "Record", "Transaction", "Cursor", "Error", "Conflict",
           "InFlight", "OutcomeUnknown", "StoreUnavailable", "InvalidArgument",
           "DatabaseError", "LeaseLost", "NotDone", "libidem_version"]
