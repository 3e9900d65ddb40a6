"""Ordinary values as JSON, and back, by one rule, and release_on's
classes and predicates.

The rule writes what JSON does not hold as a JSON value: a datetime, date
or time as its ISO 8601 text (isoformat(): a datetime keeps its offset, a
naive one stays naive), a Decimal as its exact decimal text (str(): a
JSON number would be read as a double, and canonical JSON would drop the
digits past the 17th), a UUID as its text, an Enum as its value, bytes as
base64, a set or frozenset as a sorted list, a dataclass as the dict of
its fields, a Pydantic model as model_dump(mode="json") (version 2, its
sets sorted) or .dict() (version 1, its values then written by this
rule). It is json's default= hook: a value JSON holds never reaches it, so
that the C encoder of idem._speedups (which leaves every other type to
Python) and Python's json write the same JSON. Arguments, requests and
results all go through it; a function's declared return type then says
what to rebuild from the JSON (reader()).
"""
import base64
import collections.abc
import dataclasses
import datetime
import decimal
import enum
import json
import types
import typing
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

Encoder = Optional[Callable[[Any], Any]]
Decoder = Optional[Callable[[Any, Any], Any]]

# What a value with no JSON form is told, after its type: encoder= is a
# callable that turns such a value into one JSON holds (a dict, say), and
# decoder=(declared type, JSON value) rebuilds it.
HELP = ("(encoder=lambda v: {...} returns what JSON holds; decoder=lambda tp, data: ... "
        "rebuilds the declared type; datetime, date, time, Decimal, UUID, Enum, bytes, "
        "sets, dataclasses and Pydantic models need neither)")


class NoRule(TypeError):
    """A value that neither JSON nor the rule (nor the encoder given)
    writes. Its message names the type; the caller says how to fix it."""

    def __init__(self, value: Any) -> None:
        super().__init__("a value of type %s has no JSON form" % type(value).__qualname__)


def hint(e: BaseException, result: bool) -> str:
    """What a failed encoding says: its error, and for a value with no rule
    how to give it one."""
    if not isinstance(e, NoRule):
        return str(e)
    if result:
        return "%s: pass encoder= to turn it into one, and decoder= to rebuild it %s" % (
            e, HELP)
    return "%s: pass encoder= to turn it into one %s" % (e, HELP)


def _pydantic_v2(cls: type) -> bool:
    return callable(getattr(cls, "model_dump", None)) and \
        callable(getattr(cls, "model_validate", None))


def _pydantic_v1(cls: type) -> bool:
    # pydantic.BaseModel of version 1 (or pydantic.v1's), found without
    # importing pydantic: version 1 has no model_dump().
    return callable(getattr(cls, "parse_obj", None)) and any(
        c.__name__ == "BaseModel" and c.__module__.split(".")[0] == "pydantic"
        for c in getattr(cls, "__mro__", ()))


_NUMBERS = (int, float, decimal.Decimal)


