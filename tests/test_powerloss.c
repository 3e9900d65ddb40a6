/*
 * test_powerloss.c -- simulated power loss under an SQLite store.
 *
 * Each trial runs concurrent callers on one store through the fault VFS
 * (tests/fault_vfs.c), with group commit on: two threads call
 * idem_execute_local() (the action inserts a row into the caller's table
 * `effects` in the store's transaction) on a shared set of keys, two call
 * idem_claim() then idem_complete() on keys of their own, and a fifth
 * connection checkpoints the log now and then, as another process may. At a
 * random write, sync or truncation (the crash point) the machine stops:
 * that operation and every later one fail. The files are then rewritten as
 * a disk could hold them after a power loss (each write not yet synced
 * kept, dropped or torn), and the store is reopened through the plain
 * "unix" VFS and checked:
 *
 *  - it opens, and PRAGMA integrity_check says ok;
 *  - every call that returned success is there: a PROCEED claim's record
 *    exists (else a retry would act a second time), a completion, a local
 *    action and a replay are completed records with the exact status and
 *    body the caller was given;
 *  - every effects row has its completed record with the same body, and
 *    every record of a local action has exactly one effects row;
 *  - the engine works: a new local action and a new claim and completion
 *    succeed.
 *
 * With --faults each trial also injects I/O errors before its crash point:
 * a few writes failing with SQLITE_FULL or EIO, fsyncs failing with EIO
 * (the writes they should have saved are forgotten, as Linux does), or
 * reads failing. A call that meets one must fail with IDEM_EIO (or
 * IDEM_EUNAVAILABLE, for the other calls of its group commit); the callers
 * carry on (a failed completion is retried), and once the fault is gone
 * the same handle must work again.
 *
 * With --sync normal (synchronous=NORMAL) acknowledged calls may be lost:
 * they are counted, not failed, provided that only the last commits are
 * lost (a local action committed before a kept one never is) and nothing
 * is corrupted. Every few trials start on a new store; otherwise a store
 * carries its records from trial to trial, and every earlier acknowledged
 * call is checked again after each crash.
 *
 * Usage: test_powerloss [--trials N] [--sync full|normal] [--seed S]
 *                        [--fresh-every K] [--quiet] [--lying-disk]
 *                        [--faults]
 * IDEM_POWERLOSS_TRIALS sets the default number of trials. Exit 0 when no
 * invariant was violated. --lying-disk checks the campaign itself: the
 * disk acknowledges syncs without keeping anything, and the exit status is
 * 0 only when the checks caught it.
 */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fault_vfs.h"
#include "idem.h"

#define LOCAL_THREADS 2
#define CLAIM_THREADS 2
#define OPS_PER_THREAD 20
#define LOCAL_KEYS 24
#define CLAIM_KEYS 12
#define OP_LOCAL "local"
#define OP_CLAIM "claim"
#define TENANT "t"

typedef enum ack_kind {
  ACK_CLAIM,
  ACK_COMPLETE,
  ACK_LOCAL,
  ACK_REPLAY,
  ACK_UNKNOWN, /* idem_mark_unknown() */
  ACK_RELEASE, /* idem_release() */
  ACK_KINDS
} ack_kind;
static const char *const ack_names[ACK_KINDS] = {
    "claims",  "completions",    "local actions",
    "replays", "marked unknown", "releases"};

typedef struct ack {
  ack_kind kind;
  int trial;
  char op[8];
  char key[48];
  int status;
  char body[96];
  long long seq;  /* local actions: the commit order of their action */
  int superseded; /* a later release or claim of the key replaced it */
} ack;

static struct {
  pthread_mutex_t mu;
  ack *v;
  size_t n, cap;
} acks = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static int sync_normal, quiet, lying_disk, with_faults;
static long long injected_at_start; /* faults injected before this trial */
static long long tolerated;         /* calls failed by an injected fault */
static long long violations, checked[ACK_KINDS], lost[ACK_KINDS];
static long long trials_with_loss, max_lost_in_trial;
static atomic_llong action_seq;
static char store_path[4200];

