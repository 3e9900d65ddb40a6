/*
 * test_pg_link.c -- the PostgreSQL store when its connection dies with a
 * write on the wire.
 *
 * The store is opened through a small proxy (a thread of this test, on a
 * Unix socket of its own) that forwards the protocol between libpq and the
 * server of IDEM_TEST_PG_URL, and that can be told to cut one connection:
 *
 *   CUT_REQUEST  when the client sends bytes containing a pattern, drop
 *                them and close both sides: the server never ran the
 *                statement;
 *   CUT_REPLY    when the server answers with bytes containing a pattern,
 *                drop them and close both sides: the statement ran and
 *                committed (an answer is flushed only after the commit),
 *                but the client never learns it.
 *
 * For each write idem makes outside a caller's transaction (a claim's
 * insert, a takeover's COMMIT, complete, release, mark unknown), a cut
 * answer or request must not reach the caller: the call succeeds once the
 * connection is re-established, because the store sends the write again
 * and, when that changes nothing (or for the COMMIT, which cannot be sent
 * again), reads the row to tell whether the first send had committed. A
 * local action whose COMMIT answer is lost gets a clear IDEM_EUNAVAILABLE
 * (its action cannot be run again); the retry of the call replays the one
 * committed response. When the server cannot be reached again, the claim
 * fails with IDEM_EUNAVAILABLE and the key waits for its lease, then is
 * recovered.
 *
 * Every test checks that the cut happened, the outcome and attempt, the
 * records and side effects counted through a separate connection, and the
 * response bytes read back through a second store handle.
 *
 * Needs IDEM_TEST_PG_URL (scripts/check.sh starts a server); without it the
 * test fails, it never skips. Each test uses a schema of its own, dropped
 * at the end.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "idem.h"

#define OPERATION "POST /tickets"
#define TENANT "tenant-a"
#define PAYLOAD "{\"title\":\"printer on fire\"}"
#define META "{\"content-type\":\"application/json\"}"
#define MAX_PAIRS 32
#define URL_MAX 1024

/* ---- the proxy ------------------------------------------------------------ */

typedef enum cut_kind { CUT_NONE, CUT_REQUEST, CUT_REPLY } cut_kind;

#define TAIL 63 /* a pattern is at most this long */

typedef struct proxy {
  char dir[64];      /* holds the listening socket .s.PGSQL.<port> */
  char port[16];     /* the server's port, which the socket name carries */
  char target[256];  /* the server: a socket path, or a TCP host */
  int target_is_tcp;
  int lfd;           /* listening */
  int wake[2];       /* a byte here ends the loop */
  pthread_t thread;
  int pairs[MAX_PAIRS][2]; /* client, server; -1 when unused */
  /* The last bytes each side sent, so that a pattern split between two
   * reads is still found. */
  char tail[MAX_PAIRS][2][TAIL];
  size_t tail_len[MAX_PAIRS][2];
  char scratch[TAIL + 65536];
  pthread_mutex_t mu;
  cut_kind armed;    /* one cut at a time, disarmed when it happens */
  char pattern[TAIL];
  size_t pattern_len;
  int refuse;        /* close new connections at once */
  int cuts;          /* cuts made */
  int accepted;      /* connections forwarded */
} proxy;

