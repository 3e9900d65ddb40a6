/*
 * lease.c -- the PostgreSQL store's side of lease.h: many renewals in
 * one statement, bounded by the shortest lease among them.
 */
#include "lease.h"
#include "pg.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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

/*
 * The bound is the latest reading's (the one asked last), not the least
 * of them: the server's clock may step, and only a reading taken since
 * knows. Each reading bounds the server's offset from our monotonic clock
 * from above (the server read its clock after we asked), loosely by the
 * round trip: a lease then counts as ending that much early, never late.
 */
void idem__pg_clock_reading(pg_store *s, int64_t asked_mono,
                            int64_t server_ms) {
  pthread_mutex_lock(&s->clock_mu);
  if (asked_mono >= s->clock_asked) {
    s->clock_asked = asked_mono;
    s->clock_ahead = server_ms - asked_mono;
  }
  pthread_mutex_unlock(&s->clock_mu);
}

int64_t idem__pg_clock_ahead(void *state) {
  pg_store *s = state;
  int64_t ahead;
  pthread_mutex_lock(&s->clock_mu);
  ahead = s->clock_ahead;
  pthread_mutex_unlock(&s->clock_mu);
  return ahead;
}

void idem__pg_interrupt_renewals(void *state) {
  pg_store *s = state;
  pthread_mutex_lock(&s->renew_mu);
  if (s->renew_fd >= 0 && !s->renew_cut) {
    s->renew_cut = 1;
    shutdown(s->renew_fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&s->renew_mu);
}

void idem__pg_run_many(void *state, idem__op **ops, int n) {
  pg_store *s = state;
  buf t = {0}, o = {0}, k = {0}, w = {0}, l = {0};
  char err[ERR_SIZE] = "", *sql = NULL;
  conn *c = NULL;
  PGresult *res = NULL;
  int64_t shortest = INT64_MAX, asked = 0;
  int rc, cut = 0;

  put(&t, "{", 1);
  put(&o, "{", 1);
  put(&k, "{", 1);
  put(&w, "{", 1);
  put(&l, "{", 1);
  for (int i = 0; i < n; i++) {
    char num[24];
    ops[i]->rc = IDEM_OK;
    ops[i]->errmsg[0] = '\0';
    if (i)
      put(&l, ",", 1);
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
  /* Only the scheduler's thread renews: the connection is its own. */
  if (s->renewer && PQstatus(s->renewer->pg) != CONNECTION_OK) {
    idem__pg_conn_close(s->renewer);
    s->renewer = NULL;
  }
  if (!s->renewer && (rc = idem__pg_conn_open(s, &s->renewer, err)) != IDEM_OK)
    goto out;
  c = s->renewer;
  asked = idem__mono_ms();
  pthread_mutex_lock(&s->renew_mu);
  s->renew_fd = PQsocket(c->pg);
  s->renew_cut = 0;
  pthread_mutex_unlock(&s->renew_mu);
  {
    const char *v[5] = {t.p, o.p, k.p, w.p, l.p};
    /* Read within the shortest lease: past it, or when a holder cuts it
     * short, the renewer's connection is given up (a renewal that comes
     * back after its lease ended is of no use: the holder already counts
     * it lost). */
    if (PQsendQueryParams(c->pg, sql, 5, NULL, v, NULL, NULL, 0))
      res = idem__pg_results(c, idem__mono_ms() + shortest);
  }
  pthread_mutex_lock(&s->renew_mu);
  s->renew_fd = -1;
  cut = s->renew_cut;
  pthread_mutex_unlock(&s->renew_mu);
  if (!res || PQresultStatus(res) != PGRES_TUPLES_OK) {
    if (cut)
      rc = idem__pg_failf(err, IDEM_EUNAVAILABLE,
                          "postgresql: the renewal had not come back when "
                          "its holder ended the lease; given up");
    else if (c->timed_out)
      rc = idem__pg_failf(err, IDEM_EUNAVAILABLE,
                          "postgresql: the renewal did not come back within "
                          "the lease (%lld ms); given up",
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
        /* Text results (the statement is not prepared): the deadline
         * is read as a number, not as idem__pg_col_int()'s binary. */
        ops[i]->claim->lease_expires_ms =
            strtoll(PQgetvalue(res, r, 3), NULL, 10);
        /* The server wrote now + lease by its clock: a reading of it. */
        idem__pg_clock_reading(s, asked,
                               ops[i]->claim->lease_expires_ms -
                                   idem__pg_period(ops[i]->lease_ms));
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
    idem__pg_rollback(c);
  free(sql);
  free(t.p);
  free(o.p);
  free(k.p);
  free(w.p);
  free(l.p);
}

/* ---- watching keys in flight ---------------------------------------------- */

/*
 * One connection per store LISTENs on the channel that the records table's
 * triggers notify when a watched record in progress ends (admin.c,
 * schema version 4): its thread wakes the waiting room's bucket of the
 * record's name. Only records a waiter marked watched notify, so that
 * endings nobody waits for never take the server's notification lock.
 */
#define CHANNEL "idem_ended"
/* A listening connection quiet this long is asked a round trip, which
 * must come back within the deadline: a silent connection is found within
 * the sum, and its waiters ask the store again. */
#define HEARTBEAT_MS 2000
#define HEARTBEAT_DEADLINE_MS 2000

struct idem__pg_listener {
  pg_store *s;
  conn *c;
  pthread_t thread;
  int wake[2]; /* a byte here stops the thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int ready;  /* LISTEN is in force */
  int state;  /* 0 starting, 1 running, -1 failed to start */
};

static pthread_mutex_t listener_mu = PTHREAD_MUTEX_INITIALIZER;

static void listener_set(idem__pg_listener *l, int ready, int state) {
  pthread_mutex_lock(&l->mu);
  l->ready = ready;
  if (state)
    l->state = state;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* Every waiter asks again: notifications may have been lost with the
 * connection. */
static void wake_everyone(void) {
  for (unsigned i = 0; i < 256; i++)
    idem__wait_wake_bucket(i);
}

static int listen_on(idem__pg_listener *l, char *err) {
  if (!l->c && idem__pg_conn_open(l->s, &l->c, err) != IDEM_OK)
    return -1;
  if (idem__pg_run_simple(l->c, "LISTEN " CHANNEL, "listen", err) != IDEM_OK) {
    idem__pg_conn_close(l->c);
    l->c = NULL;
    return -1;
  }
  return 0;
}

/* One round trip on a quiet listening connection within
 * HEARTBEAT_DEADLINE_MS: non-zero when it came back. */
static int heartbeat(conn *c) {
  PGresult *r =
      PQsendQuery(c->pg, "SELECT 1")
          ? idem__pg_results(c, idem__mono_ms() + HEARTBEAT_DEADLINE_MS)
          : NULL;
  int ok = PQresultStatus(r) == PGRES_TUPLES_OK;
  PQclear(r);
  return ok && PQstatus(c->pg) == CONNECTION_OK;
}

static void *listener_thread(void *arg) {
  idem__pg_listener *l = arg;
  char err[ERR_SIZE];
  int64_t backoff = 50;
  int first = 1;
  for (;;) {
    if (!l->c || PQstatus(l->c->pg) != CONNECTION_OK) {
      if (l->c) {
        idem__pg_conn_close(l->c);
        l->c = NULL;
        listener_set(l, 0, 0);
        wake_everyone();
      }
      if (listen_on(l, err) != 0) {
        if (first) {
          listener_set(l, 0, -1);
          return NULL;
        }
        struct pollfd p = {l->wake[0], POLLIN, 0};
        if (poll(&p, 1, (int)backoff) > 0)
          break;
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
        continue;
      }
      backoff = 50;
      listener_set(l, 1, 1);
      if (!first)
        wake_everyone();
      first = 0;
    }
    struct pollfd p[2] = {{PQsocket(l->c->pg), POLLIN, 0},
                          {l->wake[0], POLLIN, 0}};
    int ready = poll(p, 2, HEARTBEAT_MS);
    if (ready < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (ready == 0) {
      /* Quiet: a connection that went silent (a stalled server or
       * middlebox, TCP still up) would deliver nothing, and its waiters
       * would hear nothing. A statement that does not come back in time
       * gives the connection up: reconnected above, and everyone asks
       * again meanwhile. */
      if (!heartbeat(l->c))
        continue;
    } else if (p[0].revents && !PQconsumeInput(l->c->pg)) {
      continue; /* the connection is gone: reconnect above */
    }
    PGnotify *n;
    while ((n = PQnotifies(l->c->pg))) {
      idem__wait_reported(idem__wait_bucket(n->extra, strlen(n->extra)));
      PQfreemem(n);
    }
  }
  listener_set(l, 0, 0);
  return NULL;
}

/* The store's listener, started and listening; NULL when it cannot be. */
static idem__pg_listener *listener_get(pg_store *s) {
  idem__pg_listener *l;
  pthread_mutex_lock(&listener_mu);
  if (!(l = s->listener) && (l = calloc(1, sizeof *l))) {
    l->s = s;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (pipe2(l->wake, O_CLOEXEC) != 0) {
      free(l);
      l = NULL;
    } else if (idem__thread_start(&l->thread, "idem-pg-listen",
                                  listener_thread, l) != 0) {
      close(l->wake[0]);
      close(l->wake[1]);
      free(l);
      l = NULL;
    } else {
      s->listener = l;
    }
  }
  pthread_mutex_unlock(&listener_mu);
  if (!l)
    return NULL;
  pthread_mutex_lock(&l->mu);
  while (l->state == 0)
    pthread_cond_wait(&l->cv, &l->mu);
  int ready = l->ready;
  pthread_mutex_unlock(&l->mu);
  return ready ? l : NULL;
}

void idem__pg_listener_free(idem__pg_listener *l) {
  char byte = 1;
  if (!l)
    return;
  if (write(l->wake[1], &byte, 1) != 1) {
    /* An empty pipe of ours takes one byte. */
  }
  pthread_join(l->thread, NULL);
  if (l->c)
    idem__pg_conn_close(l->c);
  close(l->wake[0]);
  close(l->wake[1]);
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->cv);
  free(l);
}

static const char watch_sql[] =
    "UPDATE {S}.idem_records SET watched = true WHERE tenant = $1::text AND "
    "operation = $2::text AND key = $3::text AND state = 1 AND NOT watched";

int idem__pg_watch(void *state, const idem_id *id) {
  pg_store *s = state;
  char err[ERR_SIZE], *sql;
  conn *c = NULL;
  PGresult *res;
  int rc;
  if (s->schema_min < 4)
    return IDEM_ESCHEMA; /* no triggers: the waiter polls */
  if (!listener_get(s))
    return IDEM_EUNAVAILABLE;
  if (!(sql = idem__pg_build_sql(watch_sql, s->schema)))
    return IDEM_ENOMEM;
  if ((rc = idem__pg_pool_get(s, &c, err)) != IDEM_OK) {
    free(sql);
    return rc;
  }
  {
    const char *v[3] = {id->tenant ? id->tenant : "", id->operation,
                        id->key};
    res = idem__pg_exec_params(c, sql, 3, v, NULL, NULL, 0);
    rc = PQresultStatus(res) == PGRES_COMMAND_OK ? IDEM_OK : IDEM_ESTORE;
    PQclear(res);
  }
  idem__pg_pool_put(s, c);
  free(sql);
  return rc;
}
