// era.mjs -- the 2.x SDK client (@modelcontextprotocol/client 2.4.0)
// through `idem mcp` in front of era_server.mjs (a 2.x SDK server), in both
// protocol eras:
//
//   modern  versionNegotiation {mode: "auto"}: server/discover (on a probe
//           copy of `idem mcp ... -- node era_server.mjs` the SDK starts
//           and kills itself), then 2026-07-28 with no initialize. deploy
//           answers resultType "input_required" first; the SDK's driver runs
//           the elicitation handler and sends the same tools/call again
//           (same key and arguments, plus inputResponses and requestState)
//           under a new id. The proxy keeps the key held across that round
//           and stores the final result.
//   legacy  the default negotiation (initialize, 2025-11-25): the server's
//           legacy shim sends a real elicitation/create inside the one
//           tools/call.
//
// Every check counts the server's effect lines ($EFFECTS) and compares the
// ids the calls returned with the ids in them.
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { check, eq, finish, HERE, IDEM, TMP, record, replayed, text,
  unmarked, watchStderr } from "./lib.mjs";

const SERVER = join(HERE, "era_server.mjs");
const EFFECTS = join(TMP, "effects");
const CAP = "idem/idempotency";

// The deploy effect lines for this tag (each scenario deploys its own tag).
function deploys(tag) {
  let s;
  try { s = readFileSync(EFFECTS, "utf8"); } catch { return []; }
  return s.split("\n").filter(Boolean).map((l) => JSON.parse(l))
    .filter((e) => e.tool === "deploy" && e.tag === tag);
}

/*
 * A 2.x client on `idem mcp --store STORE OPTS -- node era_server.mjs`.
 * answer() says what the elicitation handler does this time: "accept",
 * "decline" or "throw" (the user walked away: the handler fails). runs()
 * counts the handler's runs in this session.
 */
async function session(era, store, { opts = [], answer = () => "accept" } = {}) {
  const client = new Client({ name: "idem-era-test", version: "1.0.0" }, {
    capabilities: { elicitation: { form: {} } },
    ...(era === "modern" && { versionNegotiation: { mode: "auto" } }),
  });
  let runs = 0;
  client.setRequestHandler("elicitation/create", async () => {
    runs++;
    const a = answer();
    if (a === "throw") throw new Error("the user walked away");
    if (a === "decline") return { action: "decline" };
    return { action: "accept", content: { confirm: true } };
  });
  const transport = new StdioClientTransport({
    command: IDEM,
    args: ["mcp", "--store", store, ...opts, "--", "node", SERVER],
    env: { ...process.env, EFFECTS },
    stderr: "pipe",
  });
  let err = "";
  const errWaiters = [];
  transport.stderr.on("data", (d) => {
    err += d;
    for (const w of errWaiters.splice(0)) w();
  });
  watchStderr(() => err);
  await client.connect(transport);
  const proc = transport._process;
  const exited = new Promise((r) => proc.on("exit", (code, signal) =>
    r({ code, signal })));
  // Resolves once standard error holds re, or after ms.
  const stderrMatch = async (re, ms = 10000) => {
    const end = Date.now() + ms;
    while (!re.test(err) && Date.now() < end)
      await new Promise((r) => {
        errWaiters.push(r);
        setTimeout(r, end - Date.now()).unref();
      });
    return re.test(err);
  };
  return {
    client, runs: () => runs, stderr: () => err, stderrMatch,
    // One deploy with key: {result} or {error} (what the SDK threw).
    deploy: async (key, tag) => {
      try {
        return { result: await client.callTool({ name: "deploy",
          arguments: { env: "prod", tag }, _meta: { idempotencyKey: key } }) };
      } catch (e) {
        return { error: { message: String(e?.message ?? e), code: e?.code } };
      }
    },
    // Closes the client and waits for the proxy to exit.
    close: async () => {
      await client.close();
      return exited;
    },
  };
}

const idOf = (r) => r?.result?.structuredContent?.id;
const isId = (id) => typeof id === "string" && id.length > 0;

