/*
 * chaos.c -- the kill -9 campaign: processes and threads calling idem on a
 * few keys while a controller kills, stops and resumes them (and on
 * PostgreSQL restarts the server and cuts connections), then a checker that
 * reads what every caller did and was answered and verifies idem's promise.
 *
 *   chaos lib --store URL --trials N [--seed S] [--dir DIR]
 *             [--pg-restart CMD] [--restart-every K] [--verbose]
 *   chaos run --idem PATH --store URL --trials N [--seed S] [--dir DIR]
 *
 * One trial ("lib"): WORKERS processes, some with two threads, call
 * idem_claim()/idem_complete()/idem_release()/idem_mark_unknown(),
 * idem_execute() and idem_execute_local() on REMOTE_KEYS + LOCAL_KEYS keys
 * of a tenant of the trial's own, with a lease of LEASE_MS. A remote
 * action's effect is a line appended to the trial's effect file (outside
 * the store, like a call to another system); a local action's effect is a
 * row in the table chaos_local, in the store's own transaction. Each call
 * appends what it did and what it was answered to the trial's history, one
 * write(2) per line. Meanwhile the controller sends SIGKILL (and starts a
 * new worker in the killed one's place) and SIGSTOP, then SIGCONT after up
 * to twice the lease, so that leases expire under stopped holders; on
 * PostgreSQL it also terminates the workers' server sessions
 * (pg_terminate_backend, a cut connection) and, every --restart-every
 * trials, runs --pg-restart (pg_ctl restart -m immediate). It also steps
 * the wall clock of every worker, up to a minute either way (clockshift.c,
 * linked in: the workers are forked, and share the shift's mapped file),
 * as `date -s` or a bad NTP server would; the clock is set right again
 * before the recovery pass and the check. After CHAOS_MS
 * the workers finish; the ones still alive are killed. Then a recovery pass
 * takes over every key whose holder died (RECOVER), acts and completes it,
 * as a retrying caller would.
 *
 * The checker then verifies, per key, from the history, the effect file,
 * the rows of chaos_local and the record as the store holds it:
 *  V1 every effect was made by a caller answered PROCEED or RECOVER;
 *  V2 at most one effect per key by a caller answered PROCEED: every
 *     further one was made by a caller that was told RECOVER;
 *  V3 every REPLAY equals, byte for byte, the completed record's response;
 *  V4 a completion answered IDEM_OK is the record's response (nothing a
 *     caller was told is stored was lost);
 *  V5 a completion answered IDEM_ESTALE is not the record's response (no
 *     stale holder overwrote a newer one), and the stored response is that
 *     of the record's last attempt;
 *  V6 the completed record's response is one a holder of the key tried to
 *     store;
 *  V7 every key ends completed, released (absent), unknown, or in progress
 *     with a live lease;
 *  V8 a local key has exactly one row when completed, none when absent, and
 *     the row is the response.
 *
 * "run": the same through `idem run` processes: workers run
 * `idem run --key K --lease L [--on-unknown rerun] -- sh -c ...` where the
 * command appends a line to the effect file and prints its process's
 * parent, the idem run process, as its output. The controller kills and
 * stops idem run processes. The checker verifies the same properties as
 * far as idem run shows them: every effect beyond the first of a key was
 * made by a run told on standard error that it runs the command again;
 * every run that exited 0 printed the stored output, byte for byte (a
 * replay equals the first completed run); a run that exited 5 (result not
 * recorded) is not the stored one; every key ends completed, absent,
 * unknown, or in progress with a live lease.
 *
 * Prints one summary line: trials, calls by outcome, effects, faults by
 * kind and violations; exit status 0 only when there were no violations.
 * A trial with a violation keeps its files in DIR and prints them.
 */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
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

#define WORKERS 4
#define REMOTE_KEYS 8
#define LOCAL_KEYS 4
#define RUN_KEYS 4 /* idem run: fewer keys, as each call is a process */
#define NKEYS (REMOTE_KEYS + LOCAL_KEYS)
#define LEASE_MS 100
#define CHAOS_MS 150
#define OPERATION "chaos"
#define LINE_MAX_ 512
#define MAX_HOLDERS 4096
#define MAX_PIDS 64

/* ---- small helpers ---------------------------------------------------- */

static int verbose;
/* --sabotage: callers that break the rules (act while another holds the
 * key, report a replay that differs by one bit), so that a run shows the
 * checker finds violations; such a run must fail. */
static int sabotage;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("chaos: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* clockshift.c: steps this process's wall clock, and its forked
 * workers'. */
int clockshift_set(int64_t ms);

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

/* xorshift64*: each process and thread has its own state. */
static uint64_t rnd(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ULL;
}

static int pick(uint64_t *s, int n) { return (int)(rnd(s) % (uint64_t)n); }

/* Appends one line with one write(2) on an O_APPEND descriptor, so that
 * lines of processes killed at any moment are whole or absent. */
static void append_line(int fd, const char *fmt, ...) {
  char line[LINE_MAX_];
  va_list ap;
  int n;
  va_start(ap, fmt);
  n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n > sizeof line - 2)
    n = (int)sizeof line - 2;
  line[n++] = '\n';
  if (write(fd, line, (size_t)n) != n)
    die("cannot append to a log: %s", strerror(errno));
}

static int open_append(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0)
    die("cannot open %s: %s", path, strerror(errno));
  return fd;
}

static const char *key_name(int k, char buf[8]) {
  snprintf(buf, 8, "%s%u", k < REMOTE_KEYS ? "k" : "L",
           (unsigned)(k < REMOTE_KEYS ? k : k - REMOTE_KEYS) % 1000u);
  return buf;
}

static int is_pg(const char *url) {
  return !strncmp(url, "postgresql:", 11) || !strncmp(url, "postgres:", 9);
}

/* ---- the campaign's configuration and totals -------------------------- */

typedef struct config {
  const char *mode, *store, *dir, *idem, *pg_restart;
  long trials;
  uint64_t seed;
  int restart_every;
  int pg;
} config;

typedef struct totals {
  long trials, calls, errors, effects, local_rows;
  long outcome[7]; /* by idem_outcome */
  long stale, killed, stopped, restarts, cuts, recovered_at_end, steps;
  long violations;
} totals;

/* ---- workers: the library ---------------------------------------------- */

typedef struct trial_ctx {
  const config *cfg;
  char tenant[32];
  char hist_path[4096], eff_path[4096];
  int64_t deadline; /* mono_ms() after which workers stop */
} trial_ctx;

typedef struct worker_thread {
  const trial_ctx *t;
  idem_store *store;
  int hist, eff;
  int wid, tid;
  uint64_t rng;
  long seq;
} worker_thread;

/* The request of a key: most calls send the key's one request, a few a
 * different one (CONFLICT, or a record of that request instead). */
static void fingerprint_of(const char *key, int variant, char fp[65]) {
  char req[64];
  snprintf(req, sizeof req, "{\"key\":\"%s\",\"v\":%d}", key, variant);
  if (idem_fingerprint(req, strlen(req), 1, fp) != IDEM_OK)
    die("fingerprint: %s", idem_errmsg());
}

