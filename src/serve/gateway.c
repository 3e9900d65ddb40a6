/*
 * gateway.c -- the gateway's request path: from an HTTP request to a
 * replay, a refusal, or a forward through idem_execute().
 *
 * libmicrohttpd calls handle() several times per request: once when the
 * headers are in (every check that needs no body is made then, so that a
 * bad key or a body over --max-body is refused before the body is read and
 * before anything is claimed), once per piece of the body, and once at the
 * end, when the request is decided. The gateway's threads are
 * libmicrohttpd's thread pool; a forward blocks its thread, which keeps its
 * own connection to the upstream (upstream.c).
 */
#include "principal.h"
#include "serve.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cli.h"

#define PROBLEM_TYPE "urn:idem:problem:"

static const serve_config *cfg;
static idem_store *store;
static int draining;

void gateway_set_draining(void) {
  __atomic_store_n(&draining, 1, __ATOMIC_RELEASE);
}

/* One request as it is received. */
typedef struct req {
  char *uri; /* the request target, as the client sent it */
  int started;
  int answered; /* a response was queued before the body was read */
  int protect;  /* keyed, with a method the gateway protects */
  char *body;
  size_t len, cap;
  int too_big;
  double t0;
  char *key;          /* the key, quotes of a structured field removed */
  char *tenant;
  char *path;         /* printable ASCII: the path, percent-encoded where not */
  char *operation;
  struct job *job; /* the decision and forward, while the connection is
                      suspended; its answer once resumed */
} req;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- answers -------------------------------------------------------------- */

static void log_answer(req *r, const char *method, serve_outcome o,
                       int status, double upstream_ms, const char *note) {
  access_entry e = {method,      r->path ? r->path : "",
                    o,           status,
                    upstream_ms, now_ms() - r->t0,
                    r->protect ? r->key : NULL,
                    r->protect ? r->tenant : NULL,
                    note};
  metrics_request(o);
  metrics_status(status); /* health (part 9): answers by status */
  accesslog_write(&e);
}

static enum MHD_Result queue(struct MHD_Connection *c,
                             struct MHD_Response *resp, int status) {
  enum MHD_Result ok;
  if (!resp)
    return MHD_NO;
  /* Draining: no new request on this connection; the client reconnects
   * to another gateway. */
  if (__atomic_load_n(&draining, __ATOMIC_ACQUIRE))
    MHD_add_response_header(resp, "Connection", "close");
  ok = MHD_queue_response(c, (unsigned)status, resp);
  MHD_destroy_response(resp);
  return ok;
}

/*
 * An answer of the gateway's own: RFC 9457 problem details, logged. detail
 * tells the caller what to do next. retry_after > 0 adds Retry-After
 * (seconds). NULL when out of memory.
 */
static struct MHD_Response *problem_response(req *r, const char *method,
                                             serve_outcome o, int status,
                                             const char *type,
                                             const char *title,
                                             int retry_after,
                                             double upstream_ms,
                                             const char *detail) {
  char t[128], ra[24];
  json_t *j;
  char *text;
  struct MHD_Response *resp;

  snprintf(t, sizeof t, PROBLEM_TYPE "%s", type);
  j = json_pack("{s:s, s:s, s:i, s:s}", "type", t, "title", title, "status",
                status, "detail", detail);
  text = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!text)
    return NULL;
  resp = MHD_create_response_from_buffer_with_free_callback(strlen(text), text,
                                                            free);
  if (!resp) {
    free(text);
    return NULL;
  }
  MHD_add_response_header(resp, "Content-Type", "application/problem+json");
  if (retry_after > 0) {
    snprintf(ra, sizeof ra, "%d", retry_after);
    MHD_add_response_header(resp, "Retry-After", ra);
  }
  if (status == 401) {
    char ch[128];
    if (principal_challenge(cfg->principal, ch, sizeof ch))
      MHD_add_response_header(resp, "WWW-Authenticate", ch);
  }
  log_answer(r, method, o, status, upstream_ms, type);
  return resp;
}

/* problem_response(), queued at once: for answers made on libmicrohttpd's
 * thread, inside the handler. */
static enum MHD_Result problem(struct MHD_Connection *c, req *r,
                               const char *method, serve_outcome o,
                               int status, const char *type,
                               const char *title, int retry_after,
                               double upstream_ms, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));

static enum MHD_Result problem(struct MHD_Connection *c, req *r,
                               const char *method, serve_outcome o,
                               int status, const char *type,
                               const char *title, int retry_after,
                               double upstream_ms, const char *fmt, ...) {
  char detail[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return queue(c,
               problem_response(r, method, o, status, type, title,
                                retry_after, upstream_ms, detail),
               status);
}

/* Adds the upstream's end-to-end headers; Date is the gateway's own. */
static void add_headers(struct MHD_Response *resp, const up_header *h,
                        size_t n) {
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(h[i].name, "Date") != 0)
      MHD_add_response_header(resp, h[i].name, h[i].value);
}

/*
 * The upstream's answer, passed on and logged; takes rs->body. note, when
 * not NULL, goes in Idem-Record. NULL when out of memory.
 */
static struct MHD_Response *pass_on(req *r, const char *method,
                                    serve_outcome o, up_response *rs,
                                    const char *note) {
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(
      rs->body_len, rs->body ? rs->body : (char *)"", rs->body ? free : NULL);
  if (!resp)
    return NULL;
  rs->body = NULL;
  add_headers(resp, rs->headers, rs->nheaders);
  if (rs->content_length &&
      (strcmp(method, "HEAD") == 0 || rs->status == 304) &&
      MHD_set_response_options(resp, MHD_RF_INSANITY_HEADER_CONTENT_LENGTH,
                               MHD_RO_END) == MHD_YES)
    /* No body here, but the length the body would have: libmicrohttpd
     * would say 0. */
    MHD_add_response_header(resp, "Content-Length", rs->content_length);
  if (note)
    MHD_add_response_header(resp, "Idem-Record", note);
  log_answer(r, method, o, rs->status, rs->ms, note);
  return resp;
}

/*
 * Header values that are not UTF-8 (obs-text, in practice ISO-8859-1) are
 * stored as [name, value read as ISO-8859-1, "latin1"], since JSON holds
 * UTF-8 only; the replay turns them back into the bytes that came. Both
 * return malloc()ed text, NULL when out of memory.
 */
