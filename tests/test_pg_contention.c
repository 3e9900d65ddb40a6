/*
 * test_pg_contention.c -- many processes, one PostgreSQL server, and a
 * restart of that server in the middle of the run.
 *
 * 32 processes (fork; each opens its own store handle, so its own
 * connections, after the fork) call idem_execute_local() for 4 keys in each
 * of 2 tenants: 8 (tenant, key) pairs, 4 callers each. The local action
 * inserts one row into a per-run table through the PGconn it receives and
 * answers {"ticket_id":N}.
 *
 *  Phase 1, a steady server: exactly 8 rows, exactly one caller per pair
 *  acted, and every caller holds its pair's one response, whose ticket id is
 *  the pair's row.
 *
 *  Phase 2, the same while the server is restarted with
 *  `$IDEM_TEST_PG_CTL -w restart -m fast` (as the data directory's owner
 *  when running as root, as scripts/pg.sh does). So that the restart hits
 *  the run however slow the machine is, the callers come in two waves.
 *  Wave A (the 16 callers of the first 4 pairs) starts first; the caller
 *  that acts for a pair holds its transaction open (pg_sleep) on its first
 *  attempt, the others of that pair wait for its row lock, and the restart
 *  begins meanwhile: it finds them inside the transaction and in the lock
 *  wait. Wave B (the other 16) is released when the parent sees the server
 *  go down (an idle connection of its own is terminated), so it runs into
 *  the shutdown, the downtime and the start-up. Each caller retries, a
 *  bounded number of times, on a retryable result:
 *  IDEM_EUNAVAILABLE (also when the connection died inside the action:
 *  the library reports that as unavailable, never as a rejection), IDEM_EBUSY
 *  and IN_FLIGHT (after its retry_after). RECOVER is allowed and counted;
 *  IDEM_EREJECTED is a failure. Every caller must
 *  end with its pair's one response or a retryable error, and there must
 *  still be exactly 8 rows: the action and the record commit together, so a
 *  restart can roll an action back but never let it count twice.
 *
 * Both phases finish with a check through a new handle: every pair replays
 * its one response and no action runs again.
 *
 * Needs IDEM_TEST_PG_URL (a postgresql:// URL) and IDEM_TEST_PG_CTL
 * ("PATH/pg_ctl -D DATADIR"), which scripts/check.sh and scripts/pg.sh
 * export. Without them the test fails; it never skips. The tables live in
 * two schemas of their own (pgc_<pid>_steady, pgc_<pid>_restart), dropped
 * at the end. Exit status 0 when every check passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

#define NPROC 32
#define NTENANTS 2
#define NKEYS 4
#define NPAIRS (NTENANTS * NKEYS)
#define OPERATION "POST /tickets"

/* Phase 2: wave A's callers start STEP_A_MS apart and the restart begins
 * RESTART_AFTER_MS after them; an action on its caller's first attempt in
 * wave A keeps its transaction open for up to HOLD_MS after its insert (the
 * restart ends it sooner). Wave B's callers start STEP_B_MS apart once the
 * server is seen going down. */
#define WAVE (NPROC / 2)
#define STEP_A_MS 10
#define RESTART_AFTER_MS 300
#define HOLD_MS 5000
#define STEP_B_MS 40
/* How long the parent waits for the server to go down and come back. */
#define RESTART_BUDGET_MS 60000

/* A caller's bounds: attempts and time. */
#define MAX_ATTEMPTS 100
#define CALLER_BUDGET_MS 30000

#define URL_MAX 2048
#define TEXT_MAX 200

static int failures;

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL: ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  fflush(stdout);
  va_end(ap);
  failures++;
}

static void sleep_ms(int64_t ms) {
  struct timespec ts;
  if (ms <= 0)
    return;
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* 1 when n bytes were read, 0 at end of file, -1 on error. */
static int read_all(int fd, void *p, size_t n) {
  char *c = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, c + got, n - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    if (r == 0)
      return got == 0 ? 0 : -1;
    got += (size_t)r;
  }
  return 1;
}

/* ------------------------------------------------------------------ */
/* The run's tables, through side connections of the parent            */
/* ------------------------------------------------------------------ */

static const char *base_url; /* IDEM_TEST_PG_URL */

static void ignore_notice(void *arg, const char *message) {
  (void)arg;
  (void)message;
}

