// idem mcp --listen: whose a keyed call is (--principal), whether a replay
// may go to its caller now (--replay-check), and results sealed at rest
// (--seal-key), with the real SDK on both sides: http_server.mjs --auth (a
// server that takes a known X-API-Key or a bearer token it has not
// revoked, and answers anything else 401 with WWW-Authenticate) behind
// the proxy, SDK 1.x clients with their credentials in requestInit
// headers, and hand-made POSTs where a client has no credential or a
// session the server never issued. Each scenario checks the server's side
// effects (/effects) and the ticket ids the callers got: a replay must
// reach only the principal that made the call, and only while the server
// would still answer it.
//
//   1. X-API-Key (--principal credential:x-api-key): no credential is 401,
//      another key is another principal; --principal none replays to
//      anyone (what none says).
//   2. JWT (--principal jwt): a refreshed token (another exp, another key
//      type) is the same principal; forged, expired, misdirected tokens
//      are 401; another subject acts for itself.
//   3. Revocation (credential:authorization, the replay check): a revoked
//      token gets the server's 401, not the result; allowed again, the
//      replay; with a TTL the refusal comes within a bound.
//   4. Sessions: a keyed retry in a session the server never issued gets
//      the server's 404 (and the replay without the check).
//   5. --seal-key: no copy of the result in the store's files; replays;
//      idem keys show needs the key; rotation; a missing key is an error.
//
// IDEM_PRINCIPAL_OLD=1: scenario 1 alone, the --principal options left
// out (for a build that has none: what it does with the same calls).
import { spawn, execFileSync } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { join } from "node:path";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { HERE, IDEM, TMP, check, eq, finish, replayed, text } from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer, waitFor }
  from "./http_lib.mjs";

const OLD = process.env.IDEM_PRINCIPAL_OLD === "1";
const J = JSON.stringify;
const children = new Set();
process.on("exit", () => {
  for (const p of children) try { p.kill("SIGKILL"); } catch { /* gone */ }
});

// http_server.mjs --auth: as http_lib's startServer, plus allow(cred),
// revoke(cred).
async function authServer({ stateless = false } = {}) {
  const args = [join(HERE, "http_server.mjs"), "--port", "0", "--auth"];
  if (stateless) args.push("--stateless");
  const p = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
  children.add(p);
  let out = "";
  let err = "";
  p.stderr.on("data", (d) => { err += d; });
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`http_server --auth: not ready; ${err}`)), 15000);
    p.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening (\d+)/);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    p.on("exit", (c) => { clearTimeout(t); reject(new Error(`http_server --auth exited ${c}: ${err}`)); });
  });
  const base = `http://127.0.0.1:${port}`;
  const post = async (path, body) => (await fetch(base + path, {
    method: "POST", headers: { "content-type": "application/json" },
    body: J(body) })).json();
  const effects = async () => (await fetch(`${base}/effects`)).json();
  return { port, base, url: `${base}/mcp`, stderr: () => err, effects,
    tickets: async () => (await effects()).effects.create_ticket,
    allow: (cred) => post("/auth/allow", { cred }),
    revoke: (cred) => post("/auth/revoke", { cred }) };
}

// The proxy; under IDEM_PRINCIPAL_OLD without the options an old build
// does not know.
const NEW_ONLY = new Set(["--principal", "--jwks", "--issuer", "--audience",
  "--replay-check", "--replay-check-ttl", "--seal-key"]);
function proxy(upstream, store, opts) {
  if (OLD) {
    const kept = [];
    for (let i = 0; i < opts.length; i++) {
      if (NEW_ONLY.has(opts[i])) i++;
      else kept.push(opts[i]);
    }
    opts = kept;
  }
  return startProxy(upstream, join(TMP, store), opts);
}

// A hand-made POST of one JSON-RPC message: {status, headers, messages,
// body}. node's lenient parser reads even a head with bytes a strict one
// refuses (so that a bad header fails its own check, not the request).
function rawPost(url, msg, headers = {}) {
  const body = J(msg);
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const r = request({ host: u.hostname, port: u.port, path: u.pathname,
      method: "POST", insecureHTTPParser: true, headers: {
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "content-length": Buffer.byteLength(body), ...headers } }, (res) => {
      let got = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (got += d));
      res.on("end", () => {
        let messages = [];
        if (/text\/event-stream/.test(res.headers["content-type"] ?? "")) {
          for (const l of got.split(/\r?\n/))
            if (l.startsWith("data:")) try { messages.push(JSON.parse(l.slice(5))); } catch { /* */ }
        } else {
          try { messages = [JSON.parse(got)]; } catch { messages = []; }
        }
        resolve({ status: res.statusCode, headers: res.headers, messages, body: got });
      });
    });
    r.on("error", reject);
    r.end(body);
  });
}
// The server's refusal as it sent it: a JSON body (a client reads the
// answer by its Content-Type).
const jsonType = (r) => /^application\/json/.test(r.headers["content-type"] ?? "");

