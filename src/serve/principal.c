/*
 * principal.c -- the tenant of a keyed request by the --principal rule,
 * and the cache of replay checks (principal.h).
 */
#include "principal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int principal_parse(const char *spec, principal_rule *r, char *why,
                    size_t size) {
  const char *list;
  memset(r, 0, sizeof *r);
  if (!spec)
    spec = "credential:authorization";
  if (strcmp(spec, "none") == 0) {
    r->kind = PRINCIPAL_NONE;
    return 0;
  }
  if (strcmp(spec, "jwt") == 0) {
    r->kind = PRINCIPAL_JWT;
    return 0;
  }
  if (strncmp(spec, "credential:", 11) == 0) {
    r->kind = PRINCIPAL_CREDENTIAL;
    list = spec + 11;
  } else if (strncmp(spec, "header:", 7) == 0) {
    r->kind = PRINCIPAL_HEADER;
    list = spec + 7;
  } else {
    snprintf(why, size,
             "'%s' is not a rule: use credential:NAME[,NAME...] (cookie:NAME "
             "for one cookie), header:NAME, jwt or none",
             spec);
    return -1;
  }
  while (*list) {
    size_t len = strcspn(list, ","), at = 0;
    const char *name = list;
    if (r->n == PRINCIPAL_MAX_NAMES) {
      snprintf(why, size, "at most %d names", PRINCIPAL_MAX_NAMES);
      return -1;
    }
    if (r->kind == PRINCIPAL_CREDENTIAL && len > 7 &&
        strncasecmp(name, "cookie:", 7) == 0)
      at = 7;
    if (len == at || len >= sizeof r->names[0]) {
      snprintf(why, size, "'%.*s' is not a header name", (int)len, name);
      return -1;
    }
    for (size_t i = at; i < len; i++)
      if (name[i] <= 0x20 || name[i] >= 0x7f ||
          strchr("()<>@,;:\\\"/[]?={}", name[i])) {
        snprintf(why, size, "'%.*s' is not a header name", (int)len, name);
        return -1;
      }
    snprintf(r->names[r->n++], sizeof r->names[0], "%.*s", (int)len, name);
    list += len;
    if (*list == ',' && *++list == 0) {
      snprintf(why, size, "a name after the last ','");
      return -1;
    }
  }
  if (r->n == 0 || (r->kind == PRINCIPAL_HEADER && r->n != 1)) {
    snprintf(why, size, "%s",
             r->kind == PRINCIPAL_HEADER ? "header: names one header"
                                         : "credential: names its headers");
    return -1;
  }
  return 0;
}

int principal_jwt_start(principal_rule *r, const char *jwks, const char *issuer,
                        const char *audience, char *why, size_t size) {
  if (!jwks || !issuer || !audience) {
    snprintf(why, size,
             "--principal jwt needs --jwks FILE|URL, --issuer ISS and "
             "--audience AUD");
    return -1;
  }
  return jwt_verifier_new(jwks, issuer, audience, 0, &r->jwt, why, size) == 0
             ? 0
             : -1;
}

void principal_free(principal_rule *r) {
  if (r) {
    jwt_verifier_free(r->jwt);
    r->jwt = NULL;
  }
}

void principal_describe(const principal_rule *r, char *out, size_t size) {
  size_t o;
  switch (r->kind) {
  case PRINCIPAL_NONE:
    snprintf(out, size, "none");
    return;
  case PRINCIPAL_JWT:
    snprintf(out, size, "jwt");
    return;
  default:
    break;
  }
  o = (size_t)snprintf(
      out, size, "%s:", r->kind == PRINCIPAL_HEADER ? "header" : "credential");
  for (int i = 0; i < r->n && o < size; i++)
    o += (size_t)snprintf(out + o, size - o, "%s%s", i ? "," : "", r->names[i]);
}

int principal_challenge(const principal_rule *r, char *out, size_t size) {
  int bearer = r->kind == PRINCIPAL_JWT;
  for (int i = 0; r->kind == PRINCIPAL_CREDENTIAL && i < r->n; i++)
    bearer |= strcasecmp(r->names[i], "authorization") == 0;
  if (bearer)
    snprintf(out, size, "Bearer realm=\"idem\"%s",
             r->kind == PRINCIPAL_JWT ? ", error=\"invalid_token\"" : "");
  return bearer;
}

/* The value of header name in h, and how many times it was sent. */
static const char *header(const up_header *h, size_t n, const char *name,
                          int *count) {
  const char *v = NULL;
  *count = 0;
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(h[i].name, name) == 0) {
      if (!v)
        v = h[i].value;
      ++*count;
    }
  return v;
}

/*
 * The value of cookie name in the Cookie headers (RFC 6265: "a=1; b=2",
 * one header, or several that HTTP/2 split), copied to out; the number of
 * times it was sent (a client that sends it twice leaves the choice to
 * the upstream's parser, so such a request is refused), 0 when never.
 */
