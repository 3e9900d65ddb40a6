/*
 * test_concurrency.c -- many callers on one key, in threads and in
 * processes.
 * One suite for every backend; IDEM_TEST_STORE selects it (see
 * engine_harness.c).
 */
#include "engine_harness.c"

/* ------------------------------------------------------------------ */
/* Concurrency                                                          */
/* ------------------------------------------------------------------ */

typedef struct race_arg {
  idem_store *store;
  const idem_id *id;
  const char *fp;
  pthread_barrier_t *barrier;
  ticket_action action;
  int rc, outcome, runs;
  char body[64];
  size_t body_len;
  char err[256];
} race_arg;

static void *race_local(void *p) {
  race_arg *a = p;
  idem_call *c = NULL;
  const idem_response *r;
  pthread_barrier_wait(a->barrier);
  a->rc = idem_execute_local(a->store, a->id, a->fp, NULL, create_ticket,
                             &a->action, &c);
  if (a->rc == IDEM_OK) {
    a->outcome = idem_call_outcome(c);
    r = idem_call_response(c);
    if (r && r->body_len < sizeof a->body) {
      memcpy(a->body, r->body, r->body_len);
      a->body_len = r->body_len;
    }
  } else {
    snprintf(a->err, sizeof a->err, "%s", idem_errmsg());
  }
  idem_call_free(c);
  return NULL;
}

