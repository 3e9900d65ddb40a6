/*
 * mcp_relay.c -- newline-delimited JSON-RPC between the client and the
 * server, unchanged and in order.
 *
 * Every line is parsed (jansson) to see what it is; all but a few pass on
 * as the bytes that came in. What the proxy acts on: from the client, a
 * `tools/call` with a key (mcp_keyed.c), one without a key that
 * --require-key refuses, the requests whose responses it reads (initialize,
 * tools/list) and notifications/cancelled for a keyed call; from the
 * server, the response to a keyed call (handed to the call's thread) and
 * those two watched responses. A line that is not JSON passes unchanged.
 * Requests from the server to the client (sampling, elicitation, roots)
 * and the client's responses to them are a separate id space: they are
 * never matched against the client's requests.
 */
#include "mcp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* Lines up to this size are read whole and parsed; a longer one streams
 * through unparsed. */
#define MCP_MAX_LINE ((size_t)256 * 1024 * 1024)

/* ------------------------------------------------------------------ */
/* Reading lines                                                        */
/* ------------------------------------------------------------------ */

/* open: the line is the input's last and had no newline (it goes on
 * without one). */
typedef void (*line_fn)(mcp_proxy *p, const char *line, size_t len, int open);

/*
 * Reads fd to its end, calling fn once per line (without its newline). A
 * line longer than MCP_MAX_LINE is copied to raw_out as it comes, with the
 * stream's lock held until its end, and not parsed. A last line without a
 * newline is handed over as it is, and marked so that it goes out without
 * one.
 */
