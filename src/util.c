/* util.c -- small helpers shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void cli_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "idem %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

void cli_idem_error(const char *cmd, const char *what, int rc) {
  const char *detail = idem_errmsg();
  if (detail[0])
    cli_error(cmd, "%s: %s (%s)", what, detail, idem_rc_name(rc));
  else
    cli_error(cmd, "%s: %s (%s)", what, idem_strerror(rc), idem_rc_name(rc));
}

int cli_read_file(const char *path, size_t max, char **out, size_t *len) {
  FILE *f = stdin;
  char *buf = NULL;
  size_t cap = 0, n = 0;
  *out = NULL;
  *len = 0;
  if (path && strcmp(path, "-") != 0) {
    f = fopen(path, "rb");
    if (!f)
      return -1;
  }
  for (;;) {
    if (n + 1 >= cap) {
      size_t ncap = cap ? cap * 2 : 65536;
      char *nbuf;
      if (cap > max + 1) {
        free(buf);
        if (f != stdin)
          fclose(f);
        errno = EFBIG;
        return -1;
      }
      nbuf = realloc(buf, ncap);
      if (!nbuf) {
        free(buf);
        if (f != stdin)
          fclose(f);
        errno = ENOMEM;
        return -1;
      }
      buf = nbuf;
      cap = ncap;
    }
    size_t got = fread(buf + n, 1, cap - n - 1, f);
    n += got;
    if (n > max) {
      free(buf);
      if (f != stdin)
        fclose(f);
      errno = EFBIG;
      return -1;
    }
    if (got == 0) {
      int err = ferror(f);
      if (f != stdin)
        fclose(f);
      if (err) {
        free(buf);
        errno = EIO;
        return -1;
      }
      break;
    }
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return 0;
}

int cli_parse_duration(const char *s, int64_t *ms) {
  /* Parsed by hand rather than with strtod(), which takes signs, exponents,
   * hex, "nan" and "inf": none is a duration, and NaN converted to an
   * integer is undefined behaviour. Integer arithmetic keeps "0.3s" exact. */
  static const struct {
    const char *name;
    int64_t ms;
  } units[] = {{"ms", 1},    {"s", 1000},    {"", 1000},
               {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
  const char *p = s, *int_start, *frac_start = NULL;
  size_t int_len, frac_len = 0;
  int64_t unit = 0, whole = 0, frac = 0, scale = 1;
  if (!s) {
    errno = EINVAL;
    return -1;
  }
  int_start = p;
  while (*p >= '0' && *p <= '9')
    p++;
  int_len = (size_t)(p - int_start);
  if (*p == '.') {
    frac_start = ++p;
    while (*p >= '0' && *p <= '9')
      p++;
    frac_len = (size_t)(p - frac_start);
  }
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(p, units[i].name) == 0)
      unit = units[i].ms;
  if (unit == 0 || int_len + frac_len == 0) {
    errno = EINVAL;
    return -1;
  }
  /* The whole part: every digit counts, and any beyond the limit is too
   * large however many follow. */
  for (size_t i = 0; i < int_len; i++) {
    whole = whole * 10 + (int_start[i] - '0');
    if (whole > CLI_MAX_DURATION_MS / unit) {
      errno = ERANGE;
      return -1;
    }
  }
  whole *= unit;
  /* The fraction: ten digits resolve a hundredth of a millisecond even in
   * days, and stay far from overflow once multiplied by the unit. */
  for (size_t i = 0; i < frac_len && i < 10; i++) {
    frac = frac * 10 + (frac_start[i] - '0');
    scale *= 10;
  }
  whole += frac * unit / scale;
  if (whole > CLI_MAX_DURATION_MS) {
    errno = ERANGE;
    return -1;
  }
  *ms = whole;
  return 0;
}

