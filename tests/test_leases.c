/*
 * test_leases.c -- leases, retention and attempts: when a holder's lease
 * starts and ends, the bounds of every period, what retention may and may
 * not remove, the retry limit per key, and the operators' calls that touch
 * a holder (resolve, delete). One suite for every backend, as
 * test_engine.c; IDEM_TEST_STORE selects it.
 */
#include "engine_harness.c"

/*
 * A claim that waits 1.5 s for the write lock, with a 10 s lease, must hold
 * a lease of 10 s from when it was written: a second caller right after it
 * sees it in flight. A lease counted from before the wait would end 1.5 s
 * early, and a second caller then would take over and act too. (The lease
 * is long so that a loaded machine, slow to answer after the write, cannot
 * end it before the second caller asks.)
 */
static void test_lease_counts_from_the_write(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "waits-for-the-lock"};
  idem_call_options second = {.lease_ms = 10000};
  idem_call *c, *other;
  blocker b;
  int64_t asked, answered, expires;
  fp_of(PAYLOAD, fp);

  blocker_start(&b, f->url, 1500);
  asked = now_ms();
  c = CLAIM(f->store, &id, fp, &second, IDEM_PROCEED);
  answered = now_ms();
  blocker_join(&b);
  /* The claim did wait for the lock. */
  assert_true(answered - asked >= 1200);
  expires = idem_call_lease_expires_ms(c);
  /* The lease runs from the write, after the wait (which began at asked
   * and lasted while the blocker held the lock), never from when the claim
   * was asked: that one would end by asked + 10 s. */
  assert_true(expires >= asked + 10000 + 200);
  assert_true(expires <= answered + 10100);
  other = CLAIM(f->store, &id, fp, &second, IDEM_IN_FLIGHT);
  assert_in_range(idem_call_retry_after_ms(other), 1, 10100);
  idem_call_free(other);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/*
 * The same when what the claim waits for is a local action on the same key
 * that runs 1.5 s and is then rejected (rolled back): the claim proceeds
 * once it is gone, and its lease runs from then.
 */
typedef struct slow_reject {
  idem_store *store;
  const idem_id *id;
  const char *fp;
  int started, rc;
  pthread_mutex_t mu;
  pthread_cond_t cv;
} slow_reject;

static int sleep_then_reject(void *conn, void *ctx, idem_response *r) {
  slow_reject *w = ctx;
  (void)conn;
  (void)r;
  pthread_mutex_lock(&w->mu);
  w->started = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  sleep_ms(1500);
  return 1; /* rejected: nothing of it is kept */
}

static void *slow_reject_main(void *arg) {
  slow_reject *w = arg;
  idem_call *c = NULL;
  w->rc = idem_execute_local(w->store, w->id, w->fp, NULL, sleep_then_reject,
                             w, &c);
  idem_call_free(c);
  return NULL;
}

static void test_lease_after_rejected_local_action(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "after-a-rejected-action"};
  idem_call_options second = {.lease_ms = 1000};
  slow_reject w;
  pthread_t t;
  idem_call *c, *other;
  int64_t answered;
  fp_of(PAYLOAD, fp);
  memset(&w, 0, sizeof w);
  w.store = f->store;
  w.id = &id;
  w.fp = fp;
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  assert_int_equal(pthread_create(&t, NULL, slow_reject_main, &w), 0);
  pthread_mutex_lock(&w.mu);
  while (!w.started)
    pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  sleep_ms(100);
  /* SQLite: the claim waits for the action's write lock. PostgreSQL: the
   * action writes its record after it ran, so the claim goes first and the
   * action, finding the key taken, is rolled back. Either way the claim
   * holds a whole lease from its answer. */
  c = CLAIM(f->store, &id, fp, &second, IDEM_PROCEED);
  answered = now_ms();
  assert_true(idem_call_lease_expires_ms(c) >= answered + 500);
  other = CLAIM(f->store, &id, fp, &second, IDEM_IN_FLIGHT);
  idem_call_free(other);
  pthread_join(t, NULL);
  assert_true(w.rc == IDEM_EREJECTED || w.rc == IDEM_OK);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
}

