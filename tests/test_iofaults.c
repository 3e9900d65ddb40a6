/*
 * test_iofaults.c -- I/O faults under an SQLite store: a full disk (from
 * the fault VFS, and from a real tmpfs that fills up), EIO on write, on
 * fsync and on read.
 *
 * For each: every call that meets the fault fails with IDEM_EIO and a
 * detail saying what happened; nothing it did is kept (a local action's
 * row neither); nothing completed before is lost; once the fault is gone
 * the same handle works again (the failed key acts once, a held claim
 * completes); and after a power loss the store holds exactly what the
 * callers were told. A failed fsync forgets the writes it should have made
 * durable, as Linux does after a writeback error: a later successful sync
 * must not count as having saved them.
 */
#include <sched.h>
#include <sys/mount.h>

#include "engine_harness.c"
#include "fault_vfs.h"

#define FOP "POST /tickets"

/* The caller's table: one row per run of the local action. */
static int add_effect(void *conn, void *ctx, idem_response *r) {
  sqlite3 *db = conn;
  const char *body = ctx;
  sqlite3_stmt *q = NULL;
  int rc;
  if (sqlite3_exec(db,
                   "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, "
                   "body TEXT NOT NULL)",
                   NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO effects VALUES (?1, ?1)", -1, &q,
                         NULL) != SQLITE_OK)
    return 1;
  sqlite3_bind_text(q, 1, body, -1, SQLITE_STATIC);
  rc = sqlite3_step(q);
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE)
    return 1;
  r->status = 201;
  r->body = body;
  r->body_len = strlen(body);
  return 0;
}

/* Rows of the caller's table for key (its body is the key), through the
 * plain unix VFS. */
static long long effects_of(const char *path, const char *key) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  long long n = -1;
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, "unix") == SQLITE_OK &&
      sqlite3_prepare_v2(db, "SELECT count(*) FROM effects WHERE key = ?1", -1,
                         &q, NULL) == SQLITE_OK) {
    sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
    if (sqlite3_step(q) == SQLITE_ROW)
      n = sqlite3_column_int64(q, 0);
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  return n;
}

static void assert_integrity_ok(const char *path) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, "unix"),
                   SQLITE_OK);
  assert_int_equal(
      sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL),
      SQLITE_OK);
  assert_int_equal(sqlite3_step(q), SQLITE_ROW);
  assert_string_equal((const char *)sqlite3_column_text(q, 0), "ok");
  sqlite3_finalize(q);
  sqlite3_close(db);
}

static void key_fp(const char *key, char fp[IDEM_FINGERPRINT_SIZE]) {
  assert_int_equal(idem_sha256_hex(key, strlen(key), fp), IDEM_OK);
}

/* A local action on key that must succeed with the given outcome. */
static void local_ok(idem_store *s, const char *key, idem_outcome want) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"t", FOP, key};
  idem_call *c = NULL;
  key_fp(key, fp);
  EXPECT_RC(IDEM_OK,
            idem_execute_local(s, &id, fp, NULL, add_effect, (void *)key, &c));
  assert_int_equal(idem_call_outcome(c), want);
  assert_non_null(idem_call_response(c));
  assert_int_equal(idem_call_response(c)->body_len, strlen(key));
  assert_memory_equal(idem_call_response(c)->body, key, strlen(key));
  idem_call_free(c);
}

static void assert_eio(int rc, fvfs_fault kind) {
  if (rc != IDEM_EIO)
    fail_msg("under %s: %s (%s), expected IDEM_EIO", fvfs_fault_name(kind),
             idem_rc_name(rc), idem_errmsg());
  const char *want = kind == FVFS_WRITE_FULL ? "full" : "I/O error";
  if (!strstr(idem_errmsg(), want))
    fail_msg("under %s: the detail does not say '%s': %s",
             fvfs_fault_name(kind), want, idem_errmsg());
}

