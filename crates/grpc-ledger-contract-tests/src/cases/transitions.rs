//! Transitions and leases: who may finish an operation, and fences that never repeat.

use super::*;

/// Rule [`Rule::TransitionNeedsClaim`]: both transitions answer a missing claim with
/// `NotClaimed` and write nothing (ADR 0002).
pub async fn transitions_without_claim_are_not_claimed<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "never-claimed");
    let any_version = Version::fresh(1_764_700_000_000, 7);
    at(
        Rule::TransitionNeedsClaim,
        "mark an unclaimed identity committed",
        &id,
    )
    .eq(
        ledger.mark_committed(&id, any_version, &outcome("p")).await,
        Err(LedgerError::NotClaimed),
    );
    at(
        Rule::TransitionNeedsClaim,
        "mark an unclaimed identity failed",
        &id,
    )
    .eq(
        ledger.mark_failed(&id, any_version, &failure("f")).await,
        Err(LedgerError::NotClaimed),
    );
    let step = "look for rows after the refused transitions";
    at(Rule::TransitionNeedsClaim, step, &id).eq(ledger.find(&id).await, Ok(None));
    at(Rule::TransitionNeedsClaim, step, &id).eq(store.ledger_rows().await, 0);
}

/// Rule [`Rule::TransitionOfFinished`]: a second transition is `AlreadyCompleted` and the stored
/// outcome stays.
pub async fn transitions_twice_are_already_completed<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "twice");
    let version = claim_new(&*ledger, &id, LONG).await;
    let first = ledger.mark_committed(&id, version, &outcome("first")).await;
    expect_ok(first, at(Rule::TransitionRecords, "commit the claim", &id));
    let done = Err(LedgerError::AlreadyCompleted {
        state: OperationState::Committed,
    });
    at(
        Rule::TransitionOfFinished,
        "mark the committed operation committed again",
        &id,
    )
    .eq(
        ledger
            .mark_committed(&id, version, &outcome("second"))
            .await,
        done.clone(),
    );
    at(
        Rule::TransitionOfFinished,
        "mark the committed operation failed",
        &id,
    )
    .eq(
        ledger.mark_failed(&id, version, &failure("late")).await,
        done,
    );
    let record = stored(&store, &id).await;
    let step = "read the row after the refused transitions";
    at(Rule::TransitionOfFinished, step, &id)
        .eq(record.outcome_reference(), Some(&outcome("first")));
    at(Rule::TransitionRecords, step, &id).eq(record.version, version.next());
}

/// Rule [`Rule::TransitionFenced`]: a transition naming a version that is not current is
/// `LostOwnership` (ADR 0002).
pub async fn transitions_with_stale_version_lose_ownership<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "stale");
    let version = claim_new(&*ledger, &id, LONG).await;
    let wrong = version.next();
    let lost = Err(LedgerError::LostOwnership {
        expected: wrong,
        current: version,
    });
    at(
        Rule::TransitionFenced,
        "mark committed naming another version",
        &id,
    )
    .eq(
        ledger.mark_committed(&id, wrong, &outcome("p")).await,
        lost.clone(),
    );
    at(
        Rule::TransitionFenced,
        "mark failed naming another version",
        &id,
    )
    .eq(ledger.mark_failed(&id, wrong, &failure("f")).await, lost);
    let record = stored(&store, &id).await;
    at(
        Rule::TransitionFenced,
        "read the row after the refused transitions",
        &id,
    )
    .eq(record.state(), OperationState::InProgress);
}

/// Rule [`Rule::ExpiredLeaseTakenOver`]: an expired lease is taken over with a new version; the
/// old owner is fenced off.
pub async fn expired_lease_is_taken_over_and_old_owner_fenced<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "lease");
    let first = claim_new(&*ledger, &id, 150).await;
    let first_claim = stored(&store, &id).await;
    let live = ledger.claim(&id, &request("x"), lease(150)).await;
    at(Rule::LiveLeaseIsInProgress, "claim again within the first owner's 150 ms lease", &id)
        .check(
            matches!(&live, Ok(ClaimOutcome::InProgress { retry_after, .. }) if *retry_after <= Duration::from_millis(150)),
            "Ok(InProgress { retry_after <= 150 ms, .. })",
            &live,
        );
    // Waits out the lease by the store's clock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    at(
        Rule::ExpiredLeaseTakenOver,
        "claim after the first owner's lease ran out",
        &id,
    )
    .eq(
        ledger.claim(&id, &request("x"), lease(LONG)).await,
        Ok(ClaimOutcome::Claimed {
            version: first.next(),
            took_over: true,
        }),
    );
    // The new owner's claim is its own: claimed when it took over, its lease counted from then.
    let taken = stored(&store, &id).await;
    let step = "read the row the takeover wrote";
    at(Rule::ExpiredLeaseTakenOver, step, &id).check(
        taken
            .claimed_at
            .duration_since(first_claim.claimed_at)
            .is_ok_and(|later| later >= Duration::from_millis(250)),
        "a claim time of the takeover's, at least the 300 ms waited after the first claim's",
        (first_claim.claimed_at, taken.claimed_at),
    );
    at(Rule::ExpiredLeaseTakenOver, step, &id).check(
        taken
            .lease_expires_at
            .duration_since(taken.claimed_at)
            .is_ok_and(|lease| {
                lease.abs_diff(Duration::from_millis(LONG)) < Duration::from_secs(1)
            }),
        "a lease of the takeover's 60 s from its claim time",
        (taken.claimed_at, taken.lease_expires_at),
    );
    at(
        Rule::ExpiredLeaseTakenOver,
        "the first owner marks committed after the takeover",
        &id,
    )
    .eq(
        ledger.mark_committed(&id, first, &outcome("old")).await,
        Err(LedgerError::LostOwnership {
            expected: first,
            current: first.next(),
        }),
    );
    let committed = ledger
        .mark_committed(&id, first.next(), &outcome("new"))
        .await;
    expect_ok(
        committed,
        at(Rule::ExpiredLeaseTakenOver, "the new owner commits", &id),
    );
    let record = stored(&store, &id).await;
    at(
        Rule::ExpiredLeaseTakenOver,
        "read the row after the new owner committed",
        &id,
    )
    .eq(record.outcome_reference(), Some(&outcome("new")));
}

