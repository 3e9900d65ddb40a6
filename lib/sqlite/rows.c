/*
 * rows.c -- the SQLite store's statements and rows: the SQL, the read
 * that decides a claim, the writes inside a batch's transaction, local
 * actions, and the operators' reads (get, list).
 */
#include "sqlite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/*
 * Tables are named with their schema, main: a connection may have TEMP
 * tables of the same names (idem_execute_in() runs these statements on the
 * caller's connection), which would otherwise take the records.
 *
 * Every read that answers from rows also reads the schema version, in the
 * same statement and so the same snapshot: a store that a newer idem
 * migrated is refused (IDEM_ESCHEMA) instead of having its rows read in a
 * layout this idem does not know. One more lookup in a one-row table, no
 * statement more.
 */
#define VERSION_SQL                                                            \
  "(SELECT value FROM main.idem_meta WHERE name = 'schema_version')"

/* The columns of a record; rec is the recovered mark's column, or "0" on
 * a store of schema 1 opened read-only (which cannot be migrated). Then
 * the schema version. */
#define RECORD_COLUMNS(rec)                                                    \
  "tenant, operation, key, fingerprint, state, attempt, created_ms, "          \
  "updated_ms, lease_expires_ms, expires_ms, request, status, meta, body, "    \
  "checksum, " rec ", " VERSION_SQL
#define RECORD_RECOVERED 15
#define RECORD_VERSION 16

/* Expired by retention: completed records only. A record in progress or
 * marked unknown may describe an action that happened; it stays. ?1 is now
 * in Unix ms, ?15 on the boot-time clock: a completed record's retention
 * ends by both clocks (schema 3), so that a step of the wall clock forward
 * does not end it early. Stores of schema 1 and 2 (read-only) have the
 * wall clock's only. */
#define EXPIRED_SQL                                                            \
  "(state = 2 AND expires_ms <= ?1 AND expires_boot_ms <= ?15)"
#define EXPIRED_SQL_OLD "(state = 2 AND expires_ms <= ?1)"
/* Past its retention but kept, waiting for a holder or an operator. */
#define OVERDUE_SQL "(state <> 2 AND expires_ms <= ?1)"

/* A claim's read of its record: columns 0-8, the recovered mark (rec) and
 * the schema version. */
#define SELECT_SQL(rec, boot)                                                  \
  "SELECT fingerprint, state, attempt, lease_expires_ms, expires_ms, "         \
  "status, meta, body, checksum, " rec ", " VERSION_SQL ", " boot " FROM "     \
  "main.idem_records WHERE tenant = ?1 AND operation = ?2 AND key = ?3"
#define SELECT_RECOVERED 9
#define SELECT_VERSION 10
#define SELECT_EXPIRES_BOOT 11

#define GET_SQL(cols, expired)                                                 \
  "SELECT " cols                                                               \
  " FROM main.idem_records WHERE tenant = ?2 AND operation = ?3 "              \
  "AND key = ?4 AND NOT " expired

/* One page after the last record of the previous one (?8-?11). */
#define LIST_SQL(cols, expired)                                                \
  "SELECT " cols " FROM main.idem_records WHERE (?2 IS NULL OR "               \
  "tenant = ?2) AND (?3 IS NULL OR operation = ?3) AND (?4 = 0 OR state = "    \
  "?4) AND (?5 OR NOT " expired ") AND (?7 = 0 OR " OVERDUE_SQL ") AND "       \
  "(created_ms, tenant, operation, key) > (?8, ?9, ?10, ?11) ORDER BY "        \
  "created_ms, tenant, operation, key LIMIT ?6"

/*
 * A completion is marked recovered when its holder took the key over: its
 * attempt is then above 1 (attempts grow by takeovers only; a new record,
 * and one that replaces an expired record, start at 1). An operator's
 * resolution is marked by the same rule: a record of more than one attempt
 * may have acted more than once.
 */
static const char *const sql_text[ST_COUNT] = {
    [ST_SELECT] = SELECT_SQL("recovered", "expires_boot_ms"),
    [ST_INSERT] =
        "INSERT OR REPLACE INTO main.idem_records (tenant, operation, key, "
        "fingerprint, request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, 1, "
        "?7, ?7, ?8, ?9)",
    [ST_TAKEOVER] =
        "UPDATE main.idem_records SET state = 1, owner = ?4, attempt = "
        "attempt + 1, updated_ms = ?5, lease_expires_ms = ?6, "
        "expires_ms = MAX(expires_ms, ?7) WHERE tenant = ?1 AND "
        "operation = ?2 AND key = ?3",
    [ST_COMPLETE] =
        "UPDATE main.idem_records SET state = 2, owner = NULL, "
        "lease_expires_ms = "
        "0, updated_ms = ?5, expires_ms = ?6, status = ?7, meta = ?8, body = "
        "?9, checksum = ?10, recovered = attempt > 1, expires_boot_ms = ?11 "
        "WHERE tenant = ?1 AND operation = ?2 AND key = ?3 AND owner = ?4 AND "
        "state = 1",
    [ST_RELEASE] =
        "DELETE FROM main.idem_records WHERE tenant = ?1 AND operation "
        "= ?2 AND key = ?3 AND owner = ?4 AND state = 1",
    [ST_UNKNOWN] = "UPDATE main.idem_records SET state = 3, owner = NULL, "
                   "lease_expires_ms = 0, updated_ms = ?5 WHERE tenant = ?1 "
                   "AND operation = ?2 AND key = ?3 AND owner = ?4 AND state "
                   "= 1",
    [ST_RENEW] =
        "UPDATE main.idem_records SET lease_expires_ms = ?5, updated_ms = "
        "?6 WHERE tenant = ?1 AND operation = ?2 AND key = ?3 AND "
        "owner = ?4 AND state = 1",
    [ST_GET] = GET_SQL(RECORD_COLUMNS("recovered"), EXPIRED_SQL),
    [ST_LIST] = LIST_SQL(RECORD_COLUMNS("recovered"), EXPIRED_SQL),
    [ST_PRUNE] = "DELETE FROM main.idem_records WHERE " EXPIRED_SQL,
    [ST_PRUNE_SOME] = "DELETE FROM main.idem_records WHERE (tenant, operation, "
                      "key) IN (SELECT tenant, operation, key FROM "
                      "main.idem_records WHERE " EXPIRED_SQL " LIMIT 256)",
    [ST_RESOLVE_DONE] =
        "UPDATE main.idem_records SET state = 2, owner = NULL, "
        "lease_expires_ms = "
        "0, updated_ms = ?4, expires_ms = MAX(expires_ms, ?5), status = ?6, "
        "meta = ?7, body = ?8, checksum = ?9, recovered = attempt > 1, "
        "expires_boot_ms = ?10 WHERE tenant = ?1 AND operation = ?2 AND key = "
        "?3 AND state <> 2",
    [ST_RESOLVE_DELETE] = "DELETE FROM main.idem_records WHERE tenant = ?1 AND "
                          "operation = ?2 AND key = ?3 AND state <> 2",
    [ST_DELETE] =
        "DELETE FROM main.idem_records WHERE tenant = ?1 AND operation = "
        "?2 AND key = ?3",
    /* A local action's record, written once, completed, after the action
     * ran: the batch holds the write lock throughout, so no one could have
     * seen it in progress. */
    [ST_INSERT_DONE] =
        "INSERT OR REPLACE INTO main.idem_records (tenant, operation, key, "
        "fingerprint, request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms, status, meta, body, checksum, "
        "expires_boot_ms) VALUES (?1, ?2, ?3, ?4, ?5, 2, NULL, 1, ?6, ?6, 0, "
        "?7, ?8, ?9, ?10, ?11, ?12)",
    [ST_TAKEOVER_DONE] =
        "UPDATE main.idem_records SET state = 2, owner = NULL, attempt = "
        "attempt + "
        "1, updated_ms = ?6, lease_expires_ms = 0, expires_ms = ?7, status = "
        "?8, meta = ?9, body = ?10, checksum = ?11, recovered = 1, "
        "expires_boot_ms = ?12 WHERE tenant = ?1 AND operation = ?2 AND key = "
        "?3 AND fingerprint = ?4",
    /* For an action that ended the transaction itself: whether its writes
     * were kept is unknown, and the key must say so (a holder's expired
     * row too; a completed one is left as it is). */
    [ST_INSERT_UNKNOWN] =
        "INSERT INTO main.idem_records (tenant, operation, key, fingerprint, "
        "request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, 3, NULL, 1, "
        "?6, ?6, 0, ?7) ON CONFLICT (tenant, operation, key) DO UPDATE SET "
        "state = 3, owner = NULL, lease_expires_ms = 0, updated_ms = ?6 WHERE "
        "idem_records.state = 1",
    /* Prepared once: a batch's transaction, and the savepoint each local
     * action of a batch runs in. */
    [ST_SAVEPOINT] = "SAVEPOINT idem_op",
    [ST_RELEASE_SP] = "RELEASE idem_op",
    [ST_ROLLBACK_SP] = "ROLLBACK TO idem_op",
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_VERSION] =
        "SELECT CAST(value AS INTEGER) FROM main.idem_meta WHERE name "
        "= 'schema_version'",
};

