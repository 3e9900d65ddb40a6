/*
 * cmd_bench.c -- `idem bench`: how many durable claims a store takes, like
 * pgbench for idem.
 *
 * Four phases, each run by N worker threads for S seconds:
 *
 *   fresh           a new key per call through idem_execute_local(); the
 *                   local action inserts one row into bench_tickets, so the
 *                   side effect and the record commit together (the seed's
 *                   create_ticket);
 *   claim_complete  a new key per call through idem_claim() and then
 *                   idem_complete(): two durable writes;
 *   replay          idem_execute_local() on keys completed beforehand: the
 *                   stored response comes back and nothing is written;
 *   conflict        the same keys with another request: refused, nothing is
 *                   written.
 *
 * Every call fingerprints its request (RFC 8785 and SHA-256) as a real caller
 * does, and every write is durable: the store is opened with its defaults
 * (synchronous=FULL, group commit on). The rate at which the machine can
 * fsync in the store's directory is measured too, since one durable commit
 * cannot be faster than one fsync.
 *
 * The program may include sqlite3.h and libpq-fe.h: it is the caller whose
 * table the local action writes to, not the engine. What differs per backend
 * is kept to one bench_backend entry: how to create the table and the
 * mutation itself.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#ifdef IDEM_HAVE_PG
#include <libpq-fe.h>
#endif
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: idem bench [--store URL] [--workers N] [--seconds S] [--json]\n"
    "\n"
    "Measures the throughput and latency of durable claims, like pgbench.\n"
    "N worker threads run each phase for S seconds:\n"
    "\n"
    "  fresh           a new key per call through execute_local; the local\n"
    "                  action inserts one row into the table bench_tickets in\n"
    "                  the same transaction as the record\n"
    "  claim_complete  a new key per call: claim, then complete (two durable\n"
    "                  writes)\n"
    "  replay          1000 completed keys, cycled: the stored response\n"
    "  conflict        the same keys with another request: refused\n"
    "\n"
    "Every call fingerprints its request and every write is durable: the\n"
    "store runs with its defaults (SQLite: synchronous=FULL, group commit;\n"
    "PostgreSQL: the server's synchronous_commit, reported). The\n"
    "machine's fsync rate in the store's directory (4 KiB write + fdatasync\n"
    "for 1 s), the physical limit of one durable commit, is reported too.\n"
    "\n"
    "  --store URL    the store to write to: sqlite:PATH, a PATH or\n"
    "                 postgresql://... (bench_tickets is then created in the\n"
    "                 connection's search_path, next to the caller's tables;\n"
    "                 the fsync rate is that of $TMPDIR on this machine).\n"
    "                 Without it (IDEM_STORE is ignored, so that a real store\n"
    "                 is never filled by accident) a fresh SQLite store is\n"
    "                 made in a temporary directory under $TMPDIR (or /tmp)\n"
    "                 and removed at the end. With it, records and\n"
    "                 bench_tickets rows are left there.\n"
    "  --workers N    worker threads (default 1, at most 1024)\n"
    "  --seconds S    length of each phase (default 3; fractions such as 0.5\n"
    "                 and units such as 500ms are accepted)\n"
    "  --json         print one JSON object instead of the table\n"
    "  --help         this text\n"
    "\n"
    "Latencies are per call, in microseconds (p50 and p99). On PostgreSQL,\n"
    "0.5 s of untimed fresh calls first open idem's connections, as pgbench\n"
    "leaves its connection time out of its tps.\n"
    "\n"
    "Exit status: 0 every call had the expected outcome, 1 some call failed\n"
    "or had an unexpected outcome (or the store could not be set up), 2 usage.\n";

#define TENANT "bench"
#define OPERATION "create_ticket"
#define PREPARED_KEYS 1000
#define PREP_THREADS 16
#define MAX_WORKERS 1024
#define MAX_REPORTS 10
#define LAT_CAP ((size_t)1 << 22) /* latency samples kept per worker */
#define KEY_SIZE 96

/* The seed's fixture payload, and the same ticket with another priority. */
static const char payload_json[] =
    "{\"project\": \"demo-agent\", \"title\": \"Investigate a synthetic "
    "queue backlog\", \"priority\": \"normal\"}";
static const char other_json[] =
    "{\"project\": \"demo-agent\", \"title\": \"Investigate a synthetic "
    "queue backlog\", \"priority\": \"urgent\"}";
static const char complete_body[] = "{\"ok\":true}";

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

/* ---- backends -------------------------------------------------------- */

/* What the local action gets: its request and room for its response. */
typedef struct ticket {
  const char *payload; /* the canonical request, NUL-terminated */
  size_t payload_len;
  char body[64]; /* {"ticket_id":N}; valid until execute_local returns */
  char err[256]; /* why the mutation failed, when it did */
} ticket;

/*
 * One backend's part of the bench. setup creates bench_tickets next to the
 * records (target is the URL without its scheme); insert_ticket is the local
 * action, run inside the store's transaction on the connection it is given.
 * A backend whose insert_ticket is NULL has no bench yet.
 */
