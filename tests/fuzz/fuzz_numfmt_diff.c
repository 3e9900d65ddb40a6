/*
 * fuzz_numfmt_diff.c -- the number formatting of lib/numfmt.c (Schubfach,
 * lib/shortest.c, and the integer fast path) against idem 0.3's
 * (numfmt_ref.c), which found its digits with printf() and strtod().
 *
 * An input of exactly 8 bytes is the bits of a double v; every input is
 * also tried as a number's text, when it is a valid RFC 8259 number of at
 * most 400 bytes, with v the double strtod() reads from it. For each:
 *  - idem__format_double(v) is byte for byte the reference's, reads back
 *    with strtod() as exactly v (0 for both zeros), and refuses NaN and the
 *    infinities as the reference does;
 *  - idem__format_number_exact() of the text (or, for raw bits, of the
 *    shortest text, the 17-digit one and a 25-digit one) is byte for byte
 *    the reference's: every fingerprint of 0.3 stays as it was;
 *  - idem__format_small_integer(), when it takes the text, writes what the
 *    reference writes both ways, and idem__number_surely_finite() is never
 *    wrong about a number that overflows;
 *  - idem_canonicalize() and the fingerprint's text of a JSON text that is
 *    the number alone are the reference's two forms.
 */
#include "idem.h"
#include "internal.h"
#include "numfmt.h"
#include "numfmt_ref.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_numfmt_diff: property violated: %s (line %d)\n",   \
              #cond, __LINE__);                                                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

#define MAX_TEXT 400

static void check_double(double v) {
  char got[32], want[32];
  size_t glen = 99, wlen = 99;
  int grc = idem__format_double(v, got, &glen);
  int wrc = ref_format_double(v, want, &wlen);
  CHECK(grc == wrc);
  CHECK(glen == wlen && strcmp(got, want) == 0);
  if (grc != IDEM_OK) {
    CHECK(!isfinite(v) && glen == 0 && got[0] == '\0');
    return;
  }
  CHECK(glen == strlen(got) && glen <= 25);
  double back = strtod(got, NULL);
  CHECK(v == 0 ? back == 0 && strcmp(got, "0") == 0
               : memcmp(&back, &v, sizeof v) == 0);
}

/* The exact forms of text (a valid number whose double is v) agree. */
static void check_exact(const char *text, size_t len, double v) {
  char *got = malloc(IDEM__EXACT_NUMBER_MAX(len));
  char *want = malloc(IDEM__EXACT_NUMBER_MAX(len));
  size_t glen = 99, wlen = 99;
  CHECK(got != NULL && want != NULL);
  int grc = idem__format_number_exact(text, len, v, got, &glen);
  int wrc = ref_format_number_exact(text, len, v, want, &wlen);
  CHECK(grc == wrc);
  CHECK(glen == wlen && memcmp(got, want, glen + 1) == 0);
  free(got);
  free(want);
}

/* Whether s[0..len) is an RFC 8259 number. */
static int is_json_number(const char *s, size_t len) {
  size_t i = 0;
  if (i < len && s[i] == '-')
    i++;
  if (i < len && s[i] == '0')
    i++;
  else if (i < len && s[i] >= '1' && s[i] <= '9')
    while (i < len && s[i] >= '0' && s[i] <= '9')
      i++;
  else
    return 0;
  if (i < len && s[i] == '.') {
    if (++i >= len || s[i] < '0' || s[i] > '9')
      return 0;
    while (i < len && s[i] >= '0' && s[i] <= '9')
      i++;
  }
  if (i < len && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < len && (s[i] == '+' || s[i] == '-'))
      i++;
    if (i >= len || s[i] < '0' || s[i] > '9')
      return 0;
    while (i < len && s[i] >= '0' && s[i] <= '9')
      i++;
  }
  return i == len;
}

static void check_text(const char *text, size_t len) {
  char small[32], want[32];
  size_t slen = 0, wlen = 0;
  double v = strtod(text, NULL);

  if (!isfinite(v)) {
    CHECK(!idem__number_surely_finite(text, len));
    CHECK(!idem__format_small_integer(text, len, small, &slen));
    return;
  }
  check_double(v);
  check_exact(text, len, v);
  if (idem__format_small_integer(text, len, small, &slen)) {
    char *exact = malloc(IDEM__EXACT_NUMBER_MAX(len));
    size_t elen = 0;
    CHECK(exact != NULL);
    CHECK(slen == strlen(small) && slen <= 22);
    CHECK(ref_format_double(v, want, &wlen) == IDEM_OK);
    CHECK(slen == wlen && strcmp(small, want) == 0);
    CHECK(ref_format_number_exact(text, len, v, exact, &elen) == IDEM_OK);
    CHECK(slen == elen && strcmp(small, exact) == 0);
    free(exact);
  }

  /* Through the canonicaliser and the fingerprint's text. */
  char *out = NULL;
  size_t out_len = 0;
  CHECK(idem_canonicalize(text, len, NULL, &out, &out_len, NULL) == IDEM_OK);
  CHECK(ref_format_double(v, want, &wlen) == IDEM_OK);
  CHECK(out_len == wlen && memcmp(out, want, wlen) == 0);
  idem_free(out);
  out = NULL;
  CHECK(idem__fingerprint_text(text, len, NULL, &out, &out_len, NULL) ==
        IDEM_OK);
  {
    char *exact = malloc(IDEM__EXACT_NUMBER_MAX(len));
    size_t elen = 0;
    CHECK(exact != NULL);
    CHECK(ref_format_number_exact(text, len, v, exact, &elen) == IDEM_OK);
    CHECK(out_len == elen && memcmp(out, exact, elen) == 0);
    free(exact);
  }
  idem_free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 8) {
    double v;
    memcpy(&v, data, 8);
    check_double(v);
    if (isfinite(v)) {
      /* Texts of v: its shortest form and two longer, exact-looking ones. */
      char t[64];
      size_t tlen = 0;
      CHECK(ref_format_double(v, t, &tlen) == IDEM_OK);
      check_exact(t, tlen, v);
      for (int p = 17; p <= 25; p += 8) {
        int n = snprintf(t, sizeof t, "%.*e", p - 1, v);
        CHECK(n > 0 && (size_t)n < sizeof t);
        check_exact(t, (size_t)n, strtod(t, NULL));
      }
    }
  }
  if (size == 0 || size > MAX_TEXT)
    return 0;
  char text[MAX_TEXT + 1];
  memcpy(text, data, size);
  text[size] = '\0';
  if (is_json_number(text, size))
    check_text(text, size);
  return 0;
}
