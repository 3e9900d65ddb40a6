/* cmd_keys.c -- `idem keys`: the operators' view of the store. */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: idem keys list [--tenant T] [--operation OP] [--state S]\n"
    "                      [--limit N] [--expired | --overdue] [--json]\n"
    "       idem keys show KEY [--tenant T] [--operation OP] [--json]\n"
    "       idem keys prune\n"
    "       idem keys resolve KEY [--tenant T] [--operation OP] [--force]\n"
    "                      (--completed [--status N] [--body FILE]\n"
    "                       [--retention DUR] | --failed)\n"
    "       idem keys delete KEY [--tenant T] [--operation OP]\n"
    "\n"
    "Common option: --store URL (default: IDEM_STORE, else ./idem.db).\n"
    "list, show and resolve also take --seal-key FILE, repeatable: the\n"
    "keys that open sealed responses and requests (the first one seals\n"
    "what resolve stores). FILE holds 32 bytes (raw, 64 hex digits or\n"
    "base64) and must be readable by its owner only.\n"
    "\n"
    "  list     records, oldest first; --state is in_progress, completed or\n"
    "           unknown; --expired includes completed records past their\n"
    "           retention; --overdue lists only records in progress or\n"
    "           unknown that have waited longer than their retention (they\n"
    "           never expire: they wait for a holder or for you)\n"
    "  show     one record, with its stored request and response (a\n"
    "           sealed one is opened with --seal-key, or said to be\n"
    "           sealed, naming its key id); a\n"
    "           response marked recovered was stored by a run that took\n"
    "           the key over: an earlier run may also have acted. Without\n"
    "           --operation, every record with the KEY (of any tenant\n"
    "           unless --tenant), one after another: this reads the whole\n"
    "           store (or tenant) to find them\n"
    "  prune    delete completed records past their retention, print how\n"
    "           many; records in progress or unknown are never pruned\n"
    "  resolve  settle a record whose outcome is unknown, or in progress\n"
    "           with its lease over: --completed stores a response (status,\n"
    "           default 0, and the body from FILE or '-' for stdin) that\n"
    "           later calls replay, kept for --retention (default 24h); a\n"
    "           record of `idem serve` (operation \"METHOD /path\") needs\n"
    "           --status, the HTTP status (100-599) its replays answer;\n"
    "           --failed deletes the record so that a retry acts again.\n"
    "           A record whose holder's lease still runs may be in the\n"
    "           middle of acting: it is refused unless --force\n"
    "  delete   remove one record whatever its state (one that fails its\n"
    "           checksum, say); a retry then acts again\n"
    "\n"
    "Without --operation, show, resolve and delete find the KEY's records\n"
    "in every operation (and, without --tenant, every tenant); resolve and\n"
    "delete then act only when exactly one record has the KEY, and name\n"
    "them all otherwise. A tenant is at most 255 bytes of UTF-8 without\n"
    "control characters or invisible ones that reorder or hide text (such\n"
    "as U+202E). --status is 0-255 for `idem run` (an exit status),\n"
    "100-599 for `idem serve` (an HTTP status) and 0-999 for other\n"
    "operations. Stored\n"
    "text that could mislead on a terminal is shown escaped (\\n, \\x1b, "
    "\\u202e; a backslash as \\\\).\n"
    "\n"
    "Exit status: 0 ok, 1 store error or no such record, 2 usage.\n";

/* The most --seal-key options: the current key and those rotated out. */
#define MAX_SEAL_KEYS 16

