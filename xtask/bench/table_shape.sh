#!/usr/bin/env bash
# Compares physical shapes of the ledger table with pgbench (ADR 0005). Each transaction is what a
# co-committed keyed mutation does: claim (INSERT ... ON CONFLICT DO NOTHING), the business insert,
# and the transition (conditional UPDATE on state and version). The baseline is the business
# insert alone. Run it against a durable server:
#
#   cargo xtask pg start --durable
#   DATABASE_URL=$(cargo xtask pg url) bash xtask/bench/table_shape.sh [SECONDS] [CLIENTS] [PRELOAD]
#
# PRELOAD rows of finished operations are bulk-loaded into each shape first, so that index pages
# no longer all sit in cache (random-key index inserts are where the shapes differ).
set -euo pipefail
url=${DATABASE_URL:?set DATABASE_URL to a PostgreSQL started with fsync on}
seconds=${1:-20}
clients=${2:-8}
preload=${3:-0}
pgbench_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)/pgbench
[ -x "$pgbench_bin" ] || pgbench_bin=pgbench
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -n "${KEEP:-}" ] && trap - EXIT && echo "scripts in $work"

psql "$url" -q -v ON_ERROR_STOP=1 <<'SQL'
DROP TABLE IF EXISTS shape_seed, shape_identity, shape_digest, shape_business;
CREATE TABLE shape_business (payment_key TEXT PRIMARY KEY, amount BIGINT NOT NULL);
-- The Java seed: a stored text storage key as primary key, plus a unique index on the identity.
CREATE TABLE shape_seed (
  storage_key TEXT PRIMARY KEY,
  caller_fingerprint VARCHAR(128) NOT NULL, full_method_name VARCHAR(512) NOT NULL,
  idempotency_key_hash VARCHAR(64) NOT NULL, request_fingerprint VARCHAR(64) NOT NULL,
  state VARCHAR(16) NOT NULL, version BIGINT NOT NULL, claimed_at BIGINT NOT NULL,
  lease_expires_at BIGINT NOT NULL, completed_at BIGINT, outcome_reference VARCHAR(1024),
  UNIQUE (caller_fingerprint, full_method_name, idempotency_key_hash));
-- This project: the identity is the primary key; claimed_at index for purge; fillfactor 80.
CREATE TABLE shape_identity (
  caller_fingerprint VARCHAR(128) NOT NULL, full_method_name VARCHAR(512) NOT NULL,
  idempotency_key_hash VARCHAR(64) NOT NULL, request_fingerprint VARCHAR(64) NOT NULL,
  state VARCHAR(16) NOT NULL, version BIGINT NOT NULL, claimed_at BIGINT NOT NULL,
  lease_expires_at BIGINT NOT NULL, completed_at BIGINT, outcome_reference VARCHAR(1024),
  PRIMARY KEY (caller_fingerprint, full_method_name, idempotency_key_hash))
  WITH (fillfactor = 80);
CREATE INDEX ON shape_identity (claimed_at);
-- The alternative: a 32-byte digest of the identity as the key.
CREATE TABLE shape_digest (
  identity_digest BYTEA PRIMARY KEY,
  caller_fingerprint VARCHAR(128) NOT NULL, full_method_name VARCHAR(512) NOT NULL,
  idempotency_key_hash VARCHAR(64) NOT NULL, request_fingerprint VARCHAR(64) NOT NULL,
  state VARCHAR(16) NOT NULL, version BIGINT NOT NULL, claimed_at BIGINT NOT NULL,
  lease_expires_at BIGINT NOT NULL, completed_at BIGINT, outcome_reference VARCHAR(1024))
  WITH (fillfactor = 80);
CREATE INDEX ON shape_digest (claimed_at);
SQL

if [ "$preload" -gt 0 ]; then
  psql "$url" -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO shape_seed SELECT c || '|/p.S/M|' || h, c, '/p.S/M', h, h, 'COMMITTED', 2, 1, 2, 3, 'p'
  FROM (SELECT md5('c' || (i % 8)) || md5((i % 8) || 'c') AS c, md5(i::text) || md5('x' || i) AS h
        FROM generate_series(1, $preload) AS i) AS rows;
