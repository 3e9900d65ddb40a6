#!/usr/bin/env python3
"""bench/canon_run.py -- the rounds and the table of bench/canon.sh.

Usage: python3 bench/canon_run.py run IDEM DIR ROUNDS ITERS ROUND_S BUDGET_S
       python3 bench/canon_run.py pytime FILE ITERS ROUND_S

run: DIR holds the documents of bench/canon_gen.py (SHAPE-SIZEmb.json) and
empty.json. ROUNDS rounds; in each, for each document, the three tools
one after the other (their order rotating from round to round), each
taking up to ITERS timed passes and stopping early once ROUND_S seconds
have gone into them; the round's figure is their median:
  idem    `IDEM canon FILE` as a process, stdout to /dev/null, timed from
          here (start-up included: empty.json's time is printed too)
  node    bench/canon_node.mjs time: JSON.stringify(JSON.parse(text)) in
          one node process, after one untimed pass (start-up and the read
          not timed)
  python  this script's pytime in another process: json.dumps(json.loads(
          text), sort_keys=True, separators=(',', ':')) the same way
A tool whose timed passes of one document add up to BUDGET_S seconds skips
it in later rounds (the table prints how many rounds each median has). Then
the medians of the rounds as MB/s (10^6 bytes of input per second; idem's
also net of its time on empty.json, its start-up), the ratios idem/node,
net/node and idem/python, and the targets: idem >= 1.0x node on every
document (moonshot 2.0x), judged on the process's figure and on the net
one. A missed target is printed, not failed.
"""

import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET, MOONSHOT = 1.0, 2.0


def pytime(path, iters, round_s):
    with open(path, encoding="utf-8") as f:
        text = f.read()

    def once():
        return json.dumps(json.loads(text), sort_keys=True,
                          separators=(",", ":"))

    once()
    times, spent = [], 0.0
    while len(times) < iters and (not times or spent < round_s):
        t0 = time.perf_counter()
        once()
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times), spent


def idem_time(idem, path, iters, round_s):
    times, spent = [], 0.0
    while len(times) < iters and (not times or spent < round_s):
        t0 = time.perf_counter()
        r = subprocess.run([idem, "canon", path], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit("idem canon %s: exit %d: %s" % (
                path, r.returncode, r.stderr.decode(errors="replace")))
        times.append(dt)
        spent += dt
    return statistics.median(times), spent


def child_time(argv):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise SystemExit("%s: exit %d: %s" % (
            " ".join(argv), r.returncode, r.stderr.decode(errors="replace")))
    med, spent = r.stdout.split()[-2:]
    return float(med), float(spent)


def documents(folder):
    docs = []
    for name in os.listdir(folder):
        if name.endswith("mb.json"):
            shape, size = name[:-len("mb.json")].rsplit("-", 1)
            docs.append((shape, float(size), os.path.join(folder, name)))
    order = {"ints": 0, "doubles": 1, "strings": 2, "nested": 3}
    docs.sort(key=lambda d: (order.get(d[0], 9), d[0], d[1]))
    return docs


def run(idem, folder, rounds, iters, round_s, budget_s):
    docs = documents(folder)
    tools = ["idem", "node", "python"]
    samples = {(d[2], t): [] for d in docs for t in tools}
    spent = {(d[2], t): 0.0 for d in docs for t in tools}
    empty = []
    t_start = time.monotonic()
    for r in range(rounds):
        empty.append(idem_time(idem, os.path.join(folder, "empty.json"),
                               max(iters, 5), 1.0)[0])
        for shape, size, path in docs:
            k = r % len(tools)
            for tool in tools[k:] + tools[:k]:
                if spent[(path, tool)] >= budget_s:
                    continue
                if tool == "idem":
                    s, dt = idem_time(idem, path, iters, round_s)
                elif tool == "node":
                    s, dt = child_time(["node", os.path.join(HERE,
                                    "canon_node.mjs"), "time", path,
                                    str(iters), str(round_s)])
                else:
                    s, dt = child_time([sys.executable,
                                        os.path.abspath(__file__), "pytime",
                                        path, str(iters), str(round_s)])
                spent[(path, tool)] += dt
                samples[(path, tool)].append(s)
        sys.stderr.write("round %d/%d done, %.0f s\n" %
                         (r + 1, rounds, time.monotonic() - t_start))

    t_empty = statistics.median(empty)
    print("idem canon on an empty document ({}): %.2f ms (median of %d "
          "rounds): process start-up, included in idem's figures; 'net' "
          "subtracts it" % (t_empty * 1e3, len(empty)))
    print()
    hdr = ("shape", "size", "bytes", "idem MB/s", "net MB/s", "node MB/s",
           "python MB/s", "idem/node", "net/node", "idem/python",
           "rounds i/n/p")
    rows, ratios, nets = [], [], []
    for shape, size, path in docs:
        nbytes = os.path.getsize(path)
        med = {t: statistics.median(samples[(path, t)]) for t in tools}
        mbs = {t: nbytes / med[t] / 1e6 for t in tools}
        net = nbytes / max(med["idem"] - t_empty, 1e-6) / 1e6
        rn, rp = mbs["idem"] / mbs["node"], mbs["idem"] / mbs["python"]
        name = "%s %g MB" % (shape, size)
        ratios.append((name, rn))
        nets.append((name, net / mbs["node"]))
        rows.append((shape, "%g MB" % size, str(nbytes),
                     "%.1f" % mbs["idem"], "%.1f" % net, "%.1f" % mbs["node"],
                     "%.1f" % mbs["python"], "%.2fx" % rn,
                     "%.2fx" % (net / mbs["node"]), "%.2fx" % rp,
                     "/".join(str(len(samples[(path, t)])) for t in tools)))
    widths = [max(len(h), *(len(r[i]) for r in rows))
              for i, h in enumerate(hdr)]
    for line in [hdr] + rows:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths))))
    print()
    for goal, label in ((TARGET, "target"), (MOONSHOT, "moonshot")):
        for which, rs in (("", ratios), (" (net)", nets)):
            missed = [(n, r) for n, r in rs if r < goal]
            worst = min(rs, key=lambda x: x[1])
            print("%-8s idem canon%s >= %.1fx node (JSON.parse + "
                  "JSON.stringify) on every document: %s" % (
                      label, which, goal,
                      "met (lowest %.2fx, %s)" % (worst[1], worst[0])
                      if not missed else "MISSED on %d of %d: %s" % (
                          len(missed), len(rs), ", ".join(
                              "%s %.2fx" % m for m in missed))))
    return 0


def main(argv):
    if len(argv) == 8 and argv[1] == "run":
        return run(argv[2], argv[3], int(argv[4]), int(argv[5]),
                   float(argv[6]), float(argv[7]))
    if len(argv) == 5 and argv[1] == "pytime":
        print("%.6f %.6f" % pytime(argv[2], max(1, int(argv[3])),
                                   float(argv[4])))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
