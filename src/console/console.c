/*
 * console.c -- the operator console: the records of a store, the unknown
 * outcomes first, and the operator's actions on them (resolve, delete),
 * as a page and as a JSON API under /api/.
 *
 * Everything in the store is attacker-controlled text (keys, tenants,
 * answers): the API sends it as JSON, and the page (assets/app.js) puts it
 * in the document as text only, under a Content-Security-Policy that runs
 * no script but the console's own.
 *
 * Who may act:
 *  - With a token (--token-file): the API takes "Authorization: Bearer
 *    TOKEN"; the page logs in with the token and gets a session cookie
 *    (HttpOnly, SameSite=Strict). A POST made with the cookie must also
 *    carry the session's CSRF token (X-CSRF-Token), which only the page
 *    holds.
 *  - Without one, the listener is the loopback's and a request must name a
 *    loopback host (Host), so that a page elsewhere cannot reach it through
 *    a name it rebinds to 127.0.0.1; POSTs carry the process's CSRF token.
 *  - Any request whose Origin (or Sec-Fetch-Site) says another site sent
 *    it is refused.
 * Every action, and every login, is written to the audit log: who (the
 * name given at login, or X-Idem-Operator with a bearer token), when, what
 * and from which address.
 */
#include "console.h"

#include "cli.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PROBLEM_TYPE "urn:idem:problem:"
#define COOKIE "idem_console"
#define SESSIONS 64
#define SESSION_MS (12 * 3600 * 1000LL)
#define MAX_BODY (1024 * 1024)     /* a POST's body */
#define MAX_PAGE 500               /* records per page */
#define MAX_WINDOW 10000           /* offset + limit */
#define COUNTED 10000              /* records of each state counted */
#define COUNT_EVERY_MS 1000
#define OPERATOR_MAX 64
#define LOGIN_MAX_BODY 4096
/* Wrong tokens: at most this many a minute from one client (limiter.c);
 * then its logins are refused (429) until the minute ends. */
#define FAILURES_PER_MINUTE 20

static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'";

typedef struct session {
  char id[65], csrf[65];
  char operator[OPERATOR_MAX + 1];
  double expires; /* cli_now_ms() */
} session;

struct console {
  idem_store *store;
  char *token;
  char *(*calls)(void);
  const char *cmd;
  int audit_fd;
  char csrf[65]; /* without a token: the one the page holds */
  pthread_mutex_t mu;
  session sessions[SESSIONS];
  console_limiter *limiter; /* wrong tokens, per client */
  /* The counts of /api/metrics, at most once a second. */
  pthread_mutex_t count_mu;
  double counted_at;
  int counts[4], capped[4], counted_ok, ended;
};

/* What a request carries between libmicrohttpd's calls. */
#define REQUEST_MAGIC 0x1de3c0e5u
typedef struct request {
  unsigned magic;
  char *body;
  size_t len;
  size_t max; /* what is kept of the body: nothing before a login */
  int too_big;
} request;

/* What a request is allowed, once its credentials are read. */
typedef struct who {
  int ok;          /* authenticated (or no token is needed) */
  int bearer;      /* by Authorization: Bearer */
  session *s;      /* by the cookie: its session (a copy's fields below) */
  char operator[OPERATOR_MAX + 1];
  char csrf[65];   /* what a POST must carry; "" with a bearer token */
  char address[INET6_ADDRSTRLEN + 8];
} who;

/* ---- small pieces -------------------------------------------------------- */

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int random_hex(char out[65]) {
  unsigned char b[32];
  if (RAND_bytes(b, sizeof b) != 1)
    return -1;
  for (int i = 0; i < 32; i++)
    sprintf(out + 2 * i, "%02x", b[i]);
  out[64] = 0;
  return 0;
}

/* Equal, in time that does not depend on where they first differ. */
static int same_secret(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  unsigned char diff = n != m;
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)(a[i] ^ (i < m ? b[i] : 0));
  return diff == 0;
}

/* A name given at login or in X-Idem-Operator: 1-64 printable ASCII. */
static int operator_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > OPERATOR_MAX)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < 0x20 || s[i] >= 0x7f)
      return 0;
  return 1;
}

static void peer_address(struct MHD_Connection *c, char *out, size_t size) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = ci ? ci->client_addr : NULL;
  snprintf(out, size, "?");
  if (!sa)
    return;
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out,
              (socklen_t)size);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out,
              (socklen_t)size);
}

/* ---- answers ------------------------------------------------------------- */

static void common_headers(struct MHD_Response *r) {
  MHD_add_response_header(r, "Cache-Control", "no-store");
  MHD_add_response_header(r, "Content-Security-Policy", csp);
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "X-Frame-Options", "DENY");
  /* same-origin, not no-referrer: under no-referrer a browser posts the
   * login form with "Origin: null", which foreign() must refuse. */
  MHD_add_response_header(r, "Referrer-Policy", "same-origin");
  MHD_add_response_header(r, "Cross-Origin-Resource-Policy", "same-origin");
}

/* Sends body (malloc'd; taken) with status and type, and an extra header
 * when name is not NULL. */
static enum MHD_Result send_owned(struct MHD_Connection *c, int status,
                                  const char *type, char *body, size_t len,
                                  const char *name, const char *value) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer_with_free_callback(len, body, free);
  enum MHD_Result ok;
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  common_headers(r);
  if (name)
    MHD_add_response_header(r, name, value);
  ok = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, int status,
                                 json_t *j) {
  char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!s)
    return MHD_NO;
  return send_owned(c, status, "application/json", s, strlen(s), NULL, NULL);
}

/* An RFC 9457 problem; the detail is escaped where it is not UTF-8. */
static enum MHD_Result problem_h(struct MHD_Connection *c, int status,
                                 const char *type, const char *title,
                                 const char *detail, const char *name,
                                 const char *value) {
  char t[128], *shown = cli_escape(detail, strlen(detail)), *s;
  json_t *j;
  snprintf(t, sizeof t, PROBLEM_TYPE "%s", type);
  j = shown ? json_pack("{s:s, s:s, s:i, s:s}", "type", t, "title", title,
                        "status", status, "detail", shown)
            : NULL;
  free(shown);
  s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(j);
  if (!s)
    return MHD_NO;
  return send_owned(c, status, "application/problem+json", s, strlen(s), name,
                    value);
}

