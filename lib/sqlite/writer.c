/*
 * writer.c -- the SQLite store's writer: group commit (one transaction
 * and one fsync for every caller queued), the batch, and how a call
 * reaches it.
 */
#include "sqlite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    idem__sq_ckpt_check(s, sqlite3_wal_checkpoint_v2(c->db, NULL,
                                                     SQLITE_CHECKPOINT_PASSIVE,
                                                     NULL, NULL));
  if (idem__sq_step_once(c, ST_BEGIN) != SQLITE_OK) {
    for (i = 0; i < n; i++)
      idem__sq_op_sqlite_fail(ops[i], c, "begin");
    return;
  }
  if ((i = idem__sq_schema_unchanged(s, c)) != IDEM_OK) {
    char why[sizeof ops[0]->errmsg];
    int rc = i;
    snprintf(why, sizeof why, "%s", idem_errmsg());
    idem__sq_exec(c, "ROLLBACK");
    for (i = 0; i < n; i++) {
      idem__op_fail(ops[i], rc, "%s", why);
      if (ops[i]->kind == IDEM__OP_CLAIM || ops[i]->kind == IDEM__OP_LOCAL)
        ops[i]->claim->held = 0;
    }
    return;
  }
  {
    char why[sizeof ops[0]->errmsg];
    if (!idem__sq_files_intact(s, why, sizeof why)) {
      /* Nothing is written; a claim whose outcome writes nothing (a
       * replay of what was completed before, a conflict, a key in flight)
       * is still answered. */
      for (i = 0; i < n; i++) {
        idem__op *op = ops[i];
        idem__row row;
        idem__action action = IDEM__ACT_INSERT;
        if ((op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL) &&
            idem__sq_load_and_decide(c, op, idem__now_ms(), &row, &action) ==
                IDEM_OK &&
            action == IDEM__ACT_NONE) {
          if (op->claim->outcome == IDEM_REPLAY)
            idem__sq_cache_later(op, row.expires_ms, row.attempt);
          continue;
        }
        if (op->rc == IDEM_OK)
          idem__op_fail(op, IDEM_ESTORE, "%s", why);
        if (op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL)
          op->claim->held = 0;
      }
      idem__sq_exec(c, "ROLLBACK");
      return;
    }
  }
  for (i = 0; i < n; i++) {
    idem__op *op = ops[i];
    /* A local action runs the caller's statements, which must be undone
     * alone when it fails: it runs in a savepoint. Every other op writes
     * with one statement at most, which SQLite undoes by itself when it
     * fails, and fails before writing otherwise. */
    int sp = op->kind == IDEM__OP_LOCAL;
    if (sp && idem__sq_step_once(c, ST_SAVEPOINT) != SQLITE_OK) {
      idem__sq_op_sqlite_fail(op, c, "savepoint");
      continue;
    }
    /* Read under the write lock, for each op: a lease or a retention
     * counts from when its write can no longer wait, never from before
     * BEGIN IMMEDIATE's wait or the actions run earlier in the batch. */
    now = idem__now_ms();
    idem__sq_run_one(c, op, now);
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
      if (sp && idem__sq_step_once(c, ST_ROLLBACK_SP) != SQLITE_OK) {
        idem__sq_exec(c, "ROLLBACK");
        batch_lost(c, ops, n, i);
        return;
      }
    }
    if (sp)
      idem__sq_step_once(c, ST_RELEASE_SP);
  }
  {
    char why[256] = "the transaction ended";
    int src = idem__sq_prune_some(s, c, idem__now_ms(), why, sizeof why);
    if (src != SQLITE_OK) {
      /* Rolled back while expired records were removed: nothing of the
       * batch was kept, and no claim is held. */
      for (i = 0; i < n; i++) {
        if (ops[i]->rc == IDEM_OK)
          idem__op_fail(ops[i], idem__sq_map_rc(src),
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
  if (idem__sq_step_once(c, ST_COMMIT) != SQLITE_OK) {
    char msg[256];
    idem__sq_errtext(c->db, msg, sizeof msg);
    int rc = idem__sq_map_rc(sqlite3_extended_errcode(c->db));
    idem__sq_exec(c, "ROLLBACK");
    for (i = 0; i < n; i++) {
      if (ops[i]->rc == IDEM_OK)
        idem__op_fail(ops[i], rc,
                      "sqlite: commit failed, nothing was stored: %s", msg);
      if (ops[i]->kind == IDEM__OP_CLAIM || ops[i]->kind == IDEM__OP_LOCAL)
        ops[i]->claim->held = 0;
    }
  }
}

/*
 * How long a leader waits for more callers before it commits: a fraction of
 * a commit, so that callers who just got their answer and come straight back
 * join the next batch instead of starting a half-empty one of their own.
 */
#define GATHER_MAX_US 400

/* No one leads: wakes the first caller queued to lead the next batch (the
 * store's own leaders for a queued op whose caller does not wait), and the
 * scheduler if it waits for the writer. Under gc_mu. */
static void hand_on_lead(sq_store *s) {
  if (s->head)
    pthread_cond_signal(s->head->waiter ? s->head->waiter : &s->async_cv);
  pthread_cond_broadcast(&s->gc_cv);
}

static void cache_committed(sq_store *s, idem__op *op);

/*
 * Leads one batch: gathers, commits, and answers the batch's callers, a
 * waiting caller by its condition and a queued op by its on_done(), which
 * runs once the lead is handed on, so that the next batch need not wait
 * for it. me: the leading caller's own condition (not signalled), or NULL.
 * Called and returns under gc_mu, with no one leading.
 */
static void lead(sq_store *s, pthread_cond_t *me) {
  idem__op *batch[BATCH_MAX];
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
  int n = 0, queued_ops = 0;
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
    if (!batch[i]->waiter) {
      batch[queued_ops++] = batch[i];
      s->inside--;
    } else if (batch[i]->waiter != me) {
      pthread_cond_signal(batch[i]->waiter);
    }
  }
  s->leading = 0;
  hand_on_lead(s);
  if (queued_ops) {
    pthread_mutex_unlock(&s->gc_mu);
    for (int i = 0; i < queued_ops; i++) {
      cache_committed(s, batch[i]);
      batch[i]->on_done(batch[i]); /* may free it */
    }
    pthread_mutex_lock(&s->gc_mu);
  }
}

/* Puts op at the end of the queue. Under gc_mu. */
static void enqueue(sq_store *s, idem__op *op) {
  op->next = NULL;
  op->done = 0;
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
}

/* Queues op for the next group commit and returns once it has run. */
static void submit(sq_store *s, idem__op *op) {
  pthread_cond_t me; /* this caller's own: woken when its op ran, or when
                        it is first in the queue and no one leads */
  pthread_cond_init(&me, NULL);
  pthread_mutex_lock(&s->gc_mu);
  op->waiter = &me;
  enqueue(s, op);
  while (!op->done) {
    if (s->leading) {
      /* Woken by the leader that runs one of our ops, or handing the lead
       * on: never by every batch, which with thousands queued would wake
       * them all each time. */
      pthread_cond_wait(&me, &s->gc_mu);
      continue;
    }
    lead(s, &me);
  }
  /* Our op ran in another's batch: the lead may be free with callers
   * queued whom no one woke. */
  if (!s->leading)
    hand_on_lead(s);
  s->inside--;
  pthread_mutex_unlock(&s->gc_mu);
  pthread_cond_destroy(&me);
}

/*
 * The store's leaders: they lead batches of ops queued by callers that do
 * not wait (idem__sq_queue()) when no waiting caller leads. Two, so that
 * one leads while the other runs the last batch's on_done()s.
 */
static void *async_leader(void *arg) {
  sq_store *s = arg;
  pthread_mutex_lock(&s->gc_mu);
  for (;;) {
    while (!(s->head && !s->leading) && !(s->async_stop && !s->head))
      pthread_cond_wait(&s->async_cv, &s->gc_mu);
    if (!s->head)
      break;
    lead(s, NULL);
  }
  /* The other leader may be waiting to end too. */
  pthread_cond_broadcast(&s->async_cv);
  pthread_mutex_unlock(&s->gc_mu);
  return NULL;
}

int idem__sq_queue(void *state, idem__op *op) {
  sq_store *s = state;
  int claim = op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL;
  /* Without a writer the calls are the pool's, one by one: the engine runs
   * them on its threads. */
  if (!s->writer)
    return -1;
  op->cache_it = 0;
  if (claim && idem__cache_get(s->cache, op, idem__now_ms())) {
    op->on_done(op);
    return 0;
  }
  pthread_mutex_lock(&s->gc_mu);
  while (s->async_started < ASYNC_LEADERS && !s->async_stop) {
    if (idem__thread_start(&s->async_threads[s->async_started],
                           "idem-leader", async_leader, s) != 0)
      break;
    s->async_started++;
  }
  if (!s->async_started) {
    pthread_mutex_unlock(&s->gc_mu);
    idem__clear_error();
    return -1;
  }
  op->waiter = NULL;
  enqueue(s, op);
  if (!s->leading)
    hand_on_lead(s);
  pthread_mutex_unlock(&s->gc_mu);
  return 0;
}

int idem__sq_cached(void *state, idem__op *op) {
  sq_store *s = state;
  return idem__cache_get(s->cache, op, idem__now_ms());
}

/* Renewals of many leases: one group commit (or one transaction per
 * BATCH_MAX of them without group commit). */
void idem__sq_run_many(void *state, idem__op **ops, int n) {
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
  if ((rc = idem__sq_pool_get(s, &c)) != IDEM_OK) {
    for (int i = 0; i < n; i++)
      idem__op_fail(ops[i], rc, "%s", idem_errmsg());
    return;
  }
  for (int i = 0; i < n; i += BATCH_MAX)
    run_batch(s, c, ops + i, n - i < BATCH_MAX ? n - i : BATCH_MAX);
  idem__sq_pool_put(s, c);
}

/* Leases are written on the boot-time clock, which is ahead of the
 * monotonic one by the time the machine spent suspended: read now. */
int64_t idem__sq_clock_ahead(void *state) {
  (void)state;
  int64_t mono = idem__mono_ms(), boot = idem__boot_ms();
  return boot - mono;
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

void idem__sq_run(void *state, idem__op *op) {
  sq_store *s = state;
  conn *c = NULL;
  int claim = op->kind == IDEM__OP_CLAIM || op->kind == IDEM__OP_LOCAL;
  int rc;

  op->cache_it = 0;
  if (claim && idem__cache_get(s->cache, op, idem__now_ms()))
    return;
  /* With a writer, a claim that the cache cannot answer is decided by the
   * writer, under the write lock: most are new keys, which must be written
   * anyway, and a read on a pooled connection first cost each of them a
   * transaction of its own (about a fifth of the throughput at 16 callers).
   * Records the writer reads completed are cached. */
  if (s->writer) {
    submit(s, op);
    cache_committed(s, op);
    return;
  }
  rc = idem__sq_pool_get(s, &c);
  if (rc != IDEM_OK) {
    idem__op_fail(op, rc, "%s", idem_errmsg());
    return;
  }
  if (claim) {
    /* Without one, outcomes that write nothing are answered from a pooled
     * connection's snapshot without waiting for the write lock. */
    idem__row row;
    idem__action action;
    rc = idem__sq_load_and_decide(c, op, idem__now_ms(), &row, &action);
    if (rc == IDEM_OK && action == IDEM__ACT_NONE) {
      idem__sq_pool_put(s, c);
      if (op->claim->outcome == IDEM_REPLAY)
        idem__sq_cache_later(op, row.expires_ms, row.attempt);
      cache_committed(s, op);
      return;
    }
    if (rc != IDEM_OK && rc != IDEM_EBUSY) {
      idem__sq_pool_put(s, c);
      return;
    }
    op->rc = IDEM_OK;
    op->errmsg[0] = '\0';
    free(op->claim->resp_buf);
    op->claim->resp_buf = NULL;
    op->claim->has_response = 0;
  }
  run_batch(s, c, &op, 1);
  idem__sq_pool_put(s, c);
  cache_committed(s, op);
}
