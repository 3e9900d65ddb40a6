/*
 * lab_db.c -- the lab's side effects: tickets and account credits, kept in
 * the same database as the idem records so that a local action commits both
 * in one transaction. These are the caller's tables, not idem's: the lab
 * reaches them with the database's own API, as any application would.
 */
#include "lab.h"

#ifdef IDEM_HAVE_PG
#include <libpq-fe.h>
#endif
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

/* The backend of the scenario being run, set by sq_setup(). Local
 * actions receive only the connection, so they learn from here what kind it
 * is and, on PostgreSQL, which schema holds the scenario's tables. */
static int current_pg;
static char current_schema[64];

static int is_pg(const char *url) {
  return strncmp(url, "postgresql://", 13) == 0 ||
         strncmp(url, "postgres://", 11) == 0;
}

static const char *sqlite_path(const char *url) {
  if (strncmp(url, "sqlite:", 7) == 0)
    return url + 7;
  return url;
}

static sqlite3 *open_db(const char *url) {
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(sqlite_path(url), &db, SQLITE_OPEN_READWRITE, NULL) !=
      SQLITE_OK) {
    fprintf(stderr, "idem lab: %s: %s\n", url,
            db ? sqlite3_errmsg(db) : "cannot open");
    sqlite3_close(db);
    return NULL;
  }
  sqlite3_busy_timeout(db, 30000);
  return db;
}

static int sq_setup(const char *url) {
  sqlite3 *db = open_db(url);
  char *err = NULL;
  int rc;
  if (!db)
    return -1;
  rc = sqlite3_exec(db,
                    "CREATE TABLE IF NOT EXISTS tickets (id INTEGER PRIMARY "
                    "KEY, payload TEXT NOT NULL);"
                    "CREATE TABLE IF NOT EXISTS accounts (tenant TEXT NOT "
                    "NULL, account TEXT NOT NULL, balance INTEGER NOT NULL, "
                    "version INTEGER NOT NULL, PRIMARY KEY (tenant, "
                    "account));",
                    NULL, NULL, &err);
  if (rc != SQLITE_OK)
    fprintf(stderr, "idem lab: setup: %s\n", err ? err : "?");
  sqlite3_free(err);
  sqlite3_close(db);
  return rc == SQLITE_OK ? 0 : -1;
}

static int sq_insert_ticket(void *conn, const char *payload, long long *id) {
  sqlite3 *db = conn;
  sqlite3_stmt *q = NULL;
  int rc = -1;
  if (sqlite3_prepare_v2(db, "INSERT INTO tickets (payload) VALUES (?1)", -1,
                         &q, NULL) != SQLITE_OK)
    return -1;
  sqlite3_bind_text(q, 1, payload, -1, SQLITE_STATIC);
  if (sqlite3_step(q) == SQLITE_DONE) {
    *id = sqlite3_last_insert_rowid(db);
    rc = 0;
  }
  sqlite3_finalize(q);
  return rc;
}