static enum MHD_Result problem(struct MHD_Connection *c, int status,
                               const char *type, const char *title,
                               const char *detail) {
  return problem_h(c, status, type, title, detail, NULL, NULL);
}

static const console_asset *asset(const char *name) {
  for (size_t i = 0; i < console_nassets; i++)
    if (strcmp(console_assets[i].name, name) == 0)
      return &console_assets[i];
  return NULL;
}

/* An asset as it is, from the binary. */
static enum MHD_Result send_asset(struct MHD_Connection *c, const char *name,
                                  const char *type) {
  const console_asset *a = asset(name);
  char *copy;
  if (!a || !(copy = malloc(a->len ? a->len : 1)))
    return MHD_NO;
  memcpy(copy, a->data, a->len);
  return send_owned(c, 200, type, copy, a->len, NULL, NULL);
}

/* A page: the asset with each "{{NAME}}" replaced by the value given
 * (which the caller has made safe for where it goes: hex or fixed text). */
static enum MHD_Result send_page(struct MHD_Connection *c, int status,
                                 const char *name, const char *const *vars,
                                 const char *cookie) {
  const console_asset *a = asset(name);
  size_t cap, n = 0;
  char *out;
  if (!a)
    return MHD_NO;
  cap = a->len + 1024;
  if (!(out = malloc(cap)))
    return MHD_NO;
  for (size_t i = 0; i < a->len;) {
    const char *p = (const char *)a->data + i;
    int replaced = 0;
    if (a->len - i > 4 && p[0] == '{' && p[1] == '{') {
      for (const char *const *v = vars; v && *v; v += 2) {
        size_t kl = strlen(v[0]);
        if (a->len - i >= kl + 4 && memcmp(p + 2, v[0], kl) == 0 &&
            memcmp(p + 2 + kl, "}}", 2) == 0) {
          size_t vl = strlen(v[1]);
          if (n + vl >= cap) {
            free(out);
            return MHD_NO;
          }
          memcpy(out + n, v[1], vl);
          n += vl;
          i += kl + 4;
          replaced = 1;
          break;
        }
      }
    }
    if (!replaced) {
      if (n + 1 >= cap) {
        free(out);
        return MHD_NO;
      }
      out[n++] = *p;
      i++;
    }
  }
  return send_owned(c, status, "text/html; charset=utf-8", out, n,
                    cookie ? "Set-Cookie" : NULL, cookie);
}

static enum MHD_Result redirect(struct MHD_Connection *c, const char *to,
                                const char *cookie) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ok;
  if (!r)
    return MHD_NO;
  common_headers(r);
  MHD_add_response_header(r, "Location", to);
  if (cookie)
    MHD_add_response_header(r, "Set-Cookie", cookie);
  ok = MHD_queue_response(c, 303, r);
  MHD_destroy_response(r);
  return ok;
}

/* ---- the audit log ------------------------------------------------------- */

/* One line of the audit log: who, when, from where, what (action; the
 * record, the outcome, the status stored, whether forced, and libidem's
 * error when it was refused). status < 0: none; rc IDEM_OK: no error. */
static void audit(console *cn, const who *w, const char *action,
                  const idem_id *id, const char *outcome, int status,
                  int force, int rc) {
  char when[32];
  time_t t = time(NULL);
  struct tm tm;
  json_t *j;
  char *s;
  gmtime_r(&t, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  j = json_pack("{s:s, s:s, s:s, s:s}", "time", when, "operator",
                w->operator[0] ? w->operator : "-", "address", w->address,
                "action", action);
  if (!j)
    return;
  if (id) {
    /* Stored text may not be UTF-8: escaped, never dropped. */
    const char *parts[3] = {id->tenant, id->operation, id->key};
    const char *names[3] = {"tenant", "operation", "key"};
    for (int i = 0; i < 3; i++) {
      char *e = cli_escape(parts[i], strlen(parts[i]));
      json_object_set_new(j, names[i], json_string(e ? e : "?"));
      free(e);
    }
  }
  if (outcome)
    json_object_set_new(j, "outcome", json_string(outcome));
  if (status >= 0)
    json_object_set_new(j, "status", json_integer(status));
  if (force)
    json_object_set_new(j, "force", json_true());
  if (rc != IDEM_OK)
    json_object_set_new(j, "error", json_string(idem_rc_name(rc)));
  s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(j);
  if (!s)
    return;
  size_t n = strlen(s);
  s[n] = '\n'; /* json_dumps's NUL becomes the line's end */
  /* One write per line, O_APPEND: lines from threads never interleave. */
  if (cli_write_all(cn->audit_fd, s, n + 1) != 0)
    cli_error(cn->cmd, "audit log: %s", strerror(errno));
  free(s);
}

/* ---- who is asking ------------------------------------------------------- */

/* A Host header naming the loopback: localhost, 127.x.y.z or [::1], with
 * or without a port. */
static int loopback_host(const char *h) {
  char host[256];
  size_t n;
  struct in_addr a4;
  if (!h)
    return 0;
  if (h[0] == '[') {
    const char *end = strchr(h, ']');
    return end && (size_t)(end - h) == 4 && strncmp(h, "[::1]", 5) == 0 &&
           (end[1] == 0 || end[1] == ':');
  }
  n = strcspn(h, ":");
  if (n == 0 || n >= sizeof host)
    return 0;
  memcpy(host, h, n);
  host[n] = 0;
  if (strcasecmp(host, "localhost") == 0)
    return 1;
  return inet_pton(AF_INET, host, &a4) == 1 &&
         (ntohl(a4.s_addr) >> 24) == 127;
}

/* Whether the request says it comes from another site: an Origin that is
 * not this Host's, or Sec-Fetch-Site cross-site / same-site. */
static int foreign(struct MHD_Connection *c) {
  const char *origin =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
  const char *site =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-Fetch-Site");
  const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
  if (site && strcmp(site, "same-origin") != 0 && strcmp(site, "none") != 0)
    return 1;
  if (!origin)
    return 0;
  if (!host)
    return 1;
  if (strncmp(origin, "http://", 7) == 0)
    origin += 7;
  else if (strncmp(origin, "https://", 8) == 0)
    origin += 8;
  else
    return 1; /* "null", a file, an extension */
  return strcasecmp(origin, host) != 0;
}

static void who_is(console *cn, struct MHD_Connection *c, who *w) {
  const char *auth =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *cookie =
      MHD_lookup_connection_value(c, MHD_COOKIE_KIND, COOKIE);
  memset(w, 0, sizeof *w);
  peer_address(c, w->address, sizeof w->address);
  if (!cn->token) {
    w->ok = 1;
    snprintf(w->operator, sizeof w->operator, "local");
    memcpy(w->csrf, cn->csrf, sizeof w->csrf);
    return;
  }
  if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
    const char *name =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idem-Operator");
    if (console_limited(cn->limiter, c) || !same_secret(auth + 7, cn->token))
      return; /* counted once, by console_handle() */
    w->ok = w->bearer = 1;
    snprintf(w->operator, sizeof w->operator, "%s",
             name && operator_ok(name) ? name : "api");
    return;
  }
  if (!cookie || strlen(cookie) != 64)
    return;
  double now = cli_now_ms();
  pthread_mutex_lock(&cn->mu);
  for (int i = 0; i < SESSIONS; i++) {
    session *s = &cn->sessions[i];
    /* Every slot is compared, found or not. */
    if (s->id[0] && s->expires > now && same_secret(cookie, s->id) &&
        !w->ok) {
      w->ok = 1;
      w->s = s;
      memcpy(w->operator, s->operator, sizeof w->operator);
      memcpy(w->csrf, s->csrf, sizeof w->csrf);
    }
  }
  pthread_mutex_unlock(&cn->mu);
}

