/*
 * decimal.c -- the double nearest to a decimal text, ties to even, as
 * strtod() reads it but in three steps, the first that can decide winning:
 *
 * 1. Clinger's fast path (William D. Clinger, "How to read floating point
 *    numbers accurately", 1990): when the significand w has at most 53 bits
 *    and |q| <= 22 in w 10^q, both w and 10^|q| are doubles, and one
 *    correctly rounded multiplication or division is the answer.
 *
 * 2. Eisel-Lemire (Daniel Lemire, "Number Parsing at a Gigabyte per
 *    Second", 2021, after Michael Eisel): w 10^q = w 5^q 2^q, and one 64 by
 *    128-bit product of w with a table value of 5^q (tests/gen_pow5.py)
 *    gives the value's leading bits. The product is exact when 5^q fits in
 *    128 bits; otherwise it is below the exact one by less than 2^64 units
 *    of its last bit, and it decides the rounding unless the bits below the
 *    rounding point are all ones that far down (see eisel_lemire()). For
 *    texts of more than 19 significant digits, w is their first 19 and the
 *    value lies between w 10^q and (w + 1) 10^q: when both round to the
 *    same double, so does the value.
 *
 * 3. strtod(), for what the first two cannot decide: texts of at most 19
 *    digits only when their value is within 2^-74 units in the last place
 *    of a rounding boundary (exact ties of texts that need a rounded power
 *    of five, q < 0, among them), and longer texts whose value sits at a
 *    rounding boundary within their 19th digit (about 1 in 10,000 of the
 *    20 to 25 digit integers of bench/canon.sh).
 *
 * The code is written from the paper's description and its own proof
 * below, not from any implementation's source.
 */
#include "decimal.h"

#include "decimal_pow5.h"
#include "internal.h"
#include "shortest.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 19 decimal digits always fit in 64 bits (10^19 - 1 < 2^64). */
#define MAX_DIGITS 19

/* Exponents are read up to this size; past it only their sign matters,
 * since every larger one rounds to zero or overflows. */
#define EXPONENT_CAP 100000

/* The parts of a decimal text: value = (-1)^neg w 10^q, or a little more
 * than that (less than (w + 1) 10^q) when truncated. */
typedef struct decimal {
  int neg;
  uint64_t w;    /* at most MAX_DIGITS significant digits; 0 for zero */
  long q;        /* the exponent of w's last digit */
  int truncated; /* non-zero digits were left out of w */
} decimal;

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/*
 * Reads a valid JSON number into its parts. Most texts have at most 19
 * digits in all, leading zeros included ("0.0042", "-17.25e3"): those are
 * read in one loop. Longer ones skip their leading zeros and keep the
 * first MAX_DIGITS significant digits.
 */
static void read_decimal(const char *s, size_t len, decimal *d) {
  const char *p = s, *end = s + len, *ip, *ie, *fp, *fe;
  int exp_neg = 0;
  long e = 0;
  memset(d, 0, sizeof *d);
  if (p < end && *p == '-') {
    d->neg = 1;
    p++;
  }
  ip = p;
  while (p < end && is_digit(*p))
    p++;
  ie = fp = fe = p;
  if (p < end && *p == '.') {
    fp = ++p;
    while (p < end && is_digit(*p))
      p++;
    fe = p;
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < end && (*p == '+' || *p == '-'))
      exp_neg = *p++ == '-';
    for (; p < end && is_digit(*p); p++)
      if (e < EXPONENT_CAP)
        e = e * 10 + (*p - '0');
  }
  /* |q| stays below EXPONENT_CAP plus the text's length, which idem's
   * limits keep far below LONG_MAX. */
  d->q = (exp_neg ? -e : e) - (long)(fe - fp);
  if ((ie - ip) + (fe - fp) <= MAX_DIGITS) {
    for (p = ip; p < ie; p++)
      d->w = d->w * 10 + (uint64_t)(*p - '0');
    for (p = fp; p < fe; p++)
      d->w = d->w * 10 + (uint64_t)(*p - '0');
    return;
  }
  {
    int kept = 0;
    /* The digits one after the other, the integer's then the fraction's;
     * each one left out of w raises the exponent of w's last digit. */
    for (p = ip; p < fe; p++) {
      if (p == ie)
        p = fp;
      if (p == fe)
        break;
      if (kept == 0 && *p == '0')
        continue;
      if (kept < MAX_DIGITS) {
        d->w = d->w * 10 + (uint64_t)(*p - '0');
        kept++;
      } else {
        d->q++;
        d->truncated |= *p != '0';
      }
    }
  }
}

