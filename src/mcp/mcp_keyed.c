/*
 * mcp_keyed.c -- keyed `tools/call`s, from the claim to the answer.
 *
 * A keyed call is claimed for (tenant, tool name, key) and the fingerprint
 * of {name, arguments} without the key. The client reader never waits on
 * the store: it answers a retry whose result is kept in memory, attaches a
 * retry of a call in flight here to that call, and queues everything else
 * for the store workers. A worker claims (idem_execute_begin()); on
 * PROCEED or RECOVER it sends the call to the server under an id the proxy
 * owns, so that no other message's answer can be taken for it, and leaves
 * it there: the store's scheduler renews the lease for as long as the
 * server works, and no thread waits. The server's answer is queued for a
 * worker, which ends the record (idem_execute_end()) and only then
 * answers:
 *
 *   a result (isError too, unless       DONE: stored, then passed on
 *   --store-tool-errors no)
 *   a JSON-RPC error, or isError with   NOT_DONE: released (the key is free
 *   --store-tool-errors no              for a corrected call), passed on
 *   a result larger than --max-result,  UNKNOWN: the tool ran, its result
 *   or an answer that is not JSON       cannot be kept; passed on
 *   the server exited first             LEAVE_IN_PROGRESS: held one more
 *                                       lease, then a retry takes it over
 *                                       (forward) or waits for an operator
 *
 * A client that cancels a keyed call (the SDKs do at their request
 * timeout) does not cancel it at the server: the cancellation is not
 * passed on, the call goes on, and its answer is recorded, so a retry gets
 * it instead of acting again. Only the server's death, or an operator,
 * leaves an outcome unknown.
 *
 * A retry that finds its key in flight waits up to --attach-wait for the
 * result: at once when the holder is this proxy (it is answered with the
 * holder's answer), by asking the store again otherwise (idem_claim()'s
 * wait, in slices, so that a few workers serve any number of waiting
 * retries). A result stored after a takeover (RECOVER: an earlier attempt
 * may have acted) is marked _meta["idem/recovered"], in its first answer
 * and in every replay.
 */
#include "mcp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Store workers: claims and endings are a few durable commits each; more
 * workers than this only queue on the store's writer. */
#define MCP_WORKERS 4
/* A retry waiting on another holder asks the store again at least this
 * often, so that a few workers serve every waiting retry in turn. */
#define WAIT_SLICE_MS 200

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t lease_ms(const mcp_proxy *p) {
  return p->o->lease_ms > 0 ? p->o->lease_ms : 30000;
}

/* How long key's result is kept: --implicit-keys' window for a key the
 * proxy made, else --retention. */
static int64_t retention_ms(const mcp_proxy *p, const char *key) {
  if (mcp_is_implicit(key))
    return p->o->implicit_ms;
  return p->o->retention_ms > 0 ? p->o->retention_ms : 86400000;
}

/* ---- answers ------------------------------------------------------------ */

static json_t *error_data(const mcp_call *c, const char *what,
                          const char *type) {
  return mcp_error_data(c->key, c->tool, what, type);
}

static void out_text(mcp_proxy *p, const char *text, size_t len) {
  if (text)
    mcp_out_line(&p->to_client, text, len);
}

/* The stored result body answered as a replay under id; under an implicit
 * key, with a note for the model. */
static void answer_replay(mcp_proxy *p, const char *id, int implicit,
                          const char *body, size_t len, int recovered) {
  size_t n;
  char note[600];
  if (implicit)
    mcp_implicit_note(note, sizeof note, p->o->implicit_ms,
                      p->o->offer_key_argument);
  char *line =
      mcp_replay_text(id, body, len, recovered, implicit ? note : NULL, &n);
  if (line)
    out_text(p, line, n);
  else
    mcp_answer_error_text(p, id, MCP_E_INTERNAL,
                          "idem mcp: out of memory replaying the stored "
                          "result; nothing was sent to the server. Retry "
                          "with the same key.",
                          json_pack("{s:s}", "idem", "internal"));
  free(line);
}

/* The server's answer line, passed on under id (and with its result marked
 * recovered when it was obtained after a takeover). */
static void answer_line_as(mcp_proxy *p, const char *line, size_t n,
                           const char *id, int recovered) {
  size_t idf, idt, rf, rt, len;
  char *a = NULL, *b = NULL;
  if (!mcp_member(line, n, 0, "id", &idf, &idt)) {
    out_text(p, line, n);
    return;
  }
  if (recovered && mcp_member(line, n, 0, "result", &rf, &rt)) {
    size_t mlen;
    char *marked = mcp_mark_result(line + rf, rt - rf, 0, 1, &mlen);
    if (marked) {
      /* The result follows the id or precedes it: splice the later span
       * first so that the earlier one's offsets hold. */
      if (rf > idf) {
        a = mcp_splice(line, n, rf, rt, marked, mlen, &len);
        b = a ? mcp_splice(a, len, idf, idt, id, strlen(id), &len) : NULL;
      } else {
        a = mcp_splice(line, n, idf, idt, id, strlen(id), &len);
        b = a ? mcp_splice(a, len, rf, rt, marked, mlen, &len) : NULL;
      }
      free(marked);
      free(a);
      if (b) {
        out_text(p, b, len);
        free(b);
        return;
      }
    }
  }
  b = mcp_splice(line, n, idf, idt, id, strlen(id), &len);
  if (b)
    out_text(p, b, len);
  else
    /* Never silence: a client left without an answer waits for ever. */
    mcp_answer_error_text(p, id, MCP_E_INTERNAL,
                          "idem mcp: out of memory passing on the server's "
                          "answer to this call; retry with the same key (a "
                          "result that was kept is replayed).",
                          json_pack("{s:s}", "idem", "internal"));
  free(b);
}

static void answer_as_server(mcp_proxy *p, const mcp_call *c, const char *id,
                             int recovered) {
  answer_line_as(p, c->answer, c->answer_len, id, recovered);
}

/* Where the call's outcome is unknown. wait_ms > 0: the key is held that
 * long, then a retry is sent again (--on-unknown forward); otherwise it
 * waits for an operator. sent: the call reached the server. */
static void answer_unknown(mcp_proxy *p, const mcp_call *c, const char *id,
                           int64_t wait_ms, const char *why, int sent) {
  char msg[2048];
  const mcp_opts *o = p->o;
  json_t *data = error_data(c, "unknown", "idempotency_outcome_unknown");
  if (wait_ms > 0) {
    snprintf(msg, sizeof msg,
             "idem mcp: %s (key \"%s\", tool %s), so the tool may or may "
             "not have acted. Check whether it acted if you can; a retry "
             "with the same key in %.1f s sends the call to the server "
             "again, and its result is marked _meta[\"idem/recovered\"].",
             why, c->key, c->tool, (double)wait_ms / 1000);
    json_object_set_new(data, "retryAfterMs", json_integer(wait_ms));
  } else {
    snprintf(msg, sizeof msg,
             "idem mcp: %s (key \"%s\", tool %s), so the tool may or may "
             "not have acted.%s This key is refused until an operator "
             "settles it: `idem keys resolve %s --operation %s%s%s "
             "--failed` if it did not act (a retry then acts), or "
             "--completed if it did.",
             why, c->key, c->tool,
             sent ? "" : " Nothing was sent to the server for this request.",
             c->key, c->tool, *o->tenant ? " --tenant " : "", o->tenant);
  }
  mcp_answer_error_text(p, id, MCP_E_UNKNOWN, msg, data);
}

