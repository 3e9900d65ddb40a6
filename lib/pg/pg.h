/*
 * pg.h -- what the files of the PostgreSQL backend share; never
 * installed, and included by the files of lib/pg/ only.
 *
 * The backend is split by concern, as libuv's src/unix is:
 *
 *   store.c  the method table, open and close, claims, completions and
 *            local actions (the statements they run, and why)
 *   conn.c   connections: the pool, (re)connecting and what a failed
 *            connection means, session settings, errors, statements
 *            and pipelines, parameters and binary results
 *   url.c    the store URL or conninfo: idem_schema, libpq's syntax
 *            check, and the passwords that no message may show
 *   admin.c  the schema (creation, migration) and the operators' calls
 *            (get, list, prune, resolve, delete)
 *   lease.c  renewals, waiting on a key in flight, the store's clock
 *   text.c   the message helpers that conn.c and url.c share
 *
 * Names shared between them begin with idem__pg_; the rest are static.
 */
#ifndef IDEM_PG_INTERNAL_H
#define IDEM_PG_INTERNAL_H

#include "store.h"

#include "cache.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SCHEMA_MAX 63 /* PostgreSQL's NAMEDATALEN - 1 */
#define ERR_SIZE 512
/* The statement timeout of the store's sessions, unless one was set. */
#define IDEM__PG_STATEMENT_TIMEOUT "60s"
#define IDEM__PG_STATEMENT_TIMEOUT_MS 60000
/* A statement's deadline on our side is the session's statement_timeout
 * and a quarter of it more, at least this (conn.c). */
#define IDEM__PG_GRACE_MS 1000
/* The deadline of a session's setup, before its statement_timeout is
 * known. */
#define IDEM__PG_SETUP_DEADLINE_MS 20000
#define MAX_PARAMS 12
/* The most statements idem__pg_run_steps() sends in one round trip. */
#define MAX_STEPS 4

/* The prepared statements; their text is in store.c. */
enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_PEEK,
  ST_LOCK,
  ST_INSERT,
  ST_INSERT_DONE,
  ST_KEY_LOCK,
  ST_INSERT_UNKNOWN,
  ST_REPLACE,
  ST_TAKEOVER,
  ST_COMPLETE,
  ST_COMPLETE_LOCAL,
  ST_RELEASE,
  ST_UNKNOWN,
  ST_RENEW,
  ST_GET,
  ST_HOLDER,
  ST_LIST,
  ST_PRUNE,
  ST_PRUNE_SOME,
  ST_RESOLVE_DONE,
  ST_RESOLVE_DELETE,
  ST_DELETE,
  ST_COUNT
};

typedef struct conn {
  PGconn *pg;
  /* Which statements this session has prepared. A reconnect starts a new
   * session, which has none. */
  unsigned char prepared[ST_COUNT];
  char sqlstate[6]; /* of the last failure idem__pg_fail() classified */
  int failed_step;  /* idem__pg_run_steps(): which statement failed, or -1 */
  /* The server refused a write as read-only (a standby, say after a
   * failover): reconnect before the next use, so that a multi-host URL
   * with target_session_attrs=read-write finds the primary. */
  int read_only;
  /* A pipeline could not be read to its end: what the session holds is
   * unknown, so it is replaced before the next use. */
  int unusable;
  /* How long a statement may go unanswered before the connection is given
   * up (ms; idem__pg_await()): the session's statement_timeout, which the
   * server keeps itself, and a grace for its answer to arrive. */
  int64_t deadline_ms;
  /* The last statement was given up at its deadline: the server or the
   * network stopped answering (idem__pg_fail() says so). */
  int timed_out;
  /* The caller's own connection (idem_execute_in()), wrapped for a call:
   * statements are sent unprepared and waited for as libpq does, and the
   * connection is never rolled back, reconnected or shut down by idem. */
  int foreign;
  int gone; /* foreign: the caller's action closed it (IDEM_LOCAL_CLOSED) */
  struct conn *next;
} conn;

typedef struct idem__pg_listener idem__pg_listener;

