/*
 * metrics.c -- the gateway's counters, rendered in Prometheus's text
 * exposition format (version 0.0.4) for the admin listener's /metrics.
 * Every counter is a relaxed atomic: the request path never takes a lock
 * for them.
 */
#include "serve.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const outcome_names[OUT_COUNT] = {
    "proceed",     "replay",      "conflict", "in_flight",
    "recover",     "passthrough", "rejected", "error",
    "unknown",
};

const char *serve_outcome_name(serve_outcome o) {
  return o < OUT_COUNT ? outcome_names[o] : "error";
}

/* Upper bounds of the latency buckets, in seconds. */
static const double bounds[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                5,      10,    30};
#define NB (sizeof bounds / sizeof bounds[0])

typedef struct histogram {
  unsigned long long bucket[NB + 1]; /* the last one: +Inf */
  unsigned long long count;
  unsigned long long sum_us;
} histogram;

static unsigned long long requests[OUT_COUNT];
static histogram upstream_h, store_h;
static unsigned long long stored_bytes;
static int in_flight;

#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
#define GET(p) __atomic_load_n((p), __ATOMIC_RELAXED)

void metrics_request(serve_outcome o) {
  if (o < OUT_COUNT)
    ADD(&requests[o], 1);
}

static void observe(histogram *h, double ms) {
  double s = ms / 1000;
  size_t i = 0;
  while (i < NB && s > bounds[i])
    i++;
  ADD(&h->bucket[i], 1);
  ADD(&h->count, 1);
  ADD(&h->sum_us, (unsigned long long)(ms * 1000));
}

/* Answers by HTTP status, 100-599 (the gateway sends no other). */
static unsigned long long statuses[600];
void metrics_status(int status) {
  if (status >= 100 && status < 600)
    ADD(&statuses[status], 1);
}

void metrics_upstream_ms(double ms) { observe(&upstream_h, ms); }
void metrics_store_ms(double ms) { observe(&store_h, ms); }
void metrics_stored_bytes(size_t n) { ADD(&stored_bytes, n); }
void metrics_in_flight(int delta) { ADD(&in_flight, delta); }
int metrics_in_flight_now(void) { return GET(&in_flight); }

static int waiting;
void metrics_waiting(int delta) { ADD(&waiting, delta); }
int metrics_waiting_now(void) { return GET(&waiting); }

static int attached;
void metrics_attached(int delta) { ADD(&attached, delta); }

/* guard.c's: client connections open, heads cut off, connections refused. */
static int connections;
static unsigned long long header_timeouts, connections_refused;
void metrics_connections(int delta) { ADD(&connections, delta); }
void metrics_header_timeout(void) { ADD(&header_timeouts, 1); }
void metrics_connection_refused(void) { ADD(&connections_refused, 1); }

typedef struct out {
  char *p;
  size_t len, cap;
  int failed;
} out;

__attribute__((format(printf, 2, 3))) static void put(out *o, const char *fmt,
                                                       ...) {
  va_list ap;
  int n;
  if (o->failed)
    return;
  for (;;) {
    va_start(ap, fmt);
    n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      o->failed = 1;
      return;
    }
    if ((size_t)n < o->cap - o->len) {
      o->len += (size_t)n;
      return;
    }
    size_t cap = o->cap * 2 + (size_t)n;
    char *p = realloc(o->p, cap);
    if (!p) {
      o->failed = 1;
      return;
    }
    o->p = p;
    o->cap = cap;
  }
}