/* ------------------------------------------------------------------ */
/* Clinger's fast path                                                  */
/* ------------------------------------------------------------------ */

/*
 * One correctly rounded operation on exact doubles is only the answer when
 * the compiler evaluates in double precision (FLT_EVAL_METHOD 0: SSE2 and
 * every 64-bit target gcc and clang know, but not x87).
 */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define HAVE_CLINGER 1
#else
#define HAVE_CLINGER 0
#endif

/* The powers of ten that are doubles exactly: 5^22 < 2^53. */
static const double exact_pow10[23] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* ------------------------------------------------------------------ */
/* Eisel-Lemire                                                         */
/* ------------------------------------------------------------------ */

/* The leading zero bits of x, not 0. */
static int leading_zeros(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
  return __builtin_clzll(x);
#else
  int n = 0;
  while (!(x >> 63)) {
    x <<= 1;
    n++;
  }
  return n;
#endif
}

/* floor(log2(5^q)) for IDEM__POW5_Q_MIN <= q <= IDEM__POW5_Q_MAX, in fixed
 * point (tests/gen_pow5.py checks it against exact arithmetic); a negative
 * product shifts right arithmetically in gcc and clang, rounding down. */
static int floor_log2_pow5(int q) { return (int)(((int64_t)q * 152170) >> 16); }

#define SIG_BITS 52
#define HIDDEN_BIT ((uint64_t)1 << SIG_BITS)
#define EXP_INF 2047

/*
 * The bits of the double nearest to w 10^q (w > 0, q within the table),
 * ties to even, into *bits; 1 when the product decides it, 0 when not.
 *
 * Let W = w 2^z (z leading zeros: 2^63 <= W < 2^64), and let the table's
 * T = floor(t), where 5^q = t 2^f with 2^127 <= t < 2^128. Then
 *   w 10^q = W t 2^(q + f - z) = P' 2^E,  P' = W t,  E = q + f - z,
 * and P = W T, the 192 bits computed below, has P <= P' < P + W, so
 * P' - P < 2^64; P = P' when T = t (0 <= q <= 55, 5^q exact).
 *
 * P' has its leading bit at 190 or 191 (u, the top bit of P, says which,
 * and where the two differ P is within 2^64 of 2^191, where both choices
 * round to the same double). A normal double keeps 53 bits, so the s =
 * 138 + u bits below are rounded off; a subnormal keeps the bits from
 * 2^-1074 up, so s = -1074 - E when that is more. The result is the
 * significand m = round(P' / 2^s) and the exponent E + s. With X = P +
 * 2^(s-1) and t = X mod 2^s, m = floor(X / 2^s), except:
 *  - when P is exact and t = 0, P' is a tie: m goes to the even one;
 *  - when P is not exact, X' = X + (P' - P) with 0 < P' - P < 2^64: when
 *    t <= 2^s - 2^64, X' is in X's cell and past its start (no tie), and
 *    m is right; otherwise the bits of t below 2^s are all ones from bit 64
 *    up, and only an exact computation can tell (never for w 10^q far from
 *    a boundary; exact ties of q < 0 always land here, as P' - P is then
 *    what separates them from the boundary).
 */
static int eisel_lemire(uint64_t w, int q, uint64_t *bits) {
  const uint64_t *t = IDEM__POW5[q - IDEM__POW5_Q_MIN];
  int z = leading_zeros(w), u, s, h;
  uint64_t W = w << z, a0, a1, b0, b1, p0, p1, p2, x2, x3, mask, m, t_hi;
  long E;

  /* P = W T_high 2^64 + W T_low, in three words p2 p1 p0. */
  a1 = idem__mul_64(W, t[0], &a0);
  b1 = idem__mul_64(W, t[1], &b0);
  p0 = b0;
  p1 = a0 + b1;
  p2 = a1 + (p1 < a0);
  u = (int)(p2 >> 63);
  E = (long)q + (floor_log2_pow5(q) - 127) - z;

  s = 138 + u;
  if (-1074 - E > s)
    s = (int)(-1074 - E);
  if (s > 192) {
    /* P' < 2^192 <= 2^(s-1): below half the smallest subnormal. */
    *bits = 0;
    return 1;
  }
  /* 2^(s-1) lies in p2, whose top h bits are above the rounding point. */
  h = s - 128;
  mask = h == 64 ? ~(uint64_t)0 : ((uint64_t)1 << h) - 1;
  x2 = p2 + ((uint64_t)1 << (h - 1));
  x3 = x2 < p2;
  m = h == 64 ? x3 : (x3 << (64 - h)) | (x2 >> h);
  t_hi = x2 & mask;
  if (q >= 0 && q <= 55) {
    if (t_hi == 0 && p1 == 0 && p0 == 0)
      m &= ~(uint64_t)1;
  } else if (t_hi == mask && p1 == ~(uint64_t)0) {
    return 0;
  }

  E += s; /* now the exponent of m's last bit */
  if (m == HIDDEN_BIT << 1) {
    /* Rounded up into the next binade. */
    m = HIDDEN_BIT;
    E++;
  }
  if (m < HIDDEN_BIT) {
    /* A subnormal (E = -1074) or zero: biased exponent 0. */
    *bits = m;
    return 1;
  }
  E += 1075; /* the biased exponent: m 2^-1074 is 2^52 2^-1074 = 2^-1022 */
  if (E >= EXP_INF) {
    *bits = (uint64_t)EXP_INF << SIG_BITS;
    return 1;
  }
  *bits = (uint64_t)E << SIG_BITS | (m - HIDDEN_BIT);
  return 1;
}

