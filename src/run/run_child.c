/*
 * run_child.c -- the command of `idem run` as a process.
 *
 * The command runs in a process group of its own, so that idem run can
 * signal all of it (a deploy script and whatever it started) and not only
 * the direct child. idem run is the group's child subreaper: orphaned
 * descendants are reparented to it, so they are reaped here and stay in
 * reach. One poll loop waits on the output pipes, on a self-pipe that the
 * signal handlers write to (SIGCHLD included, so the end of the command is
 * noticed even after it closed its output), and on the lost-key descriptor,
 * so a lost key is noticed until the command has been reaped, while it is
 * being stopped too (the lease itself is renewed by a thread of libidem's
 * meanwhile).
 *
 * What is guaranteed when idem run itself dies (SIGKILL, a crash):
 *  - the direct child gets SIGKILL from the kernel (PR_SET_PDEATHSIG; a
 *    setuid program clears that at exec);
 *  - a watchdog process, in a session of its own so that a signal to idem
 *    run's process group does not reach it, notices idem run's end (the
 *    pipe between them closes) and kills the command's process group with
 *    SIGKILL;
 *  - a process that left the group (setsid, setpgid: daemons do) is reached
 *    by neither, and neither is anything when the watchdog is killed too
 *    (for example by killing every process of a cgroup, which kills the
 *    command's group as well).
 * The key then stays in progress; after its lease a retry is refused as
 * outcome unknown (or taken over with --on-unknown rerun).
 */
#include "run_child.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { EXIT_SETUP_FAILED = 125 };

/* How long to wait for the group to go after SIGKILL (a process in
 * uninterruptible sleep may take a while) before giving up on it. */
#define KILL_WAIT_MS 5000

static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_STOP_SIGNALS (sizeof stop_signals / sizeof stop_signals[0])

/* Written by the signal handlers, read by run_child()'s loop. Once made it
 * stays open: a handler running on another thread as the handlers are
 * taken down must not write to a descriptor number that was reused. */
static int sig_pipe[2] = {-1, -1};

static void on_signal(int sig) {
  int saved = errno;
  unsigned char c = (unsigned char)sig;
  if (write(sig_pipe[1], &c, 1) < 0) {
    /* The pipe is full: enough wake-ups are pending already. */
  }
  errno = saved;
}

/* The handlers of run_signals_hold(), and what was there before them. */
typedef struct handlers {
  struct sigaction old_stop[N_STOP_SIGNALS], old_chld;
  int handled[N_STOP_SIGNALS];
} handlers;

static handlers held;

int run_signals_hold(void) {
  struct sigaction sa;
  if (sig_pipe[0] < 0 && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return -1;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < N_STOP_SIGNALS; i++) {
    sigaction(stop_signals[i], NULL, &held.old_stop[i]);
    /* A signal ignored when idem run started (nohup, a background job of a
     * shell) stays ignored, for idem run and for the command. */
    held.handled[i] = held.old_stop[i].sa_handler != SIG_IGN;
    if (held.handled[i])
      sigaction(stop_signals[i], &sa, NULL);
  }
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, &held.old_chld);
  return 0;
}

/* The first stop signal waiting in the pipe, or 0; the pipe is emptied. */
static int take_stop_signal(void) {
  unsigned char c[64];
  ssize_t n;
  int first = 0;
  while ((n = read(sig_pipe[0], c, sizeof c)) > 0)
    for (ssize_t i = 0; i < n; i++)
      if (c[i] != SIGCHLD && !first)
        first = c[i];
  return first;
}

int run_signals_release(void) {
  int first;
  if (sig_pipe[0] < 0)
    return 0;
  for (size_t i = 0; i < N_STOP_SIGNALS; i++)
    if (held.handled[i])
      sigaction(stop_signals[i], &held.old_stop[i], NULL);
  sigaction(SIGCHLD, &held.old_chld, NULL);
  first = take_stop_signal();
  return first;
}

