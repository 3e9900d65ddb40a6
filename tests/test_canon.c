/* test_canon.c -- RFC 8785 canonical JSON (lib/canon.c) and fingerprints.
 *
 * Usage: test_canon VECTORS_DIR, the directory holding input/ and output/
 * (shared/vectors/jcs).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"

static const char *vectors_dir;

/* ------------------------------------------------------------------ */
/* Helpers                                                              */
/* ------------------------------------------------------------------ */

/* Canonicalises n bytes with the given limits and checks the exact output. */
static void expect_canon_n(const char *in, size_t n,
                           const idem_canon_limits *limits, const char *want,
                           size_t want_len) {
  char *out = NULL;
  size_t out_len = 99, off = 99;
  int rc = idem_canonicalize(in, n, limits, &out, &out_len, &off);
  if (rc != IDEM_OK)
    fail_msg("input '%.*s': %s: %s", (int)n, in, idem_rc_name(rc),
             idem_errmsg());
  assert_non_null(out);
  assert_int_equal(out_len, want_len);
  assert_memory_equal(out, want, want_len);
  assert_int_equal(out[out_len], '\0');
  idem_free(out);
}

static void expect_canon(const char *in, const char *want) {
  expect_canon_n(in, strlen(in), NULL, want, strlen(want));
}

/* Checks a rejection: the code, the offset, the outputs cleared and the
 * offset named in the detail. */
static void expect_reject_n(const char *in, size_t n,
                            const idem_canon_limits *limits, int want_rc,
                            size_t want_off) {
  char *out = (char *)"sentinel";
  size_t out_len = 99, off = 99;
  char at[64];
  int rc = idem_canonicalize(in, n, limits, &out, &out_len, &off);
  if (rc != want_rc)
    fail_msg("input '%.*s': got %s (%s), want %s", (int)n, in, idem_rc_name(rc),
             idem_errmsg(), idem_rc_name(want_rc));
  assert_null(out);
  assert_int_equal(out_len, 0);
  if (off != want_off)
    fail_msg("input '%.*s': offset %zu, want %zu (%s)", (int)n, in, off,
             want_off, idem_errmsg());
  snprintf(at, sizeof at, "at byte %zu: ", want_off);
  if (strncmp(idem_errmsg(), at, strlen(at)) != 0)
    fail_msg("detail '%s' does not start with '%s'", idem_errmsg(), at);
}

static void expect_reject(const char *in, int want_rc, size_t want_off) {
  expect_reject_n(in, strlen(in), NULL, want_rc, want_off);
}

/* Reads a whole file; fails the test when it cannot. */
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

/* A string of depth '[' followed by depth ']'. */
static char *nested_arrays(int depth, size_t *len) {
  char *s = malloc((size_t)depth * 2 + 1);
  assert_non_null(s);
  memset(s, '[', (size_t)depth);
  memset(s + depth, ']', (size_t)depth);
  s[depth * 2] = '\0';
  *len = (size_t)depth * 2;
  return s;
}

/* depth objects nested, each with its members out of order:
 * {"b":1,"a":{"b":1,"a":...{}}}, and (sorted) its canonical form:
 * {"a":{"a":...{},"b":1},"b":1}. */
static void nested_objects(int depth, char **in, char **canonical) {
  size_t cap = (size_t)depth * 12 + 3, i = 0, j = 0;
  char *s = malloc(cap), *c = malloc(cap);
  assert_non_null(s);
  assert_non_null(c);
  for (int d = 0; d < depth; d++) {
    memcpy(s + i, "{\"b\":1,\"a\":", 11);
    i += 11;
    memcpy(c + j, "{\"a\":", 5);
    j += 5;
  }
  memcpy(s + i, "{}", 2);
  memcpy(c + j, "{}", 2);
  i += 2;
  j += 2;
  for (int d = 0; d < depth; d++) {
    s[i++] = '}';
    memcpy(c + j, ",\"b\":1}", 7);
    j += 7;
  }
  s[i] = c[j] = '\0';
  *in = s;
  *canonical = c;
}

/* ------------------------------------------------------------------ */
/* RFC 8785 vectors                                                     */
/* ------------------------------------------------------------------ */

