/*
 * url.c -- the PostgreSQL backend's target: a postgresql:// URL or a
 * libpq conninfo string, idem's own idem_schema parameter taken out of it,
 * its syntax checked by libpq, and the passwords in it that no message may
 * show.
 */

#include "pg.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---- secrets ------------------------------------------------------------- */

/*
 * The target may hold a password, and libpq's own messages quote what they
 * could not read: the whole URL, the token that was not valid
 * percent-encoding, a piece of a password that a stray '/' or '@' made it
 * read as a port or a host name, the word after an unquoted space. So the
 * target is never put in a message by idem, and every message leaving this
 * backend is scrubbed of the passwords the target holds, in every form in
 * which libpq might show them (see idem__pg_scrub()).
 */

/* Remembers n bytes at p as a secret, keeping the list longest first. */
static void add_secret(pg_store *s, const char *p, size_t n) {
  char *copy;
  int i;
  if (n == 0)
    return;
  for (i = 0; i < s->nsecret; i++)
    if (strlen(s->secret[i]) == n && !memcmp(s->secret[i], p, n))
      return;
  if (s->nsecret == s->secret_cap) {
    int cap = s->secret_cap ? 2 * s->secret_cap : 8;
    char **grown = realloc(s->secret, (size_t)cap * sizeof *grown);
    if (!grown) {
      s->secret_nomem = 1;
      return;
    }
    s->secret = grown;
    s->secret_cap = cap;
  }
  if (!(copy = malloc(n + 1))) {
    s->secret_nomem = 1;
    return;
  }
  memcpy(copy, p, n);
  copy[n] = '\0';
  for (i = s->nsecret; i > 0 && strlen(s->secret[i - 1]) < n; i--)
    s->secret[i] = s->secret[i - 1];
  s->secret[i] = copy;
  s->nsecret++;
}

static int hex_digit(char ch) {
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F')
    return ch - 'A' + 10;
  return -1;
}

