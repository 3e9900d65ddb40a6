/* floor_io.c -- see floor_io.h. */
#define _GNU_SOURCE
#include "floor_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

void floor_die(const char *what, const char *why) {
  fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, why);
  exit(1);
}

void text_add(text *t, const char *p, size_t n) {
  if (t->len + n + 1 > t->cap) {
    size_t cap = (t->len + n + 1) * 2;
    char *b = realloc(t->buf, cap);
    if (!b)
      floor_die("memory", "out of memory");
    t->buf = b;
    t->cap = cap;
  }
  memcpy(t->buf + t->len, p, n);
  t->len += n;
  t->buf[t->len] = '\0';
}

void text_drop(text *t, size_t n) {
  t->len -= n;
  memmove(t->buf, t->buf + n, t->len + 1);
}

int header_value(const char *p, size_t len, const char *name, char *out,
                 size_t cap) {
  size_t nl = strlen(name);
  const char *v = p + nl;
  size_t vl = len - nl;
  if (len <= nl || strncasecmp(p, name, nl) != 0)
    return 0;
  while (vl && (*v == ' ' || *v == '\t'))
    v++, vl--;
  while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
    vl--;
  if (vl >= cap)
    return 0;
  memcpy(out, v, vl);
  out[vl] = '\0';
  return 1;
}

int find_header(const text *t, size_t head, const char *name, char *out,
                size_t cap) {
  const char *l = strstr(t->buf, "\r\n"), *end = t->buf + head;
  for (; l && l + 2 < end; l = strstr(l + 2, "\r\n"))
    if (header_value(l + 2, strcspn(l + 2, "\r\n"), name, out, cap))
      return 1;
  return 0;
}

int read_message(int fd, text *t, size_t *head, size_t *blen) {
  for (;;) {
    const char *end = t->len ? strstr(t->buf, "\r\n\r\n") : NULL;
    char buf[16384];
    ssize_t n;
    if (end) {
      char v[32];
      *head = (size_t)(end + 4 - t->buf);
      *blen = find_header(t, *head, "content-length:", v, sizeof v)
                  ? strtoul(v, NULL, 10)
                  : 0;
      if (t->len >= *head + *blen)
        return 1;
    }
    if ((n = read(fd, buf, sizeof buf)) <= 0)
      return 0;
    text_add(t, buf, (size_t)n);
  }
}

int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return 0;
    p += w, n -= (size_t)w;
  }
  return 1;
}

int floor_listen(int *port) {
  struct sockaddr_in sa;
  socklen_t sl = sizeof sa;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(ls, 512) != 0 || getsockname(ls, (struct sockaddr *)&sa, &sl))
    floor_die("listen", "cannot listen on 127.0.0.1");
  *port = ntohs(sa.sin_port);
  return ls;
}

int floor_accept(int ls) {
  int one = 1, fd = accept(ls, NULL, NULL);
  if (fd >= 0)
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static const char fp[] =
    "6d6f7265207468616e206120666c6f6f722c20612066696e6765727072696e74";

idem_call *floor_claim(idem_store *store, const char *op, const char *key) {
  idem_id id = {"bench", op, key};
  idem_call *c = NULL;
  if (idem_claim(store, &id, fp, NULL, &c) != IDEM_OK ||
      idem_call_outcome(c) != IDEM_PROCEED)
    floor_die("claim", idem_errmsg());
  return c;
}

void floor_record(idem_store *store, idem_call *c, int status,
                  const char *body, size_t len) {
  idem_response r;
  memset(&r, 0, sizeof r);
  r.status = status;
  r.body = body;
  r.body_len = len;
  if (idem_complete(store, c, &r) != IDEM_OK)
    floor_die("complete", idem_errmsg());
  idem_call_free(c);
}
