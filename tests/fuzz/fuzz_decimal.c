/*
 * fuzz_decimal.c -- lib/decimal.c against strtod(): for every JSON number
 * text, idem__decimal_to_double() must give the very bits strtod() gives
 * (IDEM_ERANGE where strtod() overflows to an infinity), and
 * idem__decimal_to_double_fast(), whenever it decides, the same.
 *
 * An input is read in one of four ways:
 *  - a valid JSON number: that text, and variants of it (negated, with
 *    zeros added to its fraction, with its last digit moved by one);
 *  - "R" and anything: a seed for 20,000 random texts of every shape
 *    (1 to 25 digits, 19 to 20 digits, up to 800 digits, exponents over
 *    the whole range and past it);
 *  - any other input of 8 bytes: the bits of a double v, and the texts
 *    around it: its shortest and longer forms, and the exact midpoint
 *    between v and its neighbour above (a tie, which must go to the even
 *    one) with that midpoint cut short and nudged up, at lengths from 1 to
 *    800 digits;
 *  - anything else: its bytes made into a number's digits and exponent.
 */
#include "decimal.h"
#include "idem.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond, text)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_decimal: property violated: %s (line %d) on %s\n", \
              #cond, __LINE__, text);                                          \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* Texts are at most this long: 800 digits, a point, a sign, an exponent. */
#define TEXT_MAX 1024

static uint64_t bits_of(double v) {
  uint64_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

/* Whether s is an RFC 8259 number, all of it. */
static int is_json_number(const char *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-')
    i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && s[i] >= '1' && s[i] <= '9') {
    while (i < n && s[i] >= '0' && s[i] <= '9')
      i++;
  } else {
    return 0;
  }
  if (i < n && s[i] == '.') {
    if (++i >= n || s[i] < '0' || s[i] > '9')
      return 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
      i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      i++;
    if (i >= n || s[i] < '0' || s[i] > '9')
      return 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
      i++;
  }
  return i == n;
}

/* The one property, for one valid JSON number text. */
static void check_text(const char *text) {
  size_t n = strlen(text);
  double ref, got = 12345, fast = 12345;
  int rc, decided;
  CHECK(is_json_number(text, n), text);
  ref = strtod(text, NULL);
  rc = idem__decimal_to_double(text, n, &got);
  decided = idem__decimal_to_double_fast(text, n, &fast);
  if (isinf(ref)) {
    CHECK(rc == IDEM_ERANGE, text);
    CHECK(got == 12345, text);
  } else {
    CHECK(rc == IDEM_OK, text);
    CHECK(bits_of(got) == bits_of(ref), text);
  }
  if (decided)
    CHECK(bits_of(fast) == bits_of(ref), text);
}

/* Checks text and, when it has room, the variants of it named above. */
static void check_with_variants(const char *text) {
  char v[TEXT_MAX + 8];
  size_t n = strlen(text), e, d;
  check_text(text);
  if (n + 4 > TEXT_MAX)
    return;
  /* Negated, or not. */
  if (text[0] == '-')
    check_text(text + 1);
  else {
    v[0] = '-';
    memcpy(v + 1, text, n + 1);
    check_text(v);
  }
  /* Zeros after the last fraction digit (or a fraction of zeros): the same
   * value in more digits. */
  e = strcspn(text, "eE");
  memcpy(v, text, e);
  d = e;
  if (memchr(text, '.', e) == NULL)
    v[d++] = '.';
  memcpy(v + d, "000", 3);
  memcpy(v + d + 3, text + e, n - e + 1);
  check_text(v);
  /* The last significand digit one up or down, where that stays valid. */
  if (e > 0 && text[e - 1] >= '0' && text[e - 1] <= '9') {
    memcpy(v, text, n + 1);
    if (text[e - 1] < '9') {
      v[e - 1] = (char)(text[e - 1] + 1);
      if (is_json_number(v, n))
        check_text(v);
    }
    if (text[e - 1] > '0') {
      v[e - 1] = (char)(text[e - 1] - 1);
      if (is_json_number(v, n))
        check_text(v);
    }
  }
}

/* ------------------------------------------------------------------ */
/* The texts around a double                                            */
/* ------------------------------------------------------------------ */

/* "%.{p}e" output (d.ddd...e±x) rewritten as a JSON number: the same,
 * since JSON accepts it, but without a locale's point. */
static void check_printf(double v, int p) {
  char t[TEXT_MAX];
  snprintf(t, sizeof t, "%.*e", p, v);
  check_with_variants(t);
}

/*
 * The exact decimal expansion of the midpoint m between two adjacent
 * doubles has at most 767 significant digits, and long double (64 bits of
 * significand on x86) holds m exactly; glibc prints it exactly.
 */
