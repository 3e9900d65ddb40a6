/*
 * test_schema.c -- schema versions: a store written by idem 0.2 (SQLite
 * schema 1, PostgreSQL schema 2, made here as 0.2 made them) is migrated on
 * open, keeps and replays its records, and then marks recovered
 * completions; and a handle whose store a newer idem migrates while it is
 * open neither reads nor writes through it (IDEM_ESCHEMA), the operators'
 * writes checking the version inside their own transaction.
 * One suite for every backend; IDEM_TEST_STORE selects it (see
 * engine_harness.c).
 */
#include "engine_harness.c"

static const idem_response done_resp = {
    201, TICKET_META, sizeof TICKET_META - 1, "{\"ticket_id\":7}", 15};

#define DAY_MS 86400000LL

static int is_pg(void) { return backend_from_env() == BACKEND_POSTGRESQL; }

/* A fixture with a URL for a store that does not exist yet; the test makes
 * the store itself. */
static int setup_url(void **state) {
  fixture *f;
  clean_left_over();
  f = calloc(1, sizeof *f);
  *state = f;
  if (!f)
    return -1;
  if (fresh_store_url(f->url) != 0) {
    free(f);
    *state = NULL;
    return -1;
  }
  left_fixture = f;
  return 0;
}

/* ------------------------------------------------------------------ */
/* A store written by idem 0.2                                          */
/* ------------------------------------------------------------------ */

/* What idem 0.2 created on SQLite: schema version 1. */
static const char sqlite_0_2[] =
    "PRAGMA journal_mode=WAL;"
    "BEGIN;"
    "CREATE TABLE IF NOT EXISTS idem_meta (name TEXT PRIMARY KEY, value TEXT "
    "NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE idem_records ("
    " tenant TEXT NOT NULL,"
    " operation TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " request BLOB,"
    " state INTEGER NOT NULL,"
    " owner TEXT,"
    " attempt INTEGER NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " lease_expires_ms INTEGER NOT NULL,"
    " expires_ms INTEGER NOT NULL,"
    " status INTEGER,"
    " meta BLOB,"
    " body BLOB,"
    " checksum TEXT,"
    " PRIMARY KEY (tenant, operation, key)) WITHOUT ROWID;"
    "CREATE INDEX idem_records_expires ON idem_records (expires_ms);"
    "INSERT OR REPLACE INTO idem_meta VALUES ('schema_version', '1');"
    "COMMIT;";

/* What idem 0.2 created on PostgreSQL: schema version 2 (version 1, then
 * the key columns COLLATE "C"), one statement each. */
static const char *const pg_0_2[] = {
    "CREATE SCHEMA IF NOT EXISTS {S}",
    "CREATE TABLE IF NOT EXISTS {S}.idem_meta (name text PRIMARY KEY, value "
    "text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {S}.idem_records ("
    " tenant text NOT NULL,"
    " operation text NOT NULL,"
    " key text NOT NULL,"
    " fingerprint text NOT NULL,"
    " request bytea,"
    " state integer NOT NULL,"
    " owner text,"
    " attempt integer NOT NULL,"
    " created_ms bigint NOT NULL,"
    " updated_ms bigint NOT NULL,"
    " lease_expires_ms bigint NOT NULL,"
    " expires_ms bigint NOT NULL,"
    " status integer,"
    " meta bytea,"
    " body bytea,"
    " checksum text,"
    " PRIMARY KEY (tenant, operation, key))",
    "CREATE INDEX IF NOT EXISTS idem_records_expires ON {S}.idem_records "
    "(expires_ms)",
    "ALTER TABLE {S}.idem_records"
    " ALTER COLUMN tenant TYPE text COLLATE \"C\","
    " ALTER COLUMN operation TYPE text COLLATE \"C\","
    " ALTER COLUMN key TYPE text COLLATE \"C\"",
    "INSERT INTO {S}.idem_meta VALUES ('schema_version', '2')",
};

/* The checksum idem 0.2 stored with a completed record. */
static void checksum_0_2(const char *fp, const idem_response *r,
                         char hex[IDEM_FINGERPRINT_SIZE]) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "%s:%d:%zu:%zu:", fp, r->status,
                   r->meta_len, r->body_len);
  assert_true(n > 0 && (size_t)n + r->meta_len + r->body_len < sizeof buf);
  memcpy(buf + n, r->meta, r->meta_len);
  memcpy(buf + n + r->meta_len, r->body, r->body_len);
  EXPECT_RC(IDEM_OK,
            idem_sha256_hex(buf, (size_t)n + r->meta_len + r->body_len, hex));
}

