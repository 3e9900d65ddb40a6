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
 *    NULL and sizes to 0, so a caller may free them unconditionally. One
 *    exception, said again where it applies: idem_execute() whose action
 *    ran but whose ending could not be written returns the error and
 *    still sets *out, since the caller must learn what the action did.
 *  - idem_errmsg() returns the detail of the calling thread's last failure
 *    (for example the SQLite or libpq text), so it is safe with many threads
 *    sharing one store.
 *  - Memory returned through an output parameter belongs to the caller and is
 *    released with the matching *_free() function, or idem_free() for plain
 *    buffers. Every destructor accepts NULL as a harmless no-op.
 *  - Strings are NUL-terminated UTF-8 unless a length is given with them.
 *  - A call that succeeds clears idem_errmsg() (it reads "" afterwards).
 *
 * Changes in 0.3.0 (rebuild against this header; the ABI of 0.2 is not
 * kept):
 *  - The SONAME is now per 0.x release: libidem.so.0.3 (0.2 had
 *    libidem.so.0). A program built against another 0.x release is refused
 *    by the loader instead of running on structs laid out differently.
 *  - idem_call_recovered() and idem_record.recovered (the struct's last
 *    member): a response stored by a holder that took its key over
 *    (IDEM_RECOVER) is kept marked, and every replay of it says so. The
 *    stores' schemas gain the mark (SQLite version 2, PostgreSQL version
 *    3), migrated on open; idem 0.2 refuses a migrated store.
 *  - A handle whose store a newer idem migrates meanwhile also stops
 *    reading records (IDEM_ESCHEMA), not only writing them.
 *  - idem_execute() holds its leases on one scheduler thread per store,
 *    which renews them in batches; a lost lease is reported at its
 *    deadline (idem_exec_lost(), idem_exec_lost_fd()) even while a renewal
 *    hangs. idem_exec_lost_fd() takes a non-const idem_exec.
 *  - idem_call_options.wait_ms: a claim that finds its key in flight can
 *    wait for the holder's result.
 *  - idem_call_state(): the record's state as the call last saw or left it.
 *  - Fingerprints keep numbers exact where a double cannot hold them
 *    (idem_fingerprint(), idem_execute()); others are as in 0.2.
 *  - IDEM_EXEC_ABANDON is now IDEM_EXEC_LEAVE_IN_PROGRESS (the old name
 *    stays as a macro).
 *  - idem_execute() refuses call options whose request fields are set.
 *  - idem_store_open(NULL) with IDEM_STORE unset fails with IDEM_EINVAL
 *    instead of creating ./idem.db.
 *  - The library's threads block every signal and end when the store that
 *    needs them closes.
 *  - idem_execute_begin() and idem_execute_end(): idem_execute() in two
 *    halves, for actions that do not run on one thread.
 *  - idem_execute_in(): a local action inside the caller's own open
 *    transaction, on its own sqlite3 * or PGconn *; its COMMIT or ROLLBACK
 *    decides the action and the record together.
 *  - idem_store_check(): whether the store can take a write now. An SQLite
 *    handle whose database file is deleted, moved or replaced while it is
 *    open now writes nothing more (IDEM_ESTORE), as one whose -wal file is.
 *  - Leases are decided on one time base: the SQLite store writes them on
 *    the boot-time clock (schema 3; a restart ends every lease of the boot
 *    before), and a holder bounds the PostgreSQL server's clock against
 *    its monotonic clock, so that no step of the wall clock gives a key two
 *    owners. On SQLite a completed record's retention ends on both clocks.
 *  - PostgreSQL: every statement has a deadline on the library's side
 *    (the session's statement_timeout and a quarter more), and a holder's
 *    ending does not wait behind a renewal that does not come back.
 *  - IDEM_EFORK (21): a child of fork() that uses its parent's store
 *    handle is refused, and closing that handle in the child neither
 *    waits for the parent's threads nor touches its connections (it hung,
 *    or answered on the parent's sessions).
 *  - idem_execute_options.ran (a new last member): whether idem_execute()
 *    called the action, on every return.
 *  - idem_call_state() is never COMPLETED after an ending that failed
 *    (0 after IDEM_ESTALE: the key is another holder's).
 *  - idem_store_seal(), idem_seal_key_id() and IDEM_ESEALED (22): stored
 *    responses and requests sealed with AES-256-GCM under rotating keys;
 *    idem_record.seal_key_id and .sealed (its last members).
 *  - idem_execute_options.fingerprint (its last member): a fingerprint the
 *    caller has computed, so that the request is not parsed again; and
 *    idem_fingerprint_text(), the text a fingerprint is the SHA-256 of.
 *  - idem_fingerprint_with() and IDEM_FP_LONE_SURROGATES: the fingerprint
 *    of JSON as JavaScript writes it, a lone surrogate escape read as the
 *    UTF-16 code unit it is (idem mcp's); idem_fingerprint() and
 *    idem_canonicalize() refuse it, as RFC 8785 does.
 *
 * Changes in 0.2.0 (source-compatible where noted; rebuild against this
 * header, the ABI of 0.1 is not kept):
 *  - idem_execute(): one call for a remote action: canonicalises and
 *    fingerprints the request, claims, renews the lease while the action
 *    runs, and completes, releases or marks unknown by the action's answer.
 *  - idem_call_lease_expires_ms(): the deadline of the lease a holder got.
 *  - Parameters of type idem_call are named call throughout.
 *  - Leases count from a time read after the store's write lock is held.
 *  - Leases and retention are bounded (IDEM_MAX_LEASE_MS,
 *    IDEM_MAX_RETENTION_MS); larger values fail with IDEM_EINVAL.
 *  - Retention applies to completed records only: a record in progress or
 *    marked unknown never expires, and idem_prune() leaves it (see
 *    idem_filter.overdue).
 *  - idem_call_options: no_takeover became on_expired_lease (same slot,
 *    same values), and max_attempts was added.
 *  - idem_store_options: sqlite_sync_normal became sqlite_synchronous (same
 *    slot, same values); read_only and replay_cache_entries were added.
 *  - An SQLite store whose disk fails a read, a write or an fsync, or is
 *    full, answers IDEM_EIO (it answered IDEM_ESTORE); the call's
 *    transaction was rolled back, and the store works again once the disk
 *    does (docs/reliability.md).
 *  - idem_resolve() refuses a record whose holder's lease is still running;
 *    idem_resolve_with() can force it and sets the retention. idem_delete()
 *    removes any one record (a corrupted one, say).
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
#define IDEM_VERSION_MINOR 3
#define IDEM_VERSION_PATCH 0
#define IDEM_VERSION_STRING "0.3.0"

/* The version of the library actually linked, e.g. "0.3.0". */
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
  X(EIO, 20, "input/output error")                                            \
  X(EFORK, 21, "the store handle was opened in another process (fork)")      \
  X(ESEALED, 22, "the response is sealed with a key this handle lacks")

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
 * JSON), of its raw bytes otherwise. The canonical JSON is RFC 8785's, but
 * for numbers a double cannot hold exactly (12345678901234567, or
 * 0.10000000000000001): those are written with their exact decimal value,
 * so that two requests whose numbers differ in value never share a
 * fingerprint, while equal values (1, 1.0, 1e0, 10E-1) still do. For a
 * request without such numbers it is the SHA-256 of idem_canonicalize()'s
 * output, as in 0.2 (docs/design.md, "Fingerprints").
 */
IDEM_API int idem_fingerprint(const void *data, size_t len, int is_json,
                              char hex[IDEM_FINGERPRINT_SIZE]);

/* Flags of idem_fingerprint_with(). */
enum {
  /* The data is JSON, fingerprinted as idem_fingerprint() with is_json
   * does; without it, its bytes are. */
  IDEM_FP_JSON = 1,
  /* With IDEM_FP_JSON: a string may hold a lone surrogate escape ("\ud83d"
   * without its low half), as JavaScript's JSON.stringify writes a string
   * cut between the halves of a pair. It counts as the UTF-16 code unit it
   * is, written "\udxxx" with lowercase hex digits (as JSON.stringify writes
   * it) and ordered among member names by that unit; "\uD83D" and "\ud83d"
   * are one string, "\ud83d" and "\ud83e" or "\ufffd" two. A surrogate
   * pair is one character, as always, and raw bytes that are not UTF-8 are
   * still IDEM_EUTF8. A text without lone surrogates has the fingerprint
   * idem_fingerprint() gives it. RFC 8785 refuses lone surrogates, and so
   * do idem_canonicalize() and idem_fingerprint(). */
  IDEM_FP_LONE_SURROGATES = 2
};

/*
 * idem_fingerprint() with flags: IDEM_FP_JSON for is_json, and
 * IDEM_FP_LONE_SURROGATES for JSON that JavaScript may have written. Other
 * bits, or IDEM_FP_LONE_SURROGATES without IDEM_FP_JSON, are IDEM_EINVAL.
 * hex is "" on failure. (Added after 0.3.0.)
 */
IDEM_API int idem_fingerprint_with(const void *data, size_t len, unsigned flags,
                                   char hex[IDEM_FINGERPRINT_SIZE]);

/*
 * The text whose SHA-256 is a JSON request's fingerprint (idem_fingerprint()
 * with is_json): RFC 8785's canonical form with the numbers a double cannot
 * hold written exactly, as above. A caller that wraps one large JSON value
 * in a small envelope fingerprints the value once with this and splices
 * its text into the envelope's (an object's members in RFC 8785's order),
 * instead of parsing the value twice. *text, NUL-terminated, is the
 * caller's: free it with idem_free(). Fails as idem_canonicalize() does,
 * with *text NULL and *text_len 0. (Added after 0.3.0.)
 */
IDEM_API int idem_fingerprint_text(const void *json, size_t len, char **text,
                                   size_t *text_len);

/*
 * A JSON request's fingerprint, as idem_fingerprint() with is_json writes
 * it, and its canonical form, as idem_canonicalize() writes it (what
 * idem_execute() keeps with the record for operators, to pass as
 * idem_call_options.request to idem_execute_local() or idem_claim()), from
 * one parse of the request where the two texts agree (every number in it an
 * integer of at most 15 digits). *canonical, NUL-terminated, is the
 * caller's: free it with idem_free(). Fails as idem_canonicalize() does,
 * with *canonical NULL and hex "".
 */
IDEM_API int idem_fingerprint_json(const void *json, size_t len,
                                   char hex[IDEM_FINGERPRINT_SIZE],
                                   char **canonical, size_t *canonical_len);

/* ------------------------------------------------------------------ */
/* Stores                                                               */
/* ------------------------------------------------------------------ */

typedef struct idem_store idem_store;

/* Values of idem_store_options.sqlite_synchronous. */
enum {
  /* The default: a completed record is kept once the call that stored it
   * has returned, across power loss. */
  IDEM_SYNC_FULL = 0,
  /* Faster, but the most recent completed records may be lost on power
   * loss (never on a process crash). */
  IDEM_SYNC_NORMAL = 1
};

/* Options for idem_store_open(); zero fields take the defaults. */
typedef struct idem_store_options {
  int sqlite_synchronous; /* SQLite: IDEM_SYNC_FULL or IDEM_SYNC_NORMAL */
  int busy_timeout_ms; /* how long to wait for a locked store; default 10000 */
  int max_connections; /* connection pool size; default 16 */
  /*
   * Group commit: concurrent callers in one process share one transaction
   * and so one fsync. 0 = default (on), -1 = off.
   */
  int group_commit;
  /*
   * Non-zero: open for reading only (idem_get(), idem_list()); every call
   * that writes fails with IDEM_ESTORE. An SQLite store is then opened
   * read-only, so a user who may only read the file can list it; a missing
   * file is an error instead of a new store. A store of idem 0.2, which a
   * reader may not migrate, is read as it is (no record marked recovered).
   */
  int read_only;
  /*
   * How many completed records the in-process replay cache keeps (replays
   * and conflicts answered without a read of the store); 0 = default
   * (4096), negative = no cache.
   */
  int replay_cache_entries;
} idem_store_options;

/*
 * Opens the store named by url:
 *   "sqlite:PATH" or a bare PATH        an SQLite database file
 *   "postgresql://..." / "postgres://..." a PostgreSQL server (libpq conninfo)
 * NULL or "" means the environment variable IDEM_STORE; when that is unset
 * too, the open fails with IDEM_EINVAL (a store is never created in the
 * current folder unasked). The schema is created or migrated on open; a store
 * written by a newer idem fails with IDEM_ESCHEMA and is left untouched. A
 * file that is not an SQLite database, a damaged or truncated one, a
 * directory, a file the user may not read, or (read-write) one whose
 * folder is not writable fails with IDEM_ESTORE, naming the file, and is
 * not overwritten. A handle whose store a newer idem migrates meanwhile
 * reads and writes nothing more: idem_get(), idem_list(), claims answered
 * from a stored record, the operators' writes and (SQLite) every write
 * fail with IDEM_ESCHEMA. (A replay this handle answers from its replay
 * cache, a copy of a record it read before, still succeeds.) opts may be
 * NULL. On failure *out is NULL.
 */
IDEM_API int idem_store_open(const char *url, const idem_store_options *opts,
                             idem_store **out);

/*
 * Closes the store. NULL is a no-op. No call may be in progress.
 *
 * A store handle belongs to the process that opened it: after fork() the
 * child opens a handle of its own. SQLite connections, PostgreSQL sessions
 * and the library's threads (the lease scheduler, the SQLite store's
 * checkpointer) do not survive a fork: in the child, every call that takes
 * the parent's handle, or a call or an idem_exec made through it, fails
 * with IDEM_EFORK ("the store was opened by process P; after fork() a
 * child must open its own store") and touches nothing of the parent's. In
 * the child, idem_store_close() of the parent's handle lets it go without
 * harm to the parent: it waits for no thread and makes no call of
 * SQLite's or libpq's on the parent's connections (the SQLite files stay
 * open in the child, close-on-exec, and the parent's locks on them stay
 * held; nothing is sent on the PostgreSQL sessions). It closes the
 * child's copies of the sockets of the PostgreSQL pool, by number: call it
 * before the child reuses descriptor numbers (after closefrom(), say), or
 * not at all. Only the handle itself is freed; the rest of its memory
 * stays allocated in the child, shared with the parent until one of them
 * writes it.
 */
IDEM_API void idem_store_close(idem_store *store);

/* "sqlite" or "postgresql". */
IDEM_API const char *idem_store_backend(const idem_store *store);

/* The version of the store's engine, e.g. "3.40.1" (SQLite) or "15.18". */
IDEM_API const char *idem_store_engine_version(const idem_store *store);

/*
 * Whether the store can take a write now: for a server's readiness check
 * (`idem serve`'s /readyz). IDEM_OK, or the error a claim would meet, with
 * idem_errmsg() saying why:
 *  - SQLite: the database file and its -wal file at the store's path are
 *    still the files this handle opened (not deleted, moved or replaced:
 *    IDEM_ESTORE, and from then on every write through this handle fails
 *    the same way, since it would be lost when the store closes); the
 *    folder is writable (IDEM_ESTORE: the store could not be opened again
 *    for writing); its filesystem has 1 MiB left (IDEM_EIO: a commit
 *    that reuses log space already on the disk still fits on a full disk,
 *    a claim with a larger request does not); and a write transaction
 *    commits (IDEM_EIO on a failing disk, IDEM_EBUSY while another process
 *    holds the write lock longer than the busy timeout). The commit is a
 *    row written into the store's metadata and deleted again: synced as a
 *    claim is, nothing left. A handle opened read-only fails with
 *    IDEM_ESTORE.
 *  - PostgreSQL: a query answers on a connection of the pool
 *    (IDEM_EUNAVAILABLE when the server cannot be reached), the schema is
 *    one this handle knows (IDEM_ESCHEMA), and the server accepts writes
 *    (IDEM_EUNAVAILABLE on a standby).
 * It takes a connection of the pool for one short transaction; cheap
 * enough for a probe every second or so, not for every request.
 */
IDEM_API int idem_store_check(idem_store *store);

/* ------------------------------------------------------------------ */
/* Sealed answers                                                       */
/* ------------------------------------------------------------------ */

/* The size of a sealing key: AES-256. */
#define IDEM_SEAL_KEY_SIZE 32

/*
 * Seals every response this handle stores from now on with keys[0], and
 * opens responses sealed with any of keys[0..n-1]: a replay releases what
 * a store keeps for its retention period, and sealed, a copy of the store
 * (a backup, a replica, a read of the files) holds no response in clear.
 * Rotation: put the new key first and keep the old ones after it until
 * the records they sealed are past their retention. n = 0 turns sealing
 * off (the default): responses are stored in clear, as before, and a
 * sealed one still reads as sealed. The keys are copied. Call it before
 * other threads use the handle; it is not safe beside calls in progress.
 * IDEM_EINVAL for NULL keys with n > 0 or more than 1024 keys.
 *
 * What is sealed: the response of every completion (idem_complete(),
 * idem_execute()'s and its halves' DONE, idem_execute_local()'s action,
 * idem_resolve_with()), and the canonical request kept with a new record
 * (idem_call_options.request). Not sealed: the ids, the fingerprint, the
 * state, the times and the response's status, which deciding a claim and
 * listing records need.
 *
 * What is opened: every response handed to a caller (a claim's REPLAY,
 * waiting and asynchronous claims, idem_claim_cached(), idem_get(),
 * idem_list()). A claim that would replay a response sealed with a key
 * this handle lacks fails with IDEM_ESEALED, whose detail names the key
 * id; one whose sealed bytes do not open (altered, or copied from another
 * record, or its status changed) fails with IDEM_ECORRUPT. Neither ever
 * replays the sealed bytes. idem_get() and idem_list() return such a
 * record without its response (idem_record.sealed).
 *
 * The format (docs/design.md, "Sealed answers"): the status stays in
 * clear; the meta becomes the marker "\0idem-sealed:v1:" followed by the
 * key id in hex (32 bytes, which no JSON text can be); the body is a
 * 12-byte random nonce, the AES-256-GCM ciphertext of the meta's length
 * (4 bytes, big-endian), the meta and the body, and the 16-byte tag. The
 * additional data is tenant NUL operation NUL key NUL status (decimal). A
 * sealed request is the marker, the nonce, the ciphertext and the tag,
 * with "request" in place of the status. IDEM_MAX_RESPONSE bounds the
 * plaintext: a sealed response is up to 64 bytes larger. A response whose
 * meta begins with "\0idem-sealed:" is refused (IDEM_EINVAL), sealed or
 * not, since every reader would take it for a sealed one. An empty meta
 * is read back as NULL.
 */
IDEM_API int idem_store_seal(idem_store *store,
                             const unsigned char (*keys)[IDEM_SEAL_KEY_SIZE],
                             size_t n);

/*
 * The key id of key as records name it: the first 8 bytes of
 * SHA-256("idem seal key id" || key), in lowercase hex, and a NUL. Derived
 * from the key, so that an id can never name the wrong key.
 */
IDEM_API int idem_seal_key_id(const unsigned char key[IDEM_SEAL_KEY_SIZE],
                              char id[17]);

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

/* The largest lease: 30 days. A longer action renews its lease. */
#define IDEM_MAX_LEASE_MS (30LL * 24 * 3600 * 1000)
/* The longest retention: 100 years of 365.25 days ("keep forever"). */
#define IDEM_MAX_RETENTION_MS (100LL * 36525 * 24 * 3600 * 10)

/* Values of idem_call_options.on_expired_lease. */
enum {
  IDEM_EXPIRED_TAKE_OVER = 0, /* the default: outcome IDEM_RECOVER */
  IDEM_EXPIRED_REPORT = 1     /* outcome IDEM_UNKNOWN, nothing written */
};

/*
 * Per-call options; NULL or zero fields take the defaults. Periods are in
 * milliseconds; one past its bound fails with IDEM_EINVAL.
 */
typedef struct idem_call_options {
  int64_t lease_ms;     /* how long a holder owns an in-progress record;
                           default 30000, at most IDEM_MAX_LEASE_MS. It
                           counts from when the claim is written, under the
                           store's write lock. */
  int64_t retention_ms; /* how long a completed record is kept; default
                           24 h, at most IDEM_MAX_RETENTION_MS. Records in
                           progress or marked unknown never expire. */
  const void *request;  /* the canonical request, stored for operators; may
                           be NULL. One larger than 64 KiB is not kept. */
  size_t request_len;
  /* What to do with an in-progress record whose lease expired:
   * IDEM_EXPIRED_TAKE_OVER (default) or IDEM_EXPIRED_REPORT. */
  int on_expired_lease;
  /* Non-zero: also take over a record marked unknown (IDEM_RECOVER). */
  int takeover_unknown;
  /*
   * The most attempts a key may have; 0 = no limit. A takeover that would
   * start attempt max_attempts + 1 is answered IDEM_UNKNOWN instead, and
   * nothing is written: the key then waits for an operator.
   */
  int max_attempts;
  /*
   * How long a claim that finds its key in flight waits for the holder to
   * end it, at most IDEM_MAX_LEASE_MS; 0 = not at all. While it waits the
   * claim is asked again whenever the record may have changed: at once
   * when the holder is in this process, through LISTEN/NOTIFY on
   * PostgreSQL, by polling (at most 50 ms apart) for another process on
   * SQLite, and when the holder's lease ends. It then answers what a claim
   * answers at that moment: REPLAY of the holder's result; PROCEED when
   * the holder released the key; UNKNOWN, or RECOVER (the caller now holds
   * the key) when the holder marked it unknown or died; IN_FLIGHT again
   * when wait_ms ran out.
   */
  int64_t wait_ms;
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
 * holder that does none of them blocks the key until its lease ends.
 * Completed records past their retention count as absent. *out is freed
 * with idem_call_free().
 */
IDEM_API int idem_claim(idem_store *store, const idem_id *id,
                        const char *fingerprint,
                        const idem_call_options *opts, idem_call **out);

/*
 * idem_claim() answered from this handle's memory alone: its replay cache,
 * the completed records it wrote or read (idem_store_options'
 * replay_cache_entries). IDEM_OK with *out a REPLAY or a CONFLICT, as
 * idem_claim() would answer now; IDEM_ENOTFOUND, with *out NULL, when the
 * handle keeps no completed record of id: a new key, a key in flight, a
 * record completed through another handle or process, one past its
 * retention or no longer kept. Reads and writes nothing and never waits for
 * the store, so a server may call it on its event loop to answer a retry
 * at once, and leave every other case to idem_claim() or
 * idem_execute_begin_async(), which decide it.
 */
IDEM_API int idem_claim_cached(idem_store *store, const idem_id *id,
                               const char *fingerprint, idem_call **out);

IDEM_API idem_outcome idem_call_outcome(const idem_call *call);
/*
 * The response: on REPLAY the stored one; after idem_execute_local()'s
 * PROCEED or RECOVER the one its action stored; after idem_execute()'s or
 * idem_execute_end()'s DONE the action's. That one is stored only when
 * the ending succeeded, and idem_call_state() then says
 * IDEM_STATE_COMPLETED. After an ending that failed (IDEM_ESTALE,
 * IDEM_EBUSY...) it is kept so that the caller learns what the action
 * answered, but it is not the record's: no claim replays it (after
 * IDEM_ESTALE a claim replays the newer holder's, if any), and
 * idem_call_state() is not IDEM_STATE_COMPLETED. NULL otherwise. Owned by
 * the call.
 */
IDEM_API const idem_response *idem_call_response(const idem_call *call);
/*
 * The state of the record as this call last saw or left it: COMPLETED on
 * REPLAY and after a completion (idem_complete(), idem_execute()'s DONE,
 * idem_execute_local()), UNKNOWN on UNKNOWN and after idem_mark_unknown(),
 * IN_PROGRESS on IN_FLIGHT and while the caller holds the record (and after
 * IDEM_EXEC_LEAVE_IN_PROGRESS); 0 after a release deleted it, and on
 * CONFLICT (the record is another request's). idem_call_outcome() is the
 * claim's outcome and does not change when the record ends.
 *
 * COMPLETED only once this call's response was stored. After an ending
 * that failed (idem_complete(), idem_release(), idem_mark_unknown(),
 * idem_execute() or idem_execute_end() returning an error) it says what
 * the record holds for this call: IN_PROGRESS while the record stays in
 * progress under this holder (nothing was written; the caller still holds
 * it, or its last lease runs out), UNKNOWN when idem_execute() marked it
 * unknown instead, and 0 after IDEM_ESTALE: the key was taken over,
 * nothing of this call's was stored, and the record is another holder's
 * (as on CONFLICT); the call then holds nothing.
 */
IDEM_API int idem_call_state(const idem_call *call);
/* On IN_FLIGHT: milliseconds until the holder's lease ends (at least 1). */
IDEM_API int64_t idem_call_retry_after_ms(const idem_call *call);
/* The attempt number: 1 for the first holder, +1 for each takeover. */
IDEM_API int idem_call_attempt(const idem_call *call);
/*
 * Non-zero when an earlier attempt may also have acted: on RECOVER (the
 * caller holds the key after a takeover, and idem_execute_local() ran its
 * action then), and on REPLAY of a response that a holder stored after
 * RECOVER, or that an operator stored for a record of more than one
 * attempt (idem_record.recovered). 0 on every other outcome, and for NULL.
 */
IDEM_API int idem_call_recovered(const idem_call *call);
/*
 * While the caller holds the record (PROCEED, RECOVER): when its lease ends,
 * in Unix milliseconds by the store's clock, as the last claim or renewal
 * wrote it. 0 otherwise.
 */
IDEM_API int64_t idem_call_lease_expires_ms(const idem_call *call);
IDEM_API void idem_call_free(idem_call *call);

/*
 * Stores the response and completes the record. Fenced by the claim's owner
 * token: when the lease was taken over by another holder, fails with
 * IDEM_ESTALE and the newer holder's record is left untouched. A response
 * larger than IDEM_MAX_RESPONSE fails with IDEM_ETOOBIG and the record stays
 * in progress.
 */
IDEM_API int idem_complete(idem_store *store, idem_call *call,
                           const idem_response *response);

/*
 * Deletes the in-progress record: the action certainly did not happen, so a
 * retry may proceed. Fenced like idem_complete().
 *
 * A holder answered IDEM_RECOVER knows this of its own attempt only: an
 * earlier attempt may have acted. Its release therefore leaves the record
 * as the takeover found it: in progress with its lease ended (the next
 * claim is answered IDEM_RECOVER, or IDEM_UNKNOWN with
 * IDEM_EXPIRED_REPORT), or marked unknown again when it was, so that the
 * next caller is told too.
 */
IDEM_API int idem_release(idem_store *store, idem_call *call);

/*
 * Marks the record's outcome as unknown: the action may or may not have
 * happened. Claims then see IDEM_UNKNOWN until an operator resolves it with
 * idem_resolve(). Fenced like idem_complete().
 */
IDEM_API int idem_mark_unknown(idem_store *store, idem_call *call);

/* Extends the holder's lease to lease_ms from now. Fenced. */
IDEM_API int idem_renew(idem_store *store, idem_call *call,
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
 * other calls of the same batch then fail with IDEM_EUNAVAILABLE. (On
 * SQLite, a statement of fn that meets an I/O error or a full disk makes
 * SQLite roll the transaction back by itself: nothing was kept, so the
 * call fails with IDEM_EIO and the key stays free for a retry.)
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

/*
 * A local action inside the caller's own transaction. As
 * idem_execute_local(), but the record is read and written through conn,
 * the caller's connection to the store's database (a sqlite3 * on the
 * store's file, or a PGconn * to the store's database and server), inside
 * the transaction the caller has open there, and fn runs on this thread
 * with conn. Nothing is committed: the caller's COMMIT keeps the action
 * and its record together, its ROLLBACK drops both (the key is then free
 * again). When no transaction is open on conn, one is begun (BEGIN
 * IMMEDIATE on SQLite) and left open for the caller to end.
 *
 * The record and fn's writes sit in a SAVEPOINT: a non-zero return of fn
 * rolls back to it (IDEM_EREJECTED, no record) and the caller's
 * transaction goes on with what it did before. A transaction that has
 * another record of the same key in flight waits for it in the database:
 * on PostgreSQL for the other transaction to end, on SQLite for the write
 * lock (the connection's busy timeout); then the first one's committed
 * record answers (REPLAY), or, rolled back, this one acts.
 *
 * The outcomes are idem_execute_local()'s. IN_FLIGHT (a holder outside the
 * transaction, such as an idem_claim()) is answered at once: opts'
 * wait_ms does not apply, as that holder may need locks the transaction
 * holds. Replays are not answered from the store's memory: the
 * transaction sees what it sees. Errors: IDEM_EINVAL when conn is not a
 * connection to the store's database (or its transaction has failed),
 * IDEM_EBUSY when the database makes the transaction give way (a SQLite
 * transaction that read before another's commit; a PostgreSQL
 * serialization failure or deadlock): roll it back and run it again.
 * fn must not end the transaction; one that does is treated as by
 * idem_execute_local(). Nor may fn close conn; a binding that cannot
 * prevent its caller's code from closing it returns IDEM_LOCAL_CLOSED
 * from fn when it did, and conn is then not touched again (the call
 * fails with IDEM_ESTATE; the closed connection's transaction ended with
 * it). conn is used on this thread alone during the call.
 */
#define IDEM_LOCAL_CLOSED (-0x1d3c)
IDEM_API int idem_execute_in(idem_store *store, void *conn,
                             const idem_id *id, const char *fingerprint,
                             const idem_call_options *opts, idem_local_fn fn,
                             void *ctx, idem_call **out);

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
  /* Completed records only: non-zero when the response was stored by a
   * holder that took the key over (outcome IDEM_RECOVER), or by an
   * operator's idem_resolve_with() on a record of more than one attempt:
   * an earlier attempt may also have acted. Replays say so
   * (idem_call_recovered()). Records completed by idem 0.2 say 0. */
  int recovered;
  /*
   * Sealed records (idem_store_seal()): the key id whose key sealed the
   * stored response (or, when the response is not sealed, the request),
   * 16 lowercase hex digits; "" when nothing of the record is sealed.
   * (Added after 0.3.0, as the last members.)
   */
  char seal_key_id[17];
  /*
   * Non-zero when the stored response is sealed and this handle cannot
   * open it: IDEM_SEALED_NO_KEY when it lacks the key seal_key_id names,
   * IDEM_SEALED_BROKEN when the sealed bytes do not open with it (altered,
   * or moved from another record: a claim fails with IDEM_ECORRUPT). Then
   * has_response is 0, the response has its status (kept in clear) but no
   * meta nor body, and a sealed request that does not open is NULL too. 0
   * when the response is in clear or was opened.
   */
  int sealed;
} idem_record;

/* Values of idem_record.sealed. */
enum { IDEM_SEALED_NO_KEY = 1, IDEM_SEALED_BROKEN = 2 };

IDEM_API void idem_record_free(idem_record *record);

/* Reads one record; IDEM_ENOTFOUND when absent or a retention-expired
 * completed record. */
IDEM_API int idem_get(idem_store *store, const idem_id *id,
                      idem_record **out);

/* Filters for idem_list(); NULL fields match everything. */
typedef struct idem_filter {
  const char *tenant;
  const char *operation;
  int state;   /* 0 = any */
  int limit;   /* 0 = no limit */
  int expired; /* non-zero: include retention-expired completed records */
  /*
   * Non-zero: only records past their retention that retention does not
   * remove: in progress or marked unknown, waiting for a holder or an
   * operator (idem_resolve()) longer than a completed record would be kept.
   */
  int overdue;
} idem_filter;

/* Calls fn once per matching record, oldest first; a non-zero return from
 * fn stops the listing and is returned. The record is freed after fn. */
typedef int (*idem_record_fn)(const idem_record *record, void *ctx);
IDEM_API int idem_list(idem_store *store, const idem_filter *filter,
                       idem_record_fn fn, void *ctx);

/* Deletes retention-expired completed records; *removed (may be NULL)
 * counts them. Records in progress or marked unknown are never pruned. */
IDEM_API int idem_prune(idem_store *store, int64_t *removed);

/* Options for idem_resolve_with(); zero fields take the defaults. */
typedef struct idem_resolve_options {
  /* How long the completed record is kept; default 24 h. */
  int64_t retention_ms;
  /*
   * Non-zero: resolve a record in progress even while its holder's lease
   * runs. The holder may still be acting: its completion then fails with
   * IDEM_ESTALE, and after a release a retry acts beside it.
   */
  int force;
} idem_resolve_options;

/*
 * Resolves a record whose outcome is unknown, or which is in progress with
 * an expired lease: with a response it becomes completed (later claims
 * replay it); with response NULL it is deleted (failed: a retry acts
 * again). IDEM_ENOTFOUND when absent, IDEM_ESTATE when already completed
 * or when its holder's lease is still running (unless opts->force). A
 * response is kept marked recovered (idem_record.recovered) when the
 * record had more than one attempt: more than one may have acted.
 * idem_resolve() is idem_resolve_with() with opts NULL.
 */
IDEM_API int idem_resolve_with(idem_store *store, const idem_id *id,
                               const idem_response *response,
                               const idem_resolve_options *opts);
IDEM_API int idem_resolve(idem_store *store, const idem_id *id,
                          const idem_response *response);

/*
 * Deletes one record whatever its state: for an operator who must remove a
 * record that fails its checksum (IDEM_ECORRUPT) or that was written in
 * error. A retry then acts again. Another process may still replay a
 * completed record from its replay cache until the record's retention ends.
 * IDEM_ENOTFOUND when absent.
 */
IDEM_API int idem_delete(idem_store *store, const idem_id *id);

/* ------------------------------------------------------------------ */
/* Remote actions in one call                                           */
/* ------------------------------------------------------------------ */

/* What an action run by idem_execute() reports. */
typedef enum idem_exec_result {
  IDEM_EXEC_DONE = 0,     /* it ran: *response is stored (complete) */
  IDEM_EXEC_NOT_DONE = 1, /* it certainly did not act: release the key
                             (after RECOVER, see idem_release()) */
  IDEM_EXEC_UNKNOWN = 2,  /* it may have acted: mark the key unknown */
  /*
   * It may have acted and may still be acting (a request that timed out
   * after it was sent): the record is left in progress, still held, its
   * lease renewed one last time to end lease_ms after the action returned.
   * Until then a retry is told IDEM_IN_FLIGHT (or waits, with wait_ms);
   * after it, a claim sees an expired lease (IDEM_RECOVER, or IDEM_UNKNOWN
   * with IDEM_EXPIRED_REPORT).
   */
  IDEM_EXEC_LEAVE_IN_PROGRESS = 3
} idem_exec_result;

/* The name of IDEM_EXEC_LEAVE_IN_PROGRESS in 0.2, kept for source
 * compatibility: the record is not abandoned, it stays in progress. */
#define IDEM_EXEC_ABANDON IDEM_EXEC_LEAVE_IN_PROGRESS

/* What an action sees of its own run; valid while the action runs. */
typedef struct idem_exec idem_exec;

/*
 * A file descriptor that becomes readable once the lease is lost: another
 * holder took the key over, or the lease could not be renewed before it
 * ended. It turns readable at the deadline the last written renewal set,
 * whatever a renewal in progress is doing, and asking for it never waits
 * for a renewal. The action should then stop acting and return
 * IDEM_EXEC_UNKNOWN (or NOT_DONE when it had not acted). Owned by the
 * library (a timerfd: poll it, do not read or close it); -1 when none
 * could be made (idem_exec_lost() still tells), and in a child of fork()
 * (the lease is the parent's).
 */
IDEM_API int idem_exec_lost_fd(idem_exec *exec);
/* Non-zero once the lease is lost (as the descriptor above); it never
 * turns back to 0. */
IDEM_API int idem_exec_lost(const idem_exec *exec);
/* IDEM_PROCEED, or IDEM_RECOVER when an earlier attempt may have acted. */
IDEM_API idem_outcome idem_exec_outcome(const idem_exec *exec);
/* The attempt number (1 for the first). */
IDEM_API int idem_exec_attempt(const idem_exec *exec);

/*
 * The action. On IDEM_EXEC_DONE it fills *response, whose pointers must stay
 * valid until idem_execute() returns (they are copied); on the other
 * results *response is ignored. It runs on the caller's thread.
 */
typedef idem_exec_result (*idem_exec_fn)(idem_exec *exec, void *ctx,
                                         idem_response *response);

/* Options for idem_execute(); NULL or zero fields take the defaults. */
typedef struct idem_execute_options {
  idem_call_options call; /* lease, retention, takeover, max_attempts,
                             wait_ms. Its request fields must stay NULL
                             and 0 (IDEM_EINVAL otherwise): idem_execute()
                             keeps the canonical request itself. */
  /*
   * NULL-terminated RFC 6901 JSON Pointers: only these parts of the request
   * make the fingerprint (a pointer that finds nothing counts as absent).
   * NULL: the whole request. An empty list is IDEM_EINVAL.
   */
  const char *const *fingerprint_pointers;
  /* How long to keep retrying a completion, release or mark-unknown that
   * fails with IDEM_EBUSY or IDEM_EUNAVAILABLE; default 30000 ms. */
  int64_t finish_retry_ms;
  /*
   * Not NULL: where idem_execute() says whether it called the action. It
   * sets *ran to 0 as the call begins and to 1 just before it calls fn,
   * so that on every return, success or failure, *ran is 1 exactly when
   * fn ran (whatever fn answered). idem_execute_begin() and
   * idem_execute_begin_async() run no action and set it to 0: the caller
   * runs the action between the halves and knows that it did. Written on
   * the caller's thread during the call only; NULL: not told. (Added in
   * 0.3.0.)
   */
  int *ran;
  /*
   * Non-zero: the record keeps the request's fingerprint only, never its
   * canonical form (idem_record.request is NULL): for requests that hold
   * what must not sit in a store for the retention period (card numbers,
   * credentials, personal data). A changed request is still told by its
   * fingerprint (CONFLICT); only an operator's view of the request is lost.
   * (Added in 0.3.0.)
   */
  int forget_request;
  /*
   * Not NULL: the request's fingerprint (64 lowercase hex digits), which
   * the caller has computed already as idem_fingerprint() computes it (of
   * the parts fingerprint_pointers selects, if any), so that a large
   * request is not parsed again. With forget_request the request is then
   * not read at all; without, it is still made canonical for the record
   * (a lone surrogate escape in it, which the caller's fingerprint may
   * have read with IDEM_FP_LONE_SURROGATES, written "\udxxx").
   * The caller answers for the two agreeing: a fingerprint of another
   * request makes this one replay or conflict with that one's record.
   * (The last member: added after 0.3.0.)
   */
  const char *fingerprint;
} idem_execute_options;

/*
 * Runs a remote action at most once per id. The request is JSON: it is
 * fingerprinted here as idem_fingerprint() does (numbers exact) and kept
 * for operators in its RFC 8785 canonical form (unless forget_request), so
 * the fingerprint can never disagree with the request. Then:
 *  - REPLAY, CONFLICT, IN_FLIGHT, UNKNOWN: fn does not run; IDEM_OK, and
 *    *out tells the outcome (and the stored response on REPLAY).
 *  - PROCEED, RECOVER: fn runs while the store's scheduler renews the
 *    lease (every third of it; one thread per store renews every lease in
 *    batches). Its result ends the record: DONE completes it with
 *    the response, NOT_DONE releases it, UNKNOWN marks it unknown, ABANDON
 *    leaves it in progress until a last lease runs out. A
 *    completion that fails with IDEM_EBUSY or IDEM_EUNAVAILABLE is retried
 *    with backoff for finish_retry_ms while the lease is still renewed.
 *    IDEM_OK once the record says what fn answered; idem_call_response(*out)
 *    is fn's response on DONE.
 *
 * On failure, whether fn ran is told by opts->ran (above), and by *out:
 * the code alone does not tell, since the same code (IDEM_EINVAL,
 * IDEM_ENOMEM, IDEM_EBUSY, IDEM_EUNAVAILABLE, IDEM_ESTORE, IDEM_EIO,
 * IDEM_ESCHEMA, IDEM_ESTALE) may come from before fn or after it.
 *  - fn did not run (*ran 0, *out NULL, and nothing is held for this
 *    call): the argument errors (IDEM_EINVAL; IDEM_EKEY; the request's
 *    IDEM_EJSON, IDEM_EDUPKEY, IDEM_EUTF8, IDEM_ERANGE, IDEM_EDEPTH and
 *    IDEM_ETOOBIG), IDEM_EFORK, IDEM_ENOMEM, every failure of the claim
 *    (IDEM_EBUSY, IDEM_EUNAVAILABLE, IDEM_ESTORE, IDEM_EIO, IDEM_ESCHEMA,
 *    IDEM_ECORRUPT), and a claim that came back with its lease nearly
 *    over and could not renew it before fn started (the store's error, or
 *    IDEM_ESTALE; the key was released where it still could be).
 *  - fn ran but its result could not be recorded (*ran 1, *out set:
 *    outcome PROCEED or RECOVER, and on DONE idem_call_response() is fn's
 *    response when it could be kept in memory, stored or not): the lease
 *    was taken over (IDEM_ESTALE); fn's response cannot be kept
 *    (IDEM_ETOOBIG, IDEM_EINVAL for NULL data with a length, IDEM_ENOMEM);
 *    the store failed past the retries (IDEM_EBUSY, IDEM_EUNAVAILABLE,
 *    IDEM_ESTORE, IDEM_EIO, IDEM_ESCHEMA). It marks the key unknown where
 *    it still can (not after IDEM_ESTALE: the key is another holder's),
 *    idem_errmsg() says whether it did, and idem_call_state(*out) says
 *    what the record holds for this call: IDEM_STATE_UNKNOWN when marked,
 *    IDEM_STATE_IN_PROGRESS while it stays in progress (its last lease
 *    runs out), 0 after IDEM_ESTALE; never IDEM_STATE_COMPLETED.
 */
IDEM_API int idem_execute(idem_store *store, const idem_id *id,
                          const char *request, size_t request_len,
                          idem_exec_fn fn, void *ctx,
                          const idem_execute_options *opts, idem_call **out);

/*
 * idem_execute() in two halves, for a program whose action does not run on
 * one thread from start to end (an event loop, a proxy that forwards a
 * request and reads its answer elsewhere). idem_execute_begin() claims as
 * idem_execute() does and always sets *out on IDEM_OK. On PROCEED and
 * RECOVER it also sets *exec: the caller now holds the key, the store's
 * scheduler renews its lease (no thread of the caller's is needed), and
 * the caller must end it with exactly one idem_execute_end(), from any
 * thread, before it frees *out. On the other outcomes *exec is NULL and
 * nothing else is to be done. idem_exec_lost_fd() and the other idem_exec
 * accessors may be used on *exec until it is ended.
 *
 * idem_execute_end() ends the record by what the action reported, exactly
 * as idem_execute() does with fn's answer (retrying a busy store for
 * finish_retry_ms), updates the call (idem_call_state(), and
 * idem_call_response() on DONE), and frees exec. It returns what
 * idem_execute() would have returned after its action ran.
 *
 * Whether the action ran: the halves never run it. The caller runs it
 * between them, and so knows; idem_execute_begin() sets opts->ran to 0.
 * Every failure of idem_execute_begin() comes before the action (*out
 * and *exec NULL, nothing held), as idem_execute()'s with *ran 0 do.
 * Every failure of idem_execute_end() comes after it: the codes, and what
 * the call then says, are idem_execute()'s after fn ran (*ran 1). Two
 * exceptions end nothing: IDEM_EINVAL for a NULL exec, and IDEM_EFORK in
 * a child of fork(), where only the child's copy of exec is freed and
 * the key stays the parent's to end.
 */
IDEM_API int idem_execute_begin(idem_store *store, const idem_id *id,
                                const char *request, size_t request_len,
                                const idem_execute_options *opts,
                                idem_exec **exec, idem_call **out);
IDEM_API int idem_execute_end(idem_exec *exec, idem_exec_result result,
                              const idem_response *response);

/*
 * idem_execute_begin() and idem_execute_end() for an event loop: each
 * returns at once, and done(ctx, ...) is called exactly once with what the
 * blocking call would have returned (idem_errmsg() tells the detail inside
 * done), on one of libidem's threads, or on the caller's before the call
 * returns when the answer is known at once (a replay held in memory). On
 * an error return (IDEM_EINVAL, IDEM_ENOMEM, IDEM_EFORK) done is never
 * called and, for the ending, exec is still the caller's to end. As for
 * the blocking halves, idem_execute_begin_async() sets opts->ran to 0
 * during the call; an error its done gets comes before the action (no
 * exec, no call, nothing held), and one idem_execute_end_async()'s done
 * gets comes after it, as idem_execute_end()'s.
 *
 * The SQLite store queues the claims and completions into its group
 * commit, so any number in flight take no thread; other stores, and what
 * must wait (a claim with wait_ms, a completion retried while the store is
 * busy, a release), run on at most 16 threads of the store's, in turn.
 * done must be quick: the store's next batch may wait on it. request,
 * id, opts and response need only be valid during the call. As with the
 * blocking calls, the store may be closed only once every done has run.
 */
typedef void (*idem_begin_done_fn)(void *ctx, int rc, idem_exec *exec,
                                   idem_call *call);
typedef void (*idem_end_done_fn)(void *ctx, int rc);
IDEM_API int idem_execute_begin_async(idem_store *store, const idem_id *id,
                                      const char *request, size_t request_len,
                                      const idem_execute_options *opts,
                                      idem_begin_done_fn done, void *ctx);
IDEM_API int idem_execute_end_async(idem_exec *exec, idem_exec_result result,
                                    const idem_response *response,
                                    idem_end_done_fn done, void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* IDEM_H */