/* A POST's CSRF check: a bearer token needs none (a browser never sends
 * one by itself); otherwise X-CSRF-Token must be the session's. */
static int csrf_ok(struct MHD_Connection *c, const who *w) {
  const char *t;
  if (w->bearer)
    return 1;
  t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-CSRF-Token");
  return t && w->csrf[0] && same_secret(t, w->csrf);
}

/* ---- sessions ------------------------------------------------------------ */

/* A new session for operator; its cookie in cookie. -1 when no random
 * bytes could be had. */
static int session_new(console *cn, const char *operator, char *cookie,
                       size_t size) {
  session fresh, *slot = NULL;
  double now = cli_now_ms();
  memset(&fresh, 0, sizeof fresh);
  if (random_hex(fresh.id) != 0 || random_hex(fresh.csrf) != 0)
    return -1;
  snprintf(fresh.operator, sizeof fresh.operator, "%s", operator);
  fresh.expires = now + SESSION_MS;
  pthread_mutex_lock(&cn->mu);
  for (int i = 0; i < SESSIONS; i++) {
    session *s = &cn->sessions[i];
    if (!s->id[0] || s->expires <= now) {
      slot = s;
      break;
    }
    if (!slot || s->expires < slot->expires)
      slot = s; /* full: the session that ends first makes room */
  }
  *slot = fresh;
  pthread_mutex_unlock(&cn->mu);
  snprintf(cookie, size,
           COOKIE "=%s; HttpOnly; SameSite=Strict; Path=/; Max-Age=%lld",
           fresh.id, SESSION_MS / 1000);
  OPENSSL_cleanse(&fresh, sizeof fresh);
  return 0;
}

static void session_end(console *cn, const who *w) {
  pthread_mutex_lock(&cn->mu);
  if (w->s && same_secret(w->s->csrf, w->csrf))
    memset(w->s, 0, sizeof *w->s);
  pthread_mutex_unlock(&cn->mu);
}

/* ---- the records --------------------------------------------------------- */

/* What the console adds to a record's JSON: its state as an operator reads
 * it ("recovered" for a completed record an earlier attempt may also have
 * acted on), whether a holder's lease has ended, and how long ago it was
 * last written. */
static void operator_view(json_t *j, int state, int recovered, int64_t lease,
                          int64_t updated, int64_t now) {
  json_object_set_new(
      j, "state",
      json_string(state == IDEM_STATE_COMPLETED && recovered
                      ? "recovered"
                      : idem_state_name(state)));
  json_object_set_new(
      j, "lease_ended",
      json_boolean(state == IDEM_STATE_IN_PROGRESS && lease <= now));
  json_object_set_new(j, "age_ms",
                      json_integer(now > updated ? now - updated : 0));
}

typedef struct summary {
  char *tenant, *operation, *key;
  int state, attempt, recovered;
  int64_t created, updated, lease, expires;
} summary;

/* Which leases a listing keeps: any, running ones only (a holder is
 * acting), ended ones only (nobody is: the record waits for a retry to
 * take it over, or for an operator). */
enum { LEASE_ANY, LEASE_RUNNING, LEASE_ENDED };

typedef struct scan {
  const char *prefix;
  size_t plen;
  int recovered_only;
  int lease;
  int64_t now; /* wall_ms() */
  summary *ring; /* the newest cap matches, as a ring */
  size_t cap, total;
  int oom;
} scan;

static void summary_clear(summary *s) {
  free(s->tenant);
  free(s->operation);
  free(s->key);
  memset(s, 0, sizeof *s);
}

/* idem_list() gives the oldest first: the ring keeps the newest. */
static int scan_one(const idem_record *r, void *ctx) {
  scan *s = ctx;
  summary *slot;
  if (s->plen && strncmp(r->key, s->prefix, s->plen) != 0)
    return 0;
  if (s->recovered_only && !r->recovered)
    return 0;
  if (s->lease != LEASE_ANY &&
      (s->lease == LEASE_ENDED) != (r->lease_expires_ms <= s->now))
    return 0;
  slot = &s->ring[s->total % s->cap];
  summary_clear(slot);
  slot->tenant = strdup(r->tenant);
  slot->operation = strdup(r->operation);
  slot->key = strdup(r->key);
  if (!slot->tenant || !slot->operation || !slot->key) {
    s->oom = 1;
    return -1;
  }
  slot->state = r->state;
  slot->attempt = r->attempt;
  slot->recovered = r->recovered;
  slot->created = r->created_ms;
  slot->updated = r->updated_ms;
  slot->lease = r->lease_expires_ms;
  slot->expires = r->expires_ms;
  s->total++;
  return 0;
}

