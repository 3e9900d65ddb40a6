/*
 * test_stores.c -- foreign, read-only, corrupted and newer stores, SQLite
 * files as such, store URLs, and the PostgreSQL backend's own ways (local
 * actions racing claimers, schema migrations).
 * One suite for every backend; IDEM_TEST_STORE selects it (see
 * engine_harness.c).
 */
#include "engine_harness.c"

/* ------------------------------------------------------------------ */
/* Foreign, read-only, corrupted and newer stores                       */
/* ------------------------------------------------------------------ */

static void test_sqlite_not_a_database(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], primed[1024];
  static const char line[] = "These are notes, not an SQLite database.\n";
  unsigned char text[4096], *after;
  size_t len;
  idem_store *s;
  FILE *fp;
  for (size_t i = 0; i < sizeof text; i++)
    text[i] = (unsigned char)line[i % (sizeof line - 1)];
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(text, 1, sizeof text, fp), sizeof text);
  assert_int_equal(fclose(fp), 0);

  for (int form = 0; form < 2; form++) {
    snprintf(url, sizeof url, "%s%s", form ? "sqlite:" : "", path);
    s = (idem_store *)&s;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ESTORE, idem_store_open(url, NULL, &s));
    assert_null(s);
    assert_fresh_errmsg(primed);
    assert_non_null(strstr(idem_errmsg(), path));
    after = read_whole(path, &len);
    assert_non_null(after);
    assert_int_equal(len, sizeof text);
    assert_memory_equal(after, text, sizeof text);
    free(after);
  }
}

typedef struct ro_report {
  int dropped;
  uid_t uid;
  int rc;
  int claim_rc;
  char err[512];
} ro_report;

