/* cache.c -- the in-process cache of completed records (see cache.h). */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_ENTRIES 4096 /* records kept, first in first out */
#define MAX_ENTRIES (1 << 22)
#define MAX_CACHED_RESPONSE (16 * 1024)

typedef struct slot {
  struct slot *next; /* in its bucket */
  char *id; /* tenant \x1f operation \x1f key */
  size_t id_len;
  char fingerprint[IDEM_FINGERPRINT_SIZE];
  int64_t expires_ms;
  int status;
  int attempt;
  int recovered;
  int has_meta;
  char *data; /* meta then body */
  size_t meta_len, body_len;
} slot;

struct idem__cache {
  pthread_mutex_t mu;
  size_t nentries, nbuckets;
  slot **buckets;
  slot *entries; /* a ring: the next insert reuses entries[oldest] */
  size_t oldest;
};

static size_t make_id(const idem_id *id, char *buf, size_t size) {
  const char *t = id->tenant ? id->tenant : "";
  size_t a = strlen(t), b = strlen(id->operation), k = strlen(id->key);
  if (a + b + k + 2 > size)
    return 0;
  memcpy(buf, t, a);
  buf[a] = '\x1f';
  memcpy(buf + a + 1, id->operation, b);
  buf[a + 1 + b] = '\x1f';
  memcpy(buf + a + b + 2, id->key, k);
  return a + b + k + 2;
}

static size_t hash(const idem__cache *c, const char *p, size_t n) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (size_t i = 0; i < n; i++)
    h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
  return (size_t)(h % c->nbuckets);
}

idem__cache *idem__cache_new(int entries) {
  idem__cache *c;
  if (entries < 0)
    return NULL;
  if (entries == 0)
    entries = DEFAULT_ENTRIES;
  if (entries > MAX_ENTRIES)
    entries = MAX_ENTRIES;
  c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->nentries = (size_t)entries;
  c->nbuckets = 2 * (size_t)entries;
  c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
  c->entries = calloc(c->nentries, sizeof *c->entries);
  if (!c->buckets || !c->entries) {
    free(c->buckets);
    free(c->entries);
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

static void clear(slot *s) {
  free(s->id);
  free(s->data);
  memset(s, 0, sizeof *s);
}

void idem__cache_free(idem__cache *c) {
  if (!c)
    return;
  for (size_t i = 0; i < c->nentries; i++)
    clear(&c->entries[i]);
  pthread_mutex_destroy(&c->mu);
  free(c->buckets);
  free(c->entries);
  free(c);
}

void idem__cache_put(idem__cache *c, const idem_id *id,
                     const char *fingerprint, int64_t expires_ms, int attempt,
                     int recovered, int status, const void *meta,
                     size_t meta_len, const void *body, size_t body_len) {
  char key[3 * 256 + 2];
  size_t n = make_id(id, key, sizeof key);
  slot fresh;
  if (!c || n == 0 || meta_len + body_len > MAX_CACHED_RESPONSE)
    return;
  memset(&fresh, 0, sizeof fresh);
  fresh.id = malloc(n);
  fresh.data = malloc(meta_len + body_len + 1);
  if (!fresh.id || !fresh.data) {
    clear(&fresh);
    return;
  }
  memcpy(fresh.id, key, n);
  fresh.id_len = n;
  memcpy(fresh.fingerprint, fingerprint, IDEM_FINGERPRINT_SIZE);
  fresh.expires_ms = expires_ms;
  fresh.status = status;
  fresh.attempt = attempt;
  fresh.recovered = recovered != 0;
  fresh.has_meta = meta != NULL;
  if (meta_len)
    memcpy(fresh.data, meta, meta_len);
  if (body_len)
    memcpy(fresh.data + meta_len, body, body_len);
  fresh.meta_len = meta_len;
  fresh.body_len = body_len;
  pthread_mutex_lock(&c->mu);
  slot **head = &c->buckets[hash(c, key, n)];
  slot *s, old;
  /* Replace the record's own entry, else the oldest one. */
  for (s = *head; s; s = s->next)
    if (s->id_len == n && memcmp(s->id, key, n) == 0)
      break;
  if (!s) {
    s = &c->entries[c->oldest];
    c->oldest = (c->oldest + 1) % c->nentries;
    if (s->id) {
      slot **p = &c->buckets[hash(c, s->id, s->id_len)];
      while (*p && *p != s)
        p = &(*p)->next;
      if (*p)
        *p = s->next;
    }
    fresh.next = *head;
    *head = s;
  } else {
    fresh.next = s->next;
  }
  old = *s;
  *s = fresh;
  pthread_mutex_unlock(&c->mu);
  clear(&old);
}

void idem__cache_forget(idem__cache *c, const idem_id *id) {
  char key[3 * 256 + 2];
  size_t n;
  slot old;
  if (!c || !(n = make_id(id, key, sizeof key)))
    return;
  memset(&old, 0, sizeof old);
  pthread_mutex_lock(&c->mu);
  for (slot **p = &c->buckets[hash(c, key, n)]; *p; p = &(*p)->next) {
    slot *s = *p;
    if (s->id_len == n && memcmp(s->id, key, n) == 0) {
      /* The ring slot stays where it is, empty, and is reused in turn. */
      *p = s->next;
      old = *s;
      memset(s, 0, sizeof *s);
      break;
    }
  }
  pthread_mutex_unlock(&c->mu);
  clear(&old);
}

int idem__cache_get(idem__cache *c, idem__op *op, int64_t now_ms) {
  char key[3 * 256 + 2];
  size_t n;
  int hit = 0;
  if (!c || !(n = make_id(op->id, key, sizeof key)))
    return 0;
  pthread_mutex_lock(&c->mu);
  slot *s = c->buckets[hash(c, key, n)];
  while (s && !(s->id_len == n && memcmp(s->id, key, n) == 0))
    s = s->next;
  if (s && s->expires_ms > now_ms) {
    idem_call *cl = op->claim;
    if (strcmp(s->fingerprint, op->fingerprint) != 0) {
      cl->outcome = IDEM_CONFLICT;
      cl->attempt = s->attempt;
      cl->recovered = 0;
      hit = 1;
    } else if (idem__claim_set_response(
                   cl, s->status, s->has_meta ? s->data : NULL, s->meta_len,
                   s->data + s->meta_len, s->body_len) == IDEM_OK) {
      cl->outcome = IDEM_REPLAY;
      cl->attempt = s->attempt;
      cl->recovered = s->recovered;
      hit = 1;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return hit;
}