static void read_lines(mcp_proxy *p, int fd, line_fn fn, mcp_out *raw_out) {
  size_t cap = 65536, len = 0, scan = 0;
  char *buf = malloc(cap);
  int streaming = 0; /* inside an over-long line, raw_out's lock held */
  if (!buf) {
    cli_error("mcp", "out of memory");
    return;
  }
  for (;;) {
    if (len == cap) {
      size_t ncap = cap * 2;
      char *nb = realloc(buf, ncap);
      if (!nb) {
        cli_error("mcp", "out of memory for a line of %zu bytes", len);
        break;
      }
      buf = nb;
      cap = ncap;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (n == 0)
      break;
    len += (size_t)n;
    size_t start = 0;
    char *nl;
    while ((nl = memchr(buf + scan, '\n', len - scan)) != NULL) {
      size_t end = (size_t)(nl - buf);
      if (streaming) {
        mcp_out_locked(raw_out, buf + start, end - start, 1);
        pthread_mutex_unlock(&raw_out->lock);
        streaming = 0;
      } else {
        fn(p, buf + start, end - start, 0);
      }
      start = scan = end + 1;
    }
    scan = len;
    if (start > 0) {
      memmove(buf, buf + start, len - start);
      len -= start;
      scan = len;
    }
    if (len > MCP_MAX_LINE) {
      if (!streaming) {
        pthread_mutex_lock(&raw_out->lock);
        streaming = 1;
        cli_error("mcp",
                  "a line longer than %zu bytes passes through "
                  "unread",
                  MCP_MAX_LINE);
      }
      mcp_out_locked(raw_out, buf, len, 0);
      len = scan = 0;
    }
  }
  if (streaming) {
    mcp_out_locked(raw_out, buf, len, 0);
    pthread_mutex_unlock(&raw_out->lock);
  } else if (len > 0) {
    fn(p, buf, len, 1);
  }
  free(buf);
}

/* ------------------------------------------------------------------ */
/* Watched requests: initialize and tools/list                          */
/* ------------------------------------------------------------------ */

static void watch_add(mcp_proxy *p, json_t *id, int kind) {
  char *t = mcp_id_text(id);
  mcp_watch *w = t ? calloc(1, sizeof *w) : NULL;
  if (!w) {
    free(t);
    return;
  }
  w->id = t;
  w->kind = kind;
  pthread_mutex_lock(&p->lock);
  w->next = p->watches;
  p->watches = w;
  pthread_mutex_unlock(&p->lock);
}

/* Removes and returns the watch kind for id (0 when none). Called with
 * p->lock held. */
static int watch_take(mcp_proxy *p, const char *id) {
  for (mcp_watch **w = &p->watches; *w; w = &(*w)->next)
    if (strcmp((*w)->id, id) == 0) {
      mcp_watch *d = *w;
      int kind = d->kind;
      *w = d->next;
      free(d->id);
      free(d);
      return kind;
    }
  return 0;
}

int mcp_extend_initialize(const mcp_opts *o, json_t *msg) {
  json_t *result = json_object_get(msg, "result");
  json_t *caps, *exp, *locs, *info;
  if (!json_is_object(result))
    return -1;
  caps = json_object_get(result, "capabilities");
  if (!caps) {
    caps = json_object();
    json_object_set_new(result, "capabilities", caps);
  }
  if (!json_is_object(caps))
    return -1;
  exp = json_object_get(caps, "experimental");
  if (!exp) {
    exp = json_object();
    json_object_set_new(caps, "experimental", exp);
  }
  if (!json_is_object(exp))
    return -1;
  locs = json_pack("[s,s]", "params._meta.idempotencyKey",
                   "params.idempotencyKey");
  for (int i = 0; i < 2; i++) {
    const char *arg = i == 0 ? o->key_argument : o->offer_key_argument;
    char *a = locs && arg ? malloc(strlen(arg) + 20) : NULL;
    if (a) {
      sprintf(a, "params.arguments.%s", arg);
      json_array_append_new(locs, json_string(a));
      free(a);
    }
  }
  info = json_pack("{s:o,s:b,s:s,s:s,s:s,s:I,s:b}", "keyLocations", locs,
                   "requireKey", o->require_key, "onUnknown",
                   o->on_unknown_fail ? "fail" : "forward", "replayedMeta",
                   "idem/replayed", "recoveredMeta", "idem/recovered",
                   "attachWaitMs", (json_int_t)o->attach_wait_ms,
                   "storeToolErrors", o->store_tool_errors);
  if (!info)
    return -1;
  json_object_set_new(info, "keyedCancel",
                      json_string(o->cancel_pass ? "pass" : "hold"));
  if (o->implicit_ms > 0) {
    /* Unkeyed calls of tools that may act are keyed by their arguments. */
    json_object_set_new(info, "implicitKeysMs", json_integer(o->implicit_ms));
    json_object_set_new(info, "implicitMeta", json_string("idem/implicit"));
  }
  json_object_set_new(exp, "idem/idempotency", info);
  return 0;
}

/* Learns which tools need no key, and which declare the offered key
 * argument, from a tools/list result (mcp_tool_flags()). */
static void learn_tools(mcp_proxy *p, json_t *msg) {
  json_t *tools = json_object_get(json_object_get(msg, "result"), "tools");
  size_t i;
  json_t *t;
  if (!json_is_array(tools))
    return;
  pthread_mutex_lock(&p->lock);
  json_array_foreach(tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    int flags = mcp_tool_flags(t, p->o->offer_key_argument);
    if (name &&
        strlen(name) == json_string_length(json_object_get(t, "name")))
      json_object_set_new(p->tools, name, json_integer(flags));
  }
  pthread_mutex_unlock(&p->lock);
}

/* ------------------------------------------------------------------ */
/* Client to server                                                     */
/* ------------------------------------------------------------------ */

static void to_server(mcp_proxy *p, const char *line, size_t len, int open) {
  if (open) {
    /* The client's last bytes had no newline: neither do they now. */
    pthread_mutex_lock(&p->to_server.lock);
    mcp_out_locked(&p->to_server, line, len, 0);
    pthread_mutex_unlock(&p->to_server.lock);
    return;
  }
  mcp_out_line(&p->to_server, line, len);
}

static int tool_flags(mcp_proxy *p, const char *tool) {
  pthread_mutex_lock(&p->lock);
  int flags =
      tool ? (int)json_integer_value(json_object_get(p->tools, tool)) : 0;
  pthread_mutex_unlock(&p->lock);
  return flags;
}

static int tool_needs_key(mcp_proxy *p, const char *tool) {
  return !(tool_flags(p, tool) & MCP_TOOL_SAFE);
}

/* Whether an unkeyed call of tool gets an implicit key (--implicit-keys):
 * unless tools/list annotated the tool readOnlyHint or idempotentHint (a
 * tool never listed may act). */
static int implicit_for(mcp_proxy *p, const char *tool) {
  return p->o->implicit_ms > 0 && tool && tool_needs_key(p, tool);
}

/* Whether the offered key argument of a call of tool is the proxy's own
 * (it is then read as the key and removed): unless the tool's schema, as
 * tools/list last gave it, declares it. A tool never listed declares
 * nothing. */
static int offer_is_ours(mcp_proxy *p, const char *tool) {
  return p->o->offer_key_argument && !(tool_flags(p, tool) & MCP_TOOL_DECLARES);
}

static void refuse_unkeyed(mcp_proxy *p, json_t *id, const char *tool) {
  char msg[1400];
  json_t *data = mcp_key_required(tool, p->o->offer_key_argument,
                                  p->o->key_argument, msg, sizeof msg);
  mcp_answer_error(p, id, MCP_E_KEY_REQUIRED, msg, data);
}

/* What the proxy does with one tools/call from the client: 1 when it
 * answered or took the call, 0 when the line passes on. */
static int client_tools_call(mcp_proxy *p, json_t *msg, const char *line,
                             size_t len) {
  json_t *id = json_object_get(msg, "id");
  json_t *params = json_object_get(msg, "params");
  const char *tool = json_string_value(json_object_get(params, "name"));
  const char *key;
  int in_arg;
  if (!id)
    return 0; /* a notification: nothing to answer */
  if (tool &&
      strlen(tool) != json_string_length(json_object_get(params, "name"))) {
    /* Read as C strings, "t\u0000x" would be tool "t". */
    mcp_answer_error(p, id, -32602,
                     "idem mcp: a tool name may not contain U+0000. Nothing "
                     "was sent to the server.",
                     NULL);
    return 1;
  }
  const char *offered = NULL;
  int present = 0, ours = 0;
  if (p->o->offer_key_argument) {
    ours = offer_is_ours(p, tool);
    if (mcp_offered(p->o->offer_key_argument, params, &present, &offered) !=
        0) {
      char m[400];
      snprintf(m, sizeof m,
               "idem mcp: the argument \"%s\" is the call's idempotency key "
               "and must be a string (1-255 printable ASCII characters). "
               "Nothing was sent to the server.",
               p->o->offer_key_argument);
      mcp_answer_error(p, id, MCP_E_BAD_KEY, m,
                       json_pack("{s:s}", "idem", "bad_key"));
      return 1;
    }
  }
  if (mcp_find_key(p->o->key_argument, params, &key, &in_arg) != 0) {
    mcp_answer_error(p, id, MCP_E_BAD_KEY,
                     "idem mcp: the idempotency key must be a string of "
                     "1-255 printable ASCII characters (0x21-0x7e). Nothing "
                     "was sent to the server.",
                     json_pack("{s:s}", "idem", "bad_key"));
    return 1;
  }
  if (present && !ours && !key && offered) {
    /* The server's own argument: a key as --key-argument's is. */
    key = offered;
    in_arg = 2;
  }
  if (present && ours) {
    /* The proxy's argument: the server never sees it. The key it holds
     * travels in params._meta.idempotencyKey, where the proxy reads it
     * first, so that the line sent on (and kept for replays) is keyed
     * as this one is. */
    size_t slen;
    char *stripped;
    if (!key && offered)
      key = offered;
    if (key && key == offered)
      in_arg = 0; /* read from _meta from now on */
    stripped = mcp_offer_strip(line, len, p->o->offer_key_argument,
                               key && key == offered ? key : NULL, &slen);
    if (!stripped) {
      mcp_answer_error(p, id, MCP_E_INTERNAL,
                       "idem mcp: the call's key argument could not be taken "
                       "out of it (params._meta is not an object, or out of "
                       "memory). Nothing was sent to the server.",
                       json_pack("{s:s}", "idem", "internal"));
      return 1;
    }
    if (!key && implicit_for(p, tool))
      mcp_keyed_call(p, msg, stripped, slen, NULL, tool, 0);
    else if (!key && p->o->require_key && tool_needs_key(p, tool))
      refuse_unkeyed(p, id, tool);
    else if (!key || !tool)
      mcp_out_line(&p->to_server, stripped, slen);
    else
      mcp_keyed_call(p, msg, stripped, slen, key, tool, in_arg);
    free(stripped);
    return 1;
  }
  if (!key && implicit_for(p, tool)) {
    mcp_keyed_call(p, msg, line, len, NULL, tool, 0);
    return 1;
  }
  if (!key) {
    if (p->o->require_key && tool_needs_key(p, tool)) {
      refuse_unkeyed(p, id, tool);
      return 1;
    }
    return 0;
  }
  if (!tool)
    return 0; /* no tool name: the server answers the invalid call */
  mcp_keyed_call(p, msg, line, len, key, tool, in_arg);
  return 1;
}

/* A batch from the client: passes on whole unless a tools/call in it would
 * be handled by the proxy, which answers every request in it then. */
static void client_batch(mcp_proxy *p, json_t *batch, const char *line,
                         size_t len, int open) {
  size_t i;
  json_t *m;
  int refuse = 0;
  json_array_foreach(batch, i, m) {
    const char *method = json_string_value(json_object_get(m, "method"));
    json_t *params = json_object_get(m, "params");
    const char *key;
    int in_arg;
    if (!method || strcmp(method, "tools/call") != 0)
      continue;
    json_t *name = json_object_get(params, "name");
    if (json_is_string(name) &&
        strlen(json_string_value(name)) != json_string_length(name))
      refuse = 1; /* a name holding U+0000 */
    int present = 0;
    const char *offered;
    if (mcp_offered(p->o->offer_key_argument, params, &present, &offered) !=
            0 ||
        present)
      refuse = 1; /* keyed, or an argument the server must not see */
    const char *tool = json_string_value(json_object_get(params, "name"));
    if (mcp_find_key(p->o->key_argument, params, &key, &in_arg) != 0 || key ||
        (p->o->require_key && tool_needs_key(p, tool)) ||
        implicit_for(p, tool))
      refuse = 1;
  }
  if (!refuse) {
    json_array_foreach(batch, i, m) {
      const char *method = json_string_value(json_object_get(m, "method"));
      json_t *id = json_object_get(m, "id");
      if (method && id && strcmp(method, "initialize") == 0)
        watch_add(p, id, WATCH_INITIALIZE);
      else if (method && id && strcmp(method, "tools/list") == 0)
        watch_add(p, id, WATCH_TOOLS_LIST);
    }
    to_server(p, line, len, open);
    return;
  }
  json_t *answers = json_array();
  json_array_foreach(batch, i, m) {
    json_t *id = json_object_get(m, "id");
    if (!id || !json_object_get(m, "method")) {
      /* A notification, or the client's answer to a server's request:
       * nothing to refuse, and nobody would learn it was dropped. */
      const char *method = json_string_value(json_object_get(m, "method"));
      if (method && strcmp(method, "notifications/cancelled") == 0 &&
          mcp_keyed_cancel(p, m))
        continue;
      mcp_out_json(&p->to_server, m);
      continue;
    }
    json_array_append_new(
        answers,
        json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id, "error",
                  "code", MCP_E_BATCH, "message",
                  "idem mcp: a tools/call with an idempotency key (or one "
                  "that --require-key refuses, or --implicit-keys keys) must "
                  "be sent on its own, not "
                  "in a batch. No request of this batch was sent to the "
                  "server (its notifications were)."));
  }
  if (json_array_size(answers) > 0)
    mcp_out_json(&p->to_client, answers);
  json_decref(answers);
}

