// http_lib.mjs -- what http.mjs uses: the HTTP test server (http_server.mjs)
// started and asked, `idem mcp --listen` started in front of it, and SDK
// clients (1.x and 2.x) on the Streamable HTTP transport.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { HERE, IDEM, check, sleep, watchStderr } from "./lib.mjs";

const children = new Set();
process.on("exit", () => {
  for (const p of children) try { p.kill("SIGKILL"); } catch { /* gone */ }
});

// Waits (polling, bounded) until cond() (maybe async) is truthy; returns its
// last value. A failed wait is a failed check naming what was awaited.
export async function waitFor(cond, what, ms = 10000, detail = () => "") {
  const end = Date.now() + ms;
  let v;
  for (;;) {
    try { v = await cond(); } catch (e) { v = undefined; }
    if (v) return v;
    if (Date.now() > end) break;
    await sleep(25);
  }
  check(`waited for ${what} (${ms} ms)`, false, await detail());
  return v;
}

// Spawns cmd and resolves with the first match of re on the stream
// (stdout or stderr), or rejects when it exits first or after ms.
function startAndMatch(cmd, args, stream, re, ms, env = {}) {
  const p = spawn(cmd, args, { env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"] });
  children.add(p);
  let out = "";
  let err = "";
  p.stdout.on("data", (d) => { out += d; });
  p.stderr.on("data", (d) => { err += d; });
  const exited = new Promise((r) => p.on("exit", (code, signal) => {
    children.delete(p);
    r({ code, signal });
  }));
  const ready = new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(
      `${cmd} ${args.join(" ")}: no ${re} within ${ms} ms; stdout: ${out}; stderr: ${err}`)), ms);
    const look = () => {
      const m = (stream === "stdout" ? out : err).match(re);
      if (m) { clearTimeout(t); resolve(m); }
    };
    p[stream].on("data", look);
    exited.then(({ code, signal }) => {
      clearTimeout(t);
      reject(new Error(`${cmd} ${args.join(" ")} exited (${code ?? signal}) before ready; stdout: ${out}; stderr: ${err}`));
    });
  });
  return { p, ready, exited, out: () => out, err: () => err };
}

/*
 * The test server: {port, url (the MCP endpoint), base, effects(),
 * release(title, keep), notify(session, data), kill(signal), exited,
 * stderr()}. opts: {stateless, sdk: "1"|"2", json, events, port}.
 */
export async function startServer({ stateless = false, sdk = "1", json = false,
  events = false, port = 0, more = false } = {}) {
  const args = [join(HERE, "http_server.mjs"), "--port", String(port),
    "--sdk", sdk];
  if (stateless) args.push("--stateless");
  if (json) args.push("--json");
  if (events) args.push("--events");
  if (more) args.push("--more-tools");
  const s = startAndMatch(process.execPath, args, "stdout", /listening (\d+)/,
    15000);
  const m = await s.ready;
  const p = Number(m[1]);
  const base = `http://127.0.0.1:${p}`;
  const post = async (path, body) => (await fetch(base + path, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify(body ?? {}) })).json();
  return {
    port: p, base, url: `${base}/mcp`, proc: s.p, exited: s.exited,
    stderr: s.err,
    effects: async () => (await fetch(`${base}/effects`)).json(),
    release: (title, keep = false) => post("/release", { title, keep }),
    notify: (session, data) => post("/notify", { session, data }),
    kill: (sig = "SIGKILL") => { s.p.kill(sig); return s.exited; },
  };
}

let proxies = 0;
/*
 * `idem mcp --listen 127.0.0.1:0 --upstream UPSTREAM --store STORE OPTS...`:
 * {url (the proxy's MCP endpoint), base, port, proc, exited, stderr(),
 * kill(signal)}. With direct set, no proxy: the upstream itself.
 */
export async function startProxy(upstream, store, opts = [], { direct = false } = {}) {
  if (direct) {
    const u = new URL(upstream);
    return { url: upstream, base: u.origin, direct: true, stderr: () => "",
      kill: async () => {}, exited: Promise.resolve({}) };
  }
  const n = ++proxies;
  // The test servers take no credential: --principal none unless the test
  // names a rule of its own.
  const rule = opts.includes("--principal") || opts.includes("--tenant-header")
    ? [] : ["--principal", "none"];
  const args = ["mcp", "--listen", "127.0.0.1:0", "--upstream", upstream,
    "--store", store, ...rule, ...opts];
  const s = startAndMatch(IDEM, args, "stderr",
    /idem mcp: listening on (http:\/\/127\.0\.0\.1:(\d+)), forwarding to (\S+)/,
    15000);
  watchStderr(s.err);
  const m = await s.ready;
  check(`proxy ${n}: says where it forwards`, m[3] === upstream,
    `${m[0]} (upstream ${upstream})`);
  const path = new URL(upstream).pathname;
  return { url: m[1] + path, base: m[1], port: Number(m[2]), proc: s.p,
    exited: s.exited, stderr: s.err,
    kill: (sig = "SIGKILL") => { s.p.kill(sig); return s.exited; } };
}

