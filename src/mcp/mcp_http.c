/*
 * mcp_http.c -- `idem mcp --listen`: MCP's Streamable HTTP transport in
 * front of one remote MCP endpoint, with keyed tools/call made safe.
 *
 * It stands on the gateway's machinery (src/serve/): libmicrohttpd serves
 * the clients on one epoll thread with suspended connections, libcurl's
 * multi interface forwards on one loop thread (upstream.c, in its streaming
 * mode), and a few store workers (pool.c) claim and end keys. No thread
 * waits for a server: thousands of open streams cost memory, not threads.
 *
 * An exchange (struct hx) is one client request and what answers it. Its
 * answer is either whole (a replay, a refusal, a buffered JSON answer) or a
 * stream: the upstream's head is passed on as soon as it is in, and its
 * body as it arrives, through a libmicrohttpd content reader that suspends
 * the connection while it has nothing to send and is resumed by the next
 * bytes (the only way libmicrohttpd allows without busy waiting).
 *
 * Everything passes through unchanged except a tools/call carrying a key
 * (mcp_http_keyed.c).
 */
#include "mcp_http.h"
#include "../serve/principal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

const mcp_opts *hx_opts;
idem_store *hx_store;
static serve_config sc;
static char origin[2048];   /* scheme://host[:port] of --upstream */
static char mcp_path[2048]; /* its path: the MCP endpoint */
static int stopping;
static int unfinished; /* requests decided whose answer has not all gone */

int64_t hx_mono_ms(void) { return (int64_t)cli_now_ms(); }

int hx_buf_add(char **buf, size_t *len, size_t *cap, const char *p, size_t n) {
  if (n == 0)
    return 0;
  if (*len + n > *cap) {
    size_t c = *cap ? *cap : 4096;
    while (c < *len + n)
      c *= 2;
    char *b = realloc(*buf, c);
    if (!b)
      return -1;
    *buf = b;
    *cap = c;
  }
  memcpy(*buf + *len, p, n);
  *len += n;
  return 0;
}

size_t hx_event_end(const char *s, size_t n, size_t from) {
  for (size_t pos = from; pos < n;) {
    const char *nl = memchr(s + pos, '\n', n - pos);
    size_t at;
    if (!nl)
      return 0;
    at = (size_t)(nl - s);
    if (at == pos || (at == pos + 1 && s[pos] == '\r'))
      return at + 1;
    pos = at + 1;
  }
  return 0;
}

char *hx_event_data(const char *ev, size_t n, size_t *len) {
  char *data = NULL;
  size_t dlen = 0, cap = 0;
  int any = 0;
  for (const char *p = ev, *end = ev + n; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t ll = nl ? (size_t)(nl - p) : (size_t)(end - p);
    if (ll && p[ll - 1] == '\r')
      ll--;
    if (ll >= 5 && memcmp(p, "data:", 5) == 0) {
      const char *v = p + 5;
      size_t vl = ll - 5;
      if (vl && *v == ' ')
        v++, vl--;
      if ((any && hx_buf_add(&data, &dlen, &cap, "\n", 1) != 0) ||
          hx_buf_add(&data, &dlen, &cap, v, vl) != 0 ||
          hx_buf_add(&data, &dlen, &cap, "", 1) != 0) {
        free(data);
        errno = ENOMEM;
        return NULL;
      }
      dlen--; /* the NUL stays after the data, not in it */
      any = 1;
    }
    p = nl ? nl + 1 : end;
  }
  *len = dlen;
  return data;
}

/* ---- exchanges -------------------------------------------------------------
 */

void hx_ref(hx *h) {
  pthread_mutex_lock(&h->mu);
  h->refs++;
  pthread_mutex_unlock(&h->mu);
}

static void hx_free(hx *h) {
  for (size_t i = 0; i < h->nh; i++) {
    free(h->h[i].name);
    free(h->h[i].value);
  }
  free(h->h);
  for (size_t i = 0; i < h->nah; i++) {
    free(h->ah[i].name);
    free(h->ah[i].value);
  }
  free(h->ah);
  upstream_response_free(&h->rs);
  free(h->uri);
  free(h->body);
  free(h->out);
  free(h->seen);
  free(h->id);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

void hx_unref(hx *h) {
  int left;
  pthread_mutex_lock(&h->mu);
  left = --h->refs;
  pthread_mutex_unlock(&h->mu);
  if (left == 0)
    hx_free(h);
}

/* Wakes the connection when it is suspended (a head held goes out with
 * it); h->mu held. */
static void wake(hx *h) {
  h->head_held = 0;
  if (h->suspended && !h->gone) {
    h->suspended = 0;
    MHD_resume_connection(h->c);
    upstream_driven_due(); /* the daemon runs on the upstream loop */
  }
}

/* Copies headers to the answer's own (the end-to-end ones; the caller
 * has dropped hop-by-hop ones). h->mu held. 0 or -1. */
static int keep_headers(hx *h, const up_header *hs, size_t n) {
  if (!n)
    return 0;
  h->ah = calloc(n, sizeof *h->ah);
  if (!h->ah)
    return -1;
  for (size_t i = 0; i < n; i++) {
    char *name = strdup(hs[i].name), *value = strdup(hs[i].value);
    if (!name || !value) {
      /* The headers kept so far go out; never one without its name or
       * value. */
      free(name);
      free(value);
      return -1;
    }
    h->ah[i].name = name;
    h->ah[i].value = value;
    h->nah++;
  }
  return 0;
}

/*
 * Heads held. A keyed call's answer has its head first (as soon as the
 * server's event stream begins) and its message only after the record. Sent
 * at once, the head goes out alone, and the message and the end of the
 * chunked stream follow in two more writes after the record (libmicrohttpd
 * reads the end in a second run): three wake-ups of the client where one
 * does. So a keyed call's head waits for the answer's first bytes (an event
 * passed on as it comes) or its end (then the whole answer goes out in one
 * write, with its length), HX_HEAD_HOLD_MS at most: after that it goes
 * alone, so that a slow tool's client still sees its stream open. One
 * client, fresh keys, alternating with the proxy that did not hold: 1.03
 * to 1.08x the calls/s in five runs. Calls passed through do not hold:
 * there the client's wake-up for the head overlaps the server's work, and
 * holding gained nothing (0.84 to 1.10x, median 1.0, in eight runs). The
 * list is the upstream loop's own (heads are made there and the daemon
 * runs there), oldest first; a head woken sooner stays on it until its
 * time or the end of its request.
 */
static hx *held_first, *held_last;

static void held_unlink(hx *h) {
  if (h->hprev)
    h->hprev->hnext = h->hnext;
  else
    held_first = h->hnext;
  if (h->hnext)
    h->hnext->hprev = h->hprev;
  else
    held_last = h->hprev;
  h->hprev = h->hnext = NULL;
  h->in_held = 0;
}

/* upstream_after()'s: the heads whose time has come go out alone. */
static void held_due(void) {
  int64_t now = hx_mono_ms();
  while (held_first && held_first->held_until <= now) {
    hx *h = held_first;
    held_unlink(h);
    pthread_mutex_lock(&h->mu);
    if (h->head_held)
      wake(h);
    pthread_mutex_unlock(&h->mu);
  }
  if (held_first)
    upstream_after((int)(held_first->held_until - now), held_due);
}

/* Holds h's head (h->mu held): see above. */
static void hold(hx *h) {
  h->head_held = 1;
  h->held_until = hx_mono_ms() + HX_HEAD_HOLD_MS;
  if (!h->in_held) {
    h->in_held = 1;
    h->hnext = NULL;
    h->hprev = held_last;
    if (held_last)
      held_last->hnext = h;
    else
      held_first = h;
    held_last = h;
  }
  upstream_after(HX_HEAD_HOLD_MS, held_due);
}

int hx_answer_head(hx *h, int status, const up_header *hs, size_t n,
                   int64_t length, int held) {
  int rc;
  pthread_mutex_lock(&h->mu);
  rc = keep_headers(h, hs, n);
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(hs[i].name, "Content-Type") == 0 &&
        strncasecmp(hs[i].value, "text/event-stream", 17) == 0)
      h->sse_out = 1;
  h->status = status;
  h->streaming = 1;
  h->length = length;
  h->ready = 1;
  if (held && h->out_len == h->out_off && !h->out_end && !h->peer_closed)
    hold(h);
  else
    wake(h);
  pthread_mutex_unlock(&h->mu);
  return rc;
}

/* Appends to the stream's buffer; h->mu held. */
static int append(hx *h, const char *p, size_t n) {
  if (n == 0)
    return 0;
  if (h->out_off && h->out_len + n > h->out_cap) {
    /* What was read is dropped before the buffer grows: a long stream's
     * buffer holds what its client has not read, not all it ever sent. */
    memmove(h->out, h->out + h->out_off, h->out_len - h->out_off);
    h->out_len -= h->out_off;
    h->out_off = 0;
  }
  return hx_buf_add(&h->out, &h->out_len, &h->out_cap, p, n);
}

