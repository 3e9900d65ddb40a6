/* numfmt.c -- ECMAScript Number.prototype.toString(10) for RFC 8785.
 *
 * The digits come from lib/shortest.c (Schubfach), which needs neither
 * printf() nor strtod(); this file places them by ECMAScript's notation
 * rules, writes JSON integers of up to 15 significant digits straight from
 * their text, and decides whether a number's text is "faithful" (see
 * numfmt.h) by comparing its digits with the shortest ones.
 */
#include "numfmt.h"

#include "internal.h"
#include "shortest.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Writes the decimal digits of m (no leading zeros; "0" for 0) at out and
 * returns how many: at most 20. */
static size_t put_u64(char *out, uint64_t m) {
  /* Two digits a division: "00" to "99". */
  static const char pairs[201] = "00010203040506070809"
                                 "10111213141516171819"
                                 "20212223242526272829"
                                 "30313233343536373839"
                                 "40414243444546474849"
                                 "50515253545556575859"
                                 "60616263646566676869"
                                 "70717273747576777879"
                                 "80818283848586878889"
                                 "90919293949596979899";
  char tmp[20];
  size_t n = 0;
  while (m >= 100) {
    size_t r = (size_t)(m % 100) * 2;
    m /= 100;
    n += 2;
    memcpy(tmp + sizeof tmp - n, pairs + r, 2);
  }
  if (m >= 10) {
    n += 2;
    memcpy(tmp + sizeof tmp - n, pairs + (size_t)m * 2, 2);
  } else {
    tmp[sizeof tmp - ++n] = (char)('0' + m);
  }
  memcpy(out, tmp + sizeof tmp - n, n);
  return n;
}

/*
 * Writes a number whose significant digits are digits[0..k) (no leading or
 * trailing zeros, k >= 1) and whose value is 0.DIGITS times 10 to the
 * power n, by ECMAScript's Number::toString rules; returns the bytes
 * written, at most k + 8 with the sign. Only the exponent's form needs n
 * to be small: callers pass |n| < 400.
 */
static size_t place_digits(char *out, int neg, const char *digits, int k,
                           int n) {
  size_t pos = 0;
  if (neg)
    out[pos++] = '-';
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
    int x = n - 1;
    out[pos++] = digits[0];
    if (k > 1) {
      out[pos++] = '.';
      memcpy(out + pos, digits + 1, (size_t)(k - 1));
      pos += (size_t)(k - 1);
    }
    out[pos++] = 'e';
    out[pos++] = x < 0 ? '-' : '+';
    pos += put_u64(out + pos, (uint64_t)(x < 0 ? -x : x));
  }
  return pos;
}

/* Writes ECMAScript's form of v, finite and not zero, at out; returns its
 * length. */
static size_t format_nonzero(double v, char *out) {
  char digits[20];
  uint64_t m;
  int e, k;
  idem__shortest(fabs(v), &m, &e);
  k = (int)put_u64(digits, m);
  return place_digits(out, v < 0, digits, k, e + k);
}

int idem__format_double(double v, char out[32], size_t *len) {
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
  *len = format_nonzero(v, out);
  out[*len] = '\0';
  return IDEM_OK;
}

static int is_dec_digit(char c) { return c >= '0' && c <= '9'; }

/* Exponents are read up to this size; a longer one only says "far out",
 * which every caller below treats as out of its range. */
#define EXPONENT_CAP 100000

/*
 * Where a valid JSON number's significant digits are, without converting
 * anything: the value is 0.DIGITS times 10 to the power x, where DIGITS
 * are those from the first to the last non-zero digit of the integer and
 * fraction digits taken together. The exponent is capped at EXPONENT_CAP
 * in size, which keeps x far from overflow and far out of every range the
 * fast paths accept.
 */
typedef struct number_scan {
  int neg;
  int zero;   /* no non-zero digit */
  size_t sig; /* significant digits, from the first to the last non-zero */
  long x;     /* the point's place, see above */
} number_scan;

