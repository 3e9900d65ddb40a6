/*
 * numfmt_ecmascript.c -- writes doubles and idem's text of each, for
 * numfmt_ecmascript.mjs to compare with ECMAScript's own String(x).
 *
 * Usage: numfmt_ecmascript N [SEED]
 *
 * Each line is "HEXBITS TEXT": first every boundary case below, then N
 * doubles from a fixed seed (splitmix64): three in four are random bit
 * patterns (NaN and the infinities, which JSON cannot hold, skipped), one
 * in four has its exponent drawn where ECMAScript writes plain decimals.
 * The last line is "end COUNT", so that a stream cut short never passes.
 */
#include "idem.h"
#include "numfmt.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned long long written;

static void emit(double v) {
  char out[32];
  size_t len = 0;
  uint64_t bits;
  if (!isfinite(v))
    return;
  memcpy(&bits, &v, sizeof bits);
  if (idem__format_double(v, out, &len) != IDEM_OK) {
    fprintf(stderr, "numfmt_ecmascript: %016llx refused\n",
            (unsigned long long)bits);
    exit(1);
  }
  printf("%016llx %s\n", (unsigned long long)bits, out);
  written++;
}

/* v, its neighbours, and the same of -v. */
static void emit_around(double v) {
  emit(v);
  emit(nextafter(v, INFINITY));
  emit(nextafter(v, -INFINITY));
  emit(-v);
}

static double from_bits(uint64_t bits) {
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void boundaries(void) {
  char text[64];
  /* Zeros, subnormals, the normal range's ends. */
  emit_around(0.0);
  for (uint64_t b = 1; b <= 64; b++)
    emit_around(from_bits(b));
  emit_around(from_bits(0x000fffffffffffffull));
  emit_around(from_bits(0x0010000000000000ull));
  emit_around(from_bits(0x7fefffffffffffffull));
  /* Every power of two, where the gap below is half the gap above. */
  for (int e = -1074; e <= 1023; e++)
    emit_around(ldexp(1, e));
  /* Integers around 2^53, 2^63 and 2^64, and of 15 to 17 digits. */
  for (int k = -200; k <= 200; k++) {
    emit(9007199254740992.0 + k);
    emit(9223372036854775808.0 + k * 1024.0);
    emit(18446744073709551616.0 + k * 2048.0);
  }
  for (int d = 15; d <= 17; d++)
    for (int k = 0; k < 100; k++) {
      snprintf(text, sizeof text, "%d%0*d", 1 + k % 9, d - 1, k * 7919);
      emit_around(strtod(text, NULL));
    }
  /* Short decimals d 10^m, some exactly halfway between two doubles (1e23,
   * 6.0003e20): the double each reads as, and its neighbours. */
  for (int m = -30; m <= 30; m++)
    for (int d = 1; d <= 999; d++) {
      snprintf(text, sizeof text, "%de%d", d, m);
      emit_around(strtod(text, NULL));
    }
  for (int m = -330; m <= 310; m++) {
    snprintf(text, sizeof text, "1e%d", m);
    emit_around(strtod(text, NULL));
  }
  /* The thresholds of ECMAScript's notation, and old favourites. */
  emit_around(1e21);
  emit_around(1e-7);
  emit_around(1e-6);
  emit_around(0.1 + 0.2);
  emit_around(123e-20);
  emit_around(5e-324);
  emit_around(1.7976931348623157e308);
  emit_around(9007199254740993.0);
}

int main(int argc, char **argv) {
  unsigned long long n, i;
  uint64_t state;
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s N [SEED]\n", argv[0]);
    return 2;
  }
  n = strtoull(argv[1], NULL, 10);
  state = argc == 3 ? strtoull(argv[2], NULL, 0) : 0x1de3u;
  boundaries();
  for (i = 0; i < n;) {
    uint64_t bits = splitmix64(&state);
    if (i % 4 == 3) {
      /* An exponent between 2^-30 and 2^80: plain notation, mostly. */
      uint64_t e = 1023 - 30 + (bits >> 52) % 111;
      bits = (bits & 0x800fffffffffffffull) | (e << 52);
    }
    if (((bits >> 52) & 0x7ff) == 0x7ff)
      continue;
    emit(from_bits(bits));
    i++;
  }
  printf("end %llu\n", written);
  return fflush(stdout) == 0 ? 0 : 1;
}
