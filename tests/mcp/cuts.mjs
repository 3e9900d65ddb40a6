// cuts.mjs -- the proxy's own error messages quote names it did not choose
// (a tool's name, a key) and cut them to fit: a cut must fall between two
// UTF-8 characters, never inside one, or the JSON encoder refuses the
// message and the client gets no error at all (stdio) or an empty one
// (HTTP). Tool names from the server's tools/list with multi-byte
// characters across each cut, over stdio (raw_server.mjs) and Streamable
// HTTP (an upstream of the test's own).
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import { join } from "node:path";
import { IDEM, TMP, check, eq, finish, watchStderr, startRaw,
  rawCall as call, rawAnswer as answer } from "./lib.mjs";

// The test's upstream takes no credential: --principal none, unless the
// test names a rule of its own.
const noRule = (extra) =>
  extra.includes("--principal") || extra.includes("--tenant-header")
    ? [] : ["--principal", "none"];

const J = JSON.stringify;
const bytes = (s) => Buffer.byteLength(s, "utf8");
// "a" then 150 "é" (2 bytes each): the %.200s of the --require-key refusal
// ends inside the 100th "é" (bytes 199 and 200).
const LONG = "a" + "\u00e9".repeat(150);
// The longest a tool's name may be (it is the store's operation): 85 "€",
// 3 bytes each, 255 bytes.
const EUROS = "\u20ac".repeat(85);

// What a well-formed refusal of an unkeyed call to LONG says: the name cut
// on a character boundary within 200 bytes, whole in data.tool.
function refusal(what, m, code = -31905) {
  eq(`${what}: a JSON-RPC error with its code`, code, m?.error?.code);
  const q = /tool "([^"]*)"/.exec(m?.error?.message ?? "");
  check(`${what}: the message quotes the tool`, q !== null, J(m));
  if (!q) return;
  eq(`${what}: the name cut after its last whole character`,
    "a" + "\u00e9".repeat(99), q[1]);
  check(`${what}: at most 200 bytes of it`, bytes(q[1]) <= 200, bytes(q[1]));
  eq(`${what}: data.tool is the whole name`, LONG, m?.error?.data?.tool);
}

// ---- stdio ---------------------------------------------------------------
{
  const s = startRaw(join(TMP, "stdio.db"), ["--require-key"],
    { RAW_EXTRA_TOOL: LONG });
  s.send(J({ jsonrpc: "2.0", id: "l1", method: "tools/list", params: {} }));
  await s.until(() => answer(s.got, "l1"), "tools/list");
  const listed = answer(s.got, "l1")?.result?.tools?.map((t) => t.name) ?? [];
  check("stdio: the server lists the long tool", listed.includes(LONG), J(listed));
  s.send(call(1, LONG, {}));
  await s.until(() => answer(s.got, 1), "the refusal of the unkeyed call");
  refusal("stdio: unkeyed call refused", answer(s.got, 1));
  // With a key it runs; nothing reached the server before.
  s.send(call(2, "t_plain", {}, "cut-1"));
  await s.until(() => answer(s.got, 2), "a keyed call after it");
  eq("stdio: the proxy still answers", "t_plain",
    answer(s.got, 2)?.result?.content?.[0]?.text);
  eq("stdio: the refused call never reached the server", false,
    s.log().some((l) => l.includes("\u00e9\u00e9") && l.includes("tools/call")));
  s.p.stdin.end();
  eq("stdio: ends", { code: 0, signal: null }, await s.exited);
}

// A message cut by the size of its buffer, not by a precision: a tool name
// longer than any operation (1,200 bytes of "€") with key "k" overflows the
// 1,024 bytes of the refusal of a second call with other arguments while
// the first is in flight, at byte 977 of the name, inside a "€". Both
// calls are answered with whole JSON-RPC errors (the first's name is too
// long for the store; the second is that refusal, or the same as the
// first when the first has left already).
{
  const s = startRaw(join(TMP, "stdio-long.db"));
  const huge = "\u20ac".repeat(400);
  s.p.stdin.write(call(1, huge, { a: 1 }, "k") + "\n" + call(2, huge, { a: 2 }, "k") + "\n");
  await s.until(() => answer(s.got, 1) && answer(s.got, 2), "both answers");
  for (const id of [1, 2]) {
    const e = answer(s.got, id)?.error;
    check(`stdio, tool of 1,200 bytes: call ${id} refused with a whole error`,
      Number.isInteger(e?.code) && typeof e?.message === "string" && e.message.length > 0,
      J(answer(s.got, id)));
  }
  eq("stdio, tool of 1,200 bytes: nothing reached the server", false,
    s.log().some((l) => l.includes("tools/call")));
  s.p.stdin.end();
  eq("stdio, tool of 1,200 bytes: ends", { code: 0, signal: null }, await s.exited);
}

