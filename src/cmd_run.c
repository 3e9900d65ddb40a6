/*
 * cmd_run.c -- `idem run`: at-most-once execution of a command.
 *
 * The first run claims the key, runs the command with its output streaming
 * through live and captured, and stores the exit status and the output. A
 * retry with the same key and request replays the output and the status
 * without running anything.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>

enum {
  EXIT_RUN_ERROR = 125,   /* idem itself failed; CMD did not run */
  EXIT_CANNOT_EXEC = 126, /* CMD found but could not be run */
  EXIT_NOT_FOUND = 127    /* CMD not found */
};

static const char usage[] =
    "usage: idem run --key KEY [--tenant T] [--store URL] [--lease DUR]\n"
    "                [--retention DUR] [--on-unknown fail|rerun]\n"
    "                [--max-output SIZE] -- CMD [ARG...]\n"
    "\n"
    "Runs CMD at most once per KEY. The first run executes CMD (no shell\n"
    "unless you run one), streams its standard output and error live while\n"
    "capturing them, stores its exit status, and exits with it. A retry with\n"
    "the same KEY replays the captured output byte for byte and exits with\n"
    "the stored status, without running CMD.\n"
    "\n"
    "The request is CMD's argv, plus the SHA-256 of standard input when it\n"
    "is not a terminal (the input is passed on to CMD).\n"
    "\n"
    "  --key KEY          the operation key: 1-255 printable ASCII bytes\n"
    "  --tenant T         scope of the key (default \"\")\n"
    "  --store URL        default: IDEM_STORE, else ./idem.db\n"
    "  --lease DUR        how long a run owns the key without renewing it\n"
    "                     (default 30s); renewed while CMD runs\n"
    "  --retention DUR    how long the result is kept (default 24h)\n"
    "  --on-unknown fail  (default) a run that died without a result is\n"
    "                     refused as outcome unknown\n"
    "  --on-unknown rerun run CMD again in that case\n"
    "  --max-output SIZE  output kept for replay (default 8M; output beyond\n"
    "                     it is still shown, and the record says so)\n"
    "DUR is 250ms, 30s, 5m, 24h or 7d. SIZE is bytes, or with k, M suffix.\n"
    "\n"
    "Exit status: CMD's own status (128+N when a signal N ended it), live\n"
    "or replayed; otherwise\n"
    "    2  usage\n"
    "    3  the key was used with another command or input (nothing ran)\n"
    "    4  outcome unknown: an earlier run died without a result (nothing\n"
    "       ran; see `idem keys resolve` and --on-unknown rerun)\n"
    "   75  the key is in flight in another run, or the store is busy:\n"
    "       retry later\n"
    "  125  idem failed before running CMD (bad store, ...)\n"
    "  126  CMD could not be executed; 127  CMD was not found\n"
    "       (in both cases nothing ran and the key is free again)\n";

static volatile sig_atomic_t got_signal;

static void on_signal(int sig) { got_signal = sig; }

typedef struct capture {
  char *buf;
  size_t len, cap, limit;
  int truncated;
} capture;

