/*
 * jwt.c -- the JWT verifier of --principal jwt (see jwt.h for the contract).
 *
 * OpenSSL 3 is used directly: Debian's libjwt and cjose know neither EdDSA
 * nor JWK Sets. A token is checked in an order that lets nothing it says be
 * trusted before its signature is: its size, its three parts, its header
 * (the algorithm must be one of ours, picked by us, never by the key: the
 * "alg confusion" of an HMAC keyed with an RSA public key needs a verifier
 * that lets the token choose), the key (by kid, of the type the algorithm
 * needs), the signature over the first two parts as sent, and only then the
 * claims of the payload.
 *
 * Key sets are immutable once loaded and reference-counted. A verifying
 * thread takes a reference under a read lock held only for the increment,
 * so a refresh never waits for verifications and a verification never
 * waits for a fetch: the refresher builds the new set with no lock held,
 * swaps the pointer under the write lock, and the last thread to let go of
 * the old set frees it.
 *
 * The refresher is one thread per verifier with a URL source. It sleeps on
 * a condition variable (on CLOCK_MONOTONIC, so a step of the wall clock
 * neither hastens nor stalls it) until the period is over or a token names
 * a key id the set lacks: then it fetches, at most once per
 * JWT_KID_REFRESH_MIN_S for the latter, so that a flood of tokens with made
 * up key ids costs the key server one request per ten seconds.
 */
#include "jwt.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

/* The algorithms taken, and the key type each needs. */
typedef enum { ALG_RS256, ALG_PS256, ALG_ES256, ALG_EDDSA } jwt_alg;
static const char *const alg_names[] = {"RS256", "PS256", "ES256", "EdDSA"};

typedef enum { KT_OTHER, KT_RSA, KT_P256, KT_ED25519 } key_type;

static key_type alg_key_type(jwt_alg a) {
  switch (a) {
  case ALG_RS256:
  case ALG_PS256:
    return KT_RSA;
  case ALG_ES256:
    return KT_P256;
  case ALG_EDDSA:
    return KT_ED25519;
  }
  return KT_OTHER;
}

/* RSA keys shorter than this are refused: RS256 with 1024 bits is within
 * reach of a well-funded forger. Longer than the maximum is refused too,
 * since each verification costs time with the modulus' size. */
#define RSA_MIN_BITS 2048
#define RSA_MAX_BITS 16384

/*
 * One key of a set. Keys of a type this verifier cannot use (EC P-384, OKP
 * X25519, oct) are kept with pkey NULL and type KT_OTHER, so that a token
 * naming one is told that its key is of another type rather than unknown.
 */
typedef struct jwt_key {
  char *kid;      /* NULL: the key has none */
  char *alg;      /* NULL: the key does not restrict its algorithm */
  int for_sig;    /* use absent or "sig" */
  key_type type;  /* KT_OTHER: never selected */
  EVP_PKEY *pkey; /* NULL for KT_OTHER */
} jwt_key;

typedef struct key_set {
  atomic_int refs; /* the verifier's reference plus one per verification */
  size_t n;
  size_t usable; /* keys of a type we can verify with */
  jwt_key keys[];
} key_set;

struct jwt_verifier {
  char *source;
  char *shown; /* the source as messages show it (no credentials) */
  char *issuer;
  char *audience;
  int is_url;
  int refresh_s;

  /* The current set: read under set_lock's read side, swapped under its
   * write side. */
  pthread_rwlock_t set_lock;
  key_set *set;

  /* The refresher (URL sources only). stop and kid_wanted are under mu;
   * kid_asked spares verifying threads the mutex while a refresh is already
   * asked for; stopping lets libcurl's progress callback cut a fetch short
   * at jwt_verifier_free(). */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  int kid_wanted;
  atomic_int kid_asked;
  atomic_int stopping;
  int have_thread;
  pthread_t thread;
};

/* ---- small helpers ------------------------------------------------------ */

static void say(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Writes a message into buf, if there is one; a NULL or empty buffer is
 * allowed for callers that do not want the text. */
static void say(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  if (!buf || n == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d)
    memcpy(d, s, n);
  return d;
}

/*
 * The source as messages show it. A URL may carry credentials in its user
 * information or its query (a key server behind basic authentication, an
 * access token in a parameter), and messages go to logs: both are left out.
 */
static char *shown_source(const char *src, int is_url) {
  const char *p, *host, *at = NULL;
  size_t alen, rest, i, n;
  char *out;
  if (!is_url)
    return dup_str(src);
  p = strstr(src, "://") + 3;
  alen = strcspn(p, "/?#");
  for (i = 0; i < alen; i++)
    if (p[i] == '@')
      at = p + i;
  host = at ? at + 1 : p;
  rest = strcspn(host, "?#");
  n = (size_t)(p - src) + 4 + rest + 1;
  if (!(out = malloc(n)))
    return NULL;
  snprintf(out, n, "%.*s%s%.*s", (int)(p - src), src, at ? "***@" : "",
           (int)rest, host);
  return out;
}

/* A key id fit to show in a message on stderr: printable ASCII of modest
 * length, or nothing (a remote set's kid could hold terminal escapes). */
static const char *shown_kid(const char *kid) {
  size_t i;
  if (!kid || strlen(kid) > 64)
    return NULL;
  for (i = 0; kid[i]; i++)
    if (kid[i] < 0x20 || kid[i] > 0x7e || kid[i] == '"')
      return NULL;
  return kid;
}

/* ---- base64url ----------------------------------------------------------- */

static int b64url_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '-')
    return 62;
  if (c == '_')
    return 63;
  return -1;
}

