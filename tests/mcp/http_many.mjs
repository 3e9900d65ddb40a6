// http_many.mjs -- `idem mcp --listen` with thousands of keyed calls held
// open at a slow server at once: a fixed number of threads, replays and
// other requests answered meanwhile, and every call answered with its own
// ticket once the server lets them go. One effect per key.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { Agent, createServer, request } from "node:http";
import { join } from "node:path";
import { IDEM, TMP, check, eq, finish, watchStderr } from "./lib.mjs";

// 2,000 calls hold about 4,000 descriptors in this process (each call's
// client socket and the server's end of the proxy's connection): fewer when
// the descriptor limit would not allow that, said on standard error.
const fdLimit = Number(/Max open files\s+(\d+)/.exec(readFileSync("/proc/self/limits", "utf8"))?.[1] ?? 1024);
const N = Number(process.env.HTTP_MANY ?? Math.min(2000, Math.floor((fdLimit - 200) / 2.2)));
if (N < 2000) console.error(`http_many: ${N} calls (the descriptor limit is ${fdLimit})`);

// The server: acts at once (a ticket per call), then holds the answer
// until the test releases every call, sending a progress event first so
// that the stream is open at the proxy.
let tickets = 0;
const effects = new Map(); // key -> times acted
const held = [];
let releaseAll = null;
const released = new Promise((r) => (releaseAll = r));
const server = createServer((req, res) => {
  let body = "";
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    const msg = JSON.parse(body);
    if (msg.method !== "tools/call") { res.writeHead(202); res.end(); return; }
    const key = msg.params?._meta?.idempotencyKey ?? "-";
    effects.set(key, (effects.get(key) ?? 0) + 1);
    const n = ++tickets;
    const answer = () => res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: "2.0", id: msg.id,
      result: { content: [{ type: "text", text: `ticket-${n}` }], structuredContent: { id: n } } })}\n\n`);
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(`event: message\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"${key}","progress":1}}\n\n`);
    if (msg.params.name === "fast") { answer(); return; }
    held.push(key);
    released.then(answer);
  });
});
server.maxConnections = Infinity;
server.keepAliveTimeout = 60000;
await new Promise((r) => server.listen(0, "127.0.0.1", 4096, r));
const UP = server.address().port;

const px = spawn(IDEM, ["mcp", "--listen", "127.0.0.1:0", "--upstream",
  `http://127.0.0.1:${UP}/mcp`, "--store", `sqlite:${join(TMP, "many.db")}`, "--principal", "none"],
{ stdio: ["ignore", "ignore", "pipe"] });
let err = "";
px.stderr.on("data", (d) => (err += d));
watchStderr(() => err);
const port = await new Promise((resolve, reject) => {
  px.stderr.on("data", () => {
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
    if (m) resolve(Number(m[1]));
  });
  px.on("exit", (c) => reject(new Error(`proxy exited ${c}: ${err}`)));
});

const agent = new Agent({ keepAlive: true, maxSockets: Infinity });
// One POST; resolves with the whole answer text, and calls onFirst when the
// first bytes of the body arrive.
function post(msg, onFirst = () => {}) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify(msg);
    const rq = request({ host: "127.0.0.1", port, path: "/mcp", method: "POST", agent,
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream",
        "content-length": Buffer.byteLength(body) } }, (res) => {
      let text = "", first = true;
      res.on("data", (d) => { text += d; if (first) { first = false; onFirst(); } });
      res.on("end", () => resolve({ status: res.statusCode, text }));
      res.on("error", reject);
    });
    rq.on("error", reject);
    rq.end(body);
  });
}
const call = (id, name, key, args = { n: id }) => ({ jsonrpc: "2.0", id,
  method: "tools/call", params: { name, arguments: args, _meta: { idempotencyKey: key } } });
const finalOf = (text, id) => text.split("\n\n").map((e) => e.split("\n")
  .filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join(""))
  .filter(Boolean).map((d) => JSON.parse(d)).find((m) => m.id === id && !m.method);
const threads = () => Number(/Threads:\s+(\d+)/.exec(readFileSync(`/proc/${px.pid}/status`, "utf8"))[1]);

// A result stored before the burst, replayed during it.
const first = finalOf((await post(call(0, "fast", "k-replay", {}))).text, 0);
const threadsIdle = threads();

// N keyed calls, each held at the server with its stream open.
let streaming = 0;
let allStreaming;
const allOpen = new Promise((r) => (allStreaming = r));
const calls = [];
for (let i = 1; i <= N; i++)
  calls.push(post(call(i, "slow", `k-${i}`), () => { if (++streaming === N) allStreaming(); }));
const until = setTimeout(() => allStreaming(), 120000);
await allOpen;
clearTimeout(until);
eq(`all ${N} streams open at once`, N, streaming);
eq(`all ${N} calls at the server`, N, held.length);
const threadsBusy = threads();
check(`threads fixed (${threadsIdle} idle, ${threadsBusy} with ${N} streams)`,
  threadsBusy <= threadsIdle + 2 && threadsBusy <= 16, `${threadsIdle} -> ${threadsBusy}`);

// Meanwhile a replay is answered, from another connection.
const t0 = performance.now();
const r = await post(call("again", "fast", "k-replay", {}));
const replay = JSON.parse(r.text);
if (!replay?.result) console.error("replay answer:", r.status, r.text);
const ms = performance.now() - t0;
eq("replay during the burst: same ticket", first?.result?.structuredContent?.id,
  replay?.result?.structuredContent?.id);
eq("replay during the burst: marked", true, replay?.result?._meta?.["idem/replayed"]);
console.error(`replay answered in ${ms.toFixed(1)} ms with ${N} streams open`);

releaseAll();
const answers = await Promise.all(calls);
const ids = new Set();
let right = 0;
answers.forEach((a, i) => {
  const f = finalOf(a.text, i + 1);
  if (f?.result?.content?.[0]?.text === `ticket-${f?.result?.structuredContent?.id}`) right++;
  ids.add(f?.result?.structuredContent?.id);
});
eq("every call answered with its ticket", N, right);
eq("every ticket distinct", N, ids.size);
eq("one effect per key", N + 1, [...effects.values()].reduce((a, b) => a + b, 0));
check("no key acted twice", [...effects.values()].every((v) => v === 1));

px.kill("SIGTERM");
eq("proxy exits 0", 0, await new Promise((r2) => px.on("exit", r2)));
agent.destroy();
server.closeAllConnections();
server.close();
finish();
