/*
 * admin.c -- the PostgreSQL backend's schema (created or migrated on
 * open, under an advisory lock) and the operators' calls: get, list,
 * prune, resolve and delete.
 */

#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_VERSION 4
#define LIST_PAGE 256
/* Advisory lock class for schema creation: "idem" in ASCII. */
#define SCHEMA_LOCK_CLASS "1768187245"

/* ---- SQL text ------------------------------------------------------------ */

/* Replaces every "{S}" in tmpl with the quoted schema name. The name was
 * validated at open ([a-z_][a-z0-9_]*), so quoting it cannot go wrong. */
char *idem__pg_build_sql(const char *tmpl, const char *schema) {
  size_t n = 0, slen = strlen(schema) + 2;
  const char *p;
  char *out, *q;
  for (p = tmpl; (p = strstr(p, "{S}")); p += 3)
    n++;
  out = malloc(strlen(tmpl) + n * slen + 1);
  if (!out)
    return NULL;
  for (p = tmpl, q = out; *p;) {
    if (!strncmp(p, "{S}", 3)) {
      q += sprintf(q, "\"%s\"", schema);
      p += 3;
    } else {
      *q++ = *p++;
    }
  }
  *q = '\0';
  return out;
}

static const char schema_meta[] = "CREATE SCHEMA IF NOT EXISTS {S};"
                                  "CREATE TABLE IF NOT EXISTS {S}.idem_meta ("
                                  " name text PRIMARY KEY,"
                                  " value text NOT NULL)";

static const char schema_v1[] =
    "CREATE TABLE IF NOT EXISTS {S}.idem_records ("
    " tenant text NOT NULL,"
    " operation text NOT NULL,"
    " key text NOT NULL,"
    " fingerprint text NOT NULL,"
    " request bytea,"
    " state integer NOT NULL,"
    " owner text,"
    " attempt integer NOT NULL,"
    " created_ms bigint NOT NULL,"
    " updated_ms bigint NOT NULL,"
    " lease_expires_ms bigint NOT NULL,"
    " expires_ms bigint NOT NULL,"
    " status integer,"
    " meta bytea,"
    " body bytea,"
    " checksum text,"
    " PRIMARY KEY (tenant, operation, key));"
    "CREATE INDEX IF NOT EXISTS idem_records_expires ON {S}.idem_records "
    "(expires_ms)";

/*
 * Version 2: the identifying columns compare as bytes (COLLATE "C"), as on
 * SQLite, whatever the database's default collation. The primary key index
 * then never depends on the operating system's locale data, which can
 * change its order in an upgrade and leave a text index corrupt (a
 * uniqueness check that misses a row); and its comparisons are plain
 * memcmp. The table is not rewritten; the primary key index is rebuilt.
 */
static const char schema_v2[] =
    "ALTER TABLE {S}.idem_records"
    " ALTER COLUMN tenant TYPE text COLLATE \"C\","
    " ALTER COLUMN operation TYPE text COLLATE \"C\","
    " ALTER COLUMN key TYPE text COLLATE \"C\"";

/*
 * Version 3: the recovered mark (idem_record.recovered). Records of
 * earlier versions are not marked. Since PostgreSQL 11 a column with a
 * constant default is added without rewriting the table.
 */
static const char schema_v3[] = "ALTER TABLE {S}.idem_records ADD COLUMN IF "
                                "NOT EXISTS recovered boolean NOT NULL "
                                "DEFAULT false";

/*
 * Version 4: waiting on a key in flight (lease.c). A waiter marks the
 * record watched; a watched record in progress that ends (its state
 * changes), is taken over (its owner changes), has its lease cut short (a
 * takeover's release) or is deleted notifies idem_ended with its name
 * (tenant, 0x1f, operation, 0x1f, key). Records nobody watches never
 * notify: a notifying transaction holds the server's notification lock
 * through its commit, which would serialize every completion.
 */
