/*
 * schema.c -- the SQLite store's schema: created or migrated on open,
 * and the version that every read checks.
 */
#include "sqlite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char schema_v1[] =
    "CREATE TABLE idem_records ("
    " tenant TEXT NOT NULL,"
    " operation TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " fingerprint TEXT NOT NULL,"
    " request BLOB,"
    " state INTEGER NOT NULL,"
    " owner TEXT,"
    " attempt INTEGER NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " lease_expires_ms INTEGER NOT NULL,"
    " expires_ms INTEGER NOT NULL,"
    " status INTEGER,"
    " meta BLOB,"
    " body BLOB,"
    " checksum TEXT,"
    " PRIMARY KEY (tenant, operation, key)) WITHOUT ROWID;"
    "CREATE INDEX idem_records_expires ON idem_records (expires_ms);";

/* Version 2: the recovered mark. Records of version 1 are not marked. */
static const char schema_v2[] = "ALTER TABLE idem_records ADD COLUMN "
                                "recovered INTEGER NOT NULL DEFAULT 0";

/* Version 3: a completed record's retention ends on the boot-time clock
 * too (0: not known, as for the records written before). */
static const char schema_v3[] = "ALTER TABLE idem_records ADD COLUMN "
                                "expires_boot_ms INTEGER NOT NULL DEFAULT 0";

/*
 * Version 3: leases on the boot-time clock (idem__boot_ms()), which no step
 * of the wall clock moves and every process of the machine shares, so that
 * a takeover and the holder's own signal of a lost lease are decided on
 * one time base. Such a lease means something only in the boot that wrote
 * it: idem_meta's lease_boot names that boot, and the first open after a
 * restart ends every lease of the boot before (no holder of it is alive).
 * The migration moves the leases in progress onto the boot clock.
 */
static int leases_to_boot_clock(conn *c) {
  sqlite3_stmt *q = NULL;
  int rc;
  int64_t wall = idem__now_ms(), boot = idem__boot_ms();
  if ((rc = sqlite3_prepare_v2(
           c->db,
           "UPDATE idem_records SET lease_expires_ms = lease_expires_ms - ?1 "
           "+ ?2 WHERE state = 1 AND lease_expires_ms > 0",
           -1, &q, NULL)) != SQLITE_OK)
    return rc;
  sqlite3_bind_int64(q, 1, wall);
  sqlite3_bind_int64(q, 2, boot);
  rc = sqlite3_step(q) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
  sqlite3_finalize(q);
  return rc;
}

/* idem_meta's lease_boot into boot (empty when there is none). */
static void read_lease_boot(conn *c, char boot[40]) {
  sqlite3_stmt *q = NULL;
  boot[0] = '\0';
  if (sqlite3_prepare_v2(c->db,
                         "SELECT value FROM idem_meta WHERE name = "
                         "'lease_boot'",
                         -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0))
    snprintf(boot, 40, "%s", (const char *)sqlite3_column_text(q, 0));
  sqlite3_finalize(q);
}

static int write_lease_boot(conn *c, const char *boot) {
  sqlite3_stmt *q = NULL;
  int rc;
  if ((rc = sqlite3_prepare_v2(c->db,
                               "INSERT OR REPLACE INTO idem_meta VALUES "
                               "('lease_boot', ?1)",
                               -1, &q, NULL)) != SQLITE_OK)
    return rc;
  sqlite3_bind_text(q, 1, boot, -1, SQLITE_STATIC);
  rc = sqlite3_step(q) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
  sqlite3_finalize(q);
  return rc;
}

/* ---- schema ------------------------------------------------------------ */