/*
 * Decodes len characters of base64url without padding (RFC 7515, section 2)
 * into a new buffer, NUL-terminated for convenience. Strict: padding, any
 * other character, a length that leaves a lone character (4k + 1) and
 * nonzero bits in the unused end of the last character are refused, so
 * that each byte string has exactly one encoding. Returns 0 with *out (the
 * caller frees it) and *outlen, or -1.
 */
static int b64url_decode(const char *s, size_t len, unsigned char **out,
                         size_t *outlen) {
  unsigned char *buf;
  uint32_t acc = 0;
  int bits = 0;
  size_t i, o = 0;
  *out = NULL;
  *outlen = 0;
  if (len % 4 == 1)
    return -1;
  if (!(buf = malloc(len / 4 * 3 + 3)))
    return -1;
  for (i = 0; i < len; i++) {
    int d = b64url_value((unsigned char)s[i]);
    if (d < 0)
      goto fail;
    acc = (acc << 6) | (uint32_t)d;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      buf[o++] = (unsigned char)(acc >> bits);
      acc &= (1u << bits) - 1;
    }
  }
  if (acc != 0)
    goto fail;
  buf[o] = 0;
  *out = buf;
  *outlen = o;
  return 0;
fail:
  free(buf);
  return -1;
}

/* Decodes a JWK member that must be base64url of exactly want bytes (0:
 * any length but empty). Returns 0, or -1 with msg set. */
static int jwk_bytes(json_t *k, const char *name, size_t want,
                     unsigned char **out, size_t *len, char *msg, size_t n) {
  const char *s = json_string_value(json_object_get(k, name));
  if (!s) {
    say(msg, n, "no \"%s\" string", name);
    return -1;
  }
  if (b64url_decode(s, strlen(s), out, len) != 0) {
    say(msg, n, "\"%s\" is not base64url without padding", name);
    return -1;
  }
  if ((want && *len != want) || *len == 0) {
    say(msg, n, "\"%s\" is %zu bytes long, not %zu", name, *len, want);
    free(*out);
    *out = NULL;
    return -1;
  }
  return 0;
}

/* ---- importing keys ------------------------------------------------------ */

/* Makes a public key of type name from params; checks it as OpenSSL would
 * before use (an EC point on its curve, an RSA modulus odd). */
static EVP_PKEY *key_from_params(const char *name, OSSL_PARAM_BLD *bld) {
  OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
  EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, name, NULL);
  EVP_PKEY_CTX *check = NULL;
  EVP_PKEY *pkey = NULL;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx) != 1 ||
      EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
    goto done;
  if (!(check = EVP_PKEY_CTX_new_from_pkey(NULL, pkey, NULL)) ||
      EVP_PKEY_public_check(check) != 1) {
    EVP_PKEY_free(pkey);
    pkey = NULL;
  }
done:
  EVP_PKEY_CTX_free(check);
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  return pkey;
}

static int import_rsa(json_t *k, jwt_key *key, char *msg, size_t n) {
  unsigned char *nb = NULL, *eb = NULL;
  size_t nlen, elen;
  BIGNUM *bn_n = NULL, *bn_e = NULL;
  OSSL_PARAM_BLD *bld = NULL;
  int rc = -1, bits;
  if (jwk_bytes(k, "n", 0, &nb, &nlen, msg, n) != 0 ||
      jwk_bytes(k, "e", 0, &eb, &elen, msg, n) != 0)
    goto done;
  if (elen > 8) {
    say(msg, n, "RSA exponent \"e\" is %zu bytes long", elen);
    goto done;
  }
  if (!(bn_n = BN_bin2bn(nb, (int)nlen, NULL)) ||
      !(bn_e = BN_bin2bn(eb, (int)elen, NULL))) {
    say(msg, n, "out of memory");
    goto done;
  }
  bits = BN_num_bits(bn_n);
  if (bits < RSA_MIN_BITS || bits > RSA_MAX_BITS) {
    say(msg, n, "RSA key of %d bits (%d to %d are taken)", bits, RSA_MIN_BITS,
        RSA_MAX_BITS);
    goto done;
  }
  if (!(bld = OSSL_PARAM_BLD_new()) ||
      !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn_n) ||
      !OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, bn_e) ||
      !(key->pkey = key_from_params("RSA", bld))) {
    say(msg, n, "OpenSSL refuses the RSA key");
    goto done;
  }
  key->type = KT_RSA;
  rc = 0;
done:
  OSSL_PARAM_BLD_free(bld);
  BN_free(bn_n);
  BN_free(bn_e);
  free(nb);
  free(eb);
  return rc;
}