/* The reads as they are on a store of schema 1, which a read-only handle
 * reads without migrating it: no record of it is marked. */
static const char *const sql_text_v1[ST_COUNT] = {
    [ST_SELECT] = SELECT_SQL("0", "0"),
    [ST_GET] = GET_SQL(RECORD_COLUMNS("0"), EXPIRED_SQL_OLD),
    [ST_LIST] = LIST_SQL(RECORD_COLUMNS("0"), EXPIRED_SQL_OLD),
};

/* The same on a store of schema 2: retention on the wall clock only. */
static const char *const sql_text_v2[ST_COUNT] = {
    [ST_SELECT] = SELECT_SQL("recovered", "0"),
    [ST_GET] = GET_SQL(RECORD_COLUMNS("recovered"), EXPIRED_SQL_OLD),
    [ST_LIST] = LIST_SQL(RECORD_COLUMNS("recovered"), EXPIRED_SQL_OLD),
};

sqlite3_stmt *idem__sq_stmt(conn *c, int which) {
  if (!c->st[which]) {
    const char *const *old = c->store->schema_min == 1   ? sql_text_v1
                             : c->store->schema_min == 2 ? sql_text_v2
                                                         : NULL;
    const char *sql = old && old[which] ? old[which] : sql_text[which];
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                           &c->st[which], NULL) != SQLITE_OK)
      return NULL;
  } else {
    sqlite3_reset(c->st[which]);
    sqlite3_clear_bindings(c->st[which]);
  }
  return c->st[which];
}