static void test_vectors(void **state) {
  char dir[4096];
  struct dirent *de;
  DIR *d;
  int files = 0;
  (void)state;

  snprintf(dir, sizeof dir, "%s/input", vectors_dir);
  d = opendir(dir);
  if (d == NULL)
    fail_msg("cannot open %s", dir);
  while ((de = readdir(d)) != NULL) {
    char in_path[8192], out_path[8192];
    char *in, *want, *out = NULL;
    size_t in_len, want_len, out_len = 0, off = 0;
    int rc;
    if (de->d_name[0] == '.')
      continue;
    snprintf(in_path, sizeof in_path, "%s/input/%s", vectors_dir, de->d_name);
    snprintf(out_path, sizeof out_path, "%s/output/%s", vectors_dir,
             de->d_name);
    in = read_file(in_path, &in_len);
    want = read_file(out_path, &want_len);
    rc = idem_canonicalize(in, in_len, NULL, &out, &out_len, &off);
    if (rc != IDEM_OK)
      fail_msg("%s: %s: %s", de->d_name, idem_rc_name(rc), idem_errmsg());
    if (out_len != want_len || memcmp(out, want, want_len) != 0)
      fail_msg("%s: got '%s', want '%.*s'", de->d_name, out, (int)want_len,
               want);
    idem_free(out);
    free(in);
    free(want);
    files++;
  }
  closedir(d);
  /* The set ships six files; fewer means the directory is wrong. */
  assert_true(files >= 6);
}

/* ------------------------------------------------------------------ */
/* Serialisation                                                        */
/* ------------------------------------------------------------------ */

static void test_whitespace_and_scalars(void **state) {
  (void)state;
  expect_canon(" \t\r\n[ 1 , { } , [ ] , \"\" ] \n", "[1,{},[],\"\"]");
  expect_canon("true", "true");
  expect_canon(" false ", "false");
  expect_canon("null", "null");
  expect_canon("\"a\"", "\"a\"");
  expect_canon(" 12 ", "12");
}

static void test_numbers(void **state) {
  (void)state;
  expect_canon("[-0, 1E2, 1e-7, 0.1, 1e21, 1e20, 4.50, 2e-3, -0.0]",
               "[0,100,1e-7,0.1,1e+21,100000000000000000000,4.5,0.002,0]");
  /* Underflow reads as zero, as in ECMAScript's JSON.parse. */
  expect_canon("[1e-400, -1e-400]", "[0,0]");
  expect_canon("1.7976931348623157e308", "1.7976931348623157e+308");
  expect_canon("123456789012345678901234567890", "1.2345678901234568e+29");
}

static void test_string_escapes(void **state) {
  (void)state;
  /* The short escapes, \u00XX in lowercase for other controls, and
   * everything else (DEL, '/', non-ASCII) as literal UTF-8. */
  expect_canon("\"\\u0001\\u001F\\b\\f\\n\\r\\t\\\"\\\\\\/\\u007f\\u00e9\"",
               "\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\x7f\xc3\xa9\"");
  expect_canon("\"\\u0000x\"", "\"\\u0000x\"");
  expect_canon("\"\\u20ac\xe2\x82\xac\"", "\"\xe2\x82\xac\xe2\x82\xac\"");
}

static void test_member_order(void **state) {
  (void)state;
  expect_canon("{\"b\":1,\"a\":2,\"\":3,\"aa\":4,\"B\":5}",
               "{\"\":3,\"B\":5,\"a\":2,\"aa\":4,\"b\":1}");
  expect_canon("{\"z\":{\"y\":1,\"x\":[{\"d\":1,\"c\":2}]},\"a\":null}",
               "{\"a\":null,\"z\":{\"x\":[{\"c\":2,\"d\":1}],\"y\":1}}");
}

/*
 * UTF-16 order puts U+1F602 (the pair D83D DE02) before U+E000, although its
 * UTF-8 bytes (F0 ...) sort after U+E000's (EE ...).
 */
