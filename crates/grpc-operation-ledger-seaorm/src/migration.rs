//! The ledger's schema, in a migrator of its own.
//!
//! The first two migrations build the table of `docs/adr/0005-ledger-table-shape.md`: the three
//! identity columns as the primary key, hashes as hex text. The third
//! ([`lean_row`](crate::lean_row), `docs/adr/0018-the-lean-ledger-row.md`) rebuilds it, keeping
//! its rows, on a 32-byte digest of the identity with the hashes as bytes. Times are
//! milliseconds since the Unix epoch by the database's clock throughout, and an index on
//! `claimed_at` serves `purge` without touching the columns a transition changes.

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
    vec![
        Box::new(CreateOperationLedger),
        Box::new(RefuseUnreplayableOutcomes),
        Box::new(crate::lean_row::LeanLedgerRow),
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

/// Whether `error` is PostgreSQL's lock timeout (SQLSTATE 55P03): never, in a build without
/// PostgreSQL.
#[cfg(not(feature = "postgres"))]
fn lock_timed_out(_error: &DbErr) -> bool {
    false
}

/// Whether `error` is PostgreSQL's lock timeout (SQLSTATE 55P03).
#[cfg(feature = "postgres")]
fn lock_timed_out(error: &DbErr) -> bool {
    use sea_orm::{RuntimeErr, sqlx};
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = error
    else {
        return false;
    };
    let sqlx::Error::Database(db) = e.as_ref() else {
        return false;
    };
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| pg.code() == "55P03")
}

/// How long a SQLite start keeps trying while other processes hold the file.
pub(crate) const MIGRATION_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether `error` is SQLite's busy or locked file: never, in a build without SQLite.
#[cfg(not(feature = "sqlite"))]
pub(crate) fn sqlite_busy(_error: &DbErr) -> bool {
    false
}

/// Whether `error` is SQLite's busy or locked file (codes 5 and 6, extended codes included).
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_busy(error: &DbErr) -> bool {
    use sea_orm::{RuntimeErr, sqlx};
    let (DbErr::Conn(RuntimeErr::SqlxError(e))
    | DbErr::Exec(RuntimeErr::SqlxError(e))
    | DbErr::Query(RuntimeErr::SqlxError(e))) = error
    else {
        return false;
    };
    let sqlx::Error::Database(db) = e.as_ref() else {
        return false;
    };
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && db
            .code()
            .and_then(|code| code.parse::<u32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

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
fn mysql_created_table(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} ({MYSQL_TABLE_COLUMNS}{TABLE_CONSTRAINTS}) ENGINE=InnoDB"
    )
}

