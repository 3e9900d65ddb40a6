/*
 * mcp_http_keyed.c -- keyed tools/call over Streamable HTTP.
 *
 * A keyed call (struct kcall) is claimed on the store's queue
 * (idem_execute_begin_async(): no thread waits for it). On PROCEED or
 * RECOVER the client's request goes
 * to the server unchanged, under the client's own id; its answer streams
 * back to that client as it arrives, events of progress, logging and
 * requests for input included, except the final response, which is picked
 * out of the stream (or is the whole application/json body), recorded
 * (idem_execute_end_async()) and only then passed on. The client
 * may go away meanwhile (its request timed out, its stream was cut, it
 * cancelled): the call goes on at the server and its result is recorded,
 * never sent twice while the server may still act. A retry of a call in
 * flight here, under any id and from any session, waits for that result
 * (--attach-wait); one that finds its key held elsewhere (another proxy on
 * the store) waits on the store. A replay is answered as application/json
 * under the retry's own id, with no session header of another's.
 */
#include "mcp_http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef struct end_arg {
  int why;
  int recovered;
  const char *result; /* WHY_RESULT: the stored body */
  size_t result_len;
} end_arg;

typedef struct kcall {
  struct kcall *next; /* the table */
  int refs;           /* the store side, and the transfer */
  int in_table;
  char *tenant, *tool, *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *request;
  size_t request_len;
  hx *owner;   /* the request that is forwarded */
  hx *waiters; /* retries attached to it */
  idem_exec *exec;
  idem_call *call;
  int64_t wait_until; /* a key held elsewhere is waited for until */
  /* The answer, read on the upstream loop's thread until ending is set. */
  int status;
  int sse;
  char *ev; /* an event not yet whole */
  size_t ev_len, ev_cap;
  char *body; /* a JSON answer */
  size_t body_len, body_cap;
  int too_big;
  char *final; /* the final JSON-RPC response */
  size_t final_len;
  char *final_event; /* and its event as the server wrote it (NULL when
                        there was no memory to keep it) */
  size_t final_event_len;
  int oom; /* the final response came (or may have) and could not be kept:
              out of memory */
  up_result result;
  int transfer_done; /* under G.mu */
  int ending;        /* handed to a worker to be recorded */
  /* The server answered resultType "input_required" (MCP 2026-07-28): the
   * key stays held for the client's next round of the same call. 1: the
   * answer is passed on and the round's transfer still ends; 2: waiting
   * for the next round until input_until. Under G.mu. */
  int input;
  int64_t input_until;
  hx *next_round;      /* came while input was 1 */
  struct kcall *pnext; /* G.parked: asked again at retry_at */
  int64_t retry_at;
  /* Under G.mu: the transfer is at the server; when --call-timeout ends
   * it (0: never). Why the proxy stopped it (STOP_*): atomic, set by
   * stop_call() on the upstream loop's thread. */
  int at_server;
  int64_t stop_at;
  int stopped;
  /* --keyed-cancel pass: the client cancelled the call and the
   * cancellation went on to the server, which must confirm (an error
   * answer) or answer by then; atomic, 0: not cancelled. */
  int64_t cancel_at;
  int stale_retry; /* sent again after a stale task handle: its answer is
                      marked recovered */
  /* The ending queued on the store (end_call() to ended()). */
  idem_exec_result how;
  idem_response resp;
  end_arg end;
  idem_exec *ending_exec; /* only when it must wait on a worker */
  char *marked;
} kcall;

enum { STOP_NONE, STOP_TIMEOUT, STOP_LEASE, STOP_CANCEL };

static int stopping_input; /* under G.mu: release keys held for input */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cond; /* a call ended (the drain waits on it) */
  pthread_cond_t tick; /* the ticker's wake-up */
  int64_t tick_at;     /* when the ticker wakes; 0 while it is not waiting
                          (it looks at every call before it waits again) */
  kcall *calls;
  kcall *parked; /* claims that found the key held elsewhere */
  int claiming;  /* claims queued on the store, not yet decided */
  int at_server; /* calls holding a key */
  pthread_t ticker;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Under G.mu: something is due at when (monotonic ms). The ticker is woken
 * only if it would sleep past it: a call is not a wake-up of its own. */
static void tick_by(int64_t when) {
  if (G.tick_at && when < G.tick_at) {
    G.tick_at = when;
    pthread_cond_signal(&G.tick);
  }
}

static void kcall_unref(kcall *k) {
  int left;
  pthread_mutex_lock(&G.mu);
  left = --k->refs;
  pthread_mutex_unlock(&G.mu);
  if (left)
    return;
  if (k->owner)
    hx_unref(k->owner);
  idem_call_free(k->call);
  free(k->tenant);
  free(k->tool);
  free(k->key);
  free(k->request);
  free(k->ev);
  free(k->body);
  free(k->final);
  free(k->final_event);
  free(k->marked);
  free(k);
}

/* The replay cache (mcp_cache.c) is the stdio mode's: its "tool" here is
 * the tenant and the tool, so that tenants never share an entry. */
