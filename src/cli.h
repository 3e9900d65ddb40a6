/* cli.h -- what the subcommands of the idem program share. */
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

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

extern const cli_command cmd_canon, cmd_keys, cmd_lab, cmd_bench, cmd_run,
    cmd_serve, cmd_mcp, cmd_console;

/* Prints "idem NAME: message" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints the libidem failure rc with its detail. */
void cli_idem_error(const char *cmd, const char *what, int rc);

/* Reads a whole file ("-" or NULL: stdin) into a NUL-terminated buffer of
 * at most max bytes. Returns 0, or -1 with errno set (EFBIG when too big). */
int cli_read_file(const char *path, size_t max, char **out, size_t *len);

/* The longest duration cli_parse_duration() takes: about 285,000 years, and
 * exact in both an int64_t and a double. */
#define CLI_MAX_DURATION_MS 9000000000000000LL

/*
 * Parses a duration into milliseconds: decimal digits with an optional
 * fraction, then a unit: ms, s (or none), m, h or d, as in "250ms", "30s",
 * "1.5", "5m", "24h", "7d". Parts of a millisecond are dropped. Returns 0
 * with *ms set, or -1 with *ms untouched and errno EINVAL (not a duration:
 * signs, exponents, hex, "nan", "inf", spaces) or ERANGE (longer than
 * CLI_MAX_DURATION_MS).
 */
int cli_parse_duration(const char *s, int64_t *ms);

/*
 * Parses the value of a duration option such as --lease, which must lie
 * between min_ms and max_ms. Returns 0 with *ms set; otherwise prints why
 * ("idem CMD: OPT: 'VALUE' is too large (at most ...)", "... is not a
 * duration ...", "... is too short ...") and returns -1, a usage error.
 */
int cli_duration_option(const char *cmd, const char *opt, const char *value,
                        int64_t min_ms, int64_t max_ms, int64_t *ms);

/* A duration as a message shows it, in its largest whole unit: "2h",
 * "90s", "250ms". */
void cli_duration_text(int64_t ms, char *buf, size_t size);

/* Parses a non-negative decimal integer no larger than max. */
int cli_parse_uint(const char *s, long max, long *out);

/* A size in bytes, or with a k, M or G suffix (1024-based); at most max.
 * 0, or -1 when it is not a size or is larger. */
int cli_parse_size(const char *s, size_t max, size_t *out);

/* Milliseconds of CLOCK_MONOTONIC, for measuring. */
double cli_now_ms(void);

/* A condition variable whose timed waits count by CLOCK_MONOTONIC, so that
 * a wall clock stepped back cannot stretch them. 0, or an error number. */
int cli_cond_init_mono(pthread_cond_t *cv);

/* The CLOCK_MONOTONIC time ms milliseconds from now, as
 * pthread_cond_timedwait() takes it on such a condition variable. */
struct timespec cli_mono_deadline(int64_t ms);

/* A postgresql:// store URL as libpq takes it: idem's own query parameter
 * idem_schema removed. NULL when out of memory; free() it. */
char *cli_pg_libpq_url(const char *url);

/*
 * text with every form of the password in a store URL or conninfo (in the
 * user information, or a password= parameter; as written and
 * percent-decoded) replaced by ***, for messages that quote libpq or the
 * URL itself. NULL when out of memory; free() it.
 */
char *cli_redact(const char *text, const char *url);

/* Writes all n bytes, going on after EINTR; 0, or -1 with errno set. */
int cli_write_all(int fd, const void *buf, size_t n);

/* The store URL: the --store value, else IDEM_STORE, else ./idem.db. */
const char *cli_store_url(const char *flag);

/* Takes the value of --store: an empty URL is a usage error, printed as
 * "idem CMD: --store: empty store URL" (-1), never the default store. */
int cli_store_option(const char *cmd, const char *value, const char **url);

