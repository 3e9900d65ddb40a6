#!/usr/bin/env python3
"""bench/slow_client.py -- the load client of bench/gateway.sh's "slow
upstream" scenario. Standard library only.

  slow_client.py burst URL N [options]
      N concurrent POSTs to URL, each on a connection of its own with a
      distinct Idempotency-Key, a small JSON body; waits for every answer.
      Prints one JSON line: wall time from the first connect to the last
      answer, answers by status, failures by reason (connect errors, resets,
      connections closed without an answer, calls still unanswered at
      --timeout), per-call latency p50/p99/max.
        --timeout S       give up after S seconds (default 120): a stuck
                          run ends with its unanswered calls counted
        --key-prefix P    keys are P-0 .. P-(N-1) (default: random)
        --sent-file F     create F once every call is sent (or failed to
                          connect): the calls are in flight from then on
        --done-file F     create F once every call is answered or failed
        --watch-pid PID   sample /proc/PID/status while the calls are in
                          flight: peak Threads (and their names at the
                          peak), peak VmRSS, peak open
                          descriptors, VmHWM at the end
        --stats-url U     the upstream's /__stats: reset before, read
                          after (the most calls it had waiting at once)

  slow_client.py probe URL [options]
      Latency of quick requests on other connections while a burst is in
      flight: --gets N unkeyed GETs of URL and --replays N POSTs of
      --replay-key with the body a seed call used (so they are replays),
      each kind on --parallel keep-alive connections, one request at a time
      per connection. Stops sending when --stop-file appears (the burst is
      over: later figures would not be "while in flight"). Prints one JSON
      line with p50/p99/max ms per kind; a request unanswered after
      --timeout S (default 10) counts as a timeout and its connection is
      replaced; it counts as --timeout in the percentiles. --stats-url U: the upstream's /__stats, read at start and
      end (how many calls were really in flight meanwhile).

  slow_client.py seed URL KEY
      One keyed POST with the probe's body (the key the replays use).

  slow_client.py idle STATS_URL [--timeout S]
      Waits until the upstream has no call in flight (between runs).

One epoll loop over non-blocking sockets, no thread or coroutine per call:
the client must hold 8,000 connections and stay cheap beside the proxies it
measures, on a machine whose cores they share. It raises its own soft
RLIMIT_NOFILE to the hard limit (a descriptor per call).
"""
import errno
import json
import os
import random
import resource
import select
import socket
import sys
import time
import urllib.parse

import benchargs  # noqa: E402 (bench/, beside this script)

BODY = b'{"title":"bench","priority":"normal","n":%d}'
PROBE_BODY = b'{"title":"probe","priority":"normal"}'


def parse_url(url):
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        sys.exit("slow_client: an http:// URL, not %r" % url)
    path = (u.path or "/") + ("?" + u.query if u.query else "")
    return (u.hostname, u.port or 80), "%s:%d" % (u.hostname, u.port or 80), path


def request(method, path, host, key=None, body=None):
    head = ["%s %s HTTP/1.1" % (method, path), "Host: " + host]
    if key is not None:
        head.append("Idempotency-Key: " + key)
    if body is not None:
        head.append("Content-Type: application/json")
        head.append("Content-Length: %d" % len(body))
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


