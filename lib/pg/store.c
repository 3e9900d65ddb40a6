/*
 * store.c -- the PostgreSQL backend (libpq).
 *
 * Many processes, on many machines, may share one store. Every outcome of
 * the decision table (docs/design.md) is one statement or one short READ
 * COMMITTED transaction that touches one row, so callers never see
 * serialization failures to retry and never take a table lock.
 *
 * A claim (idem_claim) first tries to insert its record:
 *
 *   INSERT ... ON CONFLICT DO NOTHING RETURNING ...;   -- commits by itself
 *
 * On a new key that is the whole claim. Otherwise a plain SELECT answers the
 * outcomes that write nothing (replay, conflict, in flight, unknown; exact
 * on any committed snapshot), and the rest lock the row and write:
 *
 *   BEGIN ISOLATION LEVEL READ COMMITTED;
 *   SELECT ... FOR UPDATE;                             -- the newest version
 *   UPDATE ...;                                        -- takeover/replace
 *   COMMIT;
 *
 * A local action (idem_execute_local) writes its record once, completed,
 * in the action's own transaction, three round trips in all:
 *
 *   BEGIN; SELECT pg_advisory_xact_lock(key); SELECT ... (the record)
 *   the caller's own statements
 *   INSERT ... (completed, no ON CONFLICT); COMMIT
 *
 * Local actions on one key wait for each other on the advisory lock, so a
 * second one reads the first one's record and does not run its action. A
 * claim does not take that lock: if one writes the key while an action
 * runs, the final INSERT fails on the primary key (after waiting for that
 * claim's transaction), the COMMIT sent with it is skipped, the action is
 * rolled back, and the claim's record is the answer; only when that record
 * still needs a write (its lease ran out meanwhile) does the action run a
 * second time, the slow way. An existing record that needs a write (a
 * lease to take over, an expired record to replace) goes the claim's
 * locked way, still under the advisory lock, and the action completes the
 * claimed row.
 *
 * Completed records never change until their retention ends, so replays
 * and conflicts are answered from an in-process cache (cache.h); the expiry
 * read on the server's clock becomes a deadline on this machine's
 * monotonic clock that is never later than the server's.
 *
 * Time comes from the server (clock_timestamp()), never from this machine,
 * so that processes on machines whose clocks disagree still agree on when a
 * lease or a retention period ends.
 *
 * The caller's own SQL (execute_local) runs on the same connection and must
 * see its usual search_path, so idem never changes it: its tables are named
 * with the schema ("idem" unless the URL says idem_schema=NAME) in the text
 * of each prepared statement. Every statement is prepared once per session,
 * BEGIN and COMMIT too, and the statements of one round trip are sent
 * together in libpq's pipeline mode.
 *
 * Cost. On a new key a local action is six statements in three round trips
 * (BEGIN, lock, read | the caller's | insert, COMMIT) against one for a bare
 * one-row insert; pgbench running those same statements the same way gets
 * half of its one-row insert rate on this project's test machines, and idem
 * gets what pgbench gets (docs/bench.md).
 *
 * This file holds the method table, open and close, and the claims,
 * completions and local actions; pg.h says where the rest of the
 * backend is.
 */

#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Retries of the insert-or-lock step when the row vanishes in between. */
#define CLAIM_TRIES 8

/* The server's clock in Unix milliseconds. */
#define NOW_MS "(floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"

/*
 * Every read that answers from rows also reads the schema version, in the
 * same statement: a store that a newer idem migrated is refused
 * (IDEM_ESCHEMA) instead of having its rows read in a layout this idem
 * does not know. No round trip more.
 */
#define VERSION_SQL                                                            \
  "(SELECT value::integer FROM {S}.idem_meta WHERE name = 'schema_version')"

/* The columns of a record: rec is the recovered mark, or "0" on a store
 * that has none yet (see sql_text_v2); then the schema version. */
#define RECORD_COLUMNS_OF(rec)                                                 \
  "r.tenant, r.operation, r.key, r.fingerprint, r.state, r.attempt, "          \
  "r.created_ms, r.updated_ms, r.lease_expires_ms, r.expires_ms, r.request, "  \
  "r.status, r.meta, r.body, r.checksum, " rec ", " VERSION_SQL
#define RECORD_COLUMNS RECORD_COLUMNS_OF("r.recovered::integer")

#define PK "tenant = $1::text AND operation = $2::text AND key = $3::text"

/* Expired by retention: completed records only. A record in progress or
 * marked unknown may describe an action that happened; it stays. */
#define EXPIRED_SQL "(r.state = 2 AND r.expires_ms <= n.now_ms)"
/* Past its retention but kept, waiting for a holder or an operator. */
#define OVERDUE_SQL "(r.state <> 2 AND r.expires_ms <= n.now_ms)"

/* The response columns are read only when the fingerprint matches: a
 * conflicting claim has no use for a stored body of up to 16 MiB. Then
 * the server's time (9), the recovered mark rec (10), the version (11). */
#define SELECT_ROW_OF(rec)                                                     \
  "SELECT fingerprint, state, attempt, lease_expires_ms, expires_ms, "         \
  "status, CASE WHEN fingerprint = $4::text THEN meta END, CASE WHEN "         \
  "fingerprint = $4::text THEN body END, checksum, " NOW_MS ", " rec           \
  ", " VERSION_SQL " FROM {S}.idem_records WHERE " PK
#define SELECT_ROW SELECT_ROW_OF("recovered::integer")

#define NOW_ROW "(SELECT " NOW_MS " AS now_ms) n"

/*
 * The statements that name the recovered mark, with set the assignment
 * that keeps it (or "" on a store that has none yet). A completion is
 * marked when its holder took the key over: its attempt is then above 1
 * (attempts grow by takeovers only; a new record, and one that replaces an
 * expired record, start at 1). An operator's resolution is marked by the
 * same rule: a record of more than one attempt may have acted more than
 * once.
 */
#define REPLACE_OF(set)                                                        \
  "UPDATE {S}.idem_records SET fingerprint = $4::text, request = "             \
  "$5::bytea, state = 1, owner = $6::text, attempt = 1, created_ms = "         \
  "n.now_ms, updated_ms = n.now_ms, lease_expires_ms = n.now_ms + "            \
  "$7::bigint, expires_ms = n.now_ms + $8::bigint, status = NULL, meta "       \
  "= NULL, body = NULL, " set "checksum = NULL FROM " NOW_ROW " WHERE " PK     \
  " RETURNING lease_expires_ms"
#define COMPLETE_OF(set)                                                       \
  "UPDATE {S}.idem_records SET state = 2, owner = NULL, "                      \
  "lease_expires_ms = 0, updated_ms = n.now_ms, expires_ms = n.now_ms + "      \
  "$5::bigint, status = $6::integer, meta = $7::bytea, body = "                \
  "$8::bytea, " set "checksum = $9::text FROM " NOW_ROW " WHERE " PK           \
  " AND owner = $4::text AND state = 1"
#define COMPLETE_LOCAL_OF(set)                                                 \
  "WITH u AS (UPDATE {S}.idem_records SET state = 2, owner = NULL, "           \
  "lease_expires_ms = 0, status = $5::integer, meta = $6::bytea, body "        \
  "= $7::bytea, " set "checksum = $8::text WHERE " PK                          \
  " AND owner = $4::text AND state = 1 RETURNING 1) SELECT 1 / (SELECT "       \
  "count(*)::integer FROM u)"
#define RESOLVE_DONE_OF(set)                                                   \
  "UPDATE {S}.idem_records SET state = 2, owner = NULL, "                      \
  "lease_expires_ms = 0, updated_ms = n.now_ms, expires_ms = "                 \
  "GREATEST(expires_ms, n.now_ms + $4::bigint), status = $5::integer, "        \
  "meta = $6::bytea, body = $7::bytea, " set                                   \
  "checksum = $8::text FROM " NOW_ROW " WHERE " PK " AND state <> 2"
#define GET_OF(cols)                                                           \
  "SELECT " cols " FROM {S}.idem_records r CROSS JOIN " NOW_ROW " WHERE r." PK \
  " AND NOT " EXPIRED_SQL