/* A retry of a call this proxy has at the server, past --attach-wait. */
static void answer_in_flight_here(mcp_proxy *p, const mcp_call *c,
                                  const char *id) {
  char msg[1024];
  json_t *data = error_data(c, "in_flight", "idempotency_key_in_progress");
  snprintf(msg, sizeof msg,
           "idem mcp: the same call (key \"%s\", tool %s) is still running "
           "at the server; this retry waited %.1f s and nothing more was "
           "sent. Retry with the same key to get its result when it "
           "finishes.",
           c->key, c->tool, (double)p->o->attach_wait_ms / 1000);
  json_object_set_new(data, "retryAfterMs", json_integer(1000));
  mcp_answer_error_text(p, id, MCP_E_IN_FLIGHT, msg, data);
}

/* A retry of a call whose key another holder has (another proxy on the
 * store, or one that died with the call at the server). */
static void answer_in_flight_elsewhere(mcp_proxy *p, const mcp_call *c,
                                       const char *id, int64_t ms) {
  char msg[1600];
  json_t *data = error_data(c, "in_flight", "idempotency_key_in_progress");
  if (ms < 1)
    ms = 1;
  snprintf(msg, sizeof msg,
           "idem mcp: another attempt of this call (key \"%s\", tool %s) "
           "holds the key: another proxy or process on the same store, or "
           "one that stopped while the call was at the server. Nothing was "
           "sent to the server. Its lease ends in %.1f s: retry with the "
           "same key then. If that attempt finished, the retry gets its "
           "result; if its holder is gone, %s",
           c->key, c->tool, (double)ms / 1000,
           p->o->on_unknown_fail
               ? "the tool may have acted, and the key waits for an "
                 "operator (`idem keys resolve`)."
               : "the retry sends the call to the server again, and its "
                 "result is marked _meta[\"idem/recovered\"] (the tool may "
                 "have acted twice).");
  json_object_set_new(data, "retryAfterMs", json_integer(ms));
  mcp_answer_error_text(p, id, MCP_E_IN_FLIGHT, msg, data);
}

static void answer_server_exited(mcp_proxy *p, const mcp_call *c,
                                 const char *id) {
  mcp_answer_error_text(p, id, MCP_E_SERVER_EXITED,
                        "idem mcp: the server has exited; this call was not "
                        "sent to it and did not act",
                        error_data(c, "server_exited", NULL));
}

/* ---- calls and their waiters ------------------------------------------- */

static void waiter_free(mcp_waiter *w) {
  if (w) {
    free(w->id);
    free(w->match);
    free(w);
  }
}

static mcp_waiter *waiter_new(const char *line, size_t from, size_t to,
                              json_t *id, int attached, int64_t deadline) {
  mcp_waiter *w = calloc(1, sizeof *w);
  if (!w)
    return NULL;
  w->id = malloc(to - from + 1);
  w->match = mcp_id_text(id);
  if (!w->id || !w->match) {
    waiter_free(w);
    return NULL;
  }
  memcpy(w->id, line + from, to - from);
  w->id[to - from] = '\0';
  w->attached = attached;
  w->deadline = deadline;
  return w;
}

static void waiters_free(mcp_waiter *ws) {
  while (ws) {
    mcp_waiter *next = ws->next;
    waiter_free(ws);
    ws = next;
  }
}

static void call_free(mcp_call *c) {
  if (!c)
    return;
  waiters_free(c->waiters);
  idem_call_free(c->call);
  free(c->tool);
  free(c->key);
  free(c->request);
  free(c->line);
  free(c->answer);
  free(c);
}

/* Queues c for a worker without waking one: the caller holds p->lock and
 * signals p->work once it has released it, so that the worker woken does
 * not find the lock still held and sleep on it again (two futex calls and a
 * wake-up more per hand-over, on the path of every keyed call). */
static void enqueue_quiet(mcp_proxy *p, mcp_call *c) {
  c->qnext = NULL;
  if (p->qtail)
    p->qtail->qnext = c;
  else
    p->qhead = c;
  p->qtail = c;
}

/* Called with p->lock held. */
static void enqueue(mcp_proxy *p, mcp_call *c) {
  enqueue_quiet(p, c);
  pthread_cond_signal(&p->work);
}

/* Removes c from the calls being handled and returns its waiters; c is
 * the caller's to free, and call_answered() is the caller's to call once
 * the waiters are answered. */
static mcp_waiter *call_finish(mcp_proxy *p, mcp_call *c) {
  mcp_waiter *ws;
  pthread_mutex_lock(&p->lock);
  for (mcp_call **q = &p->calls; *q; q = &(*q)->next)
    if (*q == c) {
      *q = c->next;
      break;
    }
  ws = c->waiters;
  c->waiters = NULL;
  pthread_mutex_unlock(&p->lock);
  return ws;
}

/* The waiters of a finished call are answered: one call fewer for the main
 * thread, which ends the process when none is left, to wait for. Counted
 * only now, so that no answer is still being written when it ends. */
static void call_answered(mcp_proxy *p, mcp_waiter *ws) {
  int wake;
  waiters_free(ws);
  pthread_mutex_lock(&p->lock);
  p->ncalls--;
  wake = p->draining; /* the main loop counts the calls left */
  pthread_cond_broadcast(&p->cond);
  pthread_mutex_unlock(&p->lock);
  if (wake)
    mcp_notify(p);
}

/* ---- task handles ---------------------------------------------------------
 *
 * A keyed call that asks for a task (MCP 2025-11-25's params.task, or the
 * tasks extension of 2026-07-28) acts by creating the task: its result is
 * the task's handle, kept and replayed like any result, so that a retry
 * gets the same task and no second one is made. Over stdio a task lives in
 * the server process that made it, for its ttl. A handle that names a task
 * this proxy's server did not make (the proxy and its server were
 * restarted) or whose ttl has passed is stale: the task may have acted,
 * partly or wholly, and nobody can ask it now. Such a replay is settled as
 * an unknown outcome: with --on-unknown forward the call is sent again and
 * its result marked recovered; with fail the key waits for an operator.
 */

enum { REPLAY_OK, REPLAY_NO_TASK, REPLAY_STALE };

/* Whether the stored result body can be replayed to a call that asks
 * (asks_task) or does not ask for a task. */
