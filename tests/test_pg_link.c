/*
 * test_pg_link.c -- the PostgreSQL store when its connection dies with a
 * write on the wire.
 *
 * The store is opened through a small proxy (a thread of this test, on a
 * Unix socket of its own) that forwards the protocol between libpq and the
 * server of IDEM_TEST_PG_URL, and that can be told to cut one connection:
 *
 *   CUT_REQUEST  when the client sends bytes containing a pattern, drop
 *                them and close both sides: the server never ran the
 *                statement;
 *   CUT_REPLY    when the server answers with bytes containing a pattern,
 *                drop them and close both sides: the statement ran and
 *                committed (an answer is flushed only after the commit),
 *                but the client never learns it.
 *
 * For each write idem makes outside a caller's transaction (a claim's
 * insert, a takeover's COMMIT, complete, release, mark unknown), a cut
 * answer or request must not reach the caller: the call succeeds once the
 * connection is re-established, because the store sends the write again
 * and, when that changes nothing (or for the COMMIT, which cannot be sent
 * again), reads the row to tell whether the first send had committed. A
 * local action whose COMMIT answer is lost gets a clear IDEM_EUNAVAILABLE
 * (its action cannot be run again); the retry of the call replays the one
 * committed response. When the server cannot be reached again, the claim
 * fails with IDEM_EUNAVAILABLE and the key waits for its lease, then is
 * recovered.
 *
 * Every test checks that the cut happened, the outcome and attempt, the
 * records and side effects counted through a separate connection, and the
 * response bytes read back through a second store handle.
 *
 * Needs IDEM_TEST_PG_URL (scripts/check.sh starts a server); without it the
 * test fails, it never skips. Each test uses a schema of its own, dropped
 * at the end.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "idem.h"

#define OPERATION "POST /tickets"
#define TENANT "tenant-a"
#define PAYLOAD "{\"title\":\"printer on fire\"}"
#define META "{\"content-type\":\"application/json\"}"
#define MAX_PAIRS 32
#define URL_MAX 1024

#include "link_proxy.c"

/* ---- fixture ---------------------------------------------------------------- */

typedef struct fixture {
  proxy px;
  char schema[64];
  char direct[URL_MAX]; /* the server itself, with idem_schema= */
  char linked[URL_MAX]; /* through the proxy, with idem_schema= */
  idem_store *store;    /* through the proxy */
  idem_store *other;    /* direct: a fresh cache, for reading back */
} fixture;

static unsigned serial;

/* Runs sql (with "{S}" for the quoted schema) on a connection of its own;
 * returns the first column of the first row as a number, 0 when there is
 * none, and fails the test on an error. */
