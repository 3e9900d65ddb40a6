"""Types: mypy --strict on the package itself, and on a typed program that
uses it: a decorated function keeps its signature and return type (sync
and async, f.outcome() an Outcome of it), so that a wrong use is an error.

Runs Debian's mypy (python3-mypy) on the package as built; without it the
tests fail, unless IDEM_TEST_MYPY_OPTIONAL=1 says that skipping is fine.
"""
import os
import subprocess
import sys
import textwrap

import pytest

import idem

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(idem.__file__)))


def mypy(tmp_path, *args):
    """mypy --strict's exit code and output, the package found as built."""
    try:
        import mypy  # noqa: F401 - is it installed?
    except ImportError:
        if os.environ.get("IDEM_TEST_MYPY_OPTIONAL") == "1":
            pytest.skip("mypy is not installed and IDEM_TEST_MYPY_OPTIONAL=1")
        pytest.fail("mypy is not installed for %s (Debian: apt-get install python3-mypy)"
                    % sys.executable, pytrace=False)
    env = dict(os.environ, MYPYPATH=PKG_PARENT)
    run = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--cache-dir", str(tmp_path / "mypy-cache"),
                          "--show-error-codes", *args], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=300)
    return run.returncode, run.stdout + run.stderr


def test_the_package_is_mypy_strict_clean(tmp_path):
    # 49 errors before (28 with a newer mypy), among them idem._native and
    # idem._speedups without types (now _native.pyi and _speedups.pyi).
    rc, out = mypy(tmp_path, "-p", "idem")
    assert rc == 0, out
    assert "Success: no issues found" in out


PROGRAM = '''
import asyncio
import sqlite3
from dataclasses import dataclass
from typing import Dict

import idem

store = idem.open("sqlite:typed.db")


@dataclass
class Ticket:
    ticket_id: int


@store.idempotent("create_ticket", key="request_id")
def create_ticket(title: str, request_id: str) -> Ticket:
    return Ticket(1)


@store.idempotent("fetch", key="request_id")
async def fetch(url: str, request_id: str) -> Dict[str, int]:
    return {"status": 200}


@store.idempotent("place_order", key="request_id", conn="db")
def place_order(db: sqlite3.Connection, item: str, request_id: str) -> int:
    return 1


class Tickets:
    @store.idempotent("close_ticket", key="request_id")
    def close(self, ticket_id: int, request_id: str) -> bool:
        return True


async def main() -> None:
    reveal_type(await fetch("u", request_id="r"))
    reveal_type((await fetch.outcome("u", request_id="r")).value)


reveal_type(create_ticket("t", request_id="r"))
reveal_type(create_ticket.outcome("t", request_id="r"))
reveal_type(create_ticket.outcome("t", request_id="r").value.ticket_id)
reveal_type(create_ticket.outcome("t", request_id="r").replayed)
reveal_type(Tickets().close(1, request_id="r"))
reveal_type(place_order(sqlite3.connect("typed.db"), "book", request_id="r"))
'''

WRONG = '''
n: int = create_ticket("t", request_id="r")
create_ticket(1, request_id="r")
create_ticket("t")
s: str = create_ticket.outcome("t", request_id="r").value
'''


def test_a_decorated_function_keeps_its_types(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    rc, out = mypy(tmp_path, "prog.py")
    revealed = [line.split("Revealed type is ", 1)[1] for line in out.splitlines()
                if "Revealed type is" in line]
    assert revealed == [
        '"builtins.dict[builtins.str, builtins.int]"',
        '"builtins.dict[builtins.str, builtins.int]"',
        '"prog.Ticket"',
        '"idem._store.Outcome[prog.Ticket]"',
        '"builtins.int"',
        '"builtins.bool"',
        '"builtins.bool"',
        '"builtins.int"',
    ], out
    assert "error:" not in out, out  # notes only
    assert rc in (0, 1), out  # a newer mypy exits 1 for reveal_type's notes


def test_a_wrong_use_is_an_error(tmp_path):
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM) + textwrap.dedent(WRONG))
    rc, out = mypy(tmp_path, "prog.py")
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert rc == 1
    assert len(errors) == 4, out
    assert 'expression has type "Ticket", variable has type "int"' in errors[0]
    assert 'incompatible type "int"; expected "str"' in errors[1]
    assert 'Missing named argument "request_id"' in errors[2] or \
        "Missing positional argument" in errors[2], errors[2]
    assert 'expression has type "Ticket", variable has type "str"' in errors[3]


def test_outcome_is_generic_at_run_time():
    assert idem.Outcome[int] is not None  # subscripted in annotations evaluated at run time
    o = idem.Outcome(1, False, True)
    assert (o.value, o.replayed, o.recovered) == (1, False, True)
    assert o == idem.Outcome(1, False, True)
    import pickle
    assert pickle.loads(pickle.dumps(o)) == o