/* ---- reading rows -------------------------------------------------------- */

void idem__sq_bind_id(sqlite3_stmt *q, const idem_id *id, int first) {
  sqlite3_bind_text(q, first, id->tenant ? id->tenant : "", -1, SQLITE_STATIC);
  sqlite3_bind_text(q, first + 1, id->operation, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, first + 2, id->key, -1, SQLITE_STATIC);
}

/*
 * Reads the record of op->id and decides the outcome at time now. For REPLAY
 * the stored response is checked against its checksum and copied into the
 * claim. Returns 0, or op->rc on failure.
 */
int idem__sq_load_and_decide(conn *c, idem__op *op, int64_t now, idem__row *row,
                             idem__action *action) {
  sqlite3_stmt *q = idem__sq_stmt(c, ST_SELECT);
  int step, version;
  memset(row, 0, sizeof *row);
  if (!q)
    return idem__sq_op_read_failed(c, op, "prepare");
  idem__sq_bind_id(q, op->id, 1);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    const unsigned char *fp = sqlite3_column_text(q, 0);
    row->exists = 1;
    size_t fplen = fp ? (size_t)sqlite3_column_bytes(q, 0) : 0;
    if (fplen >= sizeof row->fingerprint)
      fplen = sizeof row->fingerprint - 1;
    memcpy(row->fingerprint, fp ? (const char *)fp : "", fplen);
    row->fingerprint[fplen] = '\0';
    row->state = sqlite3_column_int(q, 1);
    row->attempt = sqlite3_column_int(q, 2);
    row->lease_expires_ms = sqlite3_column_int64(q, 3);
    row->expires_ms = sqlite3_column_int64(q, 4);
    row->recovered = sqlite3_column_int(q, SELECT_RECOVERED);
    row->expires_lease_ms = sqlite3_column_int64(q, SELECT_EXPIRES_BOOT);
    version = sqlite3_column_int(q, SELECT_VERSION);
    if (!idem__sq_schema_known(c->store, version)) {
      sqlite3_reset(q);
      idem__sq_schema_problem(c->store, version, op->errmsg, sizeof op->errmsg);
      return op->rc = IDEM_ESCHEMA;
    }
  } else if (step != SQLITE_DONE) {
    sqlite3_reset(q);
    return idem__sq_op_read_failed(c, op, "read record");
  }
  /* Leases on the boot-time clock, retention on the wall clock. */
  *action = idem__decide_op(op, row, now, idem__boot_ms());
  if (op->claim->outcome == IDEM_REPLAY) {
    /* Each pointer first, then its length, as SQLite asks. */
    const void *meta = sqlite3_column_blob(q, 6);
    size_t meta_len = (size_t)sqlite3_column_bytes(q, 6);
    const void *body = sqlite3_column_blob(q, 7);
    size_t body_len = (size_t)sqlite3_column_bytes(q, 7);
    const char *sum = (const char *)sqlite3_column_text(q, 8);
    size_t sum_len = (size_t)sqlite3_column_bytes(q, 8);
    if (idem__claim_replay(op, row->fingerprint, sqlite3_column_int(q, 5), meta,
                           meta_len, body, body_len, sum, sum_len,
                           row->recovered) != IDEM_OK) {
      sqlite3_reset(q);
      return op->rc;
    }
  }
  sqlite3_reset(q);
  return IDEM_OK;
}

/* ---- writes, inside the batch's transaction ------------------------------ */

/* op read or wrote a completed record: the caller caches it once the batch
 * committed (cache_committed()), never before, as a batch may yet fail. */
void idem__sq_cache_later(idem__op *op, int64_t expires_ms, int attempt) {
  op->cache_it = 1;
  op->cache_expires_ms = expires_ms;
  op->cache_attempt = attempt;
}

