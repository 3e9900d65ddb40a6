/*
 * store_sqlite.c -- the embedded SQLite backend.
 *
 * One database file holds the records (and, for local actions, the caller's
 * own tables). WAL lets readers proceed while one writer commits; writers
 * take the write lock up front with BEGIN IMMEDIATE so that the read that
 * decides an outcome and the write that follows it can never interleave
 * with another writer, in this process or any other.
 *
 * Group commit. With synchronous=FULL every commit waits for an fsync, the
 * physical limit of a durable store. Callers in one process therefore do not
 * commit one by one: they queue their operation, and whichever caller finds
 * no commit in progress becomes the leader, takes every queued operation,
 * runs each inside its own SAVEPOINT (so a rejected local action or a failed
 * write rolls back alone) and commits them all with one fsync. Each caller
 * sees exactly the outcome it would have seen alone, because the operations
 * still run one after another under the write lock.
 *
 * Replays and conflicts of records completed in this process (or read
 * before) are answered from the cache without a read. Every other claim is
 * decided by the writer under the write lock, in its batch: most are new
 * keys, which must be written anyway. Completed records the writer reads or
 * writes are cached once their batch committed. Without a writer (group
 * commit off, or a read-only handle), claims that only read are answered
 * from a pooled connection's snapshot.
 */
#include "cache.h"
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/* 1: idem 0.2; 2: the recovered mark (idem_record.recovered). */
#define SCHEMA_VERSION 2
#define BATCH_MAX 64

enum {
  ST_SELECT,
  ST_INSERT,
  ST_TAKEOVER,
  ST_COMPLETE,
  ST_RELEASE,
  ST_UNKNOWN,
  ST_RENEW,
  ST_GET,
  ST_LIST,
  ST_PRUNE,
  ST_PRUNE_SOME,
  ST_RESOLVE_DONE,
  ST_RESOLVE_DELETE,
  ST_INSERT_DONE,
  ST_TAKEOVER_DONE,
  ST_INSERT_UNKNOWN,
  ST_DELETE,
  ST_SAVEPOINT,
  ST_RELEASE_SP,
  ST_ROLLBACK_SP,
  ST_VERSION,
  ST_COUNT
};

/*
 * Every read that answers from rows also reads the schema version, in the
 * same statement and so the same snapshot: a store that a newer idem
 * migrated is refused (IDEM_ESCHEMA) instead of having its rows read in a
 * layout this idem does not know. One more lookup in a one-row table, no
 * statement more.
 */
#define VERSION_SQL                                                            \
  "(SELECT value FROM idem_meta WHERE name = 'schema_version')"

/* The columns of a record; rec is the recovered mark's column, or "0" on
 * a store of schema 1 opened read-only (which cannot be migrated). Then
 * the schema version. */
#define RECORD_COLUMNS(rec)                                                    \
  "tenant, operation, key, fingerprint, state, attempt, created_ms, "         \
  "updated_ms, lease_expires_ms, expires_ms, request, status, meta, body, "   \
  "checksum, " rec ", " VERSION_SQL
#define RECORD_RECOVERED 15
#define RECORD_VERSION 16

/* Expired by retention: completed records only. A record in progress or
 * marked unknown may describe an action that happened; it stays. */
#define EXPIRED_SQL "(state = 2 AND expires_ms <= ?1)"
/* Past its retention but kept, waiting for a holder or an operator. */
#define OVERDUE_SQL "(state <> 2 AND expires_ms <= ?1)"

/* A claim's read of its record: columns 0-8, the recovered mark (rec) and
 * the schema version. */
#define SELECT_SQL(rec)                                                        \
  "SELECT fingerprint, state, attempt, lease_expires_ms, expires_ms, "        \
  "status, meta, body, checksum, " rec ", " VERSION_SQL " FROM "             \
  "idem_records WHERE tenant = ?1 AND operation = ?2 AND key = ?3"
#define SELECT_RECOVERED 9
#define SELECT_VERSION 10

#define GET_SQL(cols)                                                          \
  "SELECT " cols " FROM idem_records WHERE tenant = ?2 AND operation = ?3 "   \
  "AND key = ?4 AND NOT " EXPIRED_SQL

/* One page after the last record of the previous one (?8-?11). */
#define LIST_SQL(cols)                                                         \
  "SELECT " cols " FROM idem_records WHERE (?2 IS NULL OR "                   \
  "tenant = ?2) AND (?3 IS NULL OR operation = ?3) AND (?4 = 0 OR state = "   \
  "?4) AND (?5 OR NOT " EXPIRED_SQL ") AND (?7 = 0 OR " OVERDUE_SQL ") AND "  \
  "(created_ms, tenant, operation, key) > (?8, ?9, ?10, ?11) ORDER BY "       \
  "created_ms, tenant, operation, key LIMIT ?6"

/*
 * A completion is marked recovered when its holder took the key over: its
 * attempt is then above 1 (attempts grow by takeovers only; a new record,
 * and one that replaces an expired record, start at 1). An operator's
 * resolution is marked by the same rule: a record of more than one attempt
 * may have acted more than once.
 */
static const char *const sql_text[ST_COUNT] = {
    [ST_SELECT] = SELECT_SQL("recovered"),
    [ST_INSERT] =
        "INSERT OR REPLACE INTO idem_records (tenant, operation, key, "
        "fingerprint, request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6, 1, "
        "?7, ?7, ?8, ?9)",
    [ST_TAKEOVER] = "UPDATE idem_records SET state = 1, owner = ?4, attempt = "
                    "attempt + 1, updated_ms = ?5, lease_expires_ms = ?6, "
                    "expires_ms = MAX(expires_ms, ?7) WHERE tenant = ?1 AND "
                    "operation = ?2 AND key = ?3",
    [ST_COMPLETE] =
        "UPDATE idem_records SET state = 2, owner = NULL, lease_expires_ms = "
        "0, updated_ms = ?5, expires_ms = ?6, status = ?7, meta = ?8, body = "
        "?9, checksum = ?10, recovered = attempt > 1 WHERE tenant = ?1 AND "
        "operation = ?2 AND key = ?3 AND owner = ?4 AND state = 1",
    [ST_RELEASE] = "DELETE FROM idem_records WHERE tenant = ?1 AND operation "
                   "= ?2 AND key = ?3 AND owner = ?4 AND state = 1",
    [ST_UNKNOWN] = "UPDATE idem_records SET state = 3, owner = NULL, "
                   "lease_expires_ms = 0, updated_ms = ?5 WHERE tenant = ?1 "
                   "AND operation = ?2 AND key = ?3 AND owner = ?4 AND state "
                   "= 1",
    [ST_RENEW] = "UPDATE idem_records SET lease_expires_ms = ?5, updated_ms = "
                 "?6 WHERE tenant = ?1 AND operation = ?2 AND key = ?3 AND "
                 "owner = ?4 AND state = 1",
    [ST_GET] = GET_SQL(RECORD_COLUMNS("recovered")),
    [ST_LIST] = LIST_SQL(RECORD_COLUMNS("recovered")),
    [ST_PRUNE] = "DELETE FROM idem_records WHERE " EXPIRED_SQL,
    [ST_PRUNE_SOME] = "DELETE FROM idem_records WHERE (tenant, operation, "
                      "key) IN (SELECT tenant, operation, key FROM "
                      "idem_records WHERE " EXPIRED_SQL " LIMIT 256)",
    [ST_RESOLVE_DONE] =
        "UPDATE idem_records SET state = 2, owner = NULL, lease_expires_ms = "
        "0, updated_ms = ?4, expires_ms = MAX(expires_ms, ?5), status = ?6, "
        "meta = ?7, body = ?8, checksum = ?9, recovered = attempt > 1 WHERE "
        "tenant = ?1 AND operation = ?2 AND key = ?3 AND state <> 2",
    [ST_RESOLVE_DELETE] = "DELETE FROM idem_records WHERE tenant = ?1 AND "
                          "operation = ?2 AND key = ?3 AND state <> 2",
    [ST_DELETE] = "DELETE FROM idem_records WHERE tenant = ?1 AND operation = "
                  "?2 AND key = ?3",
    /* A local action's record, written once, completed, after the action
     * ran: the batch holds the write lock throughout, so no one could have
     * seen it in progress. */
    [ST_INSERT_DONE] =
        "INSERT OR REPLACE INTO idem_records (tenant, operation, key, "
        "fingerprint, request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms, status, meta, body, checksum) VALUES "
        "(?1, ?2, ?3, ?4, ?5, 2, NULL, 1, ?6, ?6, 0, ?7, ?8, ?9, ?10, ?11)",
    [ST_TAKEOVER_DONE] =
        "UPDATE idem_records SET state = 2, owner = NULL, attempt = attempt + "
        "1, updated_ms = ?6, lease_expires_ms = 0, expires_ms = ?7, status = "
        "?8, meta = ?9, body = ?10, checksum = ?11, recovered = 1 WHERE "
        "tenant = ?1 AND operation = ?2 AND key = ?3 AND fingerprint = ?4",
    /* For an action that ended the transaction itself: whether its writes
     * were kept is unknown, and the key must say so (a holder's expired
     * row too; a completed one is left as it is). */
    [ST_INSERT_UNKNOWN] =
        "INSERT INTO idem_records (tenant, operation, key, fingerprint, "
        "request, state, owner, attempt, created_ms, updated_ms, "
        "lease_expires_ms, expires_ms) VALUES (?1, ?2, ?3, ?4, ?5, 3, NULL, 1, "
        "?6, ?6, 0, ?7) ON CONFLICT (tenant, operation, key) DO UPDATE SET "
        "state = 3, owner = NULL, lease_expires_ms = 0, updated_ms = ?6 WHERE "
        "idem_records.state = 1",
    /* Prepared once: every operation of a batch runs in its own savepoint. */
    [ST_SAVEPOINT] = "SAVEPOINT idem_op",
    [ST_RELEASE_SP] = "RELEASE idem_op",
    [ST_ROLLBACK_SP] = "ROLLBACK TO idem_op",
    [ST_VERSION] = "SELECT CAST(value AS INTEGER) FROM idem_meta WHERE name "
                   "= 'schema_version'",
};