/* A string of text (escaped where it is not UTF-8, so that no record is
 * lost from a listing). */
static json_t *text_json(const char *s) {
  json_t *j = json_string(s);
  char *e;
  if (j)
    return j;
  e = cli_escape(s, strlen(s));
  j = json_string(e ? e : "?");
  free(e);
  return j;
}

static json_t *summary_json(const summary *s, int64_t now) {
  json_t *j = json_object();
  if (!j)
    return NULL;
  json_object_set_new(j, "tenant", text_json(s->tenant));
  json_object_set_new(j, "operation", text_json(s->operation));
  json_object_set_new(j, "key", text_json(s->key));
  json_object_set_new(j, "attempt", json_integer(s->attempt));
  json_object_set_new(j, "created_ms", json_integer(s->created));
  json_object_set_new(j, "updated_ms", json_integer(s->updated));
  json_object_set_new(j, "lease_expires_ms", json_integer(s->lease));
  json_object_set_new(j, "expires_ms", json_integer(s->expires));
  json_object_set_new(j, "recovered", json_boolean(s->recovered));
  operator_view(j, s->state, s->recovered, s->lease, s->updated, now);
  return j;
}

static const char *arg(struct MHD_Connection *c, const char *name) {
  const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
  return v && v[0] ? v : NULL;
}

/* A store failure as a problem: 503 when the store cannot be reached. */
static enum MHD_Result store_problem(struct MHD_Connection *c, int rc,
                                     const char *what) {
  char detail[700];
  snprintf(detail, sizeof detail, "%s: %s: %s", what, idem_rc_name(rc),
           idem_errmsg());
  detail[cli_utf8_cut(detail, sizeof detail)] = 0;
  if (rc == IDEM_ENOTFOUND)
    return problem(c, 404, "not-found", "No such record", detail);
  if (rc == IDEM_ESTATE)
    return problem(c, 409, "state", "Not in a state for this", detail);
  if (rc == IDEM_EINVAL || rc == IDEM_EKEY)
    return problem(c, 400, "invalid", "Invalid request", detail);
  return problem(c, 503, "store", "Store error", detail);
}

static int parse_state(const char *s, int *state, int *recovered) {
  *recovered = 0;
  if (!s)
    *state = 0;
  else if (strcmp(s, "in_progress") == 0)
    *state = IDEM_STATE_IN_PROGRESS;
  else if (strcmp(s, "unknown") == 0)
    *state = IDEM_STATE_UNKNOWN;
  else if (strcmp(s, "completed") == 0)
    *state = IDEM_STATE_COMPLETED;
  else if (strcmp(s, "recovered") == 0) {
    *state = IDEM_STATE_COMPLETED;
    *recovered = 1;
  } else
    return -1;
  return 0;
}

static int number_arg(struct MHD_Connection *c, const char *name, long max,
                      long def, long *out) {
  const char *v = arg(c, name);
  *out = def;
  return v ? cli_parse_uint(v, max, out) : 0;
}

static void scan_free(scan *s) {
  for (size_t i = 0; s->ring && i < s->cap; i++)
    summary_clear(&s->ring[i]);
  free(s->ring);
  s->ring = NULL;
}

/* The i-th newest match a scan kept (i below its cap and total). */
static const summary *scan_at(const scan *s, size_t i) {
  return &s->ring[(s->total - 1 - i) % s->cap];
}

/*
 * GET /api/records: newest first, filtered, a page at a time.
 *
 * The states are the operator's: "unknown" is every record that waits for
 * a person, those marked unknown and those in progress whose holder's
 * lease has ended (a gateway with --on-unknown fail, or `idem run`, leaves
 * them so: each retry is refused until someone settles it); "in_progress"
 * is a holder still acting.
 */
static enum MHD_Result api_records(console *cn, struct MHD_Connection *c) {
  idem_filter f[2];
  scan s[2];
  int nscans = 1, recovered, rc = IDEM_OK;
  long offset, limit;
  size_t at[2] = {0, 0}, total = 0;
  int64_t now = wall_ms();
  json_t *list, *out;
  memset(f, 0, sizeof f);
  memset(s, 0, sizeof s);
  if (parse_state(arg(c, "state"), &f[0].state, &recovered) != 0)
    return problem(c, 400, "invalid", "Invalid request",
                   "state: one of in_progress, unknown, completed, "
                   "recovered");
  if (number_arg(c, "offset", MAX_WINDOW, 0, &offset) != 0 ||
      number_arg(c, "limit", MAX_PAGE, 50, &limit) != 0 || limit == 0 ||
      offset + limit > MAX_WINDOW)
    return problem(c, 400, "invalid", "Invalid request",
                   "limit: 1-500; offset + limit: at most 10000 (narrow "
                   "the filter, or use idem keys list)");
  f[0].tenant = arg(c, "tenant");
  f[0].operation = arg(c, "operation");
  s[0].prefix = arg(c, "prefix");
  s[0].plen = s[0].prefix ? strlen(s[0].prefix) : 0;
  s[0].recovered_only = recovered;
  s[0].now = now;
  s[0].cap = (size_t)(offset + limit);
  if (f[0].state == IDEM_STATE_IN_PROGRESS) {
    s[0].lease = LEASE_RUNNING;
  } else if (f[0].state == IDEM_STATE_UNKNOWN) {
    /* Two listings, merged: each keeps its newest offset + limit, among
     * which are the newest of both. */
    f[1] = f[0];
    s[1] = s[0];
    f[1].state = IDEM_STATE_IN_PROGRESS;
    s[1].lease = LEASE_ENDED;
    nscans = 2;
  }
  for (int k = 0; k < nscans && rc == IDEM_OK; k++) {
    if (!(s[k].ring = calloc(s[k].cap, sizeof *s[k].ring))) {
      s[k].oom = 1;
      break;
    }
    rc = idem_list(cn->store, &f[k], scan_one, &s[k]);
    total += s[k].total;
  }
  if (rc != IDEM_OK || s[0].oom || s[1].oom) {
    int oom = s[0].oom || s[1].oom;
    scan_free(&s[0]);
    scan_free(&s[1]);
    return oom ? MHD_NO : store_problem(c, rc, "list");
  }
  list = json_array();
  for (long i = 0; list && i < offset + limit; i++) {
    /* The newer of the two next ones. */
    const summary *a = at[0] < s[0].total && at[0] < s[0].cap
                           ? scan_at(&s[0], at[0])
                           : NULL;
    const summary *b = nscans > 1 && at[1] < s[1].total && at[1] < s[1].cap
                           ? scan_at(&s[1], at[1])
                           : NULL;
    int pick = a && (!b || a->created >= b->created) ? 0 : 1;
    if (!a && !b)
      break;
    if (i >= offset)
      json_array_append_new(list, summary_json(pick ? b : a, now));
    at[pick]++;
  }
  scan_free(&s[0]);
  scan_free(&s[1]);
  out = json_pack("{s:o?, s:I, s:I, s:I, s:I}", "records", list, "total",
                  (json_int_t)total, "offset", (json_int_t)offset, "limit",
                  (json_int_t)limit, "now_ms", (json_int_t)now);
  return send_json(c, 200, out);
}

