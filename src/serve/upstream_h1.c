/*
 * upstream_h1.c -- the loop's own HTTP/1.1 client, beside libcurl.
 *
 * For an upstream reached over plain HTTP at an IP address (http://127.0.0.1:
 * 8080, http://[::1]:8080), the loop speaks HTTP/1.1 itself on its own
 * kept-alive connections, instead of handing the transfer to libcurl: a
 * call passed through costs libcurl more than everything else in the proxy
 * together (its per-transfer set-up, its connection checks and state
 * machine: docs/bench.md, "The upstream's HTTP/1.1"), and on a small
 * machine that was what kept calls passed through below 0.8x of direct. The
 * response is read strictly (RFC 9112 §4-§7): a status line "HTTP/1.x NNN",
 * header lines "token: value" without CR or NUL, one Transfer-Encoding
 * that is exactly "chunked" or none, never with Content-Length, repeated
 * Content-Lengths only with one value, chunk sizes in hex of at most 15
 * digits; anything else ends the forward as UP_INVALID and closes the
 * connection. The header lines go through up_on_header() and the body through
 * up_on_body(), as libcurl's do, so that 1xx answers, 101, folded lines,
 * trailers, hop-by-hop headers, the header bound and max_pass are treated
 * the same way on both paths. A connection serves one request at a time and
 * goes back to the pool only after a whole answer, with nothing after it.
 * "localhost" is taken too, as libcurl takes it (RFC 6761 6.3: always the
 * loopback, never looked up): ::1 first, then 127.0.0.1, the next tried
 * when a connection to one fails (nothing was sent), and the one that
 * answered tried first from then on. Other host names (which may resolve
 * differently from one day to the next), user info, https:// and
 * IDEM_HTTP_CLIENT=libcurl stay with libcurl.
 */
#include "upstream_int.h"

#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static const serve_config *cfg;

#define H1_READ 16384          /* the most read by one recv() */
#define H1_MAX_CHUNK_LINE 1024 /* a chunk's size line, extensions included */
#define H1_SCAN_MS 250 /* how often deadlines and aborts are looked at */
/* A connection idle longer than this is closed, not used again: a server
 * closes its idle connections after a few seconds (Node's http after 5 s,
 * gunicorn's after 2 s), and a request sent just as it does meets a closed
 * socket: the server never read it, but from here that cannot be told
 * from a server that read it and died, so the forward ends as lost (an
 * unkeyed call gets 502, a keyed one is unknown). One second of idleness
 * is below the keep-alive of every server we know of. */
#define H1_IDLE_MS 1000

typedef struct h1conn {
  int fd;
  uint32_t events;            /* registered in the loop's epoll */
  int served;                 /* answers read whole on it */
  double idle_at;             /* when it last went idle */
  struct h1conn *prev, *next; /* in the idle list */
  struct xfer *x;             /* the forward on it; NULL when idle */
  char *in;                   /* read, from in_off to in_len not yet used */
  size_t in_off, in_len, in_cap;
} h1conn;

enum { H1_NONE, H1_LEN, H1_CHUNKED, H1_CLOSE };
enum { C_SIZE, C_DATA, C_CRLF, C_TRAILER };

typedef struct h1x {
  h1conn *c;
  char *out; /* the request's bytes */
  size_t out_len, out_off;
  int connecting, retried;
  int addr, tries; /* the address connected to; how many were tried */
  int got_any;     /* a byte of an answer came */
  int want_status; /* the next line starts a header block */
  int framed;      /* past the final header block */
  int mode, cstate;
  uint64_t left; /* H1_LEN: body bytes; C_DATA: chunk bytes */
  size_t trailer_bytes;
  int keep; /* the connection may serve again */
  int is_head;
  double connect_by, answer_by; /* 0: none */
  /* The framing headers of the header block being read. */
  int v10, cl_n, cl_bad, te_n, te_chunked, conn_close;
  uint64_t cl;
} h1x;

#define H1_ADDRS 2
static struct {
  struct sockaddr_storage addr[H1_ADDRS];
  socklen_t addrlen[H1_ADDRS];
  int naddr;
  int pref; /* the address that took the last new connection */
  char *authority; /* Host */
  char *base;      /* the base URL's path ("" for none) */
  h1conn *idle;    /* most recently used first */
  int nidle;
  int timed; /* forwards with a deadline or an abort check */
  double scan_at;
} H;