static const char schema_v4[] =
    "ALTER TABLE {S}.idem_records ADD COLUMN IF NOT EXISTS watched boolean "
    "NOT NULL DEFAULT false;"
    "CREATE OR REPLACE FUNCTION {S}.idem_notify_ended() RETURNS trigger "
    "LANGUAGE plpgsql AS $f$ BEGIN PERFORM pg_notify('idem_ended', "
    "OLD.tenant || chr(31) || OLD.operation || chr(31) || OLD.key); RETURN "
    "NULL; END $f$;"
    "DROP TRIGGER IF EXISTS idem_ended_update ON {S}.idem_records;"
    "CREATE TRIGGER idem_ended_update AFTER UPDATE ON {S}.idem_records FOR "
    "EACH ROW WHEN (OLD.watched AND OLD.state = 1 AND (NEW.state <> 1 OR "
    "NEW.owner IS DISTINCT FROM OLD.owner OR NEW.lease_expires_ms < "
    "OLD.lease_expires_ms)) EXECUTE FUNCTION {S}.idem_notify_ended();"
    "DROP TRIGGER IF EXISTS idem_ended_delete ON {S}.idem_records;"
    "CREATE TRIGGER idem_ended_delete AFTER DELETE ON {S}.idem_records FOR "
    "EACH ROW WHEN (OLD.watched) EXECUTE FUNCTION {S}.idem_notify_ended()";

/* Builds s's schema statements; IDEM_ENOMEM when out of memory. */
int idem__pg_schema_sql(pg_store *s) {
  s->sql_meta = idem__pg_build_sql(schema_meta, s->schema);
  s->sql_v1 = idem__pg_build_sql(schema_v1, s->schema);
  s->sql_v2 = idem__pg_build_sql(schema_v2, s->schema);
  s->sql_v3 = idem__pg_build_sql(schema_v3, s->schema);
  s->sql_v4 = idem__pg_build_sql(schema_v4, s->schema);
  s->sql_version = idem__pg_build_sql("SELECT value FROM {S}.idem_meta WHERE "
                                      "name = 'schema_version'",
                                      s->schema);
  if (!s->sql_meta || !s->sql_v1 || !s->sql_v2 || !s->sql_v3 || !s->sql_v4 ||
      !s->sql_version)
    return IDEM_ENOMEM;
  return IDEM_OK;
}

/* ---- schema -------------------------------------------------------------- */

/* The stored schema version; 0 when idem's tables do not exist yet. */
static int read_version(pg_store *s, conn *c, int *version, char *err) {
  char meta[SCHEMA_MAX + 32];
  const char *v[1] = {meta};
  PGresult *res;
  int exists, rc = IDEM_OK;
  *version = 0;
  snprintf(meta, sizeof meta, "\"%s\".idem_meta", s->schema);
  res = idem__pg_exec_params(c, "SELECT to_regclass($1) IS NOT NULL", 1, v,
                     NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = idem__pg_fail(c, res, "schema", err);
    PQclear(res);
    return rc;
  }
  exists = PQntuples(res) == 1 && !strcmp(PQgetvalue(res, 0, 0), "t");
  PQclear(res);
  if (!exists)
    return IDEM_OK;
  res = idem__pg_exec(c, s->sql_version);
  if (PQresultStatus(res) != PGRES_TUPLES_OK)
    rc = idem__pg_fail(c, res, "schema", err);
  else if (PQntuples(res) > 0)
    *version = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return rc;
}

static int newer_schema(pg_store *s, int version, char *err) {
  return idem__pg_failf(
      err, IDEM_ESCHEMA,
      "store: schema \"%s\" has version %d; this idem knows up to "
      "%d; the store was left untouched",
      s->schema, version, SCHEMA_VERSION);
}

/*
 * Creates or migrates the schema. An up-to-date store is only read, so a
 * role without CREATE rights can use a schema prepared by an operator.
 * Otherwise the work runs in one transaction under an advisory lock: many
 * processes opening a fresh database at once would else race on the
 * catalogs (CREATE ... IF NOT EXISTS is not safe against concurrent
 * creation), and a half-created schema is never visible. s->schema_min is
 * set to the version the store is left at.
 */
