/*
 * pool.c -- the gateway's store workers: a fixed set of threads for the
 * work of suspended requests that may wait: the answers of unkeyed
 * requests (their access-log lines are written there, never on the
 * upstream loop), the MCP proxy's store calls, and the gateway's claims
 * and records when the store cannot queue them (out of memory).
 *
 * Tasks run in the order they were handed over.
 */
#include "serve.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct task {
  void (*fn)(void *arg);
  void *arg;
  struct task *next;
} task;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  task *head, *tail;
  pthread_t *threads;
  int n, stopping, queued;
} P = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&P.mu);
  for (;;) {
    task *t;
    while (!P.head && !P.stopping)
      pthread_cond_wait(&P.cv, &P.mu);
    if (!P.head)
      break; /* stopping, and nothing left */
    t = P.head;
    if (!(P.head = t->next))
      P.tail = NULL;
    P.queued--;
    pthread_mutex_unlock(&P.mu);
    t->fn(t->arg);
    free(t);
    pthread_mutex_lock(&P.mu);
  }
  pthread_mutex_unlock(&P.mu);
  return NULL;
}

int pool_start(int n) {
  if (!(P.threads = calloc((size_t)n, sizeof *P.threads)))
    return -1;
  for (P.n = 0; P.n < n; P.n++) {
    if (pthread_create(&P.threads[P.n], NULL, worker, NULL) != 0)
      return P.n ? 0 : -1;
    pthread_setname_np(P.threads[P.n], "idem-store");
  }
  return 0;
}

int pool_submit(void (*fn)(void *arg), void *arg) {
  task *t = malloc(sizeof *t);
  if (!t)
    return -1;
  t->fn = fn;
  t->arg = arg;
  t->next = NULL;
  pthread_mutex_lock(&P.mu);
  if (P.stopping) {
    /* The workers are ending: the caller must do it itself. */
    pthread_mutex_unlock(&P.mu);
    free(t);
    return -1;
  }
  if (P.tail)
    P.tail->next = t;
  else
    P.head = t;
  P.tail = t;
  P.queued++;
  pthread_mutex_unlock(&P.mu);
  /* After the unlock: a worker woken under the lock would only wait for
   * it again. */
  pthread_cond_signal(&P.cv);
  return 0;
}

int pool_queued(void) {
  int n;
  pthread_mutex_lock(&P.mu);
  n = P.queued;
  pthread_mutex_unlock(&P.mu);
  return n;
}

void pool_stop(void) {
  pthread_mutex_lock(&P.mu);
  P.stopping = 1;
  pthread_cond_broadcast(&P.cv);
  pthread_mutex_unlock(&P.mu);
  for (int i = 0; i < P.n; i++)
    pthread_join(P.threads[i], NULL);
  free(P.threads);
  P.threads = NULL;
  P.n = 0;
}