/// The previous shape (the first two migrations' table) on MariaDB/MySQL, built under `table`:
/// the lean-row migration's revert builds it under a name no claim reaches, then renames it into
/// place. Each statement can be run again.
pub(crate) fn mysql_previous_shape(table: &str) -> [String; 3] {
    [
        mysql_created_table(table),
        format!(
            "CREATE INDEX IF NOT EXISTS ix_grpc_operation_ledger_claimed_at ON {table} (claimed_at)"
        ),
        mysql_outcome_checks(table),
    ]
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

/// Keeps what a replayed failure needs and refuses, in the store itself, the rows whose replay
/// would fail: adds `failure_details` (the failed status's binary details, at most 8 KiB), and
/// refuses a failed row without a code (the first migration's CHECK let a NULL code through:
/// `NULL BETWEEN 1 AND 16` is not false), a committed row with an empty outcome reference, and
/// an outcome reference or failure message longer than the 1024 bytes a record may carry
/// (PostgreSQL's `VARCHAR(1024)` counts characters, SQLite none at all). PostgreSQL adds CHECK constraints; SQLite cannot add a
/// constraint to a table, so the same rules are triggers that abort the statement with a
/// constraint error.
pub(crate) struct RefuseUnreplayableOutcomes;

impl MigrationName for RefuseUnreplayableOutcomes {
    fn name(&self) -> &str {
        "m20261203_000002_failure_details_and_replayable_outcomes"
    }
}

/// The new column and CHECKs, for PostgreSQL (`{bytes}` BYTEA) and MariaDB (BLOB); both know
/// `octet_length`. MariaDB commits DDL on its own, so a start that died between this statement
/// and the migration's record must be able to run it again: `{if_not_exists}` there (PostgreSQL's
/// DDL is transactional and has no `ADD CONSTRAINT IF NOT EXISTS`).
const OUTCOME_CHECKS: &str = "ALTER TABLE {table}
    ADD COLUMN {if_not_exists} failure_details {bytes},
    ADD CONSTRAINT {if_not_exists} ck_grpc_operation_ledger_failure_details_size
        CHECK (failure_details IS NULL OR octet_length(failure_details) <= 8192),
    ADD CONSTRAINT {if_not_exists} ck_grpc_operation_ledger_failed_has_code
        CHECK (state <> 'FAILED_TERMINAL' OR failure_code IS NOT NULL),
    ADD CONSTRAINT {if_not_exists} ck_grpc_operation_ledger_outcome_replayable
        CHECK (outcome_reference IS NULL
               OR (outcome_reference <> '' AND octet_length(outcome_reference) <= 1024)),
    ADD CONSTRAINT {if_not_exists} ck_grpc_operation_ledger_failure_message_replayable
        CHECK (failure_message IS NULL OR octet_length(failure_message) <= 1024)";

/// The second migration's column and CHECKs on MariaDB/MySQL, for `table`.
fn mysql_outcome_checks(table: &str) -> String {
    OUTCOME_CHECKS
        .replace("{table}", table)
        .replace("{bytes}", "BLOB")
        .replace("{if_not_exists}", "IF NOT EXISTS")
}

/// The condition under which a SQLite row is refused, for `NEW` of an insert or an update.
const SQLITE_UNREPLAYABLE: &str = "(NEW.state = 'FAILED_TERMINAL' AND NEW.failure_code IS NULL)
    OR NEW.outcome_reference = ''
    OR length(CAST(NEW.outcome_reference AS BLOB)) > 1024
    OR instr(NEW.outcome_reference, char(0)) > 0
    OR length(CAST(NEW.failure_message AS BLOB)) > 1024
    OR instr(NEW.failure_message, char(0)) > 0
    OR length(NEW.failure_details) > 8192";

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for RefuseUnreplayableOutcomes {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared(
                    &OUTCOME_CHECKS
                        .replace("{table}", LEDGER_TABLE)
                        .replace("{bytes}", "BYTEA")
                        .replace("{if_not_exists} ", ""),
                )
                .await?;
            }
            DbBackend::MySql => {
                db.execute_unprepared(&mysql_outcome_checks(LEDGER_TABLE))
                    .await?;
            }
            DbBackend::Sqlite => {
                db.execute_unprepared(&format!(
                    "ALTER TABLE {LEDGER_TABLE} ADD COLUMN failure_details BLOB"
                ))
                .await?;
                for event in ["INSERT", "UPDATE"] {
                    let name = format!(
                        "ck_grpc_operation_ledger_replayable_on_{}",
                        event.to_lowercase()
                    );
                    db.execute_unprepared(&format!(
                        "CREATE TRIGGER IF NOT EXISTS {name} BEFORE {event} ON {LEDGER_TABLE} \
                         WHEN {SQLITE_UNREPLAYABLE} \
                         BEGIN SELECT RAISE(ABORT, 'CHECK constraint failed: {name}'); END"
                    ))
                    .await?;
                }
            }
            other => {
                return Err(DbErr::Migration(format!(
                    "the operation ledger supports PostgreSQL, SQLite and MariaDB/MySQL, not {other:?}"
                )));
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Postgres | DbBackend::MySql => {
                db.execute_unprepared(
                    "ALTER TABLE grpc_operation_ledger \
                     DROP CONSTRAINT IF EXISTS ck_grpc_operation_ledger_failure_details_size, \
                     DROP CONSTRAINT IF EXISTS ck_grpc_operation_ledger_failed_has_code, \
                     DROP CONSTRAINT IF EXISTS ck_grpc_operation_ledger_outcome_replayable, \
                     DROP CONSTRAINT IF EXISTS ck_grpc_operation_ledger_failure_message_replayable, \
                     DROP COLUMN IF EXISTS failure_details",
                )
                .await?;
            }
            _ => {
                for event in ["insert", "update"] {
                    db.execute_unprepared(&format!(
                        "DROP TRIGGER IF EXISTS ck_grpc_operation_ledger_replayable_on_{event}"
                    ))
                    .await?;
                }
                db.execute_unprepared(&format!(
                    "ALTER TABLE {LEDGER_TABLE} DROP COLUMN failure_details"
                ))
                .await?;
            }
        }
        Ok(())
    }
}
