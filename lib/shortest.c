/*
 * shortest.c -- the shortest round-trip digits of a double, by Raffaello
 * Giulietti's Schubfach ("The Schubfach way to render doubles", 2020; the
 * algorithm behind Java 19's Double.toString()).
 *
 * v = c 2^q (c the significand with its hidden bit, q the binary exponent).
 * The decimals that read back as v fill the rounding interval R around v,
 * whose ends are the midpoints to v's neighbours: closed when c is even
 * (ties go to even), open otherwise. Everything is counted in quarters of
 * 2^q, so that R's ends are the integers cbl and cbr around cb = 4c.
 *
 * k is chosen so that R, scaled by 10^-k, is between 1 and 10 units wide:
 * it then holds at least one integer (an integer of decimals times 10^k
 * that reads back as v) and at most one multiple of 10. So the shortest
 * decimal is the multiple of 10 when R holds it, and otherwise one of the
 * two integers s = floor(v 10^-k) and s + 1 around v: no loop over lengths.
 *
 * The scaled values come from one product each of a 126-bit approximation
 * g of 10^-k (tests/gen_pow10.py generates the table) with the quarter
 * counts, rounded to odd: the last bit says whether anything was cut off.
 * The paper proves that with g = floor(10^-k 2^-r) + 1 and the truncations
 * below, every comparison the algorithm makes comes out as it would in
 * exact arithmetic, for every double. The code below follows its section 9
 * and figure 8; the table layout (g1 and g0 of 63 bits each) is the
 * paper's, which its proof is about.
 */
#include "shortest.h"

#include "shortest_pow10.h"

#include <string.h>

#define SIG_BITS 52
#define C_MIN ((uint64_t)1 << SIG_BITS)
#define Q_MIN (-1074)
#define MASK63 (((uint64_t)1 << 63) - 1)

/*
 * floor(log10(2^q)), floor(log10(3/4 2^q)) and floor(log2(10^e)) in fixed
 * point, exact over every exponent a double has (tests/gen_pow10.py checks
 * them against exact arithmetic). They shift negative products right,
 * which gcc and clang define as an arithmetic shift, rounding down.
 */
static int flog10_pow2(int q) {
  return (int)(((int64_t)q * 661971961083LL) >> 41);
}

static int flog10_three_quarters_pow2(int q) {
  return (int)(((int64_t)q * 661971961083LL - 274743187321LL) >> 41);
}

static int flog2_pow10(int e) {
  return (int)(((int64_t)e * 913124641741LL) >> 38);
}

/*
 * cp g / 2^127 rounded to odd, where g = g1 2^63 + g0: the integer part,
 * with its last bit set when the fraction that is kept is not zero. The
 * low bits of g0 cp are dropped: g's error lives there, so an exact
 * integer quotient is still recognised as one.
 */
static uint64_t round_to_odd(uint64_t g1, uint64_t g0, uint64_t cp) {
  uint64_t unused, y0;
  uint64_t x1 = idem__mul_64(g0, cp, &unused);
  uint64_t y1 = idem__mul_64(g1, cp, &y0);
  uint64_t z = (y0 >> 1) + x1;
  uint64_t vbp = y1 + (z >> 63);
  return vbp | ((z & MASK63) != 0);
}

/* Removes the trailing zeros of *f, raising *e to match. */
static void strip_zeros(uint64_t *f, int *e) {
  while (*f % 10 == 0) {
    *f /= 10;
    ++*e;
  }
}

/* The general case: c 2^q with c > 0, as *digits 10^*exp10. */
static void to_decimal(int q, uint64_t c, uint64_t *digits, int *exp10) {
  uint64_t out = c & 1; /* 1 when R is open: its ends do not read back */
  uint64_t cb = c << 2, cbr = cb + 2, cbl, g1, g0, vb, vbl, vbr, s, t, f;
  int k, h;

  if (c != C_MIN || q == Q_MIN) {
    /* The neighbours are equally far on both sides. */
    cbl = cb - 2;
    k = flog10_pow2(q);
  } else {
    /* At a power of two the neighbour below is half as far as the one
     * above, so R reaches a quarter of 2^q downwards: its width is 3/4 of
     * 2^q, and k is chosen for that width. */
    cbl = cb - 1;
    k = flog10_three_quarters_pow2(q);
  }
  /* h (1 to 4) aligns the products so that vb = 4 v 10^-k. */
  h = q + flog2_pow10(-k) + 2;
  g1 = IDEM__G[k - IDEM__G_K_MIN][0];
  g0 = IDEM__G[k - IDEM__G_K_MIN][1];
  vb = round_to_odd(g1, g0, cb << h);
  vbl = round_to_odd(g1, g0, cbl << h);
  vbr = round_to_odd(g1, g0, cbr << h);

  s = vb >> 2;
  if (s >= 10) {
    /* A multiple of 10 in R has fewer significant digits than s and t. R
     * is under 10 units wide, so only sp10 (at or below v) or tp10 (above
     * it) can be in R, never both. When s < 10 the multiple of ten 10 has
     * as many digits as s, and the closer of the two must win below. */
    uint64_t sp10 = 10 * (s / 10), tp10 = sp10 + 10;
    int upin = vbl + out <= sp10 << 2;
    int wpin = (tp10 << 2) + out <= vbr;
    if (upin != wpin) {
      f = upin ? sp10 : tp10;
      goto done;
    }
  }
  /* R is at least one unit wide, so s or t = s + 1 is in it. */
  t = s + 1;
  {
    int uin = vbl + out <= s << 2;
    int win = (t << 2) + out <= vbr;
    if (uin != win) {
      f = uin ? s : t;
    } else {
      /* Both: the closer to v, s on a tie when s is even. vb is odd
       * unless exact, so it equals 4s + 2 only on a true tie. */
      uint64_t mid = (s + t) << 1;
      f = vb < mid || (vb == mid && (s & 1) == 0) ? s : t;
    }
  }
done:
  *exp10 = k;
  strip_zeros(&f, exp10);
  *digits = f;
}

void idem__shortest(double v, uint64_t *digits, int *exp10) {
  uint64_t bits, t;
  int bq;

  memcpy(&bits, &v, sizeof bits);
  t = bits & (C_MIN - 1);
  bq = (int)((bits >> SIG_BITS) & 0x7ff);
  if (bq == 0) {
    /* A subnormal: no hidden bit, and the exponent of the smallest. */
    to_decimal(Q_MIN, t, digits, exp10);
    return;
  }
  {
    uint64_t c = C_MIN | t;
    int q = bq - 1075;
    /* An integer below 2^53: its neighbours are at most 1 away, so no
     * other decimal with as few digits reads back as it. */
    if (q < 0 && q > -SIG_BITS - 1) {
      uint64_t f = c >> -q;
      if (f << -q == c) {
        *exp10 = 0;
        strip_zeros(&f, exp10);
        *digits = f;
        return;
      }
    }
    to_decimal(q, c, digits, exp10);
  }
}
