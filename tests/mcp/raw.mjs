// idem mcp byte for byte, with a server that logs what it reads
// (raw_server.mjs) and a client that writes lines by hand: lines that are
// not JSON, batches, server-to-client requests with the client's ids,
// out-of-order responses and notifications pass unchanged and in order;
// refused messages never reach the server; exit status, signals, and the
// end of the client's input.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { IDEM, TMP, check, eq, finish, sleep, startRaw, rawCall as call,
  rawParsed as parsed, rawAnswer as answer } from "./lib.mjs";

const store = join(TMP, "idem.db");
const start = (opts, env) => startRaw(store, opts, env);
const J = JSON.stringify;

{
  const s = start();
  // Client to server, unchanged: not JSON, spaces, a batch, a huge id.
  const lines = ["this is not json {", '  {"jsonrpc":"2.0","method":"n0"}  ',
    '[{"jsonrpc":"2.0","method":"n1"},{"jsonrpc":"2.0","id":9,"method":"ping"}]',
    '{"jsonrpc":"2.0","id":123456789012345678901234,"method":"m"}',
    '{"jsonrpc":"2.0","method":"tools/call","params":{"name":"add"}}'];
  lines.forEach(s.send);
  // Server to client, unchanged and in order.
  const out = ["server says hi", '{"jsonrpc":"2.0","method":"notifications/message","params":{}}',
    '{"jsonrpc":"2.0","id":1,"method":"roots/list"}',
    '[{"jsonrpc":"2.0","id":9,"result":{}},{"jsonrpc":"2.0","method":"x"}]',
    '{"jsonrpc":"2.0","id":2,"result":{"b":1}}', '{"jsonrpc":"2.0","id":1,"result":{"a":1}}',
    '{"jsonrpc":"2.0","id":1e300,"result":{}}', '{"jsonrpc":"2.0","id":-1.5,"result":{}}'];
  const emit = J({ jsonrpc: "2.0", method: "emit", params: { lines: out } });
  s.send(emit);
  await s.until(() => s.got.length >= out.length, "the emitted lines");
  eq("client lines reach the server unchanged, in order", [...lines, emit],
    s.log().slice(0, lines.length + 1));
  eq("server lines reach the client unchanged, in order", out, s.got.slice(0, out.length));
  s.got.length = 0;

  // initialize: the capability is added, the rest kept.
  s.send(J({ jsonrpc: "2.0", id: "init-1", method: "initialize", params: {} }));
  await s.until(() => answer(s.got, "init-1"), "initialize");
  const init = answer(s.got, "init-1");
  eq("initialize: capabilities kept and extended", { tools: {}, experimental: {
    "idem/idempotency": { keyLocations: ["params._meta.idempotencyKey",
      "params.idempotencyKey"], requireKey: false, onUnknown: "forward",
    replayedMeta: "idem/replayed", recoveredMeta: "idem/recovered",
    attachWaitMs: 25000, storeToolErrors: true, keyedCancel: "hold" } } },
  init?.result?.capabilities);
  eq("initialize: server info kept", { name: "raw", version: "1" },
    init?.result?.serverInfo);

  // A keyed call, then a notification: the call reaches the server as the
  // client wrote it but under an id the proxy owns, and the notification
  // is not held back while the key is claimed.
  const before = s.log().length;
  const c1 = call(5, "add", { a: 2, b: 3 }, "raw-1");
  s.send(c1);
  s.send('{"jsonrpc":"2.0","method":"notifications/after"}');
  await s.until(() => answer(s.got, 5), "the keyed call");
  const sent = s.log().slice(before, before + 2);
  const atServer = sent.find((l) => l.includes('"raw-1"'));
  eq("keyed: both reached the server", true,
    sent.includes('{"jsonrpc":"2.0","method":"notifications/after"}') &&
    atServer !== undefined);
  eq("keyed: the call byte for byte but its id", c1,
    atServer?.replace(/"id":"idem-[0-9a-f]+-[0-9]+"/, '"id":5'));
  const live = answer(s.got, 5);
  eq("keyed: live result", { content: [{ type: "text", text: "5" }],
    structuredContent: { sum: 5, half: 0.1 } }, live?.result);
  s.send(call("six", "add", { a: 2, b: 3 }, "raw-1"));
  await s.until(() => answer(s.got, "six"), "the replay");
  const rep = answer(s.got, "six");
  eq("replay: under the new id, marked", { content: [{ type: "text", text: "5" }],
    structuredContent: { sum: 5, half: 0.1 }, _meta: { "idem/replayed": true } },
  rep?.result);
  eq("replay: the server saw one call", 1,
    s.log().filter((l) => l.includes('"raw-1"')).length);

  // A keyed call whose server asks the client with the call's own id (as
  // the server saw it: keyed calls reach the server under ids the proxy
  // owns): the two id spaces are kept apart.
  s.got.length = 0;
  s.send(call(1, "ask", {}, "raw-ask"));
  await s.until(() => parsed(s.got).some((m) => m.method === "sampling/createMessage"),
    "the server's request");
  const asked = parsed(s.got)[0]?.id;
  check("server request passes with the server's id",
    typeof asked === "string" && asked.startsWith("idem-"), asked);
  const reply = `{"jsonrpc":"2.0","id":${JSON.stringify(asked)},"result":{"model":"m"}}`;
  s.send(reply);
  await s.until(() => answer(s.got, 1), "the call's answer");
  check("the client's reply reached the server unchanged", s.log().includes(reply));
  eq("the call got the answer made of the reply", 'client said {"model":"m"}',
    answer(s.got, 1)?.result?.content?.[0]?.text);
  s.send(call(2, "ask", {}, "raw-ask"));
  await s.until(() => answer(s.got, 2), "the replay of ask");
  eq("ask: replayed", 'client said {"model":"m"}', answer(s.got, 2)?.result?.content?.[0]?.text);

  // Refused before the server: duplicate names, keyed calls in a batch,
  // bad keys.
  s.got.length = 0;
  const logged = s.log().length;
  s.send('{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","name":"rm","arguments":{}}}');
  s.send(`[${call(8, "add", { a: 1, b: 1 }, "raw-b")},{"jsonrpc":"2.0","method":"n"}]`);
  s.send(call(10, "add", { a: 1, b: 1 }, "has space"));
  s.send(call(11, "add", { a: 1, b: 1 }, 42));
  s.send(call(12, "add", { a: 1, b: 1 }, "x".repeat(256)));
  await s.until(() => s.got.length >= 5, "the refusals");
  const m = parsed(s.got);
  eq("duplicate names refused", -32600, m.find((x) => !Array.isArray(x) &&
    x.error && /twice/.test(x.error.message))?.error?.code);
  eq("keyed call in a batch refused", [{ jsonrpc: "2.0", id: 8, error: { code: -31909,
    message: m.find(Array.isArray)?.[0]?.error?.message } }], m.find(Array.isArray));
  eq("key with a space refused", -31906, answer(s.got, 10)?.error?.code);
  eq("key not a string refused", -31906, answer(s.got, 11)?.error?.code);
  eq("key too long refused", -31906, answer(s.got, 12)?.error?.code);
  // Only the batch's notification reached the server: nobody would learn
  // that it was dropped.
  eq("none of the requests reached the server, the notification did",
    ['{"jsonrpc":"2.0","method":"n"}'], s.log().slice(logged));

  // The server's exit status ends the proxy, the client's input still open.
  s.send(J({ jsonrpc: "2.0", method: "exit", params: { code: 7 } }));
  const e = await s.exited;
  eq("exit status passed on", { code: 7, signal: null }, e);
}

