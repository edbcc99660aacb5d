//! The adapter's behaviour on real PostgreSQL and SQLite, with the Java module's three defects
//! (review section 17) each pinned by a test.

mod common;

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::{Store, fresh, identity, lease};
use grpc_core_api::*;
use grpc_operation_ledger_seaorm::SeaOrmOperationLedger;
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, ExecResult, QueryResult, Statement,
    TransactionTrait,
};

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

fn fingerprint(body: &str) -> RequestFingerprint {
    RequestFingerprint::of(body.as_bytes())
}

fn outcome(reference: &str) -> OutcomeReference {
    OutcomeReference::parse(reference).unwrap()
}

fn claimed(version: u64, took_over: bool) -> ClaimOutcome {
    let mut v = Version::FIRST;
    for _ in 1..version {
        v = v.next();
    }
    ClaimOutcome::Claimed {
        version: v,
        took_over,
    }
}

async fn create_business_table(db: &DatabaseConnection) {
    db.execute_unprepared("CREATE TABLE payments (payment_key VARCHAR(64) PRIMARY KEY)")
        .await
        .unwrap();
}

async fn business_write(db: &impl ConnectionTrait, key: &str) -> Result<ExecResult, DbErr> {
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => "INSERT INTO payments (payment_key) VALUES ($1)",
        _ => "INSERT INTO payments (payment_key) VALUES (?)",
    };
    db.execute_raw(Statement::from_sql_and_values(
        db.get_database_backend(),
        sql,
        [key.into()],
    ))
    .await
}

