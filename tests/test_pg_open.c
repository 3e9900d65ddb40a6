/*
 * test_pg_open.c -- opening a PostgreSQL store: what its sessions are set
 * to, and what a URL or a server that cannot work tells the caller.
 *
 *  - Durability: whatever synchronous_commit the URL, the role or the
 *    database sets, idem's own sessions run with at least "on", so that a
 *    completion reported stored is on disk (checked by a local action that
 *    runs SHOW on the store's own connection).
 *  - Secrets: no message shows a password from the URL or conninfo, even
 *    when libpq's own text quotes the URL or a piece of it.
 *
 * Needs IDEM_TEST_PG_URL (scripts/check.sh starts a server); without it the
 * test fails, it never skips. Each test uses a schema of its own, and roles
 * of its own, dropped at the end.
 */
/* cmocka needs these, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idem.h"

#define URL_MAX 2048
#define OPERATION "POST /settings"
#define PAYLOAD "{\"show\":\"synchronous_commit\"}"

typedef struct fixture {
  char schema[64];
  char role[64];
  int made_role, made_db;
  char hba_file[1024];
  char *hba_saved; /* pg_hba.conf as it was, to be put back */
  idem_store *store;
} fixture;

static unsigned serial;

static const char *server_url(void) { return getenv("IDEM_TEST_PG_URL"); }

/* Runs sql on a connection of its own to the test server (as the server's
 * superuser); "{S}" stands for the test's schema, "{R}" for its role,
 * "{L}" for the role's name inside a literal, "{D}" for its database.
 * Returns the first column of the first row, "" when there is none, in a
 * static buffer; fails the test on an error. */
static const char *admin_sql(const fixture *f, const char *tmpl) {
  static char value[256];
  char sql[2048], *o = sql;
  PGconn *c;
  PGresult *r;
  for (const char *t = tmpl; *t && o < sql + sizeof sql - 80; t++) {
    if (!strncmp(t, "{S}", 3)) {
      o += sprintf(o, "\"%s\"", f->schema);
      t += 2;
    } else if (!strncmp(t, "{R}", 3)) {
      o += sprintf(o, "\"%s\"", f->role);
      t += 2;
    } else if (!strncmp(t, "{L}", 3)) {
      o += sprintf(o, "%s", f->role);
      t += 2;
    } else if (!strncmp(t, "{D}", 3)) {
      o += sprintf(o, "\"%s_db\"", f->role);
      t += 2;
    } else {
      *o++ = *t;
    }
  }
  *o = '\0';
  c = PQconnectdb(server_url());
  if (PQstatus(c) != CONNECTION_OK)
    fail_msg("admin connection: %s", PQerrorMessage(c));
  PQclear(PQexec(c, "SET client_min_messages = warning"));
  r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK &&
      PQresultStatus(r) != PGRES_COMMAND_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  snprintf(value, sizeof value, "%s",
           PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0
               ? PQgetvalue(r, 0, 0)
               : "");
  PQclear(r);
  PQfinish(c);
  return value;
}

/* The test server's URL with more query parameters ("a=1&b=2"), and this
 * test's schema. */
static void url_with(const fixture *f, char *out, size_t size,
                     const char *more) {
  const char *url = server_url();
  int n = snprintf(out, size, "%s%c%s%sidem_schema=%s", url,
                   strchr(url, '?') ? '&' : '?', more ? more : "",
                   more && *more ? "&" : "", f->schema);
  if (n < 0 || (size_t)n >= size)
    fail_msg("URL too long");
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  ++serial;
  snprintf(f->schema, sizeof f->schema, "open_%ld_%u", (long)getpid(), serial);
  snprintf(f->role, sizeof f->role, "idem_open_%ld_%u", (long)getpid(), serial);
  *state = f;
  admin_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  return 0;
}