static long side_sql(const fixture *f, const char *tmpl) {
  char sql[1024], *o = sql;
  const char *t;
  char url[URL_MAX];
  PGconn *c;
  PGresult *r;
  long v = 0;
  for (t = tmpl; *t && o < sql + sizeof sql - 80; t++)
    if (!strncmp(t, "{S}", 3)) {
      o += sprintf(o, "\"%s\"", f->schema);
      t += 2;
    } else
      *o++ = *t;
  *o = '\0';
  snprintf(url, sizeof url, "%s", getenv("IDEM_TEST_PG_URL"));
  c = PQconnectdb(url);
  if (PQstatus(c) != CONNECTION_OK)
    fail_msg("side connection: %s", PQerrorMessage(c));
  r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK &&
      PQresultStatus(r) != PGRES_COMMAND_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
    v = atol(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(c);
  return v;
}

static int setup(void **state) {
  const char *url = getenv("IDEM_TEST_PG_URL");
  fixture *f = calloc(1, sizeof *f);
  PQconninfoOption *o;
  const char *user = NULL, *db = NULL;
  int rc;
  if (!f)
    return -1;
  if (proxy_start(&f->px, url) != 0)
    return -1;
  snprintf(f->schema, sizeof f->schema, "link_%ld_%u", (long)getpid(),
           ++serial);
  snprintf(f->direct, sizeof f->direct, "%s%cidem_schema=%s", url,
           strchr(url, '?') ? '&' : '?', f->schema);
  o = PQconninfoParse(url, NULL);
  for (PQconninfoOption *i = o; i && i->keyword; i++) {
    if (!strcmp(i->keyword, "user") && i->val && *i->val)
      user = i->val;
    if (!strcmp(i->keyword, "dbname") && i->val && *i->val)
      db = i->val;
  }
  snprintf(f->linked, sizeof f->linked,
           "postgresql://%s%s/%s?host=%s&port=%s&idem_schema=%s",
           user ? user : "", user ? "@" : "", db ? db : "postgres", f->px.dir,
           f->px.port, f->schema);
  PQconninfoFree(o);
  *state = f;
  side_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  if ((rc = idem_store_open(f->direct, NULL, &f->other)) != IDEM_OK ||
      (rc = idem_store_open(f->linked, NULL, &f->store)) != IDEM_OK) {
    fprintf(stderr, "idem_store_open: %s: %s\n", idem_rc_name(rc),
            idem_errmsg());
    return -1;
  }
  side_sql(f, "CREATE TABLE {S}.tickets (id bigserial PRIMARY KEY, payload "
              "text NOT NULL)");
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  idem_store_close(f->store);
  idem_store_close(f->other);
  proxy_stop(&f->px);
  side_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  free(f);
  return 0;
}

/* ---- helpers ---------------------------------------------------------------- */

#define EXPECT_RC(want, expr) expect_rc_at((want), (expr), #expr, __LINE__)

static void expect_rc_at(int want, int got, const char *what, int line) {
  if (got != want)
    fail_msg("line %d: %s returned %s (%s), expected %s", line, what,
             idem_rc_name(got), idem_errmsg(), idem_rc_name(want));
}

static void fp_of(const char *payload, char hex[IDEM_FINGERPRINT_SIZE]) {
  EXPECT_RC(IDEM_OK, idem_fingerprint(payload, strlen(payload), 1, hex));
}

static long count_records(const fixture *f) {
  return side_sql(f, "SELECT count(*) FROM {S}.idem_records");
}

static long count_tickets(const fixture *f) {
  return side_sql(f, "SELECT count(*) FROM {S}.tickets");
}

/* Claims id through `store` and checks the outcome and attempt. */
static idem_call *claim(idem_store *store, const idem_id *id, const char *fp,
                        const idem_call_options *o, idem_outcome want,
                        int attempt) {
  idem_call *c = NULL;
  EXPECT_RC(IDEM_OK, idem_claim(store, id, fp, o, &c));
  assert_non_null(c);
  if (idem_call_outcome(c) != want)
    fail_msg("outcome %s, expected %s", idem_outcome_name(idem_call_outcome(c)),
             idem_outcome_name(want));
  if (attempt)
    assert_int_equal(idem_call_attempt(c), attempt);
  return c;
}

static void assert_body(const idem_call *c, const char *body) {
  const idem_response *r = idem_call_response(c);
  assert_non_null(r);
  assert_int_equal(r->status, 201);
  assert_int_equal(r->body_len, strlen(body));
  assert_memory_equal(r->body, body, strlen(body));
  assert_int_equal(r->meta_len, strlen(META));
  assert_memory_equal(r->meta, META, strlen(META));
}

static idem_record *record_of(const fixture *f, const idem_id *id) {
  idem_record *r = NULL;
  EXPECT_RC(IDEM_OK, idem_get(f->other, id, &r));
  return r;
}

/* A claim through the second handle (its own cache) replays body, at
 * attempt. */
static void assert_replays(const fixture *f, const idem_id *id, const char *fp,
                           const char *body, int attempt) {
  idem_call *again = claim(f->other, id, fp, NULL, IDEM_REPLAY, attempt);
  assert_body(again, body);
  idem_call_free(again);
}

/* Completes the claim c with body (and frees it), then checks the replay. */
static void complete_then_replay(const fixture *f, idem_call *c,
                                 const idem_id *id, const char *fp,
                                 const char *body, int attempt) {
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  assert_replays(f, id, fp, body, attempt);
}

/* ---- the claim's insert --------------------------------------------------- */

/* The claim's insert with its answer or its request cut: the caller holds
 * the key all the same (PROCEED, attempt 1), one record, and its response
 * is the one stored. */
static void run_claim_cut(fixture *f, cut_kind kind, const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "claim-lost-key"};
  const char body[] = "{\"ticket_id\":101}";
  idem_call *c;
  fp_of(PAYLOAD, fp);
  proxy_arm(&f->px, kind, pattern);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 1);
  complete_then_replay(f, c, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

static void test_claim_answer_lost(void **state) {
  run_claim_cut(*state, CUT_REPLY, "INSERT 0 1");
}

static void test_claim_request_lost(void **state) {
  run_claim_cut(*state, CUT_REQUEST, "claim-lost-key");
}

/* A takeover (RECOVER) runs in a transaction; its COMMIT's answer is lost:
 * the caller holds the key all the same, attempt 2. */
static void test_takeover_commit_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "takeover-lost-key"};
  const char body[] = "{\"ticket_id\":105}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *first, *c;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  first = claim(f->other, &id, fp, &short_lease, IDEM_PROCEED, 1);
  idem_call_free(first); /* a holder that died */
  nanosleep(&ms5, NULL);
  proxy_arm(&f->px, CUT_REPLY, "COMMIT");
  c = claim(f->store, &id, fp, NULL, IDEM_RECOVER, 2);
  assert_int_equal(proxy_cuts(&f->px), 1);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* The takeover's COMMIT never reaches the server: the takeover is rolled
 * back, the caller is told to try again (the row shows that it does not
 * hold the key), and its retry takes the key over. */
static void test_takeover_commit_request_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "takeover-unsent-key"};
  const char body[] = "{\"ticket_id\":106}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *first, *c = (idem_call *)&c;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  first = claim(f->other, &id, fp, &short_lease, IDEM_PROCEED, 1);
  idem_call_free(first);
  nanosleep(&ms5, NULL);
  /* The COMMIT query itself ("READ COMMITTED" in BEGIN must not match). */
  proxy_arm_bytes(&f->px, CUT_REQUEST, "COMMIT", sizeof "COMMIT");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(f->store, &id, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "try again"));
  assert_int_equal(proxy_cuts(&f->px), 1);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->attempt, 1);
  idem_record_free(r);
  c = claim(f->store, &id, fp, NULL, IDEM_RECOVER, 2);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* ---- the fenced writes ---------------------------------------------------- */

static void run_complete_cut(fixture *f, cut_kind kind, const char *pattern,
                              const char *body) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-lost-key"};
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  assert_replays(f, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

static void test_complete_answer_lost(void **state) {
  run_complete_cut(*state, CUT_REPLY, "UPDATE 1", "{\"ticket_id\":202}");
}

static void test_complete_request_lost(void **state) {
  run_complete_cut(*state, CUT_REQUEST, "\"ticket_id\":203",
                    "{\"ticket_id\":203}");
}

/* Release with its answer or its request cut: released, so the next claim
 * proceeds afresh (attempt 1). */
static void run_release_cut(fixture *f, cut_kind kind, const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "release-lost-key"};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  assert_int_equal(count_records(f), 0);
  c = claim(f->other, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->other, c));
  idem_call_free(c);
}

