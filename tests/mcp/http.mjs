#!/usr/bin/env node
// http.mjs -- `idem mcp --listen`: the HTTP proxy in front of a remote MCP
// server on the Streamable HTTP transport (http_server.mjs, real SDK 1.x and
// 2.x servers), driven by the real SDK clients (1.x StreamableHTTPClient-
// Transport and the 2.x client's). Every scenario counts the server's side
// effects (GET /effects) and compares the ticket ids the clients got.
//
//   IDEM=/path/to/idem node http.mjs
//
// Environment:
//   DIRECT=1               no proxy: the clients talk to the server itself,
//                          and the proxy's own checks (replays, conflicts,
//                          effect counts per key) are skipped; checks that
//                          the harness (server, clients) works.
//   ONLY=REGEX             run only the scenarios whose name matches.
//   IDEM_TEST_PG_URL       also run two proxies on one PostgreSQL store.
//   IDEM_TEST_PG_REQUIRED=1  fail when IDEM_TEST_PG_URL is not set.
import { ElicitRequestSchema, LoggingMessageNotificationSchema }
  from "@modelcontextprotocol/sdk/types.js";
import { check, eq, finish, replayed, unmarked, text, sleep, TMP }
  from "./lib.mjs";
import { waitFor, startServer, startProxy, connectHttp, callTool, rawPost,
  makeCutter } from "./http_lib.mjs";

const DIRECT = process.env.DIRECT === "1";
const ONLY = process.env.ONLY ? new RegExp(process.env.ONLY) : null;
const RUN = `${process.pid}-${Date.now()}`;
// The proxy's own checks: skipped when the clients talk to the server.
const pcheck = (what, ok, detail) => { if (!DIRECT) check(what, ok, detail); };
const peq = (what, expected, actual) => { if (!DIRECT) eq(what, expected, actual); };
const J = JSON.stringify;
const id = (r) => r?.result?.structuredContent?.id;
const show = (r) => J(r);
const settled = async (promise, ms) => {
  let done = false;
  promise.then(() => { done = true; }, () => { done = true; });
  await sleep(ms);
  return done;
};

// ---- scenario plumbing: each runs with its own store, servers and proxies,
// all stopped at its end; a scenario that throws or hangs fails and the
// next one runs.
let cleanups = [];
let proxiesNow = [];
let storeN = 0;
const newStore = () => `sqlite:${TMP}/http-${++storeN}.db`;
async function server(opts) {
  const s = await startServer(opts);
  cleanups.push(() => s.kill("SIGKILL"));
  return s;
}
async function proxy(upstream, store, opts = []) {
  const p = await startProxy(upstream, store, opts, { direct: DIRECT });
  proxiesNow.push(p);
  const kill = p.kill;
  p.kill = (sig) => { p.killedByTest = true; return kill(sig); };
  cleanups.push(async () => {
    if (!p.proc) return;
    if (p.proc.exitCode !== null || p.proc.signalCode !== null) {
      check(`proxy on port ${p.port}: still running at the end of the scenario`,
        p.killedByTest, `exit ${p.proc.exitCode ?? p.proc.signalCode}; stderr:\n${p.stderr()}`);
      return;
    }
    p.proc.kill("SIGTERM");
    const t = setTimeout(() => {
      // Not a failed check (no stated contract), but noted: a proxy killed
      // here never gets to report leaks.
      console.log(`   note: the proxy on port ${p.port} did not exit within 5 s of SIGTERM; SIGKILL`);
      p.proc.kill("SIGKILL");
    }, 5000);
    await p.exited;
    clearTimeout(t);
  });
  return p;
}
async function client(url, opts = {}) {
  const c = await connectHttp(url, opts);
  cleanups.push(() => c.client.close().catch(() => {}));
  return c;
}
const scenarios = [];
const scenario = (name, fn, limitMs = 120000) => scenarios.push({ name, fn, limitMs });

async function runAll() {
  for (const { name, fn, limitMs } of scenarios) {
    if (ONLY && !ONLY.test(name)) continue;
    const t0 = Date.now();
    console.log(`-- ${name}`);
    let timer;
    try {
      await Promise.race([fn(), new Promise((_, rej) => {
        timer = setTimeout(() => rej(new Error(`scenario took more than ${limitMs} ms`)), limitMs);
      })]);
    } catch (e) {
      check(`${name}: ran to its end`, false, e?.stack ?? String(e));
      for (const p of proxiesNow)
        console.log(`   proxy on port ${p.port}, stderr:\n${p.stderr()}`);
    }
    if (process.env.VERBOSE === "1")
      for (const p of proxiesNow)
        console.log(`   proxy on port ${p.port}, stderr:\n${p.stderr()}`);
    proxiesNow = [];
    clearTimeout(timer);
    for (const c of cleanups.reverse()) {
      try { await c(); } catch { /* already gone */ }
    }
    cleanups = [];
    console.log(`   ${name}: ${Date.now() - t0} ms`);
  }
}

