/*
 * run_child.h -- the command of `idem run` as a process: its process group,
 * its output, the signals idem run receives meanwhile, and the watchdog that
 * kills the group when idem run dies.
 *
 * run_child() knows nothing of the store. What keeps the key held (the
 * library's renewer, in idem_execute()) tells it through a file descriptor
 * that becomes readable once the key is lost, which stops the command.
 */
#ifndef IDEM_RUN_CHILD_H
#define IDEM_RUN_CHILD_H

#include <stddef.h>
#include <stdint.h>

typedef struct run_child_opts {
  char *const *argv;     /* the command; argv[0] is looked up in PATH */
  int stdin_fd;          /* its standard input; -1: /dev/null */
  size_t max_output;     /* kept of stdout and stderr together */
  int64_t kill_after_ms; /* from the first signal to SIGKILL */
  int lost_fd;           /* -1, or readable once the key is lost */
} run_child_opts;

typedef enum run_end {
  RUN_NOT_STARTED = 0, /* nothing ran: exec_errno says why, or signal
                          when idem run got one before it started */
  RUN_EXITED,          /* the command ended by itself (status) */
  RUN_INTERRUPTED,     /* idem run got a signal (signal); the command's
                          group was stopped */
  RUN_LOST             /* the key was lost; the command's group was stopped */
} run_end;

typedef struct run_child_result {
  run_end end;
  int status;      /* RUN_EXITED: its exit status, 128+N after signal N */
  int exec_errno;  /* RUN_NOT_STARTED: the errno of exec, or of the setup */
  int exec_failed; /* RUN_NOT_STARTED: non-zero when exec itself failed */
  int signal;      /* the first signal idem run got (RUN_INTERRUPTED, or
                      RUN_NOT_STARTED) */
  int killed;      /* the group had to be killed with SIGKILL */
  char *out, *err; /* what was kept of stdout and stderr */
  size_t out_len, err_len;
  int truncated; /* output beyond max_output was shown but not kept */
} run_child_result;

/*
 * Runs the command in a process group of its own, passes its stdout and
 * stderr through to idem run's while keeping the first max_output bytes of
 * both together, and returns once it has ended: the direct child reaped and
 * both pipes closed (processes it leaves behind with their output closed are
 * not waited for). SIGINT, SIGTERM and SIGHUP received meanwhile (unless
 * they were ignored when idem run started) and a lost key stop the command:
 * its group gets the signal (SIGTERM for a lost key), its output is still
 * drained, and after kill_after_ms the group gets SIGKILL. One of those
 * signals noted before run_child() is called (while the key was claimed)
 * means the command is not started at all. Must be called between
 * run_signals_hold() and run_signals_release(). Fills *r; free it with
 * run_child_result_free() whatever the outcome. Output that does not fit
 * in memory is shown but not kept, as beyond max_output.
 */
void run_child(const run_child_opts *o, run_child_result *r);

/*
 * From run_signals_hold() to run_signals_release(), SIGINT, SIGTERM and
 * SIGHUP (those not ignored when idem run started) and SIGCHLD no longer
 * act: they are noted, whichever thread of idem run they reach (libidem
 * has threads of its own), for run_child() to act on. So a signal that
 * comes while the key is being claimed, or while the result is being
 * recorded, cannot end idem run between the two and leave the key in
 * progress. run_signals_hold() returns 0, or -1 with errno set.
 * run_signals_release() restores the signals' dispositions and returns the
 * first stop signal noted that run_child() did not act on, or 0.
 */
int run_signals_hold(void);
int run_signals_release(void);

void run_child_result_free(run_child_result *r);

#endif
