#!/usr/bin/env node
// jwt_tool.mjs -- a signer of JSON Web Tokens for the tests of
// --principal jwt, with node's built-in crypto alone (no npm package, so
// that the shell tests need nothing installed).
//
//   node jwt_tool.mjs keys DIR
//       writes DIR/rsa.pem, DIR/ec.pem and DIR/ed.pem (private keys, PKCS#8)
//       and DIR/jwks.json, their public keys as a JWK Set with kids "rsa1",
//       "ec1" and "ed1" and their alg (RS256, ES256, EdDSA).
//   node jwt_tool.mjs sign DIR KID CLAIMS
//       prints a compact JWS of the JSON object CLAIMS, signed with the
//       private key of DIR that jwks.json lists under KID, with the
//       algorithm of its type (RS256, ES256, EdDSA).
//   node jwt_tool.mjs forge TOKEN
//       prints TOKEN with one bit of its signature flipped: a token whose
//       signature must not verify.
//
// Exit status 0, or 2 with a message on stderr for a bad command line.
import { generateKeyPairSync, createPrivateKey, sign } from "node:crypto";
import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";

// Each key type: its file, its kid in the set, and how JWS signs with it.
// ES256 signatures are r || s (ieee-p1363), not DER (RFC 7518, 3.4).
const TYPES = {
  RSA: { file: "rsa.pem", kid: "rsa1", alg: "RS256", digest: "sha256" },
  EC: { file: "ec.pem", kid: "ec1", alg: "ES256", digest: "sha256",
        dsaEncoding: "ieee-p1363" },
  OKP: { file: "ed.pem", kid: "ed1", alg: "EdDSA", digest: null },
};

function die(msg) {
  process.stderr.write(`jwt_tool: ${msg}\n`);
  process.exit(2);
}

const b64url = (buf) => Buffer.from(buf).toString("base64url");

function keys(dir) {
  mkdirSync(dir, { recursive: true });
  const pairs = {
    RSA: generateKeyPairSync("rsa", { modulusLength: 2048 }),
    EC: generateKeyPairSync("ec", { namedCurve: "P-256" }),
    OKP: generateKeyPairSync("ed25519"),
  };
  const set = [];
  for (const [kty, { publicKey, privateKey }] of Object.entries(pairs)) {
    const t = TYPES[kty];
    writeFileSync(join(dir, t.file),
      privateKey.export({ type: "pkcs8", format: "pem" }), { mode: 0o600 });
    set.push({ ...publicKey.export({ format: "jwk" }), kid: t.kid,
               alg: t.alg, use: "sig" });
  }
  writeFileSync(join(dir, "jwks.json"), JSON.stringify({ keys: set }) + "\n");
}

function signToken(dir, kid, claimsText) {
  let claims;
  try {
    claims = JSON.parse(claimsText);
  } catch (e) {
    die(`CLAIMS is not JSON: ${e.message}`);
  }
  if (claims === null || typeof claims !== "object" || Array.isArray(claims))
    die("CLAIMS must be a JSON object");
  const set = JSON.parse(readFileSync(join(dir, "jwks.json"), "utf8"));
  const jwk = set.keys.find((k) => k.kid === kid);
  if (!jwk)
    die(`no key of ${dir}/jwks.json has kid "${kid}"`);
  const t = TYPES[jwk.kty];
  if (!t)
    die(`kid "${kid}" is a key of type ${jwk.kty}, which this tool cannot sign with`);
  const key = createPrivateKey(readFileSync(join(dir, t.file)));
  const header = { alg: t.alg, typ: "JWT", kid };
  const input = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
  const opts = t.dsaEncoding ? { key, dsaEncoding: t.dsaEncoding } : key;
  const sig = sign(t.digest, Buffer.from(input), opts);
  return `${input}.${b64url(sig)}`;
}

function forge(token) {
  const parts = token.split(".");
  if (parts.length !== 3 || parts[2] === "")
    die("TOKEN is not a compact JWS (three parts, a signature)");
  const sig = Buffer.from(parts[2], "base64url");
  // A bit in the middle: the length, and so the form, stays the same.
  sig[sig.length >> 1] ^= 0x01;
  parts[2] = b64url(sig);
  return parts.join(".");
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "keys" && args.length === 1) {
  keys(args[0]);
} else if (cmd === "sign" && args.length === 3) {
  process.stdout.write(signToken(args[0], args[1], args[2]) + "\n");
} else if (cmd === "forge" && args.length === 1) {
  process.stdout.write(forge(args[0]) + "\n");
} else {
  die("usage: jwt_tool.mjs keys DIR | sign DIR KID CLAIMS | forge TOKEN");
}