static char *latin1_to_utf8(const char *v) {
  char *out = malloc(strlen(v) * 2 + 1), *o = out;
  if (!out)
    return NULL;
  for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
    if (*p < 0x80) {
      *o++ = (char)*p;
    } else {
      *o++ = (char)(0xc0 | (*p >> 6));
      *o++ = (char)(0x80 | (*p & 0x3f));
    }
  }
  *o = 0;
  return out;
}

static char *utf8_to_latin1(const char *v) {
  char *out = malloc(strlen(v) + 1), *o = out;
  if (!out)
    return NULL;
  for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
    if ((p[0] & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80) {
      *o++ = (char)(((p[0] & 0x1f) << 6) | (p[1] & 0x3f));
      p++;
    } else {
      *o++ = (char)*p;
    }
  }
  *o = 0;
  return out;
}

/* A stored response, logged: its status, headers and body. recovered: the
 * record was finished after a RECOVER (an earlier attempt may have acted
 * too). NULL when out of memory. */
static struct MHD_Response *replay(req *r, const char *method,
                                   const idem_response *st, int recovered) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      st->body_len, (void *)(st->body ? st->body : ""),
      MHD_RESPMEM_MUST_COPY);
  json_t *meta = NULL, *h;
  size_t i;
  if (!resp)
    return NULL;
  if (st->meta_len &&
      (meta = json_loadb(st->meta, st->meta_len, 0, NULL)) != NULL &&
      json_is_array(meta)) {
    json_array_foreach(meta, i, h) {
      const char *n = json_string_value(json_array_get(h, 0));
      const char *v = json_string_value(json_array_get(h, 1));
      const char *enc = json_string_value(json_array_get(h, 2));
      char *raw = NULL;
      if (n && v && enc && strcmp(enc, "latin1") == 0)
        v = raw = utf8_to_latin1(v);
      if (n && v)
        MHD_add_response_header(resp, n, v);
      free(raw);
    }
  }
  json_decref(meta);
  MHD_add_response_header(resp, "Idempotent-Replayed", "true");
  if (recovered)
    MHD_add_response_header(resp, "Idem-Record", "recovered");
  log_answer(r, method, OUT_REPLAY, st->status, 0,
             recovered ? "recovered" : NULL);
  return resp;
}

/* ---- the request ------------------------------------------------------------ */

/* The request's headers. Names and values are libmicrohttpd's own strings,
 * kept in the connection's memory until the request completes: a job,
 * which never outlives its request, reads them without copies (upstream
 * starts copy what they forward). */
typedef struct headers {
  up_header *h;
  size_t n, cap;
  int keys;    /* how many Idempotency-Key headers */
  int types;   /* how many Content-Type headers */
  int failed;
} headers;

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind,
                               const char *name, size_t nl, const char *value,
                               size_t vl) {
  headers *hs = cls;
  (void)kind;
  if (strcasecmp(name, "Idempotency-Key") == 0)
    hs->keys++;
  if (strcasecmp(name, "Content-Type") == 0)
    hs->types++;
  if (hs->n == hs->cap) {
    size_t cap = hs->cap ? hs->cap * 2 : 8;
    up_header *h = realloc(hs->h, cap * sizeof *h);
    if (!h) {
      hs->failed = 1;
      return MHD_NO;
    }
    hs->h = h;
    hs->cap = cap;
  }
  (void)nl, (void)vl;
  hs->h[hs->n].name = (char *)name;
  hs->h[hs->n].value = (char *)(value ? value : "");
  hs->n++;
  return MHD_YES;
}

static void headers_free(headers *hs) { free(hs->h); }

static int method_protected(const char *method) {
  char m[SERVE_METHOD_MAX + 3];
  /* Longer methods are refused before (serve_check_head()). */
  if (snprintf(m, sizeof m, ",%s,", method) >= (int)sizeof m)
    return 0;
  return strstr(cfg->methods, m) != NULL;
}

/* The checks made once the headers are in. MHD_YES to read the body. */
static enum MHD_Result begin(struct MHD_Connection *c, req *r,
                             const char *method) {
  /* framing.c: a request the gateway cannot frame without doubt, or whose
   * target leaves the upstream's base, is refused and its connection
   * closed (whatever follows on it cannot be told from a smuggled
   * request). Otherwise the target is normalised here, so that the
   * operation, the fingerprint and the forward all use one spelling. */
  serve_refusal refusal;
  char *target = NULL;
  if (serve_check_head(c, method, r->uri, &refusal) != 0 ||
      !(target = serve_target(r->uri, &refusal))) {
    struct MHD_Response *resp;
    r->started = r->answered = 1;
    if (!(r->path = serve_printable(r->uri, strcspn(r->uri, "?"))))
      return MHD_NO;
    resp = problem_response(r, method, OUT_REJECTED, refusal.status,
                            refusal.type, refusal.title, 0, 0,
                            refusal.detail);
    if (!resp)
      return MHD_NO;
    MHD_add_response_header(resp, "Connection", "close");
    return queue(c, resp, refusal.status);
  }
  free(r->uri);
  r->uri = target;
  const char *v, *q = strchr(r->uri, '?');
  char why[600], tenant[300], operation[256];
  headers hs = {0};
  int status;
  size_t plen = q ? (size_t)(q - r->uri) : strlen(r->uri);

  r->started = 1;
  if (!(r->path = serve_printable(r->uri, plen)))
    return MHD_NO;
  /* Only a path is appended to the upstream's base URL: "@host/x" or
   * "http://host/x" would name another host. */
  if (r->uri[0] != '/') {
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "bad-target",
                   "Request target is not a path", 0, 0,
                   "The request target must be a path starting with '/' "
                   "(origin-form); nothing was claimed or forwarded.");
  }
  v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  if (v && strtoull(v, NULL, 10) > cfg->max_body) {
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 413, "body-too-large",
                   "Request body too large", 0, 0,
                   "The request body has %s bytes; this gateway takes at "
                   "most %zu. Nothing was claimed or forwarded: send a "
                   "smaller request.",
                   v, cfg->max_body);
  }
  if (!method_protected(method))
    return MHD_YES;
  MHD_get_connection_values_n(c, MHD_HEADER_KIND, collect, &hs);
  /* The headers are read again for the principal below: kept till then
   * only for a request that may be keyed. */
  v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
  if (hs.failed || hs.types > 1 || hs.keys > 1 || !v)
    headers_free(&hs);
  if (hs.failed)
    return MHD_NO;
  if (hs.types > 1) {
    /* Which one the upstream reads is its parser's choice; the
     * fingerprint must not rest on a guess. */
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "bad-header",
                   "Two Content-Type headers", 0, 0,
                   "The request has %d Content-Type headers; send exactly "
                   "one.",
                   hs.types);
  }
  if (hs.keys > 1) {
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "bad-key",
                   "Malformed Idempotency-Key", 0, 0,
                   "The request has %d Idempotency-Key headers; send "
                   "exactly one.",
                   hs.keys);
  }
  if (!v) {
    if (!cfg->require_key)
      return MHD_YES; /* passes through unprotected */
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "key-required",
                   "Idempotency-Key required", 0, 0,
                   "%s requests need an Idempotency-Key header: a unique "
                   "value (for example a UUID) made once per intended "
                   "action and sent again, unchanged, with every retry of "
                   "it.",
                   method);
  }
  if (!(r->key = serve_parse_key(v, why, sizeof why))) {
    headers_free(&hs);
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "bad-key",
                   "Malformed Idempotency-Key", 0, 0,
                   "The Idempotency-Key is not valid: %s. Use 1-255 "
                   "printable ASCII characters, for example a UUID.",
                   why);
  }
  /* The tenant: whose the request is, by the --principal rule
   * (principal.h); a keyed request that names no principal is refused,
   * never given a tenant another shares. */
  if ((status = principal_tenant(cfg->principal, hs.h, hs.n, "", tenant,
                                 sizeof tenant, why, sizeof why)) != 0) {
    headers_free(&hs);
    r->answered = 1;
    if (status == 401)
      return problem(c, r, method, OUT_REJECTED, 401, "no-principal",
                     "No principal", 0, 0,
                     "Nothing was claimed or forwarded: %s.", why);
    return problem(c, r, method, OUT_REJECTED, status, "bad-tenant",
                   "Malformed principal", 0, 0,
                   "Nothing was claimed or forwarded: %s.", why);
  }
  headers_free(&hs);
  if (!(r->tenant = strdup(tenant)))
    return MHD_NO;
  r->protect = 1;
  if (serve_operation(method, r->path, operation, sizeof operation) != 0) {
    r->answered = 1;
    return problem(c, r, method, OUT_REJECTED, 400, "bad-method",
                   "Method too long", 0, 0,
                   "A method of more than 32 characters cannot be "
                   "protected.");
  }
  return (r->operation = strdup(operation)) ? MHD_YES : MHD_NO;
}