async fn count(db: &impl ConnectionTrait, sql: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

/// Review 17.1: a second claim of a committed identity replays it and rewrites nothing.
async fn claim_after_commit_replays_with_outcome_and_version_intact(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let id = identity("tenant-a", CREATE, "order-1");
    let first = ledger
        .claim(&id, &fingerprint("pay 10"), lease(30_000))
        .await
        .unwrap();
    assert_eq!(first, claimed(1, false));
    let v2 = ledger
        .mark_committed(&id, Version::FIRST, &outcome("payment-1"))
        .await
        .unwrap();
    assert_eq!(v2.get(), 2);
    let before = ledger.find(&id).await.unwrap().unwrap();

    let again = ledger
        .claim(&id, &fingerprint("pay 10"), lease(30_000))
        .await
        .unwrap();
    let ClaimOutcome::Completed(record) = again else {
        panic!("expected a replay, got {again:?}")
    };
    assert_eq!(record.state(), OperationState::Committed);
    assert_eq!(record.outcome_reference(), Some(&outcome("payment-1")));
    assert_eq!(record.version.get(), 2);
    assert_eq!(
        ledger.find(&id).await.unwrap().unwrap(),
        before,
        "nothing was rewritten"
    );
}

async fn claim_after_terminal_failure_replays_the_failure(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let id = identity("tenant-a", CREATE, "order-2");
    ledger
        .claim(&id, &fingerprint("b"), lease(30_000))
        .await
        .unwrap();
    let failure =
        RecordedFailure::new(tonic::Code::FailedPrecondition, "insufficient funds").unwrap();
    ledger
        .mark_failed(&id, Version::FIRST, &failure)
        .await
        .unwrap();
    let again = ledger
        .claim(&id, &fingerprint("b"), lease(30_000))
        .await
        .unwrap();
    let ClaimOutcome::Completed(record) = again else {
        panic!("expected a replay, got {again:?}")
    };
    assert_eq!(record.state(), OperationState::FailedTerminal);
    assert_eq!(record.failure(), Some(&failure));
    assert!(record.completed_at().is_some());
}

async fn key_reused_with_another_request_is_refused_and_row_untouched(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let id = identity("tenant-a", CREATE, "order-3");
    ledger
        .claim(&id, &fingerprint("pay 10"), lease(30_000))
        .await
        .unwrap();
    let before = ledger.find(&id).await.unwrap();
    let reused = ledger
        .claim(&id, &fingerprint("pay 99"), lease(30_000))
        .await;
    assert_eq!(reused, Err(LedgerError::KeyReusedWithDifferentRequest));
    assert_eq!(ledger.find(&id).await.unwrap(), before);
    ledger
        .mark_committed(&id, Version::FIRST, &outcome("p"))
        .await
        .unwrap();
    let reused = ledger
        .claim(&id, &fingerprint("pay 99"), lease(30_000))
        .await;
    assert_eq!(reused, Err(LedgerError::KeyReusedWithDifferentRequest));
}

async fn other_caller_and_other_method_are_independent(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let base = identity("tenant-a", CREATE, "same-key");
    ledger
        .claim(&base, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    for other in [
        identity("tenant-b", CREATE, "same-key"),
        identity("tenant-a", "/payments.v1.Payments/Refund", "same-key"),
    ] {
        assert_eq!(
            ledger
                .claim(&other, &fingerprint("y"), lease(30_000))
                .await
                .unwrap(),
            claimed(1, false)
        );
    }
}

/// Review 17.3: both transitions answer a missing claim the same way.
async fn transitions_answer_missing_finished_and_stale_claims_alike(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let failure = RecordedFailure::new(tonic::Code::Aborted, "no").unwrap();
    let missing = identity("tenant-a", CREATE, "never-claimed");
    assert_eq!(
        ledger
            .mark_committed(&missing, Version::FIRST, &outcome("p"))
            .await,
        Err(LedgerError::NotClaimed)
    );
    assert_eq!(
        ledger.mark_failed(&missing, Version::FIRST, &failure).await,
        Err(LedgerError::NotClaimed)
    );
    assert_eq!(
        ledger.find(&missing).await.unwrap(),
        None,
        "no row was created"
    );

    let id = identity("tenant-a", CREATE, "twice");
    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    assert_eq!(
        ledger
            .mark_committed(&id, Version::FIRST.next(), &outcome("p"))
            .await,
        Err(LedgerError::LostOwnership {
            expected: Version::FIRST.next(),
            current: Version::FIRST
        })
    );
    ledger
        .mark_committed(&id, Version::FIRST, &outcome("p"))
        .await
        .unwrap();
    let done = Err(LedgerError::AlreadyCompleted {
        state: OperationState::Committed,
    });
    assert_eq!(
        ledger
            .mark_committed(&id, Version::FIRST, &outcome("q"))
            .await,
        done
    );
    assert_eq!(
        ledger.mark_failed(&id, Version::FIRST, &failure).await,
        done
    );
    let record = ledger.find(&id).await.unwrap().unwrap();
    assert_eq!(
        record.outcome_reference(),
        Some(&outcome("p")),
        "the stored outcome is unchanged"
    );
}

async fn expired_lease_is_taken_over_and_the_old_owner_is_fenced(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let id = identity("tenant-a", CREATE, "lease");
    ledger
        .claim(&id, &fingerprint("x"), lease(100))
        .await
        .unwrap();
    let live = ledger
        .claim(&id, &fingerprint("x"), lease(100))
        .await
        .unwrap();
    assert!(
        matches!(live, ClaimOutcome::InProgress { retry_after, .. } if retry_after <= Duration::from_millis(100))
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        ledger
            .claim(&id, &fingerprint("x"), lease(30_000))
            .await
            .unwrap(),
        claimed(2, true)
    );
    assert_eq!(
        ledger
            .mark_committed(&id, Version::FIRST, &outcome("old-owner"))
            .await,
        Err(LedgerError::LostOwnership {
            expected: Version::FIRST,
            current: Version::FIRST.next()
        })
    );
    ledger
        .mark_committed(&id, Version::FIRST.next(), &outcome("new-owner"))
        .await
        .unwrap();
    let record = ledger.find(&id).await.unwrap().unwrap();
    assert_eq!(record.outcome_reference(), Some(&outcome("new-owner")));
    assert_eq!(record.version.get(), 3);
}

async fn rolled_back_unit_of_work_leaves_neither_claim_nor_write(store: Store) {
    let t = fresh(store).await;
    create_business_table(&t.db).await;
    let id = identity("tenant-a", CREATE, "co-commit");
    let txn = t.db.begin().await.unwrap();
    let ledger = SeaOrmOperationLedger::new(&txn);
    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    business_write(&txn, "co-commit").await.unwrap();
    ledger
        .mark_committed(&id, Version::FIRST, &outcome("co-commit"))
        .await
        .unwrap();
    txn.rollback().await.unwrap();
    let ledger = SeaOrmOperationLedger::new(&t.db);
    assert_eq!(ledger.find(&id).await.unwrap(), None);
    assert_eq!(count(&t.db, "SELECT COUNT(*) FROM payments").await, 0);

    let txn = t.db.begin().await.unwrap();
    let in_txn = SeaOrmOperationLedger::new(&txn);
    assert_eq!(
        in_txn
            .claim(&id, &fingerprint("x"), lease(30_000))
            .await
            .unwrap(),
        claimed(1, false)
    );
    business_write(&txn, "co-commit").await.unwrap();
    in_txn
        .mark_committed(&id, Version::FIRST, &outcome("co-commit"))
        .await
        .unwrap();
    txn.commit().await.unwrap();
    assert_eq!(
        ledger.find(&id).await.unwrap().unwrap().state(),
        OperationState::Committed
    );
    assert_eq!(count(&t.db, "SELECT COUNT(*) FROM payments").await, 1);
}

/// Review 17.2: of many transactions completing the same claim at once, exactly one wins.
async fn concurrent_transitions_have_exactly_one_winner(store: Store) {
    let t = fresh(store).await;
    let id = identity("tenant-a", CREATE, "race");
    SeaOrmOperationLedger::new(&t.db)
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let db = Arc::new(t.db.clone());
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let db = Arc::clone(&db);
            let id = id.clone();
            tokio::spawn(async move {
                let txn = db.begin().await?;
                let ledger = SeaOrmOperationLedger::new(&txn);
                let result = if i % 2 == 0 {
                    ledger
                        .mark_committed(&id, Version::FIRST, &outcome(&format!("winner-{i}")))
                        .await
                } else {
                    let failure = RecordedFailure::new(tonic::Code::Aborted, "lost").unwrap();
                    ledger.mark_failed(&id, Version::FIRST, &failure).await
                };
                match result {
                    Ok(_) => txn.commit().await.map(|_| Ok(i)),
                    Err(e) => txn.rollback().await.map(|_| Err(e)),
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap().expect("begin/commit succeed") {
            Ok(i) => winners.push(i),
            Err(LedgerError::AlreadyCompleted { .. }) => {}
            // SQLite has one writer: a transaction that waited past the busy timeout is refused.
            Err(LedgerError::Unavailable { .. }) if store == Store::Sqlite => {}
            Err(other) => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let record = SeaOrmOperationLedger::new(&t.db)
        .find(&id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.version.get(), 2);
}

/// 32 units of work on separate connections claim one identity at once, over many identities:
/// exactly one claims; the rest wait and replay, or are told it is in flight.
async fn concurrent_claims_have_exactly_one_owner(store: Store) {
    let t = fresh(store).await;
    create_business_table(&t.db).await;
    let db = Arc::new(t.db.clone());
    let identities = if store == Store::Sqlite { 10 } else { 50 };
    for n in 0..identities {
        let key = format!("burst-{n}");
        let id = identity("tenant-a", CREATE, &key);
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (db, id, key) = (Arc::clone(&db), id.clone(), key.clone());
                tokio::spawn(async move {
                    let txn = db.begin().await.map_err(|e| format!("{e}"))?;
                    let ledger = SeaOrmOperationLedger::new(&txn);
                    let answer = ledger.claim(&id, &fingerprint("x"), lease(30_000)).await;
                    if let Ok(ClaimOutcome::Claimed { version, .. }) = &answer {
                        business_write(&txn, &key)
                            .await
                            .map_err(|e| format!("{e}"))?;
                        ledger
                            .mark_committed(&id, *version, &outcome(&key))
                            .await
                            .map_err(|e| format!("{e}"))?;
                        txn.commit().await.map_err(|e| format!("{e}"))?;
                    } else {
                        txn.rollback().await.map_err(|e| format!("{e}"))?;
                    }
                    Ok::<_, String>(answer)
                })
            })
            .collect();
        let mut owners = 0;
        for task in tasks {
            match task.await.unwrap().unwrap() {
                Ok(ClaimOutcome::Claimed { .. }) => owners += 1,
                Ok(ClaimOutcome::Completed(record)) => {
                    assert_eq!(record.outcome_reference(), Some(&outcome(&key)))
                }
                Ok(ClaimOutcome::InProgress { .. }) | Err(LedgerError::InFlight { .. }) => {}
                other => panic!("unexpected answer {other:?}"),
            }
        }
        assert_eq!(owners, 1, "identity {key}");
    }
    assert_eq!(
        count(&t.db, "SELECT COUNT(*) FROM payments").await,
        identities
    );
}

async fn duplicate_behind_uncommitted_claim_answers_in_flight_within_the_bound(store: Store) {
    let t = fresh(store).await;
    let id = identity("tenant-a", CREATE, "blocked");
    let holder = t.db.begin().await.unwrap();
    SeaOrmOperationLedger::new(&holder)
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = t.db.begin().await;
    let answer = match waiter {
        Ok(txn) => {
            let answer = SeaOrmOperationLedger::new(&txn)
                .with_claim_wait(common::config().claim_wait)
                .claim(&id, &fingerprint("x"), lease(30_000))
                .await;
            let _ = txn.rollback().await;
            answer
        }
        Err(e) => panic!("begin failed: {e}"),
    };
    let waited = started.elapsed();
    assert_eq!(
        answer,
        Err(LedgerError::InFlight {
            retry_after: common::config().claim_wait
        })
    );
    assert!(
        waited < common::config().claim_wait + Duration::from_secs(3),
        "waited {waited:?}"
    );
    holder.rollback().await.unwrap();
}

async fn purge_deletes_only_old_finished_rows_up_to_the_limit(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    for n in 0..5 {
        let id = identity("tenant-a", CREATE, &format!("old-{n}"));
        ledger
            .claim(&id, &fingerprint("x"), lease(30_000))
            .await
            .unwrap();
        ledger
            .mark_committed(&id, Version::FIRST, &outcome("p"))
            .await
            .unwrap();
    }
    let open = identity("tenant-a", CREATE, "still-open");
    ledger
        .claim(&open, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cutoff = SystemTime::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let young = identity("tenant-a", CREATE, "young");
    ledger
        .claim(&young, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    ledger
        .mark_committed(&young, Version::FIRST, &outcome("p"))
        .await
        .unwrap();

    assert_eq!(
        ledger
            .purge(cutoff, NonZeroU32::new(3).unwrap())
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        ledger
            .purge(cutoff, NonZeroU32::new(100).unwrap())
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        ledger
            .purge(cutoff, NonZeroU32::new(100).unwrap())
            .await
            .unwrap(),
        0
    );
    assert!(
        ledger.find(&open).await.unwrap().is_some(),
        "IN_PROGRESS is never purged"
    );
    assert!(
        ledger.find(&young).await.unwrap().is_some(),
        "rows after the cutoff stay"
    );
}

/// Records every statement sent, on top of a real connection.
struct Recording {
    inner: DatabaseConnection,
    log: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl ConnectionTrait for Recording {
    fn get_database_backend(&self) -> DbBackend {
        self.inner.get_database_backend()
    }
    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.log.lock().unwrap().push(stmt.sql.clone());
        self.inner.execute_raw(stmt).await
    }
    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.log.lock().unwrap().push(sql.to_owned());
        self.inner.execute_unprepared(sql).await
    }
    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.log.lock().unwrap().push(stmt.sql.clone());
        self.inner.query_one_raw(stmt).await
    }
    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.log.lock().unwrap().push(stmt.sql.clone());
        self.inner.query_all_raw(stmt).await
    }
}

async fn claim_emits_one_insert_on_conflict_and_never_an_update_on_the_insert_path(store: Store) {
    let t = fresh(store).await;
    let recording = Recording {
        inner: t.db.clone(),
        log: Mutex::new(Vec::new()),
    };
    let ledger = SeaOrmOperationLedger::new(&recording);
    let id = identity("tenant-a", CREATE, "sql");
    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let insert_path = std::mem::take(&mut *recording.log.lock().unwrap());
    assert_eq!(insert_path.len(), 1, "{insert_path:#?}");
    assert!(insert_path[0].starts_with("INSERT INTO grpc_operation_ledger"));
    assert!(insert_path[0].contains(
        "ON CONFLICT (caller_fingerprint, full_method_name, idempotency_key_hash) DO NOTHING"
    ));
    assert!(!insert_path[0].contains("UPDATE"));

    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let duplicate_path = std::mem::take(&mut *recording.log.lock().unwrap());
    assert_eq!(duplicate_path.len(), 2, "{duplicate_path:#?}");
    assert!(
        duplicate_path[0].starts_with("INSERT INTO"),
        "insert first, never read-then-insert"
    );
    assert!(duplicate_path[1].starts_with("SELECT"));

    ledger
        .mark_committed(&id, Version::FIRST, &outcome("p"))
        .await
        .unwrap();
    let transition = std::mem::take(&mut *recording.log.lock().unwrap());
    assert_eq!(transition.len(), 1);
    assert!(transition[0].starts_with("UPDATE grpc_operation_ledger SET state = 'COMMITTED'"));
    assert!(transition[0].contains("AND state = 'IN_PROGRESS' AND version = "));
}

/// Hostile text in keys, callers and outcomes is stored verbatim or refused, never executed.
async fn hostile_text_is_bound_never_spliced(store: Store) {
    let t = fresh(store).await;
    let ledger = SeaOrmOperationLedger::new(&t.db);
    let id = identity(
        "x';DROP_TABLE--",
        CREATE,
        "k';DELETE/**/FROM/**/grpc_operation_ledger;--",
    );
    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let evil = outcome("'); DROP TABLE grpc_operation_ledger; --");
    ledger
        .mark_committed(&id, Version::FIRST, &evil)
        .await
        .unwrap();
    let record = ledger.find(&id).await.unwrap().unwrap();
    assert_eq!(record.outcome_reference(), Some(&evil));
    assert_eq!(record.identity.caller().as_str(), "x';DROP_TABLE--");
    assert_eq!(
        count(&t.db, "SELECT COUNT(*) FROM grpc_operation_ledger").await,
        1
    );
}

on_both_stores!(
    claim_after_commit_replays_with_outcome_and_version_intact,
    claim_after_terminal_failure_replays_the_failure,
    key_reused_with_another_request_is_refused_and_row_untouched,
    other_caller_and_other_method_are_independent,
    transitions_answer_missing_finished_and_stale_claims_alike,
    expired_lease_is_taken_over_and_the_old_owner_is_fenced,
    rolled_back_unit_of_work_leaves_neither_claim_nor_write,
    concurrent_transitions_have_exactly_one_winner,
    concurrent_claims_have_exactly_one_owner,
    duplicate_behind_uncommitted_claim_answers_in_flight_within_the_bound,
    purge_deletes_only_old_finished_rows_up_to_the_limit,
    claim_emits_one_insert_on_conflict_and_never_an_update_on_the_insert_path,
    hostile_text_is_bound_never_spliced,
);