const CONFIGS = {
  "1.x stateful": { sdk: "1" },
  "1.x stateless": { sdk: "1", stateless: true },
  "1.x stateful json": { sdk: "1", json: true },
  "2.x stateless": { sdk: "2" },
};

// ---------------------------------------------------------------------
// Keyed call, replay to the same client, to another session and client, to
// the 2.x client; conflict; unkeyed calls; replays under the retry's own id
// and without another session's id; other paths passed through.
for (const [label, cfg] of Object.entries(CONFIGS)) {
  scenario(`basic (${label})`, async () => {
    const T = (s) => `basic ${label}: ${s}`;
    const stateful = cfg.sdk === "1" && !cfg.stateless;
    const s = await server(cfg);
    const p = await proxy(s.url, newStore());
    const A = await client(p.url, { sdk: "1", name: "A" });
    const B = await client(p.url, { sdk: "1", name: "B" });
    const C = await client(p.url, { sdk: "2", name: "C" });
    const eff = async () => (await s.effects()).effects.create_ticket;

    const r1 = await callTool(A, "create_ticket", { title: "t1" }, { key: "k1", timeout: 10000 });
    check(T("first keyed call answered"), r1.result && text(r1.result) === "ticket-1", show(r1));
    pcheck(T("first call not marked replayed"), r1.result && !replayed(r1.result), show(r1));
    eq(T("first call acted once"), 1, await eff());
    const log = (await s.effects()).log;
    eq(T("the server got the key as sent"), "k1", log[0]?.key);

    const r2 = await callTool(A, "create_ticket", { title: "t1" }, { key: "k1", timeout: 10000 });
    pcheck(T("retry on the same client replayed"), replayed(r2.result), show(r2));
    peq(T("retry: the same result"), r1.result, r2.result && unmarked(r2.result));
    peq(T("retry: nothing reached the server"), 1, await eff());

    const sidA = A.sessionId();
    const sidB = B.sessionId();
    if (stateful) check(T("A and B have sessions of their own"),
      sidA && sidB && sidA !== sidB, J([sidA, sidB]));
    const r3 = await callTool(B, "create_ticket", { title: "t1" }, { key: "k1", timeout: 10000 });
    pcheck(T("retry from another session replayed"), replayed(r3.result), show(r3));
    peq(T("another session: same ticket"), "ticket-1", text(r3.result));
    eq(T("B's session id unchanged by the replay"), sidB, B.sessionId());
    peq(T("another session: nothing reached the server"), 1, await eff());
    const r4 = await callTool(B, "create_ticket", { title: "b" }, { timeout: 10000 });
    check(T("B's next call works"), r4.result && !replayed(r4.result) &&
      id(r4) !== id(r1), show(r4));
    eq(T("B's next call acted"), DIRECT ? 4 : 2, await eff());

    const r5 = await callTool(A, "create_ticket", { title: "other" }, { key: "k1", timeout: 10000 });
    peq(T("same key, other arguments: -31901"), -31901, r5.error?.code);
    peq(T("conflict: nothing reached the server"), 2, await eff());

    const r6 = await callTool(C, "create_ticket", { title: "t1" }, { key: "k1", timeout: 10000 });
    pcheck(T("2.x client: replayed"), replayed(r6.result), show(r6));
    peq(T("2.x client: same ticket"), "ticket-1", text(r6.result));
    const r7 = await callTool(C, "create_ticket", { title: "c" }, { key: "k2", timeout: 10000 });
    const r8 = await callTool(C, "create_ticket", { title: "c" }, { key: "k2", timeout: 10000 });
    check(T("2.x client: own key acts"), r7.result && !replayed(r7.result), show(r7));
    pcheck(T("2.x client: own key replayed"), replayed(r8.result) &&
      id(r8) === id(r7), show([r7, r8]));
    peq(T("2.x client: one effect for k2"), 3, await eff());

    const u1 = await callTool(A, "create_ticket", { title: "u" }, { timeout: 10000 });
    const u2 = await callTool(A, "create_ticket", { title: "u" }, { timeout: 10000 });
    check(T("unkeyed calls both act"), u1.result && u2.result && id(u1) !== id(u2) &&
      !replayed(u1.result) && !replayed(u2.result), show([u1, u2]));
    peq(T("unkeyed: two effects"), 5, await eff());
    peq(T("tools/call requests the server got"), 5,
      (await s.effects()).requests["tools/call"]);

    // Raw POSTs: the replay goes under the retry's own id (string or
    // number) and carries no other session's id.
    const headers = { "mcp-protocol-version": "2025-11-25" };
    if (stateful) headers["mcp-session-id"] = sidB;
    for (const rid of ["raw-77", 4242]) {
      const raw = await rawPost(p.url, { jsonrpc: "2.0", id: rid, method: "tools/call",
        params: { name: "create_ticket", arguments: { title: "t1" },
          _meta: { idempotencyKey: "k1" } } }, headers);
      const ans = raw.messages.find((m) => m && m.id !== undefined && !m.method);
      check(T(`raw replay: 200`), raw.status === 200, J(raw));
      eq(T(`raw replay: answered under the retry's id ${J(rid)}`), rid, ans?.id);
      pcheck(T(`raw replay (id ${J(rid)}): replayed ticket-1`),
        replayed(ans?.result) && text(ans?.result) === "ticket-1", J(raw));
      const hs = raw.headers["mcp-session-id"];
      check(T(`raw replay (id ${J(rid)}): no other session's id`),
        hs === undefined || hs === sidB, J(raw.headers));
    }
    peq(T("raw replays: nothing reached the server"), 5, await eff());

    // The other paths of the server's origin are not proxied: 404 from
    // the proxy, and the server never asked.
    if (!DIRECT) {
      const before = (await s.effects()).requests;
      const viaProxy = await fetch(`${p.base}/effects`);
      const nf = await fetch(`${p.base}/no/such/path?x=1`);
      eq(T("GET /effects and an unknown path through the proxy: the proxy's 404"),
        [404, -32600, 404, -32600],
        [viaProxy.status, (await viaProxy.json()).error?.code, nf.status, (await nf.json()).error?.code]);
      eq(T("other paths: the server was not asked"), before, (await s.effects()).requests);
    }
    // The clients still work after everything.
    const last = await callTool(B, "create_ticket", { title: "last" }, { timeout: 10000 });
    check(T("B still works"), last.result !== undefined, show(last));
  });
}

