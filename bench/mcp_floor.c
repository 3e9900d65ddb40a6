/*
 * mcp_floor.c -- the floor of a fresh keyed tools/call through any proxy
 * that keeps idem's records (bench/mcp.sh's "serial floor").
 *
 * One thread does the least such a call needs, one call after the other:
 * it claims a new key in the store (a durable commit), makes the call to
 * the server itself and reads its answer, and records the answer (a second
 * durable commit). No client, no proxy, no parsing, no fingerprint: what
 * is left is the server's round trip and the store's two commits, each made
 * after a wait on the server, as a proxy's are.
 *
 * Why bench/mcp.sh needs it beside `idem bench` (claim + complete back to
 * back): a commit that follows a pause costs more than one that follows
 * another commit. Part of it is the processor woken from idle, part the
 * disk: with idem's SQLite store at synchronous=FULL on the 2-core virtual
 * machine these figures come from, a claim took 248-263 us back to back,
 * 373-403 us after 1 ms asleep and 317-356 us after 1 ms of busy waiting
 * (completions alike; medians of 950-1,000 calls, two runs of `mcp_floor
 * STORE 6 gaps`). Adding the back-to-back floor to the server's round trip
 * therefore asks a proxy for commits that no program waiting on a server
 * gets.
 *
 *   mcp_floor STORE SECONDS http URL        (Streamable HTTP, one session)
 *   mcp_floor STORE SECONDS stdio CMD ARG...  (a stdio server it starts)
 *   mcp_floor STORE SECONDS gaps            (no server: the figures above)
 *   mcp_floor STORE relay CMD ARG...        (a proxy: see relay() below)
 *   mcp_floor STORE httprelay URL           (a proxy over Streamable HTTP:
 *                                            see http_relay() below)
 *   mcp_floor STORE mhdrelay URL            (the same on libmicrohttpd: see
 *                                            mhd_relay() below)
 *
 * The server must have server-everything's echo tool. Every answer is
 * checked (its id and the echo's text); a wrong one ends the run with exit
 * 1. Prints one JSON line: ops_per_s, p50_ms, calls, seconds.
 */
#define _GNU_SOURCE
#include "floor_io.h"

#include <curl/curl.h>
#include <idem.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* ---- the server -------------------------------------------------------- */

/* HTTP: one easy handle (one kept-alive connection), the session and the
 * last answer's content type. */
static __thread CURL *http;
static const char *http_url;
static __thread char session[256];
static __thread char content_type[128];

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
  text_add(ctx, p, size * n);
  return size * n;
}

static size_t on_header(char *p, size_t size, size_t n, void *ctx) {
  size_t len = size * n;
  (void)ctx;
  if (!header_value(p, len, "mcp-session-id:", session, sizeof session))
    header_value(p, len, "content-type:", content_type, sizeof content_type);
  return len;
}

/* Posts body in the session; the answer's body in answer, its status
 * returned (200 or 202, or the run ends). */