static void race_execute_local(fixture *f) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  pthread_barrier_t barrier;
  pthread_t th[NTHREADS];
  race_arg args[NTHREADS];
  int proceeded = 0, runs = 0;
  fp_of(PAYLOAD, fp);
  pthread_barrier_init(&barrier, NULL, NTHREADS);
  memset(args, 0, sizeof args);
  for (int i = 0; i < NTHREADS; i++) {
    args[i].store = f->store;
    args[i].id = &id;
    args[i].fp = fp;
    args[i].barrier = &barrier;
    args[i].action.payload = PAYLOAD;
    assert_int_equal(pthread_create(&th[i], NULL, race_local, &args[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);
  for (int i = 0; i < NTHREADS; i++) {
    if (args[i].rc != IDEM_OK)
      fail_msg("thread %d: %s: %s", i, idem_rc_name(args[i].rc), args[i].err);
    if (args[i].outcome != IDEM_PROCEED && args[i].outcome != IDEM_REPLAY)
      fail_msg("thread %d: outcome %s", i, idem_outcome_name(args[i].outcome));
    proceeded += args[i].outcome == IDEM_PROCEED;
    runs += args[i].action.runs;
    assert_int_equal(args[i].body_len, strlen("{\"ticket_id\":1}"));
    assert_memory_equal(args[i].body, "{\"ticket_id\":1}", args[i].body_len);
  }
  assert_int_equal(proceeded, 1);
  assert_int_equal(runs, 1);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_threads_race_execute_local(void **state) {
  race_execute_local(*state);
}

static void test_threads_race_execute_local_no_group_commit(void **state) {
  fixture *f = *state;
  idem_store_options o = {.group_commit = -1};
  idem_store_close(f->store);
  f->store = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &o, &f->store));
  race_execute_local(f);
}

#define NKEYS 4

typedef struct claim_race_arg {
  idem_store *store;
  pthread_barrier_t *barrier;
  int index;
  const char *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  int rc;          /* first failure, or IDEM_OK */
  int bad_outcome; /* an outcome other than proceed, replay, in flight */
  int proceeded;
  int in_flight_seen;
  char body[64];
  size_t body_len;
  char err[256];
} claim_race_arg;

static void *race_claim(void *p) {
  claim_race_arg *a = p;
  idem_id id = {"tenant-a", OPERATION, a->key};
  int64_t deadline;
  pthread_barrier_wait(a->barrier);
  deadline = now_ms() + 20000;
  for (;;) {
    idem_call *c = NULL;
    int outcome;
    a->rc = idem_claim(a->store, &id, a->fp, NULL, &c);
    if (a->rc != IDEM_OK) {
      snprintf(a->err, sizeof a->err, "claim: %s", idem_errmsg());
      return NULL;
    }
    outcome = idem_call_outcome(c);
    if (outcome == IDEM_PROCEED) {
      idem_response r = {201, NULL, 0, a->body, 0};
      a->proceeded = 1;
      snprintf(a->body, sizeof a->body, "{\"key\":\"%s\",\"thread\":%d}",
               a->key, a->index);
      r.body_len = a->body_len = strlen(a->body);
      a->rc = idem_complete(a->store, c, &r);
      if (a->rc != IDEM_OK)
        snprintf(a->err, sizeof a->err, "complete: %s", idem_errmsg());
      idem_call_free(c);
      return NULL;
    }
    if (outcome == IDEM_REPLAY) {
      const idem_response *r = idem_call_response(c);
      if (r && r->body_len < sizeof a->body) {
        memcpy(a->body, r->body, r->body_len);
        a->body_len = r->body_len;
      }
      idem_call_free(c);
      return NULL;
    }
    if (outcome == IDEM_IN_FLIGHT && now_ms() < deadline) {
      int64_t ra = idem_call_retry_after_ms(c);
      a->in_flight_seen++;
      idem_call_free(c);
      sleep_ms(ra < 2 ? (int)ra : 2);
      continue;
    }
    a->bad_outcome = outcome;
    idem_call_free(c);
    return NULL;
  }
}

static void test_threads_race_claim_complete(void **state) {
  fixture *f = *state;
  static const char *const keys[NKEYS] = {"key-0", "key-1", "key-2", "key-3"};
  pthread_barrier_t barrier;
  pthread_t th[NTHREADS];
  claim_race_arg args[NTHREADS];
  pthread_barrier_init(&barrier, NULL, NTHREADS);
  memset(args, 0, sizeof args);
  for (int i = 0; i < NTHREADS; i++) {
    char payload[64];
    args[i].store = f->store;
    args[i].barrier = &barrier;
    args[i].index = i;
    args[i].key = keys[i % NKEYS];
    snprintf(payload, sizeof payload, "payload of %s", args[i].key);
    fp_of(payload, args[i].fp);
    assert_int_equal(pthread_create(&th[i], NULL, race_claim, &args[i]), 0);
  }
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&barrier);

  for (int k = 0; k < NKEYS; k++) {
    int winner = -1, proceeded = 0;
    for (int i = k; i < NTHREADS; i += NKEYS) {
      if (args[i].rc != IDEM_OK)
        fail_msg("thread %d: %s: %s", i, idem_rc_name(args[i].rc), args[i].err);
      if (args[i].bad_outcome)
        fail_msg("thread %d: outcome %s", i,
                 idem_outcome_name(args[i].bad_outcome));
      if (args[i].proceeded) {
        proceeded++;
        winner = i;
      }
    }
    assert_int_equal(proceeded, 1);
    for (int i = k; i < NTHREADS; i += NKEYS) {
      assert_int_equal(args[i].body_len, args[winner].body_len);
      assert_memory_equal(args[i].body, args[winner].body,
                          args[winner].body_len);
    }
  }
  {
    idem_filter done = {.state = IDEM_STATE_COMPLETED};
    assert_int_equal(list_count(f->store, NULL), NKEYS);
    assert_int_equal(list_count(f->store, &done), NKEYS);
  }
}

typedef struct child_report {
  int index;
  int ready; /* 1: opened and waiting; 0: the final report */
  int rc;
  int outcome;
  int runs;
  long long ticket_id;
  char err[200];
} child_report;

