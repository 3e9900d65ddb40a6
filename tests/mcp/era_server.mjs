#!/usr/bin/env node
// era_server.mjs -- a stdio MCP server built on the 2.x server SDK
// (@modelcontextprotocol/server 2.4.0) that serves both protocol eras
// (serveStdio: `initialize` opens a 2025-11-25 connection, a request with
// the per-request `_meta` envelope a 2026-07-28 one), with two tools whose
// calls are not a single request/response:
//
//   deploy {env, tag}  multi round-trip (MRTR). The first round answers
//       {"resultType":"input_required","inputRequests":{"confirm":
//        {"method":"elicitation/create",...}},"requestState":"..."};
//       the retry that carries inputResponses.confirm (accepted, confirm
//       true) appends one line to $EFFECTS and returns a fresh id. A
//       2025-era client gets the same through the SDK's legacy shim: a real
//       elicitation/create request to the client inside the one tools/call.
//       Declined or cancelled: an isError result, no effect.
//   job {ms}  a tool that may run as a task. Task-augmented it answers at
//       once with a task and completes after ms milliseconds, appending one
//       line to $EFFECTS then; otherwise it waits ms and answers.
//       2025-11-25: the client asks with params.task {ttl?} (the tool lists
//       execution.taskSupport "optional"); tasks/get, tasks/result,
//       tasks/list, tasks/cancel, notifications/tasks/status.
//       2026-07-28: the io.modelcontextprotocol/tasks extension; a task is
//       made whenever the request's clientCapabilities declare the
//       extension; {"resultType":"task",...}; tasks/get (result inlined),
//       tasks/update, tasks/cancel.
//
// The 2.x SDK has no task runtime (its 2025 task schemas are "wire
// vocabulary with no SDK runtime"), so the tasks are kept here, and a task
// answer to tools/call goes around the SDK's CallToolResult check in
// _wrapHandler, the hook the SDK keeps for subclasses.
//
// Effect lines: {"tool":"deploy","id":...,"env":...,"tag":...,"pid":...}
//               {"tool":"job","id":...,"ms":...,"task":taskId|null,"pid":...}
import { randomUUID } from "node:crypto";
import { appendFileSync } from "node:fs";
import {
  Server,
  MissingRequiredClientCapabilityError,
  ProtocolError,
  ProtocolErrorCode,
  inputRequired,
  inputResponse,
} from "@modelcontextprotocol/server";
import { serveStdio } from "@modelcontextprotocol/server/stdio";
import { z } from "zod";

const TASKS_EXT = "io.modelcontextprotocol/tasks";
const CLIENT_CAPS = "io.modelcontextprotocol/clientCapabilities";
const RELATED_TASK = "io.modelcontextprotocol/related-task";
const POLL_MS = 100;

function effect(line) {
  const file = process.env.EFFECTS;
  if (file) appendFileSync(file, JSON.stringify({ ...line, pid: process.pid }) + "\n");
}
const sleep = (ms, signal) =>
  new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); reject(signal.reason); }, { once: true });
  });
const invalid = (msg) => new ProtocolError(ProtocolErrorCode.InvalidParams, msg);

const TOOLS = [
  {
    name: "deploy",
    description: "Deploys tag to env after a confirmation (elicitation, input_required).",
    inputSchema: {
      type: "object",
      properties: { env: { type: "string" }, tag: { type: "string" } },
      required: ["env", "tag"],
    },
    annotations: { destructiveHint: true, idempotentHint: false },
  },
  {
    name: "job",
    description: "Runs for ms milliseconds; may run as a task.",
    inputSchema: {
      type: "object",
      properties: { ms: { type: "integer", minimum: 0 } },
      required: ["ms"],
    },
    annotations: { destructiveHint: false, idempotentHint: false },
    // 2025-11-25 per-tool negotiation; the 2026 encoder drops it.
    execution: { taskSupport: "optional" },
  },
];

function deployArgs(params) {
  const a = params?.arguments ?? {};
  if (typeof a.env !== "string" || typeof a.tag !== "string")
    throw invalid("deploy needs string arguments env and tag");
  return { env: a.env, tag: a.tag };
}
function jobArgs(params) {
  const ms = params?.arguments?.ms;
  if (!Number.isInteger(ms) || ms < 0) throw invalid("job needs an integer argument ms >= 0");
  return { ms };
}

