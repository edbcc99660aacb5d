//! Claims: a new identity, replays of finished ones, and what makes two operations different.

use super::*;

/// A claim of a new identity owns it at a fresh version.
pub async fn claim_new_identity<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "new");
    let version = claim_new(&*ledger, &id, LONG).await;
    let record = ledger
        .find(&id)
        .await
        .expect("find")
        .expect("the claim is stored");
    assert_eq!(record.state(), OperationState::InProgress);
    assert_eq!(record.version, version);
    assert_eq!(record.request_fingerprint, request("x"));
    // The lookup reports the same record and a lease that has (almost) all of its time left.
    let (looked_up, left) = ledger
        .look_up(&id)
        .await
        .expect("look up")
        .expect("the claim is stored");
    assert_eq!(looked_up, record);
    assert!(
        left <= Duration::from_millis(LONG) && left > Duration::from_millis(LONG / 2),
        "lease left {left:?}"
    );
    ledger
        .mark_committed(&id, version, &outcome("p"))
        .await
        .expect("commit");
    let (_, left) = ledger.look_up(&id).await.expect("look up").expect("row");
    assert_eq!(
        left,
        Duration::ZERO,
        "a finished operation has no lease left"
    );
}

/// A claim after commit replays: outcome and version intact, nothing rewritten (ADR 0002: the
/// claim is an insert, never an upsert).
pub async fn claim_after_commit_replays<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "committed");
    let version = claim_new(&*ledger, &id, LONG).await;
    let committed = ledger
        .mark_committed(&id, version, &outcome("payment-1"))
        .await
        .expect("commit");
    assert_eq!(committed, version.next());
    let before = ledger.find(&id).await.expect("find");
    let record = replayed(&*ledger, &id, "x").await;
    assert_eq!(record.outcome_reference(), Some(&outcome("payment-1")));
    assert_eq!(record.version, committed, "the version is unchanged");
    assert_eq!(
        ledger.find(&id).await.expect("find"),
        before,
        "nothing was rewritten"
    );
}

/// A claim after a terminal failure replays the recorded failure.
pub async fn claim_after_failure_replays_the_failure<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "failed");
    let version = claim_new(&*ledger, &id, LONG).await;
    // Binary details as a status carries them (an encoded google.rpc.Status), every byte value.
    let details: Vec<u8> = (0..=255)
        .cycle()
        .take(RecordedFailure::MAX_DETAILS_LEN)
        .collect();
    let recorded = failure("insufficient funds")
        .with_details(&details)
        .expect("details within the bound");
    ledger
        .mark_failed(&id, version, &recorded)
        .await
        .expect("fail");
    let record = replayed(&*ledger, &id, "x").await;
    assert_eq!(record.state(), OperationState::FailedTerminal);
    assert_eq!(
        record.failure(),
        Some(&recorded),
        "code, message and details replay as recorded"
    );
}

/// The same key under another caller, or another method, is another operation.
pub async fn other_caller_or_method_is_independent<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let base = identity("tenant-a", CREATE, "shared-key");
    claim_and_commit(&*ledger, &base, "a").await;
    for other in [
        identity("tenant-b", CREATE, "shared-key"),
        identity("tenant-a", "/payments.v1.Payments/Refund", "shared-key"),
    ] {
        claim_new(&*ledger, &other, LONG).await;
    }
}

/// A different request under the same identity is refused and the row is untouched.
pub async fn key_reused_with_another_request_is_refused<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "reused");
    let version = claim_new(&*ledger, &id, LONG).await;
    let in_progress = ledger.find(&id).await.expect("find");
    assert_eq!(
        ledger.claim(&id, &request("pay 99"), lease(LONG)).await,
        Err(LedgerError::KeyReusedWithDifferentRequest)
    );
    assert_eq!(
        ledger.find(&id).await.expect("find"),
        in_progress,
        "row untouched"
    );
    ledger
        .mark_committed(&id, version, &outcome("p"))
        .await
        .expect("commit");
    let committed = ledger.find(&id).await.expect("find");
    assert_eq!(
        ledger.claim(&id, &request("pay 99"), lease(LONG)).await,
        Err(LedgerError::KeyReusedWithDifferentRequest)
    );
    assert_eq!(
        ledger.find(&id).await.expect("find"),
        committed,
        "row untouched"
    );
}