// ---------------------------------------------------------------------
// A retry while the first is still running at the server waits and gets its
// result.
for (const label of ["1.x stateful", "1.x stateless", "2.x stateless"]) {
  scenario(`attach (${label})`, async () => {
    const T = (s) => `attach ${label}: ${s}`;
    const s = await server(CONFIGS[label]);
    const p = await proxy(s.url, newStore());
    const A = await client(p.url, { sdk: "1" });
    const B = await client(p.url, { sdk: "2" });
    const args = { title: "att" };
    const pa = callTool(A, "slow_ticket", args, { key: "k-att", timeout: 30000 });
    await waitFor(async () => (await s.effects()).running.slow_ticket === 1,
      T("the first call to run at the server"));
    const pb = callTool(B, "slow_ticket", args, { key: "k-att", timeout: 30000 });
    pcheck(T("the retry waits while the first runs"), !(await settled(pb, 700)),
      show(await Promise.race([pb, sleep(0)])));
    peq(T("the retry did not reach the server"), 1, (await s.effects()).started.slow_ticket);
    await s.release("att");
    const [ra, rb] = [await pa, await pb];
    check(T("the first answered"), ra.result && !replayed(ra.result), show(ra));
    pcheck(T("the retry got the first's result, marked replayed"),
      replayed(rb.result) && id(rb) === id(ra), show([ra, rb]));
    peq(T("one effect"), 1, (await s.effects()).effects.slow_ticket);
  });
}

// ---------------------------------------------------------------------
// Progress arrives while the tool runs: the tool waits for a release sent
// from the client's onprogress; a proxy that buffers deadlocks here.
for (const label of ["1.x stateful", "1.x stateless", "2.x stateless"]) {
  scenario(`progress (${label})`, async () => {
    const T = (s) => `progress ${label}: ${s}`;
    const s = await server(CONFIGS[label]);
    const p = await proxy(s.url, newStore());
    for (const sdk of ["1", "2"]) {
      const A = await client(p.url, { sdk });
      for (const key of [`kp-${sdk}`, null]) {
        const title = `prog-${sdk}-${key ?? "unkeyed"}`;
        const prog = [];
        const r = await callTool(A, "slow_ticket", { title }, { key, timeout: 10000,
          onprogress: (x) => {
            prog.push(x);
            if (prog.length === 1) s.release(title);
          } });
        check(T(`${sdk}.x client, ${key ? "keyed" : "unkeyed"}: the call ended` +
          " (progress reached the client while the tool was still waiting for it)"),
        r.result && text(r.result)?.startsWith("ticket-"),
        `${show(r)}; progress seen: ${J(prog)}; server: ${J((await s.effects()).running)}`);
        eq(T(`${sdk}.x client, ${key ? "keyed" : "unkeyed"}: both progress notifications`),
          [1, 2], prog.map((x) => x.progress));
        await s.release(title, true); // whatever happened, unblock
        if (key) {
          const again = await callTool(A, "slow_ticket", { title }, { key, timeout: 10000 });
          pcheck(T(`${sdk}.x client: the keyed retry replayed`),
            replayed(again.result) && id(again) === id(r), show([r, again]));
        }
      }
    }
    peq(T("effects: 4 calls, 2 of them retried"), 4, (await s.effects()).effects.slow_ticket);
  });
}

