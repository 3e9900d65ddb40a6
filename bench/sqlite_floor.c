/*
 * bench/sqlite_floor.c -- the floor under the SQLite store's fresh path:
 * SQLite itself doing only the writes that `idem bench`'s fresh and claim +
 * complete phases need, with the best group commit a program can have, so
 * that a target for idem can be set against what the disk and SQLite allow
 * on the machine of the day.
 *
 * The store is made by idem_store_open() (idem's schema and pragmas:
 * WAL, synchronous=FULL); then everything is plain SQLite:
 *
 *   - WORKERS threads, each calling in a loop; a call is a few snprintf()s
 *     (its key) and a wait: no JSON, no fingerprint, no cache, no lease;
 *   - one writer thread with its own connection takes every call queued,
 *     runs them in one transaction (prepared BEGIN IMMEDIATE and COMMIT,
 *     prepared statements, no savepoint, no read before a write), commits
 *     once and wakes exactly the callers of that batch, each on its own
 *     condition variable; calls that arrive meanwhile form the next batch
 *     at once (no gathering wait);
 *   - checkpoints as the store makes them: a thread with a connection of
 *     its own copies the log once it holds 1000 frames, and the writer
 *     copies the few frames added since before its next BEGIN, so the log
 *     restarts instead of growing.
 *
 *   fresh            per call, in its batch's transaction: one INSERT into
 *                    bench_tickets and one INSERT of the completed record
 *                    (idem bench's fresh: a local action and its record)
 *   claim_complete   per call, two batches: the INSERT of the claim (state
 *                    1), then the UPDATE that completes it (idem bench's
 *                    claim_complete: two durable writes)
 *
 * Usage: sqlite_floor DIR WORKERS SECONDS [GATHER_US]
 * GATHER_US: how long the writer waits, once a call is queued, for every
 * worker to be queued (default 0: it takes what is there; bench/compare.sh
 * gives 200, the best of 0, 200, 400, 1000 and 3000 measured here: without
 * it a batch of 16 workers splits into two halves taking turns). Prints one
 * JSON object: {"workers": N, "fresh_ops_per_s": ...,
 * "claim_complete_ops_per_s": ..., "fresh_batch": ..., ...}, the keys of
 * `idem bench --json` for the same phases, so bench/compare.sh prints both
 * side by side. Exits non-zero when a statement fails.
 */
#define _GNU_SOURCE
#include "idem.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 256
#define CKPT_FRAMES 1000

/* A record's fields as idem bench's calls store them (sizes of the real
 * rows: a 64-hex fingerprint and checksum, the 92-byte request). */
static const char fingerprint[] =
    "3da2c84fe2cb9d2299d3bb65b92c4b05f24b59744873156a64dffabae64c6b2f";
static const char checksum[] =
    "42f6d24458ba552ba613930a9eda560d8f84c7ea39379a0707b6fc65bcf77379";
static const char request[] =
    "{\"payload\":{\"priority\":\"normal\",\"project\":\"demo-agent\",\"title\":"
    "\"Investigate a synthetic queue backlog\"}}";

enum { FRESH, CLAIM, COMPLETE };

typedef struct call {
  pthread_cond_t cv;
  int done;
  int kind;
  char key[64];
} call;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* the writer waits for calls */
  call *queue[MAX_WORKERS];
  int queued;
  int stop;
  int failed;
  long batches, batched;
  /* checkpoints */
  pthread_cond_t ckpt_cv;
  int ckpt_wanted, restart_due;
} q = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0, 0, 0,
       0, 0, PTHREAD_COND_INITIALIZER, 0, 0};

static const char *path;
static int workers;
static long gather_us;
static atomic_int running;
static char run_id[32];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static sqlite3 *open_conn(void) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
  /* The wait on a lock before the pragmas: the writer and the checkpointer
   * open theirs at once, and a pragma that finds the other's lock without
   * one fails at once ("database is locked", one run of about 40). */
  if (rc == SQLITE_OK)
    sqlite3_busy_timeout(db, 10000);
  if (rc != SQLITE_OK ||
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                   "PRAGMA wal_autocheckpoint=0",
                   NULL, NULL, NULL) != SQLITE_OK) {
    fprintf(stderr, "sqlite_floor: %s: %s\n", path,
            db ? sqlite3_errmsg(db) : "cannot open");
    exit(1);
  }
  return db;
}

