/*
 * test_store_files.c -- SQLite store files that cannot be used as they
 * are: truncated, garbage behind an SQLite header, a folder, a folder
 * nobody may write, an unreadable file, a store whose schema a newer idem
 * changed while this one had it open, and a store file deleted, moved or
 * replaced while it was open; and what idem_store_check() says of each.
 *
 * For each: a clear error naming the file, never a crash, and never a new
 * store silently made in place of the old one (the file's bytes are left
 * as they were). Files that are not SQLite databases at all and stores of
 * a newer schema at open time are in test_stores.c.
 */
#include "engine_harness.c"

#define FOP "POST /tickets"

static void key_fp(const char *key, char fp[IDEM_FINGERPRINT_SIZE]) {
  assert_int_equal(idem_sha256_hex(key, strlen(key), fp), IDEM_OK);
}

/* A store of n completed records, closed (its log folded in). */
static void make_store(const char *path, int n) {
  idem_store *s = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  for (int i = 0; i < n; i++) {
    char key[32], fp[IDEM_FINGERPRINT_SIZE];
    idem_call *c;
    snprintf(key, sizeof key, "key-%d", i);
    idem_id id = {"t", FOP, key};
    key_fp(key, fp);
    c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
    idem_response r = {200, NULL, 0, key, strlen(key)};
    EXPECT_RC(IDEM_OK, idem_complete(s, c, &r));
    idem_call_free(c);
  }
  idem_store_close(s);
}

static void copy_file(const char *from, const char *to, long size) {
  size_t len;
  unsigned char *b = read_whole(from, &len);
  FILE *f;
  assert_non_null(b);
  if (size >= 0 && (size_t)size < len)
    len = (size_t)size;
  f = fopen(to, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
  free(b);
}

/* Opening path fails with want, names the file, and leaves it as it was;
 * read-only too. */
static void expect_refused(const char *path, int want) {
  size_t before_len, after_len;
  unsigned char *before = read_whole(path, &before_len), *after;
  idem_store_options ro = {.read_only = 1};
  idem_store *s;
  for (int i = 0; i < 2; i++) {
    s = (idem_store *)&s;
    int rc = idem_store_open(path, i ? &ro : NULL, &s);
    if (rc != want)
      fail_msg("%s (%s): %s (%s), expected %s", path,
               i ? "read-only" : "read-write", idem_rc_name(rc), idem_errmsg(),
               idem_rc_name(want));
    assert_null(s);
    if (!strstr(idem_errmsg(), path))
      fail_msg("the detail does not name the file: %s", idem_errmsg());
  }
  after = read_whole(path, &after_len);
  assert_non_null(before);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
}

/* A store cut short anywhere: in its header, after its first page, in the
 * middle, one page before its end. */
static void test_truncated_store(void **state) {
  const char *dir = *state;
  char good[URL_MAX + 32], cut[URL_MAX + 64];
  struct stat st;
  snprintf(good, sizeof good, "%s/good.db", dir);
  make_store(good, 400);
  assert_int_equal(stat(good, &st), 0);
  assert_true(st.st_size > 8 * 4096);
  long sizes[] = {50, 100, 4096, (long)st.st_size / 2, (long)st.st_size - 4096};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    snprintf(cut, sizeof cut, "%s/cut-%ld.db", dir, sizes[i]);
    copy_file(good, cut, sizes[i]);
    expect_refused(cut, IDEM_ESTORE);
  }
}

/* An SQLite header followed by garbage. */
static void test_garbage_behind_header(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32];
  unsigned char b[3 * 4096];
  uint64_t x = 0x2545f4914f6cdd1dull;
  FILE *f;
  snprintf(path, sizeof path, "%s/garbage.db", dir);
  for (size_t i = 0; i < sizeof b; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b[i] = (unsigned char)x;
  }
  memcpy(b, "SQLite format 3", 16);
  f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, sizeof b, f), sizeof b);
  assert_int_equal(fclose(f), 0);
  expect_refused(path, IDEM_ESTORE);
}

