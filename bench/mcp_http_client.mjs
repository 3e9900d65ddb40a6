import { readFileSync } from "node:fs";
import { Agent, request as httpRequest } from "node:http";
// mcp_http_client.mjs -- one measurement for bench/mcp.sh's HTTP part:
// tools/call round trips per second to server-everything's echo tool over
// MCP's Streamable HTTP transport, CLIENTS sessions each making one call at
// a time, for SECONDS seconds.
//   node mcp_http_client.mjs MODE SECONDS CLIENTS BASEURL [MODE+NAME: VALUE...]
// MODE: unkeyed (no idempotency key), fresh (a new key per call), replay
// (one key per client, called once before the timing starts, so that every
// timed call is a replay). BASEURL is the MCP endpoint: the server's own
// (a direct run: MODE unkeyed) or idem mcp --listen's. Each LABEL+NAME: VALUE
// (here LABEL is MODE) adds the header NAME: VALUE to every request of that
// target's clients (bench/mcp.sh's replay_checked: Authorization: Bearer
// bench, the credential its proxy's --principal names).
//
// A plain client on node:http (keep-alive: one connection per client
// loop) rather than the SDK's client, whose own work per call would
// hide what the proxy costs. Each client opens its own session (initialize,
// mcp-session-id, notifications/initialized), then sends Mcp-Session-Id and
// MCP-Protocol-Version on every request. Answers are read as JSON or as an
// event stream (the data: lines). Every answer is checked (the echo's text;
// for replay _meta["idem/replayed"] === true, otherwise not); a wrong one
// stops the run with exit 1. Prints one JSON line: ops_per_s, p50_ms,
// p99_ms (the latency of one call), calls and seconds (timed), the
// client's own CPU time per timed call (a client is not free: on a small
// machine the client can be what limits the fastest modes) and all_calls
// (the warm-up's too).
//
//   node mcp_http_client.mjs turns SECONDS CLIENTS LABEL:MODE=URL... [LABEL+NAME: VALUE...]
// Several targets side by side: each gets its own CLIENTS sessions, all
// are warmed up, then they take turns of 300 ms (the order rotating) until
// each has had SECONDS, each timed over its own turns only; one JSON line
// each, "mode" being its LABEL. On a shared machine whose speed drifts
// within seconds, runs made one after the other compare moments of the
// machine as much as the targets. With WATCH=NAME=PID,... (and CLK_TCK,
// default 100) the CPU time of those processes during a target's turns is
// charged to it: NAME_cpu_ms_per_call.
const argv = process.argv.slice(2);
const turns = argv[0] === "turns";
const [secs, nclients] = argv.slice(1, 3);
// The targets: LABEL:MODE=URL each in turns, else the one of the arguments;
// LABEL+NAME: VALUE, a header for LABEL's requests.
const rest = turns ? argv.slice(3) : argv.slice(4);
const extra = rest.map((t) => /^([a-z_]+)\+([A-Za-z0-9-]+):\s*(.*)$/.exec(t));
const targets = (turns ? rest.filter((t, i) => !extra[i]) : [`${argv[0]}:${argv[0]}=${argv[3]}`]).map((t) => {
  const m = /^([a-z_]+):(unkeyed|fresh|replay)=(http:\/\/.+)$/.exec(t);
  return m ? { label: m[1], mode: m[2], url: m[3], headers: {} } : null;
});
for (const x of extra.filter(Boolean)) {
  const t = targets.find((t) => t && t.label === x[1]);
  if (t) t.headers[x[2].toLowerCase()] = x[3];
  else targets.push(null);
}
if (!(Number(secs) > 0) || !(Number(nclients) >= 1) || !targets.length ||
    targets.includes(null) || (!turns && rest.some((t, i) => !extra[i]))) {
  console.error("usage: node mcp_http_client.mjs unkeyed|fresh|replay SECONDS CLIENTS URL [MODE+NAME: VALUE...]\n" +
    "       node mcp_http_client.mjs turns SECONDS CLIENTS LABEL:MODE=URL... [LABEL+NAME: VALUE...]");
  process.exit(2);
}
const PROTOCOL = "2025-06-18";
// node:http with a keep-alive agent: about a third of the CPU per request
// that fetch (undici) costs, which on a small machine is what the fastest
// modes are limited by.
const agent = new Agent({ keepAlive: true, maxSockets: Infinity });
const tag = `${process.pid}-${Date.now()}`;

