/*
 * put_record.c -- writes one completed record through libidem, for the
 * command-line tests that need records the idem program itself would not
 * write. A tenant or an operation that the library refuses too (one with a
 * direction mark, say, as an older idem or a hand-edited SQLite store may
 * hold) is written under a stand-in name and then renamed in the SQLite
 * file directly.
 *
 * usage: put_record STORE TENANT OPERATION KEY REQUEST [COUNT]
 * With COUNT, writes COUNT records, keyed KEY-1 to KEY-COUNT. With
 * PUT_RECORD_SEAL_KEY set to 64 hex digits, the records are sealed with
 * that key (idem_store_seal()).
 * Exits 0 when the records were written, 1 otherwise (with the reason).
 */
#include <idem.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Writes one completed record: 0, IDEM_EINVAL for an id the library
 * refuses to create, or 1 with the reason printed. */
static int put(idem_store *s, const idem_id *id, const char *request) {
  idem_call *call = NULL;
  char fp[IDEM_FINGERPRINT_SIZE];
  idem_call_options co = {0};
  idem_response r = {0};
  int rc;
  co.request = request;
  co.request_len = strlen(request);
  if ((rc = idem_fingerprint(request, strlen(request), 0, fp)) != IDEM_OK ||
      (rc = idem_claim(s, id, fp, &co, &call)) != IDEM_OK)
    goto out;
  if (idem_call_outcome(call) != IDEM_PROCEED) {
    fprintf(stderr, "put_record: %s exists already\n", id->key);
    idem_call_free(call);
    return 1;
  }
  r.body = "stored\n";
  r.body_len = 7;
  rc = idem_complete(s, call, &r);
out:
  if (rc != IDEM_OK && rc != IDEM_EINVAL)
    fprintf(stderr, "put_record: %s (%s)\n", idem_errmsg(), idem_rc_name(rc));
  idem_call_free(call);
  return rc == IDEM_OK ? 0 : rc == IDEM_EINVAL ? IDEM_EINVAL : 1;
}

/* Gives the stand-in record of id->key the tenant and operation of id. */
static int rename_record(const char *path, const idem_id *id) {
  sqlite3 *db = NULL;
  sqlite3_stmt *q = NULL;
  int ok = sqlite3_open(path, &db) == SQLITE_OK &&
           sqlite3_prepare_v2(db,
                              "UPDATE idem_records SET tenant = ?1, "
                              "operation = ?2 WHERE key = ?3 AND tenant = "
                              "'put-record-tenant'",
                              -1, &q, NULL) == SQLITE_OK;
  if (ok) {
    sqlite3_bind_text(q, 1, id->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, id->operation, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, id->key, -1, SQLITE_STATIC);
    ok = sqlite3_step(q) == SQLITE_DONE && sqlite3_changes(db) == 1;
  }
  if (!ok)
    fprintf(stderr, "put_record: rename: %s\n", sqlite3_errmsg(db));
  sqlite3_finalize(q);
  sqlite3_close(db);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  idem_store *s = NULL;
  long count = argc == 7 ? strtol(argv[6], NULL, 10) : 0;
  int rc, status = 0;
  if (argc != 6 && !(argc == 7 && count > 0 && count < 100000)) {
    fputs("usage: put_record STORE TENANT OPERATION KEY REQUEST [COUNT]\n",
          stderr);
    return 2;
  }
  if ((rc = idem_store_open(argv[1], NULL, &s)) != IDEM_OK) {
    fprintf(stderr, "put_record: %s (%s)\n", idem_errmsg(), idem_rc_name(rc));
    return 1;
  }
  const char *hex = getenv("PUT_RECORD_SEAL_KEY");
  if (hex && *hex) {
    unsigned char key[1][IDEM_SEAL_KEY_SIZE];
    unsigned v;
    for (int i = 0; i < IDEM_SEAL_KEY_SIZE; i++) {
      if (strlen(hex) != 64 || sscanf(hex + 2 * i, "%2x", &v) != 1) {
        fputs("put_record: PUT_RECORD_SEAL_KEY: 64 hex digits\n", stderr);
        idem_store_close(s);
        return 2;
      }
      key[0][i] = (unsigned char)v;
    }
    if ((rc =
             idem_store_seal(s, (const unsigned char(*)[IDEM_SEAL_KEY_SIZE])key,
                             1)) != IDEM_OK) {
      fprintf(stderr, "put_record: %s (%s)\n", idem_errmsg(), idem_rc_name(rc));
      idem_store_close(s);
      return 1;
    }
  }
  if (count == 0) {
    idem_id id = {argv[2], argv[3], argv[4]};
    idem_id stand_in = {"put-record-tenant", "put-record-operation", argv[4]};
    status = put(s, &id, argv[5]);
    if (status == IDEM_EINVAL && idem_key_check(argv[4]) == IDEM_OK &&
        strncmp(argv[1], "sqlite:", 7) == 0)
      status = put(s, &stand_in, argv[5]) || rename_record(argv[1] + 7, &id);
  }
  for (long i = 1; i <= count && status == 0; i++) {
    char key[300];
    snprintf(key, sizeof key, "%s-%ld", argv[4], i);
    idem_id id = {argv[2], argv[3], key};
    status = put(s, &id, argv[5]);
  }
  idem_store_close(s);
  return status ? 1 : 0;
}