static void test_utf16_order(void **state) {
  (void)state;
  expect_canon("{\"\\ue000\":1,\"\\ud83d\\ude02\":2}",
               "{\"\xf0\x9f\x98\x82\":2,\"\xee\x80\x80\":1}");
  expect_canon("{\"\xf0\x9f\x98\x82\":2,\"\xee\x80\x80\":1}",
               "{\"\xf0\x9f\x98\x82\":2,\"\xee\x80\x80\":1}");
  expect_canon("{\"\xee\x80\x80\":1,\"\xf0\x9f\x98\x82\":2}",
               "{\"\xf0\x9f\x98\x82\":2,\"\xee\x80\x80\":1}");
  /* Below U+D800 code point order holds: U+D7FF before U+10000. */
  expect_canon(
      "{\"\\ud800\\udc00\":1,\"\\ud7ff\":2,\"\\uffff\":3}",
      "{\"\xed\x9f\xbf\":2,\"\xf0\x90\x80\x80\":1,\"\xef\xbf\xbf\":3}");
  /* A prefix sorts first, also inside multi-byte characters. */
  expect_canon("{\"\xc3\xa9x\":1,\"\xc3\xa9\":2}",
               "{\"\xc3\xa9\":2,\"\xc3\xa9x\":1}");
}

/* Member names may contain U+0000, which jansson alone refuses. */
static void test_nul_in_member_names(void **state) {
  static const char want[] = "{\"a\":3,\"a\\u0000\":2,\"a\\u0000b\":4,\"b\":1}";
  (void)state;
  expect_canon("{\"b\":1,\"a\\u0000\":2,\"a\":3,\"a\\u0000b\":4}", want);
  expect_canon("{\"a\\u0000b\":1,\"a\\u0000c\":2}",
               "{\"a\\u0000b\":1,\"a\\u0000c\":2}");
  /* Other names using the first private-use code point do not collide. */
  expect_canon(
      "{\"\\ue000\":1,\"\\u0000\":2,\"x\":\"\\u0000\\ue000\"}",
      "{\"\\u0000\":2,\"x\":\"\\u0000\xee\x80\x80\",\"\xee\x80\x80\":1}");
  expect_canon("{\"\xee\x80\x80\":1,\"\\u0000\\ue001\":2}",
               "{\"\\u0000\xee\x80\x81\":2,\"\xee\x80\x80\":1}");
  /* An escaped backslash before "u0000" is no NUL. */
  expect_canon("{\"\\\\u0000\":1}", "{\"\\\\u0000\":1}");
  expect_reject("{\"a\\u0000\":1,\"a\\u0000\":2}", IDEM_EDUPKEY, 13);
}

/* Appends {"\uXXXX":0, for every code point in [lo, hi] to s at *n. */
static void append_names(char *s, size_t *n, long lo, long hi) {
  for (long c = lo; c <= hi; c++)
    *n += (size_t)sprintf(s + *n, "\"\\u%04lx\":0,", c);
}

/* Names with U+0000 beside names that use every other BMP code point are
 * still told apart. (While jansson parsed, U+0000 in names stood for a code
 * point that no name used; with the whole private-use area taken it came
 * from elsewhere, and with every candidate taken the text was refused.) */
static void test_nul_in_member_names_crowded(void **state) {
  size_t n = 0;
  char *s = malloc(1024 * 1024), *out = NULL;
  size_t out_len = 0, off = 99;
  (void)state;
  assert_non_null(s);
  s[n++] = '{';
  append_names(s, &n, 0xE000, 0xFFFD);
  n += (size_t)sprintf(s + n, "\"a\\u0000\":1}");
  assert_int_equal(idem_canonicalize(s, n, NULL, &out, &out_len, &off),
                   IDEM_OK);
  assert_non_null(strstr(out, "{\"a\\u0000\":1,"));
  idem_free(out);

  n -= strlen("\"a\\u0000\":1}");
  append_names(s, &n, 0x0800, 0xD7FF);
  n += (size_t)sprintf(s + n, "\"a\\u0000\":1,\"\\u0000\":2}");
  assert_int_equal(idem_canonicalize(s, n, NULL, &out, &out_len, &off),
                   IDEM_OK);
  assert_non_null(out);
  assert_non_null(
      strstr(out, "{\"\\u0000\":2,\"a\\u0000\":1,\"\xe0\xa0\x80\":0,"));
  /* U+D7FF, then the private-use area: UTF-16 order. */
  assert_non_null(strstr(out, "\"\xed\x9f\xbf\":0,\"\xee\x80\x80\":0,"));
  idem_free(out);
  free(s);
}

/* ------------------------------------------------------------------ */
/* Rejections                                                           */
/* ------------------------------------------------------------------ */