static char *cache_name(const kcall *k) {
  char *n = NULL;
  if (asprintf(&n, "%s\x1f%s", k->tenant, k->tool) < 0)
    return NULL;
  return n;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int is_task(const char *body, size_t len, int64_t *ttl_ms);

static void cache_put(const kcall *k, const char *body, size_t len,
                      int recovered, int64_t retention_ms) {
  char *n;
  int64_t ttl;
  if (is_task(body, len, &ttl))
    return; /* checked on every replay: claim() */
  n = cache_name(k);
  if (n)
    mcp_cache_put(n, k->key, k->fp, body, len, recovered,
                  wall_ms() + retention_ms);
  free(n);
}

static json_t *error_data(const kcall *k, const char *what, const char *type) {
  return mcp_error_data(k->key, k->tool, what, type);
}

/* Takes the call out of the table with its waiters (and its owner, once):
 * the answers are then made outside the lock. */
static hx *take_all(kcall *k) {
  hx *all;
  pthread_mutex_lock(&G.mu);
  if (k->in_table) {
    kcall **pp = &G.calls;
    while (*pp && *pp != k)
      pp = &(*pp)->next;
    if (*pp)
      *pp = k->next;
    k->in_table = 0;
  }
  all = k->waiters;
  k->waiters = NULL;
  if (k->owner) {
    hx_ref(k->owner);
    k->owner->wnext = all;
    all = k->owner;
  }
  pthread_cond_broadcast(&G.cond);
  pthread_mutex_unlock(&G.mu);
  return all;
}

typedef void (*answer_fn)(kcall *k, hx *h, void *arg);

/* Answers every request of the call, then lets them go. */
static void answer_all(kcall *k, answer_fn fn, void *arg) {
  hx *h = take_all(k), *next;
  for (; h; h = next) {
    next = h->wnext;
    h->wnext = NULL;
    fn(k, h, arg);
    hx_unref(h);
  }
}

/* ---- answers
 * ------------------------------------------------------------------ */

/* The stored result body answered as a replay of k to h; under an implicit
 * key, with a note for the model. */
static void send_replay(const kcall *k, hx *h, const char *body, size_t len,
                        int recovered) {
  size_t n = 0;
  char note[600];
  int implicit = mcp_is_implicit(k->key);
  if (implicit)
    mcp_implicit_note(note, sizeof note, hx_opts->implicit_ms,
                      hx_opts->offer_key_argument);
  char *text = mcp_replay_text(h->id, body, len, recovered,
                               implicit ? note : NULL, &n);
  const char *sid = hx_header(h, "Mcp-Session-Id");
  up_header hs[1] = {{(char *)"Mcp-Session-Id", (char *)sid}};
  if (text)
    /* The retry's own session, if it has one: the SDKs' clients adopt
     * whatever session id an answer carries. */
    hx_answer_whole(h, 200, "application/json", text, n, hs, sid ? 1 : 0);
  else
    hx_answer_rpc_error(h, MCP_E_INTERNAL,
                        "idem mcp: out of memory replaying the stored "
                        "result; nothing was sent to the server. Retry with "
                        "the same key.",
                        json_pack("{s:s}", "idem", "internal"));
  free(text);
}

typedef struct replay_arg {
  const char *body;
  size_t len;
  int recovered;
} replay_arg;

static void answer_replay(kcall *k, hx *h, void *arg) {
  const replay_arg *a = arg;
  send_replay(k, h, a->body, a->len, a->recovered);
}

/* ---- task handles
 *
 * A keyed call that asks for a task acts by creating it: its result is the
 * task's handle, kept and replayed as any result, so that a retry gets the
 * same task. Over HTTP the proxy cannot tell whether the server still holds
 * a task (it may keep tasks across restarts); it can tell when the task's
 * ttl, counted from when its handle was recorded, has passed: the handle is
 * stale, and the replay is settled as an unknown outcome, as the stdio mode
 * does. A retry that does not ask for a task gets -32602 (task_expected).
 */

static int is_task(const char *body, size_t len, int64_t *ttl_ms) {
  char *task = NULL;
  int is = mcp_task_handle(body, len, &task, ttl_ms);
  free(task);
  return is;
}

/* A message read for what it is (a request's params, an answer's kind and
 * id): mcp_parse(), or mcp_parse_lone() for one holding lone surrogates,
 * whose tree is never written out (what passes on and is stored is the
 * text as it came). NULL when it is no JSON the proxy can read. */
static json_t *parse_message(const char *s, size_t n) {
  int dup = 0;
  json_t *m = mcp_parse(s, n, &dup);
  if (!m && !dup)
    m = mcp_parse_lone(s, n, &dup);
  return m;
}

/* Whether request h asks for a task. */
static int asks_task(const hx *h) {
  json_t *m = parse_message(h->body, h->len);
  int asks = mcp_asks_task(json_object_get(m, "params"));
  json_decref(m);
  return asks;
}

static void answer_no_task(kcall *k, hx *h) {
  char msg[1024];
  mcp_no_task_message(msg, sizeof msg, k->key, k->tool);
  hx_answer_rpc_error(h, -32602, msg, error_data(k, "task_expected", NULL));
}

/* A replay of a task handle: to those that ask for a task. */
static void answer_task_replay(kcall *k, hx *h, void *arg) {
  if (asks_task(h))
    answer_replay(k, h, arg);
  else
    answer_no_task(k, h);
}

typedef struct error_arg {
  int code;
  const char *msg, *what, *type;
  int64_t retry_after_ms;
} error_arg;

static void answer_error(kcall *k, hx *h, void *arg) {
  const error_arg *a = arg;
  json_t *d = error_data(k, a->what, a->type);
  if (d && a->retry_after_ms > 0)
    json_object_set_new(d, "retryAfterMs", json_integer(a->retry_after_ms));
  hx_answer_rpc_error(h, a->code, a->msg, d);
}

static void answer_in_flight_here(kcall *k, hx *h) {
  char msg[1024];
  error_arg a = {MCP_E_IN_FLIGHT, msg, "in_flight",
                 "idempotency_key_in_progress", 1000};
  snprintf(msg, sizeof msg,
           "idem mcp: the same call (key \"%s\", tool %s) is still running "
           "at the server; this retry waited %.1f s and nothing more was "
           "sent. Retry with the same key to get its result when it "
           "finishes.",
           k->key, k->tool, (double)hx_opts->attach_wait_ms / 1000);
  answer_error(k, h, &a);
}

/* ---- the answer as it arrives (the upstream loop's thread)
 * --------------------- */

/* How long k's result is kept: --implicit-keys' window for a key the proxy
 * made, else --retention. */
static int64_t retention(const kcall *k) {
  if (mcp_is_implicit(k->key))
    return hx_opts->implicit_ms;
  return hx_opts->retention_ms ? hx_opts->retention_ms : 24 * 3600 * 1000LL;
}

static void end_call(kcall *k);

/* The final response is in (or the transfer ended without it): its
 * ending is queued on the store. */
static void hand_over(kcall *k) {
  if (k->ending)
    return;
  k->ending = 1;
  end_call(k);
}

static void k_head(void *ctx, up_response *rs) {
  kcall *k = ctx;
  const char *type = NULL;
  k->status = rs->status;
  for (size_t i = 0; i < rs->nheaders; i++)
    if (strcasecmp(rs->headers[i].name, "Content-Type") == 0)
      type = rs->headers[i].value;
  if (rs->status == 200 && type &&
      strncasecmp(type, "text/event-stream", 17) == 0) {
    /* Events pass on as they come; the head goes out with the first of
     * them, or with the answer (see hold() in mcp_http.c). */
    k->sse = 1;
    hx_answer_head(k->owner, 200, rs->headers, rs->nheaders, -1, 1);
  }
}

/* Whether the data of an event (or a JSON body) is the response to the
 * owner's request: 1 with it copied to k->final, or, when there is no
 * memory to keep it (or to tell), with k->oom set: the response must not
 * pass on unrecorded. */
static int is_final(kcall *k, const char *data, size_t len) {
  int yes = 0;
  json_t *m = parse_message(data, len);
  json_t *id = json_object_get(m, "id");
  if (m && json_is_object(m) && id && !json_object_get(m, "method") &&
      (json_object_get(m, "result") || json_object_get(m, "error"))) {
    char *t = mcp_id_text(id);
    if (!t && (json_is_string(id) || json_is_number(id)))
      k->oom = yes = 1; /* it may be: not told for want of memory */
    else
      yes = t && strcmp(t, k->owner->id) == 0;
    free(t);
  }
  json_decref(m);
  if (yes && !k->oom) {
    if ((k->final = malloc(len + 1))) {
      memcpy(k->final, data, len);
      k->final[len] = 0;
      k->final_len = len;
    } else {
      k->oom = 1;
    }
  }
  return yes;
}

/*
 * An event of a keyed call's stream passed on without its "id:" lines. A
 * client that has an event id resumes a broken stream with GET and
 * Last-Event-ID, and a server with an event store then sends the rest,
 * the final response included, on that GET, never on the POST the proxy
 * reads: the result would reach the client unrecorded, and the key would
 * stay held. Without ids the client re-issues the call instead, and the
 * re-issue gets the recorded result.
 */
static void pass_event(hx *h, const char *ev, size_t n) {
  const char *p = ev, *end = ev + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t ll = nl ? (size_t)(nl + 1 - p) : (size_t)(end - p);
    if (!(ll >= 3 && memcmp(p, "id:", 3) == 0) &&
        !(ll >= 2 && p[0] == 'i' && p[1] == 'd' &&
          (p[2] == '\n' || p[2] == '\r')))
      hx_stream(h, p, ll);
    p += ll;
  }
}

/* One whole event, raw: passed on, unless it is the final response. */
static void on_event(kcall *k, const char *ev, size_t n) {
  size_t dlen = 0;
  char *data;
  errno = 0;
  data = hx_event_data(ev, n, &dlen);
  if (!data && errno == ENOMEM) {
    /* Not read for want of memory: it may be the final response, which
     * must never reach the client unrecorded. The call ends as one whose
     * answer could not be kept (the key held for one lease). */
    k->oom = 1;
    hand_over(k);
    return;
  }
  if (data && is_final(k, data, dlen)) {
    /* The event as the server wrote it, passed on once the response is
     * recorded; without memory for it, an event is made of the response
     * itself (hx_stream_event()). */
    if (!k->oom && (k->final_event = malloc(n))) {
      memcpy(k->final_event, ev, n);
      k->final_event_len = n;
    }
    free(data);
    hand_over(k);
    return;
  }
  free(data);
  pass_event(k->owner, ev, n); /* a client gone misses it */
}