/*
 * One record as idem 0.2 wrote it: completed (with its response and
 * checksum) at the given attempt, or (completed 0) in progress at attempt
 * 1 with a holder whose lease ended a second ago.
 */
static void put_0_2_record(const char *url, const char *key, const char *fp,
                           int completed, int attempt) {
  char sql[2048], sum[IDEM_FINGERPRINT_SIZE];
  long long now = (long long)now_ms();
  char meta[256], body[256];
  if (is_pg()) {
    snprintf(meta, sizeof meta, "convert_to('%s', 'UTF8')", TICKET_META);
    snprintf(body, sizeof body, "convert_to('%s', 'UTF8')",
             (const char *)done_resp.body);
  } else {
    snprintf(meta, sizeof meta, "CAST('%s' AS BLOB)", TICKET_META);
    snprintf(body, sizeof body, "CAST('%s' AS BLOB)",
             (const char *)done_resp.body);
  }
  checksum_0_2(fp, &done_resp, sum);
  if (completed)
    snprintf(sql, sizeof sql,
             "INSERT INTO %sidem_records (tenant, operation, key, "
             "fingerprint, request, state, owner, attempt, created_ms, "
             "updated_ms, lease_expires_ms, expires_ms, status, meta, body, "
             "checksum) VALUES ('tenant-a', '%s', '%s', '%s', NULL, 2, NULL, "
             "%d, %lld, %lld, 0, %lld, %d, %s, %s, '%s')",
             is_pg() ? "{S}." : "", OPERATION, key, fp, attempt, now - 5000,
             now - 1000, now + DAY_MS, done_resp.status, meta, body, sum);
  else
    snprintf(sql, sizeof sql,
             "INSERT INTO %sidem_records (tenant, operation, key, "
             "fingerprint, request, state, owner, attempt, created_ms, "
             "updated_ms, lease_expires_ms, expires_ms) VALUES ('tenant-a', "
             "'%s', '%s', '%s', NULL, 1, 'a-holder-that-died', 1, %lld, "
             "%lld, %lld, %lld)",
             is_pg() ? "{S}." : "", OPERATION, key, fp, now - 5000, now - 5000,
             now - 1000, now + DAY_MS);
  assert_int_equal(side_sql(url, sql, NULL), 1);
}

/* Makes the store at url as idem 0.2 would have left it: a first run's
 * completed record, one completed after a takeover (attempt 2, which 0.2
 * did not mark), and one whose holder died. */
static void make_0_2_store(const char *url, const char *fp) {
  if (is_pg()) {
    for (size_t i = 0; i < sizeof pg_0_2 / sizeof pg_0_2[0]; i++)
      assert_true(side_sql(url, pg_0_2[i], NULL) >= 0);
  } else {
    sqlite3 *db = NULL;
    char *err = NULL;
    assert_int_equal(sqlite3_open(sqlite_path(url), &db), SQLITE_OK);
    if (sqlite3_exec(db, sqlite_0_2, NULL, NULL, &err) != SQLITE_OK)
      fail_msg("the 0.2 store: %s", err ? err : "?");
    sqlite3_close(db);
  }
  put_0_2_record(url, "old-first", fp, 1, 1);
  put_0_2_record(url, "old-recovered", fp, 1, 2);
  put_0_2_record(url, "old-held", fp, 0, 1);
}

static int the_schema_version(void) { return is_pg() ? 4 : 3; }

/*
 * A store written by idem 0.2 opened by this one: migrated in place on
 * open, its records kept and replayed unmarked (0.2 kept no mark, even for
 * its attempt-2 completion), and a takeover of its dead holder's key then
 * completes marked. Before that, a read-only handle (SQLite; it may not
 * migrate) lists and reads it as it is.
 */
