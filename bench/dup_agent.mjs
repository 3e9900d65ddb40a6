// dup_agent.mjs -- bench/duplicates.sh's agents, and its table.
//
//   node dup_agent.mjs cell --mode M --sdk 1|2 --transport stdio|http
//        [--stdio-cut reload|crash] --idem IDEM --work DIR
//        [--intentions N] [--agents K] [--slow-share X] [--slow "LO HI"]
//        [--fast "LO HI"] [--life "LO HI"] [--timeout MS] [--attempts N]
//        [--seed S] [--implicit-window DUR] [--idem-opts "..."]
//   node dup_agent.mjs table FILE     (the cells' JSON lines -> the table)
//
// cell: one mode (direct, keys, offer, implicit) for one client (the 1.x
// or 2.x SDK's own Client, over stdio or Streamable HTTP). It starts what
// the cell needs, waiting for each one's ready line, connects K agents
// (each starts with its client up, as a host has its servers up before the
// model calls a tool), runs them, each its share of N intentions one after
// the other, then stops everything (each process awaited), counts the
// tool's effects in the server's log and prints one JSON line. In DIR it
// leaves, per cell, the effects log, the store, the processes' standard
// error (.log) and each intention's attempts and effects (.intentions.jsonl).
//
// An intention is one create_ticket {intent_id, title, work_ms} the agent
// wants done once. Its arguments carry its own id (so no two intentions'
// calls are the same call, which --implicit-keys needs), and the same
// arguments go out on every attempt. A share of the intentions (--slow-share)
// are slow (work_ms drawn from --slow), the rest quick (--fast); the mix is
// drawn from --seed, the same for every mode of a client.
//
// The modes, what each attempt sends:
//   direct    no idem: the client talks to dup_server.mjs, no key
//   keys      through idem mcp, params._meta.idempotencyKey: a UUID made
//             once per intention, before its first attempt
//   offer     through idem mcp --offer-key-argument idempotency_key: the
//             agent lists the tools on every new client and, when
//             create_ticket's schema offers idempotency_key, passes the
//             intention's UUID in it, as a model told by the description
//             would (one new value per action, the same on its retries)
//   implicit  through idem mcp --implicit-keys WINDOW: no key at all
//
// How the connection dies (the cut), per transport:
//   http   the client reaches the server (direct) or idem mcp --listen
//          through dup_relay.mjs, which destroys each TCP connection
//          --life ms after it opened (uniform in the range): a call in
//          flight loses its answer. Neither SDK resumes a POST's stream
//          without event ids (the server keeps none; idem strips them from
//          keyed calls), so the call waits for the client's request
//          timeout; a POST cut before its answer began fails at once.
//   stdio  each client lives --life ms (drawn per client), then the agent
//          closes it with the SDK's own close(), as an editor reloading
//          its servers does: the child's standard input is closed, SIGTERM
//          follows 2 s later if it has not exited, SIGKILL 2 s after that
//          (both SDKs). A call in flight gets its answer if it comes before
//          the child exits, else the SDK's "connection closed" (or idem's
//          -31903, which it answers when SIGTERM ends its server).
//          --stdio-cut crash: the agent's host dies instead: the child's
//          standard input is closed and its output no longer read, no
//          signal is sent, and the call in flight is given up at once (the
//          next host retries it).
//
// How the agent retries (what an agent on the SDK does, bounded):
//   - a result: done (isError: the agent is told it failed);
//   - the request timed out (--timeout, the SDK's own timeout, shortened
//     from its 60 s default), or any transport error (connection closed,
//     fetch failed, an HTTP error status, a failed connect): it drops
//     the client, connects a new one (a new process over stdio, a new
//     session over HTTP; tools/list again) and sends the same call again;
//   - idem's in-flight (-31902), unknown (-31903) or store-unavailable
//     (-31904) answers: it waits data.retryAfterMs (50 ms to 40 s) and
//     sends it again on the same client; server exited (-31907): a new
//     client, then again; an unknown outcome without retryAfterMs (an
//     operator must settle it: --on-unknown fail) is a failure;
//   - any other error, or --attempts attempts without a result: it gives up
//     and is told it failed.
//
// Effects are counted from the tool server's log (one line per action,
// bench/dup_server.mjs), never from the answers.
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { performance } from "node:perf_hooks";

