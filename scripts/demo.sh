#!/bin/sh
# make demo: run the seed experiments on the embedded SQLite store.
set -eu
IDEM=${1:-build/idem}
echo "== idem lab (embedded SQLite, fresh temporary databases) =="
"$IDEM" lab
