/*
 * store.c -- the SQLite store's method table, open and close.
 */
#include "sqlite.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- open and close ------------------------------------------------------ */

static void sq_close(void *state) {
  sq_store *s = state;
  conn *c;
  if (!s)
    return;
  /* A child of fork() lets go of its parent's handle and leaves it as it
   * is: sqlite3_close() there could checkpoint or remove the log of the
   * parent's connections, or wait on a mutex of SQLite's that a thread of
   * the parent's held at the fork; the leaders and the checkpointer are not
   * in the child (a join, or pthread_cond_destroy() on a condition one of
   * them waited on, would never return). The files stay open in the child
   * (close-on-exec) and never drop the parent's locks; the memory stays,
   * shared with the parent until one of them writes it. */
  if (idem__closing_forked())
    return;
  if (s->async_started) {
    pthread_mutex_lock(&s->gc_mu);
    s->async_stop = 1;
    pthread_cond_broadcast(&s->async_cv);
    pthread_mutex_unlock(&s->gc_mu);
    for (int i = 0; i < s->async_started; i++)
      pthread_join(s->async_threads[i], NULL);
  }
  if (s->ckpt_running) {
    pthread_mutex_lock(&s->gc_mu);
    s->ckpt_stop = 1;
    pthread_cond_signal(&s->ckpt_cv);
    pthread_mutex_unlock(&s->gc_mu);
    pthread_join(s->ckpt_thread, NULL);
  }
  /* After a failed checkpoint the last connection to close must not copy
   * the log and delete it: see idem__sq_ckpt_check(). */
  if (s->ckpt_broken) {
    for (c = s->idle; c; c = c->next)
      sqlite3_db_config(c->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, NULL);
    if (s->ckpt_conn)
      sqlite3_db_config(s->ckpt_conn->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1,
                        NULL);
    if (s->writer)
      sqlite3_db_config(s->writer->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1,
                        NULL);
  }
  idem__sq_conn_close(s->ckpt_conn);
  while ((c = s->idle)) {
    s->idle = c->next;
    idem__sq_conn_close(c);
  }
  idem__sq_conn_close(s->writer);
  idem__cache_free(s->cache);
  pthread_mutex_destroy(&s->pool_mu);
  pthread_cond_destroy(&s->pool_cv);
  pthread_mutex_destroy(&s->gc_mu);
  pthread_cond_destroy(&s->gc_cv);
  pthread_cond_destroy(&s->gather_cv);
  pthread_cond_destroy(&s->ckpt_cv);
  pthread_cond_destroy(&s->async_cv);
  free(s->path);
  free(s);
}

/*
 * Creates a missing store file with mode 0600 before SQLite opens it: the
 * store holds requests and outputs, and SQLite gives its -wal and -shm
 * files the mode of the database file. An existing file keeps its mode.
 */
static int create_private(const char *path) {
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    close(fd);
    return IDEM_OK;
  }
  if (errno == EEXIST)
    return IDEM_OK;
  return idem__fail(IDEM_ESTORE, "store '%s': cannot create the file: %s", path,
                    strerror(errno));
}

