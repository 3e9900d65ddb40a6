/* test_fingerprint.c -- fingerprints of JSON requests (lib/fingerprint.c,
 * the fingerprint's text in lib/canon.c and its numbers in lib/numfmt.c):
 * exact numbers, the parts that fingerprint pointers select, and the
 * fingerprints that 0.2 stored.
 *
 * Usage: test_fingerprint VECTORS_DIR FINGERPRINTS_0_2, the RFC 8785
 * vectors (shared/vectors/jcs) and tests/vectors/fingerprint-0.2.txt.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

static const char *vectors_dir;
static const char *vectors_0_2;

/* ------------------------------------------------------------------ */
/* Helpers                                                              */
/* ------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *data = NULL;
  size_t cap = 0, n = 0;
  if (f == NULL)
    fail_msg("cannot open %s", path);
  for (;;) {
    size_t got;
    if (n == cap) {
      char *p = realloc(data, cap = cap ? cap * 2 : 4096);
      assert_non_null(p);
      data = p;
    }
    got = fread(data + n, 1, cap - n, f);
    n += got;
    if (got == 0)
      break;
  }
  fclose(f);
  *len = n;
  return data;
}

/* The fingerprint's text of n bytes (whole, or the parts ptrs select)
 * must be exactly want; both fingerprint calls must hash it. */
static void expect_text_n(const char *in, size_t n, const char *const *ptrs,
                          const char *want) {
  char *out = NULL, fp[IDEM_FINGERPRINT_SIZE], sha[IDEM_FINGERPRINT_SIZE];
  size_t out_len = 99, off = 99;
  int rc = idem__fingerprint_text(in, n, ptrs, &out, &out_len, &off);
  if (rc != IDEM_OK)
    fail_msg("input '%.*s': %s: %s", (int)(n > 200 ? 200 : n), in,
             idem_rc_name(rc), idem_errmsg());
  assert_non_null(out);
  if (out_len != strlen(want) || memcmp(out, want, out_len) != 0)
    fail_msg("input '%.*s': got '%.*s', want '%s'", (int)(n > 200 ? 200 : n),
             in, (int)(out_len > 300 ? 300 : out_len), out, want);
  assert_int_equal(out[out_len], '\0');
  assert_int_equal(idem_sha256_hex(out, out_len, sha), IDEM_OK);
  assert_int_equal(idem__request_fingerprint(in, n, ptrs, fp), IDEM_OK);
  assert_string_equal(fp, sha);
  if (ptrs == NULL) {
    assert_int_equal(idem_fingerprint(in, n, 1, fp), IDEM_OK);
    assert_string_equal(fp, sha);
  }
  idem_free(out);
}

static void expect_text(const char *in, const char *want) {
  expect_text_n(in, strlen(in), NULL, want);
}

static void expect_text_ptrs(const char *in, const char *const *ptrs,
                             const char *want) {
  expect_text_n(in, strlen(in), ptrs, want);
}

static void fingerprint_of(const char *json, char fp[IDEM_FINGERPRINT_SIZE]) {
  int rc = idem_fingerprint(json, strlen(json), 1, fp);
  if (rc != IDEM_OK)
    fail_msg("'%s': %s: %s", json, idem_rc_name(rc), idem_errmsg());
}

/* ------------------------------------------------------------------ */
/* Exact numbers                                                        */
/* ------------------------------------------------------------------ */

/* Numbers equal in value share a fingerprint, each group its own. */
static void test_equal_values_share(void **state) {
  static const char *const groups[][8] = {
      {"1", "1.0", "1e0", "10E-1", "0.1e1", "100e-2", "1.000", NULL},
      {"0", "-0", "0.0", "-0.0e5", "0e-99999999999999999999", "0E+7", NULL},
      {"12345678901234567", "1.2345678901234567e16", "12345678901234567.000",
       "123456789012345670e-1", NULL},
      {"1e-400", "0.1e-399", "10E-401", "0.0001e-396", NULL},
      {"0.1", "1e-1", "0.10", "100e-3", NULL},
      {"1e-1000000000000000000000", "10e-1000000000000000000001",
       "0.01e-999999999999999999998", NULL},
      {"-4.9406564584124654e-324", "-49406564584124654e-340", NULL},
  };
  char first[IDEM_FINGERPRINT_SIZE], fp[IDEM_FINGERPRINT_SIZE];
  char seen[sizeof groups / sizeof groups[0]][IDEM_FINGERPRINT_SIZE];
  (void)state;
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
    fingerprint_of(groups[g][0], first);
    for (size_t i = 1; groups[g][i]; i++) {
      fingerprint_of(groups[g][i], fp);
      if (strcmp(fp, first) != 0)
        fail_msg("'%s' and '%s' are one value but have two fingerprints",
                 groups[g][0], groups[g][i]);
    }
    for (size_t h = 0; h < g; h++)
      if (strcmp(seen[h], first) == 0)
        fail_msg("'%s' and '%s' differ but share a fingerprint", groups[h][0],
                 groups[g][0]);
    memcpy(seen[g], first, sizeof first);
  }
}

