//! Write-once: the finished row recorded in one step (`record_finished`).

use super::*;

/// Rule [`Rule::RecordOnce`]: a unit that made its effects records the operation as finished in one step: committed with
/// the unit, replayed by a later claim or record, and its failure replayed as recorded.
pub async fn record_finished_writes_once_and_replays<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once");
    let (unit, recorded) = write_and_record(&store, &id, "write-once", &done("payment-1")).await;
    let RecordOutcome::Recorded(version) = recorded else {
        at(Rule::RecordOnce, "record a new identity as finished", &id)
            .fail("Recorded(version)", recorded);
    };
    expect_ok(
        unit.commit().await,
        at(Rule::RecordOnce, "commit the unit", &id),
    );
    let record = stored(&store, &id).await;
    let step = "read the recorded row";
    at(Rule::RecordOnce, step, &id).eq(record.state(), OperationState::Committed);
    at(Rule::RecordOnce, step, &id).eq(record.version, version);
    at(Rule::RecordOnce, step, &id).eq(record.outcome_reference(), Some(&outcome("payment-1")));
    at(Rule::RecordOnce, step, &id).eq(store.ledger_rows().await, 1);

    // A duplicate: replayed by a claim, and by a record, whose unit is then rolled back.
    let replay = replayed(&*store.autocommit(), &id, "x").await;
    at(Rule::ClaimReplays, "claim the recorded identity", &id).eq(replay, record.clone());
    let (unit, duplicate) = write_and_record(&store, &id, "write-once", &done("payment-2")).await;
    at(Rule::RecordOnce, "record the recorded identity again", &id)
        .eq(duplicate, RecordOutcome::Completed(Box::new(record)));
    expect_ok(
        unit.rollback().await,
        at(Rule::RecordOnce, "roll back the duplicate", &id),
    );
    at(Rule::RecordOnce, "count the business rows", &id)
        .eq(store.business_rows("write-once").await, 1);

    // A failure recorded in one step replays as the failure.
    let failed = identity("tenant-a", CREATE, "write-once-failed");
    let at_failed = at(Rule::RecordOnce, "record a failure in one step", &failed);
    let unit = expect_ok(store.begin().await, at_failed);
    let recorded = unit
        .ledger()
        .record_finished(
            &failed,
            &request("y"),
            lease(LONG),
            &Completion::Failed(failure("insufficient funds")),
        )
        .await;
    let recorded = expect_ok(recorded, at_failed);
    at_failed.check(
        matches!(recorded, RecordOutcome::Recorded(_)),
        "Recorded(version)",
        &recorded,
    );
    expect_ok(unit.commit().await, at_failed);
    let record = replayed(&*store.autocommit(), &failed, "y").await;
    at(Rule::ClaimReplays, "claim the recorded failure", &failed)
        .eq(record.failure(), Some(&failure("insufficient funds")));
}

/// A record under a key already recorded for another request is refused, and writes nothing.
pub async fn record_finished_with_another_request_is_refused<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once-reused");
    let first = at(Rule::RecordOnce, "record the identity", &id);
    let unit = expect_ok(store.begin().await, first);
    let recorded = unit
        .ledger()
        .record_finished(&id, &request("x"), lease(LONG), &done("payment-1"))
        .await;
    expect_ok(recorded, first);
    expect_ok(unit.commit().await, first);
    let again = at(
        Rule::RequestMustMatch,
        "record it again for another request",
        &id,
    );
    let unit = expect_ok(store.begin().await, again);
    let reused = unit
        .ledger()
        .record_finished(&id, &request("other"), lease(LONG), &done("payment-2"))
        .await;
    again.eq(reused, Err(LedgerError::KeyReusedWithDifferentRequest));
    expect_ok(unit.rollback().await, again);
    again.eq(store.ledger_rows().await, 1);
}

/// A record of an identity another owner holds in progress (a live claim) is told so, with the
/// lease's time left, and records nothing.
pub async fn record_finished_over_a_live_claim_is_in_progress<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "write-once-claimed");
    claim_new(&*store.autocommit(), &id, LONG).await;
    let over = at(
        Rule::RecordOnce,
        "record an identity held by a live claim",
        &id,
    );
    let unit = expect_ok(store.begin().await, over);
    let answer = unit
        .ledger()
        .record_finished(&id, &request("x"), lease(LONG), &done("payment-1"))
        .await;
    let answer = expect_ok(answer, over);
    let RecordOutcome::InProgress { retry_after } = answer else {
        over.fail("InProgress { retry_after }", answer);
    };
    over.check(
        retry_after > Duration::ZERO && retry_after <= Duration::from_millis(LONG),
        format_args!("a retry delay within the claim's {LONG} ms lease"),
        retry_after,
    );
    expect_ok(unit.rollback().await, over);
    over.eq(
        stored(&store, &id).await.state(),
        OperationState::InProgress,
    );
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
                    other => at(Rule::RecordOnce, "8 units record one identity at once", &id)
                        .fail("Recorded, Completed, InFlight or a retryable error", other),
                }
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        winners += u32::from(task.await.expect("task"));
    }
    let race = at(Rule::RecordOnce, "8 units record one identity at once", &id);
    race.eq(winners, 1);
    race.eq(store.business_rows("write-once-race").await, 1);
    race.eq(
        stored(&*store, &id).await.state(),
        OperationState::Committed,
    );
}

/// Begins a unit, makes its business write `key`, and records `id` (request "x") as finished
/// with `completion`; the unit, still open, and what the record answered.
async fn write_and_record<S: LedgerStore>(
    store: &S,
    id: &GrpcOperationIdentity,
    key: &str,
    completion: &Completion,
) -> (S::Unit, RecordOutcome) {
    let step = at(
        Rule::RecordOnce,
        "business write, then record the operation finished",
        id,
    );
    let unit = expect_ok(store.begin().await, step);
    expect_ok(unit.business_write(key).await, step);
    let recorded = unit
        .ledger()
        .record_finished(id, &request("x"), lease(LONG), completion)
        .await;
    (unit, expect_ok(recorded, step))
}
