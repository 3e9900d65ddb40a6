/*
 * store.h -- the method table through which the engine reaches a backend.
 *
 * Like sqlite3_io_methods, the table is versioned: a backend fills in the
 * version it was written for, and the engine never calls a method that a
 * lower version lacks. The engine includes neither sqlite3.h nor libpq-fe.h;
 * each backend owns its connections and keeps its own SQL.
 *
 * The engine validates every argument, fills in defaults and then hands the
 * backend one idem__op. The backend reads the stored row, asks
 * idem__decide() what the outcome is, and performs the write that outcome
 * needs, atomically. Keeping the decision in one pure function means every
 * backend answers the same question the same way.
 */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include "internal.h"

#include <pthread.h>

#define IDEM__STORE_METHODS_VERSION 8

/* Defaults and rates every backend shares. */
#define IDEM__DEFAULT_LEASE_MS 30000
#define IDEM__DEFAULT_RETENTION_MS (24 * 3600 * 1000LL)
/* How often a store removes some retention-expired records by itself. */
#define IDEM__PRUNE_EVERY_MS 60000

/* Owner tokens are 16 random bytes in hex. */
#define IDEM__TOKEN_SIZE 33

/* What a claim handle holds. The engine allocates it; backends fill it. */
struct idem_call {
  idem_outcome outcome;
  char *tenant, *operation, *key; /* copies of the id */
  char fingerprint[IDEM_FINGERPRINT_SIZE];
  char token[IDEM__TOKEN_SIZE]; /* owner token while held */
  int attempt;
  int64_t retry_after_ms;
  int64_t lease_expires_ms; /* while held: as the last claim or renewal
                               wrote it */
  int64_t retention_ms;     /* applied again when the record completes */
  int has_response;
  idem_response response; /* points into resp_buf */
  void *resp_buf;
  int held; /* PROCEED/RECOVER not yet completed, released or marked */
  int took_over_unknown; /* RECOVER of a record that was marked unknown */
  int ended_state; /* idem_state the holder's ending left, 0 when released
                      (see idem_call_state()) */
  int recovered; /* RECOVER, or REPLAY of a record marked recovered */
  int lease_on_boot; /* lease_expires_ms is on the boot-time clock (the
                        SQLite store's), not in Unix ms */
  /* The sealed form of the last response this holder's completion sealed
   * (seal_buf; the checksum of its plaintext and the key id in seal_of),
   * so that a completion sent again writes the very bytes the first send
   * may have committed (the PostgreSQL store tells a lost answer by
   * them). */
  void *seal_buf;
  idem_response sealed;
  char seal_of[IDEM_FINGERPRINT_SIZE + 16];
};

typedef enum idem__op_kind {
  IDEM__OP_CLAIM = 1,
  IDEM__OP_LOCAL,
  IDEM__OP_COMPLETE,
  IDEM__OP_RELEASE,
  IDEM__OP_MARK_UNKNOWN,
  IDEM__OP_RENEW
} idem__op_kind;

/*
 * One request to a backend. Backends that batch several callers into one
 * transaction (group commit) run an op on another thread than its caller's,
 * so the op carries its own result code and error detail back.
 */
typedef struct idem__op {
  idem__op_kind kind;
  const idem_id *id;
  const char *fingerprint;
  idem_call_options opts; /* defaults filled in */
  idem_local_fn fn;       /* IDEM__OP_LOCAL */
  void *ctx;
  void *conn; /* idem_execute_in(): the caller's connection, in its own
                 transaction (the run_in method) */
  const idem_response *response; /* IDEM__OP_COMPLETE */
  int64_t lease_ms;              /* IDEM__OP_RENEW */
  idem_call *claim;             /* filled (claim, local) or read (others) */
  int rc;
  char errmsg[512];
  struct idem__op *next; /* the backend's queue */
  void *waiter; /* the backend's: who waits for this op (a condition) */
  /* A queued op's (the queue method): called once the op ran, on one of
   * the backend's threads. It may free the op. */
  void (*on_done)(struct idem__op *op);
  void *on_done_ctx; /* the engine's */
  int done;
  /* The backend's: a completed record that this op read or wrote, for the
   * cache once its transaction committed (its retention's end, attempt). */
  int cache_it;
  int64_t cache_expires_ms;
  int cache_attempt;
  /* The engine's: the sealed request that opts.request points at, freed
   * with the op (idem__op_seal_free()). */
  void *seal_buf;
} idem__op;