static void violation(const char *fmt, ...) {
  va_list ap;
  violations++;
  if (violations > 20)
    return;
  fprintf(stderr, "VIOLATION: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static void add_ack(const ack *a) {
  pthread_mutex_lock(&acks.mu);
  if (acks.n == acks.cap) {
    acks.cap = acks.cap ? acks.cap * 2 : 1024;
    acks.v = realloc(acks.v, acks.cap * sizeof *acks.v);
    if (!acks.v)
      abort();
  }
  /* A release, or a new claim after one, replaces what was acknowledged
   * of the key before (keys are the trial's own, and its acks the last). */
  if (a->kind == ACK_RELEASE || a->kind == ACK_CLAIM)
    for (size_t i = acks.n; i-- > 0 && acks.v[i].trial == a->trial;)
      if (strcmp(acks.v[i].key, a->key) == 0 &&
          strcmp(acks.v[i].op, a->op) == 0)
        acks.v[i].superseded = 1;
  acks.v[acks.n++] = *a;
  pthread_mutex_unlock(&acks.mu);
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static void fingerprint(const char *key, char fp[IDEM_FINGERPRINT_SIZE]) {
  if (idem_sha256_hex(key, strlen(key), fp) != IDEM_OK)
    abort();
}

/* ---- the workload ------------------------------------------------------- */

typedef struct worker {
  pthread_t th;
  idem_store *store;
  int trial, index;
  uint64_t rng;
  char marked[CLAIM_KEYS];   /* keys this worker marked unknown */
  char released[CLAIM_KEYS]; /* keys whose last end was a release */
} worker;

typedef struct local_ctx {
  const char *key;
  char body[96];
  long long seq;
} local_ctx;

/* The local action: one row in the caller's table, in idem's transaction. */
static int insert_effect(void *conn, void *p, idem_response *r) {
  sqlite3 *db = conn;
  local_ctx *ctx = p;
  sqlite3_stmt *q = NULL;
  int rc;
  if (sqlite3_exec(db,
                   "CREATE TABLE IF NOT EXISTS effects (id INTEGER PRIMARY "
                   "KEY, key TEXT NOT NULL, body TEXT NOT NULL, seq INTEGER "
                   "NOT NULL)",
                   NULL, NULL, NULL) != SQLITE_OK)
    return 1;
  ctx->seq = atomic_fetch_add(&action_seq, 1) + 1;
  snprintf(ctx->body, sizeof ctx->body, "{\"effect\":\"%s\",\"seq\":%lld}",
           ctx->key, ctx->seq);
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO effects (key, body, seq) VALUES (?1, "
                         "?2, ?3)",
                         -1, &q, NULL) != SQLITE_OK)
    return 1;
  sqlite3_bind_text(q, 1, ctx->key, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, ctx->body, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 3, ctx->seq);
  rc = sqlite3_step(q);
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE)
    return 1;
  r->status = 201;
  r->body = ctx->body;
  r->body_len = strlen(ctx->body);
  return 0;
}

static long long injected_total(void) {
  fvfs_stats st;
  long long n = 0;
  fvfs_get_stats(&st);
  for (int k = 0; k < FVFS_KINDS; k++)
    n += st.injected[k];
  return n;
}

/*
 * A call failed: expected once the machine stopped, and with IDEM_EIO (or
 * IDEM_EUNAVAILABLE for the rest of its group commit) once a fault was
 * injected; a violation otherwise. Returns non-zero when the caller should
 * stop (the machine stopped).
 */
static int failed(const char *what, const char *key, int rc) {
  static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;
  if (fvfs_crashed())
    return 1;
  if (with_faults && injected_total() > injected_at_start &&
      (rc == IDEM_EIO || rc == IDEM_EUNAVAILABLE)) {
    pthread_mutex_lock(&count_mu);
    tolerated++;
    pthread_mutex_unlock(&count_mu);
    return 0;
  }
  violation("%s '%s' failed without a fault: %s: %s", what, key,
            idem_rc_name(rc), idem_errmsg());
  return 1;
}

/* An outcome no caller should see without a fault (in flight: a claim
 * whose completion failed for good). */
static void odd_outcome(const char *what, const char *key, idem_outcome o) {
  if (fvfs_crashed() || (with_faults && injected_total() > injected_at_start))
    return;
  violation("%s '%s': outcome %s", what, key, idem_outcome_name(o));
}

static void fill_ack(ack *a, ack_kind kind, int trial, const char *op,
                     const char *key, const idem_response *r) {
  memset(a, 0, sizeof *a);
  a->kind = kind;
  a->trial = trial;
  snprintf(a->op, sizeof a->op, "%s", op);
  snprintf(a->key, sizeof a->key, "%s", key);
  if (r) {
    a->status = r->status;
    snprintf(a->body, sizeof a->body, "%.*s", (int)r->body_len,
             (const char *)r->body);
  }
}