/* The deadline a holder is told follows its claim and its renewals. */
static void test_lease_deadline_accessor(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call_options opts = {.lease_ms = 20000};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  idem_record *rec;
  idem_call *c, *other;
  int64_t t0, e1, e2;
  fp_of(PAYLOAD, fp);

  t0 = now_ms();
  c = CLAIM(f->store, &id, fp, &opts, IDEM_PROCEED);
  e1 = idem_call_lease_expires_ms(c);
  assert_in_range(e1, t0 + 19000, t0 + 21000);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->lease_expires_ms, e1);
  idem_record_free(rec);
  /* Outcomes that hold nothing have no lease. */
  other = CLAIM(f->store, &id, fp, NULL, IDEM_IN_FLIGHT);
  assert_int_equal(idem_call_lease_expires_ms(other), 0);
  idem_call_free(other);

  sleep_ms(20);
  EXPECT_RC(IDEM_OK, idem_renew(f->store, c, 60000));
  e2 = idem_call_lease_expires_ms(c);
  assert_true(e2 >= e1 + 39000);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->lease_expires_ms, e2);
  idem_record_free(rec);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  assert_int_equal(idem_call_lease_expires_ms(c), 0);
  idem_call_free(c);
}

/*
 * A renewal that is not stored leaves the holder's deadline as it was: a
 * holder told of a lease it does not have would act past the real one.
 * SQLite: a commit hook, set on the store's own connection by a local
 * action, makes the renewal's commit fail.
 */
static int refuse_commits; /* read by the hook, on the test's thread */

static int commit_hook(void *arg) { return *(int *)arg; }

static int install_commit_hook(void *conn, void *ctx, idem_response *r) {
  (void)ctx;
  sqlite3_commit_hook(conn, commit_hook, &refuse_commits);
  r->status = 200;
  return 0;
}

static void test_failed_renewal_keeps_deadline(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id hook = {"tenant-a", OPERATION, "installs-a-hook"};
  idem_call_options opts = {.lease_ms = 20000};
  idem_record *rec;
  idem_call *c, *h = NULL;
  int64_t e1;
  fp_of(PAYLOAD, fp);

  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &hook, fp, NULL,
                                        install_commit_hook, NULL, &h));
  idem_call_free(h);
  c = CLAIM(f->store, &id, fp, &opts, IDEM_PROCEED);
  e1 = idem_call_lease_expires_ms(c);
  refuse_commits = 1;
  assert_int_not_equal(idem_renew(f->store, c, IDEM_MAX_LEASE_MS), IDEM_OK);
  refuse_commits = 0;
  rec = get_record(f->store, &id);
  assert_int_equal(rec->lease_expires_ms, e1);
  idem_record_free(rec);
  assert_int_equal(idem_call_lease_expires_ms(c), e1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/* ------------------------------------------------------------------ */
/* Bounds                                                               */
/* ------------------------------------------------------------------ */

static void test_period_bounds(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "kept-for-a-century"};
  idem_id held = {"tenant-a", OPERATION, "held-for-a-month"};
  idem_call_options forever = {.retention_ms = INT64_MAX};
  idem_call_options huge_lease = {.lease_ms = INT64_MAX};
  idem_call_options past_lease = {.lease_ms = IDEM_MAX_LEASE_MS + 1};
  idem_call_options past_ret = {.retention_ms = IDEM_MAX_RETENTION_MS + 1};
  idem_call_options century = {.retention_ms = IDEM_MAX_RETENTION_MS};
  idem_call_options month = {.lease_ms = IDEM_MAX_LEASE_MS};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_call *c = NULL;
  idem_record *rec;
  int64_t t;
  fp_of(PAYLOAD, fp);

  /* Past the bounds: refused, with a message, and nothing written. */
  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, fp, &forever, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "IDEM_MAX_RETENTION_MS"));
  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, fp, &huge_lease, &c));
  assert_non_null(strstr(idem_errmsg(), "IDEM_MAX_LEASE_MS"));
  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, fp, &past_lease, &c));
  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, fp, &past_ret, &c));
  EXPECT_RC(IDEM_EINVAL, idem_execute_local(f->store, &id, fp, &forever,
                                            create_ticket, &act, &c));
  assert_int_equal(act.runs, 0);
  assert_absent(f->store, &id);

  /* At the bounds: a century of retention replays, never proceeds. */
  t = now_ms();
  c = LOCAL(f->store, &id, fp, &century, &act, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &id);
  assert_true(rec->expires_ms >= t + IDEM_MAX_RETENTION_MS - 1000);
  idem_record_free(rec);
  c = LOCAL(f->store, &id, fp, &century, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(again.runs, 0);
  assert_int_equal(count_tickets(f->url), 1);

  /* A month's lease keeps others out for a month, and renewals are bounded
   * the same way. */
  c = CLAIM(f->store, &held, fp, &month, IDEM_PROCEED);
  {
    idem_call *o = CLAIM(f->store, &held, fp, NULL, IDEM_IN_FLIGHT);
    assert_true(idem_call_retry_after_ms(o) > IDEM_MAX_LEASE_MS - 60000);
    idem_call_free(o);
  }
  EXPECT_RC(IDEM_EINVAL, idem_renew(f->store, c, INT64_MAX));
  EXPECT_RC(IDEM_EINVAL, idem_renew(f->store, c, -5));
  EXPECT_RC(IDEM_OK, idem_renew(f->store, c, IDEM_MAX_LEASE_MS));
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  idem_call_free(c);
}

