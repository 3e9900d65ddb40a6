// idem mcp with the test server: the server killed mid-call and the proxy
// restarted (unknown until the lease ends, then RECOVER; or refused with
// --on-unknown fail until resolved), a JSON-RPC error that frees the key,
// --key-argument, and a result larger than --max-result.
//
// `node crash.mjs` uses an SQLite store; `node crash.mjs postgresql` the
// PostgreSQL server named by IDEM_TEST_PG_URL (a failure without one), with
// a tenant of its own so that runs sharing the server never meet.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, idem, record,
  replayed, sleep, text, unmarked } from "./lib.mjs";

const onPg = process.argv[2] === "postgresql";
if (onPg && !process.env.IDEM_TEST_PG_URL) {
  console.error("IDEM_TEST_PG_URL is not set: no PostgreSQL server for this test");
  process.exit(1);
}
const store = onPg ? process.env.IDEM_TEST_PG_URL : join(TMP, "idem.db");
const tenant = onPg ? `mcp-crash-${process.pid}-${Date.now()}` : "";
const rec = (op, key) => record(store, op, key, tenant);
const lines = (f) => existsSync(f)
  ? readFileSync(f, "utf8").split("\n").filter((l) => l) : [];
const waitFor = async (cond, what) => {
  for (let i = 0; i < 400 && !cond(); i++) await sleep(25);
  check(`waited for ${what}`, cond());
};
const test = (proxy) => connect({ server: SERVERS.test,
  proxy: ["--tenant", tenant, ...proxy] });

// A JSON-RPC error from the server: the tool never ran, the key is freed.
{
  const { client } = await test(["--store", store]);
  const r1 = await call(client, "reject", { n: 1 }, { key: "rej-1" });
  eq("rpc error: passed on", -32602, r1.error?.code);
  check("rpc error: the server's message", /always refused/.test(r1.error?.message));
  eq("rpc error: no record kept", null, rec("reject", "rej-1"));
  const r2 = await call(client, "reject", { n: 2 }, { key: "rej-1" });
  eq("rpc error: the same key with other arguments reaches the server",
    -32602, r2.error?.code);
  await client.close();
}

// --key-argument: the key is a tool argument and stays in the arguments
// (--keep-requests: the arguments kept in the record, without the key).
{
  const f = join(TMP, "keyarg.txt");
  const { client } = await test(["--store", store, "--key-argument",
    "idempotency_key", "--keep-requests"]);
  const exp = client.getServerCapabilities()?.experimental?.["idem/idempotency"];
  check("key-argument: announced", exp?.keyLocations?.includes(
    "params.arguments.idempotency_key"), JSON.stringify(exp));
  const args = { file: f, text: "a", idempotency_key: "ka-1" };
  const r1 = await call(client, "append", args);
  const r2 = await call(client, "append", args);
  eq("key-argument: appended once", ["a"], lines(f));
  check("key-argument: forwarded in the arguments",
    text(r1.result)?.includes('"idempotency_key":"ka-1"'), text(r1.result));
  check("key-argument: replayed", !replayed(r1.result) && replayed(r2.result));
  eq("key-argument: same result", r1.result, unmarked(r2.result));
  eq("key-argument: the stored request has no key", { name: "append",
    arguments: { file: f, text: "a" } },
  JSON.parse(rec("append", "ka-1").request));
  const r3 = await call(client, "append", { ...args, text: "b" });
  eq("key-argument: other arguments refused", -31901, r3.error?.code);
  const r4 = await call(client, "append", { file: f, text: "c" });
  eq("key-argument: no key, acts", ["a", "c"], lines(f));
  check("key-argument: no key, not replayed", !replayed(r4.result));
  await client.close();
}

