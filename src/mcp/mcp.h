/*
 * mcp.h -- what the files of `idem mcp` share.
 *
 * The proxy has a fixed set of threads, however many keyed calls are in
 * flight. The client reader reads the MCP client's lines from standard
 * input and passes them on; the server reader reads the server's lines and
 * passes them to the client; neither ever waits on the store. A keyed
 * `tools/call` is a struct mcp_call: the client reader answers it from
 * memory when its result is kept there, attaches it to the same call in
 * flight here, or queues it for the store workers, a few threads that
 * claim keys (idem_execute_begin()), forward the claimed calls to the
 * server under ids the proxy owns, and end the records once the server
 * has answered (idem_execute_end()). While a call is at the server the
 * store's scheduler renews its lease: no thread waits for it. The main
 * thread waits for the server, passes signals on, and answers attached
 * retries whose --attach-wait has run out.
 *
 *   mcp_relay.c   lines, and what each direction does with them
 *   mcp_out.c     the two writers, error answers, the main loop's wake-up
 *   mcp_keyed.c   keyed calls: the key, the fingerprint, claim to answer
 *   mcp_request.c what of a line makes a call's record; raw JSON spans
 *   mcp_cache.c   stored results kept in memory for replays
 *   mcp_child.c   the server process: start, signals, end
 *   cmd_mcp.c     options, start-up and shut-down
 */
#ifndef IDEM_MCP_H
#define IDEM_MCP_H

#include "../cli.h"

#include <jansson.h>
#include <pthread.h>
#include <sys/types.h>

/*
 * The JSON-RPC error codes the proxy answers with. Outside JSON-RPC's
 * reserved range (-32768..-32000), where the SDKs have their own (-32001 is
 * their request timeout): from idem 0.3 on, never renumbered.
 */
enum {
  MCP_E_CONFLICT = -31901,      /* key used with other arguments */
  MCP_E_IN_FLIGHT = -31902,     /* the same call is still running */
  MCP_E_UNKNOWN = -31903,       /* an earlier attempt's outcome is unknown */
  MCP_E_STORE = -31904,         /* the store is unavailable or busy */
  MCP_E_KEY_REQUIRED = -31905,  /* --require-key: this tool needs a key */
  MCP_E_BAD_KEY = -31906,       /* the key is not a valid key */
  MCP_E_SERVER_EXITED = -31907, /* the server exited; nothing was sent */
  MCP_E_INTERNAL = -31908,      /* the proxy failed; nothing was sent */
  MCP_E_BATCH = -31909          /* a keyed tools/call inside a batch */
};

typedef struct mcp_opts {
  const char *store, *tenant, *key_argument;
  /* --offer-key-argument NAME: added to tools/list's write tools, read as
   * the key and removed from the arguments the server sees (unless the
   * tool's own schema declares it). */
  const char *offer_key_argument;
  int require_key;
  /* --implicit-keys WINDOW: an unkeyed call of a tool that may act is keyed
   * by its tool and canonical arguments (mcp_implicit_key()), its result
   * kept for WINDOW; 0: off. */
  int64_t implicit_ms;
  /* --keyed-cancel pass: a client's cancellation of a keyed call goes on
   * to the server, which has --cancel-wait to confirm it (answer an
   * error: the key is released) or to answer; else the key is marked
   * unknown. Without it the call goes on and its answer is recorded. */
  int cancel_pass;
  int64_t cancel_wait_ms;
  int on_unknown_fail;
  int store_tool_errors; /* --store-tool-errors yes (the default) */
  int keep_requests;     /* --keep-requests: arguments kept in records */
  int64_t lease_ms, retention_ms, shutdown_wait_ms, attach_wait_ms;
  int64_t input_wait_ms; /* how long a call that asked for input is held */
  /* --drain-wait: once the client's input ends, how long keyed calls in
   * flight may still run (and be recorded) before the server's input is
   * closed; 0: closed at once. */
  int64_t drain_wait_ms;
  size_t max_result;
  char **cmd;
  /* --listen HOST:PORT: Streamable HTTP in front of --upstream URL
   * (mcp_http.c) instead of a stdio server. */
  const char *listen, *upstream;
  /* --principal (principal.h; --tenant-header H is header:H), and
   * --replay-check upstream|none with its TTL. */
  const char *principal_spec, *jwks, *issuer, *audience;
  char principal_buf[96];
  /* --seal-key FILE, each: the first seals stored results, all open. */
  char *seal_keys[16];
  int n_seal_keys;
  int replay_check; /* -1: by the rule (on for credential and jwt) */
  int64_t replay_check_ttl_ms;
  char listen_buf[64];     /* --listen PORT or :PORT, made 127.0.0.1:PORT */
  const char **allow_origins; /* --allow-origin, each; n_allow_origins */
  int n_allow_origins;
  size_t max_body;
  int64_t call_timeout_ms; /* --call-timeout: 0, none */
} mcp_opts;

