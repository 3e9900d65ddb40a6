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
  /* A NUL byte is never JSON, though jansson reads past one that follows a
   * number: a server could read such a line otherwise (a C string ends
   * there), and a keyed call's request text, copied from the line, would
   * not be JSON. */
  if (len == 0 || memchr(line, 0, len) != NULL)
    return NULL;
  /* U+0000 is a character like any other (\u0000): a message holding one
   * is read, never passed on unseen. */
  v = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &e);
  if (v)
    return v;
  /* Integers past 64 bits are numbers all the same. */
  v = json_loadb(
      line, len,
      JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
  if (v)
    return v;
  v = json_loadb(line, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &e);
  if (v) {
    *dup = 1;
    json_decref(v);
  }
  return NULL;
}

/* The code unit of the \u escape at s[i], or -1 when none is there. */
static long u_escape(const char *s, size_t n, size_t i) {
  long v = 0;
  if (i >= n || n - i < 6 || s[i] != '\\' || s[i + 1] != 'u')
    return -1;
  for (size_t k = i + 2; k < i + 6; k++) {
    char c = s[k];
    int h = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  return v;
}

/* The lone surrogate escapes of s[0, n): their count; with mend, each is
 * written \ufffd in mend (a copy of s, or s itself). A backslash only
 * stands in a string in JSON, so the text's structure is not followed:
 * escapes are stepped over as they come ("\\ud800" is no escape of one). */
static size_t lone_escapes(const char *s, size_t n, char *mend) {
  size_t count = 0;
  const char *b;
  for (size_t i = 0; i < n && (b = memchr(s + i, '\\', n - i)); i++) {
    long u, lo;
    i = (size_t)(b - s);
    if ((u = u_escape(s, n, i)) < 0) {
      i++; /* another escape: its second byte is no backslash of its own */
      continue;
    }
    lo = u >= 0xD800 && u <= 0xDBFF ? u_escape(s, n, i + 6) : -1;
    if (lo >= 0xDC00 && lo <= 0xDFFF) {
      i += 11; /* a pair */
      continue;
    }
    if (u >= 0xD800 && u <= 0xDFFF) {
      count++;
      if (mend)
        memcpy(mend + i + 2, "fffd", 4);
    }
    i += 5;
  }
  return count;
}

int mcp_has_lone(const char *s, size_t n) {
  return lone_escapes(s, n, NULL) > 0;
}

json_t *mcp_parse_lone(const char *line, size_t len, int *dup) {
  char *copy;
  json_t *v;
  *dup = 0;
  if (len == 0 || !mcp_has_lone(line, len) || !(copy = malloc(len)))
    return NULL;
  memcpy(copy, line, len);
  lone_escapes(copy, len, copy);
  v = mcp_parse(copy, len, dup);
  free(copy);
  return v;
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
    k = json_object_get(json_object_get(params, "arguments"), key_argument);
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

/* ---- the request's text, taken from the line ---------------------------
 *
 * jansson reads every number as an int64 or a double, so a request rebuilt
 * from its tree would have lost what a double cannot hold: 0.1 and
 * 0.10000000000000001, 1 and 1.00000000000000001, and with an integer past
 * 64 bits anywhere in the line every integer past 2^53. The fingerprint
 * must see the numbers the client sent, so the arguments are copied from
 * the line's own text. The line is JSON that mcp_parse() read, so these
 * only step over valid values.
 */

static size_t skip_ws(const char *s, size_t n, size_t i) {
  while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
    i++;
  return i;
}

/* Just past the string whose opening quote is at s[i]. */
static size_t skip_string(const char *s, size_t n, size_t i) {
  for (i++; i < n && s[i] != '"'; i++)
    if (s[i] == '\\')
      i++;
  return i + 1 > n ? n : i + 1;
}

/* Just past the value that starts at s[i]. */
static size_t skip_value(const char *s, size_t n, size_t i) {
  size_t depth = 0;
  do {
    if (i >= n)
      return n;
    if (s[i] == '"') {
      i = skip_string(s, n, i);
    } else if (s[i] == '{' || s[i] == '[') {
      depth++;
      i++;
    } else if (s[i] == '}' || s[i] == ']') {
      depth--;
      i++;
    } else if (depth == 0) {
      while (i < n && !strchr(" \t\r\n,]}", s[i]))
        i++;
    } else {
      i++;
    }
  } while (depth > 0);
  return i;
}

/* Whether the member name whose quotes span s[i..end) is name, decoded. */
static int name_is(const char *s, size_t i, size_t end, const char *name) {
  size_t want = strlen(name);
  json_t *v;
  int same;
  if (!memchr(s + i, '\\', end - i))
    return end - i - 2 == want && memcmp(s + i + 1, name, want) == 0;
  v = json_loadb(s + i, end - i, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
  same = json_is_string(v) && json_string_length(v) == want &&
         memcmp(json_string_value(v), name, want) == 0;
  json_decref(v);
  return same;
}

/* A member of the object at s[at]: where its name starts, where its value
 * starts and ends. */
typedef struct member_span {
  size_t name, value, end;
} member_span;

/* Finds the member called name in the object at s[at]; 0 when there is
 * none (or s[at] is no object). */
static int find_member(const char *s, size_t n, size_t at, const char *name,
                       member_span *m) {
  size_t i;
  if (at >= n || s[at] != '{')
    return 0;
  i = skip_ws(s, n, at + 1);
  while (i < n && s[i] == '"') {
    size_t end = skip_string(s, n, i);
    m->name = i;
    m->value = skip_ws(s, n, skip_ws(s, n, end) + 1);
    m->end = skip_value(s, n, m->value);
    if (name_is(s, i, end, name))
      return 1;
    i = skip_ws(s, n, m->end);
    if (i >= n || s[i] != ',')
      break;
    i = skip_ws(s, n, i + 1);
  }
  return 0;
}

/* The span [*from, *to) of line that removes member m of the object
 * whose first member starts at obj: the member, with the comma that joins
 * it to a neighbour (the one after it, else the one before). */
static void member_cut(const char *line, size_t len, size_t obj,
                       const member_span *m, size_t *from, size_t *to) {
  size_t after = skip_ws(line, len, m->end);
  *from = m->name;
  *to = m->end;
  if (after < len && line[after] == ',') {
    *to = skip_ws(line, len, after + 1);
  } else {
    size_t before = m->name;
    while (before > obj && strchr(" \t\r\n", line[before - 1]) != NULL)
      before--;
    if (line[before - 1] == ',')
      *from = before - 1;
  }
}

char *mcp_request_text(const char *line, size_t line_len, const char *tool,
                       const char *drop, size_t *len) {
  member_span params, args, key;
  json_t *name = json_string(tool);
  char *name_text = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL;
  char *text = NULL;
  const char *a = "{}", *cut = NULL;
  size_t alen = 2, cut_from = 0, cut_to = 0;
  int have_args = 0;
  *len = 0;
  json_decref(name);
  if (!name_text)
    return NULL;
  if (find_member(line, line_len, skip_ws(line, line_len, 0), "params",
                  &params) &&
      find_member(line, line_len, params.value, "arguments", &args)) {
    a = line + args.value;
    alen = args.end - args.value;
    have_args = 1;
  }
  /* The key, when it came from the arguments, is no part of the request:
   * its member goes, with the comma that joins it to a neighbour. */
  if (drop && have_args &&
      find_member(line, line_len, args.value, drop, &key)) {
    cut = line + key.name;
    member_cut(line, line_len, args.value, &key, &cut_from, &cut_to);
  }
  {
    size_t n = strlen(name_text) + alen + 32;
    text = malloc(n);
    if (text) {
      size_t o =
          (size_t)snprintf(text, n, "{\"name\":%s,\"arguments\":", name_text);
      if (cut) {
        memcpy(text + o, a, cut_from - args.value);
        o += cut_from - args.value;
        memcpy(text + o, line + cut_to, args.end - cut_to);
        o += args.end - cut_to;
      } else {
        memcpy(text + o, a, alen);
        o += alen;
      }
      text[o++] = '}';
      text[o] = '\0';
      *len = o;
    }
  }
  free(name_text);
  return text;
}

/* ---- raw spans: ids, results and lines the proxy cannot parse ----------
 *
 * The proxy answers under the client's own id bytes, sends keyed calls
 * under ids of its own, and replays a result as the server wrote it: all
 * by splicing text, never by rewriting a message from its parsed tree
 * (which would turn 1234567890123456789 into 1.2345678901234568e18). The
 * same stepping reads what it must of a tools/call line that jansson
 * refuses (a lone surrogate in an argument): strings are stepped over
 * whatever they hold.
 */

int mcp_member(const char *s, size_t n, size_t at, const char *name,
               size_t *from, size_t *to) {
  member_span m;
  if (!find_member(s, n, skip_ws(s, n, at), name, &m) || m.value >= n ||
      m.end > n || m.end <= m.value)
    return 0;
  *from = m.value;
  *to = m.end;
  return 1;
}

int mcp_plain_id(const char *s, size_t n) {
  size_t i = 0, digits;
  if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
    for (i = 1; i + 1 < n; i++)
      if (s[i] < 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\')
        return 0;
    return 1;
  }
  if (i < n && s[i] == '-')
    i++;
  digits = n - i;
  if (digits == 0 || digits > 15 || (s[i] == '0' && digits > 1))
    return 0;
  for (; i < n; i++)
    if (s[i] < '0' || s[i] > '9')
      return 0;
  return 1;
}

int mcp_same_but_id(const char *kept, size_t kept_len, size_t at,
                    const char *line, size_t len, size_t from, size_t to) {
  return from <= to && to <= len && at == from &&
         kept_len == len - (to - from) && memcmp(kept, line, from) == 0 &&
         memcmp(kept + from, line + to, len - to) == 0;
}

char *mcp_splice(const char *s, size_t n, size_t from, size_t to,
                 const char *ins, size_t ins_len, size_t *out_len) {
  size_t len = n - (to - from) + ins_len;
  char *out = malloc(len + 1);
  if (!out)
    return NULL;
  memcpy(out, s, from);
  memcpy(out + from, ins, ins_len);
  memcpy(out + from + ins_len, s + to, n - to);
  out[len] = '\0';
  *out_len = len;
  return out;
}

/* Whether the object whose '{' is at s[at] has no members. */
static int empty_object(const char *s, size_t n, size_t at) {
  size_t i = skip_ws(s, n, at + 1);
  return i < n && s[i] == '}';
}

/* Whether the array whose '[' is at s[at] has no elements. */
static int empty_array(const char *s, size_t n, size_t at) {
  size_t i = skip_ws(s, n, at + 1);
  return i < n && s[i] == ']';
}

/* Where and what mcp_mark_result() inserts into body: 0 with *at and ins
 * (NUL-terminated, ins_size at least 128) set, or -1 when nothing is
 * inserted (no marks, or a result that is not an object). */
static int mark_point(const char *body, size_t len, int replayed,
                      int recovered, int implicit, size_t *at, char *ins,
                      size_t ins_size) {
  char marks[100];
  size_t i = skip_ws(body, len, 0), from, to;
  snprintf(marks, sizeof marks, "%s%s%s%s",
           replayed ? "\"idem/replayed\":true" : "",
           replayed && recovered ? "," : "",
           recovered ? "\"idem/recovered\":true" : "",
           implicit ? ",\"idem/implicit\":true" : "");
  if (i >= len || body[i] != '{' || !marks[0])
    return -1;
  if (mcp_member(body, len, i, "_meta", &from, &to) && body[from] == '{') {
    snprintf(ins, ins_size, "%s%s", marks,
             empty_object(body, len, from) ? "" : ",");
    *at = from + 1;
  } else {
    snprintf(ins, ins_size, "\"_meta\":{%s}%s", marks,
             empty_object(body, len, i) ? "" : ",");
    *at = i + 1;
  }
  return 0;
}

char *mcp_mark_result(const char *body, size_t len, int replayed, int recovered,
                      size_t *out_len) {
  char ins[128];
  size_t at;
  if (mark_point(body, len, replayed, recovered, 0, &at, ins, sizeof ins) != 0)
    return mcp_splice(body, len, 0, 0, "", 0, out_len);
  return mcp_splice(body, len, at, at, ins, strlen(ins), out_len);
}

/* The string at s[from, to) decoded, when it is one jansson can read. */
static char *string_at(const char *s, size_t from, size_t to) {
  json_t *v = json_loadb(s + from, to - from, JSON_DECODE_ANY, NULL);
  char *out = NULL;
  if (json_is_string(v) &&
      strlen(json_string_value(v)) == json_string_length(v))
    out = strdup(json_string_value(v));
  json_decref(v);
  return out;
}

static int present(const char *s, size_t from, size_t to) {
  return !(to - from == 4 && memcmp(s + from, "null", 4) == 0);
}

int mcp_scan_call(const char *line, size_t len, const char *key_argument,
                  int *keyed, size_t *id_from, size_t *id_to, char **tool) {
  size_t f, t, pf, pt, mf, mt;
  char *method;
  int is_call;
  *keyed = 0;
  *id_from = *id_to = 0;
  *tool = NULL;
  if (!mcp_member(line, len, 0, "method", &f, &t))
    return 0;
  method = string_at(line, f, t);
  is_call = method && strcmp(method, "tools/call") == 0;
  free(method);
  if (!is_call)
    return 0;
  if (mcp_member(line, len, 0, "id", &f, &t)) {
    *id_from = f;
    *id_to = t;
  }
  if (!mcp_member(line, len, 0, "params", &pf, &pt))
    return 1;
  if (mcp_member(line, pf + (pt - pf), pf, "name", &f, &t))
    *tool = string_at(line, f, t);
  if ((mcp_member(line, pt, pf, "_meta", &mf, &mt) &&
       mcp_member(line, mt, mf, "idempotencyKey", &f, &t) &&
       present(line, f, t)) ||
      (mcp_member(line, pt, pf, "idempotencyKey", &f, &t) &&
       present(line, f, t)) ||
      (key_argument && mcp_member(line, pt, pf, "arguments", &mf, &mt) &&
       mcp_member(line, mt, mf, key_argument, &f, &t) && present(line, f, t)))
    *keyed = 1;
  return 1;
}

/* ---- tasks ----------------------------------------------------------------
 */

int mcp_task_handle(const char *body, size_t len, char **task_id,
                    int64_t *ttl_ms) {
  json_t *r, *task, *id, *ttl;
  const char *rtype;
  int is = 0;
  *task_id = NULL;
  *ttl_ms = 0;
  /* Most results are no task: told without parsing them. */
  if (!memmem(body, len, "\"taskId\"", 8))
    return 0;
  r = json_loadb(body, len, JSON_DECODE_INT_AS_REAL, NULL);
  if (!r && mcp_has_lone(body, len)) {
    /* A handle holding a lone surrogate (in its status message, say). */
    char *copy = malloc(len);
    if (copy) {
      memcpy(copy, body, len);
      lone_escapes(copy, len, copy);
      r = json_loadb(copy, len, JSON_DECODE_INT_AS_REAL, NULL);
      free(copy);
    }
  }
  task = json_object_get(r, "task");
  rtype = json_string_value(json_object_get(r, "resultType"));
  if (json_is_object(task)) { /* 2025-11-25 */
    id = json_object_get(task, "taskId");
    ttl = json_object_get(task, "ttl");
  } else if (rtype && strcmp(rtype, "task") == 0) { /* 2026-07-28 */
    id = json_object_get(r, "taskId");
    ttl = json_object_get(r, "ttlMs");
  } else {
    id = ttl = NULL;
  }
  if (json_is_string(id) && (*task_id = strdup(json_string_value(id)))) {
    is = 1;
    if (json_is_number(ttl) && json_number_value(ttl) > 0 &&
        json_number_value(ttl) < 9e15)
      *ttl_ms = (int64_t)json_number_value(ttl);
  }
  json_decref(r);
  return is;
}

int mcp_asks_task(json_t *params) {
  json_t *caps = json_object_get(json_object_get(params, "_meta"),
                                 "io.modelcontextprotocol/clientCapabilities");
  return json_is_object(json_object_get(params, "task")) ||
         json_object_get(json_object_get(caps, "extensions"),
                         "io.modelcontextprotocol/tasks") != NULL;
}

void mcp_no_task_message(char *buf, size_t size, const char *key,
                         const char *tool) {
  snprintf(buf, size,
           "idem mcp: key \"%s\" (tool %s) started a task; its result is "
           "the task's handle. Send the call again as a task (params.task, "
           "or with the tasks extension) to get it. Nothing was sent to the "
           "server.",
           key, tool);
}

void mcp_stale_task_message(char *buf, size_t size, const char *key,
                            const char *tool, const char *tenant,
                            const char *why) {
  snprintf(buf, size,
           "idem mcp: key \"%s\" (tool %s) started a task that the server "
           "no longer holds (%s), so the task may or may not have acted. "
           "Nothing was sent to the server. This key is refused until an "
           "operator has checked: `idem keys delete %s --operation %s%s%s` "
           "lets a retry start the call again.",
           key, tool, why, key, tool, *tenant ? " --tenant " : "", tenant);
}

/* The result body with the note appended to its content array as a text
 * block; NULL when it has no content array (or out of memory). */
static char *add_note(const char *body, size_t len, const char *note,
                      size_t *out_len) {
  size_t i = skip_ws(body, len, 0), from, to, last;
  char *block, *text;
  json_t *t;
  if (i >= len || body[i] != '{' ||
      !mcp_member(body, len, i, "content", &from, &to) || body[from] != '[')
    return NULL;
  last = to - 1; /* the array's ']' */
  if (!(t = json_pack("{s:s,s:s}", "type", "text", "text", note)))
    return NULL;
  block = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(t);
  if (!block)
    return NULL;
  if (!empty_array(body, len, from)) {
    /* Joined to the blocks before it. */
    char *joined = malloc(strlen(block) + 2);
    if (joined)
      sprintf(joined, ",%s", block);
    free(block);
    if (!(block = joined))
      return NULL;
  }
  text = mcp_splice(body, len, last, last, block, strlen(block), out_len);
  free(block);
  return text;
}

char *mcp_replay_text(const char *id, const char *body, size_t len,
                      int recovered, const char *note, size_t *out_len) {
  static const char head[] = "{\"jsonrpc\":\"2.0\",\"id\":";
  static const char mid[] = ",\"result\":";
  char ins[128], *noted = NULL;
  size_t at = 0, il = 0, idl = strlen(id), n, nlen;
  char *text, *o;
  if (note && (noted = add_note(body, len, note, &nlen))) {
    body = noted;
    len = nlen;
  }
  /* Made in one buffer: a replay is answered on the client reader's
   * thread, and every copy of the result is on the caller's clock. */
  if (mark_point(body, len, 1, recovered, note != NULL, &at, ins,
                 sizeof ins) == 0)
    il = strlen(ins);
  n = sizeof head - 1 + idl + sizeof mid - 1 + len + il + 1;
  if (!(text = malloc(n + 1))) {
    free(noted);
    return NULL;
  }
  o = text;
  memcpy(o, head, sizeof head - 1);
  o += sizeof head - 1;
  memcpy(o, id, idl);
  o += idl;
  memcpy(o, mid, sizeof mid - 1);
  o += sizeof mid - 1;
  memcpy(o, body, at);
  o += at;
  memcpy(o, ins, il);
  o += il;
  memcpy(o, body + at, len - at);
  o += len - at;
  *o++ = '}';
  *o = '\0';
  *out_len = n;
  free(noted);
  return text;
}

/* ---- --implicit-keys -------------------------------------------------- */

void mcp_implicit_key(const char *fp, char *key) {
  memcpy(key, MCP_IMPLICIT_PREFIX, sizeof MCP_IMPLICIT_PREFIX - 1);
  memcpy(key + sizeof MCP_IMPLICIT_PREFIX - 1, fp, IDEM_FINGERPRINT_SIZE);
}

int mcp_is_implicit(const char *key) {
  return key &&
         strncmp(key, MCP_IMPLICIT_PREFIX, sizeof MCP_IMPLICIT_PREFIX - 1) == 0;
}

void mcp_implicit_note(char *buf, size_t size, int64_t window_ms,
                       const char *offer) {
  char window[32], how[200] = "";
  cli_duration_text(window_ms, window, sizeof window);
  if (offer)
    snprintf(how, sizeof how,
             ", or pass the argument \"%s\" with a new unique value", offer);
  snprintf(buf, size,
           "[idem] This is the result of an earlier call of this tool with "
           "exactly the same arguments (within the last %s); the tool did "
           "not act again. If you intend a new, separate action, call the "
           "tool again with an argument changed%s.",
           window, how);
}

json_t *mcp_error_data(const char *key, const char *tool, const char *what,
                       const char *type) {
  json_t *d =
      json_pack("{s:s,s:s,s:s}", "idem", what, "key", key, "tool", tool);
  if (d && type)
    json_object_set_new(d, "type", json_string(type));
  return d;
}

/* ---- --offer-key-argument ------------------------------------------------
 *
 * The proxy offers the model a key argument of its own: tools/list answers
 * gain it in the inputSchema of each tool that may act, and a call that
 * passes it is keyed by it, the argument removed before the server sees
 * the call. Both are done on the text, as the rest of this file does: a
 * tools/list answer or a call is otherwise passed on byte for byte.
 */

const char mcp_offer_description[] =
    "Idempotency key for this action (optional; handled by the idem proxy, "
    "never seen by the tool). Make up a new unique value, such as a random "
    "UUID, for each action you intend, and pass the same value again when "
    "you retry that same action (after a timeout, an error or a lost "
    "connection): the action is then done once and the retry gets its "
    "result. Never reuse a value for a different action or for other "
    "arguments.";

int mcp_tool_flags(json_t *tool, const char *offer) {
  json_t *ann = json_object_get(tool, "annotations");
  json_t *props =
      json_object_get(json_object_get(tool, "inputSchema"), "properties");
  int flags = 0;
  if (json_is_true(json_object_get(ann, "readOnlyHint")))
    flags |= MCP_TOOL_READ_ONLY | MCP_TOOL_SAFE;
  if (json_is_true(json_object_get(ann, "idempotentHint")))
    flags |= MCP_TOOL_SAFE;
  if (offer && json_is_object(props) && json_object_get(props, offer))
    flags |= MCP_TOOL_DECLARES;
  return flags;
}

int mcp_offered(const char *offer, json_t *params, int *present,
                const char **key) {
  json_t *k = offer
                  ? json_object_get(json_object_get(params, "arguments"), offer)
                  : NULL;
  *present = k != NULL;
  *key = NULL;
  if (!k || json_is_null(k))
    return 0;
  if (!json_is_string(k) ||
      strlen(json_string_value(k)) != json_string_length(k))
    return -1;
  *key = json_string_value(k);
  return 0;
}

/* A growing text. */
typedef struct tbuf {
  char *s;
  size_t len, cap;
  int oom;
} tbuf;

static void tb_add(tbuf *b, const char *s, size_t n) {
  if (b->oom)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = (b->len + n + 1) * 2;
    char *ns = realloc(b->s, cap);
    if (!ns) {
      b->oom = 1;
      return;
    }
    b->s = ns;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

static void tb_str(tbuf *b, const char *s) { tb_add(b, s, strlen(s)); }

/* The JSON string of s (compact), malloc'd. */
static char *json_quote(const char *s) {
  json_t *v = json_string(s);
  char *t = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  json_decref(v);
  return t;
}

char *mcp_offer_tools_list(const char *text, size_t len, json_t *msg,
                           const char *offer, size_t *out_len) {
  json_t *tools = json_object_get(json_object_get(msg, "result"), "tools");
  size_t rf, rt, af, at, i, copied = 0, j = 0;
  char *name = NULL, *desc = NULL, *prop = NULL;
  tbuf b = {0};
  int changed = 0;
  *out_len = 0;
  if (!offer || !json_is_array(tools) ||
      !mcp_member(text, len, 0, "result", &rf, &rt) ||
      !mcp_member(text, rt, rf, "tools", &af, &at) || text[af] != '[')
    return NULL;
  name = json_quote(offer);
  desc = json_quote(mcp_offer_description);
  if (!name || !desc)
    goto out;
  prop = malloc(strlen(name) + strlen(desc) + 40);
  if (!prop)
    goto out;
  sprintf(prop, "%s:{\"type\":\"string\",\"description\":%s}", name, desc);
  i = skip_ws(text, at, af + 1);
  while (i < at && text[i] != ']') {
    size_t end = skip_value(text, at, i), sf, st, pf, pt;
    json_t *t = json_array_get(tools, j++);
    int flags = mcp_tool_flags(t, offer);
    if (t && !(flags & (MCP_TOOL_READ_ONLY | MCP_TOOL_DECLARES)) &&
        text[i] == '{' && mcp_member(text, end, i, "inputSchema", &sf, &st) &&
        text[sf] == '{' && json_is_object(json_object_get(t, "inputSchema"))) {
      size_t ins;
      int empty, wrap;
      if (mcp_member(text, st, sf, "properties", &pf, &pt)) {
        if (text[pf] != '{')
          goto next; /* not a schema the proxy can add to */
        ins = pf + 1;
        wrap = 0;
      } else {
        ins = sf + 1;
        wrap = 1;
      }
      empty = text[skip_ws(text, len, ins)] == '}';
      tb_add(&b, text + copied, ins - copied);
      if (wrap)
        tb_str(&b, "\"properties\":{");
      tb_str(&b, prop);
      if (wrap)
        tb_str(&b, "}");
      if (!empty)
        tb_str(&b, ",");
      copied = ins;
      changed = 1;
    }
  next:
    i = skip_ws(text, at, end);
    if (i < at && text[i] == ',')
      i = skip_ws(text, at, i + 1);
    else
      break;
  }
  if (changed) {
    tb_add(&b, text + copied, len - copied);
    if (!b.oom) {
      *out_len = b.len;
      free(name);
      free(desc);
      free(prop);
      return b.s;
    }
  }
out:
  free(b.s);
  free(name);
  free(desc);
  free(prop);
  return NULL;
}

char *mcp_offer_strip(const char *line, size_t len, const char *offer,
                      const char *key, size_t *out_len) {
  member_span params, args, m;
  size_t p0 = skip_ws(line, len, 0), cut_from, cut_to, mf, mt;
  char *k = NULL;
  tbuf b = {0};
  *out_len = 0;
  if (!find_member(line, len, p0, "params", &params) ||
      !find_member(line, len, params.value, "arguments", &args) ||
      !find_member(line, len, args.value, offer, &m))
    return NULL;
  member_cut(line, len, args.value, &m, &cut_from, &cut_to);
  if (mcp_member(line, params.end, params.value, "_meta", &mf, &mt) &&
      line[mf] != '{')
    return NULL; /* a _meta that is no object: not the proxy's to mend */
  if (key && !(k = json_quote(key)))
    return NULL;
  if (key && mcp_member(line, params.end, params.value, "_meta", &mf, &mt)) {
    /* The key goes where the proxy reads keys first: params._meta (before
     * arguments or after them, as the line has it). */
    size_t ins = mf + 1;
    int empty = line[skip_ws(line, len, ins)] == '}';
    if (ins < cut_from) {
      tb_add(&b, line, ins);
      tb_str(&b, "\"idempotencyKey\":");
      tb_str(&b, k);
      tb_str(&b, empty ? "" : ",");
      tb_add(&b, line + ins, cut_from - ins);
      tb_add(&b, line + cut_to, len - cut_to);
    } else {
      tb_add(&b, line, cut_from);
      tb_add(&b, line + cut_to, ins - cut_to);
      tb_str(&b, "\"idempotencyKey\":");
      tb_str(&b, k);
      tb_str(&b, empty ? "" : ",");
      tb_add(&b, line + ins, len - ins);
    }
  } else if (key) {
    /* params is an object (it has arguments): a _meta of its own. */
    size_t ins = params.value + 1;
    tb_add(&b, line, ins);
    tb_str(&b, "\"_meta\":{\"idempotencyKey\":");
    tb_str(&b, k);
    tb_str(&b, "},");
    tb_add(&b, line + ins, cut_from - ins);
    tb_add(&b, line + cut_to, len - cut_to);
  } else {
    tb_add(&b, line, cut_from);
    tb_add(&b, line + cut_to, len - cut_to);
  }
  free(k);
  if (b.oom || !b.s) {
    free(b.s);
    return NULL;
  }
  *out_len = b.len;
  return b.s;
}

json_t *mcp_key_required(const char *tool, const char *offer,
                         const char *key_argument, char *msg, size_t size) {
  const char *shown = tool ? tool : "?";
  /* The name cut between two characters: the message must stay UTF-8. */
  int cut = (int)cli_utf8_cut(shown, 200);
  if (offer) {
    /* The model can act on this: an argument it passes, not a place in
     * the request it never sees. */
    snprintf(msg, size,
             "idem mcp: tool \"%.*s\" needs an idempotency key: it is not "
             "annotated readOnlyHint or idempotentHint, so a retry could act "
             "twice. Call it again with the argument \"%s\" set to a new "
             "unique value (a random UUID, say) made up for this action, and "
             "pass that same value on every retry of this action; a "
             "different action needs a different value. Nothing was sent to "
             "the server: the tool has not acted.",
             cut, shown, offer);
    return json_pack("{s:s,s:s?,s:s}", "idem", "key_required", "tool", tool,
                     "keyArgument", offer);
  }
  snprintf(msg, size,
           "idem mcp: tool \"%.*s\" needs an idempotency key: it is not "
           "annotated readOnlyHint or idempotentHint in tools/list, so a "
           "retry could act twice. Put a new key in "
           "params._meta.idempotencyKey%s%s%s (one key per intended action, "
           "created before the first attempt and sent again unchanged on "
           "every retry of it). Nothing was sent to the server.",
           cut, shown, key_argument ? " or in the tool argument \"" : "",
           key_argument ? key_argument : "", key_argument ? "\"" : "");
  return json_pack("{s:s,s:s?}", "idem", "key_required", "tool", tool);
}