/* A stored row as the decision needs it. */
typedef struct idem__row {
  int exists;
  int state; /* idem_state */
  char fingerprint[IDEM_FINGERPRINT_SIZE];
  int attempt;
  int64_t lease_expires_ms;
  int64_t expires_ms;
  /* A completed record's retention's end on the backend's lease clock too
   * (the SQLite store's boot-time clock); 0 when not known. It expires
   * once both have passed: a step of the wall clock forward does not end
   * it early. */
  int64_t expires_lease_ms;
  int recovered; /* completed by a holder that recovered (see idem.h) */
} idem__row;

typedef enum idem__action {
  IDEM__ACT_NONE = 0, /* nothing to write */
  IDEM__ACT_INSERT,   /* new record (replacing a retention-expired one) */
  IDEM__ACT_TAKEOVER  /* new owner, attempt + 1 */
} idem__action;

/* The decision table of docs/design.md: what a claim of fingerprint at time now does to row. */
idem_outcome idem__decide(const idem__row *row, const char *fingerprint,
                          int64_t now_ms, int64_t lease_now_ms,
                          const idem_call_options *opts,
                          idem__action *action, int64_t *retry_after_ms);

typedef struct idem__store_methods {
  int version;
  const char *name;
  int (*open)(const char *target, const idem_store_options *opts,
              void **state);
  void (*close)(void *state);
  const char *(*engine_version)(void *state);
  /* Runs one op; the result is in op->rc / op->errmsg and op->claim. */
  void (*run)(void *state, idem__op *op);
  int (*get)(void *state, const idem_id *id, idem_record **out);
  int (*list)(void *state, const idem_filter *filter, idem_record_fn fn,
              void *ctx);
  int (*prune)(void *state, int64_t *removed);
  /* opts has its defaults filled in. */
  int (*resolve)(void *state, const idem_id *id,
                 const idem_response *response,
                 const idem_resolve_options *opts);
  /* Version 2. */
  int (*remove)(void *state, const idem_id *id);
  /*
   * Version 3. Runs n renewals (IDEM__OP_RENEW) in one transaction where
   * the backend can; each op carries its own result. NULL: the engine runs
   * them one by one.
   */
  void (*run_many)(void *state, idem__op **ops, int n);
  /*
   * Version 3. Asks to be told when the record of id, in progress, ends
   * (completed, released, marked unknown, taken over or removed), from any
   * process: the backend then wakes idem__wait_wake_bucket() of its name.
   * IDEM_OK when it will; anything else (or NULL) and the waiter polls.
   */
  int (*watch)(void *state, const idem_id *id);
  /*
   * Version 3. How far the clock that writes leases (the store's) may be
   * ahead of this process's CLOCK_MONOTONIC (idem__mono_ms()), at most, in
   * ms; INT64_MAX when not known yet (or NULL). A lease written as
   * lease_expires_ms then ends no earlier than lease_expires_ms - that
   * bound on the monotonic clock. (Before version 7 the bound was against
   * CLOCK_REALTIME, which a step of the wall clock moves.)
   */
  int64_t (*clock_ahead)(void *state);
  /*
   * Version 4. Whether the store can take a write now (idem_store_check()):
   * IDEM_OK, or the error a claim would meet, with its detail set. NULL:
   * the engine answers IDEM_OK when a read works.
   */
  int (*check)(void *state);
  /*
   * Version 5. Queues op (a claim or an ending) and returns at once;
   * op->on_done(op) runs once it has run, on one of the backend's threads,
   * with its result in op as run() leaves it. 0, or non-zero when the
   * backend cannot queue it now (op is untouched: the engine runs it on a
   * thread of its own). NULL: the engine always does.
   */
  int (*queue)(void *state, idem__op *op);
  /*
   * Version 6. Answers a prepared claim from the backend's replay cache
   * alone (idem__cache_get() on the backend's clock): 1 with op->claim
   * filled in, 0 when it keeps no completed record of op->id. Reads and
   * writes nothing. NULL: nothing is kept.
   */
  int (*cached)(void *state, idem__op *op);
  /*
   * Version 7. Ends the batch of renewals in flight now, if any, as if its
   * connection had broken: each of its ops fails with IDEM_EUNAVAILABLE
   * and its leases keep the deadlines they had. A holder calls it when its
   * ending has waited too long behind a renewal that does not come back.
   * Any thread. NULL: renewals end by themselves in time.
   */
  void (*interrupt_renewals)(void *state);
  /*
   * Version 8. Runs a local action (op->kind IDEM__OP_LOCAL) on op->conn,
   * the caller's connection to the store's database, inside the
   * transaction the caller has open there (one begun when none is), within
   * a savepoint that is released on success and rolled back otherwise.
   * Commits nothing, caches nothing, waits for no holder. The result is in
   * op as run() leaves it. NULL: idem_execute_in() is refused.
   */
  void (*run_in)(void *state, idem__op *op);
} idem__store_methods;

