"""idem: run side-effecting functions at most once per key.

    import idem
    store = idem.open("sqlite:./idem.db")

    @store.idempotent("create_ticket", key="request_id")
    def create_ticket(project, title, priority, request_id): ...

A retry with the same key (the same request_id) returns the first call's
result without running the function again; a call with the same key but
other arguments raises idem.Conflict, and one made while the first still
runs raises idem.InFlight (or waits, with wait=). create_ticket.outcome(...)
makes the same call and returns an idem.Outcome: .value, and .replayed
(True when the stored result answered it). Stores: "sqlite:PATH" (one file,
one machine) or "postgresql://..." (many processes or machines).

store.execute() runs a callable once per key without a decorator, and
store.execute_local() runs a function inside the store's own transaction,
so that what it writes through tx.execute() commits with the record.
Operators settle, list and delete records with store.get(), list(),
resolve(), delete() and prune(), or `python -m idem keys --help`.

For tests, `with idem.disabled():` (or IDEM_DISABLED=1 in the environment)
makes decorated functions plain calls. `from idem import *` brings in
Store, Outcome and the exceptions, not open (which would hide the
builtin): call idem.open().
"""
from ._errors import (Conflict, DatabaseError, Error, InFlight, InvalidArgument, LeaseLost,
                      NotDone, OutcomeUnknown, StoreUnavailable)
try:
    from ._native import ffi as _ffi, lib as _lib
except ModuleNotFoundError as _e:  # cffi's run-time part, which the package needs
    if _e.name != "_cffi_backend":
        raise
    import sys as _sys
    raise ImportError(
        "idem needs cffi (its _cffi_backend) in %s: `pip install cffi`, or in a venv "
        "made without --system-site-packages on Debian, make it again with that option "
        "after `apt-get install python3-cffi`" % _sys.prefix) from _e
from ._records import Record
from ._store import AsyncIdempotent, Idempotent, Outcome, Store, disabled
from ._store import open as open  # exported, but not by `import *` (see __all__)
from ._tx import Cursor, Transaction

__version__ = "0.3.0"


def libidem_version() -> str:
    """The version of libidem this package runs on."""
    return str(_ffi.string(_lib.idem_version()).decode())


# Not open: `from idem import *` would hide the builtin open().
__all__ = ["Store", "Outcome", "Idempotent", "AsyncIdempotent", "Record", "Transaction",
           "Cursor", "Error", "Conflict", "InFlight", "OutcomeUnknown", "StoreUnavailable",
           "InvalidArgument", "DatabaseError", "LeaseLost", "NotDone", "disabled",
           "libidem_version"]
