/*
 * fault_vfs.h -- an SQLite VFS for the fault tests: a shim over the "unix"
 * VFS that simulates power loss and injects I/O errors.
 *
 * Power loss, as SQLite's own crash tests model it (src/test6.c): every
 * write reaches the real file at once (so the process reads what it wrote,
 * as through a page cache), and the shim also keeps, per file, the content
 * that is durable (as of the file's last successful sync) and the writes
 * and truncations made since. fvfs_power_loss() then rewrites each file as
 * a disk could hold it after the power went out: the durable content, plus
 * each later write kept whole, dropped, or torn (only its first 512-byte
 * sectors written, the rest old bytes or garbage), in order. Writes are
 * counted with syncs and truncations as "events"; fvfs_arm_crash(n) stops
 * the machine at event n: that write or sync and everything after it fail,
 * and nothing more reaches the files.
 *
 * Real fsyncs are not issued: durability is what the shim says it is.
 *
 * Faults: fvfs_set_fault() makes writes fail with SQLITE_FULL or
 * SQLITE_IOERR_WRITE, syncs fail with SQLITE_IOERR_FSYNC, or reads fail with
 * SQLITE_IOERR_READ. A failed sync behaves as Linux after a writeback error
 * (PostgreSQL's "fsyncgate"): the file's writes since its last sync are
 * forgotten by the disk, never to be made durable by a later sync, though
 * the process still reads them back; and, as Linux does since 4.13, each
 * other handle that had the file open then gets the error from its own
 * next sync (once).
 *
 * Only the database file, its write-ahead log and a rollback journal are
 * followed; the shared-memory file is memory, and a power loss deletes it.
 */
#ifndef IDEM_FAULT_VFS_H
#define IDEM_FAULT_VFS_H

#include <stdint.h>

#define FVFS_NAME "idem-fault"

typedef enum fvfs_fault {
  FVFS_NONE = 0,
  FVFS_WRITE_FULL, /* xWrite: SQLITE_FULL, nothing written */
  FVFS_WRITE_EIO,  /* xWrite: SQLITE_IOERR_WRITE, nothing written */
  FVFS_SYNC_EIO,   /* xSync: SQLITE_IOERR_FSYNC, unsynced writes forgotten */
  FVFS_READ_EIO,   /* xRead: SQLITE_IOERR_READ */
  FVFS_KINDS
} fvfs_fault;

typedef struct fvfs_stats {
  long long writes, syncs, truncates; /* events while tracking */
  long long injected[FVFS_KINDS];     /* faults injected, by kind */
  long long crashes;                  /* armed crash points reached */
  /* What power losses did to the writes not yet synced. */
  long long kept, dropped, torn, torn_garbage, trunc_kept, trunc_dropped;
  long long forgotten;      /* writes forgotten by a failed sync */
  long long reported_again; /* a failed sync reported to another handle */
} fvfs_stats;

/* Registers the VFS (once; not as the default). SQLITE_OK or an error. */
int fvfs_register(void);
/* Non-zero: the VFS becomes SQLite's default, so that connections opened
 * without naming a VFS (idem's) use it; 0: "unix" is the default again. */
void fvfs_make_default(int on);
/* Forgets every file followed and the crash state; seeds the choices. The
 * files' content as found on their next open counts as durable. */
void fvfs_reset(uint64_t seed);
/* Stops the machine at the n-th event from now (0: never). */
void fvfs_arm_crash(long long n);
/* Non-zero once the armed crash point was reached. */
int fvfs_crashed(void);
/* Events so far since fvfs_reset(). */
long long fvfs_events(void);
/*
 * Fails the next `times` operations of `kind` (-1: every one until
 * cleared) after letting `skip` of them through; FVFS_NONE clears.
 */
void fvfs_set_fault(fvfs_fault kind, int skip, int times);
/*
 * The power goes out: every file followed is rewritten as the disk could
 * hold it (see above), shared-memory files are deleted, and the VFS stops
 * following them (as fvfs_reset()). No connection may be open. 0 on
 * success, -1 (errno set) when a file could not be written.
 */
int fvfs_power_loss(void);
/*
 * Non-zero: a disk that lies: syncs succeed without making anything
 * durable. For the campaigns' own test: they must catch it.
 */
void fvfs_set_lying(int on);
/* The counters since the program started. */
void fvfs_get_stats(fvfs_stats *out);
const char *fvfs_fault_name(fvfs_fault kind);

#endif
