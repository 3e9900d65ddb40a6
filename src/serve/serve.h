/* serve.h -- what the parts of `idem serve`, the HTTP gateway, share. */
#ifndef IDEM_SERVE_H
#define IDEM_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <microhttpd.h>

#include "idem.h"

struct principal_rule;

/* The command line, parsed. */
typedef struct serve_config {
  const char *listen;   /* HOST:PORT */
  const char *upstream; /* base URL, without a trailing slash */
  const char *store_url;
  /* --principal (principal.h): whose a keyed request is; --tenant-header
   * NAME is header:NAME. */
  const struct principal_rule *principal;
  const char *principal_spec, *jwks, *issuer, *audience;
  char principal_buf[96];
  /* --replay-check-url PATH: a GET of PATH on the upstream, with the
   * caller's credentials, must answer 2xx before a replay goes out; its
   * answer is trusted for replay_check_ttl_ms per credential. */
  const char *replay_check_url;
  int64_t replay_check_ttl_ms;
  /* --seal-key FILE, each: the first seals stored answers, all open. */
  char *seal_keys[16];
  int n_seal_keys;
  const char *admin_listen;  /* NULL: no admin listener */
  const char *admin_token_file; /* --admin-token-file: Bearer token */
  const char *console_token_file; /* --console-token-file */
  const char *console_audit_log;  /* --console-audit-log */
  const char *log_path;      /* NULL: no access log; "-": stdout */
  const char *upstream_cacert;
  char methods[128]; /* ",POST,PATCH," */
  int require_key;
  int no_store_5xx;
  int on_unknown_fail;
  int keep_requests; /* --keep-requests: request bodies kept in records */
  int create_store; /* --create-store: even where one was deleted */
  int threads;
  int store_workers;
  size_t max_body;
  size_t max_response;
  size_t max_pass; /* largest response passed on unstored */
  int64_t lease_ms, retention_ms, upstream_timeout_ms;
  int64_t attach_wait_ms; /* --attach-wait: a retry of a key in flight waits */
  /* guard.c: slow clients and connection limits. */
  int64_t header_timeout_ms;       /* --header-timeout */
  unsigned max_connections;        /* 0: from the descriptor limit */
  long max_connections_per_client; /* -1: from max_connections; 0: none */
} serve_config;

/* Outcomes a request is counted under, in /metrics and the access log. */
typedef enum serve_outcome {
  OUT_PROCEED,
  OUT_REPLAY,
  OUT_CONFLICT,
  OUT_IN_FLIGHT,
  OUT_RECOVER,
  OUT_PASSTHROUGH,
  OUT_REJECTED, /* refused by the gateway's own checks: key, size, tenant */
  OUT_ERROR,    /* the store or the upstream failed */
  OUT_UNKNOWN,  /* refused: an earlier attempt's outcome is unknown */
  OUT_COUNT
} serve_outcome;

const char *serve_outcome_name(serve_outcome o);

/* ---- metrics.c ---------------------------------------------------------- */

void metrics_request(serve_outcome o);
/* An answer's HTTP status, counted by status (every answer the gateway
 * logs). */
void metrics_status(int status);
void metrics_upstream_ms(double ms);
void metrics_store_ms(double ms);
void metrics_stored_bytes(size_t n);
void metrics_in_flight(int delta);
int metrics_in_flight_now(void);
/* Requests whose connections are suspended, waiting for the store or the
 * upstream. */
void metrics_waiting(int delta);
int metrics_waiting_now(void);
void metrics_attached(int delta); /* retries waiting for a key in flight */
/* The Prometheus text exposition; free() it. NULL when out of memory. */
char *metrics_render(size_t *len);
/* The requests answered, by outcome, as a JSON object (malloc'd text), for
 * the console's rates; NULL when out of memory. */
char *metrics_calls_json(void);

/* ---- accesslog.c -------------------------------------------------------- */

