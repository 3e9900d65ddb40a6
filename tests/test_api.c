/*
 * test_api.c -- the header's rules as a new C user reads them: no store is
 * made unasked, idem_execute() refuses request fields it would ignore and
 * leaves *out NULL when its action never ran, the record's state after an
 * ending is readable apart from the claim's outcome, and
 * IDEM_EXEC_LEAVE_IN_PROGRESS (0.2's IDEM_EXEC_ABANDON) leaves the record
 * in progress and held. Every backend.
 */
#include "engine_harness.c"

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

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      cmocka_unit_test(test_open_without_a_store_named),
      STORE_TEST(test_execute_refuses_request_fields),
      STORE_TEST(test_call_state_after_each_ending),
      STORE_TEST(test_execute_exact_numbers),
  };
  return run_engine_tests("api", both, sizeof both / sizeof both[0], NULL, 0,
                          NULL, 0);
}
