/*
 * test_api.c -- the header's rules as a new C user reads them: no store is
 * made unasked, idem_execute() refuses request fields it would ignore and
 * leaves *out NULL when its action never ran, the record's state after an
 * ending is readable apart from the claim's outcome, and
 * IDEM_EXEC_LEAVE_IN_PROGRESS (0.2's IDEM_EXEC_ABANDON) leaves the record
 * in progress and held, and a store handle is the opener's: a child of
 * fork() is refused it (IDEM_EFORK) and lets it go without harm to the
 * parent. Every backend.
 */
#include "engine_harness.c"

#include <poll.h>
#include <signal.h>

#define REQ "{\"title\":\"Queue backlog\"}"

static void test_open_without_a_store_named(void **state) {
  char cwd[4096], dir[] = TMP_PREFIX "api-XXXXXX"; /* rm_tree() takes it */
  const char *saved = getenv("IDEM_STORE");
  char *keep = saved ? strdup(saved) : NULL;
  idem_store *s = (idem_store *)1;
  struct stat st;
  (void)state;
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_non_null(mkdtemp(dir));
  assert_int_equal(chdir(dir), 0);
  unsetenv("IDEM_STORE");
  EXPECT_RC(IDEM_EINVAL, idem_store_open(NULL, NULL, &s));
  assert_null(s);
  assert_non_null(strstr(idem_errmsg(), "IDEM_STORE"));
  s = (idem_store *)1;
  EXPECT_RC(IDEM_EINVAL, idem_store_open("", NULL, &s));
  assert_null(s);
  /* Nothing was created in the current folder. */
  assert_int_equal(stat("idem.db", &st), -1);
  /* IDEM_STORE still names one. */
  setenv("IDEM_STORE", "sqlite:named.db", 1);
  EXPECT_RC(IDEM_OK, idem_store_open(NULL, NULL, &s));
  assert_string_equal(idem_store_backend(s), "sqlite");
  idem_store_close(s);
  assert_int_equal(stat("named.db", &st), 0);
  if (keep)
    setenv("IDEM_STORE", keep, 1);
  else
    unsetenv("IDEM_STORE");
  free(keep);
  assert_int_equal(chdir(cwd), 0);
  rm_tree(dir);
}

static idem_exec_result answer_with(idem_exec *x, void *ctx,
                                    idem_response *r) {
  int *how = ctx;
  (void)x;
  r->status = 201;
  r->body = "{\"ticket_id\":1}";
  r->body_len = strlen(r->body);
  return (idem_exec_result)*how;
}

static void test_execute_refuses_request_fields(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "request-fields"};
  idem_execute_options o = {.call = {.request = "x", .request_len = 1}};
  idem_call *c = (idem_call *)1;
  int how = IDEM_EXEC_DONE;
  EXPECT_RC(IDEM_EINVAL, idem_execute(f->store, &id, REQ, strlen(REQ),
                                      answer_with, &how, &o, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "call.request"));
  o.call.request = NULL;
  c = (idem_call *)1;
  EXPECT_RC(IDEM_EINVAL, idem_execute(f->store, &id, REQ, strlen(REQ),
                                      answer_with, &how, &o, &c));
  assert_null(c);
  /* Nothing was claimed. */
  assert_absent(f->store, &id);
}