/* Keyset pagination, so that no connection is held while the caller's
 * function runs (it may call back into the store) and memory stays
 * bounded. Text is ordered by bytes (COLLATE "C"), as SQLite does. */
#define LIST_OF(cols)                                                          \
  "SELECT " cols " FROM {S}.idem_records r CROSS JOIN " NOW_ROW                \
  " WHERE ($1::text IS NULL OR r.tenant = $1::text) AND ($2::text "            \
  "IS NULL OR r.operation = $2::text) AND ($3::integer = 0 OR r.state = "      \
  "$3::integer) AND ($4::boolean OR NOT " EXPIRED_SQL ") AND "                 \
  "(NOT $11::boolean OR " OVERDUE_SQL ") AND ($5::boolean OR "                 \
  "(r.created_ms, r.tenant COLLATE \"C\", r.operation COLLATE \"C\", "         \
  "r.key COLLATE \"C\") > ($6::bigint, $7::text, $8::text, $9::text)) "        \
  "ORDER BY r.created_ms, r.tenant COLLATE \"C\", r.operation COLLATE "        \
  "\"C\", r.key COLLATE \"C\" LIMIT $10::bigint"
#define RECOVERED_AFTER_TAKEOVER "recovered = attempt > 1, "

/* ---- SQL text ------------------------------------------------------------ */

/* "{S}" stands for the quoted schema name; see idem__pg_build_sql(). */
static const char *const sql_text[ST_COUNT] = {
    /* READ COMMITTED whatever the session's default: each statement must
     * see rows committed by concurrent claimers, and no serialization
     * failure may reach the caller. Prepared like the rest, so that a
     * round trip that begins or commits parses nothing. */
    [ST_BEGIN] = "BEGIN ISOLATION LEVEL READ COMMITTED",
    [ST_COMMIT] = "COMMIT",
    [ST_PEEK] = SELECT_ROW,
    [ST_LOCK] = SELECT_ROW " FOR UPDATE",
    [ST_INSERT] =
        "INSERT INTO {S}.idem_records (tenant, operation, key, fingerprint, "
        "request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms) SELECT $1::text, $2::text, $3::text, "
        "$4::text, $5::bytea, 1, $6::text, 1, n.now_ms, n.now_ms, n.now_ms + "
        "$7::bigint, n.now_ms + $8::bigint FROM " NOW_ROW
        " ON CONFLICT (tenant, operation, key) DO NOTHING RETURNING "
        "lease_expires_ms",
    /* A local action's record, written once, completed, after the action
     * and in its transaction. No ON CONFLICT: a record that another caller
     * wrote meanwhile must fail the statement (unique_violation, after
     * waiting for that caller's transaction): the COMMIT sent with it is
     * then skipped, the transaction rolled back, and this action not kept. */
    [ST_INSERT_DONE] =
        "INSERT INTO {S}.idem_records (tenant, operation, key, fingerprint, "
        "request, state, attempt, created_ms, updated_ms, lease_expires_ms, "
        "expires_ms, status, meta, body, checksum) SELECT $1::text, $2::text, "
        "$3::text, $4::text, $5::bytea, 2, 1, n.now_ms, n.now_ms, 0, n.now_ms "
        "+ $6::bigint, $7::integer, $8::bytea, $9::bytea, $10::text "
        "FROM " NOW_ROW,
    /* Local actions on one key wait for each other here, so that a second
     * one reads the first one's record instead of running its action too.
     * Held until the transaction ends. */
    [ST_KEY_LOCK] = "SELECT pg_advisory_xact_lock($1::bigint)",
    /* For an action that ended idem's transaction itself: whether its
     * mutation committed is unknown, and the key must say so (a holder's
     * row too, the one this action took over or its own claim committed by
     * the action; a completed record is left as it is). */
    [ST_INSERT_UNKNOWN] =
        "INSERT INTO {S}.idem_records (tenant, operation, key, fingerprint, "
        "request, state, attempt, created_ms, updated_ms, lease_expires_ms, "
        "expires_ms) SELECT $1::text, $2::text, $3::text, $4::text, "
        "$5::bytea, 3, 1, n.now_ms, n.now_ms, 0, n.now_ms + $6::bigint "
        "FROM " NOW_ROW
        " ON CONFLICT (tenant, operation, key) DO UPDATE SET state = 3, "
        "owner = NULL, lease_expires_ms = 0, updated_ms = EXCLUDED.updated_ms "
        "WHERE idem_records.state = 1",
    [ST_REPLACE] = REPLACE_OF("recovered = false, "),
    [ST_TAKEOVER] = "UPDATE {S}.idem_records SET state = 1, owner = $4::text, "
                    "attempt = attempt + 1, updated_ms = n.now_ms, "
                    "lease_expires_ms = n.now_ms + $5::bigint, expires_ms = "
                    "GREATEST(expires_ms, n.now_ms + $6::bigint) FROM " NOW_ROW
                    " WHERE " PK " RETURNING attempt, lease_expires_ms",
    [ST_COMPLETE] = COMPLETE_OF(RECOVERED_AFTER_TAKEOVER),
    /* The same inside a local action's transaction, sent together with its
     * COMMIT: a row that is not there (it cannot be, under the row lock)
     * must fail the statement, so that the COMMIT becomes a rollback and
     * the caller's mutation is never kept without its record. */
    /* It leaves expires_ms and updated_ms as the insert set them (in the
     * same transaction, so nobody saw the moment between), so that no
     * indexed column changes and PostgreSQL can update the row in place
     * (HOT) without new index entries. */
    [ST_COMPLETE_LOCAL] = COMPLETE_LOCAL_OF(RECOVERED_AFTER_TAKEOVER),
    [ST_RELEASE] = "DELETE FROM {S}.idem_records WHERE " PK
                   " AND owner = $4::text AND state = 1",
    [ST_UNKNOWN] = "UPDATE {S}.idem_records SET state = 3, owner = NULL, "
                   "lease_expires_ms = 0, updated_ms = " NOW_MS " WHERE " PK
                   " AND owner = $4::text AND state = 1",
    [ST_RENEW] = "UPDATE {S}.idem_records SET lease_expires_ms = n.now_ms + "
                 "$5::bigint, updated_ms = n.now_ms FROM " NOW_ROW " WHERE " PK
                 " AND owner = $4::text AND state = 1 RETURNING "
                 "lease_expires_ms",
    [ST_GET] = GET_OF(RECORD_COLUMNS),
    /* After a fenced write that changed nothing: what the row says now, to
     * tell whether an earlier send of that write (whose answer was lost)
     * had committed. FOR SHARE waits for a transaction of the old session
     * that may still hold the row. */
    [ST_HOLDER] = "SELECT state, checksum, fingerprint, attempt FROM "
                  "{S}.idem_records WHERE " PK " FOR SHARE",
    [ST_LIST] = LIST_OF(RECORD_COLUMNS),
    [ST_PRUNE] =
        "DELETE FROM {S}.idem_records r USING " NOW_ROW " WHERE " EXPIRED_SQL,
    /* Rows a claimer holds are skipped rather than waited for. */
    [ST_PRUNE_SOME] =
        "DELETE FROM {S}.idem_records t USING (SELECT r.tenant, r.operation, "
        "r.key FROM {S}.idem_records r CROSS JOIN " NOW_ROW
        " WHERE " EXPIRED_SQL " LIMIT 256 FOR UPDATE OF r SKIP LOCKED) d "
        "WHERE t.tenant = d.tenant AND t.operation = d.operation AND t.key = "
        "d.key",
    [ST_RESOLVE_DONE] = RESOLVE_DONE_OF(RECOVERED_AFTER_TAKEOVER),
    [ST_RESOLVE_DELETE] =
        "DELETE FROM {S}.idem_records WHERE " PK " AND state <> 2",
    [ST_DELETE] = "DELETE FROM {S}.idem_records WHERE " PK,
};

