/*
 * mcp_request.c -- what of a JSON-RPC line makes a keyed call's record: the
 * message itself (read as the proxy reads every line), its id, where its
 * key is, and the request that is fingerprinted. Pure functions of the
 * line, with no threads or peers, so that they can be fuzzed
 * (tests/fuzz/fuzz_mcp_call.c) as well as tested through the proxy.
 */
#include "mcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *mcp_id_text(json_t *id) {
  char buf[64];
  if (json_is_real(id)) {
    double d = json_real_value(id);
    if (d > -9e15 && d < 9e15 && d == (double)(long long)d) {
      snprintf(buf, sizeof buf, "%lld", (long long)d);
      return strdup(buf);
    }
  }
  if (!json_is_string(id) && !json_is_number(id))
    return NULL;
  return json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
}

json_t *mcp_parse(const char *line, size_t len, int *dup) {
  json_error_t e;
  json_t *v;
  *dup = 0;
  if (len == 0)
    return NULL;
  /* U+0000 is a character like any other (\u0000): a message holding one
   * is read, never passed on unseen. */
  v = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
  if (v)
    return v;
  /* Integers past 64 bits are numbers all the same. */
  v = json_loadb(line, len,
                 JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL |
                     JSON_ALLOW_NUL,
                 &e);
  if (v)
    return v;
  v = json_loadb(line, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
  if (v) {
    *dup = 1;
    json_decref(v);
  }
  return NULL;
}

int mcp_find_key(const char *key_argument, json_t *params, const char **key,
                 int *in_argument) {
  json_t *k =
      json_object_get(json_object_get(params, "_meta"), "idempotencyKey");
  *key = NULL;
  *in_argument = 0;
  if (!k)
    k = json_object_get(params, "idempotencyKey");
  if (!k && key_argument) {
    k = json_object_get(json_object_get(params, "arguments"),
                        key_argument);
    *in_argument = k != NULL;
  }
  if (!k || json_is_null(k))
    return 0;
  if (!json_is_string(k) ||
      strlen(json_string_value(k)) != json_string_length(k))
    return -1;
  *key = json_string_value(k);
  return 0;
}

char *mcp_request_text(json_t *params, const char *tool, const char *drop,
                       size_t *len) {
  json_t *args = json_object_get(params, "arguments");
  json_t *copy = json_is_object(args) ? json_deep_copy(args)
                 : args               ? json_incref(args)
                                      : json_object();
  json_t *req;
  char *text;
  if (copy && drop && json_is_object(copy))
    json_object_del(copy, drop);
  req = copy ? json_pack("{s:s,s:o}", "name", tool, "arguments", copy) : NULL;
  text = req ? json_dumps(req, JSON_COMPACT) : NULL;
  json_decref(req);
  *len = text ? strlen(text) : 0;
  return text;
}
