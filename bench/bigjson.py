#!/usr/bin/env python3
"""bench/bigjson.py -- the clients of bench/gateway.sh's "bigjson" scenario
(BENCH_ONLY=bigjson): large keyed JSON bodies. Standard library only.

  bigjson.py gen FILE BYTES [SEED]
      Writes FILE, a JSON array of integers of about BYTES bytes (it stops at
      the first element past BYTES), the same bytes for the same BYTES and
      SEED (default 52) on any machine. The integers are mixed as real ids
      are: 85% within 2^53 (1 to 16 digits, most of them 6 to 16), 10%
      64-bit ids beyond 2^53 (2^53 to 2^63), 5% of 20 to 25 digits (beyond
      1e21: exponent form once canonical); one in ten negative.

  bigjson.py cost URL FILE CONTENT_TYPE N --pids PID[,PID...] | --children PID
      POSTs FILE's bytes to URL N times, one after another on one keep-alive
      connection, each with a fresh Idempotency-Key (a claim, a forward and
      a record at a gateway, never a replay: an answer with
      Idempotent-Replayed is an error), after 2 untimed requests. Measures
      each request's latency (send to the answer's last byte) and the CPU
      time the server's processes (--pids, or the children of --children:
      nginx's workers) spent over the N requests: the sum over their
      threads of /proc/PID/task/TID/schedstat's run time (nanoseconds),
      and /proc/PID/stat's utime + stime (clock ticks, threads that ended
      included) beside it; the schedstat figure is used unless a thread
      came or went during the batch. Prints one JSON line.

  bigjson.py heavy URL FILE CLIENTS --stop-file F [--ready-file R]
                  [--connection fresh|keepalive]
      CLIENTS threads POST FILE's bytes back to back with fresh keys as
      application/json until F appears, each on a fresh connection per
      request (fresh, the default: Connection: close, as a client without
      a pool) or on one keep-alive connection of its own (keepalive); R is
      created once every client has sent its first body. Prints one JSON
      line: requests answered, their statuses, p50 and max latency.

  bigjson.py probe URL [--n K] [--every MS] [--seconds S] [--timeout S]
      Small keyed POSTs (a fresh key each, a fresh connection each, as a
      client without a pool), one every MS ms (default 10; a late one goes
      at once), K at most (default 500), those due in the first S seconds
      (default 10): after a stall the ones due during it go one after
      another, until 2 S have gone by: those due but not yet sent then
      count as unsent, each with the time since it was due as its sched
      latency. Two latencies per request: from connect() to the answer's
      last byte (p50_ms...), and from the time it was due (sched_p50_ms...:
      a stall of 10 s counts for each request it held back, not once, as
      wrk2 corrects coordinated omission). An unanswered request after
      --timeout S (default 120) is an error and counts as S. Prints one
      JSON line: p50/p90/p99/max of both (nearest rank).

  Each of cost, heavy and probe takes --label JSON: an object whose
  members go first in the line it prints.

  With --label, cost also prints a line for people on standard error.

  bigjson.py record PROBE_JSON HEAVY_JSON|- RESULTS_JSONL
      Appends the probe's line, the heavy clients' (if any) in it as
      "heavy_run", to RESULTS_JSONL, and prints it for people.

  bigjson.py summary RESULTS_JSONL TARGET_RATIO
      The tables of the scenario from the lines the other modes wrote (with
      "target", "kind" and "round" added by gateway.sh).
"""
import http.client
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse

import benchargs  # noqa: E402 (bench/, beside this script)

SMALL = b'{"title":"bench","priority":"normal"}'


LABEL = {}


def emit(d):
    """Prints one JSON line: d, after --label's members."""
    print(json.dumps({**LABEL, **d}), flush=True)


