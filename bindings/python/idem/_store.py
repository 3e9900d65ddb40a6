"""Stores, the decorator and the two ways to run an action once."""
import asyncio
import contextlib
import contextvars
import datetime
import functools
import importlib
import inspect
import json
import os
import re
import shlex
import threading
import weakref
from typing import (Any, Awaitable, Callable, Dict, Generic, Iterable, Iterator, List,
                    Optional, ParamSpec, Protocol, Sequence, Set, Tuple, Type, TypeVar,
                    Union, cast, overload)

from . import _errors, _joined, _speedups, _values
from ._errors import Conflict, Error, InFlight, InvalidArgument, NotDone, OutcomeUnknown
from ._native import ffi, lib
from ._records import Record, record_of
from ._tx import Statements, Transaction

# A duration: seconds (int or float), a string such as "30s", "500ms", "5m",
# "2h" or "1d", or a datetime.timedelta; None for libidem's default.
Seconds = Union[int, float, str, "datetime.timedelta", None]
KeySpec = Union[str, Callable[[Dict[str, Any]], str]]
# Exception classes and predicates (callables taking the exception), one or many.
ReleaseOn = Union[Type[BaseException], Callable[[BaseException], Any],
                  Iterable[Union[Type[BaseException], Callable[[BaseException], Any]]]]
TenantSpec = Union[str, Callable[[Dict[str, Any]], str], None]

# idem_outcome and idem_exec_result, as in idem.h.
_PROCEED, _REPLAY, _CONFLICT, _IN_FLIGHT, _RECOVER, _UNKNOWN = 1, 2, 3, 4, 5, 6
_DONE, _NOT_DONE, _MARK_UNKNOWN = 0, 1, 2
_OK, _EREJECTED, _ESTATE = 0, 18, 19
_LOCAL_CLOSED = int(lib.IDEM_LOCAL_CLOSED)

_UNITS = {"ms": 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


_DAY_MS = 86400000
_LIMITS_MS = {"lease": 30 * _DAY_MS, "wait": 30 * _DAY_MS, "retention": 36525 * _DAY_MS,
              "busy_timeout": 2 ** 31 - 1}


def _ms(value: Seconds, name: str) -> int:
    """Milliseconds from a number of seconds or a string like "30s"; 0 for
    None (libidem's default). Bounded as libidem bounds it."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise InvalidArgument("IDEM_EINVAL", "%s: %r is not a duration" % (name, value))
    if isinstance(value, (int, float)):
        ms = value * 1000
    elif isinstance(value, datetime.timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise InvalidArgument("IDEM_EINVAL", "%s: %r is not a duration such as "
                                  "30, \"500ms\", \"30s\", \"5m\", \"2h\" or \"1d\""
                                  % (name, value))
        ms = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        raise InvalidArgument("IDEM_EINVAL", "%s: %r is not a duration" % (name, value))
    if ms != ms or ms < 0:
        raise InvalidArgument("IDEM_EINVAL", "%s: %r is not a duration" % (name, value))
    limit = _LIMITS_MS.get(name)
    if limit is not None and ms > limit:
        raise InvalidArgument("IDEM_EINVAL", "%s: %r is longer than the most allowed, %d "
                              "days" % (name, value, limit // _DAY_MS) if limit >= _DAY_MS
                              else "%s: %r is longer than %d ms" % (name, value, limit))
    return max(1, int(ms)) if ms > 0 else 0


def _text(value: Any, what: str, code: str = "IDEM_EINVAL") -> bytes:
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    if "\x00" in value:
        raise InvalidArgument(code, "%s contains a NUL character" % what)
    return value.encode("utf-8")


def _key(value: Any) -> bytes:
    """A key: a str of printable ASCII (libidem checks the rest)."""
    if value is None:
        raise InvalidArgument("IDEM_EKEY", "no key: the key is None")
    return _text(value, "key", "IDEM_EKEY")


# JSON's values as json writes them, and the rest by idem's rule (see
# idem._values): json's C encoder, made once, with the rule as its default=.
_encode = _values.PLAIN.encode
_raw_decode = json.JSONDecoder().raw_decode
# The scanner raw_decode() runs, without its look for leading white space:
# what the binding stores has none (a body that does goes to _decode()).
_scan: Callable[[str, int], Tuple[Any, int]] = importlib.import_module(
    "json.scanner").make_scanner(json.JSONDecoder())


def _decode(text: str) -> Any:
    """A stored body as JSON: JSON's white space about it is allowed (an
    operator's file may end with a newline, or start with one), nothing
    else."""
    body = text.strip(" \t\n\r")
    value, end = _raw_decode(body)
    if end != len(body):
        raise ValueError("extra data after the JSON value")
    return value


_NAMES: Dict[str, bytes] = {}


def _name(value: Any, what: str) -> bytes:
    """An operation or tenant, encoded once: they repeat from call to call."""
    try:
        return _NAMES[value]
    except (KeyError, TypeError):
        b = _text(value, what)
        if len(_NAMES) < 1024:
            _NAMES[value] = b
        return b


def _dump(value: Any) -> bytes:
    return _encode(value).encode("utf-8")


class _Pending:
    """A result to be written with the caller's encoder= (the decorator's,
    or a call's): what the function run from C returns in its result's
    place when there is one. idem._speedups writes no such object, so it
    hands it to _result_body() or _local_body(), which write its value
    with its Writer."""

    __slots__ = ("value", "writer")

    def __init__(self, value: Any, writer: "_values.Writer") -> None:
        self.value = value
        self.writer = writer


def _pending(fn: Callable[..., Any], writer: "_values.Writer") -> Callable[..., Any]:
    """fn, its result handed on as a _Pending of writer's."""
    def run(*args, **kwargs):  # type: ignore[no-untyped-def] # no annotation to read
        return _Pending(fn(*args, **kwargs), writer)
    return run


def _result_json(value: Any) -> bytes:
    """What a function returned (or a _Pending of it) as JSON bytes."""
    if value.__class__ is _Pending:
        body: bytes = value.writer.encode(value.value).encode("utf-8")
        return body
    return _dump(value)


def _unstorable(e: BaseException) -> TypeError:
    """The error of a result that cannot be stored, after the function
    acted: the key is marked unknown."""
    return TypeError("the function acted, but its result cannot be stored as JSON (the key "
                     "is marked unknown): %s" % _values.hint(e, True))


def _address(cdata: Any) -> int:
    return int(ffi.cast("uintptr_t", cdata))


def _fail(rc: int, value: Any = None) -> Error:
    """The exception for a failed libidem call, read on the thread that made
    it (idem_errmsg() is per thread)."""
    name = ffi.string(lib.idem_rc_name(rc)).decode()
    return _errors.from_code(name, ffi.string(lib.idem_errmsg()).decode("utf-8", "replace"),
                             value)


_P = ParamSpec("_P")
_R = TypeVar("_R")
_T_co = TypeVar("_T_co", covariant=True)


class Outcome(_speedups.OutcomeBase, Generic[_T_co]):
    """What a call returned: .value (JSON-decoded, and rebuilt as the
    declared return type, the same on the first call and on every replay),
    .replayed (True when the function did not run because an earlier
    call's result was stored) and .recovered (True when an earlier attempt
    may also have acted: its holder died or raised and this call, or the
    one whose result is replayed, took the key over).

    Outcome[T] is the Outcome of a function that returns T: what
    f.outcome(...) returns for a decorated f."""

    # The fields are idem._speedups.OutcomeBase's: made in C, as most
    # Outcomes are, with no Python code run. Outcome(value, replayed,
    # recovered) makes one too.
    __slots__ = ()
    value: _T_co
    replayed: bool
    recovered: bool

    def __repr__(self) -> str:
        return "Outcome(value=%r, replayed=%r, recovered=%r)" % (
            self.value, self.replayed, self.recovered)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, bool, bool]]:  # pickles as it was made
        return Outcome, (self.value, self.replayed, self.recovered)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Outcome) and (self.value, self.replayed, self.recovered) \
            == (other.value, other.replayed, other.recovered)


class Idempotent(Protocol[_P, _T_co]):
    """What store.idempotent() makes of a function (def): called as the
    function is, with its arguments and its return type; f.outcome(...)
    makes the same call and returns its Outcome (the value, and whether it
    was replayed or recovered). For type annotations only: it is not a
    class of the objects themselves."""

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _T_co:
        """The call: the function's result, run or replayed."""

    def outcome(self, *args: _P.args, **kwargs: _P.kwargs) -> "Outcome[_T_co]":
        """The same call: its Outcome (.value, .replayed, .recovered)."""

    # A method: through its class, the function; through an instance, bound
    # to it (self given), its return type kept (its arguments not checked:
    # Concatenate in a self type is beyond the mypy of Debian 12).
    @overload
    def __get__(self, obj: None, cls: Any, /) -> "Idempotent[_P, _T_co]": ...

    @overload
    def __get__(self, obj: object, cls: Any, /) -> "Idempotent[..., _T_co]": ...


class AsyncIdempotent(Protocol[_P, _T_co]):
    """What store.idempotent() makes of an async function (async def): a
    call returns an awaitable of the function's result, and f.outcome(...)
    an awaitable of its Outcome. For type annotations only."""

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> Awaitable[_T_co]:
        """The call: awaited, the function's result, run or replayed."""

    def outcome(self, *args: _P.args, **kwargs: _P.kwargs) -> "Awaitable[Outcome[_T_co]]":
        """The same call: awaited, its Outcome (.value, .replayed,
        .recovered)."""

    @overload
    def __get__(self, obj: None, cls: Any, /) -> "AsyncIdempotent[_P, _T_co]": ...

    @overload
    def __get__(self, obj: object, cls: Any, /) -> "AsyncIdempotent[..., _T_co]": ...


class _Decorator(Protocol):
    """What store.idempotent(...) returns: the decorator, typed so that a
    decorated function keeps its signature and return type."""

    # An async function matches both: the first is meant (hence the ignore).
    @overload
    def __call__(  # type: ignore[misc]
            self, fn: Callable[_P, Awaitable[_R]]) -> AsyncIdempotent[_P, _R]: ...

    @overload
    def __call__(self, fn: Callable[_P, _R]) -> Idempotent[_P, _R]: ...

    @overload
    def __call__(self, fn: Any) -> Any: ...  # a staticmethod or classmethod object


