// idem mcp with JSON at its edges, byte for byte through raw_server.mjs:
// strings holding U+0000, numbers past the double range, keys and ids of
// odd shapes. A keyed call must never reach the server unseen by the
// proxy, and a result must be recorded whatever characters it holds.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { TMP, check, eq, finish, sleep, startRaw, rawCall as call,
  rawParsed as parsed, rawAnswer as answer } from "./lib.mjs";

const store = join(TMP, "idem.db");
const start = (opts, env) => startRaw(store, opts, env);
const J = JSON.stringify;
const calls = (s, key) => s.log().filter((l) => l.includes(`"${key}"`)).length;

{
  const s = start();
  // 1. An argument holding U+0000: the call is keyed like any other.
  s.send(call(1, "add", { a: 1, b: 2, note: "x\u0000y" }, "nul-1"));
  await s.until(() => answer(s.got, 1), "the call with U+0000");
  s.send(call(2, "add", { a: 1, b: 2, note: "x\u0000y" }, "nul-1"));
  await s.until(() => answer(s.got, 2), "its retry");
  eq("U+0000 in an argument: the first answer", "3",
    answer(s.got, 1)?.result?.content?.[0]?.text);
  eq("U+0000 in an argument: the retry replayed", [true, "3"],
    [answer(s.got, 2)?.result?._meta?.["idem/replayed"],
      answer(s.got, 2)?.result?.content?.[0]?.text]);
  eq("U+0000 in an argument: the server saw one call", 1, calls(s, "nul-1"));
  s.send(call(3, "add", { a: 1, b: 2, note: "x\u0000z" }, "nul-1"));
  await s.until(() => answer(s.got, 3), "another argument");
  eq("U+0000 in an argument: another value is a conflict", [-31901, 1],
    [answer(s.got, 3)?.error?.code, calls(s, "nul-1")]);

  // 2. A result holding U+0000 is recorded: a retry gets it again, not
  //    "in flight" for as long as the proxy lives.
  s.send(call(4, "add", { a: "m\u0000", b: "n" }, "nul-2"));
  await s.until(() => answer(s.got, 4), "the answer with U+0000");
  const first = answer(s.got, 4)?.result?.content?.[0]?.text;
  eq("U+0000 in a result: passed on", "m\u0000n", first);
  s.send(call(5, "add", { a: "m\u0000", b: "n" }, "nul-2"));
  await s.until(() => answer(s.got, 5), "its retry");
  eq("U+0000 in a result: the retry replayed", [true, first],
    [answer(s.got, 5)?.result?._meta?.["idem/replayed"],
      answer(s.got, 5)?.result?.content?.[0]?.text]);
  eq("U+0000 in a result: the server saw one call", 1, calls(s, "nul-2"));

  // 3. Keys holding U+0000 are not keys: "k\0a" and "k\0b" must not both
  //    be "k".
  s.send(call(6, "add", { a: 1, b: 1 }, "k\u0000a"));
  s.send(call(7, "add", { a: 1, b: 1 }, "k\u0000b"));
  await s.until(() => answer(s.got, 6) && answer(s.got, 7), "the keys with U+0000");
  eq("U+0000 in a key: refused", [-31906, -31906],
    [answer(s.got, 6)?.error?.code, answer(s.got, 7)?.error?.code]);

  // 4. A keyed call the proxy cannot read (a number past the double
  //    range) does not reach the server unkeyed. (A lone surrogate it
  //    reads: surrogates.mjs.)
  const logged = s.log().length;
  s.got.length = 0;
  s.send('{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":1e400},"_meta":{"idempotencyKey":"big-1"}}}');
  s.send('{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2,"s":"\\ud800","n":[-1E+309]},"_meta":{"idempotencyKey":"sur-1"}}}');
  await s.until(() => s.got.length >= 2, "the refusals");
  eq("unreadable keyed calls: refused as parse errors", [-32700, -32700],
    parsed(s.got).map((m) => m?.error?.code));
  eq("unreadable keyed calls: nothing reached the server", logged, s.log().length);

  // An unkeyed call holding what jansson cannot read (what
  // "ok \u{1F600}".slice(0, 4) makes in JavaScript) passes byte for byte,
  // as it would without the proxy, and is answered.
  const lone = '{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2,"s":"ok \\ud83d"}}}';
  s.send(lone);
  await s.until(() => answer(s.got, 13), "the unkeyed call with a lone surrogate");
  eq("lone surrogate, unkeyed: answered", "3", answer(s.got, 13)?.result?.content?.[0]?.text);
  check("lone surrogate, unkeyed: reached the server byte for byte", s.log().includes(lone));

  s.p.stdin.end();
  eq("ends", { code: 0, signal: null }, await s.exited);
}

