/*
 * store_pg.c -- the PostgreSQL backend (libpq).
 *
 * Many processes, on many machines, may share one store. Every outcome of
 * the decision table (docs/design.md) is one statement or one short READ
 * COMMITTED transaction that touches one row, so callers never see serialization failures to retry and never
 * take a table lock.
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
 */
#include "store.h"

#include "cache.h"

#include <ctype.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SCHEMA_VERSION 2
#define SCHEMA_MAX 63 /* PostgreSQL's NAMEDATALEN - 1 */
#define ERR_SIZE 512
#define MAX_PARAMS 12
#define LIST_PAGE 256
/* Retries of the insert-or-lock step when the row vanishes in between. */
#define CLAIM_TRIES 8
/* Leases and retention are capped so that now + period stays a bigint
 * (about 73 million years; "forever" for any caller). */
#define MAX_PERIOD_MS (INT64_MAX / 4)
/* Advisory lock class for schema creation: "idem" in ASCII. */
#define SCHEMA_LOCK_CLASS "1768187245"

/* The server's clock in Unix milliseconds. */
#define NOW_MS "(floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"

enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_PEEK,
  ST_LOCK,
  ST_INSERT,
  ST_INSERT_DONE,
  ST_KEY_LOCK,
  ST_INSERT_UNKNOWN,
  ST_REPLACE,
  ST_TAKEOVER,
  ST_COMPLETE,
  ST_COMPLETE_LOCAL,
  ST_RELEASE,
  ST_UNKNOWN,
  ST_RENEW,
  ST_GET,
  ST_HOLDER,
  ST_LIST,
  ST_PRUNE,
  ST_PRUNE_SOME,
  ST_RESOLVE_DONE,
  ST_RESOLVE_DELETE,
  ST_DELETE,
  ST_COUNT
};

#define RECORD_COLUMNS                                                         \
  "r.tenant, r.operation, r.key, r.fingerprint, r.state, r.attempt, "          \
  "r.created_ms, r.updated_ms, r.lease_expires_ms, r.expires_ms, r.request, "  \
  "r.status, r.meta, r.body, r.checksum"

#define PK "tenant = $1::text AND operation = $2::text AND key = $3::text"

/* Expired by retention: completed records only. A record in progress or
 * marked unknown may describe an action that happened; it stays. */
#define EXPIRED_SQL "(r.state = 2 AND r.expires_ms <= n.now_ms)"
/* Past its retention but kept, waiting for a holder or an operator. */
#define OVERDUE_SQL "(r.state <> 2 AND r.expires_ms <= n.now_ms)"

/* The response columns are read only when the fingerprint matches: a
 * conflicting claim has no use for a stored body of up to 16 MiB. */
#define SELECT_ROW                                                             \
  "SELECT fingerprint, state, attempt, lease_expires_ms, expires_ms, "         \
  "status, CASE WHEN fingerprint = $4::text THEN meta END, CASE WHEN "         \
  "fingerprint = $4::text THEN body END, checksum, " NOW_MS " FROM "           \
  "{S}.idem_records WHERE " PK

#define NOW_ROW "(SELECT " NOW_MS " AS now_ms) n"

/* "{S}" stands for the quoted schema name; see build_sql(). */
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
        "+ $6::bigint, $7::integer, $8::bytea, $9::bytea, $10::text FROM " NOW_ROW,
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
        "$5::bytea, 3, 1, n.now_ms, n.now_ms, 0, n.now_ms + $6::bigint FROM " NOW_ROW
        " ON CONFLICT (tenant, operation, key) DO UPDATE SET state = 3, "
        "owner = NULL, lease_expires_ms = 0, updated_ms = EXCLUDED.updated_ms "
        "WHERE idem_records.state = 1",
    [ST_REPLACE] =
        "UPDATE {S}.idem_records SET fingerprint = $4::text, request = "
        "$5::bytea, state = 1, owner = $6::text, attempt = 1, created_ms = "
        "n.now_ms, updated_ms = n.now_ms, lease_expires_ms = n.now_ms + "
        "$7::bigint, expires_ms = n.now_ms + $8::bigint, status = NULL, meta "
        "= NULL, body = NULL, checksum = NULL FROM " NOW_ROW " WHERE " PK
        " RETURNING lease_expires_ms",
    [ST_TAKEOVER] = "UPDATE {S}.idem_records SET state = 1, owner = $4::text, "
                    "attempt = attempt + 1, updated_ms = n.now_ms, "
                    "lease_expires_ms = n.now_ms + $5::bigint, expires_ms = "
                    "GREATEST(expires_ms, n.now_ms + $6::bigint) FROM " NOW_ROW
                    " WHERE " PK " RETURNING attempt, lease_expires_ms",
    [ST_COMPLETE] =
        "UPDATE {S}.idem_records SET state = 2, owner = NULL, "
        "lease_expires_ms = 0, updated_ms = n.now_ms, expires_ms = n.now_ms + "
        "$5::bigint, status = $6::integer, meta = $7::bytea, body = "
        "$8::bytea, checksum = $9::text FROM " NOW_ROW " WHERE " PK
        " AND owner = $4::text AND state = 1",
    /* The same inside a local action's transaction, sent together with its
     * COMMIT: a row that is not there (it cannot be, under the row lock)
     * must fail the statement, so that the COMMIT becomes a rollback and
     * the caller's mutation is never kept without its record. */
    /* It leaves expires_ms and updated_ms as the insert set them (in the
     * same transaction, so nobody saw the moment between), so that no
     * indexed column changes and PostgreSQL can update the row in place
     * (HOT) without new index entries. */
    [ST_COMPLETE_LOCAL] =
        "WITH u AS (UPDATE {S}.idem_records SET state = 2, owner = NULL, "
        "lease_expires_ms = 0, status = $5::integer, meta = $6::bytea, body "
        "= $7::bytea, checksum = $8::text WHERE " PK
        " AND owner = $4::text AND state = 1 RETURNING 1) SELECT 1 / (SELECT "
        "count(*)::integer FROM u)",
    [ST_RELEASE] = "DELETE FROM {S}.idem_records WHERE " PK
                   " AND owner = $4::text AND state = 1",
    [ST_UNKNOWN] = "UPDATE {S}.idem_records SET state = 3, owner = NULL, "
                   "lease_expires_ms = 0, updated_ms = " NOW_MS " WHERE " PK
                   " AND owner = $4::text AND state = 1",
    [ST_RENEW] = "UPDATE {S}.idem_records SET lease_expires_ms = n.now_ms + "
                 "$5::bigint, updated_ms = n.now_ms FROM " NOW_ROW " WHERE " PK
                 " AND owner = $4::text AND state = 1 RETURNING "
                 "lease_expires_ms",
    [ST_GET] =
        "SELECT " RECORD_COLUMNS " FROM {S}.idem_records r CROSS JOIN " NOW_ROW
        " WHERE r." PK " AND NOT " EXPIRED_SQL,
    /* After a fenced write that changed nothing: what the row says now, to
     * tell whether an earlier send of that write (whose answer was lost)
     * had committed. FOR SHARE waits for a transaction of the old session
     * that may still hold the row. */
    [ST_HOLDER] = "SELECT state, checksum, fingerprint, attempt FROM "
                  "{S}.idem_records WHERE " PK " FOR SHARE",
    /* Keyset pagination, so that no connection is held while the caller's
     * function runs (it may call back into the store) and memory stays
     * bounded. Text is ordered by bytes (COLLATE "C"), as SQLite does. */
    [ST_LIST] =
        "SELECT " RECORD_COLUMNS " FROM {S}.idem_records r CROSS JOIN " NOW_ROW
        " WHERE ($1::text IS NULL OR r.tenant = $1::text) AND ($2::text IS "
        "NULL OR r.operation = $2::text) AND ($3::integer = 0 OR r.state = "
        "$3::integer) AND ($4::boolean OR NOT " EXPIRED_SQL ") AND "
        "(NOT $11::boolean OR " OVERDUE_SQL ") AND ($5::boolean OR (r.created_ms, r.tenant COLLATE \"C\", r.operation "
        "COLLATE \"C\", r.key COLLATE \"C\") > ($6::bigint, $7::text, "
        "$8::text, $9::text)) ORDER BY r.created_ms, r.tenant COLLATE \"C\", "
        "r.operation COLLATE \"C\", r.key COLLATE \"C\" LIMIT $10::bigint",
    [ST_PRUNE] =
        "DELETE FROM {S}.idem_records r USING " NOW_ROW " WHERE " EXPIRED_SQL,
    /* Rows a claimer holds are skipped rather than waited for. */
    [ST_PRUNE_SOME] =
        "DELETE FROM {S}.idem_records t USING (SELECT r.tenant, r.operation, "
        "r.key FROM {S}.idem_records r CROSS JOIN " NOW_ROW
        " WHERE " EXPIRED_SQL " LIMIT 256 FOR UPDATE OF r SKIP LOCKED) d "
        "WHERE t.tenant = d.tenant AND t.operation = d.operation AND t.key = "
        "d.key",
    [ST_RESOLVE_DONE] =
        "UPDATE {S}.idem_records SET state = 2, owner = NULL, "
        "lease_expires_ms = 0, updated_ms = n.now_ms, expires_ms = "
        "GREATEST(expires_ms, n.now_ms + $4::bigint), status = $5::integer, "
        "meta = $6::bytea, body = $7::bytea, checksum = $8::text FROM " NOW_ROW
        " WHERE " PK " AND state <> 2",
    [ST_RESOLVE_DELETE] =
        "DELETE FROM {S}.idem_records WHERE " PK " AND state <> 2",
    [ST_DELETE] = "DELETE FROM {S}.idem_records WHERE " PK,
};

static const char schema_meta[] = "CREATE SCHEMA IF NOT EXISTS {S};"
                                  "CREATE TABLE IF NOT EXISTS {S}.idem_meta ("
                                  " name text PRIMARY KEY,"
                                  " value text NOT NULL)";

static const char schema_v1[] =
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
    " PRIMARY KEY (tenant, operation, key));"
    "CREATE INDEX IF NOT EXISTS idem_records_expires ON {S}.idem_records "
    "(expires_ms)";

/*
 * Version 2: the identifying columns compare as bytes (COLLATE "C"), as on
 * SQLite, whatever the database's default collation. The primary key index
 * then never depends on the operating system's locale data, which can
 * change its order in an upgrade and leave a text index corrupt (a
 * uniqueness check that misses a row); and its comparisons are plain
 * memcmp. The table is not rewritten; the primary key index is rebuilt.
 */
