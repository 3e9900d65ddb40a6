/*
 * upstream.c -- forwarding requests to the upstream on one event loop
 * thread: over the loop's own HTTP/1.1 (upstream_h1.c) for an upstream at
 * an IP address or localhost over plain HTTP, else with libcurl's multi
 * interface.
 *
 * A forward holds no thread while it waits: the gateway's threads hand a
 * request to upstream_start() and go back to other connections, and this
 * file's one thread drives every transfer in flight through epoll (and
 * curl_multi_socket_action() for libcurl's). When a transfer ends, its done
 * callback runs on the loop's thread; it must not block (the gateway queues
 * the record on the store). Both paths keep the connections to the
 * upstream open from one request to the next (HTTP/1.1 keep-alive).
 *
 * What matters most here is telling "nothing was sent" from "sent, no
 * answer": the first lets the gateway release the key, the second means the
 * upstream may have acted.
 */
#include "upstream_int.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const serve_config *cfg;
/* Forwards go over the loop's own HTTP/1.1 (upstream_h1.c). */
static int h1_on;

/* Easy handles kept for the next forwards once theirs ended: a new one is a
 * few allocations of several KB each (its state and receive buffer), and
 * under load they were the largest share of the loop's malloc() and free()
 * (see docs/bench-history.md). */
#define UP_SPARE_HANDLES 64

int header_is_hop_by_hop(const char *n) {
  static const char *const hop[] = {
      "connection",
      "keep-alive",
      "proxy-authenticate",
      "proxy-authorization",
      "proxy-connection",
      "te",
      "trailer",
      "trailers",
      "transfer-encoding",
      "upgrade",
      "host",
      "content-length",
      "expect",
  };
  for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
    if (strcasecmp(n, hop[i]) == 0)
      return 1;
  return 0;
}

int header_named_by(const char *connection, const char *name) {
  size_t n = strlen(name);
  const char *p = connection;
  while (p && *p) {
    size_t len;
    p += strspn(p, " \t,");
    len = strcspn(p, " \t,");
    if (len == n && strncasecmp(p, name, n) == 0)
      return 1;
    p += len;
  }
  return 0;
}

/* ---- the response as it arrives ------------------------------------------ */

void up_free_headers(up_response *rs, sink *s) {
  for (size_t i = 0; i < rs->nheaders; i++) {
    free(rs->headers[i].name);
    free(rs->headers[i].value);
  }
  free(rs->headers);
  rs->headers = NULL;
  rs->nheaders = 0;
  if (s)
    s->hcap = 0;
}

/* Drops the headers that the response's Connection header names: they are
 * hop-by-hop too. */
void up_drop_named(up_response *rs, const char *connection) {
  size_t k = 0;
  if (!connection)
    return;
  for (size_t i = 0; i < rs->nheaders; i++) {
    if (header_named_by(connection, rs->headers[i].name)) {
      free(rs->headers[i].name);
      free(rs->headers[i].value);
    } else {
      rs->headers[k++] = rs->headers[i];
    }
  }
  rs->nheaders = k;
}

/* "HTTP/1.1 201 Created": the code, or -1 when it is not three digits. */
static int status_code(const char *p, size_t len) {
  const char *sp = memchr(p, ' ', len), *end = p + len;
  if (!sp || end - sp < 4)
    return -1;
  sp++;
  for (int i = 0; i < 3; i++)
    if (sp[i] < '0' || sp[i] > '9')
      return -1;
  if (sp + 3 < end && sp[3] != ' ' && sp[3] != '\r' && sp[3] != '\n')
    return -1;
  return (sp[0] - '0') * 100 + (sp[1] - '0') * 10 + (sp[2] - '0');
}

/*
 * Header lines, one per call, as libcurl reads them: a status line, then the
 * fields, then an empty line; again for every response, interim (1xx) ones
 * first. Only the final response's fields are kept; a 1xx's are dropped
 * (they are hints for the hop they came over), a folded line (obs-fold)
 * is refused, and fields after the body (trailers) are
 * dropped: they are not headers and a replay must not make them so.
 */
