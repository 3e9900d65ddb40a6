// idem mcp with the SDKs' own clients (1.x and 2.x) and the MCP Inspector
// CLI in front of slow_server.mjs (1.x and 2.x servers), as an agent uses
// it: a slow tool, the client's own request timeout (which sends
// notifications/cancelled) and retries with the same key.
//
//   A  the agent loop: tool 2500 ms, client timeout 1000 ms, retries with
//      the same key until a result comes: one effect, one ticket
//   B  attach: a retry while the call runs gets its result when it comes
//   C  attach bound: --attach-wait 1s, then -31902 with retryAfterMs
//   D  conflict: the key with other arguments is -31901
//   E  tool errors: stored and replayed by default; --store-tool-errors no
//      frees the key
//   F  the proxy killed mid-call: a new proxy takes the key over after the
//      lease, its result marked idem/recovered
//   G  `idem mcp --store X node server.mjs`: no `--` needed
//   H  the Inspector CLI, which eats the first `--`
//
// Every scenario counts the tool's side effects (the lines slow_server.mjs
// logs) and checks the tickets returned against them, and prints a line
// with its figures.
import { Client as Client1 } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport as Transport1 }
  from "@modelcontextprotocol/sdk/client/stdio.js";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { HERE, IDEM, TMP, call as call1, check, eq, finish,
  replayed, sleep, text, unmarked, watchStderr } from "./lib.mjs";

const SLOW = join(HERE, "slow_server.mjs");
const INSPECTOR = join(HERE, "node_modules", "@modelcontextprotocol",
  "inspector", "clients", "launcher", "build", "index.js");
const CONFLICT = -31901;
const IN_FLIGHT = -31902;
const T = 15000; // the client's timeout where the scenario sets none
const now = () => performance.now();
const secs = (ms) => (ms / 1000).toFixed(2);
const recovered = (r) => r?._meta?.["idem/recovered"] === true;

// The side effects of one scenario's servers: done() the acts that
// happened, started() the acts that began (both lists of {pid, tag, n, id}).
let stores = 0;
const store = () => join(TMP, `s${++stores}.db`);
const jsonl = (f) => existsSync(f)
  ? readFileSync(f, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l))
  : [];
function effects(name) {
  const e = join(TMP, `${name}.effects`);
  const s = join(TMP, `${name}.starts`);
  return { env: { EFFECTS: e, EFFECTS_START: s }, done: () => jsonl(e),
    started: () => jsonl(s) };
}
const ticketOf = (e) => `ticket-${e.pid}-${e.n}`;
const failureOf = (e) => `failure-${e.pid}-${e.n}`;
// The ticket the first act made.
const made = (done) => (done.length ? ticketOf(done[0]) : "(no act)");

// Waits for cond (polled), at most ms; checks it when what is given.
async function waitFor(cond, what, ms = 10000) {
  const end = now() + ms;
  while (!cond() && now() < end) await sleep(20);
  if (what) check(what, !!cond());
  return !!cond();
}
// Every act that began has ended (or ms passed): the count is final.
const settled = (fx, ms = 6000) =>
  waitFor(() => fx.done().length >= fx.started().length, null, ms);

// The client gave up (its own timeout), as opposed to an answer.
const timedOut = (e) => e?.code === "REQUEST_TIMEOUT" || // 2.x SdkError
  (e?.code === -32001 && typeof e?.data?.timeout === "number" &&
   e?.data?.idem === undefined); // 1.x McpError(RequestTimeout)

class StartError extends Error {}
// Runs `idem mcp PROXY [--] node slow_server.mjs ARGS` through the SDK's
// stdio Transport and connects client to it; a proxy that does not start
// is a StartError that says what the proxy wrote.
async function start(client, Transport, { proxy, args = [], env = {},
  dash = true }) {
  const transport = new Transport({ command: IDEM,
    args: ["mcp", ...proxy, ...(dash ? ["--"] : []), "node", SLOW, ...args],
    env: { ...process.env, ...env }, stderr: "pipe" });
  let err = "";
  transport.stderr.on("data", (d) => { err += d; });
  watchStderr(() => err);
  try {
    await client.connect(transport);
  } catch (e) {
    throw new StartError(`idem mcp ${proxy.join(" ")}${dash ? " --" : ""} ` +
      `... did not start: ${e.message}; it said: ${err.trim()}`);
  }
  // The proxy's process, kept (the 1.x transport forgets it on exit).
  return { transport, proc: transport._process, stderr: () => err };
}
/*
 * A peer: an SDK client (open1: 1.x, open2: 2.x) on the proxy, with
 * call(name, args, {key, timeout}) -> {result} | {error}, close(), proc
 * (the proxy) and stderr().
 */
