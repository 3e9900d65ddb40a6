"""The project's two seeds (the tool retries lab and the account credit
example; `idem lab` runs them in C), written against the binding, with
their own counts and identifiers.

Each scenario checks what was done (rows in the user's tables, records in
the store, read apart from the binding) and what the caller was told (the
returned ticket id or account result): a successful retry that returns the
wrong resource fails as surely as a duplicate row.
"""
import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import idem
from helpers import (TICKET, TICKET_KEY, InjectedFailure, ResponseLost,
                     UnknownAccount, create_ticket, credit,
                     credit_then_lose_response, delete_record, records, unique)

SPAWN = multiprocessing.get_context("spawn")


def race(store_url, callers, call):
    """Runs call(store) in `callers` threads at once, each on a store handle
    of its own (the seeds' separate connections); returns their results."""
    stores = [idem.open(store_url) for _ in range(callers)]
    barrier = threading.Barrier(callers, timeout=30)

    def one(s):
        barrier.wait()
        return call(s)

    try:
        with ThreadPoolExecutor(max_workers=callers) as pool:
            return [f.result(timeout=60) for f in [pool.submit(one, s) for s in stores]]
    finally:
        for s in stores:
            s.close()


# --- The tool retries lab: seven scenarios -----------------------------------


@pytest.fixture
def tickets(db):
    return db.tickets_table()


def test_naive_retry_without_a_stable_key_creates_two_tickets(store, db, tickets, operation):
    # A caller without a stable key makes up a new one for each attempt.
    with pytest.raises(ResponseLost):
        create_ticket(store, db, tickets, operation, unique("attempt"), TICKET,
                      fault="after_commit")
    retry = create_ticket(store, db, tickets, operation, unique("attempt"), TICKET)

    assert retry.value == {"ticket_id": 2}
    assert retry.replayed is False
    assert db.count(tickets) == 2


def test_stable_key_retry_replays_the_first_ticket(store, store_url, db, tickets, operation):
    with pytest.raises(ResponseLost):
        create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET, fault="after_commit")
    first = create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)
    replay = create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)

    assert first.value == replay.value == {"ticket_id": 1}
    assert (first.replayed, replay.replayed) == (True, True)
    assert (first.recovered, replay.recovered) == (False, False)
    assert db.count(tickets) == 1
    assert [r["state"] for r in records(store_url, operation)] == ["completed"]


def test_changed_payload_is_rejected_before_any_write(store, store_url, db, tickets, operation):
    create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)

    with pytest.raises(idem.Conflict):
        create_ticket(store, db, tickets, operation, TICKET_KEY, {**TICKET, "priority": "urgent"})

    assert db.count(tickets) == 1
    assert len(records(store_url, operation)) == 1
    # The record still answers for the original request.
    assert create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET).value == {"ticket_id": 1}


def test_failure_before_commit_leaves_nothing_and_the_retry_acts(store, store_url, db, tickets,
                                                                 operation):
    with pytest.raises(InjectedFailure):
        create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET, fault="before_commit")
    assert db.count(tickets) == 0
    assert records(store_url, operation) == []

    retry = create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)

    assert retry.replayed is False
    assert db.count(tickets) == 1
    assert len(records(store_url, operation)) == 1
    # The id returned is the row that exists (PostgreSQL's sequence does not
    # roll back, so it need not be 1 there).
    assert db.rows("SELECT id FROM %s" % tickets) == [(retry.value["ticket_id"],)]


def test_eight_concurrent_callers_with_one_key_make_one_ticket(store_url, db, tickets, operation):
    outs = race(store_url, 8, lambda s: create_ticket(s, db, tickets, operation, TICKET_KEY,
                                                      TICKET, wait="30s"))

    assert sorted({o.value["ticket_id"] for o in outs}) == [1]
    assert [o.replayed for o in outs].count(False) == 1
    assert db.count(tickets) == 1
    assert len(records(store_url, operation)) == 1


def test_new_key_with_the_same_payload_is_a_second_ticket(store, store_url, db, tickets,
                                                          operation):
    first = create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)
    second = create_ticket(store, db, tickets, operation, TICKET_KEY + "-new-intent", TICKET)

    assert (first.value, second.value) == ({"ticket_id": 1}, {"ticket_id": 2})
    assert (first.replayed, second.replayed) == (False, False)
    assert db.count(tickets) == 2
    assert len(records(store_url, operation)) == 2