static int k_data(void *ctx, const char *p, size_t n) {
  kcall *k = ctx;
  size_t start = 0, end;
  if (k->ending)
    return 0; /* after the final response: dropped */
  if (!k->sse) {
    /* A JSON answer (or an error page): kept whole. */
    if (k->too_big || k->body_len + n > hx_opts->max_result + 65536) {
      k->too_big = 1;
      return 0;
    }
    return hx_buf_add(&k->body, &k->body_len, &k->body_cap, p, n);
  }
  if (k->ev_len + n > HX_MAX_BUFFERED + (size_t)hx_opts->max_result ||
      hx_buf_add(&k->ev, &k->ev_len, &k->ev_cap, p, n) != 0)
    return -1;
  while (!k->ending && (end = hx_event_end(k->ev, k->ev_len, start))) {
    on_event(k, k->ev + start, end - start);
    start = end;
  }
  memmove(k->ev, k->ev + start, k->ev_len - start);
  k->ev_len -= start;
  return 0;
}

static void input_wait(kcall *k);

static void k_done(void *ctx, up_result r) {
  kcall *k = ctx;
  int input;
  pthread_mutex_lock(&G.mu);
  k->transfer_done = 1;
  k->at_server = 0;
  input = k->input == 1;
  pthread_mutex_unlock(&G.mu);
  if (input) {
    input_wait(k);
  } else if (!k->ending) {
    k->result = r;
    k->transfer_done = 1;
    if (r == UP_OK && !k->sse && k->status >= 200 && k->status < 300 &&
        k->body_len && !is_final(k, k->body, k->body_len)) {
      /* A JSON-RPC error under no id (the server could not read the
       * request): it did not act. */
      json_t *m = parse_message(k->body, k->body_len);
      if (json_is_object(m) && json_object_get(m, "error") &&
          !json_object_get(m, "result") &&
          json_is_null(json_object_get(m, "id"))) {
        if ((k->final = malloc(k->body_len + 1))) {
          memcpy(k->final, k->body, k->body_len);
          k->final[k->body_len] = 0;
          k->final_len = k->body_len;
        } else {
          k->oom = 1;
        }
      }
      json_decref(m);
    }
    hand_over(k);
  }
  kcall_unref(k);
}

/* ---- recording and answering
 * ---------------------------------- */

enum {
  WHY_RESULT,     /* recorded */
  WHY_RPC_ERROR,  /* the server answered a JSON-RPC error: not acted */
  WHY_HTTP_ERROR, /* an HTTP error answer (401, 404 ...): not acted */
  WHY_INPUT,      /* input_required: not acted yet */
  WHY_TOOL_ERROR, /* isError, --store-tool-errors no: freed */
  WHY_NOT_SENT,
  WHY_TOO_BIG,
  WHY_LOST,        /* sent and no answer: may have acted, may still act */
  WHY_HTTP_UNSURE, /* another HTTP error (5xx, a gateway's 504): the same */
  WHY_NO_MEMORY    /* answered, and no memory to keep the answer: the same */
};

/* HTTP errors that say the request was refused before anything ran: the
 * key is freed. A 5xx, a 408 or a 409 may come after the tool acted (or
 * from a load balancer while it still runs): the key is held. */
static int not_acted(int status) {
  static const int codes[] = {400, 401, 403, 404, 405, 406, 411,
                              413, 414, 415, 422, 429, 431};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (codes[i] == status)
      return 1;
  return 0;
}

/* The final response with its result marked recovered; NULL when out of
 * memory or when it has no result. */
static char *mark_recovered(const char *text, size_t n, size_t *out_len) {
  size_t rf, rt;
  char *marked, *all;
  size_t mlen;
  if (!mcp_member(text, n, 0, "result", &rf, &rt))
    return NULL;
  if (!(marked = mcp_mark_result(text + rf, rt - rf, 0, 1, &mlen)))
    return NULL;
  all = mcp_splice(text, n, rf, rt, marked, mlen, out_len);
  free(marked);
  return all;
}

static void resubmit(const kcall *k, hx *h);

static void answer_end(kcall *k, hx *h, void *arg) {
  const end_arg *a = arg;
  char msg[2048]; /* the key and the tool twice: 255 bytes each */
  if (h != k->owner) {
    /* An attached retry. */
    int64_t ttl;
    if (a->why == WHY_RESULT && is_task(a->result, a->result_len, &ttl) &&
        !asks_task(h)) {
      answer_no_task(k, h);
      return;
    }
    if (a->why == WHY_RESULT) {
      send_replay(k, h, a->result, a->result_len, a->recovered);
      return;
    }
    if (a->why == WHY_RPC_ERROR || a->why == WHY_HTTP_ERROR ||
        a->why == WHY_TOOL_ERROR || a->why == WHY_NOT_SENT) {
      /* The first attempt did not act and freed the key: this retry is a
       * call of its own now, in its own session. */
      resubmit(k, h);
      return;
    }
  } else if (a->why == WHY_HTTP_UNSURE) {
    hx_answer_whole(h, k->status, NULL, k->body ? k->body : "", k->body_len,
                    k->owner->rs.headers, k->owner->rs.nheaders);
    return;
  }
  switch (a->why) {
  case WHY_RESULT:
  case WHY_RPC_ERROR:
  case WHY_INPUT:
  case WHY_TOOL_ERROR: {
    char *text = NULL, *again = NULL;
    size_t len = k->final_len, alen = 0;
    const char *body = k->final;
    if (a->why == WHY_RESULT && a->recovered &&
        (text = mark_recovered(k->final, k->final_len, &len)))
      body = text;
    if (h != k->owner) {
      /* The same answer under the retry's id, never under another's. */
      size_t f, t;
      if (mcp_member(body, len, 0, "id", &f, &t) &&
          (again = mcp_splice(body, len, f, t, h->id, strlen(h->id), &alen)))
        hx_answer_whole(h, 200, "application/json", again, alen, NULL, 0);
      else
        hx_answer_rpc_error(h, MCP_E_INTERNAL,
                            "idem mcp: out of memory passing on the "
                            "server's answer; retry with the same key.",
                            json_pack("{s:s}", "idem", "internal"));
    } else if (k->sse) {
      /* The server's own event, or one made of the response (marked
       * recovered, or its event not kept for want of memory), whose lines
       * each go on a data line. */
      if (body == k->final && k->final_event)
        pass_event(h, k->final_event, k->final_event_len);
      else
        hx_stream_event(h, body, len);
      hx_stream_end(h, 0);
    } else {
      hx_answer_whole(h, 200, NULL, body, len, k->owner->rs.headers,
                      k->owner->rs.nheaders);
    }
    free(text);
    free(again);
    return;
  }
  case WHY_HTTP_ERROR:
    hx_answer_whole(h, k->status, NULL, k->body ? k->body : "", k->body_len,
                    k->owner->rs.headers, k->owner->rs.nheaders);
    return;
  case WHY_NOT_SENT: {
    error_arg e = {MCP_E_SERVER_EXITED, msg, "server_unreachable", NULL, 0};
    snprintf(msg, sizeof msg,
             "idem mcp: the MCP server could not be reached (%s); this "
             "call was not sent and did not act. Retry with the same key.",
             up_error(&k->owner->rs));
    answer_error(k, h, &e);
    break;
  }
  case WHY_TOO_BIG: {
    error_arg e = {MCP_E_UNKNOWN, msg, "unknown", "idempotency_outcome_unknown",
                   0};
    snprintf(msg, sizeof msg,
             "idem mcp: the server's answer to this call (key \"%s\", tool "
             "%s) is larger than --max-result, so it was not stored; the "
             "tool may have acted and the key waits for an operator (`idem "
             "keys resolve`).",
             k->key, k->tool);
    answer_error(k, h, &e);
    break;
  }
  default: {
    int64_t wait = hx_opts->on_unknown_fail || k->stopped == STOP_CANCEL
                       ? 0
                       : hx_opts->lease_ms;
    error_arg e = {MCP_E_UNKNOWN, msg, "unknown", "idempotency_outcome_unknown",
                   wait};
    const char *what = a->why == WHY_NO_MEMORY
                           ? "this proxy ran out of memory while reading the "
                             "server's answer to this call"
                           : "the server did not answer this call";
    if (wait > 0)
      snprintf(msg, sizeof msg,
               "idem mcp: %s (%s; key \"%s\", tool %s), so the tool may or "
               "may not have acted. Check whether it acted if you can; a "
               "retry with the same key in %.1f s sends the call to the "
               "server again, and its result is marked "
               "_meta[\"idem/recovered\"].",
               what, up_error(&k->owner->rs), k->key, k->tool,
               (double)wait / 1000);
    else
      snprintf(msg, sizeof msg,
               "idem mcp: %s (%s; key \"%s\", tool %s), so the tool may or "
               "may not have acted. This key is refused until an operator "
               "settles it: `idem keys resolve %s --operation %s --failed` "
               "if it did not act, or --completed if it did.",
               what, up_error(&k->owner->rs), k->key, k->tool, k->key, k->tool);
    answer_error(k, h, &e);
    break;
  }
  }
}

