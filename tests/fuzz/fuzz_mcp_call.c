/*
 * fuzz_mcp_call.c -- idem mcp's line-to-record path (src/mcp/mcp_request.c):
 * a line read as the proxy reads it, the key of a tools/call and the
 * request it is fingerprinted by.
 *
 * Input: one JSON-RPC line. Properties, each an abort() when broken:
 *  - a line the proxy reads is one JSON value; its id text, when it has
 *    one, is JSON too;
 *  - for a tools/call with a string key (in params._meta.idempotencyKey,
 *    params.idempotencyKey or, with --key-argument, an argument), the
 *    fingerprinted request is JSON that idem_canonicalize() takes (else the
 *    call could not be keyed), names the tool, and leaves out a key that
 *    came from the arguments; its canonical form is the one built from
 *    jansson's tree (as 0.2 built it), and its arguments are the line's
 *    own text, whose numbers reach the fingerprint exact;
 *  - the request does not depend on where the key was: the same call with
 *    its key in _meta, in params or nowhere canonicalises alike;
 *  - a plainly written id (mcp_plain_id()) put in the place of the id of a
 *    line the proxy reads leaves a line that reads the same but for the
 *    id, found where it was put and taken for the kept line
 *    (mcp_same_but_id()): what lets idem mcp answer a retry's line seen
 *    before without reading it;
 *  - lone surrogates: a line jansson reads holds no lone surrogate escape
 *    (mcp_has_lone()); one it refuses that mcp_parse_lone() reads holds
 *    one, and for a keyed tools/call read so, the fingerprinted request
 *    takes a fingerprint with IDEM_FP_LONE_SURROGATES, its arguments the
 *    line's own text.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mcp/mcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

/* The canonical form (RFC 8785) of n bytes; NULL when refused. */
static char *canonical(const char *s, size_t n, size_t *len) {
  char *c = NULL;
  *len = 0;
  if (idem_canonicalize(s, n, NULL, &c, len, NULL) != IDEM_OK)
    return NULL;
  return c;
}

/* The request as 0.2 built it, from jansson's tree, canonicalised. */
static char *request_from_tree(json_t *params, const char *tool,
                               const char *drop, size_t *len) {
  json_t *args = json_object_get(params, "arguments");
  json_t *copy = json_is_object(args) ? json_deep_copy(args)
                 : args               ? json_incref(args)
                                      : json_object();
  json_t *req;
  char *text, *c;
  check(copy != NULL);
  if (drop && json_is_object(copy))
    json_object_del(copy, drop);
  req = json_pack("{s:s,s:o}", "name", tool, "arguments", copy);
  check(req != NULL);
  text = json_dumps(req, JSON_COMPACT);
  check(text != NULL);
  c = canonical(text, strlen(text), len);
  check(c != NULL);
  json_decref(req);
  free(text);
  return c;
}