/* In a new child, before it execs or does its own work: the handlers of
 * idem run would write to idem run's self-pipe. */
static void default_handlers(const handlers *h) {
  for (size_t i = 0; i < N_STOP_SIGNALS; i++)
    if (h->handled[i])
      signal(stop_signals[i], SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
}

/* Closes every descriptor from lowest up; async-signal-safe. */
static void close_from(int lowest, long open_max) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, (unsigned)lowest, ~0u, 0u) == 0)
    return;
#endif
  for (long fd = lowest; fd < open_max; fd++)
    close((int)fd);
}

/*
 * The watchdog: waits on the read end of a pipe whose write end only idem
 * run holds. A byte means idem run is done with the group: exit. End of file
 * without one means idem run died: kill the group.
 */
static pid_t start_watchdog(pid_t pgid, int *stand_down) {
  int p[2];
  long open_max = sysconf(_SC_OPEN_MAX);
  sigset_t all, old;
  pid_t pid;
  *stand_down = -1;
  if (open_max < 0 || open_max > 65536)
    open_max = 65536;
  if (pipe2(p, O_CLOEXEC) != 0)
    return -1;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pid = fork();
  if (pid == 0) {
    char c;
    ssize_t n;
    int null_fd;
    setsid();
    /* The system call itself: a child of a process with threads may only
     * make async-signal-safe calls, and a sanitizer's prctl() takes a lock
     * that another thread may have held at the fork (an ASan build's
     * watchdog hung there forever under stress-ng). */
    syscall(SYS_prctl, PR_SET_NAME, "idem-watchdog", 0, 0, 0);
    default_handlers(&held);
    /* Its one job is to outlive idem run: a signal meant to stop idem run
     * (pkill, killall) leaves it be, and idem run stops the group. */
    for (size_t i = 0; i < N_STOP_SIGNALS; i++)
      signal(stop_signals[i], SIG_IGN);
    if (dup2(p[0], 3) != 3)
      _exit(1);
    null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
    }
    close_from(4, open_max);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    while ((n = read(3, &c, 1)) < 0 && errno == EINTR)
      ;
    if (n == 0)
      kill(-pgid, SIGKILL);
    _exit(0);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  close(p[0]);
  if (pid < 0) {
    close(p[1]);
    return -1;
  }
  *stand_down = p[1];
  return pid;
}

static void stand_down(int *fd) {
  if (*fd >= 0) {
    if (write(*fd, "d", 1) < 0) {
      /* The watchdog is gone already. */
    }
    close(*fd);
    *fd = -1;
  }
}

/*
 * Starts the command in a process group of its own (its pid is the group's
 * id) with stdout and stderr on pipes. Returns its pid, or -1 with
 * r->exec_errno and r->exec_failed set.
 */
static pid_t start(const run_child_opts *o, int stdin_fd, int out[2],
                   int err[2], run_child_result *r) {
  int report[2] = {-1, -1};
  pid_t parent = getpid(), pid;
  sigset_t all, old;
  out[0] = out[1] = err[0] = err[1] = -1;
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
      pipe2(report, O_CLOEXEC)) {
    r->exec_errno = errno;
    goto fail;
  }
  fflush(NULL);
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pid = fork();
  if (pid == 0) {
    int e;
    setpgid(0, 0);
    /* Killed with idem run, even when idem run is killed with SIGKILL. */
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != parent)
      _exit(EXIT_SETUP_FAILED);
    default_handlers(&held);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* dup2 clears close-on-exec on the copies; the pipes' own descriptors
     * are above 2 (idem run keeps 0-2 open) and close at exec. */
    if (dup2(stdin_fd, STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 ||
        dup2(err[1], STDERR_FILENO) < 0) {
      e = errno;
    } else {
      execvp(o->argv[0], o->argv);
      e = errno;
    }
    if (write(report[1], &e, sizeof e) != (ssize_t)sizeof e)
      _exit(EXIT_SETUP_FAILED);
    _exit(EXIT_SETUP_FAILED);
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) {
    r->exec_errno = errno;
    goto fail;
  }
  /* Also here, so that the group exists before anything signals it. The
   * child may have exec'd already (EACCES): then it did this itself. */
  setpgid(pid, pid);
  close(out[1]);
  close(err[1]);
  close(report[1]);
  out[1] = err[1] = report[1] = -1;
  int e = 0;
  ssize_t n;
  while ((n = read(report[0], &e, sizeof e)) < 0 && errno == EINTR)
    ;
  close(report[0]);
  if (n == (ssize_t)sizeof e) {
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    close(out[0]);
    close(err[0]);
    out[0] = err[0] = -1;
    r->exec_errno = e;
    r->exec_failed = 1;
    return -1;
  }
  return pid;
