/*
 * test_jwt.c -- the JWT verifier of --principal jwt (src/serve/jwt.c). The
 * file is included, so that its strict base64url decoder can be tested on
 * its own and no library of the program's own is needed.
 *
 * The test makes throwaway keys with OpenSSL (RSA 2048, EC P-256, Ed25519),
 * writes a JWKS file, signs tokens itself, and checks each rejection by the
 * check its message names. A key set served over HTTP by a small server of
 * the test's own (a thread with a socket) is rotated, broken and mended,
 * with many threads verifying meanwhile (the test is run under TSan too).
 *
 * Run as `test_jwt --node TOOL`, it checks instead that the tokens signed by
 * TOOL (tests/serve/jwt_tool.mjs, the signer the shell and node tests use)
 * verify here, and that its forgeries do not.
 */
#include "../src/serve/jwt.c"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#define ISS "https://issuer.example"
#define AUD "idem-gateway"

/* ---- tokens -------------------------------------------------------------- */

static char *b64url(const unsigned char *p, size_t n) {
  static const char a[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  char *out = malloc(n / 3 * 4 + 4), *o = out;
  size_t i;
  assert_non_null(out);
  for (i = 0; i + 2 < n; i += 3) {
    uint32_t w = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *o++ = a[w >> 18];
    *o++ = a[(w >> 12) & 63];
    *o++ = a[(w >> 6) & 63];
    *o++ = a[w & 63];
  }
  if (n - i == 1) {
    *o++ = a[p[i] >> 2];
    *o++ = a[(p[i] & 3) << 4];
  } else if (n - i == 2) {
    uint32_t w = (uint32_t)p[i] << 8 | p[i + 1];
    *o++ = a[w >> 10];
    *o++ = a[(w >> 4) & 63];
    *o++ = a[(w & 15) << 2];
  }
  *o = 0;
  return out;
}

static char *b64url_str(const char *s) {
  return b64url((const unsigned char *)s, strlen(s));
}

/* The PEM of k's public key: the HMAC secret of the confusion attack. */
static char *public_pem(EVP_PKEY *k) {
  BIO *b = BIO_new(BIO_s_mem());
  char *data, *out;
  long n;
  assert_int_equal(PEM_write_bio_PUBKEY(b, k), 1);
  n = BIO_get_mem_data(b, &data);
  out = strndup(data, (size_t)n);
  BIO_free(b);
  return out;
}

/* Signs in with k the way JWS alg does; returns the signature's length. */
static size_t sign_raw(EVP_PKEY *k, const char *alg, const char *in,
                       unsigned char *out) {
  EVP_MD_CTX *c;
  EVP_PKEY_CTX *pc = NULL;
  size_t len = 1024;
  if (strcmp(alg, "HS256") == 0) {
    char *pem = public_pem(k);
    unsigned int hl = 0;
    assert_non_null(HMAC(EVP_sha256(), pem, (int)strlen(pem),
                         (const unsigned char *)in, strlen(in), out, &hl));
    free(pem);
    return hl;
  }
  assert_non_null(c = EVP_MD_CTX_new());
  assert_int_equal(
      EVP_DigestSignInit(
          c, &pc, strcmp(alg, "EdDSA") == 0 ? NULL : EVP_sha256(), NULL, k),
      1);
  if (strcmp(alg, "PS256") == 0) {
    assert_int_equal(EVP_PKEY_CTX_set_rsa_padding(pc, RSA_PKCS1_PSS_PADDING),
                     1);
    assert_int_equal(
        EVP_PKEY_CTX_set_rsa_pss_saltlen(pc, RSA_PSS_SALTLEN_DIGEST), 1);
  }
  assert_int_equal(
      EVP_DigestSign(c, out, &len, (const unsigned char *)in, strlen(in)), 1);
  EVP_MD_CTX_free(c);
  if (strcmp(alg, "ES256") == 0) {
    const unsigned char *p = out;
    const BIGNUM *r, *s;
    ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)len);
    assert_non_null(es);
    ECDSA_SIG_get0(es, &r, &s);
    assert_int_equal(BN_bn2binpad(r, out, 32), 32);
    assert_int_equal(BN_bn2binpad(s, out + 32, 32), 32);
    ECDSA_SIG_free(es);
    len = 64;
  }
  return len;
}

/* A compact JWS of the header and payload texts as given (so that they may
 * be malformed), signed with k as alg says. */
static char *token_of(const char *header, const char *payload, EVP_PKEY *k,
                      const char *alg) {
  char *h = b64url_str(header), *p = b64url_str(payload), *sig, *out;
  size_t in_len = strlen(h) + strlen(p) + 2;
  char *in = malloc(in_len);
  unsigned char raw[1024];
  size_t n;
  snprintf(in, in_len, "%s.%s", h, p);
  n = sign_raw(k, alg, in, raw);
  sig = b64url(raw, n);
  out = malloc(in_len + strlen(sig) + 1);
  sprintf(out, "%s.%s", in, sig);
  free(h);
  free(p);
  free(in);
  free(sig);
  return out;
}

/* The usual claims, valid for five minutes, with extra members added. */
static char *claims(const char *extra) {
  size_t size = 256 + (extra ? strlen(extra) : 0);
  char *out = malloc(size);
  snprintf(out, size,
           "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":\"" AUD
           "\",\"exp\":%lld%s%s}",
           (long long)time(NULL) + 300, extra ? "," : "", extra ? extra : "");
  return out;
}

/* A token with a header of alg and kid (NULL: none) over payload. */
static char *token(EVP_PKEY *k, const char *alg, const char *kid,
                   const char *payload) {
  char header[256], *t;
  if (kid)
    snprintf(header, sizeof header,
             "{\"alg\":\"%s\",\"typ\":\"JWT\",\"kid\":\"%s\"}", alg, kid);
  else
    snprintf(header, sizeof header, "{\"alg\":\"%s\",\"typ\":\"JWT\"}", alg);
  t = token_of(header, payload, k, alg);
  return t;
}

/* ---- keys and key sets ----------------------------------------------------
 */

static EVP_PKEY *rsa, *rsa_other, *ec, *ed, *ed_b, *ed_c;
static char dir[64];
static char jwks_path[128];
static jwt_verifier *vf; /* the verifier of the file set */

static char *bn_b64(const BIGNUM *bn, int pad) {
  unsigned char buf[1024];
  int n = pad ? BN_bn2binpad(bn, buf, pad) : BN_bn2bin(bn, buf);
  assert_true(n > 0);
  return b64url(buf, (size_t)n);
}

