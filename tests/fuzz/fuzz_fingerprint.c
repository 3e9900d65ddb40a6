/*
 * fuzz_fingerprint.c -- the numbers of a fingerprint (lib/numfmt.c,
 * idem__format_number_exact(), through lib/canon.c's
 * idem__fingerprint_text()) against an exact-decimal reference of this
 * driver's own.
 *
 * The reference reads a JSON number as sign, integer M without trailing
 * zeros and exponent Q, value M * 10^Q, with Q a decimal string of any
 * length (its own schoolbook arithmetic), so that it shares no code and no
 * method with the library, which places a point among the digits.
 *
 * Input: A, or A NUL B, each a JSON text. Properties, each an abort() when
 * broken:
 *  - any text: the fingerprint's text is refused exactly when
 *    idem_canonicalize() refuses, with the same code; else it is its own
 *    fingerprint text again, idem_canonicalize() of it is the canonical
 *    form of the input (its numbers read back as the same doubles), and
 *    idem_fingerprint() is its SHA-256;
 *  - a text that is one number: the fingerprint's text is one JSON number
 *    of exactly the input's value; it is RFC 8785's form byte for byte when
 *    that form has the input's value (the number is faithful: 0.2's
 *    fingerprint is kept), and differs from it otherwise; texts of the same
 *    value written otherwise (M e Q, 0.M e Q+len, M000 e Q-3) get the same
 *    text and the same refusal, and a text of another value (the last
 *    digit or the exponent changed) another text;
 *  - A and B, both numbers: their texts are equal exactly when the
 *    reference says their values are;
 *  - the number selected by the pointer "/n" from {"n": A} is written as
 *    in the whole text.
 */
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_fingerprint: property violated: %s (line %d)\n",   \
              #cond, __LINE__);                                                \
      abort();                                                                 \
    }                                                                          \
  } while (0)

/* ------------------------------------------------------------------ */
/* Signed decimal integers of any length, as strings                    */
/* ------------------------------------------------------------------ */

typedef struct bigint {
  int neg;
  char *mag; /* digits without leading zeros; "0" for zero (never neg) */
} bigint;

static char *dup_digits(const char *s, size_t n) {
  char *d;
  while (n > 1 && *s == '0') {
    s++;
    n--;
  }
  d = malloc(n + 2);
  CHECK(d != NULL);
  if (n == 0) {
    memcpy(d, "0", 2);
  } else {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

static int cmp_mag(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la != lb)
    return la < lb ? -1 : 1;
  return strcmp(a, b) < 0 ? -1 : strcmp(a, b) > 0;
}

static char *add_mag(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), n = (la > lb ? la : lb) + 1;
  char *r = malloc(n + 1);
  int carry = 0;
  CHECK(r != NULL);
  r[n] = '\0';
  for (size_t i = 0; i < n; i++) {
    int x = i < la ? a[la - 1 - i] - '0' : 0;
    int y = i < lb ? b[lb - 1 - i] - '0' : 0;
    int s = x + y + carry;
    carry = s / 10;
    r[n - 1 - i] = (char)('0' + s % 10);
  }
  {
    char *d = dup_digits(r, n);
    free(r);
    return d;
  }
}

/* a - b for a >= b. */
static char *sub_mag(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *r = malloc(la + 1);
  int borrow = 0;
  CHECK(r != NULL);
  r[la] = '\0';
  for (size_t i = 0; i < la; i++) {
    int x = a[la - 1 - i] - '0' - borrow;
    int y = i < lb ? b[lb - 1 - i] - '0' : 0;
    borrow = x < y;
    r[la - 1 - i] = (char)('0' + x - y + (borrow ? 10 : 0));
  }
  CHECK(borrow == 0);
  {
    char *d = dup_digits(r, la);
    free(r);
    return d;
  }
}

