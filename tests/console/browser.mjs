// browser.mjs -- idem console in a real browser: Debian's chromium, headless,
// driven by puppeteer-core (pinned in package-lock.json).
//
// A store seeded by seed.c (completed records, three unknown outcomes, one
// in progress, one recovered, and records whose tenant, operation, key,
// request and answer are markup). The operator logs in (a wrong token
// first), filters the unknown outcomes, cancels one action, resolves one
// record as completed through the confirmation dialog, watches the count
// of unknown outcomes fall, opens the record again, and opens the hostile
// records: their text must appear as text, no element may be made of it
// and no alert may fire (once more with the page's CSP bypassed, so that
// the page's own escaping is what is tested). The audit log, `idem keys`
// and the JSON API must agree with what the page did, and nothing else in
// the store may have changed.
//
// Environment: IDEM (the idem program), IDEM_CONSOLE_SEED (seed.c's
// program), CHROMIUM (default /usr/bin/chromium). Every wait has a bound;
// the first wrong answer ends the test with what was expected.
import { execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import puppeteer from "puppeteer-core";

const IDEM = process.env.IDEM;
const SEED = process.env.IDEM_CONSOLE_SEED;
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
for (const [name, v] of [["IDEM", IDEM], ["IDEM_CONSOLE_SEED", SEED]]) {
  if (!v) {
    console.error(`${name} is not set`);
    process.exit(2);
  }
}
if (!existsSync(CHROMIUM)) {
  console.error(`${CHROMIUM} is missing: apt-get install chromium ` +
    "(scripts/deps.sh check installs it)");
  process.exit(1);
}

const started = Date.now();
const TMP = mkdtempSync(join(tmpdir(), "idem-console-test."));
let consoleProc = null;
let browser = null;
process.on("exit", () => {
  if (consoleProc && consoleProc.exitCode === null) consoleProc.kill("SIGKILL");
  rmSync(TMP, { recursive: true, force: true });
});

// --- Checks: each prints what it checked; the first failure ends the test.
let passed = 0;
async function bail(msg) {
  console.error(`FAIL: ${msg}`);
  if (crashes.length || /frame was detached|Target closed|crash/i.test(msg))
    console.error(`chromium's page crashed? ${crashes.join("; ")} (without ` +
      "any font it does: fonts-liberation gives it one)");
  if (consoleErr) console.error(`idem console's stderr:\n${consoleErr}`);
  try { if (browser) await browser.close(); } catch { /* already gone */ }
  console.log(`${passed} passed, 1 failed`);
  process.exit(1);
}
class Failure extends Error {}
function check(what, ok, detail) {
  if (!ok) throw new Failure(`${what}${detail !== undefined ? ": " + detail : ""}`);
  passed++;
  console.log(`ok ${passed} - ${what}`);
}
const show = (v) => JSON.stringify(v);
function eq(what, expected, actual) {
  check(what, isDeepStrictEqual(expected, actual),
    `expected ${show(expected)}, got ${show(actual)}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Polls get() until ok(value); the last value in the failure. Returns the
// value and how long it took.
async function waitFor(what, get, ok, ms = 10000) {
  const t0 = Date.now();
  let v;
  for (;;) {
    try { v = await get(); } catch (e) { v = `(error: ${e.message})`; }
    if (ok(v)) break;
    if (Date.now() - t0 > ms)
      throw new Failure(`${what}: not within ${ms} ms; last seen ${show(v)}`);
    await sleep(50);
  }
  check(`${what} (${Date.now() - t0} ms)`, true);
  return v;
}

// --- The store -----------------------------------------------------------
const DB = join(TMP, "console.db");
const STORE = `sqlite:${DB}`;
const seeded = execFileSync(SEED, [STORE], { encoding: "utf8" })
  .trim().split("\n").map((l) => JSON.parse(l));
const HOSTILE_KEY = "<script>alert(1)</script>";
const HOSTILE_BODY = "<script>alert(2)</script><img src=x onerror=alert(3)>";
const HOSTILE_UNKNOWN_KEY = '<img/src="x"/onerror="alert(4)">';
const hostile = seeded.find((r) => r.key === HOSTILE_KEY);
const unknowns = seeded.filter((r) => r.state === "unknown");
const target = seeded.find((r) => r.key === "lost-1");
const OPERATOR = "ada.ops";
const RESOLVE_STATUS = 201;
const RESOLVE_BODY = '{"charge":"ch_by_hand","note":"<b>checked</b>"}';

// Every record, as `idem keys list --json` prints it, by identifier.
const idOf = (r) => show([r.tenant, r.operation, r.key]);
function keysList() {
  const out = execFileSync(IDEM, ["keys", "list", "--store", STORE, "--json"],
    { encoding: "utf8" });
  return new Map(out.trim().split("\n").map((l) => JSON.parse(l))
    .map((r) => [idOf(r), r]));
}
const before = keysList();

// --- The console ---------------------------------------------------------
const TOKEN = randomBytes(24).toString("hex");
const TOKEN_FILE = join(TMP, "token");
writeFileSync(TOKEN_FILE, TOKEN + "\n", { mode: 0o600 });
const AUDIT = join(TMP, "audit.log");
let consoleErr = "";
let BASE;
try {
  BASE = await new Promise((resolve, reject) => {
    consoleProc = spawn(IDEM, ["console", "--store", STORE, "--listen",
      "127.0.0.1:0", "--token-file", TOKEN_FILE, "--audit-log", AUDIT],
    { stdio: ["ignore", "ignore", "pipe"] });
    const timer = setTimeout(() => reject(new Failure(
      "idem console did not say it listens within 20 s")), 20000);
    consoleProc.stderr.on("data", (d) => {
      consoleErr += d.toString();
      const m = /idem console: listening on (http:\/\/127\.0\.0\.1:(\d+))[ \n]/
        .exec(consoleErr);
      if (m && m[2] !== "0") {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    consoleProc.on("exit", (code) => {
      clearTimeout(timer);
      reject(new Failure(`idem console exited (${code}) before listening`));
    });
  });
} catch (e) {
  await bail(e.message);
}
check(`idem console listens on ${BASE}`, true);

// The JSON API with the token, for what the page should show.
async function api(path) {
  const r = await fetch(BASE + path,
    { headers: { Authorization: `Bearer ${TOKEN}` } });
  if (r.status !== 200) throw new Failure(`GET ${path}: ${r.status}`);
  return r.json();
}
const showPath = (r) => "/api/records/show?" + new URLSearchParams(
  { tenant: r.tenant, operation: r.operation, key: r.key });

// --- The browser ---------------------------------------------------------
const dialogs = []; // alert/confirm/prompt: none may ever fire
const cspViolations = [];
const pageErrors = [];
const crashes = [];

// Before any script of the page: a record of every element added to the
// document, even for a moment, that the store's markup would make: an
// element with an event handler (<img onerror>, <svg onload>), a script
// without src, an image or a frame, or the <b> of the answer given. The
// page's own <script src> and its charts' <svg> are not suspect.
const WATCH = () => {
  window.__idemAdded = [];
  const suspect = (el) => {
    const tag = el.tagName;
    if (["IMG", "IFRAME", "OBJECT", "EMBED", "B"].includes(tag)) return true;
    if (tag === "SCRIPT" && !el.hasAttribute("src")) return true;
    return [...el.attributes].some((a) => /^on/i.test(a.name));
  };
  new MutationObserver((records) => {
    for (const m of records)
      for (const n of m.addedNodes) {
        if (n.nodeType !== 1) continue;
        for (const el of [n, ...n.querySelectorAll("*")])
          if (suspect(el)) window.__idemAdded.push(el.outerHTML.slice(0, 200));
      }
  }).observe(document, { childList: true, subtree: true });
};

async function newPage(bypassCsp) {
  const page = await browser.newPage();
  if (bypassCsp) await page.setBypassCSP(true);
  await page.evaluateOnNewDocument(WATCH);
  page.on("dialog", async (d) => {
    dialogs.push(`${d.type()}: ${d.message()}`);
    await d.dismiss().catch(() => {});
  });
  page.on("console", (m) => {
    if (/Content.Security.Policy/i.test(m.text())) cspViolations.push(m.text());
  });
  page.on("pageerror", (e) => pageErrors.push(e.message));
  // A renderer that crashes (seen when the machine has no font at all).
  page.on("error", (e) => { crashes.push(e.message); });
  return page;
}
const text = (page, sel) => page.$eval(sel, (e) => e.textContent.trim())
  .catch(() => null);
const rowsOf = (page, table) => page.$$eval(`${table} tbody tr`, (trs) =>
  trs.map((tr) => {
    const cell = (c) => tr.querySelector(`td.${c}`)?.textContent ?? null;
    return { key: cell("key"), operation: cell("operation"),
      tenant: cell("tenant"), age: cell("age"),
      record: tr.classList.contains("record") };
  }));
const noThreat = async (page, where) => {
  const added = await page.evaluate(() => window.__idemAdded);
  eq(`${where}: no element that runs script was made of store text`,
    [], added);
  const handlers = await page.evaluate(() => [...document.querySelectorAll("*")]
    .filter((e) => [...e.attributes].some((a) => /^on/i.test(a.name))
      || (e.tagName === "SCRIPT" && !e.hasAttribute("src"))
      || ["IMG", "IFRAME", "OBJECT", "EMBED", "B"].includes(e.tagName))
    .map((e) => e.outerHTML.slice(0, 200)));
  eq(`${where}: no inline script, event handler, img, frame or <b> in the DOM`,
    [], handlers);
  eq(`${where}: no alert, confirm or prompt fired`, [], dialogs);
};
// Applies the filters (empty strings: no filter) and waits for the
// records table to show want(rows).
async function filter(page, f, what, want) {
  await page.select("#filter-state", f.state ?? "");
  for (const [id, v] of [["#filter-operation", f.operation],
    ["#filter-tenant", f.tenant], ["#filter-prefix", f.prefix]]) {
    await page.$eval(id, (e, v) => { e.value = v; }, v ?? "");
  }
  await page.click("#filter-apply");
  return waitFor(`filter ${what}`, () => rowsOf(page, "#records"), want);
}
const keySet = (rows) => rows.map((r) => r.key).sort();
// Clicks the records row of key and waits for #detail to show it.
async function open(page, key) {
  const clicked = await page.$$eval("#records tbody tr.record", (trs, key) => {
    const tr = trs.find((t) => t.querySelector("td.key")?.textContent === key);
    if (tr) tr.click();
    return !!tr;
  }, key);
  check(`a row of the records table holds ${show(key)}`, clicked);
  await waitFor(`#detail shows ${show(key)}`, () => page.evaluate(() => {
    const d = document.querySelector("#detail");
    const k = document.querySelector("#detail-key");
    return d && k && d.checkVisibility() ? k.textContent : null;
  }), (v) => v === key);
}
async function confirmDialog(page, button, answer, what) {
  await page.click(button);
  const t = await waitFor(`${what}: dialog#confirm opens`, () => page.evaluate(
    () => {
      const d = document.querySelector("dialog#confirm");
      return d && d.open ? document.querySelector("#confirm-text").textContent
        : null;
    }), (v) => typeof v === "string");
  check(`${what}: #confirm-text says what will be done`, t.trim() !== "", t);
  await page.click(answer);
  await waitFor(`${what}: dialog#confirm closes`, () => page.evaluate(
    () => document.querySelector("dialog#confirm").open), (v) => v === false);
  return t;
}