/*
 * The same statements on a store of schema version 1 or 2, which has no
 * recovered mark yet: a role that may not alter the table (or a table too
 * busy to) left it there on open (admin.c). Its completions are kept
 * unmarked; the holder is still told RECOVER.
 */
static const char *const sql_text_v2[ST_COUNT] = {
    [ST_PEEK] = SELECT_ROW_OF("0"),
    [ST_LOCK] = SELECT_ROW_OF("0") " FOR UPDATE",
    [ST_REPLACE] = REPLACE_OF(""),
    [ST_COMPLETE] = COMPLETE_OF(""),
    [ST_COMPLETE_LOCAL] = COMPLETE_LOCAL_OF(""),
    [ST_GET] = GET_OF(RECORD_COLUMNS_OF("0")),
    [ST_LIST] = LIST_OF(RECORD_COLUMNS_OF("0")),
    [ST_RESOLVE_DONE] = RESOLVE_DONE_OF(""),
};

/* ---- parameters ---------------------------------------------------------- */

/* The advisory lock key of a record: FNV-1a over the schema and the id. Two
 * ids with one key only wait for each other needlessly. */
static void p_lock_key(params *p, const char *schema, const idem_id *id) {
  const char *parts[4] = {schema, id->tenant ? id->tenant : "", id->operation,
                          id->key};
  uint64_t h = 14695981039346656037ULL;
  for (int i = 0; i < 4; i++) {
    for (const unsigned char *q = (const unsigned char *)parts[i]; *q; q++)
      h = (h ^ *q) * 1099511628211ULL;
    h = (h ^ 0xff) * 1099511628211ULL; /* a separator no UTF-8 text has */
  }
  idem__pg_p_i64(p, (int64_t)h);
}

/* ---- claims -------------------------------------------------------------- */

/* This machine's monotonic clock in milliseconds: the cache's clock. A
 * record's expiry read from the server at server time N becomes a local
 * deadline of (local time when the read was sent) + (expiry - N), which is
 * never later than the server's own. */
static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The local deadline of a record that the server keeps for `left` ms more
 * as of a moment no earlier than `sent`: a tenth of a percent earlier, and
 * 10 ms, for clocks that run at slightly different rates (100 ppm is 9 s
 * a day). A server clock stepped forward is not covered. */
static int64_t cache_deadline(int64_t sent, int64_t left) {
  return sent + left - left / 1000 - 10;
}

/*
 * Runs ST_PEEK or ST_LOCK for op->id and decides the outcome at the server's
 * time; with begin_too, a transaction begins in the same round trip. *found
 * is 0 when there is no row. For REPLAY the stored response is checked
 * against its checksum, copied into the claim and kept in the cache.
 */
static int load_and_decide(pg_store *s, conn *c, idem__op *op, int which,
                           int begin_too, int *found, idem__row *row,
                           idem__action *action) {
  idem_call *cl = op->claim;
  PGresult *res = NULL;
  params p = {0};
  int64_t now = 0, sent;
  params lk = {0};
  step st[3] = {{ST_BEGIN, NULL}, {which, &p}};
  int rc, nst = 2;

  memset(row, 0, sizeof *row);
  *found = 0;
  idem__pg_p_id(&p, op->id);
  idem__pg_p_text(&p, op->fingerprint);
  if (begin_too && which == ST_PEEK) {
    /* A local action's first read waits for the key's advisory lock. */
    p_lock_key(&lk, s->schema, op->id);
    st[1] = (step){ST_KEY_LOCK, &lk};
    st[nst++] = (step){which, &p};
  }
  /* A read that opens the operation is safe to send again on a connection
   * found dead: nothing of the operation has happened yet. */
  for (int tries = 0;; tries++) {
    sent = mono_ms();
    rc = begin_too ? idem__pg_run_steps(s, c, st, nst, nst - 1, "read record",
                                        &res, NULL, op->errmsg)
                   : idem__pg_run_stmt(s, c, which, &p, "read record", &res,
                                       op->errmsg);
    if (tries > 0 || !(begin_too || which == ST_PEEK) ||
        !idem__pg_revived(s, c, &rc, op->errmsg))
      break;
  }
  if (rc != IDEM_OK)
    return op->rc = idem__pg_read_failed(s, c, rc, op->errmsg);
  if (PQntuples(res) > 0 &&
      idem__pg_schema_check(s, (int)idem__pg_col_int(res, 0, 11), op->errmsg) !=
          IDEM_OK) {
    PQclear(res);
    return op->rc = IDEM_ESCHEMA;
  }
  if (PQntuples(res) > 0) {
    size_t n;
    const void *fp = idem__pg_col_ptr(res, 0, 0, &n);
    *found = 1;
    row->exists = 1;
    snprintf(row->fingerprint, sizeof row->fingerprint, "%.*s",
             (int)(n < IDEM_FINGERPRINT_SIZE ? n : IDEM_FINGERPRINT_SIZE - 1),
             fp ? (const char *)fp : "");
    row->state = (int)idem__pg_col_int(res, 0, 1);
    row->attempt = (int)idem__pg_col_int(res, 0, 2);
    row->lease_expires_ms = idem__pg_col_int(res, 0, 3);
    row->expires_ms = idem__pg_col_int(res, 0, 4);
    now = idem__pg_col_int(res, 0, 9);
    row->recovered = (int)idem__pg_col_int(res, 0, 10);
  }
  /* The server's clock decides both. */
  *action = idem__decide_op(op, row, now, now);
  if (cl->outcome == IDEM_REPLAY) {
    int status = (int)idem__pg_col_int(res, 0, 5);
    size_t meta_len, body_len, sum_len;
    const void *meta = idem__pg_col_ptr(res, 0, 6, &meta_len);
    const void *body = idem__pg_col_ptr(res, 0, 7, &body_len);
    const char *sum = idem__pg_col_ptr(res, 0, 8, &sum_len);
    if (idem__claim_replay(op, row->fingerprint, status, meta, meta_len, body,
                           body_len, sum, sum_len, row->recovered) != IDEM_OK) {
      PQclear(res);
      return op->rc;
    }
    if (!c->foreign) /* a transaction's view may not be committed yet */
      idem__cache_put(s->cache, op->id, row->fingerprint,
                      cache_deadline(sent, row->expires_ms - now), row->attempt,
                      row->recovered, status, meta_len ? meta : NULL, meta_len,
                      body, body_len);
  }
  PQclear(res);
  return IDEM_OK;
}

/*
 * After a claim's write whose answer was lost with its connection (its
 * insert, sent again and finding the key taken, or its takeover's COMMIT):
 * whether this claim holds the key (*held). Asked with a renewal of its
 * lease fenced by its token, which waits for any transaction of the old
 * session still holding the row, confirms the holder, and restarts the
 * lease that reconnecting may have used up.
 */
static int still_held(pg_store *s, conn *c, idem__op *op, int *held) {
  PGresult *res = NULL;
  params p = {0};
  int rc;
  *held = 0;
  idem__pg_p_id(&p, op->id);
  idem__pg_p_text(&p, op->claim->token);
  idem__pg_p_i64(&p, idem__pg_period(op->opts.lease_ms));
  if ((rc = idem__pg_run_stmt(s, c, ST_RENEW, &p, "read record", &res,
                              op->errmsg)) != IDEM_OK)
    return op->rc = rc;
  *held = atoi(PQcmdTuples(res)) == 1;
  if (*held && PQntuples(res) > 0)
    op->claim->lease_expires_ms = idem__pg_col_int(res, 0, 0);
  PQclear(res);
  return IDEM_OK;
}

/*
 * After a fenced write that changed no row: whether an earlier send of it
 * had done what the caller asks (*done). That earlier send is one whose
 * answer was lost with its connection: sent again on the re-established
 * connection by run_fenced(), or reported IDEM_EUNAVAILABLE when the
 * server could not be reached again, and then retried by the caller. The
 * row tells. ST_COMPLETE: it is completed with this fingerprint and this
 * response (checksum sum), at this claim's attempt. ST_UNKNOWN: it is marked unknown at this
 * claim's attempt (a newer holder's mark is not this claim's). ST_RELEASE:
 * it is gone. A renewal that changes nothing has lost the lease.
 */