{
  // 6. An answer to a keyed call that the proxy cannot read (a number
  //    past the double range): passed on, the key marked unknown at once,
  //    so a retry is refused as unknown rather than left waiting for an
  //    answer that has gone by. (A lone surrogate it reads and records:
  //    surrogates.mjs.)
  const s = start();
  s.send(call(20, "silent", {}, "unread-1"));
  await s.until(() => calls(s, "unread-1") === 1, "the call at the server");
  // The server answers under the id it got, which the proxy owns; the
  // client gets the answer under its own.
  const sid = JSON.stringify(JSON.parse(s.log().find((l) => l.includes('"unread-1"'))).id);
  const bad = (id) => `{"jsonrpc":"2.0","id":${id},"result":{"content":[{"type":"text","text":"\\ud800"}],"n":1e400}}`;
  s.send(J({ jsonrpc: "2.0", method: "emit", params: { lines: [bad(sid)] } }));
  await s.until(() => s.got.includes(bad(20)), "the unreadable answer passed on");
  s.send(call(21, "silent", {}, "unread-1"));
  await s.until(() => answer(s.got, 21), "the retry");
  eq("unreadable answer: the retry is told the outcome is unknown", -31903,
    answer(s.got, 21)?.error?.code);
  eq("unreadable answer: the server saw one call", 1, calls(s, "unread-1"));
  check("unreadable answer: logged", /not JSON the proxy can read/.test(s.err()), s.err());
  s.p.stdin.end();
  eq("ends", { code: 0, signal: null }, await s.exited);
}

{
  // 5. A call cancelled by the client: the cancellation is not passed on
  //    (the server finishes what it started), the answer is recorded, and
  //    a retry is answered with it, not sent again.
  const s = start(["--lease", "1s"]);
  s.send(call(10, "ask", {}, "cx-1"));
  await s.until(() => parsed(s.got).some((m) => m?.method === "sampling/createMessage"),
    "the server's question");
  const question = parsed(s.got).find((m) => m?.method === "sampling/createMessage");
  s.send(J({ jsonrpc: "2.0", method: "notifications/cancelled",
    params: { requestId: 10, reason: "the client gave up" } }));
  s.send(J({ jsonrpc: "2.0", id: question.id, result: { answer: 42 } }));
  s.send(call(11, "ask", {}, "cx-1"));
  await s.until(() => answer(s.got, 11), "the retry");
  eq("cancelled, answered late: the retry is a replay of the late answer",
    [true, 'client said {"answer":42}'],
    [answer(s.got, 11)?.result?._meta?.["idem/replayed"],
      answer(s.got, 11)?.result?.content?.[0]?.text]);
  eq("cancelled, answered late: the server saw one call", 1, calls(s, "cx-1"));
  eq("cancelled: the cancellation did not reach the server", false,
    s.log().some((l) => l.includes("notifications/cancelled")));
  eq("cancelled: the cancelled request got no answer", undefined, answer(s.got, 10));
  s.p.stdin.end();
  eq("ends", { code: 0, signal: null }, await s.exited);
}
{
  // 7. The relay never waits on the store for others: while another
  //    process holds the SQLite store's write lock, a keyed call waits for
  //    the store, and an unkeyed call sent after it is relayed and answered
  //    at once.
  const db = join(TMP, "locked.db");
  const s = startRaw(db);
  s.send(call(30, "add", { a: 1, b: 1 }, "lock-warm"));
  await s.until(() => answer(s.got, 30), "the store to be made");
  const holder = spawn("python3", ["-c", `
import sqlite3, sys
c = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
c.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
c.execute("COMMIT")
`, db], { stdio: ["pipe", "pipe", "inherit"] });
  let locked = false;
  holder.stdout.on("data", (d) => { if (/locked/.test(String(d))) locked = true; });
  await s.until(() => locked, "the write lock to be held");
  s.send(call(31, "add", { a: 2, b: 2 }, "lock-1"));
  s.send(call(32, "add", { a: 3, b: 3 }));
  await s.until(() => answer(s.got, 32), "the unkeyed call");
  eq("store locked: the unkeyed call answered", "6",
    answer(s.got, 32)?.result?.content?.[0]?.text);
  eq("store locked: the keyed call still waits for the store", undefined,
    answer(s.got, 31));
  holder.stdin.end();
  await s.until(() => answer(s.got, 31), "the keyed call");
  const k = answer(s.got, 31);
  check("store unlocked: the keyed call answered (its result, or the store " +
    "was busy and nothing was sent)",
    k?.result?.content?.[0]?.text === "4" || k?.error?.code === -31904, JSON.stringify(k));
  eq("store locked: the keyed call acted at most once",
    k?.result ? 1 : 0, calls(s, "lock-1"));
  s.p.stdin.end();
  eq("ends", { code: 0, signal: null }, await s.exited);
}
finish();
