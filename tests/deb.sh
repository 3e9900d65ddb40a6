#!/bin/sh
# The package `make deb` built: the files it must hold, Depends computed
# by dpkg-shlibdeps, and, unpacked into a folder of its own (dpkg -x), a
# program that runs and a library a program builds against with idem.pc.
# Run by `make deb` after lintian.
#
# Usage: deb.sh PACKAGE.deb SOURCE_DIR
DEB=$1
SRC=$(cd "$2" && pwd)
. "$SRC/tests/lib.sh"

dpkg-deb -c "$DEB" | awk '{print $6}' | sed 's|^\./|/|' > "$TMP/files"
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for f in /usr/bin/idem /usr/include/idem.h \
  "/usr/lib/$arch/libidem.so" "/usr/lib/$arch/libidem.a" \
  "/usr/lib/$arch/pkgconfig/idem.pc" /usr/share/man/man1/idem.1.gz \
  /usr/share/man/man1/idem-serve.1.gz /usr/share/man/man1/idem-mcp.1.gz \
  /usr/share/man/man1/idem-run.1.gz /usr/share/man/man1/idem-keys.1.gz \
  /usr/share/man/man1/idem-lab.1.gz /usr/share/man/man1/idem-canon.1.gz \
  /usr/share/man/man1/idem-console.1.gz /usr/share/man/man1/idem-bench.1.gz \
  /usr/share/man/man3/libidem.3.gz /usr/share/bash-completion/completions/idem \
  /usr/share/zsh/vendor-completions/_idem /lib/systemd/system/idem-serve@.service \
  /usr/share/doc/idem/copyright /usr/share/doc/idem/NEWS.md; do
  grep -qx -- "$f" "$TMP/files" && ok || fail "the package lacks $f"
done
depends=$(dpkg-deb -f "$DEB" Depends)
for lib in libc6 libsqlite3-0 libssl3 libpq5 libjansson4 libmicrohttpd12 libcurl4; do
  expect_match "Depends names $lib" "(^|, )$lib( |,|\$)" "$depends"
done

dpkg -x "$DEB" "$TMP/root"
expect_eq "the unpacked idem runs" "idem $(dpkg-deb -f "$DEB" Version)" \
  "$("$TMP/root/usr/bin/idem" --version 2>&1)"
expect_eq "and canonicalises" '{"a":[1],"b":1}' \
  "$(printf '{"b":1,"a":[1.0]}' | "$TMP/root/usr/bin/idem" canon 2>&1)"
grep -qx 'ExecStart=/usr/bin/idem serve $IDEM_SERVE_ARGS' \
  "$TMP/root/lib/systemd/system/idem-serve@.service" && ok ||
  fail "the unit does not run /usr/bin/idem"
pc="$TMP/root/usr/lib/$arch/pkgconfig"
cc -std=c11 -Wall -Wextra -Werror "$SRC/tests/pkg_user.c" \
  $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs idem) \
  -Wl,-rpath,"$TMP/root/usr/lib/$arch" -o "$TMP/user" 2>"$TMP/cc.log"
expect_eq "a program builds against the unpacked libidem" 0 "$?"
cat "$TMP/cc.log" >&2
mkdir "$TMP/s"
expect_match "and runs" "proceed replay 201" "$("$TMP/user" "sqlite:$TMP/s/store.db" 2>&1)"
finish
