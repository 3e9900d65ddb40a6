/*
 * cache.h -- an in-process cache of completed records, for replays.
 *
 * A completed record never changes until its retention ends: no write path
 * touches a completed record (complete, release, mark unknown and resolve
 * all require another state), and only a retention-expired one may be
 * replaced or pruned. A copy taken from a committed read is therefore exact
 * until its expiry, in every process, and a replay or a conflict can be
 * answered from it without a read of the store. The one exception is an
 * operator's idem_delete(): the handle that deletes forgets the record;
 * other handles may replay it until its expiry, as idem.h says. At most a set number of
 * records are kept (4096 by default), the oldest replaced first, and
 * responses over 16 KiB are not cached. A NULL cache is an empty one.
 */
#ifndef IDEM_CACHE_H
#define IDEM_CACHE_H

#include "store.h"

typedef struct idem__cache idem__cache;

/* A cache of at most entries records (0: the default); NULL when entries is
 * negative (no cache) or out of memory. */
idem__cache *idem__cache_new(int entries);
void idem__cache_free(idem__cache *c);

/* Stores a completed record read from the store. */
void idem__cache_put(idem__cache *c, const idem_id *id,
                     const char *fingerprint, int64_t expires_ms, int attempt,
                     int recovered, int status, const void *meta,
                     size_t meta_len, const void *body, size_t body_len);

/* Forgets id's record, which was deleted from the store. */
void idem__cache_forget(idem__cache *c, const idem_id *id);

/*
 * Looks up op's id at time now. On a hit, fills op->claim with REPLAY (the
 * response and the record's recovered mark) or CONFLICT and returns 1; returns 0 on a miss, an expired
 * entry or an allocation failure.
 */
int idem__cache_get(idem__cache *c, idem__op *op, int64_t now_ms);

#endif
