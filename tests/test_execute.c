/*
 * test_execute.c -- idem_execute(), the one call for remote actions: the
 * outcomes, the three endings the action chooses, the lease renewed while
 * it runs, a lease lost to a takeover, a response too large to keep, a
 * completion retried while the store is busy, fingerprints of a chosen
 * part of the request, what the call says after an ending that failed,
 * and whether the action ran (idem_execute_options.ran). The action's
 * side effect is a counter and a ticket number, and the tests check both.
 * One suite for every backend.
 */
#include "engine_harness.c"

#include <poll.h>

#define REQ "{\"title\":\"Queue backlog\",\"priority\":\"normal\",\"n\":1.50}"
#define REQ_REORDERED                                                          \
  "{ \"n\": 1.5, \"priority\": \"normal\",\n  \"title\": \"Queue backlog\" }"
#define REQ_OTHER                                                              \
  "{\"title\":\"Queue backlog\",\"priority\":\"urgent\",\"n\":1.5}"

typedef struct remote {
  int runs;        /* how many times the action ran */
  int next_ticket; /* the remote system's counter */
  int run_ms;      /* how long one run takes */
  idem_exec_result answer;
  int wait_for_loss; /* run until the lease is lost (bounded) */
  int saw_loss;
  int outcome, attempt;
  char body[64];
  size_t big; /* a body of this many bytes instead */
  char *big_body;
} remote;

static idem_exec_result remote_action(idem_exec *x, void *ctx,
                                      idem_response *r) {
  remote *a = ctx;
  a->runs++;
  a->outcome = idem_exec_outcome(x);
  a->attempt = idem_exec_attempt(x);
  if (a->wait_for_loss) {
    struct pollfd p = {idem_exec_lost_fd(x), POLLIN, 0};
    a->saw_loss = poll(&p, 1, 10000) == 1 && idem_exec_lost(x);
    return IDEM_EXEC_UNKNOWN;
  }
  if (a->run_ms)
    sleep_ms(a->run_ms);
  if (a->answer != IDEM_EXEC_DONE)
    return a->answer;
  a->next_ticket++;
  r->status = 201;
  if (a->big) {
    a->big_body = malloc(a->big);
    memset(a->big_body, 'x', a->big);
    r->body = a->big_body;
    r->body_len = a->big;
    return IDEM_EXEC_DONE;
  }
  snprintf(a->body, sizeof a->body, "{\"ticket_id\":%d}", a->next_ticket);
  r->meta = TICKET_META;
  r->meta_len = strlen(TICKET_META);
  r->body = a->body;
  r->body_len = strlen(a->body);
  return IDEM_EXEC_DONE;
}

static idem_call *execute_expect(idem_store *s, const idem_id *id,
                                 const char *req, remote *a,
                                 const idem_execute_options *o, int want_rc,
                                 int want_outcome, int line) {
  idem_call *c = NULL;
  int rc = idem_execute(s, id, req, strlen(req), remote_action, a, o, &c);
  if (rc != want_rc) {
    print_error("line %d: idem_execute returned %s (%s), expected %s\n", line,
                idem_rc_name(rc), idem_errmsg(), idem_rc_name(want_rc));
    fail();
  }
  if (want_outcome) {
    assert_non_null(c);
    if ((int)idem_call_outcome(c) != want_outcome) {
      print_error("line %d: outcome %s, expected %s\n", line,
                  idem_outcome_name(idem_call_outcome(c)),
                  idem_outcome_name(want_outcome));
      fail();
    }
  }
  return c;
}

#define EXECUTE(s, id, req, a, o, rc, outcome)                                 \
  execute_expect((s), (id), (req), (a), (o), (rc), (outcome), __LINE__)

static void test_execute_outcomes(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, KEY};
  remote a = {0};
  idem_record *rec;
  idem_call *c;
  char *canon = NULL;
  size_t canon_len;

  c = EXECUTE(f->store, &id, REQ, &a, NULL, IDEM_OK, IDEM_PROCEED);
  assert_int_equal(a.runs, 1);
  assert_int_equal(a.outcome, IDEM_PROCEED);
  assert_int_equal(a.attempt, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  assert_int_equal(idem_call_lease_expires_ms(c), 0);
  idem_call_free(c);
  /* The record keeps the canonical request the fingerprint was made of. */
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  EXPECT_RC(IDEM_OK, idem_canonicalize(REQ, strlen(REQ), NULL, &canon,
                                       &canon_len, NULL));
  assert_int_equal(rec->request_len, canon_len);
  assert_memory_equal(rec->request, canon, canon_len);
  idem_free(canon);
  idem_record_free(rec);

  /* The same request written otherwise replays; the action does not run. */
  c = EXECUTE(f->store, &id, REQ_REORDERED, &a, NULL, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = EXECUTE(f->store, &id, REQ_OTHER, &a, NULL, IDEM_OK, IDEM_CONFLICT);
  assert_null(idem_call_response(c));
  idem_call_free(c);
  assert_int_equal(a.runs, 1);
  assert_int_equal(a.next_ticket, 1);

  /* Malformed JSON is refused before anything is claimed. */
  c = EXECUTE(f->store, &id, "{\"a\":", &a, NULL, IDEM_EJSON, 0);
  assert_null(c);
  assert_int_equal(a.runs, 1);
}

static void test_execute_endings(void **state) {
  fixture *f = *state;
  idem_id failed = {"tenant-a", OPERATION, "failed-before-acting"};
  idem_id unsure = {"tenant-a", OPERATION, "timed-out"};
  remote not_done = {.answer = IDEM_EXEC_NOT_DONE};
  remote unknown = {.answer = IDEM_EXEC_UNKNOWN};
  remote ok = {0};
  idem_execute_options rerun = {.call = {.takeover_unknown = 1}};
  idem_record *rec;
  idem_call *c;

  /* Failed before acting: released, so a retry acts. */
  c = EXECUTE(f->store, &failed, REQ, &not_done, NULL, IDEM_OK, IDEM_PROCEED);
  assert_null(idem_call_response(c));
  idem_call_free(c);
  assert_absent(f->store, &failed);
  c = EXECUTE(f->store, &failed, REQ, &ok, NULL, IDEM_OK, IDEM_PROCEED);
  assert_int_equal(ok.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);

  /* Maybe acted: marked unknown, and a retry does not act. */
  c = EXECUTE(f->store, &unsure, REQ, &unknown, NULL, IDEM_OK, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &unsure);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  idem_record_free(rec);
  c = EXECUTE(f->store, &unsure, REQ, &ok, NULL, IDEM_OK, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(ok.runs, 1);
  /* Unless the caller asks to run it again: attempt 2, told so. */
  c = EXECUTE(f->store, &unsure, REQ, &ok, &rerun, IDEM_OK, IDEM_RECOVER);
  assert_int_equal(ok.runs, 2);
  assert_int_equal(ok.outcome, IDEM_RECOVER);
  assert_int_equal(ok.attempt, 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
}

/* Others see a long action in flight all along, though it outlives its
 * lease: it runs until two renewals were written (each moves the record's
 * lease_expires_ms on) and ten probes saw it, so a loaded machine makes
 * the test slower, never wrong (a 1.5 s lease, renewed every 500 ms). */
typedef struct prober {
  idem_store *store;
  const idem_id *id;
  int stop; /* __atomic: the prober reads it while the action sets it */
  int in_flight, other; /* in_flight: __atomic, read by the action */
} prober;

static void *probe_main(void *arg) {
  prober *p = arg;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon = NULL;
  size_t n;
  idem_canonicalize(REQ, strlen(REQ), NULL, &canon, &n, NULL);
  idem_sha256_hex(canon, n, fp);
  idem_free(canon);
  while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
    idem_call *c = NULL;
    if (idem_claim(p->store, p->id, fp, NULL, &c) == IDEM_OK &&
        idem_call_outcome(c) == IDEM_IN_FLIGHT)
      __atomic_add_fetch(&p->in_flight, 1, __ATOMIC_RELAXED);
    else if (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
      p->other++;
    idem_call_free(c);
    sleep_ms(50);
  }
  return NULL;
}

/* The action starts the prober once it holds the key, runs four leases
 * long, then stops it. */
static idem_exec_result probed_action(idem_exec *x, void *ctx,
                                      idem_response *r) {
  prober *p = ctx;
  pthread_t t;
  (void)x;
  int64_t last = -1;
  int renewed = 0;
  if (pthread_create(&t, NULL, probe_main, p) != 0)
    return IDEM_EXEC_NOT_DONE;
  for (int waited = 0;
       waited < 60000 &&
       (renewed < 2 || __atomic_load_n(&p->in_flight, __ATOMIC_RELAXED) < 10);
       waited += 20) {
    idem_record *rec = NULL;
    if (idem_get(p->store, p->id, &rec) == IDEM_OK) {
      if (last >= 0 && rec->lease_expires_ms > last)
        renewed++;
      last = rec->lease_expires_ms;
      idem_record_free(rec);
    }
    sleep_ms(20);
  }
  __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
  pthread_join(t, NULL);
  r->status = 201;
  r->body = "{\"ticket_id\":1}";
  r->body_len = strlen(r->body);
  return IDEM_EXEC_DONE;
}

static void test_execute_renews_while_running(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "long-action"};
  idem_execute_options o = {.call = {.lease_ms = 1500}};
  prober p = {f->store, &id, 0, 0, 0};
  remote a = {0};
  idem_call *c = NULL;

  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                  probed_action, &p, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  /* Every probe while it ran saw it in flight; none took it over. */
  assert_true(p.in_flight >= 10);
  assert_int_equal(p.other, 0);
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(a.runs, 0);
}

/* A holder whose key is taken over learns it while it runs, and its
 * ending never overwrites the new holder's record. */
typedef struct usurper {
  fixture *f;
  const char *key;
} usurper;

static void *usurp_main(void *arg) {
  usurper *u = arg;
  /* Wait for the holder's record, then give it another owner, as a
   * takeover after an expired lease does. */
  for (int i = 0; i < 200; i++) {
    if (side_sql(u->f->url,
                 is_pg_url(u->f->url)
                     ? "UPDATE {S}.idem_records SET owner = 'usurper' "
                       "WHERE key = $1::text"
                     : "UPDATE idem_records SET owner = 'usurper' WHERE "
                       "key = ?1",
                 u->key) == 1)
      break;
    sleep_ms(10);
  }
  return NULL;
}

static void test_execute_lease_lost(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "taken-over"};
  idem_execute_options o = {.call = {.lease_ms = 300}};
  remote a = {.wait_for_loss = 1};
  usurper u = {f, "taken-over"};
  idem_record *rec;
  pthread_t t;
  idem_call *c;

  assert_int_equal(pthread_create(&t, NULL, usurp_main, &u), 0);
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_ESTALE, IDEM_PROCEED);
  pthread_join(t, NULL);
  assert_int_equal(a.saw_loss, 1);
  assert_non_null(strstr(idem_errmsg(), "another holder"));
  idem_call_free(c);
  /* The new holder's record is untouched: still in progress, not unknown. */
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
}

