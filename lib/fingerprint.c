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