static int write_file(const char *path, const char *a, const char *b) {
  FILE *o = fopen(path, "w");
  int ok = o && fputs(a, o) >= 0 && fputs(b, o) >= 0;
  if (o && fclose(o) != 0)
    ok = 0;
  return ok ? 0 : -1;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  idem_store_close(f->store);
  if (f->hba_saved) {
    if (write_file(f->hba_file, f->hba_saved, "") != 0)
      fprintf(stderr, "cannot put back %s\n", f->hba_file);
    admin_sql(f, "SELECT pg_reload_conf()");
    free(f->hba_saved);
  }
  admin_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  if (f->made_db)
    admin_sql(f, "DROP DATABASE IF EXISTS {D}");
  if (f->made_role) {
    admin_sql(f, "REVOKE ALL ON DATABASE postgres FROM {R}");
    admin_sql(f, "DROP ROLE IF EXISTS {R}");
  }
  free(f);
  return 0;
}

/* A role of the test's own (LOGIN unless options say NOLOGIN), that may
 * create idem's schema. */
static void make_role(fixture *f, const char *options) {
  char sql[512];
  snprintf(sql, sizeof sql, "CREATE ROLE {R} %s %s",
           strstr(options, "NOLOGIN") ? "" : "LOGIN", options);
  admin_sql(f, "DROP ROLE IF EXISTS {R}");
  admin_sql(f, sql);
  f->made_role = 1;
  admin_sql(f, "GRANT CREATE, CONNECT ON DATABASE postgres TO {R}");
}

/* The test server's URL for the test's role, with a password (NULL: none;
 * nor from ~/.pgpass). */
static void role_url(const fixture *f, char *out, size_t size,
                     const char *password) {
  PQconninfoOption *o = PQconninfoParse(server_url(), NULL);
  const char *host = NULL, *port = NULL;
  int n;
  for (PQconninfoOption *i = o; i && i->keyword; i++) {
    if (!strcmp(i->keyword, "host") && i->val && *i->val)
      host = i->val;
    if (!strcmp(i->keyword, "port") && i->val && *i->val)
      port = i->val;
  }
  n = snprintf(out, size,
               "postgresql://%s%s%s@/postgres?host=%s&port=%s&passfile=/"
               "nonexistent/pgpass&idem_schema=%s",
               f->role, password ? ":" : "", password ? password : "",
               host ? host : "/tmp", port ? port : "5432", f->schema);
  PQconninfoFree(o);
  if (n < 0 || (size_t)n >= size)
    fail_msg("URL too long");
}

#define EXPECT_RC(want, expr) expect_rc_at((want), (expr), #expr, __LINE__)

static void expect_rc_at(int want, int got, const char *what, int line) {
  if (got != want)
    fail_msg("line %d: %s returned %s (%s), expected %s", line, what,
             idem_rc_name(got), idem_errmsg(), idem_rc_name(want));
}

/* ---- durability -------------------------------------------------------- */

typedef struct shown {
  const char *setting;
  char value[64];
} shown;

/* A local action that reads a setting of the session it runs in (the
 * store's own connection) and rejects itself, so that nothing is kept. */
static int show_setting(void *conn, void *ctx, idem_response *r) {
  shown *s = ctx;
  char sql[128];
  PGresult *res;
  (void)r;
  snprintf(sql, sizeof sql, "SHOW %s", s->setting);
  res = PQexec(conn, sql);
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    snprintf(s->value, sizeof s->value, "%s", PQgetvalue(res, 0, 0));
  PQclear(res);
  return 1;
}

/* The value of a setting in the sessions of store. */
static const char *session_setting(idem_store *store, const char *setting,
                                   shown *s) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"", OPERATION, "show-setting"};
  idem_call *c = NULL;
  s->setting = setting;
  s->value[0] = '\0';
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
  EXPECT_RC(IDEM_EREJECTED,
            idem_execute_local(store, &id, fp, NULL, show_setting, s, &c));
  assert_null(c);
  return s->value;
}

/* synchronous_commit from the URL: off, local and remote_write become on;
 * on and remote_apply (stronger still) are kept. */
