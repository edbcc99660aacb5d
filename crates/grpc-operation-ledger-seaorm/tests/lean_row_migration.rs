//! The third migration, the lean row, on every store: it keeps every row of a ledger in use while
//! replicas of the previous release and of this one go on claiming, refuses rows it cannot
//! convert with nothing changed, and reverts and upgrades again keeping every row.

mod common;

use common::migrations::{applied_migrations, fresh_after_migrations, previous_shape_insert};
use common::{Store, fresh};
use grpc_core_api::GrpcOperationLedger;
use grpc_operation_ledger_seaorm::{
    LedgerMigrator, MIGRATIONS_TABLE, SeaOrmOperationLedger, ledger_migrations, migrate,
};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::MigratorTrait;

/// The previous shape's row of `identity` at version 2, committed with outcome `outcome`, or in
/// progress with a lease that ran out in 1970 when `outcome` is `None`: what the previous
/// release wrote.
fn previous_release_row(
    identity: &grpc_core_api::GrpcOperationIdentity,
    request: &grpc_core_api::RequestFingerprint,
    outcome: Option<&str>,
) -> String {
    let (state, completed, outcome) = match outcome {
        Some(outcome) => ("COMMITTED", "3", format!("'{outcome}'")),
        None => ("IN_PROGRESS", "NULL", "NULL".to_owned()),
    };
    format!(
        "('{}', '{}', '{}', '{}', '{state}', 2, 1, 60000, {completed}, {outcome})",
        identity.caller().as_str(),
        identity.method().as_str(),
        identity.key_hash().to_hex(),
        request.to_hex(),
    )
}

const PREVIOUS_RELEASE_INSERT: &str = "INSERT INTO grpc_operation_ledger (caller_fingerprint, \
     full_method_name, idempotency_key_hash, request_fingerprint, state, version, claimed_at, \
     lease_expires_at, completed_at, outcome_reference) VALUES ";