static void *local_worker(void *p) {
  worker *w = p;
  for (int i = 0; i < OPS_PER_THREAD && !fvfs_crashed(); i++) {
    char key[48], fp[IDEM_FINGERPRINT_SIZE];
    w->rng = mix(w->rng);
    snprintf(key, sizeof key, "t%d-L%d", w->trial, (int)(w->rng % LOCAL_KEYS));
    fingerprint(key, fp);
    idem_id id = {TENANT, OP_LOCAL, key};
    local_ctx ctx = {key, "", 0};
    idem_call *c = NULL;
    int rc =
        idem_execute_local(w->store, &id, fp, NULL, insert_effect, &ctx, &c);
    if (rc != IDEM_OK) {
      if (failed("execute_local", key, rc))
        break;
      continue;
    }
    idem_outcome o = idem_call_outcome(c);
    const idem_response *r = idem_call_response(c);
    ack a;
    if (o == IDEM_PROCEED && r) {
      fill_ack(&a, ACK_LOCAL, w->trial, OP_LOCAL, key, r);
      a.seq = ctx.seq;
      if (strcmp(a.body, ctx.body) != 0)
        violation("execute_local '%s': response '%s', action wrote '%s'", key,
                  a.body, ctx.body);
      add_ack(&a);
    } else if (o == IDEM_REPLAY && r) {
      fill_ack(&a, ACK_REPLAY, w->trial, OP_LOCAL, key, r);
      add_ack(&a);
    } else {
      odd_outcome("execute_local", key, o);
    }
    idem_call_free(c);
  }
  return NULL;
}

/* What was acknowledged of a key of this trial no longer says what the
 * store must hold. */
static void forget_key(int trial, const char *op, const char *key) {
  pthread_mutex_lock(&acks.mu);
  for (size_t i = acks.n; i-- > 0 && acks.v[i].trial == trial;)
    if (strcmp(acks.v[i].key, key) == 0 && strcmp(acks.v[i].op, op) == 0)
      acks.v[i].superseded = 1;
  pthread_mutex_unlock(&acks.mu);
}

/* Ends a held claim as ack kind end says. */
static int finish_claim(idem_store *s, idem_call *c, ack_kind end,
                        const idem_response *resp) {
  if (end == ACK_RELEASE)
    return idem_release(s, c);
  if (end == ACK_UNKNOWN)
    return idem_mark_unknown(s, c);
  return idem_complete(s, c, resp);
}

static void *claim_worker(void *p) {
  worker *w = p;
  idem_call_options lease = {.lease_ms = 600000};
  for (int i = 0; i < OPS_PER_THREAD && !fvfs_crashed(); i++) {
    char key[48], fp[IDEM_FINGERPRINT_SIZE], body[96];
    w->rng = mix(w->rng);
    int kidx = (int)(w->rng % CLAIM_KEYS);
    snprintf(key, sizeof key, "t%d-w%d-C%d", w->trial, w->index, kidx);
    fingerprint(key, fp);
    idem_id id = {TENANT, OP_CLAIM, key};
    idem_call *c = NULL;
    int rc = idem_claim(w->store, &id, fp, &lease, &c);
    if (rc != IDEM_OK) {
      /* A claim that failed may still have been kept: a released key may
       * be held again. */
      if (w->released[kidx])
        forget_key(w->trial, OP_CLAIM, key);
      if (failed("claim", key, rc))
        break;
      continue;
    }
    idem_outcome o = idem_call_outcome(c);
    ack a;
    if (o == IDEM_PROCEED) {
      /* Mostly completed; one in ten released, one in ten marked unknown. */
      static const ack_kind ends[10] = {
          ACK_RELEASE,  ACK_UNKNOWN,  ACK_COMPLETE, ACK_COMPLETE, ACK_COMPLETE,
          ACK_COMPLETE, ACK_COMPLETE, ACK_COMPLETE, ACK_COMPLETE, ACK_COMPLETE};
      ack_kind end = ends[(w->rng >> 40) % 10];
      const char *what = end == ACK_RELEASE   ? "release"
                         : end == ACK_UNKNOWN ? "mark_unknown"
                                              : "complete";
      fill_ack(&a, ACK_CLAIM, w->trial, OP_CLAIM, key, NULL);
      add_ack(&a);
      snprintf(body, sizeof body, "{\"done\":\"%s\",\"by\":%d}", key, w->index);
      idem_response resp = {200, NULL, 0, body, strlen(body)};
      rc = finish_claim(w->store, c, end, &resp);
      /* A call that met a fault is tried again, as a caller would: it
       * must then be kept for good. */
      for (int tries = 0; rc != IDEM_OK && tries < 5; tries++) {
        if (failed(what, key, rc))
          break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
        rc = finish_claim(w->store, c, end, &resp);
      }
      if (rc != IDEM_OK) {
        /* A release that failed may still have been kept (the machine
         * stopped after its commit reached the disk): the claim's record
         * may be there or not. */
        if (end == ACK_RELEASE)
          forget_key(w->trial, OP_CLAIM, key);
        idem_call_free(c);
        if (failed(what, key, rc))
          break;
        continue;
      }
      fill_ack(&a, end, w->trial, OP_CLAIM, key,
               end == ACK_COMPLETE ? &resp : NULL);
      add_ack(&a);
      if (end == ACK_UNKNOWN)
        w->marked[kidx] = 1;
      w->released[kidx] = end == ACK_RELEASE;
    } else if (o == IDEM_REPLAY && idem_call_response(c)) {
      fill_ack(&a, ACK_REPLAY, w->trial, OP_CLAIM, key, idem_call_response(c));
      add_ack(&a);
    } else if (!(o == IDEM_UNKNOWN && w->marked[kidx])) {
      odd_outcome("claim", key, o);
    }
    idem_call_free(c);
  }
  return NULL;
}

