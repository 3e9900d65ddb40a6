/*
 * idem.h -- the public interface of libidem.
 *
 * libidem makes retries of side-effecting actions safe. A caller names one
 * intention with an operation key; the library stores the key, a fingerprint
 * of the request and, once the action is done, its response. A retry with the
 * same key and fingerprint gets the stored response back instead of acting a
 * second time.
 *
 * Conventions, for every function in this header:
 *
 *  - Functions return an int result code: IDEM_OK (0) on success, one of the
 *    IDEM_E* codes below otherwise. Outcomes of a claim (PROCEED, REPLAY, ...)
 *    are not errors; they come back through output parameters.
 *  - On failure every output parameter is still defined: pointers are set to
 *    NULL and sizes to 0, so a caller may free them unconditionally.
 *  - idem_errmsg() returns the detail of the calling thread's last failure
 *    (for example the SQLite or libpq text), so it is safe with many threads
 *    sharing one store.
 *  - Memory returned through an output parameter belongs to the caller and is
 *    released with the matching *_free() function, or idem_free() for plain
 *    buffers. Every destructor accepts NULL as a harmless no-op.
 *  - Strings are NUL-terminated UTF-8 unless a length is given with them.
 */
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(IDEM_BUILDING) && defined(__GNUC__)
#define IDEM_API __attribute__((visibility("default")))
#else
#define IDEM_API
#endif

#define IDEM_VERSION_MAJOR 0
#define IDEM_VERSION_MINOR 1
#define IDEM_VERSION_PATCH 0
#define IDEM_VERSION_STRING "0.1.0"

/* The version of the library actually linked, e.g. "0.1.0". */
IDEM_API const char *idem_version(void);

/*
 * Result codes. One table generates the enum, idem_rc_name() and
 * idem_strerror(). Numbers are part of the ABI: they are never renumbered and
 * new codes are only ever appended.
 */
#define IDEM_RC_MAP(X)                                                        \
  X(OK, 0, "success")                                                         \
  X(EINVAL, 1, "invalid argument")                                            \
  X(ENOMEM, 2, "out of memory")                                               \
  X(ETOOBIG, 3, "too large")                                                  \
  X(EJSON, 4, "malformed JSON")                                               \
  X(EDUPKEY, 5, "duplicate member name in JSON object")                       \
  X(EUTF8, 6, "invalid UTF-8 or lone surrogate")                              \
  X(ERANGE, 7, "number outside the IEEE-754 double range")                    \
  X(EDEPTH, 8, "JSON nested too deeply")                                      \
  X(EKEY, 9, "invalid key")                                                   \
  X(EURL, 10, "invalid store URL")                                            \
  X(ESTORE, 11, "store error")                                                \
  X(EBUSY, 12, "store busy")                                                  \
  X(EUNAVAILABLE, 13, "store unavailable")                                    \
  X(ESCHEMA, 14, "store schema is newer than this version of idem")          \
  X(ESTALE, 15, "claim is stale: its lease was taken over")                   \
  X(ENOTFOUND, 16, "no such record")                                          \
  X(ECORRUPT, 17, "stored record is corrupted")                               \
  X(EREJECTED, 18, "the action was rejected; nothing was stored")             \
  X(ESTATE, 19, "record is not in a state that allows this")                  \
  X(EIO, 20, "input/output error")

typedef enum idem_rc {
#define IDEM__RC_ENUM(name, num, msg) IDEM_##name = num,
  IDEM_RC_MAP(IDEM__RC_ENUM)
#undef IDEM__RC_ENUM
} idem_rc;

/* "IDEM_EKEY" for IDEM_EKEY; "IDEM_UNKNOWN_RC" for a number not in the table. */
IDEM_API const char *idem_rc_name(int rc);

/* The fixed one-line message of a result code ("invalid key"). */
IDEM_API const char *idem_strerror(int rc);

/*
 * The detail of the calling thread's last failed call, for example
 * "key: byte 3 is 0x0a, keys are printable ASCII (0x21-0x7e)". Never NULL;
 * "" when nothing failed yet. Valid until the thread's next idem_ call.
 */
IDEM_API const char *idem_errmsg(void);

/* Releases a buffer returned by libidem. NULL is a no-op. */
IDEM_API void idem_free(void *p);

/* ------------------------------------------------------------------ */
/* Canonical JSON (RFC 8785) and fingerprints                           */
/* ------------------------------------------------------------------ */

/* Limits applied by idem_canonicalize(); zero fields take the defaults. */
typedef struct idem_canon_limits {
  size_t max_bytes; /* input size; default 16 MiB */
  int max_depth;    /* nesting of arrays and objects; default 256 */
} idem_canon_limits;

