/*
 * test_joined.c -- idem_execute_in(): a local action inside the caller's
 * own transaction, on the caller's own connection. The caller's COMMIT
 * keeps the action and its record, its ROLLBACK drops both; a rejected
 * action rolls back to its savepoint and the transaction goes on; a second
 * transaction on the same key waits for the first in the database and then
 * replays its answer; a holder outside the transaction is in flight; a
 * connection to another database is refused. Every case counts the
 * tickets (the side effect) and checks the ticket ids answered. One suite
 * for every backend.
 */
#include "engine_harness.c"

/* The application's own connection to the store's database. */
static void *app_open(const char *url) {
  if (backend_from_env() == BACKEND_POSTGRESQL) {
    char target[URL_MAX], schema[64];
    PGconn *pg;
    if (pg_split_url(url, target, sizeof target, schema, sizeof schema) != 0)
      fail_msg("%s: cannot split the store URL", url);
    pg = PQconnectdb(target);
    if (PQstatus(pg) != CONNECTION_OK)
      fail_msg("PQconnectdb: %s", PQerrorMessage(pg));
    PQsetNoticeProcessor(pg, pg_ignore_notice, NULL);
    return pg;
  }
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(sqlite_path(url), &db, SQLITE_OPEN_READWRITE, NULL) !=
      SQLITE_OK)
    fail_msg("sqlite3_open_v2: %s", sqlite3_errmsg(db));
  sqlite3_busy_timeout(db, 20000);
  return db;
}

static void app_close(void *conn) {
  if (backend_from_env() == BACKEND_POSTGRESQL)
    PQfinish(conn);
  else
    sqlite3_close(conn);
}

/* Runs sql ("{S}": the store's schema) on the application's connection; 0
 * or -1. */
static int app_try(void *conn, const char *sql) {
  if (backend_from_env() == BACKEND_POSTGRESQL) {
    char text[1024];
    PGresult *res;
    int ok;
    if (pg_expand(sql, pg_schema, text, sizeof text) != 0)
      return -1;
    res = PQexec(conn, text);
    ok = PQresultStatus(res) == PGRES_COMMAND_OK ||
         PQresultStatus(res) == PGRES_TUPLES_OK;
    PQclear(res);
    return ok ? 0 : -1;
  }
  {
    /* SQLite: one schema, "{S}." names nothing. */
    char text[1024];
    size_t o = 0;
    for (const char *p = sql; *p && o + 1 < sizeof text;)
      if (strncmp(p, "{S}.", 4) == 0)
        p += 4;
      else
        text[o++] = *p++;
    text[o] = '\0';
    return sqlite3_exec(conn, text, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
  }
}

static void app_exec(void *conn, const char *sql) {
  if (app_try(conn, sql) != 0)
    fail_msg("%s: %s", sql,
             backend_from_env() == BACKEND_POSTGRESQL
                 ? PQerrorMessage(conn)
                 : sqlite3_errmsg(conn));
}

/* Whether a transaction is open on the application's connection. */
static int app_in_tx(void *conn) {
  if (backend_from_env() == BACKEND_POSTGRESQL)
    return PQtransactionStatus(conn) == PQTRANS_INTRANS;
  return !sqlite3_get_autocommit(conn);
}

#define IN(s, conn, id, fp, act, want)                                         \
  in_expect((s), (conn), (id), (fp), NULL, (act), (want), __LINE__)

static idem_call *in_expect(idem_store *s, void *conn, const idem_id *id,
                            const char *fp, const idem_call_options *o,
                            ticket_action *act, idem_outcome want, int line) {
  idem_call *c = NULL;
  int rc = idem_execute_in(s, conn, id, fp, o, create_ticket, act, &c);
  if (rc != IDEM_OK)
    fail_msg("line %d: idem_execute_in(%s): %s: %s", line, id->key,
             idem_rc_name(rc), idem_errmsg());
  if (!c)
    fail_msg("line %d: idem_execute_in returned no claim", line);
  if (idem_call_outcome(c) != want)
    fail_msg("line %d: idem_execute_in(%s): outcome %s, expected %s", line,
             id->key, idem_outcome_name(idem_call_outcome(c)),
             idem_outcome_name(want));
  return c;
}

/* After the caller's commit: one ticket, and a call through the store's
 * own connection replays the ticket want without acting. */
static void assert_kept(fixture *f, const idem_id *id, const char *fp,
                        long long want) {
  ticket_action again = {.payload = PAYLOAD};
  idem_call *c;
  assert_int_equal(count_tickets(f->url), 1);
  c = LOCAL(f->store, id, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(again.runs, 0);
  assert_int_equal(ticket_id_of(idem_call_response(c)), want);
  idem_call_free(c);
}

/* The caller's COMMIT keeps the ticket and the record together; until
 * then nobody else sees either. */
static void test_joined_commit_keeps_both(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c;
  fp_of(PAYLOAD, fp);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  assert_int_equal(act.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
  idem_call_free(c);
  assert_true(app_in_tx(app));
  /* Not committed: another connection sees neither. */
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  app_exec(app, "COMMIT");
  assert_int_equal(count_tickets(f->url), 1);
  {
    idem_record *r = get_record(f->store, &id);
    assert_int_equal(r->state, IDEM_STATE_COMPLETED);
    assert_int_equal(ticket_id_of(&r->response), act.ticket_id);
    idem_record_free(r);
  }
  /* A retry through the store's own connection replays it. */
  assert_kept(f, &id, fp, act.ticket_id);
  /* And so does one through the application's connection. */
  c = IN(f->store, app, &id, fp, &again, IDEM_REPLAY);
  assert_int_equal(again.runs, 0);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  assert_int_equal(count_tickets(f->url), 1);
  app_close(app);
}

/* The caller's ROLLBACK drops both: the key is free and acts again. */
static void test_joined_rollback_drops_both(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD}, second = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c;
  long long first;
  fp_of(PAYLOAD, fp);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  first = ticket_id_of(idem_call_response(c));
  assert_true(first > 0);
  idem_call_free(c);
  app_exec(app, "ROLLBACK");
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  /* The same key after the rollback acts, once. */
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &second, IDEM_PROCEED);
  assert_int_equal(second.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), second.ticket_id);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  assert_kept(f, &id, fp, second.ticket_id);
  assert_int_equal(act.runs, 1);
  app_close(app);
}