/*
 * Another connection on the store, checkpointing now and then, as another
 * process would. It follows the rule idem's own handles follow (see
 * idem__sq_ckpt_check()): after a checkpoint whose fsync() failed it
 * checkpoints no more. One that went on would count as copied the frames
 * whose pages the failed fsync() dropped and let the log start over, and a
 * power loss would then lose acknowledged calls (the campaign found it);
 * no store can stop another process from doing that (docs/reliability.md).
 */
typedef struct checkpointer {
  pthread_t th;
  atomic_int stop;
  uint64_t rng;
} checkpointer;

static void *checkpoint_main(void *p) {
  checkpointer *k = p;
  sqlite3 *db = NULL;
  int failed_sync = 0;
  pthread_setname_np(pthread_self(), "other-process");
  if (sqlite3_open_v2(store_path, &db, SQLITE_OPEN_READWRITE, NULL) ==
      SQLITE_OK) {
    sqlite3_extended_result_codes(db, 1);
    sqlite3_busy_timeout(db, 50);
    while (!atomic_load(&k->stop)) {
      struct timespec ts = {0, 1000000L + (long)(k->rng % 3000000L)};
      nanosleep(&ts, NULL);
      k->rng = mix(k->rng);
      if (!failed_sync &&
          sqlite3_exec(db,
                       k->rng % 8 == 0 ? "PRAGMA wal_checkpoint(TRUNCATE)"
                                       : "PRAGMA wal_checkpoint(PASSIVE)",
                       NULL, NULL, NULL) != SQLITE_OK &&
          sqlite3_extended_errcode(db) == SQLITE_IOERR_FSYNC)
        failed_sync = 1;
    }
    /* Closing it must not checkpoint either. */
    if (failed_sync)
      sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
  }
  sqlite3_close(db);
  return NULL;
}

/* ---- checks -----------------------------------------------------------------
 */