static int replay_verdict(mcp_proxy *p, int asks_task, const char *body,
                          size_t len) {
  char *task;
  int64_t ttl;
  int v = REPLAY_OK;
  if (!mcp_task_handle(body, len, &task, &ttl))
    return REPLAY_OK;
  if (!asks_task) {
    v = REPLAY_NO_TASK;
  } else {
    json_t *e;
    pthread_mutex_lock(&p->lock);
    e = json_object_get(p->tasks, task);
    if (!e || (json_integer_value(e) && json_integer_value(e) <= mono_ms()))
      v = REPLAY_STALE;
    pthread_mutex_unlock(&p->lock);
  }
  free(task);
  return v;
}

/* ---- lines seen before ------------------------------------------------------
 *
 * A client that retries sends its line again, most often under a new id.
 * Once a keyed call was answered from memory (or its result recorded), the
 * text of its line apart from the id's value is kept, with the tool, key
 * and fingerprint the line was read as. A later line that is that text with
 * a plain number or string as its id is the same call: it is valid JSON
 * (one scalar replaced by another in a line jansson read, with no member
 * named twice), its method, params, key, tool and arguments are the same,
 * and the whole way would answer it from memory as before. So it is, without
 * being read again (mcp_parse(), the request text and the fingerprint are
 * most of a replay's own time). Where it lands is checked byte for byte, so
 * however the id's place was found, only such a line is taken. What the
 * proxy's memory no longer holds, a task handle (replay_verdict()) and any
 * other line go the whole way.
 */

#define SEEN_MAX 256       /* lines kept, the oldest replaced first */
#define SEEN_LINE_MAX 4096 /* longer lines are not kept */
#define SEEN_ID_MAX 128    /* longer ids go the whole way */

typedef struct seen_line {
  char *text;     /* the line without its id's value */
  size_t len, at; /* where the id's value was */
  uint64_t hash;
  char *tool, *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  int asks_task;
} seen_line;

static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;
static seen_line seen[SEEN_MAX];
static size_t seen_next;

/* FNV-1a of line without [from, to). */
static uint64_t seen_hash(const char *line, size_t len, size_t from,
                          size_t to) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < len; i++) {
    if (i == from)
      i = to;
    if (i >= len)
      break;
    h = (h ^ (unsigned char)line[i]) * 1099511628211ULL;
  }
  return h;
}

/* The entry of line with its id at [from, to), or NULL. Under seen_mu. */
static seen_line *seen_find(const char *line, size_t len, size_t from,
                            size_t to, uint64_t h) {
  size_t rest = len - (to - from);
  for (size_t i = 0; i < SEEN_MAX; i++) {
    seen_line *e = &seen[i];
    if (e->text && e->hash == h && e->len == rest &&
        mcp_same_but_id(e->text, e->len, e->at, line, len, from, to))
      return e;
  }
  return NULL;
}

/* Keeps line (read whole, its id's value at [from, to)) as the call of
 * tool, key and fp. */
static void seen_put(const char *line, size_t len, size_t from, size_t to,
                     const char *tool, const char *key, const char *fp,
                     int asks_task) {
  seen_line fresh, old;
  uint64_t h;
  if (!line || to < from || to > len || len - (to - from) > SEEN_LINE_MAX)
    return;
  memset(&fresh, 0, sizeof fresh);
  fresh.len = len - (to - from);
  fresh.at = from;
  fresh.text = malloc(fresh.len + 1);
  fresh.tool = strdup(tool);
  fresh.key = strdup(key);
  if (!fresh.text || !fresh.tool || !fresh.key) {
    free(fresh.text);
    free(fresh.tool);
    free(fresh.key);
    return;
  }
  memcpy(fresh.text, line, from);
  memcpy(fresh.text + from, line + to, len - to);
  memcpy(fresh.fp, fp, IDEM_FINGERPRINT_SIZE);
  fresh.asks_task = asks_task;
  h = fresh.hash = seen_hash(line, len, from, to);
  pthread_mutex_lock(&seen_mu);
  seen_line *e = seen_find(line, len, from, to, h);
  if (!e) {
    e = &seen[seen_next];
    seen_next = (seen_next + 1) % SEEN_MAX;
  }
  old = *e;
  *e = fresh;
  pthread_mutex_unlock(&seen_mu);
  free(old.text);
  free(old.tool);
  free(old.key);
}

int mcp_keyed_replay_seen(mcp_proxy *p, const char *line, size_t len) {
  size_t from, to;
  char id[SEEN_ID_MAX + 1], *body = NULL;
  size_t blen;
  int recovered, found = 0, asks_task = 0, implicit = 0;
  seen_line *e;
  if (len > SEEN_LINE_MAX + SEEN_ID_MAX ||
      !mcp_member(line, len, 0, "id", &from, &to) || to - from > SEEN_ID_MAX ||
      !mcp_plain_id(line + from, to - from))
    return 0;
  pthread_mutex_lock(&seen_mu);
  e = seen_find(line, len, from, to, seen_hash(line, len, from, to));
  if (e) {
    asks_task = e->asks_task;
    implicit = mcp_is_implicit(e->key);
    found = mcp_cache_get(e->tool, e->key, e->fp, wall_ms(), &body, &blen,
                          &recovered);
  }
  pthread_mutex_unlock(&seen_mu);
  if (!found)
    return 0;
  if (replay_verdict(p, asks_task, body, blen) != REPLAY_OK) {
    free(body);
    return 0;
  }
  memcpy(id, line + from, to - from);
  id[to - from] = '\0';
  answer_replay(p, id, implicit, body, blen, recovered);
  free(body);
  return 1;
}

/* A task handle a keyed call's result names: made by this server. */
static void task_made(mcp_proxy *p, const char *body, size_t len) {
  char *task;
  int64_t ttl;
  if (!mcp_task_handle(body, len, &task, &ttl))
    return;
  pthread_mutex_lock(&p->lock);
  json_object_set_new(p->tasks, task, json_integer(ttl ? mono_ms() + ttl : 0));
  pthread_mutex_unlock(&p->lock);
  free(task);
}

static void answer_no_task(mcp_proxy *p, const char *key, const char *tool,
                           const char *id) {
  char msg[1024];
  mcp_no_task_message(msg, sizeof msg, key, tool);
  mcp_answer_error_text(p, id, -32602, msg,
                        mcp_error_data(key, tool, "task_expected", NULL));
}

static void answer_stale_task(mcp_proxy *p, const mcp_call *c, const char *id) {
  char msg[2048]; /* the key and the tool twice, the tenant: 255 bytes each */
  mcp_stale_task_message(msg, sizeof msg, c->key, c->tool, p->o->tenant,
                         "the server was restarted, or the task's ttl has "
                         "passed");
  mcp_answer_error_text(
      p, id, MCP_E_UNKNOWN, msg,
      error_data(c, "unknown", "idempotency_outcome_unknown"));
}

/* --on-unknown forward, a stale handle replayed: the record that holds it
 * goes (if it still is that record) and the claim is asked again. */
