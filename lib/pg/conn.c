/*
 * conn.c -- the PostgreSQL backend's connections: the pool and what it
 * hands out, (re)connecting and what a failed connection means to a
 * caller, each session's settings, errors, prepared statements and
 * pipelines, parameters and binary results.
 */

#include "pg.h"

#include "lease.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Leases and retention are capped so that now + period stays a bigint
 * (about 73 million years; "forever" for any caller). */
#define MAX_PERIOD_MS (INT64_MAX / 4)

/* ---- errors -------------------------------------------------------------- */

/* Whether the server is a hot standby (reported by PostgreSQL 14 and
 * later at connection start and whenever it changes). */
static int standby(const conn *c) {
  const char *v = PQparameterStatus(c->pg, "in_hot_standby");
  return v && !strcmp(v, "on");
}

/* Why c's connection is gone, as one line: given up at its deadline, or
 * libpq's text. */
static void lost_text(const conn *c, char *text, size_t size) {
  if (c->timed_out)
    snprintf(text, size,
             "no answer within %lld ms; the connection was given up (the "
             "server or the network stopped answering)",
             (long long)c->deadline_ms);
  else
    idem__pg_oneline(text, size, PQerrorMessage(c->pg));
}

/*
 * Classifies a failed call on c: res is its result (NULL when libpq could
 * not even produce one). A lost connection, or a server that accepts no
 * writes, is "unavailable"; lock timeouts, deadlocks and serialization
 * failures are "busy"; the rest is a store error. Writes "postgresql: WHAT:
 * TEXT" into err and returns the code.
 */
int idem__pg_fail(conn *c, const PGresult *res, const char *what, char *err) {
  const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  const char *primary =
      res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  char text[ERR_SIZE];
  int rc = IDEM_ESTORE;

  snprintf(c->sqlstate, sizeof c->sqlstate, "%s", state ? state : "");
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    lost_text(c, text, sizeof text);
    return idem__pg_failf(err, IDEM_EUNAVAILABLE, "postgresql: %s: %s", what,
                          text[0] ? text : "the connection was lost");
  }
  if (!state) {
    idem__pg_oneline(text, sizeof text,
                     res && *PQresultErrorMessage(res)
                         ? PQresultErrorMessage(res)
                         : PQerrorMessage(c->pg));
    return idem__pg_failf(err, IDEM_ESTORE, "postgresql: %s: %s", what,
                          text[0] ? text : "no result");
  }
  if (!strcmp(state, "40001") || !strcmp(state, "40P01") ||
      !strcmp(state, "55P03"))
    rc = IDEM_EBUSY;
  else if (!strncmp(state, "08", 2) || !strcmp(state, "57P01") ||
           !strcmp(state, "57P02") || !strcmp(state, "57P03") ||
           !strcmp(state, "53300"))
    rc = IDEM_EUNAVAILABLE;
  else if (c->foreign && !strcmp(state, "25006"))
    /* The caller's own transaction (idem_execute_in()) is read-only. */
    return idem__pg_failf(err, IDEM_EINVAL,
                          "postgresql: %s: the caller's transaction is "
                          "read-only (SQLSTATE 25006)",
                          what);
  else if (!strcmp(state, "25006") || standby(c)) {
    /* A write refused as read-only, or any failure on a server in
     * recovery (which also refuses idem's advisory locks). */
    c->read_only = 1;
    idem__pg_oneline(text, sizeof text,
                     primary ? primary : PQresultErrorMessage(res));
    return idem__pg_failf(
        err, IDEM_EUNAVAILABLE,
        "postgresql: %s: %s (SQLSTATE %s): the server accepts no "
        "writes (a standby, or default_transaction_read_only); "
        "point idem at the primary, e.g. with several hosts and "
        "target_session_attrs=read-write",
        what, text, state);
  } else if (!strcmp(state, "26000"))
    /* A prepared statement is gone: the caller's SQL on this connection
     * ran DEALLOCATE or DISCARD. Prepare everything again next time. */
    memset(c->prepared, 0, sizeof c->prepared);
  idem__pg_oneline(text, sizeof text,
                   primary ? primary : PQresultErrorMessage(res));
  return idem__pg_failf(err, rc, "postgresql: %s: %s (SQLSTATE %s)", what, text,
                        state);
}

/* ---- connection failures ------------------------------------------------- */

