/* canon.c -- canonical JSON (RFC 8785, JCS) on top of jansson's parser. */
#include "internal.h"
#include "numfmt.h"

#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CANON_DEFAULT_MAX_BYTES ((size_t)16 * 1024 * 1024)
#define CANON_DEFAULT_MAX_DEPTH 256

/*
 * jansson counts every value, scalars included, against JSON_PARSER_MAX_DEPTH,
 * so arrays and objects nested JSON_PARSER_MAX_DEPTH - 1 deep are the most it
 * is sure to accept. Larger limits are lowered to that, which keeps the depth
 * error ours and also bounds the serialiser's recursion.
 */
#define CANON_HARD_MAX_DEPTH (JSON_PARSER_MAX_DEPTH - 1)

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

static int buf_reserve(canon_buf *b, size_t extra) {
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
  p = realloc(b->data, cap);
  if (p == NULL)
    return idem__fail(IDEM_ENOMEM, "canonical form: out of memory (%zu bytes)",
                      cap);
  b->data = p;
  b->cap = cap;
  return IDEM_OK;
}

static int buf_put(canon_buf *b, const char *s, size_t n) {
  int rc = buf_reserve(b, n);
  if (rc != IDEM_OK)
    return rc;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  return IDEM_OK;
}

static int buf_putc(canon_buf *b, char c) { return buf_put(b, &c, 1); }

/* ------------------------------------------------------------------ */
/* Scanning the raw text                                                */
/* ------------------------------------------------------------------ */

/*
 * jansson reports most errors after the token that caused them and does not
 * enforce our depth limit. These scans look at the raw text, string-aware,
 * to find exact offsets. They only run over text that jansson judges too, so
 * what they see in malformed input never decides an outcome on its own.
 */

static int is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int hex_value(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Reads the four hex digits of a \u escape starting at s[i]; -1 if bad. */
static long read_u_escape(const char *s, size_t n, size_t i) {
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

/* The offset just past the string whose opening quote is at s[i]; n when it
 * is not terminated. */
static size_t string_end(const char *s, size_t n, size_t i) {
  for (i++; i < n; i++) {
    if (s[i] == '\\')
      i++;
    else if (s[i] == '"')
      return i + 1;
  }
  return n;
}

/* Whether the string ending just before s[i] is a member name: the next
 * significant character is a colon. */
static int is_member_name(const char *s, size_t n, size_t i) {
  while (i < n && is_ws(s[i]))
    i++;
  return i < n && s[i] == ':';
}

/* What the scan of the whole text found. */
typedef struct canon_scan {
  size_t depth_off;     /* first bracket nested deeper than the limit */
  size_t surrogate_off; /* first \u escape of a lone surrogate */
  long surrogate_unit;  /* the code unit it names */
  int nul_in_name;      /* some member name contains \u0000 */
} canon_scan;

static void scan_text(const char *s, size_t n, int max_depth, canon_scan *sc) {
  int depth = 0;
  sc->depth_off = NO_OFFSET;
  sc->surrogate_off = NO_OFFSET;
  sc->surrogate_unit = 0;
  sc->nul_in_name = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '[' || c == '{') {
      if (++depth > max_depth && sc->depth_off == NO_OFFSET)
        sc->depth_off = i;
    } else if (c == ']' || c == '}') {
      if (depth > 0)
        depth--;
    } else if (c == '"') {
      int has_nul = 0;
      size_t j;
      for (j = i + 1; j < n && s[j] != '"'; j++) {
        long u;
        if (s[j] != '\\')
          continue;
        u = read_u_escape(s, n, j);
        if (u < 0) {
          j++; /* a two-character escape, or a bad one jansson reports */
          continue;
        }
        if (u == 0)
          has_nul = 1;
        if (u >= 0xD800 && u <= 0xDBFF) {
          long lo = read_u_escape(s, n, j + 6);
          if (lo >= 0xDC00 && lo <= 0xDFFF) {
            j += 11; /* a proper pair: both escapes */
            continue;
          }
        }
        if (u >= 0xD800 && u <= 0xDFFF && sc->surrogate_off == NO_OFFSET) {
          sc->surrogate_off = j;
          sc->surrogate_unit = u;
        }
        j += 5;
      }
      if (j < n)
        j++; /* past the closing quote */
      else
        j = n; /* unterminated: jansson reports it */
      if (has_nul && is_member_name(s, n, j))
        sc->nul_in_name = 1;
      i = j - 1;
    }
  }
}

