/*
 * canon.c -- canonical JSON (RFC 8785, JCS).
 *
 * Two passes over the input text, and no tree between them. The first
 * validates the whole text (RFC 8259's grammar, UTF-8, surrogate pairs, the
 * range of numbers, nesting) and records, for each object of two or more
 * members, where its member names start, sorted in RFC 8785's order; the
 * sort also finds duplicate names. The second writes the canonical form by
 * walking the text again, visiting each such object's members in that
 * order. Beyond the input and the output, memory is four bytes per member
 * and twelve per object of two or more members. A general parser's tree
 * (jansson's, which this file used before) took some twenty times the input:
 * a value node, a copy of each string and a hash table per object.
 *
 * Errors are reported at the first problem in the text, with the offset
 * where the parser gave up: the first byte of a bad escape, character or
 * number, and the end of a token that cannot stand where it is.
 *
 * The same two passes write the text that a fingerprint hashes
 * (idem__fingerprint_text(), at the end): RFC 8785's form with numbers kept
 * exact where a double cannot hold them, of the whole text or of the parts
 * that RFC 6901 JSON Pointers select.
 *
 * Strings are sequences of UTF-16 code units, as ECMAScript's are. RFC 8785
 * refuses a lone surrogate (\ud83d without its low half, which JavaScript's
 * "ok \u{1F600}".slice(0, 4) holds and JSON.stringify writes), and so does
 * idem_canonicalize(). With IDEM__CANON_LONE such an escape is one code
 * unit like any other: written \udxxx in lowercase, as ECMAScript's
 * JSON.stringify writes it, and ordered among member names by its code
 * unit. A pair stays one code point, and raw bytes that are not UTF-8
 * (a surrogate's three bytes among them) are refused either way.
 */
#include "decimal.h"
#include "internal.h"
#include "numfmt.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANON_DEFAULT_MAX_BYTES ((size_t)16 * 1024 * 1024)
#define CANON_DEFAULT_MAX_DEPTH 256

/*
 * The deepest nesting any limit allows, which bounds the recursion of both
 * passes. It is the limit of jansson's parser, kept when this file stopped
 * using it so that larger limits are lowered to the same value as before.
 */
#define CANON_HARD_MAX_DEPTH 2047

/*
 * The canonical form can be longer than the input: "1e20" becomes
 * "100000000000000000000", 4.4 times the bytes of "1e20," with its comma.
 * Nothing else grows, so five times the input limit is a cap that valid
 * input never reaches and that still stops a runaway buffer.
 */
#define CANON_OUTPUT_FACTOR 5

#define NO_OFFSET SIZE_MAX

/* ------------------------------------------------------------------ */
/* Output buffer                                                        */
/* ------------------------------------------------------------------ */

/* A growable byte buffer that refuses to grow past max, as curl's dynbuf. */
typedef struct canon_buf {
  char *data;
  size_t len;
  size_t cap;
  size_t max;
} canon_buf;

/* The slow half of buf_reserve(): the cap, then a larger buffer. */
static int buf_grow(canon_buf *b, size_t extra) {
  size_t want, cap;
  char *p;
  /* One byte more than the content for the terminating NUL. */
  if (extra > b->max - b->len)
    return idem__fail(IDEM_ETOOBIG,
                      "canonical form is longer than the cap of %zu bytes",
                      b->max);
  want = b->len + extra + 1;
  if (want <= b->cap)
    return IDEM_OK;
  cap = b->cap ? b->cap : 256;
  while (cap < want)
    cap = cap > SIZE_MAX / 2 ? want : cap * 2;
  /* Never room past the cap, so that room is all buf_reserve() checks. */
  if (cap > b->max + 1)
    cap = b->max + 1;
  p = realloc(b->data, cap);
  if (p == NULL)
    return idem__fail(IDEM_ENOMEM, "canonical form: out of memory (%zu bytes)",
                      cap);
  b->data = p;
  b->cap = cap;
  return IDEM_OK;
}

/* Room for extra more bytes and a NUL, within the cap. Called for every
 * piece of the output: the common case is one comparison. */
static inline int buf_reserve(canon_buf *b, size_t extra) {
  if (b->cap - b->len > extra)
    return IDEM_OK;
  return buf_grow(b, extra);
}

static inline int buf_put(canon_buf *b, const void *s, size_t n) {
  int rc = buf_reserve(b, n);
  if (rc != IDEM_OK)
    return rc;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  return IDEM_OK;
}

static inline int buf_putc(canon_buf *b, char c) {
  int rc = buf_reserve(b, 1);
  if (rc != IDEM_OK)
    return rc;
  b->data[b->len++] = c;
  return IDEM_OK;
}

/* Grows an array of size-byte items to hold need of them: the array, or NULL
 * (the old one still valid) when memory is short. */
static void *grow(void *items, size_t *cap, size_t need, size_t size) {
  size_t ncap = *cap ? *cap : 64;
  void *p;
  if (need <= *cap)
    return items;
  while (ncap < need)
    ncap *= 2;
  p = realloc(items, ncap * size);
  if (p != NULL)
    *cap = ncap;
  return p;
}

/* ------------------------------------------------------------------ */
/* Characters                                                           */
/* ------------------------------------------------------------------ */

/* The bytes that stand for themselves in a string, found in one lookup
 * each: printable ASCII and DEL, but '"' (0x22) and '\\' (0x5C). */
static const unsigned char plain_ascii[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x00 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x10 */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x20 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x30 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x40 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x50 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x60 */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x70 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x80 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x90 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xA0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xB0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xC0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xD0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xE0 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0xF0 */
};

static int is_ws(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/*
 * What number tokens are made of, well-formed or not, in one lookup: 0 for
 * other bytes (those from 0x80 up too), NUMBER_CHAR for '+', '.', 'e' and
 * 'E', and NUMBER_CHAR | NUMBER_PLAIN for the digits and '-', which are
 * all a plain integer holds.
 */
#define NUMBER_CHAR 1
#define NUMBER_PLAIN 2
static const unsigned char number_class[256] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x00 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x10 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 3, 1, 0, /* 0x20 */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 0, 0, 0, 0, 0, 0, /* 0x30 */
    0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x40 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x50 */
    0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x60 */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x70 */
};

static int is_number_char(unsigned char c) { return number_class[c] != 0; }

