//! The second migration: the rows whose replay would fail, refused by the store itself.

use sea_orm::DbBackend;
use sea_orm_migration::prelude::*;

use super::first_table::{LEDGER_TABLE, mysql_created_table};

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
