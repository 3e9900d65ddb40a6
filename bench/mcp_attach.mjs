// mcp_attach.mjs -- one measurement for bench/mcp.sh: how soon a retry that
// arrives while its call is still running is answered once that call
// finishes.
//   node mcp_attach.mjs SERVER IDEM STORE
// SERVER is tests/mcp/slow_server.mjs, whose `act` tool takes `ms`
// milliseconds and logs its start to $EFFECTS_START. A keyed call of 2 s is
// sent; once the server has started it, a retry with the same key follows.
// The retry waits for the call (--attach-wait) and is answered with its
// result: the figure is the time between the two answers, as this client
// reads them. Prints one JSON line; exits 1 when the retry is not the
// call's result replayed.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [server, idem, store] = process.argv.slice(2);
const dir = mkdtempSync(join(tmpdir(), "idem-attach."));
const started = join(dir, "start");
const child = spawn(idem, ["mcp", "--store", store, "--", "node", server],
  { stdio: ["pipe", "pipe", "ignore"],
    env: { ...process.env, EFFECTS: join(dir, "effects"), EFFECTS_START: started } });
const answered = new Map();
let buf = "";
child.stdout.setEncoding("utf8");
child.stdout.on("data", (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const m = JSON.parse(buf.slice(0, i));
    buf = buf.slice(i + 1);
    if (!m.method && answered.has(m.id)) answered.get(m.id)({ m, at: performance.now() });
  }
});
const send = (id, method, params) => new Promise((resolve) => {
  answered.set(id, resolve);
  child.stdin.write(JSON.stringify({ jsonrpc: "2.0", id, method, params }) + "\n");
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

await send(1, "initialize", { protocolVersion: "2025-06-18", capabilities: {},
  clientInfo: { name: "idem-bench", version: "1" } });
child.stdin.write(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }) + "\n");
const call = { name: "act", arguments: { ms: 2000, tag: "attach" },
  _meta: { idempotencyKey: `attach-${process.pid}` } };
const first = send(2, "tools/call", call);
for (let i = 0; i < 2000 && !existsSync(started); i++) await sleep(5);
const retry = send(3, "tools/call", call);
const [a, b] = await Promise.all([first, retry]);
const text = (x) => x.m.result?.content?.[0]?.text;
const ok = text(a) !== undefined && text(a) === text(b) &&
  b.m.result?._meta?.["idem/replayed"] === true &&
  readFileSync(join(dir, "effects"), "utf8").trim().split("\n").length === 1;
child.stdin.end();
rmSync(dir, { recursive: true, force: true });
// The proxy answers the retry and the call in one go, the retry first (0
// or a little less when both are read in one chunk).
console.log(JSON.stringify({ attach_ms: Math.max(0, b.at - a.at), ok }));
process.exit(ok ? 0 : 1);