/* The record of key is completed with body == key (local) or body. */
static void assert_completed(idem_store *s, const char *key, const char *body) {
  idem_id id = {"t", FOP, key};
  idem_record *r = get_record(s, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  assert_int_equal(r->response.body_len, strlen(body));
  assert_memory_equal(r->response.body, body, strlen(body));
  idem_record_free(r);
}

#define HELD_BODY "{\"held\":\"done\"}"

/*
 * The scenario for a write-side fault: calls before it, calls during it
 * (each fails with IDEM_EIO, nothing kept), calls after it on the same
 * handle, then a power loss and the store reopened through "unix".
 */
static void write_fault(const char *dir, fvfs_fault kind) {
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *held = NULL, *c = (idem_call *)&c;
  idem_id held_id = {"t", FOP, "held"}, during_id = {"t", FOP, "claimed"};
  idem_response held_resp = {200, NULL, 0, HELD_BODY, strlen(HELD_BODY)};
  fvfs_stats before, after;
  snprintf(path, sizeof path, "%s/store.db", dir);
  assert_int_equal(fvfs_register(), SQLITE_OK);
  fvfs_reset(0x1234 + (uint64_t)kind);
  fvfs_make_default(1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  local_ok(s, "before-1", IDEM_PROCEED);
  local_ok(s, "before-2", IDEM_PROCEED);
  key_fp("held", fp);
  EXPECT_RC(IDEM_OK, idem_claim(s, &held_id, fp, NULL, &held));
  assert_int_equal(idem_call_outcome(held), IDEM_PROCEED);

  EXPECT_RC(IDEM_OK, idem_store_check(s));
  fvfs_get_stats(&before);
  fvfs_set_fault(kind, 0, -1);
  /* The readiness check meets the fault as a claim would: its write is
   * synced as a claim's is. */
  assert_eio(idem_store_check(s), kind);
  for (int i = 0; i < 3; i++) {
    c = (idem_call *)&c;
    key_fp("during", fp);
    idem_id id = {"t", FOP, "during"};
    assert_eio(
        idem_execute_local(s, &id, fp, NULL, add_effect, (void *)"during", &c),
        kind);
    assert_null(c);
    c = (idem_call *)&c;
    key_fp("claimed", fp);
    assert_eio(idem_claim(s, &during_id, fp, NULL, &c), kind);
    assert_null(c);
    assert_eio(idem_complete(s, held, &held_resp), kind);
    /* The claim is still held: the completion can be tried again. */
    assert_true(idem_call_lease_expires_ms(held) > 0);
  }
  /* What was completed before still replays. */
  local_ok(s, "before-1", IDEM_REPLAY);
  fvfs_get_stats(&after);
  assert_true(after.injected[kind] > before.injected[kind]);

  fvfs_set_fault(FVFS_NONE, 0, 0);
  {
    /* After a failed fsync, a handle that had the file open meanwhile gets
     * the error once more from its own next sync (as Linux does): the
     * check's connection may say so once, then no more. */
    int rc = idem_store_check(s);
    if (kind == FVFS_SYNC_EIO && rc == IDEM_EIO)
      rc = idem_store_check(s);
    EXPECT_RC(IDEM_OK, rc);
  }
  local_ok(s, "during", IDEM_PROCEED);
  local_ok(s, "during", IDEM_REPLAY);
  EXPECT_RC(IDEM_OK, idem_complete(s, held, &held_resp));
  idem_call_free(held);
  key_fp("claimed", fp);
  c = CLAIM(s, &during_id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &held_resp));
  idem_call_free(c);
  local_ok(s, "after", IDEM_PROCEED);
  idem_store_close(s);

  /* The power goes out; what the callers were told is on the disk. */
  fvfs_make_default(0);
  assert_int_equal(fvfs_power_loss(), 0);
  s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  assert_completed(s, "before-1", "before-1");
  assert_completed(s, "before-2", "before-2");
  assert_completed(s, "during", "during");
  assert_completed(s, "after", "after");
  assert_completed(s, "held", HELD_BODY);
  assert_completed(s, "claimed", HELD_BODY);
  idem_store_close(s);
  assert_int_equal(effects_of(path, "during"), 1);
  assert_int_equal(effects_of(path, "before-1"), 1);
  assert_int_equal(effects_of(path, "after"), 1);
  assert_integrity_ok(path);
}

static void test_full_from_vfs(void **state) {
  write_fault(*state, FVFS_WRITE_FULL);
}

static void test_eio_on_write(void **state) {
  write_fault(*state, FVFS_WRITE_EIO);
}

static void test_eio_on_fsync(void **state) {
  write_fault(*state, FVFS_SYNC_EIO);
}

/*
 * One failed fsync, then good ones (PostgreSQL's "fsyncgate"): the writes
 * of the failed commit are gone from the disk though the process can still
 * read them back. A retry of the call must write them again, and a power
 * loss after it must find it.
 */
static void test_fsync_fails_once(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  fvfs_stats before, after;
  int failures = 0;
  snprintf(path, sizeof path, "%s/store.db", dir);
  for (int round = 0; round < 20; round++) {
    fvfs_reset(0x77 + (uint64_t)round);
    fvfs_make_default(1);
    s = NULL;
    EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
    fvfs_get_stats(&before);
    /* One of the next syncs fails: a commit's, or a checkpoint's (the
     * store's own thread, or on close). */
    fvfs_set_fault(FVFS_SYNC_EIO, round % 4, 1);
    for (int k = 0; k < 2; k++) {
      char key[32];
      idem_call *c = NULL;
      snprintf(key, sizeof key, "%s-%d", k ? "next" : "once", round);
      idem_id id = {"t", FOP, key};
      key_fp(key, fp);
      int rc = idem_execute_local(s, &id, fp, NULL, add_effect, key, &c);
      if (rc != IDEM_OK) {
        /* The fault: nothing kept, and the retry acts. */
        assert_eio(rc, FVFS_SYNC_EIO);
        assert_null(c);
        failures++;
        local_ok(s, key, IDEM_PROCEED);
      } else {
        assert_int_equal(idem_call_outcome(c), IDEM_PROCEED);
        idem_call_free(c);
      }
      local_ok(s, key, IDEM_REPLAY);
    }
    idem_store_close(s);
    fvfs_get_stats(&after);
    assert_int_equal(after.injected[FVFS_SYNC_EIO],
                     before.injected[FVFS_SYNC_EIO] + 1);
    fvfs_make_default(0);
    assert_int_equal(fvfs_power_loss(), 0);
    s = NULL;
    EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
    for (int r = 0; r <= round; r++) {
      for (int k = 0; k < 2; k++) {
        char key[32];
        snprintf(key, sizeof key, "%s-%d", k ? "next" : "once", r);
        assert_completed(s, key, key);
        assert_int_equal(effects_of(path, key), 1);
      }
    }
    idem_store_close(s);
  }
  /* Most of the failed syncs were commits'. */
  assert_true(failures >= 5);
  assert_integrity_ok(path);
}

/*
 * A checkpoint's fsync of the database fails after checkpoints that a
 * reader kept from finishing wrote pages without syncing them (and counted
 * their frames as copied). The failed sync forgets those pages; no later
 * checkpoint may copy the frames after them and let the log start over, or
 * a power loss takes acknowledged calls with it. Without the group-commit
 * writer, so that each commit runs its checkpoint itself, in order.
 */
static void test_checkpoint_sync_fails(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], key[32];
  idem_store *s = NULL;
  idem_store_options o;
  sqlite3 *reader = NULL;
  fvfs_stats before, after;
  int n = 0;
  snprintf(path, sizeof path, "%s/store.db", dir);
  memset(&o, 0, sizeof o);
  o.group_commit = -1;
  fvfs_reset(0xc4e7);
  fvfs_make_default(1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, &o, &s));
  for (; n < 20; n++) {
    snprintf(key, sizeof key, "k-%d", n);
    local_ok(s, key, IDEM_PROCEED);
  }
  /* A reader holds its snapshot while the log passes the checkpoint size:
   * each commit's checkpoint copies only the frames before the snapshot. */
  assert_int_equal(
      sqlite3_open_v2(path, &reader, SQLITE_OPEN_READONLY, FVFS_NAME),
      SQLITE_OK);
  assert_int_equal(sqlite3_exec(reader,
                                "BEGIN; SELECT count(*) FROM idem_records",
                                NULL, NULL, NULL),
                   SQLITE_OK);
  for (; n < 600; n++) {
    snprintf(key, sizeof key, "k-%d", n);
    local_ok(s, key, IDEM_PROCEED);
  }
  sqlite3_exec(reader, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(reader);
  /* The next commit syncs the log, then its checkpoint syncs the log and
   * copies the rest: the database's sync fails. The commit itself stands. */
  fvfs_get_stats(&before);
  fvfs_set_fault(FVFS_SYNC_EIO, 2, 1);
  snprintf(key, sizeof key, "k-%d", n++);
  local_ok(s, key, IDEM_PROCEED);
  fvfs_get_stats(&after);
  assert_int_equal(after.injected[FVFS_SYNC_EIO],
                   before.injected[FVFS_SYNC_EIO] + 1);
  assert_true(after.forgotten > before.forgotten);
  fvfs_set_fault(FVFS_NONE, 0, 0);
  /* More commits, enough to restart the log were checkpoints still run. */
  for (; n < 1200; n++) {
    snprintf(key, sizeof key, "k-%d", n);
    local_ok(s, key, IDEM_PROCEED);
  }
  idem_store_close(s);
  /* Opened again, the store copies the whole log once more: its own
   * checkpoints, the log starting over, and the copy on close lose
   * nothing. */
  s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, &o, &s));
  for (; n < 1800; n++) {
    snprintf(key, sizeof key, "k-%d", n);
    local_ok(s, key, IDEM_PROCEED);
  }
  idem_store_close(s);

  fvfs_make_default(0);
  assert_int_equal(fvfs_power_loss(), 0);
  assert_integrity_ok(path);
  s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  for (int i = 0; i < n; i++) {
    snprintf(key, sizeof key, "k-%d", i);
    assert_completed(s, key, key);
    assert_int_equal(effects_of(path, key), 1);
  }
  idem_store_close(s);
}

