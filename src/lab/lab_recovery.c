/*
 * lab_recovery.c -- suite "recovery": what the seeds do not test. A holder
 * stopped with SIGSTOP past its lease is taken over (RECOVER) and its late
 * completion is refused (STALE); retention expiry ends the protection (the
 * documented boundary); 64 processes race on 8 keys.
 */
#include "lab.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char payload[] = "{\"title\":\"Rotate the synthetic queue\"}";

/* Long enough that a loaded machine still makes its next call inside them:
 * the checks inside the lease and inside retention must not race the
 * clock. */
#define LEASE_MS 1500
#define RETENTION_MS 1000

static int fingerprint(char fp[IDEM_FINGERPRINT_SIZE]) {
  return idem_fingerprint(payload, strlen(payload), 1, fp);
}

static idem_response body_response(char *buf, size_t size, long long id,
                                   const char *holder) {
  idem_response r = {0};
  snprintf(buf, size, "{\"holder\":\"%s\",\"ticket_id\":%lld}", holder, id);
  r.status = 201;
  r.body = buf;
  r.body_len = strlen(buf);
  return r;
}

static long long json_ticket(const idem_response *r) {
  json_error_t e;
  json_t *v = r ? json_loadb(r->body, r->body_len, 0, &e) : NULL;
  long long id = v ? json_integer_value(json_object_get(v, "ticket_id")) : -1;
  json_decref(v);
  return id;
}

/*
 * The holder (a child process) claims with a short lease, acts, and is
 * stopped before it completes. The lease ends; the parent's claim recovers
 * it, acts and completes. The holder resumes and its completion is STALE.
 */