async function open1(o) {
  const client = new Client1({ name: "idem-test", version: "1.0.0" });
  const t = await start(client, Transport1, o);
  return { ...t, client, sdk: "1.x",
    call: (name, a, opts) => call1(client, name, a, { timeout: T, ...opts }),
    close: () => client.close() };
}
async function open2({ modern = false, ...o }) {
  const { Client } = await import("@modelcontextprotocol/client");
  const { StdioClientTransport } = await import("@modelcontextprotocol/client/stdio");
  // The 2.x client speaks the 2025 era (initialize) unless told otherwise;
  // pinned, it opens with server/discover and no initialize.
  const client = new Client({ name: "idem-test-2x", version: "1.0.0" },
    modern ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {});
  const t = await start(client, StdioClientTransport, o);
  return { ...t, client, sdk: "2.x", era: client.getProtocolEra(),
    call: async (name, a, { key = null, timeout = T } = {}) => {
      const params = { name, arguments: a };
      if (key !== null) params._meta = { idempotencyKey: key };
      try {
        return { result: await client.request({ method: "tools/call", params },
          { timeout }) };
      } catch (e) {
        return { error: { code: e.code, message: e.message, data: e.data } };
      }
    },
    close: () => client.close() };
}

// A scenario: its failures to start or run are failures, not crashes, and
// its peers are closed whatever happened.
async function scenario(name, body) {
  const peers = [];
  const t0 = now();
  try {
    await body(async (p) => { peers.push(p = await p); return p; });
  } catch (e) {
    check(`${name}: ran to its end`, false,
      e instanceof StartError ? e.message : e?.stack ?? String(e));
  }
  for (const p of peers) await p.close().catch(() => {});
  console.log(`${name}: done in ${secs(now() - t0)} s`);
}
const brief = (r) => JSON.stringify(r?.error ?? r?.result)?.slice(0, 300);

// ---------------------------------------------------------------------------
// A. The issue's measurement: the tool takes 2500 ms, the client times out
// after 1000 ms (the SDK sends notifications/cancelled) and the agent
// retries with the same key and arguments for up to 12 s, or until it gets
// a result. The proxy must not cancel the call at the server: the tool acts
// once, and every answer the agent gets holds that one ticket.
async function agent(peer, key, args, { timeout = 1000, budget = 12000 } = {}) {
  const t0 = now();
  const tries = [];
  while (now() - t0 < budget) {
    const r = await peer.call("act", args, { key, timeout });
    tries.push(r);
    if (r.result) return { got: r.result, tries, ms: now() - t0 };
    if (timedOut(r.error)) continue; // an agent retries at once
    const wait = r.error?.data?.retryAfterMs;
    await sleep(typeof wait === "number" ? Math.min(Math.max(wait, 50), 2000)
      : 250);
  }
  return { got: null, tries, ms: now() - t0 };
}
const scenarioA = (label, open, serverArgs, tag) =>
  scenario(`A ${label}`, async (use) => {
    const fx = effects(`A-${tag}`);
    const p = await use(open({ proxy: ["--store", store(), "--lease", "1s"],
      args: serverArgs, env: fx.env }));
    const key = `A-${tag}`;
    const args = { ms: 2500, tag };
    const run = await agent(p, key, args);
    const answers = [];
    if (run.got) {
      answers.push(run.got);
      // The agent asks twice more (as a second agent would): replays.
      for (let i = 0; i < 2; i++) {
        const r = await p.call("act", args, { key, timeout: 10000 });
        check(`A ${label}: a later retry is answered`, r.result, brief(r));
        if (r.result) answers.push(r.result);
      }
    }
    await settled(fx);
    const done = fx.done();
    const timeouts = run.tries.filter((r) => timedOut(r.error)).length;
    const others = run.tries.filter((r) => r.error && !timedOut(r.error));
    const ticket = text(run.got);
    console.log(`A ${label}${p.era ? ` (${p.era} era)` : ""}: ` +
      (run.got ? `result after ${secs(run.ms)} s` : `no result in ${secs(run.ms)} s`) +
      ` on attempt ${run.tries.length} (${timeouts} client timeouts, ` +
      `${others.length} proxy errors ${JSON.stringify(others.map((r) => r.error.code))}); ` +
      `${done.length} effects, ${fx.started().length} calls at the server`);
    check(`A ${label}: a result within 12 s`, run.got !== null,
      brief(run.tries.at(-1)));
    eq(`A ${label}: the tool acted once`, 1, done.length);
    eq(`A ${label}: the server got the call once`, 1, fx.started().length);
    eq(`A ${label}: the cancellations did not reach the tool`,
      done.map(() => false), done.map((e) => e.aborted));
    eq(`A ${label}: the server got the keyed call under a string id`,
      fx.started().map(() => "string"), fx.started().map((e) => typeof e.id));
    check(`A ${label}: the retries waited for the call (no error but the client's own timeouts)`,
      others.length === 0, `codes ${JSON.stringify(others.map((r) => r.error.code))}, ` +
      `the first: ${brief(others[0])}`);
    if (run.got) {
      eq(`A ${label}: the ticket is the one the tool made`, made(done), ticket);
      eq(`A ${label}: every answer holds the same ticket`,
        answers.map(() => ticket), answers.map(text));
      eq(`A ${label}: every answer is marked replayed (the first request got none)`,
        answers.map(() => true), answers.map(replayed));
      eq(`A ${label}: the answers are the same result`,
        answers.map(() => unmarked(run.got)), answers.map(unmarked));
      eq(`A ${label}: the structured content came through`,
        ticket, run.got.structuredContent?.ticket);
    }
  });

