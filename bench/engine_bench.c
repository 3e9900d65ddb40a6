/*
 * engine_bench.c -- the engine's own figures (docs/bench.md, "The engine"),
 * each side by side in one process:
 *
 *  (a) idem_execute() with an action that returns DONE at once against
 *      idem_claim() + idem_complete() of the same request: calls per second
 *      on fresh keys, 1 and 16 worker threads, in alternating runs; both
 *      sides canonicalise and fingerprint the request on every call, store
 *      the canonical request with the claim and the same response with the
 *      completion, so what differs is idem_execute()'s own machinery
 *      (the lease on the store's scheduler, ending the record through it).
 *  (b) 10,000 idem_execute() calls in flight at once, each in a thread of
 *      its own with a 64 KiB stack, whose actions hold their keys for 5 s
 *      with leases of 1500 ms (so each lease is renewed several times): the
 *      library's threads at the peak (the process's threads less the
 *      callers, known by their thread ids, and the main thread), whether
 *      every call kept its lease (the loss descriptor never turned
 *      readable, idem_exec_lost() never true) and ended IDEM_OK, PROCEED,
 *      its record completed, and how long the whole took. The calls arrive
 *      all at once (threads started as fast as they can be), or paced (a
 *      new one only while fewer than 256 claims are unanswered), the two
 *      alternating from round to round.
 *  (c) how soon a caller waiting on a key in flight (wait_ms) hears of the
 *      holder's completion: waiter in the same process on the same store
 *      handle, on a handle of its own, and in another process (fork()ed
 *      before any store is opened) with a handle of its own.
 *
 * SQLite stores are made in a temporary folder (TMPDIR); with
 * IDEM_BENCH_PG_URL set, every part runs on that PostgreSQL server too, in
 * a schema of its own (idem_schema=engine_bench_<pid>, left there: point
 * it at a throwaway server, as bench/engine.sh does).
 *
 * Missed targets are reported, never a failure: the exit status is non-zero
 * only when a call itself failed or answered an unexpected outcome.
 */
#include <idem.h>

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TENANT "bench"
#define REQ                                                                    \
  "{\"title\":\"Queue backlog\",\"priority\":\"normal\","                      \
  "\"tags\":[\"ops\",\"queue\"],\"size\":3}"
#define BODY "{\"ok\":true}"

/* ---- settings and small helpers ------------------------------------------ */

