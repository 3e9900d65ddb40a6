#!/usr/bin/env python3
"""Raw HTTP/1.1 on a socket for the gateway's framing tests (stdlib only).

  raw_http.py exchange HOST:PORT BYTES [--raw]
      Sends BYTES (a Python bytes literal without the b'', so \\r\\n and
      \\x00 work) on one new connection, reads until the peer closes (10 s
      at most), and prints one line:
        STATUS CONTENT-TYPE PROBLEM-TYPE CONNECTION STATE COUNT
      for the first response (a field it lacks is "-"). STATE is "closed"
      (the peer closed after answering), "open" (it kept the connection
      past 10 s) or "reset"; COUNT is how many whole responses came, with
      "+junk" when bytes followed that are not one. --raw prints the bytes
      received instead (repr).

  raw_http.py capture PORT_FILE LOG
      An upstream that records every request it receives, byte for byte:
      one JSON line per request in LOG ({"head": ..., "body": ...}, read
      as ISO-8859-1), written before it answers 201 {"n": N}. HTTP/1.1
      keep-alive, one thread per connection. The port, chosen by the
      kernel, is written to PORT_FILE once it accepts.

  raw_http.py count LOG          how many requests LOG holds
  raw_http.py lines LOG          their request lines, one a line
  raw_http.py headers LOG N      the header lines of request N (from 1)
  raw_http.py malformed LOG      header lines of any request that are not
                                 "token: value" without control characters
"""
import json
import os
import re
import socket
import socketserver
import sys
import threading

TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def parse_responses(data):
    """The responses in data (HTTP/1.1 framing) and what follows them."""
    out = []
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            break
        lines = data[:end].split(b"\r\n")
        m = re.match(rb"^HTTP/1\.[01] (\d{3})", lines[0])
        if not m:
            break
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.setdefault(name.strip().lower().decode("latin-1"),
                               value.strip().decode("latin-1"))
        rest = data[end + 4:]
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                eol = rest.find(b"\r\n")
                if eol < 0:
                    return out, data
                size = int(rest[:eol].split(b";")[0], 16)
                body += rest[eol + 2:eol + 2 + size]
                rest = rest[eol + 2 + size + 2:]
                if size == 0:
                    break
        else:
            n = int(headers.get("content-length", "0"))
            if len(rest) < n:
                return out, data
            body, rest = rest[:n], rest[n:]
        out.append((int(m.group(1)), headers, body))
        data = rest
    return out, data


def exchange(addr, raw, show_raw):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.settimeout(10)
    s.sendall(raw)
    got, state = b"", "open"
    try:
        while True:
            b = s.recv(65536)
            if not b:
                state = "closed"
                break
            got += b
    except socket.timeout:
        pass
    except ConnectionResetError:
        state = "reset"
    s.close()
    if show_raw:
        print(repr(got))
        return
    responses, rest = parse_responses(got)
    if not responses:
        print("- - - - %s 0%s" % (state, "+junk" if rest else ""))
        return
    status, headers, body = responses[0]
    ptype = "-"
    if headers.get("content-type") == "application/problem+json":
        try:
            ptype = json.loads(body).get("type") or "-"
        except ValueError:
            ptype = "not-json"
    print("%d %s %s %s %s %d%s" % (
        status, headers.get("content-type", "-"), ptype,
        headers.get("connection", "-"), state, len(responses),
        "+junk" if rest else ""))


lock = threading.Lock()
count = [0]


class Capture(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                line = self.rfile.readline(65537)
                if not line:
                    return
                if head == b"" and line in (b"\r\n", b"\n"):
                    continue
                head += line
            length, chunked = 0, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value.strip() or b"0")
                if name.lower() == b"transfer-encoding":
                    chunked = b"chunked" in value.lower()
            body = b""
            if chunked:
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    body += self.rfile.read(size)
                    self.rfile.readline()
                    if size == 0:
                        break
            elif length:
                body = self.rfile.read(length)
            with lock:
                count[0] += 1
                n = count[0]
                with open(self.server.log, "a") as f:
                    f.write(json.dumps({"head": head.decode("latin-1"),
                                        "body": body.decode("latin-1")})
                            + "\n")
            answer = json.dumps({"n": n}).encode()
            self.wfile.write(b"HTTP/1.1 201 Created\r\n"
                             b"Content-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(answer)
                             + answer)
            self.wfile.flush()


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a gateway that hung up is part of the tests


def captured(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def header_lines(req):
    return req["head"].encode("latin-1").split(b"\r\n")[1:-2]


def main():
    cmd = sys.argv[1]
    if cmd == "exchange":
        raw = sys.argv[3].encode("latin-1").decode("unicode_escape")
        exchange(sys.argv[2], raw.encode("latin-1"), "--raw" in sys.argv[4:])
    elif cmd == "capture":
        open(sys.argv[3], "a").close()
        srv = Server(("127.0.0.1", 0), Capture)
        srv.log = sys.argv[3]
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(str(srv.server_address[1]))
        os.rename(sys.argv[2] + ".tmp", sys.argv[2])
        srv.serve_forever()
    elif cmd == "count":
        print(len(captured(sys.argv[2])))
    elif cmd == "lines":
        for r in captured(sys.argv[2]):
            print(r["head"].split("\r\n")[0])
    elif cmd == "headers":
        r = captured(sys.argv[2])[int(sys.argv[3]) - 1]
        for line in header_lines(r):
            print(line.decode("latin-1"))
    elif cmd == "malformed":
        for r in captured(sys.argv[2]):
            for line in header_lines(r):
                name, colon, value = line.partition(b":")
                if (not colon or not TOKEN.match(name) or
                        re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value)):
                    print(repr(line))
    else:
        sys.exit("raw_http.py: unknown command " + cmd)


if __name__ == "__main__":
    main()