static void test_release_answer_lost(void **state) {
  run_release_cut(*state, CUT_REPLY, "DELETE 1");
}

static void test_release_request_lost(void **state) {
  run_release_cut(*state, CUT_REQUEST, "release-lost-key");
}

/* Mark unknown with its answer or its request cut: marked, and claims see
 * UNKNOWN. */
static void run_mark_unknown_cut(fixture *f, cut_kind kind,
                                 const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unknown-lost-key"};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  idem_record_free(r);
  c = claim(f->other, &id, fp, NULL, IDEM_UNKNOWN, 0);
  idem_call_free(c);
  assert_int_equal(count_records(f), 1);
}

static void test_mark_unknown_answer_lost(void **state) {
  run_mark_unknown_cut(*state, CUT_REPLY, "UPDATE 1");
}

static void test_mark_unknown_request_lost(void **state) {
  run_mark_unknown_cut(*state, CUT_REQUEST, "unknown-lost-key");
}

/* Renew with its answer cut: sent again, it renews again; the holder keeps
 * the key with the new lease and completes it. */
static void test_renew_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "renew-lost-key"};
  const char body[] = "{\"ticket_id\":250}";
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 1");
  EXPECT_RC(IDEM_OK, idem_renew(f->store, c, 600000));
  assert_int_equal(proxy_cuts(&f->px), 1);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->lease_expires_ms - r->updated_ms, 600000);
  idem_record_free(r);
  complete_then_replay(f, c, &id, fp, body, 1);
}

/* A completion that lost its lease to a newer holder is still refused as
 * stale when its answer is lost: the row that the resend reads holds the
 * newer holder's response, not this one. */
static void test_stale_complete_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-lost-key"};
  const char newer_body[] = "{\"ticket_id\":301}", old_body[] =
                                                       "{\"ticket_id\":302}";
  idem_response newer = {201, META, strlen(META), newer_body,
                         strlen(newer_body)},
                old = {201, META, strlen(META), old_body, strlen(old_body)};
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  EXPECT_RC(IDEM_OK, idem_complete(f->other, takeover, &newer));
  idem_call_free(takeover);
  /* The stale completion changes no row, so its answer says UPDATE 0. */
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 0");
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, c, &old));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  assert_replays(f, &id, fp, newer_body, 2);
}

/* ---- a fenced write retried by its caller ------------------------------- */

/*
 * The write commits, its answer is lost and the reconnect is refused: the
 * caller is told IDEM_EUNAVAILABLE and keeps the claim. Once the server can
 * be reached again, the caller's retry changes no row, and the row says that
 * the first send had done what was asked: IDEM_OK, not IDEM_ESTALE.
 */
static void lose_answer_unreachable(fixture *f, const char *answer) {
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REPLY, answer);
}

static void test_complete_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-retried-key"};
  const char body[] = "{\"ticket_id\":260}";
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_complete(f->store, c, &resp));
  assert_int_equal(proxy_cuts(&f->px), 1);
  /* It was stored all the same. */
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  /* Done: the claim is no longer held. */
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  assert_replays(f, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

/* The retry carries another response than the one stored: that one was not
 * stored, and the caller is told so. */
static void test_complete_retried_other_response(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-other-key"};
  const char body[] = "{\"ticket_id\":261}", other_body[] =
                                                  "{\"ticket_id\":262}";
  idem_response resp = {201, META, strlen(META), body, strlen(body)},
                other = {201, META, strlen(META), other_body,
                         strlen(other_body)};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_complete(f->store, c, &resp));
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, c, &other));
  assert_non_null(strstr(idem_errmsg(), "this response was not stored"));
  idem_call_free(c);
  assert_replays(f, &id, fp, body, 1);
}

static void test_mark_unknown_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unknown-retried-key"};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  EXPECT_RC(IDEM_ESTATE, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(r->attempt, 1);
  idem_record_free(r);
  c = claim(f->other, &id, fp, NULL, IDEM_UNKNOWN, 0);
  idem_call_free(c);
  assert_int_equal(count_records(f), 1);
}

static void test_release_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "release-retried-key"};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "DELETE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 0);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  c = claim(f->other, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->other, c));
  idem_call_free(c);
}

/* A holder whose lease was taken over, and whose release's answer is lost,
 * is told IDEM_ESTALE: the newer holder's row is there, untouched. */
static void test_stale_release_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-release-key"};
  const char body[] = "{\"ticket_id\":303}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  proxy_arm(&f->px, CUT_REPLY, "DELETE 0");
  EXPECT_RC(IDEM_ESTALE, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
  EXPECT_RC(IDEM_OK,
            idem_complete(f->other, takeover,
                          &(idem_response){201, META, strlen(META), body,
                                           strlen(body)}));
  idem_call_free(takeover);
  assert_replays(f, &id, fp, body, 2);
}

/* The same for a mark unknown: the newer holder marks the key unknown
 * itself; the older holder's mark changed nothing and is stale. */
static void test_stale_mark_unknown(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-unknown-key"};
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->other, takeover));
  idem_call_free(takeover);
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 0");
  EXPECT_RC(IDEM_ESTALE, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
}

/* ---- a local action ------------------------------------------------------- */

typedef struct ticket {
  const fixture *f;
  int runs;
  long id;
  char body[64];
} ticket;