INSERT INTO shape_identity SELECT c, m, h, r, s, v, a, l, d, o FROM (
  SELECT caller_fingerprint AS c, full_method_name AS m, idempotency_key_hash AS h,
         request_fingerprint AS r, state AS s, version AS v, claimed_at AS a,
         lease_expires_at AS l, completed_at AS d, outcome_reference AS o FROM shape_seed) AS rows;
INSERT INTO shape_digest SELECT sha256(convert_to(storage_key, 'UTF8')), caller_fingerprint,
  full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at,
  lease_expires_at, completed_at, outcome_reference FROM shape_seed;
VACUUM ANALYZE;
CHECKPOINT;
SQL
fi

common='\set k random(1, 9000000000000000000)
\set c random(1, 8)
'
now="(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
caller="md5('caller' || :c) || md5(:c || 'caller')"
key="md5(:k || '-' || :client_id) || md5(:client_id || '-' || :k)"
method="'/payments.v1.Payments/CreatePayment'"
business="INSERT INTO shape_business (payment_key, amount) VALUES (:k || '-' || :client_id, :k);"

printf '%s%s\n' "$common" "$business" > "$work/business.sql"
cat > "$work/seed.sql" <<SQL
$common
BEGIN;
INSERT INTO shape_seed (storage_key, caller_fingerprint, full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at, lease_expires_at) VALUES ($caller || '|' || $method || '|' || $key, $caller, $method, $key, md5('r' || :k) || md5('s' || :k), 'IN_PROGRESS', 1, $now, $now + 30000) ON CONFLICT DO NOTHING;
$business
UPDATE shape_seed SET state = 'COMMITTED', version = version + 1, completed_at = $now, outcome_reference = 'p-' || :k WHERE storage_key = $caller || '|' || $method || '|' || $key AND state = 'IN_PROGRESS' AND version = 1;
END;
SQL
cat > "$work/identity.sql" <<SQL
$common
BEGIN;
INSERT INTO shape_identity (caller_fingerprint, full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at, lease_expires_at) VALUES ($caller, $method, $key, md5('r' || :k) || md5('s' || :k), 'IN_PROGRESS', 1, $now, $now + 30000) ON CONFLICT (caller_fingerprint, full_method_name, idempotency_key_hash) DO NOTHING;
$business
UPDATE shape_identity SET state = 'COMMITTED', version = version + 1, completed_at = $now, outcome_reference = 'p-' || :k WHERE caller_fingerprint = $caller AND full_method_name = $method AND idempotency_key_hash = $key AND state = 'IN_PROGRESS' AND version = 1;
END;
SQL
cat > "$work/digest.sql" <<SQL
$common
BEGIN;
INSERT INTO shape_digest (identity_digest, caller_fingerprint, full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at, lease_expires_at) VALUES (sha256(convert_to($caller || '|' || $method || '|' || $key, 'UTF8')), $caller, $method, $key, md5('r' || :k) || md5('s' || :k), 'IN_PROGRESS', 1, $now, $now + 30000) ON CONFLICT DO NOTHING;
$business
UPDATE shape_digest SET state = 'COMMITTED', version = version + 1, completed_at = $now, outcome_reference = 'p-' || :k WHERE identity_digest = sha256(convert_to($caller || '|' || $method || '|' || $key, 'UTF8')) AND state = 'IN_PROGRESS' AND version = 1;
END;
SQL

run() {
  "$pgbench_bin" "$url" -n -M prepared -c "$clients" -j 2 -T "$seconds" -f "$work/$1.sql" 2>&1 \
    | awk -v name="$1" '/^tps = / {printf "%s %.1f\n", name, $3}'
}
results=$(for shape in business seed identity digest business; do run "$shape"; done)
echo "$results" | awk '
  # The baseline runs first and last; its mean is the denominator.
  { sum[$1] += $2; runs[$1] += 1 }
  END {
    base = sum["business"] / runs["business"]
    printf "%-10s %10s %8s\n", "shape", "tps", "ratio"
    split("business seed identity digest", order, " ")
    for (i = 1; i <= 4; i++) {
      s = order[i]
      printf "%-10s %10.1f %8.2f\n", s, sum[s] / runs[s], sum[s] / runs[s] / base
    }
  }'
psql "$url" -q -c "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname LIKE 'shape_%' ORDER BY relname"
