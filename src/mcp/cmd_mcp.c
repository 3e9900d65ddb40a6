/*
 * cmd_mcp.c -- `idem mcp`: an MCP stdio proxy that makes tools/call
 * retries safe.
 *
 * This file reads the options, opens the store, starts the server and the
 * two reader threads (mcp_relay.c), and then waits in the main thread for
 * the server to end: it passes signals on to the server, and once the
 * client has closed its input it closes the server's, waits, and stops the
 * server if it does not end by itself. The proxy exits with the server's
 * status once every keyed call in progress has been settled.
 */
#include "mcp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char usage[] =
    "usage: idem mcp [--store URL] [--tenant T] [--require-key]\n"
    "                [--key-argument NAME] [--lease DUR] [--retention DUR]\n"
    "                [--on-unknown forward|fail] [--max-result SIZE]\n"
    "                [--shutdown-wait DUR] -- SERVER_CMD [ARG...]\n"
    "\n"
    "Runs the MCP server SERVER_CMD and relays newline-delimited JSON-RPC\n"
    "between it and the MCP client on standard input and output, unchanged\n"
    "and in order, except for tools/call requests that carry an idempotency\n"
    "key. Such a call is run at most once per key: the first is sent to the\n"
    "server and its result stored; a retry with the same key gets the stored\n"
    "result (with _meta[\"idem/replayed\"] = true) and nothing reaches the\n"
    "server. The key is read from params._meta.idempotencyKey, else\n"
    "params.idempotencyKey, else (with --key-argument) a tool argument; it\n"
    "is forwarded as the client sent it. The operation is the tool name;\n"
    "the fingerprint is the canonical JSON of {name, arguments} without the\n"
    "key. The server's initialize result gets\n"
    "capabilities.experimental[\"idem/idempotency\"].\n"
    "\n"
    "  --store URL          default: IDEM_STORE, else ./idem.db\n"
    "  --tenant T           scope of the keys (default \"\")\n"
    "  --require-key        refuse a tools/call without a key unless\n"
    "                       tools/list annotated the tool readOnlyHint or\n"
    "                       idempotentHint\n"
    "  --key-argument NAME  also take the key from the tool argument NAME\n"
    "                       (it stays in the arguments sent to the server)\n"
    "  --lease DUR          how long a call holds its key without renewal\n"
    "                       (default 30s; renewed while the server works),\n"
    "                       and how long a key whose call ended without a\n"
    "                       result is held before a retry may act again\n"
    "  --retention DUR      how long results are kept (default 24h)\n"
    "  --on-unknown forward (default) a call cancelled, or left unanswered\n"
    "                       by a server that exited, is sent again with the\n"
    "                       same key by a retry once its lease has ended\n"
    "  --on-unknown fail    such a key is refused until an operator settles\n"
    "                       it with `idem keys resolve`\n"
    "  --max-result SIZE    the largest result stored (default 16M less\n"
    "                       4k, also the most); a larger one is passed on,\n"
    "                       not stored, and its key marked unknown\n"
    "  --shutdown-wait DUR  once the client closes its input, how long the\n"
    "                       server may take to exit before SIGTERM, and\n"
    "                       then before SIGKILL (default 5s)\n"
    "DUR is 250ms, 30s, 5m, 24h or 7d. SIZE is bytes, or with k or M.\n"
    "\n"
    "JSON-RPC errors the proxy answers with (error.data.idem names them):\n"
    "  -32001 conflict       the key was used with other arguments\n"
    "  -32002 in_flight      the same call is still running (retryAfterMs)\n"
    "  -32003 unknown        an earlier attempt ended without a result\n"
    "                        (retryAfterMs with --on-unknown forward)\n"
    "  -32004 store_unavailable  nothing was sent; retry in a few seconds\n"
    "  -32005 key_required   --require-key: this tool needs a key\n"
    "  -32006 bad_key        the key is not 1-255 printable ASCII bytes\n"
    "  -32007 server_exited  the server is gone; nothing was sent\n"
    "  -32008 internal       the proxy failed; nothing was sent\n"
    "  -32009 batch          a keyed tools/call must not be in a batch\n"
    "See docs/mcp.md.\n"
    "\n"
    "Signals SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are\n"
    "passed on to the server. Exit status: the server's (128+N when signal\n"
    "N ended it); 2 usage; 1 the store cannot be opened; 126 or 127 the\n"
    "server cannot be started.\n";

