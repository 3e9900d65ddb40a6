/*
 * cmd_serve.c -- `idem serve`: the HTTP gateway's command line, start-up,
 * signals and shutdown. The request path is gateway.c's; the upstream side
 * upstream.c's; the admin listener admin.c's.
 */
#include "cli.h"
#include "principal.h"
#include "serve.h"

#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_PASS_FLOOR ((size_t)64 * 1024 * 1024)

/* Store workers (pool.c) by default. Each waits for its store call, so
 * they are what lets the store's group commit gather a batch: with 32
 * clients on fresh keys, 4 or 8 workers reach 0.42x of the store's floor,
 * 16 reach 0.53-0.60x (bench/gateway.sh), as the thread per request did
 * before them. */
#define STORE_WORKERS 1

static const char usage[] =
    "usage: idem serve --listen HOST:PORT --upstream URL [--store URL]\n"
    "                  [--create-store]\n"
    "                  [--principal RULE] [--jwks FILE|URL --issuer ISS\n"
    "                  --audience AUD] [--replay-check-url PATH]\n"
    "                  [--replay-check-ttl DUR] [--seal-key FILE]...\n"
    "                  [--require-key]\n"
    "                  [--methods LIST] [--lease DUR] [--retention DUR]\n"
    "                  [--attach-wait DUR]\n"
    "                  [--no-store-5xx] [--on-unknown forward|fail]\n"
    "                  [--keep-requests]\n"
    "                  [--max-body SIZE] [--max-response SIZE]\n"
    "                  [--upstream-timeout DUR] [--upstream-cacert FILE]\n"
    "                  [--admin-listen HOST:PORT] [--admin-token-file FILE]\n"
    "                  [--console-token-file FILE] [--console-audit-log FILE]\n"
    "                  [--log FILE] [--threads N] [--store-workers N]\n"
    "                  [--header-timeout DUR] [--max-connections N]\n"
    "                  [--max-connections-per-client N]\n"
    "\n"
    "An HTTP reverse proxy that gives the upstream Idempotency-Key semantics\n"
    "(draft-ietf-httpapi-idempotency-key-header): a request retried with the\n"
    "same key reaches the upstream once, and every retry gets the first\n"
    "answer again. Clients change nothing but sending the header.\n"
    "\n"
    "Options:\n"
    "  --listen HOST:PORT     where clients connect: 127.0.0.1:8080,\n"
    "                         [::1]:8080, or :8080 for every address (IPv6\n"
    "                         and IPv4); port 0 picks a free port. The\n"
    "                         address bound is printed on standard error.\n"
    "  --upstream URL         http:// or https:// base URL of the tool API;\n"
    "                         the request's path and query are appended\n"
    "  --store URL            the idempotency store: sqlite:PATH, a PATH, or\n"
    "                         postgresql://... (several gateways share one\n"
    "                         PostgreSQL store and act as one); default\n"
    "                         IDEM_STORE, else ./idem.db\n"
    "  --create-store         make a new, empty SQLite store even where one\n"
    "                         is missing that a marker beside it says existed\n"
    "                         (.NAME.idem-serve; without this option the\n"
    "                         start is refused, since every key the old store\n"
    "                         held would act again)\n"
    "  --principal RULE       whose a keyed request is (its tenant); a keyed\n"
    "                         request that names none is 401:\n"
    "                           credential:NAME[,NAME...]  a hash of these\n"
    "                             headers (cookie:NAME: one cookie); the\n"
    "                             default is credential:authorization\n"
    "                           header:NAME  the value a trusted front\n"
    "                             proxy sets (--tenant-header NAME)\n"
    "                           jwt  the verified token's issuer and\n"
    "                             subject (a refreshed token is the same\n"
    "                             principal): needs --jwks, --issuer and\n"
    "                             --audience\n"
    "                           none  one tenant for every caller\n"
    "  --jwks FILE|URL        the issuer's public keys (a JWKS; a URL is\n"
    "                         fetched again every 5 minutes and when a\n"
    "                         token names a key it lacks)\n"
    "  --issuer ISS           the iss a token must have\n"
    "  --audience AUD         the aud a token must name\n"
    "  --replay-check-url PATH  before a keyed request is claimed (so\n"
    "                         before any replay), GET PATH on the upstream\n"
    "                         with the caller's headers: 2xx goes on, 401\n"
    "                         and 403 are passed on, anything else is 502\n"
    "  --replay-check-ttl DUR how long a 2xx counts for one credential\n"
    "                         (default 5s; 0: every request)\n"
    "  --seal-key FILE        seal stored answers with AES-256-GCM under the\n"
    "                         32-byte key in FILE (raw, hex or base64; mode\n"
    "                         600); repeat for keys rotated out: the first\n"
    "                         seals, all open\n"
    "  --require-key          refuse protected requests without a key (400)\n"
    "                         instead of passing them through unprotected\n"
    "  --methods LIST         methods protected by keys (default POST,PATCH);\n"
    "                         others always pass through\n"
    "  --lease DUR            how long a forward holds its key before a retry\n"
    "                         may take it over (default 30s); renewed while\n"
    "                         the upstream works\n"
    "  --attach-wait DUR      how long a retry that finds its key in flight\n"
    "                         waits for the first request's answer, which\n"
    "                         it then gets as a replay (default 25s; 0:\n"
    "                         answer 409 at once)\n"
    "  --retention DUR        how long a stored response is replayed\n"
    "                         (default 24h)\n"
    "  --no-store-5xx         release the key after a 5xx answer, so that a\n"
    "                         retry is forwarded again (default: 5xx answers\n"
    "                         are stored and replayed: the upstream may have\n"
    "                         acted before failing)\n"
    "  --on-unknown MODE      after a forward whose outcome is unknown (sent,\n"
    "                         no answer) and its lease: forward (default) a\n"
    "                         retry again with the same key, or fail: answer\n"
    "                         409 until an operator runs `idem keys resolve`\n"
    "  --keep-requests        keep each request (method, target and body, in\n"
    "                         canonical form) in its record, for operators\n"
    "                         (idem keys show) and for a 422 that names what\n"
    "                         differed; default: only its SHA-256\n"
    "                         fingerprint is stored\n"
    "  --max-body SIZE        largest request body (default 1M; k, M, G)\n"
    "  --max-response SIZE    largest response stored (default 1M, at most\n"
    "                         16M); a larger one is passed on, not stored,\n"
    "                         and its key marked unknown\n"
    "  --upstream-timeout DUR how long to wait for the upstream's whole\n"
    "                         answer (default 30s); also bounds the drain\n"
    "                         at shutdown\n"
    "  --upstream-cacert FILE CA certificates for an https:// upstream\n"
    "                         (default: the system's)\n"
    "  --admin-listen H:P     serve /healthz, /readyz and /metrics there; an\n"
    "                         address beyond the loopback needs\n"
    "                         --admin-token-file\n"
    "  --admin-token-file F   the admin listener answers only requests with\n"
    "                         \"Authorization: Bearer TOKEN\", TOKEN the\n"
    "                         file's first line (at least 16 characters)\n"
    "  --console-token-file F serve the operator console (idem console) at\n"
    "                         the admin listener's / and /api/, with its own\n"
    "                         token (not --admin-token-file's: the console\n"
    "                         resolves and deletes records)\n"
    "  --console-audit-log F  append the console's logins and actions to F\n"
    "                         (default: standard error)\n"
    "  --log FILE             append one JSON line per request to FILE (-:\n"
    "                         standard output); SIGHUP reopens it\n"
    "  --threads N            HTTP threads (default 2 per core); a request\n"
    "                         waiting for the store or the upstream holds\n"
    "                         none\n"
    "  --store-workers N      threads that answer requests without a key\n"
    "                         and write their log lines (default 1); the\n"
    "                         claims and records are queued on the store\n"
    "  --header-timeout DUR   close a connection whose request head is not\n"
    "                         whole this long after it opened, or after the\n"
    "                         first byte of its next request (default 10s);\n"
    "                         an idle keep-alive connection closes after 75s\n"
    "  --max-connections N    client connections at once (default: half the\n"
    "                         descriptor limit, less a reserve, at most\n"
    "                         16384); more wait in the listen queue\n"
    "  --max-connections-per-client N\n"
    "                         connections at once from one client address\n"
    "                         (default: nine tenths of --max-connections,\n"
    "                         at least 100; 0: no limit); one more is\n"
    "                         closed at once, unanswered\n"
    "\n"
    "Requests with a protected method and an Idempotency-Key header (a token,\n"
    "or a quoted string: \"...\"; 1-255 printable ASCII characters) are\n"
    "claimed in the store under (tenant, METHOD PATH, key). The request's\n"
    "fingerprint is its method, path, query and body: the RFC 8785 canonical\n"
    "form of a JSON body (Content-Type application/json or +json), the bytes\n"
    "of any other. The key is forwarded upstream unchanged.\n"
    "\n"
    "Status codes of the gateway's own (application/problem+json, RFC 9457):\n"
    "  400  missing key with --require-key, malformed key, a principal's\n"
    "       header sent twice, a request target that is not a path\n"
    "  401  a keyed request that names no principal, or whose token does\n"
    "       not verify; nothing claimed\n"
    "  409  the same key is still in flight after --attach-wait (Retry-After:\n"
    "       seconds left on its lease), or its earlier outcome is unknown\n"
    "       and --on-unknown fail\n"
    "  413  request body larger than --max-body; nothing claimed\n"
    "  422  the key was used with another request\n"
    "  502  upstream unreachable (nothing sent; the key is released), the\n"
    "       --replay-check-url check failed (nothing claimed), or the\n"
    "       connection was lost after sending (the key stays in progress)\n"
    "  503  the store is unavailable or busy (Retry-After); nothing forwarded\n"
    "  504  the upstream did not answer within --upstream-timeout; the key\n"
    "       stays in progress until its lease ends\n"
    "Headers the gateway adds:\n"
    "  Idempotent-Replayed: true   on a replayed answer\n"
    "  Idem-Record: ...            when an answer was passed on but not\n"
    "                              stored (too large, a released 5xx, a lost\n"
    "                              lease or a failed store)\n"
    "Replays carry the stored status, headers and body; Date is new and\n"
    "Set-Cookie is never stored. Hop-by-hop headers are never passed on.\n"
    "\n"
    "Signals: SIGTERM or SIGINT stop accepting, let requests in flight\n"
    "finish (bounded by --upstream-timeout) and exit 0; SIGHUP reopens the\n"
    "log. See docs/gateway.md.\n";

