/* seal.c -- sealed responses and requests (see seal.h). */
#include "seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Looked up once: OpenSSL 3 otherwise finds the cipher by name on every
 * use (as fingerprint.c does for SHA-256). */
static EVP_CIPHER *gcm_fetched;
static pthread_once_t gcm_once = PTHREAD_ONCE_INIT;

static void fetch_gcm(void) {
  gcm_fetched = EVP_CIPHER_fetch(NULL, "AES-256-GCM", NULL);
}

static const EVP_CIPHER *gcm(void) {
  pthread_once(&gcm_once, fetch_gcm);
  return gcm_fetched ? gcm_fetched : EVP_aes_256_gcm();
}

int idem_seal_key_id(const unsigned char key[IDEM_SEAL_KEY_SIZE], char id[17]) {
  static const char label[] = "idem seal key id";
  const void *parts[2] = {label, key};
  size_t sizes[2] = {sizeof label - 1, IDEM_SEAL_KEY_SIZE};
  char hex[IDEM_FINGERPRINT_SIZE];
  int rc;
  idem__clear_error();
  if (!id)
    return idem__fail(IDEM_EINVAL, "seal_key_id: NULL output");
  id[0] = '\0';
  if (!key)
    return idem__fail(IDEM_EINVAL, "seal_key_id: NULL key");
  /* The id is derived from the key, so that a key id can never name the
   * wrong key: only the first 8 bytes, enough to tell keys apart, and too
   * few to help anyone guess a key. */
  if ((rc = idem__sha256_parts(parts, sizes, 2, hex)) != IDEM_OK)
    return rc;
  memcpy(id, hex, 16);
  id[16] = '\0';
  return IDEM_OK;
}

void idem__seal_free(struct idem__seal *s) {
  if (!s)
    return;
  if (s->keys)
    OPENSSL_cleanse(s->keys, s->n * sizeof *s->keys);
  free(s->keys);
  free(s->ids);
  free(s);
}

int idem_store_seal(idem_store *store,
                    const unsigned char (*keys)[IDEM_SEAL_KEY_SIZE], size_t n) {
  struct idem__seal *s = NULL;
  int rc;
  idem__clear_error();
  if (!store)
    return idem__fail(IDEM_EINVAL, "store_seal: NULL store");
  if ((rc = idem__store_owned(store, "store_seal")) != IDEM_OK)
    return rc;
  if (n && !keys)
    return idem__fail(IDEM_EINVAL, "store_seal: NULL keys with n = %zu", n);
  if (n > 1024)
    return idem__fail(IDEM_EINVAL, "store_seal: %zu keys; at most 1024", n);
  if (n) {
    if (!(s = calloc(1, sizeof *s)) ||
        !(s->keys = malloc(n * sizeof *s->keys)) ||
        !(s->ids = malloc(n * sizeof *s->ids))) {
      idem__seal_free(s);
      return idem__fail(IDEM_ENOMEM, "store_seal: out of memory");
    }
    s->n = n;
    memcpy(s->keys, keys, n * sizeof *s->keys);
    for (size_t i = 0; i < n; i++)
      if ((rc = idem_seal_key_id(keys[i], s->ids[i])) != IDEM_OK) {
        idem__seal_free(s);
        return rc;
      }
  }
  idem__seal_free(store->seal);
  store->seal = s;
  return IDEM_OK;
}

static int hex16(const char *p) {
  for (int i = 0; i < 16; i++)
    if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
      return 0;
  return 1;
}

int idem__seal_marker_prefix(const void *meta, size_t meta_len) {
  /* "\0idem-sealed:" without the version: a later format's marker is
   * reserved too. */
  return meta && meta_len >= 13 && memcmp(meta, IDEM__SEAL_MARK, 13) == 0;
}

int idem__seal_marked(const void *meta, size_t meta_len, char kid[17]) {
  const char *m = meta;
  if (!meta || meta_len != IDEM__SEAL_META_LEN ||
      memcmp(m, IDEM__SEAL_MARK, IDEM__SEAL_MARK_LEN) != 0 ||
      !hex16(m + IDEM__SEAL_MARK_LEN))
    return 0;
  if (kid) {
    memcpy(kid, m + IDEM__SEAL_MARK_LEN, 16);
    kid[16] = '\0';
  }
  return 1;
}