static int create_ticket(void *conn, void *ctx, idem_response *r) {
  ticket *t = ctx;
  char sql[256];
  const char *v[1] = {PAYLOAD};
  PGresult *res;
  snprintf(sql, sizeof sql,
           "INSERT INTO \"%s\".tickets (payload) VALUES ($1) RETURNING id",
           t->f->schema);
  t->runs++;
  res = PQexecParams(conn, sql, 1, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    PQclear(res);
    return 1;
  }
  t->id = atol(PQgetvalue(res, 0, 0));
  PQclear(res);
  snprintf(t->body, sizeof t->body, "{\"ticket_id\":%ld}", t->id);
  *r = (idem_response){201, META, strlen(META), t->body, strlen(t->body)};
  return 0;
}

/* The answer to the COMMIT of a local action is lost: nobody can tell
 * whether it committed, so the call fails with IDEM_EUNAVAILABLE; it had,
 * so the retry replays the one ticket and runs nothing. */
static void test_local_commit_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "local-lost-key"};
  ticket first = {.f = f}, retry = {.f = f};
  idem_call *c = NULL;
  char want[64];
  fp_of(PAYLOAD, fp);
  proxy_arm(&f->px, CUT_REPLY, "COMMIT");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_execute_local(f->store, &id, fp, NULL,
                                                  create_ticket, &first, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "whether it committed is unknown"));
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(first.runs, 1);
  assert_int_equal(count_tickets(f), 1);
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL, create_ticket,
                                        &retry, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(retry.runs, 0);
  snprintf(want, sizeof want, "{\"ticket_id\":%ld}", first.id);
  assert_body(c, want);
  idem_call_free(c);
  assert_int_equal(count_tickets(f), 1);
  assert_int_equal(count_records(f), 1);
}

/* ---- no way back ------------------------------------------------------------ */

/* The claim's answer is lost and the server cannot be reached again: a
 * clear IDEM_EUNAVAILABLE. The insert had committed, so once the server is
 * back the key is in flight until the lease ends, and then recovered
 * (attempt 2) and completed once. */
static void test_claim_answer_lost_no_reconnect(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unreachable-key"};
  const char body[] = "{\"ticket_id\":404}";
  idem_call_options lease = {.lease_ms = 4000};
  idem_call *c = NULL;
  struct timespec wait;
  int64_t left;
  idem_record *none = NULL;
  fp_of(PAYLOAD, fp);
  /* A connection in the pool first, for the insert to go out on. */
  EXPECT_RC(IDEM_ENOTFOUND, idem_get(f->store, &id, &none));
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REPLY, "INSERT 0 1");
  /* The pool's connection is up: the insert goes out, its answer is cut,
   * and the reconnect is refused. */
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(f->store, &id, fp, &lease, &c));
  assert_null(c);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 1);
  proxy_refuse(&f->px, 0);
  c = claim(f->store, &id, fp, &lease, IDEM_IN_FLIGHT, 1);
  left = idem_call_retry_after_ms(c);
  assert_true(left > 0 && left <= 4000);
  idem_call_free(c);
  /* Until the lease ends, and a little more. */
  wait.tv_sec = (time_t)((left + 50) / 1000);
  wait.tv_nsec = (long)((left + 50) % 1000) * 1000000L;
  nanosleep(&wait, NULL);
  c = claim(f->store, &id, fp, &lease, IDEM_RECOVER, 2);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* ---- a server or network that stops answering ------------------------------ */

/*
 * The proxy holds a statement or its answer with the connection up, as a
 * stalled server or middlebox does: neither statement_timeout (the server
 * never hears the statement, or answered already) nor TCP's timeouts
 * (packets are acknowledged) end the wait. Each call must still end, by
 * its connection's deadline (the session's statement_timeout, 1 s here,
 * and a grace), with the outcome a lost connection has. Every call runs
 * on a thread of its own, bounded: one that has not returned by BOUND_S is
 * a failure (the proxy then lets go, so that it can end).
 */
#define BOUND_S 30
#define QUICK "&options=-c%20statement_timeout%3D1000"

typedef struct bounded {
  void (*run)(struct bounded *b);
  fixture *f;
  idem_store *store;
  idem_id id;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options o;
  idem_call *c;
  idem_exec *x;
  idem_response resp;
  ticket t;
  int rc;
  char msg[512];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  int64_t t_done; /* the monotonic ms it ended at */
} bounded;

static void *bounded_main(void *arg) {
  bounded *b = arg;
  b->run(b);
  snprintf(b->msg, sizeof b->msg, "%s", idem_errmsg());
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    b->t_done = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
  }
  pthread_mutex_lock(&b->mu);
  b->done = 1;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
  return NULL;
}

/* Waits up to s seconds for b; whether it ended. */
static int bounded_wait(bounded *b, int s) {
  struct timespec until;
  int done;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += s;
  pthread_mutex_lock(&b->mu);
  while (!b->done &&
         pthread_cond_timedwait(&b->cv, &b->mu, &until) != ETIMEDOUT)
    ;
  done = b->done;
  pthread_mutex_unlock(&b->mu);
  return done;
}

/* Runs b->run on a thread; fails the test when it does not end within
 * BOUND_S seconds (after letting the proxy go, and joining). */
static void run_bounded(bounded *b) {
  pthread_t t;
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  b->done = 0;
  assert_int_equal(pthread_create(&t, NULL, bounded_main, b), 0);
  int done = bounded_wait(b, BOUND_S);
  if (!done)
    proxy_release(&b->f->px);
  pthread_join(t, NULL);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
  if (!done)
    fail_msg("the call did not return within %d s of a stalled connection",
             BOUND_S);
}

/* A store through the proxy whose sessions have a statement_timeout of
 * 1 s. */
static idem_store *quick_store(const fixture *f) {
  char url[URL_MAX + 64];
  idem_store *s = NULL;
  snprintf(url, sizeof url, "%s%s", f->linked, QUICK);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  return s;
}