static void test_call_state_after_each_ending(void **state) {
  fixture *f = *state;
  struct {
    const char *key;
    int how;
    int state;
  } cases[] = {
      {"state-done", IDEM_EXEC_DONE, IDEM_STATE_COMPLETED},
      {"state-unknown", IDEM_EXEC_UNKNOWN, IDEM_STATE_UNKNOWN},
      {"state-released", IDEM_EXEC_NOT_DONE, 0},
      {"state-left", IDEM_EXEC_LEAVE_IN_PROGRESS, IDEM_STATE_IN_PROGRESS},
  };
  idem_execute_options o = {.call = {.lease_ms = 60000}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    idem_id id = {"tenant-a", OPERATION, cases[i].key};
    idem_call *c = NULL;
    idem_record *rec = NULL;
    EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                    answer_with, &cases[i].how, &o, &c));
    /* The claim's outcome stays what the claim was... */
    assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
    /* ...and the state says what the ending left. */
    assert_int_equal(idem_call_state(c), cases[i].state);
    idem_call_free(c);
    if (cases[i].state == 0) {
      assert_absent(f->store, &id);
      continue;
    }
    rec = get_record(f->store, &id);
    assert_int_equal(rec->state, cases[i].state);
    idem_record_free(rec);
  }
  /* A replay, and the old name of LEAVE_IN_PROGRESS. */
  {
    idem_id id = {"tenant-a", OPERATION, "state-done"};
    idem_call *c = NULL;
    int how = IDEM_EXEC_DONE;
    EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                    answer_with, &how, NULL, &c));
    assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
    assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
    idem_call_free(c);
    id.key = "state-left";
    EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, REQ, strlen(REQ),
                                    answer_with, &how, NULL, &c));
    assert_int_equal(idem_call_outcome(c), IDEM_IN_FLIGHT);
    assert_int_equal(idem_call_state(c), IDEM_STATE_IN_PROGRESS);
    idem_call_free(c);
    assert_int_equal(IDEM_EXEC_ABANDON, IDEM_EXEC_LEAVE_IN_PROGRESS);
  }
}

/* idem_execute() fingerprints the request as sent: numbers that differ
 * past a double's precision are other requests; equal values are one. */
static void test_execute_exact_numbers(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "exact-account"};
  const char *first = "{\"account\":12345678901234567}";
  const char *other = "{\"account\":12345678901234568}";
  const char *same = "{\"account\":1234567890123456.7e1}";
  int how = IDEM_EXEC_DONE;
  idem_call *c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, first, strlen(first),
                                  answer_with, &how, NULL, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, other, strlen(other),
                                  answer_with, &how, NULL, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_CONFLICT);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &id, same, strlen(same),
                                  answer_with, &how, NULL, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
}

/* An action whose side effect is the remote system's ticket counter. */
typedef struct counted {
  int runs;
  int next_ticket;
  char body[32];
} counted;

static idem_exec_result count_ticket(idem_exec *x, void *ctx,
                                     idem_response *r) {
  counted *a = ctx;
  (void)x;
  a->runs++;
  a->next_ticket++;
  snprintf(a->body, sizeof a->body, "{\"ticket_id\":%d}", a->next_ticket);
  r->status = 201;
  r->body = a->body;
  r->body_len = strlen(a->body);
  return IDEM_EXEC_DONE;
}

/* {"ticket_id":N} in buf, as a response. */
static idem_response ticket_response(char *buf, size_t size, int ticket) {
  idem_response r = {201, NULL, 0, buf, 0};
  snprintf(buf, size, "{\"ticket_id\":%d}", ticket);
  r.body_len = strlen(buf);
  return r;
}

/* What a child of fork() did, step by step, told through a pipe. */
enum {
  FORK_CLAIM = 1, /* idem_claim() on the parent's handle; value: *out NULL */
  FORK_GET,       /* idem_get() on it */
  FORK_EXECUTE,   /* idem_execute() on it; value: how often the action ran */
  FORK_COMPLETE,  /* idem_complete() of the parent's held claim */
  FORK_OTHERS,    /* every other call that takes it; value: how many of
                     them were not refused */
  FORK_END,       /* idem_execute_end() of the parent's held exec */
  FORK_CLOSING,   /* idem_store_close() of the parent's handle begins */
  FORK_CLOSED,    /* and returned */
  FORK_OWN_OPEN,  /* a store of the child's own */
  FORK_OWN_CLAIM, /* value: the outcome */
  FORK_OWN_COMPLETE,
  FORK_OWN_REPLAY, /* value: the replayed ticket */
  FORK_STEPS
};

static const char *const fork_step_names[FORK_STEPS] = {
    "(none)",
    "claim on the parent's handle",
    "get on the parent's handle",
    "execute on the parent's handle",
    "complete of the parent's held claim",
    "the other calls on the parent's handle",
    "execute_end of the parent's held exec",
    "closing the parent's handle",
    "idem_store_close() of the parent's handle returned",
    "opening the child's own store",
    "claim on the child's own store",
    "complete on the child's own store",
    "replay on the child's own store"};

typedef struct fork_step {
  int step, rc, value;
  char msg[256];
} fork_step;

#define CHILD_TICKET 100

