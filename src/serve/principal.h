/*
 * principal.h -- who a keyed request belongs to (--principal), and whether
 * a replay may go to it now (--replay-check), in idem serve and idem mcp
 * --listen alike.
 *
 * A replay is a release of stored data: it must reach only the principal
 * that made the call, and only while the upstream would still answer that
 * principal. The tenant is derived from the request by one configured rule,
 * each rule's tenants in a namespace of their own, so that no value a
 * client sends under one rule can name a tenant of another:
 *
 *   credential:authorization  "authorization:" SHA-256 of the header (the
 *                             default; the tenants idem has always made)
 *   credential:N1,N2,...      "credential:" SHA-256 of the named headers
 *                             (cookie:NAME: one cookie) that were sent
 *   header:NAME               "header:" and the value a trusted front proxy
 *                             set
 *   jwt                       "jwt:" a hash of the verified issuer, ":" and
 *                             the subject: a refreshed token is the same
 *                             principal
 *   none                      one tenant (idem mcp: --tenant), said
 *                             explicitly
 */
#ifndef IDEM_PRINCIPAL_H
#define IDEM_PRINCIPAL_H

#include <stddef.h>
#include <stdint.h>

#include "jwt.h"
#include "serve.h"

#define PRINCIPAL_MAX_NAMES 8

typedef enum principal_kind {
  PRINCIPAL_CREDENTIAL = 1,
  PRINCIPAL_HEADER,
  PRINCIPAL_JWT,
  PRINCIPAL_NONE
} principal_kind;

typedef struct principal_rule {
  principal_kind kind;
  int n;
  /* Header names (credential:, header:), as given; a credential's
   * "cookie:NAME" is the cookie NAME of the Cookie header. */
  char names[PRINCIPAL_MAX_NAMES][72];
  jwt_verifier *jwt; /* PRINCIPAL_JWT */
} principal_rule;

/*
 * Parses --principal's value into r ("credential:authorization" when
 * spec is NULL). 0, or -1 with why. A jwt rule's verifier is made later
 * (principal_jwt_start()), once --jwks, --issuer and --audience are known.
 */
int principal_parse(const char *spec, principal_rule *r, char *why,
                    size_t size);

/* Makes a jwt rule's verifier; 0, or -1 with why. */
int principal_jwt_start(principal_rule *r, const char *jwks, const char *issuer,
                        const char *audience, char *why, size_t size);

void principal_free(principal_rule *r);

/* The rule as the help and the start-up line say it. */
void principal_describe(const principal_rule *r, char *out, size_t size);
/* Under the rule none every caller is one tenant, and a replay goes to
 * whoever sends its key: said on standard error (as cmd) when the listener
 * (HOST:PORT, listen_is_loopback()) takes more than this machine's own
 * callers. In listen.c, beside listen_is_loopback(). */
void principal_warn_open(const principal_rule *r, const char *cmd,
                         const char *listen);

/* A 401's WWW-Authenticate under rule r, in out: non-zero when the rule
 * reads a bearer credential (jwt, or credential: with Authorization). */
int principal_challenge(const principal_rule *r, char *out, size_t size);

/*
 * The tenant of a keyed request with headers h[0..n) (names in any case,
 * repeated headers as sent): out (at least 300 bytes). 0; or the HTTP
 * status to refuse it with and why, a sentence for the client: 400 when a
 * header the rule reads is repeated or malformed, 401 when the request
 * names no principal under the rule or its token does not verify. none
 * gives fallback.
 */
int principal_tenant(const principal_rule *r, const up_header *h, size_t n,
                     const char *fallback, char *out, size_t size, char *why,
                     size_t why_size);

/*
 * The replay check's cache: whether the upstream said, within ttl_ms, that
 * the caller whose credentials and session hash to id (principal_check_id())
 * may be answered. At most a few thousand entries; the oldest go first.
 */
void principal_check_id(const char *tenant, const up_header *h, size_t n,
                        char id[IDEM_FINGERPRINT_SIZE]);
int principal_check_cached(const char id[IDEM_FINGERPRINT_SIZE]);
void principal_check_passed(const char id[IDEM_FINGERPRINT_SIZE],
                            int64_t ttl_ms);

/* Non-zero for a header a replay check sends on (the caller's credentials
 * and session): every header but hop-by-hop ones, the body's and the
 * key's. */
int principal_check_sends(const char *name);

#endif
