/*
 * cmd_run.c -- `idem run`: at-most-once execution of a command.
 *
 * The first run claims the key, runs the command with its output streaming
 * through live and captured, and stores the exit status and the output. A
 * retry with the same key and request replays the output and the status
 * without running anything.
 *
 * idem_execute() holds the key: it claims it, renews its lease on a thread
 * of its own while the command runs, and ends the record by what the
 * command came to: it ran to its end (completed with its status and
 * output, the completion retried while the store is busy or unreachable),
 * it could not be started (released: a retry may run it), or it was
 * stopped by a signal or a lost lease (marked unknown: it may have acted).
 * The command as a process is run_child.c's concern; this file reads and
 * fingerprints standard input, maps the outcome to an exit status and
 * replays stored runs.
 */
#include "cli.h"
#include "run_child.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

enum {
  EXIT_NOT_RECORDED = 5,  /* CMD ran, but its result was not recorded */
  EXIT_RUN_ERROR = 125,   /* idem itself failed; CMD did not run */
  EXIT_CANNOT_EXEC = 126, /* CMD found but could not be run */
  EXIT_NOT_FOUND = 127    /* CMD not found */
};

/* How long a completion that fails for a passing reason (store busy or
 * unreachable) is retried. */
#define COMPLETE_RETRY_MS 30000

static const char usage[] =
    "usage: idem run --key KEY [--tenant T] [--store URL] [--lease DUR]\n"
    "                [--retention DUR] [--on-unknown fail|rerun]\n"
    "                [--max-output SIZE] [--kill-after DUR]\n"
    "                [--stdin hash|ignore] [--max-input SIZE]\n"
    "                [--stdin-wait DUR] -- CMD [ARG...]\n"
    "\n"
    "Runs CMD at most once per KEY. The first run executes CMD (no shell\n"
    "unless you run one), streams its standard output and error live while\n"
    "capturing them, stores its exit status, and exits with it. A retry with\n"
    "the same KEY replays the captured output byte for byte and exits with\n"
    "the stored status, without running CMD.\n"
    "\n"
    "The request is CMD's argv, plus the SHA-256 of standard input when it\n"
    "has any bytes (an empty, closed or terminal input is no input). CMD\n"
    "gets the same bytes, or /dev/null when there are none.\n"
    "\n"
    "CMD runs in a process group of its own. SIGINT, SIGTERM and SIGHUP\n"
    "sent to idem run are passed on to that group (Ctrl-C on a terminal\n"
    "reaches CMD that way); if the group has not ended --kill-after later,\n"
    "it is killed. The key is then marked unknown. If idem run is killed,\n"
    "the group is killed too (see docs/run.md for the limits).\n"
    "\n"
    "  --key KEY          the operation key: 1-255 printable ASCII bytes\n"
    "  --tenant T         scope of the key (default \"\")\n"
    "  --store URL        default: IDEM_STORE, else ./idem.db\n"
    "  --lease DUR        how long a run owns the key without renewing it\n"
    "                     (default 30s); renewed until CMD has ended. A run\n"
    "                     that cannot renew it in time (taken over, store\n"
    "                     unreachable) stops CMD and exits 5\n"
    "  --retention DUR    how long the result is kept (default 24h)\n"
    "  --on-unknown fail  (default) a key whose earlier run has not reported\n"
    "                     a result is refused as outcome unknown\n"
    "  --on-unknown rerun run CMD again in that case\n"
    "  --max-output SIZE  output kept for replay, stdout and stderr together\n"
    "                     (default 8M; output beyond it is still shown, and\n"
    "                     the record says it was cut)\n"
    "  --kill-after DUR   from passing a signal on to SIGKILL (default 10s)\n"
    "  --stdin hash       (default) read standard input to its end, within\n"
    "                     --max-input, as part of the request\n"
    "  --stdin ignore     neither read standard input nor count it in the\n"
    "                     request; CMD gets /dev/null\n"
    "  --max-input SIZE   the most standard input read (default 64M)\n"
    "  --stdin-wait DUR   how long standard input may stay silent, neither\n"
    "                     sending bytes nor ending, before idem run gives up\n"
    "                     (default 10s)\n"
    "DUR is 250ms, 30s, 5m, 24h or 7d. SIZE is bytes, or with k, M, G suffix.\n"
    "\n"
    "Exit status: CMD's own status (128+N when a signal N ended it), live\n"
    "or replayed; otherwise\n"
    "    2  usage\n"
    "    3  the key was used with another command or input (nothing ran)\n"
    "    4  outcome unknown: an earlier run has not reported a result (it\n"
    "       may still be running or may have died); nothing ran. See `idem\n"
    "       keys resolve` and --on-unknown rerun\n"
    "    5  CMD ran (or was stopped after its lease was lost) but its result\n"
    "       was not recorded; the key is marked unknown where the store\n"
    "       allowed it. Do not assume either outcome\n"
    "   75  the key is in flight in another run, or the store is busy:\n"
    "       retry later\n"
    "  125  idem failed before running CMD (bad store, standard input too\n"
    "       large or silent, ...); nothing ran and nothing was stored\n"
    "  126  CMD could not be executed; 127  CMD was not found\n"
    "       (in both cases nothing ran and the key is free again, unless\n"
    "       --on-unknown rerun took it over: an earlier run may have acted)\n"
    "  128+N  idem run got signal N while CMD ran: CMD was stopped and the\n"
    "       key marked unknown\n";

