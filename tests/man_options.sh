#!/bin/sh
# The manual pages (man/) and the program's --help agree: every option a
# command's --help names appears in the OPTIONS section of its page, and
# every option that section names is one --help names too. --help and -h
# themselves are left out (every command takes them). Each page also
# names the program's version and renders without a warning from groff or
# man.
#
# Usage: man_options.sh IDEM MANDIR
IDEM=$1
MANDIR=$2
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

# options FILE: the options named in FILE, one a line, sorted: words that
# start with - or -- and a letter, not inside a word (keep-alive is no
# option).
options() {
  grep -oE -- '(^|[^A-Za-z0-9_-])--?[a-z][a-z0-9-]*' "$1" |
    sed -E 's/^[^-]*//' | grep -vxE -- '--help|-h' | sort -u
}

# render PAGE: the page as plain text, each paragraph on one line (a wide
# line leaves no option broken or hyphenated).
render() {
  groff -mandoc -Tascii -rLL=5000n -P-c "$1" 2>/dev/null | col -bx
}

for page in idem lab canon run serve mcp keys console bench; do
  if [ "$page" = idem ]; then
    file=$MANDIR/idem.1
    "$IDEM" --help > "$TMP/help" 2>&1
  else
    file=$MANDIR/idem-$page.1
    "$IDEM" "$page" --help > "$TMP/help" 2>&1
  fi
  [ -f "$file" ] && ok || { fail "no manual page $file"; continue; }
  options "$TMP/help" > "$TMP/help.opts"
  [ -s "$TMP/help.opts" ] && ok || fail "$page --help names no option"
  render "$file" | sed -n '/^OPTIONS$/,/^[A-Z][A-Z ]*$/{/^OPTIONS$/d;/^[A-Z][A-Z ]*$/d;p}' \
    > "$TMP/options"
  [ -s "$TMP/options" ] && ok || fail "$file has no OPTIONS section"
  options "$TMP/options" > "$TMP/man.opts"
  missing=$(comm -23 "$TMP/help.opts" "$TMP/man.opts" | tr '\n' ' ')
  extra=$(comm -13 "$TMP/help.opts" "$TMP/man.opts" | tr '\n' ' ')
  expect_eq "options of '$page --help' missing from $(basename "$file")'s OPTIONS" "" "$missing"
  expect_eq "options in $(basename "$file")'s OPTIONS that '$page --help' does not name" "" "$extra"
done

# Every page names the program's version (.Os idem VERSION).
version=$("$IDEM" --version | sed 's/^idem //')
for file in "$MANDIR"/*.[1-9]; do
  expect_eq "the version in $(basename "$file")" "idem $version" \
    "$(sed -n 's/^\.Os //p' "$file")"
done

# Every page renders without a warning: groff with all warnings on, and
# man's own check (what lintian runs).
for file in "$MANDIR"/*.[1-9]; do
  out=$(groff -ww -mandoc -z "$file" 2>&1)
  expect_eq "groff -ww warnings for $(basename "$file")" "" "$out"
  if command -v man >/dev/null 2>&1; then
    out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$file" 2>&1 >/dev/null)
    expect_eq "man --warnings for $(basename "$file")" "" "$out"
  fi
done
finish