static int is_alpha(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* The code unit of the \u escape at s[i] (six bytes, all present); -1 if
 * it is not one. */
static long u_escape(const unsigned char *s, size_t n, size_t i) {
  long v = 0;
  if (i > n || n - i < 6 || s[i] != '\\' || s[i + 1] != 'u')
    return -1;
  for (size_t j = i + 2; j < i + 6; j++) {
    int h = hex_value(s[j]);
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  return v;
}

/* Length of the valid UTF-8 sequence at s (n bytes available), or 0:
 * shortest forms only, no surrogates, nothing past U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n) {
  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xC2 && s[0] <= 0xDF)
    return n >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
  if (s[0] >= 0xE0 && s[0] <= 0xEF) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
      return 0;
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F))
      return 0;
    return 3;
  }
  if (s[0] >= 0xF0 && s[0] <= 0xF4) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 ||
        (s[3] & 0xC0) != 0x80)
      return 0;
    if ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))
      return 0;
    return 4;
  }
  return 0;
}

/*
 * The next code point of a validated string whose contents continue at
 * s[*i], escapes decoded (a surrogate pair is one code point, a lone
 * surrogate the code unit it is); -1 at the closing quote.
 */
static long next_code_point(const unsigned char *s, size_t *i) {
  size_t k = *i;
  long cp;
  if (s[k] == '"')
    return -1;
  if (s[k] == '\\') {
    switch (s[k + 1]) {
    case 'b':
      cp = '\b';
      break;
    case 'f':
      cp = '\f';
      break;
    case 'n':
      cp = '\n';
      break;
    case 'r':
      cp = '\r';
      break;
    case 't':
      cp = '\t';
      break;
    case 'u':
      cp = u_escape(s, k + 6, k);
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        /* A low half next makes a pair; anything else leaves this one
         * lone. (The bytes after it are read only while they are an
         * escape: the closing quote comes first otherwise.) */
        long lo = u_escape(s, k + 12, k + 6);
        if (lo >= 0xDC00 && lo <= 0xDFFF) {
          *i = k + 12;
          return 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
      }
      *i = k + 6;
      return cp;
    default: /* '"', '\\', '/' */
      cp = s[k + 1];
      break;
    }
    *i = k + 2;
    return cp;
  }
  if (s[k] < 0x80) {
    *i = k + 1;
    return s[k];
  }
  if (s[k] < 0xE0) {
    *i = k + 2;
    return (long)(s[k] & 0x1F) << 6 | (s[k + 1] & 0x3F);
  }
  if (s[k] < 0xF0) {
    *i = k + 3;
    return (long)(s[k] & 0x0F) << 12 | (long)(s[k + 1] & 0x3F) << 6 |
           (s[k + 2] & 0x3F);
  }
  *i = k + 4;
  return (long)(s[k] & 0x07) << 18 | (long)(s[k + 1] & 0x3F) << 12 |
         (long)(s[k + 2] & 0x3F) << 6 | (s[k + 3] & 0x3F);
}

/*
 * A code point's place in UTF-16's order: U+E000-U+FFFF are lifted above the
 * supplementary planes, because in UTF-16 those planes are surrogate pairs,
 * whose units (0xD800-0xDFFF) sort below 0xE000. Everything else keeps code
 * point order. The end of a name (-1) comes first.
 */
static long utf16_rank(long cp) {
  return cp >= 0xE000 && cp <= 0xFFFF ? cp + 0x110000 : cp;
}

/*
 * The next UTF-16 code unit of a validated string (as next_code_point());
 * *low holds the low half of a pair whose high half was returned, -1 when
 * none is due. Code points do not order lone surrogates as their units do:
 * a lone \udbff comes after the pair of U+10000 (D800 DC00), not before.
 */
static long next_unit(const unsigned char *s, size_t *i, long *low) {
  long cp;
  if (*low >= 0) {
    cp = *low;
    *low = -1;
    return cp;
  }
  cp = next_code_point(s, i);
  if (cp < 0x10000)
    return cp;
  *low = 0xDC00 + ((cp - 0x10000) & 0x3FF);
  return 0xD800 + ((cp - 0x10000) >> 10);
}

/*
 * Orders the member names whose opening quotes are at s[a] and s[b] by their
 * UTF-16 code units, as RFC 8785 requires, comparing decoded characters so
 * that escapes do not matter. 0 means a duplicate.
 */
static int compare_names(const unsigned char *s, uint32_t a, uint32_t b) {
  size_t i = (size_t)a + 1, j = (size_t)b + 1;
  /* Identical bytes without escapes are identical characters. */
  while (s[i] == s[j] && s[i] != '"' && s[i] != '\\') {
    i++;
    j++;
  }
  if (s[i] == '"' && s[j] == '"')
    return 0;
  /* Where they part inside a UTF-8 sequence, back up to its first byte (the
   * bytes before are the same in both) so that whole characters compare. */
  while ((s[i] & 0xC0) == 0x80 || (s[j] & 0xC0) == 0x80) {
    i--;
    j--;
  }
  {
    long xl = -1, yl = -1;
    for (;;) {
      long x = next_unit(s, &i, &xl), y = next_unit(s, &j, &yl);
      if (x != y)
        return x < y ? -1 : 1;
      if (x < 0)
        return 0;
    }
  }
}

/* Objects of up to this many members are sorted by insertion. */
#define SMALL_OBJECT 16

/* qsort() has no context argument: the text being sorted, per thread. */
static _Thread_local const unsigned char *sort_text;

static int compare_name_offsets(const void *pa, const void *pb) {
  return compare_names(sort_text, *(const uint32_t *)pa, *(const uint32_t *)pb);
}

/* ------------------------------------------------------------------ */
/* Numbers                                                              */
/* ------------------------------------------------------------------ */

/*
 * The double that a JSON number (already validated) stands for: IDEM_OK,
 * IDEM_ERANGE when it overflows a double (underflow reads as zero, as in
 * ECMAScript's JSON.parse), or IDEM_ENOMEM. lib/decimal.c reads it as
 * strtod() would, without a locale and mostly without strtod().
 */
static int number_value(const unsigned char *s, size_t len, double *out) {
  return idem__decimal_to_double((const char *)s, len, out);
}

/* ------------------------------------------------------------------ */
/* The first pass: validation and member order                          */
/* ------------------------------------------------------------------ */

/* An object of two or more members and where its sorted names are. */
typedef struct object_order {
  uint32_t start; /* the offset of its '{' */
  uint32_t first; /* its first name in canon.names */
  uint32_t count; /* its members */
} object_order;

typedef struct canon {
  const unsigned char *s;
  size_t n;
  size_t i; /* where the first pass is */
  int max_depth;
  int exact; /* numbers for a fingerprint (idem__format_number_exact) */
  int lone;  /* lone surrogate escapes allowed (IDEM__CANON_LONE) */
  /* The open objects' member names, as offsets of their opening quotes:
   * those of the object at depth d start at open[bases[d]]. */
  uint32_t *open;
  size_t open_len, open_cap;
  size_t *bases; /* bases_small until more are open at once */
  int nbases, bases_cap;
  size_t bases_small[16];
  /* Closed objects of two or more members, and their names, sorted. */
  uint32_t *names;
  size_t names_len, names_cap;
  object_order *objects;
  size_t objects_len, objects_cap;
  size_t err_offset;
} canon;

/*
 * Sorts the names of the open object at depth d and returns the earliest
 * duplicate in the text (the second of its name, which is where a reader
 * sees it), or NO_OFFSET.
 */
static size_t first_duplicate(canon *c, int d) {
  size_t lo = c->bases[d],
         hi = d + 1 < c->nbases ? c->bases[d + 1] : c->open_len;
  size_t k = hi - lo, best = NO_OFFSET;
  uint32_t *v;
  /* Before any name was kept, c->open is NULL, and even NULL + 0 is
   * undefined behaviour. */
  if (k < 2)
    return NO_OFFSET;
  v = c->open + lo;
  if (k <= SMALL_OBJECT) {
    /* Most objects are small: an insertion sort, without qsort()'s calls
     * through a pointer. Equal names are duplicates, refused whatever
     * their order. */
    for (size_t a = 1; a < k; a++) {
      uint32_t x = v[a];
      size_t b = a;
      for (; b > 0 && compare_names(c->s, v[b - 1], x) > 0; b--)
        v[b] = v[b - 1];
      v[b] = x;
    }
  } else {
    sort_text = c->s;
    qsort(v, k, sizeof *v, compare_name_offsets);
  }
  for (size_t a = 0; a < k;) {
    size_t b = a + 1;
    uint32_t min1 = v[a], min2 = UINT32_MAX;
    while (b < k && compare_names(c->s, v[a], v[b]) == 0) {
      if (v[b] < min1) {
        min2 = min1;
        min1 = v[b];
      } else if (v[b] < min2) {
        min2 = v[b];
      }
      b++;
    }
    if (min2 != UINT32_MAX && min2 < best)
      best = min2;
    a = b;
  }
  return best;
}

/*
 * Stops the first pass with an error at off, unless an open object holds a
 * duplicate member name earlier in the text: the first problem in the text
 * is the one reported. fmt is the detail after "at byte N: ".
 */
static int fail_at(canon *c, int rc, size_t off, const char *fmt, ...)
    IDEM__PRINTF(4, 5);

static int fail_at(canon *c, int rc, size_t off, const char *fmt, ...) {
  char detail[256];
  va_list ap;
  size_t dup = NO_OFFSET;
  for (int d = 0; d < c->nbases; d++) {
    size_t x = first_duplicate(c, d);
    if (x < dup)
      dup = x;
  }
  c->err_offset = dup < off ? dup : off;
  if (dup < off)
    return idem__fail(IDEM_EDUPKEY, "at byte %zu: duplicate member name", dup);
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  return idem__fail(rc, "at byte %zu: %s", off, detail);
}

static void skip_ws(canon *c) {
  while (c->i < c->n && is_ws(c->s[c->i]))
    c->i++;
}

/* The end of the token at s[i], for errors about a token that cannot stand
 * where it is: jansson's convention, kept for its offsets. */
static size_t token_end(const canon *c, size_t i) {
  const unsigned char *s = c->s;
  size_t n = c->n;
  if (s[i] == '"') {
    for (i++; i < n; i++) {
      if (s[i] == '\\')
        i++;
      else if (s[i] == '"')
        return i + 1;
    }
    return n;
  }
  if (s[i] == '-' || is_digit(s[i])) {
    while (i < n && is_number_char(s[i]))
      i++;
    return i;
  }
  if (is_alpha(s[i])) {
    while (i < n && is_alpha(s[i]))
      i++;
    return i;
  }
  if (s[i] >= 0x80)
    return i + utf8_len(s + i, n - i);
  return i + 1;
}

/* The error for what stands at c->i where `expected` should. */
static int unexpected(canon *c, const char *expected) {
  size_t i = c->i, end;
  if (i >= c->n)
    return fail_at(c, IDEM_EJSON, c->n, "unexpected end of input; expected %s",
                   expected);
  if (c->s[i] >= 0x80 && utf8_len(c->s + i, c->n - i) == 0)
    return fail_at(c, IDEM_EUTF8, i, "invalid UTF-8 (byte 0x%02x)", c->s[i]);
  end = token_end(c, i);
  /* The token itself, when it is short and plain enough to quote. */
  for (size_t k = i; k < end; k++)
    if (c->s[k] < 0x20 || c->s[k] >= 0x7F || end - i > 24)
      return fail_at(c, IDEM_EJSON, end, "expected %s", expected);
  return fail_at(c, IDEM_EJSON, end, "expected %s, not '%.*s'", expected,
                 (int)(end - i), (const char *)c->s + i);
}

static int parse_value(canon *c, int depth);

static int parse_string(canon *c) {
  const unsigned char *s = c->s;
  size_t n = c->n, i = c->i + 1;
  for (;;) {
    unsigned char ch;
    /* Plain ASCII, the common case, in one tight loop. */
    while (i < n && plain_ascii[s[i]])
      i++;
    if (i >= n)
      return fail_at(c, IDEM_EJSON, n, "unexpected end of input in a string");
    ch = s[i];
    if (ch == '"') {
      c->i = i + 1;
      return IDEM_OK;
    }
    if (ch < 0x20)
      return fail_at(c, IDEM_EJSON, i,
                     "control character 0x%02x in a string (it must be "
                     "escaped)",
                     ch);
    if (ch >= 0x80) {
      size_t k = utf8_len(s + i, n - i);
      if (k == 0)
        return fail_at(c, IDEM_EUTF8, i, "invalid UTF-8 (byte 0x%02x)", ch);
      i += k;
      continue;
    }
    /* A backslash. */
    if (i + 1 >= n)
      return fail_at(c, IDEM_EJSON, n, "unexpected end of input in a string");
    if (strchr("\"\\/bfnrt", s[i + 1]) != NULL && s[i + 1] != '\0') {
      i += 2;
    } else if (s[i + 1] == 'u') {
      long u = u_escape(s, n, i), lo;
      for (size_t k = i + 2; u < 0 && k < i + 6; k++) {
        if (k >= n)
          return fail_at(c, IDEM_EJSON, n,
                         "unexpected end of input in a string");
        if (hex_value(s[k]) < 0)
          return fail_at(c, IDEM_EJSON, i,
                         "invalid \\u escape (four hex digits must "
                         "follow)");
      }
      lo = u >= 0xD800 && u <= 0xDBFF ? u_escape(s, n, i + 6) : -1;
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        i += 12; /* a pair */
        continue;
      }
      if (u >= 0xD800 && u <= 0xDFFF && !c->lone)
        return fail_at(c, IDEM_EUTF8, i,
                       "lone surrogate \\u%04lX (surrogates must come in "
                       "high-low pairs)",
                       u);
      i += 6;
    } else if (s[i + 1] >= 0x20 && s[i + 1] < 0x7F) {
      return fail_at(c, IDEM_EJSON, i, "invalid escape '\\%c'", s[i + 1]);
    } else {
      return fail_at(c, IDEM_EJSON, i, "invalid escape (byte 0x%02x)",
                     s[i + 1]);
    }
  }
}

static int parse_number(canon *c) {
  const unsigned char *s = c->s;
  size_t n = c->n, start = c->i, i = c->i, int_digits;
  long exp = 0;
  int exp_neg = 0;
  double v;
  int rc = IDEM_OK;
  if (s[i] == '-')
    i++;
  if (i < n && s[i] == '0') {
    i++;
    if (i < n && is_digit(s[i]))
      return fail_at(c, IDEM_EJSON, i, "a number may not have leading zeros");
  } else if (i < n && is_digit(s[i])) {
    while (i < n && is_digit(s[i]))
      i++;
  } else {
    return fail_at(c, IDEM_EJSON, i, "expected a digit");
  }
  int_digits = i - start - (s[start] == '-');
  if (i < n && s[i] == '.') {
    if (++i >= n || !is_digit(s[i]))
      return fail_at(c, IDEM_EJSON, i, "expected a digit after '.'");
    while (i < n && is_digit(s[i]))
      i++;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      exp_neg = s[i++] == '-';
    if (i >= n || !is_digit(s[i]))
      return fail_at(c, IDEM_EJSON, i, "expected a digit in the exponent");
    for (; i < n && is_digit(s[i]); i++)
      if (exp < 100000) /* past that, a closer look decides */
        exp = exp * 10 + (s[i] - '0');
  }
  /* Only a number of 10^308 or more can overflow a double. Its value is
   * below 10^(integer digits + exponent), which settles almost every
   * number here; the rest (a long fraction of leading zeros, a large
   * exponent) are settled from their significant digits, and only those
   * that may overflow are converted. */
  if ((long)int_digits + (exp_neg ? -exp : exp) > 308 &&
      !idem__number_surely_finite((const char *)s + start, i - start))
    rc = number_value(s + start, i - start, &v);
  if (rc == IDEM_ERANGE) {
    int shown = i - start > 40 ? 40 : (int)(i - start);
    return fail_at(c, IDEM_ERANGE, start,
                   "number %.*s%s is outside the range of a double", shown,
                   (const char *)s + start, i - start > 40 ? "..." : "");
  }
  if (rc != IDEM_OK)
    return rc;
  c->i = i;
  return IDEM_OK;
}

static int parse_literal(canon *c) {
  static const char *const words[] = {"true", "false", "null"};
  size_t end = c->i;
  while (end < c->n && is_alpha(c->s[end]))
    end++;
  for (int k = 0; k < 3; k++)
    if (end - c->i == strlen(words[k]) &&
        memcmp(c->s + c->i, words[k], end - c->i) == 0) {
      c->i = end;
      return IDEM_OK;
    }
  return unexpected(c, "a value");
}

static int parse_array(canon *c, int depth) {
  int rc;
  if (depth > c->max_depth)
    return fail_at(c, IDEM_EDEPTH, c->i,
                   "arrays and objects nested deeper than %d", c->max_depth);
  c->i++;
  skip_ws(c);
  if (c->i < c->n && c->s[c->i] == ']') {
    c->i++;
    return IDEM_OK;
  }
  for (;;) {
    if ((rc = parse_value(c, depth)) != IDEM_OK)
      return rc;
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == ',') {
      c->i++;
    } else if (c->i < c->n && c->s[c->i] == ']') {
      c->i++;
      return IDEM_OK;
    } else {
      return unexpected(c, "',' or ']'");
    }
  }
}

