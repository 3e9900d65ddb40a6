/*
 * text.c -- the PostgreSQL backend's messages: the text helpers that the
 * connections (conn.c) and the target (url.c) both use, so that neither
 * depends on the other for them.
 */

#include "pg.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>

int idem__pg_is_word_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9');
}

int idem__pg_failf(char *err, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, ERR_SIZE, fmt, ap);
  va_end(ap);
  return rc;
}

/* Copies libpq's text as one line: its messages end in newlines and
 * sometimes carry a second, indented line with a hint. */
void idem__pg_oneline(char *dst, size_t size, const char *src) {
  size_t n = 0;
  int space = 0;
  if (!src)
    src = "";
  for (; *src && n + 1 < size; src++) {
    if (isspace((unsigned char)*src)) {
      space = 1;
      continue;
    }
    if (space && n > 0 && n + 2 < size)
      dst[n++] = ' ';
    space = 0;
    dst[n++] = *src;
  }
  dst[n] = '\0';
}
