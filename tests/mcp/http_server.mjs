#!/usr/bin/env node
// http_server.mjs -- an MCP server on the Streamable HTTP transport, built
// with the real SDK, for the tests of `idem mcp --listen` (http.mjs).
//
//   node http_server.mjs [--port N] [--stateless] [--sdk 1|2] [--json]
//                        [--auth]
//
// Prints `listening PORT` on standard output when ready. The MCP endpoint is
// /mcp on 127.0.0.1.
//
//   (default)    1.x SDK, stateful: StreamableHTTPServerTransport with
//                sessions (Mcp-Session-Id), the GET stream, DELETE.
//   --stateless  1.x SDK, sessionIdGenerator undefined, a new server and
//                transport for each POST (as the SDK's example does: both
//                closed when the response's connection closes); GET and
//                DELETE answer 405.
//   --sdk 2      2.x SDK (@modelcontextprotocol/server 2.4.0):
//                createMcpHandler (legacy requests served statelessly, one
//                instance per request; the 2026-07-28 era too), its
//                web-standard fetch adapted to node:http here. Its handlers'
//                signals are aborted when the connection that carried the
//                request closes, as the 2.x SDK does.
//   --json       (1.x) enableJsonResponse: answers application/json.
//   --events     (1.x stateful) the SDK example's InMemoryEventStore: SSE
//                events have ids (and a priming event), so a client whose
//                stream was cut resumes with GET + Last-Event-ID.
//   --auth       every POST, GET and DELETE to /mcp needs a credential:
//                an X-API-Key header whose value is in the allow set, or
//                Authorization: Bearer T with T not revoked (any other
//                token is taken); without one, 401 with WWW-Authenticate:
//                Bearer resource_metadata="..." and a JSON-RPC error body.
//                The allow set starts empty; POST /auth/allow and
//                /auth/revoke change it (a credential is one string, the
//                key's or the token's). The log's entries then also carry
//                apiKey (the X-API-Key header), and /effects unauthorized
//                (the count of requests refused 401).
//
// Tools:
//   create_ticket {title}      acts at once: ticket-<n>, structuredContent {id: n}
//   slow_ticket {title, timeout_ms?}
//                              sends progress 1/2 (when the request has a
//                              progressToken), waits until released (POST
//                              /release) or timeout_ms, then acts as
//                              create_ticket and sends progress 2/2
//   ask {question}             (stateful 1.x) asks the client through
//                              elicitation/create on the request's stream,
//                              acts, returns "answer: <answer>"
// n counts the tickets of this process (all tools).
//
// Plain HTTP paths, next to /mcp:
//   GET  /effects   {effects: {tool: count}, started, running: {tool: count},
//                   runningTitles, sessions, getStreams: {sid: open GET
//                   streams}, log: [{tool, n, title, id, key, aborted,
//                   session, auth, progressToken}], requests: count of POSTs
//                   to /mcp by method, cancelled: [{session, requestId,
//                   reason}] the notifications/cancelled received,
//                   resumes: [{session, lastEventId}] the GETs with
//                   Last-Event-ID}
//   POST /release   {title?, keep?}: lets the slow_ticket calls waiting with
//                   that title (all when no title) go on; keep: also the ones
//                   that come later. Answers {released: count}.
//   POST /notify    {session?, data}: (stateful) a notifications/message
//                   outside any request, so on each session's GET stream
//                   (only the given session's). Answers {sent: [sid...]}.
//   POST /auth/allow  {cred}: (--auth) X-API-Key cred is allowed, Bearer
//                   cred no longer revoked. Answers {allowed, revoked}.
//   POST /auth/revoke {cred}: (--auth) X-API-Key cred no longer allowed,
//                   Bearer cred revoked. Answers {allowed, revoked}.
//   anything else   404 JSON {"error": "no such path", path}
import http from "node:http";
import { randomUUID } from "node:crypto";
import { z } from "zod";

const argv = process.argv.slice(2);
const opt = (name, dflt) => argv.includes(name)
  ? argv[argv.indexOf(name) + 1] : dflt;
const PORT = Number(opt("--port", "0"));
const STATELESS = argv.includes("--stateless");
const SDK = opt("--sdk", "1");
const JSON_MODE = argv.includes("--json");
// --more-tools (1.x): also lookup {q} (readOnlyHint), touch {title}
// (idempotentHint) and charge {title, op_key?} (its schema declares op_key),
// each acting as create_ticket does, counted under its own name
// (offer_key.mjs).
const MORE_TOOLS = argv.includes("--more-tools");
const EVENTS = argv.includes("--events");
const AUTH = argv.includes("--auth");
const allowed = new Set(); // X-API-Key values let in (--auth)
const revoked = new Set(); // Bearer tokens refused (--auth)

