/*
 * cmd_console.c -- `idem console`: the operator console (console.c) over
 * any store, on a listener of its own.
 */
#include "cli.h"
#include "console.h"
#include "serve/serve.h" /* listen_on(), listen_is_loopback() */

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEAL_KEYS 16

static const char usage[] =
    "usage: idem console [--store URL] [--listen HOST:PORT]\n"
    "                    [--token-file FILE] [--audit-log FILE]\n"
    "                    [--seal-key FILE]...\n"
    "\n"
    "An operator's page, and a JSON API, over a store's records: the\n"
    "unknown outcomes first, filters by state, operation, tenant and key\n"
    "prefix, one record whole, live counts; resolve an unknown outcome (as\n"
    "completed with an answer, as failed, or released so that the next call\n"
    "acts) or delete a record, each written to the audit log.\n"
    "\n"
    "Options:\n"
    "  --store URL          the store (default: $IDEM_STORE, else ./idem.db)\n"
    "  --listen HOST:PORT   where to listen (default 127.0.0.1:8790; port 0\n"
    "                       picks a free one)\n"
    "  --token-file FILE    the token (its first line, 16 or more printable\n"
    "                       characters): the page logs in with it, the API\n"
    "                       takes it as \"Authorization: Bearer TOKEN\".\n"
    "                       Without it the console answers the loopback only\n"
    "  --audit-log FILE     append one JSON line per login and action (who,\n"
    "                       when, what, from which address); default: standard\n"
    "                       error\n"
    "  --seal-key FILE      a key that opens sealed answers, repeatable (the\n"
    "                       first seals the answers the console stores)\n"
    "\n"
    "The API: GET /api/records?state=&operation=&tenant=&prefix=&offset=&"
    "limit=,\n"
    "GET /api/records/show?tenant=&operation=&key=, GET /api/metrics,\n"
    "POST /api/records/resolve {tenant, operation, key, outcome, status, "
    "body,\n"
    "force} and POST /api/records/delete {tenant, operation, key}.\n"
    "\n"
    "Exit status: 0 after SIGTERM or SIGINT, 1 store error, 2 usage.\n";

static int run(int argc, char **argv) {
  const char *store_url = NULL, *listen = "127.0.0.1:8790";
  const char *token_file = NULL, *audit_path = NULL;
  char *seal_keys[MAX_SEAL_KEYS];
  int nseal = 0, sig, status = EXIT_FAIL;
  char *token = NULL, bound[128] = "", err[512];
  idem_store *store = NULL;
  console *cn = NULL;
  struct MHD_Daemon *d = NULL;
  sigset_t sigs;
  int rc;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    }
    if (strcmp(a, "--store") && strcmp(a, "--listen") &&
        strcmp(a, "--token-file") && strcmp(a, "--audit-log") &&
        strcmp(a, "--seal-key")) {
      cli_error("console", "unknown option '%s' (see idem console --help)",
                a);
      return EXIT_USAGE;
    }
    if (!v) {
      cli_error("console", "%s needs a value", a);
      return EXIT_USAGE;
    }
    i++;
    if (strcmp(a, "--store") == 0) {
      if (cli_store_option("console", v, &store_url) != 0)
        return EXIT_USAGE;
    } else if (strcmp(a, "--listen") == 0) {
      listen = v;
    } else if (strcmp(a, "--token-file") == 0) {
      token_file = v;
    } else if (strcmp(a, "--audit-log") == 0) {
      audit_path = v;
    } else if (nseal == MAX_SEAL_KEYS) {
      cli_error("console", "--seal-key: at most %d keys", MAX_SEAL_KEYS);
      return EXIT_USAGE;
    } else {
      seal_keys[nseal++] = (char *)v;
    }
  }
  if (token_file &&
      !(token = cli_read_token("console", "--token-file", token_file)))
    return EXIT_USAGE;
  if (!token && listen_is_loopback(listen) != 1) {
    cli_error("console",
              "--listen %s: not a loopback address, and no --token-file: "
              "the console would let anyone who reaches it resolve and "
              "delete records. Bind it to 127.0.0.1 or [::1], or give "
              "--token-file FILE",
              listen);
    free(token);
    return EXIT_USAGE;
  }
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, NULL);
  signal(SIGPIPE, SIG_IGN);
  listen_log_name = "idem console";

  if ((rc = idem_store_open(cli_store_url(store_url), NULL, &store)) !=
      IDEM_OK) {
    cli_idem_error("console", "open store", rc);
    goto out;
  }
  if (cli_seal_apply(store, seal_keys, nseal, err, sizeof err) != 0) {
    cli_error("console", "--seal-key: %s", err);
    goto out;
  }
  console_config cfg = {store, token, audit_path, "console", NULL};
  if (!(cn = console_new(&cfg)))
    goto out;
  {
    struct MHD_OptionItem opts[] = {
        {MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, 64, NULL},
        /* One client holding connections open leaves room for others. */
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16, NULL},
        {MHD_OPTION_NOTIFY_COMPLETED, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    opts[3].value = (intptr_t)console_notify_completed;
    d = listen_on("console", "--listen", listen,
                  MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG,
                  console_access, cn, opts, bound, sizeof bound);
  }
  if (!d)
    goto out;
  fprintf(stderr, "idem console: listening on http://%s%s\n", bound,
          token ? "" : " (no token: the loopback only)");
  while (sigwait(&sigs, &sig) != 0)
    ;
  fprintf(stderr, "idem console: %s: stopping\n", strsignal(sig));
  status = EXIT_OK;
out:
  if (d)
    MHD_stop_daemon(d);
  console_free(cn);
  if (store)
    idem_store_close(store);
  free(token);
  return status;
}

const cli_command cmd_console = {
    "console", run,
    "an operator's page and API: unknown outcomes, resolve, delete", usage};