typedef enum stdin_mode { STDIN_HASH = 0, STDIN_IGNORE = 1 } stdin_mode;

typedef struct run_opts {
  const char *key, *tenant, *store;
  int64_t lease_ms, retention_ms, kill_after_ms, stdin_wait_ms;
  int rerun;
  stdin_mode stdin_mode;
  size_t max_output, max_input;
} run_opts;

static void hex32(const unsigned char *md, char hex[IDEM_FINGERPRINT_SIZE]) {
  static const char digits[] = "0123456789abcdef";
  for (unsigned i = 0; i < 32; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = '\0';
}

/*
 * Reads standard input to its end into an unlinked temporary file while
 * hashing it: the fingerprint must be known before CMD runs, and CMD then
 * reads the same bytes from the file. At most o->max_input bytes are read,
 * and input that stays silent (no bytes, no end) for o->stdin_wait_ms is
 * given up on. On success *fd_out is the file, rewound, or -1 when there was
 * no input (a terminal, a closed descriptor, or no bytes), and hex holds the
 * SHA-256 when there was. Returns 0, or -1 after printing why.
 */
static int read_stdin(const run_opts *o, int *fd_out,
                      char hex[IDEM_FINGERPRINT_SIZE]) {
  const char *dir = getenv("TMPDIR");
  char path[4096], buf[65536];
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  struct stat st;
  EVP_MD_CTX *ctx = NULL;
  size_t total = 0;
  int fd = -1;
  *fd_out = -1;
  hex[0] = '\0';
  if (o->stdin_mode == STDIN_IGNORE || fstat(STDIN_FILENO, &st) != 0 ||
      isatty(STDIN_FILENO))
    return 0;
  if (!dir || !*dir)
    dir = "/tmp";
  snprintf(path, sizeof path, "%s/idem-run-stdin.XXXXXX", dir);
  ctx = EVP_MD_CTX_new();
  fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0 || !ctx) {
    cli_error("run", "cannot keep standard input in %s: %s", dir,
              strerror(errno));
    goto fail;
  }
  unlink(path);
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  for (;;) {
    struct pollfd p = {STDIN_FILENO, POLLIN, 0};
    int w = o->stdin_wait_ms > 600000 ? 600000 : (int)o->stdin_wait_ms;
    double quiet_until = cli_now_ms() + (double)o->stdin_wait_ms;
    int n_ready;
    while ((n_ready = poll(&p, 1, w)) == 0 || (n_ready < 0 && errno == EINTR)) {
      double left = quiet_until - cli_now_ms();
      if (left <= 0) {
        cli_error("run",
                  "standard input sent nothing for %.1fs and did not end; "
                  "nothing was run (for a command that reads no input, use "
                  "--stdin ignore or </dev/null; for slow input, a longer "
                  "--stdin-wait)",
                  (double)o->stdin_wait_ms / 1000);
        goto fail;
      }
      w = left > 600000 ? 600000 : (int)left + 1;
    }
    if (n_ready < 0) {
      cli_error("run", "cannot read standard input: %s", strerror(errno));
      goto fail;
    }
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      cli_error("run", "cannot read standard input: %s", strerror(errno));
      goto fail;
    }
    if (n == 0)
      break;
    total += (size_t)n;
    if (total > o->max_input) {
      cli_error("run",
                "standard input is larger than --max-input (%zu bytes); "
                "nothing was run",
                o->max_input);
      goto fail;
    }
    EVP_DigestUpdate(ctx, buf, (size_t)n);
    if (cli_write_all(fd, buf, (size_t)n) != 0) {
      cli_error("run", "cannot keep standard input in %s: %s", dir,
                strerror(errno));
      goto fail;
    }
  }
  EVP_DigestFinal_ex(ctx, md, &mdlen);
  EVP_MD_CTX_free(ctx);
  if (total == 0) {
    /* No bytes is no input, like /dev/null or a terminal. */
    close(fd);
    return 0;
  }
  hex32(md, hex);
  if (lseek(fd, 0, SEEK_SET) != 0) {
    cli_error("run", "cannot rewind standard input: %s", strerror(errno));
    close(fd);
    return -1;
  }
  *fd_out = fd;
  return 0;
