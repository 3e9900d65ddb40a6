#!/bin/sh
# cmake --install puts the header, both libraries (with the SONAME links),
# idem.pc and the program under any prefix, and a program builds against
# them with pkg-config: linked with the shared library, and with libidem.a
# from `pkg-config --static --libs idem`. Both use an SQLite store.
#
# Usage: install.sh BUILD SANITIZE VERSION
BUILD=$1
SANITIZE=${2:-OFF}
VERSION=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
# A sanitized libidem needs its runtime in the program too.
CFLAGS_EXTRA=""
[ "$SANITIZE" = ON ] && CFLAGS_EXTRA="-fsanitize=address,undefined"

cmake --install "$BUILD" --prefix "$TMP/prefix" > "$TMP/install.log" 2>&1
expect_eq "cmake --install" 0 "$?"
for f in include/idem.h bin/idem; do
  [ -f "$TMP/prefix/$f" ] && ok || fail "installed $f"
done
pc=$(find "$TMP/prefix" -name idem.pc | head -n 1)
[ -n "$pc" ] && ok || fail "installed idem.pc"
libdir=$(dirname "$(dirname "$pc")")
[ -f "$libdir/libidem.a" ] && ok || fail "installed libidem.a"

# The shared library and its links (docs/design.md, "ABI"): libidem.so ->
# the SONAME (libidem.so.0.MINOR while the major version is 0) -> the file.
major=${VERSION%%.*}
rest=${VERSION#*.}
minor=${rest%%.*}
if [ "$major" = 0 ]; then soname="libidem.so.0.$minor"; else soname="libidem.so.$major"; fi
[ -f "$libdir/libidem.so.$VERSION" ] && [ ! -L "$libdir/libidem.so.$VERSION" ] &&
  ok || fail "installed libidem.so.$VERSION"
expect_eq "the SONAME link" "libidem.so.$VERSION" "$(readlink "$libdir/$soname")"
expect_eq "the link for -lidem" "$soname" "$(readlink "$libdir/libidem.so")"
expect_match "the installed library's SONAME" "\\(SONAME\\).*\\[$soname\\]" \
  "$(readelf -d "$libdir/libidem.so.$VERSION")"
if [ "$major" = 0 ]; then
  [ ! -e "$libdir/libidem.so.0" ] && ok || fail "0.2's SONAME libidem.so.0 is installed"
fi

export PKG_CONFIG_PATH="$(dirname "$pc")"
# The licence: the text installed with the library, its name in idem.pc.
grep -q '^MIT License' "$TMP/prefix/share/doc/idem/LICENSE" && ok ||
  fail "the MIT licence installed as share/doc/idem/LICENSE"
grep -q '^License: MIT$' "$pc" && ok || fail "idem.pc declares License: MIT"
# A user's flags hold idem's include folder only: nothing of the libraries
# libidem uses inside (no -I/usr/include/postgresql), and no .pc file of
# theirs is needed to build against the shared library.
cflags=$(pkg-config --cflags idem)
expect_eq "pkg-config --cflags idem is one flag" 1 "$(printf '%s\n' $cflags | wc -l)"
inc=$(printf '%s\n' $cflags | sed -n 's/^-I//p')
expect_eq "the prefix's include folder" "$(cd "$TMP/prefix/include" && pwd -P)" \
  "$(cd "${inc:-/nonexistent}" 2>/dev/null && pwd -P)"
expect_eq "pkg-config --modversion idem" "$VERSION" \
  "$(pkg-config --modversion idem)"

# The expected line of pkg_user: the canonical request, its fingerprint
# (SHA-256 of the canonical JSON), both outcomes and the replay.
canon='{"a":[1],"b":1}'
fp=$(printf '%s' "$canon" | sha256sum | cut -d ' ' -f 1)
want="$VERSION $canon $fp proceed replay 201 {\"ticket\":1}"

# Linked with the shared library.
cc $CFLAGS_EXTRA -std=c11 -Wall -Wextra -Werror "$HERE/pkg_user.c" \
  $(pkg-config --cflags --libs idem) -Wl,-rpath,"$libdir" \
  -o "$TMP/user_shared" 2>"$TMP/cc.log"
expect_eq "a program builds with pkg-config idem" 0 "$?"
cat "$TMP/cc.log" >&2
expect_match "it needs the SONAME" "NEEDED.*\\[$soname\\]" \
  "$(readelf -d "$TMP/user_shared")"
mkdir "$TMP/s1" "$TMP/s2"
out=$("$TMP/user_shared" "sqlite:$TMP/s1/store.db" 2>&1)
expect_eq "and runs against the installed library" "0 $want" "$? $out"

# libidem parses JSON itself: neither the library nor a static link of it
# needs jansson (the idem program does).
readelf -d "$libdir/libidem.so.$VERSION" | grep -q 'NEEDED.*jansson' &&
  fail "libidem.so needs libjansson" || ok
case " $(pkg-config --static --libs idem) " in
  *" -ljansson "*) fail "pkg-config --static --libs idem names -ljansson" ;;
  *) ok ;;
esac

# Linked with libidem.a as it is: `pkg-config --libs idem-static`, no flag
# rewritten (the system's libraries stay shared).
cc $CFLAGS_EXTRA -std=c11 -Wall -Wextra -Werror "$HERE/pkg_user.c" \
  $(pkg-config --cflags --libs idem-static) -o "$TMP/user_static" \
  2>"$TMP/cc.log"
expect_eq "a program links libidem.a with pkg-config idem-static" 0 "$?"
cat "$TMP/cc.log" >&2
readelf -d "$TMP/user_static" | grep -q 'NEEDED.*libidem' &&
  fail "the static program needs a libidem.so" || ok
out=$("$TMP/user_static" "sqlite:$TMP/s2/store.db" 2>&1)
expect_eq "and runs" "0 $want" "$? $out"

expect_match "installed idem runs" "^idem $VERSION\$" \
  "$("$TMP/prefix/bin/idem" --version)"

# What operators expect beside the program: the manual pages, the
# completions, the systemd unit (its ExecStart the installed program) with
# an example of its settings, and NEWS.md.
for page in man1/idem.1 man1/idem-lab.1 man1/idem-canon.1 man1/idem-run.1 \
  man1/idem-serve.1 man1/idem-mcp.1 man1/idem-keys.1 man1/idem-console.1 \
  man1/idem-bench.1 man3/libidem.3; do
  [ -f "$TMP/prefix/share/man/$page" ] && ok || fail "installed share/man/$page"
done
if command -v man >/dev/null 2>&1; then
  expect_eq "man finds idem-serve(1) under the prefix" \
    "$TMP/prefix/share/man/man1/idem-serve.1" \
    "$(MANPATH="$TMP/prefix/share/man" man -w idem-serve 2>&1)"
fi
for f in share/bash-completion/completions/idem share/zsh/site-functions/_idem \
  share/doc/idem/examples/serve.conf share/doc/idem/NEWS.md; do
  [ -f "$TMP/prefix/$f" ] && ok || fail "installed $f"
done
unit="$TMP/prefix/lib/systemd/system/idem-serve@.service"
[ -f "$unit" ] && ok || fail "installed lib/systemd/system/idem-serve@.service"
expect_eq "the unit runs the installed idem" \
  "ExecStart=$TMP/prefix/bin/idem serve \$IDEM_SERVE_ARGS" \
  "$(grep '^ExecStart=' "$unit" 2>&1)"
finish
