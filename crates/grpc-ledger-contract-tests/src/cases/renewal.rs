//! Lease renewal: an owner whose claim committed before its work keeps the claim alive while the
//! work runs, and hands it on early when it gives up.

use super::*;

/// Rule [`Rule::RenewalKeepsTheOwner`]: a renewal moves the lease's end by the store's clock and
/// nothing else, so the claim stays in progress past its first lease and its owner still finishes
/// it at the version it was handed; an owner whose lease lapsed while nobody took the claim over
/// renews it too.
pub async fn renewed_lease_keeps_its_owner_and_version<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "renewed");
    let version = claim_new(&*ledger, &id, 300).await;
    let claimed = stored(&store, &id).await;
    let rule = Rule::RenewalKeepsTheOwner;
    expect_ok(
        ledger.renew_lease(&id, version, lease(LONG)).await,
        at(rule, "the owner renews its live 300 ms lease to 60 s", &id),
    );
    let renewed = stored(&store, &id).await;
    let step = "read the renewed row";
    at(rule, step, &id).eq(renewed.version, version);
    at(rule, step, &id).eq(renewed.state(), OperationState::InProgress);
    at(rule, step, &id).eq(renewed.claimed_at, claimed.claimed_at);
    at(rule, step, &id).check(
        renewed.lease_expires_at > claimed.lease_expires_at,
        "a lease that ends later than the claim's",
        (claimed.lease_expires_at, renewed.lease_expires_at),
    );
    let left = expect_ok(
        ledger.look_up(&id).await,
        at(rule, "look the renewed claim up", &id),
    );
    at(rule, "look the renewed claim up", &id).check(
        matches!(left, Some((_, left)) if left > Duration::from_secs(30) && left <= Duration::from_millis(LONG)),
        "about 60 s left on the lease, by the store's clock",
        left.map(|(_, left)| left),
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = ledger.claim(&id, &request("x"), lease(LONG)).await;
    at(
        rule,
        "claim again after the first 300 ms lease would have ended",
        &id,
    )
    .check(
        matches!(again, Ok(ClaimOutcome::InProgress { .. })),
        "Ok(InProgress { .. }): the renewed lease is live",
        &again,
    );

    expect_ok(
        ledger.renew_lease(&id, version, lease(150)).await,
        at(rule, "the owner renews to a 150 ms lease", &id),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    expect_ok(
        ledger.renew_lease(&id, version, lease(LONG)).await,
        at(
            rule,
            "the owner renews its lapsed lease, which nobody took over",
            &id,
        ),
    );
    let again = ledger.claim(&id, &request("x"), lease(LONG)).await;
    at(rule, "claim again after the lapsed lease was renewed", &id).check(
        matches!(again, Ok(ClaimOutcome::InProgress { .. })),
        "Ok(InProgress { .. })",
        &again,
    );
    // The lease runs from the renewal, not from the claim: a claim older than the lease renewed
    // to it is still live.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    expect_ok(
        ledger.renew_lease(&id, version, lease(1_000)).await,
        at(
            rule,
            "the owner renews a claim over 1 s old to a 1 s lease",
            &id,
        ),
    );
    let again = ledger.claim(&id, &request("x"), lease(LONG)).await;
    at(
        rule,
        "claim again right after renewing a claim over 1 s old to 1 s",
        &id,
    )
    .check(
        matches!(again, Ok(ClaimOutcome::InProgress { .. })),
        "Ok(InProgress { .. }): the lease ends 1 s after the renewal, not after the claim",
        &again,
    );
    at(rule, "the owner commits at the version it was handed", &id).eq(
        ledger.mark_committed(&id, version, &outcome("p")).await,
        Ok(version.next()),
    );
}

/// Rule [`Rule::RenewalFenced`]: a renewal by an owner that no longer holds the claim (taken over,
/// finished, or never there) answers as a transition would and changes nothing: a stalled owner
/// cannot keep the new owner's lease alive, nor revive a finished operation.
pub async fn renewal_of_a_lost_claim_is_refused<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let rule = Rule::RenewalFenced;
    let id = identity("tenant-a", CREATE, "renew-lost");
    let stalled = claim_new(&*ledger, &id, 100).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let taken = ledger.claim(&id, &request("x"), lease(LONG)).await;
    let owner = match taken {
        Ok(ClaimOutcome::Claimed {
            version,
            took_over: true,
        }) => version,
        other => at(
            Rule::ExpiredLeaseTakenOver,
            "take the expired claim over",
            &id,
        )
        .fail("Ok(Claimed { version, took_over: true })", other),
    };
    let before = stored(&store, &id).await;
    at(
        rule,
        "the stalled owner renews the claim another took over",
        &id,
    )
    .eq(
        ledger.renew_lease(&id, stalled, lease(LONG)).await,
        Err(LedgerError::LostOwnership {
            expected: stalled,
            current: owner,
        }),
    );
    let after = stored(&store, &id).await;
    at(rule, "read the row after the refused renewal", &id).eq(after, before);

    let finished = expect_ok(
        ledger.mark_committed(&id, owner, &outcome("p")).await,
        at(Rule::TransitionRecords, "the new owner commits", &id),
    );
    let before = stored(&store, &id).await;
    at(rule, "the owner renews the operation it finished", &id).eq(
        ledger.renew_lease(&id, owner, lease(LONG)).await,
        Err(LedgerError::AlreadyCompleted {
            state: OperationState::Committed,
        }),
    );
    at(rule, "the stalled owner renews the finished operation", &id).eq(
        ledger.renew_lease(&id, stalled, lease(LONG)).await,
        Err(LedgerError::AlreadyCompleted {
            state: OperationState::Committed,
        }),
    );
    let after = stored(&store, &id).await;
    at(
        rule,
        "read the finished row after the refused renewals",
        &id,
    )
    .eq(after.clone(), before);
    at(
        rule,
        "read the finished row after the refused renewals",
        &id,
    )
    .eq(after.version, finished);

    let missing = identity("tenant-a", CREATE, "renew-missing");
    at(rule, "renew an identity that was never claimed", &missing).eq(
        ledger
            .renew_lease(&missing, Version::fresh(1_764_700_000_000, 7), lease(LONG))
            .await,
        Err(LedgerError::NotClaimed),
    );
    at(
        rule,
        "count the rows after renewing a missing claim",
        &missing,
    )
    .eq(store.ledger_rows().await, 1);
}

