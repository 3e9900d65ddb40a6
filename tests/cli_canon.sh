#!/bin/sh
# idem canon, idem --help/--version/help: driven through the real program.
IDEM=$1
VEC=$2
. "$(dirname "$0")/lib.sh"

for f in "$VEC"/input/*.json; do
  name=$(basename "$f")
  "$IDEM" canon -n "$f" > "$TMP/out" 2>"$TMP/err"
  expect_eq "canon $name: exit status" 0 "$?"
  cmp -s "$TMP/out" "$VEC/output/$name" && ok || fail "canon $name: output differs from the vector"
done

out=$(printf '{"b": 2, "a": [1.0, 1e21, -0]}' | "$IDEM" canon)
expect_eq "stdin, with newline" '{"a":[1,1e+21,0],"b":2}' "$out"
out=$(printf '{"b":2,"a":1}' | "$IDEM" canon -n -)
expect_eq "'-' is stdin" '{"a":1,"b":2}' "$out"
printf '{"a":1}' | "$IDEM" canon -n > "$TMP/n"
expect_eq "-n: no trailing newline" 7 "$(wc -c < "$TMP/n" | tr -d ' ')"

h1=$(printf '{"payload":{"priority":"normal","title":"t"},"operation_key":"k"}' | "$IDEM" canon --hash)
h2=$(printf '{ "operation_key" : "k", "payload" : { "title":"t", "priority":"normal" } }' | "$IDEM" canon --hash)
h3=$(printf '{"operation_key":"k","payload":{"priority":"urgent","title":"t"}}' | "$IDEM" canon --hash)
expect_match "--hash: 64 lowercase hex digits" '^[0-9a-f]{64}$' "$h1"
expect_eq "--hash: key order and whitespace do not matter" "$h1" "$h2"
[ "$h1" != "$h3" ] && ok || fail "--hash: a changed value changes the hash"
want=$(printf '{"operation_key":"k","payload":{"priority":"normal","title":"t"}}' | sha256sum | cut -d' ' -f1)
expect_eq "--hash is the SHA-256 of the canonical bytes" "$want" "$h1"

msg=$(printf '{"a":1,"a":2}' | "$IDEM" canon 2>&1)
expect_eq "duplicate key: exit 1" 1 "$?"
expect_match "duplicate key: names the offset" "byte 7" "$msg"
msg=$(printf '[1, 2' | "$IDEM" canon 2>&1)
expect_eq "truncated: exit 1" 1 "$?"
msg=$(printf '{"a":"\377"}' | "$IDEM" canon 2>&1)
expect_eq "bad UTF-8: exit 1" 1 "$?"
expect_match "bad UTF-8: says so" "UTF-8" "$msg"
msg=$(printf '[1e400]' | "$IDEM" canon 2>&1)
expect_eq "huge number: exit 1" 1 "$?"
"$IDEM" canon "$TMP/does-not-exist" 2>/dev/null
expect_eq "missing file: exit 1" 1 "$?"
"$IDEM" canon --bogus 2>/dev/null
expect_eq "unknown option: exit 2" 2 "$?"

"$IDEM" --help | grep -q "canon" && ok || fail "idem --help lists canon"
expect_match "--version" '^idem [0-9]+\.[0-9]+\.[0-9]+$' "$("$IDEM" --version)"
"$IDEM" help canon | grep -q -- "--hash" && ok || fail "idem help canon"
"$IDEM" help nosuch 2>/dev/null
expect_eq "help for an unknown command: exit 2" 2 "$?"
"$IDEM" nosuch 2>/dev/null
expect_eq "unknown command: exit 2" 2 "$?"
for c in lab canon run keys bench; do
  "$IDEM" $c --help > /dev/null
  expect_eq "idem $c --help" 0 "$?"
done
finish
