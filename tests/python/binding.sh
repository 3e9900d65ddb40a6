#!/bin/sh
# The Python binding's own tests (bindings/python/tests, Debian's
# python3-pytest, python3-mypy, python3-venv and python3-pip) on both
# stores: builds the package from this build's libidem.a into the build
# folder, then runs pytest with Debian's python3.
# Usage: binding.sh SOURCE_DIR BUILD_DIR IDEM_BINARY
set -eu
SRC=$1
BUILD=$2
export IDEM_BIN=$3
PY=/usr/bin/python3
OUT="$BUILD/python"
rm -rf "$OUT"
"$PY" "$SRC/bindings/python/_backend/idem_backend.py" inplace --build-dir "$BUILD" \
  --out "$OUT" >/dev/null
# The PostgreSQL cases fail, never skip, without a server (scripts/check.sh
# starts one and sets IDEM_TEST_PG_URL).
if [ -z "${IDEM_TEST_PG_URL:-}" ]; then
  echo "binding.sh: IDEM_TEST_PG_URL is not set: no PostgreSQL server for the" \
    "binding's PostgreSQL cases (make check starts one)" >&2
  exit 1
fi
cd "$OUT"
# test_packaging.py builds an sdist and an editable install against it.
export IDEM_BUILD_DIR="$BUILD"
PYTHONPATH="$OUT" PYTHONDONTWRITEBYTECODE=1 exec "$PY" -m pytest -q -p no:cacheprovider \
  -o addopts="" -rfE "$SRC/bindings/python/tests"