/// Rule [`Rule::ShortestLeaseReleases`]: renewing to [`LeaseDuration::SHORTEST`] hands the
/// operation on at once (an owner that gave up, so a resend need not wait out the lease); inside a
/// unit of work the renewal commits or rolls back with the unit.
pub async fn renewal_to_the_shortest_lease_releases_the_claim<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let rule = Rule::ShortestLeaseReleases;
    let id = identity("tenant-a", CREATE, "released");
    let version = claim_new(&*store.autocommit(), &id, LONG).await;

    release_in_a_unit(&store, &id, version, false).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let again = store
        .autocommit()
        .claim(&id, &request("x"), lease(LONG))
        .await;
    at(rule, "claim again after the release was rolled back", &id).check(
        matches!(again, Ok(ClaimOutcome::InProgress { .. })),
        "Ok(InProgress { .. }): a rolled-back release leaves the 60 s lease",
        &again,
    );

    release_in_a_unit(&store, &id, version, true).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let ledger = store.autocommit();
    at(rule, "claim again once the release committed", &id).eq(
        ledger.claim(&id, &request("x"), lease(LONG)).await,
        Ok(ClaimOutcome::Claimed {
            version: version.next(),
            took_over: true,
        }),
    );
    at(rule, "the owner that released commits afterwards", &id).eq(
        ledger.mark_committed(&id, version, &outcome("late")).await,
        Err(LedgerError::LostOwnership {
            expected: version,
            current: version.next(),
        }),
    );
}

/// Renews `id`'s claim at `version` to the shortest lease inside a unit of work, then commits the
/// unit or rolls it back.
async fn release_in_a_unit<S: LedgerStore>(
    store: &S,
    id: &GrpcOperationIdentity,
    version: Version,
    commit: bool,
) {
    let step = if commit {
        "release the claim in a unit that commits"
    } else {
        "release the claim in a unit that rolls back"
    };
    let at_unit = at(Rule::ShortestLeaseReleases, step, id);
    let unit = expect_ok(store.begin().await, at_unit);
    let released = unit
        .ledger()
        .renew_lease(id, version, LeaseDuration::SHORTEST)
        .await;
    expect_ok(released, at_unit);
    let ended = if commit {
        unit.commit().await
    } else {
        unit.rollback().await
    };
    expect_ok(ended, at_unit);
}

/// Rule [`Rule::OneOwnerPerVersion`]: a takeover's UPDATE is conditional on the lease having run
/// out by the store's clock *when it runs*, not only when the taker read the row. A renewal keeps
/// the version, so a taker that read a lapsed lease, then waited behind the owner's uncommitted
/// renewal of it, must not take the operation over once that renewal commits: it answers
/// `InProgress` (or, past its wait bound, `InFlight` or a retryable error), and the owner still
/// finishes at its version. On a multi-primary cluster the taker may commit first, and the
/// owner's renewal then fails to commit; that order is allowed. Not applicable to a store with one
/// writer at a time (the taker cannot read while the renewal holds the write lock).
pub async fn a_renewal_committed_while_a_taker_waits_keeps_the_owner<F: LedgerFixture>(
    fixture: &F,
) {
    let store = fixture.fresh_store().await;
    let rule = Rule::OneOwnerPerVersion;
    let id = identity("tenant-a", CREATE, "renewed-under-a-taker");
    let version = claim_new(&*store.autocommit(), &id, 200).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let unit = expect_ok(store.begin().await, at(rule, "begin the owner's unit", &id));
    let renewed = unit.ledger().renew_lease(&id, version, lease(LONG)).await;
    expect_ok(
        renewed,
        at(rule, "the owner renews its lapsed lease in a unit", &id),
    );
    // The taker reads the lapsed lease at once, then its takeover waits behind the renewal's row
    // lock until the owner commits.
    let taker = store.autocommit();
    let body = request("x");
    let taken = taker.claim(&id, &body, lease(LONG));
    let committed = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        unit.commit().await
    };
    let (taken, committed) = tokio::join!(taken, committed);
    match committed {
        Ok(()) => {
            let step = "a taker that read the lapsed lease, once the owner's renewal committed";
            at(rule, step, &id).check(
                !matches!(taken, Ok(ClaimOutcome::Claimed { .. })),
                "InProgress (the renewed lease is live), InFlight or a retryable error: never a \
                 takeover of a live lease",
                &taken,
            );
            let finished = store
                .autocommit()
                .mark_committed(&id, version, &outcome("p"))
                .await;
            expect_ok(
                finished,
                at(rule, "the owner commits at its version after the race", &id),
            );
        }
        Err(LedgerError::Unavailable {
            kind: UnavailableKind::SerializationFailure,
        }) if fixture.capabilities().multi_primary => {}
        Err(error) => at(rule, "commit the owner's renewal", &id).fail("Ok(())", error),
    }
}
