/*
 * lease.c -- the store's lease scheduler and the waiting room (lease.h).
 */
#include "lease.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* The most leases renewed in one batch (one transaction). */
#define RENEW_BATCH 1024

int64_t idem__mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t idem__boot_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The wall clock's offset from the boot clock, as last taken: kept while
 * the two agree within a second, so that a lease shown twice reads the
 * same both times (two readings a millisecond apart would not); a step of
 * the wall clock is taken up at once. __atomic. */
static int64_t wall_offset = INT64_MIN;

int64_t idem__lease_to_wall(int64_t boot_ms) {
  struct timespec w, b;
  int64_t off, kept = __atomic_load_n(&wall_offset, __ATOMIC_RELAXED);
  clock_gettime(CLOCK_BOOTTIME, &b);
  clock_gettime(CLOCK_REALTIME, &w);
  off = ((int64_t)(w.tv_sec - b.tv_sec) * 1000000000LL +
         (w.tv_nsec - b.tv_nsec) + 500000) /
        1000000;
  if (kept == INT64_MIN || off - kept > 1000 || kept - off > 1000) {
    __atomic_store_n(&wall_offset, off, __ATOMIC_RELAXED);
    kept = off;
  }
  return boot_ms + kept;
}

int idem__boot_id(char id[40]) {
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
  size_t n = 0;
  if (f) {
    n = fread(id, 1, 39, f);
    fclose(f);
  }
  while (n > 0 && (id[n - 1] == '\n' || id[n - 1] == ' '))
    n--;
  id[n] = '\0';
  if (n < 8)
    return idem__fail(IDEM_EIO,
                      "cannot read this boot's id from "
                      "/proc/sys/kernel/random/boot_id (is /proc mounted?)");
  return IDEM_OK;
}

int idem__thread_start(pthread_t *t, const char *name, void *(*fn)(void *),
                       void *arg) {
  sigset_t all, old;
  int rc;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = pthread_create(t, NULL, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0)
    pthread_setname_np(*t, name);
  return rc;
}

static void to_timespec(int64_t mono_ms, struct timespec *ts) {
  ts->tv_sec = (time_t)(mono_ms / 1000);
  ts->tv_nsec = (long)(mono_ms % 1000) * 1000000L;
}

/* ---- deadlines ----------------------------------------------------------- */

/*
 * When a lease written as lease_expires_ms ends, on the monotonic clock:
 * never later than the store ends it. Takeovers are decided by the clock
 * that writes leases, and the holder's signal is read from this one, so
 * the store says how the two relate: how far its lease clock may be ahead
 * of this process's CLOCK_MONOTONIC, at most. The SQLite store writes
 * leases on the kernel's boot-time clock, which differs from the monotonic
 * one only by the time spent suspended: exact. The PostgreSQL server
 * writes them on its own clock: every statement that reads it, sent at a
 * known monotonic time of ours, bounds that. Neither moves when this
 * machine's wall clock steps. The lease also ends no earlier than lease_ms
 * after asked_mono, a moment before its write was asked: the later of the
 * two bounds is used, and without a bound of the clock, the second alone.
 */
int64_t idem__lease_deadline(const idem_store *store, int64_t lease_expires_ms,
                             int64_t asked_mono, int64_t lease_ms) {
  int64_t from_ask = asked_mono + lease_ms;
  if (lease_expires_ms > 0 && store->methods->version >= 3 &&
      store->methods->clock_ahead) {
    int64_t ahead = store->methods->clock_ahead(store->state);
    if (ahead != INT64_MAX) {
      int64_t d = lease_expires_ms - ahead;
      /* A bound loose enough to say less than counting from the ask
       * (a slow first reading) is of no use. */
      return d > from_ask ? d : from_ask;
    }
  }
  return from_ask;
}

/* ---- the scheduler ----------------------------------------------------- */

struct idem__sched {
  idem_store *store;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* the thread: a lease added, an ending, stop */
  pthread_cond_t idle_cv; /* holders: a renewal of theirs ended */
  idem__lease *head;
  int stop;
  int64_t wake_at; /* when the thread wakes by itself next; 0 while busy */
  pthread_t thread;
};