/* The public JWK of k, with kid and the members in more (if any). */
static char *jwk(EVP_PKEY *k, const char *kid, const char *more) {
  char *out = malloc(2048), *a = NULL, *b = NULL;
  const char *tail = more ? more : "";
  if (EVP_PKEY_is_a(k, "RSA")) {
    BIGNUM *n = NULL, *e = NULL;
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_RSA_N, &n), 1);
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_RSA_E, &e), 1);
    a = bn_b64(n, 0);
    b = bn_b64(e, 0);
    snprintf(out, 2048,
             "{\"kty\":\"RSA\",\"kid\":\"%s\",\"n\":\"%s\",\"e\":\"%s\"%s}",
             kid, a, b, tail);
    BN_free(n);
    BN_free(e);
  } else if (EVP_PKEY_is_a(k, "EC")) {
    BIGNUM *x = NULL, *y = NULL;
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_EC_PUB_X, &x), 1);
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_EC_PUB_Y, &y), 1);
    a = bn_b64(x, 32);
    b = bn_b64(y, 32);
    snprintf(out, 2048,
             "{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"%s\",\"x\":\"%s\","
             "\"y\":\"%s\"%s}",
             kid, a, b, tail);
    BN_free(x);
    BN_free(y);
  } else {
    unsigned char raw[32];
    size_t n = sizeof raw;
    assert_int_equal(EVP_PKEY_get_raw_public_key(k, raw, &n), 1);
    a = b64url(raw, n);
    snprintf(
        out, 2048,
        "{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"kid\":\"%s\",\"x\":\"%s\"%s}",
        kid, a, tail);
  }
  free(a);
  free(b);
  return out;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fputs(text, f) >= 0, 1);
  assert_int_equal(fclose(f), 0);
}

/* The file set: rsa1 (RS256 only), rsa2 (the same key, any RSA algorithm),
 * ec1, ed1, enc1 (for encryption) and x1 (X25519, which no JWS uses). */
static char *file_set(void) {
  char *k[5], *out = malloc(16384);
  k[0] = jwk(rsa, "rsa1", ",\"alg\":\"RS256\",\"use\":\"sig\"");
  k[1] = jwk(rsa, "rsa2", NULL);
  k[2] = jwk(ec, "ec1", ",\"alg\":\"ES256\"");
  k[3] = jwk(ed, "ed1", ",\"alg\":\"EdDSA\"");
  k[4] = jwk(rsa, "enc1", ",\"use\":\"enc\"");
  snprintf(
      out, 16384,
      "{\"keys\":[%s,%s,%s,%s,%s,{\"kty\":\"OKP\",\"crv\":\"X25519\","
      "\"kid\":\"x1\",\"x\":\"hSDwCYkwp1R0i33ctD73Wg2_Og0mOBr066SpjqqbTmo\""
      "}]}",
      k[0], k[1], k[2], k[3], k[4]);
  for (int i = 0; i < 5; i++)
    free(k[i]);
  return out;
}