{
  // Retention ends protection: after it a retry acts again (also when the
  // result was replayed from the proxy's memory before).
  const s = start(["--retention", "1s"]);
  const adds = () => s.log().filter((l) => l.includes('"ret-1"')).length;
  s.send(call(1, "add", { a: 1, b: 2 }, "ret-1"));
  await s.until(() => answer(s.got, 1), "the first call");
  s.send(call(2, "add", { a: 1, b: 2 }, "ret-1"));
  await s.until(() => answer(s.got, 2), "the replay");
  eq("retention: replayed within it", [true, 1],
    [answer(s.got, 2)?.result?._meta?.["idem/replayed"], adds()]);
  await sleep(1300);
  s.send(call(3, "add", { a: 1, b: 2 }, "ret-1"));
  await s.until(() => answer(s.got, 3), "the call after retention");
  eq("retention: after it the call acts again", [undefined, 2],
    [answer(s.got, 3)?.result?._meta?.["idem/replayed"], adds()]);
  s.p.stdin.end();
  eq("retention: ends", { code: 0, signal: null }, await s.exited);
}
{
  // A retry that repeats its line but for the id is answered from memory
  // without being read again (mcp_keyed_replay_seen()): under its own id,
  // whatever the id, and only when the line is the same call but for a
  // plainly written id. Every other line is read whole and decided as
  // before: other arguments, a name given twice, trailing bytes, other
  // spacing, an id written with escapes, a fraction or too many digits.
  const s = start();
  const adds = () => s.log().filter((l) => l.includes('"seen-1"')).length;
  const base = call(1, "add", { a: 4, b: 5 }, "seen-1");
  const as = (idText) => base.replace('"id":1,', `"id":${idText},`);
  const byText = (idText) => s.got.find((l) => l.startsWith(`{"jsonrpc":"2.0","id":${idText},`));
  s.send(base);
  await s.until(() => answer(s.got, 1), "the first call");
  eq("seen: the first call ran", ["9", undefined],
    [answer(s.got, 1)?.result?.content?.[0]?.text, answer(s.got, 1)?.result?._meta]);
  // The ids as the client wrote them, each answered under its own text.
  const ids = ["2", "3", "-4", "0", '"s-5"', '""', "123456789012345",
    "1234567890123456", "1.5", "1e3", '"a\\"b"', '"\\u00e9"', "-0", "07"];
  for (const idText of ids) {
    s.send(as(idText));
    if (idText === "07") continue; // not JSON: answered below
    await s.until(() => byText(idText), `the retry with id ${idText}`);
    const m = JSON.parse(byText(idText));
    eq(`seen: id ${idText}: replayed under its own id`,
      [JSON.parse(idText), "9", true],
      [m.id, m.result?.content?.[0]?.text, m.result?._meta?.["idem/replayed"]]);
  }
  // "07" is no JSON number: the line is not JSON, a keyed call the proxy
  // cannot read, refused under no id.
  await s.until(() => parsed(s.got).some((m) => m?.error?.code === -32700),
    "the refusal of id 07");
  eq("seen: id 07: not JSON, refused", [-32700, null],
    [parsed(s.got).find((m) => m?.error?.code === -32700)?.error?.code,
      parsed(s.got).find((m) => m?.error?.code === -32700)?.id]);
  s.got.length = 0;
  // Other arguments under the key: a conflict, nothing sent.
  s.send(call(30, "add", { a: 4, b: 6 }, "seen-1"));
  await s.until(() => answer(s.got, 30), "the conflict");
  eq("seen: other arguments: conflict", -31901, answer(s.got, 30)?.error?.code);
  // The id given twice (the line is the remembered one up to its first id):
  // refused as any name given twice.
  s.send(base.replace('"id":1,', '"id":31,"id":32,'));
  await s.until(() => parsed(s.got).some((m) => m?.error?.code === -32600),
    "the refusal of two ids");
  check("seen: the id given twice: refused",
    /twice/.test(parsed(s.got).find((m) => m?.error?.code === -32600)?.error?.message));
  // Trailing bytes after the line: not JSON, refused.
  s.got.length = 0;
  s.send(as("33") + " x");
  await s.until(() => parsed(s.got).some((m) => m?.error?.code === -32700),
    "the refusal of trailing bytes");
  eq("seen: trailing bytes: refused, under the id read from the line", -32700,
    parsed(s.got).find((m) => m?.error?.code === -32700)?.error?.code);
  // Other spacing: the same call, read whole: replayed.
  s.send(as("34").replace('"method":', ' "method" : '));
  await s.until(() => answer(s.got, 34), "the retry spaced otherwise");
  eq("seen: other spacing: replayed", ["9", true],
    [answer(s.got, 34)?.result?.content?.[0]?.text,
      answer(s.got, 34)?.result?._meta?.["idem/replayed"]]);
  eq("seen: the server saw one call of the key", 1, adds());
  s.p.stdin.end();
  eq("seen: ends", { code: 0, signal: null }, await s.exited);
}
{
  // --require-key learns the annotations from every page of tools/list.
  const s = start(["--require-key"]);
  const ask = async (id, name, key) => {
    s.send(call(id, name, {}, key));
    await s.until(() => answer(s.got, id), `the answer to ${id}`);
    const a = answer(s.got, id);
    return a?.error ? a.error.code : a?.result?.content?.[0]?.text;
  };
  eq("require-key: nothing listed yet: refused", -31905, await ask(1, "t_ro"));
  s.send(J({ jsonrpc: "2.0", id: "l1", method: "tools/list", params: {} }));
  await s.until(() => answer(s.got, "l1"), "page 1");
  eq("require-key: readOnlyHint on page 1", "t_ro", await ask(2, "t_ro"));
  eq("require-key: unannotated on page 1", -31905, await ask(3, "t_plain"));
  eq("require-key: page 2 not listed yet", -31905, await ask(4, "t_idem"));
  s.send(J({ jsonrpc: "2.0", id: "l2", method: "tools/list",
    params: { cursor: "page-2" } }));
  await s.until(() => answer(s.got, "l2"), "page 2");
  eq("require-key: idempotentHint on page 2", "t_idem", await ask(5, "t_idem"));
  eq("require-key: hints false on page 2", -31905, await ask(6, "t_no"));
  eq("require-key: with a key it runs", "t_plain", await ask(7, "t_plain", "rk-1"));
  eq("require-key: refused calls never reached the server",
    ["t_ro", "t_idem", "t_plain"], s.log().map((l) => {
      try { const m = JSON.parse(l); return m.method === "tools/call" ? m.params.name : null; } catch { return null; }
    }).filter((x) => x));
  s.p.stdin.end();
  eq("require-key: ends", { code: 0, signal: null }, await s.exited);
}
{
  // Signals reach the server.
  const s = start();
  s.send(J({ jsonrpc: "2.0", method: "n" }));
  await s.until(() => s.log().length >= 1, "the server");
  s.p.kill("SIGUSR1");
  await s.until(() => s.log().includes("SIGUSR1"), "SIGUSR1");
  s.p.kill("SIGTERM");
  eq("SIGTERM: the server's status", { code: 42, signal: null }, await s.exited);
  check("SIGTERM reached the server", s.log().includes("SIGTERM"));
}
{
  // The client closes its input: so does the server's.
  const s = start();
  s.send(J({ jsonrpc: "2.0", method: "n" }));
  s.p.stdin.end();
  eq("client EOF: the server ends", { code: 0, signal: null }, await s.exited);
  eq("client EOF: the server saw EOF", ["EOF"], s.log().slice(-1));
}
{
  // A server that does not end: SIGTERM, then SIGKILL.
  const s = start(["--shutdown-wait", "300ms"], { RAW_STUBBORN: "1" });
  s.send(J({ jsonrpc: "2.0", method: "n" }));
  await s.until(() => s.log().length >= 1, "the server");
  const t0 = Date.now();
  s.p.stdin.end();
  eq("stubborn: killed", { code: 128 + 9, signal: null }, await s.exited);
  check("stubborn: within the waits", Date.now() - t0 < 5000, Date.now() - t0);
  eq("stubborn: EOF then SIGTERM", ["EOF", "SIGTERM"], s.log().slice(-2));
  check("stubborn: said so", /SIGTERM/.test(s.err()) && /SIGKILL/.test(s.err()), s.err());
}