# The switch that makes every decorated function a plain call, for tests
# (as AWS Lambda Powertools' POWERTOOLS_IDEMPOTENCY_DISABLED does): set by
# IDEM_DISABLED=1 (or true, yes, on) in the environment when idem is
# imported, and by idem.disabled().
_DISABLED = os.environ.get("IDEM_DISABLED", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def disabled(flag: bool = True) -> Iterator[None]:
    """Within the block, every function decorated with store.idempotent()
    is a plain call, for tests: the function runs each time it is called,
    with nothing claimed, stored or replayed, and the store is not touched
    (it may even be closed). Its result is what the function returns, not
    a copy read back from JSON; f.outcome(...) returns Outcome(result,
    replayed=False, recovered=False). disabled(False) turns the decorator
    back on within the block. The switch is the process's, for every
    thread; it is set back as it was when the block ends. IDEM_DISABLED=1
    in the environment when idem is imported turns it on for the whole
    run. Store.execute() and Store.execute_local() are not affected."""
    global _DISABLED
    before = _DISABLED
    _DISABLED = bool(flag)
    try:
        yield
    finally:
        _DISABLED = before


_EXPIRED = {"take_over": 0, "report": 1}  # idem_call_options.on_expired_lease


class _Recovery:
    """What a claim does with a key an earlier call left (see
    idem_call_options): on_expired_lease ("take_over", the default, or
    "report": OutcomeUnknown, nothing written), takeover_unknown (True: a
    key marked unknown is taken over too) and max_attempts (the most
    attempts a key may have: a takeover past it is refused with
    OutcomeUnknown; None or 0, the default, sets no bound)."""

    __slots__ = ("on_expired_lease", "takeover_unknown", "max_attempts")

    def __init__(self, on_expired_lease: str = "take_over", takeover_unknown: bool = False,
                 max_attempts: Optional[int] = None) -> None:
        if on_expired_lease not in _EXPIRED:
            raise InvalidArgument("IDEM_EINVAL", "on_expired_lease: %r is not \"take_over\" "
                                  "or \"report\"" % (on_expired_lease,))
        if not isinstance(takeover_unknown, bool):
            raise TypeError("takeover_unknown must be a bool, not %s"
                            % type(takeover_unknown).__name__)
        if max_attempts is not None and (isinstance(max_attempts, bool)
                                         or not isinstance(max_attempts, int)):
            raise TypeError("max_attempts must be an int or None, not %s"
                            % type(max_attempts).__name__)
        if max_attempts is not None and not 0 <= max_attempts <= 2 ** 31 - 1:
            raise InvalidArgument("IDEM_EINVAL", "max_attempts: %r is not 0 (no bound) or "
                                  "a positive number of attempts" % (max_attempts,))
        self.on_expired_lease = on_expired_lease
        self.takeover_unknown = takeover_unknown
        self.max_attempts = max_attempts or 0

    def key(self) -> Tuple[Any, ...]:
        return (self.on_expired_lease, self.takeover_unknown, self.max_attempts)


_NO_RECOVERY = _Recovery()


def _recovery(on_expired_lease: str, takeover_unknown: bool,
              max_attempts: Optional[int]) -> _Recovery:
    """A call's recovery options; the defaults' object (no allocation) for
    the defaults."""
    if on_expired_lease == "take_over" and takeover_unknown is False and \
            max_attempts is None:
        return _NO_RECOVERY
    return _Recovery(on_expired_lease, takeover_unknown, max_attempts)


class _Options:
    """One idem_execute_options, kept alive as long as its owner."""

    def __init__(self, lease: Seconds, retention: Seconds, wait: Seconds,
                 payload: Optional[Sequence[str]],
                 recovery: _Recovery = _NO_RECOVERY) -> None:
        self.c = ffi.new("idem_execute_options *")
        self.c.call.lease_ms = _ms(lease, "lease")
        self.c.call.retention_ms = _ms(retention, "retention")
        self.c.call.wait_ms = _ms(wait, "wait")
        self.c.call.on_expired_lease = _EXPIRED[recovery.on_expired_lease]
        self.c.call.takeover_unknown = 1 if recovery.takeover_unknown else 0
        self.c.call.max_attempts = recovery.max_attempts
        self.call = ffi.addressof(self.c.call)  # for execute_local()
        self.addr, self.call_addr = _address(self.c), _address(self.call)
        self._keep = []
        if payload is not None:
            if isinstance(payload, str) or not payload:
                raise InvalidArgument("IDEM_EINVAL", "payload: a non-empty list of JSON "
                                      "Pointers, such as [\"/project\", \"/title\"]")
            self._keep = [ffi.new("char[]", _text(p, "payload pointer")) for p in payload]
            arr = ffi.new("char *[]", self._keep + [ffi.NULL])
            self._keep.append(arr)
            self.c.fingerprint_pointers = arr


_DEFAULTS: Dict[Tuple[Any, ...], "_Options"] = {}


def _options(lease: Seconds, retention: Seconds, wait: Seconds,
             payload: Optional[Sequence[str]] = None,
             recovery: _Recovery = _NO_RECOVERY) -> "_Options":
    """The options of one call; those without pointers are made once."""
    if payload is not None:
        return _Options(lease, retention, wait, payload, recovery)
    if lease is None and retention is None and wait is None and recovery is _NO_RECOVERY:
        return _PLAIN
    k = (lease, retention, wait, lease.__class__, retention.__class__, wait.__class__,
         recovery.key())
    try:
        return _DEFAULTS[k]
    except (KeyError, TypeError):
        o = _Options(lease, retention, wait, None, recovery)
        if len(_DEFAULTS) < 64:
            try:
                _DEFAULTS[k] = o
            except TypeError:
                pass
        return o


_PLAIN = _Options(None, None, None, None)


def _local_body(value: Any) -> bytes:
    """What execute_local()'s function returned, as the JSON stored."""
    try:
        return _result_json(value)
    except (TypeError, ValueError) as e:
        raise TypeError("the function's result cannot be stored as JSON: %s"
                        % _values.hint(e, True)) from e


# idem._speedups calls libidem through idem._native's functions, answers a
# replay with an Outcome decoded by json's own scanner, and runs
# execute_local()'s function from a callback of its own.
_speedups.setup(Outcome, _scan)
_speedups.local_setup(_address(ffi.addressof(lib, "idem_py_local_fresh")),
                      _address(ffi.addressof(lib, "idem_py_respond")), lib.IDEM_PY_FRESH,
                      _EREJECTED, _local_body)


def _result_body(value: Any) -> bytes:
    """What a decorated function returned, as the JSON stored."""
    try:
        return _result_json(value)
    except (TypeError, ValueError) as e:
        raise _unstorable(e) from None


def _end_failed(rc: int, value: Any) -> Error:
    """The error of an ending that failed after the function ran (read on
    the thread that made it): what it returned is not lost, .value keeps
    it."""
    msg = ffi.string(lib.idem_errmsg()).decode("utf-8", "replace")
    err = _errors.from_code(ffi.string(lib.idem_rc_name(rc)).decode(), msg, value)
    err.value = value
    return err


_speedups.once_setup(_address(ffi.addressof(lib, "idem_py_begin_held")),
                     _address(ffi.addressof(lib, "idem_py_finish")), _DONE, _NOT_DONE,
                     _MARK_UNKNOWN, NotDone, _result_body, _end_failed)
_fast_local, _fast_once = _speedups.local, _speedups.once
_local_call, _once_call = _speedups.local_call, _speedups.once_call
# The Store whose execute_local() function runs on this thread (a call back
# into it would wait for the transaction it runs in), kept in C for both
# ways of running it.
_local_store, _swap_local = _speedups.local_store, _speedups.swap_local


class _Claim:
    """A key this call holds: its call and exec (libidem's), until ended."""

    __slots__ = ("call", "exec", "recovered")

    def __init__(self, call: Any, exec_: Any, recovered: bool) -> None:
        self.call = call
        self.exec = exec_
        self.recovered = recovered


# Stores open in this process: a child of fork() marks them its parent's, so
# that a call checks a flag rather than asking for its pid every time.
_open_stores: "weakref.WeakSet[Store]" = weakref.WeakSet()


# The SQLite files (st_dev, st_ino) that a store of the process this one was
# forked from had open at the fork: SQLite keeps its locks of a file in
# memory once per process, so a child's connection to such a file would
# count the parent's locks as its own (waiting on them until IDEM_EBUSY, or
# believing it holds locks it does not). idem.open() refuses them.
_inherited_files: Dict[Tuple[int, int], int] = {}
# Whether a SQLite store was opened in this process: then the fork handlers
# hold SQLite's process-wide mutexes across fork() (idem_py_fork_prepare()).
_sqlite_opened = False
_fork_held = False


def _before_fork() -> None:
    global _fork_held
    if _sqlite_opened:
        lib.idem_py_fork_prepare()
        _fork_held = True


def _after_fork_in_parent() -> None:
    global _fork_held
    if _fork_held:
        _fork_held = False
        lib.idem_py_fork_done()


def _after_fork_in_child() -> None:
    global _fork_held
    if _fork_held:
        _fork_held = False
        lib.idem_py_fork_done()
    for store in list(_open_stores):
        store._forked = True
        if store._file is not None and store._store is not None:
            _inherited_files.setdefault(store._file, store._pid)


# libidem fetches SHA-256 from OpenSSL on its first fingerprint, under a lock
# of OpenSSL's: done now, so that no thread of this process is doing it when
# another forks (the child would wait on that lock forever).
lib.idem_fingerprint(b"{}", 2, 1, ffi.new("char[]", 128))
os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


def _redacted(url: str) -> str:
    """A store's URL without its password (postgresql://user:PASSWORD@host,
    or password=... in its query)."""
    url = re.sub(r"^([a-z]+://[^/@:]*):[^/@]*@", r"\1:***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def _sqlite_file(url: str) -> Optional[Tuple[int, int]]:
    """The (st_dev, st_ino) of a SQLite store's file, or None (a PostgreSQL
    URL, or no such file yet)."""
    if "://" in url.split("?", 1)[0] and not url.startswith("sqlite:"):
        return None
    path = url[len("sqlite:"):] if url.startswith("sqlite:") else url
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _refuse_inherited(url: str) -> None:
    """IDEM_ESTATE for a SQLite file that the parent of this forked process
    had open at the fork (see _inherited_files)."""
    ident = _sqlite_file(url)
    if ident is None or ident not in _inherited_files:
        return
    raise Error("IDEM_ESTATE", "%s was open in process %d when it forked this one: SQLite "
                "keeps a file's locks once per process, so a store opened here would "
                "share the parent's (waiting on them, or writing without them). Start "
                "the worker with multiprocessing's \"forkserver\" or \"spawn\" method, "
                "or fork before the parent opens the store (or after it closes it)"
                % (url, _inherited_files[ident]))
_BUF_SIZE = 64 * 1024


# Spare (idem_py_claim, body buffer, their addresses) pairs, shared by the
# process's threads: list.pop() and list.append() are atomic, and a call
# keeps the pair it took until it has read all it needs, so that a call made
# meanwhile (by a function that libidem runs during this call, or by a
# signal handler as it returns) takes another.
_Pair = Tuple[Any, Any, int, int]
_SPARES: List[_Pair] = []


def _take() -> _Pair:
    """An idem_py_claim and a body buffer for one call, with their addresses
    for idem._speedups."""
    try:
        return _SPARES.pop()
    except IndexError:
        c, buf = ffi.new("idem_py_claim *"), ffi.new("char[]", _BUF_SIZE)
        return c, buf, _address(c), _address(buf)


def _give(pair: _Pair) -> None:
    if len(_SPARES) < 8:
        _SPARES.append(pair)


# What idem._speedups.local_call() takes of this module: it looks names up,
# and takes and keeps pairs, as execute_local() does here.
_speedups.calls_setup(_NAMES, _SPARES, _take, _PLAIN.call_addr, _BUF_SIZE)


def _begin(store: Any, tenant: bytes, operation: bytes, key: bytes, request: bytes,
           opts: "_Options") -> Any:
    """Claims the key: a _Claim when this call holds it (the action runs),
    the Outcome of a replay, or the refusal raised. The request is its JSON
    (bytes). A pair goes back to _SPARES with its exec and call NULL."""
    pair = _take()
    c, buf = pair[0], pair[1]
    left = ffi.new("int64_t *", -1)
    try:
        # The wait in slices (see idem_py_begin()): Ctrl-C is raised between
        # them, with nothing held, rather than when the whole wait ends.
        rc = lib.idem_py_begin(store, tenant, operation, key, request, len(request),
                               opts.c, c, buf, _BUF_SIZE, left)
        while left[0] > 0:
            rc = lib.idem_py_begin(store, tenant, operation, key, request, len(request),
                                   opts.c, c, buf, _BUF_SIZE, left)
        exec_ = c.exec
        if exec_:
            claim = _Claim(c.call, exec_, c.outcome == _RECOVER)
            c.exec = c.call = ffi.NULL
            _give(pair)
            return claim
    except BaseException:
        # Interrupted (Ctrl-C) as the claim returned: a key it got is let go,
        # since nothing ran. The pair is not used again.
        if c.exec:
            lib.idem_execute_end(c.exec, _NOT_DONE, ffi.NULL)
        if c.call:
            lib.idem_call_free(c.call)
        raise
    try:
        return _unheld(rc, c, buf, operation, key, tenant)
    finally:
        _give(pair)


def _unheld(rc: int, c: Any, buf: Any, operation: bytes, key: bytes,
            tenant: bytes = b"") -> "Outcome[Any]":
    """A claim in c that this call does not hold: the Outcome of a replay,
    or the error or refusal raised; its call (left only for a body too
    large for buf) freed."""
    call = c.call
    try:
        if rc:
            raise _fail(rc)
        if c.outcome == _REPLAY:
            return _replayed(c, buf, call, operation, key)
        raise _refusal(c, operation, key, tenant)
    finally:
        if call:
            lib.idem_call_free(call)
            c.call = ffi.NULL


def _replayed(c: Any, buf: Any, call: Any, operation: bytes, key: bytes) -> "Outcome[Any]":
    """The Outcome of a replay: the stored result, JSON-decoded (in buf, or
    in call when it was too large for buf)."""
    try:
        text = ffi.unpack(c.body if call else buf, c.body_len).decode("utf-8")
        value, end = _scan(text, 0)
        if end == len(text):
            return Outcome(value, True, c.recovered != 0)
    except (ValueError, StopIteration):
        pass
    # White space about it, or not JSON: read again, raising when it is not.
    return Outcome(_stored(c, operation, key), True, c.recovered != 0)


def _stored(c: Any, operation: bytes, key: bytes) -> Any:
    """The stored result of the claim in c, JSON-decoded."""
    try:
        return _decode(ffi.unpack(c.body, c.body_len).decode("utf-8"))
    except ValueError:
        raise Error("IDEM_ECORRUPT", "%s: the stored result is not JSON (was it stored "
                    "by another program?)" % _what(operation, key)) from None


def _what(operation: bytes, key: bytes) -> str:
    return "key %r of %r" % (key.decode("utf-8", "replace"),
                             operation.decode("utf-8", "replace"))


def _refusal(c: Any, operation: bytes, key: bytes, tenant: bytes = b"") -> Error:
    """The exception for a claim that neither replays nor runs."""
    what = _what(operation, key)
    if c.outcome == _CONFLICT:
        return Conflict("IDEM_CONFLICT", "%s was used with other arguments; nothing ran"
                        % what)
    if c.outcome == _IN_FLIGHT:
        after = c.retry_after_ms / 1000.0
        return InFlight("IDEM_IN_FLIGHT", "%s is held by a call still running; nothing "
                        "ran (retry after %.3f s, or pass wait=)" % (what, after), after)
    return OutcomeUnknown("IDEM_UNKNOWN", "%s: an earlier call may or may not have acted; "
                          "nothing ran. An operator settles it with `%s"
                          % (what, _resolve_command(operation, key, tenant)))


def _resolve_command(operation: bytes, key: bytes, tenant: bytes) -> str:
    """The command that settles a key: python -m idem keys, which the
    package installs (the idem program's `idem keys resolve` takes the
    same arguments)."""
    return "python -m idem keys resolve %s --operation %s%s --failed` (a retry then " \
        "acts) or `--completed --body FILE` (retries replay FILE)" % (
            shlex.quote(key.decode("utf-8", "replace")),
            shlex.quote(operation.decode("utf-8", "replace")),
            " --tenant " + shlex.quote(tenant.decode("utf-8", "replace")) if tenant else "")


def _end(claim: _Claim, result: int, body: Optional[bytes] = None) -> Tuple[int, str]:
    """Ends the held key by what the action did and frees the call, exactly
    once; (rc, errmsg)."""
    exec_, call = claim.exec, claim.call
    if exec_ is None:
        return _OK, ""
    claim.exec = claim.call = None
    rc: Optional[int] = None
    msg = ""
    try:
        if body is not None:
            rc = lib.idem_py_end(exec_, result, body, len(body))
        else:
            rc = lib.idem_execute_end(exec_, result, ffi.NULL)
        if rc:
            msg = ffi.string(lib.idem_errmsg()).decode("utf-8", "replace")
    finally:
        if rc is None:  # interrupted before libidem was told: the safe side
            lib.idem_execute_end(exec_, _MARK_UNKNOWN if result == _DONE else result,
                                 ffi.NULL)
        lib.idem_call_free(call)
    return cast(int, rc), msg


def _once(store: Any, tenant: bytes, operation: bytes, key: bytes, request: Any,
          opts: "_Options", fn: Callable[..., Any], args: Tuple[Any, ...],
          kwargs: Dict[str, Any], release_on: Tuple[Any, ...],
          fast: int = 0, writer: "_values.Writer" = _values.PLAIN) -> "Outcome[Any]":
    """Claims the key, runs fn when the key is this call's, and ends the key
    by what fn did. With fast (the store's address), request is the
    decorated function's arguments, and all of it runs in C when the
    arguments can be written as JSON there (_once_in_c()); else writer
    writes them."""
    if fast:
        out = _once_in_c(fast, tenant, operation, key, request, opts, fn, args, kwargs,
                         release_on)
        if out is not NotImplemented:
            return out  # type: ignore[no-any-return]
        request = _arguments_json(request, writer)
    got: Any = None
    try:
        got = _begin(store, tenant, operation, key, request, opts)
        if got.__class__ is Outcome:
            return got  # type: ignore[no-any-return]
        value = fn(*args, **kwargs)
    except BaseException as e:
        # Also when Ctrl-C lands between the claim and fn: unknown, the safe
        # side, since fn may have started.
        if got.__class__ is _Claim and got.exec is not None:
            _end(got, _NOT_DONE if _is_release(e, release_on) else _MARK_UNKNOWN)
        raise
    return _settle(got, value)


def _once_in_c(fast: int, tenant: bytes, operation: bytes, key: bytes, arguments: Any,
               opts: "_Options", fn: Callable[..., Any], args: Tuple[Any, ...],
               kwargs: Dict[str, Any], release_on: Tuple[Any, ...]) -> Any:
    """_once() in idem._speedups: the claim, fn, its result written and the
    key ended in one call (see once() there); NotImplemented when the
    arguments are left to Python's json (nothing was claimed)."""
    pair = _take()
    c, buf = pair[0], pair[1]
    try:
        got = _fast_once(fast, tenant, operation, key, arguments, opts.addr, pair[2], pair[3],
                         _BUF_SIZE, fn, args, kwargs or None, release_on)
        if got.__class__ is Outcome or got is NotImplemented:
            return got
        # A claim this call does not hold.
        return _unheld(got, c, buf, operation, key, tenant)
    finally:
        _give(pair)


def _settle(claim: _Claim, value: Any) -> "Outcome[Any]":
    """Stores what the action returned (or a _Pending of it); the Outcome
    of the call that ran."""
    try:
        body = _result_json(value)
        decoded = _scan(body.decode("utf-8"), 0)[0]  # all of it: _dump() wrote it
    except (TypeError, ValueError) as e:
        _end(claim, _MARK_UNKNOWN)
        raise _unstorable(e) from None
    except BaseException:  # RecursionError, MemoryError, Ctrl-C: it acted
        _end(claim, _MARK_UNKNOWN)
        raise
    rc, msg = _end(claim, _DONE, body)
    if rc:
        err = _errors.from_code(ffi.string(lib.idem_rc_name(rc)).decode(), msg, decoded)
        err.value = decoded  # the function ran: what it returned is not lost
        raise err
    return Outcome(decoded, False, claim.recovered)


def _is_release(exc: BaseException, release_on: Tuple[Any, ...]) -> bool:
    """Whether exc says the function did not act: NotDone, or one of
    release_on's classes or predicates (idem._values.Predicate: isinstance()
    asks it)."""
    return isinstance(exc, NotDone) or (bool(release_on) and isinstance(exc, release_on))


def _local_answer(rc: int, c: Any, buf: Any, operation: bytes, key: bytes,
                  tenant: bytes = b"") -> "Outcome[Any]":
    """What an execute_local() call whose claim is in c answers: an Outcome,
    or the error or refusal raised (Store._done() frees its call)."""
    if rc != _OK:
        raise _fail(rc)
    outcome = c.outcome
    if outcome == _REPLAY:
        return _replayed(c, buf, c.call, operation, key)
    if outcome == _PROCEED or outcome == _RECOVER:  # fn's result, as stored
        return Outcome(_stored(c, operation, key), False, outcome == _RECOVER)
    raise _refusal(c, operation, key, tenant)


class _LocalCall:
    """One execute_local() call run the Python way, as idem_py_local() sees
    it through ctx (a handle made once: spares are kept in _LOCALS)."""

    __slots__ = ("fn", "store", "context", "error", "body", "keep", "ctx", "statements",
                 "closed")

    def __init__(self) -> None:
        self.fn: Any = None
        self.store: Any = None
        self.context: Optional[contextvars.Context] = None
        self.error: Optional[BaseException] = None
        self.body: Any = None
        self.keep: Any = None
        self.statements: Optional[Statements] = None  # conn='s: the call's own
        self.closed: Optional[Callable[[], bool]] = None  # conn='s: whether fn closed it
        self.ctx = ffi.new_handle(self)

    def clear(self) -> None:
        self.fn = self.store = self.context = self.error = self.body = self.keep = None
        self.statements = self.closed = None


# Spare _LocalCalls, as _SPARES.
_LOCALS: List[_LocalCall] = []


@ffi.def_extern()
def idem_py_local(conn, ctx, response):  # type: ignore[no-untyped-def]
    """Runs the caller's function inside the store's transaction, the Python
    way (idem._speedups' local_run() is the other). It may run on another
    thread of the process (the one committing the batch): it runs in the
    copy of the caller's context taken at the call, as local_run() does."""
    local = ffi.from_handle(ctx)
    try:
        return local.context.run(_local_run, local, conn, response)
    except BaseException as e:  # noqa: B902 - the context could not be entered
        local.error = e
        return 1


def _local_run(local: "_LocalCall", conn: Any, response: Any) -> int:
    """idem_py_local()'s work, inside the caller's context: 0, the result
    written to response, or 1 with what fn raised kept in local.error."""
    store = local.store
    tx = Transaction(store.backend, _address(conn), local.statements or store._statements)
    outer = _swap_local(store)  # fn must not call back into its own store
    try:
        body = _local_body(local.fn(tx))
    except BaseException as e:  # noqa: B902 - everything rolls back
        local.error = e
        return _LOCAL_CLOSED if local.closed is not None and local.closed() else 1
    finally:
        tx._close()
        _swap_local(outer)
    if local.closed is not None and local.closed():
        # The application's connection, closed by fn: libidem must not
        # touch it again (its handle may be freed already).
        return _LOCAL_CLOSED
    local.error = None
    local.body = body
    local.keep = ffi.from_buffer(body)
    response.body = local.keep  # the store zeroed the rest
    response.body_len = len(body)
    return 0


def _local_python(store: Any, owner: "Store", tenant: bytes, operation: bytes,
                  key: bytes, request: Any, opts: "_Options", fn: Any, c: Any,
                  buf: Any) -> int:
    """execute_local() the Python way, for a request idem._speedups leaves
    to Python's json: libidem's result, with c read as after
    idem_py_local_run(); what fn raised is raised."""
    req = _request(request)
    try:
        local = _LOCALS.pop()
    except IndexError:
        local = _LocalCall()
    local.fn, local.store, local.context = fn, owner, contextvars.copy_context()
    left = ffi.new("int64_t *", -1)
    try:
        rc = lib.idem_py_local_run(store, tenant, operation, key, req, len(req), opts.call,
                                   local.ctx, c, buf, _BUF_SIZE, left)
        while left[0] > 0:  # the wait in slices, as in _begin()
            rc = lib.idem_py_local_run(store, tenant, operation, key, req, len(req),
                                       opts.call, local.ctx, c, buf, _BUF_SIZE, left)
        if rc == _EREJECTED and local.error is not None:
            raise local.error
        return rc  # type: ignore[no-any-return]
    finally:
        local.clear()  # then another call may take it
        if len(_LOCALS) < 8:
            _LOCALS.append(local)


class _Unkept(Statements):
    """A statement cache for one call on the application's connection:
    nothing prepared in its PostgreSQL session, SQLite's statements
    finalized at the end (close())."""

    def pg_name(self, conn: Any, sql: bytes) -> Optional[bytes]:
        return None


_MISSING = object()  # resolve()'s completed= when not given


class Store:
    """An open store: SQLite (one file) or PostgreSQL (many processes or
    machines), made by idem.open(). Thread-safe; one handle per process: a
    child of fork() opens its own (see idem.open()). .backend is "sqlite"
    or "postgresql", .url the URL given."""

    def __init__(self, url: "Union[str, os.PathLike[str]]", **options: Any) -> None:
        if isinstance(url, os.PathLike):  # a path (pathlib.Path): a SQLite file
            url = "sqlite:" + os.fsdecode(os.fspath(url))
        opts = ffi.new("idem_store_options *")
        sync = options.pop("synchronous", None)
        if sync is not None:
            if sync not in ("full", "normal"):
                raise InvalidArgument("IDEM_EINVAL", "synchronous: \"full\" or \"normal\"")
            opts.sqlite_synchronous = 0 if sync == "full" else 1
        opts.busy_timeout_ms = _ms(options.pop("busy_timeout", None), "busy_timeout")
        opts.max_connections = int(options.pop("max_connections", 0) or 0)
        group = options.pop("group_commit", None)
        opts.group_commit = 0 if group in (None, True) else -1
        opts.read_only = 1 if options.pop("read_only", False) else 0
        cache = options.pop("replay_cache", None)
        opts.replay_cache_entries = 0 if cache is None else (int(cache) if cache > 0 else -1)
        if options:
            raise TypeError("idem.open(): unknown option(s) %s" % ", ".join(sorted(options)))
        if _inherited_files:
            _refuse_inherited(url)
        out = ffi.new("idem_store **")
        rc = lib.idem_store_open(_text(url, "url", "IDEM_EURL"), opts, out)
        if rc != _OK:
            raise _fail(rc)
        self._store = out[0]
        self._addr = _address(self._store)  # for idem._speedups
        self._pid = os.getpid()
        self._forked = False
        self.url = url
        self.backend: str = ffi.string(lib.idem_store_backend(self._store)).decode()
        self._file = _sqlite_file(url) if self.backend == "sqlite" else None
        if self.backend == "sqlite":
            global _sqlite_opened
            _sqlite_opened = True
        _open_stores.add(self)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # The calls running, one token each: close() waits for them. A set
        # changes atomically under the GIL, so a call takes no lock.
        self._calls: Set[object] = set()
        self._closing = False
        self._statements = Statements()
        # What idem._speedups makes an execute_local() function's tx of.
        self._tx_new = (Transaction, self.backend, self._statements)
        self._fast = (self._addr, self._calls, self._tx_new)  # for local_call()

    # -------------------------------------------------------------- life

    def close(self) -> None:
        """Closes the store once the calls running on it have ended; new calls
        are refused from now. Closing twice is harmless. From inside a call
        of this store, or from an event loop whose tasks have calls running,
        it raises instead of waiting for itself."""
        if getattr(self, "_store", None) is None:
            return
        if _local_store() is self:
            raise Error("IDEM_ESTATE", "close() inside a function this store runs")
        with self._lock:
            if self._calls:
                try:
                    asyncio.get_running_loop()
                    in_loop = True
                except RuntimeError:
                    in_loop = False
                if in_loop:
                    raise Error("IDEM_ESTATE", "%d call(s) of this store are running: "
                                "await them before close()" % len(self._calls))
            self._closing = True
            store, self._store = self._store, None  # new calls are refused
            while self._calls:
                self._idle.wait()
        if store is not None and not self._forked and self._pid == os.getpid():
            self._statements.close()  # SQLite closes no connection with statements left
            lib.idem_store_close(store)

    def __enter__(self) -> "Store":
        return self

    def __repr__(self) -> str:
        if getattr(self, "_store", None) is None:
            state = "closed"
        elif self._forked or self._pid != os.getpid():
            state = "opened by process %d: open another in this one" % self._pid
        else:
            state = "open"
        return "<idem.Store %s (%s) %s>" % (_redacted(getattr(self, "url", "?")),
                                            getattr(self, "backend", "?"), state)

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_calls", None):
                self.close()
        except Exception:
            pass

    def _handle(self) -> Any:
        store = self._store
        if store is None:
            raise Error("IDEM_ESTATE", "the store is closed")
        if self._forked:
            raise Error("IDEM_ESTATE", "this store was opened by process %d: after "
                        "fork() the child opens a store of its own" % self._pid)
        if _local_store() is self:
            raise Error("IDEM_ESTATE", "a function run by execute_local() calls its own "
                        "store: it would wait for the transaction it runs in")
        return store

    def _enter(self, token: object) -> Any:
        """The store's handle for one call, counted until _leave(token)."""
        self._calls.add(token)
        try:
            return self._handle()
        except BaseException:
            self._leave(token)
            raise

    def _leave(self, token: object) -> None:
        self._calls.discard(token)
        if self._closing and not self._calls:
            with self._lock:
                self._idle.notify_all()

    # -------------------------------------------------------------- calls

    def idempotent(self, operation: str, *, key: KeySpec, tenant: TenantSpec = None,
                   lease: Seconds = None, retention: Seconds = None,
                   payload: Optional[Sequence[str]] = None, wait: Seconds = None,
                   release_on: ReleaseOn = (), encoder: "_values.Encoder" = None,
                   decoder: "_values.Decoder" = None, on_expired_lease: str = "take_over",
                   takeover_unknown: bool = False,
                   max_attempts: Optional[int] = None, conn: Any = None) -> _Decorator:
        """A decorator: the function it decorates runs at most once per key.

            @store.idempotent("create_ticket", key="request_id")
            def create_ticket(project, title, request_id): ...

        A call whose key (here the argument request_id) has a completed
        record returns the stored result, rebuilt as the function's return
        annotation declares, without running the function; with other
        arguments than the first call's (their canonical JSON, the
        fingerprint, differs) it raises Conflict; while the first call
        still runs, InFlight (or it waits up to wait=). f.outcome(...)
        makes the same call and returns an Outcome (.value, .replayed,
        .recovered). async def functions and methods (self or cls first,
        also above @staticmethod or @classmethod) are decorated alike;
        generator functions are refused. If the function raises, the key is
        marked unknown (a retry raises OutcomeUnknown until an operator
        settles it with store.resolve()), unless the exception is NotDone
        or matches release_on, which release the key so that a retry runs.

        operation: what the function does; keys are scoped by tenant and
        operation. key: the name of the argument holding the key (a str
        of 1-255 printable ASCII characters, no spaces), or a callable
        given the bound arguments as a dict that returns it. tenant: a str,
        or a callable on the bound arguments (default: the empty tenant).
        lease: how long a caller that died keeps the key before another
        call takes it over (default 30 s; renewed while the process lives).
        retention: how long a completed record is kept (default 24 h).
        payload: JSON Pointers (["/project", "/title"]) naming the only
        arguments that make the fingerprint (default: all but the key).
        wait: how long a call that finds its key held waits for the
        holder's result instead of raising InFlight (default: no wait).
        Durations are seconds (30, 0.5), a string ("500ms", "30s", "5m",
        "2h", "1d") or a datetime.timedelta. release_on: exception classes
        or predicates (callables taking the exception) meaning "this call
        did not act". encoder, decoder: how to write a value JSON does not
        hold (encoder(value) returns one it does) and rebuild it
        (decoder(declared type, JSON value)). on_expired_lease: "take_over"
        (run again once a dead holder's lease ended; recovered=True) or
        "report" (raise OutcomeUnknown). takeover_unknown: True runs a key
        marked unknown again. max_attempts: the most attempts a key may
        have (None: no bound).

        conn: join the application's open transaction: the name of the
        argument holding its connection (a sqlite3.Connection on the
        store's file, a psycopg.Connection to the store's database, or a
        SQLAlchemy connection of either), or a callable that returns it
        (lambda: flask.g.db). The record is then written on that
        connection, inside its transaction, and the function's writes
        there commit or roll back with it: the application's commit keeps
        both, its rollback (or an exception in the function) drops both
        and frees the key. The connection is no part of the fingerprint.

        For tests, idem.disabled() (or IDEM_DISABLED=1 in the environment)
        makes every decorated function a plain call."""
        opts = _Options(lease, retention, wait, payload,  # bad options fail here
                        _Recovery(on_expired_lease, takeover_unknown, max_attempts))
        _values.release_on(release_on)
        _values.writer(encoder)
        if decoder is not None and not callable(decoder):
            raise TypeError("decoder must be a callable, not %s" % type(decoder).__name__)

        def wrap(fn: Callable[..., Any], method: Optional[bool], of_class: bool = False) -> Any:
            """The decorated fn; method: whether its first argument is a
            method's self or cls (None: as _is_method() tells); of_class:
            a classmethod's."""
            _refuse_generator(fn)
            sig = inspect.signature(fn)
            if method is None:
                method = _is_method(fn, sig)
            spec = _Spec(self, fn, operation, key, tenant, opts, release_on,
                         _first_name(fn, sig) if method else None, sig, encoder, decoder)
            if conn is not None:
                return _joining(self, fn, spec, conn, method, of_class)
            plain = spec.read is None and not spec.later  # the value is the JSON value
            reader = spec.reader
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def run_async(*args: Any, **kwargs: Any) -> Any:
                    if _DISABLED:
                        return await fn(*args, **kwargs)
                    return (await outcome_async(*args, **kwargs)).value

                async def outcome_async(*args: Any, **kwargs: Any) -> "Outcome[Any]":
                    if _DISABLED:
                        return Outcome(await fn(*args, **kwargs), False, False)
                    if plain:
                        return await spec.run_async(args, kwargs)
                    read = reader()
                    return _values.read_outcome(await spec.run_async(args, kwargs), read)

                run_async.outcome = outcome_async  # type: ignore[attr-defined]
                return _Method(run_async, of_class) if method else run_async

            run_spec = spec.run
            if plain:
                @functools.wraps(fn)
                def run(*args: Any, **kwargs: Any) -> Any:
                    if _DISABLED:
                        return fn(*args, **kwargs)
                    return run_spec(args, kwargs).value

                def outcome(*args: Any, **kwargs: Any) -> "Outcome[Any]":
                    if _DISABLED:
                        return Outcome(fn(*args, **kwargs), False, False)
                    return run_spec(args, kwargs)
            else:  # the value rebuilt as the declared type
                @functools.wraps(fn)
                def run(*args: Any, **kwargs: Any) -> Any:
                    if _DISABLED:
                        return fn(*args, **kwargs)
                    read = reader()
                    value = run_spec(args, kwargs).value
                    return value if read is None else read(value)

                def outcome(*args: Any, **kwargs: Any) -> "Outcome[Any]":
                    if _DISABLED:
                        return Outcome(fn(*args, **kwargs), False, False)
                    read = reader()
                    return _values.read_outcome(run_spec(args, kwargs), read)

            run.outcome = outcome  # type: ignore[attr-defined]
            return _Method(run, of_class) if method else run

        def decorate(fn: Callable[..., Any]) -> Any:
            # Above @staticmethod or @classmethod: the function they hold,
            # decorated, held again the same way.
            if isinstance(fn, staticmethod):
                return staticmethod(wrap(fn.__func__, False))
            if isinstance(fn, classmethod):
                return wrap(fn.__func__, True, of_class=True)
            return wrap(fn, None)
        return cast(_Decorator, decorate)

    def execute(self, operation: str, key: str, request: Any, action: Callable[[], Any], *,
                tenant: Optional[str] = None, lease: Seconds = None,
                retention: Seconds = None, wait: Seconds = None,
                payload: Optional[Sequence[str]] = None, release_on: ReleaseOn = (),
                encoder: "_values.Encoder" = None, decoder: "_values.Decoder" = None,
                returns: Any = None, on_expired_lease: str = "take_over",
                takeover_unknown: bool = False,
                max_attempts: Optional[int] = None) -> "Outcome[Any]":
        """Runs action() at most once per key for this request (any JSON
        value, or one idem's rule writes, whose canonical JSON is the
        fingerprint); an Outcome, its value rebuilt as returns (default:
        action's return annotation) declares."""
        _refuse_generator(action, execute=True)
        release = () if release_on == () else _values.release_on(release_on)
        read = None if returns is None and decoder is None and not getattr(
            action, "__annotations__", None) else _values.reader_of(action, returns, encoder,
                                                                   decoder)
        writer = _values.PLAIN if encoder is None else _values.writer(encoder)
        opts = _options(lease, retention, wait, payload,
                        _recovery(on_expired_lease, takeover_unknown, max_attempts))
        op = _text(operation, "operation")
        k = _key(key)
        t = _text(tenant if tenant is not None else "", "tenant")
        req = _request(request, writer)
        if encoder is not None:
            action = _pending(action, writer)
        token = object()
        store = self._enter(token)
        try:
            out = _once(store, t, op, k, req, opts, action, (), {}, release)
        finally:
            self._leave(token)
        return out if read is None else _values.read_outcome(out, read)

    def execute_local(self, operation: str, key: str, request: Any,
                      fn: Callable[[Transaction], Any], *, tenant: Optional[str] = None,
                      lease: Seconds = None, retention: Seconds = None,
                      wait: Seconds = None, encoder: "_values.Encoder" = None,
                      decoder: "_values.Decoder" = None, returns: Any = None,
                      on_expired_lease: str = "take_over", takeover_unknown: bool = False,
                      max_attempts: Optional[int] = None, conn: Any = None) -> "Outcome[Any]":
        """Runs fn(tx) inside the store's transaction, on its own connection,
        so that what fn writes through tx.execute() commits together with
        the record; an Outcome, its value rebuilt as returns (default: fn's
        return annotation) declares. An exception in fn rolls both back,
        releases the key and propagates.

        conn: the application's own connection, whose open transaction the
        call joins instead (a sqlite3.Connection on the store's file, a
        psycopg.Connection to the store's database, or a SQLAlchemy
        connection of either): the record is written there, fn's tx runs
        there, and the application's commit or rollback decides both.
        wait= does not apply (InFlight at once)."""
        recovery = _recovery(on_expired_lease, takeover_unknown, max_attempts)
        if conn is not None or encoder is not None or decoder is not None or \
                returns is not None or getattr(fn, "__annotations__", None):
            return self._local_typed(operation, key, request, fn, tenant, lease, retention,
                                     wait, encoder, decoder, returns, recovery, conn)
        if lease is None and retention is None and wait is None and \
                recovery is _NO_RECOVERY:
            # As it is mostly called: all of it in one crossing
            # (idem._speedups.local_call()), but for reading a claim not held.
            got = _local_call(self, operation, key, request, fn, tenant)
            if got.__class__ is Outcome:
                return got  # type: ignore[no-any-return]
            if got is not NotImplemented:
                rc, pair = got
                try:
                    return _local_answer(rc, pair[0], pair[1], _NAMES[operation],
                                         key.encode("utf-8"),
                                         _name(tenant if tenant is not None else "",
                                               "tenant"))
                finally:
                    self._done(pair)
            opts = _PLAIN
        else:
            opts = _options(lease, retention, wait, None, recovery)
        op = _name(operation, "operation")
        t = _name(tenant if tenant is not None else "", "tenant")
        k = key.encode("utf-8") if key.__class__ is str and "\x00" not in key else _key(key)
        pair = _take()
        c, buf = pair[0], pair[1]
        self._calls.add(pair[2])  # the claim's address: this call's own token
        try:
            store = self._handle()
            rc = _fast_local(self._addr, t, op, k, request, opts.call_addr, fn, self,
                             self._tx_new, pair[2], pair[3], _BUF_SIZE)
            if rc.__class__ is not int:
                if rc is not NotImplemented:
                    return rc  # type: ignore[no-any-return]
                rc = _local_python(store, self, t, op, k, request, opts, fn, c, buf)
            return _local_answer(rc, c, buf, op, k, t)
        finally:
            self._done(pair)

    def _local_in(self, op: bytes, tenant: bytes, key: bytes, request: bytes,
                  fn: Callable[[Transaction], Any], conn: Any,
                  opts: "_Options") -> "Outcome[Any]":
        """execute_local() in the application's transaction on conn (its
        value as JSON reads it)."""
        addr, raw = _joined.handle(conn, self.backend)
        pair = _take()
        c, buf = pair[0], pair[1]
        self._calls.add(pair[2])
        try:
            local = _LOCALS.pop()
        except IndexError:
            local = _LocalCall()
        # Statements of this call only: the application's connection keeps
        # nothing of idem's (no prepared statement left in its session).
        statements = _Unkept()
        local.fn, local.store, local.context = fn, self, contextvars.copy_context()
        local.statements = statements
        local.closed = _joined.closed_check(raw)
        try:
            store = self._handle()
            rc = lib.idem_py_local_in(store, ffi.cast("void *", addr), tenant, op, key,
                                      request, len(request), opts.call, local.ctx, c, buf,
                                      _BUF_SIZE)
            if local.error is not None and rc in (_EREJECTED, _ESTATE):
                raise local.error
            return _local_answer(rc, c, buf, op, key, tenant)
        finally:
            statements.close()
            local.clear()
            if len(_LOCALS) < 8:
                _LOCALS.append(local)
            del raw  # held until the call ended
            self._done(pair)

    def _local_typed(self, operation: str, key: str, request: Any,
                     fn: Callable[[Transaction], Any], tenant: Optional[str],
                     lease: Seconds, retention: Seconds, wait: Seconds,
                     encoder: "_values.Encoder", decoder: "_values.Decoder",
                     returns: Any, recovery: "_Recovery",
                     conn: Any = None) -> "Outcome[Any]":
        """execute_local() with a declared result type or hooks, or on the
        application's connection conn: the request written by the
        encoder's Writer (its JSON handed on, for C to write again), fn's
        result handed on as a _Pending of it, the Outcome's value
        rebuilt."""
        read = _values.reader_of(fn, returns, encoder, decoder)
        if encoder is not None:
            writer = _values.writer(encoder)
            request = _scan(_request(request, writer).decode("utf-8"), 0)[0]
            fn = _pending(fn, writer)
        if conn is not None:
            out = self._local_in(_name(operation, "operation"),
                                 _name(tenant if tenant is not None else "", "tenant"),
                                 _key(key), _request(request), fn, conn,
                                 _options(lease, retention, None, None, recovery))
            return _values.read_outcome(out, read)
        act = fn
        out = self.execute_local(operation, key, request, lambda tx: act(tx), tenant=tenant,
                                 lease=lease, retention=retention, wait=wait,
                                 on_expired_lease=recovery.on_expired_lease,
                                 takeover_unknown=recovery.takeover_unknown,
                                 max_attempts=recovery.max_attempts or None)
        return _values.read_outcome(out, read)

    def _done(self, pair: _Pair) -> None:
        """The end of an execute_local() call counted by its pair's token:
        its claim's call (left only for a body too large for the buffer)
        freed, the call no longer counted, the pair kept for another."""
        c = pair[0]
        if c.call:
            lib.idem_call_free(c.call)
            c.call = ffi.NULL
        self._calls.discard(pair[2])
        if self._closing:
            self._leave(pair[2])
        _give(pair)

    # ---------------------------------------------------------- operators
    # What `idem keys` (and `python -m idem keys`) does, as calls.

    def delete(self, operation: str, key: str, *, tenant: Optional[str] = None) -> None:
        """Deletes one record whatever its state (an operator's act: a retry
        then runs again). Error IDEM_ENOTFOUND when there is none."""
        ident, keep = _ident(operation, key, tenant)
        rc = lib.idem_delete(self._handle(), ident)
        if rc != _OK:
            raise _fail(rc)

    def get(self, operation: str, key: str, *,
            tenant: Optional[str] = None) -> Optional[Record]:
        """The record of one key (idem_get()), or None when there is none
        (or it is completed and past its retention)."""
        ident, keep = _ident(operation, key, tenant)
        out = ffi.new("idem_record **")
        rc = lib.idem_get(self._handle(), ident, out)
        if rc == _ENOTFOUND:
            return None
        if rc != _OK:
            raise _fail(rc)
        try:
            return record_of(ffi, out[0])
        finally:
            lib.idem_record_free(out[0])

    def list(self, *, tenant: Optional[str] = None, operation: Optional[str] = None,
             state: Optional[str] = None, limit: Optional[int] = None,
             expired: bool = False, overdue: bool = False) -> List[Record]:
        """Records, oldest first (idem_list()), as `idem keys list`: of one
        tenant and operation (None: every one), in one state
        ("in_progress", "completed" or "unknown"), at most limit of them;
        expired: completed records past their retention too; overdue: only
        records in progress or unknown that have waited longer than their
        retention."""
        f = ffi.new("idem_filter *")
        keep = []
        if tenant is not None:
            keep.append(ffi.new("char[]", _text(tenant, "tenant")))
            f.tenant = keep[-1]
        if operation is not None:
            keep.append(ffi.new("char[]", _text(operation, "operation")))
            f.operation = keep[-1]
        if state is not None:
            if state not in _STATE_CODES:
                raise InvalidArgument("IDEM_EINVAL", "state: %r is not \"in_progress\", "
                                      "\"completed\" or \"unknown\"" % (state,))
            f.state = _STATE_CODES[state]
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or \
                    not 0 < limit <= 2 ** 31 - 1:
                raise InvalidArgument("IDEM_EINVAL", "limit: %r is not a positive number "
                                      "of records" % (limit,))
            f.limit = limit
        if expired and overdue:
            raise InvalidArgument("IDEM_EINVAL", "expired and overdue: one or the other")
        f.expired, f.overdue = int(bool(expired)), int(bool(overdue))
        listing = _Listing()
        handle = ffi.new_handle(listing)
        rc = lib.idem_py_list(self._handle(), f, handle)
        if listing.error is not None:
            raise listing.error
        if rc != _OK:
            raise _fail(rc)
        return listing.records

    def show(self, key: str, *, operation: Optional[str] = None,
             tenant: Optional[str] = None) -> List[Record]:
        """Every record with the key, as `idem keys show`: with operation,
        the record of that operation and tenant (default "") if there is
        one; without, the key's records in every operation (and, without
        tenant, every tenant), which reads the whole store to find them."""
        if operation is not None:
            rec = self.get(operation, key, tenant=tenant)
            return [] if rec is None else [rec]
        _key(key)
        return [r for r in self.list(tenant=tenant) if r.key == key]

    def resolve(self, operation: str, key: str, *, tenant: Optional[str] = None,
                completed: Any = _MISSING, body: Union[bytes, str, None] = None,
                failed: bool = False, status: int = 0, retention: Seconds = None,
                force: bool = False) -> None:
        """Settles a record whose outcome is unknown, or in progress with its
        lease over (idem_resolve_with()), as `idem keys resolve`:
        completed=value stores the value as the result later calls replay
        (written as JSON, as a decorated function's result is), or body=
        the stored bytes as they are, with status, kept for retention
        (default 24 h); failed=True deletes the record, so that a retry
        acts again. A record whose holder's lease still runs may be acting:
        it is refused (IDEM_ESTATE) unless force=True. Error IDEM_ENOTFOUND
        when there is no record, IDEM_ESTATE when it is completed."""
        given = (completed is not _MISSING) + (body is not None) + bool(failed)
        if given != 1:
            raise TypeError("resolve() takes one of completed=VALUE, body=BYTES or "
                            "failed=True")
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError("status must be an int, not %s" % type(status).__name__)
        ident, keep = _ident(operation, key, tenant)
        response = ffi.NULL
        if not failed:
            if completed is not _MISSING:
                try:
                    data = _dump(completed)
                except (TypeError, ValueError) as e:
                    raise TypeError("completed: the value cannot be written as JSON: %s"
                                    % _values.hint(e, True)) from None
            else:
                data = body.encode("utf-8") if isinstance(body, str) else \
                    bytes(cast(bytes, body))
            response = ffi.new("idem_response *")
            response.status = status
            buf = ffi.from_buffer(data)
            response.body, response.body_len = buf, len(data)
        opts = ffi.new("idem_resolve_options *")
        opts.retention_ms = _ms(retention, "retention")
        opts.force = 1 if force else 0
        rc = lib.idem_resolve_with(self._handle(), ident, response, opts)
        if rc != _OK:
            raise _fail(rc)

    def prune(self) -> int:
        """Deletes the completed records past their retention (records in
        progress or unknown are never pruned); how many."""
        removed = ffi.new("int64_t *")
        rc = lib.idem_prune(self._handle(), removed)
        if rc != _OK:
            raise _fail(rc)
        return int(removed[0])


_ENOTFOUND = 16  # IDEM_ENOTFOUND, as in idem.h
_STATE_CODES = {"in_progress": 1, "completed": 2, "unknown": 3}


def _ident(operation: str, key: str, tenant: Optional[str]) -> Tuple[Any, Tuple[Any, ...]]:
    """An idem_id, and the strings it points to (keep them alive)."""
    ident = ffi.new("idem_id *")
    keep = (ffi.new("char[]", _text(tenant if tenant is not None else "", "tenant")),
            ffi.new("char[]", _text(operation, "operation")),
            ffi.new("char[]", _key(key)))
    ident.tenant, ident.operation, ident.key = keep
    return ident, keep


class _Listing:
    """What idem_py_record() collects for Store.list()."""

    def __init__(self) -> None:
        self.records: List[Record] = []
        self.error: Optional[BaseException] = None


@ffi.def_extern()
def idem_py_record(record, ctx):  # type: ignore[no-untyped-def]
    listing = ffi.from_handle(ctx)
    try:
        listing.records.append(record_of(ffi, record))
        return 0
    except BaseException as e:  # noqa: B902 - raised by list() once it returns
        listing.error = e
        return 1


# Code flags of a function whose call only makes an object that runs its
# body later: a generator, a coroutine, an async generator.
_NOT_RUN_BY_CALL = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
                    | inspect.CO_ITERABLE_COROUTINE)


def _refuse_generator(fn: Callable[..., Any], execute: bool = False) -> None:
    """A TypeError for a generator function (or an async one), and for
    execute()'s action (execute: True) an async function too: calling it
    only makes a generator (or a coroutine, which execute() would not
    await), whose body runs later, out of the call that holds the key, or
    never. Its result would be an object that JSON cannot hold, and the
    key, marked unknown, would refuse every retry although nothing ran."""
    code = getattr(fn, "__code__", None)
    if code is not None and not code.co_flags & _NOT_RUN_BY_CALL and \
            not hasattr(fn, "_is_coroutine_marker"):  # inspect.markcoroutinefunction()
        return  # a plain function: what inspect would say, without its unwrapping
    kind = ("an async generator function" if inspect.isasyncgenfunction(fn) else
            "a generator function" if inspect.isgeneratorfunction(fn) else
            "a coroutine function" if execute and inspect.iscoroutinefunction(fn) else None)
    if kind is None:
        return
    if kind == "a coroutine function":
        made = ("a coroutine, which execute() does not await: its body would run outside "
                "the call that holds the key, or never")
        thing = "a coroutine"
    else:
        made = "a generator, whose body runs later, outside the call that holds the key"
        thing = "a generator"
    fix = ("Give execute() a function that returns the finished result, or decorate the "
           "function with store.idempotent()" if execute else
           "Decorate a function that returns the finished result (a list of the items, say)")
    raise TypeError("%s is %s: calling it only makes %s, and %s cannot be stored. %s"
                    % (getattr(fn, "__qualname__", fn), kind, made, thing, fix))


def _first_name(fn: Callable[..., Any], sig: inspect.Signature) -> str:
    """The name of fn's first argument, its self or cls as a method."""
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return p.name
        break
    raise TypeError("%s is decorated as a method, but takes no positional argument for "
                    "its class" % getattr(fn, "__qualname__", fn))


def _is_method(fn: Callable[..., Any], sig: inspect.Signature) -> bool:
    """Whether fn is a method whose first argument is its instance or class:
    defined in a class body (its __qualname__ says Class.name) with a first
    argument named self or cls. Anywhere else an argument so named is an
    argument like the others."""
    parts = getattr(fn, "__qualname__", "").split(".")
    if len(parts) < 2 or parts[-2] == "<locals>":
        return False
    for p in sig.parameters.values():
        return p.name in ("self", "cls") and p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)
    return False