static int sq_open(const char *target, const idem_store_options *opts,
                   void **state) {
  sq_store *s;
  conn *c = NULL;
  int rc;
  *state = NULL;
  if (strcmp(target, ":memory:") == 0 || strncmp(target, "file:", 5) == 0)
    return idem__fail(IDEM_EURL,
                      "store '%s': SQLite's special names are not stores "
                      "(an in-memory database would be private to one "
                      "connection); give a file path",
                      target);
  {
    struct stat st;
    if (stat(target, &st) == 0 && S_ISDIR(st.st_mode))
      return idem__fail(IDEM_ESTORE,
                        "store '%s' is a directory; name a file (for "
                        "example %s/idem.db)",
                        target, target);
  }
  if (!opts->read_only && (rc = create_private(target)) != IDEM_OK)
    return rc;
  s = calloc(1, sizeof *s);
  if (!s)
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  s->o = *opts;
  if (s->o.busy_timeout_ms <= 0)
    s->o.busy_timeout_ms = 10000;
  if (s->o.max_connections <= 0)
    s->o.max_connections = 16;
  s->path = idem__strdup(target);
  s->cache = idem__cache_new(s->o.replay_cache_entries);
  pthread_mutex_init(&s->pool_mu, NULL);
  pthread_cond_init(&s->pool_cv, NULL);
  pthread_mutex_init(&s->gc_mu, NULL);
  pthread_cond_init(&s->gc_cv, NULL);
  pthread_cond_init(&s->async_cv, NULL);
  {
    /* Their timed waits count on the monotonic clock, which nobody sets
     * back. */
    pthread_condattr_t mono;
    pthread_condattr_init(&mono);
    pthread_condattr_setclock(&mono, CLOCK_MONOTONIC);
    pthread_cond_init(&s->gather_cv, &mono);
    pthread_cond_init(&s->ckpt_cv, &mono);
    pthread_condattr_destroy(&mono);
  }
  s->ckpt_next = CKPT_FRAMES;
  snprintf(s->version, sizeof s->version, "%s", sqlite3_libversion());
  if (!s->path || (!s->cache && s->o.replay_cache_entries >= 0)) {
    sq_close(s);
    return idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
  }
  rc = idem__sq_conn_open(s, &c);
  if (rc == IDEM_OK)
    rc = idem__sq_ensure_schema(s, c);
  if (rc == IDEM_OK) {
    /* From now on the file is named as SQLite resolved it: connections
     * opened later, and the log's check, must find this very file even
     * after the process changes its working folder. */
    const char *full = sqlite3_db_filename(c->db, "main");
    char *copy = full && *full ? idem__strdup(full) : NULL;
    if (full && *full && !copy) {
      rc = idem__fail(IDEM_ENOMEM, "sqlite: out of memory");
    } else if (copy) {
      free(s->path);
      s->path = copy;
    }
  }
  if (rc != IDEM_OK) {
    idem__sq_conn_close(c);
    sq_close(s);
    return rc;
  }
  s->nconn = 1;
  c->next = NULL;
  s->idle = c;
  if (!s->o.read_only)
    idem__sq_note_files(s);
  if (s->o.group_commit >= 0 && !s->o.read_only) {
    rc = idem__sq_conn_open(s, &s->writer);
    if (rc != IDEM_OK) {
      sq_close(s);
      return rc;
    }
    /* The checkpoint thread's connection is opened here, so that a thread
     * that could not work never replaces the writer's own checkpoints.
     * Without it the writer keeps SQLite's automatic checkpoint. */
    if (idem__sq_conn_open(s, &s->ckpt_conn) == IDEM_OK &&
        idem__thread_start(&s->ckpt_thread, "idem-checkpoint",
                           idem__sq_checkpointer, s) == 0) {
      s->ckpt_running = 1;
      sqlite3_wal_hook(s->writer->db, idem__sq_wal_hook, s);
    } else {
      idem__sq_conn_close(s->ckpt_conn);
      s->ckpt_conn = NULL;
      idem__clear_error();
    }
  }
  *state = s;
  return IDEM_OK;
}

static const char *sq_engine_version(void *state) {
  return ((sq_store *)state)->version;
}

const idem__store_methods idem__sqlite_methods = {
    IDEM__STORE_METHODS_VERSION,
    "sqlite",
    sq_open,
    sq_close,
    sq_engine_version,
    idem__sq_run,
    idem__sq_get,
    idem__sq_list,
    idem__sq_prune,
    idem__sq_resolve,
    idem__sq_remove,
    idem__sq_run_many,
    NULL, /* watch: waiters of other processes poll */
    idem__sq_clock_ahead,
    idem__sq_check,
    idem__sq_queue,
    idem__sq_cached,
    NULL, /* interrupt_renewals: a renewal waits for the file's lock at
             most the busy timeout */
    idem__sq_run_in,
};
