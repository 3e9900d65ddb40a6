/* test_numfmt.c -- ECMAScript number serialisation (lib/numfmt.c and
 * lib/shortest.c) and the reading of decimal texts (lib/decimal.c).
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

#include "decimal.h"
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

/* ------------------------------------------------------------------ */
/* Decimal texts to doubles (lib/decimal.c)                             */
/* ------------------------------------------------------------------ */

static uint64_t to_bits(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

/* text reads as the double of these bits, as strtod() reads it too. */
static void expect_decimal(const char *text, uint64_t bits) {
  double v = 12345;
  assert_int_equal(idem__decimal_to_double(text, strlen(text), &v), IDEM_OK);
  if (to_bits(v) != bits)
    fail_msg("%.60s: got 0x%016llx, want 0x%016llx", text,
             (unsigned long long)to_bits(v), (unsigned long long)bits);
  assert_true(to_bits(strtod(text, NULL)) == bits);
}

/* text reads in the fast steps, without strtod(). */
static void expect_fast(const char *text) {
  double v;
  assert_true(idem__decimal_to_double_fast(text, strlen(text), &v));
}

static void test_decimal_ties(void **state) {
  (void)state;
  /* 2^53 + 1 and 2^53 + 3 lie halfway between doubles: to the even one. */
  expect_decimal("9007199254740993", 0x4340000000000000ull);
  expect_decimal("9007199254740995", 0x4340000000000002ull);
  expect_decimal("9007199254740993.0000000000000000000000001",
                 0x4340000000000001ull);
  /* 10^23 is a tie too (5^23 needs 54 bits). */
  expect_decimal("1e23", 0x44b52d02c7e14af6ull);
  /* 1 + 2^-53 in full is a tie; one more digit far out breaks it. */
  expect_decimal("1.00000000000000011102230246251565404236316680908203125",
                 0x3ff0000000000000ull);
  {
    char t[800];
    snprintf(t, sizeof t, "%s%0700d1",
             "1.00000000000000011102230246251565404236316680908203125", 0);
    expect_decimal(t, 0x3ff0000000000001ull);
  }
  expect_fast("9007199254740993");
  expect_fast("1e23");
}

static void test_decimal_extremes(void **state) {
  (void)state;
  expect_decimal("2.2250738585072011e-308", 0x000fffffffffffffull);
  expect_decimal("2.2250738585072014e-308", 0x0010000000000000ull);
  expect_decimal("4.9406564584124654e-324", 1);
  expect_decimal("8.5e-324", 2);
  /* Half the smallest subnormal is 2.47032822920623272e-324. */
  expect_decimal("2.4703282292062327e-324", 0);
  expect_decimal("2.4703282292062328e-324", 1);
  expect_decimal("1e-400", 0);
  expect_decimal("-1e-400", 0x8000000000000000ull);
  expect_decimal("-0", 0x8000000000000000ull);
  expect_decimal("-0.000e-99999999999999999999", 0x8000000000000000ull);
  expect_decimal("1.7976931348623157e308", 0x7fefffffffffffffull);
  expect_decimal("1.7976931348623158e308", 0x7fefffffffffffffull);
}

static void test_decimal_overflow(void **state) {
  double v = 12345;
  (void)state;
  assert_int_equal(idem__decimal_to_double("1.7976931348623159e308", 22, &v),
                   IDEM_ERANGE);
  assert_int_equal(idem__decimal_to_double("-1e309", 6, &v), IDEM_ERANGE);
  assert_int_equal(idem__decimal_to_double("1e99999999999999999999", 22, &v),
                   IDEM_ERANGE);
  assert_true(v == 12345);
}

static void test_decimal_long(void **state) {
  char t[1024];
  (void)state;
  expect_decimal("1234567890123456789", 0x43b12210f47de981ull);
  expect_decimal("12345678901234567890", 0x43e56a95319d63e1ull);
  expect_decimal("123456789012345678901234567890", 0x45f8ee90ff6c373eull);
  expect_decimal("0.000000000000000000000000000000000000000000001e45",
                 0x3ff0000000000000ull);
  /* 800 digits of 1/3. */
  memcpy(t, "0.", 2);
  memset(t + 2, '3', 800);
  t[802] = '\0';
  expect_decimal(t, 0x3fd5555555555555ull);
  expect_fast(t);
}

static void test_decimal_common(void **state) {
  (void)state;
  expect_decimal("0.1", 0x3fb999999999999aull);
  expect_decimal("-2.5e-1", 0xbfd0000000000000ull);
  expect_decimal("7.2057594037927933e16", 0x4370000000000000ull);
  expect_fast("0.1");
  expect_fast("6.58314879681664e-278");
  expect_fast("-8.633967074017985e+237");
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
      cmocka_unit_test(test_decimal_ties),
      cmocka_unit_test(test_decimal_extremes),
      cmocka_unit_test(test_decimal_overflow),
      cmocka_unit_test(test_decimal_long),
      cmocka_unit_test(test_decimal_common),
  };
  if (argc != 2) {
    fprintf(stderr, "usage: %s VECTORS_DIR\n", argv[0]);
    return 2;
  }
  vectors_dir = argv[1];
  return cmocka_run_group_tests(tests, NULL, NULL);
}