// The connection itself: the era and the proxy's capability.
function connected(s, era, what) {
  const c = s.client;
  eq(`${what}: era`, era, c.getProtocolEra());
  eq(`${what}: protocol version`, era === "modern" ? "2026-07-28" : "2025-11-25",
    c.getNegotiatedProtocolVersion());
  const cap = c.getServerCapabilities()?.experimental?.[CAP];
  check(`${what}: experimental["${CAP}"] in the server capabilities ` +
    `(${era === "modern" ? "server/discover" : "initialize"})`,
    cap?.keyLocations?.includes("params._meta.idempotencyKey") === true,
    JSON.stringify(c.getServerCapabilities()));
  check(`${what}: the server's own capabilities kept`,
    c.getServerCapabilities()?.tools !== undefined,
    JSON.stringify(c.getServerCapabilities()));
}

// 1 and 2: an accepted deploy acts once; retries replay its result.
async function confirmed(era, key) {
  const store = join(TMP, `${key}.db`);
  const tag = key;
  const s = await session(era, store);
  connected(s, era, `${era} ${key}`);

  const r1 = await s.deploy(key, tag);
  const id = idOf(r1);
  check(`${era} ${key}: deploy returns an id`, isId(id), JSON.stringify(r1));
  check(`${era} ${key}: first answer not marked replayed`, !replayed(r1.result),
    JSON.stringify(r1));
  eq(`${era} ${key}: the elicitation handler ran once`, 1, s.runs());
  let e = deploys(tag);
  eq(`${era} ${key}: one deploy effect`, 1, e.length);
  eq(`${era} ${key}: the effect is the id returned`, id, e[0]?.id);
  eq(`${era} ${key}: the key's record is completed`, "completed",
    record(store, "deploy", key)?.state);

  // The retry (a new tools/call, same key and arguments) is answered by the
  // proxy with the final result: not input_required, so the SDK's driver
  // does not ask the user again.
  const r2 = await s.deploy(key, tag);
  eq(`${era} ${key}: retry returns the same id`, id, idOf(r2));
  check(`${era} ${key}: retry marked idem/replayed`, replayed(r2.result),
    JSON.stringify(r2));
  check(`${era} ${key}: retry is the first result`,
    r2.result && isDeepStrictEqual(r1.result, unmarked(r2.result)),
    JSON.stringify({ r1, r2 }));
  eq(`${era} ${key}: retry: the handler did not run again`, 1, s.runs());
  e = deploys(tag);
  eq(`${era} ${key}: retry: still one deploy effect`, 1, e.length);
  eq(`${era} ${key}: retry: the effect is the id returned`, id, e[0]?.id);
  eq(`${era} ${key}: proxy exits 0`, { code: 0, signal: null }, await s.close());

  // Another client on another proxy (and another server process), the same
  // store: the stored result again.
  const s2 = await session(era, store);
  const r3 = await s2.deploy(key, tag);
  eq(`${era} ${key}: new session: same id`, id, idOf(r3));
  check(`${era} ${key}: new session: marked idem/replayed`, replayed(r3.result),
    JSON.stringify(r3));
  eq(`${era} ${key}: new session: the handler did not run`, 0, s2.runs());
  e = deploys(tag);
  eq(`${era} ${key}: new session: still one deploy effect`, 1, e.length);
  eq(`${era} ${key}: new session: the effect is the id`, id, e[0]?.id);
  await s2.close();
}

// 3a. The user declines: the server's answer is final (an isError result
// "not confirmed", no effect). It is the tool's outcome, so it is stored
// (--store-tool-errors yes): the retry replays the refusal and the user is
// not asked again. Deploying after all is a new intention: a new key.
async function declined(era, key) {
  const store = join(TMP, `${key}.db`);
  let answer = "decline";
  const s = await session(era, store, { answer: () => answer });
  const r1 = await s.deploy(key, key);
  check(`${era} ${key}: declined: an isError result`,
    r1.result?.isError === true && /not confirmed/.test(text(r1.result)),
    JSON.stringify(r1));
  eq(`${era} ${key}: declined: the handler ran once`, 1, s.runs());
  eq(`${era} ${key}: declined: no deploy effect`, 0, deploys(key).length);
  answer = "accept";
  const r2 = await s.deploy(key, key);
  check(`${era} ${key}: declined, retry: the refusal replayed`,
    replayed(r2.result) && r2.result?.isError === true &&
    isDeepStrictEqual(r1.result, unmarked(r2.result)), JSON.stringify(r2));
  eq(`${era} ${key}: declined, retry: the handler did not run`, 1, s.runs());
  eq(`${era} ${key}: declined, retry: no deploy effect`, 0, deploys(key).length);
  await s.close();
}