/* `idem mcp --listen`: runs until SIGINT or SIGTERM; the exit status. The
 * store is open; it is closed here. */
int mcp_http_run(const mcp_opts *o, idem_store *store);

/* One output stream; writers hold its lock for a whole line. */
typedef struct mcp_out {
  pthread_mutex_t lock;
  int fd;     /* -1 once closed */
  int broken; /* a write failed: the reader is gone */
} mcp_out;

/* Writes line and a newline in one locked step; 0, or -1 when the stream is
 * closed or broken. */
int mcp_out_line(mcp_out *out, const char *line, size_t len);
/* Writes a JSON value as one compact line. */
int mcp_out_json(mcp_out *out, json_t *msg);
/* Writes data, and a newline when nl, with out's lock held by the caller. */
int mcp_out_locked(mcp_out *out, const char *data, size_t len, int nl);

/* A request that waits for a keyed call's answer: the call's first
 * request, or a retry attached to it. */
typedef struct mcp_waiter {
  struct mcp_waiter *next;
  char *id;         /* its id as the client wrote it (JSON text) */
  char *match;      /* and as mcp_id_text() writes it */
  int attached;     /* a retry: answered as a replay */
  int64_t deadline; /* attached: when --attach-wait runs out (mono ms) */
} mcp_waiter;

/* CALL_INPUT: the server answered resultType "input_required"; the key
 * stays held for the client's next round of the same call. */
enum { CALL_CLAIM = 0, CALL_SERVER, CALL_INPUT, CALL_END };

/* A keyed call this proxy is handling. */
typedef struct mcp_call {
  struct mcp_call *next;  /* p->calls */
  struct mcp_call *qnext; /* the store workers' queue */
  char *tool, *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *request; /* {name, arguments} without the key */
  size_t request_len;
  char *line;                 /* the first request, as the client wrote it */
  size_t len, id_from, id_to; /* and where its id is in it */
  char sid[64];               /* the id it travels under to the server (JSON) */
  int state;                  /* CALL_* */
  int rounds;                 /* claims asked */
  int64_t wait_until; /* claims answered IN_FLIGHT are asked again until */
  idem_exec *exec;    /* while the key is held */
  idem_call *call;
  mcp_waiter *waiters;
  char *answer; /* the server's answer (CALL_END) */
  size_t answer_len;
  int gone;          /* the server exited without answering */
  int input_expired; /* CALL_INPUT and no next round came: release */
  int sending;   /* a thread is writing it to the server: not freed meanwhile */
  int deferred;  /* ended while sending: queued once the write is done */
  int not_sent;  /* the write failed: the server cannot have acted on it */
  int asks_task; /* the request asks for a task (params.task, or the
                    tasks extension declared) */
  int stale_retry;     /* sent again after a stale task handle: its result is
                          marked recovered */
  int64_t input_until; /* CALL_INPUT: when the next round is waited for */
  int64_t cancel_until; /* --keyed-cancel pass: cancelled at the server,
                           which confirms (or answers) by then */
  int cancel_lost;      /* and it did neither: the outcome is unknown */
} mcp_call;

