//! The third migration: the ledger's rows rebuilt on a 32-byte digest of their identity, with the
//! hashes as bytes (`docs/adr/0018-the-lean-ledger-row.md`).
//!
//! What changes, and why:
//! - **One fixed-size unique key.** The primary key is `identity_digest`, the SHA-256 of
//!   `caller|method|key hash in hex` ([`GrpcOperationIdentity::storage_digest`]), instead of the
//!   three text columns: its index entries are about a quarter the size. The three columns stay, for
//!   reading. PostgreSQL and MariaDB also check, in a CHECK constraint, that every row's digest is
//!   the one of its own columns, so the unique digest is the unique identity there for rows
//!   written by anything; SQLite has no SHA-256 in SQL and cannot.
//! - **Hashes as bytes.** The key hash and the request fingerprint take 32 bytes, not 64 hex
//!   digits.
//! - **Fixed-size columns first** (PostgreSQL), so no padding sits between them.
//! - **No fillfactor below 100.** A transition is heap-only without it (ADR 0017).
//!
//! The migration keeps every row, in both directions. On PostgreSQL and SQLite a step runs in one
//! transaction that holds the table for the copy (a claim waits its own bound behind it, then is
//! answered or refused). MariaDB commits DDL on its own, so there the rows are copied into a table
//! of a third name that is renamed into place, the ledger's name away meanwhile (a claim then
//! fails at once), and a start that died is carried on from where the tables show it stopped. A
//! step finds a table already in its target shape and leaves it alone.
//! A row whose key hash or request fingerprint is not 64 lower-case hex digits (written by hand:
//! the adapter never writes one) stops the migration with its count before anything changes.
//!
//! [`GrpcOperationIdentity::storage_digest`]: grpc_core_api::GrpcOperationIdentity::storage_digest

use sea_orm::{DbBackend, SqliteTransactionMode, TransactionOptions, TransactionTrait};
use sea_orm_migration::prelude::*;

use super::first_table::{CreateOperationLedger, LEDGER_TABLE};
use super::lean_copy::copy_into_lean;
use super::lean_schema::{
    LEAN_TABLE, PREVIOUS_TABLE, SHARED_COLUMNS, Shape, refuse_unconvertible_rows, run, shape_of,
    unsupported,
};
use super::outcome_rules::{RefuseUnreplayableOutcomes, mysql_previous_shape};

/// The migration; see the module's docs.
pub(crate) struct LeanLedgerRow;

impl MigrationName for LeanLedgerRow {
    fn name(&self) -> &str {
        "m20261204_000003_lean_ledger_row"
    }
}

// The trait's signatures elide `SchemaManager`'s lifetime; matching them needs the same elision.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for LeanLedgerRow {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_one_sqlite_connection(manager, |manager| Box::pin(upgrade(manager))).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_one_sqlite_connection(manager, |manager| Box::pin(revert(manager))).await
    }
}

/// Runs `step` on `manager`, on SQLite in a transaction of its own that holds the write lock
/// from its start (`BEGIN IMMEDIATE`, a savepoint inside [`migrate`](crate::migrate)'s). Given a
/// pool rather than a transaction (`LedgerMigrator::up` or `down` on a pool), sea-orm-migration
/// runs a SQLite migration a statement at a time on whichever pooled connection is free: one
/// connection could then still read the schema from before another's rename and recreate
/// nothing where it should, and another writer could come between the steps.
async fn on_one_sqlite_connection<F>(manager: &SchemaManager<'_>, step: F) -> Result<(), DbErr>
where
    F: for<'a> FnOnce(
        &'a SchemaManager<'a>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), DbErr>> + Send + 'a>,
    >,
{
    if manager.get_database_backend() != DbBackend::Sqlite {
        return step(manager).await;
    }
    let options = TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    let unit = manager.get_connection().begin_with_options(options).await?;
    step(&SchemaManager::new(&unit)).await?;
    unit.commit().await
}