static void test_sqlite_read_only_file(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  unsigned char *before, *after;
  size_t before_len, after_len;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c;
  ro_report m;
  int pfd[2], status = 0;
  pid_t pid;
  fp_of(PAYLOAD, fp);
  assert_int_equal(chmod(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  idem_store_close(s);
  assert_int_equal(chmod(path, 0444), 0);
  before = read_whole(path, &before_len);
  assert_non_null(before);
  assert_true(before_len > 0);

  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* As root, permissions would not apply: become nobody first. */
    close(pfd[0]);
    memset(&m, 0, sizeof m);
    if (geteuid() == 0) {
      if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        _exit(4);
      m.dropped = 1;
    }
    m.uid = geteuid();
    s = NULL;
    m.rc = idem_store_open(url, NULL, &s);
    snprintf(m.err, sizeof m.err, "%s", idem_errmsg());
    if (m.rc == IDEM_OK) {
      idem_call *cc = NULL;
      m.claim_rc = idem_claim(s, &id, fp, NULL, &cc);
      idem_call_free(cc);
      idem_store_close(s);
    }
    _exit(write_all(pfd[1], &m, sizeof m) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  memset(&m, 0, sizeof m);
  assert_int_equal(read_all(pfd[0], &m, sizeof m), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  if (geteuid() == 0) {
    assert_int_equal(m.dropped, 1);
    assert_int_equal(m.uid, 65534);
  }
  if (m.rc == IDEM_OK)
    fail_msg("a read-only store opened (a claim then returned %s)",
             idem_rc_name(m.claim_rc));
  if (m.rc != IDEM_ESTORE)
    fail_msg("read-only store: %s (%s), expected IDEM_ESTORE",
             idem_rc_name(m.rc), m.err);
  assert_true(m.err[0] != '\0');
  assert_non_null(strstr(m.err, path));
  after = read_whole(path, &after_len);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
}

typedef struct lock_holder {
  const char *path;
  pthread_barrier_t *barrier;
  int hold_ms;
  int rc;
} lock_holder;

/* Holds a write transaction on the database for a while, as the caller's
 * own code writing its tables would. */
static void *hold_write_lock(void *p) {
  lock_holder *h = p;
  sqlite3 *db = NULL;
  h->rc = sqlite3_open_v2(h->path, &db,
                          SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
  /* As the caller's own code would: its COMMIT waits while the store's
   * open reads the schema (a shared lock, in the rollback journal this
   * fresh file starts in) rather than failing with SQLITE_BUSY, which a
   * fresh clone's ASan run under stress-ng once saw. */
  if (h->rc == SQLITE_OK)
    h->rc = sqlite3_busy_timeout(db, 10000);
  if (h->rc == SQLITE_OK)
    h->rc = sqlite3_exec(db,
                         "CREATE TABLE tickets (id INTEGER PRIMARY KEY, "
                         "payload TEXT NOT NULL); BEGIN IMMEDIATE; INSERT "
                         "INTO tickets (payload) VALUES ('written first')",
                         NULL, NULL, NULL);
  pthread_barrier_wait(h->barrier);
  sleep_ms(h->hold_ms);
  if (h->rc == SQLITE_OK)
    h->rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
  sqlite3_close(db);
  return NULL;
}

/*
 * The caller's tables live in the store's database. Opening the store while
 * the caller is writing them waits for the busy timeout like every other
 * call instead of failing at once.
 */
/*
 * The store holds requests and outputs: its file, log and shared-memory
 * file are created 0600. A user who may only read it (here: a copy made
 * readable to nobody, in a folder nobody may not write) lists it with a
 * read-only handle, and a read-only handle writes nothing.
 */
static void test_sqlite_private_files_and_readers(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], side[URL_MAX + 8];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  idem_store_options ro = {.read_only = 1};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL, *r = NULL;
  idem_call *c = NULL;
  struct stat st;
  int pfd[2], status = 0, got[3] = {-1, -1, -1};
  pid_t pid;
  fp_of(PAYLOAD, fp);
  assert_int_equal(chmod(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);

  /* A read-only handle never creates a store. */
  EXPECT_RC(IDEM_ESTORE, idem_store_open(url, &ro, &r));
  assert_null(r);
  assert_int_equal(stat(path, &st), -1);

  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  const char *suffix[3] = {"", "-wal", "-shm"};
  for (int i = 0; i < 3; i++) {
    snprintf(side, sizeof side, "%s%s", path, suffix[i]);
    assert_int_equal(stat(side, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
  }
  /* A read-only handle beside the writer lists, and refuses to write. */
  EXPECT_RC(IDEM_OK, idem_store_open(url, &ro, &r));
  assert_int_equal(list_count(r, NULL), 1);
  c = NULL;
  EXPECT_RC(IDEM_ESTORE, idem_claim(r, &(idem_id){"tenant-a", OPERATION,
                                                   "new-key"},
                                    fp, NULL, &c));
  assert_null(c);
  idem_store_close(r);
  idem_store_close(s);

  /* Another user who may read the file but not write it or its folder. */
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(pipe(pfd), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int out[3] = {0, 0, 0};
    close(pfd[0]);
    if (geteuid() == 0 &&
        (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
      _exit(4);
    idem_store *rs = NULL;
    out[0] = idem_store_open(url, &ro, &rs);
    if (out[0] == IDEM_OK) {
      out[1] = list_count(rs, NULL);
      idem_record *rec = NULL;
      out[2] = idem_get(rs, &id, &rec) == IDEM_OK && rec->has_response &&
               rec->response.status == 201;
      idem_record_free(rec);
      idem_store_close(rs);
    }
    _exit(write_all(pfd[1], out, sizeof out) == 0 ? 0 : 3);
  }
  close(pfd[1]);
  assert_int_equal(read_all(pfd[0], got, sizeof got), 1);
  close(pfd[0]);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_int_equal(got[0], IDEM_OK);
  assert_int_equal(got[1], 1);
  assert_int_equal(got[2], 1);

  /* SQLite's special names are no store: a clear error, nothing made. */
  EXPECT_RC(IDEM_EURL, idem_store_open("sqlite::memory:", NULL, &s));
  assert_non_null(strstr(idem_errmsg(), "file path"));
}

/*
 * The checkpoint thread needs a connection of its own. When it cannot have
 * one (here: no file descriptor left for it), the writer must keep SQLite's
 * own checkpoint, or the log grows without bound. In a child whose
 * descriptor limit lets the store open with as few descriptors as it can,
 * 3000 commits must leave a log of about 1000 pages, not 3000.
 */
#include <sys/resource.h>

static void test_sqlite_log_bounded_without_checkpointer(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], wal[URL_MAX + 8];
  int status = 0;
  pid_t pid;
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  snprintf(wal, sizeof wal, "%s-wal", path);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    idem_store_options o = {.sqlite_synchronous = IDEM_SYNC_NORMAL};
    idem_store *s = NULL;
    struct stat st;
    struct rlimit rl;
    int fds;
    /* The fewest descriptors with which the store opens. Only the soft
     * limit is set: a hard one above the current would need privilege. */
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
      _exit(10);
    for (fds = 4; fds < 64 && !s; fds++) {
      rl.rlim_cur = (rlim_t)fds;
      if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        _exit(10);
      if (idem_store_open(url, &o, &s) != IDEM_OK)
        s = NULL;
    }
    if (!s)
      _exit(11);
    for (int i = 0; i < 3000; i++) {
      char key[32], fp[IDEM_FINGERPRINT_SIZE];
      idem_id id = {"", "op", key};
      idem_response r = {0, NULL, 0, "x", 1};
      idem_call *c = NULL;
      snprintf(key, sizeof key, "k%d", i);
      memset(fp, 'a', 64);
      fp[64] = '\0';
      if (idem_claim(s, &id, fp, NULL, &c) != IDEM_OK ||
          idem_complete(s, c, &r) != IDEM_OK)
        _exit(12);
      idem_call_free(c);
    }
    if (stat(wal, &st) != 0)
      _exit(13);
    /* About 2 pages a commit without checkpoints: 6000 pages. */
    _exit(st.st_size < 2500L * 4096 ? 0 : 14);
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/*
 * Deleting a live store's -wal file drops its newest commits for every
 * process that opens the store afterwards. The handle that notices refuses
 * to write again, so that it never answers PROCEED for a key whose record
 * it can no longer vouch for.
 */
static void test_sqlite_deleted_log(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8], side[URL_MAX + 8];
  idem_id done = {"tenant-a", OPERATION, "done-before"};
  idem_id fresh = {"tenant-a", OPERATION, "new-after"};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_store *s = NULL;
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  snprintf(path, sizeof path, "%s/store.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &s));
  c = CLAIM(s, &done, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  snprintf(side, sizeof side, "%s-wal", path);
  assert_int_equal(unlink(side), 0);
  snprintf(side, sizeof side, "%s-shm", path);
  assert_int_equal(unlink(side), 0);
  c = NULL;
  EXPECT_RC(IDEM_ESTORE, idem_claim(s, &fresh, fp, NULL, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "write-ahead log"));
  EXPECT_RC(IDEM_ESTORE, idem_claim(s, &fresh, fp, NULL, &c));
  /* Nor do an operator's writes go into the lost log, to be dropped at
   * close after they said OK. */
  EXPECT_RC(IDEM_ESTORE, idem_delete(s, &done));
  assert_non_null(strstr(idem_errmsg(), "write-ahead log"));
  EXPECT_RC(IDEM_ESTORE, idem_resolve(s, &done, &resp));
  assert_non_null(strstr(idem_errmsg(), "write-ahead log"));
  EXPECT_RC(IDEM_ESTORE, idem_prune(s, NULL));
  assert_non_null(strstr(idem_errmsg(), "write-ahead log"));
  idem_store_close(s);
}

/*
 * A store named by a relative path stays the same store when the process
 * changes its working folder afterwards (as a daemon does): its writes
 * keep working, and a connection opened later opens that file, not one of
 * the same name in the new folder.
 */
typedef struct slow_local {
  idem_store *store;
  int rc;
} slow_local;

static int sleep_a_while(void *conn, void *ctx, idem_response *r) {
  (void)conn;
  (void)ctx;
  sleep_ms(500);
  r->status = 200;
  return 0;
}

static void *slow_local_main(void *arg) {
  slow_local *w = arg;
  idem_id id = {"tenant-a", OPERATION, "holds-a-connection"};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call *c = NULL;
  idem_fingerprint("x", 1, 0, fp);
  w->rc = idem_execute_local(w->store, &id, fp, NULL, sleep_a_while, NULL,
                             &c);
  idem_call_free(c);
  return NULL;
}

static void test_sqlite_relative_path_after_chdir(void **state) {
  const char *dir = *state;
  char cwd[URL_MAX], other[URL_MAX + 16];
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id first = {"tenant-a", OPERATION, "before-chdir"};
  idem_id second = {"tenant-a", OPERATION, "after-chdir"};
  idem_response resp = {201, NULL, 0, "{\"ticket_id\":1}", 15};
  idem_store_options opts = {.group_commit = -1};
  idem_store *s = NULL, *t = NULL;
  idem_record *rec = NULL;
  idem_call *c = NULL;
  slow_local w;
  pthread_t th;
  fp_of(PAYLOAD, fp);
  assert_non_null(getcwd(cwd, sizeof cwd));
  snprintf(other, sizeof other, "%s/elsewhere", dir);
  assert_int_equal(mkdir(other, 0700), 0);
  assert_int_equal(chdir(dir), 0);
  EXPECT_RC(IDEM_OK, idem_store_open("sqlite:store.db", &opts, &s));
  c = CLAIM(s, &first, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  /* Another store of the same name in the new folder, which must not be
   * the one used. */
  assert_int_equal(chdir(other), 0);
  EXPECT_RC(IDEM_OK, idem_store_open("sqlite:store.db", NULL, &t));
  idem_store_close(t);

  c = CLAIM(s, &second, fp, NULL, IDEM_PROCEED);
  EXPECT_RC(IDEM_OK, idem_complete(s, c, &resp));
  idem_call_free(c);
  /* While an action holds the pool's one connection, a read opens
   * another. */
  w.store = s;
  w.rc = -1;
  assert_int_equal(pthread_create(&th, NULL, slow_local_main, &w), 0);
  sleep_ms(150);
  EXPECT_RC(IDEM_OK, idem_get(s, &first, &rec));
  idem_record_free(rec);
  pthread_join(th, NULL);
  EXPECT_RC(IDEM_OK, w.rc);
  assert_int_equal(chdir(cwd), 0);
  idem_store_close(s);
}

/*
 * What a store URL may be. A conninfo without pg:, or an unknown scheme,
 * must never become an SQLite file of that name: every machine would then
 * get a store of its own and deduplication between them would silently
 * end.
 */
static void test_store_url_forms(void **state) {
  const char *dir = *state;
  char cwd[URL_MAX];
  idem_store *s = NULL;
  struct stat st;
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);

  EXPECT_RC(IDEM_EURL,
            idem_store_open("host=db.internal dbname=app", NULL, &s));
  assert_null(s);
  assert_non_null(strstr(idem_errmsg(), "conninfo"));
  assert_int_equal(stat("host=db.internal dbname=app", &st), -1);
  EXPECT_RC(IDEM_EURL, idem_store_open(" dbname = app", NULL, &s));
  EXPECT_RC(IDEM_EURL,
            idem_store_open("redis://u:S3CRET@h/0", NULL, &s));
  assert_non_null(strstr(idem_errmsg(), "'redis:'"));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  /* A URL with a blank before it, or inside a path, is no file name
   * either; and the message must not show its password. */
  EXPECT_RC(IDEM_EURL,
            idem_store_open(" postgresql://u:S3CRET@h/db", NULL, &s));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  EXPECT_RC(IDEM_EURL, idem_store_open("\tpg:password=S3CRET", NULL, &s));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  EXPECT_RC(IDEM_EURL,
            idem_store_open("x/postgresql://u:S3CRET@h/db", NULL, &s));
  assert_null(strstr(idem_errmsg(), "S3CRET"));
  EXPECT_RC(IDEM_EURL, idem_store_open("c:store.db", NULL, &s));
  assert_int_equal(stat("c:store.db", &st), -1);
  EXPECT_RC(IDEM_EURL, idem_store_open("sqlite:", NULL, &s));
  EXPECT_RC(IDEM_EURL, idem_store_open("PG:", NULL, &s));

  /* Schemes in any case; a colon in a file name after ./ */
  EXPECT_RC(IDEM_OK, idem_store_open("SQLite:upper.db", NULL, &s));
  assert_string_equal(idem_store_backend(s), "sqlite");
  idem_store_close(s);
  assert_int_equal(stat("upper.db", &st), 0);
  EXPECT_RC(IDEM_OK, idem_store_open("./c:store.db", NULL, &s));
  idem_store_close(s);
  assert_int_equal(stat("c:store.db", &st), 0);
  assert_int_equal(chdir(cwd), 0);
}

static void test_sqlite_open_waits_for_writer(void **state) {
  const char *dir = *state;
  char path[URL_MAX], url[URL_MAX + 8];
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  lock_holder h;
  pthread_barrier_t barrier;
  pthread_t th;
  idem_store *s = NULL;
  idem_call *c;
  int64_t t0, waited;
  int rc;
  fp_of(PAYLOAD, fp);
  snprintf(path, sizeof path, "%s/app.db", dir);
  snprintf(url, sizeof url, "sqlite:%s", path);
  pthread_barrier_init(&barrier, NULL, 2);
  h.path = path;
  h.barrier = &barrier;
  h.hold_ms = 300;
  h.rc = -1;
  assert_int_equal(pthread_create(&th, NULL, hold_write_lock, &h), 0);
  pthread_barrier_wait(&barrier);
  t0 = now_ms();
  rc = idem_store_open(url, NULL, &s);
  waited = now_ms() - t0;
  pthread_join(th, NULL);
  pthread_barrier_destroy(&barrier);
  assert_int_equal(h.rc, SQLITE_OK);
  if (rc != IDEM_OK)
    fail_msg("idem_store_open while another connection writes: %s after %lld "
             "ms (busy timeout 10000 ms): %s",
             idem_rc_name(rc), (long long)waited, idem_errmsg());
  assert_non_null(s);
  c = CLAIM(s, &id, fp, NULL, IDEM_PROCEED);
  idem_call_free(c);
  idem_store_close(s);
  assert_int_equal(sqlite_side_sql(path, sqlite_sql.count_tickets, NULL), 1);
}

static void test_corrupted_record(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id body_id = {"tenant-a", OPERATION, "corrupt-body"};
  idem_id status_id = {"tenant-a", OPERATION, "corrupt-status"};
  ticket_action a1 = {.payload = PAYLOAD}, a2 = {.payload = PAYLOAD},
                again = {.payload = PAYLOAD};
  idem_record *rec;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &body_id, fp, NULL, &a1, IDEM_PROCEED);
  idem_call_free(c);
  c = LOCAL(f->store, &status_id, fp, NULL, &a2, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(
      side_sql(f->url, sql_of_backend()->corrupt_body, body_id.key), 1);
  assert_int_equal(
      side_sql(f->url, sql_of_backend()->corrupt_status, status_id.key), 1);
  /* A new handle, as a new process would have: one that had replayed these
   * records before could answer from its cache of completed records. */
  idem_store_close(f->store);
  f->store = NULL;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));

  for (int i = 0; i < 2; i++) {
    const idem_id *id = i ? &status_id : &body_id;
    c = (idem_call *)&c;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ECORRUPT, idem_claim(f->store, id, fp, NULL, &c));
    assert_null(c);
    assert_fresh_errmsg(primed);
    c = (idem_call *)&c;
    EXPECT_RC(IDEM_ECORRUPT, idem_execute_local(f->store, id, fp, NULL,
                                                create_ticket, &again, &c));
    assert_null(c);
    assert_int_equal(again.runs, 0);
    /* The record stays for an operator to look at. */
    rec = get_record(f->store, id);
    assert_int_equal(rec->state, IDEM_STATE_COMPLETED);
    idem_record_free(rec);
  }
  assert_int_equal(count_tickets(f->url), 2);
}

static void test_newer_schema(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], primed[1024];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  unsigned char *before, *after;
  size_t before_len, after_len;
  idem_store *s;
  idem_call *c;
  fp_of(PAYLOAD, fp);

  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;
  assert_int_equal(side_sql(f->url, sql_of_backend()->newer_schema, NULL), 1);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   99);
  before = store_snapshot(f->url, &before_len);
  assert_non_null(before);

  for (int i = 0; i < 2; i++) {
    s = (idem_store *)&s;
    prime_errmsg(primed, sizeof primed);
    EXPECT_RC(IDEM_ESCHEMA, idem_store_open(f->url, NULL, &s));
    assert_null(s);
    assert_fresh_errmsg(primed);
    assert_non_null(strstr(idem_errmsg(), "99"));
  }
  after = store_snapshot(f->url, &after_len);
  assert_non_null(after);
  assert_int_equal(after_len, before_len);
  assert_memory_equal(after, before, before_len);
  free(before);
  free(after);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   99);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 1);
  assert_int_equal(count_tickets(f->url), 1);
}

/* ------------------------------------------------------------------ */

/*
 * Replays come from a cache of completed records. A handle that learned a
 * record by reading it (another handle wrote it) must forget it no later
 * than the store's own expiry: then the key acts again, on that handle too.
 */
static void test_cached_replay_expires(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  /* Long enough for the replays below on a loaded machine. */
  idem_call_options keep = {.retention_ms = 2000};
  ticket_action first = {.payload = PAYLOAD}, again = {.payload = PAYLOAD},
                after = {.payload = PAYLOAD};
  idem_store *reader = NULL;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &reader));

  c = LOCAL(f->store, &id, fp, &keep, &first, IDEM_PROCEED);
  idem_call_free(c);
  /* The reader replays it, twice (the second from its cache)... */
  for (int i = 0; i < 2; i++) {
    c = LOCAL(reader, &id, fp, &keep, &again, IDEM_REPLAY);
    assert_int_equal(ticket_id_of(idem_call_response(c)), first.ticket_id);
    idem_call_free(c);
  }
  assert_int_equal(again.runs, 0);
  /* Once the record expired, the reader acts, and the writer replays the
   * reader's new record. */
  sleep_ms(2300);
  c = LOCAL(reader, &id, fp, &keep, &after, IDEM_PROCEED);
  assert_int_equal(after.runs, 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), after.ticket_id);
  assert_true(after.ticket_id != first.ticket_id);
  idem_call_free(c);
  c = LOCAL(f->store, &id, fp, &keep, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), after.ticket_id);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 2);
  idem_store_close(reader);
}

