#!/bin/sh
# `pip install ./bindings/python` as a user runs it, without a package
# index: into the python3 on PATH and into Debian's /usr/bin/python3 (each in
# a venv that sees the interpreter's own packages, so the machine is not
# changed), from the tree and against a libidem installed under a prefix
# (pkg-config idem). Each installed package then runs a decorated function
# twice: one effect, the same ticket both times, the second a replay.
# Usage: install.sh SOURCE_DIR BUILD_DIR
set -eu
SRC=$1
BUILD=$2
WORK=$(mktemp -d /tmp/idem-pyinstall.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

smoke() { # PYTHON LABEL
  out=$(cd "$WORK" && "$1" - "$WORK/$2.db" <<'PY'
import sys, idem
effects = []
with idem.open("sqlite:" + sys.argv[1]) as store:
    @store.idempotent("create_ticket", key="request_id")
    def create_ticket(title, request_id):
        effects.append(title)
        return {"ticket_id": len(effects)}
    first = create_ticket.outcome("disk full", request_id="req-1")
    again = create_ticket.outcome("disk full", request_id="req-1")
import importlib.metadata as md
meta = md.metadata("idem")
licensed = (meta["License"] == "MIT" and
            "License :: OSI Approved :: MIT License" in meta.get_all("Classifier")
            and "MIT License" in md.distribution("idem").read_text("LICENSE"))
print(len(effects), first.value["ticket_id"], again.value["ticket_id"],
      first.replayed, again.replayed, idem.__file__, licensed)
PY
) || fail "$2: the installed package does not run"
  set -- "$@" $out
  [ "$3" = 1 ] && [ "$4" = 1 ] && [ "$5" = 1 ] && [ "$6" = False ] && [ "$7" = True ] \
    || fail "$2: effects, ticket ids, replayed: got $3 $4 $5 $6 $7, want 1 1 1 False True"
  case "$8" in "$WORK"/*) ;; *) fail "$2: imported $8, not the venv's copy" ;; esac
  [ "$9" = True ] || fail "$2: the installed package does not declare the MIT licence"
  echo "ok: $2 ($("$1" -c 'import sys; print(sys.executable, sys.version.split()[0])'))"
}

install_into() { # PYTHON LABEL [ENV...]
  py=$1 label=$2
  shift 2
  "$py" -m venv --system-site-packages "$WORK/$label" \
    || fail "$label: $py -m venv failed (Debian: apt-get install python3-venv)"
  env "$@" "$WORK/$label/bin/python" -m pip install -q --no-index \
    --disable-pip-version-check "$SRC/bindings/python" >"$WORK/$label.log" 2>&1 \
    || { cat "$WORK/$label.log" >&2; fail "$label: pip install ./bindings/python failed"; }
  smoke "$WORK/$label/bin/python" "$label"
}

path_py=$(command -v python3) || fail "no python3 on PATH"
install_into "$path_py" path-python3 IDEM_BUILD_DIR="$BUILD"
if [ "$(readlink -f "$path_py")" != "$(readlink -f /usr/bin/python3)" ]; then
  install_into /usr/bin/python3 debian-python3 IDEM_BUILD_DIR="$BUILD"
fi

# Against an installed libidem: the package links libidem.so from the prefix.
cmake --install "$BUILD" --prefix "$WORK/prefix" --component libidem >/dev/null
install_into /usr/bin/python3 installed-libidem IDEM_LIBIDEM=pkg-config \
  PKG_CONFIG_PATH="$WORK/prefix/lib/pkgconfig"
ldd "$WORK"/installed-libidem/lib/python3*/site-packages/idem/_native*.so \
  | grep -q "$WORK/prefix/.*libidem.so" \
  || fail "installed-libidem: the extension does not use the prefix's libidem.so"
echo "PASS: pip install ./bindings/python"
