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
 *    came from the arguments;
 *  - the request does not depend on where the key was: the same call with
 *    its key in _meta, in params or nowhere fingerprints alike.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "mcp/mcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
  if (!ok)
    abort();
}

static void check_call(json_t *params, const char *key_argument) {
  const char *tool = json_string_value(json_object_get(params, "name"));
  const char *key = NULL;
  int in_arg = 0;
  char *req, *canon = NULL, *again;
  size_t len = 0, cl = 0, len2 = 0;
  json_t *doc, *bare;

  if (!tool || strlen(tool) != json_string_length(json_object_get(params,
                                                                   "name")))
    return;
  if (mcp_find_key(key_argument, params, &key, &in_arg) != 0 || !key)
    return;
  req = mcp_request_text(params, tool, in_arg ? key_argument : NULL, &len);
  check(req != NULL && len == strlen(req));
  check(idem_canonicalize(req, len, NULL, &canon, &cl, NULL) == IDEM_OK);
  doc = json_loadb(req, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
  check(doc != NULL);
  check(strcmp(json_string_value(json_object_get(doc, "name")), tool) == 0);
  if (in_arg)
    check(!json_object_get(json_object_get(doc, "arguments"), key_argument));
  json_decref(doc);

  /* Without the key's own members the request is the same. */
  bare = json_deep_copy(params);
  check(bare != NULL);
  json_object_del(bare, "idempotencyKey");
  json_object_del(json_object_get(bare, "_meta"), "idempotencyKey");
  again = mcp_request_text(bare, tool, in_arg ? key_argument : NULL, &len2);
  check(again != NULL && len2 == len && memcmp(again, req, len) == 0);
  free(again);
  json_decref(bare);
  idem_free(canon);
  free(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int dup = 0;
  json_t *msg = mcp_parse((const char *)data, size, &dup), *params;
  char *id;
  if (!msg)
    return 0;
  check(!dup);
  id = mcp_id_text(json_object_get(msg, "id"));
  if (id) {
    json_t *back = json_loads(id, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL |
                                      JSON_ALLOW_NUL,
                              NULL);
    check(back != NULL);
    json_decref(back);
    free(id);
  }
  params = json_object_get(msg, "params");
  if (json_is_object(params)) {
    check_call(params, NULL);
    check_call(params, "idempotency_key");
  }
  json_decref(msg);
  return 0;
}