static void lease_and_stale(lab *L) {
  const char *n = "lease_expiry_recover";
  char url[512], fp[IDEM_FINGERPRINT_SIZE], buf[128];
  int up[2], down[2], status = 0;
  char c;
  idem_id id = {"lab", "create_ticket", "lease-holder-001"};
  if (lab_fresh_store(L, n, url, sizeof url) || fingerprint(fp) ||
      pipe(up) || pipe(down))
    return;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return;
  if (pid == 0) {
    idem_store *s = NULL;
    idem_call *call = NULL;
    idem_call_options o = {0};
    long long ticket = 0;
    char cbuf[128], rcname[64];
    close(up[0]);
    close(down[1]);
    o.lease_ms = LEASE_MS;
    if (idem_store_open(url, NULL, &s) != IDEM_OK ||
        idem_claim(s, &id, fp, &o, &call) != IDEM_OK ||
        idem_call_outcome(call) != IDEM_PROCEED)
      _exit(2);
    /* The action happens (a remote tool, say), then this process stops. */
    if (lab_db_insert_ticket_alone(url, payload, &ticket) != 0 ||
        write(up[1], "h", 1) != 1 || read(down[0], &c, 1) != 1)
      _exit(3);
    idem_response r = body_response(cbuf, sizeof cbuf, ticket, "first");
    int rc = idem_complete(s, call, &r);
    int len = snprintf(rcname, sizeof rcname, "%s", idem_rc_name(rc));
    if (write(up[1], rcname, (size_t)len) != len)
      _exit(4);
    idem_call_free(call);
    idem_store_close(s);
    _exit(0);
  }
  close(up[1]);
  close(down[0]);
  idem_store *s = NULL;
  idem_call *call = NULL, *during = NULL, *replay = NULL;
  long long ticket = 0;
  int outcome = 0, attempt = 0, in_flight = 0;
  int got = (int)read(up[0], &c, 1);
  kill(pid, SIGSTOP);
  lab_check(L, n, got == 1, "the holder claimed and acted");
  if (idem_store_open(url, NULL, &s) != IDEM_OK) {
    lab_check(L, n, 0, "open: %s", idem_errmsg());
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return;
  }
  /* Inside the lease the key is in flight. */
  if (idem_claim(s, &id, fp, NULL, &during) == IDEM_OK)
    in_flight = idem_call_outcome(during) == IDEM_IN_FLIGHT &&
                idem_call_retry_after_ms(during) > 0;
  lab_check(L, n, in_flight, "inside the holder's lease: IN_FLIGHT");
  lab_sleep_ms(LEASE_MS + 300);
  if (idem_claim(s, &id, fp, NULL, &call) == IDEM_OK) {
    outcome = idem_call_outcome(call);
    attempt = idem_call_attempt(call);
  }
  lab_check(L, n, outcome == IDEM_RECOVER && attempt == 2,
            "after the lease: RECOVER with attempt 2, saw %s attempt %d",
            idem_outcome_name(outcome), attempt);
  lab_db_insert_ticket_alone(url, payload, &ticket);
  idem_response r = body_response(buf, sizeof buf, ticket, "recoverer");
  lab_check(L, n, outcome == IDEM_RECOVER &&
                      idem_complete(s, call, &r) == IDEM_OK,
            "the recovering holder completes");
  long long tickets = lab_db_count_tickets(url);
  /* RECOVER says an earlier attempt may have acted: here it did. */
  lab_check(L, n, tickets == 2, "expected 2 tickets, saw %lld", tickets);
  lab_report(L, n, json_pack("{s:i,s:b,s:s,s:I}", "attempt", attempt,
                             "in_flight_during_lease", in_flight, "outcome",
                             idem_outcome_name(outcome), "tickets",
                             (json_int_t)tickets));

  /* The stopped holder resumes and tries to complete. */
  n = "stale_completion";
  char rcname[64] = "";
  kill(pid, SIGCONT);
  if (write(down[1], "g", 1) == 1) {
    ssize_t k = read(up[0], rcname, sizeof rcname - 1);
    rcname[k > 0 ? k : 0] = '\0';
  }
  waitpid(pid, &status, 0);
  close(up[0]);
  close(down[1]);
  lab_check(L, n, strcmp(rcname, "IDEM_ESTALE") == 0,
            "the stopped holder's completion is refused as STALE, saw '%s'",
            rcname);
  long long replayed = -1;
  if (idem_claim(s, &id, fp, NULL, &replay) == IDEM_OK &&
      idem_call_outcome(replay) == IDEM_REPLAY)
    replayed = json_ticket(idem_call_response(replay));
  lab_check(L, n, replayed == ticket,
            "the replay returns the recovering holder's ticket %lld, saw "
            "%lld",
            ticket, replayed);
  lab_report(L, n, json_pack("{s:s,s:I}", "late_completion", rcname,
                             "replayed_ticket_id", (json_int_t)replayed));
  idem_call_free(during);
  idem_call_free(call);
  idem_call_free(replay);
  idem_store_close(s);
}

typedef struct ticket_ctx {
  char body[64];
} ticket_ctx;

static int ticket_fn(void *conn, void *ctx, idem_response *r) {
  ticket_ctx *t = ctx;
  long long id = 0;
  if (lab_db_insert_ticket(conn, payload, &id) != 0)
    return 2;
  snprintf(t->body, sizeof t->body, "{\"ticket_id\":%lld}", id);
  r->status = 201;
  r->body = t->body;
  r->body_len = strlen(t->body);
  return 0;
}

static void retention_expiry(lab *L) {
  const char *n = "retention_expiry";
  char url[512], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *a = NULL, *b = NULL, *c = NULL;
  ticket_ctx t1, t2, t3;
  idem_id id = {"lab", "create_ticket", "short-retention-001"};
  idem_call_options o = {0};
  int before = 0, after = 0;
  if (lab_fresh_store(L, n, url, sizeof url) || fingerprint(fp) ||
      idem_store_open(url, NULL, &s) != IDEM_OK)
    return;
  o.retention_ms = RETENTION_MS;
  idem_execute_local(s, &id, fp, &o, ticket_fn, &t1, &a);
  idem_execute_local(s, &id, fp, &o, ticket_fn, &t2, &b);
  before = b ? (int)idem_call_outcome(b) : 0;
  lab_sleep_ms(RETENTION_MS + 300);
  idem_execute_local(s, &id, fp, &o, ticket_fn, &t3, &c);
  after = c ? (int)idem_call_outcome(c) : 0;
  long long tickets = lab_db_count_tickets(url);
  lab_check(L, n, before == IDEM_REPLAY,
            "inside retention the key replays, saw %s",
            idem_outcome_name(before));
  lab_check(L, n, after == IDEM_PROCEED && tickets == 2,
            "after retention the key acts again: expected PROCEED and 2 "
            "tickets, saw %s and %lld",
            idem_outcome_name(after), tickets);
  lab_report(L, n, json_pack("{s:s,s:s,s:I}", "inside_retention",
                             idem_outcome_name(before), "after_retention",
                             idem_outcome_name(after), "tickets",
                             (json_int_t)tickets));
  idem_call_free(a);
  idem_call_free(b);
  idem_call_free(c);
  idem_store_close(s);
}