static bigint big_add(bigint a, bigint b) {
  bigint r;
  if (a.neg == b.neg) {
    r.neg = a.neg;
    r.mag = add_mag(a.mag, b.mag);
  } else if (cmp_mag(a.mag, b.mag) >= 0) {
    r.neg = a.neg;
    r.mag = sub_mag(a.mag, b.mag);
  } else {
    r.neg = b.neg;
    r.mag = sub_mag(b.mag, a.mag);
  }
  if (strcmp(r.mag, "0") == 0)
    r.neg = 0;
  return r;
}

static bigint big_small(long long v) {
  char buf[32];
  bigint r;
  snprintf(buf, sizeof buf, "%lld", v < 0 ? -v : v);
  r.neg = v < 0;
  r.mag = dup_digits(buf, strlen(buf));
  return r;
}

/* ------------------------------------------------------------------ */
/* The reference: a JSON number's exact value                           */
/* ------------------------------------------------------------------ */

typedef struct exact {
  int zero;
  int neg;
  char *m;  /* the integer of significant digits, no trailing zeros */
  bigint q; /* value = m * 10^q */
} exact;

static int digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Whether s[0..n) is one number by RFC 8259's grammar, without spaces. */
static int is_json_number(const uint8_t *s, size_t n) {
  size_t i = 0;
  if (i < n && s[i] == '-')
    i++;
  if (i >= n || !digit(s[i]))
    return 0;
  if (s[i] == '0')
    i++;
  else
    while (i < n && digit(s[i]))
      i++;
  if (i < n && s[i] == '.') {
    if (++i >= n || !digit(s[i]))
      return 0;
    while (i < n && digit(s[i]))
      i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      i++;
    if (i >= n || !digit(s[i]))
      return 0;
    while (i < n && digit(s[i]))
      i++;
  }
  return i == n;
}

/* The exact value of a valid number text. */
static exact read_exact(const uint8_t *s, size_t n) {
  exact e;
  size_t i = 0, nd = 0, frac = 0, tz = 0;
  char *all = malloc(n + 1);
  bigint x, shift;
  CHECK(all != NULL);
  memset(&e, 0, sizeof e);
  if (s[i] == '-') {
    e.neg = 1;
    i++;
  }
  while (i < n && digit(s[i]))
    all[nd++] = (char)s[i++];
  if (i < n && s[i] == '.')
    for (i++; i < n && digit(s[i]); i++, frac++)
      all[nd++] = (char)s[i];
  x.neg = 0;
  if (i < n) {
    i++;
    if (s[i] == '+' || s[i] == '-')
      x.neg = s[i++] == '-';
    x.mag = dup_digits((const char *)s + i, n - i);
    if (strcmp(x.mag, "0") == 0)
      x.neg = 0;
  } else {
    x.mag = dup_digits("0", 1);
  }
  while (tz < nd && all[nd - 1 - tz] == '0')
    tz++;
  e.m = dup_digits(all, nd - tz);
  e.zero = strcmp(e.m, "0") == 0;
  if (e.zero) {
    e.neg = 0;
    e.q = big_small(0);
  } else {
    shift = big_small((long long)tz - (long long)frac);
    e.q = big_add(x, shift);
    free(shift.mag);
  }
  free(x.mag);
  free(all);
  return e;
}

static int same_exact(const exact *a, const exact *b) {
  if (a->zero || b->zero)
    return a->zero && b->zero;
  return a->neg == b->neg && strcmp(a->m, b->m) == 0 && a->q.neg == b->q.neg &&
         strcmp(a->q.mag, b->q.mag) == 0;
}

static void free_exact(exact *e) {
  free(e->m);
  free(e->q.mag);
}

/* Writes "[-]PREFIX M SUFFIX e[-]Q" into a fresh string. */
static char *number_text(const exact *e, const char *prefix, const char *m,
                         const char *suffix, bigint q) {
  size_t n = strlen(prefix) + strlen(m) + strlen(suffix) + strlen(q.mag) + 8;
  char *t = malloc(n);
  CHECK(t != NULL);
  snprintf(t, n, "%s%s%s%se%s%s", e->neg ? "-" : "", prefix, m, suffix,
           q.neg ? "-" : "", q.mag);
  return t;
}

