/*
 * jwt.h -- verifies the JSON Web Tokens that name a request's principal
 * (--principal jwt --jwks FILE|URL --issuer ISS --audience AUD, for both
 * `idem serve` and `idem mcp --listen`). The tenant is the token's issuer
 * and subject, so a refreshed token is still the same principal.
 *
 * The module stands alone: OpenSSL 3 checks signatures, jansson parses the
 * token's JSON and the key set, libcurl fetches a key set named by URL. It
 * knows nothing of HTTP servers.
 *
 * Accepted: compact JWS tokens (RFC 7515) signed with RS256, PS256, ES256 or
 * EdDSA (Ed25519), with keys from a JWK Set (RFC 7517) of RSA (2048 bits or
 * more), EC P-256 and OKP Ed25519 public keys. Refused: "none", the HMAC
 * algorithms (HS256 and the like, whose secret would be the public key), any
 * other algorithm, and keys a token brings with it (jwk, jku, x5u, x5c).
 */
#ifndef IDEM_JWT_H
#define IDEM_JWT_H

#include <stddef.h>

/* A verifier: one issuer, one audience, one key set. Opaque. */
typedef struct jwt_verifier jwt_verifier;

/* The longest token taken, in bytes (the text after "Bearer "). */
#define JWT_MAX_TOKEN 16384
/* The largest key set taken, in bytes and in keys. */
#define JWT_MAX_JWKS (1024 * 1024)
#define JWT_MAX_KEYS 100
/* The clock skew forgiven on exp, nbf and iat, in seconds. */
#define JWT_LEEWAY_S 60
/* Key sets named by URL: the refresh period when refresh_s is 0, and the
 * least time between two refreshes asked for by unknown key ids. */
#define JWT_DEFAULT_REFRESH_S 300
#define JWT_KID_REFRESH_MIN_S 10

/*
 * Makes a verifier of tokens from issuer for audience (both compared
 * exactly), with the key set at source: a file path, or an http:// or
 * https:// URL of a JWK Set. The set is loaded now, on the caller's thread.
 *
 * A URL's set is fetched again in a background thread every refresh_s
 * seconds (0: JWT_DEFAULT_REFRESH_S), and soon after a token names a key id
 * the set lacks (at most once per JWT_KID_REFRESH_MIN_S). A refresh that
 * fails keeps the set loaded before and says so on stderr, once per streak
 * of failures. A file is read once.
 *
 * Returns 0 with *out set; the caller frees it with jwt_verifier_free().
 * Returns -1 with *out NULL and a message in err (at most errsize bytes,
 * NUL-terminated) that names the source and what is wrong with it: the
 * file unreadable, the URL unreachable or answering other than 200, the
 * set too large, not JSON, a key malformed, no key usable.
 */
int jwt_verifier_new(const char *source, const char *issuer,
                     const char *audience, int refresh_s, jwt_verifier **out,
                     char *err, size_t errsize);

/*
 * Verifies token, a compact JWS (the text after "Bearer "): its size, its
 * form, its algorithm, its key, its signature, then its claims: iss equal
 * to the issuer, aud (a string or an array of strings) holding the
 * audience, exp not past, nbf and iat (if given) not ahead, each by more
 * than JWT_LEEWAY_S, and sub a non-empty string.
 *
 * Thread-safe: any number of threads may verify at once, also while the
 * key set is being refreshed. Never blocks on the network.
 *
 * Returns 0 with the token's iss and sub copied into iss and sub (each
 * NUL-terminated; a claim that does not fit fails the token rather than
 * being cut, since a cut subject could name another principal). Returns -1
 * with iss and sub empty and, in why, a short sentence that names the check
 * that failed (malformed, algorithm, unknown key id, signature, issuer,
 * audience, expired, not yet valid, subject), fit to send to the client in
 * a 401 problem document: it never quotes the token back.
 */
int jwt_verify(jwt_verifier *v, const char *token, char *iss, size_t iss_size,
               char *sub, size_t sub_size, char *why, size_t why_size);

/* Stops the refresher (an ongoing fetch is cut short) and frees v. NULL is
 * a no-op. No jwt_verify() on v may be running or follow. */
void jwt_verifier_free(jwt_verifier *v);

#endif