/* Sorts the names of the object that has just closed, refuses duplicates,
 * and keeps the order for the second pass when there is one to keep. */
static int close_object(canon *c, size_t start) {
  size_t base = c->bases[c->nbases - 1], k = c->open_len - base;
  if (k >= 2) {
    size_t dup = first_duplicate(c, c->nbases - 1);
    uint32_t *names;
    object_order *objects;
    if (dup != NO_OFFSET)
      return fail_at(c, IDEM_EDUPKEY, dup, "duplicate member name");
    names = grow(c->names, &c->names_cap, c->names_len + k, sizeof *names);
    if (names == NULL)
      return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
    c->names = names;
    objects =
        grow(c->objects, &c->objects_cap, c->objects_len + 1, sizeof *objects);
    if (objects == NULL)
      return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
    c->objects = objects;
    memcpy(c->names + c->names_len, c->open + base, k * sizeof *c->names);
    c->objects[c->objects_len].start = (uint32_t)start;
    c->objects[c->objects_len].first = (uint32_t)c->names_len;
    c->objects[c->objects_len].count = (uint32_t)k;
    c->objects_len++;
    c->names_len += k;
  }
  c->open_len = base;
  c->nbases--;
  return IDEM_OK;
}

static int parse_object(canon *c, int depth) {
  size_t start = c->i;
  int rc;
  if (depth > c->max_depth)
    return fail_at(c, IDEM_EDEPTH, c->i,
                   "arrays and objects nested deeper than %d", c->max_depth);
  if (c->nbases == c->bases_cap) {
    /* Deeper than most requests go: a larger array, up to max_depth + 1. */
    int cap = c->bases_cap * 2 > c->max_depth + 1 ? c->max_depth + 1
                                                  : c->bases_cap * 2;
    size_t *b = malloc((size_t)cap * sizeof *b);
    if (b == NULL)
      return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
    memcpy(b, c->bases, (size_t)c->nbases * sizeof *b);
    if (c->bases != c->bases_small)
      free(c->bases);
    c->bases = b;
    c->bases_cap = cap;
  }
  c->bases[c->nbases++] = c->open_len;
  c->i++;
  skip_ws(c);
  if (c->i < c->n && c->s[c->i] == '}') {
    c->i++;
    return close_object(c, start);
  }
  for (;;) {
    skip_ws(c);
    if (c->i >= c->n || c->s[c->i] != '"')
      return unexpected(c, "a member name");
    size_t name = c->i;
    if ((rc = parse_string(c)) != IDEM_OK)
      return rc;
    /* Kept only once valid: duplicates are looked for among these, and
     * the comparison reads them as valid strings. */
    uint32_t *open = grow(c->open, &c->open_cap, c->open_len + 1, sizeof *open);
    if (open == NULL)
      return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
    c->open = open;
    c->open[c->open_len++] = (uint32_t)name;
    skip_ws(c);
    if (c->i >= c->n || c->s[c->i] != ':')
      return unexpected(c, "':'");
    c->i++;
    if ((rc = parse_value(c, depth)) != IDEM_OK)
      return rc;
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == ',') {
      c->i++;
    } else if (c->i < c->n && c->s[c->i] == '}') {
      c->i++;
      return close_object(c, start);
    } else {
      return unexpected(c, "',' or '}'");
    }
  }
}