/*
 * Appends one event "message" whose data is data[0..n) (h->mu held). SSE
 * ends a line at CRLF, LF or CR, and joins the data lines of one event
 * with LF: each line of the data goes on a "data:" line of its own, so
 * that data holding line ends (JSON may, between its tokens) arrives whole
 * rather than cut at its first line end.
 */
static int append_event(hx *h, const char *data, size_t n) {
  const char *p = data, *end = data + n;
  if (append(h, "event: message\n", 15) != 0)
    return -1;
  for (;;) {
    const char *e = p;
    while (e < end && *e != '\n' && *e != '\r')
      e++;
    if (append(h, "data: ", 6) != 0 || append(h, p, (size_t)(e - p)) != 0 ||
        append(h, "\n", 1) != 0)
      return -1;
    if (e == end)
      break;
    p = e + (*e == '\r' && e + 1 < end && e[1] == '\n' ? 2 : 1);
  }
  return append(h, "\n", 1);
}

/* hx_stream() and hx_stream_event(): p is bytes, or an event's data. */
static int stream(hx *h, const char *p, size_t n, int event) {
  int rc = 0;
  pthread_mutex_lock(&h->mu);
  if (h->gone || h->out_end) {
    rc = h->gone ? -1 : 0;
  } else if (h->out_len - h->out_off + n > HX_MAX_BUFFERED) {
    /* A client that does not read its stream: it is cut off rather than
     * held in memory without bound. */
    h->out_end = h->out_broken = 1;
    wake(h);
    rc = -1;
  } else if ((event ? append_event(h, p, n) : append(h, p, n)) != 0) {
    h->out_end = h->out_broken = 1;
    wake(h);
    rc = -1;
  } else {
    wake(h);
  }
  pthread_mutex_unlock(&h->mu);
  return rc;
}

int hx_stream(hx *h, const char *p, size_t n) { return stream(h, p, n, 0); }

int hx_stream_event(hx *h, const char *data, size_t n) {
  return stream(h, data, n, 1);
}

void hx_stream_end(hx *h, int broken) {
  pthread_mutex_lock(&h->mu);
  if (!h->out_end) {
    h->out_end = 1;
    h->out_broken = broken;
  }
  wake(h);
  pthread_mutex_unlock(&h->mu);
}

void hx_answer_whole(hx *h, int status, const char *type, const char *body,
                     size_t len, const up_header *hs, size_t n) {
  pthread_mutex_lock(&h->mu);
  if (h->ready && h->streaming) {
    /* The head went out already: the rest of the stream is this body, as
     * an event when the stream is one. */
    if (!h->out_end &&
        (h->sse_out ? append_event(h, body, len) : append(h, body, len)) != 0)
      h->out_broken = 1;
    h->out_end = 1;
    wake(h);
    pthread_mutex_unlock(&h->mu);
    return;
  }
  keep_headers(h, hs, n);
  h->status = status;
  h->streaming = 1;
  h->length = (int64_t)len;
  h->type = type;
  h->out_len = h->out_off = 0;
  if (append(h, body, len) != 0)
    h->out_broken = 1;
  h->out_end = 1;
  h->ready = 1;
  wake(h);
  pthread_mutex_unlock(&h->mu);
}

/*
 * libmicrohttpd does not watch a suspended connection, so a client that
 * closes a stream while it waits for the server (a GET stream, a slow
 * call) would be noticed only with the next bytes, and the upstream's
 * stream held until then. The watcher polls the sockets of the streams
 * every second for a closed peer; such a stream then ends, and its
 * forward with it. Registered from the queueing of the answer until the
 * request completes (under the lock, so that a socket polled is open).
 */
static struct {
  pthread_mutex_t mu;
  hx *list;
  int n;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void watch_add(hx *h) {
  pthread_mutex_lock(&W.mu);
  h->rprev = NULL;
  h->rnext = W.list;
  if (W.list)
    W.list->rprev = h;
  W.list = h;
  h->watched = 1;
  W.n++;
  pthread_mutex_unlock(&W.mu);
}

static void watch_remove(hx *h) {
  pthread_mutex_lock(&W.mu);
  if (h->watched) {
    if (h->rprev)
      h->rprev->rnext = h->rnext;
    else
      W.list = h->rnext;
    if (h->rnext)
      h->rnext->rprev = h->rprev;
    h->watched = 0;
    W.n--;
  }
  pthread_mutex_unlock(&W.mu);
}

static void *watcher(void *arg) {
  struct pollfd *fds = NULL;
  hx **who = NULL;
  size_t cap = 0;
  (void)arg;
  for (;;) {
    size_t n = 0;
    sleep(1);
    pthread_mutex_lock(&W.mu);
    if ((size_t)W.n > cap) {
      size_t c = (size_t)W.n * 2;
      struct pollfd *f = realloc(fds, c * sizeof *f);
      hx **w = f ? realloc(who, c * sizeof *w) : NULL;
      if (f)
        fds = f;
      if (w) {
        who = w;
        cap = c;
      }
    }
    for (hx *h = W.list; h && n < cap; h = h->rnext) {
      int idle;
      pthread_mutex_lock(&h->mu);
      idle = h->suspended && !h->gone && h->fd >= 0;
      pthread_mutex_unlock(&h->mu);
      if (!idle)
        continue;
      fds[n].fd = h->fd;
      fds[n].events = POLLRDHUP;
      fds[n].revents = 0;
      who[n++] = h;
    }
    if (n && poll(fds, n, 0) > 0)
      for (size_t i = 0; i < n; i++)
        if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) {
          hx *h = who[i];
          pthread_mutex_lock(&h->mu);
          h->peer_closed = 1;
          wake(h);
          pthread_mutex_unlock(&h->mu);
        }
    pthread_mutex_unlock(&W.mu);
  }
  return NULL;
}

/* The content reader of a streamed answer. */
static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
  hx *h = cls;
  ssize_t n;
  (void)pos;
  pthread_mutex_lock(&h->mu);
  if (h->out_off < h->out_len) {
    size_t k = h->out_len - h->out_off;
    if (k > max)
      k = max;
    memcpy(buf, h->out + h->out_off, k);
    h->out_off += k;
    if (h->out_off == h->out_len)
      h->out_off = h->out_len = 0;
    n = (ssize_t)k;
  } else if (h->out_end || h->peer_closed) {
    n = h->out_broken || h->peer_closed ? MHD_CONTENT_READER_END_WITH_ERROR
                                        : MHD_CONTENT_READER_END_OF_STREAM;
  } else {
    /* Nothing yet: wait, suspended, for the next bytes. */
    h->suspended = 1;
    MHD_suspend_connection(h->c);
    n = 0;
  }
  pthread_mutex_unlock(&h->mu);
  return n;
}

static void reader_done(void *cls) { hx_unref(cls); }

/* ---- answers of the proxy's own --------------------------------------------
 */

char *hx_rpc_error(const char *id, int code, const char *msg, json_t *data,
                   size_t *len) {
  json_t *jid = id ? json_loads(id, JSON_DECODE_ANY, NULL) : json_null();
  json_t *err = mcp_error_object(code, msg); /* always UTF-8 */
  json_t *m;
  char *text;
  if (err && data)
    json_object_set(err, "data", data);
  json_decref(data);
  m = json_pack("{s:s, s:o, s:o}", "jsonrpc", "2.0", "id",
                jid ? jid : json_null(), "error", err ? err : json_object());
  text = m ? json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(m);
  *len = text ? strlen(text) : 0;
  return text;
}

void hx_answer_rpc_error(hx *h, int code, const char *msg, json_t *data) {
  size_t len;
  char *text = hx_rpc_error(h->id, code, msg, data, &len);
  if (!text) {
    hx_answer_whole(h, 500, "text/plain", "out of memory\n", 14, NULL, 0);
    return;
  }
  hx_answer_whole(h, 200, "application/json", text, len, NULL, 0);
  free(text);
}

/* An HTTP error of the proxy's own, with a JSON-RPC error body (id null), as
 * the SDKs' transports answer theirs. */
static void answer_http_error(hx *h, int status, int code, const char *msg) {
  size_t len;
  char *text = hx_rpc_error(NULL, code, msg, NULL, &len);
  hx_answer_whole(h, status, "application/json", text ? text : "",
                  text ? len : 0, NULL, 0);
  free(text);
}

/* ---- tools that need no key (--require-key)
 * ------------------------------------ */

/* Each tenant's own: a server may list other tools, or annotate them
 * otherwise, for another credential, and one tenant's tools/list must not
 * let another's unkeyed calls through. At most TENANTS_KEPT tenants; past
 * that the table starts over (each tenant's next tools/list fills it). */