/*
 * Why a connection could not be made, for a caller that must decide
 * whether to try again later. A server that is down, starting, shutting
 * down, out of connection slots or read-only (a standby, before a failover
 * completes) may take the connection later: IDEM_EUNAVAILABLE. A URL or
 * conninfo that libpq cannot use (an invalid option or value, a port that
 * is not a number, a host name that cannot be one) is IDEM_EURL; a server
 * that refuses this user or database (authentication, a role or database
 * that does not exist, no LOGIN or CONNECT right, a setting it does not
 * know) is IDEM_ESTORE: retrying cannot help, and the message says what to
 * fix.
 *
 * libpq reports a failed connection only as text, without a SQLSTATE, so
 * its text is read: libpq 15's own messages, and the server's (after
 * "FATAL:  "), in English. A server whose lc_messages translates them has
 * every refusal read as IDEM_ESTORE, since none is then known to pass.
 */
typedef struct refusal {
  /* Both must appear (text2 may be NULL); text with a leading '^' at the
   * start of the line. */
  const char *text, *text2;
  int rc;
  const char *fix;
} refusal;

#define FIX_URL "correct the store URL"
#define FIX_ENCODE                                                             \
  "correct the store URL; a '/', '@' or ':' in a password must be "            \
  "percent-encoded (%2F, %40, %3A)"

/* The server's, after "FATAL:" (or "ERROR:"): the ones that pass. */
static const char *const server_passing[] = {
    "the database system is", /* starting up, shutting down, in recovery */
    "too many clients",
    "too many connections",
    "remaining connection slots are reserved",
    "terminating connection",
    "out of memory",
    "could not fork",
    NULL};

/* The server's refusals that retrying cannot change. */
static const refusal server_refusals[] = {
    {"password authentication failed", NULL, IDEM_ESTORE,
     "correct the password (in the URL, PGPASSWORD or ~/.pgpass)"},
    {"no pg_hba.conf entry", NULL, IDEM_ESTORE,
     "the server's pg_hba.conf has no line that lets this user connect to "
     "this database from this host"},
    {"pg_hba.conf rejects", NULL, IDEM_ESTORE,
     "the server's pg_hba.conf rejects this user here"},
    {"authentication failed", NULL, IDEM_ESTORE,
     "check the user's credentials and the server's pg_hba.conf"},
    {"role \"", "does not exist", IDEM_ESTORE,
     "create the role, or correct the user in the URL"},
    {"database \"", "does not exist", IDEM_ESTORE,
     "create the database, or correct its name in the URL"},
    {"not permitted to log in", NULL, IDEM_ESTORE, "the role needs LOGIN"},
    {"permission denied for database", NULL, IDEM_ESTORE,
     "the role needs the CONNECT privilege on the database"},
    {NULL, NULL, IDEM_ESTORE,
     "the server refused the connection as configured; correct the URL "
     "or the server's settings"}};

/* libpq's own, before or while connecting. */
static const refusal client_refusals[] = {
    /* Options that cannot be used as given. */
    {"^invalid integer value", "\"port\"", IDEM_EURL, FIX_ENCODE},
    {"^invalid ", NULL, IDEM_EURL, FIX_URL},
    {"^could not match ", NULL, IDEM_EURL, FIX_URL},
    {"^could not parse network address", NULL, IDEM_EURL, FIX_URL},
    {"^missing \"=\"", NULL, IDEM_EURL, FIX_URL},
    {"^unterminated quoted string", NULL, IDEM_EURL, FIX_URL},
    {"service", "not found", IDEM_EURL, FIX_URL},
    {"service file", NULL, IDEM_EURL, FIX_URL},
    {"socket path", "too long", IDEM_EURL, FIX_URL},
    {"when SSL support is not compiled in", NULL, IDEM_EURL, FIX_URL},
    {"when GSSAPI support is not compiled in", NULL, IDEM_EURL, FIX_URL},
    /* Failures on the way, which pass. */
    {"SSL SYSCALL", NULL, IDEM_EUNAVAILABLE, NULL},
    {"closed unexpectedly", NULL, IDEM_EUNAVAILABLE, NULL},
    {"EOF detected", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not receive data", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not send", NULL, IDEM_EUNAVAILABLE, NULL},
    {"write to server failed", NULL, IDEM_EUNAVAILABLE, NULL},
    {"timeout expired", NULL, IDEM_EUNAVAILABLE, NULL},
    {"could not translate host name", NULL, IDEM_EUNAVAILABLE, NULL},
    /* Authentication and encryption as the URL asks for them. */
    {"no password supplied", NULL, IDEM_ESTORE,
     "the server asks for a password: give it in the URL, PGPASSWORD or "
     "~/.pgpass"},
    {"channel binding", NULL, IDEM_ESTORE,
     "the server's authentication does not allow the channel_binding that "
     "the URL asks for"},
    {"certificate", NULL, IDEM_ESTORE,
     "check the certificates named in the URL (sslrootcert, sslcert) and "
     "the server's"},
    {"private key", NULL, IDEM_ESTORE,
     "check the private key named in the URL (sslkey)"},
    {"but SSL was required", NULL, IDEM_ESTORE,
     "the server does not offer SSL: change sslmode or the server"},
    {"GSSAPI", NULL, IDEM_ESTORE,
     "the server cannot do the GSSAPI encryption the URL asks for: change "
     "gssencmode or the server"},
    {"SCRAM", NULL, IDEM_ESTORE,
     "check the user's credentials and the server's pg_hba.conf"},
    {"authentication method", NULL, IDEM_ESTORE,
     "the server asks for an authentication method this libpq does not "
     "support; change pg_hba.conf"},
    {"requirepeer", NULL, IDEM_ESTORE, "correct requirepeer in the URL"},
    {"out of memory", NULL, IDEM_ENOMEM, NULL},
    {NULL, NULL, IDEM_EUNAVAILABLE, NULL}};