size_t up_on_header(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  up_response *rs = s->rs;
  size_t len = size * n, nl, vl;
  char *colon;

  s->header_bytes += len;
  if (s->header_bytes > UP_MAX_HEADER_BYTES) {
    s->headers_too_large = 1;
    return 0; /* aborts the transfer */
  }
  /* After the final header block, libcurl hands on the trailer section:
   * a trailer line that begins like a status line starts no new answer
   * (it reset the headers, and the trailers after it became headers). */
  if (s->in_body)
    return len;
  if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
    int code = status_code(p, len);
    /* The version of a request sent as HTTP/1.1 (libcurl's own parser
     * takes "HTTP/2 200" as well). */
    if (len < 9 || p[5] != '1' || p[6] != '.' || (p[7] != '0' && p[7] != '1') ||
        p[8] != ' ') {
      s->bad_framing = "the status line is not HTTP/1.0 or HTTP/1.1";
      return 0;
    }
    up_free_headers(rs, s);
    free(s->connection);
    s->connection = NULL;
    s->seen_te = 0;
    if (code < 100 || code > 599) {
      s->bad_status = 1;
      return 0;
    }
    if (code == 101) {
      /* The gateway never asks for an upgrade (Upgrade is hop-by-hop and
       * not forwarded); an upstream that switches anyway is not speaking
       * HTTP to us any more. */
      s->upgrade = 1;
      return 0;
    }
    s->interim = code < 200;
    s->in_body = 0;
    rs->status = code;
    return len;
  }
  if (len && p[len - 1] == '\n')
    len--;
  if (len && p[len - 1] == '\r')
    len--;
  /* A CR inside a line (a bare CR: RFC 9112 section 2.2) is refused, as
   * the gateway's own HTTP/1.1 refuses it. */
  if (memchr(p, '\r', len)) {
    s->bad_framing = "a header line holds a bare CR";
    return 0;
  }
  if (!len) {
    /* The end of a header block: after the final one, anything more is a
     * trailer section. */
    if (!s->interim && !s->in_body) {
      s->in_body = 1;
      if (s->rq->head) {
        up_drop_named(rs, s->connection);
        s->rq->head(s->ctx, rs);
      }
    }
    return size * n;
  }
  if (s->interim || s->in_body)
    return size * n;
  if (*p == ' ' || *p == '\t') {
    /* obs-fold (RFC 9112 5.2): refused with 502, as nginx refuses it. Joined
     * to the field before, a continuation of a dropped hop-by-hop field
     * (Connection) would land on whichever field was kept before it, and a
     * folded "Connection: close" would go unseen. */
    s->bad_framing = "the answer has a folded header line (obs-fold)";
    return 0;
  }
  /* A line that is not "token: value" (RFC 9110 5.1), refused as the
   * gateway's own HTTP/1.1 refuses it: libcurl passes "X A: 1" on. */
  if (!(colon = memchr(p, ':', len)) ||
      !serve_is_token(p, (size_t)(colon - p))) {
    s->bad_framing = "the answer has a header line that is not \"name: "
                     "value\"";
    return 0;
  }
  nl = (size_t)(colon - p);
  colon++;
  while (colon < p + len && (*colon == ' ' || *colon == '\t'))
    colon++;
  vl = (size_t)(p + len - colon);
  while (vl && (colon[vl - 1] == ' ' || colon[vl - 1] == '\t'))
    vl--;
  if (rs->nheaders == s->hcap) {
    size_t cap = s->hcap ? s->hcap * 2 : 16;
    up_header *h = realloc(rs->headers, cap * sizeof *h);
    if (!h)
      return 0;
    rs->headers = h;
    s->hcap = cap;
  }
  up_header *h = &rs->headers[rs->nheaders];
  h->value = NULL;
  if (!(h->name = strndup(p, nl)) || !(h->value = strndup(colon, vl))) {
    free(h->name);
    return 0;
  }
  if (header_is_hop_by_hop(h->name)) {
    if (strcasecmp(h->name, "Connection") == 0) {
      /* Every Connection header's names, as one list. */
      char *all = NULL;
      if (asprintf(&all, "%s%s%s", s->connection ? s->connection : "",
                   s->connection ? ", " : "", h->value) >= 0) {
        free(s->connection);
        s->connection = all;
      }
    }
    /* Framing that two readers could read two ways (RFC 9112 section
     * 6.3): Content-Length with Transfer-Encoding, two Content-Lengths
     * that differ, a Transfer-Encoding other than chunked alone. */
    if (strcasecmp(h->name, "Content-Length") == 0) {
      if (s->seen_te || (rs->content_length &&
                         strcmp(rs->content_length, h->value) != 0))
        s->bad_framing = "the answer's length is ambiguous (RFC 9112 6.3)";
      else if (!rs->content_length)
        rs->content_length = strdup(h->value);
    } else if (strcasecmp(h->name, "Transfer-Encoding") == 0) {
      if (rs->content_length || s->seen_te ||
          strcasecmp(h->value, "chunked") != 0)
        s->bad_framing = "the answer's length is ambiguous (RFC 9112 6.3)";
      s->seen_te = 1;
    }
    if (s->bad_framing) {
      free(h->name);
      free(h->value);
      return 0;
    }
    free(h->name);
    free(h->value);
    return size * n;
  }
  rs->nheaders++;
  return size * n;
}

size_t up_on_body(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  up_response *rs = s->rs;
  size_t len = size * n;
  if (s->rq->data)
    return s->rq->data(s->ctx, p, len) == 0 ? len : 0;
  if (rs->body_len + len > cfg->max_pass) {
    s->too_large = 1;
    return 0; /* aborts the transfer */
  }
  if (rs->body_len + len + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < rs->body_len + len + 1)
      cap *= 2;
    char *b = realloc(rs->body, cap);
    if (!b)
      return 0;
    rs->body = b;
    s->cap = cap;
  }
  memcpy(rs->body + rs->body_len, p, len);
  rs->body_len += len;
  return len;
}

double up_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the request as the upstream gets it -------------------------------- */

static int has_header(const up_request *rq, const char *name) {
  for (size_t i = 0; i < rq->nheaders; i++)
    if (strcasecmp(rq->headers[i].name, name) == 0)
      return 1;
  return 0;
}

/*
 * The request's header lines for libcurl, in one allocation: the list's
 * nodes, then their text (curl_slist_append() would make two allocations
 * a line, held while the forward waits). libcurl only reads the list;
 * free() frees it. A first pass with out NULL counts.
 */
typedef struct lines {
  size_t n, bytes;
  struct curl_slist *out;
  char *text;
} lines;

/* Adds the line that the parts (up to 5, NULL-ended) make. */
static void add_line(lines *l, const char *p0, const char *p1, const char *p2,
                     const char *p3, const char *p4) {
  const char *parts[] = {p0, p1, p2, p3, p4};
  for (int i = 0; i < 5 && parts[i]; i++) {
    size_t k = strlen(parts[i]);
    if (l->out) {
      if (i == 0)
        l->out[l->n].data = l->text;
      memcpy(l->text, parts[i], k);
      l->text += k;
    }
    l->bytes += k;
  }
  if (l->out) {
    *l->text++ = '\0';
    l->out[l->n].next = NULL;
    if (l->n > 0)
      l->out[l->n - 1].next = &l->out[l->n];
  }
  l->bytes++;
  l->n++;
}

/* The console's session cookie (src/console): a browser sends it to every
 * port of the console's host name, the gateway's too, and it opens the
 * console to whoever holds it. It is never passed on. */
#define CONSOLE_COOKIE "idem_console"

/* Whether the Cookie value v ("a=1; b=2", RFC 6265) has a pair named
 * name. */
static int cookie_named(const char *v, const char *name) {
  size_t n = strlen(name);
  for (const char *p = v; *p;) {
    p += strspn(p, " \t;");
    if (strncmp(p, name, n) == 0 && (p[n] == '=' || p[n] == ';' || !p[n] ||
                                     p[n] == ' ' || p[n] == '\t'))
      return 1;
    p += strcspn(p, ";");
  }
  return 0;
}