static int parse(int argc, char **argv, mcp_opts *o) {
  memset(o, 0, sizeof *o);
  o->tenant = "";
  o->lease_ms = 30000;
  o->shutdown_wait_ms = 5000;
  o->max_result = IDEM_MAX_RESPONSE - 4096;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      if (i + 1 >= argc) {
        cli_error("mcp", "missing SERVER_CMD after --");
        return -1;
      }
      o->cmd = argv + i + 1;
      return 0;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
      return 1;
    if (strcmp(a, "--require-key") == 0) {
      o->require_key = 1;
      continue;
    }
    if (i + 1 >= argc) {
      cli_error("mcp", "%s: needs a value, or SERVER_CMD is missing after --",
                a);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(a, "--tenant") == 0) {
      if (cli_check_tenant("mcp", v) != 0)
        return -1;
      o->tenant = v;
    } else if (strcmp(a, "--store") == 0) {
      if (cli_store_option("mcp", v, &o->store) != 0)
        return -1;
    } else if (strcmp(a, "--key-argument") == 0) {
      if (!*v) {
        cli_error("mcp", "--key-argument: empty argument name");
        return -1;
      }
      o->key_argument = v;
    } else if (strcmp(a, "--lease") == 0) {
      if (cli_duration_option("mcp", a, v, 100, IDEM_MAX_LEASE_MS,
                              &o->lease_ms) != 0)
        return -1;
    } else if (strcmp(a, "--retention") == 0) {
      if (cli_duration_option("mcp", a, v, 1, IDEM_MAX_RETENTION_MS,
                              &o->retention_ms) != 0)
        return -1;
    } else if (strcmp(a, "--shutdown-wait") == 0) {
      if (cli_duration_option("mcp", a, v, 0, 3600000, &o->shutdown_wait_ms) !=
          0)
        return -1;
    } else if (strcmp(a, "--on-unknown") == 0) {
      if (strcmp(v, "fail") == 0)
        o->on_unknown_fail = 1;
      else if (strcmp(v, "forward") != 0) {
        cli_error("mcp", "--on-unknown: forward or fail, not '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--max-result") == 0) {
      if (cli_parse_size(v, IDEM_MAX_RESPONSE - 4096, &o->max_result) != 0) {
        cli_error("mcp",
                  "--max-result: bytes (k and M suffixes), at most "
                  "16M less 4k, not '%s'",
                  v);
        return -1;
      }
    } else {
      cli_error("mcp", "unknown option '%s'", a);
      return -1;
    }
  }
  cli_error("mcp", "missing -- SERVER_CMD");
  return -1;
}

/* The proxy lives as long as the process: a reader thread may still be
 * blocked on its input when run() returns. */
static mcp_proxy proxy;

static void close_server_input(mcp_proxy *p) {
  pthread_mutex_lock(&p->to_server.lock);
  if (p->to_server.fd >= 0)
    close(p->to_server.fd);
  p->to_server.fd = -1;
  pthread_mutex_unlock(&p->to_server.lock);
}

/* Waits for the server to exit, passing signals on; returns its wait
 * status. */
static int wait_server(mcp_proxy *p, int sig_fd) {
  int stage = 0, st = 0;
  double deadline = 0;
  for (;;) {
    pid_t r = waitpid(p->child, &st, WNOHANG);
    if (r == p->child)
      return st;
    if (r < 0 && errno != EINTR)
      return 0;
    pthread_mutex_lock(&p->lock);
    int eof = p->client_eof;
    pthread_mutex_unlock(&p->lock);
    double now = cli_now_ms();
    if (eof && stage == 0) {
      close_server_input(p);
      stage = 1;
      deadline = now + (double)p->o->shutdown_wait_ms;
    } else if (stage == 1 && now >= deadline) {
      cli_error("mcp",
                "the server has not exited %.1fs after its input "
                "was closed; sending SIGTERM",
                (double)p->o->shutdown_wait_ms / 1000);
      kill(-p->child, SIGTERM);
      stage = 2;
      deadline = now + (double)p->o->shutdown_wait_ms;
    } else if (stage == 2 && now >= deadline) {
      cli_error("mcp", "the server ignored SIGTERM; sending SIGKILL");
      kill(-p->child, SIGKILL);
      stage = 3;
    }
    int timeout = -1;
    if (stage == 1 || stage == 2)
      timeout = deadline - now < 1 ? 1 : (int)(deadline - now) + 1;
    struct pollfd f = {sig_fd, POLLIN, 0};
    if (poll(&f, 1, timeout) > 0) {
      unsigned char b[64];
      ssize_t n = read(sig_fd, b, sizeof b);
      for (ssize_t i = 0; i < n; i++)
        if (b[i] && mcp_signal_forwarded(b[i]))
          kill(-p->child, b[i]);
    }
  }
}