/* The record named by tenant, operation and key (strings of j or the query
 * string); 0, or -1 when one is missing. */
static int record_id(struct MHD_Connection *c, json_t *j, idem_id *id) {
  const char *parts[3];
  const char *names[3] = {"tenant", "operation", "key"};
  for (int i = 0; i < 3; i++) {
    if (j) {
      json_t *v = json_object_get(j, names[i]);
      if (v && !json_is_string(v))
        return -1; /* a tenant of 5 is not the default tenant */
      parts[i] = v ? json_string_value(v) : NULL;
    } else {
      parts[i] = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND,
                                             names[i]);
    }
  }
  id->tenant = parts[0] ? parts[0] : "";
  id->operation = parts[1];
  id->key = parts[2];
  return parts[1] && parts[2] ? 0 : -1;
}

static enum MHD_Result api_show(console *cn, struct MHD_Connection *c) {
  idem_id id;
  idem_record *r = NULL;
  json_t *j;
  int rc;
  if (record_id(c, NULL, &id) != 0)
    return problem(c, 400, "invalid", "Invalid request",
                   "name the record: tenant, operation and key");
  if ((rc = idem_get(cn->store, &id, &r)) != IDEM_OK)
    return store_problem(c, rc, "show");
  j = cli_record_json(r);
  if (j)
    operator_view(j, r->state, r->recovered, r->lease_expires_ms,
                  r->updated_ms, wall_ms());
  idem_record_free(r);
  return j ? send_json(c, 200, j) : MHD_NO;
}

static json_t *body_json(request *q, struct MHD_Connection *c,
                         enum MHD_Result *sent) {
  json_error_t e;
  json_t *j;
  const char *type =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
  if (!type || strncasecmp(type, "application/json", 16) != 0 ||
      (type[16] && type[16] != ';' && type[16] != ' ' && type[16] != '\t')) {
    *sent = problem(c, 415, "unsupported-media-type", "JSON expected",
                    "send Content-Type: application/json");
    return NULL;
  }
  j = json_loadb(q->body ? q->body : "", q->len,
                 JSON_REJECT_DUPLICATES, &e);
  if (!json_is_object(j)) {
    char detail[300];
    snprintf(detail, sizeof detail, "the body is not a JSON object: %s",
             j ? "another value" : e.text);
    json_decref(j);
    *sent = problem(c, 400, "invalid", "Invalid request", detail);
    return NULL;
  }
  return j;
}

/*
 * POST /api/records/resolve: an unknown outcome (or a record in progress
 * whose lease has ended, or, with force, any in progress) settled:
 *  - completed: the action happened; retries replay status and body;
 *  - failed: it happened and failed, or must not be tried again; retries
 *    replay an error: the status and body given, or for the gateway's
 *    records 502 and a problem, for `idem run`'s exit status 1;
 *  - released: it did not happen; the record is deleted and the next call
 *    acts.
 */