class _Bound(functools.partial):  # type: ignore[type-arg]
    """A decorated method bound to its instance (or class): called, it calls
    the decorated function with it first, and so does .outcome(). Being a
    functools.partial, inspect sees through it (an async one is a coroutine
    function); other attributes are the decorated function's."""

    __doc__ = property(lambda self: self.func.__doc__)  # type: ignore[assignment]

    def outcome(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.func, "outcome")(*self.args, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.func, name)

    def __repr__(self) -> str:
        return "<bound idempotent method %s of %r>" % (
            getattr(self.func, "__qualname__", self.func), self.args[0])


class _Method:
    """A decorated method, as the class holds it: through an instance it is
    bound to that instance (_Bound), through the class it is the decorated
    function itself (Class.method(obj, ...)), or bound to the class for a
    classmethod. .outcome binds alike, which a plain function's attribute
    could not."""

    def __init__(self, run: Callable[..., Any], of_class: bool = False) -> None:
        functools.update_wrapper(self, run)  # __name__, __doc__...
        self.__wrapped__ = run.__wrapped__  # type: ignore[attr-defined]
        self.run = run
        self.outcome = run.outcome  # type: ignore[attr-defined]
        self.of_class = of_class
        if inspect.iscoroutinefunction(run) and hasattr(inspect, "markcoroutinefunction"):
            inspect.markcoroutinefunction(self)  # Python 3.12 and later

    def __get__(self, obj: Any, cls: Optional[type] = None) -> Any:
        if self.of_class:
            return _Bound(self.run, cls if cls is not None else type(obj))
        if obj is None:
            return self.run
        return _Bound(self.run, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # What a classmethod above the decorator calls, on Pythons where
        # it binds its function without asking it (3.13 and later).
        return self.run(*args, **kwargs)

    def __repr__(self) -> str:
        return "<idempotent method %s>" % getattr(self.run, "__qualname__", self.run)


def _request(request: Any, writer: "_values.Writer" = _values.PLAIN) -> bytes:
    try:
        return writer.encode(request).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError("the request cannot be written as JSON: %s"
                        % _values.hint(e, False)) from None


def _arguments_json(arguments: Dict[str, Any],
                    writer: "_values.Writer" = _values.PLAIN) -> bytes:
    try:
        return writer.encode(arguments).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError("the arguments cannot be written as JSON for the "
                        "fingerprint: %s" % _values.hint(e, False)) from None


class _Spec:
    """What one decorated function's calls share."""

    def __init__(self, store: Store, fn: Callable[..., Any], operation: str,
                 key: KeySpec, tenant: TenantSpec, opts: "_Options",
                 release_on: ReleaseOn, self_name: Optional[str] = None,
                 sig: Optional[inspect.Signature] = None, encoder: "_values.Encoder" = None,
                 decoder: "_values.Decoder" = None) -> None:
        self.store = store
        self.fn = fn
        # The arguments and the result written by idem's rule, and the
        # caller's encoder for the rest; the sync function as C calls it
        # (its result handed on as a _Pending when there is an encoder).
        self.writer = _values.writer(encoder)
        self.call_fn = fn if encoder is None else _pending(fn, self.writer)
        self.encoder, self.decoder = encoder, decoder
        self.what = getattr(fn, "__qualname__", repr(fn))
        # What rebuilds the result as the declared return type (None: the
        # JSON value is the value); one naming a class not defined yet is
        # read at the first call (later).
        try:
            self.read = _values.reader(_values.declared_return(fn), encoder, decoder,
                                       self.what)
            self.later = False
        except _values.Unresolved:
            self.read, self.later = None, True
        self.sig = sig if sig is not None else inspect.signature(fn)
        # A method's self (or cls) is no part of the request: bind() leaves
        # it out of the arguments the fingerprint is taken of, bind_all()
        # keeps it for a key or tenant callable to read.
        self.self_name = self_name
        self.bind = _binder(fn, self.sig, self_name)
        self.bind_all = _binder(fn, self.sig) if self_name else self.bind
        self.operation = _text(operation, "operation")
        if isinstance(key, str):
            if key not in self.sig.parameters:
                raise TypeError("key=%r: %s has no argument of that name"
                                % (key, getattr(fn, "__qualname__", fn)))
            if key == self_name:
                raise TypeError("key=%r: that is the method's %s, not an argument"
                                % (key, key))
            self.key_name: Optional[str] = key
            self.key_fn = None
        elif callable(key):
            self.key_name, self.key_fn = None, key
        else:
            raise TypeError("key must be an argument name or a callable")
        if tenant is not None and not isinstance(tenant, str) and not callable(tenant):
            raise TypeError("tenant must be a str or a callable")
        self.tenant = tenant
        self.tenant_fixed = _text(tenant, "tenant") if isinstance(tenant, str) else (
            b"" if tenant is None else None)
        self.opts = opts
        self.simple = self.key_name is not None and self.tenant_fixed is not None
        self.release_on = _values.release_on(release_on)

    def reader(self) -> Optional["_values.Reader"]:
        """The result's reader, its declared type read now if it could not
        be at decoration (before anything is claimed: a TypeError)."""
        if self.later:
            try:
                self.read = _values.reader(_values.declared_return(self.fn), self.encoder,
                                           self.decoder, self.what)
            except _values.Unresolved as e:
                raise TypeError("%s: its return annotation names what is not defined: %s"
                                % (self.what, e)) from None
            self.later = False
        return self.read

    def prepare(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[bytes, bytes,
                                                                               Dict[str, Any]]:
        """(tenant, key, arguments) of one call: the arguments are what the
        fingerprint is taken of."""
        key: Any
        tenant: bytes
        if self.key_name is not None and self.tenant_fixed is not None:
            arguments = self.bind(*args, **kwargs)
            key = arguments.pop(self.key_name)
            tenant = self.tenant_fixed
        else:
            arguments = self.bind_all(*args, **kwargs)
            everything = dict(arguments)
            if self.self_name is not None:
                del arguments[self.self_name]
            if self.key_name is not None:
                key = arguments.pop(self.key_name)
            else:
                key = cast(Callable[[Dict[str, Any]], Any], self.key_fn)(dict(everything))
            if self.tenant_fixed is not None:
                tenant = self.tenant_fixed
            else:
                tenant = _text(cast(Callable[[Dict[str, Any]], Any], self.tenant)(everything),
                               "tenant")
        if key.__class__ is not str and not isinstance(key, str):
            if key is None:
                raise InvalidArgument("IDEM_EKEY", "no key: %s is None" % (
                    self.key_name or "the key function's answer"))
            raise TypeError("the key must be a str, not %s" % type(key).__name__)
        if "\x00" in key:
            raise InvalidArgument("IDEM_EKEY", "the key contains a NUL character")
        return tenant, key.encode("utf-8"), arguments

    def run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "Outcome[Any]":
        key: Any
        tenant: bytes
        if self.simple:  # the usual decorator: prepare() inlined
            arguments = self.bind(*args, **kwargs)
            key = arguments.pop(self.key_name)  # type: ignore[arg-type] # simple: a str
            # All of it in one crossing (idem._speedups.once_call()), but
            # for reading a claim not held.
            got = _once_call(self.store, self.tenant_fixed, self.operation, key, arguments,
                             self.opts.addr, self.call_fn, args, kwargs or None,
                             self.release_on)
            if got.__class__ is Outcome:
                return got  # type: ignore[no-any-return]
            if got is not NotImplemented:
                rc, pair = got
                try:
                    return _unheld(rc, pair[0], pair[1], self.operation, key.encode("utf-8"),
                                   self.tenant_fixed or b"")
                finally:
                    self.store._done(pair)
            key = _key(key) if key.__class__ is not str or "\x00" in key \
                else key.encode("utf-8")
            tenant = self.tenant_fixed or b""
        else:
            tenant, key, arguments = self.prepare(args, kwargs)
        s = self.store
        token = object()
        calls = s._calls
        calls.add(token)
        try:
            return _once(s._handle(), tenant, self.operation, key, arguments, self.opts,
                         self.call_fn, args, kwargs, self.release_on, s._addr, self.writer)
        finally:
            calls.discard(token)
            if s._closing:
                s._leave(token)

    async def run_async(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "Outcome[Any]":
        tenant, key, arguments = self.prepare(args, kwargs)
        request = _arguments_json(arguments, self.writer)
        token = object()
        store = self.store._enter(token)
        try:
            return await self._run_async(store, tenant, key, request, args, kwargs)
        finally:
            self.store._leave(token)

    async def _run_async(self, store: Any, tenant: bytes, key: bytes, request: bytes,
                         args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "Outcome[Any]":
        got = await _begin_async(self.store, store, tenant, self.operation, key, request,
                                 self.opts)
        if got.__class__ is Outcome:
            return got  # type: ignore[no-any-return]
        try:
            value = await self.fn(*args, **kwargs)
        except BaseException as e:
            result = _NOT_DONE if _is_release(e, self.release_on) else _MARK_UNKNOWN
            await _end_async(self.store, got, result)
            raise
        if self.writer is not _values.PLAIN:
            value = _Pending(value, self.writer)
        return await _settle_async(self.store, got, value)


def _joining(store: Store, fn: Callable[..., Any], spec: _Spec, conn: Any,
             method: bool, of_class: bool) -> Any:
    """The decorated fn with conn=: each call joins the application's
    transaction on the connection that conn names (an argument) or returns
    (a callable)."""
    if inspect.iscoroutinefunction(fn):
        raise TypeError("conn=: %s is async; a joined transaction runs sync functions "
                        "(psycopg's AsyncConnection is not supported)" % spec.what)
    if isinstance(conn, str):
        if conn not in spec.sig.parameters or conn == spec.self_name:
            raise TypeError("conn=%r: %s has no argument of that name" % (conn, spec.what))
        if conn == spec.key_name:
            raise TypeError("conn=%r: that argument is the key" % conn)
    elif not callable(conn):
        raise TypeError("conn must be an argument name or a callable")
    if spec.opts._keep:
        raise TypeError("conn=: payload= is not taken with it; every argument but the key "
                        "and the connection makes the fingerprint")

    def call(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "Outcome[Any]":
        tenant, key, arguments = spec.prepare(args, kwargs)
        if isinstance(conn, str):
            connection = arguments.pop(conn)
        else:
            connection = conn()
        request = _arguments_json(arguments, spec.writer)
        call_fn = spec.call_fn
        out = store._local_in(spec.operation, tenant, key, request,
                              lambda tx: call_fn(*args, **kwargs), connection, spec.opts)
        return _values.read_outcome(out, spec.reader())

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if _DISABLED:
            return fn(*args, **kwargs)
        return call(args, kwargs).value

    def outcome(*args: Any, **kwargs: Any) -> "Outcome[Any]":
        if _DISABLED:
            return Outcome(fn(*args, **kwargs), False, False)
        return call(args, kwargs)

    run.outcome = outcome  # type: ignore[attr-defined]
    return _Method(run, of_class) if method else run


def _binder(fn: Callable[..., Any], sig: inspect.Signature,
            skip: Optional[str] = None) -> Callable[..., Dict[str, Any]]:
    """A function with fn's signature that returns its bound arguments, with
    defaults applied, as a new dict: what inspect.Signature.bind() and
    apply_defaults() give, at a tenth of the cost. The argument named skip
    (a method's self) is bound but not returned."""
    P = inspect.Parameter
    params: List[str] = []
    names: List[str] = []
    env: Dict[str, Any] = {}
    seen_kw_only = False
    for i, p in enumerate(sig.parameters.values()):
        if p.kind == P.KEYWORD_ONLY and not seen_kw_only:
            params.append("*")
            seen_kw_only = True
        if p.kind == P.VAR_POSITIONAL:
            params.append("*" + p.name)
            seen_kw_only = True
        elif p.kind == P.VAR_KEYWORD:
            params.append("**" + p.name)
        elif p.default is not P.empty:
            env["_d%d" % i] = p.default
            params.append("%s=_d%d" % (p.name, i))
        else:
            params.append(p.name)
        names.append(p.name)
        if p.kind == P.POSITIONAL_ONLY and (
                i + 1 == len(sig.parameters)
                or list(sig.parameters.values())[i + 1].kind != P.POSITIONAL_ONLY):
            params.append("/")
    src = "def _bind(%s):\n    return {%s}\n" % (
        ", ".join(params), ", ".join("%r: %s" % (n, n) for n in names if n != skip))
    exec(src, env)  # noqa: S102 - names come from fn's own signature
    bind = env["_bind"]
    bind.__name__ = getattr(fn, "__name__", "_bind")
    bind.__qualname__ = getattr(fn, "__qualname__", bind.__name__)
    return bind  # type: ignore[no-any-return]


# ---- async def: libidem's asynchronous halves on the event loop -----------
#
# A claim or an ending is handed to libidem (idem_execute_begin_async(),
# idem_execute_end_async()) and answered on one of its threads, which tells
# the loop (idem_py_wake()); no thread of Python's waits. A claim that finds
# its key in flight and may wait (wait=) waits on the loop: one waiter of a
# key asks the store again, on libidem's schedule (2 ms, doubling to 50 ms,
# and when the holder's lease ends), the others queue behind it and ask
# once it has its answer, so that a thousand waiters of one key ask as
# often as one. A task cancelled while libidem works leaves the operation
# to end by itself: a key it got is released (nothing ran), and the store
# stays counted until libidem has answered.

_POLL_FIRST = 0.002
_POLL_MAX = 0.05


# An _AsyncOp's state, changed under _ops_lock: libidem answers it on its
# own thread while the task that awaits it may be cancelled on the loop's.
_PENDING, _ARRIVED, _TAKEN, _GONE = range(4)
_ops_lock = threading.Lock()


class _AsyncOp:
    """One asynchronous claim or ending in libidem, kept alive (with its
    handle, buffers and the store's count) until libidem answers it and its
    caller takes the answer, or until it is let go: by whichever of the two
    comes last, libidem's answer or the caller's leaving."""

    __slots__ = ("store", "token", "loop", "thread", "future", "a", "buf", "handle",
                 "call", "state", "__weakref__")

    def __init__(self, store: "Store", loop: Optional[asyncio.AbstractEventLoop],
                 buf_size: int) -> None:
        self.store = store
        self.token = object()
        self.loop = loop  # None: nobody awaits it
        self.thread = threading.get_ident()  # the loop's
        self.future: "Optional[asyncio.Future[_AsyncOp]]" = (
            loop.create_future() if loop else None)
        self.a = _new_raw("idem_py_async *")
        self.buf = _new_raw("char[]", buf_size) if buf_size else ffi.NULL
        self.a.buf = self.buf
        self.a.cap = buf_size
        self.handle = ffi.new_handle(self)
        self.a.handle = self.handle
        self.call = ffi.NULL  # an ending's call, freed once it is answered
        self.state = _PENDING

    def let_go(self) -> None:
        """Nobody takes the answer: a key the claim got is released
        (nothing ran), and the store is no longer counted for it."""
        c = self.a.claim
        try:
            if c.exec:
                _end_detached(self.store, _Claim(c.call, c.exec, False), _NOT_DONE)
                c.exec = c.call = ffi.NULL
            elif c.call:
                lib.idem_call_free(c.call)
                c.call = ffi.NULL
        finally:
            self.store._leave(self.token)

    def error(self) -> Error:
        """The failure libidem answered, with its message read where it
        failed."""
        rc = self.a.claim.rc
        name = ffi.string(lib.idem_rc_name(rc)).decode()
        return _errors.from_code(name, ffi.string(self.a.errmsg).decode("utf-8", "replace"),
                                 None)


# Operations libidem has not answered yet (each holds its handle).
_async_ops: Set[_AsyncOp] = set()
# Memory that libidem fills before it is read: not cleared first (a replay's
# buffer is 64 KiB).
_new_raw = ffi.new_allocator(should_clear_after_alloc=False)


@ffi.def_extern()
def idem_py_wake(handle):  # type: ignore[no-untyped-def]
    """libidem answered op: on its thread, or on the loop's before the call
    returned (a replay it holds in memory)."""
    op = ffi.from_handle(handle)
    _async_ops.discard(op)
    if op.call:  # an ending's
        lib.idem_call_free(op.call)
        op.call = ffi.NULL
    with _ops_lock:
        gone = op.state == _GONE or op.future is None
        op.state = _ARRIVED
    if gone:
        op.let_go()
    elif op.thread == threading.get_ident():
        _deliver(op)
    else:
        try:
            op.loop.call_soon_threadsafe(_deliver, op)
        except RuntimeError:  # the loop is closed: nobody takes it
            with _ops_lock:
                op.state = _GONE
            op.let_go()


def _deliver(op: _AsyncOp) -> None:
    assert op.future is not None
    if not op.future.done():
        op.future.set_result(op)


def _start(store: "Store", buf_size: int, begin: Callable[[Any], int]) -> _AsyncOp:
    """An _AsyncOp handed to libidem by begin(op.a); raises what libidem
    refused at once (read on this thread)."""
    op = _AsyncOp(store, asyncio.get_running_loop(), buf_size)
    store._enter(op.token)
    _async_ops.add(op)
    rc = -1
    try:
        rc = begin(op.a)
    finally:
        if rc:  # refused, or interrupted before libidem took it
            _async_ops.discard(op)
            store._leave(op.token)
    if rc:
        raise _fail(rc)
    return op


async def _claim_once(owner: "Store", store: Any, tenant: bytes, operation: bytes,
                      key: bytes, request: bytes, opts: "_Options") -> Any:
    """One claim, not waiting: a _Claim, an Outcome, or an _AsyncOp whose
    claim was answered IN_FLIGHT (its retry_after_ms read)."""
    op = _start(owner, _BUF_SIZE, lambda a: int(lib.idem_py_begin_async(
        store, tenant, operation, key, request, len(request), opts.c, a)))
    await _answer(op)
    c = op.a.claim
    if c.rc:
        raise op.error()
    if c.exec:
        claim = _Claim(c.call, c.exec, c.outcome == _RECOVER)
        c.exec = c.call = ffi.NULL
        return claim
    if c.outcome == _IN_FLIGHT:
        if c.call:
            lib.idem_call_free(c.call)
            c.call = ffi.NULL
        return op
    return _unheld(0, c, op.buf, operation, key, tenant)


async def _answer(op: _AsyncOp) -> None:
    """Waits for libidem's answer to op, and takes it. A caller cancelled
    meanwhile leaves it: a key the claim gets is let go."""
    assert op.future is not None
    try:
        await asyncio.shield(op.future)
    except BaseException:
        with _ops_lock:
            arrived = op.state == _ARRIVED
            op.state = _GONE
        if arrived:
            op.let_go()
        raise
    with _ops_lock:
        op.state = _TAKEN
    op.store._leave(op.token)


class _KeyQueue:
    """The waiters of one key on one loop: one asks at a time."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


_key_queues: Dict[Tuple[int, int, bytes, bytes, bytes], _KeyQueue] = {}


async def _begin_async(owner: "Store", store: Any, tenant: bytes, operation: bytes,
                       key: bytes, request: bytes, opts: "_Options") -> Any:
    """_begin() on the event loop: a _Claim, or the Outcome of a replay, or
    the refusal raised; waits (opts' wait) for a key in flight without a
    thread."""
    got = await _claim_once(owner, store, tenant, operation, key, request, opts)
    wait = opts.c.call.wait_ms / 1000.0
    if got.__class__ is not _AsyncOp or wait <= 0:
        return _in_flight(got, operation, key, tenant)
    loop = asyncio.get_running_loop()
    until = loop.time() + wait
    name = (id(loop), id(owner), tenant, operation, key)
    q = _key_queues.get(name)
    if q is None:
        q = _key_queues[name] = _KeyQueue()
    q.users += 1
    try:
        async with q.lock:
            poll = _POLL_FIRST
            while True:
                got = await _claim_once(owner, store, tenant, operation, key, request, opts)
                left = until - loop.time()
                if got.__class__ is not _AsyncOp or left <= 0:
                    return _in_flight(got, operation, key, tenant)
                after = got.a.claim.retry_after_ms / 1000.0
                await asyncio.sleep(min(left, poll, after) if after > 0 else min(left, poll))
                poll = min(poll * 2, _POLL_MAX)
    finally:
        q.users -= 1
        if not q.users and _key_queues.get(name) is q:
            del _key_queues[name]


def _in_flight(got: Any, operation: bytes, key: bytes, tenant: bytes) -> Any:
    """got, or the refusal of a claim answered IN_FLIGHT."""
    if got.__class__ is _AsyncOp:
        raise _refusal(got.a.claim, operation, key, tenant)
    return got


async def _end_async(owner: "Store", claim: _Claim, result: int,
                     body: Optional[bytes] = None) -> Tuple[int, str]:
    """_end() on the event loop; a cancelled caller does not stop it (the
    key must be ended whatever happens to the task)."""
    exec_, call = claim.exec, claim.call
    if exec_ is None:
        return _OK, ""
    try:
        op = _start(owner, 0, lambda a: int(lib.idem_py_end_async(
            exec_, result, body if body is not None else ffi.NULL,
            len(body) if body is not None else 0, a)))
    except Error:
        # Refused at once (out of memory, a forked child): the key is still
        # this call's, ended the blocking way.
        return _end(claim, result, body)
    claim.exec = claim.call = None
    op.call = call
    await _answer(op)  # a cancelled caller: it ends regardless
    rc = op.a.claim.rc
    return rc, ffi.string(op.a.errmsg).decode("utf-8", "replace") if rc else ""


def _end_detached(owner: "Store", claim: _Claim, result: int) -> None:
    """Ends a key nobody awaits (a cancelled task's), without waiting; the
    store stays counted until libidem has answered."""
    exec_, call = claim.exec, claim.call
    claim.exec = claim.call = None
    op = _AsyncOp(owner, None, 0)
    owner._calls.add(op.token)
    _async_ops.add(op)
    op.call = call
    if lib.idem_py_end_async(exec_, result, ffi.NULL, 0, op.a):
        # Refused at once (out of memory): ended the blocking way.
        _async_ops.discard(op)
        op.call = ffi.NULL
        lib.idem_execute_end(exec_, result, ffi.NULL)
        lib.idem_call_free(call)
        owner._leave(op.token)


async def _settle_async(owner: "Store", claim: _Claim, value: Any) -> "Outcome[Any]":
    """_settle() on the event loop."""
    try:
        body = _result_json(value)
        decoded = _scan(body.decode("utf-8"), 0)[0]
    except (TypeError, ValueError) as e:
        await _end_async(owner, claim, _MARK_UNKNOWN)
        raise _unstorable(e) from None
    except BaseException:  # RecursionError, MemoryError: it acted
        await _end_async(owner, claim, _MARK_UNKNOWN)
        raise
    rc, msg = await _end_async(owner, claim, _DONE, body)
    if rc:
        err = _errors.from_code(ffi.string(lib.idem_rc_name(rc)).decode(), msg, decoded)
        err.value = decoded  # the function ran: what it returned is not lost
        raise err
    return Outcome(decoded, False, claim.recovered)


def open(url: "Union[str, os.PathLike[str]]",  # noqa: A001 - the contract's name
         **options: Any) -> Store:
    """Opens a store: "sqlite:PATH", a bare path or a pathlib.Path (an SQLite
    file, created 0600 if missing), "postgresql://..." or "postgres://..."
    (optionally ?idem_schema=NAME), "pg:CONNINFO", or "" for the
    environment variable IDEM_STORE. Use it as a context manager, or call
    close(), when done.

    Options, all keywords: synchronous ("full", the default: a completed
    record survives power loss; or "normal", SQLite only), busy_timeout
    (how long to wait for a locked store; default 10 s), max_connections
    (the pool's size; default 16), group_commit (False: each caller
    commits on its own), read_only (True: calls that write fail with
    StoreUnavailable), replay_cache (completed records kept in memory;
    default 4096, 0 turns it off). Durations are seconds, a string such as
    "10s" or a datetime.timedelta. An unknown option is a TypeError, a URL
    refused InvalidArgument (IDEM_EURL), a server not reached
    StoreUnavailable.

    One store per process, shared by its threads. After fork() the child
    opens a store of its own; an SQLite file that the parent had open at
    the fork cannot be (SQLite's locks of it are the parent's there):
    start such workers with multiprocessing's "forkserver" or "spawn"
    method."""
    return Store(url, **options)