h1x *h1_new(void) { return calloc(1, sizeof(h1x)); }

int h1_init(const serve_config *c) {
  const char *u = c->upstream, *auth, *end, *e = getenv("IDEM_HTTP_CLIENT");
  char host[64], port[8] = "80";
  struct addrinfo hints, *ai = NULL;
  size_t n;
  cfg = c;
  if (e && strcmp(e, "libcurl") == 0)
    return -1;
  if (strncasecmp(u, "http://", 7) != 0)
    return -1;
  auth = u + 7;
  end = auth + strcspn(auth, "/?#");
  if (*end == '?' || *end == '#' || memchr(auth, '@', (size_t)(end - auth)))
    return -1;
  if (*auth == '[') {
    const char *rb = memchr(auth, ']', (size_t)(end - auth));
    if (!rb || (size_t)(rb - auth - 1) >= sizeof host)
      return -1;
    memcpy(host, auth + 1, (size_t)(rb - auth - 1));
    host[rb - auth - 1] = '\0';
    if (rb + 1 < end && rb[1] != ':')
      return -1;
    if (rb + 1 < end)
      auth = rb + 1;
    else
      auth = end;
  } else {
    n = strcspn(auth, ":/?#");
    if (n == 0 || n >= sizeof host)
      return -1;
    memcpy(host, auth, n);
    host[n] = '\0';
    auth += n;
  }
  if (*auth == ':') {
    n = (size_t)(end - auth - 1);
    if (n == 0 || n >= sizeof port || strspn(auth + 1, "0123456789") < n)
      return -1;
    memcpy(port, auth + 1, n);
    port[n] = '\0';
  }
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  const char *addrs[H1_ADDRS] = {host, NULL};
  if (strcasecmp(host, "localhost") == 0)
    addrs[0] = "::1", addrs[1] = "127.0.0.1";
  H.naddr = H.pref = 0;
  for (int i = 0; i < H1_ADDRS && addrs[i]; i++) {
    if (getaddrinfo(addrs[i], port, &hints, &ai) != 0 || !ai)
      return -1; /* a host name: libcurl resolves it */
    memcpy(&H.addr[i], ai->ai_addr, ai->ai_addrlen);
    H.addrlen[i] = ai->ai_addrlen;
    H.naddr++;
    freeaddrinfo(ai);
  }
  auth = u + 7;
  if (!(H.authority = strndup(auth, (size_t)(end - auth))) ||
      !(H.base = strdup(end)))
    return -1;
  return 0;
}

static int h1_watch(h1conn *c, uint32_t events) {
  struct epoll_event ev;
  if (c->events == events)
    return 0;
  memset(&ev, 0, sizeof ev);
  ev.events = events;
  ev.data.fd = c->fd;
  if (epoll_ctl(up_epfd(), c->events ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd,
                &ev) != 0)
    return -1;
  if (!c->events && up_fd_route(c->fd, c) != 0) {
    epoll_ctl(up_epfd(), EPOLL_CTL_DEL, c->fd, NULL);
    return -1;
  }
  c->events = events;
  return 0;
}

static void h1_close(h1conn *c) {
  if (c->events) {
    epoll_ctl(up_epfd(), EPOLL_CTL_DEL, c->fd, NULL);
    (void)up_fd_route(c->fd, NULL);
  }
  if (c->fd >= 0)
    close(c->fd);
  free(c->in);
  free(c);
}

static void idle_unlink(h1conn *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    H.idle = c->next;
  if (c->next)
    c->next->prev = c->prev;
  c->prev = c->next = NULL;
  H.nidle--;
}

/*
 * The request's bytes are written twice by the same code: once with no
 * buffer, counting them, then into a buffer of exactly that size. No size
 * is computed apart from the writing (one once was, and a request whose
 * X-Forwarded-For lines each got the client's address appended wrote past
 * it).
 */
typedef struct out {
  char *p;  /* NULL: only count */
  size_t n; /* bytes written, or counted */
} out;