await scenarioA("client 1.x, server 1.x", open1, [], "c1s1");
await scenarioA("client 1.x, server 2.x", open1, ["--sdk", "2"], "c1s2");
await scenarioA("client 2.x, server 1.x", open2, [], "c2s1");
await scenarioA("client 2.x, server 2.x", open2, ["--sdk", "2"], "c2s2");
await scenarioA("client 2.x pinned to 2026-07-28, server 2.x",
  (o) => open2({ ...o, modern: true }), ["--sdk", "2"], "c2s2m");

// ---------------------------------------------------------------------------
// B. Attach: call 1 takes 2000 ms; 300 ms after it a retry (same key and
// arguments, a new request) is sent. It waits for call 1's result and gets
// it as soon as it comes, under its own id, marked replayed.
await scenario("B attach", async (use) => {
  const fx = effects("B");
  const p = await use(open1({ proxy: ["--store", store(), "--lease", "1s"],
    env: fx.env }));
  const key = "B-1";
  const args = { ms: 2000, tag: "b" };
  const t0 = now();
  let t1 = null;
  const first = p.call("act", args, { key }).then((r) => { t1 = now(); return r; });
  await waitFor(() => fx.started().length > 0, "B: the call reached the server");
  if (now() - t0 < 300) await sleep(300 - (now() - t0));
  const sent = now() - t0;
  const r2 = await p.call("act", args, { key });
  const t2 = now();
  const r1 = await first;
  await settled(fx);
  const done = fx.done();
  const late = t1 === null ? null : t2 - t1;
  console.log(`B attach: retry sent ${Math.round(sent)} ms after call 1, ` +
    `answered ${late === null ? "?" : Math.round(late)} ms after call 1's answer ` +
    `(${secs(t2 - t0)} s after call 1 was sent); ${done.length} effects`);
  check("B: call 1 got its result", r1.result, brief(r1));
  check("B: the retry got a result", r2.result, brief(r2));
  check("B: the retry was answered with call 1's answer (< 500 ms apart)",
    late !== null && Math.abs(late) < 500, `${late} ms`);
  check("B: the retry waited for the call (not answered before 1.5 s)",
    t2 - t0 > 1500, `${Math.round(t2 - t0)} ms`);
  eq("B: the tool acted once", 1, done.length);
  eq("B: the same ticket, the one the tool made",
    [made(done), made(done)], [text(r1.result), text(r2.result)]);
  eq("B: call 1 unmarked, the retry marked replayed", [false, true],
    [replayed(r1.result), replayed(r2.result)]);
  if (r1.result && r2.result)
    eq("B: the retry's result is call 1's", r1.result, unmarked(r2.result));
});