/* The Cookie value v without its pairs named name, joined by "; ", in
 * out (at least strlen(v) + 1 bytes). */
static void cookie_without(const char *v, const char *name, char *out) {
  size_t n = strlen(name), o = 0;
  for (const char *p = v; *p;) {
    size_t len;
    p += strspn(p, " \t;");
    len = strcspn(p, ";");
    while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
      len--;
    if (len && !(strncmp(p, name, n) == 0 &&
                 (len == n || p[n] == '=' || p[n] == ' ' || p[n] == '\t'))) {
      if (o) {
        memcpy(out + o, "; ", 2);
        o += 2;
      }
      memcpy(out + o, p, len);
      o += len;
    }
    p += strcspn(p, ";");
  }
  out[o] = '\0';
}

void up_each_forwarded(const up_request *rq,
                       void (*fn)(void *ctx, const char *name,
                                  const char *value, const char *append),
                       void *ctx) {
  int had_xff = 0;
  for (size_t i = 0; i < rq->nheaders; i++) {
    const up_header *h = &rq->headers[i];
    int named = 0;
    /* Every Connection header counts: a second one must not hide what
     * the first names. */
    for (size_t k = 0; k < rq->nheaders && !named; k++)
      named = strcasecmp(rq->headers[k].name, "Connection") == 0 &&
              header_named_by(rq->headers[k].value, h->name);
    if (header_is_hop_by_hop(h->name) || named)
      continue;
    if (strcasecmp(h->name, "Cookie") == 0 &&
        cookie_named(h->value, CONSOLE_COOKIE)) {
      /* Left out; the rest of the line, if any, goes on. Callers count
       * a request's bytes in one pass and write them in another, so this
       * must come out the same each time: no allocation, and a line too
       * long for the buffer goes whole. */
      char rest[8192];
      if (strlen(h->value) < sizeof rest) {
        cookie_without(h->value, CONSOLE_COOKIE, rest);
        if (*rest)
          fn(ctx, h->name, rest, NULL);
      }
      continue;
    }
    if (strcasecmp(h->name, "X-Forwarded-For") == 0 && rq->client_addr) {
      had_xff = 1;
      fn(ctx, h->name, h->value, rq->client_addr);
    } else {
      fn(ctx, h->name, h->value, NULL);
    }
  }
  if (!had_xff && rq->client_addr)
    fn(ctx, "X-Forwarded-For", "", rq->client_addr);
}

/* up_each_forwarded()'s: the header as a line for libcurl. */
static void curl_line(void *ctx, const char *name, const char *value,
                      const char *append) {
  lines *l = ctx;
  if (append)
    add_line(l, name, ": ", value, *value ? ", " : "", append);
  else if (!*value)
    /* "Name;" is curl's way to send a header with an empty value. */
    add_line(l, name, ";", NULL, NULL, NULL);
  else
    add_line(l, name, ": ", value, NULL, NULL);
}

static void header_lines(const up_request *rq, lines *l) {
  up_each_forwarded(rq, curl_line, l);
  /* The upstream gets the client's request, no more: libcurl would add
   * Accept: * / * and, to a POST, Content-Type:
   * application/x-www-form-urlencoded; "Name:" tells it not to. The gateway
   * has the whole body already: no 100-continue round trip either. */
  if (!has_header(rq, "Accept"))
    add_line(l, "Accept:", NULL, NULL, NULL, NULL);
  if (!has_header(rq, "Content-Type"))
    add_line(l, "Content-Type:", NULL, NULL, NULL, NULL);
  add_line(l, "Expect:", NULL, NULL, NULL, NULL);
}

static struct curl_slist *request_headers(const up_request *rq) {
  lines count = {0, 0, NULL, NULL}, l;
  header_lines(rq, &count);
  l.n = l.bytes = 0;
  if (!(l.out = malloc(count.n * sizeof *l.out + count.bytes)))
    return NULL;
  l.text = (char *)(l.out + count.n);
  header_lines(rq, &l);
  return l.out;
}

/* ---- one transfer ----------------------------------------------------------
 */

/* An upstream socket of the transfer's own, so that running out of
 * descriptors is told apart from an upstream that refuses connections. */
static curl_socket_t open_socket(void *arg, curlsocktype purpose,
                                 struct curl_sockaddr *a) {
  xfer *x = arg;
  int fd;
  (void)purpose;
  fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  if (fd < 0 && (errno == EMFILE || errno == ENFILE))
    x->no_fds = 1;
  return fd < 0 ? CURL_SOCKET_BAD : fd;
}

/*
 * Called by libcurl just before it sends the request, on a new or a reused
 * connection. When a reused keep-alive connection dies before any answer,
 * libcurl sends the request again on a new one; but the upstream may have
 * acted on the first and died answering. The second call refuses that
 * resend, and the forward ends as sent and unanswered.
 */
static int before_send(void *arg, char *conn_primary_ip, char *conn_local_ip,
                       int conn_primary_port, int conn_local_port) {
  xfer *x = arg;
  (void)conn_primary_ip, (void)conn_local_ip, (void)conn_primary_port,
      (void)conn_local_port;
  return x->sends++ ? CURL_PREREQFUNC_ABORT : CURL_PREREQFUNC_OK;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un) {
  const xfer *x = arg;
  (void)dt, (void)dn, (void)ut, (void)un;
  return x->rq->abort_check(x->rq->abort_ctx) ? 1 : 0;
}

static int close_socket(void *arg, curl_socket_t fd);

