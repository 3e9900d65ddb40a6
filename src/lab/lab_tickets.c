/*
 * lab_tickets.c -- suite "tool-retries": the seven scenarios of the tool
 * retries lab, run against the real engine. The side effect is a row in a
 * `tickets` table in the store's own database, written by a local action, so
 * the ticket and the idem record commit in one transaction.
 */
#include "lab.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The lab's fixture: one approved ticket creation. */
static const char fixture_key[] = "approved-ticket-001";
static const char fixture_payload[] =
    "{\"project\": \"demo-agent\", \"title\": \"Investigate a synthetic "
    "queue backlog\", \"priority\": \"normal\"}";
static const char changed_payload[] =
    "{\"project\": \"demo-agent\", \"title\": \"Investigate a synthetic "
    "queue backlog\", \"priority\": \"urgent\"}";

enum fault { NO_FAULT, AFTER_COMMIT, BEFORE_COMMIT };

/* How a call ended, as the caller saw it. */
enum seen {
  SEEN_OK,       /* a response with a ticket id */
  SEEN_LOST,     /* committed, but the response was lost */
  SEEN_CONFLICT, /* the key was reused with another payload */
  SEEN_FAILED,   /* failed before commit */
  SEEN_ERROR     /* anything else */
};

typedef struct ticket_action {
  const char *canon; /* canonical payload */
  enum fault fault;
  char body[64];
} ticket_action;

static int create_fn(void *conn, void *ctx, idem_response *r) {
  ticket_action *a = ctx;
  long long id = 0;
  if (lab_db_insert_ticket(conn, a->canon, &id) != 0)
    return 2;
  /* The injected failure comes between the ticket and its record. */
  if (a->fault == BEFORE_COMMIT)
    return 1;
  snprintf(a->body, sizeof a->body, "{\"ticket_id\":%lld}", id);
  r->status = 201;
  r->body = a->body;
  r->body_len = strlen(a->body);
  return 0;
}

static long long body_ticket_id(const idem_response *r) {
  json_error_t e;
  json_t *v;
  long long id = -1;
  if (!r)
    return -1;
  v = json_loadb(r->body, r->body_len, 0, &e);
  if (v && json_is_integer(json_object_get(v, "ticket_id")))
    id = json_integer_value(json_object_get(v, "ticket_id"));
  json_decref(v);
  return id;
}

/*
 * One call of the tool: a new store handle (a new connection, as a new
 * request would have), the action, and the injected fault. Without a key the
 * ticket is written without idem: the naive path.
 */
static enum seen create_ticket(const char *url, const char *payload,
                               const char *key, enum fault fault,
                               long long *ticket_id) {
  idem_store *s = NULL;
  idem_call *call = NULL;
  ticket_action a;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon = NULL;
  size_t canon_len = 0;
  enum seen seen = SEEN_ERROR;
  int rc;

  *ticket_id = -1;
  memset(&a, 0, sizeof a);
  if (idem_canonicalize(payload, strlen(payload), NULL, &canon, &canon_len,
                        NULL) != IDEM_OK)
    return SEEN_ERROR;
  if (!key) {
    if (lab_db_insert_ticket_alone(url, canon, ticket_id) == 0)
      seen = fault == AFTER_COMMIT ? SEEN_LOST : SEEN_OK;
    idem_free(canon);
    return seen;
  }
  a.canon = canon;
  a.fault = fault;
  if (idem_sha256_hex(canon, canon_len, fp) != IDEM_OK ||
      idem_store_open(url, NULL, &s) != IDEM_OK)
    goto out;
  idem_id id = {"lab", "create_ticket", key};
  idem_call_options o = {0};
  o.request = canon;
  o.request_len = canon_len;
  rc = idem_execute_local(s, &id, fp, &o, create_fn, &a, &call);
  if (rc == IDEM_EREJECTED) {
    seen = SEEN_FAILED;
  } else if (rc != IDEM_OK) {
    fprintf(stderr, "idem lab: create_ticket: %s\n", idem_errmsg());
  } else if (idem_call_outcome(call) == IDEM_CONFLICT) {
    seen = SEEN_CONFLICT;
  } else if (idem_call_outcome(call) == IDEM_PROCEED ||
             idem_call_outcome(call) == IDEM_REPLAY) {
    *ticket_id = body_ticket_id(idem_call_response(call));
    /* The response is lost after the commit: the caller sees nothing. */
    seen = fault == AFTER_COMMIT ? SEEN_LOST : SEEN_OK;
  }
out:
  idem_call_free(call);
  idem_store_close(s);
  idem_free(canon);
  return seen;
}