// Usage errors and a server that cannot start.
{
  // 1,000 keyed calls in flight at once: a fixed number of threads (the
  // store's workers and scheduler, never one per call), and each call
  // answered with its own result, byte for byte (an integer past 2^63
  // stays an integer, 3 stays 3), then replayed the same.
  const s = start([]);
  const N = 1000;
  const waitFor = async (cond, what) => {
    for (let i = 0; i < 2400 && !cond(); i++) await sleep(25);
    check(`waited for ${what}`, cond());
  };
  for (let i = 0; i < N; i++) s.send(call(`m${i}`, "silent", { i }, `many-${i}`));
  const atServer = () => s.log().filter((l) => l.includes('"many-'));
  await waitFor(() => atServer().length === N, "1,000 calls at the server");
  const tasks = readdirSync(`/proc/${s.p.pid}/task`).length;
  console.log(`1,000 keyed calls in flight: ${tasks} threads`);
  check("1,000 calls in flight: at most 16 threads", tasks <= 16, tasks);
  const answers = atServer().map((l) => {
    const m = JSON.parse(l);
    return `{"jsonrpc":"2.0","id":${J(m.id)},"result":{"content":[{"type":"text","text":"done ${m.params.arguments.i}"}],"structuredContent":{"big":12345678901234567890,"small":3,"f":1.50}}}`;
  });
  for (let i = 0; i < N; i += 100)
    s.send(J({ jsonrpc: "2.0", method: "emit", params: { lines: answers.slice(i, i + 100) } }));
  await waitFor(() => s.got.length >= N, "1,000 answers");
  const ok = [...Array(N).keys()].filter((i) => {
    const line = s.got.find((l) => l.startsWith(`{"jsonrpc":"2.0","id":"m${i}",`));
    return line === `{"jsonrpc":"2.0","id":"m${i}","result":{"content":[{"type":"text","text":"done ${i}"}],"structuredContent":{"big":12345678901234567890,"small":3,"f":1.50}}}`;
  }).length;
  eq("1,000 calls: each answered with its own result, byte for byte", N, ok);
  s.got.length = 0;
  s.send(call("r7", "silent", { i: 7 }, "many-7"));
  await waitFor(() => s.got.length >= 1, "the replay");
  eq("the replay: byte for byte but the id and the marker",
    `{"jsonrpc":"2.0","id":"r7","result":{"_meta":{"idem/replayed":true},"content":[{"type":"text","text":"done 7"}],"structuredContent":{"big":12345678901234567890,"small":3,"f":1.50}}}`,
    s.got[0]);
  eq("1,000 calls: the server saw each once", N, atServer().length);
  s.p.stdin.end();
  eq("1,000 calls: ends", { code: 0, signal: null }, await s.exited);
}

