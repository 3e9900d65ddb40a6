/*
 * engine_harness.c -- what every contract test of the engine shares: the
 * backends (a fresh SQLite file or PostgreSQL schema per test, selected by
 * IDEM_TEST_STORE), the side connections that count and tamper with rows,
 * the fixture, and the CLAIM / LOCAL helpers that check an outcome.
 *
 * Included by each test_*.c of the engine (as h2o's unit tests include a
 * .c file), so that every topic is a program of its own and ctest runs
 * them apart; not every test file uses every helper.
 */
#pragma GCC diagnostic ignored "-Wunused-function"

/* cmocka needs these, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <ftw.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

#define URL_MAX 4096
#define TMP_TEMPLATE "/tmp/idem-engine-XXXXXX"
#define TMP_PREFIX "/tmp/idem-engine-"

/* Leases short enough to expire inside a test, and a sleep safely past it. */
#define SHORT_MS 150
#define PAST_SHORT_MS 300

#define OPERATION "POST /tickets"
#define KEY "approved-ticket-001"
#define PAYLOAD                                                                \
  "{\"priority\":\"normal\",\"project\":\"demo-agent\",\"title\":"             \
  "\"Investigate a synthetic queue backlog\"}"
#define PAYLOAD_URGENT                                                         \
  "{\"priority\":\"urgent\",\"project\":\"demo-agent\",\"title\":"             \
  "\"Investigate a synthetic queue backlog\"}"
#define TICKET_META "{\"content-type\":\"application/json\"}"

#define NTHREADS 16
#define NPROCS 16

/* ------------------------------------------------------------------ */
/* Small utilities                                                      */
/* ------------------------------------------------------------------ */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

/* Removes a temporary folder of this suite, and nothing else. */
static void rm_tree(const char *dir) {
  if (strncmp(dir, TMP_PREFIX, strlen(TMP_PREFIX)) != 0)
    return;
  chmod(dir, 0700);
  nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* The whole content of a file; NULL when it cannot be read. */
static unsigned char *read_whole(const char *path, size_t *len) {
  FILE *fp = fopen(path, "rb");
  unsigned char *buf = NULL;
  long n;
  *len = 0;
  if (!fp)
    return NULL;
  if (fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 ||
      fseek(fp, 0, SEEK_SET) != 0) {
    fclose(fp);
    return NULL;
  }
  buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(fp);
  if (buf)
    *len = (size_t)n;
  return buf;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* 1 when n bytes were read, 0 at end of file, -1 on error. */
static int read_all(int fd, void *p, size_t n) {
  char *c = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, c + got, n - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0)
      return got == 0 ? 0 : -1;
    got += (size_t)r;
  }
  return 1;
}

/* ------------------------------------------------------------------ */
/* Backends: everything that differs between SQLite and PostgreSQL      */
/* ------------------------------------------------------------------ */

typedef enum test_backend {
  BACKEND_UNKNOWN = 0,
  BACKEND_SQLITE,
  BACKEND_POSTGRESQL
} test_backend;

static test_backend backend_from_env(void) {
  const char *s = getenv("IDEM_TEST_STORE");
  if (!s || !*s || strcmp(s, "sqlite") == 0)
    return BACKEND_SQLITE;
  if (strcmp(s, "postgresql") == 0)
    return BACKEND_POSTGRESQL;
  return BACKEND_UNKNOWN;
}

/*
 * The SQL the tests run outside the library: the caller's table, its insert
 * (one text parameter, returning the new id) and the side connection's
 * counting and tampering. The PostgreSQL variant names every table with
 * "{S}", the quoted schema of the test's store (see pg_expand()): idem never
 * puts its schema on the search_path, so the caller's table lives in that
 * schema and its SQL says so. The tests themselves do not change.
 */
typedef struct backend_sql {
  const char *create_tickets;
  const char *insert_ticket;
  const char *count_tickets;
  const char *count_records;
  const char *corrupt_body;   /* parameter: key */
  const char *corrupt_status; /* parameter: key */
  const char *newer_schema;
  const char *schema_version;
} backend_sql;

