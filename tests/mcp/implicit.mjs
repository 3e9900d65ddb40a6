// implicit.mjs -- `idem mcp --implicit-keys WINDOW` (issue 53): a client
// that sends no key (every mainstream one) re-sends a call under a new id
// after a lost answer; the proxy keys an unkeyed tools/call of a tool that
// may act by its tool and canonical arguments, so that the re-sent call
// attaches or replays instead of acting again, marked idem/implicit with a
// note for the model. Read-only and idempotent tools pass through. Over
// stdio (test_server.mjs, the filesystem server in the desktop
// configuration docs/mcp.md shows) and Streamable HTTP (http_server.mjs
// --more-tools, SDK 1.x and 2.x clients, one tenant per principal).
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, idem, replayed, text }
  from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer, waitFor }
  from "./http_lib.mjs";

const J = JSON.stringify;
const lines = (f) => {
  try { return readFileSync(f, "utf8").split("\n").length - 1; }
  catch { return 0; }
};
const implicit = (r) => r?._meta?.["idem/implicit"] === true;
// The note is the last content block of a replay, for the model to read.
const note = (r) => {
  const last = r?.content?.at(-1);
  return last?.type === "text" && /^\[idem\] This is the result of an earlier call/
    .test(last.text) ? last.text : null;
};
// The result as the tool gave it: the replay without the proxy's note.
const own = (r) => text({ content: note(r) ? r.content.slice(0, -1) : r?.content });
// The records of a store (idem keys list --json: one per line).
const records = (store) => idem("keys", "list", "--store", store, "--json")
  .split("\n").filter((l) => l).map((l) => JSON.parse(l));
const keysOf = (store) => records(store).map((r) => r.key);

