// keyed_cancel.mjs -- `idem mcp --keyed-cancel pass` (issue 53): by default
// a keyed call the client cancels goes on at the server and its result is
// recorded for the retry. With pass, the cancellation goes on to the
// server: a server that stops and says so (an error answer, as the Python
// SDK's do) frees the key, and the retry acts; one that answers anyway has
// its result recorded; one that says nothing (the TypeScript SDK's) leaves
// the key unknown after --cancel-wait, and the retry is refused -31903
// rather than acting a second time. The client is the SDK's, whose request
// timeout sends notifications/cancelled.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { HERE, SERVERS, TMP, call, check, connect, eq, finish, record,
  replayed, text } from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer, waitFor }
  from "./http_lib.mjs";

const J = JSON.stringify;
const jsonl = (f) => {
  try {
    return readFileSync(f, "utf8").split("\n").filter((l) => l)
      .map((l) => JSON.parse(l));
  } catch { return []; }
};
const SLOW = join(HERE, "slow_server.mjs");
const CANCEL = join(HERE, "cancel_server.mjs");
let runs = 0;

// idem mcp OPTS -- node SERVER, its effects log, and an SDK client on it.
async function proxied(server, opts, args = []) {
  const n = ++runs;
  const effects = join(TMP, `effects-${n}.jsonl`);
  const store = join(TMP, `cancel-${n}.db`);
  const c = await connect({ server, args, proxy: ["--store", store, ...opts],
    env: { EFFECTS: effects } });
  return { ...c, store, effects: () => jsonl(effects) };
}

// A keyed call the SDK gives up on after timeout ms (it then sends
// notifications/cancelled), once the server has started it.
async function cancelled(c, tool, args, key, timeout) {
  const r = await call(c.client, tool, args, { key, timeout });
  check(`${key}: the client timed out`, r.error?.code === -32001, J(r));
  return r;
}

// ---- hold (the default): the call goes on, the retry gets its result -------
{
  const c = await proxied(SLOW, []);
  await cancelled(c, "act", { ms: 1500, tag: "hold" }, "k-hold", 300);
  const r = await call(c.client, "act", { ms: 1500, tag: "hold" },
    { key: "k-hold", timeout: 15000 });
  const done = c.effects().filter((e) => e.tag === "hold");
  check("hold: the retry gets the call's result", replayed(r.result) &&
    r.result?.structuredContent?.n === done[0]?.n, J([r, done]));
  eq("hold: one effect, never cancelled at the server", [false],
    done.map((e) => e.aborted));
  await c.client.close();
}

// ---- pass, a server that stops and says so: the key is freed ---------------
{
  const c = await proxied(CANCEL, ["--keyed-cancel", "pass"]);
  const args = { ms: 60000, tag: "confirm", on_cancel: "confirm" };
  await cancelled(c, "work", args, "k-confirm", 500);
  await waitFor(() => c.effects().some((e) => e.stopped),
    "the server to stop the call");
  const cancel = c.effects().find((e) => "cancelled" in e);
  const started = c.effects().find((e) => e.started);
  eq("confirm: the server was told, under the id it got the call by",
    started?.id, cancel?.cancelled);
  await waitFor(() => record(c.store, "work", "k-confirm") === null,
    "the key to be freed", 10000, () => J(record(c.store, "work", "k-confirm")));
  const r = await call(c.client, "work", { ...args, ms: 0 },
    { key: "k-confirm", timeout: 15000 });
  check("confirm: the retry acts", /^done-confirm-2$/.test(text(r.result)) &&
    !replayed(r.result), J(r));
  eq("confirm: the first stopped, the retry acted",
    [["started", 1], ["stopped", 1], ["started", 2], ["acted", 2]],
    c.effects().filter((e) => e.tag === "confirm")
      .map((e) => [e.stopped ? "stopped" : e.acted ? "acted" : "started", e.n]));
  eq("confirm: recorded", "completed", record(c.store, "work", "k-confirm")?.state);
  await c.client.close();
}