static long http_post(const char *body, text *answer) {
  struct curl_slist *h = NULL;
  char sh[300];
  CURLcode cc;
  long status = 0;
  h = curl_slist_append(h, "Content-Type: application/json");
  h = curl_slist_append(h, "Accept: application/json, text/event-stream");
  h = curl_slist_append(h, "MCP-Protocol-Version: 2025-06-18");
  if (session[0]) {
    snprintf(sh, sizeof sh, "Mcp-Session-Id: %s", session);
    h = curl_slist_append(h, sh);
  }
  answer->len = 0;
  content_type[0] = '\0';
  curl_easy_setopt(http, CURLOPT_URL, http_url);
  curl_easy_setopt(http, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(http, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(http, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(http, CURLOPT_WRITEDATA, answer);
  curl_easy_setopt(http, CURLOPT_HEADERFUNCTION, on_header);
  if ((cc = curl_easy_perform(http)) != CURLE_OK)
    floor_die(http_url, curl_easy_strerror(cc));
  curl_easy_getinfo(http, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(h);
  if (status != 200 && status != 202)
    floor_die(http_url, answer->len ? answer->buf : "not 200 or 202");
  text_add(answer, "", 0); /* "" when nothing came */
  return status;
}

/* stdio: the server's pipes. */
static FILE *to_server, *from_server;
static pid_t server_pid;

static void stdio_start(char **argv) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0)
    floor_die("pipe", "cannot make one");
  if ((server_pid = fork()) < 0)
    floor_die("fork", "cannot");
  if (server_pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_server = fdopen(in[1], "w");
  from_server = fdopen(out[0], "r");
  if (!to_server || !from_server)
    floor_die("fdopen", "cannot");
}

/* Closes the server's pipes, ends it and waits for it. */
static void stdio_stop(void) {
  fclose(to_server);
  fclose(from_server);
  kill(server_pid, SIGTERM);
  waitpid(server_pid, NULL, 0);
}

/* Sends a line and reads lines up to the answer whose id is id (the
 * server's notifications are skipped); id < 0: a notification, no answer. */
static void stdio_call(const char *line, long id, text *answer) {
  static char *buf;
  static size_t cap;
  char want[2][48];
  fputs(line, to_server);
  fputc('\n', to_server);
  fflush(to_server);
  answer->len = 0;
  if (id < 0)
    return;
  snprintf(want[0], sizeof want[0], "\"id\":%ld,", id);
  snprintf(want[1], sizeof want[1], "\"id\":%ld}", id);
  for (;;) {
    ssize_t n = getline(&buf, &cap, from_server);
    if (n < 0)
      floor_die("stdio server", "its output ended");
    if (strstr(buf, want[0]) || strstr(buf, want[1])) {
      text_add(answer, buf, (size_t)n);
      return;
    }
  }
}

static int use_http;

static void call(const char *line, long id, text *answer) {
  if (use_http)
    http_post(line, answer);
  else
    stdio_call(line, id, answer);
}

static void handshake(void) {
  text a = {0};
  call("{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{"
       "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},"
       "\"clientInfo\":{\"name\":\"mcp_floor\",\"version\":\"1\"}}}",
       0, &a);
  if (!strstr(a.buf, "\"result\""))
    floor_die("initialize", a.buf);
  call("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", -1,
       &a);
  free(a.buf);
}

/* ---- the calls ----------------------------------------------------------- */

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Waits 1 ms: asleep, or busy (the processor kept awake). */
static void pause_1ms(int busy) {
  if (busy) {
    double until = now_ms() + 1;
    while (now_ms() < until)
      ;
  } else {
    struct timespec t = {0, 1000000};
    nanosleep(&t, NULL);
  }
}

/*
 * gaps: a claim and its completion, each timed, with nothing between
 * calls, with 1 ms asleep before each, and with 1 ms of busy waiting
 * before each, in turns of 50 calls until SECONDS have passed; the medians.
 */
static int gaps(idem_store *store, double secs) {
  static const char *const names[3] = {"back to back", "after 1 ms asleep",
                                       "after 1 ms busy"};
  size_t cap = 1 << 16, n[3] = {0, 0, 0};
  double *lat[3][2];
  double end = now_ms() + 1000 * secs;
  long k = 0;
  for (int m = 0; m < 3; m++)
    for (int j = 0; j < 2; j++)
      if (!(lat[m][j] = malloc(cap * sizeof(double))))
        floor_die("memory", "out of memory");
  while (now_ms() < end)
    for (int m = 0; m < 3; m++)
      for (int i = 0; i < 50 && n[m] < cap; i++) {
        char key[64];
        idem_call *c;
        double t;
        snprintf(key, sizeof key, "gap-%ld-%ld", (long)getpid(), ++k);
        if (m)
          pause_1ms(m == 2);
        t = now_ms();
        c = floor_claim(store, "gaps", key);
        lat[m][0][n[m]] = now_ms() - t;
        if (m)
          pause_1ms(m == 2);
        t = now_ms();
        floor_record(store, c, 200, "{}", 2);
        lat[m][1][n[m]++] = now_ms() - t;
      }
  for (int m = 0; m < 3; m++) {
    qsort(lat[m][0], n[m], sizeof(double), cmp);
    qsort(lat[m][1], n[m], sizeof(double), cmp);
    printf("%-18s claim p50 %4.0f us, complete p50 %4.0f us (%zu calls)\n",
           names[m], n[m] ? 1000 * lat[m][0][n[m] / 2] : 0,
           n[m] ? 1000 * lat[m][1][n[m] / 2] : 0, n[m]);
    free(lat[m][0]);
    free(lat[m][1]);
  }
  idem_store_close(store);
  return 0;
}

/* Claims the key that message holds in its "idempotencyKey" (found by its
 * text, not parsed): the call, or NULL where it holds none. */
static idem_call *claim_marked(idem_store *store, const char *message) {
  static const char mark[] = "\"idempotencyKey\":\"";
  const char *k = strstr(message, mark), *e;
  char key[256];
  size_t kl;
  if (!k)
    return NULL;
  k += sizeof mark - 1;
  e = strchr(k, '"');
  kl = e ? (size_t)(e - k) : 0;
  if (!kl || kl >= sizeof key)
    floor_die("relay", "a key it cannot read");
  memcpy(key, k, kl);
  key[kl] = '\0';
  return floor_claim(store, "echo", key);
}

/*
 * relay: the least a proxy in front of a stdio server does for a fresh
 * keyed call, on one thread, with the client's own pipes: it reads the
 * client's line, claims the key it finds in it, writes the line to the
 * server unchanged, reads the answer, records it and writes it to the
 * client, until the client closes its end. bench/mcp.sh drives it with the
 * same client as `idem mcp` ("relay floor"): the serial floor plus the
 * client's hop, which a proxy cannot avoid. No parsing (the key and the id
 * are found by their text), no fingerprint, no second thread: it blocks on
 * the store and on the server where a proxy must not, and answers only
 * the call it waits for (the server's other lines are dropped).
 */
static int relay(idem_store *store, char **cmd) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  text a = {0};
  stdio_start(cmd);
  while ((n = getline(&line, &cap, stdin)) > 0) {
    const char *at = strstr(line, "\"id\":");
    long id = at ? strtol(at + 5, NULL, 10) : -1;
    idem_call *c;
    if (line[n - 1] == '\n')
      line[--n] = '\0';
    c = claim_marked(store, line);
    stdio_call(line, id, &a);
    if (c)
      floor_record(store, c, 200, a.buf, a.len);
    if (a.len && (fwrite(a.buf, 1, a.len, stdout) != a.len || fflush(stdout)))
      break;
  }
  free(line);
  free(a.buf);
  stdio_stop();
  idem_store_close(store);
  return 0;
}

/* ---- the relay over Streamable HTTP ------------------------------------ */

static volatile sig_atomic_t stopping;

static void on_term(int sig) {
  (void)sig;
  stopping = 1;
}

/* What both relays over HTTP do with a request's body: claim the key it
 * holds (if any), post it to the server in the session, record the answer
 * under the key; the server's status. */
static long relay_post(idem_store *store, const char *body, text *answer) {
  idem_call *c = claim_marked(store, body);
  long status = http_post(body, answer);
  if (c)
    floor_record(store, c, 200, answer->buf, answer->len);
  return status;
}

/* One client connection of the relay over HTTP, on a thread of its own:
 * its socket, what it sent, the upstream's answer and the answer made. */
typedef struct {
  int fd;
  text in, body, a, out;
} rconn;

/* Answers the whole request at the start of r->in (head and blen from
 * read_message()) and takes it off; 0 if the client's connection broke. */
static int relay_request(idem_store *store, rconn *r, size_t head,
                         size_t blen) {
  long status;
  char line[512];
  int ok;
  if (!find_header(&r->in, head, "mcp-session-id:", session, sizeof session))
    session[0] = '\0';
  if (strncmp(r->in.buf, "POST ", 5) != 0) {
    static const char no[] =
        "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n";
    ok = write_all(r->fd, no, sizeof no - 1);
  } else {
    r->body.len = 0;
    text_add(&r->body, r->in.buf + head, blen);
    status = relay_post(store, r->body.buf, &r->a);
    r->out.len = 0;
    snprintf(line, sizeof line, "HTTP/1.1 %ld %s\r\n", status,
             status == 200 ? "OK" : "Accepted");
    text_add(&r->out, line, strlen(line));
    if (content_type[0]) {
      snprintf(line, sizeof line, "Content-Type: %s\r\n", content_type);
      text_add(&r->out, line, strlen(line));
    }
    if (session[0]) {
      snprintf(line, sizeof line, "Mcp-Session-Id: %s\r\n", session);
      text_add(&r->out, line, strlen(line));
    }
    snprintf(line, sizeof line, "Content-Length: %zu\r\n\r\n", r->a.len);
    text_add(&r->out, line, strlen(line));
    text_add(&r->out, r->a.buf, r->a.len);
    ok = write_all(r->fd, r->out.buf, r->out.len);
  }
  text_drop(&r->in, head + blen);
  return ok;
}

static idem_store *relay_store;

/* A client connection's thread: its own kept-alive connection to the
 * server (one easy handle), until the client's ends. */
static void *relay_conn(void *arg) {
  rconn *r = arg;
  size_t head, blen;
  if (!(http = curl_easy_init()))
    floor_die("curl", "cannot start");
  while (read_message(r->fd, &r->in, &head, &blen) &&
         relay_request(relay_store, r, head, blen))
    ;
  curl_easy_cleanup(http);
  close(r->fd);
  free(r->in.buf);
  free(r->body.buf);
  free(r->a.buf);
  free(r->out.buf);
  free(r);
  return NULL;
}

/*
 * http_relay: relay() over Streamable HTTP. It listens on a free port of
 * 127.0.0.1 (its URL on stderr: "mcp_floor: listening on URL") and gives
 * each client connection a thread of its own, which, for each request on
 * it (keep-alive, one at a time), reads it whole, claims the key it finds
 * in the body, posts the body to URL on its own kept-alive connection
 * (libcurl, as the serial floor; the request's Mcp-Session-Id passed on),
 * reads the whole answer, records it and writes it back in one write with
 * the upstream's status, Content-Type and Mcp-Session-Id, until SIGTERM.
 * No streaming, no parsing, no GET stream: the least a proxy does for a
 * fresh call over HTTP, blocking where a proxy must not; with many
 * clients, their threads share the store (and its group commit) as a
 * proxy's calls do.
 */
static int http_relay(idem_store *store, const char *url) {
  struct sigaction st;
  pthread_attr_t attr;
  sigset_t stop_sigs, was;
  int port, ls = floor_listen(&port);
  sigemptyset(&stop_sigs);
  sigaddset(&stop_sigs, SIGTERM);
  sigaddset(&stop_sigs, SIGINT);
  memset(&st, 0, sizeof st);
  st.sa_handler = on_term; /* no SA_RESTART: accept() returns */
  sigaction(SIGTERM, &st, NULL);
  sigaction(SIGINT, &st, NULL);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  relay_store = store;
  http_url = url;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  fprintf(stderr, "mcp_floor: listening on http://127.0.0.1:%d/mcp\n", port);
  while (!stopping) {
    pthread_t t;
    rconn *r;
    int fd = floor_accept(ls);
    if (fd < 0)
      continue;
    if (!(r = calloc(1, sizeof *r)))
      floor_die("memory", "out of memory");
    r->fd = fd;
    /* The connection's thread blocks SIGTERM and SIGINT (it inherits this
     * mask): they go to this thread, whose accept() they end. */
    pthread_sigmask(SIG_BLOCK, &stop_sigs, &was);
    if (pthread_create(&t, &attr, relay_conn, r) != 0)
      floor_die("httprelay", "cannot start a thread");
    pthread_sigmask(SIG_SETMASK, &was, NULL);
  }
  /* The connections' threads may be in a call: the process ends under
   * them (the store is the bench's, and its log keeps what was
   * committed). */
  _exit(0);
}

/*
 * mhd_relay: http_relay() with libmicrohttpd on the client's side, as idem
 * mcp --listen has, in the cheapest way that library offers: a thread of
 * its own per client connection (MHD_USE_THREAD_PER_CONNECTION), whose
 * request handler, once the body is in, claims the key it finds, posts the
 * body to URL with the thread's own libcurl handle (blocking, kept alive),
 * records the answer and queues it whole, with the upstream's status,
 * Content-Type and Mcp-Session-Id. No suspension, no event loop, no
 * parsing, no streaming: the least a proxy built on the two libraries that
 * idem's proxy is built on (libmicrohttpd and libcurl) costs a call.
 */
typedef struct {
  text body;
} mreq;

static __thread text mhd_answer;

static enum MHD_Result mhd_handle(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  mreq *q = *con_cls;
  struct MHD_Response *r;
  enum MHD_Result ok;
  const char *sid;
  long status;
  (void)cls, (void)url, (void)version;
  if (!q) {
    if (!(q = calloc(1, sizeof *q)))
      return MHD_NO;
    *con_cls = q;
    return MHD_YES;
  }
  if (*upload_size) {
    text_add(&q->body, upload, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "POST") != 0) {
    r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    ok = MHD_queue_response(conn, MHD_HTTP_METHOD_NOT_ALLOWED, r);
    MHD_destroy_response(r);
    return ok;
  }
  if (!http && !(http = curl_easy_init()))
    floor_die("curl", "cannot start");
  sid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Mcp-Session-Id");
  snprintf(session, sizeof session, "%s", sid ? sid : "");
  text_add(&q->body, "", 0); /* "" when nothing came */
  status = relay_post(relay_store, q->body.buf, &mhd_answer);
  r = MHD_create_response_from_buffer(mhd_answer.len, mhd_answer.buf,
                                      MHD_RESPMEM_MUST_COPY);
  if (!r)
    return MHD_NO;
  if (content_type[0])
    MHD_add_response_header(r, "Content-Type", content_type);
  if (session[0])
    MHD_add_response_header(r, "Mcp-Session-Id", session);
  ok = MHD_queue_response(conn, (unsigned)status, r);
  MHD_destroy_response(r);
  return ok;
}

static void mhd_completed(void *cls, struct MHD_Connection *conn,
                          void **con_cls, enum MHD_RequestTerminationCode t) {
  mreq *q = *con_cls;
  (void)cls, (void)conn, (void)t;
  if (q) {
    free(q->body.buf);
    free(q);
  }
  *con_cls = NULL;
}

static int mhd_relay(idem_store *store, const char *url) {
  sigset_t stop_sigs;
  int port, sig, ls = floor_listen(&port);
  struct MHD_Daemon *d;
  sigemptyset(&stop_sigs);
  sigaddset(&stop_sigs, SIGTERM);
  sigaddset(&stop_sigs, SIGINT);
  /* Blocked before the daemon's threads start: they inherit the mask, and
   * sigwait() below takes the stop. */
  pthread_sigmask(SIG_BLOCK, &stop_sigs, NULL);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  relay_store = store;
  http_url = url;
  d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
          MHD_USE_POLL,
      0, NULL, NULL, mhd_handle, NULL, MHD_OPTION_LISTEN_SOCKET, ls,
      MHD_OPTION_NOTIFY_COMPLETED, mhd_completed, NULL, MHD_OPTION_END);
  if (!d)
    floor_die("mhdrelay", "libmicrohttpd did not start");
  fprintf(stderr, "mcp_floor: listening on http://127.0.0.1:%d/mcp\n", port);
  sigwait(&stop_sigs, &sig);
  /* As http_relay(): the connections' threads may be in a call. */
  _exit(0);
}

int main(int argc, char **argv) {
  idem_store *store;
  double secs, t0, end;
  double *lat = NULL;
  size_t nlat = 0, caplat = 0;
  long calls = 0;
  text a = {0};
  int gap_mode = argc == 4 && strcmp(argv[3], "gaps") == 0;
  if (argc >= 4 && strcmp(argv[2], "relay") == 0) {
    signal(SIGPIPE, SIG_IGN);
    if (idem_store_open(argv[1], NULL, &store) != IDEM_OK)
      floor_die(argv[1], idem_errmsg());
    return relay(store, argv + 3);
  }
  if (argc == 4 && strcmp(argv[2], "httprelay") == 0) {
    signal(SIGPIPE, SIG_IGN);
    if (idem_store_open(argv[1], NULL, &store) != IDEM_OK)
      floor_die(argv[1], idem_errmsg());
    return http_relay(store, argv[3]);
  }
  if (argc == 4 && strcmp(argv[2], "mhdrelay") == 0) {
    signal(SIGPIPE, SIG_IGN);
    if (idem_store_open(argv[1], NULL, &store) != IDEM_OK)
      floor_die(argv[1], idem_errmsg());
    return mhd_relay(store, argv[3]);
  }
  if (!gap_mode &&
      (argc < 5 || (strcmp(argv[3], "http") != 0 && strcmp(argv[3], "stdio"))))
    floor_die(
        "usage",
        "mcp_floor STORE SECONDS http URL | mcp_floor STORE SECONDS stdio CMD "
        "ARG... | mcp_floor STORE SECONDS gaps | mcp_floor STORE relay CMD "
        "ARG... | mcp_floor STORE httprelay URL | mcp_floor STORE mhdrelay "
        "URL");
  secs = atof(argv[2]);
  use_http = strcmp(argv[3], "http") == 0;
  signal(SIGPIPE, SIG_IGN);
  if (idem_store_open(argv[1], NULL, &store) != IDEM_OK)
    floor_die(argv[1], idem_errmsg());
  if (gap_mode)
    return gaps(store, secs);
  if (use_http) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!(http = curl_easy_init()))
      floor_die("curl", "cannot start");
    http_url = argv[4];
  } else {
    stdio_start(argv + 4);
  }
  handshake();
  /* Warm: the server's first calls and the store's first pages. */
  t0 = now_ms();
  end = t0 + 1000 * secs + 500;
  for (long i = 1; now_ms() < end; i++) {
    char key[64], line[256], want[64];
    idem_call *c;
    double s = now_ms();
    snprintf(key, sizeof key, "floor-%ld-%ld", (long)getpid(), i);
    c = floor_claim(store, "echo", key);
    snprintf(line, sizeof line,
             "{\"jsonrpc\":\"2.0\",\"id\":%ld,\"method\":\"tools/call\","
             "\"params\":{\"name\":\"echo\",\"arguments\":{\"message\":"
             "\"hello %ld\"}}}",
             i, i);
    call(line, i, &a);
    snprintf(want, sizeof want, "Echo: hello %ld\"", i);
    if (!strstr(a.buf, want))
      floor_die("tools/call", a.buf);
    floor_record(store, c, 200, a.buf, a.len);
    if (s - t0 >= 500) { /* timed after the first half second */
      if (nlat == caplat) {
        caplat = caplat ? caplat * 2 : 4096;
        if (!(lat = realloc(lat, caplat * sizeof *lat)))
          floor_die("memory", "out of memory");
      }
      lat[nlat++] = now_ms() - s;
      calls++;
    }
  }
  qsort(lat, nlat, sizeof *lat, cmp);
  printf("{\"mode\":\"serial floor\",\"calls\":%ld,\"seconds\":%.3f,"
         "\"ops_per_s\":%.1f,\"p50_ms\":%.3f}\n",
         calls, secs, (double)calls / secs, nlat ? lat[nlat / 2] : 0.0);
  free(lat);
  free(a.buf);
  if (use_http) {
    curl_easy_cleanup(http);
    curl_global_cleanup();
  } else {
    stdio_stop();
  }
  idem_store_close(store);
  return 0;
}
