/*
 * test_clock.c -- leases against steps of the wall clock, on every store.
 *
 * The program is linked with clockshift.c, which steps this process's
 * CLOCK_REALTIME (and no other clock) when the test says: a step forward
 * or back, as an administrator's `date -s` or a bad NTP server makes. A
 * lease must mean the same after it: a holder keeps its key however far
 * the clock jumps forward, a dead holder's key is taken over when its
 * lease ends however far the clock jumps back, and retention does not end
 * because the clock jumped. Each scenario checks the outcomes, the
 * attempts and the ticket ids returned.
 */
#include "engine_harness.c"

#include <fcntl.h>

int clockshift_set(int64_t ms);

#define REQ "{\"title\":\"Clock step\",\"priority\":\"normal\"}"
#define STEP_FORWARD_MS (30 * 1000)
#define STEP_BACK_MS (-60 * 1000)

static char shift_file[] = "/tmp/idem-clockshift.XXXXXX";

static int64_t mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int setup_clock(void **state) {
  int rc = setup_store(state);
  clockshift_set(0);
  return rc;
}

static int teardown_clock(void **state) {
  clockshift_set(0);
  return teardown_store(state);
}

static idem_response ticket(char *body, size_t size, int id) {
  snprintf(body, size, "{\"ticket_id\":%d}", id);
  return (idem_response){201, TICKET_META, strlen(TICKET_META), body,
                         strlen(body)};
}

/* A second handle on the fixture's store: another caller, with its own
 * connections. */
static idem_store *second_handle(fixture *f) {
  idem_store *s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &s));
  return s;
}

/*
 * The clock steps 30 s forward while an action holds its key with a 6 s
 * lease: another caller is told the key is in flight (not that its lease
 * ended), the holder's lease is not lost, and its ticket is the one
 * replayed.
 */
static void test_step_forward_keeps_the_holder(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "clock-forward"};
  idem_execute_options o = {.call = {.lease_ms = 6000}};
  idem_store *other = second_handle(f);
  idem_exec *x = NULL;
  idem_call *held = NULL, *c;
  char fp[IDEM_FINGERPRINT_SIZE], body[64];
  idem_response r;

  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &id, REQ, strlen(REQ), &o,
                                        &x, &held));
  assert_non_null(x);
  assert_int_equal(idem_call_outcome(held), IDEM_PROCEED);
  assert_int_equal(clockshift_set(STEP_FORWARD_MS), 0);
  c = CLAIM(other, &id, fp, NULL, IDEM_IN_FLIGHT);
  assert_in_range(idem_call_retry_after_ms(c), 1, 6000);
  idem_call_free(c);
  assert_int_equal(idem_exec_lost(x), 0);
  r = ticket(body, sizeof body, 41);
  EXPECT_RC(IDEM_OK, idem_execute_end(x, IDEM_EXEC_DONE, &r));
  c = CLAIM(other, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 41);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(idem_call_recovered(c), 0);
  idem_call_free(c);
  idem_call_free(held);
  idem_store_close(other);
}

/*
 * A holder dies with a 1.5 s lease, then the clock steps 60 s back: its
 * key is taken over when the lease ends, not a minute later. The waiter
 * waits up to 20 s; it recovers (attempt 2) and its ticket is replayed.
 */
static void test_step_back_frees_a_dead_holders_key(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "clock-back"};
  idem_call_options dying = {.lease_ms = 1500};
  idem_call_options waits = {.wait_ms = 20000};
  idem_store *other = second_handle(f);
  idem_call *dead, *c = NULL;
  char fp[IDEM_FINGERPRINT_SIZE], body[64];
  idem_response r;

  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  dead = CLAIM(f->store, &id, fp, &dying, IDEM_PROCEED);
  assert_int_equal(clockshift_set(STEP_BACK_MS), 0);
  EXPECT_RC(IDEM_OK, idem_claim(other, &id, fp, &waits, &c));
  if (idem_call_outcome(c) != IDEM_RECOVER)
    fail_msg("after a step back, the dead holder's key was %s after 20 s",
             idem_outcome_name(idem_call_outcome(c)));
  assert_int_equal(idem_call_attempt(c), 2);
  r = ticket(body, sizeof body, 42);
  EXPECT_RC(IDEM_OK, idem_complete(other, c, &r));
  idem_call_free(c);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, dead, &r));
  idem_call_free(dead);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 42);
  assert_int_equal(idem_call_attempt(c), 2);
  assert_int_equal(idem_call_recovered(c), 1);
  idem_call_free(c);
  idem_store_close(other);
}