def complete(buf, eof):
    """(status, bytes used) once buf holds a whole response, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ")[1])
    except (IndexError, ValueError):
        return (-1, len(buf))
    if 100 <= status < 200:  # an interim answer: the final one follows
        rest = complete(buf[end + 4:], eof)
        return rest and (rest[0], end + 4 + rest[1])
    length = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value.strip())
        elif name == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        stop = buf.find(b"\r\n0\r\n\r\n", end)
        if stop < 0 and buf[end + 4:end + 9] == b"0\r\n\r\n":
            return (status, end + 9)
        return (status, stop + 7) if stop >= 0 else None
    if length is None:
        return (status, len(buf)) if eof else None
    if len(buf) >= end + 4 + length:
        return (status, end + 4 + length)
    return None


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def touch(path):
    if path:
        with open(path + ".tmp", "w"):
            pass
        os.rename(path + ".tmp", path)


class Watch:
    """Peak Threads / VmRSS / descriptors of one process, sampled."""

    def __init__(self, pid):
        self.pid = pid
        self.threads = 0
        self.names = {}
        self.rss_kb = 0
        self.fds = 0
        self.hwm_kb = 0
        self.gone = False
        self.next_fd = 0.0

    def status(self):
        try:
            with open("/proc/%d/status" % self.pid) as f:
                return dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            self.gone = True
            return None

    def sample(self, now):
        st = self.status()
        if st is None:
            return
        threads = int(st["Threads"])
        if threads > self.threads:
            # Which threads they are, at the peak (named by their makers).
            self.threads = threads
            self.names = {}
            try:
                for t in os.listdir("/proc/%d/task" % self.pid):
                    with open("/proc/%d/task/%s/comm" % (self.pid, t)) as f:
                        name = f.read().strip()
                    self.names[name] = self.names.get(name, 0) + 1
            except OSError:
                pass
        self.rss_kb = max(self.rss_kb, int(st["VmRSS"].split()[0]))
        # Counting descriptors lists a directory of thousands: less often.
        if now >= self.next_fd:
            self.next_fd = now + 0.2
            try:
                self.fds = max(self.fds, len(os.listdir("/proc/%d/fd" % self.pid)))
            except OSError:
                pass

    def end(self):
        st = self.status()
        if st is not None:
            self.hwm_kb = int(st["VmHWM"].split()[0])
            self.sample(float("inf"))
        return {"threads": self.threads, "thread_names": self.names, "rss_mb": round(self.rss_kb / 1024, 1),
                "hwm_mb": round(self.hwm_kb / 1024, 1), "fds": self.fds,
                "exited": self.gone}


def burst(url, n, timeout, prefix, sent_file, done_file, watch_pid, stats_url):
    raise_nofile()
    if stats_url:
        stats(stats_url + "?reset")
    addr, host, path = parse_url(url)
    watch = Watch(watch_pid) if watch_pid else None
    ep = select.epoll()
    conns = {}  # fd -> [socket, request bytes left to send, buffer, start]
    statuses = {}
    failures = {}
    latencies = []
    sent = 0
    last = None

    def fail(fd, why):
        nonlocal sent
        failures[why] = failures.get(why, 0) + 1
        c = conns.pop(fd)
        if c[1] is not None:  # never sent: it still counts as "sent" or not
            sent += 1
        ep.unregister(fd)
        c[0].close()

    start = time.monotonic()
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS):
            failures["connect " + errno.errorcode.get(err, str(err))] = \
                failures.get("connect " + errno.errorcode.get(err, str(err)), 0) + 1
            sent += 1
            s.close()
            continue
        body = BODY % i
        conns[s.fileno()] = [s, request("POST", path, host, "%s-%d" % (prefix, i), body),
                             b"", time.monotonic()]
        ep.register(s.fileno(), select.EPOLLOUT)
    deadline = start + timeout
    told_sent = False
    while conns:
        now = time.monotonic()
        if not told_sent and sent >= n:
            touch(sent_file)
            told_sent = True
        if watch:
            watch.sample(now)
        if now >= deadline:
            break
        for fd, ev in ep.poll(min(0.02, deadline - now), 4096):
            c = conns[fd]
            s = c[0]
            if c[1] is not None:  # connecting, or sending the request
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    fail(fd, "connect " + errno.errorcode.get(err, str(err)))
                    continue
                try:
                    k = s.send(c[1])
                except OSError as e:
                    fail(fd, "send " + errno.errorcode.get(e.errno, str(e.errno)))
                    continue
                c[1] = c[1][k:]
                if not c[1]:
                    c[1] = None
                    sent += 1
                    ep.modify(fd, select.EPOLLIN)
                continue
            try:
                data = s.recv(65536)
            except OSError as e:
                fail(fd, "recv " + errno.errorcode.get(e.errno, str(e.errno)))
                continue
            c[2] += data
            got = complete(c[2], not data)
            if got is None:
                if not data:
                    fail(fd, "closed without an answer")
                continue
            last = time.monotonic()
            statuses[got[0]] = statuses.get(got[0], 0) + 1
            latencies.append(last - c[3])
            del conns[fd]
            ep.unregister(fd)
            s.close()
    if not told_sent:
        touch(sent_file)
    end = time.monotonic()
    if conns:
        failures["unanswered at %gs" % timeout] = len(conns)
        for c in conns.values():
            c[0].close()
    touch(done_file)
    ok = sum(v for k, v in statuses.items() if 200 <= k < 300)
    out = {
        "n": n,
        "wall_s": round((last if not conns and last else end) - start, 3),
        "ok": ok,
        "errors": n - ok,
        "timed_out": bool(conns),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "failures": failures,
        "p50_s": round(pct(latencies, 50) or 0, 3),
        "p99_s": round(pct(latencies, 99) or 0, 3),
        "max_s": round(max(latencies) if latencies else 0, 3),
    }
    if watch:
        out["watch"] = watch.end()
    if stats_url:
        st = stats(stats_url)
        out["upstream_peak"] = st and st["peak"]
    print(json.dumps(out), flush=True)


def stats(url):
    addr, host, path = parse_url(url)
    try:
        with socket.create_connection(addr, timeout=5) as s:
            s.sendall(request("GET", path, host).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
            buf = b""
            while True:
                d = s.recv(65536)
                buf += d
                if not d:
                    break
        return json.loads(buf.split(b"\r\n\r\n", 1)[1])
    except (OSError, ValueError):
        return None


def probe(url, gets, replays, replay_key, parallel, timeout, stop_file, stats_url):
    raise_nofile()
    addr, host, path = parse_url(url)
    ep = select.epoll()
    kinds = {
        "get": {"left": gets, "req": request("GET", path, host), "ms": [], "timeouts": 0,
                "errors": {}},
        "replay": {"left": replays,
                   "req": request("POST", path, host, replay_key, PROBE_BODY),
                   "ms": [], "timeouts": 0, "errors": {}},
    }
    conns = {}  # fd -> [socket, kind, buffer, request start or None]
    before = stats(stats_url) if stats_url else None
    start = time.monotonic()
    stopped = False

    def open_conn(kind):
        s = socket.create_connection(addr)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns[s.fileno()] = [s, kind, b"", None]
        ep.register(s.fileno(), select.EPOLLIN)
        send_next(s.fileno())

    def send_next(fd):
        c = conns[fd]
        k = kinds[c[1]]
        if stopped or k["left"] <= 0:
            return
        k["left"] -= 1
        c[2] = b""
        c[3] = time.monotonic()
        c[0].sendall(k["req"])  # small: fits the socket buffer at once

    def drop(fd, why):
        c = conns.pop(fd)
        ep.unregister(fd)
        c[0].close()
        if why:
            errs = kinds[c[1]]["errors"]
            errs[why] = errs.get(why, 0) + 1
        if not stopped and kinds[c[1]]["left"] > 0:
            open_conn(c[1])

    for kind in kinds:
        for _ in range(parallel if kinds[kind]["left"] else 0):
            open_conn(kind)
    while any(c[3] is not None for c in conns.values()):
        now = time.monotonic()
        if not stopped and stop_file and os.path.exists(stop_file):
            stopped = True
        for fd in [fd for fd, c in conns.items()
                   if c[3] is not None and now - c[3] > timeout]:
            # Counted at the timeout in the percentiles: a request never
            # answered is no faster than one answered then.
            kinds[conns[fd][1]]["timeouts"] += 1
            kinds[conns[fd][1]]["ms"].append(timeout * 1000)
            conns[fd][3] = None
            drop(fd, None)
        for fd, ev in ep.poll(0.01, 64):
            c = conns.get(fd)
            if c is None:
                continue
            try:
                data = c[0].recv(65536)
            except OSError as e:
                drop(fd, "recv " + errno.errorcode.get(e.errno, str(e.errno)))
                continue
            c[2] += data
            got = complete(c[2], not data)
            if got is None:
                if not data:
                    drop(fd, "closed without an answer")
                continue
            k = kinds[c[1]]
            k["ms"].append((time.monotonic() - c[3]) * 1000)
            if not 200 <= got[0] < 300:
                k["errors"][str(got[0])] = k["errors"].get(str(got[0]), 0) + 1
            c[3] = None
            if not data or b"\r\nconnection: close" in c[2][:got[1]].lower():
                drop(fd, None)
            else:
                send_next(fd)
    elapsed = time.monotonic() - start
    after = stats(stats_url) if stats_url else None
    out = {"seconds": round(elapsed, 3),
           "inflight_start": before and before["inflight"],
           "inflight_end": after and after["inflight"],
           "stopped_by_burst_end": stopped}
    for name, k in kinds.items():
        ms = k["ms"]
        out[name] = {"n": len(ms) - k["timeouts"], "timeouts": k["timeouts"],
                     "errors": k["errors"],
                     "p50_ms": round(pct(ms, 50), 2) if ms else None,
                     "p99_ms": round(pct(ms, 99), 2) if ms else None,
                     "max_ms": round(max(ms), 2) if ms else None}
    print(json.dumps(out), flush=True)


def main():
    mode, opts, pos = benchargs.parse(__doc__)
    if mode == "burst" and len(pos) == 2:
        burst(pos[0], int(pos[1]), float(opts.get("timeout", 120)),
              opts.get("key-prefix", "slow-%08x" % random.getrandbits(32)),
              opts.get("sent-file"), opts.get("done-file"),
              int(opts["watch-pid"]) if "watch-pid" in opts else None,
              opts.get("stats-url"))
    elif mode == "probe" and len(pos) == 1:
        probe(pos[0], int(opts.get("gets", 200)), int(opts.get("replays", 0)),
              opts.get("replay-key", "probe-replayed-key"), int(opts.get("parallel", 2)),
              float(opts.get("timeout", 10)), opts.get("stop-file"), opts.get("stats-url"))
    elif mode == "seed" and len(pos) == 2:
        addr, host, path = parse_url(pos[0])
        with socket.create_connection(addr, timeout=30) as s:
            s.sendall(request("POST", path, host, pos[1], PROBE_BODY))
            buf = b""
            while complete(buf, False) is None:
                d = s.recv(65536)
                if not d:
                    break
                buf += d
        got = complete(buf, True)
        if not got or not 200 <= got[0] < 300:
            sys.exit("slow_client: seed call answered %r" % (got and got[0]))
    elif mode == "idle" and len(pos) == 1:
        deadline = time.monotonic() + float(opts.get("timeout", 60))
        while True:
            st = stats(pos[0])
            if st is not None and st["inflight"] == 0:
                return
            if time.monotonic() > deadline:
                sys.exit("slow_client: the upstream still has %s calls in flight"
                         % (st and st["inflight"]))
            time.sleep(0.05)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