// A keyed create_ticket as a hand-made POST.
const keyed = (id, key, args = { title: "t" }, name = "create_ticket") => ({
  jsonrpc: "2.0", id, method: "tools/call",
  params: { name, arguments: args, _meta: { idempotencyKey: key } } });
const V = { "mcp-protocol-version": "2025-11-25" };
const ticketIn = (body) => (String(body).match(/ticket-\d+/) ?? [null])[0];
const tk = (r) => r?.result ? text(r.result) : null;
const show = (r) => J(r).slice(0, 600);
// A raw answer that is a JSON-RPC error and carries no ticket.
const refused = (r) => ticketIn(r.body) === null &&
  r.messages.some((m) => m && m.error && typeof m.error.code === "number");
const rawReplay = (r) => r.messages.find((m) => m?.result)?.result;

let id = 100;

async function scenario(name, fn) {
  const t0 = Date.now();
  console.log(`-- ${name}`);
  try { await fn(); } catch (e) {
    check(`${name}: ran to its end`, false, e?.stack ?? String(e));
  }
  console.log(`   ${Date.now() - t0} ms`);
}

// ---------------------------------------------------------------------
await scenario("1. X-API-Key (--principal credential:x-api-key)", async () => {
  const T = (s) => `1 x-api-key: ${s}`;
  const s = await authServer();
  await s.allow("alice-key");
  await s.allow("bob-key");
  const p = await proxy(s.url, "apikey.db", ["--principal", "credential:x-api-key"]);
  const A = await connectHttp(p.url, { headers: { "x-api-key": "alice-key" }, name: "alice" });
  const a1 = await callTool(A, "create_ticket", { title: "t" }, { key: "k-1" });
  eq(T("alice's keyed call acts: ticket-1, not a replay"), ["ticket-1", false],
    [tk(a1), replayed(a1.result)]);
  eq(T("one effect, with alice's key"), [1, "alice-key"],
    [await s.tickets(), (await s.effects()).log[0]?.apiKey]);

  // No credential: alice's session id (known to whoever saw it), or none.
  const n1 = await rawPost(p.url, keyed(id++, "k-1"), { ...V, "mcp-session-id": A.sessionId() });
  eq(T("no credential, alice's session: 401"), 401, n1.status);
  check(T("no credential, alice's session: not alice's result"), refused(n1), n1.body);
  const n2 = await rawPost(p.url, keyed(id++, "k-1"), V);
  eq(T("no credential, no session: 401"), 401, n2.status);
  check(T("no credential, no session: not alice's result"), refused(n2), n2.body);
  // A key the server does not know: its own principal; the server's 401.
  const m1 = await rawPost(p.url, keyed(id++, "k-1"),
    { ...V, "mcp-session-id": A.sessionId(), "x-api-key": "mallory-key" });
  eq(T("an unknown key: the server's 401"), 401, m1.status);
  check(T("an unknown key: the server's WWW-Authenticate"),
    /^Bearer resource_metadata=/.test(m1.headers["www-authenticate"] ?? ""), J(m1.headers));
  check(T("an unknown key: not alice's result"), refused(m1), m1.body);
  check(T("an unknown key: the server's Content-Type"), jsonType(m1), J(m1.headers));
  eq(T("still one effect"), 1, await s.tickets());

  const B = await connectHttp(p.url, { headers: { "x-api-key": "bob-key" }, name: "bob" });
  const b1 = await callTool(B, "create_ticket", { title: "t" }, { key: "k-1" });
  eq(T("bob, same key: his own action, ticket-2, not a replay"), ["ticket-2", false],
    [tk(b1), replayed(b1.result)]);
  eq(T("two effects, the second with bob's key"), [2, "bob-key"],
    [await s.tickets(), (await s.effects()).log[1]?.apiKey]);
  const a2 = await callTool(A, "create_ticket", { title: "t" }, { key: "k-1" });
  eq(T("alice's retry: replayed ticket-1"), ["ticket-1", true], [tk(a2), replayed(a2.result)]);
  const b2 = await callTool(B, "create_ticket", { title: "t" }, { key: "k-1" });
  eq(T("bob's retry: replayed ticket-2"), ["ticket-2", true], [tk(b2), replayed(b2.result)]);
  eq(T("two effects in all"), 2, await s.tickets());
  await A.client.close();
  await B.client.close();
  if (OLD) return;

  // --principal none says the upstream has no per-caller data: one
  // tenant, no replay check (its default under none), so a keyed retry is
  // answered to anyone, even a caller the server itself refuses.
  const q = await proxy(s.url, "apikey-none.db", ["--principal", "none"]);
  const A2 = await connectHttp(q.url, { headers: { "x-api-key": "alice-key" }, name: "alice" });
  const a3 = await callTool(A2, "create_ticket", { title: "t" }, { key: "k-none" });
  eq(T("none: alice acts, ticket-3"), ["ticket-3", false], [tk(a3), replayed(a3.result)]);
  const n3 = await rawPost(q.url, keyed(id++, "k-none"), V);
  eq(T("none: the caller without a credential gets alice's replay (what none means)"),
    [200, "ticket-3", true],
    [n3.status, text(rawReplay(n3)), replayed(rawReplay(n3))]);
  const n4 = await rawPost(q.url, { jsonrpc: "2.0", id: id++, method: "tools/call",
    params: { name: "create_ticket", arguments: { title: "t" } } }, V);
  eq(T("none: the same caller's unkeyed call gets the server's 401"), 401, n4.status);
  eq(T("none: three effects"), 3, await s.tickets());
  await A2.client.close();
});

