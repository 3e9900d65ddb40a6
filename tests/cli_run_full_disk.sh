#!/bin/sh
# idem run on a real full disk: a small tmpfs mounted in a mount namespace
# of this test's own (a user namespace too when not root). A claim that
# does not fit: the command never runs, exit 125 and IDEM_EIO. A result
# that does not fit: the command ran once, exit 5, and no later run acts
# again by itself. Once there is room, idem run works again.
IDEM=$1
. "$(dirname "$0")/lib.sh"

if [ "${IDEM_IN_NAMESPACE:-}" != 1 ]; then
  # Run this very script again inside a mount namespace.
  if [ "$(id -u)" = 0 ]; then ns="-m"; else ns="-r -m"; fi
  # shellcheck disable=SC2086
  IDEM_IN_NAMESPACE=1 unshare $ns sh "$0" "$IDEM"
  exit $?
fi

SMALL="$TMP/small"
mkdir "$SMALL"
mount --make-rprivate / 2>/dev/null
if ! mount -t tmpfs -o size=768k tmpfs "$SMALL"; then
  echo "FAIL: cannot mount a small tmpfs (needs root or user namespaces)" >&2
  exit 1
fi
trap 'umount "$SMALL" 2>/dev/null; rm -rf "$TMP"' EXIT
export IDEM_STORE="$SMALL/store.db"

# Fills the tmpfs up with ballast files of 16 KB, until no more fits.
fill() {
  i=0
  while dd if=/dev/zero of="$SMALL/ballast.$i" bs=16k count=1 2>/dev/null; do
    i=$((i + 1))
  done
  rm -f "$SMALL/ballast.$i"
}
free_room() { rm -f "$SMALL"/ballast.*; }

out=$("$IDEM" run --key first -- echo hello)
expect_eq "the store works" "0 hello" "$? $out"

# 1. The disk is full before the claim: nothing runs. (On a disk this
#    full the store cannot even be opened: WAL must size its shared-memory
#    file first.)
fill
out=$("$IDEM" run --key claim -- sh -c "echo ran >> '$TMP/claim.ran'; echo x" 2>"$TMP/claim.err")
expect_eq "full before the claim: exit 125" 125 "$?"
expect_match "full before the claim: message" "No space left on device.*IDEM_EIO" "$(cat "$TMP/claim.err")"
expect_eq "full before the claim: the command did not run" no "$([ -e "$TMP/claim.ran" ] && echo yes || echo no)"
free_room
out=$("$IDEM" run --key claim -- sh -c "echo ran >> '$TMP/claim.ran'; echo x")
expect_eq "room again: the key acts" "0 x" "$? $out"
expect_eq "room again: once" 1 "$(wc -l < "$TMP/claim.ran")"

# 2. The claim fits, the command's output does not: it ran once, exit 5.
#    No later run acts again by itself: the key is unknown (marked so, or
#    its lease ran out with no result).
fill
rm -f "$SMALL/ballast.0" "$SMALL/ballast.1" "$SMALL/ballast.2"
big="$TMP/big"
head -c 400000 /dev/urandom | od -An -x > "$big"
cmd="echo ran >> '$TMP/result.ran'; cat '$big'"
"$IDEM" run --key result --lease 1s -- sh -c "$cmd" >/dev/null 2>"$TMP/result.err"
expect_eq "result does not fit: exit 5" 5 "$?"
expect_match "result does not fit: message" "not recorded.*(full|IDEM_EIO)" "$(cat "$TMP/result.err")"
expect_eq "result does not fit: ran once" 1 "$(wc -l < "$TMP/result.ran")"
free_room
sleep 1.2
"$IDEM" run --key result --lease 1s -- sh -c "$cmd" >/dev/null 2>"$TMP/result2.err"
expect_eq "after: unknown, exit 4" 4 "$?"
expect_eq "after: not run again" 1 "$(wc -l < "$TMP/result.ran")"
out=$("$IDEM" keys list 2>&1)
expect_match "after: the key is listed" "result" "$out"
out=$("$IDEM" run --key after -- echo fine)
expect_eq "after: a new key works" "0 fine" "$? $out"
finish
