/*
 * lease.h -- holding leases while actions run, and waiting on keys in
 * flight.
 *
 * One scheduler per store renews every lease that idem_execute() holds: a
 * thread of its own that gathers the leases due and renews them in one
 * batch, so that thousands of calls in flight cost one thread, not one
 * each. A lease's loss is read from its deadline, not from the renewals:
 * idem__lease_lost() and the descriptor of idem__lease_lost_fd() turn true
 * at the deadline the last written renewal set, whatever a renewal in
 * progress is doing.
 *
 * The waiting room lets a caller answered IN_FLIGHT wait for the holder to
 * end the record: an ending in this process wakes its waiters at once;
 * other processes' endings reach them through the backend (notifications)
 * or through polling.
 */
#ifndef IDEM_LEASE_H
#define IDEM_LEASE_H

#include "store.h"

#include <pthread.h>

typedef struct idem__sched idem__sched;

/* One held lease. The caller fills call, lease_ms and claimed_mono and
 * keeps the struct in place until idem__lease_stop(). */
typedef struct idem__lease {
  idem_call *call;
  int64_t lease_ms;
  int64_t claimed_mono; /* a monotonic time before the claim was asked */

  /* The scheduler's. */
  idem_id id;
  int64_t period_ms, due_mono;
  int64_t deadline_mono; /* when the lease ends: __atomic */
  int lost;              /* __atomic */
  int stale, busy, ending, done;
  int tfd; /* a timerfd, made when asked for */
  pthread_mutex_t fdmu; /* guards tfd, deadline changes and lost's setting */
  char *why; /* why it was lost, once stale (malloc()ed: seldom needed) */
  struct idem__lease *prev, *next;
  idem__sched *sched;
} idem__lease;

/* When a lease written as lease_expires_ms (by the store's clock) ends,
 * on the monotonic clock; asked_mono is a moment before the write was
 * asked. */
int64_t idem__lease_deadline(const idem_store *store, int64_t lease_expires_ms,
                             int64_t asked_mono, int64_t lease_ms);
/* Starts renewing l's lease on its store's scheduler. */
int idem__lease_start(idem_store *store, idem__lease *l);
/*
 * Holds renewals of l off while its holder writes an ending: waits for a
 * renewal in progress to end. Returns non-zero when the lease was taken
 * over (why says how).
 */
int idem__lease_hold(idem__lease *l, char *why, size_t size);
/* idem__lease_hold() when it need not wait and the lease was not taken
 * over: 0 held, or non-zero (not held: a renewal is running, or the lease
 * is stale). */
int idem__lease_try_hold(idem__lease *l);
/* Lets renewals go on (final == 0: the ending is tried again later) or
 * ends them for good (final != 0). */
void idem__lease_unhold(idem__lease *l, int final);
/* Ends l's renewals and frees what it holds; l may go after. */
void idem__lease_stop(idem__lease *l);
int idem__lease_lost(idem__lease *l);
int idem__lease_lost_fd(idem__lease *l);

/* Stops and frees a store's scheduler (idem_store_close()). */
void idem__sched_free(idem__sched *s);

/* ---- waiting on a key in flight ---------------------------------------- */

/* A place in the waiting room for id; its generation changes whenever a
 * record that may be id's ends in this process (or is reported so). */
typedef struct idem__waiter {
  unsigned bucket;
  uint64_t gen;
} idem__waiter;

/* The room's bucket for a text that names an id (idem__wait_name()). */
unsigned idem__wait_bucket(const char *name, size_t len);
/* tenant, 0x1f, operation, 0x1f, key into buf; its length (0 when it does
 * not fit). The PostgreSQL store notifies with the same text. */
size_t idem__wait_name(const idem_id *id, char *buf, size_t size);
void idem__wait_enter(const idem_id *id, idem__waiter *w);
void idem__wait_leave(idem__waiter *w);
/* Notes the current generation: call before asking the store again. */
void idem__wait_mark(idem__waiter *w);
/* Sleeps until the generation moves past the mark or until_mono. Returns
 * non-zero when woken by an ending. */
int idem__wait_sleep(idem__waiter *w, int64_t until_mono);
/* Wakes the waiters of id; cheap when there are none. */
void idem__wait_wake(const idem_id *id);
void idem__wait_wake_bucket(unsigned bucket);
/* A backend heard of an ending from another process (a notification):
 * wakes the bucket and counts it. */
void idem__wait_reported(unsigned bucket);
/* How many such reports this process heard (for tests). */
unsigned long idem__wait_reports(void);
/* How many callers wait in id's bucket (for tests). */
int idem__wait_count(const idem_id *id);

/* A monotonic clock in milliseconds. */
int64_t idem__mono_ms(void);
/* The kernel's boot-time clock in milliseconds (CLOCK_BOOTTIME): monotonic,
 * counting suspend, and the same in every process of the machine until it
 * restarts; steps of the wall clock never move it. The SQLite store's
 * leases are on it. */
int64_t idem__boot_ms(void);
/* This boot's id (/proc/sys/kernel/random/boot_id, 36 characters and a
 * NUL): a lease on the boot clock means something only in the boot that
 * wrote it. IDEM_OK, or IDEM_EIO with the detail set. */
int idem__boot_id(char id[40]);
/* A time on the boot-time clock, in Unix ms by this process's wall clock
 * now. */
int64_t idem__lease_to_wall(int64_t boot_ms);
/* pthread_create() for the library's own threads: all signals blocked in
 * the new thread, so that process signals are delivered to the program's
 * threads, never to ours. name ("idem-...", at most 15 bytes) is what ps
 * and /proc show; else a thread would bear its creator's, which may be
 * the program's (an HTTP library's worker). */
int idem__thread_start(pthread_t *t, const char *name, void *(*fn)(void *),
                       void *arg);

#endif