// ---------------------------------------------------------------------
// The client's stream cut mid-call (its connection aborted, and the SDK
// request aborted, which POSTs notifications/cancelled): the proxy does not
// cancel upstream; the re-issue under a new id gets the original result.
for (const label of ["1.x stateful", "1.x stateless", "2.x stateless"]) {
  scenario(`cut (${label})`, async () => {
    const T = (s) => `cut ${label}: ${s}`;
    const s = await server(CONFIGS[label]);
    const p = await proxy(s.url, newStore());
    const cutter = makeCutter();
    const A = await client(p.url, { sdk: "1", fetch: cutter.fetch });
    cutter.arm((m) => m.method === "tools/call" && m.params?._meta?.idempotencyKey === "k-cut");
    const ac = new AbortController();
    const pend = callTool(A, "slow_ticket", { title: "cut" }, { key: "k-cut",
      signal: ac.signal, timeout: 30000 });
    const sent = await cutter.sent;
    const sidA = A.sessionId();
    await waitFor(async () => (await s.effects()).runningTitles.includes("cut"),
      T("the call to run at the server"));
    check(T("the stream was cut"), cutter.cut());
    ac.abort(new Error("the client gave up"));
    const r1 = await pend;
    check(T("the client's call failed"), r1.error !== undefined, show(r1));
    await s.release("cut", true); // a re-issue that reaches the server acts at once
    const done = await waitFor(async () => (await s.effects()).log
      .find((e) => e.title === "cut"), T("the tool to act at the server"));
    pcheck(T("the proxy did not cancel the call upstream"), done?.aborted === false, J(done));
    const cancels = (await s.effects()).cancelled.filter((c) => c.requestId === sent.id &&
      (label !== "1.x stateful" || c.session === sidA));
    if (DIRECT) check(T("direct: the SDK's notifications/cancelled reached the server"),
      cancels.length === 1, J((await s.effects()).cancelled));
    peq(T("no notifications/cancelled for the keyed call reached the server"), [], cancels);
    const r2 = await callTool(A, "slow_ticket", { title: "cut" }, { key: "k-cut", timeout: 15000 });
    check(T("the re-issue answered"), r2.result !== undefined, show(r2));
    pcheck(T("the re-issue got the original result"), replayed(r2.result) &&
      id(r2) === done?.n, `${show(r2)}; at the server: ${J(done)}`);
    eq(T("the tool ran the first request (its JSON-RPC id)"), sent.id, done?.id);
    peq(T("one effect"), 1, (await s.effects()).effects.slow_ticket);
    const again = await callTool(A, "create_ticket", { title: "after" }, { timeout: 10000 });
    check(T("the client still works"), again.result !== undefined, show(again));

    // The 2.x client: a request timeout, then the re-issue while the call
    // is still running at the server (it waits for the result).
    const C = await client(p.url, { sdk: "2" });
    const nBefore = (await s.effects()).cancelled.length;
    const t1 = await callTool(C, "slow_ticket", { title: "cut2" }, { key: "k-cut2", timeout: 1000 });
    check(T("2.x: the first call timed out"), t1.error !== undefined, show(t1));
    const still = await waitFor(async () => (await s.effects()).runningTitles.includes("cut2"),
      T("2.x: the call still running at the server after the timeout"), 3000);
    const pend2 = callTool(C, "slow_ticket", { title: "cut2" }, { key: "k-cut2", timeout: 30000 });
    if (still) pcheck(T("2.x: the re-issue waits for the running call"),
      !(await settled(pend2, 500)), "answered at once");
    await s.release("cut2");
    const t2 = await pend2;
    const done2 = (await s.effects()).log.filter((e) => e.title === "cut2");
    check(T("2.x: the re-issue answered"), t2.result !== undefined, show(t2));
    pcheck(T("2.x: the re-issue got the original result"), replayed(t2.result) &&
      done2.length === 1 && id(t2) === done2[0].n, `${show(t2)}; at the server: ${J(done2)}`);
    pcheck(T("2.x: not cancelled upstream"), done2[0]?.aborted === false, J(done2));
    const cancels2 = (await s.effects()).cancelled.slice(nBefore);
    if (DIRECT) check(T("2.x direct: the SDK's notifications/cancelled reached the server"),
      cancels2.length === 1, J((await s.effects()).cancelled));
    peq(T("2.x: no notifications/cancelled for the keyed call reached the server"), [], cancels2);
    peq(T("2.x: one effect"), 2, (await s.effects()).effects.slow_ticket);

    // The stream cut alone (no cancellation sent: the SDK request is left
    // pending), then the same call under a new id.
    const D = await client(p.url, { sdk: "1", fetch: cutter.fetch });
    cutter.arm((m) => m.method === "tools/call" && m.params?._meta?.idempotencyKey === "k-cut3");
    const nCancel = (await s.effects()).cancelled.length;
    const left = callTool(D, "slow_ticket", { title: "cut3" }, { key: "k-cut3", timeout: 60000 });
    const sent3 = await cutter.sent;
    await waitFor(async () => (await s.effects()).runningTitles.includes("cut3"),
      T("cut only: the call to run at the server"));
    check(T("cut only: the stream was cut"), cutter.cut());
    await s.release("cut3", true);
    const done3 = await waitFor(async () => (await s.effects()).log
      .find((e) => e.title === "cut3"), T("cut only: the tool to act at the server"));
    eq(T("cut only: the tool ran the first request"), sent3.id, done3?.id);
    eq(T("cut only: no cancellation sent"), [], (await s.effects()).cancelled.slice(nCancel));
    pcheck(T("cut only: the proxy did not cancel the call upstream"),
      done3?.aborted === false, J(done3));
    const t3 = await callTool(D, "slow_ticket", { title: "cut3" }, { key: "k-cut3", timeout: 15000 });
    check(T("cut only: the re-issue answered"), t3.result !== undefined, show(t3));
    pcheck(T("cut only: the re-issue got the original result"), replayed(t3.result) &&
      id(t3) === done3?.n, `${show(t3)}; at the server: ${J(done3)}`);
    peq(T("cut only: one effect"), 3, (await s.effects()).effects.slow_ticket);
    await D.client.close();
    await left;
  });
}

