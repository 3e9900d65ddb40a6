/*
 * floor_io.h -- what bench/mcp_floor.c and bench/gateway_floor.c share:
 * the floors' growable text, blocking HTTP/1.1 messages read whole, and
 * the store's claim and record as a floor makes them (a failure ends the
 * run: a floor that errs measures nothing).
 */
#ifndef IDEM_BENCH_FLOOR_IO_H
#define IDEM_BENCH_FLOOR_IO_H

#include <idem.h>
#include <stddef.h>

/* Prints "NAME: what: why" (NAME the program's) and exits 1. */
void floor_die(const char *what, const char *why);

typedef struct {
  char *buf; /* NUL-terminated past len */
  size_t len, cap;
} text;

/* Appends p[0..n); out of memory ends the run. */
void text_add(text *t, const char *p, size_t n);

/* Copies the value of header line p (len bytes) into out when its name is
 * name (lower case, with the colon); 1 if it was. */
int header_value(const char *p, size_t len, const char *name, char *out,
                 size_t cap);
/* The value of header name in the message head t->buf[0..head); 1 if
 * found. */
int find_header(const text *t, size_t head, const char *name, char *out,
                size_t cap);
/* Reads from fd into t until t begins with one whole HTTP/1.1 message
 * framed by Content-Length (none: no body): the head's length in *head,
 * the body's in *blen. 0 at the end of the connection (or a signal). */
int read_message(int fd, text *t, size_t *head, size_t *blen);
/* Takes the first n bytes off t. */
void text_drop(text *t, size_t n);
/* Writes all of p[0..n) to fd; 0 if the connection broke. */
int write_all(int fd, const char *p, size_t n);

/* A socket listening on a free port of 127.0.0.1, its port in *port; a
 * failure ends the run. */
int floor_listen(int *port);
/* The next connection on ls, without Nagle's delay; -1 when accept()
 * failed (a signal, a client gone). */
int floor_accept(int ls);

/* Claims key (operation op) with a fixed fingerprint: the call, which
 * must be new, or the run ends. */
idem_call *floor_claim(idem_store *store, const char *op, const char *key);
/* Records status and body as c's result, and frees c. */
void floor_record(idem_store *store, idem_call *c, int status,
                  const char *body, size_t len);

#endif
