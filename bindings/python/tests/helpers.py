"""What the tests share: unique names, the user's own tables, the idem CLI's
view of the records, a file of side effects, and the seeds' two tools.

This is a module of its own (not conftest.py) because the child processes
of the race and crash tests import it: multiprocessing's "spawn" start
method imports a target function by its module's name, and a store handle
must never cross fork().
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import uuid
from contextlib import closing
from pathlib import Path

import idem

TREE = Path(__file__).resolve().parents[3]

# The lab seed's fixture.json: one approved ticket creation.
TICKET_KEY = "approved-ticket-001"
TICKET = {
    "project": "demo-agent",
    "title": "Investigate a synthetic queue backlog",
    "priority": "normal",
}


def unique(prefix):
    """A name no other test uses, also on a PostgreSQL server they share."""
    return "%s_%s" % (prefix, uuid.uuid4().hex[:12])


# --- The records, as an operator sees them ----------------------------------


def idem_cli():
    """The idem program: IDEM_BIN (as tests/python/binding.sh sets it), else
    the tree's build/idem."""
    path = os.environ.get("IDEM_BIN") or str(TREE / "build" / "idem")
    if not os.access(path, os.X_OK):
        raise AssertionError(
            "the idem program is needed to read and delete records: %s is "
            "not there (build the tree, or set IDEM_BIN)" % path)
    return path