static long long query_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *q = NULL;
  long long v = -1;
  if (sqlite3_prepare_v2(db, sql, -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    v = sqlite3_column_int64(q, 0);
  sqlite3_finalize(q);
  return v;
}

static void check_file(int trial) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  if (sqlite3_open_v2(store_path, &db, SQLITE_OPEN_READONLY, "unix") !=
      SQLITE_OK) {
    violation("trial %d: cannot open the store for checks: %s", trial,
              sqlite3_errmsg(db));
    sqlite3_close(db);
    return;
  }
  if (sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL) !=
          SQLITE_OK ||
      sqlite3_step(q) != SQLITE_ROW ||
      strcmp((const char *)sqlite3_column_text(q, 0), "ok") != 0)
    violation("trial %d: integrity_check: %s", trial,
              q && sqlite3_column_text(q, 0)
                  ? (const char *)sqlite3_column_text(q, 0)
                  : sqlite3_errmsg(db));
  sqlite3_finalize(q);
  if (query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = "
                    "'effects'") == 1) {
    long long orphans = query_int(
        db, "SELECT count(*) FROM effects e LEFT JOIN idem_records r ON "
            "r.tenant = '" TENANT "' AND r.operation = '" OP_LOCAL
            "' AND r.key = e.key WHERE r.key IS NULL OR r.state <> 2 OR "
            "CAST(r.body AS TEXT) <> e.body");
    long long unpaired = query_int(
        db, "SELECT count(*) FROM idem_records r WHERE r.operation = '" OP_LOCAL
            "' AND (SELECT count(*) FROM effects e WHERE e.key = r.key) <> 1");
    if (orphans != 0)
      violation("trial %d: %lld effects rows without their completed record "
                "(or with another body)",
                trial, orphans);
    if (unpaired != 0)
      violation("trial %d: %lld local records without exactly one effects "
                "row",
                trial, unpaired);
  } else if (query_int(db, "SELECT count(*) FROM sqlite_schema WHERE name = "
                           "'idem_records'") == 1) {
    long long recs = query_int(db, "SELECT count(*) FROM idem_records WHERE "
                                   "operation = '" OP_LOCAL "'");
    if (recs != 0)
      violation("trial %d: %lld local records and no effects table", trial,
                recs);
  }
  sqlite3_close(db);
}

/* Checks every acknowledged call against the reopened store. With
 * synchronous=NORMAL the ones lost are counted and forgotten. */
static void check_acks(idem_store *s, int trial) {
  size_t keep = 0;
  long long lost_now = 0, kept_max_seq = 0, lost_min_seq = -1;
  for (size_t i = 0; i < acks.n; i++) {
    ack *a = &acks.v[i];
    idem_id id = {TENANT, a->op, a->key};
    idem_record *rec = NULL;
    if (a->superseded)
      continue;
    int rc = idem_get(s, &id, &rec), gone = 0;
    checked[a->kind]++;
    if (a->kind == ACK_RELEASE) {
      /* Released: the record is gone; one that is back lost the release. */
      if (rc == IDEM_OK)
        gone = 1;
      else if (rc != IDEM_ENOTFOUND)
        violation("trial %d: get '%s': %s: %s", trial, a->key, idem_rc_name(rc),
                  idem_errmsg());
    } else if (rc == IDEM_ENOTFOUND) {
      gone = 1;
    } else if (rc != IDEM_OK) {
      violation("trial %d: get '%s': %s: %s", trial, a->key, idem_rc_name(rc),
                idem_errmsg());
    } else if (a->kind == ACK_CLAIM) {
      char fp[IDEM_FINGERPRINT_SIZE];
      fingerprint(a->key, fp);
      if (strcmp(rec->fingerprint, fp) != 0)
        violation("trial %d: claim '%s': another fingerprint", trial, a->key);
    } else if (a->kind == ACK_UNKNOWN) {
      if (rec->state != IDEM_STATE_UNKNOWN)
        gone = 1;
    } else if (rec->state != IDEM_STATE_COMPLETED) {
      /* A completed record went back: only a lost commit does that. */
      gone = 1;
    } else if (rec->response.status != a->status ||
               rec->response.body_len != strlen(a->body) ||
               memcmp(rec->response.body, a->body, strlen(a->body)) != 0) {
      violation("trial %d: %s '%s': stored %d '%.*s', the caller got %d "
                "'%s'",
                trial, ack_names[a->kind], a->key, rec->response.status,
                (int)rec->response.body_len, (const char *)rec->response.body,
                a->status, a->body);
    }
    idem_record_free(rec);
    if (gone && !sync_normal) {
      violation("trial %d: acknowledged %s '%s' (trial %d) is lost", trial,
                ack_names[a->kind], a->key, a->trial);
    } else if (gone) {
      lost[a->kind]++;
      lost_now++;
      if (a->kind == ACK_LOCAL && (lost_min_seq < 0 || a->seq < lost_min_seq))
        lost_min_seq = a->seq;
      continue;
    }
    if (!gone && a->kind == ACK_LOCAL && a->seq > kept_max_seq)
      kept_max_seq = a->seq;
    acks.v[keep++] = *a;
  }
  acks.n = keep;
  if (lost_now > 0) {
    trials_with_loss++;
    if (lost_now > max_lost_in_trial)
      max_lost_in_trial = lost_now;
  }
  if (lost_min_seq >= 0 && lost_min_seq < kept_max_seq)
    violation("trial %d: a local action committed before a kept one was "
              "lost (seq %lld lost, %lld kept): more than the last commits",
              trial, lost_min_seq, kept_max_seq);
}