/* ------------------------------------------------------------------ */
/* The library                                                          */
/* ------------------------------------------------------------------ */

/* The fingerprint's text of n bytes (NULL, and the code in *rc, when
 * refused), from an exact-size heap copy. */
static char *fp_text(const void *s, size_t n, const char *const *ptrs, int *rc,
                     size_t *len) {
  char *copy = malloc(n ? n : 1), *out = NULL;
  CHECK(copy != NULL);
  if (n)
    memcpy(copy, s, n);
  *len = 0;
  *rc = idem__fingerprint_text(copy, n, ptrs, &out, len, NULL);
  CHECK((*rc == IDEM_OK) == (out != NULL));
  free(copy);
  return out;
}

static char *canon_text(const void *s, size_t n, int *rc, size_t *len) {
  char *copy = malloc(n ? n : 1), *out = NULL;
  CHECK(copy != NULL);
  if (n)
    memcpy(copy, s, n);
  *len = 0;
  *rc = idem_canonicalize(copy, n, NULL, &out, len, NULL);
  free(copy);
  return out;
}

/* The properties of any text. */
static void check_text(const uint8_t *s, size_t n) {
  int rc, rc_c, rc2;
  size_t len, clen, len2;
  char *f = fp_text(s, n, NULL, &rc, &len);
  char *c = canon_text(s, n, &rc_c, &clen);
  char fp[IDEM_FINGERPRINT_SIZE], sha[IDEM_FINGERPRINT_SIZE];
  CHECK(rc == rc_c);
  if (rc == IDEM_OK) {
    char *again = fp_text(f, len, NULL, &rc2, &len2), *back;
    CHECK(rc2 == IDEM_OK && len2 == len && memcmp(again, f, len) == 0);
    back = canon_text(f, len, &rc2, &len2);
    CHECK(rc2 == IDEM_OK && len2 == clen && memcmp(back, c, clen) == 0);
    CHECK(idem_fingerprint(s, n, 1, fp) == IDEM_OK);
    CHECK(idem_sha256_hex(f, len, sha) == IDEM_OK);
    CHECK(strcmp(fp, sha) == 0);
    idem_free(again);
    idem_free(back);
  }
  idem_free(f);
  idem_free(c);
}

/* The fingerprint's text of a number, and its refusal. */
typedef struct number {
  int rc;
  char *text;
  size_t len;
} number;

static number number_of(const void *s, size_t n) {
  number r;
  r.text = fp_text(s, n, NULL, &r.rc, &r.len);
  return r;
}

static int same_number(const number *a, const number *b) {
  return a->rc == IDEM_OK && b->rc == IDEM_OK && a->len == b->len &&
         memcmp(a->text, b->text, a->len) == 0;
}