static void test_execute_response_too_large(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "huge"};
  remote a = {.big = IDEM_MAX_RESPONSE + 1};
  idem_record *rec;
  idem_call *c;

  c = EXECUTE(f->store, &id, REQ, &a, NULL, IDEM_ETOOBIG, IDEM_PROCEED);
  assert_non_null(strstr(idem_errmsg(), "marked unknown"));
  idem_call_free(c);
  free(a.big_body);
  assert_int_equal(a.runs, 1);
  /* The action ran: the key must neither act again nor look free. */
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  idem_record_free(rec);
  a.big = 0;
  c = EXECUTE(f->store, &id, REQ, &a, NULL, IDEM_OK, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(a.runs, 1);
}

/* The store is locked by another connection when the action finishes: the
 * completion fails busy, is tried again while the lease is renewed, and
 * the record is stored once the lock is gone. */
typedef struct late_lock {
  fixture *f;
  blocker b;
  int runs;
} late_lock;

static idem_exec_result lock_then_finish(idem_exec *x, void *ctx,
                                         idem_response *r) {
  late_lock *l = ctx;
  (void)x;
  l->runs++;
  blocker_start(&l->b, l->f->url, 1200);
  r->status = 200;
  r->body = "done";
  r->body_len = 4;
  return IDEM_EXEC_DONE;
}

static void test_execute_retries_busy_completion(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "busy-at-the-end"};
  idem_store_options quick = {.busy_timeout_ms = 200, .group_commit = -1};
  idem_execute_options o = {.call = {.lease_ms = 3000}};
  idem_store *s = NULL;
  late_lock l = {.f = f};
  remote a = {0};
  int64_t t0;
  idem_call *c = NULL;
  int rc;

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &quick, &s));
  t0 = now_ms();
  rc = idem_execute(s, &id, REQ, strlen(REQ), lock_then_finish, &l, &o, &c);
  blocker_join(&l.b);
  EXPECT_RC(IDEM_OK, rc);
  /* It did wait for the lock to go, well past one busy timeout. */
  assert_true(now_ms() - t0 >= 1000);
  assert_int_equal(l.runs, 1);
  assert_int_equal(idem_call_response(c)->status, 200);
  idem_call_free(c);
  c = EXECUTE(s, &id, REQ, &a, NULL, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(idem_call_response(c)->status, 200);
  assert_int_equal(idem_call_response(c)->body_len, 4);
  idem_call_free(c);
  assert_int_equal(a.runs, 0);
  idem_store_close(s);
}

/* The lock stays past the retries: the action ran, its result could not be
 * recorded, and the caller is told so with the response in hand. */
static void test_execute_completion_fails_for_good(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "never-stored"};
  idem_store_options quick = {.busy_timeout_ms = 100, .group_commit = -1};
  idem_execute_options o = {.call = {.lease_ms = 5000}, .finish_retry_ms = 300};
  idem_store *s = NULL;
  late_lock l = {.f = f};
  idem_record *rec;
  idem_call *c = NULL;
  int rc;

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &quick, &s));
  rc = idem_execute(s, &id, REQ, strlen(REQ), lock_then_finish, &l, &o, &c);
  EXPECT_RC(IDEM_EBUSY, rc);
  assert_non_null(strstr(idem_errmsg(), "the action ran"));
  assert_non_null(c);
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(idem_call_response(c)->status, 200);
  idem_call_free(c);
  blocker_join(&l.b);
  /* The record was not completed: it is in progress (marking it unknown
   * met the same lock) and answers in flight until its lease ends. */
  rec = get_record(s, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
  assert_int_equal(l.runs, 1);
  idem_store_close(s);
}

/*
 * The store stays locked past the lease, so the renewer gives the lease up
 * and the action hears of it; but the action had already acted and answers
 * DONE. Nobody took the key over, so the completion is still the holder's
 * to write: it is retried until the lock goes, as a completion that meets
 * a busy store always is, and the response is kept. Giving up at the first
 * busy answer would leave the key in progress, for a takeover to act again.
 */
typedef struct locked_past_lease {
  fixture *f;
  blocker b;
  int runs, saw_loss;
} locked_past_lease;

static idem_exec_result lock_until_lost(idem_exec *x, void *ctx,
                                        idem_response *r) {
  locked_past_lease *l = ctx;
  struct pollfd p = {idem_exec_lost_fd(x), POLLIN, 0};
  l->runs++;
  blocker_start(&l->b, l->f->url, 1500);
  l->saw_loss = poll(&p, 1, 5000) == 1 && idem_exec_lost(x);
  r->status = 200;
  r->body = "done";
  r->body_len = 4;
  return IDEM_EXEC_DONE;
}

static void test_execute_completes_after_lease_lost(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "locked-past-its-lease"};
  idem_store_options quick = {.busy_timeout_ms = 100, .group_commit = -1};
  idem_execute_options o = {.call = {.lease_ms = 300}};
  idem_store *s = NULL;
  locked_past_lease l = {.f = f};
  remote a = {0};
  idem_call *c = NULL;
  int rc;

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &quick, &s));
  rc = idem_execute(s, &id, REQ, strlen(REQ), lock_until_lost, &l, &o, &c);
  blocker_join(&l.b);
  EXPECT_RC(IDEM_OK, rc);
  assert_int_equal(l.saw_loss, 1);
  assert_int_equal(idem_call_response(c)->status, 200);
  idem_call_free(c);
  c = EXECUTE(s, &id, REQ, &a, NULL, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(idem_call_response(c)->body_len, 4);
  idem_call_free(c);
  assert_int_equal(l.runs, 1);
  assert_int_equal(a.runs, 0);
  idem_store_close(s);
}

