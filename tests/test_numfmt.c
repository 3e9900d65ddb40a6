/* test_numfmt.c -- ECMAScript number serialisation (lib/numfmt.c and
 * lib/shortest.c).
 *
 * Usage: test_numfmt VECTORS_DIR, the directory holding es6-numbers-10k.txt
 * (shared/vectors/jcs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "numfmt.h"

static const char *vectors_dir;

/* Formats v and checks the exact text and its length. */
static void expect_format(double v, const char *want) {
  char out[32];
  size_t len = 99;
  int rc = idem__format_double(v, out, &len);
  assert_int_equal(rc, IDEM_OK);
  assert_string_equal(out, want);
  assert_int_equal(len, strlen(want));
}

static double from_bits(uint64_t bits) {
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

/* Every line of the reference sequence, "HEXBITS,EXPECTED", must match. */
static void test_es6_vectors(void **state) {
  char path[4096], line[256];
  unsigned lines = 0, mismatches = 0;
  FILE *f;
  (void)state;

  snprintf(path, sizeof path, "%s/es6-numbers-10k.txt", vectors_dir);
  f = fopen(path, "r");
  if (f == NULL)
    fail_msg("cannot open %s", path);
  while (fgets(line, sizeof line, f) != NULL) {
    char *comma = strchr(line, ','), *end = NULL, out[32];
    size_t len = 0;
    uint64_t bits;
    int rc;
    if (comma == NULL) {
      fclose(f);
      fail_msg("line %u: no comma", lines + 1);
    }
    *comma = '\0';
    comma[1 + strcspn(comma + 1, "\r\n")] = '\0';
    bits = strtoull(line, &end, 16);
    if (end == line || *end != '\0') {
      fclose(f);
      fail_msg("line %u: bad hex '%s'", lines + 1, line);
    }
    lines++;
    rc = idem__format_double(from_bits(bits), out, &len);
    if (rc != IDEM_OK || strcmp(out, comma + 1) != 0 ||
        len != strlen(comma + 1)) {
      if (mismatches < 20)
        print_error("line %u: %s: got '%s' (rc %d), want '%s'\n", lines, line,
                    out, rc, comma + 1);
      mismatches++;
    }
  }
  fclose(f);
  assert_int_equal(lines, 10000);
  assert_int_equal(mismatches, 0);
}

static void test_zero(void **state) {
  (void)state;
  expect_format(0.0, "0");
  expect_format(-0.0, "0");
}

static void test_integers(void **state) {
  (void)state;
  expect_format(1, "1");
  expect_format(100, "100");
  expect_format(-1, "-1");
  expect_format(9007199254740992.0, "9007199254740992");
  expect_format(123456789012345680000.0, "123456789012345680000");
}

/* 10^21 is where ECMAScript switches to exponent notation. */
static void test_exponent_threshold(void **state) {
  (void)state;
  expect_format(1e20, "100000000000000000000");
  expect_format(100000000000000000000.0, "100000000000000000000");
  expect_format(1e21, "1e+21");
  expect_format(-1e21, "-1e+21");
  expect_format(1.5e21, "1.5e+21");
  expect_format(1e300, "1e+300");
}

/* 10^-6 is the last power written as a plain fraction. */
static void test_small_fractions(void **state) {
  (void)state;
  expect_format(0.1, "0.1");
  expect_format(0.5, "0.5");
  expect_format(1.5, "1.5");
  expect_format(-1.5, "-1.5");
  expect_format(1e-6, "0.000001");
  expect_format(0.000001234, "0.000001234");
  expect_format(1e-7, "1e-7");
  expect_format(123e-20, "1.23e-18");
  expect_format(333333333.33333329, "333333333.3333333");
  expect_format(0.1 + 0.2, "0.30000000000000004");
}

static void test_extremes(void **state) {
  (void)state;
  expect_format(5e-324, "5e-324");
  expect_format(-5e-324, "-5e-324");
  expect_format(2.2250738585072014e-308, "2.2250738585072014e-308");
  expect_format(1.7976931348623157e308, "1.7976931348623157e+308");
  expect_format(-1.7976931348623157e308, "-1.7976931348623157e+308");
}

/*
 * Powers of two where the correctly rounded shortest digits do not read back
 * (the interval below a power of two is half as wide as the one above) but
 * the next decimal up does; a formatter without that step writes 17 digits.
 */
static void test_power_of_two_boundaries(void **state) {
  (void)state;
  expect_format(from_bits(0x3e70000000000000ull), "5.960464477539063e-8");
  expect_format(from_bits(0x3d30000000000000ull), "5.684341886080802e-14");
  expect_format(from_bits(0x0060000000000000ull), "7.120236347223045e-307");
  expect_format(from_bits(0x4580000000000000ull), "6.189700196426902e+26");
  expect_format(ldexp(1, -24), "5.960464477539063e-8");
}

/*
 * Short decimals that lie exactly halfway between two doubles: the even
 * one reads them and writes them back; the odd one, whose rounding
 * interval is open, must not. Schubfach gets them right only through its
 * truncated products (a fully sticky product writes ...0001 for the first).
 */
static void test_halfway_decimals(void **state) {
  (void)state;
  expect_format(from_bits(0x4440438b64f3d0d2ull), "600030000000000000000");
  expect_format(from_bits(0x4440438b64f3d0d1ull), "600029999999999900000");
  expect_format(from_bits(0x4440438b64f3d0d3ull), "600030000000000200000");
  expect_format(1e23, "1e+23");
  expect_format(from_bits(0x44b52d02c7e14af7ull), "1.0000000000000001e+23");
  expect_format(9007199254740993.0, "9007199254740992");
  expect_format(2000000000578087.2, "2000000000578087.2");
}

/* Writes text through the integer fast path, which must take it. */
static void expect_small_integer(const char *text, const char *want) {
  char out[32];
  size_t len = 99;
  assert_int_equal(idem__format_small_integer(text, strlen(text), out, &len),
                   1);
  assert_string_equal(out, want);
  assert_int_equal(len, strlen(want));
}

static void expect_not_small_integer(const char *text) {
  char out[32];
  size_t len = 99;
  assert_int_equal(idem__format_small_integer(text, strlen(text), out, &len),
                   0);
}

static void test_small_integers(void **state) {
  (void)state;
  expect_small_integer("0", "0");
  expect_small_integer("-0", "0");
  expect_small_integer("-0.000e7", "0");
  expect_small_integer("42", "42");
  expect_small_integer("-42", "-42");
  expect_small_integer("123456789012345", "123456789012345");
  expect_small_integer("-999999999999999", "-999999999999999");
  expect_small_integer("1.5e3", "1500");
  expect_small_integer("120.00", "120");
  expect_small_integer("15E+2", "1500");
  expect_small_integer("1e20", "100000000000000000000");
  expect_small_integer("123456789012345e6", "123456789012345000000");
  expect_small_integer("0.0012e4", "12");
  /* Above 2^53, or with 16 significant digits and an exponent, a double
   * may not hold the digits; 10^21 and above are
   * written with an exponent; fractions are not integers. */
  expect_small_integer("9007199254740992", "9007199254740992");
  expect_small_integer("-9007199254740991", "-9007199254740991");
  expect_not_small_integer("9007199254740993");
  expect_not_small_integer("1234567890123456e0");
  expect_not_small_integer("12345678901234567");
  expect_not_small_integer("1e21");
  expect_not_small_integer("123456789012345e7");
  expect_not_small_integer("1.5");
  expect_not_small_integer("120.5e0");
  expect_not_small_integer("1e-1");
  expect_not_small_integer("1e100000000000000000000");
}

static void test_surely_finite(void **state) {
  (void)state;
  assert_true(idem__number_surely_finite("0e99999999999", 13));
  assert_true(idem__number_surely_finite("9e307", 5));
  assert_true(idem__number_surely_finite("-9.99e307", 9));
  assert_true(idem__number_surely_finite("1e-400", 6));
  /* From 10^308 on the digits alone do not decide: the caller converts. */
  assert_false(idem__number_surely_finite("1e308", 5));
  assert_false(idem__number_surely_finite("1e309", 5));
  assert_false(idem__number_surely_finite("1.7e308", 7));
  assert_false(idem__number_surely_finite("1e99999999999999999999", 22));
}

/* The fingerprint's form of text, whose double is strtod()'s. */
static void expect_exact(const char *text, const char *want) {
  size_t len = strlen(text), out_len = 99;
  char *out = malloc(IDEM__EXACT_NUMBER_MAX(len));
  assert_non_null(out);
  assert_int_equal(
      idem__format_number_exact(text, len, strtod(text, NULL), out, &out_len),
      IDEM_OK);
  assert_string_equal(out, want);
  assert_int_equal(out_len, strlen(want));
  free(out);
}

static void test_exact_numbers(void **state) {
  (void)state;
  /* Faithful: RFC 8785's form. */
  expect_exact("0.1", "0.1");
  expect_exact("-0.0", "0");
  expect_exact("1E300", "1e+300");
  expect_exact("1.50", "1.5");
  expect_exact("1e21", "1e+21");
  expect_exact("0.30000000000000004", "0.30000000000000004");
  expect_exact("6.0003e20", "600030000000000000000");
  /* Not faithful: the exact value. */
  expect_exact("12345678901234567", "12345678901234567");
  expect_exact("9007199254740993", "9007199254740993");
  expect_exact("1e-400", "1e-400");
  expect_exact("0.30000000000000001", "0.30000000000000001");
  expect_exact("600030000000000000001", "600030000000000000001");
}

static void test_not_finite(void **state) {
  char out[32] = "x";
  size_t len = 99;
  (void)state;
  assert_int_equal(idem__format_double(NAN, out, &len), IDEM_ERANGE);
  assert_string_equal(out, "");
  assert_int_equal(len, 0);
  len = 99;
  assert_int_equal(idem__format_double(INFINITY, out, &len), IDEM_ERANGE);
  assert_int_equal(len, 0);
  assert_int_equal(idem__format_double(-INFINITY, out, &len), IDEM_ERANGE);
  assert_int_equal(len, 0);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_es6_vectors),
      cmocka_unit_test(test_zero),
      cmocka_unit_test(test_integers),
      cmocka_unit_test(test_exponent_threshold),
      cmocka_unit_test(test_small_fractions),
      cmocka_unit_test(test_extremes),
      cmocka_unit_test(test_power_of_two_boundaries),
      cmocka_unit_test(test_halfway_decimals),
      cmocka_unit_test(test_small_integers),
      cmocka_unit_test(test_surely_finite),
      cmocka_unit_test(test_exact_numbers),
      cmocka_unit_test(test_not_finite),
  };
  if (argc != 2) {
    fprintf(stderr, "usage: %s VECTORS_DIR\n", argv[0]);
    return 2;
  }
  vectors_dir = argv[1];
  return cmocka_run_group_tests(tests, NULL, NULL);
}