/* The properties of a text that is one number; *out keeps its result. */
static void check_number(const uint8_t *s, size_t n, const exact *e,
                         number *out) {
  number r = number_of(s, n), v;
  int rc_c;
  size_t clen;
  char *c = canon_text(s, n, &rc_c, &clen);
  char *m1, *variant;
  bigint one = big_small(1), q;

  CHECK(r.rc == rc_c);
  CHECK(r.rc == IDEM_OK || r.rc == IDEM_ERANGE);
  if (r.rc == IDEM_OK) {
    exact back, canon;
    CHECK(is_json_number((const uint8_t *)r.text, r.len));
    back = read_exact((const uint8_t *)r.text, r.len);
    CHECK(same_exact(&back, e));
    canon = read_exact((const uint8_t *)c, clen);
    if (same_exact(&canon, e))
      CHECK(r.len == clen && memcmp(r.text, c, clen) == 0);
    else
      CHECK(r.len != clen || memcmp(r.text, c, clen) != 0);
    free_exact(&back);
    free_exact(&canon);

    /* Selected by a pointer, the number is written alike. */
    {
      static const char *const ptrs[] = {"/n", NULL};
      char *doc = malloc(n + 8), *want = malloc(r.len + 16), *sel;
      size_t sl;
      int rc;
      CHECK(doc != NULL && want != NULL);
      memcpy(doc, "{\"n\":", 5);
      memcpy(doc + 5, s, n);
      doc[n + 5] = '}';
      sel = fp_text(doc, n + 6, ptrs, &rc, &sl);
      CHECK(rc == IDEM_OK);
      memcpy(want, "{\"/n\":", 6);
      memcpy(want + 6, r.text, r.len);
      want[r.len + 6] = '}';
      CHECK(sl == r.len + 7 && memcmp(sel, want, sl) == 0);
      idem_free(sel);
      free(doc);
      free(want);
    }
  }

  /* The same value written otherwise: M e Q, 0.M e Q+len(M), M000 e Q-3. */
  if (!e->zero) {
    bigint len_m = big_small((long long)strlen(e->m));
    bigint three = big_small(-3);
    variant = number_text(e, "", e->m, "", e->q);
    v = number_of(variant, strlen(variant));
    CHECK(v.rc == r.rc && (r.rc != IDEM_OK || same_number(&v, &r)));
    idem_free(v.text);
    free(variant);
    q = big_add(e->q, len_m);
    variant = number_text(e, "0.", e->m, "", q);
    v = number_of(variant, strlen(variant));
    CHECK(v.rc == r.rc && (r.rc != IDEM_OK || same_number(&v, &r)));
    idem_free(v.text);
    free(variant);
    free(q.mag);
    q = big_add(e->q, three);
    variant = number_text(e, "", e->m, "000", q);
    v = number_of(variant, strlen(variant));
    CHECK(v.rc == r.rc && (r.rc != IDEM_OK || same_number(&v, &r)));
    idem_free(v.text);
    free(variant);
    free(q.mag);
    free(len_m.mag);
    free(three.mag);

    /* Another value: the exponent one up, the last digit changed. */
    q = big_add(e->q, one);
    variant = number_text(e, "", e->m, "", q);
    v = number_of(variant, strlen(variant));
    CHECK(!same_number(&v, &r));
    idem_free(v.text);
    free(variant);
    free(q.mag);
    m1 = strdup(e->m);
    CHECK(m1 != NULL);
    m1[strlen(m1) - 1] =
        m1[strlen(m1) - 1] == '9' ? '8' : (char)(m1[strlen(m1) - 1] + 1);
    variant = number_text(e, "", m1, "", e->q);
    v = number_of(variant, strlen(variant));
    CHECK(!same_number(&v, &r));
    idem_free(v.text);
    free(variant);
    free(m1);
  } else {
    /* Every zero is "0". */
    CHECK(r.rc == IDEM_OK && r.len == 1 && r.text[0] == '0');
  }
  free(one.mag);
  idem_free(c);
  *out = r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  const uint8_t *a = data, *b = nul ? nul + 1 : NULL;
  size_t na = nul ? (size_t)(nul - data) : size;
  size_t nb = nul ? size - na - 1 : 0;
  number ra = {0, NULL, 0}, rb = {0, NULL, 0};
  exact ea, eb;
  int a_num = is_json_number(a, na), b_num = b && is_json_number(b, nb);

  check_text(data, size);
  check_text(a, na);
  if (b)
    check_text(b, nb);
  if (a_num) {
    ea = read_exact(a, na);
    check_number(a, na, &ea, &ra);
  }
  if (b_num) {
    eb = read_exact(b, nb);
    check_number(b, nb, &eb, &rb);
  }
  if (a_num && b_num && ra.rc == IDEM_OK && rb.rc == IDEM_OK)
    CHECK(same_number(&ra, &rb) == same_exact(&ea, &eb));
  if (a_num) {
    free_exact(&ea);
    idem_free(ra.text);
  }
  if (b_num) {
    free_exact(&eb);
    idem_free(rb.text);
  }
  return 0;
}
