/*
 * framing.c -- strict HTTP/1.1 for the gateway: a request whose framing,
 * header lines or target the gateway cannot read without doubt is refused
 * before anything is claimed or forwarded, and the connection is closed.
 *
 * A gateway that reads a message one way while the upstream reads it
 * another is how requests are smuggled past it (RFC 9112 §11.2): a body
 * length taken from Content-Length while the upstream takes it from
 * Transfer-Encoding, a header name the upstream trims, a folded line it
 * joins, a NUL that ends a key early, a path that "../" takes out of the
 * upstream's base. So nothing is guessed: RFC 9112 §6.3 says which of these
 * must be refused, and the rest are refused because the gateway forwards
 * what it read, and must have read exactly what was sent.
 *
 * libmicrohttpd 0.9.75 parses the head in place and loses some of it: a
 * NUL ends a header value or the target (the rest is dropped silently), a
 * folded line is appended to the header's name, a line with an empty name
 * is dropped, and whitespace before a colon is kept in the name. Its
 * strict mode (MHD_OPTION_STRICT_FOR_CLIENT 1) catches none of these, and
 * answers the cases it does catch itself (a missing Host, a space in the
 * target) with an HTML page or no answer at all. So the head is checked
 * here, on the access handler's first call: what libmicrohttpd reports,
 * and, with 0.9.75, the raw head it parsed, which is still in its read
 * buffer, so that any byte it did not account for is found. See
 * check_raw_head() for how that buffer looks.
 */
#include "serve.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 §5.6.2: tchar. */
static int is_tchar(unsigned char b) {
  return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') ||
         (b >= 'A' && b <= 'Z') || (b && strchr("!#$%&'*+-.^_`|~", b));
}

int serve_is_token(const char *s, size_t n) {
  if (!n)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!is_tchar((unsigned char)s[i]))
      return 0;
  return 1;
}