static void test_synchronous_commit_from_url(void **state) {
  fixture *f = *state;
  static const char *const set[][2] = {{"off", "on"},
                                       {"local", "on"},
                                       {"remote_write", "on"},
                                       {"on", "on"},
                                       {"remote_apply", "remote_apply"}};
  char url[URL_MAX], opt[128];
  shown s;
  for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
    snprintf(opt, sizeof opt, "options=-c%%20synchronous_commit%%3D%s",
             set[i][0]);
    url_with(f, url, sizeof url, opt);
    EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
    assert_string_equal(session_setting(f->store, "synchronous_commit", &s),
                        set[i][1]);
    /* The lock timeout is still the store's busy timeout. */
    assert_string_equal(session_setting(f->store, "lock_timeout", &s), "10s");
    idem_store_close(f->store);
    f->store = NULL;
  }
}

/* synchronous_commit = off set on the role, and on the database. */
static void test_synchronous_commit_from_role(void **state) {
  fixture *f = *state;
  char url[URL_MAX];
  shown s;
  make_role(f, "");
  admin_sql(f, "ALTER ROLE {R} SET synchronous_commit = off");
  role_url(f, url, sizeof url, NULL);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
  assert_string_equal(session_setting(f->store, "synchronous_commit", &s),
                      "on");
  idem_store_close(f->store);
  f->store = NULL;
  admin_sql(f, "ALTER ROLE {R} RESET synchronous_commit");
  admin_sql(f, "ALTER ROLE {R} IN DATABASE postgres SET synchronous_commit = "
               "local");
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
  assert_string_equal(session_setting(f->store, "synchronous_commit", &s),
                      "on");
}

/* ---- secrets in messages ------------------------------------------------ */

typedef struct bad_url {
  const char *url;
  int rc;                /* what opening it returns */
  const char *says;      /* a part of the message that tells what is wrong */
  const char *secret[3]; /* what the message must not contain */
} bad_url;

/*
 * Malformed URLs and conninfo strings with a password in them. libpq's own
 * message may quote the URL, the token it could not decode, or a piece of
 * a password that it took for a host or a port: none of it is shown.
 */
static void test_secrets_not_in_messages(void **state) {
  static const bad_url bad[] = {
      {"postgresql://idem:S3CRET@[::1", IDEM_EURL, "IPv6", {"S3CRET"}},
      {"postgres://idem:S3CRET@[]/db",
       IDEM_EURL,
       "may not be empty",
       {"S3CRET"}},
      {"postgresql://idem:S3CRET@[::1]x/db",
       IDEM_EURL,
       "unexpected character",
       {"S3CRET"}},
      {"postgresql://idem:S3%zzCRET@localhost/db",
       IDEM_EURL,
       "percent",
       {"S3%zz", "CRET"}},
      {"postgresql://idem:S3CRET%00@localhost/db",
       IDEM_EURL,
       "%00",
       {"S3CRET"}},
      {"postgresql://idem@localhost/db?password=S3%zzCRET",
       IDEM_EURL,
       "percent",
       {"S3%zz", "CRET"}},
      {"postgresql://idem:S3CRET@[::1?idem_schema=x&sslmode=require",
       IDEM_EURL,
       "IPv6",
       {"S3CRET"}},
      /* A '/' in the password, not percent-encoded: libpq takes the part
       * before it for a port. */
      {"postgresql://idem:S3CRET/PART2@localhost/db",
       IDEM_EURL,
       "port",
       {"S3CRET", "PART2"}},
      /* A piece of one letter is hidden where it stands alone, and the
       * message stays readable. */
      {"postgresql://idem:p/w@localhost/db",
       IDEM_EURL,
       "for connection option \"port\"",
       {"\"p\""}},
      /* An '@' in it: the part after it for a host name. */
      {"postgresql://idem:S3C@RET9@%2Ftmp%2Fnone/db",
       IDEM_EURL,
       "host name",
       {"S3C", "RET9"}},
      /* conninfo: a space in an unquoted password. */
      {"pg:host=/nonexistent password=S3CRET PART2",
       IDEM_EURL,
       "missing",
       {"S3CRET", "PART2"}},
      {"pg:host=/nonexistent password='S3CRET",
       IDEM_EURL,
       "unterminated",
       {"S3CRET"}},
  };
  int failed = 0;
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    idem_store *store = (idem_store *)&store;
    int rc = idem_store_open(bad[i].url, NULL, &store);
    const char *msg = idem_errmsg();
    assert_null(store);
    if (rc != bad[i].rc) {
      fprintf(stderr, "%s: %s (%s), expected %s\n", bad[i].url,
              idem_rc_name(rc), msg, idem_rc_name(bad[i].rc));
      failed++;
    }
    if (!strstr(msg, bad[i].says)) {
      fprintf(stderr, "%s: the message does not say \"%s\": %s\n", bad[i].url,
              bad[i].says, msg);
      failed++;
    }
    for (int k = 0; k < 3 && bad[i].secret[k]; k++)
      if (strstr(msg, bad[i].secret[k])) {
        fprintf(stderr, "%s: the message shows \"%s\": %s\n", bad[i].url,
                bad[i].secret[k], msg);
        failed++;
      }
  }
  assert_int_equal(failed, 0);
}

