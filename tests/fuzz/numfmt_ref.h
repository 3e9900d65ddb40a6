/* numfmt_ref.h -- idem 0.3's number formatting, the reference of
 * fuzz_numfmt_diff.c (see numfmt_ref.c). The contracts are those of
 * idem__format_double() and idem__format_number_exact() in lib/numfmt.h. */
#ifndef IDEM_NUMFMT_REF_H
#define IDEM_NUMFMT_REF_H

#include "numfmt.h"

#include <stddef.h>

int ref_format_double(double v, char out[32], size_t *len);
int ref_format_number_exact(const char *text, size_t len, double v, char *out,
                            size_t *out_len);

#endif
