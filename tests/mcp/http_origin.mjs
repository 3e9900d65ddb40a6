// idem mcp --listen against DNS rebinding and foreign pages, as the MCP
// transport asks of a server: a request with an Origin the proxy does not
// allow, or (on a loopback listener) a Host that is not a loopback name,
// is refused 403 before anything is claimed, forwarded or replayed. A
// keyed call's replay is the case that matters: another page must not
// read it. --allow-origin lets a named origin in; PORT and :PORT alone
// listen on the loopback. Only the server's MCP endpoint and its OAuth
// metadata are proxied, not the rest of its origin. The initialize answer
// carries the idem/idempotency capability, as over stdio.
import { request } from "node:http";
import { join } from "node:path";
import { TMP, check, eq, finish, text } from "./lib.mjs";
import { callTool, connectHttp, startProxy, startServer } from "./http_lib.mjs";

const J = JSON.stringify;
// A POST with the headers given as is (node's http lets a test set Host).
function post(port, msg, headers = {}) {
  const body = J(msg);
  return new Promise((resolve, reject) => {
    const r = request({ host: "127.0.0.1", port, path: "/mcp", method: "POST",
      headers: { "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-protocol-version": "2025-11-25",
        "content-length": Buffer.byteLength(body), ...headers } }, (res) => {
      let got = "";
      res.on("data", (d) => (got += d));
      res.on("end", () => resolve({ status: res.statusCode, body: got }));
    });
    r.on("error", reject);
    r.end(body);
  });
}
const call = (id, key, title = "secret") => ({ jsonrpc: "2.0", id, method: "tools/call",
  params: { name: "create_ticket", arguments: { title },
    _meta: { idempotencyKey: key } } });
const ticket = (r) => (r.body.match(/ticket-\d+/) ?? [null])[0];