/* The schema version, or 0 when the store has none yet. */
static int read_version(conn *c) {
  sqlite3_stmt *q = NULL;
  int version = 0;
  if (sqlite3_prepare_v2(c->db,
                         "SELECT value FROM idem_meta WHERE name = "
                         "'schema_version'",
                         -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  return version;
}

int idem__sq_ensure_schema(sq_store *s, conn *c) {
  sqlite3_stmt *q = NULL;
  int version = 0, rc;
  char boot[40], lease_boot[40];
  if ((rc = idem__boot_id(boot)) != IDEM_OK)
    return rc;
  /* The common case reads only: many processes opening one store at once
   * do not queue for the write lock just to find the schema in place. */
  s->schema_min = SCHEMA_VERSION;
  version = read_version(c);
  if (version == SCHEMA_VERSION) {
    read_lease_boot(c, lease_boot);
    if (!strcmp(lease_boot, boot) || s->o.read_only)
      return IDEM_OK;
  }
  /* A reader may not migrate: a store of version 1 (idem 0.2) is read as
   * it is, without recovered marks; one of version 2, with its leases on
   * the wall clock. */
  if (s->o.read_only && version >= 1 && version < SCHEMA_VERSION) {
    s->schema_min = version;
    return IDEM_OK;
  }
  if (s->o.read_only)
    return version > SCHEMA_VERSION
               ? idem__fail(IDEM_ESCHEMA,
                            "store '%s': schema version %d; this idem "
                            "knows up to %d",
                            s->path, version, SCHEMA_VERSION)
               : idem__fail(IDEM_ESTORE,
                            "store '%s': opened read-only, and it is not an "
                            "idem store of this version (schema %d)",
                            s->path, version);
  version = 0;
  if (idem__sq_exec(c, "BEGIN IMMEDIATE") != SQLITE_OK)
    return idem__fail(idem__sq_map_rc(sqlite3_extended_errcode(c->db)),
                      "store '%s': %s", s->path, sqlite3_errmsg(c->db));
  if (idem__sq_exec(
          c, "CREATE TABLE IF NOT EXISTS idem_meta (name TEXT PRIMARY KEY, "
             "value TEXT NOT NULL) WITHOUT ROWID") != SQLITE_OK)
    goto fail;
  if (sqlite3_prepare_v2(c->db,
                         "SELECT value FROM idem_meta WHERE name = "
                         "'schema_version'",
                         -1, &q, NULL) != SQLITE_OK)
    goto fail;
  if (sqlite3_step(q) == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  q = NULL;
  if (version > SCHEMA_VERSION) {
    idem__sq_exec(c, "ROLLBACK");
    return idem__fail(IDEM_ESCHEMA,
                      "store '%s': schema version %d; this idem knows up to "
                      "%d; the store was left untouched",
                      s->path, version, SCHEMA_VERSION);
  }
  /* Migrations run in order, each inside this one transaction. */
  if (version < 1) {
    if (idem__sq_exec(c, schema_v1) != SQLITE_OK)
      goto fail;
  }
  if (version < 2) {
    if (idem__sq_exec(c, schema_v2) != SQLITE_OK)
      goto fail;
  }
  if (version < 3) {
    if (idem__sq_exec(c, schema_v3) != SQLITE_OK ||
        leases_to_boot_clock(c) != SQLITE_OK ||
        write_lease_boot(c, boot) != SQLITE_OK)
      goto fail;
  } else {
    /* The machine restarted since the store's leases were written (read
     * again under the write lock: another process may have seen to it):
     * every lease of the boot before has ended, and retention is known on
     * the wall clock alone. */
    read_lease_boot(c, lease_boot);
    if (strcmp(lease_boot, boot) != 0 &&
        (idem__sq_exec(c, "UPDATE idem_records SET lease_expires_ms = 0 "
                          "WHERE state = 1") != SQLITE_OK ||
         idem__sq_exec(c, "UPDATE idem_records SET expires_boot_ms = 0 "
                          "WHERE expires_boot_ms <> 0") != SQLITE_OK ||
         write_lease_boot(c, boot) != SQLITE_OK))
      goto fail;
  }
  if (version < SCHEMA_VERSION) {
    char sql[96];
    snprintf(sql, sizeof sql,
             "INSERT OR REPLACE INTO idem_meta VALUES ('schema_version', "
             "'%d')",
             SCHEMA_VERSION);
    if (idem__sq_exec(c, sql) != SQLITE_OK)
      goto fail;
  }
  if (idem__sq_exec(c, "COMMIT") != SQLITE_OK)
    goto fail;
  return IDEM_OK;
fail:
  rc = idem__fail(idem__sq_map_rc(sqlite3_extended_errcode(c->db)),
                  "store '%s': schema: %s", s->path, sqlite3_errmsg(c->db));
  sqlite3_finalize(q);
  idem__sq_exec(c, "ROLLBACK");
  return rc;
}

/* ---- the schema version ------------------------------------------------- */

/*
 * A newer idem may migrate the store while this handle has it open. From
 * then on this handle neither reads records (their layout may have
 * changed) nor writes any (the newer version would misread them): every
 * call fails with IDEM_ESCHEMA and says why. Writes read the version inside
 * their transaction; reads of records read it in the statement that reads
 * them.
 */

/* Whether this handle's statements are right for schema version v. */
int idem__sq_schema_known(const sq_store *s, int v) {
  return v >= s->schema_min && v <= SCHEMA_VERSION;
}

void idem__sq_schema_problem(const sq_store *s, int v, char *why, size_t size) {
  snprintf(why, size,
           "store '%s': its schema is now version %d (this idem knows up "
           "to %d): another version of idem changed it while this handle "
           "had it open; nothing more is read or written through this "
           "handle; open the store with that version",
           s->path, v, SCHEMA_VERSION);
}

/* Reads the version: IDEM_OK, IDEM_ESCHEMA, or the store's error; the
 * detail in why. */
static int schema_check(sq_store *s, conn *c, char *why, size_t size) {
  sqlite3_stmt *q = idem__sq_stmt(c, ST_VERSION);
  char buf[384];
  int version = 0, step;
  if (!q) {
    snprintf(why, size, "sqlite: prepare: %s",
             idem__sq_errtext(c->db, buf, sizeof buf));
    return idem__sq_map_rc(sqlite3_extended_errcode(c->db));
  }
  step = sqlite3_step(q);
  if (step == SQLITE_ROW)
    version = sqlite3_column_int(q, 0);
  if (step != SQLITE_ROW && step != SQLITE_DONE) {
    int rc = idem__sq_map_rc(sqlite3_extended_errcode(c->db));
    snprintf(why, size, "sqlite: read the schema version: %s",
             idem__sq_errtext(c->db, buf, sizeof buf));
    sqlite3_reset(q);
    return rc;
  }
  sqlite3_reset(q);
  if (idem__sq_schema_known(s, version))
    return IDEM_OK;
  idem__sq_schema_problem(s, version, why, size);
  return IDEM_ESCHEMA;
}

/* IDEM_ESCHEMA for a store found at version v. */
int idem__sq_schema_refused(const sq_store *s, int v) {
  char why[512];
  idem__sq_schema_problem(s, v, why, sizeof why);
  return idem__fail(IDEM_ESCHEMA, "%s", why);
}

/* A read that failed: IDEM_ESCHEMA when the schema changed under it (a
 * newer layout may not even have the columns read), else the error. */
int idem__sq_read_failed(sq_store *s, conn *c, const char *what) {
  char why[512];
  int rc = idem__sq_sqlite_fail(c, what);
  if (schema_check(s, c, why, sizeof why) == IDEM_ESCHEMA)
    rc = idem__fail(IDEM_ESCHEMA, "%s", why);
  return rc;
}

/* The same for a claim's read. Returns op->rc. */
int idem__sq_op_read_failed(conn *c, idem__op *op, const char *what) {
  char why[sizeof op->errmsg];
  idem__sq_op_sqlite_fail(op, c, what);
  if (schema_check(c->store, c, why, sizeof why) == IDEM_ESCHEMA)
    idem__op_fail(op, IDEM_ESCHEMA, "%s", why);
  return op->rc;
}

/*
 * Whether the schema is still one this handle knows (see schema_check()),
 * read inside the write transaction. IDEM_OK, or IDEM_ESCHEMA (or the
 * store's error) with a detail.
 */
int idem__sq_schema_unchanged(sq_store *s, conn *c) {
  char why[512];
  int rc = schema_check(s, c, why, sizeof why);
  return rc == IDEM_OK ? IDEM_OK : idem__fail(rc, "%s", why);
}
