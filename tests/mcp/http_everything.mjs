// http_everything.mjs -- `idem mcp --listen` in front of a real npm server
// that speaks Streamable HTTP: @modelcontextprotocol/server-everything
// (stateful, with an event store), driven by the 1.x SDK client.
//
// Its toggle-simulated-logging tool is the side effect the test counts: it
// flips a per-session switch, so after one keyed call and its retry, an
// unkeyed call must find the switch on ("Stopped ..."): had the retry
// acted too, the switch would be off again and it would say "Started".
import { createServer } from "node:net";
import { join } from "node:path";
import { HERE, check, eq, finish, replayed, text, TMP } from "./lib.mjs";
import { callTool, connectHttp, makeCutter, startProxy, waitFor } from "./http_lib.mjs";
import { spawn } from "node:child_process";

const SERVER = join(HERE, "node_modules", "@modelcontextprotocol",
  "server-everything", "dist", "index.js");

// A free port for the server (it prints the port it was given, not one it
// chose).
const port = await new Promise((r) => {
  const s = createServer().listen(0, "127.0.0.1", () => {
    const p = s.address().port;
    s.close(() => r(p));
  });
});
const ev = spawn(process.execPath, [SERVER, "streamableHttp"],
  { env: { ...process.env, PORT: String(port) }, stdio: ["ignore", "pipe", "pipe"] });
let evOut = "";
ev.stdout.on("data", (d) => (evOut += d));
ev.stderr.on("data", (d) => (evOut += d));
process.on("exit", () => ev.kill("SIGKILL"));
await waitFor(() => /listening on port/.test(evOut), "server-everything to listen", 20000,
  () => evOut);

const px = await startProxy(`http://127.0.0.1:${port}/mcp`, `sqlite:${join(TMP, "everything.db")}`);
const A = await connectHttp(px.url, { sdk: "1" });
check("a session through the proxy", typeof A.sessionId() === "string", A.sessionId());

// One effect per key, counted by the switch.
const t1 = await callTool(A, "toggle-simulated-logging", {}, { key: "k-toggle" });
check("toggle: the first call acted", /^Started/.test(text(t1.result) ?? ""), JSON.stringify(t1));
const t2 = await callTool(A, "toggle-simulated-logging", {}, { key: "k-toggle" });
check("toggle: the retry is a replay", replayed(t2.result), JSON.stringify(t2));
eq("toggle: the retry's text is the first's", text(t1.result), text(t2.result));
const t3 = await callTool(A, "toggle-simulated-logging", {});
check("toggle: one effect (an unkeyed call finds the switch on)",
  /^Stopped/.test(text(t3.result) ?? ""), JSON.stringify(t3));

// Progress passes on while the operation runs; the stream is cut after the
// first progress and the call re-issued under a new id: the original
// result, one run (its progress token's events stop after one run).
const cutter = makeCutter();
const B = await connectHttp(px.url, { sdk: "1", fetch: cutter.fetch });
cutter.arm((m) => m.method === "tools/call" && m.params?._meta?.idempotencyKey === "k-long");
const prog = [];
const first = callTool(B, "trigger-long-running-operation", { duration: 2, steps: 4 },
  { key: "k-long", timeout: 1500, onprogress: (p) => prog.push(p) });
await waitFor(() => prog.length >= 1, "the first progress through the proxy");
check("long: the stream was cut mid-call", cutter.cut());
const f = await first;
check("long: the cut call failed at the client", f.error !== undefined, JSON.stringify(f));
const again = await callTool(B, "trigger-long-running-operation", { duration: 2, steps: 4 },
  { key: "k-long" });
check("long: the re-issue got the result", /Long running operation completed/.test(text(again.result) ?? ""),
  JSON.stringify(again));
check("long: marked replayed", replayed(again.result), JSON.stringify(again));
const C = await connectHttp(px.url, { sdk: "1" });
const third = await callTool(C, "trigger-long-running-operation", { duration: 2, steps: 4 },
  { key: "k-long" });
eq("long: another session gets the same result", text(again.result), text(third.result));
check("long: marked replayed for the other session", replayed(third.result), JSON.stringify(third));

// Echo: another client, another session, the same key: a replay.
const e1 = await callTool(A, "echo", { message: "hello" }, { key: "k-echo" });
const e2 = await callTool(C, "echo", { message: "hello" }, { key: "k-echo" });
eq("echo: the text", "Echo: hello", text(e1.result));
check("echo: another session's retry is a replay", replayed(e2.result) &&
  text(e2.result) === "Echo: hello", JSON.stringify(e2));
eq("echo: C's session unchanged by the replay", true, typeof C.sessionId() === "string" &&
  C.sessionId() !== A.sessionId());

for (const c of [A, B, C]) await c.client.close().catch(() => {});
px.proc.kill("SIGTERM");
eq("proxy exits 0", 0, (await px.exited).code);
ev.kill("SIGTERM");
finish();