/* A rejected action rolls back to its savepoint; what the transaction did
 * before stays, and commits. */
static void test_joined_rejected_keeps_the_transaction(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD, .reject = 1};
  void *app = app_open(f->url);
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  app_exec(app, "BEGIN");
  app_exec(app, "INSERT INTO {S}.tickets (payload) VALUES ('before')");
  EXPECT_RC(IDEM_EREJECTED, idem_execute_in(f->store, app, &id, fp, NULL,
                                            create_ticket, &act, &c));
  assert_null(c);
  assert_int_equal(act.runs, 1);
  assert_true(app_in_tx(app));
  app_exec(app, "COMMIT");
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(side_sql(f->url,
                            backend_from_env() == BACKEND_POSTGRESQL
                                ? "SELECT COUNT(*) FROM {S}.tickets WHERE "
                                  "payload = 'before'"
                                : "SELECT COUNT(*) FROM tickets WHERE payload "
                                  "= 'before'",
                            NULL),
                   1);
  assert_absent(f->store, &id);
  app_close(app);
}

/* With no transaction open, one is begun and left for the caller. */
static void test_joined_begins_when_none_is_open(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c;
  fp_of(PAYLOAD, fp);
  assert_false(app_in_tx(app));
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  idem_call_free(c);
  assert_true(app_in_tx(app));
  assert_int_equal(count_tickets(f->url), 0);
  app_exec(app, "COMMIT");
  assert_kept(f, &id, fp, act.ticket_id);
  assert_int_equal(act.runs, 1);
  app_close(app);
}

/* A stored answer, another request under the key, and a holder outside
 * the transaction: REPLAY, CONFLICT and IN_FLIGHT, none acting. */