static void cond_init_mono(pthread_cond_t *cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

/* Arms l's timerfd to fire at once. Under l->fdmu. */
static void fire_now(idem__lease *l) {
  struct itimerspec now = {{0, 0}, {0, 1}};
  if (l->tfd >= 0)
    timerfd_settime(l->tfd, 0, &now, NULL);
}

/* Under l->fdmu. */
static void set_lost_locked(idem__lease *l) {
  __atomic_store_n(&l->lost, 1, __ATOMIC_RELEASE);
  fire_now(l);
}

/*
 * A renewal asked at asked_mono was written: the lease now ends lease_ms
 * after it. One that comes back after the deadline it was to move does
 * not revive the lease: lost stays lost, since another holder may have
 * acted meanwhile.
 */
static void set_deadline(idem__lease *l, int64_t deadline) {
  pthread_mutex_lock(&l->fdmu);
  if (__atomic_load_n(&l->lost, __ATOMIC_ACQUIRE)) {
    pthread_mutex_unlock(&l->fdmu);
    return;
  }
  if (idem__mono_ms() >= l->deadline_mono) {
    set_lost_locked(l);
    pthread_mutex_unlock(&l->fdmu);
    return;
  }
  __atomic_store_n(&l->deadline_mono, deadline, __ATOMIC_RELEASE);
  if (l->tfd >= 0) {
    struct itimerspec at = {{0, 0}, {0, 0}}, old;
    to_timespec(deadline, &at.it_value);
    timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &at, &old);
    /* It fired between the check above and now: the lease ended. */
    if (old.it_value.tv_sec == 0 && old.it_value.tv_nsec == 0)
      set_lost_locked(l);
  }
  pthread_mutex_unlock(&l->fdmu);
}

int idem__lease_lost(idem__lease *l) {
  int lost;
  if (__atomic_load_n(&l->lost, __ATOMIC_ACQUIRE))
    return 1;
  if (idem__mono_ms() < __atomic_load_n(&l->deadline_mono, __ATOMIC_ACQUIRE))
    return 0;
  pthread_mutex_lock(&l->fdmu);
  if (!l->lost && idem__mono_ms() >= l->deadline_mono)
    set_lost_locked(l);
  lost = l->lost;
  pthread_mutex_unlock(&l->fdmu);
  return lost;
}

int idem__lease_lost_fd(idem__lease *l) {
  int fd;
  pthread_mutex_lock(&l->fdmu);
  if (l->tfd < 0) {
    l->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (l->tfd >= 0) {
      if (l->lost || idem__mono_ms() >= l->deadline_mono) {
        set_lost_locked(l);
      } else {
        struct itimerspec at = {{0, 0}, {0, 0}};
        to_timespec(l->deadline_mono, &at.it_value);
        timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &at, NULL);
      }
    }
  }
  fd = l->tfd;
  pthread_mutex_unlock(&l->fdmu);
  return fd;
}

/* One renewal of a batch: its op, and the copy of the holder's call that
 * it writes (the caller's call is its own), made for the renewal only so
 * that a lease in flight holds none. */
typedef struct renewal {
  idem__op op;
  idem_call shadow;
} renewal;

/* Renews n leases in one batch; results in each op. The leases are busy:
 * their holders do not change their calls meanwhile. */
static void renew_batch(idem_store *store, idem__lease **ls, renewal *rn,
                        idem__op **pp, int n) {
  for (int i = 0; i < n; i++) {
    idem__op *op = &rn[i].op;
    const idem_call *c = ls[i]->call;
    idem_call *sh = &rn[i].shadow;
    /* Only what a renewal reads and writes: the holder may write the
     * call's response meanwhile (idem_execute()'s ending keeps it there
     * before it holds renewals off), and those fields are not ours. */
    memset(sh, 0, sizeof *sh);
    sh->outcome = c->outcome;
    sh->tenant = c->tenant;
    sh->operation = c->operation;
    sh->key = c->key;
    memcpy(sh->fingerprint, c->fingerprint, sizeof sh->fingerprint);
    memcpy(sh->token, c->token, sizeof sh->token);
    sh->attempt = c->attempt;
    sh->lease_expires_ms =
        __atomic_load_n(&c->lease_expires_ms, __ATOMIC_RELAXED);
    sh->retention_ms = c->retention_ms;
    sh->held = c->held;
    sh->took_over_unknown = c->took_over_unknown;
    memset(op, 0, sizeof *op);
    op->kind = IDEM__OP_RENEW;
    op->id = &ls[i]->id;
    op->fingerprint = rn[i].shadow.fingerprint;
    op->claim = &rn[i].shadow;
    op->lease_ms = ls[i]->lease_ms;
    op->opts.retention_ms = rn[i].shadow.retention_ms;
    pp[i] = op;
  }
  if (store->methods->version >= 3 && store->methods->run_many) {
    store->methods->run_many(store->state, pp, n);
  } else {
    for (int i = 0; i < n; i++)
      store->methods->run(store->state, pp[i]);
  }
}