/* ---- input_required: the key held between rounds ---------------------------
 */

static void forward(kcall *k);

/* A round's requests (the owner and any attached retries) taken, the call
 * left in the table. */
static hx *take_round(kcall *k) {
  hx *all;
  pthread_mutex_lock(&G.mu);
  all = k->waiters;
  k->waiters = NULL;
  if (k->owner) {
    hx_ref(k->owner);
    k->owner->wnext = all;
    all = k->owner;
  }
  pthread_mutex_unlock(&G.mu);
  return all;
}

/* The round's transfer has ended: the call waits for its next round. */
static void input_wait(kcall *k) {
  hx *old, *next;
  pthread_mutex_lock(&G.mu);
  old = k->owner;
  k->owner = NULL;
  free(k->ev);
  free(k->body);
  free(k->final);
  free(k->final_event);
  k->ev = k->body = k->final = k->final_event = NULL;
  k->ev_len = k->ev_cap = k->body_len = k->body_cap = 0;
  k->final_len = k->final_event_len = 0;
  k->status = k->sse = k->too_big = k->transfer_done = k->ending = 0;
  k->oom = 0;
  k->result = UP_OK;
  k->input = 2;
  k->input_until = hx_mono_ms() + hx_opts->input_wait_ms;
  next = k->next_round;
  k->next_round = NULL;
  if (next)
    k->input = 0;
  tick_by(k->input_until); /* the ticker times the wait */
  pthread_mutex_unlock(&G.mu);
  if (old)
    hx_unref(old);
  if (next) {
    k->owner = next;
    forward(k);
  }
}

/*
 * The tool answered resultType "input_required": no outcome. It needs the
 * client's input before it acts, and the client sends the same call again
 * (a new id, the same arguments and key) with it. The answer passes on to
 * every request of the round; the key stays held, its lease renewed, for
 * the next round, which goes to the server under it; --input-wait bounds
 * the wait.
 */
static void ask_for_input(kcall *k) {
  hx *h = take_round(k), *next;
  int now;
  pthread_mutex_lock(&G.mu);
  G.at_server--;
  now = k->transfer_done;
  /* Held for input from now on, while the answer goes out too: a next
   * round that comes meanwhile waits as one (next_round), not as a retry
   * of a call in flight, and a stop waits to let the key go
   * (input_held()). */
  k->input = 1;
  pthread_mutex_unlock(&G.mu);
  for (; h; h = next) {
    next = h->wnext;
    h->wnext = NULL;
    if (h == k->owner) {
      if (k->sse) {
        /* The server's event, or, when there was no memory to keep it, one
         * made of the response. */
        if (k->final_event)
          pass_event(h, k->final_event, k->final_event_len);
        else
          hx_stream_event(h, k->final, k->final_len);
        hx_stream_end(h, 0);
      } else {
        hx_answer_whole(h, 200, NULL, k->final, k->final_len,
                        k->owner->rs.headers, k->owner->rs.nheaders);
      }
    } else {
      size_t f, t, len = 0;
      char *again = mcp_member(k->final, k->final_len, 0, "id", &f, &t)
                        ? mcp_splice(k->final, k->final_len, f, t, h->id,
                                     strlen(h->id), &len)
                        : NULL;
      if (again)
        hx_answer_whole(h, 200, "application/json", again, len, NULL, 0);
      else
        hx_answer_rpc_error(h, MCP_E_INTERNAL, "idem mcp: out of memory", NULL);
      free(again);
    }
    hx_unref(h);
  }
  if (now)
    input_wait(k);
}

/* No next round came (or the proxy is stopping): the tool has not acted. */
static void input_left(void *arg) {
  kcall *k = arg;
  int rc = idem_execute_end(k->exec, IDEM_EXEC_NOT_DONE, NULL);
  k->exec = NULL;
  cli_error("mcp",
            "key '%s' (tool %s): the tool asked for input and no next round "
            "of the call came within --input-wait; the key is %s",
            k->key, k->tool, rc == IDEM_OK ? "released" : idem_errmsg());
  /* Out of the table. A retry that came while the key was let go waited
   * on this call: it is a call of its own now, as after a call that did
   * not act. */
  for (hx *h = take_all(k), *next; h; h = next) {
    next = h->wnext;
    h->wnext = NULL;
    resubmit(k, h);
    hx_unref(h);
  }
  kcall_unref(k);
}

/* The record ended (rc): the call's requests are answered. On a thread of
 * the store's, or a worker's. */
static void ended(void *ctx, int rc) {
  kcall *k = ctx;
  const end_arg *a = &k->end;
  if (rc != IDEM_OK)
    cli_error("mcp",
              "key '%s' (tool %s): the call's record could not be "
              "ended: %s (%s)",
              k->key, k->tool, idem_errmsg(), idem_rc_name(rc));
  else if (a->why == WHY_RESULT)
    cache_put(k, a->result, a->result_len, a->recovered, retention(k));
  else if (a->why == WHY_LOST || a->why == WHY_HTTP_UNSURE)
    cli_error("mcp",
              "key '%s' (tool %s): the server did not answer (%s); "
              "the key is held in progress for one lease",
              k->key, k->tool, up_error(&k->owner->rs));
  else if (a->why == WHY_NO_MEMORY)
    cli_error("mcp",
              "key '%s' (tool %s): out of memory reading the server's "
              "answer, which could not be kept; the key is held in progress "
              "for one lease",
              k->key, k->tool);
  answer_all(k, answer_end, &k->end);
  pthread_mutex_lock(&G.mu);
  G.at_server--;
  pthread_cond_broadcast(&G.cond);
  pthread_mutex_unlock(&G.mu);
  kcall_unref(k);
}

/* The ending on a worker, when the store would not queue it (out of
 * memory). */
static void end_waiting(void *arg) {
  kcall *k = arg;
  idem_exec *x = k->ending_exec;
  k->ending_exec = NULL;
  ended(k, idem_execute_end(x, k->how, &k->resp));
}

