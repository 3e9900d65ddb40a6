/* cmd_keys.c -- `idem keys`: the operators' view of the store. */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: idem keys list [--tenant T] [--operation OP] [--state S]\n"
    "                      [--limit N] [--expired] [--json]\n"
    "       idem keys show KEY [--tenant T] [--operation OP] [--json]\n"
    "       idem keys prune\n"
    "       idem keys resolve KEY [--tenant T] [--operation OP]\n"
    "                      (--completed [--status N] [--body FILE] | --failed)\n"
    "\n"
    "Common option: --store URL (default: IDEM_STORE, else ./idem.db).\n"
    "\n"
    "  list     records, oldest first; --state is in_progress, completed or\n"
    "           unknown; --expired includes retention-expired records\n"
    "  show     one record, with its stored request and response\n"
    "  prune    delete retention-expired records and print how many\n"
    "  resolve  settle a record whose outcome is unknown (or in progress):\n"
    "           --completed stores a response (status, default 0, and the\n"
    "           body from FILE or '-' for stdin) that later calls replay;\n"
    "           --failed deletes the record so that a retry acts again\n"
    "\n"
    "--operation defaults to \"run\", the operation of `idem run`; the\n"
    "tenant defaults to \"\".\n"
    "\n"
    "Exit status: 0 ok, 1 store error or no such record, 2 usage.\n";

typedef struct opts {
  const char *store, *tenant, *operation, *key, *body_file;
  int state, limit, expired, json, completed, failed;
  long status;
} opts;

static void iso_time(int64_t ms, char *buf, size_t size) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  if (ms <= 0) {
    snprintf(buf, size, "-");
    return;
  }
  gmtime_r(&t, &tm);
  strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int parse_state(const char *s) {
  if (strcmp(s, "in_progress") == 0)
    return IDEM_STATE_IN_PROGRESS;
  if (strcmp(s, "completed") == 0)
    return IDEM_STATE_COMPLETED;
  if (strcmp(s, "unknown") == 0)
    return IDEM_STATE_UNKNOWN;
  return -1;
}

/* Text that is valid UTF-8 without NULs is shown as a string, other bytes
 * as base16, so JSON output never loses data. */
static json_t *bytes_json(const void *p, size_t n) {
  json_t *s;
  if (!p)
    return json_null();
  if (memchr(p, 0, n) == NULL && (s = json_stringn(p, n)) != NULL)
    return s;
  char *hex = malloc(2 * n + 1);
  for (size_t i = 0; hex && i < n; i++)
    sprintf(hex + 2 * i, "%02x", ((const unsigned char *)p)[i]);
  if (hex)
    hex[2 * n] = '\0';
  s = json_pack("{s:s}", "hex", hex ? hex : "");
  free(hex);
  return s;
}

static json_t *record_json(const idem_record *r) {
  json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:I}", "tenant",
                        r->tenant, "operation", r->operation, "key", r->key,
                        "fingerprint", r->fingerprint, "state",
                        idem_state_name(r->state), "attempt", r->attempt,
                        "created_ms", (json_int_t)r->created_ms, "updated_ms",
                        (json_int_t)r->updated_ms, "lease_expires_ms",
                        (json_int_t)r->lease_expires_ms, "expires_ms",
                        (json_int_t)r->expires_ms);
  if (!o)
    return NULL;
  json_object_set_new(o, "request", bytes_json(r->request, r->request_len));
  if (r->has_response)
    json_object_set_new(
        o, "response",
        json_pack("{s:i,s:o,s:o}", "status", r->response.status, "meta",
                  bytes_json(r->response.meta, r->response.meta_len), "body",
                  bytes_json(r->response.body, r->response.body_len)));
  return o;
}

static int print_row(const idem_record *r, void *ctx) {
  opts *o = ctx;
  if (o->json) {
    json_t *j = record_json(r);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (s)
      puts(s);
    free(s);
    json_decref(j);
  } else {
    char created[32], expires[32];
    iso_time(r->created_ms, created, sizeof created);
    iso_time(r->expires_ms, expires, sizeof expires);
    printf("%-12s %-20s %-32s %-11s %3d %-20s %s\n",
           r->tenant[0] ? r->tenant : "-", r->operation, r->key,
           idem_state_name(r->state), r->attempt, created, expires);
  }
  return 0;
}

static int do_list(idem_store *s, opts *o) {
  idem_filter f = {0};
  int rc;
  f.tenant = o->tenant;
  f.operation = o->operation;
  f.state = o->state;
  f.limit = o->limit;
  f.expired = o->expired;
  if (!o->json)
    printf("%-12s %-20s %-32s %-11s %3s %-20s %s\n", "TENANT", "OPERATION",
           "KEY", "STATE", "ATT", "CREATED", "EXPIRES");
  rc = idem_list(s, &f, print_row, o);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "list", rc);
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

static int do_show(idem_store *s, opts *o) {
  idem_record *r = NULL;
  idem_id id = {o->tenant ? o->tenant : "",
                o->operation ? o->operation : "run", o->key};
  int rc = idem_get(s, &id, &r);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "show", rc);
    return EXIT_FAIL;
  }
  json_t *j = record_json(r);
  char *text = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
  if (o->json || !text) {
    if (text)
      puts(text);
  } else {
    char t[32];
    printf("tenant:      %s\n", r->tenant);
    printf("operation:   %s\n", r->operation);
    printf("key:         %s\n", r->key);
    printf("state:       %s\n", idem_state_name(r->state));
    printf("attempt:     %d\n", r->attempt);
    printf("fingerprint: %s\n", r->fingerprint);
    iso_time(r->created_ms, t, sizeof t);
    printf("created:     %s\n", t);
    iso_time(r->updated_ms, t, sizeof t);
    printf("updated:     %s\n", t);
    if (r->state == IDEM_STATE_IN_PROGRESS) {
      iso_time(r->lease_expires_ms, t, sizeof t);
      printf("lease until: %s\n", t);
    }
    iso_time(r->expires_ms, t, sizeof t);
    printf("expires:     %s\n", t);
    if (r->request)
      printf("request:     %.*s\n", (int)r->request_len,
             (const char *)r->request);
    if (r->has_response) {
      printf("status:      %d\n", r->response.status);
      printf("body bytes:  %zu\n", r->response.body_len);
    }
  }
  free(text);
  json_decref(j);
  idem_record_free(r);
  return EXIT_OK;
}

