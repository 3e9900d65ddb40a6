// http_edges.mjs -- `idem mcp --listen` against an upstream of the test's
// own that answers as the test tells it (JSON, event streams with CRLF and
// split data lines, HTTP errors, OAuth challenges, a death mid-call), and
// clients that send what attackers send (smuggling framings, huge bodies,
// bad keys). Every scenario counts what reached the upstream and checks the
// identifiers that came back.
import { spawn, spawnSync } from "node:child_process";
import { createServer } from "node:http";
import { connect as netConnect } from "node:net";
import { gzipSync } from "node:zlib";
import { join } from "node:path";
import { IDEM, TMP, check, eq, finish, watchStderr } from "./lib.mjs";

// The test's upstream takes no credential: --principal none, unless the
// test names a rule of its own.
const noRule = (extra) =>
  extra.includes("--principal") || extra.includes("--tenant-header")
    ? [] : ["--principal", "none"];

// ---- the upstream -------------------------------------------------------------

const seen = []; // every request the upstream got: {method, url, headers, body}
let mode = {}; // tool name -> how to answer
let effects = {}; // tool name -> times it acted
let tickets = 0;
let getClosed = 0; // GET streams that ended at the upstream
const hung = []; // requests the upstream never answers
let hungClosed = 0;
const held404 = []; // answers the test lets go
const heldMessages = []; // event streams whose message the test lets go
const sockets = new Set();

function act(name) {
  effects[name] = (effects[name] ?? 0) + 1;
  return ++tickets;
}

const upstream = createServer((req, res) => {
  let body = "";
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    seen.push({ method: req.method, url: req.url, headers: req.headers, body });
    if (req.url.startsWith("/.well-known/oauth-protected-resource")) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ resource: "http://upstream/mcp",
        authorization_servers: ["http://auth.example"] }));
      return;
    }
    if (req.url === "/mcp" && req.method === "GET" && req.headers["x-etag"]) {
      if (req.headers["if-none-match"] === '"v1"') { res.writeHead(304, { etag: '"v1"' }); res.end(); return; }
      res.writeHead(200, { etag: '"v1"', "content-type": "text/plain" }); res.end("v1"); return;
    }
    if (req.url !== "/mcp") { res.writeHead(404); res.end("no"); return; }
    if (req.method === "GET") {
      res.on("close", () => getClosed++);
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n\n");
      return; // held open
    }
    let msg;
    try { msg = JSON.parse(body); } catch {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null,
        error: { code: -32700, message: "Parse error" } }));
      return;
    }
    if (msg.method === "tools/list") {
      // As an event stream, to be read on its way.
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: { tools: [
        { name: "safe_read", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } },
        { name: "t", inputSchema: { type: "object" } }] } })}\n\n`);
      return;
    }
    if (msg.method !== "tools/call") {
      res.writeHead(202); res.end(); return;
    }
    const name = msg.params.name;
    const how = mode[name] ?? "json";
    const session = req.headers["mcp-session-id"];
    const hdrs = session ? { "mcp-session-id": session } : {};
    if (how === "auth" && !req.headers.authorization) {
      res.writeHead(401, { "www-authenticate":
        'Bearer resource_metadata="http://upstream/.well-known/oauth-protected-resource/mcp"' });
      res.end();
      return;
    }
    if (how === "hang" || how === "acthang") { // never answers; tells when the proxy lets go
      if (how === "acthang") act(name);
      hung.push(req);
      res.on("close", () => hungClosed++);
      return;
    }
    if (how === "500") {
      act(name);
      res.writeHead(500, { "content-type": "text/plain", ...hdrs });
      res.end("failed after acting");
      return;
    }
    if (how === "slow404") { // answers once the test says so
      held404.push(() => {
        res.writeHead(404, { "content-type": "application/json", ...hdrs });
        res.end(JSON.stringify({ jsonrpc: "2.0", id: null,
          error: { code: -32001, message: "Session not found" } }));
      });
      mode[name] = "json"; // the next attempt acts
      return;
    }
    if (how === "404") {
      res.writeHead(404, { "content-type": "application/json", ...hdrs });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: null,
        error: { code: -32001, message: "Session not found" } }));
      return;
    }
    if (how === "rpcerror") {
      res.writeHead(200, { "content-type": "application/json", ...hdrs });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: msg.id,
        error: { code: -32602, message: "Unknown tool" } }));
      return;
    }
    if (how === "die") {
      // Acts, says so in a progress event, and dies before the result.
      act(name);
      res.writeHead(200, { "content-type": "text/event-stream", ...hdrs });
      res.write(`event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}\n\n`);
      setImmediate(() => req.socket.destroy());
      return;
    }
    if (how === "mrtr" && !msg.params.inputResponses) {
      // MCP 2026-07-28: the tool needs the user's answer before it acts.
      res.writeHead(200, { "content-type": "application/json", ...hdrs });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: {
        resultType: "input_required", requestState: "st-1",
        inputRequests: { confirm: { method: "elicitation/create",
          params: { message: "Sure?", requestedSchema: { type: "object", properties: {} } } } } } }));
      return;
    }
    if (how === "task") { // MCP 2025-11-25: the call creates a task
      const n = act(name);
      res.writeHead(200, { "content-type": "application/json", ...hdrs });
      res.end(JSON.stringify({ jsonrpc: "2.0", id: msg.id, result: { task: {
        taskId: `task-${n}`, status: "working", ttl: msg.params.task?.ttl ?? 60000,
        createdAt: new Date().toISOString() } } }));
      return;
    }
    const n = act(name);
    const result = { content: [{ type: "text", text: `ticket-${n}` }],
      structuredContent: { id: n } };
    if (how === "held") {
      // A slow tool without progress: the head at once, the message when
      // the test lets it go.
      res.writeHead(200, { "content-type": "text/event-stream", ...hdrs });
      res.flushHeaders();
      heldMessages.push(() => res.end(`event: message\ndata: ${JSON.stringify(
        { jsonrpc: "2.0", id: msg.id, result })}\n\n`));
      return;
    }
    if (how === "sse") {
      // CRLF line ends, a comment, a priming event, an id, and the final
      // response's JSON split over two data lines.
      res.writeHead(200, { "content-type": "text/event-stream", ...hdrs });
      res.write(": keep-alive\r\n\r\nid: 1\r\ndata: \r\n\r\n");
      res.write(`event: message\r\nid: 2\r\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"working"}}\r\n\r\n`);
      const text = JSON.stringify({ jsonrpc: "2.0", id: msg.id, result });
      const cut = text.indexOf(",\"structuredContent\"");
      res.end(`event: message\r\nid: 3\r\ndata: ${text.slice(0, cut)}\r\ndata: ${text.slice(cut)}\r\n\r\n`);
      return;
    }
    const text = JSON.stringify({ jsonrpc: "2.0", id: msg.id, result });
    if (how === "gzip" && /gzip/.test(req.headers["accept-encoding"] ?? "")) {
      res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", ...hdrs });
      res.end(gzipSync(text));
      return;
    }
    res.writeHead(200, { "content-type": "application/json", ...hdrs });
    res.end(text);
  });
});
upstream.on("connection", (s) => { sockets.add(s); s.on("close", () => sockets.delete(s)); });
await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
const UP = upstream.address().port;

// ---- the proxy -------------------------------------------------------------------

async function startProxy(extra = [], store = join(TMP, "edges.db")) {
  const p = spawn(IDEM, ["mcp", "--listen", "127.0.0.1:0", "--upstream",
    `http://127.0.0.1:${UP}/mcp`, "--store", `sqlite:${store}`, ...noRule(extra), ...extra],
  { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  p.stderr.on("data", (d) => (err += d));
  watchStderr(() => err);
  let stopping = false;
  p.on("exit", (c, sig) => {
    if (!stopping) console.error(`proxy exited unasked (${c ?? sig}):\n${err}`);
  });
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`proxy did not start: ${err}`)), 20000);
    p.stderr.on("data", () => {
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    p.on("exit", (c) => { clearTimeout(t); reject(new Error(`proxy exited ${c}: ${err}`)); });
  });
  return { p, port, stderr: () => err, stop: (sig) => { stopping = true; p.kill(sig); } };
}

