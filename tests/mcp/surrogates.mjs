// surrogates.mjs -- lone surrogates in keyed calls, over stdio and over
// `idem mcp --listen`. A JavaScript string may hold a lone UTF-16 surrogate
// ("ok \u{1F600}".slice(0, 4) is "ok \ud83d"), and JSON.stringify writes it
// as an escape. A keyed call whose result holds one acts once, and its retry
// gets the result again byte for byte, the lone surrogate in it; a keyed
// call whose arguments hold one acts once and is replayed; another lone
// surrogate under the same key is a conflict, the same one with its hex
// digits in capitals the same call (docs/mcp-details.md, "Lone surrogates"). Every
// scenario counts what reached the server and checks the ids that came back.
import { createServer } from "node:http";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, record, replayed,
  startRaw, text } from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer, waitFor }
  from "./http_lib.mjs";

const J = JSON.stringify;
const LONE = "ok \u{1F600}".slice(0, 4); // "ok \ud83d"
const OTHER = "ok \u{1F916}".slice(0, 4); // "ok \ud83e": another high half
check("the test's strings hold lone surrogates",
  LONE === "ok \ud83d" && OTHER === "ok \ud83e" && J(LONE) === '"ok \\ud83d"');
const lines = (f) => {
  try { return readFileSync(f, "utf8").split("\n").length - 1; } catch { return 0; }
};
// The raw line of the response with this id, as the client got it.
const rawLine = (got, id) => got.find((l) => {
  try { const m = JSON.parse(l); return m.id === id && !m.method; } catch { return false; }
});
// A keyed tools/call written by hand: args is the arguments' JSON text, so
// that an escape is sent as written ("\\uD83D" in capitals).
const handCall = (id, name, args, key) => `{"jsonrpc":"2.0","id":${J(id)},` +
  `"method":"tools/call","params":{"name":${name},"arguments":${args},` +
  `"_meta":{"idempotencyKey":${J(key)}}}}`;