/* ---- PostgreSQL: a claimer that writes the key while a local action runs -- */

/*
 * On PostgreSQL a local action on a new key runs before its record exists:
 * the record is inserted, completed, with the action's commit. Callers of
 * idem_execute_local() on one key wait for each other (an advisory lock),
 * but an idem_claim() from another process does not, so it can write the
 * key while the action runs. These tests play that claimer from inside the
 * action, on a second store handle: the action must then be rolled back
 * (its ticket with it) and the claimer's record must be the answer.
 */
typedef enum twin_does {
  TWIN_CLAIMS = 1,         /* and holds the key */
  TWIN_COMPLETES,          /* claims and completes with TWIN_BODY */
  TWIN_COMPLETES_THEN_FAIL /* the same, and then the action fails */
} twin_does;

#define TWIN_BODY "{\"ticket_id\":777}"

typedef struct twin_action {
  ticket_action ticket;
  idem_store *other;
  const idem_id *id;
  const char *fp;
  twin_does does;
  idem_call_options twin_opts; /* the claimer's */
  int pause_ms;                /* after the claimer, before returning */
  int twin_done; /* the claimer acts once, on the action's first run */
  int twin_rc;
  idem_outcome twin_outcome;
} twin_action;

static int twin_then_ticket(void *conn, void *ctx, idem_response *response) {
  twin_action *t = ctx;
  idem_response done = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                        strlen(TWIN_BODY)};
  idem_call *c = NULL;
  int rc = create_ticket(conn, &t->ticket, response);
  if (rc != 0 || t->twin_done)
    return rc;
  t->twin_done = 1;
  t->twin_rc = idem_claim(t->other, t->id, t->fp, &t->twin_opts, &c);
  if (t->twin_rc == IDEM_OK) {
    t->twin_outcome = idem_call_outcome(c);
    if (t->does != TWIN_CLAIMS)
      t->twin_rc = idem_complete(t->other, c, &done);
  }
  idem_call_free(c);
  if (t->pause_ms)
    sleep_ms(t->pause_ms);
  return t->does == TWIN_COMPLETES_THEN_FAIL ? 1 : 0;
}