/*
 * Checks the value of --tenant before any store is opened: at most 255 bytes
 * of UTF-8 without control characters (C0, DEL, and C1: U+0080-U+009F) and
 * without the invisible characters that reorder or hide text (bidirectional
 * marks, embeddings, overrides and isolates; zero-width characters; line
 * and paragraph separators; U+FEFF; tag characters), which could make one
 * tenant look like another in `idem keys list`. Returns 0, or prints why not
 * ("idem CMD: --tenant: ...") and returns -1, a usage error. Every
 * subcommand that takes --tenant calls it.
 */
int cli_check_tenant(const char *cmd, const char *tenant);

/* Checks the value of --operation as libidem does (1-255 bytes of UTF-8
 * without C0 controls or DEL), so that a bad one is a usage error; any
 * operation a record can have is accepted. Returns 0, or prints why not and
 * returns -1. */
int cli_check_operation(const char *cmd, const char *operation);

/*
 * Stored text (n bytes, NULs included) as it is safe to show on a terminal:
 * a backslash as \\, newline, return and tab as \n, \r and \t, other C0
 * controls, DEL and bytes that are not UTF-8 as \xHH, and C1 controls and
 * the invisible characters of cli_check_tenant() as \uXXXX (\UXXXXXXXX
 * past U+FFFF). All else is kept, so that the escaped text is never
 * ambiguous. NULL when out of memory; free() it.
 */
char *cli_escape(const void *s, size_t n);

/*
 * The length of the longest start of s, at most max bytes, that does not
 * end inside a UTF-8 character: strlen(s) when that is at most max;
 * otherwise max less the bytes of a character that max would cut. For
 * quoting names of any length in messages that must stay UTF-8 (a JSON
 * encoder refuses anything else): printf("%.*s", (int)cli_utf8_cut(s, 200),
 * s). Also mends text already cut by snprintf() into a buffer of size
 * bytes: buf[cli_utf8_cut(buf, size)] = '\0'. Only the bytes before the
 * cut are read; bytes that are not UTF-8 are not its to mend.
 */
size_t cli_utf8_cut(const char *s, size_t max);

/* The columns escaped text takes on a terminal: its code points. */
size_t cli_text_width(const char *s);

/*
 * JSON text (UTF-8, as jansson writes it) with DEL, the C1 controls and the
 * invisible characters of cli_check_tenant() written as \uXXXX escapes: the
 * same JSON value, safe to show on a terminal. NULL when out of memory;
 * free() it.
 */
char *cli_json_escape_unsafe(const char *json);

/*
 * A record as JSON: its identity, state, attempts and times, whether it was
 * recovered, its request and response (text that is valid UTF-8 without
 * NULs as a string, other bytes as {"hex": ...}) and how it is sealed. NULL
 * when out of memory; json_decref() it.
 */
struct json_t *cli_record_json(const idem_record *r);

/* Whether op is the operation of an `idem serve` record, "METHOD /path"
 * (the gateway protects upper-case methods only), whose status is an HTTP
 * status. */
int cli_http_operation(const char *op);

/*
 * Reads a bearer token from the first line of the file at path (opt names
 * the option in messages): 16 to 1022 printable ASCII characters, no
 * spaces. NULL, with why printed as "idem CMD: OPT: ...".
 */
char *cli_read_token(const char *cmd, const char *opt, const char *path);

/*
 * Loads a sealing key (idem_store_seal()) from the file at path: 32 raw
 * bytes, 64 hex digits or the standard base64 of 32 bytes, each with at
 * most one newline after it. A file that group or others may access is
 * refused, as ssh refuses such a private key (the message gives the
 * chmod). Returns 0 with key set, or -1 with key zeroed and err saying
 * why, naming the file.
 */
int cli_seal_key_load(const char *path, unsigned char key[32], char *err,
                      size_t errsize);

/*
 * Loads the keys of the n files at paths and gives them to st
 * (idem_store_seal()): the first seals what st stores, all of them open.
 * n = 0 leaves st as it is. Returns 0, or -1 with err saying why.
 */
int cli_seal_apply(idem_store *st, char *const *paths, int n, char *err,
                   size_t errsize);

#endif
