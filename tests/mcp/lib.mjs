// lib.mjs -- what the idem mcp tests share: MCP clients from the SDK that
// talk to a real server directly or through `idem mcp`, and checks that
// count.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";

export const HERE = dirname(fileURLToPath(import.meta.url));
export const IDEM = process.env.IDEM;
if (!IDEM) {
  console.error("IDEM (the path of the idem program) is not set");
  process.exit(2);
}
const pkg = (name) =>
  join(HERE, "node_modules", "@modelcontextprotocol", name, "dist", "index.js");
export const SERVERS = {
  filesystem: pkg("server-filesystem"),
  memory: pkg("server-memory"),
  everything: pkg("server-everything"),
  test: join(HERE, "test_server.mjs"),
  raw: join(HERE, "raw_server.mjs"),
};

let passed = 0;
let failed = 0;
export function check(what, ok, detail) {
  if (ok) passed++;
  else {
    failed++;
    console.error(`FAIL: ${what}${detail !== undefined ? ": " + detail : ""}`);
  }
}
export function eq(what, expected, actual) {
  check(what, isDeepStrictEqual(expected, actual),
    `expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
}
// What every proxy wrote to standard error, checked at the end for reports
// of the sanitizers (the ASan+UBSan build runs these tests too).
const stderrs = [];
export function watchStderr(get) { stderrs.push(get); }
const SANITIZER = /AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:/;
export function finish() {
  for (const get of stderrs) {
    const e = get();
    check("no sanitizer report", !SANITIZER.test(e), e);
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 && passed > 0 ? 0 : 1);
}

export const TMP = mkdtempSync(join(tmpdir(), "idem-mcp-test."));
process.on("exit", () => rmSync(TMP, { recursive: true, force: true }));
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/*
 * An SDK client on a server. With proxy (an array of idem mcp options) the
 * server runs behind `idem mcp OPTIONS -- node SERVER ARGS`; with proxy null
 * the client talks to the server directly. Returns {client, transport,
 * stderr()}: stderr() is what the proxy and the server wrote there.
 */
export async function connect({ server, args = [], proxy = null, env = {},
                                capabilities = {}, handlers = null }) {
  const cmd = proxy
    ? { command: IDEM, args: ["mcp", ...proxy, "--", "node", server, ...args] }
    : { command: "node", args: [server, ...args] };
  const transport = new StdioClientTransport({
    ...cmd, env: { ...process.env, ...env }, stderr: "pipe",
    maxBufferSize: 64 * 1024 * 1024, // the SDK's default, 10 MiB, is too small
    // for the 10 MB results of the tests
  });
  let err = "";
  transport.stderr.on("data", (d) => { err += d.toString(); });
  watchStderr(() => err);
  const client = new Client({ name: "idem-test", version: "1.0.0" },
    { capabilities });
  if (handlers) handlers(client);
  await client.connect(transport);
  // The child process, kept for its exit status (the transport forgets it).
  const proc = transport._process;
  return { client, transport, proc, stderr: () => err };
}

/*
 * One tools/call. key goes to params._meta.idempotencyKey (where: "meta"),
 * to params.idempotencyKey ("params"), or nowhere (key null). Returns
 * {result} or {error: {code, message, data}}.
 */
export async function call(client, name, args, { key = null, where = "meta",
  onprogress, signal, timeout = 60000 } = {}) {
  const params = { name, arguments: args };
  if (key !== null && where === "meta") params._meta = { idempotencyKey: key };
  if (key !== null && where === "params") params.idempotencyKey = key;
  try {
    const result = await client.request({ method: "tools/call", params },
      CallToolResultSchema, { onprogress, signal, timeout });
    return { result };
  } catch (e) {
    return { error: { code: e.code, message: e.message, data: e.data } };
  }
}

/* The result without the proxy's replay mark. */
export function unmarked(result) {
  const r = structuredClone(result);
  if (r._meta) {
    delete r._meta["idem/replayed"];
    if (Object.keys(r._meta).length === 0) delete r._meta;
  }
  return r;
}
export const replayed = (r) => r?._meta?.["idem/replayed"] === true;
export const text = (r) => r?.content?.map((c) => c.text).join("") ?? null;

/* `idem keys show KEY --operation OP --json` as an object, or null when
 * there is no such record. */
export function record(store, operation, key, tenant = "") {
  try {
    const out = execFileSync(IDEM, ["keys", "show", key, "--store", store,
      "--operation", operation, "--tenant", tenant, "--json"],
    { stdio: ["ignore", "pipe", "pipe"] });
    return JSON.parse(out.toString());
  } catch (e) {
    if (e.status === 1) return null;
    throw e;
  }
}
export function idem(...args) {
  return execFileSync(IDEM, args, { stdio: ["ignore", "pipe", "pipe"] })
    .toString();
}

let rawRuns = 0;
// startRaw(store, opts, env): idem mcp in front of raw_server.mjs, driven by
// lines written by hand: got (the lines the client got), log() (the lines
// the server read), until(cond, what), send(line), exited, err().
export function startRaw(store, opts = [], env = {}) {
  const logf = join(TMP, `raw-${++rawRuns}.log`);
  const p = spawn(IDEM, ["mcp", "--store", store, ...opts, "--", "node",
    SERVERS.raw], { env: { ...process.env, RAW_LOG: logf, ...env } });
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
  const log = () => existsSync(logf)
    ? readFileSync(logf, "utf8").split("\n").slice(0, -1) : [];
  const until = async (cond, what) => {
    for (let i = 0; i < 400 && !cond(); i++) await sleep(25);
    check(`waited for ${what}`, cond(), JSON.stringify({ got, log: log() }));
  };
  return { p, got, log, until, exited, err: () => err,
    send: (l) => p.stdin.write(l + "\n") };
}
const J = JSON.stringify;
// A keyed (key given) or unkeyed tools/call line.
export const rawCall = (id, name, args, key) => J({ jsonrpc: "2.0", id,
  method: "tools/call", params: { name, arguments: args,
    ...(key !== undefined ? { _meta: { idempotencyKey: key } } : {}) } });
// The lines as JSON where they are JSON.
export const rawParsed = (got) => got.map((l) => { try { return JSON.parse(l); } catch { return l; } });
// The response with this id.
export const rawAnswer = (got, id) => rawParsed(got).find((m) => m && m.id === id && !m.method);