fail:
  EVP_MD_CTX_free(ctx);
  if (fd >= 0)
    close(fd);
  return -1;
}

/*
 * The request, as JSON (idem_execute() canonicalises and fingerprints it):
 * {"argv": [...], "stdin": HEX or null}.
 * An argument that is not UTF-8 is written {"hex": "..."}, its bytes in
 * hex, so that no two argv vectors share a request.
 */
static int make_request(char **argv, int argc, const char *stdin_hex,
                        char **req, size_t *req_len) {
  static const char digits[] = "0123456789abcdef";
  json_t *args = json_array(), *o = NULL;
  char *text = NULL;
  int rc = -1;
  *req = NULL;
  *req_len = 0;
  if (!args)
    return -1;
  for (int i = 0; i < argc; i++) {
    json_t *s = json_string(argv[i]);
    if (!s) {
      size_t n = strlen(argv[i]);
      char *h = malloc(2 * n + 1);
      if (!h)
        goto out;
      for (size_t j = 0; j < n; j++) {
        h[2 * j] = digits[(unsigned char)argv[i][j] >> 4];
        h[2 * j + 1] = digits[(unsigned char)argv[i][j] & 15];
      }
      h[2 * n] = '\0';
      s = json_pack("{s:s}", "hex", h);
      free(h);
    }
    if (!s || json_array_append_new(args, s) != 0)
      goto out;
  }
  o = json_pack("{s:O,s:s?}", "argv", args, "stdin", stdin_hex);
  text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
  if (!text)
    goto out;
  *req = text;
  *req_len = strlen(text);
  text = NULL;
  rc = 0;
out:
  free(text);
  json_decref(o);
  json_decref(args);
  return rc;
}

/*
 * Reads a stored run: how many bytes of the body are standard output (the
 * rest is standard error) and whether the output was cut. The metadata is
 * {"stdout": N, "stderr": N, "truncated": BOOL}, as run_action() writes
 * it; without metadata (an operator's `idem keys resolve --completed`) the
 * whole body is standard output. Returns 0, or -1 when the record is not
 * one `idem run` wrote (metadata that is not JSON, or an output length
 * outside the body).
 */
static int decode_record(const idem_response *r, size_t *out_len,
                         int *truncated) {
  json_error_t e;
  json_t *meta = r->meta ? json_loadb(r->meta, r->meta_len, 0, &e) : NULL;
  json_int_t n = meta ? json_integer_value(json_object_get(meta, "stdout"))
                      : (json_int_t)r->body_len;
  int bad = r->meta && !meta;
  *truncated = meta && json_is_true(json_object_get(meta, "truncated"));
  json_decref(meta);
  *out_len = 0;
  if (bad || n < 0 || (uint64_t)n > r->body_len)
    return -1;
  *out_len = (size_t)n;
  return 0;
}

/* Replays a stored run: its output, then its status. */
static int replay(const idem_response *r) {
  size_t out_len;
  int truncated;
  if (decode_record(r, &out_len, &truncated) != 0) {
    cli_error("run", "the stored result is not one `idem run` wrote");
    return EXIT_RUN_ERROR;
  }
  signal(SIGPIPE, SIG_IGN);
  cli_write_all(STDOUT_FILENO, r->body, out_len);
  cli_write_all(STDERR_FILENO, (const char *)r->body + out_len,
                r->body_len - out_len);
  if (truncated)
    cli_error("run", "note: the recorded output was truncated; only its "
                     "first bytes were kept");
  return r->status;
}

