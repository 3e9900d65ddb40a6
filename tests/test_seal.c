/*
 * test_seal.c -- sealed answers (idem_store_seal()): responses and requests
 * stored sealed and opened on every read that hands them to a caller
 * (claims, idem_execute(), the replay cache, asynchronous claims,
 * idem_get(), idem_list()), key rotation, handles without the key or with
 * the wrong one, a sealed answer moved onto another record or given
 * another status, local actions, operators' resolutions, and the size
 * bound. One suite for every backend.
 */
#include "engine_harness.c"

#include "store.h"

#define SECRET_BODY "{\"card\":\"4111-SEALED-BODY-7c1d\"}"
#define SECRET_META "{\"x-secret-meta\":\"META-7c1d\"}"
#define SECRET_REQ "{\"pan\":\"REQUEST-SECRET-5e2a\"}"

static const unsigned char key_a[IDEM_SEAL_KEY_SIZE] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
static const unsigned char key_b[IDEM_SEAL_KEY_SIZE] = {
    0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8, 0xb9, 0xba,
    0xbb, 0xbc, 0xbd, 0xbe, 0xbf, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5,
    0xc6, 0xc7, 0xc8, 0xc9, 0xca, 0xcb, 0xcc, 0xcd, 0xce, 0xcf};
static const unsigned char key_c[IDEM_SEAL_KEY_SIZE] = {0xcc};

static void seal_with(idem_store *s, const unsigned char *k1,
                      const unsigned char *k2) {
  unsigned char keys[2][IDEM_SEAL_KEY_SIZE];
  size_t n = 0;
  if (k1)
    memcpy(keys[n++], k1, IDEM_SEAL_KEY_SIZE);
  if (k2)
    memcpy(keys[n++], k2, IDEM_SEAL_KEY_SIZE);
  EXPECT_RC(
      IDEM_OK,
      idem_store_seal(s, (const unsigned char(*)[IDEM_SEAL_KEY_SIZE])keys, n));
}

static idem_store *open_url(const char *url) {
  idem_store *s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  return s;
}

static void kid_of(const unsigned char *k, char id[17]) {
  EXPECT_RC(IDEM_OK, idem_seal_key_id(k, id));
}

/* How many records hold text anywhere in their stored request, meta or
 * body, read through a side connection. */
static long long stored_with(const char *url, const char *text) {
  if (is_pg_url(url))
    return side_sql(url,
                    "SELECT COUNT(*) FROM {S}.idem_records WHERE "
                    "position(convert_to($1::text, 'UTF8') in "
                    "coalesce(request, '') || coalesce(meta, '') || "
                    "coalesce(body, '')) > 0",
                    text);
  return side_sql(url,
                  "SELECT COUNT(*) FROM idem_records WHERE "
                  "instr(CAST(coalesce(request, '') AS BLOB), CAST(?1 AS "
                  "BLOB)) > 0 OR instr(CAST(coalesce(meta, '') AS BLOB), "
                  "CAST(?1 AS BLOB)) > 0 OR instr(CAST(coalesce(body, '') "
                  "AS BLOB), CAST(?1 AS BLOB)) > 0",
                  text);
}

/* The action of idem_execute(): the secret response. */
static int exec_runs;

static idem_exec_result secret_action(idem_exec *x, void *ctx,
                                      idem_response *r) {
  (void)x;
  (void)ctx;
  exec_runs++;
  r->status = 201;
  r->meta = SECRET_META;
  r->meta_len = strlen(SECRET_META);
  r->body = SECRET_BODY;
  r->body_len = strlen(SECRET_BODY);
  return IDEM_EXEC_DONE;
}

static const idem_response secret = {201, SECRET_META, sizeof SECRET_META - 1,
                                     SECRET_BODY, sizeof SECRET_BODY - 1};

/* idem_execute() of SECRET_REQ on key; the outcome it answered. */
static int execute(idem_store *s, const char *key, int want_rc) {
  idem_id id = {"t1", OPERATION, key};
  idem_call *c = NULL;
  int rc = idem_execute(s, &id, SECRET_REQ, strlen(SECRET_REQ), secret_action,
                        NULL, NULL, &c);
  int out = c ? (int)idem_call_outcome(c) : 0;
  expect_rc_at(want_rc, rc, "idem_execute", __LINE__);
  if (rc == IDEM_OK)
    assert_response_equal(idem_call_response(c), &secret);
  idem_call_free(c);
  return out;
}