/*
 * A tools/call the proxy must handle (keyed, or one --require-key would
 * refuse) that jansson refused for its lone surrogate escapes alone
 * ("ok \ud83d": JavaScript's JSON.stringify writes one for a string cut
 * between the halves of a pair). It is read from a mended copy
 * (mcp_parse_lone()) and handled as any tools/call: the line passed on,
 * kept and fingerprinted is the client's own, the escape in it. The tree
 * holds U+FFFD where the line has a lone surrogate, so a call whose id or
 * tool name holds one is refused: its answers could not be matched, and a
 * record's operation is UTF-8. A notifications/cancelled of a keyed call
 * read so stays here, as any. 1 when handled, 0 when the line passes on,
 * -1 when it is not such a call (client_unreadable() goes on).
 */
static int client_lone(mcp_proxy *p, const char *line, size_t len) {
  int dup, done;
  json_t *msg = mcp_parse_lone(line, len, &dup), *params;
  const char *method = json_string_value(json_object_get(msg, "method"));
  size_t f, t, pf, pt;
  if (method && strcmp(method, "notifications/cancelled") == 0 &&
      !json_object_get(msg, "id")) {
    /* Its reason cut between the halves of a pair: a keyed call's
     * cancellation stays here all the same. */
    done = mcp_keyed_cancel(p, msg) ? 1 : -1;
    json_decref(msg);
    return done;
  }
  if (!msg || !json_is_object(msg) || !method ||
      strcmp(method, "tools/call") != 0) {
    json_decref(msg);
    return -1;
  }
  params = json_object_get(msg, "params");
  if (mcp_member(line, len, 0, "id", &f, &t) && mcp_has_lone(line + f, t - f)) {
    char *id = strndup(line + f, t - f);
    mcp_answer_error_text(p, id, -32600,
                          "idem mcp: a request id may not hold a lone "
                          "surrogate. Nothing was sent to the server.",
                          NULL);
    free(id);
    json_decref(msg);
    return 1;
  }
  if (json_is_object(params) && mcp_member(line, len, 0, "params", &pf, &pt) &&
      mcp_member(line, pt, pf, "name", &f, &t) &&
      mcp_has_lone(line + f, t - f)) {
    mcp_answer_error(p, json_object_get(msg, "id"), -32602,
                     "idem mcp: a tool name may not hold a lone surrogate. "
                     "Nothing was sent to the server.",
                     NULL);
    json_decref(msg);
    return 1;
  }
  done = client_tools_call(p, msg, line, len);
  json_decref(msg);
  return done;
}