// ---- stdio, lines written by hand (raw_server.mjs) ------------------------------
{
  const s = startRaw(join(TMP, "raw.db"));
  const calls = (key) => s.log().filter((l) => l.includes(`"${key}"`)).length;

  // 1. A result holding a lone surrogate: stored, and replayed as it came.
  const args = { text: "ok \u{1F600}", keep: 4 };
  s.send(J({ jsonrpc: "2.0", id: 1, method: "tools/call",
    params: { name: "cut", arguments: args, _meta: { idempotencyKey: "res-1" } } }));
  await s.until(() => rawLine(s.got, 1), "the answer with a lone surrogate");
  const result = { content: [{ type: "text", text: LONE }] };
  eq("stdio result: passed on as the server wrote it, under the client's id",
    J({ jsonrpc: "2.0", id: 1, result }), rawLine(s.got, 1));
  check("stdio result: the lone surrogate is in the bytes, escaped",
    rawLine(s.got, 1)?.includes('"ok \\ud83d"'), rawLine(s.got, 1));
  s.send(J({ jsonrpc: "2.0", id: 2, method: "tools/call",
    params: { name: "cut", arguments: args, _meta: { idempotencyKey: "res-1" } } }));
  s.send(J({ jsonrpc: "2.0", id: "r-3", method: "tools/call",
    params: { name: "cut", arguments: args, _meta: { idempotencyKey: "res-1" } } }));
  await s.until(() => rawLine(s.got, 2) && rawLine(s.got, "r-3"), "the retries");
  const marked = { _meta: { "idem/replayed": true }, ...result };
  eq("stdio result: the retry is replayed byte for byte, under its own id",
    J({ jsonrpc: "2.0", id: 2, result: marked }), rawLine(s.got, 2));
  eq("stdio result: and so is the next, under a string id",
    J({ jsonrpc: "2.0", id: "r-3", result: marked }), rawLine(s.got, "r-3"));
  eq("stdio result: the server acted once", 1, calls("res-1"));

  // 2. Arguments holding a lone surrogate: fingerprinted, forwarded as
  //    written, replayed.
  const lone = '{"a":1,"b":2,"s":"ok \\ud83d"}';
  const sent = handCall(10, '"add"', lone, "arg-1");
  s.send(sent);
  await s.until(() => rawLine(s.got, 10), "the call with a lone surrogate");
  eq("stdio arguments: answered under the client's id", "3",
    JSON.parse(rawLine(s.got, 10) ?? "{}").result?.content?.[0]?.text);
  const atServer = s.log().find((l) => l.includes('"arg-1"')) ?? "";
  const sid = J(JSON.parse(atServer || "{}").id);
  eq("stdio arguments: the server got the line as sent (its id the proxy's)",
    handCall("ID", '"add"', lone, "arg-1").replace('"ID"', sid), atServer);
  s.send(handCall(11, '"add"', lone, "arg-1"));
  // The same code unit, its hex digits in capitals: the same call.
  s.send(handCall(12, '"add"', '{"a":1,"b":2,"s":"ok \\uD83D"}', "arg-1"));
  await s.until(() => rawLine(s.got, 11) && rawLine(s.got, 12), "the retries");
  for (const id of [11, 12]) {
    const m = JSON.parse(rawLine(s.got, id) ?? "{}");
    eq(`stdio arguments: retry ${id} replayed under its own id`, [id, true, "3"],
      [m.id, replayed(m.result), m.result?.content?.[0]?.text]);
  }
  // Other strings under the same key: another lone surrogate, U+FFFD (what
  // a lossy reading would make of it), the whole pair.
  s.send(handCall(13, '"add"', '{"a":1,"b":2,"s":"ok \\ud83e"}', "arg-1"));
  s.send(handCall(14, '"add"', '{"a":1,"b":2,"s":"ok \\ufffd"}', "arg-1"));
  s.send(handCall(15, '"add"', '{"a":1,"b":2,"s":"ok \\ud83d\\ude00"}', "arg-1"));
  await s.until(() => [13, 14, 15].every((id) => rawLine(s.got, id)),
    "the conflicts");
  eq("stdio arguments: other strings under the key are conflicts",
    [[13, -31901], [14, -31901], [15, -31901]],
    [13, 14, 15].map((id) => {
      const m = JSON.parse(rawLine(s.got, id) ?? "{}");
      return [m.id, m.error?.code];
    }));
  eq("stdio arguments: the server acted once", 1, calls("arg-1"));

  // 3. Where a lone surrogate cannot stand: in a key (printable ASCII
  //    only) and in a tool's name (the record's operation).
  s.send(handCall(20, '"add"', lone, "k\ud800"));
  s.send(handCall(21, '"add\\udc00"', lone, "name-1"));
  await s.until(() => rawLine(s.got, 20) && rawLine(s.got, 21), "the refusals");
  eq("stdio: a lone surrogate in a key or a tool name is refused",
    [[20, -31906], [21, -32602]], [20, 21].map((id) => {
      const m = JSON.parse(rawLine(s.got, id) ?? "{}");
      return [m.id, m.error?.code];
    }));
  eq("stdio: nothing refused reached the server", [0, 0],
    [calls("k\\ud800"), calls("name-1")]);

  // 4. A keyed call's cancellation whose reason holds a lone surrogate
  //    stays at the proxy, as any: the call goes on, its answer is
  //    recorded, and the retry gets it.
  s.send(J({ jsonrpc: "2.0", id: 30, method: "tools/call",
    params: { name: "silent", arguments: {}, _meta: { idempotencyKey: "cx-1" } } }));
  await s.until(() => calls("cx-1") === 1, "the call at the server");
  const held = JSON.parse(s.log().find((l) => l.includes('"cx-1"'))).id;
  s.send(J({ jsonrpc: "2.0", method: "notifications/cancelled",
    params: { requestId: 30, reason: "gave up \u{1F600}".slice(0, 9) } }));
  s.send(J({ jsonrpc: "2.0", method: "emit", params: { lines: [J({
    jsonrpc: "2.0", id: held, result: { content: [{ type: "text", text: LONE }] } })] } }));
  s.send(J({ jsonrpc: "2.0", id: 31, method: "tools/call",
    params: { name: "silent", arguments: {}, _meta: { idempotencyKey: "cx-1" } } }));
  await s.until(() => rawLine(s.got, 31), "the retry");
  eq("stdio cancelled: the retry gets the late answer",
    J({ jsonrpc: "2.0", id: 31, result: { _meta: { "idem/replayed": true },
      content: [{ type: "text", text: LONE }] } }), rawLine(s.got, 31));
  eq("stdio cancelled: the cancellation did not reach the server, nor an " +
    "answer the client", [false, undefined, 1],
  [s.log().some((l) => l.includes("notifications/cancelled")),
    rawLine(s.got, 30), calls("cx-1")]);
  s.p.stdin.end();
  eq("stdio: ends", { code: 0, signal: null }, await s.exited);
}