/* Numbers that differ in value never share a fingerprint, though many of
 * them share a double (and so RFC 8785's canonical form). */
static void test_distinct_values_differ(void **state) {
  static const char *const values[] = {
      "12345678901234567",
      "12345678901234568",
      "12345678901234566",
      "9007199254740993",
      "9007199254740992",
      "0.1",
      "0.10000000000000001",
      "0.1000000000000000055511151231257827021181583404541015625",
      "0",
      "1e-400",
      "2e-400",
      "-1e-400",
      "1e-999999999",
      "1e-999999998",
      "1e-1000000000000000000000",
      "1e-1000000000000000000001",
      "1.7976931348623157e308",
      "1.7976931348623158e308",
      "5e-324",
      "4.9406564584124654e-324",
      "123456789012345678901234567890",
      "123456789012345678901234567891",
  };
  enum { N = sizeof values / sizeof values[0] };
  char fp[N][IDEM_FINGERPRINT_SIZE];
  (void)state;
  for (size_t i = 0; i < N; i++) {
    fingerprint_of(values[i], fp[i]);
    for (size_t j = 0; j < i; j++)
      if (strcmp(fp[i], fp[j]) == 0)
        fail_msg("'%s' and '%s' differ but share a fingerprint", values[j],
                 values[i]);
  }
}

/* The case: another account under the same key is another
 * request, in a whole request and in the parts pointers select. */
static void test_accounts(void **state) {
  static const char a[] = "{\"account\":12345678901234567}";
  static const char b[] = "{\"account\":12345678901234568}";
  static const char *const ptrs[] = {"/account", NULL};
  char fa[IDEM_FINGERPRINT_SIZE], fb[IDEM_FINGERPRINT_SIZE];
  char *ca = NULL, *cb = NULL;
  size_t la = 0, lb = 0;
  (void)state;
  /* RFC 8785 maps both to one double: idem_canonicalize() stays so. */
  assert_int_equal(idem_canonicalize(a, strlen(a), NULL, &ca, &la, NULL),
                   IDEM_OK);
  assert_int_equal(idem_canonicalize(b, strlen(b), NULL, &cb, &lb, NULL),
                   IDEM_OK);
  assert_string_equal(ca, "{\"account\":12345678901234568}");
  assert_string_equal(cb, "{\"account\":12345678901234568}");
  idem_free(ca);
  idem_free(cb);
  fingerprint_of(a, fa);
  fingerprint_of(b, fb);
  assert_string_not_equal(fa, fb);
  assert_int_equal(idem__request_fingerprint(a, strlen(a), NULL, fa), IDEM_OK);
  assert_int_equal(idem__request_fingerprint(b, strlen(b), NULL, fb), IDEM_OK);
  assert_string_not_equal(fa, fb);
  assert_int_equal(idem__request_fingerprint(a, strlen(a), ptrs, fa), IDEM_OK);
  assert_int_equal(idem__request_fingerprint(b, strlen(b), ptrs, fb), IDEM_OK);
  assert_string_not_equal(fa, fb);
  expect_text(a, "{\"account\":12345678901234567}");
  expect_text(b, "{\"account\":12345678901234568}");
}

/* The text of numbers: RFC 8785's where the double's shortest form has the
 * input's value, the exact value in the same notation otherwise. */
static void test_number_text(void **state) {
  (void)state;
  /* Faithful: as RFC 8785 writes them. */
  expect_text("[-0, 1E2, 1e-7, 0.1, 1e21, 1e20, 4.50, 2e-3, -0.0]",
              "[0,100,1e-7,0.1,1e+21,100000000000000000000,4.5,0.002,0]");
  expect_text("[5e-324, 1.7976931348623157e308, 1e23, 0.000001, 1e-6]",
              "[5e-324,1.7976931348623157e+308,1e+23,0.000001,0.000001]");
  expect_text("1e-0000000000000000000000000000000000001", "0.1");
  expect_text("0e-99999999999999999999999", "0");
  expect_text("-0e99999999999999999999999", "0");
  /* Not faithful: plain integers and fractions up to 21 digits before the
   * point and 6 zeros after it, exponent notation otherwise. */
  expect_text("12345678901234567", "12345678901234567");
  expect_text("-12345678901234567.0e0", "-12345678901234567");
  expect_text("9007199254740993", "9007199254740993");
  expect_text("123456789012345678901", "123456789012345678901");
  expect_text("123456789012345678901.5", "123456789012345678901.5");
  expect_text("1234567890123456789012", "1.234567890123456789012e+21");
  expect_text("1234567890123456789012.5", "1.2345678901234567890125e+21");
  expect_text("123456789012345678901234567890",
              "1.2345678901234567890123456789e+29");
  expect_text("0.10000000000000001", "0.10000000000000001");
  expect_text("0.000001234567890123456789", "0.000001234567890123456789");
  expect_text("0.0000001234567890123456789", "1.234567890123456789e-7");
  expect_text("1.7976931348623158e308", "1.7976931348623158e+308");
  expect_text("4.9406564584124654e-324", "4.9406564584124654e-324");
  expect_text("1e-400", "1e-400");
  expect_text("-1.50E-400", "-1.5e-400");
  expect_text("[1e-999999999, 0.01E-999999999]",
              "[1e-999999999,1e-1000000001]");
  /* Exponents past 64 bits: the carry and the borrow into their digits. */
  expect_text("1e-1000000000000000000000", "1e-1000000000000000000000");
  expect_text("0.01e-999999999999999999998", "1e-1000000000000000000000");
  expect_text("100e-1000000000000000000000", "1e-999999999999999999998");
  expect_text("-12.34e-99999999999999999999", "-1.234e-99999999999999999998");
  expect_text("1000e-10000000000000000000", "1e-9999999999999999997");
  /* Inside a document, members sorted as RFC 8785 sorts them. */
  expect_text("{\"b\":0.10000000000000001,\"a\":[1.0,9007199254740993]}",
              "{\"a\":[1,9007199254740993],\"b\":0.10000000000000001}");
}