static int import_p256(json_t *k, jwt_key *key, char *msg, size_t n) {
  unsigned char *x = NULL, *y = NULL, pt[65];
  size_t xlen, ylen;
  OSSL_PARAM_BLD *bld = NULL;
  int rc = -1;
  if (jwk_bytes(k, "x", 32, &x, &xlen, msg, n) != 0 ||
      jwk_bytes(k, "y", 32, &y, &ylen, msg, n) != 0)
    goto done;
  /* The uncompressed point (SEC 1, 2.3.3): 04, x, y. */
  pt[0] = 0x04;
  memcpy(pt + 1, x, 32);
  memcpy(pt + 33, y, 32);
  if (!(bld = OSSL_PARAM_BLD_new()) ||
      !OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME,
                                       "prime256v1", 0) ||
      !OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pt,
                                        sizeof pt) ||
      !(key->pkey = key_from_params("EC", bld))) {
    say(msg, n, "OpenSSL refuses the P-256 point (not on the curve?)");
    goto done;
  }
  key->type = KT_P256;
  rc = 0;
done:
  OSSL_PARAM_BLD_free(bld);
  free(x);
  free(y);
  return rc;
}

static int import_ed25519(json_t *k, jwt_key *key, char *msg, size_t n) {
  unsigned char *x = NULL;
  size_t xlen;
  if (jwk_bytes(k, "x", 32, &x, &xlen, msg, n) != 0)
    return -1;
  key->pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, x, xlen);
  free(x);
  if (!key->pkey) {
    say(msg, n, "OpenSSL refuses the Ed25519 key");
    return -1;
  }
  key->type = KT_ED25519;
  return 0;
}

/*
 * Reads one JWK into key. Keys of types this verifier does not use are
 * kept as KT_OTHER; a key of a type it uses that is malformed fails the
 * whole set, since a set that half loads would fail tokens in ways hard to
 * trace. Returns 0, or -1 with msg set.
 */
static int import_jwk(json_t *k, jwt_key *key, char *msg, size_t n) {
  json_t *kid, *alg, *use;
  const char *kty, *crv;
  if (!json_is_object(k)) {
    say(msg, n, "not a JSON object");
    return -1;
  }
  kid = json_object_get(k, "kid");
  alg = json_object_get(k, "alg");
  use = json_object_get(k, "use");
  if ((kid && !json_is_string(kid)) || (alg && !json_is_string(alg)) ||
      (use && !json_is_string(use))) {
    say(msg, n, "\"kid\", \"alg\" or \"use\" is not a string");
    return -1;
  }
  if ((kid && !(key->kid = dup_str(json_string_value(kid)))) ||
      (alg && !(key->alg = dup_str(json_string_value(alg))))) {
    say(msg, n, "out of memory");
    return -1;
  }
  key->for_sig = !use || strcmp(json_string_value(use), "sig") == 0;
  /* A private member in a published set means the private key leaked with
   * it: refuse the set loudly rather than verify with a compromised key. */
  if (json_object_get(k, "d") || json_object_get(k, "p") ||
      json_object_get(k, "k")) {
    say(msg, n,
        "holds private or secret key material (\"d\", \"p\" or "
        "\"k\"); a JWKS must hold public keys only");
    return -1;
  }
  if (!(kty = json_string_value(json_object_get(k, "kty")))) {
    say(msg, n, "no \"kty\" string");
    return -1;
  }
  crv = json_string_value(json_object_get(k, "crv"));
  if (strcmp(kty, "RSA") == 0)
    return import_rsa(k, key, msg, n);
  if (strcmp(kty, "EC") == 0 && crv && strcmp(crv, "P-256") == 0)
    return import_p256(k, key, msg, n);
  if (strcmp(kty, "OKP") == 0 && crv && strcmp(crv, "Ed25519") == 0)
    return import_ed25519(k, key, msg, n);
  key->type = KT_OTHER;
  return 0;
}

/* ---- key sets ------------------------------------------------------------ */

static void set_free(key_set *s) {
  size_t i;
  if (!s)
    return;
  for (i = 0; i < s->n; i++) {
    free(s->keys[i].kid);
    free(s->keys[i].alg);
    EVP_PKEY_free(s->keys[i].pkey);
  }
  free(s);
}

/* Lets go of one reference; the last one frees the set. */
static void set_release(key_set *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1)
    set_free(s);
}

/* Takes a reference to the current set, which stays valid (and unchanged)
 * until set_release() however the verifier's set is swapped meanwhile. */
static key_set *set_acquire(jwt_verifier *v) {
  key_set *s;
  pthread_rwlock_rdlock(&v->set_lock);
  s = v->set;
  atomic_fetch_add(&s->refs, 1);
  pthread_rwlock_unlock(&v->set_lock);
  return s;
}

static void set_swap(jwt_verifier *v, key_set *s) {
  key_set *old;
  pthread_rwlock_wrlock(&v->set_lock);
  old = v->set;
  v->set = s;
  pthread_rwlock_unlock(&v->set_lock);
  set_release(old);
}

/* Parses a JWK Set (RFC 7517, section 5). Returns 0 with *out, or -1 with
 * msg set. */
