/*
 * limiter.c -- wrong tokens counted per client, so that guessing a token
 * is slow: at most LIMIT_PER_MINUTE a minute from one client, after which
 * its requests are refused, right token or not, until the minute ends.
 *
 * A client is its IPv4 address, or the /64 of its IPv6 address (one host
 * is given a whole /64). The table is bounded: a client counts only once
 * it has sent a wrong token, and when the table is full the client with
 * the fewest wrong tokens makes room, so that filling it from many
 * addresses locks nobody out; it only lets the least active guessers
 * start again.
 */
#include "console.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define LIMIT_PER_MINUTE 20
#define CLIENTS 256

typedef struct client {
  unsigned char key[17]; /* family, then 4 or 8 bytes */
  long minute;
  int count;
} client;

struct console_limiter {
  pthread_mutex_t mu;
  client clients[CLIENTS];
};

console_limiter *console_limiter_new(void) {
  console_limiter *l = calloc(1, sizeof *l);
  if (l)
    pthread_mutex_init(&l->mu, NULL);
  return l;
}

void console_limiter_free(console_limiter *l) {
  if (!l)
    return;
  pthread_mutex_destroy(&l->mu);
  free(l);
}

static long this_minute(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)(ts.tv_sec / 60);
}

/* c's client key; 0, or -1 when its address is not known. */
static int key_of(struct MHD_Connection *c, unsigned char key[17]) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const struct sockaddr *sa = ci ? ci->client_addr : NULL;
  memset(key, 0, 17);
  if (!sa)
    return -1;
  if (sa->sa_family == AF_INET) {
    key[0] = 4;
    memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
      key[0] = 4;
      memcpy(key + 1, a->s6_addr + 12, 4);
    } else {
      key[0] = 6;
      memcpy(key + 1, a->s6_addr, 8); /* its /64 */
    }
  } else {
    return -1;
  }
  return 0;
}

static client *find(console_limiter *l, const unsigned char key[17],
                    long minute) {
  for (int i = 0; i < CLIENTS; i++)
    if (l->clients[i].minute == minute &&
        memcmp(l->clients[i].key, key, 17) == 0)
      return &l->clients[i];
  return NULL;
}

int console_limited(console_limiter *l, struct MHD_Connection *c) {
  unsigned char key[17];
  client *k;
  int out;
  if (!l || key_of(c, key) != 0)
    return 0;
  pthread_mutex_lock(&l->mu);
  k = find(l, key, this_minute());
  out = k && k->count >= LIMIT_PER_MINUTE;
  pthread_mutex_unlock(&l->mu);
  return out;
}

int console_failed(console_limiter *l, struct MHD_Connection *c) {
  unsigned char key[17];
  long minute = this_minute();
  client *k;
  int n;
  if (!l || key_of(c, key) != 0)
    return 0;
  pthread_mutex_lock(&l->mu);
  if (!(k = find(l, key, minute))) {
    /* A slot of an earlier minute, or else the fewest wrong tokens. */
    for (int i = 0; i < CLIENTS; i++) {
      client *o = &l->clients[i];
      if (o->minute != minute) {
        k = o;
        break;
      }
      if (!k || o->count < k->count)
        k = o;
    }
    memcpy(k->key, key, 17);
    k->minute = minute;
    k->count = 0;
  }
  n = ++k->count;
  pthread_mutex_unlock(&l->mu);
  return n;
}