#define TENANTS_KEPT 10000
static pthread_mutex_t tools_mu = PTHREAD_MUTEX_INITIALIZER;
static json_t *tools_safe; /* tenant -> tool name -> readOnlyHint or
                              idempotentHint */

static void learn_tools(const char *tenant, json_t *msg) {
  json_t *tools = json_object_get(json_object_get(msg, "result"), "tools");
  json_t *mine;
  size_t i;
  json_t *t;
  if (!json_is_array(tools))
    return;
  pthread_mutex_lock(&tools_mu);
  if (tools_safe && json_object_size(tools_safe) >= TENANTS_KEPT &&
      !json_object_get(tools_safe, tenant))
    json_object_clear(tools_safe);
  if (!tools_safe)
    tools_safe = json_object();
  if (!(mine = json_object_get(tools_safe, tenant)) &&
      json_object_set_new(tools_safe, tenant, json_object()) == 0)
    mine = json_object_get(tools_safe, tenant);
  json_array_foreach(tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    int flags = mcp_tool_flags(t, hx_opts->offer_key_argument);
    if (name && mine &&
        strlen(name) == json_string_length(json_object_get(t, "name")))
      json_object_set_new(mine, name, json_integer(flags));
  }
  pthread_mutex_unlock(&tools_mu);
}

/* A tools/list answer, whole: a JSON body or an event stream. */
static void learn_from(const char *tenant, const char *text, size_t len) {
  int dup = 0;
  json_t *m = mcp_parse(text, len, &dup);
  if (m) {
    learn_tools(tenant, m);
    json_decref(m);
    return;
  }
  for (size_t start = 0, end; (end = hx_event_end(text, len, start));
       start = end) {
    size_t dlen;
    char *data = hx_event_data(text + start, end - start, &dlen);
    if (data && (m = mcp_parse(data, dlen, &dup))) {
      learn_tools(tenant, m);
      json_decref(m);
    }
    free(data);
  }
}

/* What the tenant's tools/list said of tool (mcp_tool_flags()); 0 for a
 * tool it never listed. */
static int tool_flags(const char *tenant, const char *tool) {
  int flags;
  pthread_mutex_lock(&tools_mu);
  flags = tool ? (int)json_integer_value(
                     json_object_get(json_object_get(tools_safe, tenant), tool))
               : 0;
  pthread_mutex_unlock(&tools_mu);
  return flags;
}

static int tool_needs_key(const char *tenant, const char *tool) {
  return !(tool_flags(tenant, tool) & MCP_TOOL_SAFE);
}

static int derive_tenant(hx *h);

/* Whether an unkeyed call of tool gets an implicit key (--implicit-keys):
 * a tool this caller's tools/list did not annotate readOnlyHint or
 * idempotentHint, called by a caller with a principal (one without passes
 * on unprotected, and the upstream answers it). */
static int implicit_for(hx *h, const char *tool) {
  return hx_opts->implicit_ms > 0 && tool && derive_tenant(h) == 0 &&
         tool_needs_key(h->tenant, tool);
}

/* Adds one event of data (each of its lines a data: line) to buf. */
static int add_event(char **buf, size_t *blen, size_t *bcap, const char *d,
                     size_t n) {
  if (hx_buf_add(buf, blen, bcap, "event: message\n", 15) != 0)
    return -1;
  for (size_t i = 0; i <= n;) {
    const char *nl = memchr(d + i, '\n', n - i);
    size_t e = nl ? (size_t)(nl - d) : n;
    if (hx_buf_add(buf, blen, bcap, "data: ", 6) != 0 ||
        hx_buf_add(buf, blen, bcap, d + i, e - i) != 0 ||
        hx_buf_add(buf, blen, bcap, "\n", 1) != 0)
      return -1;
    i = e + 1;
  }
  return hx_buf_add(buf, blen, bcap, "\n", 1);
}

/* A tools/list answer (a JSON body or an event stream) with the offered
 * key argument added to the tools that may act (mcp_offer_tools_list()):
 * a new body (malloc'd, *len), or NULL when nothing was added. */
static char *offered_list(const char *text, size_t n, size_t *len) {
  int dup = 0;
  json_t *m = mcp_parse(text, n, &dup);
  char *out = NULL, *buf = NULL;
  size_t blen = 0, bcap = 0;
  int found = 0;
  if (m) {
    out = mcp_offer_tools_list(text, n, m, hx_opts->offer_key_argument, len);
    json_decref(m);
    return out;
  }
  for (size_t start = 0, end; (end = hx_event_end(text, n, start));
       start = end) {
    size_t dlen, olen = 0;
    char *data = hx_event_data(text + start, end - start, &dlen);
    int bad;
    if (!data)
      continue;
    out = NULL;
    if ((m = mcp_parse(data, dlen, &dup))) {
      out = mcp_offer_tools_list(data, dlen, m, hx_opts->offer_key_argument,
                                 &olen);
      json_decref(m);
    }
    found |= out != NULL;
    bad = out ? add_event(&buf, &blen, &bcap, out, olen)
              : add_event(&buf, &blen, &bcap, data, dlen);
    free(out);
    free(data);
    if (bad) {
      free(buf);
      return NULL;
    }
  }
  if (!found) {
    free(buf);
    return NULL;
  }
  *len = blen;
  return buf;
}

/* ---- passing through -------------------------------------------------------
 */

static void session_deleted(const char *sid);

/* An answer to an initialize or server/discover (text, a JSON body or an
 * event stream), with capabilities.experimental["idem/idempotency"] added
 * to the message that carries the result: a new body (malloc'd, *len), or
 * NULL when none could be made. */
static char *extended(const char *text, size_t n, size_t *len) {
  int dup = 0;
  json_t *m = mcp_parse(text, n, &dup);
  char *out = NULL;
  if (m) {
    if (mcp_extend_initialize(hx_opts, m) == 0 &&
        (out = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER)))
      *len = strlen(out);
    json_decref(m);
    return out;
  }
  /* An event stream: each event's data, a result extended, as one
   * "message" event each (events without data, comments, go). */
  {
    char *buf = NULL;
    size_t blen = 0, bcap = 0;
    int found = 0;
    for (size_t start = 0, end; (end = hx_event_end(text, n, start));
         start = end) {
      size_t dlen;
      char *data = hx_event_data(text + start, end - start, &dlen);
      char *j = NULL;
      if (!data)
        continue;
      if ((m = mcp_parse(data, dlen, &dup))) {
        if (json_object_get(m, "result") &&
            mcp_extend_initialize(hx_opts, m) == 0)
          found = 1;
        j = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(m);
      }
      if (!j) { /* not a message: no MCP client reads it */
        free(data);
        continue;
      }
      if (hx_buf_add(&buf, &blen, &bcap, "event: message\ndata: ", 21) != 0 ||
          hx_buf_add(&buf, &blen, &bcap, j, strlen(j)) != 0 ||
          hx_buf_add(&buf, &blen, &bcap, "\n\n", 2) != 0) {
        free(j);
        free(data);
        free(buf);
        return NULL;
      }
      free(j);
      free(data);
    }
    if (!found) {
      free(buf);
      return NULL;
    }
    *len = blen;
    return buf;
  }
}

/* The held answer of an initialize or server/discover goes on, extended;
 * as the server sent it when it holds no result to extend. */
static void answer_extended(hx *h) {
  size_t len = 0;
  char *body = !h->seen              ? NULL
               : h->extend_caps == 2 ? offered_list(h->seen, h->seen_len, &len)
                                     : extended(h->seen, h->seen_len, &len);
  if (body)
    hx_answer_whole(h, h->rs.status, NULL, body, len, h->rs.headers,
                    h->rs.nheaders);
  else
    hx_answer_whole(h, h->rs.status, NULL, h->seen ? h->seen : "",
                    h->seen_len, h->rs.headers, h->rs.nheaders);
  free(body);
}

static void pass_head(void *ctx, up_response *rs) {
  hx *h = ctx;
  int64_t len = -1;
  if (h->extend_caps)
    return; /* sent whole, extended, at the end (pass_done()) */
  if (rs->content_length)
    len = strtoll(rs->content_length, NULL, 10);
  hx_answer_head(h, rs->status, rs->headers, rs->nheaders, len, 0);
}

static int pass_data(void *ctx, const char *p, size_t n) {
  hx *h = ctx;
  if (h->extend_caps) {
    /* An initialize answer is small: one far larger is no MCP server's.
     * A page of tools/list may be larger (many tools, long schemas). */
    if (h->seen_len + n > (h->extend_caps == 2 ? 64u : 1u) * 1024 * 1024)
      return -1;
    return hx_buf_add(&h->seen, &h->seen_len, &h->seen_cap, p, n);
  }
  if (h->watch_tools && h->seen_len + n <= 4u * 1024 * 1024)
    hx_buf_add(&h->seen, &h->seen_len, &h->seen_cap, p, n);
  return hx_stream(ctx, p, n);
}