static int parse_value(canon *c, int depth) {
  unsigned char ch;
  skip_ws(c);
  if (c->i >= c->n)
    return unexpected(c, "a value");
  ch = c->s[c->i];
  if (ch == '{')
    return parse_object(c, depth + 1);
  if (ch == '[')
    return parse_array(c, depth + 1);
  if (ch == '"')
    return parse_string(c);
  if (ch == '-' || is_digit(ch))
    return parse_number(c);
  if (is_alpha(ch))
    return parse_literal(c);
  return unexpected(c, "a value");
}

/* ------------------------------------------------------------------ */
/* The second pass: writing                                             */
/* ------------------------------------------------------------------ */

static size_t skip_ws_at(const canon *c, size_t i) {
  while (i < c->n && is_ws(c->s[i]))
    i++;
  return i;
}

/* Writes one character of a string with RFC 8785's escapes: the two-
 * character forms where JSON has them, \u00xx in lowercase for the other
 * controls, and everything else, '/' and DEL included, as UTF-8. A lone
 * surrogate (IDEM__CANON_LONE) has no UTF-8: \udxxx in lowercase, as
 * ECMAScript's JSON.stringify writes it. */
static int write_code_point(canon_buf *b, long cp) {
  static const char hex[] = "0123456789abcdef";
  char u[6];
  switch (cp) {
  case '"':
    return buf_put(b, "\\\"", 2);
  case '\\':
    return buf_put(b, "\\\\", 2);
  case '\b':
    return buf_put(b, "\\b", 2);
  case '\f':
    return buf_put(b, "\\f", 2);
  case '\n':
    return buf_put(b, "\\n", 2);
  case '\r':
    return buf_put(b, "\\r", 2);
  case '\t':
    return buf_put(b, "\\t", 2);
  }
  if (cp < 0x20 || (cp >= 0xD800 && cp <= 0xDFFF)) {
    u[0] = '\\';
    u[1] = 'u';
    u[2] = hex[cp >> 12];
    u[3] = hex[(cp >> 8) & 15];
    u[4] = hex[(cp >> 4) & 15];
    u[5] = hex[cp & 15];
    return buf_put(b, u, 6);
  }
  if (cp < 0x80)
    return buf_putc(b, (char)cp);
  if (cp < 0x800) {
    u[0] = (char)(0xC0 | (cp >> 6));
    u[1] = (char)(0x80 | (cp & 0x3F));
    return buf_put(b, u, 2);
  }
  if (cp < 0x10000) {
    u[0] = (char)(0xE0 | (cp >> 12));
    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    u[2] = (char)(0x80 | (cp & 0x3F));
    return buf_put(b, u, 3);
  }
  u[0] = (char)(0xF0 | (cp >> 18));
  u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  u[3] = (char)(0x80 | (cp & 0x3F));
  return buf_put(b, u, 4);
}