/* Every number of the ECMAScript reference sequence is its own text. */
static void test_es6_numbers(void **state) {
  char path[4096], line[256];
  unsigned lines = 0;
  FILE *f;
  (void)state;
  snprintf(path, sizeof path, "%s/es6-numbers-10k.txt", vectors_dir);
  f = fopen(path, "r");
  if (f == NULL)
    fail_msg("cannot open %s", path);
  while (fgets(line, sizeof line, f) != NULL) {
    char *num = strchr(line, ',');
    assert_non_null(num);
    num++;
    num[strcspn(num, "\r\n")] = '\0';
    expect_text(num, num);
    lines++;
  }
  fclose(f);
  assert_int_equal(lines, 10000);
}

/* Ranges: what overflows a double is refused, as RFC 8785 refuses it; what
 * underflows is kept exactly, in time and memory of the text's size. */
static void test_number_range(void **state) {
  size_t n = 200000, off = 99, out_len = 99;
  char *s = malloc(n + 16), *out = NULL, fp[IDEM_FINGERPRINT_SIZE];
  char want[64];
  clock_t t0;
  (void)state;
  assert_non_null(s);
  assert_int_equal(
      idem__fingerprint_text("[1, 1e400]", 10, NULL, &out, &out_len, &off),
      IDEM_ERANGE);
  assert_null(out);
  assert_int_equal(out_len, 0);
  assert_int_equal(off, 4);
  assert_int_equal(idem_fingerprint("-1e400", 6, 1, fp), IDEM_ERANGE);
  assert_int_equal(idem_fingerprint("1e99999999999999999999", 22, 1, fp),
                   IDEM_ERANGE);
  /* A 1 followed by 200000 zeros overflows; behind "0." it underflows. */
  s[0] = '1';
  memset(s + 1, '0', n);
  assert_int_equal(idem_fingerprint(s, n + 1, 1, fp), IDEM_ERANGE);
  memcpy(s, "0.", 2);
  memset(s + 2, '0', n);
  s[n + 2] = '1';
  snprintf(want, sizeof want, "1e-%zu", n + 1);
  expect_text_n(s, n + 3, NULL, want);
  /* 200000 significant digits: kept, all of them. */
  for (size_t i = 0; i < n; i++)
    s[i] = (char)('1' + i % 9);
  memcpy(s + n, "e-200400", 8);
  out = NULL;
  assert_int_equal(idem__fingerprint_text(s, n + 8, NULL, &out, &out_len, &off),
                   IDEM_OK);
  assert_int_equal(out_len, n + 1 + strlen("e-401"));
  assert_memory_equal(out, "1.23456789123", 13);
  assert_string_equal(out + n + 1, "e-401");
  idem_free(out);
  /* An exponent of a billion costs no more than its digits. */
  t0 = clock();
  for (int i = 0; i < 1000; i++)
    assert_int_equal(idem_fingerprint("1e-999999999", 12, 1, fp), IDEM_OK);
  assert_true(clock() - t0 < 5 * CLOCKS_PER_SEC);
  free(s);
}

/* ------------------------------------------------------------------ */
/* Selected parts: fingerprint pointers                                 */
/* ------------------------------------------------------------------ */

static const char doc[] =
    "{\"user\":{\"id\":12345678901234567,\"name\":\"Ann\"},"
    "\"arr\":[1.0,0.10000000000000001],\"a/b\":1,\"m~n\":2,\"\":3,"
    "\"\\u0061\\u00e9\":4,\"a\\nb\":5}";