def _keys(url, *args):
    done = subprocess.run([idem_cli(), "keys", *args, "--store", url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, "idem keys %s: %s" % (" ".join(args), done.stderr)
    return done.stdout


def records(url, operation, tenant=None):
    """Every record of one operation (of one tenant), as `idem keys list
    --json` prints them: dicts with key, tenant, state, attempt, recovered,
    response."""
    args = ["list", "--operation", operation, "--json"]
    if tenant is not None:
        args += ["--tenant", tenant]
    return [json.loads(line) for line in _keys(url, *args).splitlines() if line]


def resolve_completed(url, operation, key, body_file, tenant=None):
    """An operator's settling of a key marked unknown: it completed, with
    the body in body_file (`idem keys resolve --completed --body`)."""
    args = ["resolve", key, "--operation", operation, "--completed", "--body", str(body_file)]
    if tenant is not None:
        args += ["--tenant", tenant]
    _keys(url, *args)


def delete_record(url, operation, key, tenant=None):
    """What retention does to a record, done now by an operator."""
    args = ["delete", key, "--operation", operation]
    if tenant is not None:
        args += ["--tenant", tenant]
    _keys(url, *args)


# --- The user's own tables ---------------------------------------------------


def _psql():
    found = shutil.which("psql")
    if found:
        return found
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin/psql")):
        return path
    raise AssertionError("psql is needed to read the PostgreSQL test tables")


class Database:
    """The tables a tool writes, beside the store's own: in the store's
    SQLite file, or on its PostgreSQL server (public schema). The tests read
    them over a connection of their own, never through the binding, so that
    a count is evidence of what the binding did.

    SQL is written in SQLite's parameter style; sql() turns each ? into $1,
    $2, ... for PostgreSQL, the style tx.execute() takes there.
    """

    def __init__(self, backend, url):
        self.backend = backend
        self.url = url
        self.tables = []

    @property
    def path(self):
        return self.url[len("sqlite:"):]

    @property
    def id_column(self):
        """An integer primary key numbered 1, 2, ... in a fresh table."""
        if self.backend == "sqlite":
            return "id INTEGER PRIMARY KEY"
        return "id BIGSERIAL PRIMARY KEY"

    def sql(self, text):
        if self.backend == "sqlite":
            return text
        parts = text.split("?")
        out = parts[0]
        for n, part in enumerate(parts[1:], start=1):
            out += "$%d%s" % (n, part)
        return out

    def run(self, sql, params=()):
        """Runs one statement in a transaction of its own."""
        if self.backend == "sqlite":
            with closing(sqlite3.connect(self.path, timeout=30)) as db:
                db.execute(sql, params)
                db.commit()
            return
        assert not params, "psql runs statements without parameters"
        done = subprocess.run(
            [_psql(), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-d", self.url, "-c", sql],
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, "psql: %s: %s" % (sql, done.stderr)
        return done.stdout

    def rows(self, sql):
        """The rows of a query whose columns are all integers."""
        if self.backend == "sqlite":
            with closing(sqlite3.connect(self.path, timeout=30)) as db:
                return [tuple(row) for row in db.execute(sql).fetchall()]
        out = self.run(sql)
        return [tuple(int(v) for v in line.split("|"))
                for line in out.splitlines() if line]

    def scalar(self, sql):
        (row,) = self.rows(sql)
        return row[0]

    def count(self, table, where="TRUE"):
        return self.scalar("SELECT COUNT(*) FROM %s WHERE %s" % (table, where))

    def create_table(self, prefix, columns):
        """A new table with a unique name; dropped at teardown."""
        name = unique(prefix)
        self.run("CREATE TABLE %s (%s)" % (name, columns))
        self.tables.append(name)
        return name

    def drop_tables(self):
        for name in self.tables:
            self.run("DROP TABLE IF EXISTS %s" % name)
        self.tables = []

    # The seeds' tables.

    def tickets_table(self):
        return self.create_table("tickets", self.id_column + ", payload TEXT NOT NULL")

    def accounts_tables(self, *tenants):
        """The example seed's accounts (account-1 of each tenant, balance 0,
        version 0) and a row per applied credit."""
        accounts = self.create_table(
            "accounts", "tenant TEXT NOT NULL, account TEXT NOT NULL, "
            "balance INTEGER NOT NULL, version INTEGER NOT NULL, "
            "PRIMARY KEY (tenant, account)")
        for tenant in tenants:
            self.run("INSERT INTO %s VALUES ('%s', 'account-1', 0, 0)" % (accounts, tenant))
        mutations = self.create_table(
            "mutations", self.id_column + ", tenant TEXT NOT NULL, "
            "account TEXT NOT NULL, amount INTEGER NOT NULL")
        return Accounts(self, accounts, mutations)


class Accounts:
    """The example seed's ledger: balances, and one row per credit applied."""

    def __init__(self, db, table, mutations):
        self.db = db
        self.table = table
        self.mutations = mutations

    def balance(self, tenant):
        return self.db.scalar("SELECT balance FROM %s WHERE tenant = '%s' AND "
                              "account = 'account-1'" % (self.table, tenant))

    def mutation_count(self):
        return self.db.count(self.mutations)


# --- Side effects that outlive a process -------------------------------------


class Effects:
    """A file with one line per time a function really acted. Lines are
    appended with O_APPEND, so threads and processes never lose one."""

    def __init__(self, path):
        self.path = str(path)

    def add(self, line):
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def lines(self):
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def count(self):
        return len(self.lines())


# --- The seeds' tools, on the binding -----------------------------------------


class InjectedFailure(RuntimeError):
    """The lab's failure before commit."""


class ResponseLost(TimeoutError):
    """The lab's failure after commit: the tool acted, its answer is gone."""


def create_ticket(store, db, tickets, operation, key, payload, fault=None, **options):
    """The lab's create_ticket: the ticket row and the replay record commit
    in one transaction. fault="before_commit" fails inside it;
    fault="after_commit" loses the response once both are committed.
    Returns the idem.Outcome."""
    def insert(tx):
        cur = tx.execute(db.sql("INSERT INTO %s (payload) VALUES (?) RETURNING id" % tickets),
                         (json.dumps(payload, sort_keys=True),))
        ticket_id = cur.fetchone()[0]
        if fault == "before_commit":
            raise InjectedFailure("injected failure before commit")
        return {"ticket_id": ticket_id}

    out = store.execute_local(operation, key, payload, insert, **options)
    if fault == "after_commit":
        raise ResponseLost("server committed; response lost")
    return out


class UnknownAccount(ValueError):
    """The example seed's rejected account: nothing may be left behind."""


def credit(store, ledger, operation, key, amount, tenant="alpha",
           account="account-1", **options):
    """The example seed's credit: the balance, the mutation row and the
    operation record commit together. Returns the idem.Outcome."""
    db = ledger.db

    def apply(tx):
        cur = tx.execute(db.sql("UPDATE %s SET balance = balance + ?, version = version + 1 "
                                "WHERE tenant = ? AND account = ?" % ledger.table),
                         (amount, tenant, account))
        if cur.rowcount != 1:
            raise UnknownAccount("no account %r for tenant %r" % (account, tenant))
        tx.execute(db.sql("INSERT INTO %s (tenant, account, amount) VALUES (?, ?, ?)"
                          % ledger.mutations), (tenant, account, amount))
        balance, version = tx.execute(
            db.sql("SELECT balance, version FROM %s WHERE tenant = ? AND account = ?"
                   % ledger.table), (tenant, account)).fetchone()
        return {"account": account, "balance": balance, "version": version}

    request = {"account": account, "amount": amount}
    return store.execute_local(operation, key, request, apply, tenant=tenant, **options)


# --- Child processes (multiprocessing, "spawn") ------------------------------


def credit_then_lose_response(url, ledger, operation, key):
    """The example seed's writer: commits the credit, then the process ends
    without handing the result to anyone."""
    store = idem.open(url)
    credit(store, ledger, operation, key, 5)
    os._exit(0)


def race_in_process(url, operation, key, effects_path, barrier, results):
    """One of several processes calling one decorated function with one key
    at the same moment; puts (value, replayed) on results."""
    effects = Effects(effects_path)
    with idem.open(url) as store:
        @store.idempotent(operation, key="request_id", wait="30s")
        def create_ticket(project, title, request_id):
            effects.add("pid %d" % os.getpid())
            return {"ticket": uuid.uuid4().hex, "pid": os.getpid()}

        barrier.wait()
        out = create_ticket.outcome(TICKET["project"], TICKET["title"], request_id=key)
        results.put((out.value, out.replayed, out.recovered))


def act_then_hang(url, operation, key, effects_path, conn):
    """A holder that acts, says so on conn, and then hangs inside the
    function (until it is killed); its lease is 1 s, renewed while it
    lives."""
    effects = Effects(effects_path)
    store = idem.open(url)

    @store.idempotent(operation, key="request_id", lease="1s")
    def create_ticket(title, request_id):
        effects.add("pid %d" % os.getpid())
        conn.send("acting")
        conn.recv()  # nothing is ever sent: the test kills this process

    create_ticket(TICKET["title"], request_id=key)


# --- A pool's workers that open a store of their own (test_fork.py) ----------

_worker_store = None


def worker_open(url):
    """A pool's initializer: the worker's own store."""
    global _worker_store
    _worker_store = idem.open(url, busy_timeout="5s")


def worker_claim(operation, n):
    """One claim in a worker: its value, or the code of the error raised."""
    try:
        return _worker_store.execute(operation, "w-%d" % n, {"n": n}, lambda: n).value
    except idem.Error as e:
        return e.code
