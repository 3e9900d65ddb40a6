/*
 * engine.c -- the record state machine: argument checks, defaults, the
 * decision table, and dispatch to a store backend.
 */
#include "lease.h"
#include "seal.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define MAX_ID_PART 255


/* ---- helpers for backends ------------------------------------------- */

int64_t idem__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t idem__deadline(int64_t now_ms, int64_t period_ms) {
  if (period_ms > 0 && now_ms > INT64_MAX - period_ms)
    return INT64_MAX;
  return now_ms + period_ms;
}

int idem__new_token(char token[IDEM__TOKEN_SIZE]) {
  static const char digits[] = "0123456789abcdef";
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return idem__fail(IDEM_EIO, "getrandom: %s", strerror(errno));
    }
    got += (size_t)n;
  }
  for (size_t i = 0; i < sizeof raw; i++) {
    token[2 * i] = digits[raw[i] >> 4];
    token[2 * i + 1] = digits[raw[i] & 15];
  }
  token[32] = '\0';
  return IDEM_OK;
}

int idem__op_fail(idem__op *op, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(op->errmsg, sizeof op->errmsg, fmt, ap);
  va_end(ap);
  op->rc = rc;
  return rc;
}

char *idem__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p)
    memcpy(p, s, n);
  return p;
}

int idem__claim_set_response(idem_call *claim, int status, const void *meta,
                             size_t meta_len, const void *body,
                             size_t body_len) {
  /* One buffer, each part NUL-terminated so text can be printed as is. */
  char *buf = malloc(meta_len + body_len + 2);
  if (!buf)
    return IDEM_ENOMEM;
  if (meta_len)
    memcpy(buf, meta, meta_len);
  buf[meta_len] = '\0';
  if (body_len)
    memcpy(buf + meta_len + 1, body, body_len);
  buf[meta_len + 1 + body_len] = '\0';
  free(claim->resp_buf);
  claim->resp_buf = buf;
  claim->has_response = 1;
  claim->response.status = status;
  claim->response.meta = meta ? buf : NULL;
  claim->response.meta_len = meta_len;
  claim->response.body = buf + meta_len + 1;
  claim->response.body_len = body_len;
  return IDEM_OK;
}

int idem__response_checksum(const char *fingerprint, int status,
                            const void *meta, size_t meta_len,
                            const void *body, size_t body_len,
                            char hex[IDEM_FINGERPRINT_SIZE]) {
  /* Lengths are part of the hashed bytes so that moving bytes between the
   * metadata and the body changes the checksum. */
  char head[128];
  int n = snprintf(head, sizeof head, "%s:%d:%zu:%zu:", fingerprint, status,
                   meta_len, body_len);
  const void *parts[3] = {head, meta, body};
  size_t sizes[3] = {(size_t)n, meta ? meta_len : 0, body ? body_len : 0};
  return idem__sha256_parts(parts, sizes, 3, hex);
}

/* ---- the decision ---------------------------------------------------- */

idem_outcome idem__decide(const idem__row *row, const char *fingerprint,
                          int64_t now_ms, int64_t lease_now_ms,
                          const idem_call_options *opts,
                          idem__action *action, int64_t *retry_after_ms) {
  int may_take_over;
  *action = IDEM__ACT_NONE;
  *retry_after_ms = 0;
  /* Retention ends a completed record only. A record in progress or marked
   * unknown may describe an action that happened; it never expires by
   * itself, or the next call would act a second time. */
  if (!row->exists ||
      (row->state == IDEM_STATE_COMPLETED && row->expires_ms <= now_ms &&
       row->expires_lease_ms <= lease_now_ms)) {
    *action = IDEM__ACT_INSERT;
    return IDEM_PROCEED;
  }
  if (strcmp(row->fingerprint, fingerprint) != 0)
    return IDEM_CONFLICT;
  switch (row->state) {
  case IDEM_STATE_COMPLETED:
    return IDEM_REPLAY;
  case IDEM_STATE_IN_PROGRESS:
    if (row->lease_expires_ms > lease_now_ms) {
      *retry_after_ms = row->lease_expires_ms - lease_now_ms;
      return IDEM_IN_FLIGHT;
    }
    may_take_over = opts->on_expired_lease != IDEM_EXPIRED_REPORT;
    break;
  default: /* IDEM_STATE_UNKNOWN */
    may_take_over = opts->takeover_unknown != 0;
    break;
  }
  if (!may_take_over ||
      (opts->max_attempts > 0 && row->attempt >= opts->max_attempts))
    return IDEM_UNKNOWN;
  *action = IDEM__ACT_TAKEOVER;
  return IDEM_RECOVER;
}

idem__action idem__decide_op(idem__op *op, const idem__row *row,
                             int64_t now_ms, int64_t lease_now_ms) {
  idem_call *cl = op->claim;
  idem__action action;
  cl->outcome = idem__decide(row, op->fingerprint, now_ms, lease_now_ms,
                             &op->opts, &action, &cl->retry_after_ms);
  cl->attempt = row->attempt;
  cl->took_over_unknown =
      cl->outcome == IDEM_RECOVER && row->state == IDEM_STATE_UNKNOWN;
  /* A replay's mark is the record's: idem__claim_replay() sets it. */
  cl->recovered = cl->outcome == IDEM_RECOVER;
  if (cl->outcome == IDEM_IN_FLIGHT && cl->retry_after_ms < 1)
    cl->retry_after_ms = 1;
  return action;
}

int idem__claim_replay(idem__op *op, const char *fingerprint, int status,
                       const void *meta, size_t meta_len, const void *body,
                       size_t body_len, const char *sum, size_t sum_len,
                       int recovered) {
  char want[IDEM_FINGERPRINT_SIZE];
  if (idem__response_checksum(fingerprint, status, meta, meta_len, body,
                              body_len, want) != IDEM_OK ||
      !sum || sum_len != IDEM_FINGERPRINT_SIZE - 1 ||
      memcmp(sum, want, sum_len) != 0)
    return idem__op_fail(op, IDEM_ECORRUPT,
                         "record (%s, %s, %s): the stored response does not "
                         "match its checksum; it is not replayed (idem keys "
                         "delete removes it)",
                         op->id->tenant ? op->id->tenant : "",
                         op->id->operation, op->id->key);
  if (idem__claim_set_response(op->claim, status, meta_len ? meta : NULL,
                               meta_len, body, body_len) != IDEM_OK)
    return idem__op_fail(op, IDEM_ENOMEM, "out of memory");
  op->claim->recovered = recovered != 0;
  return IDEM_OK;
}

