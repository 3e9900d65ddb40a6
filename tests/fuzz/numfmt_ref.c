/*
 * numfmt_ref.c -- the number formatting of idem 0.3 (lib/numfmt.c before
 * Schubfach), kept unchanged but for the names of its functions, as the
 * reference the differential fuzz driver (fuzz_numfmt_diff.c) compares the new
 * code with: every fingerprint of 0.3 must stay byte for byte what it was.
 *
 * It tries precisions with snprintf("%.*e") and reads each back with
 * strtod(): slow, but it leans only on the correctly rounded conversions of
 * glibc.
 */
#include "numfmt_ref.h"

#include "internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A decimal candidate: the p-digit integer m times 10 to the power x - p + 1,
 * so that x is the exponent of its first digit. */
typedef struct decimal {
  uint64_t m;
  int p;
  int x;
} decimal;

static const uint64_t pow10_u64[18] = {1ull,
                                       10ull,
                                       100ull,
                                       1000ull,
                                       10000ull,
                                       100000ull,
                                       1000000ull,
                                       10000000ull,
                                       100000000ull,
                                       1000000000ull,
                                       10000000000ull,
                                       100000000000ull,
                                       1000000000000ull,
                                       10000000000000ull,
                                       100000000000000ull,
                                       1000000000000000ull,
                                       10000000000000000ull,
                                       100000000000000000ull};

/*
 * Rounds v (finite, positive) to p significant digits. glibc's printf rounds
 * exactly, ties to even, which is the rounding ECMAScript asks for. The
 * digits are read back without caring for the decimal point, which an
 * application's LC_NUMERIC may have turned into something other than '.'.
 */
static int round_to_digits(double v, int p, decimal *d) {
  char buf[64];
  const char *s = buf;
  char *end = NULL;
  long x;
  int n = snprintf(buf, sizeof buf, "%.*e", p - 1, v);
  if (n < 0 || (size_t)n >= sizeof buf)
    return -1;
  d->m = 0;
  d->p = 0;
  while (*s != '\0' && *s != 'e') {
    if (*s >= '0' && *s <= '9') {
      d->m = d->m * 10 + (uint64_t)(*s - '0');
      d->p++;
    }
    s++;
  }
  if (*s != 'e' || d->p != p)
    return -1;
  x = strtol(s + 1, &end, 10);
  if (end == s + 1 || *end != '\0')
    return -1;
  d->x = (int)x;
  return 0;
}

/*
 * Reads the candidate back as a double. The text is an integer mantissa and
 * an exponent with no decimal point, so the locale cannot change its meaning.
 */
static double read_back(const decimal *d) {
  char buf[48];
  snprintf(buf, sizeof buf, "%" PRIu64 "e%d", d->m, d->x - d->p + 1);
  return strtod(buf, NULL);
}

/* The next p-digit decimal above d; 9.99e4 steps to 1.00e5. */
static decimal step_up(decimal d) {
  d.m++;
  if (d.m == pow10_u64[d.p]) {
    d.m = pow10_u64[d.p - 1];
    d.x++;
  }
  return d;
}

/* The next p-digit decimal below d; 1.00e5 steps to 9.99e4. */
static decimal step_down(decimal d) {
  d.m--;
  if (d.m < pow10_u64[d.p - 1]) {
    d.m = pow10_u64[d.p] - 1;
    d.x--;
  }
  return d;
}

/*
 * Finds the shortest decimal that reads back as v, choosing the closest to v
 * when several of that length do.
 *
 * For each length p the closest p-digit decimal is the correctly rounded one,
 * so it is tried first. It can miss where its neighbour hits: at a power of
 * two the doubles below v are twice as dense as those above, so the interval
 * that reads back as v reaches twice as far upwards as downwards. A rounded
 * value just below v may then fall outside while the next decimal above it,
 * though farther from v, still falls inside. Only the neighbour on the other
 * side of v can help, since the one on the same side is farther still.
 */
static int shortest_digits(double v, decimal *out) {
  for (int p = 1; p <= 17; p++) {
    decimal d, n;
    double back;
    if (round_to_digits(v, p, &d) != 0)
      return -1;
    back = read_back(&d);
    if (back == v) {
      *out = d;
      return 0;
    }
    n = back < v ? step_up(d) : step_down(d);
    if (read_back(&n) == v) {
      *out = n;
      return 0;
    }
  }
  /* Seventeen significant digits always identify a double. */
  return -1;
}

