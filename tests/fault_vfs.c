/*
 * fault_vfs.c -- see fault_vfs.h. A shim over SQLite's "unix" VFS; every
 * method not about writing, syncing or reading the followed files passes
 * straight through.
 */
#include "fault_vfs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECTOR 512

/* A write or truncation not yet synced. */
typedef struct pending {
  int is_trunc;
  sqlite3_int64 off; /* or the new size */
  int len;
  unsigned char *data;
  struct pending *next;
} pending;

/* A followed file, shared by every handle that has it open. */
typedef struct tfile {
  char *path;
  int is_db;
  int gone;               /* deleted, and not written since */
  int refs;               /* handles open on it */
  int detached;           /* forgotten while open: freed with its last one */
  unsigned err_seq;       /* failed syncs so far (Linux's errseq_t) */
  unsigned char *durable; /* content as of the last sync */
  size_t dlen, dcap;
  pending *head, *tail;
  struct tfile *next;
} tfile;

typedef struct ffile {
  sqlite3_file base;
  tfile *t;            /* NULL: not followed */
  unsigned seen;       /* the last of t's sync failures this handle saw */
  sqlite3_file real[]; /* the unix VFS's file, szOsFile bytes */
} ffile;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static sqlite3_vfs *unix_vfs;
static sqlite3_vfs fault_vfs;
static sqlite3_io_methods fault_io;
static tfile *files;
static uint64_t rng = 1;
static long long events, crash_at;
static int crashed, lying;
static fvfs_fault fault_kind;
static int fault_skip, fault_times;
static fvfs_stats stats;

static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

const char *fvfs_fault_name(fvfs_fault kind) {
  static const char *const names[FVFS_KINDS] = {
      "none", "write_full", "write_eio", "sync_eio", "read_eio"};
  return kind >= 0 && kind < FVFS_KINDS ? names[kind] : "?";
}

/* ---- the durable image ------------------------------------------------- */

static int grow(unsigned char **buf, size_t *cap, size_t need) {
  if (need <= *cap)
    return 0;
  size_t n = *cap ? *cap : 4096;
  while (n < need)
    n *= 2;
  unsigned char *p = realloc(*buf, n);
  if (!p)
    return -1;
  *buf = p;
  *cap = n;
  return 0;
}

/* Applies one write of len bytes at off to an image. */
static int image_write(unsigned char **buf, size_t *len, size_t *cap,
                       sqlite3_int64 off, const unsigned char *data, size_t n) {
  size_t end = (size_t)off + n;
  if (grow(buf, cap, end) != 0)
    return -1;
  if ((size_t)off > *len)
    memset(*buf + *len, 0, (size_t)off - *len);
  if (n > 0)
    memcpy(*buf + off, data, n);
  if (end > *len)
    *len = end;
  return 0;
}

static void image_truncate(size_t *len, sqlite3_int64 size) {
  if ((size_t)size < *len)
    *len = (size_t)size;
}

static void free_pending(tfile *t) {
  pending *p = t->head, *n;
  for (; p; p = n) {
    n = p->next;
    free(p->data);
    free(p);
  }
  t->head = t->tail = NULL;
}

/* A sync: every pending change becomes durable. */
static void make_durable(tfile *t) {
  for (pending *p = t->head; p; p = p->next) {
    if (p->is_trunc)
      image_truncate(&t->dlen, p->off);
    else if (image_write(&t->durable, &t->dlen, &t->dcap, p->off, p->data,
                         (size_t)p->len) != 0)
      abort(); /* out of memory in a test */
  }
  free_pending(t);
}

static void add_pending(tfile *t, int is_trunc, sqlite3_int64 off,
                        const void *data, int len) {
  pending *p = calloc(1, sizeof *p);
  if (!p || (len > 0 && !(p->data = malloc((size_t)len))))
    abort();
  p->is_trunc = is_trunc;
  p->off = off;
  p->len = len;
  if (len > 0)
    memcpy(p->data, data, (size_t)len);
  t->gone = 0;
  if (t->tail)
    t->tail->next = p;
  else
    t->head = p;
  t->tail = p;
}