/* ------------------------------------------------------------------ */
/* What retention applies to                                            */
/* ------------------------------------------------------------------ */

/* A record marked unknown waits for an operator, however old it is. */
static void test_unknown_never_expires(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "unknown-outcome"};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_filter overdue = {.overdue = 1};
  ticket_action act = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c;
  int64_t removed = -1;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  c = CLAIM(f->store, &id, fp, &keep, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  sleep_ms(PAST_SHORT_MS);

  c = CLAIM(f->store, &id, fp, &keep, IDEM_UNKNOWN);
  assert_int_equal(idem_call_attempt(c), 1);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, &keep, &act, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(act.runs, 0);
  /* Another request under the key still conflicts with it. */
  c = CLAIM(f->store, &id, fp2, NULL, IDEM_CONFLICT);
  idem_call_free(c);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  idem_record_free(rec);
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 0);
  assert_int_equal(list_count(f->store, NULL), 1);
  assert_int_equal(list_count(f->store, &overdue), 1);
  assert_int_equal(count_tickets(f->url), 0);

  /* The operator settles it; then it is an ordinary completed record. */
  idem_response resp = {200, NULL, 0, "settled", 7};
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &id, &resp));
  assert_int_equal(list_count(f->store, &overdue), 0);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
}

/* A holder that died past its retention is taken over, as attempt 2: an
 * earlier attempt may have acted, and the caller must be told so. */
static void test_abandoned_holder_never_expires(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "abandoned"};
  idem_id done = {"tenant-a", OPERATION, "completed"};
  idem_call_options both_short = {.retention_ms = SHORT_MS,
                                  .lease_ms = SHORT_MS};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_call_options report = {.on_expired_lease = IDEM_EXPIRED_REPORT};
  idem_filter overdue = {.overdue = 1};
  idem_filter with_expired = {.expired = 1};
  ticket_action act = {.payload = PAYLOAD};
  idem_call *dead, *c;
  int64_t removed = -1;
  fp_of(PAYLOAD, fp);

  dead = CLAIM(f->store, &id, fp, &both_short, IDEM_PROCEED);
  c = LOCAL(f->store, &done, fp, &keep, &act, IDEM_PROCEED);
  idem_call_free(c);
  sleep_ms(PAST_SHORT_MS);

  /* Prune removes the expired completed record only. */
  assert_int_equal(list_count(f->store, &overdue), 1);
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 1);
  assert_absent(f->store, &done);
  assert_int_equal(list_count(f->store, &with_expired), 1);

  c = CLAIM(f->store, &id, fp, &report, IDEM_UNKNOWN);
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  /* Taken over, it is held again and no longer overdue. */
  assert_int_equal(list_count(f->store, &overdue), 0);
  EXPECT_RC(IDEM_ESTALE, idem_mark_unknown(f->store, dead));
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  idem_call_free(dead);
}

/* ------------------------------------------------------------------ */
/* Attempts                                                             */
/* ------------------------------------------------------------------ */

/*
 * A holder that took a key over (RECOVER) and releases it knows only that
 * its own attempt did not act: the earlier attempt may have. The next
 * caller must still be told so, RECOVER (attempt 3) or UNKNOWN, never
 * PROCEED as on a fresh key, or a second effect happens without anyone
 * being warned (found by the kill -9 campaign, tests/chaos). The same
 * through idem_execute() with an action that answers NOT_DONE after
 * RECOVER; and a record marked unknown that a holder took over and
 * released is unknown again.
 */
static idem_exec_result did_not_act(idem_exec *x, void *ctx,
                                    idem_response *r) {
  int *runs = ctx;
  (*runs)++;
  assert_int_equal(idem_exec_outcome(x), IDEM_RECOVER);
  return IDEM_EXEC_NOT_DONE;
}

