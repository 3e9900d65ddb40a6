/*
 * mcp_null.c -- the floor of bench/mcp.sh's replays: a stdio MCP "server"
 * that does the least any answer from memory needs. It reads a
 * newline-delimited JSON-RPC request, copies its numeric id, and writes a
 * fixed answer: an initialize result, or the echo tool's result for
 * "hello" marked as a replay (as idem marks one), so that
 * bench/mcp_client.mjs takes it as a replay. Notifications get no answer.
 * No JSON parser, no thread, no store: the cost left is the round trip
 * between two processes through their pipes.
 *
 *   cc -std=c11 -O2 -o mcp_null mcp_null.c
 */
#include <stdio.h>
#include <string.h>

static const char init_result[] =
    "{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{\"tools\":{}},"
    "\"serverInfo\":{\"name\":\"null\",\"version\":\"1\"}}";
static const char call_result[] =
    "{\"content\":[{\"type\":\"text\",\"text\":\"Echo: hello\"}],"
    "\"_meta\":{\"idem/replayed\":true}}";

int main(void) {
  static char line[1 << 16];
  while (fgets(line, sizeof line, stdin)) {
    const char *id = strstr(line, "\"id\":");
    size_t n;
    if (!id)
      continue; /* a notification */
    id += 5;
    n = strspn(id, "0123456789");
    if (n == 0)
      continue;
    printf("{\"jsonrpc\":\"2.0\",\"id\":%.*s,\"result\":%s}\n", (int)n, id,
           strstr(line, "\"initialize\"") ? init_result : call_result);
    fflush(stdout);
  }
  return 0;
}
