/*
 * test_holding.c -- holding keys while actions run, and waiting on them:
 * a lease is lost at its deadline even while a renewal hangs, asking for
 * the loss descriptor never waits for a renewal, the library's threads
 * block signals and end with the store, hundreds of calls in flight keep
 * their leases on a few threads, and a caller that finds a key in flight
 * can wait for the holder's result (same process, another process, a
 * holder that gives up, dies or runs past the wait). Every backend.
 */
#include "engine_harness.c"

#include "lease.h"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define REQ "{\"title\":\"Queue backlog\",\"priority\":\"normal\"}"

static int64_t mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void req_fp(char fp[IDEM_FINGERPRINT_SIZE]) {
  char *canon = NULL;
  size_t n = 0;
  assert_int_equal(idem_canonicalize(REQ, strlen(REQ), NULL, &canon, &n, NULL),
                   IDEM_OK);
  assert_int_equal(idem_fingerprint(REQ, strlen(REQ), 1, fp), IDEM_OK);
  idem_free(canon);
}

/* ------------------------------------------------------------------ */
/* The lease is lost at its deadline                                    */
/* ------------------------------------------------------------------ */

typedef struct hung {
  fixture *f;
  blocker b;
  int64_t released_at; /* the blocker lets go at this time at the earliest */
  int64_t lost_at;
  int fd_ready;     /* the descriptor, asked for once lost, was readable */
  int64_t fd_asked; /* when idem_exec_lost_fd() returned */
} hung;

/* Another connection takes the store's write lock as the action starts,
 * for four leases: the first renewal hangs behind it. */
static idem_exec_result hang_renewals(idem_exec *x, void *ctx,
                                      idem_response *r) {
  hung *h = ctx;
  struct pollfd p;
  (void)r;
  h->released_at = mono_now() + 2400;
  blocker_start(&h->b, h->f->url, 2400);
  while (!idem_exec_lost(x) && mono_now() < h->released_at + 5000)
    sleep_ms(5);
  h->lost_at = mono_now();
  p.fd = idem_exec_lost_fd(x);
  p.events = POLLIN;
  h->fd_asked = mono_now();
  h->fd_ready = poll(&p, 1, 0) == 1;
  blocker_join(&h->b);
  return IDEM_EXEC_UNKNOWN;
}

static void test_lost_at_deadline_while_renewal_hangs(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "hung-renewal"};
  idem_execute_options o = {.call = {.lease_ms = 600}};
  hung h = {.f = f};
  idem_record *rec;
  idem_call *c = NULL;
  int64_t started = mono_now();

  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                  hang_renewals, &h, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  idem_call_free(c);
  /* Lost at the claim's deadline (600 ms after it), long before the
   * renewal behind the lock could come back. */
  if (h.lost_at >= h.released_at)
    fail_msg("the lease was lost %lld ms after the call started, once the "
             "lock was gone (%lld ms); its deadline was 600 ms",
             (long long)(h.lost_at - started),
             (long long)(h.released_at - started));
  assert_true(h.lost_at - started >= 600);
  /* The descriptor, asked for while the renewal hung, came at once and
   * was readable. */
  assert_true(h.fd_asked < h.released_at);
  assert_int_equal(h.fd_ready, 1);
  /* The renewal came back afterwards, but lost stays lost; the ending
   * the action chose was written. */
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_UNKNOWN);
  idem_record_free(rec);
}

/* Ids with the characters a batched renewal must quote: leases renewed
 * all along, none taken for lost. The action holds its key until two
 * renewals were written (each moves the record's lease_expires_ms on),
 * so a loaded machine makes the test slower, never wrong: a renewal is due
 * every second and has two more before the 3 s lease ends. */
typedef struct outlive {
  idem_store *store;
  const idem_id *id;
  int renewed;
  int lost;
} outlive;

