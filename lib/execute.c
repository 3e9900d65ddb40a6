/*
 * execute.c -- idem_execute(): a remote action in one call.
 *
 * Claim, run the caller's action while a thread renews the lease, then end
 * the record by what the action answered. Every front end (idem run, the
 * HTTP gateway, the MCP proxy) would otherwise write this loop again, and
 * each copy would get the hard parts (renewing while the action runs,
 * noticing a takeover, retrying a completion the store could not take)
 * slightly wrong.
 */
#include "lease.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_FINISH_RETRY_MS 30000
#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 2000

/* The store's scheduler renews the lease (lease.h); this is what the
 * action sees of it. */
struct idem_exec {
  idem_store *store;
  idem_call *call;
  idem__lease lease;
  int running;
  int64_t budget; /* how long an ending is retried */
};

static void sleep_ms(int64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ---- what the action sees -------------------------------------------- */

int idem_exec_lost_fd(idem_exec *x) {
  /* In a child of fork() the lease is the parent's, and so is the lock
   * that guards its descriptor. */
  return x && x->running && !idem__store_forked(x->store)
             ? idem__lease_lost_fd(&x->lease)
             : -1;
}

int idem_exec_lost(const idem_exec *x) {
  return x && x->running ? idem__lease_lost((idem__lease *)&x->lease) : 0;
}

idem_outcome idem_exec_outcome(const idem_exec *x) {
  return x ? idem_call_outcome(x->call) : (idem_outcome)0;
}

int idem_exec_attempt(const idem_exec *x) {
  return x ? idem_call_attempt(x->call) : 0;
}

/* claimed_mono: a monotonic time before the claim was asked, which its
 * lease counts from at the earliest. */
static int exec_start(idem_exec *x, idem_store *store, idem_call *call,
                      int64_t lease_ms, int64_t claimed_mono) {
  int rc;
  int64_t budget = x->budget;
  memset(x, 0, sizeof *x);
  x->budget = budget;
  x->store = store;
  x->call = call;
  x->lease.call = call;
  x->lease.lease_ms = lease_ms;
  x->lease.claimed_mono = claimed_mono;
  if ((rc = idem__lease_start(store, &x->lease)) != IDEM_OK)
    return rc;
  x->running = 1;
  return IDEM_OK;
}

static void exec_stop(idem_exec *x) {
  if (!x->running)
    return;
  idem__lease_stop(&x->lease);
  x->running = 0;
}

/* ---- ending the record ------------------------------------------------ */

enum { END_COMPLETE, END_RELEASE, END_UNKNOWN, END_ABANDON };

/*
 * Whether the record already holds this ending, at this claim's attempt:
 * completed with exactly response r, or marked unknown. So it is when an
 * earlier send of the ending committed and its answer was lost with the
 * connection, and the renewer, finding the record no longer held under
 * the claim's token, ran before the ending was sent again. A release
 * cannot be told from a takeover's release, nor a renewal from a newer
 * holder's, so neither ever counts.
 */
static int ended_already(idem_exec *x, int how, const idem_response *r) {
  const idem_call *cl = x->call;
  idem_id id = {cl->tenant, cl->operation, cl->key};
  idem_record *rec = NULL;
  int same = 0;
  if (how == END_RELEASE || how == END_ABANDON ||
      idem_get(x->store, &id, &rec) != IDEM_OK)
    return 0;
  if (rec->attempt == cl->attempt &&
      strcmp(rec->fingerprint, cl->fingerprint) == 0) {
    if (how == END_UNKNOWN)
      same = rec->state == IDEM_STATE_UNKNOWN;
    else
      same = rec->state == IDEM_STATE_COMPLETED && rec->has_response &&
             rec->response.status == r->status &&
             rec->response.meta_len == r->meta_len &&
             rec->response.body_len == r->body_len &&
             (r->meta_len == 0 ||
              memcmp(rec->response.meta, r->meta, r->meta_len) == 0) &&
             (r->body_len == 0 ||
              memcmp(rec->response.body, r->body, r->body_len) == 0);
  }
  idem_record_free(rec);
  return same;
}

/*
 * One ending, retried with backoff while the store is busy or unreachable
 * and the budget lasts; the scheduler keeps the lease meanwhile. Each try
 * holds renewals off, so that no renewal runs beside an ending (one that
 * landed after a release would give the lease back). A lease that could not
 * be renewed does not end the retries: until another holder takes the key
 * (IDEM_ESTALE), the ending is still this holder's to write, and giving up
 * would leave the key in progress for a takeover to act again.
 */
static int end_record(idem_exec *x, int how, const idem_response *r,
                      int64_t budget_ms) {
  int64_t start = idem__mono_ms(), backoff = BACKOFF_FIRST_MS;
  int64_t until =
      budget_ms > INT64_MAX - start ? INT64_MAX : start + budget_ms;
  int rc;
  for (;;) {
    char why[256];
    if (idem__lease_hold(&x->lease, why, sizeof why)) {
      /* The scheduler found the record no longer held under the claim's
       * token: taken over, or already ended as asked (see
       * ended_already()). */
      if (ended_already(x, how, r)) {
        x->call->held = 0;
        x->call->lease_expires_ms = 0;
        x->call->ended_state = how == END_COMPLETE ? IDEM_STATE_COMPLETED
                                                   : IDEM_STATE_UNKNOWN;
        rc = IDEM_OK;
      } else {
        /* The key is another holder's: this call holds nothing and left
         * nothing (idem_call_state() 0), as after a completion the store
         * refused as stale (idem__finish_after()). */
        x->call->held = 0;
        x->call->lease_expires_ms = 0;
        rc = idem__fail(IDEM_ESTALE, "%s", why);
      }
      idem__lease_unhold(&x->lease, 1);
      return rc;
    }
    rc = how == END_COMPLETE  ? idem_complete(x->store, x->call, r)
         : how == END_RELEASE ? idem_release(x->store, x->call)
         : how == END_ABANDON ? idem_renew(x->store, x->call,
                                           x->lease.lease_ms)
                              : idem_mark_unknown(x->store, x->call);
    if ((rc != IDEM_EBUSY && rc != IDEM_EUNAVAILABLE) ||
        idem__mono_ms() + backoff > until) {
      /* Renewals end with the ending written, or given up on. */
      idem__lease_unhold(&x->lease, 1);
      return rc;
    }
    /* Renewals go on between tries: the ending is still this holder's to
     * write. */
    idem__lease_unhold(&x->lease, 0);
    sleep_ms(backoff);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
}

/* ---- the call ---------------------------------------------------------- */

static const char *ending_name(int how) {
  return how == END_COMPLETE  ? "stored"
         : how == END_RELEASE ? "released"
         : how == END_ABANDON ? "left in progress with a fresh lease"
                              : "marked unknown";
}

/*
 * The claim and the start of renewals: idem_execute()'s first half. On
 * PROCEED and RECOVER x runs (its renewals started) and *out is the held
 * call; on the other outcomes x does not run and *out tells the outcome.
 * On failure *out is NULL.
 */
/* exec_begin()'s checks and the fingerprint: o gets opts (call.request
 * set to *canon, the canonical form kept with the record, unless
 * forget_request), fp the
 * fingerprint, *budget how long an ending is retried. */
static int begin_prepare(idem_store *store, const char *request,
                         size_t request_len, const idem_execute_options *opts,
                         idem_execute_options *o,
                         char fp[IDEM_FINGERPRINT_SIZE], char **canon,
                         int64_t *budget) {
  size_t canon_len = 0;
  int rc;

  *canon = NULL;
  if (!store || (!request && request_len))
    return idem__fail(IDEM_EINVAL, "execute: NULL store or request");
  if ((rc = idem__store_owned(store, "execute")) != IDEM_OK)
    return rc;
  memset(o, 0, sizeof *o);
  if (opts)
    *o = *opts;
  if (o->call.request || o->call.request_len)
    return idem__fail(IDEM_EINVAL,
                      "execute: call.request is set; idem_execute() keeps "
                      "the canonical request itself: leave call.request "
                      "NULL and call.request_len 0");
  if (o->finish_retry_ms < 0)
    return idem__fail(IDEM_EINVAL, "execute: negative finish_retry_ms");
  if (o->fingerprint_pointers && !o->fingerprint_pointers[0])
    return idem__fail(IDEM_EINVAL,
                      "execute: fingerprint_pointers is empty: every request "
                      "would share one fingerprint; pass NULL for the whole "
                      "request");
  *budget = o->finish_retry_ms ? o->finish_retry_ms : DEFAULT_FINISH_RETRY_MS;

  if (o->fingerprint) {
    /* The caller's own: checked for its form only. */
    size_t n = strspn(o->fingerprint, "0123456789abcdef");
    if (n != IDEM_FINGERPRINT_SIZE - 1 || o->fingerprint[n])
      return idem__fail(IDEM_EINVAL, "execute: fingerprint is not 64 "
                                     "lowercase hex digits");
    memcpy(fp, o->fingerprint, IDEM_FINGERPRINT_SIZE);
    /* Lone surrogates read: the caller may have taken the fingerprint with
     * IDEM_FP_LONE_SURROGATES, and the form is an operator's view. */
    rc = o->forget_request
             ? IDEM_OK
             : idem__canon_text(request ? request : "", request_len, NULL,
                                IDEM__CANON_LONE, canon, &canon_len, NULL);
  } else if (o->forget_request) {
    /* Nothing of the request is kept: its fingerprint is all it needs. */
    rc = idem__request_fingerprint(request ? request : "", request_len,
                                   o->fingerprint_pointers, fp);
  } else {
    rc = idem__request_forms(request ? request : "", request_len,
                             o->fingerprint_pointers, fp, canon, &canon_len);
  }
  if (!o->forget_request) {
    o->call.request = *canon;
    o->call.request_len = canon_len;
  }
  return rc;
}

static int64_t lease_of(const idem_execute_options *o) {
  return o->call.lease_ms ? o->call.lease_ms : IDEM__DEFAULT_LEASE_MS;
}

/* Whether a claim asked at asked came back with most of its lease gone (a
 * long queue before the store's write): it is renewed before the action
 * starts, since run on an ended lease the action could act beside a
 * takeover's. */
static int late_claim(idem_store *store, const idem_call *call, int64_t asked,
                      int64_t lease_ms) {
  return idem__lease_deadline(store, call->lease_expires_ms, asked, lease_ms) -
             idem__mono_ms() <
         lease_ms / 3;
}

/* A claim that came back PROCEED or RECOVER: renewed first when it came
 * back late, then x runs. On failure the key is released (unless taken
 * over) and call is freed. */
static int begin_hold(idem_store *store, const idem_id *id, idem_call *call,
                      int64_t lease_ms, int64_t asked, idem_exec *x) {
  int rc;
  if (late_claim(store, call, asked, lease_ms)) {
    int64_t again = idem__mono_ms();
    if ((rc = idem_renew(store, call, lease_ms)) != IDEM_OK) {
      char why[512];
      snprintf(why, sizeof why, "%s", idem_errmsg());
      if (rc != IDEM_ESTALE)
        idem_release(store, call);
      idem_call_free(call);
      return idem__fail(rc,
                        "execute: key '%s': the claim came back with its "
                        "lease nearly over, and renewing it failed (%s); the "
                        "action did not run%s",
                        id->key, why,
                        rc == IDEM_ESTALE
                            ? " (another holder took the key over)"
                            : "");
    }
    asked = again;
  }
  if ((rc = exec_start(x, store, call, lease_ms, asked)) != IDEM_OK) {
    /* Nothing ran: free the key for a retry. */
    char why[512];
    snprintf(why, sizeof why, "%s", idem_errmsg());
    idem_release(store, call);
    idem_call_free(call);
    return idem__fail(rc, "%s", why);
  }
  return IDEM_OK;
}

/*
 * The claim and the start of renewals: idem_execute()'s first half. On
 * PROCEED and RECOVER x runs (its renewals started) and *out is the held
 * call; on the other outcomes x does not run and *out tells the outcome.
 * On failure *out is NULL.
 */
static int exec_begin(idem_store *store, const idem_id *id,
                      const char *request, size_t request_len,
                      const idem_execute_options *opts, idem_exec *x,
                      idem_call **out) {
  idem_execute_options o;
  char fp[IDEM_FINGERPRINT_SIZE], *canon = NULL;
  idem_call *call = NULL;
  int64_t asked, budget = 0;
  int rc;

  memset(x, 0, sizeof *x);
  *out = NULL;
  rc = begin_prepare(store, request, request_len, opts, &o, fp, &canon,
                     &budget);
  x->budget = budget;
  if (rc != IDEM_OK)
    goto out;
  asked = idem__mono_ms();
  if ((rc = idem_claim(store, id, fp, &o.call, &call)) != IDEM_OK)
    goto out;
  if (idem_call_outcome(call) == IDEM_PROCEED ||
      idem_call_outcome(call) == IDEM_RECOVER)
    rc = begin_hold(store, id, call, lease_of(&o), asked, x);
  if (rc == IDEM_OK)
    *out = call;
out:
  idem_free(canon);
  return rc;
}

/* The ending for what the action reported; anything but the four results
 * is taken as unknown. */
static int end_how(idem_exec_result result) {
  return result == IDEM_EXEC_DONE                ? END_COMPLETE
         : result == IDEM_EXEC_NOT_DONE          ? END_RELEASE
         : result == IDEM_EXEC_LEAVE_IN_PROGRESS ? END_ABANDON
                                                 : END_UNKNOWN;
}

/* For a completion: resp checked and copied into the call. IDEM_OK, or
 * why it cannot be kept (why says so; the call is unchanged). */
static int end_keep(idem_exec *x, const idem_response *resp, char *why,
                    size_t size) {
  int bad = idem__plain_response_problem(resp, "its response", why, size);
  if (bad != IDEM_OK)
    return bad;
  if (idem__claim_set_response(x->call, resp->status, resp->meta,
                               resp->meta_len, resp->body,
                               resp->body_len) != IDEM_OK) {
    snprintf(why, size, "there was no memory left to keep its response");
    return IDEM_ENOMEM;
  }
  return IDEM_OK;
}

/* The action ran, but its response cannot be kept (bad, why): the key must
 * not look free, nor stay in progress for a takeover to act again. */
static int end_unkeepable(idem_exec *x, int bad, const char *why) {
  const char *key = x->call->key;
  int marked = end_record(x, END_UNKNOWN, NULL, x->budget);
  exec_stop(x);
  return idem__fail(bad, "execute: key '%s': the action ran, but %s; the key %s",
                    key, why,
                    marked == IDEM_OK
                        ? "is marked unknown (resolve it as an operator)"
                        : "could not be marked unknown either");
}

/* After the ending's write answered rc (why: its detail): what the caller
 * is told, and x's renewals stopped. */
static int end_report(idem_exec *x, int how, int rc, const char *why) {
  const char *key = x->call->key;
  int marked = -1;
  if (rc == IDEM_OK) {
    exec_stop(x);
    return IDEM_OK;
  }
  /* The lease was taken over: the key is another holder's now, and it
   * must not be touched. Otherwise a completion that failed for good
   * leaves the key unknown rather than free or in progress. */
  if (rc != IDEM_ESTALE && how == END_COMPLETE)
    marked = end_record(x, END_UNKNOWN, NULL, x->budget / 4);
  exec_stop(x);
  return idem__fail(
      rc, "execute: key '%s': the action %s, but it could not be %s: %s%s",
      key, how == END_RELEASE ? "did not act" : "ran", ending_name(how), why,
      rc == IDEM_ESTALE ? " (another holder took the key over)"
      : marked == IDEM_OK
          ? "; the key is marked unknown"
      : how == END_COMPLETE
          ? "; marking the key unknown failed too: it stays in progress"
          : "");
}

/* Ends the record by what the action reported and stops x's renewals:
 * idem_execute()'s second half. */
static int exec_end(idem_exec *x, idem_exec_result result,
                    const idem_response *response) {
  idem_response resp;
  char why[512];
  int rc, how = end_how(result);

  memset(&resp, 0, sizeof resp);
  if (response && result == IDEM_EXEC_DONE)
    resp = *response;
  if (how == END_COMPLETE &&
      (rc = end_keep(x, &resp, why, sizeof why)) != IDEM_OK)
    return end_unkeepable(x, rc, why);
  rc = end_record(x, how, &resp, x->budget);
  snprintf(why, sizeof why, "%s", rc == IDEM_OK ? "" : idem_errmsg());
  return end_report(x, how, rc, why);
}

int idem_execute(idem_store *store, const idem_id *id, const char *request,
                 size_t request_len, idem_exec_fn fn, void *ctx,
                 const idem_execute_options *opts, idem_call **out) {
  idem_exec x;
  idem_response resp;
  idem_exec_result result;
  int *ran = opts ? opts->ran : NULL;
  int rc;

  idem__clear_error();
  if (ran)
    *ran = 0;
  if (!out)
    return idem__fail(IDEM_EINVAL, "execute: NULL output");
  *out = NULL;
  if (!fn)
    return idem__fail(IDEM_EINVAL, "execute: NULL action");
  rc = exec_begin(store, id, request, request_len, opts, &x, out);
  if (rc != IDEM_OK || !x.running) {
    if (rc == IDEM_OK)
      idem__clear_error();
    return rc;
  }
  memset(&resp, 0, sizeof resp);
  /* From here on every return comes after the action, with *out set. */
  if (ran)
    *ran = 1;
  result = fn(&x, ctx, &resp);
  rc = exec_end(&x, result, &resp);
  if (rc == IDEM_OK)
    idem__clear_error();
  return rc;
}

int idem_execute_begin(idem_store *store, const idem_id *id,
                       const char *request, size_t request_len,
                       const idem_execute_options *opts, idem_exec **exec,
                       idem_call **out) {
  idem_exec *x;
  int rc;

  idem__clear_error();
  if (opts && opts->ran)
    *opts->ran = 0; /* the caller runs the action, not the library */
  if (!out || !exec)
    return idem__fail(IDEM_EINVAL, "execute_begin: NULL output");
  *out = NULL;
  *exec = NULL;
  if (!(x = malloc(sizeof *x)))
    return idem__fail(IDEM_ENOMEM, "execute_begin: out of memory");
  rc = exec_begin(store, id, request, request_len, opts, x, out);
  if (rc == IDEM_OK && x->running) {
    *exec = x;
    idem__clear_error();
    return IDEM_OK;
  }
  free(x);
  if (rc == IDEM_OK)
    idem__clear_error();
  return rc;
}

int idem_execute_end(idem_exec *exec, idem_exec_result result,
                     const idem_response *response) {
  int rc;
  idem__clear_error();
  if (!exec)
    return idem__fail(IDEM_EINVAL, "execute_end: NULL action");
  if ((rc = idem__store_owned(exec->store, "execute_end")) != IDEM_OK) {
    /* A child of fork(): the lease, its scheduler and the key are the
     * parent's, which ends them. Only the child's copy of exec goes. */
    free(exec);
    return rc;
  }
  rc = exec_end(exec, result, response);
  free(exec);
  if (rc == IDEM_OK)
    idem__clear_error();
  return rc;
}

/* ---- without waiting --------------------------------------------------- */

/* An asynchronous begin or end: its op first, queued on the backend or run
 * on the store's runner (runner.c). */
typedef struct async_call {
  idem__op op;
  idem_store *store;
  idem_exec *x;
  void *ctx;
  /* begin */
  idem_begin_done_fn begun;
  idem_execute_options o;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon;
  idem_id id; /* points into id_buf (begin) or the held call (end) */
  char *id_buf;
  int64_t asked;
  /* end */
  idem_end_done_fn ended;
  int how;
  int bad;    /* the response cannot be kept: end_keep()'s answer */
  int failed; /* the queued write's error, when not worth retrying */
  idem__finish f;
  /* An ending's why (end_unkeepable(), end_report()) is kept in
   * op.errmsg: once the op is done, or when it is never queued, the op's
   * message is the ending's own. */
} async_call;

/* op on the backend's queue, or else on a runner thread, or else here. */
static void run_op_task(void *arg) {
  async_call *a = arg;
  a->op.rc = IDEM_OK;
  a->op.errmsg[0] = '\0';
  a->store->methods->run(a->store->state, &a->op);
  a->op.on_done(&a->op);
}

static void queue_op(async_call *a) {
  const idem__store_methods *m = a->store->methods;
  a->op.on_done_ctx = a;
  a->op.rc = IDEM_OK;
  a->op.errmsg[0] = '\0';
  if (m->version >= 5 && m->queue && m->queue(a->store->state, &a->op) == 0)
    return;
  if (idem__runner_submit(a->store, run_op_task, a) != 0)
    run_op_task(a);
}

/* fn(a) on a runner thread, or here when none can start. */
static void on_runner(async_call *a, void (*fn)(void *)) {
  if (idem__runner_submit(a->store, fn, a) != 0)
    fn(a);
}

/* The op's error as this thread's. */
static int op_result(idem__op *op) {
  if (op->rc == IDEM_OK)
    return IDEM_OK;
  return idem__fail(op->rc, "%s",
                    op->errmsg[0] ? op->errmsg : idem_strerror(op->rc));
}

static void begin_answer(async_call *a, int rc, idem_call *call) {
  idem_exec *x = a->x;
  if (!(rc == IDEM_OK && x->running)) {
    free(x);
    x = NULL;
  }
  if (rc == IDEM_OK)
    idem__clear_error();
  a->begun(a->ctx, rc, x, rc == IDEM_OK ? call : NULL);
  idem__op_seal_free(&a->op);
  idem_free(a->canon);
  free(a->id_buf);
  free(a);
}

/* The claim came back late: renewed on a runner thread, since it waits. */
static void begin_late(void *arg) {
  async_call *a = arg;
  idem_call *call = a->op.claim;
  int rc = begin_hold(a->store, &a->id, call, lease_of(&a->o), a->asked, a->x);
  begin_answer(a, rc, call);
}

/* The claim's answer (rc, op.claim): on whatever thread it came. */
static void begin_claimed(async_call *a, int rc) {
  idem_call *call = a->op.claim;
  if (rc != IDEM_OK) {
    idem_call_free(call);
    begin_answer(a, rc, NULL);
    return;
  }
  if (call->outcome != IDEM_PROCEED && call->outcome != IDEM_RECOVER) {
    /* A replay's sealed response is opened here, on whichever thread
     * answers, so that done() reads the detail of a failure. */
    if ((rc = idem__claim_open(a->store, call)) != IDEM_OK) {
      idem_call_free(call);
      call = NULL;
    }
    begin_answer(a, rc, call);
    return;
  }
  if (late_claim(a->store, call, a->asked, lease_of(&a->o))) {
    on_runner(a, begin_late);
    return;
  }
  rc = begin_hold(a->store, &a->id, call, lease_of(&a->o), a->asked, a->x);
  begin_answer(a, rc, call);
}

static void begin_queued(idem__op *op) {
  async_call *a = op->on_done_ctx;
  begin_claimed(a, op_result(op));
}

/* A claim that waits for a key in flight: on the waiters' runner. Its
 * wait counts from the call, not from when a thread took it. */
static void begin_waiting(void *arg) {
  async_call *a = arg;
  int64_t waited = idem__mono_ms() - a->asked;
  a->op.opts.wait_ms =
      waited >= a->op.opts.wait_ms ? 1 : a->op.opts.wait_ms - waited;
  begin_claimed(a, idem__claim_run(a->store, &a->op));
}

/* *id pointing into *buf, one allocation holding copies of c's parts. */
static int copy_id(const idem_call *c, idem_id *id, char **buf) {
  size_t t = strlen(c->tenant) + 1, o = strlen(c->operation) + 1,
         k = strlen(c->key) + 1;
  char *b = malloc(t + o + k);
  if (!b)
    return idem__fail(IDEM_ENOMEM, "execute_begin_async: out of memory");
  memcpy(b, c->tenant, t);
  memcpy(b + t, c->operation, o);
  memcpy(b + t + o, c->key, k);
  id->tenant = b;
  id->operation = b + t;
  id->key = b + t + o;
  *buf = b;
  return IDEM_OK;
}

int idem_execute_begin_async(idem_store *store, const idem_id *id,
                             const char *request, size_t request_len,
                             const idem_execute_options *opts,
                             idem_begin_done_fn done, void *ctx) {
  async_call *a;
  int rc;

  idem__clear_error();
  if (opts && opts->ran)
    *opts->ran = 0; /* the caller runs the action, not the library */
  if (!done)
    return idem__fail(IDEM_EINVAL, "execute_begin_async: NULL done");
  if (!(a = calloc(1, sizeof *a)) || !(a->x = calloc(1, sizeof *a->x))) {
    free(a);
    return idem__fail(IDEM_ENOMEM, "execute_begin_async: out of memory");
  }
  a->store = store;
  a->begun = done;
  a->ctx = ctx;
  rc = begin_prepare(store, request, request_len, opts, &a->o, a->fp,
                     &a->canon, &a->x->budget);
  if (rc == IDEM_OK)
    rc = idem__claim_prepare(store, IDEM__OP_CLAIM, id, a->fp, &a->o.call,
                             NULL, NULL, &a->op);
  if (rc != IDEM_OK) {
    idem_free(a->canon);
    free(a->x);
    free(a);
    return rc;
  }
  /* The caller's id may go once this returns, and a claim that waits
   * replaces a->op.claim each time it asks: the id is a copy of its own. */
  if ((rc = copy_id(a->op.claim, &a->id, &a->id_buf)) != IDEM_OK) {
    idem__op_seal_free(&a->op);
    idem_call_free(a->op.claim);
    idem_free(a->canon);
    free(a->x);
    free(a);
    return rc;
  }
  a->op.id = &a->id;
  a->op.fingerprint = a->fp;
  a->asked = idem__mono_ms();
  if (a->o.call.wait_ms) {
    if (idem__runner_submit_wait(store, begin_waiting, a) != 0)
      begin_waiting(a);
    return IDEM_OK;
  }
  /* A replay (or a conflict) the store keeps in memory is answered here,
   * before the call returns, as a blocking claim answers it: no thread
   * of the store's is needed for it (the PostgreSQL store queues no
   * claim, and would run it on a runner thread). */
  if (store->methods->version >= 6 && store->methods->cached &&
      store->methods->cached(store->state, &a->op)) {
    begin_claimed(a, IDEM_OK);
    return IDEM_OK;
  }
  a->op.on_done = begin_queued;
  queue_op(a);
  return IDEM_OK;
}

static void end_answer(async_call *a, int rc) {
  free(a->x);
  if (rc == IDEM_OK)
    idem__clear_error();
  a->ended(a->ctx, rc);
  free(a);
}

/* What the queue could not end: the blocking path, on a runner thread. */
static void end_blocking(void *arg) {
  async_call *a = arg;
  int rc;
  if (a->bad) {
    end_answer(a, end_unkeepable(a->x, a->bad, a->op.errmsg));
    return;
  }
  rc = end_record(a->x, a->how, &a->x->call->response, a->x->budget);
  snprintf(a->op.errmsg, sizeof a->op.errmsg, "%s",
           rc == IDEM_OK ? "" : idem_errmsg());
  end_answer(a, end_report(a->x, a->how, rc, a->op.errmsg));
}

/* A completion's write failed for good: said on a runner thread, since
 * marking the key unknown waits. */
static void end_failed(void *arg) {
  async_call *a = arg;
  end_answer(a, end_report(a->x, a->how, a->failed, a->op.errmsg));
}

static void end_queued(idem__op *op) {
  async_call *a = op->on_done_ctx;
  int rc = op->rc;
  idem__finish_after(op, rc, &a->f);
  if (rc == IDEM_OK) {
    idem__lease_unhold(&a->x->lease, 1);
    end_answer(a, end_report(a->x, a->how, IDEM_OK, ""));
  } else if (rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE) {
    /* Retried with backoff, as idem_execute_end() does. */
    idem__lease_unhold(&a->x->lease, 0);
    on_runner(a, end_blocking);
  } else {
    idem__lease_unhold(&a->x->lease, 1);
    a->failed = rc;
    if (!op->errmsg[0])
      snprintf(op->errmsg, sizeof op->errmsg, "%s", idem_strerror(rc));
    on_runner(a, end_failed);
  }
}

int idem_execute_end_async(idem_exec *exec, idem_exec_result result,
                           const idem_response *response,
                           idem_end_done_fn done, void *ctx) {
  async_call *a;
  idem_response resp;

  idem__clear_error();
  if (!exec || !done)
    return idem__fail(IDEM_EINVAL, "execute_end_async: NULL action or done");
  if (idem__store_owned(exec->store, "execute_end_async") != IDEM_OK)
    return IDEM_EFORK;
  if (!(a = calloc(1, sizeof *a)))
    return idem__fail(IDEM_ENOMEM, "execute_end_async: out of memory");
  a->store = exec->store;
  a->x = exec;
  a->ended = done;
  a->ctx = ctx;
  a->how = end_how(result);
  memset(&resp, 0, sizeof resp);
  if (response && result == IDEM_EXEC_DONE)
    resp = *response;
  if (a->how == END_COMPLETE)
    a->bad = end_keep(exec, &resp, a->op.errmsg, sizeof a->op.errmsg);
  /* Only a completion that need not wait is queued: the rest (a response
   * that cannot be kept, a release, a renewal in progress, a lease taken
   * over) take the blocking path, which they rarely need. */
  if (a->how != END_COMPLETE || a->bad ||
      idem__lease_try_hold(&exec->lease) != 0) {
    on_runner(a, end_blocking);
    return IDEM_OK;
  }
  if (idem__finish_prepare(a->store, exec->call, IDEM__OP_COMPLETE,
                           &exec->call->response, 0, &a->op, &a->id,
                           &a->f) != IDEM_OK) {
    idem__lease_unhold(&exec->lease, 0);
    idem__clear_error();
    on_runner(a, end_blocking);
    return IDEM_OK;
  }
  a->op.on_done = end_queued;
  queue_op(a);
  return IDEM_OK;
}
