//! The migration's shape: applied twice harmlessly, kept in its own migrations table, reversible,
//! and every CHECK constraint refuses a bad row written by raw SQL.

mod common;

use common::migrations::{H, applied_migrations, fresh_after_migrations, previous_shape_insert};
use common::{Store, fresh};
use grpc_core_api::GrpcOperationLedger;
use grpc_operation_ledger_seaorm::{
    LEDGER_TABLE, LedgerMigrator, MIGRATIONS_TABLE, SeaOrmOperationLedger, ledger_migrations,
    migrate,
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes` as a literal of `backend`'s SQL.
fn bytes_literal(backend: DbBackend, bytes: &[u8]) -> String {
    match backend {
        DbBackend::Postgres => format!("decode('{}', 'hex')", hex(bytes)),
        DbBackend::MySql => format!("UNHEX('{}')", hex(bytes)),
        _ => format!("X'{}'", hex(bytes)),
    }
}

/// The parts of a raw row of the lean shape that a case may spoil.
struct RawIdentity {
    digest: String,
    key_hash: String,
    request: String,
}

impl RawIdentity {
    /// A row of caller `c`, method `/p.S/M`, a key hash ending in `suffix`, with its own digest.
    fn of(backend: DbBackend, suffix: &str) -> Self {
        let key_hash = format!("{}{suffix}", &H[..64 - suffix.len()]);
        let identity = grpc_core_api::GrpcOperationIdentity::new(
            grpc_core_api::CallerFingerprint::parse("c").unwrap(),
            grpc_core_api::GrpcMethod::parse("/p.S/M").unwrap(),
            grpc_core_api::IdempotencyKeyHash::from_hex(&key_hash).unwrap(),
        );
        let bytes = |text: &str| bytes_literal(backend, &hex_bytes(text));
        Self {
            digest: bytes_literal(backend, &identity.storage_digest()),
            key_hash: bytes(&key_hash),
            request: bytes(H),
        }
    }
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// A row of the lean shape, as raw SQL.
fn insert_raw(
    row: &RawIdentity,
    state: &str,
    version: i64,
    completed: &str,
    outcome: &str,
    code: &str,
) -> String {
    format!(
        "INSERT INTO grpc_operation_ledger (identity_digest, caller_fingerprint, \
         full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at, \
         lease_expires_at, completed_at, outcome_reference, failure_code, failure_message) VALUES \
         ({}, 'c', '/p.S/M', {}, {}, '{state}', {version}, 1, 2, {completed}, {outcome}, {code}, \
         {msg})",
        row.digest,
        row.key_hash,
        row.request,
        msg = if code == "NULL" { "NULL" } else { "'m'" },
    )
}

async fn check_constraints_refuse_bad_rows_written_by_raw_sql(store: Store) {
    let t = fresh(store).await;
    let backend = t.db.get_database_backend();
    let insert =
        |suffix: &str, state: &str, version, completed: &str, outcome: &str, code: &str| {
            insert_raw(
                &RawIdentity::of(backend, suffix),
                state,
                version,
                completed,
                outcome,
                code,
            )
        };
    let spoiled = |spoil: fn(&mut RawIdentity, DbBackend)| {
        let mut row = RawIdentity::of(backend, "30");
        spoil(&mut row, backend);
        insert_raw(&row, "IN_PROGRESS", 1, "NULL", "NULL", "NULL")
    };
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
        (
            "key hash as hex text",
            spoiled(|row, _| row.key_hash = format!("'{H}'")),
        ),
        (
            "request fingerprint of 31 bytes",
            spoiled(|row, backend| row.request = bytes_literal(backend, &[7; 31])),
        ),
    ];
    for (what, sql) in bad {
        let result = t.db.execute_unprepared(&sql).await;
        assert!(result.is_err(), "{what} was accepted on {store:?}");
    }
    // A digest that is not the one of the row's own columns: PostgreSQL and MariaDB check it;
    // SQLite has no SHA-256 in SQL, and its rows are written by the adapter alone.
    let foreign_digest = spoiled(|row, backend| {
        row.digest = RawIdentity::of(backend, "31").digest;
    });
    let result = t.db.execute_unprepared(&foreign_digest).await;
    assert_eq!(
        result.is_err(),
        store != Store::Sqlite,
        "a digest of other columns on {store:?}: {result:?}"
    );
    let count =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM grpc_operation_ledger",
        ))
        .await
        .unwrap()
        .unwrap();
    let accepted_foreign_digest = i64::from(store == Store::Sqlite);
    assert_eq!(
        count.try_get::<i64>("", "n").unwrap(),
        3 + accepted_foreign_digest
    );
}

/// A database created by the first migration, with a row in it, is upgraded in place: the row
/// stays and the new rules hold from then on.
async fn a_database_from_the_first_migration_upgrades_in_place(store: Store) {
    let t = fresh_after_migrations(store, 1).await;
    let backend = t.db.get_database_backend();
    let empty_outcome = insert_raw(
        &RawIdentity::of(backend, "20"),
        "COMMITTED",
        2,
        "3",
        "''",
        "NULL",
    );
    t.db.execute_unprepared(&previous_shape_insert(
        "21",
        "COMMITTED",
        2,
        "3",
        "'payment-1'",
        "NULL",
    ))
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
    // The row is found where the adapter looks for it: under its identity's digest.
    let identity = grpc_core_api::GrpcOperationIdentity::new(
        grpc_core_api::CallerFingerprint::parse("c").unwrap(),
        grpc_core_api::GrpcMethod::parse("/p.S/M").unwrap(),
        grpc_core_api::IdempotencyKeyHash::from_hex(&format!("{}21", &H[..62])).unwrap(),
    );
    let found = SeaOrmOperationLedger::new(&t.db)
        .find(&identity)
        .await
        .expect("a read")
        .expect("the upgraded row");
    assert_eq!(found.request_fingerprint.to_hex(), H);
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

    let t = fresh_after_migrations(Store::Postgres, 1).await;
    // A claim as the previous release writes it: a row of the first migration's columns, in a
    // unit whose lock waits are bounded as the adapter bounds a claim's.
    let claim_row = |key: &str| {
        format!(
            "INSERT INTO grpc_operation_ledger (caller_fingerprint, full_method_name, \
             idempotency_key_hash, request_fingerprint, state, version, claimed_at, \
             lease_expires_at) VALUES ('caller', '/pkg.Svc/Pay', '{key}', '{H}', \
             'IN_PROGRESS', 1, 0, 60000)"
        )
    };
    let long = t.db.begin().await.unwrap();
    long.execute_unprepared(&claim_row(&format!("{:064x}", u64::MAX)))
        .await
        .unwrap();

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
                            claim_row(&format!("{:064x}", ((task as u64) << 32) | answered as u64))
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
