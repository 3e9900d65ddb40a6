/*
 * test_recovered.c -- a response completed by a holder that took the key
 * over (outcome RECOVER: an earlier attempt may also have acted) is kept
 * with that mark, and every replay carries it: from the store, from the
 * replay cache, through idem_get() and idem_list(); a first run's is not
 * marked, nor an operator's resolution of a key that had one attempt.
 * One suite for every backend; IDEM_TEST_STORE selects it (see
 * engine_harness.c).
 */
#include "engine_harness.c"

static const idem_response done_resp = {
    201, TICKET_META, sizeof TICKET_META - 1, "{\"ticket_id\":7}", 15};

/* Removes a record behind the library's back (a side connection), so that
 * only a replay cache can still answer for it. */
static void delete_behind(const char *url, const char *key) {
  const char *sql = backend_from_env() == BACKEND_POSTGRESQL
                        ? "DELETE FROM {S}.idem_records WHERE key = $1::text"
                        : "DELETE FROM idem_records WHERE key = ?1";
  assert_int_equal(side_sql(url, sql, key), 1);
}

/* A second handle on the store without a replay cache: every replay it
 * answers was read from the store. */
static idem_store *open_uncached(const char *url) {
  idem_store_options o = {.replay_cache_entries = -1};
  idem_store *s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(url, &o, &s));
  return s;
}

/* Claims id expecting REPLAY of done_resp; returns the call's mark. */
static int replay_mark(idem_store *s, const idem_id *id, const char *fp,
                       int line) {
  idem_call *c = claim_expect(s, id, fp, NULL, IDEM_REPLAY, line);
  int marked = idem_call_recovered(c);
  assert_response_equal(idem_call_response(c), &done_resp);
  idem_call_free(c);
  return marked;
}
#define REPLAY_MARK(s, id, fp) replay_mark((s), (id), (fp), __LINE__)

/* idem_get()'s mark, and its attempt in *attempt. */
static int record_mark(idem_store *s, const idem_id *id, int *attempt) {
  idem_record *r = get_record(s, id);
  int marked = r->recovered;
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  if (attempt)
    *attempt = r->attempt;
  idem_record_free(r);
  return marked;
}

typedef struct marks {
  const char *key;
  int found, recovered, attempt;
} marks;

static int marks_cb(const idem_record *r, void *ctx) {
  marks *m = ctx;
  if (strcmp(r->key, m->key) == 0) {
    m->found++;
    m->recovered = r->recovered;
    m->attempt = r->attempt;
  }
  return 0;
}

/* idem_list()'s mark for key. */
static int listed_mark(idem_store *s, const char *key) {
  marks m = {key, 0, -1, 0};
  EXPECT_RC(IDEM_OK, idem_list(s, NULL, marks_cb, &m));
  assert_int_equal(m.found, 1);
  return m.recovered;
}

/* ------------------------------------------------------------------ */

/* A first run's completion is not marked, anywhere. */
static void test_first_run_not_recovered(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "first-run"};
  idem_store *uncached = open_uncached(f->url);
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(c), 0);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 0);
  assert_int_equal(REPLAY_MARK(f->store, &id, fp), 0); /* from the store */
  assert_int_equal(REPLAY_MARK(f->store, &id, fp), 0); /* from the cache */
  assert_int_equal(record_mark(f->store, &id, NULL), 0);
  assert_int_equal(listed_mark(f->store, "first-run"), 0);
  assert_int_equal(idem_call_recovered(NULL), 0);
  idem_store_close(uncached);
}

/*
 * The holder that took over an expired lease is told RECOVER and its call
 * says recovered from the claim on; the response it completes is marked:
 * a replay read from the store says so, a replay answered from the cache
 * (the record is gone from the store by then) says so, idem_get() and
 * idem_list() say so. Other outcomes on that key (a conflict) do not.
 */