/* A retry budget as large as the type holds means "keep trying", not an
 * overflow that ends the retries at once. */
static void test_execute_largest_retry_budget(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "patient"};
  idem_store_options quick = {.busy_timeout_ms = 200, .group_commit = -1};
  idem_execute_options o = {.call = {.lease_ms = 3000},
                            .finish_retry_ms = INT64_MAX};
  idem_store *s = NULL;
  late_lock l = {.f = f};
  idem_call *c = NULL;
  int rc;

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &quick, &s));
  rc = idem_execute(s, &id, REQ, strlen(REQ), lock_then_finish, &l, &o, &c);
  blocker_join(&l.b);
  EXPECT_RC(IDEM_OK, rc);
  assert_int_equal(idem_call_response(c)->status, 200);
  idem_call_free(c);
  idem_store_close(s);
}

static void test_execute_fingerprint_pointers(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "payment-7"};
  const char *const ptrs[] = {"/to", "/amount", "/tags/0", NULL};
  const char *const bad_ptrs[] = {"amount", NULL};
  idem_execute_options o = {.fingerprint_pointers = ptrs};
  idem_execute_options bad = {.fingerprint_pointers = bad_ptrs};
  remote a = {0};
  idem_call *c;

  c = EXECUTE(f->store, &id,
              "{\"to\":\"acct-1\",\"amount\":100,\"note\":\"rent\","
              "\"tags\":[\"a\",\"b\"]}",
              &a, &o, IDEM_OK, IDEM_PROCEED);
  idem_call_free(c);
  /* Another note, another second tag, the amount written otherwise: the
   * chosen parts are the same, so it replays. */
  c = EXECUTE(f->store, &id,
              "{\"note\":\"rent for May\",\"amount\":1.0e2,\"to\":\"acct-1\","
              "\"tags\":[\"a\",\"z\"]}",
              &a, &o, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  /* Another amount conflicts. */
  c = EXECUTE(f->store, &id,
              "{\"to\":\"acct-1\",\"amount\":101,\"note\":\"rent\","
              "\"tags\":[\"a\",\"b\"]}",
              &a, &o, IDEM_OK, IDEM_CONFLICT);
  idem_call_free(c);
  /* A part that goes missing changes the fingerprint too. */
  c = EXECUTE(f->store, &id, "{\"to\":\"acct-1\",\"amount\":100}", &a, &o,
              IDEM_OK, IDEM_CONFLICT);
  idem_call_free(c);
  assert_int_equal(a.runs, 1);
  c = EXECUTE(f->store, &id, "{\"amount\":1}", &a, &bad, IDEM_EINVAL, 0);
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "JSON Pointer"));
  {
    const char *const none[] = {NULL};
    idem_execute_options empty = {.fingerprint_pointers = none};
    c = EXECUTE(f->store, &id, "{\"amount\":1}", &a, &empty, IDEM_EINVAL, 0);
    assert_null(c);
    assert_int_equal(a.runs, 1);
  }
}

/*
 * The lease counts from the claim's write, so the renewals must too: when
 * the claim comes back late (here its commit takes 500 ms of a 600 ms
 * lease), the first renewal is due at once, not a third of a lease after
 * the answer, when the lease would already be over and another caller
 * could take the key over while the action still runs. SQLite: a commit
 * hook, set on the store's writer by a local action, delays one commit.
 */
static int slow_commit_ms; /* the next commit sleeps this long, once */

static int sleepy_commit(void *arg) {
  (void)arg;
  if (slow_commit_ms > 0) {
    sleep_ms(slow_commit_ms);
    slow_commit_ms = 0;
  }
  return 0;
}

static int install_sleepy_commit(void *conn, void *ctx, idem_response *r) {
  (void)ctx;
  sqlite3_commit_hook(conn, sleepy_commit, NULL);
  r->status = 200;
  return 0;
}

typedef struct taker {
  idem_store *store;
  const idem_id *id;
  int stop; /* __atomic */
  int took;
} taker;

static void *take_over_main(void *arg) {
  taker *t = arg;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon = NULL;
  size_t n;
  idem_canonicalize(REQ, strlen(REQ), NULL, &canon, &n, NULL);
  idem_sha256_hex(canon, n, fp);
  idem_free(canon);
  while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
    idem_record *r = NULL;
    int rc = idem_get(t->store, t->id, &r);
    idem_record_free(r);
    if (rc == IDEM_OK)
      break;
    sleep_ms(5);
  }
  while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
    idem_call *c = NULL;
    if (idem_claim(t->store, t->id, fp, NULL, &c) == IDEM_OK &&
        idem_call_outcome(c) == IDEM_RECOVER) {
      t->took++;
      idem_release(t->store, c);
    }
    idem_call_free(c);
    sleep_ms(10);
  }
  return NULL;
}

static void test_execute_renews_from_the_write(void **state) {
  fixture *f = *state;
  idem_id hook = {"tenant-a", OPERATION, "installs-a-hook"};
  idem_id id = {"tenant-a", OPERATION, "late-answer"};
  idem_execute_options o = {.call = {.lease_ms = 600}};
  char fp[IDEM_FINGERPRINT_SIZE];
  remote a = {.run_ms = 1000};
  taker t = {f->store, &id, 0, 0};
  pthread_t th;
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);

  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &hook, fp, NULL,
                                        install_sleepy_commit, NULL, &c));
  idem_call_free(c);
  assert_int_equal(pthread_create(&th, NULL, take_over_main, &t), 0);
  slow_commit_ms = 500;
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_PROCEED);
  __atomic_store_n(&t.stop, 1, __ATOMIC_RELEASE);
  pthread_join(th, NULL);
  assert_int_equal(t.took, 0);
  assert_int_equal(a.runs, 1);
  idem_call_free(c);
}

/* IDEM_EXEC_ABANDON: the action may still be acting (a request timed out
 * after it was sent). The record stays in progress, its lease counted from
 * the end of the run and no longer renewed: inside it a retry is told the
 * call is in flight; after it, a retry takes over (RECOVER), or with
 * IDEM_EXPIRED_REPORT is told the outcome is unknown. */
static void test_execute_abandon(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "left-running"};
  idem_execute_options o = {.call = {.lease_ms = 900}};
  idem_execute_options report = {
      .call = {.lease_ms = 900, .on_expired_lease = IDEM_EXPIRED_REPORT}};
  remote a = {.answer = IDEM_EXEC_ABANDON, .run_ms = 400};
  idem_record *rec;
  idem_call *c;
  int64_t returned;

  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_PROCEED);
  returned = now_ms();
  assert_null(idem_call_response(c));
  idem_call_free(c);
  assert_int_equal(a.runs, 1);
  assert_int_equal(a.next_ticket, 0);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  /* The lease runs a whole lease from when the action returned, not from
   * the claim 400 ms before. */
  assert_true(rec->lease_expires_ms >= returned + 900 - 150);
  idem_record_free(rec);

  a.answer = IDEM_EXEC_DONE;
  a.run_ms = 0;
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_IN_FLIGHT);
  assert_true(idem_call_retry_after_ms(c) > 0);
  idem_call_free(c);
  assert_int_equal(a.runs, 1);

  sleep_ms(1100);
  c = EXECUTE(f->store, &id, REQ, &a, &report, IDEM_OK, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(a.runs, 1);
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_RECOVER);
  assert_int_equal(a.runs, 2);
  assert_int_equal(a.outcome, IDEM_RECOVER);
  assert_int_equal(a.attempt, 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(a.runs, 2);
}

/*
 * The lease renewer may find the record no longer held under the claim's
 * token because it already holds this run's ending: on PostgreSQL, when a
 * server restart swallowed the answer to the completion, which had
 * committed, and the renewal ran before the completion was sent again.
 * idem_execute() must then answer by the record (IDEM_OK: the response is
 * stored), not IDEM_ESTALE, which made `idem run` report "not recorded"
 * (exit 5) for a stored result (found by the kill -9 campaign,
 * tests/chaos). Here an operator's forced resolve with the very same
 * response puts the record in that state; one with another response still
 * makes the completion stale.
 */