static const backend_sql sqlite_sql = {
    "CREATE TABLE tickets (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)",
    "INSERT INTO tickets (payload) VALUES (?1) RETURNING id",
    "SELECT COUNT(*) FROM tickets",
    "SELECT COUNT(*) FROM idem_records",
    "UPDATE idem_records SET body = CAST('{\"ticket_id\":999}' AS BLOB) "
    "WHERE key = ?1",
    "UPDATE idem_records SET status = status + 1 WHERE key = ?1",
    "UPDATE idem_meta SET value = '99' WHERE name = 'schema_version'",
    "SELECT CAST(value AS INTEGER) FROM idem_meta WHERE name = "
    "'schema_version'",
};

static const backend_sql pg_sql = {
    "CREATE TABLE {S}.tickets (id BIGSERIAL PRIMARY KEY, payload TEXT NOT "
    "NULL)",
    "INSERT INTO {S}.tickets (payload) VALUES ($1::text) RETURNING id",
    "SELECT COUNT(*) FROM {S}.tickets",
    "SELECT COUNT(*) FROM {S}.idem_records",
    "UPDATE {S}.idem_records SET body = convert_to('{\"ticket_id\":999}', "
    "'UTF8') WHERE key = $1::text",
    "UPDATE {S}.idem_records SET status = status + 1 WHERE key = $1::text",
    "UPDATE {S}.idem_meta SET value = '99' WHERE name = 'schema_version'",
    "SELECT value::integer FROM {S}.idem_meta WHERE name = "
    "'schema_version'",
};

/* PostgreSQL: removes a test's schema with everything in it. */
static const char pg_drop_schema[] = "DROP SCHEMA IF EXISTS {S} CASCADE";

/*
 * PostgreSQL: the whole store as one text, to show it was left untouched:
 * the relations and columns of the schema, and every row of idem's tables
 * with its xmin (which changes when a row is rewritten, even with the same
 * values). Parameter: the schema name.
 */
static const char pg_snapshot[] =
    "SELECT string_agg(x, E'\\n' ORDER BY x) FROM ("
    " SELECT 'relation ' || c.relname || ' ' || c.relkind::text"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " WHERE n.nspname::text = $1::text"
    " UNION ALL SELECT 'column ' || table_name || '.' || column_name || ' ' ||"
    " data_type FROM information_schema.columns"
    " WHERE table_schema::text = $1::text"
    " UNION ALL SELECT 'record ' || r.xmin::text || ' ' || r::text"
    " FROM {S}.idem_records r"
    " UNION ALL SELECT 'meta ' || m.xmin::text || ' ' || m::text"
    " FROM {S}.idem_meta m) q(x)";

/* The database file behind an "sqlite:PATH" URL. */
static const char *sqlite_path(const char *url) {
  return strncmp(url, "sqlite:", 7) == 0 ? url + 7 : url;
}

static int is_pg_url(const char *url) {
  return strncmp(url, "postgresql://", 13) == 0 ||
         strncmp(url, "postgres://", 11) == 0;
}

/*
 * PostgreSQL: the schema of the store fresh_store_url() made last, for the
 * local actions, which get only a connection (a PGconn *) and must name the
 * caller's table with it. One store per test, so one schema at a time.
 */
static char pg_schema[64];
static unsigned pg_serial;

/* Replaces every "{S}" in tmpl with the quoted schema. 0, or -1 when out
 * does not hold the result. */
static int pg_expand(const char *tmpl, const char *schema, char *out,
                     size_t size) {
  size_t o = 0;
  for (const char *p = tmpl; *p;) {
    size_t n;
    if (strncmp(p, "{S}", 3) == 0) {
      n = strlen(schema) + 2;
      if (o + n >= size)
        return -1;
      snprintf(out + o, size - o, "\"%s\"", schema);
      p += 3;
    } else {
      n = 1;
      if (o + n >= size)
        return -1;
      out[o] = *p++;
    }
    o += n;
  }
  out[o] = '\0';
  return 0;
}

/*
 * Splits a store URL made by fresh_store_url() into what libpq accepts (the
 * URL without idem_schema=, which is idem's and unknown to libpq) and the
 * schema. 0, or -1 with the reason printed.
 */