static int refuse(serve_refusal *why, int status, const char *type,
                  const char *title, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int refuse(serve_refusal *why, int status, const char *type,
                  const char *title, const char *fmt, ...) {
  va_list ap;
  why->status = status;
  why->type = type;
  why->title = title;
  va_start(ap, fmt);
  vsnprintf(why->detail, sizeof why->detail, fmt, ap);
  va_end(ap);
  return -1;
}

/* ---- the head --------------------------------------------------------- */

/* One header line as libmicrohttpd reports it. */
typedef struct field {
  const char *name, *value;
  size_t nl, vl;
} field;

typedef struct fields {
  field *f;
  size_t n, cap;
} fields;

static enum MHD_Result collect_field(void *cls, enum MHD_ValueKind kind,
                                     const char *name, size_t nl,
                                     const char *value, size_t vl) {
  fields *fs = cls;
  (void)kind;
  if (fs->n == fs->cap)
    return MHD_NO;
  fs->f[fs->n++] = (field){name, value ? value : "", nl, value ? vl : 0};
  return MHD_YES;
}

/* Non-zero when raw[from, to) is a line end as libmicrohttpd leaves it:
 * min to max bytes, all NUL. */
static int line_end(const char *raw, size_t from, size_t to, size_t min,
                    size_t max) {
  if (to < from || to - from < min || to - from > max)
    return 0;
  for (size_t i = from; i < to; i++)
    if (raw[i] != 0)
      return 0;
  return 1;
}

/*
 * With libmicrohttpd 0.9.75 (checked at run time: another version may lay
 * its buffer out otherwise), the head of the request, as received, is
 * still in the connection's read buffer when the handler is first called:
 * it starts where the method does and is MHD_CONNECTION_INFO_REQUEST_-
 * HEADER_SIZE bytes long. libmicrohttpd has only overwritten, with NUL,
 * each line's end (CR LF or LF), the space after the method and before the
 * version, each header's colon, and the '?' of the target, and decoded the
 * target in place; each reported header name and value points into that
 * buffer. A folded line's name is copied elsewhere, its continuation left
 * in place.
 *
 * So the head is walked line by line: the request line, then each
 * reported header's name, its colon, whitespace, its value, and a line end
 * of one or two NULs (LF or CR LF) up to the next line's name. Anything
 * else between them is what libmicrohttpd dropped (what followed a NUL in
 * a value, a folded continuation, a line without a name), and the request
 * is refused. One case stays out of reach: a NUL as the last byte of a
 * value ended by a bare LF leaves the same bytes as CR LF; the value is
 * then read without the NUL, and nothing after it is lost. The request
 * line also gives the target's length as sent (a NUL in it ends uri_log's
 * copy), and the HTTP version, which begin() is not given.
 *
 * 0 when the head is whole, with *http11 set; -1 with *why filled; 1 when
 * the layout is not known (another libmicrohttpd), *http11 then set to 1.
 */
static int check_raw_head(struct MHD_Connection *c, const char *method,
                          const char *uri, const fields *fs, int *http11,
                          serve_refusal *why) {
  const union MHD_ConnectionInfo *ci;
  const char *raw = method;
  size_t size, ml = strlen(method), end, e, i, prev;
  int rc = 0;

  *http11 = 1;
  if (strcmp(MHD_get_version(), "0.9.75") != 0)
    return 1;
  ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
  if (!ci || !ci->header_size || ci->header_size <= ml + 1)
    return 1;
  size = ci->header_size;

  /* The request line: METHOD SP TARGET SP HTTP/d.d, one space each. */
  if (raw[ml + 1] == ' ')
    return refuse(why, 400, "bad-target", "Malformed request line",
                  "The request line has more than one space after the "
                  "method; send \"METHOD /path HTTP/1.1\" with single "
                  "spaces. Nothing was claimed or forwarded.");
  end = size;
  if (fs->n) {
    uintptr_t off = (uintptr_t)fs->f[0].name - (uintptr_t)raw;
    if (off <= ml + 1 || off >= size)
      return refuse(why, 400, "bad-header", "Malformed header line",
                    "The first header line could not be read as sent (a "
                    "folded line?). Nothing was claimed or forwarded.");
    end = (size_t)off;
  }
  e = end;
  while (e > ml + 1 && raw[e - 1] == 0)
    e--;
  if (e < ml + 1 + 9 || raw[e - 9] != 0 || memcmp(raw + e - 8, "HTTP/", 5))
    return refuse(why, 400, "bad-target", "Malformed request line",
                  "The request line is not \"METHOD target HTTP/1.1\" with "
                  "single spaces. Nothing was claimed or forwarded.");
  *http11 = !(raw[e - 3] == '1' && raw[e - 1] == '0');
  if (e - 9 - (ml + 1) != strlen(uri))
    return refuse(why, 400, "bad-target", "Malformed request target",
                  "The request target holds a NUL byte; send it "
                  "percent-encoded. Nothing was claimed or forwarded.");

  /* Each header line in turn: its name, its colon, whitespace, its value,
   * and then a line end (one or two NULs, for LF or CR LF) up to the next
   * line's name; after the last, its line end and the empty line's. */
  prev = e;
  for (i = 0; i < fs->n && rc == 0; i++) {
    const field *f = &fs->f[i];
    uintptr_t n = (uintptr_t)f->name - (uintptr_t)raw;
    uintptr_t v = (uintptr_t)f->value - (uintptr_t)raw;
    if (n <= prev || n >= size || f->nl >= size - n || v < n + f->nl + 1 ||
        v > size || f->vl > size - v || raw[n + f->nl] != 0 ||
        !line_end(raw, prev, n, 1, 2)) {
      rc = -1;
      break;
    }
    for (size_t k = n + f->nl + 1; k < v; k++)
      if (raw[k] != ' ' && raw[k] != '\t')
        rc = -1;
    prev = v + f->vl;
  }
  if (rc == 0 && !line_end(raw, prev, size, 2, 4))
    rc = -1;
  if (rc)
    return refuse(why, 400, "bad-header", "Malformed header line",
                  "A header line is not \"name: value\" as HTTP/1.1 "
                  "requires: a NUL byte in a value, a folded (continued) "
                  "line, or a line without a name. Nothing was claimed or "
                  "forwarded.");
  return 0;
}

/* The start of s (n bytes) as text for a message: JSON holds UTF-8 only, so
 * bytes outside printable ASCII are shown as '?'. */
static const char *shown(const char *s, size_t n, char *buf, size_t size) {
  size_t i;
  for (i = 0; i < n && i + 1 < size; i++)
    buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
  buf[i] = 0;
  return buf;
}

/* RFC 3986 §3.2.2-3.2.3: the characters of a host and port. */
static int host_ok(const char *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)v[i];
    if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') ||
          (b >= 'A' && b <= 'Z') || (b && strchr("-._~!$&'()*+,;=%:[]", b))))
      return 0;
  }
  return 1;
}

