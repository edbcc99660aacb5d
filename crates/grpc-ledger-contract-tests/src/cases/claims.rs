//! Claims: a new identity, replays of finished ones, and what makes two operations different.

use super::*;

/// Rules [`Rule::ClaimNew`] and [`Rule::LookUpLeaseLeft`]: a claim of a new identity owns it at a
/// fresh version, stored IN_PROGRESS with the request's fingerprint; `look_up` reports the lease
/// left by the store's clock.
pub async fn claim_new_identity<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "new");
    let version = claim_new(&*ledger, &id, LONG).await;
    let record = stored(&store, &id).await;
    let at_row = at(Rule::ClaimNew, "read the new claim's row", &id);
    at_row.eq(record.state(), OperationState::InProgress);
    at_row.eq(record.version, version);
    at_row.eq(record.request_fingerprint, request("x"));
    // The lookup reports the same record and a lease that has (almost) all of its time left.
    let step = "look the new claim up";
    let looked_up = expect_ok(
        ledger.look_up(&id).await,
        at(Rule::LookUpLeaseLeft, step, &id),
    );
    let Some((looked_up, left)) = looked_up else {
        at(Rule::LookUpLeaseLeft, step, &id).fail("Some((record, lease left))", None::<()>);
    };
    at(Rule::LookUpLeaseLeft, step, &id).eq(looked_up, record);
    at(Rule::LookUpLeaseLeft, step, &id).check(
        left <= Duration::from_millis(LONG) && left > Duration::from_millis(LONG / 2),
        format_args!("a lease left of at most {LONG} ms and more than half of it"),
        left,
    );
    let committed = ledger.mark_committed(&id, version, &outcome("p")).await;
    expect_ok(
        committed,
        at(Rule::TransitionRecords, "commit the claim", &id),
    );
    let step = "look the finished operation up";
    let looked_up = expect_ok(
        ledger.look_up(&id).await,
        at(Rule::LookUpLeaseLeft, step, &id),
    );
    at(Rule::LookUpLeaseLeft, step, &id).eq(looked_up.map(|(_, left)| left), Some(Duration::ZERO));
}

/// Rule [`Rule::ClaimReplays`]: a claim after commit replays, outcome and version intact, nothing
/// rewritten (ADR 0002: the claim is an insert, never an upsert).
pub async fn claim_after_commit_replays<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "committed");
    let version = claim_new(&*ledger, &id, LONG).await;
    let committed = ledger
        .mark_committed(&id, version, &outcome("payment-1"))
        .await;
    let committed = expect_ok(
        committed,
        at(Rule::TransitionRecords, "commit the claim", &id),
    );
    at(Rule::TransitionRecords, "commit the claim", &id).eq(committed, version.next());
    let before = stored(&store, &id).await;
    let record = replayed(&*ledger, &id, "x").await;
    let step = "claim the committed identity again";
    at(Rule::ClaimReplays, step, &id).eq(record.outcome_reference(), Some(&outcome("payment-1")));
    at(Rule::ClaimReplays, step, &id).eq(record.version, committed);
    at(Rule::ClaimReplays, "read the row after the replay", &id)
        .eq(stored(&store, &id).await, before);
}

/// Rule [`Rule::ClaimReplays`]: a claim after a terminal failure replays the recorded failure,
/// its binary details byte for byte.
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
    let failed = ledger.mark_failed(&id, version, &recorded).await;
    let failed = expect_ok(
        failed,
        at(Rule::TransitionRecords, "record the failure", &id),
    );
    at(Rule::TransitionRecords, "record the failure", &id).eq(failed, version.next());
    let record = replayed(&*ledger, &id, "x").await;
    // The version the transition answered is the one it stored.
    at(
        Rule::TransitionRecords,
        "claim the failed identity again",
        &id,
    )
    .eq(record.version, failed);
    let step = "claim the failed identity again";
    at(Rule::ClaimReplays, step, &id).eq(record.state(), OperationState::FailedTerminal);
    at(Rule::ClaimReplays, step, &id).eq(record.failure(), Some(&recorded));
}

/// Rule [`Rule::IdentityHasThreeParts`]: the same key under another caller, or another method,
/// is another operation.
pub async fn other_caller_or_method_is_independent<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let base = identity("tenant-a", CREATE, "shared-key");
    claim_and_commit(&*ledger, &base, "a").await;
    for other in [
        identity("tenant-b", CREATE, "shared-key"),
        identity("tenant-a", "/payments.v1.Payments/Refund", "shared-key"),
    ] {
        let answer = ledger.claim(&other, &request("x"), lease(LONG)).await;
        at(
            Rule::IdentityHasThreeParts,
            "claim the committed key under another caller or method",
            &other,
        )
        .check(
            matches!(
                answer,
                Ok(ClaimOutcome::Claimed {
                    took_over: false,
                    ..
                })
            ),
            "Ok(Claimed { took_over: false, .. }): a new operation",
            answer,
        );
    }
}

/// Rule [`Rule::RequestMustMatch`]: a different request under the same identity is refused, in
/// progress and finished, and the row is untouched.
pub async fn key_reused_with_another_request_is_refused<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "reused");
    let version = claim_new(&*ledger, &id, LONG).await;
    let in_progress = stored(&store, &id).await;
    let step = "claim the in-progress identity with another request";
    at(Rule::RequestMustMatch, step, &id).eq(
        ledger.claim(&id, &request("pay 99"), lease(LONG)).await,
        Err(LedgerError::KeyReusedWithDifferentRequest),
    );
    at(Rule::RequestMustMatch, step, &id).eq(stored(&store, &id).await, in_progress);
    let committed = ledger.mark_committed(&id, version, &outcome("p")).await;
    expect_ok(
        committed,
        at(Rule::TransitionRecords, "commit the claim", &id),
    );
    let committed = stored(&store, &id).await;
    let step = "claim the committed identity with another request";
    at(Rule::RequestMustMatch, step, &id).eq(
        ledger.claim(&id, &request("pay 99"), lease(LONG)).await,
        Err(LedgerError::KeyReusedWithDifferentRequest),
    );
    at(Rule::RequestMustMatch, step, &id).eq(stored(&store, &id).await, committed);
}