int idem__response_problem(const idem_response *r, const char *who,
                           char *why, size_t size) {
  /* IDEM_MAX_RESPONSE bounds a response in clear: its sealed form, which
   * the engine checked in clear before sealing, may be larger by the
   * sealing's overhead. */
  size_t max = IDEM_MAX_RESPONSE;
  if ((r->meta_len && !r->meta) || (r->body_len && !r->body)) {
    snprintf(why, size, "%s: NULL data with a length", who);
    return IDEM_EINVAL;
  }
  if (idem__seal_marked(r->meta, r->meta_len, NULL))
    max += IDEM__SEAL_OVERHEAD;
  else if (idem__seal_marker_prefix(r->meta, r->meta_len)) {
    snprintf(why, size,
             "%s: its meta begins with idem's seal marker "
             "(\\0idem-sealed:), which every reader would take for a "
             "sealed response",
             who);
    return IDEM_EINVAL;
  }
  if (r->meta_len > max || r->body_len > max - r->meta_len) {
    snprintf(why, size, "%s: %zu bytes; a record keeps at most %u", who,
             r->meta_len + r->body_len, IDEM_MAX_RESPONSE);
    return IDEM_ETOOBIG;
  }
  return IDEM_OK;
}

int idem__plain_response_problem(const idem_response *r, const char *who,
                                 char *why, size_t size) {
  if (idem__seal_marked(r->meta, r->meta_len, NULL)) {
    snprintf(why, size,
             "%s: its meta is idem's seal marker (\\0idem-sealed:v1:...), "
             "which every reader would take for a sealed response",
             who);
    return IDEM_EINVAL;
  }
  return idem__response_problem(r, who, why, size);
}

/* n bytes and a NUL; NULL for a NULL column (or out of memory: *oom). */
static void *dup_part(const void *p, size_t n, int *oom) {
  char *c;
  if (!p)
    return NULL;
  if (!(c = malloc(n + 1))) {
    *oom = 1;
    return NULL;
  }
  if (n)
    memcpy(c, p, n);
  c[n] = '\0';
  return c;
}

int idem__record_new(const idem__row_parts *p, idem_record **out) {
  idem_record *r = calloc(1, sizeof *r);
  int oom = 0;
  *out = NULL;
  if (!r)
    return idem__fail(IDEM_ENOMEM, "out of memory");
  r->tenant = dup_part(p->tenant ? p->tenant : "", p->tenant_len, &oom);
  r->operation =
      dup_part(p->operation ? p->operation : "", p->operation_len, &oom);
  r->key = dup_part(p->key ? p->key : "", p->key_len, &oom);
  r->fingerprint =
      dup_part(p->fingerprint ? p->fingerprint : "", p->fingerprint_len, &oom);
  r->state = (idem_state)p->state;
  r->attempt = p->attempt;
  r->created_ms = p->created_ms;
  r->updated_ms = p->updated_ms;
  r->lease_expires_ms = p->lease_expires_ms;
  r->expires_ms = p->expires_ms;
  r->request = dup_part(p->request, p->request_len, &oom);
  r->request_len = r->request ? p->request_len : 0;
  if (r->state == IDEM_STATE_COMPLETED) {
    r->has_response = 1;
    r->response.status = p->status;
    r->response.meta = dup_part(p->meta, p->meta_len, &oom);
    r->response.meta_len = r->response.meta ? p->meta_len : 0;
    r->response.body = dup_part(p->body, p->body_len, &oom);
    r->response.body_len = r->response.body ? p->body_len : 0;
    r->recovered = p->recovered != 0;
  }
  if (oom) {
    idem_record_free(r);
    return idem__fail(IDEM_ENOMEM, "out of memory");
  }
  *out = r;
  return IDEM_OK;
}

/* ---- names ------------------------------------------------------------ */

const char *idem_outcome_name(int outcome) {
  static const char *const names[] = {"none",      "proceed",   "replay",
                                      "conflict",  "in_flight", "recover",
                                      "unknown"};
  if (outcome < 1 || outcome > 6)
    return "invalid";
  return names[outcome];
}

const char *idem_state_name(int state) {
  switch (state) {
  case IDEM_STATE_IN_PROGRESS:
    return "in_progress";
  case IDEM_STATE_COMPLETED:
    return "completed";
  case IDEM_STATE_UNKNOWN:
    return "unknown";
  }
  return "invalid";
}

/* ---- argument checks ------------------------------------------------ */

int idem_key_check(const char *key) {
  size_t n;
  idem__clear_error();
  if (!key)
    return idem__fail(IDEM_EKEY, "key: missing");
  n = strlen(key);
  if (n == 0)
    return idem__fail(IDEM_EKEY, "key: empty; keys are 1-255 bytes");
  if (n > MAX_ID_PART)
    return idem__fail(IDEM_EKEY, "key: %zu bytes; keys are 1-255 bytes", n);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)key[i];
    if (c < 0x21 || c > 0x7e)
      return idem__fail(IDEM_EKEY,
                        "key: byte %zu is 0x%02x; keys are printable ASCII "
                        "(0x21-0x7e), without spaces",
                        i, c);
  }
  return IDEM_OK;
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
  if (p[0] < 0x80)
    return 1;
  if (p[0] >= 0xc2 && p[0] <= 0xdf)
    return n >= 2 && (p[1] & 0xc0) == 0x80 ? 2 : 0;
  if (p[0] >= 0xe0 && p[0] <= 0xef) {
    if (n < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
      return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f))
      return 0; /* overlong, or a surrogate */
    return 3;
  }
  if (p[0] >= 0xf0 && p[0] <= 0xf4) {
    if (n < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 ||
        (p[3] & 0xc0) != 0x80)
      return 0;
    if ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
      return 0;
    return 4;
  }
  return 0;
}

/* The code point of a valid UTF-8 sequence of k bytes. */
static unsigned decode_utf8(const unsigned char *p, size_t k) {
  if (k == 2)
    return (unsigned)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
  if (k == 3)
    return (unsigned)(p[0] & 0x0f) << 12 | (unsigned)(p[1] & 0x3f) << 6 |
           (p[2] & 0x3f);
  return (unsigned)(p[0] & 0x07) << 18 | (unsigned)(p[1] & 0x3f) << 12 |
         (unsigned)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
}

/* C1 controls and the marks that reorder text: in a tenant or an
 * operation they would let one name pass for another in a listing. */
static int spoofing_char(unsigned cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c || cp == 0x200e ||
         cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

/* Checks a tenant or an operation. new_record: it names a record that may
 * be created, which must not disguise itself; an existing record (written
 * by an older idem, say) can still be named to read, resolve or delete. */
static int check_text(const char *what, const char *s, int may_be_empty,
                      int new_record) {
  size_t n;
  if (!s)
    return idem__fail(IDEM_EINVAL, "%s: missing", what);
  n = strlen(s);
  if (n == 0 && !may_be_empty)
    return idem__fail(IDEM_EINVAL, "%s: empty", what);
  if (n > MAX_ID_PART)
    return idem__fail(IDEM_EINVAL, "%s: %zu bytes; at most 255", what, n);
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (k == 0)
      return idem__fail(IDEM_EINVAL, "%s: invalid UTF-8 at byte %zu", what,
                        i);
    if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
      return idem__fail(IDEM_EINVAL, "%s: control byte 0x%02x at %zu", what,
                        (unsigned char)s[i], i);
    if (new_record && k > 1 && spoofing_char(decode_utf8((const unsigned char *)s + i, k)))
      return idem__fail(IDEM_EINVAL,
                        "%s: U+%04X at byte %zu is a control or a "
                        "direction mark that would disguise it in listings",
                        what, decode_utf8((const unsigned char *)s + i, k), i);
    i += k;
  }
  return IDEM_OK;
}