static void scan_number(const char *s, size_t len, number_scan *out) {
  size_t i = 0, ni, seq = 0, first = 0, last = 0;
  long e = 0;
  int seen = 0, exp_neg = 0;
  out->neg = len > 0 && s[0] == '-';
  i = (size_t)out->neg;
  for (; i < len && is_dec_digit(s[i]); i++, seq++)
    if (s[i] != '0') {
      if (!seen)
        first = seq;
      seen = 1;
      last = seq;
    }
  ni = seq;
  if (i < len && s[i] == '.')
    for (i++; i < len && is_dec_digit(s[i]); i++, seq++)
      if (s[i] != '0') {
        if (!seen)
          first = seq;
        seen = 1;
        last = seq;
      }
  if (i < len && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < len && (s[i] == '+' || s[i] == '-'))
      exp_neg = s[i++] == '-';
    for (; i < len && is_dec_digit(s[i]); i++)
      if (e < EXPONENT_CAP)
        e = e * 10 + (s[i] - '0');
  }
  out->zero = !seen;
  out->sig = seen ? last - first + 1 : 0;
  /* Texts are shorter than 2^31 bytes (idem's limits say far less). */
  out->x = (long)ni - (long)first + (exp_neg ? -e : e);
}

int idem__format_small_integer(const char *text, size_t len, char out[32],
                               size_t *out_len) {
  size_t i = 0, pos = 0;
  number_scan d;

  /* The common case first: an integer with no fraction and no exponent,
   * written as its text is, once its sign says whether it is "-0". */
  if (len > 0 && text[0] == '-')
    i = 1;
  while (i < len && text[i] == '0')
    i++;
  {
    size_t start = i;
    while (i < len && is_dec_digit(text[i]))
      i++;
    if (i == len) {
      size_t n = i - start;
      /* 16 digits are exact too when at most 2^53, the last integer
       * below which every integer is a double. */
      if (n == 16) {
        uint64_t u = 0;
        for (size_t j = start; j < len; j++)
          u = u * 10 + (uint64_t)(text[j] - '0');
        if (u > ((uint64_t)1 << 53))
          return 0;
      } else if (n > 16) {
        return 0;
      }
      if (n == 0) {
        memcpy(out, "0", 2);
        *out_len = 1;
        return 1;
      }
      if (text[0] == '-')
        out[pos++] = '-';
      memcpy(out + pos, text + start, n);
      pos += n;
      out[pos] = '\0';
      *out_len = pos;
      return 1;
    }
  }

  /* A fraction or an exponent: still an integer when the point falls at or
   * after the last significant digit ("1.5e3", "120.00"). */
  scan_number(text, len, &d);
  if (d.zero) {
    memcpy(out, "0", 2);
    *out_len = 1;
    return 1;
  }
  if (d.sig > 15 || d.x < (long)d.sig || d.x > 21)
    return 0;
  if (d.neg)
    out[pos++] = '-';
  /* The significant digits, skipping the point, then the zeros the
   * exponent adds. */
  {
    size_t copied = 0;
    i = (size_t)d.neg;
    while (copied < d.sig) {
      char c = text[i++];
      if (c == '.' || (copied == 0 && c == '0'))
        continue;
      out[pos++] = c;
      copied++;
    }
  }
  memset(out + pos, '0', (size_t)d.x - d.sig);
  pos += (size_t)d.x - d.sig;
  out[pos] = '\0';
  *out_len = pos;
  return 1;
}

int idem__number_surely_finite(const char *text, size_t len) {
  number_scan d;
  scan_number(text, len, &d);
  /* Below 10^308 there is no overflow: DBL_MAX is 1.79e308. */
  return d.zero || d.x <= 308;
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

int idem__format_number_exact(const char *text, size_t len, double v, char *out,
                              size_t *out_len) {
  json_decimal d;
  char digits[20];
  size_t pos = 0, k;
  int64_t x = 0;

  out[0] = '\0';
  *out_len = 0;
  if (!isfinite(v))
    return idem__fail(IDEM_ERANGE, "number: %s has no JSON form",
                      isnan(v) ? "NaN" : "an infinity");
  read_decimal(text, len, &d);
  if (d.zero) {
    /* Zero, whatever its sign and digits, is "0" (v is 0 too). */
    memcpy(out, "0", 2);
    *out_len = 1;
    return IDEM_OK;
  }
  if (v != 0) {
    /* A text that underflows to zero is written exactly below. Otherwise
     * faithful when the shortest digits of v are the text's significant
     * digits, with the point at the same place and the same sign: one
     * comparison of digits, and no second formatting. */
    uint64_t m;
    int e, kv;
    idem__shortest(fabs(v), &m, &e);
    kv = (int)put_u64(digits, m);
    k = d.last - d.first + 1;
    if (d.neg == (v < 0) && k == (size_t)kv && point_of(&d, &x) &&
        x == (int64_t)e + kv) {
      size_t i = 0;
      while (i < k && digit_at(&d, d.first + i) == digits[i])
        i++;
      if (i == k) {
        pos = place_digits(out, d.neg, digits, kv, e + kv);
        out[pos] = '\0';
        *out_len = pos;
        return IDEM_OK;
      }
    }
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
