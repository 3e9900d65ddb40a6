/*
 * maintenance.c -- the SQLite store's upkeep: checkpoints, retention,
 * the store's files watched while it is open, the readiness check, and
 * the operators' writes (prune, resolve, delete).
 */
#include "sqlite.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

/*
 * Removes some retention-expired records inside the batch's transaction.
 * Returns SQLITE_OK, or the error that ended the whole transaction (SQLite
 * rolls it back by itself on an I/O error), its text in why.
 */
int idem__sq_prune_some(sq_store *s, conn *c, int64_t now, char *why,
                        size_t size) {
  sqlite3_stmt *q;
  int due, src = SQLITE_OK;
  /* Without group commit, batches of several threads run at once. */
  pthread_mutex_lock(&s->gc_mu);
  due = now - s->last_prune_ms >= IDEM__PRUNE_EVERY_MS;
  if (due)
    s->last_prune_ms = now;
  pthread_mutex_unlock(&s->gc_mu);
  if (!due)
    return SQLITE_OK;
  if (idem__sq_exec(c, "SAVEPOINT idem_prune") != SQLITE_OK)
    return SQLITE_OK;
  q = idem__sq_stmt(c, ST_PRUNE_SOME);
  if (q) {
    sqlite3_bind_int64(q, 1, now);
    sqlite3_bind_int64(q, 15, idem__boot_ms());
    if (sqlite3_step(q) != SQLITE_DONE) {
      src = sqlite3_extended_errcode(c->db);
      idem__sq_errtext(c->db, why, size);
    }
    sqlite3_reset(q);
  }
  if (sqlite3_get_autocommit(c->db))
    return src != SQLITE_OK ? src : SQLITE_ERROR;
  if (src != SQLITE_OK)
    idem__sq_exec(c, "ROLLBACK TO idem_prune");
  idem__sq_exec(c, "RELEASE idem_prune");
  return SQLITE_OK;
}

/*
 * The device and inode of a file (the -wal file, the database); 0 if it
 * cannot be read. statx() asked for STATX_INO alone reads no timestamp.
 * stat() reads them all, and since Linux 6.13 (multigrain timestamps) a
 * file whose times were read gets fine-grained ones at its next write: the
 * log's inode is dirtied by every commit and fdatasync writes it too
 * (bench/stat_fsync.c). It syncs as
 * stat() does (not AT_STATX_DONT_SYNC): a network filesystem's cached
 * answer could hide the very deletion looked for. stat() where statx() is
 * missing (C library before glibc 2.28) or fails (ENOSYS, a seccomp EPERM).
 */
static int file_id(const char *path, dev_t *dev, ino_t *ino) {
  struct stat st;
#ifdef STATX_INO
  struct statx stx;
  if (statx(AT_FDCWD, path, AT_STATX_SYNC_AS_STAT, STATX_INO, &stx) == 0 &&
      (stx.stx_mask & STATX_INO)) {
    *dev = makedev(stx.stx_dev_major, stx.stx_dev_minor);
    *ino = (ino_t)stx.stx_ino;
    return 1;
  }
#endif
  if (stat(path, &st) != 0)
    return 0;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return 1;
}

/* Notes the database and log files that the store's connections have
 * open. */
void idem__sq_note_files(sq_store *s) {
  char wal[4096];
  if (snprintf(wal, sizeof wal, "%s-wal", s->path) < (int)sizeof wal &&
      file_id(wal, &s->wal_dev, &s->wal_ino))
    s->wal_known = 1;
  if (file_id(s->path, &s->db_dev, &s->db_ino))
    s->db_known = 1;
}

/*
 * Whether the database file and its log are still the ones the store
 * opened. SQLite never deletes the log while a connection has it open, so a
 * log that is gone or another file means someone deleted it: the commits it
 * held are lost to every process that opens the store from now on, and the
 * keys they completed would act again. A database file deleted, moved or
 * replaced takes every record with it in the same way. Nothing more is
 * written through this handle.
 */
