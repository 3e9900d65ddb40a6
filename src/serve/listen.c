/*
 * listen.c -- binding a listener for libmicrohttpd from "HOST:PORT".
 *
 * Forms: "127.0.0.1:8080", "[::1]:8080", "localhost:8080", ":8080" (every
 * address, IPv6 and IPv4). Port 0 asks the kernel for a free port; the
 * address actually bound is reported, so that tests and scripts can read it.
 */
#include "serve.h"
#include "principal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* libmicrohttpd's own messages (a client's malformed request, a header
 * too large, an accept() that found no descriptor), marked as the
 * gateway's. At most one line a second: out of descriptors, libmicrohttpd
 * says so on every attempt to accept, which once grew the log by megabytes
 * a second; the line after a quiet spell says how many were left out. */
const char *listen_log_name = "idem serve";

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  static serve_rate rate = SERVE_RATE_INIT;
  unsigned long left;
  char line[1024];
  size_t n;
  (void)cls;
  /* Counted before the limit below leaves the line out; a line about a
   * connection guard.c cut off is not written at all. */
  if (guard_mhd_message(fmt))
    return;
  if (!serve_rate_pass(&rate, &left))
    return;
  vsnprintf(line, sizeof line, fmt, ap);
  n = strlen(line);
  while (n && line[n - 1] == '\n')
    line[--n] = 0;
  if (left)
    fprintf(stderr, "%s: http: %s (and %lu more messages)\n", listen_log_name,
            line, left);
  else
    fprintf(stderr, "%s: http: %s\n", listen_log_name, line);
}

/* Splits HOST:PORT; host "" means every address. 0, or -1. */
static int split(const char *s, char *host, size_t hsize, char *port,
                 size_t psize) {
  const char *colon;
  size_t hl;
  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':')
      return -1;
    hl = (size_t)(end - s - 1);
    if (hl >= hsize)
      return -1;
    memcpy(host, s + 1, hl);
    host[hl] = 0;
    colon = end + 1;
  } else {
    if (!(colon = strrchr(s, ':')))
      return -1;
    hl = (size_t)(colon - s);
    if (hl >= hsize || memchr(s, ':', hl))
      return -1; /* an IPv6 address must be in brackets */
    memcpy(host, s, hl);
    host[hl] = 0;
  }
  if (!colon[1] || strlen(colon + 1) >= psize ||
      strspn(colon + 1, "0123456789") != strlen(colon + 1))
    return -1;
  snprintf(port, psize, "%s", colon + 1);
  return 0;
}

int listen_is_loopback(const char *where) {
  char host[256], port[16];
  struct addrinfo hints, *ai = NULL, *a;
  int loop = 1;
  if (split(where, host, sizeof host, port, sizeof port) != 0)
    return -1;
  if (!host[0])
    return 0; /* every address */
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (getaddrinfo(host, port, &hints, &ai) != 0)
    return -1;
  for (a = ai; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const struct sockaddr_in *s = (const void *)a->ai_addr;
      loop &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const struct sockaddr_in6 *s = (const void *)a->ai_addr;
      loop &= IN6_IS_ADDR_LOOPBACK(&s->sin6_addr) ||
              (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr) &&
               s->sin6_addr.s6_addr[12] == 127);
    } else {
      loop = 0;
    }
  }
  freeaddrinfo(ai);
  return loop;
}

struct MHD_Daemon *listen_on(const char *cmd, const char *what,
                             const char *where,
                             unsigned flags, MHD_AccessHandlerCallback handler,
                             void *cls, const struct MHD_OptionItem *options,
                             char *bound, size_t bound_size) {
  char host[256], port[16];
  struct addrinfo hints, *ai = NULL;
  struct MHD_Daemon *d = NULL;
  int rc, fd = -1, one = 1;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;

  if (split(where, host, sizeof host, port, sizeof port) != 0 ||
      atol(port) > 65535) {
    cli_error(cmd,
              "%s: '%s' is not HOST:PORT (for example "
              "127.0.0.1:8080, [::1]:8080 or :8080)",
              what, where);
    return NULL;
  }
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  hints.ai_family = host[0] ? AF_UNSPEC : AF_INET6;
  if ((rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai)) != 0) {
    cli_error(cmd, "%s: cannot resolve '%s': %s", what, where,
              gai_strerror(rc));
    return NULL;
  }
  /* The socket is made here so that its options and errors are ours; MHD
   * then accepts on it. Every address: an IPv6 socket that takes IPv4 too. */
  fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    cli_error(cmd, "%s: socket: %s", what, strerror(errno));
    goto out;
  }
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ai->ai_family == AF_INET6) {
    int v6only = host[0] ? 1 : 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
  }
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 1024) != 0) {
    cli_error(cmd, "%s: cannot listen on %s: %s", what, where,
              strerror(errno));
    goto out;
  }
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned p = 0;
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof a);
      p = ntohs(s6->sin6_port);
      snprintf(bound, bound_size, "[%s]:%u", a, p);
    } else {
      struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
      inet_ntop(AF_INET, &s4->sin_addr, a, sizeof a);
      p = ntohs(s4->sin_port);
      snprintf(bound, bound_size, "%s:%u", a, p);
    }
  }
  d = MHD_start_daemon(flags, 0, NULL, NULL, handler, cls,
                       MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                       MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_ARRAY, options,
                       MHD_OPTION_END);
  if (!d)
    cli_error(cmd, "%s: cannot start the HTTP server on %s", what, where);
  else
    fd = -1; /* the daemon's now */
out:
  if (fd >= 0)
    close(fd);
  freeaddrinfo(ai);
  return d;
}

void principal_warn_open(const principal_rule *r, const char *cmd,
                         const char *listen) {
  if (r->kind != PRINCIPAL_NONE || listen_is_loopback(listen) == 1)
    return;
  cli_error(cmd,
            "warning: --principal none on %s, which is not the loopback: "
            "every caller is one tenant, so a stored answer is replayed to "
            "anyone who sends its key; name a rule that tells callers apart "
            "(see --help)",
            listen);
}