static void effect(worker_thread *w, const char *key, const char *holder,
                   int outcome, int attempt) {
  append_line(w->eff, "E %s %s %d %d", key, holder, outcome, attempt);
}

/* A holder's response body: who it is and which attempt, so that the
 * checker can tell whose completion a record keeps. */
static void body_of(char *out, size_t n, const char *key, const char *holder,
                    int attempt) {
  snprintf(out, n, "r:%s:%s:a%d", key, holder, attempt);
}

static void log_answer(worker_thread *w, const char *holder, const char *key,
                       const idem_call *c) {
  const idem_response *r = idem_call_response(c);
  int o = idem_call_outcome(c);
  char body[256] = "-";
  if (o == IDEM_REPLAY && r) {
    size_t n = r->body_len < sizeof body - 1 ? r->body_len : sizeof body - 1;
    memcpy(body, r->body, n);
    body[n] = '\0';
    if (sabotage && n > 0 && pick(&w->rng, 50) == 0)
      body[n - 1] ^= 1; /* a replay that differs by one bit */
    for (size_t i = 0; i < n; i++)
      if (body[i] == ' ' || body[i] == '\n' || body[i] == '\0')
        body[i] = '?';
  }
  append_line(w->hist, "C %s %s %d %d %s", holder, key, o, idem_call_attempt(c),
              body);
}

/* claim, act, then complete, release or mark unknown; sometimes slowly,
 * past the lease. */
static void op_claim(worker_thread *w, const char *key, const char *holder) {
  idem_id id = {w->t->tenant, OPERATION, key};
  idem_call_options o;
  idem_call *c = NULL;
  char fp[65], body[128];
  int rc, variant = pick(&w->rng, 20) == 0;
  memset(&o, 0, sizeof o);
  o.lease_ms = LEASE_MS;
  o.takeover_unknown = pick(&w->rng, 10) == 0;
  fingerprint_of(key, variant, fp);
  rc = idem_claim(w->store, &id, fp, &o, &c);
  if (rc != IDEM_OK) {
    append_line(w->hist, "e %s %s claim %d", holder, key, rc);
    return;
  }
  log_answer(w, holder, key, c);
  int out = idem_call_outcome(c), attempt = idem_call_attempt(c);
  if (sabotage && out == IDEM_IN_FLIGHT && pick(&w->rng, 4) == 0)
    effect(w, key, holder, out, attempt); /* acts without holding the key */
  if (out == IDEM_PROCEED || out == IDEM_RECOVER) {
    /* An action takes a while, so that kills and stops land inside it. */
    sleep_ms(pick(&w->rng, 15));
    int what = pick(&w->rng, 20);
    if (what < 2) {
      /* Failed before acting: release. */
      rc = idem_release(w->store, c);
      append_line(w->hist, "R %s %s %d", holder, key, rc);
    } else if (what < 4) {
      /* Acted (or maybe not) and cannot tell: mark unknown. */
      if (what == 2)
        effect(w, key, holder, out, attempt);
      rc = idem_mark_unknown(w->store, c);
      append_line(w->hist, "U %s %s %d", holder, key, rc);
    } else {
      effect(w, key, holder, out, attempt);
      sleep_ms(pick(&w->rng, 15));
      /* Now and then a slow action, past its lease. */
      if (pick(&w->rng, 6) == 0)
        sleep_ms(pick(&w->rng, 2 * LEASE_MS));
      body_of(body, sizeof body, key, holder, attempt);
      append_line(w->hist, "P %s %s %s", holder, key, body);
      idem_response resp = {200, NULL, 0, body, strlen(body)};
      rc = idem_complete(w->store, c, &resp);
      append_line(w->hist, "D %s %s %d %s", holder, key, rc, body);
    }
  }
  idem_call_free(c);
}

typedef struct exec_ctx {
  worker_thread *w;
  const char *key, *holder;
  char body[128];
} exec_ctx;

static idem_exec_result exec_fn(idem_exec *x, void *p, idem_response *resp) {
  exec_ctx *e = p;
  worker_thread *w = e->w;
  int out = idem_exec_outcome(x), attempt = idem_exec_attempt(x);
  int what = pick(&w->rng, 20);
  append_line(w->hist, "C %s %s %d %d -", e->holder, e->key, out, attempt);
  sleep_ms(pick(&w->rng, 15));
  if (what == 0)
    return IDEM_EXEC_NOT_DONE;
  effect(w, e->key, e->holder, out, attempt);
  sleep_ms(pick(&w->rng, 15));
  if (what == 1)
    return IDEM_EXEC_UNKNOWN;
  if (pick(&w->rng, 6) == 0)
    sleep_ms(pick(&w->rng, 2 * LEASE_MS));
  body_of(e->body, sizeof e->body, e->key, e->holder, attempt);
  append_line(w->hist, "P %s %s %s", e->holder, e->key, e->body);
  resp->status = 200;
  resp->body = e->body;
  resp->body_len = strlen(e->body);
  return IDEM_EXEC_DONE;
}

/* idem_execute(): the library holds and renews the lease itself. */
static void op_execute(worker_thread *w, const char *key, const char *holder) {
  idem_id id = {w->t->tenant, OPERATION, key};
  idem_execute_options o;
  idem_call *c = NULL;
  exec_ctx e;
  char req[64];
  memset(&o, 0, sizeof o);
  memset(&e, 0, sizeof e);
  o.call.lease_ms = LEASE_MS;
  o.call.takeover_unknown = pick(&w->rng, 10) == 0;
  o.finish_retry_ms = 2000;
  e.w = w;
  e.key = key;
  e.holder = holder;
  snprintf(req, sizeof req, "{\"key\":\"%s\",\"v\":%d}", key,
           pick(&w->rng, 20) == 0);
  int rc = idem_execute(w->store, &id, req, strlen(req), exec_fn, &e, &o, &c);
  if (!c) {
    append_line(w->hist, "e %s %s execute %d", holder, key, rc);
    return;
  }
  int out = idem_call_outcome(c);
  if (out == IDEM_PROCEED || out == IDEM_RECOVER) {
    /* fn ran and logged its claim; the result of its completion: */
    if (e.body[0])
      append_line(w->hist, "D %s %s %d %s", holder, key, rc, e.body);
  } else {
    log_answer(w, holder, key, c);
  }
  idem_call_free(c);
}

typedef struct local_ctx {
  worker_thread *w;
  const char *key, *holder;
  int pg;
  char body[128];
} local_ctx;

