#!/bin/sh
# libidem builds without libpq: configured with -DIDEM_WITH_POSTGRESQL=OFF
# and libpq hidden from pkg-config, the library builds, no test that needs
# PostgreSQL is registered, the installed idem.pc names no libpq, and a
# program built with it (shared, and fully static) uses an SQLite store and
# is told clearly that a postgresql:// URL cannot be opened. To keep its
# cost low it builds the library only, not the idem program.
#
# Usage: build_without_postgresql.sh SOURCE_DIR VERSION
SRC=$1
VERSION=$2
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

# Every .pc file the machine has, but libpq's.
mkdir "$TMP/pc"
old_ifs=$IFS
IFS=:
for d in $(pkg-config --variable pc_path pkg-config) ${PKG_CONFIG_PATH:-}; do
  IFS=$old_ifs
  [ -d "$d" ] || continue
  for pc in "$d"/*.pc; do
    name=$(basename "$pc")
    [ -e "$pc" ] && [ "$name" != libpq.pc ] && [ ! -e "$TMP/pc/$name" ] &&
      ln -s "$pc" "$TMP/pc/$name"
  done
done
IFS=$old_ifs
export PKG_CONFIG_LIBDIR="$TMP/pc"
unset PKG_CONFIG_PATH
pkg-config --exists libpq
expect_eq "libpq is hidden from pkg-config" 1 "$?"

B="$TMP/build"
cmake -S "$SRC" -B "$B" -DCMAKE_BUILD_TYPE=Debug -DIDEM_WITH_POSTGRESQL=OFF \
  -DBUILD_TESTING=ON > "$TMP/configure.log" 2>&1
status=$?
expect_eq "cmake configures with IDEM_WITH_POSTGRESQL=OFF" 0 "$status"
[ "$status" = 0 ] || tail -n 20 "$TMP/configure.log" >&2

tests=$(cd "$B" && ctest -N)
expect_match "the SQLite tests are registered" 'Test +#[0-9]+: cli_run$' "$tests"
printf '%s\n' "$tests" | grep -Ei 'Test +#[0-9]+: .*(postgres|pg_)' |
  grep -v ': build_without_postgresql$' >&2 &&
  fail "tests that need PostgreSQL are registered" || ok

cmake --build "$B" -j 2 --target idem_shared idem_static > "$TMP/build.log" 2>&1
status=$?
expect_eq "the library builds without libpq" 0 "$status"
[ "$status" = 0 ] || tail -n 20 "$TMP/build.log" >&2
lib=$(ls "$B"/libidem.so.* 2>/dev/null | head -n 1)
readelf -d "$lib" > "$TMP/dynamic" 2>&1
expect_match "readelf reads libidem.so" 'NEEDED' "$(cat "$TMP/dynamic")"
grep -q 'NEEDED.*libpq' "$TMP/dynamic" && fail "libidem.so needs libpq" || ok

cmake --install "$B" --prefix "$TMP/prefix" --component libidem \
  > "$TMP/install.log" 2>&1
expect_eq "cmake --install --component libidem" 0 "$?"
pc=$(find "$TMP/prefix" -name idem.pc | head -n 1)
[ -n "$pc" ] && ok || fail "installed idem.pc"
libdir=$(dirname "$(dirname "$pc")")
grep -Eq 'pq|postgres' "$pc" && fail "idem.pc names libpq: $(cat "$pc")" || ok
export PKG_CONFIG_PATH="$(dirname "$pc")"

canon='{"a":[1],"b":1}'
fp=$(printf '%s' "$canon" | sha256sum | cut -d ' ' -f 1)
want="$VERSION $canon $fp proceed replay 201 {\"ticket\":1}"
nopg="open: IDEM_EURL: store: this libidem was built without PostgreSQL support"

cc -std=c11 -Wall -Wextra -Werror "$HERE/pkg_user.c" \
  $(pkg-config --cflags --libs idem) -Wl,-rpath,"$libdir" \
  -o "$TMP/user_shared" 2>"$TMP/cc.log"
expect_eq "a program builds with pkg-config idem" 0 "$?"
cat "$TMP/cc.log" >&2
ldd "$TMP/user_shared" | grep -q libpq && fail "the program loads libpq" || ok
mkdir "$TMP/s1" "$TMP/s2"
out=$("$TMP/user_shared" "sqlite:$TMP/s1/store.db" 2>&1)
expect_eq "it uses an SQLite store" "0 $want" "$? $out"
out=$("$TMP/user_shared" "postgresql://localhost/idem" 2>&1)
expect_eq "a postgresql:// URL is refused" "1 $nopg" "$? $out"
out=$("$TMP/user_shared" "pg:host=localhost dbname=idem" 2>&1)
expect_eq "and so is pg:CONNINFO" "1 $nopg" "$? $out"

# Without libpq nothing stops a fully static program:
# `pkg-config --static --libs idem` with -static.
cc -static -std=c11 -Wall -Wextra "$HERE/pkg_user.c" \
  $(pkg-config --cflags idem) $(pkg-config --static --libs idem) \
  -o "$TMP/user_static" 2>"$TMP/cc.log"
status=$?
expect_eq "a static program links with pkg-config --static --libs idem" 0 "$status"
[ "$status" = 0 ] || cat "$TMP/cc.log" >&2
readelf -d "$TMP/user_static" 2>&1 | grep -q NEEDED &&
  fail "the static program needs shared libraries" || ok
out=$("$TMP/user_static" "sqlite:$TMP/s2/store.db" 2>&1)
expect_eq "and uses an SQLite store" "0 $want" "$? $out"
finish