static void test_joined_outcomes_without_action(void **state) {
  fixture *f = *state;
  idem_id done = {NULL, OPERATION, KEY}, held = {NULL, OPERATION, "held"};
  char fp[IDEM_FINGERPRINT_SIZE], other[IDEM_FINGERPRINT_SIZE];
  ticket_action first = {.payload = PAYLOAD}, act = {.payload = PAYLOAD};
  idem_call_options wait = {.wait_ms = 60000};
  void *app = app_open(f->url);
  idem_call *c, *holder;
  int64_t t0;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, other);
  c = LOCAL(f->store, &done, fp, NULL, &first, IDEM_PROCEED);
  idem_call_free(c);
  /* Claimed before the transaction begins: on SQLite the transaction
   * holds the write lock, which the claim needs too. */
  holder = CLAIM(f->store, &held, fp, NULL, IDEM_PROCEED);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &done, fp, &act, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first.ticket_id);
  idem_call_free(c);
  c = IN(f->store, app, &done, other, &act, IDEM_CONFLICT);
  idem_call_free(c);
  /* In flight at once, even when asked to wait: waiting inside the
   * transaction could wait on itself. */
  t0 = now_ms();
  c = in_expect(f->store, app, &held, fp, &wait, &act, IDEM_IN_FLIGHT,
                __LINE__);
  assert_true(now_ms() - t0 < 30000);
  assert_true(idem_call_retry_after_ms(c) > 0);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  assert_int_equal(act.runs, 0);
  assert_int_equal(count_tickets(f->url), 1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, holder));
  idem_call_free(holder);
  app_close(app);
}

/* An expired holder's key is taken over inside the transaction: RECOVER,
 * attempt 2, and the record says recovered once committed. */
static void test_joined_takes_over_an_expired_lease(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options shortl = {.lease_ms = SHORT_MS};
  ticket_action act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *holder, *c;
  fp_of(PAYLOAD, fp);
  holder = CLAIM(f->store, &id, fp, &shortl, IDEM_PROCEED);
  sleep_ms(PAST_SHORT_MS);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  {
    idem_record *r = get_record(f->store, &id);
    assert_int_equal(r->state, IDEM_STATE_COMPLETED);
    assert_int_equal(r->attempt, 2);
    assert_true(r->recovered);
    assert_int_equal(ticket_id_of(&r->response), act.ticket_id);
    idem_record_free(r);
  }
  /* The first holder's completion is refused: the key moved on. */
  {
    idem_response r = {200, NULL, 0, "{}", 2};
    EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, holder, &r));
  }
  idem_call_free(holder);
  assert_int_equal(count_tickets(f->url), 1);
  app_close(app);
}

/* ---- two transactions on one key ----------------------------------------- */

typedef struct second_tx {
  const char *url;
  idem_store *store;
  const char *fp;
  void *app;
  ticket_action act;
  int rc, outcome;
  long long ticket;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int blocked; /* SQLite: its busy handler ran */
} second_tx;

/* SQLite: tells the test that the second transaction waits for the write
 * lock, then waits a little and asks again (as a busy timeout does). */
static int note_busy(void *arg, int n) {
  second_tx *t = arg;
  pthread_mutex_lock(&t->mu);
  t->blocked = 1;
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  sleep_ms(n < 10 ? 1 : 10);
  return n < 20000;
}

static void *second_main(void *arg) {
  second_tx *t = arg;
  idem_id id = {NULL, OPERATION, KEY};
  idem_call *c = NULL;
  t->rc = idem_execute_in(t->store, t->app, &id, t->fp, NULL, create_ticket,
                          &t->act, &c);
  if (t->rc == IDEM_OK) {
    t->outcome = idem_call_outcome(c);
    t->ticket = ticket_id_of(idem_call_response(c));
    idem_call_free(c);
    app_try(t->app, "COMMIT");
  }
  return NULL;
}

/* Waits until the second transaction waits for the first: SQLite's busy
 * handler ran, or PostgreSQL shows its backend waiting on a lock. */
static void await_blocked(second_tx *t) {
  if (backend_from_env() == BACKEND_POSTGRESQL) {
    char pid[32], sql[256];
    snprintf(pid, sizeof pid, "%d", PQbackendPID(t->app));
    snprintf(sql, sizeof sql,
             "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1::integer "
             "AND wait_event_type = 'Lock'");
    for (int i = 0; i < 6000; i++) {
      if (side_sql(t->url, sql, pid) == 1)
        return;
      sleep_ms(10);
    }
    fail_msg("the second transaction never waited on the first");
  }
  pthread_mutex_lock(&t->mu);
  while (!t->blocked)
    pthread_cond_wait(&t->cv, &t->mu);
  pthread_mutex_unlock(&t->mu);
}

