"""The command line the bench helpers share: MODE, then positional
arguments and --NAME VALUE options in any order."""
import sys


def parse(doc):
    """(mode, opts, positional) from sys.argv; exits with doc when empty."""
    args = sys.argv[1:]
    if not args:
        sys.exit(doc)
    mode = args.pop(0)
    opts, pos = {}, []
    while args:
        a = args.pop(0)
        if a.startswith("--"):
            opts[a[2:]] = args.pop(0)
        else:
            pos.append(a)
    return mode, opts, pos