static int local_fn(void *conn, void *p, idem_response *resp) {
  local_ctx *l = p;
  body_of(l->body, sizeof l->body, l->key, l->holder, 1);
  if (l->pg) {
    const char *v[3] = {l->w->t->tenant, l->key, l->body};
    PGresult *r =
        PQexecParams(conn,
                     "INSERT INTO public.chaos_local(tenant, key, body) "
                     "VALUES ($1, $2, $3)",
                     3, NULL, v, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok)
      return 1;
  } else {
    sqlite3_stmt *st = NULL;
    int ok = sqlite3_prepare_v2(conn,
                                "INSERT INTO chaos_local(tenant, key, body) "
                                "VALUES (?, ?, ?)",
                                -1, &st, NULL) == SQLITE_OK;
    if (ok) {
      sqlite3_bind_text(st, 1, l->w->t->tenant, -1, SQLITE_STATIC);
      sqlite3_bind_text(st, 2, l->key, -1, SQLITE_STATIC);
      sqlite3_bind_text(st, 3, l->body, -1, SQLITE_STATIC);
      ok = sqlite3_step(st) == SQLITE_DONE;
    }
    sqlite3_finalize(st);
    if (!ok)
      return 1;
  }
  resp->status = 200;
  resp->body = l->body;
  resp->body_len = strlen(l->body);
  return 0;
}

/* idem_execute_local(): the effect is a row in the store's transaction. */
static void op_local(worker_thread *w, const char *key, const char *holder) {
  idem_id id = {w->t->tenant, OPERATION, key};
  idem_call_options o;
  idem_call *c = NULL;
  local_ctx l;
  char fp[65];
  memset(&o, 0, sizeof o);
  memset(&l, 0, sizeof l);
  o.lease_ms = LEASE_MS;
  l.w = w;
  l.key = key;
  l.holder = holder;
  l.pg = w->t->cfg->pg;
  fingerprint_of(key, 0, fp);
  int rc = idem_execute_local(w->store, &id, fp, &o, local_fn, &l, &c);
  if (rc != IDEM_OK) {
    append_line(w->hist, "e %s %s local %d", holder, key, rc);
    idem_call_free(c);
    return;
  }
  const idem_response *r = idem_call_response(c);
  char body[256] = "-";
  if (r && r->body_len < sizeof body) {
    memcpy(body, r->body, r->body_len);
    body[r->body_len] = '\0';
  }
  append_line(w->hist, "L %s %s %d %s", holder, key, idem_call_outcome(c),
              body);
  idem_call_free(c);
}

static void *worker_loop(void *p) {
  worker_thread *w = p;
  char key[8], holder[64];
  while (mono_ms() < w->t->deadline) {
    /* The keys in play move along with time, three at a time, so that
     * new keys are contested (claims, kills of holders, takeovers) all
     * through the trial rather than only at its start. */
    int64_t left = w->t->deadline - mono_ms();
    int win = (int)((CHAOS_MS - left) * (REMOTE_KEYS - 2) / CHAOS_MS);
    if (win < 0)
      win = 0;
    int k = win + pick(&w->rng, 3);
    if (k >= REMOTE_KEYS)
      k = REMOTE_KEYS - 1;
    if (pick(&w->rng, 4) == 0)
      k = REMOTE_KEYS + (k * LOCAL_KEYS / REMOTE_KEYS); /* a local key */
    key_name(k, key);
    snprintf(holder, sizeof holder, "%d.%d.%ld", (int)getpid(), w->tid,
             w->seq++);
    if (k >= REMOTE_KEYS)
      op_local(w, key, holder);
    else if (pick(&w->rng, 2))
      op_claim(w, key, holder);
    else
      op_execute(w, key, holder);
    /* A caller's pause between calls: keeps the history to hundreds of
     * calls per trial rather than a flood of replays from the cache. */
    usleep((useconds_t)(300 + pick(&w->rng, 1500)));
  }
  return NULL;
}

/* A worker process: its own store handle, one or two threads. */
static void worker_main(const trial_ctx *t, int wid, uint64_t seed) {
  idem_store *store = NULL;
  worker_thread th[2];
  pthread_t pt[2];
  int nthreads = wid % 2 ? 2 : 1;
  int hist = open_append(t->hist_path), eff = open_append(t->eff_path);
  int rc = idem_store_open(t->cfg->store, NULL, &store);
  if (rc != IDEM_OK) {
    append_line(hist, "e %d.0.0 - open %d", (int)getpid(), rc);
    _exit(0);
  }
  for (int i = 0; i < nthreads; i++) {
    th[i].t = t;
    th[i].store = store;
    th[i].hist = hist;
    th[i].eff = eff;
    th[i].wid = wid;
    th[i].tid = i;
    th[i].rng = seed ^ ((uint64_t)getpid() << 20) ^ (uint64_t)(i + 1) * 77777;
    th[i].seq = 0;
    if (i > 0 && pthread_create(&pt[i], NULL, worker_loop, &th[i]) != 0)
      die("pthread_create failed");
  }
  worker_loop(&th[0]);
  for (int i = 1; i < nthreads; i++)
    pthread_join(pt[i], NULL);
  idem_store_close(store);
  _exit(0);
}

/* ---- workers: idem run ------------------------------------------------- */

/* One `idem run` call of a run worker: logs its pid, whether it was told
 * of a rerun, its exit status and its output. */
static volatile sig_atomic_t want_kill, want_stop;

static void on_usr(int sig) {
  if (sig == SIGUSR1)
    want_kill = 1;
  else
    want_stop = 1;
}

/* The controller asks a run worker (SIGUSR1, SIGUSR2) to kill or stop the
 * idem run it waits for: a parent may signal its own child safely, since
 * the child's pid cannot be reused before the parent reaps it. */
static void relay_faults(pid_t pid, int hist, uint64_t *rng) {
  if (want_kill) {
    want_kill = 0;
    if (kill(pid, SIGKILL) == 0)
      append_line(hist, "K %d", (int)pid);
  }
  if (want_stop) {
    want_stop = 0;
    if (kill(pid, SIGSTOP) == 0) {
      append_line(hist, "T %d", (int)pid);
      sleep_ms(LEASE_MS + pick(rng, 3 * LEASE_MS));
      kill(pid, SIGCONT);
    }
  }
}

