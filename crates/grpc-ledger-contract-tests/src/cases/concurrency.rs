//! Concurrency: many units of work at once, on separate connections, and a killed connection.

use super::*;

/// 32 tasks claim one identity 30 times each with 1 ms leases, so takeovers race constantly: a
/// claim that cannot settle is in flight, never an internal error.
pub async fn claims_under_contention_never_answer_internal<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    let id = identity("tenant-a", CREATE, "contended");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                for _ in 0..30 {
                    answers.push(store.autocommit().claim(&id, &request("x"), lease(1)).await);
                }
                answers
            })
        })
        .collect();
    let mut owners = 0;
    for task in tasks {
        for answer in task.await.expect("task") {
            match answer {
                Ok(ClaimOutcome::Claimed { .. }) => owners += 1,
                Ok(ClaimOutcome::InProgress { .. }) | Err(LedgerError::InFlight { .. }) => {}
                Err(LedgerError::Unavailable { .. }) if !capabilities.concurrent_writers => {}
                other => panic!("a contended claim must not answer {other:?}"),
            }
        }
    }
    assert!(owners >= 1, "nobody ever owned the contended identity");
}

/// What a handler does inside its unit of work: claim, business write, mark committed. The unit
/// is left open for the caller to commit or roll back.
async fn run_keyed_mutation<U: UnitOfWork>(unit: &U, id: &GrpcOperationIdentity, key: &str) {
    let ledger = unit.ledger();
    let version = claim_new(&*ledger, id, LONG).await;
    unit.business_write(key).await.expect("business write");
    ledger
        .mark_committed(id, version, &outcome(key))
        .await
        .expect("mark committed");
}

/// A unit of work that claims, writes and rolls back leaves neither; committed, both stay.
pub async fn co_commit_rolls_back_and_commits_together<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "co-commit");
    let unit = store.begin().await.expect("begin");
    run_keyed_mutation(&unit, &id, "co-commit").await;
    unit.rollback().await.expect("rollback");
    assert_eq!(
        store.autocommit().find(&id).await.expect("find"),
        None,
        "claim rolled back"
    );
    assert_eq!(
        store.business_rows("co-commit").await,
        0,
        "write rolled back"
    );

    let unit = store.begin().await.expect("begin");
    run_keyed_mutation(&unit, &id, "co-commit").await;
    unit.commit().await.expect("commit");
    let record = stored(&store, &id).await;
    assert_eq!(record.state(), OperationState::Committed);
    assert_eq!(store.business_rows("co-commit").await, 1);
}

/// 32 units on separate connections claim one identity at once, over many identities: exactly
/// one owns it; the others replay, are told it is in progress, or time out as in flight.
pub async fn concurrent_claims_have_exactly_one_owner<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    for n in 0..capabilities.concurrent_claim_identities {
        let key = format!("burst-{n}");
        let id = identity("tenant-a", CREATE, &key);
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (store, id, key) = (Arc::clone(&store), id.clone(), key.clone());
                tokio::spawn(async move {
                    let unit = store.begin().await?;
                    let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
                    if let Ok(ClaimOutcome::Claimed { version, .. }) = &answer {
                        unit.business_write(&key).await?;
                        unit.ledger()
                            .mark_committed(&id, *version, &outcome(&key))
                            .await?;
                        unit.commit().await?;
                    } else {
                        unit.rollback().await?;
                    }
                    Ok::<_, LedgerError>(answer)
                })
            })
            .collect();
        let mut owners = 0;
        for task in tasks {
            match task.await.expect("task") {
                Ok(Ok(ClaimOutcome::Claimed { .. })) => owners += 1,
                Ok(Ok(ClaimOutcome::Completed(record))) => {
                    assert_eq!(record.outcome_reference(), Some(&outcome(&key)))
                }
                Ok(Ok(ClaimOutcome::InProgress { .. })) | Ok(Err(LedgerError::InFlight { .. })) => {
                }
                Ok(Err(LedgerError::Unavailable { .. })) | Err(LedgerError::Unavailable { .. })
                    if !capabilities.concurrent_writers => {}
                // A racing unit ended by the store (a deadlock, a certification conflict between
                // primaries): retryable, and not an owner.
                Ok(Err(LedgerError::Unavailable {
                    kind: UnavailableKind::SerializationFailure,
                }))
                | Err(LedgerError::Unavailable {
                    kind: UnavailableKind::SerializationFailure,
                }) => {}
                other => panic!("unexpected answer to a concurrent claim: {other:?}"),
            }
        }
        assert_eq!(owners, 1, "identity {key} had {owners} owners");
        assert_eq!(
            store.business_rows(&key).await,
            1,
            "identity {key} ran once"
        );
    }
}

