"""Ordinary values (issue 54, item 2): a datetime, date, time, Decimal,
UUID, Enum, bytes, set, frozenset, dataclass or Pydantic model as a result
or as an argument, on both stores, sync and async, through the decorator,
execute() and execute_local(): written by the documented rule (the JSON
stored is checked), rebuilt as the declared type on the first call and on
every replay, fingerprinted by the same rule; encoder= and decoder= for
the rest, and a value with no rule refused as early as it can be.

Effects are lines in a file (helpers.Effects): a count there is the number
of times a function really ran.
"""
import asyncio
import dataclasses
import datetime
import decimal
import enum
import json
import os
import subprocess
import sys
import uuid
from typing import Dict, List, Optional

import pytest

import idem
from idem import _store
from helpers import records, resolve_completed

UTC2 = datetime.timezone(datetime.timedelta(hours=2))
WHEN = datetime.datetime(2024, 5, 1, 12, 0, 30, 123456, tzinfo=UTC2)
TICKET_ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
# More digits than a double keeps, and a trailing zero.
AMOUNT = "12345678901234567890.10"


def pydantic_or_fail():
    try:
        import pydantic
    except ImportError:
        pytest.fail("pydantic is needed for this case (Debian's python3-pydantic: "
                    "scripts/deps.sh check installs it)", pytrace=False)
    return pydantic


class Priority(enum.Enum):
    LOW = "low"
    URGENT = "urgent"


class Level(enum.Enum):
    ONE = 1
    TWO = 2


@dataclasses.dataclass(frozen=True)
class Assignee:
    name: str
    since: datetime.date


@dataclasses.dataclass
class Ticket:
    id: uuid.UUID
    title: str
    priority: Priority
    opened: datetime.datetime
    cost: decimal.Decimal
    assignee: Optional[Assignee]
    labels: List[str]
    watchers: frozenset
    attachment: bytes


def ticket(n=1, assignee=True):
    return Ticket(id=TICKET_ID, title="Printer on fire %d" % n, priority=Priority.URGENT,
                  opened=WHEN, cost=decimal.Decimal(AMOUNT),
                  assignee=Assignee("ana", datetime.date(2023, 1, 31)) if assignee else None,
                  labels=["hw", "urgent"], watchers=frozenset({"bo", "ana"}),
                  attachment=b"\x00\xffPDF")


TICKET_JSON = {"id": str(TICKET_ID), "title": "Printer on fire 1", "priority": "urgent",
               "opened": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT,
               "assignee": {"name": "ana", "since": "2023-01-31"},
               "labels": ["hw", "urgent"], "watchers": ["ana", "bo"],
               "attachment": "AP9QREY="}


class StandInModel:
    """A Pydantic v2 model as idem sees one: model_dump() and
    model_validate(). Like Pydantic, it writes a set in its iteration
    order. (Debian's python3-pydantic is version 1, tested too, below.)"""

    def __init__(self, id, opened, cost, tags=frozenset({"b", "a", "c"})):
        self.id, self.opened, self.cost, self.tags = id, opened, cost, frozenset(tags)

    def model_dump(self, *, mode="python", by_alias=False):
        assert by_alias is True
        if mode == "python":
            return dict(vars(self))
        assert mode == "json"
        # Pydantic writes a set in its iteration order, which differs from
        # process to process: here, always, one that is not sorted.
        return {"id": str(self.id), "opened": self.opened.isoformat(), "cost": str(self.cost),
                "tags": sorted(self.tags, reverse=True)}

    @classmethod
    def model_validate(cls, data):
        return cls(uuid.UUID(data["id"]), datetime.datetime.fromisoformat(data["opened"]),
                   decimal.Decimal(data["cost"]), data["tags"])

    def __eq__(self, other):
        return type(other) is StandInModel and vars(self) == vars(other)

    __hash__ = None


def v1_model():
    pydantic = pydantic_or_fail()

    class Reading(pydantic.BaseModel):
        id: uuid.UUID
        opened: datetime.datetime
        cost: decimal.Decimal
        level: Level
        assignee: Assignee
    return Reading