static int run_once(const trial_ctx *t, int hist, uint64_t *rng,
                    const char *key, int force_rerun) {
  int out[2], err[2];
  int rerun = force_rerun || pick(rng, 3) == 0;
  char script[4400], lease[16];
  snprintf(lease, sizeof lease, "%dms", LEASE_MS * 2);
  /* The effect: a line naming the key and this idem run (the shell's
   * parent); the output: the same, which is what replays show. */
  snprintf(script, sizeof script,
           "echo \"E $0 $PPID\" >> '%s'; sleep 0.02; echo \"out $0 $PPID\"",
           t->eff_path);
  if (pipe(out) != 0 || pipe(err) != 0)
    die("pipe: %s", strerror(errno));
  pid_t pid = fork();
  if (pid < 0)
    die("fork: %s", strerror(errno));
  if (pid == 0) {
    const char *argv[] = {t->cfg->idem,
                          "run",
                          "--key",
                          key,
                          "--tenant",
                          t->tenant,
                          "--store",
                          t->cfg->store,
                          "--lease",
                          lease,
                          "--stdin",
                          "ignore",
                          "--on-unknown",
                          rerun ? "rerun" : "fail",
                          "--",
                          "sh",
                          "-c",
                          script,
                          key,
                          NULL};
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    close(out[1]);
    close(err[1]);
    execv(t->cfg->idem, (char *const *)argv);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  char obuf[256], ebuf[4096];
  size_t on = 0, en = 0;
  for (int open_fds = 2; open_fds > 0;) {
    fd_set fds;
    FD_ZERO(&fds);
    if (out[0] >= 0)
      FD_SET(out[0], &fds);
    if (err[0] >= 0)
      FD_SET(err[0], &fds);
    if (!force_rerun)
      relay_faults(pid, hist, rng);
    if (select((out[0] > err[0] ? out[0] : err[0]) + 1, &fds, NULL, NULL,
               NULL) < 0) {
      if (errno == EINTR)
        continue;
      die("select: %s", strerror(errno));
    }
    int *fdp[2] = {&out[0], &err[0]};
    char *bufs[2] = {obuf, ebuf};
    size_t *lens[2] = {&on, &en}, caps[2] = {sizeof obuf - 1, sizeof ebuf - 1};
    for (int i = 0; i < 2; i++) {
      if (*fdp[i] < 0 || !FD_ISSET(*fdp[i], &fds))
        continue;
      char tmp[1024];
      ssize_t n = read(*fdp[i], tmp, sizeof tmp);
      if (n <= 0) {
        close(*fdp[i]);
        *fdp[i] = -1;
        open_fds--;
        continue;
      }
      size_t room = caps[i] - *lens[i];
      size_t take = (size_t)n < room ? (size_t)n : room;
      memcpy(bufs[i] + *lens[i], tmp, take);
      *lens[i] += take;
    }
  }
  obuf[on] = '\0';
  ebuf[en] = '\0';
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
    ;
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  int told = strstr(ebuf, "running the command again") != NULL;
  for (size_t i = 0; i < on; i++)
    if (obuf[i] == '\n' || obuf[i] == ' ')
      obuf[i] = '_';
  append_line(hist, "X %d %s %d %d %s", (int)pid, key, code, told,
              on ? obuf : "-");
  if (code == 5 || code == 125) {
    /* What idem run said, for whoever reads a failing trial's history. */
    for (size_t i = 0; i < en; i++)
      if (ebuf[i] == '\n')
        ebuf[i] = '|';
    append_line(hist, "M %d %.400s", (int)pid, ebuf);
  }
  return code;
}

static void run_worker_main(const trial_ctx *t, int wid, uint64_t seed) {
  int hist = open_append(t->hist_path);
  uint64_t rng = seed ^ ((uint64_t)getpid() << 16) ^ (uint64_t)wid;
  char key[8];
  while (mono_ms() < t->deadline) {
    key_name(pick(&rng, RUN_KEYS), key);
    if (sabotage && pick(&rng, 4) == 0) {
      /* The command run without idem run, as a careless caller would. */
      int eff = open_append(t->eff_path);
      append_line(eff, "E %s %d", key, (int)getpid());
      close(eff);
    }
    run_once(t, hist, &rng, key, 0);
  }
  _exit(0);
}

/* ---- the controller ---------------------------------------------------- */

typedef struct proc {
  pid_t pid;
  int dead; /* killed, not yet reaped */
  int stopped;
  int64_t resume_at;
} proc;

static pid_t spawn_worker(const trial_ctx *t, int wid, uint64_t seed) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    die("fork: %s", strerror(errno));
  if (pid == 0) {
    if (!strcmp(t->cfg->mode, "run"))
      run_worker_main(t, wid, seed);
    else
      worker_main(t, wid, seed);
  }
  return pid;
}

/* The controller's own session to the PostgreSQL server, for cuts and
 * the check of chaos_local; reconnected after a restart. */
static PGconn *admin;

static PGconn *admin_conn(const config *cfg) {
  if (admin && PQstatus(admin) == CONNECTION_OK)
    return admin;
  PQfinish(admin);
  admin = NULL;
  for (int i = 0; i < 300; i++) {
    admin = PQconnectdb(cfg->store);
    if (PQstatus(admin) == CONNECTION_OK)
      return admin;
    PQfinish(admin);
    admin = NULL;
    sleep_ms(50);
  }
  die("cannot connect to the PostgreSQL server");
  return NULL;
}

/* Cuts the connections of the workers: the server ends their sessions. */
static int cut_connections(const config *cfg) {
  PGconn *c = admin_conn(cfg);
  PGresult *r = PQexec(c, "SELECT count(pg_terminate_backend(pid)) FROM "
                          "pg_stat_activity WHERE pid <> pg_backend_pid() "
                          "AND backend_type = 'client backend' "
                          "AND datname = current_database()");
  int n = PQresultStatus(r) == PGRES_TUPLES_OK ? atoi(PQgetvalue(r, 0, 0)) : -1;
  PQclear(r);
  if (n < 0) {
    PQfinish(admin);
    admin = NULL;
  }
  return n;
}