/*
 * Decides how the call's record ends, from its final response or from how
 * its transfer ended, and queues that ending on the store; ended() answers
 * once it is written. Mostly on the upstream loop's thread, which must not
 * wait for the store.
 */
static void end_call(kcall *k) {
  idem_response *resp = &k->resp;
  end_arg *a = &k->end;
  size_t rf = 0, rt = 0, marked_len = 0;
  idem_exec *x;
  memset(resp, 0, sizeof *resp);
  memset(a, 0, sizeof *a);
  a->recovered = idem_call_outcome(k->call) == IDEM_RECOVER || k->stale_retry;
  if (k->final) {
    json_t *m = parse_message(k->final, k->final_len);
    json_t *result = json_object_get(m, "result");
    const char *rtype =
        json_string_value(json_object_get(result, "resultType"));
    int is_error = json_is_true(json_object_get(result, "isError"));
    if (!result || !mcp_member(k->final, k->final_len, 0, "result", &rf, &rt))
      a->why = WHY_RPC_ERROR;
    else if (rtype && strcmp(rtype, "input_required") == 0)
      a->why = WHY_INPUT;
    else if (is_error && !hx_opts->store_tool_errors)
      a->why = WHY_TOOL_ERROR;
    else if (rt - rf > hx_opts->max_result)
      a->why = WHY_TOO_BIG;
    else {
      a->why = WHY_RESULT;
      resp->status = is_error;
    }
    json_decref(m);
  } else if (k->oom) {
    a->why = WHY_NO_MEMORY;
  } else if (k->result == UP_NOT_SENT || k->result == UP_NO_FDS) {
    a->why = WHY_NOT_SENT;
  } else if (k->result == UP_OK && not_acted(k->status)) {
    a->why = WHY_HTTP_ERROR;
  } else if (k->result == UP_OK && (k->status < 200 || k->status >= 300)) {
    a->why = WHY_HTTP_UNSURE;
  } else if (k->too_big) {
    a->why = WHY_TOO_BIG;
  } else {
    a->why = WHY_LOST;
  }
  if (a->why == WHY_INPUT) {
    ask_for_input(k);
    return;
  }
  switch (a->why) {
  case WHY_RESULT:
    k->how = IDEM_EXEC_DONE;
    resp->body = k->final + rf;
    resp->body_len = rt - rf;
    if (k->stale_retry &&
        (k->marked = mcp_mark_result(resp->body, resp->body_len, 0, 1,
                                     &marked_len))) {
      /* Sent again after a stale task handle: no takeover the store knows
       * of, so the mark is kept in the result itself, for its replays. */
      resp->body = k->marked;
      resp->body_len = marked_len;
    }
    a->result = resp->body;
    a->result_len = resp->body_len;
    break;
  case WHY_TOO_BIG:
    k->how = IDEM_EXEC_UNKNOWN;
    break;
  case WHY_LOST:
  case WHY_HTTP_UNSURE:
  case WHY_NO_MEMORY: /* the tool may have acted: held as if unanswered */
    /* Cancelled and unconfirmed: it may also have stopped partway, which
     * no retry can mend; an operator settles it. */
    k->how = a->why == WHY_LOST && k->stopped == STOP_CANCEL
                 ? IDEM_EXEC_UNKNOWN
                 : IDEM_EXEC_LEAVE_IN_PROGRESS;
    break;
  default:
    k->how = IDEM_EXEC_NOT_DONE;
    break;
  }
  if (a->why == WHY_LOST && k->stopped == STOP_TIMEOUT)
    up_set_error(&k->owner->rs, "no answer within --call-timeout, %.1f s",
                 (double)hx_opts->call_timeout_ms / 1000);
  else if (a->why == WHY_LOST && k->stopped == STOP_CANCEL)
    up_set_error(&k->owner->rs,
                 "the client cancelled it and the server neither confirmed "
                 "nor answered within --cancel-wait");
  else if (a->why == WHY_LOST && k->stopped == STOP_LEASE)
    up_set_error(&k->owner->rs,
                 "this proxy lost the key's lease: the store could not "
                 "renew it in time, so the proxy stopped waiting");
  else if (a->why == WHY_LOST && !*up_error(&k->owner->rs))
    up_set_error(&k->owner->rs,
                 "its answer (HTTP %d) held no response to this call",
                 k->status);
  if (a->why == WHY_HTTP_UNSURE)
    up_set_error(&k->owner->rs, "it answered HTTP %d", k->status);
  if (a->why == WHY_NO_MEMORY)
    up_set_error(&k->owner->rs, "its result could not be kept");
  /* The ticker asks stop_call() under G.mu: it must not see the action
   * once the store may have freed it. */
  pthread_mutex_lock(&G.mu);
  x = k->exec;
  k->exec = NULL;
  pthread_mutex_unlock(&G.mu);
  if (idem_execute_end_async(x, k->how, resp, ended, k) == IDEM_OK)
    return;
  k->ending_exec = x;
  if (pool_submit(end_waiting, k) != 0)
    end_waiting(k); /* stopping: recorded here */
}

/* ---- claiming
 * ------------------------------------------------- */

static int claim(kcall *k);

/*
 * The transfer's abort check, asked while the transfer is active (so
 * k->stop_at holds still): by the upstream loop's thread, often, and by
 * the ticker under G.mu. It takes no lock: k->exec is taken out under G.mu
 * by end_call(), on the loop's thread when a transfer is active.
 * A call past --call-timeout, or whose lease this proxy lost, is stopped.
 * The server may have acted, or still act: end_call() holds the key for one
 * lease.
 */
static int stop_call(void *ctx) {
  kcall *k = ctx;
  int why = __atomic_load_n(&k->stopped, __ATOMIC_RELAXED);
  if (!why) {
    int64_t now = hx_mono_ms(),
            cancel = __atomic_load_n(&k->cancel_at, __ATOMIC_RELAXED);
    if (k->stop_at && now >= k->stop_at)
      why = STOP_TIMEOUT;
    else if (cancel && now >= cancel)
      why = STOP_CANCEL;
    else if (k->exec && idem_exec_lost(k->exec))
      why = STOP_LEASE;
    if (why)
      __atomic_store_n(&k->stopped, why, __ATOMIC_RELAXED);
  }
  return why != STOP_NONE;
}

static void forward(kcall *k) {
  hx *o = k->owner;
  pthread_mutex_lock(&G.mu);
  G.at_server++;
  k->refs++; /* the transfer's */
  k->at_server = 1;
  __atomic_store_n(&k->stopped, STOP_NONE, __ATOMIC_RELAXED);
  k->stop_at = hx_opts->call_timeout_ms
                   ? hx_mono_ms() + hx_opts->call_timeout_ms
                   : 0;
  /* The ticker watches it: at its limit, and every second for its lease. */
  tick_by(k->stop_at ? k->stop_at : hx_mono_ms() + 1000);
  pthread_mutex_unlock(&G.mu);
  hx_identity(o); /* the answer is read: not compressed */
  hx_prepare_request(o);
  o->rq.head = k_head;
  o->rq.data = k_data;
  o->rq.abort_check = stop_call;
  o->rq.abort_ctx = k;
  if (upstream_start(&o->rq, &o->rs, k_done, k) != 0) {
    pthread_mutex_lock(&G.mu);
    k->at_server = 0;
    pthread_mutex_unlock(&G.mu);
    kcall_unref(k);
    k->result = UP_NOT_SENT;
    up_set_error(&o->rs, "out of memory");
    k->ending = 1;
    end_call(k);
  }
}

/*
 * Whether the task handle r, recorded for k's key, has outlived its ttl
 * (counted from when the record was completed), read from the record that
 * still holds it.
 */
