/*
 * mcp_child.c -- the MCP server as a process of `idem mcp`.
 *
 * The server runs in a process group of its own, with pipes for its
 * standard input and output and the proxy's standard error as its own. The
 * proxy passes the signals it gets on to that group (a wrapper such as npx
 * and the server behind it both get them), and the kernel sends the server
 * SIGTERM if the proxy dies without a word.
 */
#include "mcp.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int signal_fd = -1;

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  if (signal_fd >= 0 && write(signal_fd, &b, 1) < 0) {
    /* A full pipe already holds a wake-up. */
  }
  errno = saved;
}

static const int forwarded[] = {SIGINT,  SIGTERM, SIGHUP,
                                SIGQUIT, SIGUSR1, SIGUSR2};

int mcp_signal_forwarded(int sig) {
  for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
    if (forwarded[i] == sig)
      return 1;
  return 0;
}

int mcp_signals_install(int fd) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  signal_fd = fd;
  for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
    if (sigaction(forwarded[i], &sa, NULL) != 0)
      return -1;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) != 0)
    return -1;
  signal(SIGPIPE, SIG_IGN);
  return 0;
}

/*
 * Starts cmd with pipes for its standard input and output. Returns 0 with
 * the proxy's ends of the pipes and the pid, or -1 with errno set (an
 * exec failure's errno comes back through a close-on-exec pipe).
 */
int mcp_child_start(char **cmd, int *to_child, int *from_child, pid_t *pid) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  int saved;
  pid_t ppid = getpid();
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
      pipe2(err, O_CLOEXEC) != 0)
    goto fail;
  pid_t child = fork();
  if (child < 0)
    goto fail;
  if (child == 0) {
    /* Only async-signal-safe calls from here to exec. */
    sigset_t none;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
      sigaction(forwarded[i], &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != ppid)
      _exit(127);
    if (dup2(in[0], STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0)
      _exit(127);
    execvp(cmd[0], cmd);
    int e = errno;
    if (write(err[1], &e, sizeof e) < 0) {
      /* Nothing more can be said. */
    }
    _exit(127);
  }
  /* Both sides set the group, so that a signal sent right after fork()
   * already finds it. */
  setpgid(child, child);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  int e = 0;
  ssize_t n;
  while ((n = read(err[0], &e, sizeof e)) < 0 && errno == EINTR)
    ;
  close(err[0]);
  if (n == (ssize_t)sizeof e) {
    int st;
    while (waitpid(child, &st, 0) < 0 && errno == EINTR)
      ;
    close(in[1]);
    close(out[0]);
    errno = e;
    return -1;
  }
  *to_child = in[1];
  *from_child = out[0];
  *pid = child;
  return 0;
fail:
  saved = errno;
  for (int i = 0; i < 2; i++) {
    if (in[i] >= 0)
      close(in[i]);
    if (out[i] >= 0)
      close(out[i]);
    if (err[i] >= 0)
      close(err[i]);
  }
  errno = saved;
  return -1;
}
