/*
 * mcp_keyed.c -- one keyed `tools/call`, from the claim to the answer.
 *
 * The call runs on a thread of its own, inside idem_execute(): the library
 * claims (tenant, tool name, key) for the fingerprint of {name, arguments}
 * (without the key), renews the lease while the call is out at the server,
 * and ends the record by what the action reports:
 *
 *   the server answered with a result     DONE: stored, then passed on
 *   (isError too: the tool ran)
 *   the server answered a JSON-RPC error  NOT_DONE: released (the tool
 *                                         never ran), the error passed on
 *   the server exited first, or the       ABANDON: the record stays in
 *   client cancelled the call             progress for one more lease
 *   the lease was lost, or the result is  UNKNOWN: marked unknown
 *   larger than --max-result
 *
 * The client reader waits until the call has been written to the server
 * (or answered by the proxy) before it reads on, so the order of the
 * client's messages is kept.
 *
 * A call left in progress is held for one lease from when it was left, the
 * time the tool could still be acting: a retry is told it is in flight.
 * Then, with --on-unknown forward, a retry takes it over (RECOVER) and is
 * sent to the server again with the same key; with --on-unknown fail it
 * waits for an operator (`idem keys resolve`). A key marked unknown (the
 * tool ran, but its result could not be kept) always waits for an
 * operator.
 */
#include "mcp.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* How the action ended. */
enum {
  WHY_NONE = 0,
  WHY_NOT_SENT,     /* the server was gone before the call was written */
  WHY_RESULT,       /* a result (stored) */
  WHY_SERVER_ERROR, /* a JSON-RPC error: released */
  WHY_TOO_BIG,      /* a result larger than --max-result */
  WHY_UNREADABLE,   /* an answer the proxy cannot read as JSON */
  WHY_GONE,         /* the server exited before answering */
  WHY_CANCELLED,    /* the client cancelled the call */
  WHY_LEASE_LOST    /* the key was taken over or not renewed in time */
};

typedef struct keyed {
  mcp_proxy *p;
  json_t *msg; /* the request (owned) */
  json_t *id;  /* its id (borrowed from msg) */
  char *line;  /* as the client wrote it */
  size_t len;
  char *key, *tool;
  char *request; /* {name, arguments} without the key */
  size_t request_len;
  int *handed; /* the client reader's flag; NULL once set */
  int ran;
  int why;
  mcp_pending pend;
  char *body; /* the stored result */
  size_t body_len;
  char fp[IDEM_FINGERPRINT_SIZE]; /* the request's fingerprint */
} keyed;

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Lets the client reader read on. */
static void hand_over(keyed *k) {
  mcp_proxy *p = k->p;
  pthread_mutex_lock(&p->lock);
  if (k->handed) {
    *k->handed = 1;
    k->handed = NULL;
    pthread_cond_broadcast(&p->cond);
  }
  pthread_mutex_unlock(&p->lock);
}

static void pending_remove(mcp_proxy *p, mcp_pending *pend) {
  for (mcp_pending **q = &p->pending; *q; q = &(*q)->next)
    if (*q == pend) {
      *q = pend->next;
      break;
    }
}

static int64_t lease_ms(const mcp_proxy *p) {
  return p->o->lease_ms > 0 ? p->o->lease_ms : 30000;
}