/* A client that went away ends its stream at the upstream too (for a
 * 2026-07-28 server that is the cancellation of its request). */
static int pass_abort(void *ctx) {
  hx *h = ctx;
  int gone;
  pthread_mutex_lock(&h->mu);
  gone = h->gone || h->peer_closed;
  pthread_mutex_unlock(&h->mu);
  return gone || __atomic_load_n(&stopping, __ATOMIC_ACQUIRE);
}

static void pass_done(void *ctx, up_result r) {
  hx *h = ctx;
  int head;
  pthread_mutex_lock(&h->mu);
  head = h->ready;
  h->pass_ended = 1;
  pthread_mutex_unlock(&h->mu);
  if (h->watch_tools && r == UP_OK && h->seen)
    learn_from(h->tenant, h->seen, h->seen_len);
  if (r == UP_OK && strcmp(h->method, "DELETE") == 0 &&
      h->rs.status >= 200 && h->rs.status < 300)
    session_deleted(hx_header(h, "Mcp-Session-Id"));
  if (h->extend_caps && r == UP_OK) {
    answer_extended(h);
  } else if (head) {
    hx_stream_end(h, r != UP_OK);
  } else if (r == UP_NOT_SENT || r == UP_NO_FDS) {
    answer_http_error(h, r == UP_NO_FDS ? 503 : 502, -32000,
                      "idem mcp: the upstream MCP server could not be "
                      "reached; nothing was sent");
  } else {
    answer_http_error(h, 502, -32000,
                      "idem mcp: the upstream MCP server did not answer");
  }
  hx_unref(h);
}

void hx_identity(hx *h) {
  int have = 0;
  for (size_t i = 0; i < h->nh; i++)
    if (strcasecmp(h->h[i].name, "Accept-Encoding") == 0) {
      char *v = strdup("identity");
      if (v) {
        free(h->h[i].value);
        h->h[i].value = v;
      }
      have = 1;
    }
  if (!have && h->nh < h->hcap) {
    char *n = strdup("Accept-Encoding"), *v = strdup("identity");
    if (n && v) {
      h->h[h->nh].name = n;
      h->h[h->nh].value = v;
      h->nh++;
    } else {
      free(n);
      free(v);
    }
  }
}

void hx_prepare_request(hx *h) {
  h->rq.method = h->method;
  h->rq.uri = h->uri;
  h->rq.headers = h->h;
  h->rq.nheaders = h->nh;
  h->rq.body = h->body;
  h->rq.body_len = h->len;
  h->rq.client_addr = h->addr[0] ? h->addr : NULL;
}

static void pass_through(hx *h) {
  if (h->watch_tools || h->extend_caps)
    hx_identity(h); /* read on its way: not compressed */
  hx_prepare_request(h);
  h->rq.abort_check = pass_abort;
  h->rq.abort_ctx = h;
  h->rq.head = pass_head;
  h->rq.data = pass_data;
  h->passing = 1;
  hx_ref(h);
  if (upstream_start(&h->rq, &h->rs, pass_done, h) != 0) {
    hx_unref(h);
    answer_http_error(h, 503, -32000, "idem mcp: out of memory");
  }
}

/* ---- the request ------------------------------------------------------------
 */

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind,
                               const char *name, size_t nl, const char *value,
                               size_t vl) {
  hx *h = cls;
  (void)kind;
  if (h->nh == h->hcap) {
    size_t cap = h->hcap ? h->hcap * 2 : 16;
    up_header *n = realloc(h->h, cap * sizeof *n);
    if (!n)
      return MHD_NO;
    h->h = n;
    h->hcap = cap;
  }
  h->h[h->nh].name = strndup(name, nl);
  h->h[h->nh].value = strndup(value ? value : "", value ? vl : 0);
  if (!h->h[h->nh].name || !h->h[h->nh].value) {
    free(h->h[h->nh].name);
    free(h->h[h->nh].value);
    return MHD_NO;
  }
  h->nh++;
  return MHD_YES;
}

const char *hx_header(const hx *h, const char *name) {
  for (size_t i = 0; i < h->nh; i++)
    if (strcasecmp(h->h[i].name, name) == 0)
      return h->h[i].value;
  return NULL;
}

/* Whose a keyed request is (--principal, principal.h); --tenant under
 * none. 0, or the HTTP status to refuse it with (why set, if given). */
static principal_rule hx_rule;
int hx_replay_check;
static int derive_tenant_why(hx *h, char *why, size_t size) {
  char w[600];
  int status;
  /* Derived once per request: a JWT's signature is checked once, not at
   * each question the request's handling asks. */
  if (h->tenant_known)
    return 0;
  status = principal_tenant(&hx_rule, h->h, h->nh, hx_opts->tenant, h->tenant,
                            sizeof h->tenant, why ? why : w,
                            why ? size : sizeof w);
  h->tenant_known = status == 0;
  return status;
}
static int derive_tenant(hx *h) { return derive_tenant_why(h, NULL, 0); }

/* Whether the target is the MCP endpoint (its query aside). */
static int is_endpoint(const char *uri) {
  size_t n = strcspn(uri, "?");
  return strlen(mcp_path) == n && strncmp(uri, mcp_path, n) == 0;
}

/* The OAuth metadata a client of a protected server reads at the origin
 * (RFC 9728 and RFC 8414, each also with the endpoint's path after it). */
static int is_oauth_metadata(const char *uri) {
  static const char *const wk[] = {
      "/.well-known/oauth-protected-resource",
      "/.well-known/oauth-authorization-server",
      "/.well-known/openid-configuration"};
  size_t n = strcspn(uri, "?");
  for (size_t i = 0; i < sizeof wk / sizeof wk[0]; i++) {
    size_t l = strlen(wk[i]);
    if (n >= l && strncmp(uri, wk[i], l) == 0 && (n == l || uri[l] == '/'))
      return 1;
  }
  return 0;
}

/* Sessions the server ended (a DELETE it answered 2xx): the last
 * DELETED_KEPT, in a ring. A keyed call in one is refused as the server
 * would refuse it, never answered from the store. */
#define DELETED_KEPT 4096
static struct {
  pthread_mutex_t mu;
  char *id[DELETED_KEPT];
  size_t next;
} Deleted = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void session_deleted(const char *sid) {
  char *copy = sid && *sid ? strdup(sid) : NULL;
  if (!copy)
    return;
  pthread_mutex_lock(&Deleted.mu);
  free(Deleted.id[Deleted.next]);
  Deleted.id[Deleted.next] = copy;
  Deleted.next = (Deleted.next + 1) % DELETED_KEPT;
  pthread_mutex_unlock(&Deleted.mu);
}

static int session_was_deleted(const char *sid) {
  int found = 0;
  if (!sid)
    return 0;
  pthread_mutex_lock(&Deleted.mu);
  for (size_t i = 0; i < DELETED_KEPT && !found; i++)
    found = Deleted.id[i] && strcmp(Deleted.id[i], sid) == 0;
  pthread_mutex_unlock(&Deleted.mu);
  return found;
}

/* Whether list (an Accept header's value) names type. */
static int accepts(const char *list, const char *type) {
  size_t tl = strlen(type);
  for (const char *p = list; p && *p;) {
    p += strspn(p, " \t,");
    if (strncasecmp(p, type, tl) == 0 && strchr(" \t;,", p[tl] ? p[tl] : ' '))
      return 1;
    p = strchr(p, ',');
  }
  return 0;
}

/*
 * The checks the Streamable HTTP transport makes of a POST (what an SDK
 * server answers a live call that fails them), made of a keyed call before
 * it is claimed or answered from the store, so that a replay goes only
 * where the server would have taken the call: a JSON body, an Accept of
 * both answer types, a protocol version the transport knows, a session
 * the server has not ended. 0, or -1 with h answered.
 */
static int transport_checks(hx *h) {
  static const char *const versions[] = {"2024-11-05", "2025-03-26",
                                         "2025-06-18", "2025-11-25",
                                         "2026-07-28"};
  const char *ct = hx_header(h, "Content-Type");
  const char *acc = hx_header(h, "Accept");
  const char *ver = hx_header(h, "MCP-Protocol-Version");
  size_t n = ct ? strcspn(ct, "; \t") : 0;
  int known = !ver;
  if (!ct || n != 16 || strncasecmp(ct, "application/json", 16) != 0) {
    answer_http_error(h, 415, -32000,
                      "Unsupported Media Type: Content-Type must be "
                      "application/json; nothing was sent or replayed");
    return -1;
  }
  if (!acc || !accepts(acc, "application/json") ||
      !accepts(acc, "text/event-stream")) {
    answer_http_error(h, 406, -32000,
                      "Not Acceptable: Accept must name both "
                      "application/json and text/event-stream; nothing was "
                      "sent or replayed");
    return -1;
  }
  for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !known; i++)
    known = strcmp(ver, versions[i]) == 0;
  if (!known) {
    answer_http_error(h, 400, -32000,
                      "Bad Request: unsupported MCP-Protocol-Version; "
                      "nothing was sent or replayed");
    return -1;
  }
  if (session_was_deleted(hx_header(h, "Mcp-Session-Id"))) {
    answer_http_error(h, 404, -32001,
                      "Session not found: the server ended this session; "
                      "initialize a new one. Nothing was sent or replayed");
    return -1;
  }
  return 0;
}

