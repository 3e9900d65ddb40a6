/*
 * test_engine.c -- the engine's contract, run against a real store.
 *
 * Every row of the decision table (docs/design.md), the holder's three endings
 * (complete, release, mark unknown) and their fencing, local actions whose
 * side effect commits with the record, the operators' calls, concurrency in
 * threads and in processes, and what a foreign, read-only, corrupted or newer
 * store does. The side effect of the local actions is a row in a caller's
 * table `tickets` in the store's own database, as in the seeds; tests check
 * both how many rows exist (through a separate connection) and the ticket id
 * each response carries, because either check alone misses a class of bugs.
 *
 * One suite serves every backend. IDEM_TEST_STORE selects it: "sqlite" (the
 * default when unset) makes a fresh database file per test; "postgresql"
 * uses the server named by IDEM_TEST_PG_URL (a postgresql:// URL; without
 * one the run fails, it never skips) with a fresh schema per test
 * (idem_schema=t_<pid>_<n>), dropped at the end of the test. Everything
 * backend-specific lives in the "backends" section below: the store URL, the
 * caller's table (on PostgreSQL in the test's schema, named with it, since
 * idem never changes the search_path), the ticket insert through the
 * connection the local action receives (a sqlite3 * or a PGconn *), the side
 * connection used to count and to tamper with stored rows.
 *
 * One difference shows in the tests themselves: a PostgreSQL sequence is not
 * rolled back with the transaction that used it, so after a rolled-back
 * insert the next ticket id there is one past the rolled-back one, where
 * SQLite reuses it.
 *
 * A few tests are about SQLite files as such (a file that is not a database,
 * a read-only file, a file another connection is writing while the store
 * opens); they always use SQLite and run only in the SQLite run.
 */
#include "engine_harness.c"

/* ------------------------------------------------------------------ */
/* Result codes and names                                               */
/* ------------------------------------------------------------------ */

static void test_result_code_table(void **state) {
  const char *names[21], *msgs[21];
  (void)state;
  for (int rc = 0; rc <= 20; rc++) {
    names[rc] = idem_rc_name(rc);
    msgs[rc] = idem_strerror(rc);
    assert_non_null(names[rc]);
    assert_non_null(msgs[rc]);
    assert_true(strlen(names[rc]) > 5);
    assert_true(strncmp(names[rc], "IDEM_", 5) == 0);
    assert_true(msgs[rc][0] != '\0');
    assert_string_not_equal(names[rc], "IDEM_UNKNOWN_RC");
    assert_string_not_equal(msgs[rc], idem_strerror(9999));
    for (int j = 0; j < rc; j++) {
      assert_string_not_equal(names[j], names[rc]);
      assert_string_not_equal(msgs[j], msgs[rc]);
    }
  }
  /* The numbers are ABI. */
  assert_int_equal(IDEM_OK, 0);
  assert_int_equal(IDEM_EKEY, 9);
  assert_int_equal(IDEM_ESTORE, 11);
  assert_int_equal(IDEM_ESCHEMA, 14);
  assert_int_equal(IDEM_ESTALE, 15);
  assert_int_equal(IDEM_ECORRUPT, 17);
  assert_int_equal(IDEM_EREJECTED, 18);
  assert_int_equal(IDEM_EIO, 20);
  assert_string_equal(idem_rc_name(IDEM_OK), "IDEM_OK");
  assert_string_equal(idem_rc_name(IDEM_EKEY), "IDEM_EKEY");
  assert_string_equal(idem_rc_name(IDEM_ESTALE), "IDEM_ESTALE");
  assert_string_equal(idem_rc_name(IDEM_EIO), "IDEM_EIO");
  assert_string_equal(idem_strerror(IDEM_EKEY), "invalid key");
  assert_string_equal(idem_rc_name(21), "IDEM_UNKNOWN_RC");
  assert_string_equal(idem_rc_name(-1), "IDEM_UNKNOWN_RC");
  assert_true(idem_strerror(21)[0] != '\0');

  assert_string_equal(idem_outcome_name(IDEM_PROCEED), "proceed");
  assert_string_equal(idem_outcome_name(IDEM_REPLAY), "replay");
  assert_string_equal(idem_outcome_name(IDEM_CONFLICT), "conflict");
  assert_string_equal(idem_outcome_name(IDEM_IN_FLIGHT), "in_flight");
  assert_string_equal(idem_outcome_name(IDEM_RECOVER), "recover");
  assert_string_equal(idem_outcome_name(IDEM_UNKNOWN), "unknown");
  assert_string_equal(idem_state_name(IDEM_STATE_IN_PROGRESS), "in_progress");
  assert_string_equal(idem_state_name(IDEM_STATE_COMPLETED), "completed");
  assert_string_equal(idem_state_name(IDEM_STATE_UNKNOWN), "unknown");
}

/* ------------------------------------------------------------------ */
/* Argument checks                                                      */
/* ------------------------------------------------------------------ */

#define NBAD_KEYS 7

static void bad_keys(char long_key[257], const char *out[NBAD_KEYS]) {
  memset(long_key, 'a', 256);
  long_key[256] = '\0';
  out[0] = "";
  out[1] = long_key;          /* 256 bytes */
  out[2] = "approved ticket"; /* space */
  out[3] = "a\x01"
           "b"; /* control character */
  out[4] = "a\x7f"
           "b";           /* DEL */
  out[5] = "caf\xc3\xa9"; /* non-ASCII */
  out[6] = "line\n";      /* newline */
}

static void test_key_check(void **state) {
  char long_key[257], ok_key[256], primed[1024];
  const char *keys[NBAD_KEYS];
  (void)state;
  bad_keys(long_key, keys);
  for (int i = 0; i < NBAD_KEYS; i++) {
    prime_errmsg(primed, sizeof primed);
    if (idem_key_check(keys[i]) != IDEM_EKEY)
      fail_msg("key %d accepted", i);
    assert_fresh_errmsg(primed);
  }
  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_EKEY, idem_key_check(NULL));
  assert_fresh_errmsg(primed);

  memset(ok_key, 'a', 255);
  ok_key[255] = '\0';
  EXPECT_RC(IDEM_OK, idem_key_check(ok_key));
  EXPECT_RC(IDEM_OK, idem_key_check(KEY));
  EXPECT_RC(IDEM_OK, idem_key_check("!"));
  EXPECT_RC(IDEM_OK, idem_key_check("~"));
  EXPECT_RC(IDEM_OK, idem_key_check("a"));
}

static void test_claim_rejects_bad_keys(void **state) {
  fixture *f = *state;
  char long_key[257], ok_key[256], primed[1024], fp[IDEM_FINGERPRINT_SIZE];
  const char *keys[NBAD_KEYS];
  idem_record *rec;
  fp_of(PAYLOAD, fp);
  bad_keys(long_key, keys);
  for (int i = 0; i < NBAD_KEYS; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    ticket_action act = {.payload = PAYLOAD};
    idem_call *c = (idem_call *)&c;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_EKEY, idem_claim(f->store, &id, fp, NULL, &c));
    assert_null(c);
    assert_fresh_errmsg(primed);
    c = (idem_call *)&c;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_EKEY, idem_execute_local(f->store, &id, fp, NULL,
                                            create_ticket, &act, &c));
    assert_null(c);
    assert_fresh_errmsg(primed);
    assert_int_equal(act.runs, 0);
  }
  assert_int_equal(list_count(f->store, NULL), 0);
  assert_int_equal(count_tickets(f->url), 0);

  /* 255 bytes is the longest key, and it is stored whole. */
  memset(ok_key, 'k', 255);
  ok_key[255] = '\0';
  {
    idem_id id = {"tenant-a", OPERATION, ok_key};
    idem_call *c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
    rec = get_record(f->store, &id);
    assert_string_equal(rec->key, ok_key);
    idem_record_free(rec);
    idem_call_free(c);
  }
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_bad_fingerprint(void **state) {
  fixture *f = *state;
  char good[IDEM_FINGERPRINT_SIZE], upper[IDEM_FINGERPRINT_SIZE],
      short_fp[IDEM_FINGERPRINT_SIZE], long_fp[IDEM_FINGERPRINT_SIZE + 1],
      nonhex[IDEM_FINGERPRINT_SIZE], primed[1024];
  const char *bad[6];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call *c;

  /* idem_fingerprint of raw bytes is their SHA-256 in lowercase hex. */
  EXPECT_RC(IDEM_OK, idem_fingerprint("abc", 3, 0, good));
  assert_string_equal(
      good, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  memcpy(upper, good, sizeof upper);
  for (int i = 0; i < 64; i++)
    if (upper[i] >= 'a' && upper[i] <= 'f')
      upper[i] = (char)(upper[i] - 'a' + 'A');
  memcpy(short_fp, good, sizeof short_fp);
  short_fp[63] = '\0';
  memcpy(long_fp, good, 64);
  long_fp[64] = '0';
  long_fp[65] = '\0';
  memcpy(nonhex, good, sizeof nonhex);
  nonhex[10] = 'g';
  bad[0] = NULL;
  bad[1] = "";
  bad[2] = upper;
  bad[3] = short_fp;
  bad[4] = long_fp;
  bad[5] = nonhex;
  for (int i = 0; i < 6; i++) {
    ticket_action act = {.payload = PAYLOAD};
    c = (idem_call *)&c;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &id, bad[i], NULL, &c));
    assert_null(c);
    assert_fresh_errmsg(primed);
    c = (idem_call *)&c;
    EXPECT_RC(IDEM_EINVAL, idem_execute_local(f->store, &id, bad[i], NULL,
                                              create_ticket, &act, &c));
    assert_null(c);
    assert_int_equal(act.runs, 0);
  }
  assert_int_equal(list_count(f->store, NULL), 0);
  assert_int_equal(count_tickets(f->url), 0);
  c = CLAIM(f->store, &id, good, NULL, IDEM_PROCEED);
  idem_call_free(c);
}

static void test_bad_tenant_and_operation(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], long_text[257];
  idem_call *c;
  memset(long_text, 'o', 256);
  long_text[256] = '\0';
  fp_of(PAYLOAD, fp);
  {
    idem_id bad[] = {{"tenant-a", "", KEY},
                     {"tenant-a", NULL, KEY},
                     {"tenant-a", long_text, KEY},
                     {long_text, OPERATION, KEY},
                     {"ten\nant", OPERATION, KEY}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      c = (idem_call *)&c;
      EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, &bad[i], fp, NULL, &c));
      assert_null(c);
    }
  }
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_EINVAL, idem_claim(f->store, NULL, fp, NULL, &c));
  assert_null(c);
  assert_int_equal(list_count(f->store, NULL), 0);
  /* The empty tenant is a tenant. */
  {
    idem_id id = {"", OPERATION, KEY};
    c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
    idem_call_free(c);
  }
}

/* ------------------------------------------------------------------ */
/* The decision table                                                   */
/* ------------------------------------------------------------------ */