int idem__pg_ensure_schema(pg_store *s, conn *c, char *err) {
  const char *v[1] = {s->schema};
  char what[SCHEMA_MAX + 48];
  PGresult *res;
  int version, rc, reached;

  if ((rc = read_version(s, c, &version, err)) != IDEM_OK)
    return rc;
  if (version > SCHEMA_VERSION)
    return newer_schema(s, version, err);
  s->schema_min = version;
  if (version == SCHEMA_VERSION)
    return IDEM_OK;

  if ((rc = idem__pg_begin(c, err)) != IDEM_OK)
    return rc;
  res = idem__pg_exec_params(c,
                     "SELECT pg_advisory_xact_lock(" SCHEMA_LOCK_CLASS
                     ", hashtext($1))",
                     1, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = idem__pg_fail(c, res, "schema lock", err);
    PQclear(res);
    goto fail;
  }
  PQclear(res);
  snprintf(what, sizeof what, "creating schema \"%s\"", s->schema);
  /* Once a version is written the schema and idem_meta exist; creating
   * them IF NOT EXISTS would still take the right to create them. */
  if (version < 1 &&
      (rc = idem__pg_run_simple(c, s->sql_meta, what, err)) != IDEM_OK)
    goto fail;
  /* Read again under the lock: another process may have just done it. */
  if ((rc = read_version(s, c, &version, err)) != IDEM_OK)
    goto fail;
  if (version > SCHEMA_VERSION) {
    rc = newer_schema(s, version, err);
    goto fail;
  }
  /* Migrations run in order, each inside this one transaction. */
  if (version < 1 &&
      (rc = idem__pg_run_simple(c, s->sql_v1, what, err)) != IDEM_OK)
    goto fail;
  /*
   * On an existing table, which may be busy, each step waits one second at
   * most for the table's exclusive lock, since every call on it queues
   * behind the wait. A role that may not alter it (not its owner), or a
   * table too busy, leaves the store at the version before that step for
   * now, which this idem uses as it is (version 2 changes no statement;
   * without version 3 no response is kept marked recovered); an open by
   * the owner at a quieter moment migrates it.
   */
  if (version >= 1 &&
      (rc = idem__pg_run_simple(c, "SET LOCAL lock_timeout = 1000", "schema",
                                err)) != IDEM_OK)
    goto fail;
  reached = version < 1 ? 1 : version;
  for (int to = reached + 1; to <= SCHEMA_VERSION; to++) {
    const char *sql = to == 2   ? s->sql_v2
                      : to == 3 ? s->sql_v3
                                : s->sql_v4;
    snprintf(what, sizeof what, "migrating schema \"%s\" to version %d",
             s->schema, to);
    if (version >= 1 && (rc = idem__pg_run_simple(c, "SAVEPOINT idem_migrate",
                                                  what, err)) != IDEM_OK)
      goto fail;
    if ((rc = idem__pg_run_simple(c, sql, what, err)) != IDEM_OK) {
      if (version < 1 || (strcmp(c->sqlstate, "42501") != 0 &&
                          strcmp(c->sqlstate, "55P03") != 0))
        goto fail;
      if ((rc = idem__pg_run_simple(c, "ROLLBACK TO SAVEPOINT idem_migrate",
                                    what, err)) != IDEM_OK)
        goto fail;
      break;
    }
    reached = to;
  }
  if (reached > version) {
    char sql[SCHEMA_MAX + 200];
    snprintf(sql, sizeof sql,
             "INSERT INTO \"%s\".idem_meta VALUES ('schema_version', '%d') "
             "ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
             s->schema, reached);
    if ((rc = idem__pg_run_simple(c, sql, "schema", err)) != IDEM_OK)
      goto fail;
  }
  if ((rc = idem__pg_commit(c, err)) != IDEM_OK)
    return rc;
  s->schema_min = reached;
  return IDEM_OK;
fail:
  idem__pg_rollback(c);
  return rc;
}

/* ---- the schema version, after open -------------------------------------- */