const state = {
  effects: { create_ticket: 0, slow_ticket: 0, ask: 0 },
  started: { create_ticket: 0, slow_ticket: 0, ask: 0 },
  running: { slow_ticket: 0, ask: 0 },
  runningTitles: [],
  log: [],
  requests: {},
  cancelled: [],
  resumes: [],
  callArguments: [], // params.arguments of each tools/call POSTed, as sent
  n: 0,
};
const waiters = []; // {title, go}
const keep = new Set(); // titles released for good
let keepAll = false;

function release({ title, keep: k } = {}) {
  if (k) { if (title === undefined) keepAll = true; else keep.add(title); }
  let count = 0;
  for (let i = waiters.length - 1; i >= 0; i--) {
    if (title === undefined || waiters[i].title === title) {
      waiters[i].go();
      waiters.splice(i, 1);
      count++;
    }
  }
  return count;
}
function waitRelease(title, timeoutMs) {
  if (keepAll || keep.has(title)) return Promise.resolve();
  return new Promise((resolve) => {
    const w = { title, go: resolve };
    waiters.push(w);
    // Never waits for ever: a stuck test ends on its own bound first.
    setTimeout(() => {
      const i = waiters.indexOf(w);
      if (i >= 0) waiters.splice(i, 1);
      resolve();
    }, timeoutMs ?? 120000).unref();
  });
}

// The SDK-neutral view of a request: {id, meta, signal, notify, send,
// session, auth}.
function act(tool, title, r, extra = {}) {
  const n = ++state.n;
  state.effects[tool]++;
  state.log.push({ tool, n, title, id: r.id, key: r.meta?.idempotencyKey,
    aborted: r.signal?.aborted === true, session: r.session ?? null,
    auth: r.auth ?? null, progressToken: r.meta?.progressToken,
    ...(AUTH ? { apiKey: r.apiKey ?? null } : {}), ...extra });
  return n;
}
const ticket = (n) => ({ content: [{ type: "text", text: `ticket-${n}` }],
  structuredContent: { id: n } });

const tools = {
  async create_ticket({ title }, r) {
    state.started.create_ticket++;
    return ticket(act("create_ticket", title, r));
  },
  async slow_ticket({ title, timeout_ms }, r) {
    state.started.slow_ticket++;
    state.running.slow_ticket++;
    state.runningTitles.push(title);
    const token = r.meta?.progressToken;
    try {
      if (token !== undefined)
        await r.notify({ method: "notifications/progress",
          params: { progressToken: token, progress: 1, total: 2,
            message: `${title}: waiting` } });
      await waitRelease(title, timeout_ms);
    } finally {
      state.running.slow_ticket--;
      state.runningTitles.splice(state.runningTitles.indexOf(title), 1);
    }
    const n = act("slow_ticket", title, r);
    if (token !== undefined)
      await r.notify({ method: "notifications/progress",
        params: { progressToken: token, progress: 2, total: 2,
          message: `${title}: done` } }).catch(() => {});
    return ticket(n);
  },
  async ask({ question }, r) {
    state.started.ask++;
    state.running.ask++;
    let answer;
    try {
      const res = await r.elicit({ message: question, requestedSchema: {
        type: "object", properties: { answer: { type: "string" } },
        required: ["answer"] } });
      answer = res.action === "accept" ? res.content?.answer : `(${res.action})`;
    } finally {
      state.running.ask--;
    }
    const n = act("ask", question, r, { answer });
    return { content: [{ type: "text", text: `answer: ${answer}` }],
      structuredContent: { id: n, answer } };
  },
};
const INFO = { name: `idem-http-test-server-sdk${SDK}`, version: "1.0.0" };
const DESCR = {
  create_ticket: "Creates a ticket at once.",
  slow_ticket: "Creates a ticket once released (POST /release).",
  ask: "Asks the client a question (elicitation), then acts.",
};
const inputs = {
  create_ticket: { title: z.string() },
  slow_ticket: { title: z.string(), timeout_ms: z.number().optional() },
  ask: { question: z.string() },
};
const outputs = {
  create_ticket: { id: z.number() },
  slow_ticket: { id: z.number() },
  ask: { id: z.number(), answer: z.string() },
};

