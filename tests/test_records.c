/*
 * test_records.c -- retention, the operators' view (get, list, prune,
 * resolve), tenants, local actions that fail or end their transaction, and
 * sizes.
 * One suite for every backend; IDEM_TEST_STORE selects it (see
 * engine_harness.c).
 */
#include "engine_harness.c"

/* ------------------------------------------------------------------ */
/* Retention                                                            */
/* ------------------------------------------------------------------ */

/* The retention a record was given, found even when it already expired. */
typedef struct retention_of {
  const char *key;
  int found;
  int64_t retention_ms;
} retention_of;

static int retention_cb(const idem_record *r, void *ctx) {
  retention_of *w = ctx;
  if (strcmp(r->key, w->key) == 0) {
    w->found++;
    w->retention_ms = r->expires_ms - r->updated_ms;
  }
  return 0;
}

static void test_retention_expiry_boundary(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id kept = {"tenant-a", OPERATION, "kept-longer"};
  idem_id other = {"tenant-a", OPERATION, "other-payload"};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_call_options longer = {.retention_ms = 60000};
  idem_filter with_expired = {.expired = 1};
  retention_of w = {KEY, 0, 0};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                a3 = {.payload = PAYLOAD}, a4 = {.payload = PAYLOAD},
                a5 = {.payload = PAYLOAD}, a6 = {.payload = PAYLOAD_URGENT};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  c = LOCAL(f->store, &id, fp, &keep, &a1, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  c = LOCAL(f->store, &kept, fp, &longer, &a2, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  c = LOCAL(f->store, &other, fp, &keep, &a4, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_list(f->store, &with_expired, retention_cb, &w));
  assert_int_equal(w.found, 1);
  assert_int_equal(w.retention_ms, SHORT_MS);

  sleep_ms(PAST_SHORT_MS);
  /* The control: kept longer, it still replays after the same wait. */
  c = LOCAL(f->store, &kept, fp, &longer, &a5, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  /* The documented boundary: once the record is gone, the same key and
   * payload act a second time. */
  assert_absent(f->store, &id);
  assert_int_equal(list_count(f->store, NULL), 1);
  assert_int_equal(list_count(f->store, &with_expired), 3);
  c = LOCAL(f->store, &id, fp, NULL, &a3, IDEM_PROCEED);
  assert_int_equal(a3.runs, 1);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 4);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 4);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 4);
  idem_call_free(c);
  /* An expired record conflicts with nothing either. */
  c = LOCAL(f->store, &other, fp2, NULL, &a6, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 5);
  idem_call_free(c);
  assert_int_equal(a5.runs, 0);
  assert_int_equal(count_tickets(f->url), 5);
}

static void test_prune(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id exp1 = {"tenant-a", OPERATION, "expires-1"};
  idem_id exp2 = {"tenant-b", OPERATION, "expires-2"};
  idem_id live = {"tenant-a", OPERATION, "live"};
  idem_id held = {"tenant-a", OPERATION, "held"};
  idem_call_options keep = {.retention_ms = SHORT_MS};
  idem_call_options held_opts = {.retention_ms = SHORT_MS, .lease_ms = 10000};
  idem_filter with_expired = {.expired = 1};
  idem_response resp = {200, NULL, 0, "done", 4};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                a3 = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c, *h;
  int64_t removed = -1;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &exp1, fp, &keep, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &exp2, fp, &keep, &a2, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &live, fp, NULL, &a3, IDEM_PROCEED);
  idem_call_free(c);
  /* Retention shorter than the lease: the holder is acting right now, so
   * its record must stay. */
  h = CLAIM(f->store, &held, fp, &held_opts, IDEM_PROCEED);

  sleep_ms(PAST_SHORT_MS);

  assert_int_equal(list_count(f->store, NULL), 2);
  assert_int_equal(list_count(f->store, &with_expired), 4);
  removed = -1;
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 2);
  assert_int_equal(list_count(f->store, &with_expired), 2);
  assert_absent(f->store, &exp1);
  assert_absent(f->store, &exp2);
  rec = get_record(f->store, &live);
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  idem_record_free(rec);
  rec = get_record(f->store, &held);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  idem_record_free(rec);
  removed = -1;
  EXPECT_RC(IDEM_OK, idem_prune(f->store, &removed));
  assert_int_equal(removed, 0);
  EXPECT_RC(IDEM_OK, idem_prune(f->store, NULL));
  /* The holder was not disturbed by pruning. */
  EXPECT_RC(IDEM_OK, idem_complete(f->store, h, &resp));
  idem_call_free(h);
  c = CLAIM(f->store, &live, fp, NULL, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
  idem_call_free(c);
  /* Pruning forgets records; it never undoes side effects. */
  assert_int_equal(count_tickets(f->url), 3);
}