/*
 * --replay-check upstream: before a keyed call is claimed (and so before
 * any replay), a ping in the caller's session with the caller's
 * credentials asks the server whether it would answer this caller now. A
 * replay is a release of stored data: a revoked or expired token, a
 * session the server never issued or has ended, gets the server's own
 * refusal (any 4xx: 401, 403, 404...), not the stored result. A 2xx is
 * trusted for --replay-check-ttl per credential and session; anything
 * else (a 5xx, no answer) is 502, and nothing is claimed.
 */
typedef struct ping {
  hx *h;
  char *tool, *key;
  int in_arg;
  char id[IDEM_FINGERPRINT_SIZE];
  up_request rq;
  up_response rs;
  up_header hd[64];
} ping;

static const char ping_body[] =
    "{\"jsonrpc\":\"2.0\",\"id\":\"idem-replay-check\",\"method\":\"ping\"}";

static void ping_free(ping *p) {
  upstream_response_free(&p->rs);
  free(p->tool);
  free(p->key);
  free(p);
}

static void pinged(void *ctx, up_result r) {
  ping *p = ctx;
  hx *h = p->h;
  int st = p->rs.status;
  if (r == UP_OK && st >= 200 && st <= 299) {
    principal_check_passed(p->id, hx_opts->replay_check_ttl_ms);
    hx_keyed_call(h, p->tool, p->key, p->in_arg);
  } else if (r == UP_OK && st >= 400 && st <= 499) {
    /* The server's own refusal of this caller in this session (401, 403,
     * a 404 for a session it does not know, a 400 for a call that lacks
     * one), as it would refuse the call itself: its WWW-Authenticate
     * starts a client's authorization flow. The headers are copied
     * (hx_answer_whole() keeps them); p is freed below. */
    up_header keep[3];
    size_t n = 0;
    for (size_t i = 0; i < p->rs.nheaders && n < 3; i++)
      if (strcasecmp(p->rs.headers[i].name, "Content-Type") == 0 ||
          strcasecmp(p->rs.headers[i].name, "WWW-Authenticate") == 0 ||
          strcasecmp(p->rs.headers[i].name, "Retry-After") == 0)
        keep[n++] = p->rs.headers[i];
    hx_answer_whole(h, st, NULL, p->rs.body ? p->rs.body : "", p->rs.body_len,
                    keep, n);
  } else {
    char m[700];
    snprintf(m, sizeof m,
             "idem mcp: before a keyed call is claimed or replayed the proxy "
             "pings the server in the caller's session, and that ping %s%d; "
             "nothing was sent or replayed",
             r == UP_OK ? "was answered HTTP " : "failed: ",
             r == UP_OK ? st : (int)r);
    answer_http_error(h, 502, -32000, m);
  }
  hx_unref(h);
  ping_free(p);
}

/* 0 once the ping is out (pinged() goes on), -1 when out of memory. */
static int ping_caller(hx *h, const char *tool, const char *key, int in_arg,
                       const char id[IDEM_FINGERPRINT_SIZE]) {
  ping *p = calloc(1, sizeof *p);
  size_t n = 0;
  if (!p)
    return -1;
  p->h = h;
  p->in_arg = in_arg;
  memcpy(p->id, id, IDEM_FINGERPRINT_SIZE);
  /* key NULL: --implicit-keys makes it once the check passes. */
  if (!(p->tool = strdup(tool)) || (key && !(p->key = strdup(key)))) {
    ping_free(p);
    return -1;
  }
  p->hd[n++] = (up_header){"Content-Type", "application/json"};
  p->hd[n++] = (up_header){"Accept", "application/json, text/event-stream"};
  for (size_t i = 0; i < h->nh && n < 64; i++)
    if (principal_check_sends(h->h[i].name) &&
        strcasecmp(h->h[i].name, "Accept-Encoding") != 0)
      p->hd[n++] = h->h[i];
  p->rq.method = "POST";
  p->rq.uri = h->uri;
  p->rq.headers = p->hd;
  p->rq.nheaders = n;
  p->rq.body = ping_body;
  p->rq.body_len = sizeof ping_body - 1;
  p->rq.client_addr = h->addr[0] ? h->addr : NULL;
  hx_ref(h);
  if (upstream_start(&p->rq, &p->rs, pinged, p) != 0) {
    hx_unref(h);
    ping_free(p);
    return -1;
  }
  return 0;
}

static void decide(hx *h);

/* decide(), on a fingerprint worker (h's connection is suspended). */
static void decide_heavy(void *arg) {
  hx *h = arg;
  decide(h);
  hx_unref(h);
}

/*
 * A body that jansson refused for its lone surrogate escapes alone ("ok
 * \ud83d": JavaScript's JSON.stringify writes one for a string cut between
 * the halves of a pair), read from a mended copy (mcp_parse_lone()): msg
 * is kept for a tools/call the proxy answers (keyed, or under
 * --require-key), which is then handled as any (the body passed on, kept
 * and fingerprinted is the client's own, the escape in it), and for a
 * notifications/cancelled, which stays here when it cancels a keyed call;
 * anything else passes through as before, unread (the tree is never
 * written out). The tree holds U+FFFD where the body has a lone
 * surrogate, so such a call whose id or tool name holds one is refused:
 * its answers could not be matched, and a record's operation is UTF-8. 1
 * when answered, 0 otherwise, with *out the tree or NULL.
 */
static int lone_read(hx *h, json_t **out, int *dup) {
  json_t *msg = mcp_parse_lone(h->body, h->len, dup);
  const char *method = json_string_value(json_object_get(msg, "method"));
  json_t *id = json_object_get(msg, "id");
  size_t f, t, pf, pt;
  int ours = 0;
  *out = NULL;
  if (!msg)
    return 0;
  if (method && strcmp(method, "notifications/cancelled") == 0 && !id) {
    *out = msg;
    return 0;
  }
  if (json_is_object(msg) && method && strcmp(method, "tools/call") == 0) {
    json_t *params = json_object_get(msg, "params");
    const char *key = NULL, *offered = NULL;
    int in_arg, present = 0;
    ours =
        mcp_find_key(hx_opts->key_argument, params, &key, &in_arg) || key ||
        mcp_offered(hx_opts->offer_key_argument, params, &present, &offered) ||
        present || hx_opts->require_key;
  }
  if (!ours) {
    /* Not the proxy's to read: the body passes through as it came. */
    json_decref(msg);
    return 0;
  }
  if (mcp_member(h->body, h->len, 0, "id", &f, &t) &&
      mcp_has_lone(h->body + f, t - f)) {
    free(h->id);
    h->id = strndup(h->body + f, t - f); /* answered under its own bytes */
    json_decref(msg);
    hx_answer_rpc_error(h, -32600,
                        "idem mcp: a request id may not hold a lone "
                        "surrogate. Nothing was sent to the server.",
                        NULL);
    return 1;
  }
  if (mcp_member(h->body, h->len, 0, "params", &pf, &pt) &&
      mcp_member(h->body, pt, pf, "name", &f, &t) &&
      mcp_has_lone(h->body + f, t - f)) {
    free(h->id);
    h->id = id ? mcp_id_text(id) : NULL;
    json_decref(msg);
    hx_answer_rpc_error(h, -32602,
                        "idem mcp: a tool name may not hold a lone "
                        "surrogate. Nothing was sent to the server.",
                        NULL);
    return 1;
  }
  *out = msg;
  return 0;
}

/*
 * A body the proxy cannot read as JSON, even with its lone surrogates
 * mended (a number past the double range, bytes that are not UTF-8, a
 * member named twice). Unkeyed traffic passes through as it came, the
 * server may well read it; a tools/call that carries a key, or that
 * --require-key would refuse, is answered here, as the stdio mode answers
 * it (client_unreadable() in mcp_relay.c): a more lenient server could act
 * on it with its key unseen, and names given twice make the proxy and the
 * server read different members. 1 when answered.
 */