/* ---- the decision and the forward, off libmicrohttpd's threads ------------- */

/*
 * A request whose body is in is decided and forwarded while its connection
 * is suspended (MHD_suspend_connection()), so that no thread waits for the
 * store or the upstream on its behalf:
 *
 *   finish()  (libmicrohttpd's thread)  the job is made, the connection
 *             suspended; a keyed request's claim is queued on the store
 *             (claim(): idem_execute_begin_async()), an unkeyed one goes
 *             straight to the upstream loop
 *   claimed() (the store's thread)      a replay or a refusal is answered;
 *             PROCEED and RECOVER go upstream
 *   forwarded()  (the upstream loop)    the answer is in: its record is
 *             queued on the store (idem_execute_end_async())
 *   recorded()  (the store's thread)    the record is written: answered
 *   answer()  (any)                     the response is kept in the job and
 *             the connection resumed; libmicrohttpd calls handle() again,
 *             which queues it
 *
 * While the forward runs, the store's scheduler renews the key's lease.
 */
typedef struct job {
  struct MHD_Connection *c;
  req *r;
  char method[SERVE_METHOD_MAX + 1];
  headers hs;
  char addr[INET6_ADDRSTRLEN];
  int json_type;
  char *rj; /* the request as fingerprinted (serve_request_json()), made
               only with --keep-requests: the record keeps it */
  char fp[IDEM_FINGERPRINT_SIZE]; /* its fingerprint (one pass) */
  up_request rq;
  up_response rs;
  up_result result;
  idem_exec *exec;
  idem_call *call;
  idem_exec_result verdict; /* what the forward told the store */
  char *meta;
  double s0, store_ms;
  int attached; /* 1 while claimed again and waiting for the key in flight
                   (attach()), 2 after */
  struct MHD_Response *resp; /* the answer, until handle() queues it */
  int status;
  int ready; /* resp and status are final (resp NULL: out of memory) */
  /* --replay-check-url: the check of the caller's credentials. */
  up_request ck_rq;
  up_response ck_rs;
  up_header *ck_h;
  char ck_id[IDEM_FINGERPRINT_SIZE];
} job;

static void job_free(job *j) {
  if (!j)
    return;
  if (j->resp)
    MHD_destroy_response(j->resp);
  headers_free(&j->hs);
  upstream_response_free(&j->rs);
  upstream_response_free(&j->ck_rs);
  free(j->ck_h);
  idem_call_free(j->call);
  free(j->meta);
  free(j->rj);
  free(j);
}

/* The job's answer is made: hand the connection back to libmicrohttpd. */
static void answer(job *j, struct MHD_Response *resp, int status) {
  j->resp = resp;
  j->status = status;
  j->ready = 1;
  metrics_waiting(-1);
  MHD_resume_connection(j->c);
}

static void answer_problem(job *j, serve_outcome o, int status,
                           const char *type, const char *title,
                           int retry_after, double upstream_ms,
                           const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));

static void answer_problem(job *j, serve_outcome o, int status,
                           const char *type, const char *title,
                           int retry_after, double upstream_ms,
                           const char *fmt, ...) {
  char detail[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  answer(j,
         problem_response(j->r, j->method, o, status, type, title,
                          retry_after, upstream_ms, detail),
         status);
}

static int lease_lost(void *ctx) {
  job *j = ctx;
  return j->exec && idem_exec_lost(j->exec);
}

/* The headers kept with a stored response: all end-to-end ones but Date
 * (a replay is a new message) and Set-Cookie (a cookie set for the first
 * caller is not handed to whoever replays; see docs/gateway.md). */
static char *stored_meta(const up_response *rs, size_t *len) {
  json_t *a = json_array();
  char *s;
  if (!a)
    return NULL;
  for (size_t i = 0; i < rs->nheaders; i++) {
    if (strcasecmp(rs->headers[i].name, "Date") == 0 ||
        strcasecmp(rs->headers[i].name, "Set-Cookie") == 0)
      continue;
    json_t *pair = json_pack("[s,s]", rs->headers[i].name,
                             rs->headers[i].value);
    if (!pair) { /* a value that is not UTF-8: kept as ISO-8859-1 */
      char *u = latin1_to_utf8(rs->headers[i].value);
      pair = u ? json_pack("[s,s,s]", rs->headers[i].name, u, "latin1")
               : NULL;
      free(u);
    }
    if (!pair) /* a name that is not UTF-8 (not a token): not kept */
      continue;
    json_array_append_new(a, pair);
  }
  s = json_dumps(a, JSON_COMPACT);
  json_decref(a);
  *len = s ? strlen(s) : 0;
  return s;
}

static int client_address(struct MHD_Connection *c, char *a, size_t size) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = ci ? ci->client_addr : NULL;
  if (!sa)
    return -1;
  if (sa->sa_family == AF_INET)
    return inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, a,
                     (socklen_t)size)
               ? 0
               : -1;
  if (sa->sa_family == AF_INET6)
    return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr,
                     a, (socklen_t)size)
               ? 0
               : -1;
  return -1;
}