static void test_pointers_select(void **state) {
  static const char *const p1[] = {"/user/id", NULL};
  static const char *const p2[] = {"/arr/1", "/arr/0", NULL};
  static const char *const p3[] = {"/m~0n", "/a~1b", "/", NULL};
  static const char *const p4[] = {"/user", "/user/id", "/user", NULL};
  static const char *const p5[] = {"/arr/01",
                                   "/arr/-",
                                   "/arr/2",
                                   "/arr/1a",
                                   "/user/id/x",
                                   "/nope",
                                   "/arr/99999999999999999999999",
                                   NULL};
  static const char *const p6[] = {"/a\xc3\xa9", "/a\nb", NULL};
  static const char *const p7[] = {"", NULL};
  static const char *const p8[] = {"/\xee\x80\x80", "/\xf0\x9f\x98\x82", NULL};
  (void)state;
  expect_text_ptrs(doc, p1, "{\"/user/id\":12345678901234567}");
  expect_text_ptrs(doc, p2, "{\"/arr/0\":1,\"/arr/1\":0.10000000000000001}");
  expect_text_ptrs(doc, p3, "{\"/\":3,\"/a~1b\":1,\"/m~0n\":2}");
  /* A pointer named twice is one member. */
  expect_text_ptrs(doc, p4,
                   "{\"/user\":{\"id\":12345678901234567,\"name\":\"Ann\"},"
                   "\"/user/id\":12345678901234567}");
  /* Pointers that find nothing are left out. */
  expect_text_ptrs(doc, p5, "{}");
  /* Names are compared decoded; pointers are written as RFC 8785 writes
   * names. */
  expect_text_ptrs(doc, p6, "{\"/a\\nb\":5,\"/a\xc3\xa9\":4}");
  expect_text_ptrs(doc, p7,
                   "{\"\":{\"\":3,\"a\\nb\":5,\"a/b\":1,"
                   "\"arr\":[1,0.10000000000000001],\"a\xc3\xa9\":4,"
                   "\"m~n\":2,\"user\":{"
                   "\"id\":12345678901234567,\"name\":\"Ann\"}}}");
  /* Pointers sort by UTF-16 code units: U+1F602 before U+E000. */
  expect_text_ptrs("{\"\\ue000\":1,\"\\ud83d\\ude02\":2}", p8,
                   "{\"/\xf0\x9f\x98\x82\":2,\"/\xee\x80\x80\":1}");
  /* Inside arrays and through scalars. */
  {
    static const char *const q[] = {"/1/a", "/0/x", "/2", NULL};
    expect_text_ptrs(" [ 7 , {\"b\":[],\"a\":1e-400} ] ", q,
                     "{\"/1/a\":1e-400}");
  }
}

/* Checks a refused pointer list: the code and a detail naming the pointer. */
static void expect_bad_pointer(const char *json, const char *const *ptrs,
                               const char *detail) {
  char fp[IDEM_FINGERPRINT_SIZE] = "x";
  char *out = (char *)"sentinel";
  size_t out_len = 99;
  int rc = idem__request_fingerprint(json, strlen(json), ptrs, fp);
  if (rc != IDEM_EINVAL)
    fail_msg("pointers for '%s': got %s (%s), want IDEM_EINVAL", json,
             idem_rc_name(rc), idem_errmsg());
  assert_string_equal(fp, "");
  if (strstr(idem_errmsg(), detail) == NULL)
    fail_msg("detail '%s' does not say '%s'", idem_errmsg(), detail);
  assert_int_equal(
      idem__fingerprint_text(json, strlen(json), ptrs, &out, &out_len, NULL),
      IDEM_EINVAL);
  assert_null(out);
  assert_int_equal(out_len, 0);
}

static void test_pointers_malformed(void **state) {
  static const char *const none[] = {NULL};
  static const char *const no_slash[] = {"/user", "user", NULL};
  static const char *const bad_tilde[] = {"/a~2b", NULL};
  static const char *const end_tilde[] = {"/a~", NULL};
  /* Malformed after a part that finds nothing: still malformed. */
  static const char *const late[] = {"/nope/x~y", NULL};
  static const char *const not_utf8[] = {"/a\xff", NULL};
  char fp[IDEM_FINGERPRINT_SIZE];
  (void)state;
  expect_bad_pointer(doc, none, "empty");
  expect_bad_pointer(doc, no_slash,
                     "pointer 'user' is not an RFC 6901 JSON Pointer");
  expect_bad_pointer(doc, bad_tilde, "'~' must be followed by '0' or '1'");
  expect_bad_pointer(doc, end_tilde, "'~' must be followed by '0' or '1'");
  expect_bad_pointer(doc, late, "'/nope/x~y'");
  expect_bad_pointer(doc, not_utf8, "UTF-8");
  /* A document that is not JSON fails as JSON first. */
  assert_int_equal(idem__request_fingerprint("{\"a\":", 5, no_slash, fp),
                   IDEM_EJSON);
  assert_int_equal(idem__request_fingerprint("{\"a\":1,\"a\":2}", 13, NULL, fp),
                   IDEM_EDUPKEY);
  assert_int_equal(idem__request_fingerprint("[1e400]", 7, NULL, fp),
                   IDEM_ERANGE);
  assert_int_equal(idem__request_fingerprint(NULL, 3, NULL, fp), IDEM_EINVAL);
  assert_int_equal(idem__request_fingerprint("[]", 2, NULL, NULL), IDEM_EINVAL);
  assert_int_equal(idem__request_fingerprint(NULL, 0, NULL, fp), IDEM_EJSON);
}

