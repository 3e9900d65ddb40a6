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

/*
 * IDEM_OK when store was opened by this process; otherwise (a child of
 * fork() using its parent's handle) IDEM_EFORK, with a detail that begins
 * with who, names the process that opened it and says that after fork() a
 * child must open its own store. The child must not touch the parent's
 * connections, whose sessions and locks are the parent's, nor wait on its
 * threads, which are not in the child.
 */
int idem__store_owned(const idem_store *store, const char *who);
/* Whether store was opened in another process (this one is a child of
 * fork() made since). */
int idem__store_forked(const idem_store *store);
/*
 * Non-zero while idem_store_close() closes a handle in a child of the
 * process that opened it (see idem_store_close() in idem.h). The backend's
 * close then waits for none of its threads, which are not in the child,
 * destroys no mutex or condition that one of them may have held or waited
 * on at the fork, and makes no call of SQLite's or libpq's on the parent's
 * connections: it may close the child's copies of their descriptors, and
 * leaves the rest as it is.
 */
int idem__closing_forked(void);

/* SHA-256 of the concatenation of n parts, in lowercase hex. */
int idem__sha256_parts(const void *const *parts, const size_t *sizes, int n,
                       char hex[IDEM_FINGERPRINT_SIZE]);

/*
 * The text that a JSON request's fingerprint hashes: its RFC 8785 canonical
 * form, except that a number whose double does not hold its exact decimal
 * value is written exactly (see "Fingerprint text" in canon.c), so that two
 * requests whose numbers differ in value never share it. With pointers, a
 * NULL-terminated list of RFC 6901 JSON Pointers, it is the same of the
 * object that maps each pointer that finds a value to that value (a
 * pointer that finds nothing is left out).
 *
 * Fails as idem_canonicalize() fails with the default limits, and with
 * IDEM_EINVAL for an empty list or a malformed pointer. On success *out
 * (free it with idem_free()) holds the text, NUL-terminated; on failure it
 * is NULL, *out_len 0 and *err_offset (when not NULL) as
 * idem_canonicalize() sets it.
 */
int idem__fingerprint_text(const char *json, size_t len,
                           const char *const *pointers, char **out,
                           size_t *out_len, size_t *err_offset);

/* Flags of idem__canon_text(). */
#define IDEM__CANON_EXACT 1u /* numbers as the fingerprint writes them */
#define IDEM__CANON_LONE 2u  /* lone surrogate escapes read, written \udxxx */

/*
 * idem_canonicalize() (flags 0) with the default limits,
 * idem__fingerprint_text() (IDEM__CANON_EXACT), and either with lone
 * surrogate escapes read as the code units they are and written in
 * lowercase hex, as ECMAScript's JSON.stringify writes them
 * (IDEM__CANON_LONE), where RFC 8785 refuses them (see canon.c). Outputs
 * and failures as idem__fingerprint_text()'s.
 */
int idem__canon_text(const char *json, size_t len, const char *const *pointers,
                     unsigned flags, char **out, size_t *out_len,
                     size_t *err_offset);

/*
 * A JSON request's fingerprint: the SHA-256, in lowercase hex, of
 * idem__fingerprint_text() (whole with pointers NULL). For every request
 * whose numbers a double holds exactly it is the fingerprint of 0.2, the
 * SHA-256 of the canonical form (of the selected parts). fp is "" on
 * failure.
 */
/*
 * A request's fingerprint (as idem__request_fingerprint()) and the canonical
 * form kept with its record (idem_canonicalize()'s, of the whole request),
 * from one parse when the two texts agree. *canon is the caller's (NULL on
 * failure).
 */
int idem__request_forms(const char *json, size_t len,
                        const char *const *pointers,
                        char fp[IDEM_FINGERPRINT_SIZE], char **canon,
                        size_t *canon_len);

int idem__request_fingerprint(const char *json, size_t len,
                              const char *const *pointers,
                              char fp[IDEM_FINGERPRINT_SIZE]);

#endif