// A result larger than --max-result: passed on, not stored, marked unknown,
// logged.
{
  const { client, stderr } = await test(["--store", store, "--max-result", "1k"]);
  const r1 = await call(client, "big", { bytes: 5000 }, { key: "big-1" });
  eq("max-result: passed on whole", 5000, text(r1.result)?.length);
  check("max-result: not marked replayed", !replayed(r1.result));
  const big = rec("big", "big-1");
  eq("max-result: marked unknown", "unknown", big?.state);
  eq("max-result: nothing stored", undefined, big?.response ?? undefined);
  check("max-result: logged", /larger than --max-result/.test(stderr()), stderr());
  const r2 = await call(client, "big", { bytes: 5000 }, { key: "big-1" });
  eq("max-result: a retry is told the outcome is unknown", -31903, r2.error?.code);
  // Not even after a lease: the tool ran; only an operator may free it.
  const { client: c2 } = await test(["--store", store, "--max-result", "1k",
    "--lease", "1s"]);
  const b1 = await call(c2, "big", { bytes: 5000 }, { key: "big-3" });
  eq("max-result, short lease: passed on", 5000, text(b1.result)?.length);
  await sleep(1300);
  const b2 = await call(c2, "big", { bytes: 5000 }, { key: "big-3" });
  eq("max-result: after the lease still unknown, not sent again", -31903,
    b2.error?.code);
  check("max-result: the message names idem keys resolve",
    /idem keys resolve/.test(b2.error?.message ?? ""), b2.error?.message);
  await c2.close();
  const r3 = await call(client, "big", { bytes: 500 }, { key: "big-2" });
  const r4 = await call(client, "big", { bytes: 500 }, { key: "big-2" });
  check("max-result: a smaller result is stored", replayed(r4.result) &&
    text(r4.result).length === 500 && !replayed(r3.result));
  await client.close();
}

// The test server's pid, as it wrote it beside f. Never 0 or less: kill()
// of those signals a whole process group (this test's, and whatever runs
// it).
function serverPid(f) {
  const pid = Number(readFileSync(f + ".pid", "utf8"));
  if (!Number.isInteger(pid) || pid <= 0)
    throw new Error(`${f}.pid holds no pid: ${JSON.stringify(readFileSync(f + ".pid", "utf8"))}`);
  return pid;
}