/* Writes the string whose opening quote is at s[*i]; *i goes past it. Raw
 * bytes are copied in runs: in a valid string none of them needs an
 * escape. So are the escapes that RFC 8785 writes as they are: \", \\,
 * \b, \f, \n, \r and \t; only \/ and \u are written anew. */
static int write_string(const canon *c, canon_buf *b, size_t *i) {
  const unsigned char *s = c->s;
  size_t k = *i + 1, run = k;
  int rc = buf_putc(b, '"');
  while (rc == IDEM_OK) {
    while (s[k] != '"' && s[k] != '\\')
      k++;
    if (s[k] == '\\' && s[k + 1] != 'u' && s[k + 1] != '/') {
      k += 2;
      continue;
    }
    rc = buf_put(b, s + run, k - run);
    if (rc != IDEM_OK || s[k] == '"')
      break;
    rc = write_code_point(b, next_code_point(s, &k));
    run = k;
  }
  *i = k + 1;
  return rc == IDEM_OK ? buf_putc(b, '"') : rc;
}

/*
 * Writes the number whose text is s[0..len): RFC 8785's form, or for a
 * fingerprint its exact value where the double does not hold it. plain:
 * the text is an integer without fraction or exponent.
 */
static int write_number(const canon *c, canon_buf *b, const unsigned char *s,
                        size_t len, int plain) {
  char small[128], *num = small;
  size_t num_len = 0;
  double v = 0;
  int rc;
  /* Integers of up to 15 digits (or up to 2^53), most numbers in most
   * requests, are written from their digits with no double in between:
   * RFC 8785's form and the fingerprint's are then the same. With a
   * fraction or an exponent ("1.5e3") they are still integers now and
   * then; RFC 8785's form of their double is then the same text (see
   * numfmt.h), so only the fingerprint looks for them. */
  if (plain && len - (s[0] == '-') <= 15 && !(s[0] == '-' && s[1] == '0'))
    /* The most common of them is its own form: JSON allows no leading
     * zeros, and only "-0" is written otherwise. */
    return buf_put(b, s, len);
  if ((plain || c->exact) &&
      idem__format_small_integer((const char *)s, len, small, &num_len))
    return buf_put(b, small, num_len);
  if ((rc = number_value(s, len, &v)) != IDEM_OK)
    return rc;
  if (!c->exact) {
    if ((rc = idem__format_double(v, small, &num_len)) != IDEM_OK)
      return rc;
    return buf_put(b, small, num_len);
  }
  /* An exact number is as long as its digits: long ones are written in
   * place. */
  if (IDEM__EXACT_NUMBER_MAX(len) > sizeof small) {
    if ((rc = buf_reserve(b, IDEM__EXACT_NUMBER_MAX(len))) != IDEM_OK)
      return rc;
    num = b->data + b->len;
  }
  rc = idem__format_number_exact((const char *)s, len, v, num, &num_len);
  if (rc != IDEM_OK)
    return rc;
  if (num == small)
    return buf_put(b, small, num_len);
  b->len += num_len;
  return IDEM_OK;
}

static const object_order *find_object(const canon *c, size_t start) {
  size_t lo = 0, hi = c->objects_len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->objects[mid].start < start)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < c->objects_len && c->objects[lo].start == start ? &c->objects[lo]
                                                              : NULL;
}

static int write_value(const canon *c, canon_buf *b, size_t *i);

/* Writes the member whose name starts at s[i]: name, colon, value. *end is
 * where the value ends. */