static int connect_target(proxy *p) {
  int fd = -1;
  if (!p->target_is_tcp) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/.s.PGSQL.%s",
                         p->target, p->port) >= sizeof a.sun_path)
      return -1;
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
      close(fd);
      fd = -1;
    }
    return fd;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai, *i;
  if (getaddrinfo(p->target, p->port, &hints, &ai) != 0)
    return -1;
  for (i = ai; i && fd < 0; i = i->ai_next) {
    fd = socket(i->ai_family, i->ai_socktype, i->ai_protocol);
    if (fd >= 0 && connect(fd, i->ai_addr, i->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  return fd;
}

static int write_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static void close_pair(proxy *p, int i) {
  close(p->pairs[i][0]);
  close(p->pairs[i][1]);
  p->pairs[i][0] = p->pairs[i][1] = -1;
}

static void accept_one(proxy *p) {
  int c = accept(p->lfd, NULL, NULL), s, i, refuse;
  if (c < 0)
    return;
  pthread_mutex_lock(&p->mu);
  refuse = p->refuse;
  pthread_mutex_unlock(&p->mu);
  if (refuse || (s = connect_target(p)) < 0) {
    close(c);
    return;
  }
  for (i = 0; i < MAX_PAIRS; i++)
    if (p->pairs[i][0] < 0) {
      p->pairs[i][0] = c;
      p->pairs[i][1] = s;
      p->tail_len[i][0] = p->tail_len[i][1] = 0;
      pthread_mutex_lock(&p->mu);
      p->accepted++;
      pthread_mutex_unlock(&p->mu);
      return;
    }
  close(c);
  close(s);
}

/* Forwards what side `from` of pair i has, unless the armed cut matches. */
static void forward(proxy *p, int i, int from) {
  size_t kept = p->tail_len[i][from], all;
  char *buf = p->scratch + kept;
  ssize_t n = recv(p->pairs[i][from], buf, sizeof p->scratch - TAIL, 0);
  int cut = 0;
  if (n <= 0) {
    close_pair(p, i);
    return;
  }
  /* Searched with the bytes before it: the part already forwarded holds
   * no whole match, or it would have been cut then. */
  memcpy(p->scratch, p->tail[i][from], kept);
  all = kept + (size_t)n;
  pthread_mutex_lock(&p->mu);
  if (p->armed == (from == 0 ? CUT_REQUEST : CUT_REPLY) &&
      memmem(p->scratch, all, p->pattern, p->pattern_len)) {
    p->armed = CUT_NONE;
    p->cuts++;
    cut = 1;
  }
  pthread_mutex_unlock(&p->mu);
  if (cut || write_all(p->pairs[i][!from], buf, (size_t)n) != 0) {
    close_pair(p, i);
    return;
  }
  kept = all < TAIL ? all : TAIL;
  memcpy(p->tail[i][from], p->scratch + all - kept, kept);
  p->tail_len[i][from] = kept;
}

static void *proxy_main(void *arg) {
  proxy *p = arg;
  for (;;) {
    struct pollfd fds[2 + 2 * MAX_PAIRS];
    int where[2 + 2 * MAX_PAIRS], n = 0, i;
    fds[n] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
    where[n++] = -1;
    fds[n] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
    where[n++] = -2;
    for (i = 0; i < MAX_PAIRS; i++)
      if (p->pairs[i][0] >= 0) {
        fds[n] = (struct pollfd){.fd = p->pairs[i][0], .events = POLLIN};
        where[n++] = 2 * i;
        fds[n] = (struct pollfd){.fd = p->pairs[i][1], .events = POLLIN};
        where[n++] = 2 * i + 1;
      }
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (fds[0].revents)
      break;
    if (fds[1].revents)
      accept_one(p);
    for (i = 2; i < n; i++) {
      int pair = where[i] / 2;
      /* A pair closed earlier in this pass has nothing more to say. */
      if (fds[i].revents && p->pairs[pair][0] >= 0)
        forward(p, pair, where[i] % 2);
    }
  }
  return NULL;
}

/* Starts the proxy for the server of `url`. 0, or -1 with the reason. */
static int proxy_start(proxy *p, const char *url) {
  PQconninfoOption *o = PQconninfoParse(url, NULL), *i;
  const char *host = NULL, *port = NULL;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  memset(p, 0, sizeof *p);
  for (int k = 0; k < MAX_PAIRS; k++)
    p->pairs[k][0] = p->pairs[k][1] = -1;
  p->lfd = p->wake[0] = p->wake[1] = -1;
  if (!o) {
    fprintf(stderr, "proxy: cannot parse IDEM_TEST_PG_URL\n");
    return -1;
  }
  for (i = o; i->keyword; i++) {
    if (!strcmp(i->keyword, "host") && i->val && *i->val)
      host = i->val;
    if (!strcmp(i->keyword, "port") && i->val && *i->val)
      port = i->val;
  }
  snprintf(p->target, sizeof p->target, "%s", host ? host : "/tmp");
  snprintf(p->port, sizeof p->port, "%s", port ? port : "5432");
  PQconninfoFree(o);
  p->target_is_tcp = p->target[0] != '/';
  pthread_mutex_init(&p->mu, NULL);
  snprintf(p->dir, sizeof p->dir, "/tmp/idem-link.XXXXXX");
  if (!mkdtemp(p->dir) || pipe(p->wake) != 0) {
    fprintf(stderr, "proxy: %s\n", strerror(errno));
    return -1;
  }
  snprintf(a.sun_path, sizeof a.sun_path, "%s/.s.PGSQL.%s", p->dir, p->port);
  p->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(p->lfd, 16) != 0 ||
      pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
    fprintf(stderr, "proxy: listen on %s: %s\n", a.sun_path, strerror(errno));
    return -1;
  }
  return 0;
}

static void proxy_stop(proxy *p) {
  char sock[128];
  if (write(p->wake[1], "x", 1) == 1)
    pthread_join(p->thread, NULL);
  for (int i = 0; i < MAX_PAIRS; i++)
    if (p->pairs[i][0] >= 0)
      close_pair(p, i);
  close(p->lfd);
  close(p->wake[0]);
  close(p->wake[1]);
  snprintf(sock, sizeof sock, "%s/.s.PGSQL.%s", p->dir, p->port);
  unlink(sock);
  rmdir(p->dir);
  pthread_mutex_destroy(&p->mu);
}

/* Arms one cut on the first bytes containing pattern (len bytes, which
 * may hold NULs). */
static void proxy_arm_bytes(proxy *p, cut_kind kind, const char *pattern,
                            size_t len) {
  pthread_mutex_lock(&p->mu);
  p->armed = kind;
  if (len > sizeof p->pattern)
    len = sizeof p->pattern;
  memcpy(p->pattern, pattern, len);
  p->pattern_len = len;
  pthread_mutex_unlock(&p->mu);
}

static void proxy_arm(proxy *p, cut_kind kind, const char *pattern) {
  proxy_arm_bytes(p, kind, pattern, strlen(pattern));
}

static void proxy_refuse(proxy *p, int refuse) {
  pthread_mutex_lock(&p->mu);
  p->refuse = refuse;
  pthread_mutex_unlock(&p->mu);
}

static int proxy_cuts(proxy *p) {
  int n;
  pthread_mutex_lock(&p->mu);
  n = p->cuts;
  pthread_mutex_unlock(&p->mu);
  return n;
}

static int proxy_accepted(proxy *p) {
  int n;
  pthread_mutex_lock(&p->mu);
  n = p->accepted;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* ---- fixture ---------------------------------------------------------------- */

typedef struct fixture {
  proxy px;
  char schema[64];
  char direct[URL_MAX]; /* the server itself, with idem_schema= */
  char linked[URL_MAX]; /* through the proxy, with idem_schema= */
  idem_store *store;    /* through the proxy */
  idem_store *other;    /* direct: a fresh cache, for reading back */
} fixture;

static unsigned serial;

/* Runs sql (with "{S}" for the quoted schema) on a connection of its own;
 * returns the first column of the first row as a number, 0 when there is
 * none, and fails the test on an error. */
static long side_sql(const fixture *f, const char *tmpl) {
  char sql[1024], *o = sql;
  const char *t;
  char url[URL_MAX];
  PGconn *c;
  PGresult *r;
  long v = 0;
  for (t = tmpl; *t && o < sql + sizeof sql - 80; t++)
    if (!strncmp(t, "{S}", 3)) {
      o += sprintf(o, "\"%s\"", f->schema);
      t += 2;
    } else
      *o++ = *t;
  *o = '\0';
  snprintf(url, sizeof url, "%s", getenv("IDEM_TEST_PG_URL"));
  c = PQconnectdb(url);
  if (PQstatus(c) != CONNECTION_OK)
    fail_msg("side connection: %s", PQerrorMessage(c));
  r = PQexec(c, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK &&
      PQresultStatus(r) != PGRES_COMMAND_OK)
    fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
    v = atol(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(c);
  return v;
}

static int setup(void **state) {
  const char *url = getenv("IDEM_TEST_PG_URL");
  fixture *f = calloc(1, sizeof *f);
  PQconninfoOption *o;
  const char *user = NULL, *db = NULL;
  int rc;
  if (!f)
    return -1;
  if (proxy_start(&f->px, url) != 0)
    return -1;
  snprintf(f->schema, sizeof f->schema, "link_%ld_%u", (long)getpid(),
           ++serial);
  snprintf(f->direct, sizeof f->direct, "%s%cidem_schema=%s", url,
           strchr(url, '?') ? '&' : '?', f->schema);
  o = PQconninfoParse(url, NULL);
  for (PQconninfoOption *i = o; i && i->keyword; i++) {
    if (!strcmp(i->keyword, "user") && i->val && *i->val)
      user = i->val;
    if (!strcmp(i->keyword, "dbname") && i->val && *i->val)
      db = i->val;
  }
  snprintf(f->linked, sizeof f->linked,
           "postgresql://%s%s/%s?host=%s&port=%s&idem_schema=%s",
           user ? user : "", user ? "@" : "", db ? db : "postgres", f->px.dir,
           f->px.port, f->schema);
  PQconninfoFree(o);
  *state = f;
  side_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  if ((rc = idem_store_open(f->direct, NULL, &f->other)) != IDEM_OK ||
      (rc = idem_store_open(f->linked, NULL, &f->store)) != IDEM_OK) {
    fprintf(stderr, "idem_store_open: %s: %s\n", idem_rc_name(rc),
            idem_errmsg());
    return -1;
  }
  side_sql(f, "CREATE TABLE {S}.tickets (id bigserial PRIMARY KEY, payload "
              "text NOT NULL)");
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  if (!f)
    return 0;
  idem_store_close(f->store);
  idem_store_close(f->other);
  proxy_stop(&f->px);
  side_sql(f, "DROP SCHEMA IF EXISTS {S} CASCADE");
  free(f);
  return 0;
}

/* ---- helpers ---------------------------------------------------------------- */

#define EXPECT_RC(want, expr) expect_rc_at((want), (expr), #expr, __LINE__)

static void expect_rc_at(int want, int got, const char *what, int line) {
  if (got != want)
    fail_msg("line %d: %s returned %s (%s), expected %s", line, what,
             idem_rc_name(got), idem_errmsg(), idem_rc_name(want));
}

static void fp_of(const char *payload, char hex[IDEM_FINGERPRINT_SIZE]) {
  EXPECT_RC(IDEM_OK, idem_fingerprint(payload, strlen(payload), 1, hex));
}

static long count_records(const fixture *f) {
  return side_sql(f, "SELECT count(*) FROM {S}.idem_records");
}

static long count_tickets(const fixture *f) {
  return side_sql(f, "SELECT count(*) FROM {S}.tickets");
}

/* Claims id through `store` and checks the outcome and attempt. */
static idem_call *claim(idem_store *store, const idem_id *id, const char *fp,
                        const idem_call_options *o, idem_outcome want,
                        int attempt) {
  idem_call *c = NULL;
  EXPECT_RC(IDEM_OK, idem_claim(store, id, fp, o, &c));
  assert_non_null(c);
  if (idem_call_outcome(c) != want)
    fail_msg("outcome %s, expected %s", idem_outcome_name(idem_call_outcome(c)),
             idem_outcome_name(want));
  if (attempt)
    assert_int_equal(idem_call_attempt(c), attempt);
  return c;
}

static void assert_body(const idem_call *c, const char *body) {
  const idem_response *r = idem_call_response(c);
  assert_non_null(r);
  assert_int_equal(r->status, 201);
  assert_int_equal(r->body_len, strlen(body));
  assert_memory_equal(r->body, body, strlen(body));
  assert_int_equal(r->meta_len, strlen(META));
  assert_memory_equal(r->meta, META, strlen(META));
}

static idem_record *record_of(const fixture *f, const idem_id *id) {
  idem_record *r = NULL;
  EXPECT_RC(IDEM_OK, idem_get(f->other, id, &r));
  return r;
}

/* A claim through the second handle (its own cache) replays body, at
 * attempt. */
static void assert_replays(const fixture *f, const idem_id *id, const char *fp,
                           const char *body, int attempt) {
  idem_call *again = claim(f->other, id, fp, NULL, IDEM_REPLAY, attempt);
  assert_body(again, body);
  idem_call_free(again);
}

/* Completes the claim c with body (and frees it), then checks the replay. */
static void complete_then_replay(const fixture *f, idem_call *c,
                                 const idem_id *id, const char *fp,
                                 const char *body, int attempt) {
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  assert_replays(f, id, fp, body, attempt);
}

/* ---- the claim's insert --------------------------------------------------- */

/* The claim's insert with its answer or its request cut: the caller holds
 * the key all the same (PROCEED, attempt 1), one record, and its response
 * is the one stored. */
static void run_claim_cut(fixture *f, cut_kind kind, const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "claim-lost-key"};
  const char body[] = "{\"ticket_id\":101}";
  idem_call *c;
  fp_of(PAYLOAD, fp);
  proxy_arm(&f->px, kind, pattern);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 1);
  complete_then_replay(f, c, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

static void test_claim_answer_lost(void **state) {
  run_claim_cut(*state, CUT_REPLY, "INSERT 0 1");
}

static void test_claim_request_lost(void **state) {
  run_claim_cut(*state, CUT_REQUEST, "claim-lost-key");
}

/* A takeover (RECOVER) runs in a transaction; its COMMIT's answer is lost:
 * the caller holds the key all the same, attempt 2. */
static void test_takeover_commit_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "takeover-lost-key"};
  const char body[] = "{\"ticket_id\":105}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *first, *c;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  first = claim(f->other, &id, fp, &short_lease, IDEM_PROCEED, 1);
  idem_call_free(first); /* a holder that died */
  nanosleep(&ms5, NULL);
  proxy_arm(&f->px, CUT_REPLY, "COMMIT");
  c = claim(f->store, &id, fp, NULL, IDEM_RECOVER, 2);
  assert_int_equal(proxy_cuts(&f->px), 1);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* The takeover's COMMIT never reaches the server: the takeover is rolled
 * back, the caller is told to try again (the row shows that it does not
 * hold the key), and its retry takes the key over. */
static void test_takeover_commit_request_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "takeover-unsent-key"};
  const char body[] = "{\"ticket_id\":106}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *first, *c = (idem_call *)&c;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  first = claim(f->other, &id, fp, &short_lease, IDEM_PROCEED, 1);
  idem_call_free(first);
  nanosleep(&ms5, NULL);
  /* The COMMIT query itself ("READ COMMITTED" in BEGIN must not match). */
  proxy_arm_bytes(&f->px, CUT_REQUEST, "COMMIT", sizeof "COMMIT");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(f->store, &id, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "try again"));
  assert_int_equal(proxy_cuts(&f->px), 1);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->attempt, 1);
  idem_record_free(r);
  c = claim(f->store, &id, fp, NULL, IDEM_RECOVER, 2);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* ---- the fenced writes ---------------------------------------------------- */