/*
 * The clock steps back while a key is held with renewals stopped by no
 * one: the holder's lease, renewed on, is never lost, and the steps back
 * and forth again leave its lease as it was: after the action, the key
 * replays its ticket at attempt 1.
 */
static void test_steps_while_renewing(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "clock-renewing"};
  idem_execute_options o = {.call = {.lease_ms = 900}};
  idem_store *other = second_handle(f);
  idem_exec *x = NULL;
  idem_call *held = NULL, *c;
  char fp[IDEM_FINGERPRINT_SIZE], body[64];
  idem_response r;
  int64_t t0 = mono_now();

  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  EXPECT_RC(IDEM_OK, idem_execute_begin(f->store, &id, REQ, strlen(REQ), &o,
                                        &x, &held));
  /* Three leases long: renewals run every 300 ms meanwhile, the clock
   * stepping back, then forward past where it was. */
  assert_int_equal(clockshift_set(STEP_BACK_MS), 0);
  while (mono_now() - t0 < 1300) {
    c = CLAIM(other, &id, fp, NULL, IDEM_IN_FLIGHT);
    idem_call_free(c);
    sleep_ms(50);
  }
  assert_int_equal(clockshift_set(STEP_FORWARD_MS), 0);
  while (mono_now() - t0 < 2700) {
    c = CLAIM(other, &id, fp, NULL, IDEM_IN_FLIGHT);
    idem_call_free(c);
    sleep_ms(50);
  }
  assert_int_equal(idem_exec_lost(x), 0);
  r = ticket(body, sizeof body, 43);
  EXPECT_RC(IDEM_OK, idem_execute_end(x, IDEM_EXEC_DONE, &r));
  c = CLAIM(other, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 43);
  assert_int_equal(idem_call_attempt(c), 1);
  idem_call_free(c);
  idem_call_free(held);
  idem_store_close(other);
}

/*
 * A completed record with a 2 s retention, then the clock steps an hour
 * forward: the record is kept (the same ticket replays, idem_get() finds
 * it, prune removes nothing), since its retention has not passed. Set
 * right again and past its retention in fact, the key acts anew. (On
 * PostgreSQL the server's clock decides, which this test does not step.)
 */
static void test_step_forward_keeps_retention(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "clock-retention"};
  idem_call_options brief = {.retention_ms = 2000};
  idem_call *c;
  idem_record *rec = NULL;
  char fp[IDEM_FINGERPRINT_SIZE], body[64];
  idem_response r;
  int64_t removed = -1, t0;

  EXPECT_RC(IDEM_OK, idem_fingerprint(REQ, strlen(REQ), 1, fp));
  c = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  r = ticket(body, sizeof body, 44);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
  idem_call_free(c);
  t0 = mono_now();
  assert_int_equal(clockshift_set(3600 * 1000), 0);
  c = CLAIM(f->store, &id, fp, &brief, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 44);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_get(f->store, &id, &rec));
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  idem_record_free(rec);
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 0);
  assert_int_equal(list_count(f->store, NULL), 1);
  /* The clock right again, and the retention over in fact. */
  assert_int_equal(clockshift_set(0), 0);
  while (mono_now() - t0 < 2100)
    sleep_ms(20);
  c = CLAIM(f->store, &id, fp, &brief, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

#define CLOCK_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_clock, teardown_clock)

int main(void) {
  const struct CMUnitTest both[] = {
      CLOCK_TEST(test_step_forward_keeps_the_holder),
      CLOCK_TEST(test_step_back_frees_a_dead_holders_key),
      CLOCK_TEST(test_steps_while_renewing),
      CLOCK_TEST(test_step_forward_keeps_retention),
  };
  int64_t zero = 0, rc;
  int fd = mkstemp(shift_file);
  if (fd < 0 || write(fd, &zero, sizeof zero) != (ssize_t)sizeof zero) {
    perror("clock shift file");
    return 1;
  }
  close(fd);
  setenv("IDEM_CLOCK_SHIFT_FILE", shift_file, 1);
  rc = run_engine_tests("clock", both, sizeof both / sizeof both[0], NULL, 0,
                        NULL, 0);
  unlink(shift_file);
  return (int)rc;
}