// deploy: round 1 asks, the round carrying the answer acts.
async function deploy(request, ctx) {
  const { env, tag } = deployArgs(request.params);
  const state = Buffer.from(JSON.stringify({ env, tag })).toString("base64url");
  const answer = inputResponse(ctx.mcpReq.inputResponses, "confirm");
  if (answer.kind === "missing") {
    return inputRequired({
      inputRequests: {
        confirm: inputRequired.elicit({
          message: `Deploy ${tag} to ${env}?`,
          requestedSchema: {
            type: "object",
            properties: { confirm: { type: "boolean", title: "Confirm" } },
            required: ["confirm"],
          },
        }),
      },
      requestState: state,
    });
  }
  // The echo must be the one this server gave for these arguments.
  const echoed = ctx.mcpReq.requestState();
  if (echoed !== undefined && echoed !== state)
    throw invalid("requestState does not belong to these arguments");
  if (answer.kind !== "elicit" || answer.action !== "accept" || answer.content?.confirm !== true)
    return {
      content: [{ type: "text", text: `deploy of ${tag} to ${env} not confirmed` }],
      isError: true,
    };
  const id = randomUUID();
  effect({ tool: "deploy", id, env, tag });
  return {
    content: [{ type: "text", text: `deployed ${tag} to ${env}: ${id}` }],
    structuredContent: { id, env, tag },
  };
}

// ---- tasks (one store per process: one connection per stdio process) ----
const tasks = new Map();
const now = () => new Date().toISOString();

function taskView(t, era) {
  const base = {
    taskId: t.taskId,
    status: t.status,
    ...(t.statusMessage !== undefined && { statusMessage: t.statusMessage }),
    createdAt: t.createdAt,
    lastUpdatedAt: t.lastUpdatedAt,
  };
  if (era === "legacy") return { ...base, ttl: t.ttl, pollInterval: POLL_MS };
  return {
    ...base,
    ttlMs: t.ttl,
    pollIntervalMs: POLL_MS,
    // The inlined result is the 2026 CallToolResult, resultType included.
    ...(t.status === "completed" && { result: { resultType: "complete", ...t.result } }),
    ...(t.status === "failed" && { error: t.error }),
  };
}
function setStatus(t, status, statusMessage) {
  t.status = status;
  t.statusMessage = statusMessage;
  t.lastUpdatedAt = now();
  if (["completed", "failed", "cancelled"].includes(status)) {
    for (const w of t.waiters.splice(0)) w();
  }
  t.onStatus?.(t);
}
function startJobTask(ms, ttl, era, server) {
  const t = {
    taskId: randomUUID(),
    status: "working",
    statusMessage: `running for ${ms} ms`,
    createdAt: now(),
    ttl: ttl ?? null,
    era,
    waiters: [],
  };
  t.lastUpdatedAt = t.createdAt;
  if (era === "legacy")
    t.onStatus = (task) =>
      server.notification({ method: "notifications/tasks/status", params: taskView(task, "legacy") })
        .catch(() => {});
  tasks.set(t.taskId, t);
  t.timer = setTimeout(() => {
    if (t.status !== "working") return;
    const id = randomUUID();
    effect({ tool: "job", id, ms, task: t.taskId });
    t.result = {
      content: [{ type: "text", text: `job done after ${ms} ms: ${id}` }],
      structuredContent: { id, ms },
    };
    setStatus(t, "completed", "done");
  }, ms);
  t.timer.unref(); // stdin keeps a connected server alive; at EOF it exits
  return t;
}
function getTask(params) {
  const t = tasks.get(params?.taskId);
  if (!t) throw invalid(`Failed to retrieve task: Task not found`);
  return t;
}
function cancelTask(t) {
  if (["completed", "failed", "cancelled"].includes(t.status))
    throw invalid(`Cannot cancel task: already ${t.status}`);
  clearTimeout(t.timer);
  setStatus(t, "cancelled", "cancelled by the client");
}

// Does this tools/call ask for (2025) or allow (2026) a task?
// (The SDK lifts the 2026 envelope out of params._meta into ctx.mcpReq.envelope.)
function taskRequested(era, request, ctx) {
  if (era === "legacy") return request.params?.task !== undefined && request.params.task !== null;
  const caps = ctx.mcpReq.envelope?.[CLIENT_CAPS];
  return caps?.extensions?.[TASKS_EXT] !== undefined;
}