/*
 * A client line jansson cannot read. Unkeyed traffic passes on byte for
 * byte whatever it holds (a lone surrogate in an argument is legal to
 * JavaScript, and the server may accept it). A tools/call that carries a
 * key, or that --require-key would refuse, is read again with its lone
 * surrogates mended (client_lone()); one that still cannot be read (a
 * number past the double range) is answered here under its own id: a more
 * lenient server could act on it with its key unseen. Names given twice
 * make the proxy and the server read different members, so such a
 * tools/call is refused too. Returns 1 when answered.
 */
static int client_unreadable(mcp_proxy *p, const char *line, size_t len,
                             int dup) {
  size_t f, t;
  char *tool, *id = NULL;
  int keyed, refuse;
  if (!dup && memmem(line, len, "notifications/cancelled", 23) &&
      client_lone(p, line, len) == 1)
    return 1;
  if (!mcp_scan_call(line, len, p->o->key_argument, &keyed, &f, &t, &tool)) {
    if (!dup || !memmem(line, len, "tools/call", 10))
      return 0;
    keyed = 1; /* which method it names depends on who reads it */
  }
  if (!keyed && p->o->offer_key_argument) {
    /* The offered argument: a key, and never the server's to see when it
     * is the proxy's. */
    int k2 = 0;
    size_t f2, t2;
    char *tool2 = NULL;
    mcp_scan_call(line, len, p->o->offer_key_argument, &k2, &f2, &t2, &tool2);
    free(tool2);
    keyed = k2;
  }
  refuse = keyed || dup ||
           ((p->o->require_key || p->o->implicit_ms > 0) &&
            (!tool || tool_needs_key(p, tool)));
  if (refuse && !dup) {
    int done = client_lone(p, line, len);
    if (done >= 0) {
      free(tool);
      return done;
    }
  }
  if (refuse && t > f) {
    json_t *v = json_loadb(line + f, t - f, JSON_DECODE_ANY, NULL);
    if (json_is_string(v) || json_is_number(v)) {
      id = malloc(t - f + 1);
      if (id) {
        memcpy(id, line + f, t - f);
        id[t - f] = '\0';
      }
    }
    json_decref(v);
  }
  if (refuse && dup)
    mcp_answer_error_text(p, id, -32600,
                          "idem mcp: a tools/call naming a member twice is "
                          "not passed on; send each member once",
                          NULL);
  else if (refuse && keyed)
    mcp_answer_error_text(
        p, id, -32700,
        "idem mcp: this keyed tools/call is not JSON the proxy can read "
        "(UTF-8, numbers within the double range), so its key cannot be "
        "honoured; nothing was sent to the server",
        NULL);
  else if (refuse)
    mcp_answer_error_text(
        p, id, MCP_E_KEY_REQUIRED,
        "idem mcp: --require-key: this tools/call has no idempotency key and "
        "its tool cannot be read; nothing was sent to the server",
        json_pack("{s:s}", "idem", "key_required"));
  free(tool);
  free(id);
  return refuse;
}

