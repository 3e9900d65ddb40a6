/*
 * guard.c -- slow and greedy clients: a deadline for the request head
 * (--header-timeout) and limits on connections (--max-connections,
 * --max-connections-per-client).
 *
 * libmicrohttpd 0.9.75 has an idle timeout only (MHD_OPTION_CONNECTION_
 * TIMEOUT): a client that sends one byte of its head every few seconds
 * never trips it, and a few thousand such clients once held every
 * connection the gateway would take. So the gateway keeps its own registry
 * of client connections (MHD_OPTION_NOTIFY_CONNECTION), each with its
 * socket and where it stands:
 *
 *   HEAD  a head is awaited; it must be whole by the deadline: the
 *         connection's start plus --header-timeout, or, on a keep-alive
 *         connection, the first byte of the next request plus it.
 *   BUSY  the head is in (the first call of the access handler, which
 *         libmicrohttpd makes once every header has arrived) and the
 *         request is being read, forwarded or answered: no deadline here.
 *   IDLE  a keep-alive connection between requests with no byte of the
 *         next one yet. Only the idle timeout (75 s) applies, as with
 *         nginx's keepalive_timeout against its client_header_timeout.
 *   CUT   shut down for a late head; libmicrohttpd closes it.
 *
 * One sweeper thread looks at every connection a few times per timeout,
 * and at the HEAD connections also when one's deadline falls between two
 * looks (see sweep()). Past its deadline, a HEAD connection's socket is
 * shut down (SHUT_RDWR):
 * libmicrohttpd then reads end-of-file and closes it in its own thread, as
 * if the client had gone. The sweeper never closes libmicrohttpd's
 * descriptor itself. It takes, under the registry's lock, a duplicate of
 * it: libmicrohttpd reports a connection closed (MHD_CONNECTION_NOTIFY_
 * CLOSED, in MHD_cleanup_connections()) before it calls close() on its
 * socket, and that report takes the same lock to leave the registry, so
 * the descriptor duplicated cannot have been closed and reused for another
 * connection meanwhile. The duplicate names that socket whatever happens to
 * the number afterwards, so the shutdown() itself, and the close() of the
 * duplicate, come after the lock is let go: a wave of slow clients past
 * their deadline (a thousand slowloris connections opened together) once
 * held the lock for a thousand shutdowns, each of which runs the loopback
 * peer's receive path too, while every HTTP thread waited on it to accept
 * a connection or to close one cut off, and ordinary requests with them.
 *
 * An IDLE connection turns HEAD when bytes arrive: the kernel counts the
 * bytes received on a TCP socket (TCP_INFO tcpi_bytes_received), and the
 * count taken when the last answer ended is compared with the count now.
 * libmicrohttpd reads whatever comes at once, so the socket's queue could
 * not tell. A kernel without that count (before Linux 4.1) gets the
 * simpler rule: the next head's deadline runs from the end of the answer.
 *
 * The limits are libmicrohttpd's own (see guard_max_connections()). Nothing
 * here is logged per connection; /metrics counts instead.
 */
#include "serve.h"

#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

enum { G_HEAD, G_BUSY, G_IDLE, G_CUT };

/*
 * A client connection. word holds the state (its two low bits) and a
 * generation, the count of requests ended on the connection, so that the
 * sweeper's move from IDLE to HEAD fails when a request was read and
 * answered between its look and its move (compare-and-swap on the word).
 * The connection's own thread makes every other move. deadline is read by
 * the sweeper alone; rx is written before word is (release) and read after
 * (acquire).
 */
typedef struct gconn {
  int fd;
  size_t slot; /* its index in conns[], under lock */
  uint64_t word;
  int64_t deadline; /* CLOCK_MONOTONIC ms; meaningful in HEAD */
  uint64_t rx;      /* bytes received when the last answer ended */
} gconn;

#define STATE(w) ((int)((w)&3))
#define WORD(gen, st) (((gen) << 2) | (uint64_t)(st))
#define GEN(w) ((w) >> 2)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static gconn **conns; /* under lock */
static size_t nconns, capconns;

static int64_t timeout_ms = 10000;
static int64_t tick_ms = 1000;
/* The sweeper's shortest sleep, and so how late past its deadline a head
 * is cut off at most (as the system schedules the sweeper); see sweep(). */
#define CUT_SLACK_MS 10
static pthread_t sweeper;
static int sweeper_running;
static int stopping; /* under stop_lock */
static pthread_mutex_t stop_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stop_cond;
/* Cut-offs whose line from libmicrohttpd has not been dropped yet. */
static unsigned long cuts_unlogged;