static int write_member(const canon *c, canon_buf *b, size_t i, size_t *end) {
  int rc = write_string(c, b, &i);
  if (rc == IDEM_OK)
    rc = buf_putc(b, ':');
  if (rc != IDEM_OK)
    return rc;
  i = skip_ws_at(c, i) + 1; /* past the colon */
  rc = write_value(c, b, &i);
  *end = i;
  return rc;
}

static int write_object(const canon *c, canon_buf *b, size_t *i) {
  const object_order *o = find_object(c, *i);
  size_t end = skip_ws_at(c, *i + 1), last = end;
  int rc = buf_putc(b, '{');
  if (o == NULL) {
    /* None or one member: the text's order is the order. */
    if (rc == IDEM_OK && c->s[end] == '"')
      rc = write_member(c, b, end, &last);
  } else {
    for (uint32_t k = 0; k < o->count && rc == IDEM_OK; k++) {
      size_t member_end = 0;
      if (k > 0)
        rc = buf_putc(b, ',');
      if (rc == IDEM_OK)
        rc = write_member(c, b, c->names[o->first + k], &member_end);
      /* The member last in the text ends last. */
      if (member_end > last)
        last = member_end;
    }
  }
  *i = skip_ws_at(c, last) + 1; /* past the '}' */
  return rc == IDEM_OK ? buf_putc(b, '}') : rc;
}

static int write_value(const canon *c, canon_buf *b, size_t *i) {
  const unsigned char *s = c->s;
  size_t k = skip_ws_at(c, *i);
  int rc;
  switch (s[k]) {
  case '{':
    rc = write_object(c, b, &k);
    break;
  case '[':
    rc = buf_putc(b, '[');
    k = skip_ws_at(c, k + 1);
    if (s[k] == ']') {
      k++;
    } else {
      while (rc == IDEM_OK) {
        if ((rc = write_value(c, b, &k)) != IDEM_OK)
          break;
        k = skip_ws_at(c, k);
        if (s[k++] == ']')
          break;
        rc = buf_putc(b, ',');
      }
    }
    if (rc == IDEM_OK)
      rc = buf_putc(b, ']');
    break;
  case '"':
    rc = write_string(c, b, &k);
    break;
  case 't':
    rc = buf_put(b, "true", 4);
    k += 4;
    break;
  case 'f':
    rc = buf_put(b, "false", 5);
    k += 5;
    break;
  case 'n':
    rc = buf_put(b, "null", 4);
    k += 4;
    break;
  default: {
    size_t start = k;
    int plain = NUMBER_PLAIN;
    while (k < c->n && number_class[s[k]] != 0)
      plain &= number_class[s[k++]];
    rc = write_number(c, b, s + start, k - start, plain);
    break;
  }
  }
  *i = k;
  return rc;
}

/* ------------------------------------------------------------------ */
/* Fingerprint text: the parts that JSON Pointers select                */
/* ------------------------------------------------------------------ */

/*
 * These walk a text that the first pass validated, so they look no further
 * than what is needed to step over a valid value.
 */

/* The offset just past the string whose opening quote is at s[i]. */
static size_t skip_string_at(const canon *c, size_t i) {
  for (i++; c->s[i] != '"'; i++)
    if (c->s[i] == '\\')
      i++;
  return i + 1;
}

/* The offset just past the value that starts at s[i]. */
static size_t skip_value_at(const canon *c, size_t i) {
  const unsigned char *s = c->s;
  size_t depth = 0;
  do {
    if (s[i] == '"') {
      i = skip_string_at(c, i);
    } else if (s[i] == '{' || s[i] == '[') {
      depth++;
      i++;
    } else if (s[i] == '}' || s[i] == ']') {
      depth--;
      i++;
    } else if (depth == 0) {
      /* A number or a literal. */
      while (i < c->n && (is_number_char(s[i]) || is_alpha(s[i])))
        i++;
    } else {
      i++;
    }
  } while (depth > 0);
  return i;
}

/* The code point of the valid UTF-8 sequence at *p, a NUL-terminated
 * string's; *p goes past it. */
static long next_utf8(const unsigned char **p) {
  const unsigned char *q = *p;
  size_t k = utf8_len(q, 4);
  *p = q + k;
  return k == 1   ? q[0]
         : k == 2 ? (long)(q[0] & 0x1F) << 6 | (q[1] & 0x3F)
         : k == 3 ? (long)(q[0] & 0x0F) << 12 | (long)(q[1] & 0x3F) << 6 |
                        (q[2] & 0x3F)
                  : (long)(q[0] & 0x07) << 18 | (long)(q[1] & 0x3F) << 12 |
                        (long)(q[2] & 0x3F) << 6 | (q[3] & 0x3F);
}

/*
 * The next character of a pointer's reference token at *p (valid UTF-8,
 * '~0' and '~1' decoded to '~' and '/'); -1 at its end.
 */
static long next_token_char(const unsigned char **p) {
  const unsigned char *q = *p;
  if (*q == '\0' || *q == '/')
    return -1;
  if (*q == '~') {
    *p = q + 2;
    return q[1] == '0' ? '~' : '/';
  }
  return next_utf8(p);
}

/* Whether the member name whose opening quote is at s[i] is the token. */
static int name_is_token(const canon *c, size_t i, const unsigned char *tok) {
  i++;
  for (;;) {
    long x = next_code_point(c->s, &i), y = next_token_char(&tok);
    if (x != y)
      return 0;
    if (x < 0)
      return 1;
  }
}

/* The value of the member of the object at s[at] that the token names, or
 * NO_OFFSET. */
static size_t find_member(const canon *c, size_t at, const unsigned char *tok) {
  size_t i = skip_ws_at(c, at + 1);
  while (c->s[i] == '"') {
    size_t value = skip_ws_at(c, skip_ws_at(c, skip_string_at(c, i)) + 1);
    if (name_is_token(c, i, tok))
      return value;
    i = skip_ws_at(c, skip_value_at(c, value));
    if (c->s[i] != ',')
      break;
    i = skip_ws_at(c, i + 1);
  }
  return NO_OFFSET;
}

/* The element of the array at s[at] that the token indexes, or NO_OFFSET:
 * a token that is not a decimal index without leading zeros ("-", "01")
 * finds nothing, as an index past the end does. */
static size_t find_element(const canon *c, size_t at,
                           const unsigned char *tok) {
  size_t n = strcspn((const char *)tok, "/"), i;
  uint64_t index = 0;
  /* Texts are shorter than 2^31 bytes: no array has 10^10 elements. */
  if (n == 0 || n > 10 || (n > 1 && tok[0] == '0'))
    return NO_OFFSET;
  for (size_t k = 0; k < n; k++) {
    if (!is_digit(tok[k]))
      return NO_OFFSET;
    index = index * 10 + (uint64_t)(tok[k] - '0');
  }
  i = skip_ws_at(c, at + 1);
  if (c->s[i] == ']')
    return NO_OFFSET;
  for (uint64_t k = 0; k < index; k++) {
    i = skip_ws_at(c, skip_value_at(c, i));
    if (c->s[i] != ',')
      return NO_OFFSET;
    i = skip_ws_at(c, i + 1);
  }
  return i;
}