static void test_proceed(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id claimed = {"tenant-a", OPERATION, "claimed-key"};
  idem_id local = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  const idem_response *r;
  idem_record *rec;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  /* A claim: a new in-progress record that the caller holds. */
  c = CLAIM(f->store, &claimed, fp, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_null(idem_call_response(c));
  rec = get_record(f->store, &claimed);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->attempt, 1);
  assert_string_equal(rec->fingerprint, fp);
  assert_int_equal(rec->has_response, 0);
  idem_record_free(rec);
  idem_call_free(c);

  /* A local action: the ticket and the completed record in one step. */
  c = LOCAL(f->store, &local, fp, NULL, &act, IDEM_PROCEED);
  assert_int_equal(act.runs, 1);
  assert_int_equal(idem_call_attempt(c), 1);
  r = idem_call_response(c);
  assert_non_null(r);
  assert_int_equal(r->status, 201);
  assert_int_equal(r->meta_len, strlen(TICKET_META));
  assert_memory_equal(r->meta, TICKET_META, r->meta_len);
  assert_int_equal(ticket_id_of(r), 1);
  assert_int_equal(act.ticket_id, 1);
  assert_int_equal(count_tickets(f->url), 1);
  rec = get_record(f->store, &local);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec->attempt, 1);
  assert_int_equal(rec->lease_expires_ms, 0);
  assert_int_equal(rec->has_response, 1);
  assert_response_equal(&rec->response, r);
  idem_record_free(rec);
  /* The record is already complete: the caller does not end it. */
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, r));
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
}

static void test_conflict_before_any_write(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id done = {"tenant-a", OPERATION, KEY};
  idem_id held = {"tenant-a", OPERATION, "held-key"};
  idem_id unknown = {"tenant-a", OPERATION, "unknown-key"};
  idem_call_options lease = {.lease_ms = 5000};
  ticket_action first = {.payload = PAYLOAD},
                second = {.payload = PAYLOAD_URGENT};
  idem_record *before, *after;
  idem_call *c, *h, *u, *x;
  idem_response resp = {200, NULL, 0, "ok", 2};
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  /* Completed record, other payload. */
  c = LOCAL(f->store, &done, fp, NULL, &first, IDEM_PROCEED);
  idem_call_free(c);
  before = get_record(f->store, &done);
  c = LOCAL(f->store, &done, fp2, NULL, &second, IDEM_CONFLICT);
  assert_int_equal(second.runs, 0);
  assert_null(idem_call_response(c));
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  c = CLAIM(f->store, &done, fp2, NULL, IDEM_CONFLICT);
  assert_null(idem_call_response(c));
  idem_call_free(c);
  after = get_record(f->store, &done);
  assert_string_equal(after->fingerprint, fp);
  assert_int_equal(after->state, IDEM_STATE_COMPLETED);
  assert_int_equal(after->updated_ms, before->updated_ms);
  assert_int_equal(after->expires_ms, before->expires_ms);
  assert_response_equal(&after->response, &before->response);
  idem_record_free(before);
  idem_record_free(after);
  assert_int_equal(count_tickets(f->url), 1);

  /* In-progress record inside its lease, other payload: a conflict, not
   * in flight. */
  h = CLAIM(f->store, &held, fp, &lease, IDEM_PROCEED);
  before = get_record(f->store, &held);
  x = CLAIM(f->store, &held, fp2, NULL, IDEM_CONFLICT);
  idem_call_free(x);
  after = get_record(f->store, &held);
  assert_string_equal(after->fingerprint, fp);
  assert_int_equal(after->attempt, 1);
  assert_int_equal(after->lease_expires_ms, before->lease_expires_ms);
  assert_int_equal(after->updated_ms, before->updated_ms);
  idem_record_free(before);
  idem_record_free(after);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, h, &resp));
  idem_call_free(h);

  /* Unknown record, other payload, even when asking for a takeover. */
  u = CLAIM(f->store, &unknown, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, u));
  idem_call_free(u);
  {
    idem_call_options take = {.takeover_unknown = 1};
    x = CLAIM(f->store, &unknown, fp2, &take, IDEM_CONFLICT);
    idem_call_free(x);
  }
  after = get_record(f->store, &unknown);
  assert_int_equal(after->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(after->attempt, 1);
  idem_record_free(after);
  assert_int_equal(count_tickets(f->url), 1);
}

static void test_in_flight(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call_options lease = {.lease_ms = 5000};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":7}", 15};
  ticket_action act = {.payload = PAYLOAD};
  idem_record *before, *after;
  idem_call *holder, *c;
  int64_t ra;
  fp_of(PAYLOAD, fp);

  holder = CLAIM(f->store, &id, fp, &lease, IDEM_PROCEED);
  before = get_record(f->store, &id);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_IN_FLIGHT);
  ra = idem_call_retry_after_ms(c);
  assert_in_range(ra, 1, 5000);
  assert_null(idem_call_response(c));
  assert_int_equal(idem_call_attempt(c), 1);
  /* An in-flight claim holds nothing. */
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  EXPECT_RC(IDEM_ESTATE, idem_release(f->store, c));
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_IN_FLIGHT);
  assert_in_range(idem_call_retry_after_ms(c), 1, 5000);
  assert_int_equal(act.runs, 0);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 0);
  after = get_record(f->store, &id);
  assert_int_equal(after->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(after->attempt, 1);
  assert_int_equal(after->lease_expires_ms, before->lease_expires_ms);
  assert_int_equal(after->updated_ms, before->updated_ms);
  idem_record_free(before);
  idem_record_free(after);

  /* The holder was never disturbed. */
  EXPECT_RC(IDEM_OK, idem_complete(f->store, holder, &resp));
  idem_call_free(holder);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
}

static void test_recover_after_lease_expires(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  idem_record *rec;
  idem_call *crashed, *c, *r;
  int64_t t;
  fp_of(PAYLOAD, fp);

  crashed = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(crashed), 1);
  sleep_ms(PAST_SHORT_MS);
  t = now_ms();
  r = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(r), 2);
  assert_null(idem_call_response(r));
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->attempt, 2);
  /* The new holder has the default lease (30 s). */
  assert_true(rec->lease_expires_ms >= t + 29000);
  idem_record_free(rec);
  /* Its lease is active: others see it in flight. */
  c = CLAIM(f->store, &id, fp, NULL, IDEM_IN_FLIGHT);
  assert_in_range(idem_call_retry_after_ms(c), 20000, 30000);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, r, &resp));
  idem_call_free(r);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  idem_call_free(crashed);
}

static void test_recover_local_action(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_call *crashed, *c;
  fp_of(PAYLOAD, fp);

  crashed = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_RECOVER);
  assert_int_equal(act.runs, 1);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(again.runs, 0);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
  /* The crashed holder cannot overwrite the outcome. */
  {
    idem_response late = {500, NULL, 0, "late", 4};
    EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, crashed, &late));
  }
  idem_call_free(crashed);
}

static void test_replay_exact_bytes(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id empty = {"tenant-a", OPERATION, "empty-response"};
  static const unsigned char meta[] = {'h', '\0', 0xff, '\0', 'x', '\0'};
  unsigned char body[600];
  idem_response resp, none = {204, NULL, 0, NULL, 0};
  idem_record *rec;
  idem_store *other = NULL;
  idem_call *c;
  const idem_response *r;
  for (size_t i = 0; i < sizeof body; i++)
    body[i] = (unsigned char)(i * 7);
  body[0] = '\0';
  body[sizeof body - 1] = '\0';
  resp.status = 500; /* a 5xx is replayed like any other response */
  resp.meta = meta;
  resp.meta_len = sizeof meta;
  resp.body = body;
  resp.body_len = sizeof body;
  fp_of(PAYLOAD, fp);
  fp_of("other", fp2);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  /* Ended once; a second ending is refused. */
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  for (int i = 0; i < 2; i++) {
    c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
    r = idem_call_response(c);
    assert_response_equal(r, &resp);
    assert_int_equal(idem_call_attempt(c), 1);
    assert_int_equal(idem_call_retry_after_ms(c), 0);
    EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &none));
    idem_call_free(c);
  }
  rec = get_record(f->store, &id);
  assert_int_equal(rec->has_response, 1);
  assert_response_equal(&rec->response, &resp);
  idem_record_free(rec);

  /* Empty metadata and body. */
  c = CLAIM(f->store, &empty, fp2, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &none));
  idem_call_free(c);
  c = CLAIM(f->store, &empty, fp2, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &none);
  idem_call_free(c);

  /* Another handle, as a new process after a lost response would have. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &other));
  c = CLAIM(other, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  idem_store_close(other);
}

static void test_local_replay_after_lost_response(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                a3 = {.payload = PAYLOAD};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  /* The first call commits; its response is lost (dropped unread). */
  c = LOCAL(f->store, &id, fp, NULL, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &a2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  assert_int_equal(idem_call_response(c)->status, 201);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &a3, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(a1.runs + a2.runs + a3.runs, 1);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_canonical_payload(void **state) {
  fixture *f = *state;
  static const char reordered[] =
      "{ \"title\": \"Investigate a synthetic queue backlog\",\n"
      "  \"project\": \"demo-agent\", \"priority\": \"normal\" }";
  char fp[IDEM_FINGERPRINT_SIZE], fp_re[IDEM_FINGERPRINT_SIZE],
      fp_urgent[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = reordered},
                a3 = {.payload = PAYLOAD_URGENT};
  idem_call *c;
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
  EXPECT_RC(IDEM_OK, idem_fingerprint(reordered, strlen(reordered), 1, fp_re));
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD_URGENT, strlen(PAYLOAD_URGENT), 1,
                                      fp_urgent));
  assert_string_equal(fp, fp_re);
  assert_string_not_equal(fp, fp_urgent);
  c = LOCAL(f->store, &id, fp, NULL, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp_re, NULL, &a2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp_urgent, NULL, &a3, IDEM_CONFLICT);
  idem_call_free(c);
  assert_int_equal(a2.runs + a3.runs, 0);
  assert_int_equal(count_tickets(f->url), 1);
}

/* ------------------------------------------------------------------ */
/* Holders: fencing, release, unknown outcomes, renewal                 */
/* ------------------------------------------------------------------ */

static void test_stale_holder_after_takeover(void **state) {
  fixture *f = *state;
  static const char *const keys[4] = {"stale-complete", "stale-release",
                                      "stale-unknown", "stale-renew"};
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  idem_response late = {200, NULL, 0, "{\"from\":\"first\"}", 16};
  idem_response newer = {201, "m", 1, "{\"from\":\"second\"}", 17};
  idem_call *first[4], *second[4];
  int64_t t;
  fp_of(PAYLOAD, fp);

  for (int i = 0; i < 4; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    first[i] = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
  }
  sleep_ms(PAST_SHORT_MS);
  for (int i = 0; i < 4; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    second[i] = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
    assert_int_equal(idem_call_attempt(second[i]), 2);
  }
  t = now_ms();

  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, first[0], &late));
  assert_fresh_errmsg(primed);
  EXPECT_RC(IDEM_ESTALE, idem_release(f->store, first[1]));
  EXPECT_RC(IDEM_ESTALE, idem_mark_unknown(f->store, first[2]));
  EXPECT_RC(IDEM_ESTALE, idem_renew(f->store, first[3], 60000));

  for (int i = 0; i < 4; i++) {
    idem_id id = {"tenant-a", OPERATION, keys[i]};
    idem_record *rec = get_record(f->store, &id);
    idem_call *c;
    /* The newer holder's record is untouched... */
    assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
    assert_int_equal(rec->attempt, 2);
    assert_int_equal(rec->has_response, 0);
    assert_true(rec->lease_expires_ms > t + 20000);
    idem_record_free(rec);
    /* ...and it completes and replays its own response. */
    EXPECT_RC(IDEM_OK, idem_complete(f->store, second[i], &newer));
    c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
    assert_response_equal(idem_call_response(c), &newer);
    idem_call_free(c);
    idem_call_free(first[i]);
    idem_call_free(second[i]);
  }
}