static int wrote_before_loss(pg_store *s, conn *c, idem__op *op, int which,
                             const char *sum, int *done) {
  PGresult *res = NULL;
  params p = {0};
  size_t n = 0, fn = 0;
  const char *v, *fp;
  int rc, state;

  *done = 0;
  if (which != ST_COMPLETE && which != ST_UNKNOWN && which != ST_RELEASE)
    return IDEM_OK;
  idem__pg_p_id(&p, op->id);
  if ((rc = idem__pg_run_stmt(s, c, ST_HOLDER, &p, "read record", &res,
                              op->errmsg)) != IDEM_OK)
    return op->rc = rc;
  if (PQntuples(res) == 0) {
    *done = which == ST_RELEASE;
  } else {
    state = (int)idem__pg_col_int(res, 0, 0);
    v = idem__pg_col_ptr(res, 0, 1, &n);
    fp = idem__pg_col_ptr(res, 0, 2, &fn);
    if (which == ST_UNKNOWN)
      *done = state == IDEM_STATE_UNKNOWN &&
              (int)idem__pg_col_int(res, 0, 3) == op->claim->attempt;
    else if (which == ST_COMPLETE)
      /* At this claim's attempt too: the same bytes completed by a newer
       * holder are that holder's, and this one's write is stale. */
      *done = state == IDEM_STATE_COMPLETED && sum && v && n == strlen(sum) &&
              memcmp(v, sum, n) == 0 && fp && fn == strlen(op->fingerprint) &&
              memcmp(fp, op->fingerprint, fn) == 0 &&
              (int)idem__pg_col_int(res, 0, 3) == op->claim->attempt;
  }
  PQclear(res);
  return IDEM_OK;
}

/* Tries to insert a new record; *inserted says whether it did. With begin
 * set, the transaction starts in the same round trip. */
static int try_insert(pg_store *s, conn *c, idem__op *op, int begin_too,
                      int *inserted) {
  PGresult *res = NULL;
  params p = {0};
  int rc;
  idem__pg_p_id(&p, op->id);
  idem__pg_p_text(&p, op->fingerprint);
  idem__pg_p_bytes(&p, op->opts.request, op->opts.request_len);
  idem__pg_p_text(&p, op->claim->token);
  idem__pg_p_i64(&p, idem__pg_period(op->opts.lease_ms));
  idem__pg_p_i64(&p, idem__pg_period(op->opts.retention_ms));
  if (begin_too) {
    /* Only a local action's insert begins a transaction: it takes its
     * key's advisory lock first, as run_claim()'s first read does. */
    params lk = {0};
    step st[3] = {{ST_BEGIN, NULL}, {ST_KEY_LOCK, &lk}, {ST_INSERT, &p}};
    p_lock_key(&lk, s->schema, op->id);
    rc = idem__pg_run_steps(s, c, st, 3, 2, "write claim", &res, NULL,
                            op->errmsg);
  } else {
    /* On its own (a claim's), or inside a local action's transaction. */
    int own = PQtransactionStatus(c->pg) == PQTRANS_IDLE;
    rc =
        idem__pg_run_stmt(s, c, ST_INSERT, &p, "write claim", &res, op->errmsg);
    if (own && idem__pg_revived(s, c, &rc, op->errmsg)) {
      /* It commits by itself and may have done so before the connection
       * died: send it again, and if the key is taken, see whether it is
       * this claim that took it. (A transaction that died is gone: its
       * statements are never sent again outside it.) */
      rc = idem__pg_run_stmt(s, c, ST_INSERT, &p, "write claim", &res,
                             op->errmsg);
      if (rc == IDEM_OK && PQntuples(res) == 0) {
        PQclear(res);
        return still_held(s, c, op, inserted);
      }
    }
  }
  if (rc != IDEM_OK)
    return op->rc = rc;
  *inserted = PQntuples(res) > 0;
  if (*inserted)
    op->claim->lease_expires_ms = idem__pg_col_int(res, 0, 0);
  PQclear(res);
  return IDEM_OK;
}

/* The write after a decision on a locked row: a retention-expired record is
 * replaced by a new one, an expired lease taken over. */
static int write_claim(pg_store *s, conn *c, idem__op *op,
                       idem__action action) {
  idem_call *cl = op->claim;
  PGresult *res = NULL;
  params p = {0};
  int rc;
  idem__pg_p_id(&p, op->id);
  if (action == IDEM__ACT_INSERT) {
    idem__pg_p_text(&p, op->fingerprint);
    idem__pg_p_bytes(&p, op->opts.request, op->opts.request_len);
    idem__pg_p_text(&p, cl->token);
    idem__pg_p_i64(&p, idem__pg_period(op->opts.lease_ms));
    idem__pg_p_i64(&p, idem__pg_period(op->opts.retention_ms));
    rc = idem__pg_run_stmt(s, c, ST_REPLACE, &p, "write claim", &res,
                           op->errmsg);
    if (rc == IDEM_OK) {
      cl->attempt = 1;
      if (PQntuples(res) > 0)
        cl->lease_expires_ms = idem__pg_col_int(res, 0, 0);
    }
  } else {
    idem__pg_p_text(&p, cl->token);
    idem__pg_p_i64(&p, idem__pg_period(op->opts.lease_ms));
    idem__pg_p_i64(&p, idem__pg_period(op->opts.retention_ms));
    rc = idem__pg_run_stmt(s, c, ST_TAKEOVER, &p, "write claim", &res,
                           op->errmsg);
    if (rc == IDEM_OK) {
      cl->attempt = PQntuples(res) > 0 ? (int)idem__pg_col_int(res, 0, 0)
                                       : cl->attempt + 1;
      if (PQntuples(res) > 0)
        cl->lease_expires_ms = idem__pg_col_int(res, 0, 1);
    }
  }
  if (rc != IDEM_OK)
    return op->rc = rc;
  PQclear(res);
  return IDEM_OK;
}

/*
 * The parameters of a completion: the id, then (which) ST_COMPLETE: owner
 * token, retention; ST_COMPLETE_LOCAL: owner token; ST_INSERT_DONE:
 * fingerprint, request, retention; then status, meta, body and the
 * checksum, which is written into sum (p points into it).
 */
static int response_params(idem__op *op, const idem_response *r, int which,
                           params *p, char sum[IDEM_FINGERPRINT_SIZE]) {
  if (idem__response_checksum(op->fingerprint, r->status, r->meta, r->meta_len,
                              r->body, r->body_len, sum) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "checksum: out of memory");
  idem__pg_p_id(p, op->id);
  if (which == ST_INSERT_DONE) {
    idem__pg_p_text(p, op->fingerprint);
    idem__pg_p_bytes(p, op->opts.request, op->opts.request_len);
  } else {
    idem__pg_p_text(p, op->claim->token);
  }
  if (which != ST_COMPLETE_LOCAL)
    idem__pg_p_i64(p, idem__pg_period(op->opts.retention_ms));
  idem__pg_p_i64(p, r->status);
  idem__pg_p_bytes(p, r->meta, r->meta_len);
  idem__pg_p_bytes(p, r->body_len ? r->body : "", r->body_len);
  idem__pg_p_text(p, sum);
  return IDEM_OK;
}

/* Runs a statement fenced by the holder's token, on its own (an implicit
 * transaction): no row changed means the holder lost the record, unless
 * the row shows that an earlier send of the same write had committed. */
