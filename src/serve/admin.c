/*
 * admin.c -- the admin listener: /healthz, /readyz and /metrics.
 *
 * It runs on a listener of its own (--admin-listen), so that a load
 * balancer's health checks and Prometheus's scrapes never queue behind the
 * gateway's requests, and so that it can be bound to an address the
 * gateway's clients do not reach. Each connection has a thread of its own:
 * a readiness check waits for the store, and a store that hangs must not
 * keep /healthz from answering.
 *
 * With --console-token-file it also serves the operator console
 * (console.c) at / and under /api/, with that token. Wrong tokens are
 * counted per client (limiter.c): 20 a minute, then 429.
 *
 * /healthz is liveness: 200 while the process serves. A store that fails
 * is not a reason to restart the gateway (a restart mends no disk and no
 * database server, and a supervisor restarting every gateway at once while
 * PostgreSQL is down only adds load); it is a reason to send no traffic,
 * which is what /readyz says: 503 while the store cannot take a claim
 * (idem_store_check()) or while the gateway drains.
 */
#include "cli.h"
#include "console/console.h"
#include "serve.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define PROBLEM_TYPE "urn:idem:problem:"

/* The most records of each state /metrics counts, and how often they are
 * counted: a count reads up to RECORDS_COUNTED records of each state, and
 * scrapes (or a client that asks for /metrics in a loop) within a second
 * of it, or while it runs, share it, so that what the store does for
 * /metrics stays bounded however often it is asked. */
#define RECORDS_COUNTED 10000
#define RECORDS_EVERY_MS 1000

static idem_store *store;
static const char *token; /* --admin-token-file's, or NULL */
static int draining;
static int not_ready; /* what the last readiness check found */
static console *cn;   /* --console-token-file: the console, at / and /api/ */
static console_limiter *limiter; /* wrong admin tokens, per client */
/* What *con_cls holds for a request of the admin listener's own. */
static int own_request;

void admin_set_draining(void) {
  __atomic_store_n(&draining, 1, __ATOMIC_RELEASE);
}

static enum MHD_Result text(struct MHD_Connection *c, int status,
                            const char *type, char *body, size_t len) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer_with_free_callback(len, body, free);
  enum MHD_Result ok;
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ok = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result say(struct MHD_Connection *c, int status,
                           const char *s) {
  char *copy = strdup(s);
  if (!copy)
    return MHD_NO;
  return text(c, status, "text/plain; charset=utf-8", copy, strlen(copy));
}

/*
 * "TEXT: rest" with TEXT (a request's method or path, as libmicrohttpd
 * decoded it: any bytes) escaped where it is not UTF-8 or not printable
 * (cli_escape()) and cut to at most max bytes between two characters, so
 * that the detail is always valid JSON. -1 when out of memory.
 */
static int quote_detail(char *detail, size_t size, const char *text, size_t max,
                        const char *rest) {
  char *shown = cli_escape(text, strlen(text));
  if (!shown)
    return -1;
  snprintf(detail, size, "%.*s: %s", (int)cli_utf8_cut(shown, max), shown,
           rest);
  free(shown);
  return 0;
}

/* An RFC 9457 problem, as the gateway's own answers are. */
static enum MHD_Result problem(struct MHD_Connection *c, int status,
                               const char *type, const char *title,
                               const char *detail) {
  char t[128];
  json_t *j;
  char *s;
  snprintf(t, sizeof t, PROBLEM_TYPE "%s", type);
  j = json_pack("{s:s, s:s, s:i, s:s}", "type", t, "title", title, "status",
                status, "detail", detail);
  if (!j) {
    /* A detail that is not UTF-8 (libidem's, quoting a path it cut):
     * escaped, so that the problem is always sent. */
    char *shown = cli_escape(detail, strlen(detail));
    j = shown ? json_pack("{s:s, s:s, s:i, s:s}", "type", t, "title", title,
                          "status", status, "detail", shown)
              : NULL;
    free(shown);
  }
  s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!s)
    return MHD_NO;
  return text(c, status, "application/problem+json", s, strlen(s));
}