/// PostgreSQL: takes the ledger's table for the rest of the migration's transaction (waiting at
/// most the migration's lock wait, after which `migrate` steps aside and asks again) and, unless
/// it already has the shape `done`, moves it aside as `aside`, its primary key's index renamed
/// with it and its `claimed_at` index dropped, so that a new table can take the names. Answers
/// whether it moved it.
async fn set_aside_on_postgres(
    db: &SchemaManagerConnection<'_>,
    done: Shape,
    aside: &str,
) -> Result<bool, DbErr> {
    run(
        db,
        &format!("LOCK TABLE {LEDGER_TABLE} IN ACCESS EXCLUSIVE MODE"),
    )
    .await?;
    if shape_of(db, LEDGER_TABLE).await? == done {
        return Ok(false);
    }
    run(db, &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {aside}")).await?;
    run(
        db,
        &format!("ALTER INDEX pk_grpc_operation_ledger RENAME TO pk_{aside}"),
    )
    .await?;
    run(
        db,
        "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
    )
    .await?;
    Ok(true)
}

async fn upgrade(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    match manager.get_database_backend() {
        DbBackend::Postgres => {
            if !set_aside_on_postgres(db, Shape::Lean, PREVIOUS_TABLE).await? {
                return Ok(());
            }
            // A refusal rolls the whole transaction back, the renames with it.
            refuse_unconvertible_rows(db, PREVIOUS_TABLE).await?;
            copy_into_lean(db, PREVIOUS_TABLE, LEDGER_TABLE).await?;
        }
        DbBackend::Sqlite => {
            // The step's `BEGIN IMMEDIATE` already holds the database's write lock.
            if shape_of(db, LEDGER_TABLE).await? == Shape::Lean {
                return Ok(());
            }
            refuse_unconvertible_rows(db, LEDGER_TABLE).await?;
            for event in ["insert", "update"] {
                run(
                    db,
                    &format!(
                        "DROP TRIGGER IF EXISTS ck_grpc_operation_ledger_replayable_on_{event}"
                    ),
                )
                .await?;
            }
            run(
                db,
                "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
            )
            .await?;
            run(
                db,
                &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {PREVIOUS_TABLE}"),
            )
            .await?;
            copy_into_lean(db, PREVIOUS_TABLE, LEDGER_TABLE).await?;
        }
        // Each step commits on its own, so no claim may find a ledger table while rows are in
        // flight (a resend would be claimed afresh beside its committed row): the ledger's name
        // is away from the first rename to the last, and a claim meanwhile fails at once. A
        // start that died is carried on from where the tables show it stopped.
        DbBackend::MySql => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Previous
                && shape_of(db, PREVIOUS_TABLE).await? == Shape::Absent
            {
                refuse_unconvertible_rows(db, LEDGER_TABLE).await?;
                run(
                    db,
                    &format!("RENAME TABLE {LEDGER_TABLE} TO {PREVIOUS_TABLE}"),
                )
                .await?;
            }
            match (
                shape_of(db, LEDGER_TABLE).await?,
                shape_of(db, PREVIOUS_TABLE).await?,
            ) {
                (Shape::Absent, Shape::Previous) => {
                    // A copy that died part-way is started again from the rows set aside.
                    run(db, &format!("DROP TABLE IF EXISTS {LEAN_TABLE}")).await?;
                    copy_into_lean(db, PREVIOUS_TABLE, LEAN_TABLE).await?;
                    run(db, &format!("RENAME TABLE {LEAN_TABLE} TO {LEDGER_TABLE}")).await?;
                }
                (Shape::Lean, _) => {}
                (ledger, previous) => {
                    return Err(DbErr::Migration(format!(
                        "the ledger's tables are in no state this migration leaves them in \
                         ({LEDGER_TABLE}: {ledger:?}, {PREVIOUS_TABLE}: {previous:?})"
                    )));
                }
            }
            run(db, &format!("DROP TABLE IF EXISTS {PREVIOUS_TABLE}")).await?;
            return Ok(());
        }
        other => return Err(unsupported(other)),
    }
    run(db, &format!("DROP TABLE {PREVIOUS_TABLE}")).await
}

/// Copies the rows back into the previous shape (hashes as hex again); no digest is needed, so
/// every store does it in SQL. A ledger already in the previous shape is left as it is (a revert
/// that committed but was not recorded as reverted). On PostgreSQL and SQLite it runs in one
/// transaction that holds the table, as the upgrade does. MariaDB commits each step on its own,
/// so there the rows are copied into a table of a third name and renamed into place, the
/// ledger's name away meanwhile, and a start that died is carried on from where it stopped.
async fn revert(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    let hex = |column: &str| match backend {
        DbBackend::Postgres => format!("encode({column}, 'hex')"),
        DbBackend::MySql => format!("LOWER(HEX({column}))"),
        _ => format!("lower(hex({column}))"),
    };
    let copy_back = |into: &str| {
        format!(
            "INSERT INTO {into} (idempotency_key_hash, request_fingerprint, {SHARED_COLUMNS}) \
             SELECT {}, {}, {SHARED_COLUMNS} FROM {LEAN_TABLE}",
            hex("idempotency_key_hash"),
            hex("request_fingerprint")
        )
    };
    match backend {
        DbBackend::Postgres => {
            if !set_aside_on_postgres(db, Shape::Previous, LEAN_TABLE).await? {
                return Ok(());
            }
        }
        DbBackend::MySql => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Lean
                && shape_of(db, LEAN_TABLE).await? == Shape::Absent
            {
                run(db, &format!("RENAME TABLE {LEDGER_TABLE} TO {LEAN_TABLE}")).await?;
            }
            match (
                shape_of(db, LEDGER_TABLE).await?,
                shape_of(db, LEAN_TABLE).await?,
            ) {
                (Shape::Absent, Shape::Lean) => {
                    // A copy that died part-way is started again from the rows set aside.
                    run(db, &format!("DROP TABLE IF EXISTS {PREVIOUS_TABLE}")).await?;
                    for statement in mysql_previous_shape(PREVIOUS_TABLE) {
                        run(db, &statement).await?;
                    }
                    run(db, &copy_back(PREVIOUS_TABLE)).await?;
                    run(
                        db,
                        &format!("RENAME TABLE {PREVIOUS_TABLE} TO {LEDGER_TABLE}"),
                    )
                    .await?;
                }
                (Shape::Previous, _) => {}
                (ledger, lean) => {
                    return Err(DbErr::Migration(format!(
                        "the ledger's tables are in no state this migration's revert leaves \
                         them in ({LEDGER_TABLE}: {ledger:?}, {LEAN_TABLE}: {lean:?})"
                    )));
                }
            }
            return run(db, &format!("DROP TABLE IF EXISTS {LEAN_TABLE}")).await;
        }
        _ => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Previous {
                return Ok(());
            }
            run(
                db,
                "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
            )
            .await?;
            run(
                db,
                &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {LEAN_TABLE}"),
            )
            .await?;
        }
    }
    CreateOperationLedger.up(manager).await?;
    RefuseUnreplayableOutcomes.up(manager).await?;
    run(db, &copy_back(LEDGER_TABLE)).await?;
    run(db, &format!("DROP TABLE {LEAN_TABLE}")).await
}
