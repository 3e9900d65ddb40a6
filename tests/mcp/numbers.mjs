// idem mcp with numbers that a double cannot hold, in lines written by
// hand so that their digits cross the proxy as written: a key reused for
// another account (12345678901234567, then 12345678901234568, one double)
// is a conflict that never reaches the server, also when another number in
// the line is past 64 bits and when the key is a tool argument; the same
// value written otherwise (1, 1.0) is a replay; a NUL byte after a number
// is refused.
import { join } from "node:path";
import { TMP, eq, finish, startRaw, rawAnswer as answer } from "./lib.mjs";

const store = join(TMP, "idem.db");
const calls = (s, key) => s.log().filter((l) => l.includes(`"${key}"`)).length;
const line = (id, args, key) =>
  `{"jsonrpc":"2.0","id":${id},"method":"tools/call","params":{"name":"add",` +
  `"arguments":${args}` +
  (key ? `,"_meta":{"idempotencyKey":"${key}"}` : "") + "}}";

// Sends the lines one after another, each once the previous is answered;
// returns their answers.
async function send(s, lines) {
  const got = [];
  for (const [id, l] of lines) {
    s.send(l);
    await s.until(() => answer(s.got, id), `the answer to ${id}`);
    got.push(answer(s.got, id));
  }
  return got;
}
const outcome = (a) => a?.error ? a.error.code
  : a?.result?._meta?.["idem/replayed"] ? "replayed" : a?.result?.content?.[0]?.text;

{
  const s = startRaw(store);
  // 1. Another account under the same key: a conflict; the server saw one
  //    call. The first account's digits written otherwise: the replay.
  const acct = await send(s, [
    [1, line(1, '{"a":1,"b":2,"account":12345678901234567}', "acct-1")],
    [2, line(2, '{"a":1,"b":2,"account":12345678901234568}', "acct-1")],
    [3, line(3, '{"account":1.2345678901234567e16,"b":2,"a":1}', "acct-1")],
  ]);
  eq("another account: conflict, then the first account replayed",
    ["3", -31901, "replayed"], acct.map(outcome));
  eq("another account: the server saw one call", 1, calls(s, "acct-1"));

  // 2. The same with an integer past 64 bits elsewhere in the line, which
  //    makes the proxy's JSON reader take every number as a double.
  const big = await send(s, [
    [4, line(4, '{"a":1,"b":2,"big":123456789012345678901234567890,"account":12345678901234567}', "acct-2")],
    [5, line(5, '{"a":1,"b":2,"big":123456789012345678901234567890,"account":12345678901234568}', "acct-2")],
    [6, line(6, '{"a":1,"b":2,"big":123456789012345678901234567891,"account":12345678901234567}', "acct-2")],
  ]);
  eq("past 64 bits elsewhere: both changes are conflicts", ["3", -31901, -31901],
    big.map(outcome));
  eq("past 64 bits elsewhere: the server saw one call", 1, calls(s, "acct-2"));

  // 3. Other numbers one double holds: 0.1 and 0.10000000000000001.
  const tenth = await send(s, [
    [7, line(7, '{"a":1,"b":2,"amount":0.1}', "tenth-1")],
    [8, line(8, '{"a":1,"b":2,"amount":0.10000000000000001}', "tenth-1")],
  ]);
  eq("0.1, then 0.10000000000000001: a conflict", ["3", -31901],
    tenth.map(outcome));

  // 4. One value written otherwise: replays.
  const one = await send(s, [
    [9, line(9, '{"a":1,"b":2,"n":1}', "one-1")],
    [10, line(10, '{"a":1,"b":2,"n":1.0}', "one-1")],
    [11, line(11, '{ "n" : 10E-1, "b" : 2, "a" : 1 }', "one-1")],
  ]);
  eq("1, then 1.0 and 10E-1: replays", ["3", "replayed", "replayed"],
    one.map(outcome));
  eq("1, then 1.0: the server saw one call", 1, calls(s, "one-1"));

  // 5. A NUL byte after a number is no JSON, though jansson reads past it:
  //    refused, not keyed by what a server might read otherwise.
  const before = s.got.length;
  s.send(line(12, '{"a":1,"b":2,"account":12345678901234567\u0000}', "nul-1"));
  await s.until(() => s.got.length > before, "the refusal");
  eq("NUL byte after a number: refused as a parse error, under its id", [-32700, 12],
    [JSON.parse(s.got[before])?.error?.code, JSON.parse(s.got[before])?.id]);
  eq("NUL byte after a number: nothing reached the server", 0, calls(s, "nul-1"));
  s.p.stdin.end();
  await s.exited;
}

{
  // 5. The key as a tool argument (--key-argument): left out of the
  //    request, whose other numbers stay exact.
  const s = startRaw(join(TMP, "arg.db"), ["--key-argument", "idempotency_key"]);
  const arg = await send(s, [
    [1, line(1, '{"a":1,"b":2,"idempotency_key":"arg-1","amount":0.1}')],
    [2, line(2, '{"amount":0.10000000000000001,"a":1,"b":2,"idempotency_key":"arg-1"}')],
    [3, line(3, '{"idempotency_key":"arg-1" , "a":1.0,"b":2,"amount":0.10}')],
  ]);
  eq("key argument: another amount a conflict, the same one a replay",
    ["3", -31901, "replayed"], arg.map(outcome));
  eq("key argument: the server saw one call", 1, calls(s, "arg-1"));
  s.p.stdin.end();
  await s.exited;
}

finish();