async function post(port, msg, headers = {}, path = "/mcp") {
  const body = typeof msg === "string" ? msg : JSON.stringify(msg);
  const r = await fetch(`http://127.0.0.1:${port}${path}`, { method: "POST",
    headers: { "content-type": "application/json",
      accept: "application/json, text/event-stream", ...headers }, body });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text };
}

// The JSON-RPC messages of an answer (JSON, or the data of each event).
function messages(r) {
  if ((r.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    return r.text.split(/\r?\n\r?\n/).map((ev) => ev.split(/\r?\n/)
      .filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""))
      .join("\n")).filter((d) => d).map((d) => JSON.parse(d));
  }
  return r.text ? [JSON.parse(r.text)] : [];
}
const final = (r, id) => messages(r).find((m) => m.id === id && !m.method);
const call = (id, name, args, key) => ({ jsonrpc: "2.0", id, method: "tools/call",
  params: { name, arguments: args, ...(key ? { _meta: { idempotencyKey: key } } : {}) } });
const reset = () => { effects = {}; mode = {}; seen.length = 0; };

async function raw(port, bytes) {
  return new Promise((resolve) => {
    const s = netConnect(port, "127.0.0.1");
    let got = "";
    s.on("data", (d) => (got += d));
    s.on("close", () => resolve(got));
    s.on("error", () => resolve(got));
    s.write(bytes);
    setTimeout(() => s.end(), 2000).unref();
  });
}

const px = await startProxy(["--lease", "1s", "--attach-wait", "10s"]);

// 1. An event stream with CRLF, comments, ids and split data lines: the
console.error("-- scenario 1");
// final response is found, passed on and stored; the replay under a new id
// carries the retry's session, not the first's.
{
  reset();
  mode.sse_tool = "sse";
  const a = await post(px.port, call(1, "sse_tool", { t: "a" }, "k-sse"),
    { "mcp-session-id": "S1" });
  const fa = final(a, 1);
  eq("sse: first answer", "ticket-" + fa?.result?.structuredContent?.id, fa?.result?.content?.[0]?.text);
  check("sse: the log event passed on", messages(a).some((m) => m.method === "notifications/message"));
  eq("sse: the session header of the first", "S1", a.headers.get("mcp-session-id"));
  const b = await post(px.port, call("r-2", "sse_tool", { t: "a" }, "k-sse"),
    { "mcp-session-id": "S2" });
  const fb = final(b, "r-2");
  eq("sse: replay same ticket", fa?.result?.structuredContent?.id, fb?.result?.structuredContent?.id);
  eq("sse: replay marked", true, fb?.result?._meta?.["idem/replayed"]);
  check("sse: replay never carries another session's id",
    b.headers.get("mcp-session-id") !== "S1", b.headers.get("mcp-session-id"));
  eq("sse: one effect", 1, effects.sse_tool);
}