// ---------------------------------------------------------------------
// Resumption: a server with an event store. The proxy passes a keyed
// call's events on without their ids, so that a client whose stream is cut
// cannot resume it with GET + Last-Event-ID (the server would send the
// result on that GET, never on the POST the proxy records from). The
// client's request times out instead, and its re-issue under a new id gets
// the recorded result: one effect.
scenario("a cut keyed stream is re-issued, not resumed (1.x stateful, event store)", async () => {
  const T = (s) => `resume: ${s}`;
  const s = await server({ sdk: "1", events: true });
  const p = await proxy(s.url, newStore());
  const cutter = makeCutter();
  const A = await client(p.url, { sdk: "1", fetch: cutter.fetch });
  const sid = A.sessionId();
  await waitFor(async () => (await s.effects()).getStreams[sid] >= 1,
    T("the client's GET stream open at the server"));
  cutter.arm((m) => m.method === "tools/call" && m.params?._meta?.idempotencyKey === "k-res");
  const prog = [];
  const pend = callTool(A, "slow_ticket", { title: "res" }, { key: "k-res", timeout: 3000,
    onprogress: (x) => prog.push(x) });
  await waitFor(() => prog.length >= 1, T("the first progress"));
  check(T("the stream was cut"), cutter.cut());
  const r0 = await pend;
  check(T("the cut request timed out (nothing to resume from)"), r0.error !== undefined, show(r0));
  eq(T("no GET with Last-Event-ID reached the server"), [], (await s.effects()).resumes);
  eq(T("the client's cancellation did not reach the server"), [], (await s.effects()).cancelled);
  const again = callTool(A, "slow_ticket", { title: "res" }, { key: "k-res", timeout: 30000 });
  await s.release("res", true);
  const r1 = await again;
  pcheck(T("the re-issue got the original result"), replayed(r1.result) &&
    text(r1.result)?.startsWith("ticket-"), show(r1));
  eq(T("one effect"), 1, (await s.effects()).effects.slow_ticket);
  const B = await client(p.url, { sdk: "1" });
  const r2 = await callTool(B, "slow_ticket", { title: "res" }, { key: "k-res", timeout: 30000 });
  pcheck(T("a retry from another client gets the same ticket"), replayed(r2.result) &&
    id(r2) === id(r1), show([r1, r2]));
  peq(T("still one effect"), 1, (await s.effects()).effects.slow_ticket);
});