// ---------------------------------------------------------------------------
// C. The attach is bounded: with --attach-wait 1s and a tool of 4000 ms the
// retry gets -31902 (in progress) with retryAfterMs after about 1 s; once
// the tool is done a further retry gets the result.
await scenario("C attach bound", async (use) => {
  const fx = effects("C");
  const p = await use(open1({ proxy: ["--store", store(), "--lease", "1s",
    "--attach-wait", "1s"], env: fx.env }));
  const key = "C-1";
  const args = { ms: 4000, tag: "c" };
  const first = p.call("act", args, { key });
  await waitFor(() => fx.started().length > 0, "C: the call reached the server");
  const t0 = now();
  const r2 = await p.call("act", args, { key, timeout: 10000 });
  const waited = now() - t0;
  const r1 = await first;
  const r3 = await p.call("act", args, { key, timeout: 10000 });
  await settled(fx);
  const done = fx.done();
  console.log(`C attach bound: the retry was answered ${Math.round(waited)} ms ` +
    `after it was sent (attach-wait 1 s): ${r2.error ? `error ${r2.error.code}, ` +
    `retryAfterMs ${r2.error.data?.retryAfterMs}` : "a result"}; ${done.length} effects`);
  eq("C: the retry is refused as in progress", IN_FLIGHT, r2.error?.code);
  eq("C: data.type", "idempotency_key_in_progress", r2.error?.data?.type);
  eq("C: data.idem", "in_flight", r2.error?.data?.idem);
  eq("C: data.retryAfterMs is a number", "number",
    typeof r2.error?.data?.retryAfterMs);
  eq("C: data.key and data.tool", [key, "act"],
    [r2.error?.data?.key, r2.error?.data?.tool]);
  check("C: the retry waited about --attach-wait (0.8 s to 3 s)",
    waited >= 800 && waited < 3000, `${Math.round(waited)} ms`);
  check("C: call 1 got its result", r1.result && !replayed(r1.result), brief(r1));
  check("C: the retry after the tool finished is a replay",
    r3.result && replayed(r3.result), brief(r3));
  eq("C: the tool acted once", 1, done.length);
  eq("C: the same ticket, the one the tool made",
    [made(done), made(done)], [text(r1.result), text(r3.result)]);
});

// ---------------------------------------------------------------------------
// D. Conflict: the key of a completed call with other arguments.
await scenario("D conflict", async (use) => {
  const fx = effects("D");
  const p = await use(open1({ proxy: ["--store", store()], env: fx.env }));
  const key = "D-1";
  const r1 = await p.call("act", { ms: 10, tag: "d1" }, { key });
  const r2 = await p.call("act", { ms: 10, tag: "d2" }, { key });
  const r3 = await p.call("act", { ms: 10, tag: "d1" }, { key });
  await settled(fx);
  const done = fx.done();
  console.log(`D conflict: ${r2.error ? `error ${r2.error.code} ${r2.error.data?.type}` :
    "a result"}; ${done.length} effects`);
  check("D: the first call acts", r1.result && !replayed(r1.result), brief(r1));
  eq("D: other arguments are a conflict", CONFLICT, r2.error?.code);
  eq("D: data.type", "idempotency_key_conflict", r2.error?.data?.type);
  eq("D: data.idem, key and tool", ["conflict", key, "act"],
    [r2.error?.data?.idem, r2.error?.data?.key, r2.error?.data?.tool]);
  check("D: the original arguments still replay", replayed(r3.result), brief(r3));
  eq("D: the tool acted once, for the first call", ["d1"], done.map((e) => e.tag));
  eq("D: the tickets are the one the tool made",
    [made(done), made(done)], [text(r1.result), text(r3.result)]);
});