static const refusal *find_refusal(const refusal *table, const char *text) {
  for (; table->text; table++) {
    const char *t = table->text;
    if ((t[0] == '^' ? !strncmp(text, t + 1, strlen(t + 1))
                     : strstr(text, t) != NULL) &&
        (!table->text2 || strstr(text, table->text2)))
      return table;
  }
  return table;
}

/* A host name that no resolver would look up: libpq took a piece of the
 * URL (a password with an unencoded '@', say) for one. */
static int malformed_host(const char *line) {
  const char *h = strstr(line, "could not translate host name \"");
  if (!h)
    return 0;
  for (h += 31; *h && *h != '"'; h++)
    if (!idem__pg_is_word_char(*h) && *h != '.' && *h != '-' && *h != '_')
      return 1;
  return 0;
}

/* Whether a line is the server's: libpq writes its severity ("FATAL",
 * or its translation) and two spaces before the server's text, and no
 * message of its own has that shape. */
static int server_said(const char *line) {
  const char *colon = strchr(line, ':');
  return colon && colon > line && !strncmp(colon, ":  ", 3) &&
         !memchr(line, '"', (size_t)(colon - line));
}

/*
 * Classifies libpq's message for a failed connection (msg, as
 * PQerrorMessage() gives it: one line per host tried, each perhaps
 * followed by indented or DETAIL/HINT lines). A line that cannot pass
 * decides over lines that can: with several hosts, one that refuses this
 * user will refuse it again. *fix is what to do, or NULL.
 */
static int connect_failure(const char *msg, const char **fix) {
  int rc = IDEM_EUNAVAILABLE;
  *fix = NULL;
  for (const char *line = msg; line && *line;) {
    const char *end = strchr(line, '\n'), *d = line, *p;
    char text[ERR_SIZE];
    const refusal *r;
    size_t n = end ? (size_t)(end - line) : strlen(line);
    if (n >= sizeof text)
      n = sizeof text - 1;
    memcpy(text, line, n);
    text[n] = '\0';
    line = end ? end + 1 : NULL;
    if (isspace((unsigned char)text[0]) || !strncmp(text, "DETAIL:", 7) ||
        !strncmp(text, "HINT:", 5) || !text[0])
      continue;
    /* "connection to server on socket "..." failed: " and the like. */
    if (!strncmp(text, "connection to server ", 21) &&
        (p = strstr(text, " failed: ")))
      d = p + 9;
    else
      d = text;
    if (server_said(d)) {
      int passing = 0;
      for (int i = 0; server_passing[i]; i++)
        passing |= strstr(d, server_passing[i]) != NULL;
      if (passing)
        continue;
      r = find_refusal(server_refusals, d);
    } else if (malformed_host(d)) {
      *fix = FIX_ENCODE;
      return IDEM_EURL;
    } else {
      r = find_refusal(client_refusals, d);
    }
    if (r->rc == IDEM_EURL || r->rc == IDEM_ESTORE) {
      *fix = r->fix;
      return r->rc;
    }
    if (r->rc == IDEM_ENOMEM)
      rc = IDEM_ENOMEM;
  }
  return rc;
}

/* The error of a connection that could not be made (or made again, when
 * again is set), classified by connect_failure(). */
static int connect_fail(PGconn *pg, int again, char *err) {
  char text[ERR_SIZE];
  const char *fix;
  const char *msg = pg ? PQerrorMessage(pg) : "out of memory";
  int rc = connect_failure(msg, &fix);
  idem__pg_oneline(text, sizeof text, msg);
  if (fix)
    return idem__pg_failf(
        err, rc, "postgresql: cannot %s: %s; %s (retrying will not help)",
        again ? "reconnect" : "connect", text, fix);
  return idem__pg_failf(err, rc, "postgresql: cannot %s: %s",
                        again ? "reconnect" : "connect", text);
}