// 3b. modern: the user walks away at the input_required round (the handler
// throws, the SDK's callTool rejects, no next round is sent). The proxy
// keeps the key held (in progress) for --input-wait. The same client trying
// again with the same key and arguments sends a fresh first round (no
// inputResponses): the proxy lets it through as the held call's next round,
// the server asks again, the user accepts, it deploys once.
async function gaveUpStayed(key) {
  const store = join(TMP, `${key}.db`);
  let answer = "throw";
  const s = await session("modern", store, { answer: () => answer });
  const r1 = await s.deploy(key, key);
  check(`modern ${key}: gave up: the call fails at the client`,
    r1.error !== undefined && /walked away/.test(r1.error.message),
    JSON.stringify(r1));
  eq(`modern ${key}: gave up: no deploy effect`, 0, deploys(key).length);
  eq(`modern ${key}: gave up: the key is held`, "in_progress",
    record(store, "deploy", key)?.state);
  answer = "accept";
  const r2 = await s.deploy(key, key);
  const id = idOf(r2);
  check(`modern ${key}: again: deploy returns an id`, isId(id), JSON.stringify(r2));
  check(`modern ${key}: again: not a replay`, !replayed(r2.result), JSON.stringify(r2));
  eq(`modern ${key}: again: the user was asked again`, 2, s.runs());
  let e = deploys(key);
  eq(`modern ${key}: again: one deploy effect`, 1, e.length);
  eq(`modern ${key}: again: the effect is the id returned`, id, e[0]?.id);
  const r3 = await s.deploy(key, key);
  eq(`modern ${key}: retry: same id`, id, idOf(r3));
  check(`modern ${key}: retry: replayed`, replayed(r3.result), JSON.stringify(r3));
  eq(`modern ${key}: retry: the handler did not run`, 2, s.runs());
  e = deploys(key);
  eq(`modern ${key}: retry: still one deploy effect`, 1, e.length);
  eq(`modern ${key}: retry: the effect is the id`, id, e[0]?.id);
  await s.close();
}

// 3c. modern, --input-wait 300ms: the user walks away and the client stays
// connected; once the wait runs out the proxy frees the key (the tool has
// not acted) and says so; the next call with the key is a first call again.
async function gaveUpExpired(key) {
  const store = join(TMP, `${key}.db`);
  let answer = "throw";
  const s = await session("modern", store,
    { opts: ["--input-wait", "300ms"], answer: () => answer });
  const r1 = await s.deploy(key, key);
  check(`modern ${key}: gave up: the call fails at the client`,
    r1.error !== undefined, JSON.stringify(r1));
  const said = await s.stderrMatch(new RegExp(`key '${key}'.*released`));
  check(`modern ${key}: --input-wait ran out: the proxy says the key is released`,
    said, s.stderr());
  eq(`modern ${key}: --input-wait ran out: no record`, null,
    record(store, "deploy", key));
  eq(`modern ${key}: --input-wait ran out: no deploy effect`, 0,
    deploys(key).length);
  answer = "accept";
  const r2 = await s.deploy(key, key);
  const id = idOf(r2);
  check(`modern ${key}: again: deploy returns an id`, isId(id), JSON.stringify(r2));
  eq(`modern ${key}: again: the user was asked again`, 2, s.runs());
  let e = deploys(key);
  eq(`modern ${key}: again: one deploy effect`, 1, e.length);
  eq(`modern ${key}: again: the effect is the id returned`, id, e[0]?.id);
  const r3 = await s.deploy(key, key);
  eq(`modern ${key}: retry: same id`, id, idOf(r3));
  check(`modern ${key}: retry: replayed`, replayed(r3.result), JSON.stringify(r3));
  eq(`modern ${key}: retry: still one deploy effect`, 1, deploys(key).length);
  await s.close();
}

