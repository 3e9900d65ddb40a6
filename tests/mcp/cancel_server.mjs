// cancel_server.mjs -- a stdio MCP server whose tool stops cleanly when its
// request is cancelled and says so, as the Python SDK's servers do (they
// answer a cancelled request with an error, "Request cancelled"); the
// TypeScript SDK's servers send nothing (slow_server.mjs).
//
//   work {ms, tag, on_cancel}  logs {tag, n, started} to $EFFECTS, then
//     after ms logs {tag, n, acted} and answers done-<tag>-<n>. Cancelled
//     before that (notifications/cancelled naming its request id):
//       on_cancel "confirm"  stops, logs {tag, n, stopped}, answers the
//                            error -32800 "Request cancelled"
//       on_cancel "finish"   goes on as if not cancelled (it had committed)
import { appendFileSync } from "node:fs";
import { createInterface } from "node:readline";

const out = (m) => process.stdout.write(JSON.stringify(m) + "\n");
const log = (e) => appendFileSync(process.env.EFFECTS, JSON.stringify(e) + "\n");
const running = new Map(); // JSON.stringify(request id) -> cancel()
let n = 0;

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  let m;
  try { m = JSON.parse(line); } catch { return; }
  if (m.method === "initialize")
    out({ jsonrpc: "2.0", id: m.id, result: { protocolVersion:
      m.params?.protocolVersion ?? "2025-06-18", capabilities: { tools: {} },
    serverInfo: { name: "cancel-server", version: "1" } } });
  else if (m.method === "tools/list")
    out({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "work",
      inputSchema: { type: "object", properties: { ms: { type: "number" },
        tag: { type: "string" }, on_cancel: { type: "string" } } } }] } });
  else if (m.method === "tools/call" && m.params?.name === "work") {
    const { ms = 0, tag = "", on_cancel: onCancel = "confirm" } =
      m.params.arguments ?? {};
    const me = { tag, n: ++n };
    log({ ...me, started: true, id: m.id });
    const key = JSON.stringify(m.id);
    const timer = setTimeout(() => {
      running.delete(key);
      log({ ...me, acted: true });
      out({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text",
        text: `done-${tag}-${me.n}` }] } });
    }, ms);
    running.set(key, () => {
      if (onCancel !== "confirm") return;
      clearTimeout(timer);
      running.delete(key);
      log({ ...me, stopped: true });
      out({ jsonrpc: "2.0", id: m.id, error: { code: -32800,
        message: "Request cancelled" } });
    });
  } else if (m.method === "notifications/cancelled") {
    log({ cancelled: m.params?.requestId, reason: m.params?.reason ?? null });
    running.get(JSON.stringify(m.params?.requestId))?.();
  } else if (m.id !== undefined && m.method) {
    out({ jsonrpc: "2.0", id: m.id, error: { code: -32601,
      message: `no method ${m.method}` } });
  }
});