static int run(int argc, char **argv) {
  mcp_opts *o = calloc(1, sizeof *o);
  mcp_proxy *p = &proxy;
  int rc, sig[2] = {-1, -1}, to_child, from_child, st, status;
  pthread_t t;
  if (!o) {
    cli_error("mcp", "out of memory");
    return EXIT_FAIL;
  }
  rc = parse(argc, argv, o);
  if (rc == 1) {
    fputs(usage, stdout);
    free(o);
    return EXIT_OK;
  }
  if (rc != 0) {
    fputs("(see `idem mcp --help`)\n", stderr);
    free(o);
    return EXIT_USAGE;
  }
  /* A closed standard descriptor would be reused by the first file opened
   * and the server would write into it. */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF &&
        open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) {
      cli_error("mcp", "cannot open /dev/null: %s", strerror(errno));
      return EXIT_FAIL;
    }
  rc = idem_store_open(cli_store_url(o->store), NULL, &p->store);
  if (rc != IDEM_OK) {
    cli_idem_error("mcp", "open store", rc);
    free(o);
    return EXIT_FAIL;
  }
  p->o = o;
  p->tools = json_object();
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->cond, NULL);
  pthread_mutex_init(&p->to_server.lock, NULL);
  pthread_mutex_init(&p->to_client.lock, NULL);
  p->to_client.fd = STDOUT_FILENO;
  if (!p->tools || pipe2(sig, O_CLOEXEC | O_NONBLOCK) != 0 ||
      mcp_signals_install(sig[1]) != 0) {
    cli_error("mcp", "cannot set up: %s", strerror(errno));
    idem_store_close(p->store);
    return EXIT_FAIL;
  }
  p->event_fd = sig[1];
  if (mcp_child_start(o->cmd, &to_child, &from_child, &p->child) != 0) {
    int e = errno;
    cli_error("mcp", "cannot start %s: %s", o->cmd[0], strerror(e));
    idem_store_close(p->store);
    return e == ENOENT ? 127 : 126;
  }
  p->to_server.fd = to_child;
  p->from_server = from_child;
  if (pthread_create(&t, NULL, mcp_server_reader, p) != 0 ||
      pthread_detach(t) != 0 ||
      pthread_create(&t, NULL, mcp_client_reader, p) != 0 ||
      pthread_detach(t) != 0) {
    cli_error("mcp", "cannot start a thread: %s", strerror(errno));
    kill(-p->child, SIGTERM);
    _exit(EXIT_FAIL);
  }
  st = wait_server(p, sig[0]);
  status = WIFEXITED(st)     ? WEXITSTATUS(st)
           : WIFSIGNALED(st) ? 128 + WTERMSIG(st)
                             : EXIT_FAIL;
  /* The server's output ends with it, unless a process it left behind
   * still holds it: then the calls waiting for an answer are told now. */
  double until = cli_now_ms() + 2000;
  pthread_mutex_lock(&p->lock);
  while (!p->server_gone && cli_now_ms() < until) {
    pthread_mutex_unlock(&p->lock);
    usleep(10000);
    pthread_mutex_lock(&p->lock);
  }
  p->server_gone = 1;
  p->closing = 1;
  for (mcp_pending *q = p->pending; q; q = q->next)
    if (q->state == PENDING_WAITING) {
      uint64_t one = 1;
      q->state = PENDING_GONE;
      if (write(q->wake_fd, &one, sizeof one) < 0) {
        /* The call sees the state on its next wake-up. */
      }
    }
  while (p->nkeyed > 0)
    pthread_cond_wait(&p->cond, &p->lock);
  pthread_mutex_unlock(&p->lock);
  close_server_input(p);
  idem_store_close(p->store);
  p->store = NULL;
  return status;
}

const cli_command cmd_mcp = {
    "mcp", run, "make MCP tools/call retries safe (stdio proxy)", usage};