/* The options of the store the child opens. ThreadSanitizer cannot follow
 * a thread started in a child of a threaded process (the new thread gets
 * the id of one of the parent's, which TSan still counts): in a TSan build
 * the child's SQLite store runs without group commit, so that it starts
 * no checkpoint thread. Otherwise the defaults. */
#if defined(__SANITIZE_THREAD__)
static const idem_store_options child_store_options = {.group_commit = -1};
#else
static const idem_store_options child_store_options = {0};
#endif

static void child_step(int fd, int step, int rc, int value) {
  fork_step s;
  memset(&s, 0, sizeof s);
  s.step = step;
  s.rc = rc;
  s.value = value;
  snprintf(s.msg, sizeof s.msg, "%s", idem_errmsg());
  if (write_all(fd, &s, sizeof s) != 0)
    _exit(3);
}

static int is_fork_error(int rc) {
  return strcmp(idem_rc_name(rc), "IDEM_EFORK") == 0 &&
         strstr(idem_errmsg(), "fork") != NULL;
}

static int child_local(void *conn, void *ctx, idem_response *r) {
  (void)conn;
  (void)r;
  (*(int *)ctx)++;
  return 0;
}

static void child_begun(void *ctx, int rc, idem_exec *x, idem_call *c) {
  (void)rc;
  (void)x;
  (void)c;
  (*(int *)ctx)++;
}

static void child_ended(void *ctx, int rc) {
  (void)rc;
  (*(int *)ctx)++;
}

/* One call on the parent's handle that must be refused: counts it in
 * *bad, and names the first in why, when it was not. */
static void child_refused(int rc, const char *what, int *bad, char *why,
                          size_t size) {
  if (is_fork_error(rc))
    return;
  if (!*bad)
    snprintf(why, size, "%s returned %s (%s)", what, idem_rc_name(rc),
             idem_errmsg());
  ++*bad;
}

/* Every other public call that takes the parent's handle, or its held
 * claim or exec: refused, no action run, no callback called. Returns how
 * many were not. */
static int child_others(int fd, idem_store *parents, idem_call *held,
                        idem_exec *x, const char *fp) {
  idem_id id = {"tenant-a", OPERATION, "child-others"};
  idem_response r = {200, NULL, 0, "x", 1};
  idem_execute_options eo = {.call = {.lease_ms = 60000}};
  idem_call *c = NULL;
  idem_exec *xx = NULL;
  int64_t removed = -1;
  int bad = 0, calls = 0;
  char why[256] = "";
  fork_step st;

  child_refused(idem_list(parents, NULL, count_cb, &calls), "list", &bad, why,
                sizeof why);
  child_refused(idem_prune(parents, &removed), "prune", &bad, why, sizeof why);
  child_refused(idem_resolve(parents, &id, &r), "resolve", &bad, why,
                sizeof why);
  child_refused(idem_delete(parents, &id), "delete", &bad, why, sizeof why);
  child_refused(idem_store_check(parents), "store_check", &bad, why,
                sizeof why);
  child_refused(idem_claim_cached(parents, &id, fp, &c), "claim_cached", &bad,
                why, sizeof why);
  child_refused(
      idem_execute_local(parents, &id, fp, NULL, child_local, &calls, &c),
      "execute_local", &bad, why, sizeof why);
  child_refused(idem_release(parents, held), "release", &bad, why, sizeof why);
  child_refused(idem_mark_unknown(parents, held), "mark_unknown", &bad, why,
                sizeof why);
  child_refused(idem_renew(parents, held, 60000), "renew", &bad, why,
                sizeof why);
  child_refused(
      idem_execute_begin(parents, &id, REQ, strlen(REQ), &eo, &xx, &c),
      "execute_begin", &bad, why, sizeof why);
  child_refused(idem_execute_begin_async(parents, &id, REQ, strlen(REQ), &eo,
                                         child_begun, &calls),
                "execute_begin_async", &bad, why, sizeof why);
  child_refused(
      idem_execute_end_async(x, IDEM_EXEC_DONE, &r, child_ended, &calls),
      "execute_end_async", &bad, why, sizeof why);
  if (calls || c || xx || removed != 0) {
    if (!bad)
      snprintf(why, sizeof why,
               "a callback ran (%d), an output was set or prune counted %lld",
               calls, (long long)removed);
    bad++;
  }
  memset(&st, 0, sizeof st);
  st.step = FORK_OTHERS;
  st.rc = bad ? IDEM_OK : IDEM_EFORK;
  st.value = bad;
  snprintf(st.msg, sizeof st.msg, "%s", bad ? why : idem_errmsg());
  if (write_all(fd, &st, sizeof st) != 0)
    _exit(3);
  return bad;
}

