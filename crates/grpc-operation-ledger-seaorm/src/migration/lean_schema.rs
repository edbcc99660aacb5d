//! The two shapes the third migration moves rows between: the lean table's DDL on each store, the
//! columns both shapes share, how to tell which shape a table has, and the rows that have no lean
//! form.

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::prelude::*;

/// Where the previous shape's rows wait while they are copied.
pub(super) const PREVIOUS_TABLE: &str = "grpc_operation_ledger_previous";

/// Where the lean shape's rows wait while a revert copies them back.
pub(super) const LEAN_TABLE: &str = "grpc_operation_ledger_lean";

/// The lean table, for PostgreSQL. `{table}` is its name.
const POSTGRES_LEAN_TABLE: &str = "CREATE TABLE {table} (
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    identity_digest      BYTEA         NOT NULL,
    caller_fingerprint   VARCHAR(128)  NOT NULL,
    full_method_name     VARCHAR(512)  NOT NULL,
    idempotency_key_hash BYTEA         NOT NULL,
    request_fingerprint  BYTEA         NOT NULL,
    state                VARCHAR(16)   NOT NULL,
    outcome_reference    VARCHAR(1024),
    failure_message      VARCHAR(1024),
    failure_details      BYTEA,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    CONSTRAINT ck_grpc_operation_ledger_identity_digest CHECK (identity_digest = sha256(convert_to(
        caller_fingerprint || '|' || full_method_name || '|' || encode(idempotency_key_hash, 'hex'),
        'UTF8'))),
    {rules},
    {sized_rules})";

/// The lean table, for MariaDB/MySQL: texts compared byte for byte as before, digests in
/// `VARBINARY(32)` checked to be 32 bytes (`BINARY(32)` would pad a short value silently).
const MYSQL_LEAN_TABLE: &str = "CREATE TABLE {table} (
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    identity_digest      VARBINARY(32) NOT NULL,
    caller_fingerprint   VARCHAR(128)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    full_method_name     VARCHAR(512)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idempotency_key_hash VARBINARY(32) NOT NULL,
    request_fingerprint  VARBINARY(32) NOT NULL,
    state                VARCHAR(16)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome_reference    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    failure_message      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    failure_details      BLOB,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    CONSTRAINT ck_grpc_operation_ledger_identity_digest CHECK (identity_digest = UNHEX(SHA2(
        CONCAT(CAST(caller_fingerprint AS BINARY), '|', CAST(full_method_name AS BINARY), '|',
               CAST(LOWER(HEX(idempotency_key_hash)) AS BINARY)), 256))),
    {rules},
    {sized_rules}
    ) ENGINE=InnoDB";

/// The lean table, for SQLite: one B-tree clustered on the digest (`WITHOUT ROWID`). A new table
/// can carry every rule as a CHECK, where the second migration needed triggers; the types are
/// checked too, since SQLite would store a text where a blob belongs.
const SQLITE_LEAN_TABLE: &str = "CREATE TABLE {table} (
    identity_digest      BLOB          NOT NULL
        CHECK (typeof(identity_digest) = 'blob' AND length(identity_digest) = 32),
    caller_fingerprint   VARCHAR(128)  NOT NULL,
    full_method_name     VARCHAR(512)  NOT NULL,
    idempotency_key_hash BLOB          NOT NULL
        CHECK (typeof(idempotency_key_hash) = 'blob' AND length(idempotency_key_hash) = 32),
    request_fingerprint  BLOB          NOT NULL
        CHECK (typeof(request_fingerprint) = 'blob' AND length(request_fingerprint) = 32),
    state                VARCHAR(16)   NOT NULL,
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    outcome_reference    VARCHAR(1024),
    failure_message      VARCHAR(1024),
    failure_details      BLOB,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    {rules},
    CONSTRAINT ck_grpc_operation_ledger_replayable CHECK ((
        (state = 'FAILED_TERMINAL' AND failure_code IS NULL)
        OR outcome_reference = ''
        OR length(CAST(outcome_reference AS BLOB)) > 1024
        OR instr(outcome_reference, char(0)) > 0
        OR length(CAST(failure_message AS BLOB)) > 1024
        OR instr(failure_message, char(0)) > 0
        OR length(failure_details) > 8192) IS NOT TRUE)
    ) WITHOUT ROWID";

/// The rules PostgreSQL and MariaDB state with `octet_length`: the digests' sizes, and what a
/// record must hold to be replayed (SQLite's table states them in its own functions).
const SIZED_RULES: &str = "CONSTRAINT ck_grpc_operation_ledger_digest_sizes
        CHECK (octet_length(idempotency_key_hash) = 32 AND octet_length(request_fingerprint) = 32),
    CONSTRAINT ck_grpc_operation_ledger_failure_details_size
        CHECK (failure_details IS NULL OR octet_length(failure_details) <= 8192),
    CONSTRAINT ck_grpc_operation_ledger_outcome_replayable
        CHECK (outcome_reference IS NULL
               OR (outcome_reference <> '' AND octet_length(outcome_reference) <= 1024)),
    CONSTRAINT ck_grpc_operation_ledger_failure_message_replayable
        CHECK (failure_message IS NULL OR octet_length(failure_message) <= 1024)";