typedef struct done_elsewhere {
  fixture *f;
  const idem_id *id;
  const char *body; /* what the operator stores */
  int runs, saw_loss;
} done_elsewhere;

static idem_exec_result completed_meanwhile(idem_exec *x, void *ctx,
                                            idem_response *r) {
  done_elsewhere *d = ctx;
  idem_store *op = NULL;
  idem_resolve_options force = {.force = 1};
  idem_response same = {201, "m", 1, d->body, strlen(d->body)};
  d->runs++;
  EXPECT_RC(IDEM_OK, idem_store_open(d->f->url, NULL, &op));
  EXPECT_RC(IDEM_OK, idem_resolve_with(op, d->id, &same, &force));
  idem_store_close(op);
  /* The renewer runs every third of the lease and finds the record gone
   * from this holder. */
  for (int i = 0; i < 300 && !idem_exec_lost(x); i++)
    sleep_ms(10);
  d->saw_loss = idem_exec_lost(x);
  r->status = 201;
  r->meta = "m";
  r->meta_len = 1;
  r->body = "done";
  r->body_len = 4;
  return IDEM_EXEC_DONE;
}

static void test_execute_ending_already_stored(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "stored-before-the-answer"};
  idem_id other = {"tenant-a", OPERATION, "resolved-otherwise"};
  idem_execute_options o = {.call = {.lease_ms = 300}};
  done_elsewhere same = {.f = f, .id = &id, .body = "done"};
  done_elsewhere differs = {.f = f, .id = &other, .body = "operator's"};
  remote a = {0};
  idem_record *rec;
  idem_call *c = NULL;

  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                  completed_meanwhile, &same, &o, &c));
  assert_int_equal(same.runs, 1);
  assert_int_equal(same.saw_loss, 1);
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(idem_call_response(c)->status, 201);
  idem_call_free(c);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec->response.body_len, 4);
  assert_memory_equal(rec->response.body, "done", 4);
  idem_record_free(rec);
  c = EXECUTE(f->store, &id, REQ, &a, NULL, IDEM_OK, IDEM_REPLAY);
  idem_call_free(c);
  assert_int_equal(a.runs, 0);

  c = NULL;
  EXPECT_RC(IDEM_ESTALE, idem_execute(f->store, &other, REQ, strlen(REQ),
                                      completed_meanwhile, &differs, &o, &c));
  assert_int_equal(differs.saw_loss, 1);
  idem_call_free(c);
  rec = get_record(f->store, &other);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec->response.body_len, strlen("operator's"));
  idem_record_free(rec);
}

/*
 * Another caller takes id over after its holder's lease ended: the lease
 * is ended behind the holder's back (its scheduler would renew it), then a
 * claim finds it expired and takes the key (RECOVER, attempt 2). Asked
 * again should a renewal come between the two. The new holder's call.
 */
static idem_call *take_over(fixture *f, const idem_id *id) {
  char fp[IDEM_FINGERPRINT_SIZE];
  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  for (int i = 0; i < 100; i++) {
    idem_call *c = NULL;
    assert_int_equal(
        side_sql(f->url,
                 is_pg_url(f->url)
                     ? "UPDATE {S}.idem_records SET lease_expires_ms = 0 "
                       "WHERE key = $1::text"
                     : "UPDATE idem_records SET lease_expires_ms = 0 WHERE "
                       "key = ?1",
                 id->key),
        1);
    EXPECT_RC(IDEM_OK, idem_claim(f->store, id, fp, NULL, &c));
    if (idem_call_outcome(c) == IDEM_RECOVER)
      return c;
    assert_int_equal(idem_call_outcome(c), IDEM_IN_FLIGHT);
    idem_call_free(c);
    sleep_ms(10);
  }
  fail_msg("key '%s': never taken over", id->key);
  return NULL;
}

/*
 * A holder of idem_execute_begin() whose key another caller took over
 * ends with IDEM_ESTALE, and its call then says what is true: nothing of
 * its own was stored, the record is another holder's (idem_call_state()
 * 0, as on CONFLICT), it holds no lease, and the response it still offers
 * is its action's, which no claim replays: claims replay the new holder's.
 * Twice: with a long lease, the ending is sent before any renewal and the
 * store refuses it; with a short one, the scheduler found the takeover
 * first and the ending is never sent.
 */
static void test_execute_end_after_takeover(void **state) {
  fixture *f = *state;
  idem_id ids[2] = {{"tenant-a", OPERATION, "taken-before-noticed"},
                    {"tenant-a", OPERATION, "taken-and-noticed"}};
  idem_execute_options o[2] = {{.call = {.lease_ms = 60000}},
                               {.call = {.lease_ms = 600}}};
  int runs = 0, ticket = 0;
  remote again = {0};

  for (int i = 0; i < 2; i++) {
    idem_exec *x = NULL;
    idem_call *c = NULL, *newer, *r;
    idem_record *rec;
    char body[32], taker_body[32];
    idem_response mine = {201, NULL, 0, body, 0};
    idem_response theirs = {201, NULL, 0, taker_body, 0};
    int my_ticket, their_ticket;

    EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &ids[i], REQ, strlen(REQ),
                                          &o[i], &x, &c));
    assert_non_null(x);
    assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
    assert_int_equal(idem_call_state(c), IDEM_STATE_IN_PROGRESS);
    /* The holder's action: one ticket. */
    runs++;
    my_ticket = ++ticket;
    snprintf(body, sizeof body, "{\"ticket_id\":%d}", my_ticket);
    mine.body_len = strlen(body);
    /* The key is taken over, and its new holder acts and completes. */
    newer = take_over(f, &ids[i]);
    assert_int_equal(idem_call_attempt(newer), 2);
    runs++;
    their_ticket = ++ticket;
    snprintf(taker_body, sizeof taker_body, "{\"ticket_id\":%d}", their_ticket);
    theirs.body_len = strlen(taker_body);
    EXPECT_RC(IDEM_OK, idem_complete(f->store, newer, &theirs));
    idem_call_free(newer);
    if (i == 1) {
      /* The scheduler's renewal is refused: the lease is lost at once. */
      struct pollfd p = {idem_exec_lost_fd(x), POLLIN, 0};
      assert_int_equal(poll(&p, 1, 10000), 1);
      assert_true(idem_exec_lost(x));
    }

    EXPECT_RC(IDEM_ESTALE, idem_execute_end(x, IDEM_EXEC_DONE, &mine));
    assert_non_null(strstr(idem_errmsg(), "another holder"));
    assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
    if (idem_call_state(c) != 0)
      fail_msg("key '%s': idem_call_state() is %s after IDEM_ESTALE, "
               "expected 0 (nothing of the holder's was stored)",
               ids[i].key, idem_state_name(idem_call_state(c)));
    assert_int_equal(idem_call_lease_expires_ms(c), 0);
    /* What the action answered, not what the record holds. */
    assert_int_equal(ticket_id_of(idem_call_response(c)), my_ticket);
    idem_call_free(c);

    /* The record is the new holder's, untouched by the stale ending. */
    rec = get_record(f->store, &ids[i]);
    assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
    assert_int_equal(rec->attempt, 2);
    assert_int_equal(rec->recovered, 1);
    assert_int_equal(ticket_id_of(&rec->response), their_ticket);
    idem_record_free(rec);
    r = EXECUTE(f->store, &ids[i], REQ, &again, NULL, IDEM_OK, IDEM_REPLAY);
    assert_int_equal(ticket_id_of(idem_call_response(r)), their_ticket);
    assert_int_equal(idem_call_state(r), IDEM_STATE_COMPLETED);
    assert_int_equal(idem_call_recovered(r), 1);
    idem_call_free(r);
  }
  /* Two actions per key, and no retry acted again. */
  assert_int_equal(runs, 4);
  assert_int_equal(again.runs, 0);
  assert_int_equal(list_count(f->store, NULL), 2);
}

/* idem_execute_begin()/idem_execute_end(): 200 keys held at once by one
 * thread, their leases renewed past their length with no thread of the
 * caller's, then ended from another thread in each of the four ways. */
typedef struct ender {
  idem_exec **x;
  int n;
  int rc[200];
  char body[200][32];
} ender;