typedef struct access_entry {
  const char *method, *path;
  serve_outcome outcome;
  int status;
  double upstream_ms, total_ms;
  const char *key;    /* hashed before it is written; may be NULL */
  const char *tenant; /* hashed too; may be NULL */
  const char *note;   /* why, when the gateway answered itself; may be NULL */
} access_entry;

/* Opens path for appending ("-": stdout). 0, or -1 with errno set. */
int accesslog_open(const char *path);
/* Opens the file again (after SIGHUP, for log rotation). */
int accesslog_reopen(void);
void accesslog_write(const access_entry *e);
void accesslog_close(void);

/*
 * A log line said at most once a second, however often its event happens
 * (a flood of lines is how a full disk follows a failing store). Static,
 * zeroed, one per kind of line; SERVE_RATE_INIT initialises it.
 */
typedef struct serve_rate {
  pthread_mutex_t mu;
  struct timespec last;
  int any;
  unsigned long left_out;
} serve_rate;
#define SERVE_RATE_INIT                                                        \
  { PTHREAD_MUTEX_INITIALIZER, {0, 0}, 0, 0 }
/* Non-zero when the line may be written now; *left_out is then how many
 * were left out since the last one. */
int serve_rate_pass(serve_rate *r, unsigned long *left_out);
/* Logs a store error on standard error with its reason (detail: what
 * idem_errmsg() said), at most a line a second; a line counts the errors
 * left out since the one before. what: the step that failed ("claim"). */
void serve_log_store_error(const char *what, int rc, const char *detail);

/* ---- upstream.c --------------------------------------------------------- */

typedef struct up_header {
  char *name, *value;
} up_header;

typedef struct up_response up_response;

/* A request as the upstream will get it. */
typedef struct up_request {
  const char *method;
  const char *uri; /* path and query, as the client sent them */
  const up_header *headers;
  size_t nheaders;
  const char *body;
  size_t body_len;
  const char *client_addr; /* for X-Forwarded-For; may be NULL */
  /* Non-NULL: polled while the request runs; non-zero aborts it. */
  int (*abort_check)(void *ctx);
  void *abort_ctx;
  /*
   * Non-NULL: the answer streams (idem mcp --listen). head(ctx, rs) runs
   * once the final header block is in (rs->status, rs->headers and
   * rs->content_length set), then data(ctx, p, n) for every piece of the
   * body, which rs->body then does not keep; data returns 0 to go on, -1
   * to end the transfer. No overall timeout applies, only the connect
   * timeout. Both run on the upstream loop's thread and must not block;
   * ctx is upstream_start()'s.
   */
  void (*head)(void *ctx, up_response *rs);
  int (*data)(void *ctx, const char *p, size_t n);
} up_request;

/* How a forward ended. */
typedef enum up_result {
  UP_OK,        /* a whole response arrived */
  UP_NOT_SENT,  /* nothing reached the upstream: connect failed */
  UP_TIMEOUT,   /* no whole answer within the timeout, after sending */
  UP_LOST,      /* the connection failed after the request was sent */
  UP_TOO_LARGE, /* the response's body is larger than max_pass, or its
                   headers larger than the gateway can send */
  UP_ABORTED,   /* abort_check asked to stop, after sending */
  UP_NO_FDS,    /* nothing sent: the gateway is out of descriptors */
  UP_INVALID    /* sent; the answer is not one HTTP can pass on (a
                   status outside 100-599, an unasked 101) */
} up_result;

struct up_response {
  int status;
  up_header *headers; /* end-to-end headers only */
  size_t nheaders;
  char *body;
  size_t body_len;
  char *content_length; /* the upstream's Content-Length, for HEAD and 304
                           answers, whose bodies are empty; may be NULL */
  double ms;            /* time spent */
  /* What went wrong, for UP_* other than UP_OK (malloc()ed: a forward in
   * flight holds none); read it with up_error(). */
  char *error;
};

/* Sets the base URL and limits and starts the loop thread; once, before
 * the first forward. 0, or -1. */