# (id, declared type, a fresh value, the JSON stored for it)
RESULTS = [
    ("datetime", datetime.datetime, lambda: WHEN, "2024-05-01T12:00:30.123456+02:00"),
    ("naive-datetime", datetime.datetime, lambda: datetime.datetime(2024, 5, 1, 12, 0),
     "2024-05-01T12:00:00"),
    ("date", datetime.date, lambda: datetime.date(2024, 2, 29), "2024-02-29"),
    ("time", datetime.time, lambda: datetime.time(9, 30, 15, 250000), "09:30:15.250000"),
    ("Decimal", decimal.Decimal, lambda: decimal.Decimal(AMOUNT), AMOUNT),
    ("UUID", uuid.UUID, lambda: TICKET_ID, str(TICKET_ID)),
    ("Enum", Priority, lambda: Priority.URGENT, "urgent"),
    ("int-Enum", Level, lambda: Level.TWO, 2),
    ("bytes", bytes, lambda: b"\x00\xffPDF", "AP9QREY="),
    ("set", set, lambda: {"b", "c", "a"}, ["a", "b", "c"]),
    ("frozenset", frozenset, lambda: frozenset({10, 9, 1}), [1, 9, 10]),
    ("dataclass", Ticket, ticket, TICKET_JSON),
    ("Optional-dataclass", Optional[Ticket], ticket, TICKET_JSON),
    ("Optional-None", Optional[Ticket], lambda: None, None),
    ("list-of-dataclass", List[Ticket], lambda: [ticket(1), ticket(2, assignee=False)],
     [TICKET_JSON, dict(TICKET_JSON, title="Printer on fire 2", assignee=None)]),
    ("dict-of-Decimal", Dict[str, decimal.Decimal],
     lambda: {"eur": decimal.Decimal("1.10"), "usd": decimal.Decimal("-0.5")},
     {"eur": "1.10", "usd": "-0.5"}),
    ("pydantic-v2", StandInModel,
     lambda: StandInModel(TICKET_ID, WHEN, decimal.Decimal(AMOUNT)),
     {"id": str(TICKET_ID), "opened": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT,
      "tags": ["a", "b", "c"]}),
]
if hasattr(list, "__class_getitem__"):  # list[X] and dict[str, X] (3.9)
    RESULTS += [
        ("builtin-list", list[datetime.date], lambda: [datetime.date(2024, 1, 2)],
         ["2024-01-02"]),
        ("builtin-dict", dict[str, uuid.UUID], lambda: {"t": TICKET_ID},
         {"t": str(TICKET_ID)}),
    ]