static int setup(void **state) {
  char err[512], *set;
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/idem-test-jwt-XXXXXX");
  if (!mkdtemp(dir))
    return -1;
  rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
  rsa_other = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048);
  ec = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  ed = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  ed_b = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  ed_c = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  if (!rsa || !rsa_other || !ec || !ed || !ed_b || !ed_c)
    return -1;
  snprintf(jwks_path, sizeof jwks_path, "%s/jwks.json", dir);
  set = file_set();
  write_file(jwks_path, set);
  free(set);
  if (jwt_verifier_new(jwks_path, ISS, AUD, 0, &vf, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  char cmd[128];
  (void)state;
  jwt_verifier_free(vf);
  EVP_PKEY_free(rsa);
  EVP_PKEY_free(rsa_other);
  EVP_PKEY_free(ec);
  EVP_PKEY_free(ed);
  EVP_PKEY_free(ed_b);
  EVP_PKEY_free(ed_c);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* ---- checks ----------------------------------------------------------------
 */

/* Asserts that t verifies with v as sub "user-42" of ISS; frees t. */
static void ok_with(jwt_verifier *v, char *t) {
  char iss[256], sub[256], why[256];
  if (jwt_verify(v, t, iss, sizeof iss, sub, sizeof sub, why, sizeof why) != 0)
    fail_msg("refused: %s", why);
  assert_string_equal(iss, ISS);
  assert_string_equal(sub, "user-42");
  free(t);
}

static void ok(char *t) { ok_with(vf, t); }

/* Asserts that t is refused with a why that holds want, and that iss and
 * sub are left empty; frees t. */
static void refused_with(jwt_verifier *v, char *t, const char *want) {
  char iss[256] = "x", sub[256] = "x", why[256] = "";
  if (jwt_verify(v, t, iss, sizeof iss, sub, sizeof sub, why, sizeof why) == 0)
    fail_msg("accepted, where \"%s\" was expected", want);
  if (!strstr(why, want))
    fail_msg("refused with \"%s\", where \"%s\" was expected", why, want);
  assert_string_equal(iss, "");
  assert_string_equal(sub, "");
  free(t);
}

static void refused(char *t, const char *want) { refused_with(vf, t, want); }

/* A token's part i (0 header, 1 payload, 2 signature) replaced by s. */
static char *with_part(const char *t, int i, const char *s) {
  const char *d1 = strchr(t, '.'), *d2 = strchr(d1 + 1, '.');
  char *out = malloc(strlen(t) + strlen(s) + 1);
  if (i == 0)
    sprintf(out, "%s%s", s, d1);
  else if (i == 1)
    sprintf(out, "%.*s%s%s", (int)(d1 - t + 1), t, s, d2);
  else
    sprintf(out, "%.*s%s", (int)(d2 - t + 1), t, s);
  return out;
}

/* ---- valid tokens ----------------------------------------------------------
 */

static void test_each_algorithm(void **state) {
  char *c = claims(NULL);
  (void)state;
  ok(token(rsa, "RS256", "rsa1", c));
  ok(token(rsa, "PS256", "rsa2", c));
  ok(token(rsa, "RS256", "rsa2", c));
  ok(token(ec, "ES256", "ec1", c));
  ok(token(ed, "EdDSA", "ed1", c));
  /* Without kid, a key is chosen when it is the only one that fits. */
  ok(token(ec, "ES256", NULL, c));
  ok(token(ed, "EdDSA", NULL, c));
  refused(token(rsa, "RS256", NULL, c),
          "unknown key id: the token has no kid and several keys");
  free(c);
}

static void test_valid_claims(void **state) {
  char extra[512], *c;
  long long now = (long long)time(NULL);
  (void)state;
  /* aud as an array; nbf and iat in the past; iat a little ahead (within
   * the leeway). */
  snprintf(extra, sizeof extra,
           "\"nbf\":%lld,\"iat\":%lld,\"jti\":\"x\",\"scope\":[1,{}]", now - 10,
           now + 30);
  c = claims(extra);
  ok(token(ed, "EdDSA", "ed1", c));
  free(c);
  snprintf(extra, 512,
           "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":[\"other\",\"" AUD
           "\"],\"exp\":%lld}",
           now + 300);
  ok(token(ed, "EdDSA", "ed1", extra));
  /* Expired 30 s ago, within the 60 s leeway; nbf 30 s ahead. */
  snprintf(extra, sizeof extra,
           "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":\"" AUD
           "\",\"exp\":%lld,\"nbf\":%lld}",
           now - 30, now + 30);
  ok(token(ed, "EdDSA", "ed1", extra));
  /* A real-valued exp is a NumericDate too. */
  snprintf(extra, sizeof extra,
           "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":\"" AUD
           "\",\"exp\":%lld.5}",
           now + 300);
  ok(token(ec, "ES256", "ec1", extra));
}

/* ---- forged tokens ---------------------------------------------------------
 */

static void test_forged(void **state) {
  char *c = claims(NULL), *t, *u, *sig;
  unsigned char *raw;
  size_t n;
  const char *algs[][3] = {{"RS256", "rsa1", NULL},
                           {"PS256", "rsa2", NULL},
                           {"ES256", "ec1", NULL},
                           {"EdDSA", "ed1", NULL}};
  EVP_PKEY *keys[] = {rsa, rsa, ec, ed};
  (void)state;
  for (size_t i = 0; i < 4; i++) {
    /* One byte of the signature flipped. */
    t = token(keys[i], algs[i][0], algs[i][1], c);
    assert_int_equal(b64url_decode(strrchr(t, '.') + 1,
                                   strlen(strrchr(t, '.') + 1), &raw, &n),
                     0);
    raw[n / 2] ^= 0x01;
    sig = b64url(raw, n);
    refused(with_part(t, 2, sig), "signature: ");
    free(sig);
    /* The signature cut short by a byte, or made longer. */
    sig = b64url(raw, n - 1);
    refused(with_part(t, 2, sig), "signature: ");
    free(sig);
    raw[n / 2] ^= 0x01;
    {
      unsigned char longer[1024];
      memcpy(longer, raw, n);
      longer[n] = 0;
      sig = b64url(longer, n + 1);
      refused(with_part(t, 2, sig), "signature: ");
      free(sig);
    }
    free(raw);
    /* The payload changed after signing. */
    u = b64url_str("{\"iss\":\"" ISS "\",\"sub\":\"admin\",\"aud\":\"" AUD
                   "\",\"exp\":9999999999}");
    refused(with_part(t, 1, u), "signature: ");
    free(u);
    /* The header changed after signing (kid alone, same key). */
    if (strcmp(algs[i][0], "RS256") == 0) {
      u = b64url_str("{\"alg\":\"RS256\",\"kid\":\"rsa2\"}");
      refused(with_part(t, 0, u), "signature: ");
      free(u);
    }
    free(t);
  }
  /* Signed by another key under a kid of the set. */
  refused(token(rsa_other, "RS256", "rsa1", c), "signature: ");
  refused(token(ed_b, "EdDSA", "ed1", c), "signature: ");
  refused(token(ed_b, "EdDSA", NULL, c), "signature: ");
  /* An ES256 signature in DER, as OpenSSL makes it, is not a JWS one. */
  {
    char *h = b64url_str("{\"alg\":\"ES256\",\"kid\":\"ec1\"}");
    char *p = b64url_str(c), in[1024];
    unsigned char der[128];
    size_t len = sizeof der;
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    snprintf(in, sizeof in, "%s.%s", h, p);
    assert_int_equal(EVP_DigestSignInit(m, NULL, EVP_sha256(), NULL, ec), 1);
    assert_int_equal(
        EVP_DigestSign(m, der, &len, (unsigned char *)in, strlen(in)), 1);
    EVP_MD_CTX_free(m);
    sig = b64url(der, len);
    t = malloc(strlen(in) + strlen(sig) + 2);
    sprintf(t, "%s.%s", in, sig);
    refused(t, "signature: ");
    free(sig);
    free(h);
    free(p);
  }
  /* An ES256 signature of r = s = 0, which must never verify. */
  t = token(ec, "ES256", "ec1", c);
  {
    unsigned char zero[64] = {0};
    sig = b64url(zero, sizeof zero);
    refused(with_part(t, 2, sig), "signature: ");
    free(sig);
  }
  free(t);
  free(c);
}

/* ---- claims ----------------------------------------------------------------
 */

static char *payload_f(const char *fmt, long long a, long long b) {
  char *out = malloc(512);
  snprintf(out, 512, fmt, a, b);
  return out;
}

static void refused_claims(const char *fmt, long long a, long long b,
                           const char *want) {
  char *p = payload_f(fmt, a, b);
  refused(token(ed, "EdDSA", "ed1", p), want);
  free(p);
}

static void test_claims(void **state) {
  long long now = (long long)time(NULL), later = now + 300;
  (void)state;
  refused_claims("{\"iss\":\"https://evil.example\",\"sub\":\"u\",\"aud\":"
                 "\"" AUD "\",\"exp\":%lld}",
                 later, 0, "issuer: ");
  /* The issuer compared exactly: no prefix, no trailing slash. */
  refused_claims("{\"iss\":\"" ISS "/\",\"sub\":\"u\",\"aud\":"
                 "\"" AUD "\",\"exp\":%lld}",
                 later, 0, "issuer: ");
  refused_claims("{\"iss\":\"https://issuer.exampl\",\"sub\":\"u\",\"aud\":"
                 "\"" AUD "\",\"exp\":%lld}",
                 later, 0, "issuer: ");
  refused_claims("{\"sub\":\"u\",\"aud\":\"" AUD "\",\"exp\":%lld}", later, 0,
                 "issuer: the token has no iss");
  refused_claims("{\"iss\":7,\"sub\":\"u\",\"aud\":\"" AUD "\",\"exp\":%lld}",
                 later, 0, "issuer: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"other\","
                 "\"exp\":%lld}",
                 later, 0, "audience: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":[\"other\","
                 "\"" AUD "x\"],\"exp\":%lld}",
                 later, 0, "audience: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":[],"
                 "\"exp\":%lld}",
                 later, 0, "audience: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":[7,\"" AUD "\"],"
                 "\"exp\":%lld}",
                 later, 0, "audience: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"exp\":%lld}", later, 0,
                 "audience: the token has no aud");
  /* Expired beyond the leeway. */
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\","
                 "\"exp\":%lld}",
                 now - 120, 0, "expired: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\"}", 0,
                 0, "expired: the token has no exp");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\","
                 "\"exp\":\"%lld\"}",
                 later, 0, "malformed token: its exp is not a number");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\","
                 "\"exp\":%lld,\"nbf\":%lld}",
                 later, now + 120, "not yet valid: the token's nbf");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\","
                 "\"exp\":%lld,\"iat\":%lld}",
                 later, now + 120, "not yet valid: the token's iat");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"u\",\"aud\":\"" AUD "\","
                 "\"exp\":%lld,\"nbf\":null}",
                 later, 0, "malformed token: its nbf");
  refused_claims("{\"iss\":\"" ISS "\",\"aud\":\"" AUD "\",\"exp\":%lld}",
                 later, 0, "subject: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":\"\",\"aud\":\"" AUD "\","
                 "\"exp\":%lld}",
                 later, 0, "subject: ");
  refused_claims("{\"iss\":\"" ISS "\",\"sub\":42,\"aud\":\"" AUD "\","
                 "\"exp\":%lld}",
                 later, 0, "subject: ");
}