int upstream_init(const serve_config *cfg);
/* Called once per forward, on the upstream loop's thread: must not block. */
typedef void (*up_done_fn)(void *ctx, up_result r);
/*
 * Starts forwarding rq on the upstream loop; rq (and what it points to) and
 * rs must stay valid until done(ctx, result) is called, which fills rs.
 * 0, or -1 when out of memory (done is then never called).
 */
int upstream_start(const up_request *rq, up_response *rs, up_done_fn done,
                   void *ctx);
/* Asks every forward's abort_check on the loop soon (a stream waiting
 * without a timeout is not asked by libcurl). */
void upstream_check_aborts(void);
/* Forwards on the loop now. */
int upstream_active(void);
/* Ends every forward now, as if each had timed out (at shutdown, once the
 * drain's bound has passed): their done callbacks run. */
void upstream_abort(void);
void upstream_response_free(up_response *rs);
/* Sets rs->error from a format; out of memory, a fixed text. */
void up_set_error(up_response *rs, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* What went wrong ("" when nothing is said). */
const char *up_error(const up_response *rs);
/* Waits for the forwards in flight to end, stops the loop, frees it. */
void upstream_cleanup(void);
/*
 * Runs d (started with MHD_USE_EPOLL, without a thread of its own) on the
 * loop's thread from now on, beside the forwards: a request passed through
 * then wakes no other thread on its way to the upstream and back. d's
 * callbacks run on the loop's thread, so they must not block. Once, after
 * upstream_init(). 0, or -1.
 */
int upstream_drive(struct MHD_Daemon *d);
/* The daemon given to upstream_drive() has work that no descriptor shows
 * (a connection resumed): the loop runs it before it waits again. Any
 * thread. */
void upstream_driven_due(void);
/* On the loop's thread only: the loop calls fn (there) once, at least ms
 * from now and about then, before it runs the daemon. One fn for all
 * callers; a later time than one already asked for changes nothing. */
void upstream_after(int ms, void (*fn)(void));
/* MHD_quiesce_daemon() of the daemon given to upstream_drive(), on the
 * loop's thread (where d runs), and close() of its listening socket. */
void upstream_quiesce(void);

/* Non-zero for headers that a proxy does not pass on (RFC 9110 7.6.1), and
 * those it sets itself (Host, Content-Length). */
int header_is_hop_by_hop(const char *name);
/* Non-zero when the value of a Connection header names this header, which
 * is then hop-by-hop too. */
int header_named_by(const char *connection, const char *name);

/* A keyed body larger than this is fingerprinted by a fingerprint worker,
 * never on libmicrohttpd's threads. */
#define SERVE_INLINE_BODY (64 * 1024)

/* ---- pool.c: the store workers ------------------------------------------ */

/* Starts n workers. 0, or -1. */
int pool_start(int n);
/* Runs fn(arg) on a worker, in the order handed over. 0, or -1 when out of
 * memory or once pool_stop() has begun (fn is then not run). */
int pool_submit(void (*fn)(void *arg), void *arg);
/* Tasks handed over and not yet started. */
int pool_queued(void);
/* Runs what is queued, then ends the workers (the fingerprint workers'
 * too). */
void pool_stop(void);
/* The fingerprint workers (large keyed bodies): started, and handed a
 * task, as above. Without them pool_heavy_submit() is -1. */
int pool_heavy_start(int n);
int pool_heavy_submit(void (*fn)(void *arg), void *arg);

/* ---- request.c: what of a request makes its record ----------------------- */

/* The longest operation libidem takes. */
#define IDEM_OPERATION_MAX 255

/* s (n bytes) with every byte outside printable ASCII (0x21-0x7e)
 * percent-encoded; malloc()ed, NULL when out of memory. */
char *serve_printable(const char *s, size_t n);

/* The operation, "METHOD PATH" (path printable), or, past 255 bytes, the
 * path's first 100 bytes and its SHA-256. op has at least 256 bytes. 0, or
 * -1 for a method longer than 32 bytes. */
int serve_operation(const char *method, const char *path, char *op,
                    size_t size);

/* Non-zero for application/json and any +json media type. */
int serve_is_json_type(const char *content_type);

/* The key of an Idempotency-Key value: a token, or a structured-field
 * string ("..."), checked as libidem checks keys. malloc()ed; NULL with why
 * set when it is not a valid key. */
char *serve_parse_key(const char *value, char *why, size_t size);

/*
 * The request that is fingerprinted, as JSON: {"method", "path", "query"
 * (both printable), and "body" (the JSON body as sent, its numbers as the
 * client wrote them, when json_type and the body is one JSON value) or
 * "body_sha256"}. Always valid JSON. malloc()ed; NULL when out of memory.
 */
char *serve_request_json(const char *method, const char *uri, const char *body,
                         size_t len, int json_type);

/*
 * The fingerprint of the request serve_request_json() writes (as
 * idem_fingerprint() of it), from one pass over the body: a JSON body's
 * fingerprint text (idem_fingerprint_text()) is spliced into the small
 * envelope's, whose "body" member comes first in RFC 8785's order. 0, or
 * -1 when out of memory.
 */
int serve_request_fingerprint(const char *method, const char *uri,
                              const char *body, size_t len, int json_type,
                              char fp[IDEM_FINGERPRINT_SIZE]);

/* ---- gateway.c, admin.c, listen.c -------------------------------------- */

/* Starts the gateway's listener on cfg->listen; NULL, with why printed, on
 * failure. The address bound is written to bound. */
struct MHD_Daemon *gateway_start(const serve_config *cfg, idem_store *store,
                                 char *bound, size_t bound_size);

/* From now on answers close their connection: the gateway is stopping. */
void gateway_set_draining(void);

/* Starts the admin listener (/healthz, /readyz, /metrics); token not NULL:
 * every request to them must carry "Authorization: Bearer TOKEN".
 * console_token not NULL: the operator console is served at / and /api/
 * with that token (its audit log appended to audit_path, NULL: standard
 * error). */
struct MHD_Daemon *admin_start(idem_store *store, const char *listen,
                               const char *token, const char *console_token,
                               const char *audit_path, char *bound,
                               size_t bound_size);
/* From now on /readyz answers 503: the gateway is draining. */
void admin_set_draining(void);

/* ---- store.c: the gateway's store at start ------------------------------ */

/*
 * Opens cfg->store_url as idem_store_open() does, except that a missing
 * SQLite store is made only where none was before: a marker file beside
 * it (.NAME.idem-serve) says that one was, and then the start is refused
 * unless cfg->create_store. Writes what was opened to name
 * ("sqlite:/abs/path", or the PostgreSQL URL with its password as ***).
 * 0, or -1 with why printed.
 */
int serve_store_open(const serve_config *cfg, const idem_store_options *opts,
                     idem_store **out, char *name, size_t name_size);

/*
 * Starts a libmicrohttpd daemon on HOST:PORT ("127.0.0.1:8080",
 * "[::1]:8080", ":8080" for every address; port 0 for any free port) with
 * the given flags, handler and options. Prints why and returns NULL on
 * failure; what names the option in messages.
 */
/* 1 when HOST:PORT names only loopback addresses (127.0.0.0/8, ::1,
 * "localhost"), 0 otherwise (":PORT", 0.0.0.0, [::], any other address or
 * name), -1 when it cannot be read. */
int listen_is_loopback(const char *listen);

/* How libmicrohttpd's messages are marked: "idem serve" unless changed. */
extern const char *listen_log_name;
struct MHD_Daemon *listen_on(const char *cmd, const char *what,
                             const char *listen,
                             unsigned flags, MHD_AccessHandlerCallback handler,
                             void *cls, const struct MHD_OptionItem *options,
                             char *bound, size_t bound_size);

/* ---- guard.c: slow clients and connection limits (issue 20, part 5) ----- */

/* Starts the sweeper that closes connections whose request head is late;
 * before the gateway's daemon starts. 0, or -1 with why printed. */
int guard_start(const serve_config *cfg);
/* Stops it; after the gateway's daemon has stopped. */
void guard_stop(void);
/* MHD_OPTION_CONNECTION_LIMIT and MHD_OPTION_PER_IP_CONNECTION_LIMIT:
 * the options' values, or the defaults derived from them. */
unsigned guard_max_connections(const serve_config *cfg);
unsigned guard_max_connections_per_client(const serve_config *cfg);
/* MHD_OPTION_NOTIFY_CONNECTION: the registry of client connections. */
void guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code);
/* The first call of the access handler for a request: its head is in. */
void guard_head_done(struct MHD_Connection *c);
/* MHD_OPTION_NOTIFY_COMPLETED: a request ended; the next head's clock
 * starts with its first byte. */