/*
 * Canonicalises one JSON text per RFC 8785 (JCS).
 *
 * Members are sorted by UTF-16 code units, strings use the minimal escapes,
 * numbers are written as ECMAScript's Number.prototype.toString does, and no
 * insignificant whitespace remains. Rejected, with a result code and a detail
 * naming the byte offset: malformed JSON (IDEM_EJSON), duplicate member names
 * (IDEM_EDUPKEY), invalid UTF-8 or lone surrogates (IDEM_EUTF8), numbers that
 * overflow a double (IDEM_ERANGE), nesting deeper than the limit
 * (IDEM_EDEPTH), input larger than the limit (IDEM_ETOOBIG).
 *
 * On success *out holds the canonical bytes (NUL-terminated for convenience,
 * the terminator not counted in *out_len); free it with idem_free(). On
 * failure *out is NULL, *out_len 0 and, when err_offset is not NULL,
 * *err_offset the byte offset of the problem. limits may be NULL.
 */
IDEM_API int idem_canonicalize(const char *json, size_t len,
                               const idem_canon_limits *limits, char **out,
                               size_t *out_len, size_t *err_offset);

/* Length of a fingerprint in lowercase hex, including the terminating NUL. */
#define IDEM_FINGERPRINT_SIZE 65

/* SHA-256 of len bytes, written as 64 lowercase hex digits and a NUL. */
IDEM_API int idem_sha256_hex(const void *data, size_t len,
                             char hex[IDEM_FINGERPRINT_SIZE]);

/*
 * Fingerprint of a request: the SHA-256 of its canonical JSON when is_json is
 * non-zero (failing like idem_canonicalize() when the text is not valid
 * JSON), of its raw bytes otherwise.
 */
IDEM_API int idem_fingerprint(const void *data, size_t len, int is_json,
                              char hex[IDEM_FINGERPRINT_SIZE]);

/* ------------------------------------------------------------------ */
/* Stores                                                               */
/* ------------------------------------------------------------------ */

typedef struct idem_store idem_store;

/* Options for idem_store_open(); zero fields take the defaults. */
typedef struct idem_store_options {
  /*
   * SQLite: 1 selects synchronous=NORMAL, which is faster but may lose the
   * most recent completed records on power loss (never on a process crash).
   * The default, synchronous=FULL, keeps a completed record once the call
   * that stored it has returned.
   */
  int sqlite_sync_normal;
  int busy_timeout_ms; /* how long to wait for a locked store; default 10000 */
  int max_connections; /* connection pool size; default 16 */
  /*
   * Group commit: concurrent callers in one process share one transaction
   * and so one fsync. 0 = default (on), -1 = off.
   */
  int group_commit;
} idem_store_options;

/*
 * Opens the store named by url:
 *   "sqlite:PATH" or a bare PATH        an SQLite database file
 *   "postgresql://..." / "postgres://..." a PostgreSQL server (libpq conninfo)
 * NULL or "" means the environment variable IDEM_STORE, and when that is
 * unset too, "./idem.db". The schema is created or migrated on open; a store
 * written by a newer idem fails with IDEM_ESCHEMA and is left untouched. A
 * file that is not an SQLite database fails with IDEM_ESTORE and is not
 * overwritten. opts may be NULL. On failure *out is NULL.
 */
IDEM_API int idem_store_open(const char *url, const idem_store_options *opts,
                             idem_store **out);

/*
 * Closes the store. NULL is a no-op. No call may be in progress.
 *
 * A store handle belongs to the process that opened it: after fork() the
 * child opens a handle of its own and neither uses nor closes the parent's
 * (SQLite connections, PostgreSQL sockets and the SQLite store's checkpoint
 * thread do not survive a fork).
 */
IDEM_API void idem_store_close(idem_store *store);

/* "sqlite" or "postgresql". */
IDEM_API const char *idem_store_backend(const idem_store *store);

/* The version of the store's engine, e.g. "3.40.1" (SQLite) or "15.18". */
IDEM_API const char *idem_store_engine_version(const idem_store *store);

/* ------------------------------------------------------------------ */
/* Records and claims                                                   */
/* ------------------------------------------------------------------ */

/*
 * A record is identified by (tenant, operation, key).
 *  tenant     the caller's identity boundary; may be "" (0-255 bytes)
 *  operation  the kind of action, e.g. a tool name or "POST /tickets"
 *             (1-255 bytes)
 *  key        the caller's operation key: 1-255 bytes of printable ASCII
 *             (0x21-0x7e); anything else fails with IDEM_EKEY.
 */