/// 32 units race to complete one claim: exactly one wins (a transition is one UPDATE conditional
/// on state and version: ADR 0002).
pub async fn concurrent_transitions_have_exactly_one_winner<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    let id = identity("tenant-a", CREATE, "race");
    let version = claim_new(&*store.autocommit(), &id, LONG).await;
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                let unit = store.begin().await?;
                let result = if i % 2 == 0 {
                    unit.ledger()
                        .mark_committed(&id, version, &outcome(&format!("w{i}")))
                        .await
                } else {
                    unit.ledger()
                        .mark_failed(&id, version, &failure(&format!("w{i}")))
                        .await
                };
                match result {
                    Ok(_) => unit.commit().await.map(|()| Ok(i)),
                    Err(e) => unit.rollback().await.map(|()| Err(e)),
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            Ok(Ok(i)) => winners.push(i),
            Ok(Err(LedgerError::AlreadyCompleted { .. })) => {}
            Ok(Err(LedgerError::Unavailable { .. })) | Err(LedgerError::Unavailable { .. })
                if !capabilities.concurrent_writers => {}
            Ok(Err(LedgerError::Unavailable {
                kind: UnavailableKind::SerializationFailure,
            }))
            | Err(LedgerError::Unavailable {
                kind: UnavailableKind::SerializationFailure,
            }) => {}
            other => panic!("unexpected answer to a racing transition: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    let record = stored(&*store, &id).await;
    assert_eq!(record.version, version.next());
}

/// A duplicate behind another unit's uncommitted claim answers `InFlight` within the bound (on a
/// single-writer store, whose units wait for the write lock when they begin, `Unavailable`: the
/// store is busy); after the first unit commits, a duplicate replays.
pub async fn duplicate_behind_uncommitted_claim_is_in_flight<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let bound = capabilities.claim_wait;
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "blocked");
    let holder = store.begin().await.expect("begin");
    let version = claim_new(&*holder.ledger(), &id, LONG).await;
    let started = Instant::now();
    let waiter = store.begin().await;
    let answer = match waiter {
        // On another primary the duplicate does not wait: it claims too, and the first commit
        // must win (below).
        Ok(unit) if capabilities.multi_primary => {
            let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
            if let Ok(ClaimOutcome::Claimed { .. }) = answer {
                first_commit_wins(&store, holder, version, unit).await;
                return;
            }
            let _ = unit.rollback().await;
            answer
        }
        Ok(unit) => {
            let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
            let _ = unit.rollback().await;
            answer
        }
        Err(error) => Err(error),
    };
    let waited = started.elapsed();
    let busy = LedgerError::unavailable(UnavailableKind::StoreBusy);
    assert!(
        matches!(answer, Err(LedgerError::InFlight { .. }))
            || (!capabilities.concurrent_writers && answer == Err(busy)),
        "a blocked duplicate must answer InFlight, got {answer:?}"
    );
    assert!(
        waited >= bound.mul_f64(0.5),
        "answered after {waited:?}, before the bound {bound:?}"
    );
    assert!(
        waited < bound + Duration::from_secs(3),
        "waited {waited:?} past the bound {bound:?}"
    );

    holder
        .ledger()
        .mark_committed(&id, version, &outcome("first"))
        .await
        .expect("commit");
    holder.commit().await.expect("commit");
    let replay = store
        .autocommit()
        .claim(&id, &request("x"), lease(LONG))
        .await
        .expect("claim");
    assert!(
        matches!(replay, ClaimOutcome::Completed(_)),
        "after commit a duplicate replays"
    );
}

/// Two units that both claimed one identity on different primaries (`holder` first, at
/// `holder_version`, then `rival`): the holder commits, the rival's commit must fail as a
/// serialisation failure, and a duplicate then replays the holder's outcome.
async fn first_commit_wins<S: LedgerStore>(
    store: &S,
    holder: S::Unit,
    holder_version: Version,
    rival: S::Unit,
) {
    let id = identity("tenant-a", CREATE, "blocked");
    holder
        .ledger()
        .mark_committed(&id, holder_version, &outcome("first"))
        .await
        .expect("the holder completes");
    holder.commit().await.expect("the holder commits first");
    // The store may tell the rival at its next statement or only at its commit.
    let found = rival.ledger().find(&id).await;
    let marked = match found {
        Ok(Some(record)) => rival
            .ledger()
            .mark_committed(&id, record.version, &outcome("second"))
            .await
            .map(|_| ()),
        Ok(None) => panic!("the rival's own claim is invisible to it"),
        Err(error) => Err(error),
    };
    let committed = match marked {
        Ok(()) => rival.commit().await,
        Err(error) => {
            let _ = rival.rollback().await;
            Err(error)
        }
    };
    assert_eq!(
        committed,
        Err(LedgerError::unavailable(
            UnavailableKind::SerializationFailure
        )),
        "a second owner on another primary must not commit"
    );
    let record = replayed(&*store.autocommit(), &id, "x").await;
    assert_eq!(record.outcome_reference(), Some(&outcome("first")));
}

/// A unit's connection killed mid-way: nothing half-written, `Unavailable`, and a retry on a new
/// connection succeeds. Runs only on stores with the `kill_connection` capability.
pub async fn killed_connection_is_unavailable_and_retry_succeeds<F: LedgerFixture>(fixture: &F) {
    if !applies(
        "killed_connection_is_unavailable_and_retry_succeeds",
        &fixture.capabilities(),
    ) {
        return;
    }
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "killed");
    let unit = store.begin().await.expect("begin");
    let version = claim_new(&*unit.ledger(), &id, LONG).await;
    unit.business_write("killed").await.expect("business write");
    unit.kill_connection().await;
    let answer = unit
        .ledger()
        .mark_committed(&id, version, &outcome("p"))
        .await;
    assert!(
        matches!(answer, Err(LedgerError::Unavailable { .. })),
        "a killed connection must answer Unavailable, got {answer:?}"
    );
    let _ = unit.rollback().await;
    assert_eq!(
        store.autocommit().find(&id).await.expect("find"),
        None,
        "nothing half-written"
    );
    assert_eq!(store.business_rows("killed").await, 0);

    let retry = store.begin().await.expect("begin");
    run_keyed_mutation(&retry, &id, "killed").await;
    retry.commit().await.expect("commit");
    assert_eq!(store.business_rows("killed").await, 1);
}