/* Reads that fail: a new handle (nothing cached) cannot decide a claim; it
 * says so, and once reads work again, it replays. */
static void test_eio_on_read(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c = (idem_call *)&c;
  idem_id id = {"t", FOP, "done"};
  fvfs_stats before, after;
  snprintf(path, sizeof path, "%s/store.db", dir);
  assert_int_equal(fvfs_register(), SQLITE_OK);
  fvfs_reset(0x99);
  fvfs_make_default(1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  local_ok(s, "done", IDEM_PROCEED);
  idem_store_close(s);
  s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  fvfs_get_stats(&before);
  fvfs_set_fault(FVFS_READ_EIO, 0, -1);
  key_fp("done", fp);
  assert_eio(
      idem_execute_local(s, &id, fp, NULL, add_effect, (void *)"done", &c),
      FVFS_READ_EIO);
  assert_null(c);
  c = (idem_call *)&c;
  assert_eio(idem_claim(s, &id, fp, NULL, &c), FVFS_READ_EIO);
  assert_null(c);
  fvfs_get_stats(&after);
  assert_true(after.injected[FVFS_READ_EIO] > before.injected[FVFS_READ_EIO]);
  fvfs_set_fault(FVFS_NONE, 0, 0);
  local_ok(s, "done", IDEM_REPLAY);
  local_ok(s, "new", IDEM_PROCEED);
  idem_store_close(s);
  fvfs_make_default(0);
  assert_int_equal(fvfs_power_loss(), 0);
  assert_int_equal(effects_of(path, "done"), 1);
  assert_int_equal(effects_of(path, "new"), 1);
  assert_integrity_ok(path);
}

/*
 * A local action whose own statement meets an I/O error: SQLite then rolls
 * back the whole transaction by itself. Nothing of the action or its batch
 * was kept: the call fails with IDEM_EIO, the key is left free (not marked
 * unknown, as for an action that ended the transaction itself), and once
 * reads work again it acts, once.
 */
static int read_cold_table(void *conn, void *ctx, idem_response *r) {
  sqlite3 *db = conn;
  const char *key = ctx;
  /* Pages this connection never read, so that SQLite must read them. */
  fvfs_set_fault(FVFS_READ_EIO, 0, -1);
  if (sqlite3_exec(db, "SELECT sum(length(x)) FROM filler", NULL, NULL, NULL) !=
      SQLITE_OK)
    return 1;
  fvfs_set_fault(FVFS_NONE, 0, 0);
  return add_effect(conn, (void *)key, r);
}

static void test_eio_inside_local_action(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c = (idem_call *)&c;
  idem_id id = {"t", FOP, "cold"};
  sqlite3 *db = NULL;
  snprintf(path, sizeof path, "%s/store.db", dir);
  fvfs_reset(0x42);
  fvfs_make_default(1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  local_ok(s, "warm", IDEM_PROCEED);
  /* Another connection writes a table of its own. */
  assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, "unix"),
                   SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  assert_int_equal(
      sqlite3_exec(db,
                   "CREATE TABLE filler (x TEXT); WITH RECURSIVE n(i) AS "
                   "(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) "
                   "INSERT INTO filler SELECT printf('%.1000c', 'f') FROM n",
                   NULL, NULL, NULL),
      SQLITE_OK);
  sqlite3_close(db);

  key_fp("cold", fp);
  int rc =
      idem_execute_local(s, &id, fp, NULL, read_cold_table, (void *)"cold", &c);
  fvfs_set_fault(FVFS_NONE, 0, 0);
  if (rc != IDEM_EIO)
    fail_msg("an action whose statement met EIO: %s (%s), expected IDEM_EIO",
             idem_rc_name(rc), idem_errmsg());
  assert_null(c);
  assert_absent(s, &id);
  assert_int_equal(effects_of(path, "cold"), 0);
  local_ok(s, "cold", IDEM_PROCEED);
  local_ok(s, "cold", IDEM_REPLAY);
  local_ok(s, "warm", IDEM_REPLAY);
  idem_store_close(s);
  fvfs_make_default(0);
  assert_int_equal(fvfs_power_loss(), 0);
  assert_int_equal(effects_of(path, "cold"), 1);
  assert_integrity_ok(path);
}

/*
 * The first write batch of a handle also removes expired records, in the
 * same transaction. When that meets an I/O error SQLite rolls the whole
 * batch back: every call of it fails with IDEM_EIO and says so, nothing of
 * it is kept, and the expired records are still there to remove later.
 */
static int warm_then_fail_reads(void *conn, void *ctx, idem_response *r) {
  sqlite3 *db = conn;
  int rc = add_effect(conn, ctx, r);
  /* The pages the record's own write needs are read now (the newest end
   * of the expiry index); the oldest records' pages are not. */
  if (rc == 0 && sqlite3_exec(db, "SELECT max(expires_ms) FROM idem_records",
                              NULL, NULL, NULL) != SQLITE_OK)
    rc = 1;
  fvfs_set_fault(FVFS_READ_EIO, 0, -1);
  return rc;
}

static void test_eio_while_pruning(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c;
  idem_call_options brief = {.retention_ms = 1};
  idem_id id = {"t", FOP, "during-prune"};
  snprintf(path, sizeof path, "%s/store.db", dir);
  fvfs_reset(0x5150);
  fvfs_make_default(1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  /* The handle's first batch removes what expired: this one, so that the
   * records below stay until the next handle. */
  local_ok(s, "first", IDEM_PROCEED);
  for (int i = 0; i < 1500; i++) {
    char key[32];
    snprintf(key, sizeof key, "expired-%04d", i);
    idem_id e = {"t", FOP, key};
    key_fp(key, fp);
    c = NULL;
    EXPECT_RC(IDEM_OK,
              idem_execute_local(s, &e, fp, &brief, add_effect, key, &c));
    idem_call_free(c);
  }
  idem_store_close(s);
  sleep_ms(20);
  assert_int_equal(
      sqlite_side_sql(path, "SELECT count(*) FROM idem_records", NULL), 1501);

  s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  key_fp("during-prune", fp);
  c = (idem_call *)&c;
  int rc = idem_execute_local(s, &id, fp, NULL, warm_then_fail_reads,
                              (void *)"during-prune", &c);
  fvfs_set_fault(FVFS_NONE, 0, 0);
  if (rc != IDEM_EIO || !strstr(idem_errmsg(), "expired"))
    fail_msg("a batch rolled back while pruning: %s (%s), expected IDEM_EIO",
             idem_rc_name(rc), idem_errmsg());
  assert_null(c);
  assert_absent(s, &id);
  assert_int_equal(effects_of(path, "during-prune"), 0);
  assert_int_equal(
      sqlite_side_sql(path, "SELECT count(*) FROM idem_records", NULL), 1501);
  local_ok(s, "during-prune", IDEM_PROCEED);
  idem_store_close(s);
  fvfs_make_default(0);
  assert_int_equal(fvfs_power_loss(), 0);
  assert_int_equal(effects_of(path, "during-prune"), 1);
  assert_integrity_ok(path);
}

/* ------------------------------------------------------------------ */
/* A real full disk: a small tmpfs in a mount namespace of a child's     */
/* ------------------------------------------------------------------ */

/* Makes a private mount namespace and mounts a tmpfs of size bytes on dir.
 * 0, or -1 with the reason in why. */
static int mount_small_tmpfs(const char *dir, long size, char *why,
                             size_t whysize) {
  char opts[64];
  if (geteuid() != 0) {
    /* Without root: a user namespace of our own may mount a tmpfs. */
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char map[64];
    int fd;
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      snprintf(why, whysize, "unshare(user, mount): %s", strerror(errno));
      return -1;
    }
    fd = open("/proc/self/setgroups", O_WRONLY);
    if (fd >= 0) {
      (void)!write(fd, "deny", 4);
      close(fd);
    }
    snprintf(map, sizeof map, "0 %u 1", (unsigned)uid);
    fd = open("/proc/self/uid_map", O_WRONLY);
    if (fd < 0 || write(fd, map, strlen(map)) < 0) {
      snprintf(why, whysize, "uid_map: %s", strerror(errno));
      return -1;
    }
    close(fd);
    snprintf(map, sizeof map, "0 %u 1", (unsigned)gid);
    fd = open("/proc/self/gid_map", O_WRONLY);
    if (fd < 0 || write(fd, map, strlen(map)) < 0) {
      snprintf(why, whysize, "gid_map: %s", strerror(errno));
      return -1;
    }
    close(fd);
  } else if (unshare(CLONE_NEWNS) != 0) {
    snprintf(why, whysize, "unshare(mount): %s", strerror(errno));
    return -1;
  }
  if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    snprintf(why, whysize, "making mounts private: %s", strerror(errno));
    return -1;
  }
  snprintf(opts, sizeof opts, "size=%ld,mode=0700", size);
  if (mount("tmpfs", dir, "tmpfs", 0, opts) != 0) {
    snprintf(why, whysize, "mount tmpfs on %.200s: %s", dir, strerror(errno));
    return -1;
  }
  return 0;
}