/* A folder named as the store: said so, and nothing made in it. */
static void test_directory(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], url[URL_MAX + 64];
  idem_store *s;
  snprintf(path, sizeof path, "%s/folder", dir);
  assert_int_equal(mkdir(path, 0755), 0);
  for (int form = 0; form < 2; form++) {
    snprintf(url, sizeof url, "%s%s", form ? "sqlite:" : "", path);
    s = (idem_store *)&s;
    EXPECT_RC(IDEM_ESTORE, idem_store_open(url, NULL, &s));
    assert_null(s);
    assert_non_null(strstr(idem_errmsg(), path));
    assert_non_null(strstr(idem_errmsg(), "directory"));
  }
  snprintf(url, sizeof url, "%s/folder-wal", dir);
  assert_int_equal(access(url, F_OK), -1);
  snprintf(url, sizeof url, "%s/folder-shm", dir);
  assert_int_equal(access(url, F_OK), -1);
}

/* ---- as a user without rights ----------------------------------------- */

typedef struct nobody_report {
  int dropped;
  int rc;
  char err[1024];
} nobody_report;

/* Runs idem_store_open(path, opts) in a child that is nobody (when root),
 * and reports its result. */
static nobody_report open_as_nobody(const char *path,
                                    const idem_store_options *opts) {
  nobody_report m;
  int pfd[2], status = 0;
  pid_t pid;
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    idem_store *s = NULL;
    close(pfd[0]);
    memset(&m, 0, sizeof m);
    if (geteuid() == 0) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        _exit(4);
      m.dropped = 1;
    }
    m.rc = idem_store_open(path, opts, &s);
    snprintf(m.err, sizeof m.err, "%s", idem_errmsg());
    idem_store_close(s);
    _exit(write_all(pfd[1], &m, sizeof m) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  memset(&m, 0, sizeof m);
  assert_int_equal(read_all(pfd[0], &m, sizeof m), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  return m;
}

static void expect_nobody_refused(const char *path,
                                  const idem_store_options *opts,
                                  const char *says) {
  nobody_report m = open_as_nobody(path, opts);
  if (m.rc != IDEM_ESTORE)
    fail_msg("%s: %s (%s), expected IDEM_ESTORE", path, idem_rc_name(m.rc),
             m.err);
  if (!strstr(m.err, path))
    fail_msg("the detail does not name the file: %s", m.err);
  if (says && !strstr(m.err, says))
    fail_msg("the detail does not say '%s': %s", says, m.err);
}

/* A folder nobody may write: no new store in it, and an existing store
 * cannot be written (its log and shared memory cannot be made) but can be
 * read. */
static void test_read_only_directory(void **state) {
  const char *dir = *state;
  char ro[URL_MAX + 32], fresh[URL_MAX + 64], store[URL_MAX + 64];
  idem_store_options read_only = {.read_only = 1};
  snprintf(ro, sizeof ro, "%s/ro", dir);
  assert_int_equal(mkdir(ro, 0755), 0);
  assert_int_equal(chmod(dir, 0755), 0);
  snprintf(store, sizeof store, "%s/store.db", ro);
  make_store(store, 3);
  /* The file is nobody's to write (as root: the child becomes nobody);
   * the folder is not. */
  if (geteuid() == 0)
    assert_int_equal(chown(store, 65534, 65534), 0);
  assert_int_equal(chmod(ro, 0555), 0);

  snprintf(fresh, sizeof fresh, "%s/new.db", ro);
  expect_nobody_refused(fresh, NULL, "Permission denied");
  assert_int_equal(access(fresh, F_OK), -1);

  size_t before_len, after_len;
  unsigned char *before = read_whole(store, &before_len), *after;
  expect_nobody_refused(store, NULL, "folder");
  nobody_report m = open_as_nobody(store, &read_only);
  if (m.rc != IDEM_OK)
    fail_msg("read-only open of %s: %s (%s)", store, idem_rc_name(m.rc), m.err);
  after = read_whole(store, &after_len);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
  assert_int_equal(chmod(ro, 0755), 0);
}

/* A store file its user may not read. */
static void test_unreadable_file(void **state) {
  const char *dir = *state;
  char store[URL_MAX + 32];
  idem_store_options read_only = {.read_only = 1};
  assert_int_equal(chmod(dir, 0777), 0);
  snprintf(store, sizeof store, "%s/store.db", dir);
  make_store(store, 2);
  assert_int_equal(chmod(store, 0), 0);
  size_t before_len, after_len;
  unsigned char *before = read_whole(store, &before_len), *after;
  expect_nobody_refused(store, NULL, NULL);
  expect_nobody_refused(store, &read_only, NULL);
  after = read_whole(store, &after_len);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
}

/* ---- idem_store_check(), and the file changed under an open store -------- */

/*
 * The store file deleted, moved away, or replaced by another store while a
 * handle has it open: the handle's writes would go into a file nobody
 * opens again (lost when it closes, and a restart would start from an empty
 * or other store). idem_store_check() says so, and every write through the
 * handle is refused, as with a deleted log; what was completed is still
 * replayed and read.
 */
static void changed_under_open_store(const char *dir, const char *how) {
  char path[URL_MAX + 32], other[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_id done = {"t", FOP, "key-0"}, fresh = {"t", FOP, "fresh"};
  idem_response resp = {201, NULL, 0, "x", 1};
  idem_store *s = NULL;
  idem_record *rec = NULL;
  idem_call *c;
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(other, sizeof other, "%s/other.db", dir);
  make_store(path, 1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &s));
  EXPECT_RC(IDEM_OK, idem_store_check(s));
  assert_string_equal(idem_errmsg(), "");
  if (strcmp(how, "deleted") == 0) {
    assert_int_equal(unlink(path), 0);
  } else if (strcmp(how, "moved") == 0) {
    assert_int_equal(rename(path, other), 0);
  } else { /* replaced by another store (a copy of a backup, say) */
    make_store(other, 2);
    assert_int_equal(rename(other, path), 0);
  }
  EXPECT_RC(IDEM_ESTORE, idem_store_check(s));
  if (!strstr(idem_errmsg(), "deleted, moved or replaced") ||
      !strstr(idem_errmsg(), path))
    fail_msg("%s: the detail does not say so: %s", how, idem_errmsg());
  key_fp("fresh", fp);
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_ESTORE, idem_claim(s, &fresh, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "deleted, moved or replaced"));
  EXPECT_RC(IDEM_ESTORE, idem_resolve(s, &done, &resp));
  EXPECT_RC(IDEM_ESTORE, idem_delete(s, &done));
  /* What was completed before is still answered. */
  key_fp("key-0", fp);
  c = CLAIM(s, &done, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);
  EXPECT_RC(IDEM_OK, idem_get(s, &done, &rec));
  idem_record_free(rec);
  idem_store_close(s);
}