// ---------------------------------------------------------------------------
// E. A tool error (isError: true) is a result: stored and replayed by
// default. With --store-tool-errors no it is passed on and the key freed:
// a retry acts again, and a corrected call may reuse the key.
await scenario("E tool errors stored", async (use) => {
  const fx = effects("E-yes");
  const p = await use(open1({ proxy: ["--store", store()], env: fx.env }));
  const key = "E-1";
  const r1 = await p.call("fail", { tag: "e" }, { key });
  const r2 = await p.call("fail", { tag: "e" }, { key });
  const done = fx.done();
  console.log(`E default: ${done.length} effects; retry ` +
    `${replayed(r2.result) ? "replayed" : "not replayed"}`);
  eq("E default: both answers are tool errors", [true, true],
    [r1.result?.isError, r2.result?.isError]);
  eq("E default: the tool acted once", 1, done.length);
  const failure = done.length ? failureOf(done[0]) : "(no act)";
  eq("E default: the same failure, the one the tool made",
    [failure, failure], [text(r1.result), text(r2.result)]);
  eq("E default: the first unmarked, the retry replayed", [false, true],
    [replayed(r1.result), replayed(r2.result)]);
});
await scenario("E --store-tool-errors no", async (use) => {
  const fx = effects("E-no");
  const p = await use(open1({ proxy: ["--store", store(), "--store-tool-errors",
    "no"], env: fx.env }));
  const key = "E-2";
  const r1 = await p.call("fail", { tag: "e" }, { key });
  const r2 = await p.call("fail", { tag: "e" }, { key });
  const r3 = await p.call("fail", { tag: "e-corrected" }, { key });
  const done = fx.done();
  console.log(`E --store-tool-errors no: ${done.length} effects; retry ` +
    `${replayed(r2.result) ? "replayed" : "not replayed"}`);
  eq("E no: the answers are tool errors", [true, true, true],
    [r1.result?.isError, r2.result?.isError, r3.result?.isError]);
  eq("E no: the retry and the corrected call act again", ["e", "e", "e-corrected"],
    done.map((e) => e.tag));
  eq("E no: each answer is its own failure", done.map(failureOf),
    [r1, r2, r3].map((r) => text(r.result)));
  eq("E no: none is marked replayed", [false, false, false],
    [r1, r2, r3].map((r) => replayed(r.result)));
});

// ---------------------------------------------------------------------------
// F. The proxy is killed (SIGKILL) while the tool works. A new proxy on the
// same store takes the key over once the dead one's lease (1 s) has run out
// and sends the call again; the result says so (idem/recovered), and so do
// its replays. The first server may or may not have acted (the kernel sends
// it SIGTERM when its proxy dies): 1 or 2 effects, and the ticket returned
// is one the tool made.
await scenario("F kill -9 of the proxy", async (use) => {
  const fx = effects("F");
  const db = store();
  const key = "F-1";
  const args = { ms: 1500, tag: "f" };
  const p1 = await use(open1({ proxy: ["--store", db, "--lease", "1s"],
    env: fx.env }));
  const lost = p1.call("act", args, { key });
  await waitFor(() => fx.started().length > 0, "F: the call reached the first server");
  const killed = now();
  p1.proc.kill("SIGKILL");
  const r0 = await lost;
  check("F: the first client lost its call", r0.error, brief(r0));
  const p2 = await use(open1({ proxy: ["--store", db, "--lease", "1s"],
    env: fx.env }));
  const tries = [];
  let got = null;
  while (!got && now() - killed < 15000) {
    const r = await p2.call("act", args, { key, timeout: 15000 });
    tries.push(r);
    if (r.result) got = r.result;
    else await sleep(Math.min(Math.max(r.error?.data?.retryAfterMs ?? 250, 50), 2000));
  }
  const ms = now() - killed;
  const r2 = got ? await p2.call("act", args, { key }) : null;
  await settled(fx, 3000);
  const done = fx.done();
  const ticket = text(got);
  console.log(`F kill -9: ${got ? "result" : "no result"} ${secs(ms)} s after the kill, attempt ` +
    `${tries.length} (errors ${JSON.stringify(tries.filter((r) => r.error).map((r) => r.error.code))}); ` +
    `${done.length} effects (${fx.started().length} started)`);
  check("F: the retry through the new proxy gets a result", got, brief(tries.at(-1)));
  check("F: the result is marked idem/recovered", recovered(got), JSON.stringify(got?._meta));
  check("F: the recovered result is the first answer (not replayed)",
    got && !replayed(got), JSON.stringify(got?._meta));
  check("F: a replay is marked idem/recovered and idem/replayed",
    recovered(r2?.result) && replayed(r2?.result), brief(r2));
  eq("F: the replay holds the same ticket", ticket, text(r2?.result));
  check("F: the ticket is one the tool made",
    ticket !== null && done.map(ticketOf).includes(ticket),
    JSON.stringify({ ticket, done }));
  check("F: 1 or 2 effects", done.length >= 1 && done.length <= 2, done.length);
  eq("F: the second server acted once",
    1, done.filter((e) => ticket && ticket.startsWith(`ticket-${e.pid}-`)).length);
});