static void two_transactions(fixture *f, int commit_first) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {NULL, OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  second_tx t;
  pthread_t th;
  void *app = app_open(f->url);
  idem_call *c;
  long long first;
  memset(&t, 0, sizeof t);
  fp_of(PAYLOAD, fp);
  t.url = f->url;
  t.store = f->store;
  t.fp = fp;
  t.act.payload = PAYLOAD;
  t.app = app_open(f->url);
  pthread_mutex_init(&t.mu, NULL);
  pthread_cond_init(&t.cv, NULL);
  if (backend_from_env() == BACKEND_SQLITE)
    sqlite3_busy_handler(t.app, note_busy, &t);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  first = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  if (backend_from_env() == BACKEND_POSTGRESQL)
    app_exec(t.app, "BEGIN");
  assert_int_equal(pthread_create(&th, NULL, second_main, &t), 0);
  await_blocked(&t);
  app_exec(app, commit_first ? "COMMIT" : "ROLLBACK");
  pthread_join(th, NULL);
  if (t.rc != IDEM_OK)
    fail_msg("the second transaction: %s: %s", idem_rc_name(t.rc),
             idem_errmsg());
  if (commit_first) {
    /* The first one's answer, and its action did not run. */
    assert_int_equal(t.outcome, IDEM_REPLAY);
    assert_int_equal(t.act.runs, 0);
    assert_int_equal(t.ticket, first);
  } else {
    assert_int_equal(t.outcome, IDEM_PROCEED);
    assert_int_equal(t.act.runs, 1);
    assert_int_equal(t.ticket, t.act.ticket_id);
  }
  assert_kept(f, &id, fp, commit_first ? first : t.act.ticket_id);
  assert_int_equal(act.runs, 1);
  app_close(t.app);
  app_close(app);
  pthread_cond_destroy(&t.cv);
  pthread_mutex_destroy(&t.mu);
}

/* The second transaction waits for the first; the first commits: the
 * second replays its ticket. */
static void test_joined_second_waits_then_replays(void **state) {
  two_transactions(*state, 1);
}

/* The first rolls back: the second acts. */
static void test_joined_second_acts_after_rollback(void **state) {
  two_transactions(*state, 0);
}

/* ---- the database makes the transaction give way ------------------------- */

/* A transaction whose snapshot is older than another's commit of the key
 * cannot decide on it: IDEM_EBUSY, nothing run or written, and the caller's
 * transaction can roll back and run again (SQLite: a deferred transaction
 * that read before the commit; PostgreSQL: REPEATABLE READ). */
static void test_joined_stale_snapshot_gives_way(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action first = {.payload = PAYLOAD}, act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c = NULL;
  long long n;
  fp_of(PAYLOAD, fp);
  if (backend_from_env() == BACKEND_POSTGRESQL)
    app_exec(app, "BEGIN ISOLATION LEVEL REPEATABLE READ");
  else
    app_exec(app, "BEGIN DEFERRED");
  /* The snapshot starts here. */
  app_exec(app, "SELECT COUNT(*) FROM {S}.tickets");
  c = LOCAL(f->store, &id, fp, NULL, &first, IDEM_PROCEED);
  idem_call_free(c);
  c = NULL;
  EXPECT_RC(IDEM_EBUSY, idem_execute_in(f->store, app, &id, fp, NULL,
                                        create_ticket, &act, &c));
  assert_null(c);
  assert_int_equal(act.runs, 0);
  app_exec(app, "ROLLBACK");
  /* Run again, it replays the committed answer. */
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first.ticket_id);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  n = count_tickets(f->url);
  assert_int_equal(n, 1);
  assert_int_equal(act.runs, 0);
  app_close(app);
}

/* An action that commits the caller's transaction itself breaks the
 * savepoint: what it wrote is kept without a record, so the key is marked
 * unknown and a retry does not act again. */
static int commit_inside(void *conn, void *ctx, idem_response *response) {
  ticket_action *a = ctx;
  int rc = create_ticket(conn, ctx, response);
  (void)a;
  if (rc == 0 && app_try(conn, "COMMIT") != 0)
    rc = 3;
  return rc;
}

static void test_joined_action_that_commits_marks_unknown(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  app_exec(app, "BEGIN");
  EXPECT_RC(IDEM_ESTORE, idem_execute_in(f->store, app, &id, fp, NULL,
                                         commit_inside, &act, &c));
  assert_null(c);
  assert_false(app_in_tx(app));
  assert_int_equal(count_tickets(f->url), 1);
  {
    idem_record *r = get_record(f->store, &id);
    assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
    idem_record_free(r);
  }
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_UNKNOWN);
  assert_int_equal(again.runs, 0);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
  app_close(app);
}