static void retry_stale(mcp_proxy *p, mcp_call *c, const idem_response *r) {
  const mcp_opts *o = p->o;
  idem_id id = {o->tenant, c->tool, c->key};
  idem_record *rec = NULL;
  if (idem_get(p->store, &id, &rec) == IDEM_OK &&
      rec->state == IDEM_STATE_COMPLETED && rec->has_response &&
      strcmp(rec->fingerprint, c->fp) == 0 &&
      rec->response.body_len == r->body_len &&
      memcmp(rec->response.body, r->body, r->body_len) == 0 &&
      idem_delete(p->store, &id) == IDEM_OK)
    cli_error("mcp",
              "key '%s' (tool %s): its task is not held by the server "
              "running now and may have acted; sending the call again "
              "(--on-unknown forward); its result will be marked recovered",
              c->key, c->tool);
  idem_record_free(rec);
  c->stale_retry = 1;
  c->rounds = 0;
  pthread_mutex_lock(&p->lock);
  enqueue(p, c);
  pthread_mutex_unlock(&p->lock);
}

/* ---- the workers --------------------------------------------------------- */

static void claim_failed(mcp_proxy *p, mcp_call *c, int rc) {
  char msg[1200]; /* libidem's detail is at most 1023 bytes */
  int busy = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE;
  mcp_waiter *ws;
  snprintf(msg, sizeof msg,
           busy ? "idem mcp: the idempotency store is unavailable (%s); "
                  "nothing was sent to the server. Retry with the same "
                  "key in a few seconds."
                : "idem mcp: this call cannot be given its key (%s); "
                  "nothing was sent to the server.",
           idem_errmsg());
  cli_error("mcp", "key '%s' (tool %s): %s", c->key, c->tool, idem_errmsg());
  ws = call_finish(p, c);
  for (mcp_waiter *w = ws; w; w = w->next)
    mcp_answer_error_text(
        p, w->id, busy ? MCP_E_STORE : MCP_E_INTERNAL, msg,
        error_data(c, busy ? "store_unavailable" : "internal", NULL));
  call_answered(p, ws);
  call_free(c);
}

/* The call to the server: the client's line under the proxy's own id. */
static int send_call(mcp_proxy *p, mcp_call *c) {
  size_t len;
  char *line = mcp_splice(c->line, c->len, c->id_from, c->id_to, c->sid,
                          strlen(c->sid), &len);
  int rc = line ? mcp_out_line(&p->to_server, line, len) : -1;
  free(line);
  return rc;
}

/*
 * Writes c to the server; the caller set c->state to CALL_SERVER and
 * c->sending under the lock and released it (a server blocked on its own
 * output waits for the server reader, which needs the lock). An answer, or
 * the server's end, that comes meanwhile leaves c to this thread, which
 * queues it once the write is done.
 */
static void send_and_settle(mcp_proxy *p, mcp_call *c) {
  int rc = send_call(p, c);
  pthread_mutex_lock(&p->lock);
  c->sending = 0;
  if (rc != 0) {
    /* Nothing, or a part without its newline, reached the server: it
     * cannot have acted on it. */
    c->not_sent = 1;
    if (c->state == CALL_SERVER) {
      c->state = CALL_END;
      enqueue(p, c);
    }
  }
  if (c->deferred) {
    c->deferred = 0;
    enqueue(p, c);
  }
  pthread_mutex_unlock(&p->lock);
}

/* c goes to the server now under a new id of the proxy's; the caller
 * holds p->lock and calls send_and_settle() once it has released it. */
static void to_server_state(mcp_proxy *p, mcp_call *c) {
  snprintf(c->sid, sizeof c->sid, "\"idem-%s-%llu\"", p->nonce, ++p->next_sid);
  c->state = CALL_SERVER;
  c->sending = 1;
}

/* Queues an ended call for a worker, or leaves it to the thread that is
 * still writing it, without waking a worker: 1 when the caller must signal
 * p->work once it has released p->lock (see enqueue_quiet()). Called with
 * p->lock held. */
static int end_queue_quiet(mcp_proxy *p, mcp_call *c) {
  c->state = CALL_END;
  if (c->sending) {
    c->deferred = 1;
    return 0;
  }
  enqueue_quiet(p, c);
  return 1;
}

/* end_queue_quiet() and the signal, under p->lock. */
static void end_queue(mcp_proxy *p, mcp_call *c) {
  if (end_queue_quiet(p, c))
    pthread_cond_signal(&p->work);
}

static void do_end(mcp_proxy *p, mcp_call *c);

/* The claim answered PROCEED or RECOVER: off to the server. */
static void forward(mcp_proxy *p, mcp_call *c) {
  if (idem_call_outcome(c->call) == IDEM_RECOVER)
    cli_error("mcp",
              "key '%s' (tool %s): an earlier attempt ended without a "
              "result and may have acted; sending the call again "
              "(--on-unknown forward); its result will be marked "
              "recovered",
              c->key, c->tool);
  pthread_mutex_lock(&p->lock);
  if (!p->server_gone && !p->closing) {
    to_server_state(p, c);
    pthread_mutex_unlock(&p->lock);
    send_and_settle(p, c);
    return;
  }
  c->state = CALL_END;
  c->not_sent = 1;
  pthread_mutex_unlock(&p->lock);
  do_end(p, c);
}