static tfile *follow(const char *path, int is_db) {
  tfile *t;
  for (t = files; t; t = t->next)
    if (strcmp(t->path, path) == 0)
      return t;
  t = calloc(1, sizeof *t);
  if (!t || !(t->path = strdup(path)))
    abort();
  t->is_db = is_db;
  /* What is on disk when it is first opened is durable. */
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    unsigned char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
      if (image_write(&t->durable, &t->dlen, &t->dcap, (sqlite3_int64)t->dlen,
                      buf, (size_t)n) != 0)
        abort();
    close(fd);
  }
  t->next = files;
  files = t;
  return t;
}

static void free_tfile(tfile *t) {
  free_pending(t);
  free(t->durable);
  free(t->path);
  free(t);
}

/* Forgets every file; one still open (a test that failed half-way left
 * its store open) is freed when its last handle closes. */
static void forget_all(void) {
  tfile *t = files, *n;
  for (; t; t = n) {
    n = t->next;
    if (t->refs > 0)
      t->detached = 1;
    else
      free_tfile(t);
  }
  files = NULL;
}

/* Whether an injected fault of kind strikes now (under mu). */
/* FVFS_TRACE set: every fault injected, and every error reported again,
 * is said on standard error with its file (for finding what led to a
 * violation). */
static void trace(const char *what, const tfile *t) {
  static int on = -1;
  if (on < 0)
    on = getenv("FVFS_TRACE") != NULL;
  if (on) {
    char name[16] = "?";
    pthread_getname_np(pthread_self(), name, sizeof name);
    fprintf(stderr, "fvfs: %s %s (event %lld, thread %s)\n", what,
            t ? t->path : "?", (long long)events, name);
  }
}

static int fault_now(fvfs_fault kind) {
  if (fault_kind != kind || fault_times == 0)
    return 0;
  if (fault_skip > 0) {
    fault_skip--;
    return 0;
  }
  if (fault_times > 0)
    fault_times--;
  stats.injected[kind]++;
  return 1;
}

/* Counts an event; non-zero when it is the armed crash point (under mu). */
static int event_crashes(void) {
  events++;
  if (crash_at > 0 && events == crash_at) {
    crashed = 1;
    stats.crashes++;
    return 1;
  }
  return 0;
}

/* ---- io methods ---------------------------------------------------------- */

#define REAL(f) (((ffile *)(f))->real)
#define T(f) (((ffile *)(f))->t)

static int f_close(sqlite3_file *f) {
  tfile *t = T(f);
  int rc = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
  if (t) {
    pthread_mutex_lock(&mu);
    if (--t->refs == 0 && t->detached)
      free_tfile(t);
    pthread_mutex_unlock(&mu);
    T(f) = NULL;
  }
  return rc;
}

static int f_read(sqlite3_file *f, void *buf, int amt, sqlite3_int64 off) {
  if (T(f)) {
    pthread_mutex_lock(&mu);
    int fail = fault_now(FVFS_READ_EIO);
    if (fail)
      trace("read EIO", T(f));
    pthread_mutex_unlock(&mu);
    if (fail) {
      errno = EIO; /* what SQLite's error text then reports */
      return SQLITE_IOERR_READ;
    }
  }
  return REAL(f)->pMethods->xRead(REAL(f), buf, amt, off);
}

