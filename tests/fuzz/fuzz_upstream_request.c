/*
 * fuzz_upstream_request.c -- the requests that the loop's own HTTP/1.1
 * writes to an upstream (src/serve/upstream_h1.c): request line, Host,
 * the client's end-to-end headers (X-Forwarded-For with the client's
 * address appended to each), Content-Length, the body.
 *
 * Input: one byte of flags (bit 0: a client address; bit 1: an IPv6 one;
 * bit 2: the last field is a body), then fields separated by NUL bytes:
 * the method, the path, then header names and values in turn. A name
 * that is one byte from 1 to 16 stands for a name from a table (the ones
 * the builder treats apart: X-Forwarded-For, Connection, hop-by-hop
 * headers).
 * Bytes are kept to what the gateway's HTTP server hands on (a token for
 * the method and names, no CR, LF or NUL in values).
 *
 * The request is built, under ASan (a write past the buffer aborts), then
 * parsed back strictly, each property an abort() when broken:
 *  - one request line "METHOD BASEPATH HTTP/1.1", then "Host: AUTHORITY";
 *  - every header line "token:" then an optional space and a value with no
 *    CR or LF; the head ends with an empty line;
 *  - no hop-by-hop header passed on, nor one the client's Connection
 *    names; every other header of the client, in its order;
 *  - with a client address, every X-Forwarded-For line ends with it, and
 *    there is at least one;
 *  - Content-Length is there exactly when a body is sent, and the bytes
 *    after the head are that body, to the last byte.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/upstream_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

static void done(void *ctx, up_result r) {
  (void)ctx;
  (void)r;
}

static const serve_config config = {
    .upstream = "http://127.0.0.1:9/base",
    .upstream_timeout_ms = 1000,
    .max_pass = 1 << 20,
};

static const char *const names[] = {
    "X-Forwarded-For", "Connection", "Keep-Alive",  "Transfer-Encoding",
    "Content-Length",  "Host",       "TE",          "Upgrade",
    "Proxy-Connection", "Expect",    "Trailer",     "Content-Type",
    "X-Custom",        "x-forwarded-for", "Accept", "Authorization"};

#define MAX_FIELDS 600

static int tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A copy of f kept to the bytes that `keep` allows; "" when none. */
static char *keep_only(const uint8_t *f, size_t n, int (*keep)(unsigned char)) {
  char *s = malloc(n + 1);
  size_t k = 0;
  check(s != NULL);
  for (size_t i = 0; i < n; i++)
    if (keep(f[i]))
      s[k++] = (char)f[i];
  s[k] = '\0';
  return s;
}

static int path_char(unsigned char c) { return c > 0x20 && c < 0x7f; }
static int value_char(unsigned char c) {
  return c != '\r' && c != '\n' && c != 0;
}

/* Whether the request's Connection headers name `name`. */
static int named(const up_request *rq, const char *name) {
  for (size_t k = 0; k < rq->nheaders; k++)
    if (strcasecmp(rq->headers[k].name, "Connection") == 0 &&
        header_named_by(rq->headers[k].value, name))
      return 1;
  return 0;
}

/* The next line of the head at *p (up to end): its length without CRLF,
 * or -1 when there is no CRLF, or a bare CR or LF inside. */