/*
 * A newer idem may migrate the store while this handle has it open. From
 * then on this handle neither reads records (their layout may have
 * changed) nor writes what an operator asks: those calls fail with
 * IDEM_ESCHEMA. Reads of records read the version in the statement that
 * reads them (store.c); an operator's write reads it inside its
 * transaction, after taking the schema's advisory lock in shared mode, so
 * that no migration (which holds it exclusively) can come between the
 * check and the write.
 */
int idem__pg_schema_check(const pg_store *s, int version, char *err) {
  if (version >= s->schema_min && version <= SCHEMA_VERSION)
    return IDEM_OK;
  return idem__pg_failf(
      err, IDEM_ESCHEMA,
      "store: schema \"%s\" is now version %d (this idem knows up to %d): "
      "another version of idem changed it while this handle had it open; "
      "nothing more is read through this handle, nor written by an "
      "operator; open the store with that version",
      s->schema, version, SCHEMA_VERSION);
}

/* Reads the version on c: IDEM_OK, IDEM_ESCHEMA or the store's error. */
static int schema_read(pg_store *s, conn *c, char *err) {
  PGresult *res = idem__pg_exec(c, s->sql_version);
  int rc, version = 0;
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = idem__pg_fail(c, res, "read the schema version", err);
    PQclear(res);
    return rc;
  }
  if (PQntuples(res) > 0)
    version = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  return idem__pg_schema_check(s, version, err);
}

int idem__pg_read_failed(pg_store *s, conn *c, int rc, char *err) {
  char why[ERR_SIZE];
  /* The caller's own transaction is the caller's to end. */
  if (c->foreign || rc != IDEM_ESTORE || PQstatus(c->pg) != CONNECTION_OK)
    return rc;
  idem__pg_rollback(c);
  if (schema_read(s, c, why) != IDEM_ESCHEMA)
    return rc;
  memcpy(err, why, ERR_SIZE);
  return IDEM_ESCHEMA;
}

/* Begins an operator's write transaction on c: the schema's advisory lock
 * in shared mode, then the version. IDEM_OK with the transaction open, or
 * the error with none. */
static int operator_begin(pg_store *s, conn *c, char *err) {
  const char *v[1] = {s->schema};
  PGresult *res;
  int rc = idem__pg_begin(c, err);
  /* A connection found dead before anything was sent is made again. */
  if (idem__pg_revived(s, c, &rc, err))
    rc = idem__pg_begin(c, err);
  if (rc != IDEM_OK)
    return rc;
  res = idem__pg_exec_params(c,
                     "SELECT pg_advisory_xact_lock_shared(" SCHEMA_LOCK_CLASS
                     ", hashtext($1))",
                     1, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK)
    rc = idem__pg_fail(c, res, "schema lock", err);
  PQclear(res);
  if (rc == IDEM_OK)
    rc = schema_read(s, c, err);
  if (rc != IDEM_OK)
    idem__pg_rollback(c);
  return rc;
}

int idem__pg_server_version(pg_store *s, conn *c, char *err) {
  PGresult *res = idem__pg_exec(c, "SHOW server_version");
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
    rc = idem__pg_fail(c, res, "server version", err);
  } else {
    /* "15.18 (Debian 15.18-1.pgdg120+1)" -> "15.18" */
    const char *v = PQgetvalue(res, 0, 0);
    size_t n = strcspn(v, " ");
    if (n >= sizeof s->version)
      n = sizeof s->version - 1;
    memcpy(s->version, v, n);
    s->version[n] = '\0';
  }
  PQclear(res);
  return rc;
}

/* ---- operators ----------------------------------------------------------- */

/* Reports an operator call's failure, its detail scrubbed. */
static int fail_out(const pg_store *s, int rc, char *err) {
  idem__pg_scrub(s, err, ERR_SIZE);
  return idem__fail(rc, "%s", err);
}