int idem__seal_request_marked(const void *req, size_t len, char kid[17]) {
  if (len < IDEM__SEAL_META_LEN + IDEM__SEAL_NONCE_LEN + IDEM__SEAL_TAG_LEN)
    return 0;
  return idem__seal_marked(req, IDEM__SEAL_META_LEN, kid);
}

/* The additional data: tenant NUL operation NUL key NUL what. */
static size_t make_aad(char *buf, size_t size, const char *tenant,
                       const char *operation, const char *key,
                       const char *what) {
  int n = snprintf(buf, size, "%s%c%s%c%s%c%s", tenant ? tenant : "", '\0',
                   operation, '\0', key, '\0', what);
  return n < 0 || (size_t)n >= size ? 0 : (size_t)n;
}

/* AES-256-GCM of the parts (p1, then p2, then p3) under k with nonce and
 * aad into ct (as long as the parts) and tag. 1 on success. */
static int encrypt(const unsigned char *k, const unsigned char *nonce,
                   const char *aad, size_t aad_len, const void *const *p,
                   const size_t *sizes, int np, unsigned char *ct,
                   unsigned char *tag) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  int ok = ctx != NULL, len = 0;
  size_t at = 0;
  ok = ok && EVP_EncryptInit_ex(ctx, gcm(), NULL, NULL, NULL) &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, IDEM__SEAL_NONCE_LEN,
                           NULL) &&
       EVP_EncryptInit_ex(ctx, NULL, NULL, k, nonce) &&
       EVP_EncryptUpdate(ctx, NULL, &len, (const unsigned char *)aad,
                         (int)aad_len);
  for (int i = 0; ok && i < np; i++) {
    if (!sizes[i])
      continue;
    ok = EVP_EncryptUpdate(ctx, ct + at, &len, p[i], (int)sizes[i]);
    at += (size_t)len;
  }
  ok = ok && EVP_EncryptFinal_ex(ctx, ct + at, &len) &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, IDEM__SEAL_TAG_LEN, tag);
  EVP_CIPHER_CTX_free(ctx);
  return ok;
}

/* Opens ct (n bytes) with tag into pt; 1 when it is authentic. */
static int decrypt(const unsigned char *k, const unsigned char *nonce,
                   const char *aad, size_t aad_len, const unsigned char *ct,
                   size_t n, const unsigned char *tag, unsigned char *pt) {
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  int ok = ctx != NULL, len = 0;
  ok = ok && EVP_DecryptInit_ex(ctx, gcm(), NULL, NULL, NULL) &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, IDEM__SEAL_NONCE_LEN,
                           NULL) &&
       EVP_DecryptInit_ex(ctx, NULL, NULL, k, nonce) &&
       EVP_DecryptUpdate(ctx, NULL, &len, (const unsigned char *)aad,
                         (int)aad_len) &&
       (n == 0 || EVP_DecryptUpdate(ctx, pt, &len, ct, (int)n)) &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, IDEM__SEAL_TAG_LEN,
                           (void *)tag) &&
       EVP_DecryptFinal_ex(ctx, pt + (n ? (size_t)len : 0), &len) > 0;
  EVP_CIPHER_CTX_free(ctx);
  return ok;
}

/* The index of the key named kid, or -1. */
static int find_key(const struct idem__seal *s, const char *kid) {
  for (size_t i = 0; s && i < s->n; i++)
    if (memcmp(s->ids[i], kid, 16) == 0)
      return (int)i;
  return -1;
}