#define BIG 24000

static int big_effect(void *conn, void *ctx, idem_response *r) {
  static char body[BIG + 64];
  sqlite3 *db = conn;
  const char *key = ctx;
  sqlite3_stmt *q = NULL;
  int rc;
  snprintf(body, sizeof body, "%s:", key);
  memset(body + strlen(body), 'x', BIG);
  body[BIG] = '\0';
  if (sqlite3_exec(db,
                   "CREATE TABLE IF NOT EXISTS effects (key TEXT NOT NULL, "
                   "body TEXT NOT NULL)",
                   NULL, NULL, NULL) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "INSERT INTO effects VALUES (?1, ?2)", -1, &q,
                         NULL) != SQLITE_OK)
    return 1;
  sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, body, -1, SQLITE_STATIC);
  rc = sqlite3_step(q);
  sqlite3_finalize(q);
  if (rc != SQLITE_DONE)
    return 1;
  r->status = 201;
  r->body = body;
  r->body_len = strlen(body);
  return 0;
}

/* In the child: fills the tmpfs through the store. Returns a message on
 * failure, NULL when every check passed. */
static const char *full_tmpfs_child(const char *dir, char *msg, size_t size) {
  char path[URL_MAX + 32], ballast[URL_MAX + 32], key[32],
      fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c = NULL;
  int n_ok = 0, rc = IDEM_OK, fd;
  if (snprintf(path, sizeof path, "%s/store.db", dir) >= (int)sizeof path ||
      snprintf(ballast, sizeof ballast, "%s/ballast", dir) >=
          (int)sizeof ballast)
    return "path too long";
  /* Room kept aside, to free once the disk is full. */
  fd = open(ballast, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0)
    return "cannot create the ballast file";
  {
    static char zero[65536];
    for (int i = 0; i < 8; i++)
      if (write(fd, zero, sizeof zero) != (ssize_t)sizeof zero)
        return "cannot write the ballast file";
    close(fd);
  }
  if ((rc = idem_store_open(path, NULL, &s)) != IDEM_OK) {
    snprintf(msg, size, "open: %s: %s", idem_rc_name(rc), idem_errmsg());
    return msg;
  }
  for (int i = 0; i < 400; i++) {
    snprintf(key, sizeof key, "fill-%d", i);
    idem_id id = {"t", FOP, key};
    key_fp(key, fp);
    c = NULL;
    rc = idem_execute_local(s, &id, fp, NULL, big_effect, key, &c);
    idem_call_free(c);
    if (rc != IDEM_OK)
      break;
    n_ok++;
  }
  if (rc != IDEM_EIO || !strstr(idem_errmsg(), "full")) {
    snprintf(msg, size,
             "after %d local actions the disk should be full: %s (%s)", n_ok,
             idem_rc_name(rc), idem_errmsg());
    return msg;
  }
  if (n_ok < 3) {
    snprintf(msg, size, "only %d actions fit", n_ok);
    return msg;
  }
  /* The failed key kept nothing; a claim on a new key fails the same way
   * or succeeds (a claim is small), never anything else. */
  snprintf(key, sizeof key, "fill-%d", n_ok);
  if (effects_of(path, key) > 0) {
    snprintf(msg, size, "the failed action's row was kept");
    return msg;
  }
  unlink(ballast);
  /* Room again: the same handle works, and the failed key acts once. */
  for (int i = n_ok; i < n_ok + 3; i++) {
    snprintf(key, sizeof key, "fill-%d", i);
    idem_id id = {"t", FOP, key};
    key_fp(key, fp);
    c = NULL;
    rc = idem_execute_local(s, &id, fp, NULL, big_effect, key, &c);
    if (rc != IDEM_OK || idem_call_outcome(c) != IDEM_PROCEED) {
      snprintf(msg, size, "after freeing room, %s: %s %s", key,
               idem_rc_name(rc), idem_errmsg());
      idem_call_free(c);
      return msg;
    }
    idem_call_free(c);
  }
  idem_store_close(s);
  s = NULL;
  if ((rc = idem_store_open(path, NULL, &s)) != IDEM_OK) {
    snprintf(msg, size, "reopen: %s: %s", idem_rc_name(rc), idem_errmsg());
    return msg;
  }
  for (int i = 0; i < n_ok + 3; i++) {
    snprintf(key, sizeof key, "fill-%d", i);
    idem_id id = {"t", FOP, key};
    idem_record *r = NULL;
    rc = idem_get(s, &id, &r);
    if (rc != IDEM_OK || r->state != IDEM_STATE_COMPLETED ||
        r->response.body_len != BIG || effects_of(path, key) != 1) {
      snprintf(msg, size, "%s after reopening: %s", key, idem_rc_name(rc));
      idem_record_free(r);
      return msg;
    }
    idem_record_free(r);
  }
  idem_store_close(s);
  return NULL;
}