static void check_call(const char *line, size_t size, json_t *params,
                       const char *key_argument) {
  const char *tool = json_string_value(json_object_get(params, "name"));
  const char *key = NULL, *drop;
  int in_arg = 0;
  char *req, *canon, *again, *again_canon, *old, *bare_line;
  size_t len = 0, cl = 0, len2 = 0, cl2 = 0, ol = 0;
  json_t *doc, *bare;

  if (!tool || strlen(tool) != json_string_length(json_object_get(params,
                                                                   "name")))
    return;
  if (mcp_find_key(key_argument, params, &key, &in_arg) != 0 || !key)
    return;
  drop = in_arg ? key_argument : NULL;
  req = mcp_request_text(line, size, tool, drop, &len);
  check(req != NULL && len == strlen(req));
  canon = canonical(req, len, &cl);
  check(canon != NULL);
  doc = json_loadb(req, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
  check(doc != NULL);
  check(strcmp(json_string_value(json_object_get(doc, "name")), tool) == 0);
  if (in_arg)
    check(!json_object_get(json_object_get(doc, "arguments"), key_argument));
  json_decref(doc);

  /* Under RFC 8785 it is the request 0.2 built from the tree: what is
   * stored for operators has not changed. */
  old = request_from_tree(params, tool, drop, &ol);
  check(ol == cl && memcmp(old, canon, cl) == 0);

  /* The arguments reach the fingerprint as the line wrote them: exact
   * numbers included. */
  if (!drop && json_object_get(params, "arguments")) {
    static const char *const in_req[] = {"/arguments", NULL};
    static const char *const in_line[] = {"/params/arguments", NULL};
    char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (idem__fingerprint_text(line, size, in_line, &b, &bl, NULL) == IDEM_OK) {
      check(idem__fingerprint_text(req, len, in_req, &a, &al, NULL) == IDEM_OK);
      /* {"/arguments":X} and {"/params/arguments":X} */
      check(al > 15 && bl > 22 && al - 15 == bl - 22 &&
            memcmp(a + 14, b + 21, al - 15) == 0);
      idem_free(a);
      idem_free(b);
    }
  }

  /* Without the key's own members the request is the same. */
  bare = json_deep_copy(params);
  check(bare != NULL);
  json_object_del(bare, "idempotencyKey");
  json_object_del(json_object_get(bare, "_meta"), "idempotencyKey");
  bare = json_pack("{s:o}", "params", bare);
  check(bare != NULL);
  bare_line = json_dumps(bare, JSON_COMPACT);
  check(bare_line != NULL);
  again = mcp_request_text(bare_line, strlen(bare_line), tool, drop, &len2);
  check(again != NULL);
  again_canon = canonical(again, len2, &cl2);
  check(again_canon != NULL && cl2 == cl &&
        memcmp(again_canon, canon, cl) == 0);
  idem_free(again_canon);
  free(again);
  free(bare_line);
  json_decref(bare);
  idem_free(old);
  idem_free(canon);
  free(req);
}

/* The id of msg (read from line) replaced by each plain id in turn. */
static void check_plain_ids(const char *line, size_t size, json_t *msg) {
  static const char *const ids[] = {
      "7",    "-12",           "0", "-0", "123456789012345", "\"x\"",
      "\"\"", "\"a b~{}[]:,\""};
  /* Both lines read alike (numbers as doubles): a line whose id alone is
   * past 64 bits reads its other integers as doubles too. */
  const size_t flags =
      JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL;
  size_t from, to;
  char *kept;
  json_t *rest;
  if (!json_is_object(msg) || !mcp_member(line, size, 0, "id", &from, &to))
    return;
  kept = malloc(size - (to - from) + 1);
  rest = json_loadb(line, size, flags, NULL);
  check(kept != NULL && rest != NULL);
  memcpy(kept, line, from);
  memcpy(kept + from, line + to, size - to);
  json_object_del(rest, "id");
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
    size_t il = strlen(ids[i]), len = size - (to - from) + il, f2, t2;
    char *again = malloc(len);
    int dup = 0;
    json_t *m2, *want;
    check(again != NULL);
    check(mcp_plain_id(ids[i], il));
    memcpy(again, line, from);
    memcpy(again + from, ids[i], il);
    memcpy(again + from + il, line + to, size - to);
    check(mcp_same_but_id(kept, size - (to - from), from, again, len, from,
                          from + il));
    check(mcp_member(again, len, 0, "id", &f2, &t2) && f2 == from &&
          t2 == from + il);
    m2 = mcp_parse(again, len, &dup);
    check(m2 != NULL && !dup);
    json_decref(m2);
    m2 = json_loadb(again, len, flags, NULL);
    check(m2 != NULL);
    want =
        json_loadb(ids[i], il, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
    check(want != NULL);
    if (json_is_string(want))
      check(json_equal(json_object_get(m2, "id"), want));
    else
      check(json_is_number(json_object_get(m2, "id")) &&
            json_number_value(json_object_get(m2, "id")) ==
                json_number_value(want));
    json_object_del(m2, "id");
    check(json_equal(m2, rest));
    json_decref(want);
    json_decref(m2);
    free(again);
  }
  json_decref(rest);
  free(kept);
}

/* A line jansson refused, read with its lone surrogates mended. */
static void check_lone(const char *line, size_t size) {
  int dup = 0, in_arg = 0;
  json_t *msg = mcp_parse_lone(line, size, &dup), *params;
  const char *tool, *key = NULL;
  if (!msg)
    return;
  check(!dup && mcp_has_lone(line, size));
  params = json_object_get(msg, "params");
  tool = json_string_value(json_object_get(params, "name"));
  if (tool &&
      strlen(tool) == json_string_length(json_object_get(params, "name")) &&
      mcp_find_key(NULL, params, &key, &in_arg) == 0 && key) {
    static const char *const in_req[] = {"/arguments", NULL};
    static const char *const in_line[] = {"/params/arguments", NULL};
    const unsigned lone = IDEM__CANON_EXACT | IDEM__CANON_LONE;
    char fp[IDEM_FINGERPRINT_SIZE], *a = NULL, *b = NULL;
    size_t len = 0, al = 0, bl = 0;
    char *req = mcp_request_text(line, size, tool, NULL, &len);
    check(req != NULL);
    check(idem_fingerprint_with(
              req, len, IDEM_FP_JSON | IDEM_FP_LONE_SURROGATES, fp) == IDEM_OK);
    if (json_object_get(params, "arguments") &&
        idem__canon_text(line, size, in_line, lone, &b, &bl, NULL) == IDEM_OK) {
      check(idem__canon_text(req, len, in_req, lone, &a, &al, NULL) == IDEM_OK);
      check(al > 15 && bl > 22 && al - 15 == bl - 22 &&
            memcmp(a + 14, b + 21, al - 15) == 0);
    }
    idem_free(a);
    idem_free(b);
    free(req);
  }
  json_decref(msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int dup = 0;
  json_t *msg = mcp_parse((const char *)data, size, &dup), *params;
  char *id;
  if (!msg) {
    if (!dup)
      check_lone((const char *)data, size);
    return 0;
  }
  check(!dup);
  check(!mcp_has_lone((const char *)data, size));
  id = mcp_id_text(json_object_get(msg, "id"));
  if (id) {
    json_t *back = json_loads(id, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL |
                                      JSON_ALLOW_NUL,
                              NULL);
    check(back != NULL);
    json_decref(back);
    free(id);
  }
  check_plain_ids((const char *)data, size, msg);
  params = json_object_get(msg, "params");
  if (json_is_object(params)) {
    check_call((const char *)data, size, params, NULL);
    check_call((const char *)data, size, params, "idempotency_key");
  }
  json_decref(msg);
  return 0;
}