static void test_release_then_proceed(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  ticket_action act = {.payload = PAYLOAD};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  /* Released once; it is no longer held. */
  EXPECT_RC(IDEM_ESTATE, idem_release(f->store, c));
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  assert_absent(f->store, &id);
  assert_int_equal(list_count(f->store, NULL), 0);

  /* Nothing is left to conflict with: even another payload proceeds. */
  c = CLAIM(f->store, &id, fp2, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
}

static void test_mark_unknown(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id local = {"tenant-a", OPERATION, "unknown-local"};
  idem_call_options take = {.takeover_unknown = 1};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":5}", 15};
  ticket_action act = {.payload = PAYLOAD}, act2 = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c, *u, *r;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);

  for (int i = 0; i < 2; i++) {
    u = CLAIM(f->store, &id, fp, NULL, IDEM_UNKNOWN);
    assert_null(idem_call_response(u));
    assert_int_equal(idem_call_attempt(u), 1);
    EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, u, &resp));
    idem_call_free(u);
  }
  u = LOCAL(f->store, &id, fp, NULL, &act, IDEM_UNKNOWN);
  assert_int_equal(act.runs, 0);
  idem_call_free(u);
  assert_int_equal(count_tickets(f->url), 0);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(rec->attempt, 1);
  assert_int_equal(rec->lease_expires_ms, 0);
  assert_int_equal(rec->has_response, 0);
  idem_record_free(rec);

  /* Asked for explicitly, a takeover recovers it. */
  r = CLAIM(f->store, &id, fp, &take, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(r), 2);
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->attempt, 2);
  idem_record_free(rec);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, r, &resp));
  idem_call_free(r);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);

  /* And a local action recovering an unknown record acts again. */
  c = CLAIM(f->store, &local, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  c = LOCAL(f->store, &local, fp, &take, &act2, IDEM_RECOVER);
  assert_int_equal(act2.runs, 1);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
}

static void test_resolve_with_response(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id absent = {"tenant-a", OPERATION, "never-claimed"};
  static const unsigned char body[] = {'{', '}', '\0', 0x80, '\n'};
  idem_response resp = {202, "{\"resolved\":true}", 17, body, sizeof body};
  ticket_action act = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &id, &resp));
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec->lease_expires_ms, 0);
  assert_response_equal(&rec->response, &resp);
  idem_record_free(rec);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_REPLAY);
  assert_int_equal(act.runs, 0);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  /* Completed records are not resolved again; absent ones are not found. */
  EXPECT_RC(IDEM_ESTATE, idem_resolve(f->store, &id, &resp));
  EXPECT_RC(IDEM_ESTATE, idem_resolve(f->store, &id, NULL));
  EXPECT_RC(IDEM_ENOTFOUND, idem_resolve(f->store, &absent, &resp));
  EXPECT_RC(IDEM_ENOTFOUND, idem_resolve(f->store, &absent, NULL));
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 0);
}

static void test_resolve_delete(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id live = {"tenant-a", OPERATION, "in-progress"};
  idem_response resp = {200, NULL, 0, "x", 1};
  idem_resolve_options force = {.force = 1};
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  ticket_action act = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c, *h;
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &id, NULL));
  assert_absent(f->store, &id);
  EXPECT_RC(IDEM_ENOTFOUND, idem_resolve(f->store, &id, NULL));
  /* Failed: a retry acts again. */
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  assert_int_equal(act.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);

  /* A holder inside its lease may still be acting: resolving it would let
   * a retry act beside it, so it is refused and the record is untouched. */
  h = CLAIM(f->store, &live, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_ESTATE, idem_resolve(f->store, &live, NULL));
  assert_non_null(strstr(idem_errmsg(), "may still be acting"));
  EXPECT_RC(IDEM_ESTATE, idem_resolve(f->store, &live, &resp));
  rec = get_record(f->store, &live);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
  c = CLAIM(f->store, &live, fp, NULL, IDEM_IN_FLIGHT);
  idem_call_free(c);
  /* Forced, it goes; the holder is then stale. */
  EXPECT_RC(IDEM_OK, idem_resolve_with(f->store, &live, NULL, &force));
  assert_absent(f->store, &live);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, h, &resp));
  assert_absent(f->store, &live);
  idem_call_free(h);

  /* Once its lease has ended, no force is needed. */
  h = CLAIM(f->store, &live, fp, &short_lease, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &live, NULL));
  assert_absent(f->store, &live);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, h, &resp));
  idem_call_free(h);
}

static void test_no_takeover(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  idem_call_options report = {.on_expired_lease = IDEM_EXPIRED_REPORT};
  ticket_action act = {.payload = PAYLOAD};
  idem_record *before, *after;
  idem_call *crashed, *c;
  fp_of(PAYLOAD, fp);

  crashed = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
  before = get_record(f->store, &id);
  sleep_ms(PAST_SHORT_MS);
  c = CLAIM(f->store, &id, fp, &report, IDEM_UNKNOWN);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_null(idem_call_response(c));
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, &report, &act, IDEM_UNKNOWN);
  assert_int_equal(act.runs, 0);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 0);
  after = get_record(f->store, &id);
  assert_int_equal(after->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(after->attempt, 1);
  assert_int_equal(after->lease_expires_ms, before->lease_expires_ms);
  assert_int_equal(after->updated_ms, before->updated_ms);
  idem_record_free(before);
  idem_record_free(after);
  /* Nothing was written: a claim that takes over is the second attempt. */
  c = CLAIM(f->store, &id, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  idem_call_free(c);
  idem_call_free(crashed);
}

static void test_renew_keeps_holder(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id renewed = {"tenant-a", OPERATION, "renewed"};
  idem_id control = {"tenant-a", OPERATION, "not-renewed"};
  idem_call_options short_lease = {.lease_ms = SHORT_MS};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":3}", 15};
  idem_record *rec;
  idem_call *holder, *other, *c;
  int64_t t;
  fp_of(PAYLOAD, fp);

  holder = CLAIM(f->store, &renewed, fp, &short_lease, IDEM_PROCEED);
  other = CLAIM(f->store, &control, fp, &short_lease, IDEM_PROCEED);
  EXPECT_RC(IDEM_EINVAL, idem_renew(f->store, holder, 0));
  EXPECT_RC(IDEM_EINVAL, idem_renew(f->store, holder, -5));
  t = now_ms();
  EXPECT_RC(IDEM_OK, idem_renew(f->store, holder, 5000));
  rec = get_record(f->store, &renewed);
  assert_in_range(rec->lease_expires_ms, t + 5000, now_ms() + 5000);
  assert_int_equal(rec->attempt, 1);
  idem_record_free(rec);
  sleep_ms(PAST_SHORT_MS);
  /* Past the original lease, the renewed holder still holds its key... */
  c = CLAIM(f->store, &renewed, fp, NULL, IDEM_IN_FLIGHT);
  assert_in_range(idem_call_retry_after_ms(c), 1, 5000);
  idem_call_free(c);
  /* ...while the one that did not renew was taken over. */
  c = CLAIM(f->store, &control, fp, NULL, IDEM_RECOVER);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_renew(f->store, holder, 5000));
  EXPECT_RC(IDEM_OK, idem_complete(f->store, holder, &resp));
  EXPECT_RC(IDEM_ESTATE, idem_renew(f->store, holder, 5000));
  c = CLAIM(f->store, &renewed, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);
  EXPECT_RC(IDEM_ESTALE, idem_renew(f->store, other, 5000));
  idem_call_free(holder);
  idem_call_free(other);
}

/* ------------------------------------------------------------------ */
/* Retention                                                            */
/* ------------------------------------------------------------------ */

/* The retention a record was given, found even when it already expired. */
typedef struct retention_of {
  const char *key;
  int found;
  int64_t retention_ms;
} retention_of;

static int retention_cb(const idem_record *r, void *ctx) {
  retention_of *w = ctx;
  if (strcmp(r->key, w->key) == 0) {
    w->found++;
    w->retention_ms = r->expires_ms - r->updated_ms;
  }
  return 0;
}

static void test_retention_expiry_boundary(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id kept = {"tenant-a", OPERATION, "kept-longer"};
  idem_id other = {"tenant-a", OPERATION, "other-payload"};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_call_options longer = {.retention_ms = 60000};
  idem_filter with_expired = {.expired = 1};
  retention_of w = {KEY, 0, 0};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                a3 = {.payload = PAYLOAD}, a4 = {.payload = PAYLOAD},
                a5 = {.payload = PAYLOAD}, a6 = {.payload = PAYLOAD_URGENT};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  c = LOCAL(f->store, &id, fp, &keep, &a1, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = LOCAL(f->store, &kept, fp, &longer, &a2, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  c = LOCAL(f->store, &other, fp, &keep, &a4, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_list(f->store, &with_expired, retention_cb, &w));
  assert_int_equal(w.found, 1);
  assert_int_equal(w.retention_ms, SHORT_MS);

  sleep_ms(PAST_SHORT_MS);
  /* The control: kept longer, it still replays after the same wait. */
  c = LOCAL(f->store, &kept, fp, &longer, &a5, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  /* The documented boundary: once the record is gone, the same key and
   * payload act a second time. */
  assert_absent(f->store, &id);
  assert_int_equal(list_count(f->store, NULL), 1);
  assert_int_equal(list_count(f->store, &with_expired), 3);
  c = LOCAL(f->store, &id, fp, NULL, &a3, IDEM_PROCEED);
  assert_int_equal(a3.runs, 1);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 4);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 4);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 4);
  idem_call_free(c);
  /* An expired record conflicts with nothing either. */
  c = LOCAL(f->store, &other, fp2, NULL, &a6, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 5);
  idem_call_free(c);
  assert_int_equal(a5.runs, 0);
  assert_int_equal(count_tickets(f->url), 5);
}

static void test_prune(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id exp1 = {"tenant-a", OPERATION, "expires-1"};
  idem_id exp2 = {"tenant-b", OPERATION, "expires-2"};
  idem_id live = {"tenant-a", OPERATION, "live"};
  idem_id held = {"tenant-a", OPERATION, "held"};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_call_options held_opts = {.retention_ms = SHORT_MS, .lease_ms = 10000};
  idem_filter with_expired = {.expired = 1};
  idem_response resp = {200, NULL, 0, "done", 4};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                a3 = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c, *h;
  int64_t removed = -1;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &exp1, fp, &keep, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &exp2, fp, &keep, &a2, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &live, fp, NULL, &a3, IDEM_PROCEED);
  idem_call_free(c);
  /* Retention shorter than the lease: the holder is acting right now, so
   * its record must stay. */
  h = CLAIM(f->store, &held, fp, &held_opts, IDEM_PROCEED);

  sleep_ms(PAST_SHORT_MS);

  assert_int_equal(list_count(f->store, NULL), 2);
  assert_int_equal(list_count(f->store, &with_expired), 4);
  removed = -1;
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 2);
  assert_int_equal(list_count(f->store, &with_expired), 2);
  assert_absent(f->store, &exp1);
  assert_absent(f->store, &exp2);
  rec = get_record(f->store, &live);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  idem_record_free(rec);
  rec = get_record(f->store, &held);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
  removed = -1;
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 0);
  EXPECT_RC(IDEM_OK, idem_prune(f->store, NULL));
  /* The holder was not disturbed by pruning. */
  EXPECT_RC(IDEM_OK, idem_complete(f->store, h, &resp));
  idem_call_free(h);
  c = CLAIM(f->store, &live, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
  idem_call_free(c);
  /* Pruning forgets records; it never undoes side effects. */
  assert_int_equal(count_tickets(f->url), 3);
}

/* ------------------------------------------------------------------ */
/* Operators' view                                                      */
/* ------------------------------------------------------------------ */

