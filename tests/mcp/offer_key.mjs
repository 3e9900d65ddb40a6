// offer_key.mjs -- `idem mcp --offer-key-argument NAME` (issue 53): the
// tools/list answers gain an optional string argument NAME on every tool
// that is not read-only; a call that passes it is keyed by it, and NAME is
// taken out of the arguments before the server sees them, unless the
// tool's own schema declares NAME (then it passes through, as
// --key-argument's does). Over stdio (test_server.mjs, which echoes the
// arguments it got) and over Streamable HTTP (http_server.mjs --more-tools,
// which logs every tools/call's arguments as POSTed), with answers as
// event streams and as JSON.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, replayed, text }
  from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer } from "./http_lib.mjs";

const J = JSON.stringify;
const lines = (f) => readFileSync(f, "utf8").split("\n").length - 1;
const props = (list, name) => list.tools.find((t) => t.name === name)
  ?.inputSchema?.properties ?? {};
const ours = (p) => p?.type === "string" &&
  /new unique value/.test(p?.description ?? "") && /retry/.test(p.description);

// ---- stdio ------------------------------------------------------------------
{
  const store = join(TMP, "stdio.db");
  const file = join(TMP, "append.txt");
  const c = await connect({ server: SERVERS.test,
    proxy: ["--store", store, "--offer-key-argument", "idem_key"] });
  const list = await c.client.listTools();
  check("stdio: a write tool is offered the argument",
    ours(props(list, "append").idem_key), J(props(list, "append")));
  check("stdio: its own arguments stay",
    props(list, "append").idempotency_key?.type === "string");
  check("stdio: a read-only tool is not", !("idem_key" in props(list, "big")),
    J(props(list, "big")));
  check("stdio: not added to required",
    !(list.tools.find((t) => t.name === "append").inputSchema.required ?? [])
      .includes("idem_key"));
  const caps = c.client.getServerCapabilities()?.experimental?.["idem/idempotency"];
  check("stdio: the capability lists the argument",
    caps?.keyLocations?.includes("params.arguments.idem_key"), J(caps));

  const a = await call(c.client, "append", { file, text: "one", idem_key: "k1" });
  check("stdio: the call acts", /line 1;/.test(text(a.result)), J(a));
  check("stdio: the server never sees the argument",
    !/idem_key/.test(text(a.result)) && !/k1/.test(text(a.result)),
    text(a.result));
  const a2 = await call(c.client, "append", { file, text: "one", idem_key: "k1" });
  check("stdio: the retry is replayed", replayed(a2.result), J(a2));
  eq("stdio: with the same result", text(a.result), text(a2.result));
  eq("stdio: one effect", 1, lines(file));
  const b = await call(c.client, "append", { file, text: "one", idem_key: "k2" });
  check("stdio: a new value acts again",
    !replayed(b.result) && /line 2;/.test(text(b.result)), J(b));
  eq("stdio: two effects", 2, lines(file));
  const cf = await call(c.client, "append", { file, text: "two", idem_key: "k1" });
  eq("stdio: the value with other arguments is a conflict", -31901,
    cf.error?.code);
  const bad = await call(c.client, "append", { file, text: "x", idem_key: 7 });
  eq("stdio: a value that is no string is refused", -31906, bad.error?.code);
  const un = await call(c.client, "append", { file, text: "null", idem_key: null });
  check("stdio: a null value: unkeyed, and taken out",
    !replayed(un.result) && !/idem_key/.test(text(un.result)), J(un));
  // The fingerprint leaves the argument out: the same key in _meta is the
  // same call.
  const m = await call(c.client, "append", { file, text: "one" }, { key: "k2" });
  check("stdio: the same key in _meta replays it", replayed(m.result) &&
    text(m.result) === text(b.result), J(m));
  eq("stdio: still three effects", 3, lines(file));
  await c.client.close();

  // A server whose schema declares the name: it gets the argument, and the
  // call is keyed by it all the same.
  const d = await connect({ server: SERVERS.test,
    proxy: ["--store", store, "--offer-key-argument", "idempotency_key"] });
  const dl = await d.client.listTools();
  eq("stdio: a declared argument is the server's own, unchanged",
    { type: "string" }, props(dl, "append").idempotency_key);
  check("stdio: other write tools get it",
    ours(props(dl, "reject").idempotency_key), J(props(dl, "reject")));
  const dfile = join(TMP, "declared.txt");
  const x = await call(d.client, "append",
    { file: dfile, text: "d", idempotency_key: "d1" });
  check("stdio: the declared argument reaches the server",
    /"idempotency_key":"d1"/.test(text(x.result)), J(x));
  const x2 = await call(d.client, "append",
    { file: dfile, text: "d", idempotency_key: "d1" });
  check("stdio: and keys the call", replayed(x2.result) &&
    text(x2.result) === text(x.result) && lines(dfile) === 1, J(x2));
  await d.client.close();

  // --require-key names the argument.
  const r = await connect({ server: SERVERS.test,
    proxy: ["--store", store, "--require-key", "--offer-key-argument",
      "idem_key"] });
  await r.client.listTools();
  const rf = await call(r.client, "append", { file, text: "no key" });
  eq("stdio: --require-key refuses", -31905, rf.error?.code);
  check("stdio: naming the argument", /argument "idem_key"/.test(
    rf.error?.message ?? "") && /same value/.test(rf.error?.message ?? ""),
  rf.error?.message);
  eq("stdio: in data too", "idem_key", rf.error?.data?.keyArgument);
  const rb = await call(r.client, "big", { bytes: 3 });
  check("stdio: a read-only tool needs none", text(rb.result) === "yyy", J(rb));
  const rk = await call(r.client, "append", { file, text: "k3", idem_key: "k3" });
  check("stdio: the argument satisfies it", /appended k3/.test(text(rk.result)),
    J(rk));
  await r.client.close();
  eq("stdio: nothing refused acted", 4, lines(file));
}