{
  // 5. --keep-requests: the request kept for operators holds the escape.
  const store = join(TMP, "keep.db");
  const s = startRaw(store, ["--keep-requests"]);
  s.send(handCall(1, '"add"', '{"a":1,"b":2,"s":"ok \\uD83D"}', "keep-1"));
  await s.until(() => rawLine(s.got, 1), "the kept call");
  eq("--keep-requests: the call acts", "3",
    JSON.parse(rawLine(s.got, 1) ?? "{}").result?.content?.[0]?.text);
  s.p.stdin.end();
  await s.exited;
  const r = record(store, "add", "keep-1");
  eq("--keep-requests: the record keeps the request, the escape in lowercase",
    '{"arguments":{"a":1,"b":2,"s":"ok \\ud83d"},"name":"add"}', r?.request);
}

// ---- stdio, the SDK's client and server (test_server.mjs) ----------------------
{
  const file = join(TMP, "cut.txt");
  const afile = join(TMP, "append.txt");
  const c = await connect({ server: SERVERS.test,
    proxy: ["--store", join(TMP, "sdk.db")] });
  const a = await call(c.client, "cut", { file, text: "ok \u{1F600}", keep: 4 },
    { key: "sdk-res-1" });
  eq("SDK stdio result: the lone surrogate reaches the client", [LONE, "line 1"],
    a.result?.content?.map((x) => x.text));
  const b = await call(c.client, "cut", { file, text: "ok \u{1F600}", keep: 4 },
    { key: "sdk-res-1" });
  check("SDK stdio result: the retry is replayed", replayed(b.result), J(b));
  eq("SDK stdio result: with the lone surrogate", [LONE, "line 1"],
    b.result?.content?.map((x) => x.text));
  eq("SDK stdio result: one effect", 1, lines(file));

  const d = await call(c.client, "append", { file: afile, text: LONE },
    { key: "sdk-arg-1" });
  check("SDK stdio arguments: the call acts, the lone surrogate at the tool",
    text(d.result)?.startsWith(`appended ${LONE} as line 1;`), J(d));
  const e = await call(c.client, "append", { file: afile, text: LONE },
    { key: "sdk-arg-1" });
  check("SDK stdio arguments: the retry is replayed",
    replayed(e.result) && text(e.result) === text(d.result), J(e));
  const f = await call(c.client, "append", { file: afile, text: OTHER },
    { key: "sdk-arg-1" });
  eq("SDK stdio arguments: another lone surrogate is a conflict", -31901,
    f.error?.code);
  eq("SDK stdio arguments: one effect", 1, lines(afile));
  await c.client.close();
}

// ---- HTTP: an upstream of the test's own -----------------------------------------
const effects = {}; // tool -> times it acted
const seen = []; // the bodies of the tools/call POSTs the upstream got
const posts = []; // the bodies of every POST it got
const holding = []; // "hold" calls the test lets answer
const upstream = createServer((req, res) => {
  let body = "";
  req.setEncoding("utf8");
  req.on("data", (d) => (body += d));
  req.on("end", () => {
    if (req.method !== "POST") { res.writeHead(405); res.end(); return; }
    posts.push(body);
    const msg = JSON.parse(body);
    const reply = (result, sse) => {
      const t = J({ jsonrpc: "2.0", id: msg.id, result });
      res.writeHead(200, { "content-type": sse ? "text/event-stream" : "application/json" });
      res.end(sse ? `event: message\ndata: ${t}\n\n` : t);
    };
    if (msg.id === undefined) { res.writeHead(202); res.end(); return; }
    if (msg.method === "initialize")
      return reply({ protocolVersion: msg.params.protocolVersion,
        capabilities: { tools: {} }, serverInfo: { name: "lone", version: "1" } });
    if (msg.method !== "tools/call") return reply({});
    seen.push(body);
    const { name, arguments: a } = msg.params;
    const n = effects[name] = (effects[name] ?? 0) + 1;
    if (name === "hold")
      return holding.push(() => reply({ content: [{ type: "text", text: LONE }] }));
    if (name === "cut" || name === "cut_sse")
      return reply({ content: [{ type: "text", text: a.text.slice(0, a.keep) },
        { type: "text", text: `${name} ${n}` }] }, name === "cut_sse");
    reply({ content: [{ type: "text", text: `${name} ${n}: ${a.s}` }] });
  });
});
await new Promise((r) => upstream.listen(0, "127.0.0.1", r));
const px = await startProxy(`http://127.0.0.1:${upstream.address().port}/mcp`,
  join(TMP, "http.db"));