/* A claim too long for the caller's buffer fails the token, never cut. */
static void test_claims_fit(void **state) {
  char iss[64], sub[8], why[128];
  char *c = claims(NULL), *t = token(ed, "EdDSA", "ed1", c);
  (void)state;
  assert_int_equal(jwt_verify(vf, t, iss, sizeof iss, sub, 7, why, sizeof why),
                   -1);
  assert_non_null(strstr(why, "subject: the token's sub is longer than 6"));
  assert_string_equal(sub, "");
  assert_int_equal(jwt_verify(vf, t, iss, 22, sub, 8, why, sizeof why), -1);
  assert_non_null(strstr(why, "issuer: "));
  /* Exactly fitting: "user-42" and its NUL in 8 bytes. */
  assert_int_equal(jwt_verify(vf, t, iss, 23, sub, 8, why, sizeof why), 0);
  assert_string_equal(sub, "user-42");
  /* A why buffer of 10 bytes gets a cut, terminated message. */
  assert_int_equal(jwt_verify(vf, "x.y", iss, 23, sub, 8, why, 10), -1);
  assert_int_equal(strlen(why), 9);
  free(t);
  free(c);
}

/* ---- algorithms and keys ----------------------------------------------- */

static void test_algorithms(void **state) {
  char *c = claims(NULL), *t, *h, *p;
  (void)state;
  /* alg none, with and without a signature. */
  h = b64url_str("{\"alg\":\"none\",\"typ\":\"JWT\"}");
  p = b64url_str(c);
  t = malloc(strlen(h) + strlen(p) + 8);
  sprintf(t, "%s.%s.", h, p);
  refused(t, "algorithm: \"none\" is refused");
  t = malloc(strlen(h) + strlen(p) + 8);
  sprintf(t, "%s.%s.AAAA", h, p);
  refused(t, "algorithm: \"none\" is refused");
  free(h);
  h = b64url_str("{\"alg\":\"None\",\"kid\":\"rsa1\"}");
  t = malloc(strlen(h) + strlen(p) + 8);
  sprintf(t, "%s.%s.", h, p);
  refused(t, "algorithm: not one of");
  free(h);
  free(p);
  /* The confusion attack: HS256 keyed with the RSA public key's PEM, with
   * and without naming the RSA key. */
  refused(token(rsa, "HS256", "rsa1", c), "algorithm: HS256 is refused");
  refused(token(rsa, "HS256", "rsa2", c), "algorithm: HS256 is refused");
  refused(token(rsa, "HS256", NULL, c), "algorithm: HS256 is refused");
  /* Algorithms of the JWA this verifier does not take. */
  refused(token_of("{\"alg\":\"RS512\",\"kid\":\"rsa2\"}", c, rsa, "RS256"),
          "algorithm: not one of");
  refused(token_of("{\"alg\":\"ES384\"}", c, ec, "ES256"),
          "algorithm: not one of");
  refused(token_of("{\"alg\":\"rs256\",\"kid\":\"rsa2\"}", c, rsa, "RS256"),
          "algorithm: not one of");
  refused(token_of("{\"alg\":[\"RS256\"],\"kid\":\"rsa2\"}", c, rsa, "RS256"),
          "malformed token: the header has no alg");
  refused(token_of("{\"kid\":\"rsa2\"}", c, rsa, "RS256"),
          "malformed token: the header has no alg");
  /* A kid that names a key of another type than the algorithm needs. */
  refused(token(ec, "ES256", "rsa1", c),
          "algorithm: the key named by kid is not a key for ES256");
  refused(token(rsa, "RS256", "ec1", c),
          "algorithm: the key named by kid is not a key for RS256");
  refused(token(ed, "EdDSA", "ec1", c),
          "algorithm: the key named by kid is not a key for EdDSA");
  refused(token(ed, "EdDSA", "x1", c),
          "algorithm: the key named by kid is not a key for EdDSA");
  /* A key whose own alg is another; a key for encryption. */
  refused(token(rsa, "PS256", "rsa1", c),
          "algorithm: the key named by kid is for another algorithm");
  refused(token(rsa, "RS256", "enc1", c),
          "algorithm: the key named by kid is not for signatures");
  /* Unknown key ids, of each kind; no key for EdDSA without kid here is
   * tried in test_http_rotation. */
  refused(token(rsa, "RS256", "rsa3", c), "unknown key id: ");
  refused(token(rsa, "RS256", "", c), "unknown key id: ");
  refused(token(rsa, "RS256", "RSA1", c), "unknown key id: ");
  /* Extensions named critical are not understood. */
  refused(token_of("{\"alg\":\"EdDSA\",\"kid\":\"ed1\",\"crit\":[\"b64\"],"
                   "\"b64\":false}",
                   c, ed, "EdDSA"),
          "malformed token: the header names critical extensions");
  /* A key in the header is never trusted. */
  {
    char hdr[2048], *k = jwk(ed_b, "ed1", NULL);
    snprintf(hdr, sizeof hdr, "{\"alg\":\"EdDSA\",\"kid\":\"ed1\",\"jwk\":%s}",
             k);
    refused(token_of(hdr, c, ed_b, "EdDSA"), "signature: ");
    free(k);
  }
  free(c);
}

/* ---- malformed tokens ------------------------------------------------------
 */