const HERE = new URL(".", import.meta.url).pathname;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

function parse(argv) {
  const opts = {};
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith("--")) opts[argv[i].slice(2)] = argv[++i];
    else pos.push(argv[i]);
  }
  return { opts, pos };
}
const range = (s) => s.split(/[ ,]+/).map(Number);

// mulberry32: the same draws for the same seed.
function rng(seed) {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// ---- processes ---------------------------------------------------------------

// Spawns cmd and resolves {p, m, exited, out()} once a line of `stream`
// matches re (the ready line); rejects if it exits first or after 30 s.
function startReady(cmd, args, stream, re, { env, errFd } = {}) {
  const p = spawn(cmd, args, { env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", stream === "stderr" ? "pipe" : errFd ?? "ignore"] });
  let text = "";
  let out = "";
  const exited = new Promise((r) => p.on("exit", (code, signal) => r({ code, signal })));
  p.stdout.on("data", (d) => { out += d; });
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${cmd}: not ready in 30 s: ${text}`)), 30000);
    p[stream].on("data", (d) => {
      text += d;
      if (stream === "stderr" && errFd !== undefined) {
        try { writeFileSync(errFd, d); } catch { /* a log only */ }
      }
      const m = re.exec(text);
      if (m) {
        clearTimeout(t);
        resolve({ p, m, exited, out: () => out });
      }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(t);
      reject(new Error(`${cmd} ${args.join(" ")} exited (${code ?? signal}) before ready: ${text}${out === text ? "" : out}`));
    });
  });
}

// ---- the SDKs ------------------------------------------------------------------

async function loadSdk(sdk) {
  if (sdk === "1") {
    const { Client } = await import("@modelcontextprotocol/sdk/client/index.js");
    const { StdioClientTransport } = await import("@modelcontextprotocol/sdk/client/stdio.js");
    const { StreamableHTTPClientTransport } =
      await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
    return { Client, StdioClientTransport, StreamableHTTPClientTransport,
      callTool: (c, params, timeout) => c.callTool(params, undefined, { timeout }) };
  }
  const { Client, StreamableHTTPClientTransport } = await import("@modelcontextprotocol/client");
  const { StdioClientTransport } = await import("@modelcontextprotocol/client/stdio");
  return { Client, StdioClientTransport, StreamableHTTPClientTransport,
    callTool: (c, params, timeout) => c.callTool(params, { timeout }) };
}

// What an error is to the agent: idem's own answer (code -31909..-31901),
// the client's request timeout, or a transport error.
function classify(e) {
  const code = e?.code;
  if (typeof code === "number" && code <= -31901 && code >= -31909)
    return { kind: "idem", code, retryAfterMs: e?.data?.retryAfterMs };
  if (code === "REQUEST_TIMEOUT" ||
      (code === -32001 && typeof e?.data?.timeout === "number"))
    return { kind: "timeout", code };
  return { kind: "transport", code: code ?? e?.name ?? "?",
    message: String(e?.message ?? e).slice(0, 160) };
}

// ---- one cell --------------------------------------------------------------------

async function cell(o) {
  const mode = o.mode;
  const sdk = o.sdk;
  const transportKind = o.transport;
  const idem = o.idem;
  const work = o.work;
  const N = Number(o.intentions ?? 334);
  const K = Number(o.agents ?? 8);
  const slowShare = Number(o["slow-share"] ?? 0.1);
  const [slowLo, slowHi] = range(o.slow ?? "1000 4000");
  const [fastLo, fastHi] = range(o.fast ?? "5 50");
  const [lifeLo, lifeHi] = range(o.life ?? "2000 6000");
  const timeout = Number(o.timeout ?? 8000);
  const maxAttempts = Number(o.attempts ?? 10);
  const stdioCut = o["stdio-cut"] ?? "reload";
  if (!["reload", "crash"].includes(stdioCut)) throw new Error(`no stdio cut ${stdioCut}`);
  const seed = Number(o.seed ?? 53);
  const window = o["implicit-window"] ?? "10m";
  const client = `sdk${sdk}-${transportKind}` +
    (transportKind === "stdio" && stdioCut === "crash" ? "-crash" : "");
  const name = `${mode}.${client}`;
  const server = join(HERE, "dup_server.mjs");
  const effectsFile = join(work, `${name}.effects`);
  const store = `sqlite:${join(work, `${name}.db`)}`;
  const logFd = openSync(join(work, `${name}.log`), "a");
  writeFileSync(effectsFile, "");
  const env = { DUP_EFFECTS: effectsFile };
  const modeOpts = { direct: [], keys: [],
    offer: ["--offer-key-argument", "idempotency_key"],
    implicit: ["--implicit-keys", window] }[mode];
  if (!modeOpts) throw new Error(`no mode ${mode}`);
  // --idem-opts "...": more options for idem mcp (BENCH_QUICK's --lease).
  modeOpts.push(...(o["idem-opts"] ?? "").split(/\s+/).filter((x) => x));
  const S = await loadSdk(sdk);
  const t0 = now();

  // HTTP: the server, idem mcp --listen in front (but direct), the relay.
  let srv = null, px = null, relay = null, url = null;
  if (transportKind === "http") {
    srv = await startReady("node", [server, "--http", "0"], "stdout",
      /listening (\d+)/, { env, errFd: logFd });
    let port = Number(srv.m[1]);
    if (mode !== "direct") {
      px = await startReady(idem, ["mcp", "--listen", "127.0.0.1:0",
        "--upstream", `http://127.0.0.1:${port}/mcp`, "--store", store,
        "--principal", "none", ...modeOpts], "stderr",
      /listening on http:\/\/127\.0\.0\.1:(\d+)/, { errFd: logFd });
      port = Number(px.m[1]);
    }
    relay = await startReady("node", [join(HERE, "dup_relay.mjs"), String(port),
      String(lifeLo), String(lifeHi), String(seed)], "stdout", /listening (\d+)/,
    { errFd: logFd });
    url = new URL(`http://[::1]:${relay.m[1]}/mcp`);
  }
  const stdioCmd = mode === "direct" ? ["node", [server]]
    : [idem, ["mcp", "--store", store, ...modeOpts, "--", "node", server]];

  // The intentions: the same mix of quick and slow for every mode.
  const draw = rng(seed);
  const intentions = [];
  for (let i = 0; i < N; i++) {
    const slow = draw() < slowShare;
    const ms = Math.round(slow ? slowLo + draw() * (slowHi - slowLo)
      : fastLo + draw() * (fastHi - fastLo));
    intentions.push({ id: `${name}-${i}`, slow, args: { intent_id: `${name}-${i}`,
      title: `ticket ${i}`, work_ms: ms } });
  }

  const procs = []; // stdio children: each one's exit, awaited at the end
  const closing = []; // clients being closed
  const stats = { connects: 0, connect_failures: 0, reloads: 0,
    offered: 0, not_offered: 0 };
  const lifeDraw = rng(seed ^ 0x5bd1e995);

  class Agent {
    constructor(a) { this.a = a; this.c = null; }
    // Drops the client: with the SDK's close(), or (a stdio crash) with
    // its pipes closed and no signal, its call in flight given up at once.
    retire(crash = false) {
      const c = this.c;
      if (!c) return;
      this.c = null;
      clearTimeout(c.timer);
      if (crash && c.proc) {
        try { c.proc.stdin.end(); } catch { /* gone */ }
        c.proc.stdout.destroy();
        c.die(new Error("the agent's host died (stdio crash)"));
      } else {
        closing.push(c.client.close().catch(() => {}));
      }
    }
    async connect() {
      this.retire();
      const client = new S.Client({ name: `dup-agent-${this.a}`, version: "1.0.0" });
      let transport;
      if (transportKind === "http") {
        transport = new S.StreamableHTTPClientTransport(url);
      } else {
        transport = new S.StdioClientTransport({ command: stdioCmd[0],
          args: stdioCmd[1], env: { ...process.env, ...env }, stderr: logFd });
      }
      client.onerror = () => {}; // the SDK's own reports of cut streams
      const c = { client, offered: false, timer: null, proc: null, die: null };
      c.dead = new Promise((_, reject) => { c.die = reject; });
      c.dead.catch(() => {});
      stats.connects++;
      try {
        await client.connect(transport);
        if (transport._process) {
          const p = c.proc = transport._process;
          procs.push(p.exitCode !== null ? Promise.resolve()
            : new Promise((r) => p.once("exit", r)));
        }
        // As a host does: the tools, for the model.
        const { tools } = await client.listTools(undefined, { timeout });
        const t = tools.find((x) => x.name === "create_ticket");
        c.offered = !!t?.inputSchema?.properties?.idempotency_key;
      } catch (e) {
        stats.connect_failures++;
        closing.push(client.close().catch(() => {}));
        throw e;
      }
      if (transportKind === "stdio") {
        // The reload: the editor closes this client at the end of its
        // life (or its host dies).
        c.timer = setTimeout(() => {
          if (this.c === c) { stats.reloads++; this.retire(stdioCut === "crash"); }
        }, lifeLo + lifeDraw() * (lifeHi - lifeLo));
      }
      this.c = c;
      return c;
    }
    async attempt(it, key) {
      let c = this.c;
      if (!c) {
        try { c = await this.connect(); } catch (e) {
          return { error: classify(e), connect: true };
        }
      }
      const params = { name: "create_ticket", arguments: { ...it.args } };
      if (mode === "keys") params._meta = { idempotencyKey: key };
      if (mode === "offer") {
        if (c.offered) params.arguments.idempotency_key = key;
        stats[c.offered ? "offered" : "not_offered"]++;
      }
      try {
        return { result: await Promise.race([
          S.callTool(c.client, params, timeout), c.dead]) };
      } catch (e) {
        return { error: classify(e) };
      }
    }
    async intention(it) {
      const key = randomUUID(); // one per intention, before its first attempt
      const start = now();
      const tries = [];
      let outcome = "gave_up";
      let result = null;
      for (let n = 1; n <= maxAttempts; n++) {
        const ta = now();
        const r = await this.attempt(it, key);
        const rec = { at: Math.round(ta - start), ms: Math.round(now() - ta) };
        if (r.result) {
          result = r.result;
          outcome = r.result.isError ? "tool_error" : "ok";
          tries.push({ ...rec, ok: !r.result.isError,
            replayed: r.result._meta?.["idem/replayed"] === true,
            recovered: r.result._meta?.["idem/recovered"] === true });
          break;
        }
        const e = r.error;
        tries.push({ ...rec, ...e, ...(r.connect ? { connect: true } : {}) });
        if (e.kind === "idem") {
          // An unknown outcome that no retry may settle (--on-unknown fail):
          // the agent is told it failed.
          if (e.code === -31903 && typeof e.retryAfterMs !== "number") {
            outcome = "refused";
            break;
          }
          if ([-31902, -31903, -31904].includes(e.code)) {
            const w = typeof e.retryAfterMs === "number" ? e.retryAfterMs : 250;
            await sleep(Math.min(Math.max(w, 50), 40000));
            continue;
          }
          if (e.code === -31907) { this.retire(); continue; }
          outcome = "refused";
          break;
        }
        // A timeout or a transport error: a new client, the same call.
        this.retire();
        if (r.connect) await sleep(100); // the connect itself failed
      }
      return { id: it.id, key, slow: it.slow, work_ms: it.args.work_ms, outcome,
        ms: now() - start, attempts: tries.length, tries,
        text: result?.content?.[0]?.text ?? null };
    }
  }

  // Every agent starts with its client connected, as a host has its
  // servers up before its model calls a tool: the clock of an intention
  // counts the reconnects its cuts cost, not the cell's start.
  const agents = Array.from({ length: K }, (_, a) => new Agent(a));
  await Promise.all(agents.map(async (agent) => {
    for (let n = 1; ; n++) {
      try { await agent.connect(); return; } catch (e) {
        if (n >= maxAttempts) throw e;
        await sleep(100);
      }
    }
  }));
  const started = now();
  const records = [];
  await Promise.all(agents.map(async (agent) => {
    for (let i = agent.a; i < N; i += K) records.push(await agent.intention(intentions[i]));
    agent.retire();
  }));
  const agentsDone = now();
  await Promise.all(closing);
  await Promise.all(procs);
  let relayStats = null;
  if (transportKind === "http") {
    // The proxy first (its keyed calls at the server end and are recorded),
    // then the relay (its figures), then the server (once idle).
    if (px) { px.p.kill("SIGTERM"); await px.exited; }
    relay.p.kill("SIGTERM");
    await relay.exited;
    try { relayStats = JSON.parse(relay.out().trim().split("\n").at(-1)); } catch { /* none */ }
    srv.p.kill("SIGTERM");
    await srv.exited;
  }
  closeSync(logFd);

  // The effects, from the server's log.
  const effects = new Map();
  for (const l of readFileSync(effectsFile, "utf8").split("\n")) {
    if (!l) continue;
    const e = JSON.parse(l);
    if (!effects.has(e.intent)) effects.set(e.intent, []);
    effects.get(e.intent).push(e);
  }
  const count = (r) => effects.get(r.id)?.length ?? 0;
  const ms = records.map((r) => r.ms).sort((x, y) => x - y);
  const q = (p) => ms.length ? ms[Math.min(ms.length - 1, Math.ceil(p * ms.length) - 1)] : null;
  const twice = records.filter((r) => count(r) > 1);
  const never = records.filter((r) => count(r) === 0);
  const errs = {};
  for (const r of records) for (const t of r.tries) {
    if (t.ok !== undefined) continue;
    const k = t.kind === "transport" ? `transport:${t.code}` : `${t.kind}${t.kind === "idem" ? `:${t.code}` : ""}`;
    errs[k] = (errs[k] ?? 0) + 1;
  }
  const unknownIds = [...effects.keys()].filter((k) => !records.some((r) => r.id === k));
  // An answer of success must name a ticket its own intention's call made
  // (ticket T-<pid>-<n> for <intent_id>): never another intention's.
  const wrong = records.filter((r) => r.outcome === "ok" &&
    !(effects.get(r.id) ?? []).some((e) =>
      r.text === `ticket T-${e.pid}-${e.n} for ${r.id}`));
  const summary = {
    mode, sdk, transport: transportKind, client,
    intentions: N, agents: K, acted_twice: twice.length,
    extra_effects: twice.reduce((s, r) => s + count(r) - 1, 0),
    effects: [...effects.values()].reduce((s, v) => s + v.length, 0),
    never_acted: never.length,
    never_acted_told_failed: never.filter((r) => r.outcome !== "ok").length,
    told_failed: records.filter((r) => r.outcome !== "ok").length,
    told_failed_but_acted: records.filter((r) => r.outcome !== "ok" && count(r) > 0).length,
    slow: records.filter((r) => r.slow).length,
    slow_twice: twice.filter((r) => r.slow).length,
    retried: records.filter((r) => r.attempts > 1).length,
    attempts: records.reduce((s, r) => s + r.attempts, 0),
    replayed: records.filter((r) => r.tries.at(-1)?.replayed).length,
    recovered: records.filter((r) => r.tries.at(-1)?.recovered).length,
    median_s: q(0.5) / 1000, p99_s: q(0.99) / 1000,
    errors: errs, ...stats, relay: relayStats,
    unknown_intents: unknownIds.length, wrong_answers: wrong.length,
    timeout_ms: timeout, life_ms: [lifeLo, lifeHi],
    stdio_cut: transportKind === "stdio" ? stdioCut : null,
    idem_opts: mode === "direct" ? null : modeOpts.join(" "),
    wall_s: (now() - t0) / 1000, agents_s: (agentsDone - started) / 1000,
  };
  // Every intention's attempts and effects, for a look afterwards.
  writeFileSync(join(work, `${name}.intentions.jsonl`), records.map((r) =>
    JSON.stringify({ ...r, effects: effects.get(r.id) ?? [] })).join("\n") + "\n");
  // Through idem an intention that acted twice is a defect: say how.
  if (mode !== "direct")
    for (const r of twice.slice(0, 5))
      console.error(`${name}: ${r.id} (${mode === "implicit" ? "no key sent" : `key ${r.key}`}) ` +
        `acted ${count(r)} times (work ${r.work_ms} ms); ` +
        `attempts ${JSON.stringify(r.tries)}; effects ${JSON.stringify(
          (effects.get(r.id) ?? []).map((e) => ({ pid: e.pid, at: e.at })))}`);
  console.log(JSON.stringify(summary));
}