static int check_id(const idem_id *id, int new_record) {
  int rc;
  if (!id)
    return idem__fail(IDEM_EINVAL, "id: NULL");
  if ((rc = check_text("tenant", id->tenant ? id->tenant : "", 1,
                       new_record)) ||
      (rc = check_text("operation", id->operation, 0, new_record)) ||
      (rc = idem_key_check(id->key)))
    return rc;
  return IDEM_OK;
}

static int check_fingerprint(const char *fp) {
  if (!fp || strlen(fp) != 64)
    return idem__fail(IDEM_EINVAL,
                      "fingerprint: expected 64 lowercase hex digits");
  for (int i = 0; i < 64; i++)
    if (!((fp[i] >= '0' && fp[i] <= '9') || (fp[i] >= 'a' && fp[i] <= 'f')))
      return idem__fail(IDEM_EINVAL,
                        "fingerprint: expected 64 lowercase hex digits");
  return IDEM_OK;
}

static int check_response(const idem_response *r) {
  char why[128];
  int rc;
  if (!r)
    return idem__fail(IDEM_EINVAL, "response: NULL");
  if ((rc = idem__plain_response_problem(r, "response", why, sizeof why)))
    return idem__fail(rc, "%s", why);
  return IDEM_OK;
}

/* Checks one period against its bound. */
static int check_period(const char *what, int64_t ms, int64_t max,
                        const char *max_text) {
  if (ms < 0)
    return idem__fail(IDEM_EINVAL, "options: %s is negative (%lld ms)", what,
                      (long long)ms);
  if (ms > max)
    return idem__fail(IDEM_EINVAL,
                      "options: %s of %lld ms is past the bound of %s",
                      what, (long long)ms, max_text);
  return IDEM_OK;
}

static int fill_options(const idem_call_options *in, idem_call_options *out) {
  int rc;
  memset(out, 0, sizeof *out);
  if (in)
    *out = *in;
  if ((rc = check_period("lease_ms", out->lease_ms, IDEM_MAX_LEASE_MS,
                         "IDEM_MAX_LEASE_MS (30 days; renew a longer "
                         "lease)")) ||
      (rc = check_period("retention_ms", out->retention_ms,
                         IDEM_MAX_RETENTION_MS,
                         "IDEM_MAX_RETENTION_MS (100 years)")))
    return rc;
  if (out->on_expired_lease != IDEM_EXPIRED_TAKE_OVER &&
      out->on_expired_lease != IDEM_EXPIRED_REPORT)
    return idem__fail(IDEM_EINVAL, "options: on_expired_lease is %d; use "
                                   "IDEM_EXPIRED_TAKE_OVER or "
                                   "IDEM_EXPIRED_REPORT",
                      out->on_expired_lease);
  if ((rc = check_period("wait_ms", out->wait_ms, IDEM_MAX_LEASE_MS,
                         "IDEM_MAX_LEASE_MS (30 days)")))
    return rc;
  if (out->max_attempts < 0)
    return idem__fail(IDEM_EINVAL, "options: max_attempts is negative");
  if (out->lease_ms == 0)
    out->lease_ms = IDEM__DEFAULT_LEASE_MS;
  if (out->retention_ms == 0)
    out->retention_ms = IDEM__DEFAULT_RETENTION_MS;
  /* The canonical request is kept for operators only; an oversized one is
   * not stored rather than failing the call. */
  if (out->request_len > 65536 || !out->request) {
    out->request = NULL;
    out->request_len = 0;
  }
  return IDEM_OK;
}

/* ---- stores ----------------------------------------------------------- */

/* Set while idem_store_close() closes a handle in a child of fork(). */
static _Thread_local int closing_forked;

int idem__closing_forked(void) { return closing_forked; }

/* How many fork()s made this process, counted in the child by a handler
 * that the first idem_store_open() installs: a store opened before one of
 * them is another process's. A load, where getpid() would be a system call
 * on every claim. __atomic. */
static unsigned forks;
static pthread_once_t forks_once = PTHREAD_ONCE_INIT;

static void forked_child(void) {
  __atomic_add_fetch(&forks, 1, __ATOMIC_RELAXED);
}

static void count_forks(void) { pthread_atfork(NULL, NULL, forked_child); }

int idem__store_forked(const idem_store *store) {
  return store->forks != __atomic_load_n(&forks, __ATOMIC_RELAXED);
}

int idem__store_owned(const idem_store *store, const char *who) {
  pid_t self;
  if (!idem__store_forked(store))
    return IDEM_OK;
  self = getpid();
  return idem__fail(IDEM_EFORK,
                    "%s: the store was opened by process %ld; after fork() "
                    "a child must open its own store (this is process %ld)",
                    who, (long)store->pid, (long)self);
}

/* The length of a URL scheme at the start of url ("sqlite" in
 * "sqlite:x"), or 0 when url does not start with one followed by ':'. */
static size_t scheme_len(const char *url) {
  size_t n = 0;
  if (!((url[0] >= 'a' && url[0] <= 'z') || (url[0] >= 'A' && url[0] <= 'Z')))
    return 0;
  while ((url[n] >= 'a' && url[n] <= 'z') || (url[n] >= 'A' && url[n] <= 'Z') ||
         (url[n] >= '0' && url[n] <= '9') || url[n] == '+' || url[n] == '-' ||
         url[n] == '.')
    n++;
  return url[n] == ':' ? n : 0;
}

/* Whether text starts like a libpq conninfo ("host=db dbname=app"). */
static int looks_like_conninfo(const char *text) {
  const char *p = text;
  while (*p == ' ' || *p == '\t')
    p++;
  const char *word = p;
  while ((*p >= 'a' && *p <= 'z') || *p == '_')
    p++;
  if (p == word)
    return 0;
  while (*p == ' ' || *p == '\t')
    p++;
  return *p == '=';
}

static int same_word(const char *a, size_t n, const char *word) {
  return strlen(word) == n && strncasecmp(a, word, n) == 0;
}