// ---------------------------------------------------------------------
// Elicitation (a server-to-client request on the POST's stream, answered
// by a new POST) through the proxy, on a keyed call; its replay asks
// nothing.
scenario("elicitation (1.x stateful)", async () => {
  const T = (s) => `elicitation: ${s}`;
  const s = await server({ sdk: "1" });
  const p = await proxy(s.url, newStore());
  const asked = [];
  const withHandler = (name) => client(p.url, { sdk: "1", name,
    capabilities: { elicitation: { form: {} } },
    handlers: (c) => c.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push({ client: name, message: req.params.message });
      return { action: "accept", content: { answer: `yes-${asked.length}` } };
    }) });
  const A = await withHandler("A");
  const r1 = await callTool(A, "ask", { question: "deploy?" }, { key: "k-ask", timeout: 15000 });
  eq(T("the keyed call got the client's answer"), "answer: yes-1", text(r1.result));
  eq(T("asked once"), [{ client: "A", message: "deploy?" }], asked);
  const r2 = await callTool(A, "ask", { question: "deploy?" }, { key: "k-ask", timeout: 15000 });
  pcheck(T("retry replayed"), replayed(r2.result) && text(r2.result) === "answer: yes-1", show(r2));
  const B = await withHandler("B");
  const r3 = await callTool(B, "ask", { question: "deploy?" }, { key: "k-ask", timeout: 15000 });
  pcheck(T("retry from another session replayed"),
    replayed(r3.result) && text(r3.result) === "answer: yes-1", show(r3));
  peq(T("the replays asked nothing"), 1, asked.length);
  peq(T("one effect"), 1, (await s.effects()).effects.ask);
  const r4 = await callTool(B, "ask", { question: "again?" }, { timeout: 15000 });
  eq(T("unkeyed: B is asked"), "answer: yes-" + asked.length, text(r4.result));
  check(T("unkeyed: B answered"), asked.at(-1)?.client === "B", J(asked));
});

// ---------------------------------------------------------------------
// A notification the server sends outside any request (on the session's
// GET stream) reaches the client through the proxy; DELETE ends the session.
scenario("GET stream and DELETE (1.x stateful)", async () => {
  const T = (s) => `GET/DELETE: ${s}`;
  const s = await server({ sdk: "1" });
  const p = await proxy(s.url, newStore());
  for (const sdk of ["1", "2"]) {
    const got = [];
    const A = await client(p.url, { sdk,
      handlers: (c) => sdk === "1"
        ? c.setNotificationHandler(LoggingMessageNotificationSchema, (n) => { got.push(n.params.data); })
        : c.setNotificationHandler("notifications/message", (n) => { got.push(n.params.data); }) });
    const sid = A.sessionId();
    check(T(`${sdk}.x: a session`), typeof sid === "string", sid);
    await waitFor(async () => (await s.effects()).getStreams[sid] >= 1,
      T(`${sdk}.x: the client's GET stream open at the server`), 10000,
      async () => J(await s.effects()));
    const sent = await s.notify(sid, `hello-${sdk}`);
    eq(T(`${sdk}.x: the server sent it`), [sid], sent.sent);
    await waitFor(() => got.includes(`hello-${sdk}`),
      T(`${sdk}.x: the notification to reach the client`), 5000, () => J(got));
    const r = await callTool(A, "create_ticket", { title: "x" }, { key: `kd-${sdk}`, timeout: 10000 });
    check(T(`${sdk}.x: a call on the session`), r.result !== undefined, show(r));
    const before = (await s.effects()).sessions;
    await A.transport.terminateSession();
    await waitFor(async () => !(await s.effects()).sessionIds.includes(sid),
      T(`${sdk}.x: DELETE to end the session at the server`));
    eq(T(`${sdk}.x: one session fewer`), before - 1, (await s.effects()).sessions);
    const after = await rawPost(p.url, { jsonrpc: "2.0", id: 9, method: "tools/list" },
      { "mcp-session-id": sid, "mcp-protocol-version": "2025-11-25" });
    eq(T(`${sdk}.x: the ended session answers 404`), 404, after.status);
  }
});

