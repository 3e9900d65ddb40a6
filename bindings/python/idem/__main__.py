"""python -m idem keys: the operator's commands of the idem program's
`idem keys`, for a store used from Python, where pip installs no idem
program. The same subcommands, options, output and exit statuses (0 ok,
1 store error or no such record, 2 usage); sealed records (--seal-key) are
left to the idem program.
"""
import argparse
import json
import os
import sys
import time
import unicodedata
from typing import List, NoReturn, Optional, Sequence

from ._errors import Error
from ._records import Record
from ._store import Store

USAGE = """\
usage: python -m idem keys list [--tenant T] [--operation OP] [--state S]
                                [--limit N] [--expired | --overdue] [--json]
       python -m idem keys show KEY [--tenant T] [--operation OP] [--json]
       python -m idem keys prune
       python -m idem keys resolve KEY [--tenant T] [--operation OP] [--force]
                                (--completed [--status N] [--body FILE]
                                 [--retention DUR] | --failed)
       python -m idem keys delete KEY [--tenant T] [--operation OP]

Common option: --store URL (default: IDEM_STORE, else ./idem.db).

  list     records, oldest first; --state is in_progress, completed or
           unknown; --expired includes completed records past their
           retention; --overdue lists only records in progress or unknown
           that have waited longer than their retention
  show     one record, with its stored request and response; without
           --operation, every record with the KEY (of any tenant unless
           --tenant): this reads the whole store (or tenant) to find them
  prune    delete completed records past their retention, print how many
  resolve  settle a record whose outcome is unknown, or in progress with
           its lease over: --completed stores a response (status, default
           0, and the body from FILE or '-' for stdin) that later calls
           replay, kept for --retention (default 24h); --failed deletes the
           record so that a retry acts again. A record whose holder's lease
           still runs may be in the middle of acting: it is refused unless
           --force
  delete   remove one record whatever its state; a retry then acts again

Without --operation, show, resolve and delete find the KEY's records in
every operation (and, without --tenant, every tenant); resolve and delete
then act only when exactly one record has the KEY, and name them all
otherwise. The idem program's `idem keys` is the same command.

Exit status: 0 ok, 1 store error or no such record, 2 usage.
"""

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(message)


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument("--store", metavar="URL")
    named = _Parser(add_help=False)
    named.add_argument("--tenant", metavar="T")
    named.add_argument("--operation", metavar="OP")
    top = _Parser(prog="python -m idem", usage=USAGE, add_help=False)
    top.add_argument("-h", "--help", action="store_true")
    groups = top.add_subparsers(dest="group")
    keys = groups.add_parser("keys", usage=USAGE, add_help=False)
    keys.add_argument("-h", "--help", action="store_true")
    sub = keys.add_subparsers(dest="command")

    p = sub.add_parser("list", parents=[common, named], usage=USAGE)
    p.add_argument("--state", choices=["in_progress", "completed", "unknown"])
    p.add_argument("--limit", type=int, metavar="N")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--expired", action="store_true")
    when.add_argument("--overdue", action="store_true")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("show", parents=[common, named], usage=USAGE)
    p.add_argument("key", metavar="KEY")
    p.add_argument("--json", action="store_true")

    sub.add_parser("prune", parents=[common], usage=USAGE)

    p = sub.add_parser("resolve", parents=[common, named], usage=USAGE)
    p.add_argument("key", metavar="KEY")
    p.add_argument("--force", action="store_true")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--completed", action="store_true")
    how.add_argument("--failed", action="store_true")
    p.add_argument("--status", type=int, metavar="N")
    p.add_argument("--body", metavar="FILE")
    p.add_argument("--retention", metavar="DUR")

    p = sub.add_parser("delete", parents=[common, named], usage=USAGE)
    p.add_argument("key", metavar="KEY")
    return top


def _error(message: str) -> None:
    print("python -m idem keys: %s" % message, file=sys.stderr)


