// drain.mjs -- idem mcp when the client closes its input with a keyed call
// at the server (an editor reloading its servers): the call runs to its end
// and is recorded before the server is stopped (--drain-wait), so that a
// retry through a new proxy on the same store gets its result and the tool
// acts once. Also: --drain-wait 0 cuts the call off as before, a drain that
// runs out leaves the key held as a server's death does, and an unkeyed call
// does not hold the proxy past --shutdown-wait.
//
// The client is written by hand (the lines of an SDK client), so that its
// standard input and output can be closed at a chosen moment: while the
// tool is running, which the test learns from the server's EFFECTS_START
// log, not from a timer. The server is slow_server.mjs (the SDK's
// McpServer); its act tool waits ms, then logs its effect to EFFECTS.
//
// The process the client starts exits as soon as a drain begins (so that
// a client that signals it after closing its input, as the SDKs' close()
// does two seconds on, stops nothing); the proxy drains on, holding the
// client's pipes until it is done: the test waits for them to close.
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { HERE, IDEM, TMP, call, check, connect, eq, finish, record,
  replayed, sleep, watchStderr } from "./lib.mjs";

const SLOW = join(HERE, "slow_server.mjs");
const store = join(TMP, "idem.db");
const effects = join(TMP, "effects.jsonl");
const starts = join(TMP, "starts.jsonl");
const env = { ...process.env, EFFECTS: effects, EFFECTS_START: starts };
const logged = (f, tag) => existsSync(f)
  ? readFileSync(f, "utf8").split("\n").filter((l) => l)
    .map((l) => JSON.parse(l)).filter((e) => e.tag === tag) : [];
const J = JSON.stringify;

// A proxy driven by hand: initialize, then one tools/call of act (keyed when
// key is given). Resolves once the tool has started at the server.
async function start(opts, { key, ms, tag }) {
  const p = spawn(IDEM, ["mcp", "--store", store, ...opts, "--", "node",
    SLOW], { env });
  let out = "";
  let err = "";
  p.stdout.on("data", (d) => { out += d; });
  p.stdout.on("error", () => {});
  p.stdin.on("error", () => {});
  p.stderr.on("data", (d) => { err += d; });
  watchStderr(() => err);
  const exited = new Promise((r) => p.on("exit", (code, signal) =>
    r({ code, signal, at: Date.now() })));
  // Every pipe closed: the proxy (and the server) have exited too.
  const closed = new Promise((r) => p.on("close", () => r({ at: Date.now() })));
  const send = (m) => p.stdin.write(J({ jsonrpc: "2.0", ...m }) + "\n");
  send({ id: 1, method: "initialize", params: { protocolVersion: "2025-06-18",
    capabilities: {}, clientInfo: { name: "drain", version: "1" } } });
  for (let i = 0; i < 400 && !out.includes('"id":1'); i++) await sleep(25);
  send({ method: "notifications/initialized" });
  send({ id: 2, method: "tools/call", params: { name: "act",
    arguments: { ms, tag },
    ...(key ? { _meta: { idempotencyKey: key } } : {}) } });
  for (let i = 0; i < 800 && logged(starts, tag).length === 0; i++)
    await sleep(25);
  check(`${tag}: the tool started at the server`,
    logged(starts, tag).length === 1, err);
  return { p, exited, closed, out: () => out, err: () => err };
}

// The answer with this id among the lines the client read.
const answer = (out, id) => out.split("\n").filter((l) => l)
  .map((l) => { try { return JSON.parse(l); } catch { return null; } })
  .find((m) => m && m.id === id && !m.method);

// The default drain: the client closes both its pipes while the call runs;
// the process it started exits at once, and the proxy exits only once the
// tool has acted and its result is stored. --shutdown-wait is short, so
// that a proxy without the drain cuts the call off long before the tool's
// end.
{
  const tag = "drained";
  const key = "drain-1";
  const run = await start(["--shutdown-wait", "300ms"],
    { key, ms: 3000, tag });
  const closedAt = Date.now();
  run.p.stdin.end();
  run.p.stdout.destroy(); // the answer cannot reach the client
  const ex = await run.exited;
  eq("drain: the process the client started exited at once, status 0",
    { code: 0, signal: null }, { code: ex.code, signal: ex.signal });
  eq("drain: before the tool acted", 0, logged(effects, tag).length);
  const all = await run.closed;
  const done = logged(effects, tag);
  eq("drain: the tool acted once, before the proxy exited", 1, done.length);
  check("drain: the proxy waited for the tool (not cut off at "
    + "--shutdown-wait)", all.at - closedAt >= 1500, `${all.at - closedAt} ms`);
  check("drain: it says it waits for the call",
    /keyed call in flight/.test(run.err()), run.err());
  const r = record(store, "act", key);
  eq("drain: the store holds the completed record", "completed", r?.state);
  const ticket = `ticket-${done[0]?.pid}-${done[0]?.n}`;
  check("drain: the record holds the tool's result",
    J(r).includes(ticket), J(r));
  // A retry through a new proxy on the same store: replayed, not run again.
  const { client } = await connect({ server: SLOW,
    proxy: ["--store", store], env: { EFFECTS: effects,
      EFFECTS_START: starts } });
  const again = await call(client, "act", { ms: 3000, tag }, { key });
  check("drain: the retry is a replay", replayed(again.result),
    J(again));
  eq("drain: the replay carries the same ticket", ticket,
    again.result?.structuredContent?.ticket);
  eq("drain: the tool still acted once", 1, logged(effects, tag).length);
  eq("drain: and started once", 1, logged(starts, tag).length);
  await client.close();
}