static int retry_after_s(int64_t ms) {
  int64_t s = (ms + 999) / 1000;
  return s < 1 ? 1 : s > 86400 ? 86400 : (int)s;
}

static int store_trouble(int rc) {
  return rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE || rc == IDEM_ESTORE ||
         rc == IDEM_EIO || rc == IDEM_ENOMEM || rc == IDEM_ECORRUPT ||
         rc == IDEM_ESCHEMA;
}

/* Out of descriptors: said at most once a second. */
static void log_no_fds(void) {
  static serve_rate rate = SERVE_RATE_INIT;
  unsigned long n;
  if (!serve_rate_pass(&rate, &n))
    return;
  fprintf(stderr,
          "idem serve: out of file descriptors: answering 503 "
          "(%lu more since the last message; raise the limit: ulimit -n)\n",
          n);
}

static void answer_no_fds(job *j, const char *what) {
  log_no_fds();
  answer_problem(j, OUT_ERROR, 503, "overloaded", "Gateway overloaded", 1,
                 j->rs.ms,
                 "The gateway has no file descriptor left to reach the "
                 "upstream; nothing was sent%s. Retry the same request "
                 "with the same key.",
                 what);
}

/* An unkeyed request's answer, made on a store worker (the access log
 * writes; the upstream loop must not wait on it). */
static void pass_through_answer(void *ctx) {
  job *j = ctx;
  up_result result = j->result;
  if (result == UP_OK)
    answer(j, pass_on(j->r, j->method, OUT_PASSTHROUGH, &j->rs, NULL),
           j->rs.status);
  else if (result == UP_NO_FDS)
    answer_no_fds(j, "");
  else
    answer_problem(j, OUT_ERROR, 502, "upstream-failed", "Upstream failed",
                   0, j->rs.ms,
                   "The upstream did not answer: %s. This request had no "
                   "Idempotency-Key, so the gateway cannot tell whether it "
                   "acted.",
                   up_error(&j->rs));
}

/* An unkeyed request's forward ended (the upstream loop's thread). */
static void passed_through(void *ctx, up_result result) {
  job *j = ctx;
  j->result = result;
  metrics_upstream_ms(j->rs.ms);
  if (pool_submit(pass_through_answer, j) != 0)
    pass_through_answer(j); /* the pool is gone or out of memory */
}

/* What the store is told of a forward that ended with result. */
static idem_exec_result verdict_of(job *j, up_result result,
                                   idem_response *out) {
  size_t meta_len = 0;
  switch (result) {
  case UP_OK:
    break;
  case UP_NOT_SENT:
  case UP_NO_FDS:
    return IDEM_EXEC_NOT_DONE;
  case UP_TIMEOUT:
  case UP_LOST:
    /* It may have acted, and may still be acting. */
    return IDEM_EXEC_LEAVE_IN_PROGRESS;
  case UP_TOO_LARGE:
  case UP_ABORTED:
  case UP_INVALID:
  default:
    return IDEM_EXEC_UNKNOWN;
  }
  if (j->rs.status >= 500 && cfg->no_store_5xx)
    return IDEM_EXEC_NOT_DONE;
  /* Answers that say the request was not processed, and when to come
   * back: 408 (too slow to send it), 425 (too early), 429 (too many
   * requests). Stored, they would be replayed with their old Retry-After
   * to a client that waited as told; released, the retry gets through. */
  if (j->rs.status == 408 || j->rs.status == 425 || j->rs.status == 429)
    return IDEM_EXEC_NOT_DONE;
  /* --max-response bounds the body; the headers have their own bound
   * (upstream.c). */
  if (!(j->meta = stored_meta(&j->rs, &meta_len)) ||
      j->rs.body_len > cfg->max_response)
    return IDEM_EXEC_UNKNOWN;
  out->status = j->rs.status;
  out->meta = j->meta;
  out->meta_len = meta_len;
  out->body = j->rs.body;
  out->body_len = j->rs.body_len;
  metrics_stored_bytes(meta_len + j->rs.body_len);
  return IDEM_EXEC_DONE;
}

/* "recovered; " before a note when the claim was a RECOVER. */
static const char *note(job *j, const char *plain, const char *recovered) {
  return idem_call_outcome(j->call) == IDEM_RECOVER ? recovered : plain;
}

/* A keyed forward's answer is recorded (rc): the client's answer, on the
 * thread that recorded it. */