/// The third migration (the lean row) on a ledger of the previous shape that holds 10,000 rows
/// and is in use while it runs:
/// - replicas of the previous release go on claiming in the previous shape, and replicas of this
///   one claim through the adapter; every claim of either is answered or refused within a bound
///   (no claim hangs behind the migration), and every claim that was answered `Claimed` (or whose
///   previous-shape insert committed) is in the lean table afterwards;
/// - every row written before it is kept, under its identity's digest: a resend is replayed with
///   its outcome, another request under its key is refused, an operation in progress whose lease
///   ran out is taken over from its stored version.
async fn the_lean_row_migration_keeps_every_row_of_a_ledger_in_use(store: Store) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use grpc_core_api::{ClaimOutcome, LedgerError, OperationState, RequestFingerprint};

    let t = fresh_after_migrations(store, 2).await;
    let request = |n: usize| RequestFingerprint::from_bytes([(n % 251) as u8; 32]);
    let seeded = |n: usize| common::identity("tenant-seeded", "/p.v1.S/Pay", &format!("seed-{n}"));
    const SEEDED: usize = 10_000;
    for batch in (0..SEEDED).collect::<Vec<_>>().chunks(500) {
        let rows = batch
            .iter()
            .map(|&n| {
                let outcome = format!("p-{n}");
                previous_release_row(&seeded(n), &request(n), (n % 10 != 0).then_some(&*outcome))
            })
            .collect::<Vec<_>>()
            .join(", ");
        t.db.execute_unprepared(&format!("{PREVIOUS_RELEASE_INSERT}{rows}"))
            .await
            .expect("a previous-shape row");
    }

    // Longer than any claim may take: a claim wait (500 ms) and a margin for a loaded machine.
    const ANSWER_BOUND: Duration = Duration::from_secs(10);
    // Claims after the migration each task makes before it stops (the previous release's all
    // fail: its statements name columns the lean row no longer has).
    const CLAIMS_AFTER: usize = 3;
    let migrated = Arc::new(AtomicBool::new(false));
    let committed_before = Arc::new(AtomicUsize::new(0));
    let previous_release_claims = (0..2)
        .map(|task| {
            let (db, migrated, committed_before) =
                (t.db.clone(), migrated.clone(), committed_before.clone());
            tokio::spawn(async move {
                let mut committed = Vec::new();
                let (mut refused, mut tried_after) = (0, 0);
                for n in 0.. {
                    if migrated.load(Ordering::SeqCst) {
                        if tried_after == CLAIMS_AFTER {
                            break;
                        }
                        tried_after += 1;
                    }
                    let identity =
                        common::identity("tenant-previous", "/p.v1.S/Pay", &format!("{task}-{n}"));
                    let row = previous_release_row(&identity, &request(n), Some("p"));
                    let sql = match db.get_database_backend() {
                        DbBackend::Postgres => format!(
                            "SET LOCAL lock_timeout = '500ms'; {PREVIOUS_RELEASE_INSERT}{row}"
                        ),
                        DbBackend::MySql => format!(
                            "SET STATEMENT max_statement_time=0.5 FOR {PREVIOUS_RELEASE_INSERT}{row}"
                        ),
                        _ => format!("{PREVIOUS_RELEASE_INSERT}{row}"),
                    };
                    let unit_of_work = async {
                        use sea_orm::TransactionTrait;
                        let unit = db.begin().await?;
                        unit.execute_unprepared(&sql).await?;
                        unit.commit().await
                    };
                    let result = tokio::time::timeout(ANSWER_BOUND, unit_of_work)
                        .await
                        .expect("a previous-release claim is answered or refused in bounded time");
                    match result {
                        Ok(()) => {
                            committed_before.fetch_add(1, Ordering::SeqCst);
                            committed.push(identity);
                        }
                        Err(_) => refused += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (committed, refused)
            })
        })
        .collect::<Vec<_>>();
    let this_release_claims = (0..2)
        .map(|task| {
            let (db, migrated) = (t.db.clone(), migrated.clone());
            tokio::spawn(async move {
                let ledger =
                    SeaOrmOperationLedger::new(&db).with_claim_wait(Duration::from_millis(500));
                let (mut claimed, mut refused, mut claimed_after, mut tried_after) =
                    (Vec::new(), 0, 0, 0);
                for n in 0.. {
                    let after = migrated.load(Ordering::SeqCst);
                    // Bounded: a task whose claims all fail after the migration stops too, and
                    // the assertion below names it.
                    if claimed_after == CLAIMS_AFTER || tried_after == 100 * CLAIMS_AFTER {
                        break;
                    }
                    tried_after += usize::from(after);
                    let identity =
                        common::identity("tenant-current", "/p.v1.S/Pay", &format!("{task}-{n}"));
                    let result = tokio::time::timeout(
                        ANSWER_BOUND,
                        ledger.claim(&identity, &request(n), common::lease(30_000)),
                    )
                    .await
                    .expect("a claim is answered or refused in bounded time");
                    match result {
                        Ok(ClaimOutcome::Claimed { .. }) => {
                            claimed_after += usize::from(after);
                            claimed.push(identity);
                        }
                        Ok(other) => panic!("a fresh key answered {other:?}"),
                        Err(_) => refused += 1,
                    }
                    // A resend of an operation committed before the migration is replayed or
                    // refused, whenever it arrives: never claimed afresh.
                    let resent = (task * 5003 + n * 13) % SEEDED;
                    if !resent.is_multiple_of(10) {
                        let answer = tokio::time::timeout(
                            ANSWER_BOUND,
                            ledger.claim(&seeded(resent), &request(resent), common::lease(30_000)),
                        )
                        .await
                        .expect("a resend is answered or refused in bounded time");
                        assert!(
                            !matches!(answer, Ok(ClaimOutcome::Claimed { .. })),
                            "seeded operation {resent}, committed, was claimed afresh"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (claimed, refused, claimed_after)
            })
        })
        .collect::<Vec<_>>();

    // The migration starts once the previous release has committed claims of its own.
    let waiting = Instant::now();
    while committed_before.load(Ordering::SeqCst) < 2 {
        assert!(
            waiting.elapsed() < ANSWER_BOUND,
            "the previous release committed no claim before the migration"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    migrate(&t.db).await.expect("the lean-row migration");
    migrated.store(true, Ordering::SeqCst);
    assert_eq!(applied_migrations(&t.db).await, ledger_migrations().len());

    let ledger = SeaOrmOperationLedger::new(&t.db);
    let mut kept = 0;
    for task in previous_release_claims {
        let (committed, refused) = task.await.unwrap();
        eprintln!(
            "{store:?}: previous release: {} committed, {refused} refused",
            committed.len()
        );
        for identity in committed {
            let found = ledger.find(&identity).await.unwrap();
            assert!(
                found.is_some(),
                "a previous-release claim that committed is kept"
            );
            kept += 1;
        }
    }
    let mut claimed_after = 0;
    for task in this_release_claims {
        let (claimed, refused, after) = task.await.unwrap();
        eprintln!(
            "{store:?}: this release: {} claimed ({after} after the migration), {refused} refused",
            claimed.len()
        );
        claimed_after += after;
        for identity in claimed {
            let found = ledger
                .find(&identity)
                .await
                .unwrap()
                .expect("an answered claim is kept");
            assert_eq!(found.state(), OperationState::InProgress);
        }
    }
    assert!(
        kept > 0,
        "the previous release claimed before the migration"
    );
    assert_eq!(
        claimed_after,
        2 * CLAIMS_AFTER,
        "this release's claims are answered once the migration is done"
    );

    for n in (0..SEEDED).step_by(97) {
        let answer = ledger
            .claim(&seeded(n), &request(n), common::lease(30_000))
            .await
            .unwrap();
        match (n % 10 == 0, answer) {
            (false, ClaimOutcome::Completed(record)) => {
                assert_eq!(
                    record.outcome_reference().map(|o| o.as_str().to_owned()),
                    Some(format!("p-{n}"))
                );
            }
            // Its lease (to 1970) has run out: the resend takes it over from its stored version.
            (
                true,
                ClaimOutcome::Claimed {
                    version,
                    took_over: true,
                },
            ) => {
                assert_eq!(version.to_stored(), 3);
            }
            (_, other) => panic!("seeded row {n} answered {other:?}"),
        }
        assert!(matches!(
            ledger
                .claim(&seeded(n), &request(n + 1), common::lease(30_000))
                .await,
            Err(LedgerError::KeyReusedWithDifferentRequest)
        ));
    }
    let rows =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM grpc_operation_ledger WHERE caller_fingerprint = 'tenant-seeded'",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows.try_get::<i64>("", "n").unwrap(), SEEDED as i64);
}

/// A row the adapter never writes (a key hash that is not hex) stops the lean-row migration with
/// its count, and nothing changes: the previous shape and its rows stay.
async fn the_lean_row_migration_refuses_rows_it_cannot_convert(store: Store) {
    let t = fresh_after_migrations(store, 2).await;
    t.db.execute_unprepared(&previous_shape_insert(
        "01",
        "COMMITTED",
        2,
        "3",
        "'p'",
        "NULL",
    ))
    .await
    .unwrap();
    t.db.execute_unprepared(&previous_shape_insert(
        "XY",
        "COMMITTED",
        2,
        "3",
        "'p'",
        "NULL",
    ))
    .await
    .unwrap();
    let refused = migrate(&t.db)
        .await
        .expect_err("a row that has no byte form");
    assert!(
        refused
            .to_string()
            .contains("1 ledger rows have a key hash"),
        "{refused}"
    );
    assert_eq!(applied_migrations(&t.db).await, 2);
    let rows =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT COUNT(*) AS n FROM grpc_operation_ledger",
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows.try_get::<i64>("", "n").unwrap(), 2);
}

/// Records the lean-row migration as applied (`applied`) or not, without running it: what a
/// process that died between a step's commit and sea-orm-migration's record leaves behind.
async fn record_lean_row_step(db: &sea_orm::DatabaseConnection, applied: bool) {
    const STEP: &str = "m20261204_000003_lean_ledger_row";
    let sql = if applied {
        format!("INSERT INTO {MIGRATIONS_TABLE} (version, applied_at) VALUES ('{STEP}', 0)")
    } else {
        format!("DELETE FROM {MIGRATIONS_TABLE} WHERE version = '{STEP}'")
    };
    db.execute_unprepared(&sql)
        .await
        .expect("the migration's record");
}

/// The lean row's revert keeps every row (hashes as hex again), the upgrade after it brings them
/// back under their digests, and either step run again over a table already in its shape (it
/// committed, its record did not) changes nothing.
async fn the_lean_row_reverts_and_upgrades_again_keeping_every_row(store: Store) {
    use grpc_core_api::{ClaimOutcome, OperationState, OutcomeReference, RequestFingerprint};

    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let request = |n: usize| RequestFingerprint::from_bytes([n as u8; 32]);
    let operation = |n: usize| common::identity("tenant-revert", "/p.v1.S/Pay", &format!("r-{n}"));
    const ROWS: usize = 40;
    for n in 0..ROWS {
        let ClaimOutcome::Claimed { version, .. } = ledger
            .claim(&operation(n), &request(n), common::lease(60_000))
            .await
            .unwrap()
        else {
            panic!("a fresh key was not claimed");
        };
        // The last stays in progress, under a live lease.
        if n + 1 < ROWS {
            ledger
                .mark_committed(
                    &operation(n),
                    version,
                    &OutcomeReference::parse(&format!("p-{n}")).unwrap(),
                )
                .await
                .unwrap();
        }
    }
    let count_rows = |sql: String| {
        let db = t.db.clone();
        async move {
            db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
                .await
                .unwrap()
                .unwrap()
                .try_get::<i64>("", "n")
                .unwrap()
        }
    };
    let in_previous_shape = || {
        let hashes = (0..ROWS)
            .map(|n| format!("'{}'", operation(n).key_hash().to_hex()))
            .collect::<Vec<_>>()
            .join(", ");
        count_rows(format!(
            "SELECT COUNT(*) AS n FROM grpc_operation_ledger WHERE caller_fingerprint = \
             'tenant-revert' AND idempotency_key_hash IN ({hashes}) AND request_fingerprint IN \
             ({})",
            (0..ROWS)
                .map(|n| format!("'{}'", request(n).to_hex()))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };

    LedgerMigrator::down(&t.db, Some(1)).await.expect("revert");
    assert_eq!(
        in_previous_shape().await,
        ROWS as i64,
        "every row back in hex"
    );
    record_lean_row_step(&t.db, true).await;
    LedgerMigrator::down(&t.db, Some(1))
        .await
        .expect("a revert over the previous shape");
    assert_eq!(
        in_previous_shape().await,
        ROWS as i64,
        "a second revert changes nothing"
    );

    migrate(&t.db).await.expect("upgrade again");
    record_lean_row_step(&t.db, false).await;
    migrate(&t.db)
        .await
        .expect("an upgrade over the lean shape");
    assert_eq!(applied_migrations(&t.db).await, ledger_migrations().len());
    assert_eq!(
        count_rows("SELECT COUNT(*) AS n FROM grpc_operation_ledger".into()).await,
        ROWS as i64
    );
    for n in 0..ROWS {
        let found = ledger.find(&operation(n)).await.unwrap().expect("kept");
        assert_eq!(found.request_fingerprint, request(n));
        match found.state() {
            OperationState::Committed => assert_eq!(
                found.outcome_reference().map(|o| o.as_str().to_owned()),
                Some(format!("p-{n}"))
            ),
            state => assert_eq!((n + 1, state), (ROWS, OperationState::InProgress)),
        }
    }
    assert!(matches!(
        ledger
            .claim(&operation(0), &request(0), common::lease(60_000))
            .await
            .unwrap(),
        ClaimOutcome::Completed(_)
    ));
}

on_both_stores!(
    the_lean_row_reverts_and_upgrades_again_keeping_every_row,
    the_lean_row_migration_keeps_every_row_of_a_ledger_in_use,
    the_lean_row_migration_refuses_rows_it_cannot_convert,
);