/* ------------------------------------------------------------------ */
/* Operators' view                                                      */
/* ------------------------------------------------------------------ */

static void test_get_returns_record_fields(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id big = {"tenant-a", OPERATION, "big-request"};
  idem_id edge = {"tenant-a", OPERATION, "edge-request"};
  idem_call_options opts = {.lease_ms = 5000,
                            .retention_ms = 60000,
                            .request = PAYLOAD,
                            .request_len = strlen(PAYLOAD)};
  static const unsigned char body[] = {'o', 'k', '\0', 0xfe};
  idem_response resp = {201, TICKET_META, strlen(TICKET_META), body,
                        sizeof body};
  idem_record *rec, *rec2;
  idem_call *c;
  unsigned char *request;
  int64_t t0, t1, t2;
  fp_of(PAYLOAD, fp);

  t0 = now_ms();
  c = CLAIM(f->store, &id, fp, &opts, IDEM_PROCEED);
  t1 = now_ms();
  rec = get_record(f->store, &id);
  assert_string_equal(rec->tenant, "tenant-a");
  assert_string_equal(rec->operation, OPERATION);
  assert_string_equal(rec->key, KEY);
  assert_string_equal(rec->fingerprint, fp);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->attempt, 1);
  assert_in_range(rec->created_ms, t0, t1);
  assert_int_equal(rec->updated_ms, rec->created_ms);
  /* The SQLite store's leases are on the boot-time clock, shown in Unix
   * ms: a millisecond of rounding either way. */
  assert_in_range(rec->lease_expires_ms, rec->created_ms + 5000 - 1,
                  rec->created_ms + 5000 + 1);
  assert_int_equal(rec->expires_ms, rec->created_ms + 60000);
  assert_int_equal(rec->request_len, strlen(PAYLOAD));
  assert_memory_equal(rec->request, PAYLOAD, strlen(PAYLOAD));
  assert_int_equal(rec->has_response, 0);

  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  t2 = now_ms();
  idem_call_free(c);
  rec2 = get_record(f->store, &id);
  assert_int_equal(rec2->state, IDEM_STATE_COMPLETED);
  assert_int_equal(rec2->attempt, 1);
  assert_int_equal(rec2->created_ms, rec->created_ms);
  assert_in_range(rec2->updated_ms, rec->created_ms, t2);
  assert_int_equal(rec2->lease_expires_ms, 0);
  assert_int_equal(rec2->expires_ms, rec2->updated_ms + 60000);
  assert_int_equal(rec2->request_len, strlen(PAYLOAD));
  assert_memory_equal(rec2->request, PAYLOAD, strlen(PAYLOAD));
  assert_int_equal(rec2->has_response, 1);
  assert_response_equal(&rec2->response, &resp);
  idem_record_free(rec);
  idem_record_free(rec2);

  /* The request is kept up to 64 KiB; a larger one is not kept at all. */
  request = malloc(65537);
  assert_non_null(request);
  for (size_t i = 0; i < 65537; i++)
    request[i] = (unsigned char)(i % 251);
  opts.request = request;
  opts.request_len = 65537;
  c = CLAIM(f->store, &big, fp, &opts, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &big);
  assert_int_equal(rec->request_len, 0);
  assert_null(rec->request);
  idem_record_free(rec);
  opts.request_len = 65536;
  c = CLAIM(f->store, &edge, fp, &opts, IDEM_PROCEED);
  idem_call_free(c);
  rec = get_record(f->store, &edge);
  assert_int_equal(rec->request_len, 65536);
  assert_memory_equal(rec->request, request, 65536);
  idem_record_free(rec);
  free(request);

  {
    idem_id absent = {"tenant-a", OPERATION, "absent"};
    idem_id other_tenant = {"tenant-b", OPERATION, KEY};
    idem_id other_op = {"tenant-a", "POST /other", KEY};
    assert_absent(f->store, &absent);
    assert_absent(f->store, &other_tenant);
    assert_absent(f->store, &other_op);
  }
}