/* Columns in RECORD_COLUMNS order. */
static int row_to_record(const PGresult *q, int i, idem_record **out) {
  idem__row_parts p;
  memset(&p, 0, sizeof p);
  p.tenant = idem__pg_col_ptr(q, i, 0, &p.tenant_len);
  p.operation = idem__pg_col_ptr(q, i, 1, &p.operation_len);
  p.key = idem__pg_col_ptr(q, i, 2, &p.key_len);
  p.fingerprint = idem__pg_col_ptr(q, i, 3, &p.fingerprint_len);
  p.state = (int)idem__pg_col_int(q, i, 4);
  p.attempt = (int)idem__pg_col_int(q, i, 5);
  p.created_ms = idem__pg_col_int(q, i, 6);
  p.updated_ms = idem__pg_col_int(q, i, 7);
  p.lease_expires_ms = idem__pg_col_int(q, i, 8);
  p.expires_ms = idem__pg_col_int(q, i, 9);
  p.request = idem__pg_col_ptr(q, i, 10, &p.request_len);
  p.status = (int)idem__pg_col_int(q, i, 11);
  p.meta = idem__pg_col_ptr(q, i, 12, &p.meta_len);
  p.body = idem__pg_col_ptr(q, i, 13, &p.body_len);
  p.recovered = (int)idem__pg_col_int(q, i, 15);
  return idem__record_new(&p, out);
}

/* The schema version that a row of RECORD_COLUMNS read with it. */
#define RECORD_VERSION 16

int idem__pg_get(void *state, const idem_id *id, idem_record **out) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int rc = idem__pg_pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  idem__pg_p_id(&p, id);
  rc = idem__pg_run_stmt_retry(s, c, ST_GET, &p, "get", &res, err);
  if (rc != IDEM_OK)
    rc = idem__pg_read_failed(s, c, rc, err);
  else if (PQntuples(res) > 0)
    rc = idem__pg_schema_check(s, (int)idem__pg_col_int(res, 0, RECORD_VERSION),
                               err);
  else
    rc = schema_read(s, c, err); /* no row read the version */
  idem__pg_pool_put(s, c);
  if (rc != IDEM_OK) {
    PQclear(res);
    return fail_out(s, rc, err);
  }
  if (PQntuples(res) > 0)
    rc = row_to_record(res, 0, out);
  else
    rc = idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                    id->tenant ? id->tenant : "", id->operation, id->key);
  PQclear(res);
  return rc;
}

/*
 * Whether the store can take a write now: a query answers on a pooled
 * connection (sent once more on one found dead and re-established, as reads
 * are, so that the first check after an outage does not fail for the
 * outage's dead connection), the schema is still one this handle knows,
 * and the session takes writes: a standby, or a server set to
 * default_transaction_read_only, would refuse every claim.
 */
int idem__pg_check(void *state) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res;
  char err[ERR_SIZE];
  int rc = idem__pg_pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  rc = schema_read(s, c, err);
  if (idem__pg_revived(s, c, &rc, err))
    rc = schema_read(s, c, err);
  if (rc == IDEM_OK) {
    res = idem__pg_exec(c, "SHOW transaction_read_only");
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      rc = idem__pg_fail(c, res, "check", err);
    } else if (PQntuples(res) > 0 &&
               strcmp(PQgetvalue(res, 0, 0), "on") == 0) {
      /* Reconnected before its next use, as after a refused write, so
       * that a URL with several hosts finds the primary again. */
      c->read_only = 1;
      rc = idem__pg_failf(err, IDEM_EUNAVAILABLE,
                          "postgresql: the server accepts no writes (a "
                          "standby, or default_transaction_read_only); "
                          "point idem at the primary, e.g. with several "
                          "hosts and target_session_attrs=read-write");
    }
    PQclear(res);
  }
  idem__pg_pool_put(s, c);
  return rc == IDEM_OK ? IDEM_OK : fail_out(s, rc, err);
}