static void run_claim(bounded *b) {
  b->rc = idem_claim(b->store, &b->id, b->fp, &b->o, &b->c);
}

/* The claim's insert, or its answer, held: the claim gives the connection
 * up at its deadline, sends the insert again on a new one, and holds the
 * key (PROCEED, attempt 1, one record). */
static void run_claim_stall(fixture *f, cut_kind kind, const char *pattern,
                            const char *key) {
  bounded b = {.run = run_claim, .f = f};
  const char body[] = "{\"ticket_id\":202}";
  b.store = quick_store(f);
  b.id = (idem_id){TENANT, OPERATION, key};
  fp_of(PAYLOAD, b.fp);
  /* A connection in the pool first: the claim's statements go out on it. */
  assert_int_equal(idem_store_check(b.store), IDEM_OK);
  proxy_arm(&f->px, kind, pattern);
  run_bounded(&b);
  if (b.rc != IDEM_OK)
    fail_msg("claim: %s: %s", idem_rc_name(b.rc), b.msg);
  assert_int_equal(idem_call_outcome(b.c), IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(b.c), 1);
  assert_int_equal(proxy_stalls(&f->px), 1);
  assert_int_equal(proxy_closed_held(&f->px), 1);
  assert_int_equal(count_records(f), 1);
  {
    idem_response resp = {201, META, strlen(META), body, strlen(body)};
    EXPECT_RC(IDEM_OK, idem_complete(b.store, b.c, &resp));
  }
  idem_call_free(b.c);
  assert_replays(f, &b.id, b.fp, body, 1);
  idem_store_close(b.store);
}

static void test_claim_request_stalls(void **state) {
  run_claim_stall(*state, STALL_REQUEST, "stall-claim-request",
                  "stall-claim-request");
}

static void test_claim_answer_stalls(void **state) {
  run_claim_stall(*state, STALL_REPLY, "INSERT 0 1", "stall-claim-answer");
}

static void run_local(bounded *b) {
  b->rc = idem_execute_local(b->store, &b->id, b->fp, NULL, create_ticket,
                             &b->t, &b->c);
}

/* A local action's COMMIT answered, and the answer held: given up at the
 * deadline, unknown whether it committed (IDEM_EUNAVAILABLE, as for a lost
 * connection); it had, so the retry replays the one ticket. */