static void client_line(mcp_proxy *p, const char *line, size_t len, int open) {
  int dup;
  json_t *msg;
  const char *method;
  json_t *id;
  if (!open && mcp_keyed_replay_seen(p, line, len))
    return;
  msg = mcp_parse(line, len, &dup);
  if (!msg) {
    if (!open && client_unreadable(p, line, len, dup))
      return;
    to_server(p, line, len, open);
    return;
  }
  if (json_is_array(msg)) {
    client_batch(p, msg, line, len, open);
    json_decref(msg);
    return;
  }
  method = json_string_value(json_object_get(msg, "method"));
  id = json_object_get(msg, "id");
  if (method && strcmp(method, "tools/call") == 0) {
    if (client_tools_call(p, msg, line, len)) {
      json_decref(msg);
      return;
    }
  } else if (method && id && strcmp(method, "initialize") == 0) {
    watch_add(p, id, WATCH_INITIALIZE);
  } else if (method && id && strcmp(method, "tools/list") == 0) {
    watch_add(p, id, WATCH_TOOLS_LIST);
  } else if (method && id && strcmp(method, "server/discover") == 0) {
    /* MCP 2026-07-28 has no initialize: a client reads the capabilities
     * from server/discover. */
    watch_add(p, id, WATCH_DISCOVER);
  }
  if (method && !id && strcmp(method, "notifications/cancelled") == 0 &&
      mcp_keyed_cancel(p, msg)) {
    /* A keyed call is not cancelled at the server: its answer is awaited
     * and recorded, so that a retry gets it instead of acting again. */
    json_decref(msg);
    return;
  }
  to_server(p, line, len, open);
  json_decref(msg);
}