#define LIST_MAX 16

typedef struct listing {
  int n;
  char rows[LIST_MAX][128];
  int stop_after; /* return 42 after this many rows; 0 = never */
} listing;

static int collect_cb(const idem_record *r, void *ctx) {
  listing *l = ctx;
  if (l->n < LIST_MAX)
    snprintf(l->rows[l->n], sizeof l->rows[0], "%s|%s|%s|%s", r->tenant,
             r->operation, r->key, idem_state_name(r->state));
  l->n++;
  if (l->stop_after && l->n >= l->stop_after)
    return 42;
  return 0;
}

static listing list_of(idem_store *s, const idem_filter *filter) {
  listing l;
  memset(&l, 0, sizeof l);
  EXPECT_RC(IDEM_OK, idem_list(s, filter, collect_cb, &l));
  return l;
}

static void test_list_filters(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id ids[5] = {{"t1", OPERATION, "k1"},
                    {"t1", OPERATION, "k2"},
                    {"t2", OPERATION, "k1"},
                    {"t2", OPERATION, "k3"},
                    {"t2", "POST /other", "k4"}};
  idem_response resp = {200, NULL, 0, "ok", 2};
  idem_call *held = NULL, *c;
  listing l;
  fp_of(PAYLOAD, fp);

  for (int i = 0; i < 5; i++) {
    c = CLAIM(f->store, &ids[i], fp, NULL, IDEM_PROCEED);
    if (i == 1)
      held = c; /* stays in progress */
    else if (i == 3)
      EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
    else
      EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
    if (i != 1)
      idem_call_free(c);
    sleep_ms(3); /* distinct creation times: the listing is oldest first */
  }

  l = list_of(f->store, NULL);
  assert_int_equal(l.n, 5);
  assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
  assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  assert_string_equal(l.rows[2], "t2|" OPERATION "|k1|completed");
  assert_string_equal(l.rows[3], "t2|" OPERATION "|k3|unknown");
  assert_string_equal(l.rows[4], "t2|POST /other|k4|completed");
  {
    idem_filter t1 = {.tenant = "t1"};
    l = list_of(f->store, &t1);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter done = {.state = IDEM_STATE_COMPLETED};
    l = list_of(f->store, &done);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t2|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[2], "t2|POST /other|k4|completed");
  }
  {
    idem_filter t2_unknown = {.tenant = "t2", .state = IDEM_STATE_UNKNOWN};
    l = list_of(f->store, &t2_unknown);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.rows[0], "t2|" OPERATION "|k3|unknown");
  }
  {
    idem_filter in_progress = {.state = IDEM_STATE_IN_PROGRESS};
    l = list_of(f->store, &in_progress);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter t2_op = {.tenant = "t2", .operation = OPERATION};
    l = list_of(f->store, &t2_op);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t2|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t2|" OPERATION "|k3|unknown");
  }
  {
    idem_filter limit = {.limit = 2};
    l = list_of(f->store, &limit);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.rows[0], "t1|" OPERATION "|k1|completed");
    assert_string_equal(l.rows[1], "t1|" OPERATION "|k2|in_progress");
  }
  {
    idem_filter nobody = {.tenant = "nobody"};
    assert_int_equal(list_count(f->store, &nobody), 0);
  }
  {
    idem_filter empty_tenant = {.tenant = ""};
    assert_int_equal(list_count(f->store, &empty_tenant), 0);
  }
  /* A non-zero return stops the listing and is returned. */
  memset(&l, 0, sizeof l);
  l.stop_after = 1;
  assert_int_equal(idem_list(f->store, NULL, collect_cb, &l), 42);
  assert_int_equal(l.n, 1);
  EXPECT_RC(IDEM_EINVAL, idem_list(f->store, NULL, NULL, NULL));
  EXPECT_RC(IDEM_OK, idem_complete(f->store, held, &resp));
  idem_call_free(held);
}