static int run_fenced(pg_store *s, conn *c, idem__op *op, int which,
                      const params *p, const char *what, const char *lost,
                      const char *sum) {
  PGresult *res = NULL;
  int own = PQtransactionStatus(c->pg) == PQTRANS_IDLE;
  int changed, done = 0,
               rc = idem__pg_run_stmt(s, c, which, p, what, &res, op->errmsg);
  if (own && idem__pg_revived(s, c, &rc, op->errmsg)) {
    /* It may have committed before the connection died. Sent again, it
     * changes nothing if so (the row is no longer held under the token),
     * and the row then tells. */
    rc = idem__pg_run_stmt(s, c, which, p, what, &res, op->errmsg);
  }
  if (rc != IDEM_OK)
    return op->rc = rc;
  changed = atoi(PQcmdTuples(res));
  if (which == ST_RENEW && changed > 0 && PQntuples(res) > 0)
    op->claim->lease_expires_ms = idem__pg_col_int(res, 0, 0);
  PQclear(res);
  /* Nothing changed: either the holder lost the record, or an earlier
   * send of this write committed (its answer lost, here or in a call
   * that the caller is now retrying). */
  if (changed == 0 && wrote_before_loss(s, c, op, which, sum, &done) != IDEM_OK)
    return op->rc;
  if (changed == 0 && !done)
    return idem__op_fail(op, IDEM_ESTALE,
                         "key '%s': the lease was taken over by a newer "
                         "attempt or the record was removed%s",
                         op->id->key, lost);
  return IDEM_OK;
}

static int write_complete(pg_store *s, conn *c, idem__op *op,
                          const idem_response *r) {
  char sum[IDEM_FINGERPRINT_SIZE];
  params p = {0};
  if (response_params(op, r, ST_COMPLETE, &p, sum) != IDEM_OK)
    return op->rc;
  return run_fenced(s, c, op, ST_COMPLETE, &p, "complete",
                    "; this response was not stored", sum);
}

/* Release, mark unknown and renew. */
static int write_fenced(pg_store *s, conn *c, idem__op *op, int which) {
  params p = {0};
  idem__pg_p_id(&p, op->id);
  idem__pg_p_text(&p, op->claim->token);
  if (which == ST_RENEW)
    idem__pg_p_i64(&p, idem__pg_period(op->lease_ms));
  return run_fenced(s, c, op, which, &p, "update", "", NULL);
}

/* Writes the record of a local action, completed (which: ST_COMPLETE_LOCAL
 * on its claimed row, or ST_INSERT_DONE as a new row), and commits its
 * transaction, in one round trip. */
static int complete_and_commit(pg_store *s, conn *c, idem__op *op, int which,
                               const idem_response *r) {
  char sum[IDEM_FINGERPRINT_SIZE], tag[16];
  PGresult *res = NULL;
  params p = {0};
  int rc;
  step st[2] = {{which, &p}, {ST_COMMIT, NULL}};
  if (response_params(op, r, which, &p, sum) != IDEM_OK)
    return op->rc;
  rc = idem__pg_run_steps(s, c, st, 2, 0, "complete", &res, tag, op->errmsg);
  PQclear(res);
  if (rc != IDEM_OK)
    return op->rc = rc;
  if (strcmp(tag, "COMMIT") != 0)
    return idem__op_fail(op, IDEM_ESTORE,
                         "postgresql: commit failed, nothing was stored: the "
                         "transaction was rolled back");
  return IDEM_OK;
}

/* Runs the caller's mutation inside the open transaction and checks what
 * it left: a transaction still open and usable, and a response idem can
 * keep. */
static int call_action(conn *c, idem__op *op, idem_response *r) {
  PGTransactionStatusType ts;
  char text[ERR_SIZE];
  int fn_rc;
  memset(r, 0, sizeof *r);
  fn_rc = op->fn(c->pg, op->ctx, r);
  if (c->foreign && fn_rc == IDEM_LOCAL_CLOSED) {
    c->gone = 1; /* freed, maybe: not touched again */
    return idem__op_fail(op, IDEM_ESTATE,
                         "key '%s': the action closed the caller's "
                         "connection; nothing was stored (its transaction "
                         "ended with it)",
                         op->id->key);
  }
  ts = PQtransactionStatus(c->pg);
  /* A lost connection is checked first: an action that fails because its
   * statement could not reach the server was not rejected, and a retry is
   * safe, since nothing of it was committed. */
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    idem__pg_oneline(text, sizeof text, PQerrorMessage(c->pg));
    return idem__op_fail(op, IDEM_EUNAVAILABLE,
                         "postgresql: the connection was lost while the "
                         "action ran; nothing was stored: %s",
                         text);
  }
  /* Checked before the action's answer: whatever it returned, what it
   * wrote before ending the transaction may be kept. */
  if (ts == PQTRANS_IDLE)
    return idem__op_fail(op, IDEM_ESTORE,
                         "key '%s': the action ended the store's transaction "
                         "itself; local actions must not begin, commit or "
                         "roll back transactions",
                         op->id->key);
  if (fn_rc != 0)
    return idem__op_fail(op, IDEM_EREJECTED,
                         "key '%s': the action returned %d; it was rolled "
                         "back and no record was kept",
                         op->id->key, fn_rc);
  if (ts == PQTRANS_INERROR)
    return idem__op_fail(op, IDEM_ESTORE,
                         "key '%s': the action returned 0 but a statement "
                         "in it failed; it was rolled back and no record was "
                         "kept",
                         op->id->key);
  if (ts == PQTRANS_ACTIVE)
    return idem__op_fail(op, IDEM_ESTORE,
                         "key '%s': the action left a query running; it was "
                         "rolled back and no record was kept",
                         op->id->key);
  if (ts != PQTRANS_INTRANS)
    return idem__op_fail(op, IDEM_ESTORE,
                         "key '%s': the action ended the store's transaction "
                         "itself; local actions must not begin, commit or "
                         "roll back transactions",
                         op->id->key);
  {
    char why[128];
    int rc = idem__response_problem(r, "action's response", why, sizeof why);
    if (rc != IDEM_OK)
      return idem__op_fail(op, rc, "%s", why);
  }
  return IDEM_OK;
}

/*
 * An action that ended idem's transaction itself (against the contract of
 * idem_local_fn) may have committed its mutation, and no record exists to
 * say so: the key is marked unknown, as a holder that cannot tell whether
 * it acted marks it, so that retries do not act again until an operator
 * resolves it. Returns op->rc.
 */
static int mark_self_ended(pg_store *s, conn *c, idem__op *op) {
  PGresult *res = NULL;
  params p = {0};
  char why[sizeof op->errmsg];
  idem__pg_p_id(&p, op->id);
  idem__pg_p_text(&p, op->fingerprint);
  idem__pg_p_bytes(&p, op->opts.request, op->opts.request_len);
  idem__pg_p_i64(&p, idem__pg_period(op->opts.retention_ms));
  memcpy(why, op->errmsg, sizeof why);
  if (idem__pg_run_stmt(s, c, ST_INSERT_UNKNOWN, &p, "mark unknown", &res,
                        op->errmsg) != IDEM_OK)
    return idem__op_fail(op, IDEM_ESTORE,
                         "%s; whether it committed is unknown, and marking "
                         "the key unknown failed: %s",
                         why, op->errmsg);
  PQclear(res);
  return idem__op_fail(op, IDEM_ESTORE,
                       "%s; whether it committed is unknown, so the key is "
                       "marked unknown (see idem keys resolve)",
                       why);
}

/* Runs the caller's mutation inside the claim's transaction and completes
 * the claimed record in the same transaction. */
static int run_local(pg_store *s, conn *c, idem__op *op) {
  idem_response r;
  if (call_action(c, op, &r) != IDEM_OK) {
    /* Its claim on the key may have been committed with the action's
     * writes: the key must not be left for a takeover to act again. */
    if (op->rc != IDEM_EUNAVAILABLE &&
        PQtransactionStatus(c->pg) == PQTRANS_IDLE)
      mark_self_ended(s, c, op);
    return op->rc;
  }
  if (complete_and_commit(s, c, op, ST_COMPLETE_LOCAL, &r) != IDEM_OK)
    return op->rc;
  if (idem__claim_set_response(op->claim, r.status, r.meta, r.meta_len, r.body,
                               r.body_len) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "out of memory");
  return IDEM_OK;
}

/* After this caller's action was rolled back: reads the key again, and
 * when a record decides the outcome without a write (another caller
 * completed the key meanwhile, or holds it), that outcome is the answer:
 * returns 1 with op->rc cleared. A damaged record is the answer too:
 * returns 1 with IDEM_ECORRUPT. Else returns 0 with op as it was. */