int idem__pg_list(void *state, const idem_filter *f, idem_record_fn fn,
                  void *ctx) {
  pg_store *s = state;
  char err[ERR_SIZE], state_s[16];
  char *after_tenant = NULL, *after_op = NULL, *after_key = NULL;
  int64_t after_created = 0, left = f->limit > 0 ? f->limit : -1;
  int first = 1, rc = IDEM_OK;

  snprintf(state_s, sizeof state_s, "%d", f->state);
  while (rc == IDEM_OK && left != 0) {
    int64_t page = left < 0 || left > LIST_PAGE ? LIST_PAGE : left;
    PGresult *res = NULL;
    params p = {0};
    conn *c = NULL;
    int rows;
    idem__pg_p_text(&p, f->tenant);
    idem__pg_p_text(&p, f->operation);
    idem__pg_p_text(&p, state_s);
    idem__pg_p_text(&p, f->expired || f->overdue ? "t" : "f");
    idem__pg_p_text(&p, first ? "t" : "f");
    idem__pg_p_i64(&p, after_created);
    idem__pg_p_text(&p, after_tenant ? after_tenant : "");
    idem__pg_p_text(&p, after_op ? after_op : "");
    idem__pg_p_text(&p, after_key ? after_key : "");
    idem__pg_p_i64(&p, page);
    idem__pg_p_text(&p, f->overdue ? "t" : "f");
    if ((rc = idem__pg_pool_get(s, &c, err)) != IDEM_OK) {
      rc = fail_out(s, rc, err);
      break;
    }
    rc = idem__pg_run_stmt_retry(s, c, ST_LIST, &p, "list", &res, err);
    if (rc != IDEM_OK)
      rc = idem__pg_read_failed(s, c, rc, err);
    else if (PQntuples(res) == 0)
      rc = schema_read(s, c, err); /* no row read the version */
    for (int i = 0; rc == IDEM_OK && i < PQntuples(res); i++)
      rc = idem__pg_schema_check(
          s, (int)idem__pg_col_int(res, i, RECORD_VERSION), err);
    idem__pg_pool_put(s, c);
    if (rc != IDEM_OK) {
      PQclear(res);
      rc = fail_out(s, rc, err);
      break;
    }
    rows = PQntuples(res);
    for (int i = 0; i < rows && rc == IDEM_OK; i++) {
      idem_record *r = NULL;
      rc = row_to_record(res, i, &r);
      if (rc != IDEM_OK)
        break;
      rc = fn(r, ctx);
      idem_record_free(r);
    }
    if (rc == IDEM_OK && rows > 0) {
      /* The next page starts after this page's last row. */
      free(after_tenant);
      free(after_op);
      free(after_key);
      after_created = idem__pg_col_int(res, rows - 1, 6);
      after_tenant = idem__pg_col_text(res, rows - 1, 0);
      after_op = idem__pg_col_text(res, rows - 1, 1);
      after_key = idem__pg_col_text(res, rows - 1, 2);
      if (!after_tenant || !after_op || !after_key)
        rc = idem__fail(IDEM_ENOMEM, "out of memory");
    }
    PQclear(res);
    first = 0;
    if (left > 0)
      left -= rows;
    if (rows < page)
      break;
  }
  free(after_tenant);
  free(after_op);
  free(after_key);
  return rc;
}

int idem__pg_prune(void *state, int64_t *removed) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int64_t n = 0;
  int rc = idem__pg_pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  if ((rc = operator_begin(s, c, err)) == IDEM_OK &&
      (rc = idem__pg_run_stmt(s, c, ST_PRUNE, &p, "prune", &res, err)) ==
          IDEM_OK) {
    n = strtoll(PQcmdTuples(res), NULL, 10);
    PQclear(res);
    rc = idem__pg_commit(c, err);
  }
  idem__pg_pool_put(s, c);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  *removed = n;
  return IDEM_OK;
}