/* ---- parameters ---------------------------------------------------------- */

void idem__pg_p_text(params *p, const char *t) {
  p->v[p->n] = t;
  p->len[p->n] = 0;
  p->fmt[p->n] = 0;
  p->n++;
}

void idem__pg_p_i64(params *p, int64_t x) {
  snprintf(p->num[p->n], sizeof p->num[0], "%lld", (long long)x);
  idem__pg_p_text(p, p->num[p->n]);
}

/* NULL data is SQL NULL; empty data is an empty bytea. */
void idem__pg_p_bytes(params *p, const void *b, size_t n) {
  p->v[p->n] = b ? (n ? (const char *)b : "") : NULL;
  p->len[p->n] = (int)n;
  p->fmt[p->n] = 1;
  p->n++;
}

void idem__pg_p_id(params *p, const idem_id *id) {
  idem__pg_p_text(p, id->tenant ? id->tenant : "");
  idem__pg_p_text(p, id->operation);
  idem__pg_p_text(p, id->key);
}

int64_t idem__pg_period(int64_t ms) {
  return ms > MAX_PERIOD_MS ? MAX_PERIOD_MS : ms;
}

/* ---- binary results ------------------------------------------------------ */

/* An integer column of any width (int2, int4, int8); NULL reads as 0. */
int64_t idem__pg_col_int(const PGresult *r, int row, int col) {
  const unsigned char *p;
  uint64_t v = 0;
  int len;
  if (PQgetisnull(r, row, col))
    return 0;
  p = (const unsigned char *)PQgetvalue(r, row, col);
  len = PQgetlength(r, row, col);
  for (int i = 0; i < len && i < 8; i++)
    v = v << 8 | p[i];
  switch (len) {
  case 2:
    return (int16_t)(uint16_t)v;
  case 4:
    return (int32_t)(uint32_t)v;
  default:
    return (int64_t)v;
  }
}

/* Points at a text or bytea column's bytes; NULL for SQL NULL. */
const void *idem__pg_col_ptr(const PGresult *r, int row, int col, size_t *len) {
  if (PQgetisnull(r, row, col)) {
    *len = 0;
    return NULL;
  }
  *len = (size_t)PQgetlength(r, row, col);
  return PQgetvalue(r, row, col);
}

/* A copy with one spare NUL, so that text can be printed as is. */
void *idem__pg_col_dup(const PGresult *r, int row, int col, size_t *len) {
  size_t n;
  const void *b = idem__pg_col_ptr(r, row, col, &n);
  char *p;
  *len = n;
  if (!b)
    return NULL;
  p = malloc(n + 1);
  if (p) {
    if (n)
      memcpy(p, b, n);
    p[n] = '\0';
  }
  return p;
}

char *idem__pg_col_text(const PGresult *r, int row, int col) {
  size_t n;
  char *t = idem__pg_col_dup(r, row, col, &n);
  return t ? t : idem__strdup("");
}

/* ---- connections --------------------------------------------------------- */

static void ignore_notice(void *arg, const char *message) {
  /* CREATE ... IF NOT EXISTS and friends send notices; a library must not
   * print them on the application's stderr. */
  (void)arg;
  (void)message;
}

/*
 * Per-session settings, applied after every (re)connect, in one round trip.
 *
 * busy_timeout_ms bounds lock waits, as SQLite's busy timeout does; a
 * lock_timeout that the URL, role or database already set is kept. So is
 * a statement_timeout; without one, no statement runs past
 * IDEM__PG_STATEMENT_TIMEOUT (the default lease and then some), so that a
 * stuck server never holds a call for good. Renewals have a tighter bound
 * of their own: the lease (lease.c).
 *
 * synchronous_commit is at least "on": with "off" the server acknowledges
 * a COMMIT before its WAL is flushed, so a completion reported stored could
 * be lost in a server crash, and a retry would then act a second time;
 * "local" and "remote_write" acknowledge before a synchronous standby has
 * the WAL on disk. "on" and "remote_apply" are kept. Any role may set it
 * for its own session.
 */