static void test_upgrade_from_0_2(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id first = {"tenant-a", OPERATION, "old-first"};
  idem_id recovered = {"tenant-a", OPERATION, "old-recovered"};
  idem_id held = {"tenant-a", OPERATION, "old-held"};
  idem_id fresh = {"tenant-a", OPERATION, "new-key"};
  idem_store *uncached = NULL;
  idem_store_options no_cache = {.replay_cache_entries = -1};
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  make_0_2_store(f->url, fp);

  if (!is_pg()) {
    idem_store_options ro = {.read_only = 1};
    idem_store *reader = NULL;
    EXPECT_RC(IDEM_OK, idem_store_open(f->url, &ro, &reader));
    r = get_record(reader, &recovered);
    assert_int_equal(r->attempt, 2);
    assert_int_equal(r->recovered, 0);
    assert_response_equal(&r->response, &done_resp);
    idem_record_free(r);
    assert_int_equal(list_count(reader, NULL), 3);
    c = CLAIM(reader, &first, fp, NULL, IDEM_REPLAY);
    assert_int_equal(idem_call_recovered(c), 0);
    assert_response_equal(idem_call_response(c), &done_resp);
    idem_call_free(c);
    idem_store_close(reader);
    assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                     1);
  }

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   the_schema_version());
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &no_cache, &uncached));
  c = CLAIM(uncached, &first, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  assert_response_equal(idem_call_response(c), &done_resp);
  idem_call_free(c);
  c = CLAIM(f->store, &recovered, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_response_equal(idem_call_response(c), &done_resp);
  idem_call_free(c);
  r = get_record(f->store, &recovered);
  assert_int_equal(r->recovered, 0);
  idem_record_free(r);

  c = CLAIM(f->store, &held, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_int_equal(idem_call_recovered(c), 1);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  idem_call_free(c);
  c = CLAIM(uncached, &held, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);
  r = get_record(uncached, &held);
  assert_int_equal(r->recovered, 1);
  idem_record_free(r);

  c = CLAIM(f->store, &fresh, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  idem_call_free(c);
  c = CLAIM(uncached, &fresh, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 4);
  idem_store_close(uncached);
}

/*
 * PostgreSQL: a role that may use the tables but not alter them (as
 * docs/postgresql.md grants a day-to-day role) cannot add the column
 * that keeps the mark. It opens a 0.2 store all the same and works at
 * version 2: a holder that recovered is told so on its call, but its
 * response cannot be kept marked until the owner opens the store, which
 * migrates it.
 */
static void test_pg_non_owner_keeps_version_2(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], role[96], sql[1024], url[URL_MAX + 104];
  idem_id first = {"tenant-a", OPERATION, "old-first"};
  idem_id held = {"tenant-a", OPERATION, "old-held"};
  idem_store *app = NULL;
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  make_0_2_store(f->url, fp);

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
           "ON {S}.idem_meta TO %s; END$$",
           role, role, role);
  side_sql(f->url, sql, NULL);
  snprintf(url, sizeof url, "%s&user=%s", f->url, role);

  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &app));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL), 2);
  c = CLAIM(app, &first, fp, NULL, IDEM_REPLAY);
  assert_int_equal(idem_call_recovered(c), 0);
  assert_response_equal(idem_call_response(c), &done_resp);
  idem_call_free(c);
  c = CLAIM(app, &held, fp, NULL, IDEM_RECOVER);
  assert_int_equal(idem_call_recovered(c), 1);
  EXPECT_RC(IDEM_OK, idem_complete(app, c, &done_resp));
  idem_call_free(c);
  r = get_record(app, &held);
  assert_int_equal(r->recovered, 0);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
  assert_int_equal(list_count(app, NULL), 3);
  EXPECT_RC(IDEM_OK, idem_prune(app, NULL));

  /* The owner migrates it while the app's handle is open, which works on. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   the_schema_version());
  c = CLAIM(app, &held, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &done_resp);
  idem_call_free(c);
  assert_int_equal(list_count(app, NULL), 3);
  idem_store_close(app);

  snprintf(sql, sizeof sql, "DO $$BEGIN DROP OWNED BY %s; DROP ROLE %s; END$$",
           role, role);
  side_sql(f->url, sql, NULL);
}

/* ------------------------------------------------------------------ */
/* A newer idem migrates the store while a handle has it open           */
/* ------------------------------------------------------------------ */