static idem_exec_result outlive_leases(idem_exec *x, void *ctx,
                                       idem_response *r) {
  outlive *o = ctx;
  int64_t last = -1;
  for (int waited = 0; o->renewed < 2 && waited < 60000; waited += 20) {
    idem_record *rec = NULL;
    if (idem_get(o->store, o->id, &rec) == IDEM_OK) {
      if (last >= 0 && rec->lease_expires_ms > last)
        o->renewed++;
      last = rec->lease_expires_ms;
      idem_record_free(rec);
    }
    sleep_ms(20);
  }
  o->lost = idem_exec_lost(x);
  r->status = 200;
  r->body = "kept";
  r->body_len = 4;
  return IDEM_EXEC_DONE;
}

static void test_renewals_of_odd_ids(void **state) {
  fixture *f = *state;
  idem_id ids[] = {{"", "POST /a, b", "k\\\"{},"},
                   {"t\"en{a}nt,\\", "op \"x\"", "NULL"}};
  idem_execute_options o = {.call = {.lease_ms = 3000}};
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    idem_call *c = NULL;
    outlive held = {f->store, &ids[i], 0, -1};
    EXPECT_RC(IDEM_OK, idem_execute(f->store, &ids[i], REQ, strlen(REQ),
                                    outlive_leases, &held, &o, &c));
    assert_int_equal(held.renewed, 2);
    assert_int_equal(held.lost, 0);
    assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
    idem_call_free(c);
    idem_record *rec = get_record(f->store, &ids[i]);
    assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
    idem_record_free(rec);
  }
}

/* How far the clock that writes the store's leases may be ahead of our
 * monotonic clock: on SQLite, the boot-time clock, ahead by the time the
 * machine spent suspended, exactly; on PostgreSQL, on this machine, the
 * server's wall clock, so the distance between our wall and monotonic
 * clocks, within the round trip of the statement that read it (the
 * session's setup, then every renewal batch). Leases end by it. */
static void test_store_clock_bound(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "clock"};
  idem_execute_options o = {.call = {.lease_ms = 3000}};
  idem_call *c = NULL;
  outlive held = {f->store, &id, 0, -1};
  struct timespec mono, boot, wall;
  int64_t ahead, want;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                  outlive_leases, &held, &o, &c));
  assert_int_equal(held.renewed, 2);
  assert_int_equal(held.lost, 0);
  idem_call_free(c);
  assert_true(f->store->methods->version >= 7);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_BOOTTIME, &boot);
  clock_gettime(CLOCK_REALTIME, &wall);
  ahead = f->store->methods->clock_ahead(f->store->state);
  want = ((int64_t)(is_pg_url(f->url) ? wall.tv_sec : boot.tv_sec) -
          mono.tv_sec) * 1000 +
         ((is_pg_url(f->url) ? wall.tv_nsec : boot.tv_nsec) - mono.tv_nsec) /
             1000000;
  if (ahead < want - (is_pg_url(f->url) ? 10000 : 2) ||
      ahead > want + (is_pg_url(f->url) ? 10000 : 2))
    fail_msg("the store's lease clock is bounded %lld ms ahead of our "
             "monotonic clock; it is %lld ms ahead, on this very machine",
             (long long)ahead, (long long)want);
}

/* ------------------------------------------------------------------ */
/* Threads                                                              */
/* ------------------------------------------------------------------ */

/* The threads of a process that started none of its own: its main
 * thread, and ThreadSanitizer's background thread in a TSan build. */
#if defined(__SANITIZE_THREAD__)
#define TASKS_ALONE 2
#else
#define TASKS_ALONE 1
#endif

static int count_tasks(void) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int n = 0;
  assert_non_null(d);
  while ((e = readdir(d)))
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

/* Whether every thread not in mine[0..n) blocks SIGINT, SIGTERM, SIGHUP,
 * SIGPIPE, SIGUSR1 and SIGCHLD; *others counts them. */