static void do_claim(mcp_proxy *p, mcp_call *c) {
  const mcp_opts *o = p->o;
  idem_id id = {o->tenant, c->tool, c->key};
  idem_execute_options eo;
  idem_call *call = NULL;
  idem_exec *x = NULL;
  mcp_waiter *ws;
  int rc;
  int64_t now = mono_ms();
  memset(&eo, 0, sizeof eo);
  eo.call.lease_ms = o->lease_ms;
  eo.call.retention_ms = mcp_is_implicit(c->key) ? o->implicit_ms
                                                 : o->retention_ms;
  eo.call.on_expired_lease =
      o->on_unknown_fail ? IDEM_EXPIRED_REPORT : IDEM_EXPIRED_TAKE_OVER;
  eo.forget_request = !o->keep_requests; /* the arguments stay off disk */
  eo.fingerprint = c->fp; /* taken once, when the line came in */
  if (c->rounds++ > 0 && c->wait_until > now)
    eo.call.wait_ms = c->wait_until - now < WAIT_SLICE_MS ? c->wait_until - now
                                                          : WAIT_SLICE_MS;
  rc = idem_execute_begin(p->store, &id, c->request, c->request_len, &eo, &x,
                          &call);
  if (rc != IDEM_OK || !call) {
    claim_failed(p, c, rc);
    return;
  }
  idem_call_free(c->call);
  c->call = call;
  c->exec = x;
  if (x) {
    forward(p, c);
    return;
  }
  switch (idem_call_outcome(call)) {
  case IDEM_IN_FLIGHT:
    pthread_mutex_lock(&p->lock);
    if (c->waiters && mono_ms() < c->wait_until && !p->closing) {
      /* Asked again in turn with the other waiting retries. */
      enqueue(p, c);
      pthread_mutex_unlock(&p->lock);
      return;
    }
    pthread_mutex_unlock(&p->lock);
    ws = call_finish(p, c);
    for (mcp_waiter *w = ws; w; w = w->next)
      answer_in_flight_elsewhere(p, c, w->id, idem_call_retry_after_ms(call));
    break;
  case IDEM_REPLAY: {
    const idem_response *r = idem_call_response(call);
    int recovered = idem_call_recovered(call);
    int v = replay_verdict(p, c->asks_task, r->body, r->body_len);
    if (v == REPLAY_STALE && !o->on_unknown_fail && !c->stale_retry) {
      retry_stale(p, c, r);
      return;
    }
    if (v == REPLAY_OK)
      mcp_cache_put(c->tool, c->key, c->fp, r->body, r->body_len, recovered,
                    wall_ms() + retention_ms(p, c->key));
    ws = call_finish(p, c);
    for (mcp_waiter *w = ws; w; w = w->next)
      if (v == REPLAY_NO_TASK)
        answer_no_task(p, c->key, c->tool, w->id);
      else if (v == REPLAY_STALE)
        answer_stale_task(p, c, w->id);
      else
        answer_replay(p, w->id, mcp_is_implicit(c->key), r->body,
                      r->body_len, recovered);
    break;
  }
  case IDEM_CONFLICT: {
    char msg[1024];
    snprintf(msg, sizeof msg,
             "idem mcp: key \"%s\" was already used with different "
             "arguments for tool %s; nothing was sent to the server. Use "
             "a new key for a new action; to retry the earlier action, "
             "send its arguments unchanged.",
             c->key, c->tool);
    ws = call_finish(p, c);
    for (mcp_waiter *w = ws; w; w = w->next)
      mcp_answer_error_text(
          p, w->id, MCP_E_CONFLICT, msg,
          error_data(c, "conflict", "idempotency_key_conflict"));
    break;
  }
  case IDEM_UNKNOWN:
  default:
    ws = call_finish(p, c);
    for (mcp_waiter *w = ws; w; w = w->next)
      answer_unknown(p, c, w->id, 0,
                     "an earlier attempt of this call ended without a "
                     "result that could be kept (the server exited or its "
                     "holder stopped, with --on-unknown fail; a result "
                     "too large to store; a lost lease; or a cancellation "
                     "the server did not confirm, with --keyed-cancel pass)",
                     1);
    break;
  }
  call_answered(p, ws);
  call_free(c);
}

/* How a call at the server ends. */
enum {
  WHY_RESULT,
  WHY_TOOL_ERROR, /* isError with --store-tool-errors no: released */
  WHY_SERVER_ERROR,
  WHY_TOO_BIG,
  WHY_UNREADABLE,
  WHY_GONE,       /* the server exited without answering */
  WHY_CANCELLED,  /* cancelled at the server, which neither confirmed nor
                     answered within --cancel-wait */
  WHY_NOT_SENT,   /* the call never reached the server whole */
  WHY_INPUT_LEFT, /* it asked for input and no next round came */
  WHY_INPUT       /* it asked for input: not an ending */
};

/* What c's ending is, and for a result, where it is in c->answer and
 * whether it is a tool error. */
static int ending_of(const mcp_proxy *p, const mcp_call *c, size_t *rf,
                     size_t *rt, int *is_error) {
  int dup, why;
  json_t *msg, *result;
  const char *rtype;
  if (c->not_sent)
    return WHY_NOT_SENT;
  if (c->input_expired)
    return WHY_INPUT_LEFT;
  if (c->cancel_lost)
    return WHY_CANCELLED;
  if (c->gone)
    return WHY_GONE;
  msg = mcp_parse(c->answer, c->answer_len, &dup);
  if (!msg && !dup)
    /* A lone surrogate in the result: what is stored is the line's text,
     * the escape in it; the tree only says what kind of answer it is. */
    msg = mcp_parse_lone(c->answer, c->answer_len, &dup);
  result = json_object_get(msg, "result");
  rtype = json_string_value(json_object_get(result, "resultType"));
  *is_error = json_is_true(json_object_get(result, "isError"));
  if (!msg)
    why = WHY_UNREADABLE;
  else if (rtype && strcmp(rtype, "input_required") == 0)
    why = WHY_INPUT;
  else if (!result ||
           !mcp_member(c->answer, c->answer_len, 0, "result", rf, rt))
    why = WHY_SERVER_ERROR;
  else if (*is_error && !p->o->store_tool_errors)
    why = WHY_TOOL_ERROR;
  else if (*rt - *rf > p->o->max_result)
    why = WHY_TOO_BIG;
  else
    why = WHY_RESULT;
  json_decref(msg);
  return why;
}

/*
 * The tool answered resultType "input_required": no outcome (MCP
 * 2026-07-28). It needs the client's input before it acts, and the client
 * sends the same call again with it. The key stays held, its lease
 * renewed, for that round; the answer passes on to every request waiting.
 */
static void ask_for_input(mcp_proxy *p, mcp_call *c) {
  mcp_waiter *ws;
  char *ans;
  size_t alen;
  pthread_mutex_lock(&p->lock);
  ws = c->waiters;
  c->waiters = NULL;
  ans = c->answer; /* the next round brings its own */
  alen = c->answer_len;
  c->answer = NULL;
  c->answer_len = 0;
  c->state = CALL_INPUT;
  c->input_until = mono_ms() + p->o->input_wait_ms;
  pthread_mutex_unlock(&p->lock);
  mcp_notify(p); /* the main thread times the wait */
  for (mcp_waiter *w = ws; w; w = w->next)
    answer_line_as(p, ans, alen, w->id, 0);
  waiters_free(ws);
  free(ans);
}