static sqlite3_stmt *prepare(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) !=
      SQLITE_OK) {
    fprintf(stderr, "sqlite_floor: %s: %s\n", sql, sqlite3_errmsg(db));
    exit(1);
  }
  return st;
}

static int step(sqlite3 *db, sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  if (rc != SQLITE_DONE) {
    fprintf(stderr, "sqlite_floor: %s: %s\n", sqlite3_sql(st),
            sqlite3_errmsg(db));
    return -1;
  }
  return 0;
}

/* Asks for a checkpoint once the log holds CKPT_FRAMES more frames. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames) {
  static int next = CKPT_FRAMES, seen;
  (void)arg, (void)db, (void)name;
  pthread_mutex_lock(&q.mu);
  if (frames < seen)
    next = CKPT_FRAMES;
  seen = frames;
  if (frames >= next) {
    next = frames + CKPT_FRAMES;
    q.ckpt_wanted = 1;
    pthread_cond_signal(&q.ckpt_cv);
  }
  pthread_mutex_unlock(&q.mu);
  return SQLITE_OK;
}

static void *checkpointer(void *arg) {
  sqlite3 *db = open_conn();
  (void)arg;
  pthread_mutex_lock(&q.mu);
  while (!q.stop) {
    if (!q.ckpt_wanted) {
      pthread_cond_wait(&q.ckpt_cv, &q.mu);
      continue;
    }
    q.ckpt_wanted = 0;
    pthread_mutex_unlock(&q.mu);
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE,
                                       &log, &done);
    pthread_mutex_lock(&q.mu);
    if (rc == SQLITE_OK && log > 0)
      q.restart_due = 1;
  }
  pthread_mutex_unlock(&q.mu);
  sqlite3_close(db);
  return NULL;
}

static void *writer(void *arg) {
  sqlite3 *db = open_conn();
  sqlite3_stmt *begin = prepare(db, "BEGIN IMMEDIATE");
  sqlite3_stmt *commit = prepare(db, "COMMIT");
  sqlite3_stmt *ticket =
      prepare(db, "INSERT INTO bench_tickets (payload) VALUES (?1)");
  sqlite3_stmt *record = prepare(
      db, "INSERT INTO idem_records (tenant, operation, key, fingerprint, "
          "request, state, owner, attempt, created_ms, updated_ms, "
          "lease_expires_ms, expires_ms, status, meta, body, checksum, "
          "recovered) VALUES ('bench', 'create_ticket', ?1, ?2, ?3, ?4, ?5, "
          "1, ?6, ?6, ?7, ?8, ?9, NULL, ?10, ?11, 0)");
  sqlite3_stmt *complete = prepare(
      db, "UPDATE idem_records SET state = 2, owner = NULL, "
          "lease_expires_ms = 0, updated_ms = ?2, status = 200, body = ?3, "
          "checksum = ?4 WHERE tenant = 'bench' AND operation = "
          "'create_ticket' AND key = ?1");
  call *batch[MAX_WORKERS];
  (void)arg;
  sqlite3_wal_hook(db, wal_hook, NULL);
  for (;;) {
    int n, restart;
    pthread_mutex_lock(&q.mu);
    while (!q.queued && !q.stop)
      pthread_cond_wait(&q.cv, &q.mu);
    if (gather_us > 0 && q.queued < workers) {
      /* Wait, up to gather_us, for every worker to be queued. */
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_nsec += gather_us * 1000L;
      until.tv_sec += until.tv_nsec / 1000000000L;
      until.tv_nsec %= 1000000000L;
      while (q.queued < workers && !q.stop &&
             pthread_cond_timedwait(&q.cv, &q.mu, &until) == 0)
        ;
    }
    if (!q.queued) {
      pthread_mutex_unlock(&q.mu);
      break;
    }
    n = q.queued;
    memcpy(batch, q.queue, n * sizeof *batch);
    q.queued = 0;
    restart = q.restart_due;
    q.restart_due = 0;
    pthread_mutex_unlock(&q.mu);
    if (restart)
      sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL,
                                NULL);
    int64_t t = now_ms();
    int bad = step(db, begin);
    for (int i = 0; i < n && !bad; i++) {
      call *c = batch[i];
      char body[64];
      if (c->kind == COMPLETE) {
        snprintf(body, sizeof body, "{\"ticket_id\":%d}", i);
        sqlite3_bind_text(complete, 1, c->key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(complete, 2, t);
        sqlite3_bind_text(complete, 3, body, -1, SQLITE_STATIC);
        sqlite3_bind_text(complete, 4, checksum, -1, SQLITE_STATIC);
        bad = step(db, complete) || sqlite3_changes(db) != 1;
        continue;
      }
      if (c->kind == FRESH) {
        sqlite3_bind_text(ticket, 1, request, -1, SQLITE_STATIC);
        bad = step(db, ticket);
        snprintf(body, sizeof body, "{\"ticket_id\":%lld}",
                 (long long)sqlite3_last_insert_rowid(db));
      }
      sqlite3_bind_text(record, 1, c->key, -1, SQLITE_STATIC);
      sqlite3_bind_text(record, 2, fingerprint, -1, SQLITE_STATIC);
      sqlite3_bind_blob(record, 3, request, sizeof request - 1, SQLITE_STATIC);
      sqlite3_bind_int(record, 4, c->kind == FRESH ? 2 : 1);
      if (c->kind == FRESH)
        sqlite3_bind_null(record, 5);
      else
        sqlite3_bind_text(record, 5, "floor-owner", -1, SQLITE_STATIC);
      sqlite3_bind_int64(record, 6, t);
      sqlite3_bind_int64(record, 7, c->kind == FRESH ? 0 : t + 30000);
      sqlite3_bind_int64(record, 8, t + 86400000);
      if (c->kind == FRESH) {
        sqlite3_bind_int(record, 9, 200);
        sqlite3_bind_text(record, 10, body, -1, SQLITE_STATIC);
        sqlite3_bind_text(record, 11, checksum, -1, SQLITE_STATIC);
      } else {
        sqlite3_bind_null(record, 9);
        sqlite3_bind_null(record, 10);
        sqlite3_bind_null(record, 11);
      }
      bad = bad || step(db, record);
    }
    bad = bad || step(db, commit);
    pthread_mutex_lock(&q.mu);
    if (bad) {
      q.failed = 1;
      q.stop = 1;
    }
    q.batches++;
    q.batched += n;
    for (int i = 0; i < n; i++) {
      batch[i]->done = 1;
      pthread_cond_signal(&batch[i]->cv);
    }
    pthread_mutex_unlock(&q.mu);
  }
  sqlite3_finalize(begin);
  sqlite3_finalize(commit);
  sqlite3_finalize(ticket);
  sqlite3_finalize(record);
  sqlite3_finalize(complete);
  sqlite3_close(db);
  return NULL;
}

