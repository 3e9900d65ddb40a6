"""idem console over raw HTTP: authentication, CSRF, Origin and Host checks,
the headers of its pages, and store text escaped in its JSON.

usage: python3 security.py IDEM SEED

IDEM is the idem program, SEED the program of seed.c. Two consoles run on
loopback ports of their own (port 0): one with a token file and an audit
log, one without a token. Each check prints what it checked; the first
wrong answer ends the test with what was expected and what came, and the
last line counts the checks.
"""
import http.client
import json
import os
import re
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

IDEM, SEED = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="idem-console-security.")
STARTED = time.monotonic()
PASSED = 0
PROCS = []

HOSTILE_KEY = "<script>alert(1)</script>"
HOSTILE_TENANT = "<img src=x onerror=alert(5)>"
HOSTILE_OPERATION = "<svg onload=alert(6)>"
HOSTILE_BODY = "<script>alert(2)</script><img src=x onerror=alert(3)>"
EVIL = "http://evil.example"


def cleanup():
    for p in PROCS:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(TMP, ignore_errors=True)


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    for p in PROCS:
        if getattr(p, "err", None):
            print(f"idem console's stderr:\n{''.join(p.err)}", file=sys.stderr)
    print(f"{PASSED} passed, 1 failed")
    cleanup()
    sys.exit(1)


def check(what, ok, detail=None):
    global PASSED
    if not ok:
        fail(what + (f": {detail}" if detail is not None else ""))
    PASSED += 1
    print(f"ok {PASSED} - {what}", flush=True)


def eq(what, expected, actual):
    check(what, expected == actual, f"expected {expected!r}, got {actual!r}")


def seed(name):
    store = "sqlite:" + os.path.join(TMP, name)
    out = subprocess.run([SEED, store], check=True, capture_output=True,
                         text=True).stdout
    return store, [json.loads(line) for line in out.splitlines()]


def start(args, expect_listen=True):
    """Starts idem console ARGS; returns (proc, port) once it says it
    listens, or (proc, None) once it exits when expect_listen is False."""
    p = subprocess.Popen([IDEM, "console"] + args, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    p.err = []
    PROCS.append(p)
    deadline = time.monotonic() + 20
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stderr], [], [], 0.2)
        if r:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:  # closed: the process ended
                p.wait(timeout=10)
                p.err.append(buf.decode(errors="replace"))
                return p, None
            buf += chunk
            m = re.search(rb"idem console: listening on http://(\S+):(\d+)[ \n]",
                          buf)
            if m and m.group(2) != b"0":
                if m.group(1) != b"127.0.0.1" and expect_listen:
                    fail(f"idem console listens on {m.group(0)!r}")
                p.err.append(buf.decode(errors="replace"))
                # Keep reading, so that the pipe never fills.
                threading.Thread(target=lambda: p.err.extend(
                    iter(lambda: p.stderr.readline().decode(errors="replace"),
                         "")), daemon=True).start()
                return p, int(m.group(2))
    fail(f"idem console {' '.join(args)}: no 'listening on' line within "
         f"20 s; stderr: {buf.decode(errors='replace')!r}")


class Resp:
    def __init__(self, r):
        self.status = r.status
        self.headers = r.headers
        self.raw = r.read()
        self.text = self.raw.decode("utf-8", errors="replace")

    def header(self, name):
        return self.headers.get(name) or ""

    def cookies(self):
        return self.headers.get_all("Set-Cookie") or []

    def json(self):
        try:
            return json.loads(self.raw)
        except ValueError as e:
            fail(f"not JSON ({e}): {self.text[:300]!r}")