/* ------------------------------------------------------------------ */
/* Scope, rejection, size                                               */
/* ------------------------------------------------------------------ */

static void test_tenant_isolation(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id alpha = {"alpha", OPERATION, KEY};
  idem_id beta = {"beta", OPERATION, KEY};
  ticket_action a = {.payload = PAYLOAD}, b = {.payload = PAYLOAD},
                a2 = {.payload = PAYLOAD}, b2 = {.payload = PAYLOAD};
  idem_call *c;
  long long id_alpha, id_beta;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &alpha, fp, NULL, &a, IDEM_PROCEED);
  id_alpha = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  c = LOCAL(f->store, &beta, fp, NULL, &b, IDEM_PROCEED);
  id_beta = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  assert_int_equal(id_alpha, 1);
  assert_int_equal(id_beta, 2);
  assert_int_equal(count_tickets(f->url), 2);
  assert_int_equal(list_count(f->store, NULL), 2);
  {
    idem_filter fa = {.tenant = "alpha"}, fb = {.tenant = "beta"};
    assert_int_equal(list_count(f->store, &fa), 1);
    assert_int_equal(list_count(f->store, &fb), 1);
  }
  /* Each tenant replays its own result. */
  c = LOCAL(f->store, &alpha, fp, NULL, &a2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), id_alpha);
  idem_call_free(c);
  c = LOCAL(f->store, &beta, fp, NULL, &b2, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), id_beta);
  idem_call_free(c);
  assert_int_equal(a2.runs + b2.runs, 0);
  assert_int_equal(count_tickets(f->url), 2);
  /* Operations scope keys too. */
  {
    idem_id other_op = {"alpha", "POST /other", KEY};
    ticket_action o = {.payload = PAYLOAD};
    c = LOCAL(f->store, &other_op, fp, NULL, &o, IDEM_PROCEED);
    assert_int_equal(ticket_id_of(idem_call_response(c)), 3);
    idem_call_free(c);
  }
}

