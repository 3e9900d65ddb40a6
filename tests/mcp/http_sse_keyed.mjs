// http_sse_keyed.mjs -- `idem mcp --listen`, keyed calls whose answer comes
// as an event stream (text/event-stream) whose final event carries its
// JSON over several data lines (SSE joins them with newlines; JSON may hold
// newlines between its tokens):
//   1. a call sent again after its lease (recovered): the answer the proxy
//      writes itself, marked recovered, keeps every line, and the replay
//      equals it; the tool acted once.
//   2. allocations that fail (failmalloc.c, preloaded into the proxy) while
//      the final event is read: a clear answer, never a crash, and the key
//      neither lost nor freed while the tool may have acted.
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { IDEM, TMP, check, eq, finish, watchStderr } from "./lib.mjs";

// The test's upstream takes no credential: --principal none, unless the
// test names a rule of its own.
const noRule = (extra) =>
  extra.includes("--principal") || extra.includes("--tenant-header")
    ? [] : ["--principal", "none"];

const J = JSON.stringify;
const FAILMALLOC = process.env.IDEM_FAILMALLOC;
if (!FAILMALLOC) {
  console.error("IDEM_FAILMALLOC (the path of libidem_failmalloc.so) is not set");
  process.exit(2);
}

// ---- the upstream -------------------------------------------------------------

let mode = {}; // tool -> "hang" | "split" | "input"
let effects = {}; // tool -> times it acted
let tickets = 0;
const hung = [];

// The final response as one event, its JSON laid out over one data line
// per line.
const eventText = (msg) => "event: message\n" +
  J(msg, null, 2).split("\n").map((l) => `data: ${l}\n`).join("") + "\n";
const resultOf = (n) => ({ content: [{ type: "text", text: `ticket-${n}` }],
  structuredContent: { id: n, lines: ["one", "two"] } });
// The question of MCP 2026-07-28's multi-round calls; pad makes its event
// a length no other allocation of the proxy has.
const question = (pad) => ({ resultType: "input_required", requestState: "st-1",
  inputRequests: { confirm: { method: "elicitation/create", params: {
    message: "Sure?", requestedSchema: { type: "object", properties: {} } } } },
  pad: "p".repeat(pad) });
const PAD = 3001;

const upstream = createServer((req, res) => {
  let body = "";
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    let msg;
    try { msg = JSON.parse(body); } catch { res.writeHead(400); res.end(); return; }
    if (msg.method !== "tools/call") { res.writeHead(202); res.end(); return; }
    const name = msg.params.name;
    const how = mode[name] ?? "split";
    if (how === "hang") { hung.push(res); return; } // never answers, never acts
    res.writeHead(200, { "content-type": "text/event-stream" });
    if (how === "input" && !msg.params.inputResponses) {
      res.end(eventText({ jsonrpc: "2.0", id: msg.id, result: question(PAD) }));
      return;
    }
    effects[name] = (effects[name] ?? 0) + 1;
    const n = ++tickets;
    res.write(eventText({ jsonrpc: "2.0", method: "notifications/message",
      params: { level: "info", data: "working" } }));
    res.end(eventText({ jsonrpc: "2.0", id: msg.id, result: resultOf(n) }));
  });
});
await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
const UP = `http://127.0.0.1:${upstream.address().port}/mcp`;

// ---- the proxy and its clients ----------------------------------------------------