static void test_duplicate_names(void **state) {
  (void)state;
  expect_reject("{\"a\":1,\"b\":2,\"a\":3}", IDEM_EDUPKEY, 13);
  expect_reject("{\"x\":{\"k\":1, \"k\" :2}}", IDEM_EDUPKEY, 13);
  /* Escapes are decoded before names are compared. */
  expect_reject("{\"a\":1,\"\\u0061\":2}", IDEM_EDUPKEY, 7);
  expect_reject("{\"a\\\"\":1,\"a\\\"\":2}", IDEM_EDUPKEY, 9);
  /* A name that is itself malformed is no duplicate: the first problem is
   * its bad escape. */
  expect_reject("{\"a\":1,\"a\\u\"", IDEM_EJSON, 9);
  expect_reject("{\"a\":1,\"a\\u\":2}", IDEM_EJSON, 9);
}

static void test_invalid_utf8(void **state) {
  (void)state;
  expect_reject("[\"ab\xff\"]", IDEM_EUTF8, 4);
  /* An overlong '/', a truncated euro sign, an encoded surrogate. */
  expect_reject("[\"\xc0\xaf\"]", IDEM_EUTF8, 2);
  expect_reject("[\"x\xe2\x82\"]", IDEM_EUTF8, 3);
  expect_reject("[\"\xed\xa0\x80\"]", IDEM_EUTF8, 2);
  expect_reject("\"\xe2\x82", IDEM_EUTF8, 1);
  expect_reject("{\"\xff\":1}", IDEM_EUTF8, 2);
  expect_reject("[1,\xff]", IDEM_EUTF8, 3);
}

static void test_lone_surrogates(void **state) {
  (void)state;
  expect_reject("[\"ab\\ud800\"]", IDEM_EUTF8, 4);
  expect_reject("{\"k\":\"\\udc00\"}", IDEM_EUTF8, 6);
  expect_reject("[\"\\ud800\\u0041\"]", IDEM_EUTF8, 2);
  expect_reject("[\"\\udc00\\ud800\"]", IDEM_EUTF8, 2);
  expect_reject("{\"\\uDBFF\":1}", IDEM_EUTF8, 2);
}

static void test_depth(void **state) {
  idem_canon_limits small = {0, 3};
  idem_canon_limits huge = {0, 100000};
  size_t len;
  char *s;
  (void)state;

  /* The default limit, 256: exactly at it is accepted. */
  s = nested_arrays(256, &len);
  expect_canon_n(s, len, NULL, s, len);
  free(s);
  s = nested_arrays(257, &len);
  expect_reject_n(s, len, NULL, IDEM_EDEPTH, 256);
  free(s);

  expect_canon_n("[{\"a\":[1]}]", 11, &small, "[{\"a\":[1]}]", 11);
  expect_reject_n("[{\"a\":[[1]]}]", 13, &small, IDEM_EDEPTH, 7);
  /* Brackets inside strings do not nest. */
  expect_canon_n("[\"[[[[{{{{\"]", 12, &small, "[\"[[[[{{{{\"]", 12);
  /* A syntax error before the limit is reached is reported first. */
  expect_reject_n("[x[[[[[", 7, &small, IDEM_EJSON, 2);

  /* Limits beyond what the parser supports are lowered to 2047. */
  s = nested_arrays(2047, &len);
  expect_canon_n(s, len, &huge, s, len);
  free(s);
  s = nested_arrays(3000, &len);
  expect_reject_n(s, len, &huge, IDEM_EDEPTH, 2047);
  free(s);

  /* Objects nested past the few whose members the parser keeps track of
   * without allocating (16), each sorted on its own: up to the limit
   * (255 with the empty innermost one makes 256 levels), then one too
   * many. */
  for (int depth = 1; depth <= 255; depth += depth < 40 ? 1 : 107) {
    char *in, *want;
    nested_objects(depth, &in, &want);
    expect_canon(in, want);
    free(in);
    free(want);
  }
  {
    char *in, *want;
    nested_objects(256, &in, &want);
    expect_reject(in, IDEM_EDEPTH, 256 * 11);
    free(in);
    free(want);
  }
}

