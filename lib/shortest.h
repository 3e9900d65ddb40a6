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

#endif
