/*
 * bench/stat_fsync.c -- what reading a file's times costs its next durable
 * write. A 4 KiB pwrite in place + fdatasync, as a SQLite commit rewriting
 * its restarted log does, in three modes taking turns: nothing before the
 * write; stat() of the file's path before it (what the SQLite store's -wal
 * check did); statx(STATX_INO) before it (what it does now). For each:
 * writes per second and, from the disk's own counters
 * (/sys/dev/block/MAJ:MIN/stat), write and flush requests per write.
 *
 * Since Linux 6.13 (multigrain timestamps), reading a file's ctime or mtime
 * marks them seen, and the next write then stamps the file with a
 * fine-grained time, which dirties its inode: the fdatasync writes the inode
 * too. Unseen, the coarse time changes once a tick at most.
 *
 * Usage: stat_fsync [DIR [WRITES [ROUNDS]]]   (defaults: $TMPDIR or /tmp,
 * 400, 5). Medians over the rounds. Built and run by bench/run.sh in its
 * side-by-side mode (BASE=...); alone: cc -O2 -o sf bench/stat_fsync.c.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

enum { NONE, STAT, STATX, MODES };
static const char *const names[MODES] = {"no check", "stat()",
                                         "statx(STATX_INO)"};

/* Write and flush requests completed so far by the file's disk; 0 if its
 * counters cannot be read (a filesystem with no block device). */
static int disk_counts(const char *sys, double *writes, double *flushes) {
  double f[17] = {0};
  int n = 0;
  FILE *fp = fopen(sys, "r");
  if (!fp)
    return 0;
  while (n < 17 && fscanf(fp, "%lf", &f[n]) == 1)
    n++;
  fclose(fp);
  *writes = f[4];
  *flushes = n >= 15 ? f[14] : 0;
  return n >= 11;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : getenv("TMPDIR");
  int writes = argc > 2 ? atoi(argv[2]) : 400;
  int rounds = argc > 3 ? atoi(argv[3]) : 5;
  char path[4096], sys[128];
  static char buf[4096];
  double *rate[MODES], *wr[MODES], *fl[MODES];
  int fd, have_disk, m, r, i;
  struct stat st;

  if (!dir || !*dir)
    dir = "/tmp";
  if (writes < 1 || rounds < 1 || rounds > 1000) {
    fprintf(stderr, "usage: stat_fsync [DIR [WRITES [ROUNDS]]]\n");
    return 2;
  }
  snprintf(path, sizeof path, "%s/stat_fsync.XXXXXX", dir);
  if ((fd = mkstemp(path)) < 0 || fstat(fd, &st) != 0) {
    perror(path);
    return 1;
  }
  snprintf(sys, sizeof sys, "/sys/dev/block/%u:%u/stat", major(st.st_dev),
           minor(st.st_dev));
  {
    double a, b;
    have_disk = disk_counts(sys, &a, &b);
  }
  memset(buf, 'x', sizeof buf);
  for (m = 0; m < MODES; m++) {
    rate[m] = calloc((size_t)rounds, sizeof(double));
    wr[m] = calloc((size_t)rounds, sizeof(double));
    fl[m] = calloc((size_t)rounds, sizeof(double));
    if (!rate[m] || !wr[m] || !fl[m])
      return 1;
  }
  /* Four blocks, rewritten in turn: the file's size never changes. */
  for (i = 0; i < 4; i++)
    if (pwrite(fd, buf, sizeof buf, (off_t)i * 4096) != (ssize_t)sizeof buf)
      return perror("pwrite"), 1;
  if (fsync(fd) != 0)
    return perror("fsync"), 1;

  for (r = 0; r < rounds; r++)
    for (int k = 0; k < MODES; k++) {
      double w0 = 0, f0 = 0, w1 = 0, f1 = 0, t0, t1;
      m = (k + r) % MODES; /* each mode goes first in turn */
      disk_counts(sys, &w0, &f0);
      t0 = now_s();
      for (i = 0; i < writes; i++) {
        struct stat s1;
        struct statx sx;
        if (m == STAT && stat(path, &s1) != 0)
          return perror("stat"), 1;
        if (m == STATX &&
            statx(AT_FDCWD, path, AT_STATX_SYNC_AS_STAT, STATX_INO, &sx) != 0)
          return perror("statx"), 1;
        if (pwrite(fd, buf, sizeof buf, (off_t)(i % 4) * 4096) !=
                (ssize_t)sizeof buf ||
            fdatasync(fd) != 0)
          return perror("pwrite/fdatasync"), 1;
      }
      t1 = now_s();
      disk_counts(sys, &w1, &f1);
      rate[m][r] = writes / (t1 - t0);
      wr[m][r] = (w1 - w0) / writes;
      fl[m][r] = (f1 - f0) / writes;
    }
  close(fd);
  unlink(path);

  printf("4 KiB pwrite + fdatasync in %s, %d writes x %d rounds per mode, "
         "medians (disk counters: %s, shared with whatever else runs)\n",
         dir, writes, rounds, have_disk ? sys : "unavailable");
  printf("%-18s %10s %14s %14s\n", "before each write", "writes/s",
         "disk writes/op", "flushes/op");
  double mr[MODES], mw[MODES];
  for (m = 0; m < MODES; m++) {
    mr[m] = median(rate[m], rounds);
    mw[m] = median(wr[m], rounds);
    if (have_disk)
      printf("%-18s %10.0f %14.2f %14.2f\n", names[m], mr[m], mw[m],
             median(fl[m], rounds));
    else
      printf("%-18s %10.0f %14s %14s\n", names[m], mr[m], "-", "-");
  }
  printf("stat() / statx(STATX_INO): %.2fx the writes per second",
         mr[STAT] / mr[STATX]);
  if (have_disk && mw[STATX] > 0)
    printf(", %.2fx the disk writes per write", mw[STAT] / mw[STATX]);
  printf("\n");
  for (m = 0; m < MODES; m++) {
    free(rate[m]);
    free(wr[m]);
    free(fl[m]);
  }
  return 0;
}