static int parse_set(const char *text, size_t len, key_set **out, char *msg,
                     size_t n) {
  json_error_t e;
  json_t *root, *keys;
  key_set *s = NULL;
  size_t i, count;
  char sub[160];
  *out = NULL;
  if (!(root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &e))) {
    say(msg, n, "not JSON (line %d: %s)", e.line, e.text);
    return -1;
  }
  keys = json_object_get(root, "keys");
  if (!json_is_object(root) || !json_is_array(keys)) {
    say(msg, n, "not a JWK Set (an object with a \"keys\" array)");
    goto fail;
  }
  count = json_array_size(keys);
  if (count > JWT_MAX_KEYS) {
    say(msg, n, "%zu keys, more than the %d taken", count, JWT_MAX_KEYS);
    goto fail;
  }
  if (!(s = calloc(1, sizeof *s + count * sizeof s->keys[0]))) {
    say(msg, n, "out of memory");
    goto fail;
  }
  atomic_init(&s->refs, 1);
  for (i = 0; i < count; i++) {
    jwt_key *k = &s->keys[i];
    s->n = i + 1; /* so that set_free() frees what this key holds */
    if (import_jwk(json_array_get(keys, i), k, sub, sizeof sub) != 0) {
      const char *kid = shown_kid(k->kid);
      if (kid)
        say(msg, n, "key %zu (kid \"%s\"): %s", i + 1, kid, sub);
      else
        say(msg, n, "key %zu: %s", i + 1, sub);
      goto fail;
    }
    if (k->type != KT_OTHER)
      s->usable++;
  }
  if (s->usable == 0) {
    say(msg, n,
        "no key usable with RS256, PS256, ES256 or EdDSA (RSA, EC "
        "P-256 or OKP Ed25519)");
    goto fail;
  }
  json_decref(root);
  *out = s;
  return 0;
fail:
  set_free(s);
  json_decref(root);
  return -1;
}

/* ---- loading a set ------------------------------------------------------- */

typedef struct body {
  char *data;
  size_t len;
  int too_large;
} body;

static size_t on_body(char *p, size_t size, size_t nmemb, void *ud) {
  body *b = ud;
  size_t n = size * nmemb;
  char *d;
  if (n > JWT_MAX_JWKS - b->len) {
    b->too_large = 1;
    return 0; /* libcurl ends the transfer with CURLE_WRITE_ERROR */
  }
  if (!(d = realloc(b->data, b->len + n + 1)))
    return 0;
  memcpy(d + b->len, p, n);
  b->data = d;
  b->len += n;
  d[b->len] = 0;
  return n;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow,
                       curl_off_t ultotal, curl_off_t ulnow) {
  jwt_verifier *v = ud;
  return atomic_load(&v->stopping) ? 1 : 0;
}

static int fetch_url(jwt_verifier *v, body *b, char *msg, size_t n) {
  char cerr[CURL_ERROR_SIZE] = "";
  long status = 0;
  CURLcode rc;
  CURL *h = curl_easy_init();
  if (!h) {
    say(msg, n, "cannot start libcurl");
    return -1;
  }
  curl_easy_setopt(h, CURLOPT_URL, v->source);
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(h, CURLOPT_PROTOCOLS, CURLPROTO_HTTP | CURLPROTO_HTTPS);
#endif
  /* No redirects: a key set is trusted for where it comes from, and a
   * redirect could lead an https source to a plain http one. */
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 15L);
  curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "");
  curl_easy_setopt(h, CURLOPT_USERAGENT, "idem-jwks");
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, v);
  rc = curl_easy_perform(h);
  if (rc == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  if (b->too_large) {
    say(msg, n, "larger than %d bytes", JWT_MAX_JWKS);
    return -1;
  }
  if (rc != CURLE_OK) {
    say(msg, n, "cannot fetch: %s", cerr[0] ? cerr : curl_easy_strerror(rc));
    return -1;
  }
  if (status != 200) {
    say(msg, n, "answered HTTP %ld, not 200", status);
    return -1;
  }
  return 0;
}

static int read_path(const char *path, body *b, char *msg, size_t n) {
  FILE *f = fopen(path, "rb");
  size_t got;
  if (!f) {
    say(msg, n, "cannot open: %s", strerror(errno));
    return -1;
  }
  /* One byte more than the cap tells a file too large from one at it. */
  if (!(b->data = malloc(JWT_MAX_JWKS + 2))) {
    fclose(f);
    say(msg, n, "out of memory");
    return -1;
  }
  got = fread(b->data, 1, JWT_MAX_JWKS + 1, f);
  if (ferror(f)) {
    say(msg, n, "cannot read: %s", strerror(errno));
    fclose(f);
    return -1;
  }
  fclose(f);
  if (got > JWT_MAX_JWKS) {
    say(msg, n, "larger than %d bytes", JWT_MAX_JWKS);
    return -1;
  }
  b->data[got] = 0;
  b->len = got;
  return 0;
}

/* Reads and parses the source's set. Returns 0 with *out, or -1 with msg
 * set (without the source's name, which the caller adds). */
static int load_set(jwt_verifier *v, key_set **out, char *msg, size_t n) {
  body b = {NULL, 0, 0};
  int rc;
  *out = NULL;
  rc = v->is_url ? fetch_url(v, &b, msg, n) : read_path(v->source, &b, msg, n);
  if (rc == 0)
    rc = parse_set(b.data ? b.data : "", b.len, out, msg, n);
  free(b.data);
  return rc;
}

/* ---- the refresher ------------------------------------------------------- */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Fetches the set once and swaps it in; a failure keeps the set loaded
 * before, and is told on stderr once per streak (*failing). */