class Writer:
    """Writes values as JSON text by the rule, with an encoder for the rest
    (or none). One is made per encoder and kept: json's C encoder, made
    once, is half the cost of json.dumps()."""

    def __init__(self, encoder: Encoder = None) -> None:
        if encoder is not None and not callable(encoder):
            raise TypeError("encoder must be a callable, not %s" % type(encoder).__name__)
        self.encoder = encoder
        # Without markers (check_circular=False): markers shared by every
        # call would keep what a failed encoding marked, for good, and be
        # shared by threads. A value that holds itself ends in
        # RecursionError, and is encoded again with markers of its own to
        # say so.
        self._c = self._make(None)

    def _make(self, markers: Optional[Dict[int, Any]]) -> Callable[[Any, int], Any]:
        c_make = getattr(json.encoder, "c_make_encoder", None)
        if c_make is not None:
            made: Callable[[Any, int], Any] = c_make(
                markers, self.default, getattr(json.encoder, "encode_basestring"), None, ":",
                ",", False, False, False)
            return made
        enc = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                               check_circular=markers is not None, default=self.default)
        return lambda value, _: enc.iterencode(value)  # pragma: no cover - CPython has C

    def encode(self, value: Any) -> str:
        try:
            return "".join(self._c(value, 0))
        except RecursionError:
            # ValueError for a circular reference; else deep: RecursionError.
            return "".join(self._make({})(value, 0))

    def default(self, o: Any) -> Any:
        """json's default=: what to write in o's place."""
        cls = type(o)
        if isinstance(o, (datetime.date, datetime.time)):  # datetime is a date
            return o.isoformat()
        if isinstance(o, decimal.Decimal):
            return str(o)
        if isinstance(o, uuid.UUID):
            return str(o)
        if isinstance(o, enum.Enum):
            return o.value
        if isinstance(o, (bytes, bytearray, memoryview)):
            return base64.b64encode(o).decode("ascii")
        if isinstance(o, (set, frozenset)):
            return self._sorted(o)
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        if _pydantic_v2(cls):
            return self._pydantic(o)
        if _pydantic_v1(cls):
            return o.dict(by_alias=True)
        if self.encoder is not None:
            return self.encoder(o)
        raise NoRule(o)

    def _pydantic(self, o: Any) -> Any:
        """A Pydantic model (version 2) as model_dump(mode="json") writes it
        (its own serializers, aliases, all of its types), but for sets:
        Pydantic writes a set in its iteration order, which differs from
        process to process for str items (hash randomization), so the same
        model would make another fingerprint in another worker. Each list
        that model_dump(mode="python") holds as a set there is sorted as
        the rule sorts a set."""
        data = o.model_dump(mode="json", by_alias=True)
        try:
            return self._sets_sorted(o.model_dump(mode="python", by_alias=True), data)
        except Exception:  # noqa: B902 - no python mode: JSON's as it is
            return data

    def _sets_sorted(self, py: Any, js: Any) -> Any:
        if isinstance(py, (set, frozenset)) and isinstance(js, list) and len(js) == len(py):
            return self._sorted(js)
        if isinstance(py, dict) and isinstance(js, dict):
            return {k: self._sets_sorted(py[k], v) if k in py else v for k, v in js.items()}
        if isinstance(py, (list, tuple)) and isinstance(js, list) and len(js) == len(py):
            return [self._sets_sorted(p, j) for p, j in zip(py, js)]
        return js

    def _sorted(self, items: Iterable[Any]) -> List[Any]:
        """A set's items in an order of their own, whatever the set's: all
        numbers by value, all str by code point, else (a mix, or other
        types) by each item's JSON text. Two equal sets are one request."""
        items = list(items)
        if all(type(x) is str for x in items) or all(
                isinstance(x, _NUMBERS) and not isinstance(x, bool) for x in items):
            try:
                return sorted(items)
            except (TypeError, ArithmeticError):  # Decimal("NaN")
                pass
        return sorted(items, key=self.encode)


_WRITERS: Dict[Any, Writer] = {}
PLAIN = Writer()


def writer(encoder: Encoder) -> Writer:
    """The Writer of an encoder (the rule alone for None), made once."""
    if encoder is None:
        return PLAIN
    try:
        return _WRITERS[encoder]
    except (KeyError, TypeError):
        w = Writer(encoder)
        try:
            if len(_WRITERS) < 256:
                _WRITERS[encoder] = w
        except TypeError:
            pass
        return w


# --- Reading a stored value back as its declared type ---------------------------

Reader = Callable[[Any], Any]


class Unresolved(Exception):
    """A declared type that names what is not defined yet (a forward
    reference): read again at the first call."""