def pct(values, p):
    v = sorted(values)
    if not v:
        return None
    k = max(1, -(-len(v) * p // 100))  # nearest rank
    return v[int(k) - 1]


def gen(path, size, seed):
    rng = random.Random(seed)
    parts, n = [], 1
    while n < size:
        r = rng.random()
        if r < 0.85:
            digits = rng.choice((1, 2, 3, 4, 5) + tuple(range(6, 17)) * 3)
            x = rng.randrange(10 ** (digits - 1) if digits > 1 else 0,
                              min(10 ** digits, 2 ** 53 + 1))
        elif r < 0.95:
            x = rng.randrange(2 ** 53 + 1, 2 ** 63)
        else:
            x = rng.randrange(10 ** 19, 10 ** rng.randint(20, 25))
        if rng.random() < 0.1:
            x = -x
        s = str(x)
        parts.append(s)
        n += len(s) + 1
    with open(path, "w") as f:
        f.write("[" + ",".join(parts) + "]")


def split(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port, (u.path or "/") + ("?" + u.query if u.query else "")


def run_id():
    return "%x%x" % (os.getpid(), int(time.time() * 1000) & 0xFFFFFFF)


def cpu_sample(pids):
    """(schedstat ns summed over threads, set of tids, stat ticks)."""
    ns, tids, ticks = 0, set(), 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    ns += int(f.read().split()[0])
                tids.add((pid, tid))
            except OSError:
                pass
    return ns, tids, ticks


def children(ppid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == ppid:
                        out.append(int(d))
            except OSError:
                pass
    return out


def post(conn, path, body, ctype, key):
    conn.request("POST", path, body=body,
                 headers={"Content-Type": ctype, "Idempotency-Key": key})
    r = conn.getresponse()
    r.read()
    return r.status, r.getheader("Idempotent-Replayed")


def cost(url, path_, ctype, n, pids):
    body = open(path_, "rb").read()
    host, port, path = split(url)
    conn = http.client.HTTPConnection(host, port, timeout=600)
    rid = run_id()
    statuses, replayed = {}, 0
    for i in range(2):
        post(conn, path, body, ctype, "bj-%s-w%d" % (rid, i))
    tick = os.sysconf("SC_CLK_TCK")
    ns0, tids0, t0 = cpu_sample(pids)
    w0 = time.perf_counter()
    ms = []
    for i in range(n):
        t = time.perf_counter()
        st, rep = post(conn, path, body, ctype, "bj-%s-%d" % (rid, i))
        ms.append((time.perf_counter() - t) * 1000)
        statuses[str(st)] = statuses.get(str(st), 0) + 1
        replayed += rep is not None
    wall = time.perf_counter() - w0
    ns1, tids1, t1 = cpu_sample(pids)
    conn.close()
    stat_ms = (t1 - t0) * 1000 / tick / n
    sched_ms = (ns1 - ns0) / 1e6 / n
    same = tids0 == tids1
    emit({
        "n": n, "bytes": len(body), "content_type": ctype, "statuses": statuses,
        "replayed": replayed, "wall_s": round(wall, 3),
        "p50_ms": round(pct(ms, 50), 3), "mean_ms": round(statistics.mean(ms), 3),
        "max_ms": round(max(ms), 3),
        "cpu_ms": round(sched_ms if same else stat_ms, 3),
        "cpu_source": "schedstat" if same else "stat",
        "cpu_stat_ms": round(stat_ms, 3), "cpu_schedstat_ms": round(sched_ms, 3),
        "threads": len(tids1)})
    if LABEL:
        print(show({**LABEL, "n": n, "bytes": len(body), "statuses": statuses,
                    "p50_ms": pct(ms, 50), "mean_ms": statistics.mean(ms),
                    "cpu_ms": sched_ms if same else stat_ms,
                    "cpu_source": "schedstat" if same else "stat",
                    "cpu_stat_ms": stat_ms}), file=sys.stderr, flush=True)


def heavy(url, path_, clients, stop_file, ready_file, fresh):
    body = open(path_, "rb").read()
    host, port, path = split(url)
    rid = run_id()
    lock = threading.Lock()
    ms, statuses, errors, started = [], {}, {}, [0]

    def client(c):
        conn = http.client.HTTPConnection(host, port, timeout=600)
        i = 0
        while not os.path.exists(stop_file):
            t = time.perf_counter()
            try:
                conn.putrequest("POST", path, skip_accept_encoding=True)
                conn.putheader("Content-Type", "application/json")
                conn.putheader("Idempotency-Key", "bjh-%s-%d-%d" % (rid, c, i))
                conn.putheader("Content-Length", str(len(body)))
                if fresh:
                    conn.putheader("Connection", "close")
                conn.endheaders(body)
                with lock:
                    started[0] += 1
                    if started[0] == clients and ready_file:
                        open(ready_file, "w").close()
                r = conn.getresponse()
                r.read()
                st = str(r.status)
                if fresh:
                    conn.close()
            except (OSError, http.client.HTTPException) as e:
                st = None
                with lock:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=600)
            with lock:
                if st:
                    statuses[st] = statuses.get(st, 0) + 1
                    ms.append((time.perf_counter() - t) * 1000)
            i += 1
        conn.close()

    ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    emit({"clients": clients, "connection": "fresh" if fresh else "keepalive",
          "n": len(ms), "statuses": statuses,
                      "errors": errors, "seconds": round(time.monotonic() - t0, 2),
                      "p50_ms": round(pct(ms, 50), 2) if ms else None,
                      "max_ms": round(max(ms), 2) if ms else None})


def probe(url, n, every, seconds, timeout):
    host, port, path = split(url)
    rid = run_id()
    ms, sched, statuses, errors, unsent = [], [], {}, {}, 0
    start = time.monotonic()
    for i in range(n):
        due = start + i * every / 1000
        if due - start >= seconds:
            break
        if time.monotonic() - start > 2 * seconds:
            # Held back past any catching up: each counts as late as it is.
            unsent += 1
            sched.append((time.monotonic() - due) * 1000)
            continue
        pause = due - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        late = (time.monotonic() - due) * 1000
        t = time.perf_counter()
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.request("POST", path, body=SMALL, headers={
                "Content-Type": "application/json", "Connection": "close",
                "Idempotency-Key": "bjp-%s-%d" % (rid, i)})
            r = conn.getresponse()
            r.read()
            statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
            ms.append((time.perf_counter() - t) * 1000)
        except (OSError, http.client.HTTPException) as e:
            why = type(e).__name__
            errors[why] = errors.get(why, 0) + 1
            ms.append(max((time.perf_counter() - t) * 1000, timeout * 1000)
                      if "imeout" in why else (time.perf_counter() - t) * 1000)
        finally:
            conn.close()
        sched.append(late + ms[-1])
    out = {"n": len(ms), "unsent": unsent, "seconds": round(time.monotonic() - start, 2),
           "statuses": statuses, "errors": errors}
    for p in (50, 90, 99):
        out["p%d_ms" % p] = round(pct(ms, p), 2) if ms else None
    out["max_ms"] = round(max(ms), 2) if ms else None
    for p in (50, 90, 99):
        out["sched_p%d_ms" % p] = round(pct(sched, p), 2) if sched else None
    out["sched_max_ms"] = round(max(sched), 2) if sched else None
    emit(out)


def show(j):
    """One line for people: a cost batch or a probe run."""
    if j.get("kind") == "cost":
        return (f"  {j['target']:6s} {j['body']:5s} {j['n']} x {j['bytes']} B"
                f"   p50 {j['p50_ms']:9.2f} ms   mean {j['mean_ms']:9.2f} ms"
                f"   CPU {j['cpu_ms']:8.3f} ms/request ({j['cpu_source']};"
                f" stat {j['cpu_stat_ms']:.1f})   answers {j['statuses']}")
    h = j.get("heavy_run")
    return (f"  {j['target']:6s} probe, {j['heavy']} heavy"
            f"{' (' + j['connection'] + ')' if j['heavy'] else ''}: {j['n']} answered"
            f"{', %d never sent' % j['unsent'] if j.get('unsent') else ''}"
            f"  p50 {j['p50_ms']} ms  p99 {j['p99_ms']} ms  max {j['max_ms']} ms;"
            f" from the schedule p50 {j['sched_p50_ms']} ms  p99 {j['sched_p99_ms']} ms"
            f"  answers {j['statuses']}"
            f"{'  errors ' + json.dumps(j['errors']) if j['errors'] else ''}"
            + (f"   heavy: {h['n']} answered, p50 {h['p50_ms']} ms, answers {h['statuses']}"
               f"{'  errors ' + json.dumps(h['errors']) if h['errors'] else ''}"
               if h else ""))


def record(probe_file, heavy_file, results):
    """Appends the probe's line, with the heavy clients' beside it, to
    results and prints it for people."""
    p = json.load(open(probe_file))
    h = open(heavy_file).read().strip() if heavy_file != "-" else ""
    p["heavy_run"] = json.loads(h) if h else None
    with open(results, "a") as f:
        f.write(json.dumps(p) + "\n")
    print(show(p), flush=True)


def summary(path, target):
    rows = [json.loads(l) for l in open(path)]
    failed = []
    med = lambda xs: statistics.median(xs) if xs else None
    print("cost per request (sequential, one client, fresh keys), medians of rounds:")
    print("  | through | body | requests x rounds | p50 ms | mean ms | CPU ms / request"
          " | CPU by round |")
    print("  | ------- | ---- | ----------------: | -----: | ------: | ---------------:"
          " | ------------ |")
    m = {}
    for tgt in dict.fromkeys(r["target"] for r in rows if r["kind"] == "cost"):
        for ct in ("json", "octet"):
            rs = [r for r in rows if r["kind"] == "cost" and r["target"] == tgt
                  and r["body"] == ct]
            if not rs:
                continue
            m[tgt, ct] = {k: med([r[k] for r in rs]) for k in ("p50_ms", "mean_ms", "cpu_ms")}
            x = m[tgt, ct]
            print(f"  | {tgt:7s} | {ct:5s} | {rs[0]['n']:>5d} x {len(rs)} | {x['p50_ms']:8.2f} |"
                  f" {x['mean_ms']:8.2f} | {x['cpu_ms']:8.3f} |"
                  f" {', '.join('%.3f' % r['cpu_ms'] for r in rs)} |")
            for r in rs:
                if set(r["statuses"]) - {"200", "201"} or r["replayed"]:
                    failed.append(f"{tgt} {ct} round {r['round']}: answers {r['statuses']},"
                                  f" {r['replayed']} replayed")
            if any(r["cpu_source"] != "schedstat" for r in rs):
                print(f"    ({tgt} {ct}: a thread came or went in a batch: CPU from"
                      f" /proc/PID/stat there, 10 ms ticks)")
    print(f"json / octet (target <= {target}x, on the gateway's CPU):")
    for tgt in dict.fromkeys(t for t, _ in m):
        if (tgt, "json") in m and (tgt, "octet") in m:
            j, o = m[tgt, "json"], m[tgt, "octet"]
            cpu = j["cpu_ms"] / o["cpu_ms"] if o["cpu_ms"] else float("inf")
            lat = j["p50_ms"] / o["p50_ms"]
            verdict = ""
            if tgt != "nginx":
                verdict = f"   target: {'meets' if cpu <= target else 'MISSES'}"
            byr = {}
            for r in rows:
                if r["kind"] == "cost" and r["target"] == tgt:
                    byr.setdefault(r["round"], {})[r["body"]] = r["cpu_ms"]
            byr = [x["json"] / x["octet"] for x in byr.values()
                   if x.get("json") and x.get("octet")]
            print(f"  {tgt:7s} CPU {cpu:7.2f}x   p50 latency {lat:7.2f}x"
                  f"   mean latency {j['mean_ms'] / o['mean_ms']:7.2f}x{verdict}"
                  f"   (CPU by round: {', '.join('%.2f' % x for x in byr)})")
    for tgt in dict.fromkeys(t for t, _ in m):
        if tgt != "nginx" and (tgt, "json") in m and ("nginx", "json") in m:
            print(f"  {tgt} json / nginx json: p50 latency"
                  f" {m[tgt, 'json']['p50_ms'] / m['nginx', 'json']['p50_ms']:.2f}x")
    pr = [r for r in rows if r["kind"] == "probe"]
    if pr:
        print("probe: small keyed POSTs (fresh keys, a fresh connection each), alone and"
              " beside heavy clients sending the keyed JSON body back to back;"
              " medians of rounds:")
        print("  (p50, p99: connect() to the answer's end; sched: from when each was due,"
              " a stall counted for every probe it held back)")
        print("  | through | heavy clients | probes | p50 ms | p99 ms | max ms | sched p50 ms"
              " | sched p99 ms | sched p99 by round | heavy answered / round |")
        print("  | ------- | ------------- | -----: | -----: | -----: | -----: | -----------:"
              " | -----------: | ------------------ | ---------------------: |")
        for tgt in dict.fromkeys(r["target"] for r in pr):
            for h in dict.fromkeys((r["heavy"], r["connection"]) for r in pr
                                   if r["target"] == tgt):
                rs = [r for r in pr if r["target"] == tgt
                      and (r["heavy"], r["connection"]) == h]
                x = {k: med([r[k] for r in rs if r[k] is not None])
                     for k in ("n", "p50_ms", "p99_ms", "max_ms", "sched_p50_ms",
                               "sched_p99_ms")}
                hv = [r["heavy_run"]["n"] for r in rs if r.get("heavy_run")]
                hn = f"{h[0]} ({h[1]})" if h[0] else "0"
                print(f"  | {tgt:7s} | {hn:13s} | {x['n']:6.0f} | {x['p50_ms']:6.2f} |"
                      f" {x['p99_ms']:6.2f} | {x['max_ms']:6.2f} |"
                      f" {x['sched_p50_ms']:8.2f} | {x['sched_p99_ms']:8.2f} |"
                      f" {', '.join('%.1f' % r['sched_p99_ms'] for r in rs)} |"
                      f" {med(hv) if hv else '-'} |")
                for r in rs:
                    bad = set(r["statuses"]) - {"200", "201"}
                    hr = r.get("heavy_run") or {}
                    if r["errors"] or bad or hr.get("errors") or \
                            set(hr.get("statuses", {})) - {"200", "201"}:
                        failed.append(f"probe {tgt} heavy {h} round {r['round']}: answers"
                                      f" {r['statuses']} errors {r['errors']}; heavy"
                                      f" {hr.get('statuses')} {hr.get('errors')}")
    if failed:
        print("bench: bigjson runs that failed: " + "; ".join(failed), file=sys.stderr)
        sys.exit(1)


def main():
    mode, opts, pos = benchargs.parse(__doc__)
    if "label" in opts:
        LABEL.update(json.loads(opts.pop("label")))
    if mode == "gen":
        gen(pos[0], int(pos[1]), int(pos[2]) if len(pos) > 2 else 52)
    elif mode == "cost":
        if "children" in opts:
            pids = children(int(opts["children"]))
        else:
            pids = [int(p) for p in opts["pids"].split(",")]
        cost(pos[0], pos[1], pos[2], int(pos[3]), pids)
    elif mode == "heavy":
        heavy(pos[0], pos[1], int(pos[2]), opts["stop-file"], opts.get("ready-file"),
              opts.get("connection", "fresh") == "fresh")
    elif mode == "probe":
        probe(pos[0], int(opts.get("n", 500)), float(opts.get("every", 10)),
              float(opts.get("seconds", 10)), float(opts.get("timeout", 120)))
    elif mode == "record":
        record(pos[0], pos[1], pos[2])
    elif mode == "summary":
        summary(pos[0], float(pos[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