static void test_malformed(void **state) {
  char *c = claims(NULL), *t, *big;
  char hdr_dup[] = "{\"alg\":\"EdDSA\",\"kid\":\"ed1\",\"alg\":\"EdDSA\"}";
  (void)state;
  refused(strdup(""), "malformed token: not three");
  refused(strdup("abc"), "malformed token: not three");
  refused(strdup("a.b"), "malformed token: not three");
  refused(strdup("a.b.c.d"), "malformed token: not three");
  refused(strdup("..."), "malformed token: not three");
  refused(strdup(".."), "malformed token: the header is not base64url");
  t = token(ed, "EdDSA", "ed1", c);
  /* Base64url that is not: other alphabets, padding, a lone character,
   * bits left over in the last character. */
  refused(with_part(t, 0, "eyJhbGciOiJFZERTQSJ9="),
          "malformed token: the header is not base64url");
  refused(with_part(t, 0, "eyJhbGciOiJFZERTQSJ+"),
          "malformed token: the header is not base64url");
  refused(with_part(t, 0, "eyJhbGciOiJFZERTQSJ"),
          "malformed token: the header is not base64url");
  refused(with_part(t, 0, "eyJhbGci OiJFZERTQSJ"),
          "malformed token: the header is not base64url");
  /* "e30" is {}; "e31" would decode to it too, but for bits left over. */
  refused(with_part(t, 0, "e30"), "malformed token: the header has no alg");
  refused(with_part(t, 0, "e31"),
          "malformed token: the header is not base64url");
  {
    char *s = strdup(strrchr(t, '.') + 1);
    s[3] = '/';
    refused(with_part(t, 2, s), "malformed token: the signature is not");
    free(s);
  }
  refused(with_part(t, 2, ""), "malformed token: the signature is not");
  {
    char *h = b64url_str("{\"alg\":\"EdDSA\",");
    refused(with_part(t, 0, h), "malformed token: the header is not JSON");
    free(h);
    h = b64url_str("[\"EdDSA\"]");
    refused(with_part(t, 0, h), "malformed token: the header is not a JSON");
    free(h);
    h = b64url_str("\"EdDSA\"");
    refused(with_part(t, 0, h), "malformed token: the header is not");
    free(h);
    h = b64url_str("{\"alg\":\"EdDSA\",\"kid\":7}");
    refused(with_part(t, 0, h), "malformed token: the header's kid");
    free(h);
    /* Invalid UTF-8 and a NUL in the header's JSON. */
    h = b64url_str("{\"alg\":\"Ed\xffSA\"}");
    refused(with_part(t, 0, h), "malformed token: the header is not JSON");
    free(h);
    h = b64url((const unsigned char *)"{\"alg\":\"EdDSA\"}\0", 16);
    refused(with_part(t, 0, h), "malformed token: the header is not JSON");
    free(h);
  }
  free(t);
  /* Duplicate members, in the header and (properly signed) the payload. */
  refused(token_of(hdr_dup, c, ed, "EdDSA"),
          "malformed token: the header has a member twice");
  {
    char p[512];
    snprintf(p, sizeof p,
             "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":\"" AUD
             "\",\"exp\":%lld,\"sub\":\"admin\"}",
             (long long)time(NULL) + 300);
    refused(token(ed, "EdDSA", "ed1", p),
            "malformed token: the payload has a member twice");
    refused(token(ed, "EdDSA", "ed1", "not json"),
            "malformed token: the payload is not JSON");
    refused(token(ed, "EdDSA", "ed1", "[1]"),
            "malformed token: the payload is not a JSON object");
    refused(token(ed, "EdDSA", "ed1", "{\"sub\":\"\\u0000\"}"),
            "malformed token: the payload is not JSON");
  }
  /* A payload part that is not base64url, under a good signature. */
  {
    const char *in = "eyJhbGciOiJFZERTQSIsImtpZCI6ImVkMSJ9.e30=";
    unsigned char raw[128];
    size_t n = sign_raw(ed, "EdDSA", in, raw);
    char *sig = b64url(raw, n);
    t = malloc(strlen(in) + strlen(sig) + 2);
    sprintf(t, "%s.%s", in, sig);
    refused(t, "malformed token: the payload is not base64url");
    free(sig);
  }
  /* Size: a token of JWT_MAX_TOKEN bytes verifies, one of a byte more is
   * refused before any parsing. A pad claim takes the token up to the
   * size; two headers of different lengths reach the lengths that base64
   * skips (4k + 1 characters) with one of them. */
  {
    int at_max = 0, over = 0;
    for (size_t pad = 12000; pad < 12400 && !(at_max && over); pad++) {
      char *padded = malloc(pad + 600), *x = malloc(pad + 1);
      memset(x, 'p', pad);
      x[pad] = 0;
      snprintf(padded, pad + 600,
               "{\"iss\":\"" ISS "\",\"sub\":\"user-42\",\"aud\":\"" AUD
               "\",\"exp\":%lld,\"pad\":\"%s\"}",
               (long long)time(NULL) + 300, x);
      for (int typ = 0; typ < 2; typ++) {
        t = token_of(typ ? "{\"alg\":\"EdDSA\",\"kid\":\"ed1\",\"typ\":\"J\"}"
                         : "{\"alg\":\"EdDSA\",\"kid\":\"ed1\"}",
                     padded, ed, "EdDSA");
        if (strlen(t) == JWT_MAX_TOKEN && !at_max) {
          at_max = 1;
          ok(t);
        } else if (strlen(t) == JWT_MAX_TOKEN + 1 && !over) {
          over = 1;
          refused(t, "malformed token: larger than 16384 bytes");
        } else {
          free(t);
        }
      }
      free(padded);
      free(x);
    }
    assert_true(at_max);
    assert_true(over);
  }
  big = malloc(1 << 20);
  memset(big, 'A', (1 << 20) - 1);
  big[(1 << 20) - 1] = 0;
  refused(big, "malformed token: larger than");
  free(c);
}

static void test_null_arguments(void **state) {
  char iss[64], sub[64], why[128];
  (void)state;
  assert_int_equal(
      jwt_verify(vf, NULL, iss, sizeof iss, sub, sizeof sub, why, sizeof why),
      -1);
  assert_non_null(strstr(why, "malformed token"));
  assert_int_equal(jwt_verify(NULL, "a.b.c", iss, sizeof iss, sub, sizeof sub,
                              why, sizeof why),
                   -1);
  assert_int_equal(
      jwt_verify(vf, "a.b.c", iss, sizeof iss, sub, sizeof sub, NULL, 0), -1);
  jwt_verifier_free(NULL);
}

/* ---- base64url -------------------------------------------------------------
 */

static void b64_is(const char *in, const char *want) {
  unsigned char *out;
  size_t n;
  if (b64url_decode(in, strlen(in), &out, &n) != 0)
    fail_msg("\"%s\" refused", in);
  assert_int_equal(n, strlen(want));
  assert_memory_equal(out, want, n);
  free(out);
}

static void b64_refused(const char *in) {
  unsigned char *out = (unsigned char *)"x";
  size_t n = 7;
  if (b64url_decode(in, strlen(in), &out, &n) == 0)
    fail_msg("\"%s\" accepted", in);
  assert_null(out);
  assert_int_equal(n, 0);
}

static void test_b64url(void **state) {
  (void)state;
  b64_is("", "");
  b64_is("QQ", "A");
  b64_is("QUI", "AB");
  b64_is("QUJD", "ABC");
  b64_is("-_-_", "\xfb\xff\xbf");
  b64_refused("Q");
  b64_refused("A"); /* a lone character, though its bits are all zero */
  b64_refused("QUJDA");
  b64_refused("QUJDR");
  b64_refused("QR");  /* bits left over */
  b64_refused("QUJ"); /* bits left over */
  b64_refused("QQ==");
  b64_refused("QQ=");
  b64_refused("+/+/");
  b64_refused("QU D");
  b64_refused("QU\nJD");
}

/* ---- key sets at start -----------------------------------------------------
 */

/* Asserts that a verifier of the set text is refused with an err that names
 * the file and holds want. */
static void set_refused(const char *text, const char *want) {
  char path[160], err[512];
  jwt_verifier *v = (jwt_verifier *)1;
  snprintf(path, sizeof path, "%s/bad.json", dir);
  write_file(path, text);
  if (jwt_verifier_new(path, ISS, AUD, 0, &v, err, sizeof err) == 0)
    fail_msg("a set was accepted where \"%s\" was expected: %s", want, text);
  assert_null(v);
  if (!strstr(err, path) || !strstr(err, want))
    fail_msg("\"%s\", where the path and \"%s\" were expected", err, want);
}