static void run_twin(fixture *f, twin_does does, idem_outcome want) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_response twin = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                        strlen(TWIN_BODY)};
  twin_action t = {.ticket = {.payload = PAYLOAD}, .id = &id, .does = does};
  ticket_action later = {.payload = PAYLOAD};
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  t.fp = fp;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &t.other));

  c = NULL;
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        twin_then_ticket, &t, &c));
  assert_non_null(c);
  assert_int_equal(idem_call_outcome(c), want);
  /* The action ran once, and the claimer got in while it ran... */
  assert_int_equal(t.ticket.runs, 1);
  assert_true(t.ticket.ticket_id > 0);
  EXPECT_RC(IDEM_OK, t.twin_rc);
  assert_int_equal(t.twin_outcome, IDEM_PROCEED);
  /* ...so the action's ticket was rolled back, and the answer is the
   * claimer's record: its response, or "in flight" while it holds it. */
  assert_int_equal(count_tickets(f->url), 0);
  if (want == IDEM_REPLAY)
    assert_response_equal(idem_call_response(c), &twin);
  else
    assert_true(idem_call_retry_after_ms(c) > 0);
  idem_call_free(c);

  r = get_record(f->store, &id);
  assert_int_equal(r->state, does == TWIN_CLAIMS ? IDEM_STATE_IN_PROGRESS
                                                 : IDEM_STATE_COMPLETED);
  idem_record_free(r);
  assert_int_equal(list_count(f->store, NULL), 1);

  /* Later callers get the claimer's outcome too, and run nothing. */
  c = LOCAL(f->store, &id, fp, NULL, &later, want);
  assert_int_equal(later.runs, 0);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 0);
  idem_store_close(t.other);
}