static int answered_by_record(pg_store *s, conn *c, idem__op *op) {
  int rc = op->rc, found = 0;
  char msg[sizeof op->errmsg];
  idem__row row;
  idem__action action;
  memcpy(msg, op->errmsg, sizeof msg);
  op->rc = IDEM_OK;
  if (load_and_decide(s, c, op, ST_PEEK, 0, &found, &row, &action) == IDEM_OK &&
      found && action == IDEM__ACT_NONE) {
    op->errmsg[0] = '\0';
    return 1;
  }
  if (op->rc == IDEM_ECORRUPT)
    return 1; /* the record is the answer, and it is damaged */
  op->rc = rc;
  memcpy(op->errmsg, msg, sizeof msg);
  return 0;
}

/*
 * A local action on a key with no record (the read that said so began its
 * transaction and holds the key's advisory lock): the action runs at once
 * and its record is inserted once, completed, and committed with it. An
 * idem_claim() that wrote the key meanwhile (claims do not take the lock)
 * makes that insert fail; this action is then rolled back and the claim's
 * record is the answer. Returns 1 when the operation is settled (op->rc
 * says how), 0 when it is rolled back and the claim must be taken the slow
 * way (insert, lock, decide), where the action may run again.
 */
static int run_local_first(pg_store *s, conn *c, idem__op *op) {
  idem_call *cl = op->claim;
  idem_response r;
  int64_t sent;
  cl->outcome = IDEM_PROCEED;
  cl->attempt = 1;
  cl->retry_after_ms = 0;
  cl->recovered = 0;
  if (call_action(c, op, &r) != IDEM_OK) {
    if (op->rc == IDEM_EUNAVAILABLE)
      return 1;
    if (PQtransactionStatus(c->pg) == PQTRANS_IDLE) {
      mark_self_ended(s, c, op);
      return 1;
    }
    /* The action may have failed on the racing claimer's rows. */
    idem__pg_rollback(c);
    answered_by_record(s, c, op);
    return 1;
  }
  sent = mono_ms();
  c->sqlstate[0] = '\0';
  if (complete_and_commit(s, c, op, ST_INSERT_DONE, &r) != IDEM_OK) {
    /* Only the record's own insert (the first of the two statements) says
     * that someone else wrote the key; the caller's deferred constraints
     * fail at COMMIT. */
    if (c->failed_step != 0 || strcmp(c->sqlstate, "23505") != 0 ||
        PQstatus(c->pg) == CONNECTION_BAD)
      return 1;
    idem__pg_rollback(c);
    if (answered_by_record(s, c, op))
      return 1;
    op->rc = IDEM_OK;
    op->errmsg[0] = '\0';
    return 0;
  }
  if (!r.meta_len)
    r.meta = NULL; /* as a read from the store gives it */
  if (idem__claim_set_response(cl, r.status, r.meta, r.meta_len, r.body,
                               r.body_len) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "out of memory"), 1;
  idem__cache_put(s->cache, op->id, op->fingerprint,
                  cache_deadline(sent, idem__pg_period(op->opts.retention_ms)),
                  1, 0, r.status, r.meta, r.meta_len, r.body, r.body_len);
  return 1;
}

/* Deletes some retention-expired records now and then; failures only mean
 * that the next prune does it. */
static void prune_some(pg_store *s, conn *c) {
  int64_t now = idem__now_ms(); /* a rate, not a lease: the local clock */
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int due;
  pthread_mutex_lock(&s->mu);
  due = now - s->last_prune_ms >= IDEM__PRUNE_EVERY_MS;
  if (due)
    s->last_prune_ms = now;
  pthread_mutex_unlock(&s->mu);
  if (!due || PQtransactionStatus(c->pg) != PQTRANS_IDLE)
    return;
  if (idem__pg_run_stmt(s, c, ST_PRUNE_SOME, &p, "prune", &res, err) == IDEM_OK)
    PQclear(res);
}

/* A fresh owner token for a claim about to be written. */
static int new_token(idem__op *op) {
  idem_call *cl = op->claim;
  free(cl->resp_buf);
  cl->resp_buf = NULL;
  cl->has_response = 0;
  if (idem__new_token(cl->token) != IDEM_OK)
    return idem__op_fail(op, IDEM_EIO, "%s", idem_errmsg());
  return IDEM_OK;
}

/*
 * A claim or a local action. A claim first tries to insert its record: on a
 * new key (the common case) that one statement is the whole claim, committed
 * by itself. A local action first reads the key in its own transaction,
 * under the key's advisory lock (one round trip with BEGIN), and on a new
 * key runs at once (run_local_first). Either way, an existing record whose
 * outcome writes nothing (replay, conflict, in flight) is answered from
 * that read; any other is locked and decided on, and the write follows in
 * the same transaction.
 */
static void run_claim(pg_store *s, conn *c, idem__op *op) {
  idem_call *cl = op->claim;
  int local = op->kind == IDEM__OP_LOCAL;
  int found = 0, inserted = 0, open = local, tries = 0;
  idem__row row;
  idem__action action;

  if (!local) {
    if (new_token(op) != IDEM_OK ||
        try_insert(s, c, op, 0, &inserted) != IDEM_OK)
      goto fail;
    if (inserted)
      goto claimed;
    tries = 1;
  }
  if (load_and_decide(s, c, op, ST_PEEK, local, &found, &row, &action) !=
      IDEM_OK)
    goto fail;
  if (action == IDEM__ACT_NONE) {
    if (open)
      idem__pg_rollback(c);
    return;
  }
  if (local && !found) {
    if (run_local_first(s, c, op))
      goto done;
    open = 0; /* rolled back: another caller wrote the key meanwhile */
  }
  if (local && new_token(op) != IDEM_OK)
    goto fail;
  /* Insert, or else lock the existing row (a claim that found one has
   * tried its insert already). A row deleted between the two (released,
   * resolved as failed, pruned) makes the insert worth another try. A
   * claim's insert commits by itself; a local action's stays in its
   * transaction. */
  if (found)
    goto lock;
  for (;; tries++) {
    if (try_insert(s, c, op, local && !open, &inserted) != IDEM_OK)
      goto fail;
    open = local;
    if (inserted)
      break;
  lock:
    if (load_and_decide(s, c, op, ST_LOCK, !open, &found, &row, &action) !=
        IDEM_OK)
      goto fail;
    open = 1;
    if (found)
      break;
    if (!local) {
      idem__pg_rollback(c);
      open = 0;
    }
    if (tries + 1 >= CLAIM_TRIES) {
      idem__op_fail(op, IDEM_EBUSY,
                    "key '%s': the record kept changing during the claim; "
                    "try again",
                    op->id->key);
      goto fail;
    }
  }
  if (inserted) {
    action = IDEM__ACT_INSERT;
    if (!local)
      goto claimed;
    cl->outcome = IDEM_PROCEED;
    cl->attempt = 1;
    cl->retry_after_ms = 0;
    cl->recovered = 0;
  } else if (action == IDEM__ACT_NONE) {
    /* Decided on the locked row: nothing to write. */
    idem__pg_rollback(c);
    return;
  } else if (write_claim(s, c, op, action) != IDEM_OK) {
    goto fail;
  }
  /* A local action completes and commits in its own last round trip. */
  if (local) {
    if (run_local(s, c, op) != IDEM_OK)
      goto fail;
    goto done;
  }
  if ((op->rc = idem__pg_commit(c, op->errmsg)) != IDEM_OK) {
    /* The answer to COMMIT was lost with the connection: the row tells
     * whether this claim holds the key. */
    int held = 0;
    if (!idem__pg_revived(s, c, &op->rc, op->errmsg) ||
        still_held(s, c, op, &held) != IDEM_OK)
      goto fail;
    if (!held) {
      idem__op_fail(op, IDEM_EUNAVAILABLE,
                    "postgresql: the connection was lost during commit, "
                    "before the claim was stored; try again");
      goto fail;
    }
    op->rc = IDEM_OK;
  }
  cl->held = 1;
  goto done;
claimed:
  cl->outcome = IDEM_PROCEED;
  cl->attempt = 1;
  cl->retry_after_ms = 0;
  cl->recovered = 0;
  cl->held = 1;
done:
  if (op->rc == IDEM_OK) {
    prune_some(s, c);
    return;
  }
fail:
  cl->held = 0;
  idem__pg_rollback(c);
}