static void refresh_once(jwt_verifier *v, int *failing) {
  char msg[512];
  key_set *s;
  size_t n;
  if (load_set(v, &s, msg, sizeof msg) != 0) {
    if (!*failing && !atomic_load(&v->stopping))
      fprintf(stderr,
              "idem: JWKS %s: refresh failed, keeping the keys loaded "
              "before: %s\n",
              v->shown, msg);
    *failing = 1;
    return;
  }
  n = s->n;
  set_swap(v, s);
  /* Told after the swap, so that whoever reads it finds the new keys. */
  if (*failing)
    fprintf(stderr, "idem: JWKS %s: refreshed again (%zu keys)\n", v->shown, n);
  *failing = 0;
}

static void *refresher(void *arg) {
  jwt_verifier *v = arg;
  double last = mono_now(); /* jwt_verifier_new() loaded the set */
  double last_kid = -1e9;   /* no refresh for a key id yet */
  int failing = 0;
  pthread_mutex_lock(&v->mu);
  while (!v->stop) {
    double now = mono_now(), wake = last + v->refresh_s;
    int kid_due = v->kid_wanted && now >= last_kid + JWT_KID_REFRESH_MIN_S;
    if (!kid_due && now < wake) {
      struct timespec ts;
      if (v->kid_wanted && last_kid + JWT_KID_REFRESH_MIN_S < wake)
        wake = last_kid + JWT_KID_REFRESH_MIN_S;
      ts.tv_sec = (time_t)wake;
      ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
      pthread_cond_timedwait(&v->cv, &v->mu, &ts);
      continue;
    }
    if (kid_due)
      last_kid = now;
    /* This fetch answers any token that asked before it starts. */
    v->kid_wanted = 0;
    atomic_store(&v->kid_asked, 0);
    pthread_mutex_unlock(&v->mu);
    refresh_once(v, &failing);
    last = mono_now();
    pthread_mutex_lock(&v->mu);
  }
  pthread_mutex_unlock(&v->mu);
  return NULL;
}

/* Asks the refresher for a fetch, from a verifying thread: a flag first, so
 * that a flood of unknown key ids takes the mutex once per fetch. */
static void ask_refresh(jwt_verifier *v) {
  if (!v->have_thread || atomic_exchange(&v->kid_asked, 1))
    return;
  pthread_mutex_lock(&v->mu);
  v->kid_wanted = 1;
  pthread_cond_signal(&v->cv);
  pthread_mutex_unlock(&v->mu);
}

/* ---- the verifier -------------------------------------------------------- */

int jwt_verifier_new(const char *source, const char *issuer,
                     const char *audience, int refresh_s, jwt_verifier **out,
                     char *err, size_t errsize) {
  jwt_verifier *v = NULL;
  pthread_condattr_t ca;
  char msg[512];
  key_set *s = NULL;
  int locks = 0, curl_on = 0;
  say(err, errsize, "%s", "");
  if (out)
    *out = NULL;
  if (!out || !source || !*source || !issuer || !*issuer || !audience ||
      !*audience || refresh_s < 0) {
    say(err, errsize,
        "JWKS: a source, an issuer and an audience are needed, and a "
        "refresh period of 0 or more seconds");
    return -1;
  }
  if (!(v = calloc(1, sizeof *v)))
    goto oom;
  v->is_url = strncasecmp(source, "http://", 7) == 0 ||
              strncasecmp(source, "https://", 8) == 0;
  v->refresh_s = refresh_s ? refresh_s : JWT_DEFAULT_REFRESH_S;
  atomic_init(&v->kid_asked, 0);
  atomic_init(&v->stopping, 0);
  if (!(v->source = dup_str(source)) || !(v->issuer = dup_str(issuer)) ||
      !(v->audience = dup_str(audience)) ||
      !(v->shown = shown_source(source, v->is_url)))
    goto oom;
  if (pthread_rwlock_init(&v->set_lock, NULL) != 0)
    goto oom;
  locks = 1;
  if (pthread_mutex_init(&v->mu, NULL) != 0)
    goto oom;
  locks = 2;
  if (pthread_condattr_init(&ca) != 0)
    goto oom;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (pthread_cond_init(&v->cv, &ca) != 0) {
    pthread_condattr_destroy(&ca);
    goto oom;
  }
  pthread_condattr_destroy(&ca);
  locks = 3;
  if (v->is_url) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      say(err, errsize, "JWKS %s: cannot start libcurl", v->shown);
      goto fail;
    }
    curl_on = 1;
  }
  if (load_set(v, &s, msg, sizeof msg) != 0) {
    say(err, errsize, "JWKS %s: %s", v->shown, msg);
    goto fail;
  }
  v->set = s;
  if (v->is_url) {
    if (pthread_create(&v->thread, NULL, refresher, v) != 0) {
      say(err, errsize, "JWKS %s: cannot start the refresh thread", v->shown);
      goto fail;
    }
    v->have_thread = 1;
  }
  *out = v;
  return 0;
oom:
  /* The source unshown: a URL's credentials stay out of messages. */
  say(err, errsize, "JWKS %s: out of memory",
      v && v->shown ? v->shown : "source");
