//! The migration's shape: applied twice harmlessly, kept in its own migrations table, reversible,
//! and every CHECK constraint refuses a bad row written by raw SQL.

mod common;

use common::{Store, fresh};
use grpc_operation_ledger_seaorm::{
    LEDGER_TABLE, LedgerMigrator, MIGRATIONS_TABLE, ledger_migrations, migrate,
};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::MigratorTrait;

async fn table_exists(db: &impl ConnectionTrait, table: &str) -> bool {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => format!(
            "SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_name = '{table}'"
        ),
        DbBackend::MySql => format!(
            "SELECT COUNT(*) AS n FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = '{table}'"
        ),
        _ => format!(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = '{table}'"
        ),
    };
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap() == 1
}

async fn migrations_apply_twice_harmlessly_and_revert(store: Store) {
    let t = fresh(store).await;
    assert!(table_exists(&t.db, LEDGER_TABLE).await);
    assert!(table_exists(&t.db, MIGRATIONS_TABLE).await);
    assert!(
        !table_exists(&t.db, "seaql_migrations").await,
        "the ledger keeps its own record"
    );
    LedgerMigrator::up(&t.db, None)
        .await
        .expect("second up is harmless");
    assert_eq!(applied_migrations(&t.db).await, ledger_migrations().len());
    LedgerMigrator::down(&t.db, None).await.expect("down");
    assert!(!table_exists(&t.db, LEDGER_TABLE).await);
    LedgerMigrator::up(&t.db, None).await.expect("up again");
    assert!(table_exists(&t.db, LEDGER_TABLE).await);
}

async fn applied_migrations(db: &sea_orm::DatabaseConnection) -> usize {
    LedgerMigrator::get_applied_migrations(db)
        .await
        .expect("the migrations table is readable")
        .len()
}