static void naive_retry(lab *L) {
  const char *n = "naive_retry";
  char url[512];
  long long a = 0, b = 0;
  if (lab_fresh_store(L, n, url, sizeof url))
    return;
  lab_check(L, n, create_ticket(url, fixture_payload, NULL, AFTER_COMMIT,
                                &a) == SEEN_LOST,
            "first call loses its response after commit");
  lab_check(L, n, create_ticket(url, fixture_payload, NULL, NO_FAULT, &b) ==
                      SEEN_OK,
            "the retry succeeds");
  long long tickets = lab_db_count_tickets(url);
  lab_check(L, n, tickets == 2, "expected 2 tickets, saw %lld", tickets);
  lab_check(L, n, a == 1 && b == 2, "expected ticket ids 1 and 2, saw %lld "
            "and %lld", a, b);
  lab_report(L, n, json_pack("{s:i,s:I}", "attempts", 2, "tickets",
                             (json_int_t)tickets));
}

static void stable_key_retry(lab *L, const char *url) {
  const char *n = "stable_key_retry";
  long long lost = 0, first = 0, replay = 0;
  lab_check(L, n, create_ticket(url, fixture_payload, fixture_key,
                                AFTER_COMMIT, &lost) == SEEN_LOST,
            "first call commits and loses its response");
  lab_check(L, n, create_ticket(url, fixture_payload, fixture_key, NO_FAULT,
                                &first) == SEEN_OK,
            "the retry gets a response");
  lab_check(L, n, create_ticket(url, fixture_payload, fixture_key, NO_FAULT,
                                &replay) == SEEN_OK,
            "a second retry gets a response");
  lab_check(L, n, first == 1 && replay == 1,
            "expected ticket_id 1 from both retries, saw %lld and %lld",
            first, replay);
  long long tickets = lab_db_count_tickets(url);
  long long records = lab_count_records(url);
  lab_check(L, n, tickets == 1 && records == 1,
            "expected 1 ticket and 1 record, saw %lld and %lld", tickets,
            records);
  lab_report(L, n, json_pack("{s:i,s:I,s:I}", "attempts", 3, "tickets",
                             (json_int_t)tickets, "replay_ticket_id",
                             (json_int_t)replay));
}

static void changed_payload_rejected(lab *L, const char *url) {
  const char *n = "changed_payload";
  long long id = 0;
  enum seen seen = create_ticket(url, changed_payload, fixture_key, NO_FAULT,
                                 &id);
  lab_check(L, n, seen == SEEN_CONFLICT,
            "expected the changed payload to be rejected as a conflict");
  long long tickets = lab_db_count_tickets(url);
  lab_check(L, n, tickets == 1, "expected 1 ticket, saw %lld", tickets);
  lab_report(L, n, json_pack("{s:b,s:I}", "rejected", seen == SEEN_CONFLICT,
                             "tickets", (json_int_t)tickets));
}

static void failure_before_commit(lab *L) {
  const char *n = "failure_before_commit";
  char url[512];
  long long id = 0;
  if (lab_fresh_store(L, n, url, sizeof url))
    return;
  lab_check(L, n, create_ticket(url, fixture_payload, fixture_key,
                                BEFORE_COMMIT, &id) == SEEN_FAILED,
            "the injected failure before commit is reported");
  long long before = lab_db_count_tickets(url);
  long long records_before = lab_count_records(url);
  lab_check(L, n, before == 0 && records_before == 0,
            "expected 0 tickets and 0 records before the retry, saw %lld "
            "and %lld",
            before, records_before);
  lab_check(L, n, create_ticket(url, fixture_payload, fixture_key, NO_FAULT,
                                &id) == SEEN_OK && id == 1,
            "the retry creates ticket 1, saw %lld", id);
  long long after = lab_db_count_tickets(url);
  long long records = lab_count_records(url);
  lab_check(L, n, after == 1 && records == 1,
            "expected 1 ticket and 1 record after the retry, saw %lld and "
            "%lld",
            after, records);
  lab_report(L, n, json_pack("{s:I,s:I}", "tickets_before_retry",
                             (json_int_t)before, "tickets_after_retry",
                             (json_int_t)after));
}

#define CALLERS 8

typedef struct racer {
  const char *url;
  pthread_barrier_t *barrier;
  enum seen seen;
  long long id;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  pthread_barrier_wait(r->barrier);
  r->seen = create_ticket(r->url, fixture_payload, fixture_key, NO_FAULT,
                          &r->id);
  return NULL;
}

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x > y) - (x < y);
}