static void test_malformed(void **state) {
  (void)state;
  /* Truncated input: the offset is the end. */
  expect_reject("{\"a\":[1,2", IDEM_EJSON, 9);
  expect_reject("{\"a\":\"abc", IDEM_EJSON, 9);
  expect_reject("[", IDEM_EJSON, 1);
  /* Trailing data: the offset is where it starts. */
  expect_reject("{} x", IDEM_EJSON, 3);
  expect_reject("[1]]", IDEM_EJSON, 3);
  expect_reject("1 2", IDEM_EJSON, 2);
  expect_reject("\"a\" \"b\"", IDEM_EJSON, 4);
  expect_reject("{\"a\":\"}\"} {", IDEM_EJSON, 10);
  /* Empty input and whitespace alone. */
  expect_reject("", IDEM_EJSON, 0);
  expect_reject(" \n", IDEM_EJSON, 2);
  /* Grammar jansson enforces; the offset is where it gave up. */
  expect_reject("01", IDEM_EJSON, 1);
  expect_reject("NaN", IDEM_EJSON, 3);
  expect_reject("[1,]", IDEM_EJSON, 4);
  expect_reject("{\"a\" 1}", IDEM_EJSON, 6);
  expect_reject("[\"a\nb\"]", IDEM_EJSON, 3);
  expect_reject_n("[1]\0", 4, NULL, IDEM_EJSON, 3);
  /* A NUL byte is no whitespace, after a number or a literal either. */
  expect_reject_n("1\0", 2, NULL, IDEM_EJSON, 1);
  expect_reject_n("[12.5\0]", 7, NULL, IDEM_EJSON, 6);
  expect_reject_n("[true\0]", 7, NULL, IDEM_EJSON, 6);
}

/* A length that counts the terminating NUL leaves a NUL byte after the
 * value: the detail says so, not merely "unexpected data". */
static void test_nul_after_value(void **state) {
  static const char *const texts[] = {"[1]", "1", "{} ", "\"a\"", "true"};
  char want[128];
  (void)state;
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    size_t n = strlen(texts[i]);
    expect_reject_n(texts[i], n + 1, NULL, IDEM_EJSON, n);
    snprintf(want, sizeof want,
             "at byte %zu: a NUL byte after the JSON value (was the "
             "terminating NUL counted in the length?)",
             n);
    assert_string_equal(idem_errmsg(), want);
  }
  /* A NUL with more after it is named too, without the guess. */
  expect_reject_n("[1]\0x", 5, NULL, IDEM_EJSON, 3);
  assert_string_equal(idem_errmsg(),
                      "at byte 3: a NUL byte after the JSON value");
  /* Other trailing data keeps its detail. */
  expect_reject("[1] x", IDEM_EJSON, 4);
  assert_string_equal(idem_errmsg(),
                      "at byte 4: unexpected data after the JSON value");
}

static void test_number_range(void **state) {
  char big[400];
  (void)state;
  expect_reject("1e400", IDEM_ERANGE, 0);
  expect_reject("-1e400", IDEM_ERANGE, 0);
  expect_reject("[1, 1e400]", IDEM_ERANGE, 4);
  expect_reject("{\"n\":-1e400}", IDEM_ERANGE, 5);
  expect_reject("1.7976931348623159e308", IDEM_ERANGE, 0);
  /* A long integer that overflows. */
  big[0] = '[';
  big[1] = '1';
  memset(big + 2, '0', 320);
  big[322] = ']';
  big[323] = '\0';
  expect_reject(big, IDEM_ERANGE, 1);
}

static void test_max_bytes(void **state) {
  idem_canon_limits four = {4, 0};
  (void)state;
  expect_canon_n("[12]", 4, &four, "[12]", 4);
  expect_reject_n("[1,2]", 5, &four, IDEM_ETOOBIG, 4);
}

static void test_arguments(void **state) {
  idem_canon_limits negative = {0, -1};
  char *out = (char *)"sentinel";
  size_t out_len = 99, off = 99;
  (void)state;
  assert_int_equal(idem_canonicalize("[]", 2, NULL, NULL, &out_len, &off),
                   IDEM_EINVAL);
  assert_int_equal(out_len, 0);
  assert_int_equal(idem_canonicalize(NULL, 2, NULL, &out, &out_len, &off),
                   IDEM_EINVAL);
  assert_null(out);
  assert_int_equal(out_len, 0);
  out = (char *)"sentinel";
  assert_int_equal(idem_canonicalize("[]", 2, &negative, &out, &out_len, &off),
                   IDEM_EINVAL);
  assert_null(out);
  /* err_offset may be NULL. */
  assert_int_equal(idem_canonicalize("[", 1, NULL, &out, &out_len, NULL),
                   IDEM_EJSON);
  assert_null(out);
  /* The input need not be NUL-terminated: only len bytes are read. */
  expect_canon_n("[1]xxxx", 3, NULL, "[1]", 3);
}