void *mcp_client_reader(void *arg) {
  mcp_proxy *p = arg;
  read_lines(p, STDIN_FILENO, client_line, &p->to_server);
  pthread_mutex_lock(&p->lock);
  p->client_eof = 1;
  pthread_mutex_unlock(&p->lock);
  mcp_notify(p);
  return NULL;
}

/* ------------------------------------------------------------------ */
/* Server to client                                                     */
/* ------------------------------------------------------------------ */

static void server_line(mcp_proxy *p, const char *line, size_t len, int open) {
  int dup;
  json_t *msg = mcp_parse(line, len, &dup);
  if (!msg && !open &&
      (memmem(line, len, "\"result\"", 8) || memmem(line, len, "\"error\"", 7)) &&
      !memmem(line, len, "\"method\"", 8) &&
      mcp_keyed_answer(p, NULL, line, len))
    return;
  if (msg && json_is_object(msg) && !json_object_get(msg, "method") &&
      (json_object_get(msg, "result") || json_object_get(msg, "error"))) {
    char *id;
    int kind = 0;
    if (mcp_keyed_answer(p, msg, line, len)) {
      json_decref(msg);
      return;
    }
    id = mcp_id_text(json_object_get(msg, "id"));
    if (id) {
      pthread_mutex_lock(&p->lock);
      kind = watch_take(p, id);
      pthread_mutex_unlock(&p->lock);
    }
    free(id);
    if ((kind == WATCH_INITIALIZE || kind == WATCH_DISCOVER) &&
        mcp_extend_initialize(p->o, msg) == 0) {
      mcp_out_json(&p->to_client, msg);
      json_decref(msg);
      return;
    }
    if (kind == WATCH_TOOLS_LIST) {
      learn_tools(p, msg);
      if (p->o->offer_key_argument && !open) {
        /* Each page of the list, as it comes: the offered argument added
         * to the tools that may act. */
        size_t olen;
        char *offered = mcp_offer_tools_list(line, len, msg,
                                             p->o->offer_key_argument, &olen);
        if (offered) {
          mcp_out_line(&p->to_client, offered, olen);
          free(offered);
          json_decref(msg);
          return;
        }
      }
    }
  }
  json_decref(msg);
  if (open) {
    pthread_mutex_lock(&p->to_client.lock);
    mcp_out_locked(&p->to_client, line, len, 0);
    pthread_mutex_unlock(&p->to_client.lock);
    return;
  }
  mcp_out_line(&p->to_client, line, len);
}

void *mcp_server_reader(void *arg) {
  mcp_proxy *p = arg;
  read_lines(p, p->from_server, server_line, &p->to_client);
  /* Every keyed call still at the server will get no answer now. */
  mcp_keyed_server_gone(p);
  mcp_notify(p);
  return NULL;
}