def _hints(obj: Any, globalns: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    try:
        kw: Dict[str, Any] = {"include_extras": True} if hasattr(typing, "Annotated") else {}
        return typing.get_type_hints(obj, globalns=globalns, **kw)
    except NameError as e:
        raise Unresolved(str(e)) from None


def declared_return(fn: Callable[..., Any]) -> Any:
    """fn's return annotation, resolved (None when it has none); raises
    Unresolved for a name not defined yet."""
    inner = fn
    while hasattr(inner, "__wrapped__"):
        inner = inner.__wrapped__
    ann = getattr(inner, "__annotations__", None)
    if not ann or "return" not in ann:
        return None
    holder = types.SimpleNamespace(__annotations__={"return": ann["return"]})
    return _hints(holder, getattr(inner, "__globals__", None))["return"]


_AS_IS = (str, int, float, bool, type(None), dict, list, object)
_UNIONS: Tuple[Any, ...] = (typing.Union,) + (
    (types.UnionType,) if hasattr(types, "UnionType") else ())  # X | Y, 3.10


class _Refused(TypeError):
    pass


def _name(tp: Any) -> str:
    """A class or function by its name, anything else (List[int]) by its
    repr."""
    if typing.get_origin(tp) is None and (isinstance(tp, type) or callable(tp)):
        return getattr(tp, "__qualname__", None) or repr(tp)
    return repr(tp)


class _Build:
    """Makes the reader of one declared type: None where the JSON value is
    the value (str, int, dict, Any...), else a function of it. Refuses
    (_Refused) a type the rule can neither write nor rebuild, unless both
    hooks are given."""

    def __init__(self, encoder: Encoder, decoder: Decoder) -> None:
        self.encoder, self.decoder = encoder, decoder
        self.seen: Dict[Any, List[Any]] = {}  # a dataclass being built: its reader, later

    def of(self, tp: Any, where: str = "") -> Optional[Reader]:
        got = self._of(tp, where)
        if got is None:
            return None
        read: Reader = got
        return lambda d: None if d is None else read(d)

    def _of(self, tp: Any, where: str) -> Optional[Reader]:
        if tp is None or tp is Any or tp in _AS_IS or isinstance(tp, typing.TypeVar):
            return None
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is not None:
            return self._generic(tp, origin, args, where)
        if getattr(tp, "__supertype__", None) is not None:  # NewType
            return self.of(tp.__supertype__, where)
        if isinstance(tp, str) or isinstance(tp, typing.ForwardRef):
            raise Unresolved(str(tp))
        if not isinstance(tp, type):
            return None  # typing's specials that hold any JSON value
        return self._class(tp, where)

    def _generic(self, tp: Any, origin: Any, args: Tuple[Any, ...],
                 where: str) -> Optional[Reader]:
        if origin in _UNIONS:
            return self._union(args, where)
        if origin is typing.Literal or origin is typing.ClassVar:
            return None
        if hasattr(typing, "Annotated") and origin is getattr(typing, "Annotated", None):
            return self.of(args[0], where)
        if not isinstance(origin, type):
            return None
        if issubclass(origin, tuple):
            if len(args) == 2 and args[1] is Ellipsis:
                each = self.of(args[0], where)
                if each is None:
                    return tuple
                one: Reader = each
                return lambda d: tuple(one(x) for x in d)
            if args == ((),):
                return lambda d: tuple(d)
            items = [self.of(a, where) for a in args]
            if not items:
                return lambda d: tuple(d)
            return lambda d: tuple(x if r is None else r(x) for r, x in zip(items, d))
        if issubclass(origin, collections.abc.Mapping):
            key = self.of(args[0], where) if args else None
            value = self.of(args[1], where) if len(args) > 1 else None
            if key is None and value is None:
                return None
            return lambda d: {(k if key is None else key(k)):
                              (v if value is None else value(v)) for k, v in d.items()}
        if issubclass(origin, collections.abc.Set):
            item = self.of(args[0], where) if args else None
            made = frozenset if issubclass(origin, frozenset) else set
            return lambda d: made(d if item is None else (item(x) for x in d))
        if issubclass(origin, collections.abc.Iterable) and \
                not issubclass(origin, (str, bytes)):
            got = self.of(args[0], where) if args else None
            if got is None:
                return None
            elem: Reader = got
            return lambda d: [elem(x) for x in d]
        return self._class(origin, where)

    def _union(self, args: Tuple[Any, ...], where: str) -> Optional[Reader]:
        members = [a for a in args if a is not type(None)]
        readers = [self.of(a, where) for a in members]
        if all(r is None for r in readers):
            return None
        if len(members) == 1:
            return readers[0]
        tries = [r if r is not None else (lambda d: d) for r in readers]

        def first_that_reads(d: Any) -> Any:
            errors = []
            for r in tries:
                try:
                    return r(d)
                except Exception as e:  # noqa: B902 - the next member may read it
                    errors.append(e)
            raise errors[0]
        return first_that_reads

    def _class(self, cls: type, where: str) -> Optional[Reader]:
        if issubclass(cls, datetime.datetime):
            return cls.fromisoformat
        if issubclass(cls, datetime.date) or issubclass(cls, datetime.time):
            return cls.fromisoformat
        if issubclass(cls, decimal.Decimal):
            return lambda d: cls(repr(d) if isinstance(d, float) else d)
        if issubclass(cls, uuid.UUID):
            return cls
        if issubclass(cls, enum.Enum):
            return cls
        if issubclass(cls, (bytes, bytearray)):
            return lambda d: cls(base64.b64decode(d, validate=True))
        if issubclass(cls, (set, frozenset)):
            return cls
        if dataclasses.is_dataclass(cls):
            return self._dataclass(cls)
        if _pydantic_v2(cls):
            return cls.model_validate  # type: ignore[attr-defined, no-any-return]
        if _pydantic_v1(cls):
            return cls.parse_obj  # type: ignore[attr-defined, no-any-return]
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):  # a NamedTuple
            hints = _hints(cls)
            items = [self.of(hints.get(f), where) for f in getattr(cls, "_fields")]
            return lambda d: cls(*(x if r is None else r(x) for r, x in zip(items, d)))
        if issubclass(cls, (str, int, float)) and not issubclass(cls, bool):
            return None if cls in (str, int, float) else cls
        if issubclass(cls, (list, dict, tuple)):  # TypedDict is a dict
            return (lambda d: tuple(d)) if issubclass(cls, tuple) else None
        if cls.__module__ == "collections.abc" and issubclass(
                cls, (collections.abc.Mapping, collections.abc.Set,
                      collections.abc.Iterable)):  # Sequence, Mapping... bare
            return self._generic(cls, cls, (), where)
        if self.encoder is not None and self.decoder is not None:
            decoder = self.decoder
            return lambda d: decoder(cls, d)
        raise _Refused("a %s%s" % (_name(cls), where))

    def _dataclass(self, cls: type) -> Reader:
        if cls in self.seen:  # a dataclass that holds itself: read through its cell
            held = self.seen[cls]
            return lambda d: held[0](d)
        cell: List[Any] = [None]
        self.seen[cls] = cell
        hints = _hints(cls)
        fields = [(f.name, f.init, self.of(hints.get(f.name, Any),
                                           " (%s.%s)" % (_name(cls), f.name)))
                  for f in dataclasses.fields(cls)]

        def read(d: Any) -> Any:
            given, later = {}, []
            for name, init, r in fields:
                if name in d:
                    v = d[name] if r is None else r(d[name])
                    if init:
                        given[name] = v
                    else:
                        later.append((name, v))
            obj = cls(**given)
            for name, v in later:
                object.__setattr__(obj, name, v)  # init=False, frozen or not
            return obj
        cell[0] = read
        return read


