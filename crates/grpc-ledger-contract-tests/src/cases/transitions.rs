//! Transitions and leases: who may finish an operation, and fences that never repeat.

use super::*;

/// Both transitions answer a missing claim with `NotClaimed` and write nothing (ADR 0002).
pub async fn transitions_without_claim_are_not_claimed<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "never-claimed");
    let any_version = Version::fresh(1_764_700_000_000, 7);
    assert_eq!(
        ledger.mark_committed(&id, any_version, &outcome("p")).await,
        Err(LedgerError::NotClaimed)
    );
    assert_eq!(
        ledger.mark_failed(&id, any_version, &failure("f")).await,
        Err(LedgerError::NotClaimed)
    );
    assert_eq!(ledger.find(&id).await.expect("find"), None);
    assert_eq!(store.ledger_rows().await, 0);
}

/// A second transition is `AlreadyCompleted` and the stored outcome stays.
pub async fn transitions_twice_are_already_completed<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "twice");
    let version = claim_new(&*ledger, &id, LONG).await;
    ledger
        .mark_committed(&id, version, &outcome("first"))
        .await
        .expect("commit");
    let done = Err(LedgerError::AlreadyCompleted {
        state: OperationState::Committed,
    });
    assert_eq!(
        ledger
            .mark_committed(&id, version, &outcome("second"))
            .await,
        done
    );
    assert_eq!(
        ledger.mark_failed(&id, version, &failure("late")).await,
        done
    );
    let record = ledger.find(&id).await.expect("find").expect("row");
    assert_eq!(record.outcome_reference(), Some(&outcome("first")));
    assert_eq!(record.version, version.next());
}

/// A transition naming a version that is not current is `LostOwnership` (ADR 0002).
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
    assert_eq!(ledger.mark_committed(&id, wrong, &outcome("p")).await, lost);
    assert_eq!(ledger.mark_failed(&id, wrong, &failure("f")).await, lost);
    let record = ledger.find(&id).await.expect("find").expect("row");
    assert_eq!(record.state(), OperationState::InProgress);
}

/// An expired lease is taken over with a new version; the old owner is fenced off.
pub async fn expired_lease_is_taken_over_and_old_owner_fenced<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let id = identity("tenant-a", CREATE, "lease");
    let first = claim_new(&*ledger, &id, 150).await;
    let live = ledger
        .claim(&id, &request("x"), lease(150))
        .await
        .expect("claim again");
    assert!(
        matches!(live, ClaimOutcome::InProgress { retry_after, .. } if retry_after <= Duration::from_millis(150)),
        "a live lease answers InProgress, got {live:?}"
    );
    // Waits out the lease by the store's clock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ledger.claim(&id, &request("x"), lease(LONG)).await,
        Ok(ClaimOutcome::Claimed {
            version: first.next(),
            took_over: true
        })
    );
    assert_eq!(
        ledger.mark_committed(&id, first, &outcome("old")).await,
        Err(LedgerError::LostOwnership {
            expected: first,
            current: first.next()
        })
    );
    ledger
        .mark_committed(&id, first.next(), &outcome("new"))
        .await
        .expect("new owner commits");
    let record = ledger.find(&id).await.expect("find").expect("row");
    assert_eq!(record.outcome_reference(), Some(&outcome("new")));
}

/// Owner A stalls past its lease, B takes over and commits, the row is purged, and C claims the
/// identity afresh: A's and B's late transitions must not complete C's claim (a fence that
/// restarted at the same number after the purge would let them).
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
        other => panic!("B must take the expired claim over, got {other:?}"),
    };
    ledger
        .mark_committed(&id, b, &outcome("by-b"))
        .await
        .expect("B commits");
    // Lets the store's clock pass B's completion time, so a zero retention purges it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        ledger.purge(Duration::ZERO, NonZeroU32::MIN).await,
        Ok(1),
        "the finished row is purged"
    );
    let c = claim_new(&*ledger, &id, LONG).await;
    for stale in [a, b, b.next()] {
        assert_ne!(c, stale, "a fence repeated after the purge");
        assert_eq!(
            ledger.mark_committed(&id, stale, &outcome("stale")).await,
            Err(LedgerError::LostOwnership {
                expected: stale,
                current: c
            }),
            "a stale owner completed the identity's new claim"
        );
        assert_eq!(
            ledger.mark_failed(&id, stale, &failure("stale")).await,
            Err(LedgerError::LostOwnership {
                expected: stale,
                current: c
            })
        );
    }
    ledger
        .mark_committed(&id, c, &outcome("by-c"))
        .await
        .expect("C commits its own claim");
    let record = ledger.find(&id).await.expect("find").expect("row");
    assert_eq!(record.outcome_reference(), Some(&outcome("by-c")));
}

/// 16 units race to take one expired claim over, on many identities: exactly one wins each;
/// the others see the new owner's live lease (or, on a single-writer store, time out).
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
        let mut winners = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(Ok(ClaimOutcome::Claimed {
                    took_over: true, ..
                })) => winners += 1,
                Ok(Ok(ClaimOutcome::InProgress { .. })) | Ok(Err(LedgerError::InFlight { .. })) => {
                }
                // A store may end a racing unit as a serialisation failure (a deadlock, a
                // multi-primary certification conflict): retryable, and not an owner.
                Ok(Err(LedgerError::Unavailable {
                    kind: UnavailableKind::SerializationFailure,
                }))
                | Err(LedgerError::Unavailable {
                    kind: UnavailableKind::SerializationFailure,
                }) => {}
                Ok(Err(LedgerError::Unavailable { .. })) | Err(LedgerError::Unavailable { .. })
                    if !capabilities.concurrent_writers => {}
                other => panic!("unexpected answer to a racing takeover: {other:?}"),
            }
        }
        assert_eq!(winners, 1, "{winners} takers won one expired claim");
    }
}