static int pg_split_url(const char *url, char *target, size_t size,
                        char *schema, size_t schema_size) {
  const char *hit = NULL, *rest;
  size_t head, vlen;
  for (const char *p = url; (p = strstr(p, "idem_schema=")) != NULL; p++)
    if (p > url && (p[-1] == '?' || p[-1] == '&')) {
      hit = p;
      break;
    }
  if (!hit) {
    print_error("%s: no idem_schema= in the store URL\n", url);
    return -1;
  }
  vlen = strcspn(hit + 12, "&");
  if (vlen == 0 || vlen >= schema_size) {
    print_error("%s: bad idem_schema= in the store URL\n", url);
    return -1;
  }
  snprintf(schema, schema_size, "%.*s", (int)vlen, hit + 12);
  rest = hit + 12 + vlen;     /* "" or "&more" */
  head = (size_t)(hit - url); /* up to and with the '?' or '&' before */
  if (*rest == '&')
    rest++;
  else
    head--; /* it was the last parameter: drop its separator too */
  if ((size_t)snprintf(target, size, "%.*s%s", (int)head, url, rest) >= size)
    return -1;
  return 0;
}

static void pg_ignore_notice(void *arg, const char *message) {
  /* DROP SCHEMA IF EXISTS and friends send notices; keep the output clean. */
  (void)arg;
  (void)message;
}

/*
 * PostgreSQL side connection: runs tmpl ("{S}" = the URL's schema) with an
 * optional text parameter on a connection of its own. On success returns the
 * result (TUPLES_OK or COMMAND_OK) and the connection, both for the caller
 * to free; NULL with the reason printed otherwise.
 */
static PGresult *pg_side_exec(const char *url, const char *tmpl,
                              const char *param, PGconn **conn_out) {
  char target[URL_MAX], schema[64], sql[4096];
  const char *values[1] = {param};
  PGconn *conn;
  PGresult *res;
  ExecStatusType st;
  *conn_out = NULL;
  if (pg_split_url(url, target, sizeof target, schema, sizeof schema) != 0)
    return NULL;
  if (pg_expand(tmpl, schema, sql, sizeof sql) != 0) {
    print_error("side connection: SQL too long: %s\n", tmpl);
    return NULL;
  }
  conn = PQconnectdb(target);
  if (!conn || PQstatus(conn) != CONNECTION_OK) {
    print_error("side connection to %s: %s\n", target,
                conn ? PQerrorMessage(conn) : "out of memory");
    PQfinish(conn);
    return NULL;
  }
  PQsetNoticeProcessor(conn, pg_ignore_notice, NULL);
  res = PQexecParams(conn, sql, param ? 1 : 0, NULL, values, NULL, NULL, 0);
  st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    print_error("side connection: %s: %s\n", sql, PQerrorMessage(conn));
    PQclear(res);
    PQfinish(conn);
    return NULL;
  }
  *conn_out = conn;
  return res;
}

/*
 * Runs one statement with an optional text parameter through a connection of
 * its own (never the store's): sqlite_side_sql() on a database file,
 * side_sql() on the store of a URL (SQLite or PostgreSQL). Returns the first
 * column of the first row when there is one, otherwise the number of rows
 * changed; -1 on error.
 */
static long long sqlite_side_sql(const char *path, const char *sql,
                                 const char *param) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  long long result = -1;
  int step;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK) {
    print_error("side connection: %s\n", sqlite3_errmsg(db));
    sqlite3_close(db);
    return -1;
  }
  sqlite3_busy_timeout(db, 10000);
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) != SQLITE_OK) {
    print_error("side connection: %s: %s\n", sql, sqlite3_errmsg(db));
    sqlite3_close(db);
    return -1;
  }
  if (param)
    sqlite3_bind_text(q, 1, param, -1, SQLITE_STATIC);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW)
    result = sqlite3_column_int64(q, 0);
  else if (step == SQLITE_DONE)
    result = sqlite3_changes(db);
  else
    print_error("side connection: %s: %s\n", sql, sqlite3_errmsg(db));
  sqlite3_finalize(q);
  sqlite3_close(db);
  return result;
}