static int sq_insert_ticket_alone(const char *url, const char *payload,
                               long long *id) {
  sqlite3 *db = open_db(url);
  int rc;
  if (!db)
    return -1;
  rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK
           ? sq_insert_ticket(db, payload, id)
           : -1;
  if (rc == 0 && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
    rc = -1;
  if (rc != 0)
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  return rc;
}

static long long sq_scalar(const char *url, const char *sql, const char *a,
                        const char *b) {
  sqlite3 *db = open_db(url);
  sqlite3_stmt *q = NULL;
  long long v = -1;
  if (!db)
    return -1;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK) {
    if (a)
      sqlite3_bind_text(q, 1, a, -1, SQLITE_STATIC);
    if (b)
      sqlite3_bind_text(q, 2, b, -1, SQLITE_STATIC);
    int step = sqlite3_step(q);
    if (step == SQLITE_ROW)
      v = sqlite3_column_int64(q, 0);
    else if (step == SQLITE_DONE)
      v = -2; /* no such row */
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  return v;
}

static long long sq_count_tickets(const char *url) {
  return sq_scalar(url, "SELECT COUNT(*) FROM tickets", NULL, NULL);
}

static int sq_credit(void *conn, const char *tenant, const char *account,
                  long long amount, long long *balance, long long *version) {
  sqlite3 *db = conn;
  sqlite3_stmt *q = NULL;
  int rc = -1;
  if (sqlite3_prepare_v2(db,
                         "UPDATE accounts SET balance = balance + ?3, version "
                         "= version + 1 WHERE tenant = ?1 AND account = ?2 "
                         "RETURNING balance, version",
                         -1, &q, NULL) != SQLITE_OK)
    return -1;
  sqlite3_bind_text(q, 1, tenant, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, account, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 3, amount);
  switch (sqlite3_step(q)) {
  case SQLITE_ROW:
    *balance = sqlite3_column_int64(q, 0);
    *version = sqlite3_column_int64(q, 1);
    rc = sqlite3_step(q) == SQLITE_DONE ? 0 : -1;
    break;
  case SQLITE_DONE:
    rc = 1; /* no such account */
    break;
  }
  sqlite3_finalize(q);
  return rc;
}

static int sq_open_account(const char *url, const char *tenant,
                        const char *account) {
  sqlite3 *db = open_db(url);
  sqlite3_stmt *q = NULL;
  int rc = -1;
  if (!db)
    return -1;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO accounts VALUES (?1, ?2, 0, 0)", -1, &q,
                         NULL) == SQLITE_OK) {
    sqlite3_bind_text(q, 1, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, account, -1, SQLITE_STATIC);
    rc = sqlite3_step(q) == SQLITE_DONE ? 0 : -1;
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  return rc;
}

static long long sq_balance(const char *url, const char *tenant,
                         const char *account) {
  return sq_scalar(url,
                "SELECT balance FROM accounts WHERE tenant = ?1 AND account "
                "= ?2",
                tenant, account);
}

/* ---- PostgreSQL: the scenario's tables live in its own schema ---------- */

/* The schema named by the URL's idem_schema parameter. */
static int pg_schema_of(const char *url, char *out, size_t size) {
  const char *p = strstr(url, "idem_schema=");
  size_t n;
  if (!p)
    return -1;
  p += 12;
  n = strcspn(p, "&");
  if (n == 0 || n >= size)
    return -1;
  memcpy(out, p, n);
  out[n] = '\0';
  for (size_t i = 0; i < n; i++)
    if (!((out[i] >= 'a' && out[i] <= 'z') || (out[i] >= '0' && out[i] <= '9') ||
          out[i] == '_'))
      return -1;
  return 0;
}

#ifdef IDEM_HAVE_PG
static void quiet(void *arg, const char *message) {
  (void)arg;
  (void)message;
}

/* libpq does not know idem's own parameter: drop it. */
static PGconn *pg_open(const char *url) {
  char *conninfo = cli_pg_libpq_url(url);
  PGconn *pg;
  if (!conninfo)
    return NULL;
  pg = PQconnectdb(conninfo);
  free(conninfo);
  if (PQstatus(pg) != CONNECTION_OK) {
    /* libpq quotes a URL it cannot parse, password and all. */
    char *safe = cli_redact(PQerrorMessage(pg), url);
    fprintf(stderr, "idem lab: PostgreSQL: %s",
            safe ? safe : "cannot connect (out of memory)\n");
    free(safe);
    PQfinish(pg);
    return NULL;
  }
  /* "schema already exists, skipping" and the like are not for the user. */
  PQsetNoticeProcessor(pg, quiet, NULL);
  return pg;
}

static int pg_ok(PGresult *r) {
  ExecStatusType st = PQresultStatus(r);
  return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
}

/* Runs sql with up to two text parameters; returns the first column of the
 * first row (-2 when there is no row), or -1 on an error. */
static long long pg_value(PGconn *pg, const char *sql, const char *a,
                          const char *b) {
  const char *params[2] = {a, b};
  int n = b ? 2 : a ? 1 : 0;
  PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  long long v = -1;
  if (pg_ok(r))
    v = PQntuples(r) > 0 && !PQgetisnull(r, 0, 0) ? atoll(PQgetvalue(r, 0, 0))
        : PQntuples(r) > 0                         ? 0
                                                   : -2;
  else
    fprintf(stderr, "idem lab: PostgreSQL: %s", PQerrorMessage(pg));
  PQclear(r);
  return v;
}