static int others_block_signals(const pid_t *mine, int n, int *others) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int ok = 1;
  unsigned long long want = 0;
  int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGCHLD};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    want |= 1ULL << (sigs[i] - 1);
  *others = 0;
  assert_non_null(d);
  while ((e = readdir(d))) {
    char path[300], line[256];
    pid_t tid = (pid_t)atoi(e->d_name);
    int skip = e->d_name[0] == '.';
    FILE *fp;
    for (int i = 0; i < n && !skip; i++)
      skip = mine[i] == tid;
    if (skip)
      continue;
    (*others)++;
    snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
    if (!(fp = fopen(path, "r")))
      continue; /* ended meanwhile */
    while (fgets(line, sizeof line, fp))
      if (strncmp(line, "SigBlk:", 7) == 0 &&
          (strtoull(line + 7, NULL, 16) & want) != want) {
        print_error("thread %d does not block signals: %s", (int)tid, line);
        ok = 0;
      }
    fclose(fp);
  }
  closedir(d);
  return ok;
}

typedef struct signal_probe {
  pid_t mine[2];
  int blocked, others;
} signal_probe;

static idem_exec_result probe_threads(idem_exec *x, void *ctx,
                                      idem_response *r) {
  signal_probe *p = ctx;
  (void)x;
  /* Long enough for the scheduler to have renewed (at 500 ms): its thread
   * runs. The lease (1.5 s) leaves a loaded machine 800 ms more. */
  sleep_ms(700);
  p->blocked = others_block_signals(p->mine, 1, &p->others);
  r->status = 200;
  r->body = "probed";
  r->body_len = 6;
  return IDEM_EXEC_DONE;
}

static void test_library_threads_block_signals_and_end_at_close(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "threads"};
  idem_execute_options o = {.call = {.lease_ms = 1500}};
  signal_probe p = {{(pid_t)syscall(SYS_gettid)}, 0, 0};
  idem_store *s = NULL;
  idem_call *c = NULL;
  int before = count_tasks();

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &s));
  EXPECT_RC(IDEM_OK, idem_execute(s, &id, REQ, strlen(REQ), probe_threads, &p,
                                  &o, &c));
  idem_call_free(c);
  /* The fixture's own store may have threads too: all of them count. */
  assert_true(p.others >= 1);
  assert_int_equal(p.blocked, 1);
  idem_store_close(s);
  idem_store_close(f->store);
  f->store = NULL;
  left_fixture->store = NULL;
  /* Every thread the library started ended with its stores: the process
   * has only its main thread (cmocka starts none). */
  assert_true(before >= TASKS_ALONE);
  assert_int_equal(count_tasks(), TASKS_ALONE);
}

/* ------------------------------------------------------------------ */
/* Many calls in flight                                                 */
/* ------------------------------------------------------------------ */

#define MANY 200

typedef struct crowd {
  fixture *f;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, go, lost, peak_threads;
  int base_threads;
} crowd;

typedef struct member {
  crowd *cr;
  int i, rc, outcome, body_ok;
} member;

static idem_exec_result wait_for_all(idem_exec *x, void *ctx,
                                     idem_response *r) {
  member *m = ctx;
  crowd *cr = m->cr;
  static __thread char body[32];
  pthread_mutex_lock(&cr->mu);
  if (++cr->started == MANY) {
    /* Everyone holds a key: now let two and a half leases pass. */
    pthread_mutex_unlock(&cr->mu);
    sleep_ms(3000);
    int threads = count_tasks() - cr->base_threads - MANY;
    pthread_mutex_lock(&cr->mu);
    cr->peak_threads = threads;
    cr->go = 1;
    pthread_cond_broadcast(&cr->cv);
  }
  while (!cr->go)
    pthread_cond_wait(&cr->cv, &cr->mu);
  if (idem_exec_lost(x))
    cr->lost++;
  pthread_mutex_unlock(&cr->mu);
  snprintf(body, sizeof body, "{\"n\":%d}", m->i);
  r->status = 201;
  r->body = body;
  r->body_len = strlen(body);
  return IDEM_EXEC_DONE;
}