/*
 * 3d. The first client walks away at the confirmation and disconnects; a
 * second client (another proxy, the same store) retries with the same key
 * and arguments. What the first attempt left depends on the era:
 *  - modern: the call ended at the client with input_required outstanding;
 *    when the first proxy shuts down it frees the key (the tool has not
 *    acted): the second client is asked and deploys once.
 *  - legacy: the 2.x server's legacy shim turns the failed elicitation into
 *    a final isError result ("Fulfilling input required by 'tools/call'
 *    failed: ..."): the tool's outcome, stored by default, so the second
 *    client gets it replayed, is not asked, and nothing deploys. With
 *    --store-tool-errors no (storeToolErrors false below) the error frees
 *    the key and the second client deploys once.
 */
async function gaveUpLeft(era, key, storeToolErrors = true) {
  const store = join(TMP, `${key}.db`);
  const opts = storeToolErrors ? [] : ["--store-tool-errors", "no"];
  const what = `${era} ${key}`;
  const a = await session(era, store, { opts, answer: () => "throw" });
  const r1 = await a.deploy(key, key);
  if (era === "modern")
    check(`${what}: gave up: the call fails at the client`,
      r1.error !== undefined && /walked away/.test(r1.error.message),
      JSON.stringify(r1));
  else
    check(`${what}: gave up: the legacy shim answers an isError result`,
      r1.result?.isError === true && /walked away/.test(text(r1.result)),
      JSON.stringify(r1));
  eq(`${what}: gave up: the handler ran once`, 1, a.runs());
  eq(`${what}: gave up: no deploy effect`, 0, deploys(key).length);
  eq(`${what}: first proxy exits 0`, { code: 0, signal: null }, await a.close());
  const acts = era === "modern" || !storeToolErrors;
  eq(`${what}: after the first client: the key's record`,
    acts ? null : "completed", record(store, "deploy", key)?.state ?? null);
  if (era === "modern")
    check(`${what}: the first proxy says the key is released`,
      new RegExp(`key '${key}'.*released`).test(a.stderr()), a.stderr());

  const b = await session(era, store);
  const r2 = await b.deploy(key, key);
  if (acts) {
    const id = idOf(r2);
    check(`${what}: second client: deploy returns an id`, isId(id),
      JSON.stringify(r2));
    check(`${what}: second client: not a replay`, !replayed(r2.result),
      JSON.stringify(r2));
    eq(`${what}: second client: the user was asked`, 1, b.runs());
    let e = deploys(key);
    eq(`${what}: second client: one deploy effect`, 1, e.length);
    eq(`${what}: second client: the effect is the id returned`, id, e[0]?.id);
    const r3 = await b.deploy(key, key);
    eq(`${what}: second client, retry: same id`, id, idOf(r3));
    check(`${what}: second client, retry: replayed`, replayed(r3.result),
      JSON.stringify(r3));
    eq(`${what}: second client, retry: the handler did not run`, 1, b.runs());
    e = deploys(key);
    eq(`${what}: second client, retry: still one deploy effect`, 1, e.length);
    eq(`${what}: second client, retry: the effect is the id`, id, e[0]?.id);
  } else {
    check(`${what}: second client: the stored isError replayed`,
      replayed(r2.result) && r2.result?.isError === true &&
      isDeepStrictEqual(r1.result, unmarked(r2.result)), JSON.stringify(r2));
    check(`${what}: second client: no id`, idOf(r2) === undefined,
      JSON.stringify(r2));
    eq(`${what}: second client: the user was not asked`, 0, b.runs());
    eq(`${what}: second client: no deploy effect`, 0, deploys(key).length);
  }
  await b.close();
}

await confirmed("modern", "d-1");
await confirmed("legacy", "d-2");
await declined("modern", "d-3");
await declined("legacy", "d-4");
await gaveUpStayed("d-5");
await gaveUpExpired("d-6");
await gaveUpLeft("modern", "d-7");
await gaveUpLeft("legacy", "d-8");
await gaveUpLeft("legacy", "d-9", false);
finish();