/* Hands c to the writer and waits for its batch to commit. */
static int submit(call *c) {
  pthread_mutex_lock(&q.mu);
  if (q.stop) {
    pthread_mutex_unlock(&q.mu);
    return -1;
  }
  c->done = 0;
  q.queue[q.queued++] = c;
  pthread_cond_signal(&q.cv);
  while (!c->done)
    pthread_cond_wait(&c->cv, &q.mu);
  pthread_mutex_unlock(&q.mu);
  return 0;
}

typedef struct worker {
  pthread_t thread;
  int id, phase;
  long ops;
  call c;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  for (long n = 0; atomic_load(&running); n++) {
    snprintf(w->c.key, sizeof w->c.key, "%s-%c-w%d-%ld", run_id,
             w->phase == FRESH ? 'f' : 'c', w->id, n);
    w->c.kind = w->phase;
    if (submit(&w->c))
      break;
    if (w->phase == CLAIM) {
      w->c.kind = COMPLETE;
      if (submit(&w->c))
        break;
    }
    w->ops++;
  }
  return NULL;
}

/* One phase: ops per second and the mean batch. */
static double phase(int kind, double seconds, double *batch) {
  static worker w[MAX_WORKERS];
  long ops = 0, batches0, batched0;
  pthread_mutex_lock(&q.mu);
  batches0 = q.batches;
  batched0 = q.batched;
  pthread_mutex_unlock(&q.mu);
  atomic_store(&running, 1);
  double t0 = now_s();
  for (int i = 0; i < workers; i++) {
    w[i].id = i;
    w[i].phase = kind;
    w[i].ops = 0;
    pthread_cond_init(&w[i].c.cv, NULL);
    pthread_create(&w[i].thread, NULL, work, &w[i]);
  }
  while (now_s() - t0 < seconds)
    usleep(10000);
  atomic_store(&running, 0);
  for (int i = 0; i < workers; i++) {
    pthread_join(w[i].thread, NULL);
    pthread_cond_destroy(&w[i].c.cv);
    ops += w[i].ops;
  }
  double elapsed = now_s() - t0;
  pthread_mutex_lock(&q.mu);
  *batch = q.batches > batches0
               ? (double)(q.batched - batched0) / (double)(q.batches - batches0)
               : 0;
  pthread_mutex_unlock(&q.mu);
  return ops / elapsed;
}