static int do_prune(idem_store *s) {
  int64_t removed = 0;
  int rc = idem_prune(s, &removed);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "prune", rc);
    return EXIT_FAIL;
  }
  printf("pruned %lld expired records\n", (long long)removed);
  return EXIT_OK;
}

static int do_resolve(idem_store *s, opts *o) {
  idem_id id = {o->tenant ? o->tenant : "",
                o->operation ? o->operation : "run", o->key};
  idem_response r = {0};
  char *body = NULL;
  size_t len = 0;
  int rc;
  if (o->completed) {
    if (o->body_file &&
        cli_read_file(o->body_file, IDEM_MAX_RESPONSE, &body, &len) != 0) {
      cli_error("keys", "%s: %s", o->body_file,
                errno == EFBIG ? "larger than the 16 MiB a record keeps"
                               : strerror(errno));
      return EXIT_FAIL;
    }
    r.status = (int)o->status;
    r.body = body;
    r.body_len = len;
  }
  rc = idem_resolve(s, &id, o->completed ? &r : NULL);
  free(body);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "resolve", rc);
    return EXIT_FAIL;
  }
  printf("resolved %s: %s\n", o->key,
         o->completed ? "completed (later calls replay the response)"
                      : "failed (the record is deleted; a retry acts again)");
  return EXIT_OK;
}

static int run(int argc, char **argv) {
  opts o;
  const char *verb;
  idem_store *s = NULL;
  int status, rc;
  memset(&o, 0, sizeof o);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? EXIT_USAGE : EXIT_OK;
  }
  verb = argv[1];
  if (strcmp(verb, "list") && strcmp(verb, "show") && strcmp(verb, "prune") &&
      strcmp(verb, "resolve")) {
    cli_error("keys", "unknown action '%s' (list, show, prune, resolve)",
              verb);
    return EXIT_USAGE;
  }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    int has_value = i + 1 < argc;
    long v;
    if (strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      o.json = 1;
    } else if (strcmp(a, "--expired") == 0) {
      o.expired = 1;
    } else if (strcmp(a, "--completed") == 0) {
      o.completed = 1;
    } else if (strcmp(a, "--failed") == 0) {
      o.failed = 1;
    } else if (a[0] == '-' && a[1] == '-' && !has_value) {
      cli_error("keys", "%s needs a value", a);
      return EXIT_USAGE;
    } else if (strcmp(a, "--store") == 0) {
      o.store = argv[++i];
    } else if (strcmp(a, "--tenant") == 0) {
      o.tenant = argv[++i];
    } else if (strcmp(a, "--operation") == 0) {
      o.operation = argv[++i];
    } else if (strcmp(a, "--body") == 0) {
      o.body_file = argv[++i];
    } else if (strcmp(a, "--state") == 0) {
      if ((o.state = parse_state(argv[++i])) < 0) {
        cli_error("keys", "--state: in_progress, completed or unknown");
        return EXIT_USAGE;
      }
    } else if (strcmp(a, "--limit") == 0) {
      if (cli_parse_uint(argv[++i], 1000000000L, &v) != 0) {
        cli_error("keys", "--limit: a non-negative number");
        return EXIT_USAGE;
      }
      o.limit = (int)v;
    } else if (strcmp(a, "--status") == 0) {
      char *end = NULL;
      errno = 0;
      o.status = strtol(argv[++i], &end, 10);
      if (errno || !end || *end || o.status < -2147483647L ||
          o.status > 2147483647L) {
        cli_error("keys", "--status: an integer");
        return EXIT_USAGE;
      }
    } else if (a[0] == '-') {
      cli_error("keys", "unknown option '%s'", a);
      return EXIT_USAGE;
    } else if (!o.key) {
      o.key = a;
    } else {
      cli_error("keys", "unexpected argument '%s'", a);
      return EXIT_USAGE;
    }
  }
  if ((strcmp(verb, "show") == 0 || strcmp(verb, "resolve") == 0) &&
      !o.key) {
    cli_error("keys", "%s needs a KEY", verb);
    return EXIT_USAGE;
  }
  if (strcmp(verb, "resolve") == 0 && o.completed == o.failed) {
    cli_error("keys", "resolve needs exactly one of --completed or --failed");
    return EXIT_USAGE;
  }
  if (o.key && (rc = idem_key_check(o.key)) != IDEM_OK) {
    cli_error("keys", "%s", idem_errmsg());
    return EXIT_USAGE;
  }
  rc = idem_store_open(cli_store_url(o.store), NULL, &s);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "open store", rc);
    return EXIT_FAIL;
  }
  if (strcmp(verb, "list") == 0)
    status = do_list(s, &o);
  else if (strcmp(verb, "show") == 0)
    status = do_show(s, &o);
  else if (strcmp(verb, "prune") == 0)
    status = do_prune(s);
  else
    status = do_resolve(s, &o);
  idem_store_close(s);
  return status;
}

const cli_command cmd_keys = {"keys", run,
                              "list, show, prune and resolve stored records",
                              usage};