/*
 * The child: every call on the parent's handle is refused, closing that
 * handle returns, and a store of its own works. It exits with 0, or with
 * the first step that went otherwise (the pipe tells the details). No
 * cmocka here: its failures would unwind into the parent's test.
 */
static void fork_child(int fd, const char *url, idem_store *parents,
                       idem_call *held, idem_exec *x, const char *fp) {
  idem_id on_parents = {"tenant-a", OPERATION, "child-on-parents-handle"};
  idem_id child_exec = {"tenant-a", OPERATION, "child-execute"};
  idem_id own_id = {"tenant-a", OPERATION, "child-own"};
  idem_store *own = NULL;
  idem_record *rec = (idem_record *)1;
  idem_call *c = (idem_call *)1;
  counted a = {0};
  char body[32];
  idem_response r = ticket_response(body, sizeof body, CHILD_TICKET);
  int rc, bad = 0;

  rc = idem_claim(parents, &on_parents, fp, NULL, &c);
  child_step(fd, FORK_CLAIM, rc, c == NULL);
  if (!bad && !(is_fork_error(rc) && c == NULL))
    bad = FORK_CLAIM;
  rc = idem_get(parents, &on_parents, &rec);
  child_step(fd, FORK_GET, rc, rec == NULL);
  if (!bad && !(is_fork_error(rc) && rec == NULL))
    bad = FORK_GET;
  c = (idem_call *)1;
  rc = idem_execute(parents, &child_exec, REQ, strlen(REQ), count_ticket, &a,
                    NULL, &c);
  child_step(fd, FORK_EXECUTE, rc, a.runs);
  if (!bad && !(is_fork_error(rc) && c == NULL && a.runs == 0))
    bad = FORK_EXECUTE;
  rc = idem_complete(parents, held, &r);
  child_step(fd, FORK_COMPLETE, rc, 0);
  if (!bad && !is_fork_error(rc))
    bad = FORK_COMPLETE;
  if (child_others(fd, parents, held, x, fp) && !bad)
    bad = FORK_OTHERS;
  rc = idem_execute_end(x, IDEM_EXEC_DONE, &r);
  child_step(fd, FORK_END, rc, 0);
  if (!bad && !is_fork_error(rc))
    bad = FORK_END;
  child_step(fd, FORK_CLOSING, 0, 0);
  idem_store_close(parents);
  child_step(fd, FORK_CLOSED, 0, 0);

  rc = idem_store_open(url, &child_store_options, &own);
  child_step(fd, FORK_OWN_OPEN, rc, 0);
  if (rc != IDEM_OK)
    _exit(bad ? bad : FORK_OWN_OPEN);
  c = NULL;
  rc = idem_claim(own, &own_id, fp, NULL, &c);
  child_step(fd, FORK_OWN_CLAIM, rc, c ? (int)idem_call_outcome(c) : 0);
  if (!bad && !(rc == IDEM_OK && idem_call_outcome(c) == IDEM_PROCEED))
    bad = FORK_OWN_CLAIM;
  rc = c ? idem_complete(own, c, &r) : IDEM_EINVAL;
  child_step(fd, FORK_OWN_COMPLETE, rc, c ? idem_call_state(c) : 0);
  if (!bad && rc != IDEM_OK)
    bad = FORK_OWN_COMPLETE;
  idem_call_free(c);
  c = NULL;
  rc = idem_claim(own, &own_id, fp, NULL, &c);
  child_step(fd, FORK_OWN_REPLAY, rc,
             c && idem_call_outcome(c) == IDEM_REPLAY
                 ? (int)ticket_id_of(idem_call_response(c))
                 : -1);
  if (!bad && !(rc == IDEM_OK && idem_call_outcome(c) == IDEM_REPLAY &&
                ticket_id_of(idem_call_response(c)) == CHILD_TICKET))
    bad = FORK_OWN_REPLAY;
  idem_call_free(c);
  idem_store_close(own);
  _exit(bad);
}