def reader(tp: Any, encoder: Encoder, decoder: Decoder, what: str) -> Optional[Reader]:
    """The function that rebuilds a value declared as tp from its stored
    JSON (None: the JSON value is the value), None passing through. Raises
    TypeError for a type idem can neither store nor rebuild (what names
    the function), Unresolved for a name not defined yet."""
    if decoder is not None and not callable(decoder):
        raise TypeError("decoder must be a callable, not %s" % type(decoder).__name__)
    try:
        read = _Build(encoder, decoder).of(tp)
    except _Refused as e:
        raise TypeError(
            "%s is declared to return %s, which idem can neither store nor rebuild: make it "
            "a dataclass or a Pydantic model, or pass encoder= (to write it as JSON) and "
            "decoder= (to rebuild it from that) %s" % (what, e, HELP)) from None
    if read is None:
        return None
    name = _name(tp)
    known: Reader = read

    def rebuild(data: Any) -> Any:
        if data is None:
            return None
        try:
            return known(data)
        except Exception as e:  # noqa: B902 - said with the type it was read as
            raise TypeError("the result as stored cannot be rebuilt as %s, the declared "
                            "type: %s: %s" % (name, type(e).__name__, e)) from e
    return rebuild


_READERS: Dict[Tuple[Any, ...], Optional[Reader]] = {}