int idem__sq_files_intact(sq_store *s, char *why, size_t size) {
  char wal[4096];
  dev_t dev;
  ino_t ino;
  /* The database file first: with it gone, every write is lost, and a
   * store opened at the path afterwards (a restart) starts empty. */
  if (s->db_known &&
      !(file_id(s->path, &dev, &ino) && dev == s->db_dev && ino == s->db_ino)) {
    snprintf(why, size,
             "store '%.160s': the database file was deleted, moved or "
             "replaced while the store was open; what this handle wrote "
             "would be lost when it closes and keys it completed could act "
             "again, so it writes nothing more. Check what ran, then "
             "reopen the store (restoring the file first if it was "
             "deleted by mistake)",
             s->path);
    return 0;
  }
  if (!s->wal_known)
    return 1;
  snprintf(wal, sizeof wal, "%s-wal", s->path);
  if (file_id(wal, &dev, &ino) && dev == s->wal_dev && ino == s->wal_ino)
    return 1;
  snprintf(why, size,
           "store '%.160s': its write-ahead log (the -wal file) was deleted "
           "or replaced while the store was open; the most recent records "
           "may be lost and keys they completed could act again, so this "
           "handle writes nothing more. Check what ran, then reopen the "
           "store",
           s->path);
  return 0;
}

/* ---- checkpoints --------------------------------------------------------- */

/*
 * A checkpoint whose fsync failed stops every later checkpoint of this
 * handle. The checkpoints before it that a reader kept from finishing wrote
 * database pages without syncing them, and counted their frames as copied;
 * a failed fsync may have forgotten those pages (as Linux does after a
 * writeback error), and no later checkpoint copies those frames again. Were
 * the log then to start over, a power loss would lose acknowledged commits
 * or corrupt the file: one in a few thousand power-loss trials with faults
 * did (tests/test_powerloss.c --faults). So, as PostgreSQL does after a
 * failed fsync, the log keeps every frame from then on: commits go on being
 * synced to it, nothing restarts it, and closing the handle leaves it as it
 * is. The next open of the store rebuilds the log's index, which copies
 * every frame again. The log grows until then: a process that meets this
 * should be restarted.
 */
void idem__sq_ckpt_check(sq_store *s, int rc) {
  if (rc != SQLITE_IOERR_FSYNC)
    return;
  pthread_mutex_lock(&s->gc_mu);
  s->ckpt_broken = 1;
  s->restart_due = 0;
  pthread_mutex_unlock(&s->gc_mu);
}

/* The checkpoint of a connection without the checkpoint thread (a pool
 * connection's write, or a writer whose thread could not start): SQLite's
 * automatic checkpoint, with its result seen by idem__sq_ckpt_check(). */
int idem__sq_wal_hook_inline(void *arg, sqlite3 *db, const char *name,
                             int frames) {
  sq_store *s = arg;
  int broken;
  (void)name;
  if (frames < CKPT_FRAMES)
    return SQLITE_OK;
  pthread_mutex_lock(&s->gc_mu);
  broken = s->ckpt_broken;
  pthread_mutex_unlock(&s->gc_mu);
  if (!broken)
    idem__sq_ckpt_check(s, sqlite3_wal_checkpoint_v2(db, NULL,
                                                     SQLITE_CHECKPOINT_PASSIVE,
                                                     NULL, NULL));
  return SQLITE_OK;
}

/* Called after each commit of the writer: asks for a checkpoint once the
 * log holds enough frames. Installing it turns the writer's automatic
 * checkpoint off. */
int idem__sq_wal_hook(void *arg, sqlite3 *db, const char *name, int frames) {
  sq_store *s = arg;
  (void)db;
  (void)name;
  pthread_mutex_lock(&s->gc_mu);
  /* Ask once per CKPT_FRAMES new frames, not after every commit: a log that
   * cannot restart yet (a reader still uses it) stays long, and asking on
   * every commit would checkpoint on every commit. */
  if (frames < s->ckpt_seen)
    s->ckpt_next = CKPT_FRAMES; /* the log restarted */
  s->ckpt_seen = frames;
  if (frames >= s->ckpt_next) {
    s->ckpt_next = frames + CKPT_FRAMES;
    s->ckpt_wanted = 1;
    pthread_cond_signal(&s->ckpt_cv);
  }
  pthread_mutex_unlock(&s->gc_mu);
  return SQLITE_OK;
}