static void put(out *o, const void *b, size_t n) {
  if (o->p)
    memcpy(o->p + o->n, b, n);
  o->n += n;
}

static void puts_(out *o, const char *s) { put(o, s, strlen(s)); }

/* up_each_forwarded()'s: one header line, into ctx (an out *). */
static void put_header(void *ctx, const char *name, const char *value,
                       const char *append) {
  out *o = ctx;
  puts_(o, name);
  puts_(o, *value || append ? ": " : ":");
  puts_(o, value);
  if (append) {
    puts_(o, *value ? ", " : "");
    puts_(o, append);
  }
  puts_(o, "\r\n");
}

/* Request line, Host, the client's end-to-end headers
 * (up_each_forwarded()), Content-Length, the body. */
static void write_request(const up_request *rq, int body, out *o) {
  char num[32];
  puts_(o, rq->method);
  puts_(o, " ");
  puts_(o, H.base);
  puts_(o, rq->uri);
  puts_(o, " HTTP/1.1\r\nHost: ");
  puts_(o, H.authority);
  puts_(o, "\r\n");
  up_each_forwarded(rq, put_header, o);
  if (body) {
    snprintf(num, sizeof num, "%zu", rq->body_len);
    puts_(o, "Content-Length: ");
    puts_(o, num);
    puts_(o, "\r\n");
  }
  puts_(o, "\r\n");
  if (body && rq->body_len)
    put(o, rq->body, rq->body_len);
}

/* The request's bytes into h->out. 0, or -1 when out of memory. */
static int h1_request(xfer *x) {
  const up_request *rq = x->rq;
  h1x *h = x->h1;
  int body = !h->is_head && (rq->body_len || strcmp(rq->method, "POST") == 0 ||
                             strcmp(rq->method, "PUT") == 0 ||
                             strcmp(rq->method, "PATCH") == 0);
  out count = {NULL, 0}, o;
  write_request(rq, body, &count);
  if (!(h->out = malloc(count.n ? count.n : 1)))
    return -1;
  o.p = h->out;
  o.n = 0;
  write_request(rq, body, &o);
  h->out_len = o.n;
  return 0;
}

int h1_test_request(xfer *x, const char **bytes, size_t *len) {
  if (h1_request(x) != 0)
    return -1;
  *bytes = x->h1->out;
  *len = x->h1->out_len;
  return 0;
}

static void h1_finish(xfer *x, up_result r);

