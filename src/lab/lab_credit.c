/*
 * lab_credit.c -- suite "account-credit": the idempotency example's six
 * tests and its scenario output, run against the real engine. A five-unit
 * credit to a synthetic account commits together with its idem record; the
 * writer that loses its response is a real child process, which exits, or
 * is killed with SIGKILL right after (or right before) its commit.
 */
#include "lab.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char op_key[] = "credit-account-1-0001";

typedef struct credit_action {
  const char *tenant;
  const char *account;
  long long amount;
  int stop_before_commit; /* fd to tell the parent, then wait for SIGKILL */
  char body[160];
} credit_action;

static int credit_fn(void *conn, void *ctx, idem_response *r) {
  credit_action *a = ctx;
  long long balance = 0, version = 0;
  int rc = lab_db_credit(conn, a->tenant, a->account, a->amount, &balance,
                         &version);
  if (rc != 0)
    return rc == 1 ? 1 : 2; /* 1: no such account, a domain rejection */
  if (a->stop_before_commit > 0) {
    /* The credit is applied but not committed: tell the parent, which
     * kills this process now. */
    if (write(a->stop_before_commit, "m", 1) != 1)
      _exit(3);
    for (;;)
      pause();
  }
  snprintf(a->body, sizeof a->body,
           "{\"account\":\"%s\",\"balance\":%lld,\"version\":%lld}",
           a->account, balance, version);
  r->status = 200;
  r->body = a->body;
  r->body_len = strlen(a->body);
  return 0;
}

enum credit_seen { C_OK, C_CONFLICT, C_REJECTED, C_ERROR };

/* One credit request on a new store handle. *result receives the response
 * body (a JSON object) on C_OK; the caller decrefs it. */
static enum credit_seen credit(const char *url, const char *tenant,
                               const char *key, const char *account,
                               long long amount, int stop_fd,
                               json_t **result) {
  idem_store *s = NULL;
  idem_call *call = NULL;
  credit_action a;
  char request[256], fp[IDEM_FINGERPRINT_SIZE];
  enum credit_seen seen = C_ERROR;
  int rc;

  *result = NULL;
  memset(&a, 0, sizeof a);
  a.tenant = tenant;
  a.account = account;
  a.amount = amount;
  a.stop_before_commit = stop_fd;
  snprintf(request, sizeof request, "{\"account\":\"%s\",\"amount\":%lld}",
           account, amount);
  if (idem_fingerprint(request, strlen(request), 1, fp) != IDEM_OK ||
      idem_store_open(url, NULL, &s) != IDEM_OK) {
    fprintf(stderr, "idem lab: credit: %s\n", idem_errmsg());
    return C_ERROR;
  }
  idem_id id = {tenant, "credit_account", key};
  rc = idem_execute_local(s, &id, fp, NULL, credit_fn, &a, &call);
  if (rc == IDEM_EREJECTED) {
    seen = C_REJECTED;
  } else if (rc != IDEM_OK) {
    fprintf(stderr, "idem lab: credit: %s\n", idem_errmsg());
  } else if (idem_call_outcome(call) == IDEM_CONFLICT) {
    seen = C_CONFLICT;
  } else if (idem_call_outcome(call) == IDEM_PROCEED ||
             idem_call_outcome(call) == IDEM_REPLAY) {
    const idem_response *resp = idem_call_response(call);
    json_error_t e;
    *result = json_loadb(resp->body, resp->body_len, 0, &e);
    seen = *result ? C_OK : C_ERROR;
  }
  idem_call_free(call);
  idem_store_close(s);
  return seen;
}

static int fresh_with_accounts(lab *L, const char *name, char *url,
                               size_t size) {
  if (lab_fresh_store(L, name, url, size) != 0)
    return -1;
  if (lab_db_open_account(url, "alpha", "account-1") != 0 ||
      lab_db_open_account(url, "beta", "account-1") != 0) {
    lab_check(L, name, 0, "cannot open the synthetic accounts");
    return -1;
  }
  return 0;
}

static json_t *expected_result(long long balance, long long version) {
  return json_pack("{s:s,s:I,s:I}", "account", "account-1", "balance",
                   (json_int_t)balance, "version", (json_int_t)version);
}

/* How the writer process ends. */
enum writer_end { EXITS_AFTER_COMMIT, KILLED_AFTER_COMMIT,
                  KILLED_BEFORE_COMMIT };

/*
 * Runs the alpha credit in a child process that never returns its result.
 * Returns the number of result bytes the parent received from it (0: the
 * response was lost, as intended), or -1 on a failure to run it.
 */