/* Says on standard error when readiness changes, so that an operator
 * reading the log sees when and why the gateway stopped being ready,
 * without a line per probe. */
static void note_readiness(int ready, const char *why) {
  char line[1200];
  int n;
  if (__atomic_exchange_n(&not_ready, !ready, __ATOMIC_ACQ_REL) == !ready)
    return;
  n = ready ? snprintf(line, sizeof line, "idem serve: ready again\n")
            : snprintf(line, sizeof line, "idem serve: not ready: %s\n", why);
  if (n > 0 && (size_t)n < sizeof line &&
      write(STDERR_FILENO, line, (size_t)n) < 0) {
    /* Nowhere left to say it. */
  }
}

static enum MHD_Result readyz(struct MHD_Connection *c) {
  char why[1024];
  int rc;
  if (__atomic_load_n(&draining, __ATOMIC_ACQUIRE))
    return problem(c, 503, "draining", "Draining",
                   "The gateway is stopping: it finishes the requests in "
                   "flight and takes no new ones.");
  if ((rc = idem_store_check(store)) != IDEM_OK) {
    snprintf(why, sizeof why, "%s: %s", idem_rc_name(rc), idem_errmsg());
    why[cli_utf8_cut(why, sizeof why)] = '\0'; /* cut to fit: mended */
    note_readiness(0, why);
    return problem(c, 503, "store-unavailable", "Store cannot take writes",
                   why);
  }
  note_readiness(1, NULL);
  return say(c, 200, "ready\n");
}

static int count_record(const idem_record *r, void *ctx) {
  (void)r;
  ++*(int *)ctx;
  return 0;
}

/* /metrics: the counters, and the records waiting in the store, counted
 * now (up to RECORDS_COUNTED each). A store that cannot be read leaves the
 * samples out, as Prometheus expects of a value not known. */
static enum MHD_Result metrics(struct MHD_Connection *c) {
  static const struct {
    int state;
    const char *name;
  } states[] = {{IDEM_STATE_IN_PROGRESS, "in_progress"},
                {IDEM_STATE_UNKNOWN, "unknown"}};
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static double counted_at;
  static int counts[2], known[2];
  struct timespec ts;
  double now;
  char more[512];
  size_t len, n = 0;
  char *m = metrics_render(&len), *p;
  if (!m)
    return MHD_NO;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  now = (double)ts.tv_sec * 1000 + (double)ts.tv_nsec / 1e6;
  pthread_mutex_lock(&mu); /* one count at a time; the others wait for it */
  if (!counted_at || now - counted_at >= RECORDS_EVERY_MS) {
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
      idem_filter f = {0};
      f.state = states[i].state;
      f.limit = RECORDS_COUNTED;
      counts[i] = 0;
      known[i] = idem_list(store, &f, count_record, &counts[i]) == IDEM_OK;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    counted_at = (double)ts.tv_sec * 1000 + (double)ts.tv_nsec / 1e6;
  }
  n = (size_t)snprintf(
      more, sizeof more,
      "# HELP idem_gateway_store_records Records in the store waiting for "
      "a holder (in_progress) or for an operator (unknown), up to %d, "
      "counted at most once a second.\n"
      "# TYPE idem_gateway_store_records gauge\n",
      RECORDS_COUNTED);
  for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
    if (known[i])
      n += (size_t)snprintf(more + n, sizeof more - n,
                            "idem_gateway_store_records{state=\"%s\"} %d\n",
                            states[i].name, counts[i]);
  pthread_mutex_unlock(&mu);
  if (!(p = realloc(m, len + n + 1))) {
    free(m);
    return MHD_NO;
  }
  memcpy(p + len, more, n + 1);
  return text(c, 200, "text/plain; version=0.0.4; charset=utf-8", p, len + n);
}