static void test_check_store_deleted(void **state) {
  changed_under_open_store(*state, "deleted");
}

static void test_check_store_moved(void **state) {
  changed_under_open_store(*state, "moved");
}

static void test_check_store_replaced(void **state) {
  changed_under_open_store(*state, "replaced");
}

/* A handle opened read-only takes no writes: not ready. */
static void test_check_read_only_handle(void **state) {
  char path[URL_MAX + 32];
  idem_store_options ro = {.read_only = 1};
  idem_store *s = NULL;
  snprintf(path, sizeof path, "%s/store.db", (const char *)*state);
  make_store(path, 1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, &ro, &s));
  EXPECT_RC(IDEM_ESTORE, idem_store_check(s));
  assert_non_null(strstr(idem_errmsg(), "read-only"));
  idem_store_close(s);
  EXPECT_RC(IDEM_EINVAL, idem_store_check(NULL));
}

/*
 * The store's folder made read-only while the store is open (by its own
 * user, nobody when the test runs as root, for whom permissions do not
 * count): the open store still writes, but could not be opened again for
 * writing, so idem_store_check() says it is not ready; writable again, it
 * is.
 */
static void test_check_folder_not_writable(void **state) {
  const char *dir = *state;
  char sub[URL_MAX + 32], path[URL_MAX + 64];
  int pfd[2], status = 0;
  nobody_report m[3];
  pid_t pid;
  snprintf(sub, sizeof sub, "%s/own", dir);
  snprintf(path, sizeof path, "%s/store.db", sub);
  assert_int_equal(chmod(dir, 0755), 0);
  assert_int_equal(mkdir(sub, 0755), 0);
  if (geteuid() == 0)
    assert_int_equal(chown(sub, 65534, 65534), 0);
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    idem_store *s = NULL;
    close(pfd[0]);
    memset(m, 0, sizeof m);
    if (geteuid() == 0 &&
        (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
      _exit(4);
    if (idem_store_open(path, NULL, &s) != IDEM_OK)
      _exit(5);
    m[0].rc = idem_store_check(s);
    snprintf(m[0].err, sizeof m[0].err, "%s", idem_errmsg());
    if (chmod(sub, 0555) != 0)
      _exit(6);
    m[1].rc = idem_store_check(s);
    snprintf(m[1].err, sizeof m[1].err, "%s", idem_errmsg());
    if (chmod(sub, 0755) != 0)
      _exit(7);
    m[2].rc = idem_store_check(s);
    snprintf(m[2].err, sizeof m[2].err, "%s", idem_errmsg());
    idem_store_close(s);
    _exit(write_all(pfd[1], m, sizeof m) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  memset(m, 0, sizeof m);
  assert_int_equal(read_all(pfd[0], m, sizeof m), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  if (m[0].rc != IDEM_OK)
    fail_msg("writable folder: %s (%s)", idem_rc_name(m[0].rc), m[0].err);
  if (m[1].rc != IDEM_ESTORE || !strstr(m[1].err, "not writable"))
    fail_msg("read-only folder: %s (%s), expected IDEM_ESTORE saying so",
             idem_rc_name(m[1].rc), m[1].err);
  if (m[2].rc != IDEM_OK)
    fail_msg("writable again: %s (%s)", idem_rc_name(m[2].rc), m[2].err);
}

/* ---- two versions -------------------------------------------------------- */

static int add_row(void *conn, void *ctx, idem_response *r) {
  (void)conn;
  r->status = 201;
  r->body = ctx;
  r->body_len = strlen(ctx);
  return 0;
}

/*
 * A newer idem migrates the store (its schema version goes up) while this
 * one has it open: this handle then writes nothing more, and says why,
 * instead of writing records the newer version reads otherwise.
 */
static void test_newer_version_while_open(void **state) {
  const char *dir = *state;
  char path[URL_MAX + 32], fp[IDEM_FINGERPRINT_SIZE];
  idem_store *old = NULL, *again;
  idem_call *c;
  idem_id done = {"t", FOP, "key-0"}, fresh = {"t", FOP, "fresh"};
  snprintf(path, sizeof path, "%s/store.db", dir);
  make_store(path, 1);
  EXPECT_RC(IDEM_OK, idem_store_open(path, NULL, &old));
  key_fp("key-0", fp);
  c = CLAIM(old, &done, fp, NULL, IDEM_REPLAY);
  idem_call_free(c);

  assert_int_equal(sqlite_side_sql(path,
                                   "UPDATE idem_meta SET value = '99' WHERE "
                                   "name = 'schema_version'",
                                   NULL),
                   1);
  long long records = sqlite_side_sql(path, sqlite_sql.count_records, NULL);

  key_fp("fresh", fp);
  for (int i = 0; i < 2; i++) {
    c = (idem_call *)&c;
    EXPECT_RC(IDEM_ESCHEMA, idem_claim(old, &fresh, fp, NULL, &c));
    assert_null(c);
    assert_non_null(strstr(idem_errmsg(), path));
    assert_non_null(strstr(idem_errmsg(), "99"));
    c = (idem_call *)&c;
    EXPECT_RC(IDEM_ESCHEMA, idem_execute_local(old, &fresh, fp, NULL, add_row,
                                               "{\"row\":1}", &c));
    assert_null(c);
  }
  assert_int_equal(sqlite_side_sql(path, sqlite_sql.count_records, NULL),
                   records);
  again = (idem_store *)&again;
  EXPECT_RC(IDEM_ESCHEMA, idem_store_open(path, NULL, &again));
  assert_null(again);
  idem_store_close(old);
  assert_int_equal(sqlite_side_sql(path, sqlite_sql.schema_version, NULL),
                   99);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_truncated_store, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_garbage_behind_header, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_directory, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_read_only_directory, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_unreadable_file, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_newer_version_while_open,
                                      setup_tmpdir, teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_check_store_deleted, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_check_store_moved, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_check_store_replaced, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_check_read_only_handle,
                                      setup_tmpdir, teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_check_folder_not_writable,
                                      setup_tmpdir, teardown_tmpdir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