static void *member_main(void *arg) {
  member *m = arg;
  char key[32];
  idem_id id = {"tenant-a", OPERATION, key};
  /* Renewed every 400 ms: 800 ms to spare for a batch of 200 renewals on
   * a loaded machine. */
  idem_execute_options o = {.call = {.lease_ms = 1200}};
  idem_call *c = NULL;
  snprintf(key, sizeof key, "crowd-%d", m->i);
  m->rc = idem_execute(m->cr->f->store, &id, REQ, strlen(REQ), wait_for_all,
                       m, &o, &c);
  if (m->rc == IDEM_OK) {
    char want[32];
    snprintf(want, sizeof want, "{\"n\":%d}", m->i);
    m->outcome = idem_call_outcome(c);
    m->body_ok = idem_call_response(c) &&
                 idem_call_response(c)->body_len == strlen(want) &&
                 memcmp(idem_call_response(c)->body, want, strlen(want)) == 0;
  }
  idem_call_free(c);
  return NULL;
}

static int count_completed(const idem_record *r, void *ctx) {
  if (r->state == IDEM_STATE_COMPLETED)
    (*(int *)ctx)++;
  return 0;
}

static void test_many_calls_in_flight_keep_their_leases(void **state) {
  fixture *f = *state;
  static member ms[MANY];
  pthread_t ts[MANY];
  pthread_attr_t attr;
  crowd cr = {.f = f};
  idem_filter all = {0};
  int completed = 0;

  pthread_mutex_init(&cr.mu, NULL);
  pthread_cond_init(&cr.cv, NULL);
  cr.base_threads = count_tasks();
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < MANY; i++) {
    ms[i] = (member){&cr, i, -1, 0, 0};
    assert_int_equal(pthread_create(&ts[i], &attr, member_main, &ms[i]), 0);
  }
  for (int i = 0; i < MANY; i++)
    pthread_join(ts[i], NULL);
  pthread_attr_destroy(&attr);
  for (int i = 0; i < MANY; i++) {
    EXPECT_RC(IDEM_OK, ms[i].rc);
    assert_int_equal(ms[i].outcome, IDEM_PROCEED);
    assert_int_equal(ms[i].body_ok, 1);
  }
  assert_int_equal(cr.lost, 0);
  /* The library's threads: a scheduler and a checkpointer, not one per
   * call. */
  if (cr.peak_threads > 10)
    fail_msg("%d library threads with %d calls in flight", cr.peak_threads,
             MANY);
  EXPECT_RC(IDEM_OK, idem_list(f->store, &all, count_completed, &completed));
  assert_int_equal(completed, MANY);
  pthread_mutex_destroy(&cr.mu);
  pthread_cond_destroy(&cr.cv);
}

/* ------------------------------------------------------------------ */
/* Waiting on a key in flight                                           */
/* ------------------------------------------------------------------ */

/* A holder whose action runs until the test lets it end, as it says. */
typedef struct holder {
  fixture *f;
  const idem_id *id;
  idem_exec_result answer;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int running, go, runs;
  pthread_t thread;
  int rc;
} holder;

static idem_exec_result held_action(idem_exec *x, void *ctx,
                                    idem_response *r) {
  holder *h = ctx;
  (void)x;
  pthread_mutex_lock(&h->mu);
  h->runs++;
  h->running = 1;
  pthread_cond_broadcast(&h->cv);
  while (!h->go)
    pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  r->status = 201;
  r->body = "{\"ticket_id\":1}";
  r->body_len = strlen(r->body);
  return h->answer;
}

static void *holder_main(void *arg) {
  holder *h = arg;
  idem_execute_options o = {.call = {.lease_ms = 2000}};
  idem_call *c = NULL;
  h->rc = idem_execute(h->f->store, h->id, REQ, strlen(REQ), held_action, h,
                       &o, &c);
  idem_call_free(c);
  return NULL;
}