static void test_jwks_refused(void **state) {
  char err[512], path[160], *k, *set, *big;
  jwt_verifier *v = NULL;
  EVP_PKEY *weak;
  (void)state;
  snprintf(path, sizeof path, "%s/absent.json", dir);
  assert_int_equal(jwt_verifier_new(path, ISS, AUD, 0, &v, err, sizeof err),
                   -1);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "cannot open: No such file"));
  assert_int_equal(
      jwt_verifier_new(jwks_path, NULL, AUD, 0, &v, err, sizeof err), -1);
  assert_int_equal(jwt_verifier_new(jwks_path, ISS, "", 0, &v, err, sizeof err),
                   -1);
  assert_int_equal(
      jwt_verifier_new(jwks_path, ISS, AUD, -1, &v, err, sizeof err), -1);
  set_refused("", "not JSON");
  set_refused("{\"keys\":[]", "not JSON");
  set_refused("{\"keys\":[],\"keys\":[]}", "not JSON");
  set_refused("[]", "not a JWK Set");
  set_refused("{\"key\":[]}", "not a JWK Set");
  set_refused("{\"keys\":{}}", "not a JWK Set");
  set_refused("{\"keys\":[]}", "no key usable");
  set_refused("{\"keys\":[{\"kty\":\"oct\",\"kid\":\"h\"}]}", "no key usable");
  set_refused("{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"X25519\",\"x\":\"AA\"}]}",
              "no key usable");
  set_refused("{\"keys\":[7]}", "key 1: not a JSON object");
  set_refused("{\"keys\":[{\"kid\":\"a\"}]}", "key 1 (kid \"a\"): no \"kty\"");
  set_refused("{\"keys\":[{\"kty\":\"RSA\",\"kid\":5}]}",
              "key 1: \"kid\", \"alg\" or \"use\" is not a string");
  /* Keys malformed: base64, lengths, a point off the curve, weak RSA. */
  k = jwk(ed, "e", NULL);
  set = malloc(8192);
  snprintf(set, 8192,
           "{\"keys\":[%s,{\"kty\":\"RSA\",\"kid\":\"r\",\"n\":"
           "\"AQAB=\",\"e\":\"AQAB\"}]}",
           k);
  set_refused(set, "key 2 (kid \"r\"): \"n\" is not base64url");
  snprintf(set, 8192,
           "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"c\",\"x\":"
           "\"AAAA\",\"y\":\"AAAA\"}]}");
  set_refused(set, "key 1 (kid \"c\"): \"x\" is 3 bytes long, not 32");
  snprintf(set, 8192,
           "{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"kid\":\"c\",\"x\":"
           "\"AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\",\"y\":"
           "\"AQAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}]}");
  set_refused(set, "key 1 (kid \"c\"): OpenSSL refuses the P-256 point");
  snprintf(set, 8192,
           "{\"keys\":[{\"kty\":\"OKP\",\"crv\":\"Ed25519\",\"x\":\"AAAA\"}]}");
  set_refused(set, "key 1: \"x\" is 3 bytes long, not 32");
  free(k);
  /* An even modulus, which OpenSSL imports but its public key check
   * refuses. */
  k = jwk(rsa, "even", NULL);
  {
    char *n = strstr(k, "\"n\":\"") + 5;
    char *end = strchr(n, '"');
    /* The last character holds the modulus' low bits; clear its lowest
     * (of the bits not left over: a 256-byte n ends on a 4-bit char). */
    int d = b64url_value((unsigned char)end[-1]) & ~0x10;
    end[-1] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[d];
  }
  snprintf(set, 8192, "{\"keys\":[%s]}", k);
  set_refused(set, "key 1 (kid \"even\"): OpenSSL refuses the RSA key");
  free(k);
  weak = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
  k = jwk(weak, "w", NULL);
  snprintf(set, 8192, "{\"keys\":[%s]}", k);
  set_refused(set, "key 1 (kid \"w\"): RSA key of 1024 bits");
  free(k);
  EVP_PKEY_free(weak);
  /* A private key published with the set. */
  k = jwk(ed, "e", ",\"d\":\"AAAA\"");
  snprintf(set, 8192, "{\"keys\":[%s]}", k);
  set_refused(set, "key 1 (kid \"e\"): holds private or secret key material");
  free(k);
  /* A kid unfit for a terminal is not shown. */
  set_refused("{\"keys\":[{\"kid\":\"\\u001b[31m\"}]}", "key 1: no \"kty\"");
  free(set);
  /* Too many keys; too large a file. */
  {
    size_t cap = 64 * 1024, len;
    set = malloc(cap);
    len = (size_t)snprintf(set, cap, "{\"keys\":[");
    for (int i = 0; i < JWT_MAX_KEYS + 1; i++)
      len += (size_t)snprintf(set + len, cap - len,
                              "%s{\"kty\":\"oct\",\"kid\":\"k%d\"}",
                              i ? "," : "", i);
    snprintf(set + len, cap - len, "]}");
    set_refused(set, "101 keys, more than the 100 taken");
    free(set);
  }
  big = malloc(JWT_MAX_JWKS + 64);
  k = jwk(ed, "e", NULL);
  {
    size_t len = (size_t)sprintf(big, "{\"keys\":[%s]", k);
    memset(big + len, ' ', JWT_MAX_JWKS - len);
    big[JWT_MAX_JWKS] = '}';
    big[JWT_MAX_JWKS + 1] = 0;
    set_refused(big, "larger than 1048576 bytes"); /* one byte over */
    big[JWT_MAX_JWKS - 1] = '}';
    big[JWT_MAX_JWKS] = 0;
    snprintf(path, sizeof path, "%s/at_max.json", dir);
    write_file(path, big); /* exactly at the cap: taken */
    assert_int_equal(jwt_verifier_new(path, ISS, AUD, 0, &v, err, sizeof err),
                     0);
    jwt_verifier_free(v);
  }
  free(k);
  free(big);
}

/* ---- a key set served over HTTP ------------------------------------------ */

/* The test's key server: answers every request with the current body and
 * status, and counts the requests it answered. */