/* ---- the caller's own transaction (idem_execute_in) ---------------------- */

/* What tells one database from another: its name and its server's start
 * time, in microseconds (not as text, which follows each session's
 * TimeZone and DateStyle). */
#define IDENTITY_SQL                                                           \
  "SELECT pg_catalog.current_database() || '/' || (extract(epoch FROM "        \
  "pg_catalog.pg_postmaster_start_time()) * 1000000)::bigint::text"

/* The database c is connected to, as IDENTITY_SQL tells it: *out, the
 * caller's to free. */
static int identity_of(conn *c, char **out, char *err) {
  PGresult *res = idem__pg_exec(c, IDENTITY_SQL);
  int rc = IDEM_OK;
  *out = NULL;
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
    rc = idem__pg_fail(c, res, "read the database's identity", err);
  else if (!(*out = idem__strdup(PQgetvalue(res, 0, 0))))
    rc = idem__pg_failf(err, IDEM_ENOMEM, "out of memory");
  PQclear(res);
  return rc;
}

/* Reads the store's database on c (one of the store's own connections)
 * into s->identity. */
static int read_identity(pg_store *s, conn *c, char *err) {
  char *id, *old;
  int rc = identity_of(c, &id, err);
  if (rc != IDEM_OK)
    return rc;
  pthread_mutex_lock(&s->mu);
  old = s->identity;
  s->identity = id;
  pthread_mutex_unlock(&s->mu);
  free(old);
  return IDEM_OK;
}

/* Whether s->identity is text (under mu). */
static int identity_is(pg_store *s, const char *text) {
  int same;
  pthread_mutex_lock(&s->mu);
  same = s->identity && strcmp(s->identity, text) == 0;
  pthread_mutex_unlock(&s->mu);
  return same;
}

/* Whether c is a connection to the store's database: IDEM_OK, or
 * IDEM_EINVAL (another database or server) or the error of the read. The
 * store's identity, read when it opened, is read again on a mismatch (its
 * server restarted meanwhile, or failed over). */
static int same_database(pg_store *s, conn *c, idem__op *op) {
  char *theirs;
  int rc = identity_of(c, &theirs, op->errmsg);
  if (rc == IDEM_OK && !identity_is(s, theirs)) {
    conn *own = NULL;
    if ((rc = idem__pg_pool_get(s, &own, op->errmsg)) == IDEM_OK) {
      rc = read_identity(s, own, op->errmsg);
      idem__pg_pool_put(s, own);
    }
    if (rc == IDEM_OK && !identity_is(s, theirs))
      rc = idem__op_fail(op, IDEM_EINVAL,
                         "execute_in: the connection is to another database "
                         "or server than the store's (database/server start: "
                         "%.120s)",
                         theirs);
  }
  free(theirs);
  return op->rc = rc;
}

/* The action on a claimed row of the caller's transaction: runs fn, then
 * completes the row in the same transaction; no commit. */
static int run_local_in(pg_store *s, conn *c, idem__op *op) {
  char sum[IDEM_FINGERPRINT_SIZE];
  PGresult *res = NULL;
  params p = {0};
  idem_response r;
  if (call_action(c, op, &r) != IDEM_OK) {
    if (!c->gone && op->rc != IDEM_EUNAVAILABLE &&
        PQtransactionStatus(c->pg) == PQTRANS_IDLE)
      mark_self_ended(s, c, op);
    return op->rc;
  }
  if (response_params(op, &r, ST_COMPLETE_LOCAL, &p, sum) != IDEM_OK)
    return op->rc;
  if ((op->rc = idem__pg_run_stmt(s, c, ST_COMPLETE_LOCAL, &p, "complete",
                                  &res, op->errmsg)) != IDEM_OK)
    return op->rc;
  PQclear(res);
  if (idem__claim_set_response(op->claim, r.status, r.meta, r.meta_len, r.body,
                               r.body_len) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "out of memory");
  return IDEM_OK;
}

/*
 * The claim inside the caller's transaction, in a savepoint: the record is
 * inserted in progress first (a transaction that inserted the key and has
 * not ended makes this insert wait for it: the second of two transactions
 * on one key waits in the database, then reads the first one's record),
 * or else the row is locked and decided on, as a claim does; then the
 * action and the completion, all uncommitted.
 */
static void in_claim(pg_store *s, conn *c, idem__op *op) {
  idem_call *cl = op->claim;
  int found = 0, inserted = 0;
  idem__row row;
  idem__action action = IDEM__ACT_NONE;
  if (new_token(op) != IDEM_OK)
    return;
  for (int tries = 0;; tries++) {
    if (try_insert(s, c, op, 0, &inserted) != IDEM_OK)
      return;
    if (inserted)
      break;
    if (load_and_decide(s, c, op, ST_LOCK, 0, &found, &row, &action) !=
        IDEM_OK)
      return;
    if (found)
      break;
    if (tries + 1 >= CLAIM_TRIES) {
      idem__op_fail(op, IDEM_EBUSY,
                    "key '%s': the record kept changing during the claim; "
                    "try again",
                    op->id->key);
      return;
    }
  }
  if (inserted) {
    cl->outcome = IDEM_PROCEED;
    cl->attempt = 1;
    cl->retry_after_ms = 0;
    cl->recovered = 0;
  } else if (action == IDEM__ACT_NONE) {
    return; /* replay, conflict, in flight, unknown */
  } else if (write_claim(s, c, op, action) != IDEM_OK) {
    return;
  }
  run_local_in(s, c, op);
}

static void pg_run_in(void *state, idem__op *op) {
  pg_store *s = state;
  char ignored[ERR_SIZE];
  conn c;
  int began = 0, rc;
  memset(&c, 0, sizeof c);
  c.pg = op->conn;
  c.foreign = 1;
  if (PQstatus(c.pg) != CONNECTION_OK) {
    idem__op_fail(op, IDEM_EUNAVAILABLE,
                  "execute_in: the caller's connection is not open");
    return;
  }
  if (PQpipelineStatus(c.pg) != PQ_PIPELINE_OFF) {
    idem__op_fail(op, IDEM_EINVAL,
                  "execute_in: the caller's connection is in pipeline mode");
    return;
  }
  switch (PQtransactionStatus(c.pg)) {
  case PQTRANS_IDLE:
    began = 1;
    break;
  case PQTRANS_INTRANS:
    break;
  case PQTRANS_INERROR:
    idem__op_fail(op, IDEM_EINVAL,
                  "execute_in: the caller's transaction has failed; roll it "
                  "back first");
    return;
  default:
    idem__op_fail(op, IDEM_EINVAL,
                  "execute_in: a query is running on the caller's "
                  "connection");
    return;
  }
  /* Everything from here runs in the savepoint, so that a failure (the
   * identity's read too) leaves the caller's transaction as it was. */
  if (began &&
      (rc = idem__pg_run_simple(&c, "BEGIN", "begin", op->errmsg))) {
    op->rc = rc;
    goto out;
  }
  if ((rc = idem__pg_run_simple(&c, "SAVEPOINT idem_in", "savepoint",
                                op->errmsg))) {
    op->rc = rc;
    goto out;
  }
  if (same_database(s, &c, op) == IDEM_OK)
    in_claim(s, &c, op);
  if (c.gone)
    return; /* the action closed the connection: not touched again */
  /* A decision that wrote nothing (replay, conflict, in flight, unknown)
   * is rolled back too: its read locked the row (FOR UPDATE), which would
   * keep the holder's completion waiting until the transaction ends. */
  if (op->rc == IDEM_OK && (op->claim->outcome == IDEM_PROCEED ||
                            op->claim->outcome == IDEM_RECOVER)) {
    if ((rc = idem__pg_run_simple(&c, "RELEASE idem_in", "release",
                                  op->errmsg)))
      op->rc = rc;
  } else if (PQtransactionStatus(c.pg) == PQTRANS_INTRANS ||
             PQtransactionStatus(c.pg) == PQTRANS_INERROR) {
    if (idem__pg_run_simple(&c, "ROLLBACK TO idem_in", "rollback", ignored) ==
        IDEM_OK)
      idem__pg_run_simple(&c, "RELEASE idem_in", "release", ignored);
    else if (op->rc == IDEM_OK || op->rc == IDEM_EREJECTED)
      idem__op_fail(op, IDEM_ESTORE,
                    "execute_in: the savepoint could not be rolled back; "
                    "roll the transaction back");
  }
out:
  if (op->rc != IDEM_OK) {
    idem__pg_scrub(s, op->errmsg, sizeof op->errmsg);
    if (began && PQtransactionStatus(c.pg) != PQTRANS_IDLE)
      idem__pg_run_simple(&c, "ROLLBACK", "rollback", ignored);
  }
}

