#!/bin/sh
# Building and running idem never needs a test-only package: with cmocka
# hidden from pkg-config (every other .pc file stays visible), the project
# configures, builds, and `make demo`'s script runs; the unit tests that
# need cmocka are reported as failed with the reason, never skipped.
SRC=$1
. "$(dirname "$0")/lib.sh"

mkdir "$TMP/pc"
old_ifs=$IFS
IFS=:
for d in $(pkg-config --variable pc_path pkg-config) ${PKG_CONFIG_PATH:-}; do
  IFS=$old_ifs
  [ -d "$d" ] || continue
  for pc in "$d"/*.pc; do
    name=$(basename "$pc")
    [ -e "$pc" ] && [ "$name" != cmocka.pc ] && [ ! -e "$TMP/pc/$name" ] &&
      ln -s "$pc" "$TMP/pc/$name"
  done
done
IFS=$old_ifs
export PKG_CONFIG_LIBDIR="$TMP/pc"
unset PKG_CONFIG_PATH
pkg-config --exists cmocka
expect_eq "cmocka is hidden from pkg-config" 1 "$?"

cmake -S "$SRC" -B "$TMP/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  > "$TMP/configure.log" 2>&1
status=$?
expect_eq "cmake configures without cmocka" 0 "$status"
[ "$status" = 0 ] || tail -n 20 "$TMP/configure.log" >&2

cmake --build "$TMP/build" -j 1 > "$TMP/build.log" 2>&1
status=$?
expect_eq "everything that configured builds without cmocka" 0 "$status"
[ "$status" = 0 ] || tail -n 20 "$TMP/build.log" >&2
expect_match "the idem program runs" '^idem ' "$("$TMP/build/idem" --version)"

out=$(sh "$SRC/scripts/demo.sh" "$TMP/build/idem" 2>&1)
expect_eq "scripts/demo.sh (make demo) runs on that build" 0 "$?"
expect_match "and the lab passes" '^PASS: [0-9]+ scenarios$' \
  "$(printf '%s\n' "$out" | tail -n 1)"

# The unit tests are still registered under their own names, and fail with
# the reason; nothing is silently skipped.
out=$(cd "$TMP/build" && ctest -N)
expect_match "ctest still lists the canon unit test" 'Test +#[0-9]+: canon$' "$out"
out=$(cd "$TMP/build" && ctest -R '^canon$' --output-on-failure 2>&1)
expect_eq "the canon unit test fails" 8 "$?"
expect_match "with the reason" \
  'cmocka \(libcmocka-dev\) is missing: unit tests were not built' "$out"
finish