static void run_complete_cut(fixture *f, cut_kind kind, const char *pattern,
                              const char *body) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-lost-key"};
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  assert_replays(f, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

static void test_complete_answer_lost(void **state) {
  run_complete_cut(*state, CUT_REPLY, "UPDATE 1", "{\"ticket_id\":202}");
}

static void test_complete_request_lost(void **state) {
  run_complete_cut(*state, CUT_REQUEST, "\"ticket_id\":203",
                    "{\"ticket_id\":203}");
}

/* Release with its answer or its request cut: released, so the next claim
 * proceeds afresh (attempt 1). */
static void run_release_cut(fixture *f, cut_kind kind, const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "release-lost-key"};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  assert_int_equal(count_records(f), 0);
  c = claim(f->other, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->other, c));
  idem_call_free(c);
}

static void test_release_answer_lost(void **state) {
  run_release_cut(*state, CUT_REPLY, "DELETE 1");
}

static void test_release_request_lost(void **state) {
  run_release_cut(*state, CUT_REQUEST, "release-lost-key");
}

/* Mark unknown with its answer or its request cut: marked, and claims see
 * UNKNOWN. */
static void run_mark_unknown_cut(fixture *f, cut_kind kind,
                                 const char *pattern) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unknown-lost-key"};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, kind, pattern);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  idem_record_free(r);
  c = claim(f->other, &id, fp, NULL, IDEM_UNKNOWN, 0);
  idem_call_free(c);
  assert_int_equal(count_records(f), 1);
}

