-- pgbench script: the statements of one idem_execute_local() on a new key
-- (PostgreSQL store, idem bench's fresh phase), sent the way idem sends
-- them: three round trips, the first and last pipelined. bench/run.sh runs
-- it with -M prepared beside `idem bench`, so that the report can tell what
-- these statements cost on this server from what idem adds to them.
-- It writes into idem's own tables (schema "idem", operation
-- "pgbench-shape") and into bench_tickets; idem bench creates both first.
\set k random(1, 9000000000000000000)
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT pg_advisory_xact_lock(:k);
SELECT fingerprint, state, attempt, lease_expires_ms, expires_ms, status, meta, body, checksum FROM idem.idem_records WHERE tenant = 'bench' AND operation = 'pgbench-shape' AND key = 'k-' || :k;
\endpipeline
INSERT INTO bench_tickets (payload) VALUES ('{"priority":"normal","project":"demo-agent","title":"Investigate a synthetic queue backlog"}') RETURNING id;
\startpipeline
INSERT INTO idem.idem_records (tenant, operation, key, fingerprint, request, state, attempt, created_ms, updated_ms, lease_expires_ms, expires_ms, status, meta, body, checksum) SELECT 'bench', 'pgbench-shape', 'k-' || :k, 'sha256:7d3c0bfae1c4ecbf2b9e0b8e2f44a5c3cd7a5fe62cb4a7b0d5b6a4e0f1d2c3b4', NULL, 2, 1, n.now_ms, n.now_ms, 0, n.now_ms + 86400000, 201, NULL, '\x7b227469636b65745f6964223a313233343536377d', 'sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0' FROM (SELECT (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint AS now_ms) n;
COMMIT;
\endpipeline