static void test_local_commit_answer_stalls(void **state) {
  fixture *f = *state;
  bounded b = {.run = run_local, .f = f};
  ticket retry = {.f = f};
  idem_call *c = NULL;
  char want[64];
  b.store = quick_store(f);
  b.id = (idem_id){TENANT, OPERATION, "stall-local-commit"};
  b.t.f = f;
  fp_of(PAYLOAD, b.fp);
  assert_int_equal(idem_store_check(b.store), IDEM_OK);
  proxy_arm(&f->px, STALL_REPLY, "COMMIT");
  run_bounded(&b);
  EXPECT_RC(IDEM_EUNAVAILABLE, b.rc);
  assert_null(b.c);
  if (!strstr(b.msg, "whether it committed is unknown") ||
      !strstr(b.msg, "no answer within"))
    fail_msg("message: %s", b.msg);
  assert_int_equal(proxy_stalls(&f->px), 1);
  assert_int_equal(b.t.runs, 1);
  assert_int_equal(count_tickets(f), 1);
  EXPECT_RC(IDEM_OK, idem_execute_local(b.store, &b.id, b.fp, NULL,
                                        create_ticket, &retry, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(retry.runs, 0);
  snprintf(want, sizeof want, "{\"ticket_id\":%ld}", b.t.id);
  assert_body(c, want);
  idem_call_free(c);
  assert_int_equal(count_tickets(f), 1);
  assert_int_equal(count_records(f), 1);
  idem_store_close(b.store);
}

/* Claims the key again and again through the direct handle until told to
 * stop, counting what it was answered: while the holder's ending is
 * pending, nobody may take the key over. */
typedef struct taker {
  fixture *f;
  const idem_id *id;
  const char *fp;
  int stop, claims, took, replays;
  pthread_mutex_t mu;
} taker;

static void *taker_main(void *arg) {
  taker *t = arg;
  idem_call_options o = {.lease_ms = 9000};
  for (;;) {
    idem_call *c = NULL;
    pthread_mutex_lock(&t->mu);
    int stop = t->stop;
    pthread_mutex_unlock(&t->mu);
    if (stop)
      break;
    if (idem_claim(t->f->other, t->id, t->fp, &o, &c) == IDEM_OK) {
      idem_outcome out = idem_call_outcome(c);
      t->claims++;
      if (out == IDEM_PROCEED || out == IDEM_RECOVER) {
        t->took++;
        idem_release(t->f->other, c);
      }
      t->replays += out == IDEM_REPLAY;
    }
    idem_call_free(c);
  }
  return NULL;
}

static void run_end(bounded *b) {
  b->rc = idem_execute_end(b->x, IDEM_EXEC_DONE, &b->resp);
}

/* The holder's renewal is held (the renewer's connection up, no answer)
 * when its action ends: the ending does not wait for it past its own
 * lease. It gives the renewal up and stores the response while the lease
 * holds, and no other caller ever takes the key over. */
static void test_renewal_stalls_ending_in_time(void **state) {
  fixture *f = *state;
  bounded b = {.run = run_end, .f = f};
  idem_execute_options o = {.call = {.lease_ms = 9000}};
  const char body[] = "{\"ticket_id\":303}";
  taker t = {.f = f};
  pthread_t tt;
  b.store = quick_store(f);
  b.id = (idem_id){TENANT, OPERATION, "stall-renewal"};
  fp_of(PAYLOAD, b.fp);
  EXPECT_RC(IDEM_OK, idem_execute_begin(b.store, &b.id, PAYLOAD,
                                        strlen(PAYLOAD), &o, &b.x, &b.c));
  assert_non_null(b.x);
  assert_int_equal(idem_call_outcome(b.c), IDEM_PROCEED);
  /* The first renewal (a third into the lease) is held. */
  proxy_arm(&f->px, STALL_REQUEST, "unnest(");
  while (proxy_stalls(&f->px) == 0)
    usleep(1000);
  t.id = &b.id;
  t.fp = b.fp;
  pthread_mutex_init(&t.mu, NULL);
  assert_int_equal(pthread_create(&tt, NULL, taker_main, &t), 0);
  b.resp = (idem_response){201, META, strlen(META), body, strlen(body)};
  run_bounded(&b);
  pthread_mutex_lock(&t.mu);
  t.stop = 1;
  pthread_mutex_unlock(&t.mu);
  pthread_join(tt, NULL);
  pthread_mutex_destroy(&t.mu);
  if (b.rc != IDEM_OK)
    fail_msg("execute_end: %s: %s", idem_rc_name(b.rc), b.msg);
  assert_int_equal(idem_call_state(b.c), IDEM_STATE_COMPLETED);
  if (t.took)
    fail_msg("another caller took the key over %d times of %d claims while "
             "the ending was pending", t.took, t.claims);
  idem_call_free(b.c);
  assert_replays(f, &b.id, b.fp, body, 1);
  {
    idem_record *r = record_of(f, &b.id);
    assert_int_equal(r->attempt, 1);
    assert_int_equal(r->recovered, 0);
    idem_record_free(r);
  }
  assert_int_equal(count_records(f), 1);
  idem_store_close(b.store);
}

static void run_wait(bounded *b) {
  b->rc = idem_claim(b->store, &b->id, b->fp, &b->o, &b->c);
}

/* The waiters' LISTEN connection goes silent (the notification of the
 * ending is held): its heartbeat finds it within seconds, and the waiter
 * asks again and replays the holder's response, long before the holder's
 * lease (a minute) would have told it anything. */
static void test_listener_stalls(void **state) {
  fixture *f = *state;
  bounded b = {.run = run_wait, .f = f};
  idem_call_options lease = {.lease_ms = 60000};
  const char body[] = "{\"ticket_id\":404}";
  idem_call *holder;
  b.store = quick_store(f);
  b.id = (idem_id){TENANT, OPERATION, "stall-listener"};
  b.o.wait_ms = 120000;
  fp_of(PAYLOAD, b.fp);
  holder = claim(f->other, &b.id, b.fp, &lease, IDEM_PROCEED, 1);
  proxy_arm(&f->px, STALL_REPLY, "idem_ended");
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, bounded_main, &b), 0);
    /* The waiter asked to be told: its listener is in force. */
    while (side_sql(f, "SELECT count(*) FROM {S}.idem_records WHERE watched") !=
           1) {
      assert_int_equal(b.done, 0);
      usleep(1000);
    }
    complete_then_replay(f, holder, &b.id, b.fp, body, 1);
    int done = bounded_wait(&b, BOUND_S);
    if (!done)
      proxy_release(&f->px);
    pthread_join(t, NULL);
    if (!done)
      fail_msg("the waiter was not answered within %d s of the ending",
               BOUND_S);
  }
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  EXPECT_RC(IDEM_OK, b.rc);
  assert_int_equal(idem_call_outcome(b.c), IDEM_REPLAY);
  assert_body(b.c, body);
  assert_int_equal(proxy_stalls(&f->px), 1);
  idem_call_free(b.c);
  idem_store_close(b.store);
}

/* The holder's wall clock steps 30 s back, a renewal lands after it, and
 * the next one is held. The holder's lease signal is read on its monotonic
 * clock against the server's: it must come no later than another caller
 * (deciding by the server's clock) takes the key over, not 30 s after. */
int clockshift_set(int64_t ms);

static void run_recover_wait(bounded *b) {
  b->rc = idem_claim(b->store, &b->id, b->fp, &b->o, &b->c);
}