static void *sched_thread(void *arg) {
  idem__sched *s = arg;
  idem__lease *batch[RENEW_BATCH];
  renewal *ops = calloc(RENEW_BATCH, sizeof *ops);
  idem__op *pp[RENEW_BATCH];
  pthread_mutex_lock(&s->mu);
  while (!s->stop) {
    int64_t now = idem__mono_ms(), next = INT64_MAX;
    int n = 0;
    for (idem__lease *l = s->head; l; l = l->next) {
      /* Renewed up to a quarter period early, so that leases due close
       * together share one transaction. */
      int64_t slack = l->period_ms / 4;
      if (l->busy || l->ending || l->done)
        continue;
      /* A lost lease is not renewed again: taken over, or ended while a
       * renewal could not be written (the holder's ending may still be). */
      if (idem__lease_lost(l)) {
        l->done = 1;
        continue;
      }
      if (l->due_mono - slack <= now && n < RENEW_BATCH && ops) {
        l->busy = 1;
        batch[n++] = l;
      } else if (l->due_mono - slack < next) {
        next = l->due_mono - slack;
      }
    }
    if (n == 0) {
      if (!ops) /* out of memory: try again in a while */
        next = now + 100;
      s->wake_at = next;
      if (next == INT64_MAX) {
        pthread_cond_wait(&s->cv, &s->mu);
      } else {
        struct timespec until;
        to_timespec(next > now ? next : now + 1, &until);
        pthread_cond_timedwait(&s->cv, &s->mu, &until);
      }
      s->wake_at = 0;
      if (!ops)
        ops = calloc(RENEW_BATCH, sizeof *ops);
      continue;
    }
    pthread_mutex_unlock(&s->mu);
    int64_t asked = idem__mono_ms();
    renew_batch(s->store, batch, ops, pp, n);
    int64_t after = idem__mono_ms();
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n; i++) {
      idem__lease *l = batch[i];
      l->busy = 0;
      if (ops[i].op.rc == IDEM_OK) {
        set_deadline(l, idem__lease_deadline(s->store,
                                             ops[i].shadow.lease_expires_ms,
                                             asked, l->lease_ms));
        __atomic_store_n(&l->call->lease_expires_ms,
                         ops[i].shadow.lease_expires_ms, __ATOMIC_RELAXED);
        l->due_mono = after + l->period_ms;
      } else if (ops[i].op.rc == IDEM_ESTALE) {
        l->stale = 1;
        free(l->why);
        l->why = strdup(ops[i].op.errmsg); /* NULL: idem__lease_hold() says */
        pthread_mutex_lock(&l->fdmu);
        set_lost_locked(l);
        pthread_mutex_unlock(&l->fdmu);
      } else {
        /* A busy or unreachable store: sooner again. The lease counts as
         * lost once its deadline passes, renewal or not. */
        int64_t again = l->period_ms / 4 > 0 ? l->period_ms / 4 : 1;
        l->due_mono = after + again;
      }
    }
    pthread_cond_broadcast(&s->idle_cv);
  }
  pthread_mutex_unlock(&s->mu);
  free(ops);
  return NULL;
}

static idem__sched *sched_get(idem_store *store) {
  idem__sched *s;
  pthread_mutex_lock(&store->sched_mu);
  if ((s = store->sched) == NULL && (s = calloc(1, sizeof *s)) != NULL) {
    s->store = store;
    pthread_mutex_init(&s->mu, NULL);
    cond_init_mono(&s->cv);
    cond_init_mono(&s->idle_cv);
    if (idem__thread_start(&s->thread, "idem-leases", sched_thread, s) != 0) {
      pthread_mutex_destroy(&s->mu);
      pthread_cond_destroy(&s->cv);
      pthread_cond_destroy(&s->idle_cv);
      free(s);
      s = NULL;
    } else {
      store->sched = s;
    }
  }
  pthread_mutex_unlock(&store->sched_mu);
  return s;
}