// ---------------------------------------------------------------------------
// G. A launcher that does not write `--`: the first argument that is not an
// option starts the server command, and the options after it are the
// server's.
await scenario("G no --", async (use) => {
  const fx = effects("G");
  const peer = await use(open1({ proxy: ["--store", store()], dash: false,
    args: ["--sdk", "2"], env: fx.env }));
  const tools = (await peer.client.listTools()).tools.map((t) => t.name);
  const r1 = await peer.call("act", { ms: 10, tag: "g" }, { key: "G-1" });
  const r2 = await peer.call("act", { ms: 10, tag: "g" }, { key: "G-1" });
  const done = fx.done();
  console.log(`G no --: tools ${JSON.stringify(tools)}; ${done.length} effects`);
  check("G: tools/list lists act", tools.includes("act"), JSON.stringify(tools));
  eq("G: the server got its own arguments (--sdk 2)", "idem-slow-server-sdk2",
    peer.client.getServerVersion()?.name);
  check("G: the proxy announces keys", peer.client.getServerCapabilities()
    ?.experimental?.["idem/idempotency"] !== undefined);
  eq("G: the tool acted once", 1, done.length);
  eq("G: the same ticket, the one the tool made, replayed the second time",
    [made(done), made(done), false, true],
    [text(r1.result), text(r2.result), replayed(r1.result), replayed(r2.result)]);
});

// ---------------------------------------------------------------------------
// H. The MCP Inspector CLI (`inspector --cli COMMAND ARGS... --method M`)
// takes the first `--` of the command line for its own: what comes before
// it is the server's command when it does not start with an option, and
// the Inspector's options and the rest of the command come after it. So
// `inspector --cli idem mcp --store X -- node slow_server.mjs --method M`
// runs `idem mcp --store X node slow_server.mjs`. (Its -e must come after
// the `--` too: an option first makes everything after the `--` the
// command.) Its own files (HOME, the catalog) go to TMP.
function inspector(args) {
  return new Promise((resolve) => {
    const home = join(TMP, "inspector-home");
    mkdirSync(home, { recursive: true });
    const p = spawn(process.execPath, [INSPECTOR, "--cli", ...args], {
      env: { ...process.env, HOME: home,
        MCP_CATALOG_PATH: join(home, "mcp.json") } });
    let out = "";
    let err = "";
    p.stdout.on("data", (d) => { out += d; });
    p.stderr.on("data", (d) => { err += d; });
    const timer = setTimeout(() => p.kill("SIGKILL"), 60000);
    p.on("close", (code, signal) => {
      clearTimeout(timer);
      let json = null;
      try { json = JSON.parse(out); } catch { /* not JSON */ }
      resolve({ code, signal, out, err, json });
    });
  });
}
await scenario("H Inspector CLI", async () => {
  check("H: the Inspector CLI is installed", existsSync(INSPECTOR), INSPECTOR);
  const fx = effects("H");
  const db = store();
  const env = Object.entries(fx.env).flatMap(([k, v]) => ["-e", `${k}=${v}`]);
  const target = [IDEM, "mcp", "--store", db, "--", "node", SLOW];
  const t0 = now();
  const list = await inspector([...target, "--method", "tools/list"]);
  const listMs = now() - t0;
  const tools = list.json?.tools?.map((t) => t.name) ?? [];
  check("H: tools/list through idem mcp", list.code === 0 && tools.includes("act"),
    `exit ${list.code}: ${list.out.slice(0, 300)} ${list.err.slice(0, 300)}`);
  // --tool-metadata goes to params._meta: the key.
  const callArgs = [...target, "--method", "tools/call", "--tool-name", "act",
    "--tool-arg", "ms=10", "--tool-arg", "tag=x", "--tool-metadata",
    "idempotencyKey=H-1", ...env];
  const c1 = await inspector(callArgs);
  const c2 = await inspector(callArgs);
  const done = fx.done();
  console.log(`H Inspector CLI: tools/list exit ${list.code} in ${secs(listMs)} s, ` +
    `tools ${JSON.stringify(tools)}; tools/call exits ${c1.code}, ${c2.code}; ` +
    `${done.length} effects`);
  eq("H: both tools/call runs succeed", [0, 0], [c1.code, c2.code]);
  check("H: tools/call answered", c1.json?.content, `${c1.out.slice(0, 300)} ${c1.err.slice(0, 300)}`);
  eq("H: the keyed call acted once", 1, done.length);
  eq("H: the same ticket, the one the tool made, replayed the second time",
    [made(done), made(done), false, true],
    [text(c1.json), text(c2.json), replayed(c1.json), replayed(c2.json)]);
});

finish();
