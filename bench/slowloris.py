#!/usr/bin/env python3
"""bench/slowloris.py -- the slow header senders and the probe of
bench/gateway.sh's "slowloris" scenario. Standard library only.

  slowloris.py hold URL N [options]
      N connections to URL that each send a request head that never ends, a
      few bytes at a time: --chunk B bytes (default 2) every --interval S
      seconds (default 1), the connections' turns spread evenly over the
      interval (N / S sends a second in all, never a burst of N at once).
      The head is a GET's request line, Host, then header lines
      ("X-Slowloris-K: ...") for as long as the hold lasts: it stays far
      below both servers' header size limits, and it is never whole.
        --ready-file F    create F once every connection has sent its first
                          bytes and, with --held-url, the server says it
                          holds them all (not the kernel's listen queue);
                          or once it is clear it will not (a sender closed
                          without --reopen, or 60 s gone): the figures say
        --held-url U      where the server says how many client connections
                          it holds: idem serve's /metrics
                          (idem_gateway_connections) or nginx's stub_status
                          ("Reading:", heads being read); its growth from
                          before the first connect is what counts
        --stop-file F     stop when F appears
        --timeout S       stop after S seconds at most (default 300)
        --reopen 1        a connection the server closes (its header
                          timeout) is opened again at once and starts a new
                          head, as slowloris itself does; without it, a
                          sender closed is gone
      Prints one JSON line: connect errors, how many the server held, how
      many it closed or answered during the hold (without --reopen, each is
      a slow sender the measurement did not have: the run is not valid)
      and how many were opened again.

  slowloris.py probe URL [options]
      --n K ordinary GETs of URL (default 1000), one after another, each on
      a fresh connection (connect, send, read the whole answer; the request
      says Connection: close, so that no probe connection lingers at the
      server beside the slow ones), one every --every MS milliseconds
      (default 10; one that is late goes at once), so that the probe spans
      the senders' turns and the servers' periodic work evenly. Each
      latency is from the start of connect() to the answer's last byte.
      Prints one JSON line: answers by status, errors, p50/p90/p99/max in
      ms (nearest rank: p99 of 1,000 is the 990th). A request unanswered
      after --timeout S (default 10) is an error and counts as S in the
      percentiles.

One epoll loop holds the N connections, with no thread per connection: the
senders share the machine's cores with the servers they load, and must
cost them as little as possible. The probe runs in a process of its own so
that the senders' loop never delays its timing. Both raise their soft
RLIMIT_NOFILE to the hard limit.
"""
import errno
import json
import os
import resource
import select
import socket
import sys
import time
import urllib.parse
import urllib.request

import benchargs  # noqa: E402 (bench/, beside this script)


