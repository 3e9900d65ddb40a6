// idem mcp in front of @modelcontextprotocol/server-filesystem: edit_file
// x -> xx retried after a lost response, keys in both places, conflicts,
// unkeyed calls, a JSON-RPC error, an isError result, a 10 MB result,
// 8 concurrent calls with one key and --require-key.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, record, replayed,
  text, unmarked } from "./lib.mjs";

const dir = join(TMP, "files");
mkdirSync(dir);
const store = join(TMP, "idem.db");
const file = (name, content) => {
  const p = join(dir, name);
  if (content !== undefined) writeFileSync(p, content);
  return p;
};
const read = (p) => readFileSync(p, "utf8");
const edit = (path, from, to) =>
  ({ path, edits: [{ oldText: from, newText: to }] });
const fs = { server: SERVERS.filesystem, args: [dir] };

// Without the proxy: the retry after a lost response edits a second time.
{
  const { client } = await connect(fs);
  const a = file("direct.txt", "x");
  const r1 = await call(client, "edit_file", edit(a, "x", "xx"));
  const r2 = await call(client, "edit_file", edit(a, "x", "xx"));
  check("direct: both calls answered", r1.result && r2.result);
  eq("direct: edited twice", "xxx", read(a));
  await client.close();
}

// --keep-requests: the record keeps the arguments, checked below.
const proxied = { ...fs, proxy: ["--store", store, "--keep-requests"] };
const { client, stderr } = await connect(proxied);

// The capability a client can read.
{
  const exp = client.getServerCapabilities()?.experimental?.["idem/idempotency"];
  eq("initialize: key locations", ["params._meta.idempotencyKey",
    "params.idempotencyKey"], exp?.keyLocations);
  eq("initialize: the server's own capabilities stay", true,
    client.getServerCapabilities()?.tools !== undefined);
}

// One key: the retry is a replay.
{
  const b = file("keyed.txt", "x");
  const r1 = await call(client, "edit_file", edit(b, "x", "xx"), { key: "edit-b-1" });
  const r2 = await call(client, "edit_file", edit(b, "x", "xx"), { key: "edit-b-1" });
  eq("keyed: edited once", "xx", read(b));
  check("keyed: first result is live", r1.result && !replayed(r1.result),
    JSON.stringify(r1));
  check("keyed: second result is a replay", replayed(r2.result), JSON.stringify(r2));
  eq("keyed: both results the same", r1.result, unmarked(r2.result));
  check("keyed: the result shows the diff", /\+xx/.test(text(r1.result)),
    text(r1.result));
  const rec = record(store, "edit_file", "edit-b-1");
  eq("keyed: record completed", "completed", rec?.state);
  eq("keyed: stored request has no key", { name: "edit_file",
    arguments: edit(b, "x", "xx") }, JSON.parse(rec.request));

  // Same key, other arguments: refused, the file is unchanged.
  const r3 = await call(client, "edit_file", edit(b, "x", "xy"), { key: "edit-b-1" });
  eq("conflict: code", -31901, r3.error?.code);
  eq("conflict: data", "conflict", r3.error?.data?.idem);
  check("conflict: message says to use a new key",
    /new key/.test(r3.error?.message ?? ""), r3.error?.message);
  eq("conflict: file unchanged", "xx", read(b));

  // The key in params.idempotencyKey (the closed proposal's place).
  const c = file("params.txt", "x");
  const p1 = await call(client, "edit_file", edit(c, "x", "xx"),
    { key: "edit-c-1", where: "params" });
  const p2 = await call(client, "edit_file", edit(c, "x", "xx"),
    { key: "edit-c-1", where: "params" });
  eq("params key: edited once", "xx", read(c));
  check("params key: replayed", !replayed(p1.result) && replayed(p2.result));
}

// Without a key: every call acts.
{
  const d = file("unkeyed.txt", "x");
  const r1 = await call(client, "edit_file", edit(d, "x", "xx"));
  const r2 = await call(client, "edit_file", edit(d, "x", "xx"));
  eq("unkeyed: edited twice", "xxx", read(d));
  check("unkeyed: neither replayed", !replayed(r1.result) && !replayed(r2.result));
}