async function job(request, ctx) {
  const { ms } = jobArgs(request.params);
  await sleep(ms, ctx.mcpReq.signal);
  const id = randomUUID();
  effect({ tool: "job", id, ms, task: null });
  return {
    content: [{ type: "text", text: `job done after ${ms} ms: ${id}` }],
    structuredContent: { id, ms },
  };
}

class EraServer extends Server {
  constructor(era) {
    super(
      { name: "era-server", version: "1.0.0" },
      {
        capabilities:
          era === "legacy"
            ? { tools: {}, tasks: { list: {}, cancel: {}, requests: { tools: { call: {} } } } }
            : { tools: {}, extensions: { [TASKS_EXT]: {} } },
      },
    );
    this.era = era;
  }
  // A task answer to tools/call is not a CallToolResult: answer it here,
  // before the SDK's result check; everything else goes the SDK's way.
  _wrapHandler(method, handler) {
    const wrapped = super._wrapHandler(method, handler);
    if (method !== "tools/call") return wrapped;
    return async (request, ctx) => {
      if (request.params?.name !== "job" || !taskRequested(this.era, request, ctx))
        return wrapped(request, ctx);
      const { ms } = jobArgs(request.params);
      const ttl = this.era === "legacy" ? request.params.task.ttl : undefined;
      const t = startJobTask(ms, ttl ?? 60000, this.era, this);
      if (this.era === "legacy") return { task: taskView(t, "legacy") };
      return { resultType: "task", ...taskView(t, "modern") };
    };
  }
}

function build({ era }) {
  const server = new EraServer(era);
  server.setRequestHandler("tools/list", () => ({ tools: TOOLS }));
  server.setRequestHandler("tools/call", (request, ctx) => {
    switch (request.params.name) {
      case "deploy": return deploy(request, ctx);
      case "job": return job(request, ctx);
      default: throw invalid(`Unknown tool: ${request.params.name}`);
    }
  });
  if (era === "legacy") {
    server.setRequestHandler("tasks/get", (r) => taskView(getTask(r.params), "legacy"));
    server.setRequestHandler("tasks/list", () => ({
      tasks: [...tasks.values()].map((t) => taskView(t, "legacy")),
    }));
    server.setRequestHandler("tasks/cancel", (r) => {
      const t = getTask(r.params);
      cancelTask(t);
      return taskView(t, "legacy");
    });
    // Blocks until the task is terminal, then answers what tools/call would have.
    server.setRequestHandler("tasks/result", async (r) => {
      const t = getTask(r.params);
      if (!["completed", "failed", "cancelled"].includes(t.status))
        await new Promise((resolve) => t.waiters.push(resolve));
      const related = { [RELATED_TASK]: { taskId: t.taskId } };
      if (t.status === "completed") return { ...t.result, _meta: related };
      throw new ProtocolError(ProtocolErrorCode.InvalidParams, `Task ${t.taskId} was ${t.status}`, related);
    });
  } else {
    // The extension's methods: tasks/get and tasks/cancel are names the
    // 2025 core used, so the SDK takes them only with explicit schemas.
    // A client that does not declare the extension gets -32021.
    const byId = z.looseObject({ taskId: z.string() });
    const declared = (ctx) => {
      if (ctx.mcpReq.envelope?.[CLIENT_CAPS]?.extensions?.[TASKS_EXT] === undefined)
        throw new MissingRequiredClientCapabilityError({
          requiredCapabilities: { extensions: { [TASKS_EXT]: {} } },
        });
    };
    server.setRequestHandler("tasks/get", { params: byId }, (p, ctx) => {
      declared(ctx);
      return taskView(getTask(p), "modern");
    });
    server.setRequestHandler("tasks/cancel", { params: byId }, (p, ctx) => {
      declared(ctx);
      cancelTask(getTask(p));
      return {};
    });
    // (The SDK lifts params.inputResponses into ctx.mcpReq.inputResponses.)
    // job never asks for input: responses are acknowledged and ignored.
    server.setRequestHandler("tasks/update", { params: byId }, (p, ctx) => {
      declared(ctx);
      getTask(p);
      return {};
    });
  }
  return server;
}

serveStdio(build, {
  onerror: (e) => process.stderr.write(`era_server: ${e?.message ?? e}\n`),
});
