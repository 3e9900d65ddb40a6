// mcp_client.mjs -- one measurement for bench/mcp.sh: tools/call round trips
// per second to server-everything's echo tool, one call at a time, for
// SECONDS seconds.
//   node mcp_client.mjs direct SECONDS SERVER
//   node mcp_client.mjs fresh|replay SECONDS SERVER IDEM STORE
//   node mcp_client.mjs null SECONDS NULL_SERVER
// direct: the client talks to the server itself; fresh: through idem mcp, a
// new key per call; replay: through idem mcp, one key for every call (the
// first call runs, the others are replays); null: the client talks to
// bench/mcp_null.c, which answers every call at once as a replay (the floor
// of any answer from memory). The calls are the same in every mode (the key
// in _meta; the server ignores it).
//
// The client writes and reads the JSON-RPC lines itself (initialize first,
// as the protocol asks) rather than through the SDK's client, whose own
// work per call (schema validation) would hide what the proxy costs. Every
// answer is parsed and checked. Prints one JSON line; exits 1 when a call
// fails or a replay is not one.
import { spawn } from "node:child_process";

const [mode, secs, server, idem, store] = process.argv.slice(2);
const child = mode === "direct" ? spawn("node", [server], { stdio: ["pipe", "pipe", "ignore"] })
  : mode === "null" ? spawn(server, [], { stdio: ["pipe", "pipe", "ignore"] })
  : spawn(idem, ["mcp", "--store", store, "--", "node", server],
    { stdio: ["pipe", "pipe", "ignore"] });
let buf = "";
let waiting = null;
child.stdout.setEncoding("utf8");
child.stdout.on("data", (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    const m = JSON.parse(line);
    if (waiting && m.id === waiting.id && !m.method) {
      const w = waiting;
      waiting = null;
      w.resolve(m);
    }
  }
});
let id = 0;
const request = (method, params) => new Promise((resolve) => {
  waiting = { id: ++id, resolve };
  child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
});
await request("initialize", { protocolVersion: "2025-06-18", capabilities: {},
  clientInfo: { name: "idem-bench", version: "1" } });
child.stdin.write(JSON.stringify({ jsonrpc: "2.0",
  method: "notifications/initialized" }) + "\n");

let i = 0;
let replays = 0;
const tag = `${process.pid}-${Date.now()}`;
async function one() {
  const key = mode === "replay" ? `replayed-${tag}` : `fresh-${tag}-${i}`;
  i++;
  const m = await request("tools/call", { name: "echo",
    arguments: { message: "hello" }, _meta: { idempotencyKey: key } });
  if (m.result?.content?.[0]?.text !== "Echo: hello")
    throw new Error("bad answer " + JSON.stringify(m));
  if (m.result._meta?.["idem/replayed"]) replays++;
}
for (let w = 0; w < 200; w++) await one(); // warm up
const start = process.hrtime.bigint();
const until = start + BigInt(Math.round(Number(secs) * 1e9));
const before = i;
const r0 = replays;
while (process.hrtime.bigint() < until) await one();
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
const calls = i - before;
const rep = replays - r0;
child.stdin.end();
await new Promise((r) => child.on("exit", r));
const ok = mode === "replay" || mode === "null" ? rep === calls : rep === 0;
console.log(JSON.stringify({ mode, calls, seconds, ops_per_s: calls / seconds,
  replays: rep }));
process.exit(ok ? 0 : 1);
