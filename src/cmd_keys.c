/* cmd_keys.c -- `idem keys` (being written). */
#include "cli.h"

static const char usage[] = "usage: idem keys ...\n";

static int run(int argc, char **argv) {
  cli_error("keys", "not available in this build");
  return EXIT_FAIL;
}

const cli_command cmd_keys = {"keys", run, "(not yet available)", usage};