/* ------------------------------------------------------------------ */
/* Fingerprints of 0.2                                                  */
/* ------------------------------------------------------------------ */

/* Splits line at TABs into at most max fields; returns their count. */
static int split_tabs(char *line, char **fields, int max) {
  int n = 0;
  fields[n++] = line;
  for (char *p = line; (p = strchr(p, '\t')) != NULL && n < max;) {
    *p++ = '\0';
    fields[n++] = p;
  }
  return n;
}

/* Every request whose numbers are faithful keeps 0.2's fingerprint: whole
 * requests, the RFC 8785 inputs, the parts pointers select and the 10,000
 * numbers of the ECMAScript sequence. */
static void test_fingerprints_of_0_2(void **state) {
  FILE *f = fopen(vectors_0_2, "r");
  char *line = NULL;
  size_t cap = 0;
  int whole = 0, files = 0, pointers = 0, es6 = 0;
  (void)state;
  if (f == NULL)
    fail_msg("cannot open %s", vectors_0_2);
  while (getline(&line, &cap, f) > 0) {
    char *fld[64], fp[IDEM_FINGERPRINT_SIZE];
    char sha_of_all[IDEM_FINGERPRINT_SIZE];
    int n;
    line[strcspn(line, "\n")] = '\0';
    if (line[0] == '#' || line[0] == '\0')
      continue;
    n = split_tabs(line, fld, 64);
    assert_true(n >= 3);
    assert_int_equal(strlen(fld[1]), 64);
    if (strcmp(fld[0], "whole") == 0) {
      assert_int_equal(n, 3);
      fingerprint_of(fld[2], fp);
      if (strcmp(fp, fld[1]) != 0)
        fail_msg("'%s': fingerprint %s, 0.2's %s", fld[2], fp, fld[1]);
      assert_int_equal(
          idem__request_fingerprint(fld[2], strlen(fld[2]), NULL, fp), IDEM_OK);
      assert_string_equal(fp, fld[1]);
      whole++;
    } else if (strcmp(fld[0], "file") == 0) {
      char path[4096];
      size_t len;
      char *data;
      snprintf(path, sizeof path, "%s/%s", vectors_dir, fld[2]);
      data = read_file(path, &len);
      assert_int_equal(idem_fingerprint(data, len, 1, fp), IDEM_OK);
      if (strcmp(fld[2], "input/values.json") == 0) {
        /* Its 333333333.33333329 is not faithful: the fingerprint is of
         * the canonical form with that number exact, no longer 0.2's. */
        char sha[IDEM_FINGERPRINT_SIZE], *want, *at, *exact;
        size_t want_len, exact_len;
        static const char canon_num[] = "333333333.3333333,";
        static const char exact_num[] = "333333333.33333329,";
        snprintf(path, sizeof path, "%s/output/values.json", vectors_dir);
        want = read_file(path, &want_len);
        at = memmem(want, want_len, canon_num, strlen(canon_num));
        assert_non_null(at);
        exact = malloc(want_len + 2);
        assert_non_null(exact);
        exact_len = (size_t)(at - want);
        memcpy(exact, want, exact_len);
        memcpy(exact + exact_len, exact_num, strlen(exact_num));
        exact_len += strlen(exact_num);
        memcpy(exact + exact_len, at + strlen(canon_num),
               want_len - (size_t)(at - want) - strlen(canon_num));
        exact_len += want_len - (size_t)(at - want) - strlen(canon_num);
        assert_int_equal(exact_len, want_len + 1);
        assert_int_equal(idem_sha256_hex(exact, exact_len, sha), IDEM_OK);
        assert_string_equal(fp, sha);
        assert_string_not_equal(fp, fld[1]);
        free(exact);
        free(want);
      } else if (strcmp(fp, fld[1]) != 0) {
        fail_msg("%s: fingerprint %s, 0.2's %s", fld[2], fp, fld[1]);
      }
      assert_int_equal(idem__request_fingerprint(data, len, NULL, sha_of_all),
                       IDEM_OK);
      assert_string_equal(sha_of_all, fp);
      free(data);
      files++;
    } else if (strcmp(fld[0], "pointers") == 0) {
      const char *ptrs[64];
      int rc;
      for (int i = 3; i < n; i++)
        ptrs[i - 3] = fld[i];
      ptrs[n - 3] = NULL;
      rc = idem__request_fingerprint(fld[2], strlen(fld[2]), ptrs, fp);
      if (rc != IDEM_OK)
        fail_msg("'%s' with %d pointers: %s: %s", fld[2], n - 3,
                 idem_rc_name(rc), idem_errmsg());
      if (strcmp(fp, fld[1]) != 0)
        fail_msg("'%s' with pointers from '%s' (%d): fingerprint %s, 0.2's "
                 "%s",
                 fld[2], fld[3], n - 3, fp, fld[1]);
      pointers++;
    } else if (strcmp(fld[0], "es6") == 0) {
      char path[4096], l[256], *all;
      size_t len = 0;
      int count = 0;
      FILE *e;
      snprintf(path, sizeof path, "%s/es6-numbers-10k.txt", vectors_dir);
      e = fopen(path, "r");
      assert_non_null(e);
      all = malloc((size_t)atoi(fld[2]) * 65 + 1);
      assert_non_null(all);
      while (fgets(l, sizeof l, e) != NULL) {
        char *num = strchr(l, ',') + 1;
        num[strcspn(num, "\r\n")] = '\0';
        fingerprint_of(num, fp);
        len += (size_t)sprintf(all + len, "%s\n", fp);
        count++;
      }
      fclose(e);
      assert_int_equal(count, atoi(fld[2]));
      assert_int_equal(idem_sha256_hex(all, len, fp), IDEM_OK);
      assert_string_equal(fp, fld[1]);
      free(all);
      es6++;
    } else {
      fail_msg("unknown line kind '%s'", fld[0]);
    }
  }
  free(line);
  fclose(f);
  /* What the file held when it was made. */
  assert_int_equal(whole, 23);
  assert_int_equal(files, 6);
  assert_int_equal(pointers, 21);
  assert_int_equal(es6, 1);
}