typedef struct pg_store {
  char *conninfo; /* the target without idem_schema, as libpq gets it */
  char schema[SCHEMA_MAX + 1];
  char *sql[ST_COUNT];
  char *sql_meta, *sql_v1, *sql_v2, *sql_v3, *sql_v4, *sql_version;
  /* The oldest schema version this handle's statements are right for: the
   * version found on open, which a role that may not alter the tables (or
   * a table too busy) leaves below the newest (admin.c). */
  int schema_min;
  idem_store_options o;
  char version[64];

  pthread_mutex_t mu;
  pthread_cond_t cv;
  conn *idle;
  int nconn;
  int64_t last_prune_ms;
  idem__cache *cache; /* completed records, for replays (monotonic clock) */
  /* What no message may show (see idem__pg_scrub()), longest first. */
  char **secret;
  int nsecret, secret_cap;
  int secret_nomem; /* one could not be kept: the open fails */
  idem__pg_listener *listener; /* LISTENs for waiters; made when first
                                  needed (lease.c) */
  conn *renewer; /* the lease scheduler's own connection, so that its
                    renewals never wait behind claims for the pool's */
  /* The renewer's socket while a batch is in flight (-1 otherwise), and
   * whether a holder cut it short (idem__pg_interrupt_renewals()). */
  pthread_mutex_t renew_mu;
  int renew_fd, renew_cut;
  /* How far the server's clock may be ahead of our monotonic clock, at
   * most (ms): server time - our monotonic time before asking, of the
   * reading asked last (clock_asked). INT64_MAX until the first. Under
   * clock_mu. */
  pthread_mutex_t clock_mu;
  int64_t clock_ahead, clock_asked;
  /* The database as idem_execute_in() tells it from another: its name and
   * its server's start time, read at open and again after a mismatch
   * (under mu). */
  char *identity;
} pg_store;

/* Text parameters go in text format, bytea in binary (no escaping). */
typedef struct params {
  int n;
  const char *v[MAX_PARAMS];
  int len[MAX_PARAMS];
  int fmt[MAX_PARAMS];
  char num[MAX_PARAMS][24];
} params;

/* One prepared statement of a pipeline (p may be NULL: no parameters). */
typedef struct step {
  int which;
  const params *p;
} step;

/* ---- text.c: messages --------------------------------------------- */

/* Writes a message into err (ERR_SIZE bytes) and returns rc. */
int idem__pg_failf(char *err, int rc, const char *fmt, ...) IDEM__PRINTF(3, 4);
/* Copies libpq's text as one line. */
void idem__pg_oneline(char *dst, size_t size, const char *src);
/* Whether ch is an ASCII letter or digit. */
int idem__pg_is_word_char(char ch);

/* ---- conn.c: errors ------------------------------------------------ */

/* Classifies a failed call on c (res may be NULL); returns the code. */
int idem__pg_fail(conn *c, const PGresult *res, const char *what, char *err);

/* ---- conn.c: parameters and results -------------------------------- */

void idem__pg_p_text(params *p, const char *t);
void idem__pg_p_i64(params *p, int64_t x);
void idem__pg_p_bytes(params *p, const void *b, size_t n);
void idem__pg_p_id(params *p, const idem_id *id);
/* A lease or retention period, capped so that now + period stays a
 * bigint. */
int64_t idem__pg_period(int64_t ms);
int64_t idem__pg_col_int(const PGresult *r, int row, int col);
const void *idem__pg_col_ptr(const PGresult *r, int row, int col, size_t *len);
void *idem__pg_col_dup(const PGresult *r, int row, int col, size_t *len);
char *idem__pg_col_text(const PGresult *r, int row, int col);

/* ---- conn.c: connections and the pool ------------------------------ */

int idem__pg_conn_open(pg_store *s, conn **out, char *err);
void idem__pg_conn_close(conn *c);
int idem__pg_pool_get(pg_store *s, conn **out, char *err);
void idem__pg_pool_put(pg_store *s, conn *c);
void idem__pg_rollback(conn *c);

/* ---- conn.c: statements -------------------------------------------- */

/* Every statement idem sends is bounded on this side too: a server or a
 * middlebox that stops answering with the connection up (which neither
 * statement_timeout nor TCP timeouts catch) costs a call at most the
 * connection's deadline_ms, after which the connection is given up as if
 * it had broken: a write is then "not run" or, for a COMMIT that may have
 * landed, "unknown", as for any lost connection. */