static void test_release_after_takeover_still_warns(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "released-after-takeover"};
  idem_id ex = {"tenant-a", OPERATION, "not-done-after-takeover"};
  idem_id unk = {"tenant-a", OPERATION, "unknown-taken-over"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  idem_call_options report = {.on_expired_lease = IDEM_EXPIRED_REPORT};
  idem_call_options take_unknown = {.takeover_unknown = 1};
  idem_execute_options eo = {.call = {.lease_ms = SHORT_MS}};
  idem_record *rec;
  idem_call *first, *second, *c;
  int runs = 0;
  fp_of(PAYLOAD, fp);

  /* The first holder may have acted, then died. */
  first = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  second = CLAIM(f->store, &id, fp, &brief, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(second), 2);
  EXPECT_RC(IDEM_OK, idem_release(f->store, second));
  idem_call_free(second);
  c = CLAIM(f->store, &id, fp, &report, IDEM_UNKNOWN);
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 3);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, first, &(idem_response){0}));
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  idem_call_free(first);

  /* idem_execute(): NOT_DONE after RECOVER. Its fingerprint is that of
   * the canonical request. */
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
  first = CLAIM(f->store, &ex, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &ex, PAYLOAD, strlen(PAYLOAD),
                                  did_not_act, &runs, &eo, &c));
  assert_int_equal(runs, 1);
  assert_int_equal(idem_call_outcome(c), IDEM_RECOVER);
  idem_call_free(c);
  c = CLAIM(f->store, &ex, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 3);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  idem_call_free(first);

  /* Unknown, taken over, released: unknown again. */
  fp_of(PAYLOAD, fp);
  c = CLAIM(f->store, &unk, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  c = CLAIM(f->store, &unk, fp, &take_unknown, IDEM_RECOVER);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  rec = get_record(f->store, &unk);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  idem_record_free(rec);
  c = CLAIM(f->store, &unk, fp, NULL, IDEM_UNKNOWN);
  idem_call_free(c);
}

static void test_max_attempts(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "flaky"};
  idem_call_options limit = {.lease_ms = SHORT_MS, .max_attempts = 2};
  idem_call_options bad = {.max_attempts = -1};
  idem_record *rec;
  idem_call *c1, *c2, *c3 = NULL;
  fp_of(PAYLOAD, fp);

  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, fp, &bad, &c3));
  c1 = CLAIM(f->store, &id, fp, &limit, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c2 = CLAIM(f->store, &id, fp, &limit, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c2), 2);
  sleep_ms(PAST_SHORT_MS);
  /* A third attempt would pass the limit: the key waits for an operator,
   * and nothing is written. */
  c3 = CLAIM(f->store, &id, fp, &limit, IDEM_UNKNOWN);
  assert_int_equal(idem_call_attempt(c3), 2);
  idem_call_free(c3);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->attempt, 2);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
  /* Without the limit the same key is taken over. */
  c3 = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c3), 3);
  EXPECT_RC(IDEM_ESTALE, idem_release(f->store, c2));
  EXPECT_RC(IDEM_OK, idem_release(f->store, c3));
  idem_call_free(c1);
  idem_call_free(c2);
  idem_call_free(c3);
}

/* ------------------------------------------------------------------ */
/* Operators                                                            */
/* ------------------------------------------------------------------ */