static void test_recover_holder_completion_marked(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], other[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "taken-over"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  idem_store *uncached = open_uncached(f->url);
  idem_call *first, *second, *c;
  int attempt = 0;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, other);

  first = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(first), 0);
  sleep_ms(PAST_SHORT_MS);
  second = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(second), 2);
  assert_int_equal(idem_call_recovered(second), 1);
  /* In flight meanwhile: not a replay, not marked. */
  c = CLAIM(uncached, &id, fp, NULL, IDEM_IN_FLIGHT);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, second, &done_resp));
  assert_int_equal(idem_call_recovered(second), 1);
  idem_call_free(second);
  EXPECT_RC(IDEM_ESTALE,
            idem_complete(f->store, first, &(idem_response){.status = 500}));
  idem_call_free(first);

  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 1);
  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 1);
  assert_int_equal(record_mark(f->store, &id, &attempt), 1);
  assert_int_equal(attempt, 2);
  assert_int_equal(listed_mark(f->store, "taken-over"), 1);
  c = CLAIM(uncached, &id, other, NULL, IDEM_CONFLICT);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);

  /* Read once through the cached handle, then gone from the store: only
   * its cache can answer, and it says recovered too. */
  assert_int_equal(REPLAY_MARK(f->store, &id, fp), 1);
  delete_behind(f->url, "taken-over");
  assert_int_equal(REPLAY_MARK(f->store, &id, fp), 1);
  c = CLAIM(uncached, &id, fp, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(c), 0);
  EXPECT_RC(IDEM_OK, idem_release(uncached, c));
  idem_call_free(c);
  idem_store_close(uncached);
}

/* A record marked unknown and taken over (takeover_unknown): the same. */
static void test_takeover_of_unknown_marked(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "unknown-taken-over"};
  idem_call_options take_unknown = {.takeover_unknown = 1};
  idem_store *uncached = open_uncached(f->url);
  idem_call *c;
  int attempt = 0;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_UNKNOWN);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, &take_unknown, IDEM_RECOVER);
  assert_int_equal(idem_call_recovered(c), 1);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  idem_call_free(c);
  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 1);
  assert_int_equal(record_mark(uncached, &id, &attempt), 1);
  assert_int_equal(attempt, 2);
  idem_store_close(uncached);
}

/* A local action after RECOVER: its call and its record are marked; a
 * first run's are not. */
static void test_local_action_after_recover_marked(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "local-recovered"};
  idem_id fresh = {"tenant-a", OPERATION, "local-first"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD},
                first = {.payload = PAYLOAD},
                first_again = {.payload = PAYLOAD};
  idem_store *uncached = open_uncached(f->url);
  idem_call *dead, *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);

  dead = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_RECOVER);
  assert_int_equal(idem_call_recovered(c), 1);
  assert_int_equal(idem_call_attempt(c), 2);
  idem_call_free(c);
  assert_int_equal(act.runs, 1);
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);
  c = CLAIM(uncached, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);
  assert_int_equal(again.runs, 0);
  r = get_record(uncached, &id);
  assert_int_equal(r->recovered, 1);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
  idem_call_free(dead);

  c = LOCAL(f->store, &fresh, fp, NULL, &first, IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  c = LOCAL(f->store, &fresh, fp, NULL, &first_again, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  c = CLAIM(uncached, &fresh, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  r = get_record(uncached, &fresh);
  assert_int_equal(r->recovered, 0);
  idem_record_free(r);
  assert_int_equal(count_tickets(f->url), 2);
  idem_store_close(uncached);
}

static idem_exec_result acted(idem_exec *x, void *ctx, idem_response *r) {
  int *runs = ctx;
  (void)x;
  (*runs)++;
  *r = done_resp;
  return IDEM_EXEC_DONE;
}

/* idem_execute() after RECOVER: its call says recovered, and so does every
 * replay of what it stored. */
static void test_execute_after_recover_marked(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "execute-recovered"};
  idem_id fresh = {"tenant-a", OPERATION, "execute-first"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  idem_store *uncached = open_uncached(f->url);
  idem_call *dead, *c = NULL;
  int runs = 0;
  /* idem_execute() fingerprints the canonical request. */
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));

  dead = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, PAYLOAD, strlen(PAYLOAD),
                                  acted, &runs, NULL, &c));
  assert_int_equal(runs, 1);
  assert_int_equal(idem_call_outcome(c), IDEM_RECOVER);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);
  idem_call_free(dead);
  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 1);
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, PAYLOAD, strlen(PAYLOAD),
                                  acted, &runs, NULL, &c));
  assert_int_equal(runs, 1);
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);

  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &fresh, PAYLOAD, strlen(PAYLOAD),
                                  acted, &runs, NULL, &c));
  assert_int_equal(runs, 2);
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  assert_int_equal(REPLAY_MARK(uncached, &fresh, fp), 0);
  idem_store_close(uncached);
}