/* A store handle. */
struct idem_store {
  const idem__store_methods *methods;
  void *state;
  pthread_mutex_t sched_mu; /* guards sched's creation */
  struct idem__sched *sched; /* renews idem_execute()'s leases; made when
                                first needed */
  struct idem__runner *runner; /* runs the asynchronous calls that the
                                  backend cannot queue; likewise */
  struct idem__runner *wait_runner; /* the asynchronous claims that wait on
                                       a key in flight; likewise */
  pid_t pid; /* the process that opened the store: after fork() the child's
                calls on it fail with IDEM_EFORK (idem__store_owned()) */
  unsigned forks; /* idem__forks() when it was opened */
  struct idem__seal *seal; /* idem_store_seal()'s keys; NULL: none */
};

/* idem_claim()'s checks: fills op for a claim (op->claim allocated, op->id
 * and op->fingerprint pointing at id and fp). IDEM_OK or the error. */
int idem__claim_prepare(idem_store *store, idem__op_kind kind,
                        const idem_id *id, const char *fp,
                        const idem_call_options *opts, idem_local_fn fn,
                        void *ctx, idem__op *op);
/* Runs a prepared claim on this thread, waiting for a key in flight as its
 * options say; op->claim is the answer. IDEM_OK or the error (its detail
 * set). */
int idem__claim_run(idem_store *store, idem__op *op);
/*
 * A claim's answer as its caller sees it: a sealed response (REPLAY, or a
 * local action's) opened. IDEM_OK, or IDEM_ESEALED / IDEM_ECORRUPT /
 * IDEM_ENOMEM with the detail set (the claim is then the caller's to
 * free, and must not be handed on).
 */
int idem__claim_open(idem_store *store, idem_call *claim);
/* Frees what the engine sealed for op (its request). */
void idem__op_seal_free(idem__op *op);
/* What an ending's after-work needs. */
typedef struct idem__finish {
  int64_t deadline; /* the lease before the op */
  int ends;         /* a takeover's release, written as a renewal */
} idem__finish;
/* idem_complete()'s (and the other endings') checks: fills op and *id for
 * the ending (op->id = id). IDEM_OK or the error (nothing to run). */
int idem__finish_prepare(idem_store *store, idem_call *claim,
                         idem__op_kind kind, const idem_response *response,
                         int64_t lease_ms, idem__op *op, idem_id *id,
                         idem__finish *f);
/* What an ending that ran with result rc changes in its claim, and who
 * waits for it. */
void idem__finish_after(idem__op *op, int rc, const idem__finish *f);

typedef struct idem__runner idem__runner;
/* Runs fn(arg) on one of store's runner threads (runner.c). 0, or -1 when
 * none can start: the caller then runs it. */
int idem__runner_submit(idem_store *store, void (*fn)(void *arg), void *arg);
/* The same on the runner for claims that wait on a key in flight. */
int idem__runner_submit_wait(idem_store *store, void (*fn)(void *arg),
                             void *arg);
