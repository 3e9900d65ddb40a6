/*
 * record_json.c -- what idem keys and idem console share: a record as JSON
 * (as `idem keys --json` prints it and the console's API answers it), the
 * kind of a record's operation, and a bearer token read from a file.
 */
#include "cli.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text that is valid UTF-8 without NULs is shown as a string, other bytes
 * as base16, so JSON output never loses data. */
static json_t *bytes_json(const void *p, size_t n) {
  json_t *s;
  if (!p)
    return json_null();
  if (memchr(p, 0, n) == NULL && (s = json_stringn(p, n)) != NULL)
    return s;
  char *hex = malloc(2 * n + 1);
  for (size_t i = 0; hex && i < n; i++)
    sprintf(hex + 2 * i, "%02x", ((const unsigned char *)p)[i]);
  if (hex)
    hex[2 * n] = '\0';
  s = json_pack("{s:s}", "hex", hex ? hex : "");
  free(hex);
  return s;
}

json_t *cli_record_json(const idem_record *r) {
  json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i,s:I,s:I,s:I,s:I}", "tenant",
                        r->tenant, "operation", r->operation, "key", r->key,
                        "fingerprint", r->fingerprint, "state",
                        idem_state_name(r->state), "attempt", r->attempt,
                        "created_ms", (json_int_t)r->created_ms, "updated_ms",
                        (json_int_t)r->updated_ms, "lease_expires_ms",
                        (json_int_t)r->lease_expires_ms, "expires_ms",
                        (json_int_t)r->expires_ms);
  if (!o)
    return NULL;
  /* Completed by a holder that took the key over: an earlier attempt may
   * also have acted. */
  json_object_set_new(o, "recovered", json_boolean(r->recovered));
  json_object_set_new(o, "request", bytes_json(r->request, r->request_len));
  /* Sealed: the key id, and whether the response stays sealed because
   * this handle cannot open it. */
  if (r->seal_key_id[0])
    json_object_set_new(o, "seal_key_id", json_string(r->seal_key_id));
  if (r->sealed)
    json_object_set_new(o, "sealed",
                        json_string(r->sealed == IDEM_SEALED_NO_KEY
                                        ? "no key"
                                        : "does not open"));
  if (r->has_response)
    json_object_set_new(
        o, "response",
        json_pack("{s:i,s:o,s:o}", "status", r->response.status, "meta",
                  bytes_json(r->response.meta, r->response.meta_len), "body",
                  bytes_json(r->response.body, r->response.body_len)));
  return o;
}

char *cli_read_token(const char *cmd, const char *opt, const char *path) {
  char line[1024];
  size_t n;
  FILE *f = fopen(path, "r");
  if (!f) {
    cli_error(cmd, "%s: %s: %s", opt, path, strerror(errno));
    return NULL;
  }
  if (!fgets(line, sizeof line, f))
    line[0] = 0;
  fclose(f);
  n = strcspn(line, "\r\n");
  line[n] = 0;
  for (size_t i = 0; i < n; i++)
    if (line[i] <= 0x20 || line[i] >= 0x7f)
      n = 0;
  if (n < 16) {
    cli_error(cmd, "%s: %s: the first line must be a token of 16 to 1022 "
                   "printable characters, no spaces",
              opt, path);
    return NULL;
  }
  return strdup(line);
}

int cli_http_operation(const char *op) {
  size_t n = strspn(op, "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
  return n > 0 && op[n] == ' ' && op[n + 1] == '/';
}