static void test_pg_claimer_completes_during_action(void **state) {
  run_twin(*state, TWIN_COMPLETES, IDEM_REPLAY);
}

static void test_pg_claimer_holds_key_during_action(void **state) {
  run_twin(*state, TWIN_CLAIMS, IDEM_IN_FLIGHT);
}

/* The action failed (it could have failed on the claimer's rows); the
 * claimer's record answers, not the failure. */
static void test_pg_claimer_completes_then_action_fails(void **state) {
  run_twin(*state, TWIN_COMPLETES_THEN_FAIL, IDEM_REPLAY);
}

/*
 * The claimer's lease runs out while the action runs: the action's record
 * insert fails on the claimer's row, the action is rolled back, and the
 * key is taken over the slow way (RECOVER), where the action runs again,
 * under the key's lock, and commits once.
 */
static void test_pg_claimer_lease_expires_during_action(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  twin_action t = {.ticket = {.payload = PAYLOAD},
                   .id = &id,
                   .does = TWIN_CLAIMS,
                   .twin_opts = {.lease_ms = 1},
                   .pause_ms = 50};
  idem_record *r;
  idem_call *c = NULL;
  fp_of(PAYLOAD, fp);
  t.fp = fp;
  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &t.other));
  EXPECT_RC(IDEM_OK, idem_execute_local(f->store, &id, fp, NULL,
                                        twin_then_ticket, &t, &c));
  EXPECT_RC(IDEM_OK, t.twin_rc);
  assert_int_equal(t.twin_outcome, IDEM_PROCEED);
  assert_int_equal(idem_call_outcome(c), IDEM_RECOVER);
  assert_int_equal(idem_call_attempt(c), 2);
  /* Two runs, the first rolled back: one ticket, the second run's. */
  assert_int_equal(t.ticket.runs, 2);
  assert_int_equal(count_tickets(f->url), 1);
  assert_int_equal(ticket_id_of(idem_call_response(c)), t.ticket.ticket_id);
  idem_call_free(c);
  r = get_record(f->store, &id);
  assert_int_equal(r->state, IDEM_STATE_COMPLETED);
  idem_record_free(r);
  idem_store_close(t.other);
}