static int unreadable_call(hx *h, int dup) {
  size_t f = 0, t = 0;
  char *tool = NULL;
  int keyed = 0, refuse;
  if (!mcp_scan_call(h->body, h->len, hx_opts->key_argument, &keyed, &f, &t,
                     &tool)) {
    if (!dup || !memmem(h->body, h->len, "tools/call", 10))
      return 0;
    keyed = 1; /* which method it names depends on who reads it */
  }
  if (!keyed && hx_opts->offer_key_argument) {
    size_t f2, t2;
    char *tool2 = NULL;
    mcp_scan_call(h->body, h->len, hx_opts->offer_key_argument, &keyed, &f2,
                  &t2, &tool2);
    free(tool2);
  }
  refuse = keyed || dup ||
           (hx_opts->require_key && (!tool || derive_tenant(h) != 0 ||
                                     tool_needs_key(h->tenant, tool)));
  free(tool);
  if (!refuse)
    return 0;
  free(h->id);
  h->id = NULL;
  if (t > f) {
    /* Under its own id, when that much can be read. */
    json_t *v = json_loadb(h->body + f, t - f, JSON_DECODE_ANY, NULL);
    if (json_is_string(v) || json_is_number(v))
      h->id = strndup(h->body + f, t - f);
    json_decref(v);
  }
  if (dup)
    hx_answer_rpc_error(h, -32600,
                        "idem mcp: a tools/call naming a member twice is not "
                        "passed on; send each member once",
                        NULL);
  else if (keyed)
    hx_answer_rpc_error(h, -32700,
                        "idem mcp: this keyed tools/call is not JSON the "
                        "proxy can read (UTF-8, numbers within the double "
                        "range), so its key cannot be honoured; nothing was "
                        "sent to the server",
                        NULL);
  else
    hx_answer_rpc_error(h, MCP_E_KEY_REQUIRED,
                        "idem mcp: --require-key: this tools/call has no "
                        "idempotency key and its tool cannot be read; "
                        "nothing was sent to the server",
                        json_pack("{s:s}", "idem", "key_required"));
  return 1;
}

/* A POST to the endpoint is read: a keyed tools/call goes to
 * mcp_http_keyed.c, anything else passes through. */
static void decide(hx *h) {
  json_t *msg, *params, *id;
  const char *method, *key, *tool;
  int dup = 0, in_arg = 0, status;
  char why[600], ch[128];
  if (!is_endpoint(h->uri) && !is_oauth_metadata(h->uri)) {
    /* The proxy stands for the server's MCP endpoint, not its whole
     * origin: a page the server keeps for its own network (/admin,
     * /internal) is not passed on to whoever reaches the proxy. */
    answer_http_error(h, 404, -32600,
                      "Not found: this proxy serves the MCP endpoint of its "
                      "upstream and its OAuth metadata only.");
    return;
  }
  if (strcmp(h->method, "POST") != 0 || !is_endpoint(h->uri)) {
    pass_through(h);
    return;
  }
  msg = mcp_parse(h->body ? h->body : "", h->len, &dup);
  if (!msg && !dup && h->len && lone_read(h, &msg, &dup))
    return;
  if (!msg && h->len && unreadable_call(h, dup))
    return;
  method = json_string_value(json_object_get(msg, "method"));
  id = json_object_get(msg, "id");
  params = json_object_get(msg, "params");
  if (msg && json_is_object(msg) && method && !id &&
      strcmp(method, "notifications/cancelled") == 0 && derive_tenant(h) == 0 &&
      hx_keyed_cancel(h, params)) {
    /* The client gave up on a keyed call: the server is not told, so that
     * the call ends and its result is recorded for the retry. */
    json_decref(msg);
    hx_answer_whole(h, 202, NULL, "", 0, NULL, 0);
    return;
  }
  if (msg && json_is_object(msg) && method && id &&
      strcmp(method, "tools/list") == 0) {
    h->watch_tools = (hx_opts->require_key || hx_opts->offer_key_argument ||
                      hx_opts->implicit_ms > 0) &&
                     derive_tenant(h) == 0;
    /* With --offer-key-argument the answer is held whole and goes on
     * with the argument added (answer_extended()), each page alike. */
    if (hx_opts->offer_key_argument)
      h->extend_caps = 2;
  }
  if (msg && json_is_object(msg) && method && id &&
      (strcmp(method, "initialize") == 0 ||
       strcmp(method, "server/discover") == 0))
    h->extend_caps = 1; /* the client learns what the proxy does */
  if (!msg || !json_is_object(msg) || !method ||
      strcmp(method, "tools/call") != 0 || !id || json_is_null(id)) {
    /* Not a single tools/call request (a batch of the 2025-03-26 era is
     * an array: a keyed call in it passes unprotected, as the stdio mode
     * refuses it instead, see below). */
    if (msg && json_is_array(msg)) {
      for (size_t i = 0; i < json_array_size(msg); i++) {
        json_t *m = json_array_get(msg, i);
        const char *k = NULL;
        int ia;
        const char *mm = json_string_value(json_object_get(m, "method"));
        int pr = 0;
        const char *ok;
        if (mm && strcmp(mm, "tools/call") == 0 &&
            (mcp_find_key(hx_opts->key_argument, json_object_get(m, "params"),
                          &k, &ia) != 0 ||
             k ||
             implicit_for(h, json_string_value(json_object_get(
                                 json_object_get(m, "params"), "name"))) ||
             mcp_offered(hx_opts->offer_key_argument,
                         json_object_get(m, "params"), &pr, &ok) != 0 ||
             pr)) {
          json_decref(msg);
          answer_http_error(h, 400, MCP_E_BATCH,
                            "idem mcp: a keyed tools/call must be sent "
                            "alone, not in a batch; nothing was sent");
          return;
        }
      }
    }
    json_decref(msg);
    pass_through(h);
    return;
  }
  h->id = mcp_id_text(id);
  tool = json_string_value(json_object_get(params, "name"));
  if (mcp_find_key(hx_opts->key_argument, params, &key, &in_arg) != 0) {
    hx_answer_rpc_error(h, MCP_E_BAD_KEY,
                        "idem mcp: the idempotency key must be a string; "
                        "nothing was sent to the server",
                        json_pack("{s:s}", "idem", "bad_key"));
    json_decref(msg);
    return;
  }
  if (tool &&
      strlen(tool) != json_string_length(json_object_get(params, "name"))) {
    /* Read as C strings, "t\u0000x" would be tool "t". */
    json_decref(msg);
    hx_answer_rpc_error(h, -32602,
                        "idem mcp: a tool name may not contain U+0000. "
                        "Nothing was sent to the server.",
                        NULL);
    return;
  }
  if (hx_opts->offer_key_argument) {
    const char *offered;
    int present = 0, ours;
    if (mcp_offered(hx_opts->offer_key_argument, params, &present, &offered) !=
        0) {
      char m[400];
      snprintf(m, sizeof m,
               "idem mcp: the argument \"%s\" is the call's idempotency key "
               "and must be a string (1-255 printable ASCII characters). "
               "Nothing was sent to the server.",
               hx_opts->offer_key_argument);
      hx_answer_rpc_error(h, MCP_E_BAD_KEY, m,
                          json_pack("{s:s}", "idem", "bad_key"));
      json_decref(msg);
      return;
    }
    /* The proxy's own argument unless this tenant's tools/list gave the
     * tool a schema that declares it (a tool never listed: ours). */
    ours = !(derive_tenant(h) == 0 &&
             (tool_flags(h->tenant, tool) & MCP_TOOL_DECLARES));
    if (present && !ours && !key && offered) {
      key = offered;
      in_arg = 2;
    } else if (present && ours) {
      size_t slen;
      char *stripped;
      if (!key && offered)
        key = offered;
      if (key && key == offered)
        in_arg = 0; /* read from params._meta from now on */
      stripped = mcp_offer_strip(h->body, h->len, hx_opts->offer_key_argument,
                                 key && key == offered ? key : NULL, &slen);
      if (!stripped) {
        hx_answer_rpc_error(h, MCP_E_INTERNAL,
                            "idem mcp: the call's key argument could not be "
                            "taken out of it (params._meta is not an object, "
                            "or out of memory). Nothing was sent to the "
                            "server.",
                            json_pack("{s:s}", "idem", "internal"));
        json_decref(msg);
        return;
      }
      /* The server never sees it: the body sent on is this one. */
      free(h->body);
      h->body = stripped;
      h->len = slen;
      h->cap = slen + 1;
    }
  }
  if (!key && hx_opts->require_key && h->id && !implicit_for(h, tool) &&
      (derive_tenant(h) != 0 || tool_needs_key(h->tenant, tool))) {
    char m[1400];
    json_t *data = mcp_key_required(tool, hx_opts->offer_key_argument,
                                    hx_opts->key_argument, m, sizeof m);
    hx_answer_rpc_error(h, MCP_E_KEY_REQUIRED, m, data);
    json_decref(msg);
    return;
  }
  if (!key && !implicit_for(h, tool)) {
    json_decref(msg);
    pass_through(h);
    return;
  }
  if (!tool || !h->id) {
    json_decref(msg);
    pass_through(h);
    return;
  }
  if (transport_checks(h) != 0) {
    json_decref(msg);
    return;
  }
  if ((status = derive_tenant_why(h, why, sizeof why)) != 0) {
    char m[700];
    json_decref(msg);
    /* 401 as the upstream answers a caller it does not know: a client
     * with an authorization flow starts it. */
    snprintf(m, sizeof m, "idem mcp: %s; nothing was sent", why);
    if (status == 401 && principal_challenge(&hx_rule, ch, sizeof ch)) {
      up_header wa = {"WWW-Authenticate", ch};
      size_t len;
      char *text = hx_rpc_error(NULL, -32600, m, NULL, &len);
      hx_answer_whole(h, 401, "application/json", text ? text : "",
                      text ? len : 0, &wa, 1);
      free(text);
    } else {
      answer_http_error(h, status, -32600, m);
    }
    return;
  }
  if (hx_replay_check) {
    char cid[IDEM_FINGERPRINT_SIZE];
    principal_check_id(h->tenant, h->h, h->nh, cid);
    if (!principal_check_cached(cid)) {
      if (ping_caller(h, tool, key, in_arg, cid) != 0)
        answer_http_error(h, 503, -32000, "idem mcp: out of memory");
      json_decref(msg);
      return;
    }
  }
  hx_keyed_call(h, tool, key, in_arg);
  json_decref(msg);
}