// A POST of body (a string: sent as written); the JSON-RPC message of the
// answer as raw text (the body, or the last event's data).
async function post(body) {
  const res = await fetch(px.url, { method: "POST", body, headers: {
    "content-type": "application/json",
    accept: "application/json, text/event-stream" } });
  const t = Buffer.from(await res.arrayBuffer()).toString("latin1");
  if (!(res.headers.get("content-type") ?? "").includes("text/event-stream"))
    return { status: res.status, raw: t };
  const events = t.split(/\n\n/).map((ev) => ev.split("\n")
    .filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join(""))
    .filter(Boolean);
  return { status: res.status, raw: events.at(-1) };
}

for (const tool of ["cut", "cut_sse"]) {
  // 6. A result holding a lone surrogate, as a JSON body and as an event.
  const key = `h-res-${tool}`;
  const msg = (id) => J({ jsonrpc: "2.0", id, method: "tools/call", params: {
    name: tool, arguments: { text: "ok \u{1F600}", keep: 4 },
    _meta: { idempotencyKey: key } } });
  const result = { content: [{ type: "text", text: LONE },
    { type: "text", text: `${tool} 1` }] };
  const first = await post(msg(1));
  eq(`HTTP ${tool} result: passed on as the server wrote it, under the client's id`,
    [200, J({ jsonrpc: "2.0", id: 1, result })], [first.status, first.raw]);
  check(`HTTP ${tool} result: the lone surrogate is in the bytes, escaped`,
    first.raw?.includes('"ok \\ud83d"'), first.raw);
  const again = await post(msg(2));
  eq(`HTTP ${tool} result: the retry is replayed byte for byte, under its own id`,
    [200, J({ jsonrpc: "2.0", id: 2,
      result: { _meta: { "idem/replayed": true }, ...result } })],
    [again.status, again.raw]);
  eq(`HTTP ${tool} result: the server acted once`, 1, effects[tool]);
}

{
  // 7. Arguments holding a lone surrogate.
  const lone = '{"s":"ok \\ud83d"}';
  const body = handCall(10, '"echo"', lone, "h-arg-1");
  const first = await post(body);
  eq("HTTP arguments: the call acts, answered under the client's id",
    [10, `echo 1: ${LONE}`], (() => {
      const m = JSON.parse(first.raw ?? "{}");
      return [m.id, m.result?.content?.[0]?.text];
    })());
  eq("HTTP arguments: the server got the body as sent", body, seen.at(-1));
  const retries = [await post(handCall(11, '"echo"', lone, "h-arg-1")),
    await post(handCall(12, '"echo"', '{"s":"ok \\uD83D"}', "h-arg-1"))];
  retries.forEach((r, i) => {
    const m = JSON.parse(r.raw ?? "{}");
    eq(`HTTP arguments: retry ${11 + i} replayed under its own id`,
      [11 + i, true, `echo 1: ${LONE}`],
      [m.id, replayed(m.result), m.result?.content?.[0]?.text]);
  });
  const others = [await post(handCall(13, '"echo"', '{"s":"ok \\ud83e"}', "h-arg-1")),
    await post(handCall(14, '"echo"', '{"s":"ok \\ufffd"}', "h-arg-1"))];
  eq("HTTP arguments: other strings under the key are conflicts",
    [[13, -31901], [14, -31901]], others.map((r) => {
      const m = JSON.parse(r.raw ?? "{}");
      return [m.id, m.error?.code];
    }));
  const refused = [await post(handCall(20, '"echo"', lone, "k\ud800")),
    await post(handCall(21, '"echo\\udc00"', lone, "h-name-1"))];
  eq("HTTP: a lone surrogate in a key or a tool name is refused",
    [[20, -31906], [21, -32602]], refused.map((r) => {
      const m = JSON.parse(r.raw ?? "{}");
      return [m.id, m.error?.code];
    }));
  eq("HTTP arguments: the server acted once, nothing refused reached it",
    [1, undefined], [effects.echo, effects["echo\udc00"]]);

  // What the proxy still cannot read (a number past the double range
  // beside the lone surrogate, a member named twice) is refused when keyed,
  // over HTTP as over stdio: a server could act on it with its key unseen.
  const unread = [
    await post(handCall(40, '"echo"', '{"s":"ok \\ud83d","n":1e400}', "h-big-1")),
    await post('{"jsonrpc":"2.0","id":41,"method":"tools/call","params":' +
      '{"name":"echo","name":"echo2","arguments":{"s":"x"},' +
      '"_meta":{"idempotencyKey":"h-dup-1"}}}')];
  eq("HTTP: keyed calls the proxy cannot read are refused under their ids",
    [[40, -32700], [41, -32600]], unread.map((r) => {
      const m = JSON.parse(r.raw ?? "{}");
      return [m.id, m.error?.code];
    }));
  eq("HTTP: and never reach the server", [1, undefined],
    [effects.echo, effects.echo2]);
}

