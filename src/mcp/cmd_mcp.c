/*
 * cmd_mcp.c -- `idem mcp`: an MCP stdio proxy that makes tools/call
 * retries safe.
 *
 * This file reads the options, opens the store, starts the server and the
 * two reader threads (mcp_relay.c), and then waits in the main thread for
 * the server to end: it passes signals on to the server, and once the
 * client has closed its input it lets the keyed calls in flight run to
 * their end and be recorded (--drain-wait), then closes the server's
 * input, waits, and stops the server if it does not end by itself. The
 * proxy exits with the server's status once every keyed call in progress
 * has been settled.
 */
#include "mcp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: idem mcp [--store URL] [--tenant T] [--require-key]\n"
    "                [--key-argument NAME] [--offer-key-argument NAME]\n"
    "                [--implicit-keys WINDOW] [--lease DUR] [--retention DUR]\n"
    "                [--keyed-cancel hold|pass] [--cancel-wait DUR]\n"
    "                [--on-unknown forward|fail] [--attach-wait DUR]\n"
    "                [--store-tool-errors yes|no] [--input-wait DUR]\n"
    "                [--max-result SIZE] [--keep-requests]\n"
    "                [--seal-key FILE]...\n"
    "                [--drain-wait DUR] [--shutdown-wait DUR]\n"
    "                [--] SERVER_CMD [ARG...]\n"
    "       idem mcp --listen HOST:PORT --upstream URL [--principal RULE]\n"
    "                [--jwks FILE|URL --issuer ISS --audience AUD]\n"
    "                [--replay-check upstream|none] [--replay-check-ttl DUR]\n"
    "                [--max-body SIZE] [--call-timeout DUR]\n"
    "                [--allow-origin ORIGIN]\n"
    "                [the options above]\n"
    "\n"
    "Runs the MCP server SERVER_CMD and relays newline-delimited JSON-RPC\n"
    "between it and the MCP client on standard input and output, unchanged,\n"
    "except for tools/call requests that carry an idempotency key. Such a\n"
    "call is run at most once per key: the first is sent to the server and\n"
    "its result stored; a retry with the same key gets the stored result\n"
    "(with _meta[\"idem/replayed\"] = true) and nothing reaches the server.\n"
    "A retry sent while the call is still running waits for its result. A\n"
    "client that cancels a keyed call (or times out) does not stop it: the\n"
    "server's answer is still recorded for the retry. The key is read from\n"
    "params._meta.idempotencyKey, else params.idempotencyKey, else (with\n"
    "--key-argument) a tool argument; it is forwarded as the client sent\n"
    "it. The operation is the tool name; the fingerprint is the canonical\n"
    "JSON of {name, arguments} without the key. The server's initialize\n"
    "result gets capabilities.experimental[\"idem/idempotency\"].\n"
    "SERVER_CMD starts at the first argument that is not an option; `--`\n"
    "before it is optional.\n"
    "\n"
    "With --listen, the proxy serves MCP's Streamable HTTP transport on\n"
    "HOST:PORT in front of the remote MCP endpoint URL (http or https):\n"
    "POST, the GET stream and DELETE pass through, streamed as they come,\n"
    "with Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID and\n"
    "Authorization; other paths of the upstream's origin (OAuth metadata)\n"
    "pass through too. Keyed tools/call requests are handled as above, one\n"
    "effect per (tenant, tool, key) across sessions, clients and proxies on\n"
    "one store; a replay is answered as application/json under the retry's\n"
    "id. The tenant is the caller's principal (--principal).\n"
    "\n"
    "  --listen HOST:PORT   where to serve (port 0: any free port; the\n"
    "                       address is printed on standard error); PORT\n"
    "                       or :PORT alone is the loopback, 127.0.0.1\n"
    "  --allow-origin O     a browser page of origin O may call the proxy\n"
    "                       (repeatable); requests with another Origin\n"
    "                       header are refused 403, except the listener's\n"
    "                       own loopback origin. On a loopback listener a\n"
    "                       Host other than localhost, 127.0.0.1 or [::1]\n"
    "                       is refused too (DNS rebinding)\n"
    "  --upstream URL       the remote server's MCP endpoint\n"
    "  --principal RULE     whose a keyed call is (its tenant); a keyed\n"
    "                       call that names none is HTTP 401:\n"
    "                         credential:NAME[,NAME...]  a hash of these\n"
    "                           headers (cookie:NAME: one cookie); the\n"
    "                           default is credential:authorization\n"
    "                         header:NAME  the value a trusted front proxy\n"
    "                           sets (--tenant-header NAME)\n"
    "                         jwt  the verified token's issuer and subject\n"
    "                           (needs --jwks, --issuer, --audience)\n"
    "                         none  one tenant, --tenant\n"
    "  --jwks FILE|URL      the issuer's public keys (JWKS)\n"
    "  --issuer ISS         the iss a token must have\n"
    "  --audience AUD       the aud a token must name\n"
    "  --replay-check upstream  (the default under credential: and jwt)\n"
    "                       before a keyed call is claimed or replayed, a\n"
    "                       ping in the caller's session with its headers:\n"
    "                       the server's 4xx (401, 403, 404) is passed on and\n"
    "                       nothing is replayed; none: no check\n"
    "  --replay-check-ttl DUR  how long a passed check counts for one\n"
    "                       credential and session (default 5s; 0: each)\n"
    "  --max-body SIZE      the largest request body (default 4M)\n"
    "  --call-timeout DUR   the longest a keyed call waits for the\n"
    "                       server's answer (default: no limit, as a\n"
    "                       slow tool may answer only at its end); then\n"
    "                       the proxy stops waiting, holds the key for\n"
    "                       one lease (the tool may have acted, or still\n"
    "                       act) and answers -31903. A keyed call whose\n"
    "                       lease this proxy lost (the store could not\n"
    "                       renew it in time) is ended the same way.\n"
    "\n"
    "  --store URL          default: IDEM_STORE, else ./idem.db\n"
    "  --tenant T           scope of the keys (default \"\")\n"
    "  --require-key        refuse a tools/call without a key unless\n"
    "                       tools/list annotated the tool readOnlyHint or\n"
    "                       idempotentHint\n"
    "  --key-argument NAME  also take the key from the tool argument NAME\n"
    "                       (it stays in the arguments sent to the server)\n"
    "  --offer-key-argument NAME\n"
    "                       add an optional string argument NAME to every\n"
    "                       tool tools/list does not mark readOnlyHint,\n"
    "                       telling the model to pass one new value per\n"
    "                       action and the same on its retries; a call's\n"
    "                       NAME is its key, removed from the arguments\n"
    "                       (kept when the tool's own schema declares it)\n"
    "  --implicit-keys WINDOW\n"
    "                       key a tools/call that has no key by its tool\n"
    "                       and canonical arguments, unless tools/list\n"
    "                       annotated the tool readOnlyHint or\n"
    "                       idempotentHint: the same call sent again within\n"
    "                       WINDOW after it ended (a client re-sending it\n"
    "                       under a new id) gets its result, marked\n"
    "                       _meta[\"idem/implicit\"], with a note telling\n"
    "                       the model how to ask for a new action\n"
    "  --keyed-cancel hold|pass\n"
    "                       hold (default): a client's cancellation of a\n"
    "                       keyed call is not passed on; the call runs to\n"
    "                       its end and its result is recorded. pass: for\n"
    "                       servers whose tools stop cleanly on cancel: it\n"
    "                       goes on to the server; an error answer within\n"
    "                       --cancel-wait (default 10s) releases the key, a\n"
    "                       result is recorded, silence marks it unknown\n"
    "  --lease DUR          how long a call holds its key without renewal\n"
    "                       (default 30s; renewed while the server works),\n"
    "                       and how long a key whose call ended without a\n"
    "                       result is held before a retry may act again\n"
    "  --retention DUR      how long results are kept (default 24h)\n"
    "  --seal-key FILE      seal stored results with AES-256-GCM under the\n"
    "                       32-byte key in FILE (raw, hex or base64; mode\n"
    "                       600); repeat for keys rotated out: the first\n"
    "                       seals, all open\n"
    "  --keep-requests      keep each call's arguments (canonical JSON) in\n"
    "                       its record, for operators (idem keys show);\n"
    "                       default: only their SHA-256 fingerprint\n"
    "  --attach-wait DUR    how long a retry of a call still running waits\n"
    "                       for its result (default 25s, below the SDKs'\n"
    "                       60s request timeout; 0: answer in_flight at once)\n"
    "  --on-unknown forward (default) a call left unanswered by a server\n"
    "                       that exited (or by a proxy that died) is sent\n"
    "                       again with the same key by a retry once its\n"
    "                       lease has ended; its result is marked\n"
    "                       _meta[\"idem/recovered\"]\n"
    "  --on-unknown fail    such a key is refused until an operator settles\n"
    "                       it with `idem keys resolve`\n"
    "  --input-wait DUR     a keyed call whose tool asked for input\n"
    "                       (resultType input_required) keeps its key for\n"
    "                       the client's next round this long (default\n"
    "                       10m); then the key is freed: the tool has not\n"
    "                       acted\n"
    "  --store-tool-errors yes  (default) a result with isError: true is\n"
    "                       stored and replayed like any result: the tool\n"
    "                       may have acted before it failed\n"
    "  --store-tool-errors no   such a result is passed on and the key\n"
    "                       freed: a retry acts again\n"
    "  --max-result SIZE    the largest result stored (default 16M less\n"
    "                       4k, also the most); a larger one is passed on,\n"
    "                       not stored, and its key marked unknown\n"
    "  --drain-wait DUR     once the client closes its input, how long keyed\n"
    "                       calls still running may take to end and be\n"
    "                       recorded before the server's input is closed\n"
    "                       (default 10m; 0: closed at once). Their results\n"
    "                       are replayed to a retry through a new proxy on\n"
    "                       the store; unkeyed calls do not extend it\n"
    "  --shutdown-wait DUR  once the server's input is closed, how long the\n"
    "                       server may take to exit before SIGTERM, and\n"
    "                       then before SIGKILL (default 5s)\n"
    "DUR is 250ms, 30s, 5m, 24h or 7d. SIZE is bytes, or with k or M.\n"
    "\n"
    "JSON-RPC errors the proxy answers with (error.data.idem names them):\n"
    "  -31901 conflict       the key was used with other arguments\n"
    "  -31902 in_flight      the same call is still running (retryAfterMs)\n"
    "  -31903 unknown        an earlier attempt ended without a result\n"
    "                        (retryAfterMs with --on-unknown forward)\n"
    "  -31904 store_unavailable  nothing was sent; retry in a few seconds\n"
    "  -31905 key_required   --require-key: this tool needs a key\n"
    "  -31906 bad_key        the key is not 1-255 printable ASCII bytes\n"
    "  -31907 server_exited  the server is gone; nothing was sent\n"
    "  -31908 internal       the proxy failed; nothing was sent\n"
    "  -31909 batch          a keyed tools/call must not be in a batch\n"
    "See docs/mcp.md.\n"
    "\n"
    "Signals SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are\n"
    "passed on to the server. Exit status: the server's (128+N when signal\n"
    "N ended it); 2 usage; 1 the store cannot be opened; 126 or 127 the\n"
    "server cannot be started.\n";