void cli_duration_text(int64_t ms, char *buf, size_t size) {
  static const struct {
    const char *name;
    int64_t ms;
  } units[] = {
      {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (ms % units[i].ms == 0 || i + 1 == sizeof units / sizeof units[0]) {
      snprintf(buf, size, "%lld%s", (long long)(ms / units[i].ms),
               units[i].name);
      return;
    }
}

int cli_duration_option(const char *cmd, const char *opt, const char *value,
                        int64_t min_ms, int64_t max_ms, int64_t *ms) {
  char limit[32];
  int64_t v = 0;
  int rc = cli_parse_duration(value, &v);
  if (rc != 0 && errno != ERANGE) {
    cli_error(cmd,
              "%s: '%s' is not a duration (such as 250ms, 30s, 5m, 24h or "
              "7d)",
              opt, value ? value : "");
    return -1;
  }
  if (rc != 0 || v > max_ms) {
    cli_duration_text(max_ms, limit, sizeof limit);
    cli_error(cmd, "%s: '%s' is too large (at most %s)", opt, value, limit);
    return -1;
  }
  if (v < min_ms) {
    cli_duration_text(min_ms, limit, sizeof limit);
    cli_error(cmd, "%s: '%s' is too short (at least %s)", opt, value, limit);
    return -1;
  }
  *ms = v;
  return 0;
}

int cli_parse_uint(const char *s, long max, long *out) {
  char *end = NULL;
  long v;
  if (!s || !*s)
    return -1;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > max)
    return -1;
  *out = v;
  return 0;
}

double cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int cli_cond_init_mono(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  int rc;
  if ((rc = pthread_condattr_init(&ca)) != 0)
    return rc;
  if ((rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC)) == 0)
    rc = pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
  return rc;
}

struct timespec cli_mono_deadline(int64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)(ms / 1000);
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

const char *cli_store_url(const char *flag) {
  const char *env = getenv("IDEM_STORE");
  if (flag && *flag)
    return flag;
  if (env && *env)
    return env;
  return "./idem.db";
}

int cli_store_option(const char *cmd, const char *value, const char **url) {
  if (!value || !*value) {
    cli_error(cmd, "--store: empty store URL");
    return -1;
  }
  *url = value;
  return 0;
}

/*
 * The code point of the UTF-8 sequence at p (at most n bytes) and its
 * length, or 0 when it is not UTF-8: the rules of libidem's own check
 * (shortest forms only, no surrogates, nothing past U+10FFFF).
 */
static size_t utf8_decode(const unsigned char *p, size_t n, uint32_t *cp) {
  if (p[0] < 0x80) {
    *cp = p[0];
    return 1;
  }
  if (p[0] >= 0xc2 && p[0] <= 0xdf) {
    if (n < 2 || (p[1] & 0xc0) != 0x80)
      return 0;
    *cp = (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f);
    return 2;
  }
  if (p[0] >= 0xe0 && p[0] <= 0xef) {
    if (n < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
      return 0;
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f))
      return 0; /* overlong, or a surrogate */
    *cp = (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 |
          (p[2] & 0x3f);
    return 3;
  }
  if (p[0] >= 0xf0 && p[0] <= 0xf4) {
    if (n < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 ||
        (p[3] & 0xc0) != 0x80)
      return 0;
    if ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))
      return 0;
    *cp = (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 |
          (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
    return 4;
  }
  return 0;
}

static int is_control(uint32_t c) {
  return c < 0x20 || (c >= 0x7f && c <= 0x9f);
}

/* Characters that show nothing, or that reorder the text around them, so
 * that two different names can look the same: the bidirectional marks
 * (U+061C, U+200E, U+200F), embeddings and overrides (U+202A-U+202E) and
 * isolates (U+2066-U+2069); zero-width spaces and joiners (U+200B-U+200D,
 * U+2060-U+2064); line and paragraph separators (U+2028, U+2029); the byte
 * order mark (U+FEFF); and the tag characters (U+E0000-U+E007F), which can
 * carry hidden text. */
static int is_invisible(uint32_t c) {
  return c == 0x061c || (c >= 0x200b && c <= 0x200f) ||
         (c >= 0x2028 && c <= 0x202e) || (c >= 0x2060 && c <= 0x2069) ||
         c == 0xfeff || (c >= 0xe0000 && c <= 0xe007f);
}

/* The checks of --tenant (strict) and --operation (libidem's own). */
static int check_name(const char *cmd, const char *opt, const char *s,
                      int may_be_empty, int strict) {
  size_t n = strlen(s);
  if (n == 0 && !may_be_empty) {
    cli_error(cmd, "%s: empty", opt);
    return -1;
  }
  if (n > 255) {
    cli_error(cmd, "%s: %zu bytes; at most 255", opt, n);
    return -1;
  }
  for (size_t i = 0; i < n;) {
    uint32_t c;
    size_t k = utf8_decode((const unsigned char *)s + i, n - i, &c);
    if (k == 0) {
      cli_error(cmd, "%s: invalid UTF-8 at byte %zu", opt, i);
      return -1;
    }
    if (c < 0x20 || c == 0x7f || (strict && is_control(c))) {
      cli_error(cmd, "%s: control character U+%04" PRIX32 " at byte %zu", opt,
                c, i);
      return -1;
    }
    if (strict && is_invisible(c)) {
      cli_error(cmd,
                "%s: invisible or reordering character U+%04" PRIX32
                " at byte %zu",
                opt, c, i);
      return -1;
    }
    i += k;
  }
  return 0;
}

