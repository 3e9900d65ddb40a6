/*
 * clockshift.c -- steps the wall clock of a process, and of no other: an
 * LD_PRELOAD library (libidem_clockshift.so), or linked into a test
 * program, whose clock_gettime(), gettimeofday() and time() answer
 * CLOCK_REALTIME (and its coarse variant) shifted by an offset. Every other
 * clock (CLOCK_MONOTONIC, CLOCK_BOOTTIME) is left alone, so that waits and
 * timeouts keep working, which libfaketime does not ensure.
 *
 * The offset, in milliseconds, is an int64_t in native byte order at the
 * start of the file named by IDEM_CLOCK_SHIFT_FILE, mapped shared: whoever
 * writes it (clockshift_set(), or any process with pwrite()) steps the
 * clock of every process that maps it, at once. Without the variable, or
 * until the file exists, the clock is not shifted.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int clockshift_set(int64_t ms);

static int64_t *volatile shift;

static int64_t shift_ms(void) {
  int64_t *p = shift;
  if (!p) {
    const char *path = getenv("IDEM_CLOCK_SHIFT_FILE");
    int fd;
    if (!path || (fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
      return 0;
    p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
      return 0;
    shift = p;
  }
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

static int real_clock(clockid_t clk, struct timespec *ts) {
  return (int)syscall(SYS_clock_gettime, clk, ts);
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
  int rc = real_clock(clk, ts);
  if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec +
                 shift_ms() * 1000000LL;
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
  }
  return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
  struct timespec ts;
  struct timeval *volatile out = tv; /* glibc declares it non-null */
  (void)tz;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
    return -1;
  if (out) {
    out->tv_sec = ts.tv_sec;
    out->tv_usec = ts.tv_nsec / 1000;
  }
  return 0;
}

time_t time(time_t *t) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (t)
    *t = ts.tv_sec;
  return ts.tv_sec;
}

/* Steps the shifted clocks to `ms` from the real one (file must exist). */
int clockshift_set(int64_t ms) {
  if (!shift && shift_ms() == 0 && !shift)
    return -1;
  __atomic_store_n(shift, ms, __ATOMIC_SEQ_CST);
  return 0;
}
