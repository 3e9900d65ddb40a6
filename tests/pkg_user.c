/*
 * pkg_user.c -- a program that uses libidem as any project would: built
 * from an installed prefix with `pkg-config idem` (tests/install.sh, and
 * tests/build_without_postgresql.sh), linked with the shared library or
 * with libidem.a.
 *
 * Usage: pkg_user URL. In the store at URL: canonicalises and fingerprints
 * a request, claims it, completes it with a response, claims it again and
 * prints, on one line, the version, the canonical request, its
 * fingerprint, both outcomes and the replayed status and body. When a call
 * fails, prints "CALL: RC_NAME: message" and exits 1.
 */
#include <idem.h>

#include <stdio.h>
#include <string.h>

static int failed(const char *call, int rc) {
  printf("%s: %s: %s\n", call, idem_rc_name(rc), idem_errmsg());
  return 1;
}

int main(int argc, char **argv) {
  static const char request[] = "{\"b\":1,\"a\":[1.0]}";
  static const char body[] = "{\"ticket\":1}";
  idem_id id = {"", "POST /tickets", "pkg-user-1"};
  idem_response resp = {201, NULL, 0, body, sizeof body - 1};
  idem_store *s = NULL;
  idem_call *first = NULL, *again = NULL;
  const idem_response *replayed;
  char *canon = NULL, fp[IDEM_FINGERPRINT_SIZE];
  size_t canon_len = 0;
  int rc, status = 1;

  if (argc != 2)
    return 2;
  if ((rc = idem_canonicalize(request, strlen(request), NULL, &canon,
                              &canon_len, NULL)) != IDEM_OK)
    return failed("canonicalize", rc);
  if ((rc = idem_fingerprint(canon, canon_len, 1, fp)) != IDEM_OK) {
    status = failed("fingerprint", rc);
    goto out;
  }
  if ((rc = idem_store_open(argv[1], NULL, &s)) != IDEM_OK) {
    status = failed("open", rc);
    goto out;
  }
  if ((rc = idem_claim(s, &id, fp, NULL, &first)) != IDEM_OK) {
    status = failed("claim", rc);
    goto out;
  }
  if (idem_call_outcome(first) == IDEM_PROCEED &&
      (rc = idem_complete(s, first, &resp)) != IDEM_OK) {
    status = failed("complete", rc);
    goto out;
  }
  if ((rc = idem_claim(s, &id, fp, NULL, &again)) != IDEM_OK) {
    status = failed("claim again", rc);
    goto out;
  }
  replayed = idem_call_response(again);
  printf("%s %s %s %s %s %d %.*s\n", idem_version(), canon, fp,
         idem_outcome_name(idem_call_outcome(first)),
         idem_outcome_name(idem_call_outcome(again)),
         replayed ? replayed->status : -1,
         replayed ? (int)replayed->body_len : 0,
         replayed ? (const char *)replayed->body : "");
  status = 0;
out:
  idem_call_free(again);
  idem_call_free(first);
  idem_store_close(s);
  idem_free(canon);
  return status;
}
