/* main.c -- the idem program: dispatch to one subcommand per file. */
#include "cli.h"

#include <string.h>

static const cli_command *const commands[] = {
    &cmd_lab, &cmd_canon, &cmd_run, &cmd_serve,
    &cmd_mcp, &cmd_keys, &cmd_console, &cmd_bench,
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f) {
  fputs("usage: idem [--version] [--help] COMMAND [ARGS]\n"
        "\n"
        "Safe retries for side-effecting tool calls.\n"
        "\n"
        "Commands:\n",
        f);
  for (size_t i = 0; i < NCOMMANDS; i++)
    fprintf(f, "  %-8s %s\n", commands[i]->name, commands[i]->summary);
  fputs("\n"
        "`idem help COMMAND` or `idem COMMAND --help` describes one command.\n"
        "The store is chosen with --store URL or IDEM_STORE: sqlite:PATH, a\n"
        "bare PATH, or postgresql://...; the default is ./idem.db.\n",
        f);
}

static const cli_command *find(const char *name) {
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (strcmp(commands[i]->name, name) == 0)
      return commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  const cli_command *cmd;
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return EXIT_OK;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("idem %s\n", idem_version());
    return EXIT_OK;
  }
  if (strcmp(argv[1], "help") == 0) {
    if (argc < 3) {
      usage(stdout);
      return EXIT_OK;
    }
    cmd = find(argv[2]);
    if (!cmd) {
      cli_error("help", "no such command '%s'", argv[2]);
      return EXIT_USAGE;
    }
    fputs(cmd->usage, stdout);
    return EXIT_OK;
  }
  cmd = find(argv[1]);
  if (!cmd) {
    fprintf(stderr, "idem: no such command '%s'\n\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
  }
  return cmd->run(argc - 1, argv + 1);
}
