/*
 * fuzz_serve_request.c -- the gateway's request-to-record path
 * (src/serve/request.c): the key of an Idempotency-Key value, the
 * operation, and the request that is fingerprinted.
 *
 * Input: METHOD NUL URI NUL CONTENT-TYPE NUL KEY NUL BODY (missing parts are
 * empty). Properties, each an abort() when broken:
 *  - the fingerprinted request is always valid JSON that idem_canonicalize()
 *    takes, and says exactly what the request was: its method, path and
 *    query in printable form, and the body either as JSON (a JSON body that
 *    is one JSON value: its bytes as sent, whose canonical form is the
 *    body's and whose numbers reach the fingerprint exact) or as the
 *    SHA-256 of its bytes;
 *  - the operation is 1-255 bytes of printable ASCII and spaces, and two
 *    different paths never share it unless it is the hashed form, whose
 *    hash is the whole path's;
 *  - a key is returned only when libidem takes it, and a quoted one is the
 *    text between its quotes;
 *  - serve_request_fingerprint(), which reads the body once, gives the
 *    fingerprint of the request serve_request_json() writes.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "serve/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

/* The next NUL-separated part of the input. */
static char *part(const uint8_t **p, size_t *n, size_t *len) {
  const uint8_t *end = memchr(*p, 0, *n);
  size_t l = end ? (size_t)(end - *p) : *n;
  char *s = malloc(l + 1);
  check(s != NULL);
  memcpy(s, *p, l);
  s[l] = 0;
  *len = l;
  *p += end ? l + 1 : l;
  *n -= end ? l + 1 : l;
  return s;
}