/* Where the value that a well-formed pointer finds starts, or NO_OFFSET. */
static size_t resolve_pointer(const canon *c, const char *pointer) {
  const unsigned char *p = (const unsigned char *)pointer;
  size_t at = skip_ws_at(c, 0);
  while (*p == '/' && at != NO_OFFSET) {
    p++;
    if (c->s[at] == '{')
      at = find_member(c, at, p);
    else if (c->s[at] == '[')
      at = find_element(c, at, p);
    else
      at = NO_OFFSET;
    p += strcspn((const char *)p, "/");
  }
  return at;
}

/* NULL when the pointer is an RFC 6901 JSON Pointer, else why not. A
 * malformed part is found wherever it is, whatever the document holds. */
static const char *pointer_problem(const char *pointer) {
  const unsigned char *p = (const unsigned char *)pointer;
  size_t n = strlen(pointer);
  if (*p != '\0' && *p != '/')
    return "it must be empty or start with '/'";
  for (size_t i = 0; i < n;) {
    size_t k;
    if (p[i] == '~') {
      if (p[i + 1] != '0' && p[i + 1] != '1')
        return "'~' must be followed by '0' or '1'";
      i += 2;
      continue;
    }
    if ((k = utf8_len(p + i, n - i)) == 0)
      return "it is not valid UTF-8";
    i += k;
  }
  return NULL;
}

/* A pointer as an error detail shows it: bytes other than printable ASCII
 * as \xNN, and no more than 200 of them. */
static void printable_pointer(const char *pointer, char out[1024]) {
  size_t o = 0;
  for (size_t i = 0; pointer[i] != '\0' && o < 800; i++) {
    unsigned char ch = (unsigned char)pointer[i];
    if (i == 200) {
      memcpy(out + o, "...", 3);
      o += 3;
      break;
    }
    if (ch >= 0x20 && ch < 0x7F)
      out[o++] = (char)ch;
    else
      o += (size_t)snprintf(out + o, 5, "\\x%02x", ch);
  }
  out[o] = '\0';
}

/* Orders pointers as RFC 8785 orders member names: by UTF-16 code units. */
static int compare_pointers(const void *pa, const void *pb) {
  const unsigned char *a = (const unsigned char *)*(const char *const *)pa;
  const unsigned char *b = (const unsigned char *)*(const char *const *)pb;
  while (*a == *b && *a != '\0') {
    a++;
    b++;
  }
  if (*a == *b)
    return 0;
  /* Back to the first byte of the characters where they part (the bytes
   * before are the same in both). */
  while ((*a & 0xC0) == 0x80 || (*b & 0xC0) == 0x80) {
    a--;
    b--;
  }
  {
    long x = *a ? next_utf8(&a) : -1, y = *b ? next_utf8(&b) : -1;
    return utf16_rank(x) < utf16_rank(y) ? -1 : 1;
  }
}

/* Writes a pointer as a member name, with RFC 8785's escapes. */
static int write_pointer_name(canon_buf *b, const char *pointer) {
  const unsigned char *p = (const unsigned char *)pointer;
  int rc = buf_putc(b, '"');
  while (rc == IDEM_OK && *p != '\0')
    rc = write_code_point(b, next_utf8(&p));
  return rc == IDEM_OK ? buf_putc(b, '"') : rc;
}

/*
 * Writes the object that maps each pointer finding a value to that value,
 * its members in RFC 8785's order; a pointer named twice is one member.
 * sorted: the pointers (n of them, valid), sorted by compare_pointers().
 */
static int write_selection(const canon *c, canon_buf *b,
                           const char *const *sorted, size_t n) {
  int rc = buf_putc(b, '{'), first = 1;
  for (size_t k = 0; k < n && rc == IDEM_OK; k++) {
    size_t at;
    if (k > 0 && strcmp(sorted[k], sorted[k - 1]) == 0)
      continue;
    if ((at = resolve_pointer(c, sorted[k])) == NO_OFFSET)
      continue;
    if (!first)
      rc = buf_putc(b, ',');
    first = 0;
    if (rc == IDEM_OK)
      rc = write_pointer_name(b, sorted[k]);
    if (rc == IDEM_OK)
      rc = buf_putc(b, ':');
    if (rc == IDEM_OK)
      rc = write_value(c, b, &at);
  }
  return rc == IDEM_OK ? buf_putc(b, '}') : rc;
}

/* ------------------------------------------------------------------ */
/* idem_canonicalize and idem__fingerprint_text                         */
/* ------------------------------------------------------------------ */

static int compare_object_starts(const void *pa, const void *pb) {
  const object_order *a = pa, *b = pb;
  return a->start < b->start ? -1 : a->start > b->start;
}

/*
 * Both: RFC 8785's form without IDEM__CANON_EXACT; the fingerprint's text,
 * of the whole or (pointers not NULL) of the parts they select, with it.
 * IDEM__CANON_LONE: lone surrogate escapes are read and written as \udxxx.
 * The caller has checked the output arguments.
 */