static int task_stale(const kcall *k, const idem_response *r, int64_t ttl) {
  idem_id id = {k->tenant, k->tool, k->key};
  idem_record *rec = NULL;
  int stale = idem_get(hx_store, &id, &rec) == IDEM_OK &&
              rec->state == IDEM_STATE_COMPLETED && rec->has_response &&
              rec->updated_ms + ttl <= wall_ms() &&
              strcmp(rec->fingerprint, k->fp) == 0 &&
              rec->response.body_len == r->body_len &&
              memcmp(rec->response.body, r->body, r->body_len) == 0;
  idem_record_free(rec);
  return stale;
}

static void claim_options(const kcall *k, idem_execute_options *eo) {
  memset(eo, 0, sizeof *eo);
  eo->call.lease_ms = hx_opts->lease_ms;
  eo->call.retention_ms = retention(k);
  eo->call.on_expired_lease =
      hx_opts->on_unknown_fail ? IDEM_EXPIRED_REPORT : IDEM_EXPIRED_TAKE_OVER;
  eo->forget_request = !hx_opts->keep_requests; /* the arguments stay off disk */
}

static void replay_task(void *arg);
static void claim_or_refuse(kcall *k);

/* The claim's answer (rc, x, call): on a thread of the store's, a
 * worker's, or the claimer's when the store knew it at once. */
static void decided(kcall *k, int rc, idem_exec *x, idem_call *call) {
  char msg[2048]; /* the key and the tool twice: 255 bytes each */
  if (rc != IDEM_OK || !call) {
    int busy = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE;
    int bad = rc == IDEM_EINVAL;
    error_arg e = {busy  ? MCP_E_STORE
                   : bad ? MCP_E_BAD_KEY
                         : MCP_E_INTERNAL,
                   msg,
                   busy  ? "store_unavailable"
                   : bad ? "bad_key"
                         : "internal",
                   NULL, busy ? 1000 : 0};
    snprintf(msg, sizeof msg,
             busy  ? "idem mcp: the idempotency store is unavailable (%s); "
                     "nothing was sent to the server. Retry with the same "
                     "key in a few seconds."
             : bad ? "idem mcp: this call cannot be given its key (%s); "
                     "nothing was sent to the server. A key is 1 to 255 "
                     "printable ASCII bytes."
                   : "idem mcp: this call cannot be given its key (%s); "
                     "nothing was sent to the server.",
             idem_errmsg());
    idem_call_free(call);
    answer_all(k, answer_error, &e);
    kcall_unref(k);
    return;
  }
  idem_call_free(k->call);
  k->call = call;
  k->exec = x;
  if (x) {
    pthread_mutex_lock(&G.mu);
    if (!k->in_table) {
      /* Claimed with other arguments than the call here that held the key,
       * which let it go meanwhile and has yet to leave the table: this one
       * holds it now, and goes first in the table, where retries attach,
       * a wait for input is timed and a stop looks. */
      k->in_table = 1;
      k->next = G.calls;
      G.calls = k;
    }
    pthread_mutex_unlock(&G.mu);
    forward(k);
    return;
  }
  switch (idem_call_outcome(call)) {
  case IDEM_IN_FLIGHT:
    if (hx_mono_ms() < k->wait_until) {
      /* Asked again by the ticker shortly: no worker waits meanwhile. */
      int64_t ms = idem_call_retry_after_ms(call);
      pthread_mutex_lock(&G.mu);
      k->retry_at = hx_mono_ms() + (ms > 0 && ms < 200 ? ms : 200);
      k->pnext = G.parked;
      G.parked = k;
      tick_by(k->retry_at);
      pthread_mutex_unlock(&G.mu);
      return;
    }
    {
      int64_t ms = idem_call_retry_after_ms(call);
      error_arg e = {MCP_E_IN_FLIGHT, msg, "in_flight",
                     "idempotency_key_in_progress", ms < 1 ? 1 : ms};
      snprintf(msg, sizeof msg,
               "idem mcp: another attempt of this call (key \"%s\", tool "
               "%s) holds the key: another proxy on the same store, or one "
               "that stopped while the call was at the server. Nothing was "
               "sent to the server. Its lease ends in %.1f s: retry with "
               "the same key then.",
               k->key, k->tool, (double)e.retry_after_ms / 1000);
      answer_all(k, answer_error, &e);
    }
    break;
  case IDEM_REPLAY: {
    const idem_response *r = idem_call_response(call);
    replay_arg ra = {r->body, r->body_len,
                     idem_call_recovered(call) || k->stale_retry};
    int64_t ttl = 0;
    if (!is_task(r->body, r->body_len, &ttl)) {
      cache_put(k, r->body, r->body_len, ra.recovered, retention(k));
      answer_all(k, answer_replay, &ra);
      break;
    }
    if (!ttl) {
      answer_all(k, answer_task_replay, &ra);
      break;
    }
    /* Whether the handle is stale is read from the store: on a worker,
     * not on the store's own thread; still counted as a claim, for the
     * drain. */
    pthread_mutex_lock(&G.mu);
    G.claiming++;
    pthread_mutex_unlock(&G.mu);
    if (pool_submit(replay_task, k) != 0)
      replay_task(k);
    return;
  }
  case IDEM_CONFLICT: {
    error_arg e = {MCP_E_CONFLICT, msg, "conflict", "idempotency_key_conflict",
                   0};
    snprintf(msg, sizeof msg,
             "idem mcp: key \"%s\" was already used with different "
             "arguments for tool %s; nothing was sent to the server. Use "
             "a new key for a new action; to retry the earlier action, "
             "send its arguments unchanged.",
             k->key, k->tool);
    answer_all(k, answer_error, &e);
    break;
  }
  default: {
    error_arg e = {MCP_E_UNKNOWN, msg, "unknown", "idempotency_outcome_unknown",
                   0};
    snprintf(msg, sizeof msg,
             "idem mcp: an earlier attempt of this call (key \"%s\", tool "
             "%s) ended without a result that could be kept, so the tool "
             "may or may not have acted. This key is refused until an "
             "operator settles it: `idem keys resolve %s --operation %s "
             "--failed` if it did not act (a retry then acts), or "
             "--completed if it did.",
             k->key, k->tool, k->key, k->tool);
    answer_all(k, answer_error, &e);
    break;
  }
  }
  kcall_unref(k);
}

/* A replayed task handle with a ttl: the same handle while the task may
 * live, and the call sent again (or refused) once its ttl has passed. */
static void task_replay(kcall *k) {
  idem_id id = {k->tenant, k->tool, k->key};
  const idem_response *r = idem_call_response(k->call);
  replay_arg ra = {r->body, r->body_len,
                   idem_call_recovered(k->call) || k->stale_retry};
  char msg[2048]; /* the key and the tool twice, the tenant */
  int64_t ttl = 0;
  is_task(r->body, r->body_len, &ttl);
  if (!task_stale(k, r, ttl)) {
    answer_all(k, answer_task_replay, &ra);
  } else if (!hx_opts->on_unknown_fail && !k->stale_retry &&
             idem_delete(hx_store, &id) == IDEM_OK) {
    /* The record is gone: the call is claimed again, as a call of its
     * own, and its answer marked recovered. */
    cli_error("mcp",
              "key '%s' (tool %s): its task's ttl has passed, so it may "
              "have acted; sending the call again (--on-unknown forward); "
              "its result will be marked recovered",
              k->key, k->tool);
    k->stale_retry = 1;
    claim_or_refuse(k);
    return;
  } else {
    error_arg e = {MCP_E_UNKNOWN, msg, "unknown",
                   "idempotency_outcome_unknown", 0};
    mcp_stale_task_message(msg, sizeof msg, k->key, k->tool, k->tenant,
                           "the task's ttl has passed");
    answer_all(k, answer_error, &e);
  }
  kcall_unref(k);
}