def reader_of(fn: Any, returns: Any, encoder: Encoder, decoder: Decoder) -> Optional[Reader]:
    """execute()'s and execute_local()'s reader: of returns, else of the
    action's return annotation; made once per type and hooks."""
    if returns is None:
        if not getattr(fn, "__annotations__", None):
            return None
        try:
            returns = declared_return(fn)
        except Unresolved as e:
            raise TypeError("%s: its return annotation names what is not defined: %s"
                            % (_name(fn), e)) from None
        if returns is None:
            return None
    k = (returns, encoder, decoder)
    try:
        return _READERS[k]
    except (KeyError, TypeError):
        pass
    try:
        got = reader(returns, encoder, decoder, "the action")
    except Unresolved as e:
        raise TypeError("returns=%r names what is not defined: %s" % (returns, e)) from None
    try:
        if len(_READERS) < 256:
            _READERS[k] = got
    except TypeError:
        pass
    return got


_O = typing.TypeVar("_O")


def read_outcome(outcome: _O, read: Optional[Reader]) -> _O:
    """The Outcome with its value rebuilt by read (as it is without one)."""
    if read is None:
        return outcome
    o: Any = outcome
    made: _O = type(o)(read(o.value), o.replayed, o.recovered)
    return made


# --- release_on ---------------------------------------------------------------------


class Predicate:
    """A release_on predicate, as isinstance() sees it: an object with
    __instancecheck__ may stand in isinstance()'s tuple of classes, so the
    C path (idem._speedups' is_release()) and the Python path ask
    isinstance(exc, release_on) alike. It is asked of an Exception only
    (KeyboardInterrupt, SystemExit, a cancelled task are released only by
    their class named). One that raises cannot tell: False, the safe side
    (the key is marked unknown unless another of release_on matches), and
    a note on the exception says so."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[BaseException], Any]) -> None:
        self.fn = fn

    def __instancecheck__(self, exc: Any) -> bool:
        if not isinstance(exc, Exception):
            return False
        try:
            return bool(self.fn(exc))
        except BaseException as e:  # noqa: B902 - cannot tell: the key is marked unknown
            add_note = getattr(exc, "add_note", None)  # Python 3.11
            if add_note is not None:
                add_note("idem: release_on's %s raised %s: %s; taken as no match, so it "
                         "did not release the key" % (_name(self.fn), type(e).__name__, e))
            return False

    def __repr__(self) -> str:
        return "<release_on predicate %s>" % _name(self.fn)


def release_on(given: Any) -> Tuple[Any, ...]:
    """release_on= as isinstance() takes it: exception classes, and
    predicates (callables taking the exception) as Predicates; one class or
    one callable alone, or an iterable of them."""
    if given == ():  # the default, as most calls give it
        return ()
    if isinstance(given, (type, Predicate)) or (
            callable(given) and not isinstance(given, collections.abc.Iterable)):
        given = (given,)
    elif isinstance(given, (str, bytes)) or not isinstance(given, collections.abc.Iterable):
        raise TypeError("release_on: %r is neither an exception class, a predicate (a "
                        "callable taking the exception), nor a list of them" % (given,))
    out: List[Any] = []
    for item in given:
        if isinstance(item, type):
            if not issubclass(item, BaseException):
                raise TypeError("release_on: %r is not an exception class" % (item,))
            out.append(item)
        elif isinstance(item, Predicate):
            out.append(item)
        elif callable(item):
            out.append(Predicate(item))
        else:
            raise TypeError("release_on: %r is neither an exception class nor a predicate "
                            "(a callable taking the exception)" % (item,))
    return tuple(out)