static int canon_text(const char *json, size_t len,
                      const idem_canon_limits *limits,
                      const char *const *pointers, unsigned flags, char **out,
                      size_t *out_len, size_t *err_offset) {
  size_t max_bytes = CANON_DEFAULT_MAX_BYTES, pos = 0, npointers = 0;
  int max_depth = CANON_DEFAULT_MAX_DEPTH;
  canon c;
  canon_buf b = {NULL, 0, 0, 0};
  const char **sorted = NULL;
  int rc;

  memset(&c, 0, sizeof c);
  c.exact = (flags & IDEM__CANON_EXACT) != 0;
  c.lone = (flags & IDEM__CANON_LONE) != 0;
  if (json == NULL)
    json = "";
  if (limits != NULL) {
    if (limits->max_depth < 0)
      return idem__fail(IDEM_EINVAL, "canonicalize: max_depth %d is negative",
                        limits->max_depth);
    if (limits->max_bytes > 0)
      max_bytes = limits->max_bytes;
    if (limits->max_depth > 0)
      max_depth = limits->max_depth;
  }
  if (max_depth > CANON_HARD_MAX_DEPTH)
    max_depth = CANON_HARD_MAX_DEPTH;

  if (len > max_bytes) {
    c.err_offset = max_bytes;
    rc = idem__fail(IDEM_ETOOBIG,
                    "at byte %zu: input of %zu bytes is larger than the limit "
                    "of %zu bytes",
                    c.err_offset, len, max_bytes);
    goto cleanup;
  }
  /* Offsets are kept in 32 bits; the limit stays where it was when jansson,
   * which counts in an int, parsed. */
  if (len > INT_MAX) {
    c.err_offset = (size_t)INT_MAX;
    rc = idem__fail(IDEM_ETOOBIG,
                    "at byte %zu: input is larger than the parser supports",
                    c.err_offset);
    goto cleanup;
  }

  c.s = (const unsigned char *)json;
  c.n = len;
  c.max_depth = max_depth;
  /* Most requests nest a few objects deep: their bases stay on the stack
   * (a 2 KB array for the deepest allowed, malloc()ed for every request,
   * made glibc consolidate its free chunks each time). */
  c.bases = c.bases_small;
  c.bases_cap = (int)(sizeof c.bases_small / sizeof c.bases_small[0]);
  rc = parse_value(&c, 0);
  if (rc == IDEM_OK) {
    skip_ws(&c);
    if (c.i < c.n && c.s[c.i] >= 0x80 && utf8_len(c.s + c.i, c.n - c.i) == 0)
      rc =
          fail_at(&c, IDEM_EUTF8, c.i, "invalid UTF-8 (byte 0x%02x)", c.s[c.i]);
    else if (c.i < c.n && c.s[c.i] == '\0')
      /* A length that counted a C string's terminator is the usual cause,
       * and "unexpected data" would not point at it. */
      rc = fail_at(&c, IDEM_EJSON, c.i, "a NUL byte after the JSON value%s",
                   c.i + 1 == c.n ? " (was the terminating NUL counted in "
                                    "the length?)"
                                  : "");
    else if (c.i < c.n)
      rc = fail_at(&c, IDEM_EJSON, c.i, "unexpected data after the JSON value");
  }
  if (rc != IDEM_OK)
    goto cleanup;
  free(c.open);
  c.open = NULL;
  if (c.bases != c.bases_small)
    free(c.bases);
  c.bases = NULL;
  if (c.objects_len > 1)
    qsort(c.objects, c.objects_len, sizeof *c.objects, compare_object_starts);

  b.max = max_bytes > (SIZE_MAX - 64) / CANON_OUTPUT_FACTOR
              ? SIZE_MAX - 1
              : max_bytes * CANON_OUTPUT_FACTOR + 64;
  if (pointers != NULL) {
    /* The document is valid: now the pointers, each checked whole. */
    for (; pointers[npointers] != NULL; npointers++) {
      const char *why = pointer_problem(pointers[npointers]);
      if (why != NULL) {
        char shown[1024];
        printable_pointer(pointers[npointers], shown);
        rc = idem__fail(IDEM_EINVAL,
                        "fingerprint: pointer '%s' is not an RFC 6901 JSON "
                        "Pointer: %s",
                        shown, why);
        goto cleanup;
      }
    }
    sorted = malloc(npointers * sizeof *sorted);
    if (sorted == NULL) {
      rc = idem__fail(IDEM_ENOMEM, "fingerprint: out of memory");
      goto cleanup;
    }
    memcpy(sorted, pointers, npointers * sizeof *sorted);
    qsort(sorted, npointers, sizeof *sorted, compare_pointers);
    /* Each pointer may select the whole text, and its name is six bytes
     * a byte at most (\u00XX): the cap grows with them. */
    for (size_t k = 0; k < npointers && b.max < SIZE_MAX / 2; k++) {
      size_t more =
          max_bytes * CANON_OUTPUT_FACTOR + 64 + 6 * strlen(sorted[k]);
      b.max = more > SIZE_MAX / 2 - b.max ? SIZE_MAX / 2 : b.max + more;
    }
  }
  /* The canonical form is seldom longer than the text. */
  rc = buf_reserve(&b, len);
  if (rc == IDEM_OK)
    rc = pointers != NULL ? write_selection(&c, &b, sorted, npointers)
                          : write_value(&c, &b, &pos);
  if (rc != IDEM_OK)
    goto cleanup;
  b.data[b.len] = '\0';
  *out = b.data;
  *out_len = b.len;
  b.data = NULL;

cleanup:
  if (rc != IDEM_OK && err_offset != NULL)
    *err_offset = c.err_offset;
  free(sorted);
  free(b.data);
  free(c.open);
  if (c.bases != c.bases_small)
    free(c.bases);
  free(c.names);
  free(c.objects);
  return rc;
}

/* Sets the outputs for a failure before anything is read. */
static int clear_outputs(char **out, size_t *out_len, size_t *err_offset) {
  if (out != NULL)
    *out = NULL;
  if (out_len != NULL)
    *out_len = 0;
  if (err_offset != NULL)
    *err_offset = 0;
  return out != NULL && out_len != NULL;
}

int idem_canonicalize(const char *json, size_t len,
                      const idem_canon_limits *limits, char **out,
                      size_t *out_len, size_t *err_offset) {
  idem__clear_error();
  if (!clear_outputs(out, out_len, err_offset) || (json == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "canonicalize: NULL argument");
  return canon_text(json, len, limits, NULL, 0, out, out_len, err_offset);
}

int idem__canon_text(const char *json, size_t len, const char *const *pointers,
                     unsigned flags, char **out, size_t *out_len,
                     size_t *err_offset) {
  if (!clear_outputs(out, out_len, err_offset) || (json == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "canonicalize: NULL argument");
  if (pointers != NULL && pointers[0] == NULL)
    return idem__fail(IDEM_EINVAL,
                      "fingerprint: the list of pointers is empty: every "
                      "request would share one fingerprint; pass NULL for "
                      "the whole request");
  return canon_text(json, len, NULL, pointers, flags, out, out_len, err_offset);
}

/*
 * The fingerprint's text. RFC 8785 reads every number as a double, so
 * 12345678901234567 and 12345678901234568 have one canonical form; a
 * fingerprint must tell them apart, or a key reused for another account
 * would be replayed instead of refused. So numbers are written by
 * idem__format_number_exact(): RFC 8785's form where the double's shortest
 * form has the number's exact value (then the text, and the fingerprint,
 * are what 0.2 made), the exact value otherwise. Numbers that overflow a
 * double are refused, as RFC 8785 refuses them.
 */
int idem__fingerprint_text(const char *json, size_t len,
                           const char *const *pointers, char **out,
                           size_t *out_len, size_t *err_offset) {
  if (!clear_outputs(out, out_len, err_offset) || (json == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL argument");
  return idem__canon_text(json, len, pointers, IDEM__CANON_EXACT, out, out_len,
                          err_offset);
}