typedef struct idem_id {
  const char *tenant;
  const char *operation;
  const char *key;
} idem_id;

/* Checks a key; IDEM_OK or IDEM_EKEY with a detail in idem_errmsg(). */
IDEM_API int idem_key_check(const char *key);

typedef enum idem_outcome {
  IDEM_PROCEED = 1,   /* new record in progress; the caller acts */
  IDEM_REPLAY = 2,    /* completed earlier; the stored response is returned */
  IDEM_CONFLICT = 3,  /* same key, other fingerprint; nothing written */
  IDEM_IN_FLIGHT = 4, /* another holder's lease is active; nothing written */
  IDEM_RECOVER = 5,   /* an earlier holder's lease expired; the caller took
                         over and an earlier attempt may have acted */
  IDEM_UNKNOWN = 6    /* the outcome of an earlier attempt is unknown (marked
                         so, or an expired lease when takeover was not
                         asked for); nothing written */
} idem_outcome;

/* "proceed", "replay", "conflict", "in_flight", "recover", "unknown". */
IDEM_API const char *idem_outcome_name(int outcome);

/* A response as stored with a completed record. */
typedef struct idem_response {
  int status;       /* e.g. an HTTP status or an exit status */
  const void *meta; /* free-form metadata, e.g. headers as JSON; may be NULL */
  size_t meta_len;
  const void *body; /* may be NULL when body_len is 0 */
  size_t body_len;
} idem_response;

/* Per-call options; NULL or zero fields take the defaults. */
typedef struct idem_call_options {
  int64_t lease_ms;     /* how long a holder owns an in-progress record;
                           default 30000 */
  int64_t retention_ms; /* how long the record is kept; default 24 h */
  const void *request;  /* the canonical request, stored for operators; may
                           be NULL. One larger than 64 KiB is not kept. */
  size_t request_len;
  /*
   * What to do with an in-progress record whose lease expired:
   * 0 (default) take it over: outcome IDEM_RECOVER;
   * 1 report it: outcome IDEM_UNKNOWN, nothing written.
   */
  int no_takeover;
  /* Non-zero: also take over a record marked unknown (IDEM_RECOVER). */
  int takeover_unknown;
} idem_call_options;

/* The largest response (meta plus body) a record keeps: 16 MiB. */
#define IDEM_MAX_RESPONSE (16u * 1024u * 1024u)

/*
 * One call of an action: the outcome of its claim, the response (on replay,
 * or after a local action ran), and while the caller holds the record, the
 * owner token that fences its completion. Opaque; read it with the
 * idem_call_* accessors below and free it with idem_call_free().
 */
typedef struct idem_call idem_call;

/*
 * Claims (tenant, operation, key) for a request with the given fingerprint
 * (64 lowercase hex digits, as idem_fingerprint() writes) in one atomic step.
 * The outcome is read with idem_call_outcome(): see idem_outcome. On
 * PROCEED and RECOVER the caller holds the record and must end it with
 * exactly one of idem_complete(), idem_release() or idem_mark_unknown(); a
 * holder that does none of them blocks the key until its lease ends. Expired
 * records (retention) count as absent. *out is freed with idem_call_free().
 */
IDEM_API int idem_claim(idem_store *store, const idem_id *id,
                        const char *fingerprint,
                        const idem_call_options *opts, idem_call **out);

IDEM_API idem_outcome idem_call_outcome(const idem_call *claim);
/* The stored response on REPLAY (and after execute_local's PROCEED or
 * RECOVER, the new one); NULL otherwise. Owned by the claim. */
IDEM_API const idem_response *idem_call_response(const idem_call *claim);
/* On IN_FLIGHT: milliseconds until the holder's lease ends (at least 1). */
IDEM_API int64_t idem_call_retry_after_ms(const idem_call *claim);
/* The attempt number: 1 for the first holder, +1 for each takeover. */
IDEM_API int idem_call_attempt(const idem_call *claim);
IDEM_API void idem_call_free(idem_call *claim);

/*
 * Stores the response and completes the record. Fenced by the claim's owner
 * token: when the lease was taken over by another holder, fails with
 * IDEM_ESTALE and the newer holder's record is left untouched. A response
 * larger than IDEM_MAX_RESPONSE fails with IDEM_ETOOBIG and the record stays
 * in progress.
 */
IDEM_API int idem_complete(idem_store *store, idem_call *claim,
                           const idem_response *response);

/*
 * Deletes the in-progress record: the action certainly did not happen, so a
 * retry may proceed. Fenced like idem_complete().
 */
IDEM_API int idem_release(idem_store *store, idem_call *claim);