/* The listener: on the loopback only, and its port (for its own origin). */
static int listen_loopback;
static char listen_port[8];

/* host (n bytes, an Origin's or a Host's host and port) is a loopback name
 * (localhost, 127.0.0.1, [::1]), with no port or with the listener's. */
static int loopback_host(const char *host, size_t n) {
  static const char *const names[] = {"localhost", "127.0.0.1", "[::1]"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    size_t l = strlen(names[i]);
    if (n >= l && strncasecmp(host, names[i], l) == 0 &&
        (n == l || (host[l] == ':' && n - l - 1 == strlen(listen_port) &&
                    strncmp(host + l + 1, listen_port, n - l - 1) == 0)))
      return 1;
  }
  return 0;
}

/*
 * The MCP transport's rule against DNS rebinding (a web page whose name
 * resolves to 127.0.0.1 calling a local server with its user's
 * credentials): a request with an Origin header is taken only from an
 * origin --allow-origin names or from the listener's own loopback origin
 * (http://localhost:PORT, http://127.0.0.1:PORT, http://[::1]:PORT), and on
 * a loopback listener only with a Host that is a loopback name. A client
 * that is not a browser sends no Origin. NULL, or why the request is
 * refused (403).
 */
static const char *foreign(struct MHD_Connection *c) {
  const char *org =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
  if (org) {
    int ok = 0;
    for (int i = 0; i < hx_opts->n_allow_origins && !ok; i++)
      ok = strcasecmp(org, hx_opts->allow_origins[i]) == 0;
    if (!ok && strncasecmp(org, "http://", 7) == 0)
      ok = loopback_host(org + 7, strlen(org + 7));
    if (!ok)
      return "Origin not allowed: this proxy answers pages of the origins "
             "--allow-origin names, and its own loopback origin.";
  }
  if (listen_loopback && (!host || !loopback_host(host, strlen(host))))
    return "Host not allowed: a proxy on the loopback answers requests for "
           "localhost, 127.0.0.1 or [::1] only.";
  return NULL;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  hx *h = *con_cls;
  (void)cls, (void)url, (void)version;
  if (!h)
    return MHD_NO;
  if (!h->started) {
    serve_refusal why;
    const char *why_foreign;
    const union MHD_ConnectionInfo *ci;
    h->started = 1;
    h->c = c;
    snprintf(h->method, sizeof h->method, "%s", method);
    guard_head_done(c);
    /* framing.c, as the gateway: a request that cannot be framed without
     * doubt, or whose target has dot segments, is refused and its
     * connection closed; the target is normalised. */
    char *t = NULL;
    if (serve_check_head(c, method, h->uri, &why) != 0 ||
        !(t = serve_target(h->uri, &why))) {
      struct MHD_Response *r = MHD_create_response_from_buffer(
          strlen(why.detail), why.detail, MHD_RESPMEM_MUST_COPY);
      if (!r)
        return MHD_NO;
      MHD_add_response_header(r, "Connection", "close");
      enum MHD_Result ok = MHD_queue_response(c, (unsigned)why.status, r);
      MHD_destroy_response(r);
      h->answered = 1;
      return ok;
    }
    free(h->uri);
    h->uri = t;
    if ((why_foreign = foreign(c))) {
      /* Refused before anything is claimed, forwarded or replayed: a
       * JSON-RPC error without an id, as the transport allows. */
      char body[300];
      int n = snprintf(body, sizeof body,
                       "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":"
                       "{\"code\":-32600,\"message\":\"%s\"}}",
                       why_foreign);
      struct MHD_Response *r = MHD_create_response_from_buffer(
          (size_t)n, body, MHD_RESPMEM_MUST_COPY);
      if (!r)
        return MHD_NO;
      MHD_add_response_header(r, "Content-Type", "application/json");
      enum MHD_Result ok = MHD_queue_response(c, 403, r);
      MHD_destroy_response(r);
      h->answered = 1;
      return ok;
    }
    if (MHD_get_connection_values_n(c, MHD_HEADER_KIND, collect, h) < 0)
      return MHD_NO;
    ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
      inet_ntop(AF_INET,
                &((const struct sockaddr_in *)ci->client_addr)->sin_addr,
                h->addr, sizeof h->addr);
    else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6)
      inet_ntop(AF_INET6,
                &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr,
                h->addr, sizeof h->addr);
    return MHD_YES;
  }
  if (h->answered)
    return MHD_YES;
  if (*upload_size) {
    if (h->len + *upload_size > hx_opts->max_body) {
      h->too_big = 1;
    } else if (!h->too_big) {
      if (h->len + *upload_size > h->cap) {
        size_t cap = h->cap ? h->cap : 4096;
        while (cap < h->len + *upload_size)
          cap *= 2;
        char *b = realloc(h->body, cap);
        if (!b)
          return MHD_NO;
        h->body = b;
        h->cap = cap;
      }
      memcpy(h->body + h->len, upload, *upload_size);
      h->len += *upload_size;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  pthread_mutex_lock(&h->mu);
  if (h->ready) {
    struct MHD_Response *r = NULL;
    int bodiless = h->status < 200 || h->status == 204 || h->status == 304;
    /* The whole answer is here already (a short one, read in one go, or a
     * replay): one buffer, which libmicrohttpd sends with its head in one
     * write, instead of a chunked stream of head, body and end in three
     * (each of which may wake the client). */
    int whole = !bodiless && h->out_end && !h->out_broken && !h->peer_closed;
    h->answered = 1;
    if (whole)
      r = MHD_create_response_from_buffer(h->out_len - h->out_off,
                                          h->out + h->out_off,
                                          MHD_RESPMEM_MUST_COPY);
    else
      h->refs++; /* the reader's */
    pthread_mutex_unlock(&h->mu);
    if (bodiless) {
      /* Answers without a body (RFC 9110 6.4.1): no chunked framing
       * either, or the next answer on the connection would be misread. */
      hx_unref(h);
      r = MHD_create_response_from_buffer(0, (void *)"",
                                          MHD_RESPMEM_PERSISTENT);
    } else if (!whole) {
      r = MHD_create_response_from_callback(h->length >= 0 ? (uint64_t)h->length
                                                           : MHD_SIZE_UNKNOWN,
                                            16384, reader, h, reader_done);
      if (!r)
        hx_unref(h);
    }
    if (!r)
      return MHD_NO;
    for (size_t i = 0; i < h->nah; i++)
      MHD_add_response_header(r, h->ah[i].name, h->ah[i].value);
    if (h->type)
      MHD_add_response_header(r, "Content-Type", h->type);
    if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE))
      MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)h->status, r);
    MHD_destroy_response(r);
    return ok;
  }
  if (h->decided && h->peer_closed) {
    /* The client left before its answer began: the connection closes, and
     * an unkeyed forward ends with it (a keyed call goes on). */
    pthread_mutex_unlock(&h->mu);
    return MHD_NO;
  }
  if (h->decided) {
    /* Resumed before the answer was made: wait again. */
    h->suspended = 1;
    MHD_suspend_connection(c);
    pthread_mutex_unlock(&h->mu);
    return MHD_YES;
  }
  h->decided = 1;
  __atomic_add_fetch(&unfinished, 1, __ATOMIC_RELAXED);
  h->suspended = 1;
  MHD_suspend_connection(c);
  pthread_mutex_unlock(&h->mu);
  {
    /* Watched from now on: a client may leave before its answer begins. */
    const union MHD_ConnectionInfo *fi =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    h->fd = fi ? fi->connect_fd : -1;
    watch_add(h);
  }
  if (h->too_big) {
    char msg[128];
    snprintf(msg, sizeof msg,
             "idem mcp: the request body is larger than %zu bytes "
             "(--max-body); nothing was sent",
             hx_opts->max_body);
    answer_http_error(h, 413, -32600, msg);
  } else if (__atomic_load_n(&stopping, __ATOMIC_ACQUIRE)) {
    answer_http_error(h, 503, -32000,
                      "idem mcp: the proxy is shutting down; nothing was "
                      "sent");
  } else if (h->len > SERVE_INLINE_BODY && strcmp(h->method, "POST") == 0) {
    /* A large body is parsed and fingerprinted by a fingerprint worker:
     * on this thread, the one loop every client's stream runs on, a few
     * of them would hold everyone. */
    hx_ref(h);
    if (pool_heavy_submit(decide_heavy, h) != 0) {
      hx_unref(h);
      decide(h);
    }
  } else {
    decide(h);
  }
  return MHD_YES;
}