static int session_setup(pg_store *s, conn *c, char *err) {
  char ms[24];
  const char *v[1] = {ms};
  PGresult *res;
  int rc = IDEM_OK;
  int64_t asked = idem__mono_ms();
  /* Non-blocking, so that no send waits on a server that stopped reading
   * (idem__pg_await() sends); the setup itself has the bound of a
   * connection's start. */
  PQsetnonblocking(c->pg, 1);
  c->timed_out = 0;
  c->deadline_ms = IDEM__PG_SETUP_DEADLINE_MS;
  snprintf(ms, sizeof ms, "%d", s->o.busy_timeout_ms);
  res = idem__pg_exec_params(
      c,
      "SELECT CASE WHEN current_setting('lock_timeout') = '0' THEN "
      "set_config('lock_timeout', $1, false) END, CASE WHEN "
      "current_setting('statement_timeout') = '0' THEN "
      "set_config('statement_timeout', '" IDEM__PG_STATEMENT_TIMEOUT
      "', false) END, CASE WHEN "
      "current_setting('synchronous_commit') IN ('off', 'local', "
      "'remote_write') THEN set_config('synchronous_commit', 'on', false) "
      "END, (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint, "
      "CASE WHEN current_setting('statement_timeout') = '0' THEN 0 ELSE "
      "(SELECT setting::bigint FROM pg_settings WHERE name = "
      "'statement_timeout') END",
      1, v, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rc = idem__pg_fail(c, res, "session setup", err);
  } else {
    int64_t timeout = strtoll(PQgetvalue(res, 0, 4), NULL, 10);
    idem__pg_clock_reading(s, asked,
                           strtoll(PQgetvalue(res, 0, 3), NULL, 10));
    if (timeout <= 0)
      timeout = IDEM__PG_STATEMENT_TIMEOUT_MS;
    c->deadline_ms = timeout + (timeout / 4 > IDEM__PG_GRACE_MS
                                    ? timeout / 4
                                    : IDEM__PG_GRACE_MS);
  }
  PQclear(res);
  memset(c->prepared, 0, sizeof c->prepared);
  return rc;
}

void idem__pg_conn_close(conn *c) {
  if (!c)
    return;
  PQfinish(c->pg);
  free(c);
}

int idem__pg_conn_open(pg_store *s, conn **out, char *err) {
  /* Listed before dbname, so that the URL or conninfo may override them. */
  /* TCP keepalives and a user timeout: a server or network that stops
   * answering fails the call in about 20 s instead of hanging it for the
   * kernel's default (hours); a holder's lease is lost at its deadline in
   * any case (lease.c). */
  const char *const kw[] = {"connect_timeout",
                            "fallback_application_name",
                            "keepalives",
                            "keepalives_idle",
                            "keepalives_interval",
                            "keepalives_count",
                            "tcp_user_timeout",
                            "dbname",
                            NULL};
  const char *const val[] = {"10", "idem", "1",          "10", "3",
                             "3",  "20000", s->conninfo, NULL};
  conn *c = calloc(1, sizeof *c);
  int rc;
  *out = NULL;
  if (!c)
    return idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  c->pg = PQconnectdbParams(kw, val, 1);
  if (!c->pg) {
    free(c);
    return idem__pg_failf(err, IDEM_ENOMEM, "postgresql: out of memory");
  }
  if (PQstatus(c->pg) != CONNECTION_OK) {
    rc = connect_fail(c->pg, 0, err);
    idem__pg_conn_close(c);
    return rc;
  }
  PQsetNoticeProcessor(c->pg, ignore_notice, NULL);
  rc = session_setup(s, c, err);
  if (rc != IDEM_OK) {
    idem__pg_conn_close(c);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

/* Re-establishes a lost connection in place. */
static int conn_revive(pg_store *s, conn *c, char *err) {
  PQreset(c->pg);
  if (PQstatus(c->pg) != CONNECTION_OK)
    return connect_fail(c->pg, 1, err);
  PQsetNoticeProcessor(c->pg, ignore_notice, NULL);
  return session_setup(s, c, err);
}

/*
 * Checks an idle connection before use. A server that restarted or ended
 * the session closed the socket, but libpq notices only when it reads: so
 * read whatever is pending now, and reconnect if the connection is gone or
 * its server was found read-only.
 */
static int conn_check(pg_store *s, conn *c, char *err) {
  if (c->read_only || c->unusable) {
    c->read_only = c->unusable = 0;
    return conn_revive(s, c, err);
  }
  if (PQstatus(c->pg) == CONNECTION_OK && PQsocket(c->pg) >= 0) {
    struct pollfd pfd;
    PGnotify *note;
    pfd.fd = PQsocket(c->pg);
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, 0) > 0) {
      PQconsumeInput(c->pg);
      while ((note = PQnotifies(c->pg)))
        PQfreemem(note);
    }
  }
  if (PQstatus(c->pg) != CONNECTION_BAD)
    return IDEM_OK;
  return conn_revive(s, c, err);
}

