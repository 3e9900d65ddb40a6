/*
 * pg_lease.c -- the PostgreSQL store's side of lease.h: many renewals in
 * one statement, bounded by the shortest lease among them.
 */
#include "lease.h"
#include "pg_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One statement for a batch: the arrays name each lease's row and owner. */
static const char renew_many_sql[] =
    "UPDATE {S}.idem_records r SET lease_expires_ms = n.now_ms + u.lease, "
    "updated_ms = n.now_ms FROM (SELECT (floor(extract(epoch FROM "
    "clock_timestamp()) * 1000))::bigint AS now_ms) n, unnest($1::text[], "
    "$2::text[], $3::text[], $4::text[], $5::bigint[]) AS u(tenant, "
    "operation, key, owner, lease) WHERE r.tenant = u.tenant AND "
    "r.operation = u.operation AND r.key = u.key AND r.owner = u.owner AND "
    "r.state = 1 RETURNING r.tenant, r.operation, r.key, r.lease_expires_ms";

/* A growable text buffer for an array literal. */
typedef struct buf {
  char *p;
  size_t n, cap;
  int oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->n + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

/* Appends one element to a text[] literal: always quoted, with '\' and '"'
 * escaped, so that any text (empty, with commas or braces) reads back as
 * itself. */
static void put_elem(buf *b, const char *s, int first) {
  put(b, first ? "\"" : ",\"", first ? 1 : 2);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      put(b, "\\", 1);
    put(b, s, 1);
  }
  put(b, "\"", 1);
}

/* Waits for the statement's result for at most ms; past that it is
 * cancelled. Returns the result, or NULL when it timed out or failed. */
static PGresult *result_within(PGconn *pg, int64_t ms, int *timed_out) {
  int64_t until = idem__mono_ms() + ms;
  PGresult *res, *last = NULL;
  *timed_out = 0;
  for (;;) {
    while (!PQisBusy(pg)) {
      if (!(res = PQgetResult(pg)))
        return last;
      PQclear(last);
      last = res;
    }
    int64_t left = until - idem__mono_ms();
    if (left <= 0 || *timed_out) {
      if (!*timed_out) {
        /* A renewal that comes back after its lease ended is of no use:
         * the holder already counts it lost. */
        char msg[256];
        PGcancel *cancel = PQgetCancel(pg);
        if (cancel) {
          PQcancel(cancel, msg, sizeof msg);
          PQfreeCancel(cancel);
        }
        *timed_out = 1;
      }
      /* The server answers a cancel at once; then drain as usual. */
      while ((res = PQgetResult(pg)))
        PQclear(res);
      PQclear(last);
      return NULL;
    }
    struct pollfd p = {PQsocket(pg), POLLIN, 0};
    if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) < 0 &&
        errno != EINTR) {
      PQclear(last);
      return NULL;
    }
    if (!PQconsumeInput(pg)) {
      PQclear(last);
      return NULL;
    }
  }
}

void idem__pg_run_many(void *state, idem__op **ops, int n) {
  pg_store *s = state;
  buf t = {0}, o = {0}, k = {0}, w = {0}, l = {0};
  char err[ERR_SIZE] = "", *sql = NULL;
  conn *c = NULL;
  PGresult *res = NULL;
  int64_t shortest = INT64_MAX;
  int rc, timed_out = 0;

  for (int i = 0; i < n; i++) {
    char num[24];
    ops[i]->rc = IDEM_OK;
    ops[i]->errmsg[0] = '\0';
    put(&t, i ? "" : "{", i ? 0 : 1);
    put(&o, i ? "" : "{", i ? 0 : 1);
    put(&k, i ? "" : "{", i ? 0 : 1);
    put(&w, i ? "" : "{", i ? 0 : 1);
    put(&l, i ? "," : "{", 1);
    put_elem(&t, ops[i]->id->tenant ? ops[i]->id->tenant : "", i == 0);
    put_elem(&o, ops[i]->id->operation, i == 0);
    put_elem(&k, ops[i]->id->key, i == 0);
    put_elem(&w, ops[i]->claim->token, i == 0);
    snprintf(num, sizeof num, "%lld",
             (long long)idem__pg_period(ops[i]->lease_ms));
    put(&l, num, strlen(num));
    if (ops[i]->lease_ms < shortest)
      shortest = ops[i]->lease_ms;
  }
  put(&t, "}", 1);
  put(&o, "}", 1);
  put(&k, "}", 1);
  put(&w, "}", 1);
  put(&l, "}", 1);
  if (t.oom || o.oom || k.oom || w.oom || l.oom ||
      !(sql = idem__pg_build_sql(renew_many_sql, s->schema))) {
    rc = idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
    goto out;
  }
  if ((rc = idem__pg_pool_get(s, &c, err)) != IDEM_OK)
    goto out;
  {
    const char *v[5] = {t.p, o.p, k.p, w.p, l.p};
    if (!PQsendQueryParams(c->pg, sql, 5, NULL, v, NULL, NULL, 0)) {
      rc = idem__pg_fail(c, NULL, "renew", err);
      goto out;
    }
  }
  res = result_within(c->pg, shortest, &timed_out);
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
    if (timed_out)
      rc = idem__pg_failf(err, IDEM_EUNAVAILABLE,
                          "postgresql: the renewal did not come back within "
                          "the lease (%lld ms); cancelled",
                          (long long)shortest);
    else
      rc = idem__pg_fail(c, res, "renew", err);
    goto out;
  }
  /* A lease whose row did not come back was taken over or removed. */
  for (int i = 0; i < n; i++)
    ops[i]->rc = IDEM_ESTALE;
  for (int r = 0; r < PQntuples(res); r++) {
    const char *rt = PQgetvalue(res, r, 0), *ro = PQgetvalue(res, r, 1),
               *rk = PQgetvalue(res, r, 2);
    for (int i = 0; i < n; i++) {
      const idem_id *id = ops[i]->id;
      if (ops[i]->rc == IDEM_ESTALE && strcmp(rk, id->key) == 0 &&
          strcmp(ro, id->operation) == 0 &&
          strcmp(rt, id->tenant ? id->tenant : "") == 0) {
        ops[i]->rc = IDEM_OK;
        ops[i]->claim->lease_expires_ms = idem__pg_col_int(res, r, 3);
        break;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (ops[i]->rc == IDEM_ESTALE)
      idem__op_fail(ops[i], IDEM_ESTALE,
                    "key '%s': the lease was taken over by a newer attempt "
                    "or the record was removed",
                    ops[i]->id->key);
  rc = IDEM_OK;
out:
  if (rc != IDEM_OK) {
    idem__pg_scrub(s, err, sizeof err);
    for (int i = 0; i < n; i++)
      idem__op_fail(ops[i], rc, "%s", err);
  }
  PQclear(res);
  if (c)
    idem__pg_pool_put(s, c);
  free(sql);
  free(t.p);
  free(o.p);
  free(k.p);
  free(w.p);
  free(l.p);
}