static void test_delete_corrupted_record(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_store *fresh = NULL;
  idem_store_options no_cache = {.replay_cache_entries = -1};
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(side_sql(f->url, sql_of_backend()->corrupt_body, KEY), 1);
  /* A handle without a replay cache reads the store every time. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &no_cache, &fresh));
  EXPECT_RC(IDEM_ECORRUPT, idem_claim(fresh, &id, fp, NULL, &c));
  assert_null(c);
  EXPECT_RC(IDEM_OK, idem_delete(fresh, &id));
  assert_string_equal(idem_errmsg(), "");
  assert_absent(fresh, &id);
  EXPECT_RC(IDEM_ENOTFOUND, idem_delete(fresh, &id));
  c = LOCAL(fresh, &id, fp, NULL, &again, IDEM_PROCEED);
  assert_int_equal(again.runs, 1);
  idem_call_free(c);
  idem_store_close(fresh);
}

/*
 * A deleted record is gone for the handle that deleted it, even after that
 * handle replayed it (and so keeps it in its replay cache): the key acts
 * again, and another request under it is no conflict.
 */
static void test_delete_forgets_cached_replay(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id other = {"tenant-a", OPERATION, "another-key"};
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  ticket_action urgent = {.payload = PAYLOAD_URGENT};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &other, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  c = CLAIM(f->store, &other, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_delete(f->store, &id));
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(again.runs, 1);
  EXPECT_RC(IDEM_OK, idem_delete(f->store, &other));
  c = LOCAL(f->store, &other, fp2, NULL, &urgent, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(urgent.runs, 1);
  assert_int_equal(count_tickets(f->url), 4);
}

/* A successful call leaves no stale detail behind. */
/* A store's scheme may be written in any case. */
static void test_scheme_in_any_case(void **state) {
  fixture *f = *state;
  char url[URL_MAX + 16];
  idem_store *s = NULL;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  if (is_pg_url(f->url))
    snprintf(url, sizeof url, "POSTGRESQL%s", strchr(f->url, ':'));
  else
    snprintf(url, sizeof url, "SQLITE:%s", sqlite_path(f->url));
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  assert_string_equal(idem_store_backend(s),
                      is_pg_url(f->url) ? "postgresql" : "sqlite");
  /* The same store as the fixture's: a claim there is seen here. */
  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  idem_call_free(c);
  c = CLAIM(s, &id, fp, NULL, IDEM_IN_FLIGHT);
  idem_call_free(c);
  idem_store_close(s);
}

static int look_up_absent(const idem_record *r, void *ctx) {
  idem_id absent = {r->tenant, r->operation, "no-such-key"};
  idem_record *got = NULL;
  idem_get(ctx, &absent, &got); /* IDEM_ENOTFOUND, and a detail */
  idem_record_free(got);
  return 0;
}

static void test_errmsg_cleared_on_success(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  prime_errmsg(primed, sizeof primed);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  assert_string_equal(idem_errmsg(), "");
  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  assert_string_equal(idem_errmsg(), "");
  idem_call_free(c);
  prime_errmsg(primed, sizeof primed);
  assert_int_equal(list_count(f->store, NULL), 0);
  assert_string_equal(idem_errmsg(), "");
  /* Also when the listing's function met a failure of its own and went
   * on: the listing itself succeeded. */
  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_list(f->store, NULL, look_up_absent, f->store));
  assert_string_equal(idem_errmsg(), "");
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/* The listing holds no connection while the caller's function runs: with
 * a pool of one, the function may call the store itself. */
typedef struct reentrant {
  idem_store *store;
  int seen, got;
} reentrant;

static int reenter_cb(const idem_record *r, void *ctx) {
  reentrant *w = ctx;
  idem_id id = {r->tenant, r->operation, r->key};
  idem_record *again = NULL;
  w->seen++;
  if (idem_get(w->store, &id, &again) == IDEM_OK &&
      strcmp(again->key, r->key) == 0)
    w->got++;
  idem_record_free(again);
  return 0;
}

static void test_list_with_one_connection(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], key[32];
  idem_store_options one = {.max_connections = 1, .group_commit = -1};
  idem_store *s = NULL;
  reentrant w = {0};
  idem_filter first = {.limit = 300};
  fp_of(PAYLOAD, fp);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &one, &s));
  /* More than one page. */
  for (int i = 0; i < 600; i++) {
    idem_id id = {"tenant-a", OPERATION, key};
    idem_call *c;
    snprintf(key, sizeof key, "key-%04d", i);
    c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
    idem_call_free(c);
  }
  w.store = s;
  alarm(60); /* a deadlock fails the test instead of hanging it */
  EXPECT_RC(IDEM_OK, idem_list(s, NULL, reenter_cb, &w));
  assert_int_equal(w.seen, 600);
  assert_int_equal(w.got, 600);
  memset(&w, 0, sizeof w);
  w.store = s;
  EXPECT_RC(IDEM_OK, idem_list(s, &first, reenter_cb, &w));
  alarm(0);
  assert_int_equal(w.seen, 300);
  idem_store_close(s);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest tests[] = {
      STORE_TEST(test_lease_counts_from_the_write),
      STORE_TEST(test_lease_after_rejected_local_action),
      STORE_TEST(test_lease_deadline_accessor),
      STORE_TEST(test_period_bounds),
      STORE_TEST(test_unknown_never_expires),
      STORE_TEST(test_abandoned_holder_never_expires),
      STORE_TEST(test_max_attempts),
      STORE_TEST(test_release_after_takeover_still_warns),
      STORE_TEST(test_delete_corrupted_record),
      STORE_TEST(test_errmsg_cleared_on_success),
      STORE_TEST(test_scheme_in_any_case),
      STORE_TEST(test_list_with_one_connection),
      STORE_TEST(test_delete_forgets_cached_replay),
  };
  const struct CMUnitTest sqlite_only[] = {
      STORE_TEST(test_failed_renewal_keeps_deadline),
  };
  return run_engine_tests("leases", tests, sizeof tests / sizeof tests[0],
                          sqlite_only,
                          sizeof sqlite_only / sizeof sqlite_only[0], NULL,
                          0);
}