/* ---- configuration mistakes and unavailability --------------------------- */

/* The first failure of idem_store_open(url): the result code, checked
 * against want, and the message, which must hold each of says. */
static void expect_open_fails(const char *url, int want, const char *says[]) {
  idem_store *store = (idem_store *)&store;
  int rc = idem_store_open(url, NULL, &store);
  const char *msg = idem_errmsg();
  if (store) {
    idem_store_close(store);
    fail_msg("%s: opened, expected %s", url, idem_rc_name(want));
  }
  if (rc != want)
    fail_msg("%s: %s (%s), expected %s", url, idem_rc_name(rc), msg,
             idem_rc_name(want));
  for (int i = 0; says[i]; i++)
    if (!strstr(msg, says[i]))
      fail_msg("%s: the message does not say \"%s\": %s", url, says[i], msg);
  /* What the caller is told to do, or not to do. */
  if ((want == IDEM_EUNAVAILABLE) == (strstr(msg, "retrying") != NULL))
    fail_msg("%s: %s: %s", url, idem_rc_name(rc), msg);
}

#define SAYS(...)                                                              \
  (const char *[]) { __VA_ARGS__, NULL }

/* A URL, role or database that cannot work as configured: IDEM_EURL for a
 * malformed URL or option, IDEM_ESTORE for the rest, never the "retry
 * later" of IDEM_EUNAVAILABLE; the message says what to fix. */