static int parse(int argc, char **argv, run_opts *o, int *cmd_index) {
  memset(o, 0, sizeof *o);
  o->tenant = "";
  o->max_output = 8u * 1024 * 1024;
  o->max_input = 64u * 1024 * 1024;
  o->kill_after_ms = 10000;
  o->stdin_wait_ms = 10000;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      *cmd_index = i + 1;
      return i + 1 < argc ? 0 : -1;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
      return 1;
    if (i + 1 >= argc) {
      cli_error("run", "%s: needs a value, or CMD is missing after --", a);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(a, "--key") == 0) {
      o->key = v;
    } else if (strcmp(a, "--tenant") == 0) {
      if (cli_check_tenant("run", v) != 0)
        return -1;
      o->tenant = v;
    } else if (strcmp(a, "--store") == 0) {
      if (cli_store_option("run", v, &o->store) != 0)
        return -1;
    } else if (strcmp(a, "--lease") == 0) {
      if (cli_duration_option("run", a, v, 100, IDEM_MAX_LEASE_MS,
                              &o->lease_ms) != 0)
        return -1;
    } else if (strcmp(a, "--retention") == 0) {
      if (cli_duration_option("run", a, v, 1, IDEM_MAX_RETENTION_MS,
                              &o->retention_ms) != 0)
        return -1;
    } else if (strcmp(a, "--on-unknown") == 0) {
      if (strcmp(v, "rerun") == 0)
        o->rerun = 1;
      else if (strcmp(v, "fail") != 0) {
        cli_error("run", "--on-unknown: fail or rerun");
        return -1;
      }
    } else if (strcmp(a, "--max-output") == 0) {
      if (cli_parse_size(v, IDEM_MAX_RESPONSE - 4096, &o->max_output)) {
        cli_error("run", "--max-output: bytes (k and M suffixes), at most "
                         "about 16M");
        return -1;
      }
    } else if (strcmp(a, "--kill-after") == 0) {
      if (cli_duration_option("run", a, v, 0, 86400000, &o->kill_after_ms) != 0)
        return -1;
    } else if (strcmp(a, "--stdin") == 0) {
      if (strcmp(v, "hash") == 0)
        o->stdin_mode = STDIN_HASH;
      else if (strcmp(v, "ignore") == 0)
        o->stdin_mode = STDIN_IGNORE;
      else {
        cli_error("run", "--stdin: hash or ignore");
        return -1;
      }
    } else if (strcmp(a, "--max-input") == 0) {
      if (cli_parse_size(v, (size_t)1 << 40, &o->max_input)) {
        cli_error("run", "--max-input: bytes (k, M and G suffixes)");
        return -1;
      }
    } else if (strcmp(a, "--stdin-wait") == 0) {
      if (cli_duration_option("run", a, v, 1, 86400000, &o->stdin_wait_ms) != 0)
        return -1;
    } else {
      cli_error("run", "unknown option '%s'", a);
      return -1;
    }
  }
  cli_error("run", "missing -- CMD");
  return -1;
}

/* One run of the command while the key is held, and what it produced. */
typedef struct run_job {
  const run_opts *o;
  char **cmd;
  int stdin_fd;
  int ran; /* the action was called (the key was held) */
  idem_exec_result verdict;
  run_child_result res;
  char meta[160];
  char *body;
} run_job;

/*
 * The action idem_execute() runs while it holds the key and renews its
 * lease: runs the command until it ends, polling the descriptor that says
 * the lease was lost. It ran to its end: DONE, with the status and stdout
 * and stderr in one body (the metadata says where stdout ends and whether
 * anything was cut). It never started: NOT_DONE. It was stopped by a
 * signal or a lost lease: UNKNOWN, since it may have acted.
 */