/* A unique violation at COMMIT from the caller's own deferred constraint
 * is the action's failure, not a sign of another writer: reported, rolled
 * back, no record, and the action not run again. */
static int ticket_and_duplicate(void *conn, void *ctx, idem_response *response) {
  char sql[256];
  PGresult *res;
  int rc = create_ticket(conn, ctx, response);
  if (rc != 0 ||
      pg_expand("INSERT INTO {S}.deferred_unique VALUES (1)", pg_schema, sql,
                sizeof sql) != 0)
    return 1;
  res = PQexec(conn, sql);
  rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : 1;
  PQclear(res);
  return rc;
}

static void test_pg_deferred_constraint_fails_at_commit(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD};
  idem_call *c = (idem_call *)&c;
  fp_of(PAYLOAD, fp);
  assert_int_equal(side_sql(f->url,
                            "CREATE TABLE {S}.deferred_unique (v integer, "
                            "UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)",
                            NULL),
                   0);
  assert_int_equal(
      side_sql(f->url, "INSERT INTO {S}.deferred_unique VALUES (1)", NULL), 1);
  EXPECT_RC(IDEM_ESTORE, idem_execute_local(f->store, &id, fp, NULL,
                                            ticket_and_duplicate, &act, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "23505"));
  assert_int_equal(act.runs, 1);
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
}

/*
 * An action that ends idem's transaction itself (COMMIT or ROLLBACK through
 * the connection it gets) breaks its contract; what it wrote before may be
 * kept without a record. Whatever it returns, the call fails, the key is
 * marked unknown, and a retry does not act again: on a new key (the fast
 * path on PostgreSQL) and on a key taken over from a holder whose lease
 * ended (RECOVER).
 */
typedef struct ending_action {
  ticket_action ticket;
  const char *end; /* "COMMIT" or "ROLLBACK" */
  int answer;      /* what the action returns */
} ending_action;

static int ticket_then_end(void *conn, void *ctx, idem_response *response) {
  ending_action *a = ctx;
  int rc = create_ticket(conn, &a->ticket, response);
  if (rc != 0)
    return rc;
  if (backend_from_env() == BACKEND_SQLITE)
    sqlite3_exec(conn, a->end, NULL, NULL, NULL);
  else
    PQclear(PQexec(conn, a->end));
  return a->answer;
}

static void run_action_ends_transaction(fixture *f, const char *end,
                                        int answer, int recover) {
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ending_action bad = {.ticket = {.payload = PAYLOAD}, .end = end,
                       .answer = answer};
  ticket_action retry = {.payload = PAYLOAD};
  idem_call_options short_lease = {.lease_ms = 1};
  long long kept = strcmp(end, "COMMIT") == 0 ? 1 : 0;
  idem_record *r;
  idem_call *c;
  fp_of(PAYLOAD, fp);
  if (recover) {
    c = CLAIM(f->store, &id, fp, &short_lease, IDEM_PROCEED);
    idem_call_free(c); /* a holder that died */
    sleep_ms(5);
  }
  c = (idem_call *)&c;
  EXPECT_RC(IDEM_ESTORE, idem_execute_local(f->store, &id, fp, NULL,
                                            ticket_then_end, &bad, &c));
  assert_null(c);
  assert_non_null(strstr(idem_errmsg(), "marked unknown"));
  assert_int_equal(bad.ticket.runs, 1);
  assert_int_equal(count_tickets(f->url), kept);
  r = get_record(f->store, &id);
  assert_int_equal(r->state, IDEM_STATE_UNKNOWN);
  idem_record_free(r);
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_UNKNOWN);
  idem_call_free(c);
  assert_int_equal(retry.runs, 0);
  assert_int_equal(count_tickets(f->url), kept);
  assert_int_equal(list_count(f->store, NULL), 1);
}

static void test_action_commits_itself(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 0, 0);
}

static void test_action_commits_itself_then_fails(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 1, 0);
}

