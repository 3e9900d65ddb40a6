/*
 * link_proxy.c -- a proxy of the tests' own between libpq and a PostgreSQL
 * server (a thread, on a Unix socket of its own), included by the tests
 * that need one (test_pg_link.c, test_pg_stall.c). It forwards the
 * protocol both ways and can be armed, once at a time, on a pattern of
 * bytes:
 *
 *   CUT_REQUEST   the client's bytes with the pattern are dropped and both
 *                 sides closed: the server never ran the statement;
 *   CUT_REPLY     the server's bytes with the pattern are dropped and both
 *                 sides closed: it ran (and committed), the client never
 *                 learns it;
 *   STALL_REQUEST the client's bytes with the pattern, and all it sends
 *                 after, are held: the connection stays up, and the server
 *                 never hears the statement until proxy_release();
 *   STALL_REPLY   the same for the server's answer: the statement ran, and
 *                 the client hears nothing until proxy_release().
 *
 * A held connection that its client gives up (closes) is closed on the
 * server's side too, with what was held dropped.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- the proxy ------------------------------------------------------------ */

#ifndef MAX_PAIRS
#define MAX_PAIRS 32
#endif

typedef enum cut_kind {
  CUT_NONE,
  CUT_REQUEST,
  CUT_REPLY,
  STALL_REQUEST,
  STALL_REPLY
} cut_kind;

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
  /* Held bytes, per pair and direction (0: the client's), and whether
   * that direction is held. */
  char *held[MAX_PAIRS][2];
  size_t held_len[MAX_PAIRS][2];
  int stalled[MAX_PAIRS][2];
  int stalls;        /* stalls begun */
  int releasing;     /* proxy_release() asked */
  int closed_held;   /* held connections their client gave up */
  int poke[2];       /* a byte here: look at `releasing` */
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
  pthread_mutex_lock(&p->mu);
  for (int d = 0; d < 2; d++) {
    if (p->stalled[i][d])
      p->closed_held++;
    free(p->held[i][d]);
    p->held[i][d] = NULL;
    p->held_len[i][d] = 0;
    p->stalled[i][d] = 0;
  }
  pthread_mutex_unlock(&p->mu);
}

/* Keeps n bytes of pair i's direction `from` for proxy_release(). */
static int hold(proxy *p, int i, int from, const char *b, size_t n) {
  char *h = realloc(p->held[i][from], p->held_len[i][from] + n);
  if (!h)
    return -1;
  memcpy(h + p->held_len[i][from], b, n);
  p->held[i][from] = h;
  p->held_len[i][from] += n;
  return 0;
}

/* Sends on what every held direction holds, and forwards again. */
static void release_all(proxy *p) {
  for (int i = 0; i < MAX_PAIRS; i++)
    for (int d = 0; d < 2; d++) {
      if (p->pairs[i][0] < 0 || !p->stalled[i][d])
        continue;
      int bad = p->held_len[i][d] &&
                write_all(p->pairs[i][!d], p->held[i][d], p->held_len[i][d]);
      pthread_mutex_lock(&p->mu);
      free(p->held[i][d]);
      p->held[i][d] = NULL;
      p->held_len[i][d] = 0;
      p->stalled[i][d] = 0;
      pthread_mutex_unlock(&p->mu);
      if (bad) {
        close_pair(p, i);
        break;
      }
    }
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
  int cut = 0, stall = 0;
  if (n <= 0) {
    close_pair(p, i);
    return;
  }
  if (p->stalled[i][from]) {
    /* Everything after a held statement is held behind it. */
    if (hold(p, i, from, buf, (size_t)n) != 0)
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
  } else if (p->armed == (from == 0 ? STALL_REQUEST : STALL_REPLY) &&
             memmem(p->scratch, all, p->pattern, p->pattern_len)) {
    p->armed = CUT_NONE;
    p->stalls++;
    p->stalled[i][from] = 1;
    stall = 1;
  }
  pthread_mutex_unlock(&p->mu);
  if (stall) {
    if (hold(p, i, from, buf, (size_t)n) != 0)
      close_pair(p, i);
    return;
  }
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
    struct pollfd fds[3 + 2 * MAX_PAIRS];
    int where[3 + 2 * MAX_PAIRS], n = 0, i;
    fds[n] = (struct pollfd){.fd = p->wake[0], .events = POLLIN};
    where[n++] = -1;
    fds[n] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
    where[n++] = -2;
    fds[n] = (struct pollfd){.fd = p->poke[0], .events = POLLIN};
    where[n++] = -3;
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
    if (fds[2].revents) {
      char b[16];
      int go;
      if (read(p->poke[0], b, sizeof b) < 0) {
        /* A pipe of ours with a byte in it. */
      }
      pthread_mutex_lock(&p->mu);
      go = p->releasing;
      p->releasing = 0;
      pthread_mutex_unlock(&p->mu);
      if (go)
        release_all(p);
    }
    for (i = 3; i < n; i++) {
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
  p->lfd = p->wake[0] = p->wake[1] = p->poke[0] = p->poke[1] = -1;
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
  if (!mkdtemp(p->dir) || pipe(p->wake) != 0 || pipe(p->poke) != 0) {
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
  close(p->poke[0]);
  close(p->poke[1]);
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

static int proxy_stalls(proxy *p) {
  int n;
  pthread_mutex_lock(&p->mu);
  n = p->stalls;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* Held connections whose client gave up on them. */
static int proxy_closed_held(proxy *p) {
  int n;
  pthread_mutex_lock(&p->mu);
  n = p->closed_held;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* Sends on everything held and forwards again (asynchronously). */
static void proxy_release(proxy *p) {
  pthread_mutex_lock(&p->mu);
  p->releasing = 1;
  pthread_mutex_unlock(&p->mu);
  if (write(p->poke[1], "r", 1) != 1) {
    /* The pipe has room for a byte. */
  }
}