/*
 * The offset of the first significant byte after the first JSON value, for
 * the "data after the value" error. jansson has parsed that value already, so
 * a simple reading of its extent is enough.
 */
static size_t after_first_value(const char *s, size_t n) {
  size_t i = 0;
  while (i < n && is_ws(s[i]))
    i++;
  if (i < n && s[i] == '"') {
    i = string_end(s, n, i);
  } else if (i < n && (s[i] == '[' || s[i] == '{')) {
    size_t depth = 0;
    for (; i < n; i++) {
      if (s[i] == '"') {
        i = string_end(s, n, i) - 1;
      } else if (s[i] == '[' || s[i] == '{') {
        depth++;
      } else if (s[i] == ']' || s[i] == '}') {
        if (--depth == 0) {
          i++;
          break;
        }
      }
    }
  } else {
    /* A number or a literal: everything up to whitespace or punctuation. */
    while (i < n && !is_ws(s[i]) && strchr(",:[]{}\"", s[i]) == NULL)
      i++;
  }
  while (i < n && is_ws(s[i]))
    i++;
  return i;
}

/* The start of the string token that ends just before s[end]: the nearest
 * quote before it that no backslash escapes. */
static size_t string_start(const char *s, size_t end) {
  if (end < 2)
    return 0;
  for (size_t i = end - 2; i > 0; i--) {
    size_t bs = 0;
    if (s[i] != '"')
      continue;
    while (bs < i && s[i - 1 - bs] == '\\')
      bs++;
    if (bs % 2 == 0)
      return i;
  }
  return 0;
}

/* The start of the number token that ends just before s[end]. */
static size_t number_start(const char *s, size_t end) {
  while (end > 0 && s[end - 1] != '\0' &&
         strchr("0123456789+-.eE", s[end - 1]) != NULL)
    end--;
  return end;
}

/* ------------------------------------------------------------------ */
/* NUL in member names                                                  */
/* ------------------------------------------------------------------ */

/*
 * jansson 2.14 refuses member names that contain U+0000, even with
 * JSON_ALLOW_NUL, though they are valid JSON. When a name has one, every
 * \u0000 escape in member names is rewritten, in a copy of the text, to the
 * escape of a placeholder: a BMP code point no member name in the document
 * uses. The escape keeps its length, so jansson's offsets still hold; the
 * mapping is one-to-one, so duplicate detection still holds; and the
 * serialiser turns the placeholder back into U+0000.
 */

/* Calls fn for each member name in s, with the offsets of its contents. */
typedef void (*name_fn)(char *s, size_t start, size_t end, void *ctx);

static void for_each_member_name(char *s, size_t n, name_fn fn, void *ctx) {
  for (size_t i = 0; i < n; i++) {
    size_t end;
    if (s[i] != '"')
      continue;
    end = string_end(s, n, i);
    /* Only a terminated string can have a colon after it. */
    if (is_member_name(s, n, end))
      fn(s, i + 1, end - 1, ctx);
    i = end - 1;
  }
}

static void mark_code_points(char *s, size_t start, size_t end, void *ctx) {
  unsigned char *used = ctx;
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = start; i < end; i++) {
    long cp = -1;
    if (s[i] == '\\') {
      cp = read_u_escape(s, end, i);
      i += cp >= 0 ? 5 : 1;
    } else if ((u[i] & 0xF0) == 0xE0 && end - i >= 3) {
      /* Only three-byte sequences can name a placeholder candidate. */
      cp = ((long)(u[i] & 0x0F) << 12) | ((long)(u[i + 1] & 0x3F) << 6) |
           (long)(u[i + 2] & 0x3F);
      i += 2;
    }
    if (cp >= 0 && cp <= 0xFFFF)
      used[cp >> 3] |= (unsigned char)(1u << (cp & 7));
  }
}

