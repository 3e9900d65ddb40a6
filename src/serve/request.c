/*
 * request.c -- what of an HTTP request makes its record: the key, the
 * operation and the request that is fingerprinted. Pure functions of the
 * request's bytes, with no server library, so that they can be fuzzed
 * (tests/fuzz) as well as tested through the gateway.
 */
#include "serve.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

char *serve_printable(const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  char *out = malloc(n * 3 + 1), *o = out;
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    unsigned char b = (unsigned char)s[i];
    if (b > 0x20 && b < 0x7f) {
      *o++ = (char)b;
    } else {
      *o++ = '%';
      *o++ = hex[b >> 4];
      *o++ = hex[b & 15];
    }
  }
  *o = 0;
  return out;
}

int serve_operation(const char *method, const char *path, char *op,
                    size_t size) {
  size_t ml = strlen(method), pl = strlen(path);
  char hex[IDEM_FINGERPRINT_SIZE];
  if (size < IDEM_OPERATION_MAX + 1 || ml > 32)
    return -1;
  if (ml + 1 + pl <= IDEM_OPERATION_MAX) {
    snprintf(op, size, "%s %s", method, path);
    return 0;
  }
  /* Too long to be an operation: a readable start and the whole path's
   * hash, so that two long paths never share an operation. */
  idem_sha256_hex(path, pl, hex);
  snprintf(op, size, "%s %.100s... sha256:%s", method, path, hex);
  return 0;
}

int serve_is_json_type(const char *ct) {
  size_t n;
  if (!ct)
    return 0;
  n = strcspn(ct, "; \t");
  if (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
    return 1;
  return n > 5 && strncasecmp(ct + n - 5, "+json", 5) == 0;
}

char *serve_parse_key(const char *v, char *why, size_t size) {
  size_t n = strlen(v);
  char *k;
  if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
    if (memchr(v + 1, '"', n - 2) || memchr(v + 1, '\\', n - 2)) {
      snprintf(why, size, "a quoted key may not contain '\"' or '\\'");
      return NULL;
    }
    k = strndup(v + 1, n - 2);
  } else {
    k = strdup(v);
  }
  if (!k) {
    snprintf(why, size, "out of memory");
    return NULL;
  }
  if (idem_key_check(k) != IDEM_OK) {
    snprintf(why, size, "%s", idem_errmsg());
    free(k);
    return NULL;
  }
  return k;
}

/* {"method", "path", "query"} of a request (printable), and body_sha256
 * when given; NULL when out of memory. */
static json_t *envelope(const char *method, const char *uri,
                        const char *body_sha256) {
  const char *q = strchr(uri, '?');
  size_t pl = q ? (size_t)(q - uri) : strlen(uri);
  char *path = serve_printable(uri, pl);
  char *query = serve_printable(q ? q + 1 : "", q ? strlen(q + 1) : 0);
  json_t *head = NULL;
  if (path && query)
    head = json_pack("{s:s, s:s, s:s}", "method", method, "path", path,
                     "query", query);
  if (head && body_sha256 &&
      json_object_set_new(head, "body_sha256", json_string(body_sha256)) != 0) {
    json_decref(head);
    head = NULL;
  }
  free(path);
  free(query);
  return head;
}

int serve_request_fingerprint(const char *method, const char *uri,
                              const char *body, size_t len, int json_type,
                              char fp[IDEM_FINGERPRINT_SIZE]) {
  char hex[IDEM_FINGERPRINT_SIZE], *btext = NULL, *htext = NULL, *h = NULL;
  size_t blen = 0, hlen = 0;
  json_t *head;
  int rc = -1;
  /* A JSON body that is one JSON value: its text once, spliced. Anything
   * else: the envelope with the body's SHA-256, small. */
  int spliced = json_type && len &&
                idem_fingerprint_text(body, len, &btext, &blen) == IDEM_OK;
  if (!spliced)
    idem_sha256_hex(body ? body : "", len, hex);
  if (!(head = envelope(method, uri, spliced ? NULL : hex)) ||
      !(h = json_dumps(head, JSON_COMPACT)))
    goto out;
  if (!spliced) {
    rc = idem_fingerprint(h, strlen(h), 1, fp) == IDEM_OK ? 0 : -1;
    goto out;
  }
  /* {"body":B,"method":M,"path":P,"query":Q}: "body" sorts before the
   * envelope's members, so the whole text is the body's after "body" and
   * the envelope's own members after it. */
  if (idem_fingerprint_text(h, strlen(h), &htext, &hlen) != IDEM_OK ||
      hlen < 2)
    goto out;
  {
    const void *parts[4] = {"{\"body\":", btext, ",", htext + 1};
    size_t sizes[4] = {8, blen, 1, hlen - 1};
    size_t total = 0;
    char *all;
    for (int i = 0; i < 4; i++)
      total += sizes[i];
    if (!(all = malloc(total)))
      goto out;
    for (size_t i = 0, at = 0; i < 4; at += sizes[i], i++)
      memcpy(all + at, parts[i], sizes[i]);
    rc = idem_sha256_hex(all, total, fp) == IDEM_OK ? 0 : -1;
    free(all);
  }
out:
  idem_free(btext);
  idem_free(htext);
  free(h);
  json_decref(head);
  return rc;
}

char *serve_request_json(const char *method, const char *uri, const char *body,
                         size_t len, int json_type) {
  const char *q = strchr(uri, '?');
  size_t pl = q ? (size_t)(q - uri) : strlen(uri), cl = 0, hl;
  char hex[IDEM_FINGERPRINT_SIZE];
  char *path = serve_printable(uri, pl);
  char *query = serve_printable(q ? q + 1 : "", q ? strlen(q + 1) : 0);
  char *h = NULL, *s = NULL, *canon = NULL;
  json_t *head = NULL;

  if (!path || !query)
    goto out;
  head = json_pack("{s:s, s:s, s:s}", "method", method, "path", path, "query",
                   query);
  if (!head)
    goto out;
  /* A JSON body counts as JSON (idem_execute() fingerprints it by its
   * canonical form, member order and whitespace aside); any other body, and
   * one that says it is JSON but is not one JSON value, by its bytes. */
  if (!json_type || !len ||
      idem_canonicalize(body, len, NULL, &canon, &cl, NULL) != IDEM_OK) {
    idem_sha256_hex(body ? body : "", len, hex);
    json_object_set_new(head, "body_sha256", json_string(hex));
  }
  h = json_dumps(head, JSON_COMPACT);
  if (!h || !canon) {
    s = h;
    h = NULL;
    goto out;
  }
  /* {...,"body":<the body as sent>}: its text, not its canonical form,
   * whose numbers are doubles already, so that the fingerprint sees
   * 12345678901234567 and 12345678901234568 as the client wrote them. A
   * valid JSON text holds no NUL byte. */
  hl = strlen(h) - 1; /* without its '}' */
  s = malloc(hl + 8 + len + 2);
  if (s) {
    memcpy(s, h, hl);
    memcpy(s + hl, ",\"body\":", 8);
    memcpy(s + hl + 8, body, len);
    memcpy(s + hl + 8 + len, "}", 2);
  }
out:
  idem_free(canon);
  json_decref(head);
  free(h);
  free(path);
  free(query);
  return s;
}
