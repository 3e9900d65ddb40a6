#!/usr/bin/env node
// era_client.mjs -- how a 2.x SDK client (@modelcontextprotocol/client
// 2.4.0, with @modelcontextprotocol/ext-tasks for tasks) calls the two tools
// of era_server.mjs, in both protocol eras, printing every line on the wire.
//
//   node era_client.mjs [modern|legacy|both] [SERVER_CMD ARG...]
//
// The default server is `node era_server.mjs`. Give `idem mcp --store S --
// node era_server.mjs` to watch the proxy: the lines printed are the
// client's side of it.
//
// modern: versionNegotiation {mode: "auto"}. The client first runs
//   server/discover on a throwaway copy of the server (a process of its
//   own, killed once it has answered: p1), then talks 2026-07-28 to a
//   second one (p2): no initialize, the _meta envelope on every request,
//   capabilities from the discover result. deploy goes through
//   the SDK's own input_required driver (the elicitation handler below
//   answers, the client retries tools/call with inputResponses and
//   requestState under a new id); job goes through ext-tasks, which needs a
//   raw request path here because the SDK's client rejects resultType "task".
// legacy: the default negotiation (initialize, 2025-11-25). deploy: the
//   server's legacy shim sends a real elicitation/create request inside the
//   tools/call; job: ext-tasks asks for a task with params.task {ttl} and
//   polls tasks/get, then tasks/result.
//
// ext-tasks is installed as a dependency of the MCP Inspector.
//
// Every wire line is printed as `<process> C>S|S>C <json>`, in order. The
// server's effect lines go to $EFFECTS (a temporary file when unset) and
// are printed at the end.
import { spawn } from "node:child_process";
import { appendFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));

// ---- relay mode: a child between the client and the server that copies
// each line through and appends it to $ERA_WIRE_LOG (the SDK starts the
// probe process itself, with stderr ignored, so a file is the only way out).
if (process.argv[2] === "--relay") {
  const log = process.env.ERA_WIRE_LOG;
  const [cmd, ...args] = process.argv.slice(3);
  const child = spawn(cmd, args, { stdio: ["pipe", "pipe", "inherit"] });
  const copy = (from, to, dir) => {
    let buf = "";
    from.on("data", (chunk) => {
      to.write(chunk);
      buf += chunk.toString("utf8");
      for (let i; (i = buf.indexOf("\n")) >= 0; buf = buf.slice(i + 1))
        appendFileSync(log, `${process.pid} ${dir} ${buf.slice(0, i)}\n`);
    });
    from.on("end", () => { if (dir === "C>S") to.end(); });
  };
  copy(process.stdin, child.stdin, "C>S");
  copy(child.stdout, process.stdout, "S>C");
  for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => child.kill(sig));
  child.on("exit", (code, sig) => process.exit(code ?? (sig ? 128 : 1)));
} else {
  await main();
}