/* Expiries in the cache are deadlines on this process's monotonic clock. */
static int pg_cached(void *state, idem__op *op) {
  pg_store *s = state;
  return idem__cache_get(s->cache, op, mono_ms());
}

static void pg_run(void *state, idem__op *op) {
  pg_store *s = state;
  conn *c = NULL;
  int rc;
  if ((op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL) &&
      idem__cache_get(s->cache, op, mono_ms()))
    return;
  rc = idem__pg_pool_get(s, &c, op->errmsg);
  if (rc != IDEM_OK) {
    op->rc = rc;
    idem__pg_scrub(s, op->errmsg, sizeof op->errmsg);
    return;
  }
  switch (op->kind) {
  case IDEM__OP_CLAIM:
  case IDEM__OP_LOCAL:
    run_claim(s, c, op);
    break;
  case IDEM__OP_COMPLETE:
    /* One statement is its own transaction. If the connection breaks
     * before its result arrives, it is sent again on a re-established one
     * (run_fenced); when that fails too, the caller gets EUNAVAILABLE and
     * keeps holding the claim: it never believes a response stored that
     * was not. */
    write_complete(s, c, op, op->response);
    break;
  case IDEM__OP_RELEASE:
    write_fenced(s, c, op, ST_RELEASE);
    break;
  case IDEM__OP_MARK_UNKNOWN:
    write_fenced(s, c, op, ST_UNKNOWN);
    break;
  case IDEM__OP_RENEW:
    write_fenced(s, c, op, ST_RENEW);
    break;
  default:
    idem__op_fail(op, IDEM_EINVAL, "unknown operation");
  }
  idem__pg_pool_put(s, c);
  if (op->rc != IDEM_OK)
    idem__pg_scrub(s, op->errmsg, sizeof op->errmsg);
}

/* ---- open and close ------------------------------------------------------ */

static void pg_close(void *state) {
  pg_store *s = state;
  conn *c;
  if (!s)
    return;
  if (idem__closing_forked()) {
    /* A child of fork() lets go of its parent's handle: PQfinish() would
     * send a Terminate on the parent's sessions. The child only closes its
     * own copies of their sockets, so that it never keeps a session of the
     * parent's open; the memory stays (shared with the parent until one of
     * them writes it). The listener's thread is not in the child: it is
     * left, with its socket (close-on-exec, as libpq makes them all). The
     * pool is read only when no thread of the parent's held it at the
     * fork. */
    if (s->renewer && PQsocket(s->renewer->pg) >= 0)
      close(PQsocket(s->renewer->pg));
    if (pthread_mutex_trylock(&s->mu) == 0) {
      for (c = s->idle; c; c = c->next)
        if (PQsocket(c->pg) >= 0)
          close(PQsocket(c->pg));
      pthread_mutex_unlock(&s->mu);
    }
    return;
  }
  idem__pg_listener_free(s->listener);
  idem__pg_conn_close(s->renewer);
  while ((c = s->idle)) {
    s->idle = c->next;
    idem__pg_conn_close(c);
  }
  for (int i = 0; i < ST_COUNT; i++)
    free(s->sql[i]);
  free(s->identity);
  free(s->sql_meta);
  free(s->sql_v1);
  free(s->sql_v2);
  free(s->sql_v3);
  free(s->sql_v4);
  free(s->sql_version);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->renew_mu);
  pthread_mutex_destroy(&s->clock_mu);
  pthread_cond_destroy(&s->cv);
  free(s->conninfo);
  for (int i = 0; i < s->nsecret; i++)
    free(s->secret[i]);
  free(s->secret);
  idem__cache_free(s->cache);
  free(s);
}

static int pg_open(const char *target, const idem_store_options *opts,
                   void **state) {
  pg_store *s = calloc(1, sizeof *s);
  conn *c = NULL;
  char err[ERR_SIZE] = "";
  int rc;
  *state = NULL;
  if (s)
    s->clock_ahead = INT64_MAX;
  if (!s)
    return idem__fail(IDEM_ENOMEM, "postgresql: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->renew_mu, NULL);
  pthread_mutex_init(&s->clock_mu, NULL);
  s->clock_asked = INT64_MIN;
  s->renew_fd = -1;
  pthread_cond_init(&s->cv, NULL);
  s->o = *opts;
  if (s->o.busy_timeout_ms <= 0)
    s->o.busy_timeout_ms = 10000;
  if (s->o.max_connections <= 0)
    s->o.max_connections = 16;
  if (!(s->cache = idem__cache_new(s->o.replay_cache_entries)) &&
      s->o.replay_cache_entries >= 0)
    goto nomem;
  if (!PQisthreadsafe()) {
    rc = idem__pg_failf(err, IDEM_ESTORE,
                        "postgresql: this libpq is not thread-safe");
    goto fail;
  }
  if ((rc = idem__pg_parse_target(s, target, err)) != IDEM_OK)
    goto fail;
  for (int i = 0; i < ST_COUNT; i++)
    if (!(s->sql[i] = idem__pg_build_sql(sql_text[i], s->schema)))
      goto nomem;
  if (idem__pg_schema_sql(s) != IDEM_OK)
    goto nomem;
  if ((rc = idem__pg_conn_open(s, &c, err)) != IDEM_OK ||
      (rc = idem__pg_server_version(s, c, err)) != IDEM_OK ||
      (rc = idem__pg_ensure_schema(s, c, err)) != IDEM_OK ||
      (rc = read_identity(s, c, err)) != IDEM_OK)
    goto fail;
  /* A store left below the version that has the recovered mark: the
   * statements that name it are replaced (none is prepared yet). */
  if (s->schema_min < IDEM__PG_SCHEMA_RECOVERED)
    for (int i = 0; i < ST_COUNT; i++)
      if (sql_text_v2[i]) {
        free(s->sql[i]);
        if (!(s->sql[i] = idem__pg_build_sql(sql_text_v2[i], s->schema)))
          goto nomem;
      }
  s->nconn = 1;
  c->next = NULL;
  s->idle = c;
  *state = s;
  return IDEM_OK;
nomem:
  rc = idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
fail:
  idem__pg_conn_close(c);
  idem__pg_scrub(s, err, sizeof err);
  pg_close(s);
  return idem__fail(rc, "%s", err);
}

static const char *pg_engine_version(void *state) {
  return ((pg_store *)state)->version;
}

const idem__store_methods idem__pg_methods = {
    IDEM__STORE_METHODS_VERSION,
    "postgresql",
    pg_open,
    pg_close,
    pg_engine_version,
    pg_run,
    idem__pg_get,
    idem__pg_list,
    idem__pg_prune,
    idem__pg_resolve,
    idem__pg_remove,
    idem__pg_run_many,
    idem__pg_watch,
    idem__pg_clock_ahead,
    idem__pg_check,
    NULL, /* queue: the engine's runner threads run the calls, one
             connection each */
    pg_cached,
    idem__pg_interrupt_renewals,
    pg_run_in,
};