static void test_get_returns_record_fields(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id big = {"tenant-a", OPERATION, "big-request"};
  idem_id edge = {"tenant-a", OPERATION, "edge-request"};
  idem_call_options opts = {.lease_ms = 5000,
                            .retention_ms = 60000,
                            .request = PAYLOAD,
                            .request_len = strlen(PAYLOAD)};
  static const unsigned char body[] = {'o', 'k', '\0', 0xfe};
  idem_response resp = {201, TICKET_META, strlen(TICKET_META), body,
                        sizeof body};
  idem_record *rec, *rec2;
  idem_call *c;
  unsigned char *request;
  int64_t t0, t1, t2;
  fp_of(PAYLOAD, fp);

  t0 = now_ms();
  c = CLAIM(f->store, &id, fp, &opts, IDEM_PROCEED);
  t1 = now_ms();
  rec = get_record(f->store, &id);
  assert_string_equal(rec->tenant, "tenant-a");
  assert_string_equal(rec->operation, OPERATION);
  assert_string_equal(rec->key, KEY);
  assert_string_equal(rec->fingerprint, fp);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->attempt, 1);
  assert_in_range(rec->created_ms, t0, t1);
  assert_int_equal(rec->updated_ms, rec->created_ms);
  assert_int_equal(rec->lease_expires_ms, rec->created_ms + 5000);
  assert_int_equal(rec->expires_ms, rec->created_ms + 60000);
  assert_int_equal(rec->request_len, strlen(PAYLOAD));
  assert_memory_equal(rec->request, PAYLOAD, strlen(PAYLOAD));
  assert_int_equal(rec->has_response, 0);

  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  t2 = now_ms();
  idem_call_free(c);
  rec2 = get_record(f->store, &id);
  assert_int_equal(rec2->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec2->attempt, 1);
  assert_int_equal(rec2->created_ms, rec->created_ms);
  assert_in_range(rec2->updated_ms, rec->created_ms, t2);
  assert_int_equal(rec2->lease_expires_ms, 0);
  assert_int_equal(rec2->expires_ms, rec2->updated_ms + 60000);
  assert_int_equal(rec2->request_len, strlen(PAYLOAD));
  assert_memory_equal(rec2->request, PAYLOAD, strlen(PAYLOAD));
  assert_int_equal(rec2->has_response, 1);
  assert_response_equal(&rec2->response, &resp);
  idem_record_free(rec);
  idem_record_free(rec2);

  /* The request is kept up to 64 KiB; a larger one is not kept at all. */
  request = malloc(65537);
  assert_non_null(request);
  for (size_t i = 0; i < 65537; i++)
    request[i] = (unsigned char)(i % 251);
  opts.request = request;
  opts.request_len = 65537;
  c = CLAIM(f->store, &big, fp, &opts, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &big);
  assert_int_equal(rec->request_len, 0);
  assert_null(rec->request);
  idem_record_free(rec);
  opts.request_len = 65536;
  c = CLAIM(f->store, &edge, fp, &opts, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &edge);
  assert_int_equal(rec->request_len, 65536);
  assert_memory_equal(rec->request, request, 65536);
  idem_record_free(rec);
  free(request);

  {
    idem_id absent = {"tenant-a", OPERATION, "absent"};
    idem_id other_tenant = {"tenant-b", OPERATION, KEY};
    idem_id other_op = {"tenant-a", "POST /other", KEY};
    assert_absent(f->store, &absent);
    assert_absent(f->store, &other_tenant);
    assert_absent(f->store, &other_op);
  }
}

#define LIST_MAX 16

typedef struct listing {
  int n;
  char rows[LIST_MAX][128];
  int stop_after; /* return 42 after this many rows; 0 = never */
} listing;

static int collect_cb(const idem_record *r, void *ctx) {
  listing *l = ctx;
  if (l->n < LIST_MAX)
    snprintf(l->rows[l->n], sizeof l->rows[0], "%s|%s|%s|%s", r->tenant,
             r->operation, r->key, idem_state_name(r->state));
  l->n++;
  if (l->stop_after && l->n >= l->stop_after)
    return 42;
  return 0;
}

static listing list_of(idem_store *s, const idem_filter *filter) {
  listing l;
  memset(&l, 0, sizeof l);
  EXPECT_RC(IDEM_OK, idem_list(s, filter, collect_cb, &l));
  return l;
}

static void test_list_filters(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id ids[5] = {{"t1", OPERATION, "k1"},
                    {"t1", OPERATION, "k2"},
                    {"t2", OPERATION, "k1"},
                    {"t2", OPERATION, "k3"},
                    {"t2", "POST /other", "k4"}};
  idem_response resp = {200, NULL, 0, "ok", 2};
  idem_call *held = NULL, *c;
  listing l;
  fp_of(PAYLOAD, fp);

  for (int i = 0; i < 5; i++) {
    c = CLAIM(f->store, &ids[i], fp, NULL, IDEM_PROCEED);
    if (i == 1)
      held = c; /* stays in progress */
    else if (i == 3)
      EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
    else
      EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
    if (i != 1)
      idem_call_free(c);
    sleep_ms(3); /* distinct creation times: the listing is oldest first */
  }

  l = list_of(f->store, NULL);
  assert_int_equal(l.n, 5);
  assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
  assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  assert_string_equal(l.rows[2], "t2|" OPERATION "|k1|completed");
  assert_string_equal(l.rows[3], "t2|" OPERATION "|k3|unknown");
  assert_string_equal(l.rows[4], "t2|POST /other|k4|completed");
  {
    idem_filter t1 = {.tenant = "t1"};
    l = list_of(f->store, &t1);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter done = {.state = IDEM_STATE_COMPLETED};
    l = list_of(f->store, &done);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t2|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[2], "t2|POST /other|k4|completed");
  }
  {
    idem_filter t2_unknown = {.tenant = "t2", .state = IDEM_STATE_UNKNOWN};
    l = list_of(f->store, &t2_unknown);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.rows[0], "t2|" OPERATION "|k3|unknown");
  }
  {
    idem_filter in_progress = {.state = IDEM_STATE_IN_PROGRESS};
    l = list_of(f->store, &in_progress);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter t2_op = {.tenant = "t2", .operation = OPERATION};
    l = list_of(f->store, &t2_op);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t2|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t2|" OPERATION "|k3|unknown");
  }
  {
    idem_filter limit = {.limit = 2};
    l = list_of(f->store, &limit);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter nobody = {.tenant = "nobody"};
    assert_int_equal(list_count(f->store, &nobody), 0);
  }
  {
    idem_filter empty_tenant = {.tenant = ""};
    assert_int_equal(list_count(f->store, &empty_tenant), 0);
  }
  /* A non-zero return stops the listing and is returned. */
  memset(&l, 0, sizeof l);
  l.stop_after = 1;
  assert_int_equal(idem_list(f->store, NULL, collect_cb, &l), 42);
  assert_int_equal(l.n, 1);
  EXPECT_RC(IDEM_EINVAL, idem_list(f->store, NULL, NULL, NULL));
  EXPECT_RC(IDEM_OK, idem_complete(f->store, held, &resp));
  idem_call_free(held);
}

/* ------------------------------------------------------------------ */
/* Scope, rejection, size                                               */
/* ------------------------------------------------------------------ */

static void test_tenant_isolation(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id alpha = {"alpha", OPERATION, KEY};
  idem_id beta = {"beta", OPERATION, KEY};
  ticket_action a = {.payload = PAYLOAD}, b = {.payload = PAYLOAD},
                a2 = {.payload = PAYLOAD}, b2 = {.payload = PAYLOAD};
  idem_call *c;
  long long id_alpha, id_beta;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &alpha, fp, NULL, &a, IDEM_PROCEED);
  id_alpha = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  c = LOCAL(f->store, &beta, fp, NULL, &b, IDEM_PROCEED);
  id_beta = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  assert_int_equal(id_alpha, 1);
  assert_int_equal(id_beta, 2);
  assert_int_equal(count_tickets(f->url), 2);
  assert_int_equal(list_count(f->store, NULL), 2);
  {
    idem_filter fa = {.tenant = "alpha"}, fb = {.tenant = "beta"};
    assert_int_equal(list_count(f->store, &fa), 1);
    assert_int_equal(list_count(f->store, &fb), 1);
  }
  /* Each tenant replays its own result. */
  c = LOCAL(f->store, &alpha, fp, NULL, &a2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), id_alpha);
  idem_call_free(c);
  c = LOCAL(f->store, &beta, fp, NULL, &b2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), id_beta);
  idem_call_free(c);
  assert_int_equal(a2.runs + b2.runs, 0);
  assert_int_equal(count_tickets(f->url), 2);
  /* Operations scope keys too. */
  {
    idem_id other_op = {"alpha", "POST /other", KEY};
    ticket_action o = {.payload = PAYLOAD};
    c = LOCAL(f->store, &other_op, fp, NULL, &o, IDEM_PROCEED);
    assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
    idem_call_free(c);
  }
}

static void test_failure_before_commit(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action failing = {.payload = PAYLOAD, .reject = 1};
  ticket_action retry = {.payload = PAYLOAD};
  idem_call *c = (idem_call *)&c;
  fp_of(PAYLOAD, fp);

  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_EREJECTED, idem_execute_local(f->store, &id, fp, NULL,
                                               create_ticket, &failing, &c));
  assert_null(c);
  assert_fresh_errmsg(primed);
  /* The action ran and inserted its ticket before failing... */
  assert_int_equal(failing.runs, 1);
  assert_int_equal(failing.ticket_id, 1);
  /* ...and everything it did was rolled back, with no record kept. */
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  assert_int_equal(list_count(f->store, NULL), 0);

  /* The retry's ticket is the only one. SQLite reuses the rolled-back id;
   * a PostgreSQL sequence is not rolled back, so there it is the next one. */
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(
      ticket_id_of(idem_call_response(c)),
      backend_from_env() == BACKEND_POSTGRESQL ? failing.ticket_id + 1 : 1);
  assert_int_equal(retry.ticket_id, ticket_id_of(idem_call_response(c)));
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_response_too_large(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id local = {"tenant-a", OPERATION, "local-too-big"};
  const size_t max = IDEM_MAX_RESPONSE;
  unsigned char *big = malloc(max + 1);
  idem_response resp;
  idem_record *rec;
  idem_call *c, *x;
  assert_non_null(big);
  for (size_t i = 0; i <= max; i++)
    big[i] = (unsigned char)(i * 31 + (i >> 12));
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  memset(&resp, 0, sizeof resp);
  resp.status = 200;
  resp.body = big;
  resp.body_len = max + 1;
  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_ETOOBIG, idem_complete(f->store, c, &resp));
  assert_fresh_errmsg(primed);
  resp.meta = "m";
  resp.meta_len = 1;
  resp.body_len = max; /* meta and body together count */
  EXPECT_RC(IDEM_ETOOBIG, idem_complete(f->store, c, &resp));
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->has_response, 0);
  idem_record_free(rec);
  x = CLAIM(f->store, &id, fp, NULL, IDEM_IN_FLIGHT);
  idem_call_free(x);
  /* The holder still holds it, and exactly the limit is kept. */
  resp.body_len = max - 1;
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);

  /* A local action whose response is too large stores nothing at all. */
  {
    ticket_action act = {.payload = PAYLOAD,
                         .big_body = big,
                         .big_len = max + 1 - strlen(TICKET_META)};
    x = (idem_call *)&x;
    EXPECT_RC(IDEM_ETOOBIG, idem_execute_local(f->store, &local, fp, NULL,
                                               create_ticket, &act, &x));
    assert_null(x);
    assert_int_equal(act.runs, 1);
    assert_int_equal(count_tickets(f->url), 0);
    assert_absent(f->store, &local);
  }
  free(big);
}

