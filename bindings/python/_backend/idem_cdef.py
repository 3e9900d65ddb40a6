"""The C declarations cffi compiles into idem._native (API mode).

Only what the package uses: libidem's stores, claims in two halves
(idem_execute_begin/end), local actions with a callback into Python, and
the few SQLite and libpq calls that let that callback run the caller's
statements on the store's own connection. Structs end in "...;" so the
compiler, not this file, lays them out.
"""

_IDEM = r"""
typedef struct idem_store idem_store;
typedef struct idem_call idem_call;
typedef struct idem_exec idem_exec;

typedef struct idem_store_options {
  int sqlite_synchronous;
  int busy_timeout_ms;
  int max_connections;
  int group_commit;
  int read_only;
  int replay_cache_entries;
  ...;
} idem_store_options;

typedef struct idem_id {
  const char *tenant;
  const char *operation;
  const char *key;
  ...;
} idem_id;

typedef struct idem_response {
  int status;
  const void *meta;
  size_t meta_len;
  const void *body;
  size_t body_len;
  ...;
} idem_response;

typedef struct idem_call_options {
  int64_t lease_ms;
  int64_t retention_ms;
  const void *request;
  size_t request_len;
  int on_expired_lease;
  int takeover_unknown;
  int max_attempts;
  int64_t wait_ms;
  ...;
} idem_call_options;

typedef struct idem_execute_options {
  idem_call_options call;
  const char *const *fingerprint_pointers;
  int64_t finish_retry_ms;
  ...;
} idem_execute_options;

const char *idem_version(void);
const char *idem_rc_name(int rc);
const char *idem_errmsg(void);

int idem_store_open(const char *url, const idem_store_options *opts,
                    idem_store **out);
void idem_store_close(idem_store *store);
const char *idem_store_backend(const idem_store *store);
int idem_delete(idem_store *store, const idem_id *id);

/* Operators: records read, listed, resolved, pruned. */
typedef struct idem_record {
  char *tenant, *operation, *key;
  char *fingerprint;
  int state;
  int attempt;
  int64_t created_ms, updated_ms;
  int64_t lease_expires_ms;
  int64_t expires_ms;
  void *request;
  size_t request_len;
  int has_response;
  idem_response response;
  int recovered;
  char seal_key_id[17];
  int sealed;
  ...;
} idem_record;
typedef struct idem_filter {
  const char *tenant;
  const char *operation;
  int state;
  int limit;
  int expired;
  int overdue;
  ...;
} idem_filter;
typedef struct idem_resolve_options {
  int64_t retention_ms;
  int force;
  ...;
} idem_resolve_options;
void idem_record_free(idem_record *record);
int idem_get(idem_store *store, const idem_id *id, idem_record **out);
extern "Python" int idem_py_record(const idem_record *record, void *ctx);
int idem_py_list(idem_store *store, const idem_filter *filter, void *ctx);
int idem_prune(idem_store *store, int64_t *removed);
int idem_resolve_with(idem_store *store, const idem_id *id,
                      const idem_response *response,
                      const idem_resolve_options *opts);

void idem_call_free(idem_call *call);

int idem_execute_begin(idem_store *store, const idem_id *id,
                       const char *request, size_t request_len,
                       const idem_execute_options *opts,
                       idem_exec **exec, idem_call **out);
int idem_execute_end(idem_exec *exec, int result,
                     const idem_response *response);

extern "Python" int idem_py_local(void *conn, void *ctx,
                                  idem_response *response);

/* One claim, read whole in one call (see source() below). */
typedef struct idem_py_claim {
  int rc;
  int outcome;
  int recovered;
  int64_t retry_after_ms;
  const char *body;
  size_t body_len;
  idem_exec *exec;
  idem_call *call;
} idem_py_claim;
int idem_py_begin(idem_store *store, const char *tenant, const char *operation,
                  const char *key, const char *request, size_t request_len,
                  const idem_execute_options *opts, idem_py_claim *claim,
                  char *buf, size_t cap, int64_t *left);
/* A claim or an ending for an event loop: libidem's asynchronous halves.
 * When it is answered, on whatever thread, idem_py_wake(handle) runs. */
typedef struct idem_py_async {
  idem_py_claim claim;
  char *buf;
  size_t cap;
  void *handle;
  char errmsg[1024];
} idem_py_async;
extern "Python" void idem_py_wake(void *handle);
int idem_py_begin_async(idem_store *store, const char *tenant,
                        const char *operation, const char *key,
                        const char *request, size_t request_len,
                        const idem_execute_options *opts, idem_py_async *a);
int idem_py_end_async(idem_exec *exec, int result, const char *body,
                      size_t len, idem_py_async *a);
int idem_py_end(idem_exec *exec, int result, const char *body, size_t len);
int idem_py_local_run(idem_store *store, const char *tenant,
                      const char *operation, const char *key,
                      const char *request, size_t request_len,
                      const idem_call_options *opts, void *ctx,
                      idem_py_claim *claim, char *buf, size_t cap,
                      int64_t *left);
/* idem_py_local_run() in the application's own transaction on conn (its
 * sqlite3 * or PGconn *): idem_execute_in(). */
int idem_py_local_in(idem_store *store, void *conn, const char *tenant,
                     const char *operation, const char *key,
                     const char *request, size_t request_len,
                     const idem_call_options *opts, void *ctx,
                     idem_py_claim *claim, char *buf, size_t cap);
/* The address of the SQLite library's sqlite3_libversion() that libidem
 * calls, to tell whether the sqlite3 module uses the same copy; and the
 * main database file of a connection. */
void *idem_py_sqlite_lib(void);
/* What follows is for idem._speedups, which calls it through its
 * addresses (its own callback included): see source(). */
typedef int (*idem_local_fn)(void *conn, void *ctx, idem_response *response);
#define IDEM_PY_FRESH ...
#define IDEM_PY_AGAIN ...
#define IDEM_LOCAL_CLOSED ...
void idem_py_respond(idem_response *response, const char *body, size_t len);
int64_t idem_py_begin_held(idem_store *store, const char *tenant,
                           const char *operation, const char *key,
                           const char *request, size_t request_len,
                           const idem_execute_options *opts,
                           idem_py_claim *claim, char *buf, size_t cap,
                           int64_t *left);
int idem_py_finish(idem_py_claim *claim, int result, const char *body,
                   size_t len);
int64_t idem_py_local_fresh(idem_store *store, const char *tenant,
                            const char *operation, const char *key,
                            const char *request, size_t request_len,
                            const idem_call_options *opts, idem_local_fn fn,
                            void *ctx, idem_py_claim *claim, char *buf,
                            size_t cap, int64_t *left);

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;

/* One statement: prepared, bound and stepped once in one call. */
typedef struct idem_py_sql {
  int rc;
  int columns;
  int more;
  int64_t changes;
  int64_t last_rowid;
  sqlite3_stmt *stmt;
} idem_py_sql;
int idem_py_sqlite_run(void *db, sqlite3_stmt *cached, const char *sql,
                       int sql_len, int n, const char *kinds,
                       const int64_t *ints, const double *doubles,
                       char **ptrs, const int *lens, idem_py_sql *out);
int sqlite3_reset(sqlite3_stmt *stmt);
int sqlite3_step(sqlite3_stmt *stmt);
int sqlite3_column_count(sqlite3_stmt *stmt);
int sqlite3_column_type(sqlite3_stmt *stmt, int i);
int64_t sqlite3_column_int64(sqlite3_stmt *stmt, int i);
double sqlite3_column_double(sqlite3_stmt *stmt, int i);
const unsigned char *sqlite3_column_text(sqlite3_stmt *stmt, int i);
const void *sqlite3_column_blob(sqlite3_stmt *stmt, int i);
int sqlite3_column_bytes(sqlite3_stmt *stmt, int i);
int sqlite3_finalize(sqlite3_stmt *stmt);
const char *sqlite3_errmsg(sqlite3 *db);
const char *sqlite3_db_filename(sqlite3 *db, const char *name);
/* The table idem._speedups' tx.execute() calls SQLite through
 * (idem_py_sqlite.h). */
void *idem_py_sqlite_fns(void);
/* Around fork() (os.register_at_fork): SQLite's process-wide mutexes held
 * across it, so that none is left locked in the child by a thread that the
 * child does not have. */
void idem_py_fork_prepare(void);
int idem_fingerprint(const void *data, size_t len, int is_json, char *hex);
void idem_py_fork_done(void);
"""