static void *end_main(void *arg) {
  ender *e = arg;
  for (int i = 0; i < e->n; i++) {
    idem_response r = {201, NULL, 0, e->body[i], 0};
    idem_exec_result how = i % 4 == 0   ? IDEM_EXEC_DONE
                           : i % 4 == 1 ? IDEM_EXEC_NOT_DONE
                           : i % 4 == 2 ? IDEM_EXEC_UNKNOWN
                                        : IDEM_EXEC_LEAVE_IN_PROGRESS;
    snprintf(e->body[i], sizeof e->body[i], "{\"ticket_id\":%d}", i + 1);
    r.body_len = strlen(e->body[i]);
    e->rc[i] = idem_execute_end(e->x[i], how, &r);
  }
  return NULL;
}

static void test_execute_in_two_halves(void **state) {
  fixture *f = *state;
  enum { N = 200 };
  idem_execute_options o = {.call = {.lease_ms = 900}};
  idem_exec *x[N];
  idem_call *c[N];
  char keys[N][16];
  ender e;
  pthread_t t;
  remote a = {0};

  for (int i = 0; i < N; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    snprintf(keys[i], sizeof keys[i], "half-%d", i);
    EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &id, REQ, strlen(REQ), &o,
                                          &x[i], &c[i]));
    assert_non_null(x[i]);
    assert_int_equal(idem_call_outcome(c[i]), IDEM_PROCEED);
    assert_int_equal(idem_exec_outcome(x[i]), IDEM_PROCEED);
    assert_true(idem_exec_lost_fd(x[i]) >= 0);
  }
  /* Three lease lengths later every key is still held. */
  sleep_ms(2700);
  for (int i = 0; i < N; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    idem_call *r = NULL;
    char fp[IDEM_FINGERPRINT_SIZE];
    assert_false(idem_exec_lost(x[i]));
    EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
    EXPECT_RC(IDEM_OK, idem_claim(f->store, &id, fp, NULL, &r));
    assert_int_equal(idem_call_outcome(r), IDEM_IN_FLIGHT);
    idem_call_free(r);
  }
  /* A second begin on a held key is told, and holds nothing. */
  {
    idem_id id = {"tenant-a", OPERATION, keys[0]};
    idem_exec *none = (idem_exec *)1;
    idem_call *r = NULL;
    EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &id, REQ, strlen(REQ), &o,
                                          &none, &r));
    assert_null(none);
    assert_int_equal(idem_call_outcome(r), IDEM_IN_FLIGHT);
    idem_call_free(r);
  }
  memset(&e, 0, sizeof e);
  e.x = x;
  e.n = N;
  assert_int_equal(pthread_create(&t, NULL, end_main, &e), 0);
  pthread_join(t, NULL);
  for (int i = 0; i < N; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    idem_call *r;
    assert_int_equal(e.rc[i], IDEM_OK);
    switch (i % 4) {
    case 0:
      assert_int_equal(idem_call_state(c[i]), IDEM_STATE_COMPLETED);
      assert_int_equal(ticket_id_of(idem_call_response(c[i])), i + 1);
      r = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_REPLAY);
      assert_int_equal(ticket_id_of(idem_call_response(r)), i + 1);
      break;
    case 1:
      assert_int_equal(idem_call_state(c[i]), 0);
      r = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_PROCEED);
      break;
    case 2:
      assert_int_equal(idem_call_state(c[i]), IDEM_STATE_UNKNOWN);
      r = EXECUTE(f->store, &id, REQ, &a, &o, IDEM_OK, IDEM_UNKNOWN);
      break;
    default: {
      /* Left in progress (its last lease may have run out by now on a
       * loaded machine: the record says so either way). */
      idem_record *rec = get_record(f->store, &id);
      assert_int_equal(idem_call_state(c[i]), IDEM_STATE_IN_PROGRESS);
      assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
      idem_record_free(rec);
      r = NULL;
      break;
    }
    }
    idem_call_free(r);
    idem_call_free(c[i]);
  }
  /* Only the released keys ran again, once each. */
  assert_int_equal(a.runs, N / 4);
  EXPECT_RC(IDEM_EINVAL, idem_execute_end(NULL, IDEM_EXEC_DONE, NULL));
}

/*
 * One parse makes both the fingerprint and the canonical request kept for
 * operators when the two texts are the same (every number a short
 * integer); otherwise the canonical form is made apart. Either way the
 * record keeps idem_canonicalize()'s form, a request written otherwise
 * with the same values replays, and one whose numbers differ past a
 * double's precision conflicts.
 */
static void test_execute_canonical_request_kept(void **state) {
  fixture *f = *state;
  static const struct {
    const char *req, *same, *other;
  } cases[] = {
      {"{\"n\":5,\"s\":\"a\"}", "{ \"s\": \"a\", \"n\": 5.0 }",
       "{\"n\":6,\"s\":\"a\"}"},
      {"{\"n\":-123456789012345}", "{\"n\":-1.23456789012345e14}",
       "{\"n\":-123456789012346}"},
      {"{\"n\":1234567890123456}", "{\"n\":1234567890123456.0}",
       "{\"n\":1234567890123457}"},
      {"{\"n\":12345678901234567}", "{\"n\":12345678901234567}",
       "{\"n\":12345678901234568}"},
      {"{\"x\":0.1}", "{\"x\":1e-1}", "{\"x\":0.10000000000000001}"},
      {"{\"x\":1.0000000000000001}", "{\"x\":1.0000000000000001}", "{\"x\":1}"},
      {"{\"s\":\"12 \\\" 3.5e7 \\\\\",\"t\":[1,2,{\"u\":\"-9\"}]}",
       "{\"t\":[1,2,{\"u\":\"-9\"}],\"s\":\"12 \\\" 3.5e7 \\\\\"}",
       "{\"s\":\"12 \\\" 3.5e7 \\\\\",\"t\":[1,2,{\"u\":\"-8\"}]}"},
      {"[1e400]", NULL, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char key[32];
    idem_id id = {"tenant-a", OPERATION, key};
    remote a = {0};
    idem_record *rec;
    idem_call *c;
    char *canon = NULL;
    size_t canon_len;
    snprintf(key, sizeof key, "canonical-%zu", i);
    if (!cases[i].same) { /* overflows a double: refused, nothing kept */
      c = EXECUTE(f->store, &id, cases[i].req, &a, NULL, IDEM_ERANGE, 0);
      assert_null(c);
      assert_int_equal(a.runs, 0);
      continue;
    }
    c = EXECUTE(f->store, &id, cases[i].req, &a, NULL, IDEM_OK, IDEM_PROCEED);
    idem_call_free(c);
    rec = get_record(f->store, &id);
    EXPECT_RC(IDEM_OK, idem_canonicalize(cases[i].req, strlen(cases[i].req),
                                         NULL, &canon, &canon_len, NULL));
    if (rec->request_len != canon_len ||
        memcmp(rec->request, canon, canon_len) != 0) {
      print_error("case %zu: kept %.*s, canonical %s\n", i,
                  (int)rec->request_len, (const char *)rec->request, canon);
      fail();
    }
    idem_free(canon);
    idem_record_free(rec);
    c = EXECUTE(f->store, &id, cases[i].same, &a, NULL, IDEM_OK, IDEM_REPLAY);
    idem_call_free(c);
    c = EXECUTE(f->store, &id, cases[i].other, &a, NULL, IDEM_OK,
                IDEM_CONFLICT);
    idem_call_free(c);
    assert_int_equal(a.runs, 1);
  }
}

/*
 * forget_request: the record keeps the fingerprint and not the request
 * (a card number sent in it is nowhere in the record), on every path that
 * claims (idem_execute(), its two halves, the asynchronous half); a
 * retry still replays, a changed request is still a conflict.
 */
static void test_execute_forget_request(void **state) {
  fixture *f = *state;
  static const char req[] = "{\"card\":\"4111111111111111\",\"cvc\":\"737\"}";
  static const char same[] =
      "{ \"cvc\": \"737\", \"card\": \"4111111111111111\" }";
  static const char other[] = "{\"card\":\"4111111111111111\",\"cvc\":\"738\"}";
  idem_execute_options o = {0};
  o.forget_request = 1;
  for (int path = 0; path < 2; path++) {
    char key[32];
    idem_id id = {"tenant-a", OPERATION, key};
    remote a = {0};
    idem_record *rec;
    idem_call *c;
    snprintf(key, sizeof key, "forget-%d", path);
    if (path == 0) {
      c = EXECUTE(f->store, &id, req, &a, &o, IDEM_OK, IDEM_PROCEED);
    } else {
      idem_exec *x = NULL;
      idem_response r = {201, NULL, 0, "{}", 2};
      EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &id, req, strlen(req), &o,
                                            &x, &c));
      assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
      EXPECT_RC(IDEM_OK, idem_execute_end(x, IDEM_EXEC_DONE, &r));
      a.runs = 1;
    }
    idem_call_free(c);
    rec = get_record(f->store, &id);
    assert_null(rec->request);
    assert_int_equal(rec->request_len, 0);
    idem_record_free(rec);
    c = EXECUTE(f->store, &id, same, &a, &o, IDEM_OK, IDEM_REPLAY);
    idem_call_free(c);
    c = EXECUTE(f->store, &id, other, &a, &o, IDEM_OK, IDEM_CONFLICT);
    idem_call_free(c);
    assert_int_equal(a.runs, 1);
  }
}