static struct server {
  pthread_mutex_t mu;
  char *body;
  int status;
  int hits;
  int stop;
  int fd;
  int port;
  pthread_t thread;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void serve_set(const char *text, int status) {
  pthread_mutex_lock(&S.mu);
  free(S.body);
  S.body = strdup(text);
  S.status = status;
  pthread_mutex_unlock(&S.mu);
}

static int hits(void) {
  int n;
  pthread_mutex_lock(&S.mu);
  n = S.hits;
  pthread_mutex_unlock(&S.mu);
  return n;
}

static void *server_main(void *arg) {
  (void)arg;
  for (;;) {
    struct pollfd pf = {.fd = S.fd, .events = POLLIN};
    char req[8192], *out;
    size_t got = 0, len;
    int c, stop;
    pthread_mutex_lock(&S.mu);
    stop = S.stop;
    pthread_mutex_unlock(&S.mu);
    if (stop)
      break;
    if (poll(&pf, 1, 20) <= 0)
      continue;
    if ((c = accept(S.fd, NULL, NULL)) < 0)
      continue;
    /* The head alone: libcurl sends no body with a GET. */
    while (got < sizeof req - 1) {
      ssize_t r = read(c, req + got, sizeof req - 1 - got);
      if (r <= 0)
        break;
      got += (size_t)r;
      req[got] = 0;
      if (strstr(req, "\r\n\r\n"))
        break;
    }
    pthread_mutex_lock(&S.mu);
    len = strlen(S.body) + 256;
    out = malloc(len);
    len = (size_t)snprintf(out, len,
                           "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                           S.status, strlen(S.body), S.body);
    pthread_mutex_unlock(&S.mu);
    for (size_t off = 0; off < len;) {
      ssize_t w = write(c, out + off, len - off);
      if (w <= 0)
        break;
      off += (size_t)w;
    }
    free(out);
    close(c);
    pthread_mutex_lock(&S.mu);
    S.hits++;
    pthread_mutex_unlock(&S.mu);
  }
  return NULL;
}

static void server_start(void) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t alen = sizeof a;
  int one = 1;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_true((S.fd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
  setsockopt(S.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  assert_int_equal(bind(S.fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(S.fd, 16), 0);
  assert_int_equal(getsockname(S.fd, (struct sockaddr *)&a, &alen), 0);
  S.port = ntohs(a.sin_port);
  S.stop = 0;
  assert_int_equal(pthread_create(&S.thread, NULL, server_main, NULL), 0);
}

static void server_stop(void) {
  pthread_mutex_lock(&S.mu);
  S.stop = 1;
  pthread_mutex_unlock(&S.mu);
  pthread_join(S.thread, NULL);
  close(S.fd);
  free(S.body);
  S.body = NULL;
}

/* A set of the one key k under kid. */
static char *one_key(EVP_PKEY *k, const char *kid) {
  char *j = jwk(k, kid, ",\"alg\":\"EdDSA\",\"use\":\"sig\""), *out;
  out = malloc(strlen(j) + 16);
  sprintf(out, "{\"keys\":[%s]}", j);
  free(j);
  return out;
}

static double now_s(void) { return mono_now(); }

/* Polls until t verifies with v, for at most 10 s; 0 if it did. */
static int verifies_soon(jwt_verifier *v, const char *t) {
  char iss[256], sub[256], why[256];
  double until = now_s() + 10;
  while (now_s() < until) {
    if (jwt_verify(v, t, iss, sizeof iss, sub, sizeof sub, why, sizeof why) ==
        0)
      return 0;
    usleep(10 * 1000);
  }
  return -1;
}

static int verify1(jwt_verifier *v, const char *t, char *why, size_t n) {
  char iss[256], sub[256];
  return jwt_verify(v, t, iss, sizeof iss, sub, sizeof sub, why, n);
}

static void test_http_rotation(void **state) {
  char url[128], err[512], why[256], *set, *c = claims(NULL);
  char *ta = token(ed, "EdDSA", "a", c), *tb = token(ed_b, "EdDSA", "b", c);
  jwt_verifier *v = NULL;
  double until;
  (void)state;
  server_start();
  /* Answers other than 200, and a server that is not there. */
  serve_set("{}", 404);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/jwks?token=secret", S.port);
  assert_int_equal(jwt_verifier_new(url, ISS, AUD, 3600, &v, err, sizeof err),
                   -1);
  if (!strstr(err, "answered HTTP 404") || strstr(err, "secret"))
    fail_msg("%s", err);
  snprintf(url, sizeof url, "http://user:pw@127.0.0.1:%d/jwks", S.port);
  assert_int_equal(jwt_verifier_new(url, ISS, AUD, 3600, &v, err, sizeof err),
                   -1);
  if (!strstr(err, "http://***@127.0.0.1") || strstr(err, "pw"))
    fail_msg("%s", err);
  assert_int_equal(jwt_verifier_new("http://127.0.0.1:1/jwks", ISS, AUD, 0, &v,
                                    err, sizeof err),
                   -1);
  assert_non_null(strstr(err, "JWKS http://127.0.0.1:1/jwks: cannot fetch"));
  {
    char *big = malloc(JWT_MAX_JWKS + 2);
    memset(big, ' ', JWT_MAX_JWKS + 1);
    big[JWT_MAX_JWKS + 1] = 0;
    serve_set(big, 200);
    free(big);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/jwks", S.port);
    assert_int_equal(jwt_verifier_new(url, ISS, AUD, 3600, &v, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "larger than 1048576 bytes"));
  }

  /* Set A at start; a token of kid b, unknown, asks for a refresh, which
   * finds set B once the server has rotated. */
  set = one_key(ed, "a");
  serve_set(set, 200);
  free(set);
  assert_int_equal(jwt_verifier_new(url, ISS, AUD, 3600, &v, err, sizeof err),
                   0);
  ok_with(v, strdup(ta));
  /* Without kid, no key of set A is for ES256 (which asks no refresh). */
  refused_with(v, token(ec, "ES256", NULL, c),
               "unknown key id: the token has no kid and no key");
  set = one_key(ed_b, "b");
  serve_set(set, 200);
  free(set);
  /* No refresh is due for an hour: set A stays until kid b asks. */
  assert_int_equal(verify1(v, tb, why, sizeof why), -1);
  assert_non_null(strstr(why, "unknown key id: "));
  if (verifies_soon(v, tb) != 0)
    fail_msg("a token of the rotated key never verified");
  refused_with(v, strdup(ta), "unknown key id: ");
  /* Refreshes asked for by unknown kids come at most once per 10 s: a
   * flood of them for half a second leaves the server alone. */
  {
    int h = hits();
    char *tc = token(ed_c, "EdDSA", "c", c);
    until = now_s() + 0.5;
    while (now_s() < until) {
      assert_int_equal(verify1(v, tc, why, sizeof why), -1);
      usleep(1000);
    }
    free(tc);
    assert_int_equal(hits(), h);
  }
  jwt_verifier_free(v);
  server_stop();
  free(ta);
  free(tb);
  free(c);
}

/* Reads what stderr received into the test's file. */
static char *captured(const char *path) {
  FILE *f = fopen(path, "r");
  char *buf = calloc(1, 65536);
  if (f) {
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = 0;
    fclose(f);
  }
  return buf;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p++)
    n++;
  return n;
}

/* Periodic refreshes (every second here): a failing streak keeps the keys
 * and is told once; the next success is told and swaps the set. */
static void test_http_periodic(void **state) {
  char url[128], err[512], why[256], *set, *c = claims(NULL), *log;
  char path[160];
  char *ta = token(ed, "EdDSA", "a", c), *tc = token(ed_c, "EdDSA", "c", c);
  jwt_verifier *v = NULL;
  int saved, fd, h;
  double until;
  (void)state;
  server_start();
  set = one_key(ed, "a");
  serve_set(set, 200);
  free(set);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/jwks", S.port);
  snprintf(path, sizeof path, "%s/stderr.txt", dir);
  fflush(stderr);
  saved = dup(2);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  close(fd);
  assert_int_equal(jwt_verifier_new(url, ISS, AUD, 1, &v, err, sizeof err), 0);
  ok_with(v, strdup(ta));
  /* A streak of failed refreshes (not JSON, then 500): set A stays. A
   * request answered as the body changed may have had the old one, so
   * each phase waits for one request more than it needs. */
  serve_set("not json", 200);
  h = hits();
  until = now_s() + 10;
  while (hits() < h + 3 && now_s() < until)
    usleep(10 * 1000);
  assert_true(hits() >= h + 3);
  serve_set("{}", 500);
  h = hits();
  until = now_s() + 10;
  while (hits() < h + 2 && now_s() < until)
    usleep(10 * 1000);
  assert_true(hits() >= h + 2);
  ok_with(v, strdup(ta));
  /* Set C: the next periodic refresh takes it, with no token asking. */
  set = one_key(ed_c, "c");
  serve_set(set, 200);
  free(set);
  until = now_s() + 10;
  do {
    usleep(10 * 1000);
    log = captured(path);
    if (strstr(log, "refreshed again") || now_s() > until)
      break;
    free(log);
  } while (1);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  if (!strstr(log, "refreshed again (1 keys)"))
    fail_msg("stderr: %s", log);
  if (count_of(log, "refresh failed") != 1 ||
      !strstr(log, "refresh failed, keeping the keys loaded before: not JSON"))
    fail_msg("stderr: %s", log);
  free(log);
  assert_int_equal(verify1(v, tc, why, sizeof why), 0);
  refused_with(v, strdup(ta), "unknown key id: ");
  jwt_verifier_free(v);
  server_stop();
  free(ta);
  free(tc);
  free(c);
}

/* Many threads verify while the refresher swaps sets every second. */
typedef struct worker {
  jwt_verifier *v;
  const char *good, *unknown;
  atomic_int *stop;
  int verified, failures;
} worker;

static void *work(void *arg) {
  worker *w = arg;
  char iss[256], sub[256], why[256];
  while (!atomic_load(w->stop)) {
    if (jwt_verify(w->v, w->good, iss, sizeof iss, sub, sizeof sub, why,
                   sizeof why) == 0 &&
        strcmp(sub, "user-42") == 0)
      w->verified++;
    else
      w->failures++;
    if (jwt_verify(w->v, w->unknown, iss, sizeof iss, sub, sizeof sub, why,
                   sizeof why) == 0)
      w->failures++;
  }
  return NULL;
}

static void test_http_threads(void **state) {
  char url[128], err[512], *c = claims(NULL), set[4096];
  char *ta = token(ed, "EdDSA", "a", c), *tz = token(ed_c, "EdDSA", "z", c);
  char *ka = jwk(ed, "a", NULL), *kb = jwk(ed_b, "b", NULL);
  jwt_verifier *v = NULL;
  pthread_t th[4];
  worker w[4];
  atomic_int stop;
  double until;
  int h;
  (void)state;
  atomic_init(&stop, 0);
  server_start();
  snprintf(set, sizeof set, "{\"keys\":[%s,%s]}", ka, kb);
  serve_set(set, 200);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/jwks", S.port);
  assert_int_equal(jwt_verifier_new(url, ISS, AUD, 1, &v, err, sizeof err), 0);
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){v, ta, tz, &stop, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  h = hits();
  until = now_s() + 10;
  while (hits() < h + 3 && now_s() < until)
    usleep(10 * 1000);
  atomic_store(&stop, 1);
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_true(w[i].verified > 0);
    assert_int_equal(w[i].failures, 0);
  }
  assert_true(hits() >= h + 3);
  /* Freed while the refresher may be fetching. */
  jwt_verifier_free(v);
  server_stop();
  free(ka);
  free(kb);
  free(ta);
  free(tz);
  free(c);
}

/* ---- the node signer -------------------------------------------------------
 */

static const char *node_tool;

/* Runs a command and returns the first line it printed. */
static char *run_line(const char *cmd) {
  char buf[32768];
  FILE *p = popen(cmd, "r");
  size_t n;
  assert_non_null(p);
  n = fread(buf, 1, sizeof buf - 1, p);
  buf[n] = 0;
  if (pclose(p) != 0)
    fail_msg("%s failed", cmd);
  buf[strcspn(buf, "\n")] = 0;
  return strdup(buf);
}

static void test_node_tool(void **state) {
  char cmd[1024], path[160], err[512];
  jwt_verifier *v = NULL;
  const char *kids[] = {"rsa1", "ec1", "ed1"};
  const char *algs[] = {"RS256", "ES256", "EdDSA"};
  long long exp = (long long)time(NULL) + 300;
  (void)state;
  snprintf(cmd, sizeof cmd, "node '%s' keys '%s'", node_tool, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/jwks.json", dir);
  if (jwt_verifier_new(path, ISS, AUD, 0, &v, err, sizeof err) != 0)
    fail_msg("%s", err);
  for (int i = 0; i < 3; i++) {
    char *t, *f, hdr[128];
    unsigned char *h;
    size_t hn;
    snprintf(cmd, sizeof cmd,
             "node '%s' sign '%s' %s '{\"iss\":\"" ISS
             "\",\"sub\":\"user-42\",\"aud\":\"" AUD "\",\"exp\":%lld}'",
             node_tool, dir, kids[i], exp);
    t = run_line(cmd);
    /* The header names the kid and the algorithm of the key's type. */
    assert_int_equal(b64url_decode(t, strcspn(t, "."), &h, &hn), 0);
    snprintf(hdr, sizeof hdr, "\"alg\":\"%s\"", algs[i]);
    assert_non_null(strstr((char *)h, hdr));
    free(h);
    snprintf(cmd, sizeof cmd, "node '%s' forge '%s'", node_tool, t);
    f = run_line(cmd);
    assert_string_not_equal(f, t);
    ok_with(v, t);
    refused_with(v, f, "signature: ");
    /* A token for another audience. */
    snprintf(cmd, sizeof cmd,
             "node '%s' sign '%s' %s '{\"iss\":\"" ISS
             "\",\"sub\":\"user-42\",\"aud\":[\"x\"],\"exp\":%lld}'",
             node_tool, dir, kids[i], exp);
    refused_with(v, run_line(cmd), "audience: ");
  }
  jwt_verifier_free(v);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_b64url),
      cmocka_unit_test(test_each_algorithm),
      cmocka_unit_test(test_valid_claims),
      cmocka_unit_test(test_forged),
      cmocka_unit_test(test_claims),
      cmocka_unit_test(test_claims_fit),
      cmocka_unit_test(test_algorithms),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_jwks_refused),
      cmocka_unit_test(test_http_rotation),
      cmocka_unit_test(test_http_periodic),
      cmocka_unit_test(test_http_threads),
  };
  const struct CMUnitTest node_tests[] = {
      cmocka_unit_test(test_node_tool),
  };
  signal(SIGPIPE, SIG_IGN);
  if (argc == 3 && strcmp(argv[1], "--node") == 0) {
    node_tool = argv[2];
    return cmocka_run_group_tests(node_tests, setup, teardown);
  }
  return cmocka_run_group_tests(tests, setup, teardown);
}
