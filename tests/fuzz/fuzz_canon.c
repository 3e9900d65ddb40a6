/*
 * fuzz_canon.c -- the canonical JSON parser and serialiser (lib/canon.c).
 *
 * Input: any bytes, given as a JSON text of exactly that size on the heap,
 * with no NUL after it, so that a read past the end is an ASan report.
 * Properties checked (a violation aborts):
 *  - accepted: the output is NUL-terminated at out_len and holds no NUL
 *    before it; canonicalising the output again (also from an exact-size
 *    copy) succeeds and gives the same bytes (canon(canon(x)) == canon(x));
 *    idem_fingerprint() of the input is the SHA-256 of the fingerprint's
 *    text, which is the output itself or, where a number's double does not
 *    hold its exact value, a text that canonicalises to the output;
 *  - refused: *out is NULL, *out_len 0, the error offset within the input,
 *    the result code one of the documented ones, and the fingerprint of the
 *    input as JSON is refused with the same code;
 *  - lone surrogates read (IDEM__CANON_LONE): an input accepted without
 *    them has the same texts with them; one refused for anything but
 *    IDEM_EUTF8 (which a lone surrogate is) is refused for the same; an
 *    accepted one's canonical form is its own (canonicalising it again
 *    gives the same bytes), and idem_fingerprint_with() with
 *    IDEM_FP_LONE_SURROGATES is the SHA-256 of its fingerprint's text.
 */
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_canon: property violated: %s (line %d)\n", #cond,  \
              __LINE__);                                                       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *in = malloc(size ? size : 1), *out = NULL, *again = NULL, *copy;
  size_t out_len = 99, again_len = 0, off = (size_t)-1;
  char fp[IDEM_FINGERPRINT_SIZE], sha[IDEM_FINGERPRINT_SIZE];
  int rc, rc2;
  if (!in)
    return 0;
  if (size)
    memcpy(in, data, size);
  rc = idem_canonicalize(in, size, NULL, &out, &out_len, &off);
  rc2 = idem_fingerprint(in, size, 1, fp);
  if (rc == IDEM_OK) {
    CHECK(out != NULL);
    CHECK(out[out_len] == '\0');
    CHECK(memchr(out, '\0', out_len) == NULL);
    CHECK(out_len > 0);
    copy = malloc(out_len);
    CHECK(copy != NULL);
    memcpy(copy, out, out_len);
    off = (size_t)-1;
    CHECK(idem_canonicalize(copy, out_len, NULL, &again, &again_len, &off) ==
          IDEM_OK);
    CHECK(again_len == out_len && memcmp(again, out, out_len) == 0);
    free(copy);
    CHECK(rc2 == IDEM_OK);
    {
      char *text = NULL, *back = NULL;
      size_t text_len = 0, back_len = 0;
      CHECK(idem__fingerprint_text(in, size, NULL, &text, &text_len, NULL) ==
            IDEM_OK);
      CHECK(idem_sha256_hex(text, text_len, sha) == IDEM_OK);
      CHECK(strcmp(fp, sha) == 0);
      CHECK(idem_canonicalize(text, text_len, NULL, &back, &back_len, NULL) ==
            IDEM_OK);
      CHECK(back_len == out_len && memcmp(back, out, out_len) == 0);
      idem_free(back);
      idem_free(text);
    }
  } else {
    CHECK(out == NULL && out_len == 0);
    CHECK(off <= size);
    CHECK(rc == IDEM_EJSON || rc == IDEM_EDUPKEY || rc == IDEM_EUTF8 ||
          rc == IDEM_ERANGE || rc == IDEM_EDEPTH || rc == IDEM_ETOOBIG ||
          rc == IDEM_ENOMEM);
    CHECK(rc2 == rc);
    CHECK(idem_errmsg()[0] != '\0');
  }
  {
    char *lone = NULL, *lone2 = NULL, *text = NULL, *strict = NULL;
    size_t lone_len = 0, lone2_len = 0, text_len = 0, strict_len = 0;
    int rl = idem__canon_text(in, size, NULL, IDEM__CANON_LONE, &lone,
                              &lone_len, NULL);
    int rt =
        idem__canon_text(in, size, NULL, IDEM__CANON_LONE | IDEM__CANON_EXACT,
                         &text, &text_len, NULL);
    int rf = idem_fingerprint_with(in, size,
                                   IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fp);
    CHECK(rt == rl && rf == rl);
    if (rc == IDEM_OK) {
      CHECK(rl == IDEM_OK);
      CHECK(lone_len == out_len && memcmp(lone, out, out_len) == 0);
      CHECK(idem__fingerprint_text(in, size, NULL, &strict, &strict_len,
                                   NULL) == IDEM_OK);
      CHECK(text_len == strict_len && memcmp(text, strict, text_len) == 0);
    } else if (rc != IDEM_EUTF8) {
      CHECK(rl == rc);
    }
    if (rl == IDEM_OK) {
      CHECK(lone[lone_len] == '\0' && text[text_len] == '\0');
      copy = malloc(lone_len);
      CHECK(copy != NULL);
      memcpy(copy, lone, lone_len);
      CHECK(idem__canon_text(copy, lone_len, NULL, IDEM__CANON_LONE, &lone2,
                             &lone2_len, NULL) == IDEM_OK);
      CHECK(lone2_len == lone_len && memcmp(lone2, lone, lone_len) == 0);
      free(copy);
      CHECK(idem_sha256_hex(text, text_len, sha) == IDEM_OK);
      CHECK(strcmp(fp, sha) == 0);
    } else {
      CHECK(lone == NULL && text == NULL && fp[0] == '\0');
    }
    idem_free(lone);
    idem_free(lone2);
    idem_free(text);
    idem_free(strict);
  }
  idem_free(again);
  idem_free(out);
  free(in);
  return 0;
}