static void test_mark_unknown_answer_lost(void **state) {
  run_mark_unknown_cut(*state, CUT_REPLY, "UPDATE 1");
}

static void test_mark_unknown_request_lost(void **state) {
  run_mark_unknown_cut(*state, CUT_REQUEST, "unknown-lost-key");
}

/* Renew with its answer cut: sent again, it renews again; the holder keeps
 * the key with the new lease and completes it. */
static void test_renew_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "renew-lost-key"};
  const char body[] = "{\"ticket_id\":250}";
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 1");
  EXPECT_RC(IDEM_OK, idem_renew(f->store, c, 600000));
  assert_int_equal(proxy_cuts(&f->px), 1);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->lease_expires_ms - r->updated_ms, 600000);
  idem_record_free(r);
  complete_then_replay(f, c, &id, fp, body, 1);
}

/* A completion that lost its lease to a newer holder is still refused as
 * stale when its answer is lost: the row that the resend reads holds the
 * newer holder's response, not this one. */
static void test_stale_complete_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-lost-key"};
  const char newer_body[] = "{\"ticket_id\":301}", old_body[] =
                                                       "{\"ticket_id\":302}";
  idem_response newer = {201, META, strlen(META), newer_body,
                         strlen(newer_body)},
                old = {201, META, strlen(META), old_body, strlen(old_body)};
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  EXPECT_RC(IDEM_OK, idem_complete(f->other, takeover, &newer));
  idem_call_free(takeover);
  /* The stale completion changes no row, so its answer says UPDATE 0. */
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 0");
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, c, &old));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  assert_replays(f, &id, fp, newer_body, 2);
}

