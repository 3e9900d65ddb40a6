/*
 * seed.c -- fills a store with the records the tests of `idem console`
 * look at, through libidem, and prints them (one JSON object a line:
 * tenant, operation, key, state) so that the tests name them from one
 * place.
 *
 *   completed    acme "POST /charges" order-1 .. order-5 (status 201)
 *   completed    acme "POST /charges" bin-1, a body that is not UTF-8
 *   completed    HOSTILE_TENANT HOSTILE_OPERATION HOSTILE_KEY, whose
 *                request and answer hold markup too
 *   recovered    acme "send_mail" rec-1 (completed after a takeover)
 *   unknown      acme "POST /charges" lost-1, acme "send_mail" lost-2,
 *                globex "POST /refunds" HOSTILE_UNKNOWN_KEY
 *   in progress  acme "POST /charges" busy-1, its lease one hour long
 *
 * usage: console_seed STORE
 * Exits 0 when every record was written, 1 otherwise (with the reason).
 */
#include <idem.h>
#include <stdio.h>
#include <string.h>

/* Markup in every field a page could show: a page that puts store text
 * into its HTML instead of its text makes elements of them. Keys are
 * printable ASCII without spaces, hence the slashes of the second. */
#define HOSTILE_TENANT "<img src=x onerror=alert(5)>"
#define HOSTILE_OPERATION "<svg onload=alert(6)>"
#define HOSTILE_KEY "<script>alert(1)</script>"
#define HOSTILE_REQUEST "{\"note\":\"<script>alert(7)</script>\"}"
#define HOSTILE_BODY "<script>alert(2)</script><img src=x onerror=alert(3)>"
#define HOSTILE_UNKNOWN_KEY "<img/src=\"x\"/onerror=\"alert(4)\">"

#define DAY_MS (24LL * 3600 * 1000)

static int failed(const char *what, const char *key, int rc) {
  fprintf(stderr, "seed: %s %s: %s (%s)\n", what, key, idem_errmsg(),
          idem_rc_name(rc));
  return 1;
}

static void print_json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void report(const idem_id *id, const char *state) {
  fputs("{\"tenant\":", stdout);
  print_json_string(id->tenant);
  fputs(",\"operation\":", stdout);
  print_json_string(id->operation);
  fputs(",\"key\":", stdout);
  print_json_string(id->key);
  printf(",\"state\":\"%s\"}\n", state);
}

/* Claims id for request: PROCEED expected (or, with wait_ms, RECOVER). */
static int claim(idem_store *s, const idem_id *id, const char *request,
                 int64_t lease_ms, int64_t wait_ms, idem_outcome want,
                 idem_call **call) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options co = {0};
  int rc;
  co.lease_ms = lease_ms;
  co.retention_ms = 7 * DAY_MS;
  co.request = request;
  co.request_len = strlen(request);
  co.wait_ms = wait_ms;
  if ((rc = idem_fingerprint(request, strlen(request), 1, fp)) != IDEM_OK ||
      (rc = idem_claim(s, id, fp, &co, call)) != IDEM_OK)
    return failed("claim", id->key, rc);
  if (idem_call_outcome(*call) != want) {
    fprintf(stderr, "seed: claim %s: %s, not %s\n", id->key,
            idem_outcome_name(idem_call_outcome(*call)),
            idem_outcome_name(want));
    idem_call_free(*call);
    *call = NULL;
    return 1;
  }
  return 0;
}

static int completed(idem_store *s, const idem_id *id, const char *request,
                     int status, const void *body, size_t body_len,
                     const char *meta) {
  idem_call *call = NULL;
  idem_response r = {0};
  int rc;
  if (claim(s, id, request, 0, 0, IDEM_PROCEED, &call))
    return 1;
  r.status = status;
  r.body = body;
  r.body_len = body_len;
  r.meta = meta;
  r.meta_len = meta ? strlen(meta) : 0;
  rc = idem_complete(s, call, &r);
  idem_call_free(call);
  if (rc != IDEM_OK)
    return failed("complete", id->key, rc);
  report(id, "completed");
  return 0;
}