void guard_request_done(struct MHD_Connection *c);
/* A message of libmicrohttpd's (its format): counted when it tells of a
 * connection closed over a limit. Non-zero to leave it out of the log: it
 * tells of a connection guard.c cut off, which /metrics counts. */
int guard_mhd_message(const char *fmt);
/* Their counters, in metrics.c. */
void metrics_connections(int delta);
void metrics_header_timeout(void);
void metrics_connection_refused(void);

/* ---- framing.c: strict HTTP/1.1 (issue 20, parts 3, 4, 8) ---------------- */

/* Why a request is refused: the answer's status (400 or 501), its problem
 * type's slug (urn:idem:problem:<type>, a static string), title (static)
 * and detail. The answer must close the connection. */
typedef struct serve_refusal {
  int status;
  const char *type, *title;
  char detail[512];
} serve_refusal;

/* Non-zero for a token (RFC 9110 5.6.2) of n > 0 bytes: a method, a header
 * field's name, in a request or in an upstream's answer. */
int serve_is_token(const char *s, size_t n);

/*
 * The largest request head the gateway takes (bytes), answered 431 above
 * it: nginx's default (four buffers of 8 KB). A request head and the head
 * of its answer (at most UP_MAX_HEADER_BYTES from the upstream, plus the
 * gateway's own fields) share libmicrohttpd's memory for the connection,
 * SERVE_CONNECTION_MEMORY: the two bounds keep room for both, so that an
 * answer the gateway stores it can always send.
 */