/*
 * Picks the backend of a store URL and the target it opens: sqlite:PATH or
 * a bare path (SQLite), postgresql:// or postgres:// (the whole URL) and
 * pg:CONNINFO (PostgreSQL). Schemes are case-insensitive. What looks like a
 * conninfo without pg:, and an unknown scheme, are refused rather than
 * taken for a file name: a store created by mistake beside the intended one
 * silently ends deduplication between the machines that share it. Messages
 * name the scheme only, never the URL, which may hold a password. *owned
 * is set when the target had to be rewritten; the caller frees it.
 */
static int pick_backend(const char *url, const idem__store_methods **m,
                        const char **target, char **owned) {
  size_t n = scheme_len(url);
  *m = NULL;
  *target = NULL;
  *owned = NULL;
  if (n == 0) {
    const char *p = url + strspn(url, " \t");
    if (looks_like_conninfo(url))
      return idem__fail(IDEM_EURL,
                        "store: this looks like a libpq conninfo; write "
                        "pg:%s or a postgresql:// URL (as a file name, "
                        "write ./ before it)",
                        "host=... dbname=...");
    /* A URL behind blanks, or "://" inside a path, is a URL gone wrong, not
     * a file name: as a path it would reach messages, password and all. */
    if ((p != url && scheme_len(p) > 0) || strstr(url, "://"))
      return idem__fail(IDEM_EURL,
                        "store: this looks like a URL %s; write it without "
                        "anything before it (as a file name, write sqlite: "
                        "before it)",
                        p != url ? "with blanks before it" : "inside a path");
    *m = &idem__sqlite_methods;
    *target = url;
  } else if (same_word(url, n, "sqlite")) {
    *m = &idem__sqlite_methods;
    *target = url + n + 1;
    /* Accept sqlite:///abs/path as well as sqlite:/abs/path. */
    if (strncmp(*target, "//", 2) == 0)
      *target += 2;
  } else if (same_word(url, n, "postgresql") || same_word(url, n, "postgres") ||
             same_word(url, n, "pg")) {
#ifdef IDEM_HAVE_PG
    *m = &idem__pg_methods;
    if (same_word(url, n, "pg")) {
      /* Any libpq conninfo: "pg:host=/run/postgresql dbname=idem". */
      *target = url + n + 1;
    } else {
      /* libpq knows its schemes in lower case only. */
      if (!(*owned = idem__strdup(url)))
        return idem__fail(IDEM_ENOMEM, "store: out of memory");
      for (size_t i = 0; i < n; i++)
        (*owned)[i] = (char)tolower((unsigned char)(*owned)[i]);
      *target = *owned;
    }
#else
    /* Built with -DIDEM_WITH_POSTGRESQL=OFF: no libpq, no PostgreSQL
     * store. The URL is refused as one this library cannot open. */
    return idem__fail(IDEM_EURL, "store: this libidem was built without "
                                 "PostgreSQL support");
#endif
  } else {
    return idem__fail(IDEM_EURL,
                      "store: unknown scheme '%.*s:'; use sqlite:PATH, a "
                      "path, postgresql://... or pg:CONNINFO (for a file "
                      "whose name has a colon, write ./ before it)",
                      (int)(n > 32 ? 32 : n), url);
  }
  if (!**target)
    return idem__fail(IDEM_EURL, "store: empty path or conninfo");
  return IDEM_OK;
}

int idem_store_open(const char *url, const idem_store_options *opts,
                    idem_store **out) {
  const idem__store_methods *m = NULL;
  const char *target = NULL;
  char *owned = NULL;
  idem_store *s = NULL;
  idem_store_options o;
  int rc;

  idem__clear_error();
  if (!out)
    return idem__fail(IDEM_EINVAL, "store: NULL output");
  *out = NULL;
  memset(&o, 0, sizeof o);
  if (opts)
    o = *opts;
  if (!url || !*url)
    url = getenv("IDEM_STORE");
  if (!url || !*url)
    return idem__fail(IDEM_EINVAL,
                      "store: no store named: pass a URL (\"sqlite:PATH\" "
                      "or \"postgresql://...\") or set IDEM_STORE");
  if ((rc = pick_backend(url, &m, &target, &owned)) != IDEM_OK) {
    free(owned);
    return rc;
  }
  s = calloc(1, sizeof *s);
  if (!s) {
    free(owned);
    return idem__fail(IDEM_ENOMEM, "store: out of memory");
  }
  s->methods = m;
  pthread_once(&forks_once, count_forks);
  s->pid = getpid();
  s->forks = __atomic_load_n(&forks, __ATOMIC_RELAXED);
  pthread_mutex_init(&s->sched_mu, NULL);
  rc = m->open(target, &o, &s->state);
  free(owned);
  if (rc != IDEM_OK) {
    pthread_mutex_destroy(&s->sched_mu);
    free(s);
    return rc;
  }
  *out = s;
  return IDEM_OK;
}

void idem_store_close(idem_store *store) {
  if (!store)
    return;
  if (idem__store_forked(store)) {
    /* A child of fork() lets go of its parent's handle: memory only. The
     * runners' and the scheduler's threads are not in the child, and a
     * mutex or a condition that one of them held or waited on at the fork
     * would block the child for ever: they are left as they are, with the
     * little memory they hold. */
    closing_forked = 1;
    store->methods->close(store->state);
    closing_forked = 0;
    idem__seal_free(store->seal);
    free(store);
    return;
  }
  /* The runners first (their calls end leases; a waiter's may hand the
   * other runner a task), then the scheduler: all use the backend. */
  idem__runner_free(store->wait_runner);
  idem__runner_free(store->runner);
  idem__sched_free(store->sched);
  store->methods->close(store->state);
  pthread_mutex_destroy(&store->sched_mu);
  idem__seal_free(store->seal);
  free(store);
}

const char *idem_store_backend(const idem_store *store) {
  return store ? store->methods->name : "";
}

const char *idem_store_engine_version(const idem_store *store) {
  return store ? store->methods->engine_version(store->state) : "";
}

int idem_store_check(idem_store *store) {
  idem_record *rec = NULL;
  idem_id probe = {"", "idem store check", "probe"};
  int rc;
  idem__clear_error();
  if (!store)
    return idem__fail(IDEM_EINVAL, "store: NULL store");
  if ((rc = idem__store_owned(store, "store_check")) != IDEM_OK)
    return rc;
  if (store->methods->version >= 4 && store->methods->check)
    return store->methods->check(store->state);
  /* A backend without the method: a read that finds nothing is the most
   * that can be said without writing. */
  rc = store->methods->get(store->state, &probe, &rec);
  idem_record_free(rec);
  if (rc == IDEM_ENOTFOUND) {
    idem__clear_error();
    return IDEM_OK;
  }
  return rc;
}

/* ---- claims ----------------------------------------------------------- */

void idem_call_free(idem_call *claim) {
  if (!claim)
    return;
  free(claim->tenant);
  free(claim->operation);
  free(claim->key);
  free(claim->resp_buf);
  free(claim->seal_buf);
  free(claim);
}

idem_outcome idem_call_outcome(const idem_call *c) {
  return c ? c->outcome : (idem_outcome)0;
}