// ---- stdio --------------------------------------------------------------------
{
  const store = join(TMP, "stdio.db");
  const opts = ["--store", store, "--implicit-keys", "10m"];
  const c = await connect({ server: SERVERS.test, proxy: opts });
  const caps = c.client.getServerCapabilities()?.experimental?.["idem/idempotency"];
  eq("stdio: the capability says so", [600000, "idem/implicit"],
    [caps?.implicitKeysMs, caps?.implicitMeta]);

  // A tool never listed may act: keyed all the same.
  const f1 = join(TMP, "f1.txt");
  const a = await call(c.client, "append", { file: f1, text: "one" });
  check("stdio: the first call acts", /line 1;/.test(text(a.result)) &&
    !replayed(a.result) && !implicit(a.result), J(a));
  const a2 = await call(c.client, "append", { file: f1, text: "one" });
  eq("stdio: the call sent again does not act", 1, lines(f1));
  check("stdio: it gets the first result, marked", replayed(a2.result) &&
    implicit(a2.result) && own(a2.result) === text(a.result), J(a2));
  check("stdio: with a note the model can act on", /argument changed/
    .test(note(a2.result) ?? ""), J(a2.result?.content));
  const a3 = await call(c.client, "append", { file: f1, text: "two" });
  check("stdio: other arguments are another action",
    /line 2;/.test(text(a3.result)) && !replayed(a3.result), J(a3));
  eq("stdio: two effects", 2, lines(f1));
  const k = keysOf(store);
  check("stdio: the keys are the proxy's", k.length === 2 &&
    k.every((x) => /^idem:implicit:[0-9a-f]{64}$/.test(x)), J(k));
  check("stdio: their results are kept for the window",
    records(store).every((x) => x.expires_ms - x.updated_ms === 600000),
    J(records(store)));

  // Read-only and idempotent tools pass through, listed or not.
  await c.client.listTools();
  const r = join(TMP, "reads.txt");
  const l1 = await call(c.client, "lookup", { file: r });
  const l2 = await call(c.client, "lookup", { file: r });
  check("stdio: a read-only tool runs each time", text(l1.result) === "lookup 1"
    && text(l2.result) === "lookup 2" && !replayed(l2.result), J([l1, l2]));
  const t1 = await call(c.client, "touch", { file: r });
  const t2 = await call(c.client, "touch", { file: r });
  check("stdio: an idempotent one too", text(t1.result) === "touch 3" &&
    text(t2.result) === "touch 4" && !replayed(t2.result), J([t1, t2]));
  eq("stdio: no key for them", 2, keysOf(store).length);

  // Re-sent while the first is still at the server: attached, one effect.
  const f2 = join(TMP, "f2.txt");
  const slow = { file: f2, text: "slow", delay_ms: 3000 };
  const first = call(c.client, "append", slow);
  await waitFor(() => lines(f2) === 1, "the slow call at the server");
  const again = await call(c.client, "append", slow);
  const firstR = await first;
  check("stdio: a call sent again in flight gets its result",
    replayed(again.result) && implicit(again.result) &&
    own(again.result) === text(firstR.result), J([firstR, again]));
  eq("stdio: acting once", 1, lines(f2));

  // A key of the proxy's shape from a client is refused.
  const forged = await call(c.client, "append", { file: f1, text: "one" },
    { key: k[0] });
  eq("stdio: a client's key may not be the proxy's", -31906,
    forged.error?.code);
  eq("stdio: and nothing acted", 2, lines(f1));

  // --require-key refuses nothing implicit keys cover.
  await c.client.close();
  const rk = await connect({ server: SERVERS.test,
    proxy: [...opts, "--require-key"] });
  const b = await call(rk.client, "append", { file: f1, text: "one" });
  check("stdio: a new proxy on the store replays it", replayed(b.result) &&
    implicit(b.result) && own(b.result) === text(a.result), J(b));
  eq("stdio: still two effects", 2, lines(f1));
  await rk.client.close();

  // After the window the same arguments are a new action.
  const w = await connect({ server: SERVERS.test,
    proxy: ["--store", join(TMP, "window.db"), "--implicit-keys", "1s"] });
  const f3 = join(TMP, "f3.txt");
  const w1 = await call(w.client, "append", { file: f3, text: "w" });
  const ended = Date.now();
  const w2 = await call(w.client, "append", { file: f3, text: "w" });
  check("stdio: within the window, a replay", replayed(w2.result), J(w2));
  // The window counts from the call's end: wait until it has passed.
  await waitFor(() => Date.now() > ended + 1500, "the window's end", 10000);
  const w3 = await call(w.client, "append", { file: f3, text: "w" });
  check("stdio: after it, the call acts again", !replayed(w3.result) &&
    /line 2;/.test(text(w3.result)) && text(w1.result) !== text(w3.result),
  J([w1, w3]));
  eq("stdio: two effects", 2, lines(f3));
  await w.client.close();
}

// ---- the desktop configuration: the filesystem server ---------------------------
{
  const dir = join(TMP, "files");
  mkdirSync(dir);
  const p = join(dir, "notes.txt");
  writeFileSync(p, "x");
  // As docs/mcp.md shows it: command idem, args mcp, options, --, server.
  const c = await connect({ server: SERVERS.filesystem, args: [dir],
    proxy: ["--store", join(TMP, "desktop.db"), "--tenant", "desktop",
      "--implicit-keys", "10m"] });
  await c.client.listTools();
  const edit = { path: p, edits: [{ oldText: "x", newText: "xx" }] };
  const e1 = await call(c.client, "edit_file", edit);
  const e2 = await call(c.client, "edit_file", edit);
  eq("desktop: edit_file sent again edits once", "xx", readFileSync(p, "utf8"));
  check("desktop: and gets the diff again", replayed(e2.result) &&
    implicit(e2.result) && own(e2.result) === text(e1.result) &&
    /\+xx/.test(own(e2.result)), J(e2));
  const r1 = await call(c.client, "read_text_file", { path: p });
  const r2 = await call(c.client, "read_text_file", { path: p });
  check("desktop: reads are never replayed", text(r1.result) === "xx" &&
    text(r2.result) === "xx" && !replayed(r2.result), J([r1, r2]));
  const m = join(dir, "moved.txt");
  const mv1 = await call(c.client, "move_file", { source: p, destination: m });
  const mv2 = await call(c.client, "move_file", { source: p, destination: m });
  check("desktop: move_file sent again does not fail on the moved file",
    !mv1.result?.isError && replayed(mv2.result) && !mv2.result?.isError &&
    readFileSync(m, "utf8") === "xx", J([mv1, mv2]));
  await c.client.close();
}