static void test_configuration_mistakes(void **state) {
  fixture *f = *state;
  char url[URL_MAX], more[URL_MAX];
  url_with(f, url, sizeof url, "sslmode=bogus");
  expect_open_fails(url, IDEM_EURL, SAYS("sslmode", "bogus", "correct the"));
  url_with(f, url, sizeof url, "port=99999");
  expect_open_fails(url, IDEM_EURL, SAYS("invalid port number", "99999"));
  url_with(f, url, sizeof url, "connect_timeout=soon");
  expect_open_fails(url, IDEM_EURL, SAYS("connect_timeout", "soon"));
  url_with(f, url, sizeof url, "target_session_attrs=any&port=1,2,3");
  expect_open_fails(url, IDEM_EURL, SAYS("could not match"));
  /* A password with an unencoded '/' or '@': a port or a host name that
   * cannot be one. */
  expect_open_fails("postgresql://idem:S3CRET/PART2@localhost/db", IDEM_EURL,
                    SAYS("port", "percent-encoded"));
  expect_open_fails("postgresql://idem:S3C@RET9@%2Ftmp%2Fnone/db", IDEM_EURL,
                    SAYS("host name", "percent-encoded"));

  /* The server's refusals. */
  role_url(f, url, sizeof url, NULL);
  expect_open_fails(url, IDEM_ESTORE,
                    SAYS("role \"", "does not exist", "create the role"));
  make_role(f, "NOLOGIN");
  expect_open_fails(url, IDEM_ESTORE, SAYS("not permitted to log in", "LOGIN"));
  admin_sql(f, "ALTER ROLE {R} LOGIN");
  /* The same role, another database: one that does not exist, one that it
   * may not connect to. */
  snprintf(more, sizeof more, "%s", url);
  {
    char *db = strstr(more, "@/postgres?");
    assert_non_null(db);
    memmove(db + 12, db + 10, strlen(db + 10) + 1);
    memcpy(db + 2, "no_such_db", 10);
  }
  expect_open_fails(
      more, IDEM_ESTORE,
      SAYS("database \"no_such_db\" does not exist", "create the database"));
  admin_sql(f, "DROP DATABASE IF EXISTS {D}");
  admin_sql(f, "CREATE DATABASE {D}");
  f->made_db = 1;
  admin_sql(f, "REVOKE CONNECT ON DATABASE {D} FROM PUBLIC");
  snprintf(more, sizeof more, "postgresql://%s@/%s_db?%s", f->role, f->role,
           strchr(url, '?') + 1);
  expect_open_fails(more, IDEM_ESTORE, SAYS("permission denied", "CONNECT"));
  url_with(f, url, sizeof url, "options=-c%20no_such_setting%3D1");
  expect_open_fails(url, IDEM_ESTORE, SAYS("no_such_setting"));
}

/* Whether the server asks the test's role for a password yet (a reload of
 * pg_hba.conf takes effect a little later). */
static int asks_for_password(const fixture *f) {
  char url[URL_MAX];
  PGconn *c;
  int asks;
  role_url(f, url, sizeof url, NULL);
  *strstr(url, "&idem_schema=") = '\0'; /* libpq does not know it */
  c = PQconnectdb(url);
  asks = PQstatus(c) != CONNECTION_OK &&
         strstr(PQerrorMessage(c), "no password supplied");
  PQfinish(c);
  return asks;
}

/*
 * A role with a password, which pg_hba.conf asks for (a line of the
 * test's own, first in the server's file, for this role alone): no
 * password, or a wrong one, is IDEM_ESTORE and says so, without the
 * password; the right one opens the store.
 */
static void test_password_authentication(void **state) {
  fixture *f = *state;
  char url[URL_MAX], line[256];
  FILE *in;
  long size;
  make_role(f, "PASSWORD 'right-S3CRET'");
  snprintf(f->hba_file, sizeof f->hba_file, "%s",
           admin_sql(f, "SHOW hba_file"));
  in = fopen(f->hba_file, "r");
  if (!in)
    fail_msg("cannot read %s: this test edits the test server's "
             "pg_hba.conf, as scripts/pg.sh's server allows",
             f->hba_file);
  fseek(in, 0, SEEK_END);
  size = ftell(in);
  rewind(in);
  f->hba_saved = calloc(1, (size_t)size + 1);
  assert_non_null(f->hba_saved);
  assert_int_equal(fread(f->hba_saved, 1, (size_t)size, in), (size_t)size);
  fclose(in);
  snprintf(line, sizeof line, "local all %s scram-sha-256\n", f->role);
  if (write_file(f->hba_file, line, f->hba_saved) != 0)
    fail_msg("cannot write %s", f->hba_file);
  admin_sql(f, "SELECT pg_reload_conf()");
  for (int i = 0; i < 100 && !asks_for_password(f); i++)
    usleep(50 * 1000);
  assert_true(asks_for_password(f));

  role_url(f, url, sizeof url, NULL);
  expect_open_fails(url, IDEM_ESTORE,
                    SAYS("no password supplied", "PGPASSWORD"));
  role_url(f, url, sizeof url, "wrong-S3CRET");
  expect_open_fails(
      url, IDEM_ESTORE,
      SAYS("password authentication failed", "correct the password"));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  role_url(f, url, sizeof url, "right-S3CRET");
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
}

