#!/bin/sh
# idem-serve@.service, as configured for the install: systemd-analyze
# verify accepts an instance of it with no message at all (an unknown or
# misspelt setting is only a warning there, so any output fails), its
# Documentation= page is found, `systemd-analyze security` rates it at
# most 2.0 (OK), and it waits for the gateway's drain on SIGTERM: longer
# than --upstream-timeout's default, which bounds it. Neither command
# needs a running systemd.
#
# Usage: systemd_unit.sh IDEM UNIT MANDIR
IDEM=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
UNIT=$2
MANDIR=$3
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

command -v systemd-analyze >/dev/null 2>&1 && ok ||
  { fail "systemd-analyze is missing (scripts/deps.sh check installs systemd)"; finish; exit 1; }

# An instance whose ExecStart is the idem just built (verify checks that
# it is executable), with the manual pages on MANPATH.
mkdir "$TMP/units" "$TMP/man" "$TMP/man/man1"
cp "$MANDIR"/*.1 "$TMP/man/man1/"
sed "s|^ExecStart=[^ ]*/idem |ExecStart=$IDEM |" "$UNIT" > "$TMP/units/idem-serve@main.service"
grep -q "^ExecStart=$IDEM serve \$IDEM_SERVE_ARGS\$" "$TMP/units/idem-serve@main.service" &&
  ok || fail "ExecStart is not 'idem serve \$IDEM_SERVE_ARGS'"
out=$(cd "$TMP" && MANPATH="$TMP/man" systemd-analyze verify \
  "$TMP/units/idem-serve@main.service" 2>&1)
expect_eq "systemd-analyze verify" "0 " "$? $out"

out=$(cd "$TMP" && systemd-analyze security --offline=yes --threshold=20 \
  "$TMP/units/idem-serve@main.service" 2>&1)
expect_eq "systemd-analyze security --threshold=20 (exposure at most 2.0)" 0 "$?"
expect_match "its rating" "Overall exposure level for idem-serve@main.service: [01]\\.[0-9] OK" \
  "$(printf '%s\n' "$out" | tail -n 1)"

# The settings the brief of the unit promises.
for setting in DynamicUser=yes NoNewPrivileges=yes ProtectSystem=strict \
  SystemCallFilter=@system-service 'StateDirectory=idem/serve-%i' \
  'EnvironmentFile=/etc/idem/serve-%i.conf' KillSignal=SIGTERM; do
  grep -qx -- "$setting" "$UNIT" && ok || fail "the unit lacks $setting"
done
grep -q '^RestrictAddressFamilies=' "$UNIT" && ok || fail "the unit lacks RestrictAddressFamilies="

# SIGTERM: the gateway drains for at most --upstream-timeout; the unit
# must wait longer before SIGKILL.
"$IDEM" serve --help > "$TMP/help" 2>&1
expect_match "idem serve --help tells what SIGTERM does" \
  "SIGTERM or SIGINT stop accepting, let requests in flight" "$(tr '\n' ' ' < "$TMP/help")"
drain=$(tr '\n' ' ' < "$TMP/help" | grep -oE -- '--upstream-timeout DUR +[^(]*\(default [0-9]+s\)' |
  sed -E 's/.*default ([0-9]+)s\)/\1/')
stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s$/\1/p' "$UNIT")
[ -n "$drain" ] && [ -n "$stop" ] && [ "$stop" -gt "$drain" ] && ok ||
  fail "TimeoutStopSec (${stop:-none}s) must exceed --upstream-timeout's default (${drain:-?}s)"
finish