def _escape(text: str) -> str:
    """Text that could mislead on a terminal, escaped: control characters
    and invisible ones that reorder or hide text (\\n, \\x1b, \\u202e), and
    a backslash as \\\\."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            n = ord(ch)
            out.append("\\x%02x" % n if n < 0x100 else "\\u%04x" % n if n < 0x10000
                       else "\\U%08x" % n)
        else:
            out.append(ch)
    return "".join(out)


def _json_safe(text: str) -> str:
    """JSON text with the invisible characters that json leaves as they
    are escaped as \\uXXXX: the same JSON value."""
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cf", "Zl", "Zp"):
            n = ord(ch)
            if n < 0x10000:
                out.append("\\u%04x" % n)
            else:
                n -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 + (n >> 10), 0xDC00 + (n & 0x3FF)))
        else:
            out.append(ch)
    return "".join(out)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _bytes_text(b: bytes) -> str:
    return _escape(b.decode("utf-8", "backslashreplace"))


def _put_record(r: Record, as_json: bool) -> None:
    if as_json:
        print(_json_safe(json.dumps(r.to_json(), indent=2, sort_keys=True,
                                    ensure_ascii=False)))
        return
    fields = [("tenant:", _escape(r.tenant)), ("operation:", _escape(r.operation)),
              ("key:", _escape(r.key)), ("state:", r.state), ("attempt:", str(r.attempt)),
              ("fingerprint:", r.fingerprint), ("created:", _iso(r.created_ms)),
              ("updated:", _iso(r.updated_ms))]
    if r.state == "in_progress":
        fields.append(("lease until:", _iso(r.lease_expires_ms)))
    fields.append(("expires:", _iso(r.expires_ms)))
    if r.request is not None:
        fields.append(("request:", _bytes_text(r.request)))
    if r.has_response:
        fields += [("status:", str(r.status)), ("body bytes:", str(len(r.body or b""))),
                   ("recovered:", "yes" if r.recovered else "no")]
    if r.sealed:
        fields += [("status:", str(r.status)),
                   ("response:", "sealed with key %s; open it with the idem program's "
                    "`idem keys show --seal-key`" % r.seal_key_id)]
    for label, value in fields:
        print("%-13s%s" % (label, value))


def _put_table(rows: Sequence[Record]) -> None:
    head = ["TENANT", "OPERATION", "KEY", "STATE", "ATT", "CREATED", "EXPIRES"]
    cells = [[_escape(r.tenant) or "-", _escape(r.operation), _escape(r.key), r.state,
              str(r.attempt), _iso(r.created_ms), _iso(r.expires_ms)] for r in rows]
    widths = [max(len(c[i]) for c in [head] + cells) for i in range(len(head))]
    for c in [head] + cells:
        print(" ".join(c[i].rjust(widths[i]) if i == 4 else c[i].ljust(widths[i])
                       for i in range(len(head))).rstrip())


def _pick(store: Store, a: argparse.Namespace, what: str) -> Optional[Record]:
    """The one record that a KEY without --operation names; None after
    saying why."""
    found = store.show(a.key, tenant=a.tenant)
    if not found:
        _error("%s: no record has the key '%s'%s" % (what, _escape(a.key),
               " in this tenant" if a.tenant is not None else ""))
        return None
    if len(found) > 1:
        _error("%s: %d records have the key '%s'; name one with --operation (and "
               "--tenant):" % (what, len(found), _escape(a.key)))
        for r in found[:20]:
            print("  tenant '%s', operation '%s'" % (_escape(r.tenant), _escape(r.operation)),
                  file=sys.stderr)
        if len(found) > 20:
            print("  ... and %d more" % (len(found) - 20), file=sys.stderr)
        return None
    return found[0]


def _is_http(operation: str) -> bool:
    method, _, path = operation.partition(" ")
    return bool(method) and method.isascii() and method.isalpha() and \
        method.isupper() and path.startswith("/")


def _run(store: Store, a: argparse.Namespace) -> int:
    if a.command == "list":
        if a.limit is not None and a.limit <= 0:
            raise _Usage("--limit: a positive number of records")
        rows = store.list(tenant=a.tenant, operation=a.operation, state=a.state,
                          limit=a.limit, expired=a.expired, overdue=a.overdue)
        if a.json:
            for r in rows:
                print(_json_safe(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False,
                                            separators=(",", ":"))))
        else:
            _put_table(rows)
        return EXIT_OK
    if a.command == "show":
        rows = store.show(a.key, operation=a.operation, tenant=a.tenant)
        if not rows:
            _error("show: no record has the key '%s'%s" % (
                _escape(a.key), " in this tenant" if a.tenant is not None else ""))
            return EXIT_FAIL
        for n, r in enumerate(rows):
            if n and not a.json:
                print()
            _put_record(r, a.json)
        return EXIT_OK
    if a.command == "prune":
        print("pruned %d expired completed records" % store.prune())
        return EXIT_OK
    tenant, operation = a.tenant, a.operation
    if operation is None:
        rec = _pick(store, a, a.command)
        if rec is None:
            return EXIT_FAIL
        tenant, operation = rec.tenant, rec.operation
    if a.command == "delete":
        store.delete(operation, a.key, tenant=tenant)
        print("deleted %s (a retry acts again)" % _escape(a.key))
        return EXIT_OK
    # resolve
    if a.failed and (a.status is not None or a.body is not None or a.retention is not None):
        raise _Usage("--status, --body and --retention go with --completed")
    if a.completed and _is_http(operation) and (a.status is None
                                                 or not 100 <= a.status <= 599):
        if a.status is None:
            _error("resolve: '%s' is a record of idem serve (operation '%s'): --completed "
                   "needs --status, the HTTP status (100-599) that its retries will be "
                   "answered" % (_escape(a.key), _escape(operation)))
        else:
            _error("--status: %d is not an HTTP status (100-599), which the records of "
                   "idem serve keep" % a.status)
        return EXIT_USAGE
    if a.status is not None and a.status > 255 and operation == "run":
        _error("--status: %d is not an exit status (0-255), which the records of "
               "`idem run` keep" % a.status)
        return EXIT_USAGE
    if a.status is not None and not 0 <= a.status <= 999:
        raise _Usage("--status: %d is not 0-999" % a.status)
    if a.failed:
        store.resolve(operation, a.key, tenant=tenant, failed=True, force=a.force)
        print("resolved %s: failed (the record is deleted; a retry acts again)"
              % _escape(a.key))
        return EXIT_OK
    body = b""
    if a.body == "-":
        body = sys.stdin.buffer.read()
    elif a.body is not None:
        try:
            with open(a.body, "rb") as f:
                body = f.read()
        except OSError as e:
            _error("%s: %s" % (a.body, e.strerror))
            return EXIT_FAIL
    store.resolve(operation, a.key, tenant=tenant, body=body, status=a.status or 0,
                  retention=a.retention, force=a.force)
    print("resolved %s: completed (later calls replay the response)" % _escape(a.key))
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    try:
        a = _parser().parse_args(argv)
        if a.help or a.group is None or getattr(a, "help", False) or \
                getattr(a, "command", None) is None:
            out = sys.stdout if a.help else sys.stderr
            print(USAGE, end="", file=out)
            return EXIT_OK if a.help else EXIT_USAGE
    except _Usage as e:
        print("python -m idem keys: %s\n\n%s" % (e, USAGE), end="", file=sys.stderr)
        return EXIT_USAGE
    url = a.store or os.environ.get("IDEM_STORE") or "./idem.db"
    try:
        store = Store(url)
    except Error as e:
        _error("%s: %s" % (_escape(url), e))
        return EXIT_FAIL
    try:
        return _run(store, a)
    except _Usage as e:
        print("python -m idem keys: %s" % e, file=sys.stderr)
        return EXIT_USAGE
    except Error as e:
        _error("%s: %s" % (a.command, e))
        return EXIT_FAIL
    finally:
        store.close()


if __name__ == "__main__":
    sys.exit(main())