/* On a store that seals its answers, the record written through the
 * caller's connection is sealed too, and opened on replay. */
static void test_joined_sealed_store(void **state) {
  static const unsigned char key[1][IDEM_SEAL_KEY_SIZE] = {{0x5e, 0xa1}};
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c;
  fp_of(PAYLOAD, fp);
  EXPECT_RC(IDEM_OK, idem_store_seal(f->store, key, 1));
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  /* The caller gets its answer in clear. */
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  /* No ticket body in clear in the store. */
  assert_int_equal(
      side_sql(f->url,
               backend_from_env() == BACKEND_POSTGRESQL
                   ? "SELECT COUNT(*) FROM {S}.idem_records WHERE "
                     "position(convert_to('ticket_id', 'UTF8') in body) > 0"
                   : "SELECT COUNT(*) FROM idem_records WHERE instr(body, "
                     "CAST('ticket_id' AS BLOB)) > 0",
               NULL),
      0);
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), act.ticket_id);
  idem_call_free(c);
  assert_int_equal(again.runs, 0);
  app_close(app);
}

/* An action that closes the caller's connection says so
 * (IDEM_LOCAL_CLOSED): the connection is not touched again, nothing is
 * stored, and the store goes on. */
static int close_inside(void *conn, void *ctx, idem_response *response) {
  if (create_ticket(conn, ctx, response) != 0)
    return 2;
  if (backend_from_env() == BACKEND_POSTGRESQL)
    PQfinish(conn);
  else
    sqlite3_close_v2(conn);
  return IDEM_LOCAL_CLOSED;
}

static void test_joined_action_that_closes_the_connection(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  for (int begin = 0; begin < 2; begin++) {
    void *app = app_open(f->url);
    if (begin)
      app_exec(app, "BEGIN");
    EXPECT_RC(IDEM_ESTATE, idem_execute_in(f->store, app, &id, fp, NULL,
                                           close_inside, &act, &c));
    assert_null(c);
    assert_absent(f->store, &id);
  }
  assert_int_equal(act.runs, 2);
  assert_int_equal(count_tickets(f->url), 0);
  c = LOCAL(f->store, &id, fp, NULL, &again, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
}

/* SQLite: TEMP tables named as idem's do not take the record (every
 * statement names the main schema). PostgreSQL: a session's TimeZone and
 * DateStyle do not make its database look like another one. */
static void test_joined_session_quirks(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c;
  fp_of(PAYLOAD, fp);
  if (backend_from_env() == BACKEND_POSTGRESQL) {
    app_exec(app, "SET TimeZone = 'America/New_York'");
    app_exec(app, "SET DateStyle = 'SQL, DMY'");
  } else {
    app_exec(app, "CREATE TEMP TABLE idem_records AS SELECT * FROM "
                  "main.idem_records WHERE 0");
    app_exec(app, "CREATE UNIQUE INDEX temp.r ON idem_records (tenant, "
                  "operation, key)");
    app_exec(app, "CREATE TEMP TABLE idem_meta AS SELECT * FROM main.idem_meta");
  }
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_PROCEED);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  {
    idem_record *r = get_record(f->store, &id);
    assert_int_equal(r->state, IDEM_STATE_COMPLETED);
    assert_int_equal(ticket_id_of(&r->response), act.ticket_id);
    idem_record_free(r);
  }
  app_close(app);
}

/* PostgreSQL: an answer that writes nothing leaves no lock on the row: a
 * holder outside the transaction completes while it is still open. */
static void test_joined_in_flight_leaves_the_row_unlocked(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_response done = {201, NULL, 0, "{\"ticket_id\":77}", 16};
  idem_call *holder, *c;
  fp_of(PAYLOAD, fp);
  holder = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  app_exec(app, "BEGIN");
  c = IN(f->store, app, &id, fp, &act, IDEM_IN_FLIGHT);
  idem_call_free(c);
  assert_int_equal(
      side_sql(f->url,
               "SELECT COUNT(*) FROM (SELECT 1 FROM {S}.idem_records WHERE "
               "key = $1::text FOR UPDATE SKIP LOCKED) r",
               KEY),
      1);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, holder, &done));
  idem_call_free(holder);
  /* The same transaction, asked again, now replays. */
  c = IN(f->store, app, &id, fp, &act, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 77);
  idem_call_free(c);
  app_exec(app, "COMMIT");
  assert_int_equal(act.runs, 0);
  app_close(app);
}