fail:
  if (v) {
    set_free(v->set);
    if (curl_on)
      curl_global_cleanup();
    if (locks >= 3)
      pthread_cond_destroy(&v->cv);
    if (locks >= 2)
      pthread_mutex_destroy(&v->mu);
    if (locks >= 1)
      pthread_rwlock_destroy(&v->set_lock);
    free(v->source);
    free(v->shown);
    free(v->issuer);
    free(v->audience);
    free(v);
  }
  return -1;
}

void jwt_verifier_free(jwt_verifier *v) {
  if (!v)
    return;
  if (v->have_thread) {
    atomic_store(&v->stopping, 1);
    pthread_mutex_lock(&v->mu);
    v->stop = 1;
    pthread_cond_signal(&v->cv);
    pthread_mutex_unlock(&v->mu);
    pthread_join(v->thread, NULL);
  }
  set_release(v->set);
  if (v->is_url)
    curl_global_cleanup();
  pthread_cond_destroy(&v->cv);
  pthread_mutex_destroy(&v->mu);
  pthread_rwlock_destroy(&v->set_lock);
  free(v->source);
  free(v->shown);
  free(v->issuer);
  free(v->audience);
  free(v);
}

/* ---- verifying a token --------------------------------------------------- */

/* Why a key could not be chosen, for select_key(). */
typedef enum {
  SEL_OK,
  SEL_UNKNOWN_KID,
  SEL_TYPE,
  SEL_KEY_ALG,
  SEL_USE,
  SEL_NONE_FITS,
  SEL_AMBIGUOUS
} sel_result;

/* Whether key k may verify a signature made with alg; the reason if not. */
static sel_result key_fits(const jwt_key *k, jwt_alg alg) {
  if (k->type == KT_OTHER || k->type != alg_key_type(alg))
    return SEL_TYPE;
  if (k->alg && strcmp(k->alg, alg_names[alg]) != 0)
    return SEL_KEY_ALG;
  if (!k->for_sig)
    return SEL_USE;
  return SEL_OK;
}

/*
 * Chooses the key of s for a token with alg and kid (NULL: none). With a
 * kid, the key must carry it; without, exactly one key of the set may fit,
 * since trying each in turn would let a token pick among keys meant for
 * other uses.
 */
static sel_result select_key(const key_set *s, jwt_alg alg, const char *kid,
                             const jwt_key **out) {
  sel_result first = SEL_UNKNOWN_KID;
  size_t i, fits = 0;
  *out = NULL;
  for (i = 0; i < s->n; i++) {
    const jwt_key *k = &s->keys[i];
    sel_result r;
    if (kid && (!k->kid || strcmp(k->kid, kid) != 0))
      continue;
    r = key_fits(k, alg);
    if (r == SEL_OK) {
      if (kid)
        return *out = k, SEL_OK;
      if (fits++ == 0)
        *out = k;
    } else if (first == SEL_UNKNOWN_KID) {
      first = r;
    }
  }
  if (kid)
    return first;
  if (fits == 1)
    return SEL_OK;
  *out = NULL;
  return fits ? SEL_AMBIGUOUS : SEL_NONE_FITS;
}

/*
 * Checks sig over msg with key k under alg. JWS signatures of ES256 are
 * r and s as 32 bytes each (RFC 7518, section 3.4), where OpenSSL takes
 * an ECDSA-Sig-Value in DER; RSA signatures are as long as the modulus,
 * Ed25519 ones 64 bytes. Returns 1 if the signature verifies, else 0.
 */
static int check_signature(const jwt_key *k, jwt_alg alg,
                           const unsigned char *msg, size_t msglen,
                           const unsigned char *sig, size_t siglen) {
  EVP_MD_CTX *ctx = NULL;
  EVP_PKEY_CTX *pctx = NULL;
  ECDSA_SIG *es = NULL;
  BIGNUM *r = NULL, *s = NULL;
  unsigned char *der = NULL;
  const unsigned char *use = sig;
  size_t uselen = siglen;
  int ok = 0, derlen;
  switch (alg) {
  case ALG_RS256:
  case ALG_PS256:
    if (siglen != (size_t)EVP_PKEY_get_size(k->pkey))
      return 0;
    break;
  case ALG_ES256:
    if (siglen != 64)
      return 0;
    if (!(es = ECDSA_SIG_new()) || !(r = BN_bin2bn(sig, 32, NULL)) ||
        !(s = BN_bin2bn(sig + 32, 32, NULL)) || !ECDSA_SIG_set0(es, r, s))
      goto done;
    r = s = NULL; /* es owns them now */
    if ((derlen = i2d_ECDSA_SIG(es, &der)) <= 0)
      goto done;
    use = der;
    uselen = (size_t)derlen;
    break;
  case ALG_EDDSA:
    if (siglen != 64)
      return 0;
    break;
  }
  if (!(ctx = EVP_MD_CTX_new()) ||
      EVP_DigestVerifyInit(ctx, &pctx, alg == ALG_EDDSA ? NULL : EVP_sha256(),
                           NULL, k->pkey) != 1)
    goto done;
  if (alg == ALG_RS256 &&
      EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PADDING) != 1)
    goto done;
  /* PS256: MGF1 with SHA-256 and a salt as long as the digest (RFC 7518,
   * section 3.5). */
  if (alg == ALG_PS256 &&
      (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) != 1 ||
       EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) != 1 ||
       EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, EVP_sha256()) != 1))
    goto done;
  ok = EVP_DigestVerify(ctx, use, uselen, msg, msglen) == 1;