/*
 * A fetch for a client transport that can cut the POST carrying a given
 * request: cutter.arm(match) makes the next POST whose body matches
 * (a function of the parsed body) abortable; cutter.cut() aborts its
 * connection (the response stream ends with an error at the client, the
 * TCP connection to the proxy closes). cutter.sent resolves when that POST
 * has been handed to fetch.
 */
export function makeCutter() {
  let armed = null;
  let ac = null;
  let sentResolve;
  const c = {
    sent: null,
    arm(match) {
      armed = match;
      ac = null;
      c.sent = new Promise((r) => { sentResolve = r; });
    },
    cut() { if (ac) ac.abort(new Error("cut by the test")); return !!ac; },
    fetch: (url, init = {}) => {
      if (armed && init.method === "POST" && typeof init.body === "string") {
        let parsed;
        try { parsed = JSON.parse(init.body); } catch { parsed = null; }
        if (parsed && armed(parsed)) {
          armed = null;
          ac = new AbortController();
          const signal = init.signal
            ? AbortSignal.any([init.signal, ac.signal]) : ac.signal;
          sentResolve(parsed);
          return fetch(url, { ...init, signal });
        }
      }
      return fetch(url, init);
    },
  };
  return c;
}

/*
 * An SDK client on url over Streamable HTTP. sdk "1" (@modelcontextprotocol/
 * sdk 1.32.2) or "2" (@modelcontextprotocol/client 2.4.0, legacy era by
 * default; modern: versionNegotiation pinned to 2026-07-28). headers: sent
 * on every request. Returns {client, transport, sdk, sessionId()}.
 */
export async function connectHttp(url, { sdk = "1", headers = {},
  capabilities = {}, handlers = null, fetch: f, modern = false,
  name = "idem-http-test" } = {}) {
  let Client, Transport;
  if (sdk === "2") {
    ({ Client, StreamableHTTPClientTransport: Transport } =
      await import("@modelcontextprotocol/client"));
  } else {
    ({ Client } = await import("@modelcontextprotocol/sdk/client/index.js"));
    ({ StreamableHTTPClientTransport: Transport } =
      await import("@modelcontextprotocol/sdk/client/streamableHttp.js"));
  }
  const transport = new Transport(new URL(url), {
    requestInit: { headers },
    ...(f ? { fetch: f } : {}),
    reconnectionOptions: { initialReconnectionDelay: 200,
      maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5,
      maxRetries: 2 },
  });
  const errors = [];
  const client = new Client({ name, version: "1.0.0" }, {
    capabilities,
    ...(modern ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {}),
  });
  client.onerror = (e) => errors.push(String(e?.message ?? e));
  if (handlers) await handlers(client);
  await client.connect(transport);
  return { client, transport, sdk, errors,
    sessionId: () => transport.sessionId };
}

/*
 * One tools/call with the SDK's callTool. key goes to
 * params._meta.idempotencyKey. Returns {result, ms} or {error: {code,
 * message, data}, ms}.
 */
export async function callTool(c, name, args, { key = null, onprogress,
  signal, timeout = 30000 } = {}) {
  const params = { name, arguments: args };
  if (key !== null) params._meta = { idempotencyKey: key };
  const opts = { timeout, ...(onprogress ? { onprogress } : {}),
    ...(signal ? { signal } : {}) };
  const t0 = Date.now();
  try {
    const result = c.sdk === "2"
      ? await c.client.callTool(params, opts)
      : await c.client.callTool(params, undefined, opts);
    return { result, ms: Date.now() - t0 };
  } catch (e) {
    return { error: { code: e.code, message: e.message, data: e.data },
      ms: Date.now() - t0 };
  }
}

/*
 * A hand-made POST of one JSON-RPC message: {status, headers, messages
 * (parsed from the JSON body or from every SSE data line)}.
 */
export async function rawPost(url, msg, headers = {}) {
  const res = await fetch(url, { method: "POST", headers: {
    "content-type": "application/json",
    accept: "application/json, text/event-stream", ...headers },
  body: JSON.stringify(msg) });
  const body = await res.text();
  const ct = res.headers.get("content-type") ?? "";
  let messages = [];
  if (ct.includes("text/event-stream")) {
    for (const ev of body.split(/\r?\n\r?\n/)) {
      const data = ev.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) try { messages.push(JSON.parse(data)); } catch { messages.push(data); }
    }
  } else if (body) {
    try { messages = [JSON.parse(body)]; } catch { messages = [body]; }
  }
  return { status: res.status, headers: Object.fromEntries(res.headers),
    messages, body };
}