def parse_url(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        sys.exit("slowloris: an http:// URL, not %r" % url)
    path = (u.path or "/") + ("?" + u.query if u.query else "")
    return (u.hostname, u.port or 80), "%s:%d" % (u.hostname, u.port or 80), path


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def touch(path):
    if path:
        with open(path + ".tmp", "w"):
            pass
        os.rename(path + ".tmp", path)


def pct(values, p):
    """The nearest-rank percentile: p99 of 1,000 values is the 990th."""
    if not values:
        return None
    v = sorted(values)
    k = max(1, -(-len(v) * p // 100))  # ceil(len * p / 100)
    return v[int(k) - 1]


def held_count(url):
    """The client connections the server says it holds, None if unknown."""
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode("latin-1")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("idem_gateway_connections "):
            return int(float(line.split()[1]))
        if line.startswith("Reading:"):
            # nginx's connections whose request head it is reading (its
            # "Active connections" counts its upstream server's too).
            return int(line.split()[1])
    return None


class Head:
    """The bytes of a request head that never ends, made as they go."""

    def __init__(self, host, i):
        self.buf = ("GET /slowloris/%d HTTP/1.1\r\nHost: %s\r\n" % (i, host)).encode()
        self.lines = 0

    def take(self, n):
        while len(self.buf) < n:
            self.buf += b"X-Slowloris-%d: still-coming\r\n" % self.lines
            self.lines += 1
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def hold(url, n, interval, chunk, ready_file, held_url, stop_file, timeout, reopen):
    raise_nofile()
    addr, host, _ = parse_url(url)
    ep = select.epoll()
    slots = []  # per sender: [socket or None, Head, next send time, bytes sent]
    by_fd = {}  # fd -> index in slots
    out = {"n": n, "connect_errors": {}, "held": None, "closed_during_hold": 0,
           "answered_during_hold": 0, "reopened": 0}
    start = time.monotonic()

    def count(d, k):
        d[k] = d.get(k, 0) + 1

    def connect():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = s.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS):
            count(out["connect_errors"], errno.errorcode.get(err, str(err)))
            s.close()
            return None
        return s

    def gone(fd):
        # The server closed (or answered) sender by_fd[fd]: counted, and
        # with reopen, the sender comes back at once with a new head from
        # its start, as slowloris itself does.
        i = by_fd.pop(fd)
        c = slots[i]
        try:
            data = c[0].recv(4096, socket.MSG_PEEK)
        except OSError:
            data = b""
        out["answered_during_hold" if data else "closed_during_hold"] += 1
        ep.unregister(fd)
        c[0].close()
        c[0] = None
        if reopen:
            c[0], c[1] = connect(), Head(host, i)
            if c[0] is not None:
                out["reopened"] += 1
                by_fd[c[0].fileno()] = i
                ep.register(c[0].fileno(), select.EPOLLIN)

    # What the server holds already: the senders are held when the count
    # has grown by all of them.
    base = (held_count(held_url) or 0) if held_url else 0
    # Connects go out a hundred at a time, each hundred established before
    # the next: a thousand SYNs at once would overflow nginx's listen queue
    # (511) and wait a second for their retransmission.
    pending = {}
    for i in range(n):
        s = connect()
        if s is not None:
            pending[s.fileno()] = s
            ep.register(s.fileno(), select.EPOLLOUT)
        if len(pending) < 100 and i < n - 1:
            continue
        limit = time.monotonic() + 30
        while pending and time.monotonic() < limit:
            for fd, _ in ep.poll(1.0):
                if fd in by_fd:  # one connected before, closed already
                    gone(fd)
                    continue
                s = pending.pop(fd)
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    count(out["connect_errors"], errno.errorcode.get(err, str(err)))
                    ep.unregister(fd)
                    s.close()
                    continue
                ep.modify(fd, select.EPOLLIN)
                by_fd[fd] = len(slots)
                slots.append([s, Head(host, len(slots)), 0.0, 0])
        for fd, s in pending.items():
            count(out["connect_errors"], "connect timed out")
            ep.unregister(fd)
            s.close()
        pending = {}

    # The turns: sender k sends at t0 + k * interval / N, then every
    # interval, so that the turns come round in slot order.
    t0 = time.monotonic()
    for k, c in enumerate(slots):
        c[2] = t0 + k * interval / max(1, len(slots))
    ready = first_round_done = False
    next_held = 0.0
    deadline = start + timeout
    k = 0
    while slots:
        now = time.monotonic()
        if now >= deadline or (stop_file and os.path.exists(stop_file)):
            break
        for _ in range(len(slots)):
            c = slots[k]
            if c[2] > now:
                break
            if c[0] is not None:
                try:
                    c[3] += c[0].send(c[1].take(chunk))
                except OSError:
                    pass  # the server closed it: the poll below says so
            c[2] += interval
            k += 1
            if k == len(slots):
                k = 0
                first_round_done = True
        if not ready and first_round_done and now >= next_held:
            held = held_count(held_url) if held_url else len(by_fd)
            if held is not None:
                out["held"] = held - base
            if held is not None and held - base >= len(slots):
                touch(ready_file)
                ready = True
            next_held = time.monotonic() + 0.05
        if not ready and (now - t0 > 60 or (not reopen and out["closed_during_hold"]
                                            + out["answered_during_hold"])):
            # Not all held, and they will not be: the caller goes on and
            # reads why (held, closed) in the figures.
            touch(ready_file)
            ready = True
        wait = min(max(0.0, slots[k][2] - time.monotonic()), 0.05)
        for fd, _ in ep.poll(wait):
            gone(fd)
    if not ready:
        touch(ready_file)
    out["open_at_end"] = len(by_fd)
    out["bytes_sent_max"] = max((c[3] for c in slots), default=0)
    out["hold_s"] = round(time.monotonic() - start, 1)
    for c in slots:
        if c[0] is not None:
            c[0].close()
    print(json.dumps(out), flush=True)


def probe(url, n, every, timeout):
    raise_nofile()
    addr, host, path = parse_url(url)
    req = ("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n"
           % (path, host)).encode()
    ms, statuses, errors = [], {}, {}
    start = time.monotonic()
    for i in range(n):
        # On a fixed schedule (see the module's docstring).
        pause = start + i * every - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t = time.perf_counter()
        why = None
        try:
            with socket.create_connection(addr, timeout=timeout) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.sendall(req)
                buf = b""
                while True:
                    d = s.recv(65536)
                    if not d:
                        break
                    buf += d
                    end = buf.find(b"\r\n\r\n")
                    if end >= 0:
                        head = buf[:end].decode("latin-1").lower()
                        cl = [l for l in head.split("\r\n") if l.startswith("content-length:")]
                        if cl and len(buf) >= end + 4 + int(cl[0].split(":")[1]):
                            break
            status = buf.split(b" ", 2)[1].decode() if buf.startswith(b"HTTP/") else None
            if status is None:
                why = "closed without an answer"
        except socket.timeout:
            why = "timeout"
        except OSError as e:
            why = errno.errorcode.get(e.errno, str(e))
        elapsed = (time.perf_counter() - t) * 1000
        if why:
            errors[why] = errors.get(why, 0) + 1
            ms.append(max(elapsed, timeout * 1000) if why == "timeout" else elapsed)
            continue
        statuses[status] = statuses.get(status, 0) + 1
        ms.append(elapsed)
    out = {"n": n, "seconds": round(time.monotonic() - start, 2), "statuses": statuses,
           "errors": errors}
    for p in (50, 90, 99):
        out["p%d_ms" % p] = round(pct(ms, p), 2) if ms else None
    out["max_ms"] = round(max(ms), 2) if ms else None
    print(json.dumps(out), flush=True)


def main():
    mode, opts, pos = benchargs.parse(__doc__)
    if mode == "hold" and len(pos) == 2:
        hold(pos[0], int(pos[1]), float(opts.get("interval", 1)), int(opts.get("chunk", 2)),
             opts.get("ready-file"), opts.get("held-url"), opts.get("stop-file"),
             float(opts.get("timeout", 300)), opts.get("reopen", "0") == "1")
    elif mode == "probe" and len(pos) == 1:
        probe(pos[0], int(opts.get("n", 1000)), float(opts.get("every", 10)) / 1000,
              float(opts.get("timeout", 10)))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