static enum MHD_Result api_resolve(console *cn, struct MHD_Connection *c,
                                   request *q, const who *w) {
  enum MHD_Result sent = MHD_NO;
  json_t *j = body_json(q, c, &sent), *st, *body, *force;
  const char *outcome;
  idem_id id;
  idem_response resp = {0};
  idem_resolve_options ro = {0};
  int rc, has_status = 0, released;
  long status = 0;
  char failed_body[300];
  if (!j)
    return sent;
  outcome = json_string_value(json_object_get(j, "outcome"));
  st = json_object_get(j, "status");
  body = json_object_get(j, "body");
  force = json_object_get(j, "force");
  if (record_id(c, j, &id) != 0) {
    sent = problem(c, 400, "invalid", "Invalid request",
                   "name the record: tenant, operation and key (strings)");
    goto out;
  }
  if (!outcome || (strcmp(outcome, "completed") != 0 &&
                   strcmp(outcome, "failed") != 0 &&
                   strcmp(outcome, "released") != 0)) {
    sent = problem(c, 400, "invalid", "Invalid request",
                   "outcome: completed (it acted: retries replay the "
                   "answer), failed (retries replay an error) or released "
                   "(it did not act: the next call acts)");
    goto out;
  }
  released = strcmp(outcome, "released") == 0;
  if ((st && !json_is_integer(st)) || (body && !json_is_string(body)) ||
      (force && !json_is_boolean(force))) {
    sent = problem(c, 400, "invalid", "Invalid request",
                   "status is an integer, body a string, force true or "
                   "false");
    goto out;
  }
  if (released && (st || body)) {
    sent = problem(c, 400, "invalid", "Invalid request",
                   "a released record keeps no answer: no status or body");
    goto out;
  }
  if (st) {
    has_status = 1;
    status = (long)json_integer_value(st);
  }
  if (!released) {
    int http = cli_http_operation(id.operation), run = !strcmp(id.operation, "run");
    if (!has_status && strcmp(outcome, "failed") == 0 && (http || run)) {
      has_status = 1;
      status = http ? 502 : 1;
    }
    if (!has_status) {
      sent = problem(c, 400, "invalid", "Invalid request",
                     "status: the status that retries will be answered "
                     "(an HTTP status for the gateway's records, an exit "
                     "status for idem run's; idem mcp's keep 0, or 1 for a "
                     "tool's error)");
      goto out;
    }
    if ((http && (status < 100 || status > 599)) ||
        (run && (status < 0 || status > 255)) || status < INT32_MIN ||
        status > INT32_MAX) {
      sent = problem(c, 400, "invalid", "Invalid request",
                     http ? "status: an HTTP status, 100-599"
                          : run ? "status: an exit status, 0-255"
                                : "status: out of range");
      goto out;
    }
    resp.status = (int)status;
    if (body) {
      resp.body = json_string_value(body);
      resp.body_len = json_string_length(body);
    } else if (strcmp(outcome, "failed") == 0 && http) {
      snprintf(failed_body, sizeof failed_body,
               "{\"type\":\"" PROBLEM_TYPE "resolved-failed\",\"title\":"
               "\"Resolved as failed\",\"status\":%ld,\"detail\":\"An "
               "operator settled this key as failed; retries are answered "
               "this.\"}",
               status);
      resp.body = failed_body;
      resp.body_len = strlen(failed_body);
    }
  }
  ro.force = json_is_true(force);
  rc = idem_resolve_with(cn->store, &id, released ? NULL : &resp, &ro);
  audit(cn, w, "resolve", &id, rc == IDEM_OK ? outcome : "refused",
        released ? -1 : resp.status, ro.force, rc);
  if (rc != IDEM_OK) {
    sent = store_problem(c, rc, "resolve");
    goto out;
  }
  sent = send_json(c, 200,
                   json_pack("{s:s, s:s}", "resolved", outcome, "detail",
                             released ? "the record is deleted: the next "
                                        "call acts"
                                      : "retries replay the answer"));
out:
  json_decref(j);
  return sent;
}

static enum MHD_Result api_delete(console *cn, struct MHD_Connection *c,
                                  request *q, const who *w) {
  enum MHD_Result sent = MHD_NO;
  json_t *j = body_json(q, c, &sent), *force;
  idem_record *r = NULL;
  idem_id id;
  int rc, running;
  if (!j)
    return sent;
  force = json_object_get(j, "force");
  if (record_id(c, j, &id) != 0 || (force && !json_is_boolean(force))) {
    json_decref(j);
    return problem(c, 400, "invalid", "Invalid request",
                   "name the record: tenant, operation and key (strings); "
                   "force is true or false");
  }
  /* A holder still inside its lease may be acting: deleting its record
   * lets a retry act beside it, so that takes force, as a resolve does. */
  if ((rc = idem_get(cn->store, &id, &r)) == IDEM_OK) {
    running = r->state == IDEM_STATE_IN_PROGRESS &&
              r->lease_expires_ms > wall_ms();
    idem_record_free(r);
    if (running && !json_is_true(force)) {
      audit(cn, w, "delete", &id, "refused", -1, 0, IDEM_ESTATE);
      json_decref(j);
      return problem(c, 409, "state", "Not in a state for this",
                     "delete: a holder's lease still runs, and it may be "
                     "acting: deleting its record lets a retry act beside "
                     "it. Send force: true to delete it anyway");
    }
    rc = idem_delete(cn->store, &id);
  }
  audit(cn, w, "delete", &id, rc == IDEM_OK ? "deleted" : "refused", -1,
        json_is_true(force), rc);
  sent = rc != IDEM_OK ? store_problem(c, rc, "delete")
                       : send_json(c, 200, json_pack("{s:b}", "deleted", 1));
  json_decref(j);
  return sent;
}

typedef struct counting {
  int n, recovered, ended, limit;
  int64_t now;
} counting;

static int count_one(const idem_record *r, void *ctx) {
  counting *k = ctx;
  if (k->n >= k->limit)
    return 1; /* enough: said as "at least" */
  k->n++;
  k->recovered += r->recovered != 0;
  k->ended += r->state == IDEM_STATE_IN_PROGRESS &&
              r->lease_expires_ms <= k->now;
  return 0;
}

/* GET /api/metrics: the records by state (up to COUNTED each, counted at
 * most once a second however many ask; "unknown" also counts those in
 * progress whose lease has ended, as /api/records lists them), and the
 * calls this process answered when it answers any. */
static enum MHD_Result api_metrics(console *cn, struct MHD_Connection *c) {
  static const int states[3] = {IDEM_STATE_IN_PROGRESS, IDEM_STATE_UNKNOWN,
                                IDEM_STATE_COMPLETED};
  static const char *const names[4] = {"in_progress", "unknown", "completed",
                                       "recovered"};
  double now = cli_now_ms();
  json_t *records = json_object(), *capped = json_object(), *out;
  char *calls;
  pthread_mutex_lock(&cn->count_mu);
  if (!cn->counted_at || now - cn->counted_at >= COUNT_EVERY_MS) {
    cn->counted_ok = 1;
    for (int i = 0; i < 3; i++) {
      idem_filter f = {0};
      counting k = {0, 0, 0, COUNTED, wall_ms()};
      int rc;
      f.state = states[i];
      rc = idem_list(cn->store, &f, count_one, &k);
      if (rc != IDEM_OK && rc != 1)
        cn->counted_ok = 0;
      cn->counts[i] = k.n;
      cn->capped[i] = rc == 1;
      if (i == 0) {
        /* In progress with the lease ended: waiting for an operator (or a
         * retry that takes it over), counted as unknown. */
        cn->counts[0] -= k.ended;
        cn->ended = k.ended;
      } else if (i == 1) {
        cn->counts[1] += cn->ended;
      } else if (i == 2) {
        cn->counts[3] = k.recovered;
        cn->capped[3] = rc == 1;
      }
    }
    cn->counted_at = cli_now_ms();
  }
  for (int i = 0; i < 4 && records && capped; i++) {
    json_object_set_new(records, names[i], json_integer(cn->counts[i]));
    json_object_set_new(capped, names[i], json_boolean(cn->capped[i]));
  }
  int ok = cn->counted_ok;
  pthread_mutex_unlock(&cn->count_mu);
  if (!ok) {
    json_decref(records);
    json_decref(capped);
    return problem(c, 503, "store", "Store error",
                   "the store could not be read to count its records");
  }
  calls = cn->calls ? cn->calls() : NULL;
  out = json_pack("{s:o?, s:o?, s:I}", "records", records, "at_least",
                  capped, "now_ms", (json_int_t)wall_ms());
  if (out)
    json_object_set_new(out, "calls",
                        calls ? json_loads(calls, 0, NULL) : json_null());
  free(calls);
  return send_json(c, 200, out);
}

