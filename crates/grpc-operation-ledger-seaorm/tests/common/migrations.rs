//! What the migration tests share: a store left after the first migrations, the record of those
//! applied, and a row of the previous shape written as raw SQL.

use grpc_operation_ledger_seaorm::LedgerMigrator;
use sea_orm_migration::MigratorTrait;

use super::{Store, fresh};

/// A fresh store with only the first `migrations` of the ledger's migrations applied.
pub async fn fresh_after_migrations(store: Store, migrations: u32) -> super::TestDb {
    let t = fresh(store).await;
    LedgerMigrator::down(&t.db, None).await.expect("down");
    LedgerMigrator::up(&t.db, Some(migrations))
        .await
        .expect("the earlier migrations");
    t
}

pub async fn applied_migrations(db: &sea_orm::DatabaseConnection) -> usize {
    LedgerMigrator::get_applied_migrations(db)
        .await
        .expect("the migrations table is readable")
        .len()
}

pub const H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// A row of the previous shape (the first two migrations: hashes as hex text), as raw SQL.
pub fn previous_shape_insert(
    key_hash_suffix: &str,
    state: &str,
    version: i64,
    completed: &str,
    outcome: &str,
    code: &str,
) -> String {
    format!(
        "INSERT INTO grpc_operation_ledger (caller_fingerprint, full_method_name, \
         idempotency_key_hash, request_fingerprint, state, version, claimed_at, lease_expires_at, \
         completed_at, outcome_reference, failure_code, failure_message) VALUES \
         ('c', '/p.S/M', '{}{key_hash_suffix}', '{H}', '{state}', {version}, 1, 2, {completed}, \
         {outcome}, {code}, {msg})",
        &H[..64 - key_hash_suffix.len()],
        msg = if code == "NULL" { "NULL" } else { "'m'" },
    )
}