/* "POST,patch" -> ",POST,PATCH,". */
static int parse_methods(const char *v, char *out, size_t size) {
  size_t o = 0, tok = 0;
  if (!*v)
    return -1;
  out[o++] = ',';
  for (const char *p = v;; p++) {
    if (*p == ',' || !*p) {
      if (!tok)
        return -1;
      if (o + 1 >= size)
        return -1;
      out[o++] = ',';
      tok = 0;
      if (!*p)
        break;
      continue;
    }
    if (!isalpha((unsigned char)*p) || o + 2 >= size)
      return -1;
    out[o++] = (char)toupper((unsigned char)*p);
    tok++;
  }
  out[o] = 0;
  return 0;
}

static int parse(int argc, char **argv, serve_config *c) {
  long n;
  memset(c, 0, sizeof *c);
  strcpy(c->methods, ",POST,PATCH,");
  {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cores < 1 ? 2 : cores > 64 ? 128 : (int)(2 * cores);
  }
  c->store_workers = STORE_WORKERS;
  c->max_body = 1024 * 1024;
  c->max_response = 1024 * 1024;
  c->lease_ms = 30000;
  c->retention_ms = 24LL * 3600 * 1000;
  c->upstream_timeout_ms = 30000;
  c->attach_wait_ms = 25000;
  c->header_timeout_ms = 10000;
  c->replay_check_ttl_ms = 5000;
  c->max_connections_per_client = -1; /* derived, see guard.c */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
      return 1;
    if (strcmp(a, "--require-key") == 0) {
      c->require_key = 1;
      continue;
    }
    if (strcmp(a, "--keep-requests") == 0) {
      c->keep_requests = 1;
      continue;
    }
    if (strcmp(a, "--no-store-5xx") == 0) {
      c->no_store_5xx = 1;
      continue;
    }
    if (strcmp(a, "--create-store") == 0) { /* part 9: see store.c */
      c->create_store = 1;
      continue;
    }
    if (i + 1 >= argc) {
      cli_error("serve", "%s: %s", a,
                strncmp(a, "--", 2) == 0 ? "needs a value" : "unknown argument");
      return -1;
    }
    v = argv[++i];
    if (strcmp(a, "--listen") == 0) {
      c->listen = v;
    } else if (strcmp(a, "--upstream") == 0) {
      c->upstream = v;
    } else if (strcmp(a, "--store") == 0) {
      if (cli_store_option("serve", v, &c->store_url) != 0)
        return -1;
    } else if (strcmp(a, "--tenant-header") == 0) {
      /* The older spelling of --principal header:NAME. */
      snprintf(c->principal_buf, sizeof c->principal_buf, "header:%s", v);
      c->principal_spec = c->principal_buf;
    } else if (strcmp(a, "--principal") == 0) {
      c->principal_spec = v;
    } else if (strcmp(a, "--seal-key") == 0) {
      if (c->n_seal_keys == 16) {
        cli_error("serve", "--seal-key: at most 16 keys");
        return -1;
      }
      c->seal_keys[c->n_seal_keys++] = (char *)v;
    } else if (strcmp(a, "--jwks") == 0) {
      c->jwks = v;
    } else if (strcmp(a, "--issuer") == 0) {
      c->issuer = v;
    } else if (strcmp(a, "--audience") == 0) {
      c->audience = v;
    } else if (strcmp(a, "--replay-check-url") == 0) {
      if (v[0] != '/' || strpbrk(v, " \t\r\n#")) {
        cli_error("serve", "--replay-check-url: a path on the upstream, "
                           "such as /v1/me");
        return -1;
      }
      c->replay_check_url = v;
    } else if (strcmp(a, "--replay-check-ttl") == 0) {
      if (cli_duration_option("serve", a, v, 0, 3600 * 1000,
                              &c->replay_check_ttl_ms) != 0)
        return -1;
    } else if (strcmp(a, "--methods") == 0) {
      if (parse_methods(v, c->methods, sizeof c->methods) != 0) {
        cli_error("serve", "--methods: a comma-separated list of methods, "
                           "such as POST,PATCH");
        return -1;
      }
    } else if (strcmp(a, "--lease") == 0) {
      if (cli_duration_option("serve", a, v, 100, IDEM_MAX_LEASE_MS,
                              &c->lease_ms) != 0)
        return -1;
    } else if (strcmp(a, "--attach-wait") == 0) {
      if (cli_duration_option("serve", a, v, 0, IDEM_MAX_LEASE_MS,
                              &c->attach_wait_ms) != 0)
        return -1;
    } else if (strcmp(a, "--retention") == 0) {
      if (cli_duration_option("serve", a, v, 1, IDEM_MAX_RETENTION_MS,
                              &c->retention_ms) != 0)
        return -1;
    } else if (strcmp(a, "--upstream-timeout") == 0) {
      if (cli_duration_option("serve", a, v, 10, 24LL * 3600 * 1000,
                              &c->upstream_timeout_ms) != 0)
        return -1;
    } else if (strcmp(a, "--on-unknown") == 0) {
      if (strcmp(v, "fail") == 0)
        c->on_unknown_fail = 1;
      else if (strcmp(v, "forward") != 0) {
        cli_error("serve", "--on-unknown: forward or fail");
        return -1;
      }
    } else if (strcmp(a, "--max-body") == 0) {
      if (cli_parse_size(v, (size_t)1 << 30, &c->max_body) != 0) {
        cli_error("serve", "--max-body: bytes (k, M and G suffixes), at "
                           "most 1G");
        return -1;
      }
    } else if (strcmp(a, "--max-response") == 0) {
      if (cli_parse_size(v, IDEM_MAX_RESPONSE, &c->max_response) != 0) {
        cli_error("serve", "--max-response: bytes (k and M suffixes), at "
                           "most 16M");
        return -1;
      }
    } else if (strcmp(a, "--upstream-cacert") == 0) {
      if (access(v, R_OK) != 0) {
        cli_error("serve", "--upstream-cacert: %s: %s", v, strerror(errno));
        return -1;
      }
      c->upstream_cacert = v;
    } else if (strcmp(a, "--admin-listen") == 0) {
      c->admin_listen = v;
    } else if (strcmp(a, "--admin-token-file") == 0) {
      c->admin_token_file = v;
    } else if (strcmp(a, "--console-token-file") == 0) {
      c->console_token_file = v;
    } else if (strcmp(a, "--console-audit-log") == 0) {
      c->console_audit_log = v;
    } else if (strcmp(a, "--log") == 0) {
      c->log_path = v;
    } else if (strcmp(a, "--threads") == 0) {
      if (cli_parse_uint(v, 1024, &n) != 0 || n < 1) {
        cli_error("serve", "--threads: a number from 1 to 1024");
        return -1;
      }
      c->threads = (int)n;
    } else if (strcmp(a, "--store-workers") == 0) {
      if (cli_parse_uint(v, 256, &n) != 0 || n < 1) {
        cli_error("serve", "--store-workers: a number from 1 to 256");
        return -1;
      }
      c->store_workers = (int)n;
    } else if (strcmp(a, "--header-timeout") == 0) {
      if (cli_duration_option("serve", a, v, 100, 3600 * 1000,
                              &c->header_timeout_ms) != 0)
        return -1;
    } else if (strcmp(a, "--max-connections") == 0) {
      if (cli_parse_uint(v, 1000000, &n) != 0 || n < 1) {
        cli_error("serve", "--max-connections: a number from 1 to 1000000");
        return -1;
      }
      c->max_connections = (unsigned)n;
    } else if (strcmp(a, "--max-connections-per-client") == 0) {
      if (cli_parse_uint(v, 1000000, &n) != 0) {
        cli_error("serve", "--max-connections-per-client: a number from 0 "
                           "(no limit) to 1000000");
        return -1;
      }
      c->max_connections_per_client = n;
    } else {
      cli_error("serve", "unknown option '%s'", a);
      return -1;
    }
  }
  if (!c->listen || !c->upstream) {
    cli_error("serve", "--listen and --upstream are required (see idem "
                       "serve --help)");
    return -1;
  }
  if (strncasecmp(c->upstream, "http://", 7) != 0 &&
      strncasecmp(c->upstream, "https://", 8) != 0) {
    cli_error("serve", "--upstream: '%s' is not an http:// or https:// URL",
              c->upstream);
    return -1;
  }
  if (strpbrk(c->upstream, "?#")) {
    cli_error("serve", "--upstream: a base URL without query or fragment");
    return -1;
  }
  c->max_pass =
      c->max_response > MAX_PASS_FLOOR ? c->max_response : MAX_PASS_FLOOR;
  return 0;
}