typedef struct opts {
  const char *store, *tenant, *operation, *key, *body_file;
  char *seal_keys[MAX_SEAL_KEYS];
  int nseal_keys;
  int state, limit, expired, overdue, json, completed, failed, has_status;
  int force;
  int64_t retention_ms;
  long status;
  int oom; /* set by a listing that ran out of memory */
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

/* Prints JSON text with the characters that could mislead on a terminal
 * escaped (the same JSON value). */
static int put_json(json_t *j, size_t flags) {
  char *text = j ? json_dumps(j, flags) : NULL;
  char *safe = text ? cli_json_escape_unsafe(text) : NULL;
  if (safe)
    puts(safe);
  free(safe);
  free(text);
  return safe ? 0 : -1;
}

/*
 * The text table. Its first LIST_WINDOW rows are held back so that each
 * column is as wide as its widest field among them; later rows are printed
 * as they come, in the same columns (a field wider than its column pushes
 * the rest of its own row right, and loses nothing). So a listing of any
 * length needs no more memory than the window.
 */
#define LIST_WINDOW 512

typedef struct row {
  char *field[3]; /* tenant, operation, key: escaped */
  const char *state;
  int attempt;
  char created[32], expires[32];
} row;

typedef struct table {
  row rows[LIST_WINDOW];
  size_t n;
  size_t width[3];
  int printing; /* the window is out: rows are printed as they come */
} table;

static const char *const headers[3] = {"TENANT", "OPERATION", "KEY"};

static void put_padded(const char *s, size_t width) {
  size_t w = cli_text_width(s);
  fputs(s, stdout);
  for (; w < width; w++)
    putchar(' ');
  putchar(' ');
}

static void put_row(const table *t, const row *r) {
  for (int i = 0; i < 3; i++)
    put_padded(r->field[i], t->width[i]);
  printf("%-11s %3d %-20s %s\n", r->state, r->attempt, r->created, r->expires);
}

static void row_free(row *r) {
  for (int i = 0; i < 3; i++)
    free(r->field[i]);
}

/* Prints the header and the rows held back, in columns that fit them. */
static void flush_window(table *t) {
  for (int i = 0; i < 3; i++)
    t->width[i] = strlen(headers[i]);
  for (size_t j = 0; j < t->n; j++)
    for (int i = 0; i < 3; i++) {
      size_t w = cli_text_width(t->rows[j].field[i]);
      if (w > t->width[i])
        t->width[i] = w;
    }
  for (int i = 0; i < 3; i++)
    put_padded(headers[i], t->width[i]);
  printf("%-11s %3s %-20s %s\n", "STATE", "ATT", "CREATED", "EXPIRES");
  for (size_t j = 0; j < t->n; j++) {
    put_row(t, &t->rows[j]);
    row_free(&t->rows[j]);
  }
  t->n = 0;
  t->printing = 1;
}

typedef struct list_ctx {
  opts *o;
  table *t;
} list_ctx;

static int list_row(const idem_record *r, void *ctx) {
  list_ctx *c = ctx;
  if (c->o->json) {
    json_t *j = cli_record_json(r);
    int rc = put_json(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (rc != 0)
      c->o->oom = 1;
    return rc;
  }
  row w;
  memset(&w, 0, sizeof w);
  w.field[0] = r->tenant[0] ? cli_escape(r->tenant, strlen(r->tenant))
                            : cli_escape("-", 1);
  w.field[1] = cli_escape(r->operation, strlen(r->operation));
  w.field[2] = cli_escape(r->key, strlen(r->key));
  if (!w.field[0] || !w.field[1] || !w.field[2]) {
    row_free(&w);
    c->o->oom = 1;
    return -1;
  }
  w.state = idem_state_name(r->state);
  w.attempt = r->attempt;
  iso_time(r->created_ms, w.created, sizeof w.created);
  iso_time(r->expires_ms, w.expires, sizeof w.expires);
  if (c->t->printing) {
    put_row(c->t, &w);
    row_free(&w);
    return 0;
  }
  c->t->rows[c->t->n++] = w;
  if (c->t->n == LIST_WINDOW)
    flush_window(c->t);
  return 0;
}

static int do_list(idem_store *s, opts *o) {
  idem_filter f = {0};
  list_ctx c = {o, NULL};
  int rc, status = EXIT_OK;
  f.tenant = o->tenant;
  f.operation = o->operation;
  f.state = o->state;
  f.limit = o->limit;
  f.expired = o->expired;
  f.overdue = o->overdue;
  if (!o->json && !(c.t = calloc(1, sizeof *c.t))) {
    cli_error("keys", "list: out of memory");
    return EXIT_FAIL;
  }
  rc = idem_list(s, &f, list_row, &c);
  if (c.t && !c.t->printing && !o->oom)
    flush_window(c.t); /* the header, and the rows held back */
  if (o->oom) {
    cli_error("keys", "list: out of memory");
    status = EXIT_FAIL;
  } else if (rc != IDEM_OK) {
    cli_idem_error("keys", "list", rc);
    status = EXIT_FAIL;
  }
  if (c.t) {
    for (size_t j = 0; j < c.t->n; j++)
      row_free(&c.t->rows[j]);
    free(c.t);
  }
  return status;
}

/* Prints "label value" with the value escaped. */
static int put_field(const char *label, const void *p, size_t n) {
  char *e = cli_escape(p, n);
  if (!e)
    return -1;
  printf("%-13s%s\n", label, e);
  free(e);
  return 0;
}

/* Prints one record as `keys show` does; non-zero when out of memory. */
static int put_record(const idem_record *r, const opts *o) {
  int bad = 0;
  json_t *j = cli_record_json(r);
  if (o->json) {
    bad = put_json(j, JSON_INDENT(2) | JSON_SORT_KEYS);
  } else {
    char t[32];
    bad |= put_field("tenant:", r->tenant, strlen(r->tenant));
    bad |= put_field("operation:", r->operation, strlen(r->operation));
    bad |= put_field("key:", r->key, strlen(r->key));
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
      bad |= put_field("request:", r->request, r->request_len);
    if (r->has_response) {
      printf("status:      %d\n", r->response.status);
      printf("body bytes:  %zu\n", r->response.body_len);
      printf("recovered:   %s\n", r->recovered ? "yes" : "no");
    }
    if (r->seal_key_id[0] && !r->sealed) {
      /* Opened with --seal-key: the answer a replay gives. */
      printf("sealed:      with key %s (opened)\n", r->seal_key_id);
      if (r->has_response)
        bad |= put_field("body:", r->response.body, r->response.body_len);
    } else if (r->sealed == IDEM_SEALED_NO_KEY) {
      printf("status:      %d\n", r->response.status);
      printf("response:    sealed with key %s; pass --seal-key\n",
             r->seal_key_id);
    } else if (r->sealed) {
      printf("status:      %d\n", r->response.status);
      printf("response:    sealed with key %s, and it does not open: it was "
             "altered or moved from another record (idem keys delete "
             "removes it)\n",
             r->seal_key_id);
    }
  }
  json_decref(j);
  return bad;
}

/*
 * The records of one KEY in every operation (and every tenant, unless
 * --tenant), for show, resolve and delete without --operation: the store
 * has no index by key alone, so the listing reads them all. show prints
 * each as it comes; the others keep the first's id and name up to
 * FOUND_NAMED of them for a message.
 */
#define FOUND_NAMED 20

typedef struct found {
  opts *o;
  int print; /* show: print each */
  int n;
  char *tenant, *operation; /* the first's */
  char named[FOUND_NAMED][600];
  int oom;
} found;

static int found_one(const idem_record *r, void *ctx) {
  found *f = ctx;
  if (strcmp(r->key, f->o->key) != 0)
    return 0;
  if (f->print) {
    if (f->n && !f->o->json)
      putchar('\n');
    if (put_record(r, f->o) != 0) {
      f->oom = 1;
      return -1;
    }
  } else if (f->n == 0) {
    f->tenant = strdup(r->tenant);
    f->operation = strdup(r->operation);
    if (!f->tenant || !f->operation) {
      f->oom = 1;
      return -1;
    }
  }
  if (f->n < FOUND_NAMED) {
    char *t = cli_escape(r->tenant, strlen(r->tenant));
    char *op = cli_escape(r->operation, strlen(r->operation));
    const char *ts = t ? t : "?", *ops = op ? op : "?";
    /* Escaped names can be four times as long: cut between two
     * characters. */
    snprintf(f->named[f->n], sizeof f->named[0],
             "  tenant '%.*s', operation '%.*s'", (int)cli_utf8_cut(ts, 250),
             ts, (int)cli_utf8_cut(ops, 300), ops);
    free(t);
    free(op);
  }
  f->n++;
  return 0;
}

/* Lists the records of o->key (see found); IDEM_OK or the listing's
 * error, said. */
static int find_key(idem_store *s, opts *o, found *f, const char *what) {
  idem_filter filter = {0};
  int rc;
  filter.tenant = o->tenant;
  rc = idem_list(s, &filter, found_one, f);
  if (f->oom) {
    cli_error("keys", "%s: out of memory", what);
    return IDEM_ENOMEM;
  }
  if (rc != IDEM_OK)
    cli_idem_error("keys", what, rc);
  return rc;
}

static void found_free(found *f) {
  free(f->tenant);
  free(f->operation);
}

/*
 * The one record that resolve or delete acts on: the one named, or, without
 * --operation, the only record with the KEY. EXIT_OK with *id set (its
 * strings in f), or the exit status after saying why.
 */
static int pick_record(idem_store *s, opts *o, const char *what, found *f,
                       idem_id *id) {
  id->tenant = o->tenant ? o->tenant : "";
  id->operation = o->operation;
  id->key = o->key;
  if (o->operation)
    return EXIT_OK;
  if (find_key(s, o, f, what) != IDEM_OK)
    return EXIT_FAIL;
  if (f->n == 0) {
    cli_error("keys", "%s: no record has the key '%s'%s", what, o->key,
              o->tenant ? " in this tenant" : "");
    return EXIT_FAIL;
  }
  if (f->n > 1) {
    cli_error("keys", "%s: %d records have the key '%s'; name one with "
                      "--operation (and --tenant):",
              what, f->n, o->key);
    for (int i = 0; i < f->n && i < FOUND_NAMED; i++)
      fprintf(stderr, "%s\n", f->named[i]);
    if (f->n > FOUND_NAMED)
      fprintf(stderr, "  ... and %d more\n", f->n - FOUND_NAMED);
    return EXIT_FAIL;
  }
  id->tenant = f->tenant;
  id->operation = f->operation;
  return EXIT_OK;
}

static int do_show(idem_store *s, opts *o) {
  idem_record *r = NULL;
  int rc, bad;
  if (!o->operation) {
    found f;
    memset(&f, 0, sizeof f);
    f.o = o;
    f.print = 1;
    rc = find_key(s, o, &f, "show");
    found_free(&f);
    if (rc != IDEM_OK)
      return EXIT_FAIL;
    if (f.n == 0) {
      cli_error("keys", "show: no record has the key '%s'%s", o->key,
                o->tenant ? " in this tenant" : "");
      return EXIT_FAIL;
    }
    return EXIT_OK;
  }
  idem_id id = {o->tenant ? o->tenant : "", o->operation, o->key};
  if ((rc = idem_get(s, &id, &r)) != IDEM_OK) {
    cli_idem_error("keys", "show", rc);
    return EXIT_FAIL;
  }
  bad = put_record(r, o);
  idem_record_free(r);
  if (bad) {
    cli_error("keys", "show: out of memory");
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

static int do_prune(idem_store *s) {
  int64_t removed = 0;
  int rc = idem_prune(s, &removed);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "prune", rc);
    return EXIT_FAIL;
  }
  printf("pruned %lld expired completed records\n", (long long)removed);
  return EXIT_OK;
}

static int do_resolve(idem_store *s, opts *o) {
  idem_id id;
  idem_response r = {0};
  char *body = NULL;
  size_t len = 0;
  int rc, status;
  found f;
  memset(&f, 0, sizeof f);
  f.o = o;
  if ((status = pick_record(s, o, "resolve", &f, &id)) != EXIT_OK)
    goto out;
  status = EXIT_USAGE;
  /* The status is what later calls replay: an HTTP status for the
   * gateway, whose replay of anything else is an error (a status 0, the
   * default for `idem run`, would answer 500 to every retry). */
  if (o->completed && cli_http_operation(id.operation) &&
      (!o->has_status || o->status < 100 || o->status > 599)) {
    if (!o->has_status)
      cli_error("keys", "resolve: '%s' is a record of idem serve (operation "
                        "'%s'): --completed needs --status, the HTTP status "
                        "(100-599) that its retries will be answered",
                o->key, id.operation);
    else
      cli_error("keys", "--status: %ld is not an HTTP status (100-599), "
                        "which the records of idem serve keep",
                o->status);
    goto out;
  }
  if (o->has_status && o->status > 255 && strcmp(id.operation, "run") == 0) {
    cli_error("keys", "--status: %ld is not an exit status (0-255), which "
                      "the records of `idem run` keep",
              o->status);
    goto out;
  }
  status = EXIT_FAIL;
  if (o->completed) {
    if (o->body_file &&
        cli_read_file(o->body_file, IDEM_MAX_RESPONSE, &body, &len) != 0) {
      cli_error("keys", "%s: %s", o->body_file,
                errno == EFBIG ? "larger than the 16 MiB a record keeps"
                               : strerror(errno));
      goto out;
    }
    r.status = (int)o->status;
    r.body = body;
    r.body_len = len;
  }
  idem_resolve_options ro = {o->retention_ms, o->force};
  rc = idem_resolve_with(s, &id, o->completed ? &r : NULL, &ro);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "resolve", rc);
    goto out;
  }
  printf("resolved %s: %s\n", o->key,
         o->completed ? "completed (later calls replay the response)"
                      : "failed (the record is deleted; a retry acts again)");
  status = EXIT_OK;
out:
  free(body);
  found_free(&f);
  return status;
}