/* ------------------------------------------------------------------ */
/* Concurrency                                                          */
/* ------------------------------------------------------------------ */

typedef struct race_arg {
  idem_store *store;
  const idem_id *id;
  const char *fp;
  pthread_barrier_t *barrier;
  ticket_action action;
  int rc, outcome, runs;
  char body[64];
  size_t body_len;
  char err[256];
} race_arg;

static void *race_local(void *p) {
  race_arg *a = p;
  idem_call *c = NULL;
  const idem_response *r;
  pthread_barrier_wait(a->barrier);
  a->rc = idem_execute_local(a->store, a->id, a->fp, NULL, create_ticket,
                             &a->action, &c);
  if (a->rc == IDEM_OK) {
    a->outcome = idem_call_outcome(c);
    r = idem_call_response(c);
    if (r && r->body_len < sizeof a->body) {
      memcpy(a->body, r->body, r->body_len);
      a->body_len = r->body_len;
    }
  } else {
    snprintf(a->err, sizeof a->err, "%s", idem_errmsg());
  }
  idem_call_free(c);
  return NULL;
}

static void race_execute_local(fixture *f) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  pthread_barrier_t barrier;
  pthread_t th[NTHREADS];
  race_arg args[NTHREADS];
  int proceeded = 0, runs = 0;
  fp_of(PAYLOAD, fp);
  pthread_barrier_init(&barrier, NULL, NTHREADS);
  memset(args, 0, sizeof args);
  for (int i = 0; i < NTHREADS; i++) {
    args[i].store = f->store;
    args[i].id = &id;
    args[i].fp = fp;
    args[i].barrier = &barrier;
    args[i].action.payload = PAYLOAD;
    assert_int_equal(pthread_create(&th[i], NULL, race_local, &args[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < NTHREADS; i++) {
    if (args[i].rc != IDEM_OK)
      fail_msg("thread %d: %s: %s", i, idem_rc_name(args[i].rc), args[i].err);
    if (args[i].outcome != IDEM_PROCEED && args[i].outcome != IDEM_REPLAY)
      fail_msg("thread %d: outcome %s", i, idem_outcome_name(args[i].outcome));
    proceeded += args[i].outcome == IDEM_PROCEED;
    runs += args[i].action.runs;
    assert_int_equal(args[i].body_len, strlen("{\"ticket_id\":1}"));
    assert_memory_equal(args[i].body, "{\"ticket_id\":1}", args[i].body_len);
  }
  assert_int_equal(proceeded, 1);
  assert_int_equal(runs, 1);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_threads_race_execute_local(void **state) {
  race_execute_local(*state);
}

static void test_threads_race_execute_local_no_group_commit(void **state) {
  fixture *f = *state;
  idem_store_options o = {.group_commit = -1};
  idem_store_close(f->store);
  f->store = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &o, &f->store));
  race_execute_local(f);
}

#define NKEYS 4

typedef struct claim_race_arg {
  idem_store *store;
  pthread_barrier_t *barrier;
  int index;
  const char *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  int rc;          /* first failure, or IDEM_OK */
  int bad_outcome; /* an outcome other than proceed, replay, in flight */
  int proceeded;
  int in_flight_seen;
  char body[64];
  size_t body_len;
  char err[256];
} claim_race_arg;

static void *race_claim(void *p) {
  claim_race_arg *a = p;
  idem_id id = {"tenant-a", OPERATION, a->key};
  int64_t deadline;
  pthread_barrier_wait(a->barrier);
  deadline = now_ms() + 20000;
  for (;;) {
    idem_call *c = NULL;
    int outcome;
    a->rc = idem_claim(a->store, &id, a->fp, NULL, &c);
    if (a->rc != IDEM_OK) {
      snprintf(a->err, sizeof a->err, "claim: %s", idem_errmsg());
      return NULL;
    }
    outcome = idem_call_outcome(c);
    if (outcome == IDEM_PROCEED) {
      idem_response r = {201, NULL, 0, a->body, 0};
      a->proceeded = 1;
      snprintf(a->body, sizeof a->body, "{\"key\":\"%s\",\"thread\":%d}",
               a->key, a->index);
      r.body_len = a->body_len = strlen(a->body);
      a->rc = idem_complete(a->store, c, &r);
      if (a->rc != IDEM_OK)
        snprintf(a->err, sizeof a->err, "complete: %s", idem_errmsg());
      idem_call_free(c);
      return NULL;
    }
    if (outcome == IDEM_REPLAY) {
      const idem_response *r = idem_call_response(c);
      if (r && r->body_len < sizeof a->body) {
        memcpy(a->body, r->body, r->body_len);
        a->body_len = r->body_len;
      }
      idem_call_free(c);
      return NULL;
    }
    if (outcome == IDEM_IN_FLIGHT && now_ms() < deadline) {
      int64_t ra = idem_call_retry_after_ms(c);
      a->in_flight_seen++;
      idem_call_free(c);
      sleep_ms(ra < 2 ? (int)ra : 2);
      continue;
    }
    a->bad_outcome = outcome;
    idem_call_free(c);
    return NULL;
  }
}

static void test_threads_race_claim_complete(void **state) {
  fixture *f = *state;
  static const char *const keys[NKEYS] = {"key-0", "key-1", "key-2", "key-3"};
  pthread_barrier_t barrier;
  pthread_t th[NTHREADS];
  claim_race_arg args[NTHREADS];
  pthread_barrier_init(&barrier, NULL, NTHREADS);
  memset(args, 0, sizeof args);
  for (int i = 0; i < NTHREADS; i++) {
    char payload[64];
    args[i].store = f->store;
    args[i].barrier = &barrier;
    args[i].index = i;
    args[i].key = keys[i % NKEYS];
    snprintf(payload, sizeof payload, "payload of %s", args[i].key);
    fp_of(payload, args[i].fp);
    assert_int_equal(pthread_create(&th[i], NULL, race_claim, &args[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);

  for (int k = 0; k < NKEYS; k++) {
    int winner = -1, proceeded = 0;
    for (int i = k; i < NTHREADS; i += NKEYS) {
      if (args[i].rc != IDEM_OK)
        fail_msg("thread %d: %s: %s", i, idem_rc_name(args[i].rc), args[i].err);
      if (args[i].bad_outcome)
        fail_msg("thread %d: outcome %s", i,
                 idem_outcome_name(args[i].bad_outcome));
      if (args[i].proceeded) {
        proceeded++;
        winner = i;
      }
    }
    assert_int_equal(proceeded, 1);
    for (int i = k; i < NTHREADS; i += NKEYS) {
      assert_int_equal(args[i].body_len, args[winner].body_len);
      assert_memory_equal(args[i].body, args[winner].body,
                          args[winner].body_len);
    }
  }
  {
    idem_filter done = {.state = IDEM_STATE_COMPLETED};
    assert_int_equal(list_count(f->store, NULL), NKEYS);
    assert_int_equal(list_count(f->store, &done), NKEYS);
  }
}

typedef struct child_report {
  int index;
  int ready; /* 1: opened and waiting; 0: the final report */
  int rc;
  int outcome;
  int runs;
  long long ticket_id;
  char err[200];
} child_report;

/* A child process: its own store handle, one local action at the signal. */
static void child_race(const char *url, int go_fd, int report_fd, int index) {
  child_report m;
  idem_store *s = NULL;
  idem_call *c = NULL;
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  char fp[IDEM_FINGERPRINT_SIZE], b;
  memset(&m, 0, sizeof m);
  m.index = index;
  m.ready = 1;
  m.rc = idem_store_open(url, NULL, &s);
  if (m.rc != IDEM_OK)
    snprintf(m.err, sizeof m.err, "open: %s", idem_errmsg());
  if (write_all(report_fd, &m, sizeof m) != 0 || m.rc != IDEM_OK)
    _exit(1);
  while (read(go_fd, &b, 1) < 0 && errno == EINTR)
    ;
  m.ready = 0;
  if (idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 0, fp) != IDEM_OK)
    _exit(2);
  m.rc = idem_execute_local(s, &id, fp, NULL, create_ticket, &act, &c);
  if (m.rc == IDEM_OK) {
    m.outcome = idem_call_outcome(c);
    m.ticket_id = ticket_id_of(idem_call_response(c));
  } else {
    snprintf(m.err, sizeof m.err, "%s", idem_errmsg());
  }
  m.runs = act.runs;
  idem_call_free(c);
  idem_store_close(s);
  _exit(write_all(report_fd, &m, sizeof m) == 0 ? 0 : 3);
}

static void test_processes_race_execute_local(void **state) {
  fixture *f = *state;
  int go[2], rep[2], ready = 0, done = 0, proceeded = 0, runs = 0;
  pid_t pids[NPROCS];
  child_report m;
  /* No connection crosses fork(): the parent closes its handle first. */
  idem_store_close(f->store);
  f->store = NULL;
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(rep), 0);
  for (int i = 0; i < NPROCS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(go[1]);
      close(rep[0]);
      child_race(f->url, go[0], rep[1], i);
    }
  }
  close(go[0]);
  close(rep[1]);
  while (ready < NPROCS && read_all(rep[0], &m, sizeof m) == 1) {
    if (!m.ready || m.rc != IDEM_OK) {
      close(go[1]);
      fail_msg("child %d: not ready: %s: %s", m.index, idem_rc_name(m.rc),
               m.err);
    }
    ready++;
  }
  close(go[1]); /* every child wakes up at once */
  assert_int_equal(ready, NPROCS);
  while (done < NPROCS && read_all(rep[0], &m, sizeof m) == 1) {
    if (m.ready)
      fail_msg("child %d: unexpected report", m.index);
    if (m.rc != IDEM_OK)
      fail_msg("child %d: %s: %s", m.index, idem_rc_name(m.rc), m.err);
    if (m.outcome != IDEM_PROCEED && m.outcome != IDEM_REPLAY)
      fail_msg("child %d: outcome %s", m.index, idem_outcome_name(m.outcome));
    if (m.ticket_id != 1)
      fail_msg("child %d: ticket_id %lld", m.index, m.ticket_id);
    proceeded += m.outcome == IDEM_PROCEED;
    runs += m.runs;
    done++;
  }
  close(rep[0]);
  for (int i = 0; i < NPROCS; i++) {
    int status = 0;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  assert_int_equal(done, NPROCS);
  assert_int_equal(proceeded, 1);
  assert_int_equal(runs, 1);
  assert_int_equal(count_tickets(f->url), 1);
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(list_count(f->store, NULL), 1);
}

/* A child that opens a store that may not exist yet and claims its own key. */
static void child_open(const char *url, int go_fd, int report_fd, int index) {
  child_report m;
  idem_store *s = NULL;
  idem_call *c = NULL;
  char key[32], fp[IDEM_FINGERPRINT_SIZE], b;
  idem_id id = {"tenant-a", OPERATION, key};
  idem_response resp = {200, NULL, 0, "ok", 2};
  memset(&m, 0, sizeof m);
  m.index = index;
  snprintf(key, sizeof key, "child-%d", index);
  while (read(go_fd, &b, 1) < 0 && errno == EINTR)
    ;
  if (idem_fingerprint(key, strlen(key), 0, fp) != IDEM_OK)
    _exit(2);
  m.rc = idem_store_open(url, NULL, &s);
  if (m.rc != IDEM_OK) {
    snprintf(m.err, sizeof m.err, "open: %s", idem_errmsg());
  } else {
    m.rc = idem_claim(s, &id, fp, NULL, &c);
    if (m.rc == IDEM_OK) {
      m.outcome = idem_call_outcome(c);
      m.rc = idem_complete(s, c, &resp);
    }
    if (m.rc != IDEM_OK)
      snprintf(m.err, sizeof m.err, "claim: %s", idem_errmsg());
  }
  idem_call_free(c);
  idem_store_close(s);
  _exit(write_all(report_fd, &m, sizeof m) == 0 ? 0 : 3);
}

#define OPEN_ROUNDS 8

/*
 * Many processes starting at once on a store nobody created yet (several
 * `idem run` at the first use of ./idem.db): every one of them opens it.
 */
static void test_processes_open_fresh_store(void **state) {
  int failures = 0;
  char first_failure[256] = "";
  (void)state;
  for (int round = 0; round < OPEN_ROUNDS; round++) {
    char url[URL_MAX];
    int go[2], rep[2], reports = 0;
    pid_t pids[NPROCS];
    child_report m;
    idem_store *s = NULL;
    if (fresh_store_url(url) != 0)
      fail_msg("no store URL");
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(rep), 0);
    for (int i = 0; i < NPROCS; i++) {
      pids[i] = fork();
      assert_true(pids[i] >= 0);
      if (pids[i] == 0) {
        close(go[1]);
        close(rep[0]);
        child_open(url, go[0], rep[1], i);
      }
    }
    close(go[0]);
    close(rep[1]);
    sleep_ms(20); /* let every child reach its read() */
    close(go[1]);
    while (read_all(rep[0], &m, sizeof m) == 1) {
      reports++;
      if (m.rc != IDEM_OK || m.outcome != IDEM_PROCEED) {
        if (!failures++)
          snprintf(first_failure, sizeof first_failure,
                   "round %d, child %d: %s, outcome %s: %s", round, m.index,
                   idem_rc_name(m.rc), idem_outcome_name(m.outcome), m.err);
      }
    }
    close(rep[0]);
    for (int i = 0; i < NPROCS; i++) {
      int status = 0;
      if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0)
        reports = -1;
    }
    if (reports == NPROCS && !failures) {
      /* Every child's record is in the one store they all created. */
      int n = 0, rc = idem_store_open(url, NULL, &s);
      if (rc == IDEM_OK)
        rc = idem_list(s, NULL, count_cb, &n);
      idem_store_close(s);
      if (rc != IDEM_OK || n != NPROCS) {
        discard_store(url);
        fail_msg("round %d: reopened store: %s, %d records, expected %d", round,
                 idem_rc_name(rc), n, NPROCS);
      }
    }
    discard_store(url);
    if (reports != NPROCS)
      fail_msg("round %d: %d reports from %d children, or a child exited "
               "badly",
               round, reports, NPROCS);
  }
  if (failures)
    fail_msg("%d of %d processes failed to use a fresh store; first: %s",
             failures, OPEN_ROUNDS * NPROCS, first_failure);
}