fail:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0)
      close(out[i]);
    if (err[i] >= 0)
      close(err[i]);
    if (report[i] >= 0)
      close(report[i]);
  }
  out[0] = err[0] = -1;
  return -1;
}

/* Output kept for the record: stdout and stderr share one budget. */
typedef struct capture {
  char *buf;
  size_t len, cap;
} capture;

static void capture_add(capture *c, const char *p, size_t n, size_t *budget,
                        int *truncated) {
  if (n > *budget) {
    *truncated = 1;
    n = *budget;
  }
  if (n == 0)
    return;
  if (c->len + n > c->cap) {
    size_t ncap = c->cap ? c->cap : 65536;
    while (ncap < c->len + n)
      ncap *= 2;
    char *nb = realloc(c->buf, ncap);
    if (!nb) {
      /* Out of memory: keep what we have; the record says it was cut. */
      *truncated = 1;
      *budget = 0;
      return;
    }
    c->buf = nb;
    c->cap = ncap;
  }
  memcpy(c->buf + c->len, p, n);
  c->len += n;
  *budget -= n;
}

/* The state of one run of the loop. */
typedef struct run_state {
  pid_t pid;         /* the command, and its process group */
  pid_t watchdog;    /* -1 when there is none (or it was reaped) */
  int child_reaped;  /* the direct child was reaped */
  int gone;          /* and after it every process of its group */
  int wstatus;       /* its wait status */
  int stopping;      /* the command's group is being stopped */
  int killed;        /* SIGKILL was sent to the group */
  double kill_at;    /* when to send it */
  double give_up_at; /* after SIGKILL: when to stop waiting */
} run_state;

/* Reaps every child that ended: the command, the watchdog, and orphans
 * reparented to idem run as their subreaper. */
static void reap(run_state *s) {
  pid_t p;
  int ws;
  while ((p = waitpid(-1, &ws, WNOHANG)) > 0 || (p < 0 && errno == EINTR)) {
    if (p == s->pid) {
      s->child_reaped = 1;
      s->wstatus = ws;
    } else if (p == s->watchdog) {
      s->watchdog = -1;
    }
  }
}

/*
 * No process is left in the command's group. Once that is so it stays so
 * for idem run, which then never signals that group id again: the number
 * may come back as another group's.
 */
static int group_gone(run_state *s) {
  if (!s->gone && s->child_reaped && kill(-s->pid, 0) < 0 && errno == ESRCH)
    s->gone = 1;
  return s->gone;
}

static void signal_group(run_state *s, int sig) {
  if (!group_gone(s))
    kill(-s->pid, sig);
}

static void begin_stop(run_state *s, int sig, int64_t kill_after_ms) {
  if (!s->stopping) {
    s->stopping = 1;
    s->kill_at = cli_now_ms() + (double)kill_after_ms;
  }
  signal_group(s, sig);
  /* A stopped process acts on the signal only once it continues. */
  signal_group(s, SIGCONT);
}