static int do_delete(idem_store *s, opts *o) {
  idem_id id;
  int rc, status;
  found f;
  memset(&f, 0, sizeof f);
  f.o = o;
  if ((status = pick_record(s, o, "delete", &f, &id)) == EXIT_OK) {
    if ((rc = idem_delete(s, &id)) != IDEM_OK) {
      cli_idem_error("keys", "delete", rc);
      status = EXIT_FAIL;
    } else {
      printf("deleted %s (a retry acts again)\n", o->key);
    }
  }
  found_free(&f);
  return status;
}

/* The actions, as bits, so that each option can say where it belongs. */
enum { LIST = 1, SHOW = 2, PRUNE = 4, RESOLVE = 8, DELETE = 16, ANY = 31 };

static const struct option {
  const char *name;
  int takes_value;
  int actions;
} options[] = {
    {"--store", 1, ANY},
    {"--tenant", 1, LIST | SHOW | RESOLVE | DELETE},
    {"--operation", 1, LIST | SHOW | RESOLVE | DELETE},
    {"--state", 1, LIST},
    {"--limit", 1, LIST},
    {"--expired", 0, LIST},
    {"--overdue", 0, LIST},
    {"--force", 0, RESOLVE},
    {"--retention", 1, RESOLVE},
    {"--json", 0, LIST | SHOW},
    {"--completed", 0, RESOLVE},
    {"--failed", 0, RESOLVE},
    {"--status", 1, RESOLVE},
    {"--body", 1, RESOLVE},
    {"--seal-key", 1, LIST | SHOW | RESOLVE},
};