/* A request whose response the proxy reads on its way: initialize (its
 * capabilities are extended) and tools/list (annotations are learned). */
enum { WATCH_INITIALIZE = 1, WATCH_TOOLS_LIST = 2, WATCH_DISCOVER = 3 };
typedef struct mcp_watch {
  struct mcp_watch *next;
  char *id;
  int kind;
} mcp_watch;

typedef struct mcp_proxy {
  const mcp_opts *o;
  idem_store *store;
  mcp_out to_server, to_client;
  pid_t child;
  int from_server; /* the server's standard output */
  int event_fd;    /* the main loop's wake-up pipe (write end) */
  int detach_fd;   /* mcp_detachable()'s; -1 once detached, or none */

  pthread_mutex_t lock; /* everything below */
  pthread_cond_t cond;  /* keyed calls ended */
  pthread_cond_t work;  /* the store workers' queue */
  mcp_call *calls;      /* keyed calls being handled */
  mcp_call *qhead, *qtail;
  int ncalls;
  unsigned long long next_sid;
  char nonce[24]; /* makes the ids the proxy owns unguessable */
  mcp_watch *watches;
  json_t *tools;   /* tool name -> true when readOnlyHint or idempotentHint */
  json_t *tasks;   /* task id -> when it ends (mono ms; 0: no ttl): the
                      tasks keyed calls made this server process create */
  int server_gone; /* the server's output ended */
  int client_eof;  /* the client's input ended */
  int closing;     /* no new keyed call may start */
  int draining;    /* the client's input ended; keyed calls run to their
                      end (--drain-wait): the main loop is woken as each
                      is settled */
} mcp_proxy;

/* The request id as compact JSON (an integral real as an integer), for
 * matching responses to requests; NULL when id is not a string or number
 * or out of memory. free() it. */
char *mcp_id_text(json_t *id);

/* Parses one line; NULL when it is not JSON (a NUL byte anywhere included;
 * or it uses duplicate names and *dup is set). */
json_t *mcp_parse(const char *line, size_t len, int *dup);

/*
 * A line that mcp_parse() refused, read again from a copy in which each
 * lone surrogate escape ("\ud83d" without its low half: JavaScript's
 * JSON.stringify writes one for a string cut between the halves of a pair,
 * and jansson refuses it) is "\ufffd": the same length, so offsets into
 * the tree's line are the line's. NULL when the line holds none, or is
 * still no JSON (*dup set as by mcp_parse()). The tree is for what the
 * proxy reads of a message (its method, id, key, tool, isError): a string
 * that held a lone surrogate holds U+FFFD there, so the tree is never
 * written out, nor its strings compared with a peer's; what is passed on,
 * stored, replayed and fingerprinted is the line's own text.
 */
json_t *mcp_parse_lone(const char *line, size_t len, int *dup);

/* Whether s[0, n) holds a lone surrogate escape (in a string). */
int mcp_has_lone(const char *s, size_t n);

/*
 * A JSON-RPC error object {code, message}; NULL when out of memory. The
 * proxy's messages quote names of any length into buffers of a fixed size,
 * which snprintf() may have cut inside a character: the message is taken
 * up to its last whole one (cli_utf8_cut()), and, should it still not be
 * UTF-8 (a detail of libidem's that quotes such text), escaped
 * (cli_escape()), so that the encoder never refuses it and leaves the
 * client without an answer.
 */
json_t *mcp_error_object(int code, const char *msg);

/* Adds capabilities.experimental["idem/idempotency"] (where keys go, what
 * a replay is marked with, the proxy's settings) to an initialize or a
 * server/discover result, over stdio and over HTTP alike. 0, or -1 when
 * msg has no result object. */
int mcp_extend_initialize(const mcp_opts *o, json_t *msg);
/* Answers request id with a JSON-RPC error; data may be NULL (stolen). */
void mcp_answer_error(mcp_proxy *p, json_t *id, int code, const char *msg,
                      json_t *data);