def request(port, method, path, headers=None, body=None, host=None, src=None):
    """One request on a connection of its own, with exactly the headers
    given (and Host: 127.0.0.1:PORT unless host says otherwise), from the
    loopback address src when given."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=15,
                                   source_address=(src, 0) if src else None)
    c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    c.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    elif isinstance(body, str):
        body = body.encode()
    for k, v in (headers or {}).items():
        c.putheader(k, v)
    if body is not None or method == "POST":
        c.putheader("Content-Length", str(len(body or b"")))
    c.endheaders(body)
    try:
        return Resp(c.getresponse())
    finally:
        c.close()


def qs(**kw):
    return "?" + urllib.parse.urlencode(kw)


def show_path(r):
    return "/api/records/show" + qs(tenant=r["tenant"], operation=r["operation"],
                                    key=r["key"])


def problem(what, r, status):
    eq(f"{what}: status {status}", status, r.status)
    check(f"{what}: RFC 9457 problem JSON",
          r.header("Content-Type").startswith("application/problem+json")
          and r.json().get("status") == status,
          f"{r.header('Content-Type')} {r.text[:200]!r}")


def html_headers(what, r):
    csp = r.header("Content-Security-Policy")
    directives = {d.strip().split(" ")[0]: d.strip()
                  for d in csp.split(";") if d.strip()}
    check(f"{what}: CSP default-src 'none'",
          directives.get("default-src") == "default-src 'none'", csp)
    script = directives.get("script-src", "")
    check(f"{what}: CSP script-src 'self', nothing inline or eval",
          script.split()[1:2] == ["'self'"] and "unsafe" not in script
          and "*" not in script and "data:" not in script, csp)
    eq(f"{what}: X-Content-Type-Options", "nosniff",
       r.header("X-Content-Type-Options"))
    eq(f"{what}: X-Frame-Options", "DENY", r.header("X-Frame-Options"))
    check(f"{what}: text/html", r.header("Content-Type").startswith("text/html"),
          r.header("Content-Type"))
    check(f"{what}: no inline <script>",
          not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text, re.I),
          r.text[:500])


def audit_lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def record(port, rec, auth=None):
    """The record as the API shows it, less its age (which grows)."""
    r = request(port, "GET", show_path(rec), auth or {}).json()
    r.pop("age_ms", None)
    return r


def unchanged(port, auth, rec, before, what):
    eq(f"{what}: the record is unchanged", before, record(port, rec, auth))


try:
    STORE, RECORDS = seed("console.db")
    BY_KEY = {r["key"]: r for r in RECORDS}
    TOKEN = secrets.token_hex(24)
    token_file = os.path.join(TMP, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    AUDIT = os.path.join(TMP, "audit.log")
    proc, PORT = start(["--store", STORE, "--listen", "127.0.0.1:0",
                        "--token-file", token_file, "--audit-log", AUDIT])
    ORIGIN = f"http://127.0.0.1:{PORT}"
    check(f"idem console with a token listens on {ORIGIN}", True)
    AUTH = {"Authorization": f"Bearer {TOKEN}"}

    # --- Nothing without the token ---------------------------------------
    r = request(PORT, "GET", "/")
    check("GET / without a session: 401, the login page, no application",
          r.status == 401 and 'id="login"' in r.text
          and 'name="idem-csrf"' not in r.text and "lost-1" not in r.text,
          f"{r.status} {r.text[:300]!r}")
    html_headers("the login page", r)
    lost2 = BY_KEY["lost-2"]
    resolve_lost2 = {"tenant": lost2["tenant"], "operation": lost2["operation"],
                     "key": "lost-2", "outcome": "released"}
    delete_order1 = {"tenant": "acme", "operation": "POST /charges",
                     "key": "order-1"}
    no_token = [("GET", "/api/records", None), ("GET", "/api/metrics", None),
                ("GET", show_path(lost2), None),
                ("GET", "/api/records" + qs(state="unknown"), None),
                ("POST", "/api/records/resolve", resolve_lost2),
                ("POST", "/api/records/delete", delete_order1)]
    for method, path, body in no_token:
        r = request(PORT, method, path, {}, body)
        eq(f"{method} {path} without a token: 401", 401, r.status)
        check(f"{method} {path} without a token: WWW-Authenticate: Bearer",
              r.header("WWW-Authenticate").startswith("Bearer"),
              r.header("WWW-Authenticate"))
        check(f"{method} {path} without a token: no record in the answer",
              "lost-" not in r.text and "order-" not in r.text, r.text[:300])
    wrong = {"another token": secrets.token_hex(24),
             "the token less its last character": TOKEN[:-1],
             "the token's first 16 characters": TOKEN[:16],
             "the token plus one character": TOKEN + "0",
             "an empty token": "",
             "the token in other case": TOKEN.upper()}
    # One GET and one POST each: fewer than 20 wrong tokens in all, lest
    # a limit on failures per address and minute answer 429 instead.
    for what, t in wrong.items():
        for method, path, body in [no_token[0], no_token[4]]:
            r = request(PORT, method, path,
                        {"Authorization": f"Bearer {t}"}, body)
            eq(f"{method} {path}, Bearer {what}: 401", 401, r.status)
    for what, value in {"Basic": "Basic " + TOKEN,
                        "the token alone": TOKEN,
                        "two Bearers": f"Bearer x, Bearer {TOKEN}"}.items():
        r = request(PORT, "GET", "/api/records", {"Authorization": value})
        eq(f"GET /api/records, Authorization {what}: 401", 401, r.status)
    r = request(PORT, "GET", "/api/records",
                {"Cookie": "idem_console=" + secrets.token_hex(32)})
    eq("GET /api/records with a forged session cookie: 401", 401, r.status)
    eq("records unchanged by the refused calls", 12,
       request(PORT, "GET", "/api/records", AUTH).json().get("total"))

    # --- The API with the token ------------------------------------------
    r = request(PORT, "GET", "/api/records" + qs(limit=100), AUTH)
    eq("GET /api/records with the token: 200", 200, r.status)
    check("GET /api/records: application/json",
          r.header("Content-Type").startswith("application/json"),
          r.header("Content-Type"))
    listing = r.json()
    eq("GET /api/records: total, offset, limit", (12, 0, 100),
       (listing.get("total"), listing.get("offset"), listing.get("limit")))
    fields = {"tenant", "operation", "key", "state", "attempt", "created_ms",
              "updated_ms", "lease_expires_ms", "expires_ms", "recovered",
              "age_ms"}
    check("GET /api/records: every field of the contract",
          all(fields <= set(x) for x in listing["records"]),
          listing["records"][:1])
    created = [x["created_ms"] for x in listing["records"]]
    eq("GET /api/records: newest first", sorted(created, reverse=True), created)
    hostile = [x for x in listing["records"] if x["key"] == HOSTILE_KEY]
    eq("the hostile key round-trips exactly through the JSON",
       [(HOSTILE_TENANT, HOSTILE_OPERATION, HOSTILE_KEY)],
       [(x["tenant"], x["operation"], x["key"]) for x in hostile])
    check("the hostile key is JSON-escaped, never raw markup in an HTML type",
          not r.header("Content-Type").startswith("text/html"))
    r = request(PORT, "GET", "/api/records" + qs(limit=2, offset=1), AUTH)
    eq("limit=2 offset=1: the 2nd and 3rd records",
       [x["key"] for x in listing["records"][1:3]],
       [x["key"] for x in r.json()["records"]])
    for state, keys in {"unknown": ["lost-1", "lost-2",
                                    '<img/src="x"/onerror="alert(4)">'],
                        "in_progress": ["busy-1"],
                        "recovered": ["rec-1"]}.items():
        got = request(PORT, "GET", "/api/records" + qs(state=state),
                      AUTH).json()
        eq(f"state={state}", sorted(keys),
           sorted(x["key"] for x in got["records"]))
    got = request(PORT, "GET", "/api/records" + qs(prefix="order-",
                                                   tenant="acme",
                                                   operation="POST /charges"),
                  AUTH).json()
    eq("prefix=order- tenant=acme operation=POST /charges: 5 records",
       (5, 5), (got["total"], len(got["records"])))
    h = request(PORT, "GET", show_path(BY_KEY[HOSTILE_KEY]), AUTH).json()
    eq("show: the hostile answer round-trips exactly",
       (HOSTILE_KEY, 200, HOSTILE_BODY),
       (h.get("key"), h["response"]["status"], h["response"]["body"]))
    eq("show: the hostile request round-trips exactly",
       '{"note":"<script>alert(7)</script>"}', h.get("request"))
    b = request(PORT, "GET", show_path(BY_KEY["bin-1"]), AUTH).json()
    eq("show: a body that is not UTF-8 as hex", {"hex": "fffe00016f6b"},
       b["response"]["body"])
    m = request(PORT, "GET", "/api/metrics", AUTH).json()
    eq("metrics: unknown, in progress, recovered", (3, 1, 1),
       (m["records"]["unknown"], m["records"]["in_progress"],
        m["records"]["recovered"]))
    problem("show of no such record", request(
        PORT, "GET", "/api/records/show" + qs(tenant="acme", operation="x",
                                              key="nosuch"), AUTH), 404)
    problem("state=bogus", request(PORT, "GET", "/api/records" + qs(
        state="bogus"), AUTH), 400)
    problem("resolve with outcome bogus", request(
        PORT, "POST", "/api/records/resolve", AUTH,
        {**resolve_lost2, "outcome": "bogus"}), 400)
    problem("resolve with a body that is not JSON", request(
        PORT, "POST", "/api/records/resolve",
        {**AUTH, "Content-Type": "application/json"}, "{tenant"), 400)
    busy = BY_KEY["busy-1"]
    busy_before = record(PORT, busy, AUTH)
    problem("resolve of a record whose lease runs, without force", request(
        PORT, "POST", "/api/records/resolve", AUTH,
        {"tenant": "acme", "operation": "POST /charges", "key": "busy-1",
         "outcome": "released"}), 409)
    unchanged(PORT, AUTH, busy, busy_before, "409")
    # Deleting it would let a retry act beside its holder: refused as a
    # resolve is, unless forced, and the refusal is in the audit log.
    busy_id = {"tenant": "acme", "operation": "POST /charges", "key": "busy-1"}
    problem("delete of a record whose lease runs, without force", request(
        PORT, "POST", "/api/records/delete", AUTH, busy_id), 409)
    unchanged(PORT, AUTH, busy, busy_before, "409 delete")
    refused = [a for a in audit_lines(AUDIT) if a.get("action") == "delete"
               and a.get("key") == "busy-1"]
    eq("audit: the refused delete, with libidem's reason",
       [("refused", "IDEM_ESTATE")],
       [(a.get("outcome"), a.get("error")) for a in refused])
    problem("resolve naming the tenant with a number", request(
        PORT, "POST", "/api/records/resolve", AUTH,
        {**resolve_lost2, "tenant": 5}), 400)
    problem("resolve sent as application/jsonx", request(
        PORT, "POST", "/api/records/resolve",
        {**AUTH, "Content-Type": "application/jsonx"},
        json.dumps(resolve_lost2)), 415)

    # --- Origin: a foreign one is refused, even with the token -----------
    lost2_before = record(PORT, lost2, AUTH)
    for origin in [EVIL, "null", f"http://127.0.0.1:{PORT + 1}",
                   f"http://localhost:{PORT}", f"https://evil.example:{PORT}"]:
        r = request(PORT, "GET", "/api/records", {**AUTH, "Origin": origin})
        eq(f"GET /api/records with the token, Origin {origin}: 403",
           403, r.status)
        r = request(PORT, "POST", "/api/records/resolve",
                    {**AUTH, "Origin": origin}, resolve_lost2)
        eq(f"POST resolve with the token, Origin {origin}: 403", 403, r.status)
    r = request(PORT, "GET", "/", {"Origin": EVIL})
    eq(f"GET / with Origin {EVIL}: 403", 403, r.status)
    unchanged(PORT, AUTH, lost2, lost2_before, "foreign origins")
    r = request(PORT, "GET", "/api/records", {**AUTH, "Origin": ORIGIN})
    eq("GET /api/records with the token and the console's own Origin: 200",
       200, r.status)
    # Behind a proxy that ends TLS the page's origin is https:// with the
    # same host: the same site.
    r = request(PORT, "GET", "/api/records",
                {**AUTH, "Origin": f"https://127.0.0.1:{PORT}"})
    eq("GET /api/records with the token, Origin https:// and the console's "
       "host: 200", 200, r.status)

    # --- Login ------------------------------------------------------------
    form = "application/x-www-form-urlencoded"

    def login(token, operator="mallory", headers=None):
        return request(PORT, "POST", "/login", {"Content-Type": form,
                                                 **(headers or {})},
                       urllib.parse.urlencode({"operator": operator,
                                               "token": token}))
    r = login(TOKEN[:-1] + "x", "mallory")
    eq("login with a wrong token: 401", 401, r.status)
    check("login with a wrong token: the login page with #login-error",
          'id="login-error"' in r.text and 'id="login"' in r.text, r.text[:300])
    check("login with a wrong token: no session cookie",
          not any(c.startswith("idem_console=") and "=;" not in c[:14]
                  for c in r.cookies()), r.cookies())
    html_headers("the login page after a wrong token", r)
    failed_lines = [a for a in audit_lines(AUDIT)
                    if a.get("action") == "login-failed"]
    check("audit: a login-failed line naming the operator and the address",
          any(a.get("operator") == "mallory"
              and "127.0.0.1" in str(a.get("address")) for a in failed_lines),
          failed_lines)
    check("audit: the wrong token is not written",
          TOKEN[:16] not in open(AUDIT, encoding="utf-8").read())
    r = login(TOKEN, "mallory", {"Origin": EVIL})
    eq(f"login with the right token, Origin {EVIL}: 403", 403, r.status)
    check("that login sets no cookie", not r.cookies(), r.cookies())

    r = login(TOKEN, "grace", {"Origin": ORIGIN})
    eq("login: 303", 303, r.status)
    check("login: to /", r.header("Location") in ("/", ORIGIN + "/"),
          r.header("Location"))
    session = [c for c in r.cookies() if c.startswith("idem_console=")]
    eq("login: one session cookie", 1, len(session))
    attrs = [a.strip().lower() for a in session[0].split(";")]
    check("login: cookie HttpOnly, SameSite=Strict, Path=/",
          "httponly" in attrs and "samesite=strict" in attrs
          and "path=/" in attrs, session[0])
    COOKIE = {"Cookie": session[0].split(";")[0]}
    check("login: a session id that is not the token",
          TOKEN not in session[0], session[0])
    r = request(PORT, "GET", "/", COOKIE)
    eq("GET / with the session: 200", 200, r.status)
    html_headers("the console's page", r)
    m = re.search(r'<meta name="idem-csrf" content="([^"]+)"', r.text)
    check("the page carries the CSRF token", m is not None, r.text[:500])
    CSRF = m.group(1)
    check("the page holds no store text (the hostile key is nowhere raw)",
          HOSTILE_KEY not in r.text and "alert(" not in r.text)
    eq("GET /api/records with the session: 200", 200,
       request(PORT, "GET", "/api/records", COOKIE).status)

    # --- CSRF ---------------------------------------------------------------
    for what, extra in {"without X-CSRF-Token": {},
                        "with a wrong X-CSRF-Token": {
                            "X-CSRF-Token": secrets.token_hex(16)},
                        "with an empty X-CSRF-Token": {"X-CSRF-Token": ""},
                        "with the CSRF token less a character": {
                            "X-CSRF-Token": CSRF[:-1]},
                        "with the right CSRF token, Origin " + EVIL: {
                            "X-CSRF-Token": CSRF, "Origin": EVIL}}.items():
        for path, body in [("/api/records/resolve", resolve_lost2),
                           ("/api/records/delete", delete_order1)]:
            r = request(PORT, "POST", path, {**COOKIE, **extra}, body)
            eq(f"POST {path} with the session {what}: 403", 403, r.status)
        unchanged(PORT, AUTH, lost2, lost2_before, what)
    r = request(PORT, "POST", "/logout", COOKIE)
    eq("POST /logout without X-CSRF-Token: 403", 403, r.status)
    eq("the session outlives a refused logout", 200,
       request(PORT, "GET", "/api/records", COOKIE).status)

    # The same calls with the CSRF token and the page's Origin do act.
    r = request(PORT, "POST", "/api/records/resolve",
                {**COOKIE, "X-CSRF-Token": CSRF, "Origin": ORIGIN},
                {**resolve_lost2, "outcome": "failed", "status": 503,
                 "body": "mail relay down"})
    eq("resolve failed with the session and CSRF token: 200", 200, r.status)
    check("its answer says resolved", "resolved" in r.json(), r.text[:200])
    got = request(PORT, "GET", show_path(lost2), AUTH).json()
    eq("lost-2 now holds the error answer", ("completed", 503,
                                              "mail relay down"),
       (got["state"], got["response"]["status"], got["response"]["body"]))
    res = [a for a in audit_lines(AUDIT) if a.get("action") == "resolve"
           and a.get("key") == "lost-2"]
    eq("audit: one resolve of lost-2: by grace, failed",
       [("grace", "acme", "send_mail", "lost-2", "failed")],
       [(a.get("operator"), a.get("tenant"), a.get("operation"), a.get("key"),
         a.get("outcome")) for a in res])
    check("audit: the resolve names the address",
          "127.0.0.1" in str(res[0].get("address")), res[0])

    # Bearer needs no CSRF token.
    r = request(PORT, "POST", "/api/records/delete", AUTH, delete_order1)
    eq("delete with the token, no CSRF token: 200", 200, r.status)
    problem("order-1 after its delete", request(
        PORT, "GET", show_path(BY_KEY["order-1"]), AUTH), 404)
    check("audit: the delete of order-1",
          any(a.get("action") == "delete" and a.get("key") == "order-1"
              for a in audit_lines(AUDIT)))

    # Logout ends the session.
    r = request(PORT, "POST", "/logout", {**COOKIE, "X-CSRF-Token": CSRF})
    check("POST /logout with the CSRF token: done", r.status in (200, 204, 303),
          r.status)
    eq("the session after logout: 401", 401,
       request(PORT, "GET", "/api/records", COOKIE).status)
    r = request(PORT, "GET", "/", COOKIE)
    check("GET / after logout: the login page",
          'id="login"' in r.text and 'name="idem-csrf"' not in r.text,
          r.text[:300])
    check("audit: the logout of grace",
          any(a.get("action") == "logout" and a.get("operator") == "grace"
              for a in audit_lines(AUDIT)))
    check("audit: the token never written",
          TOKEN[:16] not in open(AUDIT, encoding="utf-8").read())

    # --- Without a token: loopback only, and Host checked -----------------
    for listen in ["0.0.0.0:0", "[::]:0"]:
        p, port = start(["--store", STORE, "--listen", listen],
                        expect_listen=False)
        msg = "".join(p.err)
        check(f"no token, --listen {listen}: refused, exit non-zero",
              port is None and p.returncode not in (0, None),
              f"exit {p.returncode}, port {port}, {msg!r}")
        check(f"no token, --listen {listen}: the message says why",
              "--token-file" in msg or "loopback" in msg, msg)
    store2, _ = seed("open.db")
    _, PORT2 = start(["--store", store2, "--listen", "127.0.0.1:0"])
    check(f"idem console without a token listens on 127.0.0.1:{PORT2}", True)
    r = request(PORT2, "GET", "/")
    eq("no token: GET / is the console's page", 200, r.status)
    html_headers("no token: the page", r)
    eq("no token: GET /api/records", 200,
       request(PORT2, "GET", "/api/records").status)
    for host in [f"localhost:{PORT2}", f"[::1]:{PORT2}"]:
        eq(f"no token: Host {host}: 200", 200,
           request(PORT2, "GET", "/api/metrics", host=host).status)
    for host in [f"evil.example:{PORT2}", "evil.example",
                 f"127.0.0.1.evil.example:{PORT2}",
                 f"localhost.evil.example:{PORT2}", f"10.0.0.1:{PORT2}"]:
        for path in ["/", "/api/records", "/api/metrics"]:
            r = request(PORT2, "GET", path, host=host)
            check(f"no token: GET {path} with Host {host}: 403 or 421",
                  r.status in (403, 421), r.status)
            check(f"no token: GET {path} with Host {host}: no record",
                  "lost-1" not in r.text, r.text[:200])
    lost1 = BY_KEY["lost-1"]
    release1 = {"tenant": "acme", "operation": "POST /charges", "key": "lost-1",
                "outcome": "released"}
    page = request(PORT2, "GET", "/")
    m = re.search(r'<meta name="idem-csrf" content="([^"]+)"', page.text)
    check("no token: the page carries a CSRF token", m is not None)
    csrf2 = m.group(1)
    jar = {"Cookie": "; ".join(c.split(";")[0] for c in page.cookies())} \
        if page.cookies() else {}
    lost1_before = record(PORT2, lost1)
    for what, extra in {"without X-CSRF-Token": {},
                        "with a wrong X-CSRF-Token": {
                            "X-CSRF-Token": secrets.token_hex(16)},
                        f"with the CSRF token, Origin {EVIL}": {
                            "X-CSRF-Token": csrf2, "Origin": EVIL}}.items():
        r = request(PORT2, "POST", "/api/records/resolve", {**jar, **extra},
                    release1)
        eq(f"no token: POST resolve {what}: 403", 403, r.status)
    r = request(PORT2, "POST", "/api/records/resolve",
                {**jar, "X-CSRF-Token": csrf2, "Origin": EVIL}, release1,
                host=f"evil.example:{PORT2}")
    check("no token: POST resolve with Host evil.example: 403 or 421",
          r.status in (403, 421), r.status)
    eq("no token: lost-1 unchanged by the refused posts", lost1_before,
       record(PORT2, lost1))
    r = request(PORT2, "POST", "/api/records/resolve",
                {**jar, "X-CSRF-Token": csrf2,
                 "Origin": f"http://127.0.0.1:{PORT2}"}, release1)
    eq("no token: POST resolve released with the CSRF token: 200", 200,
       r.status)
    eq("no token: lost-1 released (deleted)", 404,
       request(PORT2, "GET", show_path(lost1)).status)

    # --- Guessing: beyond the brief's contract, the console limits the
    # wrong tokens of one address (20 a minute); then even the right token
    # logs in no more, and the login says when to come back.
    _, PORT3 = start(["--store", store2, "--listen", "127.0.0.1:0",
                      "--token-file", token_file])
    for i in range(25):
        r = request(PORT3, "GET", "/api/metrics",
                    {"Authorization": f"Bearer {secrets.token_hex(24)}"})
        if r.status != 401:
            break
    eq("guessing: 25 wrong tokens, each 401", (25, 401), (i + 1, r.status))
    r = request(PORT3, "POST", "/login",
                {"Content-Type": "application/x-www-form-urlencoded"},
                urllib.parse.urlencode({"operator": "ada", "token": TOKEN}))
    eq("guessing: then a login is refused: 429", 429, r.status)
    check("guessing: the 429 says when to retry (Retry-After)",
          r.header("Retry-After").isdigit(), r.header("Retry-After"))
    # Wrong tokens from 300 other addresses (one each) fill the table of
    # guessers; nobody else is shut out by it.
    for i in range(300):
        r = request(PORT3, "GET", "/api/metrics",
                    {"Authorization": "Bearer wrong-wrong-wrong"},
                    src="127.0.%d.%d" % (2 + i // 250, 1 + i % 250))
        if r.status != 401:
            break
    eq("guessing: 300 addresses, one wrong token each: 401", 401, r.status)
    r = request(PORT3, "GET", "/api/metrics", {"Authorization": f"Bearer {TOKEN}"},
                src="127.0.9.1")
    eq("guessing: then the right token from another address: 200", 200, r.status)
    r = request(PORT3, "GET", "/api/metrics", {"Authorization": f"Bearer {TOKEN}"},
                src="127.0.2.7")
    eq("guessing: and from an address that sent one wrong token: 200", 200,
       r.status)
except SystemExit:
    raise
except Exception as e:  # a crash of the test itself is a failure too
    import traceback
    fail("".join(traceback.format_exception(e)))

for p in PROCS:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fail("idem console did not stop within 10 s of SIGTERM")
    err = "".join(p.err)
    if "listening on" in err:
        listen = p.args[p.args.index("--listen") + 1]
        token = " --token-file" if "--token-file" in p.args else ""
        eq(f"idem console --listen {listen}{token}: exit status 0 after "
           "SIGTERM", 0, p.returncode)
    check("no sanitizer report from idem console", not re.search(
        r"AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|"
        r"runtime error:", err), err)
cleanup()
print(f"# {time.monotonic() - STARTED:.1f} s")
print(f"{PASSED} passed, 0 failed")
