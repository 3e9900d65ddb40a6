/*
 * pool.c -- the gateway's store workers: a fixed set of threads for the
 * work of suspended requests that may wait: the answers of unkeyed
 * requests (their access-log lines are written there, never on the
 * upstream loop), the MCP proxy's store calls, and the gateway's claims
 * and records when the store cannot queue them (out of memory).
 *
 * Tasks run in the order they were handed over.
 *
 * A second set, the fingerprint workers, reads large keyed bodies (their
 * fingerprints: a parse of the whole body), so that a few heavy requests
 * hold neither libmicrohttpd's threads, which every other request needs,
 * nor the store workers: they queue among themselves.
 */
#include "serve.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct task {
  void (*fn)(void *arg);
  void *arg;
  struct task *next;
} task;

typedef struct pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  task *head, *tail;
  pthread_t *threads;
  int n, stopping, queued;
} pool;

static pool P = {.mu = PTHREAD_MUTEX_INITIALIZER,
                 .cv = PTHREAD_COND_INITIALIZER};
static pool H = {.mu = PTHREAD_MUTEX_INITIALIZER,
                 .cv = PTHREAD_COND_INITIALIZER};

static void *worker(void *arg) {
  pool *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    task *t;
    while (!w->head && !w->stopping)
      pthread_cond_wait(&w->cv, &w->mu);
    if (!w->head)
      break; /* stopping, and nothing left */
    t = w->head;
    if (!(w->head = t->next))
      w->tail = NULL;
    w->queued--;
    pthread_mutex_unlock(&w->mu);
    t->fn(t->arg);
    free(t);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static int start(pool *w, int n, const char *name) {
  if (!(w->threads = calloc((size_t)n, sizeof *w->threads)))
    return -1;
  for (w->n = 0; w->n < n; w->n++) {
    if (pthread_create(&w->threads[w->n], NULL, worker, w) != 0)
      return w->n ? 0 : -1;
    pthread_setname_np(w->threads[w->n], name);
  }
  return 0;
}

int pool_start(int n) { return start(&P, n, "idem-store"); }

int pool_heavy_start(int n) { return start(&H, n, "idem-fprint"); }

static int submit(pool *w, void (*fn)(void *arg), void *arg) {
  task *t = malloc(sizeof *t);
  if (!t)
    return -1;
  t->fn = fn;
  t->arg = arg;
  t->next = NULL;
  pthread_mutex_lock(&w->mu);
  if (w->stopping || !w->n) {
    /* The workers are ending (or never started): the caller must do it
     * itself. */
    pthread_mutex_unlock(&w->mu);
    free(t);
    return -1;
  }
  if (w->tail)
    w->tail->next = t;
  else
    w->head = t;
  w->tail = t;
  w->queued++;
  pthread_mutex_unlock(&w->mu);
  /* After the unlock: a worker woken under the lock would only wait for
   * it again. */
  pthread_cond_signal(&w->cv);
  return 0;
}

int pool_submit(void (*fn)(void *arg), void *arg) { return submit(&P, fn, arg); }

int pool_heavy_submit(void (*fn)(void *arg), void *arg) {
  return submit(&H, fn, arg);
}

int pool_queued(void) {
  int n;
  pthread_mutex_lock(&P.mu);
  n = P.queued;
  pthread_mutex_unlock(&P.mu);
  return n;
}

static void stop(pool *w) {
  pthread_mutex_lock(&w->mu);
  w->stopping = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < w->n; i++)
    pthread_join(w->threads[i], NULL);
  free(w->threads);
  w->threads = NULL;
  w->n = 0;
}

void pool_stop(void) {
  /* The fingerprint workers first: what they finish goes on to the store
   * workers. */
  stop(&H);
  stop(&P);
}