/* ---- the login ----------------------------------------------------------- */

/* The value of name in an application/x-www-form-urlencoded body, decoded
 * into out; 0, or -1 when absent or too long. */
static int form_value(const char *body, size_t len, const char *name,
                      char *out, size_t size) {
  size_t nl = strlen(name), i = 0;
  while (i < len) {
    size_t end = i;
    while (end < len && body[end] != '&')
      end++;
    if (end - i > nl && memcmp(body + i, name, nl) == 0 && body[i + nl] == '=') {
      size_t n = 0;
      for (size_t k = i + nl + 1; k < end; k++) {
        char ch = body[k];
        if (ch == '+') {
          ch = ' ';
        } else if (ch == '%') {
          unsigned v;
          if (k + 2 >= end || !isxdigit((unsigned char)body[k + 1]) ||
              !isxdigit((unsigned char)body[k + 2]) ||
              sscanf(body + k + 1, "%2x", &v) != 1 || v == 0)
            return -1;
          ch = (char)v;
          k += 2;
        }
        if (n + 1 >= size)
          return -1;
        out[n++] = ch;
      }
      out[n] = 0;
      return 0;
    }
    i = end + 1;
  }
  return -1;
}

static enum MHD_Result login(console *cn, struct MHD_Connection *c,
                             request *q) {
  char token[1100], operator[256], cookie[256];
  const char *error_page[] = {"ERROR", "<p id=\"login-error\" role=\"alert\">"
                                       "That token is not the console's.</p>",
                              NULL};
  who w;
  who_is(cn, c, &w);
  if (!cn->token)
    return redirect(c, "/", NULL);
  if (console_limited(cn->limiter, c)) {
    console_failed(cn->limiter, c);
    return problem_h(c, 429, "too-many-failures", "Too many failed logins",
                     "too many wrong tokens from this address this minute: "
                     "try again in a minute",
                     "Retry-After", "60");
  }
  if (q->too_big || form_value(q->body, q->len, "token", token,
                               sizeof token) != 0 ||
      !same_secret(token, cn->token)) {
    w.operator[0] = 0;
    if (q->body && form_value(q->body, q->len, "operator", operator,
                              sizeof operator) == 0 &&
        operator_ok(operator))
      snprintf(w.operator, sizeof w.operator, "%s", operator);
    audit(cn, &w, "login-failed", NULL, NULL, -1, 0, IDEM_OK);
    console_failed(cn->limiter, c);
    OPENSSL_cleanse(token, sizeof token);
    return send_page(c, 401, "login.html", error_page, NULL);
  }
  OPENSSL_cleanse(token, sizeof token);
  if (form_value(q->body, q->len, "operator", operator, sizeof operator) != 0 ||
      !operator_ok(operator)) {
    const char *bad[] = {"ERROR", "<p id=\"login-error\" role=\"alert\">"
                                  "Give your name (1-64 printable ASCII "
                                  "characters): the audit log records "
                                  "it.</p>",
                         NULL};
    return send_page(c, 400, "login.html", bad, NULL);
  }
  if (session_new(cn, operator, cookie, sizeof cookie) != 0)
    return MHD_NO;
  snprintf(w.operator, sizeof w.operator, "%s", operator);
  audit(cn, &w, "login", NULL, NULL, -1, 0, IDEM_OK);
  return redirect(c, "/", cookie);
}

/* ---- dispatch ------------------------------------------------------------ */

int console_owns(const char *url) {
  return strcmp(url, "/") == 0 || strcmp(url, "/login") == 0 ||
         strcmp(url, "/logout") == 0 || strcmp(url, "/app.js") == 0 ||
         strcmp(url, "/console.css") == 0 || strncmp(url, "/api/", 5) == 0;
}

int console_is_request(void *con_cls) {
  return con_cls && ((request *)con_cls)->magic == REQUEST_MAGIC;
}

void console_completed(void **con_cls) {
  request *q = *con_cls;
  if (!console_is_request(q))
    return;
  free(q->body);
  free(q);
  *con_cls = NULL;
}

static enum MHD_Result unauthorised(struct MHD_Connection *c,
                                    const char *url) {
  if (strncmp(url, "/api/", 5) != 0) {
    const char *none[] = {"ERROR", "", NULL};
    return send_page(c, 401, "login.html", none, NULL);
  }
  return problem_h(c, 401, "unauthorized", "Token required",
                   "The console answers requests with Authorization: Bearer "
                   "and its token, or with the session of a login.",
                   "WWW-Authenticate", "Bearer realm=\"idem console\"");
}

