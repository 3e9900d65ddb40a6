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

/*
 * The fast path for the numbers most requests are made of. When text (len
 * bytes, a valid RFC 8259 number) is an integer of at most 15 significant
 * digits below 10^21 ("42", "-0", "1.5e3", "120.00"), or an integer written
 * without fraction or exponent whose size is at most 2^53, writes at out what
 * both idem__format_double() of its double and idem__format_number_exact()
 * write, without converting it: its digits, then as many zeros as the
 * point's place asks, "-" before them when negative and not zero. Returns 1
 * then, with out NUL-terminated and *out_len its length (at most 22), and
 * 0, writing nothing, for any other number.
 *
 * Why the two agree: 15 significant digits always survive a trip through a
 * double (DBL_DIG), and integers up to 2^53 are doubles, so the shortest
 * digits of the text's double are the text's own digits, and below 10^21
 * ECMAScript writes them as an integer.
 */
int idem__format_small_integer(const char *text, size_t len, char out[32],
                               size_t *out_len);

/*
 * Whether the valid RFC 8259 number text (len bytes) is surely below
 * DBL_MAX in size, judged from its digits alone: true for zero and for
 * every value under 10^308. When false the caller must convert it to find
 * out whether it overflows.
 */
int idem__number_surely_finite(const char *text, size_t len);

/* The most bytes idem__format_number_exact() writes for a number text of
 * len bytes, its terminating NUL included. */
#define IDEM__EXACT_NUMBER_MAX(len) ((len) + 48)

/*
 * Writes a JSON number for a fingerprint, which must tell apart any two
 * numbers whose exact decimal values differ. text (len bytes) is a valid
 * RFC 8259 number and v the double nearest to its value, finite.
 *
 * When the shortest form of v that idem__format_double() writes (RFC
 * 8785's) has the exact decimal value of text, the number is "faithful"
 * and that form is written, byte for byte what RFC 8785 writes; 0.1 is
 * faithful, 12345678901234567 (whose double is 12345678901234568) is not.
 * Otherwise the number's exact value is written: its significant digits
 * without leading or trailing zeros, placed by the same notation rules as
 * ECMAScript's (plain for exponents -7 < x < 21, "d.ddde-x" otherwise),
 * with an exponent of any size. Both forms read back as exactly the value
 * they stand for, so no two values share a text.
 *
 * out must hold IDEM__EXACT_NUMBER_MAX(len) bytes. Returns IDEM_OK with out
 * NUL-terminated and *out_len its length; IDEM_ERANGE when v is not finite.
 * Time and memory are linear in len, whatever the exponent says.
 */
int idem__format_number_exact(const char *text, size_t len, double v, char *out,
                              size_t *out_len);

#endif
