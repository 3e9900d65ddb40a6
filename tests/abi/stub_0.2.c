/*
 * stub_0.2.c -- stands in for libidem 0.2.0 (SONAME libidem.so.0) in
 * tests/abi/abi.sh: the symbols old_user.c uses, with 0.2.0's structs. It
 * checks that the options arrive as 0.2.0 laid them out, so that the
 * program is known to work where it finds its own library.
 */
#include "idem-0.2.h"

#include <stdlib.h>
#include <string.h>

struct idem_store {
  int unused;
};
struct idem_call {
  idem_outcome outcome;
};

static const char *errmsg = "";

const char *idem_version(void) { return "0.2.0"; }

const char *idem_strerror(int rc) { return rc ? "error" : "success"; }

const char *idem_errmsg(void) { return errmsg; }

const char *idem_outcome_name(int outcome) {
  return outcome == IDEM_PROCEED ? "proceed" : "other";
}

int idem_store_open(const char *url, const idem_store_options *opts,
                    idem_store **out) {
  *out = NULL;
  if (!url || strncmp(url, "sqlite:", 7) != 0 || !opts ||
      opts->sqlite_synchronous != IDEM_SYNC_NORMAL || opts->read_only != 0 ||
      opts->replay_cache_entries != 16) {
    errmsg = "stub: the options are not 0.2.0's";
    return IDEM_EINVAL;
  }
  *out = calloc(1, sizeof **out);
  return *out ? IDEM_OK : IDEM_ENOMEM;
}

void idem_store_close(idem_store *store) { free(store); }

int idem_claim(idem_store *store, const idem_id *id, const char *fingerprint,
               const idem_call_options *opts, idem_call **out) {
  *out = NULL;
  if (!store || !id || !fingerprint || strlen(fingerprint) != 64 || !opts ||
      opts->lease_ms != 5000 || opts->max_attempts != 3) {
    errmsg = "stub: the call options are not 0.2.0's";
    return IDEM_EINVAL;
  }
  if (!(*out = calloc(1, sizeof **out)))
    return IDEM_ENOMEM;
  (*out)->outcome = IDEM_PROCEED;
  return IDEM_OK;
}

idem_outcome idem_call_outcome(const idem_call *call) {
  return call ? call->outcome : (idem_outcome)0;
}

void idem_call_free(idem_call *call) { free(call); }
