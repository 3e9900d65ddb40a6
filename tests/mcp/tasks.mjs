// tasks.mjs -- keyed task-augmented tools/call through `idem mcp`.
//
// A task-augmented call is answered at once with a task handle, and the
// tool acts later, when the task completes:
//   2025-11-25  the client asks with params.task {ttl}; the answer is a
//               CreateTaskResult {"task":{"taskId",...,"ttl"}}.
//   2026-07-28  the io.modelcontextprotocol/tasks extension, declared in the
//               request's _meta clientCapabilities; the answer is
//               {"resultType":"task","taskId",...,"ttlMs"}.
// The proxy stores the handle as the call's result. While the task lives in
// the proxy's current server process and within its ttl, a retry with the
// key gets the same handle (replayed) and no second task is made. A handle
// of a task that server process did not make (the proxy and its server were
// restarted) or past its ttl is stale: the task's outcome is unknown, and
// the retry is settled per --on-unknown (forward: a new task, its handle
// marked idem/recovered; fail: -31903 naming `idem keys delete`). A retry
// that asks no task, for a key whose result is a task handle, is refused
// (-32602, data.idem "task_expected").
//
// The server is era_server.mjs (`job {ms}`: a task in both forms, one line
// per completed job in $EFFECTS with its task id), driven by JSON-RPC lines
// written here, behind a tap (a small script written to TMP) that logs
// every line the proxy sent the server: "nothing reached the server" is
// read there. Each scenario counts the effect lines AND compares the task
// ids in them with the handles the calls returned. The last scenario is
// the 1.x SDK client's task API on server-everything's
// simulate-research-query.
import { spawn } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { CreateTaskResultSchema, ListTasksResultSchema }
  from "@modelcontextprotocol/sdk/types.js";
import { HERE, IDEM, SERVERS, TMP, check, connect, eq, finish, idem,
  rawAnswer, sleep, watchStderr } from "./lib.mjs";

const SERVER = join(HERE, "era_server.mjs");
const TASKS_EXT = "io.modelcontextprotocol/tasks";
const REPLAYED = "idem/replayed";
const RECOVERED = "idem/recovered";
const J = JSON.stringify;

// The tap: `node tap.mjs LOG CMD ARG...` runs CMD, copies its standard
// input to CMD and every line of it to LOG; CMD's output is its own.
const TAP = join(TMP, "tap.mjs");
writeFileSync(TAP, `
import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";
const [log, cmd, ...args] = process.argv.slice(2);
const c = spawn(cmd, args, { stdio: ["pipe", "inherit", "inherit"] });
c.stdin.on("error", () => {});
let buf = "";
process.stdin.on("data", (d) => {
  buf += d;
  let i;
  while ((i = buf.indexOf("\\n")) >= 0) {
    appendFileSync(log, buf.slice(0, i + 1));
    buf = buf.slice(i + 1);
  }
  c.stdin.write(d);
});
process.stdin.on("end", () => c.stdin.end());
for (const s of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(s, () => c.kill(s));
c.on("exit", (code) => process.exit(code ?? 1));
`);

// The 2026 per-request envelope; tasks: whether it declares the extension.
const envelope = (tasks) => ({
  "io.modelcontextprotocol/protocolVersion": "2026-07-28",
  "io.modelcontextprotocol/clientInfo": { name: "idem-tasks-test", version: "1.0.0" },
  "io.modelcontextprotocol/clientCapabilities":
    tasks ? { extensions: { [TASKS_EXT]: {} } } : {},
});

// Polls cond() every 20 ms for up to ms; one check either way.
async function until(cond, what, detail, ms = 15000) {
  const end = Date.now() + ms;
  while (!cond() && Date.now() < end) await sleep(20);
  const ok = !!cond();
  check(`waited for ${what}`, ok, ok ? undefined : detail());
  return ok;
}

// The job effect lines in file.
function effects(file) {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8").split("\n").filter(Boolean)
    .map((l) => JSON.parse(l)).filter((e) => e.tool === "job");
}