static void test_failure_before_commit(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action failing = {.payload = PAYLOAD, .reject = 1};
  ticket_action retry = {.payload = PAYLOAD};
  idem_call *c = (idem_call *)&c;
  fp_of(PAYLOAD, fp);

  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_EREJECTED, idem_execute_local(f->store, &id, fp, NULL,
                                               create_ticket, &failing, &c));
  assert_null(c);
  assert_fresh_errmsg(primed);
  /* The action ran and inserted its ticket before failing... */
  assert_int_equal(failing.runs, 1);
  assert_int_equal(failing.ticket_id, 1);
  /* ...and everything it did was rolled back, with no record kept. */
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  assert_int_equal(list_count(f->store, NULL), 0);

  /* The retry's ticket is the only one. SQLite reuses the rolled-back id;
   * a PostgreSQL sequence is not rolled back, so there it is the next one. */
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_PROCEED);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(
      ticket_id_of(idem_call_response(c)),
      backend_from_env() == BACKEND_POSTGRESQL ? failing.ticket_id + 1 : 1);
  assert_int_equal(retry.ticket_id, ticket_id_of(idem_call_response(c)));
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_response_too_large(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id local = {"tenant-a", OPERATION, "local-too-big"};
  const size_t max = IDEM_MAX_RESPONSE;
  unsigned char *big = malloc(max + 1);
  idem_response resp;
  idem_record *rec;
  idem_call *c, *x;
  assert_non_null(big);
  for (size_t i = 0; i <= max; i++)
    big[i] = (unsigned char)(i * 31 + (i >> 12));
  fp_of(PAYLOAD, fp);

  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  memset(&resp, 0, sizeof resp);
  resp.status = 200;
  resp.body = big;
  resp.body_len = max + 1;
  prime_errmsg(primed, sizeof primed);
  EXPECT_RC(IDEM_ETOOBIG, idem_complete(f->store, c, &resp));
  assert_fresh_errmsg(primed);
  resp.meta = "m";
  resp.meta_len = 1;
  resp.body_len = max; /* meta and body together count */
  EXPECT_RC(IDEM_ETOOBIG, idem_complete(f->store, c, &resp));
  rec = get_record(f->store, &id);
  assert_int_equal(rec->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(rec->has_response, 0);
  idem_record_free(rec);
  x = CLAIM(f->store, &id, fp, NULL, IDEM_IN_FLIGHT);
  idem_call_free(x);
  /* The holder still holds it, and exactly the limit is kept. */
  resp.body_len = max - 1;
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  c = CLAIM(f->store, &id, fp, NULL, IDEM_REPLAY);
  assert_response_equal(idem_call_response(c), &resp);
  idem_call_free(c);

  /* A local action whose response is too large stores nothing at all. */
  {
    ticket_action act = {.payload = PAYLOAD,
                         .big_body = big,
                         .big_len = max + 1 - strlen(TICKET_META)};
    x = (idem_call *)&x;
    EXPECT_RC(IDEM_ETOOBIG, idem_execute_local(f->store, &local, fp, NULL,
                                               create_ticket, &act, &x));
    assert_null(x);
    assert_int_equal(act.runs, 1);
    assert_int_equal(count_tickets(f->url), 0);
    assert_absent(f->store, &local);
  }
  free(big);
}

/* ------------------------------------------------------------------ */
/* Claims answered from memory                                          */
/* ------------------------------------------------------------------ */

/* idem_claim_cached() of id: its return code, and the call on IDEM_OK. */
static idem_call *cached(idem_store *s, const idem_id *id, const char *fp,
                         int want_rc) {
  idem_call *c = (idem_call *)&c;
  EXPECT_RC(want_rc, idem_claim_cached(s, id, fp, &c));
  if (want_rc != IDEM_OK)
    assert_null(c);
  return c;
}

/*
 * idem_claim_cached() answers what idem_claim() would, REPLAY or CONFLICT,
 * for the completed records this handle keeps, and IDEM_ENOTFOUND for
 * everything else (a new key, a key in flight, a record completed through
 * another handle or past its retention, a deleted one), without reading or
 * writing the store.
 */
static void test_claim_cached(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id flying = {"tenant-a", OPERATION, "in-flight"};
  idem_id brief = {"tenant-a", OPERATION, "kept-briefly"};
  idem_id bad = {"tenant-a", OPERATION, "no spaces"};
  idem_call_options keep_briefly = {.retention_ms = SHORT_MS};
  idem_store_options no_cache = {.replay_cache_entries = -1};
  ticket_action act = {.payload = PAYLOAD}, act2 = {.payload = PAYLOAD};
  idem_store *other = NULL, *uncached = NULL;
  idem_record *rec = NULL;
  idem_call *c, *held;
  fp_of(PAYLOAD, fp);
  fp_of(PAYLOAD_URGENT, fp2);

  /* A new key: nothing kept, and nothing written. */
  cached(f->store, &id, fp, IDEM_ENOTFOUND);
  assert_absent(f->store, &id);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);

  /* Completed here: the replay, and a conflict for another request. */
  c = cached(f->store, &id, fp, IDEM_OK);
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(idem_call_state(c), IDEM_STATE_COMPLETED);
  assert_int_equal(idem_call_attempt(c), 1);
  assert_int_equal(idem_call_recovered(c), 0);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  /* A replay holds nothing: there is nothing to end. */
  EXPECT_RC(IDEM_ESTATE, idem_release(f->store, c));
  idem_call_free(c);
  c = cached(f->store, &id, fp2, IDEM_OK);
  assert_int_equal(idem_call_outcome(c), IDEM_CONFLICT);
  assert_null(idem_call_response(c));
  idem_call_free(c);
  assert_int_equal(act.runs, 1);
  assert_int_equal(count_tickets(f->url), 1);

  /* A key in flight is the store's to decide. */
  held = CLAIM(f->store, &flying, fp, NULL, IDEM_PROCEED);
  cached(f->store, &flying, fp, IDEM_ENOTFOUND);
  EXPECT_RC(IDEM_OK, idem_release(f->store, held));
  idem_call_free(held);
  cached(f->store, &flying, fp, IDEM_ENOTFOUND);

  /* Another handle keeps only what it wrote or read itself. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &other));
  EXPECT_RC(IDEM_OK, idem_get(other, &id, &rec));
  assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
  idem_record_free(rec);
  cached(other, &id, fp, IDEM_ENOTFOUND);
  c = CLAIM(other, &id, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  c = cached(other, &id, fp, IDEM_OK);
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 1);
  idem_call_free(c);
  idem_store_close(other);

  /* A handle without a replay cache keeps nothing. */
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, &no_cache, &uncached));
  c = CLAIM(uncached, &id, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  cached(uncached, &id, fp, IDEM_ENOTFOUND);
  idem_store_close(uncached);

  /* Past its retention a record counts as absent. */
  c = LOCAL(f->store, &brief, fp, &keep_briefly, &act2, IDEM_PROCEED);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  c = cached(f->store, &brief, fp, IDEM_OK);
  assert_int_equal(ticket_id_of(idem_call_response(c)), 2);
  idem_call_free(c);
  sleep_ms(PAST_SHORT_MS);
  cached(f->store, &brief, fp, IDEM_ENOTFOUND);

  /* A record this handle deleted is gone from its memory too. */
  EXPECT_RC(IDEM_OK, idem_delete(f->store, &id));
  cached(f->store, &id, fp, IDEM_ENOTFOUND);

  /* Bad arguments, as idem_claim() says them. */
  cached(f->store, &bad, fp, IDEM_EKEY);
  cached(f->store, &id, "not-a-fingerprint", IDEM_EINVAL);
  cached(NULL, &id, fp, IDEM_EINVAL);
  EXPECT_RC(IDEM_EINVAL, idem_claim_cached(f->store, &id, fp, NULL));
  assert_int_equal(act.runs, 1);
  assert_int_equal(act2.runs, 1);
  assert_int_equal(count_tickets(f->url), 2);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

int main(void) {
  const struct CMUnitTest both[] = {
      STORE_TEST(test_retention_expiry_boundary),
      STORE_TEST(test_prune),
      STORE_TEST(test_get_returns_record_fields),
      STORE_TEST(test_list_filters),
      STORE_TEST(test_tenant_isolation),
      STORE_TEST(test_failure_before_commit),
      STORE_TEST(test_response_too_large),
      STORE_TEST(test_claim_cached),
  };
  const struct CMUnitTest *sqlite_only = NULL;
  const struct CMUnitTest *pg_only = NULL;
  return run_engine_tests("records", both, sizeof both / sizeof both[0], sqlite_only,
                          0, pg_only, 0);
}