static void expect_newer(int rc, const char *what, int line) {
  if (rc != IDEM_ESCHEMA)
    fail_msg("line %d: %s returned %s (%s), expected IDEM_ESCHEMA", line, what,
             idem_rc_name(rc), idem_errmsg());
  if (!strstr(idem_errmsg(), "99"))
    fail_msg("line %d: %s: the detail does not name version 99: %s", line, what,
             idem_errmsg());
}
#define EXPECT_NEWER(expr) expect_newer((expr), #expr, __LINE__)

static int never_cb(const idem_record *r, void *ctx) {
  (void)r;
  (*(int *)ctx)++;
  return 0;
}

/*
 * Records written by another handle (so that this one has none of them in
 * its replay cache), then the schema version raised by "a newer idem":
 * every read of this handle fails with IDEM_ESCHEMA instead of reading
 * rows in a layout it does not know, and so does every write.
 */
static void test_newer_schema_while_open(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], other[IDEM_FINGERPRINT_SIZE];
  idem_id done = {"tenant-a", OPERATION, "done"};
  idem_id held = {"tenant-a", OPERATION, "held"};
  idem_id absent = {"tenant-a", OPERATION, "absent"};
  idem_store *writer = NULL;
  idem_record *r;
  idem_call *c;
  ticket_action act = {.payload = PAYLOAD};
  int64_t removed = -1;
  int calls = 0;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, other);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &writer));
  c = CLAIM(writer, &done, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(writer, c, &done_resp));
  idem_call_free(c);
  c = CLAIM(writer, &held, fp, NULL, IDEM_PROCEED);
  idem_call_free(c);
  idem_store_close(writer);

  assert_int_equal(side_sql(f->url, sql_of_backend()->newer_schema, NULL), 1);

  r = (idem_record *)&r;
  EXPECT_NEWER(idem_get(f->store, &done, &r));
  assert_null(r);
  EXPECT_NEWER(idem_get(f->store, &absent, &r));
  assert_null(r);
  EXPECT_NEWER(idem_list(f->store, NULL, never_cb, &calls));
  assert_int_equal(calls, 0);
  for (int i = 0; i < 2; i++) {
    c = (idem_call *)&c;
    EXPECT_NEWER(idem_claim(f->store, &done, fp, NULL, &c)); /* replay */
    assert_null(c);
    EXPECT_NEWER(idem_claim(f->store, &done, other, NULL, &c)); /* conflict */
    assert_null(c);
    EXPECT_NEWER(idem_claim(f->store, &held, fp, NULL, &c)); /* in flight */
    assert_null(c);
    EXPECT_NEWER(
        idem_execute_local(f->store, &done, fp, NULL, create_ticket, &act, &c));
    assert_null(c);
  }
  assert_int_equal(act.runs, 0);
  EXPECT_NEWER(idem_prune(f->store, &removed));
  assert_int_equal(removed, 0);
  EXPECT_NEWER(idem_delete(f->store, &done));
  EXPECT_NEWER(idem_resolve_with(f->store, &held, &done_resp,
                                 &(idem_resolve_options){.force = 1}));
  if (!is_pg()) {
    c = (idem_call *)&c;
    EXPECT_NEWER(idem_claim(f->store, &absent, fp, NULL, &c));
    assert_null(c);
  }
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   99);
  assert_int_equal(count_tickets(f->url), 0);
}

/*
 * "A newer idem" that raises the schema version in a transaction it keeps
 * open for a while, holding what idem's migrations hold (SQLite's write
 * lock; PostgreSQL's advisory lock of the schema), on a thread with a
 * connection of its own.
 */
typedef struct migrator {
  const char *url;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int state; /* 1 once the change is made and not committed, -1 failed */
} migrator;