/* Runs what is queued, then ends the threads (idem_store_close()). */
void idem__runner_free(idem__runner *r);

extern const idem__store_methods idem__sqlite_methods;
extern const idem__store_methods idem__pg_methods;

/* Helpers for backends. */
int64_t idem__now_ms(void);
/* now + period, saturated at INT64_MAX (periods are bounded and never
 * negative, so this only guards against a clock gone wild). */
int64_t idem__deadline(int64_t now_ms, int64_t period_ms);
int idem__new_token(char token[IDEM__TOKEN_SIZE]);
/* Sets op's result code and detail. Returns rc. */
int idem__op_fail(idem__op *op, int rc, const char *fmt, ...)
    IDEM__PRINTF(3, 4);
/*
 * Fills op's claim from the decision on row at now: its outcome, attempt and
 * (in flight) the time until the lease ends, at least 1 ms. Returns the
 * write the outcome needs. Every backend reads the row its own way, then
 * calls this, so that all answer the same question the same way. now_ms
 * is on the clock of retention (Unix ms), lease_now_ms on the clock of
 * leases, which a backend may keep apart (the SQLite store's leases are
 * on the boot-time clock, so that a step of the wall clock moves none).
 */
idem__action idem__decide_op(idem__op *op, const idem__row *row,
                             int64_t now_ms, int64_t lease_now_ms);
/*
 * For a REPLAY: checks the stored response against its checksum (sum_len
 * bytes at sum; NULL when none was stored) and copies it into op's claim,
 * with the record's recovered mark. IDEM_OK, or op->rc (IDEM_ECORRUPT:
 * nothing is replayed; IDEM_ENOMEM).
 */
int idem__claim_replay(idem__op *op, const char *fingerprint, int status,
                       const void *meta, size_t meta_len, const void *body,
                       size_t body_len, const char *sum, size_t sum_len,
                       int recovered);
/*
 * Why a response cannot be kept (NULL data with a length; larger than
 * IDEM_MAX_RESPONSE, or a sealed one larger than that and the sealing's
 * overhead; a meta that begins like a seal's marker without being one),
 * as "who: reason" in why; IDEM_OK when it can. Backends check what they
 * store with it.
 */
int idem__response_problem(const idem_response *r, const char *who,
                           char *why, size_t size);
/* The same for a caller's response in clear, which may not look sealed:
 * the engine checks every response it is given with it. */
int idem__plain_response_problem(const idem_response *r, const char *who,
                                 char *why, size_t size);
/* A stored row as a backend reads it, for idem__record_new(). NULL columns
 * have NULL pointers. */
typedef struct idem__row_parts {
  const char *tenant, *operation, *key, *fingerprint;
  size_t tenant_len, operation_len, key_len, fingerprint_len;
  int state, attempt;
  int64_t created_ms, updated_ms, lease_expires_ms, expires_ms;
  const void *request;
  size_t request_len;
  int status;
  const void *meta, *body;
  size_t meta_len, body_len;
  int recovered;
} idem__row_parts;
/* An idem_record holding copies of the parts (each with a spare NUL, so
 * that text prints as is); the response only for a completed record. */
int idem__record_new(const idem__row_parts *parts, idem_record **out);
/* Copies a response into the claim (one allocation). */
int idem__claim_set_response(idem_call *claim, int status, const void *meta,
                             size_t meta_len, const void *body,
                             size_t body_len);
/*
 * The checksum that detects a corrupted completed record. It covers the
 * response (and the fingerprint), not the recovered mark: idem 0.2
 * handles still open on a migrated store, and handles working at an older
 * schema that has no mark (docs/design.md), verify records with this same
 * sum; a sum that covered the mark would make them call every marked
 * record corrupted, and an operator told to delete it would let the key
 * act once more.
 */
int idem__response_checksum(const char *fingerprint, int status,
                            const void *meta, size_t meta_len,
                            const void *body, size_t body_len,
                            char hex[IDEM_FINGERPRINT_SIZE]);
char *idem__strdup(const char *s);

#endif