def shape(value):
    """The value's types all the way down, to tell a rebuilt value from its
    JSON form (Priority.URGENT == "urgent" is False, but a list equals a
    list whatever its items' types)."""
    if dataclasses.is_dataclass(value):
        return (type(value).__name__,
                {f.name: shape(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [shape(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: shape(v) for k, v in value.items()})
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, sorted(type(v).__name__ for v in value))
    if isinstance(value, datetime.datetime):
        return ("datetime", value.utcoffset())
    return type(value).__name__


def same(got, want):
    assert got == want
    assert shape(got) == shape(want)


def stored_body(store, operation, key):
    (record,) = [r for r in records(store.url, operation) if r["key"] == key]
    assert record["state"] == "completed", record
    return json.loads(record["response"]["body"])


def stored_request(store, operation, key):
    (record,) = [r for r in records(store.url, operation) if r["key"] == key]
    return json.loads(record["request"])


def python_way(monkeypatch):
    """The decorator's call made in Python, both C ways turned off."""
    monkeypatch.setattr(_store, "_once_call", lambda *a: NotImplemented)
    monkeypatch.setattr(_store, "_fast_once", lambda *a: NotImplemented)


def returning(store, operation, effects, declared, make, way, **options):
    """A decorated function (def, or async def) declared to return
    declared, returning make() and counting its runs; calls it as the way
    says ("c": idem._speedups' whole call, "python": Python's, "async")
    and returns a function of the key giving its Outcome, and the
    decorated function."""
    if way == "async":
        async def act(request_id):
            await asyncio.sleep(0)
            effects.add("acted %s" % request_id)
            return make()
    else:
        def act(request_id):
            effects.add("acted %s" % request_id)
            return make()
    act.__annotations__["return"] = declared  # as `def act(...) -> declared`
    fn = store.idempotent(operation, key="request_id", **options)(act)
    if way == "async":
        return lambda key: asyncio.run(fn.outcome(key)), fn
    return fn.outcome, fn


def value_cases():
    return pytest.mark.parametrize("declared, make, stored", [c[1:] for c in RESULTS],
                                   ids=[c[0] for c in RESULTS])


ways = pytest.mark.parametrize("way", ["c", "python", "async"])


# --- Results ---------------------------------------------------------------------


@ways
@value_cases()
def test_a_result_replays_as_its_declared_type(store, operation, effects, monkeypatch, way,
                                               declared, make, stored):
    if way == "python":
        python_way(monkeypatch)
    call, fn = returning(store, operation, effects, declared, make, way)

    first = call("k-1")
    again = call("k-1")

    same(first.value, make())
    same(again.value, make())
    assert (first.replayed, again.replayed) == (False, True)
    assert effects.lines() == ["acted k-1"]
    assert stored_body(store, operation, "k-1") == stored
    # The decorated function itself answers the value, as .outcome() does.
    same(asyncio.run(fn("k-1")) if way == "async" else fn("k-1"), make())
    assert effects.count() == 1


@ways
def test_a_real_pydantic_model_replays_as_itself(store, operation, effects, monkeypatch, way):
    if way == "python":
        python_way(monkeypatch)
    Reading = v1_model()

    def make():
        return Reading(id=TICKET_ID, opened=WHEN, cost=decimal.Decimal(AMOUNT),
                       level=Level.TWO, assignee=Assignee("ana", datetime.date(2023, 1, 31)))

    call, _ = returning(store, operation, effects, Reading, make, way)
    first, again = call("k-1"), call("k-1")

    assert type(first.value) is Reading and type(again.value) is Reading
    assert first.value == again.value == make()
    assert type(again.value.assignee) is Assignee and type(again.value.level) is Level
    assert (first.replayed, again.replayed) == (False, True)
    assert effects.count() == 1
    assert stored_body(store, operation, "k-1") == {
        "id": str(TICKET_ID), "opened": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT,
        "level": 2, "assignee": {"name": "ana", "since": "2023-01-31"}}


def test_a_result_without_a_declared_type_replays_its_json_form(store, operation, effects):
    # No annotation: the value is stored by the rule and answered as JSON
    # decoded, the first time as on every replay.
    @store.idempotent(operation, key="request_id")
    def act(request_id):
        effects.add("acted")
        return {"at": WHEN, "cost": decimal.Decimal(AMOUNT), "tags": {"b", "a"}}

    first, again = act.outcome("k-1"), act.outcome("k-1")
    want = {"at": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT, "tags": ["a", "b"]}
    assert (first.value, first.replayed) == (want, False)
    assert (again.value, again.replayed) == (want, True)
    assert effects.count() == 1


def test_a_string_annotation_is_resolved(store, operation, effects):
    @store.idempotent(operation, key="request_id")
    def act(request_id) -> "Optional[Ticket]":
        effects.add("acted")
        return ticket()

    first, again = act.outcome("k-1"), act.outcome("k-1")
    same(first.value, ticket())
    same(again.value, ticket())
    assert again.replayed and effects.count() == 1


# --- Arguments -------------------------------------------------------------------


# (id, a fresh value, another value, the JSON the fingerprint is taken of)
ARGUMENTS = [
    ("datetime", lambda: WHEN, lambda: WHEN + datetime.timedelta(microseconds=1),
     "2024-05-01T12:00:30.123456+02:00"),
    ("date", lambda: datetime.date(2024, 2, 29), lambda: datetime.date(2024, 3, 1),
     "2024-02-29"),
    ("time", lambda: datetime.time(9, 30), lambda: datetime.time(9, 31), "09:30:00"),
    ("Decimal", lambda: decimal.Decimal(AMOUNT),
     lambda: decimal.Decimal("12345678901234567890.11"), AMOUNT),
    ("UUID", lambda: TICKET_ID, lambda: uuid.UUID(int=TICKET_ID.int + 1), str(TICKET_ID)),
    ("Enum", lambda: Priority.URGENT, lambda: Priority.LOW, "urgent"),
    ("bytes", lambda: b"\x00\xffPDF", lambda: b"\x00\xffPDG", "AP9QREY="),
    ("set", lambda: {"b", "c", "a"}, lambda: {"a", "b"}, ["a", "b", "c"]),
    ("frozenset", lambda: frozenset({10, 9, 1}), lambda: frozenset({1, 9}), [1, 9, 10]),
    ("dataclass", ticket, lambda: ticket(2), TICKET_JSON),
    ("pydantic-v2", lambda: StandInModel(TICKET_ID, WHEN, decimal.Decimal(AMOUNT)),
     lambda: StandInModel(TICKET_ID, WHEN, decimal.Decimal("1")),
     {"id": str(TICKET_ID), "opened": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT,
      "tags": ["a", "b", "c"]}),
]


@ways
@pytest.mark.parametrize("make, other, json_form", [c[1:] for c in ARGUMENTS],
                         ids=[c[0] for c in ARGUMENTS])
def test_an_argument_is_fingerprinted_by_the_rule(store, operation, effects, monkeypatch, way,
                                                  make, other, json_form):
    if way == "python":
        python_way(monkeypatch)
    if way == "async":
        @store.idempotent(operation, key="request_id")
        async def place(item, request_id):
            effects.add("placed %s" % request_id)
            return {"placed": effects.count()}

        def call(*args):
            return asyncio.run(place.outcome(*args))
    else:
        @store.idempotent(operation, key="request_id")
        def place(item, request_id):
            effects.add("placed %s" % request_id)
            return {"placed": effects.count()}
        call = place.outcome

    first = call(make(), "k-1")
    again = call(make(), "k-1")          # an equal value: the same request
    as_json = call(json_form, "k-1")     # its JSON form is the same request too
    with pytest.raises(idem.Conflict):
        call(other(), "k-1")              # another value under the key
    fresh = call(other(), "k-2")          # another value under a new key acts

    assert [(o.value, o.replayed) for o in (first, again, as_json, fresh)] == [
        ({"placed": 1}, False), ({"placed": 1}, True), ({"placed": 1}, True),
        ({"placed": 2}, False)]
    assert effects.lines() == ["placed k-1", "placed k-2"]
    assert stored_request(store, operation, "k-1") == {"item": json_form}


def test_a_pydantic_argument_is_fingerprinted_by_the_rule(store, operation, effects):
    Reading = v1_model()

    @store.idempotent(operation, key="request_id")
    def place(reading, request_id):
        effects.add("placed")
        return {"placed": effects.count()}

    def reading(level):
        return Reading(id=TICKET_ID, opened=WHEN, cost=decimal.Decimal(AMOUNT), level=level,
                       assignee=Assignee("ana", datetime.date(2023, 1, 31)))

    assert place.outcome(reading(Level.ONE), "k-1").replayed is False
    assert place.outcome(reading(Level.ONE), "k-1").replayed is True
    with pytest.raises(idem.Conflict):
        place(reading(Level.TWO), "k-1")
    assert effects.count() == 1
    assert stored_request(store, operation, "k-1")["reading"]["level"] == 1


def test_set_order_does_not_change_the_fingerprint(store, operation, effects):
    @store.idempotent(operation, key="request_id")
    def tag(tags, request_id):
        effects.add("tagged")
        return sorted(tags, key=str)

    many = ["t%03d" % i for i in range(200)]
    first = tag.outcome(set(many), "k-1")
    again = tag.outcome(set(reversed(many)), "k-1")
    mixed = tag.outcome({3, "a", 1.5, None}, "k-2")
    mixed_again = tag.outcome({None, 1.5, "a", 3}, "k-2")
    assert (first.replayed, again.replayed, mixed.replayed, mixed_again.replayed) == (
        False, True, False, True)
    assert effects.count() == 2
    assert stored_request(store, operation, "k-1") == {"tags": sorted(many)}


CHILD = r"""
import sys, idem
store = idem.open(sys.argv[1])

@store.idempotent(sys.argv[2], key="request_id")
def tag(tags, request_id):
    with open(sys.argv[3], "a") as f:
        f.write("tagged\n")
    return {"n": len(tags)}

out = tag.outcome({"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}, "k-1")
print(out.replayed)
"""


def test_a_set_argument_replays_in_another_process(store, operation, effects):
    # A set of str iterates in another order in each process (hash
    # randomization): sorted, it is one request in every worker.
    path = os.path.dirname(os.path.dirname(idem.__file__))
    got = []
    for seed in ("1", "2", "3", "4"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=path)
        done = subprocess.run([sys.executable, "-c", CHILD, store.url, operation,
                               effects.path], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        got.append(done.stdout.strip())
    assert got == ["False", "True", "True", "True"]
    assert effects.lines() == ["tagged"]


# --- execute() and execute_local() -------------------------------------------------


def test_execute_writes_the_request_and_rebuilds_the_result(store, operation, effects):
    def open_ticket() -> Ticket:
        effects.add("opened")
        return ticket()

    request = {"at": WHEN, "cost": decimal.Decimal(AMOUNT), "id": TICKET_ID}
    first = store.execute(operation, "k-1", request, open_ticket)
    again = store.execute(operation, "k-1", dict(request), open_ticket)
    # A lambda declares nothing: returns= says what to rebuild.
    typed = store.execute(operation, "k-1", request, lambda: ticket(), returns=Ticket)
    raw = store.execute(operation, "k-1", request, lambda: ticket())
    with pytest.raises(idem.Conflict):
        store.execute(operation, "k-1", dict(request, at=WHEN.replace(hour=13)), open_ticket)

    same(first.value, ticket())
    same(again.value, ticket())
    same(typed.value, ticket())
    assert raw.value == TICKET_JSON
    assert [o.replayed for o in (first, again, typed, raw)] == [False, True, True, True]
    assert effects.count() == 1
    assert stored_request(store, operation, "k-1") == {
        "at": "2024-05-01T12:00:30.123456+02:00", "cost": AMOUNT, "id": str(TICKET_ID)}


def test_execute_local_writes_the_request_and_rebuilds_the_result(store, db, operation):
    tickets = db.tickets_table()

    def insert(tx) -> Ticket:
        tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?)" % tickets), ("{}",))
        return ticket()

    request = {"at": WHEN, "tags": {"b", "a"}}
    first = store.execute_local(operation, "k-1", request, insert)
    again = store.execute_local(operation, "k-1", {"tags": {"a", "b"}, "at": WHEN}, insert)
    with pytest.raises(idem.Conflict):
        store.execute_local(operation, "k-1", {"at": WHEN, "tags": {"a"}}, insert)
    opts = store.execute_local(operation, "k-1", request, lambda tx: None,
                               returns=Optional[Ticket], lease="10s")

    same(first.value, ticket())
    same(again.value, ticket())
    same(opts.value, ticket())
    assert [o.replayed for o in (first, again, opts)] == [False, True, True]
    assert db.count(tickets) == 1
    assert stored_request(store, operation, "k-1") == {
        "at": "2024-05-01T12:00:30.123456+02:00", "tags": ["a", "b"]}


# --- encoder= and decoder= -----------------------------------------------------------


class Money:
    """A class of the application's own: no rule knows it."""

    def __init__(self, cents, currency):
        self.cents, self.currency = cents, currency

    def __eq__(self, other):
        return type(other) is Money and (self.cents, self.currency) == (other.cents,
                                                                         other.currency)

    __hash__ = None


def money_encoder(value):
    if isinstance(value, Money):
        return {"cents": value.cents, "currency": value.currency}
    raise TypeError("not Money")


def money_decoder(declared, data):
    assert declared is Money
    return Money(data["cents"], data["currency"])


@ways
def test_encoder_and_decoder_for_a_type_of_ones_own(store, operation, effects, monkeypatch,
                                                    way):
    if way == "python":
        python_way(monkeypatch)
    if way == "async":
        @store.idempotent(operation, key="request_id", encoder=money_encoder,
                          decoder=money_decoder)
        async def refund(amount: Money, request_id) -> Dict[str, List[Money]]:
            effects.add("refunded")
            return {"refunds": [amount, Money(1, "EUR")]}

        def call(*args):
            return asyncio.run(refund.outcome(*args))
    else:
        @store.idempotent(operation, key="request_id", encoder=money_encoder,
                          decoder=money_decoder)
        def refund(amount: Money, request_id) -> Dict[str, List[Money]]:
            effects.add("refunded")
            return {"refunds": [amount, Money(1, "EUR")]}
        call = refund.outcome

    first = call(Money(500, "EUR"), "k-1")
    again = call(Money(500, "EUR"), "k-1")
    with pytest.raises(idem.Conflict):
        call(Money(501, "EUR"), "k-1")

    want = {"refunds": [Money(500, "EUR"), Money(1, "EUR")]}
    assert (first.value, first.replayed) == (want, False)
    assert (again.value, again.replayed) == (want, True)
    assert effects.count() == 1
    assert stored_request(store, operation, "k-1") == {
        "amount": {"cents": 500, "currency": "EUR"}}
    assert stored_body(store, operation, "k-1") == {
        "refunds": [{"cents": 500, "currency": "EUR"}, {"cents": 1, "currency": "EUR"}]}


def test_encoder_and_decoder_on_execute_and_execute_local(store, operation, effects):
    def charge() -> Money:
        effects.add("charged")
        return Money(700, "EUR")

    hooks = {"encoder": money_encoder, "decoder": money_decoder}
    outs = [store.execute(operation, "k-1", {"amount": Money(700, "EUR")}, charge, **hooks)
            for _ in range(2)]
    local = [store.execute_local(operation + "_local", "k-1", [Money(1, "USD")],
                                 lambda tx: Money(2, "USD"), returns=Money, **hooks)
             for _ in range(2)]

    assert [(o.value, o.replayed) for o in outs] == [(Money(700, "EUR"), False),
                                                     (Money(700, "EUR"), True)]
    assert [(o.value, o.replayed) for o in local] == [(Money(2, "USD"), False),
                                                      (Money(2, "USD"), True)]
    assert effects.count() == 1


# --- A value with no rule ---------------------------------------------------------------


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


@ways
def test_an_argument_with_no_rule_is_refused_before_the_claim(store, operation, effects,
                                                              monkeypatch, way):
    if way == "python":
        python_way(monkeypatch)
    if way == "async":
        @store.idempotent(operation, key="request_id")
        async def place(where, request_id):
            effects.add("placed")

        def call(*args):
            return asyncio.run(place(*args))
    else:
        @store.idempotent(operation, key="request_id")
        def place(where, request_id):
            effects.add("placed")
        call = place

    with pytest.raises(TypeError) as e:
        call({"at": [Point(1, 2)]}, "k-1")
    assert str(e.value) == (
        "the arguments cannot be written as JSON for the fingerprint: a value of type "
        "Point has no JSON form: pass encoder= to turn it into one " + idem._values.HELP)
    with pytest.raises(TypeError, match="type Point has no JSON form: pass encoder="):
        store.execute(operation, "k-1", {"at": Point(1, 2)}, lambda: effects.add("x"))
    assert effects.lines() == []
    assert records(store.url, operation) == []


@ways
def test_a_result_with_no_rule_marks_the_key_unknown_and_says_how_to_fix(
        store, operation, effects, monkeypatch, way):
    # Without a declared type, it can only be found once the function ran.
    if way == "python":
        python_way(monkeypatch)
    call, _ = returning(store, operation, effects, None, lambda: {"at": Point(1, 2)}, way)
    del _
    with pytest.raises(TypeError) as e:
        call("k-1")
    assert str(e.value) == (
        "the function acted, but its result cannot be stored as JSON (the key is marked "
        "unknown): a value of type Point has no JSON form: pass encoder= to turn it into "
        "one, and decoder= to rebuild it " + idem._values.HELP)
    with pytest.raises(idem.OutcomeUnknown):
        call("k-1")
    assert effects.count() == 1
    assert [r["state"] for r in records(store.url, operation)] == ["unknown"]


@pytest.mark.parametrize("declared, make, point", [
    (Point, lambda: Point(1, 2), lambda v: v),
    (Optional[Point], lambda: Point(1, 2), lambda v: v),
    (List[Point], lambda: [Point(1, 2)], lambda v: v[0]),
    (Dict[str, Point], lambda: {"p": Point(1, 2)}, lambda v: v["p"]),
], ids=["Point", "Optional", "List", "Dict"])
def test_a_declared_result_type_with_no_rule_is_refused_at_decoration(
        store, operation, effects, declared, make, point):
    def place(request_id):
        effects.add("placed")
        return make()
    place.__annotations__["return"] = declared

    with pytest.raises(TypeError) as e:
        store.idempotent(operation, key="request_id")(place)
    assert str(e.value).startswith("%s is declared to return a Point, which idem can neither "
                                   "store nor rebuild" % place.__qualname__), str(e.value)
    assert "encoder=" in str(e.value) and "decoder=" in str(e.value)
    assert effects.count() == 0
    # Given both, it decorates, stores and rebuilds.
    fn = store.idempotent(operation, key="request_id",
                          encoder=lambda p: [p.x, p.y],
                          decoder=lambda tp, d: Point(*d))(place)
    first, again = fn.outcome("k-1"), fn.outcome("k-1")
    assert [(type(point(o.value)), point(o.value).x, point(o.value).y, o.replayed)
            for o in (first, again)] == [(Point, 1, 2, False), (Point, 1, 2, True)]
    assert effects.count() == 1


def test_a_dataclass_field_with_no_rule_is_refused_at_decoration(store, operation):
    @dataclasses.dataclass
    class Shape:
        at: Point

    def draw(request_id) -> Shape:
        return Shape(Point(0, 0))

    with pytest.raises(TypeError, match="Shape.at"):
        store.idempotent(operation, key="request_id")(draw)
    assert records(store.url, operation) == []


# --- Declared types read late, and stored bodies that do not fit ------------------------


def test_a_type_defined_after_decoration_is_read_at_the_first_call(store, operation, effects):
    @store.idempotent(operation, key="request_id")
    def act(request_id) -> "DefinedLater":
        effects.add("acted")
        return DefinedLater(WHEN)

    @store.idempotent(operation + "_never", key="request_id")
    def never(request_id) -> "NeverDefined":  # noqa: F821 - the case
        effects.add("never")

    first, again = act.outcome("k-1"), act.outcome("k-1")
    assert (first.value, again.value, again.replayed) == (DefinedLater(WHEN),) * 2 + (True,)
    assert type(again.value.at) is datetime.datetime
    # A name never defined: refused at the first call, before the claim.
    with pytest.raises(TypeError, match="its return annotation names what is not defined"):
        never("k-1")
    assert effects.lines() == ["acted"]
    assert records(store.url, operation + "_never") == []


@dataclasses.dataclass
class DefinedLater:
    at: datetime.datetime


def test_a_stored_body_that_does_not_fit_the_declared_type(store, operation, effects,
                                                           tmp_path):
    # An operator settles keys marked unknown with bodies of their own: one
    # that is a datetime's text replays as a datetime; one that is not is
    # said to be so on every replay.
    @store.idempotent(operation, key="request_id")
    def due(request_id) -> datetime.datetime:
        effects.add("acted %s" % request_id)
        raise ConnectionError("sent, then the connection dropped")

    for key, body in (("k-1", '"2024-05-01T12:00:30.123456+02:00"'),
                      ("k-2", '"next tuesday"')):
        with pytest.raises(ConnectionError):
            due(key)
        (tmp_path / key).write_text(body)
        resolve_completed(store.url, operation, key, tmp_path / key)

    assert (due("k-1"), due.outcome("k-1").replayed) == (WHEN, True)
    for _ in range(2):
        with pytest.raises(TypeError, match="the result as stored cannot be rebuilt as "
                                            "datetime, the declared type: ValueError"):
            due("k-2")
    assert effects.lines() == ["acted k-1", "acted k-2"]
    assert sorted(r["state"] for r in records(store.url, operation)) == ["completed"] * 2