static void claim_rc(idem_store *s, const char *key, int want_rc) {
  idem_id id = {"t1", OPERATION, key};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call *c = NULL;
  EXPECT_RC(IDEM_OK, idem_fingerprint(SECRET_REQ, strlen(SECRET_REQ), 1, fp));
  int rc = idem_claim(s, &id, fp, NULL, &c);
  expect_rc_at(want_rc, rc, "idem_claim", __LINE__);
  if (rc == IDEM_OK) {
    assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
    assert_response_equal(idem_call_response(c), &secret);
  } else {
    assert_null(c);
  }
  idem_call_free(c);
}

/* ---- round trips ----------------------------------------------------- */

static void test_execute_round_trip(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char ka[17];
  seal_with(f->store, key_a, NULL);
  kid_of(key_a, ka);
  exec_runs = 0;
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_REPLAY);
  claim_rc(f->store, KEY, IDEM_OK);
  assert_int_equal(exec_runs, 1);
  /* Nothing of the response nor the request is stored in clear. */
  assert_int_equal(stored_with(f->url, "SEALED-BODY"), 0);
  assert_int_equal(stored_with(f->url, "META-7c1d"), 0);
  assert_int_equal(stored_with(f->url, "REQUEST-SECRET"), 0);
  assert_int_equal(stored_with(f->url, "idem-sealed:v1:"), 1);
  /* The operators' view is opened. */
  idem_record *r = get_record(f->store, &id);
  assert_int_equal(r->sealed, 0);
  assert_string_equal(r->seal_key_id, ka);
  assert_true(r->has_response);
  assert_response_equal(&r->response, &secret);
  assert_non_null(r->request);
  assert_int_equal(r->request_len, strlen("{\"pan\":\"REQUEST-SECRET-5e2a\"}"));
  assert_memory_equal(r->request, SECRET_REQ, r->request_len);
  idem_record_free(r);
}

/* The store's files hold no plaintext of a sealed completion. */
static void test_files_hold_no_plaintext(void **state) {
  fixture *f = *state;
  char path[URL_MAX];
  size_t n = 0;
  unsigned char *bytes;
  if (backend_from_env() != BACKEND_SQLITE)
    skip();
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_REPLAY);
  const char *files[2] = {"", "-wal"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s%s", sqlite_path(f->url), files[i]);
    bytes = read_whole(path, &n);
    if (!bytes)
      continue; /* no -wal once checkpointed */
    assert_null(memmem(bytes, n, "SEALED-BODY", 11));
    assert_null(memmem(bytes, n, "META-7c1d", 9));
    assert_null(memmem(bytes, n, "REQUEST-SECRET", 14));
    free(bytes);
  }
  /* The same writes without keys do leave it there: the check can see. */
  idem_store_seal(f->store, NULL, 0);
  assert_int_equal(execute(f->store, "clear-key", IDEM_OK), IDEM_PROCEED);
  assert_int_equal(stored_with(f->url, "SEALED-BODY"), 1);
}

/* Without keys everything is stored as before, byte for byte. */
static void test_no_keys_stores_in_clear(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  assert_int_equal(stored_with(f->url, SECRET_BODY), 1);
  assert_int_equal(stored_with(f->url, SECRET_META), 1);
  idem_record *r = get_record(f->store, &id);
  assert_string_equal(r->seal_key_id, "");
  assert_int_equal(r->sealed, 0);
  assert_response_equal(&r->response, &secret);
  idem_record_free(r);
}

/* ---- keys ------------------------------------------------------------- */

static void test_rotation(void **state) {
  fixture *f = *state;
  idem_id id2 = {"t1", OPERATION, "after-rotation"};
  char ka[17], kb[17];
  kid_of(key_a, ka);
  kid_of(key_b, kb);
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_b, key_a);
  /* Written with A, opened with [B, A]. */
  assert_int_equal(execute(s2, KEY, IDEM_OK), IDEM_REPLAY);
  claim_rc(s2, KEY, IDEM_OK);
  /* New writes use B. */
  assert_int_equal(execute(s2, id2.key, IDEM_OK), IDEM_PROCEED);
  idem_record *r = get_record(s2, &id2);
  assert_string_equal(r->seal_key_id, kb);
  idem_record_free(r);
  idem_id id1 = {"t1", OPERATION, KEY};
  r = get_record(s2, &id1);
  assert_string_equal(r->seal_key_id, ka);
  idem_record_free(r);
  /* A handle with A only opens A's records, not B's. */
  claim_rc(f->store, KEY, IDEM_OK);
  idem_store_close(s2);
  idem_store *s3 = open_url(f->url);
  seal_with(s3, key_a, NULL);
  claim_rc(s3, id2.key, IDEM_ESEALED);
  assert_non_null(strstr(idem_errmsg(), kb));
  idem_store_close(s3);
}