#define SERVE_MAX_HEAD (32 * 1024)
#define SERVE_CONNECTION_MEMORY (64 * 1024)

/* The longest method the gateway forwards (bytes); a longer one is
 * answered 501 by serve_check_head(). */
#define SERVE_METHOD_MAX 39

/*
 * The checks of RFC 9112 §3, §5 and §6 made once a request's head is in,
 * on the access handler's first call: method a token; request line with
 * single spaces and no NUL in the target; every header line "token: value"
 * without control characters (HTAB aside), none folded; one Host (present
 * in HTTP/1.1); not both Content-Length and Transfer-Encoding; one
 * Content-Length, digits only; Transfer-Encoding exactly "chunked", once,
 * and not in HTTP/1.0. method is the handler's own argument (it points
 * into libmicrohttpd's read buffer, which is read too); uri is the target
 * as the URI log callback copied it. 0 when the request may go on, else -1
 * with *why filled.
 */
int serve_check_head(struct MHD_Connection *c, const char *method,
                     const char *uri, serve_refusal *why);

/*
 * The request target made safe to append to the upstream's base URL and
 * normalised (RFC 3986 §6.2.2), so that spellings of one resource share a
 * record: unreserved characters percent-encoded are decoded ("%7E" is "~"),
 * other percent-encodings get upper-case hex ("%2f" is "%2F"), characters
 * that may not appear unencoded are encoded. Refused: a target that is not
 * a path, a space, control character, '#' or malformed '%' in it, an
 * encoded control character in the path, and any "." or ".." segment
 * (also as "%2e", mixed, or split by '\' or an encoded '/' or '\').
 * "/tickets" and "/tickets/" stay two resources. malloc()ed; NULL with
 * *why filled when refused (or out of memory).
 */
char *serve_target(const char *uri, serve_refusal *why);

#endif