/* The same for an id given as JSON text ("null" when NULL). */
void mcp_answer_error_text(mcp_proxy *p, const char *id, int code,
                           const char *msg, json_t *data);

/* The threads of the two directions. */
void *mcp_client_reader(void *arg);
void *mcp_server_reader(void *arg);

/* Wakes the main loop. */
void mcp_notify(mcp_proxy *p);

/*
 * The client reader's part of a keyed call: answers it from a stored result
 * when there is one, else starts the call's thread and waits until the call
 * has been forwarded or answered. msg is the request and line its text;
 * key and tool are borrowed from msg; key_in_argument says the key came
 * from --key-argument (1) or from --offer-key-argument's argument where the
 * tool's schema declares it (2): it is then left out of the fingerprint.
 * key NULL: the call has none, and --implicit-keys gives it one made from
 * its fingerprint (mcp_implicit_key()).
 */
void mcp_keyed_call(mcp_proxy *p, json_t *msg, const char *line, size_t len,
                    const char *key, const char *tool, int key_in_argument);

/*
 * A client line that differs from one answered from memory before only in
 * its id (a plain number or string) is the same keyed call: answered from
 * memory again without being read (mcp_keyed.c says why that is exact).
 * 1 when answered; 0 when the line must go the whole way.
 */
int mcp_keyed_replay_seen(mcp_proxy *p, const char *line, size_t len);

/* Starts the store workers; 0 or -1. */
int mcp_keyed_start(mcp_proxy *p);
/* A notifications/cancelled from the client: 1 when it names a keyed
 * call's request (it is then not passed on as it is: the call goes on at
 * the server, and its answer is recorded; with --keyed-cancel pass, a call
 * at the server that no retry waits for is cancelled there, under the id
 * it travels under), 0 when it passes on. */
int mcp_keyed_cancel(mcp_proxy *p, json_t *msg);
/* An answer from the server: 1 when it was a keyed call's (taken). msg is
 * NULL when the line is not JSON the proxy can read. */
int mcp_keyed_answer(mcp_proxy *p, json_t *msg, const char *line, size_t len);
/* The server's output ended: every call at the server is unanswered. */
void mcp_keyed_server_gone(mcp_proxy *p);
/* The client's input ended and --drain-wait holds the server open: a call
 * that asked for input can have no next round now, and ends (its key is
 * released); each call settled from now on wakes the main loop. Returns
 * the keyed calls still to be settled. */
int mcp_keyed_drain(mcp_proxy *p);
/* The keyed calls not yet settled (claimed, at the server, or being
 * recorded). */
int mcp_keyed_left(mcp_proxy *p);
/* Answers attached retries whose --attach-wait ran out; the milliseconds
 * until the next one does (-1: none). */
int64_t mcp_keyed_tick(mcp_proxy *p);

/*
 * Where the key of a tools/call is: *key the key (borrowed; NULL without
 * one), *in_argument set when it came from the argument named
 * key_argument (--key-argument; may be NULL). Returns 0, or -1
 * when a key is there but is not a string (*key is then NULL).
 */
int mcp_find_key(const char *key_argument, json_t *params, const char **key,
                 int *in_argument);

/*
 * {"name": tool, "arguments": ...}, without the argument named drop (may be
 * NULL): the request a keyed call is fingerprinted by. The arguments are
 * the text of params.arguments in line (a message mcp_parse() read), so
 * that the fingerprint sees the numbers as the client wrote them; {} when
 * there are none. NULL when out of memory; free() it.
 */
char *mcp_request_text(const char *line, size_t line_len, const char *tool,
                       const char *drop, size_t *len);

/* Results kept in memory for replays (mcp_cache.c): put copies the body;
 * get returns 1 with a copy (free() it) when tool, key and fingerprint
 * match an entry whose retention has not ended at now_ms. recovered: the
 * result was stored after a takeover (an earlier attempt may have acted). */