void *idem__sq_checkpointer(void *arg) {
  sq_store *s = arg;
  conn *c = s->ckpt_conn;
  pthread_mutex_lock(&s->gc_mu);
  while (!s->ckpt_stop) {
    if (!s->ckpt_wanted) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until);
      until.tv_sec += CKPT_PERIOD_MS / 1000;
      pthread_cond_timedwait(&s->ckpt_cv, &s->gc_mu, &until);
      if (s->ckpt_stop)
        break;
    }
    s->ckpt_wanted = 0;
    int broken = s->ckpt_broken;
    pthread_mutex_unlock(&s->gc_mu);
    /* PASSIVE copies the log into the database without blocking anyone. */
    int log = 0, done = 0, rc = SQLITE_OK;
    if (!broken)
      rc = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE,
                                     &log, &done);
    pthread_mutex_lock(&s->gc_mu);
    if (rc == SQLITE_OK && log > 0 && !s->ckpt_broken)
      s->restart_due = 1;
    pthread_mutex_unlock(&s->gc_mu);
    idem__sq_ckpt_check(s, rc);
    pthread_mutex_lock(&s->gc_mu);
  }
  pthread_mutex_unlock(&s->gc_mu);
  return NULL;
}

/* An operator's write through a handle whose log was deleted would go
 * into the lost log and vanish when the store closes: IDEM_ESTORE. */
static int operator_may_write(sq_store *s, conn *c) {
  char why[512];
  if (!idem__sq_files_intact(s, why, sizeof why))
    return idem__fail(IDEM_ESTORE, "%s", why);
  return idem__sq_schema_unchanged(s, c);
}

/*
 * Begins an operator's write transaction and checks, inside it, that the
 * handle may write (the version read under the write lock, so that no
 * migration can come between the check and the write). IDEM_OK with the
 * transaction open, or the error with none.
 */
static int operator_begin(sq_store *s, conn *c) {
  int rc;
  if (idem__sq_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
    return idem__sq_sqlite_fail(c, "begin");
  if ((rc = operator_may_write(s, c)) != IDEM_OK)
    idem__sq_exec(c, "ROLLBACK");
  return rc;
}

/* Commits what operator_begin() began when rc is IDEM_OK, else rolls it
 * back. Returns the result. */
static int operator_end(conn *c, int rc) {
  if (rc == IDEM_OK && idem__sq_exec(c, "COMMIT") != SQLITE_OK)
    rc = idem__sq_sqlite_fail(c, "commit");
  if (!sqlite3_get_autocommit(c->db))
    idem__sq_exec(c, "ROLLBACK");
  return rc;
}

int idem__sq_prune(void *state, int64_t *removed) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int64_t n = 0;
  int rc = idem__sq_pool_get(s, &c);
  if (rc != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) != IDEM_OK) {
    idem__sq_pool_put(s, c);
    return rc;
  }
  q = idem__sq_stmt(c, ST_PRUNE);
  if (!q) {
    rc = idem__sq_sqlite_fail(c, "prepare");
  } else {
    sqlite3_bind_int64(q, 1, idem__now_ms());
    sqlite3_bind_int64(q, 15, idem__boot_ms());
    if (sqlite3_step(q) != SQLITE_DONE)
      rc = idem__sq_sqlite_fail(c, "prune");
    else
      n = sqlite3_changes(c->db);
    sqlite3_reset(q);
  }
  if ((rc = operator_end(c, rc)) == IDEM_OK)
    *removed = n;
  idem__sq_pool_put(s, c);
  return rc;
}

