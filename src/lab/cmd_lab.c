/*
 * cmd_lab.c -- `idem lab`: the seed experiments, run against the real engine
 * on fresh temporary databases, with checks that hold in every build type.
 */
#include "lab.h"

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: idem lab [--store URL] [--output FILE] [--suite NAME]...\n"
    "\n"
    "Runs the seed experiments against the real engine and prints one line\n"
    "per scenario, `name: {observed values}`, then `PASS: N scenarios`.\n"
    "Each scenario uses a fresh temporary database, removed at the end.\n"
    "\n"
    "Suites (all by default):\n"
    "  tool-retries    the seven ticket scenarios of the tool retries lab\n"
    "  account-credit  the account credit example: writer process that exits\n"
    "                  (or is killed) around its commit, sixteen concurrent\n"
    "                  duplicates, conflict, tenant scope, rejected account,\n"
    "                  new intent, and the example's scenario output\n"
    "  recovery        beyond the seeds: a lease that expires while its\n"
    "                  holder is stopped (RECOVER), the stopped holder's\n"
    "                  STALE completion, retention expiry, 64 processes on\n"
    "                  8 keys\n"
    "\n"
    "  --store URL    the backend to run on (default: embedded SQLite in a\n"
    "                 temporary folder; a sqlite: URL puts the temporary\n"
    "                 databases beside that path; on postgresql://... each\n"
    "                 scenario gets a fresh schema, dropped at the end)\n"
    "  --output FILE  write the evidence JSON (overwrites FILE); see\n"
    "                 docs/lab.md for its shape\n"
    "  --suite NAME   run only this suite (may be repeated)\n"
    "\n"
    "Exit status: 0 when every check holds, 1 when one fails (the message\n"
    "names the scenario, the expectation and the observation), 2 usage.\n";

void lab_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
    ;
}

int lab_check(lab *L, const char *scenario, int cond, const char *fmt, ...) {
  va_list ap;
  if (cond)
    return 1;
  fprintf(stderr, "FAIL %s: ", scenario);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  L->failures++;
  return 0;
}

void lab_report(lab *L, const char *name, json_t *values) {
  char *text;
  if (!values) {
    lab_check(L, name, 0, "no observed values (out of memory)");
    return;
  }
  /* Sorted keys, ", " and ": " separators: the seeds' own printing. */
  text = json_dumps(values, JSON_SORT_KEYS | JSON_ENCODE_ANY);
  printf("%s: %s\n", name, text ? text : "null");
  fflush(stdout);
  free(text);
  json_object_set_new(L->current, name, values);
  L->passed++;
}