/* The reads as they are on a store of schema 1, which a read-only handle
 * reads without migrating it: no record of it is marked. */
static const char *const sql_text_v1[ST_COUNT] = {
    [ST_SELECT] = SELECT_SQL("0"),
    [ST_GET] = GET_SQL(RECORD_COLUMNS("0")),
    [ST_LIST] = LIST_SQL(RECORD_COLUMNS("0")),
};

static const char schema_v1[] =
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
    "CREATE INDEX idem_records_expires ON idem_records (expires_ms);";

/* Version 2: the recovered mark. Records of version 1 are not marked. */
static const char schema_v2[] = "ALTER TABLE idem_records ADD COLUMN "
                                "recovered INTEGER NOT NULL DEFAULT 0";

struct sq_store;

typedef struct conn {
  sqlite3 *db;
  struct sq_store *store;
  int v1; /* reads a store of schema 1: sql_text_v1 */
  unsigned commits; /* counted by a commit hook: see run_local() */
  sqlite3_stmt *st[ST_COUNT];
  struct conn *next;
} conn;

typedef struct sq_store {
  char *path;
  idem_store_options o;
  char version[32];
  /* The oldest schema version this handle's statements read right:
   * SCHEMA_VERSION, or 1 for a read-only handle on a store of version 1. */
  int schema_min;

  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;
  conn *idle;
  int nconn;

  /* Group commit: the queue, whether a leader is committing, and the
   * connection leaders use. */
  pthread_mutex_t gc_mu;
  pthread_cond_t gc_cv;
  idem__op *head, *tail;
  int leading;
  conn *writer;
  pthread_cond_t gather_cv; /* a leader gathering waits here for callers */
  int queued, inside, peak;  /* queued ops; callers in submit(); their peak */
  int last_batch, prev_batch;
  unsigned batches;

  /* Checkpoints run on a thread of their own, so that no batch of callers
   * waits for the write-ahead log to be copied into the database. */
  pthread_t ckpt_thread;
  conn *ckpt_conn;
  int ckpt_running, ckpt_wanted, ckpt_stop;
  int ckpt_seen, ckpt_next; /* log frames at the last commit; next request */
  int restart_due;          /* the thread copied the log: restart it */
  /* A checkpoint's fsync failed: see ckpt_check(). Under gc_mu. */
  int ckpt_broken;
  pthread_cond_t ckpt_cv;
  int64_t last_prune_ms; /* under gc_mu */

  idem__cache *cache; /* completed records, for replays */

  /* The write-ahead log as it was when the store opened: a log deleted or
   * replaced under an open store takes its newest commits with it. */
  dev_t wal_dev;
  ino_t wal_ino;
  int wal_known;
  /* The database file as it was when the store opened: one deleted, moved
   * or replaced under an open store keeps taking this handle's writes (into
   * a file nobody will open again), and they vanish when the store closes. */
  dev_t db_dev;
  ino_t db_ino;
  int db_known;
} sq_store;

/* ---- errors ------------------------------------------------------------ */

static int map_rc(int src) {
  switch (src & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return IDEM_EBUSY;
  case SQLITE_NOMEM:
    return IDEM_ENOMEM;
  case SQLITE_TOOBIG:
    return IDEM_ETOOBIG;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
    return IDEM_ESTORE;
  /* The disk failed the store (a read, a write, an fsync) or is full: the
   * call's transaction was rolled back, and a retry may work once the
   * disk does. */
  case SQLITE_IOERR:
  case SQLITE_FULL:
    return IDEM_EIO;
  default:
    return IDEM_ESTORE;
  }
}

/*
 * SQLite's message for db's last error; for an I/O error also what the
 * system said when that names a disk's trouble ("disk I/O error (No space
 * left on device)"), which SQLite's text leaves out. (SQLite reads errno
 * some time after the failed call, so other values may be another call's
 * and are not shown.) Uses buf.
 */
static const char *errtext(sqlite3 *db, char *buf, size_t size) {
  int src = sqlite3_extended_errcode(db) & 0xff, sys = sqlite3_system_errno(db);
  if ((src == SQLITE_IOERR || src == SQLITE_CANTOPEN) &&
      (sys == ENOSPC || sys == EDQUOT || sys == EIO || sys == EROFS ||
       sys == EFBIG))
    snprintf(buf, size, "%s (%s)", sqlite3_errmsg(db), strerror(sys));
  else
    snprintf(buf, size, "%s", sqlite3_errmsg(db));
  return buf;
}

static int op_sqlite_fail(idem__op *op, conn *c, const char *what) {
  int src = sqlite3_extended_errcode(c->db);
  char buf[384];
  return idem__op_fail(op, map_rc(src), "sqlite: %s: %s", what,
                       errtext(c->db, buf, sizeof buf));
}

static int sqlite_fail(conn *c, const char *what) {
  int src = sqlite3_extended_errcode(c->db);
  char buf[384];
  return idem__fail(map_rc(src), "sqlite: %s: %s", what,
                    errtext(c->db, buf, sizeof buf));
}

/* ---- connections ----------------------------------------------------- */

static void conn_close(conn *c) {
  if (!c)
    return;
  for (int i = 0; i < ST_COUNT; i++)
    sqlite3_finalize(c->st[i]);
  sqlite3_close(c->db);
  free(c);
}

static sqlite3_stmt *stmt(conn *c, int which) {
  if (!c->st[which]) {
    const char *sql =
        c->v1 && sql_text_v1[which] ? sql_text_v1[which] : sql_text[which];
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                           &c->st[which], NULL) != SQLITE_OK)
      return NULL;
  } else {
    sqlite3_reset(c->st[which]);
    sqlite3_clear_bindings(c->st[which]);
  }
  return c->st[which];
}

static int exec(conn *c, const char *sql) {
  return sqlite3_exec(c->db, sql, NULL, NULL, NULL);
}

/*
 * "file:PATH?immutable=1" with the characters a URI gives a meaning to
 * escaped. NULL when out of memory.
 */
static char *immutable_uri(const char *path) {
  size_t n = strlen(path);
  char *u = malloc(3 * n + 32), *o;
  if (!u)
    return NULL;
  o = u + sprintf(u, "file:");
  for (const char *p = path; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '%' || ch == '?' || ch == '#' || ch < 0x21 || ch > 0x7e)
      o += sprintf(o, "%%%02X", ch);
    else
      *o++ = (char)ch;
  }
  strcpy(o, "?immutable=1");
  return u;
}

/*
 * A reader who may not write the store's folder cannot create the shared
 * memory file that WAL needs. When no such file exists, no connection has
 * the store open, and the file alone is the whole store: it is then read
 * as immutable. (A writer that starts meanwhile writes to its log, which
 * this reader does not see until it opens the store again.)
 */
static int reopen_immutable(sq_store *s, conn *c) {
  char shm[4096];
  char *uri;
  int rc;
  if (snprintf(shm, sizeof shm, "%s-shm", s->path) >= (int)sizeof shm ||
      access(shm, F_OK) == 0 || errno != ENOENT)
    return SQLITE_CANTOPEN;
  if (!(uri = immutable_uri(s->path)))
    return SQLITE_NOMEM;
  sqlite3_close(c->db);
  c->db = NULL;
  rc = sqlite3_open_v2(uri, &c->db,
                       SQLITE_OPEN_READONLY | SQLITE_OPEN_URI |
                           SQLITE_OPEN_NOMUTEX,
                       NULL);
  free(uri);
  if (rc == SQLITE_OK) {
    sqlite3_extended_result_codes(c->db, 1);
    rc = exec(c, "SELECT count(*) FROM sqlite_schema");
  }
  return rc;
}

/* A commit hook: counts the connection's commits. */
static int count_commit(void *arg) {
  (*(unsigned *)arg)++;
  return 0;
}

/* The folder of the store's file: where SQLite makes its -wal and -shm
 * files. */
static void folder_of(const char *path, char *buf, size_t size) {
  const char *slash = strrchr(path, '/');
  snprintf(buf, size, "%.*s",
           slash ? (int)(slash == path ? 1 : slash - path) : 1,
           slash ? path : ".");
}

static void ckpt_check(sq_store *s, int rc);
static int wal_hook_inline(void *arg, sqlite3 *db, const char *name,
                           int frames);

