/*
 * old_user.c -- a program as it was built against libidem 0.2.0: its header
 * (idem-0.2.h, a copy of that release's include/idem.h), its structs and
 * its library's SONAME. tests/abi/abi.sh runs it on the new library, where
 * it must never start, since the structs it passes have changed since.
 *
 * Usage: old_user FOLDER. Prints "VERSION OUTCOME" of a claim in a store
 * made in FOLDER.
 */
#include "idem-0.2.h"

#include <stdio.h>

int main(int argc, char **argv) {
  idem_store_options so = {0};
  idem_call_options co = {0};
  idem_id id = {"", "POST /tickets", "abi-1"};
  idem_store *s = NULL;
  idem_call *c = NULL;
  char url[4096];
  int rc;

  if (argc != 2)
    return 2;
  snprintf(url, sizeof url, "sqlite:%s/store.db", argv[1]);
  so.sqlite_synchronous = IDEM_SYNC_NORMAL;
  so.read_only = 0;
  so.replay_cache_entries = 16;
  co.lease_ms = 5000;
  co.max_attempts = 3;
  if ((rc = idem_store_open(url, &so, &s)) != IDEM_OK) {
    fprintf(stderr, "old_user: open: %s: %s\n", idem_strerror(rc),
            idem_errmsg());
    return 1;
  }
  rc = idem_claim(s, &id,
                  "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f6"
                  "1caaff8a",
                  &co, &c);
  if (rc != IDEM_OK) {
    fprintf(stderr, "old_user: claim: %s: %s\n", idem_strerror(rc),
            idem_errmsg());
    idem_store_close(s);
    return 1;
  }
  printf("%s %s\n", idem_version(), idem_outcome_name(idem_call_outcome(c)));
  idem_call_free(c);
  idem_store_close(s);
  return 0;
}
