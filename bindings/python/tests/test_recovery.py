"""Recovery controls (on_expired_lease, takeover_unknown, max_attempts) and
the operator's calls (Store.list/get/show/resolve/prune, python -m idem
keys), on both stores.

Every count is of the side effects file (one line per time a function
really acted); every record is read back both through the binding and,
where it matters, through the idem program, so that the binding's view is
checked against libidem's own.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

import idem
from helpers import records, unique


class Plan:
    """Whether the next runs of a _raiser's function fail (not an argument:
    the arguments are the fingerprint, the same on every retry)."""

    def __init__(self, fail=True):
        self.fail = fail


def _raiser(store, operation, effects, plan, **options):
    """A decorated function that acts (a line in effects) and then, while
    plan.fail, raises: its key is marked unknown."""
    @store.idempotent(operation, key="key", **options)
    def act(key, n=1):
        say = "fail" if plan.fail else "ok"
        effects.add("%s:%s" % (key, say))
        if plan.fail:
            raise RuntimeError("acted, then failed")
        return {"done": key}
    return act


def _state(store, operation, key):
    rec = store.get(operation, key)
    return None if rec is None else (rec.state, rec.attempt)


# --- takeover_unknown -------------------------------------------------------


def test_takeover_unknown_takes_over_a_key_marked_unknown(store, store_url, operation,
                                                           effects):
    plan = Plan()
    act = _raiser(store, operation, effects, plan)
    with pytest.raises(RuntimeError):
        act("k")
    assert _state(store, operation, "k") == ("unknown", 1)

    # The default refuses it, nothing runs; the message names the command
    # a pip user has.
    plan.fail = False
    with pytest.raises(idem.OutcomeUnknown) as err:
        act("k")
    assert "python -m idem keys resolve k --operation %s --failed" % operation \
        in str(err.value)
    assert effects.count() == 1

    taker = _raiser(store, operation, effects, plan, takeover_unknown=True)
    out = taker.outcome("k")
    assert (out.value, out.replayed, out.recovered) == ({"done": "k"}, False, True)
    assert effects.lines() == ["k:fail", "k:ok"]  # the second run acted
    assert _state(store, operation, "k") == ("completed", 2)
    # The retry replays it, still marked recovered; nothing runs.
    again = act.outcome("k")
    assert (again.value, again.replayed, again.recovered) == ({"done": "k"}, True, True)
    assert effects.count() == 2
    (rec,) = records(store_url, operation)
    assert (rec["state"], rec["attempt"], rec["recovered"]) == ("completed", 2, True)


def test_takeover_unknown_in_execute_and_execute_local(store, operation, effects):
    def fail():
        effects.add("execute")
        raise RuntimeError("acted, then failed")

    with pytest.raises(RuntimeError):
        store.execute(operation, "e", {"n": 1}, fail)
    with pytest.raises(idem.OutcomeUnknown):
        store.execute(operation, "e", {"n": 1}, fail)
    out = store.execute(operation, "e", {"n": 1}, lambda: effects.add("again") or 7,
                        takeover_unknown=True)
    assert (out.value, out.replayed, out.recovered) == (7, False, True)
    assert effects.lines() == ["execute", "again"]

    # execute_local(): its key marked unknown by an execute() that acted
    # (a function raising in execute_local() rolls back, and releases).
    with pytest.raises(RuntimeError):
        store.execute(operation, "l", {"n": 2}, fail)
    with pytest.raises(idem.OutcomeUnknown):
        store.execute_local(operation, "l", {"n": 2}, lambda tx: effects.add("local") or 1)
    out = store.execute_local(operation, "l", {"n": 2},
                              lambda tx: effects.add("local") or 8, takeover_unknown=True)
    assert (out.value, out.replayed, out.recovered) == (8, False, True)
    assert effects.lines() == ["execute", "again", "execute", "local"]


# --- max_attempts ------------------------------------------------------------


def test_max_attempts_refuses_the_takeover_past_it(store, operation, effects):
    plan = Plan()
    act = _raiser(store, operation, effects, plan, takeover_unknown=True, max_attempts=3)
    for n in (1, 2, 3):  # the first attempt, then two takeovers: each acts
        with pytest.raises(RuntimeError):
            act("k")
        assert _state(store, operation, "k") == ("unknown", n)
    assert effects.count() == 3
    # The third takeover would be attempt 4: refused, nothing runs or is written.
    plan.fail = False
    with pytest.raises(idem.OutcomeUnknown) as err:
        act("k")
    assert "python -m idem keys resolve" in str(err.value)
    assert effects.count() == 3
    assert _state(store, operation, "k") == ("unknown", 3)

    # Without the bound (the C default, 0: none), the same takeover acts.
    free = _raiser(store, operation, effects, plan, takeover_unknown=True)
    out = free.outcome("k")
    assert (out.value, out.replayed, out.recovered) == ({"done": "k"}, False, True)
    assert effects.count() == 4
    assert _state(store, operation, "k") == ("completed", 4)


def test_recovery_options_are_checked(store, operation):
    with pytest.raises(idem.InvalidArgument):
        store.idempotent(operation, key="key", on_expired_lease="ignore")
    with pytest.raises(idem.InvalidArgument):
        store.idempotent(operation, key="key", max_attempts=-1)
    with pytest.raises(TypeError):
        store.execute(operation, "k", {}, lambda: 1, max_attempts="2")


# --- on_expired_lease ---------------------------------------------------------

# A holder that claims the key with a short lease and dies holding it.
DIE_HOLDING = '''
import os, sys
import idem
url, operation, key = sys.argv[1:4]
store = idem.open(url)

@store.idempotent(operation, key="key", lease="300ms")
def act(key):
    with open(sys.argv[4], "a") as f:
        f.write("died:" + key + "\\n")
    os._exit(0)

act(key)
'''


def _expired_holder(store, store_url, operation, key, effects):
    """A record in progress whose holder died and whose lease is over."""
    subprocess.run([sys.executable, "-c", DIE_HOLDING, store_url, operation, key,
                    effects.path], check=True, timeout=60)
    rec = store.get(operation, key)
    assert (rec.state, rec.attempt) == ("in_progress", 1)
    # The lease is what this waits out: until its end, read from the record.
    while time.time() * 1000 <= rec.lease_expires_ms + 50:
        time.sleep(max(0.01, (rec.lease_expires_ms + 60) / 1000 - time.time()))
    return rec


def test_on_expired_lease_report_then_take_over(store, store_url, operation, effects):
    before = _expired_holder(store, store_url, operation, "k", effects)
    assert effects.lines() == ["died:k"]

    @store.idempotent(operation, key="key", on_expired_lease="report")
    def report(key):
        effects.add("report:" + key)
        return "reported"

    with pytest.raises(idem.OutcomeUnknown) as err:
        report("k")
    assert "python -m idem keys resolve" in str(err.value)
    assert effects.lines() == ["died:k"]  # nothing ran
    after = store.get(operation, "k")  # nothing written
    assert (after.state, after.attempt, after.updated_ms, after.lease_expires_ms) == (
        "in_progress", 1, before.updated_ms, before.lease_expires_ms)

    @store.idempotent(operation, key="key", on_expired_lease="take_over")
    def take(key):
        effects.add("take:" + key)
        return "taken"

    out = take.outcome("k")
    assert (out.value, out.replayed, out.recovered) == ("taken", False, True)
    assert effects.lines() == ["died:k", "take:k"]
    assert _state(store, operation, "k") == ("completed", 2)


def test_on_expired_lease_defaults_to_take_over_in_execute(store, store_url, operation,
                                                           effects):
    _expired_holder(store, store_url, operation, "k", effects)
    with pytest.raises(idem.OutcomeUnknown):
        store.execute(operation, "k", {}, lambda: effects.add("report"),
                      on_expired_lease="report")
    out = store.execute(operation, "k", {}, lambda: effects.add("execute") or "x")
    assert (out.value, out.replayed, out.recovered) == ("x", False, True)
    assert effects.lines() == ["died:k", "execute"]


# --- Store.list / get / show / resolve / prune ---------------------------------


def test_operator_calls_return_records(store, store_url, operation, effects):
    plan = Plan(fail=False)
    ok = _raiser(store, operation, effects, plan)
    assert ok("a") == {"done": "a"}
    plan.fail = True
    with pytest.raises(RuntimeError):
        ok("b")

    got = store.list(operation=operation)
    assert [(r.key, r.state, r.attempt) for r in got] == [("a", "completed", 1),
                                                          ("b", "unknown", 1)]
    a = got[0]
    assert isinstance(a, idem.Record)
    assert (a.tenant, a.operation, a.status, a.value, a.recovered) == (
        "", operation, 0, {"done": "a"}, False)
    assert json.loads(a.request) == {"n": 1}
    assert got[1].value is None and got[1].body is None
    # As libidem's own program reads them.
    cli = records(store_url, operation)
    assert [r.to_json() for r in got] == cli

    assert [r.key for r in store.list(operation=operation, state="unknown")] == ["b"]
    assert [r.key for r in store.list(operation=operation, limit=1)] == ["a"]
    assert store.list(operation=unique("none")) == []
    assert store.get(operation, "b").state == "unknown"
    assert store.get(operation, "missing") is None
    assert [(r.operation, r.key) for r in store.show("b", operation=operation)] == [
        (operation, "b")]

    # Resolved as failed: deleted, the next call acts.
    assert store.resolve(operation, "b", failed=True) is None
    assert store.get(operation, "b") is None
    plan.fail = False
    out = ok.outcome("b")
    assert (out.value, out.replayed, out.recovered) == ({"done": "b"}, False, False)
    assert effects.lines() == ["a:ok", "b:fail", "b:ok"]

    # Resolved as completed: the next call replays the value given.
    plan.fail = True
    with pytest.raises(RuntimeError):
        ok("c")
    store.resolve(operation, "c", completed={"done": "by hand"}, retention="1h")
    rec = store.get(operation, "c")
    assert (rec.state, rec.value, rec.status) == ("completed", {"done": "by hand"}, 0)
    # (retention= is handed to idem_resolve_with(); libidem keeps the
    # record's retention from its claim, as `idem keys resolve --retention`
    # does: not checked here.)
    out = ok.outcome("c")
    assert (out.value, out.replayed, out.recovered) == ({"done": "by hand"}, True, False)
    assert effects.count() == 4  # c ran once, before it was resolved

    with pytest.raises(idem.Error) as err:  # completed already
        store.resolve(operation, "c", failed=True)
    assert err.value.code == "IDEM_ESTATE"
    with pytest.raises(idem.Error) as err:
        store.resolve(operation, "missing", failed=True)
    assert err.value.code == "IDEM_ENOTFOUND"
    with pytest.raises(TypeError):
        store.resolve(operation, "c")  # neither completed= nor failed=True

    # prune(): a completed record past its retention (1 ms) is removed; the
    # count is of the whole store (a PostgreSQL server shared with other
    # tests may hold more).
    assert store.execute(operation, "short", {}, lambda: "kept 1 ms", retention=0.001).value \
        == "kept 1 ms"
    deadline = time.monotonic() + 30
    while store.get(operation, "short") is not None:  # its retention is what this waits out
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert [r.key for r in store.list(operation=operation, expired=True)] == ["a", "b", "c",
                                                                              "short"]
    assert store.prune() >= 1
    assert [r.key for r in store.list(operation=operation, expired=True)] == ["a", "b", "c"]


def test_resolve_refuses_a_running_holder_unless_forced(store, operation, effects):
    import threading
    entered, release = threading.Event(), threading.Event()

    @store.idempotent(operation, key="key")
    def slow(key):
        entered.set()
        release.wait(60)
        effects.add("slow")
        return "slow"

    t = threading.Thread(target=lambda: pytest.raises(idem.LeaseLost, slow, "k"))
    t.start()
    try:
        assert entered.wait(60)
        with pytest.raises(idem.Error) as err:
            store.resolve(operation, "k", completed="forced")
        assert err.value.code == "IDEM_ESTATE"
        store.resolve(operation, "k", completed="forced", force=True)
    finally:
        release.set()
        t.join(60)
    assert effects.lines() == ["slow"]
    assert store.get(operation, "k").value == "forced"


# --- python -m idem keys -------------------------------------------------------


def _py_keys(url, *args, stdin=None, env_store=False):
    env = dict(os.environ)
    if env_store:
        env["IDEM_STORE"] = url
    else:
        args = args + ("--store", url)
    return subprocess.run([sys.executable, "-m", "idem", "keys", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)


def test_python_m_idem_keys_resolves_as_failed_and_completed(store, store_url, operation,
                                                             effects, tmp_path):
    plan = Plan()
    act = _raiser(store, operation, effects, plan)
    c = unique("c")  # found without --operation, also on a shared server
    for key in ("f", c):
        with pytest.raises(RuntimeError):
            act(key)
    plan.fail = False

    listed = _py_keys(store_url, "list", "--operation", operation, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line) for line in listed.stdout.splitlines()] == \
        records(store_url, operation)
    text = _py_keys(store_url, "list", "--operation", operation, "--state", "unknown")
    assert text.returncode == 0, text.stderr
    assert [line.split()[2] for line in text.stdout.splitlines()] == ["KEY", "f", c]

    done = _py_keys(store_url, "resolve", "f", "--operation", operation, "--failed")
    assert done.returncode == 0, done.stderr
    assert store.get(operation, "f") is None
    out = act.outcome("f")
    assert (out.value, out.replayed) == ({"done": "f"}, False)
    assert effects.lines() == ["f:fail", c + ":fail", "f:ok"]

    body = tmp_path / "body.json"
    body.write_text('{"done": "settled"}\n')
    # IDEM_STORE names the store; without --operation the key is found.
    done = _py_keys(store_url, "resolve", c, "--completed", "--body", str(body),
                    env_store=True)
    assert done.returncode == 0, done.stderr
    out = act.outcome(c)
    assert (out.value, out.replayed, out.recovered) == ({"done": "settled"}, True, False)
    assert effects.count() == 3

    shown = _py_keys(store_url, "show", c, "--operation", operation, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["response"]["body"] == '{"done": "settled"}\n'
    assert json.loads(shown.stdout)["state"] == "completed"

    gone = _py_keys(store_url, "delete", c, "--operation", operation)
    assert gone.returncode == 0, gone.stderr
    assert store.get(operation, c) is None
    missing = _py_keys(store_url, "show", c, "--operation", operation)
    assert missing.returncode == 1 and "no record" in missing.stderr
    pruned = _py_keys(store_url, "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert re.fullmatch(r"pruned \d+ expired completed records\n", pruned.stdout)
    usage = _py_keys(store_url, "resolve", c, "--operation", operation)
    assert usage.returncode == 2


def test_the_refusal_names_the_command_with_the_tenant(store, store_url, operation, effects,
                                                       tmp_path):
    @store.idempotent(operation, key="key", tenant="team-a")
    def act(key):
        effects.add(key)
        raise RuntimeError("acted, then failed")

    with pytest.raises(RuntimeError):
        act("k")
    with pytest.raises(idem.OutcomeUnknown) as err:
        act("k")
    command = "python -m idem keys resolve k --operation %s --tenant team-a --failed" \
        % operation
    assert command in str(err.value)
    # The command it names works as named.
    done = _py_keys(store_url, *command.split()[4:])
    assert done.returncode == 0, done.stderr
    assert store.get(operation, "k", tenant="team-a") is None
    with pytest.raises(RuntimeError):
        act("k")  # acts again
    assert effects.lines() == ["k", "k"]
