/*
 * accesslog.c -- one JSON object per line per request; and the store's
 * errors on standard error, at most a line a second.
 *
 * The key and the tenant are written as the first 16 hex digits of their
 * SHA-256, never as they came: a key may be guessable enough to replay
 * someone's response, and the tenant is derived from a credential. The
 * query string is left out for the same reason (tokens travel there).
 *
 * Lines are written with one write(2) to a file opened O_APPEND, so lines
 * of concurrent requests never interleave. SIGHUP reopens the file: the new
 * descriptor replaces the old one with dup2(), so a writer never sees a
 * closed descriptor.
 */
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_fd = -1;
static char *log_path;

static int open_log(const char *path) {
  if (strcmp(path, "-") == 0)
    return dup(STDOUT_FILENO);
  return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
}

int accesslog_open(const char *path) {
  int fd = open_log(path);
  if (fd < 0)
    return -1;
  if (!(log_path = strdup(path))) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  log_fd = fd;
  return 0;
}

int accesslog_reopen(void) {
  int fd;
  if (log_fd < 0 || strcmp(log_path, "-") == 0)
    return 0;
  if ((fd = open_log(log_path)) < 0)
    return -1;
  if (dup2(fd, log_fd) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  close(fd);
  return 0;
}

void accesslog_close(void) {
  if (log_fd >= 0)
    close(log_fd);
  log_fd = -1;
  free(log_path);
  log_path = NULL;
}

/* ms (never negative) rounded to tenths of a millisecond. */
static double tenths(double ms) {
  return ms > 0 ? (double)(long long)(ms * 10 + 0.5) / 10 : 0;
}

static void short_hash(const char *s, char out[17]) {
  char hex[IDEM_FINGERPRINT_SIZE];
  idem_sha256_hex(s, strlen(s), hex);
  memcpy(out, hex, 16);
  out[16] = 0;
}

void accesslog_write(const access_entry *e) {
  struct timeval tv;
  struct tm tm;
  char when[40], kh[17], th[17];
  json_t *o;
  char *line;
  size_t n;

  if (log_fd < 0)
    return;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(when + n, sizeof when - n, ".%03ldZ", (long)(tv.tv_usec / 1000));
  o = json_object();
  if (!o)
    return;
  json_object_set_new(o, "time", json_string(when));
  json_object_set_new(o, "method", json_string(e->method ? e->method : ""));
  json_object_set_new(o, "path", json_string(e->path ? e->path : ""));
  json_object_set_new(o, "outcome", json_string(serve_outcome_name(e->outcome)));
  json_object_set_new(o, "status", json_integer(e->status));
  json_object_set_new(o, "upstream_ms", json_real(tenths(e->upstream_ms)));
  json_object_set_new(o, "total_ms", json_real(tenths(e->total_ms)));
  if (e->key) {
    short_hash(e->key, kh);
    json_object_set_new(o, "key_hash", json_string(kh));
  }
  if (e->tenant) {
    short_hash(e->tenant, th);
    json_object_set_new(o, "tenant_hash", json_string(th));
  }
  if (e->note)
    json_object_set_new(o, "note", json_string(e->note));
  /* Fifteen digits print a number rounded to tenths as it was written
   * (1.4, not the 1.3999999999999999 that the default seventeen show). */
  line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER |
                           JSON_REAL_PRECISION(15));
  json_decref(o);
  if (!line)
    return;
  n = strlen(line);
  line[n] = '\n'; /* replaces the terminator: written by length */
  if (write(log_fd, line, n + 1) < 0) {
    /* A full disk must not stop the gateway; the request was answered. */
  }
  free(line);
}

/* ---- store errors ---------------------------------------------------------- */

int serve_rate_pass(serve_rate *r, unsigned long *left_out) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  pthread_mutex_lock(&r->mu);
  if (r->any && (now.tv_sec - r->last.tv_sec) * 1000000000L +
                        (now.tv_nsec - r->last.tv_nsec) <
                    1000000000L) {
    r->left_out++;
    pthread_mutex_unlock(&r->mu);
    return 0;
  }
  *left_out = r->left_out;
  r->left_out = 0;
  r->last = now;
  r->any = 1;
  pthread_mutex_unlock(&r->mu);
  return 1;
}

static serve_rate store_log = SERVE_RATE_INIT;

void serve_log_store_error(const char *what, int rc, const char *detail) {
  unsigned long left_out;
  char line[1400], more[96] = "";
  int n;
  /* A failing store fails every request: one line each would flood the
   * log (and the disk, which may be the very trouble). */
  if (!serve_rate_pass(&store_log, &left_out))
    return;
  if (left_out)
    snprintf(more, sizeof more,
             " (%lu more store errors since the last line, not logged)",
             left_out);
  /* libidem's details are at most 511 bytes: the line always fits. */
  n = snprintf(line, sizeof line,
               "idem serve: store error (%.40s): %s: %.1024s%s\n", what,
               idem_rc_name(rc), detail && *detail ? detail : "-", more);
  if (n < 0 || (size_t)n >= sizeof line)
    return;
  /* One write, so that lines of other threads never interleave with it. */
  if (write(STDERR_FILENO, line, (size_t)n) < 0) {
    /* Nowhere left to say it. */
  }
}