static long long pg_side_sql(const char *url, const char *tmpl,
                             const char *param) {
  PGconn *conn;
  PGresult *res = pg_side_exec(url, tmpl, param, &conn);
  long long result;
  if (!res)
    return -1;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0)
    result = PQgetisnull(res, 0, 0) ? -1 : atoll(PQgetvalue(res, 0, 0));
  else
    result = atoll(PQcmdTuples(res)); /* "" (0) for DDL */
  PQclear(res);
  PQfinish(conn);
  return result;
}

static long long side_sql(const char *url, const char *sql, const char *param) {
  if (is_pg_url(url))
    return pg_side_sql(url, sql, param);
  switch (backend_from_env()) {
  case BACKEND_SQLITE:
    return sqlite_side_sql(sqlite_path(url), sql, param);
  default:
    print_error("side connection: %s: not a store URL of this suite\n", url);
    return -1;
  }
}

static const backend_sql *sql_of_backend(void) {
  return backend_from_env() == BACKEND_POSTGRESQL ? &pg_sql : &sqlite_sql;
}

/* How many tickets exist, read through a separate connection. */
static long long count_tickets(const char *url) {
  return side_sql(url, sql_of_backend()->count_tickets, NULL);
}

/*
 * The mutation of a local action: inserts one ticket through the connection
 * the action receives (a sqlite3 * or a PGconn *), so it commits or rolls
 * back with the record. 0 and the new id, or -1.
 */
static int insert_ticket(void *conn, const char *payload, long long *id) {
  *id = -1;
  switch (backend_from_env()) {
  case BACKEND_SQLITE: {
    sqlite3 *db = conn;
    sqlite3_stmt *q = NULL;
    int step;
    if (sqlite3_prepare_v2(db, sqlite_sql.insert_ticket, -1, &q, NULL) !=
        SQLITE_OK)
      return -1;
    sqlite3_bind_text(q, 1, payload, -1, SQLITE_STATIC);
    while ((step = sqlite3_step(q)) == SQLITE_ROW)
      *id = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return step == SQLITE_DONE && *id > 0 ? 0 : -1;
  }
  case BACKEND_POSTGRESQL: {
    char sql[512];
    const char *values[1] = {payload};
    PGresult *res;
    if (pg_expand(pg_sql.insert_ticket, pg_schema, sql, sizeof sql) != 0)
      return -1;
    res = PQexecParams(conn, sql, 1, NULL, values, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
      *id = atoll(PQgetvalue(res, 0, 0));
    PQclear(res);
    return *id > 0 ? 0 : -1;
  }
  default:
    return -1;
  }
}

/* The bytes that stand for the whole store, to show it was left untouched:
 * the database file, or PostgreSQL's pg_snapshot text. */
static unsigned char *store_snapshot(const char *url, size_t *len) {
  char target[URL_MAX], schema[64];
  unsigned char *out = NULL;
  PGconn *conn;
  PGresult *res;
  *len = 0;
  if (!is_pg_url(url))
    return read_whole(sqlite_path(url), len);
  if (pg_split_url(url, target, sizeof target, schema, sizeof schema) != 0)
    return NULL;
  res = pg_side_exec(url, pg_snapshot, schema, &conn);
  if (!res)
    return NULL;
  if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
    out = (unsigned char *)strdup(PQgetvalue(res, 0, 0));
    if (out)
      *len = strlen((char *)out);
  }
  PQclear(res);
  PQfinish(conn);
  return out;
}

/* Removes what fresh_store_url() made. The store must be closed. */
static void discard_store(const char *url) {
  char dir[URL_MAX];
  char *slash;
  if (!url[0])
    return;
  if (is_pg_url(url)) {
    side_sql(url, pg_drop_schema, NULL);
    return;
  }
  if (backend_from_env() != BACKEND_SQLITE)
    return;
  snprintf(dir, sizeof dir, "%s", sqlite_path(url));
  slash = strrchr(dir, '/');
  if (!slash)
    return;
  *slash = '\0';
  rm_tree(dir);
}

/*
 * Why IDEM_TEST_STORE=postgresql cannot run here, or NULL when it can:
 * IDEM_TEST_PG_URL must name a server with a postgresql:// URL, without an
 * idem_schema of its own (each test chooses its schema).
 */
