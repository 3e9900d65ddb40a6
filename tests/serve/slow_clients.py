#!/usr/bin/env python3
"""Slow and greedy clients of idem serve, on raw sockets (stdlib only).

Usage: slow_clients.py SCENARIO GATEWAY_URL ADMIN_URL [ARGS...]

Each scenario prints one JSON object with what it saw; the calling test
(cli_serve_slow.sh) decides what is right. Every wait here waits for an
event (a byte, a close, a metric) with a generous upper bound, so that a
loaded machine makes a run slower, not wrong.

  crowd N        N connections from 127.0.0.2-127.0.0.9 send a request head
                 one byte every 3 s; once the gateway holds them all
                 (idem_gateway_connections), probe GETs from 127.0.0.1.
  deadline       with --header-timeout 2s: a head sent one byte a second
                 (its request line at once, or not) is cut off; a whole
                 head is answered; a keep-alive connection idle past the
                 deadline is still served; its second head sent slowly is
                 cut off too.
  perclient N    with --max-connections-per-client N: N connections from
                 127.0.0.2 are served, the next one from there is closed
                 unanswered, 127.0.0.3 is still served.
  overall N      with --max-connections N: N connections are held; the
                 next one waits unanswered until one of them closes.
"""
import json
import resource
import selectors
import socket
import sys
import threading
import time
import urllib.request

BOUND = 30.0  # seconds: the upper bound of any single wait


