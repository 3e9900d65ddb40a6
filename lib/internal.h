/* internal.h -- helpers shared inside libidem; never installed. */
#ifndef IDEM_INTERNAL_H
#define IDEM_INTERNAL_H

#include "idem.h"

#if defined(__GNUC__)
#define IDEM__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define IDEM__PRINTF(a, b)
#endif

/* Records the calling thread's error detail and returns rc. */
int idem__fail(int rc, const char *fmt, ...) IDEM__PRINTF(2, 3);
/* Clears the calling thread's error detail: every public call starts so,
 * and one that succeeds leaves idem_errmsg() empty. */
void idem__clear_error(void);

/* SHA-256 of the concatenation of n parts, in lowercase hex. */
int idem__sha256_parts(const void *const *parts, const size_t *sizes, int n,
                       char hex[IDEM_FINGERPRINT_SIZE]);

#endif