/* A child process: its own store handle, one local action at the signal. */
static void child_race(const char *url, int go_fd, int report_fd, int index) {
  child_report m;
  idem_store *s = NULL;
  idem_call *c = NULL;
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  char fp[IDEM_FINGERPRINT_SIZE], b;
  memset(&m, 0, sizeof m);
  m.index = index;
  m.ready = 1;
  m.rc = idem_store_open(url, NULL, &s);
  if (m.rc != IDEM_OK)
    snprintf(m.err, sizeof m.err, "open: %s", idem_errmsg());
  if (write_all(report_fd, &m, sizeof m) != 0 || m.rc != IDEM_OK)
    _exit(1);
  while (read(go_fd, &b, 1) < 0 && errno == EINTR)
    ;
  m.ready = 0;
  if (idem_fingerprint(PAYLOAD, strlen(PAYLOAD), 0, fp) != IDEM_OK)
    _exit(2);
  m.rc = idem_execute_local(s, &id, fp, NULL, create_ticket, &act, &c);
  if (m.rc == IDEM_OK) {
    m.outcome = idem_call_outcome(c);
    m.ticket_id = ticket_id_of(idem_call_response(c));
  } else {
    snprintf(m.err, sizeof m.err, "%s", idem_errmsg());
  }
  m.runs = act.runs;
  idem_call_free(c);
  idem_store_close(s);
  _exit(write_all(report_fd, &m, sizeof m) == 0 ? 0 : 3);
}

static void test_processes_race_execute_local(void **state) {
  fixture *f = *state;
  int go[2], rep[2], ready = 0, done = 0, proceeded = 0, runs = 0;
  pid_t pids[NPROCS];
  child_report m;
  /* No connection crosses fork(): the parent closes its handle first. */
  idem_store_close(f->store);
  f->store = NULL;
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(rep), 0);
  for (int i = 0; i < NPROCS; i++) {
    pids[i] = fork();
    assert_true(pids[i] >= 0);
    if (pids[i] == 0) {
      close(go[1]);
      close(rep[0]);
      child_race(f->url, go[0], rep[1], i);
    }
  }
  close(go[0]);
  close(rep[1]);
  while (ready < NPROCS && read_all(rep[0], &m, sizeof m) == 1) {
    if (!m.ready || m.rc != IDEM_OK) {
      close(go[1]);
      fail_msg("child %d: not ready: %s: %s", m.index, idem_rc_name(m.rc),
               m.err);
    }
    ready++;
  }
  close(go[1]); /* every child wakes up at once */
  assert_int_equal(ready, NPROCS);
  while (done < NPROCS && read_all(rep[0], &m, sizeof m) == 1) {
    if (m.ready)
      fail_msg("child %d: unexpected report", m.index);
    if (m.rc != IDEM_OK)
      fail_msg("child %d: %s: %s", m.index, idem_rc_name(m.rc), m.err);
    if (m.outcome != IDEM_PROCEED && m.outcome != IDEM_REPLAY)
      fail_msg("child %d: outcome %s", m.index, idem_outcome_name(m.outcome));
    if (m.ticket_id != 1)
      fail_msg("child %d: ticket_id %lld", m.index, m.ticket_id);
    proceeded += m.outcome == IDEM_PROCEED;
    runs += m.runs;
    done++;
  }
  close(rep[0]);
  for (int i = 0; i < NPROCS; i++) {
    int status = 0;
    assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
  }
  assert_int_equal(done, NPROCS);
  assert_int_equal(proceeded, 1);
  assert_int_equal(runs, 1);
  assert_int_equal(count_tickets(f->url), 1);
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(list_count(f->store, NULL), 1);
}