static void holder_start(holder *h, fixture *f, const idem_id *id,
                         idem_exec_result answer) {
  memset(h, 0, sizeof *h);
  h->f = f;
  h->id = id;
  h->answer = answer;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  assert_int_equal(pthread_create(&h->thread, NULL, holder_main, h), 0);
  pthread_mutex_lock(&h->mu);
  while (!h->running)
    pthread_cond_wait(&h->cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
}

static void holder_finish(holder *h) {
  pthread_mutex_lock(&h->mu);
  h->go = 1;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  pthread_join(h->thread, NULL);
  EXPECT_RC(IDEM_OK, h->rc);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
}

typedef struct waiter {
  idem_store *store;
  const idem_id *id;
  int64_t wait_ms;
  int rc;
  idem_call *call;
  pthread_t thread;
} waiter;

static void *waiter_main(void *arg) {
  waiter *w = arg;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options o = {.wait_ms = w->wait_ms};
  assert_int_equal(idem_fingerprint(REQ, strlen(REQ), 1, fp), IDEM_OK);
  w->rc = idem_claim(w->store, w->id, fp, &o, &w->call);
  return NULL;
}

/* Starts a waiter and returns once it waits in the room. */
static void waiter_start(waiter *w, idem_store *s, const idem_id *id,
                         int64_t wait_ms) {
  int before = idem__wait_count(id);
  memset(w, 0, sizeof *w);
  w->store = s;
  w->id = id;
  w->wait_ms = wait_ms;
  assert_int_equal(pthread_create(&w->thread, NULL, waiter_main, w), 0);
  while (idem__wait_count(id) == before)
    sleep_ms(1);
}

static void test_wait_gets_the_holders_result(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-replay"};
  holder h;
  waiter w;

  holder_start(&h, f, &id, IDEM_EXEC_DONE);
  waiter_start(&w, f->store, &id, 60000);
  holder_finish(&h);
  pthread_join(w.thread, NULL);
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(idem_call_outcome(w.call), IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(w.call)), 1);
  assert_int_equal(h.runs, 1);
  idem_call_free(w.call);
  assert_int_equal(idem__wait_count(&id), 0);
}

static void test_wait_ends_in_flight_at_its_bound(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-bound"};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options o = {.wait_ms = 300};
  idem_call *c = NULL;
  holder h;
  int64_t t0;

  req_fp(fp);
  holder_start(&h, f, &id, IDEM_EXEC_DONE);
  t0 = mono_now();
  EXPECT_RC(IDEM_OK, idem_claim(f->store, &id, fp, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_IN_FLIGHT);
  assert_true(mono_now() - t0 >= 300);
  assert_true(idem_call_retry_after_ms(c) >= 1);
  idem_call_free(c);
  holder_finish(&h);
  /* Without wait_ms nothing waits. */
  assert_int_equal(idem__wait_count(&id), 0);
}

/* The holder releases the key (it did not act): the waiter's own action
 * runs, once; the holder never acted. */
typedef struct counted {
  int runs;
} counted;

static idem_exec_result count_and_store(idem_exec *x, void *ctx,
                                        idem_response *r) {
  counted *n = ctx;
  (void)x;
  n->runs++;
  r->status = 201;
  r->body = "{\"ticket_id\":2}";
  r->body_len = strlen(r->body);
  return IDEM_EXEC_DONE;
}

typedef struct exec_waiter {
  fixture *f;
  const idem_id *id;
  counted n;
  int rc;
  idem_call *call;
} exec_waiter;

static void *exec_waiter_main(void *arg) {
  exec_waiter *w = arg;
  idem_execute_options o = {.call = {.wait_ms = 60000}};
  w->rc = idem_execute(w->f->store, w->id, REQ, strlen(REQ), count_and_store,
                       &w->n, &o, &w->call);
  return NULL;
}

static void test_wait_after_release_proceeds(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-release"};
  exec_waiter w = {f, &id, {0}, -1, NULL};
  pthread_t t;
  holder h;
  int before;

  holder_start(&h, f, &id, IDEM_EXEC_NOT_DONE);
  before = idem__wait_count(&id);
  assert_int_equal(pthread_create(&t, NULL, exec_waiter_main, &w), 0);
  while (idem__wait_count(&id) == before)
    sleep_ms(1);
  holder_finish(&h);
  pthread_join(t, NULL);
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(idem_call_outcome(w.call), IDEM_PROCEED);
  assert_int_equal(w.n.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(w.call)), 2);
  idem_call_free(w.call);
}