// ---- Streamable HTTP ----------------------------------------------------------
for (const sdk of ["1", "2"]) {
  const how = `http sdk ${sdk}`;
  const server = await startServer({ more: true });
  const store = join(TMP, `http-${sdk}.db`);
  const proxy = await startProxy(server.url, store, ["--implicit-keys", "10m"]);
  const c = await connectHttp(proxy.url, { sdk });
  const fx = async () => (await server.effects()).effects;

  const a = await callTool(c, "create_ticket", { title: "t" });
  const a2 = await callTool(c, "create_ticket", { title: "t" });
  check(`${how}: the first call acts`, /^ticket-\d+$/.test(text(a.result)) &&
    !replayed(a.result), J(a));
  check(`${how}: the call sent again gets its result, marked`,
    replayed(a2.result) && implicit(a2.result) &&
    own(a2.result) === text(a.result) && note(a2.result), J(a2));
  eq(`${how}: one effect`, 1, (await fx()).create_ticket);
  const b = await callTool(c, "create_ticket", { title: "u" });
  check(`${how}: other arguments act`, !replayed(b.result) &&
    text(b.result) !== text(a.result), J(b));
  eq(`${how}: two effects`, 2, (await fx()).create_ticket);

  await c.client.listTools();
  await callTool(c, "lookup", { q: "x" });
  const l2 = await callTool(c, "lookup", { q: "x" });
  await callTool(c, "touch", { title: "x" });
  const t2 = await callTool(c, "touch", { title: "x" });
  check(`${how}: read-only and idempotent tools are not replayed`,
    !replayed(l2.result) && !replayed(t2.result), J([l2, t2]));
  eq(`${how}: and run each time`, [2, 2],
    [(await fx()).lookup, (await fx()).touch]);
  await c.client.close();
  await proxy.kill();

  // One tenant per principal: bob's identical call is his own action, and
  // never gets alice's result.
  const pp = await startProxy(server.url, join(TMP, `http-p-${sdk}.db`),
    ["--implicit-keys", "10m", "--principal", "header:X-User"]);
  const alice = await connectHttp(pp.url, { sdk, headers: { "x-user": "alice" } });
  const bob = await connectHttp(pp.url, { sdk, headers: { "x-user": "bob" } });
  const before = (await fx()).create_ticket;
  const pa = await callTool(alice, "create_ticket", { title: "same" });
  const pb = await callTool(bob, "create_ticket", { title: "same" });
  const pa2 = await callTool(alice, "create_ticket", { title: "same" });
  check(`${how}: bob's identical call acts for bob`, !replayed(pb.result) &&
    text(pb.result) !== text(pa.result), J([pa, pb]));
  check(`${how}: alice's is replayed to alice`, replayed(pa2.result) &&
    own(pa2.result) === text(pa.result), J(pa2));
  eq(`${how}: two effects`, before + 2, (await fx()).create_ticket);
  // A caller with no principal is not keyed: the upstream answers it.
  const anon = await connectHttp(pp.url, { sdk });
  const n1 = await callTool(anon, "create_ticket", { title: "anon" });
  const n2 = await callTool(anon, "create_ticket", { title: "anon" });
  check(`${how}: a caller without a principal passes through`,
    !replayed(n2.result) && text(n1.result) !== text(n2.result), J([n1, n2]));
  eq(`${how}: acting each time`, before + 4, (await fx()).create_ticket);
  for (const x of [alice, bob, anon]) await x.client.close();
  await pp.kill();
  await server.kill();
}

finish();