int ref_format_double(double v, char out[32], size_t *len) {
  char digits[24];
  decimal d;
  size_t pos = 0;
  int k, n;

  out[0] = '\0';
  *len = 0;
  if (!isfinite(v))
    return idem__fail(IDEM_ERANGE, "number: %s has no JSON form",
                      isnan(v) ? "NaN" : "an infinity");
  /* Both zeros are written "0", as ECMAScript does. */
  if (v == 0) {
    memcpy(out, "0", 2);
    *len = 1;
    return IDEM_OK;
  }
  if (v < 0) {
    out[pos++] = '-';
    v = -v;
  }
  if (shortest_digits(v, &d) != 0)
    return idem__fail(IDEM_ERANGE, "number: cannot format %.17g", v);

  /* ECMAScript's k counts digits without trailing zeros. */
  while (d.p > 1 && d.m % 10 == 0) {
    d.m /= 10;
    d.p--;
  }
  k = snprintf(digits, sizeof digits, "%" PRIu64, d.m);
  n = d.x + 1; /* v = 0.digits times 10 to the power n */

  if (k <= n && n <= 21) {
    /* An integer: the digits, then n - k zeros. */
    memcpy(out + pos, digits, (size_t)k);
    pos += (size_t)k;
    memset(out + pos, '0', (size_t)(n - k));
    pos += (size_t)(n - k);
  } else if (0 < n && n <= 21) {
    /* The decimal point falls inside the digits. */
    memcpy(out + pos, digits, (size_t)n);
    pos += (size_t)n;
    out[pos++] = '.';
    memcpy(out + pos, digits + n, (size_t)(k - n));
    pos += (size_t)(k - n);
  } else if (-6 < n && n <= 0) {
    /* A small fraction: "0.", -n zeros, then the digits. */
    out[pos++] = '0';
    out[pos++] = '.';
    memset(out + pos, '0', (size_t)-n);
    pos += (size_t)-n;
    memcpy(out + pos, digits, (size_t)k);
    pos += (size_t)k;
  } else {
    /* Exponent notation: d[.ddd]e+x or d[.ddd]e-x. */
    out[pos++] = digits[0];
    if (k > 1) {
      out[pos++] = '.';
      memcpy(out + pos, digits + 1, (size_t)(k - 1));
      pos += (size_t)(k - 1);
    }
    pos += (size_t)snprintf(out + pos, 32 - pos, "e%c%d", n - 1 < 0 ? '-' : '+',
                            n - 1 < 0 ? 1 - n : n - 1);
  }
  out[pos] = '\0';
  *len = pos;
  return IDEM_OK;
}

/* ------------------------------------------------------------------ */
/* Exact numbers, for fingerprints                                      */
/* ------------------------------------------------------------------ */

/*
 * A JSON number's text read as its exact decimal value, without converting
 * anything: sign, the digits before and after the point, the significant
 * ones among them, and the exponent's digits.
 */
typedef struct json_decimal {
  int neg;
  const char *ip, *fp; /* the integer and the fraction digits */
  size_t in, fn;
  size_t first, last; /* the significant digits, as indexes into ip then
                         fp; none when zero */
  int zero;
  int exp_neg;
  const char *ep; /* the exponent's digits after its leading zeros */
  size_t en;
} json_decimal;

static char digit_at(const json_decimal *d, size_t i) {
  return i < d->in ? d->ip[i] : d->fp[i - d->in];
}

static int is_dec_digit(char c) { return c >= '0' && c <= '9'; }

static void read_decimal(const char *s, size_t len, json_decimal *d) {
  size_t i = 0, total;
  memset(d, 0, sizeof *d);
  if (i < len && s[i] == '-') {
    d->neg = 1;
    i++;
  }
  d->ip = s + i;
  while (i < len && is_dec_digit(s[i]))
    i++;
  d->in = (size_t)(s + i - d->ip);
  d->fp = s + i;
  if (i < len && s[i] == '.') {
    d->fp = s + ++i;
    while (i < len && is_dec_digit(s[i]))
      i++;
    d->fn = (size_t)(s + i - d->fp);
  }
  if (i < len && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < len && (s[i] == '+' || s[i] == '-'))
      d->exp_neg = s[i++] == '-';
    while (i < len && s[i] == '0')
      i++;
    d->ep = s + i;
    d->en = len - i;
  }
  total = d->in + d->fn;
  while (d->first < total && digit_at(d, d->first) == '0')
    d->first++;
  d->zero = d->first == total;
  if (!d->zero) {
    d->last = total - 1;
    while (digit_at(d, d->last) == '0')
      d->last--;
  }
}

/* Exponents of up to 18 digits are read as integers; longer ones only
 * occur in exact forms, where they are carried as digits. */
#define SMALL_EXPONENT_DIGITS 18

/*
 * Where the point stands: the value is 0.DIGITS times 10 to the power *x.
 * 0 when the exponent is too long to read as an integer. Input texts are
 * shorter than 2^31 bytes, so the sum cannot overflow.
 */
static int point_of(const json_decimal *d, int64_t *x) {
  int64_t e = 0;
  if (d->en > SMALL_EXPONENT_DIGITS)
    return 0;
  for (size_t i = 0; i < d->en; i++)
    e = e * 10 + (d->ep[i] - '0');
  *x = (d->exp_neg ? -e : e) + (int64_t)d->in - (int64_t)d->first;
  return 1;
}