static void replay_task(void *arg) {
  task_replay(arg);
  pthread_mutex_lock(&G.mu);
  G.claiming--;
  pthread_cond_broadcast(&G.cond);
  pthread_mutex_unlock(&G.mu);
}

static void claimed(void *ctx, int rc, idem_exec *x, idem_call *call) {
  decided(ctx, rc, x, call);
  /* Counted until decided, for the drain: a call sent on has been counted
   * at the server by now. */
  pthread_mutex_lock(&G.mu);
  G.claiming--;
  pthread_cond_broadcast(&G.cond);
  pthread_mutex_unlock(&G.mu);
}

/* The claim on a worker, when the store would not queue it (out of memory,
 * or an argument it refuses: the blocking call then says why). */
static void claim_waiting(void *arg) {
  kcall *k = arg;
  idem_id id = {k->tenant, k->tool, k->key};
  idem_execute_options eo;
  idem_call *call = NULL;
  idem_exec *x = NULL;
  int rc;
  claim_options(k, &eo);
  eo.fingerprint = k->fp; /* taken once, as the call came in */
  rc = idem_execute_begin(hx_store, &id, k->request, k->request_len, &eo, &x,
                          &call);
  claimed(k, rc, x, call);
}

/* Queues k's claim on the store (no thread waits for it): claimed() goes
 * on once it is decided. 0, or -1 when the proxy is stopping. */
static int claim(kcall *k) {
  idem_id id = {k->tenant, k->tool, k->key};
  idem_execute_options eo;
  claim_options(k, &eo);
  eo.fingerprint = k->fp; /* taken once, as the call came in */
  pthread_mutex_lock(&G.mu);
  G.claiming++;
  pthread_mutex_unlock(&G.mu);
  if (idem_execute_begin_async(hx_store, &id, k->request, k->request_len, &eo,
                               claimed, k) == IDEM_OK ||
      pool_submit(claim_waiting, k) == 0)
    return 0;
  pthread_mutex_lock(&G.mu);
  G.claiming--;
  pthread_cond_broadcast(&G.cond);
  pthread_mutex_unlock(&G.mu);
  return -1;
}

static void claim_or_refuse(kcall *k) {
  if (claim(k) != 0) {
    error_arg e = {MCP_E_INTERNAL,
                   "idem mcp: the proxy is stopping; nothing "
                   "was sent to the server",
                   "internal", NULL, 0};
    answer_all(k, answer_error, &e);
    kcall_unref(k);
  }
}

/* ---- the entry
 * ------------------------------------------------------------------- */

static void enter(kcall *k, hx *h);

void hx_keyed_call(hx *h, const char *tool, const char *key, int in_arg) {
  kcall *k;
  char implicit[sizeof MCP_IMPLICIT_PREFIX + IDEM_FINGERPRINT_SIZE];
  if (key && mcp_is_implicit(key)) {
    hx_answer_rpc_error(h, MCP_E_BAD_KEY,
                        "idem mcp: keys beginning \"" MCP_IMPLICIT_PREFIX
                        "\" are the ones the proxy makes (--implicit-keys); "
                        "choose another key. Nothing was sent to the server.",
                        json_pack("{s:s}", "idem", "bad_key"));
    return;
  }
  if (key && idem_key_check(key) != IDEM_OK) {
    char m[600];
    snprintf(m, sizeof m,
             "idem mcp: the idempotency key is not valid (%s): use 1-255 "
             "printable ASCII characters (0x21-0x7e). Nothing was sent to "
             "the server.",
             idem_errmsg());
    hx_answer_rpc_error(h, MCP_E_BAD_KEY, m,
                        json_pack("{s:s}", "idem", "bad_key"));
    return;
  }
  if (!(k = calloc(1, sizeof *k)))
    goto oom;
  k->refs = 1;
  k->tenant = strdup(h->tenant);
  k->tool = strdup(tool);
  k->key = key ? strdup(key) : NULL;
  k->request = mcp_request_text(h->body, h->len, tool,
                                in_arg == 2 ? hx_opts->offer_key_argument
                                : in_arg    ? hx_opts->key_argument
                                            : NULL,
                                &k->request_len);
  if (!k->tenant || !k->tool || (key && !k->key) || !k->request) {
    kcall_unref(k);
    goto oom;
  }
  /* A lone surrogate in the arguments (JavaScript writes one for a string
   * cut between the halves of a pair) is read as the code unit it is. */
  if (idem_fingerprint_with(k->request, k->request_len,
                            IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES,
                            k->fp) != IDEM_OK) {
    char m[800];
    snprintf(m, sizeof m,
             "idem mcp: the arguments of this call cannot be fingerprinted "
             "(%s); nothing was sent to the server.",
             idem_errmsg());
    hx_answer_rpc_error(h, MCP_E_INTERNAL, m, error_data(k, "internal", NULL));
    kcall_unref(k);
    return;
  }
  if (!k->key) {
    /* The same tool with the same arguments, by the same tenant, is the
     * same call. */
    mcp_implicit_key(k->fp, implicit);
    if (!(k->key = strdup(implicit))) {
      kcall_unref(k);
      goto oom;
    }
  }
  {
    /* A result kept in memory: replayed here, nothing read. */
    char *n = cache_name(k), *body = NULL;
    size_t blen = 0;
    int recovered = 0;
    if (n &&
        mcp_cache_get(n, k->key, k->fp, wall_ms(), &body, &blen, &recovered)) {
      free(n);
      send_replay(k, h, body, blen, recovered);
      free(body);
      kcall_unref(k);
      return;
    }
    free(n);
  }
  hx_ref(h);
  enter(k, h);
  return;
oom:
  hx_answer_rpc_error(h, MCP_E_INTERNAL,
                      "idem mcp: out of memory; nothing was sent to the "
                      "server",
                      NULL);
}

/* A retry attached to a call that freed its key without acting: claimed
 * again, as a call of its own. */
static void resubmit(const kcall *k, hx *h) {
  kcall *c = calloc(1, sizeof *c);
  if (c) {
    c->refs = 1;
    c->tenant = strdup(k->tenant);
    c->tool = strdup(k->tool);
    c->key = strdup(k->key);
    c->request = malloc(k->request_len + 1);
    memcpy(c->fp, k->fp, sizeof c->fp);
  }
  if (!c || !c->tenant || !c->tool || !c->key || !c->request) {
    if (c)
      kcall_unref(c);
    hx_answer_rpc_error(h, MCP_E_INTERNAL,
                        "idem mcp: out of memory; nothing was sent to the "
                        "server",
                        NULL);
    return;
  }
  memcpy(c->request, k->request, k->request_len + 1);
  c->request_len = k->request_len;
  hx_ref(h);
  enter(c, h);
}

/* The call k of request h (whose reference k takes over) attached to the
 * same call in flight here, or claimed. */