/* Sets one option from the command line; 0, or -1 after a usage error. */
static int set_option(opts *o, const char *name, const char *v) {
  long n;
  if (strcmp(name, "--json") == 0)
    o->json = 1;
  else if (strcmp(name, "--expired") == 0)
    o->expired = 1;
  else if (strcmp(name, "--overdue") == 0)
    o->overdue = 1;
  else if (strcmp(name, "--force") == 0)
    o->force = 1;
  else if (strcmp(name, "--retention") == 0)
    return cli_duration_option("keys", name, v, 1, IDEM_MAX_RETENTION_MS,
                               &o->retention_ms);
  else if (strcmp(name, "--completed") == 0)
    o->completed = 1;
  else if (strcmp(name, "--failed") == 0)
    o->failed = 1;
  else if (strcmp(name, "--store") == 0)
    return cli_store_option("keys", v, &o->store);
  else if (strcmp(name, "--seal-key") == 0) {
    if (o->nseal_keys == MAX_SEAL_KEYS) {
      cli_error("keys", "--seal-key: at most %d keys", MAX_SEAL_KEYS);
      return -1;
    }
    o->seal_keys[o->nseal_keys++] = (char *)v;
  } else if (strcmp(name, "--tenant") == 0) {
    if (cli_check_tenant("keys", v) != 0)
      return -1;
    o->tenant = v;
  } else if (strcmp(name, "--operation") == 0) {
    if (cli_check_operation("keys", v) != 0)
      return -1;
    o->operation = v;
  } else if (strcmp(name, "--body") == 0)
    o->body_file = v;
  else if (strcmp(name, "--state") == 0) {
    if ((o->state = parse_state(v)) < 0) {
      cli_error("keys", "--state: in_progress, completed or unknown");
      return -1;
    }
  } else if (strcmp(name, "--limit") == 0) {
    if (cli_parse_uint(v, 1000000000L, &n) != 0) {
      cli_error("keys", "--limit: a non-negative number");
      return -1;
    }
    o->limit = (int)n;
  } else if (strcmp(name, "--status") == 0) {
    if (cli_parse_uint(v, 999, &n) != 0) {
      cli_error("keys", "--status: '%s' is not a status from 0 to 999", v);
      return -1;
    }
    o->status = n;
    o->has_status = 1;
  }
  return 0;
}