static idem_exec_result run_action(idem_exec *x, void *ctx,
                                   idem_response *response) {
  run_job *j = ctx;
  run_child_opts co = {j->cmd, j->stdin_fd, j->o->max_output,
                       j->o->kill_after_ms, idem_exec_lost_fd(x)};
  run_child_result *r = &j->res;
  j->ran = 1;
  if (idem_exec_outcome(x) == IDEM_RECOVER)
    cli_error("run",
              "key '%s': an earlier run has not reported a result; "
              "running the command again (--on-unknown rerun)",
              j->o->key);
  run_child(&co, r);
  if (r->end == RUN_NOT_STARTED)
    return j->verdict = IDEM_EXEC_NOT_DONE;
  if (r->end != RUN_EXITED)
    return j->verdict = IDEM_EXEC_UNKNOWN;
  j->body = malloc(r->out_len + r->err_len + 1);
  if (!j->body) {
    /* The status at least is recorded; the output counts as cut. */
    r->out_len = r->err_len = 0;
    r->truncated = 1;
  }
  snprintf(j->meta, sizeof j->meta,
           "{\"stderr\":%zu,\"stdout\":%zu,\"truncated\":%s}", r->err_len,
           r->out_len, r->truncated ? "true" : "false");
  if (r->out_len)
    memcpy(j->body, r->out, r->out_len);
  if (r->err_len)
    memcpy(j->body + r->out_len, r->err, r->err_len);
  response->status = r->status;
  response->meta = j->meta;
  response->meta_len = strlen(j->meta);
  response->body = j->body;
  response->body_len = r->out_len + r->err_len;
  return j->verdict = IDEM_EXEC_DONE;
}

static void run_job_free(run_job *j) {
  run_child_result_free(&j->res);
  free(j->body);
  j->body = NULL;
}

/*
 * The exit status once the action ran, and what to say: rc is what
 * idem_execute() returned, whose idem_errmsg() tells (when not IDEM_OK)
 * what became of the key.
 */
static int ran_status(const run_job *j, int rc) {
  const run_child_result *r = &j->res;
  const char *key = j->o->key, *cmd = j->cmd[0];
  char detail[768];
  snprintf(detail, sizeof detail, "%s (%s)", idem_errmsg(), idem_rc_name(rc));
  switch (j->verdict) {
  case IDEM_EXEC_NOT_DONE:
    if (rc != IDEM_OK)
      cli_error("run", "warning: key '%s' could not be freed for a retry: %s",
                key, detail);
    if (r->signal) {
      cli_error("run",
                "stopped by signal %d before the command started; "
                "nothing ran",
                r->signal);
      return 128 + r->signal;
    }
    if (r->exec_failed) {
      cli_error("run", "%s: %s", cmd, strerror(r->exec_errno));
      return r->exec_errno == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
    }
    cli_error("run", "cannot start %s: %s", cmd, strerror(r->exec_errno));
    return EXIT_RUN_ERROR;
  case IDEM_EXEC_UNKNOWN:
    if (r->end == RUN_INTERRUPTED) {
      cli_error("run",
                "stopped by signal %d: the command was stopped and may have "
                "acted; %s (see `idem keys resolve %s`)",
                r->signal, rc == IDEM_OK ? "the key is marked unknown" : detail,
                key);
      return 128 + r->signal;
    }
    cli_error("run",
              "key '%s': the command was stopped after the lease was lost; "
              "it ran but its result was not recorded; %s",
              key, rc == IDEM_OK ? "the key is marked unknown" : detail);
    return EXIT_NOT_RECORDED;
  case IDEM_EXEC_DONE:
  default:
    break;
  }
  if (rc != IDEM_OK) {
    cli_error("run",
              "key '%s': the command ran but its result was not recorded "
              "(it exited with status %d): %s",
              key, r->status, detail);
    return EXIT_NOT_RECORDED;
  }
  if (r->truncated)
    cli_error("run",
              "note: output beyond %zu bytes was shown but not kept "
              "for replay",
              j->o->max_output);
  return r->status;
}