def test_deleted_replay_record_ends_the_protection(store, store_url, db, tickets, operation):
    first = create_ticket(store, db, tickets, operation, TICKET_KEY, TICKET)
    delete_record(store_url, operation, TICKET_KEY)
    assert records(store_url, operation) == []

    # The retry comes from another handle: one that replayed the record may
    # still answer from its replay cache (idem_delete() in include/idem.h).
    with idem.open(store_url) as other:
        retry = create_ticket(other, db, tickets, operation, TICKET_KEY, TICKET)

    assert first.value == {"ticket_id": 1}
    assert retry.value == {"ticket_id": 2}
    assert retry.replayed is False
    assert db.count(tickets) == 2
    assert len(records(store_url, operation)) == 1


# --- The account credit example: six tests -----------------------------------

RESULT_5 = {"account": "account-1", "balance": 5, "version": 1}


@pytest.fixture
def ledger(db):
    return db.accounts_tables("alpha", "beta")


def test_writer_exits_after_commit_and_the_retry_recovers_its_result(store, store_url, ledger,
                                                                     operation):
    writer = SPAWN.Process(target=credit_then_lose_response,
                           args=(store_url, ledger, operation, "credit-001"))
    writer.start()
    writer.join(60)
    assert writer.exitcode == 0
    assert ledger.balance("alpha") == 5  # committed; the caller never heard

    retry = credit(store, ledger, operation, "credit-001", 5)

    assert retry.value == RESULT_5
    assert retry.replayed is True
    assert ledger.balance("alpha") == 5
    assert ledger.balance("beta") == 0
    assert ledger.mutation_count() == 1
    assert len(records(store_url, operation)) == 1


def test_sixteen_concurrent_duplicates_make_one_mutation(store_url, ledger, operation):
    outs = race(store_url, 16, lambda s: credit(s, ledger, operation, "credit-001", 5,
                                                wait="30s"))

    assert [o.value for o in outs] == [RESULT_5] * 16
    assert [o.replayed for o in outs].count(False) == 1
    assert ledger.balance("alpha") == 5
    assert ledger.mutation_count() == 1
    assert len(records(store_url, operation)) == 1


def test_conflicting_payload_is_rejected_and_the_balance_unchanged(store, store_url, ledger,
                                                                   operation):
    first = credit(store, ledger, operation, "credit-001", 5)

    with pytest.raises(idem.Conflict):
        credit(store, ledger, operation, "credit-001", 8)

    assert first.value == RESULT_5
    assert ledger.balance("alpha") == 5
    assert ledger.mutation_count() == 1
    assert len(records(store_url, operation)) == 1


def test_tenant_scope_lets_two_tenants_use_one_key(store, store_url, ledger, operation):
    alpha = credit(store, ledger, operation, "credit-001", 5, tenant="alpha")
    beta = credit(store, ledger, operation, "credit-001", 7, tenant="beta")

    assert alpha.value == RESULT_5
    assert beta.value == {"account": "account-1", "balance": 7, "version": 1}
    assert (alpha.replayed, beta.replayed) == (False, False)
    assert (ledger.balance("alpha"), ledger.balance("beta")) == (5, 7)
    assert ledger.mutation_count() == 2
    assert sorted(r["tenant"] for r in records(store_url, operation)) == ["alpha", "beta"]
    # Each tenant's retry replays its own result.
    assert credit(store, ledger, operation, "credit-001", 7, tenant="beta").value == beta.value


def test_rejected_account_leaves_no_operation_or_mutation(store, store_url, ledger, operation):
    with pytest.raises(UnknownAccount):
        credit(store, ledger, operation, "credit-001", 5, account="account-404")

    assert records(store_url, operation) == []
    assert ledger.mutation_count() == 0
    assert ledger.balance("alpha") == 0
    # The key was released: it can still name a valid request.
    assert credit(store, ledger, operation, "credit-001", 5).value == RESULT_5


def test_new_intent_is_a_distinct_second_mutation(store, store_url, ledger, operation):
    first = credit(store, ledger, operation, "credit-001", 5)
    second = credit(store, ledger, operation, "credit-002", 5)

    assert first.value == RESULT_5
    assert second.value == {"account": "account-1", "balance": 10, "version": 2}
    assert second.replayed is False
    assert ledger.balance("alpha") == 10
    assert ledger.mutation_count() == 2
    assert len(records(store_url, operation)) == 2