static void migrator_signal(migrator *m, int v) {
  pthread_mutex_lock(&m->mu);
  m->state = v;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

static void *migrator_main(void *arg) {
  migrator *m = arg;
  if (is_pg()) {
    PGconn *conn = NULL;
    char target[URL_MAX], schema[64], sql[256];
    PGresult *res = pg_side_exec(m->url, "BEGIN", NULL, &conn);
    if (!res ||
        pg_split_url(m->url, target, sizeof target, schema, sizeof schema) !=
            0 ||
        pg_expand(pg_sql.newer_schema, schema, sql, sizeof sql) != 0) {
      PQclear(res);
      PQfinish(conn);
      migrator_signal(m, -1);
      return NULL;
    }
    PQclear(res);
    /* As idem migrates: under the schema's advisory lock (lib/pg/admin.c). */
    res = PQexecParams(conn,
                       "SELECT pg_advisory_xact_lock(1768187245, "
                       "hashtext($1::text))",
                       1, NULL, (const char *const[]){schema}, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      PQclear(res);
      PQfinish(conn);
      migrator_signal(m, -1);
      return NULL;
    }
    PQclear(res);
    res = PQexec(conn, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      PQclear(res);
      PQfinish(conn);
      migrator_signal(m, -1);
      return NULL;
    }
    PQclear(res);
    migrator_signal(m, 1);
    sleep_ms(700);
    PQclear(PQexec(conn, "COMMIT"));
    PQfinish(conn);
    return NULL;
  }
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(sqlite_path(m->url), &db, SQLITE_OPEN_READWRITE, NULL) !=
          SQLITE_OK ||
      sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_exec(db, sqlite_sql.newer_schema, NULL, NULL, NULL) !=
          SQLITE_OK) {
    sqlite3_close(db);
    migrator_signal(m, -1);
    return NULL;
  }
  migrator_signal(m, 1);
  sleep_ms(700);
  sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(db);
  return NULL;
}

static void migrator_start(migrator *m, const char *url) {
  memset(m, 0, sizeof *m);
  m->url = url;
  pthread_mutex_init(&m->mu, NULL);
  pthread_cond_init(&m->cv, NULL);
  assert_int_equal(pthread_create(&m->thread, NULL, migrator_main, m), 0);
  pthread_mutex_lock(&m->mu);
  while (m->state == 0)
    pthread_cond_wait(&m->cv, &m->mu);
  pthread_mutex_unlock(&m->mu);
  assert_int_equal(m->state, 1);
}

static void migrator_join(migrator *m) {
  pthread_join(m->thread, NULL);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
}

/*
 * Prune, delete and resolve read the version in the transaction of their
 * write: one that starts while the newer idem's change is not yet
 * committed waits for it and then writes nothing (a version read before
 * the wait would have let the write through, into the migrated store).
 */
static void test_operators_check_inside_their_transaction(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], set_back[128];
  idem_id done = {"tenant-a", OPERATION, "done"};
  idem_id held = {"tenant-a", OPERATION, "held"};
  idem_call_options brief = {.lease_ms = SHORT_MS};
  idem_call *c;
  migrator m;
  int64_t removed = -1;
  fp_of(PAYLOAD, fp);
  snprintf(set_back, sizeof set_back,
           "UPDATE %sidem_meta SET value = '%d' WHERE name = "
           "'schema_version'",
           is_pg() ? "{S}." : "", the_schema_version());

  c = CLAIM(f->store, &done, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &done_resp));
  idem_call_free(c);
  c = CLAIM(f->store, &held, fp, &brief, IDEM_PROCEED);
  idem_call_free(c);
  sleep_ms(PAST_SHORT_MS);

  migrator_start(&m, f->url);
  EXPECT_NEWER(idem_prune(f->store, &removed));
  migrator_join(&m);
  assert_int_equal(removed, 0);
  assert_int_equal(side_sql(f->url, set_back, NULL), 1);

  migrator_start(&m, f->url);
  EXPECT_NEWER(idem_delete(f->store, &done));
  migrator_join(&m);
  assert_int_equal(side_sql(f->url, set_back, NULL), 1);

  migrator_start(&m, f->url);
  EXPECT_NEWER(idem_resolve(f->store, &held, &done_resp));
  migrator_join(&m);
  assert_int_equal(side_sql(f->url, set_back, NULL), 1);

  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);
  c = CLAIM(f->store, &done, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  c = CLAIM(f->store, &held, fp, NULL, IDEM_RECOVER);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)
#define URL_TEST(fn)                                                           \
  cmocka_unit_test_setup_teardown(fn, setup_url, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      URL_TEST(test_upgrade_from_0_2),
      STORE_TEST(test_newer_schema_while_open),
      STORE_TEST(test_operators_check_inside_their_transaction),
  };
  const struct CMUnitTest pg_only[] = {
      URL_TEST(test_pg_non_owner_keeps_version_2),
  };
  return run_engine_tests("schema", both, sizeof both / sizeof both[0], NULL, 0,
                          pg_only, sizeof pg_only / sizeof pg_only[0]);
}