int cli_check_tenant(const char *cmd, const char *tenant) {
  return check_name(cmd, "--tenant", tenant, 1, 1);
}

int cli_check_operation(const char *cmd, const char *operation) {
  return check_name(cmd, "--operation", operation, 0, 0);
}

/* A growable output string for the escapers. */
typedef struct strbuf {
  char *p;
  size_t len, cap;
  int failed;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t ncap = b->cap ? b->cap : 64;
    while (ncap < b->len + n + 1)
      ncap *= 2;
    char *np = realloc(b->p, ncap);
    if (!np) {
      b->failed = 1;
      return;
    }
    b->p = np;
    b->cap = ncap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static char *sb_finish(strbuf *b) {
  if (!b->failed && !b->p)
    sb_add(b, "", 0);
  if (b->failed) {
    free(b->p);
    return NULL;
  }
  return b->p;
}

char *cli_escape(const void *s, size_t n) {
  const unsigned char *p = s;
  strbuf b = {0};
  char esc[16];
  for (size_t i = 0; i < n;) {
    uint32_t c;
    size_t k = utf8_decode(p + i, n - i, &c);
    if (k == 0 || c < 0x20 || c == 0x7f || c == '\\') {
      const char *e = c == '\n'   ? "\\n"
                      : c == '\r' ? "\\r"
                      : c == '\t' ? "\\t"
                      : c == '\\' ? "\\\\"
                                  : NULL;
      if (k == 0 || !e) {
        snprintf(esc, sizeof esc, "\\x%02x", p[i]);
        e = esc;
      }
      sb_add(&b, e, strlen(e));
      i += k ? k : 1;
      continue;
    }
    if (is_control(c) || is_invisible(c)) {
      snprintf(esc, sizeof esc, c > 0xffff ? "\\U%08" PRIx32 : "\\u%04" PRIx32,
               c);
      sb_add(&b, esc, strlen(esc));
    } else {
      sb_add(&b, (const char *)p + i, k);
    }
    i += k;
  }
  return sb_finish(&b);
}

size_t cli_utf8_cut(const char *s, size_t max) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strnlen(s, max), start = n, need;
  /* The last character's first byte: at most three continuation bytes
   * back. */
  while (start > 0 && n - start < 3 && (p[start - 1] & 0xc0) == 0x80)
    start--;
  if (start == 0 || p[start - 1] < 0xc2 || p[start - 1] > 0xf4)
    return n; /* ASCII, or no lead byte: nothing of ours to cut */
  start--;
  need = p[start] >= 0xf0 ? 4 : p[start] >= 0xe0 ? 3 : 2;
  return n - start >= need ? n : start;
}

size_t cli_text_width(const char *s) {
  size_t w = 0;
  for (; *s; s++)
    w += ((unsigned char)*s & 0xc0) != 0x80;
  return w;
}

char *cli_json_escape_unsafe(const char *json) {
  const unsigned char *p = (const unsigned char *)json;
  size_t n = strlen(json);
  strbuf b = {0};
  char esc[16];
  for (size_t i = 0; i < n;) {
    uint32_t c;
    size_t k = utf8_decode(p + i, n - i, &c);
    if (k == 0) {
      sb_add(&b, (const char *)p + i, 1);
      i++;
      continue;
    }
    /* Controls below U+0020 are escaped by jansson inside strings, and
     * outside them are the layout's own newlines. */
    if (c >= 0x7f && (is_control(c) || is_invisible(c))) {
      if (c > 0xffff)
        snprintf(esc, sizeof esc, "\\u%04" PRIx32 "\\u%04" PRIx32,
                 0xd800 + ((c - 0x10000) >> 10),
                 0xdc00 + ((c - 0x10000) & 0x3ff));
      else
        snprintf(esc, sizeof esc, "\\u%04" PRIx32, c);
      sb_add(&b, esc, strlen(esc));
    } else {
      sb_add(&b, (const char *)p + i, k);
    }
    i += k;
  }
  return sb_finish(&b);
}

/*
 * The URL as libpq takes it: idem's own query parameter idem_schema (which
 * says where idem's tables are, not the caller's) removed. NULL when out of
 * memory; free() it.
 */