/* ---- refusals ------------------------------------------------------------ */

static void test_joined_refusals(void **state) {
  fixture *f = *state;
  idem_id id = {NULL, OPERATION, KEY};
  char fp[IDEM_FINGERPRINT_SIZE];
  ticket_action act = {.payload = PAYLOAD};
  void *app = app_open(f->url);
  idem_call *c = (idem_call *)&act;
  fp_of(PAYLOAD, fp);
  EXPECT_RC(IDEM_EINVAL, idem_execute_in(f->store, NULL, &id, fp, NULL,
                                         create_ticket, &act, &c));
  assert_null(c);
  EXPECT_RC(IDEM_EINVAL,
            idem_execute_in(f->store, app, &id, fp, NULL, NULL, &act, &c));
  EXPECT_RC(IDEM_EINVAL, idem_execute_in(NULL, app, &id, fp, NULL,
                                         create_ticket, &act, &c));
  /* Another database. */
  if (backend_from_env() == BACKEND_POSTGRESQL) {
    char target[URL_MAX], schema[64];
    PGconn *pg;
    assert_int_equal(
        pg_split_url(f->url, target, sizeof target, schema, sizeof schema), 0);
    {
      const char *keys[] = {"dbname", "dbname", NULL};
      const char *vals[] = {target, "template1", NULL};
      pg = PQconnectdbParams(keys, vals, 1);
    }
    assert_int_equal(PQstatus(pg), CONNECTION_OK);
    EXPECT_RC(IDEM_EINVAL, idem_execute_in(f->store, pg, &id, fp, NULL,
                                           create_ticket, &act, &c));
    assert_string_not_equal(idem_errmsg(), "");
    assert_false(PQtransactionStatus(pg) == PQTRANS_INTRANS);
    PQfinish(pg);
    /* A transaction that has failed. */
    app_exec(app, "BEGIN");
    assert_int_equal(app_try(app, "SELECT 1/0"), -1);
    EXPECT_RC(IDEM_EINVAL, idem_execute_in(f->store, app, &id, fp, NULL,
                                           create_ticket, &act, &c));
    app_exec(app, "ROLLBACK");
    /* A read-only transaction: refused, and still usable. */
    app_exec(app, "BEGIN READ ONLY");
    EXPECT_RC(IDEM_EINVAL, idem_execute_in(f->store, app, &id, fp, NULL,
                                           create_ticket, &act, &c));
    assert_true(app_in_tx(app));
    app_exec(app, "SELECT 1");
    app_exec(app, "ROLLBACK");
  } else {
    char path[URL_MAX + 16];
    sqlite3 *db = NULL;
    snprintf(path, sizeof path, "%s-other", sqlite_path(f->url));
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    EXPECT_RC(IDEM_EINVAL, idem_execute_in(f->store, db, &id, fp, NULL,
                                           create_ticket, &act, &c));
    assert_true(sqlite3_get_autocommit(db));
    sqlite3_close(db);
    unlink(path);
  }
  assert_int_equal(act.runs, 0);
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  app_close(app);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      T(test_joined_commit_keeps_both),
      T(test_joined_rollback_drops_both),
      T(test_joined_rejected_keeps_the_transaction),
      T(test_joined_begins_when_none_is_open),
      T(test_joined_outcomes_without_action),
      T(test_joined_takes_over_an_expired_lease),
      T(test_joined_second_waits_then_replays),
      T(test_joined_second_acts_after_rollback),
      T(test_joined_stale_snapshot_gives_way),
      T(test_joined_action_that_commits_marks_unknown),
      T(test_joined_sealed_store),
      T(test_joined_action_that_closes_the_connection),
      T(test_joined_session_quirks),
      T(test_joined_refusals),
  };
  const struct CMUnitTest pg_only[] = {
      T(test_joined_in_flight_leaves_the_row_unlocked),
  };
  int failed = run_engine_tests("joined", both, sizeof both / sizeof *both,
                                NULL, 0, pg_only,
                                sizeof pg_only / sizeof *pg_only);
  clean_left_over();
  return failed;
}