typedef struct bench_backend {
  const char *name;  /* as idem_store_backend() says it */
  const char *title; /* for messages */
  int (*setup)(const char *target, char *err, size_t errlen);
  idem_local_fn insert_ticket;
  /* Seconds of untimed fresh calls before the phases: a store that opens
   * its connections on demand (and prepares statements in each) has them
   * ready, as pgbench leaves its connection time out of its tps. */
  double warmup_s;
} bench_backend;

/* The ticket's failure, for the report; the first one wins. */
static void ticket_fail(ticket *t, const char *what, const char *detail) {
  size_t n;
  if (t->err[0])
    return;
  snprintf(t->err, sizeof t->err, "%s: %s", what, detail ? detail : "");
  n = strlen(t->err);
  while (n > 0 && (t->err[n - 1] == '\n' || t->err[n - 1] == ' '))
    t->err[--n] = '\0';
}

static int sqlite_setup(const char *path, char *err, size_t errlen) {
  sqlite3 *db = NULL;
  int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
  if (rc == SQLITE_OK) {
    sqlite3_busy_timeout(db, 10000);
    rc = sqlite3_exec(db,
                      "CREATE TABLE IF NOT EXISTS bench_tickets (id INTEGER "
                      "PRIMARY KEY, payload TEXT NOT NULL)",
                      NULL, NULL, NULL);
  }
  if (rc != SQLITE_OK)
    snprintf(err, errlen, "%s: create table bench_tickets: %s", path,
             db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  sqlite3_close(db);
  return rc == SQLITE_OK ? 0 : -1;
}

/* The mutation: one row, whose id becomes the response. */
static int sqlite_insert_ticket(void *conn, void *ctx, idem_response *r) {
  sqlite3 *db = conn;
  ticket *t = ctx;
  sqlite3_stmt *q = NULL;
  int n;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO bench_tickets (payload) VALUES (?1)",
                         -1, &q, NULL) != SQLITE_OK) {
    ticket_fail(t, "prepare", sqlite3_errmsg(db));
    return 1;
  }
  sqlite3_bind_text(q, 1, t->payload, (int)t->payload_len, SQLITE_STATIC);
  n = sqlite3_step(q);
  if (n != SQLITE_DONE)
    ticket_fail(t, "insert", sqlite3_errmsg(db));
  sqlite3_finalize(q);
  if (n != SQLITE_DONE)
    return 1;
  n = snprintf(t->body, sizeof t->body, "{\"ticket_id\":%lld}",
               (long long)sqlite3_last_insert_rowid(db));
  r->status = 201;
  r->body = t->body;
  r->body_len = (size_t)n;
  return 0;
}

static const bench_backend sqlite_backend = {"sqlite", "SQLite", sqlite_setup,
                                             sqlite_insert_ticket, 0};

#ifdef IDEM_HAVE_PG
/*
 * PostgreSQL. The table lives wherever the caller's own tables do: the
 * connection's search_path, which idem never changes (its records are in
 * their own schema). The mutation is one prepared INSERT ... RETURNING.
 */
#define PG_TICKET_STMT "idem_bench_insert_ticket"
#define PG_TICKET_SQL                                                         \
  "INSERT INTO bench_tickets (payload) VALUES ($1::text) RETURNING id"
#define PG_PREPARED_MAX 256

/* The server's synchronous_commit, read at setup for the report. */
static char pg_synchronous_commit[32] = "?";

/* Ignores notices ("relation already exists, skipping"). */
static void pg_quiet(void *arg, const char *message) {
  (void)arg;
  (void)message;
}

static int pg_setup(const char *url, char *err, size_t errlen) {
  const char *const kw[] = {"connect_timeout", "fallback_application_name",
                            "dbname", NULL};
  const char *val[] = {"10", "idem-bench", NULL, NULL};
  char *libpq_url = cli_pg_libpq_url(url);
  PGconn *pg;
  PGresult *res;
  int ok;
  if (!libpq_url) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  val[2] = libpq_url;
  pg = PQconnectdbParams(kw, val, 1);
  free(libpq_url);
  if (!pg || PQstatus(pg) != CONNECTION_OK) {
    snprintf(err, errlen, "postgresql: cannot connect to create "
                          "bench_tickets: %s",
             pg ? PQerrorMessage(pg) : "out of memory");
    PQfinish(pg);
    return -1;
  }
  PQsetNoticeProcessor(pg, pg_quiet, NULL);
  res = PQexec(pg, "CREATE TABLE IF NOT EXISTS bench_tickets (id bigserial "
                   "PRIMARY KEY, payload text NOT NULL)");
  ok = PQresultStatus(res) == PGRES_COMMAND_OK;
  if (!ok)
    snprintf(err, errlen, "postgresql: create table bench_tickets: %s",
             PQresultErrorMessage(res));
  PQclear(res);
  if (ok) {
    res = PQexec(pg, "SHOW synchronous_commit");
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
      snprintf(pg_synchronous_commit, sizeof pg_synchronous_commit, "%s",
               PQgetvalue(res, 0, 0));
    PQclear(res);
  }
  PQfinish(pg);
  return ok ? 0 : -1;
}

/*
 * The sessions in which the insert is prepared. The store hands the action
 * its pooled connections, so one PGconn serves many calls (from whichever
 * thread holds it at the time) and the statement is prepared once per
 * session. A session is known by the PGconn and its server process: a
 * reconnect (PQreset) keeps the pointer but starts a session without the
 * statement, and a freed PGconn's address may be reused by a new one.
 */