char *cli_pg_libpq_url(const char *url) {
  const char *q = strchr(url, '?'), *p, *end;
  char *out = malloc(strlen(url) + 1);
  size_t o;
  int first = 1;
  if (!out || !q) {
    if (out)
      strcpy(out, url);
    return out;
  }
  o = (size_t)(q - url);
  memcpy(out, url, o);
  for (p = q + 1;; p = end + 1) {
    size_t n;
    end = strchr(p, '&');
    n = end ? (size_t)(end - p) : strlen(p);
    if (n > 0 && !(n >= 11 && strncmp(p, "idem_schema", 11) == 0 &&
                   (n == 11 || p[11] == '='))) {
      out[o++] = first ? '?' : '&';
      memcpy(out + o, p, n);
      o += n;
      first = 0;
    }
    if (!end)
      break;
  }
  out[o] = '\0';
  return out;
}

/* Appends to list the password candidates of one value: as written and
 * percent-decoded. */
static int add_secret(char **list, int n, int max, const char *p, size_t len) {
  char *raw, *dec;
  size_t o = 0;
  if (len == 0 || n + 2 > max)
    return n;
  if (!(raw = malloc(len + 1)) || !(dec = malloc(len + 1))) {
    free(raw);
    return n;
  }
  memcpy(raw, p, len);
  raw[len] = '\0';
  for (size_t i = 0; i < len; i++) {
    unsigned hi, lo;
    if (p[i] == '%' && i + 2 < len &&
        sscanf(p + i + 1, "%1x%1x", &hi, &lo) == 2) {
      dec[o++] = (char)(hi * 16 + lo);
      i += 2;
    } else {
      dec[o++] = p[i];
    }
  }
  dec[o] = '\0';
  list[n++] = raw;
  if (o > 0 && strcmp(dec, raw) != 0)
    list[n++] = dec;
  else
    free(dec);
  return n;
}

char *cli_redact(const char *text, const char *url) {
  char *secrets[16];
  int n = 0;
  const char *p, *at, *slash;
  strbuf b = {0};
  if (!text)
    return NULL;
  if (url) {
    /* scheme://user:PASSWORD@host...: the userinfo ends at the last '@'
     * before the path; a malformed URL is read the same way. */
    if ((p = strstr(url, "://")) != NULL) {
      p += 3;
      slash = p + strcspn(p, "/?");
      at = NULL;
      for (const char *q = p; q < slash; q++)
        if (*q == '@')
          at = q;
      if (!at)
        at = strrchr(p, '@');
      if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon)
          n = add_secret(secrets, n, 16, colon + 1, (size_t)(at - colon - 1));
      }
    }
    /* password=VALUE, in a conninfo or a URL's query. */
    for (p = url; (p = strstr(p, "password=")) != NULL; p += 9) {
      const char *v = p + 9;
      size_t len;
      if (*v == '\'') {
        v++;
        len = strcspn(v, "'");
      } else {
        len = strcspn(v, " &\t");
      }
      n = add_secret(secrets, n, 16, v, len);
    }
  }
  for (p = text; *p;) {
    size_t hit = 0;
    for (int i = 0; i < n; i++) {
      size_t k = strlen(secrets[i]);
      if (k > hit && strncmp(p, secrets[i], k) == 0)
        hit = k;
    }
    if (hit) {
      sb_add(&b, "***", 3);
      p += hit;
    } else {
      sb_add(&b, p, 1);
      p++;
    }
  }
  for (int i = 0; i < n; i++)
    free(secrets[i]);
  return sb_finish(&b);
}

int cli_write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Bytes, or with a k, M or G suffix; at most max. */
int cli_parse_size(const char *s, size_t max, size_t *out) {
  char *end = NULL;
  errno = 0;
  if (!s || *s < '0' || *s > '9')
    return -1;
  unsigned long long v = strtoull(s, &end, 10), unit = 1;
  if (errno || end == s)
    return -1;
  if (*end == 'k' || *end == 'K')
    unit = 1024, end++;
  else if (*end == 'M' || *end == 'm')
    unit = 1024 * 1024, end++;
  else if (*end == 'G' || *end == 'g')
    unit = 1024 * 1024 * 1024, end++;
  if (*end || v > max / unit)
    return -1;
  *out = (size_t)(v * unit);
  return 0;
}

/* ---- sealing keys ----------------------------------------------------- */

