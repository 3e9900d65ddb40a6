/*
 * mcp_cache.c -- results the proxy has stored or read, kept in memory so
 * that a retry is replayed without reading the store.
 *
 * A completed record does not change until its retention ends (an operator
 * who deletes one is told that processes may replay it from their caches
 * until then, as libidem's own cache does), so an entry is good until the
 * record's retention ends. The cache holds small results only (at most
 * MCP_CACHE_BODY bytes each) in a fixed table of MCP_CACHE_SLOTS, a newer
 * entry taking the place of an older one with the same hash.
 */
#include "mcp.h"

#include <stdlib.h>
#include <string.h>

#define MCP_CACHE_SLOTS 1024
#define MCP_CACHE_BODY (16 * 1024)

typedef struct entry {
  char *tool, *key;
  char fp[IDEM_FINGERPRINT_SIZE];
  char *body;
  size_t len;
  int recovered;
  int64_t expires_ms;
} entry;

static entry slots[MCP_CACHE_SLOTS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned slot_of(const char *tool, const char *key) {
  uint32_t h = 2166136261u;
  for (const char *s = tool; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  h = (h ^ 0xff) * 16777619u;
  for (const char *s = key; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h % MCP_CACHE_SLOTS;
}

void mcp_cache_put(const char *tool, const char *key, const char *fp,
                   const void *body, size_t len, int recovered,
                   int64_t expires_ms) {
  entry e = {NULL, NULL, {0}, NULL, len, recovered, expires_ms};
  if (len > MCP_CACHE_BODY)
    return;
  e.tool = strdup(tool);
  e.key = strdup(key);
  e.body = malloc(len + 1);
  if (!e.tool || !e.key || !e.body) {
    free(e.tool);
    free(e.key);
    free(e.body);
    return;
  }
  memcpy(e.body, body, len);
  e.body[len] = '\0';
  memcpy(e.fp, fp, IDEM_FINGERPRINT_SIZE);
  pthread_mutex_lock(&lock);
  entry *s = &slots[slot_of(tool, key)];
  entry old = *s;
  *s = e;
  pthread_mutex_unlock(&lock);
  free(old.tool);
  free(old.key);
  free(old.body);
}

int mcp_cache_get(const char *tool, const char *key, const char *fp,
                  int64_t now_ms, char **body, size_t *len, int *recovered) {
  int hit = 0;
  *body = NULL;
  *len = 0;
  pthread_mutex_lock(&lock);
  entry *s = &slots[slot_of(tool, key)];
  if (s->tool && strcmp(s->tool, tool) == 0 && strcmp(s->key, key) == 0 &&
      strcmp(s->fp, fp) == 0 && now_ms < s->expires_ms) {
    *body = malloc(s->len + 1);
    if (*body) {
      memcpy(*body, s->body, s->len + 1);
      *len = s->len;
      *recovered = s->recovered;
      hit = 1;
    }
  }
  pthread_mutex_unlock(&lock);
  return hit;
}
