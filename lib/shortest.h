/* shortest.h -- the shortest decimal that reads back as a double. */
#ifndef IDEM_SHORTEST_H
#define IDEM_SHORTEST_H

#include <stdint.h>

/*
 * For v finite and positive, finds the decimal *digits times 10 to the
 * power *exp10 with the fewest significant digits that reads back as v
 * (round to nearest, ties to even), and of those the closest to v, the even
 * one on a tie: the digits of ECMAScript's Number.prototype.toString(10).
 * *digits has no trailing zeros and at most 17 digits.
 *
 * Schubfach (Raffaello Giulietti, "The Schubfach way to render doubles",
 * 2020): three 64 by 126-bit products, no loop, no strtod().
 */
void idem__shortest(double v, uint64_t *digits, int *exp10);

/* The high 64 bits of a 64 by 64-bit product, and its low 64 in *lo
 * (shortest.c's and decimal.c's). */
static inline uint64_t idem__mul_64(uint64_t a, uint64_t b, uint64_t *lo) {
#if defined(__SIZEOF_INT128__)
  unsigned __int128 p = (unsigned __int128)a * b;
  *lo = (uint64_t)p;
  return (uint64_t)(p >> 64);
#else
  /* Four 32 by 32-bit products, for compilers without a 128-bit type. */
  uint64_t al = a & 0xffffffffu, ah = a >> 32;
  uint64_t bl = b & 0xffffffffu, bh = b >> 32;
  uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
  uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
  *lo = (mid << 32) | (ll & 0xffffffffu);
  return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

#endif