/* A role that loses LOGIN while a store is open: when its connection is
 * ended, the reconnect is refused as configured (IDEM_ESTORE), and works
 * again once the role may log in. */
static void test_reconnect_refused(void **state) {
  fixture *f = *state;
  char url[URL_MAX], fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"", OPERATION, "reconnect-key"};
  idem_call *c = NULL;
  make_role(f, "");
  role_url(f, url, sizeof url, NULL);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
  admin_sql(f, "ALTER ROLE {R} NOLOGIN");
  admin_sql(f, "SELECT count(pg_terminate_backend(pid, 5000)) FROM "
               "pg_stat_activity WHERE usename = '{L}'");
  EXPECT_RC(IDEM_ESTORE, idem_claim(f->store, &id, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "cannot reconnect"));
  assert_non_null(strstr(idem_errmsg(), "not permitted to log in"));
  assert_non_null(strstr(idem_errmsg(), "retrying will not help"));
  admin_sql(f, "ALTER ROLE {R} LOGIN");
  EXPECT_RC(IDEM_OK, idem_claim(f->store, &id, fp, NULL, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/* ---- a session ended mid-commit --------------------------------------- */

typedef struct effect {
  const char *schema;
  int n;
  /* Set: after its insert the action says so and waits for `go`. */
  pthread_mutex_t *mu;
  pthread_cond_t *cv;
  int inserted, go;
} effect;

/* A local action that inserts effect row n; row 1's deferred trigger
 * sleeps at COMMIT (see test_ended_mid_commit). */
static int insert_effect(void *conn, void *ctx, idem_response *r) {
  const effect *e = ctx;
  char sql[160];
  PGresult *res;
  snprintf(sql, sizeof sql, "INSERT INTO \"%s\".effects (n) VALUES (%d)",
           e->schema, e->n);
  res = PQexec(conn, sql);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    PQclear(res);
    return 1;
  }
  PQclear(res);
  if (e->mu) {
    effect *w = ctx;
    pthread_mutex_lock(w->mu);
    w->inserted = 1;
    pthread_cond_broadcast(w->cv);
    while (!w->go)
      pthread_cond_wait(w->cv, w->mu);
    pthread_mutex_unlock(w->mu);
  }
  r->status = 200;
  r->body = e->n == 1 ? "effect-1" : e->n == 2 ? "effect-2" : "effect-3";
  r->body_len = 8;
  return 0;
}

typedef struct ended_call {
  idem_store *store;
  effect effect;
  int rc;
  char msg[512];
} ended_call;

static void *run_ended_call(void *arg) {
  ended_call *e = arg;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"", OPERATION, "ended-mid-commit"};
  idem_call *c = NULL;
  if (idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp) != IDEM_OK)
    abort();
  e->rc = idem_execute_local(e->store, &id, fp, NULL, insert_effect,
                             &e->effect, &c);
  snprintf(e->msg, sizeof e->msg, "%s", idem_errmsg());
  idem_call_free(c);
  return NULL;
}

/*
 * The server ends the store's session while the local action's record and
 * its COMMIT, sent together, wait in a trigger that sleeps (set up by
 * slow_sql, then found by a query of pg_stat_activity matching `waiting`):
 * the call says the connection was lost and that whether it committed is
 * unknown (IDEM_EUNAVAILABLE), never a store error; the next call on the
 * store works on a new session, runs the action once, and a retry replays
 * it.
 */