/*
 * Reads the child's steps into steps[] until it ends or until bound_ms
 * passed; a child that has not ended by then is killed. Returns the last
 * step read; *status is the child's wait status, *hung non-zero when it
 * had to be killed.
 */
static int collect_child(int fd, pid_t pid, fork_step *steps, int bound_ms,
                         int *status, int *hung) {
  int64_t until = now_ms() + bound_ms;
  int last = 0;
  *hung = 0;
  for (;;) {
    fork_step s;
    size_t got = 0;
    while (got < sizeof s) {
      struct pollfd p = {fd, POLLIN, 0};
      int64_t left = until - now_ms();
      ssize_t n;
      if (left <= 0 || poll(&p, 1, (int)left) == 0) {
        *hung = 1;
        goto wait;
      }
      n = read(fd, (char *)&s + got, sizeof s - got);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        goto wait; /* the child ended (or broke the pipe) */
      got += (size_t)n;
    }
    if (s.step > 0 && s.step < FORK_STEPS) {
      steps[s.step] = s;
      last = s.step;
    }
  }
wait:
  for (;;) {
    pid_t w = waitpid(pid, status, WNOHANG);
    if (w == pid)
      return last;
    if (w < 0 && errno != EINTR)
      fail_msg("waitpid: %s", strerror(errno));
    if (*hung || now_ms() >= until) {
      *hung = 1;
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return last;
    }
    poll(NULL, 0, 5); /* the pipe is closed: the child is exiting */
  }
}

/*
 * A store handle belongs to the process that opened it. After fork() the
 * child's calls on the parent's handle fail with IDEM_EFORK, saying so,
 * and touch neither the parent's connections nor its records; closing
 * that handle in the child returns at once, though the library's threads
 * (the lease scheduler, SQLite's checkpointer, PostgreSQL's listener) are
 * not in the child; and a store the child opens itself works. The parent
 * is unharmed: its held claim and held exec end as they would have, its
 * records are intact, and a new key proceeds (on PostgreSQL the child once
 * spoke on the parent's sessions, which then answered IN_FLIGHT for the
 * parent's own new key).
 */