static pid_t start_restart(const config *cfg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    die("fork: %s", strerror(errno));
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    dup2(fd, 1);
    execl("/bin/sh", "sh", "-c", cfg->pg_restart, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* ---- recovery and the check: the library campaign --------------------- */

typedef struct key_hist {
  int proceed_effects, recover_answers, effects;
  long completions_ok;
} key_hist;

typedef struct holder_rec {
  char holder[64];
  char key[8];
  int outcome; /* of the claim: PROCEED or RECOVER when it held the key */
} holder_rec;

static int violation(totals *tot, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("VIOLATION: ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
  tot->violations++;
  return 1;
}

/* Takes over every remote key whose holder died, as a retrying caller
 * would: RECOVER, act, complete. Logged like any worker's calls. */
static void recover_keys(const trial_ctx *t, idem_store *store, totals *tot) {
  int hist = open_append(t->hist_path), eff = open_append(t->eff_path);
  for (int k = 0; k < REMOTE_KEYS; k++) {
    char key[8], fp[65], holder[32], body[128];
    idem_id id = {t->tenant, OPERATION, key_name(k, key)};
    idem_call_options o;
    memset(&o, 0, sizeof o);
    o.lease_ms = LEASE_MS;
    snprintf(holder, sizeof holder, "rec.%d", k);
    fingerprint_of(key, 0, fp);
    /* The retrying caller sends the request the record was made for (a
     * few calls send another one). */
    {
      idem_record *r = NULL;
      if (idem_get(store, &id, &r) == IDEM_OK)
        snprintf(fp, sizeof fp, "%s", r->fingerprint);
      idem_record_free(r);
    }
    for (int tries = 0; tries < 400; tries++) {
      idem_call *c = NULL;
      int rc = idem_claim(store, &id, fp, &o, &c);
      if (rc != IDEM_OK) {
        sleep_ms(50);
        continue;
      }
      int out = idem_call_outcome(c);
      if (out == IDEM_IN_FLIGHT) {
        sleep_ms(idem_call_retry_after_ms(c));
        idem_call_free(c);
        continue;
      }
      worker_thread w;
      memset(&w, 0, sizeof w);
      w.hist = hist;
      w.eff = eff;
      log_answer(&w, holder, key, c);
      if (out == IDEM_PROCEED || out == IDEM_RECOVER) {
        int attempt = idem_call_attempt(c);
        tot->recovered_at_end += out == IDEM_RECOVER;
        effect(&w, key, holder, out, attempt);
        body_of(body, sizeof body, key, holder, attempt);
        append_line(hist, "P %s %s %s", holder, key, body);
        idem_response resp = {200, NULL, 0, body, strlen(body)};
        for (int i = 0; i < 200; i++) {
          rc = idem_complete(store, c, &resp);
          if (rc != IDEM_EBUSY && rc != IDEM_EUNAVAILABLE)
            break;
          sleep_ms(50);
        }
        append_line(hist, "D %s %s %d %s", holder, key, rc, body);
      }
      idem_call_free(c);
      break;
    }
  }
  close(hist);
  close(eff);
}

/* The final record of a key: state (0 = absent), body, attempt, lease. */
typedef struct final_rec {
  int state, attempt;
  int64_t lease_expires_ms;
  char body[256];
} final_rec;

static int read_final(idem_store *store, const char *tenant,
                      const char *operation, const char *key, final_rec *f) {
  idem_id id = {tenant, operation, key};
  idem_record *r = NULL;
  int rc = IDEM_EUNAVAILABLE;
  memset(f, 0, sizeof *f);
  for (int i = 0; i < 200; i++) {
    rc = idem_get(store, &id, &r);
    if (rc != IDEM_EUNAVAILABLE && rc != IDEM_EBUSY)
      break;
    sleep_ms(50);
  }
  if (rc == IDEM_ENOTFOUND)
    return 0;
  if (rc != IDEM_OK)
    return -1;
  f->state = r->state;
  f->attempt = r->attempt;
  f->lease_expires_ms = r->lease_expires_ms;
  if (r->has_response && r->response.body_len < sizeof f->body) {
    memcpy(f->body, r->response.body, r->response.body_len);
    f->body[r->response.body_len] = '\0';
  }
  idem_record_free(r);
  return 0;
}

/* The rows of chaos_local for a key: count and the last body. */
static int local_rows(const config *cfg, const char *tenant, const char *key,
                      char *body, size_t n) {
  int count = 0;
  body[0] = '\0';
  if (cfg->pg) {
    const char *v[2] = {tenant, key};
    for (int i = 0; i < 100; i++) {
      PGresult *r = PQexecParams(admin_conn(cfg),
                                 "SELECT body FROM public.chaos_local "
                                 "WHERE tenant = $1 AND key = $2",
                                 2, NULL, v, NULL, NULL, 0);
      if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        count = PQntuples(r);
        if (count > 0)
          snprintf(body, n, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
        return count;
      }
      PQclear(r);
      PQfinish(admin);
      admin = NULL;
    }
    die("cannot read chaos_local");
  }
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  const char *path = cfg->store + (strncmp(cfg->store, "sqlite:", 7) ? 0 : 7);
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
      sqlite3_busy_timeout(db, 10000) != SQLITE_OK ||
      sqlite3_prepare_v2(db,
                         "SELECT body FROM chaos_local WHERE tenant = ? "
                         "AND key = ?",
                         -1, &st, NULL) != SQLITE_OK)
    die("cannot read chaos_local: %s", sqlite3_errmsg(db));
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 2, key, -1, SQLITE_STATIC);
  while (sqlite3_step(st) == SQLITE_ROW) {
    count++;
    snprintf(body, n, "%s", (const char *)sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return count;
}

static holder_rec *find_holder(holder_rec *h, int n, const char *holder) {
  for (int i = n - 1; i >= 0; i--)
    if (!strcmp(h[i].holder, holder))
      return &h[i];
  return NULL;
}

/* The attempt written in a body "r:KEY:HOLDER:aN", or -1. */
static int body_attempt(const char *body) {
  const char *a = strrchr(body, ':');
  return a && a[1] == 'a' ? atoi(a + 2) : -1;
}

static int check_lib(const trial_ctx *t, idem_store *store, totals *tot) {
  static holder_rec holders[MAX_HOLDERS];
  int nh = 0, bad = 0;
  char line[LINE_MAX_];
  FILE *h = fopen(t->hist_path, "r"), *e;
  final_rec fin[NKEYS];
  char kname[NKEYS][8];
  int64_t now = wall_ms();
  if (!h)
    die("cannot read %s", t->hist_path);
  for (int k = 0; k < NKEYS; k++) {
    key_name(k, kname[k]);
    if (read_final(store, t->tenant, OPERATION, kname[k], &fin[k]) != 0)
      die("cannot read the record of %s: %s", kname[k], idem_errmsg());
    /* V7 */
    if (fin[k].state == IDEM_STATE_IN_PROGRESS &&
        fin[k].lease_expires_ms <= now)
      bad |= violation(tot,
                       "%s %s: in progress with an expired lease after "
                       "the recovery pass",
                       t->tenant, kname[k]);
  }
  key_hist kh[NKEYS];
  memset(kh, 0, sizeof kh);
  while (fgets(line, sizeof line, h)) {
    char kind, holder[64], key[8], body[256];
    int a, b;
    int k = -1;
    if (sscanf(line, "%c %63s %7s", &kind, holder, key) != 3)
      continue;
    for (int i = 0; i < NKEYS; i++)
      if (!strcmp(key, kname[i]))
        k = i;
    if (k < 0)
      continue;
    if (kind == 'e') {
      tot->calls++;
      tot->errors++;
    } else if (kind == 'C' &&
               sscanf(line, "C %*s %*s %d %d %255s", &a, &b, body) == 3) {
      tot->calls++;
      if (a >= 1 && a <= 6)
        tot->outcome[a]++;
      if (a == IDEM_RECOVER)
        kh[k].recover_answers++;
      if ((a == IDEM_PROCEED || a == IDEM_RECOVER) && nh < MAX_HOLDERS) {
        snprintf(holders[nh].holder, sizeof holders[nh].holder, "%s", holder);
        snprintf(holders[nh].key, sizeof holders[nh].key, "%s", key);
        holders[nh++].outcome = a;
      }
      /* V3 */
      if (a == IDEM_REPLAY &&
          (fin[k].state != IDEM_STATE_COMPLETED || strcmp(body, fin[k].body)))
        bad |= violation(tot,
                         "%s %s: replay [%s] but the record holds [%s] "
                         "(state %d)",
                         t->tenant, key, body, fin[k].body, fin[k].state);
    } else if (kind == 'D' &&
               sscanf(line, "D %*s %*s %d %255s", &a, body) == 2) {
      /* V4, V5 */
      if (a == IDEM_OK &&
          (fin[k].state != IDEM_STATE_COMPLETED || strcmp(body, fin[k].body)))
        bad |= violation(tot,
                         "%s %s: completion of [%s] answered OK, but "
                         "the record holds [%s] (state %d)",
                         t->tenant, key, body, fin[k].body, fin[k].state);
      if (a == IDEM_ESTALE) {
        tot->stale++;
        if (!strcmp(body, fin[k].body))
          bad |= violation(tot,
                           "%s %s: the stale completion [%s] is the "
                           "record's response",
                           t->tenant, key, body);
      }
    } else if (kind == 'L' &&
               sscanf(line, "L %*s %*s %d %255s", &a, body) == 2) {
      tot->calls++;
      if (a >= 1 && a <= 6)
        tot->outcome[a]++;
      if ((a == IDEM_PROCEED || a == IDEM_RECOVER || a == IDEM_REPLAY) &&
          (fin[k].state != IDEM_STATE_COMPLETED || strcmp(body, fin[k].body)))
        bad |= violation(tot,
                         "%s %s: local call answered [%s] (outcome %d), "
                         "the record holds [%s]",
                         t->tenant, key, body, a, fin[k].body);
    }
  }
  fclose(h);
  /* V1, V2 */
  if ((e = fopen(t->eff_path, "r"))) {
    while (fgets(line, sizeof line, e)) {
      char key[8], holder[64];
      int out, attempt, k = -1;
      if (sscanf(line, "E %7s %63s %d %d", key, holder, &out, &attempt) != 4)
        continue;
      for (int i = 0; i < NKEYS; i++)
        if (!strcmp(key, kname[i]))
          k = i;
      if (k < 0)
        continue;
      tot->effects++;
      kh[k].effects++;
      holder_rec *hr = find_holder(holders, nh, holder);
      if (!hr || strcmp(hr->key, key))
        bad |= violation(tot,
                         "%s %s: effect by %s, which was never answered "
                         "PROCEED or RECOVER",
                         t->tenant, key, holder);
      else if (hr->outcome == IDEM_PROCEED && ++kh[k].proceed_effects > 1)
        bad |= violation(tot,
                         "%s %s: a second effect by a caller answered "
                         "PROCEED (%s), not told RECOVER",
                         t->tenant, key, holder);
    }
    fclose(e);
  }
  for (int k = 0; k < REMOTE_KEYS; k++) {
    if (kh[k].effects > 1 + kh[k].recover_answers)
      bad |= violation(tot, "%s %s: %d effects, %d RECOVER answers", t->tenant,
                       kname[k], kh[k].effects, kh[k].recover_answers);
    /* V5 (the last attempt's response), V6 */
    if (fin[k].state == IDEM_STATE_COMPLETED) {
      if (body_attempt(fin[k].body) != fin[k].attempt)
        bad |= violation(tot,
                         "%s %s: the record's response [%s] is not its "
                         "attempt %d's",
                         t->tenant, kname[k], fin[k].body, fin[k].attempt);
      char holder[64];
      if (sscanf(fin[k].body, "r:%*[^:]:%63[^:]", holder) != 1 ||
          !find_holder(holders, nh, holder))
        bad |= violation(tot,
                         "%s %s: the record's response [%s] is no "
                         "holder's",
                         t->tenant, kname[k], fin[k].body);
    }
  }
  /* V8 */
  for (int k = REMOTE_KEYS; k < NKEYS; k++) {
    char body[256];
    int rows = local_rows(t->cfg, t->tenant, kname[k], body, sizeof body);
    tot->local_rows += rows;
    int want = fin[k].state == IDEM_STATE_COMPLETED;
    if (fin[k].state != 0 && fin[k].state != IDEM_STATE_COMPLETED)
      bad |= violation(tot, "%s %s: a local key in state %d", t->tenant,
                       kname[k], fin[k].state);
    if (rows != want || (want && strcmp(body, fin[k].body)))
      bad |=
          violation(tot,
                    "%s %s: %d rows ([%s]) for a record in state %d "
                    "([%s])",
                    t->tenant, kname[k], rows, body, fin[k].state, fin[k].body);
  }
  return bad;
}

/* ---- the check: the idem run campaign --------------------------------- */

static int check_run(const trial_ctx *t, idem_store *store, totals *tot) {
  char line[LINE_MAX_];
  int bad = 0;
  FILE *h = fopen(t->hist_path, "r"), *e;
  final_rec fin[RUN_KEYS];
  char kname[RUN_KEYS][8];
  int effects[RUN_KEYS] = {0}, told[RUN_KEYS] = {0};
  int64_t now = wall_ms();
  if (!h)
    die("cannot read %s", t->hist_path);
  for (int k = 0; k < RUN_KEYS; k++) {
    key_name(k, kname[k]);
    if (read_final(store, t->tenant, "run", kname[k], &fin[k]) != 0)
      die("cannot read the record of %s: %s", kname[k], idem_errmsg());
    for (char *c = fin[k].body; *c; c++)
      if (*c == '\n' || *c == ' ')
        *c = '_';
    /* V7, after the final rerun of every key */
    if (fin[k].state == IDEM_STATE_IN_PROGRESS &&
        fin[k].lease_expires_ms <= now)
      bad |= violation(tot,
                       "%s %s: in progress with an expired lease after "
                       "the final runs",
                       t->tenant, kname[k]);
  }
  /* Runs by pid: which key, exit status, told of a rerun. */
  static struct {
    int pid, code, told;
    char key[8];
    char out[256];
  } runs[MAX_HOLDERS];
  int nr = 0;
  while (fgets(line, sizeof line, h)) {
    int pid, code, tl, k = -1;
    char key[8], out[256];
    if (line[0] == 'K')
      tot->killed++;
    if (line[0] == 'T')
      tot->stopped++;
    if (sscanf(line, "X %d %7s %d %d %255s", &pid, key, &code, &tl, out) != 5)
      continue;
    for (int i = 0; i < RUN_KEYS; i++)
      if (!strcmp(key, kname[i]))
        k = i;
    if (k < 0)
      continue;
    tot->calls++;
    if (nr < MAX_HOLDERS) {
      runs[nr].pid = pid;
      runs[nr].code = code;
      runs[nr].told = tl;
      snprintf(runs[nr].key, sizeof runs[nr].key, "%s", key);
      snprintf(runs[nr].out, sizeof runs[nr].out, "%s", out);
      nr++;
    }
    told[k] += tl;
    tot->outcome[IDEM_RECOVER] += tl;
    if (code == 0) {
      /* Ran and completed, or replayed: the stored output either way. */
      if (fin[k].state != IDEM_STATE_COMPLETED || strcmp(out, fin[k].body))
        bad |= violation(tot,
                         "%s %s: run %d exited 0 with [%s], the record "
                         "holds [%s] (state %d)",
                         t->tenant, key, pid, out, fin[k].body, fin[k].state);
      char mine[32];
      snprintf(mine, sizeof mine, "out_%s_%d_", key, pid);
      tot->outcome[strcmp(out, mine) ? IDEM_REPLAY : IDEM_PROCEED]++;
    } else if (code == 5) {
      tot->stale++;
      char mine[32];
      snprintf(mine, sizeof mine, "out_%s_%d_", key, pid);
      if (!strcmp(fin[k].body, mine))
        bad |= violation(tot,
                         "%s %s: run %d's result was not recorded "
                         "(exit 5), yet the record holds it",
                         t->tenant, key, pid);
    } else if (code == 4) {
      tot->outcome[IDEM_UNKNOWN]++;
    } else if (code == 75) {
      tot->outcome[IDEM_IN_FLIGHT]++;
    } else if (code == 128 + SIGKILL) {
      /* Killed: counted with the faults. */
    } else if (code == 128 + SIGABRT || code == 128 + SIGSEGV ||
               code == 128 + SIGBUS || code == 128 + SIGILL) {
      bad |= violation(tot, "%s %s: run %d crashed (exit %d)", t->tenant, key,
                       pid, code);
    } else {
      tot->errors++;
    }
  }
  fclose(h);
  if ((e = fopen(t->eff_path, "r"))) {
    int seen_pid[MAX_HOLDERS], ns = 0;
    while (fgets(line, sizeof line, e)) {
      char key[8];
      int pid, k = -1;
      if (sscanf(line, "E %7s %d", key, &pid) != 2)
        continue;
      for (int i = 0; i < RUN_KEYS; i++)
        if (!strcmp(key, kname[i]))
          k = i;
      if (k < 0)
        continue;
      tot->effects++;
      effects[k]++;
      for (int i = 0; i < ns; i++)
        if (seen_pid[i] == pid)
          bad |=
              violation(tot, "%s %s: run %d acted twice", t->tenant, key, pid);
      if (ns < MAX_HOLDERS)
        seen_pid[ns++] = pid;
      if (effects[k] > 1) {
        /* A further effect: its run must have been told of the rerun. */
        int ok = 0;
        for (int i = 0; i < nr; i++)
          if (runs[i].pid == pid && runs[i].told)
            ok = 1;
        if (!ok)
          bad |= violation(tot,
                           "%s %s: effect %d by run %d, which was not "
                           "told that an earlier run may have acted",
                           t->tenant, key, effects[k], pid);
      }
    }
    fclose(e);
  }
  for (int k = 0; k < RUN_KEYS; k++)
    if (effects[k] > 1 + told[k])
      bad |= violation(tot, "%s %s: %d effects, %d runs told of a rerun",
                       t->tenant, kname[k], effects[k], told[k]);
  return bad;
}

/* ---- one trial --------------------------------------------------------- */

static void setup_local_table(const config *cfg) {
  if (cfg->pg) {
    PGresult *r =
        PQexec(admin_conn(cfg), "CREATE TABLE IF NOT EXISTS public.chaos_local("
                                "tenant text, key text, body text)");
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
      die("create chaos_local: %s", PQerrorMessage(admin));
    PQclear(r);
    return;
  }
  sqlite3 *db = NULL;
  const char *path = cfg->store + (strncmp(cfg->store, "sqlite:", 7) ? 0 : 7);
  if (sqlite3_open(path, &db) != SQLITE_OK ||
      sqlite3_exec(db,
                   "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS "
                   "chaos_local(tenant TEXT, key TEXT, body TEXT)",
                   NULL, NULL, NULL) != SQLITE_OK)
    die("create chaos_local: %s", sqlite3_errmsg(db));
  sqlite3_close(db);
}

static int trial(const config *cfg, long n, totals *tot) {
  trial_ctx t;
  proc procs[MAX_PIDS];
  int np = 0, bad = 0, is_run = !strcmp(cfg->mode, "run");
  uint64_t rng = cfg->seed * 1000003ULL + (uint64_t)n * 7919ULL + 1;
  pid_t restart_pid = -1;
  memset(&t, 0, sizeof t);
  t.cfg = cfg;
  snprintf(t.tenant, sizeof t.tenant, "t%lu-%ld", (unsigned long)cfg->seed, n);
  snprintf(t.hist_path, sizeof t.hist_path, "%s/%s.hist", cfg->dir, t.tenant);
  snprintf(t.eff_path, sizeof t.eff_path, "%s/%s.eff", cfg->dir, t.tenant);
  unlink(t.hist_path);
  unlink(t.eff_path);
  int64_t start = mono_ms();
  t.deadline = start + CHAOS_MS;
  for (int i = 0; i < WORKERS; i++) {
    procs[np].pid = spawn_worker(&t, i, rng + (uint64_t)i);
    procs[np].stopped = procs[np].dead = 0;
    np++;
  }
  int restart_now = cfg->pg && cfg->pg_restart && cfg->restart_every > 0 &&
                    n % cfg->restart_every == cfg->restart_every - 1;
  int64_t restart_at = start + 30 + pick(&rng, CHAOS_MS / 2);
  int64_t next_fault = start + 10 + pick(&rng, 40);
  while (mono_ms() < t.deadline) {
    int64_t now = mono_ms();
    for (int i = 0; i < np; i++)
      if (procs[i].stopped && now >= procs[i].resume_at) {
        kill(procs[i].pid, SIGCONT);
        procs[i].stopped = 0;
      }
    if (restart_now && restart_pid < 0 && now >= restart_at) {
      restart_pid = start_restart(cfg);
      tot->restarts++;
    }
    if (now >= next_fault) {
      /* 0-1 SIGKILL, 2-3 SIGSTOP, 4 a clock step, 5 (PostgreSQL) cuts. */
      int kind = pick(&rng, is_run ? 4 : cfg->pg ? 6 : 5);
      int idx = pick(&rng, np);
      pid_t target = procs[idx].pid;
      if (kind == 4) {
        if (clockshift_set(-60000 + (int64_t)pick(&rng, 120001)) == 0)
          tot->steps++;
      } else if (kind == 5) {
        if (cut_connections(cfg) >= 0)
          tot->cuts++;
      } else if (is_run) {
        /* The worker kills or stops the idem run it waits for, and logs
         * it; counted from its log. */
        kill(target, kind <= 1 ? SIGUSR1 : SIGUSR2);
      } else if (procs[idx].dead) {
        /* Already killed: this fault is not sent. */
      } else if (kind <= 1) {
        /* SIGKILL; a library worker is replaced by a new one. */
        if (kill(target, SIGKILL) == 0) {
          tot->killed++;
          procs[idx].dead = 1;
          procs[idx].stopped = 0;
          if (np < MAX_PIDS) {
            procs[np].pid = spawn_worker(&t, np, rng ^ (uint64_t)np);
            procs[np].stopped = procs[np].dead = 0;
            np++;
          }
        }
      } else if (!procs[idx].stopped) {
        /* SIGSTOP for up to twice the lease, then SIGCONT. */
        if (kill(target, SIGSTOP) == 0) {
          tot->stopped++;
          procs[idx].stopped = 1;
          procs[idx].resume_at = now + LEASE_MS / 2 + pick(&rng, 2 * LEASE_MS);
        }
      }
      next_fault = now + 15 + pick(&rng, 50);
    }
    sleep_ms(3);
  }
  /* The end: resume everyone, let the workers finish their calls. */
  for (int i = 0; i < np; i++)
    if (procs[i].stopped) {
      kill(procs[i].pid, SIGCONT);
      procs[i].stopped = 0;
    }
  int64_t grace = mono_ms() + 10000;
  for (int i = 0; i < np; i++) {
    int st = 0;
    pid_t got;
    while ((got = waitpid(procs[i].pid, &st, WNOHANG)) == 0) {
      if (mono_ms() > grace && !procs[i].dead) {
        kill(procs[i].pid, SIGKILL);
        procs[i].dead = 1;
        tot->killed++;
      }
      sleep_ms(5);
    }
    /* A worker that was not killed must end by itself, cleanly: a crash
     * (or a sanitizer's report, which aborts) is a failure. */
    if (got == procs[i].pid && !procs[i].dead &&
        !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
      bad |= violation(tot, "worker %d ended with %s %d", (int)procs[i].pid,
                       WIFEXITED(st) ? "status" : "signal",
                       WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  }
  if (restart_pid > 0) {
    int st;
    waitpid(restart_pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
      die("the PostgreSQL restart command failed");
  }
  /* The clock set right again; leases of dead holders end, then the
   * recovery pass, then the check. */
  clockshift_set(0);
  idem_store *store = NULL;
  int rc = IDEM_EUNAVAILABLE;
  for (int i = 0; i < 300 && rc != IDEM_OK; i++) {
    rc = idem_store_open(cfg->store, NULL, &store);
    if (rc != IDEM_OK)
      sleep_ms(50);
  }
  if (rc != IDEM_OK)
    die("cannot open the store to check: %s", idem_errmsg());
  if (is_run) {
    /* The retrying caller of every key: a run that reruns what an earlier
     * run left unknown. */
    int hist = open_append(t.hist_path);
    for (int k = 0; k < RUN_KEYS; k++) {
      char key[8];
      /* In flight (exit 75) until the lease of a stopped run ends. */
      for (int i = 0;
           i < 100 && run_once(&t, hist, &rng, key_name(k, key), 1) == 75; i++)
        sleep_ms(LEASE_MS / 4);
    }
    close(hist);
  } else {
    recover_keys(&t, store, tot);
  }
  bad |= is_run ? check_run(&t, store, tot) : check_lib(&t, store, tot);
  idem_store_close(store);
  tot->trials++;
  if (bad) {
    printf("trial %ld (tenant %s): history %s, effects %s\n", n, t.tenant,
           t.hist_path, t.eff_path);
  } else {
    unlink(t.hist_path);
    unlink(t.eff_path);
  }
  return bad;
}

static void usage(void) {
  fputs("usage: chaos lib|run --store URL --trials N [--seed S] [--dir DIR]\n"
        "             [--idem PATH] [--pg-restart CMD] [--restart-every K]\n",
        stderr);
  exit(2);
}

int main(int argc, char **argv) {
  config cfg;
  totals tot;
  memset(&cfg, 0, sizeof cfg);
  memset(&tot, 0, sizeof tot);
  cfg.trials = 10;
  cfg.seed = (uint64_t)time(NULL);
  cfg.dir = ".";
  cfg.restart_every = 10;
  if (argc < 2 || (strcmp(argv[1], "lib") && strcmp(argv[1], "run")))
    usage();
  cfg.mode = argv[1];
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--verbose")) {
      verbose = 1;
      continue;
    }
    if (!strcmp(a, "--sabotage")) {
      sabotage = 1;
      continue;
    }
    if (i + 1 >= argc)
      usage();
    const char *v = argv[++i];
    if (!strcmp(a, "--store"))
      cfg.store = v;
    else if (!strcmp(a, "--trials"))
      cfg.trials = atol(v);
    else if (!strcmp(a, "--seed"))
      cfg.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--dir"))
      cfg.dir = v;
    else if (!strcmp(a, "--idem"))
      cfg.idem = v;
    else if (!strcmp(a, "--pg-restart"))
      cfg.pg_restart = v;
    else if (!strcmp(a, "--restart-every"))
      cfg.restart_every = atoi(v);
    else
      usage();
  }
  if (!cfg.store || cfg.trials <= 0 || (!strcmp(cfg.mode, "run") && !cfg.idem))
    usage();
  cfg.pg = is_pg(cfg.store);
  signal(SIGPIPE, SIG_IGN);
  {
    /* The workers' wall clock, stepped by the controller (clockshift.c). */
    static char shift[4096];
    int64_t zero = 0;
    int fd;
    snprintf(shift, sizeof shift, "%s/clockshift", cfg.dir);
    fd = open(shift, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, &zero, sizeof zero) != (ssize_t)sizeof zero)
      die("cannot make the clock shift file %s: %s", shift, strerror(errno));
    close(fd);
    setenv("IDEM_CLOCK_SHIFT_FILE", shift, 1);
  }
  /* The store exists, with its schema, before the first trial. */
  {
    idem_store *s = NULL;
    if (idem_store_open(cfg.store, NULL, &s) != IDEM_OK)
      die("cannot open the store: %s", idem_errmsg());
    idem_store_close(s);
  }
  if (!strcmp(cfg.mode, "lib"))
    setup_local_table(&cfg);
  else {
    /* The run workers' handlers, set before they are forked so that a
     * signal sent right after the fork finds them. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr; /* no SA_RESTART: select() returns EINTR */
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
  }
  int64_t t0 = mono_ms();
  for (long n = 0; n < cfg.trials; n++) {
    trial(&cfg, n, &tot);
    if (verbose && (n + 1) % 50 == 0)
      fprintf(stderr, "chaos: %ld trials, %ld violations\n", n + 1,
              tot.violations);
  }
  PQfinish(admin);
  printf("chaos %s %s: %ld trials in %.1fs (seed %lu), %ld calls: "
         "proceed %ld, recover %ld, replay %ld, conflict %ld, in_flight %ld, "
         "unknown %ld, errors %ld; stale completions %ld; effects %ld "
         "(local rows %ld); recovered at the end %ld; faults: SIGKILL %ld, "
         "SIGSTOP/SIGCONT %ld, clock steps %ld, server restarts %ld, "
         "connection cuts %ld; violations %ld\n",
         cfg.mode, cfg.pg ? "postgresql" : "sqlite", tot.trials,
         (double)(mono_ms() - t0) / 1000, (unsigned long)cfg.seed, tot.calls,
         tot.outcome[IDEM_PROCEED], tot.outcome[IDEM_RECOVER],
         tot.outcome[IDEM_REPLAY], tot.outcome[IDEM_CONFLICT],
         tot.outcome[IDEM_IN_FLIGHT], tot.outcome[IDEM_UNKNOWN], tot.errors,
         tot.stale, tot.effects, tot.local_rows, tot.recovered_at_end,
         tot.killed, tot.stopped, tot.steps, tot.restarts, tot.cuts,
         tot.violations);
  return tot.violations ? 1 : 0;
}