// ---- Streamable HTTP ----------------------------------------------------------
for (const json of [false, true]) {
  const how = json ? "http json" : "http sse";
  const server = await startServer({ more: true, json });
  const store = join(TMP, `http-${json}.db`);
  const proxy = await startProxy(server.url, store,
    ["--offer-key-argument", "op_key"]);
  const c = await connectHttp(proxy.url);
  const list = await c.client.listTools();
  check(`${how}: a write tool is offered the argument`,
    ours(props(list, "create_ticket").op_key), J(props(list, "create_ticket")));
  check(`${how}: an idempotent one too`, ours(props(list, "touch").op_key),
    J(props(list, "touch")));
  check(`${how}: a read-only one is not`, !("op_key" in props(list, "lookup")),
    J(props(list, "lookup")));
  check(`${how}: a declared one keeps the server's`,
    props(list, "charge").op_key && !ours(props(list, "charge").op_key),
    J(props(list, "charge")));
  const argsSeen = async () => (await server.effects()).callArguments;

  const a = await callTool(c, "create_ticket", { title: "t", op_key: "k1" });
  check(`${how}: the call acts`, /^ticket-\d+$/.test(text(a.result)), J(a));
  const a2 = await callTool(c, "create_ticket", { title: "t", op_key: "k1" });
  check(`${how}: the retry is replayed`, replayed(a2.result) &&
    text(a2.result) === text(a.result), J(a2));
  eq(`${how}: one effect`, 1, (await server.effects()).effects.create_ticket);
  const b = await callTool(c, "create_ticket", { title: "t", op_key: "k2" });
  check(`${how}: a new value acts again`, !replayed(b.result) &&
    text(b.result) !== text(a.result), J(b));
  eq(`${how}: two effects`, 2, (await server.effects()).effects.create_ticket);
  check(`${how}: the server never sees the argument`,
    (await argsSeen()).every((x) => !("op_key" in (x ?? {}))),
    J(await argsSeen()));

  const ch = await callTool(c, "charge", { title: "c", op_key: "c1" });
  const ch2 = await callTool(c, "charge", { title: "c", op_key: "c1" });
  check(`${how}: a declared argument reaches the server`,
    (await argsSeen()).some((x) => x?.op_key === "c1"), J(await argsSeen()));
  check(`${how}: and keys the call`, replayed(ch2.result) &&
    text(ch2.result) === text(ch.result) &&
    (await server.effects()).effects.charge === 1, J([ch, ch2]));
  await c.client.close();

  const rp = await startProxy(server.url, join(TMP, `http-rk-${json}.db`),
    ["--offer-key-argument", "op_key", "--require-key"]);
  const r = await connectHttp(rp.url);
  await r.client.listTools();
  const before = (await server.effects()).effects.create_ticket;
  const rf = await callTool(r, "create_ticket", { title: "nokey" });
  eq(`${how}: --require-key refuses`, -31905, rf.error?.code);
  check(`${how}: naming the argument`, /argument "op_key"/.test(
    rf.error?.message ?? ""), rf.error?.message);
  const rl = await callTool(r, "lookup", { q: "x" });
  check(`${how}: a read-only tool needs none`, !rl.error, J(rl));
  const rk = await callTool(r, "create_ticket", { title: "k", op_key: "k9" });
  check(`${how}: the argument satisfies it`, !rk.error, J(rk));
  eq(`${how}: the refused call did not act`, before + 1,
    (await server.effects()).effects.create_ticket);
  await r.client.close();
  await rp.kill();
  await proxy.kill();
  await server.kill();
}

finish();