const s = await startServer({ stateless: true, sdk: "2" });
const effects = async () => (await s.effects()).effects.create_ticket;
{
  const p = await startProxy(s.url, join(TMP, "origin.db"));
  const own = `http://127.0.0.1:${p.port}`;
  const first = await post(p.port, call(1, "o-1"), { host: `127.0.0.1:${p.port}` });
  eq("no Origin (not a browser): the call is made", [200, "ticket-1", 1],
    [first.status, ticket(first), await effects()]);

  const tries = [
    ["a foreign page", { host: `127.0.0.1:${p.port}`, origin: "http://evil.example" }, 403],
    ["a foreign page over https", { host: `127.0.0.1:${p.port}`, origin: "https://evil.example" }, 403],
    ["a loopback page on another port", { host: `127.0.0.1:${p.port}`, origin: "http://localhost:1" }, 403],
    ["DNS rebinding (a foreign Host)", { host: `evil.example:${p.port}` }, 403],
    ["DNS rebinding, with its own Origin", { host: `evil.example:${p.port}`, origin: `http://evil.example:${p.port}` }, 403],
    ["the listener's own origin", { host: `127.0.0.1:${p.port}`, origin: own }, 200],
    ["localhost", { host: `localhost:${p.port}`, origin: `http://localhost:${p.port}` }, 200],
  ];
  let id = 2;
  for (const [what, headers, want] of tries) {
    const r = await post(p.port, call(id++, "o-1"), headers);
    eq(`${what}: ${want}`, want, r.status);
    if (want === 403) {
      check(`${what}: nothing replayed`, ticket(r) === null && /-32600/.test(r.body), r.body);
    } else {
      eq(`${what}: the replay`, "ticket-1", ticket(r));
    }
  }
  eq("the server acted once", 1, await effects());
  // A replay needs what the server needs of a live call: a JSON body, an
  // Accept of both answer types, a protocol version it knows.
  const hostOnly = { host: `127.0.0.1:${p.port}` };
  const bad = [
    ["a text/plain body", { ...hostOnly, "content-type": "text/plain" }, 415],
    ["Accept without event streams", { ...hostOnly, accept: "application/json" }, 406],
    ["no Accept", { ...hostOnly, accept: "" }, 406],
    ["an unknown protocol version", { ...hostOnly, "mcp-protocol-version": "1999-01-01" }, 400],
  ];
  for (const [what, headers, want] of bad) {
    const r = await post(p.port, call(id++, "o-1"), headers);
    eq(`${what}: ${want}, nothing replayed`, [want, null], [r.status, ticket(r)]);
  }
  // Only the MCP endpoint and the OAuth metadata are proxied: another
  // page of the server's (its /effects here, an /admin elsewhere) is not.
  const get = async (path) => {
    const r = await fetch(`${p.base}${path}`);
    return [r.status, (await r.text()).includes("this proxy serves")];
  };
  eq("another path of the server's: 404 from the proxy", [404, true], await get("/effects"));
  eq("the server's page, straight: there", 200, (await fetch(`${s.base}/effects`)).status);
  eq("OAuth metadata: passed on (the server's own answer)", false,
    (await get("/.well-known/oauth-protected-resource/mcp"))[1]);
  const fresh = await post(p.port, call(20, "o-2"), { host: `127.0.0.1:${p.port}`, origin: "http://evil.example" });
  eq("a foreign page's new call: refused, never forwarded", [403, 1], [fresh.status, await effects()]);
  await p.kill();
}
{
  const p = await startProxy(s.url, join(TMP, "allow.db"),
    ["--listen", ":0", "--allow-origin", "https://app.example"]);
  check("--listen :0: on the loopback", /^http:\/\/127\.0\.0\.1:/.test(p.base), p.base);
  const ok = await post(p.port, call(1, "a-1"), { host: `127.0.0.1:${p.port}`, origin: "https://app.example" });
  const no = await post(p.port, call(2, "a-1"), { host: `127.0.0.1:${p.port}`, origin: "https://app.example.evil" });
  eq("--allow-origin: the named origin in, another out", [200, 403], [ok.status, no.status]);
  eq("--allow-origin: one more effect", 2, await effects());
  await p.kill();
}
// The idem/idempotency capability, in the initialize answer over HTTP as
// over stdio, whether the server answers it as JSON or as an event stream;
// the session the server gave goes on with it, and calls work after.
for (const cfg of [{ sdk: "1" }, { sdk: "1", json: true }, { sdk: "2" }]) {
  const srv = await startServer({ ...cfg, stateless: cfg.sdk === "2" });
  const p = await startProxy(srv.url, join(TMP, `caps-${cfg.sdk}-${!!cfg.json}.db`),
    ["--attach-wait", "7s"]);
  const { client, sessionId } = await connectHttp(p.url, { sdk: cfg.sdk });
  const cap = client.getServerCapabilities()?.experimental?.["idem/idempotency"];
  const T = (w) => `capability (sdk ${cfg.sdk}${cfg.json ? ", json" : ""}): ${w}`;
  eq(T("announced"), [true, "idem/replayed", 7000],
    [cap?.keyLocations?.includes("params._meta.idempotencyKey"), cap?.replayedMeta, cap?.attachWaitMs]);
  eq(T("the server's own capabilities kept"), true,
    client.getServerCapabilities()?.tools !== undefined);
  if (cfg.sdk === "1" && !cfg.json) check(T("the session kept"), !!sessionId(), "no session id");
  const r = await callTool({ client, sdk: cfg.sdk }, "create_ticket", { title: "c" }, { key: "cap-1" });
  check(T("a keyed call after it"), /ticket-/.test(text(r.result) ?? ""), JSON.stringify(r));
  if (cfg.sdk === "1" && !cfg.json) {
    // A session the server ended: its replay is refused as the server
    // refuses the session (404), never answered from the store.
    const sid = sessionId();
    const live = await post(p.port, call(30, "cap-1", "c"), { host: `127.0.0.1:${p.port}`, "mcp-session-id": sid });
    check("a live session: its replay", live.status === 200 && /idem\/replayed/.test(live.body), live.body);
    const del = await fetch(p.url, { method: "DELETE", headers: { "mcp-session-id": sid,
      "mcp-protocol-version": "2025-11-25" } });
    check("the session ended at the server", del.status >= 200 && del.status < 300, String(del.status));
    const after = await post(p.port, call(31, "cap-1", "c"), { host: `127.0.0.1:${p.port}`, "mcp-session-id": sid });
    eq("an ended session: 404, nothing replayed", [404, false], [after.status, /idem\/replayed/.test(after.body)]);
  }
  await client.close();
  await p.kill();
  await srv.kill();
}
// A call of 200 KB is read by a fingerprint worker, off the loop every
// stream runs on: it acts once, its retry replays, another argument
// conflicts.
{
  const srv = await startServer({ stateless: true, sdk: "2" });
  const p = await startProxy(srv.url, join(TMP, "big.db"));
  const hostOnly = { host: `127.0.0.1:${p.port}` };
  const big = "x".repeat(200 * 1024);
  const b1 = await post(p.port, call(1, "o-big", big), hostOnly);
  const b2 = await post(p.port, call(2, "o-big", big), hostOnly);
  const b3 = await post(p.port, call(3, "o-big", big + "y"), hostOnly);
  eq("a 200 KB call: acts, replays the same ticket, another argument conflicts",
    [200, true, true, -31901, 1],
    [b1.status, ticket(b1) !== null && ticket(b1) === ticket(b2),
      /idem\/replayed/.test(b2.body), JSON.parse(b3.body)?.error?.code,
      (await srv.effects()).effects.create_ticket]);
  await p.kill();
  await srv.kill();
}
finish();