int idem__pg_resolve(void *state, const idem_id *id, const idem_response *r,
                     const idem_resolve_options *o) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE], fp[IDEM_FINGERPRINT_SIZE] = "",
                      sum[IDEM_FINGERPRINT_SIZE];
  int st = 0, found, rc = idem__pg_pool_get(s, &c, err);
  int64_t lease = 0, now = 0;
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  if ((rc = operator_begin(s, c, err)) != IDEM_OK)
    goto out;
  /* Lock the row so that a claimer cannot take it over meanwhile. The
   * fingerprint parameter is empty: the response columns are not needed. */
  idem__pg_p_id(&p, id);
  idem__pg_p_text(&p, "");
  if ((rc = idem__pg_run_stmt(s, c, ST_LOCK, &p, "read record", &res, err)) !=
      IDEM_OK)
    goto out;
  found = PQntuples(res) > 0;
  if (found) {
    size_t n;
    const char *f = idem__pg_col_ptr(res, 0, 0, &n);
    snprintf(fp, sizeof fp, "%.*s", (int)(n < sizeof fp ? n : sizeof fp - 1),
             f ? f : "");
    st = (int)idem__pg_col_int(res, 0, 1);
    lease = idem__pg_col_int(res, 0, 3);
    now = idem__pg_col_int(res, 0, 9);
  }
  PQclear(res);
  res = NULL;
  if (!found) {
    rc = idem__pg_failf(err, IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                        id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_COMPLETED) {
    rc = idem__pg_failf(err, IDEM_ESTATE,
                        "record (%s, %s, %s) is already completed; nothing to "
                        "resolve",
                        id->tenant ? id->tenant : "", id->operation, id->key);
    goto out;
  }
  if (st == IDEM_STATE_IN_PROGRESS && lease > now && !o->force) {
    rc = idem__pg_failf(
        err, IDEM_ESTATE,
        "record (%s, %s, %s) is held by a run whose lease ends in "
        "%.1f s: it may still be acting; wait for the lease to end, "
        "or force it",
        id->tenant ? id->tenant : "", id->operation, id->key,
        (double)(lease - now) / 1000.0);
    goto out;
  }
  p.n = 0;
  idem__pg_p_id(&p, id);
  if (r) {
    if (idem__response_checksum(fp, r->status, r->meta, r->meta_len, r->body,
                                r->body_len, sum) != IDEM_OK) {
      rc = idem__pg_failf(err, IDEM_ENOMEM, "out of memory");
      goto out;
    }
    idem__pg_p_i64(&p, idem__pg_period(o->retention_ms));
    idem__pg_p_i64(&p, r->status);
    idem__pg_p_bytes(&p, r->meta, r->meta_len);
    idem__pg_p_bytes(&p, r->body_len ? r->body : "", r->body_len);
    idem__pg_p_text(&p, sum);
    rc = idem__pg_run_stmt(s, c, ST_RESOLVE_DONE, &p, "resolve", &res, err);
  } else {
    rc = idem__pg_run_stmt(s, c, ST_RESOLVE_DELETE, &p, "resolve", &res, err);
  }
  PQclear(res);
  if (rc == IDEM_OK)
    rc = idem__pg_commit(c, err);
out:
  idem__pg_rollback(c);
  idem__pg_pool_put(s, c);
  return rc == IDEM_OK ? IDEM_OK : fail_out(s, rc, err);
}

int idem__pg_remove(void *state, const idem_id *id) {
  pg_store *s = state;
  conn *c = NULL;
  PGresult *res = NULL;
  params p = {0};
  char err[ERR_SIZE];
  int changed = 0;
  int rc = idem__pg_pool_get(s, &c, err);
  if (rc != IDEM_OK)
    return fail_out(s, rc, err);
  idem__pg_p_id(&p, id);
  if ((rc = operator_begin(s, c, err)) == IDEM_OK &&
      (rc = idem__pg_run_stmt(s, c, ST_DELETE, &p, "delete", &res, err)) ==
          IDEM_OK) {
    changed = atoi(PQcmdTuples(res));
    rc = idem__pg_commit(c, err);
  }
  idem__pg_pool_put(s, c);
  if (rc != IDEM_OK) {
    PQclear(res);
    return fail_out(s, rc, err);
  }
  rc = changed == 0
           ? idem__fail(IDEM_ENOTFOUND, "no record (%s, %s, %s)",
                        id->tenant ? id->tenant : "", id->operation, id->key)
           : IDEM_OK;
  PQclear(res);
  /* This handle must not replay the deleted record from its cache. */
  idem__cache_forget(s->cache, id);
  return rc;
}
