#!/usr/bin/env python3
"""An upstream for the gateway's tests that answers with raw bytes, so that
answers no well-behaved server library would send can be tried, and that
captures the raw request it receives.

Usage: raw_upstream.py DIR [ADDRESS]

Listens on ADDRESS (127.0.0.1, or ::1), port chosen by the kernel, written
to DIR/port once it accepts. One thread per connection, HTTP/1.1 keep-alive.

Any method on /x/CASE is an effect, counted for its Idempotency-Key header
("" without one) and numbered (the ticket); the raw head of the request is
kept. CASE says how to answer:

  plain      201 {"ticket_id": N}
  early103   103 Early Hints with a Link header, then the 201
  c100       100 Continue, then the 201
  p102       102 Processing twice (the second with a header), then the 201
  s101       101 Switching Protocols, then silence until the gateway closes
  s999       a status line "HTTP/1.1 999 Odd", then a body
  s2x        a status line "HTTP/1.1 2x Bad"
  bighdr     201 with one header of ?bytes=N bytes (default 20000)
  fold       201 with "X-Folded: a" continued on a folded line " b"
  foldhop    201 whose folded line follows a hop-by-hop header (Connection)
  foldclose  201 with "Connection: keep-alive" continued by " close"
  trailers   201, chunked, with a trailer field X-Trailer after the body
  trailhttp  201, chunked, whose trailer section starts "HTTP/1.1 200 ..."
  body       201 whose body is ?bytes=N bytes of "x"
  hold       acts, writes DIR/held (the number of calls held now), then
             waits until DIR/release exists before answering 201; with
             ?first=1 only the key's first call waits
  len        200 to HEAD with Content-Length: 1234 and no body
  nm         304 Not Modified with Content-Length: 1234
  clte       201 with both Content-Length and Transfer-Encoding: chunked
  tegzip     201 with Transfer-Encoding: gzip, chunked
  cl2        201 with two Content-Length headers that differ
  badchunk   201, chunked, whose chunk size is not hex
  h2status   a status line "HTTP/2 201" to an HTTP/1.1 request
  barecr     201 with a header line holding a bare CR
  nocolon    201 with a header line that is not "name: value"
  badname    201 with a header whose name is not a token ("X A: 1")
  smuggle    201, then the bytes of a second answer nobody asked for
  v10        an HTTP/1.0 201 without Content-Length, its body ended by close
  v10rst     the same, half its body, then a reset (RST) instead of a close
  late       201, then 0.3 s later a second answer on the idle connection,
             and DIR/late
  lf         201 whose lines end in LF alone
  dribble    201, chunked with a chunk extension, one byte per write
  connid     201 with X-Conn: the number of the connection it came on
  closeeach  201 with Connection: close, then closes the connection
  closeidle  201, keep-alive; then, once DIR/closenow exists, closes the
             connection idle in the gateway's pool and writes DIR/closed
  early      413 as soon as the head is in, before the body is read (as a
             server refusing a body too large does), then the body is
             read and dropped, and the connection kept; a client that
             stopped sending the body and sent its next request on the
             connection has that request read as the rest of the body

Control (never counted, never captured):
  GET /_counts     {"effects": {key: n}, "requests": n}
  GET /_last       the last captured request head, as text
"""
import json
import os
import socket
import struct
import sys
import threading

DIR = sys.argv[1]
ADDRESS = sys.argv[2] if len(sys.argv) > 2 else "127.0.0.1"
lock = threading.Lock()
effects = {}
state = {"requests": 0, "tickets": 0, "held": 0, "last": b""}


def read_head(f):
    lines = []
    while True:
        line = f.readline(65536)
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def header(head, name):
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.lower():
            return v.strip().decode("latin-1")
    return None


