/*
 * console.h -- the operator console: a page and a JSON API over a store's
 * records, served by `idem console` and by `idem serve`'s admin listener.
 */
#ifndef IDEM_CONSOLE_H
#define IDEM_CONSOLE_H

#include "idem.h"

#include <microhttpd.h>

typedef struct console console;

typedef struct console_config {
  idem_store *store;
  /* The token that logs in and that the API takes as "Authorization:
   * Bearer"; NULL: no login (the listener must be the loopback's). */
  const char *token;
  /* Where the audit log is appended; NULL: standard error. */
  const char *audit_path;
  const char *cmd; /* the command, for messages: "console" or "serve" */
  /* The calls this process has answered, by outcome, as a JSON object
   * (malloc'd text); NULL when the process answers none (idem console). */
  char *(*calls)(void);
} console_config;

/* A console over cfg->store, which must outlive it; NULL with why said. */
console *console_new(const console_config *cfg);
void console_free(console *cn);

/* Whether url is one of the console's: "/", "/login", "/logout", its
 * scripts and styles, and everything under "/api/". */
int console_owns(const char *url);

/* libmicrohttpd's access handler for a console URL; *con_cls is the
 * console's from the first call to console_completed(). */
enum MHD_Result console_handle(console *cn, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *upload, size_t *upload_size,
                               void **con_cls);

/* Frees what console_handle() kept in *con_cls (NULL or its own). */
void console_completed(void **con_cls);

/* libmicrohttpd's callbacks for a listener that is the console's alone
 * (cls: the console). */
enum MHD_Result console_access(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **con_cls);
void console_notify_completed(void *cls, struct MHD_Connection *c,
                              void **con_cls,
                              enum MHD_RequestTerminationCode toe);

/* Whether *con_cls is the console's (set by console_handle()). */
int console_is_request(void *con_cls);

/* Wrong tokens counted per client (limiter.c): an IPv4 address or an
 * IPv6 /64, at most 20 a minute. */
typedef struct console_limiter console_limiter;
console_limiter *console_limiter_new(void);
void console_limiter_free(console_limiter *l);
/* Whether c's client has used up this minute's wrong tokens. */
int console_limited(console_limiter *l, struct MHD_Connection *c);
/* Counts a wrong token from c's client; how many it sent this minute. */
int console_failed(console_limiter *l, struct MHD_Connection *c);

/* The assets served from the binary (console_assets.c, generated from
 * src/console/assets/ at build time). */
typedef struct console_asset {
  const char *name; /* "index.html", "app.js", ... */
  const unsigned char *data;
  size_t len;
} console_asset;
extern const console_asset console_assets[];
extern const size_t console_nassets;

#endif