/* ------------------------------------------------------------------ */
/* Foreign, read-only, corrupted and newer stores                       */
/* ------------------------------------------------------------------ */

static void test_sqlite_not_a_database(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], primed[1024];
  static const char line[] = "These are notes, not an SQLite database.\n";
  unsigned char text[4096], *after;
  size_t len;
  idem_store *s;
  FILE *fp;
  for (size_t i = 0; i < sizeof text; i++)
    text[i] = (unsigned char)line[i % (sizeof line - 1)];
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(text, 1, sizeof text, fp), sizeof text);
  assert_int_equal(fclose(fp), 0);

  for (int form = 0; form < 2; form++) {
    snprintf(url, sizeof url, "%s%s", form ? "sqlite:" : "", path);
    s = (idem_store *)&s;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ESTORE, idem_store_open(url, NULL, &s));
    assert_null(s);
    assert_fresh_errmsg(primed);
    assert_non_null(strstr(idem_errmsg(), path));
    after = read_whole(path, &len);
    assert_non_null(after);
    assert_int_equal(len, sizeof text);
    assert_memory_equal(after, text, sizeof text);
    free(after);
  }
}

typedef struct ro_report {
  int dropped;
  uid_t uid;
  int rc;
  int claim_rc;
  char err[512];
} ro_report;

static void test_sqlite_read_only_file(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  unsigned char *before, *after;
  size_t before_len, after_len;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c;
  ro_report m;
  int pfd[2], status = 0;
  pid_t pid;
  fp_of(PAYLOAD, fp);
  assert_int_equal(chmod(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  idem_store_close(s);
  assert_int_equal(chmod(path, 0444), 0);
  before = read_whole(path, &before_len);
  assert_non_null(before);
  assert_true(before_len > 0);

  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* As root, permissions would not apply: become nobody first. */
    close(pfd[0]);
    memset(&m, 0, sizeof m);
    if (geteuid() == 0) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        _exit(4);
      m.dropped = 1;
    }
    m.uid = geteuid();
    s = NULL;
    m.rc = idem_store_open(url, NULL, &s);
    snprintf(m.err, sizeof m.err, "%s", idem_errmsg());
    if (m.rc == IDEM_OK) {
      idem_call *cc = NULL;
      m.claim_rc = idem_claim(s, &id, fp, NULL, &cc);
      idem_call_free(cc);
      idem_store_close(s);
    }
    _exit(write_all(pfd[1], &m, sizeof m) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  memset(&m, 0, sizeof m);
  assert_int_equal(read_all(pfd[0], &m, sizeof m), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  if (geteuid() == 0) {
    assert_int_equal(m.dropped, 1);
    assert_int_equal(m.uid, 65534);
  }
  if (m.rc == IDEM_OK)
    fail_msg("a read-only store opened (a claim then returned %s)",
             idem_rc_name(m.claim_rc));
  if (m.rc != IDEM_ESTORE)
    fail_msg("read-only store: %s (%s), expected IDEM_ESTORE",
             idem_rc_name(m.rc), m.err);
  assert_true(m.err[0] != '\0');
  assert_non_null(strstr(m.err, path));
  after = read_whole(path, &after_len);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
}

typedef struct lock_holder {
  const char *path;
  pthread_barrier_t *barrier;
  int hold_ms;
  int rc;
} lock_holder;

/* Holds a write transaction on the database for a while, as the caller's
 * own code writing its tables would. */
static void *hold_write_lock(void *p) {
  lock_holder *h = p;
  sqlite3 *db = NULL;
  h->rc = sqlite3_open_v2(h->path, &db,
                          SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  if (h->rc == SQLITE_OK)
    h->rc = sqlite3_exec(db,
                         "CREATE TABLE tickets (id INTEGER PRIMARY KEY, "
                         "payload TEXT NOT NULL); BEGIN IMMEDIATE; INSERT "
                         "INTO tickets (payload) VALUES ('written first')",
                         NULL, NULL, NULL);
  pthread_barrier_wait(h->barrier);
  sleep_ms(h->hold_ms);
  if (h->rc == SQLITE_OK)
    h->rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(db);
  return NULL;
}

/*
 * The caller's tables live in the store's database. Opening the store while
 * the caller is writing them waits for the busy timeout like every other
 * call instead of failing at once.
 */
/*
 * The store holds requests and outputs: its file, log and shared-memory
 * file are created 0600. A user who may only read it (here: a copy made
 * readable to nobody, in a folder nobody may not write) lists it with a
 * read-only handle, and a read-only handle writes nothing.
 */
static void test_sqlite_private_files_and_readers(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], side[URL_MAX + 8];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  idem_store_options ro = {.read_only = 1};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL, *r = NULL;
  idem_call *c = NULL;
  struct stat st;
  int pfd[2], status = 0, got[3] = {-1, -1, -1};
  pid_t pid;
  fp_of(PAYLOAD, fp);
  assert_int_equal(chmod(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);

  /* A read-only handle never creates a store. */
  EXPECT_RC(IDEM_ESTORE, idem_store_open(url, &ro, &r));
  assert_null(r);
  assert_int_equal(stat(path, &st), -1);

  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  const char *suffix[3] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(side, sizeof side, "%s%s", path, suffix[i]);
    assert_int_equal(stat(side, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
  }
  /* A read-only handle beside the writer lists, and refuses to write. */
  EXPECT_RC(IDEM_OK, idem_store_open(url, &ro, &r));
  assert_int_equal(list_count(r, NULL), 1);
  c = NULL;
  EXPECT_RC(IDEM_ESTORE, idem_claim(r, &(idem_id){"tenant-a", OPERATION,
                                                   "new-key"},
                                    fp, NULL, &c));
  assert_null(c);
  idem_store_close(r);
  idem_store_close(s);

  /* Another user who may read the file but not write it or its folder. */
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int out[3] = {0, 0, 0};
    close(pfd[0]);
    if (geteuid() == 0 &&
        (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
      _exit(4);
    idem_store *rs = NULL;
    out[0] = idem_store_open(url, &ro, &rs);
    if (out[0] == IDEM_OK) {
      out[1] = list_count(rs, NULL);
      idem_record *rec = NULL;
      out[2] = idem_get(rs, &id, &rec) == IDEM_OK && rec->has_response &&
               rec->response.status == 201;
      idem_record_free(rec);
      idem_store_close(rs);
    }
    _exit(write_all(pfd[1], out, sizeof out) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  assert_int_equal(read_all(pfd[0], got, sizeof got), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(got[0], IDEM_OK);
  assert_int_equal(got[1], 1);
  assert_int_equal(got[2], 1);

  /* SQLite's special names are no store: a clear error, nothing made. */
  EXPECT_RC(IDEM_EURL, idem_store_open("sqlite::memory:", NULL, &s));
  assert_non_null(strstr(idem_errmsg(), "file path"));
}

/*
 * Deleting a live store's -wal file drops its newest commits for every
 * process that opens the store afterwards. The handle that notices refuses
 * to write again, so that it never answers PROCEED for a key whose record
 * it can no longer vouch for.
 */
static void test_sqlite_deleted_log(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], side[URL_MAX + 8];
  idem_id done = {"tenant-a", OPERATION, "done-before"};
  idem_id fresh = {"tenant-a", OPERATION, "new-after"};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &done, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  snprintf(side, sizeof side, "%s-wal", path);
  assert_int_equal(unlink(side), 0);
  snprintf(side, sizeof side, "%s-shm", path);
  assert_int_equal(unlink(side), 0);
  c = NULL;
  EXPECT_RC(IDEM_ESTORE, idem_claim(s, &fresh, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "write-ahead log"));
  EXPECT_RC(IDEM_ESTORE, idem_claim(s, &fresh, fp, NULL, &c));
  idem_store_close(s);
}

/*
 * What a store URL may be. A conninfo without pg:, or an unknown scheme,
 * must never become an SQLite file of that name: every machine would then
 * get a store of its own and deduplication between them would silently
 * end.
 */
static void test_store_url_forms(void **state) {
  const char *dir = *state;
  char cwd[URL_MAX];
  idem_store *s = NULL;
  struct stat st;
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);

  EXPECT_RC(IDEM_EURL,
            idem_store_open("host=db.internal dbname=app", NULL, &s));
  assert_null(s);
  assert_non_null(strstr(idem_errmsg(), "conninfo"));
  assert_int_equal(stat("host=db.internal dbname=app", &st), -1);
  EXPECT_RC(IDEM_EURL, idem_store_open(" dbname = app", NULL, &s));
  EXPECT_RC(IDEM_EURL,
            idem_store_open("redis://u:S3CRET@h/0", NULL, &s));
  assert_non_null(strstr(idem_errmsg(), "'redis:'"));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  EXPECT_RC(IDEM_EURL, idem_store_open("c:store.db", NULL, &s));
  assert_int_equal(stat("c:store.db", &st), -1);
  EXPECT_RC(IDEM_EURL, idem_store_open("sqlite:", NULL, &s));
  EXPECT_RC(IDEM_EURL, idem_store_open("PG:", NULL, &s));

  /* Schemes in any case; a colon in a file name after ./ */
  EXPECT_RC(IDEM_OK, idem_store_open("SQLite:upper.db", NULL, &s));
  assert_string_equal(idem_store_backend(s), "sqlite");
  idem_store_close(s);
  assert_int_equal(stat("upper.db", &st), 0);
  EXPECT_RC(IDEM_OK, idem_store_open("./c:store.db", NULL, &s));
  idem_store_close(s);
  assert_int_equal(stat("c:store.db", &st), 0);
  assert_int_equal(chdir(cwd), 0);
}

static void test_sqlite_open_waits_for_writer(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8];
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  lock_holder h;
  pthread_barrier_t barrier;
  pthread_t th;
  idem_store *s = NULL;
  idem_call *c;
  int64_t t0, waited;
  int rc;
  fp_of(PAYLOAD, fp);
  snprintf(path, sizeof path, "%s/app.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  pthread_barrier_init(&barrier, NULL, 2);
  h.path = path;
  h.barrier = &barrier;
  h.hold_ms = 300;
  h.rc = -1;
  assert_int_equal(pthread_create(&th, NULL, hold_write_lock, &h), 0);
  pthread_barrier_wait(&barrier);
  t0 = now_ms();
  rc = idem_store_open(url, NULL, &s);
  waited = now_ms() - t0;
  pthread_join(th, NULL);
  pthread_barrier_destroy(&barrier);
  assert_int_equal(h.rc, SQLITE_OK);
  if (rc != IDEM_OK)
    fail_msg("idem_store_open while another connection writes: %s after %lld "
             "ms (busy timeout 10000 ms): %s",
             idem_rc_name(rc), (long long)waited, idem_errmsg());
  assert_non_null(s);
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  idem_call_free(c);
  idem_store_close(s);
  assert_int_equal(sqlite_side_sql(path, sqlite_sql.count_tickets, NULL), 1);
}

static void test_corrupted_record(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id body_id = {"tenant-a", OPERATION, "corrupt-body"};
  idem_id status_id = {"tenant-a", OPERATION, "corrupt-status"};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                again = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &body_id, fp, NULL, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &status_id, fp, NULL, &a2, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(
      side_sql(f->url, sql_of_backend()->corrupt_body, body_id.key), 1);
  assert_int_equal(
      side_sql(f->url, sql_of_backend()->corrupt_status, status_id.key), 1);
  /* A new handle, as a new process would have: one that had replayed these
   * records before could answer from its cache of completed records. */
  idem_store_close(f->store);
  f->store = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));

  for (int i = 0; i < 2; i++) {
    const idem_id *id = i ? &status_id : &body_id;
    c = (idem_call *)&c;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ECORRUPT, idem_claim(f->store, id, fp, NULL, &c));
    assert_null(c);
    assert_fresh_errmsg(primed);
    c = (idem_call *)&c;
    EXPECT_RC(IDEM_ECORRUPT, idem_execute_local(f->store, id, fp, NULL,
                                                create_ticket, &again, &c));
    assert_null(c);
    assert_int_equal(again.runs, 0);
    /* The record stays for an operator to look at. */
    rec = get_record(f->store, id);
    assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
    idem_record_free(rec);
  }
  assert_int_equal(count_tickets(f->url), 2);
}

static void test_newer_schema(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  unsigned char *before, *after;
  size_t before_len, after_len;
  idem_store *s;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;
  assert_int_equal(side_sql(f->url, sql_of_backend()->newer_schema, NULL), 1);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   99);
  before = store_snapshot(f->url, &before_len);
  assert_non_null(before);

  for (int i = 0; i < 2; i++) {
    s = (idem_store *)&s;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ESCHEMA, idem_store_open(f->url, NULL, &s));
    assert_null(s);
    assert_fresh_errmsg(primed);
    assert_non_null(strstr(idem_errmsg(), "99"));
  }
  after = store_snapshot(f->url, &after_len);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   99);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 1);
  assert_int_equal(count_tickets(f->url), 1);
}