/* idem_fingerprint_json(): both forms from one parse, each the same as
 * idem_fingerprint() and idem_canonicalize() give apart. */
static void test_fingerprint_json(void **state) {
  static const char *const requests[] = {
      "{}",
      "[]",
      "\"text\"",
      "{\"project\":\"demo-agent\",\"title\":\"Investigate\",\"priority\":\"normal\"}",
      "{ \"b\" : 2, \"a\" : [1, -5, 0, 123456789012345] }",
      "{\"n\":1234567890123456}",        /* 16 digits: the forms differ */
      "{\"n\":12345678901234567}",       /* a double cannot hold it */
      "{\"n\":-0.0}",
      "{\"n\":1.5,\"m\":1e3,\"k\":10E-1}",
      "{\"s\":\"1.5 and 12345678901234567 in a string\",\"t\":\"\\\"2e5\"}",
      "{\"\\u00e9\":\"\\ud83d\\ude00\",\"a\\\"1.5\":7}",
      "[0.1, 0.10000000000000001, 5e-324, 1.7976931348623157e308]",
      "{\"deep\":[[[[{\"x\":[1,2,{\"y\":3.25}]}]]]]}",
  };
  (void)state;
  for (size_t i = 0; i < sizeof requests / sizeof requests[0]; i++) {
    const char *r = requests[i];
    char fp[IDEM_FINGERPRINT_SIZE], want_fp[IDEM_FINGERPRINT_SIZE];
    char *canon = NULL, *want = NULL;
    size_t canon_len = 7, want_len = 0;
    assert_int_equal(idem_fingerprint_json(r, strlen(r), fp, &canon, &canon_len),
                     IDEM_OK);
    fingerprint_of(r, want_fp);
    assert_int_equal(idem_canonicalize(r, strlen(r), NULL, &want, &want_len, NULL),
                     IDEM_OK);
    if (strcmp(fp, want_fp) != 0 || canon_len != want_len ||
        memcmp(canon, want, want_len) != 0 || canon[canon_len] != '\0')
      fail_msg("'%s': fingerprint %s / %s, canonical '%s' / '%s'", r, fp,
               want_fp, canon, want);
    idem_free(canon);
    idem_free(want);
  }
  /* Refused as idem_canonicalize() refuses, with nothing left to free. */
  {
    static const char *const bad[] = {"{\"a\":", "[1,]", "{\"a\":1}x", "1e400",
                                      ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      char fp[IDEM_FINGERPRINT_SIZE] = "x";
      char *canon = (char *)"left", *want = NULL;
      size_t canon_len = 9, want_len = 0;
      int want_rc = idem_canonicalize(bad[i], strlen(bad[i]), NULL, &want,
                                      &want_len, NULL);
      assert_int_not_equal(want_rc, IDEM_OK);
      assert_int_equal(idem_fingerprint_json(bad[i], strlen(bad[i]), fp,
                                             &canon, &canon_len),
                       want_rc);
      assert_null(canon);
      assert_int_equal(canon_len, 0);
      assert_string_equal(fp, "");
    }
  }
  {
    char fp[IDEM_FINGERPRINT_SIZE];
    char *canon = NULL;
    size_t n = 0;
    assert_int_equal(idem_fingerprint_json(NULL, 2, fp, &canon, &n), IDEM_EINVAL);
    assert_int_equal(idem_fingerprint_json("{}", 2, NULL, &canon, &n), IDEM_EINVAL);
    assert_int_equal(idem_fingerprint_json("{}", 2, fp, NULL, &n), IDEM_EINVAL);
    assert_int_equal(idem_fingerprint_json("{}", 2, fp, &canon, NULL), IDEM_EINVAL);
    assert_null(canon);
  }
}