/* Ends x with r and a message (printf-style). */
static void h1_fail(xfer *x, up_result r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void h1_fail(xfer *x, up_result r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  up_set_errorv(x->rs, fmt, ap);
  va_end(ap);
  h1_finish(x, r);
}

/* The answer broke off: before any answer (the upstream may have acted),
 * or after a final answer began (it has). */
static void h1_broke(xfer *x, const char *how) {
  h1x *h = x->h1;
  if (!h->got_any)
    h1_fail(x, UP_LOST,
            "the connection closed after the request was sent, before any "
            "answer (%s)",
            how);
  else if (h->framed || x->rs->status >= 200)
    h1_fail(x, UP_INVALID, "the answer (%d) broke off: %s", x->rs->status, how);
  else
    h1_fail(x, UP_LOST, "the answer broke off before its status: %s", how);
}

static int h1_send(xfer *x);
static void h1_begin(xfer *x);

/* x lets go of its connection, on which nothing of it was sent, and
 * begins again on another. */
static void h1_again(xfer *x) {
  h1conn *c = x->h1->c;
  x->h1->c = NULL;
  c->x = NULL;
  h1_close(c);
  x->h1->connecting = 0;
  x->h1->connect_by = 0;
  h1_begin(x);
}

/* A connection for x: an idle one still open, or a new one (connecting). 0,
 * or -1 with x ended. */
static int h1_connect(xfer *x) {
  h1x *h = x->h1;
  h1conn *c;
  int fd, one = 1;
  while ((c = H.idle) != NULL) {
    char b;
    ssize_t k;
    idle_unlink(c);
    /* Closed (or written to) while idle: the upstream's keep-alive ended
     * it. Its event may not have been read yet. */
    k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
        up_now_ms() - c->idle_at <= H1_IDLE_MS)
      break;
    h1_close(c);
  }
  if (!c) {
    if (!h->tries++)
      h->addr = H.pref;
    fd = socket(H.addr[h->addr].ss_family,
                SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
      h1_fail(x, UP_NO_FDS, "the gateway ran out of file descriptors");
      return -1;
    }
    if (fd < 0) {
      h1_fail(x, UP_NOT_SENT, "nothing was sent: socket: %s", strerror(errno));
      return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!(c = calloc(1, sizeof *c))) {
      close(fd);
      h1_fail(x, UP_NOT_SENT, "nothing was sent: out of memory");
      return -1;
    }
    c->fd = fd;
    if (connect(fd, (struct sockaddr *)&H.addr[h->addr], H.addrlen[h->addr]) !=
        0) {
      if (errno != EINPROGRESS) {
        int e = errno;
        h1_close(c);
        if (h->tries < H.naddr) {
          h->addr = (h->addr + 1) % H.naddr;
          return h1_connect(x);
        }
        h1_fail(x, UP_NOT_SENT, "nothing was sent: could not connect: %s",
                strerror(e));
        return -1;
      }
      h->connecting = 1;
      h->connect_by = up_now_ms() + (double)(cfg->upstream_timeout_ms < 10000
                                                 ? cfg->upstream_timeout_ms
                                                 : 10000);
    } else {
      H.pref = h->addr;
    }
  }
  c->x = x;
  h->c = c;
  if (h1_watch(c, h->connecting ? EPOLLOUT : EPOLLIN) != 0) {
    h->c = NULL;
    h1_close(c);
    h1_fail(x, UP_NOT_SENT, "nothing was sent: epoll: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* Writes what is left of the request: 1 while x goes on on the same
 * connection, 0 when it has ended or moved to a new one. */
static int h1_send(xfer *x) {
  h1x *h = x->h1;
  while (h->out_off < h->out_len) {
    ssize_t k = send(h->c->fd, h->out + h->out_off, h->out_len - h->out_off,
                     MSG_NOSIGNAL);
    if (k > 0) {
      h->out_off += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (h1_watch(h->c, EPOLLIN | EPOLLOUT) != 0) {
        h1_fail(x, h->out_off ? UP_LOST : UP_NOT_SENT, "epoll: %s",
                strerror(errno));
        return 0;
      }
      return 1;
    }
    if (h->out_off == 0 && h->c->served && !h->retried) {
      /* A kept connection that the upstream had closed: not a byte left,
       * so the request goes on a new one. */
      h->retried = 1;
      h1_again(x);
      return 0;
    }
    if (h->out_off == 0)
      h1_fail(x, UP_NOT_SENT, "nothing was sent: %s",
              k < 0 ? strerror(errno) : "the connection closed");
    else
      h1_broke(x, k < 0 ? strerror(errno) : "the connection closed");
    return 0;
  }
  if (h->c->events != EPOLLIN && h1_watch(h->c, EPOLLIN) != 0) {
    h1_fail(x, UP_LOST, "epoll: %s", strerror(errno));
    return 0;
  }
  return 1;
}

static void h1_begin(xfer *x) {
  if (h1_connect(x) != 0)
    return;
  if (!x->h1->connecting)
    (void)h1_send(x);
}

/* One header line p[0..l) of the block being read (not its status line,
 * not its end): checked, and its framing noted. 0, or -1 with x ended. */
static int h1_field(xfer *x, const char *p, size_t l) {
  h1x *h = x->h1;
  const char *colon = memchr(p, ':', l), *v;
  size_t nl, vl;
  if (*p == ' ' || *p == '\t') {
    /* obs-fold: refused, as up_on_header() refuses it on libcurl's path. */
    h1_fail(x, UP_INVALID, "the answer has a folded header line (obs-fold)");
    return -1;
  }
  if (!colon || !serve_is_token(p, (size_t)(colon - p))) {
    h1_fail(x, UP_INVALID,
            "the answer has a header line that is not "
            "\"name: value\"");
    return -1;
  }
  nl = (size_t)(colon - p);
  v = colon + 1;
  vl = l - nl - 1;
  while (vl && (*v == ' ' || *v == '\t'))
    v++, vl--;
  while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
    vl--;
  if (nl == 14 && strncasecmp(p, "content-length", 14) == 0) {
    uint64_t n = 0;
    if (vl == 0 || vl > 18 || strspn(v, "0123456789") < vl) {
      h->cl_bad = 1;
    } else {
      for (size_t i = 0; i < vl; i++)
        n = n * 10 + (uint64_t)(v[i] - '0');
      if (h->cl_n && n != h->cl)
        h->cl_bad = 1;
      h->cl = n;
    }
    h->cl_n++;
  } else if (nl == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
    h->te_n++;
    h->te_chunked = vl == 7 && strncasecmp(v, "chunked", 7) == 0;
  } else if (nl == 10 && strncasecmp(p, "connection", 10) == 0) {
    /* "close" among its tokens */
    for (size_t i = 0; i + 5 <= vl; i++)
      if (strncasecmp(v + i, "close", 5) == 0 &&
          (i == 0 || v[i - 1] == ',' || v[i - 1] == ' ' || v[i - 1] == '\t') &&
          (i + 5 == vl || v[i + 5] == ',' || v[i + 5] == ' ' ||
           v[i + 5] == '\t'))
        h->conn_close = 1;
  }
  return 0;
}

/* The end of the final header block: how the body is framed. 0, or -1
 * with x ended. */
static int h1_frame(xfer *x) {
  h1x *h = x->h1;
  int code = x->rs->status;
  if (h->te_n && h->cl_n) {
    h1_fail(x, UP_INVALID,
            "the answer has both Content-Length and Transfer-Encoding");
    return -1;
  }
  if (h->te_n > 1 || (h->te_n && !h->te_chunked)) {
    h1_fail(x, UP_INVALID,
            "the answer's Transfer-Encoding is not \"chunked\" alone");
    return -1;
  }
  if (h->cl_bad) {
    h1_fail(x, UP_INVALID, "the answer's Content-Length is not one number");
    return -1;
  }
  if (h->is_head || code == 204 || code == 304)
    h->mode = H1_NONE;
  else if (h->te_n)
    h->mode = H1_CHUNKED, h->cstate = C_SIZE;
  else if (h->cl_n)
    h->mode = h->cl ? H1_LEN : H1_NONE, h->left = h->cl;
  else
    h->mode = H1_CLOSE;
  h->keep = !h->v10 && !h->conn_close && h->mode != H1_CLOSE;
  return 0;
}

/* Hands n body bytes to up_on_body(). 0, or -1 with x ended. */
static int h1_body(xfer *x, const char *p, size_t n) {
  if (!n)
    return 0;
  if (up_on_body((char *)p, 1, n, &x->s) == n)
    return 0;
  if (x->s.too_large)
    h1_fail(x, UP_TOO_LARGE, "the response body is larger than %zu bytes",
            cfg->max_pass);
  else
    h1_fail(x, UP_INVALID, "the answer (%d) broke off: it was not taken",
            x->rs->status);
  return -1;
}

/* Reads what the connection holds: 1 when the answer is whole, 0 when more
 * is needed, -1 when x has ended. */
static int h1_parse(xfer *x) {
  h1x *h = x->h1;
  h1conn *c = h->c;
  while (!h->framed) {
    char *p = c->in + c->in_off, *lf;
    size_t avail = c->in_len - c->in_off, n, l, rc;
    if (!(lf = memchr(p, '\n', avail))) {
      if (avail > UP_MAX_HEADER_BYTES) {
        h1_fail(x, UP_TOO_LARGE,
                "the response's headers are larger than %d bytes",
                UP_MAX_HEADER_BYTES);
        return -1;
      }
      return 0;
    }
    h->got_any = 1;
    n = (size_t)(lf - p) + 1;
    l = n - 1;
    if (l && p[l - 1] == '\r')
      l--;
    if (memchr(p, '\r', l) || memchr(p, '\0', l)) {
      h1_fail(x, UP_INVALID, "the answer has a header line with CR or NUL");
      return -1;
    }
    if (h->want_status) {
      if (l < 12 || strncmp(p, "HTTP/1.", 7) != 0 ||
          (p[7] != '0' && p[7] != '1') || p[8] != ' ') {
        h1_fail(x, UP_INVALID, "the answer's status line is not HTTP/1.x");
        return -1;
      }
      h->want_status = 0;
      h->v10 = p[7] == '0';
      h->cl_n = h->cl_bad = h->te_n = h->te_chunked = h->conn_close = 0;
      h->cl = 0;
    } else if (l == 0) {
      if (!x->s.interim && h1_frame(x) != 0)
        return -1;
    } else if (h1_field(x, p, l) != 0) {
      return -1;
    }
    c->in_off += n;
    rc = up_on_header(p, 1, n, &x->s);
    if (rc != n) {
      if (x->s.headers_too_large)
        h1_fail(x, UP_TOO_LARGE,
                "the response's headers are larger than %d bytes",
                UP_MAX_HEADER_BYTES);
      else if (x->s.bad_status)
        h1_fail(x, UP_INVALID,
                "the response's status is not an HTTP status (100-599)");
      else if (x->s.upgrade)
        h1_fail(x, UP_INVALID, "the upstream switched protocols (101) unasked");
      else
        h1_fail(x, UP_INVALID, "the answer could not be kept: out of memory");
      return -1;
    }
    if (l == 0) {
      if (x->s.interim)
        h->want_status = 1;
      else
        h->framed = 1;
    }
  }
  for (;;) {
    char *p = c->in + c->in_off, *lf;
    size_t avail = c->in_len - c->in_off, n;
    switch (h->mode) {
    case H1_NONE:
      return 1;
    case H1_CLOSE:
      c->in_off = c->in_len;
      return h1_body(x, p, avail) == 0 ? 0 : -1;
    case H1_LEN:
      n = avail < h->left ? avail : (size_t)h->left;
      c->in_off += n;
      h->left -= n;
      if (h1_body(x, p, n) != 0)
        return -1;
      return h->left == 0;
    default:
      break;
    }
    /* chunked */
    if (h->cstate == C_DATA) {
      n = avail < h->left ? avail : (size_t)h->left;
      c->in_off += n;
      h->left -= n;
      if (h1_body(x, p, n) != 0)
        return -1;
      if (h->left)
        return 0;
      h->cstate = C_CRLF;
      continue;
    }
    if (!(lf = memchr(p, '\n', avail))) {
      if (avail > (h->cstate == C_TRAILER ? (size_t)UP_MAX_HEADER_BYTES
                                          : (size_t)H1_MAX_CHUNK_LINE)) {
        h1_fail(x, UP_INVALID, "the answer's chunked framing is broken");
        return -1;
      }
      return 0;
    }
    n = (size_t)(lf - p) + 1;
    size_t l = n - 1;
    if (l && p[l - 1] == '\r')
      l--;
    c->in_off += n;
    if (h->cstate == C_CRLF) {
      if (l != 0) {
        h1_fail(x, UP_INVALID, "the answer's chunk does not end its line");
        return -1;
      }
      h->cstate = C_SIZE;
    } else if (h->cstate == C_SIZE) {
      size_t d = 0;
      uint64_t v = 0;
      while (d < l && d < 16 && isxdigit((unsigned char)p[d])) {
        int k = p[d] <= '9' ? p[d] - '0' : (p[d] | 0x20) - 'a' + 10;
        v = v * 16 + (uint64_t)k;
        d++;
      }
      size_t e = d;
      while (e < l && (p[e] == ' ' || p[e] == '\t'))
        e++;
      if (d == 0 || d > 15 || (e < l && p[e] != ';') || memchr(p, '\r', l) ||
          memchr(p, '\0', l)) {
        h1_fail(x, UP_INVALID, "the answer's chunk size is not hex");
        return -1;
      }
      h->left = v;
      h->cstate = v ? C_DATA : C_TRAILER;
    } else { /* C_TRAILER: up_on_header() drops trailer fields */
      h->trailer_bytes += n;
      if (h->trailer_bytes > UP_MAX_HEADER_BYTES) {
        h1_fail(x, UP_INVALID, "the answer's trailers are too large");
        return -1;
      }
      if (l == 0)
        return 1;
    }
  }
}

/* Room for at least min more bytes in c's buffer (what was used is dropped
 * first). 0, or -1 when out of memory. */
static int h1_room(h1conn *c, size_t min) {
  if (c->in_off == c->in_len)
    c->in_off = c->in_len = 0;
  if (c->in_cap - c->in_len >= min)
    return 0;
  if (c->in_off) {
    memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
    c->in_len -= c->in_off;
    c->in_off = 0;
  }
  if (c->in_cap - c->in_len < min) {
    size_t cap = c->in_cap ? c->in_cap : 4096;
    while (cap - c->in_len < min)
      cap *= 2;
    char *b = realloc(c->in, cap);
    if (!b)
      return -1;
    c->in = b;
    c->in_cap = cap;
  }
  return 0;
}

/* k more bytes are in x's buffer: the answer goes on. 1 while x waits for
 * more, 0 when it has ended. */
static int h1_took(xfer *x, size_t k) {
  h1conn *c = x->h1->c;
  int r;
  c->in_len += k;
  if ((r = h1_parse(x)) < 0)
    return 0;
  if (r == 0)
    return 1;
  if (c->in_off != c->in_len)
    x->h1->keep = 0; /* bytes after the answer: not HTTP we can follow */
  h1_finish(x, UP_OK);
  return 0;
}

/* The connection ended (how: why): the end of an answer framed by it, else
 * an answer broken off. Only an orderly close (clean: a read of 0 bytes)
 * ends an answer framed by the close: one cut by a reset (RST) is
 * incomplete (RFC 9112 section 8), whatever it had sent so far. */
static void h1_ended(xfer *x, int clean, const char *how) {
  if (clean && x->h1->framed && x->h1->mode == H1_CLOSE) {
    x->h1->keep = 0;
    h1_finish(x, UP_OK);
  } else {
    h1_broke(x, how);
  }
}

/* Reads from x's connection and goes on with its answer. */
static void h1_read(xfer *x) {
  h1conn *c = x->h1->c;
  for (;;) {
    ssize_t k;
    size_t room;
    if (h1_room(c, H1_READ / 4) != 0) {
      h1_broke(x, "out of memory");
      return;
    }
    room = c->in_cap - c->in_len;
    if (room > H1_READ)
      room = H1_READ;
    k = recv(c->fd, c->in + c->in_len, room, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (k <= 0) {
      h1_ended(x, k == 0, k == 0 ? "the connection closed" : strerror(errno));
      return;
    }
    if (!h1_took(x, (size_t)k) || (size_t)k < room)
      return; /* ended, or read all there was */
  }
}

int h1_test_start(xfer *x) {
  h1x *h = x->h1;
  if (!(h->c = calloc(1, sizeof *h->c)))
    return -1;
  h->c->fd = -1;
  h->c->x = x;
  h->want_status = 1;
  h->is_head = strcmp(x->rq->method, "HEAD") == 0;
  return 0;
}

void h1_feed(xfer *x, const char *p, size_t n) {
  if (!n) {
    h1_ended(x, 1, "the connection closed");
  } else if (h1_room(x->h1->c, n) != 0) {
    h1_broke(x, "out of memory");
  } else {
    memcpy(x->h1->c->in + x->h1->c->in_len, p, n);
    (void)h1_took(x, n);
  }
}

/* An event on one of h1's connections. */
void h1_event(h1conn *c, uint32_t events) {
  xfer *x = c->x;
  if (!x) {
    /* Idle: the upstream closed it, or wrote what no request asked for. */
    idle_unlink(c);
    h1_close(c);
    return;
  }
  if (x->h1->connecting) {
    int err = 0;
    socklen_t el = sizeof err;
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
      return;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
      err = errno;
    if (err && x->h1->tries < H.naddr) {
      /* localhost's other address: nothing was sent on this one. */
      x->h1->addr = (x->h1->addr + 1) % H.naddr;
      h1_again(x);
      return;
    }
    if (err) {
      h1_fail(x, UP_NOT_SENT, "nothing was sent: could not connect: %s",
              strerror(err));
      return;
    }
    H.pref = x->h1->addr;
    x->h1->connecting = 0;
    x->h1->connect_by = 0;
    (void)h1_send(x);
    return;
  }
  if ((events & EPOLLOUT) && x->h1->out_off < x->h1->out_len && !h1_send(x))
    return; /* ended, or moved to a new connection */
  if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
    h1_read(x);
}

static void h1_finish(xfer *x, up_result r) {
  h1x *h = x->h1;
  h1conn *c = h->c;
  x->rs->ms = up_now_ms() - x->t0;
  if (r == UP_OK)
    up_drop_named(x->rs, x->s.connection);
  if (r != UP_OK && !x->rq->head) {
    up_free_headers(x->rs, &x->s);
    free(x->rs->body);
    x->rs->body = NULL;
    x->rs->body_len = 0;
  }
  free(x->s.connection);
  if (c) {
    c->x = NULL;
    /* An answer that came before the request was all sent (a 413, a 401
     * to a large body) leaves the rest unsent: the upstream would read the
     * next request on the connection as that rest. */
    if (r == UP_OK && h->keep && h->out_off == h->out_len &&
        H.nidle < UP_KEEP_CONNECTIONS && h1_watch(c, EPOLLIN) == 0) {
      c->served++;
      c->idle_at = up_now_ms();
      c->in_off = c->in_len = 0;
      c->prev = NULL;
      c->next = H.idle;
      if (H.idle)
        H.idle->prev = c;
      H.idle = c;
      H.nidle++;
    } else {
      h1_close(c);
    }
  }
  up_unlink_active(x);
  if (x->rq->abort_check || h->answer_by > 0)
    H.timed--;
  free(h->out);
  free(h);
  x->done(x->ctx, r);
  free(x);
}

/* On the loop, from take_pending(): x starts. */
void h1_start(xfer *x) {
  h1x *h = x->h1;
  h->want_status = 1;
  h->is_head = strcmp(x->rq->method, "HEAD") == 0;
  if (!x->rq->head)
    h->answer_by = x->t0 + (double)cfg->upstream_timeout_ms;
  if (x->rq->abort_check || h->answer_by > 0) {
    if (H.timed++ == 0)
      H.scan_at = up_now_ms() + H1_SCAN_MS;
  }
  if (h1_request(x) != 0) {
    h1_fail(x, UP_NOT_SENT, "nothing was sent: out of memory");
    return;
  }
  h1_begin(x);
}

/* Ends x as libcurl's path ends a transfer that timed out (shutting down
 * too) or whose abort_check asked. */
void h1_stop(xfer *x, int aborted) {
  h1x *h = x->h1;
  if (h->out_off == 0)
    h1_fail(x, UP_NOT_SENT, "nothing was sent: %s",
            aborted ? "the forward was stopped" : "no connection in time");
  else if (h->framed || x->rs->status >= 200)
    h1_fail(x, UP_INVALID, "the answer (%d) broke off: %s", x->rs->status,
            aborted ? "the forward was stopped" : "it took too long");
  else if (aborted)
    h1_fail(x, UP_ABORTED, "the key's lease was lost");
  else
    h1_fail(x, UP_TIMEOUT, "no answer within %lld ms",
            (long long)cfg->upstream_timeout_ms);
}

int h1_wait_ms(double now) {
  if (H.timed <= 0)
    return -1;
  return H.scan_at <= now ? 0 : (int)(H.scan_at - now) + 1;
}

/* Deadlines and abort checks, every H1_SCAN_MS while any forward has one. */
void h1_tick(double now) {
  xfer *x, *next;
  if (H.timed <= 0 || now < H.scan_at)
    return;
  H.scan_at = now + H1_SCAN_MS;
  for (x = up_first_active(); x; x = next) {
    next = x->next_active;
    if (!x->h1)
      continue;
    if ((x->h1->connect_by > 0 && now >= x->h1->connect_by) ||
        (x->h1->answer_by > 0 && now >= x->h1->answer_by))
      h1_stop(x, 0);
    else if (x->rq->abort_check && x->rq->abort_check(x->rq->abort_ctx))
      h1_stop(x, 1);
  }
}

void h1_cleanup(void) {
  while (H.idle) {
    h1conn *c = H.idle;
    idle_unlink(c);
    h1_close(c);
  }
  free(H.authority);
  free(H.base);
  H.authority = H.base = NULL;
}