const idem_response *idem_call_response(const idem_call *c) {
  return c && c->has_response ? &c->response : NULL;
}

int idem_call_state(const idem_call *c) {
  if (!c)
    return 0;
  switch (c->outcome) {
  case IDEM_REPLAY:
    return IDEM_STATE_COMPLETED;
  case IDEM_IN_FLIGHT:
    return IDEM_STATE_IN_PROGRESS;
  case IDEM_UNKNOWN:
    return IDEM_STATE_UNKNOWN;
  case IDEM_PROCEED:
  case IDEM_RECOVER:
    /* What the holder's ending left (idem_execute_local()'s claim is its
     * own ending): a response kept in the call is no proof, since
     * idem_execute() keeps its action's response also when the ending
     * failed. */
    return c->held ? IDEM_STATE_IN_PROGRESS : c->ended_state;
  default:
    return 0;
  }
}

int64_t idem_call_retry_after_ms(const idem_call *c) {
  return c ? c->retry_after_ms : 0;
}

int idem_call_attempt(const idem_call *c) { return c ? c->attempt : 0; }

int idem_call_recovered(const idem_call *c) { return c ? c->recovered : 0; }

int64_t idem_call_lease_expires_ms(const idem_call *c) {
  int64_t at;
  if (!c || !c->held)
    return 0;
  at = __atomic_load_n(&c->lease_expires_ms, __ATOMIC_RELAXED);
  /* Leases on the boot-time clock are told in Unix ms, as documented. */
  return c->lease_on_boot ? idem__lease_to_wall(at) : at;
}

static idem_call *new_claim(const idem_id *id, const char *fp,
                             int64_t retention_ms) {
  idem_call *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->tenant = idem__strdup(id->tenant ? id->tenant : "");
  c->operation = idem__strdup(id->operation);
  c->key = idem__strdup(id->key);
  if (!c->tenant || !c->operation || !c->key) {
    idem_call_free(c);
    return NULL;
  }
  memcpy(c->fingerprint, fp, IDEM_FINGERPRINT_SIZE);
  c->retention_ms = retention_ms;
  return c;
}

/* Runs op on the backend (on the caller's connection when op->conn is set:
 * idem_execute_in()) and carries its detail into this thread. */
static int run_op(idem_store *store, idem__op *op) {
  idem__clear_error();
  op->rc = IDEM_OK;
  op->errmsg[0] = '\0';
  (op->conn ? store->methods->run_in : store->methods->run)(store->state, op);
  if (op->rc != IDEM_OK)
    return idem__fail(op->rc, "%s",
                      op->errmsg[0] ? op->errmsg : idem_strerror(op->rc));
  return IDEM_OK;
}

/* How often a waiter asks again when nothing will tell it of an ending:
 * soon at first, then every POLL_MAX_MS. */
#define POLL_FIRST_MS 2
#define POLL_MAX_MS 50

/*
 * op's claim found its key in flight: waits up to op.opts.wait_ms for the
 * holder to end the record, asking again whenever it may have: woken by an
 * ending in this process or one the backend reports, by polling when the
 * backend reports none, and when the holder's lease ends. op->claim is
 * the last answer.
 */
static int wait_in_flight(idem_store *store, idem__op *op) {
  int64_t until = idem__mono_ms() + op->opts.wait_ms, poll = POLL_FIRST_MS;
  idem__waiter w;
  int told, rc = IDEM_OK;
  idem__wait_enter(op->id, &w);
  for (;;) {
    /* Asked again after the mark: an ending from now on moves it. The
     * backend is asked to tell of the ending each time round: a takeover
     * woke us, or its listener lost its connection meanwhile. */
    idem__wait_mark(&w);
    told = store->methods->version >= 3 && store->methods->watch &&
           store->methods->watch(store->state, op->id) == IDEM_OK;
    idem_call *fresh = new_claim(op->id, op->fingerprint, op->opts.retention_ms);
    if (!fresh) {
      rc = idem__fail(IDEM_ENOMEM, "claim: out of memory");
      break;
    }
    idem_call_free(op->claim);
    op->claim = fresh;
    if ((rc = run_op(store, op)) != IDEM_OK ||
        op->claim->outcome != IDEM_IN_FLIGHT)
      break;
    int64_t now = idem__mono_ms(), wake = until;
    if (now >= until)
      break;
    /* The holder's lease ends: a claim then sees it expired. */
    if (now + op->claim->retry_after_ms < wake)
      wake = now + op->claim->retry_after_ms;
    if (!told && now + poll < wake)
      wake = now + poll;
    if (!idem__wait_sleep(&w, wake) && !told)
      poll = poll * 2 > POLL_MAX_MS ? POLL_MAX_MS : poll * 2;
  }
  idem__wait_leave(&w);
  return rc;
}

int idem__claim_prepare(idem_store *store, idem__op_kind kind,
                        const idem_id *id, const char *fp,
                        const idem_call_options *opts, idem_local_fn fn,
                        void *ctx, idem__op *op) {
  int rc;
  memset(op, 0, sizeof *op);
  if (!store)
    return idem__fail(IDEM_EINVAL, "claim: NULL store");
  if ((rc = idem__store_owned(store, kind == IDEM__OP_LOCAL ? "execute_local"
                                                            : "claim")))
    return rc;
  if ((rc = check_id(id, 1)) || (rc = check_fingerprint(fp)))
    return rc;
  if ((rc = fill_options(opts, &op->opts)))
    return rc;
  op->kind = kind;
  op->id = id;
  op->fingerprint = fp;
  op->fn = fn;
  op->ctx = ctx;
  op->claim = new_claim(id, fp, op->opts.retention_ms);
  if (!op->claim)
    return idem__fail(IDEM_ENOMEM, "claim: out of memory");
  /* The request kept for operators is sealed as the response will be: it
   * often holds what the response does. */
  if (store->seal && op->opts.request) {
    size_t n = 0;
    if ((rc = idem__seal_request(store->seal, id, op->opts.request,
                                 op->opts.request_len, &op->seal_buf, &n))) {
      idem_call_free(op->claim);
      op->claim = NULL;
      return rc;
    }
    op->opts.request = op->seal_buf;
    op->opts.request_len = n;
  }
  return IDEM_OK;
}

void idem__op_seal_free(idem__op *op) {
  free(op->seal_buf);
  op->seal_buf = NULL;
}

int idem__claim_open(idem_store *store, idem_call *cl) {
  idem_response plain;
  void *buf = NULL;
  int rc;
  /* A replay, or a local action's own response; a response in clear (no
   * marker) is handed on as it is, whatever keys the handle has. */
  if (!cl->has_response ||
      !idem__seal_marked(cl->response.meta, cl->response.meta_len, NULL))
    return IDEM_OK;
  if ((rc = idem__seal_open(store->seal, cl->tenant, cl->operation, cl->key,
                            cl->response.status, cl->response.meta,
                            cl->response.meta_len, cl->response.body,
                            cl->response.body_len, &plain, &buf)))
    return rc;
  /* The opened buffer is laid out as idem__claim_set_response() lays its
   * own: it becomes the claim's. */
  free(cl->resp_buf);
  cl->resp_buf = buf;
  cl->response = plain;
  return IDEM_OK;
}