// ---- 1.x
let sdk1;
async function load1() {
  sdk1 ??= {
    ...(await import("@modelcontextprotocol/sdk/server/mcp.js")),
    ...(await import("@modelcontextprotocol/sdk/server/streamableHttp.js")),
    ...(await import("@modelcontextprotocol/sdk/types.js")),
  };
}
async function build1() {
  await load1();
  const server = new sdk1.McpServer(INFO, { capabilities: { logging: {} } });
  for (const name of Object.keys(tools)) {
    if (name === "ask" && STATELESS) continue;
    server.registerTool(name, { description: DESCR[name],
      inputSchema: inputs[name], outputSchema: outputs[name] },
    (args, extra) => tools[name](args, {
      id: extra.requestId, meta: extra._meta, signal: extra.signal,
      session: extra.sessionId,
      auth: extra.requestInfo?.headers?.authorization,
      apiKey: extra.requestInfo?.headers?.["x-api-key"],
      notify: (n) => extra.sendNotification(n),
      elicit: (p) => server.server.elicitInput(p,
        { relatedRequestId: extra.requestId }),
    }));
  }
  if (MORE_TOOLS) {
    const more = {
      lookup: [{ q: z.string() }, { readOnlyHint: true }],
      touch: [{ title: z.string() }, { idempotentHint: true }],
      charge: [{ title: z.string(), op_key: z.string().optional() }, {}],
    };
    for (const [name, [input, annotations]] of Object.entries(more))
      server.registerTool(name, { description: name, inputSchema: input,
        annotations },
      (args, extra) => {
        state.effects[name] ??= 0;
        const n = act(name, args.title ?? args.q,
          { id: extra.requestId, meta: extra._meta });
        return { content: [{ type: "text",
          text: `ticket-${n} ${JSON.stringify(args)}` }] };
      });
  }
  return server;
}

// ---- 2.x
let sdk2;
async function build2() {
  sdk2 ??= await import("@modelcontextprotocol/server");
  const server = new sdk2.McpServer(INFO, { capabilities: { logging: {} } });
  for (const name of Object.keys(tools)) {
    if (name === "ask") continue; // no way back to a per-request server
    server.registerTool(name, { description: DESCR[name],
      inputSchema: z.object(inputs[name]),
      outputSchema: z.object(outputs[name]) },
    (args, ctx) => tools[name](args, {
      id: ctx.mcpReq.id, meta: ctx.mcpReq._meta, signal: ctx.mcpReq.signal,
      session: null, auth: null,
      notify: (n) => ctx.mcpReq.notify(n),
      elicit: (p) => ctx.mcpReq.elicitInput(p),
    }));
  }
  return server;
}

const sessions = new Map(); // sid -> {transport, server}
const getStreams = {}; // sid -> open GET streams

function json(res, status, body, headers = {}) {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
}
async function readBody(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return Buffer.concat(chunks).toString("utf8");
}
function countRequest(parsed, session) {
  for (const m of [parsed].flat()) {
    if (!m || typeof m !== "object") continue;
    if (m.method === "notifications/cancelled")
      state.cancelled.push({ session: session ?? null,
        requestId: m.params?.requestId, reason: m.params?.reason });
    if (m.method === "tools/call")
      state.callArguments.push(m.params?.arguments ?? null);
    const k = m.method ?? (m.id !== undefined ? "(response)" : "?");
    state.requests[k] = (state.requests[k] ?? 0) + 1;
  }
}

async function mcp1(req, res, body) {
  await load1();
  const parsed = body ? JSON.parse(body) : undefined;
  if (req.method === "POST")
    countRequest(parsed, STATELESS ? null : req.headers["mcp-session-id"]);
  if (STATELESS) {
    if (req.method !== "POST")
      return json(res, 405, { jsonrpc: "2.0", error: { code: -32000,
        message: "Method not allowed." }, id: null }, { allow: "POST" });
    const server = await build1();
    const transport = new sdk1.StreamableHTTPServerTransport({
      sessionIdGenerator: undefined, enableJsonResponse: JSON_MODE });
    res.on("close", () => { transport.close(); server.close(); });
    await server.connect(transport);
    return transport.handleRequest(req, res, parsed);
  }
  const sid = req.headers["mcp-session-id"];
  if (sid && sessions.has(sid)) {
    if (req.method === "GET") {
      if (req.headers["last-event-id"] !== undefined)
        state.resumes.push({ session: sid, lastEventId: req.headers["last-event-id"] });
      getStreams[sid] = (getStreams[sid] ?? 0) + 1;
      res.on("close", () => { getStreams[sid]--; });
    }
    return sessions.get(sid).transport.handleRequest(req, res, parsed);
  }
  if (!sid && req.method === "POST" && sdk1.isInitializeRequest(parsed)) {
    const server = await build1();
    let eventStore;
    if (EVENTS) {
      const { InMemoryEventStore } = await import(
        "@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js");
      eventStore = new InMemoryEventStore();
    }
    const transport = new sdk1.StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(), enableJsonResponse: JSON_MODE,
      eventStore,
      onsessioninitialized: (id) => sessions.set(id, { transport, server }),
    });
    transport.onclose = () => {
      if (transport.sessionId) sessions.delete(transport.sessionId);
    };
    await server.connect(transport);
    return transport.handleRequest(req, res, parsed);
  }
  json(res, sid ? 404 : 400, { jsonrpc: "2.0", error: {
    code: sid ? -32001 : -32000,
    message: sid ? "Session not found" : "Bad Request: no session" }, id: null });
}