let sessions = 0;
/*
 * `idem mcp --store STORE OPTS -- node tap.mjs LOG node era_server.mjs`,
 * opened in era "legacy" (initialize) or "modern" (no initialize: the first
 * request carries the envelope). Effect lines go to the file effects.
 */
async function start(era, store, effects, opts = []) {
  const n = ++sessions;
  const tapLog = join(TMP, `tap-${n}.log`);
  const p = spawn(IDEM, ["mcp", "--store", store, ...opts, "--", "node", TAP,
    tapLog, "node", SERVER], { env: { ...process.env, EFFECTS: effects } });
  const got = [];
  let buf = "";
  let err = "";
  p.stdout.on("data", (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      got.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  });
  p.stderr.on("data", (d) => { err += d; });
  watchStderr(() => err);
  const exited = new Promise((r) => p.on("exit", (code, signal) =>
    r({ code, signal })));
  const send = (m) => p.stdin.write(J({ jsonrpc: "2.0", ...m }) + "\n");
  let nextId = 1;
  // One request; its response ({result} or {error}), or null after ms.
  const request = async (method, params, ms = 15000) => {
    const id = nextId++;
    send({ id, method, params });
    const ok = await until(() => rawAnswer(got, id) !== undefined,
      `the answer to ${method} #${id} (session ${n})`,
      () => J({ got, stderr: err }), ms);
    return ok ? rawAnswer(got, id) : null;
  };
  // What reached the server: its lines, and its tools/call requests.
  const serverLines = () => existsSync(tapLog)
    ? readFileSync(tapLog, "utf8").split("\n").filter(Boolean).map((l) => {
      try { return JSON.parse(l); } catch { return l; }
    }) : [];
  const serverCalls = () => serverLines().filter((m) => m?.method === "tools/call");

  if (era === "legacy") {
    const init = await request("initialize", { protocolVersion: "2025-11-25",
      capabilities: {}, clientInfo: { name: "idem-tasks-test", version: "1.0.0" } });
    check(`session ${n}: initialized`, init?.result?.protocolVersion === "2025-11-25",
      J(init));
    send({ method: "notifications/initialized" });
  } else {
    const list = await request("tools/list", { _meta: envelope(true) });
    check(`session ${n}: tools/list (2026)`,
      list?.result?.tools?.some((t) => t.name === "job") === true, J(list));
  }

  return {
    era, n, got, stderr: () => err, serverCalls,
    /*
     * A keyed job call: asking for a task (task true: params.task {ttl} in
     * 2025, the extension declared in 2026) or not.
     */
    job: (key, ms, { task = true, ttl = 60000 } = {}) => {
      const params = { name: "job", arguments: { ms } };
      if (era === "legacy") {
        params._meta = { idempotencyKey: key };
        if (task) params.task = { ttl };
      } else {
        params._meta = { ...envelope(task), idempotencyKey: key };
      }
      return request("tools/call", params);
    },
    // A round trip that reaches the server and back (an unkeyed request
    // sent after a refused call: the server has read the lines before it).
    flush: async () => {
      const r = await request("tools/list",
        era === "legacy" ? {} : { _meta: envelope(true) });
      check(`session ${n}: tools/list answered`, Array.isArray(r?.result?.tools),
        J(r));
    },
    // Polls tasks/get until the task is terminal; returns the tool's result
    // (tasks/result in 2025, inlined in tasks/get in 2026) or null.
    done: async (taskId, ms = 15000) => {
      const params = era === "legacy" ? { taskId }
        : { taskId, _meta: envelope(true) };
      const end = Date.now() + ms;
      let t = null;
      while (Date.now() < end) {
        t = await request("tasks/get", params);
        if (!t?.result || ["completed", "failed", "cancelled"]
          .includes(t.result.status)) break;
        await sleep(50);
      }
      check(`session ${n}: task ${taskId} completed`,
        t?.result?.status === "completed", J(t));
      if (t?.result?.status !== "completed") return null;
      if (era === "modern") return t.result.result ?? null;
      const r = await request("tasks/result", params);
      check(`session ${n}: tasks/result of ${taskId}`, r?.result !== undefined,
        J(r));
      return r?.result ?? null;
    },
    // Closes the proxy's standard input and waits for it to exit.
    close: async () => {
      p.stdin.end();
      return exited;
    },
  };
}