static int write_claim(conn *c, idem__op *op, const idem__row *row,
                       idem__action action, int64_t now) {
  idem_call *cl = op->claim;
  int64_t lease_now = idem__boot_ms();
  sqlite3_stmt *q;
  if (idem__new_token(cl->token) != IDEM_OK)
    return idem__op_fail(op, IDEM_EIO, "%s", idem_errmsg());
  if (action == IDEM__ACT_INSERT) {
    q = idem__sq_stmt(c, ST_INSERT);
    if (!q)
      return idem__sq_op_sqlite_fail(op, c, "prepare");
    idem__sq_bind_id(q, op->id, 1);
    sqlite3_bind_text(q, 4, op->fingerprint, -1, SQLITE_STATIC);
    if (op->opts.request)
      sqlite3_bind_blob(q, 5, op->opts.request, (int)op->opts.request_len,
                        SQLITE_STATIC);
    sqlite3_bind_text(q, 6, cl->token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 7, now);
    sqlite3_bind_int64(q, 8, idem__deadline(lease_now, op->opts.lease_ms));
    sqlite3_bind_int64(q, 9, idem__deadline(now, op->opts.retention_ms));
    cl->attempt = 1;
  } else {
    q = idem__sq_stmt(c, ST_TAKEOVER);
    if (!q)
      return idem__sq_op_sqlite_fail(op, c, "prepare");
    idem__sq_bind_id(q, op->id, 1);
    sqlite3_bind_text(q, 4, cl->token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 5, now);
    sqlite3_bind_int64(q, 6, idem__deadline(lease_now, op->opts.lease_ms));
    sqlite3_bind_int64(q, 7, idem__deadline(now, op->opts.retention_ms));
    cl->attempt = row->attempt + 1;
  }
  if (sqlite3_step(q) != SQLITE_DONE) {
    idem__sq_op_sqlite_fail(op, c, "write claim");
    sqlite3_reset(q);
    return op->rc;
  }
  sqlite3_reset(q);
  cl->lease_expires_ms = idem__deadline(lease_now, op->opts.lease_ms);
  cl->lease_on_boot = 1;
  return IDEM_OK;
}

static int write_complete(conn *c, idem__op *op, const idem_response *r,
                          int64_t now) {
  char sum[IDEM_FINGERPRINT_SIZE];
  sqlite3_stmt *q = idem__sq_stmt(c, ST_COMPLETE);
  int changed;
  if (!q)
    return idem__sq_op_sqlite_fail(op, c, "prepare");
  if (idem__response_checksum(op->fingerprint, r->status, r->meta, r->meta_len,
                              r->body, r->body_len, sum) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "checksum: out of memory");
  idem__sq_bind_id(q, op->id, 1);
  sqlite3_bind_text(q, 4, op->claim->token, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 5, now);
  sqlite3_bind_int64(q, 6, idem__deadline(now, op->opts.retention_ms));
  sqlite3_bind_int(q, 7, r->status);
  if (r->meta)
    sqlite3_bind_blob(q, 8, r->meta, (int)r->meta_len, SQLITE_STATIC);
  sqlite3_bind_blob(q, 9, r->body_len ? r->body : "", (int)r->body_len,
                    SQLITE_STATIC);
  sqlite3_bind_text(q, 10, sum, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 11,
                     idem__deadline(idem__boot_ms(), op->opts.retention_ms));
  if (sqlite3_step(q) != SQLITE_DONE) {
    idem__sq_op_sqlite_fail(op, c, "complete");
    sqlite3_reset(q);
    return op->rc;
  }
  changed = sqlite3_changes(c->db);
  sqlite3_reset(q);
  if (changed == 0)
    return idem__op_fail(op, IDEM_ESTALE,
                         "key '%s': the lease was taken over by a newer "
                         "attempt or the record was removed; this response "
                         "was not stored",
                         op->id->key);
  idem__sq_cache_later(op, idem__deadline(now, op->opts.retention_ms),
                       op->claim->attempt);
  return IDEM_OK;
}

/* Release, mark unknown and renew: one fenced statement each. */
static int write_fenced(conn *c, idem__op *op, int which, int64_t now) {
  sqlite3_stmt *q = idem__sq_stmt(c, which);
  int64_t lease_now = idem__boot_ms();
  int changed;
  if (!q)
    return idem__sq_op_sqlite_fail(op, c, "prepare");
  idem__sq_bind_id(q, op->id, 1);
  sqlite3_bind_text(q, 4, op->claim->token, -1, SQLITE_STATIC);
  if (which == ST_UNKNOWN) {
    sqlite3_bind_int64(q, 5, now);
  } else if (which == ST_RENEW) {
    sqlite3_bind_int64(q, 5, idem__deadline(lease_now, op->lease_ms));
    sqlite3_bind_int64(q, 6, now);
  }
  if (sqlite3_step(q) != SQLITE_DONE) {
    idem__sq_op_sqlite_fail(op, c, "update");
    sqlite3_reset(q);
    return op->rc;
  }
  changed = sqlite3_changes(c->db);
  sqlite3_reset(q);
  if (changed == 0)
    return idem__op_fail(op, IDEM_ESTALE,
                         "key '%s': the lease was taken over by a newer "
                         "attempt or the record was removed",
                         op->id->key);
  if (which == ST_RENEW)
    op->claim->lease_expires_ms = idem__deadline(lease_now, op->lease_ms);
  return IDEM_OK;
}

