/* util.c -- small helpers shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  char *end = NULL;
  double v;
  double unit = 1000;
  if (!s || !*s)
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || v < 0)
    return -1;
  if (strcmp(end, "ms") == 0)
    unit = 1;
  else if (strcmp(end, "s") == 0 || *end == '\0')
    unit = 1000;
  else if (strcmp(end, "m") == 0)
    unit = 60e3;
  else if (strcmp(end, "h") == 0)
    unit = 3600e3;
  else if (strcmp(end, "d") == 0)
    unit = 86400e3;
  else
    return -1;
  v *= unit;
  if (v > 9e15)
    return -1;
  *ms = (int64_t)v;
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

const char *cli_store_url(const char *flag) {
  const char *env = getenv("IDEM_STORE");
  if (flag && *flag)
    return flag;
  if (env && *env)
    return env;
  return "./idem.db";
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