// The task id of a tools/call answer ({result} or {error}), era by era.
function taskIdOf(era, answer) {
  const r = answer?.result;
  if (era === "legacy") return r?.task?.taskId;
  return r?.resultType === "task" ? r.taskId : undefined;
}
const isId = (id) => typeof id === "string" && id.length > 0;
const mark = (answer, m) => answer?.result?._meta?.[m] === true;
// The result without the marks named.
function without(result, ...marks) {
  const r = structuredClone(result);
  if (r?._meta) {
    for (const m of marks) delete r._meta[m];
    if (Object.keys(r._meta).length === 0) delete r._meta;
  }
  return r;
}
// The ttl a handle carries (ttl in 2025, ttlMs in 2026).
const ttlOf = (era, answer) => era === "legacy"
  ? answer?.result?.task?.ttl : answer?.result?.ttlMs;
// The id the completed job returned (its effect line's id).
const jobIdOf = (result) => result?.structuredContent?.id;

// A first keyed call: a task handle, unmarked.
function firstHandle(what, era, a) {
  const id = taskIdOf(era, a);
  check(`${what}: the call answers a task handle`, isId(id), J(a));
  check(`${what}: first answer not marked replayed`, !mark(a, REPLAYED), J(a));
  check(`${what}: first answer not marked recovered`, !mark(a, RECOVERED), J(a));
  check(`${what}: the handle carries its ttl`, Number.isInteger(ttlOf(era, a)), J(a));
  return id;
}

// The effects, checked against the task ids expected, in order.
function effectsAre(what, file, taskIds, jobIds = []) {
  const e = effects(file);
  eq(`${what}: ${taskIds.length} job effect(s)`, taskIds.length, e.length);
  eq(`${what}: the effects' task ids are the handles returned`, taskIds,
    e.map((x) => x.task));
  jobIds.forEach((id, i) => {
    if (id !== undefined)
      eq(`${what}: effect ${i + 1} is the job the task returned`, id, e[i]?.id);
  });
  return e;
}

// (1) One process: a keyed task, retried while it runs and after it
// completed: the same handle each time, one task, one effect.
async function sameProcess(era, key) {
  const what = `${era} ${key}`;
  const store = join(TMP, `${key}.db`);
  const fx = join(TMP, `${key}.effects`);
  const s = await start(era, store, fx);

  const a1 = await s.job(key, 400);
  const A = firstHandle(what, era, a1);
  const a2 = await s.job(key, 400);
  eq(`${what}: retry while it runs: the same task id`, A, taskIdOf(era, a2));
  check(`${what}: retry while it runs: marked idem/replayed`, mark(a2, REPLAYED),
    J(a2));
  check(`${what}: retry while it runs: not marked recovered`,
    !mark(a2, RECOVERED), J(a2));
  check(`${what}: retry while it runs: the first handle, byte for byte`,
    a1?.result !== undefined && isDeepStrictEqual(a1.result,
      without(a2?.result, REPLAYED)), J({ a1, a2 }));
  eq(`${what}: one tools/call reached the server`, 1, s.serverCalls().length);

  const r = await s.done(A);
  effectsAre(`${what}: completed`, fx, [A], [jobIdOf(r)]);

  const a3 = await s.job(key, 400);
  eq(`${what}: retry after completion: the same task id`, A, taskIdOf(era, a3));
  check(`${what}: retry after completion: marked idem/replayed`,
    mark(a3, REPLAYED), J(a3));
  eq(`${what}: retry after completion: still one tools/call at the server`, 1,
    s.serverCalls().length);
  effectsAre(`${what}: retry after completion`, fx, [A]);
  eq(`${what}: proxy exits 0`, { code: 0, signal: null }, await s.close());
}