static int list_cb(const idem_record *r, void *ctx) {
  const idem_record **out = ctx;
  (void)out;
  assert_int_equal(r->sealed, IDEM_SEALED_NO_KEY);
  assert_false(r->has_response);
  assert_null(r->response.body);
  assert_int_equal(r->response.status, 201);
  return 0;
}

static void test_handle_without_keys(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char ka[17];
  kid_of(key_a, ka);
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  idem_store *s2 = open_url(f->url);
  claim_rc(s2, KEY, IDEM_ESEALED);
  assert_non_null(strstr(idem_errmsg(), ka));
  exec_runs = 0;
  execute(s2, KEY, IDEM_ESEALED);
  assert_int_equal(exec_runs, 0);
  idem_record *r = get_record(s2, &id);
  assert_int_equal(r->sealed, IDEM_SEALED_NO_KEY);
  assert_string_equal(r->seal_key_id, ka);
  assert_false(r->has_response);
  assert_null(r->response.body);
  assert_int_equal(r->response.body_len, 0);
  assert_int_equal(r->response.status, 201);
  assert_null(r->request);
  idem_record_free(r);
  idem_filter flt = {0};
  EXPECT_RC(IDEM_OK, idem_list(s2, &flt, list_cb, NULL));
  assert_int_equal(list_count(s2, &flt), 1);
  idem_store_close(s2);
}

static void test_wrong_key(void **state) {
  fixture *f = *state;
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_c, NULL);
  claim_rc(s2, KEY, IDEM_ESEALED);
  idem_store_close(s2);
}

/* ---- tampering ---------------------------------------------------------- */

/* Copies the stored response of key `from` onto the record of key `to`
 * (the same fingerprint, so its checksum stays valid). */
static void move_answer(const char *url, const char *from, const char *to) {
  long long n;
  if (is_pg_url(url)) {
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE {S}.idem_records d SET status = s.status, meta = "
             "s.meta, body = s.body, checksum = s.checksum FROM "
             "{S}.idem_records s WHERE s.key = '%s' AND d.key = $1::text",
             from);
    n = side_sql(url, sql, to);
  } else {
    char sql[512];
    snprintf(sql, sizeof sql,
             "UPDATE idem_records SET (status, meta, body, checksum) = "
             "(SELECT status, meta, body, checksum FROM idem_records WHERE "
             "key = '%s') WHERE key = ?1",
             from);
    n = side_sql(url, sql, to);
  }
  assert_int_equal(n, 1);
}

static void test_moved_answer_does_not_open(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, "victim"};
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  assert_int_equal(execute(f->store, "victim", IDEM_OK), IDEM_PROCEED);
  move_answer(f->url, KEY, "victim");
  /* A fresh handle: nothing in its replay cache. */
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  claim_rc(s2, "victim", IDEM_ECORRUPT);
  assert_non_null(strstr(idem_errmsg(), "does not open"));
  exec_runs = 0;
  execute(s2, "victim", IDEM_ECORRUPT);
  assert_int_equal(exec_runs, 0);
  idem_record *r = get_record(s2, &id);
  assert_int_equal(r->sealed, IDEM_SEALED_BROKEN);
  assert_false(r->has_response);
  idem_record_free(r);
  /* The record it came from still opens. */
  claim_rc(s2, KEY, IDEM_OK);
  idem_store_close(s2);
}

/* Sets the status of key's record to status + 1 and its checksum to the
 * one of what it then holds, so that only the seal can tell. */