int idem__sq_resolve(void *state, const idem_id *id, const idem_response *r,
                     const idem_resolve_options *o) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  char fp[IDEM_FINGERPRINT_SIZE] = "", sum[IDEM_FINGERPRINT_SIZE];
  int found = 0, st = 0, step;
  int64_t now, lease = 0;
  int rc = idem__sq_pool_get(s, &c);
  if (rc != IDEM_OK)
    return rc;
  if (idem__sq_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK) {
    rc = idem__sq_sqlite_fail(c, "begin");
    idem__sq_pool_put(s, c);
    return rc;
  }
  if ((rc = operator_may_write(s, c)) != IDEM_OK)
    goto out;
  now = idem__now_ms();
  q = idem__sq_stmt(c, ST_SELECT);
  if (!q) {
    rc = idem__sq_sqlite_fail(c, "prepare");
    goto out;
  }
  idem__sq_bind_id(q, id, 1);
  step = sqlite3_step(q);
  if (step == SQLITE_ROW) {
    found = 1;
    snprintf(fp, sizeof fp, "%s", (const char *)sqlite3_column_text(q, 0));
    st = sqlite3_column_int(q, 1);
    lease = sqlite3_column_int64(q, 3);
  } else if (step != SQLITE_DONE) {
    rc = idem__sq_sqlite_fail(c, "read record");
    sqlite3_reset(q);
    goto out;
  }
  sqlite3_reset(q);
  if (!found) {
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_COMPLETED) {
    rc = idem__fail(IDEM_ESTATE,
                    "record (%s, %s, %s) is already completed; nothing to "
                    "resolve",
                    id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  /* Leases are on the boot-time clock. */
  if (st == IDEM_STATE_IN_PROGRESS && lease > idem__boot_ms() && !o->force) {
    rc = idem__fail(IDEM_ESTATE,
                    "record (%s, %s, %s) is held by a run whose lease ends "
                    "in %.1f s: it may still be acting; wait for the lease "
                    "to end, or force it",
                    id->tenant ? id->tenant : "", id->operation, id->key,
                    (double)(lease - idem__boot_ms()) / 1000.0);
    goto out;
  }
  if (r) {
    if (idem__response_checksum(fp, r->status, r->meta, r->meta_len, r->body,
                                r->body_len, sum) != IDEM_OK) {
      rc = idem__fail(IDEM_ENOMEM, "out of memory");
      goto out;
    }
    q = idem__sq_stmt(c, ST_RESOLVE_DONE);
    if (!q) {
      rc = idem__sq_sqlite_fail(c, "prepare");
      goto out;
    }
    idem__sq_bind_id(q, id, 1);
    sqlite3_bind_int64(q, 4, now);
    sqlite3_bind_int64(q, 5, idem__deadline(now, o->retention_ms));
    sqlite3_bind_int(q, 6, r->status);
    if (r->meta)
      sqlite3_bind_blob(q, 7, r->meta, (int)r->meta_len, SQLITE_STATIC);
    sqlite3_bind_blob(q, 8, r->body_len ? r->body : "", (int)r->body_len,
                      SQLITE_STATIC);
    sqlite3_bind_text(q, 9, sum, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 10, idem__deadline(idem__boot_ms(),
                                             o->retention_ms));
  } else {
    q = idem__sq_stmt(c, ST_RESOLVE_DELETE);
    if (!q) {
      rc = idem__sq_sqlite_fail(c, "prepare");
      goto out;
    }
    idem__sq_bind_id(q, id, 1);
  }
  if (sqlite3_step(q) != SQLITE_DONE)
    rc = idem__sq_sqlite_fail(c, "resolve");
  sqlite3_reset(q);
  if (rc == IDEM_OK && idem__sq_exec(c, "COMMIT") != SQLITE_OK)
    rc = idem__sq_sqlite_fail(c, "commit");
out:
  if (!sqlite3_get_autocommit(c->db))
    idem__sq_exec(c, "ROLLBACK");
  idem__sq_pool_put(s, c);
  return rc;
}

int idem__sq_remove(void *state, const idem_id *id) {
  sq_store *s = state;
  conn *c;
  sqlite3_stmt *q;
  int rc = idem__sq_pool_get(s, &c), changed = 0;
  if (rc != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) != IDEM_OK) {
    idem__sq_pool_put(s, c);
    return rc;
  }
  q = idem__sq_stmt(c, ST_DELETE);
  if (!q) {
    rc = idem__sq_sqlite_fail(c, "prepare");
  } else {
    idem__sq_bind_id(q, id, 1);
    if (sqlite3_step(q) != SQLITE_DONE)
      rc = idem__sq_sqlite_fail(c, "delete");
    else
      changed = sqlite3_changes(c->db);
    sqlite3_reset(q);
  }
  rc = operator_end(c, rc);
  idem__sq_pool_put(s, c);
  /* This handle must not replay what it just deleted. */
  if (rc == IDEM_OK)
    idem__cache_forget(s->cache, id);
  if (rc == IDEM_OK && changed == 0)
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
  return rc;
}