int lab_fresh_store(lab *L, const char *name, char *url, size_t url_size) {
  idem_store *s = NULL;
  int rc;
  if (L->pg) {
    /* A fresh schema per scenario holds idem's records and the scenario's
     * own tables; the run drops them at its end. */
    snprintf(url, url_size, "%s%cidem_schema=idem_lab_%ld_%02d",
             L->store_arg, strchr(L->store_arg, '?') ? '&' : '?',
             (long)getpid(), ++L->seq);
    if (L->nmade < (int)(sizeof L->made / sizeof L->made[0]))
      L->made[L->nmade++] = strdup(url);
  } else {
    snprintf(url, url_size, "sqlite:%s/%02d-%s.db", L->dir, ++L->seq, name);
  }
  rc = idem_store_open(url, NULL, &s);
  if (rc == IDEM_OK)
    snprintf(L->engine_version, sizeof L->engine_version, "%s",
             idem_store_engine_version(s));
  idem_store_close(s);
  if (rc != IDEM_OK) {
    lab_check(L, name, 0, "cannot create a fresh store: %s", idem_errmsg());
    return -1;
  }
  if (lab_db_setup(url) != 0) {
    lab_check(L, name, 0, "cannot create the lab's tables");
    return -1;
  }
  return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

typedef struct suite {
  const char *name;
  int (*run)(lab *L);
} suite;

static const suite suites[] = {
    {"tool-retries", lab_suite_tickets},
    {"account-credit", lab_suite_credit},
    {"recovery", lab_suite_recovery},
};
#define NSUITES (int)(sizeof suites / sizeof suites[0])

static int make_dir(lab *L, const char *store) {
  const char *base = getenv("TMPDIR");
  char parent[160];
  if (!base || !*base)
    base = "/tmp";
  snprintf(parent, sizeof parent, "%s", base);
  if (store && *store) {
    const char *path = strncmp(store, "sqlite:", 7) == 0 ? store + 7 : store;
    const char *slash = strrchr(path, '/');
    if (slash)
      snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    else
      snprintf(parent, sizeof parent, ".");
    if (!parent[0])
      snprintf(parent, sizeof parent, "/");
  }
  snprintf(L->dir, sizeof L->dir, "%s/idem-lab.XXXXXX", parent);
  if (!mkdtemp(L->dir)) {
    cli_error("lab", "cannot make a temporary folder in %s: %s", parent,
              strerror(errno));
    return -1;
  }
  return 0;
}

static int run(int argc, char **argv) {
  lab L;
  const char *output = NULL, *store = NULL;
  int want[NSUITES] = {0}, any = 0, status;
  json_t *evidence;

  memset(&L, 0, sizeof L);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    } else if ((strcmp(a, "--output") == 0 || strcmp(a, "--store") == 0 ||
                strcmp(a, "--suite") == 0) &&
               i + 1 >= argc) {
      cli_error("lab", "%s needs a value", a);
      return EXIT_USAGE;
    } else if (strcmp(a, "--output") == 0) {
      output = argv[++i];
    } else if (strcmp(a, "--store") == 0) {
      store = argv[++i];
    } else if (strcmp(a, "--suite") == 0) {
      const char *name = argv[++i];
      int found = 0;
      for (int k = 0; k < NSUITES; k++)
        if (strcmp(suites[k].name, name) == 0)
          want[k] = found = any = 1;
      if (!found) {
        cli_error("lab", "no suite '%s' (tool-retries, account-credit, "
                         "recovery)",
                  name);
        return EXIT_USAGE;
      }
    } else {
      cli_error("lab", "unknown argument '%s'", a);
      fputs(usage, stderr);
      return EXIT_USAGE;
    }
  }
  L.pg = store && (strncmp(store, "postgresql://", 13) == 0 ||
                   strncmp(store, "postgres://", 11) == 0);
  if (L.pg && strstr(store, "idem_schema=")) {
    cli_error("lab", "--store: leave idem_schema out; the lab makes a fresh "
                     "schema for every scenario");
    return EXIT_USAGE;
  }
  if (L.pg && lab_db_reachable(store) != 0)
    return EXIT_FAIL;
  if (make_dir(&L, L.pg ? NULL : store) != 0)
    return EXIT_FAIL;
  L.store_arg = store;
  L.suites = json_object();

  for (int k = 0; k < NSUITES; k++) {
    if (any && !want[k])
      continue;
    json_t *suite_obj = json_object();
    L.current = json_object();
    json_object_set_new(suite_obj, "scenarios", L.current);
    json_object_set_new(L.suites, suites[k].name, suite_obj);
    suites[k].run(&L);
  }

  nftw(L.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  for (int i = 0; i < L.nmade; i++) {
    if (lab_db_drop(L.made[i]) != 0)
      cli_error("lab", "could not drop a scenario's schema");
    free(L.made[i]);
  }

  evidence = json_pack(
      "{s:s,s:s,s:s,s:s,s:o,s:b,s:i,s:o}", "experiment", "idem-lab-v1",
      "idem", idem_version(), "store", L.pg ? "postgresql" : "sqlite",
      "sqlite", lab_db_sqlite_version(), "postgresql",
      L.pg ? json_string(L.engine_version) : json_null(), "passed",
      L.failures == 0, "scenario_count", L.passed, "suites", L.suites);
  if (output) {
    if (!evidence || json_dump_file(evidence, output,
                                    JSON_INDENT(2) | JSON_SORT_KEYS) != 0) {
      cli_error("lab", "cannot write %s", output);
      L.failures++;
    } else {
      FILE *f = fopen(output, "a");
      if (f) {
        fputc('\n', f);
        fclose(f);
      }
    }
  }
  json_decref(evidence);
  if (L.failures == 0) {
    printf("PASS: %d scenarios\n", L.passed);
    status = EXIT_OK;
  } else {
    printf("FAIL: %d failed checks\n", L.failures);
    status = EXIT_FAIL;
  }
  return status;
}

const cli_command cmd_lab = {
    "lab", run, "run the seed experiments against the real engine", usage};