/* ---- a fenced write retried by its caller ------------------------------- */

/*
 * The write commits, its answer is lost and the reconnect is refused: the
 * caller is told IDEM_EUNAVAILABLE and keeps the claim. Once the server can
 * be reached again, the caller's retry changes no row, and the row says that
 * the first send had done what was asked: IDEM_OK, not IDEM_ESTALE.
 */
static void lose_answer_unreachable(fixture *f, const char *answer) {
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REPLY, answer);
}

static void test_complete_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-retried-key"};
  const char body[] = "{\"ticket_id\":260}";
  idem_response resp = {201, META, strlen(META), body, strlen(body)};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_complete(f->store, c, &resp));
  assert_int_equal(proxy_cuts(&f->px), 1);
  /* It was stored all the same. */
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &resp));
  /* Done: the claim is no longer held. */
  EXPECT_RC(IDEM_ESTATE, idem_complete(f->store, c, &resp));
  idem_call_free(c);
  assert_replays(f, &id, fp, body, 1);
  assert_int_equal(count_records(f), 1);
}

/* The retry carries another response than the one stored: that one was not
 * stored, and the caller is told so. */
static void test_complete_retried_other_response(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "complete-other-key"};
  const char body[] = "{\"ticket_id\":261}", other_body[] =
                                                  "{\"ticket_id\":262}";
  idem_response resp = {201, META, strlen(META), body, strlen(body)},
                other = {201, META, strlen(META), other_body,
                         strlen(other_body)};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_complete(f->store, c, &resp));
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_ESTALE, idem_complete(f->store, c, &other));
  assert_non_null(strstr(idem_errmsg(), "this response was not stored"));
  idem_call_free(c);
  assert_replays(f, &id, fp, body, 1);
}

static void test_mark_unknown_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unknown-retried-key"};
  idem_call *c;
  idem_record *r;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "UPDATE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->store, c));
  EXPECT_RC(IDEM_ESTATE, idem_mark_unknown(f->store, c));
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(r->attempt, 1);
  idem_record_free(r);
  c = claim(f->other, &id, fp, NULL, IDEM_UNKNOWN, 0);
  idem_call_free(c);
  assert_int_equal(count_records(f), 1);
}