static void concurrent_same_key(lab *L) {
  const char *n = "concurrent_same_key";
  char url[512];
  pthread_t t[CALLERS];
  racer r[CALLERS];
  pthread_barrier_t barrier;
  long long ids[CALLERS];
  int ok = 0, nids = 0;
  if (lab_fresh_store(L, n, url, sizeof url))
    return;
  pthread_barrier_init(&barrier, NULL, CALLERS);
  for (int i = 0; i < CALLERS; i++) {
    r[i] = (racer){url, &barrier, SEEN_ERROR, -1};
    pthread_create(&t[i], NULL, race, &r[i]);
  }
  for (int i = 0; i < CALLERS; i++) {
    pthread_join(t[i], NULL);
    ok += r[i].seen == SEEN_OK;
    ids[i] = r[i].id;
  }
  pthread_barrier_destroy(&barrier);
  qsort(ids, CALLERS, sizeof ids[0], cmp_ll);
  json_t *uniq = json_array();
  for (int i = 0; i < CALLERS; i++)
    if (i == 0 || ids[i] != ids[i - 1]) {
      json_array_append_new(uniq, json_integer(ids[i]));
      nids++;
    }
  long long tickets = lab_db_count_tickets(url);
  long long records = lab_count_records(url);
  lab_check(L, n, ok == CALLERS, "expected %d responses, saw %d", CALLERS,
            ok);
  lab_check(L, n, nids == 1 && ids[0] == 1,
            "expected every caller to get ticket_id 1");
  lab_check(L, n, tickets == 1 && records == 1,
            "expected 1 ticket and 1 record, saw %lld and %lld", tickets,
            records);
  lab_report(L, n, json_pack("{s:i,s:I,s:o}", "attempts", CALLERS, "tickets",
                             (json_int_t)tickets, "returned_ticket_ids",
                             uniq));
}

static void new_key_same_payload(lab *L) {
  const char *n = "new_key_same_payload";
  char url[512];
  long long a = 0, b = 0;
  if (lab_fresh_store(L, n, url, sizeof url))
    return;
  create_ticket(url, fixture_payload, fixture_key, NO_FAULT, &a);
  create_ticket(url, fixture_payload, "approved-ticket-001-new-intent",
                NO_FAULT, &b);
  long long tickets = lab_db_count_tickets(url);
  lab_check(L, n, tickets == 2 && a == 1 && b == 2,
            "expected 2 tickets with ids 1 and 2, saw %lld tickets, ids "
            "%lld and %lld",
            tickets, a, b);
  lab_report(L, n, json_pack("{s:I}", "tickets", (json_int_t)tickets));
}

/*
 * The replay record is deleted, as retention eventually does: a short
 * retention, then `prune`. The key then acts a second time. This is the
 * documented boundary of the protection, not a failure of it.
 */
static void deleted_replay_record(lab *L) {
  const char *n = "deleted_replay_record";
  char url[512];
  idem_store *s = NULL;
  ticket_action a;
  idem_call *call = NULL;
  char *canon = NULL, fp[IDEM_FINGERPRINT_SIZE];
  size_t canon_len = 0;
  int64_t removed = 0;
  long long again = 0;
  if (lab_fresh_store(L, n, url, sizeof url))
    return;
  memset(&a, 0, sizeof a);
  idem_canonicalize(fixture_payload, strlen(fixture_payload), NULL, &canon,
                    &canon_len, NULL);
  idem_sha256_hex(canon, canon_len, fp);
  a.canon = canon;
  if (idem_store_open(url, NULL, &s) == IDEM_OK) {
    idem_id id = {"lab", "create_ticket", fixture_key};
    idem_call_options o = {0};
    o.retention_ms = 50;
    lab_check(L, n, idem_execute_local(s, &id, fp, &o, create_fn, &a,
                                       &call) == IDEM_OK,
              "the first call succeeds");
    lab_sleep_ms(120);
    /* The store also prunes now and then after a write: on a slow machine
     * its own pruning, right after this call's commit, may have found the
     * record expired already. Either way none is left (checked below). */
    lab_check(L, n,
              idem_prune(s, &removed) == IDEM_OK &&
                  (removed == 1 || (removed == 0 && lab_count_records(url) == 0)),
              "prune removes the expired record, removed %lld",
              (long long)removed);
  }
  idem_call_free(call);
  idem_store_close(s);
  idem_free(canon);
  lab_check(L, n, lab_count_records(url) == 0, "no record after pruning");
  create_ticket(url, fixture_payload, fixture_key, NO_FAULT, &again);
  long long tickets = lab_db_count_tickets(url);
  lab_check(L, n, tickets == 2 && again == 2,
            "expected a second ticket (id 2), saw %lld tickets, id %lld",
            tickets, again);
  lab_report(L, n, json_pack("{s:I}", "tickets", (json_int_t)tickets));
}

int lab_suite_tickets(lab *L) {
  char url[512];
  naive_retry(L);
  /* As in the lab, the changed payload reuses the stable-key database. */
  if (lab_fresh_store(L, "stable_key_retry", url, sizeof url) == 0) {
    stable_key_retry(L, url);
    changed_payload_rejected(L, url);
  }
  failure_before_commit(L);
  concurrent_same_key(L);
  new_key_same_payload(L);
  deleted_replay_record(L);
  return 0;
}