/* Whether the request carries "Authorization: Bearer TOKEN", compared in
 * time that does not depend on where a guess first differs. */
static int authorised(struct MHD_Connection *c) {
  const char *h =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  size_t n = strlen(token), hl;
  unsigned char diff = 0;
  if (!h || strncasecmp(h, "Bearer ", 7) != 0)
    return 0;
  h += 7;
  hl = strlen(h);
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)(token[i] ^ (i < hl ? h[i] : 0));
  return diff == 0 && hl == n;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  char detail[512];
  (void)cls, (void)version;
  if (cn && console_owns(url))
    return console_handle(cn, c, url, method, upload, upload_size, con_cls);
  if (!*con_cls) { /* first call: headers only */
    *con_cls = &own_request;
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (token && console_limited(limiter, c))
    return problem(c, 429, "too-many-failures", "Too many wrong tokens",
                   "too many wrong tokens from this client this minute: "
                   "try again in a minute");
  if (token && !authorised(c)) {
    struct MHD_Response *r;
    enum MHD_Result ok;
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"))
      console_failed(limiter, c); /* a guess; no header is none */
    char *body = strdup("{\"type\":\"" PROBLEM_TYPE "unauthorized\","
                        "\"title\":\"Token required\",\"status\":401,"
                        "\"detail\":\"The admin listener answers requests "
                        "with Authorization: Bearer and the token of "
                        "--admin-token-file only.\"}");
    if (!body || !(r = MHD_create_response_from_buffer_with_free_callback(
                       strlen(body), body, free))) {
      free(body);
      return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/problem+json");
    MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"idem\"");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    ok = MHD_queue_response(c, 401, r);
    MHD_destroy_response(r);
    return ok;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    if (quote_detail(detail, sizeof detail, method, 64,
                     "the admin listener answers GET and HEAD only.") != 0)
      return MHD_NO;
    return problem(c, 405, "method-not-allowed", "Method not allowed", detail);
  }
  if (strcmp(url, "/healthz") == 0)
    return say(c, 200, "ok\n");
  if (strcmp(url, "/readyz") == 0)
    return readyz(c);
  if (strcmp(url, "/metrics") == 0)
    return metrics(c);
  if (quote_detail(detail, sizeof detail, url, 200,
                   "not found (try /healthz, /readyz, /metrics).") != 0)
    return MHD_NO;
  return problem(c, 404, "not-found", "Not found", detail);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c, (void)toe;
  console_completed(con_cls); /* leaves own_request alone */
}

struct MHD_Daemon *admin_start(idem_store *s, const char *listen,
                               const char *t, const char *console_token,
                               const char *audit_path, char *bound,
                               size_t bound_size) {
  struct MHD_OptionItem opts[] = {
      {MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
      /* A thread each: bounded, since probes and scrapes are few. */
      {MHD_OPTION_CONNECTION_LIMIT, 64, NULL},
      /* So that one client holding connections open (slowly) leaves room
       * for the load balancer, Prometheus and the operator. */
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16, NULL},
      {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, NULL},
      {MHD_OPTION_END, 0, NULL},
  };
  store = s;
  token = t;
  if (t && !(limiter = console_limiter_new()))
    return NULL;
  if (console_token) {
    /* A token of its own: the admin token is handed to scrapers and load
     * balancers, and the console settles records. */
    console_config cfg = {s, console_token, audit_path, "serve",
                          metrics_calls_json};
    if (!(cn = console_new(&cfg)))
      return NULL;
  }
  return listen_on("serve", "--admin-listen", listen,
                   /* MHD_USE_POLL: with select(), a connection whose
                    * descriptor is above FD_SETSIZE (1024), as under load,
                    * is closed at once, /metrics and /healthz included. */
                   MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                       MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
                   handle, NULL, opts, bound, bound_size);
}