static void recorded(void *ctx, int rc) {
  job *j = ctx;
  serve_outcome so =
      idem_call_outcome(j->call) == IDEM_RECOVER ? OUT_RECOVER : OUT_PROCEED;

  j->exec = NULL; /* ended, and freed */
  metrics_store_ms(j->store_ms + now_ms() - j->s0);
  if (rc != IDEM_OK) {
    /* health (part 9): the reason, on standard error. */
    serve_log_store_error("record", rc, idem_errmsg());
    /* It ran, but its result is not recorded (the lease was taken over,
     * or the store failed past the retries). The caller still gets what
     * the upstream answered. */
    if (j->result == UP_OK)
      answer(j,
             pass_on(j->r, j->method, so, &j->rs,
                     rc == IDEM_ESTALE
                         ? note(j, "not-stored; lease-lost",
                                "recovered; not-stored; lease-lost")
                     /* The key marked unknown after the failure (a retry
                      * is 409 outcome-unknown), or left in progress when
                      * that mark failed too (a retry after the lease may
                      * take it over): the header says which. */
                     : idem_call_state(j->call) == IDEM_STATE_UNKNOWN
                         ? note(j, "unknown; store-failed",
                                "recovered; unknown; store-failed")
                         : note(j, "not-stored; store-failed",
                                "recovered; not-stored; store-failed")),
             j->rs.status);
    else
      answer_problem(j, OUT_ERROR, 502, "upstream-failed", "Upstream failed",
                     0, j->rs.ms,
                     "The upstream was asked but did not answer (%s), and "
                     "the store could not record it (%s). It may have "
                     "acted: do not retry blindly.",
                     up_error(&j->rs), idem_rc_name(rc));
    return;
  }
  switch (j->verdict) {
  case IDEM_EXEC_DONE:
    answer(j, pass_on(j->r, j->method, so, &j->rs, note(j, NULL, "recovered")),
           j->rs.status);
    break;
  case IDEM_EXEC_NOT_DONE:
    if (j->result == UP_OK) /* 408, 425, 429, or a 5xx with
                               --no-store-5xx: released */
      answer(j,
             pass_on(j->r, j->method, so, &j->rs,
                     note(j, "not-stored; released",
                          "recovered; not-stored; released")),
             j->rs.status);
    else if (j->result == UP_NO_FDS)
      answer_no_fds(j, " and the key was released");
    else
      answer_problem(j, OUT_ERROR, 502, "upstream-unreachable",
                     "Upstream unreachable", 0, j->rs.ms,
                     "The upstream could not be reached (%s); nothing was "
                     "sent and the key was released. Retry the same request "
                     "with the same key.",
                     up_error(&j->rs));
    break;
  case IDEM_EXEC_LEAVE_IN_PROGRESS:
    answer_problem(
        j, OUT_ERROR, j->result == UP_TIMEOUT ? 504 : 502,
        j->result == UP_TIMEOUT ? "upstream-timeout" : "upstream-failed",
        j->result == UP_TIMEOUT ? "Upstream timeout" : "Upstream failed",
        retry_after_s(cfg->lease_ms), j->rs.ms,
        "The request was sent upstream, which may have acted: %s. The key "
        "stays in progress for %d s; a retry with the same key after that "
        "is %s.",
        up_error(&j->rs), retry_after_s(cfg->lease_ms),
        cfg->on_unknown_fail
            ? "refused until an operator resolves it (idem keys resolve)"
            : "forwarded again with the same Idempotency-Key, and its "
              "answer marked Idem-Record: recovered");
    break;
  case IDEM_EXEC_UNKNOWN:
  default:
    if (j->result == UP_OK)
      answer(j,
             pass_on(j->r, j->method, so, &j->rs,
                     note(j, "unknown; response-too-large-to-store",
                          "recovered; unknown; "
                          "response-too-large-to-store")),
             j->rs.status);
    else
      answer_problem(j, OUT_ERROR, 502, "upstream-failed", "Upstream failed",
                     0, j->rs.ms,
                     "The upstream may have acted, but its answer cannot be "
                     "passed on (%s). The key is marked unknown: an operator "
                     "must resolve it (idem keys resolve).",
                     up_error(&j->rs));
    break;
  }
}

/* A keyed forward's answer recorded on a store worker, when the store
 * could not take it without waiting (out of memory). */
static void record_waiting(void *ctx) {
  job *j = ctx;
  idem_response out;
  memset(&out, 0, sizeof out);
  j->verdict = verdict_of(j, j->result, &out);
  recorded(j, idem_execute_end(j->exec, j->verdict, &out));
}

/* A keyed forward ended (the upstream loop's thread, which must not wait
 * for the store): its ending is queued on the store, and recorded()
 * answers once it is written. */
static void forwarded(void *ctx, up_result result) {
  job *j = ctx;
  idem_response out;
  j->result = result;
  metrics_upstream_ms(j->rs.ms);
  memset(&out, 0, sizeof out);
  j->verdict = verdict_of(j, j->result, &out);
  j->s0 = now_ms();
  if (idem_execute_end_async(j->exec, j->verdict, &out, recorded, j) ==
      IDEM_OK)
    return;
  free(j->meta);
  j->meta = NULL;
  if (pool_submit(record_waiting, j) != 0)
    record_waiting(j); /* late, but recorded */
}

/*
 * What differs between the request a key was first used with and this one
 * (both as serve_request_json() makes them): "the query", "the body", "the
 * content type"... written into out. The operation is the method and the
 * path, so within a record those never differ.
 */
static void what_differs(const void *stored, size_t stored_len,
                         const char *now, char *out, size_t size) {
  json_t *a = json_loadb(stored, stored_len, JSON_DECODE_INT_AS_REAL, NULL);
  json_t *b = json_loads(now, JSON_DECODE_INT_AS_REAL, NULL);
  const char *parts[4];
  int n = 0;
  snprintf(out, size, "the query or the body");
  if (a && b) {
    int a_json = json_object_get(a, "body") != NULL;
    int b_json = json_object_get(b, "body") != NULL;
    if (!json_equal(json_object_get(a, "method"), json_object_get(b, "method")))
      parts[n++] = "the method";
    if (!json_equal(json_object_get(a, "query"), json_object_get(b, "query")))
      parts[n++] = "the query";
    if (a_json != b_json)
      /* One body was read as JSON, the other as bytes. */
      parts[n++] = "the Content-Type (JSON or not)";
    else if (!n)
      /* The fingerprints differ, and nothing else does. (Comparing the
       * bodies here would lose what a double cannot hold.) */
      parts[n++] = "the body";
    if (n) {
      size_t o = 0;
      out[0] = 0;
      for (int i = 0; i < n && o < size; i++)
        o += (size_t)snprintf(out + o, size - o, "%s%s",
                              i == 0 ? "" : i == n - 1 ? " and " : ", ",
                              parts[i]);
    }
  }
  json_decref(a);
  json_decref(b);
}

static void execute_options(idem_execute_options *o) {
  memset(o, 0, sizeof *o);
  o->call.lease_ms = cfg->lease_ms;
  o->call.retention_ms = cfg->retention_ms;
  o->call.on_expired_lease =
      cfg->on_unknown_fail ? IDEM_EXPIRED_REPORT : IDEM_EXPIRED_TAKE_OVER;
  /* Request bodies hold what must not sit in a store for a day (card
   * numbers, credentials): the fingerprint alone tells a changed request
   * (issue 51); --keep-requests keeps them for operators. */
  o->forget_request = !cfg->keep_requests;
}

static void claimed(void *ctx, int rc, idem_exec *exec, idem_call *call);

/*
 * A retry that found its key in flight (section 4 of the design: it
 * attaches): claimed again, and this claim waits, up to --attach-wait, for
 * the request in flight to end. claimed() then answers what it finds: the
 * first request's answer, replayed; the key itself, when the first
 * request released it (a 429, a 503 not stored) or its holder died; or,
 * past the bound, 409 in-flight as before. The wait holds no HTTP thread
 * (the connection stays suspended) and no store thread: the library waits
 * on a runner of its own, woken at once by a holder in this process, by
 * LISTEN/NOTIFY on PostgreSQL, or by polling for another process.
 */