typedef struct pg_prepared {
  const PGconn *conn;
  int pid;
} pg_prepared;

static pthread_mutex_t pg_prepared_mu = PTHREAD_MUTEX_INITIALIZER;
static pg_prepared pg_prepared_set[PG_PREPARED_MAX];
static size_t pg_prepared_n, pg_prepared_evict;

static int pg_prepared_find(const PGconn *conn, int pid) {
  int found = 0;
  pthread_mutex_lock(&pg_prepared_mu);
  for (size_t i = 0; i < pg_prepared_n && !found; i++)
    found = pg_prepared_set[i].conn == conn && pg_prepared_set[i].pid == pid;
  pthread_mutex_unlock(&pg_prepared_mu);
  return found;
}

/* Remembers (conn, pid), replacing conn's older session; pid 0 forgets. */
static void pg_prepared_set_pid(const PGconn *conn, int pid) {
  size_t i;
  pthread_mutex_lock(&pg_prepared_mu);
  for (i = 0; i < pg_prepared_n; i++)
    if (pg_prepared_set[i].conn == conn)
      break;
  if (pid == 0) {
    if (i < pg_prepared_n)
      pg_prepared_set[i] = pg_prepared_set[--pg_prepared_n];
  } else {
    if (i == pg_prepared_n) {
      if (pg_prepared_n < PG_PREPARED_MAX) {
        pg_prepared_n++;
      } else { /* many reconnects: forget an older session */
        i = pg_prepared_evict++ % PG_PREPARED_MAX;
      }
    }
    pg_prepared_set[i].conn = conn;
    pg_prepared_set[i].pid = pid;
  }
  pthread_mutex_unlock(&pg_prepared_mu);
}

/*
 * Prepares the insert in conn's session unless it already is. A session
 * not in the set asks the server first: "prepared statement already
 * exists" would abort the store's transaction, and the set may have
 * forgotten a session that still has it. That query runs once per session.
 */
static int pg_prepare_ticket(PGconn *pg, ticket *t) {
  const char *name = PG_TICKET_STMT;
  int pid = PQbackendPID(pg), exists;
  PGresult *res;
  if (pg_prepared_find(pg, pid))
    return 0;
  res = PQexecParams(pg,
                     "SELECT 1 FROM pg_prepared_statements WHERE name = $1",
                     1, NULL, &name, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    ticket_fail(t, "prepare", PQresultErrorMessage(res));
    PQclear(res);
    return -1;
  }
  exists = PQntuples(res) > 0;
  PQclear(res);
  if (!exists) {
    res = PQprepare(pg, PG_TICKET_STMT, PG_TICKET_SQL, 0, NULL);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      ticket_fail(t, "prepare", PQresultErrorMessage(res));
      PQclear(res);
      return -1;
    }
    PQclear(res);
  }
  pg_prepared_set_pid(pg, pid);
  return 0;
}

/* The mutation: one row, whose id becomes the response. */
static int pg_insert_ticket(void *conn, void *ctx, idem_response *r) {
  PGconn *pg = conn;
  ticket *t = ctx;
  const char *v[1] = {t->payload};
  const char *state;
  PGresult *res;
  int n;
  if (pg_prepare_ticket(pg, t) != 0)
    return 1;
  res = PQexecPrepared(pg, PG_TICKET_STMT, 1, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
    ticket_fail(t, "insert", PQresultErrorMessage(res));
    /* Deallocated behind our back (DISCARD ALL): prepare it next time. */
    state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (state && strcmp(state, "26000") == 0)
      pg_prepared_set_pid(pg, 0);
    PQclear(res);
    return 1;
  }
  n = snprintf(t->body, sizeof t->body, "{\"ticket_id\":%s}",
               PQgetvalue(res, 0, 0));
  PQclear(res);
  if (n < 0 || (size_t)n >= sizeof t->body)
    return 1;
  r->status = 201;
  r->body = t->body;
  r->body_len = (size_t)n;
  return 0;
}
#else
/* Without PostgreSQL (-DIDEM_WITH_POSTGRESQL=OFF) the store does not open,
 * so that these are never reached; the backend stays for the URL's sake. */
static char pg_synchronous_commit[32] = "?";

static int pg_setup(const char *url, char *err, size_t errlen) {
  (void)url;
  snprintf(err, errlen, "postgresql: this idem was built without "
                        "PostgreSQL support");
  return -1;
}

static int pg_insert_ticket(void *conn, void *ctx, idem_response *r) {
  (void)conn;
  (void)r;
  ticket_fail(ctx, "insert", "built without PostgreSQL support");
  return 1;
}
#endif

static const bench_backend pg_backend = {"postgresql", "PostgreSQL", pg_setup,
                                         pg_insert_ticket, 0.5};

/* The backend of url and the part of url it reads (engine's syntax). */
static const bench_backend *backend_for(const char *url, const char **target) {
  if (strncmp(url, "postgresql://", 13) == 0 ||
      strncmp(url, "postgres://", 11) == 0) {
    *target = url;
    return &pg_backend;
  }
  *target = url;
  if (strncmp(url, "sqlite:", 7) == 0) {
    *target = url + 7;
    if (strncmp(*target, "//", 2) == 0)
      *target += 2;
  }
  return &sqlite_backend;
}