/* The parameters a record written by a local action starts with: ?1-?3 its
 * id, ?4 the fingerprint, ?5 the request, ?6 now, ?7 its expiry. */
static void bind_new_record(sqlite3_stmt *q, const idem__op *op, int64_t now) {
  idem__sq_bind_id(q, op->id, 1);
  sqlite3_bind_text(q, 4, op->fingerprint, -1, SQLITE_STATIC);
  if (op->opts.request)
    sqlite3_bind_blob(q, 5, op->opts.request, (int)op->opts.request_len,
                      SQLITE_STATIC);
  sqlite3_bind_int64(q, 6, now);
  sqlite3_bind_int64(q, 7, idem__deadline(now, op->opts.retention_ms));
}

/*
 * After an action that ended the transaction itself (COMMIT or ROLLBACK
 * inside it, against the contract): its writes may have been kept without
 * their record, so the key is marked unknown, in a statement that commits
 * by itself, and a retry does not act again.
 */
static void mark_self_ended(conn *c, idem__op *op, int64_t now) {
  sqlite3_stmt *q = idem__sq_stmt(c, ST_INSERT_UNKNOWN);
  int step = SQLITE_ERROR;
  if (q) {
    bind_new_record(q, op, now);
    step = sqlite3_step(q);
    sqlite3_reset(q);
  }
  idem__op_fail(op, IDEM_ESTORE,
                "key '%s': the action ended idem's transaction itself "
                "(COMMIT or ROLLBACK), so its writes may have been kept "
                "without their record%s%s",
                op->id->key,
                step == SQLITE_DONE
                    ? "; the key is marked unknown (idem keys resolve)"
                    : ", and marking the key unknown failed: ",
                step == SQLITE_DONE ? "" : sqlite3_errmsg(c->db));
}

/*
 * A local action: runs fn, then writes its record, completed, in one
 * statement (a new record, or the takeover of an expired holder's).
 */
static void run_local(conn *c, idem__op *op, const idem__row *row,
                      idem__action action, int64_t now) {
  idem_response r;
  char sum[IDEM_FINGERPRINT_SIZE];
  sqlite3_stmt *q;
  unsigned commits = c->commits;
  int fn_rc;
  memset(&r, 0, sizeof r);
  fn_rc = op->fn(c->db, op->ctx, &r);
  if (c->foreign && fn_rc == IDEM_LOCAL_CLOSED) {
    c->gone = 1; /* a zombie until its statements are finalized */
    idem__op_fail(op, IDEM_ESTATE,
                  "key '%s': the action closed the caller's connection; "
                  "nothing was stored (its transaction ended with it)",
                  op->id->key);
    return;
  }
  if (sqlite3_get_autocommit(c->db)) {
    int src = sqlite3_extended_errcode(c->db);
    /* SQLite itself rolls the whole transaction back when a statement
     * meets an I/O error, a full disk or no memory. When nothing committed
     * meanwhile (the connection's commit hook counts commits; the caller's
     * own connection has none), nothing of the action was kept: the key
     * stays free. */
    char buf[384];
    if (!c->foreign && c->commits == commits &&
        ((src & 0xff) == SQLITE_IOERR || (src & 0xff) == SQLITE_FULL ||
         (src & 0xff) == SQLITE_NOMEM)) {
      idem__op_fail(op, idem__sq_map_rc(src),
                    "key '%s': the action's statement failed (%s) and "
                    "SQLite rolled the transaction back: nothing of it was "
                    "kept; a retry acts",
                    op->id->key, idem__sq_errtext(c->db, buf, sizeof buf));
      return;
    }
    mark_self_ended(c, op, now);
    return;
  }
  if (fn_rc != 0) {
    idem__op_fail(op, IDEM_EREJECTED,
                  "key '%s': the action returned %d; it was rolled back and "
                  "no record was kept",
                  op->id->key, fn_rc);
    return;
  }
  {
    char why[128];
    int rc = idem__response_problem(&r, "action's response", why, sizeof why);
    if (rc != IDEM_OK) {
      idem__op_fail(op, rc, "%s", why);
      return;
    }
  }
  if (idem__response_checksum(op->fingerprint, r.status, r.meta, r.meta_len,
                              r.body, r.body_len, sum) != IDEM_OK) {
    idem__op_fail(op, IDEM_ENOMEM, "checksum: out of memory");
    return;
  }
  q = idem__sq_stmt(c, action == IDEM__ACT_INSERT ? ST_INSERT_DONE
                                                  : ST_TAKEOVER_DONE);
  if (!q) {
    idem__sq_op_sqlite_fail(op, c, "prepare");
    return;
  }
  bind_new_record(q, op, now);
  sqlite3_bind_int(q, 8, r.status);
  if (r.meta)
    sqlite3_bind_blob(q, 9, r.meta, (int)r.meta_len, SQLITE_STATIC);
  sqlite3_bind_blob(q, 10, r.body_len ? r.body : "", (int)r.body_len,
                    SQLITE_STATIC);
  sqlite3_bind_text(q, 11, sum, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 12,
                     idem__deadline(idem__boot_ms(), op->opts.retention_ms));
  if (sqlite3_step(q) != SQLITE_DONE) {
    idem__sq_op_sqlite_fail(op, c, "write record");
    sqlite3_reset(q);
    return;
  }
  sqlite3_reset(q);
  /* The action's rows must never commit without their record. */
  if (sqlite3_changes(c->db) != 1) {
    idem__op_fail(op, IDEM_ESTORE,
                  "key '%s': the record changed under the write lock; the "
                  "action was rolled back",
                  op->id->key);
    return;
  }
  op->claim->attempt = action == IDEM__ACT_INSERT ? 1 : row->attempt + 1;
  if (idem__claim_set_response(op->claim, r.status, r.meta, r.meta_len, r.body,
                               r.body_len) != IDEM_OK) {
    idem__op_fail(op, IDEM_ENOMEM, "out of memory");
    return;
  }
  idem__sq_cache_later(op, idem__deadline(now, op->opts.retention_ms),
                       op->claim->attempt);
}

