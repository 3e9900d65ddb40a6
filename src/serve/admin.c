/*
 * admin.c -- the admin listener: /healthz, /readyz and /metrics.
 *
 * It runs on a listener of its own (--admin-listen), so that a load
 * balancer's health checks and Prometheus's scrapes never queue behind the
 * gateway's requests, and so that it can be bound to an address the
 * gateway's clients do not reach.
 */
#include "serve.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static idem_store *store;
static int draining;

void admin_set_draining(void) {
  __atomic_store_n(&draining, 1, __ATOMIC_RELEASE);
}

/* Whether the store answers: a read of a record that is never written. */
static int store_answers(char *why, size_t size) {
  idem_id probe = {"", "idem health", "probe"};
  idem_record *rec = NULL;
  int rc = idem_get(store, &probe, &rec);
  idem_record_free(rec);
  if (rc == IDEM_OK || rc == IDEM_ENOTFOUND)
    return 1;
  snprintf(why, size, "%s: %s", idem_rc_name(rc), idem_errmsg());
  return 0;
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
                           const char *fmt, const char *arg) {
  char *s = NULL;
  if (asprintf(&s, fmt, arg) < 0)
    return MHD_NO;
  return text(c, status, "text/plain; charset=utf-8", s, strlen(s));
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  char why[512];
  (void)cls, (void)version, (void)upload;
  if (!*con_cls) { /* first call: headers only */
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return say(c, 405, "%s: only GET\n", method);
  if (strcmp(url, "/healthz") == 0) {
    if (store_answers(why, sizeof why))
      return say(c, 200, "ok%s\n", "");
    return say(c, 503, "store unavailable: %s\n", why);
  }
  if (strcmp(url, "/readyz") == 0) {
    if (__atomic_load_n(&draining, __ATOMIC_ACQUIRE))
      return say(c, 503, "draining%s\n", "");
    if (!store_answers(why, sizeof why))
      return say(c, 503, "store unavailable: %s\n", why);
    return say(c, 200, "ready%s\n", "");
  }
  if (strcmp(url, "/metrics") == 0) {
    size_t len;
    char *m = metrics_render(&len);
    if (!m)
      return MHD_NO;
    return text(c, 200, "text/plain; version=0.0.4; charset=utf-8", m, len);
  }
  return say(c, 404, "%s: not found (try /healthz, /readyz, /metrics)\n",
             url);
}

struct MHD_Daemon *admin_start(idem_store *s, const char *listen, char *bound,
                               size_t bound_size) {
  struct MHD_OptionItem opts[] = {
      {MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
      {MHD_OPTION_END, 0, NULL},
  };
  store = s;
  return listen_on("--admin-listen", listen,
                   MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                       MHD_USE_ERROR_LOG,
                   handle, NULL, opts, bound, bound_size);
}