/* ------------------------------------------------------------------ */

/*
 * Replays come from a cache of completed records. A handle that learned a
 * record by reading it (another handle wrote it) must forget it no later
 * than the store's own expiry: then the key acts again, on that handle too.
 */
static void test_cached_replay_expires(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  /* Long enough for the replays below on a loaded machine. */
  idem_call_options keep = {.retention_ms = 2000};
  ticket_action first = {.payload = PAYLOAD}, again = {.payload = PAYLOAD},
                after = {.payload = PAYLOAD};
  idem_store *reader = NULL;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &reader));

  c = LOCAL(f->store, &id, fp, &keep, &first, IDEM_PROCEED);
  idem_call_free(c);
  /* The reader replays it, twice (the second from its cache)... */
  for (int i = 0; i < 2; i++) {
    c = LOCAL(reader, &id, fp, &keep, &again, IDEM_REPLAY);
    assert_int_equal(ticket_id_of(idem_call_response(c)), first.ticket_id);
    idem_call_free(c);
  }
  assert_int_equal(again.runs, 0);
  /* Once the record expired, the reader acts, and the writer replays the
   * reader's new record. */
  sleep_ms(2300);
  c = LOCAL(reader, &id, fp, &keep, &after, IDEM_PROCEED);
  assert_int_equal(after.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), after.ticket_id);
  assert_true(after.ticket_id != first.ticket_id);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, &keep, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), after.ticket_id);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 2);
  idem_store_close(reader);
}

/* ---- PostgreSQL: a claimer that writes the key while a local action runs -- */

/*
 * On PostgreSQL a local action on a new key runs before its record exists:
 * the record is inserted, completed, with the action's commit. Callers of
 * idem_execute_local() on one key wait for each other (an advisory lock),
 * but an idem_claim() from another process does not, so it can write the
 * key while the action runs. These tests play that claimer from inside the
 * action, on a second store handle: the action must then be rolled back
 * (its ticket with it) and the claimer's record must be the answer.
 */
typedef enum twin_does {
  TWIN_CLAIMS = 1,         /* and holds the key */
  TWIN_COMPLETES,          /* claims and completes with TWIN_BODY */
  TWIN_COMPLETES_THEN_FAIL /* the same, and then the action fails */
} twin_does;

#define TWIN_BODY "{\"ticket_id\":777}"

typedef struct twin_action {
  ticket_action ticket;
  idem_store *other;
  const idem_id *id;
  const char *fp;
  twin_does does;
  idem_call_options twin_opts; /* the claimer's */
  int pause_ms;                /* after the claimer, before returning */
  int twin_done; /* the claimer acts once, on the action's first run */
  int twin_rc;
  idem_outcome twin_outcome;
} twin_action;

static int twin_then_ticket(void *conn, void *ctx, idem_response *response) {
  twin_action *t = ctx;
  idem_response done = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                        strlen(TWIN_BODY)};
  idem_call *c = NULL;
  int rc = create_ticket(conn, &t->ticket, response);
  if (rc != 0 || t->twin_done)
    return rc;
  t->twin_done = 1;
  t->twin_rc = idem_claim(t->other, t->id, t->fp, &t->twin_opts, &c);
  if (t->twin_rc == IDEM_OK) {
    t->twin_outcome = idem_call_outcome(c);
    if (t->does != TWIN_CLAIMS)
      t->twin_rc = idem_complete(t->other, c, &done);
  }
  idem_call_free(c);
  if (t->pause_ms)
    sleep_ms(t->pause_ms);
  return t->does == TWIN_COMPLETES_THEN_FAIL ? 1 : 0;
}

static void run_twin(fixture *f, twin_does does, idem_outcome want) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response twin = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                        strlen(TWIN_BODY)};
  twin_action t = {.ticket = {.payload = PAYLOAD}, .id = &id, .does = does};
  ticket_action later = {.payload = PAYLOAD};
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  t.fp = fp;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &t.other));

  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        twin_then_ticket, &t, &c));
  assert_non_null(c);
  assert_int_equal(idem_call_outcome(c), want);
  /* The action ran once, and the claimer got in while it ran... */
  assert_int_equal(t.ticket.runs, 1);
  assert_true(t.ticket.ticket_id > 0);
  EXPECT_RC(IDEM_OK, t.twin_rc);
  assert_int_equal(t.twin_outcome, IDEM_PROCEED);
  /* ...so the action's ticket was rolled back, and the answer is the
   * claimer's record: its response, or "in flight" while it holds it. */
  assert_int_equal(count_tickets(f->url), 0);
  if (want == IDEM_REPLAY)
    assert_response_equal(idem_call_response(c), &twin);
  else
    assert_true(idem_call_retry_after_ms(c) > 0);
  idem_call_free(c);

  r = get_record(f->store, &id);
  assert_int_equal(r->state, does == TWIN_CLAIMS ? IDEM_STATE_IN_PROGRESS
                                                 : IDEM_STATE_COMPLETED);
  idem_record_free(r);
  assert_int_equal(list_count(f->store, NULL), 1);

  /* Later callers get the claimer's outcome too, and run nothing. */
  c = LOCAL(f->store, &id, fp, NULL, &later, want);
  assert_int_equal(later.runs, 0);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 0);
  idem_store_close(t.other);
}

static void test_pg_claimer_completes_during_action(void **state) {
  run_twin(*state, TWIN_COMPLETES, IDEM_REPLAY);
}

static void test_pg_claimer_holds_key_during_action(void **state) {
  run_twin(*state, TWIN_CLAIMS, IDEM_IN_FLIGHT);
}

/* The action failed (it could have failed on the claimer's rows); the
 * claimer's record answers, not the failure. */
static void test_pg_claimer_completes_then_action_fails(void **state) {
  run_twin(*state, TWIN_COMPLETES_THEN_FAIL, IDEM_REPLAY);
}

/*
 * The claimer's lease runs out while the action runs: the action's record
 * insert fails on the claimer's row, the action is rolled back, and the
 * key is taken over the slow way (RECOVER), where the action runs again,
 * under the key's lock, and commits once.
 */
static void test_pg_claimer_lease_expires_during_action(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  twin_action t = {.ticket = {.payload = PAYLOAD},
                   .id = &id,
                   .does = TWIN_CLAIMS,
                   .twin_opts = {.lease_ms = 1},
                   .pause_ms = 50};
  idem_record *r;
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  t.fp = fp;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &t.other));
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        twin_then_ticket, &t, &c));
  EXPECT_RC(IDEM_OK, t.twin_rc);
  assert_int_equal(t.twin_outcome, IDEM_PROCEED);
  assert_int_equal(idem_call_outcome(c), IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  /* Two runs, the first rolled back: one ticket, the second run's. */
  assert_int_equal(t.ticket.runs, 2);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), t.ticket.ticket_id);
  idem_call_free(c);
  r = get_record(f->store, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  idem_store_close(t.other);
}

/* A unique violation at COMMIT from the caller's own deferred constraint
 * is the action's failure, not a sign of another writer: reported, rolled
 * back, no record, and the action not run again. */
static int ticket_and_duplicate(void *conn, void *ctx, idem_response *response) {
  char sql[256];
  PGresult *res;
  int rc = create_ticket(conn, ctx, response);
  if (rc != 0 ||
      pg_expand("INSERT INTO {S}.deferred_unique VALUES (1)", pg_schema, sql,
                sizeof sql) != 0)
    return 1;
  res = PQexec(conn, sql);
  rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : 1;
  PQclear(res);
  return rc;
}