static int run_writer(const char *url, enum writer_end end) {
  int fds[2];
  pid_t pid;
  char buf[8];
  int status = 0;
  ssize_t got;
  if (pipe(fds) != 0)
    return -1;
  fflush(NULL);
  pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    json_t *result = NULL;
    close(fds[0]);
    enum credit_seen seen =
        credit(url, "alpha", op_key, "account-1", 5,
               end == KILLED_BEFORE_COMMIT ? fds[1] : 0, &result);
    /* Committed. The response is lost: nothing goes back to the parent. */
    if (end == KILLED_AFTER_COMMIT) {
      if (write(fds[1], "c", 1) != 1)
        _exit(3);
      for (;;)
        pause();
    }
    _exit(seen == C_OK ? 0 : 1);
  }
  close(fds[1]);
  if (end == EXITS_AFTER_COMMIT) {
    got = read(fds[0], buf, sizeof buf);
    waitpid(pid, &status, 0);
    close(fds[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return -1;
    return (int)got;
  }
  /* Wait for the signal that the child is at the point of interest, then
   * kill it there. */
  got = read(fds[0], buf, 1);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  close(fds[0]);
  if (got != 1 || !WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
    return -1;
  return 0;
}

static void writer_scenario(lab *L, const char *n, enum writer_end end) {
  char url[512];
  json_t *result = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  int got = run_writer(url, end);
  lab_check(L, n, got == 0,
            "the writer process ends without returning a result (saw %d)",
            got);
  long long bal_before = lab_db_balance(url, "alpha", "account-1");
  long long ops_before = lab_count_records(url);
  if (end == KILLED_BEFORE_COMMIT)
    lab_check(L, n, bal_before == 0 && ops_before == 0,
              "killed before its commit, nothing remains: expected balance "
              "0 and 0 operations, saw %lld and %lld",
              bal_before, ops_before);
  else
    lab_check(L, n, bal_before == 5 && ops_before == 1,
              "committed before the loss: expected balance 5 and 1 "
              "operation, saw %lld and %lld",
              bal_before, ops_before);
  enum credit_seen seen =
      credit(url, "alpha", op_key, "account-1", 5, 0, &result);
  json_t *want = expected_result(5, 1);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  long long ops = lab_count_records(url);
  lab_check(L, n, seen == C_OK && json_equal(result, want),
            "the retry returns account-1, balance 5, version 1");
  lab_check(L, n, bal == 5 && ops == 1,
            "expected balance 5 and 1 operation, saw %lld and %lld", bal,
            ops);
  json_decref(want);
  lab_report(L, n, json_pack("{s:I,s:I,s:I,s:o}", "balance_before_retry",
                             (json_int_t)bal_before, "balance",
                             (json_int_t)bal, "operations", (json_int_t)ops,
                             "recovered_result",
                             result ? result : json_null()));
}

#define DUPLICATES 16

typedef struct dup_caller {
  const char *url;
  pthread_barrier_t *barrier;
  enum credit_seen seen;
  json_t *result;
} dup_caller;

static void *dup_thread(void *arg) {
  dup_caller *d = arg;
  pthread_barrier_wait(d->barrier);
  d->seen = credit(d->url, "alpha", op_key, "account-1", 5, 0, &d->result);
  return NULL;
}

static void sixteen_duplicates(lab *L) {
  const char *n = "sixteen_concurrent_duplicates";
  char url[512];
  pthread_t t[DUPLICATES];
  dup_caller d[DUPLICATES];
  pthread_barrier_t barrier;
  int same = 0;
  json_t *want = expected_result(5, 1);
  if (fresh_with_accounts(L, n, url, sizeof url)) {
    json_decref(want);
    return;
  }
  pthread_barrier_init(&barrier, NULL, DUPLICATES);
  for (int i = 0; i < DUPLICATES; i++) {
    d[i] = (dup_caller){url, &barrier, C_ERROR, NULL};
    pthread_create(&t[i], NULL, dup_thread, &d[i]);
  }
  for (int i = 0; i < DUPLICATES; i++) {
    pthread_join(t[i], NULL);
    same += d[i].seen == C_OK && json_equal(d[i].result, want);
    json_decref(d[i].result);
  }
  pthread_barrier_destroy(&barrier);
  json_decref(want);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  long long ops = lab_count_records(url);
  lab_check(L, n, same == DUPLICATES,
            "expected all %d callers to get balance 5, version 1; %d did",
            DUPLICATES, same);
  lab_check(L, n, bal == 5 && ops == 1,
            "expected one five-unit mutation and 1 operation, saw balance "
            "%lld and %lld operations",
            bal, ops);
  lab_report(L, n, json_pack("{s:i,s:I,s:I,s:i}", "callers", DUPLICATES,
                             "balance", (json_int_t)bal, "operations",
                             (json_int_t)ops, "identical_results", same));
}

/* The same with sixteen processes, each with its own connection. */
static void sixteen_processes(lab *L) {
  const char *n = "sixteen_concurrent_processes";
  char url[512];
  pid_t pids[DUPLICATES];
  int go[2], out[2], same = 0, started = 0;
  json_t *want = expected_result(5, 1);
  if (fresh_with_accounts(L, n, url, sizeof url) || pipe(go) || pipe(out)) {
    json_decref(want);
    return;
  }
  fflush(NULL);
  for (int i = 0; i < DUPLICATES; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      char c, line[256];
      json_t *result = NULL;
      close(go[1]);
      close(out[0]);
      if (read(go[0], &c, 1) != 1) /* all start together */
        _exit(3);
      enum credit_seen seen =
          credit(url, "alpha", op_key, "account-1", 5, 0, &result);
      char *text = result ? json_dumps(result, JSON_SORT_KEYS | JSON_COMPACT)
                          : NULL;
      int len = snprintf(line, sizeof line, "%s\n",
                         seen == C_OK && text ? text : "error");
      /* One write below PIPE_BUF is atomic: lines never interleave. */
      if (write(out[1], line, (size_t)len) != len)
        _exit(4);
      _exit(0);
    }
    if (pids[i] > 0)
      started++;
  }
  close(go[0]);
  close(out[1]);
  for (int i = 0; i < started; i++)
    if (write(go[1], "g", 1) != 1)
      break;
  close(go[1]);
  FILE *f = fdopen(out[0], "r");
  char line[256];
  while (f && fgets(line, sizeof line, f)) {
    json_error_t e;
    json_t *got = json_loads(line, 0, &e);
    same += got && json_equal(got, want);
    json_decref(got);
  }
  if (f)
    fclose(f);
  for (int i = 0; i < DUPLICATES; i++)
    if (pids[i] > 0)
      waitpid(pids[i], NULL, 0);
  json_decref(want);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  long long ops = lab_count_records(url);
  lab_check(L, n, same == DUPLICATES,
            "expected all %d processes to get balance 5, version 1; %d did",
            DUPLICATES, same);
  lab_check(L, n, bal == 5 && ops == 1,
            "expected one five-unit mutation and 1 operation, saw balance "
            "%lld and %lld operations",
            bal, ops);
  lab_report(L, n, json_pack("{s:i,s:I,s:I,s:i}", "processes", DUPLICATES,
                             "balance", (json_int_t)bal, "operations",
                             (json_int_t)ops, "identical_results", same));
}

static void conflicting_payload(lab *L) {
  const char *n = "conflicting_payload";
  char url[512];
  json_t *r1 = NULL, *r2 = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  credit(url, "alpha", op_key, "account-1", 5, 0, &r1);
  enum credit_seen seen =
      credit(url, "alpha", op_key, "account-1", 8, 0, &r2);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  lab_check(L, n, seen == C_CONFLICT, "the eight-unit payload is rejected");
  lab_check(L, n, bal == 5, "expected balance 5, saw %lld", bal);
  json_decref(r1);
  json_decref(r2);
  lab_report(L, n, json_pack("{s:I,s:b,s:I}", "balance", (json_int_t)bal,
                             "rejected", seen == C_CONFLICT, "operations",
                             (json_int_t)lab_count_records(url)));
}

static void tenant_scope(lab *L) {
  const char *n = "tenant_scope";
  char url[512];
  json_t *a = NULL, *b = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  credit(url, "alpha", op_key, "account-1", 5, 0, &a);
  credit(url, "beta", op_key, "account-1", 7, 0, &b);
  long long alpha = lab_db_balance(url, "alpha", "account-1");
  long long beta = lab_db_balance(url, "beta", "account-1");
  long long ops = lab_count_records(url);
  json_t *wa = expected_result(5, 1), *wb = expected_result(7, 1);
  lab_check(L, n, json_equal(a, wa) && json_equal(b, wb),
            "alpha gets balance 5 and beta balance 7 from the same key");
  lab_check(L, n, alpha == 5 && beta == 7 && ops == 2,
            "expected alpha 5, beta 7, 2 operations; saw %lld, %lld, %lld",
            alpha, beta, ops);
  json_decref(a);
  json_decref(b);
  json_decref(wa);
  json_decref(wb);
  lab_report(L, n, json_pack("{s:I,s:I,s:I}", "alpha_balance",
                             (json_int_t)alpha, "beta_balance",
                             (json_int_t)beta, "operations",
                             (json_int_t)ops));
}

static void rejected_account(lab *L) {
  const char *n = "rejected_account";
  char url[512];
  json_t *r = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  enum credit_seen seen =
      credit(url, "alpha", op_key, "account-closed", 5, 0, &r);
  long long ops = lab_count_records(url);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  long long missing = lab_db_balance(url, "alpha", "account-closed");
  lab_check(L, n, seen == C_REJECTED, "the unknown account is rejected");
  lab_check(L, n, ops == 0 && bal == 0 && missing == -2,
            "expected no operation and no mutation, saw %lld operations, "
            "balance %lld",
            ops, bal);
  json_decref(r);
  lab_report(L, n, json_pack("{s:I,s:b,s:I}", "mutations",
                             (json_int_t)(bal != 0 || missing != -2),
                             "rejected", seen == C_REJECTED, "operations",
                             (json_int_t)ops));
}

static void new_intent(lab *L) {
  const char *n = "new_intent";
  char url[512];
  json_t *a = NULL, *b = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  credit(url, "alpha", op_key, "account-1", 5, 0, &a);
  credit(url, "alpha", "credit-account-1-0002", "account-1", 5, 0, &b);
  long long bal = lab_db_balance(url, "alpha", "account-1");
  long long ops = lab_count_records(url);
  json_t *wa = expected_result(5, 1), *wb = expected_result(10, 2);
  lab_check(L, n, json_equal(a, wa) && json_equal(b, wb),
            "the new key performs a second credit (balance 10, version 2)");
  lab_check(L, n, bal == 10 && ops == 2,
            "expected balance 10 and 2 operations, saw %lld and %lld", bal,
            ops);
  json_decref(wa);
  json_decref(wb);
  json_decref(a);
  lab_report(L, n, json_pack("{s:I,s:I,s:o}", "balance", (json_int_t)bal,
                             "operations", (json_int_t)ops, "second_result",
                             b ? b : json_null()));
}

/* The example's own scenario, in one database, as it publishes it. */
static void scenario_output(lab *L) {
  const char *n = "scenario_output";
  char url[512];
  json_t *recovered = NULL, *conflict = NULL, *beta = NULL;
  if (fresh_with_accounts(L, n, url, sizeof url))
    return;
  lab_check(L, n, run_writer(url, EXITS_AFTER_COMMIT) == 0,
            "the writer process exits after its commit without a result");
  credit(url, "alpha", op_key, "account-1", 5, 0, &recovered);
  json_t *after_retry = json_pack(
      "{s:I,s:I,s:I}", "alpha_balance",
      (json_int_t)lab_db_balance(url, "alpha", "account-1"), "beta_balance",
      (json_int_t)lab_db_balance(url, "beta", "account-1"), "operations",
      (json_int_t)lab_count_records(url));
  enum credit_seen c = credit(url, "alpha", op_key, "account-1", 8, 0,
                              &conflict);
  credit(url, "beta", op_key, "account-1", 7, 0, &beta);
  json_t *after_tenant = json_pack(
      "{s:I,s:I,s:I}", "alpha_balance",
      (json_int_t)lab_db_balance(url, "alpha", "account-1"), "beta_balance",
      (json_int_t)lab_db_balance(url, "beta", "account-1"), "operations",
      (json_int_t)lab_count_records(url));
  json_t *want_retry = json_pack("{s:i,s:i,s:i}", "alpha_balance", 5,
                                 "beta_balance", 0, "operations", 1);
  json_t *want_tenant = json_pack("{s:i,s:i,s:i}", "alpha_balance", 5,
                                  "beta_balance", 7, "operations", 2);
  json_t *want_result = expected_result(5, 1);
  lab_check(L, n, json_equal(after_retry, want_retry),
            "after the retry: alpha 5, beta 0, 1 operation");
  lab_check(L, n, json_equal(after_tenant, want_tenant),
            "after the distinct tenant: alpha 5, beta 7, 2 operations");
  lab_check(L, n, c == C_CONFLICT, "the conflicting payload is rejected");
  lab_check(L, n, json_equal(recovered, want_result),
            "the recovered result is account-1, balance 5, version 1");
  json_decref(want_retry);
  json_decref(want_tenant);
  json_decref(want_result);
  json_decref(conflict);
  json_decref(beta);
  lab_report(L, n,
             json_pack("{s:o,s:o,s:b,s:s,s:o}", "after_distinct_tenant",
                       after_tenant, "after_retry", after_retry,
                       "conflicting_payload_rejected", c == C_CONFLICT,
                       "fixture",
                       L->pg ? "synthetic local PostgreSQL transaction"
                             : "synthetic local SQLite transaction",
                       "recovered_result",
                       recovered ? recovered : json_null()));
}

int lab_suite_credit(lab *L) {
  writer_scenario(L, "writer_exits_after_commit", EXITS_AFTER_COMMIT);
  writer_scenario(L, "writer_killed_after_commit", KILLED_AFTER_COMMIT);
  writer_scenario(L, "writer_killed_before_commit", KILLED_BEFORE_COMMIT);
  sixteen_duplicates(L);
  sixteen_processes(L);
  conflicting_payload(L);
  tenant_scope(L);
  rejected_account(L);
  new_intent(L);
  scenario_output(L);
  return 0;
}