// isError results are stored: the tool ran.
{
  const e = join(dir, "missing.txt");
  const r1 = await call(client, "edit_file", edit(e, "x", "xx"), { key: "edit-e-1" });
  check("isError: first call failed in the tool", r1.result?.isError === true,
    JSON.stringify(r1));
  file("missing.txt", "x");
  const r2 = await call(client, "edit_file", edit(e, "x", "xx"), { key: "edit-e-1" });
  check("isError: replayed", replayed(r2.result) && r2.result.isError === true);
  eq("isError: same result", r1.result, unmarked(r2.result));
  eq("isError: the file now there is not edited", "x", read(e));
}

// A 10 MB result is stored and replayed: the server returns a file's text
// twice (as content and as structuredContent).
{
  const big = "0123456789abcdef".repeat(327680); // 5 MiB
  const f = file("big.txt", big);
  const r1 = await call(client, "read_text_file", { path: f }, { key: "big-1" });
  eq("10 MB: read whole", big.length, text(r1.result)?.length);
  check("10 MB: the result is over 10 MB", JSON.stringify(r1.result).length > 10e6);
  rmSync(f);
  const r2 = await call(client, "read_text_file", { path: f }, { key: "big-1" });
  check("10 MB: replayed after the file is gone", replayed(r2.result));
  check("10 MB: same bytes", text(r2.result) === big);
}

// 8 concurrent calls with one key: one edit.
{
  const g = file("concurrent.txt", "x");
  const rs = await Promise.all(Array.from({ length: 8 }, () =>
    call(client, "edit_file", edit(g, "x", "xx"), { key: "edit-g-1" })));
  eq("concurrent: edited once", "xx", read(g));
  const live = rs.filter((r) => r.result && !replayed(r.result));
  const rep = rs.filter((r) => r.result && replayed(r.result));
  const inflight = rs.filter((r) => r.error?.code === -31902);
  eq("concurrent: one live result", 1, live.length);
  eq("concurrent: the others replayed or in flight", 7, rep.length + inflight.length);
  check("concurrent: replays equal the live result",
    rep.every((r) => JSON.stringify(unmarked(r.result)) ===
      JSON.stringify(live[0]?.result)));
  check("concurrent: in-flight errors say when to retry", inflight.every((r) =>
    r.error.data?.retryAfterMs > 0 && /retry/i.test(r.error.message)));
}
await client.close();
check("no warning on stderr", !/warning|error/i.test(stderr().replace(
  /Secure MCP Filesystem Server.*|Allowed directories.*|Client does not support.*/g, "")),
stderr());

// --require-key: learned from tools/list.
{
  const { client: c2 } = await connect({ ...fs, proxy: ["--store", store,
    "--require-key"] });
  const h = file("required.txt", "x");
  const r0 = await call(c2, "edit_file", edit(h, "x", "xx"));
  eq("require-key before tools/list: refused", -31905, r0.error?.code);
  const tools = await c2.listTools();
  check("require-key: tools listed", tools.tools.length > 5);
  const r1 = await call(c2, "edit_file", edit(h, "x", "xx"));
  eq("require-key: unannotated edit_file refused", -31905, r1.error?.code);
  check("require-key: message names where to put a key",
    /params\._meta\.idempotencyKey/.test(r1.error?.message ?? ""), r1.error?.message);
  eq("require-key: file unchanged", "x", read(h));
  const r2 = await call(c2, "read_text_file", { path: h });
  eq("require-key: readOnlyHint tool runs", "x", text(r2.result));
  const w = join(dir, "written.txt");
  const r3 = await call(c2, "write_file", { path: w, content: "w" });
  check("require-key: idempotentHint tool runs", r3.result && !r3.result.isError);
  eq("require-key: write_file wrote", "w", read(w));
  const r4 = await call(c2, "edit_file", edit(h, "x", "xx"), { key: "edit-h-1" });
  const r5 = await call(c2, "edit_file", edit(h, "x", "xx"), { key: "edit-h-1" });
  check("require-key: keyed call runs once", r4.result && replayed(r5.result));
  eq("require-key: file edited once", "xx", read(h));
  await c2.close();
}
finish();