/* Clears a key's bytes in a way the compiler may not drop. */
static void wipe(void *p, size_t n) {
  volatile unsigned char *v = p;
  while (n--)
    *v++ = 0;
}

static int hex_value(int c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

static int b64_value(int c) {
  return c >= 'A' && c <= 'Z'   ? c - 'A'
         : c >= 'a' && c <= 'z' ? c - 'a' + 26
         : c >= '0' && c <= '9' ? c - '0' + 52
         : c == '+'             ? 62
         : c == '/'             ? 63
                                : -1;
}

/* Standard base64 of exactly 32 bytes: 43 digits and one '='. */
static int b64_key(const unsigned char *s, size_t n, unsigned char key[32]) {
  uint32_t acc = 0;
  int bits = 0;
  size_t out = 0;
  if (n != 44 || s[43] != '=')
    return -1;
  for (size_t i = 0; i < 43; i++) {
    int v = b64_value(s[i]);
    if (v < 0)
      return -1;
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      key[out++] = (unsigned char)(acc >> bits);
    }
  }
  /* The last digit's two spare bits must be zero, so that one key has one
   * base64 form only. */
  return out == 32 && (acc & ((1u << bits) - 1)) == 0 ? 0 : -1;
}

int cli_seal_key_load(const char *path, unsigned char key[32], char *err,
                      size_t errsize) {
  unsigned char buf[130];
  size_t n = 0;
  struct stat st;
  int fd, rc = -1;
  ssize_t got;
  memset(key, 0, 32);
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
    snprintf(err, errsize, "%s: %s", path, strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0) {
    snprintf(err, errsize, "%s: %s", path, strerror(errno));
    goto out;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errsize, "%s: not a regular file", path);
    goto out;
  }
  /* As ssh refuses a private key that others may read: a key that anyone
   * but its owner can read opens every sealed answer for them too. */
  if (st.st_mode & 077) {
    snprintf(err, errsize,
             "%s: permissions %04o are too open: a sealing key must be "
             "readable by its owner only (chmod 600 %s)",
             path, (unsigned)(st.st_mode & 07777), path);
    goto out;
  }
  while (n < sizeof buf && (got = read(fd, buf + n, sizeof buf - n)) != 0) {
    if (got < 0) {
      if (errno == EINTR)
        continue;
      snprintf(err, errsize, "%s: %s", path, strerror(errno));
      goto out;
    }
    n += (size_t)got;
  }
  /* 32 raw bytes, 64 hex digits or base64 of 32 bytes, each with one
   * newline after it or none. Raw bytes are told by their length alone,
   * which neither text form has. */
  if (n == 32 || (n == 33 && buf[32] == '\n')) {
    memcpy(key, buf, 32);
    rc = 0;
    goto out;
  }
  if (n > 0 && buf[n - 1] == '\n')
    n--;
  if (n == 64) {
    rc = 0;
    for (size_t i = 0; i < 32 && rc == 0; i++) {
      int hi = hex_value(buf[2 * i]), lo = hex_value(buf[2 * i + 1]);
      if (hi < 0 || lo < 0)
        rc = -1;
      else
        key[i] = (unsigned char)(hi << 4 | lo);
    }
    if (rc == 0)
      goto out;
  } else if (n == 44 && b64_key(buf, n, key) == 0) {
    rc = 0;
    goto out;
  }
  rc = -1;
  memset(key, 0, 32);
  snprintf(err, errsize,
           "%s: not a sealing key: it must hold 32 bytes, as 32 raw bytes, "
           "64 hex digits or base64 (44 characters), with at most one "
           "newline after them",
           path);
out:
  wipe(buf, sizeof buf);
  close(fd);
  return rc;
}

int cli_seal_apply(idem_store *st, char *const *paths, int n, char *err,
                   size_t errsize) {
  unsigned char(*keys)[IDEM_SEAL_KEY_SIZE];
  int rc = -1;
  if (n <= 0)
    return 0;
  if (!(keys = calloc((size_t)n, sizeof *keys))) {
    snprintf(err, errsize, "out of memory");
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (cli_seal_key_load(paths[i], keys[i], err, errsize) != 0)
      goto out;
  if (idem_store_seal(st, (const unsigned char(*)[IDEM_SEAL_KEY_SIZE])keys,
                      (size_t)n) != IDEM_OK) {
    snprintf(err, errsize, "%s", idem_errmsg());
    goto out;
  }
  rc = 0;
out:
  wipe(keys, (size_t)n * sizeof *keys);
  free(keys);
  return rc;
}