typedef struct nul_rewrite {
  char hex[4];
} nul_rewrite;

static void rewrite_nul_escapes(char *s, size_t start, size_t end, void *ctx) {
  const nul_rewrite *rw = ctx;
  for (size_t i = start; i < end; i++) {
    if (s[i] != '\\')
      continue;
    if (read_u_escape(s, end, i) == 0)
      memcpy(s + i + 2, rw->hex, 4);
    i++; /* skip the escaped character, which may be a backslash */
  }
}

/* The placeholder, if any, and its UTF-8 form as jansson decodes it. */
typedef struct nul_names {
  int active;
  unsigned char utf8[3];
} nul_names;

/* Makes *copy the rewritten text and fills *nn; IDEM_EJSON when every
 * candidate code point is taken, IDEM_ENOMEM when memory is. */
static int prepare_nul_names(const char *json, size_t len, char **copy,
                             nul_names *nn) {
  static const char digits[] = "0123456789ABCDEF";
  unsigned char *used = NULL;
  char *text = NULL;
  long cp = -1;
  nul_rewrite rw;
  int rc = IDEM_OK;

  used = calloc(0x10000 / 8, 1);
  text = malloc(len);
  if (used == NULL || text == NULL) {
    rc = idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
    goto cleanup;
  }
  memcpy(text, json, len);
  for_each_member_name(text, len, mark_code_points, used);
  /* Private-use code points first; then the rest of the three-byte BMP. */
  for (long c = 0xE000; c <= 0xFFFD && cp < 0; c++)
    if (!(used[c >> 3] & (1u << (c & 7))))
      cp = c;
  for (long c = 0x0800; c <= 0xD7FF && cp < 0; c++)
    if (!(used[c >> 3] & (1u << (c & 7))))
      cp = c;
  if (cp < 0) {
    /* Only a document built to defeat this can get here: its names would
     * need every code point from U+0800 to U+FFFD, some 180 KiB of them. */
    rc = idem__fail(IDEM_EJSON,
                    "at byte 0: member names contain U+0000 and every code "
                    "point from U+0800 to U+FFFD, which is not supported");
    goto cleanup;
  }
  for (int k = 0; k < 4; k++)
    rw.hex[k] = digits[(cp >> (12 - 4 * k)) & 15];
  for_each_member_name(text, len, rewrite_nul_escapes, &rw);
  nn->active = 1;
  nn->utf8[0] = (unsigned char)(0xE0 | (cp >> 12));
  nn->utf8[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
  nn->utf8[2] = (unsigned char)(0x80 | (cp & 0x3F));
  *copy = text;
  text = NULL;

cleanup:
  free(text);
  free(used);
  return rc;
}

/* ------------------------------------------------------------------ */
/* Serialiser                                                           */
/* ------------------------------------------------------------------ */

typedef struct member {
  const char *name;
  size_t len;
  char *owned; /* name with U+0000 restored, when it needed that */
  json_t *value;
} member;

/*
 * The first code point of s[i..n), with UTF-16's order: U+E000-U+FFFF are
 * lifted above the supplementary planes, because in UTF-16 those planes are
 * surrogate pairs, whose units (0xD800-0xDFFF) sort below 0xE000. Everything
 * else keeps code point order, which is UTF-8's byte order. -1 at the end.
 */
static long utf16_rank(const unsigned char *s, size_t n, size_t i) {
  long cp;
  int more;
  if (i >= n)
    return -1;
  if (s[i] < 0x80)
    return s[i];
  if ((s[i] & 0xE0) == 0xC0) {
    cp = s[i] & 0x1F;
    more = 1;
  } else if ((s[i] & 0xF0) == 0xE0) {
    cp = s[i] & 0x0F;
    more = 2;
  } else {
    cp = s[i] & 0x07;
    more = 3;
  }
  for (int k = 1; k <= more && i + k < n; k++)
    cp = (cp << 6) | (s[i + k] & 0x3F);
  if (cp >= 0xE000 && cp <= 0xFFFF)
    cp += 0x110000;
  return cp;
}

/* Orders member names by their UTF-16 code units, as RFC 8785 requires. */
static int compare_members(const void *pa, const void *pb) {
  const member *a = pa, *b = pb;
  const unsigned char *x = (const unsigned char *)a->name;
  const unsigned char *y = (const unsigned char *)b->name;
  size_t i = 0;
  long rx, ry;
  while (i < a->len && i < b->len && x[i] == y[i])
    i++;
  if (i == a->len && i == b->len)
    return 0;
  /* The names share bytes 0..i-1; when they part inside a code point, back up
   * to its first byte so that whole code points are compared. */
  while (i > 0 && ((i < a->len && (x[i] & 0xC0) == 0x80) ||
                   (i < b->len && (y[i] & 0xC0) == 0x80)))
    i--;
  rx = utf16_rank(x, a->len, i);
  ry = utf16_rank(y, b->len, i);
  return rx < ry ? -1 : rx > ry;
}

/* Writes a string with RFC 8785's escapes: the two-character forms where
 * JSON has them, \u00xx in lowercase for the other controls, and every other
 * character, '/' and DEL included, as its literal UTF-8. */
static int write_string(canon_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  static const char short_from[] = "\"\\\b\f\n\r\t", short_to[] = "\"\\bfnrt";
  size_t run = 0;
  int rc = buf_putc(b, '"');
  for (size_t i = 0; i < n && rc == IDEM_OK; i++) {
    unsigned char c = (unsigned char)s[i];
    char esc[7];
    size_t esc_len = 2;
    const char *hit;
    if (c >= 0x20 && c != '"' && c != '\\')
      continue;
    /* Flush the literal run before this character, then its escape. */
    rc = buf_put(b, s + run, i - run);
    if (rc != IDEM_OK)
      break;
    run = i + 1;
    esc[0] = '\\';
    hit = memchr(short_from, c, sizeof short_from - 1);
    if (hit != NULL) {
      esc[1] = short_to[hit - short_from];
    } else {
      memcpy(esc + 1, "u00", 3);
      esc[4] = hex[c >> 4];
      esc[5] = hex[c & 15];
      esc_len = 6;
    }
    rc = buf_put(b, esc, esc_len);
  }
  if (rc == IDEM_OK)
    rc = buf_put(b, s + run, n - run);
  if (rc == IDEM_OK)
    rc = buf_putc(b, '"');
  return rc;
}

/* Copies name with each placeholder turned back into U+0000. */
static int restore_name(const nul_names *nn, member *m) {
  const unsigned char *s = (const unsigned char *)m->name;
  size_t o = 0;
  if (memchr(m->name, nn->utf8[0], m->len) == NULL)
    return IDEM_OK;
  m->owned = malloc(m->len + 1);
  if (m->owned == NULL)
    return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
  for (size_t i = 0; i < m->len; i++) {
    if (m->len - i >= 3 && memcmp(s + i, nn->utf8, 3) == 0) {
      m->owned[o++] = '\0';
      i += 2;
    } else {
      m->owned[o++] = (char)s[i];
    }
  }
  m->name = m->owned;
  m->len = o;
  return IDEM_OK;
}

static int write_value(canon_buf *b, json_t *v, const nul_names *nn);

static int write_object(canon_buf *b, json_t *obj, const nul_names *nn) {
  size_t count = json_object_size(obj), k = 0;
  member *members = NULL;
  int rc = IDEM_OK;

  if (count > 0) {
    members = calloc(count, sizeof *members);
    if (members == NULL)
      return idem__fail(IDEM_ENOMEM, "canonicalize: out of memory");
  }
  for (void *it = json_object_iter(obj); it != NULL && k < count;
       it = json_object_iter_next(obj, it), k++) {
    members[k].name = json_object_iter_key(it);
    members[k].len = json_object_iter_key_len(it);
    members[k].value = json_object_iter_value(it);
    if (nn->active && (rc = restore_name(nn, &members[k])) != IDEM_OK) {
      k++;
      goto cleanup;
    }
  }
  if (k > 1)
    qsort(members, k, sizeof *members, compare_members);

  rc = buf_putc(b, '{');
  for (size_t i = 0; i < k && rc == IDEM_OK; i++) {
    if (i > 0)
      rc = buf_putc(b, ',');
    if (rc == IDEM_OK)
      rc = write_string(b, members[i].name, members[i].len);
    if (rc == IDEM_OK)
      rc = buf_putc(b, ':');
    if (rc == IDEM_OK)
      rc = write_value(b, members[i].value, nn);
  }
  if (rc == IDEM_OK)
    rc = buf_putc(b, '}');

cleanup:
  for (size_t i = 0; i < k; i++)
    free(members[i].owned);
  free(members);
  return rc;
}

static int write_value(canon_buf *b, json_t *v, const nul_names *nn) {
  char num[32];
  size_t num_len = 0;
  int rc;

  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return write_object(b, v, nn);
  case JSON_ARRAY: {
    size_t n = json_array_size(v);
    rc = buf_putc(b, '[');
    for (size_t i = 0; i < n && rc == IDEM_OK; i++) {
      if (i > 0)
        rc = buf_putc(b, ',');
      if (rc == IDEM_OK)
        rc = write_value(b, json_array_get(v, i), nn);
    }
    return rc == IDEM_OK ? buf_putc(b, ']') : rc;
  }
  case JSON_STRING:
    return write_string(b, json_string_value(v), json_string_length(v));
  case JSON_REAL:
  case JSON_INTEGER:
    /* JSON_DECODE_INT_AS_REAL makes every number a real; integers are
     * handled all the same in case a caller's jansson ever hands one. */
    rc = idem__format_double(json_number_value(v), num, &num_len);
    return rc == IDEM_OK ? buf_put(b, num, num_len) : rc;
  case JSON_TRUE:
    return buf_put(b, "true", 4);
  case JSON_FALSE:
    return buf_put(b, "false", 5);
  case JSON_NULL:
    return buf_put(b, "null", 4);
  }
  return idem__fail(IDEM_EJSON, "canonicalize: unknown jansson value type");
}