{
  // 8. A keyed call's cancellation whose reason holds a lone surrogate
  //    stays at the proxy.
  const msg = (id) => J({ jsonrpc: "2.0", id, method: "tools/call", params: {
    name: "hold", arguments: {}, _meta: { idempotencyKey: "h-cx-1" } } });
  const first = post(msg(30));
  await waitFor(() => holding.length === 1, "the call at the server");
  const cancel = await fetch(px.url, { method: "POST", headers: {
    "content-type": "application/json",
    accept: "application/json, text/event-stream" },
  body: J({ jsonrpc: "2.0", method: "notifications/cancelled",
    params: { requestId: 30, reason: "gave up \u{1F600}".slice(0, 9) } }) });
  eq("HTTP cancelled: the cancellation is answered by the proxy", 202,
    cancel.status);
  holding.shift()();
  await first;
  const again = await post(msg(31));
  eq("HTTP cancelled: the retry gets the answer",
    J({ jsonrpc: "2.0", id: 31, result: { _meta: { "idem/replayed": true },
      content: [{ type: "text", text: LONE }] } }), again.raw);
  eq("HTTP cancelled: the cancellation did not reach the server; one effect",
    [false, 1], [posts.some((b) => b.includes("notifications/cancelled")),
      effects.hold]);
}

for (const sdk of ["1", "2"]) {
  // 9. The SDKs' clients: the lone surrogate survives into the result they
  //    hand over, first and replayed.
  const c = await connectHttp(px.url, { sdk });
  const before = effects.cut;
  const args = { text: "ok \u{1F600}", keep: 4 };
  const a = await callTool(c, "cut", args, { key: `h-sdk-${sdk}` });
  const b = await callTool(c, "cut", args, { key: `h-sdk-${sdk}` });
  eq(`HTTP SDK ${sdk}: the lone surrogate reaches the client`,
    [LONE, `cut ${before + 1}`], a.result?.content?.map((x) => x.text));
  check(`HTTP SDK ${sdk}: the retry is replayed, the same`, replayed(b.result) &&
    J(b.result?.content) === J(a.result?.content), J(b));
  eq(`HTTP SDK ${sdk}: one effect`, before + 1, effects.cut);
  await c.client.close();
}
await px.kill("SIGTERM");
upstream.close();

{
  // 10. The SDK's own server (http_server.mjs): a tool argument holding a
  //    lone surrogate reaches it intact, once.
  const srv = await startServer({ more: true });
  const p = await startProxy(srv.url, join(TMP, "http-sdk.db"));
  const c = await connectHttp(p.url, { sdk: "1" });
  const a = await callTool(c, "charge", { title: LONE }, { key: "charge-1" });
  const b = await callTool(c, "charge", { title: LONE }, { key: "charge-1" });
  const o = await callTool(c, "charge", { title: OTHER }, { key: "charge-1" });
  const fx = await srv.effects();
  check("SDK server: the call acts", /^ticket-1 /.test(text(a.result) ?? ""), J(a));
  check("SDK server: the retry is replayed",
    replayed(b.result) && text(b.result) === text(a.result), J(b));
  eq("SDK server: another lone surrogate is a conflict", -31901, o.error?.code);
  eq("SDK server: one effect, the lone surrogate at the tool", [1, [LONE]],
    [fx.effects.charge, fx.log.map((l) => l.title)]);
  await c.client.close();
  await p.kill("SIGTERM");
  await srv.kill();
}
finish();
