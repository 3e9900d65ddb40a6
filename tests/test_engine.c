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
  const char *names[22], *msgs[22];
  (void)state;
  for (int rc = 0; rc <= 21; rc++) {
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
  assert_int_equal(IDEM_EFORK, 21);
  assert_int_equal(IDEM_ESEALED, 22);
  assert_string_equal(idem_rc_name(IDEM_OK), "IDEM_OK");
  assert_string_equal(idem_rc_name(IDEM_EKEY), "IDEM_EKEY");
  assert_string_equal(idem_rc_name(IDEM_ESTALE), "IDEM_ESTALE");
  assert_string_equal(idem_rc_name(IDEM_EIO), "IDEM_EIO");
  assert_string_equal(idem_rc_name(IDEM_EFORK), "IDEM_EFORK");
  assert_string_equal(idem_strerror(IDEM_EKEY), "invalid key");
  assert_string_equal(idem_rc_name(IDEM_ESEALED), "IDEM_ESEALED");
  assert_string_equal(idem_rc_name(23), "IDEM_UNKNOWN_RC");
  assert_string_equal(idem_rc_name(-1), "IDEM_UNKNOWN_RC");
  assert_true(idem_strerror(23)[0] != '\0');

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
                     {"ten\nant", OPERATION, KEY},
                     {"ten\xc2\x85" "ant", OPERATION, KEY}, /* U+0085 */
                     {"acme\xe2\x80\xaegro", OPERATION, KEY}, /* U+202E */
                     {"tenant-a", "POST \xe2\x81\xa6/x", KEY}}; /* U+2066 */
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
  /* The empty tenant is a tenant, and other scripts are welcome. */
  {
    idem_id id = {"", OPERATION, KEY};
    idem_id intl = {"\xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d-\xe6\x97\xa5", OPERATION, KEY};
    c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
    idem_call_free(c);
    c = CLAIM(f->store, &intl, fp, NULL, IDEM_PROCEED);
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
  /* The SQLite store's leases are on the boot-time clock and shown in Unix
   * ms through the two clocks' offset, which is kept while they agree
   * within a second (idem__lease_to_wall()): a wall clock slewed or
   * stepped by a few milliseconds since (seen on a loaded CI machine: 9)
   * moves the shown lease by as much. Still 5 s, not the short lease. */
  assert_in_range(rec->lease_expires_ms, t + 5000 - 1000,
                  now_ms() + 5000 + 1000);
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

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
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
  };
  const struct CMUnitTest *sqlite_only = NULL;
  const struct CMUnitTest *pg_only = NULL;
  return run_engine_tests("engine", both, sizeof both / sizeof both[0], sqlite_only,
                          0, pg_only, 0);
}