static void ended_mid_pipeline(fixture *f, const char *slow_sql,
                               const char *waiting, int idle) {
  char url[URL_MAX], fp[IDEM_FINGERPRINT_SIZE], find[512];
  idem_id id = {"", OPERATION, "ended-mid-commit"};
  idem_call *c = NULL;
  ended_call e = {.effect = {f->schema, 1}};
  effect second = {f->schema, 2, NULL, NULL, 0, 0};
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  pthread_t th;
  int ended = 0;
  url_with(f, url, sizeof url, NULL);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &f->store));
  admin_sql(f, "CREATE TABLE {S}.effects (n integer)");
  if (slow_sql)
    admin_sql(f, slow_sql);
  /* Another key first, so that the session has its statements prepared and
   * sends the record and the COMMIT in one pipeline. */
  {
    idem_id warm = {"", OPERATION, "warm-up"};
    effect third = {f->schema, 3, NULL, NULL, 0, 0};
    EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
    EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &warm, fp, NULL,
                                          insert_effect, &third, &c));
    assert_memory_equal(idem_call_response(c)->body, "effect-3", 8);
    idem_call_free(c);
    c = NULL;
  }
  e.store = f->store;
  if (idle) {
    e.effect.mu = &mu;
    e.effect.cv = &cv;
  }
  assert_int_equal(pthread_create(&th, NULL, run_ended_call, &e), 0);
  if (idle) {
    /* Ends the session while the action holds it idle in its transaction,
     * and waits until it is gone; then lets the action return. */
    pthread_mutex_lock(&mu);
    while (!e.effect.inserted)
      pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    snprintf(find, sizeof find,
             "SELECT count(pg_terminate_backend(pid, 30000)) FROM "
             "pg_stat_activity WHERE state = 'idle in transaction' AND query "
             "LIKE '%s'",
             waiting);
    ended = atoi(admin_sql(f, find));
    pthread_mutex_lock(&mu);
    e.effect.go = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  /* Waits for the session to sleep in the trigger, then ends it. */
  snprintf(find, sizeof find,
           "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
           "WHERE wait_event = 'PgSleep' AND query LIKE '%s'",
           waiting);
  for (int i = 0; i < 6000 && !ended; i++) {
    ended = atoi(admin_sql(f, find));
    if (!ended)
      usleep(10 * 1000);
  }
  pthread_join(th, NULL);
  assert_int_equal(ended, 1);
  if (e.rc != IDEM_EUNAVAILABLE)
    fail_msg("ended mid-commit: %s (%s), expected IDEM_EUNAVAILABLE",
             idem_rc_name(e.rc), e.msg);
  if (!strstr(e.msg, "whether it committed is unknown"))
    fail_msg("ended mid-commit: %s", e.msg);
  /* It did not commit: no effect, no record. */
  assert_string_equal(
      admin_sql(f, "SELECT count(*) FROM {S}.effects WHERE n <> 3"), "0");
  assert_string_equal(admin_sql(f, "SELECT count(*) FROM {S}.idem_records "
                                   "WHERE key = 'ended-mid-commit'"),
                      "0");
  /* The store works again, on a new session. */
  EXPECT_RC(IDEM_OK, idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 1, fp));
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        insert_effect, &second, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_memory_equal(idem_call_response(c)->body, "effect-2", 8);
  idem_call_free(c);
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        insert_effect, &second, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_memory_equal(idem_call_response(c)->body, "effect-2", 8);
  idem_call_free(c);
  assert_string_equal(
      admin_sql(f, "SELECT count(*) FROM {S}.effects WHERE n <> 3"), "1");
  assert_string_equal(
      admin_sql(f, "SELECT max(n) FROM {S}.effects WHERE n <> 3"), "2");
}

/* Ended at the COMMIT: a deferred trigger on the action's table sleeps. */
static void test_ended_at_commit(void **state) {
  fixture *f = *state;
  admin_sql(f, "CREATE SCHEMA IF NOT EXISTS {S}");
  admin_sql(f, "CREATE FUNCTION {S}.slow_commit() RETURNS trigger LANGUAGE "
               "plpgsql AS $$ BEGIN IF NEW.n = 1 THEN PERFORM pg_sleep(60); "
               "END IF; RETURN NULL; END $$");
  ended_mid_pipeline(f,
                     "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON "
                     "{S}.effects DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                     "EXECUTE FUNCTION {S}.slow_commit()",
                     "COMMIT", 0);
}