static void pool_drop(pg_store *s, conn *c) {
  idem__pg_conn_close(c);
  pthread_mutex_lock(&s->mu);
  s->nconn--;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int idem__pg_pool_get(pg_store *s, conn **out, char *err) {
  conn *c = NULL;
  int rc;
  *out = NULL;
  pthread_mutex_lock(&s->mu);
  while (!s->idle && s->nconn >= s->o.max_connections)
    pthread_cond_wait(&s->cv, &s->mu);
  if (s->idle) {
    c = s->idle;
    s->idle = c->next;
    pthread_mutex_unlock(&s->mu);
    rc = conn_check(s, c, err);
    if (rc != IDEM_OK) {
      pool_drop(s, c);
      return rc;
    }
    *out = c;
    return IDEM_OK;
  }
  s->nconn++;
  pthread_mutex_unlock(&s->mu);
  rc = idem__pg_conn_open(s, &c, err);
  if (rc != IDEM_OK) {
    pthread_mutex_lock(&s->mu);
    s->nconn--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  *out = c;
  return IDEM_OK;
}

/* Ends whatever transaction is open. A query left running (only the
 * caller's action could leave one) is drained first. */
void idem__pg_rollback(conn *c) {
  PGTransactionStatusType ts = PQtransactionStatus(c->pg);
  PGresult *res;
  if (c->foreign)
    return; /* the caller's transaction is the caller's to end */
  if (ts == PQTRANS_ACTIVE) {
    int64_t until = idem__pg_deadline(c);
    while ((res = idem__pg_result(c, until)))
      PQclear(res);
    ts = PQtransactionStatus(c->pg);
  }
  if (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR)
    PQclear(idem__pg_exec(c, "ROLLBACK"));
}

void idem__pg_pool_put(pg_store *s, conn *c) {
  if (!c)
    return;
  /* Never hand out a connection inside a transaction. A lost one goes back
   * too: the next idem__pg_pool_get() reconnects it. */
  idem__pg_rollback(c);
  pthread_mutex_lock(&s->mu);
  c->next = s->idle;
  s->idle = c;
  pthread_cond_signal(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ---- statements ---------------------------------------------------------- */

static const params no_params;

int64_t idem__pg_deadline(const conn *c) {
  return idem__mono_ms() +
         (c->deadline_ms > 0 ? c->deadline_ms : IDEM__PG_SETUP_DEADLINE_MS);
}

/* The deadline passed: the connection is given up. Shutting its socket
 * down makes libpq read the end of it, as when the server goes: the
 * statement's result is an error, and every caller's path for a lost
 * connection (reconnect, "unknown" for a COMMIT) takes over. */
static void give_up(conn *c) {
  c->timed_out = 1;
  if (PQsocket(c->pg) >= 0) {
    shutdown(PQsocket(c->pg), SHUT_RDWR);
    PQconsumeInput(c->pg);
  }
}

void idem__pg_await(conn *c, int64_t until) {
  PGconn *pg = c->pg;
  for (;;) {
    int flushing = PQflush(pg);
    struct pollfd p;
    int64_t left;
    if (flushing < 0 || PQstatus(pg) == CONNECTION_BAD)
      return;
    if (!flushing && !PQisBusy(pg))
      return;
    if ((left = until - idem__mono_ms()) <= 0) {
      give_up(c);
      return;
    }
    p.fd = PQsocket(pg);
    p.events = (short)(POLLIN | (flushing ? POLLOUT : 0));
    p.revents = 0;
    if (p.fd < 0)
      return;
    if (poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left) < 0 &&
        errno != EINTR) {
      give_up(c);
      return;
    }
    if ((p.revents & (POLLIN | POLLERR | POLLHUP)) && !PQconsumeInput(pg))
      return; /* lost: PQgetResult() says so at once */
  }
}

PGresult *idem__pg_result(conn *c, int64_t until) {
  idem__pg_await(c, until);
  return PQgetResult(c->pg);
}

PGresult *idem__pg_results(conn *c, int64_t until) {
  PGresult *keep = NULL, *r;
  while ((r = idem__pg_result(c, until))) {
    ExecStatusType st = PQresultStatus(keep);
    if (keep && st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK &&
        st != PGRES_EMPTY_QUERY) {
      PQclear(r);
      continue;
    }
    PQclear(keep);
    keep = r;
    if (PQstatus(c->pg) == CONNECTION_BAD)
      break;
  }
  return keep;
}

PGresult *idem__pg_exec(conn *c, const char *sql) {
  if (c->foreign) /* the caller's: waited for as libpq does, never cut */
    return PQexec(c->pg, sql);
  if (!PQsendQuery(c->pg, sql))
    return NULL;
  return idem__pg_results(c, idem__pg_deadline(c));
}

PGresult *idem__pg_exec_params(conn *c, const char *sql, int n,
                               const char *const *values, const int *lengths,
                               const int *formats, int binary) {
  int64_t until = idem__pg_deadline(c);
  if (c->foreign)
    return PQexecParams(c->pg, sql, n, NULL, values, lengths, formats, binary);
  if (!PQsendQueryParams(c->pg, sql, n, NULL, values, lengths, formats,
                         binary))
    return NULL;
  return idem__pg_results(c, until);
}

/*
 * Runs prepared statement which (preparing it first in this session) with
 * binary results. On success *out holds a TUPLES_OK or COMMAND_OK result.
 */
static int prepare(pg_store *s, conn *c, int which, char name[32], char *err) {
  PGresult *res;
  int rc;
  snprintf(name, 32, "idem__%d", which);
  if (c->prepared[which])
    return IDEM_OK;
  res = PQsendPrepare(c->pg, name, s->sql[which], 0, NULL)
            ? idem__pg_results(c, idem__pg_deadline(c))
            : NULL;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    rc = idem__pg_fail(c, res, "prepare", err);
    PQclear(res);
    return rc;
  }
  PQclear(res);
  c->prepared[which] = 1;
  return IDEM_OK;
}

int idem__pg_run_stmt(pg_store *s, conn *c, int which, const params *p,
                      const char *what, PGresult **out, char *err) {
  char name[32];
  PGresult *res;
  ExecStatusType st;
  int rc;
  *out = NULL;
  if (c->foreign)
    res = idem__pg_exec_params(c, s->sql[which], p->n, p->v, p->len, p->fmt,
                               1);
  else if ((rc = prepare(s, c, which, name, err)) != IDEM_OK)
    return rc;
  else
    res = PQsendQueryPrepared(c->pg, name, p->n, p->v, p->len, p->fmt, 1)
              ? idem__pg_results(c, idem__pg_deadline(c))
              : NULL;
  st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    rc = idem__pg_fail(c, res, what, err);
    PQclear(res);
    return rc;
  }
  *out = res;
  return IDEM_OK;
}

/*
 * One round trip for up to MAX_STEPS statements, sent together in libpq's
 * pipeline mode. On success *out holds the result of step `keep` and
 * last_tag (may be NULL) the command tag of the last step, e.g. "COMMIT"
 * or "ROLLBACK". The first failure is reported (the statements after it
 * are not run). When the connection breaks on the way, nobody can tell
 * whether a COMMIT in it ran: the result is IDEM_EUNAVAILABLE.
 */
int idem__pg_run_steps(pg_store *s, conn *c, const step *st, int n, int keep,
                       const char *what, PGresult **out, char *last_tag,
                       char *err) {
  PGresult *res[MAX_STEPS] = {NULL}, *r;
  char name[MAX_STEPS][32];
  int rc = IDEM_OK, i;
  int64_t until;

  *out = NULL;
  c->failed_step = -1;
  if (last_tag)
    last_tag[0] = '\0';
  for (i = 0; i < n; i++)
    if ((rc = prepare(s, c, st[i].which, name[i], err)) != IDEM_OK)
      return rc;
  if (!PQenterPipelineMode(c->pg))
    return idem__pg_fail(c, NULL, what, err);
  for (i = 0; i < n; i++) {
    const params *p = st[i].p ? st[i].p : &no_params;
    if (!PQsendQueryPrepared(c->pg, name[i], p->n, p->v, p->len, p->fmt, 1))
      goto broken;
  }
  if (!PQpipelineSync(c->pg))
    goto broken;
  /* Each query's result is followed by a NULL; then the sync's result. */
  until = idem__pg_deadline(c);
  for (i = 0; i < n; i++) {
    if (!(res[i] = idem__pg_result(c, until)))
      goto broken;
    while ((r = idem__pg_result(c, until)) != NULL)
      PQclear(r);
  }
  r = idem__pg_result(c, until);
  if (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
    PQclear(r);
    goto broken;
  }
  PQclear(r);
  PQexitPipelineMode(c->pg);
  /* The first failure explains the rest (later ones are "aborted"). */
  for (i = 0; i < n; i++) {
    ExecStatusType es = PQresultStatus(res[i]);
    if (es != PGRES_TUPLES_OK && es != PGRES_COMMAND_OK) {
      c->failed_step = i;
      rc = idem__pg_fail(c, res[i],
                         st[i].which == ST_BEGIN    ? "begin"
                         : st[i].which == ST_COMMIT ? "commit"
                                                    : what,
                         err);
      break;
    }
  }
  if (rc == IDEM_OK && last_tag)
    snprintf(last_tag, 16, "%s", PQcmdStatus(res[n - 1]));
  if (rc == IDEM_OK) {
    *out = res[keep];
    res[keep] = NULL;
  }
  for (i = 0; i < n; i++)
    PQclear(res[i]);
  return rc;
broken:
  for (i = 0; i < n; i++)
    PQclear(res[i]);
  /* Read the pipeline to its end so that the connection leaves pipeline
   * mode. A NULL from PQgetResult() ends one statement's results, not the
   * pipeline, so the exit is tried after each; a few more reads than the
   * pipeline has results bound the loop. A connection that cannot leave it
   * (the server ended the session, and libpq has not yet read the end) is
   * replaced before its next use, as a broken one is. */
  until = idem__pg_deadline(c);
  for (i = 0; i < 2 * MAX_STEPS + 4 && PQstatus(c->pg) != CONNECTION_BAD &&
              !PQexitPipelineMode(c->pg);
       i++)
    if ((r = idem__pg_result(c, until)))
      PQclear(r);
  if (PQpipelineStatus(c->pg) != PQ_PIPELINE_OFF)
    c->unusable = 1;
  if (PQstatus(c->pg) == CONNECTION_BAD || c->unusable) {
    char text[ERR_SIZE];
    lost_text(c, text, sizeof text);
    return idem__pg_failf(
        err, IDEM_EUNAVAILABLE, "postgresql: %s: the connection was lost%s: %s",
        what,
        st[n - 1].which == ST_COMMIT ? "; whether it committed is unknown" : "",
        text);
  }
  return idem__pg_fail(c, NULL, what, err);
}

/* After a failure *rc on c: whether the connection was found dead and is
 * re-established, so that a statement safe to send twice may be sent
 * again. When it cannot be, *rc and err say why. */
int idem__pg_revived(pg_store *s, conn *c, int *rc, char *err) {
  int again;
  if (c->foreign || *rc != IDEM_EUNAVAILABLE ||
      PQstatus(c->pg) != CONNECTION_BAD ||
      PQtransactionStatus(c->pg) != PQTRANS_UNKNOWN)
    return 0;
  if ((again = conn_revive(s, c, err)) == IDEM_OK)
    return 1;
  /* The server refuses the new session as configured (a role that lost
   * LOGIN, say): that is the caller's answer now, not "retry later". */
  *rc = again;
  return 0;
}

/* idem__pg_run_stmt() for statements that are safe to send twice (reads): sent
 * once more on a connection found dead and re-established. */
int idem__pg_run_stmt_retry(pg_store *s, conn *c, int which, const params *p,
                            const char *what, PGresult **out, char *err) {
  int rc = idem__pg_run_stmt(s, c, which, p, what, out, err);
  if (idem__pg_revived(s, c, &rc, err))
    rc = idem__pg_run_stmt(s, c, which, p, what, out, err);
  return rc;
}

/* Transaction control: no data, so a simple query. */
int idem__pg_run_simple(conn *c, const char *sql, const char *what, char *err) {
  PGresult *res = idem__pg_exec(c, sql);
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_COMMAND_OK)
    rc = idem__pg_fail(c, res, what, err);
  PQclear(res);
  return rc;
}