static void test_full_tmpfs(void **state) {
  const char *dir = *state;
  char mnt[URL_MAX + 32];
  int pfd[2], status = 0;
  char msg[1024] = "";
  pid_t pid;
  snprintf(mnt, sizeof mnt, "%s/small", dir);
  assert_int_equal(mkdir(mnt, 0700), 0);
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char why[512] = "";
    const char *bad;
    close(pfd[0]);
    if (mount_small_tmpfs(mnt, 1024 * 1024, why, sizeof why) != 0) {
      snprintf(msg, sizeof msg, "cannot mount a small tmpfs: %s", why);
      bad = msg;
    } else {
      bad = full_tmpfs_child(mnt, why, sizeof why);
    }
    if (bad)
      (void)!write(pfd[1], bad, strlen(bad));
    _exit(bad ? 1 : 0);
  }
  close(pfd[1]);
  ssize_t n = read(pfd[0], msg, sizeof msg - 1);
  msg[n > 0 ? n : 0] = '\0';
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("full tmpfs: %s", msg[0] ? msg : "the child died");
}

/* A temporary folder, and the fault VFS registered, idle and not the
 * default (a test that failed half-way leaves nothing behind). */
static int setup_faults(void **state) {
  if (fvfs_register() != SQLITE_OK)
    return -1;
  fvfs_reset(1);
  fvfs_make_default(0);
  return setup_tmpdir(state);
}

static int teardown_faults(void **state) {
  fvfs_reset(1);
  fvfs_make_default(0);
  return teardown_tmpdir(state);
}

#define FAULT_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_faults, teardown_faults)

int main(void) {
  /* clang-format off */
  const struct CMUnitTest tests[] = {
      FAULT_TEST(test_full_from_vfs),
      FAULT_TEST(test_eio_on_write),
      FAULT_TEST(test_eio_on_fsync),
      FAULT_TEST(test_fsync_fails_once),
      FAULT_TEST(test_checkpoint_sync_fails),
      FAULT_TEST(test_eio_on_read),
      FAULT_TEST(test_eio_inside_local_action),
      FAULT_TEST(test_eio_while_pruning),
      FAULT_TEST(test_full_tmpfs),
  };
  /* clang-format on */
  return cmocka_run_group_tests(tests, NULL, NULL);
}