/* ------------------------------------------------------------------ */
/* Lone surrogates                                                      */
/* ------------------------------------------------------------------ */

/* With IDEM_FP_LONE_SURROGATES the fingerprint's text of in is want, and
 * the fingerprint its SHA-256. */
static void expect_lone(const char *in, const char *want) {
  char *out = NULL, fp[IDEM_FINGERPRINT_SIZE], sha[IDEM_FINGERPRINT_SIZE];
  size_t out_len = 0, n = strlen(in);
  int rc = idem__canon_text(in, n, NULL, IDEM__CANON_EXACT | IDEM__CANON_LONE,
                            &out, &out_len, NULL);
  if (rc != IDEM_OK)
    fail_msg("input '%s': %s: %s", in, idem_rc_name(rc), idem_errmsg());
  if (out_len != strlen(want) || memcmp(out, want, out_len) != 0)
    fail_msg("input '%s': got '%s', want '%s'", in, out, want);
  assert_int_equal(idem_sha256_hex(out, out_len, sha), IDEM_OK);
  assert_int_equal(
      idem_fingerprint_with(in, n, IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fp),
      IDEM_OK);
  assert_string_equal(fp, sha);
  idem_free(out);
}

/*
 * A lone surrogate escape, which JavaScript's JSON.stringify writes for a
 * string cut between the halves of a pair, is one UTF-16 code unit of the
 * string: written \udxxx in lowercase, as ECMAScript's JSON.stringify
 * writes it (so that a client canonicalising with JSON.stringify agrees),
 * and ordered among member names by its code unit. The texts wanted here
 * are what JSON.stringify makes of the same strings, members sorted by
 * UTF-16 code units (RFC 8785's order, and JavaScript's default sort).
 */