/*
 * fingerprint: a caller that fingerprinted the request already hands the
 * fingerprint over; the record carries it, a request of another
 * fingerprint conflicts with it, and with forget_request the request is
 * not read at all (a text that is no JSON goes through). A fingerprint
 * that is not 64 lowercase hex digits is refused before anything is
 * claimed.
 */
static void test_execute_given_fingerprint(void **state) {
  fixture *f = *state;
  static const char req[] = "{\"to\":\"alice\",\"amount\":5}";
  static const char other[] = "{\"to\":\"alice\",\"amount\":6}";
  char fp[IDEM_FINGERPRINT_SIZE], key[] = "given-fp";
  char *text = NULL;
  size_t text_len = 0;
  idem_id id = {"tenant-a", OPERATION, key};
  idem_execute_options o = {0};
  remote a = {0};
  idem_record *rec;
  idem_call *c;
  /* idem_fingerprint_text() is the text idem_fingerprint() hashes. */
  EXPECT_RC(IDEM_OK, idem_fingerprint(req, strlen(req), 1, fp));
  EXPECT_RC(IDEM_OK, idem_fingerprint_text(req, strlen(req), &text, &text_len));
  {
    char hex[IDEM_FINGERPRINT_SIZE];
    EXPECT_RC(IDEM_OK, idem_sha256_hex(text, text_len, hex));
    assert_string_equal(hex, fp);
    assert_string_equal(text, "{\"amount\":5,\"to\":\"alice\"}");
  }
  idem_free(text);
  EXPECT_RC(IDEM_EJSON, idem_fingerprint_text("{", 1, &text, &text_len));
  assert_null(text);

  o.forget_request = 1;
  o.fingerprint = fp;
  /* Not parsed: "no json" with the fingerprint of req is req's call. */
  c = EXECUTE(f->store, &id, "no json", &a, &o, IDEM_OK, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &id);
  assert_string_equal(rec->fingerprint, fp);
  assert_null(rec->request);
  idem_record_free(rec);
  o.fingerprint = NULL;
  c = EXECUTE(f->store, &id, req, &a, &o, IDEM_OK, IDEM_REPLAY);
  idem_call_free(c);
  c = EXECUTE(f->store, &id, other, &a, &o, IDEM_OK, IDEM_CONFLICT);
  idem_call_free(c);
  assert_int_equal(a.runs, 1);

  /* Without forget_request the request is still made canonical for the
   * record (and must be JSON). */
  o.forget_request = 0;
  o.fingerprint = fp;
  key[0] = 'G';
  c = EXECUTE(f->store, &id, req, &a, &o, IDEM_OK, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &id);
  assert_string_equal(rec->fingerprint, fp);
  assert_non_null(rec->request);
  idem_record_free(rec);

  for (int bad = 0; bad < 3; bad++) {
    static const char *const bads[] = {
        "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789",
        "abc",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdefg"};
    key[0] = (char)('a' + bad);
    o.fingerprint = bads[bad];
    c = EXECUTE(f->store, &id, req, &a, &o, IDEM_EINVAL, 0);
    assert_null(c);
  }
  assert_int_equal(a.runs, 2);
}

/*
 * idem_execute_begin_async() and idem_execute_end_async(), as an event
 * loop uses them: one thread asks for N claims at once and goes on; the
 * answers come on the store's threads. Every fresh key proceeds once, a
 * second claim of a key in flight is told so, each ending is what the
 * action reported (a ticket kept and replayed, a release that runs again,
 * an unknown that stays unknown, a response too large marked unknown),
 * and the action ran once per key.
 */
typedef struct async_waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int answered;
} async_waiter;

typedef struct async_slot {
  async_waiter *w;
  int rc;
  idem_exec *x;
  idem_call *c;
  char msg[256];
} async_slot;

static void async_begun(void *ctx, int rc, idem_exec *x, idem_call *c) {
  async_slot *s = ctx;
  s->rc = rc;
  s->x = x;
  s->c = c;
  snprintf(s->msg, sizeof s->msg, "%s", rc == IDEM_OK ? "" : idem_errmsg());
  pthread_mutex_lock(&s->w->mu);
  s->w->answered++;
  pthread_cond_broadcast(&s->w->cv);
  pthread_mutex_unlock(&s->w->mu);
}

static void async_ended(void *ctx, int rc) {
  async_begun(ctx, rc, NULL, ((async_slot *)ctx)->c);
}

static void async_wait(async_waiter *w, int n) {
  pthread_mutex_lock(&w->mu);
  while (w->answered < n)
    pthread_cond_wait(&w->cv, &w->mu);
  w->answered = 0;
  pthread_mutex_unlock(&w->mu);
}