/* ---- the bench ----------------------------------------------------------- */

enum { PH_FRESH, PH_CLAIM_COMPLETE, PH_REPLAY, PH_CONFLICT, PH_COUNT };
static const char *const phase_names[PH_COUNT] = {"fresh", "claim_complete",
                                                  "replay", "conflict"};

typedef struct phase_result {
  long ops, errors;
  double elapsed_s, ops_per_s, p50_us, p99_us;
} phase_result;

typedef struct bench bench;

typedef struct worker {
  bench *b;
  int index;
  int phase;
  unsigned long long counter; /* fresh keys made by this worker */
  size_t cursor;              /* next prepared key */
  long ops, errors;
  float *lat; /* latency of each successful call, microseconds */
  size_t nlat, cap;
  double end_ms;
  ticket t;
  pthread_t thread;
} worker;

struct bench {
  idem_store *store;
  const bench_backend *backend;
  int nworkers;
  double seconds;
  char run_id[48]; /* pid and start time: keys are unique per run */
  char (*keys)[KEY_SIZE];
  size_t nkeys;
  pthread_mutex_t gate_mu; /* the start of a phase */
  pthread_cond_t gate_cv;
  int nready, go;
  double start_ms, deadline_ms;
  pthread_mutex_t mu; /* reports and the preparation's next index */
  int reported;
  size_t next_prep;
  int prep_failed;
};

/* Prints the detail of one failed call; only the first few are shown. */
static void report(bench *b, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(bench *b, const char *key, const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&b->mu);
  if (b->reported < MAX_REPORTS) {
    fprintf(stderr, "idem bench: key %s: ", key);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
  } else if (b->reported == MAX_REPORTS) {
    fputs("idem bench: more failures; not shown\n", stderr);
  }
  b->reported++;
  pthread_mutex_unlock(&b->mu);
}

static const char *rc_detail(int rc) {
  const char *d = idem_errmsg();
  return d[0] ? d : idem_strerror(rc);
}

/* Canonical form and fingerprint of a request, as a caller makes them. */
static int make_request(bench *b, const char *key, const char *json,
                        char **canon, size_t *len,
                        char fp[IDEM_FINGERPRINT_SIZE]) {
  int rc = idem_canonicalize(json, strlen(json), NULL, canon, len, NULL);
  if (rc == IDEM_OK)
    rc = idem_sha256_hex(*canon, *len, fp);
  if (rc != IDEM_OK) {
    report(b, key, "fingerprint: %s (%s)", rc_detail(rc), idem_rc_name(rc));
    idem_free(*canon);
    *canon = NULL;
    return -1;
  }
  return 0;
}

/* One local action; want is the outcome it must have. Returns 0 or -1. */
static int do_local(worker *w, const char *key, const char *json,
                    idem_outcome want) {
  bench *b = w->b;
  idem_id id = {TENANT, OPERATION, key};
  idem_call_options o;
  idem_call *call = NULL;
  const idem_response *r;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon = NULL;
  size_t len = 0;
  int rc, status = -1;

  if (make_request(b, key, json, &canon, &len, fp) != 0)
    return -1;
  memset(&o, 0, sizeof o);
  o.request = canon;
  o.request_len = len;
  w->t.payload = canon;
  w->t.payload_len = len;
  w->t.err[0] = '\0';
  rc = idem_execute_local(b->store, &id, fp, &o, b->backend->insert_ticket,
                          &w->t, &call);
  if (rc != IDEM_OK) {
    report(b, key, "execute_local: %s (%s)%s%s", rc_detail(rc),
           idem_rc_name(rc), w->t.err[0] ? "; the action: " : "", w->t.err);
    goto out;
  }
  if (idem_call_outcome(call) != want) {
    report(b, key, "execute_local: outcome %s, expected %s",
           idem_outcome_name(idem_call_outcome(call)),
           idem_outcome_name(want));
    goto out;
  }
  r = idem_call_response(call);
  if ((want == IDEM_PROCEED || want == IDEM_REPLAY) &&
      (!r || r->status != 201 || r->body_len == 0)) {
    report(b, key, "execute_local: %s without the ticket's response",
           idem_outcome_name(want));
    goto out;
  }
  status = 0;
out:
  idem_call_free(call);
  idem_free(canon);
  return status;
}

static int do_claim_complete(worker *w, const char *key) {
  bench *b = w->b;
  idem_id id = {TENANT, OPERATION, key};
  idem_call_options o;
  idem_response resp;
  idem_call *call = NULL;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *canon = NULL;
  size_t len = 0;
  int rc, status = -1;

  if (make_request(b, key, payload_json, &canon, &len, fp) != 0)
    return -1;
  memset(&o, 0, sizeof o);
  o.request = canon;
  o.request_len = len;
  rc = idem_claim(b->store, &id, fp, &o, &call);
  if (rc != IDEM_OK) {
    report(b, key, "claim: %s (%s)", rc_detail(rc), idem_rc_name(rc));
    goto out;
  }
  if (idem_call_outcome(call) != IDEM_PROCEED) {
    report(b, key, "claim: outcome %s, expected proceed",
           idem_outcome_name(idem_call_outcome(call)));
    goto out;
  }
  memset(&resp, 0, sizeof resp);
  resp.status = 200;
  resp.body = complete_body;
  resp.body_len = sizeof complete_body - 1;
  rc = idem_complete(b->store, call, &resp);
  if (rc != IDEM_OK) {
    report(b, key, "complete: %s (%s)", rc_detail(rc), idem_rc_name(rc));
    goto out;
  }
  status = 0;
out:
  idem_call_free(call);
  idem_free(canon);
  return status;
}

