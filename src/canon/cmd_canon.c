/* cmd_canon.c -- `idem canon`: print the RFC 8785 form or its SHA-256. */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: idem canon [--hash] [-n] [FILE|-]\n"
    "\n"
    "Reads one JSON text from FILE (standard input when FILE is absent or\n"
    "'-') and prints its RFC 8785 canonical form followed by a newline.\n"
    "\n"
    "  --hash   print the SHA-256 of the canonical bytes in lowercase hex\n"
    "  -n       no trailing newline\n"
    "  --help   this text\n"
    "\n"
    "Exit status: 0 ok, 1 invalid input (the message names the byte offset\n"
    "and the reason), 2 usage.\n";

static int run(int argc, char **argv) {
  int hash = 0, newline = 1;
  const char *path = NULL;
  char *in = NULL, *canon = NULL;
  size_t in_len = 0, canon_len = 0, off = 0;
  int rc, status = EXIT_FAIL;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--hash") == 0)
      hash = 1;
    else if (strcmp(argv[i], "-n") == 0)
      newline = 0;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage, stdout);
      return EXIT_OK;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      cli_error("canon", "unknown option '%s'", argv[i]);
      fputs(usage, stderr);
      return EXIT_USAGE;
    } else if (path) {
      cli_error("canon", "only one FILE may be given");
      return EXIT_USAGE;
    } else
      path = argv[i];
  }

  /* Read one byte past the library's limit so that it reports the size. */
  if (cli_read_file(path, (size_t)16 * 1024 * 1024 + 1, &in, &in_len) != 0) {
    if (errno == EFBIG)
      cli_error("canon", "%s: larger than 16 MiB", path ? path : "stdin");
    else
      cli_error("canon", "%s: %s", path ? path : "stdin", strerror(errno));
    return EXIT_FAIL;
  }
  rc = idem_canonicalize(in, in_len, NULL, &canon, &canon_len, &off);
  if (rc != IDEM_OK) {
    cli_error("canon", "%s: %s", path ? path : "stdin", idem_errmsg());
    goto out;
  }
  if (hash) {
    char hex[IDEM_FINGERPRINT_SIZE];
    rc = idem_sha256_hex(canon, canon_len, hex);
    if (rc != IDEM_OK) {
      cli_idem_error("canon", "hash", rc);
      goto out;
    }
    fputs(hex, stdout);
  } else {
    fwrite(canon, 1, canon_len, stdout);
  }
  if (newline)
    fputc('\n', stdout);
  status = fflush(stdout) == 0 ? EXIT_OK : EXIT_FAIL;
out:
  idem_free(canon);
  free(in);
  return status;
}

const cli_command cmd_canon = {"canon", run,
                               "print the RFC 8785 canonical form of JSON",
                               usage};