/* The engine works: after the crash on the reopened store, and after a
 * fault on the same handle (where only the armed crash may stop it). */
/* Sync errors reported late (to a handle that had the file open when
 * another handle's sync failed) so far. */
static long long late_errors(void) {
  fvfs_stats st;
  fvfs_get_stats(&st);
  return st.reported_again;
}

/* Whether a call that failed with rc may be tried again: a failed sync
 * reported late to this handle, once, as Linux does, after the fault. */
static int late_error(int rc, long long before) {
  return (rc == IDEM_EIO || rc == IDEM_EUNAVAILABLE) && late_errors() > before;
}

static void check_works(idem_store *s, int trial, const char *when) {
  char key[48], fp[IDEM_FINGERPRINT_SIZE];
  idem_call *c = NULL;
  ack a;
  snprintf(key, sizeof key, "t%d-%s-L", trial, when);
  fingerprint(key, fp);
  idem_id lid = {TENANT, OP_LOCAL, key};
  local_ctx ctx = {key, "", 0};
  long long late = late_errors();
  int rc = idem_execute_local(s, &lid, fp, NULL, insert_effect, &ctx, &c);
  for (int i = 0; i < 3 && late_error(rc, late); i++) {
    late = late_errors();
    rc = idem_execute_local(s, &lid, fp, NULL, insert_effect, &ctx, &c);
  }
  if (rc != IDEM_OK && fvfs_crashed()) {
    idem_call_free(c);
    return;
  }
  if (rc != IDEM_OK || idem_call_outcome(c) != IDEM_PROCEED ||
      !idem_call_response(c)) {
    violation("trial %d: %s, execute_local: %s %s", trial, when,
              idem_rc_name(rc), rc ? idem_errmsg() : "");
  } else {
    fill_ack(&a, ACK_LOCAL, trial, OP_LOCAL, key, idem_call_response(c));
    a.seq = ctx.seq;
    add_ack(&a);
  }
  idem_call_free(c);
  c = NULL;
  snprintf(key, sizeof key, "t%d-%s-C", trial, when);
  fingerprint(key, fp);
  idem_id cid = {TENANT, OP_CLAIM, key};
  late = late_errors();
  rc = idem_claim(s, &cid, fp, NULL, &c);
  for (int i = 0; i < 3 && late_error(rc, late); i++) {
    late = late_errors();
    rc = idem_claim(s, &cid, fp, NULL, &c);
  }
  if (rc != IDEM_OK && fvfs_crashed()) {
    idem_call_free(c);
    return;
  }
  if (rc != IDEM_OK || idem_call_outcome(c) != IDEM_PROCEED) {
    violation("trial %d: %s, claim: %s %s", trial, when, idem_rc_name(rc),
              rc ? idem_errmsg() : "");
  } else {
    idem_response resp = {200, NULL, 0, "{\"after\":true}", 14};
    late = late_errors();
    rc = idem_complete(s, c, &resp);
    for (int i = 0; i < 3 && late_error(rc, late); i++) {
      late = late_errors();
      rc = idem_complete(s, c, &resp);
    }
    if (rc != IDEM_OK && !fvfs_crashed())
      violation("trial %d: %s, complete: %s %s", trial, when, idem_rc_name(rc),
                idem_errmsg());
    else if (rc == IDEM_OK) {
      fill_ack(&a, ACK_COMPLETE, trial, OP_CLAIM, key, &resp);
      add_ack(&a);
    }
  }
  idem_call_free(c);
}

/* ---- trials
 * ------------------------------------------------------------------ */

static void remove_store(void) {
  static const char *const ends[] = {"", "-wal", "-shm", "-journal"};
  for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
    char p[4300];
    snprintf(p, sizeof p, "%s%s", store_path, ends[i]);
    unlink(p);
  }
  acks.n = 0;
}