async function startProxy(db, extra = [], env = {}) {
  const p = spawn(IDEM, ["mcp", "--listen", "127.0.0.1:0", "--upstream", UP,
    "--store", `sqlite:${join(TMP, db)}`, ...noRule(extra), ...extra],
  { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
  let err = "";
  p.stderr.on("data", (d) => (err += d));
  watchStderr(() => err);
  const exited = new Promise((r) => p.on("exit", (c, sig) => r(c ?? sig)));
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`proxy did not start: ${err}`)), 20000);
    p.stderr.on("data", () => {
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    exited.then((c) => { clearTimeout(t); reject(new Error(`proxy exited ${c}: ${err}`)); });
  });
  return { p, port, exited, stderr: () => err };
}
// The proxy with failmalloc.c: the first malloc() of size bytes fails.
const failing = (size) => ({ LD_PRELOAD: FAILMALLOC,
  IDEM_FAIL_MALLOC_SIZE: String(size), IDEM_FAIL_MALLOC_COUNT: "1",
  ASAN_OPTIONS: [process.env.ASAN_OPTIONS, "verify_asan_link_order=0"]
    .filter((x) => x).join(":") });

// One POST: {status, type, text, messages (JSON-RPC messages of a JSON body
// or of each event: its data lines joined by newlines, as SSE reads them;
// data that is not JSON is kept as a string)}. A stream cut off is
// {status: 0, error}.
async function post(port, msg) {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/mcp`, { method: "POST",
      headers: { "content-type": "application/json",
        accept: "application/json, text/event-stream" }, body: J(msg) });
    const text = await r.text();
    const type = r.headers.get("content-type") ?? "";
    const parse = (d) => { try { return JSON.parse(d); } catch { return d; } };
    const messages = type.startsWith("text/event-stream")
      ? text.split(/\r?\n\r?\n/).map((ev) => ev.split(/\r?\n/)
        .filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n")).filter((d) => d).map(parse)
      : text ? [parse(text)] : [];
    return { status: r.status, type, text, messages };
  } catch (e) {
    return { status: 0, error: String(e?.cause ?? e), messages: [] };
  }
}
const final = (r, id) => r.messages.find((m) => m?.id === id && !m.method);
const call = (id, name, args, key) => ({ jsonrpc: "2.0", id, method: "tools/call",
  params: { name, arguments: args, _meta: { idempotencyKey: key } } });
const withoutMeta = (result) => {
  if (!result) return result;
  const { _meta, ...rest } = result;
  return rest;
};
// Retries every 100 ms while the key is in flight (-31902).
async function retryPastLease(port, msg) {
  let r;
  for (let i = 0; i < 150; i++) {
    r = await post(port, msg);
    if (final(r, msg.id)?.error?.code !== -31902) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  return r;
}

// 1. Recovered: the first attempt got no answer within --call-timeout (the
// server never acted); the retry after the lease is sent again, and its
// answer, an event whose JSON spans many data lines, is passed on marked
// recovered, every line kept. The replay is that result.
console.error("-- 1. recovered, the final event over many data lines");
{
  const px = await startProxy("recovered.db", ["--call-timeout", "1s",
    "--lease", "1s", "--attach-wait", "0"]);
  mode.rec = "hang";
  const a = await post(px.port, call(1, "rec", { n: 1 }, "k-rec"));
  eq("recovered: the first attempt's outcome is unknown", -31903, final(a, 1)?.error?.code);
  mode.rec = "split";
  const b = await retryPastLease(px.port, call(2, "rec", { n: 1 }, "k-rec"));
  const fb = final(b, 2);
  eq("recovered: an event stream", "text/event-stream", b.type);
  check("recovered: the log event passed on",
    b.messages.some((m) => m?.method === "notifications/message"), b.text);
  check("recovered: its final response is whole JSON", typeof fb === "object" && fb !== null,
    JSON.stringify(b.text));
  eq("recovered: the server's result, every line of it", resultOf(tickets),
    withoutMeta(fb?.result));
  eq("recovered: marked recovered", true, fb?.result?._meta?.["idem/recovered"]);
  eq("recovered: the tool acted once", 1, effects.rec);
  const c = await post(px.port, call(3, "rec", { n: 1 }, "k-rec"));
  const fc = final(c, 3);
  eq("recovered: the replay is the recovered result", withoutMeta(fb?.result),
    withoutMeta(fc?.result));
  eq("recovered: the replay is marked", [true, true],
    [fc?.result?._meta?.["idem/replayed"], fc?.result?._meta?.["idem/recovered"]]);
  eq("recovered: still one effect", 1, effects.rec);
  px.p.kill("SIGTERM");
  eq("recovered: the proxy exits 0", 0, await px.exited);
}

// 2a. The copy of the question's event (input_required) cannot be
// allocated: the question still reaches the client, whole, from the
// response the proxy read, and the key stays held for the next round,
// which acts once.
console.error("-- 2a. no memory for the question's event");
{
  const q = eventText({ jsonrpc: "2.0", id: 1, result: question(PAD) });
  const px = await startProxy("oom-event.db", [], failing(Buffer.byteLength(q)));
  mode.ask = "input";
  const a = await post(px.port, call(1, "ask", { n: 2 }, "k-ask"));
  check("no memory for the event: the proxy said it failed the allocation",
    /failmalloc: malloc\(\d+\) failed/.test(px.stderr()), px.stderr());
  eq("no memory for the event: the client got the question, whole", question(PAD),
    final(a, 1)?.result);
  eq("no memory for the event: nothing acted yet", undefined, effects.ask);
  const round2 = call(2, "ask", { n: 2 }, "k-ask");
  round2.params.inputResponses = { confirm: { action: "accept", content: {} } };
  round2.params.requestState = "st-1";
  const b = await post(px.port, round2);
  eq("no memory for the event: the next round acts", resultOf(tickets), final(b, 2)?.result);
  const c = await post(px.port, call(3, "ask", { n: 2 }, "k-ask"));
  eq("no memory for the event: a retry replays the result",
    resultOf(tickets), withoutMeta(final(c, 3)?.result));
  eq("no memory for the event: one effect", 1, effects.ask);
  eq("no memory for the event: the proxy still runs", null, px.p.exitCode);
  px.p.kill("SIGTERM");
  eq("no memory for the event: the proxy exits 0", 0, await px.exited);
}

// 2b. The copy of the final response cannot be allocated: the tool acted
// and its result cannot be kept. The client is told so (-31903, "out of
// memory"), the key is held for one lease (never freed: a retry meanwhile
// is in flight), and the retry after it is sent again, marked recovered.
console.error("-- 2b. no memory for the final response");
{
  const data = J({ jsonrpc: "2.0", id: 1, result: resultOf(tickets + 1) }, null, 2);
  const px = await startProxy("oom-final.db", ["--lease", "2s", "--attach-wait", "0"],
    failing(Buffer.byteLength(data) + 1));
  mode.keep = "split";
  const a = await post(px.port, call(1, "keep", { n: 3 }, "k-keep"));
  const fa = final(a, 1);
  check("no memory for the response: the proxy said it failed the allocation",
    /failmalloc: malloc\(\d+\) failed/.test(px.stderr()), px.stderr());
  eq("no memory for the response: outcome unknown", -31903, fa?.error?.code);
  check("no memory for the response: the message says why",
    /out of memory/.test(fa?.error?.message ?? ""), J(fa));
  check("no memory for the response: the result never reached the client unrecorded",
    !a.messages.some((m) => m?.result), a.text);
  eq("no memory for the response: the tool acted", 1, effects.keep);
  const b = await post(px.port, call(2, "keep", { n: 3 }, "k-keep"));
  eq("no memory for the response: the key is held (in flight)", -31902,
    final(b, 2)?.error?.code);
  const c = await retryPastLease(px.port, call(3, "keep", { n: 3 }, "k-keep"));
  eq("no memory for the response: the retry after the lease is recovered", true,
    final(c, 3)?.result?._meta?.["idem/recovered"]);
  eq("no memory for the response: two effects (the first acted)", 2, effects.keep);
  px.p.kill("SIGTERM");
  eq("no memory for the response: the proxy exits 0", 0, await px.exited);
}

for (const r of hung) r.destroy();
upstream.close();
finish();