/* The action: forward the call and wait for what ends it. */
static idem_exec_result keyed_action(idem_exec *x, void *ctx,
                                     idem_response *response) {
  keyed *k = ctx;
  mcp_proxy *p = k->p;
  int lost = 0, state;
  int64_t cancelled_at = 0;
  k->ran = 1;
  if (idem_exec_outcome(x) == IDEM_RECOVER)
    cli_error("mcp",
              "key '%s' (tool %s): an earlier attempt ended without a "
              "result and may have acted; sending the call again "
              "(--on-unknown forward)",
              k->key, k->tool);
  k->pend.wake_fd = eventfd(0, EFD_CLOEXEC);
  pthread_mutex_lock(&p->lock);
  if (p->server_gone || p->closing || k->pend.wake_fd < 0) {
    pthread_mutex_unlock(&p->lock);
    k->why = WHY_NOT_SENT;
    return IDEM_EXEC_NOT_DONE;
  }
  k->pend.next = p->pending;
  p->pending = &k->pend;
  pthread_mutex_unlock(&p->lock);
  if (mcp_out_line(&p->to_server, k->line, k->len) != 0) {
    /* Nothing, or a part without its newline, reached the server: it
     * cannot have acted on it. */
    pthread_mutex_lock(&p->lock);
    pending_remove(p, &k->pend);
    pthread_mutex_unlock(&p->lock);
    k->why = WHY_NOT_SENT;
    return IDEM_EXEC_NOT_DONE;
  }
  hand_over(k);
  for (;;) {
    struct pollfd f[2] = {{k->pend.wake_fd, POLLIN, 0},
                          {idem_exec_lost_fd(x), POLLIN, 0}};
    int wait = -1, n;
    pthread_mutex_lock(&p->lock);
    if (k->pend.cancelled && !cancelled_at)
      cancelled_at = wall_ms();
    pthread_mutex_unlock(&p->lock);
    if (cancelled_at) {
      /* Cancelled: the server may still finish the call; its answer is
       * awaited for one lease, and recorded if it comes. */
      int64_t left = cancelled_at + lease_ms(p) - wall_ms();
      if (left <= 0)
        break;
      wait = left > 1000000 ? 1000000 : (int)left;
    }
    n = poll(f, f[1].fd >= 0 ? 2 : 1, wait);
    if (n < 0 && errno != EINTR)
      break;
    if (n > 0 && f[0].revents) {
      uint64_t v;
      if (read(k->pend.wake_fd, &v, sizeof v) < 0) {
        /* A counter: read again on the next wake-up. */
      }
    }
    pthread_mutex_lock(&p->lock);
    state = k->pend.state;
    pthread_mutex_unlock(&p->lock);
    if (state != PENDING_WAITING)
      break;
    if (idem_exec_lost(x) || (n > 0 && f[1].revents)) {
      lost = 1;
      break;
    }
  }
  pthread_mutex_lock(&p->lock);
  pending_remove(p, &k->pend);
  state = k->pend.state;
  pthread_mutex_unlock(&p->lock);
  if (state == PENDING_ANSWERED && !k->pend.response) {
    /* The tool answered, so it may have acted; what it answered cannot be
     * kept. */
    k->why = WHY_UNREADABLE;
    return IDEM_EXEC_UNKNOWN;
  }
  if (state == PENDING_ANSWERED) {
    json_t *result = json_object_get(k->pend.response, "result");
    if (!result) {
      k->why = WHY_SERVER_ERROR;
      return IDEM_EXEC_NOT_DONE;
    }
    k->body = json_dumps(result, JSON_COMPACT | JSON_ENCODE_ANY);
    k->body_len = k->body ? strlen(k->body) : 0;
    if (!k->body || k->body_len > p->o->max_result) {
      k->why = WHY_TOO_BIG;
      return IDEM_EXEC_UNKNOWN;
    }
    k->why = WHY_RESULT;
    response->status = json_is_true(json_object_get(result, "isError")) ? 1 : 0;
    response->body = k->body;
    response->body_len = k->body_len;
    return IDEM_EXEC_DONE;
  }
  if (lost) {
    k->why = WHY_LEASE_LOST;
    return IDEM_EXEC_UNKNOWN;
  }
  /* Cancelled and not answered within a lease (the tool may still be
   * acting), or the server gone (it may have acted): held in progress for
   * a lease, then taken over. */
  k->why = state == PENDING_WAITING ? WHY_CANCELLED : WHY_GONE;
  return IDEM_EXEC_LEAVE_IN_PROGRESS;
}

static json_t *error_data(const keyed *k, const char *what) {
  return json_pack("{s:s,s:s,s:s}", "idem", what, "key", k->key, "tool",
                   k->tool);
}

/* Answers with the stored result under this request's id, marked
 * _meta["idem/replayed"]. */
