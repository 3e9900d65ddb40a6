/*
 * fuzz_principal.c -- whose a keyed request is (src/serve/principal.c) and
 * the JWT verifier behind --principal jwt (src/serve/jwt.c): the headers a
 * client sends, whatever they are, under each rule.
 *
 * Input: one byte for the rule (0 credential:authorization, 1
 * credential:x-api-key,cookie:session, 2 header:X-User, 3 jwt against the
 * fixed key set below, 4 none), then header lines "Name: value\n". The
 * seeds hold tokens signed with that set's keys (expiring in 2100).
 * Properties, each an abort() when broken:
 *  - the answer is 0, 400 or 401; a refusal says why;
 *  - a tenant is shorter than 300 bytes, in its rule's namespace only
 *    (authorization: or credential: and 64 hex digits; header: and the
 *    printable value; jwt: 16 hex digits, then : and a printable subject
 *    or # and 64 hex digits; none: the fallback), so that no value sent
 *    under one rule names another rule's tenant;
 *  - the same headers give the same answer (a tenant is a function of
 *    the request);
 *  - a jwt tenant comes only with one Authorization header, a bearer
 *    token of the set's issuer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "serve/principal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

/* The public keys of tests/fuzz/corpus/principal's tokens (made with
 * tests/serve/jwt_tool.mjs; their private keys were thrown away). */
static const char jwks[] =
    "{\"keys\":[{\"kty\":\"RSA\",\"n\":\"zJm2Oo1D0l2Alj82Pag2iRqV6bI7L8d0"
    "bamDga7V-aUgC93Bdj3Rc3jZooEb-w4i7O4tOBt5Iwf1PFs47VvcPhwRD_xuyhZrqIKY"
    "jBv3egF6H3t9Z7uCWs9kz_88VlmzQ59IaqTxbSXkoTmI32dglkCbWE60K67HpvCVgTDc"
    "ngCHJ3jpZeV5KQz4jFhPxcgbTHcvUUO4fFpAHNhSfKY2vtcpW5ByZY7HNN1_0USmy4sJ"
    "VolWgbHH0ZFElnlrFUbaKNMsXQ4ZhDFAV1ExL_GKpUYTYzTv3h7YoZAawMM-M-8-pwNv"
    "EQviRvTTQ0x45_E5IJbdv3_n21aE9Zb3ZYluKw\",\"e\":\"AQAB\",\"kid\":\"rs"
    "a1\",\"alg\":\"RS256\",\"use\":\"sig\"},{\"kty\":\"EC\",\"x\":\"KNk8"
    "rxuzVpgMfCdOTCivSb0DwrzYG1rVPLiVGJKuKxA\",\"y\":\"V-Pq_CItZ0BE_XS1en"
    "Pu_9krJlV9mnb1uAkmpKSYd7U\",\"crv\":\"P-256\",\"kid\":\"ec1\",\"alg\""
    ":\"ES256\",\"use\":\"sig\"},{\"crv\":\"Ed25519\",\"x\":\"wiO6E73w5Hb"
    "dlAROHLKRL0O1KAPr9cdjP_gfoItplzw\",\"kty\":\"OKP\",\"kid\":\"ed1\",\""
    "alg\":\"EdDSA\",\"use\":\"sig\"}]}";

static principal_rule rules[5];

static void init(void) {
  static const char *const specs[] = {"credential:authorization",
                                      "credential:x-api-key,cookie:session",
                                      "header:X-User", "jwt", "none"};
  char why[600], path[] = "/tmp/idem-fuzz-jwks.XXXXXX";
  int fd = mkstemp(path);
  check(fd >= 0);
  check(write(fd, jwks, sizeof jwks - 1) == (ssize_t)(sizeof jwks - 1));
  close(fd);
  for (int i = 0; i < 5; i++)
    check(principal_parse(specs[i], &rules[i], why, sizeof why) == 0);
  check(principal_jwt_start(&rules[3], path, "https://issuer.fuzz", "fuzz", why,
                            sizeof why) == 0);
  unlink(path);
}

static int hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return 1;
}

static int printable(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
      return 0;
  return 1;
}

static void check_tenant(int rule, const char *t, const up_header *h,
                         size_t n) {
  size_t len = strlen(t);
  int auths = 0;
  const char *auth = NULL;
  check(len < 300);
  switch (rule) {
  case 0:
    check(len == 14 + 64 && strncmp(t, "authorization:", 14) == 0 &&
          hex(t + 14, 64));
    break;
  case 1:
    check(len == 11 + 64 && strncmp(t, "credential:", 11) == 0 &&
          hex(t + 11, 64));
    break;
  case 2:
    check(len > 7 && len <= 207 && strncmp(t, "header:", 7) == 0 &&
          printable(t + 7));
    break;
  case 3:
    check(len > 21 && strncmp(t, "jwt:", 4) == 0 && hex(t + 4, 16) &&
          (t[20] == ':' ? printable(t + 21)
                        : t[20] == '#' && len == 21 + 64 && hex(t + 21, 64)));
    for (size_t i = 0; i < n; i++)
      if (strcasecmp(h[i].name, "Authorization") == 0) {
        auths++;
        auth = h[i].value;
      }
    check(auths == 1 && strncasecmp(auth, "Bearer ", 7) == 0);
    break;
  default:
    check(len == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready;
  up_header h[64];
  size_t n = 0;
  char *text, *p, t1[300], t2[300], why1[600], why2[600];
  int rule, rc1, rc2;
  if (!ready) {
    init();
    ready = 1;
  }
  if (size < 1)
    return 0;
  rule = data[0] % 5;
  check((text = malloc(size)) != NULL);
  memcpy(text, data + 1, size - 1);
  text[size - 1] = 0;
  for (p = text; *p && n < 64;) {
    char *end = strchr(p, '\n'), *colon;
    if (end)
      *end = 0;
    if ((colon = strchr(p, ':'))) {
      *colon = 0;
      h[n].name = p;
      h[n].value = colon + 1 + strspn(colon + 1, " ");
      n++;
    }
    if (!end)
      break;
    p = end + 1;
  }
  why1[0] = why2[0] = 0;
  rc1 = principal_tenant(&rules[rule], h, n, "", t1, sizeof t1, why1,
                         sizeof why1);
  rc2 = principal_tenant(&rules[rule], h, n, "", t2, sizeof t2, why2,
                         sizeof why2);
  check(rc1 == 0 || rc1 == 400 || rc1 == 401);
  check(rc1 == rc2);
  if (rc1 == 0) {
    check(strcmp(t1, t2) == 0);
    check_tenant(rule, t1, h, n);
  } else {
    check(why1[0] != 0 && strlen(why1) < sizeof why1);
  }
  free(text);
  return 0;
}