static PGconn *side_connect(void) {
  PGconn *c = PQconnectdb(base_url);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    fail("side connection: %s", c ? PQerrorMessage(c) : "out of memory");
    PQfinish(c);
    return NULL;
  }
  PQsetNoticeProcessor(c, ignore_notice, NULL);
  return c;
}

/* Runs sql; returns the result (TUPLES_OK or COMMAND_OK) or NULL. */
static PGresult *side_exec(PGconn *c, const char *sql) {
  PGresult *r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK &&
      PQresultStatus(r) != PGRES_COMMAND_OK) {
    fail("side connection: %s: %s", sql, PQerrorMessage(c));
    PQclear(r);
    return NULL;
  }
  return r;
}

/* One statement on a new side connection; 0 or -1. */
static int side_run(const char *fmt, ...) {
  char sql[1024];
  va_list ap;
  PGconn *c;
  PGresult *r;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  if (!(c = side_connect()))
    return -1;
  r = side_exec(c, sql);
  PQclear(r);
  PQfinish(c);
  return r ? 0 : -1;
}

/* The server's start time, as text; "" when unknown. */
static void server_start_time(char *out, size_t size) {
  PGconn *c = side_connect();
  PGresult *r =
      c ? side_exec(c, "SELECT pg_postmaster_start_time()::text") : NULL;
  snprintf(out, size, "%s", r && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
  PQclear(r);
  PQfinish(c);
}

/* ------------------------------------------------------------------ */
/* The callers                                                          */
/* ------------------------------------------------------------------ */

static const char *const tenants[NTENANTS] = {"tenant-a", "tenant-b"};
static const char *const keys[NKEYS] = {"order-1", "order-2", "order-3",
                                        "order-4"};

/* The pair of caller i: callers 4p .. 4p+3 share pair p, so that wave A
 * (callers 0-15) has pairs 0-3 and wave B pairs 4-7. */
#define PER_PAIR (NPROC / NPAIRS)
static int pair_of(int i) { return i / PER_PAIR; }

/* The local action's context. */
typedef struct action {
  const char *schema;
  int pair, caller;
  int hold_ms;
  int runs;      /* how many times it ran */
  int inserted;  /* how many of those inserted their row */
  int conn_lost; /* the last run failed because the connection died */
  long long ticket_id;
  char body[64];
  char err[TEXT_MAX];
} action;

static int insert_ticket(void *conn, void *ctx, idem_response *response) {
  action *a = ctx;
  PGconn *pg = conn;
  char sql[256], caller[16];
  const char *values[3];
  PGresult *r;
  a->runs++;
  a->conn_lost = 0;
  a->err[0] = '\0';
  snprintf(sql, sizeof sql,
           "INSERT INTO \"%s\".tickets (tenant, key, caller) VALUES ($1, $2, "
           "$3::integer) RETURNING id",
           a->schema);
  snprintf(caller, sizeof caller, "%d", a->caller);
  values[0] = tenants[a->pair / NKEYS];
  values[1] = keys[a->pair % NKEYS];
  values[2] = caller;
  r = PQexecParams(pg, sql, 3, NULL, values, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
    goto failed;
  a->ticket_id = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  a->inserted++;
  if (a->hold_ms > 0 && a->runs == 1) {
    /* Keep the transaction open: the restart should find it here. */
    snprintf(sql, sizeof sql, "SELECT pg_sleep(%d / 1000.0)", a->hold_ms);
    r = PQexec(pg, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
      goto failed;
    PQclear(r);
  }
  snprintf(a->body, sizeof a->body, "{\"ticket_id\":%lld}", a->ticket_id);
  response->status = 201;
  response->body = a->body;
  response->body_len = strlen(a->body);
  return 0;
failed:
  /* A caller's action, written plainly: any failed statement rejects. */
  a->conn_lost = PQstatus(pg) == CONNECTION_BAD;
  snprintf(a->err, sizeof a->err, "%s", PQerrorMessage(pg));
  a->err[strcspn(a->err, "\n")] = '\0';
  PQclear(r);
  return 1;
}

/* What a caller tells the parent. */
typedef struct report {
  int index, pair;
  int ready; /* 1: store opened, waiting for the signal; 0: final */
  int rc;    /* the final result code */
  int outcome;
  int attempts;
  int n_unavailable, n_busy, n_in_flight, n_rejected_lost, n_recover;
  int runs, inserted;
  int ended_retryable;        /* gave up, bounded, on a retryable result */
  long long start_ms, end_ms; /* after the start of the caller's wave */
  int status;
  char body[64];
  size_t body_len;
  char first_retry[TEXT_MAX]; /* the first retryable error, in words */
  char last_err[TEXT_MAX];
} report;

/* One caller process. restart: phase 2's waves, else all start at once. */
static void caller(const char *url, const char *schema, int index, int restart,
                   int go_fd, int report_fd) {
  report m;
  idem_store *s = NULL;
  idem_call *c = NULL;
  action act;
  char payload[128], fp[IDEM_FINGERPRINT_SIZE], b;
  int pair = pair_of(index);
  idem_id id = {tenants[pair / NKEYS], OPERATION, keys[pair % NKEYS]};
  int64_t deadline, t_go;

  memset(&m, 0, sizeof m);
  memset(&act, 0, sizeof act);
  m.index = index;
  m.pair = pair;
  m.ready = 1;
  act.schema = schema;
  act.pair = pair;
  act.caller = index;
  act.hold_ms = restart && index < WAVE ? HOLD_MS : 0;
  snprintf(payload, sizeof payload, "{\"key\":\"%s\",\"tenant\":\"%s\"}",
           id.key, id.tenant);
  if (idem_fingerprint(payload, strlen(payload), 1, fp) != IDEM_OK)
    _exit(2);
  m.rc = idem_store_open(url, NULL, &s);
  if (m.rc != IDEM_OK)
    snprintf(m.last_err, sizeof m.last_err, "open: %s", idem_errmsg());
  if (write_all(report_fd, &m, sizeof m) != 0 || m.rc != IDEM_OK)
    _exit(1);
  while (read(go_fd, &b, 1) < 0 && errno == EINTR)
    ;
  t_go = mono_ms();
  m.ready = 0;
  if (restart)
    sleep_ms(index < WAVE ? (int64_t)index * STEP_A_MS
                          : (int64_t)(index - WAVE) * STEP_B_MS);
  m.start_ms = mono_ms() - t_go;
  deadline = mono_ms() + CALLER_BUDGET_MS;

  for (m.attempts = 1;; m.attempts++) {
    int rc, retry = 0;
    int64_t wait = 20LL * m.attempts;
    char what[TEXT_MAX];
    if (wait > 250)
      wait = 250;
    c = NULL;
    if (m.attempts > 1)
      act.hold_ms = 0; /* hold on the first attempt only */
    rc = idem_execute_local(s, &id, fp, NULL, insert_ticket, &act, &c);
    m.rc = rc;
    if (rc == IDEM_OK) {
      const idem_response *r = idem_call_response(c);
      m.outcome = idem_call_outcome(c);
      if (m.outcome == IDEM_IN_FLIGHT) {
        m.n_in_flight++;
        wait = idem_call_retry_after_ms(c);
        snprintf(what, sizeof what, "in_flight, retry after %lld ms",
                 (long long)wait);
        retry = 1;
      } else {
        if (m.outcome == IDEM_RECOVER)
          m.n_recover++;
        if (r) {
          m.status = r->status;
          m.body_len = r->body_len < sizeof m.body ? r->body_len : 0;
          if (m.body_len)
            memcpy(m.body, r->body, m.body_len);
        }
      }
    } else {
      snprintf(m.last_err, sizeof m.last_err, "%s: %s", idem_rc_name(rc),
               idem_errmsg());
      snprintf(what, sizeof what, "%s", m.last_err);
      if (rc == IDEM_EUNAVAILABLE) {
        m.n_unavailable++;
        retry = 1;
      } else if (rc == IDEM_EBUSY) {
        m.n_busy++;
        retry = 1;
      }
    }
    idem_call_free(c);
    c = NULL;
    if (!retry)
      break;
    if (!m.first_retry[0])
      snprintf(m.first_retry, sizeof m.first_retry, "%s", what);
    if (m.attempts >= MAX_ATTEMPTS || mono_ms() + wait > deadline) {
      m.ended_retryable = 1; /* ends with this retryable result */
      break;
    }
    sleep_ms(wait);
  }
  m.end_ms = mono_ms() - t_go;
  m.runs = act.runs;
  m.inserted = act.inserted;
  idem_store_close(s);
  _exit(write_all(report_fd, &m, sizeof m) == 0 ? 0 : 3);
}

/* ------------------------------------------------------------------ */
/* The restart                                                          */
/* ------------------------------------------------------------------ */

/* Now on the wall clock, for matching the server's log. */
static void wall_clock(char *out, size_t size) {
  struct timespec now;
  struct tm tm;
  char hms[32];
  clock_gettime(CLOCK_REALTIME, &now);
  gmtime_r(&now.tv_sec, &tm);
  strftime(hms, sizeof hms, "%H:%M:%S", &tm);
  snprintf(out, size, "%s.%03ld UTC", hms, now.tv_nsec / 1000000L);
}

/*
 * The command that restarts the server with IDEM_TEST_PG_CTL ("PATH/pg_ctl
 * -D DATADIR"), fast mode, waiting until it accepts connections again. As
 * root it runs as the data directory's owner, as scripts/pg.sh does. The new
 * server logs to server.log beside the data directory (pg.sh's log); what
 * pg_ctl says goes to out. 0 or -1.
 */
static int restart_command(const char *ctl, const char *out, char *cmd,
                           size_t size) {
  char datadir[URL_MAX], logdir[URL_MAX];
  const char *d = strstr(ctl, "-D ");
  struct stat st;
  struct passwd *pw;
  if (!d) {
    fail("IDEM_TEST_PG_CTL=%s: no -D DATADIR in it", ctl);
    return -1;
  }
  snprintf(datadir, sizeof datadir, "%.*s", (int)strcspn(d + 3, " "), d + 3);
  snprintf(logdir, sizeof logdir, "%s", datadir);
  if (strrchr(logdir, '/'))
    *strrchr(logdir, '/') = '\0';
  if (stat(datadir, &st) != 0) {
    fail("IDEM_TEST_PG_CTL: data directory %s: %s", datadir, strerror(errno));
    return -1;
  }
  if (geteuid() == 0 && st.st_uid != 0) {
    if (!(pw = getpwuid(st.st_uid))) {
      fail("no user name for uid %ld, the owner of %s", (long)st.st_uid,
           datadir);
      return -1;
    }
    snprintf(cmd, size,
             "su -s /bin/sh %s -c \"%s -w -t 60 -l '%s/server.log' restart "
             "-m fast\" </dev/null >%s 2>&1",
             pw->pw_name, ctl, logdir, out);
  } else {
    snprintf(cmd, size,
             "%s -w -t 60 -l '%s/server.log' restart -m fast </dev/null >%s "
             "2>&1",
             ctl, logdir, out);
  }
  return 0;
}

/*
 * Restarts the server in a process of its own, and calls went_down() as
 * soon as an idle connection of ours is terminated by the shutdown (or, at
 * the latest, when the restart is over). t_go is the phase's start, for the
 * times printed. 0 when the restart succeeded and was seen, else -1.
 */
static int restart_server(const char *ctl, int64_t t_go,
                          void (*went_down)(void *), void *arg) {
  char cmd[3 * URL_MAX], out[URL_MAX], line[256], clock_text[64];
  PGconn *watch = side_connect();
  pid_t pid;
  int status = -1, seen = 0, exited = 0, rc = 0;
  int64_t t0, t_down = -1, deadline;
  FILE *fp;
  snprintf(out, sizeof out, "/tmp/idem-pgc-restart-%ld.log", (long)getpid());
  if (!watch || restart_command(ctl, out, cmd, sizeof cmd) != 0) {
    PQfinish(watch);
    went_down(arg);
    return -1;
  }
  t0 = mono_ms();
  wall_clock(clock_text, sizeof clock_text);
  printf("restart at %lld ms (%s): %s\n", (long long)(t0 - t_go), clock_text,
         cmd);
  fflush(stdout);
  pid = fork();
  if (pid < 0) {
    fail("fork: %s", strerror(errno));
    PQfinish(watch);
    went_down(arg);
    return -1;
  }
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  deadline = t0 + RESTART_BUDGET_MS;
  while (!exited && mono_ms() < deadline) {
    if (!seen) {
      struct pollfd pfd = {PQsocket(watch), POLLIN, 0};
      if (pfd.fd < 0 || poll(&pfd, 1, 5) != 0) {
        PQconsumeInput(watch);
        if (PQstatus(watch) == CONNECTION_BAD) {
          seen = 1;
          t_down = mono_ms();
          went_down(arg);
        }
      }
    } else {
      sleep_ms(5);
    }
    if (waitpid(pid, &status, WNOHANG) == pid)
      exited = 1;
  }
  if (!exited) {
    fail("the restart took over %d ms; killing pg_ctl", RESTART_BUDGET_MS);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  PQfinish(watch);
  if (!seen)
    went_down(arg);
  if ((fp = fopen(out, "r"))) {
    while (fgets(line, sizeof line, fp))
      printf("  pg_ctl: %s", line);
    fclose(fp);
  }
  unlink(out);
  if (!exited || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail("restart failed (status %d): the server may be down now", status);
    rc = -1;
  }
  if (!seen) {
    fail("our idle connection was never terminated: no shutdown seen");
    rc = -1;
  } else {
    printf("restart: the server went down at %lld ms\n",
           (long long)(t_down - t_go));
  }
  printf("restart: done at %lld ms, after %lld ms\n",
         (long long)(mono_ms() - t_go), (long long)(mono_ms() - t0));
  return rc;
}

/* ------------------------------------------------------------------ */
/* A phase                                                              */
/* ------------------------------------------------------------------ */

/* The pairs' rows in the run's table: count and id per pair. */
typedef struct pair_rows {
  int rows;
  long long id;
} pair_rows;

static long long table_rows(const char *schema, pair_rows rows[NPAIRS]) {
  char sql[512];
  PGconn *c = side_connect();
  PGresult *r;
  long long total = 0;
  memset(rows, 0, sizeof(pair_rows) * NPAIRS);
  if (!c)
    return -1;
  snprintf(sql, sizeof sql,
           "SELECT tenant, key, count(*), min(id) FROM \"%s\".tickets GROUP "
           "BY tenant, key",
           schema);
  if (!(r = side_exec(c, sql))) {
    PQfinish(c);
    return -1;
  }
  for (int i = 0; i < PQntuples(r); i++) {
    int found = 0;
    for (int p = 0; p < NPAIRS; p++)
      if (!strcmp(PQgetvalue(r, i, 0), tenants[p / NKEYS]) &&
          !strcmp(PQgetvalue(r, i, 1), keys[p % NKEYS])) {
        rows[p].rows = atoi(PQgetvalue(r, i, 2));
        rows[p].id = atoll(PQgetvalue(r, i, 3));
        found = 1;
      }
    if (!found)
      fail("row for an unknown pair (%s, %s)", PQgetvalue(r, i, 0),
           PQgetvalue(r, i, 1));
    total += atoll(PQgetvalue(r, i, 2));
  }
  PQclear(r);
  PQfinish(c);
  return total;
}

static int never_runs(void *conn, void *ctx, idem_response *response) {
  (void)conn;
  (void)response;
  (*(int *)ctx)++;
  return 1;
}

/* Through a new handle: every pair replays {"ticket_id":<its row>} and no
 * action runs. */
static void check_replays(const char *url, const pair_rows rows[NPAIRS]) {
  idem_store *s = NULL;
  int rc = idem_store_open(url, NULL, &s);
  if (rc != IDEM_OK) {
    fail("reopen %s: %s: %s", url, idem_rc_name(rc), idem_errmsg());
    return;
  }
  for (int p = 0; p < NPAIRS; p++) {
    idem_id id = {tenants[p / NKEYS], OPERATION, keys[p % NKEYS]};
    char payload[128], fp[IDEM_FINGERPRINT_SIZE], want[64];
    idem_call *c = NULL;
    const idem_response *r;
    int ran = 0;
    snprintf(payload, sizeof payload, "{\"key\":\"%s\",\"tenant\":\"%s\"}",
             id.key, id.tenant);
    idem_fingerprint(payload, strlen(payload), 1, fp);
    snprintf(want, sizeof want, "{\"ticket_id\":%lld}", rows[p].id);
    rc = idem_execute_local(s, &id, fp, NULL, never_runs, &ran, &c);
    r = rc == IDEM_OK ? idem_call_response(c) : NULL;
    if (rc != IDEM_OK)
      fail("final check (%s, %s): %s: %s", id.tenant, id.key, idem_rc_name(rc),
           idem_errmsg());
    else if (idem_call_outcome(c) != IDEM_REPLAY || ran)
      fail("final check (%s, %s): outcome %s, the action ran %d times",
           id.tenant, id.key, idem_outcome_name(idem_call_outcome(c)), ran);
    else if (!r || r->status != 201 || r->body_len != strlen(want) ||
             memcmp(r->body, want, r->body_len) != 0)
      fail("final check (%s, %s): the stored response is not %s", id.tenant,
           id.key, want);
    idem_call_free(c);
  }
  idem_store_close(s);
}

/* Closes the write end of a start pipe: the waiting callers start. */
static void close_fd(void *arg) {
  int *fd = arg;
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

/*
 * Runs the 32 callers on a fresh schema; with restart, restarts the server
 * mid-run. Checks and prints what happened.
 */
static void run_phase(const char *name, const char *schema, int restart,
                      const char *ctl) {
  char url[URL_MAX], before[128], after[128];
  int go_a[2], go_b[2], rep[2], ready = 0, done = 0;
  pid_t pids[NPROC];
  report reports[NPROC], m;
  pair_rows rows[NPAIRS];
  idem_store *s = NULL;
  long long total, records = -1;
  int proceeded[NPAIRS] = {0}, runs = 0, inserted = 0, rc;
  int n_unavailable = 0, n_busy = 0, n_in_flight = 0, n_rejected_lost = 0,
      n_recover = 0, retried_callers = 0, ended_retryable = 0, max_attempts = 0;
  int64_t t0;
  int start_failures = failures, hit_a = 0, hit_b = 0;

  printf("\n== %s (schema %s) ==\n", name, schema);
  snprintf(url, sizeof url, "%s%cidem_schema=%s", base_url,
           strchr(base_url, '?') ? '&' : '?', schema);
  /* Fresh tables: idem's (created by an open) and the caller's. */
  if (side_run("DROP SCHEMA IF EXISTS \"%s\" CASCADE", schema) != 0)
    return;
  rc = idem_store_open(url, NULL, &s);
  if (rc != IDEM_OK) {
    fail("open %s: %s: %s", url, idem_rc_name(rc), idem_errmsg());
    return;
  }
  idem_store_close(s); /* no connection crosses fork() */
  if (side_run("CREATE TABLE \"%s\".tickets (id bigserial PRIMARY KEY, "
               "tenant text NOT NULL, key text NOT NULL, caller integer NOT "
               "NULL)",
               schema) != 0)
    return;
  server_start_time(before, sizeof before);

  if (pipe2(go_a, O_CLOEXEC) != 0 || pipe2(go_b, O_CLOEXEC) != 0 ||
      pipe2(rep, O_CLOEXEC) != 0) {
    fail("pipe: %s", strerror(errno));
    return;
  }
  fflush(stdout);
  for (int i = 0; i < NPROC; i++) {
    pids[i] = fork();
    if (pids[i] < 0) {
      fail("fork: %s", strerror(errno));
      for (int j = 0; j < i; j++) {
        kill(pids[j], SIGKILL);
        waitpid(pids[j], NULL, 0);
      }
      return;
    }
    if (pids[i] == 0) {
      close(go_a[1]);
      close(go_b[1]);
      close(rep[0]);
      caller(url, schema, i, restart, i < WAVE ? go_a[0] : go_b[0], rep[1]);
    }
  }
  close(go_a[0]);
  close(go_b[0]);
  close(rep[1]);
  while (ready < NPROC && read_all(rep[0], &m, sizeof m) == 1) {
    if (!m.ready || m.rc != IDEM_OK)
      fail("caller %d: not ready: %s", m.index, m.last_err);
    ready++;
  }
  t0 = mono_ms();
  close(go_a[1]); /* wave A starts */
  if (restart) {
    sleep_ms(RESTART_AFTER_MS);
    /* Wave B starts when the server goes down. */
    restart_server(ctl, t0, close_fd, &go_b[1]);
  }
  close_fd(&go_b[1]); /* no restart: wave B starts with wave A */
  memset(reports, 0, sizeof reports);
  while (done < NPROC && read_all(rep[0], &m, sizeof m) == 1) {
    if (m.index >= 0 && m.index < NPROC)
      reports[m.index] = m;
    done++;
  }
  close(rep[0]);
  for (int i = 0; i < NPROC; i++) {
    int status = 0;
    if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
      fail("caller %d exited badly (status %d)", i, status);
  }
  if (done != NPROC)
    fail("%d reports from %d callers", done, NPROC);
  printf("%d callers done in %lld ms\n", done, (long long)(mono_ms() - t0));

  /* What happened. */
  if (restart)
    printf("times: ms after the start of the caller's wave; wave B starts "
           "when the server goes down\n");
  for (int i = 0; i < NPROC; i++) {
    report *r = &reports[i];
    int retries = r->attempts - 1;
    if (r->attempts == 0) {
      fail("caller %d: no final report", i);
      continue;
    }
    n_unavailable += r->n_unavailable;
    n_busy += r->n_busy;
    n_in_flight += r->n_in_flight;
    n_rejected_lost += r->n_rejected_lost;
    n_recover += r->n_recover;
    runs += r->runs;
    inserted += r->inserted;
    if (r->attempts > max_attempts)
      max_attempts = r->attempts;
    if (retries > 0) {
      retried_callers++;
      if (i < WAVE)
        hit_a++;
      else
        hit_b++;
      printf("caller %2d (%s, %s) wave %c %lld-%lld ms: %d retries "
             "(unavailable %d, busy %d, in_flight %d, rejected-conn-lost %d), "
             "then %s; first: %s\n",
             i, tenants[r->pair / NKEYS], keys[r->pair % NKEYS],
             i < WAVE ? 'A' : 'B', r->start_ms, r->end_ms, retries,
             r->n_unavailable, r->n_busy, r->n_in_flight, r->n_rejected_lost,
             r->rc == IDEM_OK ? idem_outcome_name(r->outcome)
                              : idem_rc_name(r->rc),
             r->first_retry);
    }
    if (r->rc == IDEM_OK &&
        (r->outcome == IDEM_PROCEED || r->outcome == IDEM_RECOVER))
      proceeded[r->pair]++;
    if (r->rc != IDEM_OK || r->outcome == IDEM_IN_FLIGHT) {
      if (r->ended_retryable) {
        ended_retryable++;
        printf("caller %2d ended with a retryable error after %d attempts: "
               "%s\n",
               i, r->attempts, r->rc == IDEM_OK ? "in_flight" : r->last_err);
      } else {
        fail("caller %d: %s (not retryable)", i, r->last_err);
      }
    } else if (r->outcome != IDEM_PROCEED && r->outcome != IDEM_REPLAY &&
               r->outcome != IDEM_RECOVER) {
      fail("caller %d: outcome %s", i, idem_outcome_name(r->outcome));
    }
  }
  printf("outcomes: %d callers retried (at most %d attempts); retryable "
         "results seen: unavailable %d, busy %d, in_flight %d, "
         "rejected-conn-lost %d; recover %d; %d callers ended with a "
         "retryable error\n",
         retried_callers, max_attempts, n_unavailable, n_busy, n_in_flight,
         n_rejected_lost, n_recover, ended_retryable);
  printf("actions: %d runs, %d inserted a row, %d of those rolled back\n", runs,
         inserted, inserted - NPAIRS);

  /* Exactly one row per pair, and every caller holds its pair's response. */
  total = table_rows(schema, rows);
  {
    PGconn *c = side_connect();
    char sql[256];
    PGresult *r;
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM \"%s\".idem_records WHERE state = 2",
             schema);
    r = c ? side_exec(c, sql) : NULL;
    if (r && PQntuples(r) == 1)
      records = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
  }
  printf("rows: %lld (expected %d); completed records: %lld\n", total, NPAIRS,
         records);
  if (total != NPAIRS)
    fail("%lld rows, expected exactly %d: %s", total, NPAIRS,
         total > NPAIRS ? "an action counted twice" : "a pair never acted");
  if (records != NPAIRS)
    fail("%lld completed records, expected %d", records, NPAIRS);
  for (int p = 0; p < NPAIRS; p++) {
    char want[64];
    if (rows[p].rows != 1) {
      fail("(%s, %s): %d rows", tenants[p / NKEYS], keys[p % NKEYS],
           rows[p].rows);
      continue;
    }
    snprintf(want, sizeof want, "{\"ticket_id\":%lld}", rows[p].id);
    for (int i = 0; i < NPROC; i++) {
      report *r = &reports[i];
      if (r->attempts == 0 || r->pair != p || r->rc != IDEM_OK ||
          r->outcome == IDEM_IN_FLIGHT)
        continue; /* another pair's, or an ending reported above */
      if (r->status != 201 || r->body_len != strlen(want) ||
          memcmp(r->body, want, r->body_len) != 0)
        fail("caller %d (%s, %s): response %d %.*s, expected 201 %s", i,
             tenants[p / NKEYS], keys[p % NKEYS], r->status, (int)r->body_len,
             r->body, want);
    }
    /* At most one caller per pair saw its own action commit. None when the
     * acknowledgement of the commit was lost and it then replayed. */
    if (proceeded[p] > 1)
      fail("(%s, %s): %d callers proceeded", tenants[p / NKEYS],
           keys[p % NKEYS], proceeded[p]);
    else if (proceeded[p] == 0 && !restart)
      fail("(%s, %s): nobody proceeded", tenants[p / NKEYS], keys[p % NKEYS]);
    else if (proceeded[p] == 0)
      printf("(%s, %s): no caller saw its own commit (acknowledgement lost "
             "in the restart); all replayed it\n",
             tenants[p / NKEYS], keys[p % NKEYS]);
  }
  if (!restart) {
    if (runs != NPAIRS)
      fail("%d action runs on a steady server, expected %d", runs, NPAIRS);
    if (retried_callers)
      fail("%d callers needed retries on a steady server", retried_callers);
  } else {
    server_start_time(after, sizeof after);
    printf("server started at %s, now %s\n", before, after);
    if (!before[0] || !after[0] || !strcmp(before, after))
      fail("the server was not restarted");
    printf("the restart hit %d of %d callers of wave A (in or waiting for a "
           "transaction) and %d of %d of wave B\n",
           hit_a, WAVE, hit_b, NPROC - WAVE);
    if (!hit_a)
      fail("the restart hit no caller of wave A: no transaction was cut");
    if (n_recover)
      printf("RECOVER happened %d times: a holder lost its connection after "
             "acting and its lease expired; the rows above still show one "
             "mutation per pair\n",
             n_recover);
  }
  if (total == NPAIRS)
    check_replays(url, rows);
  if (side_run("DROP SCHEMA IF EXISTS \"%s\" CASCADE", schema) != 0)
    fail("could not drop schema %s", schema);
  printf("== %s: %s ==\n", name,
         failures == start_failures ? "passed" : "FAILED");
}

int main(void) {
  const char *ctl = getenv("IDEM_TEST_PG_CTL");
  char steady[64], restarted[64];
  int64_t t0 = mono_ms();
  base_url = getenv("IDEM_TEST_PG_URL");
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!base_url || !*base_url || !ctl || !*ctl) {
    fprintf(stderr,
            "test_pg_contention: needs IDEM_TEST_PG_URL and IDEM_TEST_PG_CTL "
            "(IDEM_TEST_PG_URL=%s, IDEM_TEST_PG_CTL=%s); scripts/check.sh "
            "exports both, or by hand: `. scripts/pg.sh && pg_start`\n",
            base_url ? base_url : "(unset)", ctl ? ctl : "(unset)");
    return 1;
  }
  if (strncmp(base_url, "postgresql://", 13) != 0 &&
      strncmp(base_url, "postgres://", 11) != 0) {
    fprintf(stderr, "test_pg_contention: IDEM_TEST_PG_URL must be a "
                    "postgresql:// URL\n");
    return 1;
  }
  snprintf(steady, sizeof steady, "pgc_%ld_steady", (long)getpid());
  snprintf(restarted, sizeof restarted, "pgc_%ld_restart", (long)getpid());
  printf("%d processes, %d tenants x %d keys, %d callers per key\n", NPROC,
         NTENANTS, NKEYS, NPROC / NPAIRS);
  run_phase("phase 1: steady server", steady, 0, ctl);
  run_phase("phase 2: server restarted mid-run", restarted, 1, ctl);
  printf("\n%s in %lld ms\n",
         failures ? "pg_contention FAILED" : "pg_contention passed",
         (long long)(mono_ms() - t0));
  return failures ? 1 : 0;
}