static int unknown(idem_store *s, const idem_id *id, const char *request) {
  idem_call *call = NULL;
  int rc;
  if (claim(s, id, request, 0, 0, IDEM_PROCEED, &call))
    return 1;
  rc = idem_mark_unknown(s, call);
  idem_call_free(call);
  if (rc != IDEM_OK)
    return failed("mark unknown", id->key, rc);
  report(id, "unknown");
  return 0;
}

/* A holder that never ends its claim: in progress for an hour. */
static int in_progress(idem_store *s, const idem_id *id, const char *request) {
  idem_call *call = NULL;
  if (claim(s, id, request, 3600 * 1000LL, 0, IDEM_PROCEED, &call))
    return 1;
  idem_call_free(call);
  report(id, "in_progress");
  return 0;
}

/* A first holder whose 1 ms lease ends, then a takeover (waiting for the
 * lease's end, not sleeping) that completes: a recovered answer. */
static int recovered(idem_store *s, const idem_id *id, const char *request) {
  idem_call *call = NULL;
  idem_response r = {0};
  int rc;
  if (claim(s, id, request, 1, 0, IDEM_PROCEED, &call))
    return 1;
  idem_call_free(call);
  call = NULL;
  if (claim(s, id, request, 0, 10000, IDEM_RECOVER, &call))
    return 1;
  r.status = 0;
  r.body = "sent after a takeover\n";
  r.body_len = strlen(r.body);
  rc = idem_complete(s, call, &r);
  idem_call_free(call);
  if (rc != IDEM_OK)
    return failed("complete", id->key, rc);
  report(id, "recovered");
  return 0;
}

int main(int argc, char **argv) {
  idem_store *s = NULL;
  int rc, bad = 0;
  if (argc != 2) {
    fputs("usage: seed STORE\n", stderr);
    return 2;
  }
  if ((rc = idem_store_open(argv[1], NULL, &s)) != IDEM_OK)
    return failed("open", argv[1], rc);
  for (int i = 1; i <= 5 && !bad; i++) {
    char key[32], request[64], body[64];
    snprintf(key, sizeof key, "order-%d", i);
    snprintf(request, sizeof request, "{\"amount\":%d}", 100 * i);
    snprintf(body, sizeof body, "{\"charge\":\"ch_%d\"}", i);
    idem_id id = {"acme", "POST /charges", key};
    bad = completed(s, &id, request, 201, body, strlen(body),
                    "{\"content-type\":\"application/json\"}");
  }
  static const unsigned char binary[] = {0xff, 0xfe, 0x00, 0x01, 'o', 'k'};
  idem_id bin = {"acme", "POST /charges", "bin-1"};
  idem_id hostile = {HOSTILE_TENANT, HOSTILE_OPERATION, HOSTILE_KEY};
  idem_id rec = {"acme", "send_mail", "rec-1"};
  idem_id lost1 = {"acme", "POST /charges", "lost-1"};
  idem_id lost2 = {"acme", "send_mail", "lost-2"};
  idem_id lost3 = {"globex", "POST /refunds", HOSTILE_UNKNOWN_KEY};
  idem_id busy = {"acme", "POST /charges", "busy-1"};
  bad =
      bad ||
      completed(s, &bin, "{\"amount\":7}", 201, binary, sizeof binary, NULL) ||
      completed(s, &hostile, HOSTILE_REQUEST, 200, HOSTILE_BODY,
                strlen(HOSTILE_BODY), NULL) ||
      recovered(s, &rec, "{\"to\":\"ops@example.com\"}") ||
      unknown(s, &lost1, "{\"amount\":1000}") ||
      unknown(s, &lost2, "{\"to\":\"cfo@example.com\"}") ||
      unknown(s, &lost3, "{\"charge\":\"ch_9\"}") ||
      in_progress(s, &busy, "{\"amount\":42}");
  idem_store_close(s);
  return bad ? 1 : 0;
}