static void test_holder_clock_step_back(void **state) {
  fixture *f = *state;
  idem_execute_options o = {.call = {.lease_ms = 3000}};
  bounded rival = {.run = run_recover_wait, .f = f};
  idem_store *quick = quick_store(f);
  idem_id id = {TENANT, OPERATION, "clock-step-holder"};
  const char body[] = "{\"ticket_id\":505}";
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  idem_exec *x = NULL;
  idem_call *held = NULL;
  int64_t first, t_lost = 0, t_rec = 0;
  struct timespec ts;
  pthread_t t;

  EXPECT_RC(IDEM_OK, idem_execute_begin(quick, &id, PAYLOAD, strlen(PAYLOAD),
                                        &o, &x, &held));
  assert_int_equal(idem_call_outcome(held), IDEM_PROCEED);
  first = idem_call_lease_expires_ms(held);
  assert_int_equal(clockshift_set(-30000), 0);
  /* One renewal lands after the step (the lease moves on), then the next
   * is held. */
  while (idem_call_lease_expires_ms(held) == first)
    usleep(2000);
  proxy_arm(&f->px, STALL_REQUEST, "unnest(");
  while (proxy_stalls(&f->px) == 0)
    usleep(1000);
  /* Another caller waits for the key and takes it over at the lease's end,
   * by the server's clock. */
  rival.store = f->other;
  rival.id = id;
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, rival.fp));
  rival.o.wait_ms = 60000;
  pthread_mutex_init(&rival.mu, NULL);
  pthread_cond_init(&rival.cv, NULL);
  assert_int_equal(pthread_create(&t, NULL, bounded_main, &rival), 0);
  {
    /* The signal's moment is the deadline its timer is set to (no renewal
     * can move it while the one in flight is held), not the moment this
     * thread is next scheduled: on a loaded machine that can come after
     * the rival's answer, with the deadline itself in time. */
    struct pollfd p = {idem_exec_lost_fd(x), POLLIN, 0};
    struct itimerspec left;
    int64_t deadline;
    assert_int_equal(timerfd_gettime(p.fd, &left), 0);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    deadline = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 +
               (int64_t)left.it_value.tv_sec * 1000 +
               (left.it_value.tv_nsec + 999999) / 1000000;
    if (poll(&p, 1, 60000) == 1 && idem_exec_lost(x))
      t_lost = deadline;
  }
  pthread_mutex_lock(&rival.mu);
  while (!rival.done)
    pthread_cond_wait(&rival.cv, &rival.mu);
  pthread_mutex_unlock(&rival.mu);
  clock_gettime(CLOCK_MONOTONIC, &ts);
  pthread_join(t, NULL);
  pthread_mutex_destroy(&rival.mu);
  pthread_cond_destroy(&rival.cv);
  EXPECT_RC(IDEM_OK, rival.rc);
  assert_int_equal(idem_call_outcome(rival.c), IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(rival.c), 2);
  t_rec = rival.t_done;
  if (!t_lost)
    fail_msg("the holder was never told its lease was lost");
  if (t_lost > t_rec)
    fail_msg("the holder was told %lld ms after another caller took its key "
             "over", (long long)(t_lost - t_rec));
  EXPECT_RC(IDEM_ESTALE, idem_execute_end(x, IDEM_EXEC_DONE, &resp));
  idem_call_free(held);
  complete_then_replay(f, rival.c, &id, rival.fp, body, 2);
  clockshift_set(0);
  proxy_release(&f->px);
  idem_store_close(quick);
}

/* ---- a server that accepts no writes --------------------------------------- */

/*
 * Sessions that are read-only (as on a standby the store's URL reached
 * after a failover): a claim fails with IDEM_EUNAVAILABLE, says why and
 * what to do, writes nothing, and the connection is re-established before
 * its next use, so that a URL listing several hosts with
 * target_session_attrs=read-write would find the primary.
 */
static void test_read_only_server(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], url[URL_MAX + 64];
  idem_id id = {TENANT, OPERATION, "read-only-key"};
  idem_store *ro = NULL;
  idem_call *c = (idem_call *)&c;
  int before;
  fp_of(PAYLOAD, fp);
  snprintf(url, sizeof url,
           "%s&options=-c%%20default_transaction_read_only%%3Don", f->linked);
  /* The schema is up to date, so opening only reads. */
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &ro));
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(ro, &id, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "25006"));
  assert_non_null(strstr(idem_errmsg(), "target_session_attrs=read-write"));
  assert_int_equal(count_records(f), 0);
  before = proxy_accepted(&f->px);
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(ro, &id, fp, NULL, &c));
  assert_null(c);
  assert_int_equal(proxy_accepted(&f->px), before + 1);
  idem_store_close(ro);
  assert_int_equal(count_records(f), 0);
  /* The same key through a writable session: a new key, attempt 1. */
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/* ---- a link that closes at once ------------------------------------------ */

/* A server that closes every new connection before it answers (one
 * restarting, or a proxy in front of one that is down): the open fails
 * with IDEM_EUNAVAILABLE, "retry later", and works once it answers. */
static void test_open_link_closed(void **state) {
  fixture *f = *state;
  idem_store *store = (idem_store *)&store;
  proxy_refuse(&f->px, 1);
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_store_open(f->linked, NULL, &store));
  assert_null(store);
  assert_non_null(strstr(idem_errmsg(), "closed the connection"));
  assert_null(strstr(idem_errmsg(), "retrying will not help"));
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_store_open(f->linked, NULL, &store));
  idem_store_close(store);
}

/* ---- durability after a reconnect --------------------------------------- */

static int show_synchronous_commit(void *conn, void *ctx, idem_response *r) {
  PGresult *res = PQexec(conn, "SHOW synchronous_commit");
  (void)r;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    snprintf(ctx, 64, "%s", PQgetvalue(res, 0, 0));
  PQclear(res);
  return 1; /* nothing to keep */
}

/* A URL that asks for synchronous_commit=off: idem's sessions run with
 * "on", the one re-established after a lost connection too. */
static void test_synchronous_commit_after_reconnect(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], url[URL_MAX + 64], value[64] = "";
  idem_id id = {TENANT, OPERATION, "sync-key"},
          show = {TENANT, "SHOW", "synchronous-commit"};
  idem_store *store = NULL;
  idem_call *c = NULL;
  int before;
  fp_of(PAYLOAD, fp);
  snprintf(url, sizeof url, "%s&options=-c%%20synchronous_commit%%3Doff",
           f->linked);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &store));
  EXPECT_RC(IDEM_EREJECTED,
            idem_execute_local(store, &show, fp, NULL, show_synchronous_commit,
                               value, &c));
  assert_string_equal(value, "on");
  before = proxy_accepted(&f->px);
  proxy_arm(&f->px, CUT_REPLY, "INSERT 0 1");
  c = claim(store, &id, fp, NULL, IDEM_PROCEED, 1);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(proxy_accepted(&f->px), before + 1);
  EXPECT_RC(IDEM_OK, idem_release(store, c));
  idem_call_free(c);
  c = NULL;
  value[0] = '\0';
  EXPECT_RC(IDEM_EREJECTED,
            idem_execute_local(store, &show, fp, NULL, show_synchronous_commit,
                               value, &c));
  assert_string_equal(value, "on");
  idem_store_close(store);
}