// 2. JSON answers; tenants from Authorization (--principal
// credential:authorization): the same key under two credentials is two
// actions, under one credential one; a keyed call with no credential names
// no principal and is refused 401, nothing sent.
console.error("-- scenario 2");
{
  reset();
  const cp = await startProxy(["--principal", "credential:authorization",
    "--replay-check", "none"], join(TMP, "cred.db"));
  const A = { authorization: "Bearer alice" }, B = { authorization: "Bearer bob" };
  const a1 = final(await post(cp.port, call(1, "t", { x: 1 }, "k-ten"), A), 1);
  const b1 = final(await post(cp.port, call(2, "t", { x: 1 }, "k-ten"), B), 2);
  const a2 = final(await post(cp.port, call(3, "t", { x: 1 }, "k-ten"), A), 3);
  const n1 = await post(cp.port, call(4, "t", { x: 1 }, "k-ten"));
  eq("tenants: two effects", 2, effects.t);
  check("tenants: two tickets", a1?.result?.structuredContent?.id !== b1?.result?.structuredContent?.id);
  eq("tenants: alice replayed", a1?.result?.structuredContent?.id, a2?.result?.structuredContent?.id);
  eq("tenants: Authorization forwarded", "Bearer bob", seen[1]?.headers?.authorization);
  eq("tenants: no credential: 401, not alice's replay", [401, false],
    [n1.status, /structuredContent/.test(n1.text)]);
  cp.stop("SIGTERM");
}

// 3. OAuth passes through: the challenge and the metadata, key released.
console.error("-- scenario 3");
{
  reset();
  mode.secure = "auth";
  const r = await post(px.port, call(1, "secure", {}, "k-auth"));
  eq("oauth: 401 passed on", 401, r.status);
  check("oauth: challenge passed on", /resource_metadata=/.test(r.headers.get("www-authenticate") ?? ""));
  const m = await fetch(`http://127.0.0.1:${px.port}/.well-known/oauth-protected-resource/mcp`);
  eq("oauth: metadata passed on", ["http://auth.example"], (await m.json()).authorization_servers);
  const ok = final(await post(px.port, call(2, "secure", {}, "k-auth"), { authorization: "Bearer x" }), 2);
  eq("oauth: after the challenge the call acts", 1, effects.secure);
  eq("oauth: its ticket", "ticket-" + ok?.result?.structuredContent?.id, ok?.result?.content?.[0]?.text);
}

// 4. An HTTP error or a JSON-RPC error did not act: passed on, key freed.
console.error("-- scenario 4");
{
  reset();
  mode.gone = "404";
  const r = await post(px.port, call(1, "gone", {}, "k-404"));
  eq("404: passed on", 404, r.status);
  eq("404: body passed on", -32001, JSON.parse(r.text).error?.code);
  mode.gone = "json";
  const r2 = final(await post(px.port, call(2, "gone", {}, "k-404")), 2);
  eq("404: key freed, the retry acts", 1, effects.gone);
  check("404: and is not a replay", r2?.result && !r2.result._meta, JSON.stringify(r2));
  mode.bad = "rpcerror";
  const e = final(await post(px.port, call(3, "bad", {}, "k-rpc")), 3);
  eq("rpc error: passed on", -32602, e?.error?.code);
  mode.bad = "json";
  final(await post(px.port, call(4, "bad", {}, "k-rpc")), 4);
  eq("rpc error: key freed", 1, effects.bad);
}

// 5. The server dies after acting, mid-stream: the client is told the
console.error("-- scenario 5");
// outcome is unknown, in the stream; a retry after the lease sends it
// again and its result is marked recovered.
{
  reset();
  mode.fragile = "die";
  const r = await post(px.port, call(1, "fragile", { n: 1 }, "k-die"));
  const f = final(r, 1);
  eq("die: unknown", -31903, f?.error?.code);
  check("die: progress passed on first", messages(r).some((m) => m.method === "notifications/progress"));
  mode.fragile = "json";
  let again;
  for (let i = 0; i < 100; i++) { // the lease is 1 s: retried as a client would
    again = final(await post(px.port, call(2 + i, "fragile", { n: 1 }, "k-die")), 2 + i);
    if (!again?.error) break;
    eq("die: in flight until the lease ends", -31902, again.error.code);
  }
  eq("die: recovered", true, again?.result?._meta?.["idem/recovered"]);
  eq("die: two effects (the first may have acted)", 2, effects.fragile);
}

