#!/bin/sh
# cmake --install puts the header, both libraries, idem.pc and the program
# under any prefix, and a program builds against them with pkg-config.
BUILD=$1
SANITIZE=${2:-OFF}
. "$(dirname "$0")/lib.sh"
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
[ -e "$libdir/libidem.so" ] && ok || fail "installed libidem.so"

cat > "$TMP/consumer.c" <<'C'
#include <idem.h>
#include <stdio.h>
int main(void) {
  char *out = NULL, fp[IDEM_FINGERPRINT_SIZE];
  size_t n = 0;
  if (idem_canonicalize("{\"b\":1,\"a\":[1.0]}", 17, NULL, &out, &n, NULL) ||
      idem_fingerprint("{}", 2, 1, fp))
    return 1;
  printf("%s %s %s\n", idem_version(), out, fp);
  idem_free(out);
  return 0;
}
C
export PKG_CONFIG_PATH="$(dirname "$pc")"
cc $CFLAGS_EXTRA "$TMP/consumer.c" $(pkg-config --cflags --libs idem) -Wl,-rpath,"$libdir" \
  -o "$TMP/consumer" 2>"$TMP/cc.log"
expect_eq "a program builds with pkg-config idem" 0 "$?"
cat "$TMP/cc.log" >&2
out=$("$TMP/consumer")
expect_eq "and runs against the installed library" \
  "0.3.0 {\"a\":[1],\"b\":1} 44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" "$out"
expect_match "installed idem runs" '^idem ' "$("$TMP/prefix/bin/idem" --version)"
finish