void mcp_cache_put(const char *tool, const char *key, const char *fp,
                   const void *body, size_t len, int recovered,
                   int64_t expires_ms);
int mcp_cache_get(const char *tool, const char *key, const char *fp,
                  int64_t now_ms, char **body, size_t *len, int *recovered);

/* ---- raw JSON text (mcp_request.c) ---------------------------------- */

/* The value of the member called name of the object whose text starts at
 * s[at] (after blanks): 1 with [*from, *to), or 0 when there is none. The
 * text is stepped over, not checked: strings may hold anything. */
int mcp_member(const char *s, size_t n, size_t at, const char *name,
               size_t *from, size_t *to);
/* Whether s[0, n) is an id written plainly: an integer of at most 15
 * digits, or a string of printable ASCII without escapes. Put in the place
 * of the id of a line that mcp_parse() read, it leaves a line that reads
 * the same but for the id (tests/fuzz/fuzz_mcp_call.c checks it). */
int mcp_plain_id(const char *s, size_t n);
/* Whether line is kept (a line without its id's value, which was at at)
 * with [from, to) as its id's value. */
int mcp_same_but_id(const char *kept, size_t kept_len, size_t at,
                    const char *line, size_t len, size_t from, size_t to);
/* s with [from, to) replaced by ins; NULL when out of memory. */
char *mcp_splice(const char *s, size_t n, size_t from, size_t to,
                 const char *ins, size_t ins_len, size_t *out_len);
/* A result object's text with "idem/replayed": true and/or
 * "idem/recovered": true added to its _meta (made when absent); a result
 * that is no object is copied unchanged. NULL when out of memory. */
char *mcp_mark_result(const char *body, size_t len, int replayed, int recovered,
                      size_t *out_len);
/* The stored result body as the answer to request id (JSON text): marked
 * _meta["idem/replayed"], and "idem/recovered" when recovered. With a note
 * (a replay under an implicit key) also _meta["idem/implicit"], and the
 * note added to the result's content as a text block, for the model to
 * read. malloc()ed; NULL when out of memory. */
char *mcp_replay_text(const char *id, const char *body, size_t len,
                      int recovered, const char *note, size_t *out_len);

/* ---- --implicit-keys (mcp_request.c) ---------------------------------- */

/* Keys the proxy makes begin so; a client's own key may not. */
#define MCP_IMPLICIT_PREFIX "idem:implicit:"
/* The implicit key of a call whose fingerprint is fp: the prefix and fp, so
 * that a call sent again with the same tool and arguments (by the same
 * tenant: the record's id holds both) finds the record. key has room for
 * sizeof MCP_IMPLICIT_PREFIX + IDEM_FINGERPRINT_SIZE bytes. */
void mcp_implicit_key(const char *fp, char *key);
/* Whether key is one the proxy made (or a client's that claims to be). */
int mcp_is_implicit(const char *key);
/* What a replay under an implicit key tells the model (at most size bytes):
 * an earlier identical call's result, and how to ask for a new action
 * (offer: --offer-key-argument's name, or NULL). */
void mcp_implicit_note(char *buf, size_t size, int64_t window_ms,
                       const char *offer);
/* error.data of the proxy's own JSON-RPC errors: {"idem": what, "key",
 * "tool"} and "type" when type is not NULL. */
/* --require-key's refusal of an unkeyed call to tool (NULL: unnamed): its
 * message in msg (at most size bytes) and its error.data, a new reference.
 * With offer (--offer-key-argument) it names that argument; else where
 * keys go (key_argument: --key-argument, or NULL). */
json_t *mcp_key_required(const char *tool, const char *offer,
                         const char *key_argument, char *msg, size_t size);
json_t *mcp_error_data(const char *key, const char *tool, const char *what,
                       const char *type);