/* One call of the worker's phase. */
static int one_call(worker *w) {
  bench *b = w->b;
  char key[KEY_SIZE];
  const char *pk;
  switch (w->phase) {
  case PH_FRESH:
  case PH_CLAIM_COMPLETE:
    snprintf(key, sizeof key, "%s-%s-w%d-%llu", b->run_id,
             w->phase == PH_FRESH ? "f" : "c", w->index, w->counter++);
    return w->phase == PH_FRESH ? do_local(w, key, payload_json, IDEM_PROCEED)
                                : do_claim_complete(w, key);
  case PH_REPLAY:
  case PH_CONFLICT:
    pk = b->keys[w->cursor];
    w->cursor = (w->cursor + 1) % b->nkeys;
    return w->phase == PH_REPLAY ? do_local(w, pk, payload_json, IDEM_REPLAY)
                                 : do_local(w, pk, other_json, IDEM_CONFLICT);
  }
  return -1;
}

static void record_latency(worker *w, double us) {
  if (w->nlat == w->cap) {
    size_t ncap = w->cap ? w->cap * 2 : 4096;
    float *p;
    if (ncap > LAT_CAP)
      return; /* enough samples for the percentiles */
    p = realloc(w->lat, ncap * sizeof *p);
    if (!p)
      return;
    w->lat = p;
    w->cap = ncap;
  }
  w->lat[w->nlat++] = (float)us;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  bench *b = w->b;
  /* Every worker starts when all are ready and the deadline is set. */
  pthread_mutex_lock(&b->gate_mu);
  b->nready++;
  pthread_cond_broadcast(&b->gate_cv);
  while (!b->go)
    pthread_cond_wait(&b->gate_cv, &b->gate_mu);
  pthread_mutex_unlock(&b->gate_mu);
  for (;;) {
    double t0 = cli_now_ms(), t1;
    if (t0 >= b->deadline_ms || stop_requested)
      break;
    if (one_call(w) == 0) {
      t1 = cli_now_ms();
      w->ops++;
      record_latency(w, (t1 - t0) * 1000.0);
    } else {
      w->errors++;
    }
  }
  w->end_ms = cli_now_ms();
  return NULL;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double percentile(const float *v, size_t n, double p) {
  size_t rank;
  if (n == 0)
    return 0;
  rank = (size_t)(p * (double)n + 0.999999);
  if (rank < 1)
    rank = 1;
  if (rank > n)
    rank = n;
  return v[rank - 1];
}

static int run_phase(bench *b, worker *ws, int phase, phase_result *res) {
  size_t total = 0, at = 0;
  float *all;
  double end = 0;
  int i, started = 0, rc = 0;

  memset(res, 0, sizeof *res);
  for (i = 0; i < b->nworkers; i++) {
    worker *w = &ws[i];
    w->phase = phase;
    w->ops = w->errors = 0;
    w->nlat = 0;
    w->cursor = (b->nkeys * (size_t)i) / (size_t)b->nworkers;
  }
  b->nready = 0;
  b->go = 0;
  for (i = 0; i < b->nworkers; i++) {
    if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0)
      break;
    started++;
  }
  if (started < b->nworkers) {
    cli_error("bench", "cannot start %d worker threads", b->nworkers);
    rc = -1;
  }
  pthread_mutex_lock(&b->gate_mu);
  while (b->nready < started)
    pthread_cond_wait(&b->gate_cv, &b->gate_mu);
  b->start_ms = cli_now_ms();
  /* On failure the workers that did start make no call. */
  b->deadline_ms = rc == 0 ? b->start_ms + b->seconds * 1000.0 : 0;
  b->go = 1;
  pthread_cond_broadcast(&b->gate_cv);
  pthread_mutex_unlock(&b->gate_mu);
  for (i = 0; i < started; i++)
    pthread_join(ws[i].thread, NULL);
  if (rc != 0)
    return rc;

  for (i = 0; i < b->nworkers; i++) {
    res->ops += ws[i].ops;
    res->errors += ws[i].errors;
    total += ws[i].nlat;
    if (ws[i].end_ms > end)
      end = ws[i].end_ms;
  }
  res->elapsed_s = (end - b->start_ms) / 1000.0;
  res->ops_per_s = res->elapsed_s > 0 ? res->ops / res->elapsed_s : 0;
  all = malloc((total ? total : 1) * sizeof *all);
  if (all) {
    for (i = 0; i < b->nworkers; i++) {
      if (ws[i].nlat)
        memcpy(all + at, ws[i].lat, ws[i].nlat * sizeof *all);
      at += ws[i].nlat;
    }
    qsort(all, total, sizeof *all, cmp_float);
    res->p50_us = percentile(all, total, 0.50);
    res->p99_us = percentile(all, total, 0.99);
    free(all);
  }
  return 0;
}