static void answer_replay(keyed *k, const idem_response *r) {
  json_error_t e;
  json_t *result =
      json_loadb(r->body, r->body_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
  json_t *m = NULL;
  if (json_is_object(result)) {
    json_t *meta = json_object_get(result, "_meta");
    if (!json_is_object(meta)) {
      meta = json_object();
      json_object_set_new(result, "_meta", meta);
    }
    json_object_set_new(meta, "idem/replayed", json_true());
  }
  if (result)
    m = json_pack("{s:s,s:O,s:O}", "jsonrpc", "2.0", "id", k->id, "result",
                  result);
  if (m)
    mcp_out_json(&k->p->to_client, m);
  else
    mcp_answer_error(k->p, k->id, MCP_E_INTERNAL,
                     "idem mcp: the stored result of this key cannot be "
                     "read back; nothing was sent to the server",
                     error_data(k, "internal"));
  json_decref(m);
  json_decref(result);
}

/* An unknown outcome. wait_ms > 0: the key is held that long, then a
 * retry is sent again (--on-unknown forward); otherwise it waits for an
 * operator. */
static void answer_unknown(keyed *k, int64_t wait_ms, const char *why) {
  char msg[2048];
  const mcp_opts *o = k->p->o;
  json_t *data = error_data(k, "unknown");
  if (wait_ms > 0) {
    snprintf(msg, sizeof msg,
             "idem mcp: %s (key \"%s\", tool %s), so the tool may or may "
             "not have acted. Check whether it acted if you can; a retry "
             "with the same key in %.1f s sends the call to the server "
             "again.",
             why, k->key, k->tool, (double)wait_ms / 1000);
    json_object_set_new(data, "retryAfterMs", json_integer(wait_ms));
  } else {
    snprintf(msg, sizeof msg,
             "idem mcp: %s (key \"%s\", tool %s), so the tool may or may "
             "not have acted. Nothing was sent to the server. This key is "
             "refused until an operator settles it: `idem keys resolve %s "
             "--operation %s%s%s --failed` if it did not act (a retry then "
             "acts), or --completed if it did.",
             why, k->key, k->tool, k->key, k->tool,
             *o->tenant ? " --tenant " : "", o->tenant);
  }
  mcp_answer_error(k->p, k->id, MCP_E_UNKNOWN, msg, data);
}

/* What the answer is once the action ran; rc is idem_execute()'s. */
static void finish_ran(keyed *k, int rc) {
  mcp_proxy *p = k->p;
  char detail[600];
  snprintf(detail, sizeof detail, "%s (%s)", idem_errmsg(), idem_rc_name(rc));
  switch (k->why) {
  case WHY_NOT_SENT:
    if (rc != IDEM_OK)
      cli_error("mcp", "key '%s' could not be freed: %s", k->key, detail);
    mcp_answer_error(p, k->id, MCP_E_SERVER_EXITED,
                     "idem mcp: the server has exited; this call was not "
                     "sent to it and did not act",
                     error_data(k, "server_exited"));
    break;
  case WHY_SERVER_ERROR:
    if (rc != IDEM_OK)
      cli_error("mcp",
                "key '%s' could not be freed after the server's "
                "error: %s",
                k->key, detail);
    mcp_out_line(&p->to_client, k->pend.line, k->pend.len);
    break;
  case WHY_RESULT:
    if (rc != IDEM_OK)
      cli_error("mcp",
                "key '%s' (tool %s): the result was passed on but not "
                "recorded: %s",
                k->key, k->tool, detail);
    else if (k->fp[0])
      mcp_cache_put(
          k->tool, k->key, k->fp, k->body, k->body_len,
          wall_ms() + (p->o->retention_ms > 0 ? p->o->retention_ms : 86400000));
    mcp_out_line(&p->to_client, k->pend.line, k->pend.len);
    break;
  case WHY_UNREADABLE:
    cli_error("mcp",
              "key '%s' (tool %s): the server's answer is not JSON the "
              "proxy can read (a lone surrogate, or a number past the "
              "double range): passed on, not stored; the key is %s",
              k->key, k->tool, rc == IDEM_OK ? "marked unknown" : detail);
    mcp_out_line(&p->to_client, k->pend.line, k->pend.len);
    break;
  case WHY_TOO_BIG:
    cli_error("mcp",
              "key '%s' (tool %s): the result of %zu bytes is larger than "
              "--max-result (%zu): passed on, not stored; the key is %s",
              k->key, k->tool, k->body_len, p->o->max_result,
              rc == IDEM_OK ? "marked unknown" : detail);
    mcp_out_line(&p->to_client, k->pend.line, k->pend.len);
    break;
  case WHY_GONE:
    cli_error("mcp",
              "key '%s' (tool %s): the server exited before answering; the "
              "key is %s",
              k->key, k->tool,
              rc == IDEM_OK ? "held in progress for one lease" : detail);
    if (p->o->on_unknown_fail)
      answer_unknown(k, 0, "the server exited before answering this call");
    else
      answer_unknown(k, lease_ms(p),
                     "the server exited before answering this call");
    break;
  case WHY_CANCELLED:
    cli_error("mcp",
              "key '%s' (tool %s): cancelled by the client before the "
              "server answered; the key is %s",
              k->key, k->tool,
              rc == IDEM_OK ? "held in progress for one lease" : detail);
    break;
  case WHY_LEASE_LOST:
  default:
    cli_error("mcp",
              "key '%s' (tool %s): the lease was lost while the server "
              "worked (taken over, or the store unreachable); its answer "
              "passes on unrecorded; the key is %s",
              k->key, k->tool, rc == IDEM_OK ? "marked unknown" : detail);
    break;
  }
}

static void keyed_run(keyed *k) {
  mcp_proxy *p = k->p;
  const mcp_opts *o = p->o;
  idem_id id = {o->tenant, k->tool, k->key};
  idem_execute_options eo;
  idem_call *call = NULL;
  int rc;
  memset(&eo, 0, sizeof eo);
  eo.call.lease_ms = o->lease_ms;
  eo.call.retention_ms = o->retention_ms;
  eo.call.on_expired_lease =
      o->on_unknown_fail ? IDEM_EXPIRED_REPORT : IDEM_EXPIRED_TAKE_OVER;
  rc = idem_execute(p->store, &id, k->request, k->request_len, keyed_action,
                    k, &eo, &call);
  if (!call) {
    char msg[1024];
    int busy = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE;
    snprintf(msg, sizeof msg,
             busy ? "idem mcp: the idempotency store is unavailable (%s); "
                    "nothing was sent to the server. Retry with the same "
                    "key in a few seconds."
                  : "idem mcp: this call cannot be given its key (%s); "
                    "nothing was sent to the server.",
             idem_errmsg());
    cli_error("mcp", "key '%s' (tool %s): %s", k->key, k->tool, idem_errmsg());
    mcp_answer_error(p, k->id, busy ? MCP_E_STORE : MCP_E_INTERNAL, msg,
                     error_data(k, busy ? "store_unavailable" : "internal"));
  } else if (k->ran) {
    finish_ran(k, rc);
  } else {
    char msg[1024];
    json_t *data;
    int64_t ms;
    switch (idem_call_outcome(call)) {
    case IDEM_REPLAY:
      answer_replay(k, idem_call_response(call));
      break;
    case IDEM_CONFLICT:
      snprintf(msg, sizeof msg,
               "idem mcp: key \"%s\" was already used with different "
               "arguments for tool %s; nothing was sent to the server. Use "
               "a new key for a new action; to retry the earlier action, "
               "send its arguments unchanged.",
               k->key, k->tool);
      mcp_answer_error(p, k->id, MCP_E_CONFLICT, msg,
                       error_data(k, "conflict"));
      break;
    case IDEM_IN_FLIGHT:
      ms = idem_call_retry_after_ms(call);
      snprintf(msg, sizeof msg,
               "idem mcp: the same call (key \"%s\", tool %s) is still "
               "running; nothing was sent to the server. Retry with the "
               "same key in %.1f s to get its result.",
               k->key, k->tool, (double)(ms < 100 ? 100 : ms) / 1000);
      data = error_data(k, "in_flight");
      json_object_set_new(data, "retryAfterMs", json_integer(ms));
      mcp_answer_error(p, k->id, MCP_E_IN_FLIGHT, msg, data);
      break;
    case IDEM_UNKNOWN:
    default:
      answer_unknown(k, 0,
                     "an earlier attempt of this call ended without a "
                     "result that could be kept (cancelled or the server "
                     "exited, with --on-unknown fail; or a result too "
                     "large to store, or a lost lease)");
      break;
    }
  }
  idem_call_free(call);
}

static void keyed_free(keyed *k) {
  if (k->pend.wake_fd >= 0)
    close(k->pend.wake_fd);
  json_decref(k->pend.response);
  free(k->pend.line);
  free(k->pend.id);
  free(k->body);
  free(k->request);
  free(k->key);
  free(k->tool);
  free(k->line);
  json_decref(k->msg);
  free(k);
}

static void *keyed_thread(void *arg) {
  keyed *k = arg;
  mcp_proxy *p = k->p;
  keyed_run(k);
  hand_over(k);
  keyed_free(k);
  pthread_mutex_lock(&p->lock);
  p->nkeyed--;
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

/*
 * A retry of a call whose result is stored is answered here, on the client
 * reader's thread, without a claim or a thread: from the proxy's cache of
 * results it stored or read (mcp_cache.c), else from a read of the record.
 * A completed record with the same fingerprint is what a claim would
 * replay; anything else (no record, another fingerprint, a record in
 * progress or unknown, a failed read) goes through idem_execute(). Returns
 * 1 when answered.
 */
static int answer_completed(keyed *k) {
  const mcp_opts *o = k->p->o;
  idem_id id = {o->tenant, k->tool, k->key};
  idem_record *rec = NULL;
  idem_response r;
  char *body;
  size_t len;
  int done = 0;
  if (idem_fingerprint(k->request, k->request_len, 1, k->fp) != IDEM_OK) {
    k->fp[0] = '\0';
    return 0;
  }
  if (mcp_cache_get(k->tool, k->key, k->fp, wall_ms(), &body, &len)) {
    memset(&r, 0, sizeof r);
    r.body = body;
    r.body_len = len;
    answer_replay(k, &r);
    free(body);
    return 1;
  }
  if (idem_get(k->p->store, &id, &rec) != IDEM_OK)
    return 0;
  if (rec->state == IDEM_STATE_COMPLETED && rec->has_response &&
      strcmp(rec->fingerprint, k->fp) == 0) {
    answer_replay(k, &rec->response);
    mcp_cache_put(k->tool, k->key, k->fp, rec->response.body,
                  rec->response.body_len, rec->expires_ms);
    done = 1;
  }
  idem_record_free(rec);
  return done;
}

void mcp_keyed_call(mcp_proxy *p, json_t *msg, const char *line, size_t len,
                    const char *key, const char *tool, int key_in_argument) {
  json_t *id = json_object_get(msg, "id");
  keyed *k;
  int handed = 0, dup = 0;
  pthread_attr_t attr;
  pthread_t t;
  if (idem_key_check(key) != IDEM_OK) {
    char m[600];
    snprintf(m, sizeof m,
             "idem mcp: the idempotency key is not valid (%s): use 1-255 "
             "printable ASCII characters (0x21-0x7e). Nothing was sent to "
             "the server.",
             idem_errmsg());
    mcp_answer_error(p, id, MCP_E_BAD_KEY, m,
                     json_pack("{s:s}", "idem", "bad_key"));
    return;
  }
  k = calloc(1, sizeof *k);
  if (!k)
    goto oom;
  k->p = p;
  k->msg = json_incref(msg);
  k->id = id;
  k->pend.wake_fd = -1;
  k->line = malloc(len + 1);
  k->key = strdup(key);
  k->tool = strdup(tool);
  k->pend.id = mcp_id_text(id);
  k->request = mcp_request_text(line, len, tool,
                               key_in_argument ? p->o->key_argument : NULL,
                               &k->request_len);
  if (!k->line || !k->key || !k->tool || !k->request) {
    keyed_free(k);
    goto oom;
  }
  if (!k->pend.id) {
    keyed_free(k);
    mcp_answer_error(p, id, -32600,
                     "idem mcp: a request id must be a string or a number",
                     NULL);
    return;
  }
  memcpy(k->line, line, len);
  k->line[len] = '\0';
  k->len = len;
  pthread_mutex_lock(&p->lock);
  for (mcp_pending *q = p->pending; q; q = q->next)
    if (strcmp(q->id, k->pend.id) == 0)
      dup = 1;
  if (p->closing || p->server_gone || dup) {
    pthread_mutex_unlock(&p->lock);
    if (dup)
      mcp_answer_error(p, id, -32600,
                       "idem mcp: this request id is already used by a call "
                       "in progress; use a new id",
                       NULL);
    else
      mcp_answer_error(p, id, MCP_E_SERVER_EXITED,
                       "idem mcp: the server has exited; this call was not "
                       "sent to it and did not act",
                       error_data(k, "server_exited"));
    keyed_free(k);
    return;
  }
  p->nkeyed++; /* the store stays open until this call is settled */
  pthread_mutex_unlock(&p->lock);
  if (answer_completed(k)) {
    keyed_free(k);
    pthread_mutex_lock(&p->lock);
    p->nkeyed--;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return;
  }
  pthread_mutex_lock(&p->lock);
  k->handed = &handed;
  pthread_mutex_unlock(&p->lock);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, keyed_thread, k) != 0) {
    pthread_attr_destroy(&attr);
    pthread_mutex_lock(&p->lock);
    p->nkeyed--;
    pthread_mutex_unlock(&p->lock);
    keyed_free(k);
    goto oom;
  }
  pthread_attr_destroy(&attr);
  pthread_mutex_lock(&p->lock);
  while (!handed)
    pthread_cond_wait(&p->cond, &p->lock);
  pthread_mutex_unlock(&p->lock);
  return;
oom:
  mcp_answer_error(p, id, MCP_E_INTERNAL,
                   "idem mcp: out of memory or threads; nothing was sent to "
                   "the server. Retry with the same key.",
                   NULL);
}
