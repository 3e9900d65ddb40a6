// idem mcp keeps no call's arguments at rest: a keyed tools/call whose
// arguments hold a card number leaves only its fingerprint in the store
// (not one copy of the digits in the database, its WAL or its shared
// memory file), and still replays the same call and refuses another one
// under its key. With --keep-requests the arguments are kept, for
// operators, and `idem keys show` prints them.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { TMP, eq, finish, rawAnswer as answer, rawCall, record, startRaw } from "./lib.mjs";

const CARD = "4111111111111111";
// Every copy of CARD in the store's files (the database, -wal, -shm).
const copies = (db) => readdirSync(TMP).filter((f) => f.startsWith(db))
  .map((f) => readFileSync(join(TMP, f)).toString("latin1").split(CARD).length - 1)
  .reduce((a, b) => a + b, 0);
const outcome = (a) => a?.error ? a.error.code
  : a?.result?._meta?.["idem/replayed"] ? "replayed" : a?.result?.content?.[0]?.text;

async function run(db, opts) {
  const s = startRaw(join(TMP, db), opts);
  const lines = [
    [1, rawCall(1, "add", { a: 1, b: 2, card: CARD, cvc: "737" }, "pay-1")],
    [2, rawCall(2, "add", { cvc: "737", card: CARD, b: 2, a: 1 }, "pay-1")],
    [3, rawCall(3, "add", { a: 1, b: 2, card: CARD, cvc: "738" }, "pay-1")],
  ];
  const got = [];
  for (const [id, l] of lines) {
    s.send(l);
    await s.until(() => answer(s.got, id), `the answer to ${id}`);
    got.push(outcome(answer(s.got, id)));
  }
  const calls = s.log().filter((l) => l.includes('"pay-1"')).length;
  s.p.stdin.end();
  await s.exited;
  return { got, calls };
}

{
  const r = await run("forget.db", []);
  eq("default: the call, its replay, another call refused", ["3", "replayed", -31901], r.got);
  eq("default: the server saw one call", 1, r.calls);
  eq("default: no copy of the card number in any store file", 0, copies("forget.db"));
  const rec = record(join(TMP, "forget.db"), "add", "pay-1");
  eq("default: the record is there, completed, with no request",
    ["completed", null], [rec?.state, rec?.request ?? null]);
}
{
  const r = await run("keep.db", ["--keep-requests"]);
  eq("--keep-requests: the same outcomes", ["3", "replayed", -31901], r.got);
  eq("--keep-requests: the arguments are kept", true, copies("keep.db") > 0);
  const rec = record(join(TMP, "keep.db"), "add", "pay-1");
  eq("--keep-requests: idem keys show prints them", true,
    JSON.stringify(rec?.request ?? null).includes(CARD));
}
finish();