// The server killed mid-call; the proxy restarted; the retry.
async function crash(mode, key) {
  const f = join(TMP, `crash-${mode}.txt`);
  // The lease must outlast starting a second proxy and its server on a
  // loaded machine (4 s did not, under ASan beside two busy cores).
  const opts = ["--store", store, "--lease", "8s", "--on-unknown", mode];
  const args = { file: f, text: "one", delay_ms: 3000 };
  const a = await test(opts);
  const pending = call(a.client, "append", args, { key });
  await waitFor(() => existsSync(f + ".pid"), `${mode}: the call to start`);
  const pid = serverPid(f);
  process.kill(pid, "SIGKILL");
  const r1 = await pending;
  eq(`${mode}: the killed call's answer`, -31903, r1.error?.code);
  check(`${mode}: it says the server exited`, /exited before answering/.test(
    r1.error?.message ?? ""), r1.error?.message);
  await waitFor(() => a.proc.exitCode !== null || a.proc.signalCode !== null,
    `${mode}: the proxy to exit`);
  eq(`${mode}: the proxy exits with the server's status`, 128 + 9,
    a.proc.exitCode);
  eq(`${mode}: acted once`, ["one"], lines(f));
  eq(`${mode}: key held in progress`, "in_progress", rec("append", key)?.state);

  // --attach-wait 0: a retry is told at once, not made to wait out the
  // lease (the proxy-killed case below waits).
  const b = await test([...opts, "--attach-wait", "0"]);
  const r2 = await call(b.client, "append", args, { key });
  eq(`${mode}: retry at once: in flight`, -31902, r2.error?.code);
  check(`${mode}: the in-flight message promises no result`,
    /another attempt/.test(r2.error?.message ?? "") &&
    !/still running at the server/.test(r2.error?.message ?? ""), r2.error?.message);
  eq(`${mode}: nothing acted`, ["one"], lines(f));
  if (mode === "forward") {
    const wait = r2.error?.data?.retryAfterMs;
    check("forward: retryAfterMs within the lease", wait > 0 && wait <= 8000, wait);
    await sleep(wait + 100);
    const r3 = await call(b.client, "append", { ...args, text: "two" }, { key });
    eq("forward: other arguments still conflict", -31901, r3.error?.code);
    const r4 = await call(b.client, "append", args, { key });
    check("forward: after the lease the retry is sent again",
      r4.result && !replayed(r4.result), JSON.stringify(r4));
    eq("forward: its result says an earlier attempt may have acted", true,
      r4.result?._meta?.["idem/recovered"]);
    eq("forward: acted again after RECOVER", ["one", "one"], lines(f));
    check("forward: RECOVER logged", /sending the call again/.test(b.stderr()),
      b.stderr());
    const r5 = await call(b.client, "append", args, { key });
    check("forward: then replays", replayed(r5.result));
    eq("forward: the replay is the recovered result", r4.result, unmarked(r5.result));
  } else {
    await sleep((r2.error?.data?.retryAfterMs ?? 4000) + 200);
    const r3 = await call(b.client, "append", args, { key });
    eq("fail: still refused after the lease", -31903, r3.error?.code);
    check("fail: the message names idem keys resolve",
      /idem keys resolve/.test(r3.error?.message ?? ""), r3.error?.message);
    eq("fail: nothing acted", ["one"], lines(f));
    idem("keys", "resolve", key, "--store", store, "--operation", "append",
      "--tenant", tenant, "--failed");
    const r4 = await call(b.client, "append", args, { key });
    check("fail: after resolve the call acts", r4.result && !replayed(r4.result),
      JSON.stringify(r4));
    eq("fail: acted again", ["one", "one"], lines(f));
    const r5 = await call(b.client, "append", args, { key });
    check("fail: then replays", replayed(r5.result));
  }
  await b.client.close();
}
// The proxy itself killed mid-call: the record stays in progress until its
// lease runs out (the server is stopped with it), then a retry RECOVERs.
{
  const f = join(TMP, "proxy-killed.txt");
  const opts = ["--store", store, "--lease", "6s"];
  const args = { file: f, text: "one", delay_ms: 3000 };
  const a = await test(opts);
  const pending = call(a.client, "append", args, { key: "pk-1" });
  await waitFor(() => existsSync(f + ".pid"), "proxy killed: the call to start");
  const pid = serverPid(f);
  a.proc.kill("SIGKILL");
  const r1 = await pending;
  check("proxy killed: the client lost the connection", r1.error !== undefined);
  // Stopped: no such process, or a zombie that its new parent (whatever
  // reaps orphans on this machine) has not reaped yet.
  const gone = () => {
    try { process.kill(pid, 0); } catch { return true; }
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2)[0] === "Z";
    } catch { return true; }
  };
  await waitFor(gone, "proxy killed: the server to be stopped with it");
  eq("proxy killed: in progress", "in_progress", rec("append", "pk-1")?.state);
  // The retry waits (--attach-wait, 25 s by default) for the dead
  // holder's lease to end, takes the key over and sends the call again:
  // its result says that an earlier attempt may have acted, and so do its
  // replays.
  const b = await test(opts);
  const r2 = await call(b.client, "append", args, { key: "pk-1" });
  check("proxy killed: the retry waited out the lease and was sent again",
    r2.result && !replayed(r2.result), JSON.stringify(r2));
  eq("proxy killed: the result is marked recovered", true,
    r2.result?._meta?.["idem/recovered"]);
  eq("proxy killed: acted again", ["one", "one"], lines(f));
  const r3 = await call(b.client, "append", args, { key: "pk-1" });
  eq("proxy killed: the replay is marked replayed and recovered", [true, true],
    [r3.result?._meta?.["idem/replayed"], r3.result?._meta?.["idem/recovered"]]);
  await b.client.close();
}

await crash("forward", "crash-f-1");
await crash("fail", "crash-x-1");
finish();