done:
  EVP_MD_CTX_free(ctx);
  ECDSA_SIG_free(es);
  BN_free(r);
  BN_free(s);
  OPENSSL_free(der);
  /* A failed verification leaves errors on this thread's queue, which
   * would otherwise turn up in an unrelated report later. */
  ERR_clear_error();
  return ok;
}

/* Decodes one part of the token as base64url JSON that must be an object.
 * Returns the object, or NULL with why set. */
static json_t *part_json(const char *s, size_t len, const char *part, char *why,
                         size_t n) {
  unsigned char *raw;
  size_t rawlen;
  json_error_t e;
  json_t *j;
  if (len == 0 || b64url_decode(s, len, &raw, &rawlen) != 0) {
    say(why, n, "malformed token: the %s is not base64url", part);
    return NULL;
  }
  j = json_loadb((const char *)raw, rawlen, JSON_REJECT_DUPLICATES, &e);
  free(raw);
  if (!j) {
    if (json_error_code(&e) == json_error_duplicate_key)
      say(why, n, "malformed token: the %s has a member twice", part);
    else
      say(why, n, "malformed token: the %s is not JSON", part);
    return NULL;
  }
  if (!json_is_object(j)) {
    say(why, n, "malformed token: the %s is not a JSON object", part);
    json_decref(j);
    return NULL;
  }
  return j;
}

/* Reads the NumericDate claim name: 1 with *t, 0 if absent, -1 with why set
 * if present but not a number. */
static int date_claim(json_t *payload, const char *name, double *t, char *why,
                      size_t n) {
  json_t *c = json_object_get(payload, name);
  if (!c)
    return 0;
  if (!json_is_number(c)) {
    say(why, n, "malformed token: its %s is not a number", name);
    return -1;
  }
  *t = json_number_value(c);
  return 1;
}

/* Whether aud (a string or an array of strings) holds audience; -1 with
 * why set if it is neither. */
static int aud_holds(json_t *aud, const char *audience, char *why, size_t n) {
  size_t i;
  json_t *a;
  if (json_is_string(aud))
    return strcmp(json_string_value(aud), audience) == 0;
  if (!json_is_array(aud)) {
    say(why, n, "audience: the token's aud is neither a string nor an array");
    return -1;
  }
  json_array_foreach(aud, i, a) {
    if (!json_is_string(a)) {
      say(why, n, "audience: the token's aud holds other than strings");
      return -1;
    }
    if (strcmp(json_string_value(a), audience) == 0)
      return 1;
  }
  return 0;
}

/* The claims, once the signature holds. Returns 0, or -1 with why set. */
static int check_claims(jwt_verifier *v, json_t *p, char *iss, size_t iss_size,
                        char *sub, size_t sub_size, char *why, size_t n) {
  const char *ti = json_string_value(json_object_get(p, "iss"));
  const char *ts = json_string_value(json_object_get(p, "sub"));
  json_t *aud = json_object_get(p, "aud");
  double now = (double)time(NULL), exp, nbf, iat;
  int r;
  if (!ti) {
    say(why, n, "issuer: the token has no iss");
    return -1;
  }
  if (strcmp(ti, v->issuer) != 0) {
    say(why, n, "issuer: the token's iss is not the issuer trusted here");
    return -1;
  }
  if (!aud) {
    say(why, n, "audience: the token has no aud");
    return -1;
  }
  if ((r = aud_holds(aud, v->audience, why, n)) <= 0) {
    if (r == 0)
      say(why, n, "audience: the token's aud does not name this service");
    return -1;
  }
  if ((r = date_claim(p, "exp", &exp, why, n)) < 0)
    return -1;
  if (r == 0) {
    say(why, n, "expired: the token has no exp, and tokens must expire");
    return -1;
  }
  if (now > exp + JWT_LEEWAY_S) {
    say(why, n, "expired: the token's exp has passed");
    return -1;
  }
  if ((r = date_claim(p, "nbf", &nbf, why, n)) < 0)
    return -1;
  if (r > 0 && nbf > now + JWT_LEEWAY_S) {
    say(why, n, "not yet valid: the token's nbf is in the future");
    return -1;
  }
  if ((r = date_claim(p, "iat", &iat, why, n)) < 0)
    return -1;
  if (r > 0 && iat > now + JWT_LEEWAY_S) {
    say(why, n, "not yet valid: the token's iat is in the future");
    return -1;
  }
  if (!ts || !*ts) {
    say(why, n, "subject: the token has no sub, or an empty one");
    return -1;
  }
  /* Cut claims could make two principals one: refuse what does not fit. */
  if (strlen(ti) >= iss_size) {
    say(why, n, "issuer: the token's iss is longer than %zu bytes",
        iss_size ? iss_size - 1 : 0);
    return -1;
  }
  if (strlen(ts) >= sub_size) {
    say(why, n, "subject: the token's sub is longer than %zu bytes",
        sub_size ? sub_size - 1 : 0);
    return -1;
  }
  memcpy(iss, ti, strlen(ti) + 1);
  memcpy(sub, ts, strlen(ts) + 1);
  return 0;
}