static int conn_open(sq_store *s, conn **out) {
  char buf[384];
  conn *c = calloc(1, sizeof *c);
  const char *sync = s->o.sqlite_synchronous == IDEM_SYNC_NORMAL
                         ? "PRAGMA synchronous=NORMAL"
                         : "PRAGMA synchronous=FULL";
  int rc;
  *out = NULL;
  if (!c)
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  c->store = s;
  c->v1 = s->schema_min == 1;
  rc = sqlite3_open_v2(s->path, &c->db,
                       (s->o.read_only ? SQLITE_OPEN_READONLY
                                       : SQLITE_OPEN_READWRITE) |
                           SQLITE_OPEN_NOMUTEX,
                       NULL);
  if (rc != SQLITE_OK) {
    rc = idem__fail(map_rc(rc), "store '%s': cannot open: %s", s->path,
                    c->db ? errtext(c->db, buf, sizeof buf)
                          : sqlite3_errstr(rc));
    conn_close(c);
    return rc;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_timeout(c->db, s->o.busy_timeout_ms);
  sqlite3_commit_hook(c->db, count_commit, &c->commits);
  if (!s->o.read_only)
    sqlite3_wal_hook(c->db, wal_hook_inline, s);
  /* The first statement reads the file header: a file that is not a
   * database fails here, before anything could be written to it. Switching
   * a new file to WAL needs a moment alone with it, and SQLite does not call
   * the busy handler for that, so wait here as the busy timeout says. */
  for (int waited = 0;; waited += 10) {
    /* A reader leaves the journal mode as the writers set it. */
    rc = exec(c, s->o.read_only ? "SELECT count(*) FROM sqlite_schema"
                                : "PRAGMA journal_mode=WAL");
    if ((rc & 0xff) != SQLITE_BUSY || waited >= s->o.busy_timeout_ms)
      break;
    sqlite3_sleep(10);
  }
  if (s->o.read_only && ((rc & 0xff) == SQLITE_CANTOPEN ||
                         (rc & 0xff) == SQLITE_READONLY))
    rc = reopen_immutable(s, c);
  if (rc != SQLITE_OK || exec(c, sync) != SQLITE_OK) {
    int src = sqlite3_extended_errcode(c->db);
    char folder[4096];
    /* The usual reason a writable file cannot be written: WAL makes its
     * -wal and -shm files beside it, in a folder that is read-only. */
    folder_of(s->path, folder, sizeof folder);
    if (!s->o.read_only &&
        ((src & 0xff) == SQLITE_READONLY || (src & 0xff) == SQLITE_CANTOPEN) &&
        faccessat(AT_FDCWD, folder, W_OK, AT_EACCESS) != 0)
      rc = idem__fail(IDEM_ESTORE,
                      "store '%s': its folder '%s' is not writable, and the "
                      "store must create its -wal and -shm files there (%s); "
                      "make the folder writable, or open the store "
                      "read-only",
                      s->path, folder, errtext(c->db, buf, sizeof buf));
    else
      rc = idem__fail(map_rc(src), "store '%s': %s", s->path,
                      errtext(c->db, buf, sizeof buf));
    conn_close(c);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

static int pool_get(sq_store *s, conn **out) {
  conn *c = NULL;
  int rc;
  *out = NULL;
  pthread_mutex_lock(&s->pool_mu);
  while (!s->idle && s->nconn >= s->o.max_connections)
    pthread_cond_wait(&s->pool_cv, &s->pool_mu);
  if (s->idle) {
    c = s->idle;
    s->idle = c->next;
    pthread_mutex_unlock(&s->pool_mu);
    *out = c;
    return IDEM_OK;
  }
  s->nconn++;
  pthread_mutex_unlock(&s->pool_mu);
  rc = conn_open(s, &c);
  if (rc != IDEM_OK) {
    pthread_mutex_lock(&s->pool_mu);
    s->nconn--;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

static void pool_put(sq_store *s, conn *c) {
  if (!c)
    return;
  /* Never hand out a connection inside a transaction. */
  if (!sqlite3_get_autocommit(c->db))
    exec(c, "ROLLBACK");
  pthread_mutex_lock(&s->pool_mu);
  c->next = s->idle;
  s->idle = c;
  pthread_cond_signal(&s->pool_cv);
  pthread_mutex_unlock(&s->pool_mu);
}

/* ---- schema ------------------------------------------------------------ */

/* The schema version, or 0 when the store has none yet. */
static int read_version(conn *c) {
  sqlite3_stmt *q = NULL;
  int version = 0;
  if (sqlite3_prepare_v2(c->db,
                         "SELECT value FROM idem_meta WHERE name = "
                         "'schema_version'",
                         -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  return version;
}

static int ensure_schema(sq_store *s, conn *c) {
  sqlite3_stmt *q = NULL;
  int version = 0, rc;
  /* The common case reads only: many processes opening one store at once
   * do not queue for the write lock just to find the schema in place. */
  s->schema_min = SCHEMA_VERSION;
  version = read_version(c);
  if (version == SCHEMA_VERSION)
    return IDEM_OK;
  /* A reader may not migrate: a store of version 1 (idem 0.2) is read as
   * it is, without recovered marks. */
  if (s->o.read_only && version == 1) {
    s->schema_min = 1;
    c->v1 = 1;
    return IDEM_OK;
  }
  if (s->o.read_only)
    return version > SCHEMA_VERSION
               ? idem__fail(IDEM_ESCHEMA,
                            "store '%s': schema version %d; this idem "
                            "knows up to %d",
                            s->path, version, SCHEMA_VERSION)
               : idem__fail(IDEM_ESTORE,
                            "store '%s': opened read-only, and it is not an "
                            "idem store of this version (schema %d)",
                            s->path, version);
  version = 0;
  if (exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
    return idem__fail(map_rc(sqlite3_extended_errcode(c->db)),
                      "store '%s': %s", s->path, sqlite3_errmsg(c->db));
  if (exec(c, "CREATE TABLE IF NOT EXISTS idem_meta (name TEXT PRIMARY KEY, "
              "value TEXT NOT NULL) WITHOUT ROWID") != SQLITE_OK)
    goto fail;
  if (sqlite3_prepare_v2(c->db,
                         "SELECT value FROM idem_meta WHERE name = "
                         "'schema_version'",
                         -1, &q, NULL) != SQLITE_OK)
    goto fail;
  if (sqlite3_step(q) == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  q = NULL;
  if (version > SCHEMA_VERSION) {
    exec(c, "ROLLBACK");
    return idem__fail(IDEM_ESCHEMA,
                      "store '%s': schema version %d; this idem knows up to "
                      "%d; the store was left untouched",
                      s->path, version, SCHEMA_VERSION);
  }
  /* Migrations run in order, each inside this one transaction. */
  if (version < 1) {
    if (exec(c, schema_v1) != SQLITE_OK)
      goto fail;
  }
  if (version < 2) {
    if (exec(c, schema_v2) != SQLITE_OK)
      goto fail;
  }
  if (version < SCHEMA_VERSION) {
    char sql[96];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO idem_meta VALUES ('schema_version', "
             "'%d')",
             SCHEMA_VERSION);
    if (exec(c, sql) != SQLITE_OK)
      goto fail;
  }
  if (exec(c, "COMMIT") != SQLITE_OK)
    goto fail;
  return IDEM_OK;
fail:
  rc = idem__fail(map_rc(sqlite3_extended_errcode(c->db)),
                  "store '%s': schema: %s", s->path, sqlite3_errmsg(c->db));
  sqlite3_finalize(q);
  exec(c, "ROLLBACK");
  return rc;
}

/* ---- the schema version ------------------------------------------------- */

/*
 * A newer idem may migrate the store while this handle has it open. From
 * then on this handle neither reads records (their layout may have
 * changed) nor writes any (the newer version would misread them): every
 * call fails with IDEM_ESCHEMA and says why. Writes read the version inside
 * their transaction; reads of records read it in the statement that reads
 * them.
 */

/* Whether this handle's statements are right for schema version v. */
static int schema_known(const sq_store *s, int v) {
  return v >= s->schema_min && v <= SCHEMA_VERSION;
}

static void schema_problem(const sq_store *s, int v, char *why, size_t size) {
  snprintf(why, size,
           "store '%s': its schema is now version %d (this idem knows up "
           "to %d): another version of idem changed it while this handle "
           "had it open; nothing more is read or written through this "
           "handle; open the store with that version",
           s->path, v, SCHEMA_VERSION);
}

/* Reads the version: IDEM_OK, IDEM_ESCHEMA, or the store's error; the
 * detail in why. */
static int schema_check(sq_store *s, conn *c, char *why, size_t size) {
  sqlite3_stmt *q = stmt(c, ST_VERSION);
  char buf[384];
  int version = 0, step;
  if (!q) {
    snprintf(why, size, "sqlite: prepare: %s", errtext(c->db, buf, sizeof buf));
    return map_rc(sqlite3_extended_errcode(c->db));
  }
  step = sqlite3_step(q);
  if (step == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  if (step != SQLITE_ROW && step != SQLITE_DONE) {
    int rc = map_rc(sqlite3_extended_errcode(c->db));
    snprintf(why, size, "sqlite: read the schema version: %s",
             errtext(c->db, buf, sizeof buf));
    sqlite3_reset(q);
    return rc;
  }
  sqlite3_reset(q);
  if (schema_known(s, version))
    return IDEM_OK;
  schema_problem(s, version, why, size);
  return IDEM_ESCHEMA;
}

/* IDEM_ESCHEMA for a store found at version v. */
static int schema_refused(const sq_store *s, int v) {
  char why[512];
  schema_problem(s, v, why, sizeof why);
  return idem__fail(IDEM_ESCHEMA, "%s", why);
}

/* A read that failed: IDEM_ESCHEMA when the schema changed under it (a
 * newer layout may not even have the columns read), else the error. */
static int read_failed(sq_store *s, conn *c, const char *what) {
  char why[512];
  int rc = sqlite_fail(c, what);
  if (schema_check(s, c, why, sizeof why) == IDEM_ESCHEMA)
    rc = idem__fail(IDEM_ESCHEMA, "%s", why);
  return rc;
}

/* The same for a claim's read. Returns op->rc. */
static int op_read_failed(conn *c, idem__op *op, const char *what) {
  char why[sizeof op->errmsg];
  op_sqlite_fail(op, c, what);
  if (schema_check(c->store, c, why, sizeof why) == IDEM_ESCHEMA)
    idem__op_fail(op, IDEM_ESCHEMA, "%s", why);
  return op->rc;
}

/* ---- reading rows -------------------------------------------------------- */

static void bind_id(sqlite3_stmt *q, const idem_id *id, int first) {
  sqlite3_bind_text(q, first, id->tenant ? id->tenant : "", -1,
                    SQLITE_STATIC);
  sqlite3_bind_text(q, first + 1, id->operation, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, first + 2, id->key, -1, SQLITE_STATIC);
}

/*
 * Reads the record of op->id and decides the outcome at time now. For REPLAY
 * the stored response is checked against its checksum and copied into the
 * claim. Returns 0, or op->rc on failure.
 */
static int load_and_decide(conn *c, idem__op *op, int64_t now, idem__row *row,
                           idem__action *action) {
  sqlite3_stmt *q = stmt(c, ST_SELECT);
  int step, version;
  memset(row, 0, sizeof *row);
  if (!q)
    return op_read_failed(c, op, "prepare");
  bind_id(q, op->id, 1);
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
    version = sqlite3_column_int(q, SELECT_VERSION);
    if (!schema_known(c->store, version)) {
      sqlite3_reset(q);
      schema_problem(c->store, version, op->errmsg, sizeof op->errmsg);
      return op->rc = IDEM_ESCHEMA;
    }
  } else if (step != SQLITE_DONE) {
    sqlite3_reset(q);
    return op_read_failed(c, op, "read record");
  }
  *action = idem__decide_op(op, row, now);
  if (op->claim->outcome == IDEM_REPLAY) {
    /* Each pointer first, then its length, as SQLite asks. */
    const void *meta = sqlite3_column_blob(q, 6);
    size_t meta_len = (size_t)sqlite3_column_bytes(q, 6);
    const void *body = sqlite3_column_blob(q, 7);
    size_t body_len = (size_t)sqlite3_column_bytes(q, 7);
    const char *sum = (const char *)sqlite3_column_text(q, 8);
    size_t sum_len = (size_t)sqlite3_column_bytes(q, 8);
    if (idem__claim_replay(op, row->fingerprint, sqlite3_column_int(q, 5),
                           meta, meta_len, body, body_len, sum, sum_len,
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
static void cache_later(idem__op *op, int64_t expires_ms, int attempt) {
  op->cache_it = 1;
  op->cache_expires_ms = expires_ms;
  op->cache_attempt = attempt;
}

static int write_claim(conn *c, idem__op *op, const idem__row *row,
                       idem__action action, int64_t now) {
  idem_call *cl = op->claim;
  sqlite3_stmt *q;
  if (idem__new_token(cl->token) != IDEM_OK)
    return idem__op_fail(op, IDEM_EIO, "%s", idem_errmsg());
  if (action == IDEM__ACT_INSERT) {
    q = stmt(c, ST_INSERT);
    if (!q)
      return op_sqlite_fail(op, c, "prepare");
    bind_id(q, op->id, 1);
    sqlite3_bind_text(q, 4, op->fingerprint, -1, SQLITE_STATIC);
    if (op->opts.request)
      sqlite3_bind_blob(q, 5, op->opts.request, (int)op->opts.request_len,
                        SQLITE_STATIC);
    sqlite3_bind_text(q, 6, cl->token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 7, now);
    sqlite3_bind_int64(q, 8, idem__deadline(now, op->opts.lease_ms));
    sqlite3_bind_int64(q, 9, idem__deadline(now, op->opts.retention_ms));
    cl->attempt = 1;
  } else {
    q = stmt(c, ST_TAKEOVER);
    if (!q)
      return op_sqlite_fail(op, c, "prepare");
    bind_id(q, op->id, 1);
    sqlite3_bind_text(q, 4, cl->token, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 5, now);
    sqlite3_bind_int64(q, 6, idem__deadline(now, op->opts.lease_ms));
    sqlite3_bind_int64(q, 7, idem__deadline(now, op->opts.retention_ms));
    cl->attempt = row->attempt + 1;
  }
  if (sqlite3_step(q) != SQLITE_DONE) {
    op_sqlite_fail(op, c, "write claim");
    sqlite3_reset(q);
    return op->rc;
  }
  sqlite3_reset(q);
  cl->lease_expires_ms = idem__deadline(now, op->opts.lease_ms);
  return IDEM_OK;
}

static int write_complete(conn *c, idem__op *op, const idem_response *r,
                          int64_t now) {
  char sum[IDEM_FINGERPRINT_SIZE];
  sqlite3_stmt *q = stmt(c, ST_COMPLETE);
  int changed;
  if (!q)
    return op_sqlite_fail(op, c, "prepare");
  if (idem__response_checksum(op->fingerprint, r->status, r->meta,
                              r->meta_len, r->body, r->body_len,
                              sum) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "checksum: out of memory");
  bind_id(q, op->id, 1);
  sqlite3_bind_text(q, 4, op->claim->token, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 5, now);
  sqlite3_bind_int64(q, 6, idem__deadline(now, op->opts.retention_ms));
  sqlite3_bind_int(q, 7, r->status);
  if (r->meta)
    sqlite3_bind_blob(q, 8, r->meta, (int)r->meta_len, SQLITE_STATIC);
  sqlite3_bind_blob(q, 9, r->body_len ? r->body : "", (int)r->body_len,
                    SQLITE_STATIC);
  sqlite3_bind_text(q, 10, sum, -1, SQLITE_STATIC);
  if (sqlite3_step(q) != SQLITE_DONE) {
    op_sqlite_fail(op, c, "complete");
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
  cache_later(op, idem__deadline(now, op->opts.retention_ms),
              op->claim->attempt);
  return IDEM_OK;
}

/* Release, mark unknown and renew: one fenced statement each. */
static int write_fenced(conn *c, idem__op *op, int which, int64_t now) {
  sqlite3_stmt *q = stmt(c, which);
  int changed;
  if (!q)
    return op_sqlite_fail(op, c, "prepare");
  bind_id(q, op->id, 1);
  sqlite3_bind_text(q, 4, op->claim->token, -1, SQLITE_STATIC);
  if (which == ST_UNKNOWN) {
    sqlite3_bind_int64(q, 5, now);
  } else if (which == ST_RENEW) {
    sqlite3_bind_int64(q, 5, idem__deadline(now, op->lease_ms));
    sqlite3_bind_int64(q, 6, now);
  }
  if (sqlite3_step(q) != SQLITE_DONE) {
    op_sqlite_fail(op, c, "update");
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
    op->claim->lease_expires_ms = idem__deadline(now, op->lease_ms);
  return IDEM_OK;
}

/* The parameters a record written by a local action starts with: ?1-?3 its
 * id, ?4 the fingerprint, ?5 the request, ?6 now, ?7 its expiry. */
static void bind_new_record(sqlite3_stmt *q, const idem__op *op, int64_t now) {
  bind_id(q, op->id, 1);
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
  sqlite3_stmt *q = stmt(c, ST_INSERT_UNKNOWN);
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
  if (sqlite3_get_autocommit(c->db)) {
    int src = sqlite3_extended_errcode(c->db);
    /* SQLite itself rolls the whole transaction back when a statement
     * meets an I/O error, a full disk or no memory. When nothing committed
     * meanwhile (the connection's commit hook counts commits), nothing of
     * the action was kept: the key stays free. */
    char buf[384];
    if (c->commits == commits && ((src & 0xff) == SQLITE_IOERR ||
                       (src & 0xff) == SQLITE_FULL ||
                       (src & 0xff) == SQLITE_NOMEM)) {
      idem__op_fail(op, map_rc(src),
                    "key '%s': the action's statement failed (%s) and "
                    "SQLite rolled the transaction back: nothing of it was "
                    "kept; a retry acts",
                    op->id->key, errtext(c->db, buf, sizeof buf));
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
  q = stmt(c, action == IDEM__ACT_INSERT ? ST_INSERT_DONE : ST_TAKEOVER_DONE);
  if (!q) {
    op_sqlite_fail(op, c, "prepare");
    return;
  }
  bind_new_record(q, op, now);
  sqlite3_bind_int(q, 8, r.status);
  if (r.meta)
    sqlite3_bind_blob(q, 9, r.meta, (int)r.meta_len, SQLITE_STATIC);
  sqlite3_bind_blob(q, 10, r.body_len ? r.body : "", (int)r.body_len,
                    SQLITE_STATIC);
  sqlite3_bind_text(q, 11, sum, -1, SQLITE_STATIC);
  if (sqlite3_step(q) != SQLITE_DONE) {
    op_sqlite_fail(op, c, "write record");
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
  if (idem__claim_set_response(op->claim, r.status, r.meta, r.meta_len,
                               r.body, r.body_len) != IDEM_OK) {
    idem__op_fail(op, IDEM_ENOMEM, "out of memory");
    return;
  }
  cache_later(op, idem__deadline(now, op->opts.retention_ms),
              op->claim->attempt);
}

/* Runs one op inside the open transaction. */
static void run_one(conn *c, idem__op *op, int64_t now) {
  idem__row row;
  idem__action action;
  switch (op->kind) {
  case IDEM__OP_CLAIM:
  case IDEM__OP_LOCAL:
    if (load_and_decide(c, op, now, &row, &action) != IDEM_OK)
      return;
    if (action == IDEM__ACT_NONE) {
      if (op->claim->outcome == IDEM_REPLAY)
        cache_later(op, row.expires_ms, row.attempt);
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
static int step_once(conn *c, int which) {
  sqlite3_stmt *q = stmt(c, which);
  int rc;
  if (!q)
    return sqlite3_errcode(c->db);
  rc = sqlite3_step(q);
  sqlite3_reset(q);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

/*
 * Removes some retention-expired records inside the batch's transaction.
 * Returns SQLITE_OK, or the error that ended the whole transaction (SQLite
 * rolls it back by itself on an I/O error), its text in why.
 */
static int prune_some(sq_store *s, conn *c, int64_t now, char *why,
                      size_t size) {
  sqlite3_stmt *q;
  int due, src = SQLITE_OK;
  /* Without group commit, batches of several threads run at once. */
  pthread_mutex_lock(&s->gc_mu);
  due = now - s->last_prune_ms >= IDEM__PRUNE_EVERY_MS;
  if (due)
    s->last_prune_ms = now;
  pthread_mutex_unlock(&s->gc_mu);
  if (!due)
    return SQLITE_OK;
  if (exec(c, "SAVEPOINT idem_prune") != SQLITE_OK)
    return SQLITE_OK;
  q = stmt(c, ST_PRUNE_SOME);
  if (q) {
    sqlite3_bind_int64(q, 1, now);
    if (sqlite3_step(q) != SQLITE_DONE) {
      src = sqlite3_extended_errcode(c->db);
      errtext(c->db, why, size);
    }
    sqlite3_reset(q);
  }
  if (sqlite3_get_autocommit(c->db))
    return src != SQLITE_OK ? src : SQLITE_ERROR;
  if (src != SQLITE_OK)
    exec(c, "ROLLBACK TO idem_prune");
  exec(c, "RELEASE idem_prune");
  return SQLITE_OK;
}

/*
 * The batch's transaction ended while ops[lost] ran. The ops before it were
 * rolled back, or committed if an action ended the transaction with COMMIT;
 * the ops after it never ran. None of them holds a claim.
 */
static void batch_lost(conn *c, idem__op **ops, int n, int lost) {
  char why[sizeof ops[0]->errmsg];
  snprintf(why, sizeof why, "%s",
           ops[lost]->rc != IDEM_OK ? ops[lost]->errmsg
                                    : sqlite3_errmsg(c->db));
  for (int i = 0; i < n; i++) {
    idem__op *op = ops[i];
    if (op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL)
      op->claim->held = 0;
    if (i < lost && op->rc == IDEM_OK)
      idem__op_fail(op, IDEM_EUNAVAILABLE,
                    "sqlite: the transaction of this call's group commit "
                    "ended early (%s): this call's write was rolled back, "
                    "unless an action in the same group committed it; a "
                    "retry replays it if it was kept",
                    why);
    else if (i == lost && op->rc == IDEM_OK)
      idem__op_fail(op, IDEM_EUNAVAILABLE,
                    "sqlite: the transaction ended while this call ran (%s); "
                    "whether its write was kept is unknown; a retry replays "
                    "it if it was",
                    why);
    else if (i > lost)
      idem__op_fail(op, IDEM_EUNAVAILABLE,
                    "sqlite: the transaction of this call's group commit "
                    "ended before this call ran (%s); nothing was stored; "
                    "try again",
                    why);
  }
}

/*
 * Whether the schema is still one this handle knows (see schema_check()),
 * read inside the write transaction. IDEM_OK, or IDEM_ESCHEMA (or the
 * store's error) with a detail.
 */
static int schema_unchanged(sq_store *s, conn *c) {
  char why[512];
  int rc = schema_check(s, c, why, sizeof why);
  return rc == IDEM_OK ? IDEM_OK : idem__fail(rc, "%s", why);
}

/*
 * The device and inode of a file (the -wal file, the database); 0 if it
 * cannot be read. statx() asked for STATX_INO alone reads no timestamp.
 * stat() reads them all, and since Linux 6.13 (multigrain timestamps) a
 * file whose times were read gets fine-grained ones at its next write: the
 * log's inode is dirtied by every commit and fdatasync writes it too
 * (bench/stat_fsync.c). It syncs as
 * stat() does (not AT_STATX_DONT_SYNC): a network filesystem's cached
 * answer could hide the very deletion looked for. stat() where statx() is
 * missing (C library before glibc 2.28) or fails (ENOSYS, a seccomp EPERM).
 */
static int file_id(const char *path, dev_t *dev, ino_t *ino) {
  struct stat st;
#ifdef STATX_INO
  struct statx stx;
  if (statx(AT_FDCWD, path, AT_STATX_SYNC_AS_STAT, STATX_INO, &stx) == 0 &&
      (stx.stx_mask & STATX_INO)) {
    *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    *ino = (ino_t)stx.stx_ino;
    return 1;
  }
#endif
  if (stat(path, &st) != 0)
    return 0;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return 1;
}

/* Notes the database and log files that the store's connections have
 * open. */
static void note_files(sq_store *s) {
  char wal[4096];
  if (snprintf(wal, sizeof wal, "%s-wal", s->path) < (int)sizeof wal &&
      file_id(wal, &s->wal_dev, &s->wal_ino))
    s->wal_known = 1;
  if (file_id(s->path, &s->db_dev, &s->db_ino))
    s->db_known = 1;
}

/*
 * Whether the database file and its log are still the ones the store
 * opened. SQLite never deletes the log while a connection has it open, so a
 * log that is gone or another file means someone deleted it: the commits it
 * held are lost to every process that opens the store from now on, and the
 * keys they completed would act again. A database file deleted, moved or
 * replaced takes every record with it in the same way. Nothing more is
 * written through this handle.
 */
static int files_intact(sq_store *s, char *why, size_t size) {
  char wal[4096];
  dev_t dev;
  ino_t ino;
  /* The database file first: with it gone, every write is lost, and a
   * store opened at the path afterwards (a restart) starts empty. */
  if (s->db_known &&
      !(file_id(s->path, &dev, &ino) && dev == s->db_dev && ino == s->db_ino)) {
    snprintf(why, size,
             "store '%.160s': the database file was deleted, moved or "
             "replaced while the store was open; what this handle wrote "
             "would be lost when it closes and keys it completed could act "
             "again, so it writes nothing more. Check what ran, then "
             "reopen the store (restoring the file first if it was "
             "deleted by mistake)",
             s->path);
    return 0;
  }
  if (!s->wal_known)
    return 1;
  snprintf(wal, sizeof wal, "%s-wal", s->path);
  if (file_id(wal, &dev, &ino) && dev == s->wal_dev && ino == s->wal_ino)
    return 1;
  snprintf(why, size,
           "store '%.160s': its write-ahead log (the -wal file) was deleted "
           "or replaced while the store was open; the most recent records "
           "may be lost and keys they completed could act again, so this "
           "handle writes nothing more. Check what ran, then reopen the "
           "store",
           s->path);
  return 0;
}

/*
 * Runs ops[0..n) in one transaction with one commit. On a failed BEGIN or
 * COMMIT every op of the batch fails and nothing of it is stored.
 */
static void run_batch(sq_store *s, conn *c, idem__op **ops, int n) {
  int64_t now;
  int i, restart;
  /*
   * The log starts over from its beginning only when a write transaction
   * begins with every frame already copied into the database, which never
   * happens while the checkpoint thread races the writers. A log that only
   * grows makes every commit an append that must also sync the file's size,
   * nearly twice the cost of rewriting blocks in place. So once the thread
   * has copied the bulk, the writer copies the few frames added since, here,
   * and the BEGIN below restarts the log.
   */
  pthread_mutex_lock(&s->gc_mu);
  restart = s->restart_due;
  s->restart_due = 0;
  pthread_mutex_unlock(&s->gc_mu);
  if (restart)
    ckpt_check(s, sqlite3_wal_checkpoint_v2(c->db, NULL,
                                            SQLITE_CHECKPOINT_PASSIVE, NULL,
                                            NULL));
  if (exec(c, "BEGIN IMMEDIATE") != SQLITE_OK) {
    for (i = 0; i < n; i++)
      op_sqlite_fail(ops[i], c, "begin");
    return;
  }
  if ((i = schema_unchanged(s, c)) != IDEM_OK) {
    char why[sizeof ops[0]->errmsg];
    int rc = i;
    snprintf(why, sizeof why, "%s", idem_errmsg());
    exec(c, "ROLLBACK");
    for (i = 0; i < n; i++) {
      idem__op_fail(ops[i], rc, "%s", why);
      if (ops[i]->kind == IDEM__OP_CLAIM || ops[i]->kind == IDEM__OP_LOCAL)
        ops[i]->claim->held = 0;
    }
    return;
  }
  {
    char why[sizeof ops[0]->errmsg];
    if (!files_intact(s, why, sizeof why)) {
      /* Nothing is written; a claim whose outcome writes nothing (a
       * replay of what was completed before, a conflict, a key in flight)
       * is still answered. */
      for (i = 0; i < n; i++) {
        idem__op *op = ops[i];
        idem__row row;
        idem__action action = IDEM__ACT_INSERT;
        if ((op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL) &&
            load_and_decide(c, op, idem__now_ms(), &row, &action) ==
                IDEM_OK &&
            action == IDEM__ACT_NONE) {
          if (op->claim->outcome == IDEM_REPLAY)
            cache_later(op, row.expires_ms, row.attempt);
          continue;
        }
        if (op->rc == IDEM_OK)
          idem__op_fail(op, IDEM_ESTORE, "%s", why);
        if (op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL)
          op->claim->held = 0;
      }
      exec(c, "ROLLBACK");
      return;
    }
  }
  for (i = 0; i < n; i++) {
    idem__op *op = ops[i];
    if (step_once(c, ST_SAVEPOINT) != SQLITE_OK) {
      op_sqlite_fail(op, c, "savepoint");
      continue;
    }
    /* Read under the write lock, for each op: a lease or a retention
     * counts from when its write can no longer wait, never from before
     * BEGIN IMMEDIATE's wait or the actions run earlier in the batch. */
    now = idem__now_ms();
    run_one(c, op, now);
    /* SQLite rolls a whole transaction back by itself on some errors (disk
     * full, I/O error, out of memory), and an action may end it against
     * its contract: the rest must not run outside it. */
    if (sqlite3_get_autocommit(c->db)) {
      batch_lost(c, ops, n, i);
      return;
    }
    if (op->rc != IDEM_OK) {
      if (op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL)
        op->claim->held = 0;
      /* A rejected action's writes must never commit: when they cannot be
       * undone alone, the whole batch is. */
      if (step_once(c, ST_ROLLBACK_SP) != SQLITE_OK) {
        exec(c, "ROLLBACK");
        batch_lost(c, ops, n, i);
        return;
      }
    }
    step_once(c, ST_RELEASE_SP);
  }
  {
    char why[256] = "the transaction ended";
    int src = prune_some(s, c, idem__now_ms(), why, sizeof why);
    if (src != SQLITE_OK) {
      /* Rolled back while expired records were removed: nothing of the
       * batch was kept, and no claim is held. */
      for (i = 0; i < n; i++) {
        if (ops[i]->rc == IDEM_OK)
          idem__op_fail(ops[i], map_rc(src),
                        "sqlite: the transaction was rolled back while "
                        "expired records were removed, nothing was stored: "
                        "%s",
                        why);
        if (ops[i]->kind == IDEM__OP_CLAIM || ops[i]->kind == IDEM__OP_LOCAL)
          ops[i]->claim->held = 0;
      }
      return;
    }
  }
  if (exec(c, "COMMIT") != SQLITE_OK) {
    char msg[256];
    errtext(c->db, msg, sizeof msg);
    int rc = map_rc(sqlite3_extended_errcode(c->db));
    exec(c, "ROLLBACK");
    for (i = 0; i < n; i++) {
      if (ops[i]->rc == IDEM_OK)
        idem__op_fail(ops[i], rc,
                      "sqlite: commit failed, nothing was stored: %s", msg);
      if (ops[i]->kind == IDEM__OP_CLAIM || ops[i]->kind == IDEM__OP_LOCAL)
        ops[i]->claim->held = 0;
    }
  }
}

/* ---- checkpoints ----------------------------------------------------------- */

#define CKPT_FRAMES 1000    /* as SQLite's own automatic checkpoint */
#define CKPT_PERIOD_MS 1000 /* and now and then for other processes' frames */

/*
 * A checkpoint whose fsync failed stops every later checkpoint of this
 * handle. The checkpoints before it that a reader kept from finishing wrote
 * database pages without syncing them, and counted their frames as copied;
 * a failed fsync may have forgotten those pages (as Linux does after a
 * writeback error), and no later checkpoint copies those frames again. Were
 * the log then to start over, a power loss would lose acknowledged commits
 * or corrupt the file: one in a few thousand power-loss trials with faults
 * did (tests/test_powerloss.c --faults). So, as PostgreSQL does after a
 * failed fsync, the log keeps every frame from then on: commits go on being
 * synced to it, nothing restarts it, and closing the handle leaves it as it
 * is. The next open of the store rebuilds the log's index, which copies
 * every frame again. The log grows until then: a process that meets this
 * should be restarted.
 */
static void ckpt_check(sq_store *s, int rc) {
  if (rc != SQLITE_IOERR_FSYNC)
    return;
  pthread_mutex_lock(&s->gc_mu);
  s->ckpt_broken = 1;
  s->restart_due = 0;
  pthread_mutex_unlock(&s->gc_mu);
}

/* The checkpoint of a connection without the checkpoint thread (a pool
 * connection's write, or a writer whose thread could not start): SQLite's
 * automatic checkpoint, with its result seen by ckpt_check(). */
static int wal_hook_inline(void *arg, sqlite3 *db, const char *name,
                           int frames) {
  sq_store *s = arg;
  int broken;
  (void)name;
  if (frames < CKPT_FRAMES)
    return SQLITE_OK;
  pthread_mutex_lock(&s->gc_mu);
  broken = s->ckpt_broken;
  pthread_mutex_unlock(&s->gc_mu);
  if (!broken)
    ckpt_check(s, sqlite3_wal_checkpoint_v2(db, NULL,
                                            SQLITE_CHECKPOINT_PASSIVE, NULL,
                                            NULL));
  return SQLITE_OK;
}

/* Called after each commit of the writer: asks for a checkpoint once the
 * log holds enough frames. Installing it turns the writer's automatic
 * checkpoint off. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames) {
  sq_store *s = arg;
  (void)db;
  (void)name;
  pthread_mutex_lock(&s->gc_mu);
  /* Ask once per CKPT_FRAMES new frames, not after every commit: a log that
   * cannot restart yet (a reader still uses it) stays long, and asking on
   * every commit would checkpoint on every commit. */
  if (frames < s->ckpt_seen)
    s->ckpt_next = CKPT_FRAMES; /* the log restarted */
  s->ckpt_seen = frames;
  if (frames >= s->ckpt_next) {
    s->ckpt_next = frames + CKPT_FRAMES;
    s->ckpt_wanted = 1;
    pthread_cond_signal(&s->ckpt_cv);
  }
  pthread_mutex_unlock(&s->gc_mu);
  return SQLITE_OK;
}

static void *checkpointer(void *arg) {
  sq_store *s = arg;
  conn *c = s->ckpt_conn;
  pthread_mutex_lock(&s->gc_mu);
  while (!s->ckpt_stop) {
    if (!s->ckpt_wanted) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_sec += CKPT_PERIOD_MS / 1000;
      pthread_cond_timedwait(&s->ckpt_cv, &s->gc_mu, &until);
      if (s->ckpt_stop)
        break;
    }
    s->ckpt_wanted = 0;
    int broken = s->ckpt_broken;
    pthread_mutex_unlock(&s->gc_mu);
    /* PASSIVE copies the log into the database without blocking anyone. */
    int log = 0, done = 0, rc = SQLITE_OK;
    if (!broken)
      rc = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE,
                                     &log, &done);
    pthread_mutex_lock(&s->gc_mu);
    if (rc == SQLITE_OK && log > 0 && !s->ckpt_broken)
      s->restart_due = 1;
    pthread_mutex_unlock(&s->gc_mu);
    ckpt_check(s, rc);
    pthread_mutex_lock(&s->gc_mu);
  }
  pthread_mutex_unlock(&s->gc_mu);
  return NULL;
}

/*
 * How long a leader waits for more callers before it commits: a fraction of
 * a commit, so that callers who just got their answer and come straight back
 * join the next batch instead of starting a half-empty one of their own.
 */
#define GATHER_MAX_US 400

/* No one leads: wakes the first caller queued to lead the next batch, and
 * the scheduler if it waits for the writer. Under gc_mu. */
static void hand_on_lead(sq_store *s) {
  if (s->head)
    pthread_cond_signal(s->head->waiter);
  pthread_cond_broadcast(&s->gc_cv);
}

/* Queues op for the next group commit and returns once it has run. */
static void submit(sq_store *s, idem__op *op) {
  idem__op *batch[BATCH_MAX];
  pthread_cond_t me; /* this caller's own: woken when its op ran, or when
                        it is first in the queue and no one leads */
  pthread_cond_init(&me, NULL);
  pthread_mutex_lock(&s->gc_mu);
  op->next = NULL;
  op->done = 0;
  op->waiter = &me;
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->queued++;
  s->inside++;
  if (s->inside > s->peak)
    s->peak = s->inside;
  pthread_cond_signal(&s->gather_cv);
  while (!op->done) {
    if (s->leading) {
      /* Woken by the leader that runs one of our ops, or handing the lead
       * on: never by every batch, which with thousands queued would wake
       * them all each time. */
      pthread_cond_wait(&me, &s->gc_mu);
      continue;
    }
    s->leading = 1;
    /* Gather: with several callers about, wait briefly until as many are
     * queued as took part in the last two batches (no more than have been
     * seen at once). A lone caller never waits. The wait comes before
     * BEGIN IMMEDIATE on purpose: it is when writers of other processes
     * get the write lock. Running the first callers while waiting for the
     * rest (locked) was measured +13% faster with 16 threads, but it let
     * such a busy process hold the lock all the time, and a second
     * process's writer then managed one call per second. */
    int target = s->last_batch > 1 ? s->last_batch + s->prev_batch : 1;
    if (target > s->peak)
      target = s->peak;
    if (target > BATCH_MAX)
      target = BATCH_MAX;
    if (s->queued < target) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_nsec += GATHER_MAX_US * 1000L;
      if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
      }
      while (s->queued < target &&
             pthread_cond_timedwait(&s->gather_cv, &s->gc_mu, &until) == 0)
        ;
    }
    int n = 0;
    while (s->head && n < BATCH_MAX) {
      batch[n++] = s->head;
      s->head = s->head->next;
    }
    if (!s->head)
      s->tail = NULL;
    s->queued -= n;
    s->prev_batch = s->last_batch;
    s->last_batch = n;
    /* The peak is re-learned now and then, so that it follows the load. */
    if (++s->batches % 64 == 0)
      s->peak = s->inside;
    pthread_mutex_unlock(&s->gc_mu);
    run_batch(s, s->writer, batch, n);
    pthread_mutex_lock(&s->gc_mu);
    for (int i = 0; i < n; i++) {
      batch[i]->done = 1;
      if (batch[i]->waiter != &me)
        pthread_cond_signal(batch[i]->waiter);
    }
    s->leading = 0;
    hand_on_lead(s);
  }
  /* Our op ran in another's batch: the lead may be free with callers
   * queued whom no one woke. */
  if (!s->leading)
    hand_on_lead(s);
  s->inside--;
  pthread_mutex_unlock(&s->gc_mu);
  pthread_cond_destroy(&me);
}

/* Renewals of many leases: one group commit (or one transaction per
 * BATCH_MAX of them without group commit). */
static void sq_run_many(void *state, idem__op **ops, int n) {
  sq_store *s = state;
  conn *c = NULL;
  int rc;
  for (int i = 0; i < n; i++) {
    ops[i]->rc = IDEM_OK;
    ops[i]->errmsg[0] = '\0';
  }
  if (s->writer) {
    /* The scheduler leads a transaction of its own on the writer, ahead
     * of the callers queued: one commit for every renewal due, however
     * many, where group commit would take them BATCH_MAX at a time
     * behind the claims. */
    pthread_mutex_lock(&s->gc_mu);
    while (s->leading)
      pthread_cond_wait(&s->gc_cv, &s->gc_mu);
    s->leading = 1;
    pthread_mutex_unlock(&s->gc_mu);
    run_batch(s, s->writer, ops, n);
    pthread_mutex_lock(&s->gc_mu);
    s->leading = 0;
    hand_on_lead(s);
    pthread_mutex_unlock(&s->gc_mu);
    return;
  }
  if ((rc = pool_get(s, &c)) != IDEM_OK) {
    for (int i = 0; i < n; i++)
      idem__op_fail(ops[i], rc, "%s", idem_errmsg());
    return;
  }
  for (int i = 0; i < n; i += BATCH_MAX)
    run_batch(s, c, ops + i, n - i < BATCH_MAX ? n - i : BATCH_MAX);
  pool_put(s, c);
}

/* Leases are written by this process's own clock. */
static int64_t sq_clock_ahead(void *state) {
  (void)state;
  return 0;
}

/* Puts the completed record that op read or wrote in the cache, once its
 * batch committed. */
static void cache_committed(sq_store *s, idem__op *op) {
  const idem_response *r;
  int recovered;
  if (!op->cache_it || op->rc != IDEM_OK)
    return;
  if (op->kind == IDEM__OP_COMPLETE) {
    r = op->response;
    recovered = op->cache_attempt > 1;
  } else {
    r = &op->claim->response;
    recovered = op->claim->recovered;
  }
  idem__cache_put(s->cache, op->id, op->fingerprint, op->cache_expires_ms,
                  op->cache_attempt, recovered, r->status,
                  r->meta_len ? r->meta : NULL, r->meta_len, r->body,
                  r->body_len);
}

static void sq_run(void *state, idem__op *op) {
  sq_store *s = state;
  conn *c = NULL;
  int rc;

  op->cache_it = 0;
  if (op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL) {
    idem__row row;
    idem__action action;
    int64_t now = idem__now_ms();
    if (idem__cache_get(s->cache, op, now))
      return;
    /* With a writer, a claim that the cache cannot answer is decided by the
     * writer, under the write lock: most are new keys, which must be
     * written anyway, and a read on a pooled connection first cost each of
     * them a transaction of its own (about a fifth of the throughput at 16
     * callers). Records the writer reads completed are cached. */
    if (s->writer) {
      submit(s, op);
      cache_committed(s, op);
      return;
    }
    /* Without one, outcomes that write nothing are answered from a pooled
     * connection's snapshot without waiting for the write lock. */
    rc = pool_get(s, &c);
    if (rc != IDEM_OK) {
      idem__op_fail(op, rc, "%s", idem_errmsg());
      return;
    }
    rc = load_and_decide(c, op, now, &row, &action);
    if (rc == IDEM_OK && action == IDEM__ACT_NONE) {
      pool_put(s, c);
      if (op->claim->outcome == IDEM_REPLAY) {
        const idem_response *r = &op->claim->response;
        idem__cache_put(s->cache, op->id, row.fingerprint, row.expires_ms,
                        row.attempt, row.recovered, r->status, r->meta,
                        r->meta_len, r->body, r->body_len);
      }
      return;
    }
    if (rc != IDEM_OK && rc != IDEM_EBUSY) {
      pool_put(s, c);
      return;
    }
    op->rc = IDEM_OK;
    op->errmsg[0] = '\0';
    free(op->claim->resp_buf);
    op->claim->resp_buf = NULL;
    op->claim->has_response = 0;
    run_batch(s, c, &op, 1);
    pool_put(s, c);
    cache_committed(s, op);
    return;
  }
  if (s->writer) {
    submit(s, op);
    cache_committed(s, op);
    return;
  }
  rc = pool_get(s, &c);
  if (rc != IDEM_OK) {
    idem__op_fail(op, rc, "%s", idem_errmsg());
    return;
  }
  run_batch(s, c, &op, 1);
  pool_put(s, c);
  cache_committed(s, op);
}

/* ---- open and close ------------------------------------------------------ */

static void sq_close(void *state) {
  sq_store *s = state;
  conn *c;
  if (!s)
    return;
  if (s->ckpt_running) {
    pthread_mutex_lock(&s->gc_mu);
    s->ckpt_stop = 1;
    pthread_cond_signal(&s->ckpt_cv);
    pthread_mutex_unlock(&s->gc_mu);
    pthread_join(s->ckpt_thread, NULL);
  }
  /* After a failed checkpoint the last connection to close must not copy
   * the log and delete it: see ckpt_check(). */
  if (s->ckpt_broken) {
    for (c = s->idle; c; c = c->next)
      sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    if (s->ckpt_conn)
      sqlite3_db_config(s->ckpt_conn->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1,
                        NULL);
    if (s->writer)
      sqlite3_db_config(s->writer->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1,
                        NULL);
  }
  conn_close(s->ckpt_conn);
  while ((c = s->idle)) {
    s->idle = c->next;
    conn_close(c);
  }
  conn_close(s->writer);
  idem__cache_free(s->cache);
  pthread_mutex_destroy(&s->pool_mu);
  pthread_cond_destroy(&s->pool_cv);
  pthread_mutex_destroy(&s->gc_mu);
  pthread_cond_destroy(&s->gc_cv);
  pthread_cond_destroy(&s->gather_cv);
  pthread_cond_destroy(&s->ckpt_cv);
  free(s->path);
  free(s);
}

/*
 * Creates a missing store file with mode 0600 before SQLite opens it: the
 * store holds requests and outputs, and SQLite gives its -wal and -shm
 * files the mode of the database file. An existing file keeps its mode.
 */
static int create_private(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return IDEM_OK;
  }
  if (errno == EEXIST)
    return IDEM_OK;
  return idem__fail(IDEM_ESTORE, "store '%s': cannot create the file: %s",
                    path, strerror(errno));
}

static int sq_open(const char *target, const idem_store_options *opts,
                   void **state) {
  sq_store *s;
  conn *c = NULL;
  int rc;
  *state = NULL;
  if (strcmp(target, ":memory:") == 0 || strncmp(target, "file:", 5) == 0)
    return idem__fail(IDEM_EURL,
                      "store '%s': SQLite's special names are not stores "
                      "(an in-memory database would be private to one "
                      "connection); give a file path",
                      target);
  {
    struct stat st;
    if (stat(target, &st) == 0 && S_ISDIR(st.st_mode))
      return idem__fail(IDEM_ESTORE,
                        "store '%s' is a directory; name a file (for "
                        "example %s/idem.db)",
                        target, target);
  }
  if (!opts->read_only && (rc = create_private(target)) != IDEM_OK)
    return rc;
  s = calloc(1, sizeof *s);
  if (!s)
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  s->o = *opts;
  if (s->o.busy_timeout_ms <= 0)
    s->o.busy_timeout_ms = 10000;
  if (s->o.max_connections <= 0)
    s->o.max_connections = 16;
  s->path = idem__strdup(target);
  s->cache = idem__cache_new(s->o.replay_cache_entries);
  pthread_mutex_init(&s->pool_mu, NULL);
  pthread_cond_init(&s->pool_cv, NULL);
  pthread_mutex_init(&s->gc_mu, NULL);
  pthread_cond_init(&s->gc_cv, NULL);
  {
    /* Their timed waits count on the monotonic clock, which nobody sets
     * back. */
    pthread_condattr_t mono;
    pthread_condattr_init(&mono);
    pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
    pthread_cond_init(&s->gather_cv, &mono);
    pthread_cond_init(&s->ckpt_cv, &mono);
    pthread_condattr_destroy(&mono);
  }
  s->ckpt_next = CKPT_FRAMES;
  snprintf(s->version, sizeof s->version, "%s", sqlite3_libversion());
  if (!s->path || (!s->cache && s->o.replay_cache_entries >= 0)) {
    sq_close(s);
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  }
  rc = conn_open(s, &c);
  if (rc == IDEM_OK)
    rc = ensure_schema(s, c);
  if (rc == IDEM_OK) {
    /* From now on the file is named as SQLite resolved it: connections
     * opened later, and the log's check, must find this very file even
     * after the process changes its working folder. */
    const char *full = sqlite3_db_filename(c->db, "main");
    char *copy = full && *full ? idem__strdup(full) : NULL;
    if (full && *full && !copy) {
      rc = idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
    } else if (copy) {
      free(s->path);
      s->path = copy;
    }
  }
  if (rc != IDEM_OK) {
    conn_close(c);
    sq_close(s);
    return rc;
  }
  s->nconn = 1;
  c->next = NULL;
  s->idle = c;
  if (!s->o.read_only)
    note_files(s);
  if (s->o.group_commit >= 0 && !s->o.read_only) {
    rc = conn_open(s, &s->writer);
    if (rc != IDEM_OK) {
      sq_close(s);
      return rc;
    }
    /* The checkpoint thread's connection is opened here, so that a thread
     * that could not work never replaces the writer's own checkpoints.
     * Without it the writer keeps SQLite's automatic checkpoint. */
    if (conn_open(s, &s->ckpt_conn) == IDEM_OK &&
        idem__thread_start(&s->ckpt_thread, checkpointer, s) == 0) {
      s->ckpt_running = 1;
      sqlite3_wal_hook(s->writer->db, wal_hook, s);
    } else {
      conn_close(s->ckpt_conn);
      s->ckpt_conn = NULL;
      idem__clear_error();
    }
  }
  *state = s;
  return IDEM_OK;
}

static const char *sq_engine_version(void *state) {
  return ((sq_store *)state)->version;
}

/* ---- operators ------------------------------------------------------------ */

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

/* Columns in RECORD_COLUMNS order. */
static int row_to_record(sqlite3_stmt *q, idem_record **out) {
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
  p.expires_ms = sqlite3_column_int64(q, 9);
  p.request = col_bytes(q, 10, &p.request_len);
  p.status = sqlite3_column_int(q, 11);
  p.meta = col_bytes(q, 12, &p.meta_len);
  p.body = col_bytes(q, 13, &p.body_len);
  p.recovered = sqlite3_column_int(q, RECORD_RECOVERED);
  return idem__record_new(&p, out);
}

static int sq_get(void *state, const idem_id *id, idem_record **out) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int rc = pool_get(s, &c), step;
  if (rc != IDEM_OK)
    return rc;
  q = stmt(c, ST_GET);
  if (!q) {
    rc = read_failed(s, c, "prepare");
    goto out;
  }
  sqlite3_bind_int64(q, 1, idem__now_ms());
  bind_id(q, id, 2);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    int version = sqlite3_column_int(q, RECORD_VERSION);
    rc = schema_known(s, version) ? row_to_record(q, out)
                                  : schema_refused(s, version);
  } else if (step == SQLITE_DONE) {
    /* No row read the version: read it on its own. */
    if ((rc = schema_unchanged(s, c)) == IDEM_OK)
      rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                      id->tenant ? id->tenant : "", id->operation, id->key);
  } else {
    rc = read_failed(s, c, "get");
  }
  sqlite3_reset(q);
out:
  pool_put(s, c);
  return rc;
}

#define LIST_PAGE 256

/*
 * Reads records a page at a time and calls fn with no connection held: fn
 * may call back into the store (even with max_connections = 1), and no read
 * snapshot stays open while it works, which would keep the log from being
 * reused. Each page starts after the last record of the one before.
 */
static int sq_list(void *state, const idem_filter *f, idem_record_fn fn,
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
    if ((rc = pool_get(s, &c)) != IDEM_OK)
      break;
    q = stmt(c, ST_LIST);
    if (!q) {
      rc = read_failed(s, c, "prepare");
      pool_put(s, c);
      break;
    }
    sqlite3_bind_int64(q, 1, idem__now_ms());
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
      if (!schema_known(s, version)) {
        rc = schema_refused(s, version);
        break;
      }
      if ((rc = row_to_record(q, &page[n])) != IDEM_OK)
        break;
      n++;
    }
    if (rc == IDEM_OK && n < want && step != SQLITE_DONE)
      rc = read_failed(s, c, "list");
    sqlite3_reset(q);
    /* An empty page read no version: read it on its own. */
    if (rc == IDEM_OK && n == 0)
      rc = schema_unchanged(s, c);
    pool_put(s, c);
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

/* An operator's write through a handle whose log was deleted would go
 * into the lost log and vanish when the store closes: IDEM_ESTORE. */
static int operator_may_write(sq_store *s, conn *c) {
  char why[512];
  if (!files_intact(s, why, sizeof why))
    return idem__fail(IDEM_ESTORE, "%s", why);
  return schema_unchanged(s, c);
}

/*
 * Begins an operator's write transaction and checks, inside it, that the
 * handle may write (the version read under the write lock, so that no
 * migration can come between the check and the write). IDEM_OK with the
 * transaction open, or the error with none.
 */
static int operator_begin(sq_store *s, conn *c) {
  int rc;
  if (exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
    return sqlite_fail(c, "begin");
  if ((rc = operator_may_write(s, c)) != IDEM_OK)
    exec(c, "ROLLBACK");
  return rc;
}

/* Commits what operator_begin() began when rc is IDEM_OK, else rolls it
 * back. Returns the result. */
static int operator_end(conn *c, int rc) {
  if (rc == IDEM_OK && exec(c, "COMMIT") != SQLITE_OK)
    rc = sqlite_fail(c, "commit");
  if (!sqlite3_get_autocommit(c->db))
    exec(c, "ROLLBACK");
  return rc;
}

static int sq_prune(void *state, int64_t *removed) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int64_t n = 0;
  int rc = pool_get(s, &c);
  if (rc != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) != IDEM_OK) {
    pool_put(s, c);
    return rc;
  }
  q = stmt(c, ST_PRUNE);
  if (!q) {
    rc = sqlite_fail(c, "prepare");
  } else {
    sqlite3_bind_int64(q, 1, idem__now_ms());
    if (sqlite3_step(q) != SQLITE_DONE)
      rc = sqlite_fail(c, "prune");
    else
      n = sqlite3_changes(c->db);
    sqlite3_reset(q);
  }
  if ((rc = operator_end(c, rc)) == IDEM_OK)
    *removed = n;
  pool_put(s, c);
  return rc;
}

static int sq_resolve(void *state, const idem_id *id,
                      const idem_response *r,
                      const idem_resolve_options *o) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  char fp[IDEM_FINGERPRINT_SIZE] = "", sum[IDEM_FINGERPRINT_SIZE];
  int found = 0, st = 0, step;
  int64_t now, lease = 0;
  int rc = pool_get(s, &c);
  if (rc != IDEM_OK)
    return rc;
  if (exec(c, "BEGIN IMMEDIATE") != SQLITE_OK) {
    rc = sqlite_fail(c, "begin");
    pool_put(s, c);
    return rc;
  }
  if ((rc = operator_may_write(s, c)) != IDEM_OK)
    goto out;
  now = idem__now_ms();
  q = stmt(c, ST_SELECT);
  if (!q) {
    rc = sqlite_fail(c, "prepare");
    goto out;
  }
  bind_id(q, id, 1);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    found = 1;
    snprintf(fp, sizeof fp, "%s", (const char *)sqlite3_column_text(q, 0));
    st = sqlite3_column_int(q, 1);
    lease = sqlite3_column_int64(q, 3);
  } else if (step != SQLITE_DONE) {
    rc = sqlite_fail(c, "read record");
    sqlite3_reset(q);
    goto out;
  }
  sqlite3_reset(q);
  if (!found) {
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_COMPLETED) {
    rc = idem__fail(IDEM_ESTATE,
                    "record (%s, %s, %s) is already completed; nothing to "
                    "resolve",
                    id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_IN_PROGRESS && lease > now && !o->force) {
    rc = idem__fail(IDEM_ESTATE,
                    "record (%s, %s, %s) is held by a run whose lease ends "
                    "in %.1f s: it may still be acting; wait for the lease "
                    "to end, or force it",
                    id->tenant ? id->tenant : "", id->operation, id->key,
                    (double)(lease - now) / 1000.0);
    goto out;
  }
  if (r) {
    if (idem__response_checksum(fp, r->status, r->meta, r->meta_len, r->body,
                                r->body_len, sum) != IDEM_OK) {
      rc = idem__fail(IDEM_ENOMEM, "out of memory");
      goto out;
    }
    q = stmt(c, ST_RESOLVE_DONE);
    if (!q) {
      rc = sqlite_fail(c, "prepare");
      goto out;
    }
    bind_id(q, id, 1);
    sqlite3_bind_int64(q, 4, now);
    sqlite3_bind_int64(q, 5, idem__deadline(now, o->retention_ms));
    sqlite3_bind_int(q, 6, r->status);
    if (r->meta)
      sqlite3_bind_blob(q, 7, r->meta, (int)r->meta_len, SQLITE_STATIC);
    sqlite3_bind_blob(q, 8, r->body_len ? r->body : "", (int)r->body_len,
                      SQLITE_STATIC);
    sqlite3_bind_text(q, 9, sum, -1, SQLITE_STATIC);
  } else {
    q = stmt(c, ST_RESOLVE_DELETE);
    if (!q) {
      rc = sqlite_fail(c, "prepare");
      goto out;
    }
    bind_id(q, id, 1);
  }
  if (sqlite3_step(q) != SQLITE_DONE)
    rc = sqlite_fail(c, "resolve");
  sqlite3_reset(q);
  if (rc == IDEM_OK && exec(c, "COMMIT") != SQLITE_OK)
    rc = sqlite_fail(c, "commit");
out:
  if (!sqlite3_get_autocommit(c->db))
    exec(c, "ROLLBACK");
  pool_put(s, c);
  return rc;
}

static int sq_remove(void *state, const idem_id *id) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int rc = pool_get(s, &c), changed = 0;
  if (rc != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) != IDEM_OK) {
    pool_put(s, c);
    return rc;
  }
  q = stmt(c, ST_DELETE);
  if (!q) {
    rc = sqlite_fail(c, "prepare");
  } else {
    bind_id(q, id, 1);
    if (sqlite3_step(q) != SQLITE_DONE)
      rc = sqlite_fail(c, "delete");
    else
      changed = sqlite3_changes(c->db);
    sqlite3_reset(q);
  }
  rc = operator_end(c, rc);
  pool_put(s, c);
  /* This handle must not replay what it just deleted. */
  if (rc == IDEM_OK)
    idem__cache_forget(s->cache, id);
  if (rc == IDEM_OK && changed == 0)
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
  return rc;
}

/* Less room than this on the store's filesystem counts as a full disk. */
#define CHECK_MIN_FREE (1024 * 1024)

/*
 * Whether a claim could be written now. The files must still be the ones
 * opened, and the folder writable: the store works on while it is open,
 * but SQLite makes its -wal and -shm files there whenever the store is
 * opened again (by a restart, or by `idem keys`), so a store in a folder
 * turned read-only is a store that will not open. The filesystem must have
 * CHECK_MIN_FREE bytes left: a commit that overwrites log frames already
 * on the disk needs no new room, so a small write can still succeed on a
 * full disk while a claim with a larger request fails, and a checkpoint
 * that cannot grow the database keeps the log growing until every commit
 * fails. Then a write transaction must commit: a row written into
 * idem_meta and deleted again, so that the commit writes the log and syncs
 * it as a claim's does (a failing disk fails it, as it would fail a claim)
 * and leaves nothing behind.
 */
static int sq_check(void *state) {
  sq_store *s = state;
  char folder[4096];
  conn *c;
  int rc;
  if (s->o.read_only)
    return idem__fail(IDEM_ESTORE,
                      "store '%s': opened read-only, it takes no writes",
                      s->path);
  folder_of(s->path, folder, sizeof folder);
  if (faccessat(AT_FDCWD, folder, W_OK, AT_EACCESS) != 0)
    return idem__fail(IDEM_ESTORE,
                      "store '%s': its folder '%s' is not writable (%s); "
                      "the store cannot be opened again for writing (it "
                      "makes its -wal and -shm files there)",
                      s->path, folder, strerror(errno));
  {
    struct statvfs fs;
    /* A filesystem that reports no size at all (some FUSE ones) says
     * nothing about its room. */
    if (statvfs(folder, &fs) == 0 && fs.f_blocks > 0 &&
        (unsigned long long)fs.f_bavail * fs.f_frsize < CHECK_MIN_FREE)
      return idem__fail(IDEM_EIO,
                        "store '%s': its disk is full (%llu bytes left, "
                        "less than %d); claims fail once the log must "
                        "grow",
                        s->path,
                        (unsigned long long)fs.f_bavail * fs.f_frsize,
                        CHECK_MIN_FREE);
  }
  if ((rc = pool_get(s, &c)) != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) == IDEM_OK) {
    if (exec(c, "INSERT OR REPLACE INTO idem_meta VALUES ('store_check', "
                "'1')") != SQLITE_OK ||
        exec(c, "DELETE FROM idem_meta WHERE name = 'store_check'") !=
            SQLITE_OK)
      rc = sqlite_fail(c, "check: write");
    rc = operator_end(c, rc);
  }
  pool_put(s, c);
  return rc;
}

const idem__store_methods idem__sqlite_methods = {
    IDEM__STORE_METHODS_VERSION,
    "sqlite",
    sq_open,
    sq_close,
    sq_engine_version,
    sq_run,
    sq_get,
    sq_list,
    sq_prune,
    sq_resolve,
    sq_remove,
    sq_run_many,
    NULL, /* watch: waiters of other processes poll */
    sq_clock_ahead,
    sq_check,
};