/* How long to wait for requests in flight at shutdown: the upstream's own
 * bound, and a little for the store. */
static void drain(struct MHD_Daemon *d, int64_t bound_ms) {
  struct timespec step = {0, 20 * 1000 * 1000};
  int64_t waited = 0;
  MHD_socket s = MHD_quiesce_daemon(d);
  if (s != MHD_INVALID_SOCKET)
    close(s);
  while (metrics_in_flight_now() > 0 && waited < bound_ms) {
    nanosleep(&step, NULL);
    waited += 20;
  }
  if (metrics_waiting_now() > 0) {
    /* Past the bound: the forwards still out end as timed out (their keys
     * stay in progress, as after any timeout), so that every suspended
     * connection is answered before the daemon goes. */
    upstream_abort();
    for (waited = 0; metrics_waiting_now() > 0 && waited < 10000;
         waited += 20)
      nanosleep(&step, NULL);
  }
}

/* Raises the soft limit on descriptors to the hard one, as servers do:
 * each forward holds two (the client's connection and the upstream's), and
 * the default soft limit (1024) would cap the gateway near 500 forwards. */
static void raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

/*
 * Fewer malloc arenas than glibc's default of 8 per core. The gateway's
 * allocations are made on one thread and freed on another (a request on
 * libmicrohttpd's, its forward on the upstream loop's, its claim on the
 * store's), and each arena kept its own free memory: with 8,000 forwards
 * in flight, one per core (at least 2) held the peak 3 to 5 MB lower
 * (docs/bench.md), for a burst about 5% longer. MALLOC_ARENA_MAX, when
 * set, is the operator's choice and is left alone.
 */
