/*
 * mcp.h -- what the files of `idem mcp` share.
 *
 * The proxy has three kinds of threads. The client reader reads the MCP
 * client's lines from standard input and passes them to the server in
 * order; the server reader reads the server's lines and passes them to the
 * client. A keyed `tools/call` gets a thread of its own that holds its key
 * through idem_execute() while the call is out at the server: the client
 * reader hands the call over and waits only until it has been forwarded
 * (or answered by the proxy), so everything the client sends later still
 * reaches the server after it, and the server reader hands the matching
 * response to that thread through the table of pending keyed calls.
 *
 *   mcp_relay.c   lines, the two writers, and what each direction does
 *   mcp_keyed.c   keyed calls: the key, the fingerprint, claim to answer
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

/* The JSON-RPC error codes the proxy answers with; never renumbered. */
enum {
  MCP_E_CONFLICT = -32001,      /* key used with other arguments */
  MCP_E_IN_FLIGHT = -32002,     /* the same call is still running */
  MCP_E_UNKNOWN = -32003,       /* an earlier attempt's outcome is unknown */
  MCP_E_STORE = -32004,         /* the store is unavailable or busy */
  MCP_E_KEY_REQUIRED = -32005,  /* --require-key: this tool needs a key */
  MCP_E_BAD_KEY = -32006,       /* the key is not a valid key */
  MCP_E_SERVER_EXITED = -32007, /* the server exited; nothing was sent */
  MCP_E_INTERNAL = -32008,      /* the proxy failed; nothing was sent */
  MCP_E_BATCH = -32009          /* a keyed tools/call inside a batch */
};

typedef struct mcp_opts {
  const char *store, *tenant, *key_argument;
  int require_key;
  int on_unknown_fail;
  int64_t lease_ms, retention_ms, shutdown_wait_ms;
  size_t max_result;
  char **cmd;
} mcp_opts;

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

enum { PENDING_WAITING = 0, PENDING_ANSWERED, PENDING_GONE };

/* A keyed call forwarded to the server and waiting for its response. */
typedef struct mcp_pending {
  struct mcp_pending *next;
  char *id;         /* the request id as compact JSON */
  int wake_fd;      /* an eventfd, written when state changes */
  int state;        /* PENDING_* */
  int cancelled;    /* the client cancelled it; its answer may still come */
  json_t *response; /* the server's message, on ANSWERED */
  char *line;       /* and its line, as the server wrote it */
  size_t len;
} mcp_pending;

/* A request whose response the proxy reads on its way: initialize (its
 * capabilities are extended) and tools/list (annotations are learned). */
enum { WATCH_INITIALIZE = 1, WATCH_TOOLS_LIST = 2 };
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

  pthread_mutex_t lock; /* everything below */
  pthread_cond_t cond;  /* keyed calls handed over or ended */
  mcp_pending *pending;
  mcp_watch *watches;
  json_t *tools;   /* tool name -> true when readOnlyHint or idempotentHint */
  int server_gone; /* the server's output ended */
  int client_eof;  /* the client's input ended */
  int closing;     /* no new keyed call may start */
  int nkeyed;      /* keyed-call threads running */
} mcp_proxy;

/* The request id as compact JSON (an integral real as an integer), for
 * matching responses to requests; NULL when id is not a string or number
 * or out of memory. free() it. */
char *mcp_id_text(json_t *id);

/* Parses one line; NULL when it is not JSON (a NUL byte anywhere included;
 * or it uses duplicate names and *dup is set). */
json_t *mcp_parse(const char *line, size_t len, int *dup);

/* Answers request id with a JSON-RPC error; data may be NULL (stolen). */
void mcp_answer_error(mcp_proxy *p, json_t *id, int code, const char *msg,
                      json_t *data);

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
 * from --key-argument (it is then left out of the fingerprint).
 */
void mcp_keyed_call(mcp_proxy *p, json_t *msg, const char *line, size_t len,
                    const char *key, const char *tool, int key_in_argument);

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
 * match an entry whose retention has not ended at now_ms. */
void mcp_cache_put(const char *tool, const char *key, const char *fp,
                   const void *body, size_t len, int64_t expires_ms);
int mcp_cache_get(const char *tool, const char *key, const char *fp,
                  int64_t now_ms, char **body, size_t *len);

/* The server process. */
int mcp_child_start(char **cmd, int *to_child, int *from_child, pid_t *pid);
/* Installs the handlers that write signal numbers to fd. */
int mcp_signals_install(int fd);
/* The signals passed on to the server. */
int mcp_signal_forwarded(int sig);

#endif