static int attach(job *j) {
  req *r = j->r;
  idem_id id = {r->tenant, r->operation, r->key};
  idem_execute_options o;
  idem_call *first = j->call;
  execute_options(&o);
  o.call.wait_ms = cfg->attach_wait_ms;
  j->attached = 1;
  j->call = NULL; /* claimed() may run on another thread before this returns */
  j->s0 = now_ms();
  metrics_attached(1);
  o.fingerprint = j->fp;
  if (idem_execute_begin_async(store, &id, j->rj ? j->rj : "",
                               j->rj ? strlen(j->rj) : 0, &o, claimed,
                               j) != IDEM_OK) {
    metrics_attached(-1);
    j->attached = 2;
    j->call = first; /* answered 409 in-flight, as without --attach-wait */
    return -1;
  }
  idem_call_free(first);
  return 0;
}

/* The claim's answer (rc, exec, call), on the thread that claimed: one of
 * the store's, or a store worker's. */
static void claimed(void *ctx, int rc, idem_exec *exec, idem_call *call) {
  job *j = ctx;
  req *r = j->r;
  idem_id id = {r->tenant, r->operation, r->key};
  char *rj = j->rj;

  j->exec = exec;
  j->call = call;
  j->store_ms = now_ms() - j->s0;
  if (j->attached == 1) {
    j->attached = 2; /* the wait is over */
    metrics_attached(-1);
  }
  if (rc == IDEM_OK && idem_call_outcome(j->call) == IDEM_IN_FLIGHT &&
      !j->attached && cfg->attach_wait_ms > 0 && attach(j) == 0)
    return;
  if (!(rc == IDEM_OK && idem_call_outcome(j->call) == IDEM_CONFLICT)) {
    /* Held no longer than needed: a forward may wait for seconds. */
    free(j->rj);
    j->rj = rj = NULL;
  }
  if (rc == IDEM_OK && idem_call_outcome(j->call) == IDEM_CONFLICT) {
    /* Say what differed: the stored request is read back (conflicts are
     * rare; the read costs nothing on the other paths). */
    idem_record *rec = NULL;
    char differs[160] = "the query or the body";
    if (rj && idem_get(store, &id, &rec) == IDEM_OK && rec->request)
      what_differs(rec->request, rec->request_len, rj, differs,
                   sizeof differs);
    idem_record_free(rec);
    metrics_store_ms(j->store_ms);
    answer_problem(j, OUT_CONFLICT, 422, "key-reused",
                   "Idempotency-Key reused", 0, 0,
                   "This Idempotency-Key was already used with a different "
                   "request to %s %s: %s differed. Use a new key for a new "
                   "request, or resend the original request unchanged to "
                   "get its response again.",
                   j->method, r->path, differs);
    return;
  }

  if (rc != IDEM_OK) {
    metrics_store_ms(j->store_ms);
    /* health (part 9): the reason, on standard error. */
    serve_log_store_error("claim", rc, idem_errmsg());
    if (store_trouble(rc))
      answer_problem(j, OUT_ERROR, 503, "store-unavailable",
                     "Idempotency store unavailable", 1, 0,
                     "The idempotency store could not record this request "
                     "(%s), so it was not forwarded. Retry the same request "
                     "with the same key.",
                     idem_rc_name(rc));
    else
      answer_problem(j, OUT_ERROR, 500, "internal", "Gateway error", 0, 0,
                     "%s: %s", idem_rc_name(rc), idem_errmsg());
    return;
  }

  switch (idem_call_outcome(j->call)) {
  case IDEM_REPLAY:
    metrics_store_ms(j->store_ms);
    if (idem_call_response(j->call)->status < 100 ||
        idem_call_response(j->call)->status > 599) {
      /* An operator's `idem keys resolve --completed` without --status. */
      answer_problem(j, OUT_ERROR, 500, "stored-status-invalid",
                     "Stored answer is not HTTP", 0, 0,
                     "The stored answer for this key has status %d, which "
                     "is not an HTTP status; an operator must resolve the "
                     "key again with --status.",
                     idem_call_response(j->call)->status);
      return;
    }
    answer(j,
           replay(r, j->method, idem_call_response(j->call),
                  idem_call_recovered(j->call)),
           idem_call_response(j->call)->status);
    return;
  case IDEM_CONFLICT:
    metrics_store_ms(j->store_ms);
    answer_problem(j, OUT_CONFLICT, 422, "key-reused",
                   "Idempotency-Key reused", 0, 0,
                   "This Idempotency-Key was already used with a different "
                   "request (method, path, query, content type or body). "
                   "Use a new key for a new request, or resend the original "
                   "request unchanged to get its response again.");
    return;
  case IDEM_IN_FLIGHT: {
    int ra = retry_after_s(idem_call_retry_after_ms(j->call));
    metrics_store_ms(j->store_ms);
    answer_problem(j, OUT_IN_FLIGHT, 409, "in-flight", "Request in progress",
                   ra, 0,
                   "A request with this Idempotency-Key is still being "
                   "processed. Retry the same request after %d s; once it "
                   "is done, its response is replayed.",
                   ra);
    return;
  }
  case IDEM_UNKNOWN:
    metrics_store_ms(j->store_ms);
    answer_problem(j, OUT_UNKNOWN, 409, "outcome-unknown", "Outcome unknown",
                   0, 0,
                   "An earlier attempt with this Idempotency-Key may or may "
                   "not have acted, and this gateway does not forward it "
                   "again. An operator must resolve it (idem keys resolve); "
                   "use a new key only if a second action is safe.");
    return;
  default:
    break;
  }
  /* PROCEED or RECOVER: the key is ours; ask the upstream. */
  j->rq.abort_check = lease_lost;
  j->rq.abort_ctx = j;
  if (upstream_start(&j->rq, &j->rs, forwarded, j) != 0) {
    idem_execute_end(j->exec, IDEM_EXEC_NOT_DONE, NULL);
    j->exec = NULL;
    answer_problem(j, OUT_ERROR, 503, "overloaded", "Gateway overloaded", 1,
                   0,
                   "The gateway is out of memory; nothing was sent and the "
                   "key was released. Retry the same request with the same "
                   "key.");
  }
}

/* The claim on a store worker, when the store would not queue it (out of
 * memory, or an argument it refuses: the blocking call then says why). */
