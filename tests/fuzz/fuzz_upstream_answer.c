/*
 * fuzz_upstream_answer.c -- the answers that the loop's own HTTP/1.1 reads
 * from an upstream (src/serve/upstream_h1.c): status lines, header blocks
 * (1xx ones before the final one), framing by Content-Length, chunked or
 * the connection's end, trailers.
 *
 * Input: one byte of flags (bit 0: the request was a HEAD), then the bytes
 * that the upstream sends, followed by the end of the connection. The
 * answer is read twice: as one read, and one byte per read. Properties,
 * each an abort() when broken:
 *  - the forward ends exactly once, and both readings end it alike: the
 *    same result, status, headers and body (how the bytes are cut up must
 *    never change what is passed on);
 *  - a whole answer (UP_OK) has a final status (200-599), no hop-by-hop
 *    header among those passed on, and a body no larger than the input
 *    (none to a HEAD, a 204 or a 304).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/upstream_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

typedef struct run {
  int ends;
  up_result r;
  up_response rs;
} run;

static void done(void *ctx, up_result r) {
  run *u = ctx;
  u->ends++;
  u->r = r;
}

static const serve_config config = {
    .upstream = "http://127.0.0.1:9",
    .upstream_timeout_ms = 1000,
    .max_pass = 1 << 20,
};

/* Reads data[0..n) as the answer to method, in pieces of step bytes (0:
 * all at once). */
static void read_answer(run *u, const char *method, const uint8_t *data,
                        size_t n, size_t step) {
  up_request rq;
  xfer *x = calloc(1, sizeof *x);
  check(x != NULL);
  memset(&rq, 0, sizeof rq);
  rq.method = method;
  rq.uri = "/x";
  memset(u, 0, sizeof *u);
  x->rq = &rq;
  x->rs = &u->rs;
  x->done = done;
  x->ctx = u;
  x->s.rs = &u->rs;
  x->s.rq = &rq;
  x->s.ctx = u;
  check((x->h1 = h1_new()) != NULL);
  check(h1_test_start(x) == 0);
  for (size_t off = 0; off < n && !u->ends;) {
    size_t k = step && n - off > step ? step : n - off;
    h1_feed(x, (const char *)data + off, k);
    off += k;
  }
  if (!u->ends)
    h1_feed(x, NULL, 0); /* the connection ends */
  check(u->ends == 1);
}

static int same(const run *a, const run *b) {
  if (a->r != b->r || a->rs.status != b->rs.status ||
      a->rs.nheaders != b->rs.nheaders || a->rs.body_len != b->rs.body_len ||
      (a->rs.body_len && memcmp(a->rs.body, b->rs.body, a->rs.body_len)))
    return 0;
  for (size_t i = 0; i < a->rs.nheaders; i++)
    if (strcmp(a->rs.headers[i].name, b->rs.headers[i].name) != 0 ||
        strcmp(a->rs.headers[i].value, b->rs.headers[i].value) != 0)
      return 0;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  run whole, bytes;
  const char *method;
  if (!ready) {
    /* The loop starts (and h1 with it), idle: the answers below are read
     * on this thread, through no socket. */
    check(upstream_init(&config) == 0);
    ready = 1;
  }
  if (size < 1)
    return 0;
  method = (data[0] & 1) ? "HEAD" : "GET";
  read_answer(&whole, method, data + 1, size - 1, 0);
  read_answer(&bytes, method, data + 1, size - 1, 1);
  check(same(&whole, &bytes));
  if (whole.r == UP_OK) {
    check(whole.rs.status >= 200 && whole.rs.status <= 599);
    check(whole.rs.body_len <= size - 1);
    for (size_t i = 0; i < whole.rs.nheaders; i++)
      check(!header_is_hop_by_hop(whole.rs.headers[i].name));
    if ((data[0] & 1) || whole.rs.status == 204 || whole.rs.status == 304)
      check(whole.rs.body_len == 0);
  }
  upstream_response_free(&whole.rs);
  upstream_response_free(&bytes.rs);
  return 0;
}