/* Runs one op inside the open transaction. */
void idem__sq_run_one(conn *c, idem__op *op, int64_t now) {
  idem__row row;
  idem__action action;
  switch (op->kind) {
  case IDEM__OP_CLAIM:
  case IDEM__OP_LOCAL:
    if (idem__sq_load_and_decide(c, op, now, &row, &action) != IDEM_OK)
      return;
    if (action == IDEM__ACT_NONE) {
      if (op->claim->outcome == IDEM_REPLAY)
        idem__sq_cache_later(op, row.expires_ms, row.attempt);
      return;
    }
    if (op->kind == IDEM__OP_LOCAL) {
      run_local(c, op, &row, action, now);
      return;
    }
    if (write_claim(c, op, &row, action, now) == IDEM_OK)
      op->claim->held = 1;
    return;
  case IDEM__OP_COMPLETE:
    write_complete(c, op, op->response, now);
    return;
  case IDEM__OP_RELEASE:
    write_fenced(c, op, ST_RELEASE, now);
    return;
  case IDEM__OP_MARK_UNKNOWN:
    write_fenced(c, op, ST_UNKNOWN, now);
    return;
  case IDEM__OP_RENEW:
    write_fenced(c, op, ST_RENEW, now);
    return;
  }
  idem__op_fail(op, IDEM_EINVAL, "unknown operation");
}

/* Runs a statement without parameters or rows. */
int idem__sq_step_once(conn *c, int which) {
  sqlite3_stmt *q = idem__sq_stmt(c, which);
  int rc;
  if (!q)
    return sqlite3_errcode(c->db);
  rc = sqlite3_step(q);
  sqlite3_reset(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/* ---- operators ----------------------------------------------------------- */

/* A column's bytes, or NULL for SQL NULL. */
static const void *col_bytes(sqlite3_stmt *q, int i, size_t *len) {
  const void *b = sqlite3_column_blob(q, i);
  *len = (size_t)sqlite3_column_bytes(q, i);
  if (sqlite3_column_type(q, i) == SQLITE_NULL) {
    *len = 0;
    return NULL;
  }
  return b ? b : "";
}

/* Columns in RECORD_COLUMNS order. A lease on the boot-time clock (schema
 * 3) is shown in Unix ms, as every other time of a record. */
static int row_to_record(const conn *c, sqlite3_stmt *q, idem_record **out) {
  idem__row_parts p;
  memset(&p, 0, sizeof p);
  p.tenant = col_bytes(q, 0, &p.tenant_len);
  p.operation = col_bytes(q, 1, &p.operation_len);
  p.key = col_bytes(q, 2, &p.key_len);
  p.fingerprint = col_bytes(q, 3, &p.fingerprint_len);
  p.state = sqlite3_column_int(q, 4);
  p.attempt = sqlite3_column_int(q, 5);
  p.created_ms = sqlite3_column_int64(q, 6);
  p.updated_ms = sqlite3_column_int64(q, 7);
  p.lease_expires_ms = sqlite3_column_int64(q, 8);
  if (p.lease_expires_ms > 0 && c->store->schema_min >= 3)
    p.lease_expires_ms = idem__lease_to_wall(p.lease_expires_ms);
  p.expires_ms = sqlite3_column_int64(q, 9);
  p.request = col_bytes(q, 10, &p.request_len);
  p.status = sqlite3_column_int(q, 11);
  p.meta = col_bytes(q, 12, &p.meta_len);
  p.body = col_bytes(q, 13, &p.body_len);
  p.recovered = sqlite3_column_int(q, RECORD_RECOVERED);
  return idem__record_new(&p, out);
}

int idem__sq_get(void *state, const idem_id *id, idem_record **out) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int rc = idem__sq_pool_get(s, &c), step;
  if (rc != IDEM_OK)
    return rc;
  q = idem__sq_stmt(c, ST_GET);
  if (!q) {
    rc = idem__sq_read_failed(s, c, "prepare");
    goto out;
  }
  sqlite3_bind_int64(q, 1, idem__now_ms());
  sqlite3_bind_int64(q, 15, idem__boot_ms());
  idem__sq_bind_id(q, id, 2);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    int version = sqlite3_column_int(q, RECORD_VERSION);
    rc = idem__sq_schema_known(s, version)
             ? row_to_record(c, q, out)
             : idem__sq_schema_refused(s, version);
  } else if (step == SQLITE_DONE) {
    /* No row read the version: read it on its own. */
    if ((rc = idem__sq_schema_unchanged(s, c)) == IDEM_OK)
      rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                      id->tenant ? id->tenant : "", id->operation, id->key);
  } else {
    rc = idem__sq_read_failed(s, c, "get");
  }
  sqlite3_reset(q);