/// Rule [`Rule::VersionsNeverRepeat`]: owner A stalls past its lease, B takes over and commits,
/// the row is purged, and C claims the identity afresh: A's and B's late transitions must not
/// complete C's claim (a fence that restarted at the same number after the purge would let them).
pub async fn stale_owner_cannot_complete_a_claim_made_after_purge<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "aba");
    let a = claim_new(&*ledger, &id, 50).await;
    // Waits out A's lease by the store's clock.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let b = match ledger.claim(&id, &request("x"), lease(LONG)).await {
        Ok(ClaimOutcome::Claimed {
            version,
            took_over: true,
        }) => version,
        other => at(
            Rule::ExpiredLeaseTakenOver,
            "B claims after A's 50 ms lease ran out",
            &id,
        )
        .fail("Ok(Claimed { version, took_over: true })", other),
    };
    let by_b = ledger.mark_committed(&id, b, &outcome("by-b")).await;
    expect_ok(by_b, at(Rule::TransitionRecords, "B commits", &id));
    // Lets the store's clock pass B's completion time, so a zero retention purges it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    at(Rule::PurgeOnlyOldFinished, "purge with zero retention", &id)
        .eq(ledger.purge(Duration::ZERO, NonZeroU32::MIN).await, Ok(1));
    let c = claim_new(&*ledger, &id, LONG).await;
    for stale in [a, b, b.next()] {
        let step = "compare C's fresh version with the purged row's versions";
        at(Rule::VersionsNeverRepeat, step, &id).check(
            c != stale,
            format_args!("a version other than {}", stale.to_stored()),
            c,
        );
        let lost = Err(LedgerError::LostOwnership {
            expected: stale,
            current: c,
        });
        let step = "a stale owner of the purged row marks C's claim committed";
        at(Rule::VersionsNeverRepeat, step, &id).eq(
            ledger.mark_committed(&id, stale, &outcome("stale")).await,
            lost.clone(),
        );
        let step = "a stale owner of the purged row marks C's claim failed";
        at(Rule::VersionsNeverRepeat, step, &id).eq(
            ledger.mark_failed(&id, stale, &failure("stale")).await,
            lost,
        );
    }
    let by_c = ledger.mark_committed(&id, c, &outcome("by-c")).await;
    expect_ok(
        by_c,
        at(Rule::TransitionRecords, "C commits its own claim", &id),
    );
    let record = stored(&store, &id).await;
    at(
        Rule::VersionsNeverRepeat,
        "read the row after C committed",
        &id,
    )
    .eq(record.outcome_reference(), Some(&outcome("by-c")));
}

/// Rule [`Rule::OneOwnerPerVersion`]: 16 units race to take one expired claim over, on many
/// identities: exactly one wins each; the others see the new owner's live lease (or, on a
/// single-writer store, time out).
pub async fn racing_takeovers_of_an_expired_claim_have_one_winner<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    let identities: Vec<_> = (0..20)
        .map(|n| identity("tenant-a", CREATE, &format!("takeover-{n}")))
        .collect();
    for id in &identities {
        claim_new(&*store.autocommit(), id, 30).await;
    }
    // Waits out every lease by the store's clock.
    tokio::time::sleep(Duration::from_millis(150)).await;
    for id in identities {
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, id) = (Arc::clone(&store), id.clone());
                tokio::spawn(async move {
                    let unit = store.begin().await?;
                    let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
                    match &answer {
                        Ok(ClaimOutcome::Claimed { .. }) => unit.commit().await?,
                        _ => unit.rollback().await?,
                    }
                    Ok::<_, LedgerError>(answer)
                })
            })
            .collect();
        let step = "16 units take the expired claim over at once";
        let mut winners = 0;
        for task in tasks {
            let answer = task.await.expect("task").and_then(|answer| answer);
            match answer {
                Ok(ClaimOutcome::Claimed {
                    took_over: true, ..
                }) => winners += 1,
                ref other if losing_answer_allowed(other, &capabilities) => {}
                other => at(Rule::ContentionIsRetryable, step, &id).fail(
                    "Claimed { took_over: true }, InProgress, InFlight or a retryable error",
                    other,
                ),
            }
        }
        at(Rule::OneOwnerPerVersion, step, &id).eq(winners, 1);
    }
}