/* ------------------------------------------------------------------ */
/* Parser errors                                                        */
/* ------------------------------------------------------------------ */

/*
 * Turns a jansson error into a result code, a detail and the offset of the
 * problem. jansson's position is a byte count: for invalid UTF-8 it is the
 * offending sequence's first byte, for everything else the end of the token
 * where it gave up, which is moved back to the token's start where that is
 * clearer.
 */
static int map_parse_error(const json_error_t *e, const char *json, size_t len,
                           const canon_scan *sc, size_t *offset) {
  size_t pos = e->position < 0 ? 0 : (size_t)e->position;
  if (pos > len)
    pos = len;
  *offset = pos;

  switch (json_error_code(e)) {
  case json_error_invalid_utf8:
    return idem__fail(IDEM_EUTF8, "at byte %zu: invalid UTF-8 (byte 0x%02x)",
                      pos, pos < len ? (unsigned char)json[pos] : 0u);
  case json_error_duplicate_key:
    *offset = string_start(json, pos);
    return idem__fail(IDEM_EDUPKEY, "at byte %zu: duplicate member name",
                      *offset);
  case json_error_numeric_overflow: {
    size_t start = number_start(json, pos);
    int shown = pos - start > 40 ? 40 : (int)(pos - start);
    *offset = start;
    return idem__fail(IDEM_ERANGE,
                      "at byte %zu: number %.*s%s is outside the range of a "
                      "double",
                      start, shown, json + start,
                      pos - start > 40 ? "..." : "");
  }
  case json_error_stack_overflow:
    return idem__fail(
        IDEM_EDEPTH, "at byte %zu: nesting deeper than the parser allows", pos);
  case json_error_end_of_input_expected:
    *offset = after_first_value(json, len);
    return idem__fail(IDEM_EJSON,
                      "at byte %zu: unexpected data after the JSON value",
                      *offset);
  case json_error_out_of_memory:
    return idem__fail(IDEM_ENOMEM, "at byte %zu: out of memory while parsing",
                      pos);
  case json_error_invalid_syntax:
    /* jansson reports lone surrogate escapes as syntax errors whose text
     * starts "invalid Unicode"; our scan knows where the escape is. */
    if (strncmp(e->text, "invalid Unicode", 15) == 0) {
      if (sc->surrogate_off == NO_OFFSET || sc->surrogate_off > pos)
        return idem__fail(IDEM_EUTF8, "at byte %zu: %s", pos, e->text);
      *offset = sc->surrogate_off;
      return idem__fail(IDEM_EUTF8,
                        "at byte %zu: lone surrogate \\u%04lX (surrogates "
                        "must come in high-low pairs)",
                        *offset, sc->surrogate_unit);
    }
    break;
  default:
    break;
  }
  return idem__fail(IDEM_EJSON, "at byte %zu: %s", pos, e->text);
}