/* Whether a result body is a task handle: a CreateTaskResult of MCP
 * 2025-11-25 ({"task": {"taskId": ...}}) or a task of the 2026-07-28 tasks
 * extension ({"resultType": "task", "taskId": ...}). 1 with *task_id (free
 * it) and *ttl_ms (0 when none), else 0. A body without "taskId" is told
 * without being parsed. */
int mcp_task_handle(const char *body, size_t len, char **task_id,
                    int64_t *ttl_ms);
/* Whether a tools/call's params ask for a task. */
int mcp_asks_task(json_t *params);
/* The message of the -32602 that a retry gets when the stored result is a
 * task's handle and the retry does not ask for a task. */
void mcp_no_task_message(char *buf, size_t size, const char *key,
                         const char *tool);
/* The message of the -31903 that a retry gets when the stored task handle is
 * stale (why: what makes it so) and the key waits for an operator. */
void mcp_stale_task_message(char *buf, size_t size, const char *key,
                            const char *tool, const char *tenant,
                            const char *why);
/* What the proxy can tell of a tools/call line it cannot parse: *keyed set
 * when a key is present in one of its places, *id_from and *id_to the span of
 * its id (0, 0 when none), *tool the tool name (malloc'd, NULL when it
 * cannot be read). 1 when the line is a tools/call request, 0 otherwise. */
int mcp_scan_call(const char *line, size_t len, const char *key_argument,
                  int *keyed, size_t *id_from, size_t *id_to, char **tool);

/* ---- --offer-key-argument (mcp_request.c) ---------------------------- */

/* What the proxy reads of a tool in tools/list: MCP_TOOL_SAFE when it
 * needs no key under --require-key (readOnlyHint or idempotentHint),
 * MCP_TOOL_READ_ONLY (readOnlyHint: no key argument is offered to it),
 * MCP_TOOL_DECLARES when its inputSchema's properties declare offer (the
 * server's own argument: passed on, as --key-argument's). */
enum { MCP_TOOL_SAFE = 1, MCP_TOOL_READ_ONLY = 2, MCP_TOOL_DECLARES = 4 };
int mcp_tool_flags(json_t *tool, const char *offer);
/* The description the offered argument carries in tools/list. */
extern const char mcp_offer_description[];
/* Whether a tools/call's params.arguments hold offer: *present set when the
 * member is there, *key its value (borrowed; NULL when absent or null).
 * -1 when it is there but no string (or holds U+0000). */
int mcp_offered(const char *offer, json_t *params, int *present,
                const char **key);
/* A tools/list answer (the JSON-RPC message text, msg its parse) with the
 * property offer added to the inputSchema of each tool that is not
 * read-only and does not declare it; NULL when nothing was added (or out
 * of memory): the text then goes on as it is. */
char *mcp_offer_tools_list(const char *text, size_t len, json_t *msg,
                           const char *offer, size_t *out_len);
/* A tools/call line without params.arguments[offer] and, when key is not
 * NULL, with key put in params._meta.idempotencyKey (the _meta made when
 * absent). NULL when there is no such argument, params._meta is there but
 * no object, or out of memory. */
char *mcp_offer_strip(const char *line, size_t len, const char *offer,
                      const char *key, size_t *out_len);

/* The server process. */
int mcp_child_start(char **cmd, int *to_child, int *from_child, pid_t *pid);
/* Installs the handlers that write signal numbers to fd. */
int mcp_signals_install(int fd);
/* The signals passed on to the server. */
int mcp_signal_forwarded(int sig);
/* Over stdio: makes this process the waiter the client knows, and returns
 * 0 in the proxy it forks, with *detach_fd the waiter's (-1: no fork). The
 * waiter passes on signals and exits as the proxy does, or at once when
 * told (mcp_detach()); it never returns. -1 when it cannot fork. */
int mcp_detachable(int *detach_fd);
/* The client's input has ended with keyed calls in flight: the waiter
 * exits now, so that the client stops nobody, and this proxy no longer
 * dies with it. */
void mcp_detach(int detach_fd);

#endif