/* A child that opens a store that may not exist yet and claims its own key. */
static void child_open(const char *url, int go_fd, int report_fd, int index) {
  child_report m;
  idem_store *s = NULL;
  idem_call *c = NULL;
  char key[32], fp[IDEM_FINGERPRINT_SIZE], b;
  idem_id id = {"tenant-a", OPERATION, key};
  idem_response resp = {200, NULL, 0, "ok", 2};
  memset(&m, 0, sizeof m);
  m.index = index;
  snprintf(key, sizeof key, "child-%d", index);
  while (read(go_fd, &b, 1) < 0 && errno == EINTR)
    ;
  if (idem_fingerprint(key, strlen(key), 0, fp) != IDEM_OK)
    _exit(2);
  m.rc = idem_store_open(url, NULL, &s);
  if (m.rc != IDEM_OK) {
    snprintf(m.err, sizeof m.err, "open: %s", idem_errmsg());
  } else {
    m.rc = idem_claim(s, &id, fp, NULL, &c);
    if (m.rc == IDEM_OK) {
      m.outcome = idem_call_outcome(c);
      m.rc = idem_complete(s, c, &resp);
    }
    if (m.rc != IDEM_OK)
      snprintf(m.err, sizeof m.err, "claim: %s", idem_errmsg());
  }
  idem_call_free(c);
  idem_store_close(s);
  _exit(write_all(report_fd, &m, sizeof m) == 0 ? 0 : 3);
}

#define OPEN_ROUNDS 8

/*
 * Many processes starting at once on a store nobody created yet (several
 * `idem run` at the first use of ./idem.db): every one of them opens it.
 */
static void test_processes_open_fresh_store(void **state) {
  int failures = 0;
  char first_failure[256] = "";
  (void)state;
  for (int round = 0; round < OPEN_ROUNDS; round++) {
    char url[URL_MAX];
    int go[2], rep[2], reports = 0;
    pid_t pids[NPROCS];
    child_report m;
    idem_store *s = NULL;
    if (fresh_store_url(url) != 0)
      fail_msg("no store URL");
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(rep), 0);
    for (int i = 0; i < NPROCS; i++) {
      pids[i] = fork();
      assert_true(pids[i] >= 0);
      if (pids[i] == 0) {
        close(go[1]);
        close(rep[0]);
        child_open(url, go[0], rep[1], i);
      }
    }
    close(go[0]);
    close(rep[1]);
    sleep_ms(20); /* let every child reach its read() */
    close(go[1]);
    while (read_all(rep[0], &m, sizeof m) == 1) {
      reports++;
      if (m.rc != IDEM_OK || m.outcome != IDEM_PROCEED) {
        if (!failures++)
          snprintf(first_failure, sizeof first_failure,
                   "round %d, child %d: %s, outcome %s: %s", round, m.index,
                   idem_rc_name(m.rc), idem_outcome_name(m.outcome), m.err);
      }
    }
    close(rep[0]);
    for (int i = 0; i < NPROCS; i++) {
      int status = 0;
      if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0)
        reports = -1;
    }
    if (reports == NPROCS && !failures) {
      /* Every child's record is in the one store they all created. */
      int n = 0, rc = idem_store_open(url, NULL, &s);
      if (rc == IDEM_OK)
        rc = idem_list(s, NULL, count_cb, &n);
      idem_store_close(s);
      if (rc != IDEM_OK || n != NPROCS) {
        discard_store(url);
        fail_msg("round %d: reopened store: %s, %d records, expected %d", round,
                 idem_rc_name(rc), n, NPROCS);
      }
    }
    discard_store(url);
    if (reports != NPROCS)
      fail_msg("round %d: %d reports from %d children, or a child exited "
               "badly",
               round, reports, NPROCS);
  }
  if (failures)
    fail_msg("%d of %d processes failed to use a fresh store; first: %s",
             failures, OPEN_ROUNDS * NPROCS, first_failure);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      STORE_TEST(test_threads_race_execute_local),
      STORE_TEST(test_threads_race_execute_local_no_group_commit),
      STORE_TEST(test_threads_race_claim_complete),
      STORE_TEST(test_processes_race_execute_local),
      cmocka_unit_test(test_processes_open_fresh_store),
  };
  const struct CMUnitTest *sqlite_only = NULL;
  const struct CMUnitTest *pg_only = NULL;
  return run_engine_tests("concurrency", both, sizeof both / sizeof both[0], sqlite_only,
                          0, pg_only, 0);
}