/// The row rules every shape has had: states, what each state must carry, versions from 1.
const ROW_RULES: &str = "CONSTRAINT ck_grpc_operation_ledger_state
        CHECK (state IN ('IN_PROGRESS', 'COMMITTED', 'FAILED_TERMINAL')),
    CONSTRAINT ck_grpc_operation_ledger_committed_has_outcome
        CHECK (state <> 'COMMITTED' OR outcome_reference IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_terminal_has_completion
        CHECK (state = 'IN_PROGRESS' OR completed_at IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_failed_has_failure
        CHECK (state <> 'FAILED_TERMINAL'
               OR (failure_code IS NOT NULL AND failure_code BETWEEN 1 AND 16
                   AND failure_message IS NOT NULL)),
    CONSTRAINT ck_grpc_operation_ledger_version_positive
        CHECK (version >= 1)";

/// The columns both shapes have, copied as they are.
pub(super) const SHARED_COLUMNS: &str = "caller_fingerprint, full_method_name, state, version, claimed_at, \
     lease_expires_at, completed_at, outcome_reference, failure_code, failure_message, \
     failure_details";

/// The lean table's DDL for `backend`, named `table`.
pub(super) fn lean_table(backend: DbBackend, table: &str) -> Result<String, DbErr> {
    let template = match backend {
        DbBackend::Postgres => POSTGRES_LEAN_TABLE,
        DbBackend::MySql => MYSQL_LEAN_TABLE,
        DbBackend::Sqlite => SQLITE_LEAN_TABLE,
        other => return Err(unsupported(other)),
    };
    Ok(template
        .replace("{table}", table)
        .replace("{rules}", ROW_RULES)
        .replace("{sized_rules}", SIZED_RULES))
}

pub(super) fn unsupported(backend: DbBackend) -> DbErr {
    DbErr::Migration(format!(
        "the operation ledger supports PostgreSQL, SQLite and MariaDB/MySQL, not {backend:?}"
    ))
}

/// Runs `sql` on the migration's connection.
pub(super) async fn run(db: &SchemaManagerConnection<'_>, sql: &str) -> Result<(), DbErr> {
    db.execute_unprepared(sql).await.map(|_| ())
}

/// One number a query answers.
pub(super) async fn count(db: &SchemaManagerConnection<'_>, sql: &str) -> Result<i64, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| DbErr::Migration(format!("no answer to {sql}")))?;
    row.try_get_by_index::<i64>(0)
        .map_err(|e| DbErr::Migration(e.to_string()))
}

/// Whether `table` exists, and whether it has the lean shape's `identity_digest`.
pub(super) async fn shape_of(
    db: &SchemaManagerConnection<'_>,
    table: &str,
) -> Result<Shape, DbErr> {
    let (tables, digest) = match db.get_database_backend() {
        DbBackend::Postgres => (
            format!(
                "SELECT COUNT(*)::BIGINT FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = '{table}'"
            ),
            format!(
                "SELECT COUNT(*)::BIGINT FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}' \
                 AND column_name = 'identity_digest'"
            ),
        ),
        DbBackend::MySql => (
            format!(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
            format!(
                "SELECT COUNT(*) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = '{table}' \
                 AND column_name = 'identity_digest'"
            ),
        ),
        _ => (
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'"),
            format!(
                "SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = 'identity_digest'"
            ),
        ),
    };
    Ok(
        match (count(db, &tables).await?, count(db, &digest).await?) {
            (0, _) => Shape::Absent,
            (_, 0) => Shape::Previous,
            _ => Shape::Lean,
        },
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Absent,
    Previous,
    Lean,
}

/// Stops the migration, changing nothing, when a row of `table` (the previous shape) has a key
/// hash or request fingerprint that is not 64 lower-case hex digits: it has no byte form, and its
/// identity digest would not be the adapter's.
pub(super) async fn refuse_unconvertible_rows(
    db: &SchemaManagerConnection<'_>,
    table: &str,
) -> Result<(), DbErr> {
    let not_hex = |column: &str| match db.get_database_backend() {
        DbBackend::Postgres => format!("{column} !~ '^[0-9a-f]{{64}}$'"),
        DbBackend::MySql => format!("NOT ({column} REGEXP '^[0-9a-f]{{64}}$')"),
        // 64 characters none of which is outside the lower-case hex digits.
        _ => format!("(length({column}) <> 64 OR {column} GLOB '*[^0-9a-f]*')"),
    };
    let bad = count(
        db,
        &format!(
            "SELECT COUNT(*) FROM {table} WHERE {} OR {}",
            not_hex("idempotency_key_hash"),
            not_hex("request_fingerprint")
        ),
    )
    .await?;
    if bad > 0 {
        return Err(DbErr::Migration(format!(
            "{bad} ledger rows have a key hash or request fingerprint that is not 64 lower-case \
             hex digits (not written by the adapter); correct or delete them, then migrate again: \
             nothing was changed"
        )));
    }
    Ok(())
}