static int setup(xfer *x) {
  CURL *c = x->curl;
  const up_request *rq = x->rq;
  char *url;
  CURLcode cc;
  if (!(x->hdrs = request_headers(rq)) ||
      asprintf(&url, "%s%s", cfg->upstream, rq->uri) < 0)
    return -1;
  /* libcurl keeps its own copy: none is held while the forward waits. */
  cc = curl_easy_setopt(c, CURLOPT_URL, url);
  free(url);
  if (cc != CURLE_OK)
    return -1;
  curl_easy_setopt(c, CURLOPT_PRIVATE, x);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  /* The path goes as the client sent it (gateway.c has refused dot
   * segments and normalised it); libcurl must not resolve "..". */
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
  /* The environment's http_proxy and friends are not the gateway's
   * configuration: a forward goes straight to --upstream. */
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  /* A connection idle for a whole second is not used again: see
   * H1_IDLE_MS in upstream_h1.c. libcurl counts whole seconds of idleness
   * and reuses up to the value (its default: 118). */
  curl_easy_setopt(c, CURLOPT_MAXAGE_CONN, 0L);
  /* A stream (an MCP GET stream, a long tool call's events) may stay open
   * for as long as its client reads it. */
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   rq->head ? 0L : (long)cfg->upstream_timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(cfg->upstream_timeout_ms < 10000
                              ? cfg->upstream_timeout_ms
                              : 10000));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hdrs);
  /* The receive buffer of each transfer, held while it waits: libcurl's
   * default (16 KB) would be most of what a forward in flight costs, and
   * tool calls answer in a few hundred bytes. */
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, rq->head ? 16384L : 1024L);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, up_on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &x->s);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, up_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &x->s);
  curl_easy_setopt(c, CURLOPT_PREREQFUNCTION, before_send);
  curl_easy_setopt(c, CURLOPT_PREREQDATA, x);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, x);
  curl_easy_setopt(c, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  if (cfg->upstream_cacert)
    curl_easy_setopt(c, CURLOPT_CAINFO, cfg->upstream_cacert);
  if (rq->abort_check) {
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  if (strcmp(rq->method, "HEAD") == 0) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (rq->body_len || strcmp(rq->method, "POST") == 0 ||
             strcmp(rq->method, "PUT") == 0 ||
             strcmp(rq->method, "PATCH") == 0) {
    /* The body is sent from the request's own memory: no upload buffer
     * (16 KB a forward) for the small bodies of tool calls. */
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, rq->body ? rq->body : "");
    if (strcmp(rq->method, "POST") != 0)
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
  } else if (strcmp(rq->method, "GET") != 0) {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
  }
  return 0;
}

/* How the transfer ended, from libcurl's code and what the sink saw. */
static up_result classify(xfer *x, CURLcode cc) {
  up_response *rs = x->rs;
  sink *s = &x->s;
  long status = 0, sent = 0; /* CURLINFO_REQUEST_SIZE is a long */
  up_result r;

  curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(x->curl, CURLINFO_REQUEST_SIZE, &sent);
  rs->status = (int)status;
  if (cc == CURLE_OK) {
    r = UP_OK;
  } else if (x->no_fds && sent == 0) {
    up_set_error(rs, "the gateway ran out of file descriptors");
    r = UP_NO_FDS;
  } else if (sent == 0 && x->sends <= 1 &&
             (x->sends == 0 || cc == CURLE_ABORTED_BY_CALLBACK ||
              cc == CURLE_OUT_OF_MEMORY)) {
    /* libcurl never got to write a byte of the request (the lease was lost
     * first, or the transfer could not start): nothing to act on. */
    up_set_error(rs, "nothing was sent: %s", curl_easy_strerror(cc));
    r = UP_NOT_SENT;
  } else if (s->too_large) {
    up_set_error(rs, "the response body is larger than %zu bytes",
                 cfg->max_pass);
    r = UP_TOO_LARGE;
  } else if (s->headers_too_large) {
    up_set_error(rs, "the response's headers are larger than %d bytes",
                 UP_MAX_HEADER_BYTES);
    r = UP_TOO_LARGE;
  } else if (s->bad_status) {
    up_set_error(rs, "the response's status is not an HTTP status (100-599)");
    r = UP_INVALID;
  } else if (s->bad_framing) {
    up_set_error(rs, "%s", s->bad_framing);
    r = UP_INVALID;
  } else if (s->upgrade) {
    up_set_error(rs, "the upstream switched protocols (101) unasked");
    r = UP_INVALID;
  } else if (sent == 0 &&
             (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
              cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_SSL_CONNECT_ERROR ||
              cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SEND_ERROR ||
              cc == CURLE_UNSUPPORTED_PROTOCOL || cc == CURLE_URL_MALFORMAT)) {
    /* Nothing of the request left: the upstream cannot have acted. */
    up_set_error(rs, "%s", curl_easy_strerror(cc));
    r = UP_NOT_SENT;
  } else if (cc == CURLE_WEIRD_SERVER_REPLY || cc == CURLE_OUT_OF_MEMORY ||
             cc == CURLE_UNSUPPORTED_PROTOCOL) {
    /* The upstream answered, with something that is not HTTP libcurl can
     * read (a status line such as "2x", a header line over its 100 KB
     * bound): it is done acting, whatever it did. */
    up_set_error(rs, "the upstream's answer is not valid HTTP (%s)",
                 curl_easy_strerror(cc));
    r = UP_INVALID;
  } else if (cc == CURLE_ABORTED_BY_CALLBACK && x->sends > 1 && sent == 0) {
    /* The resend was refused before a byte of it left; the first send
     * went out on the dead connection. */
    up_set_error(rs, "the connection closed after the request was sent, "
                     "before any answer");
    r = UP_LOST;
  } else if (status >= 200 && cc != CURLE_ABORTED_BY_CALLBACK) {
    /* A final answer had begun: the upstream has acted, and no retry may
     * send it again as if it might not have. */
    up_set_error(rs, "the answer (%ld) broke off: %s", status,
                 curl_easy_strerror(cc));
    r = UP_INVALID;
  } else if (cc == CURLE_ABORTED_BY_CALLBACK && x->sends > 1) {
    up_set_error(rs, "the connection closed after the request was sent, "
                     "before any answer");
    r = UP_LOST;
  } else if (cc == CURLE_ABORTED_BY_CALLBACK) {
    up_set_error(rs, "the key's lease was lost");
    r = UP_ABORTED;
  } else if (cc == CURLE_OPERATION_TIMEDOUT) {
    up_set_error(rs, "no answer within %lld ms",
                 (long long)cfg->upstream_timeout_ms);
    r = UP_TIMEOUT;
  } else {
    up_set_error(rs, "%s", curl_easy_strerror(cc));
    r = UP_LOST;
  }
  if (r == UP_OK)
    up_drop_named(rs, s->connection);
  if (r != UP_OK && !x->rq->head) {
    up_free_headers(rs, s);
    free(rs->body);
    rs->body = NULL;
    rs->body_len = 0;
  }
  return r;
}

