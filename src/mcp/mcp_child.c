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
#include <poll.h>
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

/* ---- the process the client started ------------------------------------
 *
 * An MCP client that closes a stdio server (an editor reloading its
 * servers; the SDKs' close()) closes its input, waits two seconds for the
 * process it started to exit, then sends it SIGTERM, and SIGKILL two
 * seconds later. A keyed call still at the server would die with it, and a
 * retry act again. So over stdio the process the client starts is a
 * waiter: it forks the proxy at once, passes on the signals a process sent
 * it, and exits with the proxy's status; or, when the client's input ends
 * with keyed calls in flight, exits at once (mcp_detach()), and the proxy
 * drains them with nobody to stop it. Until then the proxy dies with the
 * waiter (a kill -9 of the process the client knows is the proxy's death).
 */

static int waiter_fd = -1;

static void on_waiter_signal(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  /* From a process (kill(), sigqueue()): passed on. From the terminal
   * (Ctrl-C): the proxy, in the same process group, has it already. */
  unsigned char b[2] = {(unsigned char)sig, si->si_code <= 0};
  (void)uc;
  if (write(waiter_fd, b, 2) < 0) {
    /* A full pipe: the waiter is behind, and so be it. */
  }
  errno = saved;
}

int mcp_detachable(int *detach_fd) {
  int d[2], s[2], st;
  pid_t waiter = getpid(), proxy;
  struct sigaction sa;
  if (pipe2(d, O_CLOEXEC) != 0)
    return -1;
  proxy = fork();
  if (proxy < 0)
    return -1;
  if (proxy == 0) {
    close(d[0]);
    /* Dies with the waiter, unless detached. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != waiter)
      _exit(EXIT_FAIL);
    *detach_fd = d[1];
    return 0;
  }
  close(d[1]);
  if (pipe2(s, O_CLOEXEC | O_NONBLOCK) != 0)
    _exit(EXIT_FAIL);
  waiter_fd = s[1];
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_waiter_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
    sigaction(forwarded[i], &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  for (;;) {
    struct pollfd f[2] = {{d[0], POLLIN, 0}, {s[0], POLLIN, 0}};
    unsigned char b[64];
    ssize_t n;
    if (poll(f, 2, -1) < 0)
      continue;
    if (f[1].revents & POLLIN) {
      n = read(s[0], b, sizeof b);
      for (ssize_t i = 0; i + 1 < n; i += 2)
        if (b[i + 1])
          kill(proxy, b[i]);
    }
    if (!(f[0].revents & (POLLIN | POLLHUP)))
      continue;
    n = read(d[0], b, 1);
    if (n == 1)
      _exit(EXIT_OK); /* detached: the proxy drains on its own */
    if (n < 0 && errno == EINTR)
      continue;
    break; /* the proxy has exited */
  }
  while (waitpid(proxy, &st, 0) < 0 && errno == EINTR)
    ;
  if (WIFSIGNALED(st)) {
    /* As the proxy ended, so does the process the client knows. */
    signal(WTERMSIG(st), SIG_DFL);
    kill(getpid(), WTERMSIG(st));
  }
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : EXIT_FAIL);
}

void mcp_detach(int detach_fd) {
  if (detach_fd < 0)
    return;
  /* Not to die with the waiter, which exits now. */
  prctl(PR_SET_PDEATHSIG, 0);
  if (write(detach_fd, "d", 1) < 0) {
    /* The waiter is gone: nobody to tell. */
  }
  close(detach_fd);
}