static void do_end(mcp_proxy *p, mcp_call *c) {
  idem_response resp;
  idem_exec_result how;
  int why, rc, is_error = 0;
  int recovered = idem_call_outcome(c->call) == IDEM_RECOVER;
  char *marked = NULL;
  size_t marked_len = 0;
  size_t rf = 0, rt = 0;
  char detail[600];
  mcp_waiter *ws;
  memset(&resp, 0, sizeof resp);
  why = ending_of(p, c, &rf, &rt, &is_error);
  switch (why) {
  case WHY_INPUT:
    ask_for_input(p, c);
    return;
  case WHY_RESULT:
    how = IDEM_EXEC_DONE;
    resp.status = is_error;
    resp.body = c->answer + rf;
    resp.body_len = rt - rf;
    if (c->stale_retry) {
      /* Sent again after a stale task handle: no takeover the store knows
       * of, so the mark is kept in the result itself. */
      marked = mcp_mark_result(resp.body, resp.body_len, 0, 1, &marked_len);
      if (marked) {
        resp.body = marked;
        resp.body_len = marked_len;
      }
    }
    break;
  case WHY_GONE:
    how = IDEM_EXEC_LEAVE_IN_PROGRESS;
    break;
  case WHY_TOO_BIG:
  case WHY_UNREADABLE:
  case WHY_CANCELLED: /* it may have acted, or stopped partway */
    how = IDEM_EXEC_UNKNOWN;
    break;
  default: /* the tool has not acted */
    how = IDEM_EXEC_NOT_DONE;
    break;
  }
  rc = idem_execute_end(c->exec, how, &resp);
  c->exec = NULL;
  snprintf(detail, sizeof detail, "%s (%s)", idem_errmsg(), idem_rc_name(rc));
  switch (why) {
  case WHY_RESULT:
    if (rc != IDEM_OK)
      cli_error("mcp",
                "key '%s' (tool %s): the result was passed on but not "
                "recorded: %s",
                c->key, c->tool, detail);
    else {
      mcp_cache_put(c->tool, c->key, c->fp, resp.body, resp.body_len, recovered,
                    wall_ms() + retention_ms(p, c->key));
      /* Its line, read whole when it came: a retry of it with another id
       * is answered from memory without being read. Not a result naming a
       * task, whose replay depends on what the line asks (which a later
       * round of the call may have changed): such a retry is read whole. */
      if (replay_verdict(p, 0, resp.body, resp.body_len) == REPLAY_OK)
        seen_put(c->line, c->len, c->id_from, c->id_to, c->tool, c->key, c->fp,
                 0);
    }
    task_made(p, resp.body, resp.body_len);
    break;
  case WHY_TOOL_ERROR:
  case WHY_SERVER_ERROR:
  case WHY_NOT_SENT:
    if (rc != IDEM_OK)
      cli_error("mcp", "key '%s' could not be freed: %s", c->key, detail);
    break;
  case WHY_INPUT_LEFT:
    cli_error("mcp",
              "key '%s' (tool %s): the tool asked for input and no next "
              "round of the call came %s; the key is %s",
              c->key, c->tool,
              c->gone ? "before the proxy closed" : "within --input-wait",
              rc == IDEM_OK ? "released" : detail);
    break;
  case WHY_UNREADABLE:
    cli_error("mcp",
              "key '%s' (tool %s): the server's answer is not JSON the "
              "proxy can read (a number past the double range, a member "
              "named twice, bytes that are not UTF-8): passed on, not "
              "stored; the key is %s",
              c->key, c->tool, rc == IDEM_OK ? "marked unknown" : detail);
    break;
  case WHY_TOO_BIG:
    cli_error("mcp",
              "key '%s' (tool %s): the result of %zu bytes is larger than "
              "--max-result (%zu): passed on, not stored; the key is %s",
              c->key, c->tool, rt - rf, p->o->max_result,
              rc == IDEM_OK ? "marked unknown" : detail);
    break;
  case WHY_CANCELLED:
    cli_error("mcp",
              "key '%s' (tool %s): the client cancelled the call and the "
              "server neither confirmed (an error answer) nor answered "
              "within --cancel-wait; the key is %s",
              c->key, c->tool, rc == IDEM_OK ? "marked unknown" : detail);
    break;
  default:
    cli_error("mcp",
              "key '%s' (tool %s): the server exited before answering; the "
              "key is %s",
              c->key, c->tool,
              rc == IDEM_OK ? "held in progress for one lease" : detail);
    break;
  }
  ws = call_finish(p, c);
  for (mcp_waiter *w = ws; w; w = w->next) {
    if (why == WHY_NOT_SENT)
      answer_server_exited(p, c, w->id);
    else if (why == WHY_GONE)
      answer_unknown(p, c, w->id, p->o->on_unknown_fail ? 0 : lease_ms(p),
                     "the server exited before answering this call", 1);
    else if (why == WHY_CANCELLED)
      answer_unknown(p, c, w->id, 0,
                     "the call was cancelled at the server, which did not "
                     "say whether it stopped",
                     1);
    else if (why == WHY_RESULT && w->attached)
      answer_replay(p, w->id, mcp_is_implicit(c->key), resp.body,
                    resp.body_len, recovered);
    else
      answer_as_server(p, c, w->id,
                       (recovered || c->stale_retry) && why == WHY_RESULT);
  }
  call_answered(p, ws);
  free(marked);
  call_free(c);
}

static void *worker_main(void *arg) {
  mcp_proxy *p = arg;
  for (;;) {
    mcp_call *c;
    pthread_mutex_lock(&p->lock);
    while (!p->qhead)
      pthread_cond_wait(&p->work, &p->lock);
    c = p->qhead;
    p->qhead = c->qnext;
    if (!p->qhead)
      p->qtail = NULL;
    pthread_mutex_unlock(&p->lock);
    if (c->state == CALL_CLAIM)
      do_claim(p, c);
    else
      do_end(p, c);
  }
  return NULL;
}

int mcp_keyed_start(mcp_proxy *p) {
  unsigned char r[8];
  pthread_cond_init(&p->work, NULL);
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    uint64_t v = (uint64_t)wall_ms() ^ ((uint64_t)getpid() << 32);
    memcpy(r, &v, sizeof r);
  }
  for (int i = 0; i < 8; i++)
    snprintf(p->nonce + 2 * i, 3, "%02x", r[i]);
  for (int i = 0; i < MCP_WORKERS; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, worker_main, p) != 0 || pthread_detach(t) != 0)
      return -1;
  }
  return 0;
}

/* ---- what the readers and the main thread hand over ---------------------- */

/* --keyed-cancel pass: the cancellation of c, at the server, sent on
 * under the id c travels under there; NULL when out of memory. */
static json_t *cancel_for_server(const mcp_call *c, json_t *msg) {
  json_t *sid = json_loads(c->sid, JSON_DECODE_ANY, NULL);
  json_t *reason = json_object_get(json_object_get(msg, "params"), "reason");
  json_t *note = sid ? json_pack("{s:s,s:s,s:{s:o}}", "jsonrpc", "2.0",
                                 "method", "notifications/cancelled",
                                 "params", "requestId", sid)
                     : NULL;
  if (note && json_is_string(reason))
    json_object_set(json_object_get(note, "params"), "reason", reason);
  return note;
}

int mcp_keyed_cancel(mcp_proxy *p, json_t *msg) {
  char *id =
      mcp_id_text(json_object_get(json_object_get(msg, "params"), "requestId"));
  json_t *pass = NULL;
  int found = 0;
  if (!id)
    return 0;
  pthread_mutex_lock(&p->lock);
  for (mcp_call *c = p->calls; c && !found; c = c->next)
    for (mcp_waiter **w = &c->waiters; *w; w = &(*w)->next)
      if (strcmp((*w)->match, id) == 0) {
        /* The request gets no answer now (MCP's rule for a cancelled
         * request). The call goes on, and its answer is recorded; with
         * --keyed-cancel pass, a call at the server that no retry waits
         * for is cancelled there too. */
        mcp_waiter *d = *w;
        *w = d->next;
        if (p->o->cancel_pass && !d->attached && !c->waiters &&
            c->state == CALL_SERVER && !c->cancel_until &&
            (pass = cancel_for_server(c, msg)))
          c->cancel_until = mono_ms() + p->o->cancel_wait_ms;
        waiter_free(d);
        found = 1;
        break;
      }
  pthread_mutex_unlock(&p->lock);
  free(id);
  if (pass) {
    mcp_out_json(&p->to_server, pass);
    json_decref(pass);
    mcp_notify(p); /* the main thread times the confirmation */
  }
  return found;
}