/* ---- the event loop
 * ---------------------------------------------------------- */

static struct {
  pthread_t thread;
  int started;
  int epfd, wakefd;
  CURLM *multi;
  pthread_mutex_t mu;
  xfer *pending;     /* handed over, not yet added to the multi handle */
  int stopping;      /* upstream_cleanup(): end once nothing is left */
  int aborting;      /* upstream_abort(): end every forward now */
  int checking;      /* upstream_check_aborts(): ask every abort_check now */
  int closed;        /* the loop has ended: upstream_start() refuses */
  xfer *active_list; /* the loop's own: every forward added to it */
  long timeout_ms;   /* libcurl's timer: -1 none */
  double deadline;
  int active;
  /* upstream_drive(): the daemon run on this thread, its epoll descriptor
   * (nested in epfd), and forwards that its callbacks handed over here
   * (they need no wake-up: the loop takes them before it waits). */
  struct MHD_Daemon *mhd;
  int mhd_fd;
  int local_pending;
  int mhd_due;           /* upstream_driven_due() on the loop's thread */
  double tick_at;        /* upstream_after(): when (0: none) */
  void (*tick_fn)(void); /* and what then */
  int quiesce;           /* upstream_quiesce(): 1 asked, 2 done (under mu) */
  pthread_cond_t quiesced;
  CURL *spare[UP_SPARE_HANDLES]; /* under mu: reset, for the next forwards */
  int nspare;
  /* The loop's own: the epoll events each upstream socket is registered
   * for, by descriptor (0: not in epfd), and whether libcurl let go of it
   * (CURL_POLL_REMOVE: a connection back in the pool, see on_socket()). */
  struct reg {
    uint32_t events;
    int parked;
    int dirty; /* shut down in the pool, not closed by libcurl yet */
    struct h1conn *h1; /* a connection of h1's own (events unused) */
  } * reg;
  int nreg;
  int ndirty; /* sockets dirty: forwards take fresh connections meanwhile */
} L = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .quiesced = PTHREAD_COND_INITIALIZER,
       .epfd = -1,
       .wakefd = -1,
       .mhd_fd = -1,
       .timeout_ms = -1};

/* The registration of fd (NULL when the table cannot grow). */
static struct reg *reg_of(int fd) {
  if (fd < 0)
    return NULL;
  if (fd >= L.nreg) {
    int n = L.nreg ? L.nreg : 64;
    while (n <= fd)
      n *= 2;
    struct reg *r = realloc(L.reg, (size_t)n * sizeof *r);
    if (!r)
      return NULL;
    memset(r + L.nreg, 0, (size_t)(n - L.nreg) * sizeof *r);
    L.reg = r;
    L.nreg = n;
  }
  return &L.reg[fd];
}

int up_epfd(void) { return L.epfd; }

int up_fd_route(int fd, struct h1conn *c) {
  struct reg *r = c ? reg_of(fd) : (fd >= 0 && fd < L.nreg ? &L.reg[fd] : NULL);
  if (!r)
    return c ? -1 : 0;
  r->h1 = c;
  return 0;
}

xfer *up_first_active(void) { return L.active_list; }

void up_unlink_active(xfer *x) {
  if (x->prev_active)
    x->prev_active->next_active = x->next_active;
  else if (L.active_list == x)
    L.active_list = x->next_active;
  if (x->next_active)
    x->next_active->prev_active = x->prev_active;
  __atomic_fetch_sub(&L.active, 1, __ATOMIC_RELAXED);
}

/*
 * libcurl's wishes for a socket, made epoll registrations. A connection that
 * goes back to the pool (CURL_POLL_REMOVE) stays registered, parked: the
 * next forward on it mostly wants what it had (EPOLLIN), and two epoll_ctl()
 * calls a forward were a tenth of the loop's system calls. An event on a
 * parked socket (the upstream closed an idle connection) removes it then:
 * libcurl ignores events on a socket it does not watch, and level-triggered
 * epoll would report it again and again. close_socket() forgets a socket
 * before its descriptor can be reused.
 */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *userp,
                     void *socketp) {
  struct epoll_event ev;
  struct reg *r = reg_of(fd);
  (void)e, (void)userp, (void)socketp;
  if (what == CURL_POLL_REMOVE) {
    if (!r)
      epoll_ctl(L.epfd, EPOLL_CTL_DEL, fd, NULL);
    else if (r->events)
      r->parked = 1;
    return 0;
  }
  memset(&ev, 0, sizeof ev);
  ev.data.fd = fd;
  ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) |
              ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
  if (r) {
    r->parked = 0;
    if (r->events == ev.events)
      return 0;
  }
  if (epoll_ctl(L.epfd, EPOLL_CTL_MOD, fd, &ev) != 0 &&
      epoll_ctl(L.epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    /* As before the table: the transfer then ends at its timeout. */
    if (r)
      r->events = 0;
    return 0;
  }
  if (r)
    r->events = ev.events;
  return 0;
}

/* fd's entry when the table has one and it is registered, else NULL. */
static struct reg *registered(int fd) {
  return fd >= 0 && fd < L.nreg && L.reg[fd].events ? &L.reg[fd] : NULL;
}

/* Out of epoll and the table. */
static void unwatch(struct reg *r, int fd) {
  epoll_ctl(L.epfd, EPOLL_CTL_DEL, fd, NULL);
  r->events = 0;
  r->parked = 0;
}

/* An event on fd: libcurl's, or a parked socket's, which leaves epoll
 * (1). A connection in the pool has nothing to say: bytes on it now (a
 * second answer nobody asked for, the rest of a broken one) would be read
 * as the next request's answer, and stored under its key. It is shut
 * down, and until libcurl closes it (it checks its pool for dead
 * connections about once a second, not when it takes one again) every
 * forward asks libcurl for a fresh connection, so that none is sent on
 * it. An upstream that closed the connection is the same case. */