static int rounds = 5;          /* (a) */
static double seconds = 2.0;    /* (a): per run */
static int crowd_calls = 10000; /* (b) */
static int crowd_rounds = 5;    /* (b): per arrival mode */
static int64_t hold_ms = 5000;  /* (b) */
static int64_t lease_ms = 1500; /* (b) */
static int samples = 25;        /* (c) */
static int pace = 256; /* (b), paced: the most claims asked, not answered */
static const char *parts = "abc";
static const char *stores = "sqlite,postgresql";
static int failed; /* a call failed or answered an unexpected outcome */
static char tmp_root[512];
static unsigned serial; /* makes every run's keys and store names unique */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ns(int64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("engine_bench: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* A call that went wrong: said once per part, counted always. */
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static int reported;

static void report(const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&report_mu);
  failed = 1;
  if (reported++ < 5) {
    va_start(ap, fmt);
    fputs("engine_bench: FAILED: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
  pthread_mutex_unlock(&report_mu);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of v[0..n), by the nearest rank; v is sorted. */
static double quantile(double *v, int n, double q) {
  int i;
  if (n == 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  i = (int)(q * n + 0.999999) - 1;
  return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static double median(const double *v, int n) {
  double *c = malloc((size_t)(n ? n : 1) * sizeof *c), m;
  if (!c)
    die("out of memory");
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_double);
  m = n == 0 ? 0 : n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
  free(c);
  return m;
}

static const char *errmsg(int rc) {
  const char *m = idem_errmsg();
  return m[0] ? m : idem_strerror(rc);
}

/* ---- stores -------------------------------------------------------------- */

typedef struct backend {
  const char *name; /* "sqlite", "postgresql" */
  char pg_url[1024];
} backend;

/* The URL of a new store: SQLite, a file in a folder of its own; PostgreSQL,
 * the bench's schema (keys never repeat across runs). */
static void store_url(const backend *b, char *out, size_t size) {
  if (b->pg_url[0]) {
    snprintf(out, size, "%s", b->pg_url);
    return;
  }
  char dir[600];
  snprintf(dir, sizeof dir, "%s/s%u", tmp_root, ++serial);
  if (mkdir(dir, 0700) != 0)
    die("mkdir %s: %s", dir, strerror(errno));
  if ((size_t)snprintf(out, size, "sqlite:%s/store.db", dir) >= size)
    die("TMPDIR is too long");
}

static idem_store *open_store(const char *url) {
  idem_store *s = NULL;
  int rc = idem_store_open(url, NULL, &s);
  if (rc != IDEM_OK)
    die("cannot open %s: %s (%s)", url, errmsg(rc), idem_rc_name(rc));
  return s;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void cleanup(void) {
  if (tmp_root[0])
    nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int count_tasks(void) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int n = 0;
  if (!d)
    return -1;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

/* ---- (a) idem_execute() against claim + complete ------------------------- */

enum { MODE_EXECUTE, MODE_CLAIM_COMPLETE };

typedef struct arun {
  idem_store *store;
  int mode, workers;
  unsigned id;
  pthread_barrier_t ready, go;
  int64_t until;
} arun;

typedef struct aworker {
  arun *r;
  int index;
  long calls;
  pthread_t thread;
} aworker;

static idem_exec_result done_at_once(idem_exec *x, void *ctx,
                                     idem_response *resp) {
  (void)x;
  (void)ctx;
  resp->status = 200;
  resp->body = BODY;
  resp->body_len = sizeof BODY - 1;
  return IDEM_EXEC_DONE;
}

/* One call on a fresh key; 0, or -1 reported. */
static int one_call(arun *r, const char *key) {
  idem_id id = {TENANT, "ticket.create", key};
  idem_call *call = NULL;
  int rc;
  if (r->mode == MODE_EXECUTE) {
    rc = idem_execute(r->store, &id, REQ, sizeof REQ - 1, done_at_once, NULL,
                      NULL, &call);
    if (rc != IDEM_OK || idem_call_outcome(call) != IDEM_PROCEED) {
      report("execute %s: %s, outcome %s", key, idem_rc_name(rc),
             call ? idem_outcome_name(idem_call_outcome(call)) : "-");
      idem_call_free(call);
      return -1;
    }
  } else {
    /* What idem_execute() does around the action, as a caller of the
     * two calls would write it. */
    char fp[IDEM_FINGERPRINT_SIZE], *canon = NULL;
    size_t len = 0;
    idem_call_options o;
    idem_response resp = {200, NULL, 0, BODY, sizeof BODY - 1};
    rc = idem_canonicalize(REQ, sizeof REQ - 1, NULL, &canon, &len, NULL);
    if (rc == IDEM_OK)
      rc = idem_sha256_hex(canon, len, fp);
    memset(&o, 0, sizeof o);
    o.request = canon;
    o.request_len = len;
    if (rc == IDEM_OK)
      rc = idem_claim(r->store, &id, fp, &o, &call);
    if (rc != IDEM_OK || idem_call_outcome(call) != IDEM_PROCEED) {
      report("claim %s: %s (%s), outcome %s", key, idem_rc_name(rc), errmsg(rc),
             call ? idem_outcome_name(idem_call_outcome(call)) : "-");
      idem_call_free(call);
      idem_free(canon);
      return -1;
    }
    rc = idem_complete(r->store, call, &resp);
    idem_free(canon);
    if (rc != IDEM_OK) {
      report("complete %s: %s (%s)", key, idem_rc_name(rc), errmsg(rc));
      idem_call_free(call);
      return -1;
    }
  }
  idem_call_free(call);
  return 0;
}

static void *aworker_main(void *arg) {
  aworker *w = arg;
  arun *r = w->r;
  char key[96];
  long n = 0;
  int ok = 1;
  /* A few calls first, not counted: the store's threads start, its
   * statements are prepared. */
  for (int i = 0; i < 3 && ok; i++) {
    snprintf(key, sizeof key, "a%u-%d-warm%d", r->id, w->index, i);
    ok = one_call(r, key) == 0;
  }
  pthread_barrier_wait(&r->ready);
  pthread_barrier_wait(&r->go);
  while (ok && now_ns() < r->until) {
    snprintf(key, sizeof key, "a%u-%d-%ld", r->id, w->index, n);
    if (one_call(r, key) != 0)
      break;
    if (now_ns() <= r->until)
      n++;
  }
  w->calls = n;
  return NULL;
}

/* One timed run; calls per second. */
static double arun_once(const backend *b, int mode, int workers) {
  char url[1200];
  arun r;
  aworker ws[64];
  int64_t t0;
  long calls = 0;
  memset(&r, 0, sizeof r);
  store_url(b, url, sizeof url);
  r.store = open_store(url);
  r.mode = mode;
  r.workers = workers;
  r.id = ++serial;
  pthread_barrier_init(&r.ready, NULL, (unsigned)workers + 1);
  pthread_barrier_init(&r.go, NULL, (unsigned)workers + 1);
  for (int i = 0; i < workers; i++) {
    ws[i] = (aworker){&r, i, 0, 0};
    if (pthread_create(&ws[i].thread, NULL, aworker_main, &ws[i]) != 0)
      die("pthread_create: %s", strerror(errno));
  }
  pthread_barrier_wait(&r.ready);
  t0 = now_ns();
  r.until = t0 + (int64_t)(seconds * 1e9);
  pthread_barrier_wait(&r.go);
  for (int i = 0; i < workers; i++) {
    pthread_join(ws[i].thread, NULL);
    calls += ws[i].calls;
  }
  pthread_barrier_destroy(&r.ready);
  pthread_barrier_destroy(&r.go);
  idem_store_close(r.store);
  return calls / ((double)(r.until - t0) / 1e9);
}

static void part_a(const backend *b) {
  static const int counts[] = {1, 16};
  double rate[2][2][64], ratio[2][64];
  int n = rounds > 64 ? 64 : rounds;
  printf("\n(a) %s: idem_execute() (action returns DONE at once) against "
         "idem_claim() + idem_complete(),\n    calls/s on fresh keys, %d "
         "rounds of %.1f s per run, the two sides alternating\n",
         b->name, n, seconds);
  printf("    %-8s %5s %12s %16s %8s\n", "workers", "round", "execute",
         "claim+complete", "ratio");
  fflush(stdout);
  for (int r = 0; r < n; r++)
    for (int c = 0; c < 2; c++) {
      /* Which side runs first alternates from run to run. */
      int first = (r + c) % 2;
      for (int k = 0; k < 2; k++) {
        int mode = k == 0 ? first : !first;
        rate[c][mode][r] = arun_once(b, mode, counts[c]);
      }
      ratio[c][r] =
          rate[c][MODE_CLAIM_COMPLETE][r] > 0
              ? rate[c][MODE_EXECUTE][r] / rate[c][MODE_CLAIM_COMPLETE][r]
              : 0;
      printf("    %-8d %5d %12.0f %16.0f %8.3f\n", counts[c], r + 1,
             rate[c][MODE_EXECUTE][r], rate[c][MODE_CLAIM_COMPLETE][r],
             ratio[c][r]);
      fflush(stdout);
    }
  for (int c = 0; c < 2; c++) {
    double me = median(rate[c][MODE_EXECUTE], n),
           mc = median(rate[c][MODE_CLAIM_COMPLETE], n),
           mr = median(ratio[c], n);
    printf("    %-8d %5s %12.0f %16.0f %8.3f   execute / claim+complete: "
           "%.3f median of the rounds' ratios (%.3f of the medians); target "
           ">= 0.90: %s\n",
           counts[c], "median", me, mc, mr, mr, mc > 0 ? me / mc : 0,
           mr >= 0.9 ? "met" : "MISSED");
  }
  fflush(stdout);
}

/* ---- (b) many calls in flight -------------------------------------------- */

typedef struct crowd {
  idem_store *store;
  char operation[64];
  int n;
  int registered, holding, finished, lost; /* __atomic */
  int64_t all_holding_ns;                  /* __atomic */
  unsigned char *mine;                     /* a bit per tid: a caller's */
  long tid_max;
} crowd;

typedef struct member {
  crowd *cr;
  int i, rc, outcome, body_ok, lost, lost_at_start;
  int64_t called_ns, started_ns;
  char body[32];
} member;

static idem_exec_result hold_key(idem_exec *x, void *ctx, idem_response *resp) {
  member *m = ctx;
  crowd *cr = m->cr;
  int64_t until = now_ns() + hold_ms * 1000000;
  int fd;
  m->started_ns = now_ns();
  m->lost_at_start = idem_exec_lost(x);
  if (__atomic_add_fetch(&cr->holding, 1, __ATOMIC_SEQ_CST) == cr->n)
    __atomic_store_n(&cr->all_holding_ns, now_ns(), __ATOMIC_SEQ_CST);
  /* Wait on the loss descriptor: it turns readable the moment the lease
   * is lost, so nothing wakes while all is well. */
  fd = idem_exec_lost_fd(x);
  for (int64_t left; (left = until - now_ns()) > 0;) {
    if (fd < 0) {
      sleep_ns(left);
      continue;
    }
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, (int)((left + 999999) / 1000000));
    if (r == 1) {
      m->lost = 1; /* an action stops acting then */
      break;
    }
  }
  if (idem_exec_lost(x))
    m->lost = 1;
  if (m->lost)
    __atomic_add_fetch(&cr->lost, 1, __ATOMIC_SEQ_CST);
  snprintf(m->body, sizeof m->body, "{\"n\":%d}", m->i);
  resp->status = 201;
  resp->body = m->body;
  resp->body_len = strlen(m->body);
  return IDEM_EXEC_DONE;
}

static void *member_main(void *arg) {
  member *m = arg;
  crowd *cr = m->cr;
  long tid = (long)syscall(SYS_gettid);
  char key[32];
  idem_id id = {TENANT, cr->operation, key};
  idem_execute_options o;
  idem_call *call = NULL;
  if (tid >= 0 && tid <= cr->tid_max)
    __atomic_or_fetch(&cr->mine[tid / 8], (unsigned char)(1u << (tid % 8)),
                      __ATOMIC_SEQ_CST);
  __atomic_add_fetch(&cr->registered, 1, __ATOMIC_SEQ_CST);
  snprintf(key, sizeof key, "k%d", m->i);
  memset(&o, 0, sizeof o);
  o.call.lease_ms = lease_ms;
  m->called_ns = now_ns();
  m->rc =
      idem_execute(cr->store, &id, REQ, sizeof REQ - 1, hold_key, m, &o, &call);
  m->outcome = call ? (int)idem_call_outcome(call) : -1;
  if (m->rc == IDEM_OK && call) {
    const idem_response *r = idem_call_response(call);
    m->body_ok = r && r->body_len == strlen(m->body) &&
                 memcmp(r->body, m->body, r->body_len) == 0;
  }
  idem_call_free(call);
  __atomic_add_fetch(&cr->finished, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* Threads of the process that are neither callers nor the main thread: the
 * library's. -1 when /proc cannot be read. */
static int library_threads(crowd *cr, pid_t main_tid) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int n = 0;
  if (!d)
    return -1;
  while ((e = readdir(d))) {
    long tid;
    if (e->d_name[0] == '.')
      continue;
    tid = atol(e->d_name);
    if (tid == main_tid)
      continue;
    if (tid >= 0 && tid <= cr->tid_max &&
        (__atomic_load_n(&cr->mine[tid / 8], __ATOMIC_SEQ_CST) >> (tid % 8)) &
            1u)
      continue;
    n++;
  }
  closedir(d);
  return n;
}

static int count_completed(const idem_record *r, void *ctx) {
  if (r->state == IDEM_STATE_COMPLETED)
    (*(int *)ctx)++;
  return 0;
}

/* Raises a soft limit to at least want (up to the hard one); says so. */
static void raise_limit(int resource, const char *name, rlim_t want) {
  struct rlimit l;
  if (getrlimit(resource, &l) != 0 || l.rlim_cur == RLIM_INFINITY ||
      l.rlim_cur >= want)
    return;
  rlim_t was = l.rlim_cur;
  l.rlim_cur =
      l.rlim_max == RLIM_INFINITY || l.rlim_max >= want ? want : l.rlim_max;
  if (setrlimit(resource, &l) == 0)
    printf("    %s raised from %llu to %llu\n", name, (unsigned long long)was,
           (unsigned long long)l.rlim_cur);
  else
    printf("    %s is %llu and could not be raised: %s\n", name,
           (unsigned long long)was, strerror(errno));
}

static long read_long(const char *path) {
  FILE *f = fopen(path, "r");
  long v = -1;
  if (f) {
    if (fscanf(f, "%ld", &v) != 1)
      v = -1;
    fclose(f);
  }
  return v;
}

typedef struct crowd_result {
  int peak, after_close, lost, bad, completed, started;
  double total_ms, all_holding_ms;
  /* From idem_execute() to its action's start (the claim), ms. */
  double claim_p50, claim_p90, claim_max;
  int lost_at_start; /* lost before the action started */
} crowd_result;

static crowd_result crowd_once(const backend *b, int max_pending) {
  crowd cr;
  crowd_result res;
  char url[1200];
  pthread_t *ts;
  member *ms;
  pthread_attr_t attr;
  pid_t main_tid = (pid_t)syscall(SYS_gettid);
  int64_t t0, t_end;
  idem_filter f;

  memset(&cr, 0, sizeof cr);
  memset(&res, 0, sizeof res);
  cr.n = crowd_calls;
  cr.tid_max = read_long("/proc/sys/kernel/pid_max");
  if (cr.tid_max < 0)
    cr.tid_max = 4194304;
  cr.mine = calloc((size_t)cr.tid_max / 8 + 1, 1);
  ts = calloc((size_t)cr.n, sizeof *ts);
  ms = calloc((size_t)cr.n, sizeof *ms);
  if (!cr.mine || !ts || !ms)
    die("out of memory");
  snprintf(cr.operation, sizeof cr.operation, "crowd-%d-%u", (int)getpid(),
           ++serial);
  store_url(b, url, sizeof url);
  cr.store = open_store(url);
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);

  t0 = now_ns();
  for (int i = 0; i < cr.n; i++) {
    ms[i].cr = &cr;
    ms[i].i = i;
    ms[i].rc = -1;
    int rc = pthread_create(&ts[i], &attr, member_main, &ms[i]);
    if (rc != 0) {
      report("pthread_create for call %d: %s (started %d)", i, strerror(rc), i);
      cr.n = i; /* those started still run; hold_key counts to cr.n */
      break;
    }
    res.started = i + 1;
    /* Paced arrivals: no more than max_pending claims unanswered. */
    while (max_pending > 0 &&
           res.started - __atomic_load_n(&cr.holding, __ATOMIC_SEQ_CST) -
                   __atomic_load_n(&cr.finished, __ATOMIC_SEQ_CST) >=
               max_pending)
      sleep_ns(200000);
    /* Now and then, once every thread made so far has said who it is,
     * count the others: the library's threads while calls arrive. */
    if ((i + 1) % 500 == 0) {
      while (__atomic_load_n(&cr.registered, __ATOMIC_SEQ_CST) < i + 1)
        sleep_ns(200000);
      int lib = library_threads(&cr, main_tid);
      if (lib > res.peak)
        res.peak = lib;
    }
  }
  while (__atomic_load_n(&cr.registered, __ATOMIC_SEQ_CST) < res.started)
    sleep_ns(200000);
  /* Every call's thread is known: sample until they all returned. */
  while (__atomic_load_n(&cr.finished, __ATOMIC_SEQ_CST) < res.started) {
    int lib = library_threads(&cr, main_tid);
    if (lib > res.peak)
      res.peak = lib;
    sleep_ns(50000000);
  }
  for (int i = 0; i < res.started; i++)
    pthread_join(ts[i], NULL);
  t_end = now_ns();
  pthread_attr_destroy(&attr);

  for (int i = 0; i < res.started; i++)
    if (ms[i].rc != IDEM_OK || ms[i].outcome != IDEM_PROCEED ||
        !ms[i].body_ok) {
      if (res.bad++ == 0)
        report("crowd call %d: %s, outcome %s, response %s", i,
               idem_rc_name(ms[i].rc),
               ms[i].outcome >= 0 ? idem_outcome_name(ms[i].outcome) : "-",
               ms[i].body_ok ? "right" : "wrong or missing");
    }
  {
    double *cl = calloc((size_t)res.started + 1, sizeof *cl);
    int ncl = 0;
    if (!cl)
      die("out of memory");
    for (int i = 0; i < res.started; i++) {
      if (ms[i].started_ns)
        cl[ncl++] = (double)(ms[i].started_ns - ms[i].called_ns) / 1e6;
      if (ms[i].lost_at_start)
        res.lost_at_start++;
    }
    res.claim_p50 = median(cl, ncl);
    res.claim_p90 = quantile(cl, ncl, 0.9);
    res.claim_max = ncl ? cl[ncl - 1] : 0;
    free(cl);
  }
  memset(&f, 0, sizeof f);
  f.tenant = TENANT;
  f.operation = cr.operation;
  f.state = IDEM_STATE_COMPLETED;
  int rc = idem_list(cr.store, &f, count_completed, &res.completed);
  if (rc != IDEM_OK)
    report("idem_list: %s (%s)", idem_rc_name(rc), errmsg(rc));
  idem_store_close(cr.store);
  res.after_close = count_tasks() - 1;
  res.lost = __atomic_load_n(&cr.lost, __ATOMIC_SEQ_CST);
  res.total_ms = (double)(t_end - t0) / 1e6;
  int64_t ah = __atomic_load_n(&cr.all_holding_ns, __ATOMIC_SEQ_CST);
  res.all_holding_ms = ah ? (double)(ah - t0) / 1e6 : -1;
  free(cr.mine);
  free(ts);
  free(ms);
  return res;
}

static void part_b(const backend *b) {
  long pid_max = read_long("/proc/sys/kernel/pid_max"),
       threads_max = read_long("/proc/sys/kernel/threads-max");
  int modes = pace > 0 ? 2 : 1, n = crowd_rounds;
  double *total = calloc((size_t)(2 * n), sizeof *total);
  int peak[2] = {0, 0}, lost[2] = {0, 0}, met[2] = {0, 0};
  if (!total)
    die("out of memory");
  printf("\n(b) %s: %d idem_execute() calls in flight at once, one thread "
         "each (64 KiB stacks),\n    actions holding their keys %lld ms "
         "with leases of %lld ms (renewed every third of it);\n    the calls "
         "arrive all at once, or paced (at most %d claims unanswered), "
         "alternately\n",
         b->name, crowd_calls, (long long)hold_ms, (long long)lease_ms, pace);
  raise_limit(RLIMIT_NPROC, "RLIMIT_NPROC", (rlim_t)crowd_calls + 512);
  raise_limit(RLIMIT_NOFILE, "RLIMIT_NOFILE", (rlim_t)crowd_calls + 1024);
  if (pid_max > 0 && pid_max < crowd_calls + 1000)
    printf("    note: kernel.pid_max is %ld, close to the threads asked for\n",
           pid_max);
  if (threads_max > 0 && threads_max < crowd_calls + 1000)
    printf("    note: kernel.threads-max is %ld\n", threads_max);
  printf("    %-8s %5s %8s %6s %13s %5s %9s %15s %8s %7s %7s\n", "arrivals",
         "round", "library", "after", "leases lost", "bad", "completed",
         "claims ms", "all held", "whole", "target");
  printf("    %-8s %5s %8s %6s %13s %5s %9s %15s %8s %7s\n", "", "", "threads",
         "close", "(at start)", "calls", "records", "p50/p90/max", "after ms",
         "ms");
  fflush(stdout);
  for (int r = 0; r < n; r++)
    for (int k = 0; k < modes; k++) {
      /* Which arrival runs first alternates from round to round. */
      int m = modes == 2 ? (r + k) % 2 : 0;
      crowd_result c = crowd_once(b, m == 0 ? 0 : pace);
      int ok = c.peak <= 10 && c.lost == 0 && c.bad == 0 &&
               c.completed == crowd_calls && c.started == crowd_calls;
      char lost_s[32], claims_s[48];
      total[m * n + r] = c.total_ms;
      if (c.peak > peak[m])
        peak[m] = c.peak;
      lost[m] += c.lost;
      met[m] += ok;
      snprintf(lost_s, sizeof lost_s, "%d (%d)", c.lost, c.lost_at_start);
      snprintf(claims_s, sizeof claims_s, "%.0f/%.0f/%.0f", c.claim_p50,
               c.claim_p90, c.claim_max);
      printf("    %-8s %5d %8d %6d %13s %5d %9d %15s %8.0f %7.0f %7s\n",
             m == 0 ? "at once" : "paced", r + 1, c.peak, c.after_close, lost_s,
             c.bad + (crowd_calls - c.started), c.completed, claims_s,
             c.all_holding_ms, c.total_ms, ok ? "met" : "MISSED");
      fflush(stdout);
    }
  for (int m = 0; m < modes; m++)
    printf("    %-8s %d of %d rounds met the target (<= 10 library threads, "
           "no lease lost, every call PROCEED and completed); worst peak %d "
           "library threads; %d leases lost in all; median whole %.0f ms\n",
           m == 0 ? "at once:" : "paced:", met[m], n, peak[m], lost[m],
           median(total + m * n, n));
  free(total);
  fflush(stdout);
}

/* ---- (c) waiting on a key in flight -------------------------------------- */

/* The waiter's side: one sample per index read from cmd. */
typedef struct wanswer {
  int rc, outcome;
  int64_t asked_ns, answered_ns;
} wanswer;

static void waiter_loop(idem_store *s, const char *operation, int cmd,
                        int ans) {
  int i;
  char fp[IDEM_FINGERPRINT_SIZE];
  if (idem_fingerprint(REQ, sizeof REQ - 1, 1, fp) != IDEM_OK)
    return;
  while (read(cmd, &i, sizeof i) == (ssize_t)sizeof i) {
    char key[32];
    idem_id id = {TENANT, operation, key};
    idem_call_options o;
    idem_call *call = NULL;
    wanswer a;
    snprintf(key, sizeof key, "w%d", i);
    memset(&o, 0, sizeof o);
    o.wait_ms = 10000;
    a.asked_ns = now_ns();
    a.rc = idem_claim(s, &id, fp, &o, &call);
    a.answered_ns = now_ns();
    a.outcome = call ? (int)idem_call_outcome(call) : -1;
    idem_call_free(call);
    if (write(ans, &a, sizeof a) != (ssize_t)sizeof a)
      return;
  }
}

enum { W_SAME_HANDLE, W_OWN_HANDLE, W_PROCESS };
static const char *const wait_case_names[] = {
    "same process, same store handle", "same process, its own handle",
    "another process, its own handle"};

typedef struct wthread {
  idem_store *store; /* NULL: open url */
  const char *url, *operation;
  int cmd, ans;
} wthread;

static void *wthread_main(void *arg) {
  wthread *w = arg;
  idem_store *s = w->store ? w->store : open_store(w->url);
  waiter_loop(s, w->operation, w->cmd, w->ans);
  if (!w->store)
    idem_store_close(s);
  return NULL;
}

static void wait_case(const backend *b, int kind) {
  char url[1200], operation[64];
  int cmd[2], ans[2];
  pid_t child = -1;
  pthread_t t;
  wthread w;
  idem_store *s;
  double *lat = calloc((size_t)samples, sizeof *lat);
  double *end = calloc((size_t)samples, sizeof *end);
  int n = 0;
  unsigned rnd = 12345u + (unsigned)kind;
  char fp[IDEM_FINGERPRINT_SIZE];

  if (!lat || !end)
    die("out of memory");
  store_url(b, url, sizeof url);
  snprintf(operation, sizeof operation, "wait-%d-%u", (int)getpid(), ++serial);
  if (pipe(cmd) != 0 || pipe(ans) != 0)
    die("pipe: %s", strerror(errno));
  if (kind == W_PROCESS) {
    /* Before this process opens anything: the child starts clean. */
    fflush(stdout);
    child = fork();
    if (child < 0)
      die("fork: %s", strerror(errno));
    if (child == 0) {
      idem_store *cs;
      close(cmd[1]);
      close(ans[0]);
      cs = open_store(url);
      waiter_loop(cs, operation, cmd[0], ans[1]);
      idem_store_close(cs);
      _exit(0);
    }
    close(cmd[0]);
    close(ans[1]);
  }
  s = open_store(url);
  if (kind != W_PROCESS) {
    w = (wthread){kind == W_SAME_HANDLE ? s : NULL, url, operation, cmd[0],
                  ans[1]};
    if (pthread_create(&t, NULL, wthread_main, &w) != 0)
      die("pthread_create: %s", strerror(errno));
  }
  if (idem_fingerprint(REQ, sizeof REQ - 1, 1, fp) != IDEM_OK)
    die("fingerprint");
  for (int i = 0; i < samples; i++) {
    char key[32];
    idem_id id = {TENANT, operation, key};
    idem_call *call = NULL;
    idem_response resp = {201, NULL, 0, BODY, sizeof BODY - 1};
    wanswer a;
    int64_t t_complete, t_done;
    int rc;
    snprintf(key, sizeof key, "w%d", i);
    rc = idem_claim(s, &id, fp, NULL, &call);
    if (rc != IDEM_OK || idem_call_outcome(call) != IDEM_PROCEED) {
      report("wait holder %s: claim %s", key, idem_rc_name(rc));
      idem_call_free(call);
      break;
    }
    if (write(cmd[1], &i, sizeof i) != (ssize_t)sizeof i)
      die("write: %s", strerror(errno));
    /* The waiter is well inside its wait by then, at a phase of its
     * polling that varies from sample to sample. */
    rnd = rnd * 1103515245u + 12345u;
    sleep_ns((int64_t)(150 + (rnd >> 16) % 150) * 1000000);
    t_complete = now_ns();
    rc = idem_complete(s, call, &resp);
    t_done = now_ns();
    idem_call_free(call);
    if (rc != IDEM_OK) {
      report("wait holder %s: complete %s (%s)", key, idem_rc_name(rc),
             errmsg(rc));
      break;
    }
    if (read(ans[0], &a, sizeof a) != (ssize_t)sizeof a) {
      report("wait %s: the waiter gave no answer", key);
      break;
    }
    if (a.rc != IDEM_OK || a.outcome != IDEM_REPLAY) {
      report("wait %s: the waiter's claim: %s, outcome %s", key,
             idem_rc_name(a.rc),
             a.outcome >= 0 ? idem_outcome_name(a.outcome) : "-");
      continue;
    }
    if (a.asked_ns >= t_complete) {
      report("wait %s: the waiter asked only after the completion", key);
      continue;
    }
    lat[n] = (double)(a.answered_ns - t_done) / 1e6;
    end[n] = (double)(t_done - t_complete) / 1e6;
    n++;
  }
  close(cmd[1]);
  if (kind == W_PROCESS) {
    int status;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      report("wait: the waiting process ended with status %d", status);
  } else {
    pthread_join(t, NULL);
    close(cmd[0]);
    close(ans[1]);
  }
  close(ans[0]);
  idem_store_close(s);
  {
    double med = median(lat, n), p90 = quantile(lat, n, 0.9),
           max = n ? lat[n - 1] : 0, mend = median(end, n);
    const char *target = "";
    if (kind == W_PROCESS && !b->pg_url[0])
      target = max <= 50 ? "max <= 50 ms: met" : "max <= 50 ms: MISSED";
    else if (kind == W_PROCESS)
      target = "-";
    else if (kind != W_PROCESS)
      target = med <= 1 ? "immediate (median <= 1 ms): met"
                        : "immediate (median <= 1 ms): MISSED";
    printf("    %-34s %3d %9.2f %9.2f %9.2f %10.2f   %s\n",
           wait_case_names[kind], n, med, p90, max, mend, target);
  }
  fflush(stdout);
  free(lat);
  free(end);
}

static void part_c(const backend *b) {
  printf("\n(c) %s: from the holder's idem_complete() returning to the "
         "waiter's claim (wait_ms) answering REPLAY,\n    ms, %d samples, the "
         "completion 150-300 ms after the waiter asked\n",
         b->name, samples);
  printf("    %-34s %3s %9s %9s %9s %10s\n", "waiter", "n", "median", "p90",
         "max", "complete");
  fflush(stdout);
  wait_case(b, W_SAME_HANDLE);
  wait_case(b, W_OWN_HANDLE);
  wait_case(b, W_PROCESS);
}

/* ---- main ---------------------------------------------------------------- */

static void usage(void) {
  fputs("usage: engine_bench [--parts abc] [--rounds N] [--seconds S]\n"
        "                    [--calls N] [--crowd-rounds N] [--pace N] "
        "[--hold-ms MS] [--lease-ms MS]\n"
        "                    [--samples N]\n"
        "  (a) --rounds (5) of --seconds (2) per run\n"
        "  (b) --calls (10000) in flight, --crowd-rounds (5) per arrival "
        "mode,\n"
        "      --pace (256; 0: only all at once), --hold-ms (5000), "
        "--lease-ms (1500)\n"
        "  (c) --samples (25) per case\n"
        "  --stores sqlite,postgresql: which stores (PostgreSQL only with "
        "IDEM_BENCH_PG_URL)\n"
        "  IDEM_BENCH_PG_URL: also run every part on this PostgreSQL server\n"
        "  TMPDIR: where the SQLite stores are made\n",
        stderr);
  exit(2);
}

static long arg_long(const char *v, long lo, long hi) {
  char *end;
  long n = strtol(v, &end, 10);
  if (*v == '\0' || *end || n < lo || n > hi)
    usage();
  return n;
}

int main(int argc, char **argv) {
  backend bs[2];
  int nb;
  const char *pg = getenv("IDEM_BENCH_PG_URL"), *tmp = getenv("TMPDIR");

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v)
      usage();
    if (!strcmp(a, "--rounds"))
      rounds = (int)arg_long(v, 1, 64);
    else if (!strcmp(a, "--seconds")) {
      char *end;
      seconds = strtod(v, &end);
      if (*end || seconds <= 0 || seconds > 3600)
        usage();
    } else if (!strcmp(a, "--calls"))
      crowd_calls = (int)arg_long(v, 1, 1000000);
    else if (!strcmp(a, "--crowd-rounds"))
      crowd_rounds = (int)arg_long(v, 1, 100);
    else if (!strcmp(a, "--hold-ms"))
      hold_ms = arg_long(v, 1, 3600000);
    else if (!strcmp(a, "--lease-ms"))
      lease_ms = arg_long(v, 1, 3600000);
    else if (!strcmp(a, "--pace"))
      pace = (int)arg_long(v, 0, 1000000);
    else if (!strcmp(a, "--samples"))
      samples = (int)arg_long(v, 1, 100000);
    else if (!strcmp(a, "--parts"))
      parts = v;
    else if (!strcmp(a, "--stores"))
      stores = v;
    else
      usage();
    i++;
  }
  signal(SIGPIPE, SIG_IGN);
  snprintf(tmp_root, sizeof tmp_root, "%s/idem-engine-bench.XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(tmp_root))
    die("mkdtemp %s: %s", tmp_root, strerror(errno));
  atexit(cleanup);
  memset(bs, 0, sizeof bs);
  nb = 0;
  if (strstr(stores, "sqlite"))
    bs[nb++].name = "sqlite";
  if (strstr(stores, "postgresql") && pg && pg[0]) {
    backend *p = &bs[nb++];
    p->name = "postgresql";
    if (strstr(pg, "idem_schema="))
      snprintf(p->pg_url, sizeof p->pg_url, "%s", pg);
    else if ((size_t)snprintf(p->pg_url, sizeof p->pg_url,
                              "%s%cidem_schema=engine_bench_%d", pg,
                              strchr(pg, '?') ? '&' : '?',
                              (int)getpid()) >= sizeof p->pg_url)
      die("IDEM_BENCH_PG_URL is too long");
  } else if (strstr(stores, "postgresql") && !strstr(stores, "sqlite")) {
    die("--stores postgresql needs IDEM_BENCH_PG_URL");
  }
  if (nb == 0)
    usage();
  printf("idem engine bench: stores:");
  for (int k = 0; k < nb; k++)
    printf(" %s", bs[k].pg_url[0] ? "PostgreSQL (IDEM_BENCH_PG_URL)"
                                  : "SQLite (in TMPDIR)");
  printf("; %ld cores, load average ", sysconf(_SC_NPROCESSORS_ONLN));
  {
    double la[3];
    if (getloadavg(la, 3) == 3)
      printf("%.2f %.2f %.2f\n", la[0], la[1], la[2]);
    else
      printf("unknown\n");
  }
  fflush(stdout);
  for (int k = 0; k < nb; k++) {
    if (strchr(parts, 'a'))
      part_a(&bs[k]);
    if (strchr(parts, 'b'))
      part_b(&bs[k]);
    if (strchr(parts, 'c'))
      part_c(&bs[k]);
  }
  {
    double la[3];
    if (getloadavg(la, 3) == 3)
      printf("\nload average at the end: %.2f %.2f %.2f\n", la[0], la[1],
             la[2]);
  }
  if (failed)
    fprintf(stderr,
            "engine_bench: %d calls failed or answered an "
            "unexpected outcome\n",
            reported);
  return failed ? 1 : 0;
}