/*
 * Marks the record's outcome as unknown: the action may or may not have
 * happened. Claims then see IDEM_UNKNOWN until an operator resolves it with
 * idem_resolve(). Fenced like idem_complete().
 */
IDEM_API int idem_mark_unknown(idem_store *store, idem_call *claim);

/* Extends the holder's lease to lease_ms from now. Fenced. */
IDEM_API int idem_renew(idem_store *store, idem_call *claim,
                        int64_t lease_ms);

/*
 * A local action: fn runs inside the store's transaction, on the store's own
 * connection (conn is a sqlite3 * or a PGconn *), so the caller's tables
 * commit together with the record. fn fills *response (its pointers must stay
 * valid until idem_execute_local() returns; they are copied) and returns 0;
 * a non-zero return rejects the action: everything fn did is rolled back, no
 * record is kept, and idem_execute_local() returns IDEM_EREJECTED.
 *
 * With group commit (the default) fn may run on another thread of the
 * process, the one committing a batch of concurrent calls, and each fn runs
 * inside its own SAVEPOINT of that batch's transaction. fn must therefore
 * not begin, commit or roll back transactions itself and must not call back
 * into the same store. An fn that ends the transaction anyway (on either
 * store) makes the call fail with IDEM_ESTORE and leaves the key marked
 * unknown, since what it wrote before may have been kept without a record;
 * other calls of the same batch then fail with IDEM_EUNAVAILABLE.
 *
 * fn runs only for PROCEED and RECOVER. For REPLAY, CONFLICT, IN_FLIGHT and
 * UNKNOWN it does not run and nothing is written. After a run the claim
 * already holds the completed record; the caller does not complete it.
 * One exception, on PostgreSQL: there a new key's record is written after
 * fn, and if an idem_claim() from elsewhere takes the key while fn runs,
 * fn's transaction is rolled back and the claim's outcome is returned (it
 * may then be REPLAY or IN_FLIGHT, or RECOVER with fn run again). So fn
 * may run and be rolled back; whatever it does outside the transaction
 * (sequence values, its ctx, calls to other systems) is not undone.
 */
typedef int (*idem_local_fn)(void *conn, void *ctx, idem_response *response);

IDEM_API int idem_execute_local(idem_store *store, const idem_id *id,
                                const char *fingerprint,
                                const idem_call_options *opts,
                                idem_local_fn fn, void *ctx,
                                idem_call **out);

/* ------------------------------------------------------------------ */
/* Operators                                                            */
/* ------------------------------------------------------------------ */

typedef enum idem_state {
  IDEM_STATE_IN_PROGRESS = 1,
  IDEM_STATE_COMPLETED = 2,
  IDEM_STATE_UNKNOWN = 3
} idem_state;

/* "in_progress", "completed", "unknown". */
IDEM_API const char *idem_state_name(int state);

/* A copy of a stored record; all pointers are owned by the record. */
typedef struct idem_record {
  char *tenant, *operation, *key;
  char *fingerprint;
  idem_state state;
  int attempt;
  int64_t created_ms, updated_ms; /* Unix milliseconds */
  int64_t lease_expires_ms;       /* 0 unless in progress */
  int64_t expires_ms;             /* retention */
  void *request;
  size_t request_len;
  int has_response;
  idem_response response;
} idem_record;

IDEM_API void idem_record_free(idem_record *record);

/* Reads one record; IDEM_ENOTFOUND when absent or retention-expired. */
IDEM_API int idem_get(idem_store *store, const idem_id *id,
                      idem_record **out);

/* Filters for idem_list(); NULL fields match everything. */
typedef struct idem_filter {
  const char *tenant;
  const char *operation;
  int state;   /* 0 = any */
  int limit;   /* 0 = no limit */
  int expired; /* non-zero: include retention-expired records */
} idem_filter;

/* Calls fn once per matching record, oldest first; a non-zero return from
 * fn stops the listing and is returned. The record is freed after fn. */
typedef int (*idem_record_fn)(const idem_record *record, void *ctx);
IDEM_API int idem_list(idem_store *store, const idem_filter *filter,
                       idem_record_fn fn, void *ctx);

/* Deletes retention-expired records; *removed (may be NULL) counts them. */
IDEM_API int idem_prune(idem_store *store, int64_t *removed);

/*
 * Resolves a record whose outcome is unknown or in progress: with a response
 * it becomes completed (later claims replay it); with response NULL it is
 * deleted (failed: a retry acts again). IDEM_ENOTFOUND when absent,
 * IDEM_ESTATE when already completed.
 */
IDEM_API int idem_resolve(idem_store *store, const idem_id *id,
                          const idem_response *response);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_H */