/* ------------------------------------------------------------------ */
/* idem_canonicalize                                                    */
/* ------------------------------------------------------------------ */

int idem_canonicalize(const char *json, size_t len,
                      const idem_canon_limits *limits, char **out,
                      size_t *out_len, size_t *err_offset) {
  const size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                       JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL;
  size_t max_bytes = CANON_DEFAULT_MAX_BYTES;
  int max_depth = CANON_DEFAULT_MAX_DEPTH;
  size_t offset = 0;
  char *rewritten = NULL;
  json_t *root = NULL;
  json_error_t jerr;
  canon_buf b = {NULL, 0, 0, 0};
  canon_scan sc;
  nul_names nn = {0, {0, 0, 0}};
  int rc;

  if (out != NULL)
    *out = NULL;
  if (out_len != NULL)
    *out_len = 0;
  if (err_offset != NULL)
    *err_offset = 0;
  if (out == NULL || out_len == NULL || (json == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "canonicalize: NULL argument");
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
    offset = max_bytes;
    rc = idem__fail(IDEM_ETOOBIG,
                    "at byte %zu: input of %zu bytes is larger than the limit "
                    "of %zu bytes",
                    offset, len, max_bytes);
    goto cleanup;
  }
  /* jansson keeps its positions in an int. */
  if (len > INT_MAX) {
    offset = (size_t)INT_MAX;
    rc = idem__fail(IDEM_ETOOBIG,
                    "at byte %zu: input is larger than the parser supports",
                    offset);
    goto cleanup;
  }

  scan_text(json, len, max_depth, &sc);
  if (sc.nul_in_name) {
    rc = prepare_nul_names(json, len, &rewritten, &nn);
    if (rc != IDEM_OK)
      goto cleanup;
  }

  root = json_loadb(rewritten != NULL ? rewritten : json, len, flags, &jerr);
  if (root == NULL) {
    rc = map_parse_error(&jerr, json, len, &sc, &offset);
    /* A bracket nested too deep before the parser's complaint comes first. */
    if (sc.depth_off != NO_OFFSET && sc.depth_off < offset)
      goto too_deep;
    goto cleanup;
  }
  if (sc.depth_off != NO_OFFSET)
    goto too_deep;

  b.max = max_bytes > (SIZE_MAX - 64) / CANON_OUTPUT_FACTOR
              ? SIZE_MAX - 1
              : max_bytes * CANON_OUTPUT_FACTOR + 64;
  rc = write_value(&b, root, &nn);
  if (rc == IDEM_OK)
    rc = buf_reserve(&b, 0);
  if (rc != IDEM_OK)
    goto cleanup;
  b.data[b.len] = '\0';
  *out = b.data;
  *out_len = b.len;
  b.data = NULL;
  goto cleanup;

too_deep:
  offset = sc.depth_off;
  rc = idem__fail(IDEM_EDEPTH,
                  "at byte %zu: arrays and objects nested deeper than %d",
                  offset, max_depth);

cleanup:
  if (rc != IDEM_OK && err_offset != NULL)
    *err_offset = offset;
  free(b.data);
  json_decref(root);
  free(rewritten);
  return rc;
}
