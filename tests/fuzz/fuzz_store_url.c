/*
 * fuzz_store_url.c -- the store URL parser: which backend and target a URL
 * names (pick_backend() in lib/engine.c, for sqlite: URLs and bare paths as
 * well as PostgreSQL ones), and for PostgreSQL the split into libpq's
 * conninfo and idem_schema, with the passwords that no message may show
 * (lib/pg/url.c). lib/engine.c is included, as h2o's drivers do, to reach
 * its static function; the library supplies the rest.
 *
 * Input: a URL (bytes up to the first NUL). Properties checked:
 *  - pick_backend() either fails with IDEM_EURL or IDEM_ENOMEM and sets
 *    nothing, or names a backend and a non-empty target that is the URL's
 *    own tail (SQLite, pg:) or the URL with its scheme in lower case;
 *  - a target that looks like a conninfo or holds "://" is never a file;
 *  - the PostgreSQL target parses or fails with IDEM_EURL; when it parses,
 *    the conninfo fits the room made for it and the schema is a valid name,
 *    and every password libpq reads from the conninfo is shown as "***"
 *    by idem__pg_scrub() in a message that quotes it.
 */
#include "../../lib/engine.c"

#include "pg/pg.h"

#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_store_url: property violated: %s (line %d)\n",     \
              #cond, __LINE__);                                                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static void free_pg(pg_store *s) {
  free(s->conninfo);
  for (int i = 0; i < s->nsecret; i++)
    free(s->secret[i]);
  free(s->secret);
}

static void check_scrub(const pg_store *s, const char *pw) {
  char msg[ERR_SIZE];
  size_t n = strlen(pw);
  /* Only the password and what libpq puts around it, so that the check
   * cannot find the password inside a word of the message itself. */
  if (n == 0 || 2 * n + 8 > sizeof msg || strpbrk(pw, "*\""))
    return;
  snprintf(msg, sizeof msg, "\"%s\" %s", pw, pw);
  idem__pg_scrub(s, msg, sizeof msg);
  if (strstr(msg, pw)) {
    fprintf(stderr, "fuzz_store_url: password [%s] shown: %s\n", pw, msg);
    abort();
  }
}

static void check_pg(const char *target) {
  pg_store s;
  char err[ERR_SIZE] = "";
  memset(&s, 0, sizeof s);
  int rc = idem__pg_parse_target(&s, target, err);
  if (rc != IDEM_OK) {
    CHECK(rc == IDEM_EURL || rc == IDEM_ENOMEM);
    CHECK(err[0] != '\0');
    free_pg(&s);
    return;
  }
  /* At most one separator more per token: a quoted value directly
   * followed by the next keyword gains a space. */
  CHECK(s.conninfo && strlen(s.conninfo) <= 2 * strlen(target) + 1);
  CHECK(s.schema[0] && strlen(s.schema) <= SCHEMA_MAX);
  for (const char *c = s.schema; *c; c++)
    CHECK((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_');
  char *msg = NULL;
  PQconninfoOption *opts = PQconninfoParse(s.conninfo, &msg);
  PQfreemem(msg);
  if (opts) {
    for (PQconninfoOption *o = opts; o->keyword; o++)
      if (o->val && (!strcmp(o->keyword, "password") ||
                     !strcmp(o->keyword, "sslpassword")))
        check_scrub(&s, o->val);
    PQconninfoFree(opts);
  }
  free_pg(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *url = malloc(size + 1);
  const idem__store_methods *m = (const idem__store_methods *)1;
  const char *target = (const char *)1;
  char *owned = (char *)1;
  if (!url)
    return 0;
  memcpy(url, data, size);
  url[size] = '\0';
  size_t len = strlen(url);
  int rc = pick_backend(url, &m, &target, &owned);
  if (rc != IDEM_OK) {
    CHECK(rc == IDEM_EURL || rc == IDEM_ENOMEM);
    CHECK(idem_errmsg()[0] != '\0');
    CHECK(m == NULL || rc == IDEM_EURL);
    free(owned);
    free(url);
    return 0;
  }
  CHECK(m == &idem__sqlite_methods || m == &idem__pg_methods);
  CHECK(target && target[0] != '\0');
  if (owned) {
    CHECK(target == owned && strlen(owned) == len);
    CHECK(strncasecmp(owned, url, len) == 0);
  } else {
    CHECK(target >= url && target <= url + len);
  }
  if (m == &idem__sqlite_methods) {
    if (target == url) {
      CHECK(!looks_like_conninfo(url));
      CHECK(strstr(url, "://") == NULL);
    }
  } else {
    check_pg(target);
  }
  free(owned);
  free(url);
  return 0;
}