int idem__seal_response(const struct idem__seal *s, const char *tenant,
                        const char *operation, const char *key,
                        const idem_response *in, idem_response *out,
                        void **buf) {
  char aad[3 * 256 + 16], status[16];
  size_t aad_len, pt_len = 4 + in->meta_len + in->body_len;
  unsigned char len4[4], *b;
  memset(out, 0, sizeof *out);
  *buf = NULL;
  snprintf(status, sizeof status, "%d", in->status);
  if (!(aad_len = make_aad(aad, sizeof aad, tenant, operation, key, status)))
    return idem__fail(IDEM_EINVAL, "seal: record name too long");
  /* One buffer: the marker (the meta), then the body. */
  if (!(b = malloc(IDEM__SEAL_META_LEN + IDEM__SEAL_NONCE_LEN + pt_len +
                   IDEM__SEAL_TAG_LEN)))
    return idem__fail(IDEM_ENOMEM, "seal: out of memory");
  memcpy(b, IDEM__SEAL_MARK, IDEM__SEAL_MARK_LEN);
  memcpy(b + IDEM__SEAL_MARK_LEN, s->ids[0], 16);
  unsigned char *nonce = b + IDEM__SEAL_META_LEN;
  unsigned char *ct = nonce + IDEM__SEAL_NONCE_LEN;
  /* A nonce is never used twice under one key: 96 random bits each time,
   * as NIST SP 800-38D allows for up to 2^32 seals per key. */
  if (RAND_bytes(nonce, IDEM__SEAL_NONCE_LEN) != 1) {
    free(b);
    return idem__fail(IDEM_EIO, "seal: no random bytes for a nonce");
  }
  len4[0] = (unsigned char)(in->meta_len >> 24);
  len4[1] = (unsigned char)(in->meta_len >> 16);
  len4[2] = (unsigned char)(in->meta_len >> 8);
  len4[3] = (unsigned char)in->meta_len;
  {
    const void *parts[3] = {len4, in->meta, in->body};
    size_t sizes[3] = {4, in->meta_len, in->body_len};
    if (!encrypt(s->keys[0], nonce, aad, aad_len, parts, sizes, 3, ct,
                 ct + pt_len)) {
      free(b);
      return idem__fail(IDEM_ENOMEM, "seal: AES-256-GCM failed");
    }
  }
  out->status = in->status;
  out->meta = b;
  out->meta_len = IDEM__SEAL_META_LEN;
  out->body = nonce;
  out->body_len = IDEM__SEAL_NONCE_LEN + pt_len + IDEM__SEAL_TAG_LEN;
  *buf = b;
  return IDEM_OK;
}

/* Why a sealed thing of (tenant, operation, key) does not open. */
static int no_key(const char *tenant, const char *operation, const char *key,
                  const char *what, const char *kid) {
  return idem__fail(IDEM_ESEALED,
                    "record (%s, %s, %s): its %s is sealed with key %s, "
                    "which this handle lacks; it is not replayed",
                    tenant ? tenant : "", operation, key, what, kid);
}

static int broken(const char *tenant, const char *operation, const char *key,
                  const char *what, const char *kid) {
  return idem__fail(IDEM_ECORRUPT,
                    "record (%s, %s, %s): its %s, sealed with key %s, does "
                    "not open: it was altered, or moved from another record; "
                    "it is not replayed (idem keys delete removes it)",
                    tenant ? tenant : "", operation, key, what, kid);
}

int idem__seal_open(const struct idem__seal *s, const char *tenant,
                    const char *operation, const char *key, int status,
                    const void *meta, size_t meta_len, const void *body,
                    size_t body_len, idem_response *out, void **buf) {
  char kid[17], aad[3 * 256 + 16], st[16];
  size_t aad_len, n, ml;
  unsigned char *pt;
  const unsigned char *b = body;
  int k;
  memset(out, 0, sizeof *out);
  *buf = NULL;
  if (!idem__seal_marked(meta, meta_len, kid))
    return idem__fail(IDEM_EINVAL, "seal: not a sealed response");
  if ((k = find_key(s, kid)) < 0)
    return no_key(tenant, operation, key, "response", kid);
  snprintf(st, sizeof st, "%d", status);
  aad_len = make_aad(aad, sizeof aad, tenant, operation, key, st);
  if (!aad_len || !body ||
      body_len < IDEM__SEAL_NONCE_LEN + 4 + IDEM__SEAL_TAG_LEN)
    return broken(tenant, operation, key, "response", kid);
  n = body_len - IDEM__SEAL_NONCE_LEN - IDEM__SEAL_TAG_LEN;
  /* Two bytes more: the meta's and the body's NULs (see below). */
  if (!(pt = malloc(n + 2)))
    return idem__fail(IDEM_ENOMEM, "open: out of memory");
  if (!decrypt(s->keys[k], b, aad, aad_len, b + IDEM__SEAL_NONCE_LEN, n,
               b + body_len - IDEM__SEAL_TAG_LEN, pt)) {
    free(pt);
    return broken(tenant, operation, key, "response", kid);
  }
  ml = (size_t)pt[0] << 24 | (size_t)pt[1] << 16 | (size_t)pt[2] << 8 | pt[3];
  if (ml > n - 4) {
    free(pt);
    return broken(tenant, operation, key, "response", kid);
  }
  /* Laid out as idem__claim_set_response() does: meta NUL body NUL, each
   * printable as is. The length's four bytes make room for the meta's
   * NUL. */
  memmove(pt, pt + 4, n - 4);
  memmove(pt + ml + 1, pt + ml, n - 4 - ml);
  pt[ml] = '\0';
  pt[n - 4 + 1] = '\0';
  out->status = status;
  out->meta = ml ? pt : NULL;
  out->meta_len = ml;
  out->body = pt + ml + 1;
  out->body_len = n - 4 - ml;
  *buf = pt;
  return IDEM_OK;
}