static void enter(kcall *k, hx *h) {
  kcall *same = NULL;
  int64_t now = hx_mono_ms();
  pthread_mutex_lock(&G.mu);
  for (kcall *c = G.calls; c; c = c->next)
    if (strcmp(c->tenant, k->tenant) == 0 && strcmp(c->tool, k->tool) == 0 &&
        strcmp(c->key, k->key) == 0) {
      same = c;
      break;
    }
  if (same && strcmp(same->fp, k->fp) == 0 && same->input == 2) {
    /* The next round of a call that asked for input: it goes to the server
     * under the key still held, as the request the client sent now. */
    same->input = 0;
    pthread_mutex_unlock(&G.mu);
    same->owner = h;
    forward(same);
    kcall_unref(k);
    return;
  }
  if (same && strcmp(same->fp, k->fp) == 0 && same->input == 1 &&
      !same->next_round) {
    same->next_round = h; /* sent once the last round's transfer ends */
    pthread_mutex_unlock(&G.mu);
    kcall_unref(k);
    return;
  }
  if (same && strcmp(same->fp, k->fp) == 0) {
    /* The same call is in flight here: this retry waits for its result. */
    if (hx_opts->attach_wait_ms == 0) {
      pthread_mutex_unlock(&G.mu);
      answer_in_flight_here(k, h);
      hx_unref(h);
      kcall_unref(k);
      return;
    }
    h->deadline = now + hx_opts->attach_wait_ms;
    h->wnext = same->waiters;
    same->waiters = h;
    tick_by(h->deadline); /* the ticker times it */
    pthread_mutex_unlock(&G.mu);
    kcall_unref(k);
    return;
  }
  k->owner = h;
  k->wait_until = now + hx_opts->attach_wait_ms;
  if (!same) {
    /* Another call's key with other arguments stays out of the table: the
     * store answers it (a conflict). */
    k->in_table = 1;
    k->next = G.calls;
    G.calls = k;
  }
  pthread_mutex_unlock(&G.mu);
  claim_or_refuse(k);
}

/* Answers attached retries whose --attach-wait has run out. */
static void *ticker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&G.mu);
  for (;;) {
    int64_t now = hx_mono_ms(), next = now + 60000;
    hx *late = NULL;
    kcall *lk = NULL;
    for (kcall *k = G.calls; k && !late; k = k->next)
      for (hx **pp = &k->waiters; *pp; pp = &(*pp)->wnext) {
        if ((*pp)->deadline <= now) {
          late = *pp;
          *pp = late->wnext;
          late->wnext = NULL;
          lk = k;
          k->refs++;
          break;
        }
        if ((*pp)->deadline < next)
          next = (*pp)->deadline;
      }
    for (kcall **pp = &G.parked; *pp && !late && !lk;) {
      kcall *k = *pp;
      if (k->retry_at <= now) {
        *pp = k->pnext;
        pthread_mutex_unlock(&G.mu);
        claim_or_refuse(k);
        pthread_mutex_lock(&G.mu);
        pp = &G.parked; /* the list may have changed meanwhile */
        now = hx_mono_ms();
        continue;
      }
      if (k->retry_at < next)
        next = k->retry_at;
      pp = &k->pnext;
    }
    for (kcall *k = G.calls; k && !late && !lk; k = k->next)
      if (k->input == 2) {
        if (k->input_until <= now || stopping_input) {
          k->input = 3; /* released by a worker */
          lk = k;
        } else if (k->input_until < next) {
          next = k->input_until;
        }
      }
    if (!late && lk) {
      pthread_mutex_unlock(&G.mu);
      if (pool_submit(input_left, lk) != 0)
        input_left(lk);
      pthread_mutex_lock(&G.mu);
      continue;
    }
    if (late) {
      pthread_mutex_unlock(&G.mu);
      answer_in_flight_here(lk, late);
      hx_unref(late);
      kcall_unref(lk);
      pthread_mutex_lock(&G.mu);
      continue;
    }
    /* Calls at the server: stopped by the upstream loop, which asks
     * stop_call(), once past --call-timeout or their lease lost (asked
     * every second: the lease's end is the store's to tell). */
    int stop_due = 0, watched = 0;
    for (kcall *k = G.calls; k; k = k->next) {
      if (!k->at_server || __atomic_load_n(&k->stopped, __ATOMIC_RELAXED))
        continue;
      watched = 1;
      int64_t cancel = __atomic_load_n(&k->cancel_at, __ATOMIC_RELAXED);
      if (stop_call(k))
        stop_due = 1; /* the loop ends it at its next check */
      else if (k->stop_at && k->stop_at < next)
        next = k->stop_at;
      if (cancel && cancel < next)
        next = cancel;
    }
    if (watched && now + 1000 < next)
      next = now + 1000;
    if (stop_due)
      upstream_check_aborts();
    struct timespec ts = cli_mono_deadline(next - now);
    G.tick_at = next;
    pthread_cond_timedwait(&G.tick, &G.mu, &ts);
    G.tick_at = 0;
  }
  return NULL;
}

int hx_keyed_start(void) {
  /* Its waits are timed by the monotonic clock: a wall clock stepped back
   * must not hold an attached retry past its --attach-wait. */
  if (cli_cond_init_mono(&G.cond) != 0 || cli_cond_init_mono(&G.tick) != 0)
    return -1;
  if (pthread_create(&G.ticker, NULL, ticker, NULL) != 0)
    return -1;
  pthread_detach(G.ticker);
  return 0;
}

/* Whether a key is held for a next round of input (or being let go):
 * under G.mu. */
static int input_held(void) {
  for (kcall *k = G.calls; k; k = k->next)
    if (k->input)
      return 1;
  return 0;
}

int hx_keyed_drain(int64_t ms) {
  int64_t until = hx_mono_ms() + ms;
  int left;
  pthread_mutex_lock(&G.mu);
  stopping_input = 1; /* the ticker frees the keys held for input */
  for (kcall *k = G.parked; k; k = k->pnext)
    k->retry_at = k->wait_until = 0; /* asked once more, then answered */
  pthread_cond_signal(&G.tick);
  /* Until the claims queued have been decided, the calls at the server
   * have ended (their records written), the parked ones have been
   * answered, and the keys held for input have been let go (the tool has
   * not acted for them): a stop that did not wait for the last would leave
   * such a key held in the store until its lease ran out. */
  while ((G.at_server > 0 || G.claiming > 0 || G.parked || input_held()) &&
         hx_mono_ms() < until) {
    struct timespec ts = cli_mono_deadline(50);
    pthread_cond_timedwait(&G.cond, &G.mu, &ts);
  }
  left = G.at_server + G.claiming;
  pthread_mutex_unlock(&G.mu);
  return left;
}

int hx_keyed_cancel(hx *h, json_t *params) {
  json_t *rid = json_object_get(params, "requestId");
  const char *sid = hx_header(h, "Mcp-Session-Id");
  char *t = rid ? mcp_id_text(rid) : NULL;
  int found = 0;
  if (!t)
    return 0;
  pthread_mutex_lock(&G.mu);
  for (kcall *k = G.calls; k && !found; k = k->next) {
    hx *all[2] = {k->owner, k->waiters};
    for (int i = 0; i < 2 && !found; i++)
      for (hx *w = all[i]; w && !found; w = i ? w->wnext : NULL) {
        const char *ws = hx_header(w, "Mcp-Session-Id");
        found = w->id && strcmp(w->id, t) == 0 &&
                strcmp(w->tenant, h->tenant) == 0 &&
                ((!ws && !sid) || (ws && sid && strcmp(ws, sid) == 0));
        if (found && hx_opts->cancel_pass && i == 0 && !k->waiters &&
            k->at_server &&
            !__atomic_load_n(&k->cancel_at, __ATOMIC_RELAXED)) {
          /* --keyed-cancel pass: the call's own request, no retry waiting
           * for it, at the server: the cancellation goes on to it (the
           * request's id and session are the server's too), which has
           * --cancel-wait to confirm. */
          int64_t at = hx_mono_ms() + hx_opts->cancel_wait_ms;
          __atomic_store_n(&k->cancel_at, at, __ATOMIC_RELAXED);
          tick_by(at);
          found = -1;
        }
      }
  }
  pthread_mutex_unlock(&G.mu);
  free(t);
  return found > 0;
}
