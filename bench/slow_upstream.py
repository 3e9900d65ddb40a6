#!/usr/bin/env python3
"""bench/slow_upstream.py -- the slow tool API of bench/gateway.sh's
"slow upstream" scenario.

Usage: python3 bench/slow_upstream.py PORT_FILE [DELAY_S]

Answers each POST (and any other method but GET) after DELAY_S seconds
(default 1), every GET at once, on HTTP/1.1 keep-alive connections. A
request may ask another delay with the header X-Bench-Delay-Ms.

It must itself answer 8,000 concurrent calls in about DELAY_S, so that
what the scenario measures is the proxy in front of it: one epoll loop over
non-blocking sockets and a heap of timers, no thread, task or coroutine per
call (asyncio's streams and protocols cost about 250 us of CPU a call here,
which put 8,000 calls at 2.5 s on two shared cores).

GET /__stats answers {"inflight", "peak", "slow", "fast"}: slow calls
waiting now, the most that waited at once, and the calls answered (slow and
fast) since start or the last GET /__stats?reset. The bench reads it
directly (never through a proxy) to see how many calls a proxy really had
in flight, and waits for 0 between runs.

When listening, it writes its port to PORT_FILE (through a rename, so a
reader never sees half a number). Standard library only.
"""
import heapq
import json
import os
import resource
import select
import signal
import socket
import sys
import time

DELAY = 1.0
STATS = {"inflight": 0, "peak": 0, "slow": 0, "fast": 0}
SLOW_BODY = b'{"ticket_id":%d,"status":"open","title":"bench"}'
FAST_BODY = b'{"status":"ok"}'


def response(status, body, close):
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n" %
            (status, len(body), b"Connection: close\r\n" if close else b"")) + body


class Conn:
    """One connection: requests one at a time, as proxies send them."""
    __slots__ = ("sock", "fd", "buf", "out", "busy", "close_after", "closed")

    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = b""
        self.out = b""
        self.busy = None  # the pending slow answer's timer entry
        self.close_after = False
        self.closed = False


class Server:
    def __init__(self, ep, lsock):
        self.ep = ep
        self.lsock = lsock
        self.conns = {}
        self.timers = []  # (due, seq, conn, close)
        self.seq = 0

    def accept(self):
        while True:
            try:
                s, _ = self.lsock.accept()
            except BlockingIOError:
                return
            except OSError:
                return  # EMFILE and the like: the next readiness retries
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = Conn(s)
            self.conns[c.fd] = c
            self.ep.register(c.fd, select.EPOLLIN)

    def close(self, c):
        if c.closed:
            return
        c.closed = True
        if c.busy is not None:
            # A proxy that gave up (or was killed): the call counts out now,
            # not when its timer fires, so the bench's wait for 0 is true.
            STATS["inflight"] -= 1
            c.busy = None
        del self.conns[c.fd]
        self.ep.unregister(c.fd)
        c.sock.close()

    def write(self, c, data):
        c.out += data
        try:
            k = c.sock.send(c.out)
        except BlockingIOError:
            k = 0
        except OSError:
            self.close(c)
            return
        c.out = c.out[k:]
        if c.out:
            self.ep.modify(c.fd, select.EPOLLIN | select.EPOLLOUT)
        elif c.close_after:
            self.close(c)

    def readable(self, c):
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self.close(c)
            return
        if not data:
            self.close(c)
            return
        c.buf += data
        self.parse(c)

    def parse(self, c):
        while c.busy is None and not c.closed and not c.close_after:
            end = c.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(c.buf) > 65536:
                    self.close(c)
                return
            head = c.buf[:end].decode("latin-1").split("\r\n")
            parts = head[0].split(" ")
            if len(parts) != 3:
                c.close_after = True
                self.write(c, response(b"400 Bad Request", b"{}", True))
                return
            method, target, version = parts
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(c.buf) < end + 4 + length:
                return  # the body is still coming
            c.buf = c.buf[end + 4 + length:]
            conn = headers.get("connection", "").lower()
            close = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive")
            if method == "GET":
                if target.startswith("/__stats"):
                    body = json.dumps(STATS).encode()
                    if "reset" in target:
                        STATS.update(peak=STATS["inflight"], slow=0, fast=0)
                else:
                    STATS["fast"] += 1
                    body = FAST_BODY
                c.close_after = close
                self.write(c, response(b"200 OK", body, close))
                continue
            delay = DELAY
            if "x-bench-delay-ms" in headers:
                delay = int(headers["x-bench-delay-ms"]) / 1000.0
            self.seq += 1
            c.busy = (time.monotonic() + delay, self.seq, c, close)
            heapq.heappush(self.timers, c.busy)
            STATS["inflight"] += 1
            STATS["peak"] = max(STATS["peak"], STATS["inflight"])

    def fire(self, now):
        while self.timers and self.timers[0][0] <= now:
            entry = heapq.heappop(self.timers)
            c = entry[2]
            if c.busy is not entry:  # its connection closed meanwhile
                continue
            c.busy = None
            STATS["inflight"] -= 1
            STATS["slow"] += 1
            c.close_after = entry[3]
            self.write(c, response(b"201 Created", SLOW_BODY % STATS["slow"], entry[3]))
            if not c.closed:
                self.parse(c)

    def run(self, stop):
        lfd = self.lsock.fileno()
        while not stop:
            now = time.monotonic()
            self.fire(now)
            wait = self.timers[0][0] - now if self.timers else 1.0
            try:
                events = self.ep.poll(max(0.0, min(wait, 1.0)))
            except InterruptedError:
                continue
            for fd, ev in events:
                if fd == lfd:
                    self.accept()
                    continue
                c = self.conns.get(fd)
                if c is None:
                    continue
                if ev & select.EPOLLOUT and c.out:
                    self.write(c, b"")
                    if not c.out and not c.closed:
                        self.ep.modify(fd, select.EPOLLIN)
                if not c.closed and ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                    self.readable(c)


def main(port_file):
    # A connection per call in flight from each proxy: as many descriptors
    # as the machine lets a process have.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    # The backlog as deep as the kernel allows (net.core.somaxconn): 8,000
    # connects arrive at once.
    lsock.listen(65535)
    lsock.setblocking(False)
    ep = select.epoll()
    ep.register(lsock.fileno(), select.EPOLLIN)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    with open(port_file + ".tmp", "w") as f:
        f.write("%d\n" % lsock.getsockname()[1])
    os.rename(port_file + ".tmp", port_file)
    Server(ep, lsock).run(stop)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[1].startswith("-"):
        sys.exit("usage: slow_upstream.py PORT_FILE [DELAY_S]")
    if len(sys.argv) == 3:
        DELAY = float(sys.argv[2])
    main(sys.argv[1])
