"""The exceptions of idem: every failure is an idem.Error with the C code."""
from typing import Any, Dict, Optional, Type


class Error(Exception):
    """A call that failed. .code is libidem's result name ("IDEM_ESTORE")
    or the outcome that refused the call ("IDEM_CONFLICT"); .message says
    why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        # Set when the function ran but its result could not be stored
        # (LeaseLost, a result too large, a store that failed): what it
        # returned.
        self.value: object = None

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Rebuilt whole in another process (a multiprocessing pool's
        # worker raising it): the class, the code, the message and the
        # attributes, not the constructor's arguments.
        return (_rebuild, (self.__class__, self.code, self.message, dict(self.__dict__)))


def _rebuild(cls: "Type[Error]", code: str, message: str, state: Dict[str, Any]) -> "Error":
    err = cls.__new__(cls)
    Exception.__init__(err, "%s: %s" % (code, message))
    err.__dict__.update(state)
    return err


class Conflict(Error):
    """The key was used before with other arguments; nothing ran."""


class InFlight(Error):
    """Another call holds the key and is still running; nothing ran.
    .retry_after: seconds until its lease ends."""

    def __init__(self, code: str, message: str, retry_after: float) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after


class OutcomeUnknown(Error):
    """An earlier call with this key may or may not have acted (it raised,
    or died, and takeover is not allowed, or the key reached max_attempts);
    nothing ran. An operator settles it with `python -m idem keys resolve`
    (or Store.resolve(); the idem program's `idem keys resolve` is the
    same)."""


class StoreUnavailable(Error):
    """The store could not be reached, was busy past its timeout, or failed
    a read or write (the call's transaction was rolled back)."""


class InvalidArgument(Error, ValueError):
    """A key, tenant, operation, option or URL that libidem refuses."""


class DatabaseError(Error):
    """A statement run through tx.execute() failed."""


class LeaseLost(Error):
    """The function ran, but its lease was taken over before its result was
    stored: another caller may act again. .value is what it returned."""

    def __init__(self, code: str, message: str, value: object = None) -> None:
        super().__init__(code, message)
        self.value = value


class NotDone(Exception):
    """Raised by a function that did not act: its key is released, so that a
    retry runs it again."""


_UNAVAILABLE = {"IDEM_EUNAVAILABLE", "IDEM_EBUSY", "IDEM_EIO", "IDEM_ESTORE"}
_INVALID = {"IDEM_EINVAL", "IDEM_EKEY", "IDEM_EURL", "IDEM_ETOOBIG",
            "IDEM_EJSON", "IDEM_EDUPKEY", "IDEM_EUTF8", "IDEM_ERANGE",
            "IDEM_EDEPTH"}


def from_code(code: str, message: str, value: Optional[object] = None) -> Error:
    """The exception for a libidem result name."""
    if code in _UNAVAILABLE:
        return StoreUnavailable(code, message)
    if code in _INVALID:
        return InvalidArgument(code, message)
    if code == "IDEM_ESTALE":
        return LeaseLost(code, message, value)
    return Error(code, message)