{
  // An unkeyed request that reuses the id of a keyed call in flight: its
  // answer is its own, never recorded as the keyed call's (the keyed call
  // travels under an id the proxy owns), and the keyed call's own answer
  // is still recorded and replayed.
  const s = start([]);
  s.send(call(40, "silent", {}, "reuse-1"));
  await s.until(() => s.log().some((l) => l.includes('"reuse-1"')), "the keyed call at the server");
  s.send(call(40, "add", { a: 20, b: 22 }));
  await s.until(() => answer(s.got, 40), "the unkeyed call's answer");
  eq("id reused: the unkeyed call got its own answer", "42",
    answer(s.got, 40)?.result?.content?.[0]?.text);
  s.got.length = 0;
  s.send(call(41, "silent", {}, "reuse-1"));
  const sid = JSON.parse(s.log().find((l) => l.includes('"reuse-1"'))).id;
  s.send(J({ jsonrpc: "2.0", method: "emit", params: { lines: [
    J({ jsonrpc: "2.0", id: sid, result: { content: [{ type: "text", text: "mine" }] } })] } }));
  await s.until(() => answer(s.got, 40) && answer(s.got, 41), "the keyed call's answers");
  eq("id reused: the keyed call and its retry got the keyed answer",
    ["mine", "mine", true], [answer(s.got, 40)?.result?.content?.[0]?.text,
      answer(s.got, 41)?.result?.content?.[0]?.text,
      answer(s.got, 41)?.result?._meta?.["idem/replayed"]]);
  eq("id reused: the server saw the keyed call once", 1,
    s.log().filter((l) => l.includes('"reuse-1"')).length);
  s.p.stdin.end();
  await s.exited;
}

const run = (...args) => spawnSync(IDEM, ["mcp", ...args], { encoding: "utf8" });
eq("no server: usage", 2, run("--store", store).status);
eq("--lease 0: usage", 2, run("--lease", "0", "--", "true").status);
eq("--on-unknown maybe: usage", 2, run("--on-unknown", "maybe", "--", "true").status);
eq("--max-result too large: usage", 2, run("--max-result", "1G", "--", "true").status);
eq("--tenant with a control character: usage", 2, run("--tenant", "a\u0007", "--", "true").status);
const nf = run("--store", store, "--", "/no/such/server");
eq("missing server: 127", 127, nf.status);
check("missing server: said so", /cannot start \/no\/such\/server/.test(nf.stderr), nf.stderr);
const help = run("--help");
check("--help lists the error codes", [-31901, -31902, -31903, -31904, -31905,
  -31906, -31907, -31908, -31909].every((c) => help.stdout.includes(String(c))));
finish();