/* ---- the keys that replay and conflict reuse ---------------------------- */

static void *prep_main(void *arg) {
  worker *w = arg;
  bench *b = w->b;
  for (;;) {
    size_t i;
    pthread_mutex_lock(&b->mu);
    i = b->next_prep++;
    pthread_mutex_unlock(&b->mu);
    if (i >= b->nkeys || stop_requested)
      break;
    if (do_local(w, b->keys[i], payload_json, IDEM_PROCEED) != 0) {
      pthread_mutex_lock(&b->mu);
      b->prep_failed = 1;
      pthread_mutex_unlock(&b->mu);
      break;
    }
  }
  return NULL;
}

/* Completes b->nkeys keys through execute_local, many at a time. */
static int prepare_keys(bench *b) {
  worker ws[PREP_THREADS];
  int i, started = 0;
  b->keys = calloc(PREPARED_KEYS, sizeof *b->keys);
  if (!b->keys) {
    cli_error("bench", "out of memory");
    return -1;
  }
  b->nkeys = PREPARED_KEYS;
  for (size_t k = 0; k < b->nkeys; k++)
    snprintf(b->keys[k], KEY_SIZE, "%s-r-%zu", b->run_id, k);
  memset(ws, 0, sizeof ws);
  for (i = 0; i < PREP_THREADS; i++) {
    ws[i].b = b;
    ws[i].index = i;
    if (pthread_create(&ws[i].thread, NULL, prep_main, &ws[i]) != 0)
      break;
    started++;
  }
  if (started == 0)
    prep_main(&ws[0]);
  for (i = 0; i < started; i++)
    pthread_join(ws[i].thread, NULL);
  if (b->prep_failed || stop_requested) {
    cli_error("bench", "could not prepare the %d completed keys that replay "
                       "and conflict reuse",
              PREPARED_KEYS);
    return -1;
  }
  return 0;
}

/* ---- the machine's fsync rate ------------------------------------------- */

