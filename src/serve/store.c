/*
 * store.c -- the gateway's store at start: opened, named on standard
 * error, and never replaced by an empty one unasked.
 *
 * An SQLite store is a file. Deleted or moved by mistake, it would be made
 * again, empty, by the next start, and every key it held would act again
 * on its next retry. So the start that makes a store leaves a marker
 * beside it, and a later start that finds the marker but not the store
 * refuses, saying why, unless --create-store says that an empty store is
 * what the operator wants. The marker is hidden (.NAME.idem-serve), so
 * that `rm gw.db*` or `rm *` meant for the store leaves it; a store made
 * before markers existed gets one at its next start.
 *
 * A PostgreSQL store is not a file here: a dropped schema is made again
 * as idem_store_open() always did. Its URL is printed with the password
 * as ***.
 */
#include "cli.h"
#include "serve.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* The file an SQLite store URL names ("sqlite:PATH", "sqlite:///PATH" or a
 * bare PATH), or NULL for any other URL; libidem's own parsing decides
 * what the others are. */
static const char *sqlite_file(const char *url) {
  size_t n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                         "0123456789+.-");
  if (n > 0 && url[n] == ':') {
    if (n != 6 || strncasecmp(url, "sqlite", 6) != 0)
      return NULL;
    url += 7;
    return strncmp(url, "//", 2) == 0 ? url + 2 : url;
  }
  return url;
}

/* The absolute form of path, whose file may be missing: its folder
 * resolved, its last part kept. */
static void absolute(const char *path, char *out, size_t size) {
  char folder[PATH_MAX], real[PATH_MAX];
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  snprintf(folder, sizeof folder, "%.*s",
           slash ? (int)(slash == path ? 1 : slash - path) : 1,
           slash ? path : ".");
  if (!realpath(folder, real) ||
      snprintf(out, size, "%s%s%s", real, strcmp(real, "/") ? "/" : "",
               base) >= (int)size)
    snprintf(out, size, "%s", path);
}

/* The marker of the store at abs (an absolute path). */
static void marker_of(const char *abs, char *out, size_t size) {
  const char *slash = strrchr(abs, '/');
  snprintf(out, size, "%.*s.%s.idem-serve", (int)(slash - abs + 1), abs,
           slash + 1);
}

/* Writes the marker; a failure is said, not fatal: the store itself is
 * open and works. */
static void write_marker(const char *marker, const char *abs) {
  char text[PATH_MAX + 1024], when[32];
  time_t now = time(NULL);
  struct tm tm;
  int fd, n;
  gmtime_r(&now, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  n = snprintf(text, sizeof text,
               "idem serve made or used the idempotency store %s\n"
               "(first noted %s). While this file exists, idem serve\n"
               "refuses to start when that store is missing: a store\n"
               "deleted or moved by mistake must not be replaced by an\n"
               "empty one, since every key it held would act again.\n"
               "To start over with an empty store on purpose, start once\n"
               "with --create-store, or delete this file.\n",
               abs, when);
  fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || n < 0 || cli_write_all(fd, text, (size_t)n) != 0 ||
      fsync(fd) != 0)
    cli_error("serve", "warning: cannot write %s: %s; a later start could "
                       "not tell that the store was deleted",
              marker, strerror(errno));
  if (fd >= 0)
    close(fd);
}

int serve_store_open(const serve_config *cfg, const idem_store_options *opts,
                     idem_store **out, char *name, size_t name_size) {
  const char *url = cli_store_url(cfg->store_url); /* --store, IDEM_STORE, ./idem.db */
  const char *file = url && *url ? sqlite_file(url) : NULL;
  char abs[PATH_MAX], marker[PATH_MAX + 32];
  struct stat st;
  int missing = 0, marked = 0, rc;

  if (file && *file) {
    absolute(file, abs, sizeof abs);
    marker_of(abs, marker, sizeof marker);
    missing = stat(abs, &st) != 0 && errno == ENOENT;
    marked = stat(marker, &st) == 0;
    if (missing && marked && !cfg->create_store) {
      char when[32];
      struct tm tm;
      gmtime_r(&st.st_mtime, &tm);
      strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
      cli_error("serve",
                "the store %s is missing, but %s says that idem serve used "
                "a store there (noted %s): it was deleted or moved, or its "
                "disk is not mounted. An empty store in its place would "
                "forget every key it held, and their retries would act "
                "again. Restore the store (with its -wal file), or start "
                "with --create-store to begin with an empty one.",
                abs, marker, when);
      return -1;
    }
  }
  if ((rc = idem_store_open(url, opts, out)) != IDEM_OK) {
    cli_idem_error("serve", "cannot open the store", rc);
    return -1;
  }
  if (file && *file && strcmp(idem_store_backend(*out), "sqlite") == 0) {
    /* Resolved again now that the file exists (a symbolic link). */
    char real[PATH_MAX];
    if (realpath(abs, real))
      snprintf(abs, sizeof abs, "%s", real);
    snprintf(name, name_size, "sqlite:%s", abs);
    if (missing)
      fprintf(stderr, "idem serve: new store %s (created; %s keeps a later "
                      "start from making another in its place)\n",
              name, marker);
    if (missing || !marked)
      write_marker(marker, abs);
  } else {
    char *shown = url ? cli_redact(url, url) : NULL;
    snprintf(name, name_size, "%s", shown ? shown : idem_store_backend(*out));
    free(shown);
  }
  return 0;
}