static void kill_group(run_state *s, const char *why) {
  cli_error("run", "%s; killing its process group with SIGKILL", why);
  signal_group(s, SIGKILL);
  s->killed = 1;
  s->give_up_at = cli_now_ms() + KILL_WAIT_MS;
}

/*
 * At the end: what is still in the pipes, without waiting (a process that
 * left the group may hold them open), then closes them.
 */
static void drain(struct pollfd *pfd, int stdout_ok, int stderr_ok,
                  capture *cap, size_t *budget, int *truncated) {
  for (int i = 1; i <= 2; i++) {
    char buf[65536];
    ssize_t n;
    int rounds = 0;
    if (pfd[i].fd < 0)
      continue;
    fcntl(pfd[i].fd, F_SETFL, fcntl(pfd[i].fd, F_GETFL) | O_NONBLOCK);
    while (rounds++ < 64 && (n = read(pfd[i].fd, buf, sizeof buf)) > 0) {
      if (i == 1 ? stdout_ok : stderr_ok)
        cli_write_all(i == 1 ? STDOUT_FILENO : STDERR_FILENO, buf, (size_t)n);
      capture_add(&cap[i - 1], buf, (size_t)n, budget, truncated);
    }
    close(pfd[i].fd);
    pfd[i].fd = -1;
  }
}

static int min_wait(int a, double until) {
  double d = until - cli_now_ms();
  int w = d <= 0 ? 0 : d > 60000 ? 60000 : (int)d + 1;
  return a < 0 || w < a ? w : a;
}

void run_child_result_free(run_child_result *r) {
  if (!r)
    return;
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
  r->out_len = r->err_len = 0;
}