/* Ended in the record's insert, the first of the two: a trigger on the
 * records table sleeps when the action wrote effect 1. */
static void test_ended_at_record(void **state) {
  fixture *f = *state;
  admin_sql(f, "CREATE SCHEMA IF NOT EXISTS {S}");
  admin_sql(f, "CREATE FUNCTION {S}.slow_record() RETURNS trigger LANGUAGE "
               "plpgsql AS $$ BEGIN IF EXISTS (SELECT 1 FROM {S}.effects "
               "WHERE n = 1) THEN PERFORM pg_sleep(60); END IF; RETURN NEW; "
               "END $$");
  ended_mid_pipeline(f,
                     "CREATE TRIGGER slow BEFORE INSERT ON {S}.idem_records "
                     "FOR EACH ROW EXECUTE FUNCTION {S}.slow_record()",
                     "INSERT INTO%idem_records%", 0);
}

/* Ended while the action held its session idle in the transaction: the
 * record and the COMMIT are sent to a session already gone. */
static void test_ended_before_record(void **state) {
  ended_mid_pipeline(*state, NULL, "INSERT INTO%effects%", 1);
}

/* A server that is not there, or that cannot take this connection now:
 * IDEM_EUNAVAILABLE, "retry later". */
static void test_unavailable(void **state) {
  fixture *f = *state;
  char url[URL_MAX], dir[] = "/tmp/idem-open-XXXXXX";
  /* No server on that socket: stopped, or not started yet. */
  assert_non_null(mkdtemp(dir));
  snprintf(url, sizeof url, "postgresql://idem@/postgres?host=%s&port=5432",
           dir);
  expect_open_fails(url, IDEM_EUNAVAILABLE, SAYS("No such file or directory"));
  rmdir(dir);
  /* Nothing listening on that TCP port. */
  expect_open_fails("postgresql://idem@127.0.0.1:1/postgres", IDEM_EUNAVAILABLE,
                    SAYS("Connection refused"));
  /* Too many connections for the role. */
  make_role(f, "CONNECTION LIMIT 0");
  role_url(f, url, sizeof url, NULL);
  expect_open_fails(url, IDEM_EUNAVAILABLE, SAYS("too many connections"));
  /* A read-only session where a read-write one is asked for (a standby,
   * before a failover completes). */
  url_with(f, url, sizeof url,
           "options=-c%20default_transaction_read_only%3Don&target_session_"
           "attrs=read-write");
  expect_open_fails(url, IDEM_EUNAVAILABLE, SAYS("read-only"));
}

#define OPEN_TEST(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
  const char *url = server_url();
  const struct CMUnitTest tests[] = {
      OPEN_TEST(test_synchronous_commit_from_url),
      OPEN_TEST(test_synchronous_commit_from_role),
      OPEN_TEST(test_secrets_not_in_messages),
      OPEN_TEST(test_configuration_mistakes),
      OPEN_TEST(test_password_authentication),
      OPEN_TEST(test_reconnect_refused),
      OPEN_TEST(test_ended_at_commit),
      OPEN_TEST(test_ended_at_record),
      OPEN_TEST(test_ended_before_record),
      OPEN_TEST(test_unavailable),
  };
  if (!url || (strncmp(url, "postgresql://", 13) != 0 &&
               strncmp(url, "postgres://", 11) != 0)) {
    /* A missing server is a failure, never a skip. */
    fprintf(stderr, "test_pg_open: IDEM_TEST_PG_URL must name a PostgreSQL "
                    "server (scripts/check.sh starts one; by hand: "
                    "`. scripts/pg.sh && pg_start`)\n");
    return 1;
  }
  return cmocka_run_group_tests_name("postgresql open", tests, NULL, NULL);
}