static int f_write(sqlite3_file *f, const void *buf, int amt,
                   sqlite3_int64 off) {
  tfile *t = T(f);
  int rc;
  if (!t)
    return REAL(f)->pMethods->xWrite(REAL(f), buf, amt, off);
  pthread_mutex_lock(&mu);
  if (crashed) {
    pthread_mutex_unlock(&mu);
    return SQLITE_IOERR_WRITE;
  }
  if (fault_now(FVFS_WRITE_FULL)) {
    trace("write full", t);
    pthread_mutex_unlock(&mu);
    errno = ENOSPC;
    return SQLITE_FULL;
  }
  if (fault_now(FVFS_WRITE_EIO)) {
    trace("write EIO", t);
    pthread_mutex_unlock(&mu);
    errno = EIO;
    return SQLITE_IOERR_WRITE;
  }
  stats.writes++;
  rc = REAL(f)->pMethods->xWrite(REAL(f), buf, amt, off);
  if (rc == SQLITE_OK) {
    add_pending(t, 0, off, buf, amt);
    if (event_crashes())
      rc = SQLITE_IOERR_WRITE;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

static int f_truncate(sqlite3_file *f, sqlite3_int64 size) {
  tfile *t = T(f);
  int rc;
  if (!t)
    return REAL(f)->pMethods->xTruncate(REAL(f), size);
  pthread_mutex_lock(&mu);
  if (crashed) {
    pthread_mutex_unlock(&mu);
    return SQLITE_IOERR_TRUNCATE;
  }
  stats.truncates++;
  rc = REAL(f)->pMethods->xTruncate(REAL(f), size);
  if (rc == SQLITE_OK) {
    add_pending(t, 1, size, NULL, 0);
    if (event_crashes())
      rc = SQLITE_IOERR_TRUNCATE;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

static int f_sync(sqlite3_file *f, int flags) {
  tfile *t = T(f);
  if (!t)
    return REAL(f)->pMethods->xSync(REAL(f), flags);
  pthread_mutex_lock(&mu);
  if (crashed) {
    pthread_mutex_unlock(&mu);
    return SQLITE_IOERR_FSYNC;
  }
  if (fault_now(FVFS_SYNC_EIO)) {
    /* The disk lost these writes; no later sync brings them back. */
    for (pending *p = t->head; p; p = p->next)
      stats.forgotten++;
    trace("fsync EIO, pending writes forgotten", t);
    free_pending(t);
    t->err_seq++;
    ((ffile *)f)->seen = t->err_seq;
    pthread_mutex_unlock(&mu);
    errno = EIO;
    return SQLITE_IOERR_FSYNC;
  }
  if (((ffile *)f)->seen != t->err_seq) {
    /* As Linux since 4.13: every descriptor open when a sync failed gets
     * the error from its own next sync too, once; what was written since
     * is flushed all the same. */
    ((ffile *)f)->seen = t->err_seq;
    stats.reported_again++;
    trace("fsync EIO reported again", t);
    make_durable(t);
    pthread_mutex_unlock(&mu);
    errno = EIO;
    return SQLITE_IOERR_FSYNC;
  }
  stats.syncs++;
  if (event_crashes()) {
    pthread_mutex_unlock(&mu);
    return SQLITE_IOERR_FSYNC;
  }
  if (!lying)
    make_durable(t);
  pthread_mutex_unlock(&mu);
  return SQLITE_OK;
}

static int f_file_size(sqlite3_file *f, sqlite3_int64 *size) {
  return REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int level) {
  return REAL(f)->pMethods->xLock(REAL(f), level);
}
static int f_unlock(sqlite3_file *f, int level) {
  return REAL(f)->pMethods->xUnlock(REAL(f), level);
}
static int f_check_reserved(sqlite3_file *f, int *out) {
  return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_file_control(sqlite3_file *f, int op, void *arg) {
  return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector_size(sqlite3_file *f) {
  return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int f_device_chars(sqlite3_file *f) {
  return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int pg, int pgsz, int extend,
                     void volatile **pp) {
  return REAL(f)->pMethods->xShmMap(REAL(f), pg, pgsz, extend, pp);
}
static int f_shm_lock(sqlite3_file *f, int offset, int n, int flags) {
  return REAL(f)->pMethods->xShmLock(REAL(f), offset, n, flags);
}
static void f_shm_barrier(sqlite3_file *f) {
  REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int f_shm_unmap(sqlite3_file *f, int del) {
  return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}

/* ---- vfs methods --------------------------------------------------------- */

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file,
                  int flags, int *out_flags) {
  ffile *f = (ffile *)file;
  int rc;
  (void)vfs;
  f->t = NULL;
  f->base.pMethods = NULL;
  rc = unix_vfs->xOpen(unix_vfs, name, f->real, flags, out_flags);
  if (rc != SQLITE_OK)
    return rc;
  if (name && (flags & (SQLITE_OPEN_MAIN_DB | SQLITE_OPEN_WAL |
                        SQLITE_OPEN_MAIN_JOURNAL))) {
    pthread_mutex_lock(&mu);
    f->t = follow(name, (flags & SQLITE_OPEN_MAIN_DB) != 0);
    f->t->refs++;
    f->seen = f->t->err_seq;
    pthread_mutex_unlock(&mu);
  }
  f->base.pMethods = &fault_io;
  return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
  (void)vfs;
  pthread_mutex_lock(&mu);
  if (crashed) {
    pthread_mutex_unlock(&mu);
    return SQLITE_IOERR_DELETE;
  }
  int rc = unix_vfs->xDelete(unix_vfs, name, sync_dir);
  if (rc == SQLITE_OK) {
    /* A deletion counts as durable at once. */
    for (tfile *t = files; t; t = t->next)
      if (strcmp(t->path, name) == 0) {
        free_pending(t);
        t->dlen = 0;
        t->gone = 1;
        break;
      }
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

static int v_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
  (void)vfs;
  return unix_vfs->xAccess(unix_vfs, name, flags, out);
}
static int v_full_pathname(sqlite3_vfs *vfs, const char *name, int n,
                           char *out) {
  (void)vfs;
  return unix_vfs->xFullPathname(unix_vfs, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *vfs, const char *name) {
  (void)vfs;
  return unix_vfs->xDlOpen(unix_vfs, name);
}
static void v_dlerror(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  unix_vfs->xDlError(unix_vfs, n, out);
}
static void (*v_dlsym(sqlite3_vfs *vfs, void *h, const char *sym))(void) {
  (void)vfs;
  return unix_vfs->xDlSym(unix_vfs, h, sym);
}
static void v_dlclose(sqlite3_vfs *vfs, void *h) {
  (void)vfs;
  unix_vfs->xDlClose(unix_vfs, h);
}
static int v_randomness(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  return unix_vfs->xRandomness(unix_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *vfs, int us) {
  (void)vfs;
  return unix_vfs->xSleep(unix_vfs, us);
}
static int v_current_time(sqlite3_vfs *vfs, double *out) {
  (void)vfs;
  return unix_vfs->xCurrentTime(unix_vfs, out);
}
static int v_last_error(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  return unix_vfs->xGetLastError(unix_vfs, n, out);
}
static int v_current_time64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
  (void)vfs;
  return unix_vfs->xCurrentTimeInt64(unix_vfs, out);
}

int fvfs_register(void) {
  static int done;
  int rc = SQLITE_OK;
  pthread_mutex_lock(&mu);
  if (!done) {
    unix_vfs = sqlite3_vfs_find("unix");
    if (!unix_vfs) {
      pthread_mutex_unlock(&mu);
      return SQLITE_ERROR;
    }
    /* Version 2: no memory-mapped reads, so every read comes through. */
    fault_io = (sqlite3_io_methods){2,
                                    f_close,
                                    f_read,
                                    f_write,
                                    f_truncate,
                                    f_sync,
                                    f_file_size,
                                    f_lock,
                                    f_unlock,
                                    f_check_reserved,
                                    f_file_control,
                                    f_sector_size,
                                    f_device_chars,
                                    f_shm_map,
                                    f_shm_lock,
                                    f_shm_barrier,
                                    f_shm_unmap,
                                    NULL,
                                    NULL};
    fault_vfs = (sqlite3_vfs){2,
                              (int)(sizeof(ffile) + (size_t)unix_vfs->szOsFile),
                              unix_vfs->mxPathname,
                              NULL,
                              FVFS_NAME,
                              NULL,
                              v_open,
                              v_delete,
                              v_access,
                              v_full_pathname,
                              v_dlopen,
                              v_dlerror,
                              v_dlsym,
                              v_dlclose,
                              v_randomness,
                              v_sleep,
                              v_current_time,
                              v_last_error,
                              v_current_time64,
                              NULL,
                              NULL,
                              NULL};
    rc = sqlite3_vfs_register(&fault_vfs, 0);
    done = rc == SQLITE_OK;
  }
  pthread_mutex_unlock(&mu);
  return rc;
}

void fvfs_make_default(int on) {
  sqlite3_vfs_register(on ? &fault_vfs : unix_vfs, 1);
}

void fvfs_reset(uint64_t seed) {
  pthread_mutex_lock(&mu);
  forget_all();
  rng = seed ? seed : 0x9e3779b97f4a7c15ull;
  events = 0;
  crash_at = 0;
  crashed = 0;
  fault_kind = FVFS_NONE;
  pthread_mutex_unlock(&mu);
}

void fvfs_arm_crash(long long n) {
  pthread_mutex_lock(&mu);
  crash_at = n > 0 ? events + n : 0;
  pthread_mutex_unlock(&mu);
}

int fvfs_crashed(void) {
  pthread_mutex_lock(&mu);
  int c = crashed;
  pthread_mutex_unlock(&mu);
  return c;
}

long long fvfs_events(void) {
  pthread_mutex_lock(&mu);
  long long n = events;
  pthread_mutex_unlock(&mu);
  return n;
}

void fvfs_set_fault(fvfs_fault kind, int skip, int times) {
  pthread_mutex_lock(&mu);
  fault_kind = kind;
  fault_skip = skip;
  fault_times = times;
  pthread_mutex_unlock(&mu);
}

void fvfs_set_lying(int on) {
  pthread_mutex_lock(&mu);
  lying = on;
  pthread_mutex_unlock(&mu);
}

void fvfs_get_stats(fvfs_stats *out) {
  pthread_mutex_lock(&mu);
  *out = stats;
  pthread_mutex_unlock(&mu);
}

/* The image of t after the power went out. */
static int lose_power(tfile *t, unsigned char **img, size_t *len) {
  size_t cap = t->dlen + 1;
  *img = malloc(cap);
  if (!*img)
    return -1;
  if (t->dlen > 0)
    memcpy(*img, t->durable, t->dlen);
  *len = t->dlen;
  for (pending *p = t->head; p; p = p->next) {
    unsigned r = (unsigned)(next_rand() % 100);
    if (p->is_trunc) {
      if (r < 50) {
        image_truncate(len, p->off);
        stats.trunc_kept++;
      } else {
        stats.trunc_dropped++;
      }
      continue;
    }
    if (r < 40) {
      stats.kept++;
      if (image_write(img, len, &cap, p->off, p->data, (size_t)p->len) != 0)
        return -1;
    } else if (r < 70 || p->len <= 0) {
      stats.dropped++;
    } else {
      /* Torn: the first sectors reached the disk, the rest holds what was
       * there before or, half of the time, garbage. */
      int sectors = (p->len + SECTOR - 1) / SECTOR;
      int whole = (int)(next_rand() % (uint64_t)sectors);
      int head = whole * SECTOR;
      stats.torn++;
      if (head > 0 &&
          image_write(img, len, &cap, p->off, p->data, (size_t)head) != 0)
        return -1;
      if (next_rand() % 2) {
        int rest = p->len - head;
        unsigned char *junk = malloc((size_t)rest);
        if (!junk)
          return -1;
        for (int i = 0; i < rest; i++)
          junk[i] = (unsigned char)next_rand();
        stats.torn_garbage++;
        int rc = image_write(img, len, &cap, p->off + head, junk, (size_t)rest);
        free(junk);
        if (rc != 0)
          return -1;
      }
    }
  }
  return 0;
}

int fvfs_power_loss(void) {
  int rc = 0;
  pthread_mutex_lock(&mu);
  for (tfile *t = files; t && rc == 0; t = t->next) {
    unsigned char *img = NULL;
    size_t len = 0;
    if (lose_power(t, &img, &len) != 0) {
      free(img);
      errno = ENOMEM;
      rc = -1;
      break;
    }
    if (t->gone) {
      free(img);
      if (unlink(t->path) != 0 && errno != ENOENT)
        rc = -1;
      continue;
    }
    int fd = open(t->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      rc = -1;
    } else {
      size_t done = 0;
      while (done < len) {
        ssize_t w = write(fd, img + done, len - done);
        if (w < 0 && errno == EINTR)
          continue;
        if (w <= 0) {
          rc = -1;
          break;
        }
        done += (size_t)w;
      }
      if (close(fd) != 0)
        rc = -1;
    }
    free(img);
    if (t->is_db) {
      char shm[4200];
      snprintf(shm, sizeof shm, "%s-shm", t->path);
      if (unlink(shm) != 0 && errno != ENOENT)
        rc = -1;
    }
  }
  forget_all();
  events = 0;
  crash_at = 0;
  crashed = 0;
  fault_kind = FVFS_NONE;
  pthread_mutex_unlock(&mu);
  return rc;
}