static void check_request(const char *method, const char *uri,
                          const char *body, size_t blen, int json_type) {
  char *rj = serve_request_json(method, uri, body, blen, json_type);
  char *canon = NULL, *cb = NULL, hex[IDEM_FINGERPRINT_SIZE];
  size_t cl = 0, cbl = 0;
  const char *q = strchr(uri, '?');
  char *path = serve_printable(uri, q ? (size_t)(q - uri) : strlen(uri));
  char *query = serve_printable(q ? q + 1 : "", q ? strlen(q + 1) : 0);
  json_t *doc, *b;

  check(rj && path && query);
  check(idem_canonicalize(rj, strlen(rj), NULL, &canon, &cl, NULL) ==
        IDEM_OK);
  /* The one-pass fingerprint is the request's, byte for byte. */
  {
    char one[IDEM_FINGERPRINT_SIZE], two[IDEM_FINGERPRINT_SIZE];
    check(serve_request_fingerprint(method, uri, body, blen, json_type, one) ==
          0);
    check(idem_fingerprint(rj, strlen(rj), 1, two) == IDEM_OK);
    check(strcmp(one, two) == 0);
  }
  doc = json_loads(rj, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
  check(doc != NULL);
  check(strcmp(json_string_value(json_object_get(doc, "method")), method) ==
        0);
  check(strcmp(json_string_value(json_object_get(doc, "path")), path) == 0);
  check(strcmp(json_string_value(json_object_get(doc, "query")), query) ==
        0);
  if (json_type && blen &&
      idem_canonicalize(body, blen, NULL, &cb, &cbl, NULL) == IDEM_OK) {
    /* The body member, canonicalised alone, is the canonical body. */
    char *mine = NULL;
    size_t ml = 0;
    b = json_object_get(doc, "body");
    check(b != NULL && !json_object_get(doc, "body_sha256"));
    char *text = json_dumps(b, JSON_COMPACT | JSON_ENCODE_ANY);
    check(text != NULL);
    check(idem_canonicalize(text, strlen(text), NULL, &mine, &ml, NULL) ==
          IDEM_OK);
    check(ml == cbl && memcmp(mine, cb, ml) == 0);
    idem_free(mine);
    free(text);
    /* The body's bytes as sent, so that its fingerprint text (numbers
     * exact) is what the request's "/body" is. */
    {
      static const char *const body_ptr[] = {"/body", NULL};
      size_t rl = strlen(rj), tl = 0, sl = 0;
      char *t = NULL, *sel = NULL;
      check(rl > blen + 9 && memcmp(rj + rl - blen - 9, ",\"body\":", 8) == 0);
      check(memcmp(rj + rl - blen - 1, body, blen) == 0 && rj[rl - 1] == '}');
      check(idem__fingerprint_text(body, blen, NULL, &t, &tl, NULL) == IDEM_OK);
      check(idem__fingerprint_text(rj, rl, body_ptr, &sel, &sl, NULL) ==
            IDEM_OK);
      check(sl == tl + 10 && memcmp(sel, "{\"/body\":", 9) == 0 &&
            memcmp(sel + 9, t, tl) == 0 && sel[sl - 1] == '}');
      idem_free(t);
      idem_free(sel);
    }
  } else {
    idem_sha256_hex(body, blen, hex);
    check(!json_object_get(doc, "body"));
    check(strcmp(json_string_value(json_object_get(doc, "body_sha256")),
                 hex) == 0);
  }
  json_decref(doc);
  idem_free(cb);
  idem_free(canon);
  free(path);
  free(query);
  free(rj);
}

static void check_operation(const char *method, const char *uri) {
  const char *q = strchr(uri, '?');
  char *path = serve_printable(uri, q ? (size_t)(q - uri) : strlen(uri));
  char op[IDEM_OPERATION_MAX + 1];
  size_t n;
  check(path != NULL);
  if (serve_operation(method, path, op, sizeof op) == 0) {
    n = strlen(op);
    check(n >= 1 && n <= IDEM_OPERATION_MAX);
    for (size_t i = 0; i < n; i++)
      check(op[i] >= 0x20 && op[i] < 0x7f);
    if (strlen(method) + 1 + strlen(path) <= IDEM_OPERATION_MAX) {
      /* The plain form says the method and the whole path. */
      check(strncmp(op, method, strlen(method)) == 0);
      check(strcmp(op + strlen(method) + 1, path) == 0);
    } else {
      /* The hashed form has two spaces, the plain one one (neither method
       * nor path has any), so the two never meet. */
      char hex[IDEM_FINGERPRINT_SIZE];
      idem_sha256_hex(path, strlen(path), hex);
      check(n > 64 && strcmp(op + n - 64, hex) == 0);
      check(strstr(op, "... sha256:") != NULL);
    }
  } else {
    check(strlen(method) > 32);
  }
  free(path);
}

static void check_key(const char *value) {
  char why[300];
  char *k = serve_parse_key(value, why, sizeof why);
  size_t n = strlen(value);
  if (!k)
    return;
  check(idem_key_check(k) == IDEM_OK);
  if (n >= 2 && value[0] == '"' && value[n - 1] == '"')
    check(strlen(k) == n - 2 && memcmp(k, value + 1, n - 2) == 0);
  else
    check(strcmp(k, value) == 0);
  free(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t ml, ul, cl, kl, bl;
  char *m = part(&data, &size, &ml);
  char *uri = part(&data, &size, &ul);
  char *ct = part(&data, &size, &cl);
  char *key = part(&data, &size, &kl);
  char *body = part(&data, &size, &bl);
  /* A method reaches the gateway as an HTTP token: printable. */
  char *method = serve_printable(m, ml);
  (void)cl, (void)kl;
  check(method != NULL);
  if (!*method) {
    free(method);
    method = strdup("POST");
    check(method != NULL);
  }
  check_request(method, uri, body, bl, serve_is_json_type(ct));
  check_request(method, uri, body, bl, 1);
  check_operation(method, uri);
  check_key(key);
  free(m);
  free(method);
  free(uri);
  free(ct);
  free(key);
  free(body);
  return 0;
}