// A first process: a keyed task that completes; returns its task id.
async function firstLife(what, era, store, fx, key, opts) {
  const s = await start(era, store, fx, opts);
  const a = await s.job(key, 200);
  const A = firstHandle(`${what}, first process`, era, a);
  const r = await s.done(A);
  effectsAre(`${what}, first process`, fx, [A], [jobIdOf(r)]);
  eq(`${what}, first process: proxy exits 0`, { code: 0, signal: null },
    await s.close());
  return { A, firstPid: effects(fx)[0]?.pid };
}

// (2) Restart, --on-unknown forward: the stored handle names a task the new
// server process never made. The retry is sent again: a new task, marked
// recovered; a later retry replays the new handle with both marks.
async function restartForward(era, key) {
  const what = `${era} ${key}`;
  const store = join(TMP, `${key}.db`);
  const fx = join(TMP, `${key}.effects`);
  const { A, firstPid } = await firstLife(what, era, store, fx, key, []);

  const s = await start(era, store, fx);
  const b1 = await s.job(key, 200);
  const B = taskIdOf(era, b1);
  check(`${what}, restarted: the retry answers a task handle`, isId(B), J(b1));
  check(`${what}, restarted: a new task id, not the stale one`, B !== A,
    J({ A, b1 }));
  check(`${what}, restarted: marked idem/recovered`, mark(b1, RECOVERED), J(b1));
  check(`${what}, restarted: not marked replayed`, !mark(b1, REPLAYED), J(b1));
  eq(`${what}, restarted: the call reached the new server once`, 1,
    s.serverCalls().length);
  const r = await s.done(B);
  const e = effectsAre(`${what}, restarted, completed`, fx, [A, B],
    [undefined, jobIdOf(r)]);
  check(`${what}, restarted: the second effect is the new server process's`,
    e[1] !== undefined && e[1].pid !== firstPid, J(e));

  const b2 = await s.job(key, 200);
  eq(`${what}, restarted, retry: the new task id`, B, taskIdOf(era, b2));
  check(`${what}, restarted, retry: marked idem/replayed`, mark(b2, REPLAYED),
    J(b2));
  check(`${what}, restarted, retry: still marked idem/recovered`,
    mark(b2, RECOVERED), J(b2));
  check(`${what}, restarted, retry: the recovered handle, byte for byte`,
    b1?.result !== undefined && isDeepStrictEqual(b1.result,
      without(b2?.result, REPLAYED)), J({ b1, b2 }));
  eq(`${what}, restarted, retry: still one tools/call at the server`, 1,
    s.serverCalls().length);
  effectsAre(`${what}, restarted, retry`, fx, [A, B]);
  eq(`${what}, restarted: proxy exits 0`, { code: 0, signal: null },
    await s.close());
}

