/*
 * test_store_files.c -- SQLite store files that cannot be used as they
 * are: truncated, garbage behind an SQLite header, a folder, a folder
 * nobody may write, an unreadable file, and a store whose schema a newer
 * idem changed while this one had it open.
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
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