// ---- the table ---------------------------------------------------------------------

function table(file) {
  const cells = readFileSync(file, "utf8").split("\n").filter((l) => l)
    .map((l) => JSON.parse(l));
  if (!cells.length) { console.log("(no cells)"); return; }
  const pct = (a, b) => b ? `${(100 * a / b).toFixed(1)}%` : "-";
  const s = (x) => x === null || x === undefined ? "-" : x.toFixed(2);
  const head = ["mode", "client", "intentions", "acted >1", "share",
    "never acted (told failed)", "told failed", "median s", "p99 s"];
  const rows = cells.map((c) => [c.mode, c.client, String(c.intentions),
    String(c.acted_twice), pct(c.acted_twice, c.intentions),
    `${c.never_acted} (${c.never_acted_told_failed})`, String(c.told_failed),
    s(c.median_s), s(c.p99_s)]);
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r) => "| " + r.map((x, i) => i < 2 ? x.padEnd(w[i]) : x.padStart(w[i])).join(" | ") + " |";
  console.log(line(head));
  console.log("|" + w.map((n, i) => (i < 2 ? "-" : "-").repeat(n + 1) + (i < 2 ? "-" : ":")).join("|") + "|");
  for (const r of rows) console.log(line(r));
  // Through idem, per client: every idem mode's intentions together.
  console.log("");
  console.log("through idem, all its modes together (target: 0 acted twice of at least 1,000 per client):");
  const clients = [...new Set(cells.map((c) => c.client))];
  const cw = Math.max(...clients.map((c) => c.length));
  let missed = 0;
  for (const cl of clients) {
    const idem = cells.filter((c) => c.client === cl && c.mode !== "direct");
    const direct = cells.find((c) => c.client === cl && c.mode === "direct");
    const n = idem.reduce((a, c) => a + c.intentions, 0);
    const tw = idem.reduce((a, c) => a + c.acted_twice, 0);
    const bad = cells.filter((c) => c.client === cl)
      .reduce((a, c) => a + c.wrong_answers + c.unknown_intents, 0);
    const ok = tw === 0 && bad === 0 && n >= 1000;
    if (!ok && (n >= 1000 || tw > 0 || bad > 0)) missed++;
    console.log(`  ${cl.padEnd(cw)} ${String(tw).padStart(4)} of ${String(n).padStart(5)} ` +
      `(${idem.map((c) => c.mode).join(", ") || "none"})` +
      `${direct ? `; direct ${direct.acted_twice} of ${direct.intentions} (${pct(direct.acted_twice, direct.intentions)})` : ""}` +
      `  ${ok ? "met" : tw > 0 || bad > 0 ? "MISSED" : "no verdict (fewer than 1,000)"}` +
      (bad ? ` (${bad} answers naming no ticket of their own intention, or effects of no intention)` : ""));
  }
  console.log("");
  console.log("details (slow: intentions whose call took --slow; attempts; how the attempts that got no result ended; relay cuts or stdio reloads):");
  for (const c of cells) {
    const errs = Object.entries(c.errors).map(([k, v]) => `${k} ${v}`).join(", ") || "none";
    console.log(`  ${c.mode}/${c.client}: slow ${c.slow} (acted >1 ${c.slow_twice}); ` +
      `retried ${c.retried}, attempts ${c.attempts}; replayed ${c.replayed}, recovered ${c.recovered}; ` +
      `told failed but acted ${c.told_failed_but_acted}; wrong answers ${c.wrong_answers}; effects ${c.effects}` +
      (c.extra_effects ? ` (${c.extra_effects} extra)` : "") + `; errors: ${errs}; ` +
      (c.transport === "http" ? `relay: ${c.relay ? `${c.relay.connections} connections, ${c.relay.cut} cut` : "-"}`
        : `reloads ${c.reloads}`) + `; clients ${c.connects} (failed ${c.connect_failures})` +
      (c.mode === "offer" ? `; calls with the offered argument ${c.offered}, without ${c.not_offered}` : "") +
      `; ${c.wall_s.toFixed(0)} s`);
  }
  console.log(`targets missed: ${missed}`);
}

const { pos, opts } = parse(process.argv.slice(2));
if (pos[0] === "cell") await cell(opts);
else if (pos[0] === "table") table(pos[1]);
else {
  console.error("usage: node dup_agent.mjs cell --mode M --sdk 1|2 --transport stdio|http --idem IDEM --work DIR ...\n" +
    "       node dup_agent.mjs table FILE");
  process.exit(2);
}
process.exit(0);