static void put_histogram(out *o, const char *name, const char *help,
                          histogram *h) {
  unsigned long long cum = 0;
  put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  for (size_t i = 0; i < NB; i++) {
    cum += GET(&h->bucket[i]);
    put(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
  }
  cum += GET(&h->bucket[NB]);
  put(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
  put(o, "%s_sum %.6f\n%s_count %llu\n", name,
      (double)GET(&h->sum_us) / 1e6, name, cum);
}

char *metrics_calls_json(void) {
  char *text = malloc(64 * OUT_COUNT + 2);
  size_t n = 0;
  if (!text)
    return NULL;
  text[n++] = '{';
  for (int o = 0; o < OUT_COUNT; o++)
    n += (size_t)sprintf(text + n, "%s\"%s\":%llu", o ? "," : "",
                         outcome_names[o], GET(&requests[o]));
  text[n++] = '}';
  text[n] = 0;
  return text;
}

char *metrics_render(size_t *len) {
  out o = {malloc(4096), 0, 4096, 0};
  if (!o.p)
    return NULL;
  o.p[0] = 0;
  put(&o,
      "# HELP idem_gateway_requests_total Requests answered, by outcome.\n"
      "# TYPE idem_gateway_requests_total counter\n");
  for (int i = 0; i < OUT_COUNT; i++)
    put(&o, "idem_gateway_requests_total{outcome=\"%s\"} %llu\n",
        outcome_names[i], GET(&requests[i]));
  /* Only the statuses seen: the rest would be 500 lines of zeros. */
  put(&o, "# HELP idem_gateway_responses_total Answers, by HTTP status.\n"
          "# TYPE idem_gateway_responses_total counter\n");
  for (int i = 100; i < 600; i++)
    if (GET(&statuses[i]))
      put(&o, "idem_gateway_responses_total{code=\"%d\"} %llu\n", i,
          GET(&statuses[i]));
  put_histogram(&o, "idem_gateway_upstream_seconds",
                "Time from sending a request upstream to its whole answer.",
                &upstream_h);
  put_histogram(&o, "idem_gateway_store_seconds",
                "Time a protected request spent in the idempotency store "
                "(claim and completion).",
                &store_h);
  put(&o,
      "# HELP idem_gateway_in_flight Requests being handled now.\n"
      "# TYPE idem_gateway_in_flight gauge\n"
      "idem_gateway_in_flight %d\n",
      GET(&in_flight));
  put(&o,
      "# HELP idem_gateway_waiting Requests whose connection is suspended "
      "while the store or the upstream decides them (no thread held).\n"
      "# TYPE idem_gateway_waiting gauge\n"
      "idem_gateway_waiting %d\n"
      "# HELP idem_gateway_attached Retries waiting for the answer of the "
      "same key's request in flight (--attach-wait).\n"
      "# TYPE idem_gateway_attached gauge\n"
      "idem_gateway_attached %d\n"
      "# HELP idem_gateway_forwards_in_flight Requests at the upstream "
      "now.\n"
      "# TYPE idem_gateway_forwards_in_flight gauge\n"
      "idem_gateway_forwards_in_flight %d\n"
      "# HELP idem_gateway_store_queue Requests waiting for a store "
      "worker.\n"
      "# TYPE idem_gateway_store_queue gauge\n"
      "idem_gateway_store_queue %d\n",
      GET(&waiting), GET(&attached), upstream_active(), pool_queued());
  put(&o,
      "# HELP idem_gateway_stored_bytes_total Response bytes (headers and "
      "body) stored for replay.\n"
      "# TYPE idem_gateway_stored_bytes_total counter\n"
      "idem_gateway_stored_bytes_total %llu\n",
      GET(&stored_bytes));
  put(&o,
      "# HELP idem_gateway_connections Client connections open now.\n"
      "# TYPE idem_gateway_connections gauge\n"
      "idem_gateway_connections %d\n"
      "# HELP idem_gateway_header_timeouts_total Connections closed because "
      "their request head was not whole within --header-timeout.\n"
      "# TYPE idem_gateway_header_timeouts_total counter\n"
      "idem_gateway_header_timeouts_total %llu\n"
      "# HELP idem_gateway_connections_refused_total Connections closed "
      "unanswered on arrival, over a connection limit.\n"
      "# TYPE idem_gateway_connections_refused_total counter\n"
      "idem_gateway_connections_refused_total %llu\n",
      GET(&connections), GET(&header_timeouts), GET(&connections_refused));
  if (o.failed) {
    free(o.p);
    return NULL;
  }
  *len = o.len;
  return o.p;
}
