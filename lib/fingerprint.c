/* fingerprint.c -- SHA-256 fingerprints of requests. */
#include "internal.h"

#include <openssl/evp.h>
#include <pthread.h>

/* OpenSSL 3 looks an algorithm up by name on every EVP_sha256() digest;
 * fetching it once saves that on every call. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void) { sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL); }

static void to_hex(const unsigned char *md, char hex[IDEM_FINGERPRINT_SIZE]) {
  static const char digits[] = "0123456789abcdef";
  for (unsigned i = 0; i < 32; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = '\0';
}

int idem__sha256_parts(const void *const *parts, const size_t *sizes,
                       int n, char hex[IDEM_FINGERPRINT_SIZE]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  EVP_MD_CTX *ctx;
  int ok;
  hex[0] = '\0';
  pthread_once(&sha256_once, fetch_sha256);
  if (!sha256_md || !(ctx = EVP_MD_CTX_new()))
    return idem__fail(IDEM_ENOMEM, "sha256: OpenSSL has no SHA-256");
  ok = EVP_DigestInit_ex(ctx, sha256_md, NULL);
  for (int i = 0; ok && i < n; i++)
    if (sizes[i])
      ok = EVP_DigestUpdate(ctx, parts[i], sizes[i]);
  ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen == 32;
  EVP_MD_CTX_free(ctx);
  if (!ok)
    return idem__fail(IDEM_ENOMEM, "sha256: OpenSSL digest failed");
  to_hex(md, hex);
  return IDEM_OK;
}

int idem_sha256_hex(const void *data, size_t len,
                    char hex[IDEM_FINGERPRINT_SIZE]) {
  idem__clear_error();
  if (hex == NULL || (data == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "sha256: NULL argument");
  return idem__sha256_parts(&data, &len, 1, hex);
}

/*
 * JSON requests are fingerprinted by idem__fingerprint_text(): RFC 8785's
 * canonical form with numbers kept exact where a double cannot hold them,
 * so that two requests whose numbers differ in value never share a
 * fingerprint, and that every request without such a number keeps the
 * fingerprint 0.2 gave it (see canon.c).
 */
int idem__request_fingerprint(const char *json, size_t len,
                              const char *const *pointers,
                              char fp[IDEM_FINGERPRINT_SIZE]) {
  char *text = NULL;
  size_t text_len = 0;
  int rc;
  if (fp == NULL)
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL output");
  fp[0] = '\0';
  rc = idem__fingerprint_text(json, len, pointers, &text, &text_len, NULL);
  if (rc == IDEM_OK)
    rc = idem__sha256_parts((const void *const *)&text, &text_len, 1, fp);
  idem_free(text);
  return rc;
}

/*
 * Whether the fingerprint's text of a whole request (RFC 8785's form with
 * numbers exact, idem__fingerprint_text()) is also the canonical form
 * idem_canonicalize() writes. It is when every number in it is an integer
 * of at most 15 digits: a double holds such a value exactly, and both forms
 * write it as its digits. Other numbers (fractions, exponents, longer
 * integers) may differ between the two, and the canonical form is then
 * made apart. Strings are skipped whole.
 */
static int exact_is_canonical(const char *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (t[i] == '"') {
      for (i++; i < n && t[i] != '"'; i++)
        if (t[i] == '\\')
          i++;
      continue;
    }
    if (t[i] == '-' || (t[i] >= '0' && t[i] <= '9')) {
      size_t digits = 0;
      if (t[i] == '-')
        i++;
      for (; i < n && t[i] >= '0' && t[i] <= '9'; i++)
        digits++;
      if (digits > 15 || (i < n && (t[i] == '.' || t[i] == 'e' || t[i] == 'E')))
        return 0;
      i--; /* the loop steps over the character after the number */
    }
  }
  return 1;
}

int idem__request_forms(const char *json, size_t len,
                        const char *const *pointers,
                        char fp[IDEM_FINGERPRINT_SIZE], char **canon,
                        size_t *canon_len) {
  /* The fingerprint is taken from the request as sent: its numbers exact
   * where a double cannot hold them. The canonical form kept for operators
   * has doubles; for most requests the two texts are the same, and one
   * parse serves both. */
  char *text = NULL;
  size_t text_len = 0;
  int rc;
  *canon = NULL;
  *canon_len = 0;
  fp[0] = '\0';
  rc = idem__fingerprint_text(json, len, pointers, &text, &text_len, NULL);
  if (rc == IDEM_OK)
    rc = idem__sha256_parts((const void *const *)&text, &text_len, 1, fp);
  if (rc == IDEM_OK && !pointers && exact_is_canonical(text, text_len)) {
    *canon = text;
    *canon_len = text_len;
    text = NULL;
  } else if (rc == IDEM_OK) {
    rc = idem_canonicalize(json, len, NULL, canon, canon_len, NULL);
  }
  idem_free(text);
  if (rc != IDEM_OK)
    fp[0] = '\0';
  return rc;
}

int idem_fingerprint_text(const void *json, size_t len, char **text,
                          size_t *text_len) {
  idem__clear_error();
  if (text)
    *text = NULL;
  if (text_len)
    *text_len = 0;
  if (!text || !text_len || (!json && len))
    return idem__fail(IDEM_EINVAL, "fingerprint_text: NULL argument");
  return idem__fingerprint_text(json ? json : "", len, NULL, text, text_len,
                                NULL);
}

int idem_fingerprint_json(const void *json, size_t len,
                          char hex[IDEM_FINGERPRINT_SIZE], char **canonical,
                          size_t *canonical_len) {
  idem__clear_error();
  if (canonical)
    *canonical = NULL;
  if (canonical_len)
    *canonical_len = 0;
  if (!hex || !canonical || !canonical_len || (!json && len))
    return idem__fail(IDEM_EINVAL, "fingerprint_json: NULL argument");
  return idem__request_forms(json ? json : "", len, NULL, hex, canonical,
                             canonical_len);
}

int idem_fingerprint_with(const void *data, size_t len, unsigned flags,
                          char hex[IDEM_FINGERPRINT_SIZE]) {
  char *text = NULL;
  size_t text_len = 0;
  int rc;
  idem__clear_error();
  if (hex == NULL)
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL output");
  hex[0] = '\0';
  if (flags & ~(unsigned)(IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES))
    return idem__fail(IDEM_EINVAL, "fingerprint: unknown flags 0x%x", flags);
  if ((flags & IDEM_FP_LONE_SURROGATES) && !(flags & IDEM_FP_JSON))
    return idem__fail(IDEM_EINVAL, "fingerprint: IDEM_FP_LONE_SURROGATES "
                                   "without IDEM_FP_JSON");
  if (!(flags & IDEM_FP_JSON))
    return idem_sha256_hex(data, len, hex);
  if (data == NULL && len > 0)
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL argument");
  rc = idem__canon_text(
      data ? data : "", len, NULL,
      IDEM__CANON_EXACT |
          (flags & IDEM_FP_LONE_SURROGATES ? IDEM__CANON_LONE : 0),
      &text, &text_len, NULL);
  if (rc == IDEM_OK)
    rc = idem__sha256_parts((const void *const *)&text, &text_len, 1, hex);
  idem_free(text);
  return rc;
}

int idem_fingerprint(const void *data, size_t len, int is_json,
                     char hex[IDEM_FINGERPRINT_SIZE]) {
  idem__clear_error();
  if (hex == NULL)
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL output");
  hex[0] = '\0';
  if (!is_json)
    return idem_sha256_hex(data, len, hex);
  return idem__request_fingerprint(data, len, NULL, hex);
}