/* Kept back from the descriptor limit for what is not a client's
 * connection: standard streams, listeners, the store's connections, the
 * log, libcurl's and libmicrohttpd's epoll and wake-up descriptors, the
 * sweeper's duplicate of the socket it cuts off, and two per HTTP
 * thread. */
#define FD_RESERVE 64
/* The derived default never goes above this: each connection costs a
 * memory pool of libmicrohttpd's as well as descriptors; more is asked
 * for explicitly. */
#define DEFAULT_CAP 16384
/* Nor below this, so that a small descriptor limit still serves. */
#define DEFAULT_FLOOR 16

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The bytes received on a TCP socket so far (0), or -1 when the kernel
 * does not count them. */
static int bytes_received(int fd, uint64_t *n) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  memset(&ti, 0, sizeof ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(struct tcp_info, tcpi_bytes_received) +
                sizeof ti.tcpi_bytes_received)
    return -1;
  *n = ti.tcpi_bytes_received;
  return 0;
}

/*
 * --max-connections, or, when not given, what the descriptors allow: each
 * forward holds two (the client's connection and the upstream's), so half
 * of the soft RLIMIT_NOFILE (raised to the hard limit at start) after a
 * reserve, within [DEFAULT_FLOOR, DEFAULT_CAP].
 *
 * libmicrohttpd 0.9.75 divides MHD_OPTION_CONNECTION_LIMIT among the
 * threads of its pool (limit / threads each, the remainder one each to the
 * first threads); a thread at its share takes its listening socket out of
 * its epoll set and the others go on accepting, so the sum, the limit given,
 * is the whole gateway's. Over it, new connections wait in the kernel's
 * listen queue (backlog 1024) and are accepted as others close; past the
 * queue the kernel drops their SYNs and clients retry.
 */
unsigned guard_max_connections(const serve_config *c) {
  struct rlimit rl;
  uint64_t n, reserve = FD_RESERVE + 2 * (uint64_t)(c->threads > 0 ? c->threads : 1);
  if (c->max_connections)
    return c->max_connections;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return DEFAULT_FLOOR;
  n = rl.rlim_cur == RLIM_INFINITY ? (uint64_t)DEFAULT_CAP * 2 + reserve
                                   : (uint64_t)rl.rlim_cur;
  n = n > reserve ? (n - reserve) / 2 : 0;
  return n < DEFAULT_FLOOR ? DEFAULT_FLOOR
         : n > DEFAULT_CAP ? DEFAULT_CAP
                           : (unsigned)n;
}

/*
 * --max-connections-per-client, or, when not given, nine tenths of the
 * overall limit and at least 100: one address alone never holds every
 * connection, so others still get in, while one busy client (an agent
 * runner with thousands of calls in flight, or a proxy in front, whose
 * clients all share its address) keeps nearly all of the capacity. Under
 * 100 connections in all, a tenth kept back would protect nothing and
 * refuse the one client such a gateway has. A fixed number such as 1,000
 * would refuse those clients where the gateway is meant to hold thousands
 * of slow calls. 0 means no limit.
 *
 * libmicrohttpd 0.9.75 counts connections per address (a whole IPv6
 * address, IPv4 as its own) across all its threads; one over the limit is
 * accepted and closed at once, before any byte is read: the client sees its
 * connection closed (or reset, when it had sent bytes) without an answer.
 */
unsigned guard_max_connections_per_client(const serve_config *c) {
  unsigned all;
  if (c->max_connections_per_client >= 0)
    return (unsigned)c->max_connections_per_client;
  all = guard_max_connections(c);
  return all - all / 10 > 100 ? all - all / 10 : 100;
}

/* Takes e out of the registry; under lock. */
static void registry_remove(gconn *e) {
  gconn *last = conns[--nconns];
  conns[e->slot] = last;
  last->slot = e->slot;
}

void guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                  enum MHD_ConnectionNotificationCode code) {
  gconn *e;
  (void)cls;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    *socket_context = NULL;
    metrics_connections(1);
    /* Out of memory, a connection goes untracked: it still has the idle
     * timeout, and refusing it would not free anything. */
    if (!ci || !(e = calloc(1, sizeof *e)))
      return;
    e->fd = ci->connect_fd;
    e->deadline = now_ms() + timeout_ms;
    e->word = WORD(0, G_HEAD);
    pthread_mutex_lock(&lock);
    if (nconns == capconns) {
      size_t cap = capconns ? capconns * 2 : 1024;
      gconn **p = realloc(conns, cap * sizeof *p);
      if (!p) {
        pthread_mutex_unlock(&lock);
        free(e);
        return;
      }
      conns = p;
      capconns = cap;
    }
    e->slot = nconns;
    conns[nconns++] = e;
    pthread_mutex_unlock(&lock);
    *socket_context = e;
    return;
  }
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    metrics_connections(-1);
    if (!(e = *socket_context))
      return;
    pthread_mutex_lock(&lock);
    registry_remove(e);
    pthread_mutex_unlock(&lock);
    free(e);
    *socket_context = NULL;
  }
}

