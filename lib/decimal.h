/* decimal.h -- the double nearest to a JSON number's decimal text. */
#ifndef IDEM_DECIMAL_H
#define IDEM_DECIMAL_H

#include <stddef.h>

/*
 * Reads text (len bytes, a valid RFC 8259 number) as the double nearest to
 * its value, ties to even: exactly what strtod() reads in the "C" locale,
 * for any number of digits and any exponent, but without a locale, without
 * copying the text and, for all but rare inputs, without strtod().
 *
 * Returns IDEM_OK with *out the double (a value too small for a double
 * reads as a zero of its sign, as in ECMAScript's JSON.parse); IDEM_ERANGE
 * when the value rounds past DBL_MAX, leaving *out alone; IDEM_ENOMEM when
 * the rare fallback to strtod() finds no memory for a long text.
 */
int idem__decimal_to_double(const char *text, size_t len, double *out);

/*
 * The same without the fallback, for tests: returns 1 with *out the double
 * (an infinity when the value overflows) when the fast steps decide it, 0
 * when only strtod() can.
 */
int idem__decimal_to_double_fast(const char *text, size_t len, double *out);

#endif