/* ---- no password in the messages of later calls ------------------------ */

static int count_record(const idem_record *r, void *ctx) {
  (void)r;
  ++*(int *)ctx;
  return 0;
}

/*
 * A password with an unencoded '@' makes libpq read its second half as a
 * host name. With a second host that works, the store opens; once that
 * host refuses new connections, every call's message quotes the first
 * "host name" ("ss9@nosuch.invalid"). No call, the operators' included,
 * shows that piece of the password.
 */
static void test_secret_in_later_messages(void **state) {
  fixture *f = *state;
  char url[URL_MAX + 128], fp[IDEM_FINGERPRINT_SIZE], value[64] = "";
  idem_id id = {TENANT, OPERATION, "cut-here"};
  idem_store *store = NULL;
  idem_record *r = NULL;
  idem_call *c = NULL;
  int64_t removed = 0;
  int n = 0;
  fp_of(PAYLOAD, fp);
  /* The second host is the proxy's folder ("/tmp/idem-link.XXXXXX"),
   * percent-encoded. */
  snprintf(url, sizeof url,
           "postgresql://idem:p@ss9@nosuch.invalid,%%2Ftmp%%2F%s/postgres?"
           "port=%s&idem_schema=%s",
           f->px.dir + 5, f->px.port, f->schema);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &store));
  EXPECT_RC(IDEM_ENOTFOUND, idem_get(store, &id, &r));
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REQUEST, "cut-here");
#define NO_SECRET(call)                                                        \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ == IDEM_OK || strstr(idem_errmsg(), "ss9"))                        \
      fail_msg("%s: %s: %s", #call, idem_rc_name(rc_), idem_errmsg());         \
  } while (0)
  NO_SECRET(idem_get(store, &id, &r));
  assert_int_equal(proxy_cuts(&f->px), 1);
  NO_SECRET(idem_delete(store, &id));
  NO_SECRET(idem_list(store, NULL, count_record, &n));
  NO_SECRET(idem_prune(store, &removed));
  NO_SECRET(idem_resolve(store, &id, NULL));
  NO_SECRET(idem_claim(store, &id, fp, NULL, &c));
  NO_SECRET(idem_execute_local(store, &id, fp, NULL, show_synchronous_commit,
                               value, &c));
#undef NO_SECRET
  assert_null(c);
  assert_int_equal(n, 0);
  assert_string_equal(value, ""); /* the action never ran */
  idem_store_close(store);
}

#define LINK_TEST(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
  const char *url = getenv("IDEM_TEST_PG_URL");
  const struct CMUnitTest tests[] = {
      LINK_TEST(test_claim_answer_lost),
      LINK_TEST(test_claim_request_lost),
      LINK_TEST(test_takeover_commit_answer_lost),
      LINK_TEST(test_takeover_commit_request_lost),
      LINK_TEST(test_complete_answer_lost),
      LINK_TEST(test_complete_request_lost),
      LINK_TEST(test_release_answer_lost),
      LINK_TEST(test_release_request_lost),
      LINK_TEST(test_mark_unknown_answer_lost),
      LINK_TEST(test_mark_unknown_request_lost),
      LINK_TEST(test_renew_answer_lost),
      LINK_TEST(test_stale_complete_answer_lost),
      LINK_TEST(test_complete_retried_after_unreachable),
      LINK_TEST(test_complete_retried_other_response),
      LINK_TEST(test_mark_unknown_retried_after_unreachable),
      LINK_TEST(test_release_retried_after_unreachable),
      LINK_TEST(test_stale_release_answer_lost),
      LINK_TEST(test_stale_mark_unknown),
      LINK_TEST(test_local_commit_answer_lost),
      LINK_TEST(test_claim_answer_lost_no_reconnect),
      LINK_TEST(test_read_only_server),
      LINK_TEST(test_synchronous_commit_after_reconnect),
      LINK_TEST(test_open_link_closed),
      LINK_TEST(test_secret_in_later_messages),
      LINK_TEST(test_claim_request_stalls),
      LINK_TEST(test_claim_answer_stalls),
      LINK_TEST(test_local_commit_answer_stalls),
      LINK_TEST(test_renewal_stalls_ending_in_time),
      LINK_TEST(test_listener_stalls),
      LINK_TEST(test_holder_clock_step_back),
  };
  if (!url || (strncmp(url, "postgresql://", 13) != 0 &&
               strncmp(url, "postgres://", 11) != 0)) {
    /* A missing server is a failure, never a skip. */
    fprintf(stderr, "test_pg_link: IDEM_TEST_PG_URL must name a PostgreSQL "
                    "server (scripts/check.sh starts one; by hand: "
                    "`. scripts/pg.sh && pg_start`)\n");
    return 1;
  }
  {
    /* clockshift.c steps this process's wall clock when a test says. */
    static char shift_file[] = "/tmp/idem-clockshift.XXXXXX";
    int64_t zero = 0;
    int fd = mkstemp(shift_file), failed;
    if (fd < 0 || write(fd, &zero, sizeof zero) != (ssize_t)sizeof zero) {
      perror("clock shift file");
      return 1;
    }
    close(fd);
    setenv("IDEM_CLOCK_SHIFT_FILE", shift_file, 1);
    failed = cmocka_run_group_tests_name("postgresql link", tests, NULL, NULL);
    unlink(shift_file);
    return failed;
  }
}
