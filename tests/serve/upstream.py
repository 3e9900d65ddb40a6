#!/usr/bin/env python3
"""A tool API for the gateway's tests that counts its side effects.

Usage: upstream.py PORT_FILE [--tls CERT KEY]

Listens on 127.0.0.1, port chosen by the kernel, written to PORT_FILE once
it accepts. HTTP/1.1 with keep-alive, one thread per connection.

  POST|PATCH|PUT /tickets[...]   an effect: a new ticket number; the answer is
                                 201 {"ticket_id": N, "key": K, "title": T}
                                 where T is the JSON body's "title"
      ?hold=NAME                 acts, then holds its answer until the test
                                 releases NAME (below): a test waits for
                                 the upstream to have acted, and decides
                                 when it answers, instead of guessing times
      ?delay_ms=N                acts, then waits N ms before answering
      ?delay_first_ms=N          the same, for the key's first effect only
      ?drop_first=1              acts, then closes the connection without
                                 an answer, for the key's first effect only
      ?status=S                  answers S instead of 201 (after acting)
      ?status_first=S            answers S the first time for the key
      ?bytes=N                   the answer's body is N bytes of "x"
      ?cookie=1                  adds Set-Cookie: session=...
      ?hop=1                     adds X-Hop-Only, named by Connection
      ?latin1=1                  adds a Content-Disposition whose value is
                                 not UTF-8 (ISO-8859-1 "caf\xe9")
  GET  /_counts                  {"effects": {key: count}, "total": N,
                                  "requests": N, "last_headers": {...}}
  GET  /_held                    {"held": {NAME: requests holding now},
                                  "released": [NAME, ...]}
      ?wait=NAME[&timeout=S]     first waits until a request has held
                                 under NAME (at most S s, default 30; 504
                                 when it never did)
  POST /_release?name=NAME       lets every request held under NAME
                                 answer, and any later one with
                                 hold=NAME answers at once
  GET  /anything-else            200 {"get": true, "n": requests so far}
Every POST/PATCH/PUT counts as an effect for its Idempotency-Key header
("" without one). The /_ paths count as nothing.
"""
import json
import socket
import socketserver
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

lock = threading.Lock()
effects = {}
state = {"total": 0, "requests": 0, "last_headers": {}}

# Held answers: NAME -> requests holding now; every NAME that ever held;
# NAMEs released for good.
held_cv = threading.Condition()
holding = {}
held_ever = set()
released = set()


def hold(name):
    """Blocks until NAME is released; counted as holding meanwhile."""
    with held_cv:
        held_ever.add(name)
        holding[name] = holding.get(name, 0) + 1
        held_cv.notify_all()
        while name not in released:
            held_cv.wait()
        holding[name] -= 1
        if not holding[name]:
            del holding[name]


def held_report():
    with held_cv:
        return {"held": dict(holding), "released": sorted(released)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def answer(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def effect(self):
        raw = self.body()
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        key = self.headers.get("Idempotency-Key") or ""
        try:
            title = json.loads(raw).get("title")
        except Exception:
            title = None
        with lock:
            state["requests"] += 1
            state["total"] += 1
            n = state["total"]
            effects[key] = effects.get(key, 0) + 1
            first = effects[key] == 1
            state["last_headers"] = {k: v for k, v in self.headers.items()}
        if "hold" in q:
            hold(q["hold"])
        if "delay_ms" in q:
            time.sleep(int(q["delay_ms"]) / 1000)
        if "delay_first_ms" in q and first:
            time.sleep(int(q["delay_first_ms"]) / 1000)
        if q.get("drop_first") and first:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status = int(q.get("status", 201))
        if "status_first" in q and first:
            status = int(q["status_first"])
        headers = [("Content-Type", "application/json"),
                   ("X-Ticket", str(n))]
        if q.get("hop"):
            headers += [("Connection", "X-Hop-Only"), ("X-Hop-Only", "1")]
        if q.get("latin1"):
            # send_header writes ISO-8859-1: one byte 0xe9, not UTF-8.
            headers.append(("Content-Disposition",
                            'attachment; filename="caf\xe9.txt"'))
        if q.get("cookie"):
            headers.append(("Set-Cookie", "session=s%d; Path=/" % n))
        if "bytes" in q:
            body = b"x" * int(q["bytes"])
            headers[0] = ("Content-Type", "application/octet-stream")
        else:
            body = json.dumps({"ticket_id": n, "key": key,
                               "title": title}).encode()
        self.answer(status, body, headers)

    def do_POST(self):
        url = urlsplit(self.path)
        if url.path != "/_release":
            return self.effect()
        self.body()
        name = parse_qs(url.query).get("name", [""])[0]
        with held_cv:
            were = holding.get(name, 0)
            released.add(name)
            held_cv.notify_all()
        self.answer(200, json.dumps({"released": name,
                                     "were_held": were}).encode(),
                    [("Content-Type", "application/json")])

    do_PATCH = do_PUT = effect

    def held(self, query):
        q = {k: v[0] for k, v in parse_qs(query).items()}
        status = 200
        if "wait" in q:
            deadline = time.monotonic() + float(q.get("timeout", 30))
            with held_cv:
                while q["wait"] not in held_ever:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        status = 504
                        break
                    held_cv.wait(left)
        self.answer(status, json.dumps(held_report()).encode(),
                    [("Content-Type", "application/json")])

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path == "/_held":
            return self.held(url.query)
        with lock:
            if self.path == "/_counts":
                body = json.dumps({"effects": effects, **state}).encode()
            else:
                state["requests"] += 1
                state["last_headers"] = {k: v for k, v in self.headers.items()}
                body = json.dumps({"get": True,
                                   "n": state["requests"]}).encode()
        self.answer(200, body, [("Content-Type", "application/json")])

    do_HEAD = do_GET


class Server(socketserver.ThreadingMixIn, HTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        pass  # a client that hung up early is part of the tests


def main():
    srv = Server(("127.0.0.1", 0), Handler)
    if len(sys.argv) >= 5 and sys.argv[2] == "--tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[3], sys.argv[4])
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    import os
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    srv.serve_forever()


if __name__ == "__main__":
    main()