out:
  idem__sq_pool_put(s, c);
  return rc;
}

#define LIST_PAGE 256

/*
 * Reads records a page at a time and calls fn with no connection held: fn
 * may call back into the store (even with max_connections = 1), and no read
 * snapshot stays open while it works, which would keep the log from being
 * reused. Each page starts after the last record of the one before.
 */
int idem__sq_list(void *state, const idem_filter *f, idem_record_fn fn,
                  void *ctx) {
  sq_store *s = state;
  idem_record *page[LIST_PAGE];
  int64_t left = f->limit > 0 ? f->limit : -1, after_ms = INT64_MIN;
  char *after[3] = {NULL, NULL, NULL};
  int rc = IDEM_OK, n = 0, more = 1;

  while (more && rc == IDEM_OK && left != 0) {
    conn *c;
    sqlite3_stmt *q;
    int step, want = left < 0 || left > LIST_PAGE ? LIST_PAGE : (int)left;
    n = 0;
    if ((rc = idem__sq_pool_get(s, &c)) != IDEM_OK)
      break;
    q = idem__sq_stmt(c, ST_LIST);
    if (!q) {
      rc = idem__sq_read_failed(s, c, "prepare");
      idem__sq_pool_put(s, c);
      break;
    }
    sqlite3_bind_int64(q, 1, idem__now_ms());
    sqlite3_bind_int64(q, 15, idem__boot_ms());
    if (f->tenant)
      sqlite3_bind_text(q, 2, f->tenant, -1, SQLITE_STATIC);
    if (f->operation)
      sqlite3_bind_text(q, 3, f->operation, -1, SQLITE_STATIC);
    sqlite3_bind_int(q, 4, f->state);
    sqlite3_bind_int(q, 5, f->expired || f->overdue ? 1 : 0);
    sqlite3_bind_int64(q, 6, want);
    sqlite3_bind_int(q, 7, f->overdue ? 1 : 0);
    sqlite3_bind_int64(q, 8, after_ms);
    sqlite3_bind_text(q, 9, after[0] ? after[0] : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 10, after[1] ? after[1] : "", -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 11, after[2] ? after[2] : "", -1, SQLITE_STATIC);
    while (n < want && (step = sqlite3_step(q)) == SQLITE_ROW) {
      int version = sqlite3_column_int(q, RECORD_VERSION);
      if (!idem__sq_schema_known(s, version)) {
        rc = idem__sq_schema_refused(s, version);
        break;
      }
      if ((rc = row_to_record(c, q, &page[n])) != IDEM_OK)
        break;
      n++;
    }
    if (rc == IDEM_OK && n < want && step != SQLITE_DONE)
      rc = idem__sq_read_failed(s, c, "list");
    sqlite3_reset(q);
    /* An empty page read no version: read it on its own. */
    if (rc == IDEM_OK && n == 0)
      rc = idem__sq_schema_unchanged(s, c);
    idem__sq_pool_put(s, c);
    more = n == want;
    if (n > 0) {
      const idem_record *last = page[n - 1];
      after_ms = last->created_ms;
      for (int k = 0; k < 3; k++)
        free(after[k]);
      after[0] = idem__strdup(last->tenant);
      after[1] = idem__strdup(last->operation);
      after[2] = idem__strdup(last->key);
      if (!after[0] || !after[1] || !after[2])
        rc = rc ? rc : idem__fail(IDEM_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
      if (rc == IDEM_OK) {
        rc = fn(page[i], ctx);
        if (left > 0)
          left--;
      }
      idem_record_free(page[i]);
    }
  }
  for (int k = 0; k < 3; k++)
    free(after[k]);
  return rc;
}

/* ---- the caller's own transaction (idem_execute_in) ---------------------- */

/* Runs sql on the caller's connection; SQLITE_OK or SQLite's code. */
static int exec_on(sqlite3 *db, const char *sql) {
  return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* Why db is not a writable connection to s's database file; NULL when it
 * is. */
static const char *not_ours(sq_store *s, sqlite3 *db) {
  const char *file = sqlite3_db_filename(db, "main");
  struct stat st;
  if (s->o.read_only)
    return "the store was opened read-only";
  if (!file || !*file || stat(file, &st) != 0)
    return "the connection's main database is not a file";
  if (!s->db_known || st.st_dev != s->db_dev || st.st_ino != s->db_ino)
    return "the connection's main database is another file than the store's";
  if (sqlite3_db_readonly(db, "main") != 0)
    return "the connection is read-only";
  return NULL;
}

/*
 * idem_execute_in() on SQLite: the caller's transaction (begun IMMEDIATE
 * when none is open) first holds the write lock, so that the read that
 * decides and the writes after it are one step to every other connection;
 * a deferred transaction that read before another connection's commit
 * cannot take it (SQLITE_BUSY_SNAPSHOT) and is told to run again. Then
 * the decision and the action as in a batch, inside a savepoint of the
 * caller's transaction. Statements are prepared on the caller's
 * connection and finalized before returning.
 */
void idem__sq_run_in(void *state, idem__op *op) {
  sq_store *s = state;
  sqlite3 *db = op->conn;
  const char *why = not_ours(s, db);
  int began = 0, src;
  conn c;
  char buf[384];

  if (why) {
    idem__op_fail(op, IDEM_EINVAL, "execute_in: %s (%.200s)", why, s->path);
    return;
  }
  if (!idem__sq_files_intact(s, op->errmsg, sizeof op->errmsg)) {
    op->rc = IDEM_ESTORE;
    return;
  }
  memset(&c, 0, sizeof c);
  c.db = db;
  c.store = s;
  c.foreign = 1;
  if (sqlite3_get_autocommit(db)) {
    if ((src = exec_on(db, "BEGIN IMMEDIATE")) != SQLITE_OK) {
      idem__op_fail(op, idem__sq_map_rc(src), "sqlite: begin: %s",
                    idem__sq_errtext(db, buf, sizeof buf));
      return;
    }
    began = 1;
  } else if (sqlite3_txn_state(db, "main") != SQLITE_TXN_WRITE &&
             (src = exec_on(db, "UPDATE main.idem_meta SET value = value WHERE "
                                "0")) != SQLITE_OK) {
    src = sqlite3_extended_errcode(db);
    idem__op_fail(op, idem__sq_map_rc(src),
                  "sqlite: the caller's transaction cannot take the write "
                  "lock (%s)%s",
                  idem__sq_errtext(db, buf, sizeof buf),
                  src == SQLITE_BUSY_SNAPSHOT
                      ? ": it read before another connection committed; "
                        "roll it back and run it again"
                      : "");
    return;
  }
  if ((src = exec_on(db, "SAVEPOINT idem_in")) != SQLITE_OK) {
    idem__op_fail(op, idem__sq_map_rc(src), "sqlite: savepoint: %s",
                  idem__sq_errtext(db, buf, sizeof buf));
  } else {
    idem__sq_run_one(&c, op, idem__now_ms());
    /* Nothing of it is cached: the caller's transaction may yet roll
     * back. */
    op->cache_it = 0;
    if (c.gone) {
      /* Closed by the action: finalizing idem's statements frees it. */
    } else if (sqlite3_get_autocommit(db)) {
      /* The action ended the transaction itself (run_local() said so). */
    } else if (op->rc == IDEM_OK && (op->claim->outcome == IDEM_PROCEED ||
                                     op->claim->outcome == IDEM_RECOVER)) {
      if ((src = exec_on(db, "RELEASE idem_in")) != SQLITE_OK)
        idem__op_fail(op, idem__sq_map_rc(src), "sqlite: release: %s",
                      idem__sq_errtext(db, buf, sizeof buf));
    } else if (exec_on(db, "ROLLBACK TO idem_in") == SQLITE_OK) {
      exec_on(db, "RELEASE idem_in");
    } else if (op->rc == IDEM_OK || op->rc == IDEM_EREJECTED) {
      /* What the action wrote may still be in the transaction. */
      idem__op_fail(op, IDEM_ESTORE,
                    "execute_in: the savepoint could not be rolled back (%s); "
                    "roll the transaction back",
                    idem__sq_errtext(db, buf, sizeof buf));
    }
  }
  if (!c.gone && op->rc != IDEM_OK && began && !sqlite3_get_autocommit(db))
    exec_on(db, "ROLLBACK");
  /* Last: a connection that the action closed is a zombie that the last
   * of these frees. */
  for (int i = 0; i < ST_COUNT; i++)
    sqlite3_finalize(c.st[i]);
}