static void test_lone_surrogates(void **state) {
  char fp[IDEM_FINGERPRINT_SIZE], fp2[IDEM_FINGERPRINT_SIZE];
  (void)state;
  expect_lone("{\"b\":\"\\uD83D\",\"a\":\"x\\udc00y\"}",
              "{\"a\":\"x\\udc00y\",\"b\":\"\\ud83d\"}");
  expect_lone("\"ok \\ud83d\"", "\"ok \\ud83d\"");
  expect_lone("\"\\uDbFf\"", "\"\\udbff\"");
  /* A pair is one code point, written as UTF-8; a high half followed by
   * anything but a low one is lone, and so is a low half on its own. */
  expect_lone("[\"\\ud83d\\ude00\",\"\\ude00\\ud83d\",\"\\ud800\\u0041\"]",
              "[\"\xf0\x9f\x98\x80\",\"\\ude00\\ud83d\",\"\\ud800A\"]");
  expect_lone("[\"\\ud800\\ud800\\udc00\",\"\\udbff\\udfff\\udc00\"]",
              "[\"\\ud800\xf0\x90\x80\x80\",\"\xf4\x8f\xbf\xbf\\udc00\"]");
  expect_lone("[\"\\ud800\\\\udc00\",\"\\ud800\\n\"]",
              "[\"\\ud800\\\\udc00\",\"\\ud800\\n\"]");
  /* Member names in UTF-16 code units: U+D7FF, then the lone D800 (a
   * prefix of the next), the pair D800 DC00, the lone DBFF, U+E000. By
   * code points the lone DBFF would come before U+10000. */
  expect_lone("{\"\\ue000\":1,\"\\udbff\":2,\"\\ud800\\udc00\":3,"
              "\"\\ud7ff\":4,\"\\ud800\":5}",
              "{\"\xed\x9f\xbf\":4,\"\\ud800\":5,\"\xf0\x90\x80\x80\":3,"
              "\"\\udbff\":2,\"\xee\x80\x80\":1}");
  expect_lone("{\"a\\udc00\":1,\"a\":2,\"a\\ud800x\":3}",
              "{\"a\":2,\"a\\ud800x\":3,\"a\\udc00\":1}");
  /* Numbers stay exact. */
  expect_lone("{\"s\":\"\\ud83d\",\"n\":12345678901234567,\"m\":1.0}",
              "{\"m\":1,\"n\":12345678901234567,\"s\":\"\\ud83d\"}");

  /* Two lone surrogates are two strings, and neither is U+FFFD. */
  {
    static const char *const apart[] = {"\"\\ud83d\"", "\"\\ud83e\"",
                                        "\"\\ufffd\"", "\"\\ud83d\\ude00\"",
                                        "\"\\ude00\"", "\"\""};
    char fps[6][IDEM_FINGERPRINT_SIZE];
    for (size_t i = 0; i < 6; i++) {
      assert_int_equal(
          idem_fingerprint_with(apart[i], strlen(apart[i]),
                                IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fps[i]),
          IDEM_OK);
      for (size_t j = 0; j < i; j++)
        if (strcmp(fps[i], fps[j]) == 0)
          fail_msg("%s and %s share a fingerprint", apart[i], apart[j]);
    }
  }
  /* The same code unit twice is a duplicate name, however it is written. */
  {
    const char *dup = "{\"\\ud800\":1,\"\\uD800\":2}";
    assert_int_equal(
        idem_fingerprint_with(dup, strlen(dup),
                              IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fp),
        IDEM_EDUPKEY);
  }
  /* A surrogate's bytes in UTF-8 (ED A0 80) are no UTF-8: still refused. */
  assert_int_equal(idem_fingerprint_with("\"\xed\xa0\x80\"", 5,
                                         IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES,
                                         fp),
                   IDEM_EUTF8);
  /* Without the flag, a lone surrogate is refused as before, by the
   * fingerprint and by RFC 8785's canonical form. */
  assert_int_equal(idem_fingerprint("\"\\ud83d\"", 8, 1, fp), IDEM_EUTF8);
  assert_int_equal(idem_fingerprint_with("\"\\ud83d\"", 8, IDEM_FP_JSON, fp),
                   IDEM_EUTF8);
  {
    char *out = NULL;
    size_t n = 0;
    assert_int_equal(idem_canonicalize("\"\\ud83d\"", 8, NULL, &out, &n, NULL),
                     IDEM_EUTF8);
    assert_null(out);
    /* The canonical form kept for operators (numbers as doubles). */
    const char *kept = "{\"n\":1.0,\"s\":\"\\uD83D\"}";
    assert_int_equal(idem__canon_text(kept, strlen(kept), NULL,
                                      IDEM__CANON_LONE, &out, &n, NULL),
                     IDEM_OK);
    assert_string_equal(out, "{\"n\":1,\"s\":\"\\ud83d\"}");
    idem_free(out);
  }
  /* A text without lone surrogates has the fingerprint it always had;
   * without IDEM_FP_JSON the bytes are hashed. */
  {
    const char *r = "{\"b\":[1.0,\"\\u00e9\\ud83d\\ude00\"],\"a\":null}";
    assert_int_equal(idem_fingerprint(r, strlen(r), 1, fp), IDEM_OK);
    assert_int_equal(
        idem_fingerprint_with(r, strlen(r),
                              IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fp2),
        IDEM_OK);
    assert_string_equal(fp, fp2);
    assert_int_equal(idem_fingerprint_with(r, strlen(r), IDEM_FP_JSON, fp2),
                     IDEM_OK);
    assert_string_equal(fp, fp2);
    assert_int_equal(idem_sha256_hex(r, strlen(r), fp), IDEM_OK);
    assert_int_equal(idem_fingerprint_with(r, strlen(r), 0, fp2), IDEM_OK);
    assert_string_equal(fp, fp2);
  }
  /* Flags that mean nothing. */
  assert_int_equal(
      idem_fingerprint_with("\"x\"", 3, IDEM_FP_LONE_SURROGATES, fp),
      IDEM_EINVAL);
  assert_string_equal(fp, "");
  assert_int_equal(idem_fingerprint_with("\"x\"", 3, 4, fp), IDEM_EINVAL);
  assert_int_equal(idem_fingerprint_with(NULL, 3, IDEM_FP_JSON, fp),
                   IDEM_EINVAL);
  assert_int_equal(idem_fingerprint_with("\"x\"", 3, IDEM_FP_JSON, NULL),
                   IDEM_EINVAL);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equal_values_share),
      cmocka_unit_test(test_distinct_values_differ),
      cmocka_unit_test(test_accounts),
      cmocka_unit_test(test_number_text),
      cmocka_unit_test(test_es6_numbers),
      cmocka_unit_test(test_number_range),
      cmocka_unit_test(test_pointers_select),
      cmocka_unit_test(test_pointers_malformed),
      cmocka_unit_test(test_fingerprints_of_0_2),
      cmocka_unit_test(test_fingerprint_json),
      cmocka_unit_test(test_lone_surrogates),
  };
  if (argc != 3) {
    fprintf(stderr, "usage: %s VECTORS_DIR FINGERPRINTS_0_2\n", argv[0]);
    return 2;
  }
  vectors_dir = argv[1];
  vectors_0_2 = argv[2];
  return cmocka_run_group_tests(tests, NULL, NULL);
}
