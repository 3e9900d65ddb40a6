/* numfmt.h -- ECMAScript number serialisation for canonical JSON. */
#ifndef IDEM_NUMFMT_H
#define IDEM_NUMFMT_H

#include <stddef.h>

/*
 * Writes v as ECMAScript's Number.prototype.toString(10) does, which RFC 8785
 * requires for every JSON number: the shortest digits that read back as v
 * (the closest such digits when several qualify), in plain or exponent
 * notation by the ECMAScript rules. -0 is written "0".
 *
 * Returns IDEM_OK with out NUL-terminated and *len its length (at most 25),
 * or IDEM_ERANGE for NaN and the infinities, which JSON cannot express; then
 * out is "" and *len 0.
 */
int idem__format_double(double v, char out[32], size_t *len);

#endif
