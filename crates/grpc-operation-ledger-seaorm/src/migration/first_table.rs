//! The first migration: the table of `docs/adr/0005-ledger-table-shape.md`, the three identity
//! columns as its primary key and the hashes as hex text.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

/// The ledger table.
pub const LEDGER_TABLE: &str = "grpc_operation_ledger";

/// The migration that creates the ledger's table.
pub(crate) struct CreateOperationLedger;

impl MigrationName for CreateOperationLedger {
    fn name(&self) -> &str {
        "m20261202_000001_create_grpc_operation_ledger"
    }
}

/// The columns, for PostgreSQL and SQLite.
const TABLE_COLUMNS: &str = "
    caller_fingerprint   VARCHAR(128)  NOT NULL,
    full_method_name     VARCHAR(512)  NOT NULL,
    idempotency_key_hash VARCHAR(64)   NOT NULL,
    request_fingerprint  VARCHAR(64)   NOT NULL,
    state                VARCHAR(16)   NOT NULL,
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    outcome_reference    VARCHAR(1024),
    failure_code         INTEGER,
    failure_message      VARCHAR(1024),";

/// The columns, for MariaDB/MySQL: the identity, fingerprint and state compare byte for byte
/// (`ascii_bin`), never by the server's default case-insensitive collation, under which two
/// callers or keys differing only in case would be one row; texts shown to callers are utf8mb4.
const MYSQL_TABLE_COLUMNS: &str = "
    caller_fingerprint   VARCHAR(128)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    full_method_name     VARCHAR(512)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idempotency_key_hash VARCHAR(64)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    request_fingerprint  VARCHAR(64)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    state                VARCHAR(16)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    outcome_reference    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    failure_code         INTEGER,
    failure_message      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,";

/// Key and constraints shared by every store. The CHECK constraints hold for rows written by
/// anything, including migrations, backfills and support scripts that bypass this crate.
const TABLE_CONSTRAINTS: &str = "
    CONSTRAINT pk_grpc_operation_ledger
        PRIMARY KEY (caller_fingerprint, full_method_name, idempotency_key_hash),
    CONSTRAINT ck_grpc_operation_ledger_state
        CHECK (state IN ('IN_PROGRESS', 'COMMITTED', 'FAILED_TERMINAL')),
    CONSTRAINT ck_grpc_operation_ledger_committed_has_outcome
        CHECK (state <> 'COMMITTED' OR outcome_reference IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_terminal_has_completion
        CHECK (state = 'IN_PROGRESS' OR completed_at IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_failed_has_failure
        CHECK (state <> 'FAILED_TERMINAL'
               OR (failure_code BETWEEN 1 AND 16 AND failure_message IS NOT NULL)),
    CONSTRAINT ck_grpc_operation_ledger_version_positive
        CHECK (version >= 1)
";

const CLAIMED_AT_INDEX: &str = "CREATE INDEX IF NOT EXISTS ix_grpc_operation_ledger_claimed_at \
     ON grpc_operation_ledger (claimed_at)";

/// The first migration's table on MariaDB/MySQL, named `table`. InnoDB clusters the rows on the
/// primary key, the identity.
pub(super) fn mysql_created_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} ({MYSQL_TABLE_COLUMNS}{TABLE_CONSTRAINTS}) ENGINE=InnoDB"
    )
}

// The trait's signatures elide `SchemaManager`'s lifetime; matching them needs the same elision.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for CreateOperationLedger {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        let create_table = match manager.get_database_backend() {
            // Fillfactor leaves room on each page so that a transition, which changes no indexed
            // column, can be a heap-only-tuple update.
            DbBackend::Postgres => {
                format!(
                    "CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({TABLE_COLUMNS}{TABLE_CONSTRAINTS}) \
                     WITH (fillfactor = 80)"
                )
            }
            // WITHOUT ROWID clusters the rows on the identity: one B-tree, not a rowid table
            // plus a unique index.
            DbBackend::Sqlite => {
                format!(
                    "CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({TABLE_COLUMNS}{TABLE_CONSTRAINTS}) \
                     WITHOUT ROWID"
                )
            }
            DbBackend::MySql => mysql_created_table(LEDGER_TABLE),
            other => {
                return Err(DbErr::Migration(format!(
                    "the operation ledger supports PostgreSQL, SQLite and MariaDB/MySQL, not {other:?}"
                )));
            }
        };
        db.execute_unprepared(&create_table).await?;
        db.execute_unprepared(CLAIMED_AT_INDEX).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .get_connection()
            .execute_unprepared(&format!("DROP TABLE IF EXISTS {LEDGER_TABLE}"))
            .await?;
        Ok(())
    }
}
