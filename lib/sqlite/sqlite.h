/*
 * sqlite.h -- what the files of the SQLite store share; never installed,
 * and included by the files of lib/sqlite/ only.
 *
 * The embedded SQLite backend.
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
 *
 * The store is split by concern:
 *
 *   store.c        the method table, open and close
 *   conn.c         connections, their pragmas, the pool, errors
 *   schema.c       creating and migrating the schema; its version
 *   rows.c         the SQL, the decision's read, the writes, local actions
 *   writer.c       group commit: the queue, the leader, the batch
 *   maintenance.c  checkpoints, retention, the files, the operators' writes
 *
 * Names shared between them begin with idem__sq_; the rest are static.
 */
#ifndef IDEM_SQLITE_H
#define IDEM_SQLITE_H

#include "cache.h"
#include "lease.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/types.h>

/* 1: idem 0.2; 2: the recovered mark (idem_record.recovered); 3: leases
 * on the boot-time clock of the boot named in idem_meta's lease_boot. */
#define SCHEMA_VERSION 3
#define BATCH_MAX 64
#define ASYNC_LEADERS 2
#define CKPT_FRAMES 1000    /* as SQLite's own automatic checkpoint */
#define CKPT_PERIOD_MS 1000 /* and now and then for other processes' frames */

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
  ST_BEGIN,
  ST_COMMIT,
  ST_VERSION,
  ST_COUNT
};

struct sq_store;

typedef struct conn {
  sqlite3 *db;
  struct sq_store *store;
  unsigned commits; /* counted by a commit hook: see run_local() */
  /* The caller's own connection (idem_execute_in()), wrapped for a call:
   * no commit hook counts its commits; gone: the caller's action closed it
   * (IDEM_LOCAL_CLOSED), so it is not touched again. */
  int foreign, gone;
  sqlite3_stmt *st[ST_COUNT];
  struct conn *next;
} conn;

typedef struct sq_store {
  char *path;
  idem_store_options o;
  char version[32];
  /* The oldest schema version this handle's statements read right:
   * SCHEMA_VERSION, or the store's own for a read-only handle on an older
   * one (which it may not migrate). */
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
  int queued, inside, peak; /* queued ops; callers in submit(); their peak */
  int last_batch, prev_batch;
  unsigned batches;
  /* The store's own leaders, for ops queued by callers that do not wait
   * (idem__sq_queue()): started when the first is queued. */
  pthread_t async_threads[ASYNC_LEADERS];
  int async_started, async_stop;
  pthread_cond_t async_cv;

  /* Checkpoints run on a thread of their own, so that no batch of callers
   * waits for the write-ahead log to be copied into the database. */
  pthread_t ckpt_thread;
  conn *ckpt_conn;
  int ckpt_running, ckpt_wanted, ckpt_stop;
  int ckpt_seen, ckpt_next; /* log frames at the last commit; next request */
  int restart_due;          /* the thread copied the log: restart it */
  /* A checkpoint's fsync failed: see idem__sq_ckpt_check(). Under gc_mu. */
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

/* ---- conn.c -------------------------------------------------------------- */

int idem__sq_map_rc(int src);
const char *idem__sq_errtext(sqlite3 *db, char *buf, size_t size);
int idem__sq_op_sqlite_fail(idem__op *op, conn *c, const char *what);
int idem__sq_sqlite_fail(conn *c, const char *what);
void idem__sq_conn_close(conn *c);
int idem__sq_exec(conn *c, const char *sql);
void idem__sq_folder_of(const char *path, char *buf, size_t size);
int idem__sq_conn_open(sq_store *s, conn **out);
int idem__sq_pool_get(sq_store *s, conn **out);
void idem__sq_pool_put(sq_store *s, conn *c);

/* ---- schema.c ------------------------------------------------------------ */

int idem__sq_ensure_schema(sq_store *s, conn *c);
int idem__sq_schema_known(const sq_store *s, int v);
void idem__sq_schema_problem(const sq_store *s, int v, char *why, size_t size);
int idem__sq_schema_refused(const sq_store *s, int v);
int idem__sq_read_failed(sq_store *s, conn *c, const char *what);
int idem__sq_op_read_failed(conn *c, idem__op *op, const char *what);
int idem__sq_schema_unchanged(sq_store *s, conn *c);

/* ---- rows.c -------------------------------------------------------------- */

sqlite3_stmt *idem__sq_stmt(conn *c, int which);
void idem__sq_bind_id(sqlite3_stmt *q, const idem_id *id, int first);
int idem__sq_load_and_decide(conn *c, idem__op *op, int64_t now, idem__row *row,
                             idem__action *action);
void idem__sq_cache_later(idem__op *op, int64_t expires_ms, int attempt);
void idem__sq_run_one(conn *c, idem__op *op, int64_t now);
int idem__sq_step_once(conn *c, int which);
int idem__sq_get(void *state, const idem_id *id, idem_record **out);
int idem__sq_list(void *state, const idem_filter *f, idem_record_fn fn,
                  void *ctx);
/* idem_execute_in() (store.h's run_in). */
void idem__sq_run_in(void *state, idem__op *op);

/* ---- writer.c ------------------------------------------------------------ */

void idem__sq_run_many(void *state, idem__op **ops, int n);
int64_t idem__sq_clock_ahead(void *state);
void idem__sq_run(void *state, idem__op *op);
/* Queues op for the next group commit; op->on_done(op) runs once it has
 * (at once for a replay from the cache). 0, or -1 when this store cannot
 * queue (no writer): the caller runs it. */
int idem__sq_queue(void *state, idem__op *op);
/* A claim answered from the replay cache alone (store.h's cached). */
int idem__sq_cached(void *state, idem__op *op);

/* ---- maintenance.c ------------------------------------------------------- */

int idem__sq_prune_some(sq_store *s, conn *c, int64_t now, char *why,
                        size_t size);
void idem__sq_note_files(sq_store *s);
int idem__sq_files_intact(sq_store *s, char *why, size_t size);
void idem__sq_ckpt_check(sq_store *s, int rc);
int idem__sq_wal_hook_inline(void *arg, sqlite3 *db, const char *name,
                             int frames);
int idem__sq_wal_hook(void *arg, sqlite3 *db, const char *name, int frames);
void *idem__sq_checkpointer(void *arg);
int idem__sq_prune(void *state, int64_t *removed);
int idem__sq_resolve(void *state, const idem_id *id, const idem_response *r,
                     const idem_resolve_options *o);
int idem__sq_remove(void *state, const idem_id *id);
int idem__sq_check(void *state);

#endif