function fail(what, detail) {
  console.error(`mcp_http_client: ${what}: ${detail}`);
  process.exit(1);
}

// The JSON-RPC answer to request id in a response body: one JSON object, or
// an event stream whose data: lines each hold one message.
function answer(ctype, text, id) {
  if (ctype.startsWith("application/json")) {
    const m = JSON.parse(text);
    return m.id === id ? m : null;
  }
  if (ctype.startsWith("text/event-stream")) {
    for (const line of text.split("\n")) {
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (!data) continue;
      const m = JSON.parse(data);
      if (m.id === id && !m.method) return m;
    }
    return null;
  }
  throw new Error(`content-type ${ctype}`);
}

class Client {
  constructor(n, target) {
    this.n = n;
    this.url = target.url;
    this.mode = target.mode;
    this.extra = target.headers;
    this.session = null;
    this.id = 0;
    this.calls = 0;
  }
  headers() {
    const h = { "content-type": "application/json",
      accept: "application/json, text/event-stream", ...this.extra };
    if (this.session) {
      h["mcp-session-id"] = this.session;
      h["mcp-protocol-version"] = PROTOCOL;
    }
    return h;
  }
  post(body) {
    const data = JSON.stringify(body);
    const headers = { ...this.headers(), "content-length": Buffer.byteLength(data) };
    return new Promise((resolve, reject) => {
      const rq = httpRequest(this.url, { method: "POST", headers, agent }, (res) => {
        const chunks = [];
        res.on("data", (d) => chunks.push(d));
        res.on("end", () => resolve({
          res: { status: res.statusCode,
            headers: { get: (n) => res.headers[n.toLowerCase()] ?? null } },
          text: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      });
      rq.on("error", reject);
      rq.end(data);
    });
  }
  async request(method, params) {
    const id = ++this.id;
    const { res, text } = await this.post({ jsonrpc: "2.0", id, method, params });
    if (res.status !== 200)
      fail(`client ${this.n}: ${method}`, `HTTP ${res.status}: ${text}`);
    const m = answer(res.headers.get("content-type") ?? "", text, id);
    if (!m) fail(`client ${this.n}: ${method}`, `no answer to id ${id}: ${text}`);
    return { res, m };
  }
  async open() {
    const { res, m } = await this.request("initialize", {
      protocolVersion: PROTOCOL, capabilities: {},
      clientInfo: { name: "idem-bench-http", version: "1" } });
    if (!m.result) fail(`client ${this.n}: initialize`, JSON.stringify(m));
    this.session = res.headers.get("mcp-session-id");
    if (!this.session) fail(`client ${this.n}: initialize`, "no mcp-session-id");
    const { res: r2, text } = await this.post({ jsonrpc: "2.0",
      method: "notifications/initialized" });
    if (r2.status !== 202 && r2.status !== 200)
      fail(`client ${this.n}: notifications/initialized`, `HTTP ${r2.status}: ${text}`);
  }
  // One echo call, checked.
  async call() {
    const message = `hello ${this.n}`;
    const params = { name: "echo", arguments: { message } };
    const mode = this.mode;
    if (mode === "fresh") params._meta = { idempotencyKey: `fresh-${tag}-${this.n}-${this.calls}` };
    else if (mode === "replay") params._meta = { idempotencyKey: `replay-${tag}-${this.n}` };
    this.calls++;
    const { m } = await this.request("tools/call", params);
    if (m.result?.content?.[0]?.text !== `Echo: ${message}`)
      fail(`client ${this.n}: tools/call`, `bad answer ${JSON.stringify(m)}`);
    const replayed = m.result._meta?.["idem/replayed"] === true;
    if (replayed !== (mode === "replay" && this.calls > 1))
      fail(`client ${this.n}: tools/call`,
        `${replayed ? "a replay" : "not a replay"} in mode ${mode}: ${JSON.stringify(m)}`);
  }
}

// The CPU time (clock ticks) of each process named in WATCH
// ("NAME=PID,..."), read at the start and end of every turn, so that each
// target is charged with what the processes spent during its own turns.
const watch = (process.env.WATCH || "").split(",").filter(Boolean).map((w) => {
  const [name, pid] = w.split("=");
  return { name, pid };
});
const HZ = Number(process.env.CLK_TCK || 100);
function ticks() {
  return watch.map(({ pid }) => {
    try {
      const f = readFileSync(`/proc/${pid}/stat`, "utf8");
      const v = f.slice(f.lastIndexOf(")") + 2).split(" ");
      return Number(v[11]) + Number(v[12]); // utime + stime
    } catch {
      return NaN;
    }
  });
}

const TURN_NS = 300_000_000n;
const sets = targets.map((t) => ({ ...t,
  clients: Array.from({ length: Number(nclients) }, (_, n) => new Client(n, t)),
  lat: [], ns: 0n, cpu: 0, ticks: watch.map(() => 0) }));
for (const set of sets) await Promise.all(set.clients.map((c) => c.open()));
// Warm up (connections, JIT, the proxy's and the server's caches); for
// replay the first call of each client is the one that runs and is stored.
// By a count of calls, 1,500 in all (at least 50 a client), not by time:
// a new server's JIT speeds its calls up over its first thousand or so,
// and a warm-up of 50 left a slow mode (fresh, one client) measuring a
// server still half cold, twice as slow a call as the direct run's
// (bench/mcp.sh, 1 client: fresh 184, 211, 306 calls/s in three runs of
// 3 s in a row on one new server; 501 and 506 after 1,500).
const WARMUP = Math.max(50, Math.ceil(1500 / Number(nclients)));
for (const set of sets)
  await Promise.all(set.clients.map(async (c) => { for (let i = 0; i < WARMUP; i++) await c.call(); }));

// Turns of 300 ms, the order rotating, until every target has had SECONDS:
// its clients call until the turn's end, then the calls under way finish
// before the next target's turn (charged to this one).
const total = BigInt(Math.round(Number(secs) * 1e9));
for (let t = 0; sets.some((s) => s.ns < total); t++)
  for (let k = 0; k < sets.length; k++) {
    const set = sets[(t + k) % sets.length];
    if (set.ns >= total) continue;
    const cpu0 = process.cpuUsage();
    const t0 = ticks();
    const start = process.hrtime.bigint();
    const left = total - set.ns;
    const until = start + (left < TURN_NS ? left : TURN_NS);
    await Promise.all(set.clients.map(async (c) => {
      for (;;) {
        const c0 = process.hrtime.bigint();
        if (c0 >= until) break;
        await c.call();
        set.lat.push(Number(process.hrtime.bigint() - c0) / 1e6);
      }
    }));
    set.ns += process.hrtime.bigint() - start;
    const cpu = process.cpuUsage(cpu0);
    set.cpu += (cpu.user + cpu.system) / 1000;
    ticks().forEach((v, i) => { set.ticks[i] += v - t0[i]; });
  }
for (const set of sets) {
  const lat = set.lat.sort((a, b) => a - b);
  const seconds = Number(set.ns) / 1e9;
  const pct = (p) => lat.length ? lat[Math.min(lat.length - 1, Math.floor(p * lat.length))] : null;
  const doc = { mode: set.label, clients: set.clients.length, calls: lat.length,
    seconds, ops_per_s: lat.length / seconds, p50_ms: pct(0.5), p99_ms: pct(0.99),
    client_cpu_ms_per_call: lat.length ? set.cpu / lat.length : null,
    all_calls: set.clients.reduce((a, c) => a + c.calls, 0) };
  watch.forEach(({ name }, i) => {
    if (lat.length && !Number.isNaN(set.ticks[i]))
      doc[`${name}_cpu_ms_per_call`] = set.ticks[i] * 1000 / HZ / lat.length;
  });
  console.log(JSON.stringify(doc));
}
process.exit(0);