static void test_action_rolls_back_itself(void **state) {
  run_action_ends_transaction(*state, "ROLLBACK", 0, 0);
}

static void test_recovered_action_commits_itself(void **state) {
  run_action_ends_transaction(*state, "COMMIT", 0, 1);
}

/* How many of idem_records' identifying columns compare as bytes. */
static const char pg_c_columns[] =
    "SELECT count(*) FROM information_schema.columns WHERE table_schema = "
    "$1::text AND table_name = 'idem_records' AND column_name IN ('tenant', "
    "'operation', 'key') AND collation_name = 'C'";

/* Turns the store at url back into what schema version 1 made. */
static void pg_back_to_version_1(const char *url) {
  side_sql(url,
           "ALTER TABLE {S}.idem_records ALTER COLUMN tenant TYPE text "
           "COLLATE \"default\", ALTER COLUMN operation TYPE text COLLATE "
           "\"default\", ALTER COLUMN key TYPE text COLLATE \"default\"",
           NULL);
  assert_int_equal(side_sql(url,
                            "UPDATE {S}.idem_meta SET value = '1' WHERE name "
                            "= 'schema_version'",
                            NULL),
                   1);
  assert_int_equal(side_sql(url, pg_c_columns, pg_schema), 0);
  assert_int_equal(side_sql(url, sql_of_backend()->schema_version, NULL), 1);
}

/*
 * A store of schema version 1 (identifying columns in the database's
 * default collation) is migrated on open: version 4 (2: the columns
 * COLLATE "C"; 3: the recovered mark; 4: waiters' notifications), every
 * record kept and replayed,
 * and no action run again.
 */
static void test_pg_migrates_version_1(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, KEY};
  ticket_action act = {.payload = PAYLOAD}, retry = {.payload = PAYLOAD};
  idem_call *c;
  long long first_id;
  fp_of(PAYLOAD, fp);
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   4);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  first_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;

  pg_back_to_version_1(f->url);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   4);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &id, fp, NULL, &retry, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first_id);
  idem_call_free(c);
  assert_int_equal(act.runs, 1);
  assert_int_equal(retry.runs, 0);
  assert_int_equal(count_tickets(f->url), 1);
  /* New keys are claimed and completed on the migrated table. */
  {
    idem_id other = {"tenant-a", OPERATION, "after-migration"};
    idem_response r = {201, TICKET_META, strlen(TICKET_META), TWIN_BODY,
                       strlen(TWIN_BODY)};
    c = CLAIM(f->store, &other, fp, NULL, IDEM_PROCEED);
    EXPECT_RC(IDEM_OK, idem_complete(f->store, c, &r));
    idem_call_free(c);
    c = CLAIM(f->store, &other, fp, NULL, IDEM_REPLAY);
    assert_response_equal(idem_call_response(c), &r);
    idem_call_free(c);
  }
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);
}

/*
 * A role that only reads and writes the tables (as docs/postgresql.md
 * grants a day-to-day role) may not migrate them: a version-1 store opens
 * all the same, stays at version 1 and works; its owner's next open
 * migrates it.
 */
static void test_pg_non_owner_keeps_version_1(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE], role[96], sql[1024], url[URL_MAX + 104];
  idem_id id = {"tenant-a", OPERATION, KEY};
  idem_id fresh = {"tenant-a", OPERATION, "by-the-app-role"};
  ticket_action act = {.payload = PAYLOAD}, retry = {.payload = PAYLOAD},
                later = {.payload = PAYLOAD}, again = {.payload = PAYLOAD};
  idem_store *app = NULL;
  idem_call *c;
  long long first_id, second_id;
  fp_of(PAYLOAD, fp);
  c = LOCAL(f->store, &id, fp, NULL, &act, IDEM_PROCEED);
  first_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  idem_store_close(f->store);
  f->store = NULL;
  pg_back_to_version_1(f->url);

  snprintf(role, sizeof role, "idem_app_%s", pg_schema);
  snprintf(sql, sizeof sql,
           "DO $$BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') "
           "THEN DROP OWNED BY %s; DROP ROLE %s; END IF; END$$",
           role, role, role);
  side_sql(f->url, sql, NULL);
  snprintf(sql, sizeof sql, "CREATE ROLE %s LOGIN", role);
  side_sql(f->url, sql, NULL);
  snprintf(sql, sizeof sql,
           "DO $$BEGIN GRANT USAGE ON SCHEMA {S} TO %s; GRANT SELECT, "
           "INSERT, UPDATE, DELETE ON {S}.idem_records TO %s; GRANT SELECT "
           "ON {S}.idem_meta TO %s; GRANT SELECT, INSERT ON {S}.tickets TO "
           "%s; GRANT USAGE ON SEQUENCE {S}.tickets_id_seq TO %s; END$$",
           role, role, role, role, role);
  side_sql(f->url, sql, NULL);
  snprintf(url, sizeof url, "%s&user=%s", f->url, role);

  EXPECT_RC(IDEM_OK, idem_store_open(url, NULL, &app));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   1);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 0);
  c = LOCAL(app, &id, fp, NULL, &retry, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), first_id);
  idem_call_free(c);
  c = LOCAL(app, &fresh, fp, NULL, &later, IDEM_PROCEED);
  second_id = ticket_id_of(idem_call_response(c));
  idem_call_free(c);
  assert_true(second_id != first_id);
  idem_store_close(app);

  EXPECT_RC(IDEM_OK, idem_store_open(f->url, NULL, &f->store));
  assert_int_equal(side_sql(f->url, sql_of_backend()->schema_version, NULL),
                   4);
  assert_int_equal(side_sql(f->url, pg_c_columns, pg_schema), 3);
  c = LOCAL(f->store, &fresh, fp, NULL, &again, IDEM_REPLAY);
  assert_int_equal(ticket_id_of(idem_call_response(c)), second_id);
  idem_call_free(c);
  assert_int_equal(act.runs + retry.runs + later.runs + again.runs, 2);
  assert_int_equal(count_tickets(f->url), 2);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 2);

  snprintf(sql, sizeof sql, "DO $$BEGIN DROP OWNED BY %s; DROP ROLE %s; END$$",
           role, role);
  side_sql(f->url, sql, NULL);
}