static void test_wait_after_unknown(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-unknown"};
  holder h;
  waiter w;

  holder_start(&h, f, &id, IDEM_EXEC_UNKNOWN);
  waiter_start(&w, f->store, &id, 60000);
  holder_finish(&h);
  pthread_join(w.thread, NULL);
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(idem_call_outcome(w.call), IDEM_UNKNOWN);
  idem_call_free(w.call);
}

/* The holder dies: its lease ends unrenewed and the waiter takes over. */
static void test_wait_after_holder_died(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-died"};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options dying = {.lease_ms = 400}, o = {.wait_ms = 60000};
  idem_call *dead, *c = NULL;

  req_fp(fp);
  dead = CLAIM(f->store, &id, fp, &dying, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_claim(f->store, &id, fp, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, dead, &(idem_response){
                                                           .status = 200}));
  idem_call_free(dead);
  idem_call_free(c);
}

/*
 * Every public path that can wait on a key in flight, each from a thread
 * of its own with wait_ms, on one held key: idem_claim(), idem_execute(),
 * idem_execute_begin(), idem_execute_local() and
 * idem_execute_begin_async(). Each waits out the holder and replays its
 * ticket; no action but the holder's runs. The ids they were given are
 * overwritten once the calls have started, as a caller's stack would be.
 */
enum { PATH_CLAIM, PATH_EXECUTE, PATH_BEGIN, PATH_LOCAL, PATH_ASYNC, PATHS };

typedef struct path_waiter {
  fixture *f;
  int path;
  char tenant[16], operation[32], key[32];
  counted n;
  int rc;
  idem_call *call;
  idem_exec *x;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int answered;
} path_waiter;

static int local_not_run(void *conn, void *ctx, idem_response *r) {
  (void)conn;
  (void)r;
  ((counted *)ctx)->runs++;
  return IDEM_OK;
}