static void bump_status(const char *url, const char *key) {
  long long n;
  if (is_pg_url(url)) {
    n = side_sql(url,
                 "UPDATE {S}.idem_records SET status = status + 1, checksum "
                 "= encode(sha256(convert_to(fingerprint || ':' || (status "
                 "+ 1) || ':' || coalesce(length(meta), 0) || ':' || "
                 "coalesce(length(body), 0) || ':', 'UTF8') || "
                 "coalesce(meta, '') || coalesce(body, '')), 'hex') WHERE "
                 "key = $1::text",
                 key);
    assert_int_equal(n, 1);
    return;
  }
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  char sum[IDEM_FINGERPRINT_SIZE], fp[IDEM_FINGERPRINT_SIZE];
  assert_int_equal(sqlite3_open(sqlite_path(url), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "SELECT fingerprint, status, meta, "
                                      "body FROM idem_records WHERE key = ?1",
                                      -1, &q, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  snprintf(fp, sizeof fp, "%s", (const char *)sqlite3_column_text(q, 0));
  int status = sqlite3_column_int(q, 1) + 1;
  const void *meta = sqlite3_column_blob(q, 2);
  size_t ml = (size_t)sqlite3_column_bytes(q, 2);
  const void *body = sqlite3_column_blob(q, 3);
  size_t bl = (size_t)sqlite3_column_bytes(q, 3);
  EXPECT_RC(IDEM_OK,
            idem__response_checksum(fp, status, meta, ml, body, bl, sum));
  sqlite3_finalize(q);
  assert_int_equal(sqlite3_prepare_v2(db,
                                      "UPDATE idem_records SET status = ?2, "
                                      "checksum = ?3 WHERE key = ?1",
                                      -1, &q, NULL),
                   SQLITE_OK);
  sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
  sqlite3_bind_int(q, 2, status);
  sqlite3_bind_text(q, 3, sum, -1, SQLITE_STATIC);
  assert_int_equal(sqlite3_step(q), SQLITE_DONE);
  assert_int_equal(sqlite3_changes(db), 1);
  sqlite3_finalize(q);
  sqlite3_close(db);
}

static void test_status_tampering_fails(void **state) {
  fixture *f = *state;
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  bump_status(f->url, KEY);
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  claim_rc(s2, KEY, IDEM_ECORRUPT);
  idem_store_close(s2);
}

/* ---- the other writers ----------------------------------------------------
 */

static void test_execute_local_sealed(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {PAYLOAD, 0, NULL, 0, 0, 0, ""};
  seal_with(f->store, key_a, NULL);
  fp_of(PAYLOAD, fp);
  idem_call *c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  const idem_response *r = idem_call_response(c);
  assert_int_equal(ticket_id_of(r), act.ticket_id);
  assert_int_equal(r->meta_len, strlen(TICKET_META));
  assert_memory_equal(r->meta, TICKET_META, r->meta_len);
  idem_call_free(c);
  assert_int_equal(stored_with(f->url, "ticket_id"), 0);
  assert_int_equal(stored_with(f->url, "content-type"), 0);
  /* A replay, from a fresh handle (from the store) and this one. */
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  c = LOCAL(s2, &id, fp, NULL, &act, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  assert_int_equal(act.runs, 1);
  idem_store_close(s2);
  /* Without the key: never a replay of the sealed bytes. */
  idem_store *s3 = open_url(f->url);
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_ESEALED,
            idem_execute_local(s3, &id, fp, NULL, create_ticket, &act, &c));
  assert_null(c);
  assert_int_equal(act.runs, 1);
  idem_store_close(s3);
}

static void test_resolve_sealed(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  EXPECT_RC(IDEM_OK, idem_fingerprint(SECRET_REQ, strlen(SECRET_REQ), 1, fp));
  seal_with(f->store, key_a, NULL);
  idem_call *c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_resolve(f->store, &id, &secret));
  assert_int_equal(stored_with(f->url, "SEALED-BODY"), 0);
  claim_rc(f->store, KEY, IDEM_OK);
  idem_store *s2 = open_url(f->url);
  claim_rc(s2, KEY, IDEM_ESEALED);
  idem_store_close(s2);
}

/* The replay cache keeps what is stored; its replays are opened too. */
static void test_cached_replays_open(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call *c = NULL;
  EXPECT_RC(IDEM_OK, idem_fingerprint(SECRET_REQ, strlen(SECRET_REQ), 1, fp));
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  /* The completion (SQLite) or its first replay (PostgreSQL, which
   * caches what it reads) is cached: answered from memory alone. */
  claim_rc(f->store, KEY, IDEM_OK);
  EXPECT_RC(IDEM_OK, idem_claim_cached(f->store, &id, fp, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &secret);
  idem_call_free(c);
  /* A fresh handle: the first replay reads the store, the second comes
   * from its cache. */
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  claim_rc(s2, KEY, IDEM_OK);
  claim_rc(s2, KEY, IDEM_OK);
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_claim_cached(s2, &id, fp, &c));
  assert_response_equal(idem_call_response(c), &secret);
  idem_call_free(c);
  /* The key dropped: even what it cached is not opened any more. */
  idem_store_seal(s2, NULL, 0);
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_ESEALED, idem_claim_cached(s2, &id, fp, &c));
  assert_null(c);
  idem_store_close(s2);
}

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done, rc;
  idem_call *call;
} waiter;