static int cookie(const up_header *h, size_t n, const char *name, char *out,
                  size_t size) {
  size_t nl = strlen(name);
  int count = 0;
  for (size_t i = 0; i < n; i++) {
    const char *p;
    if (strcasecmp(h[i].name, "Cookie") != 0)
      continue;
    for (p = h[i].value; *p;) {
      size_t len;
      p += strspn(p, " \t;");
      len = strcspn(p, ";");
      if (len > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
        size_t vl = len - nl - 1;
        while (vl && (p[nl + 1 + vl - 1] == ' ' || p[nl + 1 + vl - 1] == '\t'))
          vl--;
        if (!count++)
          snprintf(out, size, "%.*s", (int)vl, p + nl + 1);
      }
      p += len;
    }
  }
  return count;
}

/* Non-zero when v is 1..max bytes of printable ASCII (spaces inside). */
static int printable(const char *v, size_t max) {
  size_t n = strlen(v);
  if (n == 0 || n > max || v[0] == ' ' || v[n - 1] == ' ')
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] >= 0x7f)
      return 0;
  return 1;
}

static int credential_tenant(const principal_rule *r, const up_header *h,
                             size_t n, char *out, size_t size, char *why,
                             size_t why_size) {
  char hex[IDEM_FINGERPRINT_SIZE], val[4096];
  size_t cap = 256, len = 0;
  char *buf = malloc(cap);
  int sent = 0, rc = 0;
  if (!buf) {
    snprintf(why, why_size, "out of memory");
    return 503;
  }
  for (int i = 0; i < r->n && rc == 0; i++) {
    const char *name = r->names[i], *v = NULL;
    int count;
    size_t need;
    if (strncasecmp(name, "cookie:", 7) == 0) {
      count = cookie(h, n, name + 7, val, sizeof val);
      v = val;
    } else {
      v = header(h, n, name, &count);
    }
    if (count > 1) {
      snprintf(why, why_size,
               "%s is sent %d times: send it once, so that the request "
               "names one principal",
               name, count);
      rc = 400;
      break;
    }
    if (!count)
      continue;
    sent++;
    need = strlen(name) + strlen(v) + 2;
    if (len + need > cap) {
      char *b = realloc(buf, cap = 2 * (len + need));
      if (!b) {
        snprintf(why, why_size, "out of memory");
        rc = 503;
        break;
      }
      buf = b;
    }
    /* Names in lower case: the rule's spelling is not the principal's. */
    for (const char *p = name; *p; p++)
      buf[len++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    buf[len++] = '\n';
    memcpy(buf + len, v, strlen(v));
    len += strlen(v);
    buf[len++] = '\n';
  }
  if (rc == 0 && !sent) {
    char rule[600];
    principal_describe(r, rule, sizeof rule);
    snprintf(why, why_size,
             "the request carries no credential (the principal rule is %s): "
             "a keyed request must say whose it is",
             rule);
    rc = 401;
  }
  if (rc == 0 && r->n == 1 && strcasecmp(r->names[0], "authorization") == 0) {
    /* The tenants of credentials that idem has always made: a store kept
     * across an upgrade keeps answering its retries. */
    const char *v;
    int count;
    v = header(h, n, "Authorization", &count);
    idem_sha256_hex(v, strlen(v), hex);
    snprintf(out, size, "authorization:%s", hex);
  } else if (rc == 0) {
    idem_sha256_hex(buf, len, hex);
    snprintf(out, size, "credential:%s", hex);
  }
  free(buf);
  return rc;
}

static int jwt_tenant(const principal_rule *r, const up_header *h, size_t n,
                      char *out, size_t size, char *why, size_t why_size) {
  char iss[512], sub[512], hex[IDEM_FINGERPRINT_SIZE];
  int count;
  const char *v = header(h, n, "Authorization", &count);
  if (count > 1) {
    snprintf(why, why_size, "Authorization is sent %d times: send it once",
             count);
    return 400;
  }
  if (!v || strncasecmp(v, "Bearer ", 7) != 0) {
    snprintf(why, why_size,
             "the request carries no bearer token: a keyed request must "
             "say whose it is (Authorization: Bearer <JWT>)");
    return 401;
  }
  v += 7;
  v += strspn(v, " ");
  if (jwt_verify(r->jwt, v, iss, sizeof iss, sub, sizeof sub, why, why_size) !=
      0)
    return 401;
  /* The issuer is configured, so a short hash of it keeps subjects of
   * two issuers apart; the subject is readable when it is short and
   * printable, else hashed (a '#' where a readable one has ':'). */
  idem_sha256_hex(iss, strlen(iss), hex);
  if (printable(sub, 200)) {
    snprintf(out, size, "jwt:%.16s:%s", hex, sub);
  } else {
    char sh[IDEM_FINGERPRINT_SIZE];
    idem_sha256_hex(sub, strlen(sub), sh);
    snprintf(out, size, "jwt:%.16s#%s", hex, sh);
  }
  return 0;
}

int principal_tenant(const principal_rule *r, const up_header *h, size_t n,
                     const char *fallback, char *out, size_t size, char *why,
                     size_t why_size) {
  const char *v;
  int count;
  switch (r->kind) {
  case PRINCIPAL_NONE:
    snprintf(out, size, "%s", fallback ? fallback : "");
    return 0;
  case PRINCIPAL_JWT:
    return jwt_tenant(r, h, n, out, size, why, why_size);
  case PRINCIPAL_CREDENTIAL:
    return credential_tenant(r, h, n, out, size, why, why_size);
  case PRINCIPAL_HEADER:
    v = header(h, n, r->names[0], &count);
    if (count > 1) {
      /* A front proxy that adds its header to one the client forged must
       * not leave the principal to whichever is read first. */
      snprintf(why, why_size,
               "%s is sent %d times: the front proxy must set it once",
               r->names[0], count);
      return 400;
    }
    if (!v) {
      snprintf(why, why_size,
               "the request has no %s header: the front proxy that sets it "
               "must authenticate every keyed request",
               r->names[0]);
      return 401;
    }
    if (!printable(v, 200)) {
      snprintf(why, why_size,
               "%s must be 1-200 bytes of printable ASCII, without spaces "
               "at its ends",
               r->names[0]);
      return 400;
    }
    snprintf(out, size, "header:%s", v);
    return 0;
  }
  snprintf(why, why_size, "no principal rule");
  return 401;
}

/* ---- the replay check's cache
 * ------------------------------------------------ */

/* The headers that say who the caller is and in which session: the cache
 * is keyed by them, so that a token refreshed, revoked or replaced, or a
 * session ended, is checked again. */
static int identifies(const char *name) {
  return strcasecmp(name, "Authorization") == 0 ||
         strcasecmp(name, "Proxy-Authorization") == 0 ||
         strcasecmp(name, "Cookie") == 0 ||
         strcasecmp(name, "Mcp-Session-Id") == 0 ||
         strcasecmp(name, "X-API-Key") == 0;
}

void principal_check_id(const char *tenant, const up_header *h, size_t n,
                        char id[IDEM_FINGERPRINT_SIZE]) {
  /* SHA-256 over the tenant and every identifying header (and any header
   * a credential rule named, which the tenant already covers). */
  size_t len = strlen(tenant) + 1;
  char *buf, *p;
  for (size_t i = 0; i < n; i++)
    if (identifies(h[i].name))
      len += strlen(h[i].name) + strlen(h[i].value) + 2;
  if (!(buf = malloc(len))) {
    memset(id, 0, IDEM_FINGERPRINT_SIZE); /* never cached */
    return;
  }
  p = buf + sprintf(buf, "%s", tenant) + 1;
  for (size_t i = 0; i < n; i++)
    if (identifies(h[i].name)) {
      for (const char *c = h[i].name; *c; c++)
        *p++ = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
      *p++ = '\n';
      p += sprintf(p, "%s", h[i].value) + 1;
    }
  idem_sha256_hex(buf, len, id);
  free(buf);
}

#define CHECK_SLOTS 4096

typedef struct check_entry {
  char id[IDEM_FINGERPRINT_SIZE];
  int64_t until_ms;
} check_entry;

static check_entry checks[CHECK_SLOTS];
static pthread_mutex_t checks_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The slot of id: its hex's first bytes are uniform already. */
static size_t slot(const char id[IDEM_FINGERPRINT_SIZE]) {
  return (size_t)strtoul((char[9]){id[0], id[1], id[2], id[3], id[4], id[5],
                                   id[6], id[7], 0},
                         NULL, 16) %
         CHECK_SLOTS;
}

int principal_check_cached(const char id[IDEM_FINGERPRINT_SIZE]) {
  int hit;
  size_t s;
  if (!id[0])
    return 0;
  s = slot(id);
  pthread_mutex_lock(&checks_mu);
  hit = strcmp(checks[s].id, id) == 0 && checks[s].until_ms > mono_ms();
  pthread_mutex_unlock(&checks_mu);
  return hit;
}

void principal_check_passed(const char id[IDEM_FINGERPRINT_SIZE],
                            int64_t ttl_ms) {
  size_t s;
  if (!id[0] || ttl_ms <= 0)
    return;
  s = slot(id);
  /* One entry per slot: a newer caller takes the slot of an older one,
   * whose next replay is checked again (never answered unchecked). */
  pthread_mutex_lock(&checks_mu);
  memcpy(checks[s].id, id, IDEM_FINGERPRINT_SIZE);
  checks[s].until_ms = mono_ms() + ttl_ms;
  pthread_mutex_unlock(&checks_mu);
}

int principal_check_sends(const char *name) {
  static const char *const not_sent[] = {"Connection",
                                         "Keep-Alive",
                                         "TE",
                                         "Trailer",
                                         "Transfer-Encoding",
                                         "Upgrade",
                                         "Proxy-Connection",
                                         "Content-Length",
                                         "Content-Type",
                                         "Content-Encoding",
                                         "Accept",
                                         "Expect",
                                         "Host",
                                         "Idempotency-Key",
                                         "Last-Event-ID"};
  for (size_t i = 0; i < sizeof not_sent / sizeof not_sent[0]; i++)
    if (strcasecmp(name, not_sent[i]) == 0)
      return 0;
  return 1;
}
