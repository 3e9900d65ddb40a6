/*
 * seal.h -- sealed responses and requests (AES-256-GCM), see
 * idem_store_seal() in idem.h and "Sealed answers" in docs/design.md.
 *
 * The engine seals on the way into a backend and opens on the way out to
 * a caller: backends, their replay caches and their checksums only ever
 * see what is stored. A sealed response keeps its status in clear; its
 * meta is the marker below, which names the key, and its body is
 *
 *   nonce (12) || AES-256-GCM(u32 BE meta_len || meta || body) || tag (16)
 *
 * with the additional data tenant NUL operation NUL key NUL status (in
 * decimal), so that a sealed answer put on another record, or given
 * another status, does not open. A sealed request is the marker, then the
 * nonce, ciphertext and tag, with "request" in place of the status.
 */
#ifndef IDEM_SEAL_H
#define IDEM_SEAL_H

#include "store.h"

/* The marker's fixed start: a NUL first, which no JSON text has. */
#define IDEM__SEAL_MARK "\0idem-sealed:v1:"
#define IDEM__SEAL_MARK_LEN 16
/* The marker and the key id in hex: a sealed response's whole meta. */
#define IDEM__SEAL_META_LEN (IDEM__SEAL_MARK_LEN + 16)
#define IDEM__SEAL_NONCE_LEN 12
#define IDEM__SEAL_TAG_LEN 16
/* How much larger a sealed response is than its plaintext (meta plus
 * body): the marker, the nonce, the meta's length and the tag. */
#define IDEM__SEAL_OVERHEAD                                                    \
  (IDEM__SEAL_META_LEN + IDEM__SEAL_NONCE_LEN + 4 + IDEM__SEAL_TAG_LEN)

/* A handle's keys: keys[0] seals, any of them opens. */
struct idem__seal {
  size_t n;
  unsigned char (*keys)[IDEM_SEAL_KEY_SIZE];
  char (*ids)[17];
};

/* Forgets the keys (their bytes are cleared first). NULL is a no-op. */
void idem__seal_free(struct idem__seal *s);

/* Whether meta is a sealed response's marker (exactly, with a key id of 16
 * lowercase hex digits); kid (may be NULL) gets the key id. */
int idem__seal_marked(const void *meta, size_t meta_len, char kid[17]);

/* Whether meta begins like the marker: a plaintext response whose meta
 * does is refused, since every reader would take it for a sealed one. */
int idem__seal_marker_prefix(const void *meta, size_t meta_len);

/*
 * Seals in with the handle's first key for the record id: *out points into
 * *buf, the caller's to free(). IDEM_OK, or IDEM_ENOMEM / IDEM_EIO (no
 * random bytes) with the detail set.
 */
int idem__seal_response(const struct idem__seal *s, const char *tenant,
                        const char *operation, const char *key,
                        const idem_response *in, idem_response *out,
                        void **buf);

/*
 * Opens a sealed response (meta the marker) of the record (tenant,
 * operation, key): *out's meta (NULL when empty) and body point into
 * *buf, the caller's to free(), NUL-terminated each. IDEM_OK;
 * IDEM_ESEALED when the handle lacks the key it names; IDEM_ECORRUPT when
 * it does not open (altered, or moved from another record or status);
 * IDEM_ENOMEM. The detail names the record and the key id.
 */
int idem__seal_open(const struct idem__seal *s, const char *tenant,
                    const char *operation, const char *key, int status,
                    const void *meta, size_t meta_len, const void *body,
                    size_t body_len, idem_response *out, void **buf);

/* A request sealed as above into *out (*out_len bytes, malloc()ed). */
int idem__seal_request(const struct idem__seal *s, const idem_id *id,
                       const void *req, size_t len, void **out,
                       size_t *out_len);

/* Whether a stored request is sealed; kid (may be NULL) gets its key id. */
int idem__seal_request_marked(const void *req, size_t len, char kid[17]);

/* Opens a sealed request into *out (*out_len bytes and a NUL). Codes as
 * idem__seal_open(). */
int idem__seal_open_request(const struct idem__seal *s, const char *tenant,
                            const char *operation, const char *key,
                            const void *req, size_t len, void **out,
                            size_t *out_len);

#endif