static void begun(void *ctx, int rc, idem_exec *exec, idem_call *call) {
  waiter *w = ctx;
  assert_null(exec);
  pthread_mutex_lock(&w->mu);
  w->rc = rc;
  w->call = call;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void begin_async(idem_store *s, waiter *w) {
  idem_id id = {"t1", OPERATION, KEY};
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  EXPECT_RC(IDEM_OK,
            idem_execute_begin_async(s, &id, SECRET_REQ, strlen(SECRET_REQ),
                                     NULL, begun, w));
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

static void test_async_replay_opens(void **state) {
  fixture *f = *state;
  waiter w;
  seal_with(f->store, key_a, NULL);
  assert_int_equal(execute(f->store, KEY, IDEM_OK), IDEM_PROCEED);
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  begin_async(s2, &w); /* from the store */
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(idem_call_outcome(w.call), IDEM_REPLAY);
  assert_response_equal(idem_call_response(w.call), &secret);
  idem_call_free(w.call);
  begin_async(s2, &w); /* from the cache */
  EXPECT_RC(IDEM_OK, w.rc);
  assert_response_equal(idem_call_response(w.call), &secret);
  idem_call_free(w.call);
  idem_store_close(s2);
  idem_store *s3 = open_url(f->url);
  begin_async(s3, &w);
  EXPECT_RC(IDEM_ESEALED, w.rc);
  assert_null(w.call);
  idem_store_close(s3);
}

/* ---- sizes and markers ----------------------------------------------------
 */

static void test_size_bound_is_the_plaintext(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  char *big = malloc(IDEM_MAX_RESPONSE + 1);
  assert_non_null(big);
  memset(big, 'z', IDEM_MAX_RESPONSE + 1);
  fp_of(PAYLOAD, fp);
  seal_with(f->store, key_a, NULL);
  idem_call *c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  idem_response r = {200, NULL, 0, big, IDEM_MAX_RESPONSE + 1};
  EXPECT_RC(IDEM_ETOOBIG, idem_complete(f->store, c, &r));
  r.body_len = IDEM_MAX_RESPONSE;
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
  idem_call_free(c);
  idem_store *s2 = open_url(f->url);
  seal_with(s2, key_a, NULL);
  c = CLAIM(s2, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &r);
  idem_call_free(c);
  idem_store_close(s2);
  free(big);
}

static void test_marker_meta_refused(void **state) {
  fixture *f = *state;
  idem_id id = {"t1", OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  static const char marker[] = "\0idem-sealed:v1:0123456789abcdef";
  fp_of(PAYLOAD, fp);
  idem_call *c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  idem_response r = {200, marker, sizeof marker - 1, "x", 1};
  EXPECT_RC(IDEM_EINVAL, idem_complete(f->store, c, &r));
  r.meta_len = 13; /* "\0idem-sealed:" */
  EXPECT_RC(IDEM_EINVAL, idem_complete(f->store, c, &r));
  r.meta = "{}";
  r.meta_len = 2;
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
  idem_call_free(c);
}

static void test_key_id(void **state) {
  (void)state;
  char id[17];
  kid_of(key_a, id);
  /* SHA-256("idem seal key id" || 00 01 .. 1f), its first 8 bytes. */
  assert_string_equal(id, "824df77c7acb3c76");
  EXPECT_RC(IDEM_EINVAL, idem_seal_key_id(NULL, id));
  assert_string_equal(idem_rc_name(IDEM_ESEALED), "IDEM_ESEALED");
  assert_int_equal(IDEM_ESEALED, 22);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_key_id),
      cmocka_unit_test_setup_teardown(test_execute_round_trip, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_files_hold_no_plaintext, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_no_keys_stores_in_clear, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_rotation, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_handle_without_keys, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_wrong_key, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_moved_answer_does_not_open,
                                      setup_store, teardown_store),
      cmocka_unit_test_setup_teardown(test_status_tampering_fails, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_execute_local_sealed, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_resolve_sealed, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_cached_replays_open, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_async_replay_opens, setup_store,
                                      teardown_store),
      cmocka_unit_test_setup_teardown(test_size_bound_is_the_plaintext,
                                      setup_store, teardown_store),
      cmocka_unit_test_setup_teardown(test_marker_meta_refused, setup_store,
                                      teardown_store),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  clean_left_over();
  return failed;
}
