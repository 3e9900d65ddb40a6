/*
 * upstream_int.h -- what upstream.c (the loop, and libcurl's transfers) and
 * upstream_h1.c (the loop's own HTTP/1.1) share: a forward, how its answer
 * is taken in, and the loop's descriptors. Not for the rest of the program:
 * serve.h says what upstream.c offers.
 */
#ifndef IDEM_SERVE_UPSTREAM_INT_H
#define IDEM_SERVE_UPSTREAM_INT_H

#include "serve.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdint.h>

/* Headers of an upstream answer larger than this are refused (502): the
 * gateway could not send them on (libmicrohttpd builds a response's head in
 * the connection's memory pool, see gateway.c) and must not store what it
 * cannot send. */
#define UP_MAX_HEADER_BYTES (16 * 1024)

/* Idle connections to the upstream kept open for reuse (by each path). */
#define UP_KEEP_CONNECTIONS 256

struct h1conn; /* upstream_h1.c's */
struct h1x;

/* An answer as it arrives: up_on_header() and up_on_body() fill rs. */
typedef struct sink {
  up_response *rs;
  const up_request *rq; /* its head and data callbacks */
  void *ctx;
  size_t cap, hcap;
  size_t header_bytes;
  int too_large;
  int headers_too_large;
  int interim;      /* inside a 1xx response's header block */
  int upgrade;      /* 101 Switching Protocols: refused */
  int in_body;      /* past the final header block: lines now are trailers */
  int bad_status;   /* a status line whose code is not 1xx-5xx */
  /* The answer's framing cannot be trusted (RFC 9112 sections 2.2, 6.1
   * and 6.3): what, for the error; the transfer is ended. */
  const char *bad_framing;
  int seen_te;      /* the final header block's Transfer-Encoding */
  char *connection; /* the response's Connection header: more hop-by-hop */
} sink;

/* One forward, from upstream_start() to its done callback. */
typedef struct xfer {
  CURL *curl; /* NULL when h1 carries it */
  struct curl_slist *hdrs;
  sink s;
  const up_request *rq;
  up_response *rs;
  up_done_fn done;
  void *ctx;
  double t0;
  int no_fds;        /* socket() failed for want of descriptors */
  int sends;         /* times libcurl was about to send the request */
  struct xfer *next; /* in the pending list */
  struct xfer *prev_active, *next_active; /* on the loop: its active list */
  struct h1x *h1; /* non-NULL: over the loop's own HTTP/1.1 */
} xfer;

/* ---- upstream.c -------------------------------------------------------- */

/* One line of an answer's header section as it came (status line, field,
 * folded continuation, or the empty line that ends a block; with its line
 * end), libcurl's header callback: size * n when taken, else 0 (see the
 * sink's flags for why). At the end of the final block, rq->head runs. */
size_t up_on_header(char *p, size_t size, size_t n, void *arg);
/* Body bytes, libcurl's write callback: size * n when taken, else 0. */
size_t up_on_body(char *p, size_t size, size_t n, void *arg);
/* Frees rs's headers (and resets s's count of them when s is given). */
void up_free_headers(up_response *rs, sink *s);
/* Drops the headers that the answer's Connection header names. */
void up_drop_named(up_response *rs, const char *connection);
/* up_set_error() with a va_list. */
void up_set_errorv(up_response *rs, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
/* CLOCK_MONOTONIC in ms. */
double up_now_ms(void);
/* For each of the client's headers that goes upstream (the end-to-end ones:
 * not hop-by-hop, not named by a Connection header), fn(ctx, name, value,
 * append): append is the client's address for X-Forwarded-For (to follow
 * ", "), else NULL. Then X-Forwarded-For alone when the client sent none. */
void up_each_forwarded(const up_request *rq,
                       void (*fn)(void *ctx, const char *name,
                                  const char *value, const char *append),
                       void *ctx);

/* The loop's epoll descriptor. */
int up_epfd(void);
/* fd's events go to h1_event(c) from now on (c NULL: no more). 0, or -1
 * when the loop's table cannot grow. */
int up_fd_route(int fd, struct h1conn *c);
/* The forwards on the loop, newest first; and x taken off that list (and
 * out of the count that upstream_active() gives). */
xfer *up_first_active(void);
void up_unlink_active(xfer *x);

/* ---- upstream_h1.c ----------------------------------------------------- */

/* Whether the loop's own HTTP/1.1 takes the forwards to cfg->upstream: 0
 * when it does (set up), -1 when they stay with libcurl. */
int h1_init(const serve_config *cfg);
/* A forward's own part, for x->h1 (zeroed); NULL when out of memory. */
struct h1x *h1_new(void);
/* On the loop: x (with x->h1 from h1_new()) starts. */
void h1_start(xfer *x);
/* On the loop: events on one of h1's connections. */
void h1_event(struct h1conn *c, uint32_t events);
/* On the loop: ends x as a transfer that timed out (aborted 0) or whose
 * abort_check asked (aborted 1). */
void h1_stop(xfer *x, int aborted);
/* How long the loop may wait before h1_tick() is due: ms, or -1. */
int h1_wait_ms(double now);
/* Deadlines and abort checks, when due. */
void h1_tick(double now);
/* Closes the idle connections. */
void h1_cleanup(void);
/* For tests (tests/fuzz/fuzz_upstream_answer.c), without a loop: x (its
 * request said sent, with x->h1 from h1_new()) on no connection at all, 0
 * or -1; then h1_feed() hands it an answer's bytes as if read (n 0: the
 * connection closed), until its done callback has run. */
int h1_test_start(xfer *x);
void h1_feed(xfer *x, const char *p, size_t n);
/* For tests (tests/fuzz/fuzz_upstream_request.c): the bytes h1 sends for
 * x's request (x->h1 from h1_new(), after h1_test_start()), owned by
 * x->h1. 0, or -1 when out of memory. */
int h1_test_request(xfer *x, const char **bytes, size_t *len);

#endif