_PG = r"""
typedef struct pg_conn PGconn;
typedef struct pg_result PGresult;
typedef unsigned int Oid;
PGresult *PQexecParams(PGconn *conn, const char *command, int nParams,
                       const Oid *paramTypes, const char *const *paramValues,
                       const int *paramLengths, const int *paramFormats,
                       int resultFormat);
int PQresultStatus(const PGresult *res);
char *PQresultErrorMessage(const PGresult *res);
int PQntuples(const PGresult *res);
int PQnfields(const PGresult *res);
char *PQgetvalue(const PGresult *res, int row, int col);
int PQgetlength(const PGresult *res, int row, int col);
int PQgetisnull(const PGresult *res, int row, int col);
Oid PQftype(const PGresult *res, int col);
char *PQcmdTuples(PGresult *res);
char *PQcmdStatus(PGresult *res);
char *PQresultErrorField(const PGresult *res, int fieldcode);
void PQclear(PGresult *res);
PGresult *PQprepare(PGconn *conn, const char *stmtName, const char *query,
                    int nParams, const Oid *paramTypes);
PGresult *PQexecPrepared(PGconn *conn, const char *stmtName, int nParams,
                         const char *const *paramValues,
                         const int *paramLengths, const int *paramFormats,
                         int resultFormat);
int PQbackendPID(const PGconn *conn);
int PQlibVersion(void);
/* The address of libpq's PQlibVersion() that libidem calls (as
 * idem_py_sqlite_lib()). */
void *idem_py_pq_lib(void);
/* The table idem._speedups' tx.execute() calls libpq through
 * (idem_py_sqlite.h). */
void *idem_py_pg_fns(void);
"""


