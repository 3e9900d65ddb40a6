/* fingerprint.c -- SHA-256 fingerprints of requests. */
#include "internal.h"

#include <openssl/evp.h>

int idem_sha256_hex(const void *data, size_t len,
                    char hex[IDEM_FINGERPRINT_SIZE]) {
  static const char digits[] = "0123456789abcdef";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  if (hex == NULL || (data == NULL && len > 0))
    return idem__fail(IDEM_EINVAL, "sha256: NULL argument");
  hex[0] = '\0';
  if (!EVP_Digest(len ? data : "", len, md, &mdlen, EVP_sha256(), NULL) ||
      mdlen != 32)
    return idem__fail(IDEM_ENOMEM, "sha256: OpenSSL EVP_Digest failed");
  for (unsigned i = 0; i < 32; i++) {
    hex[2 * i] = digits[md[i] >> 4];
    hex[2 * i + 1] = digits[md[i] & 15];
  }
  hex[64] = '\0';
  return IDEM_OK;
}

int idem_fingerprint(const void *data, size_t len, int is_json,
                     char hex[IDEM_FINGERPRINT_SIZE]) {
  char *canon = NULL;
  size_t canon_len = 0;
  int rc;
  if (hex == NULL)
    return idem__fail(IDEM_EINVAL, "fingerprint: NULL output");
  hex[0] = '\0';
  if (!is_json)
    return idem_sha256_hex(data, len, hex);
  rc = idem_canonicalize(data, len, NULL, &canon, &canon_len, NULL);
  if (rc == IDEM_OK)
    rc = idem_sha256_hex(canon, canon_len, hex);
  idem_free(canon);
  return rc;
}