/* A URL's secret: as written, and percent-decoded when that differs. */
static void add_url_secret(pg_store *s, const char *p, size_t n) {
  char *d = malloc(n + 1);
  size_t o = 0;
  add_secret(s, p, n);
  if (!d) {
    s->secret_nomem = 1;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    int hi, lo;
    if (p[i] == '%' && i + 2 < n && (hi = hex_digit(p[i + 1])) >= 0 &&
        (lo = hex_digit(p[i + 2])) >= 0) {
      d[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      d[o++] = p[i];
    }
  }
  add_secret(s, d, o);
  free(d);
}

/* Whether the n bytes at p name a keyword that holds a password. */
static int password_keyword(const char *p, size_t n) {
  return (n == 8 && !strncmp(p, "password", 8)) ||
         (n == 11 && !strncmp(p, "sslpassword", 11));
}

/*
 * The secrets of the URL in the n bytes at url: the password of the user
 * info, as libpq reads it (up to the first '@'); from the first ':' to the
 * last '@' before the query and each piece of that between '@', '/', ':'
 * and blanks, for a password in which those were not percent-encoded (a
 * message may show a tab as a space); and the values of password and
 * sslpassword in the query.
 */
static void url_secrets(pg_store *s, const char *url, size_t n) {
  const char *end = url + n, *a = strstr(url, "://"), *p, *q, *at = NULL,
             *colon;
  if (!a || a >= end)
    return;
  a += 3;
  for (p = a; p < end && *p != '@' && *p != '/'; p++)
    ;
  if (p < end && *p == '@' && (colon = memchr(a, ':', (size_t)(p - a))))
    add_url_secret(s, colon + 1, (size_t)(p - colon - 1));
  q = memchr(a, '?', (size_t)(end - a));
  for (p = a; p < (q ? q : end); p++)
    if (*p == '@')
      at = p;
  if (at && (colon = memchr(a, ':', (size_t)(at - a)))) {
    const char *piece = colon + 1;
    add_url_secret(s, piece, (size_t)(at - piece));
    for (p = piece; p <= at; p++)
      if (p == at || *p == '@' || *p == '/' || *p == ':' ||
          isspace((unsigned char)*p)) {
        add_secret(s, piece, (size_t)(p - piece));
        piece = p + 1;
      }
  }
  for (p = q; p && p < end; p = q) {
    const char *eq, *amp;
    p++;
    amp = memchr(p, '&', (size_t)(end - p));
    q = amp ? amp : end;
    eq = memchr(p, '=', (size_t)(q - p));
    if (eq && password_keyword(p, (size_t)(eq - p)))
      add_url_secret(s, eq + 1, (size_t)(q - eq - 1));
    if (!amp)
      break;
  }
}

static int is_url_at(const char *p) {
  return !strncmp(p, "postgresql://", 13) || !strncmp(p, "postgres://", 11);
}

/*
 * Reads a conninfo keyword: blanks, the word, blanks. Sets [*tok, *kw_end)
 * and returns where it stopped: at its '=', at the end of the text (an
 * empty *tok), or at whatever else follows.
 */
static const char *conninfo_keyword(const char *p, const char **tok,
                                    const char **kw_end) {
  while (isspace((unsigned char)*p))
    p++;
  *tok = p;
  while (*p && *p != '=' && !isspace((unsigned char)*p))
    p++;
  *kw_end = p;
  while (isspace((unsigned char)*p))
    p++;
  return p;
}

/*
 * Reads the value of a conninfo keyword, p just past its '=': blanks, then
 * a quoted value (backslash escapes kept) or a bare one up to a blank.
 * Sets [*val, *val_end) to the value without its quotes and returns where
 * the next keyword may start.
 */
static const char *conninfo_value(const char *p, const char **val,
                                  const char **val_end) {
  while (isspace((unsigned char)*p))
    p++;
  *val = p;
  if (*p == '\'') {
    for (p++; *p && *p != '\''; p++)
      if (*p == '\\' && p[1])
        p++;
    *val_end = p;
    (*val)++;
    if (*p)
      p++;
  } else {
    for (; *p && !isspace((unsigned char)*p); p++)
      if (*p == '\\' && p[1])
        p++;
    *val_end = p;
  }
  return p;
}

/*
 * The secrets of a conninfo string, read as libpq reads it (keyword =
 * value, values optionally single-quoted with backslash escapes): the
 * values of password and sslpassword, as written and unescaped, and any
 * bare words after one (the rest of a password with an unquoted space,
 * which libpq quotes when it finds no '=' after them). A value that is a
 * URL (dbname may be one) is read as a URL.
 */
static void conninfo_secrets(pg_store *s, const char *t) {
  const char *p = t;
  int after_password = 0;
  while (*p) {
    const char *tok, *kw_end, *val, *val_end;
    p = conninfo_keyword(p, &tok, &kw_end);
    if (tok == kw_end && !*p)
      break;
    if (*p != '=') {
      if (after_password)
        add_secret(s, tok, (size_t)(kw_end - tok));
      p = kw_end;
      continue;
    }
    p = conninfo_value(p + 1, &val, &val_end);
    after_password = password_keyword(tok, (size_t)(kw_end - tok));
    if (after_password) {
      char *u = malloc((size_t)(val_end - val) + 1);
      size_t o = 0;
      add_secret(s, val, (size_t)(val_end - val));
      if (!u) {
        s->secret_nomem = 1;
      } else {
        for (const char *v = val; v < val_end; v++) {
          if (*v == '\\' && v + 1 < val_end)
            v++;
          u[o++] = *v;
        }
        add_secret(s, u, o);
        free(u);
      }
    } else if (is_url_at(val)) {
      url_secrets(s, val, (size_t)(val_end - val));
    }
  }
}

/*
 * Replaces every secret in msg (a string in a buffer of size bytes) with
 * "***". A secret of four bytes or more goes wherever it appears; a
 * shorter one (a piece of a password that libpq read as something else)
 * only where it stands as a word of its own, so that a piece of one letter
 * does not blank out that letter all over the message.
 */
void idem__pg_scrub(const pg_store *s, char *msg, size_t size) {
  char out[2 * ERR_SIZE];
  if (!s || size == 0)
    return;
  if (size > sizeof out) {
    /* Longer than any message here: shortened, never left unscrubbed. */
    size = sizeof out;
    msg[size - 1] = '\0';
  }
  for (int i = 0; i < s->nsecret; i++) {
    const char *sec = s->secret[i], *p = msg;
    size_t n = strlen(sec), o = 0;
    if (!strstr(msg, sec))
      continue;
    while (*p && o + 4 < size) {
      if (!strncmp(p, sec, n) &&
          (n >= 4 || ((p == msg || !idem__pg_is_word_char(p[-1])) &&
                      !idem__pg_is_word_char(p[n])))) {
        memcpy(out + o, "***", 3);
        o += 3;
        p += n;
      } else {
        out[o++] = *p++;
      }
    }
    out[o] = '\0';
    memcpy(msg, out, o + 1);
  }
}

/* The secrets of a target, before anything reads it. A URL that starts
 * the target (after blanks, as after "pg: ") is read by libpq to the end
 * of the text, blanks and all; one inside a conninfo ends at a blank. */
static void collect_secrets(pg_store *s, const char *target) {
  const char *first = target;
  while (isspace((unsigned char)*first))
    first++;
  for (const char *p = target; *p; p++)
    if (is_url_at(p) && (p == target || !idem__pg_is_word_char(p[-1]))) {
      size_t n = p == first ? strlen(p) : strcspn(p, " \t\n'");
      url_secrets(s, p, n);
      p += n - 1;
    }
  if (!is_url_at(target))
    conninfo_secrets(s, target);
}

/* ---- target -------------------------------------------------------------- */

/* Checks an idem_schema value: an unquoted PostgreSQL identifier that
 * needs no quoting, outside the names PostgreSQL reserves. */
static int check_schema(const char *name, size_t len, char *err) {
  int ok = len >= 1 && len <= SCHEMA_MAX &&
           ((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_');
  for (size_t i = 1; ok && i < len; i++)
    ok = (name[i] >= 'a' && name[i] <= 'z') ||
         (name[i] >= '0' && name[i] <= '9') || name[i] == '_';
  if (!ok)
    return idem__pg_failf(
        err, IDEM_EURL,
        "store: idem_schema '%.*s' is not a valid schema name; use "
        "1-63 characters of a-z, 0-9 and _, not starting with a "
        "digit",
        (int)(len > 80 ? 80 : len), name);
  if (len >= 3 && !strncmp(name, "pg_", 3))
    return idem__pg_failf(
        err, IDEM_EURL,
        "store: idem_schema '%.*s': names starting with pg_ are "
        "reserved by PostgreSQL",
        (int)len, name);
  return IDEM_OK;
}

static int take_schema(const char *v, size_t len, int *seen, char *schema,
                       char *err) {
  int rc;
  if (*seen)
    return idem__pg_failf(err, IDEM_EURL, "store: idem_schema is given twice");
  *seen = 1;
  if ((rc = check_schema(v, len, err)) != IDEM_OK)
    return rc;
  memcpy(schema, v, len);
  schema[len] = '\0';
  return IDEM_OK;
}

/* postgresql://...?a=1&idem_schema=x&b=2 -> postgresql://...?a=1&b=2 */
static int strip_url(const char *target, char *out, char *schema, int *seen,
                     char *err) {
  const char *q = strchr(target, '?');
  const char *p, *end;
  size_t o;
  int first = 1, rc;
  if (!q) {
    strcpy(out, target);
    return IDEM_OK;
  }
  o = (size_t)(q - target);
  memcpy(out, target, o);
  for (p = q + 1;; p = end + 1) {
    size_t n;
    end = strchr(p, '&');
    n = end ? (size_t)(end - p) : strlen(p);
    if (n >= 11 && !strncmp(p, "idem_schema", 11) &&
        (n == 11 || p[11] == '=')) {
      rc = take_schema(n > 11 ? p + 12 : p + 11, n > 11 ? n - 12 : 0, seen,
                       schema, err);
      if (rc != IDEM_OK)
        return rc;
    } else if (n > 0) {
      out[o++] = first ? '?' : '&';
      memcpy(out + o, p, n);
      o += n;
      first = 0;
    }
    if (!end)
      break;
  }
  out[o] = '\0';
  return IDEM_OK;
}

/* "host=h idem_schema=x dbname=d" -> "host=h dbname=d", following libpq's
 * conninfo syntax: keyword = value, values optionally single-quoted with
 * backslash escapes. */
static int strip_conninfo(const char *target, char *out, char *schema,
                          int *seen, char *err) {
  const char *p = target;
  size_t o = 0;
  int rc;
  while (*p) {
    const char *tok, *kw_end, *val, *val_end;
    p = conninfo_keyword(p, &tok, &kw_end);
    if (tok == kw_end && !*p)
      break;
    if (*p != '=') {
      /* Not keyword=value: leave it, and the rest, for libpq to judge. */
      p = tok + strlen(tok);
      if (o)
        out[o++] = ' ';
      memcpy(out + o, tok, (size_t)(p - tok));
      o += (size_t)(p - tok);
      break;
    }
    p = conninfo_value(p + 1, &val, &val_end);
    if (kw_end - tok == 11 && !strncmp(tok, "idem_schema", 11)) {
      rc = take_schema(val, (size_t)(val_end - val), seen, schema, err);
      if (rc != IDEM_OK)
        return rc;
      continue;
    }
    if (o)
      out[o++] = ' ';
    memcpy(out + o, tok, (size_t)(p - tok));
    o += (size_t)(p - tok);
  }
  out[o] = '\0';
  return IDEM_OK;
}

/*
 * Splits the target into what libpq gets and idem's schema name, and lets
 * libpq check the syntax, so that a malformed URL is reported as such rather
 * than as an unreachable server. The target is never echoed: it may hold a
 * password.
 */
int idem__pg_parse_target(pg_store *s, const char *target, char *err) {
  int is_url = !strncmp(target, "postgresql://", 13) ||
               !strncmp(target, "postgres://", 11);
  int seen = 0, rc;
  char *msg = NULL;
  PQconninfoOption *opts;

  collect_secrets(s, target);
  if (s->secret_nomem)
    return idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  /* Room for a separator per token: the output may gain a space where
   * the input had a quoted value directly followed by the next keyword. */
  s->conninfo = malloc(2 * strlen(target) + 2);
  if (!s->conninfo)
    return idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  strcpy(s->schema, "idem");
  rc = is_url ? strip_url(target, s->conninfo, s->schema, &seen, err)
              : strip_conninfo(target, s->conninfo, s->schema, &seen, err);
  if (rc != IDEM_OK)
    return rc;
  /* A bare word is a database name (libpq's rule for dbname), unless it
   * is a URL, which libpq expands (the rest of the text after "pg: "). */
  if (!is_url && !strchr(s->conninfo, '=') && !is_url_at(s->conninfo))
    return IDEM_OK;
  opts = PQconninfoParse(s->conninfo, &msg);
  if (!opts) {
    char text[ERR_SIZE];
    idem__pg_oneline(text, sizeof text, msg ? msg : "out of memory");
    PQfreemem(msg);
    return idem__pg_failf(err, msg ? IDEM_EURL : IDEM_ENOMEM, "store: %s",
                          text);
  }
  /* The passwords as libpq read them, whatever the syntax. */
  for (PQconninfoOption *o = opts; o->keyword; o++)
    if (o->val && password_keyword(o->keyword, strlen(o->keyword)))
      add_secret(s, o->val, strlen(o->val));
  PQconninfoFree(opts);
  if (s->secret_nomem)
    return idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  return IDEM_OK;
}