static long long pg_url_value(const char *url, const char *fmt, const char *a,
                              const char *b) {
  char schema[64], sql[512];
  PGconn *pg;
  long long v;
  if (pg_schema_of(url, schema, sizeof schema) || !(pg = pg_open(url)))
    return -1;
  snprintf(sql, sizeof sql, fmt, schema);
  v = pg_value(pg, sql, a, b);
  PQfinish(pg);
  return v;
}

static int pg_setup(const char *url) {
  char schema[64], sql[1024];
  PGconn *pg;
  int rc = -1;
  if (pg_schema_of(url, schema, sizeof schema) || !(pg = pg_open(url)))
    return -1;
  snprintf(sql, sizeof sql,
           "CREATE SCHEMA IF NOT EXISTS \"%s\";"
           "CREATE TABLE IF NOT EXISTS \"%s\".tickets (id bigint PRIMARY KEY, "
           "payload text NOT NULL);"
           "CREATE TABLE IF NOT EXISTS \"%s\".accounts (tenant text NOT NULL, "
           "account text NOT NULL, balance bigint NOT NULL, version bigint "
           "NOT NULL, PRIMARY KEY (tenant, account))",
           schema, schema, schema);
  PGresult *r = PQexec(pg, sql);
  if (pg_ok(r))
    rc = 0;
  else
    fprintf(stderr, "idem lab: setup: %s", PQerrorMessage(pg));
  PQclear(r);
  PQfinish(pg);
  return rc;
}

/* Tickets are numbered without gaps, as a ticket system would: a rolled
 * back insert leaves no hole (a sequence would). The table lock is the
 * caller's own, held until the record commits. */
static int pg_insert_ticket(PGconn *pg, const char *payload, long long *id) {
  char lock[256], sql[256];
  snprintf(lock, sizeof lock,
           "LOCK TABLE \"%s\".tickets IN SHARE ROW EXCLUSIVE MODE",
           current_schema);
  snprintf(sql, sizeof sql,
           "INSERT INTO \"%s\".tickets (id, payload) SELECT COALESCE(MAX(id), "
           "0) + 1, $1 FROM \"%s\".tickets RETURNING id",
           current_schema, current_schema);
  PGresult *r = PQexec(pg, lock);
  int ok = pg_ok(r);
  PQclear(r);
  if (!ok)
    return -1;
  *id = pg_value(pg, sql, payload, NULL);
  return *id > 0 ? 0 : -1;
}

static int pg_credit(PGconn *pg, const char *tenant, const char *account,
                     long long amount, long long *balance,
                     long long *version) {
  char sql[256], amt[32];
  const char *params[3] = {tenant, account, amt};
  int rc = -1;
  snprintf(amt, sizeof amt, "%lld", amount);
  snprintf(sql, sizeof sql,
           "UPDATE \"%s\".accounts SET balance = balance + $3::bigint, "
           "version = version + 1 WHERE tenant = $1 AND account = $2 "
           "RETURNING balance, version",
           current_schema);
  PGresult *r = PQexecParams(pg, sql, 3, NULL, params, NULL, NULL, 0);
  if (pg_ok(r)) {
    if (PQntuples(r) == 1) {
      *balance = atoll(PQgetvalue(r, 0, 0));
      *version = atoll(PQgetvalue(r, 0, 1));
      rc = 0;
    } else {
      rc = 1; /* no such account */
    }
  }
  PQclear(r);
  return rc;
}

static int pg_insert_ticket_alone(const char *url, const char *payload,
                                  long long *id) {
  PGconn *pg;
  int rc = -1;
  if (!(pg = pg_open(url)))
    return -1;
  PGresult *r = PQexec(pg, "BEGIN");
  if (pg_ok(r) && pg_insert_ticket(pg, payload, id) == 0) {
    PQclear(r);
    r = PQexec(pg, "COMMIT");
    rc = pg_ok(r) ? 0 : -1;
  }
  PQclear(r);
  PQfinish(pg);
  return rc;
}

static int pg_reachable(const char *url) {
  PGconn *pg = pg_open(url); /* says why when it cannot connect */
  if (!pg)
    return -1;
  PQfinish(pg);
  return 0;
}

