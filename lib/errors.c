/* errors.c -- result code names and messages, and the per-thread detail. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Each thread keeps the detail of its own last failure, so threads that
 * share one store never read each other's messages. */
static _Thread_local char errbuf[1024];

const char *idem_version(void) { return IDEM_VERSION_STRING; }

const char *idem_rc_name(int rc) {
  switch (rc) {
#define IDEM__RC_NAME(name, num, msg)                                         \
  case num:                                                                   \
    return "IDEM_" #name;
    IDEM_RC_MAP(IDEM__RC_NAME)
#undef IDEM__RC_NAME
  }
  return "IDEM_UNKNOWN_RC";
}

const char *idem_strerror(int rc) {
  switch (rc) {
#define IDEM__RC_MSG(name, num, msg)                                          \
  case num:                                                                   \
    return msg;
    IDEM_RC_MAP(IDEM__RC_MSG)
#undef IDEM__RC_MSG
  }
  return "unknown result code";
}

const char *idem_errmsg(void) { return errbuf; }

int idem__fail(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, ap);
  va_end(ap);
  return rc;
}

void idem__clear_error(void) { errbuf[0] = '\0'; }

void idem_free(void *p) { free(p); }