/* Writes 4 KiB and fdatasyncs it in a loop in dir for about seconds. */
static double fsync_rate(const char *dir, double seconds) {
  char path[4096], buf[4096];
  double t0, t1;
  long n = 0;
  int fd;
  if (snprintf(path, sizeof path, "%s/idem-bench-fsync.XXXXXX", dir) >=
      (int)sizeof path)
    return -1;
  fd = mkstemp(path);
  if (fd < 0) {
    cli_error("bench", "fsync probe in %s: %s", dir, strerror(errno));
    return -1;
  }
  memset(buf, 'x', sizeof buf);
  /* Allocate the block first: the timed loop measures durable overwrites,
   * as a reused WAL sees them. */
  if (pwrite(fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf || fsync(fd)) {
    cli_error("bench", "fsync probe: %s", strerror(errno));
    goto fail;
  }
  t0 = t1 = cli_now_ms();
  while (t1 - t0 < seconds * 1000.0 && !stop_requested) {
    buf[n % sizeof buf] ^= 1;
    if (pwrite(fd, buf, sizeof buf, 0) != (ssize_t)sizeof buf ||
        fdatasync(fd) != 0) {
      cli_error("bench", "fsync probe: %s", strerror(errno));
      goto fail;
    }
    n++;
    t1 = cli_now_ms();
  }
  close(fd);
  unlink(path);
  return t1 > t0 ? n / ((t1 - t0) / 1000.0) : 0;
fail:
  close(fd);
  unlink(path);
  return -1;
}

/* ---- the temporary store ----------------------------------------------- */

static int make_temp_dir(char *dir, size_t size) {
  const char *tmp = getenv("TMPDIR");
  if (!tmp || !*tmp)
    tmp = "/tmp";
  if (snprintf(dir, size, "%s/idem-bench.XXXXXX", tmp) >= (int)size) {
    cli_error("bench", "TMPDIR is too long");
    return -1;
  }
  if (!mkdtemp(dir)) {
    cli_error("bench", "cannot create a temporary directory in %s: %s", tmp,
              strerror(errno));
    return -1;
  }
  return 0;
}

/* Removes the directory made by make_temp_dir() and the files in it (the
 * store, its -wal and -shm, the fsync probe). */
static void remove_temp_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[4096 + 256 + 2];
  if (d) {
    while ((e = readdir(d))) {
      if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
        continue;
      snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  if (rmdir(dir) != 0)
    cli_error("bench", "could not remove %s: %s", dir, strerror(errno));
}

/* The directory that holds the file path. */
static void dir_of(const char *path, char *dir, size_t size) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    snprintf(dir, size, ".");
  else if (slash == path)
    snprintf(dir, size, "/");
  else
    snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

/* ---- output ------------------------------------------------------------ */

static double round1(double x) { return (double)(long long)(x * 10 + 0.5) / 10; }

static int print_json(const bench *b, const char *url, int temporary,
                      double fsync_per_s, const phase_result *res, int nres,
                      long errors) {
  json_t *o = json_object(), *phases = json_object();
  char name[64];
  int rc;
  if (!o || !phases) {
    json_decref(o);
    json_decref(phases);
    return -1;
  }
  json_object_set_new(o, "idem_version", json_string(idem_version()));
  json_object_set_new(o, "sqlite_version", json_string(sqlite3_libversion()));
  json_object_set_new(o, "store", json_string(idem_store_backend(b->store)));
  json_object_set_new(o, "store_engine_version",
                      json_string(idem_store_engine_version(b->store)));
  if (b->backend == &pg_backend)
    json_object_set_new(o, "postgresql_version",
                        json_string(idem_store_engine_version(b->store)));
  {
    char *safe = temporary ? NULL : cli_redact(url, url);
    json_object_set_new(o, "store_url", safe ? json_string(safe) : json_null());
    free(safe);
  }
  json_object_set_new(o, "workers", json_integer(b->nworkers));
  json_object_set_new(o, "seconds", json_real(b->seconds));
  json_object_set_new(o, "fsync_per_s", json_real(round1(fsync_per_s)));
  json_object_set_new(o, "errors", json_integer(errors));
  for (int p = 0; p < nres; p++) {
    json_t *ph = json_object();
    snprintf(name, sizeof name, "%s_ops_per_s", phase_names[p]);
    json_object_set_new(o, name, json_real(round1(res[p].ops_per_s)));
    json_object_set_new(ph, "ops", json_integer(res[p].ops));
    json_object_set_new(ph, "ops_per_s", json_real(round1(res[p].ops_per_s)));
    json_object_set_new(ph, "p50_us", json_real(round1(res[p].p50_us)));
    json_object_set_new(ph, "p99_us", json_real(round1(res[p].p99_us)));
    json_object_set_new(ph, "errors", json_integer(res[p].errors));
    json_object_set_new(ph, "elapsed_s", json_real(res[p].elapsed_s));
    json_object_set_new(phases, phase_names[p], ph);
  }
  json_object_set_new(o, "prepared_keys", json_integer((json_int_t)b->nkeys));
  json_object_set_new(o, "warmup_s", json_real(b->backend->warmup_s));
  if (b->backend == &pg_backend) {
    /* Each call commits on its own pooled connection; the server's WAL
     * flush is what batches concurrent commits. */
    json_object_set_new(o, "synchronous_commit",
                        json_string(pg_synchronous_commit));
    json_object_set_new(o, "group_commit", json_false());
  } else {
    json_object_set_new(o, "synchronous", json_string("FULL"));
    json_object_set_new(o, "group_commit", json_true());
  }
  json_object_set_new(o, "phases", phases);
  rc = json_dumpf(o, stdout,
                  JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
  json_decref(o);
  if (rc == 0)
    fputc('\n', stdout);
  return rc;
}

static void print_row(const char *name, const phase_result *r) {
  printf("%-16s %10ld %11.1f %10.0f %10.0f %7ld\n", name, r->ops,
         r->ops_per_s, r->p50_us, r->p99_us, r->errors);
  fflush(stdout);
}

/* ---- the command --------------------------------------------------------- */

static int run(int argc, char **argv) {
  const char *url = NULL, *target = NULL;
  long nworkers = 1;
  int64_t ms = 3000;
  int json = 0, temporary = 0, status = EXIT_FAIL, nres = 0;
  char dir[4096] = "", path[4200], err[512] = "", store_dir[4096];
  bench b;
  worker *ws = NULL;
  phase_result res[PH_COUNT];
  double fsync_per_s = 0;
  long errors = 0;
  struct sigaction sa, old_int, old_term;
  int rc;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    }
    if (strcmp(a, "--json") == 0) {
      json = 1;
      continue;
    }
    if (strncmp(a, "--store=", 8) == 0 || strncmp(a, "--workers=", 10) == 0 ||
        strncmp(a, "--seconds=", 10) == 0) {
      v = strchr(a, '=') + 1;
    } else if (strcmp(a, "--store") == 0 || strcmp(a, "--workers") == 0 ||
               strcmp(a, "--seconds") == 0) {
      if (i + 1 >= argc) {
        cli_error("bench", "%s needs a value", a);
        return EXIT_USAGE;
      }
      v = argv[++i];
    } else {
      cli_error("bench", "unknown argument '%s'", a);
      fputs(usage, stderr);
      return EXIT_USAGE;
    }
    if (strncmp(a, "--store", 7) == 0) {
      if (!*v) {
        cli_error("bench", "--store: empty URL");
        return EXIT_USAGE;
      }
      url = v;
    } else if (strncmp(a, "--workers", 9) == 0) {
      if (cli_parse_uint(v, MAX_WORKERS, &nworkers) != 0 || nworkers < 1) {
        cli_error("bench", "--workers: '%s' is not a number from 1 to %d", v,
                  MAX_WORKERS);
        return EXIT_USAGE;
      }
    } else if (cli_parse_duration(v, &ms) != 0 || ms <= 0 ||
               ms > 24 * 3600 * 1000LL) {
      cli_error("bench", "--seconds: '%s' is not a duration such as 3, 0.5 "
                         "or 500ms",
                v);
      return EXIT_USAGE;
    }
  }

  memset(&b, 0, sizeof b);
  memset(res, 0, sizeof res);
  b.nworkers = (int)nworkers;
  b.seconds = (double)ms / 1000.0;
  pthread_mutex_init(&b.mu, NULL);
  pthread_mutex_init(&b.gate_mu, NULL);
  pthread_cond_init(&b.gate_cv, NULL);
  snprintf(b.run_id, sizeof b.run_id, "b%ld.%llx", (long)getpid(),
           (unsigned long long)(cli_now_ms() * 1000.0));

  if (url) {
    b.backend = backend_for(url, &target);
    if (!b.backend->insert_ticket) {
      cli_error("bench", "the %s bench is not available yet; use an SQLite "
                         "store (--store sqlite:PATH, or no --store)",
                b.backend->title);
      goto out;
    }
  } else {
    if (make_temp_dir(dir, sizeof dir) != 0)
      goto out;
    temporary = 1;
    snprintf(path, sizeof path, "%s/bench.db", dir);
    url = target = path;
    b.backend = &sqlite_backend;
  }
  if (b.backend == &pg_backend) {
    /* The server's disk may be elsewhere: this machine's temporary
     * directory stands in, as the local side of the comparison. */
    const char *tmp = getenv("TMPDIR");
    snprintf(store_dir, sizeof store_dir, "%s", tmp && *tmp ? tmp : "/tmp");
  } else {
    dir_of(target, store_dir, sizeof store_dir);
  }

  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  /* Defaults on purpose: synchronous=FULL and group commit. */
  rc = idem_store_open(url, NULL, &b.store);
  if (rc != IDEM_OK) {
    cli_idem_error("bench", "open store", rc);
    goto restore;
  }
  if (b.backend->setup(target, err, sizeof err) != 0) {
    cli_error("bench", "%s", err);
    goto restore;
  }

  fsync_per_s = fsync_rate(store_dir, 1.0);
  if (fsync_per_s < 0)
    goto restore;

  ws = calloc((size_t)b.nworkers, sizeof *ws);
  if (!ws) {
    cli_error("bench", "out of memory");
    goto restore;
  }
  for (int i = 0; i < b.nworkers; i++) {
    ws[i].b = &b;
    ws[i].index = i;
  }

  if (!json) {
    printf("idem bench: %s store %s%s\n", idem_store_backend(b.store), url,
           temporary ? " (temporary)" : "");
    if (b.backend == &pg_backend)
      printf("idem %s, PostgreSQL %s, synchronous_commit=%s, idem's "
             "default pool (16 connections)\n",
             idem_version(), idem_store_engine_version(b.store),
             pg_synchronous_commit);
    else
      printf("idem %s, SQLite %s, synchronous=FULL, group commit on\n",
             idem_version(), idem_store_engine_version(b.store));
    printf("%d worker%s, %g s per phase, %d prepared keys for replay and "
           "conflict\n",
           b.nworkers, b.nworkers == 1 ? "" : "s", b.seconds, PREPARED_KEYS);
    printf("fsync rate in %s: %.0f/s (4 KiB write + fdatasync)\n\n",
           store_dir, fsync_per_s);
    printf("phase                   ops       ops/s     p50 µs     p99 µs  "
           "errors\n");
    fflush(stdout);
  }

  if (b.backend->warmup_s > 0) {
    double seconds = b.seconds;
    phase_result warm;
    b.seconds = b.backend->warmup_s;
    rc = run_phase(&b, ws, PH_FRESH, &warm);
    b.seconds = seconds;
    if (rc != 0)
      goto restore;
    errors += warm.errors;
    if (!json && warm.errors)
      printf("warm-up: %ld unexpected result%s\n", warm.errors,
             warm.errors == 1 ? "" : "s");
  }

  for (int p = 0; p < PH_COUNT && !stop_requested; p++) {
    if (p == PH_REPLAY && prepare_keys(&b) != 0)
      goto restore;
    if (run_phase(&b, ws, p, &res[p]) != 0)
      goto restore;
    nres = p + 1;
    errors += res[p].errors;
    if (!json)
      print_row(phase_names[p], &res[p]);
  }
  if (stop_requested) {
    cli_error("bench", "interrupted");
    goto restore;
  }

  if (json) {
    if (print_json(&b, url, temporary, fsync_per_s, res, nres, errors) != 0) {
      cli_error("bench", "cannot write the JSON result");
      goto restore;
    }
  } else {
    printf("\n%ld unexpected result%s\n", errors, errors == 1 ? "" : "s");
  }
  if (fflush(stdout) != 0)
    goto restore;
  status = errors ? EXIT_FAIL : EXIT_OK;

restore:
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
out:
  idem_store_close(b.store);
  if (ws)
    for (int i = 0; i < b.nworkers; i++)
      free(ws[i].lat);
  free(ws);
  free(b.keys);
  pthread_mutex_destroy(&b.mu);
  pthread_mutex_destroy(&b.gate_mu);
  pthread_cond_destroy(&b.gate_cv);
  if (temporary)
    remove_temp_dir(dir);
  return status;
}

const cli_command cmd_bench = {
    "bench", run, "measure durable claims per second (like pgbench)", usage};