// 5a. What the review found. A server that compresses its answers (the
// SDKs' clients ask for gzip): the proxy asks for none on a keyed call, so
// it can read and record the answer. A 500 after acting holds the key
// (the tool may have acted): the retry after the lease is marked recovered.
// A retry attached to a call whose server answered 404 (nothing acted) is
// sent as its own call, in its own session, never answered with the
// other's session. With --tenant-header, a request without it falls back
// to its credential. A client that leaves before the answer begins ends an
// unkeyed forward. A 304 passed on has no body.
console.error("-- scenario 5a");
{
  reset();
  mode.zip = "gzip";
  const z1 = await post(px.port, call(1, "zip", { z: 1 }, "k-gzip"), { "accept-encoding": "gzip, deflate" });
  const zf = final(z1, 1);
  eq("gzip: the answer", "ticket-" + zf?.result?.structuredContent?.id, zf?.result?.content?.[0]?.text);
  eq("gzip: the proxy asked for no compression", "identity", seen.at(-1)?.headers?.["accept-encoding"]);
  const z2 = final(await post(px.port, call(2, "zip", { z: 1 }, "k-gzip"), { "accept-encoding": "gzip" }), 2);
  eq("gzip: replayed", true, z2?.result?._meta?.["idem/replayed"]);
  eq("gzip: one effect", 1, effects.zip);

  mode.boom = "500";
  const b1 = await post(px.port, call(1, "boom", {}, "k-500"));
  eq("500: passed on", 500, b1.status);
  mode.boom = "json";
  let b2;
  for (let i = 0; i < 100; i++) {
    b2 = final(await post(px.port, call(2 + i, "boom", {}, "k-500")), 2 + i);
    if (!b2?.error) break;
    eq("500: the key is held until its lease ends", -31902, b2.error.code);
  }
  eq("500: the retry after the lease is marked recovered", true, b2?.result?._meta?.["idem/recovered"]);
  eq("500: two effects (the first may have acted)", 2, effects.boom);

  mode.s404 = "slow404";
  const a = post(px.port, call(1, "s404", {}, "k-s404"), { "mcp-session-id": "SA" });
  for (let i = 0; i < 200 && held404.length === 0; i++) await new Promise((r) => setTimeout(r, 25));
  const b = post(px.port, call(2, "s404", {}, "k-s404"), { "mcp-session-id": "SB" });
  await new Promise((r) => setTimeout(r, 200)); // b reaches the proxy and attaches (or not: either way)
  held404.shift()();
  const [ra, rb] = await Promise.all([a, b]);
  eq("404 with a retry attached: the first gets its 404", 404, ra.status);
  eq("404: the first's session on the first's answer", "SA", ra.headers.get("mcp-session-id"));
  const fb = final(rb, 2);
  check("404: the retry acted as its own call", fb?.result?.content !== undefined, rb.text);
  check("404: the retry never gets the first's session", rb.headers.get("mcp-session-id") !== "SA",
    rb.headers.get("mcp-session-id"));
  eq("404: one effect (the retry's)", 1, effects.s404);

  // --tenant-header is --principal header:X-Tenant: a keyed call without
  // the header names no principal (401), whatever its credential.
  const th = await startProxy(["--tenant-header", "X-Tenant"], join(TMP, "th.db"));
  const u1 = await post(th.port, call(1, "tt", {}, "k-th"), { authorization: "Bearer u1" });
  const u2 = final(await post(th.port, call(2, "tt", {}, "k-th"), { "x-tenant": "acme" }), 2);
  const u3 = final(await post(th.port, call(3, "tt", {}, "k-th"), { "x-tenant": "acme", authorization: "Bearer u9" }), 3);
  eq("tenant header absent: 401, nothing sent", [401, -32600], [u1.status, JSON.parse(u1.text)?.error?.code]);
  eq("tenant header: the same tenant replays", true, u3?.result?._meta?.["idem/replayed"]);
  eq("tenant header: one effect", 1, effects.tt);
  th.stop("SIGTERM");

  mode.sleepy = "hang";
  const ctl = new AbortController();
  const gone = fetch(`http://127.0.0.1:${px.port}/mcp`, { method: "POST", signal: ctl.signal,
    headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
    body: JSON.stringify(call(1, "sleepy", {})) }).catch(() => null);
  for (let i = 0; i < 200 && hung.length === 0; i++) await new Promise((r) => setTimeout(r, 25));
  eq("hang: the request reached the upstream", 1, hung.length);
  ctl.abort();
  await gone;
  for (let i = 0; i < 200 && hungClosed === 0; i++) await new Promise((r) => setTimeout(r, 25));
  eq("hang: the client's leaving ended the forward", 1, hungClosed);

  // (On the MCP endpoint: the proxy passes on no other path.)
  const pipelined = await raw(px.port, 'GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Etag: 1\r\nIf-None-Match: "v1"\r\n\r\n' +
    "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Etag: 1\r\n\r\n");
  const parts = pipelined.split(/(?=HTTP\/1\.1 )/);
  check("304: no body, and the next answer read whole", parts.length === 2 &&
    parts[0].startsWith("HTTP/1.1 304") && parts[0].endsWith("\r\n\r\n") &&
    !/transfer-encoding/i.test(parts[0]) && parts[1].startsWith("HTTP/1.1 200") &&
    /\r\n\r\n(2\r\nv1\r\n0\r\n\r\n|v1)$/.test(parts[1]), JSON.stringify(pipelined));
}