static int run(int argc, char **argv) {
  run_opts o;
  int cmd_index = 0, stdin_fd = -1, status = EXIT_RUN_ERROR, rc;
  char stdin_hex[IDEM_FINGERPRINT_SIZE];
  char *req = NULL;
  size_t req_len = 0;
  idem_store *store = NULL;
  idem_call *call = NULL;
  idem_execute_options eo;
  run_job job;
  memset(&job, 0, sizeof job);
  memset(&eo, 0, sizeof eo);

  rc = parse(argc, argv, &o, &cmd_index);
  if (rc == 1) {
    fputs(usage, stdout);
    return EXIT_OK;
  }
  if (rc != 0) {
    fputs("(see `idem run --help`)\n", stderr);
    return EXIT_USAGE;
  }
  if (!o.key) {
    cli_error("run", "--key KEY is required");
    return EXIT_USAGE;
  }
  if (idem_key_check(o.key) != IDEM_OK) {
    cli_error("run", "%s", idem_errmsg());
    return EXIT_USAGE;
  }
  char **cmd = argv + cmd_index;
  int ncmd = argc - cmd_index;

  /* A closed standard descriptor would be reused by the first file idem
   * opens; /dev/null takes its place (a closed stdin is then no input). */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF &&
        open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) != fd) {
      cli_error("run", "cannot open /dev/null: %s", strerror(errno));
      return EXIT_RUN_ERROR;
    }
  if (read_stdin(&o, &stdin_fd, stdin_hex) != 0)
    return EXIT_RUN_ERROR;
  if (make_request(cmd, ncmd, stdin_fd >= 0 ? stdin_hex : NULL, &req,
                   &req_len) != 0) {
    cli_error("run", "cannot build the request");
    goto out;
  }
  rc = idem_store_open(cli_store_url(o.store), NULL, &store);
  if (rc != IDEM_OK) {
    cli_idem_error("run", "open store", rc);
    status = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE ? EXIT_TEMPFAIL
                                                         : EXIT_RUN_ERROR;
    goto out;
  }
  idem_id id = {o.tenant, "run", o.key};
  eo.call.lease_ms = o.lease_ms;
  eo.call.retention_ms = o.retention_ms;
  eo.call.on_expired_lease =
      o.rerun ? IDEM_EXPIRED_TAKE_OVER : IDEM_EXPIRED_REPORT;
  eo.call.takeover_unknown = o.rerun;
  job.o = &o;
  job.cmd = cmd;
  job.stdin_fd = stdin_fd;
  signal(SIGPIPE, SIG_IGN);
  /* From the claim to the recorded result, signals are noted rather than
   * acted on (run_child() acts on them while the command runs): one that
   * comes while the key is claimed keeps the command from starting; one
   * that comes while the result is recorded waits until it is. */
  if (run_signals_hold() != 0) {
    cli_error("run", "cannot set up signal handling: %s", strerror(errno));
    goto out;
  }
  rc = idem_execute(store, &id, req, req_len, run_action, &job, &eo, &call);
  int late = run_signals_release();
  if (!call) {
    cli_idem_error("run", "claim", rc);
    status = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE ? EXIT_TEMPFAIL
                                                         : EXIT_RUN_ERROR;
    goto out;
  }
  if (job.ran) {
    status = ran_status(&job, rc);
    if (late)
      cli_error("run",
                "note: signal %d came while the result was being "
                "recorded; it was let finish",
                late);
    goto out;
  }
  if (late) {
    cli_error("run", "stopped by signal %d; nothing was run", late);
    status = 128 + late;
    goto out;
  }
  switch (idem_call_outcome(call)) {
  case IDEM_REPLAY:
    status = replay(idem_call_response(call));
    break;
  case IDEM_CONFLICT:
    cli_error("run",
              "key '%s' was already used with another command or input; "
              "nothing was run (use a new key for a new intention)",
              o.key);
    status = EXIT_CONFLICT;
    break;
  case IDEM_IN_FLIGHT:
    cli_error("run", "key '%s' is in flight in another run; retry in %.1fs",
              o.key, idem_call_retry_after_ms(call) / 1000.0);
    status = EXIT_TEMPFAIL;
    break;
  case IDEM_UNKNOWN:
    cli_error("run",
              "key '%s': outcome unknown: an earlier run has not reported a "
              "result: it may still be running or may have died, so the "
              "command may or may not have acted. Nothing was run. Check its "
              "effects, then either `idem keys resolve %s --failed` (or "
              "--completed), or retry with --on-unknown rerun",
              o.key, o.key);
    status = EXIT_UNKNOWN;
    break;
  default:
    cli_error("run", "key '%s': unexpected outcome %s", o.key,
              idem_outcome_name(idem_call_outcome(call)));
    break;
  }
out:
  run_job_free(&job);
  idem_call_free(call);
  idem_store_close(store);
  free(req);
  if (stdin_fd >= 0)
    close(stdin_fd);
  return status;
}

const cli_command cmd_run = {"run", run, "run a command at most once per key",
                             usage};