int mcp_keyed_answer(mcp_proxy *p, json_t *msg, const char *line, size_t len) {
  char *id = NULL;
  size_t f, t;
  mcp_call *found = NULL;
  int wake = 0;
  if (msg)
    id = mcp_id_text(json_object_get(msg, "id"));
  else if (mcp_member(line, len, 0, "id", &f, &t)) {
    id = malloc(t - f + 1);
    if (id) {
      memcpy(id, line + f, t - f);
      id[t - f] = '\0';
    }
  }
  if (!id || strncmp(id, "\"idem-", 6) != 0) {
    free(id);
    return 0;
  }
  pthread_mutex_lock(&p->lock);
  for (mcp_call *c = p->calls; c; c = c->next)
    if (c->state == CALL_SERVER && strcmp(c->sid, id) == 0) {
      found = c;
      break;
    }
  if (found) {
    char *copy = malloc(len + 1);
    if (copy) {
      memcpy(copy, line, len);
      copy[len] = '\0';
    }
    free(found->answer);
    found->answer = copy;
    found->answer_len = copy ? len : 0;
    /* Out of memory for the copy: the answer cannot be kept, as if the
     * server had not answered. */
    found->gone = copy == NULL;
    wake = end_queue_quiet(p, found);
  } else if (strncmp(id + 6, p->nonce, strlen(p->nonce)) == 0 &&
             id[6 + strlen(p->nonce)] == '-') {
    /* Under an id of this proxy's, for a call it has settled (cancelled
     * at the server and marked unknown): no request of the client's has
     * that id, so it goes nowhere. */
    cli_error("mcp",
              "an answer came for a keyed call that was already settled "
              "(%s); it is dropped",
              id);
    pthread_mutex_unlock(&p->lock);
    free(id);
    return 1;
  }
  pthread_mutex_unlock(&p->lock);
  if (wake)
    pthread_cond_signal(&p->work);
  free(id);
  return found != NULL;
}

void mcp_keyed_server_gone(mcp_proxy *p) {
  pthread_mutex_lock(&p->lock);
  p->server_gone = 1;
  for (mcp_call *c = p->calls; c; c = c->next)
    if (c->state == CALL_SERVER) {
      c->gone = 1;
      end_queue(p, c);
    } else if (c->state == CALL_INPUT) {
      c->input_expired = 1;
      c->gone = 1; /* (for the log: the wait did not run out) */
      end_queue(p, c);
    }
  pthread_mutex_unlock(&p->lock);
}

int mcp_keyed_drain(mcp_proxy *p) {
  int left;
  pthread_mutex_lock(&p->lock);
  p->draining = 1;
  for (mcp_call *c = p->calls; c; c = c->next)
    if (c->state == CALL_INPUT) {
      /* Its next round would come from the client, which has gone: the
       * tool has not acted, and its key is released now rather than held
       * for --input-wait. */
      c->input_expired = 1;
      c->gone = 1; /* (for the log) */
      c->state = CALL_END;
      enqueue(p, c);
    }
  left = p->ncalls;
  pthread_mutex_unlock(&p->lock);
  return left;
}

int mcp_keyed_left(mcp_proxy *p) {
  pthread_mutex_lock(&p->lock);
  int left = p->ncalls;
  pthread_mutex_unlock(&p->lock);
  return left;
}

int64_t mcp_keyed_tick(mcp_proxy *p) {
  typedef struct expired {
    struct expired *next;
    mcp_waiter *w;
    char *key, *tool;
  } expired;
  expired *list = NULL;
  int64_t now = mono_ms(), next = -1;
  pthread_mutex_lock(&p->lock);
  for (mcp_call *c = p->calls; c; c = c->next) {
    if (c->state == CALL_INPUT) {
      if (c->input_until <= now) {
        c->input_expired = 1;
        c->state = CALL_END;
        enqueue(p, c);
      } else if (next < 0 || c->input_until - now < next) {
        next = c->input_until - now;
      }
      continue;
    }
    if (c->state == CALL_CLAIM)
      continue; /* its worker answers when the store says */
    if (c->state == CALL_SERVER && c->cancel_until) {
      if (c->cancel_until <= now) {
        /* Cancelled at the server, which has not said it stopped. */
        c->cancel_lost = 1;
        end_queue(p, c);
        continue;
      }
      if (next < 0 || c->cancel_until - now < next)
        next = c->cancel_until - now;
    }
    for (mcp_waiter **w = &c->waiters; *w;) {
      mcp_waiter *d = *w;
      expired *e;
      if (!d->attached || d->deadline > now) {
        if (d->attached && (next < 0 || d->deadline - now < next))
          next = d->deadline - now;
        w = &d->next;
        continue;
      }
      e = calloc(1, sizeof *e);
      if (e) {
        e->key = strdup(c->key);
        e->tool = strdup(c->tool);
      }
      if (!e || !e->key || !e->tool) {
        if (e) {
          free(e->key);
          free(e->tool);
          free(e);
        }
        next = 10; /* try again soon */
        w = &d->next;
        continue;
      }
      *w = d->next;
      e->w = d;
      e->next = list;
      list = e;
    }
  }
  pthread_mutex_unlock(&p->lock);
  while (list) {
    expired *e = list;
    mcp_call shown;
    memset(&shown, 0, sizeof shown);
    shown.key = e->key;
    shown.tool = e->tool;
    answer_in_flight_here(p, &shown, e->w->id);
    list = e->next;
    waiter_free(e->w);
    free(e->key);
    free(e->tool);
    free(e);
  }
  return next;
}

/* ---- the client reader's part -------------------------------------------- */

