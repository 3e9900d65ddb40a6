/*
 * conn.c -- the SQLite store's connections: opening one and its pragmas,
 * the pool of readers, statements prepared once, and SQLite's errors as
 * idem's.
 */
#include "sqlite.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------ */

int idem__sq_map_rc(int src) {
  switch (src & 0xff) {
  case SQLITE_BUSY:
  case SQLITE_LOCKED:
    return IDEM_EBUSY;
  case SQLITE_NOMEM:
    return IDEM_ENOMEM;
  case SQLITE_TOOBIG:
    return IDEM_ETOOBIG;
  case SQLITE_CORRUPT:
  case SQLITE_NOTADB:
    return IDEM_ESTORE;
  /* The disk failed the store (a read, a write, an fsync) or is full: the
   * call's transaction was rolled back, and a retry may work once the
   * disk does. */
  case SQLITE_IOERR:
  case SQLITE_FULL:
    return IDEM_EIO;
  default:
    return IDEM_ESTORE;
  }
}

/*
 * SQLite's message for db's last error; for an I/O error also what the
 * system said when that names a disk's trouble ("disk I/O error (No space
 * left on device)"), which SQLite's text leaves out. (SQLite reads errno
 * some time after the failed call, so other values may be another call's
 * and are not shown.) Uses buf.
 */
const char *idem__sq_errtext(sqlite3 *db, char *buf, size_t size) {
  int src = sqlite3_extended_errcode(db) & 0xff, sys = sqlite3_system_errno(db);
  if ((src == SQLITE_IOERR || src == SQLITE_CANTOPEN) &&
      (sys == ENOSPC || sys == EDQUOT || sys == EIO || sys == EROFS ||
       sys == EFBIG))
    snprintf(buf, size, "%s (%s)", sqlite3_errmsg(db), strerror(sys));
  else
    snprintf(buf, size, "%s", sqlite3_errmsg(db));
  return buf;
}

int idem__sq_op_sqlite_fail(idem__op *op, conn *c, const char *what) {
  int src = sqlite3_extended_errcode(c->db);
  char buf[384];
  return idem__op_fail(op, idem__sq_map_rc(src), "sqlite: %s: %s", what,
                       idem__sq_errtext(c->db, buf, sizeof buf));
}

int idem__sq_sqlite_fail(conn *c, const char *what) {
  int src = sqlite3_extended_errcode(c->db);
  char buf[384];
  return idem__fail(idem__sq_map_rc(src), "sqlite: %s: %s", what,
                    idem__sq_errtext(c->db, buf, sizeof buf));
}

/* ---- connections ----------------------------------------------------- */

void idem__sq_conn_close(conn *c) {
  if (!c)
    return;
  for (int i = 0; i < ST_COUNT; i++)
    sqlite3_finalize(c->st[i]);
  sqlite3_close(c->db);
  free(c);
}

int idem__sq_exec(conn *c, const char *sql) {
  return sqlite3_exec(c->db, sql, NULL, NULL, NULL);
}

/*
 * "file:PATH?immutable=1" with the characters a URI gives a meaning to
 * escaped. NULL when out of memory.
 */
static char *immutable_uri(const char *path) {
  size_t n = strlen(path);
  char *u = malloc(3 * n + 32), *o;
  if (!u)
    return NULL;
  o = u + sprintf(u, "file:");
  for (const char *p = path; *p; p++) {
    unsigned char ch = (unsigned char)*p;
    if (ch == '%' || ch == '?' || ch == '#' || ch < 0x21 || ch > 0x7e)
      o += sprintf(o, "%%%02X", ch);
    else
      *o++ = (char)ch;
  }
  strcpy(o, "?immutable=1");
  return u;
}

/*
 * A reader who may not write the store's folder cannot create the shared
 * memory file that WAL needs. When no such file exists, no connection has
 * the store open, and the file alone is the whole store: it is then read
 * as immutable. (A writer that starts meanwhile writes to its log, which
 * this reader does not see until it opens the store again.)
 */
static int reopen_immutable(sq_store *s, conn *c) {
  char shm[4096];
  char *uri;
  int rc;
  if (snprintf(shm, sizeof shm, "%s-shm", s->path) >= (int)sizeof shm ||
      access(shm, F_OK) == 0 || errno != ENOENT)
    return SQLITE_CANTOPEN;
  if (!(uri = immutable_uri(s->path)))
    return SQLITE_NOMEM;
  sqlite3_close(c->db);
  c->db = NULL;
  rc = sqlite3_open_v2(
      uri, &c->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI | SQLITE_OPEN_NOMUTEX,
      NULL);
  free(uri);
  if (rc == SQLITE_OK) {
    sqlite3_extended_result_codes(c->db, 1);
    rc = idem__sq_exec(c, "SELECT count(*) FROM sqlite_schema");
  }
  return rc;
}

/* A commit hook: counts the connection's commits. */
static int count_commit(void *arg) {
  (*(unsigned *)arg)++;
  return 0;
}

