/*
 * test_cli_util.c -- the idem program's shared helpers (src/util.c): the
 * duration parser, the tenant check, the escaping of stored text on
 * output and cuts of text at a UTF-8 character's boundary. The file is
 * included, so that the tests need no library of the program's own.
 */
#include "../src/util.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <jansson.h>

static int64_t duration(const char *s) {
  int64_t ms = -12345;
  int rc = cli_parse_duration(s, &ms);
  assert_int_equal(rc, 0);
  return ms;
}

/* Asserts that s is refused with errno e, and that *ms is left alone. */
static void duration_refused(const char *s, int e) {
  int64_t ms = -12345;
  const char *shown = s ? s : "(NULL)";
  errno = 0;
  if (cli_parse_duration(s, &ms) != -1)
    fail_msg("'%s' was accepted as %lld ms", shown, (long long)ms);
  if (errno != e)
    fail_msg("'%s': errno %d, expected %d", shown, errno, e);
  assert_int_equal(ms, -12345);
}

static void test_duration_units(void **state) {
  (void)state;
  assert_int_equal(duration("250ms"), 250);
  assert_int_equal(duration("30s"), 30000);
  assert_int_equal(duration("30"), 30000);
  assert_int_equal(duration("1.5"), 1500);
  assert_int_equal(duration(".5s"), 500);
  assert_int_equal(duration("5m"), 300000);
  assert_int_equal(duration("24h"), 86400000);
  assert_int_equal(duration("7d"), 604800000);
  assert_int_equal(duration("0"), 0);
  assert_int_equal(duration("0.4ms"), 0);
  /* The largest duration: 9e15 ms, exact in an int64_t and a double. */
  assert_int_equal(duration("9000000000000000ms"), 9000000000000000LL);
  assert_int_equal(duration("104166666d"), 8999999942400000LL);
  assert_int_equal(duration("0.3s"), 300);
  assert_int_equal(duration("0.001s"), 1);
  assert_int_equal(duration("1.0000001d"), 86400008);
}