/* idem_execute_local()'s action when the handle seals: the caller's fn,
 * whose response is sealed before the backend stores it, inside the
 * backend's transaction. */
typedef struct seal_local {
  idem_store *store;
  const idem_id *id;
  idem_local_fn fn;
  void *ctx;
  void *buf; /* the sealed response of the last run */
  int rc;    /* why the last run's response was not sealed */
  char why[512];
} seal_local;

static int seal_local_fn(void *conn, void *ctx, idem_response *response) {
  seal_local *w = ctx;
  idem_response plain;
  int fn_rc, bad;
  /* The backend may run fn again (a PostgreSQL insert raced): each run
   * seals its own response. */
  free(w->buf);
  w->buf = NULL;
  w->rc = IDEM_OK;
  memset(&plain, 0, sizeof plain);
  fn_rc = w->fn(conn, w->ctx, &plain);
  *response = plain;
  if (fn_rc != 0)
    return fn_rc;
  /* A response that cannot be kept is handed on in clear, for the
   * backend to refuse as it would without sealing; except one whose meta
   * looks sealed, which the backend would take for a sealed one. */
  if ((bad = idem__plain_response_problem(&plain, "action's response", w->why,
                                          sizeof w->why))) {
    if (!idem__seal_marker_prefix(plain.meta, plain.meta_len))
      return 0;
    w->rc = bad;
    memset(response, 0, sizeof *response);
    return -1;
  }
  if ((w->rc =
           idem__seal_response(w->store->seal, w->id->tenant, w->id->operation,
                               w->id->key, &plain, response, &w->buf))) {
    /* The wrapper runs on the thread that runs fn: the detail is its. */
    snprintf(w->why, sizeof w->why, "%s", idem_errmsg());
    memset(response, 0, sizeof *response);
    return -1;
  }
  return 0;
}

int idem__claim_run(idem_store *store, idem__op *op) {
  int rc = run_op(store, op);
  if (rc == IDEM_OK && op->claim->outcome == IDEM_IN_FLIGHT && op->opts.wait_ms)
    rc = wait_in_flight(store, op);
  return rc;
}

/* conn: idem_execute_in()'s, NULL for the store's own connections. */
static int start(idem_store *store, idem__op_kind kind, const idem_id *id,
                 const char *fp, const idem_call_options *opts,
                 idem_local_fn fn, void *ctx, void *conn, idem_call **out) {
  idem__op op;
  int rc;
  idem__clear_error();
  if (!out)
    return idem__fail(IDEM_EINVAL, "claim: NULL output");
  *out = NULL;
  seal_local w;
  memset(&w, 0, sizeof w);
  if (kind == IDEM__OP_LOCAL && store && store->seal) {
    w.store = store;
    w.id = id;
    w.fn = fn;
    w.ctx = ctx;
    fn = seal_local_fn;
    ctx = &w;
  }
  if ((rc = idem__claim_prepare(store, kind, id, fp, opts, fn, ctx, &op)))
    return rc;
  op.conn = conn;
  rc = conn ? run_op(store, &op) : idem__claim_run(store, &op);
  idem__op_seal_free(&op);
  free(w.buf);
  /* The action's response could not be sealed: its run was rolled back as
   * a rejected one is, for the reason told here. */
  if (rc == IDEM_EREJECTED && w.rc != IDEM_OK)
    rc = idem__fail(w.rc, "%s", w.why);
  if (rc == IDEM_OK)
    rc = idem__claim_open(store, op.claim);
  if (rc != IDEM_OK) {
    idem_call_free(op.claim);
    return rc;
  }
  /* A local action that ran completed the record in the claim's own
   * transaction. */
  if (kind == IDEM__OP_LOCAL &&
      (op.claim->outcome == IDEM_PROCEED || op.claim->outcome == IDEM_RECOVER))
    op.claim->ended_state = IDEM_STATE_COMPLETED;
  *out = op.claim;
  return IDEM_OK;
}

int idem_claim(idem_store *store, const idem_id *id, const char *fingerprint,
               const idem_call_options *opts, idem_call **out) {
  return start(store, IDEM__OP_CLAIM, id, fingerprint, opts, NULL, NULL, NULL,
               out);
}

int idem_claim_cached(idem_store *store, const idem_id *id,
                      const char *fingerprint, idem_call **out) {
  const idem__store_methods *m;
  idem__op op;
  int rc;
  idem__clear_error();
  if (!out)
    return idem__fail(IDEM_EINVAL, "claim_cached: NULL output");
  *out = NULL;
  if ((rc = idem__claim_prepare(store, IDEM__OP_CLAIM, id, fingerprint, NULL,
                                NULL, NULL, &op)))
    return rc;
  m = store->methods;
  if (!(m->version >= 6 && m->cached && m->cached(store->state, &op))) {
    idem_call_free(op.claim);
    return idem__fail(IDEM_ENOTFOUND,
                      "no completed record of (%s, %s, %s) kept in memory",
                      id->tenant ? id->tenant : "", id->operation, id->key);
  }
  if ((rc = idem__claim_open(store, op.claim)) != IDEM_OK) {
    idem_call_free(op.claim);
    return rc;
  }
  *out = op.claim;
  return IDEM_OK;
}

int idem_execute_local(idem_store *store, const idem_id *id,
                       const char *fingerprint, const idem_call_options *opts,
                       idem_local_fn fn, void *ctx, idem_call **out) {
  if (!fn) {
    if (out)
      *out = NULL;
    return idem__fail(IDEM_EINVAL, "execute_local: NULL function");
  }
  return start(store, IDEM__OP_LOCAL, id, fingerprint, opts, fn, ctx, NULL,
               out);
}

int idem_execute_in(idem_store *store, void *conn, const idem_id *id,
                    const char *fingerprint, const idem_call_options *opts,
                    idem_local_fn fn, void *ctx, idem_call **out) {
  const idem__store_methods *m = store ? store->methods : NULL;
  if (out)
    *out = NULL;
  if (!fn)
    return idem__fail(IDEM_EINVAL, "execute_in: NULL function");
  if (!conn)
    return idem__fail(IDEM_EINVAL, "execute_in: NULL connection");
  if (m && !(m->version >= 8 && m->run_in))
    return idem__fail(IDEM_EINVAL,
                      "execute_in: the %s store cannot join a caller's "
                      "transaction",
                      m->name);
  return start(store, IDEM__OP_LOCAL, id, fingerprint, opts, fn, ctx, conn,
               out);
}

