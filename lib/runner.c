/*
 * runner.c -- a store's threads for the calls that cannot be queued.
 *
 * idem_execute_begin_async() and idem_execute_end_async() hand their
 * calls to the backend's queue (the SQLite store's group commit), which
 * needs no thread per call. What the queue cannot take (a backend without
 * one, a claim that waits on a key in flight, an ending retried while the
 * store is busy) runs here, on threads made when first needed, at most
 * RUNNER_MAX of them; later tasks wait their turn in order. Idle threads
 * stay until the store closes.
 *
 * Claims that wait on a key in flight have a runner of their own, with
 * room for more of them: a waiter holds its thread until the key's holder
 * ends, and that ending must never queue behind its own waiters.
 */
#include "lease.h"

#include <stdlib.h>

#define RUNNER_MAX 16
#define WAIT_RUNNER_MAX 64

typedef struct task {
  void (*fn)(void *arg);
  void *arg;
  struct task *next;
} task;

struct idem__runner {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  task *head, *tail;
  int threads, idle, stop, max;
  pthread_t tid[WAIT_RUNNER_MAX];
};

static void *runner_main(void *arg) {
  idem__runner *r = arg;
  pthread_mutex_lock(&r->mu);
  for (;;) {
    task *t;
    while (!r->head && !r->stop) {
      r->idle++;
      pthread_cond_wait(&r->cv, &r->mu);
      r->idle--;
    }
    if (!(t = r->head))
      break;
    r->head = t->next;
    if (!r->head)
      r->tail = NULL;
    pthread_mutex_unlock(&r->mu);
    t->fn(t->arg);
    free(t);
    pthread_mutex_lock(&r->mu);
  }
  pthread_mutex_unlock(&r->mu);
  return NULL;
}

static idem__runner *runner_get(idem_store *store, idem__runner **slot,
                                int max) {
  idem__runner *r;
  pthread_mutex_lock(&store->sched_mu);
  if (!(r = *slot) && (r = calloc(1, sizeof *r))) {
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->max = max;
    *slot = r;
  }
  pthread_mutex_unlock(&store->sched_mu);
  return r;
}

static int submit(idem__runner *r, void (*fn)(void *arg), void *arg);

int idem__runner_submit(idem_store *store, void (*fn)(void *arg), void *arg) {
  return submit(runner_get(store, &store->runner, RUNNER_MAX), fn, arg);
}

int idem__runner_submit_wait(idem_store *store, void (*fn)(void *arg),
                             void *arg) {
  return submit(runner_get(store, &store->wait_runner, WAIT_RUNNER_MAX), fn,
                arg);
}

static int submit(idem__runner *r, void (*fn)(void *arg), void *arg) {
  task *t = malloc(sizeof *t);
  if (!r || !t) {
    free(t);
    return -1;
  }
  t->fn = fn;
  t->arg = arg;
  t->next = NULL;
  pthread_mutex_lock(&r->mu);
  if (r->tail)
    r->tail->next = t;
  else
    r->head = t;
  r->tail = t;
  if (r->idle)
    pthread_cond_signal(&r->cv);
  else if (r->threads < r->max &&
           idem__thread_start(&r->tid[r->threads], "idem-runner",
                              runner_main, r) == 0)
    r->threads++;
  if (!r->threads) {
    /* Not one thread could start: the caller runs it. */
    r->head = r->tail = NULL;
    pthread_mutex_unlock(&r->mu);
    free(t);
    idem__clear_error();
    return -1;
  }
  pthread_mutex_unlock(&r->mu);
  return 0;
}

void idem__runner_free(idem__runner *r) {
  if (!r)
    return;
  pthread_mutex_lock(&r->mu);
  r->stop = 1;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  /* What is queued still runs: each task ends a call its caller waits
   * for. */
  for (int i = 0; i < r->threads; i++)
    pthread_join(r->tid[i], NULL);
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r);
}
