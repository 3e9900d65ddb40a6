/*
 * fuzz_numfmt.c -- number formatting (lib/numfmt.c) against the double that
 * strtod() gives.
 *
 * Input of exactly 8 bytes: the bits of a double. Any other input: a number
 * as text, read by strtod(). For every finite double v, idem's text must
 *  - read back as exactly v with strtod() (-0 is written "0");
 *  - have the fewest significant digits that do so: the smallest p for which
 *    printf's "%.{p-1}e" (correctly rounded) reads back as v, and the same
 *    digits as that;
 *  - follow ECMAScript's notation: plain for 1e-6 <= |v| < 1e21, exponent
 *    ("1e+21", "1.5e-7") otherwise.
 * NaN and the infinities are refused with IDEM_ERANGE. Also, a JSON text
 * that is one number canonicalises to exactly this formatting of the double
 * strtod() reads from it.
 */
#include "idem.h"
#include "numfmt.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_numfmt: property violated: %s (line %d)\n", #cond, \
              __LINE__);                                                       \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* The significant digits of a number's text, without leading or trailing
 * zeros: "1.50e-7" -> "15", "1200" -> "12". */
static void digits_of(const char *s, char *d) {
  size_t n = 0;
  for (; *s && *s != 'e' && *s != 'E'; s++)
    if (*s >= '0' && *s <= '9' && (n > 0 || *s != '0'))
      d[n++] = *s;
  while (n > 0 && d[n - 1] == '0')
    n--;
  d[n] = '\0';
}

static void check_double(double v) {
  char out[32], ref[40], got_digits[40], ref_digits[40];
  size_t len = 99;
  int rc = idem__format_double(v, out, &len);
  if (!isfinite(v)) {
    CHECK(rc == IDEM_ERANGE && len == 0 && out[0] == '\0');
    return;
  }
  CHECK(rc == IDEM_OK);
  CHECK(len == strlen(out) && len <= 25);
  double back = strtod(out, NULL);
  if (v == 0) {
    CHECK(strcmp(out, "0") == 0);
    return;
  }
  CHECK(memcmp(&back, &v, sizeof v) == 0);
  /* The fewest digits p for which some p-digit decimal reads back as v:
   * printf's correctly rounded one, or (where the gap below v is half the
   * gap above it, at a power of two) one of its neighbours in the last
   * digit. Of those, idem must write one that reads back, and the correctly
   * rounded one whenever that reads back, since it is the closest. */
  digits_of(out, got_digits);
  int p, found = 0;
  for (p = 1; p <= 17 && !found; p++) {
    snprintf(ref, sizeof ref, "%.*e", p - 1, fabs(v));
    unsigned long long m = 0;
    const char *c;
    for (c = ref; *c != 'e'; c++)
      if (*c >= '0' && *c <= '9')
        m = m * 10 + (unsigned)(*c - '0');
    int e10 = atoi(c + 1) - (p - 1);
    for (int delta = 0; delta <= 2; delta++) {
      unsigned long long cand = delta == 0 ? m : delta == 1 ? m - 1 : m + 1;
      char text[48];
      if (cand == 0)
        continue;
      snprintf(text, sizeof text, "%llue%d", cand, e10);
      if (strtod(text, NULL) != fabs(v))
        continue;
      digits_of(text, ref_digits);
      if (delta == 0) {
        CHECK(strcmp(got_digits, ref_digits) == 0);
        found = 1;
        break;
      }
      if (strcmp(got_digits, ref_digits) == 0)
        found = 1;
    }
    if (!found) {
      /* No p-digit decimal reads back as v: idem's has more digits. */
      CHECK(strlen(got_digits) > (size_t)p);
    }
  }
  CHECK(found);
  double a = fabs(v);
  int has_exp = strchr(out, 'e') != NULL;
  CHECK(has_exp == !(a >= 1e-6 && a < 1e21));
  if (has_exp) {
    const char *e = strchr(out, 'e');
    CHECK(e[1] == (a >= 1 ? '+' : '-'));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 8) {
    double v;
    memcpy(&v, data, 8);
    check_double(v);
    return 0;
  }
  if (size > 400)
    return 0;
  char text[401];
  memcpy(text, data, size);
  text[size] = '\0';
  char *end = NULL;
  double v = strtod(text, &end);
  if (end == text)
    return 0;
  check_double(v);
  /* As a JSON number: what idem canonicalises it to. */
  char *in = malloc(size ? size : 1), *out = NULL;
  size_t out_len = 0;
  if (!in)
    return 0;
  memcpy(in, data, size);
  if (idem_canonicalize(in, size, NULL, &out, &out_len, NULL) == IDEM_OK &&
      out_len > 0 && (out[0] == '-' || (out[0] >= '0' && out[0] <= '9'))) {
    char fmt[32];
    size_t flen = 0;
    /* The whole input was one JSON number (JSON has no "inf" or hex);
     * strtod() read all of it but blanks around it. */
    CHECK(idem__format_double(v, fmt, &flen) == IDEM_OK);
    CHECK(flen == out_len && memcmp(fmt, out, flen) == 0);
  }
  idem_free(out);
  free(in);
  return 0;
}