/* Whether two number texts have one exact value. */
static int same_value(const json_decimal *a, const json_decimal *b) {
  int64_t xa, xb;
  if (a->zero || b->zero)
    return a->zero && b->zero;
  if (a->neg != b->neg || a->last - a->first != b->last - b->first)
    return 0;
  if (!point_of(a, &xa) || !point_of(b, &xb) || xa != xb)
    return 0;
  for (size_t i = 0; i <= a->last - a->first; i++)
    if (digit_at(a, a->first + i) != digit_at(b, b->first + i))
      return 0;
  return 1;
}

/*
 * Writes at out the digits of m + delta, where m is a decimal of n digits
 * without leading zeros that is larger than |delta|; returns how many.
 * The result has n - 1 to n + 1 digits: out must hold n + 1.
 */
static size_t add_to_digits(const char *m, size_t n, int64_t delta, char *out) {
  uint64_t u = delta < 0 ? (uint64_t)0 - (uint64_t)delta : (uint64_t)delta;
  int carry = 0;
  size_t start = 1, len;
  memcpy(out + 1, m, n);
  for (size_t j = n; j >= 1 && (u > 0 || carry != 0); j--) {
    int dgt = out[j] - '0', step = (int)(u % 10) + carry;
    u /= 10;
    if (delta >= 0) {
      dgt += step;
      carry = dgt >= 10;
      dgt -= carry ? 10 : 0;
    } else {
      dgt -= step;
      carry = dgt < 0;
      dgt += carry ? 10 : 0;
    }
    out[j] = (char)('0' + dgt);
  }
  if (delta >= 0 && carry) {
    out[0] = '1';
    start = 0;
  }
  /* m > |delta|: a borrow never runs past the first digit, and leaves at
   * most leading zeros. */
  while (start < n && out[start] == '0')
    start++;
  len = n + 1 - start;
  memmove(out, out + start, len);
  return len;
}

int ref_format_number_exact(const char *text, size_t len, double v, char *out,
                            size_t *out_len) {
  json_decimal d, s;
  char shortest[32];
  size_t slen = 0, pos = 0, k;
  int64_t x = 0;
  int rc;

  out[0] = '\0';
  *out_len = 0;
  if ((rc = ref_format_double(v, shortest, &slen)) != IDEM_OK)
    return rc;
  read_decimal(text, len, &d);
  read_decimal(shortest, slen, &s);
  if (same_value(&d, &s)) {
    memcpy(out, shortest, slen + 1);
    *out_len = slen;
    return IDEM_OK;
  }

  /* The exact value: k significant digits, the point after x of them. */
  k = d.last - d.first + 1;
  if (d.neg)
    out[pos++] = '-';
  if (point_of(&d, &x) && x >= (int64_t)k && x <= 21) {
    /* An integer: the digits, then x - k zeros. */
    for (size_t i = 0; i < k; i++)
      out[pos++] = digit_at(&d, d.first + i);
    memset(out + pos, '0', (size_t)x - k);
    pos += (size_t)x - k;
  } else if (point_of(&d, &x) && x > 0 && x <= 21) {
    /* The point falls inside the digits. */
    for (size_t i = 0; i < k; i++) {
      if (i == (size_t)x)
        out[pos++] = '.';
      out[pos++] = digit_at(&d, d.first + i);
    }
  } else if (point_of(&d, &x) && x > -6 && x <= 0) {
    /* A small fraction: "0.", -x zeros, the digits. */
    out[pos++] = '0';
    out[pos++] = '.';
    memset(out + pos, '0', (size_t)-x);
    pos += (size_t)-x;
    for (size_t i = 0; i < k; i++)
      out[pos++] = digit_at(&d, d.first + i);
  } else {
    /* d[.ddd]e+y or d[.ddd]e-y, where y = x - 1. */
    out[pos++] = digit_at(&d, d.first);
    if (k > 1) {
      out[pos++] = '.';
      for (size_t i = 1; i < k; i++)
        out[pos++] = digit_at(&d, d.first + i);
    }
    out[pos++] = 'e';
    if (point_of(&d, &x)) {
      pos +=
          (size_t)snprintf(out + pos, 24, "%c%" PRId64, x - 1 < 0 ? '-' : '+',
                           x - 1 < 0 ? -(x - 1) : x - 1);
    } else {
      /* An exponent E of more than 18 digits: y = E + in - first - 1,
       * whose sign is E's, since |E| >= 10^18 outweighs the rest (texts
       * are shorter than 2^31 bytes). |y| = |E| + delta. */
      int64_t rest = (int64_t)d.in - (int64_t)d.first - 1;
      out[pos++] = d.exp_neg ? '-' : '+';
      pos += add_to_digits(d.ep, d.en, d.exp_neg ? -rest : rest, out + pos);
    }
  }
  out[pos] = '\0';
  *out_len = pos;
  return IDEM_OK;
}