static long line(const char **p, const char *end, const char **start) {
  const char *s = *p, *e = s;
  while (e + 1 < end && !(e[0] == '\r' && e[1] == '\n')) {
    check(*e != '\r' && *e != '\n');
    e++;
  }
  if (e + 1 >= end)
    return -1;
  *start = s;
  *p = e + 2;
  return (long)(e - s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  const uint8_t *field[MAX_FIELDS];
  size_t flen[MAX_FIELDS], nf = 0;
  up_request rq;
  up_header hs[MAX_FIELDS / 2];
  char *owned[MAX_FIELDS];
  size_t nowned = 0;
  const char *out, *p, *end, *s;
  size_t len;
  int flags;
  if (!ready) {
    check(upstream_init(&config) == 0);
    ready = 1;
  }
  if (size < 1)
    return 0;
  flags = data[0];
  for (size_t i = 1, from = 1; i <= size && nf < MAX_FIELDS; i++)
    if (i == size || data[i] == 0) {
      field[nf] = data + from;
      flen[nf++] = i - from;
      from = i + 1;
    }
  memset(&rq, 0, sizeof rq);
  rq.method = nf > 0 ? owned[nowned++] = keep_only(field[0], flen[0], tchar)
                     : "GET";
  if (!*rq.method)
    rq.method = "GET";
  {
    char *path = nf > 1 ? keep_only(field[1], flen[1], path_char) : NULL;
    char *uri = malloc((path ? strlen(path) : 0) + 2);
    check(uri != NULL);
    sprintf(uri, "/%s", path ? path : "");
    free(path);
    rq.uri = owned[nowned++] = uri;
  }
  size_t last = (flags & 4) && nf > 2 ? nf - 1 : nf;
  for (size_t i = 2; i + 1 < last + 1 && i + 1 < nf; i += 2) {
    const char *name;
    if (flen[i] == 1 && field[i][0] >= 1 && field[i][0] <= 16) {
      name = names[field[i][0] - 1];
    } else {
      name = owned[nowned++] = keep_only(field[i], flen[i], tchar);
      if (!*name)
        continue;
    }
    char *value = keep_only(field[i + 1], flen[i + 1], value_char);
    /* Trimmed, as an HTTP server hands values on. */
    size_t vl = strlen(value), v0 = 0;
    while (v0 < vl && (value[v0] == ' ' || value[v0] == '\t'))
      v0++;
    while (vl > v0 && (value[vl - 1] == ' ' || value[vl - 1] == '\t'))
      vl--;
    memmove(value, value + v0, vl - v0);
    value[vl - v0] = '\0';
    owned[nowned++] = value;
    hs[rq.nheaders].name = (char *)name;
    hs[rq.nheaders].value = value;
    rq.nheaders++;
  }
  rq.headers = hs;
  if ((flags & 4) && nf > 2) {
    rq.body = (const char *)field[nf - 1];
    rq.body_len = flen[nf - 1];
  }
  rq.client_addr = (flags & 1) ? ((flags & 2) ? "2001:db8::1" : "127.0.0.1")
                               : NULL;

  up_response rs;
  xfer *x = calloc(1, sizeof *x);
  check(x != NULL);
  memset(&rs, 0, sizeof rs);
  x->rq = &rq;
  x->rs = &rs;
  x->done = done;
  x->s.rs = &rs;
  x->s.rq = &rq;
  check((x->h1 = h1_new()) != NULL);
  check(h1_test_start(x) == 0);
  check(h1_test_request(x, &out, &len) == 0);

  /* Parsed back. */
  p = out;
  end = out + len;
  long n = line(&p, end, &s);
  {
    char want[8192];
    int w = snprintf(want, sizeof want, "%s /base%s HTTP/1.1", rq.method,
                     rq.uri);
    check(w < (int)sizeof want && n == w && memcmp(s, want, (size_t)w) == 0);
  }
  n = line(&p, end, &s);
  check(n == (long)strlen("Host: 127.0.0.1:9") &&
        memcmp(s, "Host: 127.0.0.1:9", (size_t)n) == 0);
  size_t next = 0, xff = 0;
  int have_cl = 0;
  size_t cl = 0;
  for (;;) {
    n = line(&p, end, &s);
    check(n >= 0);
    if (n == 0)
      break;
    const char *colon = memchr(s, ':', (size_t)n);
    check(colon != NULL && colon > s);
    for (const char *c = s; c < colon; c++)
      check(tchar((unsigned char)*c));
    char nm[256];
    size_t nl = (size_t)(colon - s);
    check(nl < sizeof nm);
    memcpy(nm, s, nl);
    nm[nl] = '\0';
    const char *v = colon + 1;
    size_t vn = (size_t)(s + n - v);
    if (vn && *v == ' ') {
      v++;
      vn--;
    }
    if (strcasecmp(nm, "Content-Length") == 0) {
      check(!have_cl);
      have_cl = 1;
      cl = strtoul(v, NULL, 10);
      continue;
    }
    check(!header_is_hop_by_hop(nm) && !named(&rq, nm));
    if (strcasecmp(nm, "X-Forwarded-For") == 0 && rq.client_addr) {
      size_t al = strlen(rq.client_addr);
      check(vn >= al && memcmp(v + vn - al, rq.client_addr, al) == 0);
      xff++;
    }
    /* The client's headers in order: this one is the next one kept. */
    while (next < rq.nheaders &&
           (header_is_hop_by_hop(rq.headers[next].name) ||
            named(&rq, rq.headers[next].name)))
      next++;
    if (next < rq.nheaders) {
      check(strcmp(nm, rq.headers[next].name) == 0);
      next++;
    } else {
      /* Only the address's own X-Forwarded-For comes after them. */
      check(rq.client_addr && strcmp(nm, "X-Forwarded-For") == 0);
    }
  }
  while (next < rq.nheaders &&
         (header_is_hop_by_hop(rq.headers[next].name) ||
          named(&rq, rq.headers[next].name)))
    next++;
  check(next == rq.nheaders);
  if (rq.client_addr)
    check(xff >= 1);
  int body = strcmp(rq.method, "HEAD") != 0 &&
             (rq.body_len || !strcmp(rq.method, "POST") ||
              !strcmp(rq.method, "PUT") || !strcmp(rq.method, "PATCH"));
  check(have_cl == body);
  check((size_t)(end - p) == (body ? rq.body_len : 0));
  if (body) {
    check(cl == rq.body_len);
    check(rq.body_len == 0 || memcmp(p, rq.body, rq.body_len) == 0);
  }
  h1_stop(x, 1); /* ends x, and frees it */
  upstream_response_free(&rs);
  for (size_t i = 0; i < nowned; i++)
    free(owned[i]);
  return 0;
}
