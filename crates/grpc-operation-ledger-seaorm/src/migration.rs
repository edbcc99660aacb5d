//! The ledger's schema, in a migrator of its own.
//!
//! The table's physical shape is decided in `docs/adr/0005-ledger-table-shape.md`: the three
//! identity columns are the primary key (one index, checked by the database), the storage key is
//! derived rather than stored, times are milliseconds since the Unix epoch by the database's
//! clock, and a second index on `claimed_at` serves `purge` without touching the columns a
//! transition changes, so that on PostgreSQL (fillfactor 80) a transition can be a HOT update.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

/// The ledger table.
pub const LEDGER_TABLE: &str = "grpc_operation_ledger";

/// The table where [`LedgerMigrator`] records which of its migrations ran.
pub const MIGRATIONS_TABLE: &str = "grpc_operation_ledger_migrations";

/// Applies the ledger's migrations, keeping its own record of them.
///
/// ```no_run
/// # async fn demo(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
/// use grpc_operation_ledger_seaorm::LedgerMigrator;
/// use sea_orm_migration::MigratorTrait;
/// LedgerMigrator::up(db, None).await?; // applying twice is harmless
/// # Ok(()) }
/// ```
pub struct LedgerMigrator;

#[async_trait::async_trait]
impl MigratorTrait for LedgerMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        ledger_migrations()
    }

    fn migration_table_name() -> DynIden {
        Alias::new(MIGRATIONS_TABLE).into_iden()
    }
}

/// The ledger's migrations, for a deployment that composes them into its own migrator.
pub fn ledger_migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![Box::new(CreateOperationLedger)]
}

struct CreateOperationLedger;

impl MigrationName for CreateOperationLedger {
    fn name(&self) -> &str {
        "m20261202_000001_create_grpc_operation_ledger"
    }
}

/// Columns and constraints shared by both stores. The CHECK constraints hold for rows written by
/// anything, including migrations, backfills and support scripts that bypass this crate.
const TABLE_BODY: &str = "
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
    failure_message      VARCHAR(1024),
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
                    "CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({TABLE_BODY}) WITH (fillfactor = 80)"
                )
            }
            // WITHOUT ROWID clusters the rows on the identity: one B-tree, not a rowid table
            // plus a unique index.
            DbBackend::Sqlite => {
                format!("CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({TABLE_BODY}) WITHOUT ROWID")
            }
            other => {
                return Err(DbErr::Migration(format!(
                    "the operation ledger supports PostgreSQL and SQLite, not {other:?}"
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