static void path_begun(void *ctx, int rc, idem_exec *x, idem_call *c) {
  path_waiter *w = ctx;
  pthread_mutex_lock(&w->mu);
  w->rc = rc;
  w->x = x;
  w->call = c;
  w->answered = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void *path_main(void *arg) {
  path_waiter *w = arg;
  idem_id id = {w->tenant, w->operation, w->key};
  idem_execute_options o = {.call = {.wait_ms = 60000}};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = w->f->store;
  int rc = IDEM_OK;
  req_fp(fp);
  switch (w->path) {
  case PATH_CLAIM:
    rc = idem_claim(s, &id, fp, &o.call, &w->call);
    break;
  case PATH_EXECUTE:
    rc = idem_execute(s, &id, REQ, strlen(REQ), count_and_store, &w->n, &o,
                      &w->call);
    break;
  case PATH_BEGIN:
    rc = idem_execute_begin(s, &id, REQ, strlen(REQ), &o, &w->x, &w->call);
    break;
  case PATH_LOCAL:
    rc = idem_execute_local(s, &id, fp, &o.call, local_not_run, &w->n,
                            &w->call);
    break;
  case PATH_ASYNC:
    rc = idem_execute_begin_async(s, &id, REQ, strlen(REQ), &o, path_begun, w);
    /* The id is the caller's no longer. */
    memset(w->key, 'K', sizeof w->key - 1);
    memset(w->tenant, 'T', sizeof w->tenant - 1);
    if (rc != IDEM_OK)
      path_begun(w, rc, NULL, NULL);
    return NULL;
  }
  path_begun(w, rc, w->x, w->call);
  return NULL;
}

static void test_wait_on_every_path(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-every-path"};
  path_waiter w[PATHS];
  pthread_t t[PATHS];
  holder h;
  int before;

  holder_start(&h, f, &id, IDEM_EXEC_DONE);
  before = idem__wait_count(&id);
  for (int i = 0; i < PATHS; i++) {
    memset(&w[i], 0, sizeof w[i]);
    w[i].f = f;
    w[i].path = i;
    snprintf(w[i].tenant, sizeof w[i].tenant, "%s", id.tenant);
    snprintf(w[i].operation, sizeof w[i].operation, "%s", id.operation);
    snprintf(w[i].key, sizeof w[i].key, "%s", id.key);
    pthread_mutex_init(&w[i].mu, NULL);
    pthread_cond_init(&w[i].cv, NULL);
    assert_int_equal(pthread_create(&t[i], NULL, path_main, &w[i]), 0);
  }
  /* Every path waits in the room before the holder ends. */
  while (idem__wait_count(&id) < before + PATHS)
    sleep_ms(1);
  for (int i = 0; i < PATHS; i++)
    assert_int_equal(w[i].answered, 0);
  holder_finish(&h);
  for (int i = 0; i < PATHS; i++) {
    pthread_join(t[i], NULL);
    pthread_mutex_lock(&w[i].mu);
    while (!w[i].answered)
      pthread_cond_wait(&w[i].cv, &w[i].mu);
    pthread_mutex_unlock(&w[i].mu);
    if (w[i].rc != IDEM_OK)
      print_error("path %d: %s\n", i, idem_rc_name(w[i].rc));
    EXPECT_RC(IDEM_OK, w[i].rc);
    assert_int_equal(idem_call_outcome(w[i].call), IDEM_REPLAY);
    assert_int_equal(ticket_id_of(idem_call_response(w[i].call)), 1);
    assert_null(w[i].x);
    assert_int_equal(w[i].n.runs, 0);
    idem_call_free(w[i].call);
    pthread_mutex_destroy(&w[i].mu);
    pthread_cond_destroy(&w[i].cv);
  }
  assert_int_equal(h.runs, 1);
  assert_int_equal(list_count(f->store, NULL), 1);
  assert_int_equal(idem__wait_count(&id), 0);
}

/* The holder is another process, with a store handle of its own. */
static void test_wait_on_another_process(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "wait-process"};
  int up[2], down[2], status;
  char byte;
  waiter w;
  pid_t pid;

  assert_int_equal(pipe(up), 0);
  assert_int_equal(pipe(down), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* A program of its own, as another process's holder is: the test
     * program again (see main()), with the pipes' ends. */
    char upfd[16], downfd[16];
    close(up[0]);
    close(down[1]);
    snprintf(upfd, sizeof upfd, "%d", up[1]);
    snprintf(downfd, sizeof downfd, "%d", down[0]);
    execl("/proc/self/exe", "test_holding", "--holder", f->url, id.key, upfd,
          downfd, (char *)NULL);
    _exit(4);
  }
  /* The child's ends closed here: if it dies, the reads below end. */
  close(up[1]);
  close(down[0]);
  signal(SIGPIPE, SIG_IGN);
  unsigned long reports = idem__wait_reports();
  assert_int_equal(read(up[0], &byte, 1), 1);
  assert_int_equal(byte, 'h');
  waiter_start(&w, f->store, &id, 60000);
  /* On PostgreSQL the waiter asks to be told: once it has, the holder
   * ends the record. */
  while (is_pg_url(f->url) &&
         side_sql(f->url,
                  "SELECT count(*) FROM {S}.idem_records WHERE key = $1::text "
                  "AND watched",
                  id.key) != 1) {
    assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
    sleep_ms(1);
  }
  byte = 'g';
  assert_int_equal(write(down[1], &byte, 1), 1);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  pthread_join(w.thread, NULL);
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(idem_call_outcome(w.call), IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(w.call)), 7);
  idem_call_free(w.call);
  /* PostgreSQL told the waiter (LISTEN/NOTIFY); SQLite has no such
   * channel: the waiter polled. */
  if (is_pg_url(f->url))
    assert_true(idem__wait_reports() > reports);
  else
    assert_int_equal(idem__wait_reports(), reports);
  close(up[0]);
  close(down[1]);
}

/* PostgreSQL: the store's sessions have keepalives, a TCP user timeout
 * and a statement timeout, so that no call hangs on a dead server. */