// (3) Restart, --on-unknown fail: -31903 naming `idem keys delete`, nothing
// sent. After the operator's `idem keys delete`, a retry is a first call.
async function restartFail(era, key) {
  const what = `${era} ${key}`;
  const store = join(TMP, `${key}.db`);
  const fx = join(TMP, `${key}.effects`);
  const fail = ["--on-unknown", "fail"];
  const { A } = await firstLife(what, era, store, fx, key, fail);

  const s = await start(era, store, fx, fail);
  for (const attempt of [1, 2]) {
    const w = `${what}, restarted, --on-unknown fail, retry ${attempt}`;
    const b = await s.job(key, 200);
    eq(`${w}: -31903`, -31903, b?.error?.code);
    eq(`${w}: data.idem`, "unknown", b?.error?.data?.idem);
    check(`${w}: the message names \`idem keys delete\``,
      /idem keys delete/.test(b?.error?.message ?? ""), J(b));
    check(`${w}: no task handle`, b?.result === undefined, J(b));
  }
  await s.flush();
  eq(`${what}, restarted, --on-unknown fail: no tools/call reached the server`,
    0, s.serverCalls().length);
  effectsAre(`${what}, restarted, --on-unknown fail`, fx, [A]);
  eq(`${what}, restarted, --on-unknown fail: proxy exits 0`,
    { code: 0, signal: null }, await s.close());
  effectsAre(`${what}, restarted, --on-unknown fail, after exit`, fx, [A]);

  // What the message says to do: delete the record; the next call acts.
  idem("keys", "delete", key, "--store", store, "--operation", "job");
  const s2 = await start(era, store, fx, fail);
  const c = await s2.job(key, 200);
  const C = firstHandle(`${what}, after idem keys delete`, era, c);
  check(`${what}, after idem keys delete: a new task`, C !== A, J({ A, c }));
  const r = await s2.done(C);
  effectsAre(`${what}, after idem keys delete`, fx, [A, C],
    [undefined, jobIdOf(r)]);
  await s2.close();
}

// (4) A retry that asks no task (2025: no params.task; 2026: the extension
// not declared) for a key whose result is a task handle: -32602
// task_expected, nothing sent; the key keeps its handle.
async function noTask(era, key) {
  const what = `${era} ${key}`;
  const store = join(TMP, `${key}.db`);
  const fx = join(TMP, `${key}.effects`);
  const s = await start(era, store, fx);
  const a1 = await s.job(key, 300);
  const A = firstHandle(what, era, a1);

  const n = await s.job(key, 300, { task: false });
  eq(`${what}, retry asking no task: -32602`, -32602, n?.error?.code);
  eq(`${what}, retry asking no task: data.idem`, "task_expected",
    n?.error?.data?.idem);
  check(`${what}, retry asking no task: no result`, n?.result === undefined, J(n));
  await s.flush();
  eq(`${what}, retry asking no task: only the first tools/call reached the server`,
    1, s.serverCalls().length);

  const a2 = await s.job(key, 300);
  eq(`${what}, then a retry asking a task: the same task id`, A,
    taskIdOf(era, a2));
  check(`${what}, then a retry asking a task: replayed`, mark(a2, REPLAYED),
    J(a2));
  const r = await s.done(A);
  const e = effectsAre(`${what}, completed`, fx, [A], [jobIdOf(r)]);
  check(`${what}: no job ran without a task`, e.every((x) => x.task !== null),
    J(e));
  eq(`${what}: still one tools/call at the server`, 1, s.serverCalls().length);
  eq(`${what}: proxy exits 0`, { code: 0, signal: null }, await s.close());
}