/* v (n bytes) without the whitespace libmicrohttpd leaves at its end. */
static size_t trimmed(const char *v, size_t n) {
  while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
    n--;
  return n;
}

int serve_check_head(struct MHD_Connection *c, const char *method,
                     const char *uri, serve_refusal *why) {
  fields fs0 = {0}, *fs = &fs0;
  const field *host = NULL, *cl = NULL, *te = NULL;
  int hosts = 0, cls = 0, tes = 0, http11, rc = 0, count;
  char text[52];

  if (!serve_is_token(method, strlen(method)))
    return refuse(why, 400, "bad-method", "Malformed method",
                  "The method is not an HTTP token (RFC 9110 section "
                  "9.1). Nothing was claimed or forwarded.");
  /* RFC 9112 section 3: a method longer than any the server implements
   * is answered 501. Forwarded, it would have been cut to its first
   * SERVE_METHOD_MAX bytes: another method than the client's. */
  if (strlen(method) > SERVE_METHOD_MAX)
    return refuse(why, 501, "method-not-implemented", "Method too long",
                  "The method is %zu bytes long; this gateway forwards "
                  "methods of at most %d. Nothing was claimed or forwarded.",
                  strlen(method), SERVE_METHOD_MAX);
  {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
        c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (ci && ci->header_size > SERVE_MAX_HEAD)
      return refuse(why, 431, "header-too-large", "Request head too large",
                    "The request head is %zu bytes; this gateway takes at "
                    "most %d, so that the head of its answer fits beside "
                    "it. Nothing was claimed or forwarded.",
                    ci->header_size, SERVE_MAX_HEAD);
  }
  count = MHD_get_connection_values_n(c, MHD_HEADER_KIND, NULL, NULL);
  fs->cap = count > 0 ? (size_t)count : 1;
  if (!(fs->f = calloc(fs->cap, sizeof *fs->f)))
    return refuse(why, 400, "bad-header", "Request head not read",
                  "Out of memory while reading the request head.");
  MHD_get_connection_values_n(c, MHD_HEADER_KIND, collect_field, fs);
  if ((rc = check_raw_head(c, method, uri, fs, &http11, why)) < 0)
    goto out;
  rc = 0;

  for (size_t i = 0; i < fs->n; i++) {
    const field *f = &fs->f[i];
    if (!serve_is_token(f->name, f->nl)) {
      rc = refuse(why, 400, "bad-header", "Malformed header line",
                  "The header name \"%s\" is not an HTTP token (RFC 9110 "
                  "section 5.1): no spaces, no whitespace before the colon. "
                  "Nothing was claimed or forwarded.",
                  shown(f->name, f->nl, text, sizeof text));
      goto out;
    }
    for (size_t k = 0; k < f->vl; k++) {
      unsigned char b = (unsigned char)f->value[k];
      if ((b < 0x20 && b != '\t') || b == 0x7f) {
        rc = refuse(why, 400, "bad-header", "Malformed header line",
                    "The value of %s holds a control character (0x%02x); "
                    "RFC 9110 section 5.5 allows none. Nothing was claimed "
                    "or forwarded.",
                    shown(f->name, f->nl, text, sizeof text), b);
        goto out;
      }
    }
    if (f->nl == 4 && strncasecmp(f->name, "Host", 4) == 0)
      hosts++, host = f;
    else if (f->nl == 14 && strncasecmp(f->name, "Content-Length", 14) == 0)
      cls++, cl = f;
    else if (f->nl == 17 && strncasecmp(f->name, "Transfer-Encoding", 17) == 0)
      tes++, te = f;
  }

  /* RFC 9112 §3.2: one Host, present in HTTP/1.1, a valid host. */
  if (hosts > 1 || (http11 && !hosts)) {
    rc = refuse(why, 400, "bad-host", "Host header missing or repeated",
                "The request has %d Host headers; send exactly one (RFC "
                "9112 section 3.2). Nothing was claimed or forwarded.",
                hosts);
    goto out;
  }
  if (host && !host_ok(host->value, trimmed(host->value, host->vl))) {
    rc = refuse(why, 400, "bad-host", "Host header invalid",
                "The Host header is not host[:port] (RFC 9112 section 3.2). "
                "Nothing was claimed or forwarded.");
    goto out;
  }

  /* RFC 9112 §6.1-6.3: exactly one way to find where the body ends. */
  if (te && cl) {
    rc = refuse(why, 400, "bad-framing", "Ambiguous message framing",
                "The request has both Transfer-Encoding and "
                "Content-Length; its length cannot be known without doubt "
                "(RFC 9112 section 6.3). Send one of them. Nothing was "
                "claimed or forwarded, and the connection is closed.");
    goto out;
  }
  if (te && !http11) {
    rc = refuse(why, 400, "bad-framing", "Ambiguous message framing",
                "An HTTP/1.0 request cannot have Transfer-Encoding (RFC "
                "9112 section 6.1). Nothing was claimed or forwarded, and "
                "the connection is closed.");
    goto out;
  }
  if (te && (tes > 1 || trimmed(te->value, te->vl) != 7 ||
             strncasecmp(te->value, "chunked", 7) != 0)) {
    rc = refuse(why, 501, "unsupported-transfer-coding",
                "Transfer-Encoding not supported",
                "This gateway takes Transfer-Encoding: chunked only, once; "
                "the request has \"%s\"%s. Nothing was claimed or "
                "forwarded, and the connection is closed.",
                shown(te->value, te->vl, text, sizeof text),
                tes > 1 ? " and more" : "");
    goto out;
  }
  if (cls > 1) {
    rc = refuse(why, 400, "bad-framing", "Ambiguous message framing",
                "The request has %d Content-Length headers; send exactly "
                "one (RFC 9112 section 6.3). Nothing was claimed or "
                "forwarded, and the connection is closed.",
                cls);
    goto out;
  }
  if (cl) {
    size_t n = cl->vl;
    int digits = n > 0;
    for (size_t k = 0; k < n; k++)
      if (cl->value[k] < '0' || cl->value[k] > '9')
        digits = 0;
    if (!digits) {
      rc = refuse(why, 400, "bad-framing", "Ambiguous message framing",
                  "Content-Length must be digits only (RFC 9110 section "
                  "8.6). Nothing was claimed or forwarded, and the "
                  "connection is closed.");
      goto out;
    }
  }
out:
  free(fs->f);
  return rc;
}