typedef struct session_seen {
  char keepalives[16], user_timeout[16], statement_timeout[32];
} session_seen;

static int look_at_session(void *conn, void *ctx, idem_response *r) {
  session_seen *seen = ctx;
  PQconninfoOption *opts = PQconninfo(conn);
  PGresult *res;
  for (PQconninfoOption *o = opts; o && o->keyword; o++) {
    if (strcmp(o->keyword, "keepalives") == 0)
      snprintf(seen->keepalives, sizeof seen->keepalives, "%s",
               o->val ? o->val : "");
    if (strcmp(o->keyword, "tcp_user_timeout") == 0)
      snprintf(seen->user_timeout, sizeof seen->user_timeout, "%s",
               o->val ? o->val : "");
  }
  PQconninfoFree(opts);
  res = PQexec(conn, "SHOW statement_timeout");
  if (PQresultStatus(res) == PGRES_TUPLES_OK)
    snprintf(seen->statement_timeout, sizeof seen->statement_timeout, "%s",
             PQgetvalue(res, 0, 0));
  PQclear(res);
  r->status = 200;
  return 0;
}

static void test_pg_sessions_cannot_hang(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "session"};
  char fp[IDEM_FINGERPRINT_SIZE];
  session_seen seen = {"", "", ""};
  idem_call *c = NULL;
  req_fp(fp);
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        look_at_session, &seen, &c));
  idem_call_free(c);
  assert_string_equal(seen.keepalives, "1");
  assert_string_equal(seen.user_timeout, "20000");
  assert_string_equal(seen.statement_timeout, "1min");
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

/* test_wait_on_another_process()'s holder, in a process of its own:
 * claims the key, says so on up, waits for a byte on down, completes. */
static int holder_process(const char *url, const char *key, int up, int down) {
  idem_id id = {"tenant-a", OPERATION, key};
  idem_store *s = NULL;
  char fp[IDEM_FINGERPRINT_SIZE], byte;
  idem_call *c = NULL;
  idem_response r = {.status = 201, .body = "{\"ticket_id\":7}",
                     .body_len = 15};
  int ok = idem_store_open(url, NULL, &s) == IDEM_OK &&
           idem_fingerprint(REQ, strlen(REQ), 1, fp) == IDEM_OK &&
           idem_claim(s, &id, fp, NULL, &c) == IDEM_OK &&
           idem_call_outcome(c) == IDEM_PROCEED;
  byte = ok ? 'h' : 'x';
  if (write(up, &byte, 1) != 1 || !ok || read(down, &byte, 1) != 1)
    return 2;
  ok = idem_complete(s, c, &r) == IDEM_OK;
  idem_call_free(c);
  idem_store_close(s);
  return ok ? 0 : 3;
}

int main(int argc, char **argv) {
  if (argc == 6 && strcmp(argv[1], "--holder") == 0)
    return holder_process(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  const struct CMUnitTest both[] = {
      STORE_TEST(test_lost_at_deadline_while_renewal_hangs),
      STORE_TEST(test_renewals_of_odd_ids),
      STORE_TEST(test_store_clock_bound),
      STORE_TEST(test_library_threads_block_signals_and_end_at_close),
      STORE_TEST(test_many_calls_in_flight_keep_their_leases),
      STORE_TEST(test_wait_gets_the_holders_result),
      STORE_TEST(test_wait_ends_in_flight_at_its_bound),
      STORE_TEST(test_wait_after_release_proceeds),
      STORE_TEST(test_wait_after_unknown),
      STORE_TEST(test_wait_after_holder_died),
      STORE_TEST(test_wait_on_every_path),
      STORE_TEST(test_wait_on_another_process),
  };
  const struct CMUnitTest pg_only[] = {
      STORE_TEST(test_pg_sessions_cannot_hang),
  };
  return run_engine_tests("holding", both, sizeof both / sizeof both[0], NULL,
                          0, pg_only, sizeof pg_only / sizeof pg_only[0]);
}