static void test_execute_async(void **state) {
  fixture *f = *state;
  enum { N = 300 };
  static async_slot first[N], dup[N], end[N], again[N];
  static char keys[N][16], bodies[N][64];
  static char big[IDEM_MAX_RESPONSE + 1];
  async_waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  idem_execute_options o = {.call = {.lease_ms = 5000}};
  int runs = 0;

  /* Each key twice in a row: one proceeds, the other finds it in flight. */
  for (int i = 0; i < N; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    snprintf(keys[i], sizeof keys[i], "async-%d", i);
    first[i].w = dup[i].w = &w;
    EXPECT_RC(IDEM_OK, idem_execute_begin_async(f->store, &id, REQ, strlen(REQ),
                                                &o, async_begun, &first[i]));
    EXPECT_RC(IDEM_OK, idem_execute_begin_async(f->store, &id, REQ, strlen(REQ),
                                                &o, async_begun, &dup[i]));
  }
  async_wait(&w, 2 * N);
  for (int i = 0; i < N; i++) {
    /* On a store without a queue the two run on two threads, in either
     * order: the one that proceeded is first. */
    if (dup[i].rc == IDEM_OK && idem_call_outcome(dup[i].c) == IDEM_PROCEED) {
      async_slot t = first[i];
      first[i] = dup[i];
      dup[i] = t;
    }
    if (first[i].rc != IDEM_OK)
      print_error("key %d: %s: %s\n", i, idem_rc_name(first[i].rc),
                  first[i].msg);
    assert_int_equal(first[i].rc, IDEM_OK);
    assert_int_equal(dup[i].rc, IDEM_OK);
    assert_int_equal(idem_call_outcome(first[i].c), IDEM_PROCEED);
    assert_non_null(first[i].x);
    assert_int_equal(idem_exec_outcome(first[i].x), IDEM_PROCEED);
    assert_int_equal(idem_call_outcome(dup[i].c), IDEM_IN_FLIGHT);
    assert_null(dup[i].x);
    idem_call_free(dup[i].c);
  }

  /* The actions: i % 4 == 0 a ticket kept, 1 did not act, 2 unknown, 3 a
   * response too large to keep. */
  memset(big, 'x', sizeof big);
  for (int i = 0; i < N; i++) {
    idem_response r = {0};
    idem_exec_result how = i % 4 == 1   ? IDEM_EXEC_NOT_DONE
                           : i % 4 == 2 ? IDEM_EXEC_UNKNOWN
                                        : IDEM_EXEC_DONE;
    if (how != IDEM_EXEC_NOT_DONE)
      runs++;
    snprintf(bodies[i], sizeof bodies[i], "{\"ticket_id\":%d}", i + 1);
    r.status = 201;
    r.meta = TICKET_META;
    r.meta_len = strlen(TICKET_META);
    r.body = i % 4 == 3 ? big : bodies[i];
    r.body_len = i % 4 == 3 ? sizeof big : strlen(bodies[i]);
    end[i].w = &w;
    end[i].c = first[i].c;
    EXPECT_RC(IDEM_OK, idem_execute_end_async(first[i].x, how, &r, async_ended,
                                              &end[i]));
    /* The response need not outlive the call. */
    memset(bodies[i], '?', sizeof bodies[i]);
  }
  async_wait(&w, N);
  for (int i = 0; i < N; i++) {
    idem_call *c = first[i].c;
    if (i % 4 == 3) {
      assert_int_equal(end[i].rc, IDEM_ETOOBIG);
      assert_non_null(strstr(end[i].msg, "marked unknown"));
      assert_int_equal(idem_call_state(c), IDEM_STATE_UNKNOWN);
      continue;
    }
    if (end[i].rc != IDEM_OK)
      print_error("end %d: %s: %s\n", i, idem_rc_name(end[i].rc), end[i].msg);
    assert_int_equal(end[i].rc, IDEM_OK);
    switch (i % 4) {
    case 0:
      assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
      assert_int_equal(ticket_id_of(idem_call_response(c)), i + 1);
      break;
    case 1:
      assert_int_equal(idem_call_state(c), 0);
      break;
    default:
      assert_int_equal(idem_call_state(c), IDEM_STATE_UNKNOWN);
    }
  }

  /* Retries: the kept ticket replays, the released key proceeds, the rest
   * are unknown; the action ran once per key that acted. */
  for (int i = 0; i < N; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    again[i].w = &w;
    EXPECT_RC(IDEM_OK, idem_execute_begin_async(f->store, &id, REQ, strlen(REQ),
                                                &o, async_begun, &again[i]));
  }
  async_wait(&w, N);
  for (int i = 0; i < N; i++) {
    idem_call *c = again[i].c;
    assert_int_equal(again[i].rc, IDEM_OK);
    switch (i % 4) {
    case 0:
      assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
      assert_int_equal(ticket_id_of(idem_call_response(c)), i + 1);
      assert_null(again[i].x);
      break;
    case 1:
      assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
      assert_non_null(again[i].x);
      end[i].c = c;
      EXPECT_RC(IDEM_OK, idem_execute_end_async(again[i].x, IDEM_EXEC_NOT_DONE,
                                                NULL, async_ended, &end[i]));
      async_wait(&w, 1);
      assert_int_equal(end[i].rc, IDEM_OK);
      break;
    default:
      assert_int_equal(idem_call_outcome(c), IDEM_UNKNOWN);
      assert_null(again[i].x);
    }
    idem_call_free(c);
    idem_call_free(first[i].c);
  }
  assert_int_equal(runs, N - N / 4);

  /* Bad arguments: told at once, done never called. */
  {
    idem_id id = {"tenant-a", OPERATION, "bad key\n"};
    async_slot never = {.w = &w};
    EXPECT_RC(IDEM_EINVAL,
              idem_execute_begin_async(f->store, &id, REQ, strlen(REQ), &o,
                                       NULL, &never));
    EXPECT_RC(IDEM_EKEY,
              idem_execute_begin_async(f->store, &id, REQ, strlen(REQ), &o,
                                       async_begun, &never));
    EXPECT_RC(IDEM_EINVAL, idem_execute_end_async(NULL, IDEM_EXEC_DONE, NULL,
                                                  async_ended, &never));
    assert_int_equal(w.answered, 0);
  }
}

/*
 * idem_execute_begin_async() with call.wait_ms on a key another holder
 * has: each waiter waits out the holder, then replays its ticket. None
 * proceeds while the key is held, no record but the holder's appears, and
 * the action ran once. (The claim's id once pointed into a claim that the
 * wait freed each round.)
 */
static void test_execute_async_waits(void **state) {
  fixture *f = *state;
  enum { N = 20 };
  static async_slot holder, waiters[N], end;
  async_waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  async_waiter ww = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  idem_execute_options o = {.call = {.lease_ms = 20000}};
  idem_execute_options ow = {.call = {.lease_ms = 20000, .wait_ms = 20000}};
  char tenant[32], operation[32], key[32];
  idem_response r = {0};
  char body[64];

  snprintf(tenant, sizeof tenant, "tenant-a");
  snprintf(operation, sizeof operation, "%s", OPERATION);
  snprintf(key, sizeof key, "async-wait");
  {
    idem_id id = {tenant, operation, key};
    holder.w = &w;
    EXPECT_RC(IDEM_OK, idem_execute_begin_async(f->store, &id, REQ, strlen(REQ),
                                                &o, async_begun, &holder));
    async_wait(&w, 1);
    assert_int_equal(holder.rc, IDEM_OK);
    assert_int_equal(idem_call_outcome(holder.c), IDEM_PROCEED);
  }
  for (int i = 0; i < N; i++) {
    idem_id id = {tenant, operation, key};
    waiters[i].w = &ww;
    EXPECT_RC(IDEM_OK, idem_execute_begin_async(f->store, &id, REQ, strlen(REQ),
                                                &ow, async_begun, &waiters[i]));
  }
  /* The caller's id may go once the call returns. */
  memset(tenant, 'T', sizeof tenant - 1);
  memset(operation, 'O', sizeof operation - 1);
  memset(key, 'K', sizeof key - 1);
  /* While the holder holds the key, no waiter is answered: each asks the
   * store several times meanwhile. */
  sleep_ms(600);
  pthread_mutex_lock(&ww.mu);
  int early = ww.answered;
  pthread_mutex_unlock(&ww.mu);
  for (int i = 0; i < N && early; i++)
    if (waiters[i].rc || waiters[i].c)
      print_error("waiter %d answered while held: %s, %s (%s)\n", i,
                  idem_rc_name(waiters[i].rc),
                  idem_outcome_name(idem_call_outcome(waiters[i].c)),
                  waiters[i].msg);
  assert_int_equal(early, 0);

  snprintf(body, sizeof body, "{\"ticket_id\":%d}", 77);
  r.status = 201;
  r.meta = TICKET_META;
  r.meta_len = strlen(TICKET_META);
  r.body = body;
  r.body_len = strlen(body);
  end.w = &w;
  end.c = holder.c;
  EXPECT_RC(IDEM_OK, idem_execute_end_async(holder.x, IDEM_EXEC_DONE, &r,
                                            async_ended, &end));
  async_wait(&w, 1);
  assert_int_equal(end.rc, IDEM_OK);
  async_wait(&ww, N);
  for (int i = 0; i < N; i++) {
    if (waiters[i].rc != IDEM_OK)
      print_error("waiter %d: %s: %s\n", i, idem_rc_name(waiters[i].rc),
                  waiters[i].msg);
    assert_int_equal(waiters[i].rc, IDEM_OK);
    assert_int_equal(idem_call_outcome(waiters[i].c), IDEM_REPLAY);
    assert_null(waiters[i].x);
    assert_int_equal(ticket_id_of(idem_call_response(waiters[i].c)), 77);
    idem_call_free(waiters[i].c);
  }
  idem_call_free(holder.c);
  /* One record, the holder's. */
  assert_int_equal(list_count(f->store, NULL), 1);
}

/* An action during which another caller takes its key over (and acts,
 * and completes): its own ending then fails with IDEM_ESTALE. */
typedef struct overtaken {
  fixture *f;
  const idem_id *id;
  int runs, newer_attempt, newer_rc;
} overtaken;

static idem_exec_result act_while_taken_over(idem_exec *x, void *ctx,
                                             idem_response *r) {
  overtaken *u = ctx;
  idem_response theirs = {201, NULL, 0, "{\"ticket_id\":2}", 15};
  idem_call *newer;
  (void)x;
  u->runs++;
  newer = take_over(u->f, u->id);
  u->newer_attempt = idem_call_attempt(newer);
  u->newer_rc = idem_complete(u->f->store, newer, &theirs);
  idem_call_free(newer);
  r->status = 201;
  r->body = "{\"ticket_id\":1}";
  r->body_len = 15;
  return IDEM_EXEC_DONE;
}