static const char schema_v2[] =
    "ALTER TABLE {S}.idem_records"
    " ALTER COLUMN tenant TYPE text COLLATE \"C\","
    " ALTER COLUMN operation TYPE text COLLATE \"C\","
    " ALTER COLUMN key TYPE text COLLATE \"C\"";

typedef struct conn {
  PGconn *pg;
  /* Which statements this session has prepared. A reconnect starts a new
   * session, which has none. */
  unsigned char prepared[ST_COUNT];
  char sqlstate[6]; /* of the last failure pg_fail() classified */
  int failed_step;  /* run_steps(): which statement failed, or -1 */
  /* The server refused a write as read-only (a standby, say after a
   * failover): reconnect before the next use, so that a multi-host URL
   * with target_session_attrs=read-write finds the primary. */
  int read_only;
  struct conn *next;
} conn;

typedef struct pg_store {
  char *conninfo; /* the target without idem_schema, as libpq gets it */
  char schema[SCHEMA_MAX + 1];
  char *sql[ST_COUNT];
  char *sql_meta, *sql_v1, *sql_v2, *sql_version;
  idem_store_options o;
  char version[64];

  pthread_mutex_t mu;
  pthread_cond_t cv;
  conn *idle;
  int nconn;
  int64_t last_prune_ms;
  idem__cache *cache; /* completed records, for replays (monotonic clock) */
  /* What no message may show (see scrub()), longest first. */
  char **secret;
  int nsecret, secret_cap;
  int secret_nomem; /* one could not be kept: the open fails */
} pg_store;

/* ---- errors -------------------------------------------------------------- */

static int failf(char *err, int rc, const char *fmt, ...) IDEM__PRINTF(3, 4);

static int failf(char *err, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, ERR_SIZE, fmt, ap);
  va_end(ap);
  return rc;
}

/* Copies libpq's text as one line: its messages end in newlines and
 * sometimes carry a second, indented line with a hint. */
static void oneline(char *dst, size_t size, const char *src) {
  size_t n = 0;
  int space = 0;
  if (!src)
    src = "";
  for (; *src && n + 1 < size; src++) {
    if (isspace((unsigned char)*src)) {
      space = 1;
      continue;
    }
    if (space && n > 0 && n + 2 < size)
      dst[n++] = ' ';
    space = 0;
    dst[n++] = *src;
  }
  dst[n] = '\0';
}

/* Whether the server is a hot standby (reported by PostgreSQL 14 and
 * later at connection start and whenever it changes). */
static int standby(const conn *c) {
  const char *v = PQparameterStatus(c->pg, "in_hot_standby");
  return v && !strcmp(v, "on");
}

/*
 * Classifies a failed call on c: res is its result (NULL when libpq could
 * not even produce one). A lost connection, or a server that accepts no
 * writes, is "unavailable"; lock timeouts, deadlocks and serialization
 * failures are "busy"; the rest is a store error. Writes "postgresql: WHAT:
 * TEXT" into err and returns the code.
 */
static int pg_fail(conn *c, const PGresult *res, const char *what, char *err) {
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *primary =
      res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  char text[ERR_SIZE];
  int rc = IDEM_ESTORE;

  snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    oneline(text, sizeof text, PQerrorMessage(c->pg));
    return failf(err, IDEM_EUNAVAILABLE, "postgresql: %s: %s", what,
                 text[0] ? text : "the connection was lost");
  }
  if (!state) {
    oneline(text, sizeof text,
            res && *PQresultErrorMessage(res) ? PQresultErrorMessage(res)
                                              : PQerrorMessage(c->pg));
    return failf(err, IDEM_ESTORE, "postgresql: %s: %s", what,
                 text[0] ? text : "no result");
  }
  if (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
      !strcmp(state, "55P03"))
    rc = IDEM_EBUSY;
  else if (!strncmp(state, "08", 2) || !strcmp(state, "57P01") ||
           !strcmp(state, "57P02") || !strcmp(state, "57P03") ||
           !strcmp(state, "53300"))
    rc = IDEM_EUNAVAILABLE;
  else if (!strcmp(state, "25006") || standby(c)) {
    /* A write refused as read-only, or any failure on a server in
     * recovery (which also refuses idem's advisory locks). */
    c->read_only = 1;
    oneline(text, sizeof text, primary ? primary : PQresultErrorMessage(res));
    return failf(err, IDEM_EUNAVAILABLE,
                 "postgresql: %s: %s (SQLSTATE %s): the server accepts no "
                 "writes (a standby, or default_transaction_read_only); "
                 "point idem at the primary, e.g. with several hosts and "
                 "target_session_attrs=read-write",
                 what, text, state);
  } else if (!strcmp(state, "26000"))
    /* A prepared statement is gone: the caller's SQL on this connection
     * ran DEALLOCATE or DISCARD. Prepare everything again next time. */
    memset(c->prepared, 0, sizeof c->prepared);
  oneline(text, sizeof text, primary ? primary : PQresultErrorMessage(res));
  return failf(err, rc, "postgresql: %s: %s (SQLSTATE %s)", what, text, state);
}

/* ---- secrets ------------------------------------------------------------- */

/*
 * The target may hold a password, and libpq's own messages quote what they
 * could not read: the whole URL, the token that was not valid
 * percent-encoding, a piece of a password that a stray '/' or '@' made it
 * read as a port or a host name, the word after an unquoted space. So the
 * target is never put in a message by idem, and every message leaving this
 * backend is scrubbed of the passwords the target holds, in every form in
 * which libpq might show them (see scrub()).
 */

static int is_word_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9');
}

/* Remembers n bytes at p as a secret, keeping the list longest first. */
static void add_secret(pg_store *s, const char *p, size_t n) {
  char *copy;
  int i;
  if (n == 0)
    return;
  for (i = 0; i < s->nsecret; i++)
    if (strlen(s->secret[i]) == n && !memcmp(s->secret[i], p, n))
      return;
  if (s->nsecret == s->secret_cap) {
    int cap = s->secret_cap ? 2 * s->secret_cap : 8;
    char **grown = realloc(s->secret, (size_t)cap * sizeof *grown);
    if (!grown) {
      s->secret_nomem = 1;
      return;
    }
    s->secret = grown;
    s->secret_cap = cap;
  }
  if (!(copy = malloc(n + 1))) {
    s->secret_nomem = 1;
    return;
  }
  memcpy(copy, p, n);
  copy[n] = '\0';
  for (i = s->nsecret; i > 0 && strlen(s->secret[i - 1]) < n; i--)
    s->secret[i] = s->secret[i - 1];
  s->secret[i] = copy;
  s->nsecret++;
}

static int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F')
    return ch - 'A' + 10;
  return -1;
}