/* ---- the target ------------------------------------------------------- */

static int hexval(unsigned char b) {
  return b >= '0' && b <= '9'   ? b - '0'
         : b >= 'a' && b <= 'f' ? b - 'a' + 10
         : b >= 'A' && b <= 'F' ? b - 'A' + 10
                                : -1;
}

/* RFC 3986 §2.3. */
static int is_unreserved(unsigned char b) {
  return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') ||
         (b >= 'A' && b <= 'Z') || b == '-' || b == '.' || b == '_' || b == '~';
}

/* RFC 3986 §3.3-3.4: what a path or query may hold unencoded (pchar, '/'
 * and '?'), '%' aside. */
static int is_plain(unsigned char b) {
  return is_unreserved(b) || (b && strchr("!$&'()*+,;=:@/?", b));
}

char *serve_target(const char *uri, serve_refusal *why) {
  static const char hex[] = "0123456789ABCDEF";
  size_t n = strlen(uri), seg = 0, dots = 0;
  char *out, *o;
  int query = 0, params = 0;

  if (uri[0] != '/') {
    refuse(why, 400, "bad-target", "Request target is not a path",
           "The request target must be a path starting with '/' "
           "(origin-form); nothing was claimed or forwarded.");
    return NULL;
  }
  if (!(o = out = malloc(n + 1 + n * 2))) {
    refuse(why, 400, "bad-target", "Request target not read",
           "Out of memory while reading the request target.");
    return NULL;
  }
  for (size_t i = 0; i <= n; i++) {
    unsigned char b = (unsigned char)uri[i], d = b;
    int encoded = 0, sep;
    if (b == '%') {
      /* uri[i + 1] is at worst the terminating NUL, which is no hex
       * digit, so uri[i + 2] is read only when it exists. */
      int h = hexval((unsigned char)uri[i + 1]);
      int l = h >= 0 ? hexval((unsigned char)uri[i + 2]) : -1;
      if (l < 0) {
        refuse(why, 400, "bad-target", "Malformed request target",
               "A '%%' in the target is not followed by two hex digits "
               "(RFC 3986 section 2.1). Nothing was claimed or forwarded.");
        goto fail;
      }
      d = (unsigned char)(h * 16 + l);
      encoded = 1;
      i += 2;
    } else if (b == '#') {
      refuse(why, 400, "bad-target", "Malformed request target",
             "A request target has no fragment ('#'); nothing was claimed "
             "or forwarded.");
      goto fail;
    } else if (b && (b <= 0x20 || b == 0x7f)) {
      refuse(why, 400, "bad-target", "Malformed request target",
             "The request target holds a space or a control character "
             "(0x%02x); send it percent-encoded. Nothing was claimed or "
             "forwarded.",
             b);
      goto fail;
    }
    /* The path's segments, each decoded, must not be "." or "..": the
     * upstream (or libcurl) would resolve them out of the base path. '\'
     * counts as a separator, and so do an encoded '/' or '\', since some
     * servers decode before they split. What follows a ';' in a segment
     * (path parameters) does not count: servlet containers (Tomcat, Jetty)
     * drop it before they resolve, so "..;x" is "..". */
    if (!query) {
      sep = !b || (!encoded && b == '?') || d == '/' || d == '\\';
      if (sep) {
        if (seg && seg == dots && seg <= 2) {
          refuse(why, 400, "dot-segment", "Path leaves the base",
                 "The path has a \".\" or \"..\" segment (also as %%2e); "
                 "the gateway forwards a path only below the upstream's "
                 "base. Nothing was claimed or forwarded.");
          goto fail;
        }
        seg = dots = 0;
        params = 0;
      } else if (d == ';') {
        params = 1;
      } else if (!params) {
        seg++;
        dots += d == '.';
      }
      if (encoded && (d < 0x20 || d == 0x7f)) {
        refuse(why, 400, "bad-target", "Malformed request target",
               "The path holds an encoded control character (%%%02X). "
               "Nothing was claimed or forwarded.",
               d);
        goto fail;
      }
    }
    if (!b)
      break;
    if (!encoded && b == '?')
      query = 1;
    /* RFC 3986 §6.2.2: an unreserved character is the same encoded or
     * not, and so is any hex digit's case. Characters that may not appear
     * unencoded (non-ASCII bytes, '"', '<', '\', '{' ...) are sent
     * encoded: the same resource, spelt as the RFC asks. */
    if (encoded ? is_unreserved(d) : is_plain(b)) {
      *o++ = (char)d;
    } else {
      *o++ = '%';
      *o++ = hex[d >> 4];
      *o++ = hex[d & 15];
    }
  }
  *o = 0;
  return out;
fail:
  free(out);
  return NULL;
}