void run_child(const run_child_opts *o, run_child_result *r) {
  run_state s;
  capture cap[2] = {{0}, {0}};
  size_t budget = o->max_output;
  int out[2], err[2], wd_fd = -1, null_fd = -1, lost = 0, got_signal = 0;
  struct pollfd pfd[4];

  memset(r, 0, sizeof *r);
  memset(&s, 0, sizeof s);
  s.watchdog = -1;
  r->end = RUN_NOT_STARTED;
  int stdin_fd = o->stdin_fd;
  if (stdin_fd < 0) {
    stdin_fd = null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (stdin_fd < 0) {
      r->exec_errno = errno;
      goto out;
    }
  }
  /* A signal that came while the key was claimed: nothing started yet, so
   * nothing is started. */
  if ((r->signal = take_stop_signal()) != 0)
    goto out;
  /* Orphaned descendants come to idem run instead of init, so that they
   * stay reachable and are reaped here. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  s.pid = start(o, stdin_fd, out, err, r);
  if (s.pid < 0)
    goto restore;
  s.watchdog = start_watchdog(s.pid, &wd_fd);
  if (s.watchdog < 0)
    cli_error("run",
              "warning: no watchdog (%s): if idem run is killed, "
              "what the command started may outlive it",
              strerror(errno));
  r->end = RUN_EXITED;

  pfd[0] = (struct pollfd){sig_pipe[0], POLLIN, 0};
  pfd[1] = (struct pollfd){out[0], POLLIN, 0};
  pfd[2] = (struct pollfd){err[0], POLLIN, 0};
  pfd[3] = (struct pollfd){o->lost_fd, POLLIN, 0};
  int stdout_ok = 1, stderr_ok = 1;
  for (;;) {
    int open_fds = (pfd[1].fd >= 0) + (pfd[2].fd >= 0);
    if (s.child_reaped && !s.stopping && open_fds == 0)
      break;
    if (s.stopping && group_gone(&s))
      break;
    if (group_gone(&s))
      stand_down(&wd_fd); /* nothing left for it to kill */
    if (s.killed && cli_now_ms() >= s.give_up_at) {
      cli_error("run", "warning: processes of the command's group did not "
                       "end after SIGKILL; not waiting for them");
      break;
    }
    int wait = -1;
    if (s.stopping && !s.killed)
      wait = min_wait(wait, s.kill_at);
    if (s.child_reaped && !s.gone)
      wait = min_wait(wait, cli_now_ms() + (s.stopping ? 20 : 100));
    if (s.killed)
      wait = min_wait(wait, s.give_up_at);
    if (poll(pfd, 4, wait) < 0 && errno != EINTR)
      break;

    unsigned char sigs[64];
    ssize_t ns;
    while ((ns = read(sig_pipe[0], sigs, sizeof sigs)) > 0) {
      for (ssize_t i = 0; i < ns; i++) {
        if (sigs[i] == SIGCHLD)
          continue;
        if (!got_signal)
          got_signal = sigs[i];
        /* Passed on to the whole group, each time one comes. */
        begin_stop(&s, sigs[i], o->kill_after_ms);
      }
    }
    reap(&s);

    if (!lost && pfd[3].fd >= 0 && (pfd[3].revents & (POLLIN | POLLHUP))) {
      lost = 1;
      pfd[3].fd = -1;
      cli_error("run", "the lease on the key was lost (another run took it "
                       "over, its record was removed, or it could not be "
                       "renewed in time): stopping the command");
      if (!s.stopping)
        begin_stop(&s, SIGTERM, o->kill_after_ms);
    }

    for (int i = 1; i <= 2; i++) {
      char buf[65536];
      if (pfd[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      ssize_t n = read(pfd[i].fd, buf, sizeof buf);
      if (n < 0 && (errno == EINTR || errno == EAGAIN))
        continue;
      if (n <= 0) {
        close(pfd[i].fd);
        pfd[i].fd = -1;
        continue;
      }
      int *ok = i == 1 ? &stdout_ok : &stderr_ok;
      if (*ok && cli_write_all(i == 1 ? STDOUT_FILENO : STDERR_FILENO, buf,
                           (size_t)n) != 0)
        *ok = 0; /* our reader went away; keep capturing */
      capture_add(&cap[i - 1], buf, (size_t)n, &budget, &r->truncated);
    }

    if (s.stopping && !s.killed && cli_now_ms() >= s.kill_at) {
      char why[96];
      snprintf(
          why, sizeof why, "the command did not end within %.1fs of signal %d",
          (double)o->kill_after_ms / 1000, got_signal ? got_signal : SIGTERM);
      kill_group(&s, why);
    }
  }
  drain(pfd, stdout_ok, stderr_ok, cap, &budget, &r->truncated);
  stand_down(&wd_fd);
  if (!s.child_reaped) {
    /* Only after giving up on a group that would not die. */
    kill(s.pid, SIGKILL); /* not reaped: the number is still its own */
    if (waitpid(s.pid, &s.wstatus, WNOHANG) != s.pid)
      s.wstatus = SIGKILL; /* as if reaped after it */
  }
  /* The watchdog exits as soon as it reads the byte; reap it, but do not
   * hang on one that was stopped. */
  for (int i = 0; i < 200 && s.watchdog > 0; i++) {
    pid_t p = waitpid(s.watchdog, NULL, WNOHANG);
    if (p == s.watchdog || (p < 0 && errno != EINTR))
      break;
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }

  r->killed = s.killed;
  r->status = WIFEXITED(s.wstatus)     ? WEXITSTATUS(s.wstatus)
              : WIFSIGNALED(s.wstatus) ? 128 + WTERMSIG(s.wstatus)
                                       : EXIT_SETUP_FAILED;
  if (got_signal) {
    r->end = RUN_INTERRUPTED;
    r->signal = got_signal;
  } else if (lost) {
    r->end = RUN_LOST;
  }
  r->out = cap[0].buf;
  r->out_len = cap[0].len;
  r->err = cap[1].buf;
  r->err_len = cap[1].len;
restore:
  prctl(PR_SET_CHILD_SUBREAPER, 0);
out:
  if (null_fd >= 0)
    close(null_fd);
}