static int parse(int argc, char **argv, mcp_opts *o) {
  memset(o, 0, sizeof *o);
  o->tenant = "";
  o->replay_check = -1;
  o->replay_check_ttl_ms = 5000;
  o->lease_ms = 30000;
  o->shutdown_wait_ms = 5000;
  o->drain_wait_ms = 600000;
  o->attach_wait_ms = 25000;
  o->input_wait_ms = 600000;
  o->cancel_wait_ms = 10000;
  o->store_tool_errors = 1;
  o->max_result = IDEM_MAX_RESPONSE - 4096;
  o->max_body = 4 * 1024 * 1024;
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
    if (a[0] != '-') {
      /* The server's command line: launchers such as the MCP Inspector
       * drop the first `--` of the arguments they are given. */
      o->cmd = argv + i;
      return 0;
    }
    if (strcmp(a, "--require-key") == 0) {
      o->require_key = 1;
      continue;
    }
    if (strcmp(a, "--keep-requests") == 0) {
      o->keep_requests = 1;
      continue;
    }
    if (i + 1 >= argc) {
      cli_error("mcp", "%s: needs a value", a);
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
    } else if (strcmp(a, "--offer-key-argument") == 0) {
      if (!*v || strlen(v) > 64) {
        cli_error("mcp", "--offer-key-argument: the argument name must be "
                         "1-64 bytes");
        return -1;
      }
      o->offer_key_argument = v;
    } else if (strcmp(a, "--implicit-keys") == 0) {
      if (cli_duration_option("mcp", a, v, 1, IDEM_MAX_RETENTION_MS,
                              &o->implicit_ms) != 0)
        return -1;
    } else if (strcmp(a, "--keyed-cancel") == 0) {
      if (strcmp(v, "pass") == 0)
        o->cancel_pass = 1;
      else if (strcmp(v, "hold") != 0) {
        cli_error("mcp", "--keyed-cancel: hold or pass, not '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--cancel-wait") == 0) {
      if (cli_duration_option("mcp", a, v, 1, IDEM_MAX_LEASE_MS,
                              &o->cancel_wait_ms) != 0)
        return -1;
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
    } else if (strcmp(a, "--drain-wait") == 0) {
      if (cli_duration_option("mcp", a, v, 0, 7 * 86400000LL,
                              &o->drain_wait_ms) != 0)
        return -1;
    } else if (strcmp(a, "--attach-wait") == 0) {
      if (cli_duration_option("mcp", a, v, 0, IDEM_MAX_LEASE_MS,
                              &o->attach_wait_ms) != 0)
        return -1;
    } else if (strcmp(a, "--input-wait") == 0) {
      if (cli_duration_option("mcp", a, v, 1, IDEM_MAX_LEASE_MS,
                              &o->input_wait_ms) != 0)
        return -1;
    } else if (strcmp(a, "--call-timeout") == 0) {
      if (cli_duration_option("mcp", a, v, 1, 7 * 86400000LL,
                              &o->call_timeout_ms) != 0)
        return -1;
    } else if (strcmp(a, "--store-tool-errors") == 0) {
      if (strcmp(v, "yes") == 0)
        o->store_tool_errors = 1;
      else if (strcmp(v, "no") == 0)
        o->store_tool_errors = 0;
      else {
        cli_error("mcp", "--store-tool-errors: yes or no, not '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--on-unknown") == 0) {
      if (strcmp(v, "fail") == 0)
        o->on_unknown_fail = 1;
      else if (strcmp(v, "forward") != 0) {
        cli_error("mcp", "--on-unknown: forward or fail, not '%s'", v);
        return -1;
      }
    } else if (strcmp(a, "--listen") == 0) {
      /* PORT and :PORT mean the loopback, as the MCP transport asks of a
       * local server; every interface only when named (0.0.0.0, [::]). */
      if (v[0] && strspn(v, "0123456789") == strlen(v) && strlen(v) < 8) {
        snprintf(o->listen_buf, sizeof o->listen_buf, "127.0.0.1:%s", v);
        v = o->listen_buf;
      } else if (v[0] == ':' && strlen(v) < 9) {
        snprintf(o->listen_buf, sizeof o->listen_buf, "127.0.0.1%s", v);
        v = o->listen_buf;
      }
      o->listen = v;
    } else if (strcmp(a, "--allow-origin") == 0) {
      const char **all =
          realloc(o->allow_origins,
                  (size_t)(o->n_allow_origins + 1) * sizeof *all);
      if (!all || !*v || strchr(v, ',')) {
        cli_error("mcp", "--allow-origin: one origin, such as "
                         "https://app.example (repeat the option for more)");
        return -1;
      }
      all[o->n_allow_origins++] = v;
      o->allow_origins = all;
    } else if (strcmp(a, "--upstream") == 0) {
      o->upstream = v;
    } else if (strcmp(a, "--tenant-header") == 0) {
      /* The older spelling of --principal header:H. */
      snprintf(o->principal_buf, sizeof o->principal_buf, "header:%s", v);
      o->principal_spec = o->principal_buf;
    } else if (strcmp(a, "--principal") == 0) {
      o->principal_spec = v;
    } else if (strcmp(a, "--seal-key") == 0) {
      if (o->n_seal_keys == 16) {
        cli_error("mcp", "--seal-key: at most 16 keys");
        return -1;
      }
      o->seal_keys[o->n_seal_keys++] = (char *)v;
    } else if (strcmp(a, "--jwks") == 0) {
      o->jwks = v;
    } else if (strcmp(a, "--issuer") == 0) {
      o->issuer = v;
    } else if (strcmp(a, "--audience") == 0) {
      o->audience = v;
    } else if (strcmp(a, "--replay-check") == 0) {
      if (strcmp(v, "upstream") != 0 && strcmp(v, "none") != 0) {
        cli_error("mcp", "--replay-check: upstream or none");
        return -1;
      }
      o->replay_check = strcmp(v, "upstream") == 0;
    } else if (strcmp(a, "--replay-check-ttl") == 0) {
      if (cli_duration_option("mcp", a, v, 0, 3600 * 1000,
                              &o->replay_check_ttl_ms) != 0)
        return -1;
    } else if (strcmp(a, "--max-body") == 0) {
      if (cli_parse_size(v, IDEM_MAX_RESPONSE, &o->max_body) != 0 ||
          o->max_body == 0) {
        cli_error("mcp",
                  "--max-body: bytes (k and M suffixes), 1 to 16M, "
                  "not '%s'",
                  v);
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
  if (o->listen && o->upstream)
    return 0;
  if (o->listen || o->upstream) {
    cli_error("mcp", "--listen and --upstream go together");
    return -1;
  }
  cli_error("mcp", "missing SERVER_CMD (or --listen and --upstream)");
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

/*
 * Waits for the server to exit, passing signals on; returns its wait
 * status. Once the client's input has ended, the keyed calls in flight
 * (claimed, at the server, or being recorded) are drained first: the
 * server keeps its input, and so runs, until each has ended and been
 * recorded, or --drain-wait has run out. Only then is its input closed and
 * --shutdown-wait applied. A signal is passed on at any stage, as before.
 */
static int wait_server(mcp_proxy *p, int sig_fd) {
  int stage = 0, st = 0, draining = 0;
  double deadline = 0, drain_until = 0;
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
    if (eof && stage == 0 && !draining && p->o->drain_wait_ms > 0) {
      int left = mcp_keyed_drain(p);
      draining = 1;
      drain_until = now + (double)p->o->drain_wait_ms;
      if (left > 0) {
        cli_error("mcp",
                  "the client closed its input; the server runs on until "
                  "the %d keyed call%s in flight %s ended and been recorded "
                  "(--drain-wait %.1fs); the process the client started "
                  "exits now",
                  left, left == 1 ? "" : "s", left == 1 ? "has" : "have",
                  (double)p->o->drain_wait_ms / 1000);
        /* The client would signal it two seconds on (the SDKs' close()),
         * and the server with it. */
        mcp_detach(p->detach_fd);
        p->detach_fd = -1;
      }
    }
    if (eof && stage == 0) {
      int left = draining ? mcp_keyed_left(p) : 0;
      if (left > 0 && now >= drain_until)
        cli_error("mcp",
                  "%d keyed call%s still running %.1fs after the client "
                  "closed its input (--drain-wait); closing the server's "
                  "input",
                  left, left == 1 ? " is" : "s are",
                  (double)p->o->drain_wait_ms / 1000);
      if (left == 0 || now >= drain_until) {
        close_server_input(p);
        stage = 1;
        deadline = now + (double)p->o->shutdown_wait_ms;
      }
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
    int64_t tick = mcp_keyed_tick(p);
    if (stage == 1 || stage == 2)
      timeout = deadline - now < 1 ? 1 : (int)(deadline - now) + 1;
    else if (stage == 0 && draining)
      /* Woken as each call is settled (call_answered()); the drain's end
       * at the latest. */
      timeout = drain_until - now > 1000000 ? 1000000
                : drain_until - now < 1     ? 1
                                            : (int)(drain_until - now) + 1;
    if (tick >= 0 && (timeout < 0 || tick + 1 < timeout))
      timeout = tick > 1000000 ? 1000000 : (int)tick + 1;
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
    free(o->allow_origins);
    free(o);
    return EXIT_OK;
  }
  if (rc == 0 && o->call_timeout_ms && !o->listen) {
    /* A stdio server answers on the one pipe all calls share: a late
     * answer cannot be told apart from being given up on. */
    cli_error("mcp", "--call-timeout goes with --listen");
    rc = -1;
  }
  if (rc == 0 && !o->listen &&
      (o->principal_spec || o->jwks || o->issuer || o->audience ||
       o->replay_check >= 0)) {
    /* Over stdio the client is the one process that started the proxy:
     * its tenant is --tenant. */
    cli_error("mcp", "--principal, --tenant-header, --jwks, --issuer, "
                     "--audience and --replay-check go with --listen");
    rc = -1;
  }
  if (rc != 0) {
    fputs("(see `idem mcp --help`)\n", stderr);
    free(o->allow_origins);
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
  /* Over stdio with a drain, the process the client started only waits,
   * so that it can exit while keyed calls drain (mcp_detachable()). Forked
   * before any thread, or store, exists. */
  p->detach_fd = -1;
  if (!o->listen && o->drain_wait_ms > 0 &&
      mcp_detachable(&p->detach_fd) != 0) {
    cli_error("mcp", "cannot fork: %s", strerror(errno));
    return EXIT_FAIL;
  }
  rc = idem_store_open(cli_store_url(o->store), NULL, &p->store);
  if (rc != IDEM_OK) {
    cli_idem_error("mcp", "open store", rc);
    free(o);
    return EXIT_FAIL;
  }
  {
    char err[600];
    if (cli_seal_apply(p->store, o->seal_keys, o->n_seal_keys, err,
                       sizeof err) != 0) {
      cli_error("mcp", "--seal-key: %s", err);
      idem_store_close(p->store);
      free(o);
      return EXIT_USAGE;
    }
  }
  if (o->listen) {
    if (o->cmd) {
      cli_error("mcp", "--listen serves a remote server (--upstream URL); "
                       "a SERVER_CMD cannot be given with it");
      idem_store_close(p->store);
      return EXIT_USAGE;
    }
    return mcp_http_run(o, p->store);
  }
  p->o = o;
  p->tools = json_object();
  p->tasks = json_object();
  pthread_mutex_init(&p->lock, NULL);
  cli_cond_init_mono(&p->cond); /* the drain's waits */
  pthread_mutex_init(&p->to_server.lock, NULL);
  pthread_mutex_init(&p->to_client.lock, NULL);
  p->to_client.fd = STDOUT_FILENO;
  if (!p->tools || !p->tasks || pipe2(sig, O_CLOEXEC | O_NONBLOCK) != 0 ||
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
  if (mcp_keyed_start(p) != 0 ||
      pthread_create(&t, NULL, mcp_server_reader, p) != 0 ||
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
  pthread_mutex_unlock(&p->lock);
  mcp_keyed_server_gone(p);
  pthread_mutex_lock(&p->lock);
  p->closing = 1;
  while (p->ncalls > 0) {
    pthread_mutex_unlock(&p->lock);
    mcp_keyed_tick(p);
    pthread_mutex_lock(&p->lock);
    struct timespec until_ts = cli_mono_deadline(50);
    pthread_cond_timedwait(&p->cond, &p->lock, &until_ts);
  }
  pthread_mutex_unlock(&p->lock);
  close_server_input(p);
  idem_store_close(p->store);
  p->store = NULL;
  return status;
}

const cli_command cmd_mcp = {
    "mcp", run, "make MCP tools/call retries safe (stdio proxy)", usage};