int main(int argc, char **argv) {
  char file[4096];
  idem_store *store = NULL;
  double seconds, fresh_batch, cc_batch;
  pthread_t wr, ck;
  pthread_condattr_t mono;
  if ((argc != 4 && argc != 5) || (workers = atoi(argv[2])) < 1 ||
      workers > MAX_WORKERS || (seconds = atof(argv[3])) <= 0 ||
      (gather_us = argc == 5 ? atol(argv[4]) : 0) < 0) {
    fprintf(stderr,
            "usage: sqlite_floor DIR WORKERS(1-%d) SECONDS [GATHER_US]\n",
            MAX_WORKERS);
    return 2;
  }
  pthread_condattr_init(&mono);
  pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
  pthread_cond_init(&q.cv, &mono);
  snprintf(file, sizeof file, "%s/floor-%d.db", argv[1], (int)getpid());
  snprintf(run_id, sizeof run_id, "floor%d", (int)getpid());
  path = file;
  /* idem's schema and pragmas, made by idem itself. */
  if (idem_store_open(file, NULL, &store) != IDEM_OK) {
    fprintf(stderr, "sqlite_floor: %s: %s\n", file, idem_errmsg());
    return 1;
  }
  idem_store_close(store);
  {
    sqlite3 *db = open_conn();
    if (sqlite3_exec(db,
                     "CREATE TABLE IF NOT EXISTS bench_tickets (id INTEGER "
                     "PRIMARY KEY, payload TEXT NOT NULL)",
                     NULL, NULL, NULL) != SQLITE_OK) {
      fprintf(stderr, "sqlite_floor: %s\n", sqlite3_errmsg(db));
      return 1;
    }
    sqlite3_close(db);
  }
  if (pthread_create(&wr, NULL, writer, NULL) != 0 ||
      pthread_create(&ck, NULL, checkpointer, NULL) != 0) {
    fprintf(stderr, "sqlite_floor: cannot start a thread\n");
    return 1;
  }
  double fresh = phase(FRESH, seconds, &fresh_batch);
  double cc = phase(CLAIM, seconds, &cc_batch);
  pthread_mutex_lock(&q.mu);
  q.stop = 1;
  pthread_cond_broadcast(&q.cv);
  pthread_cond_broadcast(&q.ckpt_cv);
  pthread_mutex_unlock(&q.mu);
  pthread_join(wr, NULL);
  pthread_join(ck, NULL);
  printf("{\"workers\": %d, \"gather_us\": %ld, \"sqlite\": \"%s\", "
         "\"fresh_ops_per_s\": %.1f, \"claim_complete_ops_per_s\": %.1f, "
         "\"fresh_batch\": %.1f, \"claim_complete_batch\": %.1f, "
         "\"errors\": %d}\n",
         workers, gather_us, sqlite3_libversion(), fresh, cc, fresh_batch,
         cc_batch, q.failed);
  for (int i = 0; i < 3; i++) {
    static const char *const suffix[] = {"", "-wal", "-shm"};
    char f[4200];
    snprintf(f, sizeof f, "%s%s", file, suffix[i]);
    unlink(f);
  }
  return q.failed;
}