void idem__sched_free(idem__sched *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->idle_cv);
  free(s);
}

int idem__lease_start(idem_store *store, idem__lease *l) {
  idem__sched *s = sched_get(store);
  if (!s)
    return idem__fail(IDEM_ENOMEM, "execute: cannot start the lease "
                                   "scheduler");
  l->id.tenant = l->call->tenant;
  l->id.operation = l->call->operation;
  l->id.key = l->call->key;
  l->period_ms = l->lease_ms / 3 > 0 ? l->lease_ms / 3 : 1;
  /* From the claim's write, not from now: a claim that came back late (a
   * slow commit, a long group commit) is due for renewal at once. */
  l->deadline_mono = idem__lease_deadline(store, l->call->lease_expires_ms,
                                          l->claimed_mono, l->lease_ms);
  l->due_mono = l->deadline_mono - l->lease_ms + l->period_ms;
  l->lost = l->stale = l->busy = l->ending = l->done = 0;
  l->tfd = -1;
  l->why = NULL;
  pthread_mutex_init(&l->fdmu, NULL);
  l->sched = s;
  pthread_mutex_lock(&s->mu);
  l->prev = NULL;
  l->next = s->head;
  if (s->head)
    s->head->prev = l;
  s->head = l;
  /* The thread is woken only when this lease is due before it would wake
   * by itself (or it is renewing: it looks again after). */
  if (s->wake_at && l->due_mono - l->period_ms / 4 < s->wake_at)
    pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return IDEM_OK;
}

/* How long an ending waits behind a renewal in flight before it cuts the
 * renewal short: a renewal takes milliseconds; one that has not come back
 * by then waits on a stalled server or network, and the ending must not
 * wait with it past its own lease. A quarter of what is left of the lease,
 * between HOLD_PATIENCE_MIN_MS and HOLD_PATIENCE_MAX_MS. */
#define HOLD_PATIENCE_MIN_MS 10
#define HOLD_PATIENCE_MAX_MS 1000

int idem__lease_hold(idem__lease *l, char *why, size_t size) {
  idem__sched *s = l->sched;
  const idem__store_methods *m = s->store->methods;
  int stale;
  pthread_mutex_lock(&s->mu);
  if (l->busy) {
    int64_t now = idem__mono_ms(),
            left = __atomic_load_n(&l->deadline_mono, __ATOMIC_RELAXED) - now,
            patience = left / 4;
    struct timespec until;
    if (patience > HOLD_PATIENCE_MAX_MS)
      patience = HOLD_PATIENCE_MAX_MS;
    if (patience < HOLD_PATIENCE_MIN_MS)
      patience = HOLD_PATIENCE_MIN_MS;
    to_timespec(now + patience, &until);
    while (l->busy)
      if (pthread_cond_timedwait(&s->idle_cv, &s->mu, &until) == ETIMEDOUT)
        break;
    /* Still in flight: the renewal is given up, as a lost connection's
     * would be (its lease keeps the deadline it had), and the ending goes
     * on. */
    if (l->busy && m->version >= 7 && m->interrupt_renewals)
      m->interrupt_renewals(s->store->state);
  }
  while (l->busy)
    pthread_cond_wait(&s->idle_cv, &s->mu);
  l->ending = 1;
  stale = l->stale;
  if (stale)
    snprintf(why, size, "%s",
             l->why ? l->why
                    : "the lease was taken over by a newer attempt or the "
                      "record was removed");
  pthread_mutex_unlock(&s->mu);
  return stale;
}