def raise_nofile():
    """The soft descriptor limit up to the hard one: N sockets need N."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def split_url(url):
    hp = url.split("://", 1)[1].rstrip("/")
    host, port = hp.rsplit(":", 1)
    return host.strip("[]"), int(port)


def metric(admin, name):
    """A value of the gateway's /metrics, None when it is not there."""
    try:
        with urllib.request.urlopen(admin + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def connect_from(source, gw, timeout=BOUND):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(gw)
    return s


def request(path, close=False):
    return ("GET %s HTTP/1.1\r\nHost: slow-test\r\n%s\r\n"
            % (path, "Connection: close\r\n" if close else "")).encode()


def read_response(s, timeout=BOUND):
    """(status, body) of one response; (None, why) when the connection ended
    before a whole one came: "closed" (an orderly close), "reset", or
    "timeout"."""
    s.settimeout(timeout)
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                return None, "closed" if not buf else "partial"
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                return None, "partial"
            rest += chunk
        return status, rest[:length].decode("latin-1")
    except socket.timeout:
        return None, "timeout"
    except (ConnectionResetError, BrokenPipeError):
        return None, "reset"


def state_of(s):
    """open, closed (by the peer) or answered (bytes came), without
    waiting."""
    try:
        data = s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return "open"
    except OSError:
        return "closed"
    return "answered" if data else "closed"


class Trickler(threading.Thread):
    """Sends a request head that never ends, one byte per interval, on one
    connection, until the gateway closes it (or answers) or BOUND passes.
    closed_after: seconds from the first byte to the close, or None."""

    def __init__(self, s, interval, path="/trickle", line_at_once=False):
        super().__init__(daemon=True)
        self.s = s
        self.interval = interval
        self.head = (request(path)[:-2] + b"X-Slow: " + b"a" * 100000)
        if line_at_once:  # the request line whole, the headers slowly
            line = self.head.index(b"\r\n") + 2
            s.sendall(self.head[:line])
            self.head = self.head[line:]
        self.closed_after = None
        self.outcome = "open"

    def run(self):
        sel = selectors.DefaultSelector()
        sel.register(self.s, selectors.EVENT_READ)
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < BOUND:
            try:
                self.s.send(self.head[i:i + 1])
                i += 1
            except OSError:
                pass  # closed: the read below says how
            if sel.select(self.interval):
                self.outcome = state_of(self.s)
                if self.outcome == "open":
                    continue  # woken without news
                self.closed_after = time.monotonic() - t0
                return
        self.outcome = "still-open"


def probes(gw, path, n=5):
    """n GETs from 127.0.0.1, one after another, each on a new connection:
    their statuses and times (connect to the whole answer, ms)."""
    statuses, times = [], []
    for k in range(n):
        t = time.monotonic()
        try:
            p = connect_from("127.0.0.1", gw)
            p.sendall(request("%s-%d" % (path, k), close=True))
            status, _ = read_response(p)
            p.close()
        except OSError as e:
            status = "error: %s" % e
        statuses.append(status)
        times.append(round((time.monotonic() - t) * 1000, 1))
    return statuses, times


def crowd(gw, admin, n):
    """N slow connections, then probes; see the module's docstring."""
    raise_nofile()
    out = {"slow": n}
    sources = ["127.0.0.%d" % i for i in range(2, 10)]
    # Probes before the crowd, to compare with.
    out["idle_status"], out["idle_ms"] = probes(gw, "/probe-idle")

    sel = selectors.DefaultSelector()
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((sources[i % len(sources)], 0))
        s.connect_ex(gw)
        sel.register(s, selectors.EVENT_WRITE, i)
        socks.append(s)
    # Connected: writable. A refused one (per-client limit) is an error.
    pending, deadline = n, time.monotonic() + 4 * BOUND
    errors = 0
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(1):
            sel.unregister(key.fileobj)
            pending -= 1
            if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                errors += 1
    out["connect_errors"] = errors + pending
    head = request("/slow")[:-2] + b"X-Slow: " + b"a" * 100000
    sent = [0] * n
    stop = threading.Event()

    def trickle():
        # One byte per connection every 3 s: each stays far from a whole
        # head for the whole test.
        while not stop.is_set():
            for i, s in enumerate(socks):
                try:
                    sent[i] += s.send(head[sent[i]:sent[i] + 1])
                except OSError:
                    pass
            stop.wait(3)

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    # The event: the gateway holds them all (not the kernel's listen queue).
    t = time.monotonic()
    held = None
    while time.monotonic() - t < 2 * BOUND:
        held = metric(admin, "idem_gateway_connections")
        if held is not None and held >= n:
            break
        time.sleep(0.1)
    out["held"] = held
    out["held_wait_s"] = round(time.monotonic() - t, 1)
    out["probe_status"], out["probe_ms"] = probes(gw, "/probe")
    states = {}
    for s in socks:
        st = state_of(s)
        states[st] = states.get(st, 0) + 1
    out["slow_states"] = states
    stop.set()
    th.join()
    for s in socks:
        s.close()
    return out


def deadline(gw, admin):
    """See the module's docstring; --header-timeout is 2 s."""
    out = {}
    a = Trickler(connect_from("127.0.0.2", gw), 1.0, "/a", line_at_once=True)
    a.start()
    # B: a whole head, in two pieces, is answered.
    b = connect_from("127.0.0.3", gw)
    r = request("/b1")
    b.sendall(r[:10])
    b.sendall(r[10:])
    out["b1"] = read_response(b)[0]
    # C starts after B's answer: once C is cut off, B has been idle longer
    # than the header timeout.
    c = Trickler(connect_from("127.0.0.4", gw), 1.0, "/c")
    c.start()
    # D: a first request answered, then its second head sent slowly.
    d = connect_from("127.0.0.5", gw)
    d.sendall(request("/d1"))
    out["d1"] = read_response(d)[0]
    dt = Trickler(d, 1.0, "/d2")
    dt.start()
    for name, th in (("a", a), ("c", c), ("d2", dt)):
        th.join()
        out[name] = th.outcome
        out[name + "_after_s"] = (round(th.closed_after, 1)
                                  if th.closed_after is not None else None)
    # B, idle past the header timeout, still serves a next request.
    try:
        b.sendall(request("/b2"))
        out["b2"] = read_response(b)[0]
    except OSError as e:
        out["b2"] = "error: %s" % e
    b.close()
    out["header_timeouts"] = metric(admin, "idem_gateway_header_timeouts_total")
    return out


def perclient(gw, admin, n):
    """See the module's docstring."""
    out = {"held": []}
    held = []
    for k in range(n):
        s = connect_from("127.0.0.2", gw)
        s.sendall(request("/held-%d" % k))
        out["held"].append(read_response(s)[0])
        held.append(s)
    # One more from the same address: accepted by the kernel, then closed
    # by the gateway without an answer.
    try:
        s = connect_from("127.0.0.2", gw)
        try:
            s.sendall(request("/over"))
        except OSError:
            pass
        status, why = read_response(s)
        out["over"] = status if status else why
        s.close()
    except OSError as e:
        out["over"] = "connect: %s" % e
    s = connect_from("127.0.0.3", gw)
    s.sendall(request("/other", close=True))
    out["other"] = read_response(s)[0]
    s.close()
    out["refused"] = metric(admin, "idem_gateway_connections_refused_total")
    # Once one of the held connections is gone, the address is served
    # again (retried until the gateway has seen the close).
    held.pop().close()
    out["again"] = None
    t = time.monotonic()
    while time.monotonic() - t < BOUND:
        s = connect_from("127.0.0.2", gw)
        try:
            s.sendall(request("/again", close=True))
            status, _ = read_response(s)
        except OSError:
            status = None
        s.close()
        if status:
            out["again"] = status
            break
        time.sleep(0.1)
    for s in held:
        s.close()
    return out


def overall(gw, admin, n):
    """See the module's docstring."""
    out = {"held": []}
    held = []
    for k in range(n):
        s = connect_from("127.0.0.%d" % (2 + k), gw)
        s.sendall(request("/held-%d" % k))
        out["held"].append(read_response(s)[0])
        held.append(s)
    out["connections"] = metric(admin, "idem_gateway_connections")
    s = connect_from("127.0.0.%d" % (2 + n), gw)
    s.sendall(request("/waits", close=True))
    # Not answered while the others are held. A wait of 1 s can only make
    # this check pass wrongly on a slow machine, never fail wrongly.
    out["while_full"] = read_response(s, 1.0)[1]
    held.pop(0).close()
    out["after_close"] = read_response(s)[0]
    s.close()
    for h in held:
        h.close()
    return out


def main():
    scenario, gw, admin = sys.argv[1], split_url(sys.argv[2]), sys.argv[3]
    args = [int(a) for a in sys.argv[4:]]
    if scenario == "crowd":
        out = crowd(gw, admin, *args)
    elif scenario == "deadline":
        out = deadline(gw, admin)
    elif scenario == "perclient":
        out = perclient(gw, admin, *args)
    elif scenario == "overall":
        out = overall(gw, admin, *args)
    else:
        sys.exit("unknown scenario " + scenario)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