/* ------------------------------------------------------------------ */
/* Fingerprints                                                         */
/* ------------------------------------------------------------------ */

static void test_fingerprint_seed(void **state) {
  static const char *const same[] = {
      "{\"operation_key\":\"approved-ticket-001\",\"payload\":{\"project\":"
      "\"demo-agent\",\"title\":\"Investigate a synthetic queue backlog\","
      "\"priority\":\"normal\"}}",
      "{\"payload\":{\"priority\":\"normal\",\"title\":\"Investigate a "
      "synthetic queue backlog\",\"project\":\"demo-agent\"},"
      "\"operation_key\":\"approved-ticket-001\"}",
      "{\n  \"operation_key\" : \"approved-ticket-001\",\n  \"payload\" : {\n"
      "    \"title\" : \"Investigate a synthetic queue backlog\",\n"
      "    \"project\" : \"demo-agent\",\n    \"priority\" : \"normal\"\n"
      "  }\n}\n",
      "\t{ \"payload\" :{\"project\":\"demo\\u002dagent\",\"priority\":"
      "\"normal\",\"title\":\"Investigate a synthetic queue backlog\"}  , "
      "\"operation_key\":\"approved-ticket-001\" } ",
  };
  static const char canonical[] =
      "{\"operation_key\":\"approved-ticket-001\",\"payload\":{\"priority\":"
      "\"normal\",\"project\":\"demo-agent\",\"title\":\"Investigate a "
      "synthetic queue backlog\"}}";
  static const char urgent[] =
      "{\"operation_key\":\"approved-ticket-001\",\"payload\":{\"project\":"
      "\"demo-agent\",\"title\":\"Investigate a synthetic queue backlog\","
      "\"priority\":\"urgent\"}}";
  char fp[IDEM_FINGERPRINT_SIZE], other[IDEM_FINGERPRINT_SIZE];
  (void)state;

  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
    expect_canon(same[i], canonical);
    assert_int_equal(idem_fingerprint(same[i], strlen(same[i]), 1, fp),
                     IDEM_OK);
    /* SHA-256 of the canonical bytes, computed independently. */
    assert_string_equal(
        fp, "46990e904d1d53f99c2e6b502ab422a3dd934849c57cb0c41897de5b59ebf59e");
  }
  assert_int_equal(idem_fingerprint(urgent, strlen(urgent), 1, other), IDEM_OK);
  assert_string_equal(
      other,
      "02047dca2595f45f7fe3c43a47e81e59b99fa7bd11c4edbeafa917be3ae8a8a5");
  assert_string_not_equal(fp, other);

  /* Invalid JSON fails the fingerprint as it fails canonicalisation. */
  assert_int_equal(idem_fingerprint("{\"a\":1,\"a\":2}", 13, 1, fp),
                   IDEM_EDUPKEY);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_whitespace_and_scalars),
      cmocka_unit_test(test_numbers),
      cmocka_unit_test(test_string_escapes),
      cmocka_unit_test(test_member_order),
      cmocka_unit_test(test_utf16_order),
      cmocka_unit_test(test_nul_in_member_names),
      cmocka_unit_test(test_nul_in_member_names_crowded),
      cmocka_unit_test(test_duplicate_names),
      cmocka_unit_test(test_invalid_utf8),
      cmocka_unit_test(test_lone_surrogates),
      cmocka_unit_test(test_depth),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_nul_after_value),
      cmocka_unit_test(test_number_range),
      cmocka_unit_test(test_max_bytes),
      cmocka_unit_test(test_arguments),
      cmocka_unit_test(test_fingerprint_seed),
  };
  if (argc != 2) {
    fprintf(stderr, "usage: %s VECTORS_DIR\n", argv[0]);
    return 2;
  }
  vectors_dir = argv[1];
  return cmocka_run_group_tests(tests, NULL, NULL);
}