static void *uri_log(void *cls, const char *uri, struct MHD_Connection *c) {
  hx *h = calloc(1, sizeof *h);
  (void)cls, (void)c;
  if (!h)
    return NULL;
  pthread_mutex_init(&h->mu, NULL);
  h->refs = 1;
  h->length = -1;
  h->fd = -1;
  if (!(h->uri = strdup(uri))) {
    hx_unref(h);
    return NULL;
  }
  return h;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  hx *h = *con_cls;
  int in_flight;
  (void)cls, (void)toe;
  guard_request_done(c);
  if (!h)
    return;
  watch_remove(h);
  if (h->in_held)
    held_unlink(h);
  pthread_mutex_lock(&h->mu);
  h->gone = 1;
  if (h->decided)
    __atomic_sub_fetch(&unfinished, 1, __ATOMIC_RELEASE);
  in_flight = h->passing && !h->pass_ended;
  pthread_mutex_unlock(&h->mu);
  /* A forward still in flight ends now. One whose answer has ended (the
   * usual case: the client read it all) needs nothing, and waking the
   * upstream loop for it would cost a thread's wake-up per call. */
  if (in_flight)
    upstream_check_aborts();
  hx_unref(h);
  *con_cls = NULL;
}

/* ---- start and stop ---------------------------------------------------------
 */

/* --upstream URL: its origin (the base of every forward) and its path (the
 * MCP endpoint this proxy serves under the same path). */
static int split_upstream(const char *url) {
  const char *p = strstr(url, "://");
  size_t n;
  if (!p || (strncasecmp(url, "http://", 7) != 0 &&
             strncasecmp(url, "https://", 8) != 0))
    return -1;
  p += 3;
  n = strcspn(p, "/?#");
  if (n == 0 || (size_t)(p - url) + n >= sizeof origin)
    return -1;
  snprintf(origin, sizeof origin, "%.*s", (int)(p - url + (ptrdiff_t)n), url);
  p += n;
  if (*p == '?' || *p == '#')
    return -1;
  snprintf(mcp_path, sizeof mcp_path, "%s", *p ? p : "/");
  return 0;
}

int mcp_http_run(const mcp_opts *o, idem_store *store) {
  struct MHD_Daemon *d;
  char bound[128];
  sigset_t set;
  int sig = 0;
  struct rlimit rl;
  hx_opts = o;
  hx_store = store;
  listen_log_name = "idem mcp";
  {
    char why[600];
    if (principal_parse(o->principal_spec, &hx_rule, why, sizeof why) != 0 ||
        (hx_rule.kind == PRINCIPAL_JWT &&
         principal_jwt_start(&hx_rule, o->jwks, o->issuer, o->audience, why,
                             sizeof why) != 0)) {
      cli_error("mcp", "--principal: %s", why);
      idem_store_close(store);
      return EXIT_USAGE;
    }
    if (hx_rule.kind != PRINCIPAL_JWT &&
        (o->jwks || o->issuer || o->audience)) {
      cli_error("mcp", "--jwks, --issuer and --audience go with --principal "
                       "jwt");
      idem_store_close(store);
      return EXIT_USAGE;
    }
    /* A replay waits on the upstream's word where the principal is a
     * credential the upstream judges: by default with those rules. */
    hx_replay_check = o->replay_check >= 0
                          ? o->replay_check
                          : hx_rule.kind == PRINCIPAL_CREDENTIAL ||
                                hx_rule.kind == PRINCIPAL_JWT;
  }
  if (split_upstream(o->upstream) != 0) {
    cli_error("mcp",
              "--upstream: an http:// or https:// URL with no query, "
              "not '%s'",
              o->upstream);
    idem_store_close(store);
    return EXIT_USAGE;
  }
  /* As servers do: every descriptor the hard limit allows (each stream
   * holds two). */
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  memset(&sc, 0, sizeof sc);
  sc.listen = o->listen;
  sc.upstream = origin;
  sc.upstream_timeout_ms = 60000;
  sc.max_pass = 64u * 1024 * 1024;
  sc.max_body = o->max_body;
  sc.header_timeout_ms = 10000;
  sc.max_connections_per_client = -1;
  sc.threads = 1;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  pthread_t wt;
  if (pthread_create(&wt, NULL, watcher, NULL) != 0 ||
      pthread_detach(wt) != 0 || upstream_init(&sc) != 0 ||
      pool_start(4) != 0 || pool_heavy_start(2) != 0 || hx_keyed_start() != 0 ||
      guard_start(&sc) != 0) {
    cli_error("mcp", "cannot start: %s", strerror(errno));
    return EXIT_FAIL;
  }
  struct MHD_OptionItem opts[] = {
      {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)uri_log, NULL},
      {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, NULL},
      {MHD_OPTION_CONNECTION_TIMEOUT, 300, NULL},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 64 * 1024, NULL},
      {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)guard_notify, NULL},
      {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)guard_max_connections(&sc), NULL},
      {MHD_OPTION_END, 0, NULL},
  };
  /* The daemon runs on the upstream loop's thread (upstream_drive()): a
   * call passed through wakes no other thread on its way to the server and
   * back, where a thread of libmicrohttpd's own would be woken twice per
   * call (the forward handed to the loop, the answer handed back). */
  d = listen_on("mcp", "--listen", o->listen,
                MHD_USE_EPOLL | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME |
                    MHD_USE_ERROR_LOG,
                handle, NULL, opts, bound, sizeof bound);
  if (d) {
    const char *colon = strrchr(bound, ':');
    snprintf(listen_port, sizeof listen_port, "%s", colon ? colon + 1 : "");
    listen_loopback = listen_is_loopback(o->listen) == 1;
  }
  if (d && upstream_drive(d) != 0) {
    cli_error("mcp", "cannot start: %s", strerror(errno));
    MHD_stop_daemon(d);
    d = NULL;
  }
  if (!d) {
    upstream_cleanup();
    idem_store_close(store);
    return EXIT_FAIL;
  }
  fprintf(stderr, "idem mcp: listening on http://%s, forwarding to %s\n", bound,
          o->upstream);
  principal_warn_open(&hx_rule, "mcp", o->listen);
  fflush(stderr);
  while (sigwait(&set, &sig) != 0 || (sig != SIGINT && sig != SIGTERM))
    ;
  /* No new call starts; the keyed calls at the server are awaited (up to
   * --shutdown-wait) so that their results are recorded; then every
   * stream ends. */
  __atomic_store_n(&stopping, 1, __ATOMIC_RELEASE);
  /* No new connection is accepted while the calls drain: the listening
   * socket is closed, so that clients go to another proxy at once. */
  upstream_quiesce();
  int n = hx_keyed_drain(o->shutdown_wait_ms), settled = n == 0;
  if (n > 0)
    cli_error("mcp",
              "%d keyed call(s) still at the server after "
              "--shutdown-wait; their keys are left in progress",
              n);
  upstream_abort();
  if (!settled)
    /* The calls cut off now are recorded (held in progress) on the
     * store's threads, which then answer their requests: the daemon and
     * the store must outlive that. A store that hangs past this leaves
     * both to the process's exit, as idem serve does. */
    settled = hx_keyed_drain(10000) == 0;
  /* An answer made is not yet sent: the loop (which runs the daemon) sends
   * it, and stopping the daemon would cut it off (or abort, with a
   * connection still suspended). */
  for (int64_t until = hx_mono_ms() + 10000;
       settled && __atomic_load_n(&unfinished, __ATOMIC_ACQUIRE) > 0;) {
    struct timespec step = {0, 10 * 1000 * 1000};
    if (hx_mono_ms() >= until)
      settled = 0;
    else
      nanosleep(&step, NULL);
  }
  upstream_cleanup();
  pool_stop();
  if (settled)
    MHD_stop_daemon(d);
  guard_stop();
  if (settled)
    idem_store_close(store);
  fprintf(stderr, "idem mcp: stopped\n");
  return EXIT_OK;
}