// 5b. input_required (MCP 2026-07-28): no outcome; the key stays held for
// the next round, which acts once; a call with other arguments meanwhile is
// a conflict; the retry after the result replays it. With --input-wait 1s
// and no next round, the key is freed.
{
  reset();
  mode.pay = "mrtr";
  const q = final(await post(px.port, call(1, "pay", { amount: 5 }, "k-mrtr")), 1);
  eq("mrtr: the question passed on", "input_required", q?.result?.resultType);
  eq("mrtr: nothing acted yet", undefined, effects.pay);
  const other = final(await post(px.port, call(2, "pay", { amount: 6 }, "k-mrtr")), 2);
  eq("mrtr: the key is held (other arguments: conflict)", -31901, other?.error?.code);
  const round2 = { ...call(3, "pay", { amount: 5 }, "k-mrtr") };
  round2.params.inputResponses = { confirm: { action: "accept", content: {} } };
  round2.params.requestState = "st-1";
  const done = final(await post(px.port, round2), 3);
  eq("mrtr: the next round acts", 1, effects.pay);
  eq("mrtr: its ticket", "ticket-" + done?.result?.structuredContent?.id, done?.result?.content?.[0]?.text);
  const again = final(await post(px.port, call(4, "pay", { amount: 5 }, "k-mrtr")), 4);
  eq("mrtr: a retry replays the result, not the question",
    done?.result?.structuredContent?.id, again?.result?.structuredContent?.id);
  eq("mrtr: one effect", 1, effects.pay);

  const px3 = await startProxy(["--input-wait", "1s"], join(TMP, "mrtr.db"));
  const q2 = final(await post(px3.port, call(1, "pay", { amount: 7 }, "k-left")), 1);
  eq("mrtr left: the question", "input_required", q2?.result?.resultType);
  let freed;
  for (let i = 0; i < 100; i++) { // polled: the key is freed 1 s after the question
    freed = final(await post(px3.port, call(10 + i, "pay", { amount: 8 }, "k-left")), 10 + i);
    if (freed?.error?.code !== -31901) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  eq("mrtr left: the key freed, the tool never acted for it", "input_required", freed?.result?.resultType);
  check("mrtr left: said so", /no next round/.test(px3.stderr()), px3.stderr());
  // Stopped at once: the key its last answer holds for input is let go
  // before the proxy goes (the tool has not acted), not left in progress.
  px3.stop("SIGTERM");
  eq("mrtr left: exits 0 on SIGTERM", 0, await new Promise((r) => px3.p.on("exit", (c, sig) => r(c ?? sig))));
  eq("mrtr left: both keys held for input let go",
    2, (px3.stderr().match(/no next round/g) ?? []).length);
  const px4 = await startProxy([], join(TMP, "mrtr.db"));
  const after = final(await post(px4.port, call(200, "pay", { amount: 8 }, "k-left")), 200);
  eq("mrtr left: after the stop the key is free", "input_required", after?.result?.resultType);
  eq("mrtr left: the tool never acted", 1, effects.pay);
  px4.stop("SIGTERM");
  await new Promise((r) => px4.p.on("exit", r));
}

// 5c. --require-key: an unkeyed call is refused unless tools/list (read on
// its way through the proxy) annotated the tool read-only or idempotent.
{
  reset();
  const rk = await startProxy(["--require-key", "--principal",
    "credential:authorization", "--replay-check", "none"], join(TMP, "rk.db"));
  const alice = { authorization: "Bearer alice" };
  const r1 = final(await post(rk.port, call(1, "safe_read", {}), alice), 1);
  eq("require-key: unknown tool refused before tools/list", -31905, r1?.error?.code);
  const list = final(await post(rk.port, { jsonrpc: "2.0", id: 2, method: "tools/list" }, alice), 2);
  eq("require-key: tools/list passed on", 2, list?.result?.tools?.length);
  const r2 = final(await post(rk.port, call(3, "safe_read", {}), alice), 3);
  check("require-key: a read-only tool passes unkeyed", r2?.result !== undefined, JSON.stringify(r2));
  const r3 = final(await post(rk.port, call(4, "t", {}), alice), 4);
  eq("require-key: an unannotated tool needs a key", -31905, r3?.error?.code);
  const r4 = final(await post(rk.port, call(5, "t", {}, "k-rk"), alice), 5);
  check("require-key: with a key it acts", r4?.result !== undefined, JSON.stringify(r4));
  eq("require-key: effects", { safe_read: 1, t: 1 }, effects);
  // The table is each tenant's: another credential's unkeyed call to the
  // read-only tool is refused until its own tools/list.
  const bob = { authorization: "Bearer bob" };
  const b1 = final(await post(rk.port, call(7, "safe_read", {}), bob), 7);
  eq("require-key: another tenant, before its tools/list: refused", -31905, b1?.error?.code);
  final(await post(rk.port, { jsonrpc: "2.0", id: 8, method: "tools/list" }, bob), 8);
  const b2 = final(await post(rk.port, call(9, "safe_read", {}), bob), 9);
  check("require-key: another tenant, after its own tools/list: passes", b2?.result !== undefined, JSON.stringify(b2));
  eq("require-key: effects with the other tenant", { safe_read: 2, t: 1 }, effects);
  const nul = final(await post(rk.port, call(6, "t\u0000x", {}, "k-nul"), alice), 6);
  eq("a tool name with U+0000 refused", -32602, nul?.error?.code);
  rk.stop("SIGTERM");
}

// 6. Hostile clients: smuggling framings are refused and never reach the
console.error("-- scenario 6");
// upstream; a body over --max-body is refused; a key that is not a
// string is refused; bodies that are not JSON pass through to the server.
{
  reset();
  const smuggle = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const got = await raw(px.port, smuggle);
  check("smuggling: 400", got.startsWith("HTTP/1.1 400"), got.slice(0, 80));
  check("smuggling: the second request not answered", (got.match(/HTTP\/1\.1/g) ?? []).length === 1, got);
  const two = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Length: 30\r\n\r\n{}";
  const got2 = await raw(px.port, two);
  check("two lengths: 400", got2.startsWith("HTTP/1.1 400"), got2.slice(0, 80));
  for (const target of ["/mcp/../internal/admin", "/%2e%2e/internal", "/mcp/.%2E/x"]) {
    const got3 = await raw(px.port, `GET ${target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
    check(`dot segments refused: ${target}`, got3.startsWith("HTTP/1.1 400"), got3.slice(0, 80));
  }
  eq("smuggling: nothing reached the upstream", 0, seen.length);
  const big = await post(px.port, JSON.stringify(call(1, "t", { pad: "x".repeat(5 << 20) }, "k-big")));
  eq("huge body: 413", 413, big.status);
  eq("huge body: nothing reached the upstream", 0, seen.length);
  const bk = final(await post(px.port, { jsonrpc: "2.0", id: 9, method: "tools/call",
    params: { name: "t", arguments: {}, _meta: { idempotencyKey: 42 } } }), 9);
  eq("bad key: refused", -31906, bk?.error?.code);
  const ctl = final(await post(px.port, call(10, "t", {}, "bad\u0001key")), 10);
  eq("control character in key: refused", -31906, ctl?.error?.code);
  const nj = await post(px.port, "{not json");
  eq("not JSON: the server's answer", 400, nj.status);
  eq("not JSON: reached the server as sent", "{not json", seen.at(-1)?.body);
  eq("no effect from any of them", undefined, effects.t);
  // A head that never ends (slowloris) holds nothing up: the proxy's one
  // event loop, which runs libmicrohttpd and libcurl, answers a keyed call
  // on another connection meanwhile, and the head is cut after its 10 s.
  const seenBefore = seen.length;
  const slow = netConnect(px.port, "127.0.0.1");
  const slowEnd = new Promise((resolve) => {
    slow.on("close", () => resolve(Date.now()));
    slow.on("error", () => {});
  });
  const slowStart = Date.now();
  slow.write("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n");
  const during = final(await post(px.port, call(11, "t", {}, "k-slowhead")), 11);
  check("slow head: a keyed call meanwhile acts", during?.result?.structuredContent?.id !== undefined,
    JSON.stringify(during));
  eq("slow head: one effect meanwhile", 1, effects.t);
  const cutAt = await slowEnd;
  check("slow head: cut after about 10 s", cutAt - slowStart >= 9000 && cutAt - slowStart < 60000,
    cutAt - slowStart);
  eq("slow head: only the keyed call reached the upstream", seenBefore + 1, seen.length);
}

// 7. The GET stream passes through as it comes (the upstream holds it
console.error("-- scenario 7");
// open; the event must arrive before the stream ends).
{
  const ctl = new AbortController();
  const r = await fetch(`http://127.0.0.1:${px.port}/mcp`, { signal: ctl.signal,
    headers: { accept: "text/event-stream", "mcp-session-id": "S1" } });
  const reader = r.body.getReader();
  let got = "";
  const t = setTimeout(() => ctl.abort(), 10000);
  while (!got.includes("\n\n")) {
    const { value, done } = await reader.read().catch(() => ({ done: true }));
    if (done) break;
    got += Buffer.from(value).toString();
  }
  clearTimeout(t);
  check("GET stream: an event while the stream is open", got.includes("list_changed"), got);
  eq("GET stream: session passed on", "S1", seen.find((s) => s.method === "GET")?.headers?.["mcp-session-id"]);
  ctl.abort();
  // The client's close reaches the upstream: its stream is not held.
  for (let i = 0; i < 200 && getClosed === 0; i++) await new Promise((r) => setTimeout(r, 50));
  eq("GET stream: closed at the upstream once the client closed it", 1, getClosed);
}

// 7a. The head of an answer to a POST waits only briefly for the answer's
console.error("-- scenario 7a");
// first bytes: when the server sends its head at once and its message only
// later (a slow tool without progress), the client's stream opens while
// the server still holds the message, keyed or not; the message then
// arrives whole, and a keyed call's retry replays it.
{
  reset();
  mode.held = "held";
  let keyed = null; // the keyed call's ticket
  for (const [label, key, id] of [["unkeyed", null, 71], ["keyed", "held-1", 72]]) {
    const r = await Promise.race([
      fetch(`http://127.0.0.1:${px.port}/mcp`, { method: "POST",
        headers: { "content-type": "application/json",
          accept: "application/json, text/event-stream", "mcp-session-id": "S7a" },
        body: JSON.stringify(call(id, "held", {}, key)) }),
      new Promise((r) => setTimeout(() => r(null), 10000))]);
    check(`held head, ${label}: the stream opened before the message`, r !== null, r);
    if (!r) break;
    eq(`held head, ${label}: an event stream`, "text/event-stream", r.headers.get("content-type"));
    eq(`held head, ${label}: the message still held at the server`, 1, heldMessages.length);
    heldMessages.shift()();
    const got = { status: r.status, headers: r.headers, text: await r.text() };
    eq(`held head, ${label}: the server's ticket`, `ticket-${tickets}`,
      final(got, id)?.result?.content?.[0]?.text);
    keyed = `ticket-${tickets}`;
  }
  eq("held head: the server acted once for each call", 2, effects.held);
  const again = await post(px.port, call(73, "held", {}, "held-1"), { "mcp-session-id": "S7a" });
  const m = final(again, 73);
  eq("held head: the keyed retry replays the ticket", keyed, m?.result?.content?.[0]?.text);
  eq("held head: the retry is marked a replay", true, m?.result?._meta?.["idem/replayed"]);
  eq("held head: the retry did not act", 2, effects.held);
}

// 8. The upstream is unreachable: nothing was sent; the key is free.
console.error("-- scenario 8");
{
  reset();
  const dead = await startProxy(["--lease", "1s"], join(TMP, "dead.db"));
  dead.stop("SIGKILL");
  const px2 = spawn(IDEM, ["mcp", "--listen", "127.0.0.1:0", "--upstream",
    "http://127.0.0.1:1/mcp", "--store", `sqlite:${join(TMP, "dead.db")}`, "--principal", "none"],
  { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  px2.stderr.on("data", (d) => (err += d));
  watchStderr(() => err);
  const port = await new Promise((res) => px2.stderr.on("data", () => {
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err); if (m) res(Number(m[1]));
  }));
  const f = final(await post(port, call(1, "t", {}, "k-unreach")), 1);
  eq("unreachable: not sent", -31907, f?.error?.code);
  const u = await post(port, call(2, "t", {}, null));
  eq("unreachable: unkeyed gets 502", 502, u.status);
  px2.kill("SIGTERM");
  await new Promise((r) => px2.on("exit", r));
}

// The answer to a keyed call: its JSON-RPC error code and message, or its
// ticket and marks.
const outcome = (r, id) => {
  const f = final(r, id);
  return { code: f?.error?.code, message: f?.error?.message ?? "",
    ticket: f?.result?.structuredContent?.id,
    recovered: f?.result?._meta?.["idem/recovered"],
    replayed: f?.result?._meta?.["idem/replayed"] };
};
const until = async (what, ok, ms = 15000) => {
  for (const end = Date.now() + ms; !ok() && Date.now() < end;) await new Promise((r) => setTimeout(r, 25));
  check(what, ok());
};
// Retries the call every 100 ms while the key is in flight (-31902).
async function retryPastLease(port, msg, id) {
  let r;
  for (let i = 0; i < 150; i++) {
    r = await post(port, msg);
    if (outcome(r, id).code !== -31902) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  return outcome(r, id);
}

// 9. --call-timeout: a server that acted and never answers holds the key
console.error("-- scenario 9");
// only for one lease: the proxy stops waiting, answers -31903 naming the
// limit, and the retry after the lease is sent again and marked recovered.
{
  reset();
  const ct = await startProxy(["--call-timeout", "1s", "--lease", "1s", "--attach-wait", "0"],
    join(TMP, "timeout.db"));
  mode.t = "acthang";
  const closed = hungClosed, sent = hung.length;
  const started = Date.now();
  const a = outcome(await post(ct.port, call(1, "t", { n: 9 }, "k-timeout")), 1);
  eq("call-timeout: outcome unknown", -31903, a.code);
  check("call-timeout: the message names the limit", /--call-timeout/.test(a.message), a.message);
  check("call-timeout: answered after the limit", Date.now() - started >= 1000, Date.now() - started);
  eq("call-timeout: the call reached the server once", sent + 1, hung.length);
  await until("call-timeout: the proxy closed its request to the server", () => hungClosed === closed + 1);
  mode.t = "json";
  const b = await retryPastLease(ct.port, call(2, "t", { n: 9 }, "k-timeout"), 2);
  eq("call-timeout: the retry after the lease acts, marked recovered", true, b.recovered);
  eq("call-timeout: the tool acted twice in all (the first may have acted)", 2, effects.t);
  const c = outcome(await post(ct.port, call(3, "t", { n: 9 }, "k-timeout")), 3);
  eq("call-timeout: a later retry replays the recovered ticket", b.ticket, c.ticket);
  eq("call-timeout: replayed", true, c.replayed);
  eq("call-timeout: no third effect", 2, effects.t);
  // Without --listen the option is refused: a stdio server's late answer
  // would come on the pipe all calls share.
  const stdio = spawnSync(IDEM, ["mcp", "--call-timeout", "1s", "--store",
    `sqlite:${join(TMP, "timeout.db")}`, "--", "true"], { encoding: "utf8" });
  eq("call-timeout: refused without --listen", 2, stdio.status);
  check("call-timeout: says why", /--call-timeout goes with --listen/.test(stdio.stderr), stdio.stderr);
  ct.stop("SIGTERM");
  await new Promise((r) => ct.p.on("exit", r));
}

// 10. A lease this proxy cannot renew (another process holds the store's
console.error("-- scenario 10");
// write lock) is lost at its end: the proxy stops waiting for the server,
// whose late answer it could no longer record, and answers -31903.
{
  reset();
  const db = join(TMP, "lease.db");
  const lp = await startProxy(["--lease", "1s", "--attach-wait", "0"], db);
  mode.t = "acthang";
  const closed = hungClosed, sent = hung.length;
  const pending = post(lp.port, call(1, "t", { n: 10 }, "k-lease"));
  await until("lease: the call reached the server", () => hung.length === sent + 1);
  const lock = spawn("sqlite3", [db], { stdio: ["pipe", "pipe", "pipe"] });
  let said = "";
  lock.stdout.on("data", (d) => (said += d));
  lock.stdin.write("BEGIN IMMEDIATE;\nSELECT 'locked';\n");
  await until("lease: the store is locked by another process", () => said.includes("locked"));
  await until("lease: the proxy stopped waiting once its lease was lost",
    () => hungClosed === closed + 1, 20000);
  lock.stdin.end("ROLLBACK;\n");
  await new Promise((r) => lock.on("exit", r));
  const a = outcome(await pending, 1);
  eq("lease: outcome unknown", -31903, a.code);
  check("lease: the message says the lease was lost", /lost the key's lease/.test(a.message), a.message);
  eq("lease: one effect", 1, effects.t);
  mode.t = "json";
  const b = await retryPastLease(lp.port, call(2, "t", { n: 10 }, "k-lease"), 2);
  eq("lease: the retry after the lease acts, marked recovered", true, b.recovered);
  eq("lease: two effects in all", 2, effects.t);
  eq("lease: the recovered ticket is the second", tickets, b.ticket);
  lp.stop("SIGTERM");
  await new Promise((r) => lp.p.on("exit", r));
}

// 11. Task handles (MCP 2025-11-25): a keyed call that asks for a task
console.error("-- scenario 11");
// acts by creating it; a retry gets the same task, a retry asking for no
// task is refused (-32602, task_expected), and once the task's ttl has
// passed the handle is stale: the call is sent again (--on-unknown forward)
// and marked recovered, or (fail) refused with -31903.
{
  reset();
  mode.tk = "task";
  const ask = (id, key, ttl) => ({ jsonrpc: "2.0", id, method: "tools/call",
    params: { name: "tk", arguments: { n: 11 }, ...(ttl ? { task: { ttl } } : {}),
      _meta: { idempotencyKey: key } } });
  const a = final(await post(px.port, ask(1, "k-task", 1500)), 1);
  const tid = a?.result?.task?.taskId;
  check("task: a handle", /^task-\d+$/.test(tid ?? ""), JSON.stringify(a));
  const b = final(await post(px.port, ask(2, "k-task", 1500)), 2);
  eq("task: a retry gets the same task", tid, b?.result?.task?.taskId);
  eq("task: replayed", true, b?.result?._meta?.["idem/replayed"]);
  const c = final(await post(px.port, ask(3, "k-task", 0)), 3);
  eq("task: a retry that asks for no task is refused", -32602, c?.error?.code);
  eq("task: task_expected", "task_expected", c?.error?.data?.idem);
  eq("task: one task made so far", 1, effects.tk);
  let d, n = 4;
  for (; n < 200; n++) { // until the ttl has passed
    d = final(await post(px.port, ask(n, "k-task", 1500)), n);
    if (d?.result?.task?.taskId !== tid) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check("task: past its ttl, a new task", /^task-\d+$/.test(d?.result?.task?.taskId ?? "")
    && d.result.task.taskId !== tid, JSON.stringify(d));
  eq("task: the new task's answer is marked recovered", true, d?.result?._meta?.["idem/recovered"]);
  eq("task: two tasks made", 2, effects.tk);
  const e = final(await post(px.port, ask(n + 1, "k-task", 1500)), n + 1);
  eq("task: then the new task is replayed", d?.result?.task?.taskId, e?.result?.task?.taskId);
  eq("task: its replays say recovered too", true, e?.result?._meta?.["idem/recovered"]);
  eq("task: no third task", 2, effects.tk);

  const fp = await startProxy(["--on-unknown", "fail"], join(TMP, "taskfail.db"));
  const f = final(await post(fp.port, ask(1, "k-task-f", 300)), 1);
  const ftid = f?.result?.task?.taskId;
  check("task, fail: a handle", /^task-\d+$/.test(ftid ?? ""), JSON.stringify(f));
  let g;
  for (n = 2; n < 200; n++) {
    g = final(await post(fp.port, ask(n, "k-task-f", 300)), n);
    if (g?.result?.task?.taskId !== ftid) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  eq("task, fail: past its ttl, refused as unknown", -31903, g?.error?.code);
  check("task, fail: says the ttl passed", /ttl has passed/.test(g?.error?.message ?? ""), g?.error?.message);
  eq("task, fail: nothing sent again", 3, effects.tk);
  fp.stop("SIGTERM");
  await new Promise((r) => fp.p.on("exit", r));
}

// 12. A stop past --shutdown-wait: the keyed call still at the server is cut
console.error("-- scenario 12");
// off and recorded as held (the server may have acted), and its client is
// answered -31903 before the proxy goes; the proxy exits 0, and another on
// the same store sends the retry again only after the lease, marked
// recovered: the record was kept in progress, not let go.
{
  reset();
  const db = join(TMP, "stop.db");
  const sp = await startProxy(["--shutdown-wait", "300ms", "--lease", "1s",
    "--attach-wait", "0"], db);
  mode.t = "acthang";
  const sent = hung.length;
  const pending = post(sp.port, call(1, "t", { n: 12 }, "k-stop"))
    .catch((e) => ({ status: 0, text: String(e?.cause ?? e) }));
  await until("stop: the call reached the server", () => hung.length === sent + 1);
  sp.stop("SIGTERM");
  const code = await new Promise((r) => sp.p.on("exit", (c, sig) => r(c ?? sig)));
  const r = await pending;
  eq("stop: the client is answered (HTTP 200)", 200, r.status);
  const a = r.status === 200 ? outcome(r, 1) : {};
  eq("stop: outcome unknown", -31903, a.code);
  eq("stop: the proxy exits 0", 0, code);
  check("stop: says the call was left in progress",
    /still at the server after --shutdown-wait/.test(sp.stderr()), sp.stderr());
  check("stop: says it stopped", /idem mcp: stopped/.test(sp.stderr()), sp.stderr());
  eq("stop: one effect", 1, effects.t);
  mode.t = "json";
  const np = await startProxy(["--lease", "1s", "--attach-wait", "0"], db);
  const b = await retryPastLease(np.port, call(2, "t", { n: 12 }, "k-stop"), 2);
  eq("stop: the retry after the lease acts, marked recovered", true, b.recovered);
  eq("stop: two effects in all", 2, effects.t);
  const c = outcome(await post(np.port, call(3, "t", { n: 12 }, "k-stop")), 3);
  eq("stop: a later retry replays the recovered ticket", b.ticket, c.ticket);
  eq("stop: no third effect", 2, effects.t);
  np.stop("SIGTERM");
  await new Promise((r) => np.p.on("exit", r));
}

px.stop("SIGTERM");
const code = await new Promise((r) => px.p.on("exit", (c) => r(c)));
eq("proxy exits 0 on SIGTERM", 0, code);
check("proxy said it stopped", /idem mcp: stopped/.test(px.stderr()), px.stderr());
for (const s of sockets) s.destroy();
upstream.close();
finish();
