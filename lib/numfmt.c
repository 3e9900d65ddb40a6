/* numfmt.c -- ECMAScript Number.prototype.toString(10) for RFC 8785. */
#include "numfmt.h"

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

int idem__format_double(double v, char out[32], size_t *len) {
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
