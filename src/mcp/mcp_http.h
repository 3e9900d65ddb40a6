/*
 * mcp_http.h -- what the files of `idem mcp --listen` share.
 *
 *   mcp_http.c        the listener, exchanges, streaming, passing through
 *   mcp_http_keyed.c  keyed tools/call: claim, forward, record, answer
 */
#ifndef IDEM_MCP_HTTP_H
#define IDEM_MCP_HTTP_H

#include "../serve/serve.h"
#include "mcp.h"

/* The longest the head of a keyed call's answer waits for the answer's
 * first bytes (see hold() in mcp_http.c). */
#define HX_HEAD_HOLD_MS 10

/* The most a stream holds for a client that does not read it. */
#define HX_MAX_BUFFERED (8u * 1024 * 1024)

/* One client request and what answers it. Reference counted: the
 * connection, a transfer in flight, a keyed call and a content reader each
 * hold one. */
typedef struct hx {
  pthread_mutex_t mu;
  int refs;
  struct MHD_Connection *c;
  char method[40];
  char *uri;
  char addr[64];
  up_header *h; /* the request's headers */
  size_t nh, hcap;
  char *body;
  size_t len, cap;
  int too_big;
  int started, decided, answered;
  char tenant[300];
  int tenant_known; /* tenant derived (the headers do not change) */
  char *id; /* a tools/call's request id (JSON text) */

  /* The answer; under mu. */
  int ready; /* status and headers are set: the handler queues it */
  int status;
  const char *type; /* Content-Type of the proxy's own answers */
  up_header *ah;    /* the answer's headers */
  size_t nah;
  int streaming;
  int sse_out;    /* the head went out as text/event-stream */
  int64_t length; /* -1: unknown (chunked) */
  char *out;      /* bytes not yet given to libmicrohttpd */
  size_t out_len, out_off, out_cap;
  int out_end, out_broken;
  int suspended;            /* its connection is suspended */
  int head_held;            /* the head waits for its body (see hold()) */
  int64_t held_until;       /* the loop's: then it goes alone */
  struct hx *hprev, *hnext; /* the loop's: the heads held around it */
  int in_held;              /* the loop's: on the list of heads held */
  int gone;                 /* libmicrohttpd is done with it: never resume */
  int peer_closed;          /* the client closed its side while suspended */
  int fd;                   /* the connection's socket */
  struct hx *rprev, *rnext; /* the streams watched for a closing client */
  int watched;
  int passing;    /* its forward passes through (ended when it leaves) */
  int pass_ended; /* under mu: that forward's done callback has run */

  /* A forward of its own (passing through, or a keyed call's). */
  up_request rq;
  up_response rs;

  /* A tools/list whose answer is read on its way (--require-key). */
  int watch_tools;
  /* An initialize or server/discover whose answer is held whole and
   * given the idem/idempotency capability before it goes on. */
  int extend_caps;
  char *seen;
  size_t seen_len, seen_cap;

  /* A keyed call's waiter. */
  struct hx *wnext;
  int64_t deadline; /* an attached retry: --attach-wait ends */
} hx;

extern const mcp_opts *hx_opts;
extern idem_store *hx_store;
/* Non-zero: a replay waits for a ping in the caller's session to be
 * answered by the upstream (--replay-check upstream). */
extern int hx_replay_check;

int64_t hx_mono_ms(void);
/* Appends p[0..n) to the growable buffer *buf (*len used, *cap allocated).
 * 0, or -1 when out of memory (the buffer is then unchanged). */
int hx_buf_add(char **buf, size_t *len, size_t *cap, const char *p, size_t n);
/* Event streams (text/event-stream): the end of the first whole event in
 * s[from, n), just past the empty line that ends it; 0 when none is whole
 * yet. */
size_t hx_event_end(const char *s, size_t n, size_t from);
/* The data of one event: its "data:" lines joined by newlines. malloc()ed,
 * *len set; NULL when it has none, or, with errno ENOMEM, when out of
 * memory. */
char *hx_event_data(const char *ev, size_t n, size_t *len);
void hx_ref(hx *h);
void hx_unref(hx *h);
/* The value of the request's header name; NULL when absent. */
const char *hx_header(const hx *h, const char *name);
/* The request's Accept-Encoding made "identity": an answer the proxy
 * reads must not come compressed (libcurl does not decode it). */
void hx_identity(hx *h);
/* Fills h->rq from the request as the client sent it. */
void hx_prepare_request(hx *h);

/* The answer's head; its body then comes by hx_stream() and ends with
 * hx_stream_end(). length -1 when unknown. 0, or -1 when out of memory.
 * On the upstream loop's thread only. held: the head waits for the body's
 * first bytes or its end, HX_HEAD_HOLD_MS at most (a keyed call's). */
int hx_answer_head(hx *h, int status, const up_header *hs, size_t n,
                   int64_t length, int held);
/* 0, or -1 when the client is gone or cut off. */
int hx_stream(hx *h, const char *p, size_t n);
/* One event "message" whose data is data[0..n), each of its lines on a
 * "data:" line of its own (SSE joins them with newlines again); as
 * hx_stream(). */
int hx_stream_event(hx *h, const char *data, size_t n);
void hx_stream_end(hx *h, int broken);
/* A whole answer (type NULL when the headers hs carry Content-Type); when
 * a stream's head went out already, body ends the stream. */
void hx_answer_whole(hx *h, int status, const char *type, const char *body,
                     size_t len, const up_header *hs, size_t n);
/* A JSON-RPC error under the request's id, HTTP 200. data is stolen. */
void hx_answer_rpc_error(hx *h, int code, const char *msg, json_t *data);
/* Its text; id NULL for null. free() it. */
char *hx_rpc_error(const char *id, int code, const char *msg, json_t *data,
                   size_t *len);

/* mcp_http_keyed.c */
int hx_keyed_start(void);
/* A keyed tools/call whose body is h->body: claimed, forwarded, recorded
 * and answered (h's connection is suspended until then). */
void hx_keyed_call(hx *h, const char *tool, const char *key, int in_arg);
/* A notifications/cancelled (params) from h's session: 1 when it names a
 * keyed call in flight (it is then not passed on: the call goes on at the
 * server and its result is recorded), 0 when it passes on: as it does with
 * --keyed-cancel pass for a call's own request that no retry waits for,
 * whose server then has --cancel-wait to confirm. h->tenant is set. */
int hx_keyed_cancel(hx *h, json_t *params);
/* Waits up to ms for the keyed calls at the server to end (their records
 * written and their requests answered) and the claims queued on the store
 * to be decided; how many are left. */
int hx_keyed_drain(int64_t ms);

#endif