static void test_release_retried_after_unreachable(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "release-retried-key"};
  idem_call *c;
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  lose_answer_unreachable(f, "DELETE 1");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 0);
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
  c = claim(f->other, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->other, c));
  idem_call_free(c);
}

/* A holder whose lease was taken over, and whose release's answer is lost,
 * is told IDEM_ESTALE: the newer holder's row is there, untouched. */
static void test_stale_release_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-release-key"};
  const char body[] = "{\"ticket_id\":303}";
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  proxy_arm(&f->px, CUT_REPLY, "DELETE 0");
  EXPECT_RC(IDEM_ESTALE, idem_release(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_IN_PROGRESS);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
  EXPECT_RC(IDEM_OK,
            idem_complete(f->other, takeover,
                          &(idem_response){201, META, strlen(META), body,
                                           strlen(body)}));
  idem_call_free(takeover);
  assert_replays(f, &id, fp, body, 2);
}

/* The same for a mark unknown: the newer holder marks the key unknown
 * itself; the older holder's mark changed nothing and is stale. */
static void test_stale_mark_unknown(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "stale-unknown-key"};
  idem_call_options short_lease = {.lease_ms = 1};
  idem_call *c, *takeover;
  idem_record *r;
  struct timespec ms5 = {0, 5 * 1000 * 1000};
  fp_of(PAYLOAD, fp);
  c = claim(f->store, &id, fp, &short_lease, IDEM_PROCEED, 1);
  nanosleep(&ms5, NULL);
  takeover = claim(f->other, &id, fp, NULL, IDEM_RECOVER, 2);
  EXPECT_RC(IDEM_OK, idem_mark_unknown(f->other, takeover));
  idem_call_free(takeover);
  proxy_arm(&f->px, CUT_REPLY, "UPDATE 0");
  EXPECT_RC(IDEM_ESTALE, idem_mark_unknown(f->store, c));
  assert_int_equal(proxy_cuts(&f->px), 1);
  idem_call_free(c);
  r = record_of(f, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  assert_int_equal(r->attempt, 2);
  idem_record_free(r);
}

/* ---- a local action ------------------------------------------------------- */

typedef struct ticket {
  const fixture *f;
  int runs;
  long id;
  char body[64];
} ticket;

static int create_ticket(void *conn, void *ctx, idem_response *r) {
  ticket *t = ctx;
  char sql[256];
  const char *v[1] = {PAYLOAD};
  PGresult *res;
  snprintf(sql, sizeof sql,
           "INSERT INTO \"%s\".tickets (payload) VALUES ($1) RETURNING id",
           t->f->schema);
  t->runs++;
  res = PQexecParams(conn, sql, 1, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    PQclear(res);
    return 1;
  }
  t->id = atol(PQgetvalue(res, 0, 0));
  PQclear(res);
  snprintf(t->body, sizeof t->body, "{\"ticket_id\":%ld}", t->id);
  *r = (idem_response){201, META, strlen(META), t->body, strlen(t->body)};
  return 0;
}

/* The answer to the COMMIT of a local action is lost: nobody can tell
 * whether it committed, so the call fails with IDEM_EUNAVAILABLE; it had,
 * so the retry replays the one ticket and runs nothing. */
static void test_local_commit_answer_lost(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "local-lost-key"};
  ticket first = {.f = f}, retry = {.f = f};
  idem_call *c = NULL;
  char want[64];
  fp_of(PAYLOAD, fp);
  proxy_arm(&f->px, CUT_REPLY, "COMMIT");
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_execute_local(f->store, &id, fp, NULL,
                                                  create_ticket, &first, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "whether it committed is unknown"));
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(first.runs, 1);
  assert_int_equal(count_tickets(f), 1);
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL, create_ticket,
                                        &retry, &c));
  assert_int_equal(idem_call_outcome(c), IDEM_REPLAY);
  assert_int_equal(retry.runs, 0);
  snprintf(want, sizeof want, "{\"ticket_id\":%ld}", first.id);
  assert_body(c, want);
  idem_call_free(c);
  assert_int_equal(count_tickets(f), 1);
  assert_int_equal(count_records(f), 1);
}

/* ---- no way back ------------------------------------------------------------ */

/* The claim's answer is lost and the server cannot be reached again: a
 * clear IDEM_EUNAVAILABLE. The insert had committed, so once the server is
 * back the key is in flight until the lease ends, and then recovered
 * (attempt 2) and completed once. */