def read_body(f, head):
    te = header(head, b"transfer-encoding")
    if te and "chunked" in te.lower():
        out = b""
        while True:
            size = int(f.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while f.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return out
            out += f.read(size)
            f.readline()
    n = int(header(head, b"content-length") or 0)
    return f.read(n) if n else b""


def final(ticket, extra=b""):
    body = json.dumps({"ticket_id": ticket}).encode()
    return (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
            + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def answer(case, query, key, ticket, conn, method, cid=0):
    if case == "plain":
        return final(ticket)
    if case == "connid":
        return final(ticket, b"X-Conn: %d\r\n" % cid)
    if case == "early103":
        return (b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload"
                b"\r\n\r\n" + final(ticket))
    if case == "c100":
        return b"HTTP/1.1 100 Continue\r\n\r\n" + final(ticket)
    if case == "p102":
        return (b"HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 102 Processing\r\n"
                b"X-Progress: half\r\n\r\n" + final(ticket))
    if case == "s101":
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: "
                     b"websocket\r\nConnection: Upgrade\r\n\r\n")
        while conn.recv(4096):
            pass
        return None
    if case == "s999":
        return b"HTTP/1.1 999 Odd\r\nContent-Length: 2\r\n\r\n{}"
    if case == "s2x":
        return b"HTTP/1.1 2x Bad\r\nContent-Length: 2\r\n\r\n{}"
    if case == "bighdr":
        n = int(query.get("bytes", "20000"))
        return final(ticket, b"X-Big: " + b"b" * n + b"\r\n")
    if case == "fold":
        return final(ticket, b"X-Folded: a\r\n b\r\n")
    if case == "foldhop":
        return final(ticket, b"Content-Type: text/plain\r\n"
                     b"Connection: keep-alive\r\n injected=1\r\n")
    if case == "foldclose":
        return final(ticket, b"Connection: keep-alive\r\n close\r\n")
    if case == "trailers":
        body = json.dumps({"ticket_id": ticket}).encode()
        return (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n"
                + b"%x\r\n" % len(body) + body + b"\r\n0\r\nX-Trailer: t\r\n\r\n")
    if case == "trailhttp":
        # A trailer field whose line begins like a status line.
        body = json.dumps({"ticket_id": ticket}).encode()
        return (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n" % len(body) + body + b"\r\n0\r\n"
                b"HTTP/1.1 200 X-Evil: 1\r\nX-After: 2\r\n\r\n")
    if case == "body":
        n = int(query.get("bytes", "10"))
        return (b"HTTP/1.1 201 Created\r\nX-Ticket: %d\r\nContent-Length: %d"
                b"\r\n\r\n" % (ticket, n) + b"x" * n)
    if case == "hold":
        with lock:
            first = effects.get(key, 0) == 1
        if query.get("first") != "1" or first:
            with lock:
                state["held"] += 1
                write(os.path.join(DIR, "held"), str(state["held"]))
            while not os.path.exists(os.path.join(DIR, "release")):
                threading.Event().wait(0.02)
        return final(ticket)
    if case == "len":
        if method == "HEAD":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    if case == "closeidle":
        return final(ticket)
    if case == "closeeach":
        conn.sendall(final(ticket, b"Connection: close\r\n"))
        return None
    if case == "nm":
        return (b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n"
                b"Content-Length: 1234\r\n\r\n")
    body = json.dumps({"ticket_id": ticket}).encode()
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    if case == "clte":
        return (b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" % len(body) + chunked)
    if case == "tegzip":
        return (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip, chunked"
                b"\r\n\r\n" + chunked)
    if case == "cl2":
        return (b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n"
                b"Content-Length: %d\r\n\r\n" % (len(body), len(body) + 5)
                + body + b"xxxxx")
    if case == "h2status":
        return (b"HTTP/2 201 Created\r\nContent-Length: %d\r\n\r\n"
                % len(body) + body)
    if case == "barecr":
        return (b"HTTP/1.1 201 Created\r\nX-A: 1\rX-B: 2\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if case == "nocolon":
        return (b"HTTP/1.1 201 Created\r\nX-A 1\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if case == "badname":
        return (b"HTTP/1.1 201 Created\r\nX A: 1\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if case == "badchunk":
        return (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"zz\r\n" + body + b"\r\n0\r\n\r\n")
    if case == "smuggle":
        fake = b'{"ticket_id": -1}'
        return (final(ticket) + b"HTTP/1.1 201 Created\r\nContent-Length: %d"
                b"\r\n\r\n" % len(fake) + fake)
    if case == "v10":
        conn.sendall(b"HTTP/1.0 201 Created\r\nContent-Type: application/json"
                     b"\r\n\r\n" + body)
        return None
    if case == "late":
        # A whole answer, then, once it has been read, a second one nobody
        # asked for on the idle connection; DIR/late says it was sent.
        conn.sendall(final(ticket))
        threading.Event().wait(0.3)
        fake = b'{"ticket_id": -1}'
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n"
                     % len(fake) + fake)
        write(os.path.join(DIR, "late"), "1")
        return b""
    if case == "v10rst":
        # Framed by the close, then cut by a reset: incomplete.
        conn.sendall(b"HTTP/1.0 201 Created\r\nContent-Type: application/json"
                     b"\r\n\r\n" + body[:len(body) // 2])
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                        struct.pack("ii", 1, 0))
        conn.close()
        return None
    if case == "lf":
        return final(ticket).replace(b"\r\n", b"\n")
    if case == "dribble":
        out = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n"
               + b"%x;ext=1\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        for i in range(len(out)):
            conn.sendall(out[i:i + 1])
        return b""
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def serve(conn, cid):
    f = conn.makefile("rb")
    try:
        while True:
            head = read_head(f)
            if head is None:
                return
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            if line.split(" ")[1].split("?")[0].endswith("/early"):
                with lock:
                    state["requests"] += 1
                    state["last"] = head
                conn.sendall(b"HTTP/1.1 413 Content Too Large\r\n"
                             b"Content-Length: 2\r\n\r\n{}")
                read_body(f, head)
                continue
            read_body(f, head)
            method, target = line.split(" ")[0], line.split(" ")[1]
            path, _, qs = target.partition("?")
            query = dict(p.partition("=")[::2] for p in qs.split("&") if p)
            if path == "/_counts":
                with lock:
                    body = json.dumps({"effects": effects,
                                       "requests": state["requests"]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
                continue
            if path == "/_last":
                with lock:
                    body = state["last"]
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
                continue
            key = header(head, b"idempotency-key") or ""
            with lock:
                state["requests"] += 1
                state["last"] = head
                effects[key] = effects.get(key, 0) + 1
                state["tickets"] += 1
                ticket = state["tickets"]
            case = path.rsplit("/", 1)[-1]
            out = answer(case, query, key, ticket, conn, method, cid)
            if out is None:
                return
            conn.sendall(out)
            if case == "closeidle":
                while not os.path.exists(os.path.join(DIR, "closenow")):
                    threading.Event().wait(0.02)
                conn.close()
                write(os.path.join(DIR, "closed"), "1")
                return
    except (ConnectionError, ValueError, IndexError):
        return
    finally:
        conn.close()


def main():
    s = socket.socket(socket.AF_INET6 if ":" in ADDRESS else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ADDRESS, 0))
    s.listen(512)
    write(os.path.join(DIR, "port"), str(s.getsockname()[1]))
    cid = 0
    while True:
        c, _ = s.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid += 1
        threading.Thread(target=serve, args=(c, cid), daemon=True).start()


main()