static void test_store_refused_after_fork(void **state) {
  fixture *f = *state;
  idem_id before = {"tenant-a", OPERATION, "before-fork"};
  idem_id held_id = {"tenant-a", OPERATION, "held-across-fork"};
  idem_id exec_id = {"tenant-a", OPERATION, "executing-across-fork"};
  idem_id after = {"tenant-a", OPERATION, "after-fork"};
  idem_id after_exec = {"tenant-a", OPERATION, "after-fork-execute"};
  idem_id own_id = {"tenant-a", OPERATION, "child-own"};
  idem_id on_parents = {"tenant-a", OPERATION, "child-on-parents-handle"};
  idem_id child_exec = {"tenant-a", OPERATION, "child-execute"};
  idem_execute_options o = {.call = {.lease_ms = 60000}};
  fork_step steps[FORK_STEPS];
  char fp[IDEM_FINGERPRINT_SIZE], body[32];
  idem_response r;
  counted a = {0};
  idem_call *c = NULL, *held, *xc = NULL;
  idem_exec *x = NULL;
  idem_record *rec;
  int pfd[2], status = 0, hung, last;
  pid_t pid;

  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  /* The parent's connections and threads exist: an execute (the lease
   * scheduler), a claim held and an exec held across the fork. */
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &before, REQ, strlen(REQ),
                                  count_ticket, &a, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  held = CLAIM(f->store, &held_id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &exec_id, REQ, strlen(REQ),
                                        &o, &x, &xc));
  assert_non_null(x);
  assert_int_equal(idem_call_outcome(xc), IDEM_PROCEED);

  memset(steps, 0, sizeof steps);
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pfd[0]);
    fork_child(pfd[1], f->url, f->store, held, x, fp);
  }
  close(pfd[1]);
  last = collect_child(pfd[0], pid, steps, 30000, &status, &hung);
  close(pfd[0]);
  if (hung)
    print_error("the child did not end within 30 s; its last step: %s\n",
                fork_step_names[last]);
  for (int i = FORK_CLAIM; i <= FORK_END; i++) {
    if (steps[i].step != i)
      fail_msg("child: %s: never reported", fork_step_names[i]);
    if (strcmp(idem_rc_name(steps[i].rc), "IDEM_EFORK") != 0)
      fail_msg("child: %s returned %s (%s), expected IDEM_EFORK",
               fork_step_names[i], idem_rc_name(steps[i].rc), steps[i].msg);
    if (!strstr(steps[i].msg, "fork"))
      fail_msg("child: %s: the message does not say fork: %s",
               fork_step_names[i], steps[i].msg);
  }
  assert_non_null(strstr(steps[FORK_CLAIM].msg, "after fork()"));
  assert_int_equal(steps[FORK_CLAIM].value, 1); /* *out NULL */
  assert_int_equal(steps[FORK_GET].value, 1);
  assert_int_equal(steps[FORK_EXECUTE].value, 0); /* the action never ran */
  assert_int_equal(steps[FORK_OTHERS].value, 0);
  if (steps[FORK_CLOSED].step != FORK_CLOSED)
    fail_msg("child: idem_store_close() of the parent's handle did not "
             "return (last step: %s)",
             fork_step_names[last]);
  EXPECT_RC(IDEM_OK, steps[FORK_OWN_OPEN].rc);
  EXPECT_RC(IDEM_OK, steps[FORK_OWN_CLAIM].rc);
  assert_int_equal(steps[FORK_OWN_CLAIM].value, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, steps[FORK_OWN_COMPLETE].rc);
  assert_int_equal(steps[FORK_OWN_COMPLETE].value, IDEM_STATE_COMPLETED);
  EXPECT_RC(IDEM_OK, steps[FORK_OWN_REPLAY].rc);
  assert_int_equal(steps[FORK_OWN_REPLAY].value, CHILD_TICKET);
  assert_false(hung);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);

  /* The parent's held claim and exec end as if nothing happened. */
  r = ticket_response(body, sizeof body, 2);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, held, &r));
  assert_int_equal(idem_call_state(held), IDEM_STATE_COMPLETED);
  idem_call_free(held);
  r = ticket_response(body, sizeof body, 3);
  EXPECT_RC(IDEM_OK, idem_execute_end(x, IDEM_EXEC_DONE, &r));
  assert_int_equal(idem_call_state(xc), IDEM_STATE_COMPLETED);
  assert_int_equal(ticket_id_of(idem_call_response(xc)), 3);
  idem_call_free(xc);
  /* A new key proceeds (not IN_FLIGHT) and completes; so does an execute,
   * whose lease the parent's scheduler still renews. */
  c = CLAIM(f->store, &after, fp, NULL, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  r = ticket_response(body, sizeof body, 4);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
  assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
  idem_call_free(c);
  a.next_ticket = 4;
  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute(f->store, &after_exec, REQ, strlen(REQ),
                                  count_ticket, &a, &o, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 5);
  idem_call_free(c);
  assert_int_equal(a.runs, 2);

  /* Every record is as its holder left it: the parent's, and the one the
   * child completed in its own store; nothing of the refused calls. */
  {
    const idem_id *ids[] = {&before, &held_id,    &exec_id,
                            &after,  &after_exec, &own_id};
    const int tickets[] = {1, 2, 3, 4, 5, CHILD_TICKET};
    for (int i = 0; i < 6; i++) {
      rec = get_record(f->store, ids[i]);
      assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
      assert_int_equal(rec->attempt, 1);
      assert_int_equal(ticket_id_of(&rec->response), tickets[i]);
      idem_record_free(rec);
      c = CLAIM(f->store, ids[i], fp, NULL, IDEM_REPLAY);
      assert_int_equal(ticket_id_of(idem_call_response(c)), tickets[i]);
      idem_call_free(c);
    }
  }
  assert_absent(f->store, &on_parents);
  assert_absent(f->store, &child_exec);
  assert_int_equal(list_count(f->store, NULL), 6);
  assert_int_equal(a.runs, 2);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      cmocka_unit_test(test_open_without_a_store_named),
      STORE_TEST(test_execute_refuses_request_fields),
      STORE_TEST(test_call_state_after_each_ending),
      STORE_TEST(test_execute_exact_numbers),
      STORE_TEST(test_store_refused_after_fork),
  };
  return run_engine_tests("api", both, sizeof both / sizeof both[0], NULL, 0,
                          NULL, 0);
}
