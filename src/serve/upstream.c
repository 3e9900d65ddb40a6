/*
 * upstream.c -- forwarding one request to the upstream with libcurl.
 *
 * Each gateway thread keeps its own easy handle, so that its connection to
 * the upstream stays open from one request to the next (HTTP/1.1
 * keep-alive). The handles are listed so that upstream_cleanup() can free
 * them once the threads are gone.
 *
 * What matters most here is telling "nothing was sent" from "sent, no
 * answer": the first lets the gateway release the key, the second means the
 * upstream may have acted.
 */
#include "serve.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const serve_config *cfg;

typedef struct handle {
  CURL *curl;
  struct handle *next;
} handle;

static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static handle *handles;
static _Thread_local handle *mine;

int upstream_init(const serve_config *c) {
  cfg = c;
  return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void upstream_cleanup(void) {
  pthread_mutex_lock(&handles_mu);
  while (handles) {
    handle *h = handles;
    handles = h->next;
    curl_easy_cleanup(h->curl);
    free(h);
  }
  pthread_mutex_unlock(&handles_mu);
  curl_global_cleanup();
}

static CURL *thread_handle(void) {
  if (mine) {
    curl_easy_reset(mine->curl); /* keeps the open connection */
    return mine->curl;
  }
  handle *h = calloc(1, sizeof *h);
  if (!h)
    return NULL;
  if (!(h->curl = curl_easy_init())) {
    free(h);
    return NULL;
  }
  pthread_mutex_lock(&handles_mu);
  h->next = handles;
  handles = h;
  pthread_mutex_unlock(&handles_mu);
  mine = h;
  return h->curl;
}

int header_is_hop_by_hop(const char *n) {
  static const char *const hop[] = {
      "connection",         "keep-alive", "proxy-authenticate",
      "proxy-authorization", "proxy-connection", "te", "trailer", "trailers",
      "transfer-encoding",  "upgrade",    "host", "content-length", "expect",
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

typedef struct sink {
  up_response *rs;
  size_t cap, hcap;
  int too_large;
  int saw_status; /* headers of the final response (not 100 Continue) */
  char *connection; /* the response's Connection header: more hop-by-hop */
} sink;

static void free_headers(up_response *rs) {
  for (size_t i = 0; i < rs->nheaders; i++) {
    free(rs->headers[i].name);
    free(rs->headers[i].value);
  }
  free(rs->headers);
  rs->headers = NULL;
  rs->nheaders = 0;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  up_response *rs = s->rs;
  size_t len = size * n, nl, vl;
  char *colon;
  if (len >= 5 && strncmp(p, "HTTP/", 5) == 0) {
    /* A new status line: interim (1xx) responses come first and their
     * headers are dropped. */
    free_headers(rs);
    free(s->connection);
    s->connection = NULL;
    return len;
  }
  while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
    len--;
  if (!len || !(colon = memchr(p, ':', len)))
    return size * n;
  nl = (size_t)(colon - p);
  colon++;
  while (colon < p + len && (*colon == ' ' || *colon == '\t'))
    colon++;
  vl = (size_t)(p + len - colon);
  if (rs->nheaders == s->hcap) {
    size_t cap = s->hcap ? s->hcap * 2 : 16;
    up_header *h = realloc(rs->headers, cap * sizeof *h);
    if (!h)
      return 0;
    rs->headers = h;
    s->hcap = cap;
  }
  up_header *h = &rs->headers[rs->nheaders];
  if (!(h->name = strndup(p, nl)) || !(h->value = strndup(colon, vl))) {
    free(h->name);
    return 0;
  }
  if (header_is_hop_by_hop(h->name)) {
    if (strcasecmp(h->name, "Connection") == 0 && !s->connection)
      s->connection = strdup(h->value);
    free(h->name);
    free(h->value);
    return size * n;
  }
  rs->nheaders++;
  return size * n;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  sink *s = arg;
  up_response *rs = s->rs;
  size_t len = size * n;
  if (rs->body_len + len > cfg->max_pass) {
    s->too_large = 1;
    return 0; /* aborts the transfer */
  }
  if (rs->body_len + len + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 16384;
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

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un) {
  const up_request *rq = arg;
  (void)dt, (void)dn, (void)ut, (void)un;
  return rq->abort_check(rq->abort_ctx) ? 1 : 0;
}

/*
 * The request body, given to libcurl by a read callback that cannot be
 * rewound. When a reused keep-alive connection dies before any answer,
 * libcurl sends the request again on a new one; but the upstream may have
 * acted on the first and died answering. A body that cannot be rewound
 * makes that resend fail (CURLE_SEND_FAIL_REWIND) instead.
 */
typedef struct body_reader {
  const char *p;
  size_t len, off;
} body_reader;

static size_t read_body(char *buf, size_t size, size_t n, void *arg) {
  body_reader *b = arg;
  size_t want = size * n, left = b->len - b->off;
  if (want > left)
    want = left;
  memcpy(buf, b->p + b->off, want);
  b->off += want;
  return want;
}

static int seek_body(void *arg, curl_off_t offset, int origin) {
  (void)arg, (void)offset, (void)origin;
  return CURL_SEEKFUNC_CANTSEEK;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the forward ---------------------------------------------------------- */

static struct curl_slist *request_headers(const up_request *rq) {
  struct curl_slist *l = NULL, *n;
  char *line;
  const char *connection = NULL;
  int had_xff = 0;
  for (size_t i = 0; i < rq->nheaders; i++)
    if (strcasecmp(rq->headers[i].name, "Connection") == 0)
      connection = rq->headers[i].value;
  for (size_t i = 0; i < rq->nheaders; i++) {
    const up_header *h = &rq->headers[i];
    if (header_is_hop_by_hop(h->name) ||
        header_named_by(connection, h->name))
      continue;
    if (strcasecmp(h->name, "X-Forwarded-For") == 0 && rq->client_addr) {
      had_xff = 1;
      if (asprintf(&line, "%s: %s, %s", h->name, h->value, rq->client_addr) <
          0)
        goto fail;
    } else if (!*h->value) {
      /* "Name;" is curl's way to send a header with an empty value. */
      if (asprintf(&line, "%s;", h->name) < 0)
        goto fail;
    } else if (asprintf(&line, "%s: %s", h->name, h->value) < 0) {
      goto fail;
    }
    n = curl_slist_append(l, line);
    free(line);
    if (!n)
      goto fail;
    l = n;
  }
  if (!had_xff && rq->client_addr) {
    if (asprintf(&line, "X-Forwarded-For: %s", rq->client_addr) < 0)
      goto fail;
    n = curl_slist_append(l, line);
    free(line);
    if (!n)
      goto fail;
    l = n;
  }
  /* The gateway has the whole body already: no 100-continue round trip. A
   * client's own Accept header stands; curl adds none when the list names
   * it as empty. */
  if (!(n = curl_slist_append(l, "Expect:")))
    goto fail;
  l = n;
  return l;
fail:
  curl_slist_free_all(l);
  return NULL;
}

up_result upstream_forward(const up_request *rq, up_response *rs) {
  CURL *c;
  struct curl_slist *hdrs = NULL;
  char *url = NULL;
  sink s = {rs, 0, 0, 0, 0, NULL};
  body_reader body = {rq->body, rq->body_len, 0};
  CURLcode cc;
  long status = 0;
  long sent = 0; /* CURLINFO_REQUEST_SIZE is a long */
  double t0 = now_ms();
  up_result r;

  memset(rs, 0, sizeof *rs);
  if (!(c = thread_handle()) || !(hdrs = request_headers(rq)) ||
      asprintf(&url, "%s%s", cfg->upstream, rq->uri) < 0) {
    url = NULL;
    snprintf(rs->error, sizeof rs->error, "out of memory");
    r = UP_NOT_SENT;
    goto out;
  }
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)cfg->upstream_timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(cfg->upstream_timeout_ms < 10000
                              ? cfg->upstream_timeout_ms
                              : 10000));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &s);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  if (cfg->upstream_cacert)
    curl_easy_setopt(c, CURLOPT_CAINFO, cfg->upstream_cacert);
  if (rq->abort_check) {
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, (void *)rq);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  }
  if (strcmp(rq->method, "HEAD") == 0) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (rq->body_len || strcmp(rq->method, "POST") == 0 ||
             strcmp(rq->method, "PUT") == 0 ||
             strcmp(rq->method, "PATCH") == 0) {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                     (curl_off_t)rq->body_len);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, read_body);
    curl_easy_setopt(c, CURLOPT_READDATA, &body);
    curl_easy_setopt(c, CURLOPT_SEEKFUNCTION, seek_body);
    if (!rq->body_len)
      /* Nothing to read means nothing to rewind, and libcurl would resend
       * on a new connection: an empty body takes a new one from the
       * start (rare enough to cost nothing that matters). */
      curl_easy_setopt(c, CURLOPT_FRESH_CONNECT, 1L);
    if (strcmp(rq->method, "POST") != 0)
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
  } else if (strcmp(rq->method, "GET") != 0) {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, rq->method);
  }

  cc = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(c, CURLINFO_REQUEST_SIZE, &sent);
  rs->status = (int)status;
  if (cc == CURLE_OK) {
    r = UP_OK;
  } else if (s.too_large) {
    snprintf(rs->error, sizeof rs->error,
             "the response is larger than %zu bytes", cfg->max_pass);
    r = UP_TOO_LARGE;
  } else if (sent == 0 &&
             (cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
              cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_SSL_CONNECT_ERROR ||
              cc == CURLE_PEER_FAILED_VERIFICATION ||
              cc == CURLE_SEND_ERROR || cc == CURLE_UNSUPPORTED_PROTOCOL ||
              cc == CURLE_URL_MALFORMAT)) {
    /* Nothing of the request left: the upstream cannot have acted. */
    snprintf(rs->error, sizeof rs->error, "%s", curl_easy_strerror(cc));
    r = UP_NOT_SENT;
  } else if (cc == CURLE_ABORTED_BY_CALLBACK) {
    snprintf(rs->error, sizeof rs->error, "the key's lease was lost");
    r = UP_ABORTED;
  } else if (cc == CURLE_OPERATION_TIMEDOUT) {
    snprintf(rs->error, sizeof rs->error, "no answer within %lld ms",
             (long long)cfg->upstream_timeout_ms);
    r = UP_TIMEOUT;
  } else {
    snprintf(rs->error, sizeof rs->error, "%s", curl_easy_strerror(cc));
    r = UP_LOST;
  }
  if (r == UP_OK && s.connection) {
    /* Headers the Connection header names are hop-by-hop too. */
    size_t k = 0;
    for (size_t i = 0; i < rs->nheaders; i++) {
      if (header_named_by(s.connection, rs->headers[i].name)) {
        free(rs->headers[i].name);
        free(rs->headers[i].value);
      } else {
        rs->headers[k++] = rs->headers[i];
      }
    }
    rs->nheaders = k;
  }
  free(s.connection);
  if (r != UP_OK) {
    free_headers(rs);
    free(rs->body);
    rs->body = NULL;
    rs->body_len = 0;
  }
out:
  rs->ms = now_ms() - t0;
  curl_slist_free_all(hdrs);
  free(url);
  return r;
}

void upstream_response_free(up_response *rs) {
  if (!rs)
    return;
  free_headers(rs);
  free(rs->body);
  rs->body = NULL;
}
