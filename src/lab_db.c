/*
 * lab_db.c -- the lab's side effects: tickets and account credits, kept in
 * the same database as the idem records so that a local action commits both
 * in one transaction. These are the caller's tables, not idem's: the lab
 * reaches them with the database's own API, as any application would.
 */
#include "lab.h"

#include <sqlite3.h>
#include <string.h>

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

int lab_db_setup(const char *url) {
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

int lab_db_insert_ticket(void *conn, const char *payload, long long *id) {
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

int lab_db_insert_ticket_alone(const char *url, const char *payload,
                               long long *id) {
  sqlite3 *db = open_db(url);
  int rc;
  if (!db)
    return -1;
  rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK
           ? lab_db_insert_ticket(db, payload, id)
           : -1;
  if (rc == 0 && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
    rc = -1;
  if (rc != 0)
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
  sqlite3_close(db);
  return rc;
}

static long long scalar(const char *url, const char *sql, const char *a,
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

long long lab_db_count_tickets(const char *url) {
  return scalar(url, "SELECT COUNT(*) FROM tickets", NULL, NULL);
}

int lab_db_credit(void *conn, const char *tenant, const char *account,
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

int lab_db_open_account(const char *url, const char *tenant,
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

long long lab_db_balance(const char *url, const char *tenant,
                         const char *account) {
  return scalar(url,
                "SELECT balance FROM accounts WHERE tenant = ?1 AND account "
                "= ?2",
                tenant, account);
}

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