// ---- Streamable HTTP -------------------------------------------------------
let effects = 0;
const upstream = createServer((req, res) => {
  let body = "";
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    let m;
    try { m = JSON.parse(body); } catch { res.writeHead(400); res.end(); return; }
    const answer = (result) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(J({ jsonrpc: "2.0", id: m.id, result }));
    };
    if (m.method === "tools/list")
      return answer({ tools: [
        { name: LONG, inputSchema: { type: "object" } },
        { name: EUROS, inputSchema: { type: "object" } }] });
    if (m.method !== "tools/call") { res.writeHead(202); res.end(); return; }
    effects++;
    // Larger than the proxy's --max-result: acted, not stored.
    answer({ content: [{ type: "text", text: "x".repeat(500) }] });
  });
});
await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
const UP = `http://127.0.0.1:${upstream.address().port}/mcp`;

async function startProxy(extra) {
  const p = spawn(IDEM, ["mcp", "--listen", "127.0.0.1:0", "--upstream", UP,
    "--store", `sqlite:${join(TMP, "http.db")}`, ...noRule(extra), ...extra],
  { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  p.stderr.on("data", (d) => (err += d));
  watchStderr(() => err);
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`proxy did not start: ${err}`)), 20000);
    p.stderr.on("data", () => {
      const mm = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(err);
      if (mm) { clearTimeout(t); resolve(Number(mm[1])); }
    });
  });
  const exited = new Promise((r) => p.on("exit", (c, sig) => r(c ?? sig)));
  return { p, port, exited, stderr: () => err };
}

async function post(port, msg) {
  const r = await fetch(`http://127.0.0.1:${port}/mcp`, { method: "POST",
    headers: { "content-type": "application/json",
      accept: "application/json, text/event-stream" }, body: J(msg) });
  const text = await r.text();
  let m = null;
  try { m = JSON.parse(text); } catch { m = text; }
  return { status: r.status, m };
}
const hcall = (id, name, key) => ({ jsonrpc: "2.0", id, method: "tools/call",
  params: { name, arguments: {}, ...(key ? { _meta: { idempotencyKey: key } } : {}) } });

{
  const px = await startProxy(["--require-key", "--max-result", "100"]);
  const list = await post(px.port, { jsonrpc: "2.0", id: 1, method: "tools/list" });
  eq("http: tools/list passed on", [LONG, EUROS], list.m?.result?.tools?.map((t) => t.name));
  const r = await post(px.port, hcall(2, LONG));
  eq("http: the refusal is HTTP 200", 200, r.status);
  refusal("http: unkeyed call refused", r.m);
  eq("http: nothing reached the server", 0, effects);

  // Keys of 255, 254 and 253 bytes: a record whose outcome is unknown (its
  // result was larger than --max-result) is refused with a message that
  // quotes the key and the 255-byte tool twice each; one of the three puts
  // a "€" across any fixed cut of the message. Each is a whole JSON-RPC
  // error that names the tool and the key in full.
  for (const n of [255, 254, 253]) {
    const key = "k".repeat(n);
    const first = await post(px.port, hcall(10 + n, EUROS, key));
    eq(`http, key of ${n}: too large to store: unknown`, -31903, first.m?.error?.code);
    const again = await post(px.port, hcall(20 + n, EUROS, key));
    eq(`http, key of ${n}: the retry is refused as unknown`, -31903, again.m?.error?.code);
    const msg = again.m?.error?.message ?? "";
    check(`http, key of ${n}: the message names the operator's command in full`,
      msg.includes(`idem keys resolve ${key} --operation ${EUROS}`) &&
      /--completed if it did\.$/.test(msg), J(again.m));
    eq(`http, key of ${n}: data.tool`, EUROS, again.m?.error?.data?.tool);
  }
  eq("http: the server acted once per key", 3, effects);
  px.p.kill("SIGTERM");
  eq("http: the proxy exits 0", 0, await px.exited);
}

upstream.close();
finish();