/* A monotonic deadline deadline_ms from now. */
int64_t idem__pg_deadline(const conn *c);
/* Waits until c's next result can be read without blocking, or until the
 * monotonic time until: then the connection is given up (its socket shut
 * down, so libpq reads its end: every result after is an error at once,
 * and the connection reads as lost). Sends what libpq has queued meanwhile
 * (connections are in non-blocking mode). */
void idem__pg_await(conn *c, int64_t until);
/* PQgetResult() bounded by until. */
PGresult *idem__pg_result(conn *c, int64_t until);
/* Every result of what was sent, read within until: the first failed one,
 * else the last (NULL when there was none). */
PGresult *idem__pg_results(conn *c, int64_t until);
/* PQexec() and PQexecParams() bounded by c's deadline: sent, then every
 * result read; returns the first failed result, else the last (NULL only
 * when nothing could be sent and nothing is known). */
PGresult *idem__pg_exec(conn *c, const char *sql);
PGresult *idem__pg_exec_params(conn *c, const char *sql, int n,
                               const char *const *values, const int *lengths,
                               const int *formats, int binary);

int idem__pg_run_stmt(pg_store *s, conn *c, int which, const params *p,
                      const char *what, PGresult **out, char *err);
int idem__pg_run_steps(pg_store *s, conn *c, const step *st, int n, int keep,
                       const char *what, PGresult **out, char *last_tag,
                       char *err);
int idem__pg_revived(pg_store *s, conn *c, int *rc, char *err);
int idem__pg_run_stmt_retry(pg_store *s, conn *c, int which, const params *p,
                            const char *what, PGresult **out, char *err);
int idem__pg_run_simple(conn *c, const char *sql, const char *what, char *err);
int idem__pg_begin(conn *c, char *err);
int idem__pg_commit(conn *c, char *err);

/* ---- url.c --------------------------------------------------------- */

/* Splits the target into libpq's conninfo and idem's schema name, checks
 * its syntax and collects its secrets. */
int idem__pg_parse_target(pg_store *s, const char *target, char *err);
/* Shows every secret of the target in msg as "***". */
void idem__pg_scrub(const pg_store *s, char *msg, size_t size);
/* ---- admin.c ------------------------------------------------------- */

/* Replaces every "{S}" in tmpl with the quoted schema name. */
char *idem__pg_build_sql(const char *tmpl, const char *schema);
/* Builds s's schema statements (sql_meta, sql_v1 to sql_v4, sql_version). */
int idem__pg_schema_sql(pg_store *s);
int idem__pg_server_version(pg_store *s, conn *c, char *err);
int idem__pg_ensure_schema(pg_store *s, conn *c, char *err);
/* The schema version at which the recovered mark exists. */
#define IDEM__PG_SCHEMA_RECOVERED 3
/* IDEM_OK when s's statements are right for a store at schema version v,
 * else IDEM_ESCHEMA with the detail in err (a newer idem migrated it). */
int idem__pg_schema_check(const pg_store *s, int version, char *err);
/* After a read on c that failed with rc: IDEM_ESCHEMA (detail in err) when
 * the schema changed under it, else rc. May roll back c's transaction. */
int idem__pg_read_failed(pg_store *s, conn *c, int rc, char *err);
/* idem_store_check(): whether the server answers and takes writes. */
int idem__pg_check(void *state);
int idem__pg_get(void *state, const idem_id *id, idem_record **out);
int idem__pg_list(void *state, const idem_filter *filter, idem_record_fn fn,
                  void *ctx);
int idem__pg_prune(void *state, int64_t *removed);
int idem__pg_resolve(void *state, const idem_id *id,
                     const idem_response *response,
                     const idem_resolve_options *opts);
int idem__pg_remove(void *state, const idem_id *id);

/* ---- lease.c: renewals in batches, watching keys in flight ---------- */

void idem__pg_run_many(void *state, idem__op **ops, int n);
void idem__pg_interrupt_renewals(void *state);
int idem__pg_watch(void *state, const idem_id *id);
/* A reading of the server's clock: server_ms, read by a statement sent at
 * our asked_mono (idem__mono_ms()). */
void idem__pg_clock_reading(pg_store *s, int64_t asked_mono,
                            int64_t server_ms);
int64_t idem__pg_clock_ahead(void *state);
void idem__pg_listener_free(idem__pg_listener *l);

#endif