static const char *pg_url_problem(void) {
  const char *pg = getenv("IDEM_TEST_PG_URL");
  if (!pg || !*pg)
    return "IDEM_TEST_PG_URL is not set: no PostgreSQL server for the "
           "postgresql tests (scripts/check.sh starts one; by hand: "
           "`. scripts/pg.sh && pg_start`)";
  if (!is_pg_url(pg))
    return "IDEM_TEST_PG_URL must be a postgresql:// URL";
  if (strstr(pg, "idem_schema="))
    return "IDEM_TEST_PG_URL must not carry idem_schema=: every test "
           "makes a schema of its own";
  return NULL;
}

/*
 * The URL of a store that does not exist yet: for SQLite a file not yet
 * created in a new folder under /tmp; for PostgreSQL IDEM_TEST_PG_URL with
 * idem_schema=t_<pid>_<n>, a schema nobody uses (dropped first, should an
 * earlier process with the same pid have left it). url_out has URL_MAX
 * bytes. 0, or -1 with the reason printed.
 */
static int fresh_store_url(char *url_out) {
  const char *pg, *problem;
  char dir[] = TMP_TEMPLATE;
  url_out[0] = '\0';
  switch (backend_from_env()) {
  case BACKEND_SQLITE:
    if (!mkdtemp(dir)) {
      print_error("mkdtemp: %s\n", strerror(errno));
      return -1;
    }
    snprintf(url_out, URL_MAX, "sqlite:%s/store.db", dir);
    return 0;
  case BACKEND_POSTGRESQL:
    if ((problem = pg_url_problem()) != NULL) {
      print_error("IDEM_TEST_STORE=postgresql: %s\n", problem);
      return -1;
    }
    pg = getenv("IDEM_TEST_PG_URL");
    snprintf(pg_schema, sizeof pg_schema, "t_%ld_%u", (long)getpid(),
             ++pg_serial);
    if ((size_t)snprintf(url_out, URL_MAX, "%s%cidem_schema=%s", pg,
                         strchr(pg, '?') ? '&' : '?', pg_schema) >= URL_MAX) {
      print_error("IDEM_TEST_PG_URL is too long\n");
      url_out[0] = '\0';
      return -1;
    }
    if (side_sql(url_out, pg_drop_schema, NULL) < 0) {
      url_out[0] = '\0';
      return -1;
    }
    return 0;
  default:
    print_error("IDEM_TEST_STORE=%s: unknown store; use sqlite or "
                "postgresql\n",
                getenv("IDEM_TEST_STORE"));
    return -1;
  }
}

/*
 * Opens a store of its own for one test, with the caller's table `tickets`
 * created through a separate connection (in the store's schema on
 * PostgreSQL). url_out (URL_MAX bytes) receives the URL, for other handles
 * and processes to open. 0, or -1 with the reason printed.
 */