/* Less room than this on the store's filesystem counts as a full disk. */
#define CHECK_MIN_FREE (1024 * 1024)

/*
 * Whether a claim could be written now. The files must still be the ones
 * opened, and the folder writable: the store works on while it is open,
 * but SQLite makes its -wal and -shm files there whenever the store is
 * opened again (by a restart, or by `idem keys`), so a store in a folder
 * turned read-only is a store that will not open. The filesystem must have
 * CHECK_MIN_FREE bytes left: a commit that overwrites log frames already
 * on the disk needs no new room, so a small write can still succeed on a
 * full disk while a claim with a larger request fails, and a checkpoint
 * that cannot grow the database keeps the log growing until every commit
 * fails. Then a write transaction must commit: a row written into
 * idem_meta and deleted again, so that the commit writes the log and syncs
 * it as a claim's does (a failing disk fails it, as it would fail a claim)
 * and leaves nothing behind.
 */
int idem__sq_check(void *state) {
  sq_store *s = state;
  char folder[4096];
  conn *c;
  int rc;
  if (s->o.read_only)
    return idem__fail(IDEM_ESTORE,
                      "store '%s': opened read-only, it takes no writes",
                      s->path);
  idem__sq_folder_of(s->path, folder, sizeof folder);
  if (faccessat(AT_FDCWD, folder, W_OK, AT_EACCESS) != 0)
    return idem__fail(IDEM_ESTORE,
                      "store '%s': its folder '%s' is not writable (%s); "
                      "the store cannot be opened again for writing (it "
                      "makes its -wal and -shm files there)",
                      s->path, folder, strerror(errno));
  {
    struct statvfs fs;
    /* A filesystem that reports no size at all (some FUSE ones) says
     * nothing about its room. */
    if (statvfs(folder, &fs) == 0 && fs.f_blocks > 0 &&
        (unsigned long long)fs.f_bavail * fs.f_frsize < CHECK_MIN_FREE)
      return idem__fail(IDEM_EIO,
                        "store '%s': its disk is full (%llu bytes left, "
                        "less than %d); claims fail once the log must "
                        "grow",
                        s->path, (unsigned long long)fs.f_bavail * fs.f_frsize,
                        CHECK_MIN_FREE);
  }
  if ((rc = idem__sq_pool_get(s, &c)) != IDEM_OK)
    return rc;
  if ((rc = operator_begin(s, c)) == IDEM_OK) {
    if (idem__sq_exec(c,
                      "INSERT OR REPLACE INTO idem_meta VALUES ('store_check', "
                      "'1')") != SQLITE_OK ||
        idem__sq_exec(c, "DELETE FROM idem_meta WHERE name = 'store_check'") !=
            SQLITE_OK)
      rc = idem__sq_sqlite_fail(c, "check: write");
    rc = operator_end(c, rc);
  }
  idem__sq_pool_put(s, c);
  return rc;
}
