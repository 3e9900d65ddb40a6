#!/bin/sh
# numfmt_ecmascript.sh WRITER SCRIPT N -- idem's number texts against
# node's String(x) (see numfmt_ecmascript.c and .mjs). Needs node; fails,
# never skips, without it. A failure of either side of the pipe fails the
# test: the writer's status is kept in a file, since POSIX sh has no
# pipefail.
set -eu
writer=$1
script=$2
n=$3
if ! command -v node >/dev/null 2>&1; then
  echo "numfmt_ecmascript: node is not installed" >&2
  exit 1
fi
status=$(mktemp)
trap 'rm -f "$status"' EXIT
{ "$writer" "$n"; echo $? >"$status"; } | node "$script"
test "$(cat "$status")" = 0