static int open_fresh_store(idem_store **out, char *url_out) {
  const char *want =
      backend_from_env() == BACKEND_POSTGRESQL ? "postgresql" : "sqlite";
  int rc;
  *out = NULL;
  if (fresh_store_url(url_out) != 0)
    return -1;
  rc = idem_store_open(url_out, NULL, out);
  if (rc != IDEM_OK) {
    print_error("idem_store_open(%s): %s: %s\n", url_out, idem_rc_name(rc),
                idem_errmsg());
    discard_store(url_out);
    return -1;
  }
  if (strcmp(idem_store_backend(*out), want) != 0) {
    print_error("idem_store_open(%s): backend %s, expected %s\n", url_out,
                idem_store_backend(*out), want);
    idem_store_close(*out);
    *out = NULL;
    discard_store(url_out);
    return -1;
  }
  if (side_sql(url_out, sql_of_backend()->create_tickets, NULL) < 0) {
    idem_store_close(*out);
    *out = NULL;
    discard_store(url_out);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Fixture and expectations                                             */
/* ------------------------------------------------------------------ */

typedef struct fixture {
  idem_store *store;
  char url[URL_MAX];
} fixture;

/*
 * cmocka skips the teardown of a test that failed, so what a test set up is
 * also remembered here and cleaned by the next setup or at the end of main.
 */
static fixture *left_fixture;
static char *left_dir;

static void clean_left_over(void) {
  if (left_fixture) {
    idem_store_close(left_fixture->store);
    discard_store(left_fixture->url);
    free(left_fixture);
    left_fixture = NULL;
  }
  if (left_dir) {
    rm_tree(left_dir);
    free(left_dir);
    left_dir = NULL;
  }
}

static int setup_store(void **state) {
  fixture *f;
  clean_left_over();
  f = calloc(1, sizeof *f);
  *state = f;
  if (!f)
    return -1;
  if (open_fresh_store(&f->store, f->url) != 0) {
    free(f);
    *state = NULL;
    return -1;
  }
  left_fixture = f;
  return 0;
}

static int teardown_store(void **state) {
  (void)state;
  clean_left_over();
  return 0;
}

/* A temporary folder for the tests about SQLite files as such; *state is
 * its path. */
static int setup_tmpdir(void **state) {
  char *dir;
  clean_left_over();
  dir = malloc(sizeof TMP_TEMPLATE);
  *state = dir;
  if (!dir)
    return -1;
  memcpy(dir, TMP_TEMPLATE, sizeof TMP_TEMPLATE);
  if (!mkdtemp(dir)) {
    print_error("mkdtemp: %s\n", strerror(errno));
    free(dir);
    *state = NULL;
    return -1;
  }
  left_dir = dir;
  return 0;
}

static int teardown_tmpdir(void **state) {
  (void)state;
  clean_left_over();
  return 0;
}

#define EXPECT_RC(want, expr) expect_rc_at((want), (expr), #expr, __LINE__)

static void expect_rc_at(int want, int got, const char *what, int line) {
  if (got != want)
    fail_msg("line %d: %s returned %s (%s), expected %s", line, what,
             idem_rc_name(got), idem_errmsg(), idem_rc_name(want));
}

static void fp_of(const char *payload, char hex[IDEM_FINGERPRINT_SIZE]) {
  int rc = idem_fingerprint(payload, strlen(payload), 0, hex);
  if (rc != IDEM_OK)
    fail_msg("idem_fingerprint: %s: %s", idem_rc_name(rc), idem_errmsg());
}

#define CLAIM(s, id, fp, opts, want)                                           \
  claim_expect((s), (id), (fp), (opts), (want), __LINE__)

static idem_call *claim_expect(idem_store *s, const idem_id *id, const char *fp,
                               const idem_call_options *o, idem_outcome want,
                               int line) {
  idem_call *c = NULL;
  int rc = idem_claim(s, id, fp, o, &c);
  if (rc != IDEM_OK)
    fail_msg("line %d: idem_claim(%s): %s: %s", line, id->key, idem_rc_name(rc),
             idem_errmsg());
  if (!c)
    fail_msg("line %d: idem_claim returned no claim", line);
  if (idem_call_outcome(c) != want)
    fail_msg("line %d: idem_claim(%s): outcome %s, expected %s", line, id->key,
             idem_outcome_name(idem_call_outcome(c)), idem_outcome_name(want));
  return c;
}

/* The local action: one ticket, and a response naming it. */
typedef struct ticket_action {
  const char *payload;
  int reject;           /* return non-zero after inserting the ticket */
  const void *big_body; /* respond with this body instead */
  size_t big_len;
  int runs;
  long long ticket_id;
  char body[64];
} ticket_action;

static int create_ticket(void *conn, void *ctx, idem_response *response) {
  ticket_action *a = ctx;
  a->runs++;
  if (insert_ticket(conn, a->payload, &a->ticket_id) != 0)
    return 2;
  if (a->reject)
    return 1;
  snprintf(a->body, sizeof a->body, "{\"ticket_id\":%lld}", a->ticket_id);
  response->status = 201;
  response->meta = TICKET_META;
  response->meta_len = strlen(TICKET_META);
  response->body = a->body;
  response->body_len = strlen(a->body);
  if (a->big_body) {
    response->body = a->big_body;
    response->body_len = a->big_len;
  }
  return 0;
}

#define LOCAL(s, id, fp, opts, act, want)                                      \
  local_expect((s), (id), (fp), (opts), (act), (want), __LINE__)

static idem_call *local_expect(idem_store *s, const idem_id *id, const char *fp,
                               const idem_call_options *o, ticket_action *act,
                               idem_outcome want, int line) {
  idem_call *c = NULL;
  int rc = idem_execute_local(s, id, fp, o, create_ticket, act, &c);
  if (rc != IDEM_OK)
    fail_msg("line %d: idem_execute_local(%s): %s: %s", line, id->key,
             idem_rc_name(rc), idem_errmsg());
  if (!c)
    fail_msg("line %d: idem_execute_local returned no claim", line);
  if (idem_call_outcome(c) != want)
    fail_msg("line %d: idem_execute_local(%s): outcome %s, expected %s", line,
             id->key, idem_outcome_name(idem_call_outcome(c)),
             idem_outcome_name(want));
  return c;
}

/* The ticket id of a response {"ticket_id":N}; -1 when it is not exactly
 * that. */
static long long ticket_id_of(const idem_response *r) {
  char want[64];
  long long id;
  if (!r || !r->body || r->body_len == 0 || r->body_len >= sizeof want)
    return -1;
  memcpy(want, r->body, r->body_len);
  want[r->body_len] = '\0';
  if (sscanf(want, "{\"ticket_id\":%lld}", &id) != 1)
    return -1;
  snprintf(want, sizeof want, "{\"ticket_id\":%lld}", id);
  if (strlen(want) != r->body_len || memcmp(want, r->body, r->body_len))
    return -1;
  return id;
}

static void assert_response_equal(const idem_response *got,
                                  const idem_response *want) {
  assert_non_null(got);
  assert_int_equal(got->status, want->status);
  assert_int_equal(got->meta_len, want->meta_len);
  if (want->meta_len)
    assert_memory_equal(got->meta, want->meta, want->meta_len);
  assert_int_equal(got->body_len, want->body_len);
  if (want->body_len)
    assert_memory_equal(got->body, want->body, want->body_len);
}

static idem_record *get_record(idem_store *s, const idem_id *id) {
  idem_record *r = NULL;
  int rc = idem_get(s, id, &r);
  if (rc != IDEM_OK)
    fail_msg("idem_get(%s): %s: %s", id->key, idem_rc_name(rc), idem_errmsg());
  assert_non_null(r);
  return r;
}

static void assert_absent(idem_store *s, const idem_id *id) {
  idem_record *r = (idem_record *)&r; /* must be reset to NULL */
  EXPECT_RC(IDEM_ENOTFOUND, idem_get(s, id, &r));
  assert_null(r);
}

static int count_cb(const idem_record *r, void *ctx) {
  (void)r;
  (*(int *)ctx)++;
  return 0;
}

static int list_count(idem_store *s, const idem_filter *filter) {
  int n = 0;
  EXPECT_RC(IDEM_OK, idem_list(s, filter, count_cb, &n));
  return n;
}

/* Sets the thread's error detail to a known text, so that a test can see
 * that a later failure wrote its own. */
static void prime_errmsg(char *copy, size_t size) {
  idem_store *s = NULL;
  EXPECT_RC(IDEM_EURL, idem_store_open("bogus://primed", NULL, &s));
  assert_null(s);
  snprintf(copy, size, "%s", idem_errmsg());
  assert_true(copy[0] != '\0');
}

static void assert_fresh_errmsg(const char *primed) {
  const char *m = idem_errmsg();
  assert_non_null(m);
  assert_true(m[0] != '\0');
  assert_string_not_equal(m, primed);
}

/* ------------------------------------------------------------------ */
/* A store held busy by another connection                              */
/* ------------------------------------------------------------------ */

/*
 * Holds the store's write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: an
 * EXCLUSIVE lock on the records table, which every write of a claim waits
 * for) on a connection of its own, for hold_ms, on a thread.
 */
typedef struct blocker {
  const char *url;
  int hold_ms;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int locked; /* 1 once the lock is held, -1 when taking it failed */
} blocker;

static void blocker_signal(blocker *b, int v) {
  pthread_mutex_lock(&b->mu);
  b->locked = v;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

static void *blocker_main(void *arg) {
  blocker *b = arg;
  if (is_pg_url(b->url)) {
    PGconn *conn = NULL;
    char target[URL_MAX], schema[64], sql[256];
    PGresult *res = pg_side_exec(b->url, "BEGIN", NULL, &conn);
    if (!res || pg_split_url(b->url, target, sizeof target, schema,
                             sizeof schema) != 0 ||
        pg_expand("LOCK TABLE {S}.idem_records IN EXCLUSIVE MODE", schema,
                  sql, sizeof sql) != 0) {
      PQclear(res);
      PQfinish(conn);
      blocker_signal(b, -1);
      return NULL;
    }
    PQclear(res);
    res = PQexec(conn, sql);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      PQclear(res);
      PQfinish(conn);
      blocker_signal(b, -1);
      return NULL;
    }
    PQclear(res);
    blocker_signal(b, 1);
    sleep_ms(b->hold_ms);
    PQclear(PQexec(conn, "COMMIT"));
    PQfinish(conn);
    return NULL;
  }
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(sqlite_path(b->url), &db, SQLITE_OPEN_READWRITE,
                      NULL) != SQLITE_OK ||
      sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
    sqlite3_close(db);
    blocker_signal(b, -1);
    return NULL;
  }
  blocker_signal(b, 1);
  sleep_ms(b->hold_ms);
  sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(db);
  return NULL;
}

/* Starts holding the lock and returns once it is held. */
static void blocker_start(blocker *b, const char *url, int hold_ms) {
  memset(b, 0, sizeof *b);
  b->url = url;
  b->hold_ms = hold_ms;
  pthread_mutex_init(&b->mu, NULL);
  pthread_cond_init(&b->cv, NULL);
  assert_int_equal(pthread_create(&b->thread, NULL, blocker_main, b), 0);
  pthread_mutex_lock(&b->mu);
  while (b->locked == 0)
    pthread_cond_wait(&b->cv, &b->mu);
  pthread_mutex_unlock(&b->mu);
  assert_int_equal(b->locked, 1);
}

static void blocker_join(blocker *b) {
  pthread_join(b->thread, NULL);
  pthread_mutex_destroy(&b->mu);
  pthread_cond_destroy(&b->cv);
}


/* ------------------------------------------------------------------ */
/* Running a suite                                                      */
/* ------------------------------------------------------------------ */

/*
 * Runs a program's suites on the backend IDEM_TEST_STORE names: the tests
 * for every backend, then those for SQLite only or PostgreSQL only. A
 * missing PostgreSQL server is a failure, never a skip.
 */
static int run_engine_tests(const char *label, const struct CMUnitTest *both,
                            size_t nboth,
                            const struct CMUnitTest *sqlite_only,
                            size_t nsqlite, const struct CMUnitTest *pg_only,
                            size_t npg) {
  test_backend backend = backend_from_env();
  const char *problem;
  char name[96];
  int failed = 0;
  if (backend == BACKEND_UNKNOWN) {
    fprintf(stderr, "%s: IDEM_TEST_STORE=%s: unknown store; use sqlite or "
                    "postgresql\n",
            label, getenv("IDEM_TEST_STORE"));
    return 1;
  }
  if (backend == BACKEND_POSTGRESQL && (problem = pg_url_problem()) != NULL) {
    fprintf(stderr, "%s: IDEM_TEST_STORE=postgresql: %s\n", label, problem);
    return 1;
  }
  snprintf(name, sizeof name, "%s (%s)", label,
           backend == BACKEND_POSTGRESQL ? "postgresql" : "sqlite");
  if (nboth)
    failed += _cmocka_run_group_tests(name, both, nboth, NULL, NULL);
  clean_left_over();
  if (backend == BACKEND_SQLITE && nsqlite) {
    snprintf(name, sizeof name, "%s (sqlite only)", label);
    failed += _cmocka_run_group_tests(name, sqlite_only, nsqlite, NULL, NULL);
    clean_left_over();
  }
  if (backend == BACKEND_POSTGRESQL && npg) {
    snprintf(name, sizeof name, "%s (postgresql only)", label);
    failed += _cmocka_run_group_tests(name, pg_only, npg, NULL, NULL);
    clean_left_over();
  }
  return failed;
}