static gconn *entry_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* The connection's own thread moves e to st (with gen), unless the sweeper
 * has cut it: the shutdown stands. */
static void move(gconn *e, int st, int next_gen) {
  uint64_t w = __atomic_load_n(&e->word, __ATOMIC_ACQUIRE);
  for (;;) {
    if (STATE(w) == G_CUT)
      return;
    uint64_t nw = WORD(GEN(w) + (next_gen ? 1 : 0), st);
    if (__atomic_compare_exchange_n(&e->word, &w, nw, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_ACQUIRE))
      return;
  }
}

void guard_head_done(struct MHD_Connection *c) {
  gconn *e = entry_of(c);
  if (e)
    move(e, G_BUSY, 0);
}

void guard_request_done(struct MHD_Connection *c) {
  gconn *e = entry_of(c);
  uint64_t rx;
  if (!e)
    return;
  if (bytes_received(e->fd, &rx) == 0) {
    __atomic_store_n(&e->rx, rx, __ATOMIC_RELAXED);
    move(e, G_IDLE, 1);
  } else {
    __atomic_store_n(&e->deadline, now_ms() + timeout_ms, __ATOMIC_RELAXED);
    move(e, G_HEAD, 1);
  }
}

/* One look at e, under lock; at an IDLE connection only when full (its
 * count of bytes is a system call). A connection cut off: 1, and *cut is
 * the duplicate of its descriptor for the caller to shut down and close
 * once the lock is let go (-1 when there was no descriptor left to
 * duplicate: it was shut down here, under the lock). 0 otherwise. *next is
 * lowered to e's deadline when e awaits a head. */