try {
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    userDataDir: join(TMP, "profile"),
    // root has no sandbox; /dev/shm may be small in a container
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
      "--no-first-run"],
    timeout: 60000,
  });
  check(`${CHROMIUM} started (${await browser.version()})`, true);
  const page = await newPage(false);
  page.setDefaultTimeout(15000);

  // Login: a wrong token, then the right one.
  let resp = await page.goto(BASE + "/", { waitUntil: "load" });
  check("GET / without a session: the login form",
    await page.$("form#login") && await page.$("input#operator")
    && await page.$("input#token[type=password]")
    && await page.$("button#login-submit"), await page.content());
  check("the login page shows no record", !(await page.content())
    .includes("lost-1"));
  await page.type("#operator", OPERATOR);
  await page.type("#token", TOKEN.slice(0, -1) + "x");
  [resp] = await Promise.all([page.waitForNavigation(),
    page.click("#login-submit")]);
  // (A browser posts the form with the Origin its Referrer-Policy lets it
  // send: "null" under no-referrer.)
  check("a wrong token: 401", resp.status() === 401,
    `${resp.status()} ${await resp.text()}; the POST's Origin: ` +
    `${resp.request().headers().origin}`);
  check("a wrong token: #login-error says so",
    (await text(page, "#login-error")) !== null
    && await page.$eval("#login-error", (e) => e.checkVisibility()));
  eq("a wrong token: no session cookie", undefined,
    (await page.cookies()).find((c) => c.name === "idem_console"));
  await page.$eval("#operator", (e) => { e.value = ""; });
  await page.type("#operator", OPERATOR);
  await page.type("#token", TOKEN);
  [resp] = await Promise.all([page.waitForNavigation(),
    page.click("#login-submit")]);
  eq("login: 303 to /, then the console's page",
    [[303], BASE + "/", 200],
    [resp.request().redirectChain().map((r) => r.response()?.status()),
      page.url(), resp.status()]);
  const cookie = (await page.cookies()).find((c) => c.name === "idem_console");
  check("login: cookie idem_console, HttpOnly, SameSite=Strict, Path=/",
    cookie && cookie.httpOnly && cookie.sameSite === "Strict"
    && cookie.path === "/", show(cookie));

  // The counts, against the API.
  const metrics = await api("/api/metrics");
  eq("API metrics: the seeded unknown and in-progress records",
    [3, 1], [metrics.records.unknown, metrics.records.in_progress]);
  eq("API metrics: one recovered record", 1, metrics.records.recovered);
  for (const s of ["unknown", "in_progress", "completed", "recovered"])
    await waitFor(`#count-${s} shows ${metrics.records[s]}`,
      () => text(page, `#count-${s}`), (v) => v === String(metrics.records[s]));

  // The unknown outcomes panel.
  const panel = await waitFor("#unknown-list: three rows",
    () => rowsOf(page, "#unknown-list"), (rows) => rows.length === 3);
  eq("#unknown-list: the unknown outcomes' keys, tenants and operations",
    unknowns.map((r) => [r.key, r.tenant, r.operation]).sort(),
    panel.map((r) => [r.key, r.tenant, r.operation]).sort());
  check("#unknown-list: every row has an age", panel.every((r) => r.age
    && r.age.trim() !== ""), show(panel));
  check("#unknown-list: the hostile key is its exact text",
    panel.some((r) => r.key === HOSTILE_UNKNOWN_KEY));

  // Filters.
  await filter(page, { state: "unknown" }, "state=unknown: the 3 unknown",
    (rows) => isDeepStrictEqual(keySet(rows), unknowns.map((r) => r.key).sort())
      && rows.every((r) => r.record));
  await filter(page, { prefix: "order-" }, "prefix=order-: the 5 orders",
    (rows) => isDeepStrictEqual(keySet(rows),
      ["order-1", "order-2", "order-3", "order-4", "order-5"]));
  await filter(page, { operation: "send_mail" }, "operation=send_mail",
    (rows) => isDeepStrictEqual(keySet(rows), ["lost-2", "rec-1"]));
  await filter(page, { tenant: "globex", state: "unknown" },
    "tenant=globex state=unknown", (rows) => isDeepStrictEqual(keySet(rows),
      [HOSTILE_UNKNOWN_KEY]));
  await filter(page, { state: "in_progress" }, "state=in_progress",
    (rows) => isDeepStrictEqual(keySet(rows), ["busy-1"]));

  // Open lost-1; cancel one action: nothing changes.
  await filter(page, { state: "unknown" }, "state=unknown again",
    (rows) => rows.length === 3);
  await open(page, "lost-1");
  check("#detail-state: unknown",
    /unknown/.test(await text(page, "#detail-state")));
  eq("#detail-attempt: 1", "1", await text(page, "#detail-attempt"));
  await confirmDialog(page, "#resolve-released", "#confirm-no",
    "release, cancelled");
  eq("after the cancelled release: lost-1 still unknown in the API",
    "unknown", (await api(showPath(target))).state);

  // Resolve lost-1 as completed with a status and a body.
  await page.$eval("#resolve-status", (e) => { e.value = ""; });
  await page.type("#resolve-status", String(RESOLVE_STATUS));
  await page.$eval("#resolve-body", (e) => { e.value = ""; });
  await page.type("#resolve-body", RESOLVE_BODY);
  const asked = await confirmDialog(page, "#resolve-completed", "#confirm-yes",
    "resolve completed");
  check("the confirmation names the key", asked.includes("lost-1"), asked);
  await waitFor("#message reports the result", () => text(page, "#message"),
    (v) => v && v !== "");
  const t0 = Date.now();
  await waitFor("#count-unknown falls from 3 to 2",
    () => text(page, "#count-unknown"), (v) => v === "2", 10000);
  console.log(`# the count changed ${Date.now() - t0} ms after the message`);
  await waitFor("#unknown-list: two rows, lost-1 gone",
    () => rowsOf(page, "#unknown-list"), (rows) => rows.length === 2
      && !rows.some((r) => r.key === "lost-1"));
  await waitFor("the records table (state=unknown) refreshed: 2 rows",
    () => rowsOf(page, "#records"), (rows) => rows.length === 2
      && !rows.some((r) => r.key === "lost-1"));

  // Open it again: completed, with the answer given.
  await filter(page, { prefix: "lost-1" }, "prefix=lost-1",
    (rows) => isDeepStrictEqual(keySet(rows), ["lost-1"]));
  await open(page, "lost-1");
  await waitFor("#detail-state: completed", () => text(page, "#detail-state"),
    (v) => /completed/.test(v ?? ""));
  const answer = await text(page, "pre#detail-answer");
  check("pre#detail-answer: the body given, as text",
    answer.includes(RESOLVE_BODY), answer);
  // The contract names no element for the status: pre#detail-answer, or
  // an element of #detail that holds it alone.
  check("#detail: the status given", answer.includes(String(RESOLVE_STATUS))
    || await page.$$eval("#detail *", (els, s) => els.some((e) =>
      e.children.length === 0 && e.textContent.trim() === s),
    String(RESOLVE_STATUS)), answer);

  // The hostile records, as text.
  const rows = await filter(page, { prefix: "<script>" },
    "prefix=<script>: the hostile record",
    (rows) => isDeepStrictEqual(keySet(rows), [HOSTILE_KEY]));
  eq("records table: the hostile tenant and operation as their text",
    [hostile.tenant, hostile.operation], [rows[0].tenant, rows[0].operation]);
  await open(page, HOSTILE_KEY);
  check("#detail-key holds a text node, not elements",
    await page.$eval("#detail-key", (e) => e.children.length === 0
      && e.innerHTML.includes("&lt;script&gt;")));
  const hostileAnswer = await text(page, "pre#detail-answer");
  check("pre#detail-answer: the hostile body as its exact text",
    hostileAnswer.includes(HOSTILE_BODY), hostileAnswer);
  check("pre#detail-answer holds no element",
    await page.$eval("pre#detail-answer", (e) => e.children.length === 0));
  await noThreat(page, "the page");
  eq("no CSP violation reported", [], cspViolations);

  // Again without the CSP, which would block an injected handler: the
  // page's escaping alone must keep the markup inert.
  const bare = await newPage(true);
  await bare.goto(BASE + "/", { waitUntil: "load" });
  await waitFor("CSP bypassed: #unknown-list shows the hostile key",
    () => rowsOf(bare, "#unknown-list"),
    (rows) => rows.some((r) => r.key === HOSTILE_UNKNOWN_KEY));
  await filter(bare, { tenant: hostile.tenant },
    "CSP bypassed: the hostile tenant finds the hostile record",
    (rows) => isDeepStrictEqual(keySet(rows), [HOSTILE_KEY]));
  await open(bare, HOSTILE_KEY);
  // Let any image error or load event that markup would cause come first:
  // the network idle for a while.
  await bare.waitForNetworkIdle({ idleTime: 300, timeout: 10000 });
  eq("CSP bypassed: no alert, confirm or prompt fired", [], dialogs);
  await noThreat(bare, "CSP bypassed");
  check("CSP bypassed: the hostile answer as its exact text",
    (await text(bare, "pre#detail-answer")).includes(HOSTILE_BODY));
  eq("no uncaught error in the page", [], pageErrors);

  // The audit log.
  const audit = readFileSync(AUDIT, "utf8").trim().split("\n")
    .map((l) => JSON.parse(l));
  const resolves = audit.filter((a) => a.action === "resolve");
  eq("audit: one resolve line", 1, resolves.length);
  const a = resolves[0];
  eq("audit: the resolve names the operator, the record and the outcome",
    [OPERATOR, target.tenant, target.operation, "lost-1", "completed"],
    [a.operator, a.tenant, a.operation, a.key, a.outcome]);
  check("audit: the resolve names the address", /127\.0\.0\.1/.test(a.address),
    show(a));
  check("audit: the resolve has a time", typeof a.time === "string"
    || typeof a.time === "number", show(a));
  check("audit: a login-failed line and a login line for the operator",
    audit.some((l) => l.action === "login-failed")
    && audit.some((l) => l.action === "login" && l.operator === OPERATOR),
    show(audit.map((l) => l.action)));
  check("audit: the token is never written", !readFileSync(AUDIT, "utf8")
    .includes(TOKEN.slice(0, 16)));

  // The store, as `idem keys` reads it: exactly one record changed.
  const after = keysList();
  eq("idem keys list: the same records", [...before.keys()].sort(),
    [...after.keys()].sort());
  const changed = [...before.keys()].filter(
    (k) => !isDeepStrictEqual(before.get(k), after.get(k)));
  eq("idem keys list: only lost-1 changed", [idOf(target)], changed);
  const cli = JSON.parse(execFileSync(IDEM, ["keys", "show", "lost-1",
    "--tenant", target.tenant, "--operation", target.operation, "--store",
    STORE, "--json"], { encoding: "utf8" }));
  eq("idem keys show lost-1: completed with the status and body given",
    ["completed", RESOLVE_STATUS, RESOLVE_BODY],
    [cli.state, cli.response.status, cli.response.body]);
  eq("idem keys show lost-1: the same identifiers and request",
    [target.tenant, target.operation, "lost-1", before.get(idOf(target)).request],
    [cli.tenant, cli.operation, cli.key, cli.request]);
  const viaApi = await api(showPath(target));
  eq("the API's record agrees with idem keys show",
    [cli.state, cli.response.status, cli.response.body],
    [viaApi.state, viaApi.response.status, viaApi.response.body]);

  // A change made outside the page (idem keys): the counts and the panel
  // follow within their 2 s refresh, with no click.
  execFileSync(IDEM, ["keys", "resolve", "lost-2", "--tenant", "acme",
    "--operation", "send_mail", "--failed", "--store", STORE]);
  await waitFor("#count-unknown follows idem keys resolve from 2 to 1",
    () => text(page, "#count-unknown"), (v) => v === "1", 10000);
  await waitFor("#unknown-list follows it: one row",
    () => rowsOf(page, "#unknown-list"), (rows) => rows.length === 1);
  eq("no uncaught error in the page, at the end", [], pageErrors);
  await browser.close();
  browser = null;

  // The console stops on SIGTERM, without a sanitizer report.
  const exited = new Promise((r) => consoleProc.on("exit", (c, s) => r([c, s])));
  consoleProc.kill("SIGTERM");
  const [code, signal] = await Promise.race([exited,
    sleep(10000).then(() => ["still running after 10 s", null])]);
  check("idem console exits on SIGTERM", code === 0 || signal === "SIGTERM",
    show([code, signal]));
  check("no sanitizer report from idem console", !/AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:/
    .test(consoleErr), consoleErr);
} catch (e) {
  await bail(e instanceof Failure ? e.message : e.stack);
}
console.log(`# ${((Date.now() - started) / 1000).toFixed(1)} s`);
console.log(`${passed} passed, 0 failed`);
process.exit(0);