static void check_midpoint(double lo, double hi) {
#if LDBL_MANT_DIG >= 54
  char t[TEXT_MAX], c[TEXT_MAX];
  long double m = ((long double)lo + (long double)hi) / 2;
  static const int cuts[] = {1,  2,  5,  15, 16,  17,  18, 19,
                             20, 21, 25, 40, 100, 400, 800};
  char *e;
  snprintf(t, sizeof t, "%.800Le", m);
  check_text(t); /* the tie itself (trailing zeros and all) */
  e = strchr(t, 'e');
  for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
    /* The first cuts[k] digits: "d" or "d.ddd", then the exponent. */
    int digits = cuts[k];
    size_t keep = digits == 1 ? 1 : (size_t)digits + 1;
    memcpy(c, t, keep);
    strcpy(c + keep, e);
    check_text(c); /* at or just below the tie */
    /* One unit up in the last kept digit: above the tie. */
    for (size_t j = keep; j-- > 0;) {
      if (c[j] == '.')
        continue;
      if (c[j] < '9') {
        c[j]++;
        check_text(c);
        break;
      }
      c[j] = '0';
      if (j == 0)
        break; /* 9.99... rolled over: skip it */
    }
  }
#else
  (void)lo;
  (void)hi;
#endif
}

static void check_double_bits(uint64_t bits) {
  double v;
  bits &= ~((uint64_t)1 << 63);
  memcpy(&v, &bits, sizeof v);
  if (!isfinite(v))
    return;
  for (int p = 0; p <= 20; p++)
    check_printf(v, p);
  check_printf(v, 25);
  if (v < DBL_MAX)
    check_midpoint(v, nextafter(v, INFINITY));
}

/* ------------------------------------------------------------------ */
/* Random texts                                                         */
/* ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng(void) {
  /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A random JSON number of `digits` significant digits, the point among
 * them or before them, and the exponent exp. */
static void random_text(char *t, int digits, int exp) {
  size_t o = 0;
  int point;
  if (rng() & 1)
    t[o++] = '-';
  /* After which digit the point goes: 0 puts "0." before them all,
   * digits none at all. */
  point = (int)(rng() % (uint64_t)(digits + 1));
  if (point == 0) {
    t[o++] = '0';
    t[o++] = '.';
  }
  for (int i = 0; i < digits; i++) {
    if (i == point && point > 0)
      t[o++] = '.';
    t[o++] = (char)('0' + (i == 0 ? 1 + rng() % 9 : rng() % 10));
  }
  /* Sometimes no exponent at all. */
  if (rng() % 4 != 0)
    o += (size_t)sprintf(t + o, "%s%d", rng() & 1 ? "e" : "E", exp);
  t[o] = '\0';
}

static void check_random(uint64_t seed) {
  char t[TEXT_MAX];
  rng_state = seed;
  for (int k = 0; k < 20000; k++) {
    uint64_t r = rng();
    int digits, exp;
    switch (r % 6) {
    case 0: /* short, the common case */
      digits = 1 + (int)(rng() % 17);
      break;
    case 1: /* around 19 and 20 digits */
      digits = 18 + (int)(rng() % 4);
      break;
    case 2:
      digits = 1 + (int)(rng() % 60);
      break;
    case 3:
      digits = 1 + (int)(rng() % 800);
      break;
    default:
      digits = 15 + (int)(rng() % 3);
      break;
    }
    /* Exponents over the whole range and a little past it, and often
     * the small ones of Clinger's fast path. */
    exp = (int)(rng() % 720) - 360 - digits / 2;
    if (rng() % 4 == 0)
      exp = (int)(rng() % 60) - 30;
    random_text(t, digits, exp);
    check_text(t);
    /* Random bits as doubles, boundaries and all. */
    if (k % 50 == 0)
      check_double_bits(rng());
  }
}

/* ------------------------------------------------------------------ */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char t[TEXT_MAX];
  if (size > 0 && size < TEXT_MAX - 8 &&
      is_json_number((const char *)data, size)) {
    memcpy(t, data, size);
    t[size] = '\0';
    check_with_variants(t);
    return 0;
  }
  if (size > 0 && data[0] == 'R') {
    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++)
      seed = (seed ^ data[i]) * 1099511628211ull;
    check_random(seed);
    return 0;
  }
  if (size == 8) {
    uint64_t bits;
    memcpy(&bits, data, 8);
    check_double_bits(bits);
    return 0;
  }
  /* Bytes to a text: digits from all but the last two, which make the
   * exponent. */
  if (size >= 3) {
    size_t o = 0, nd = size - 2 > 800 ? 800 : size - 2;
    int exp = (int)(int16_t)(data[size - 2] | data[size - 1] << 8) % 700;
    t[o++] = (char)('1' + data[0] % 9);
    t[o++] = '.';
    for (size_t i = 1; i < nd; i++)
      t[o++] = (char)('0' + data[i] % 10);
    if (nd == 1)
      t[o++] = '0';
    sprintf(t + o, "e%d", exp);
    check_with_variants(t);
  }
  return 0;
}