static void test_duration_not_numbers(void **state) {
  (void)state;
  /* strtod() takes all of these; a duration is decimal digits only. NaN
   * in particular must never reach the conversion to an integer, which is
   * undefined for it. */
  const char *bad[] = {"nan",   "NaN",      "nans",  "nan(1)", "inf", "infs",
                       "-inf",  "infinity", "+5s",   "-1",     "-0",  "0x10",
                       "0x1p4", "1e3",      "1e400", " 5",     "5 ",  "5x",
                       "5 s",   ".",        "s",     "ms",     "",    "1..2",
                       "5S",    "5sec",     "1.5.s"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    duration_refused(bad[i], EINVAL);
  duration_refused(NULL, EINVAL);
}

static void test_duration_too_large(void **state) {
  (void)state;
  char digits[402];
  duration_refused("99999999999999999999d", ERANGE);
  duration_refused("104166667d", ERANGE);
  duration_refused("9000000000000001ms", ERANGE);
  duration_refused("9000000000001", ERANGE);
  memset(digits, '9', 400);
  strcpy(digits + 400, "s");
  duration_refused(digits, ERANGE); /* strtod() gives HUGE_VAL */
}

/* Runs fn with stderr in a file and returns what it printed (one line). */
static const char *captured(int *rc, int (*fn)(const void *), const void *arg) {
  static char buf[512];
  FILE *saved = stderr;
  FILE *f = tmpfile();
  assert_non_null(f);
  stderr = f;
  *rc = fn(arg);
  stderr = saved;
  rewind(f);
  if (!fgets(buf, sizeof buf, f))
    buf[0] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
  return buf;
}

static int64_t option_ms;
static int lease_option(const void *value) {
  option_ms = -1;
  return cli_duration_option("run", "--lease", value, 100, 86400000LL * 7,
                             &option_ms);
}

static void test_duration_option(void **state) {
  int rc;
  const char *msg;
  (void)state;
  msg = captured(&rc, lease_option, "30s");
  assert_int_equal(rc, 0);
  assert_int_equal(option_ms, 30000);
  assert_string_equal(msg, "");
  msg = captured(&rc, lease_option, "7d");
  assert_int_equal(rc, 0);
  assert_int_equal(option_ms, 604800000);
  msg = captured(&rc, lease_option, "nan");
  assert_int_equal(rc, -1);
  assert_string_equal(msg, "idem run: --lease: 'nan' is not a duration (such "
                           "as 250ms, 30s, 5m, 24h or 7d)");
  msg = captured(&rc, lease_option, "99999999999999999999d");
  assert_int_equal(rc, -1);
  assert_string_equal(msg, "idem run: --lease: '99999999999999999999d' is too "
                           "large (at most 7d)");
  msg = captured(&rc, lease_option, "8d");
  assert_int_equal(rc, -1);
  assert_string_equal(msg, "idem run: --lease: '8d' is too large (at most 7d)");
  msg = captured(&rc, lease_option, "99ms");
  assert_int_equal(rc, -1);
  assert_string_equal(
      msg, "idem run: --lease: '99ms' is too short (at least 100ms)");
  /* A parse that succeeds after one that failed is not taken for a failure
   * (errno is left as it was). */
  errno = ERANGE;
  msg = captured(&rc, lease_option, "1s");
  assert_int_equal(rc, 0);
  assert_int_equal(option_ms, 1000);
}

static int operation_check(const void *op) {
  return cli_check_operation("keys", op);
}

static void test_operation(void **state) {
  int rc;
  char big[300];
  (void)state;
  /* What libidem accepts is accepted, so that any record can be named. */
  captured(&rc, operation_check, "POST /tickets");
  assert_int_equal(rc, 0);
  captured(&rc, operation_check, "op\xe2\x80\xae");
  assert_int_equal(rc, 0);
  assert_string_equal(captured(&rc, operation_check, ""),
                      "idem keys: --operation: empty");
  assert_int_equal(rc, -1);
  memset(big, 'o', 299);
  big[299] = '\0';
  assert_string_equal(captured(&rc, operation_check, big),
                      "idem keys: --operation: 299 bytes; at most 255");
  assert_string_equal(captured(&rc, operation_check, "a\tb"),
                      "idem keys: --operation: control character U+0009 at "
                      "byte 1");
  assert_string_equal(captured(&rc, operation_check, "\xff"),
                      "idem keys: --operation: invalid UTF-8 at byte 0");
}

static void tenant_ok(const char *t) {
  if (cli_check_tenant("test", t) != 0)
    fail_msg("tenant '%s' was refused", t);
}

static void tenant_refused(const char *t, const char *why) {
  char buf[512] = "";
  FILE *saved = stderr;
  FILE *f = tmpfile();
  assert_non_null(f);
  stderr = f;
  int rc = cli_check_tenant("test", t);
  stderr = saved;
  rewind(f);
  if (!fgets(buf, sizeof buf, f))
    buf[0] = '\0';
  fclose(f);
  if (rc != -1)
    fail_msg("tenant '%s' was accepted", t);
  if (!strstr(buf, why))
    fail_msg("tenant refused with [%s], expected it to say [%s]", buf, why);
}

static void test_tenant(void **state) {
  char t[300];
  (void)state;
  tenant_ok("");
  tenant_ok("acme");
  tenant_ok("Caf\xc3\xa9 & Co, Ltd. (EU)");
  tenant_ok("\xc2\xa0");         /* U+00A0, just past the C1 controls */
  tenant_ok("\xe2\x80\xaf");     /* U+202F, just past the overrides */
  tenant_ok("\xe2\x81\xaa");     /* U+206A, just past the isolates */
  tenant_ok("\xf0\x9f\x98\x80"); /* an emoji */
  memset(t, 'a', 255);
  t[255] = '\0';
  tenant_ok(t);

  t[255] = 'a';
  t[256] = '\0';
  tenant_refused(t, "--tenant: 256 bytes; at most 255");
  tenant_refused("a\nb", "--tenant: control character U+000A at byte 1");
  tenant_refused("\x1b[31m", "U+001B at byte 0");
  tenant_refused("a\x7f", "U+007F at byte 1");
  tenant_refused("a\xc2\x80", "control character U+0080 at byte 1");
  tenant_refused("a\xc2\x85", "U+0085");
  tenant_refused("\xc2\x9b", "U+009B");
  tenant_refused("\xc2\x9f", "U+009F");
  tenant_refused("ac\xe2\x80\xaaz", "invisible or reordering character "
                                    "U+202A at byte 2");
  tenant_refused("\xe2\x80\xae", "U+202E");
  tenant_refused("\xe2\x81\xa6", "U+2066");
  tenant_refused("\xe2\x81\xa9", "U+2069");
  tenant_refused("\xe2\x80\x8f", "U+200F");  /* RIGHT-TO-LEFT MARK */
  tenant_refused("\xd8\x9c", "U+061C");      /* ARABIC LETTER MARK */
  tenant_refused("a\xe2\x80\x8b", "U+200B"); /* ZERO WIDTH SPACE */
  tenant_refused("\xe2\x80\xa8", "U+2028");  /* LINE SEPARATOR */
  tenant_refused("\xef\xbb\xbf", "U+FEFF");  /* BYTE ORDER MARK */
  tenant_refused("a\xff", "--tenant: invalid UTF-8 at byte 1");
  tenant_refused("\xc0\x80", "invalid UTF-8 at byte 0"); /* overlong NUL */
  tenant_refused("\xed\xa0\x80", "invalid UTF-8");       /* a surrogate */
  tenant_refused("\xe2\x80", "invalid UTF-8");           /* truncated */
}

static void escaped(const char *in, const char *want) {
  char *got = cli_escape(in, strlen(in));
  assert_non_null(got);
  assert_string_equal(got, want);
  free(got);
}

static void test_escape(void **state) {
  (void)state;
  escaped("", "");
  escaped("acme-42", "acme-42");
  escaped("Caf\xc3\xa9", "Caf\xc3\xa9");
  escaped("a\\b", "a\\\\b"); /* so that an escape is never ambiguous */
  escaped("a\nb\tc\r", "a\\nb\\tc\\r");
  escaped("\x1b[2J\x7f", "\\x1b[2J\\x7f");
  escaped("x\xc2\x9b"
          "31m",
          "x\\u009b31m");
  escaped("evil\xe2\x80\xae"
          "gnp.exe",
          "evil\\u202egnp.exe");
  escaped("\xe2\x81\xa6"
          "a"
          "\xe2\x81\xa9",
          "\\u2066a\\u2069");
  escaped("\xef\xbb\xbf", "\\ufeff");
  escaped("\xff\xc3", "\\xff\\xc3");          /* not UTF-8: each byte */
  escaped("\xf3\xa0\x80\x81", "\\U000e0001"); /* a tag character */
  char *got = cli_escape("a\0b", 3);
  assert_string_equal(got, "a\\x00b");
  free(got);
}

static void json_safe(const char *in, const char *want) {
  char *got = cli_json_escape_unsafe(in);
  assert_non_null(got);
  assert_string_equal(got, want);
  free(got);
}

static void test_json_escape(void **state) {
  (void)state;
  json_safe("{\"t\":\"acme\"}", "{\"t\":\"acme\"}");
  json_safe("{\"t\":\"Caf\xc3\xa9\"}", "{\"t\":\"Caf\xc3\xa9\"}");
  json_safe("{\"t\":\"a\xe2\x80\xae"
            "b\"}",
            "{\"t\":\"a\\u202eb\"}");
  json_safe("[\"\xc2\x85\x7f\"]", "[\"\\u0085\\u007f\"]");
  json_safe("[\"\xf3\xa0\x80\x81\"]", "[\"\\udb40\\udc01\"]");
  json_safe("{\n  \"a\": 1\n}", "{\n  \"a\": 1\n}"); /* layout kept */
  /* JSON's own escapes are left as they are. */
  json_safe("[\"a\\\\u202e\\n\"]", "[\"a\\\\u202e\\n\"]");
}

/* cli_utf8_cut(s, max): the longest start of s, at most max bytes, that
 * does not end inside a UTF-8 character. */
static void test_utf8_cut(void **state) {
  /* "a" then U+00E9 (2 bytes), U+20AC (3 bytes), U+1F600 (4 bytes). */
  static const char s[] = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";
  static const size_t want[] = {0, 1, 1, 3, 3, 3, 6, 6, 6, 6, 10, 11, 11, 11};
  (void)state;
  for (size_t max = 0; max < sizeof want / sizeof want[0]; max++)
    if (cli_utf8_cut(s, max) != want[max])
      fail_msg("cli_utf8_cut(s, %zu): %zu, expected %zu", max,
               cli_utf8_cut(s, max), want[max]);
  /* Shorter than max: the whole string, however large max is. */
  assert_int_equal(cli_utf8_cut("", 10), 0);
  assert_int_equal(cli_utf8_cut("abc", 200), 3);
  assert_int_equal(cli_utf8_cut("\xc3\xa9", (size_t)-1), 2);
  /* "ab" and two U+20AC cut by snprintf() to fit 8 bytes: the partial
   * character goes, the whole ones stay. */
  char buf[8] = "ab\xe2\x82\xac\xe2\x82";
  buf[cli_utf8_cut(buf, sizeof buf)] = '\0';
  assert_string_equal(buf, "ab\xe2\x82\xac");
  /* Bytes that are no UTF-8 are not its to mend: kept as they are, but
   * a cut never ends on a lead byte. */
  assert_int_equal(cli_utf8_cut("a\x80\x80", 3), 3);
  assert_int_equal(cli_utf8_cut("ab\xff", 3), 3);
  assert_int_equal(cli_utf8_cut("ab\xc3", 3), 2);
  assert_int_equal(cli_utf8_cut("\x80\x80\x80\x80\x80", 5), 5);
  /* Every cut of a long text of 1- to 4-byte characters is valid UTF-8
   * (jansson takes it) and at most max bytes. */
  char text[1024];
  size_t n = 0;
  static const char *const chars[] = {"x", "\xc3\xa9", "\xe2\x82\xac",
                                      "\xf0\x9f\x98\x80"};
  for (unsigned j = 0; n + 4 < sizeof text; j++) {
    const char *c = chars[(j * j + j / 3) % 4];
    memcpy(text + n, c, strlen(c));
    n += strlen(c);
  }
  text[n] = '\0';
  for (size_t max = 0; max <= n; max++) {
    size_t k = cli_utf8_cut(text, max);
    json_t *j = json_stringn(text, k);
    if (k > max || max - k > 3 || !j)
      fail_msg("cut at %zu: %zu bytes, %s", max, k, j ? "UTF-8" : "not UTF-8");
    json_decref(j);
  }
}

static const char *store_url;
static int store_option(const void *value) {
  return cli_store_option("keys", value, &store_url);
}

static void test_store_option(void **state) {
  int rc;
  (void)state;
  store_url = "unchanged";
  assert_string_equal(captured(&rc, store_option, ""),
                      "idem keys: --store: empty store URL");
  assert_int_equal(rc, -1);
  assert_string_equal(store_url, "unchanged");
  assert_string_equal(captured(&rc, store_option, "sqlite:x.db"), "");
  assert_int_equal(rc, 0);
  assert_string_equal(store_url, "sqlite:x.db");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_duration_units),
      cmocka_unit_test(test_duration_not_numbers),
      cmocka_unit_test(test_duration_too_large),
      cmocka_unit_test(test_duration_option),
      cmocka_unit_test(test_operation),
      cmocka_unit_test(test_tenant),
      cmocka_unit_test(test_escape),
      cmocka_unit_test(test_json_escape),
      cmocka_unit_test(test_utf8_cut),
      cmocka_unit_test(test_store_option),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
