#!/bin/sh
# A program built against an earlier release's header and library never
# runs on this one: while the major version is 0 every 0.x release has a
# SONAME of its own (libidem.so.0.MINOR), so the loader refuses the program
# instead of letting it pass 0.2.0's structs to a library that reads them
# differently (docs/design.md, "ABI").
#
# Usage: abi.sh CC LIBRARY VERSION, where LIBRARY is the built libidem.so.X
# (its folder holds the SONAME link) and VERSION the project's version.
CC=$1
LIB=$2
VERSION=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib.sh"

major=${VERSION%%.*}
rest=${VERSION#*.}
minor=${rest%%.*}
if [ "$major" = 0 ]; then want="libidem.so.0.$minor"; else want="libidem.so.$major"; fi
libdir=$(dirname "$LIB")

soname=$(readelf -d "$LIB" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
expect_eq "the library's SONAME" "$want" "$soname"
expect_eq "the SONAME link leads to it" "$(basename "$LIB")" \
  "$(readlink "$libdir/$want")"
expect_eq "and so does libidem.so" "$want" "$(readlink "$libdir/libidem.so")"
# This release's library alone, with its links as the build made them (a
# build folder may still hold an earlier build's libidem.so.0).
mkdir "$TMP/new"
cp -P "$LIB" "$libdir/$want" "$libdir/libidem.so" "$TMP/new/"

# The earlier release, as its users have it: a library whose SONAME is
# libidem.so.0 (a stub of the symbols the program uses) and a program
# linked against it with 0.2.0's header.
mkdir "$TMP/old" "$TMP/store"
$CC -std=c11 -Wall -Wextra -Werror -shared -fPIC -I"$HERE" \
  -Wl,-soname,libidem.so.0 -o "$TMP/old/libidem.so.0" "$HERE/stub_0.2.c" \
  2>"$TMP/cc.log"
expect_eq "the 0.2.0 stub library builds" 0 "$?"
ln -s libidem.so.0 "$TMP/old/libidem.so"
$CC -std=c11 -Wall -Wextra -Werror -I"$HERE" -o "$TMP/old_user" \
  "$HERE/old_user.c" -L"$TMP/old" -lidem 2>>"$TMP/cc.log"
expect_eq "a program builds against 0.2.0's header and library" 0 "$?"
cat "$TMP/cc.log" >&2
expect_match "it needs libidem.so.0" 'NEEDED.*\[libidem\.so\.0\]' \
  "$(readelf -d "$TMP/old_user")"

# Where it finds its own library, it runs (so that the check below can
# tell a refusal from a program that never worked).
out=$(LD_LIBRARY_PATH="$TMP/old" "$TMP/old_user" "$TMP/store" 2>&1)
expect_eq "it runs on 0.2.0's library" "0 0.2.0 proceed" "$? $out"

# On this release's library it must not start at all.
out=$(LD_LIBRARY_PATH="$TMP/new" "$TMP/old_user" "$TMP/store" 2>&1)
status=$?
expect_eq "on this release's library the loader refuses it" 127 "$status"
expect_match "naming libidem.so.0" \
  'error while loading shared libraries: libidem\.so\.0: cannot open' "$out"
finish