static double from_bits(uint64_t bits, int neg) {
  double v;
  bits |= (uint64_t)neg << 63;
  memcpy(&v, &bits, sizeof v);
  return v;
}

int idem__decimal_to_double_fast(const char *text, size_t len, double *out) {
  decimal d;
  uint64_t bits, above;
  read_decimal(text, len, &d);
  if (d.w == 0) {
    *out = d.neg ? -0.0 : 0.0;
    return 1;
  }
#if HAVE_CLINGER
  if (!d.truncated && d.w <= HIDDEN_BIT << 1 && d.q >= -22 && d.q <= 22) {
    double v = (double)d.w;
    v = d.q < 0 ? v / exact_pow10[-d.q] : v * exact_pow10[d.q];
    *out = d.neg ? -v : v;
    return 1;
  }
#endif
  if (d.q < IDEM__POW5_Q_MIN) {
    /* Below 10^19 10^-343 = 1e-324, under half the smallest subnormal. */
    *out = d.neg ? -0.0 : 0.0;
    return 1;
  }
  if (d.q > IDEM__POW5_Q_MAX) {
    /* At least 10^309. */
    *out = d.neg ? -HUGE_VAL : HUGE_VAL;
    return 1;
  }
  if (!eisel_lemire(d.w, (int)d.q, &bits))
    return 0;
  /* A truncated text lies between w 10^q and (w + 1) 10^q. */
  if (d.truncated &&
      (!eisel_lemire(d.w + 1, (int)d.q, &above) || above != bits))
    return 0;
  *out = from_bits(bits, d.neg);
  return 1;
}

/* ------------------------------------------------------------------ */
/* strtod(), for the rest                                               */
/* ------------------------------------------------------------------ */

/*
 * strtod() reads the decimal point of the current locale, so the number is
 * handed to it without one: its digits, then an exponent that makes up for
 * the digits moved. glibc's strtod() rounds correctly however many digits
 * there are.
 */
static int slow_path(const char *s, size_t len, double *out) {
  char small[128], *buf = small;
  size_t o = 0, i = 0;
  long long exp = 0, moved = 0;
  int exp_neg = 0;
  if (len + 32 > sizeof small && (buf = malloc(len + 32)) == NULL)
    return idem__fail(IDEM_ENOMEM, "number: out of memory");
  if (s[i] == '-')
    buf[o++] = s[i++];
  while (i < len && is_digit(s[i]))
    buf[o++] = s[i++];
  if (i < len && s[i] == '.')
    for (i++; i < len && is_digit(s[i]); i++, moved++)
      buf[o++] = s[i];
  if (i < len) { /* 'e' or 'E' */
    i++;
    if (s[i] == '+' || s[i] == '-')
      exp_neg = s[i++] == '-';
    for (; i < len; i++)
      if (exp < 1000000000000LL) /* past that, only the sign matters */
        exp = exp * 10 + (s[i] - '0');
  }
  exp = (exp_neg ? -exp : exp) - moved;
  snprintf(buf + o, 32, "e%lld", exp);
  *out = strtod(buf, NULL);
  if (buf != small)
    free(buf);
  return IDEM_OK;
}

int idem__decimal_to_double(const char *text, size_t len, double *out) {
  double v;
  int rc = IDEM_OK;
  if (!idem__decimal_to_double_fast(text, len, &v))
    rc = slow_path(text, len, &v);
  if (rc != IDEM_OK)
    return rc;
  if (isinf(v))
    return idem__fail(IDEM_ERANGE, "number: outside the range of a double");
  *out = v;
  return IDEM_OK;
}