/* READ COMMITTED whatever the session's default: each statement must see
 * rows committed by concurrent claimers, and no serialization failure may
 * reach the caller. */
int idem__pg_begin(conn *c, char *err) {
  return idem__pg_run_simple(c, "BEGIN ISOLATION LEVEL READ COMMITTED", "begin",
                             err);
}

/*
 * Commits. When the connection breaks during COMMIT nobody can tell whether
 * the transaction committed, and the caller must not believe it did.
 */
int idem__pg_commit(conn *c, char *err) {
  PGresult *res = idem__pg_exec(c, "COMMIT");
  char text[ERR_SIZE];
  int rc = IDEM_OK;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    if (PQstatus(c->pg) == CONNECTION_BAD) {
      lost_text(c, text, sizeof text);
      rc = idem__pg_failf(err, IDEM_EUNAVAILABLE,
                          "postgresql: the connection was lost during commit; "
                          "whether it committed is unknown: %s",
                          text);
    } else {
      rc = idem__pg_fail(c, res, "commit failed, nothing was stored", err);
    }
  } else if (strcmp(PQcmdStatus(res), "COMMIT") != 0) {
    /* COMMIT of a failed transaction answers ROLLBACK. */
    rc = idem__pg_failf(err, IDEM_ESTORE,
                        "postgresql: commit failed, nothing was stored: the "
                        "transaction was rolled back");
  }
  PQclear(res);
  return rc;
}