static void claim_waiting(void *ctx) {
  job *j = ctx;
  req *r = j->r;
  idem_id id = {r->tenant, r->operation, r->key};
  idem_execute_options o;
  idem_exec *exec = NULL;
  idem_call *call = NULL;
  int rc;
  execute_options(&o);
  o.fingerprint = j->fp;
  rc = idem_execute_begin(store, &id, j->rj ? j->rj : "",
                          j->rj ? strlen(j->rj) : 0, &o, &exec, &call);
  claimed(j, rc, exec, call);
}

/* Queues the claim on the store; claimed() goes on once it is decided. */
static int claim(job *j) {
  req *r = j->r;
  idem_id id = {r->tenant, r->operation, r->key};
  idem_execute_options o;
  execute_options(&o);
  j->s0 = now_ms();
  o.fingerprint = j->fp;
  if (idem_execute_begin_async(store, &id, j->rj ? j->rj : "",
                               j->rj ? strlen(j->rj) : 0, &o, claimed,
                               j) == IDEM_OK)
    return 0;
  return pool_submit(claim_waiting, j);
}

/*
 * --replay-check-url: the upstream's word on the caller, before a keyed
 * request is claimed (and so before any replay). A replay is a release of
 * stored data: it goes only where the upstream would answer now, so a
 * revoked or expired credential gets the upstream's 401 or 403, not the
 * stored answer. A 2xx is trusted for --replay-check-ttl per credential
 * (principal_check_passed()); anything else but 401 and 403 is 502, and
 * nothing is claimed: a check that cannot be made never lets a replay
 * out.
 */
static void checked(void *ctx, up_result result) {
  job *j = ctx;
  int st = j->ck_rs.status;
  if (result == UP_OK && st >= 200 && st <= 299) {
    principal_check_passed(j->ck_id, cfg->replay_check_ttl_ms);
    if (claim(j) != 0)
      answer(j, NULL, 0);
    return;
  }
  if (result == UP_OK && (st == 401 || st == 403)) {
    answer(j, pass_on(j->r, j->method, OUT_REJECTED, &j->ck_rs, NULL), st);
    return;
  }
  if (result == UP_OK)
    answer_problem(j, OUT_ERROR, 502, "replay-check-failed",
                   "Credential check failed", 0, j->ck_rs.ms,
                   "Before a keyed request is claimed or replayed, the "
                   "gateway asks the upstream (GET %s, with the caller's "
                   "credentials) whether it would answer this caller; it "
                   "answered %d, neither 2xx nor 401/403. Nothing was "
                   "claimed or forwarded; retry later.",
                   cfg->replay_check_url, st);
  else
    answer_problem(j, OUT_ERROR, 502, "replay-check-failed",
                   "Credential check failed", 0, j->ck_rs.ms,
                   "Before a keyed request is claimed or replayed, the "
                   "gateway asks the upstream (GET %s, with the caller's "
                   "credentials) whether it would answer this caller; the "
                   "check failed (%s). Nothing was claimed or forwarded; "
                   "retry later.",
                   cfg->replay_check_url, up_error(&j->ck_rs));
}

/* Starts the check of j's caller; 0, or -1 when out of memory. */
static int check_caller(job *j) {
  size_t n = 0;
  if (!(j->ck_h = malloc((j->hs.n + 1) * sizeof *j->ck_h)))
    return -1;
  for (size_t i = 0; i < j->hs.n; i++)
    if (principal_check_sends(j->hs.h[i].name))
      j->ck_h[n++] = j->hs.h[i];
  j->ck_rq.method = "GET";
  j->ck_rq.uri = cfg->replay_check_url;
  j->ck_rq.headers = j->ck_h;
  j->ck_rq.nheaders = n;
  j->ck_rq.client_addr = j->rq.client_addr;
  return upstream_start(&j->ck_rq, &j->ck_rs, checked, j);
}

/* The request's fingerprint, from one pass over its body, and (with
 * --keep-requests) the request the record keeps. 0, or -1 when out of
 * memory. */
static int prepare(job *j) {
  req *r = j->r;
  if (serve_request_fingerprint(j->method, r->uri, r->body, r->len,
                                j->json_type, j->fp) != 0)
    return -1;
  if (cfg->keep_requests &&
      !(j->rj = serve_request_json(j->method, r->uri, r->body, r->len,
                                   j->json_type)))
    return -1;
  return 0;
}

/* Whether the caller must be checked with the upstream first
 * (--replay-check-url, no answer within its TTL). */
static int must_check(job *j) {
  if (!cfg->replay_check_url)
    return 0;
  principal_check_id(j->r->tenant, j->hs.h, j->hs.n, j->ck_id);
  return !principal_check_cached(j->ck_id);
}

/* A large keyed request, on a fingerprint worker (its connection is
 * suspended): prepared, checked if need be, and claimed. */
static void prepared_heavy(void *ctx) {
  job *j = ctx;
  if (prepare(j) != 0 ||
      (must_check(j) ? check_caller(j) : claim(j)) != 0)
    answer(j, NULL, 0); /* out of memory: the connection is closed */
}

/* Once the body is in (libmicrohttpd's thread): hand the request over and
 * suspend its connection. */