static int parked_event(int fd) {
  struct reg *r = registered(fd);
  if (!r || !r->parked)
    return 0;
  unwatch(r, fd);
  shutdown(fd, SHUT_RDWR);
  r->dirty = 1;
  L.ndirty++;
  return 1;
}

/* libcurl closes an upstream socket: out of epoll and the table first, so
 * that a socket opened later on the same descriptor is registered anew. */
static int close_socket(void *arg, curl_socket_t fd) {
  struct reg *r = registered(fd);
  (void)arg;
  if (r)
    unwatch(r, fd);
  if (fd >= 0 && fd < L.nreg && L.reg[fd].dirty) {
    L.reg[fd].dirty = 0;
    L.ndirty--;
  }
  return close(fd);
}

static int on_timer(CURLM *m, long timeout_ms, void *userp) {
  (void)m, (void)userp;
  L.timeout_ms = timeout_ms;
  L.deadline = timeout_ms >= 0 ? up_now_ms() + (double)timeout_ms : 0;
  return 0;
}

/* An easy handle for a new forward: a spare one, or a new one. */
static CURL *handle_get(void) {
  CURL *c = NULL;
  pthread_mutex_lock(&L.mu);
  if (L.nspare)
    c = L.spare[--L.nspare];
  pthread_mutex_unlock(&L.mu);
  return c ? c : curl_easy_init();
}

/* Keeps a handle whose transfer ended (removed from the multi handle) for
 * the next forward. curl_easy_reset() forgets every option, so nothing of
 * this forward (its headers, its body, its callbacks' data) can reach the
 * next one; the connection went back to the multi handle's pool. */
static void handle_put(CURL *c) {
  if (!c)
    return;
  curl_easy_reset(c);
  pthread_mutex_lock(&L.mu);
  if (L.nspare < UP_SPARE_HANDLES) {
    L.spare[L.nspare++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&L.mu);
  curl_easy_cleanup(c);
}

static void finish(xfer *x, CURLcode cc) {
  up_result r = classify(x, cc);
  x->rs->ms = up_now_ms() - x->t0;
  free(x->s.connection);
  curl_multi_remove_handle(L.multi, x->curl);
  up_unlink_active(x);
  handle_put(x->curl);
  free(x->hdrs); /* request_headers() */
  x->done(x->ctx, r);
  free(x);
}

static void reap(void) {
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(L.multi, &left)) != NULL) {
    xfer *x = NULL;
    if (m->msg != CURLMSG_DONE)
      continue;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
    finish(x, m->data.result);
  }
}

/* Ends every forward in flight as lost (they were sent) and every one
 * handed over as not sent: their done callbacks run now. */
static void take_pending(void);

static void abort_all(void) {
  take_pending();
  while (L.active_list) {
    if (L.active_list->h1)
      h1_stop(L.active_list, 0);
    else
      finish(L.active_list, CURLE_OPERATION_TIMEDOUT);
  }
}

static void take_pending(void) {
  xfer *list, *next;
  int running, curls = 0;
  pthread_mutex_lock(&L.mu);
  list = L.pending;
  L.pending = NULL;
  pthread_mutex_unlock(&L.mu);
  /* The list is newest first; start them oldest first. */
  xfer *rev = NULL;
  for (; list; list = next) {
    next = list->next;
    list->next = rev;
    rev = list;
  }
  for (xfer *x = rev; x; x = next) {
    next = x->next;
    __atomic_fetch_add(&L.active, 1, __ATOMIC_RELAXED);
    x->prev_active = NULL;
    x->next_active = L.active_list;
    if (L.active_list)
      L.active_list->prev_active = x;
    L.active_list = x;
    if (!x->h1)
      curl_easy_setopt(x->curl, CURLOPT_FRESH_CONNECT, L.ndirty > 0 ? 1L : 0L);
    if (x->h1)
      h1_start(x);
    else if (curl_multi_add_handle(L.multi, x->curl) != CURLM_OK)
      finish(x, CURLE_OUT_OF_MEMORY);
    else
      curls++;
  }
  if (curls)
    curl_multi_socket_action(L.multi, CURL_SOCKET_TIMEOUT, 0, &running);
}

/* The daemon of upstream_drive(): its quiescence when asked, then its
 * events (run_it), and the forwards its callbacks handed over. */
static void drive_mhd(struct MHD_Daemon *d, int run_it) {
  if (__atomic_load_n(&L.quiesce, __ATOMIC_ACQUIRE) == 1) {
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET)
      close(ls);
    pthread_mutex_lock(&L.mu);
    L.quiesce = 2;
    pthread_cond_broadcast(&L.quiesced);
    pthread_mutex_unlock(&L.mu);
  }
  if (run_it || L.mhd_due) {
    MHD_UNSIGNED_LONG_LONG t;
    L.mhd_due = 0;
    MHD_run(d);
    /* The forwards its callbacks handed over go out first: the server
     * works on them while the daemon finishes its turn. */
    if (L.local_pending) {
      L.local_pending = 0;
      take_pending();
    }
    /* A connection that has just answered is still on the daemon's ready
     * list (its timeout is then 0): the end of its request, then a read
     * that finds nothing. Run at once, rather than through another turn
     * of the loop's epoll_wait(), which cost two more system calls a call
     * passed through. Twice at most, so that libcurl's sockets are never
     * kept waiting by a busy daemon. */
    for (int k = 0; k < 2 && MHD_get_timeout(d, &t) == MHD_YES && t == 0; k++)
      MHD_run(d);
  }
  if (L.local_pending) {
    L.local_pending = 0;
    take_pending();
  }
}