/* A URL's secret: as written, and percent-decoded when that differs. */
static void add_url_secret(pg_store *s, const char *p, size_t n) {
  char *d = malloc(n + 1);
  size_t o = 0;
  add_secret(s, p, n);
  if (!d) {
    s->secret_nomem = 1;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (p[i] == '%' && i + 2 < n && (hi = hex_digit(p[i + 1])) >= 0 &&
        (lo = hex_digit(p[i + 2])) >= 0) {
      d[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      d[o++] = p[i];
    }
  }
  add_secret(s, d, o);
  free(d);
}

/* Whether the n bytes at p name a keyword that holds a password. */
static int password_keyword(const char *p, size_t n) {
  return (n == 8 && !strncmp(p, "password", 8)) ||
         (n == 11 && !strncmp(p, "sslpassword", 11));
}

/*
 * The secrets of the URL in the n bytes at url: the password of the user
 * info, as libpq reads it (up to the first '@'); from the first ':' to the
 * last '@' before the query and each piece of that between '@', '/' and
 * ':', for a password in which those were not percent-encoded; and the
 * values of password and sslpassword in the query.
 */
static void url_secrets(pg_store *s, const char *url, size_t n) {
  const char *end = url + n, *a = strstr(url, "://"), *p, *q, *at = NULL,
             *colon;
  if (!a || a >= end)
    return;
  a += 3;
  for (p = a; p < end && *p != '@' && *p != '/'; p++)
    ;
  if (p < end && *p == '@' && (colon = memchr(a, ':', (size_t)(p - a))))
    add_url_secret(s, colon + 1, (size_t)(p - colon - 1));
  q = memchr(a, '?', (size_t)(end - a));
  for (p = a; p < (q ? q : end); p++)
    if (*p == '@')
      at = p;
  if (at && (colon = memchr(a, ':', (size_t)(at - a)))) {
    const char *piece = colon + 1;
    add_url_secret(s, piece, (size_t)(at - piece));
    for (p = piece; p <= at; p++)
      if (p == at || *p == '@' || *p == '/' || *p == ':') {
        add_secret(s, piece, (size_t)(p - piece));
        piece = p + 1;
      }
  }
  for (p = q; p && p < end; p = q) {
    const char *eq, *amp;
    p++;
    amp = memchr(p, '&', (size_t)(end - p));
    q = amp ? amp : end;
    eq = memchr(p, '=', (size_t)(q - p));
    if (eq && password_keyword(p, (size_t)(eq - p)))
      add_url_secret(s, eq + 1, (size_t)(q - eq - 1));
    if (!amp)
      break;
  }
}

static int is_url_at(const char *p) {
  return !strncmp(p, "postgresql://", 13) || !strncmp(p, "postgres://", 11);
}

/*
 * The secrets of a conninfo string, read as libpq reads it (keyword =
 * value, values optionally single-quoted with backslash escapes): the
 * values of password and sslpassword, as written and unescaped, and any
 * bare words after one (the rest of a password with an unquoted space,
 * which libpq quotes when it finds no '=' after them). A value that is a
 * URL (dbname may be one) is read as a URL.
 */
static void conninfo_secrets(pg_store *s, const char *t) {
  const char *p = t;
  int after_password = 0;
  while (*p) {
    const char *tok, *kw_end, *val, *val_end;
    while (isspace((unsigned char)*p))
      p++;
    if (!*p)
      break;
    tok = p;
    while (*p && *p != '=' && !isspace((unsigned char)*p))
      p++;
    kw_end = p;
    while (isspace((unsigned char)*p))
      p++;
    if (*p != '=') {
      if (after_password)
        add_secret(s, tok, (size_t)(kw_end - tok));
      p = kw_end;
      continue;
    }
    p++;
    while (isspace((unsigned char)*p))
      p++;
    val = p;
    if (*p == '\'') {
      for (p++; *p && *p != '\''; p++)
        if (*p == '\\' && p[1])
          p++;
      val_end = p;
      val++;
      if (*p)
        p++;
    } else {
      for (; *p && !isspace((unsigned char)*p); p++)
        if (*p == '\\' && p[1])
          p++;
      val_end = p;
    }
    after_password = password_keyword(tok, (size_t)(kw_end - tok));
    if (after_password) {
      char *u = malloc((size_t)(val_end - val) + 1);
      size_t o = 0;
      add_secret(s, val, (size_t)(val_end - val));
      if (!u) {
        s->secret_nomem = 1;
      } else {
        for (const char *v = val; v < val_end; v++) {
          if (*v == '\\' && v + 1 < val_end)
            v++;
          u[o++] = *v;
        }
        add_secret(s, u, o);
        free(u);
      }
    } else if (is_url_at(val)) {
      url_secrets(s, val, (size_t)(val_end - val));
    }
  }
}

/*
 * Replaces every secret in msg (a string in a buffer of size bytes) with
 * "***". A secret of four bytes or more goes wherever it appears; a
 * shorter one (a piece of a password that libpq read as something else)
 * only where it stands as a word of its own, so that a piece of one letter
 * does not blank out that letter all over the message.
 */
static void scrub(const pg_store *s, char *msg, size_t size) {
  char out[2 * ERR_SIZE];
  if (!s || size == 0)
    return;
  if (size > sizeof out) {
    /* Longer than any message here: shortened, never left unscrubbed. */
    size = sizeof out;
    msg[size - 1] = '\0';
  }
  for (int i = 0; i < s->nsecret; i++) {
    const char *sec = s->secret[i], *p = msg;
    size_t n = strlen(sec), o = 0;
    if (!strstr(msg, sec))
      continue;
    while (*p && o + 4 < size) {
      if (!strncmp(p, sec, n) &&
          (n >= 4 ||
           ((p == msg || !is_word_char(p[-1])) && !is_word_char(p[n])))) {
        memcpy(out + o, "***", 3);
        o += 3;
        p += n;
      } else {
        out[o++] = *p++;
      }
    }
    out[o] = '\0';
    memcpy(msg, out, o + 1);
  }
}

/* The secrets of a target, before anything reads it. */
static void collect_secrets(pg_store *s, const char *target) {
  for (const char *p = target; *p; p++)
    if (is_url_at(p) && (p == target || !is_word_char(p[-1]))) {
      size_t n = strcspn(p, " \t\n'");
      url_secrets(s, p, n);
      p += n - 1;
    }
  if (!is_url_at(target))
    conninfo_secrets(s, target);
}

/* ---- connection failures ------------------------------------------------- */

/*
 * Why a connection could not be made, for a caller that must decide
 * whether to try again later. A server that is down, starting, shutting
 * down, out of connection slots or read-only (a standby, before a failover
 * completes) may take the connection later: IDEM_EUNAVAILABLE. A URL or
 * conninfo that libpq cannot use (an invalid option or value, a port that
 * is not a number, a host name that cannot be one) is IDEM_EURL; a server
 * that refuses this user or database (authentication, a role or database
 * that does not exist, no LOGIN or CONNECT right, a setting it does not
 * know) is IDEM_ESTORE: retrying cannot help, and the message says what to
 * fix.
 *
 * libpq reports a failed connection only as text, without a SQLSTATE, so
 * its text is read: libpq 15's own messages, and the server's (after
 * "FATAL:  "), in English. A server whose lc_messages translates them has
 * every refusal read as IDEM_ESTORE, since none is then known to pass.
 */
typedef struct refusal {
  /* Both must appear (text2 may be NULL); text with a leading '^' at the
   * start of the line. */
  const char *text, *text2;
  int rc;
  const char *fix;
} refusal;

#define FIX_URL "correct the store URL"
#define FIX_ENCODE                                                             \
  "correct the store URL; a '/', '@' or ':' in a password must be "            \
  "percent-encoded (%2F, %40, %3A)"

/* The server's, after "FATAL:" (or "ERROR:"): the ones that pass. */
static const char *const server_passing[] = {
    "the database system is", /* starting up, shutting down, in recovery */
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    "terminating connection",
    "out of memory",
    "could not fork",
    NULL};

/* The server's refusals that retrying cannot change. */
static const refusal server_refusals[] = {
    {"password authentication failed", NULL, IDEM_ESTORE,
     "correct the password (in the URL, PGPASSWORD or ~/.pgpass)"},
    {"no pg_hba.conf entry", NULL, IDEM_ESTORE,
     "the server's pg_hba.conf has no line that lets this user connect to "
     "this database from this host"},
    {"pg_hba.conf rejects", NULL, IDEM_ESTORE,
     "the server's pg_hba.conf rejects this user here"},
    {"authentication failed", NULL, IDEM_ESTORE,
     "check the user's credentials and the server's pg_hba.conf"},
    {"role \"", "does not exist", IDEM_ESTORE,
     "create the role, or correct the user in the URL"},
    {"database \"", "does not exist", IDEM_ESTORE,
     "create the database, or correct its name in the URL"},
    {"not permitted to log in", NULL, IDEM_ESTORE, "the role needs LOGIN"},
    {"permission denied for database", NULL, IDEM_ESTORE,
     "the role needs the CONNECT privilege on the database"},
    {NULL, NULL, IDEM_ESTORE,
     "the server refused the connection as configured; correct the URL "
     "or the server's settings"}};

/* libpq's own, before or while connecting. */
static const refusal client_refusals[] = {
    /* Options that cannot be used as given. */
    {"^invalid integer value", "\"port\"", IDEM_EURL, FIX_ENCODE},
    {"^invalid ", NULL, IDEM_EURL, FIX_URL},
    {"^could not match ", NULL, IDEM_EURL, FIX_URL},
    {"^could not parse network address", NULL, IDEM_EURL, FIX_URL},
    {"^missing \"=\"", NULL, IDEM_EURL, FIX_URL},
    {"^unterminated quoted string", NULL, IDEM_EURL, FIX_URL},
    {"service", "not found", IDEM_EURL, FIX_URL},
    {"service file", NULL, IDEM_EURL, FIX_URL},
    {"socket path", "too long", IDEM_EURL, FIX_URL},
    {"when SSL support is not compiled in", NULL, IDEM_EURL, FIX_URL},
    {"when GSSAPI support is not compiled in", NULL, IDEM_EURL, FIX_URL},
    /* Failures on the way, which pass. */
    {"SSL SYSCALL", NULL, IDEM_EUNAVAILABLE, NULL},
    {"closed unexpectedly", NULL, IDEM_EUNAVAILABLE, NULL},
    {"EOF detected", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not receive data", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not send", NULL, IDEM_EUNAVAILABLE, NULL},
    {"write to server failed", NULL, IDEM_EUNAVAILABLE, NULL},
    {"timeout expired", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not translate host name", NULL, IDEM_EUNAVAILABLE, NULL},
    /* Authentication and encryption as the URL asks for them. */
    {"no password supplied", NULL, IDEM_ESTORE,
     "the server asks for a password: give it in the URL, PGPASSWORD or "
     "~/.pgpass"},
    {"channel binding", NULL, IDEM_ESTORE,
     "the server's authentication does not allow the channel_binding that "
     "the URL asks for"},
    {"certificate", NULL, IDEM_ESTORE,
     "check the certificates named in the URL (sslrootcert, sslcert) and "
     "the server's"},
    {"private key", NULL, IDEM_ESTORE,
     "check the private key named in the URL (sslkey)"},
    {"but SSL was required", NULL, IDEM_ESTORE,
     "the server does not offer SSL: change sslmode or the server"},
    {"GSSAPI", NULL, IDEM_ESTORE,
     "the server cannot do the GSSAPI encryption the URL asks for: change "
     "gssencmode or the server"},
    {"SCRAM", NULL, IDEM_ESTORE,
     "check the user's credentials and the server's pg_hba.conf"},
    {"authentication method", NULL, IDEM_ESTORE,
     "the server asks for an authentication method this libpq does not "
     "support; change pg_hba.conf"},
    {"requirepeer", NULL, IDEM_ESTORE, "correct requirepeer in the URL"},
    {"out of memory", NULL, IDEM_ENOMEM, NULL},
    {NULL, NULL, IDEM_EUNAVAILABLE, NULL}};

static const refusal *find_refusal(const refusal *table, const char *text) {
  for (; table->text; table++) {
    const char *t = table->text;
    if ((t[0] == '^' ? !strncmp(text, t + 1, strlen(t + 1))
                     : strstr(text, t) != NULL) &&
        (!table->text2 || strstr(text, table->text2)))
      return table;
  }
  return table;
}

/* A host name that no resolver would look up: libpq took a piece of the
 * URL (a password with an unencoded '@', say) for one. */
static int malformed_host(const char *line) {
  const char *h = strstr(line, "could not translate host name \"");
  if (!h)
    return 0;
  for (h += 31; *h && *h != '"'; h++)
    if (!is_word_char(*h) && *h != '.' && *h != '-' && *h != '_')
      return 1;
  return 0;
}

/* Whether a line is the server's: libpq writes its severity ("FATAL",
 * or its translation) and two spaces before the server's text, and no
 * message of its own has that shape. */
static int server_said(const char *line) {
  const char *colon = strchr(line, ':');
  return colon && colon > line && !strncmp(colon, ":  ", 3) &&
         !memchr(line, '"', (size_t)(colon - line));
}

/*
 * Classifies libpq's message for a failed connection (msg, as
 * PQerrorMessage() gives it: one line per host tried, each perhaps
 * followed by indented or DETAIL/HINT lines). A line that cannot pass
 * decides over lines that can: with several hosts, one that refuses this
 * user will refuse it again. *fix is what to do, or NULL.
 */
static int connect_failure(const char *msg, const char **fix) {
  int rc = IDEM_EUNAVAILABLE;
  *fix = NULL;
  for (const char *line = msg; line && *line;) {
    const char *end = strchr(line, '\n'), *d = line, *p;
    char text[ERR_SIZE];
    const refusal *r;
    size_t n = end ? (size_t)(end - line) : strlen(line);
    if (n >= sizeof text)
      n = sizeof text - 1;
    memcpy(text, line, n);
    text[n] = '\0';
    line = end ? end + 1 : NULL;
    if (isspace((unsigned char)text[0]) || !strncmp(text, "DETAIL:", 7) ||
        !strncmp(text, "HINT:", 5) || !text[0])
      continue;
    /* "connection to server on socket "..." failed: " and the like. */
    if (!strncmp(text, "connection to server ", 21) &&
        (p = strstr(text, " failed: ")))
      d = p + 9;
    else
      d = text;
    if (server_said(d)) {
      int passing = 0;
      for (int i = 0; server_passing[i]; i++)
        passing |= strstr(d, server_passing[i]) != NULL;
      if (passing)
        continue;
      r = find_refusal(server_refusals, d);
    } else if (malformed_host(d)) {
      *fix = FIX_ENCODE;
      return IDEM_EURL;
    } else {
      r = find_refusal(client_refusals, d);
    }
    if (r->rc == IDEM_EURL || r->rc == IDEM_ESTORE) {
      *fix = r->fix;
      return r->rc;
    }
    if (r->rc == IDEM_ENOMEM)
      rc = IDEM_ENOMEM;
  }
  return rc;
}

/* The error of a connection that could not be made (or made again, when
 * again is set), classified by connect_failure(). */
static int connect_fail(PGconn *pg, int again, char *err) {
  char text[ERR_SIZE];
  const char *fix;
  const char *msg = pg ? PQerrorMessage(pg) : "out of memory";
  int rc = connect_failure(msg, &fix);
  oneline(text, sizeof text, msg);
  if (fix)
    return failf(err, rc,
                 "postgresql: cannot %s: %s; %s (retrying will not help)",
                 again ? "reconnect" : "connect", text, fix);
  return failf(err, rc, "postgresql: cannot %s: %s",
               again ? "reconnect" : "connect", text);
}

/* ---- SQL text ------------------------------------------------------------ */

/* Replaces every "{S}" in tmpl with the quoted schema name. The name was
 * validated at open ([a-z_][a-z0-9_]*), so quoting it cannot go wrong. */
static char *build_sql(const char *tmpl, const char *schema) {
  size_t n = 0, slen = strlen(schema) + 2;
  const char *p;
  char *out, *q;
  for (p = tmpl; (p = strstr(p, "{S}")); p += 3)
    n++;
  out = malloc(strlen(tmpl) + n * slen + 1);
  if (!out)
    return NULL;
  for (p = tmpl, q = out; *p;) {
    if (!strncmp(p, "{S}", 3)) {
      q += sprintf(q, "\"%s\"", schema);
      p += 3;
    } else {
      *q++ = *p++;
    }
  }
  *q = '\0';
  return out;
}

/* ---- parameters ---------------------------------------------------------- */

/* Text parameters go in text format, bytea in binary (no escaping). */
typedef struct params {
  int n;
  const char *v[MAX_PARAMS];
  int len[MAX_PARAMS];
  int fmt[MAX_PARAMS];
  char num[MAX_PARAMS][24];
} params;

static void p_text(params *p, const char *t) {
  p->v[p->n] = t;
  p->len[p->n] = 0;
  p->fmt[p->n] = 0;
  p->n++;
}

static void p_i64(params *p, int64_t x) {
  snprintf(p->num[p->n], sizeof p->num[0], "%lld", (long long)x);
  p_text(p, p->num[p->n]);
}

/* NULL data is SQL NULL; empty data is an empty bytea. */
static void p_bytes(params *p, const void *b, size_t n) {
  p->v[p->n] = b ? (n ? (const char *)b : "") : NULL;
  p->len[p->n] = (int)n;
  p->fmt[p->n] = 1;
  p->n++;
}

static void p_id(params *p, const idem_id *id) {
  p_text(p, id->tenant ? id->tenant : "");
  p_text(p, id->operation);
  p_text(p, id->key);
}

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
  p_i64(p, (int64_t)h);
}

static int64_t period(int64_t ms) {
  return ms > MAX_PERIOD_MS ? MAX_PERIOD_MS : ms;
}

/* ---- binary results ------------------------------------------------------ */

/* An integer column of any width (int2, int4, int8); NULL reads as 0. */
static int64_t col_int(const PGresult *r, int row, int col) {
  const unsigned char *p;
  uint64_t v = 0;
  int len;
  if (PQgetisnull(r, row, col))
    return 0;
  p = (const unsigned char *)PQgetvalue(r, row, col);
  len = PQgetlength(r, row, col);
  for (int i = 0; i < len && i < 8; i++)
    v = v << 8 | p[i];
  switch (len) {
  case 2:
    return (int16_t)(uint16_t)v;
  case 4:
    return (int32_t)(uint32_t)v;
  default:
    return (int64_t)v;
  }
}

/* Points at a text or bytea column's bytes; NULL for SQL NULL. */
static const void *col_ptr(const PGresult *r, int row, int col, size_t *len) {
  if (PQgetisnull(r, row, col)) {
    *len = 0;
    return NULL;
  }
  *len = (size_t)PQgetlength(r, row, col);
  return PQgetvalue(r, row, col);
}

/* A copy with one spare NUL, so that text can be printed as is. */
static void *col_dup(const PGresult *r, int row, int col, size_t *len) {
  size_t n;
  const void *b = col_ptr(r, row, col, &n);
  char *p;
  *len = n;
  if (!b)
    return NULL;
  p = malloc(n + 1);
  if (p) {
    if (n)
      memcpy(p, b, n);
    p[n] = '\0';
  }
  return p;
}

static char *col_text(const PGresult *r, int row, int col) {
  size_t n;
  char *t = col_dup(r, row, col, &n);
  return t ? t : idem__strdup("");
}

/* ---- connections --------------------------------------------------------- */

static void ignore_notice(void *arg, const char *message) {
  /* CREATE ... IF NOT EXISTS and friends send notices; a library must not
   * print them on the application's stderr. */
  (void)arg;
  (void)message;
}

/*
 * Per-session settings, applied after every (re)connect, in one round trip.
 *
 * busy_timeout_ms bounds lock waits, as SQLite's busy timeout does; a
 * lock_timeout that the URL, role or database already set is kept.
 *
 * synchronous_commit is at least "on": with "off" the server acknowledges
 * a COMMIT before its WAL is flushed, so a completion reported stored could
 * be lost in a server crash, and a retry would then act a second time;
 * "local" and "remote_write" acknowledge before a synchronous standby has
 * the WAL on disk. "on" and "remote_apply" are kept. Any role may set it
 * for its own session.
 */
static int session_setup(pg_store *s, conn *c, char *err) {
  char ms[24];
  const char *v[1] = {ms};
  PGresult *res;
  int rc = IDEM_OK;
  snprintf(ms, sizeof ms, "%d", s->o.busy_timeout_ms);
  res = PQexecParams(
      c->pg,
      "SELECT CASE WHEN current_setting('lock_timeout') = '0' THEN "
      "set_config('lock_timeout', $1, false) END, CASE WHEN "
      "current_setting('synchronous_commit') IN ('off', 'local', "
      "'remote_write') THEN set_config('synchronous_commit', 'on', false) END",
      1, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK)
    rc = pg_fail(c, res, "session setup", err);
  PQclear(res);
  memset(c->prepared, 0, sizeof c->prepared);
  return rc;
}

static void conn_close(conn *c) {
  if (!c)
    return;
  PQfinish(c->pg);
  free(c);
}

static int conn_open(pg_store *s, conn **out, char *err) {
  /* Listed before dbname, so that the URL or conninfo may override them. */
  const char *const kw[] = {"connect_timeout", "fallback_application_name",
                            "dbname", NULL};
  const char *const val[] = {"10", "idem", s->conninfo, NULL};
  conn *c = calloc(1, sizeof *c);
  int rc;
  *out = NULL;
  if (!c)
    return failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  c->pg = PQconnectdbParams(kw, val, 1);
  if (!c->pg) {
    free(c);
    return failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  }
  if (PQstatus(c->pg) != CONNECTION_OK) {
    rc = connect_fail(c->pg, 0, err);
    conn_close(c);
    return rc;
  }
  PQsetNoticeProcessor(c->pg, ignore_notice, NULL);
  rc = session_setup(s, c, err);
  if (rc != IDEM_OK) {
    conn_close(c);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

/* Re-establishes a lost connection in place. */
static int conn_revive(pg_store *s, conn *c, char *err) {
  PQreset(c->pg);
  if (PQstatus(c->pg) != CONNECTION_OK)
    return connect_fail(c->pg, 1, err);
  PQsetNoticeProcessor(c->pg, ignore_notice, NULL);
  return session_setup(s, c, err);
}

/*
 * Checks an idle connection before use. A server that restarted or ended
 * the session closed the socket, but libpq notices only when it reads: so
 * read whatever is pending now, and reconnect if the connection is gone or
 * its server was found read-only.
 */
static int conn_check(pg_store *s, conn *c, char *err) {
  if (c->read_only) {
    c->read_only = 0;
    return conn_revive(s, c, err);
  }
  if (PQstatus(c->pg) == CONNECTION_OK && PQsocket(c->pg) >= 0) {
    struct pollfd pfd;
    PGnotify *note;
    pfd.fd = PQsocket(c->pg);
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) > 0) {
      PQconsumeInput(c->pg);
      while ((note = PQnotifies(c->pg)))
        PQfreemem(note);
    }
  }
  if (PQstatus(c->pg) != CONNECTION_BAD)
    return IDEM_OK;
  return conn_revive(s, c, err);
}

static void pool_drop(pg_store *s, conn *c) {
  conn_close(c);
  pthread_mutex_lock(&s->mu);
  s->nconn--;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static int pool_get(pg_store *s, conn **out, char *err) {
  conn *c = NULL;
  int rc;
  *out = NULL;
  pthread_mutex_lock(&s->mu);
  while (!s->idle && s->nconn >= s->o.max_connections)
    pthread_cond_wait(&s->cv, &s->mu);
  if (s->idle) {
    c = s->idle;
    s->idle = c->next;
    pthread_mutex_unlock(&s->mu);
    rc = conn_check(s, c, err);
    if (rc != IDEM_OK) {
      pool_drop(s, c);
      return rc;
    }
    *out = c;
    return IDEM_OK;
  }
  s->nconn++;
  pthread_mutex_unlock(&s->mu);
  rc = conn_open(s, &c, err);
  if (rc != IDEM_OK) {
    pthread_mutex_lock(&s->mu);
    s->nconn--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

/* Ends whatever transaction is open. A query left running (only the
 * caller's action could leave one) is drained first. */
static void rollback(conn *c) {
  PGTransactionStatusType ts = PQtransactionStatus(c->pg);
  PGresult *res;
  if (ts == PQTRANS_ACTIVE) {
    while ((res = PQgetResult(c->pg)))
      PQclear(res);
    ts = PQtransactionStatus(c->pg);
  }
  if (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR)
    PQclear(PQexec(c->pg, "ROLLBACK"));
}

static void pool_put(pg_store *s, conn *c) {
  if (!c)
    return;
  /* Never hand out a connection inside a transaction. A lost one goes back
   * too: the next pool_get() reconnects it. */
  rollback(c);
  pthread_mutex_lock(&s->mu);
  c->next = s->idle;
  s->idle = c;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- statements ---------------------------------------------------------- */

/*
 * Runs prepared statement which (preparing it first in this session) with
 * binary results. On success *out holds a TUPLES_OK or COMMAND_OK result.
 */
static int prepare(pg_store *s, conn *c, int which, char name[32],
                   char *err) {
  PGresult *res;
  int rc;
  snprintf(name, 32, "idem__%d", which);
  if (c->prepared[which])
    return IDEM_OK;
  res = PQprepare(c->pg, name, s->sql[which], 0, NULL);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    rc = pg_fail(c, res, "prepare", err);
    PQclear(res);
    return rc;
  }
  PQclear(res);
  c->prepared[which] = 1;
  return IDEM_OK;
}

static int run_stmt(pg_store *s, conn *c, int which, const params *p,
                    const char *what, PGresult **out, char *err) {
  char name[32];
  PGresult *res;
  ExecStatusType st;
  int rc;
  *out = NULL;
  if ((rc = prepare(s, c, which, name, err)) != IDEM_OK)
    return rc;
  res = PQexecPrepared(c->pg, name, p->n, p->v, p->len, p->fmt, 1);
  st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    rc = pg_fail(c, res, what, err);
    PQclear(res);
    return rc;
  }
  *out = res;
  return IDEM_OK;
}

/* One prepared statement of a pipeline (p may be NULL: no parameters). */
typedef struct step {
  int which;
  const params *p;
} step;

static const params no_params;

#define MAX_STEPS 4

/*
 * One round trip for up to MAX_STEPS statements, sent together in libpq's
 * pipeline mode. On success *out holds the result of step `keep` and
 * last_tag (may be NULL) the command tag of the last step, e.g. "COMMIT"
 * or "ROLLBACK". The first failure is reported (the statements after it
 * are not run). When the connection breaks on the way, nobody can tell
 * whether a COMMIT in it ran: the result is IDEM_EUNAVAILABLE.
 */
static int run_steps(pg_store *s, conn *c, const step *st, int n, int keep,
                     const char *what, PGresult **out, char *last_tag,
                     char *err) {
  PGresult *res[MAX_STEPS] = {NULL}, *r;
  char name[MAX_STEPS][32];
  int rc = IDEM_OK, i;

  *out = NULL;
  c->failed_step = -1;
  if (last_tag)
    last_tag[0] = '\0';
  for (i = 0; i < n; i++)
    if ((rc = prepare(s, c, st[i].which, name[i], err)) != IDEM_OK)
      return rc;
  if (!PQenterPipelineMode(c->pg))
    return pg_fail(c, NULL, what, err);
  for (i = 0; i < n; i++) {
    const params *p = st[i].p ? st[i].p : &no_params;
    if (!PQsendQueryPrepared(c->pg, name[i], p->n, p->v, p->len, p->fmt, 1))
      goto broken;
  }
  if (!PQpipelineSync(c->pg))
    goto broken;
  /* Each query's result is followed by a NULL; then the sync's result. */
  for (i = 0; i < n; i++) {
    if (!(res[i] = PQgetResult(c->pg)))
      goto broken;
    while ((r = PQgetResult(c->pg)) != NULL)
      PQclear(r);
  }
  r = PQgetResult(c->pg);
  if (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
    PQclear(r);
    goto broken;
  }
  PQclear(r);
  PQexitPipelineMode(c->pg);
  /* The first failure explains the rest (later ones are "aborted"). */
  for (i = 0; i < n; i++) {
    ExecStatusType es = PQresultStatus(res[i]);
    if (es != PGRES_TUPLES_OK && es != PGRES_COMMAND_OK) {
      c->failed_step = i;
      rc = pg_fail(c, res[i],
                   st[i].which == ST_BEGIN    ? "begin"
                   : st[i].which == ST_COMMIT ? "commit"
                                              : what,
                   err);
      break;
    }
  }
  if (rc == IDEM_OK && last_tag)
    snprintf(last_tag, 16, "%s", PQcmdStatus(res[n - 1]));
  if (rc == IDEM_OK) {
    *out = res[keep];
    res[keep] = NULL;
  }
  for (i = 0; i < n; i++)
    PQclear(res[i]);
  return rc;
broken:
  for (i = 0; i < n; i++)
    PQclear(res[i]);
  /* Drain what can be drained so that the connection leaves pipeline mode;
   * a broken one is re-established before its next use. */
  while (PQstatus(c->pg) != CONNECTION_BAD && (r = PQgetResult(c->pg)))
    PQclear(r);
  PQexitPipelineMode(c->pg);
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    char text[ERR_SIZE];
    oneline(text, sizeof text, PQerrorMessage(c->pg));
    return failf(err, IDEM_EUNAVAILABLE,
                 "postgresql: %s: the connection was lost%s: %s", what,
                 st[n - 1].which == ST_COMMIT
                     ? "; whether it committed is unknown"
                     : "",
                 text);
  }
  return pg_fail(c, NULL, what, err);
}

/* After a failure *rc on c: whether the connection was found dead and is
 * re-established, so that a statement safe to send twice may be sent
 * again. When it cannot be, *rc and err say why. */
static int revived(pg_store *s, conn *c, int *rc, char *err) {
  int again;
  if (*rc != IDEM_EUNAVAILABLE || PQstatus(c->pg) != CONNECTION_BAD ||
      PQtransactionStatus(c->pg) != PQTRANS_UNKNOWN)
    return 0;
  if ((again = conn_revive(s, c, err)) == IDEM_OK)
    return 1;
  /* The server refuses the new session as configured (a role that lost
   * LOGIN, say): that is the caller's answer now, not "retry later". */
  *rc = again;
  return 0;
}

/* run_stmt() for statements that are safe to send twice (reads): sent once
 * more on a connection found dead and re-established. */
static int run_stmt_retry(pg_store *s, conn *c, int which, const params *p,
                          const char *what, PGresult **out, char *err) {
  int rc = run_stmt(s, c, which, p, what, out, err);
  if (revived(s, c, &rc, err))
    rc = run_stmt(s, c, which, p, what, out, err);
  return rc;
}

/* Transaction control: no data, so a simple query. */
static int run_simple(conn *c, const char *sql, const char *what, char *err) {
  PGresult *res = PQexec(c->pg, sql);
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    rc = pg_fail(c, res, what, err);
  PQclear(res);
  return rc;
}

/* READ COMMITTED whatever the session's default: each statement must see
 * rows committed by concurrent claimers, and no serialization failure may
 * reach the caller. */
static int begin(conn *c, char *err) {
  return run_simple(c, "BEGIN ISOLATION LEVEL READ COMMITTED", "begin", err);
}

/*
 * Commits. When the connection breaks during COMMIT nobody can tell whether
 * the transaction committed, and the caller must not believe it did.
 */
static int commit(conn *c, char *err) {
  PGresult *res = PQexec(c->pg, "COMMIT");
  char text[ERR_SIZE];
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    if (PQstatus(c->pg) == CONNECTION_BAD) {
      oneline(text, sizeof text, PQerrorMessage(c->pg));
      rc = failf(err, IDEM_EUNAVAILABLE,
                 "postgresql: the connection was lost during commit; "
                 "whether it committed is unknown: %s",
                 text);
    } else {
      rc = pg_fail(c, res, "commit failed, nothing was stored", err);
    }
  } else if (strcmp(PQcmdStatus(res), "COMMIT") != 0) {
    /* COMMIT of a failed transaction answers ROLLBACK. */
    rc = failf(err, IDEM_ESTORE,
               "postgresql: commit failed, nothing was stored: the "
               "transaction was rolled back");
  }
  PQclear(res);
  return rc;
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
  p_id(&p, op->id);
  p_text(&p, op->fingerprint);
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
    rc = begin_too ? run_steps(s, c, st, nst, nst - 1, "read record", &res,
                               NULL, op->errmsg)
                   : run_stmt(s, c, which, &p, "read record", &res,
                              op->errmsg);
    if (tries > 0 || !(begin_too || which == ST_PEEK) ||
        !revived(s, c, &rc, op->errmsg))
      break;
  }
  if (rc != IDEM_OK)
    return op->rc = rc;
  if (PQntuples(res) > 0) {
    size_t n;
    const void *fp = col_ptr(res, 0, 0, &n);
    *found = 1;
    row->exists = 1;
    snprintf(row->fingerprint, sizeof row->fingerprint, "%.*s",
             (int)(n < IDEM_FINGERPRINT_SIZE ? n : IDEM_FINGERPRINT_SIZE - 1),
             fp ? (const char *)fp : "");
    row->state = (int)col_int(res, 0, 1);
    row->attempt = (int)col_int(res, 0, 2);
    row->lease_expires_ms = col_int(res, 0, 3);
    row->expires_ms = col_int(res, 0, 4);
    now = col_int(res, 0, 9);
  }
  cl->outcome = idem__decide(row, op->fingerprint, now, &op->opts, action,
                             &cl->retry_after_ms);
  cl->attempt = row->attempt;
  if (cl->outcome == IDEM_IN_FLIGHT && cl->retry_after_ms < 1)
    cl->retry_after_ms = 1;
  if (cl->outcome == IDEM_REPLAY) {
    int status = (int)col_int(res, 0, 5);
    size_t meta_len, body_len, sum_len;
    const void *meta = col_ptr(res, 0, 6, &meta_len);
    const void *body = col_ptr(res, 0, 7, &body_len);
    const char *sum = col_ptr(res, 0, 8, &sum_len);
    char want[IDEM_FINGERPRINT_SIZE];
    if (idem__response_checksum(row->fingerprint, status, meta, meta_len, body,
                                body_len, want) != IDEM_OK ||
        !sum || sum_len != IDEM_FINGERPRINT_SIZE - 1 ||
        memcmp(sum, want, sum_len) != 0) {
      PQclear(res);
      return idem__op_fail(op, IDEM_ECORRUPT,
                           "record (%s, %s, %s): the stored response does "
                           "not match its checksum; it is not replayed",
                           op->id->tenant ? op->id->tenant : "",
                           op->id->operation, op->id->key);
    }
    if (idem__claim_set_response(cl, status, meta_len ? meta : NULL, meta_len,
                                 body, body_len) != IDEM_OK) {
      PQclear(res);
      return idem__op_fail(op, IDEM_ENOMEM, "out of memory");
    }
    idem__cache_put(s->cache, op->id, row->fingerprint,
                    cache_deadline(sent, row->expires_ms - now), row->attempt,
                    status, meta_len ? meta : NULL, meta_len, body, body_len);
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
  p_id(&p, op->id);
  p_text(&p, op->claim->token);
  p_i64(&p, period(op->opts.lease_ms));
  if ((rc = run_stmt(s, c, ST_RENEW, &p, "read record", &res, op->errmsg)) !=
      IDEM_OK)
    return op->rc = rc;
  *held = atoi(PQcmdTuples(res)) == 1;
  if (*held && PQntuples(res) > 0)
    op->claim->lease_expires_ms = col_int(res, 0, 0);
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
 * response (checksum sum). ST_UNKNOWN: it is marked unknown at this
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
  p_id(&p, op->id);
  if ((rc = run_stmt(s, c, ST_HOLDER, &p, "read record", &res, op->errmsg)) !=
      IDEM_OK)
    return op->rc = rc;
  if (PQntuples(res) == 0) {
    *done = which == ST_RELEASE;
  } else {
    state = (int)col_int(res, 0, 0);
    v = col_ptr(res, 0, 1, &n);
    fp = col_ptr(res, 0, 2, &fn);
    if (which == ST_UNKNOWN)
      *done = state == IDEM_STATE_UNKNOWN &&
              (int)col_int(res, 0, 3) == op->claim->attempt;
    else if (which == ST_COMPLETE)
      *done = state == IDEM_STATE_COMPLETED && sum && v && n == strlen(sum) &&
              memcmp(v, sum, n) == 0 && fp && fn == strlen(op->fingerprint) &&
              memcmp(fp, op->fingerprint, fn) == 0;
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
  p_id(&p, op->id);
  p_text(&p, op->fingerprint);
  p_bytes(&p, op->opts.request, op->opts.request_len);
  p_text(&p, op->claim->token);
  p_i64(&p, period(op->opts.lease_ms));
  p_i64(&p, period(op->opts.retention_ms));
  if (begin_too) {
    /* Only a local action's insert begins a transaction: it takes its
     * key's advisory lock first, as run_claim()'s first read does. */
    params lk = {0};
    step st[3] = {{ST_BEGIN, NULL}, {ST_KEY_LOCK, &lk}, {ST_INSERT, &p}};
    p_lock_key(&lk, s->schema, op->id);
    rc = run_steps(s, c, st, 3, 2, "write claim", &res, NULL, op->errmsg);
  } else {
    /* On its own (a claim's), or inside a local action's transaction. */
    int own = PQtransactionStatus(c->pg) == PQTRANS_IDLE;
    rc = run_stmt(s, c, ST_INSERT, &p, "write claim", &res, op->errmsg);
    if (own && revived(s, c, &rc, op->errmsg)) {
      /* It commits by itself and may have done so before the connection
       * died: send it again, and if the key is taken, see whether it is
       * this claim that took it. (A transaction that died is gone: its
       * statements are never sent again outside it.) */
      rc = run_stmt(s, c, ST_INSERT, &p, "write claim", &res, op->errmsg);
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
    op->claim->lease_expires_ms = col_int(res, 0, 0);
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
  p_id(&p, op->id);
  if (action == IDEM__ACT_INSERT) {
    p_text(&p, op->fingerprint);
    p_bytes(&p, op->opts.request, op->opts.request_len);
    p_text(&p, cl->token);
    p_i64(&p, period(op->opts.lease_ms));
    p_i64(&p, period(op->opts.retention_ms));
    rc = run_stmt(s, c, ST_REPLACE, &p, "write claim", &res, op->errmsg);
    if (rc == IDEM_OK) {
      cl->attempt = 1;
      if (PQntuples(res) > 0)
        cl->lease_expires_ms = col_int(res, 0, 0);
    }
  } else {
    p_text(&p, cl->token);
    p_i64(&p, period(op->opts.lease_ms));
    p_i64(&p, period(op->opts.retention_ms));
    rc = run_stmt(s, c, ST_TAKEOVER, &p, "write claim", &res, op->errmsg);
    if (rc == IDEM_OK) {
      cl->attempt =
          PQntuples(res) > 0 ? (int)col_int(res, 0, 0) : cl->attempt + 1;
      if (PQntuples(res) > 0)
        cl->lease_expires_ms = col_int(res, 0, 1);
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
  p_id(p, op->id);
  if (which == ST_INSERT_DONE) {
    p_text(p, op->fingerprint);
    p_bytes(p, op->opts.request, op->opts.request_len);
  } else {
    p_text(p, op->claim->token);
  }
  if (which != ST_COMPLETE_LOCAL)
    p_i64(p, period(op->opts.retention_ms));
  p_i64(p, r->status);
  p_bytes(p, r->meta, r->meta_len);
  p_bytes(p, r->body_len ? r->body : "", r->body_len);
  p_text(p, sum);
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
  int changed, done = 0, rc = run_stmt(s, c, which, p, what, &res, op->errmsg);
  if (own && revived(s, c, &rc, op->errmsg)) {
    /* It may have committed before the connection died. Sent again, it
     * changes nothing if so (the row is no longer held under the token),
     * and the row then tells. */
    rc = run_stmt(s, c, which, p, what, &res, op->errmsg);
  }
  if (rc != IDEM_OK)
    return op->rc = rc;
  changed = atoi(PQcmdTuples(res));
  if (which == ST_RENEW && changed > 0 && PQntuples(res) > 0)
    op->claim->lease_expires_ms = col_int(res, 0, 0);
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
  p_id(&p, op->id);
  p_text(&p, op->claim->token);
  if (which == ST_RENEW)
    p_i64(&p, period(op->lease_ms));
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
  rc = run_steps(s, c, st, 2, 0, "complete", &res, tag, op->errmsg);
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
  ts = PQtransactionStatus(c->pg);
  /* A lost connection is checked first: an action that fails because its
   * statement could not reach the server was not rejected, and a retry is
   * safe, since nothing of it was committed. */
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    oneline(text, sizeof text, PQerrorMessage(c->pg));
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
  if ((r->meta_len && !r->meta) || (r->body_len && !r->body))
    return idem__op_fail(op, IDEM_EINVAL,
                         "action's response: NULL data with "
                         "a length");
  if (r->meta_len + r->body_len > IDEM_MAX_RESPONSE)
    return idem__op_fail(
        op, IDEM_ETOOBIG,
        "action's response: %zu bytes; a record keeps at most %u",
        r->meta_len + r->body_len, IDEM_MAX_RESPONSE);
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
  p_id(&p, op->id);
  p_text(&p, op->fingerprint);
  p_bytes(&p, op->opts.request, op->opts.request_len);
  p_i64(&p, period(op->opts.retention_ms));
  memcpy(why, op->errmsg, sizeof why);
  if (run_stmt(s, c, ST_INSERT_UNKNOWN, &p, "mark unknown", &res,
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
  if (load_and_decide(s, c, op, ST_PEEK, 0, &found, &row, &action) ==
          IDEM_OK &&
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
  if (call_action(c, op, &r) != IDEM_OK) {
    if (op->rc == IDEM_EUNAVAILABLE)
      return 1;
    if (PQtransactionStatus(c->pg) == PQTRANS_IDLE) {
      mark_self_ended(s, c, op);
      return 1;
    }
    /* The action may have failed on the racing claimer's rows. */
    rollback(c);
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
    rollback(c);
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
                  cache_deadline(sent, period(op->opts.retention_ms)), 1,
                  r.status, r.meta, r.meta_len, r.body, r.body_len);
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
  if (run_stmt(s, c, ST_PRUNE_SOME, &p, "prune", &res, err) == IDEM_OK)
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
      rollback(c);
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
      rollback(c);
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
  } else if (action == IDEM__ACT_NONE) {
    /* Decided on the locked row: nothing to write. */
    rollback(c);
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
  if ((op->rc = commit(c, op->errmsg)) != IDEM_OK) {
    /* The answer to COMMIT was lost with the connection: the row tells
     * whether this claim holds the key. */
    int held = 0;
    if (!revived(s, c, &op->rc, op->errmsg) ||
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
  cl->held = 1;
done:
  if (op->rc == IDEM_OK) {
    prune_some(s, c);
    return;
  }
fail:
  cl->held = 0;
  rollback(c);
}

static void pg_run(void *state, idem__op *op) {
  pg_store *s = state;
  conn *c = NULL;
  int rc;
  if ((op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL) &&
      idem__cache_get(s->cache, op, mono_ms()))
    return;
  rc = pool_get(s, &c, op->errmsg);
  if (rc != IDEM_OK) {
    op->rc = rc;
    scrub(s, op->errmsg, sizeof op->errmsg);
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
  pool_put(s, c);
  if (op->rc != IDEM_OK)
    scrub(s, op->errmsg, sizeof op->errmsg);
}

/* ---- target -------------------------------------------------------------- */

/* Checks an idem_schema value: an unquoted PostgreSQL identifier that
 * needs no quoting, outside the names PostgreSQL reserves. */
static int check_schema(const char *name, size_t len, char *err) {
  int ok = len >= 1 && len <= SCHEMA_MAX &&
           ((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_');
  for (size_t i = 1; ok && i < len; i++)
    ok = (name[i] >= 'a' && name[i] <= 'z') ||
         (name[i] >= '0' && name[i] <= '9') || name[i] == '_';
  if (!ok)
    return failf(err, IDEM_EURL,
                 "store: idem_schema '%.*s' is not a valid schema name; use "
                 "1-63 characters of a-z, 0-9 and _, not starting with a "
                 "digit",
                 (int)(len > 80 ? 80 : len), name);
  if (len >= 3 && !strncmp(name, "pg_", 3))
    return failf(err, IDEM_EURL,
                 "store: idem_schema '%.*s': names starting with pg_ are "
                 "reserved by PostgreSQL",
                 (int)len, name);
  return IDEM_OK;
}

static int take_schema(const char *v, size_t len, int *seen, char *schema,
                       char *err) {
  int rc;
  if (*seen)
    return failf(err, IDEM_EURL, "store: idem_schema is given twice");
  *seen = 1;
  if ((rc = check_schema(v, len, err)) != IDEM_OK)
    return rc;
  memcpy(schema, v, len);
  schema[len] = '\0';
  return IDEM_OK;
}

/* postgresql://...?a=1&idem_schema=x&b=2 -> postgresql://...?a=1&b=2 */
static int strip_url(const char *target, char *out, char *schema, int *seen,
                     char *err) {
  const char *q = strchr(target, '?');
  const char *p, *end;
  size_t o;
  int first = 1, rc;
  if (!q) {
    strcpy(out, target);
    return IDEM_OK;
  }
  o = (size_t)(q - target);
  memcpy(out, target, o);
  for (p = q + 1;; p = end + 1) {
    size_t n;
    end = strchr(p, '&');
    n = end ? (size_t)(end - p) : strlen(p);
    if (n >= 11 && !strncmp(p, "idem_schema", 11) &&
        (n == 11 || p[11] == '=')) {
      rc = take_schema(n > 11 ? p + 12 : p + 11, n > 11 ? n - 12 : 0, seen,
                       schema, err);
      if (rc != IDEM_OK)
        return rc;
    } else if (n > 0) {
      out[o++] = first ? '?' : '&';
      memcpy(out + o, p, n);
      o += n;
      first = 0;
    }
    if (!end)
      break;
  }
  out[o] = '\0';
  return IDEM_OK;
}

/* "host=h idem_schema=x dbname=d" -> "host=h dbname=d", following libpq's
 * conninfo syntax: keyword = value, values optionally single-quoted with
 * backslash escapes. */
static int strip_conninfo(const char *target, char *out, char *schema,
                          int *seen, char *err) {
  const char *p = target;
  size_t o = 0;
  int rc;
  while (*p) {
    const char *tok, *kw_end, *val, *val_end;
    while (isspace((unsigned char)*p))
      p++;
    if (!*p)
      break;
    tok = p;
    while (*p && *p != '=' && !isspace((unsigned char)*p))
      p++;
    kw_end = p;
    while (isspace((unsigned char)*p))
      p++;
    if (*p != '=') {
      /* Not keyword=value: leave it, and the rest, for libpq to judge. */
      p = tok + strlen(tok);
      if (o)
        out[o++] = ' ';
      memcpy(out + o, tok, (size_t)(p - tok));
      o += (size_t)(p - tok);
      break;
    }
    p++;
    while (isspace((unsigned char)*p))
      p++;
    val = p;
    if (*p == '\'') {
      for (p++; *p && *p != '\''; p++)
        if (*p == '\\' && p[1])
          p++;
      val_end = p;
      val++;
      if (*p)
        p++;
    } else {
      for (; *p && !isspace((unsigned char)*p); p++)
        if (*p == '\\' && p[1])
          p++;
      val_end = p;
    }
    if (kw_end - tok == 11 && !strncmp(tok, "idem_schema", 11)) {
      rc = take_schema(val, (size_t)(val_end - val), seen, schema, err);
      if (rc != IDEM_OK)
        return rc;
      continue;
    }
    if (o)
      out[o++] = ' ';
    memcpy(out + o, tok, (size_t)(p - tok));
    o += (size_t)(p - tok);
  }
  out[o] = '\0';
  return IDEM_OK;
}

/*
 * Splits the target into what libpq gets and idem's schema name, and lets
 * libpq check the syntax, so that a malformed URL is reported as such rather
 * than as an unreachable server. The target is never echoed: it may hold a
 * password.
 */
static int parse_target(pg_store *s, const char *target, char *err) {
  int is_url = !strncmp(target, "postgresql://", 13) ||
               !strncmp(target, "postgres://", 11);
  int seen = 0, rc;
  char *msg = NULL;
  PQconninfoOption *opts;

  collect_secrets(s, target);
  if (s->secret_nomem)
    return failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  /* Room for a separator per token: the output may gain a space where
   * the input had a quoted value directly followed by the next keyword. */
  s->conninfo = malloc(2 * strlen(target) + 2);
  if (!s->conninfo)
    return failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  strcpy(s->schema, "idem");
  rc = is_url ? strip_url(target, s->conninfo, s->schema, &seen, err)
              : strip_conninfo(target, s->conninfo, s->schema, &seen, err);
  if (rc != IDEM_OK)
    return rc;
  /* A bare word is a database name (libpq's rule for dbname). */
  if (!is_url && !strchr(s->conninfo, '='))
    return IDEM_OK;
  opts = PQconninfoParse(s->conninfo, &msg);
  if (!opts) {
    char text[ERR_SIZE];
    oneline(text, sizeof text, msg ? msg : "out of memory");
    PQfreemem(msg);
    return failf(err, msg ? IDEM_EURL : IDEM_ENOMEM, "store: %s", text);
  }
  /* The passwords as libpq read them, whatever the syntax. */
  for (PQconninfoOption *o = opts; o->keyword; o++)
    if (o->val && password_keyword(o->keyword, strlen(o->keyword)))
      add_secret(s, o->val, strlen(o->val));
  PQconninfoFree(opts);
  if (s->secret_nomem)
    return failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  return IDEM_OK;
}

/* ---- schema -------------------------------------------------------------- */

/* The stored schema version; 0 when idem's tables do not exist yet. */
static int read_version(pg_store *s, conn *c, int *version, char *err) {
  char meta[SCHEMA_MAX + 32];
  const char *v[1] = {meta};
  PGresult *res;
  int exists, rc = IDEM_OK;
  *version = 0;
  snprintf(meta, sizeof meta, "\"%s\".idem_meta", s->schema);
  res = PQexecParams(c->pg, "SELECT to_regclass($1) IS NOT NULL", 1, NULL, v,
                     NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = pg_fail(c, res, "schema", err);
    PQclear(res);
    return rc;
  }
  exists = PQntuples(res) == 1 && !strcmp(PQgetvalue(res, 0, 0), "t");
  PQclear(res);
  if (!exists)
    return IDEM_OK;
  res = PQexec(c->pg, s->sql_version);
  if (PQresultStatus(res) != PGRES_TUPLES_OK)
    rc = pg_fail(c, res, "schema", err);
  else if (PQntuples(res) > 0)
    *version = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return rc;
}

static int newer_schema(pg_store *s, int version, char *err) {
  return failf(err, IDEM_ESCHEMA,
               "store: schema \"%s\" has version %d; this idem knows up to "
               "%d; the store was left untouched",
               s->schema, version, SCHEMA_VERSION);
}

/*
 * Creates or migrates the schema. An up-to-date store is only read, so a
 * role without CREATE rights can use a schema prepared by an operator.
 * Otherwise the work runs in one transaction under an advisory lock: many
 * processes opening a fresh database at once would else race on the
 * catalogs (CREATE ... IF NOT EXISTS is not safe against concurrent
 * creation), and a half-created schema is never visible.
 */
static int ensure_schema(pg_store *s, conn *c, char *err) {
  const char *v[1] = {s->schema};
  char what[SCHEMA_MAX + 48];
  PGresult *res;
  int version, rc;

  if ((rc = read_version(s, c, &version, err)) != IDEM_OK)
    return rc;
  if (version > SCHEMA_VERSION)
    return newer_schema(s, version, err);
  if (version == SCHEMA_VERSION)
    return IDEM_OK;

  if ((rc = begin(c, err)) != IDEM_OK)
    return rc;
  res = PQexecParams(c->pg,
                     "SELECT pg_advisory_xact_lock(" SCHEMA_LOCK_CLASS
                     ", hashtext($1))",
                     1, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = pg_fail(c, res, "schema lock", err);
    PQclear(res);
    goto fail;
  }
  PQclear(res);
  snprintf(what, sizeof what, "creating schema \"%s\"", s->schema);
  /* Once a version is written the schema and idem_meta exist; creating
   * them IF NOT EXISTS would still take the right to create them. */
  if (version < 1 && (rc = run_simple(c, s->sql_meta, what, err)) != IDEM_OK)
    goto fail;
  /* Read again under the lock: another process may have just done it. */
  if ((rc = read_version(s, c, &version, err)) != IDEM_OK)
    goto fail;
  if (version > SCHEMA_VERSION) {
    rc = newer_schema(s, version, err);
    goto fail;
  }
  /* Migrations run in order, each inside this one transaction. */
  if (version < 1 && (rc = run_simple(c, s->sql_v1, what, err)) != IDEM_OK)
    goto fail;
  if (version == 1) {
    /*
     * The table exists and may be busy: its exclusive lock is waited for
     * one second at most, since every call on it queues behind the wait.
     * A role that may not alter it (not its owner), or a table too busy,
     * leaves the store at version 1 for now, which this idem uses as it
     * is (version 2 changes no statement); an open by the owner at a
     * quieter moment migrates it.
     */
    snprintf(what, sizeof what, "migrating schema \"%s\" to version 2",
             s->schema);
    if ((rc = run_simple(c, "SET LOCAL lock_timeout = 1000", what, err)) !=
        IDEM_OK)
      goto fail;
    if ((rc = run_simple(c, s->sql_v2, what, err)) != IDEM_OK) {
      if (strcmp(c->sqlstate, "42501") != 0 &&
          strcmp(c->sqlstate, "55P03") != 0)
        goto fail;
      rollback(c);
      return IDEM_OK;
    }
  } else if (version < 2 &&
             (rc = run_simple(c, s->sql_v2, what, err)) != IDEM_OK) {
    goto fail;
  }
  if (version < SCHEMA_VERSION) {
    char sql[SCHEMA_MAX + 200];
    snprintf(sql, sizeof sql,
             "INSERT INTO \"%s\".idem_meta VALUES ('schema_version', '%d') "
             "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
             s->schema, SCHEMA_VERSION);
    if ((rc = run_simple(c, sql, "schema", err)) != IDEM_OK)
      goto fail;
  }
  return commit(c, err);
fail:
  rollback(c);
  return rc;
}

/* ---- open and close ------------------------------------------------------ */

static void pg_close(void *state) {
  pg_store *s = state;
  conn *c;
  if (!s)
    return;
  while ((c = s->idle)) {
    s->idle = c->next;
    conn_close(c);
  }
  for (int i = 0; i < ST_COUNT; i++)
    free(s->sql[i]);
  free(s->sql_meta);
  free(s->sql_v1);
  free(s->sql_v2);
  free(s->sql_version);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s->conninfo);
  for (int i = 0; i < s->nsecret; i++)
    free(s->secret[i]);
  free(s->secret);
  idem__cache_free(s->cache);
  free(s);
}

static int server_version(pg_store *s, conn *c, char *err) {
  PGresult *res = PQexec(c->pg, "SHOW server_version");
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
    rc = pg_fail(c, res, "server version", err);
  } else {
    /* "15.18 (Debian 15.18-1.pgdg120+1)" -> "15.18" */
    const char *v = PQgetvalue(res, 0, 0);
    size_t n = strcspn(v, " ");
    if (n >= sizeof s->version)
      n = sizeof s->version - 1;
    memcpy(s->version, v, n);
    s->version[n] = '\0';
  }
  PQclear(res);
  return rc;
}

static int pg_open(const char *target, const idem_store_options *opts,
                   void **state) {
  pg_store *s = calloc(1, sizeof *s);
  conn *c = NULL;
  char err[ERR_SIZE] = "";
  int rc;
  *state = NULL;
  if (!s)
    return idem__fail(IDEM_ENOMEM, "postgresql: out of memory");
  pthread_mutex_init(&s->mu, NULL);
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
    rc = failf(err, IDEM_ESTORE, "postgresql: this libpq is not thread-safe");
    goto fail;
  }
  if ((rc = parse_target(s, target, err)) != IDEM_OK)
    goto fail;
  for (int i = 0; i < ST_COUNT; i++)
    if (!(s->sql[i] = build_sql(sql_text[i], s->schema)))
      goto nomem;
  s->sql_meta = build_sql(schema_meta, s->schema);
  s->sql_v1 = build_sql(schema_v1, s->schema);
  s->sql_v2 = build_sql(schema_v2, s->schema);
  s->sql_version = build_sql("SELECT value FROM {S}.idem_meta WHERE name = "
                             "'schema_version'",
                             s->schema);
  if (!s->sql_meta || !s->sql_v1 || !s->sql_v2 || !s->sql_version)
    goto nomem;
  if ((rc = conn_open(s, &c, err)) != IDEM_OK ||
      (rc = server_version(s, c, err)) != IDEM_OK ||
      (rc = ensure_schema(s, c, err)) != IDEM_OK)
    goto fail;
  s->nconn = 1;
  c->next = NULL;
  s->idle = c;
  *state = s;
  return IDEM_OK;
nomem:
  rc = failf(err, IDEM_ENOMEM, "postgresql: out of memory");
fail:
  conn_close(c);
  scrub(s, err, sizeof err);
  pg_close(s);
  return idem__fail(rc, "%s", err);
}

static const char *pg_engine_version(void *state) {
  return ((pg_store *)state)->version;
}

/* ---- operators ----------------------------------------------------------- */

/* Reports an operator call's failure, its detail scrubbed. */
static int fail_out(const pg_store *s, int rc, char *err) {
  scrub(s, err, ERR_SIZE);
  return idem__fail(rc, "%s", err);
}

/* Columns in RECORD_COLUMNS order. */
static int row_to_record(const PGresult *q, int i, idem_record **out) {
  idem_record *r = calloc(1, sizeof *r);
  size_t n;
  *out = NULL;
  if (!r)
    return idem__fail(IDEM_ENOMEM, "out of memory");
  r->tenant = col_text(q, i, 0);
  r->operation = col_text(q, i, 1);
  r->key = col_text(q, i, 2);
  r->fingerprint = col_text(q, i, 3);
  r->state = (idem_state)col_int(q, i, 4);
  r->attempt = (int)col_int(q, i, 5);
  r->created_ms = col_int(q, i, 6);
  r->updated_ms = col_int(q, i, 7);
  r->lease_expires_ms = col_int(q, i, 8);
  r->expires_ms = col_int(q, i, 9);
  r->request = col_dup(q, i, 10, &r->request_len);
  if (r->state == IDEM_STATE_COMPLETED) {
    r->has_response = 1;
    r->response.status = (int)col_int(q, i, 11);
    r->response.meta = col_dup(q, i, 12, &n);
    r->response.meta_len = r->response.meta ? n : 0;
    r->response.body = col_dup(q, i, 13, &n);
    r->response.body_len = r->response.body ? n : 0;
  }
  if (!r->tenant || !r->operation || !r->key || !r->fingerprint) {
    idem_record_free(r);
    return idem__fail(IDEM_ENOMEM, "out of memory");
  }
  *out = r;
  return IDEM_OK;
}

static int pg_get(void *state, const idem_id *id, idem_record **out) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int rc = pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  p_id(&p, id);
  rc = run_stmt_retry(s, c, ST_GET, &p, "get", &res, err);
  pool_put(s, c);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  if (PQntuples(res) > 0)
    rc = row_to_record(res, 0, out);
  else
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
  PQclear(res);
  return rc;
}

static int pg_list(void *state, const idem_filter *f, idem_record_fn fn,
                   void *ctx) {
  pg_store *s = state;
  char err[ERR_SIZE], state_s[16];
  char *after_tenant = NULL, *after_op = NULL, *after_key = NULL;
  int64_t after_created = 0, left = f->limit > 0 ? f->limit : -1;
  int first = 1, rc = IDEM_OK;

  snprintf(state_s, sizeof state_s, "%d", f->state);
  while (rc == IDEM_OK && left != 0) {
    int64_t page = left < 0 || left > LIST_PAGE ? LIST_PAGE : left;
    PGresult *res = NULL;
    params p = {0};
    conn *c = NULL;
    int rows;
    p_text(&p, f->tenant);
    p_text(&p, f->operation);
    p_text(&p, state_s);
    p_text(&p, f->expired || f->overdue ? "t" : "f");
    p_text(&p, first ? "t" : "f");
    p_i64(&p, after_created);
    p_text(&p, after_tenant ? after_tenant : "");
    p_text(&p, after_op ? after_op : "");
    p_text(&p, after_key ? after_key : "");
    p_i64(&p, page);
    p_text(&p, f->overdue ? "t" : "f");
    if ((rc = pool_get(s, &c, err)) != IDEM_OK) {
      rc = fail_out(s, rc, err);
      break;
    }
    rc = run_stmt_retry(s, c, ST_LIST, &p, "list", &res, err);
    pool_put(s, c);
    if (rc != IDEM_OK) {
      rc = fail_out(s, rc, err);
      break;
    }
    rows = PQntuples(res);
    for (int i = 0; i < rows && rc == IDEM_OK; i++) {
      idem_record *r = NULL;
      rc = row_to_record(res, i, &r);
      if (rc != IDEM_OK)
        break;
      rc = fn(r, ctx);
      idem_record_free(r);
    }
    if (rc == IDEM_OK && rows > 0) {
      /* The next page starts after this page's last row. */
      free(after_tenant);
      free(after_op);
      free(after_key);
      after_created = col_int(res, rows - 1, 6);
      after_tenant = col_text(res, rows - 1, 0);
      after_op = col_text(res, rows - 1, 1);
      after_key = col_text(res, rows - 1, 2);
      if (!after_tenant || !after_op || !after_key)
        rc = idem__fail(IDEM_ENOMEM, "out of memory");
    }
    PQclear(res);
    first = 0;
    if (left > 0)
      left -= rows;
    if (rows < page)
      break;
  }
  free(after_tenant);
  free(after_op);
  free(after_key);
  return rc;
}

static int pg_prune(void *state, int64_t *removed) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int rc = pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  rc = run_stmt_retry(s, c, ST_PRUNE, &p, "prune", &res, err);
  pool_put(s, c);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  *removed = strtoll(PQcmdTuples(res), NULL, 10);
  PQclear(res);
  return IDEM_OK;
}

static int pg_resolve(void *state, const idem_id *id, const idem_response *r,
                      const idem_resolve_options *o) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE], fp[IDEM_FINGERPRINT_SIZE] = "",
                      sum[IDEM_FINGERPRINT_SIZE];
  int st = 0, found, rc = pool_get(s, &c, err);
  int64_t lease = 0, now = 0;
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  if ((rc = begin(c, err)) != IDEM_OK)
    goto out;
  /* Lock the row so that a claimer cannot take it over meanwhile. The
   * fingerprint parameter is empty: the response columns are not needed. */
  p_id(&p, id);
  p_text(&p, "");
  if ((rc = run_stmt(s, c, ST_LOCK, &p, "read record", &res, err)) != IDEM_OK)
    goto out;
  found = PQntuples(res) > 0;
  if (found) {
    size_t n;
    const char *f = col_ptr(res, 0, 0, &n);
    snprintf(fp, sizeof fp, "%.*s", (int)(n < sizeof fp ? n : sizeof fp - 1),
             f ? f : "");
    st = (int)col_int(res, 0, 1);
    lease = col_int(res, 0, 3);
    now = col_int(res, 0, 9);
  }
  PQclear(res);
  res = NULL;
  if (!found) {
    rc = failf(err, IDEM_ENOTFOUND, "no record (%s, %s, %s)",
               id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_COMPLETED) {
    rc = failf(err, IDEM_ESTATE,
               "record (%s, %s, %s) is already completed; nothing to "
               "resolve",
               id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_IN_PROGRESS && lease > now && !o->force) {
    rc = failf(err, IDEM_ESTATE,
               "record (%s, %s, %s) is held by a run whose lease ends in "
               "%.1f s: it may still be acting; wait for the lease to end, "
               "or force it",
               id->tenant ? id->tenant : "", id->operation, id->key,
               (double)(lease - now) / 1000.0);
    goto out;
  }
  p.n = 0;
  p_id(&p, id);
  if (r) {
    if (idem__response_checksum(fp, r->status, r->meta, r->meta_len, r->body,
                                r->body_len, sum) != IDEM_OK) {
      rc = failf(err, IDEM_ENOMEM, "out of memory");
      goto out;
    }
    p_i64(&p, period(o->retention_ms));
    p_i64(&p, r->status);
    p_bytes(&p, r->meta, r->meta_len);
    p_bytes(&p, r->body_len ? r->body : "", r->body_len);
    p_text(&p, sum);
    rc = run_stmt(s, c, ST_RESOLVE_DONE, &p, "resolve", &res, err);
  } else {
    rc = run_stmt(s, c, ST_RESOLVE_DELETE, &p, "resolve", &res, err);
  }
  PQclear(res);
  if (rc == IDEM_OK)
    rc = commit(c, err);
out:
  rollback(c);
  pool_put(s, c);
  return rc == IDEM_OK ? IDEM_OK : fail_out(s, rc, err);
}

static int pg_remove(void *state, const idem_id *id) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int rc = pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  p_id(&p, id);
  rc = run_stmt(s, c, ST_DELETE, &p, "delete", &res, err);
  pool_put(s, c);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  rc = atoi(PQcmdTuples(res)) == 0
           ? idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                        id->tenant ? id->tenant : "", id->operation, id->key)
           : IDEM_OK;
  PQclear(res);
  return rc;
}

const idem__store_methods idem__pg_methods = {
    IDEM__STORE_METHODS_VERSION,
    "postgresql",
    pg_open,
    pg_close,
    pg_engine_version,
    pg_run,
    pg_get,
    pg_list,
    pg_prune,
    pg_resolve,
    pg_remove,
};
