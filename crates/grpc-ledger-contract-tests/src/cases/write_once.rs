//! Write-once: the finished row recorded in one step (`record_finished`).

use super::*;

/// A unit that made its effects records the operation as finished in one step: committed with
/// the unit, replayed by a later claim or record, and its failure replayed as recorded.
pub async fn record_finished_writes_once_and_replays<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once");
    let (unit, recorded) = write_and_record(&store, &id, "write-once", &done("payment-1")).await;
    let RecordOutcome::Recorded(version) = recorded else {
        panic!("a new identity must be recorded, got {recorded:?}");
    };
    unit.commit().await.expect("commit");
    let record = stored(&store, &id).await;
    assert_eq!(record.state(), OperationState::Committed);
    assert_eq!(record.version, version);
    assert_eq!(record.outcome_reference(), Some(&outcome("payment-1")));
    assert_eq!(store.ledger_rows().await, 1);

    // A duplicate: replayed by a claim, and by a record, whose unit is then rolled back.
    assert_eq!(replayed(&*store.autocommit(), &id, "x").await, record);
    let (unit, duplicate) = write_and_record(&store, &id, "write-once", &done("payment-2")).await;
    assert_eq!(duplicate, RecordOutcome::Completed(Box::new(record)));
    unit.rollback().await.expect("rollback");
    assert_eq!(store.business_rows("write-once").await, 1, "one effect");

    // A failure recorded in one step replays as the failure.
    let failed = identity("tenant-a", CREATE, "write-once-failed");
    let unit = store.begin().await.expect("begin");
    let recorded = unit
        .ledger()
        .record_finished(
            &failed,
            &request("y"),
            lease(LONG),
            &Completion::Failed(failure("insufficient funds")),
        )
        .await
        .expect("record a failure");
    assert!(
        matches!(recorded, RecordOutcome::Recorded(_)),
        "{recorded:?}"
    );
    unit.commit().await.expect("commit");
    let record = replayed(&*store.autocommit(), &failed, "y").await;
    assert_eq!(record.failure(), Some(&failure("insufficient funds")));
}

/// A record under a key already recorded for another request is refused, and writes nothing.
pub async fn record_finished_with_another_request_is_refused<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once-reused");
    let unit = store.begin().await.expect("begin");
    unit.ledger()
        .record_finished(&id, &request("x"), lease(LONG), &done("payment-1"))
        .await
        .expect("record");
    unit.commit().await.expect("commit");
    let unit = store.begin().await.expect("begin");
    let reused = unit
        .ledger()
        .record_finished(&id, &request("other"), lease(LONG), &done("payment-2"))
        .await;
    assert_eq!(reused, Err(LedgerError::KeyReusedWithDifferentRequest));
    unit.rollback().await.expect("rollback");
    assert_eq!(store.ledger_rows().await, 1);
}

/// A record of an identity another owner holds in progress (a live claim) is told so, with the
/// lease's time left, and records nothing.
pub async fn record_finished_over_a_live_claim_is_in_progress<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once-claimed");
    claim_new(&*store.autocommit(), &id, LONG).await;
    let unit = store.begin().await.expect("begin");
    let answer = unit
        .ledger()
        .record_finished(&id, &request("x"), lease(LONG), &done("payment-1"))
        .await
        .expect("record");
    let RecordOutcome::InProgress { retry_after } = answer else {
        panic!("a live claim must answer in progress, got {answer:?}");
    };
    assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_millis(LONG));
    unit.rollback().await.expect("rollback");
    let row = stored(&store, &id).await;
    assert_eq!(row.state(), OperationState::InProgress);
}

/// Units on separate connections make their effects and record one identity at once: exactly
/// one commits; every other finds it finished (and rolls back), waits too long (in flight), or
/// fails its commit (a multi-primary store's certification), and never makes a second effect.
pub async fn concurrent_records_have_exactly_one_winner<F: LedgerFixture>(fixture: &F) {
    let store = Arc::new(fixture.fresh_store().await);
    let id = identity("tenant-a", CREATE, "write-once-race");
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                let Ok(unit) = store.begin().await else {
                    return false;
                };
                if unit.business_write("write-once-race").await.is_err() {
                    let _ = unit.rollback().await;
                    return false;
                }
                let answer = unit
                    .ledger()
                    .record_finished(
                        &id,
                        &request("x"),
                        lease(LONG),
                        &done(&format!("payment-{n}")),
                    )
                    .await;
                match answer {
                    Ok(RecordOutcome::Recorded(_)) => unit.commit().await.is_ok(),
                    Ok(RecordOutcome::Completed(_)) | Err(LedgerError::InFlight { .. }) => {
                        let _ = unit.rollback().await;
                        false
                    }
                    Err(error) if error.is_transient() => {
                        let _ = unit.rollback().await;
                        false
                    }
                    other => panic!("a racing record answered {other:?}"),
                }
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        winners += u32::from(task.await.expect("task"));
    }
    assert_eq!(winners, 1, "exactly one unit commits its record");
    assert_eq!(store.business_rows("write-once-race").await, 1);
    let record = stored(&*store, &id).await;
    assert_eq!(record.state(), OperationState::Committed);
}

/// Begins a unit, makes its business write `key`, and records `id` (request "x") as finished
/// with `completion`; the unit, still open, and what the record answered.
async fn write_and_record<S: LedgerStore>(
    store: &S,
    id: &GrpcOperationIdentity,
    key: &str,
    completion: &Completion,
) -> (S::Unit, RecordOutcome) {
    let unit = store.begin().await.expect("begin");
    unit.business_write(key).await.expect("business write");
    let recorded = unit
        .ledger()
        .record_finished(id, &request("x"), lease(LONG), completion)
        .await
        .expect("record");
    (unit, recorded)
}
