#!/usr/bin/env python3
"""The documentation and the program agree.

Usage: docs_check.py IDEM SOURCE_DIR options|readme|length

options  Every option `idem CMD --help` names appears in the first column
         of the Options table of CMD's page, and every option of that
         column is one --help names. Each entry is written as --help
         writes it: `--name PLACEHOLDER` must appear in the --help text.
         --help and -h themselves are left out (every command takes them).
readme   Every fenced block of README.md whose info string is
         `sh runnable` runs with `sh -e` in a temporary folder, with
         IDEM_STORE a temporary SQLite store and the idem program first
         on PATH, and exits 0 within its time.
length   No page of docs/ (docs/design.md and docs/reliability.md aside)
         nor README.md is over 500 lines.

Exit status 0 when everything agrees; 1 with every difference printed.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile

# Which page documents which command. A page may document several
# commands: its Options section then has a `### idem CMD` heading before
# each command's table.
PAGES = {
    "serve": "docs/gateway.md",
    "mcp": "docs/mcp.md",
    "run": "docs/run.md",
}
LONG_PAGES_ALLOWED = {"docs/design.md", "docs/reliability.md"}
MAX_LINES = 500
BLOCK_TIMEOUT = 60

OPTION = re.compile(r"(?:^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*)")


def help_text(idem, cmd):
    out = subprocess.run([idem, cmd, "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=False)
    return out.stdout.decode()


def help_options(text):
    """The options a --help text names, anywhere in it (as man_options.sh
    reads them), but --help itself."""
    return {m for m in OPTION.findall(text)} - {"--help"}


def split_row(line):
    """The cells of a markdown table row; `\\|` is a pipe inside a cell."""
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|")
            for c in re.split(r"(?<!\\)\|", line)]


def option_tables(path):
    """{command or None: [(line number, `entry`), ...]} from the page's
    `## Options` section: the code spans of each table row's first cell."""
    tables = {}
    current = None
    in_section = False
    in_fence = False
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if line.startswith("## "):
            in_section = line.strip() == "## Options"
            current = None
            continue
        if not in_section:
            continue
        m = re.match(r"### `?idem ([a-z]+)`?\s*$", line)
        if m:
            current = m.group(1)
            continue
        if not line.lstrip().startswith("|"):
            continue
        cells = split_row(line)
        if not cells or re.fullmatch(r":?-+:?", cells[0] or "-"):
            continue
        for span in re.findall(r"`([^`]+)`", cells[0]):
            if span.startswith("-"):
                tables.setdefault(current, []).append((n, span))
    return tables


def check_options(idem, src):
    problems = []
    for cmd, page in sorted(PAGES.items()):
        path = os.path.join(src, page)
        text = help_text(idem, cmd)
        wanted = help_options(text)
        if not wanted:
            problems.append("idem %s --help names no option" % cmd)
            continue
        tables = option_tables(path)
        if cmd in tables:
            rows = tables[cmd]
        elif list(tables) == [None]:
            rows = tables[None]
        else:
            problems.append("%s: no Options table for idem %s (a section "
                            "'## Options' with a table, or a '### idem %s' "
                            "heading before it)" % (page, cmd, cmd))
            continue
        documented = set()
        flat = " ".join(text.split())
        for n, entry in rows:
            m = re.match(r"(--?[a-z][a-z0-9-]*)", entry)
            if not m:
                problems.append("%s:%d: `%s` is no option" % (page, n, entry))
                continue
            documented.add(m.group(1))
            # The entry as --help writes it: the name and its placeholder.
            if not re.search(re.escape(" ".join(entry.split())) +
                             r"(?![A-Za-z0-9_-])", flat):
                problems.append("%s:%d: `%s` is not how 'idem %s --help' "
                                "writes it" % (page, n, entry, cmd))
        for opt in sorted(wanted - documented):
            problems.append("%s: %s (in 'idem %s --help') is missing from "
                            "the Options table" % (page, opt, cmd))
        for opt in sorted(documented - wanted):
            problems.append("%s: %s is in the Options table but not in "
                            "'idem %s --help'" % (page, opt, cmd))
    return problems


def runnable_blocks(path):
    """[(line number, code)] of the fenced blocks whose info string is
    `sh runnable`."""
    blocks = []
    fence = None
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, line in enumerate(lines, 1):
        if fence is None:
            m = re.match(r"^(```+)\s*(.*)$", line)
            if m:
                fence = (m.group(1), m.group(2).split(), n, [])
        elif line.startswith(fence[0]) and line.strip() == fence[0]:
            if fence[1][:2] == ["sh", "runnable"]:
                blocks.append((fence[2], "\n".join(fence[3]) + "\n"))
            fence = None
        else:
            fence[3].append(line)
    return blocks


def check_readme(idem, src):
    problems = []
    readme = os.path.join(src, "README.md")
    blocks = runnable_blocks(readme)
    if not blocks:
        return ["README.md: no block marked `sh runnable`"]
    bindir = os.path.dirname(os.path.abspath(idem))
    for n, code in blocks:
        with tempfile.TemporaryDirectory(prefix="idem-docs.") as tmp:
            env = dict(os.environ)
            env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
            env["IDEM_STORE"] = "sqlite:" + os.path.join(tmp, "store.db")
            env["TMPDIR"] = tmp
            p = subprocess.Popen(["sh", "-e", "-c", code], cwd=tmp, env=env,
                                 stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT,
                                 start_new_session=True)
            try:
                out, _ = p.communicate(timeout=BLOCK_TIMEOUT)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            # Whatever the block left running goes with it.
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            if timed_out:
                out, _ = p.communicate()
                problems.append("README.md:%d: the block did not end within "
                                "%d s; its output:\n%s"
                                % (n, BLOCK_TIMEOUT, out.decode(errors="replace")))
                continue
            if p.returncode != 0:
                problems.append("README.md:%d: the block exited %d; its "
                                "output:\n%s" % (n, p.returncode,
                                                 out.decode(errors="replace")))
            else:
                print("ok README.md:%d" % n)
    return problems


def check_length(src):
    problems = []
    pages = ["README.md"] + sorted(
        "docs/" + f for f in os.listdir(os.path.join(src, "docs"))
        if f.endswith(".md"))
    for page in pages:
        if page in LONG_PAGES_ALLOWED:
            continue
        with open(os.path.join(src, page), encoding="utf-8") as f:
            n = len(f.read().splitlines())
        if n > MAX_LINES:
            problems.append("%s: %d lines, over %d" % (page, n, MAX_LINES))
    return problems


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in ("options", "readme", "length"):
        sys.stderr.write("usage: docs_check.py IDEM SOURCE_DIR "
                         "options|readme|length\n")
        return 2
    idem, src, what = sys.argv[1:]
    if what == "options":
        problems = check_options(idem, src)
    elif what == "readme":
        problems = check_readme(idem, src)
    else:
        problems = check_length(src)
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("PASS: %s" % what)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