static void test_pg_deferred_constraint_fails_at_commit(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  idem_call *c = (idem_call *)&c;
  fp_of(PAYLOAD, fp);
  assert_int_equal(side_sql(f->url,
                            "CREATE TABLE {S}.deferred_unique (v integer, "
                            "UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)",
                            NULL),
                   0);
  assert_int_equal(
      side_sql(f->url, "INSERT INTO {S}.deferred_unique VALUES (1)", NULL), 1);
  EXPECT_RC(IDEM_ESTORE, idem_execute_local(f->store, &id, fp, NULL,
                                            ticket_and_duplicate, &act, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "23505"));
  assert_int_equal(act.runs, 1);
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
}

/*
 * An action that ends idem's transaction itself (COMMIT or ROLLBACK through
 * the connection it gets) breaks its contract; what it wrote before may be
 * kept without a record. Whatever it returns, the call fails, the key is
 * marked unknown, and a retry does not act again: on a new key (the fast
 * path on PostgreSQL) and on a key taken over from a holder whose lease
 * ended (RECOVER).
 */
typedef struct ending_action {
  ticket_action ticket;
  const char *end; /* "COMMIT" or "ROLLBACK" */
  int answer;      /* what the action returns */
} ending_action;

static int ticket_then_end(void *conn, void *ctx, idem_response *response) {
  ending_action *a = ctx;
  int rc = create_ticket(conn, &a->ticket, response);
  if (rc != 0)
    return rc;
  if (backend_from_env() == BACKEND_SQLITE)
    sqlite3_exec(conn, a->end, NULL, NULL, NULL);
  else
    PQclear(PQexec(conn, a->end));
  return a->answer;
}

static void run_action_ends_transaction(fixture *f, const char *end,
                                        int answer, int recover) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ending_action bad = {.ticket = {.payload = PAYLOAD}, .end = end,
                       .answer = answer};
  ticket_action retry = {.payload = PAYLOAD};
  idem_call_options short_lease = {.lease_ms = 1};
  long long kept = strcmp(end, "COMMIT") == 0 ? 1 : 0;
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  if (recover) {
    c = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
    idem_call_free(c); /* a holder that died */
    sleep_ms(5);
  }
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_ESTORE, idem_execute_local(f->store, &id, fp, NULL,
                                            ticket_then_end, &bad, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "marked unknown"));
  assert_int_equal(bad.ticket.runs, 1);
  assert_int_equal(count_tickets(f->url), kept);
  r = get_record(f->store, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  idem_record_free(r);
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(retry.runs, 0);
  assert_int_equal(count_tickets(f->url), kept);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_action_commits_itself(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 0, 0);
}

static void test_action_commits_itself_then_fails(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 1, 0);
}

static void test_action_rolls_back_itself(void **state) {
  run_action_ends_transaction(*state, "ROLLBACK", 0, 0);
}

static void test_recovered_action_commits_itself(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 0, 1);
}

/* How many of idem_records' identifying columns compare as bytes. */
static const char pg_c_columns[] =
    "SELECT count(*) FROM information_schema.columns WHERE table_schema = "
    "$1::text AND table_name = 'idem_records' AND column_name IN ('tenant', "
    "'operation', 'key') AND collation_name = 'C'";

/* Turns the store at url back into what schema version 1 made. */
static void pg_back_to_version_1(const char *url) {
  side_sql(url,
           "ALTER TABLE {S}.idem_records ALTER COLUMN tenant TYPE text "
           "COLLATE \"default\", ALTER COLUMN operation TYPE text COLLATE "
           "\"default\", ALTER COLUMN key TYPE text COLLATE \"default\"",
           NULL);
  assert_int_equal(side_sql(url,
                            "UPDATE {S}.idem_meta SET value = '1' WHERE name "
                            "= 'schema_version'",
                            NULL),
                   1);
  assert_int_equal(side_sql(url, pg_c_columns, pg_schema), 0);
  assert_int_equal(side_sql(url, sql_of_backend()->schema_version, NULL), 1);
}

/*
 * A store of schema version 1 (identifying columns in the database's
 * default collation) is migrated on open: version 2, the columns COLLATE
 * "C", every record kept and replayed, and no action run again.
 */
static void test_pg_migrates_version_1(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD}, retry = {.payload = PAYLOAD};
  idem_call *c;
  long long first_id;
  fp_of(PAYLOAD, fp);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   2);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  first_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;

  pg_back_to_version_1(f->url);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   2);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first_id);
  idem_call_free(c);
  assert_int_equal(act.runs, 1);
  assert_int_equal(retry.runs, 0);
  assert_int_equal(count_tickets(f->url), 1);
  /* New keys are claimed and completed on the migrated table. */
  {
    idem_id other = {"tenant-a", OPERATION, "after-migration"};
    idem_response r = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                       strlen(TWIN_BODY)};
    c = CLAIM(f->store, &other, fp, NULL, IDEM_PROCEED);
    EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
    idem_call_free(c);
    c = CLAIM(f->store, &other, fp, NULL, IDEM_REPLAY);
    assert_response_equal(idem_call_response(c), &r);
    idem_call_free(c);
  }
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);
}

/*
 * A role that only reads and writes the tables (as docs/postgresql.md
 * grants a day-to-day role) may not migrate them: a version-1 store opens
 * all the same, stays at version 1 and works; its owner's next open
 * migrates it.
 */
static void test_pg_non_owner_keeps_version_1(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], role[96], sql[1024], url[URL_MAX + 104];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id fresh = {"tenant-a", OPERATION, "by-the-app-role"};
  ticket_action act = {.payload = PAYLOAD}, retry = {.payload = PAYLOAD},
                later = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_store *app = NULL;
  idem_call *c;
  long long first_id, second_id;
  fp_of(PAYLOAD, fp);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  first_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;
  pg_back_to_version_1(f->url);

  snprintf(role, sizeof role, "idem_app_%s", pg_schema);
  snprintf(sql, sizeof sql,
           "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') "
           "THEN DROP OWNED BY %s; DROP ROLE %s; END IF; END$$",
           role, role, role);
  side_sql(f->url, sql, NULL);
  snprintf(sql, sizeof sql, "CREATE ROLE %s LOGIN", role);
  side_sql(f->url, sql, NULL);
  snprintf(sql, sizeof sql,
           "DO $$BEGIN GRANT USAGE ON SCHEMA {S} TO %s; GRANT SELECT, "
           "INSERT, UPDATE, DELETE ON {S}.idem_records TO %s; GRANT SELECT "
           "ON {S}.idem_meta TO %s; GRANT SELECT, INSERT ON {S}.tickets TO "
           "%s; GRANT USAGE ON SEQUENCE {S}.tickets_id_seq TO %s; END$$",
           role, role, role, role, role);
  side_sql(f->url, sql, NULL);
  snprintf(url, sizeof url, "%s&user=%s", f->url, role);

  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &app));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   1);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 0);
  c = LOCAL(app, &id, fp, NULL, &retry, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first_id);
  idem_call_free(c);
  c = LOCAL(app, &fresh, fp, NULL, &later, IDEM_PROCEED);
  second_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  assert_true(second_id != first_id);
  idem_store_close(app);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   2);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &fresh, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), second_id);
  idem_call_free(c);
  assert_int_equal(act.runs + retry.runs + later.runs + again.runs, 2);
  assert_int_equal(count_tickets(f->url), 2);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);

  snprintf(sql, sizeof sql, "DO $$BEGIN DROP OWNED BY %s; DROP ROLE %s; END$$",
           role, role);
  side_sql(f->url, sql, NULL);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_result_code_table),
      cmocka_unit_test(test_key_check),
      STORE_TEST(test_claim_rejects_bad_keys),
      STORE_TEST(test_bad_fingerprint),
      STORE_TEST(test_bad_tenant_and_operation),
      STORE_TEST(test_proceed),
      STORE_TEST(test_conflict_before_any_write),
      STORE_TEST(test_in_flight),
      STORE_TEST(test_recover_after_lease_expires),
      STORE_TEST(test_recover_local_action),
      STORE_TEST(test_replay_exact_bytes),
      STORE_TEST(test_local_replay_after_lost_response),
      STORE_TEST(test_canonical_payload),
      STORE_TEST(test_stale_holder_after_takeover),
      STORE_TEST(test_release_then_proceed),
      STORE_TEST(test_mark_unknown),
      STORE_TEST(test_resolve_with_response),
      STORE_TEST(test_resolve_delete),
      STORE_TEST(test_no_takeover),
      STORE_TEST(test_renew_keeps_holder),
      STORE_TEST(test_retention_expiry_boundary),
      STORE_TEST(test_cached_replay_expires),
      STORE_TEST(test_prune),
      STORE_TEST(test_get_returns_record_fields),
      STORE_TEST(test_list_filters),
      STORE_TEST(test_tenant_isolation),
      STORE_TEST(test_failure_before_commit),
      STORE_TEST(test_action_commits_itself),
      STORE_TEST(test_action_commits_itself_then_fails),
      STORE_TEST(test_action_rolls_back_itself),
      STORE_TEST(test_recovered_action_commits_itself),
      STORE_TEST(test_response_too_large),
      STORE_TEST(test_threads_race_execute_local),
      STORE_TEST(test_threads_race_execute_local_no_group_commit),
      STORE_TEST(test_threads_race_claim_complete),
      STORE_TEST(test_processes_race_execute_local),
      cmocka_unit_test(test_processes_open_fresh_store),
      STORE_TEST(test_corrupted_record),
      STORE_TEST(test_newer_schema),
  };
  /* About SQLite files as such: the SQLite run only. */
  const struct CMUnitTest sqlite_file_tests[] = {
      cmocka_unit_test_setup_teardown(test_sqlite_not_a_database, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_read_only_file, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_private_files_and_readers,
                                      setup_tmpdir, teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_deleted_log, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_store_url_forms, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_open_waits_for_writer,
                                      setup_tmpdir, teardown_tmpdir),
  };
  /* About the PostgreSQL backend's own way of running local actions. */
  const struct CMUnitTest pg_tests[] = {
      STORE_TEST(test_pg_claimer_completes_during_action),
      STORE_TEST(test_pg_claimer_holds_key_during_action),
      STORE_TEST(test_pg_claimer_completes_then_action_fails),
      STORE_TEST(test_pg_claimer_lease_expires_during_action),
      STORE_TEST(test_pg_deferred_constraint_fails_at_commit),
      STORE_TEST(test_pg_migrates_version_1),
      STORE_TEST(test_pg_non_owner_keeps_version_1),
  };
  test_backend backend = backend_from_env();
  const char *problem;
  int failed;
  if (backend == BACKEND_POSTGRESQL && (problem = pg_url_problem()) != NULL) {
    /* A missing server is a failure, never a skip. */
    fprintf(stderr, "test_engine: IDEM_TEST_STORE=postgresql: %s\n", problem);
    return 1;
  }
  if (backend == BACKEND_UNKNOWN) {
    fprintf(stderr,
            "test_engine: IDEM_TEST_STORE=%s: unknown store; use sqlite or "
            "postgresql\n",
            getenv("IDEM_TEST_STORE"));
    return 1;
  }
  failed = cmocka_run_group_tests_name(
      backend == BACKEND_POSTGRESQL ? "engine (postgresql)" : "engine (sqlite)",
      tests, NULL, NULL);
  clean_left_over();
  if (backend == BACKEND_SQLITE) {
    failed += cmocka_run_group_tests_name("engine (sqlite files)",
                                          sqlite_file_tests, NULL, NULL);
    clean_left_over();
  } else {
    failed += cmocka_run_group_tests_name("engine (postgresql local actions)",
                                          pg_tests, NULL, NULL);
    clean_left_over();
  }
  return failed;
}