/* The folder of the store's file: where SQLite makes its -wal and -shm
 * files. */
void idem__sq_folder_of(const char *path, char *buf, size_t size) {
  const char *slash = strrchr(path, '/');
  snprintf(buf, size, "%.*s",
           slash ? (int)(slash == path ? 1 : slash - path) : 1,
           slash ? path : ".");
}

int idem__sq_conn_open(sq_store *s, conn **out) {
  char buf[384];
  conn *c = calloc(1, sizeof *c);
  const char *sync = s->o.sqlite_synchronous == IDEM_SYNC_NORMAL
                         ? "PRAGMA synchronous=NORMAL"
                         : "PRAGMA synchronous=FULL";
  int rc;
  *out = NULL;
  if (!c)
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  c->store = s;
  rc = sqlite3_open_v2(
      s->path, &c->db,
      (s->o.read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) |
          SQLITE_OPEN_NOMUTEX,
      NULL);
  if (rc != SQLITE_OK) {
    rc = idem__fail(idem__sq_map_rc(rc), "store '%s': cannot open: %s", s->path,
                    c->db ? idem__sq_errtext(c->db, buf, sizeof buf)
                          : sqlite3_errstr(rc));
    idem__sq_conn_close(c);
    return rc;
  }
  sqlite3_extended_result_codes(c->db, 1);
  sqlite3_busy_timeout(c->db, s->o.busy_timeout_ms);
  sqlite3_commit_hook(c->db, count_commit, &c->commits);
  if (!s->o.read_only)
    sqlite3_wal_hook(c->db, idem__sq_wal_hook_inline, s);
  /* The first statement reads the file header: a file that is not a
   * database fails here, before anything could be written to it. Switching
   * a new file to WAL needs a moment alone with it, and SQLite does not call
   * the busy handler for that, so wait here as the busy timeout says. */
  for (int waited = 0;; waited += 10) {
    /* A reader leaves the journal mode as the writers set it. */
    rc = idem__sq_exec(c, s->o.read_only ? "SELECT count(*) FROM sqlite_schema"
                                         : "PRAGMA journal_mode=WAL");
    if ((rc & 0xff) != SQLITE_BUSY || waited >= s->o.busy_timeout_ms)
      break;
    sqlite3_sleep(10);
  }
  if (s->o.read_only &&
      ((rc & 0xff) == SQLITE_CANTOPEN || (rc & 0xff) == SQLITE_READONLY))
    rc = reopen_immutable(s, c);
  if (rc != SQLITE_OK || idem__sq_exec(c, sync) != SQLITE_OK) {
    int src = sqlite3_extended_errcode(c->db);
    char folder[4096];
    /* The usual reason a writable file cannot be written: WAL makes its
     * -wal and -shm files beside it, in a folder that is read-only. */
    idem__sq_folder_of(s->path, folder, sizeof folder);
    if (!s->o.read_only &&
        ((src & 0xff) == SQLITE_READONLY || (src & 0xff) == SQLITE_CANTOPEN) &&
        faccessat(AT_FDCWD, folder, W_OK, AT_EACCESS) != 0)
      rc =
          idem__fail(IDEM_ESTORE,
                     "store '%s': its folder '%s' is not writable, and the "
                     "store must create its -wal and -shm files there (%s); "
                     "make the folder writable, or open the store "
                     "read-only",
                     s->path, folder, idem__sq_errtext(c->db, buf, sizeof buf));
    else
      rc = idem__fail(idem__sq_map_rc(src), "store '%s': %s", s->path,
                      idem__sq_errtext(c->db, buf, sizeof buf));
    idem__sq_conn_close(c);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

int idem__sq_pool_get(sq_store *s, conn **out) {
  conn *c = NULL;
  int rc;
  *out = NULL;
  pthread_mutex_lock(&s->pool_mu);
  while (!s->idle && s->nconn >= s->o.max_connections)
    pthread_cond_wait(&s->pool_cv, &s->pool_mu);
  if (s->idle) {
    c = s->idle;
    s->idle = c->next;
    pthread_mutex_unlock(&s->pool_mu);
    *out = c;
    return IDEM_OK;
  }
  s->nconn++;
  pthread_mutex_unlock(&s->pool_mu);
  rc = idem__sq_conn_open(s, &c);
  if (rc != IDEM_OK) {
    pthread_mutex_lock(&s->pool_mu);
    s->nconn--;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

void idem__sq_pool_put(sq_store *s, conn *c) {
  if (!c)
    return;
  /* Never hand out a connection inside a transaction. */
  if (!sqlite3_get_autocommit(c->db))
    idem__sq_exec(c, "ROLLBACK");
  pthread_mutex_lock(&s->pool_mu);
  c->next = s->idle;
  s->idle = c;
  pthread_cond_signal(&s->pool_cv);
  pthread_mutex_unlock(&s->pool_mu);
}