/*
 * A completion's response sealed (*response then points at the claim's
 * sealed form). The claim keeps the sealed bytes of the last response it
 * sealed: a completion sent again with the same response, after an
 * answer lost with the connection, writes the same bytes, by which a
 * store tells that its first send committed.
 */
static int seal_completion(idem_store *store, idem_call *claim,
                           const idem_response **response) {
  const idem_response *r = *response;
  char of[sizeof claim->seal_of];
  void *buf = NULL;
  idem_response sealed;
  int rc;
  if ((rc = idem__response_checksum(claim->fingerprint, r->status, r->meta,
                                    r->meta_len, r->body, r->body_len, of)))
    return rc;
  memcpy(of + IDEM_FINGERPRINT_SIZE - 1, store->seal->ids[0], 16);
  of[sizeof of - 1] = '\0';
  if (!claim->seal_buf || strcmp(of, claim->seal_of) != 0) {
    if ((rc = idem__seal_response(store->seal, claim->tenant, claim->operation,
                                  claim->key, r, &sealed, &buf)))
      return rc;
    free(claim->seal_buf);
    claim->seal_buf = buf;
    claim->sealed = sealed;
    memcpy(claim->seal_of, of, sizeof of);
  }
  *response = &claim->sealed;
  return IDEM_OK;
}

int idem__finish_prepare(idem_store *store, idem_call *claim,
                         idem__op_kind kind, const idem_response *response,
                         int64_t lease_ms, idem__op *op, idem_id *id,
                         idem__finish *f) {
  int rc;
  memset(op, 0, sizeof *op);
  if (!store || !claim)
    return idem__fail(IDEM_EINVAL, "NULL store or claim");
  if ((rc = idem__store_owned(store, kind == IDEM__OP_COMPLETE  ? "complete"
                                     : kind == IDEM__OP_RELEASE ? "release"
                                     : kind == IDEM__OP_MARK_UNKNOWN
                                         ? "mark_unknown"
                                         : "renew")))
    return rc;
  f->deadline = claim->lease_expires_ms;
  f->ends = 0;
  if (!claim->held)
    return idem__fail(IDEM_ESTATE,
                      "claim of key '%s' is not held (outcome %s, or "
                      "already completed, released or marked unknown)",
                      claim->key, idem_outcome_name(claim->outcome));
  if (kind == IDEM__OP_COMPLETE && (rc = check_response(response)))
    return rc;
  if (kind == IDEM__OP_COMPLETE && store->seal &&
      (rc = seal_completion(store, claim, &response)))
    return rc;
  if (kind == IDEM__OP_RENEW &&
      (rc = check_period("renew: lease_ms", lease_ms, IDEM_MAX_LEASE_MS,
                         "IDEM_MAX_LEASE_MS (30 days)")))
    return rc;
  if (kind == IDEM__OP_RENEW && lease_ms == 0)
    return idem__fail(IDEM_EINVAL, "renew: lease must be positive");
  /*
   * A holder that took the key over knows only that its own attempt did
   * not act: an earlier one may have. Its release leaves the record as the
   * takeover found it, so that the next caller is told so too: marked
   * unknown again, or in progress with its lease ended (the next claim is
   * RECOVER, or UNKNOWN with IDEM_EXPIRED_REPORT). Deleting it would let
   * the next caller PROCEED, unwarned, and act a second time.
   */
  if (kind == IDEM__OP_RELEASE && claim->outcome == IDEM_RECOVER) {
    kind = claim->took_over_unknown ? IDEM__OP_MARK_UNKNOWN : IDEM__OP_RENEW;
    lease_ms = 0;
    f->ends = 1;
  }
  id->tenant = claim->tenant;
  id->operation = claim->operation;
  id->key = claim->key;
  op->kind = kind;
  op->id = id;
  op->fingerprint = claim->fingerprint;
  op->claim = claim;
  op->response = response;
  op->lease_ms = lease_ms;
  op->opts.retention_ms = claim->retention_ms;
  return IDEM_OK;
}

void idem__finish_after(idem__op *op, int rc, const idem__finish *f) {
  idem_call *claim = op->claim;
  /* A backend writes the new deadline into the claim with the renewal's
   * statement; when the transaction then fails, the lease is still the one
   * stored before, and the holder must not count on a longer one. */
  if (rc != IDEM_OK && op->kind == IDEM__OP_RENEW)
    claim->lease_expires_ms = f->deadline;
  if (rc == IDEM_OK && (op->kind != IDEM__OP_RENEW || f->ends)) {
    claim->held = 0;
    claim->lease_expires_ms = 0;
    /* A takeover's release leaves the record as the takeover found it. */
    claim->ended_state = op->kind == IDEM__OP_COMPLETE ? IDEM_STATE_COMPLETED
                         : op->kind == IDEM__OP_MARK_UNKNOWN
                             ? IDEM_STATE_UNKNOWN
                         : f->ends ? IDEM_STATE_IN_PROGRESS
                                   : 0;
    idem__wait_wake(op->id);
  }
  if (rc == IDEM_ESTALE)
    claim->held = 0;
}

static int finish(idem_store *store, idem_call *claim, idem__op_kind kind,
                  const idem_response *response, int64_t lease_ms) {
  idem__op op;
  idem_id id;
  idem__finish f = {0};
  int rc;
  idem__clear_error();
  if ((rc = idem__finish_prepare(store, claim, kind, response, lease_ms, &op,
                                 &id, &f)))
    return rc;
  rc = run_op(store, &op);
  idem__finish_after(&op, rc, &f);
  return rc;
}

int idem_complete(idem_store *store, idem_call *claim,
                  const idem_response *response) {
  return finish(store, claim, IDEM__OP_COMPLETE, response, 0);
}

int idem_release(idem_store *store, idem_call *claim) {
  return finish(store, claim, IDEM__OP_RELEASE, NULL, 0);
}

int idem_mark_unknown(idem_store *store, idem_call *claim) {
  return finish(store, claim, IDEM__OP_MARK_UNKNOWN, NULL, 0);
}

int idem_renew(idem_store *store, idem_call *claim, int64_t lease_ms) {
  return finish(store, claim, IDEM__OP_RENEW, NULL, lease_ms);
}

/* ---- operators -------------------------------------------------------- */

void idem_record_free(idem_record *r) {
  if (!r)
    return;
  free(r->tenant);
  free(r->operation);
  free(r->key);
  free(r->fingerprint);
  free(r->request);
  free((void *)r->response.meta);
  free((void *)r->response.body);
  free(r);
}

/* n bytes and a NUL, for a record's parts. */
static void *dup_nul(const void *p, size_t n) {
  char *c = malloc(n + 1);
  if (c) {
    if (n)
      memcpy(c, p, n);
    c[n] = '\0';
  }
  return c;
}

