// mcp_client.mjs -- one measurement for bench/mcp.sh: tools/call round trips
// per second to server-everything's echo tool, one call at a time, for
// SECONDS seconds.
//   node mcp_client.mjs direct SECONDS SERVER
//   node mcp_client.mjs fresh|replay SECONDS SERVER IDEM STORE
//   node mcp_client.mjs fresh SECONDS SERVER IDEM STORE FLOOR
//   node mcp_client.mjs null SECONDS NULL_SERVER
//   node mcp_client.mjs turns SECONDS SERVER IDEM STORE NULL_SERVER
// direct: the client talks to the server itself; fresh: through idem mcp, a
// new key per call; replay: through idem mcp, one key for every call (the
// first call runs, the others are replays); null: the client talks to
// bench/mcp_null.c, which answers every call at once as a replay (the floor
// of any answer from memory). The calls are the same in every mode (the key
// in _meta; the server ignores it).
//
// turns: direct, replay and null side by side. The three peers are started
// and warmed up together, then take turns of TURN calls each (the order
// rotating) until SECONDS have passed, each mode timed over its own turns
// only. On a shared machine whose speed drifts by a factor of two within
// seconds, modes measured seconds apart compare the machine's moments as
// much as the modes; turns of a few tens of milliseconds see the same
// moment, and one client process means the same client JIT for all three.
// Prints one JSON line per mode.
//
// fresh with FLOOR (bench/mcp_floor): fresh and relay take turns in the
// same way. relay: the client talks to `mcp_floor STORE.relay relay node
// SERVER`, one thread that claims each call's key, forwards it, records
// the answer and writes it back (the least a proxy with idem's store does
// for a fresh call, the client's hop included).
//
// With PEER_CPU set, the peers run on that CPU only (bench/mcp.sh pins the
// client too): on the same CPU as the client or on another. Where a peer
// runs decides most of a round trip's cost on a virtual machine, where
// waking a process on another, idle CPU is far dearer than switching to it
// on one's own; left to the scheduler, the placement changes from run to
// run.
//
// The client writes and reads the JSON-RPC lines itself (initialize first,
// as the protocol asks) rather than through the SDK's client, whose own
// work per call (schema validation) would hide what the proxy costs. Every
// answer is parsed and checked. Exits 1 when a call fails or a replay is
// not one (or a call that should run was answered as a replay).
import { spawn as spawnAnywhere } from "node:child_process";

const [mode, secs, server, idem, store, nullServer] = process.argv.slice(2);
const floorBin = mode === "fresh" ? nullServer : undefined;
// PEER_CPU=N: the peers (and what they start) run on CPU N only, through
// taskset; bench/mcp.sh pins this client with taskset too.
const spawn = (cmd, args, o) => process.env.PEER_CPU
  ? spawnAnywhere("taskset", ["-c", process.env.PEER_CPU, cmd, ...args], o)
  : spawnAnywhere(cmd, args, o);
const TURN = 200;
const tag = `${process.pid}-${Date.now()}`;

// A peer over stdio: its process, and one request at a time.
function peer(kind) {
  const child = kind === "direct" ? spawn("node", [server], { stdio: ["pipe", "pipe", "ignore"] })
    : kind === "null" ? spawn(mode === "turns" ? nullServer : server, [],
      { stdio: ["pipe", "pipe", "ignore"] })
    : kind === "relay" ? spawn(floorBin, [`sqlite:${store}.relay`, "relay", "node", server],
      { stdio: ["pipe", "pipe", "ignore"] })
    : spawn(idem, ["mcp", "--store", store, "--", "node", server],
      { stdio: ["pipe", "pipe", "ignore"] });
  const p = { kind, child, buf: "", waiting: null, id: 0, i: 0, calls: 0,
    replays: 0, ns: 0n };
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (d) => {
    p.buf += d;
    let i;
    while ((i = p.buf.indexOf("\n")) >= 0) {
      const line = p.buf.slice(0, i);
      p.buf = p.buf.slice(i + 1);
      const m = JSON.parse(line);
      if (p.waiting && m.id === p.waiting.id && !m.method) {
        const w = p.waiting;
        p.waiting = null;
        w.resolve(m);
      }
    }
  });
  p.request = (method, params) => new Promise((resolve) => {
    p.waiting = { id: ++p.id, resolve };
    child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id: p.id, method, params }) + "\n");
  });
  return p;
}

async function open(p) {
  await p.request("initialize", { protocolVersion: "2025-06-18", capabilities: {},
    clientInfo: { name: "idem-bench", version: "1" } });
  p.child.stdin.write(JSON.stringify({ jsonrpc: "2.0",
    method: "notifications/initialized" }) + "\n");
}

// One call, checked; a replay counted.
async function one(p) {
  const key = p.kind === "replay" ? `replayed-${tag}` : `fresh-${tag}-${p.i}`;
  p.i++;
  const m = await p.request("tools/call", { name: "echo",
    arguments: { message: "hello" }, _meta: { idempotencyKey: key } });
  if (m.result?.content?.[0]?.text !== "Echo: hello")
    throw new Error("bad answer " + JSON.stringify(m));
  if (m.result._meta?.["idem/replayed"]) p.replays++;
}

// Warm up: 2,000 calls, or 2 s for the slow fresh mode. A new node process
// (this client, and in direct mode the server) speeds its calls up as its
// JIT compiles them; after 200 calls, direct runs of 3 s in a row on one
// machine gave 4,412, 6,109 and 6,176 calls/s, after 3,000 they gave 6,006,
// 5,917 and 6,458: a short warm-up measured a server still half cold now
// and then, which flattered every ratio against direct.
async function warm(p) {
  const until = process.hrtime.bigint() + 2_000_000_000n;
  for (let w = 0; w < 2000 && process.hrtime.bigint() < until; w++) await one(p);
}

// TURN calls (or fewer when the time is up), timed.
async function turn(p, until) {
  const r0 = p.replays;
  for (let k = 0; k < TURN; k++) {
    const t0 = process.hrtime.bigint();
    if (t0 >= until) break;
    await one(p);
    p.ns += process.hrtime.bigint() - t0;
    p.calls++;
  }
  return p.replays - r0;
}

const kinds = mode === "turns" ? ["direct", "replay", "null"]
  : floorBin ? ["fresh", "relay"] : [mode];
const peers = kinds.map(peer);
for (const p of peers) await open(p);
for (const p of peers) await warm(p);
const timedReplays = new Map(peers.map((p) => [p, 0]));
const until = process.hrtime.bigint() + BigInt(Math.round(Number(secs) * 1e9));
for (let t = 0; process.hrtime.bigint() < until; t++)
  for (let k = 0; k < peers.length; k++) {
    const p = peers[(t + k) % peers.length];
    timedReplays.set(p, timedReplays.get(p) + await turn(p, until));
  }
let ok = true;
for (const p of peers) {
  p.child.stdin.end();
  await new Promise((r) => p.child.on("exit", r));
  const rep = timedReplays.get(p);
  const seconds = Number(p.ns) / 1e9;
  ok &&= p.kind === "replay" || p.kind === "null" ? rep === p.calls : rep === 0;
  console.log(JSON.stringify({ mode: p.kind, calls: p.calls, seconds,
    ops_per_s: seconds > 0 ? p.calls / seconds : 0, replays: rep }));
}
process.exit(ok ? 0 : 1);