static void test_claim_answer_lost_no_reconnect(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {TENANT, OPERATION, "unreachable-key"};
  const char body[] = "{\"ticket_id\":404}";
  idem_call_options lease = {.lease_ms = 4000};
  idem_call *c = NULL;
  struct timespec wait;
  int64_t left;
  idem_record *none = NULL;
  fp_of(PAYLOAD, fp);
  /* A connection in the pool first, for the insert to go out on. */
  EXPECT_RC(IDEM_ENOTFOUND, idem_get(f->store, &id, &none));
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REPLY, "INSERT 0 1");
  /* The pool's connection is up: the insert goes out, its answer is cut,
   * and the reconnect is refused. */
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(f->store, &id, fp, &lease, &c));
  assert_null(c);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(count_records(f), 1);
  proxy_refuse(&f->px, 0);
  c = claim(f->store, &id, fp, &lease, IDEM_IN_FLIGHT, 1);
  left = idem_call_retry_after_ms(c);
  assert_true(left > 0 && left <= 4000);
  idem_call_free(c);
  /* Until the lease ends, and a little more. */
  wait.tv_sec = (time_t)((left + 50) / 1000);
  wait.tv_nsec = (long)((left + 50) % 1000) * 1000000L;
  nanosleep(&wait, NULL);
  c = claim(f->store, &id, fp, &lease, IDEM_RECOVER, 2);
  complete_then_replay(f, c, &id, fp, body, 2);
  assert_int_equal(count_records(f), 1);
}

/* ---- a server that accepts no writes --------------------------------------- */

/*
 * Sessions that are read-only (as on a standby the store's URL reached
 * after a failover): a claim fails with IDEM_EUNAVAILABLE, says why and
 * what to do, writes nothing, and the connection is re-established before
 * its next use, so that a URL listing several hosts with
 * target_session_attrs=read-write would find the primary.
 */
static void test_read_only_server(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], url[URL_MAX + 64];
  idem_id id = {TENANT, OPERATION, "read-only-key"};
  idem_store *ro = NULL;
  idem_call *c = (idem_call *)&c;
  int before;
  fp_of(PAYLOAD, fp);
  snprintf(url, sizeof url,
           "%s&options=-c%%20default_transaction_read_only%%3Don", f->linked);
  /* The schema is up to date, so opening only reads. */
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &ro));
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(ro, &id, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "25006"));
  assert_non_null(strstr(idem_errmsg(), "target_session_attrs=read-write"));
  assert_int_equal(count_records(f), 0);
  before = proxy_accepted(&f->px);
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_claim(ro, &id, fp, NULL, &c));
  assert_null(c);
  assert_int_equal(proxy_accepted(&f->px), before + 1);
  idem_store_close(ro);
  assert_int_equal(count_records(f), 0);
  /* The same key through a writable session: a new key, attempt 1. */
  c = claim(f->store, &id, fp, NULL, IDEM_PROCEED, 1);
  EXPECT_RC(IDEM_OK, idem_release(f->store, c));
  idem_call_free(c);
}

/* ---- a link that closes at once ------------------------------------------ */

/* A server that closes every new connection before it answers (one
 * restarting, or a proxy in front of one that is down): the open fails
 * with IDEM_EUNAVAILABLE, "retry later", and works once it answers. */
static void test_open_link_closed(void **state) {
  fixture *f = *state;
  idem_store *store = (idem_store *)&store;
  proxy_refuse(&f->px, 1);
  EXPECT_RC(IDEM_EUNAVAILABLE, idem_store_open(f->linked, NULL, &store));
  assert_null(store);
  assert_non_null(strstr(idem_errmsg(), "closed the connection"));
  assert_null(strstr(idem_errmsg(), "retrying will not help"));
  proxy_refuse(&f->px, 0);
  EXPECT_RC(IDEM_OK, idem_store_open(f->linked, NULL, &store));
  idem_store_close(store);
}

/* ---- durability after a reconnect --------------------------------------- */

static int show_synchronous_commit(void *conn, void *ctx, idem_response *r) {
  PGresult *res = PQexec(conn, "SHOW synchronous_commit");
  (void)r;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
    snprintf(ctx, 64, "%s", PQgetvalue(res, 0, 0));
  PQclear(res);
  return 1; /* nothing to keep */
}

/* A URL that asks for synchronous_commit=off: idem's sessions run with
 * "on", the one re-established after a lost connection too. */
static void test_synchronous_commit_after_reconnect(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], url[URL_MAX + 64], value[64] = "";
  idem_id id = {TENANT, OPERATION, "sync-key"},
          show = {TENANT, "SHOW", "synchronous-commit"};
  idem_store *store = NULL;
  idem_call *c = NULL;
  int before;
  fp_of(PAYLOAD, fp);
  snprintf(url, sizeof url, "%s&options=-c%%20synchronous_commit%%3Doff",
           f->linked);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &store));
  EXPECT_RC(IDEM_EREJECTED,
            idem_execute_local(store, &show, fp, NULL, show_synchronous_commit,
                               value, &c));
  assert_string_equal(value, "on");
  before = proxy_accepted(&f->px);
  proxy_arm(&f->px, CUT_REPLY, "INSERT 0 1");
  c = claim(store, &id, fp, NULL, IDEM_PROCEED, 1);
  assert_int_equal(proxy_cuts(&f->px), 1);
  assert_int_equal(proxy_accepted(&f->px), before + 1);
  EXPECT_RC(IDEM_OK, idem_release(store, c));
  idem_call_free(c);
  c = NULL;
  value[0] = '\0';
  EXPECT_RC(IDEM_EREJECTED,
            idem_execute_local(store, &show, fp, NULL, show_synchronous_commit,
                               value, &c));
  assert_string_equal(value, "on");
  idem_store_close(store);
}

