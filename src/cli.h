/* cli.h -- what the subcommands of the idem program share. */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "idem.h"

/* Exit statuses idem itself uses; a command's own status passes through
 * `idem run` unchanged. */
enum {
  EXIT_OK = 0,
  EXIT_FAIL = 1,     /* invalid input, a failed check, a store error */
  EXIT_USAGE = 2,    /* bad command line */
  EXIT_CONFLICT = 3, /* same key, other request */
  EXIT_UNKNOWN = 4,  /* an earlier attempt's outcome is unknown */
  EXIT_TEMPFAIL = 75 /* in flight, or the store is busy: retry later */
};

typedef struct cli_command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
  const char *usage; /* full --help text */
} cli_command;

extern const cli_command cmd_canon, cmd_keys, cmd_lab, cmd_bench, cmd_run;

/* Prints "idem NAME: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints the libidem failure rc with its detail. */
void cli_idem_error(const char *cmd, const char *what, int rc);

/* Reads a whole file ("-" or NULL: stdin) into a NUL-terminated buffer of
 * at most max bytes. Returns 0, or -1 with errno set (EFBIG when too big). */
int cli_read_file(const char *path, size_t max, char **out, size_t *len);

/* Parses "250ms", "30s", "5m", "24h", "7d" or bare seconds into
 * milliseconds. Returns 0 or -1. */
int cli_parse_duration(const char *s, int64_t *ms);

/* Parses a non-negative decimal integer no larger than max. */
int cli_parse_uint(const char *s, long max, long *out);

/* Milliseconds of CLOCK_MONOTONIC, for measuring. */
double cli_now_ms(void);

/* A postgresql:// store URL as libpq takes it: idem's own query parameter
 * idem_schema removed. NULL when out of memory; free() it. */
char *cli_pg_libpq_url(const char *url);

/* The store URL: the --store value, else IDEM_STORE, else ./idem.db. */
const char *cli_store_url(const char *flag);

#endif