static void *loop(void *arg) {
  struct epoll_event ev[256];
  int running;
  double mhd_deadline = 0;
  (void)arg;
  for (;;) {
    int wait = -1, n, run_mhd = 0;
    struct MHD_Daemon *mhd = __atomic_load_n(&L.mhd, __ATOMIC_ACQUIRE);
    if (L.timeout_ms >= 0) {
      double left = L.deadline - up_now_ms();
      wait = left <= 0 ? 0 : (int)left + 1;
    }
    if (mhd) {
      /* The daemon's own timeouts (idle connections) come due here too. */
      MHD_UNSIGNED_LONG_LONG t;
      mhd_deadline = 0;
      if (MHD_get_timeout(mhd, &t) == MHD_YES) {
        if (t > 60000)
          t = 60000;
        mhd_deadline = up_now_ms() + (double)t;
        if (wait < 0 || (int)t < wait)
          wait = (int)t;
      }
      if (L.mhd_due || L.local_pending)
        wait = 0;
    }
    {
      int w = h1_wait_ms(up_now_ms());
      if (w >= 0 && (wait < 0 || w < wait))
        wait = w;
    }
    if (L.tick_at > 0) {
      double left = L.tick_at - up_now_ms();
      int w = left <= 0 ? 0 : (int)left + 1;
      if (wait < 0 || w < wait)
        wait = w;
    }
    n = epoll_wait(L.epfd, ev, 256, wait);
    if (n < 0) {
      if (errno != EINTR)
        fprintf(stderr, "idem serve: upstream loop: epoll_wait: %s\n",
                strerror(errno));
      n = 0;
    }
    for (int i = 0; i < n; i++) {
      if (ev[i].data.fd == L.wakefd) {
        uint64_t v;
        if (read(L.wakefd, &v, sizeof v) < 0) {
          /* spurious: nothing to read */
        }
        take_pending();
        run_mhd = 1; /* upstream_driven_due() from another thread */
        continue;
      }
      if (mhd && ev[i].data.fd == L.mhd_fd) {
        run_mhd = 1;
        continue;
      }
      if (ev[i].data.fd < L.nreg && L.reg[ev[i].data.fd].h1) {
        h1_event(L.reg[ev[i].data.fd].h1, ev[i].events);
        continue;
      }
      if (parked_event(ev[i].data.fd))
        continue;
      int flags =
          ((ev[i].events & EPOLLIN) ? CURL_CSELECT_IN : 0) |
          ((ev[i].events & EPOLLOUT) ? CURL_CSELECT_OUT : 0) |
          ((ev[i].events & (EPOLLERR | EPOLLHUP)) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(L.multi, ev[i].data.fd, flags, &running);
    }
    if (L.timeout_ms >= 0 && up_now_ms() >= L.deadline) {
      L.timeout_ms = -1;
      curl_multi_socket_action(L.multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    reap();
    h1_tick(up_now_ms());
    if (L.tick_at > 0 && up_now_ms() >= L.tick_at) {
      L.tick_at = 0;
      L.tick_fn(); /* before the daemon runs: what it wakes goes out now */
    }
    if (mhd)
      drive_mhd(mhd,
                run_mhd || (mhd_deadline > 0 && up_now_ms() >= mhd_deadline));
    /* Before the check below: an abort and a stop asked together (one
     * wake-up) must not leave the loop asleep with nothing left. */
    if (__atomic_load_n(&L.aborting, __ATOMIC_ACQUIRE))
      abort_all();
    if (__atomic_exchange_n(&L.checking, 0, __ATOMIC_ACQ_REL)) {
      /* libcurl asks a transfer's progress callback only when it has
       * something to do for it, and a stream waiting without a timeout
       * has nothing: its abort_check is asked here instead. */
      xfer *x = L.active_list, *next;
      for (; x; x = next) {
        next = x->next_active;
        if (x->rq->abort_check && x->rq->abort_check(x->rq->abort_ctx)) {
          if (x->h1)
            h1_stop(x, 1);
          else
            finish(x, CURLE_ABORTED_BY_CALLBACK);
        }
      }
    }
    if (__atomic_load_n(&L.stopping, __ATOMIC_ACQUIRE) &&
        __atomic_load_n(&L.active, __ATOMIC_RELAXED) == 0) {
      /* Closed under the lock: upstream_start() refuses from now on, so
       * nothing handed over afterwards waits for a loop that is gone. */
      pthread_mutex_lock(&L.mu);
      int more = L.pending != NULL;
      if (!more)
        L.closed = 1;
      pthread_cond_broadcast(&L.quiesced);
      pthread_mutex_unlock(&L.mu);
      if (!more)
        break;
    }
  }
  return NULL;
}

int upstream_init(const serve_config *c) {
  struct epoll_event ev;
  cfg = c;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
    return -1;
  if ((L.epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
      (L.wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0 ||
      !(L.multi = curl_multi_init()))
    return -1;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.fd = L.wakefd;
  if (epoll_ctl(L.epfd, EPOLL_CTL_ADD, L.wakefd, &ev) != 0)
    return -1;
  curl_multi_setopt(L.multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(L.multi, CURLMOPT_TIMERFUNCTION, on_timer);
  curl_multi_setopt(L.multi, CURLMOPT_MAXCONNECTS, (long)UP_KEEP_CONNECTIONS);
  h1_on = h1_init(c) == 0; /* else every forward goes through libcurl */
  if (pthread_create(&L.thread, NULL, loop, NULL) != 0)
    return -1;
  pthread_setname_np(L.thread, "idem-upstream");
  L.started = 1;
  return 0;
}

int upstream_start(const up_request *rq, up_response *rs, up_done_fn done,
                   void *ctx) {
  xfer *x = calloc(1, sizeof *x);
  uint64_t one = 1;
  memset(rs, 0, sizeof *rs);
  if (!x)
    return -1;
  x->rq = rq;
  x->rs = rs;
  x->done = done;
  x->ctx = ctx;
  x->s.rs = rs;
  x->s.rq = rq;
  x->s.ctx = ctx;
  x->t0 = up_now_ms();
  if (h1_on) {
    if (!(x->h1 = h1_new())) {
      free(x);
      return -1;
    }
  } else if (!(x->curl = handle_get()) || setup(x) != 0) {
    handle_put(x->curl);
    free(x->hdrs); /* request_headers() */
    free(x);
    return -1;
  }
  pthread_mutex_lock(&L.mu);
  if (L.closed) {
    pthread_mutex_unlock(&L.mu);
    free(x->h1);
    handle_put(x->curl);
    free(x->hdrs); /* request_headers() */
    free(x);
    return -1;
  }
  int woken = L.pending != NULL;
  x->next = L.pending;
  L.pending = x;
  if (L.mhd && pthread_equal(pthread_self(), L.thread)) {
    /* From the daemon's callbacks, on the loop itself. */
    L.local_pending = 1;
    pthread_mutex_unlock(&L.mu);
    return 0;
  }
  /* A list that was not empty has its wake-up on the way (the loop takes
   * the whole list at once, under the lock): a batch of claims answered
   * together (idem serve) costs the loop one wake-up, not one each.
   * Under the lock: the loop closes (and upstream_cleanup() the
   * descriptor) only after taking it. */
  if (!woken && write(L.wakefd, &one, sizeof one) < 0) {
    /* The counter is full only with 2^64 - 1 wakeups pending: the loop
     * will run anyway. */
  }
  pthread_mutex_unlock(&L.mu);
  return 0;
}

void upstream_abort(void) {
  uint64_t one = 1;
  __atomic_store_n(&L.aborting, 1, __ATOMIC_RELEASE);
  pthread_mutex_lock(&L.mu);
  if (!L.closed && write(L.wakefd, &one, sizeof one) < 0) {
    /* see upstream_start() */
  }
  pthread_mutex_unlock(&L.mu);
}

void upstream_check_aborts(void) {
  uint64_t one = 1;
  __atomic_store_n(&L.checking, 1, __ATOMIC_RELEASE);
  pthread_mutex_lock(&L.mu);
  if (!L.closed && write(L.wakefd, &one, sizeof one) < 0) {
    /* see upstream_start() */
  }
  pthread_mutex_unlock(&L.mu);
}

int upstream_drive(struct MHD_Daemon *d) {
  const union MHD_DaemonInfo *di =
      MHD_get_daemon_info(d, MHD_DAEMON_INFO_EPOLL_FD);
  struct epoll_event ev;
  uint64_t one = 1;
  if (!di || di->epoll_fd < 0 || !L.started)
    return -1;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.fd = di->epoll_fd;
  pthread_mutex_lock(&L.mu);
  if (epoll_ctl(L.epfd, EPOLL_CTL_ADD, di->epoll_fd, &ev) != 0) {
    pthread_mutex_unlock(&L.mu);
    return -1;
  }
  /* The loop reads these only after its wake-up below (the lock orders
   * them): until then it has not looked at the daemon at all. */
  L.mhd_fd = di->epoll_fd;
  __atomic_store_n(&L.mhd, d, __ATOMIC_RELEASE);
  if (write(L.wakefd, &one, sizeof one) < 0) {
    /* see upstream_start() */
  }
  pthread_mutex_unlock(&L.mu);
  return 0;
}

void upstream_after(int ms, void (*fn)(void)) {
  double at = up_now_ms() + ms;
  L.tick_fn = fn;
  if (L.tick_at <= 0 || at < L.tick_at)
    L.tick_at = at;
}

void upstream_driven_due(void) {
  uint64_t one = 1;
  if (pthread_equal(pthread_self(), L.thread)) {
    L.mhd_due = 1;
    return;
  }
  pthread_mutex_lock(&L.mu);
  if (!L.closed && write(L.wakefd, &one, sizeof one) < 0) {
    /* see upstream_start() */
  }
  pthread_mutex_unlock(&L.mu);
}

void upstream_quiesce(void) {
  uint64_t one = 1;
  pthread_mutex_lock(&L.mu);
  if (!L.mhd || L.closed) {
    pthread_mutex_unlock(&L.mu);
    return;
  }
  __atomic_store_n(&L.quiesce, 1, __ATOMIC_RELEASE);
  if (write(L.wakefd, &one, sizeof one) < 0) {
    /* see upstream_start() */
  }
  while (L.quiesce == 1 && !L.closed)
    pthread_cond_wait(&L.quiesced, &L.mu);
  pthread_mutex_unlock(&L.mu);
}

int upstream_active(void) {
  return __atomic_load_n(&L.active, __ATOMIC_RELAXED);
}

void upstream_cleanup(void) {
  uint64_t one = 1;
  if (L.started) {
    __atomic_store_n(&L.stopping, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&L.mu);
    if (write(L.wakefd, &one, sizeof one) < 0) {
      /* see upstream_start() */
    }
    pthread_mutex_unlock(&L.mu);
    pthread_join(L.thread, NULL);
    L.started = 0;
  }
  h1_cleanup();
  while (L.nspare)
    curl_easy_cleanup(L.spare[--L.nspare]);
  if (L.multi)
    curl_multi_cleanup(L.multi);
  L.multi = NULL;
  free(L.reg);
  L.reg = NULL;
  L.nreg = 0;
  if (L.epfd >= 0)
    close(L.epfd);
  if (L.wakefd >= 0)
    close(L.wakefd);
  L.epfd = L.wakefd = -1;
  curl_global_cleanup();
}

/* rs->error when its text could not be allocated: never freed. */
static char no_memory[] = "out of memory";

void up_set_error(up_response *rs, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  up_set_errorv(rs, fmt, ap);
  va_end(ap);
}

void up_set_errorv(up_response *rs, const char *fmt, va_list ap) {
  char *text = NULL;
  if (vasprintf(&text, fmt, ap) < 0)
    text = NULL;
  if (rs->error != no_memory)
    free(rs->error);
  rs->error = text ? text : no_memory;
}

const char *up_error(const up_response *rs) {
  return rs->error ? rs->error : "";
}

void upstream_response_free(up_response *rs) {
  if (!rs)
    return;
  if (rs->error != no_memory)
    free(rs->error);
  rs->error = NULL;
  up_free_headers(rs, NULL);
  free(rs->body);
  rs->body = NULL;
  free(rs->content_length);
  rs->content_length = NULL;
}