int idem__seal_request(const struct idem__seal *s, const idem_id *id,
                       const void *req, size_t len, void **out,
                       size_t *out_len) {
  char aad[3 * 256 + 16];
  size_t aad_len;
  unsigned char *b;
  *out = NULL;
  *out_len = 0;
  if (!(aad_len = make_aad(aad, sizeof aad, id->tenant, id->operation, id->key,
                           "request")))
    return idem__fail(IDEM_EINVAL, "seal: record name too long");
  if (!(b = malloc(IDEM__SEAL_META_LEN + IDEM__SEAL_NONCE_LEN + len +
                   IDEM__SEAL_TAG_LEN)))
    return idem__fail(IDEM_ENOMEM, "seal: out of memory");
  memcpy(b, IDEM__SEAL_MARK, IDEM__SEAL_MARK_LEN);
  memcpy(b + IDEM__SEAL_MARK_LEN, s->ids[0], 16);
  unsigned char *nonce = b + IDEM__SEAL_META_LEN;
  if (RAND_bytes(nonce, IDEM__SEAL_NONCE_LEN) != 1) {
    free(b);
    return idem__fail(IDEM_EIO, "seal: no random bytes for a nonce");
  }
  {
    const void *parts[1] = {req};
    size_t sizes[1] = {len};
    if (!encrypt(s->keys[0], nonce, aad, aad_len, parts, sizes, 1,
                 nonce + IDEM__SEAL_NONCE_LEN,
                 nonce + IDEM__SEAL_NONCE_LEN + len)) {
      free(b);
      return idem__fail(IDEM_ENOMEM, "seal: AES-256-GCM failed");
    }
  }
  *out = b;
  *out_len =
      IDEM__SEAL_META_LEN + IDEM__SEAL_NONCE_LEN + len + IDEM__SEAL_TAG_LEN;
  return IDEM_OK;
}

int idem__seal_open_request(const struct idem__seal *s, const char *tenant,
                            const char *operation, const char *key,
                            const void *req, size_t len, void **out,
                            size_t *out_len) {
  char kid[17], aad[3 * 256 + 16];
  const unsigned char *b = req;
  size_t aad_len, n;
  unsigned char *pt;
  int k;
  *out = NULL;
  *out_len = 0;
  if (!idem__seal_request_marked(req, len, kid))
    return idem__fail(IDEM_EINVAL, "seal: not a sealed request");
  if ((k = find_key(s, kid)) < 0)
    return no_key(tenant, operation, key, "request", kid);
  aad_len = make_aad(aad, sizeof aad, tenant, operation, key, "request");
  n = len - IDEM__SEAL_META_LEN - IDEM__SEAL_NONCE_LEN - IDEM__SEAL_TAG_LEN;
  if (!aad_len)
    return broken(tenant, operation, key, "request", kid);
  if (!(pt = malloc(n + 1)))
    return idem__fail(IDEM_ENOMEM, "open: out of memory");
  b += IDEM__SEAL_META_LEN;
  if (!decrypt(s->keys[k], b, aad, aad_len, b + IDEM__SEAL_NONCE_LEN, n,
               b + IDEM__SEAL_NONCE_LEN + n, pt)) {
    free(pt);
    return broken(tenant, operation, key, "request", kid);
  }
  pt[n] = '\0';
  *out = pt;
  *out_len = n;
  return IDEM_OK;
}