// ---- pass, a server that answers anyway: the result is recorded -----------
{
  const c = await proxied(CANCEL, ["--keyed-cancel", "pass"]);
  const args = { ms: 1500, tag: "finish", on_cancel: "finish" };
  await cancelled(c, "work", args, "k-finish", 300);
  await waitFor(() => record(c.store, "work", "k-finish")?.state === "completed",
    "the result to be recorded");
  const r = await call(c.client, "work", args, { key: "k-finish", timeout: 15000 });
  check("finish: the retry gets the result", replayed(r.result) &&
    text(r.result) === "done-finish-1", J(r));
  eq("finish: it acted once", 1, c.effects().filter((e) => e.acted).length);
  check("finish: the server was told", c.effects().some((e) => "cancelled" in e));
  await c.client.close();
}

// ---- pass, a server that says nothing (the TypeScript SDK's) ----------------
for (const sdk of ["1", "2"]) {
  const c = await proxied(SLOW, ["--keyed-cancel", "pass", "--cancel-wait",
    "1s"], ["--sdk", sdk]);
  // slow_server's act goes on after the cancellation (it had committed)
  // and its SDK sends no answer for a cancelled request.
  await cancelled(c, "act", { ms: 1500, tag: `silent-${sdk}` }, "k-silent", 300);
  await waitFor(() => record(c.store, "act", "k-silent")?.state === "unknown",
    `sdk ${sdk}: the key to be marked unknown`, 15000,
    () => J(record(c.store, "act", "k-silent")));
  await waitFor(() => c.effects().length === 1, `sdk ${sdk}: the tool's effect`);
  eq(`sdk ${sdk} silent: the cancellation reached the tool`, [true],
    c.effects().map((e) => e.aborted));
  const r = await call(c.client, "act", { ms: 1500, tag: `silent-${sdk}` },
    { key: "k-silent", timeout: 15000 });
  eq(`sdk ${sdk} silent: the retry is refused, not acted`, -31903, r.error?.code);
  check(`sdk ${sdk} silent: saying why and what to do`,
    /may or may not have acted/.test(r.error?.message ?? "") &&
    /idem keys resolve k-silent/.test(r.error?.message ?? ""), r.error?.message);
  eq(`sdk ${sdk} silent: one effect`, 1, c.effects().length);
  await c.client.close();
}

// ---- Streamable HTTP: the cancellation goes on to the upstream ---------------
for (const sdk of ["1", "2"]) {
  const server = await startServer({ sdk: sdk === "2" ? "2" : "1",
    stateless: sdk === "2" });
  const store = join(TMP, `http-${sdk}.db`);
  const proxy = await startProxy(server.url, store,
    ["--keyed-cancel", "pass", "--cancel-wait", "1s"]);
  const c = await connectHttp(proxy.url, { sdk });
  const r1 = await callTool(c, "slow_ticket", { title: `c${sdk}` },
    { key: "k-http", timeout: 500 });
  check(`http ${sdk}: the client timed out`,
    [-32001, "REQUEST_TIMEOUT"].includes(r1.error?.code), J(r1));
  const cancels = await waitFor(async () => (await server.effects()).cancelled
    .length > 0 && (await server.effects()).cancelled,
  `http ${sdk}: the cancellation at the upstream`);
  eq(`http ${sdk}: once`, 1, cancels?.length);
  await waitFor(() => record(store, "slow_ticket", "k-http")?.state === "unknown",
    `http ${sdk}: the key to be marked unknown`, 15000,
    () => J(record(store, "slow_ticket", "k-http")));
  const r2 = await callTool(c, "slow_ticket", { title: `c${sdk}` },
    { key: "k-http", timeout: 15000 });
  eq(`http ${sdk}: the retry is refused, not acted`, -31903, r2.error?.code);
  eq(`http ${sdk}: nothing acted`, 0,
    (await server.effects()).effects.slow_ticket);
  await c.client.close();
  await proxy.kill();
  await server.kill();
}

finish();