const H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn insert(
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

async fn check_constraints_refuse_bad_rows_written_by_raw_sql(store: Store) {
    let t = fresh(store).await;
    let good = [
        insert("01", "IN_PROGRESS", 1, "NULL", "NULL", "NULL"),
        insert("02", "COMMITTED", 2, "3", "'payment-1'", "NULL"),
        insert("03", "FAILED_TERMINAL", 2, "3", "NULL", "9"),
    ];
    for sql in good {
        t.db.execute_unprepared(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let bad = [
        ("unknown state", insert("10", "DONE", 1, "3", "'x'", "NULL")),
        (
            "state stored as an ordinal",
            insert("11", "1", 1, "NULL", "NULL", "NULL"),
        ),
        (
            "committed without outcome",
            insert("12", "COMMITTED", 2, "3", "NULL", "NULL"),
        ),
        (
            "committed without completion time",
            insert("13", "COMMITTED", 2, "NULL", "'x'", "NULL"),
        ),
        (
            "failed without completion time",
            insert("14", "FAILED_TERMINAL", 2, "NULL", "NULL", "9"),
        ),
        (
            "failed without failure",
            insert("15", "FAILED_TERMINAL", 2, "3", "NULL", "NULL"),
        ),
        (
            "failed with code OK",
            insert("16", "FAILED_TERMINAL", 2, "3", "NULL", "0"),
        ),
        (
            "version zero",
            insert("17", "IN_PROGRESS", 0, "NULL", "NULL", "NULL"),
        ),
        (
            "committed with an empty outcome",
            insert("18", "COMMITTED", 2, "3", "''", "NULL"),
        ),
        (
            "outcome longer than 1024 bytes",
            insert(
                "19",
                "COMMITTED",
                2,
                "3",
                &format!("'{}'", "\u{e9}".repeat(600)),
                "NULL",
            ),
        ),
        (
            "duplicate identity",
            insert("01", "IN_PROGRESS", 1, "NULL", "NULL", "NULL"),
        ),
    ];
    for (what, sql) in bad {
        let result = t.db.execute_unprepared(&sql).await;
        assert!(result.is_err(), "{what} was accepted on {store:?}");
    }
    let count =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM grpc_operation_ledger",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(count.try_get::<i64>("", "n").unwrap(), 3);
}

/// A database created by the first migration, with a row in it, is upgraded in place: the row
/// stays and the new rules hold from then on.
async fn a_database_from_the_first_migration_upgrades_in_place(store: Store) {
    let t = fresh(store).await;
    LedgerMigrator::down(&t.db, None).await.expect("down");
    LedgerMigrator::up(&t.db, Some(1))
        .await
        .expect("first migration only");
    let empty_outcome = insert("20", "COMMITTED", 2, "3", "''", "NULL");
    t.db.execute_unprepared(&insert("21", "COMMITTED", 2, "3", "'payment-1'", "NULL"))
        .await
        .expect("a good row under the first migration");
    migrate(&t.db).await.expect("upgrade");
    assert_eq!(applied_migrations(&t.db).await, ledger_migrations().len());
    assert!(
        t.db.execute_unprepared(&empty_outcome).await.is_err(),
        "an empty outcome is refused after the upgrade"
    );
    let row =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT outcome_reference FROM grpc_operation_ledger",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.try_get::<String>("", "outcome_reference").unwrap(),
        "payment-1"
    );
}

on_both_stores!(
    migrations_apply_twice_harmlessly_and_revert,
    check_constraints_refuse_bad_rows_written_by_raw_sql,
    a_database_from_the_first_migration_upgrades_in_place,
);

/// A migration applied to a PostgreSQL ledger in use, behind a unit of work that runs for
/// seconds: the replicas still serving (the previous release, writing the previous schema's rows
/// with the claim's 500 ms lock wait) keep having their claims answered while the migration
/// waits for the table (it steps out of the lock queue at its own bound and asks again), and the
/// migration applies once the long unit ends. Unbounded, the migration's wait for the table's
/// lock would queue every later claim behind it until each failed at its own wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_behind_a_long_unit_never_holds_claims_past_their_wait() {
    use std::time::Duration;

    use sea_orm::TransactionTrait;

    let t = fresh(Store::Postgres).await;
    LedgerMigrator::down(&t.db, None).await.expect("down");
    LedgerMigrator::up(&t.db, Some(1))
        .await
        .expect("first migration only");
    // A claim as the previous release writes it: a row of the first migration's columns, in a
    // unit whose lock waits are bounded as the adapter bounds a claim's.
    let claim_row = |key: &str| {
        format!(
            "INSERT INTO grpc_operation_ledger (caller_fingerprint, full_method_name, \
             idempotency_key_hash, request_fingerprint, state, version, claimed_at, \
             lease_expires_at) VALUES ('caller', '/pkg.Svc/Pay', '{key}', 'request', \
             'IN_PROGRESS', 1, 0, 60000)"
        )
    };
    let long = t.db.begin().await.unwrap();
    long.execute_unprepared(&claim_row("held")).await.unwrap();

    let db = t.db.clone();
    let migration = tokio::spawn(async move { migrate(&db).await });
    let claimers: Vec<_> = (0..4)
        .map(|task| {
            let db = t.db.clone();
            tokio::spawn(async move {
                let mut answered = 0;
                let started = std::time::Instant::now();
                while started.elapsed() < Duration::from_millis(2500) {
                    let unit = db.begin().await.expect("a unit begins");
                    let claim = unit
                        .execute_unprepared(&format!(
                            "SET LOCAL lock_timeout = '500ms'; {}",
                            claim_row(&format!("k-{task}-{answered}"))
                        ))
                        .await;
                    assert!(
                        claim.is_ok(),
                        "claim {answered} of task {task} while the migration waits: {claim:?}"
                    );
                    unit.commit().await.expect("the claim commits");
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let mut answered = 0;
    for claimer in claimers {
        answered += claimer.await.unwrap();
    }
    assert!(
        answered > 4,
        "claims went on while the migration waited ({answered})"
    );
    assert!(
        !migration.is_finished(),
        "the migration waits for the long unit"
    );
    long.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), migration)
        .await
        .expect("the migration applies once the long unit ends")
        .unwrap()
        .expect("the migration succeeds");
    assert_eq!(applied_migrations(&t.db).await, ledger_migrations().len());
}