#define PROCS 64
#define KEYS 8

static void many_processes(lab *L) {
  const char *n = "many_processes_few_keys";
  char url[512];
  int go[2], out[2], started = 0, lines = 0;
  pid_t pids[PROCS];
  long long first[KEYS];
  int consistent[KEYS];
  if (lab_fresh_store(L, n, url, sizeof url) || pipe(go) || pipe(out))
    return;
  fflush(NULL);
  for (int i = 0; i < PROCS; i++) {
    pids[i] = fork();
    if (pids[i] == 0) {
      char key[64], fp[IDEM_FINGERPRINT_SIZE], line[128], c;
      idem_store *s = NULL;
      idem_call *call = NULL;
      ticket_ctx t;
      long long ticket = -1;
      close(go[1]);
      close(out[0]);
      snprintf(key, sizeof key, "fanout-key-%d", i % KEYS);
      if (read(go[0], &c, 1) != 1 || fingerprint(fp) != IDEM_OK)
        _exit(2);
      idem_id id = {"lab", "create_ticket", key};
      if (idem_store_open(url, NULL, &s) == IDEM_OK &&
          idem_execute_local(s, &id, fp, NULL, ticket_fn, &t, &call) ==
              IDEM_OK &&
          (idem_call_outcome(call) == IDEM_PROCEED ||
           idem_call_outcome(call) == IDEM_REPLAY))
        ticket = json_ticket(idem_call_response(call));
      else
        fprintf(stderr, "idem lab: process %d: %s\n", i, idem_errmsg());
      int len = snprintf(line, sizeof line, "%d %lld\n", i % KEYS, ticket);
      if (write(out[1], line, (size_t)len) != len)
        _exit(3);
      idem_call_free(call);
      idem_store_close(s);
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
  for (int k = 0; k < KEYS; k++) {
    first[k] = -1;
    consistent[k] = 1;
  }
  FILE *f = fdopen(out[0], "r");
  int k;
  long long t;
  while (f && fscanf(f, "%d %lld", &k, &t) == 2) {
    lines++;
    if (k < 0 || k >= KEYS || t < 1)
      continue;
    if (first[k] < 0)
      first[k] = t;
    else if (first[k] != t)
      consistent[k] = 0;
  }
  if (f)
    fclose(f);
  for (int i = 0; i < PROCS; i++)
    if (pids[i] > 0)
      waitpid(pids[i], NULL, 0);
  int ok_keys = 0;
  for (k = 0; k < KEYS; k++)
    ok_keys += consistent[k] && first[k] > 0;
  long long tickets = lab_db_count_tickets(url);
  long long records = lab_count_records(url);
  lab_check(L, n, lines == PROCS, "expected %d answers, saw %d", PROCS,
            lines);
  lab_check(L, n, tickets == KEYS && records == KEYS,
            "expected %d tickets and %d records, saw %lld and %lld", KEYS,
            KEYS, tickets, records);
  lab_check(L, n, ok_keys == KEYS,
            "expected every response to match its key's first; %d of %d "
            "keys did",
            ok_keys, KEYS);
  lab_report(L, n, json_pack("{s:i,s:i,s:I,s:i}", "processes", PROCS, "keys",
                             KEYS, "tickets", (json_int_t)tickets,
                             "keys_with_one_response", ok_keys));
}

int lab_suite_recovery(lab *L) {
  lease_and_stale(L);
  retention_expiry(L);
  many_processes(L);
  return 0;
}