static enum MHD_Result finish(struct MHD_Connection *c, req *r,
                              const char *method) {
  job *j;

  if (r->too_big)
    return problem(c, r, method, OUT_REJECTED, 413, "body-too-large",
                   "Request body too large", 0, 0,
                   "The request body is larger than %zu bytes, the most this "
                   "gateway takes. Nothing was claimed or forwarded: send a "
                   "smaller request.",
                   cfg->max_body);
  if (__atomic_load_n(&draining, __ATOMIC_ACQUIRE)) {
    /* Stopping: nothing new is claimed or forwarded, and the client is
     * sent to another gateway (the connection closes with the answer). */
    return problem(c, r, method, OUT_REJECTED, 503, "shutting-down",
                   "Gateway stopping", 1, 0,
                   "This gateway is stopping; nothing was claimed or "
                   "forwarded. Retry the same request with the same key.");
  }
  if (!(j = calloc(1, sizeof *j)))
    return MHD_NO;
  j->c = c;
  j->r = r;
  snprintf(j->method, sizeof j->method, "%s", method);
  MHD_get_connection_values_n(c, MHD_HEADER_KIND, collect, &j->hs);
  if (j->hs.failed) {
    job_free(j);
    return MHD_NO;
  }
  j->rq.method = j->method;
  j->rq.uri = r->uri;
  j->rq.headers = j->hs.h;
  j->rq.nheaders = j->hs.n;
  j->rq.body = r->body;
  j->rq.body_len = r->len;
  j->rq.client_addr =
      client_address(c, j->addr, sizeof j->addr) == 0 ? j->addr : NULL;
  j->json_type = serve_is_json_type(
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"));
  r->job = j;

  if (r->protect) {
    /*
     * A retry of a request this gateway completed lately is answered here,
     * from memory (idem_claim_cached()), with no hand-over and no read:
     * the suspend, the queue and the resume would cost it more than the
     * answer. Anything else (a fresh key, a conflict, a key in flight, a
     * record completed elsewhere or no longer kept) is queued on the
     * store, whose claim decides it. A read of the store here instead
     * cost every fresh key a read that finds nothing, on this thread
     * (on PostgreSQL a round trip to the server).
     */
    idem_id id = {r->tenant, r->operation, r->key};
    idem_call *hit = NULL;
    if (r->len > SERVE_INLINE_BODY) {
      /* A large body is read for its fingerprint by a fingerprint worker,
       * never on this thread: a few of them must not hold every HTTP
       * thread. No cached answer then: its look-up needs the fingerprint. */
      MHD_suspend_connection(c);
      metrics_waiting(1);
      if (pool_heavy_submit(prepared_heavy, j) != 0)
        answer(j, NULL, 0); /* out of memory: the connection is closed */
      return MHD_YES;
    }
    if (prepare(j) != 0)
      return MHD_NO;
    if (must_check(j)) {
      MHD_suspend_connection(c);
      metrics_waiting(1);
      if (check_caller(j) != 0)
        answer(j, NULL, 0); /* out of memory: the connection is closed */
      return MHD_YES;
    }
    if (idem_claim_cached(store, &id, j->fp, &hit) == IDEM_OK &&
        idem_call_outcome(hit) == IDEM_REPLAY &&
        idem_call_response(hit)->status >= 100 &&
        idem_call_response(hit)->status <= 599) {
      const idem_response *stored = idem_call_response(hit);
      struct MHD_Response *resp =
          replay(r, j->method, stored, idem_call_recovered(hit));
      int status = stored->status;
      idem_call_free(hit);
      return queue(c, resp, status);
    }
    idem_call_free(hit);
  }

  /* Suspended first: the job may end on another thread before this
   * handler returns. */
  MHD_suspend_connection(c);
  metrics_waiting(1);
  if (r->protect) {
    if (claim(j) == 0)
      return MHD_YES;
  } else if (upstream_start(&j->rq, &j->rs, passed_through, j) == 0) {
    return MHD_YES;
  }
  answer(j, NULL, 0); /* out of memory: the connection is closed */
  return MHD_YES;
}

/* ---- libmicrohttpd's callbacks ---------------------------------------------- */

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  req *r = *con_cls;
  (void)cls, (void)url, (void)version;
  if (!r)
    return MHD_NO;
  if (!r->started) {
    guard_head_done(c); /* the head is whole: its deadline is met */
    metrics_in_flight(1);
    return begin(c, r, method);
  }
  if (r->job && r->job->ready) {
    /* Resumed: the job's answer is made. */
    struct MHD_Response *resp = r->job->resp;
    r->job->resp = NULL;
    if (!resp)
      return MHD_NO;
    return queue(c, resp, r->job->status);
  }
  if (r->answered)
    return MHD_YES;
  if (*upload_size) {
    if (!r->too_big) {
      if (*upload_size > cfg->max_body - r->len) {
        r->too_big = 1;
        free(r->body);
        r->body = NULL;
        r->len = r->cap = 0;
      } else {
        if (r->len + *upload_size > r->cap) {
          /* The announced length at once (it is at most --max-body),
           * else small steps: a body is held while its forward waits. */
          const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                       "Content-Length");
          size_t want = cl ? (size_t)strtoull(cl, NULL, 10) : 0;
          size_t cap = r->cap              ? r->cap
                       : want >= *upload_size ? want
                                              : 1024;
          while (cap < r->len + *upload_size)
            cap *= 2;
          char *b = realloc(r->body, cap);
          if (!b)
            return MHD_NO;
          r->body = b;
          r->cap = cap;
        }
        memcpy(r->body + r->len, upload, *upload_size);
        r->len += *upload_size;
      }
    }
    *upload_size = 0;
    return MHD_YES;
  }
  r->answered = 1;
  return finish(c, r, method);
}

static void *uri_log(void *cls, const char *uri, struct MHD_Connection *c) {
  req *r = calloc(1, sizeof *r);
  (void)cls, (void)c;
  if (!r)
    return NULL;
  if (!(r->uri = strdup(uri))) {
    free(r);
    return NULL;
  }
  r->t0 = now_ms();
  return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  req *r = *con_cls;
  (void)cls, (void)c, (void)toe;
  guard_request_done(c); /* a keep-alive connection's next head may come */
  if (!r)
    return;
  if (r->started)
    metrics_in_flight(-1);
  job_free(r->job);
  free(r->uri);
  free(r->body);
  free(r->key);
  free(r->path);
  free(r->tenant);
  free(r->operation);
  free(r);
  *con_cls = NULL;
}

struct MHD_Daemon *gateway_start(const serve_config *c, idem_store *s,
                                 char *bound, size_t bound_size) {
  struct MHD_OptionItem opts[] = {
      {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)uri_log, NULL},
      {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, NULL},
      {MHD_OPTION_THREAD_POOL_SIZE, c->threads, NULL},
      {MHD_OPTION_CONNECTION_TIMEOUT, 75, NULL},
      /* Each connection's memory: its request head (at most
       * SERVE_MAX_HEAD), and the head of its answer (upstream.c bounds
       * that at 16 KB). It is held while a forward waits. Above 32 KB
       * libmicrohttpd maps it from the kernel instead of malloc(), so only
       * the pages written cost memory; 16 KB from malloc() cost all 16,
       * and left no room for larger heads. */
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT, SERVE_CONNECTION_MEMORY, NULL},
      /* guard.c: request heads within --header-timeout; the limits. */
      {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)guard_notify, NULL},
      {MHD_OPTION_CONNECTION_LIMIT, (intptr_t)guard_max_connections(c), NULL},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT,
       (intptr_t)guard_max_connections_per_client(c), NULL},
      {MHD_OPTION_END, 0, NULL},
  };
  cfg = c;
  store = s;
  if (guard_start(c) != 0)
    return NULL;
  return listen_on("serve", "--listen", c->listen,
                   MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
                       MHD_USE_ERROR_LOG,
                   handle, NULL, opts, bound, bound_size);
}
