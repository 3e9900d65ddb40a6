#!/bin/sh
# idem keys --seal-key: sealed records shown opened with their key, or
# said to be sealed without it; key files in each form, and refused when
# others may read them; idem keys resolve sealing what it stores.
IDEM=$1
PUT_RECORD=$2 # writes a record through libidem: see put_record.c
. "$(dirname "$0")/lib.sh"
export IDEM_STORE="sqlite:$TMP/keys.db"
umask 077

KEY_A_HEX=000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f
KID_A=824df77c7acb3c76 # SHA-256("idem seal key id" || key A), 8 bytes
printf '%s\n' "$KEY_A_HEX" > "$TMP/a.hex"
printf '%s' 'AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=' > "$TMP/a.b64"
i=0
while [ $i -lt 32 ]; do printf "\\$(printf %03o $i)"; i=$((i + 1)); done > "$TMP/a.raw"
printf '%s\n' b0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0c1c2c3c4c5c6c7c8c9cacbcccdcecf > "$TMP/b.hex"

PUT_RECORD_SEAL_KEY=$KEY_A_HEX "$PUT_RECORD" "$IDEM_STORE" acme op sealed-1 \
  '{"secret":"REQ-SECRET-91"}' || fail "put_record could not write"
expect_eq "the raw key file is 32 bytes" 32 "$(wc -c < "$TMP/a.raw" | tr -d ' ')"

out=$("$IDEM" keys show sealed-1 --tenant acme --operation op)
expect_eq "show without a key: exit 0" 0 "$?"
expect_match "show without a key: says sealed, names the key" \
  "response: +sealed with key $KID_A; pass --seal-key" "$out"
expect_match "show without a key: the status stays in clear" 'status: +0' "$out"
case $out in *stored*|*REQ-SECRET*) fail "show without a key printed the plaintext: $out" ;; *) ok ;; esac

for f in a.hex a.b64 a.raw; do
  out=$("$IDEM" keys show sealed-1 --tenant acme --operation op --seal-key "$TMP/$f")
  expect_match "show --seal-key $f: opened" "sealed: +with key $KID_A \\(opened\\)" "$out"
  expect_match "show --seal-key $f: the body" 'body: +stored\\n' "$out"
  expect_match "show --seal-key $f: the request" 'REQ-SECRET-91' "$out"
done
out=$("$IDEM" keys show sealed-1 --json --seal-key "$TMP/b.hex" --seal-key "$TMP/a.hex")
expect_match "show --json with keys [B, A]: the body" '"body": "stored\\n"' "$out"
expect_match "show --json: the key id" "\"seal_key_id\": \"$KID_A\"" "$out"
out=$("$IDEM" keys show sealed-1 --json --seal-key "$TMP/b.hex")
expect_match "show --json with the wrong key: sealed" '"sealed": "no key"' "$out"
case $out in *'"body"'*) fail "the wrong key showed a body: $out" ;; *) ok ;; esac
out=$("$IDEM" keys list --json --seal-key "$TMP/a.hex")
expect_match "list --seal-key --json: the key id" "\"seal_key_id\":\"$KID_A\"" "$out"

# Key files that are not keys, or that others may read.
chmod 644 "$TMP/a.hex"
err=$("$IDEM" keys show sealed-1 --seal-key "$TMP/a.hex" 2>&1 >/dev/null)
expect_eq "a key others may read: exit 1" 1 "$?"
expect_match "a key others may read: says why and how" "too open.*chmod 600 $TMP/a.hex" "$err"
chmod 600 "$TMP/a.hex"
printf 'not a key\n' > "$TMP/bad.key"
err=$("$IDEM" keys show sealed-1 --seal-key "$TMP/bad.key" 2>&1 >/dev/null)
expect_eq "a file that is no key: exit 1" 1 "$?"
expect_match "a file that is no key: named" "$TMP/bad.key: not a sealing key" "$err"
printf '%s\n\n' "$KEY_A_HEX" > "$TMP/two-newlines.key"
"$IDEM" keys show sealed-1 --seal-key "$TMP/two-newlines.key" >/dev/null 2>&1
expect_eq "two newlines after the key: refused" 1 "$?"
"$IDEM" keys prune --seal-key "$TMP/a.hex" >/dev/null 2>&1
expect_eq "--seal-key is not an option of prune" 2 "$?"

# resolve --seal-key seals the response it stores.
"$IDEM" run --key dying --lease 200ms -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up" </dev/null &
pid=$!
wait_for "$TMP/up" || fail "the dying run did not start"
kill -KILL $pid; wait $pid 2>/dev/null
sleep 0.3
printf 'SETTLED-SECRET-33\n' > "$TMP/body"
"$IDEM" keys resolve dying --completed --status 0 --body "$TMP/body" \
  --seal-key "$TMP/a.hex" >/dev/null
expect_eq "resolve --completed --seal-key" 0 "$?"
if cat "$TMP"/keys.db* | grep -aq SETTLED-SECRET; then
  fail "the resolved response is stored in clear"
else
  ok
fi
out=$("$IDEM" run --key dying -- sh -c 'echo up > "$1"; sleep 5' x "$TMP/up" </dev/null 2>"$TMP/err")
expect_eq "a run without the key: fails before running (125)" 125 "$?"
expect_eq "a run without the key: replays nothing" "" "$out"
expect_match "a run without the key: says why" "IDEM_ESEALED" "$(cat "$TMP/err")"
out=$("$IDEM" keys show dying --seal-key "$TMP/a.hex")
expect_match "show: the resolved response, opened" 'body: +SETTLED-SECRET-33' "$out"

finish