/* The header's alg as one of ours; -1 with why set for any other. */
static int header_alg(json_t *h, jwt_alg *alg, char *why, size_t n) {
  const char *a = json_string_value(json_object_get(h, "alg"));
  size_t i;
  if (!a) {
    say(why, n, "malformed token: the header has no alg");
    return -1;
  }
  for (i = 0; i < sizeof alg_names / sizeof alg_names[0]; i++)
    if (strcmp(a, alg_names[i]) == 0) {
      *alg = (jwt_alg)i;
      return 0;
    }
  if (strcmp(a, "none") == 0)
    say(why, n, "algorithm: \"none\" is refused, tokens must be signed");
  else if (strcmp(a, "HS256") == 0 || strcmp(a, "HS384") == 0 ||
           strcmp(a, "HS512") == 0)
    say(why, n,
        "algorithm: %s is refused, tokens must be signed with a "
        "public key (RS256, PS256, ES256 or EdDSA)",
        a);
  else
    say(why, n, "algorithm: not one of RS256, PS256, ES256 or EdDSA");
  return -1;
}

int jwt_verify(jwt_verifier *v, const char *token, char *iss, size_t iss_size,
               char *sub, size_t sub_size, char *why, size_t why_size) {
  const char *d1, *d2;
  size_t tlen;
  json_t *h = NULL, *p = NULL, *kidj;
  unsigned char *sig = NULL;
  size_t siglen;
  key_set *s = NULL;
  const jwt_key *k;
  jwt_alg alg = ALG_RS256;
  int rc = -1;
  say(why, why_size, "%s", "");
  if (iss && iss_size)
    iss[0] = 0;
  if (sub && sub_size)
    sub[0] = 0;
  if (!v || !token || !iss || !sub || !iss_size || !sub_size) {
    say(why, why_size, "malformed token: none was given");
    return -1;
  }
  tlen = strnlen(token, JWT_MAX_TOKEN + 1);
  if (tlen > JWT_MAX_TOKEN) {
    say(why, why_size, "malformed token: larger than %d bytes", JWT_MAX_TOKEN);
    return -1;
  }
  d1 = memchr(token, '.', tlen);
  d2 = d1 ? memchr(d1 + 1, '.', tlen - (size_t)(d1 + 1 - token)) : NULL;
  if (!d2 || memchr(d2 + 1, '.', tlen - (size_t)(d2 + 1 - token))) {
    say(why, why_size,
        "malformed token: not three base64url parts joined by dots");
    return -1;
  }
  if (!(h = part_json(token, (size_t)(d1 - token), "header", why, why_size)))
    goto done;
  if (header_alg(h, &alg, why, why_size) != 0)
    goto done;
  /* RFC 7515, 4.1.11: extensions named critical must be understood, and
   * this verifier understands none. */
  if (json_object_get(h, "crit")) {
    say(why, why_size,
        "malformed token: the header names critical extensions (crit)");
    goto done;
  }
  kidj = json_object_get(h, "kid");
  if (kidj && !json_is_string(kidj)) {
    say(why, why_size, "malformed token: the header's kid is not a string");
    goto done;
  }
  if (b64url_decode(d2 + 1, tlen - (size_t)(d2 + 1 - token), &sig, &siglen) !=
          0 ||
      siglen == 0) {
    say(why, why_size, "malformed token: the signature is not base64url");
    goto done;
  }
  s = set_acquire(v);
  switch (select_key(s, alg, json_string_value(kidj), &k)) {
  case SEL_OK:
    break;
  case SEL_UNKNOWN_KID:
    ask_refresh(v);
    say(why, why_size, "unknown key id: no key of the set has the token's kid");
    goto done;
  case SEL_TYPE:
    say(why, why_size, "algorithm: the key named by kid is not a key for %s",
        alg_names[alg]);
    goto done;
  case SEL_KEY_ALG:
    say(why, why_size,
        "algorithm: the key named by kid is for another "
        "algorithm than %s",
        alg_names[alg]);
    goto done;
  case SEL_USE:
    say(why, why_size, "algorithm: the key named by kid is not for signatures");
    goto done;
  case SEL_NONE_FITS:
    say(why, why_size,
        "unknown key id: the token has no kid and no key of "
        "the set is for %s",
        alg_names[alg]);
    goto done;
  case SEL_AMBIGUOUS:
    say(why, why_size,
        "unknown key id: the token has no kid and several "
        "keys of the set are for %s",
        alg_names[alg]);
    goto done;
  }
  /* The signing input is the first two parts as sent (RFC 7515, 5.2). */
  if (!check_signature(k, alg, (const unsigned char *)token,
                       (size_t)(d2 - token), sig, siglen)) {
    say(why, why_size, "signature: the token's signature does not verify");
    goto done;
  }
  if (!(p = part_json(d1 + 1, (size_t)(d2 - d1 - 1), "payload", why, why_size)))
    goto done;
  rc = check_claims(v, p, iss, iss_size, sub, sub_size, why, why_size);
done:
  set_release(s);
  free(sig);
  json_decref(h);
  json_decref(p);
  return rc;
}