static void fewer_arenas(void) {
#ifdef M_ARENA_MAX
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (!getenv("MALLOC_ARENA_MAX"))
    mallopt(M_ARENA_MAX, cores > 2 ? (int)cores : 2);
#endif
}

static int run(int argc, char **argv) {
  serve_config c;
  idem_store *store = NULL;
  idem_store_options so;
  struct MHD_Daemon *gw = NULL, *admin = NULL;
  char *upstream = NULL, bound[128] = "", admin_bound[128] = "";
  char *admin_token = NULL, *console_token = NULL;
  char store_name[4200] = ""; /* part 9: the store, named at start */
  char why[600], rule_text[700];
  principal_rule rule = {0};
  sigset_t sigs;
  int rc, sig, settled, status = EXIT_FAIL;

  if ((rc = parse(argc, argv, &c)) != 0) {
    if (rc > 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    }
    return EXIT_USAGE;
  }
  /* Signals are taken by this thread alone, with sigwait(): every thread
   * started from here on inherits the mask. */
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (principal_parse(c.principal_spec, &rule, why, sizeof why) != 0) {
    cli_error("serve", "--principal: %s", why);
    return EXIT_USAGE;
  }
  if (rule.kind != PRINCIPAL_JWT && (c.jwks || c.issuer || c.audience)) {
    cli_error("serve", "--jwks, --issuer and --audience go with --principal "
                       "jwt");
    return EXIT_USAGE;
  }
  raise_nofile();
  fewer_arenas();
  if (rule.kind == PRINCIPAL_JWT &&
      principal_jwt_start(&rule, c.jwks, c.issuer, c.audience, why,
                          sizeof why) != 0) {
    cli_error("serve", "--principal jwt: %s", why);
    return EXIT_USAGE;
  }
  c.principal = &rule;
  if (!(upstream = strdup(c.upstream)))
    return EXIT_FAIL;
  for (size_t n = strlen(upstream); n > 8 && upstream[n - 1] == '/'; n--)
    upstream[n - 1] = 0;
  c.upstream = upstream;
  if (c.console_audit_log && !c.console_token_file) {
    cli_error("serve", "--console-audit-log needs --console-token-file");
    status = EXIT_USAGE;
    goto out;
  }
  if (c.console_token_file && !c.admin_listen) {
    cli_error("serve", "--console-token-file needs --admin-listen (the "
                       "console is served there)");
    status = EXIT_USAGE;
    goto out;
  }
  if (c.console_token_file &&
      !(console_token = cli_read_token("serve", "--console-token-file",
                                       c.console_token_file))) {
    status = EXIT_USAGE;
    goto out;
  }
  if (c.admin_token_file && !c.admin_listen) {
    cli_error("serve", "--admin-token-file needs --admin-listen");
    status = EXIT_USAGE;
    goto out;
  }
  if (c.admin_token_file &&
      !(admin_token = cli_read_token("serve", "--admin-token-file",
                                   c.admin_token_file))) {
    status = EXIT_USAGE;
    goto out;
  }
  if (admin_token && console_token && strcmp(admin_token, console_token) == 0) {
    /* The admin token is handed to scrapers and load balancers; the
     * console's settles records. */
    cli_error("serve", "--console-token-file: the same token as "
                       "--admin-token-file; give the console a token of its "
                       "own (it resolves and deletes records)");
    status = EXIT_USAGE;
    goto out;
  }
  if (c.admin_listen && !admin_token &&
      listen_is_loopback(c.admin_listen) != 1) {
    /* /metrics and /readyz tell what the gateway carries and why its store
     * fails: not to whoever reaches the address. */
    cli_error("serve",
              "--admin-listen %s: not a loopback address; the admin "
              "listener would answer anyone who reaches it. Bind it to "
              "127.0.0.1 or [::1], or give --admin-token-file FILE "
              "(requests then need \"Authorization: Bearer TOKEN\")",
              c.admin_listen);
    status = EXIT_USAGE;
    goto out;
  }
  if (c.log_path && accesslog_open(c.log_path) != 0) {
    cli_error("serve", "--log: %s: %s", c.log_path, strerror(errno));
    goto out;
  }
  memset(&so, 0, sizeof so);
  /* The HTTP threads' reads (replays), the store workers', and the
   * store's own threads for the calls it cannot queue (at most 16: see
   * idem_execute_begin_async()). */
  so.max_connections = c.store_workers + c.threads + 16;
  /* part 9: never an empty store in place of a deleted one (store.c). */
  if (serve_store_open(&c, &so, &store, store_name, sizeof store_name) != 0)
    goto out;
  if (cli_seal_apply(store, c.seal_keys, c.n_seal_keys, why, sizeof why) != 0) {
    cli_error("serve", "--seal-key: %s", why);
    status = EXIT_USAGE;
    goto out;
  }
  if (upstream_init(&c) != 0) {
    cli_error("serve", "cannot initialise libcurl");
    goto out;
  }
  /* The fingerprint workers: one per core, for the large keyed bodies
   * that are parsed whole (see SERVE_INLINE_BODY). */
  if (pool_heavy_start(sysconf(_SC_NPROCESSORS_ONLN) > 1
                           ? (int)sysconf(_SC_NPROCESSORS_ONLN)
                           : 1) != 0 ||
      pool_start(c.store_workers) != 0) {
    cli_error("serve", "cannot start the store workers");
    goto out;
  }
  if (c.admin_listen &&
      !(admin = admin_start(store, c.admin_listen, admin_token,
                            console_token, c.console_audit_log, admin_bound,
                            sizeof admin_bound)))
    goto out;
  if (!(gw = gateway_start(&c, store, bound, sizeof bound)))
    goto out;
  fprintf(stderr, "idem serve: listening on http://%s, forwarding to %s, "
                  "store %s\n",
          bound, c.upstream, store_name);
  if (admin)
    fprintf(stderr, "idem serve: admin on http://%s\n", admin_bound);
  principal_warn_open(&rule, "serve", c.listen);
  principal_describe(&rule, rule_text, sizeof rule_text);
  fprintf(stderr, "idem serve: principal %s%s%s\n", rule_text,
          c.replay_check_url ? ", replays checked with GET " : "",
          c.replay_check_url ? c.replay_check_url : "");

  for (;;) {
    if (sigwait(&sigs, &sig) != 0)
      continue;
    if (sig == SIGHUP) {
      if (accesslog_reopen() != 0)
        cli_error("serve", "SIGHUP: cannot reopen %s: %s", c.log_path,
                  strerror(errno));
      continue;
    }
    break;
  }
  fprintf(stderr, "idem serve: %s: draining %d request(s) in flight\n",
          strsignal(sig), metrics_in_flight_now());
  admin_set_draining();
  gateway_set_draining();
  drain(gw, c.upstream_timeout_ms + 2000);
  status = EXIT_OK;
out:
  /* drain() has answered every request (finish() refuses new ones once
   * draining), so no connection is suspended: libmicrohttpd aborts when
   * stopped with one. A store that hangs past the drain leaves some; the
   * daemon is then left to the process's exit, and so is the store: a
   * claim or a record still queued on it would answer into a closed one.
   * After the daemon, nothing hands work to the upstream loop or the store
   * workers. */
  settled = metrics_waiting_now() == 0;
  if (gw && settled)
    MHD_stop_daemon(gw);
  upstream_cleanup();
  pool_stop();
  guard_stop(); /* after the daemon: its connections are gone */
  if (admin)
    MHD_stop_daemon(admin);
  if (settled)
    idem_store_close(store);
  accesslog_close();
  free(upstream);
  free(admin_token);
  free(console_token);
  if (settled)
    principal_free(&rule);
  if (status == EXIT_OK)
    fprintf(stderr, "idem serve: stopped\n");
  return status;
}

const cli_command cmd_serve = {
    "serve", run, "HTTP gateway: Idempotency-Key semantics for any API",
    usage};