/*
 * idem_execute_options.ran tells, on every return, whether the action
 * ran: 0 when the arguments were refused or the claim failed (*out NULL,
 * the action never called), 1 when the ending failed after it (a response
 * too large to keep, the key taken over while it ran: *out set, the
 * action called once), and on success 1 exactly when it ran (PROCEED, not
 * REPLAY). The same code (IDEM_EINVAL, IDEM_EBUSY...) can come from
 * either side, so the code alone cannot tell. The halves never run an
 * action: idem_execute_begin() and its asynchronous form say 0.
 */
static void test_execute_says_whether_it_ran(void **state) {
  fixture *f = *state;
  idem_id bad_key = {"tenant-a", OPERATION, "bad key"};
  idem_id busy_id = {"tenant-a", OPERATION, "claim-fails"};
  idem_id big_id = {"tenant-a", OPERATION, "too-large-to-keep"};
  idem_id stale_id = {"tenant-a", OPERATION, "taken-while-running"};
  idem_id fresh_id = {"tenant-a", OPERATION, "ran-and-stored"};
  idem_id halves_id = {"tenant-a", OPERATION, "in-two-halves"};
  idem_id async_id = {"tenant-a", OPERATION, "in-two-async-halves"};
  idem_store_options quick = {.busy_timeout_ms = 100, .group_commit = -1};
  int ran = -1;
  idem_execute_options o = {.call = {.lease_ms = 60000}, .ran = &ran};
  overtaken u = {f, &stale_id, 0, 0, 0};
  remote a = {0};
  idem_store *s = NULL;
  idem_record *rec;
  idem_exec *x = NULL;
  idem_call *c;
  blocker b;

  /* Refused before anything is claimed. */
  c = EXECUTE(f->store, &bad_key, REQ, &a, &o, IDEM_EKEY, 0);
  assert_null(c);
  assert_int_equal(ran, 0);
  ran = -1;
  c = EXECUTE(f->store, &busy_id, "{\"a\":", &a, &o, IDEM_EJSON, 0);
  assert_null(c);
  assert_int_equal(ran, 0);
  assert_int_equal(a.runs, 0);

  /* The claim fails: the store is locked past its busy timeout. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &quick, &s));
  blocker_start(&b, f->url, 1000);
  ran = -1;
  c = EXECUTE(s, &busy_id, REQ, &a, &o, IDEM_EBUSY, 0);
  blocker_join(&b);
  assert_null(c);
  assert_int_equal(ran, 0);
  assert_int_equal(a.runs, 0);
  assert_absent(s, &busy_id);
  idem_store_close(s);
  if (!is_pg_url(f->url)) {
    /* SQLite: a store opened for reading refuses the claim's write. */
    idem_store_options ro = {.read_only = 1};
    EXPECT_RC(IDEM_OK, idem_store_open(f->url, &ro, &s));
    ran = -1;
    c = EXECUTE(s, &busy_id, REQ, &a, &o, IDEM_ESTORE, 0);
    assert_null(c);
    assert_int_equal(ran, 0);
    assert_int_equal(a.runs, 0);
    idem_store_close(s);
  }

  /* The ending fails after the action: a response too large to keep. */
  a.big = IDEM_MAX_RESPONSE + 1;
  ran = -1;
  c = EXECUTE(f->store, &big_id, REQ, &a, &o, IDEM_ETOOBIG, IDEM_PROCEED);
  assert_int_equal(ran, 1);
  assert_int_equal(a.runs, 1);
  assert_int_equal(idem_call_state(c), IDEM_STATE_UNKNOWN);
  idem_call_free(c);
  free(a.big_body);
  a.big_body = NULL;
  a.big = 0;

  /* ...and the key taken over while the action ran. */
  ran = -1;
  c = NULL;
  EXPECT_RC(IDEM_ESTALE, idem_execute(f->store, &stale_id, REQ, strlen(REQ),
                                      act_while_taken_over, &u, &o, &c));
  assert_int_equal(ran, 1);
  assert_int_equal(u.runs, 1);
  assert_int_equal(u.newer_attempt, 2);
  EXPECT_RC(IDEM_OK, u.newer_rc);
  assert_non_null(c);
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(idem_call_state(c), 0);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  rec = get_record(f->store, &stale_id);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec->attempt, 2);
  assert_int_equal(ticket_id_of(&rec->response), 2);
  idem_record_free(rec);

  /* Success: 1 when the action ran, 0 when a replay answered. The
   * remote's second ticket: the first went with the response too large. */
  ran = -1;
  c = EXECUTE(f->store, &fresh_id, REQ, &a, &o, IDEM_OK, IDEM_PROCEED);
  assert_int_equal(ran, 1);
  assert_int_equal(a.runs, 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  ran = -1;
  c = EXECUTE(f->store, &fresh_id, REQ, &a, &o, IDEM_OK, IDEM_REPLAY);
  assert_int_equal(ran, 0);
  assert_int_equal(a.runs, 2);
  assert_int_equal(a.next_ticket, 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);

  /* The halves: the caller runs the action, the library says 0. */
  ran = -1;
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &halves_id, REQ, strlen(REQ),
                                        &o, &x, &c));
  assert_int_equal(ran, 0);
  assert_non_null(x);
  {
    idem_response r = {201, NULL, 0, "{\"ticket_id\":3}", 15};
    EXPECT_RC(IDEM_OK, idem_execute_end(x, IDEM_EXEC_DONE, &r));
  }
  assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
  idem_call_free(c);
  {
    async_waiter w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    async_slot begun = {.w = &w}, ended = {.w = &w};
    idem_response r = {201, NULL, 0, "{\"ticket_id\":4}", 15};
    ran = -1;
    EXPECT_RC(IDEM_OK,
              idem_execute_begin_async(f->store, &async_id, REQ, strlen(REQ),
                                       &o, async_begun, &begun));
    assert_int_equal(ran, 0);
    async_wait(&w, 1);
    EXPECT_RC(IDEM_OK, begun.rc);
    assert_non_null(begun.x);
    ended.c = begun.c;
    EXPECT_RC(IDEM_OK, idem_execute_end_async(begun.x, IDEM_EXEC_DONE, &r,
                                              async_ended, &ended));
    async_wait(&w, 1);
    EXPECT_RC(IDEM_OK, ended.rc);
    assert_int_equal(idem_call_state(begun.c), IDEM_STATE_COMPLETED);
    idem_call_free(begun.c);
  }
  /* Records of what ran and ended: the stale key's (the newer holder's),
   * the stored ticket and the two halves'; the too large response's key
   * marked unknown. Nothing of the claims that failed. */
  assert_absent(f->store, &busy_id);
  assert_int_equal(list_count(f->store, NULL), 5);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest tests[] = {
      STORE_TEST(test_execute_outcomes),
      STORE_TEST(test_execute_endings),
      STORE_TEST(test_execute_renews_while_running),
      STORE_TEST(test_execute_lease_lost),
      STORE_TEST(test_execute_response_too_large),
      STORE_TEST(test_execute_retries_busy_completion),
      STORE_TEST(test_execute_completion_fails_for_good),
      STORE_TEST(test_execute_fingerprint_pointers),
      STORE_TEST(test_execute_completes_after_lease_lost),
      STORE_TEST(test_execute_largest_retry_budget),
      STORE_TEST(test_execute_abandon),
      STORE_TEST(test_execute_ending_already_stored),
      STORE_TEST(test_execute_in_two_halves),
      STORE_TEST(test_execute_end_after_takeover),
      STORE_TEST(test_execute_says_whether_it_ran),
      STORE_TEST(test_execute_canonical_request_kept),
      STORE_TEST(test_execute_forget_request),
      STORE_TEST(test_execute_given_fingerprint),
      STORE_TEST(test_execute_async),
      STORE_TEST(test_execute_async_waits),
  };
  const struct CMUnitTest sqlite_only[] = {
      STORE_TEST(test_execute_renews_from_the_write),
  };
  return run_engine_tests("execute", tests, sizeof tests / sizeof tests[0],
                          sqlite_only,
                          sizeof sqlite_only / sizeof sqlite_only[0], NULL, 0);
}