// The client keeps reading after closing its input (a shell pipeline): the
// drained call's answer still reaches it.
{
  const tag = "piped";
  const run = await start(["--shutdown-wait", "300ms"],
    { key: "drain-2", ms: 1500, tag });
  run.p.stdin.end();
  const ex = await run.exited;
  eq("pipe: exit status", 0, ex.code);
  await run.closed;
  const a = answer(run.out(), 2);
  const done = logged(effects, tag);
  eq("pipe: the answer came after the input closed",
    `ticket-${done[0]?.pid}-${done[0]?.n}`, a?.result?.structuredContent?.ticket);
  eq("pipe: recorded", "completed", record(store, "act", "drain-2")?.state);
}

// An SDK client closed while its keyed call runs (StdioClientTransport's
// close(): standard input closed, then SIGTERM 2 s later and SIGKILL 2 s
// after that, to the process it started, if it has not exited): a call of
// 6 s outlives both, is recorded, and a new client's retry replays it.
// (Before the process the client starts exited at the drain, the SIGTERM
// reached the server, the call died with it, and the retry acted again.)
{
  const tag = "sdk-close";
  const key = "drain-sdk";
  const first = await connect({ server: SLOW, proxy: ["--store", store],
    env: { EFFECTS: effects, EFFECTS_START: starts } });
  const pending = call(first.client, "act", { ms: 6000, tag }, { key });
  for (let i = 0; i < 800 && logged(starts, tag).length === 0; i++)
    await sleep(25);
  check("sdk close: the tool started", logged(starts, tag).length === 1);
  await first.client.close();
  await pending;
  for (let i = 0; i < 800 && record(store, "act", key)?.state !== "completed";
    i++) await sleep(25);
  const done = logged(effects, tag);
  eq("sdk close: the tool acted", 1, done.length);
  eq("sdk close: recorded", "completed", record(store, "act", key)?.state);
  const { client } = await connect({ server: SLOW, proxy: ["--store", store],
    env: { EFFECTS: effects, EFFECTS_START: starts } });
  const again = await call(client, "act", { ms: 6000, tag }, { key });
  check("sdk close: the retry is a replay", replayed(again.result), J(again));
  eq("sdk close: the same ticket", `ticket-${done[0]?.pid}-${done[0]?.n}`,
    again.result?.structuredContent?.ticket);
  eq("sdk close: acted once", 1, logged(effects, tag).length);
  await client.close();
}

// --drain-wait 0: as before the option, the server's input is closed at
// once and the call cut off at --shutdown-wait; the key stays held (the
// server died with the call unanswered).
{
  const tag = "cut";
  const run = await start(["--drain-wait", "0", "--shutdown-wait", "300ms"],
    { key: "drain-3", ms: 8000, tag });
  const closedAt = Date.now();
  run.p.stdin.end();
  const ex = await run.exited;
  check("drain 0: the proxy did not wait for the tool",
    ex.at - closedAt < 5000, `${ex.at - closedAt} ms`);
  eq("drain 0: the tool was stopped before it acted", 0,
    logged(effects, tag).length);
  eq("drain 0: the key is held in progress", "in_progress",
    record(store, "act", "drain-3")?.state);
}

// A drain that runs out: the call is cut off as when the server dies.
{
  const tag = "ran-out";
  const run = await start(["--drain-wait", "500ms", "--shutdown-wait",
    "300ms"], { key: "drain-4", ms: 8000, tag });
  const closedAt = Date.now();
  run.p.stdin.end();
  const ex = await run.closed;
  check("drain ran out: the proxy exited within the waits",
    ex.at - closedAt < 5000, `${ex.at - closedAt} ms`);
  check("drain ran out: it says so", /still running/.test(run.err()),
    run.err());
  eq("drain ran out: the tool did not act", 0, logged(effects, tag).length);
  eq("drain ran out: the key is held in progress", "in_progress",
    record(store, "act", "drain-4")?.state);
}

// An unkeyed call in flight does not hold the proxy past --shutdown-wait.
{
  const tag = "unkeyed";
  const run = await start(["--shutdown-wait", "300ms"], { ms: 8000, tag });
  const closedAt = Date.now();
  run.p.stdin.end();
  const ex = await run.exited;
  check("unkeyed: the proxy did not wait for the tool",
    ex.at - closedAt < 5000, `${ex.at - closedAt} ms`);
  eq("unkeyed: the tool was stopped", 0, logged(effects, tag).length);
  check("unkeyed: no drain reported", !/keyed call/.test(run.err()),
    run.err());
}

finish();
