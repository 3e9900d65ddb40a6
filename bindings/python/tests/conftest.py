"""Fixtures: every test runs on both stores.

SQLite: a fresh file in the test's tmp_path. PostgreSQL: the server named by
IDEM_TEST_PG_URL (scripts/pg.sh starts a throwaway one). Tests on it share
one server, so each names its operations and tables uniquely
(helpers.unique). Without IDEM_TEST_PG_URL the PostgreSQL cases fail,
unless IDEM_TEST_PG_OPTIONAL=1 says that skipping them is fine.
"""
import os

import pytest

try:
    import idem
except ImportError as e:
    raise ImportError(
        "cannot import the built idem package (%s): build it with `python3 "
        "bindings/python/_backend/idem_backend.py inplace --out DIR`, run with "
        "PYTHONPATH=DIR, and not from bindings/python itself, whose source "
        "folder idem/ (without its compiled _native) would shadow DIR/idem" % e) from e
from helpers import Database, Effects, unique

BACKENDS = ["sqlite", "postgresql"]


def pg_url():
    """The PostgreSQL server's URL, or a failure (a skip when optional)."""
    url = os.environ.get("IDEM_TEST_PG_URL")
    if url:
        return url
    if os.environ.get("IDEM_TEST_PG_OPTIONAL") == "1":
        pytest.skip("IDEM_TEST_PG_URL is unset and IDEM_TEST_PG_OPTIONAL=1")
    pytest.fail("IDEM_TEST_PG_URL is unset: start a server with "
                "`. scripts/pg.sh && pg_start`, or set IDEM_TEST_PG_OPTIONAL=1 "
                "to skip the PostgreSQL cases", pytrace=False)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture
def store_url(backend, tmp_path):
    if backend == "sqlite":
        return "sqlite:%s/idem.db" % tmp_path
    return pg_url()


@pytest.fixture
def store(store_url):
    s = idem.open(store_url)
    yield s
    s.close()


@pytest.fixture
def db(backend, store_url, store):
    """The user's tables beside the store (created after the store, so the
    SQLite file is the store's)."""
    d = Database(backend, store_url)
    yield d
    d.drop_tables()


@pytest.fixture(autouse=True)
def spares_kept_clean():
    """After every test, no spare claim holds a call: a call made whole in
    C leaves one there only until Python has read it, and the next call
    would overwrite it (a leak, or a result read from another call)."""
    yield
    from idem import _store
    assert [p for p in _store._SPARES if p[0].call != _store.ffi.NULL] == []


@pytest.fixture
def operation():
    """An operation name of this test alone."""
    return unique("op")


@pytest.fixture
def effects(tmp_path):
    return Effects(tmp_path / "effects")
