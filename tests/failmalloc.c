/*
 * failmalloc.c -- makes chosen allocations of a program fail: an
 * LD_PRELOAD library (libidem_failmalloc.so) whose malloc() answers NULL
 * (errno ENOMEM) to requests of exactly IDEM_FAIL_MALLOC_SIZE bytes, the
 * first IDEM_FAIL_MALLOC_COUNT of them (default 1), and passes every other
 * request on to the malloc() it stands in front of. A test picks a size
 * that only the allocation it means can have (the length of a message it
 * sends, say), so that one allocation fails in a program of many threads
 * whose allocations come in no fixed order. Each failure is said on
 * standard error ("failmalloc: malloc(N) failed"), so that a test can tell
 * it happened, followed by the caller's stack with IDEM_FAIL_MALLOC_TRACE
 * set (to find out which allocation a size hits).
 *
 * realloc() and calloc() are left alone. Under AddressSanitizer the
 * program needs ASAN_OPTIONS=verify_asan_link_order=0: the library comes
 * before ASan's runtime, and passes on to ASan's malloc().
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Exported whatever the build's default visibility. */
__attribute__((visibility("default"))) void *malloc(size_t n);

static void *(*next_malloc)(size_t);
static size_t fail_size; /* 0: fail nothing */
static long fail_left;

/* Read once the program's environment is there: allocations made before
 * (by the loader and the runtimes) never fail. */
__attribute__((constructor)) static void failmalloc_init(void) {
  const char *size = getenv("IDEM_FAIL_MALLOC_SIZE");
  const char *count = getenv("IDEM_FAIL_MALLOC_COUNT");
  if (!next_malloc)
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
  fail_left = count && *count ? strtol(count, NULL, 10) : 1;
  if (size && *size)
    __atomic_store_n(&fail_size, (size_t)strtoull(size, NULL, 10),
                     __ATOMIC_RELEASE);
}

void *malloc(size_t n) {
  size_t fail = __atomic_load_n(&fail_size, __ATOMIC_ACQUIRE);
  if (!next_malloc)
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
  if (fail && n == fail &&
      __atomic_fetch_sub(&fail_left, 1, __ATOMIC_ACQ_REL) > 0) {
    char line[64];
    int k = snprintf(line, sizeof line, "failmalloc: malloc(%zu) failed\n", n);
    if (k > 0 && write(STDERR_FILENO, line, (size_t)k) < 0) {
      /* Nowhere to say it. */
    }
    if (getenv("IDEM_FAIL_MALLOC_TRACE")) {
      void *frames[32];
      backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
    }
    errno = ENOMEM;
    return NULL;
  }
  return next_malloc(n);
}