static int pg_drop(const char *url) {
  char schema[64], sql[128];
  PGconn *pg;
  if (pg_schema_of(url, schema, sizeof schema) || !(pg = pg_open(url)))
    return -1;
  snprintf(sql, sizeof sql, "DROP SCHEMA IF EXISTS \"%s\" CASCADE", schema);
  PGresult *r = PQexec(pg, sql);
  int rc = pg_ok(r) ? 0 : -1;
  PQclear(r);
  PQfinish(pg);
  return rc;
}
#else
/* Built without PostgreSQL (-DIDEM_WITH_POSTGRESQL=OFF): idem lab checks
 * that the server is reachable first, and that check says why it is not;
 * the rest is never reached. */
static int pg_reachable(const char *url) {
  (void)url;
  fprintf(stderr, "idem lab: this idem was built without PostgreSQL "
                  "support\n");
  return -1;
}
static int pg_setup(const char *url) { return pg_reachable(url); }
static int pg_insert_ticket(void *pg, const char *payload, long long *id) {
  (void)pg;
  (void)payload;
  (void)id;
  return -1;
}
static int pg_credit(void *pg, const char *tenant, const char *account,
                     long long amount, long long *balance,
                     long long *version) {
  (void)pg;
  (void)tenant;
  (void)account;
  (void)amount;
  (void)balance;
  (void)version;
  return -1;
}
static long long pg_url_value(const char *url, const char *fmt, const char *a,
                              const char *b) {
  (void)fmt;
  (void)a;
  (void)b;
  return pg_reachable(url);
}
static int pg_insert_ticket_alone(const char *url, const char *payload,
                                  long long *id) {
  (void)id;
  (void)payload;
  return pg_reachable(url);
}
static int pg_drop(const char *url) { return pg_reachable(url); }
#endif

/* ---- the lab's side-effect API ---------------------------------------- */

int lab_db_setup(const char *url) {
  current_pg = is_pg(url);
  if (!current_pg)
    return sq_setup(url);
  if (pg_schema_of(url, current_schema, sizeof current_schema))
    return -1;
  return pg_setup(url);
}

int lab_db_insert_ticket(void *conn, const char *payload, long long *id) {
  return current_pg ? pg_insert_ticket(conn, payload, id)
                    : sq_insert_ticket(conn, payload, id);
}

int lab_db_insert_ticket_alone(const char *url, const char *payload,
                               long long *id) {
  if (!is_pg(url))
    return sq_insert_ticket_alone(url, payload, id);
  return pg_insert_ticket_alone(url, payload, id);
}

long long lab_db_count_tickets(const char *url) {
  return is_pg(url) ? pg_url_value(url, "SELECT COUNT(*) FROM \"%s\".tickets",
                                   NULL, NULL)
                    : sq_count_tickets(url);
}

int lab_db_credit(void *conn, const char *tenant, const char *account,
                  long long amount, long long *balance, long long *version) {
  return current_pg
             ? pg_credit(conn, tenant, account, amount, balance, version)
             : sq_credit(conn, tenant, account, amount, balance, version);
}

int lab_db_open_account(const char *url, const char *tenant,
                        const char *account) {
  if (!is_pg(url))
    return sq_open_account(url, tenant, account);
  return pg_url_value(url,
                      "INSERT INTO \"%s\".accounts VALUES ($1, $2, 0, 0) "
                      "RETURNING 1",
                      tenant, account) == 1
             ? 0
             : -1;
}

long long lab_db_balance(const char *url, const char *tenant,
                         const char *account) {
  if (!is_pg(url))
    return sq_balance(url, tenant, account);
  return pg_url_value(url,
                      "SELECT balance FROM \"%s\".accounts WHERE tenant = $1 "
                      "AND account = $2",
                      tenant, account);
}

int lab_db_reachable(const char *url) {
  return is_pg(url) ? pg_reachable(url) : 0;
}

int lab_db_drop(const char *url) { return is_pg(url) ? pg_drop(url) : 0; }

const char *lab_db_sqlite_version(void) { return sqlite3_libversion(); }

static int count_one(const idem_record *r, void *ctx) {
  (void)r;
  ++*(long long *)ctx;
  return 0;
}

long long lab_count_records(const char *url) {
  idem_store *s = NULL;
  idem_filter f = {0};
  long long n = 0;
  f.expired = 1;
  if (idem_store_open(url, NULL, &s) != IDEM_OK)
    return -1;
  if (idem_list(s, &f, count_one, &n) != IDEM_OK)
    n = -1;
  idem_store_close(s);
  return n;
}