enum MHD_Result console_handle(console *cn, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *upload, size_t *upload_size,
                               void **con_cls) {
  request *q = *con_cls;
  int post = strcmp(method, "POST") == 0;
  who w;
  if (!console_is_request(q)) { /* first call: headers only */
    if (!(q = calloc(1, sizeof *q)))
      return MHD_NO;
    q->magic = REQUEST_MAGIC;
    *con_cls = q;
    /* A body is kept only when it can be used: a login's, small, or an
     * authenticated request's. Another's is read and dropped, so that no
     * one without the token makes the console hold memory. */
    if (strcmp(url, "/login") == 0) {
      q->max = LOGIN_MAX_BODY;
    } else {
      who_is(cn, c, &w);
      q->max = w.ok && (cn->token || loopback_host(MHD_lookup_connection_value(
                                         c, MHD_HEADER_KIND, "Host")))
                   ? MAX_BODY
                   : 0;
    }
    return MHD_YES;
  }
  if (*upload_size) {
    if (q->len + *upload_size > q->max) {
      q->too_big = 1;
    } else {
      char *more = realloc(q->body, q->len + *upload_size + 1);
      if (!more)
        return MHD_NO;
      memcpy(more + q->len, upload, *upload_size);
      q->body = more;
      q->len += *upload_size;
      q->body[q->len] = 0;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (!cn->token &&
      !loopback_host(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host")))
    return problem(c, 403, "host", "Host refused",
                   "This console has no token: it answers requests for a "
                   "loopback host only (localhost, 127.0.0.1, [::1]).");
  if (foreign(c))
    return problem(c, 403, "foreign-origin", "Foreign origin",
                   "The console answers its own pages only: this request "
                   "came from another site.");
  if (!post && strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return problem_h(c, 405, "method-not-allowed", "Method not allowed",
                     "the console answers GET, HEAD and POST", "Allow",
                     "GET, HEAD, POST");
  if (q->too_big && q->max == MAX_BODY)
    return problem(c, 413, "too-large", "Body too large",
                   "the console takes bodies of up to 1 MiB; resolve with a "
                   "larger answer with idem keys resolve --body FILE");
  if (strcmp(url, "/console.css") == 0)
    return send_asset(c, "console.css", "text/css; charset=utf-8");
  if (strcmp(url, "/login") == 0) {
    if (!post) {
      const char *none[] = {"ERROR", "", NULL};
      return send_page(c, 200, "login.html", none, NULL);
    }
    return login(cn, c, q);
  }
  who_is(cn, c, &w);
  if (!w.ok) {
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")) {
      /* Said in the audit log at the first wrong token of a minute and
       * when the client is shut out, not at every guess. */
      int n = console_failed(cn->limiter, c);
      if (n == 1 || n == FAILURES_PER_MINUTE)
        audit(cn, &w, n == 1 ? "auth-failed" : "auth-locked", NULL, NULL,
              -1, 0, IDEM_OK);
    }
    return unauthorised(c, url);
  }
  if (post && !csrf_ok(c, &w))
    return problem(c, 403, "csrf", "CSRF token missing or wrong",
                   "a POST made with the console's session carries "
                   "X-CSRF-Token, the token its page holds");
  if (strcmp(url, "/") == 0) {
    const char *vars[] = {"CSRF", w.csrf, NULL};
    if (post)
      return problem(c, 405, "method-not-allowed", "Method not allowed",
                     "POST to /api/");
    return send_page(c, 200, "index.html", vars, NULL);
  }
  if (strcmp(url, "/app.js") == 0)
    return send_asset(c, "app.js", "text/javascript; charset=utf-8");
  if (strcmp(url, "/logout") == 0) {
    if (!post)
      return problem(c, 405, "method-not-allowed", "Method not allowed",
                     "log out with POST");
    audit(cn, &w, "logout", NULL, NULL, -1, 0, IDEM_OK);
    session_end(cn, &w);
    return redirect(c, "/",
                    COOKIE "=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
  }
  if (strcmp(url, "/api/session") == 0 && !post)
    return send_json(c, 200, json_pack("{s:s, s:s}", "operator", w.operator,
                                       "csrf", w.csrf));
  if (strcmp(url, "/api/records") == 0 && !post)
    return api_records(cn, c);
  if (strcmp(url, "/api/records/show") == 0 && !post)
    return api_show(cn, c);
  if (strcmp(url, "/api/metrics") == 0 && !post)
    return api_metrics(cn, c);
  if (strcmp(url, "/api/records/resolve") == 0 && post)
    return api_resolve(cn, c, q, &w);
  if (strcmp(url, "/api/records/delete") == 0 && post)
    return api_delete(cn, c, q, &w);
  return problem(c, 404, "not-found", "Not found",
                 "try GET /api/records, /api/records/show, /api/metrics; "
                 "POST /api/records/resolve, /api/records/delete");
}

enum MHD_Result console_access(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
  (void)version;
  return console_handle(cls, c, url, method, upload, upload_size, con_cls);
}

void console_notify_completed(void *cls, struct MHD_Connection *c,
                              void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c, (void)toe;
  console_completed(con_cls);
}

console *console_new(const console_config *cfg) {
  console *cn = calloc(1, sizeof *cn);
  if (!cn)
    return NULL;
  cn->store = cfg->store;
  cn->calls = cfg->calls;
  cn->cmd = cfg->cmd;
  cn->audit_fd = STDERR_FILENO;
  pthread_mutex_init(&cn->mu, NULL);
  pthread_mutex_init(&cn->count_mu, NULL);
  if (!(cn->limiter = console_limiter_new()) ||
      (cfg->token && !(cn->token = strdup(cfg->token))) ||
      random_hex(cn->csrf) != 0) {
    cli_error(cfg->cmd, "console: out of memory or random bytes");
    console_free(cn);
    return NULL;
  }
  if (cfg->audit_path) {
    cn->audit_fd = open(cfg->audit_path,
                        O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (cn->audit_fd < 0) {
      cli_error(cfg->cmd, "the audit log %s: %s", cfg->audit_path,
                strerror(errno));
      cn->audit_fd = STDERR_FILENO;
      console_free(cn);
      return NULL;
    }
  }
  return cn;
}

void console_free(console *cn) {
  if (!cn)
    return;
  if (cn->audit_fd != STDERR_FILENO)
    close(cn->audit_fd);
  if (cn->token) {
    OPENSSL_cleanse(cn->token, strlen(cn->token));
    free(cn->token);
  }
  OPENSSL_cleanse(cn->sessions, sizeof cn->sessions);
  console_limiter_free(cn->limiter);
  pthread_mutex_destroy(&cn->mu);
  pthread_mutex_destroy(&cn->count_mu);
  free(cn);
}