static int run(int argc, char **argv) {
  opts o;
  const char *verb;
  idem_store *s = NULL;
  int status, rc, action, only_args = 0;
  memset(&o, 0, sizeof o);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 ||
      strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? EXIT_USAGE : EXIT_OK;
  }
  verb = argv[1];
  action = strcmp(verb, "list") == 0      ? LIST
           : strcmp(verb, "show") == 0    ? SHOW
           : strcmp(verb, "prune") == 0   ? PRUNE
           : strcmp(verb, "resolve") == 0 ? RESOLVE
           : strcmp(verb, "delete") == 0  ? DELETE
                                          : 0;
  if (!action) {
    cli_error("keys",
              "unknown action '%s' (list, show, prune, resolve, delete)",
              verb);
    return EXIT_USAGE;
  }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    if (!only_args && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
      fputs(usage, stdout);
      return EXIT_OK;
    }
    if (!only_args && strcmp(a, "--") == 0) {
      only_args = 1; /* what follows is a KEY, even when it starts with - */
      continue;
    }
    if (!only_args && a[0] == '-' && a[1] != '\0') {
      const struct option *opt = NULL;
      for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
        if (strcmp(a, options[k].name) == 0)
          opt = &options[k];
      if (!opt) {
        cli_error("keys", "unknown option '%s'", a);
        return EXIT_USAGE;
      }
      if (!(opt->actions & action)) {
        cli_error("keys", "%s is not an option of 'keys %s'", a, verb);
        return EXIT_USAGE;
      }
      if (opt->takes_value && i + 1 >= argc) {
        cli_error("keys", "%s needs a value", a);
        return EXIT_USAGE;
      }
      if (set_option(&o, a, opt->takes_value ? argv[++i] : NULL) != 0)
        return EXIT_USAGE;
    } else if (!o.key && (action == SHOW || action == RESOLVE || action == DELETE)) {
      o.key = a;
    } else {
      cli_error("keys", "unexpected argument '%s' ('keys %s' takes %s)", a,
                verb,
                action == SHOW || action == RESOLVE || action == DELETE ? "one KEY"
                                                                   : "no KEY");
      return EXIT_USAGE;
    }
  }
  if ((action == SHOW || action == RESOLVE || action == DELETE) && !o.key) {
    cli_error("keys", "%s needs a KEY", verb);
    return EXIT_USAGE;
  }
  if (action == RESOLVE && o.completed == o.failed) {
    cli_error("keys", "resolve needs exactly one of --completed or --failed");
    return EXIT_USAGE;
  }
  /* Without --operation the record's operation is known once it is found
   * (do_resolve() checks the status then). */
  if (o.has_status && o.status > 255 && o.operation &&
      strcmp(o.operation, "run") == 0) {
    cli_error("keys", "--status: %ld is not an exit status (0-255), which "
                      "the records of `idem run` keep",
              o.status);
    return EXIT_USAGE;
  }
  if (o.expired && o.overdue) {
    cli_error("keys", "--expired and --overdue are two different lists");
    return EXIT_USAGE;
  }
  if (o.failed && (o.has_status || o.body_file || o.retention_ms)) {
    cli_error("keys", "--status, --body and --retention go with --completed, "
                      "not --failed");
    return EXIT_USAGE;
  }
  if (o.key && (rc = idem_key_check(o.key)) != IDEM_OK) {
    cli_error("keys", "%s", idem_errmsg());
    return EXIT_USAGE;
  }
  /* Reading needs no write access: an operator who may only read the
   * store can list it, and a listing never creates a store. */
  idem_store_options so = {.read_only = action == LIST || action == SHOW};
  rc = idem_store_open(cli_store_url(o.store), &so, &s);
  if (rc != IDEM_OK) {
    cli_idem_error("keys", "open store", rc);
    return EXIT_FAIL;
  }
  {
    char err[512];
    if (cli_seal_apply(s, o.seal_keys, o.nseal_keys, err, sizeof err) != 0) {
      cli_error("keys", "--seal-key: %s", err);
      idem_store_close(s);
      return EXIT_FAIL;
    }
  }
  if (action == LIST)
    status = do_list(s, &o);
  else if (action == SHOW)
    status = do_show(s, &o);
  else if (action == PRUNE)
    status = do_prune(s);
  else if (action == DELETE)
    status = do_delete(s, &o);
  else
    status = do_resolve(s, &o);
  idem_store_close(s);
  return status;
}

const cli_command cmd_keys = {"keys", run,
                              "list, show, prune, resolve and delete records",
                              usage};