// ---------------------------------------------------------------------
// Tenants: the Authorization header (hashed), or --tenant-header.
scenario("tenants (1.x stateless)", async () => {
  const T = (s) => `tenants: ${s}`;
  const s = await server({ sdk: "1", stateless: true });
  // The default rule, said: each Authorization is a principal, and a replay
  // waits on a ping in the caller's session (--replay-check upstream).
  const p = await proxy(s.url, newStore(), ["--principal", "credential:authorization"]);
  const mk = (h) => client(p.url, { sdk: "1", headers: h });
  const A = await mk({ authorization: "Bearer t1" });
  const B = await mk({ authorization: "Bearer t2" });
  const C = await mk({ authorization: "Bearer t1" });
  const ra = await callTool(A, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  const rb = await callTool(B, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  const rc = await callTool(C, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  check(T("A acts"), ra.result && !replayed(ra.result), show(ra));
  pcheck(T("B (other Authorization) acts on its own"), rb.result && !replayed(rb.result) &&
    id(rb) !== id(ra), show(rb));
  pcheck(T("C (A's Authorization) gets A's result"), replayed(rc.result) && id(rc) === id(ra), show(rc));
  peq(T("two effects"), 2, (await s.effects()).effects.create_ticket);
  eq(T("Authorization reaches the server"), "Bearer t1", (await s.effects()).log[0]?.auth);

  const p2 = await proxy(s.url, newStore(), ["--tenant-header", "X-Tenant"]);
  const mk2 = (h) => client(p2.url, { sdk: "1", headers: h });
  const D = await mk2({ "x-tenant": "acme", authorization: "Bearer t1" });
  const E = await mk2({ "x-tenant": "acme", authorization: "Bearer t9" });
  const F = await mk2({ "x-tenant": "other", authorization: "Bearer t1" });
  const rd = await callTool(D, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  const re = await callTool(E, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  const rf = await callTool(F, "create_ticket", { title: "t" }, { key: "kt", timeout: 10000 });
  pcheck(T("--tenant-header: same tenant, other token: replayed"),
    replayed(re.result) && id(re) === id(rd), show([rd, re]));
  pcheck(T("--tenant-header: other tenant acts"), rf.result && !replayed(rf.result) &&
    id(rf) !== id(rd), show(rf));
  peq(T("--tenant-header: two more effects"), 4, (await s.effects()).effects.create_ticket);
});

// ---------------------------------------------------------------------
// The proxy killed (SIGKILL) while a keyed call is at the server; a new
// proxy on the same store; the retry after the lease.
for (const mode of ["forward", "fail"]) {
  for (const label of ["1.x stateful", "1.x stateless"]) {
    scenario(`proxy killed, --on-unknown ${mode} (${label})`, async () => {
      if (DIRECT) return;
      const T = (s) => `proxy killed ${mode} ${label}: ${s}`;
      const s = await server(CONFIGS[label]);
      const store = newStore();
      const opts = ["--lease", "2s", "--on-unknown", mode];
      const p1 = await proxy(s.url, store, opts);
      const A = await client(p1.url, { sdk: "1" });
      const title = `pk-${mode}`;
      const key = `k-pk-${mode}`;
      const pend = callTool(A, "slow_ticket", { title }, { key, timeout: 8000 });
      await waitFor(async () => (await s.effects()).runningTitles.includes(title),
        T("the call to run at the server"));
      await p1.kill("SIGKILL");
      const r1 = await pend;
      check(T("the client's call failed"), r1.error !== undefined, show(r1));
      // The first attempt acts at the server, unrecorded.
      await s.release(title, true);
      await waitFor(async () => (await s.effects()).effects.slow_ticket === 1,
        T("the first attempt to act"));
      const p2 = await proxy(s.url, store, opts);
      const B = await client(p2.url, { sdk: "1" });
      const t0 = Date.now();
      const r2 = await callTool(B, "slow_ticket", { title }, { key, timeout: 40000 });
      if (mode === "forward") {
        check(T("the retry is sent again after the lease"), r2.result &&
          !replayed(r2.result), `${show(r2)} after ${Date.now() - t0} ms`);
        eq(T("its result is marked recovered"), true, r2.result?._meta?.["idem/recovered"]);
        eq(T("two effects"), 2, (await s.effects()).effects.slow_ticket);
        const r3 = await callTool(B, "slow_ticket", { title }, { key, timeout: 10000 });
        eq(T("then replayed and recovered"), [true, true, id(r2)],
          [r3.result?._meta?.["idem/replayed"], r3.result?._meta?.["idem/recovered"], id(r3)]);
      } else {
        eq(T("the retry is refused -31903"), -31903, r2.error?.code);
        eq(T("one effect"), 1, (await s.effects()).effects.slow_ticket);
      }
    });
  }
}

// ---------------------------------------------------------------------
// The server killed (SIGKILL) mid-call: the proxy answers an error; the key
// is kept; a restarted server; the retry after the lease.
for (const mode of ["forward", "fail"]) {
  for (const label of ["1.x stateful", "1.x stateless"]) {
    scenario(`server killed, --on-unknown ${mode} (${label})`, async () => {
      if (DIRECT) return;
      const T = (s) => `server killed ${mode} ${label}: ${s}`;
      const s1 = await server(CONFIGS[label]);
      const store = newStore();
      const p = await proxy(s1.url, store, ["--lease", "2s", "--on-unknown", mode]);
      const A = await client(p.url, { sdk: "1" });
      const title = `sk-${mode}`;
      const key = `k-sk-${mode}`;
      const pend = callTool(A, "slow_ticket", { title }, { key, timeout: 15000 });
      await waitFor(async () => (await s1.effects()).runningTitles.includes(title),
        T("the call to run at the server"));
      await s1.kill("SIGKILL");
      const r1 = await pend;
      check(T("the proxy answered the client with an error (not the client's timeout)"),
        r1.error !== undefined && r1.ms < 14000, show(r1));
      console.log(`   the client got: ${J(r1.error)} after ${r1.ms} ms`);
      let s2;
      for (let i = 0; i < 40 && !s2; i++) {
        try { s2 = await server({ ...CONFIGS[label], port: s1.port }); } catch (e) {
          if (i === 39) throw e;
          await sleep(100);
        }
      }
      await s2.release(title, true);
      const B = await client(p.url, { sdk: "1" });
      const t0 = Date.now();
      const r2 = await callTool(B, "slow_ticket", { title }, { key, timeout: 40000 });
      if (mode === "forward") {
        check(T("the retry is sent again"), r2.result && !replayed(r2.result),
          `${show(r2)} after ${Date.now() - t0} ms`);
        eq(T("its result is marked recovered"), true, r2.result?._meta?.["idem/recovered"]);
        eq(T("the new server acted once"), 1, (await s2.effects()).effects.slow_ticket);
      } else {
        eq(T("the retry is refused -31903"), -31903, r2.error?.code);
        eq(T("the new server did not act"), 0, (await s2.effects()).effects.slow_ticket);
      }
    });
  }
}

// ---------------------------------------------------------------------
// Two proxies on one PostgreSQL store, the same key from both at once.
scenario("two proxies on one PostgreSQL store", async () => {
  const T = (s) => `postgresql: ${s}`;
  const pg = process.env.IDEM_TEST_PG_URL;
  if (!pg) {
    if (process.env.IDEM_TEST_PG_REQUIRED === "1")
      check(T("IDEM_TEST_PG_URL is set (IDEM_TEST_PG_REQUIRED=1)"), false);
    else console.log("   skipped: IDEM_TEST_PG_URL is not set");
    return;
  }
  if (DIRECT) return;
  const s = await server({ sdk: "1" });
  const p1 = await proxy(s.url, pg);
  const p2 = await proxy(s.url, pg);
  const A = await client(p1.url, { sdk: "1" });
  const B = await client(p2.url, { sdk: "2" });
  const k1 = `k-pg-1-${RUN}`;
  const [ra, rb] = await Promise.all([
    callTool(A, "create_ticket", { title: "pg" }, { key: k1, timeout: 30000 }),
    callTool(B, "create_ticket", { title: "pg" }, { key: k1, timeout: 30000 })]);
  check(T("both answered the same ticket"), ra.result && rb.result && id(ra) === id(rb),
    show([ra, rb]));
  eq(T("exactly one of them not replayed"), 1,
    [ra, rb].filter((r) => r.result && !replayed(r.result)).length);
  eq(T("one effect"), 1, (await s.effects()).effects.create_ticket);

  const k2 = `k-pg-2-${RUN}`;
  const pa = callTool(A, "slow_ticket", { title: "pg2" }, { key: k2, timeout: 40000 });
  await waitFor(async () => (await s.effects()).running.slow_ticket === 1,
    T("the first call to run at the server"));
  const pb = callTool(B, "slow_ticket", { title: "pg2" }, { key: k2, timeout: 40000 });
  check(T("the other proxy's retry waits"), !(await settled(pb, 700)), "answered at once");
  await s.release("pg2");
  const [sa, sb] = [await pa, await pb];
  check(T("slow: both the same ticket"), sa.result && sb.result && id(sa) === id(sb) &&
    !replayed(sa.result) && replayed(sb.result), show([sa, sb]));
  eq(T("slow: one effect"), 1, (await s.effects()).effects.slow_ticket);
});

// ---------------------------------------------------------------------
// Beyond the brief's list: the 2.x client in the 2026-07-28 era (no
// initialize, no session) on the 2.x server, keyed call and replay.
scenario("modern era (2.x client pinned to 2026-07-28, 2.x server)", async () => {
  const T = (s) => `modern: ${s}`;
  const s = await server({ sdk: "2" });
  const p = await proxy(s.url, newStore());
  const M = await client(p.url, { sdk: "2", modern: true });
  const r1 = await callTool(M, "create_ticket", { title: "m" }, { key: "k-mod", timeout: 10000 });
  const r2 = await callTool(M, "create_ticket", { title: "m" }, { key: "k-mod", timeout: 10000 });
  check(T("the keyed call answered"), r1.result && !replayed(r1.result), show(r1));
  pcheck(T("the retry replayed"), replayed(r2.result) && id(r2) === id(r1), show(r2));
  peq(T("one effect"), 1, (await s.effects()).effects.create_ticket);
  const prog = [];
  const r3 = await callTool(M, "slow_ticket", { title: "mp" }, { key: "k-mod-p", timeout: 10000,
    onprogress: (x) => { prog.push(x); if (prog.length === 1) s.release("mp"); } });
  await s.release("mp", true);
  check(T("progress while the tool runs"), r3.result !== undefined && prog.length >= 1,
    `${show(r3)}; ${J(prog)}`);
});

await runAll();
finish();
