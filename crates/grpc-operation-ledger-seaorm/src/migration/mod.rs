//! The ledger's schema, in a migrator of its own.
//!
//! The first two migrations build the table of `docs/adr/0005-ledger-table-shape.md`: the three
//! identity columns as the primary key, hashes as hex text. The third
//! (`lean_row`, `docs/adr/0018-the-lean-ledger-row.md`) rebuilds it, keeping
//! its rows, on a 32-byte digest of the identity with the hashes as bytes. Times are
//! milliseconds since the Unix epoch by the database's clock throughout, and an index on
//! `claimed_at` serves `purge` without touching the columns a transition changes.

mod first_table;
mod lean_copy;
mod lean_row;
mod lean_schema;
mod outcome_rules;

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

use self::first_table::CreateOperationLedger;
pub use self::first_table::LEDGER_TABLE;
use self::lean_row::LeanLedgerRow;
use self::outcome_rules::RefuseUnreplayableOutcomes;
use crate::error::{lock_timed_out, sqlite_busy};

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
    vec![
        Box::new(CreateOperationLedger),
        Box::new(RefuseUnreplayableOutcomes),
        Box::new(LeanLedgerRow),
    ]
}

/// Applies the ledger's migrations so that any number of processes may do it at once: the
/// migrator runs inside one transaction that first takes a lock every migrating process takes
/// (`pg_advisory_xact_lock` on PostgreSQL; the write lock of `BEGIN IMMEDIATE` on SQLite), so the
/// second process waits, then finds the migrations applied. Both stores' DDL is transactional, so a
/// process that dies half-way leaves nothing half-applied.
///
/// On SQLite a start that finds the file busy past its busy timeout (several processes opening a
/// new file at once, each setting WAL mode and migrating) tries again for up to
/// 30 s: migrating is rare and worth waiting for, unlike a claim.
///
/// On PostgreSQL a migration applied to a ledger in use never holds claims up past their wait:
/// it waits at most 200 ms for the table's lock, then steps aside and tries again (for up to
/// 30 s), so a claim queued behind it waits at most that long.
///
/// Behind a transaction pooler it needs nothing more than the pool opened for one
/// ([`connect_postgres`](crate::connect_postgres) with the configuration
/// [`resolve_pooler`](crate::resolve_pooler) gave): the pool says whether it caches statements,
/// and the migration's transaction prepares itself as a unit of work does.
pub async fn migrate(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    let started = std::time::Instant::now();
    loop {
        match migrate_once(db).await {
            Err(error) if sqlite_busy(&error) && started.elapsed() < MIGRATION_PATIENCE => {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            // Behind a long unit of work: step out of the lock queue, let the claims queued
            // behind the migration through, and ask again.
            Err(error) if lock_timed_out(&error) && started.elapsed() < MIGRATION_PATIENCE => {
                tokio::time::sleep(MIGRATION_LOCK_WAIT / 2).await;
            }
            done => return done,
        }
    }
}

/// How long a PostgreSQL migration waits for any lock before it gives up and tries again.
///
/// A schema change needs the table's ACCESS EXCLUSIVE lock, which waits for every unit of work
/// under way; while it waits, every claim that arrives queues behind it. Unbounded, one long
/// unit would stop every claim on a live ledger for as long as it runs (each claim then fails
/// at its own wait bound); bounded, claims wait at most this long behind the migration, well
/// inside a claim's wait, and the migration retries until the table is free.
pub(crate) const MIGRATION_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a SQLite start keeps trying while other processes hold the file.
pub(crate) const MIGRATION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

async fn migrate_once(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    use sea_orm::{SqliteTransactionMode, TransactionOptions};
    let options = TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    // On PostgreSQL every lock the migration takes (the advisory lock included) is waited for
    // at most MIGRATION_LOCK_WAIT; SQLite bounds its BEGIN IMMEDIATE by the busy timeout.
    let lock_wait =
        (db.get_database_backend() == DbBackend::Postgres).then_some(MIGRATION_LOCK_WAIT);
    let txn = crate::units::begin_unit(db, options, lock_wait).await?;
    match txn.get_database_backend() {
        DbBackend::Postgres => {
            txn.execute_unprepared(&format!(
                "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
            ))
            .await?;
        }
        // MariaDB/MySQL commit DDL on their own, so the lock is the session's, released below
        // (and by the session's end if this process dies).
        DbBackend::MySql => {
            let locked = txn
                .query_one_raw(sea_orm::Statement::from_string(
                    DbBackend::MySql,
                    format!(
                        "SELECT GET_LOCK('grpc_operation_ledger_migrations', {}) AS locked",
                        MIGRATION_PATIENCE.as_secs()
                    ),
                ))
                .await?
                .and_then(|row| row.try_get::<Option<i64>>("", "locked").ok().flatten());
            // GET_LOCK answers 0 when it times out, rather than failing.
            if locked != Some(1) {
                return Err(DbErr::Migration(
                    "another process held the ledger's migration lock for too long".to_owned(),
                ));
            }
        }
        _ => {}
    }
    let migrated = LedgerMigrator::up(&txn, None).await;
    if txn.get_database_backend() == DbBackend::MySql {
        let released = txn
            .execute_unprepared("DO RELEASE_LOCK('grpc_operation_ledger_migrations')")
            .await;
        // The migration's own error is the one to report; the session's end frees the lock.
        if migrated.is_ok() {
            released?;
        }
    }
    migrated?;
    txn.commit().await
}

/// The advisory lock key the ledger's migrations serialise on (the bytes of "grpcledg").
const MIGRATION_LOCK_KEY: i64 = 0x6772_7063_6c65_6467;
