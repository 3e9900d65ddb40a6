// idem mcp in front of @modelcontextprotocol/server-everything: a
// state-changing tool called twice with one key acts once; progress and a
// server-to-client sampling request pass through during a keyed call; a
// long-running call cancelled by the client.
import { CreateMessageRequestSchema, LoggingMessageNotificationSchema }
  from "@modelcontextprotocol/sdk/types.js";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, idem, record,
  replayed, sleep, text, unmarked } from "./lib.mjs";

const store = join(TMP, "idem.db");
let samples = 0;
let logs = 0;
const everything = (proxy) => connect({ server: SERVERS.everything, proxy,
  capabilities: { sampling: {} },
  handlers: (c) => {
    c.setRequestHandler(CreateMessageRequestSchema, async (req) => {
      samples++;
      return { model: "test-model", role: "assistant",
        content: { type: "text", text: `sampled ${samples}: ` +
          req.params.messages[0].content.text } };
    });
    c.setNotificationHandler(LoggingMessageNotificationSchema, () => { logs++; });
  } });

// Without the proxy the second toggle undoes the first.
{
  const { client } = await everything(null);
  const r1 = await call(client, "toggle-simulated-logging", {});
  const r2 = await call(client, "toggle-simulated-logging", {});
  check("direct: the retry toggles back", /^Started/.test(text(r1.result)) &&
    /^Stopped/.test(text(r2.result)), text(r2.result));
  await client.close();
}

const { client, transport, stderr } = await everything(["--store", store]);
// Every message the proxy wrote to the client, as the transport read it:
// the SDK client hands notifications to their handlers a microtask later
// than responses, so a progress notification read in the same chunk as its
// call's response never reaches onprogress, whoever wrote them in order.
const wire = [];
{
  const deliver = transport.onmessage;
  transport.onmessage = (m, extra) => { wire.push(m); deliver(m, extra); };
}
// A state-changing tool, one key: acts once.
{
  const r1 = await call(client, "toggle-simulated-logging", {}, { key: "tog-1" });
  const r2 = await call(client, "toggle-simulated-logging", {}, { key: "tog-1" });
  check("toggle: started", /^Started/.test(text(r1.result)), text(r1.result));
  check("toggle: the retry is a replay", replayed(r2.result));
  eq("toggle: same result", r1.result, unmarked(r2.result));
  await sleep(300);
  check("toggle: logging messages pass through", logs >= 1, logs);
  // The server's state: toggled once, so a new toggle stops it.
  const r3 = await call(client, "toggle-simulated-logging", {}, { key: "tog-2" });
  check("toggle: acted once (the next toggle stops)",
    /^Stopped/.test(text(r3.result)), text(r3.result));
}

// Progress notifications during a keyed call.
{
  const progress = [];
  const args = { duration: 0.4, steps: 4 };
  const from = wire.length;
  const r1 = await call(client, "trigger-long-running-operation", args,
    { key: "long-1", onprogress: (p) => progress.push(p.progress) });
  eq("progress: every step passed through", [1, 2, 3, 4], wire.slice(from)
    .filter((m) => m.method === "notifications/progress")
    .map((m) => m.params.progress));
  check("progress: the client's handler saw them as they came",
    progress.length >= 3 && progress.every((v, i) => v === i + 1), progress);
  check("progress: result", /completed/.test(text(r1.result)), text(r1.result));
  const again = [];
  const r2 = await call(client, "trigger-long-running-operation", args,
    { key: "long-1", onprogress: (p) => again.push(p.progress) });
  check("progress: replay", replayed(r2.result));
  eq("progress: a replay sends none", [], again);
  eq("progress: same result", r1.result, unmarked(r2.result));
}

// A sampling request from the server during a keyed call.
{
  const r1 = await call(client, "trigger-sampling-request",
    { prompt: "hello", maxTokens: 5 }, { key: "samp-1" });
  eq("sampling: the client was asked once", 1, samples);
  check("sampling: its answer is in the result",
    /sampled 1: .*hello/.test(text(r1.result)), text(r1.result));
  const r2 = await call(client, "trigger-sampling-request",
    { prompt: "hello", maxTokens: 5 }, { key: "samp-1" });
  eq("sampling: a replay does not ask again", 1, samples);
  eq("sampling: same result", r1.result, unmarked(r2.result));
  // An unkeyed call asks again.
  await call(client, "trigger-sampling-request", { prompt: "x", maxTokens: 5 });
  eq("sampling: unkeyed asks", 2, samples);
}
await client.close();

// A long-running call cancelled by the client (as the SDK does at its
// request timeout): not cancelled at the server, whose answer is recorded.
// A retry sent at once waits for that answer and gets it; the server works
// once. In both --on-unknown modes: the server is alive, nothing is
// unknown.
async function cancelled(mode, key) {
  const { client: c } = await everything(["--store", store,
    "--lease", "1s", "--on-unknown", mode]);
  const args = { duration: 1.5, steps: 3 };
  const ac = new AbortController();
  const pending = call(c, "trigger-long-running-operation", args,
    { key, signal: ac.signal, onprogress: () => {} });
  await sleep(150);
  ac.abort();
  const r1 = await pending;
  check(`${mode}: the client saw its cancellation`, r1.error !== undefined);
  const again = [];
  const r2 = await call(c, "trigger-long-running-operation", args,
    { key, onprogress: (p) => again.push(p.progress) });
  check(`${mode}: the retry got the cancelled call's result`,
    /completed/.test(text(r2.result)) && replayed(r2.result), JSON.stringify(r2));
  eq(`${mode}: the retry made the server work no more`, [], again);
  eq(`${mode}: key completed`, "completed", record(store,
    "trigger-long-running-operation", key)?.state);
  const r3 = await call(c, "trigger-long-running-operation", args, { key });
  eq(`${mode}: then replays the same result`, unmarked(r2.result), unmarked(r3.result));
  await c.close();
}
await cancelled("forward", "cancel-f-1");
await cancelled("fail", "cancel-x-1");
check("stderr has no unexpected warning", !/warning/i.test(stderr()), stderr());
finish();