if (!OLD) {
// ---------------------------------------------------------------------
await scenario("2. JWT (--principal jwt)", async () => {
  const T = (s) => `2 jwt: ${s}`;
  const tool = [join(HERE, "jwt_tool.mjs"), join(HERE, "..", "serve", "jwt_tool.mjs")]
    .find(existsSync);
  const jt = (...a) => execFileSync(process.execPath, [tool, ...a]).toString().trim();
  const dir = join(TMP, "jwt");
  jt("keys", dir);
  const iss = "https://issuer.test";
  const aud = "mcp-upstream";
  const now = Math.floor(Date.now() / 1000);
  const tok = (kid, claims) => jt("sign", dir, kid, J({ iss, aud, ...claims }));
  const alice1 = tok("rsa1", { sub: "alice", exp: now + 600 });
  const alice2 = tok("ec1", { sub: "alice", exp: now + 1800, iat: now + 1 });
  const bob = tok("ed1", { sub: "bob", exp: now + 600 });
  const forged = jt("forge", alice1);
  const expired = tok("rsa1", { sub: "alice", exp: now - 3600 });
  const elsewhere = jt("sign", dir, "rsa1", J({ iss, aud: "another-api", sub: "alice", exp: now + 600 }));
  const s = await authServer();
  const p = await proxy(s.url, "jwt.db", ["--principal", "jwt", "--jwks",
    join(dir, "jwks.json"), "--issuer", iss, "--audience", aud]);
  const as = (t, name) => connectHttp(p.url, { headers: { authorization: `Bearer ${t}` }, name });
  const A1 = await as(alice1, "alice1");
  const r1 = await callTool(A1, "create_ticket", { title: "t" }, { key: "j-1" });
  eq(T("alice (RS256 token) acts: ticket-1"), ["ticket-1", false], [tk(r1), replayed(r1.result)]);
  eq(T("the server saw alice's token"), `Bearer ${alice1}`, (await s.effects()).log[0]?.auth);
  const A2 = await as(alice2, "alice2");
  const r2 = await callTool(A2, "create_ticket", { title: "t" }, { key: "j-1" });
  eq(T("alice refreshed (ES256, another exp): replayed ticket-1"), ["ticket-1", true],
    [tk(r2), replayed(r2.result)]);
  eq(T("one effect"), 1, await s.tickets());

  // The server takes any bearer token it has not revoked: the SDK client
  // with a forged token opens its session, and only the proxy refuses.
  const F = await as(forged, "forger");
  const f1 = await callTool(F, "create_ticket", { title: "t" }, { key: "j-1" });
  check(T("forged token (SDK): HTTP 401, no result"),
    f1.error?.code === 401 && tk(f1) === null, show(f1));
  for (const [what, t] of [["forged", forged], ["expired", expired],
    ["another audience", elsewhere]]) {
    const r = await rawPost(p.url, keyed(id++, "j-1"),
      { ...V, authorization: `Bearer ${t}`, "mcp-session-id": A1.sessionId() });
    eq(T(`${what} token: 401`), 401, r.status);
    check(T(`${what} token: not alice's result`), refused(r) && jsonType(r), r.body);
    eq(T(`${what} token: a bearer challenge, so a client starts its flow`),
      'Bearer realm="idem", error="invalid_token"', r.headers["www-authenticate"]);
  }
  // A new key with a forged token: nothing acts either.
  const f2 = await callTool(F, "create_ticket", { title: "t" }, { key: "j-forged" });
  check(T("forged token, a new key: 401"), f2.error?.code === 401, show(f2));
  eq(T("still one effect"), 1, await s.tickets());

  const B = await as(bob, "bob");
  const b1 = await callTool(B, "create_ticket", { title: "t" }, { key: "j-1" });
  eq(T("bob (EdDSA), same key: his own action, ticket-2"), ["ticket-2", false],
    [tk(b1), replayed(b1.result)]);
  const b2 = await callTool(B, "create_ticket", { title: "t" }, { key: "j-1" });
  eq(T("bob's retry: replayed ticket-2"), ["ticket-2", true], [tk(b2), replayed(b2.result)]);
  const r3 = await callTool(A1, "create_ticket", { title: "t" }, { key: "j-1" });
  eq(T("alice's first token again: replayed ticket-1"), ["ticket-1", true],
    [tk(r3), replayed(r3.result)]);
  eq(T("two effects"), 2, await s.tickets());
  for (const c of [A1, A2, F, B]) await c.client.close();
});

// ---------------------------------------------------------------------
await scenario("3. revocation (credential:authorization, replay check)", async () => {
  const T = (s) => `3 revocation: ${s}`;
  const s = await authServer();
  const p = await proxy(s.url, "revoke.db", ["--principal", "credential:authorization",
    "--replay-check-ttl", "0"]);
  const A = await connectHttp(p.url, { headers: { authorization: "Bearer tA" }, name: "alice" });
  const pings = async () => (await s.effects()).requests.ping ?? 0;
  const r1 = await callTool(A, "create_ticket", { title: "t" }, { key: "r-1" });
  eq(T("alice acts: ticket-1"), ["ticket-1", false], [tk(r1), replayed(r1.result)]);
  const r2 = await callTool(A, "create_ticket", { title: "t" }, { key: "r-1" });
  eq(T("retry: replayed ticket-1"), ["ticket-1", true], [tk(r2), replayed(r2.result)]);
  eq(T("TTL 0: each keyed call pinged the server"), 2, await pings());

  await s.revoke("tA");
  const h = { ...V, authorization: "Bearer tA", "mcp-session-id": A.sessionId() };
  const x = await rawPost(p.url, keyed(id++, "r-1"), h);
  eq(T("revoked: the server's 401"), 401, x.status);
  check(T("revoked: the server's WWW-Authenticate"),
    (x.headers["www-authenticate"] ?? "").startsWith(`Bearer resource_metadata="http://127.0.0.1:${s.port}/`),
    J(x.headers));
  check(T("revoked: the server's body, not the result"),
    refused(x) && /a known X-API-Key or a valid bearer token/.test(x.body), x.body);
  check(T("revoked: the server's Content-Type"), jsonType(x), J(x.headers));
  const r3 = await callTool(A, "create_ticket", { title: "t" }, { key: "r-1" });
  check(T("revoked (SDK client): HTTP 401, no result"),
    r3.error?.code === 401 && tk(r3) === null, show(r3));
  eq(T("revoked: still one effect"), 1, await s.tickets());

  await s.allow("tA");
  const r4 = await callTool(A, "create_ticket", { title: "t" }, { key: "r-1" });
  eq(T("allowed again: replayed ticket-1"), ["ticket-1", true], [tk(r4), replayed(r4.result)]);
  eq(T("one effect"), 1, await s.tickets());
  await A.client.close();

  // A check that passed counts for --replay-check-ttl: a revocation is
  // seen within that bound (waited for, not slept on).
  const q = await proxy(s.url, "revoke-ttl.db", ["--principal", "credential:authorization",
    "--replay-check-ttl", "300ms"]);
  const B = await connectHttp(q.url, { headers: { authorization: "Bearer tT" }, name: "ttl" });
  const t1 = await callTool(B, "create_ticket", { title: "t" }, { key: "r-ttl" });
  eq(T("ttl: acts, ticket-2"), ["ticket-2", false], [tk(t1), replayed(t1.result)]);
  // The same headers as the polls below: their check is the one cached.
  const hb = { ...V, authorization: "Bearer tT", "mcp-session-id": B.sessionId() };
  const t2 = await rawPost(q.url, keyed(id++, "r-ttl"), hb);
  eq(T("ttl: a hand-made retry replays ticket-2"), [200, "ticket-2", true],
    [t2.status, text(rawReplay(t2)), replayed(rawReplay(t2))]);
  await s.revoke("tT");
  const t0 = Date.now();
  const seen = [];
  const last = await waitFor(async () => {
    const r = await rawPost(q.url, keyed(id++, "r-ttl"), hb);
    seen.push(r.status === 200 ? `${text(rawReplay(r))}${replayed(rawReplay(r)) ? " replayed" : ""}`
      : r.status);
    return r.status === 401 ? r : null;
  }, "the revoked token's replay refused (TTL 300ms)", 5000, () => J(seen));
  check(T("ttl: refused within 5 s of the revocation"), last?.status === 401 && refused(last),
    `${Date.now() - t0} ms, ${J(seen)}`);
  check(T("ttl: before that, only the replay of ticket-2"),
    seen.slice(0, -1).every((x) => x === "ticket-2 replayed"), J(seen));
  console.log(`   refused ${Date.now() - t0} ms after the revocation, answers: ${J(seen)}`);
  eq(T("ttl: two effects in all"), 2, await s.tickets());
  await B.client.close();
});

// ---------------------------------------------------------------------
await scenario("4. sessions (a session the server never issued)", async () => {
  const T = (s) => `4 sessions: ${s}`;
  const s = await authServer();
  const p = await proxy(s.url, "sessions.db", ["--principal", "credential:authorization"]);
  const A = await connectHttp(p.url, { headers: { authorization: "Bearer tS" }, name: "alice" });
  const r1 = await callTool(A, "create_ticket", { title: "t" }, { key: "s-1" });
  eq(T("acts in a real session: ticket-1"), ["ticket-1", false], [tk(r1), replayed(r1.result)]);
  const madeUp = randomUUID();
  const h = { ...V, authorization: "Bearer tS", "mcp-session-id": madeUp };
  const x = await rawPost(p.url, keyed(id++, "s-1"), h);
  eq(T("made-up session: the server's 404"), 404, x.status);
  check(T("made-up session: the server's body, not the result"),
    refused(x) && /Session not found/.test(x.body), x.body);
  check(T("made-up session: the server's Content-Type"), jsonType(x), J(x.headers));
  eq(T("one effect"), 1, await s.tickets());
  const r2 = await callTool(A, "create_ticket", { title: "t" }, { key: "s-1" });
  eq(T("in the real session: replayed ticket-1"), ["ticket-1", true], [tk(r2), replayed(r2.result)]);
  // The same store without the check: the made-up session is replayed to.
  const q = await proxy(s.url, "sessions.db", ["--principal", "credential:authorization",
    "--replay-check", "none"]);
  const y = await rawPost(q.url, keyed(id++, "s-1"), h);
  eq(T("--replay-check none: the made-up session gets the replay"), [200, "ticket-1", true],
    [y.status, text(rawReplay(y)), replayed(rawReplay(y))]);
  eq(T("still one effect"), 1, await s.tickets());
  await A.client.close();
});

// ---------------------------------------------------------------------
await scenario("5. sealed results (--seal-key)", async () => {
  const T = (s) => `5 seal: ${s}`;
  const k1 = join(TMP, "k1.key");
  const k2 = join(TMP, "k2.key");
  writeFileSync(k1, randomBytes(32), { mode: 0o600 });
  writeFileSync(k2, randomBytes(32).toString("hex") + "\n", { mode: 0o600 });
  const MARK = `marker-${randomBytes(8).toString("hex")}`;
  const copies = (db) => readdirSync(TMP).filter((f) => f.startsWith(db))
    .map((f) => readFileSync(join(TMP, f)).toString("latin1").split(MARK).length - 1)
    .reduce((a, b) => a + b, 0);
  const s = await startServer({});
  const asks = async () => (await s.effects()).effects.ask;
  const asker = (url) => connectHttp(url, { name: "asker",
    capabilities: { elicitation: { form: {} } },
    handlers: (c) => c.setRequestHandler(ElicitRequestSchema, async () =>
      ({ action: "accept", content: { answer: MARK } })) });
  const ask = (c, key) => callTool(c, "ask", { question: "which?" }, { key, timeout: 15000 });
  const keysShow = (key, ...keys) => {
    try {
      return execFileSync(IDEM, ["keys", "show", key, "--store", join(TMP, "sealed.db"),
        "--operation", "ask", ...keys.flatMap((k) => ["--seal-key", k])],
      { stdio: ["ignore", "pipe", "pipe"] }).toString();
    } catch (e) { return `exit ${e.status}: ${e.stdout}${e.stderr}`; }
  };

  // Unsealed, on another store: the marker is there (the check can see it).
  const u = await proxy(s.url, "plain.db", []);
  const U = await asker(u.url);
  const u1 = await ask(U, "plain-1");
  eq(T("unsealed: the call's answer"), `answer: ${MARK}`, tk(u1));
  check(T("unsealed: the store's files hold the result"), copies("plain.db") > 0,
    readdirSync(TMP).filter((f) => f.startsWith("plain.db")).join(" "));
  await U.client.close();

  const p = await proxy(s.url, "sealed.db", ["--seal-key", k1]);
  const A = await asker(p.url);
  const r1 = await ask(A, "seal-1");
  eq(T("sealed: the call's answer"), [`answer: ${MARK}`, false], [tk(r1), replayed(r1.result)]);
  eq(T("sealed: no copy of the result in the store's files (db, -wal, -shm)"), 0, copies("sealed.db"));
  const r2 = await ask(A, "seal-1");
  eq(T("sealed: the retry replays it"), [`answer: ${MARK}`, true], [tk(r2), replayed(r2.result)]);
  eq(T("two effects (unsealed and sealed)"), 2, await asks());
  const shut = keysShow("seal-1");
  check(T("keys show without the key: sealed, not the result"),
    /sealed with key/.test(shut) && /--seal-key/.test(shut) && !shut.includes(MARK), shut);
  const open = keysShow("seal-1", k1);
  check(T("keys show with the key: the result"), open.includes(MARK), open);
  await A.client.close();
  await p.kill("SIGTERM");

  const p2 = await proxy(s.url, "sealed.db", ["--seal-key", k2, "--seal-key", k1]);
  const A2 = await asker(p2.url);
  const r3 = await ask(A2, "seal-1");
  eq(T("rotated (k2, k1): the old record replays"), [`answer: ${MARK}`, true],
    [tk(r3), replayed(r3.result)]);
  const r4 = await ask(A2, "seal-2");
  eq(T("rotated: a new call acts"), [`answer: ${MARK}`, false], [tk(r4), replayed(r4.result)]);
  eq(T("three effects"), 3, await asks());
  eq(T("rotated: still no copy in the store's files"), 0, copies("sealed.db"));
  const newer = keysShow("seal-2", k1);
  check(T("the new record is sealed with k2: k1 alone does not open it"),
    !newer.includes(MARK), newer);
  check(T("k2 opens it"), keysShow("seal-2", k2).includes(MARK), keysShow("seal-2", k2));
  await A2.client.close();
  await p2.kill("SIGTERM");

  const p3 = await proxy(s.url, "sealed.db", ["--seal-key", k2]);
  const A3 = await asker(p3.url);
  const r5 = await ask(A3, "seal-1");
  check(T("k2 alone: the k1 record is a JSON-RPC error, not a replay"),
    r5.error && typeof r5.error.code === "number" && !r5.result, show(r5));
  console.log(`   k2 alone, the k1 record: ${show(r5)}`);
  eq(T("k2 alone: nothing acted"), 3, await asks());
  const r6 = await ask(A3, "seal-2");
  eq(T("k2 alone: the k2 record replays"), [`answer: ${MARK}`, true], [tk(r6), replayed(r6.result)]);
  await A3.client.close();
});
}

finish();
