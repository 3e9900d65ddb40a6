/* cmd_run.c -- `idem run` (being written). */
#include "cli.h"

static const char usage[] = "usage: idem run ...\n";

static int run(int argc, char **argv) {
  cli_error("run", "not available in this build");
  return EXIT_FAIL;
}

const cli_command cmd_run = {"run", run, "(not yet available)", usage};
