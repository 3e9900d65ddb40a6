#!/bin/sh
# The idem program with a PostgreSQL URL that holds a password: whatever is
# wrong with the URL, the password is never printed. Needs no server: every
# URL here fails before a connection is tried.
IDEM=$1
. "$(dirname "$0")/lib.sh"
unset IDEM_STORE

# check WHAT STATUS OUTPUT SECRET...: the command failed (not with 75,
# "try again later"), said that the URL is invalid, and printed none of
# the secrets.
# (Shell functions share their variables: check's have names of their own.)
check() {
  c_what=$1 c_status=$2 c_out=$3
  shift 3
  expect_match "$c_what: says the URL is invalid" 'IDEM_EURL' "$c_out"
  case $c_status in
  0 | 75) fail "$c_what: exit $c_status" ;;
  *) ok ;;
  esac
  for secret in "$@"; do
    case $c_out in
    *"$secret"*) fail "$c_what: prints $secret: $c_out" ;;
    *) ok ;;
    esac
  done
}

# expect_hidden WHAT URL SECRET...: through `idem keys list` and `idem run`.
expect_hidden() {
  what=$1 url=$2
  shift 2
  out=$("$IDEM" keys list --store "$url" 2>&1)
  check "keys list, $what" $? "$out" "$@"
  out=$("$IDEM" run --key k1 --store "$url" -- true 2>&1 </dev/null)
  check "run, $what" $? "$out" "$@"
}

expect_hidden "an IPv6 host without ]" 'postgresql://idem:S3CRET@[::1' S3CRET
expect_hidden "a bad percent-escape in the password" \
  'postgresql://idem:S3%zzCRET@localhost/app' S3%zz CRET
expect_hidden "a password in the query" \
  'postgres://idem@[::1/app?password=S3CRET' S3CRET
expect_hidden "a conninfo with a space in the password" \
  'pg:host=/nonexistent password=S3CRET PART2' S3CRET PART2
# pg: with blanks before a URL: libpq reads the whole rest as the URL,
# blanks and all (found by fuzz_store_url).
expect_hidden "a URL after pg: and a blank, a space in the password" \
  'pg: postgresql://idem:S3CRET PART2@[::1' S3CRET PART2
expect_hidden "a URL after pg: and a tab, a tab in the password" \
  "pg:	postgres://idem:S3CRET	PART2@[::1/app" S3CRET PART2
# idem lab quotes libpq when its own connection fails: never the password.
for url in 'postgresql://idem:S3CRET@[::1' 'postgresql://idem:S3%43RET@[::1' \
  'postgresql://idem:S3CRET@127.0.0.1:1/x?connect_timeout=2'; do
  out=$("$IDEM" lab --store "$url" 2>&1)
  st=$?
  [ "$st" != 0 ] && ok || fail "lab with '$url': exit 0"
  case $out in
  *S3CRET*) fail "lab with '$url' prints the password: $out" ;;
  *) ok ;;
  esac
done
finish