/*
 * An operator's resolution with a response is marked when the record had
 * more than one attempt (two attempts may have acted), and not when it had
 * one: marked unknown by its only holder, or in progress with the lease of
 * its only holder over.
 */
static void test_resolve_marks_by_attempts(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id one = {"tenant-a", OPERATION, "resolved-one-attempt"};
  idem_id dead_one = {"tenant-a", OPERATION, "resolved-dead-holder"};
  idem_id two = {"tenant-a", OPERATION, "resolved-two-attempts"};
  idem_id dead_two = {"tenant-a", OPERATION, "resolved-dead-recoverer"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  idem_store *uncached = open_uncached(f->url);
  idem_call *c, *d1, *d2, *d3;
  int attempt = 0;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &one, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  d1 = CLAIM(f->store, &dead_one, fp, &brief, IDEM_PROCEED);
  d2 = CLAIM(f->store, &two, fp, &brief, IDEM_PROCEED);
  d3 = CLAIM(f->store, &dead_two, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c = CLAIM(f->store, &two, fp, NULL, IDEM_RECOVER);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  c = CLAIM(f->store, &dead_two, fp, &brief, IDEM_RECOVER);
  idem_call_free(c); /* dies holding it */
  sleep_ms(PAST_SHORT_MS);

  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &one, &done_resp));
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &dead_one, &done_resp));
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &two, &done_resp));
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &dead_two, &done_resp));
  assert_int_equal(REPLAY_MARK(uncached, &one, fp), 0);
  assert_int_equal(record_mark(uncached, &one, &attempt), 0);
  assert_int_equal(attempt, 1);
  assert_int_equal(REPLAY_MARK(uncached, &dead_one, fp), 0);
  assert_int_equal(REPLAY_MARK(uncached, &two, fp), 1);
  assert_int_equal(record_mark(uncached, &two, &attempt), 1);
  assert_int_equal(attempt, 2);
  assert_int_equal(REPLAY_MARK(uncached, &dead_two, fp), 1);
  assert_int_equal(REPLAY_MARK(f->store, &dead_two, fp), 1);
  idem_call_free(d1);
  idem_call_free(d2);
  idem_call_free(d3);
  idem_store_close(uncached);
}

/* A marked record past its retention is replaced by a new first run, whose
 * completion is not marked. */
static void test_replaced_record_not_recovered(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "replaced"};
  idem_call_options brief = {.lease_ms = SHORT_MS, .retention_ms = SHORT_MS};
  idem_store *uncached = open_uncached(f->url);
  idem_call *dead, *c;
  int attempt = 0;
  fp_of(PAYLOAD, fp);

  dead = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c = CLAIM(f->store, &id, fp, &brief, IDEM_RECOVER);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  idem_call_free(c);
  idem_call_free(dead);
  sleep_ms(PAST_SHORT_MS);
  c = CLAIM(uncached, &id, fp, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_recovered(c), 0);
  assert_int_equal(idem_call_attempt(c), 1);
  EXPECT_RC(IDEM_OK, idem_complete(uncached, c, &done_resp));
  idem_call_free(c);
  assert_int_equal(REPLAY_MARK(uncached, &id, fp), 0);
  assert_int_equal(record_mark(uncached, &id, &attempt), 0);
  assert_int_equal(attempt, 1);
  idem_store_close(uncached);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      STORE_TEST(test_first_run_not_recovered),
      STORE_TEST(test_recover_holder_completion_marked),
      STORE_TEST(test_takeover_of_unknown_marked),
      STORE_TEST(test_local_action_after_recover_marked),
      STORE_TEST(test_execute_after_recover_marked),
      STORE_TEST(test_resolve_marks_by_attempts),
      STORE_TEST(test_replaced_record_not_recovered),
  };
  return run_engine_tests("recovered", both, sizeof both / sizeof both[0], NULL,
                          0, NULL, 0);
}