async function main() {
  const { Client } = await import("@modelcontextprotocol/client");
  const { StdioClientTransport } = await import("@modelcontextprotocol/client/stdio");
  const { createTaskSessionFromClient, resultFromTaskOutcome } =
    await import("@modelcontextprotocol/ext-tasks/client");

  const which = process.argv[2] ?? "both";
  const server = process.argv.length > 3
    ? process.argv.slice(3)
    : [process.execPath, join(HERE, "era_server.mjs")];
  const tmp = mkdtempSync(join(tmpdir(), "era-client."));
  process.on("exit", () => rmSync(tmp, { recursive: true, force: true }));
  const wireLog = join(tmp, "wire.log");
  const effects = process.env.EFFECTS ?? join(tmp, "effects");
  writeFileSync(wireLog, "");

  // Prints the wire lines logged since the last call, naming each process.
  const names = new Map();
  let printed = 0;
  const flush = (title) => {
    const lines = readFileSync(wireLog, "utf8").split("\n").filter(Boolean);
    if (lines.length === printed) return;
    console.log(`\n== ${title}`);
    for (const line of lines.slice(printed)) {
      const [pid, dir, ...rest] = line.split(" ");
      if (!names.has(pid)) names.set(pid, `p${names.size + 1}`);
      console.log(`${names.get(pid)} ${dir} ${rest.join(" ")}`);
    }
    printed = lines.length;
  };

  async function session(era) {
    const clientInfo = { name: "era-client", version: "1.0.0" };
    const capabilities = { elicitation: { form: {} } };
    const client = new Client(clientInfo, {
      capabilities,
      ...(era === "modern" && { versionNegotiation: { mode: "auto" } }),
    });
    // Answers every elicitation (a 2025 server request, or a 2026
    // input_required entry the SDK's driver hands to this same handler).
    client.setRequestHandler("elicitation/create", async (request) => {
      console.log(`   (elicitation handler: "${request.params.message}" -> accept)`);
      return { action: "accept", content: { confirm: true } };
    });
    client.onerror = (e) => console.log(`   (client onerror: ${e.message})`);
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [fileURLToPath(import.meta.url), "--relay", ...server],
      env: { ...process.env, ERA_WIRE_LOG: wireLog, EFFECTS: effects },
      stderr: "inherit",
    });
    await client.connect(transport);
    flush(`${era}: connect (era ${client.getProtocolEra()}, ` +
      `protocol ${client.getNegotiatedProtocolVersion()})`);
    await client.listTools();
    flush(`${era}: tools/list`);

    // deploy: the SDK runs the rounds; the caller sees only the final result.
    const deployed = await client.callTool({
      name: "deploy",
      arguments: { env: "prod", tag: `v-${era}` },
      _meta: { idempotencyKey: `deploy-${era}-1` },
    });
    flush(`${era}: deploy`);
    console.log(`   result: ${JSON.stringify(deployed.structuredContent)}`);

    // job as a task, through ext-tasks.
    const taskOptions = { endpointId: `era-server-${era}` };
    if (client.getProtocolEra() === "modern") {
      taskOptions.rawDispatch = rawDispatcher(transport);
      taskOptions.v2RequestFraming = {
        protocolVersion: client.getNegotiatedProtocolVersion(),
        clientInfo,
        clientCapabilities: capabilities,
      };
    }
    const tasks = createTaskSessionFromClient(client, taskOptions);
    try {
      const execution = await tasks.callTool("job", { ms: 300 }, {
        task: { preference: "prefer", retentionMs: 60000 },
        metadata: { idempotencyKey: `job-${era}-1` },
      });
      const { outcome } = await execution.settle();
      const result = resultFromTaskOutcome(outcome);
      flush(`${era}: job as a task`);
      console.log(`   result: ${JSON.stringify(result.structuredContent)}`);
    } finally {
      await tasks.close();
    }
    await client.close();
    await new Promise((r) => setTimeout(r, 100));
    flush(`${era}: close`);
  }

  try {
    for (const era of which === "both" ? ["modern", "legacy"] : [which]) await session(era);
  } finally {
    flush("(wire lines not yet shown)");
  }
  console.log("\n== effects");
  try { process.stdout.write(readFileSync(effects, "utf8")); } catch { console.log("(none)"); }
}

// ext-tasks' raw request path for 2026-07-28 task traffic (its
// rawDispatch option): requests under string ids of our own, written to the
// transport directly; their answers are taken off the transport before the
// SDK's Protocol sees them.
function rawDispatcher(transport) {
  const pending = new Map();
  let next = 0;
  const sdkOnMessage = transport.onmessage;
  transport.onmessage = (message, extra) => {
    const settle = typeof message?.id === "string" && pending.get(message.id);
    if (settle && ("result" in message || "error" in message)) {
      pending.delete(message.id);
      settle(message);
      return;
    }
    sdkOnMessage?.(message, extra);
  };
  return (request, options) => new Promise((resolve, reject) => {
    const id = `tasks-${++next}`;
    const signal = options?.signal;
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => { pending.delete(id); reject(signal.reason); };
    signal?.addEventListener("abort", onAbort, { once: true });
    pending.set(id, (message) => {
      signal?.removeEventListener("abort", onAbort);
      resolve("error" in message
        ? { kind: "error", error: message.error }
        : { kind: "result", result: message.result });
    });
    transport.send({ jsonrpc: "2.0", id, ...request }).catch((e) => {
      pending.delete(id);
      reject(e);
    });
  });
}