/*
 * A rejected action that leaves its insert in progress (a statement
 * stepped once and not reset): SQLite then refuses ROLLBACK TO the
 * action's savepoint. Its insert must still never commit.
 */
static sqlite3_stmt *left_open;

static int insert_then_reject(void *conn, void *ctx, idem_response *r) {
  sqlite3 *db = conn;
  (void)ctx;
  (void)r;
  if (sqlite3_prepare_v2(db, sqlite_sql.insert_ticket, -1, &left_open,
                         NULL) != SQLITE_OK)
    return -1;
  sqlite3_bind_text(left_open, 1, "rejected", -1, SQLITE_STATIC);
  sqlite3_step(left_open); /* a row: the insert is still under way */
  return 1;
}

static void test_sqlite_rejected_action_never_commits(void **state) {
  fixture *f = *state;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_id id = {"tenant-a", OPERATION, "rejected"};
  idem_id next = {"tenant-a", OPERATION, "next"};
  ticket_action act = {.payload = PAYLOAD};
  idem_call *c = NULL;
  int rc;
  fp_of(PAYLOAD, fp);
  rc = idem_execute_local(f->store, &id, fp, NULL, insert_then_reject, NULL,
                          &c);
  sqlite3_finalize(left_open);
  left_open = NULL;
  assert_int_not_equal(rc, IDEM_OK);
  assert_null(c);
  assert_int_equal(count_tickets(f->url), 0);
  assert_absent(f->store, &id);
  /* The store works on. */
  c = LOCAL(f->store, &next, fp, NULL, &act, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(count_tickets(f->url), 1);
}

#define STORE_TEST(fn)                                                         \
  cmocka_unit_test_setup_teardown(fn, setup_store, teardown_store)

/*
 * idem_store_check() on a store that works: IDEM_OK, again and again, the
 * error detail cleared, and the store works on as before; a NULL store is an argument error. (What it says of a
 * store that cannot take writes is in test_store_files.c, test_iofaults.c
 * and tests/serve/cli_serve_health.sh.)
 */
static void test_store_check(void **state) {
  fixture *f = *state;
  idem_id id = {"tenant-a", OPERATION, "after-check"};
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call *c;
  fp_of(PAYLOAD, fp);
  EXPECT_RC(IDEM_EINVAL, idem_store_check(NULL));
  for (int i = 0; i < 3; i++) {
    EXPECT_RC(IDEM_OK, idem_store_check(f->store));
    assert_string_equal(idem_errmsg(), "");
  }
  c = CLAIM(f->store, &id, fp, NULL, IDEM_PROCEED);
  idem_call_free(c);
  assert_int_equal(side_sql(f->url, sql_of_backend()->count_records, NULL), 1);
}

int main(void) {
  const struct CMUnitTest both[] = {
      STORE_TEST(test_store_check),
      STORE_TEST(test_cached_replay_expires),
      STORE_TEST(test_action_commits_itself),
      STORE_TEST(test_action_commits_itself_then_fails),
      STORE_TEST(test_action_rolls_back_itself),
      STORE_TEST(test_recovered_action_commits_itself),
      STORE_TEST(test_corrupted_record),
      STORE_TEST(test_newer_schema),
  };
  const struct CMUnitTest sqlite_only[] = {
      cmocka_unit_test_setup_teardown(
          test_sqlite_log_bounded_without_checkpointer, setup_tmpdir,
          teardown_tmpdir),
      STORE_TEST(test_sqlite_rejected_action_never_commits),
      cmocka_unit_test_setup_teardown(test_sqlite_not_a_database, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_read_only_file, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_private_files_and_readers,
                                      setup_tmpdir, teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_deleted_log, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_relative_path_after_chdir,
                                      setup_tmpdir, teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_store_url_forms, setup_tmpdir,
                                      teardown_tmpdir),
      cmocka_unit_test_setup_teardown(test_sqlite_open_waits_for_writer,
                                      setup_tmpdir, teardown_tmpdir),
  };
  const struct CMUnitTest pg_only[] = {
      STORE_TEST(test_pg_claimer_completes_during_action),
      STORE_TEST(test_pg_claimer_holds_key_during_action),
      STORE_TEST(test_pg_claimer_completes_then_action_fails),
      STORE_TEST(test_pg_claimer_lease_expires_during_action),
      STORE_TEST(test_pg_deferred_constraint_fails_at_commit),
      STORE_TEST(test_pg_migrates_version_1),
      STORE_TEST(test_pg_non_owner_keeps_version_1),
  };
  return run_engine_tests("stores", both, sizeof both / sizeof both[0], sqlite_only,
                          sizeof sqlite_only / sizeof sqlite_only[0], pg_only, sizeof pg_only / sizeof pg_only[0]);
}