void mcp_keyed_call(mcp_proxy *p, json_t *msg, const char *line, size_t len,
                    const char *key, const char *tool, int key_in_argument) {
  json_t *id = json_object_get(msg, "id");
  size_t idf, idt;
  mcp_call *c, *same = NULL;
  mcp_waiter *w;
  char *body, *request, *idtext;
  size_t blen, request_len;
  int recovered, asks_task;
  char fp[IDEM_FINGERPRINT_SIZE];
  char implicit[sizeof MCP_IMPLICIT_PREFIX + IDEM_FINGERPRINT_SIZE];
  /* What mcp_id_text() reads: a string or a number. */
  int readable = json_is_string(id) || json_is_number(id);
  if (!readable || !mcp_member(line, len, 0, "id", &idf, &idt)) {
    mcp_answer_error(p, id, -32600,
                     "idem mcp: a request id must be a string or a number",
                     NULL);
    return;
  }
  idtext = malloc(idt - idf + 1);
  if (!idtext)
    goto oom;
  memcpy(idtext, line + idf, idt - idf);
  idtext[idt - idf] = '\0';
  if (key && mcp_is_implicit(key)) {
    mcp_answer_error_text(p, idtext, MCP_E_BAD_KEY,
                          "idem mcp: keys beginning \"" MCP_IMPLICIT_PREFIX
                          "\" are the ones the proxy makes (--implicit-keys); "
                          "choose another key. Nothing was sent to the server.",
                          json_pack("{s:s}", "idem", "bad_key"));
    free(idtext);
    return;
  }
  if (key && idem_key_check(key) != IDEM_OK) {
    char m[600];
    snprintf(m, sizeof m,
             "idem mcp: the idempotency key is not valid (%s): use 1-255 "
             "printable ASCII characters (0x21-0x7e). Nothing was sent to "
             "the server.",
             idem_errmsg());
    mcp_answer_error_text(p, idtext, MCP_E_BAD_KEY, m,
                          json_pack("{s:s}", "idem", "bad_key"));
    free(idtext);
    return;
  }
  /* The request's fingerprint, then a retry whose result is kept in
   * memory answered here, before anything of the call is made (a stale
   * task handle goes to the workers, who settle it). */
  request = mcp_request_text(line, len, tool,
                             key_in_argument == 2 ? p->o->offer_key_argument
                             : key_in_argument    ? p->o->key_argument
                                                  : NULL,
                             &request_len);
  if (!request) {
    free(idtext);
    goto oom;
  }
  /* A lone surrogate in the arguments (JavaScript writes one for a string
   * cut between the halves of a pair) is read as the code unit it is. */
  if (idem_fingerprint_with(request, request_len,
                            IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES,
                            fp) != IDEM_OK) {
    char m[800];
    snprintf(m, sizeof m,
             "idem mcp: the arguments of this call cannot be fingerprinted "
             "(%s); nothing was sent to the server.",
             idem_errmsg());
    mcp_answer_error_text(p, idtext, MCP_E_INTERNAL, m,
                          mcp_error_data(key, tool, "internal", NULL));
    free(request);
    free(idtext);
    return;
  }
  if (!key) {
    /* The same tool with the same arguments (and tenant: the record's id
     * holds it) is the same call. */
    mcp_implicit_key(fp, implicit);
    key = implicit;
  }
  asks_task = mcp_asks_task(json_object_get(msg, "params"));
  if (mcp_cache_get(tool, key, fp, wall_ms(), &body, &blen, &recovered)) {
    int v = replay_verdict(p, asks_task, body, blen);
    if (v == REPLAY_OK) {
      answer_replay(p, idtext, mcp_is_implicit(key), body, blen, recovered);
      seen_put(line, len, idf, idt, tool, key, fp, asks_task);
    } else if (v == REPLAY_NO_TASK)
      answer_no_task(p, key, tool, idtext);
    free(body);
    if (v != REPLAY_STALE) {
      free(request);
      free(idtext);
      return;
    }
  }
  c = calloc(1, sizeof *c);
  if (!c) {
    free(request);
    free(idtext);
    goto oom;
  }
  c->request = request;
  c->request_len = request_len;
  memcpy(c->fp, fp, sizeof fp);
  c->asks_task = asks_task;
  c->line = malloc(len + 1);
  c->key = strdup(key);
  c->tool = strdup(tool);
  if (!c->line || !c->key || !c->tool) {
    call_free(c);
    free(idtext);
    goto oom;
  }
  memcpy(c->line, line, len);
  c->line[len] = '\0';
  c->len = len;
  c->id_from = idf;
  c->id_to = idt;
  pthread_mutex_lock(&p->lock);
  for (mcp_call *q = p->calls; q; q = q->next)
    if (strcmp(q->tool, c->tool) == 0 && strcmp(q->key, c->key) == 0) {
      same = q;
      break;
    }
  if (same && strcmp(same->fp, c->fp) != 0) {
    char m[1024];
    pthread_mutex_unlock(&p->lock);
    snprintf(m, sizeof m,
             "idem mcp: key \"%s\" is in use by a call of tool %s with "
             "different arguments, still running; nothing was sent to the "
             "server. Use a new key for a new action; to retry the earlier "
             "action, send its arguments unchanged.",
             c->key, c->tool);
    mcp_answer_error_text(
        p, idtext, MCP_E_CONFLICT, m,
        error_data(c, "conflict", "idempotency_key_conflict"));
    call_free(c);
    free(idtext);
    return;
  }
  if (same && same->state == CALL_INPUT) {
    /* The next round of a call that asked for input: it goes to the server
     * under the key still held, as the request the client sent now. */
    w = waiter_new(line, idf, idt, id, 0, 0);
    if (!w) {
      pthread_mutex_unlock(&p->lock);
      call_free(c);
      free(idtext);
      goto oom;
    }
    free(same->line);
    same->line = c->line;
    same->len = c->len;
    same->id_from = idf;
    same->id_to = idt;
    c->line = NULL;
    same->waiters = w;
    to_server_state(p, same);
    pthread_mutex_unlock(&p->lock);
    send_and_settle(p, same);
    call_free(c);
    free(idtext);
    return;
  }
  if (same) {
    /* A retry of a call in flight here: it waits for that call's answer. */
    w = waiter_new(line, idf, idt, id, 1, mono_ms() + p->o->attach_wait_ms);
    if (w) {
      w->next = same->waiters;
      same->waiters = w;
    }
    pthread_mutex_unlock(&p->lock);
    if (!w) {
      call_free(c);
      free(idtext);
      goto oom;
    }
    mcp_notify(p); /* the main thread times its wait */
    call_free(c);
    free(idtext);
    return;
  }
  if (p->closing || p->server_gone) {
    pthread_mutex_unlock(&p->lock);
    answer_server_exited(p, c, idtext);
    call_free(c);
    free(idtext);
    return;
  }
  c->waiters = waiter_new(line, idf, idt, id, 0, 0);
  if (!c->waiters) {
    pthread_mutex_unlock(&p->lock);
    call_free(c);
    free(idtext);
    goto oom;
  }
  c->wait_until = mono_ms() + p->o->attach_wait_ms;
  c->next = p->calls;
  p->calls = c;
  p->ncalls++;
  enqueue_quiet(p, c);
  pthread_mutex_unlock(&p->lock);
  pthread_cond_signal(&p->work);
  free(idtext);
  return;
oom:
  mcp_answer_error(p, id, MCP_E_INTERNAL,
                   "idem mcp: out of memory; nothing was sent to the server. "
                   "Retry with the same key.",
                   NULL);
}