def cdef(has_pg):
    return _IDEM + (_PG if has_pg else "")


def source(has_pg):
    return r"""
#include <idem.h>
#include <sqlite3.h>
#include <string.h>
#include <time.h>
#include "idem_py_sqlite.h"
%s

/*
 * A claim, and what Python reads of it, in one call: every crossing from
 * Python into C costs about as much as a replay answered from the cache.
 */
typedef struct idem_py_claim {
  int rc;
  int outcome;
  int recovered;
  int64_t retry_after_ms;
  const char *body; /* owned by call */
  size_t body_len;
  idem_exec *exec;
  idem_call *call;
} idem_py_claim;

static void idem_py_read(idem_py_claim *claim)
{
  const idem_response *r = idem_call_response(claim->call);
  claim->outcome = idem_call_outcome(claim->call);
  claim->recovered = idem_call_recovered(claim->call);
  claim->retry_after_ms = claim->outcome == IDEM_IN_FLIGHT
                            ? idem_call_retry_after_ms(claim->call)
                            : 0;
  claim->body = r ? (const char *)r->body : NULL;
  claim->body_len = r ? r->body_len : 0;
}

/* Done with a call whose key is not held: its body is copied to buf when
 * it fits (then call is NULL and body is buf). */
static void idem_py_done(idem_py_claim *claim, char *buf, size_t cap)
{
  if (claim->body_len > cap)
    return;
  if (claim->body_len)
    memcpy(buf, claim->body, claim->body_len);
  claim->body = buf;
  idem_call_free(claim->call);
  claim->call = NULL;
}

/*
 * A claim's wait (wait_ms) is cut into slices of at most IDEM_PY_SLICE_MS,
 * each a claim of its own, so that the caller, holding the GIL between
 * them, can raise what a signal asks for (Ctrl-C) within a slice rather
 * than when the whole wait ends. *left is the wait still to go: -1 before
 * the first slice (the options' wait_ms is then taken), 0 once the claim
 * is answered. A slice answered IN_FLIGHT while some of the wait is left
 * sets *left to it, and the caller claims again. Nothing is written
 * between slices: an IN_FLIGHT claim writes nothing.
 */
#define IDEM_PY_SLICE_MS 50

static int64_t idem_py_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The wait of this slice, out of *left (the whole wait when left is
 * NULL); *start is when it began. */
static int64_t idem_py_slice(int64_t wait_ms, int64_t *left, int64_t *start)
{
  if (!left)
    return wait_ms;
  if (*left < 0)
    *left = wait_ms;
  if (*left == 0)
    return 0; /* no wait: no clock read */
  *start = idem_py_now_ms();
  return *left < IDEM_PY_SLICE_MS ? *left : IDEM_PY_SLICE_MS;
}

/* After a slice: *left is what is still to wait, 0 unless the claim was
 * answered IN_FLIGHT (at least 1 ms is counted, so the wait ends). */
static void idem_py_sliced(const idem_py_claim *claim, int64_t *left,
                           int64_t start)
{
  int64_t spent;
  if (!left)
    return;
  if (claim->rc != IDEM_OK || claim->outcome != IDEM_IN_FLIGHT || *left <= 0) {
    *left = 0;
    return;
  }
  spent = idem_py_now_ms() - start;
  *left -= spent < 1 ? 1 : spent;
  if (*left < 0)
    *left = 0;
}

static int idem_py_begin(idem_store *store, const char *tenant,
                         const char *operation, const char *key,
                         const char *request, size_t request_len,
                         const idem_execute_options *opts,
                         idem_py_claim *claim, char *buf, size_t cap,
                         int64_t *left)
{
  idem_id id = {tenant, operation, key};
  idem_execute_options o = *opts;
  int64_t start = 0;
  o.call.wait_ms = idem_py_slice(opts->call.wait_ms, left, &start);
  memset(claim, 0, sizeof *claim);
  claim->rc = idem_execute_begin(store, &id, request, request_len, &o,
                                 &claim->exec, &claim->call);
  if (claim->rc == IDEM_OK) {
    idem_py_read(claim);
    if (!claim->exec)
      idem_py_done(claim, buf, cap);
  }
  idem_py_sliced(claim, left, start);
  return claim->rc;
}

/*
 * The asynchronous halves for an event loop (idem_execute_begin_async(),
 * idem_execute_end_async()): what the answer says is read here, on the
 * thread that answers, into a (the message too: idem_errmsg() is that
 * thread's), and then Python is told, which hands it to the loop. A
 * waiting claim costs no thread: the caller waits on its loop between
 * claims (wait_ms is 0 here).
 */
typedef struct idem_py_async {
  idem_py_claim claim;
  char *buf;
  size_t cap;
  void *handle;
  char errmsg[1024];
} idem_py_async;

static void idem_py_wake(void *handle);

static void idem_py_async_rc(idem_py_async *a, int rc)
{
  a->claim.rc = rc;
  if (rc)
    snprintf(a->errmsg, sizeof a->errmsg, "%%s", idem_errmsg());
}

static void idem_py_begun(void *ctx, int rc, idem_exec *exec, idem_call *call)
{
  idem_py_async *a = ctx;
  idem_py_async_rc(a, rc);
  if (rc == IDEM_OK) {
    a->claim.exec = exec;
    a->claim.call = call;
    idem_py_read(&a->claim);
    if (!exec)
      idem_py_done(&a->claim, a->buf, a->cap);
  }
  idem_py_wake(a->handle);
}

static int idem_py_begin_async(idem_store *store, const char *tenant,
                               const char *operation, const char *key,
                               const char *request, size_t request_len,
                               const idem_execute_options *opts,
                               idem_py_async *a)
{
  idem_id id = {tenant, operation, key};
  idem_execute_options o = *opts;
  o.call.wait_ms = 0;
  memset(&a->claim, 0, sizeof a->claim);
  a->errmsg[0] = 0;
  return idem_execute_begin_async(store, &id, request, request_len, &o,
                                  idem_py_begun, a);
}

static void idem_py_ended(void *ctx, int rc)
{
  idem_py_async *a = ctx;
  idem_py_async_rc(a, rc);
  idem_py_wake(a->handle);
}

static int idem_py_end_async(idem_exec *exec, int result, const char *body,
                             size_t len, idem_py_async *a)
{
  idem_response r;
  memset(&r, 0, sizeof r);
  r.body = body;
  r.body_len = len;
  memset(&a->claim, 0, sizeof a->claim); /* an ending holds no claim */
  a->errmsg[0] = 0;
  return idem_execute_end_async(exec, result, body ? &r : NULL,
                                idem_py_ended, a);
}

/* idem_execute_end() with the response's body (body NULL: no response),
 * without an idem_response made in Python. */
static int idem_py_end(idem_exec *exec, int result, const char *body,
                       size_t len)
{
  idem_response r;
  if (!body)
    return idem_execute_end(exec, result, NULL);
  memset(&r, 0, sizeof r);
  r.body = body;
  r.body_len = len;
  return idem_execute_end(exec, result, &r);
}

static int idem_py_local(void *conn, void *ctx, idem_response *response);

/* idem_execute_local() for a JSON request: fingerprinted, and kept in its
 * canonical form for operators, as idem_execute() does. */
/* idem_execute_local(), or idem_execute_in() on conn when it is not NULL
 * (which waits for nothing: left is then NULL). */
static int idem_py_local_on(idem_store *store, void *conn, const char *tenant,
                            const char *operation, const char *key,
                            const char *request, size_t request_len,
                            const idem_call_options *opts, idem_local_fn fn,
                            void *ctx, idem_py_claim *claim, char *buf,
                            size_t cap, int64_t *left)
{
  idem_id id = {tenant, operation, key};
  idem_call_options o = *opts;
  char fingerprint[IDEM_FINGERPRINT_SIZE];
  char *canonical = NULL;
  size_t canonical_len = 0;
  int64_t start = 0;
  memset(claim, 0, sizeof *claim);
  claim->rc = idem_fingerprint_json(request, request_len, fingerprint,
                                    &canonical, &canonical_len);
  if (claim->rc != IDEM_OK) {
    idem_py_sliced(claim, left, start);
    return claim->rc;
  }
  o.request = canonical;
  o.request_len = canonical_len;
  o.wait_ms = idem_py_slice(opts->wait_ms, left, &start);
  claim->rc = conn ? idem_execute_in(store, conn, &id, fingerprint, &o, fn,
                                     ctx, &claim->call)
                   : idem_execute_local(store, &id, fingerprint, &o, fn, ctx,
                                        &claim->call);
  idem_free(canonical);
  if (claim->rc == IDEM_OK) {
    idem_py_read(claim);
    idem_py_done(claim, buf, cap);
  }
  idem_py_sliced(claim, left, start);
  return claim->rc;
}

static int idem_py_local_with(idem_store *store, const char *tenant,
                              const char *operation, const char *key,
                              const char *request, size_t request_len,
                              const idem_call_options *opts, idem_local_fn fn,
                              void *ctx, idem_py_claim *claim, char *buf,
                              size_t cap, int64_t *left)
{
  return idem_py_local_on(store, NULL, tenant, operation, key, request,
                          request_len, opts, fn, ctx, claim, buf, cap, left);
}

static int idem_py_local_run(idem_store *store, const char *tenant,
                             const char *operation, const char *key,
                             const char *request, size_t request_len,
                             const idem_call_options *opts, void *ctx,
                             idem_py_claim *claim, char *buf, size_t cap,
                             int64_t *left)
{
  return idem_py_local_with(store, tenant, operation, key, request,
                            request_len, opts, idem_py_local, ctx, claim, buf,
                            cap, left);
}

static int idem_py_local_in(idem_store *store, void *conn, const char *tenant,
                            const char *operation, const char *key,
                            const char *request, size_t request_len,
                            const idem_call_options *opts, void *ctx,
                            idem_py_claim *claim, char *buf, size_t cap)
{
  return idem_py_local_on(store, conn, tenant, operation, key, request,
                          request_len, opts, idem_py_local, ctx, claim, buf,
                          cap, NULL);
}

static void *idem_py_sqlite_lib(void)
{
  return (void *)sqlite3_libversion;
}

/*
 * What idem._speedups needs of a claim to answer a replay itself, in the
 * return value: a replay whose body is in buf and that holds nothing to
 * free gives (body_len << 1) | recovered; any other claim -1 - claim->rc,
 * and Python reads claim as after the calls above.
 */
static int64_t idem_py_replay_of(const idem_py_claim *claim)
{
  if (claim->rc == IDEM_OK && claim->outcome == IDEM_REPLAY && !claim->call &&
      !claim->exec)
    return ((int64_t)claim->body_len << 1) | (claim->recovered != 0);
  return -1 - (int64_t)claim->rc;
}

/*
 * idem_py_local_run() with idem._speedups' own callback (fn, ctx), answered
 * as idem_py_begin_held() is, and a claim whose callback ran and
 * committed (PROCEED or RECOVER) gives IDEM_PY_FRESH - recovered, with
 * claim->call left set (for Python to free) only when the body did not fit
 * in buf.
 */
#define IDEM_PY_FRESH (-(INT64_C(1) << 40))
/* A slice of a wait answered IN_FLIGHT with some of the wait left: the
 * caller checks for signals and calls again with the same *left. */
#define IDEM_PY_AGAIN (IDEM_PY_FRESH - 2)
static int64_t idem_py_local_fresh(idem_store *store, const char *tenant,
                                   const char *operation, const char *key,
                                   const char *request, size_t request_len,
                                   const idem_call_options *opts,
                                   idem_local_fn fn, void *ctx,
                                   idem_py_claim *claim, char *buf, size_t cap,
                                   int64_t *left)
{
  idem_py_local_with(store, tenant, operation, key, request, request_len, opts,
                     fn, ctx, claim, buf, cap, left);
  if (left && *left > 0)
    return IDEM_PY_AGAIN;
  if (claim->rc == IDEM_OK &&
      (claim->outcome == IDEM_PROCEED || claim->outcome == IDEM_RECOVER))
    return IDEM_PY_FRESH - (claim->recovered != 0);
  return idem_py_replay_of(claim);
}

/*
 * idem_py_begin() for idem._speedups: a replay whose body is in buf gives
 * (body_len << 1) | recovered (see idem_py_replay_of()), a claim this call
 * holds (PROCEED or RECOVER) IDEM_PY_FRESH - recovered, its exec and call left in claim for
 * idem_py_finish(): the decorator's call in idem._speedups.
 */
static int64_t idem_py_begin_held(idem_store *store, const char *tenant,
                                  const char *operation, const char *key,
                                  const char *request, size_t request_len,
                                  const idem_execute_options *opts,
                                  idem_py_claim *claim, char *buf, size_t cap,
                                  int64_t *left)
{
  idem_py_begin(store, tenant, operation, key, request, request_len, opts,
                claim, buf, cap, left);
  if (left && *left > 0)
    return IDEM_PY_AGAIN;
  if (claim->rc == IDEM_OK && claim->exec)
    return IDEM_PY_FRESH - (claim->recovered != 0);
  return idem_py_replay_of(claim);
}

/* Ends the key that claim holds by result (with the body, or none) and
 * frees its call: libidem's result. */
static int idem_py_finish(idem_py_claim *claim, int result, const char *body,
                          size_t len)
{
  int rc = idem_py_end(claim->exec, result, body, len);
  idem_call_free(claim->call);
  claim->exec = NULL;
  claim->call = NULL;
  return rc;
}

/* The body of a local action's response, for idem._speedups' callback,
 * which knows no struct of libidem's. */
static void idem_py_respond(idem_response *response, const char *body,
                            size_t len)
{
  response->body = body;
  response->body_len = len;
}

static int idem_py_record(const idem_record *record, void *ctx);

/* idem_list() with the binding's callback, which copies each record. */
static int idem_py_list(idem_store *store, const idem_filter *filter,
                        void *ctx)
{
  return idem_list(store, filter, idem_py_record, ctx);
}

typedef struct idem_py_sql {
  int rc;         /* SQLITE_ROW, SQLITE_DONE, or the error; -1: the
                     parameters do not match the statement */
  int columns;    /* of the statement's rows */
  int more;       /* non-zero: text after the statement holds another */
  int64_t changes;
  int64_t last_rowid;
  sqlite3_stmt *stmt; /* kept when rc is SQLITE_ROW: step on, finalize */
} idem_py_sql;

/*
 * Prepares sql (or takes cached, a statement prepared from it before),
 * binds its n parameters (kinds: '0' NULL, '1' integer, '2' real, '3' text,
 * '4' blob; ints, doubles, ptrs and lens may be NULL when no parameter
 * needs them)
 * and steps once: the crossings of a statement that writes, made in one.
 * out->stmt is the statement, to step on while rc is SQLITE_ROW; the
 * caller then resets it, keeps it for the same text, or finalizes it. A
 * second statement after the first is not run: out->more says it is
 * there.
 */
static int idem_py_sqlite_run(void *conn, sqlite3_stmt *cached,
                              const char *sql, int sql_len, int n,
                              const char *kinds, const int64_t *ints,
                              const double *doubles, char **ptrs,
                              const int *lens, idem_py_sql *out)
{
  sqlite3 *db = conn;
  const char *tail = NULL;
  sqlite3_stmt *stmt = cached;
  memset(out, 0, sizeof *out);
  if (stmt) {
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
  } else {
    out->rc = sqlite3_prepare_v2(db, sql, sql_len, &stmt, &tail);
    if (out->rc != SQLITE_OK)
      return out->rc;
  }
  if (tail && tail < sql + sql_len) {
    sqlite3_stmt *next = NULL;
    int rc = sqlite3_prepare_v2(db, tail, (int)(sql + sql_len - tail), &next,
                                NULL);
    out->more = next != NULL || rc != SQLITE_OK;
    sqlite3_finalize(next);
  }
  if (!stmt) {
    out->rc = SQLITE_DONE;
    return out->rc;
  }
  out->stmt = stmt;
  if (out->more || sqlite3_bind_parameter_count(stmt) != n) {
    out->rc = -1;
    return out->rc;
  }
  for (int i = 0; i < n && out->rc == SQLITE_OK; i++) {
    switch (kinds[i]) {
    case '0': out->rc = sqlite3_bind_null(stmt, i + 1); break;
    case '1': out->rc = sqlite3_bind_int64(stmt, i + 1, ints[i]); break;
    case '2': out->rc = sqlite3_bind_double(stmt, i + 1, doubles[i]); break;
    case '3':
      out->rc = sqlite3_bind_text(stmt, i + 1, ptrs[i], lens[i],
                                  SQLITE_TRANSIENT);
      break;
    default:
      out->rc = sqlite3_bind_blob(stmt, i + 1, ptrs[i], lens[i],
                                  SQLITE_TRANSIENT);
    }
  }
  if (out->rc == SQLITE_OK)
    out->rc = sqlite3_step(stmt);
  out->columns = sqlite3_column_count(stmt);
  out->changes = sqlite3_changes(db);
  out->last_rowid = sqlite3_last_insert_rowid(db);
  if (out->rc != SQLITE_ROW)
    sqlite3_reset(stmt); /* ends its read: the statement may be kept */
  return out->rc;
}

static void *idem_py_sqlite_fns(void)
{
  static const idem_py_sqlite_api api = {
      sizeof api,
      sqlite3_prepare_v2,
      sqlite3_bind_parameter_count,
      sqlite3_bind_null,
      sqlite3_bind_int64,
      sqlite3_bind_double,
      sqlite3_bind_text,
      sqlite3_bind_blob,
      sqlite3_step,
      sqlite3_reset,
      sqlite3_clear_bindings,
      sqlite3_finalize,
      sqlite3_column_count,
      sqlite3_column_type,
      sqlite3_column_int64,
      sqlite3_column_double,
      sqlite3_column_text,
      sqlite3_column_blob,
      sqlite3_column_bytes,
      sqlite3_changes,
      sqlite3_last_insert_rowid,
      sqlite3_errmsg,
  };
  return (void *)&api;
}

/* SQLite's static mutexes that a call on any connection may take, in an
 * order SQLite itself nests them (PRNG may take MAIN; a holder of any of
 * them may allocate, taking MEM last). Held by the thread that forks, from
 * just before fork() until just after it in the parent and in the child:
 * a thread of the parent's caught holding one at the fork would leave it
 * locked forever in the child (whose next sqlite3_malloc() would wait on
 * it). */
static const int idem_py_fork_mutexes[] = {
    SQLITE_MUTEX_STATIC_PRNG, SQLITE_MUTEX_STATIC_MAIN,
    SQLITE_MUTEX_STATIC_VFS1, SQLITE_MUTEX_STATIC_LRU,
    SQLITE_MUTEX_STATIC_PMEM, SQLITE_MUTEX_STATIC_MEM};
#define IDEM_PY_FORK_N \
  ((int)(sizeof idem_py_fork_mutexes / sizeof idem_py_fork_mutexes[0]))
static sqlite3_mutex *idem_py_fork_held[IDEM_PY_FORK_N];

static void idem_py_fork_prepare(void)
{
  for (int i = 0; i < IDEM_PY_FORK_N; i++) {
    idem_py_fork_held[i] = sqlite3_mutex_alloc(idem_py_fork_mutexes[i]);
    if (idem_py_fork_held[i])
      sqlite3_mutex_enter(idem_py_fork_held[i]);
  }
}

static void idem_py_fork_done(void)
{
  for (int i = IDEM_PY_FORK_N - 1; i >= 0; i--) {
    if (idem_py_fork_held[i])
      sqlite3_mutex_leave(idem_py_fork_held[i]);
    idem_py_fork_held[i] = NULL;
  }
}
%s
""" % ("#include <libpq-fe.h>" if has_pg else "", _PG_FNS if has_pg else "")


_PG_FNS = r"""
static int idem_py_pq_status(const PGresult *res)
{
  return (int)PQresultStatus(res); /* an enum, as an int */
}

static void *idem_py_pq_lib(void)
{
  return (void *)PQlibVersion;
}

static void *idem_py_pg_fns(void)
{
  static const idem_py_pg_api api = {
      sizeof api,
      PQexecParams,
      PQexecPrepared,
      idem_py_pq_status,
      PQresultErrorMessage,
      PQresultErrorField,
      PQntuples,
      PQnfields,
      PQftype,
      PQgetvalue,
      PQgetlength,
      PQgetisnull,
      PQcmdTuples,
      PQcmdStatus,
      PQclear,
  };
  return (void *)&api;
}
"""