// (6) 2025, one process, the handle's ttl passes: stale, like a restart.
async function ttlPassed(key) {
  const era = "legacy";
  const what = `${era} ${key}`;
  const store = join(TMP, `${key}.db`);
  const fx = join(TMP, `${key}.effects`);
  const TTL = 4000;
  const s = await start(era, store, fx);
  const t0 = Date.now();
  const a1 = await s.job(key, 100, { ttl: TTL });
  const A = firstHandle(what, era, a1);
  eq(`${what}: the handle's ttl is the one asked`, TTL, ttlOf(era, a1));
  const r1 = await s.done(A);
  effectsAre(`${what}: completed`, fx, [A], [jobIdOf(r1)]);
  // Within the ttl: replayed (checked only while clearly within it).
  if (Date.now() - t0 < TTL - 1500) {
    const a2 = await s.job(key, 100, { ttl: TTL });
    eq(`${what}: retry within the ttl: the same task id`, A, taskIdOf(era, a2));
    check(`${what}: retry within the ttl: replayed`, mark(a2, REPLAYED), J(a2));
  } else console.log(`${what}: slow machine: the retry within the ttl not tried`);
  // Past the ttl, counted from the task's creation and from the answer.
  const created = Date.parse(a1?.result?.task?.createdAt ?? "") || t0;
  const past = Math.max(t0, created) + TTL + 300;
  while (Date.now() < past) await sleep(Math.min(100, past - Date.now()));
  const b1 = await s.job(key, 100, { ttl: TTL });
  const B = taskIdOf(era, b1);
  check(`${what}, past the ttl: a task handle`, isId(B), J(b1));
  check(`${what}, past the ttl: a new task id`, B !== A, J({ A, b1 }));
  check(`${what}, past the ttl: marked idem/recovered`, mark(b1, RECOVERED), J(b1));
  check(`${what}, past the ttl: not marked replayed`, !mark(b1, REPLAYED), J(b1));
  eq(`${what}, past the ttl: two tools/call reached the server`, 2,
    s.serverCalls().length);
  const t1 = Date.now();
  const r2 = await s.done(B);
  effectsAre(`${what}, past the ttl, completed`, fx, [A, B],
    [undefined, jobIdOf(r2)]);
  if (Date.now() - t1 < TTL - 1500) {
    const b2 = await s.job(key, 100, { ttl: TTL });
    eq(`${what}, past the ttl, retry: the new task id`, B, taskIdOf(era, b2));
    check(`${what}, past the ttl, retry: replayed and recovered`,
      mark(b2, REPLAYED) && mark(b2, RECOVERED), J(b2));
    eq(`${what}, past the ttl, retry: still two tools/call at the server`, 2,
      s.serverCalls().length);
  } else console.log(`${what}: slow machine: the retry of the new task not tried`);
  await s.close();
}

// (7) The 1.x SDK client's task API, server-everything's
// simulate-research-query (taskSupport "required"; ttl always 300000): a
// keyed task and its retry are one task at the server (tasks/list).
async function everything(key) {
  const what = `1.x client, server-everything ${key}`;
  const store = join(TMP, `${key}.db`);
  const { client } = await connect({ server: SERVERS.everything,
    proxy: ["--store", store] });
  const params = { name: "simulate-research-query",
    arguments: { topic: "idempotency" }, _meta: { idempotencyKey: key } };
  const create = async () => {
    try {
      return { result: await client.request({ method: "tools/call", params },
        CreateTaskResultSchema, { task: { ttl: 60000 } }) };
    } catch (e) {
      return { error: { code: e.code, message: e.message } };
    }
  };
  const listed = async () => (await client.request({ method: "tasks/list" },
    ListTasksResultSchema)).tasks.map((t) => t.taskId);
  const a1 = await create();
  const A = firstHandle(what, "legacy", a1);
  const a2 = await create();
  eq(`${what}: retry: the same task id`, A, taskIdOf("legacy", a2));
  check(`${what}: retry: marked idem/replayed`, mark(a2, REPLAYED), J(a2));
  eq(`${what}: one task at the server`, [A], await listed());

  // The SDK's own path: callToolStream with the key, after the first.
  let created;
  let result;
  for await (const m of client.experimental.tasks.callToolStream(params,
    undefined, { task: { ttl: 60000 }, timeout: 30000 })) {
    if (m.type === "taskCreated") created = m.task.taskId;
    if (m.type === "result") result = m.result;
    if (m.type === "error") check(`${what}: callToolStream`, false, String(m.error));
  }
  eq(`${what}: callToolStream retry: the same task id`, A, created);
  check(`${what}: callToolStream: the report`,
    /Research Report/.test(result?.content?.map((c) => c.text).join("") ?? ""),
    J(result));
  eq(`${what}: after completion: still one task at the server`, [A],
    await listed());
  await client.close();
}

for (const era of ["legacy", "modern"]) {
  const e = era === "legacy" ? "l" : "m";
  await sameProcess(era, `${e}-1`);
  await restartForward(era, `${e}-2`);
  await restartFail(era, `${e}-3`);
  await noTask(era, `${e}-4`);
}
await ttlPassed("l-6");
await everything("e-7");
finish();