/* ---- no password in the messages of later calls ------------------------ */

static int count_record(const idem_record *r, void *ctx) {
  (void)r;
  ++*(int *)ctx;
  return 0;
}

/*
 * A password with an unencoded '@' makes libpq read its second half as a
 * host name. With a second host that works, the store opens; once that
 * host refuses new connections, every call's message quotes the first
 * "host name" ("ss9@nosuch.invalid"). No call, the operators' included,
 * shows that piece of the password.
 */
static void test_secret_in_later_messages(void **state) {
  fixture *f = *state;
  char url[URL_MAX + 128], fp[IDEM_FINGERPRINT_SIZE], value[64] = "";
  idem_id id = {TENANT, OPERATION, "cut-here"};
  idem_store *store = NULL;
  idem_record *r = NULL;
  idem_call *c = NULL;
  int64_t removed = 0;
  int n = 0;
  fp_of(PAYLOAD, fp);
  /* The second host is the proxy's folder ("/tmp/idem-link.XXXXXX"),
   * percent-encoded. */
  snprintf(url, sizeof url,
           "postgresql://idem:p@ss9@nosuch.invalid,%%2Ftmp%%2F%s/postgres?"
           "port=%s&idem_schema=%s",
           f->px.dir + 5, f->px.port, f->schema);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &store));
  EXPECT_RC(IDEM_ENOTFOUND, idem_get(store, &id, &r));
  proxy_refuse(&f->px, 1);
  proxy_arm(&f->px, CUT_REQUEST, "cut-here");
#define NO_SECRET(call)                                                        \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ == IDEM_OK || strstr(idem_errmsg(), "ss9"))                        \
      fail_msg("%s: %s: %s", #call, idem_rc_name(rc_), idem_errmsg());         \
  } while (0)
  NO_SECRET(idem_get(store, &id, &r));
  assert_int_equal(proxy_cuts(&f->px), 1);
  NO_SECRET(idem_delete(store, &id));
  NO_SECRET(idem_list(store, NULL, count_record, &n));
  NO_SECRET(idem_prune(store, &removed));
  NO_SECRET(idem_resolve(store, &id, NULL));
  NO_SECRET(idem_claim(store, &id, fp, NULL, &c));
  NO_SECRET(idem_execute_local(store, &id, fp, NULL, show_synchronous_commit,
                               value, &c));
#undef NO_SECRET
  assert_null(c);
  assert_int_equal(n, 0);
  assert_string_equal(value, ""); /* the action never ran */
  idem_store_close(store);
}

#define LINK_TEST(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
  const char *url = getenv("IDEM_TEST_PG_URL");
  const struct CMUnitTest tests[] = {
      LINK_TEST(test_claim_answer_lost),
      LINK_TEST(test_claim_request_lost),
      LINK_TEST(test_takeover_commit_answer_lost),
      LINK_TEST(test_takeover_commit_request_lost),
      LINK_TEST(test_complete_answer_lost),
      LINK_TEST(test_complete_request_lost),
      LINK_TEST(test_release_answer_lost),
      LINK_TEST(test_release_request_lost),
      LINK_TEST(test_mark_unknown_answer_lost),
      LINK_TEST(test_mark_unknown_request_lost),
      LINK_TEST(test_renew_answer_lost),
      LINK_TEST(test_stale_complete_answer_lost),
      LINK_TEST(test_complete_retried_after_unreachable),
      LINK_TEST(test_complete_retried_other_response),
      LINK_TEST(test_mark_unknown_retried_after_unreachable),
      LINK_TEST(test_release_retried_after_unreachable),
      LINK_TEST(test_stale_release_answer_lost),
      LINK_TEST(test_stale_mark_unknown),
      LINK_TEST(test_local_commit_answer_lost),
      LINK_TEST(test_claim_answer_lost_no_reconnect),
      LINK_TEST(test_read_only_server),
      LINK_TEST(test_synchronous_commit_after_reconnect),
      LINK_TEST(test_open_link_closed),
      LINK_TEST(test_secret_in_later_messages),
  };
  if (!url || (strncmp(url, "postgresql://", 13) != 0 &&
               strncmp(url, "postgres://", 11) != 0)) {
    /* A missing server is a failure, never a skip. */
    fprintf(stderr, "test_pg_link: IDEM_TEST_PG_URL must name a PostgreSQL "
                    "server (scripts/check.sh starts one; by hand: "
                    "`. scripts/pg.sh && pg_start`)\n");
    return 1;
  }
  return cmocka_run_group_tests_name("postgresql link", tests, NULL, NULL);
}