int idem__lease_try_hold(idem__lease *l) {
  idem__sched *s = l->sched;
  int rc = 1;
  pthread_mutex_lock(&s->mu);
  if (!l->busy && !l->stale) {
    l->ending = 1;
    rc = 0;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void idem__lease_unhold(idem__lease *l, int final) {
  idem__sched *s = l->sched;
  pthread_mutex_lock(&s->mu);
  l->ending = 0;
  if (final)
    l->done = 1;
  else if (s->wake_at && l->due_mono - l->period_ms / 4 < s->wake_at)
    pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

void idem__lease_stop(idem__lease *l) {
  idem__sched *s = l->sched;
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  while (l->busy)
    pthread_cond_wait(&s->idle_cv, &s->mu);
  if (l->prev)
    l->prev->next = l->next;
  else
    s->head = l->next;
  if (l->next)
    l->next->prev = l->prev;
  pthread_mutex_unlock(&s->mu);
  if (l->tfd >= 0)
    close(l->tfd);
  l->tfd = -1;
  pthread_mutex_destroy(&l->fdmu);
  free(l->why);
  l->why = NULL;
  l->sched = NULL;
}

/* ---- the waiting room ---------------------------------------------------- */

#define WAIT_BUCKETS 256

typedef struct bucket {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t gen;
  int waiters; /* __atomic */
} bucket;

static bucket room[WAIT_BUCKETS];
static pthread_once_t room_once = PTHREAD_ONCE_INIT;

/* After fork() the child's buckets may be locked by threads it does not
 * have: it starts with a fresh room (it has no waiters). */
static void room_reset(void) {
  for (int i = 0; i < WAIT_BUCKETS; i++) {
    pthread_mutex_init(&room[i].mu, NULL);
    cond_init_mono(&room[i].cv);
    room[i].waiters = 0;
  }
}

static void room_init(void) {
  room_reset();
  pthread_atfork(NULL, NULL, room_reset);
}

size_t idem__wait_name(const idem_id *id, char *buf, size_t size) {
  int n = snprintf(buf, size, "%s\x1f%s\x1f%s", id->tenant ? id->tenant : "",
                   id->operation, id->key);
  return n < 0 || (size_t)n >= size ? 0 : (size_t)n;
}

unsigned idem__wait_bucket(const char *name, size_t len) {
  /* FNV-1a: an even spread is all that is asked. */
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)name[i];
    h *= 16777619u;
  }
  return h % WAIT_BUCKETS;
}

static unsigned id_bucket(const idem_id *id) {
  char name[800];
  size_t n = idem__wait_name(id, name, sizeof name);
  return idem__wait_bucket(name, n);
}

void idem__wait_enter(const idem_id *id, idem__waiter *w) {
  pthread_once(&room_once, room_init);
  w->bucket = id_bucket(id);
  __atomic_add_fetch(&room[w->bucket].waiters, 1, __ATOMIC_SEQ_CST);
  idem__wait_mark(w);
}

void idem__wait_leave(idem__waiter *w) {
  __atomic_sub_fetch(&room[w->bucket].waiters, 1, __ATOMIC_SEQ_CST);
}

void idem__wait_mark(idem__waiter *w) {
  bucket *b = &room[w->bucket];
  pthread_mutex_lock(&b->mu);
  w->gen = b->gen;
  pthread_mutex_unlock(&b->mu);
}

int idem__wait_sleep(idem__waiter *w, int64_t until_mono) {
  bucket *b = &room[w->bucket];
  struct timespec until;
  int woken;
  to_timespec(until_mono, &until);
  pthread_mutex_lock(&b->mu);
  while (b->gen == w->gen && idem__mono_ms() < until_mono)
    if (pthread_cond_timedwait(&b->cv, &b->mu, &until) == ETIMEDOUT)
      break;
  woken = b->gen != w->gen;
  w->gen = b->gen;
  pthread_mutex_unlock(&b->mu);
  return woken;
}

void idem__wait_wake_bucket(unsigned i) {
  bucket *b;
  pthread_once(&room_once, room_init);
  b = &room[i % WAIT_BUCKETS];
  if (__atomic_load_n(&b->waiters, __ATOMIC_SEQ_CST) == 0)
    return;
  pthread_mutex_lock(&b->mu);
  b->gen++;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

void idem__wait_wake(const idem_id *id) {
  idem__wait_wake_bucket(id_bucket(id));
}

int idem__wait_count(const idem_id *id) {
  pthread_once(&room_once, room_init);
  return __atomic_load_n(&room[id_bucket(id)].waiters, __ATOMIC_SEQ_CST);
}

static unsigned long reports;

void idem__wait_reported(unsigned b) {
  __atomic_add_fetch(&reports, 1, __ATOMIC_RELAXED);
  idem__wait_wake_bucket(b);
}

unsigned long idem__wait_reports(void) {
  return __atomic_load_n(&reports, __ATOMIC_RELAXED);
}