static void capture_add(capture *c, const char *p, size_t n) {
  if (c->len + n > c->limit) {
    c->truncated = 1;
    n = c->len < c->limit ? c->limit - c->len : 0;
  }
  if (n == 0)
    return;
  if (c->len + n > c->cap) {
    size_t ncap = c->cap ? c->cap : 65536;
    while (ncap < c->len + n)
      ncap *= 2;
    char *nb = realloc(c->buf, ncap);
    if (!nb) {
      c->truncated = 1;
      return;
    }
    c->buf = nb;
    c->cap = ncap;
  }
  memcpy(c->buf + c->len, p, n);
  c->len += n;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/*
 * Copies standard input, when it is not a terminal, into an unlinked
 * temporary file while hashing it: the fingerprint must be known before
 * CMD runs, and CMD then reads the same bytes from the file.
 */
static int spool_stdin(int *fd_out, char hex[IDEM_FINGERPRINT_SIZE]) {
  static const char digits[] = "0123456789abcdef";
  char path[] = "/tmp/idem-run-stdin.XXXXXX", buf[65536];
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int fd = mkstemp(path);
  ssize_t n;
  *fd_out = -1;
  if (fd < 0 || !ctx) {
    EVP_MD_CTX_free(ctx);
    if (fd >= 0)
      close(fd);
    return -1;
  }
  unlink(path);
  EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  while ((n = read(STDIN_FILENO, buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR)
        continue;
      goto fail;
    }
    EVP_DigestUpdate(ctx, buf, (size_t)n);
    if (write_all(fd, buf, (size_t)n) != 0)
      goto fail;
  }
  EVP_DigestFinal_ex(ctx, md, &mdlen);
  EVP_MD_CTX_free(ctx);
  for (unsigned i = 0; i < 32; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = '\0';
  if (lseek(fd, 0, SEEK_SET) != 0) {
    close(fd);
    return -1;
  }
  *fd_out = fd;
  return 0;
fail:
  EVP_MD_CTX_free(ctx);
  close(fd);
  return -1;
}

/*
 * The request: {"argv": [...], "stdin": HEX or null} as canonical JSON when
 * every argument is UTF-8; otherwise the arguments' raw bytes, each with its
 * length, so that no two different argv vectors share a fingerprint.
 */
static int make_request(char **argv, int argc, const char *stdin_hex,
                        char **req, size_t *req_len,
                        char fp[IDEM_FINGERPRINT_SIZE]) {
  json_t *args = json_array(), *o;
  char *text;
  int utf8 = 1, rc;
  *req = NULL;
  *req_len = 0;
  for (int i = 0; i < argc && utf8; i++) {
    json_t *s = json_string(argv[i]);
    if (!s)
      utf8 = 0;
    else
      json_array_append_new(args, s);
  }
  if (utf8) {
    o = json_pack("{s:o,s:s?}", "argv", args, "stdin", stdin_hex);
    text = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    if (!text)
      return -1;
    rc = idem_canonicalize(text, strlen(text), NULL, req, req_len, NULL);
    free(text);
    if (rc != IDEM_OK)
      return -1;
    return idem_sha256_hex(*req, *req_len, fp) == IDEM_OK ? 0 : -1;
  }
  json_decref(args);
  size_t total = 0, off = 0;
  for (int i = 0; i < argc; i++)
    total += 24 + strlen(argv[i]);
  total += 80;
  char *raw = malloc(total);
  if (!raw)
    return -1;
  for (int i = 0; i < argc; i++)
    off += (size_t)snprintf(raw + off, total - off, "%zu:%s\n",
                            strlen(argv[i]), argv[i]);
  off += (size_t)snprintf(raw + off, total - off, "stdin:%s\n",
                          stdin_hex ? stdin_hex : "none");
  rc = idem_sha256_hex(raw, off, fp);
  free(raw);
  return rc == IDEM_OK ? 0 : -1;
}

static int parse_size(const char *s, size_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return -1;
  if (*end == 'k' || *end == 'K')
    v *= 1024, end++;
  else if (*end == 'M' || *end == 'm')
    v *= 1024 * 1024, end++;
  if (*end || v > IDEM_MAX_RESPONSE - 4096)
    return -1;
  *out = (size_t)v;
  return 0;
}

/* Replays a stored run: its output, then its status. */
static int replay(const idem_response *r) {
  json_error_t e;
  json_t *meta = r->meta ? json_loadb(r->meta, r->meta_len, 0, &e) : NULL;
  /* Without metadata (an operator's `idem keys resolve --completed`), the
   * whole body is standard output. */
  json_int_t out_len =
      meta ? json_integer_value(json_object_get(meta, "stdout"))
           : (json_int_t)r->body_len;
  int truncated = meta && json_is_true(json_object_get(meta, "truncated"));
  int bad = r->meta && !meta;
  json_decref(meta);
  if (bad || out_len < 0 || (size_t)out_len > r->body_len) {
    cli_error("run", "the stored result is not one `idem run` wrote");
    return EXIT_RUN_ERROR;
  }
  signal(SIGPIPE, SIG_IGN);
  write_all(STDOUT_FILENO, r->body, (size_t)out_len);
  write_all(STDERR_FILENO, (const char *)r->body + out_len,
            r->body_len - (size_t)out_len);
  if (truncated)
    cli_error("run", "note: the recorded output was truncated; only its "
                     "first bytes were kept");
  return r->status;
}

typedef struct run_opts {
  const char *key, *tenant, *store;
  int64_t lease_ms, retention_ms;
  int rerun;
  size_t max_output;
} run_opts;

static int parse(int argc, char **argv, run_opts *o, int *cmd_index) {
  memset(o, 0, sizeof *o);
  o->tenant = "";
  o->max_output = 8u * 1024 * 1024;
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
    if (strcmp(a, "--key") == 0)
      o->key = v;
    else if (strcmp(a, "--tenant") == 0)
      o->tenant = v;
    else if (strcmp(a, "--store") == 0)
      o->store = v;
    else if (strcmp(a, "--lease") == 0) {
      if (cli_parse_duration(v, &o->lease_ms) || o->lease_ms < 100) {
        cli_error("run", "--lease: a duration of at least 100ms");
        return -1;
      }
    } else if (strcmp(a, "--retention") == 0) {
      if (cli_parse_duration(v, &o->retention_ms) || o->retention_ms < 1) {
        cli_error("run", "--retention: a positive duration");
        return -1;
      }
    } else if (strcmp(a, "--on-unknown") == 0) {
      if (strcmp(v, "rerun") == 0)
        o->rerun = 1;
      else if (strcmp(v, "fail") != 0) {
        cli_error("run", "--on-unknown: fail or rerun");
        return -1;
      }
    } else if (strcmp(a, "--max-output") == 0) {
      if (parse_size(v, &o->max_output)) {
        cli_error("run", "--max-output: bytes (k and M suffixes), at most "
                         "about 16M");
        return -1;
      }
    } else {
      cli_error("run", "unknown option '%s'", a);
      return -1;
    }
  }
  cli_error("run", "missing -- CMD");
  return -1;
}

/* Starts CMD with stdout and stderr on pipes. Returns the pid, or -1 with
 * *exec_errno set when CMD could not be executed. */
static pid_t start(char **cmd, int stdin_fd, int out[2], int err[2],
                   int *exec_errno) {
  int report[2];
  pid_t parent = getpid(), pid;
  *exec_errno = 0;
  if (pipe(out) || pipe(err) || pipe2(report, O_CLOEXEC))
    return -1;
  fflush(NULL);
  pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    /* CMD dies with idem run, even when idem run is killed with SIGKILL:
     * a retry must never find a command still running unowned. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(EXIT_RUN_ERROR);
    signal(SIGPIPE, SIG_DFL);
    if (stdin_fd >= 0)
      dup2(stdin_fd, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    close(report[0]);
    execvp(cmd[0], cmd);
    int e = errno;
    if (write(report[1], &e, sizeof e) != (ssize_t)sizeof e)
      _exit(EXIT_RUN_ERROR);
    _exit(EXIT_RUN_ERROR);
  }
  close(out[1]);
  close(err[1]);
  close(report[1]);
  int e = 0;
  ssize_t n;
  while ((n = read(report[0], &e, sizeof e)) < 0 && errno == EINTR)
    ;
  close(report[0]);
  if (n == (ssize_t)sizeof e) {
    waitpid(pid, NULL, 0);
    close(out[0]);
    close(err[0]);
    *exec_errno = e;
    return -1;
  }
  return pid;
}

static int run(int argc, char **argv) {
  run_opts o;
  int cmd_index = 0, stdin_fd = -1, status = EXIT_RUN_ERROR, rc;
  char stdin_hex[IDEM_FINGERPRINT_SIZE], fp[IDEM_FINGERPRINT_SIZE];
  char *req = NULL;
  size_t req_len = 0;
  idem_store *store = NULL;
  idem_call *call = NULL;
  idem_call_options co = {0};
  capture cout = {0}, cerr = {0};

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

  /* A closed standard input (fstat fails) is no input, like a terminal. */
  struct stat st_in;
  if (fstat(STDIN_FILENO, &st_in) == 0 && !isatty(STDIN_FILENO)) {
    if (spool_stdin(&stdin_fd, stdin_hex) != 0) {
      cli_error("run", "cannot read standard input: %s", strerror(errno));
      return EXIT_RUN_ERROR;
    }
  }
  if (make_request(cmd, ncmd, stdin_fd >= 0 ? stdin_hex : NULL, &req,
                   &req_len, fp) != 0) {
    cli_error("run", "cannot build the request fingerprint");
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
  co.lease_ms = o.lease_ms;
  co.retention_ms = o.retention_ms;
  co.request = req;
  co.request_len = req_len;
  co.on_expired_lease = o.rerun ? IDEM_EXPIRED_TAKE_OVER : IDEM_EXPIRED_REPORT;
  co.takeover_unknown = o.rerun;
  rc = idem_claim(store, &id, fp, &co, &call);
  if (rc != IDEM_OK) {
    cli_idem_error("run", "claim", rc);
    status = rc == IDEM_EBUSY || rc == IDEM_EUNAVAILABLE ? EXIT_TEMPFAIL
                                                         : EXIT_RUN_ERROR;
    goto out;
  }
  switch (idem_call_outcome(call)) {
  case IDEM_REPLAY:
    status = replay(idem_call_response(call));
    goto out;
  case IDEM_CONFLICT:
    cli_error("run",
              "key '%s' was already used with another command or input; "
              "nothing was run (use a new key for a new intention)",
              o.key);
    status = EXIT_CONFLICT;
    goto out;
  case IDEM_IN_FLIGHT:
    cli_error("run", "key '%s' is in flight in another run; retry in %.1fs",
              o.key, idem_call_retry_after_ms(call) / 1000.0);
    status = EXIT_TEMPFAIL;
    goto out;
  case IDEM_UNKNOWN:
    cli_error("run",
              "key '%s': outcome unknown: an earlier run started and ended "
              "without a result, so the command may or may not have acted. "
              "Nothing was run. Check its effects, then either `idem keys "
              "resolve %s --failed` (or --completed), or retry with "
              "--on-unknown rerun",
              o.key, o.key);
    status = EXIT_UNKNOWN;
    goto out;
  case IDEM_RECOVER:
    cli_error("run", "key '%s': an earlier run ended without a result; "
                     "running the command again (--on-unknown rerun)",
              o.key);
    break;
  default:
    break;
  }

  /* PROCEED or RECOVER: this run holds the key. */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  int out[2], err[2], exec_errno = 0;
  pid_t pid = start(cmd, stdin_fd, out, err, &exec_errno);
  if (pid < 0) {
    /* Nothing ran: free the key so that a retry may act. */
    idem_release(store, call);
    if (exec_errno) {
      cli_error("run", "%s: %s", cmd[0], strerror(exec_errno));
      status = exec_errno == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_EXEC;
    } else {
      cli_error("run", "cannot start %s: %s", cmd[0], strerror(errno));
    }
    goto out;
  }

  int64_t lease = o.lease_ms ? o.lease_ms : 30000;
  double next_renew = cli_now_ms() + (double)lease / 3;
  struct pollfd pfd[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2, stdout_ok = 1, stderr_ok = 1;
  cout.limit = o.max_output;
  cerr.limit = o.max_output;
  while (open_fds > 0 && !got_signal) {
    int wait = (int)(next_renew - cli_now_ms());
    if (wait < 0)
      wait = 0;
    int n = poll(pfd, 2, wait);
    if (n < 0 && errno != EINTR)
      break;
    if (cli_now_ms() >= next_renew) {
      /* Renew so that a long command is never taken over while alive. */
      if (idem_renew(store, call, lease) != IDEM_OK)
        cli_error("run", "warning: cannot renew the lease: %s",
                  idem_errmsg());
      next_renew = cli_now_ms() + (double)lease / 3;
    }
    for (int i = 0; i < 2 && n > 0; i++) {
      char buf[65536];
      if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      ssize_t r = read(pfd[i].fd, buf, sizeof buf);
      if (r <= 0) {
        if (r < 0 && errno == EINTR)
          continue;
        close(pfd[i].fd);
        pfd[i].fd = -1;
        open_fds--;
        continue;
      }
      int *ok = i == 0 ? &stdout_ok : &stderr_ok;
      if (*ok && write_all(i == 0 ? STDOUT_FILENO : STDERR_FILENO, buf,
                           (size_t)r) != 0)
        *ok = 0; /* our reader went away; keep capturing */
      capture_add(i == 0 ? &cout : &cerr, buf, (size_t)r);
      /* Both streams share one cap. */
      cerr.limit = o.max_output > cout.len ? o.max_output - cout.len : 0;
    }
  }
  if (got_signal) {
    /* idem run is being stopped: CMD goes too, and the record stays in
     * progress; after its lease a retry reports the outcome as unknown. */
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    cli_error("run", "stopped by signal %d; key '%s' stays in progress",
              (int)got_signal, o.key);
    status = 128 + got_signal;
    idem_call_free(call);
    call = NULL;
    goto out;
  }
  for (int i = 0; i < 2; i++)
    if (pfd[i].fd >= 0)
      close(pfd[i].fd);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR)
    ;
  status = WIFEXITED(wstatus)     ? WEXITSTATUS(wstatus)
           : WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus)
                                  : EXIT_RUN_ERROR;

  /* Store stdout then stderr in one body; the metadata says where stdout
   * ends and whether anything was cut. */
  int truncated = cout.truncated || cerr.truncated;
  char meta[160];
  snprintf(meta, sizeof meta,
           "{\"stderr\":%zu,\"stdout\":%zu,\"truncated\":%s}", cerr.len,
           cout.len, truncated ? "true" : "false");
  char *body = malloc(cout.len + cerr.len + 1);
  if (!body) {
    cli_error("run", "out of memory; the result was not stored");
    goto out;
  }
  if (cout.len)
    memcpy(body, cout.buf, cout.len);
  if (cerr.len)
    memcpy(body + cout.len, cerr.buf, cerr.len);
  idem_response resp = {status, meta, strlen(meta), body,
                        cout.len + cerr.len};
  rc = idem_complete(store, call, &resp);
  free(body);
  if (rc != IDEM_OK)
    cli_idem_error("run", "the result was not stored", rc);
  if (truncated)
    cli_error("run", "note: output beyond %zu bytes was shown but not kept "
                     "for replay",
              o.max_output);
out:
  free(cout.buf);
  free(cerr.buf);
  idem_call_free(call);
  idem_store_close(store);
  idem_free(req);
  if (stdin_fd >= 0)
    close(stdin_fd);
  return status;
}

const cli_command cmd_run = {"run", run,
                             "run a command at most once per key", usage};
