/*
 * gateway_floor.c -- the least a gateway that keeps idem's records does for
 * a fresh key (bench/gateway.sh's "(g) gateway floor").
 *
 *   gateway_floor STORE UPSTREAM_PORT
 *
 * Listens on a free port of 127.0.0.1 (its URL on stderr: "gateway_floor:
 * listening on URL") and gives each connection a thread of its own that,
 * for each request on it (keep-alive, one at a time), reads the request
 * whole, claims its Idempotency-Key (found by its name; no fingerprint, no
 * parsing of the body), writes the request unchanged to the upstream on a
 * kept-alive connection of its own (127.0.0.1:UPSTREAM_PORT), reads the
 * answer whole, records its status and body, and writes the answer back
 * unchanged, until SIGTERM. A request without a key is passed through.
 * Messages must be framed by Content-Length (as wrk's and nginx's are);
 * a claim that is not new ends the run.
 *
 * So it has what idem serve must have (the same store, opened once and
 * shared, its group commit; the client's hop and the upstream's), on the
 * threads the kernel schedules best for one request at a time, and none
 * of what idem serve adds: framing checks, fingerprints, limits, an event
 * loop that thousands of slow calls cannot exhaust. Beside (f), which has
 * no HTTP at all, it says how near a gateway on this machine can come.
 */
#define _GNU_SOURCE
#include "floor_io.h"

#include <arpa/inet.h>
#include <idem.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static idem_store *store;
static struct sockaddr_in upstream;

/* A connected TCP socket to upstream, without Nagle's delay. */
static int connect_upstream(void) {
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 ||
      connect(fd, (const struct sockaddr *)&upstream, sizeof upstream) != 0)
    floor_die("upstream", "cannot connect");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* One client connection, until it ends. */
static void *serve(void *arg) {
  int fd = (int)(intptr_t)arg, up = connect_upstream();
  text in = {0}, out = {0};
  size_t head, blen, ahead, ablen;
  while (read_message(fd, &in, &head, &blen)) {
    char key[256];
    idem_call *c = NULL;
    if (find_header(&in, head, "idempotency-key:", key, sizeof key))
      c = floor_claim(store, "POST /tickets", key);
    if (!write_all(up, in.buf, head + blen) ||
        !read_message(up, &out, &ahead, &ablen))
      floor_die("upstream", "the connection ended");
    if (c)
      floor_record(store, c, atoi(out.buf + 9), out.buf + ahead, ablen);
    if (!write_all(fd, out.buf, ahead + ablen))
      break;
    text_drop(&in, head + blen);
    text_drop(&out, ahead + ablen);
  }
  close(fd);
  close(up);
  free(in.buf);
  free(out.buf);
  return NULL;
}

int main(int argc, char **argv) {
  pthread_attr_t attr;
  int port, ls;
  if (argc != 3)
    floor_die("usage", "gateway_floor STORE UPSTREAM_PORT");
  signal(SIGPIPE, SIG_IGN);
  if (idem_store_open(argv[1], NULL, &store) != IDEM_OK)
    floor_die(argv[1], idem_errmsg());
  memset(&upstream, 0, sizeof upstream);
  upstream.sin_family = AF_INET;
  upstream.sin_port = htons((uint16_t)atoi(argv[2]));
  upstream.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ls = floor_listen(&port);
  fprintf(stderr, "gateway_floor: listening on http://127.0.0.1:%d\n", port);
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  /* Until SIGTERM ends the process: the store is a bench's, thrown away
   * after the run, and SQLite's log keeps every commit made. */
  for (;;) {
    pthread_t t;
    int fd = floor_accept(ls);
    if (fd < 0)
      continue;
    if (pthread_create(&t, &attr, serve, (void *)(intptr_t)fd) != 0)
      close(fd);
  }
}