/* One trial; returns how many events its workload made. */
static long long run_trial(int trial, uint64_t seed, long long crash_n) {
  idem_store_options o = {.sqlite_synchronous =
                              sync_normal ? IDEM_SYNC_NORMAL : IDEM_SYNC_FULL};
  idem_store *s = NULL;
  worker w[LOCAL_THREADS + CLAIM_THREADS];
  checkpointer k;
  long long events;
  int rc;

  if (getenv("FVFS_TRACE"))
    fprintf(stderr, "trial %d\n", trial);
  fvfs_reset(mix(seed));
  fvfs_set_lying(lying_disk);
  fvfs_make_default(1);
  fvfs_arm_crash(crash_n);
  rc = idem_store_open(store_path, &o, &s);
  if (rc != IDEM_OK) {
    if (!fvfs_crashed())
      violation("trial %d: open before the crash: %s: %s", trial,
                idem_rc_name(rc), idem_errmsg());
  } else {
    memset(&k, 0, sizeof k);
    k.rng = mix(seed ^ 0x5555);
    pthread_create(&k.th, NULL, checkpoint_main, &k);
    for (int i = 0; i < LOCAL_THREADS + CLAIM_THREADS; i++) {
      w[i].store = s;
      w[i].trial = trial;
      w[i].index = i;
      w[i].rng = mix(seed + (uint64_t)i + 1);
      memset(w[i].marked, 0, sizeof w[i].marked);
      memset(w[i].released, 0, sizeof w[i].released);
      pthread_create(&w[i].th, NULL,
                     i < LOCAL_THREADS ? local_worker : claim_worker, &w[i]);
    }
    if (with_faults) {
      uint64_t r = mix(seed ^ 0xfa017);
      injected_at_start = injected_total();
      fvfs_set_fault((fvfs_fault)(1 + r % 4), (int)((r >> 8) % 40),
                     1 + (int)((r >> 16) % 4));
    }
    for (int i = 0; i < LOCAL_THREADS + CLAIM_THREADS; i++)
      pthread_join(w[i].th, NULL);
    if (with_faults) {
      /* The fault is gone: this very handle works again. */
      fvfs_set_fault(FVFS_NONE, 0, 0);
      if (!fvfs_crashed())
        check_works(s, trial, "after-fault");
    }
    atomic_store(&k.stop, 1);
    pthread_join(k.th, NULL);
    idem_store_close(s);
  }
  events = fvfs_events();
  fvfs_make_default(0);
  fvfs_set_lying(0);
  if (fvfs_power_loss() != 0) {
    fprintf(stderr, "trial %d: cannot rewrite the files: %s\n", trial,
            strerror(errno));
    exit(2);
  }

  /* After the power came back. */
  s = NULL;
  rc = idem_store_open(store_path, &o, &s);
  if (rc != IDEM_OK) {
    violation("trial %d: the store does not open after the crash: %s: %s",
              trial, idem_rc_name(rc), idem_errmsg());
    remove_store();
    return events;
  }
  check_acks(s, trial);
  check_works(s, trial, "reopened");
  idem_store_close(s);
  check_file(trial);
  return events;
}

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(p);
}

