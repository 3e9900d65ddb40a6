"""What a user meets first: `from idem import *`, durations as
datetime.timedelta, paths as os.PathLike, the reprs of Store, Transaction
and Cursor, docstrings that stand alone, and idem.disabled() (the switch
that makes a decorated function a plain call, for tests)."""
import asyncio
import builtins
import datetime
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

import idem


def test_import_star_leaves_the_builtin_open_alone():
    names = {}
    exec("from idem import *", names)  # noqa: S102
    assert "open" not in names
    assert "Store" in names and "Outcome" in names and "Conflict" in names
    assert "disabled" in names and "Idempotent" in names
    assert idem.open is not builtins.open  # idem.open() is still there


def test_durations_may_be_timedeltas(store, operation):
    td = datetime.timedelta
    with idem.open(store.url, busy_timeout=td(seconds=5)) as s:
        @s.idempotent(operation, key="k", lease=td(minutes=2), retention=td(hours=1),
                      wait=td(milliseconds=500))
        def f(k):
            return 1
        assert f("k-1") == 1
        rec = s.get(operation, "k-1")
        assert rec is not None
        out = s.execute(operation, "k-2", {}, lambda: 2, lease=td(seconds=30))
        assert out.value == 2
    with pytest.raises(idem.InvalidArgument, match="lease.*longer"):
        store.idempotent(operation, key="k", lease=td(days=31))
    with pytest.raises(idem.InvalidArgument, match="not a duration"):
        store.idempotent(operation, key="k", lease=td(seconds=-1))


def test_a_store_may_be_a_path(tmp_path):
    path = tmp_path / "paths" / "idem.db"
    path.parent.mkdir()
    with idem.open(path) as s:
        assert s.backend == "sqlite"
        assert s.url == "sqlite:%s" % path
        assert s.execute("op", "k", {}, lambda: 7).value == 7
    assert path.exists()

    class Custom:  # any os.PathLike
        def __fspath__(self):
            return str(path)
    with idem.open(Custom()) as s:
        assert s.execute("op", "k", {}, lambda: 8).replayed


def test_reprs(store, backend, operation):
    r = repr(store)
    assert r.startswith("<idem.Store ") and "(%s)" % backend in r and "open" in r
    if backend == "sqlite":
        assert store.url in r
    seen = []

    def act(tx):
        seen.append(repr(tx))
        cur = tx.execute("SELECT 1, 2 UNION ALL SELECT 3, 4")
        seen.append(repr(cur))
        cur.fetchone()
        seen.append(repr(cur))
        return 1
    store.execute_local(operation, "k-1", {}, act)
    assert seen[0] == "<idem.Transaction %s open>" % backend
    assert seen[1].startswith("<idem.Cursor rowcount=") and "rows left=2" in seen[1]
    assert "rows left=1" in seen[2]
    s = idem.open(store.url)
    s.close()
    assert repr(s).endswith(" closed>")


def test_repr_hides_a_password():
    from idem import _store
    assert _store._redacted("postgresql://me:secret@db.example/x") == \
        "postgresql://me:***@db.example/x"
    assert _store._redacted("postgresql://db/x?user=me&password=secret&x=1") == \
        "postgresql://db/x?user=me&password=***&x=1"
    assert _store._redacted("sqlite:/a:b@c.db") == "sqlite:/a:b@c.db"


def public_callables():
    yield "idem", idem
    for name in idem.__all__ + ["open"]:
        obj = getattr(idem, name)
        yield name, obj
        if inspect.isclass(obj) and obj.__module__.startswith("idem"):
            for attr, member in vars(obj).items():
                if callable(member) and not attr.startswith("_"):
                    yield "%s.%s" % (name, attr), member


def test_docstrings_stand_alone():
    """Every public name says what it does without a file the package does
    not ship (they pointed to docs/python.md)."""
    for name, obj in public_callables():
        doc = inspect.getdoc(obj)
        assert doc, "%s has no docstring" % name
        assert ".md" not in doc, "%s points to a file: %s" % (name, doc)
    doc = inspect.getdoc(idem.Store.idempotent)
    for param in inspect.signature(idem.Store.idempotent).parameters:
        if param != "self":
            assert param in doc, "idempotent()'s docstring does not say what %s is" % param
    doc = inspect.getdoc(idem.open)
    for option in ("synchronous", "busy_timeout", "max_connections", "group_commit",
                   "read_only", "replay_cache"):
        assert option in doc
    from idem import _values
    assert ".md" not in _values.HELP


def test_disabled_makes_the_decorator_a_plain_call(store, operation, effects):
    @store.idempotent(operation, key="k")
    def act(x, k):
        effects.add("%s %s" % (x, k))
        return {"x": x}

    with idem.disabled():
        assert act(1, "k-1") == {"x": 1}
        assert act(1, "k-1") == {"x": 1}  # runs again: nothing stored
        assert act(2, "k-1") == {"x": 2}  # no Conflict
        out = act.outcome(3, k="k-1")
        assert (out.value, out.replayed, out.recovered) == ({"x": 3}, False, False)
        with idem.disabled(False):  # back on within the block
            assert act.outcome(4, "k-2").replayed is False
            assert act.outcome(4, "k-2").replayed is True
    assert effects.lines() == ["1 k-1", "1 k-1", "2 k-1", "3 k-1", "4 k-2"]
    assert store.get(operation, "k-1") is None  # nothing was claimed
    assert act(5, "k-3") == {"x": 5} and act(5, "k-3") == {"x": 5}
    assert effects.lines()[-1] == "5 k-3" and len(effects.lines()) == 6


def test_disabled_needs_no_open_store(tmp_path, operation):
    s = idem.open("sqlite:%s/closed.db" % tmp_path)

    class Tickets:
        @s.idempotent(operation, key="k")
        def create(self, title, k):
            return title

        @s.idempotent(operation + "_async", key="k")
        async def fetch(self, k):
            return k
    s.close()
    with idem.disabled():
        t = Tickets()
        assert t.create("a", "k-1") == "a"
        assert t.create.outcome("b", "k-1").value == "b"
        assert asyncio.run(t.fetch("k-2")) == "k-2"
        assert asyncio.run(t.fetch.outcome("k-3")).value == "k-3"
    with pytest.raises(idem.Error, match="closed"):
        Tickets().create("a", "k-1")


def test_disabled_by_the_environment(tmp_path):
    code = (
        "import idem\n"
        "s = idem.open(%r)\n"
        "n = []\n"
        "@s.idempotent('op', key='k')\n"
        "def f(k):\n"
        "    n.append(k)\n"
        "    return len(n)\n"
        "print(f('a'), f('a'), s.get('op', 'a'))\n" % ("sqlite:%s/env.db" % tmp_path))
    env = dict(os.environ, IDEM_DISABLED="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["1", "2", "None"], out.stderr
    env["IDEM_DISABLED"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split()[:2] == ["1", "1"], out.stderr


def test_paths_are_pathlib_in_the_signature():
    # idem.open's annotation says so, for type checkers.
    assert "PathLike" in str(inspect.signature(idem.open).parameters["url"].annotation)
    assert isinstance(pathlib.Path("x"), os.PathLike)