static int sweep_one(gconn *e, int64_t now, int full, int *cut, int64_t *next) {
  uint64_t w = __atomic_load_n(&e->word, __ATOMIC_ACQUIRE), rx;
  int64_t d;
  switch (STATE(w)) {
  case G_HEAD:
    if ((d = __atomic_load_n(&e->deadline, __ATOMIC_RELAXED)) > now) {
      if (d < *next)
        *next = d;
      return 0;
    }
    /* A head that came whole at this very moment made the word BUSY, and
     * then the move fails: the connection is left alone. */
    if (!__atomic_compare_exchange_n(&e->word, &w, WORD(GEN(w), G_CUT), 0,
                                     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return 0;
    __atomic_fetch_add(&cuts_unlogged, 1, __ATOMIC_RELAXED);
    metrics_header_timeout();
    if ((*cut = fcntl(e->fd, F_DUPFD_CLOEXEC, 0)) < 0)
      shutdown(e->fd, SHUT_RDWR);
    return 1;
  case G_IDLE:
    if (!full || bytes_received(e->fd, &rx) != 0 ||
        rx <= __atomic_load_n(&e->rx, __ATOMIC_RELAXED))
      return 0;
    /* The next request has begun (within the last tick): its head's
     * deadline runs from now. The deadline is the sweeper's to read, so it
     * may follow the move. */
    if (__atomic_compare_exchange_n(&e->word, &w, WORD(GEN(w), G_HEAD), 0,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&e->deadline, now + timeout_ms, __ATOMIC_RELAXED);
      if (now + timeout_ms < *next)
        *next = now + timeout_ms;
    }
    return 0;
  default:
    return 0;
  }
}

/*
 * The sweeper looks at every connection each tick, and, between ticks, at
 * the connections awaiting a head again when one's deadline comes before
 * the next tick (not within CUT_SLACK_MS of the last look), so that a head
 * is cut off close to its own deadline, as nginx's timer per connection
 * does. Cut off at the ticks alone, the heads of all the connections
 * opened within one tick were cut at once: a thousand slowloris
 * connections closed together, as many opened again together, and an
 * ordinary request that came then waited behind them all (a probe's
 * slowest answers 30-50 ms, against nginx's 5-10 ms, with 1,000 slowloris
 * connections cut off every 2 s: bench/gateway.sh, slowloris "cut"). A
 * look between ticks reads two words per connection and makes no system
 * call (IDLE connections wait for the tick).
 */
static void *sweep(void *arg) {
  struct timespec until;
  int64_t wait = tick_ms, full_at = now_ms() + tick_ms;
  (void)arg;
  pthread_mutex_lock(&stop_lock);
  while (!stopping) {
    until = cli_mono_deadline(wait);
    pthread_cond_timedwait(&stop_cond, &stop_lock, &until);
    if (stopping)
      break;
    pthread_mutex_unlock(&stop_lock);

    int64_t now = now_ms(), next = INT64_MAX;
    int full = now >= full_at - CUT_SLACK_MS, cut;
    size_t seen = 0;
    if (full)
      full_at = now + tick_ms;
    pthread_mutex_lock(&lock);
    /* From the last entry down: registry_remove() moves the last entry
     * into the slot it frees, so an entry not looked at yet (below i)
     * stays below i, and none is missed while the lock is let go below;
     * one already looked at may be seen twice, which changes nothing. */
    for (size_t i = nconns; i-- > 0;) {
      if (i >= nconns)
        i = nconns - 1; /* entries left meanwhile; nconns > 0 here */
      if (sweep_one(conns[i], now, full, &cut, &next) && cut >= 0) {
        pthread_mutex_unlock(&lock);
        shutdown(cut, SHUT_RDWR);
        close(cut);
        pthread_mutex_lock(&lock);
      } else if (++seen % 256 == 0) {
        /* Let connections come and go every few hundred: a sweep of
         * twenty thousand must not hold up accept() for its whole
         * length. */
        pthread_mutex_unlock(&lock);
        pthread_mutex_lock(&lock);
      }
      if (!nconns)
        break;
    }
    pthread_mutex_unlock(&lock);
    /* The next look: at the next tick or the first deadline before it. */
    if (next > full_at)
      next = full_at;
    now = now_ms();
    wait = next - now < CUT_SLACK_MS ? CUT_SLACK_MS : next - now;
    pthread_mutex_lock(&stop_lock);
  }
  pthread_mutex_unlock(&stop_lock);
  return NULL;
}

int guard_start(const serve_config *c) {
  int rc;
  timeout_ms = c->header_timeout_ms > 0 ? c->header_timeout_ms : 10000;
  /* A tenth of the timeout: a keep-alive connection's next head starts
   * its clock at most that late. A late head is closed within
   * CUT_SLACK_MS of its deadline (sweep()). */
  tick_ms = timeout_ms / 10;
  tick_ms = tick_ms < 50 ? 50 : tick_ms > 1000 ? 1000 : tick_ms;
  cli_cond_init_mono(&stop_cond);
  stopping = 0;
  if ((rc = pthread_create(&sweeper, NULL, sweep, NULL)) != 0) {
    cli_error("serve", "cannot start a thread: %s", strerror(rc));
    return -1;
  }
  pthread_setname_np(sweeper, "idem-sweeper");
  sweeper_running = 1;
  return 0;
}

void guard_stop(void) {
  if (!sweeper_running)
    return;
  pthread_mutex_lock(&stop_lock);
  stopping = 1;
  pthread_cond_signal(&stop_cond);
  pthread_mutex_unlock(&stop_lock);
  pthread_join(sweeper, NULL);
  sweeper_running = 0;
  pthread_mutex_lock(&lock);
  free(conns);
  conns = NULL;
  nconns = capconns = 0;
  pthread_mutex_unlock(&lock);
}

/*
 * libmicrohttpd 0.9.75 says "Server reached connection limit" (a line each
 * time) when it closes a connection over a limit; the gateway's log keeps
 * at most a line a second of its messages, so they are counted here for
 * /metrics. A connection cut off once its request line was in makes it say
 * that the socket closed while it read a request ("... when reading
 * request ...", "... with incomplete request"): one such line is dropped
 * per cut-off, which /metrics counts already. Which connection a message is
 * about is not told, so a cut-off that made no line (its request line was
 * not in) may drop the line of a client that left mid-request instead: the
 * same event, for the operator.
 */
int guard_mhd_message(const char *fmt) {
  unsigned long n;
  if (!fmt)
    return 0;
  if (strstr(fmt, "reached connection limit")) {
    metrics_connection_refused();
    return 0;
  }
  if (!strstr(fmt, "when reading request") &&
      !strstr(fmt, "with incomplete request"))
    return 0;
  n = __atomic_load_n(&cuts_unlogged, __ATOMIC_RELAXED);
  while (n > 0)
    if (__atomic_compare_exchange_n(&cuts_unlogged, &n, n - 1, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return 1;
  return 0;
}