int main(int argc, char **argv) {
  const char *env = getenv("IDEM_POWERLOSS_TRIALS");
  int trials = env && atoi(env) > 0 ? atoi(env) : 100, fresh_every = 25;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
  char dir[] = "/dev/shm/idem-powerloss-XXXXXX";
  char dir2[] = "/tmp/idem-powerloss-XXXXXX";
  char *base;
  long long est = 0, events_total = 0;
  struct timespec t0, t1;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--trials") == 0 && i + 1 < argc)
      trials = atoi(argv[++i]);
    else if (strcmp(argv[i], "--sync") == 0 && i + 1 < argc) {
      const char *v = argv[++i];
      if (strcmp(v, "normal") == 0)
        sync_normal = 1;
      else if (strcmp(v, "full") != 0) {
        fprintf(stderr, "--sync: full or normal, not '%s'\n", v);
        return 2;
      }
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc)
      seed = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--fresh-every") == 0 && i + 1 < argc)
      fresh_every = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quiet") == 0)
      quiet = 1;
    else if (strcmp(argv[i], "--lying-disk") == 0)
      lying_disk = 1;
    else if (strcmp(argv[i], "--faults") == 0)
      with_faults = 1;
    else {
      fprintf(stderr,
              "usage: %s [--trials N] [--sync full|normal] [--seed S] "
              "[--fresh-every K] [--quiet] [--lying-disk] [--faults]\n",
              argv[0]);
      return 2;
    }
  }
  if (trials <= 0 || fresh_every <= 0) {
    fprintf(stderr, "--trials and --fresh-every must be positive\n");
    return 2;
  }
  if (fvfs_register() != SQLITE_OK) {
    fprintf(stderr, "cannot register the fault VFS\n");
    return 2;
  }
  /* Memory-backed when possible: the checks' real fsyncs cost nothing. */
  base = mkdtemp(dir);
  if (!base)
    base = mkdtemp(dir2);
  if (!base) {
    perror("mkdtemp");
    return 2;
  }
  snprintf(store_path, sizeof store_path, "%s/store.db", base);
  printf("powerloss: synchronous=%s%s trials=%d seed=0x%016" PRIx64 "\n",
         sync_normal ? "NORMAL" : "FULL", with_faults ? " with I/O faults" : "",
         trials, seed);
  fflush(stdout);
  clock_gettime(CLOCK_MONOTONIC, &t0);

  for (int t = 0; t < trials; t++) {
    uint64_t ts = mix(seed + (uint64_t)t);
    long long crash_n = 0;
    if (t % fresh_every == 0)
      remove_store();
    /* One trial in ten runs to the end (the power goes out after a clean
     * close), to learn how many events a trial makes; the others stop at
     * a random one of about as many, a few after the store closed. */
    if (t >= 3 && t % 10 != 0 && est > 0)
      crash_n = 1 + (long long)(mix(ts) % (uint64_t)(est + est / 20 + 1));
    long long ev = run_trial(t, ts, crash_n);
    events_total += ev;
    if (crash_n == 0)
      est = est == 0 ? ev : (est * 3 + ev) / 4;
    if (!quiet && (t + 1) % 250 == 0) {
      printf("  %d trials, %lld violations\n", t + 1, violations);
      fflush(stdout);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);

  fvfs_stats st;
  fvfs_get_stats(&st);
  printf("powerloss: synchronous=%s trials=%d crash points reached=%lld "
         "(the others lost power after a clean close) seconds=%.1f\n",
         sync_normal ? "NORMAL" : "FULL", trials, st.crashes,
         (double)(t1.tv_sec - t0.tv_sec) +
             (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
  printf("  events: %lld (writes %lld, syncs %lld, truncations %lld)\n",
         events_total, st.writes, st.syncs, st.truncates);
  printf("  unsynced writes at power loss: kept %lld, dropped %lld, torn "
         "%lld (%lld with garbage); truncations kept %lld, dropped %lld\n",
         st.kept, st.dropped, st.torn, st.torn_garbage, st.trunc_kept,
         st.trunc_dropped);
  printf("  acknowledged calls checked after reopening: %lld claims, %lld "
         "completions, %lld local actions, %lld replays, %lld marked "
         "unknown, %lld releases\n",
         checked[ACK_CLAIM], checked[ACK_COMPLETE], checked[ACK_LOCAL],
         checked[ACK_REPLAY], checked[ACK_UNKNOWN], checked[ACK_RELEASE]);
  if (sync_normal)
    printf("  lost (synchronous=NORMAL): %lld claims, %lld completions, %lld "
           "local actions, %lld replays, %lld marked unknown, %lld "
           "releases; in %lld trials, at most %lld in one\n",
           lost[ACK_CLAIM], lost[ACK_COMPLETE], lost[ACK_LOCAL],
           lost[ACK_REPLAY], lost[ACK_UNKNOWN], lost[ACK_RELEASE],
           trials_with_loss, max_lost_in_trial);
  if (with_faults)
    printf("  I/O faults injected: %lld writes full, %lld writes EIO, %lld "
           "fsyncs EIO (%lld unsynced writes forgotten, %lld reported "
           "again to another handle), %lld reads EIO; calls failed by "
           "them: %lld\n",
           st.injected[FVFS_WRITE_FULL], st.injected[FVFS_WRITE_EIO],
           st.injected[FVFS_SYNC_EIO], st.forgotten, st.reported_again,
           st.injected[FVFS_READ_EIO], tolerated);
  printf("  violations: %lld\n", violations);
  nftw(base, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
  free(acks.v);
  if (lying_disk) {
    printf("  a disk that acknowledges syncs without keeping anything: %s\n",
           violations > 0 ? "caught" : "NOT CAUGHT");
    return violations > 0 ? 0 : 1;
  }
  return violations == 0 ? 0 : 1;
}
