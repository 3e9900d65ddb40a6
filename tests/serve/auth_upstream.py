#!/usr/bin/env python3
"""A tool API that authenticates its callers, for the principal tests.

Usage: auth_upstream.py PORT_FILE

Listens on 127.0.0.1 (port written to PORT_FILE once it accepts). A caller
is known by the first of these it sends: an X-API-Key header, a "session"
cookie, or an "Authorization: Bearer TOKEN" header. An API key or a session
is known once allowed; a bearer token is known unless revoked (the tests
sign their tokens; idem verifies them, this API only honours revocation).

  POST /tickets             201 {"ticket_id": N, "owner": CREDENTIAL}, an
                            effect, or 401 for an unknown caller (no effect)
  GET  /me                  200 {"owner": CREDENTIAL}, or 401
  POST /_allow?cred=C       C becomes known
  POST /_revoke?cred=C      C is unknown from now on
  GET  /_counts             {"effects": N, "checks": N}
  GET  /_down?on=1|0        /me answers 500 while on
"""
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

lock = threading.Lock()
allowed, revoked = set(), set()
state = {"effects": 0, "checks": 0, "down": False}


def caller(h):
    """The credential a request carries, and whether it is known."""
    key = h.get("X-API-Key")
    if key is not None:
        return key, key in allowed
    for part in (h.get("Cookie") or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "session":
            return value, value in allowed
    auth = h.get("Authorization") or ""
    if auth.lower().startswith("bearer "):
        token = auth[7:].strip()
        return token, token not in revoked
    return None, False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def answer(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="tickets"')
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        url = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        q = parse_qs(url.query)
        with lock:
            if url.path == "/_allow":
                allowed.add(q["cred"][0])
                revoked.discard(q["cred"][0])
                return self.answer(200, {})
            if url.path == "/_revoke":
                allowed.discard(q["cred"][0])
                revoked.add(q["cred"][0])
                return self.answer(200, {})
            who, known = caller(self.headers)
            if not known:
                return self.answer(401, {"error": "unknown caller"})
            state["effects"] += 1
            return self.answer(201, {"ticket_id": state["effects"],
                                     "owner": who})

    def do_GET(self):
        url = urlsplit(self.path)
        with lock:
            if url.path == "/_counts":
                return self.answer(200, {"effects": state["effects"],
                                         "checks": state["checks"]})
            if url.path == "/_down":
                state["down"] = parse_qs(url.query)["on"][0] == "1"
                return self.answer(200, {})
            if url.path == "/me":
                state["checks"] += 1
                if state["down"]:
                    return self.answer(500, {"error": "down"})
                who, known = caller(self.headers)
                if not known:
                    return self.answer(401, {"error": "unknown caller"})
                return self.answer(200, {"owner": who})
        self.answer(404, {})


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
