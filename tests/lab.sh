#!/bin/sh
# idem lab: every scenario passes, and the two seed suites print exactly the
# observations the seeds published.
# With "postgresql" as the second argument the lab runs on the server named
# by IDEM_TEST_PG_URL, which must be set: a missing server is a failure.
IDEM=$1
BACKEND=${2:-sqlite}
. "$(dirname "$0")/lib.sh"

set --
FIXTURE="synthetic local SQLite transaction"
if [ "$BACKEND" = postgresql ]; then
  if [ -z "${IDEM_TEST_PG_URL:-}" ]; then
    fail "IDEM_TEST_PG_URL is not set: no PostgreSQL server for this test"
    finish
    exit 1
  fi
  set -- --store "$IDEM_TEST_PG_URL"
  FIXTURE="synthetic local PostgreSQL transaction"
fi

"$IDEM" lab "$@" --output "$TMP/evidence.json" > "$TMP/out" 2>"$TMP/err"
expect_eq "idem lab exit status" 0 "$?"
cat "$TMP/err" >&2
expect_match "PASS line" '^PASS: [0-9]+ scenarios$' "$(tail -n 1 "$TMP/out")"

# The tool retries lab's published output, line for line.
while IFS= read -r want; do
  name=${want%%:*}
  got=$(grep "^$name: " "$TMP/out")
  expect_eq "tool-retries $name" "$want" "$got"
done <<'SEED'
naive_retry: {"attempts": 2, "tickets": 2}
stable_key_retry: {"attempts": 3, "replay_ticket_id": 1, "tickets": 1}
changed_payload: {"rejected": true, "tickets": 1}
failure_before_commit: {"tickets_after_retry": 1, "tickets_before_retry": 0}
concurrent_same_key: {"attempts": 8, "returned_ticket_ids": [1], "tickets": 1}
new_key_same_payload: {"tickets": 2}
deleted_replay_record: {"tickets": 2}
SEED

# The idempotency example's published scenario output.
want='{"after_distinct_tenant": {"alpha_balance": 5, "beta_balance": 7, "operations": 2}, "after_retry": {"alpha_balance": 5, "beta_balance": 0, "operations": 1}, "conflicting_payload_rejected": true, "fixture": "'"$FIXTURE"'", "recovered_result": {"account": "account-1", "balance": 5, "version": 1}}'
got=$(sed -n 's/^scenario_output: //p' "$TMP/out")
expect_eq "account-credit scenario output" "$want" "$got"

for t in writer_exits_after_commit writer_killed_after_commit writer_killed_before_commit \
         sixteen_concurrent_duplicates sixteen_concurrent_processes conflicting_payload \
         tenant_scope rejected_account new_intent lease_expiry_recover stale_completion \
         retention_expiry many_processes_few_keys; do
  grep -q "^$t: {" "$TMP/out" && ok || fail "scenario $t printed"
done

# The evidence file.
python3 - "$TMP/evidence.json" "$BACKEND" <<'PY' && ok || fail "evidence JSON"
import json, sys
e = json.load(open(sys.argv[1]))
assert e["passed"] is True and e["store"] == sys.argv[2]
assert e["sqlite"] and e["idem"]
assert (e["postgresql"] is None) == (sys.argv[2] == "sqlite")
s = e["suites"]
assert s["tool-retries"]["scenarios"]["stable_key_retry"] == {"attempts": 3, "tickets": 1, "replay_ticket_id": 1}
assert s["account-credit"]["scenarios"]["scenario_output"]["recovered_result"] == {"account": "account-1", "balance": 5, "version": 1}
assert len(s["recovery"]["scenarios"]) == 4
assert e["scenario_count"] == 21
PY

if [ "$BACKEND" = postgresql ]; then
  left=$(psql "$IDEM_TEST_PG_URL" -Atc "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'idem_lab_%'")
  expect_eq "the lab dropped its schemas" 0 "$left"
fi

"$IDEM" lab "$@" --suite tool-retries > "$TMP/one"
expect_eq "--suite: one suite" "PASS: 7 scenarios" "$(tail -n 1 "$TMP/one")"
"$IDEM" lab --suite nosuch 2>/dev/null
expect_eq "unknown suite: exit 2" 2 "$?"
finish