/*
 * A record as a caller sees it: its sealed request and response opened
 * with the handle's keys, or, when they do not open, left out and the
 * record marked (idem_record.sealed). IDEM_OK, or IDEM_ENOMEM.
 */
static int record_open(idem_store *store, idem_record *r) {
  char kid[17];
  void *buf = NULL;
  size_t n = 0;
  int rc;
  if (r->request &&
      idem__seal_request_marked(r->request, r->request_len, kid)) {
    snprintf(r->seal_key_id, sizeof r->seal_key_id, "%s", kid);
    rc = idem__seal_open_request(store->seal, r->tenant, r->operation, r->key,
                                 r->request, r->request_len, &buf, &n);
    if (rc == IDEM_ENOMEM)
      return rc;
    free(r->request);
    r->request = buf; /* NULL when it does not open */
    r->request_len = n;
  }
  if (r->has_response &&
      idem__seal_marked(r->response.meta, r->response.meta_len, kid)) {
    idem_response plain;
    snprintf(r->seal_key_id, sizeof r->seal_key_id, "%s", kid);
    rc = idem__seal_open(store->seal, r->tenant, r->operation, r->key,
                         r->response.status, r->response.meta,
                         r->response.meta_len, r->response.body,
                         r->response.body_len, &plain, &buf);
    if (rc == IDEM_ENOMEM)
      return rc;
    free((void *)r->response.meta);
    free((void *)r->response.body);
    r->response.meta = NULL;
    r->response.meta_len = 0;
    r->response.body = NULL;
    r->response.body_len = 0;
    if (rc != IDEM_OK) {
      r->has_response = 0;
      r->sealed = rc == IDEM_ESEALED ? IDEM_SEALED_NO_KEY : IDEM_SEALED_BROKEN;
      return IDEM_OK;
    }
    /* Each part its own allocation, as idem_record_free() frees them. */
    r->response.meta = plain.meta ? dup_nul(plain.meta, plain.meta_len) : NULL;
    r->response.meta_len = plain.meta ? plain.meta_len : 0;
    r->response.body = dup_nul(plain.body, plain.body_len);
    r->response.body_len = plain.body_len;
    free(buf);
    if ((plain.meta && !r->response.meta) || !r->response.body)
      return IDEM_ENOMEM;
  }
  return IDEM_OK;
}

int idem_get(idem_store *store, const idem_id *id, idem_record **out) {
  int rc;
  idem__clear_error();
  if (!out)
    return idem__fail(IDEM_EINVAL, "get: NULL output");
  *out = NULL;
  if (!store)
    return idem__fail(IDEM_EINVAL, "get: NULL store");
  if ((rc = idem__store_owned(store, "get")) || (rc = check_id(id, 0)))
    return rc;
  if ((rc = store->methods->get(store->state, id, out)) != IDEM_OK)
    return rc;
  if (record_open(store, *out) != IDEM_OK) {
    idem_record_free(*out);
    *out = NULL;
    return idem__fail(IDEM_ENOMEM, "get: out of memory");
  }
  /* A response that did not open is told by the record, not as an
   * error. */
  idem__clear_error();
  return IDEM_OK;
}

/* idem_list()'s fn, given each record opened. */
typedef struct list_open {
  idem_store *store;
  idem_record_fn fn;
  void *ctx;
} list_open;

static int list_open_fn(const idem_record *record, void *ctx) {
  list_open *l = ctx;
  /* The record is the backend's, made by idem__record_new() and freed
   * after this call: it is opened in place. */
  if (record_open(l->store, (idem_record *)record) != IDEM_OK)
    return idem__fail(IDEM_ENOMEM, "list: out of memory");
  idem__clear_error();
  return l->fn(record, l->ctx);
}

int idem_list(idem_store *store, const idem_filter *filter, idem_record_fn fn,
              void *ctx) {
  idem_filter f;
  int rc;
  idem__clear_error();
  if (!store || !fn)
    return idem__fail(IDEM_EINVAL, "list: NULL store or function");
  if ((rc = idem__store_owned(store, "list")) != IDEM_OK)
    return rc;
  memset(&f, 0, sizeof f);
  if (filter)
    f = *filter;
  list_open l = {store, fn, ctx};
  rc = store->methods->list(store->state, &f, list_open_fn, &l);
  /* fn may have called into libidem and failed on this thread. */
  if (rc == IDEM_OK)
    idem__clear_error();
  return rc;
}

int idem_prune(idem_store *store, int64_t *removed) {
  int64_t n = 0;
  int rc;
  idem__clear_error();
  if (removed)
    *removed = 0;
  if (!store)
    return idem__fail(IDEM_EINVAL, "prune: NULL store");
  if ((rc = idem__store_owned(store, "prune")) != IDEM_OK)
    return rc;
  rc = store->methods->prune(store->state, &n);
  if (removed)
    *removed = n;
  return rc;
}

int idem_resolve_with(idem_store *store, const idem_id *id,
                      const idem_response *response,
                      const idem_resolve_options *opts) {
  idem_resolve_options o;
  int rc;
  idem__clear_error();
  if (!store)
    return idem__fail(IDEM_EINVAL, "resolve: NULL store");
  if ((rc = idem__store_owned(store, "resolve")) || (rc = check_id(id, 0)))
    return rc;
  if (response && (rc = check_response(response)))
    return rc;
  memset(&o, 0, sizeof o);
  if (opts)
    o = *opts;
  if ((rc = check_period("resolve: retention_ms", o.retention_ms,
                         IDEM_MAX_RETENTION_MS,
                         "IDEM_MAX_RETENTION_MS (100 years)")))
    return rc;
  if (o.retention_ms == 0)
    o.retention_ms = IDEM__DEFAULT_RETENTION_MS;
  idem_response sealed;
  void *buf = NULL;
  if (response && store->seal) {
    if ((rc = idem__seal_response(store->seal, id->tenant, id->operation,
                                  id->key, response, &sealed, &buf)))
      return rc;
    response = &sealed;
  }
  rc = store->methods->resolve(store->state, id, response, &o);
  free(buf);
  if (rc == IDEM_OK)
    idem__wait_wake(id);
  return rc;
}

int idem_resolve(idem_store *store, const idem_id *id,
                 const idem_response *response) {
  return idem_resolve_with(store, id, response, NULL);
}

int idem_delete(idem_store *store, const idem_id *id) {
  int rc;
  idem__clear_error();
  if (!store)
    return idem__fail(IDEM_EINVAL, "delete: NULL store");
  if ((rc = idem__store_owned(store, "delete")) || (rc = check_id(id, 0)))
    return rc;
  if (store->methods->version < 2 || !store->methods->remove)
    return idem__fail(IDEM_ESTATE, "delete: the %s store cannot delete",
                      store->methods->name);
  rc = store->methods->remove(store->state, id);
  if (rc == IDEM_OK)
    idem__wait_wake(id);
  return rc;
}
