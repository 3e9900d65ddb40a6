#!/usr/bin/env python3
"""bench/plot.py -- `make bench`'s charts, drawn by gnuplot from the data the
benchmarks leave in a folder (BENCH_OUT; `make bench` uses build/bench).

Usage: python3 bench/plot.py FOLDER

Reads what is there and draws what it can, as PNG beside the data:

  workers.png        fresh keys per second by worker count: idem (fresh,
                     and claim + complete) and the lab seed's create_ticket
                     (bench/seed_reference.py), medians of the rounds
                     (bench/run.sh: run/*.json)
  latency.png        p50 and p99 latency of each idem bench phase at 1 and
                     16 workers, medians of the rounds (run/*.json)
  slow_upstream.png  the gateway's slow-upstream scenario: wall time of N
                     concurrent 1 s calls through nginx and through idem
                     serve, and the upstream alone (bench/gateway.sh:
                     gateway_slow.jsonl)

Each chart's numbers are also written as a .dat file beside it. A chart
whose data is missing is skipped and said so. Exits non-zero when gnuplot
is missing or fails.
"""
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys


def median(xs):
    xs = [x for x in xs if isinstance(x, (int, float))]
    return statistics.median(xs) if xs else None


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gnuplot(folder, name, script):
    with open(os.path.join(folder, name + ".gp"), "w") as f:
        f.write(script)
    r = subprocess.run(["gnuplot", name + ".gp"], cwd=folder,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        raise SystemExit("plot: gnuplot failed on %s.gp" % name)
    print("plot: %s" % os.path.join(folder, name + ".png"))


HEAD = ('set terminal pngcairo size 900,540 font "sans,11"\n'
        'set output "%s.png"\n'
        'set grid ytics lc rgb "#dddddd"\n'
        'set key top left\n')


def run_files(folder):
    """{(kind, workers): [json, ...]} from bench/run.sh's runs."""
    out = {}
    for p in glob.glob(os.path.join(folder, "run", "r*.json")):
        m = re.match(r"r\d+\.(idem|ref_fresh|sweep_idem|sweep_ref)_(\d+)\.json$",
                     os.path.basename(p))
        if not m:
            continue
        doc = load_json(p)
        if doc is None:
            continue
        kind = "idem" if m.group(1) in ("idem", "sweep_idem") else "ref"
        out.setdefault((kind, int(m.group(2))), []).append(doc)
    return out


def workers_chart(folder, runs):
    ws = sorted({w for (_, w) in runs})
    if not ws:
        return False
    rows = []
    for w in ws:
        idem = runs.get(("idem", w), [])
        ref = runs.get(("ref", w), [])
        rows.append((w,
                     median([d.get("fresh_ops_per_s") for d in idem]),
                     median([d.get("claim_complete_ops_per_s") for d in idem]),
                     median([d.get("ops_per_s") for d in ref])))
    with open(os.path.join(folder, "workers.dat"), "w") as f:
        f.write("# workers idem_fresh idem_claim_complete seed_reference_fresh"
                " (ops/s, medians)\n")
        for r in rows:
            f.write(" ".join("NaN" if v is None else "%g" % v for v in r) + "\n")
    gnuplot(folder, "workers", HEAD % "workers" +
            'set title "Durable fresh keys per second by workers (SQLite, '
            'synchronous=FULL)"\n'
            'set xlabel "workers"\nset ylabel "ops/s"\n'
            'set logscale x 2\nset xtics (%s)\n' % ", ".join(str(w) for w in ws) +
            'set xrange [%g:%g]\n' % (ws[0] / 1.2, ws[-1] * 1.2) +
            'set yrange [0:*]\n'
            'plot "workers.dat" using 1:2 with linespoints lw 2 pt 7 title '
            '"idem: fresh key (local action)", '
            '"" using 1:3 with linespoints lw 2 pt 5 title '
            '"idem: claim + complete", '
            '"" using 1:4 with linespoints lw 2 pt 9 title '
            '"lab seed create_ticket (reference)" noenhanced\n')
    return True


def latency_chart(folder, runs):
    phases = ("fresh", "claim_complete", "replay", "conflict")
    rows = []
    for w in (1, 16):
        docs = runs.get(("idem", w), [])
        if not docs:
            continue
        for ph in phases:
            p50 = median([(d.get("phases") or {}).get(ph, {}).get("p50_us")
                          for d in docs])
            p99 = median([(d.get("phases") or {}).get(ph, {}).get("p99_us")
                          for d in docs])
            rows.append(("%s/%d" % (ph.replace("_", "+"), w), p50, p99))
    if not rows:
        return False
    with open(os.path.join(folder, "latency.dat"), "w") as f:
        f.write("# phase/workers p50_us p99_us (medians)\n")
        for r in rows:
            f.write('"%s" %s %s\n' % (r[0], "NaN" if r[1] is None else "%g" % r[1],
                                      "NaN" if r[2] is None else "%g" % r[2]))
    gnuplot(folder, "latency", HEAD % "latency" +
            'set title "idem bench latency by phase and workers"\n'
            'set ylabel "microseconds (log)"\nset logscale y\n'
            'set yrange [1:*]\nset offsets 0, 0, 0, 0\n'
            'set style data histograms\nset style histogram clustered gap 1\n'
            'set style fill solid 0.8 border -1\nset boxwidth 0.9\n'
            'set xtics rotate by -30\n'
            'plot "latency.dat" using 2:xtic(1) title "p50", '
            '"" using 3 title "p99"\n')
    return True


def slow_chart(folder):
    path = os.path.join(folder, "gateway_slow.jsonl")
    if not os.path.exists(path):
        return False
    runs = [json.loads(l) for l in open(path) if l.strip()]
    ns = sorted({r["n"] for r in runs})
    if not ns:
        return False

    def med(target, n):
        return median([r["wall_s"] for r in runs
                       if r["target"] == target and r["n"] == n])
    with open(os.path.join(folder, "slow_upstream.dat"), "w") as f:
        f.write("# N upstream_s nginx_s idem_s (wall time, medians)\n")
        for n in ns:
            vals = (med("upstream", n), med("nginx", n), med("idem", n))
            f.write("%d %s\n" % (n, " ".join("NaN" if v is None else "%g" % v
                                             for v in vals)))
    gnuplot(folder, "slow_upstream", HEAD % "slow_upstream" +
            'set title "N concurrent calls to an upstream that answers each '
            'after 1 s: wall time"\n'
            'set xlabel "N (concurrent calls, distinct keys)"\n'
            'set ylabel "seconds"\nset logscale x\nset yrange [0:*]\n'
            'set xtics (%s)\nset xrange [%g:%g]\n' % (
                ", ".join(str(n) for n in ns), ns[0] / 1.3, ns[-1] * 1.3) +
            'plot "slow_upstream.dat" using 1:2 with linespoints lw 2 pt 7 '
            'title "upstream alone", "" using 1:3 with linespoints lw 2 pt 5 '
            'title "nginx reverse proxy", "" using 1:4 with linespoints lw 2 '
            'pt 9 title "idem serve"\n')
    return True


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: python3 bench/plot.py FOLDER")
    folder = sys.argv[1]
    if not shutil.which("gnuplot"):
        raise SystemExit("plot: gnuplot is missing (sh scripts/deps.sh bench "
                         "installs it)")
    runs = run_files(folder)
    for name, done in (("workers", workers_chart(folder, runs)),
                       ("latency", latency_chart(folder, runs)),
                       ("slow_upstream", slow_chart(folder))):
        if not done:
            print("plot: no data for %s.png in %s" % (name, folder))


if __name__ == "__main__":
    main()