let handler2;
async function mcp2(req, res, body) {
  sdk2 ??= await import("@modelcontextprotocol/server");
  handler2 ??= sdk2.createMcpHandler(build2, { onerror: () => {} });
  if (req.method === "POST") {
    try { countRequest(JSON.parse(body)); } catch { /* the SDK answers */ }
  }
  const ac = new AbortController();
  res.on("close", () => { if (!res.writableFinished) ac.abort(); });
  const headers = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    if (Array.isArray(v)) for (const x of v) headers.append(k, x);
    else if (v !== undefined) headers.set(k, v);
  }
  const request = new Request(`http://${req.headers.host}${req.url}`, {
    method: req.method, headers, signal: ac.signal,
    body: req.method === "GET" || req.method === "HEAD" ? undefined : body,
  });
  const response = await handler2.fetch(request);
  const out = {};
  response.headers.forEach((v, k) => { out[k] = v; });
  res.writeHead(response.status, out);
  if (!response.body) return res.end();
  res.flushHeaders();
  const reader = response.body.getReader();
  ac.signal.addEventListener("abort", () => reader.cancel().catch(() => {}));
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      res.write(value);
    }
  } catch { /* the connection closed */ }
  res.end();
}

// --auth: whether the request carries a credential the server takes.
function authorized(req) {
  const key = req.headers["x-api-key"];
  if (key !== undefined) return allowed.has(key);
  const m = /^Bearer (\S+)$/.exec(req.headers.authorization ?? "");
  return m !== null && !revoked.has(m[1]);
}
const authState = () => ({ allowed: [...allowed], revoked: [...revoked] });

const httpServer = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, "http://x");
    const body = await readBody(req);
    if (url.pathname === "/mcp" && AUTH && !authorized(req)) {
      state.unauthorized = (state.unauthorized ?? 0) + 1;
      return json(res, 401, { jsonrpc: "2.0", error: { code: -32001,
        message: "Unauthorized: a known X-API-Key or a valid bearer token "
          + "is required" }, id: null }, { "www-authenticate":
        `Bearer resource_metadata="http://${req.headers.host}/.well-known/oauth-protected-resource/mcp"` });
    }
    if (url.pathname === "/mcp")
      return await (SDK === "2" ? mcp2 : mcp1)(req, res, body);
    if (url.pathname === "/effects" && req.method === "GET")
      return json(res, 200, { ...state, sessions: sessions.size,
        sessionIds: [...sessions.keys()], getStreams,
        waiting: waiters.map((w) => w.title) });
    if (url.pathname === "/release" && req.method === "POST")
      return json(res, 200, { released: release(body ? JSON.parse(body) : {}) });
    if (AUTH && req.method === "POST" &&
        (url.pathname === "/auth/allow" || url.pathname === "/auth/revoke")) {
      const { cred } = body ? JSON.parse(body) : {};
      if (typeof cred !== "string")
        return json(res, 400, { error: "cred must be a string" });
      if (url.pathname === "/auth/allow") { allowed.add(cred); revoked.delete(cred); }
      else { allowed.delete(cred); revoked.add(cred); }
      return json(res, 200, authState());
    }
    if (url.pathname === "/notify" && req.method === "POST") {
      const { session, data } = body ? JSON.parse(body) : {};
      const sent = [];
      for (const [sid, s] of sessions) {
        if (session !== undefined && session !== sid) continue;
        await s.server.server.notification({ method: "notifications/message",
          params: { level: "info", logger: "http_server", data } });
        sent.push(sid);
      }
      return json(res, 200, { sent });
    }
    json(res, 404, { error: "no such path", path: url.pathname });
  } catch (e) {
    console.error("http_server:", e);
    if (!res.headersSent) json(res, 500, { error: String(e) });
    else res.end();
  }
});
httpServer.listen(PORT, "127.0.0.1", () => {
  console.log(`listening ${httpServer.address().port}`);
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
