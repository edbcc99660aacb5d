//! Concurrency: many units of work at once, on separate connections, and a killed connection.

use super::*;

/// Rule [`Rule::ContentionIsRetryable`]: 32 tasks claim one identity 30 times each with 1 ms
/// leases, so takeovers race constantly: a claim that cannot settle is in flight, never an
/// internal error.
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
    let step = "32 tasks x 30 claims with 1 ms leases";
    let mut owners = 0;
    for task in tasks {
        for answer in task.await.expect("task") {
            match answer {
                Ok(ClaimOutcome::Claimed { .. }) => owners += 1,
                ref other if losing_answer_allowed(other, &capabilities) => {}
                other => at(Rule::ContentionIsRetryable, step, &id).fail(
                    "Claimed, InProgress, InFlight or a retryable Unavailable",
                    other,
                ),
            }
        }
    }
    at(Rule::ContentionIsRetryable, step, &id).check(
        owners >= 1,
        "at least one owner",
        "nobody ever owned the contended identity",
    );
}

/// What a handler does inside its unit of work: claim, business write, mark committed. The unit
/// is left open for the caller to commit or roll back.
async fn run_keyed_mutation<U: UnitOfWork>(unit: &U, id: &GrpcOperationIdentity, key: &str) {
    let ledger = unit.ledger();
    let version = claim_new(&*ledger, id, LONG).await;
    let at = at(
        Rule::NoTransactionOfItsOwn,
        "claim, business write, mark committed in a unit",
        id,
    );
    expect_ok(unit.business_write(key).await, at);
    expect_ok(ledger.mark_committed(id, version, &outcome(key)).await, at);
}

/// Rule [`Rule::NoTransactionOfItsOwn`]: a unit of work that claims, writes and rolls back leaves
/// neither; committed, both stay.
pub async fn co_commit_rolls_back_and_commits_together<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "co-commit");
    let unit = expect_ok(
        store.begin().await,
        at(Rule::NoTransactionOfItsOwn, "begin", &id),
    );
    run_keyed_mutation(&unit, &id, "co-commit").await;
    expect_ok(
        unit.rollback().await,
        at(Rule::NoTransactionOfItsOwn, "roll back", &id),
    );
    let step = "look for the claim and the write after the rollback";
    at(Rule::NoTransactionOfItsOwn, step, &id).eq(store.autocommit().find(&id).await, Ok(None));
    at(Rule::NoTransactionOfItsOwn, step, &id).eq(store.business_rows("co-commit").await, 0);

    let unit = expect_ok(
        store.begin().await,
        at(Rule::NoTransactionOfItsOwn, "begin", &id),
    );
    run_keyed_mutation(&unit, &id, "co-commit").await;
    expect_ok(
        unit.commit().await,
        at(Rule::NoTransactionOfItsOwn, "commit", &id),
    );
    let record = stored(&store, &id).await;
    let step = "read the claim and the write after the commit";
    at(Rule::NoTransactionOfItsOwn, step, &id).eq(record.state(), OperationState::Committed);
    at(Rule::NoTransactionOfItsOwn, step, &id).eq(store.business_rows("co-commit").await, 1);
}

/// Rule [`Rule::OneOwnerPerIdentity`]: 32 units on separate connections claim one identity at
/// once, over many identities: exactly one owns it; the others replay, are told it is in
/// progress, or time out as in flight.
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
        let step = "32 units claim a new identity at once";
        let mut owners = 0;
        for task in tasks {
            let answer = task.await.expect("task").and_then(|answer| answer);
            match answer {
                Ok(ClaimOutcome::Claimed { .. }) => owners += 1,
                Ok(ClaimOutcome::Completed(record)) => at(Rule::ClaimReplays, step, &id)
                    .eq(record.outcome_reference(), Some(&outcome(&key))),
                ref other if losing_answer_allowed(other, &capabilities) => {}
                other => at(Rule::ContentionIsRetryable, step, &id).fail(
                    "Claimed, Completed, InProgress, InFlight or a retryable error",
                    other,
                ),
            }
        }
        at(Rule::OneOwnerPerIdentity, step, &id).eq(owners, 1);
        at(Rule::OneOwnerPerIdentity, "count the business rows", &id)
            .eq(store.business_rows(&key).await, 1);
    }
}

/// Rule [`Rule::OneTransitionWins`]: 32 units race to complete one claim: exactly one wins (a
/// transition is one UPDATE conditional on state and version: ADR 0002).
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
    let step = "32 units finish one claim at once";
    let mut winners = Vec::new();
    for task in tasks {
        let answer = task.await.expect("task").and_then(|answer| answer);
        match answer {
            Ok(i) => winners.push(i),
            Err(LedgerError::AlreadyCompleted { .. }) => {}
            Err(LedgerError::Unavailable { .. }) if !capabilities.concurrent_writers => {}
            Err(LedgerError::Unavailable {
                kind: UnavailableKind::SerializationFailure,
            }) => {}
            other => at(Rule::OneTransitionWins, step, &id)
                .fail("Ok, AlreadyCompleted or a retryable error", other),
        }
    }
    at(Rule::OneTransitionWins, step, &id).check(
        winners.len() == 1,
        "exactly one winner",
        format_args!("winners {winners:?}"),
    );
    let record = stored(&*store, &id).await;
    at(Rule::TransitionRecords, "read the row after the race", &id)
        .eq(record.version, version.next());
}

/// Rule [`Rule::BoundedWaitBehindAClaim`]: a duplicate behind another unit's uncommitted claim
/// answers `InFlight` within the bound (on a single-writer store, whose units wait for the write
/// lock when they begin, `Unavailable`: the store is busy); after the first unit commits, a
/// duplicate replays.
pub async fn duplicate_behind_uncommitted_claim_is_in_flight<F: LedgerFixture>(fixture: &F) {
    let capabilities = fixture.capabilities();
    let bound = capabilities.claim_wait;
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "blocked");
    let holder = expect_ok(
        store.begin().await,
        at(
            Rule::BoundedWaitBehindAClaim,
            "begin the holder's unit",
            &id,
        ),
    );
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
    let step = "claim behind another unit's uncommitted claim";
    let busy = LedgerError::unavailable(UnavailableKind::StoreBusy);
    at(Rule::BoundedWaitBehindAClaim, step, &id).check(
        matches!(answer, Err(LedgerError::InFlight { .. }))
            || (!capabilities.concurrent_writers && answer == Err(busy)),
        "Err(InFlight)",
        &answer,
    );
    at(Rule::BoundedWaitBehindAClaim, step, &id).check(
        waited >= bound.mul_f64(0.5),
        format_args!("an answer after waiting about the bound, {bound:?}"),
        format_args!("an answer after {waited:?}"),
    );
    at(Rule::BoundedWaitBehindAClaim, step, &id).check(
        waited < bound + Duration::from_secs(3),
        format_args!("an answer within the bound, {bound:?}"),
        format_args!("an answer after {waited:?}"),
    );

    let committed = holder
        .ledger()
        .mark_committed(&id, version, &outcome("first"))
        .await;
    expect_ok(
        committed,
        at(Rule::TransitionRecords, "the holder commits its claim", &id),
    );
    expect_ok(
        holder.commit().await,
        at(
            Rule::NoTransactionOfItsOwn,
            "the holder commits its unit",
            &id,
        ),
    );
    let replay = store
        .autocommit()
        .claim(&id, &request("x"), lease(LONG))
        .await;
    at(
        Rule::ClaimReplays,
        "claim again after the holder committed",
        &id,
    )
    .check(
        matches!(replay, Ok(ClaimOutcome::Completed(_))),
        "Ok(Completed(record))",
        replay,
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
    let at_holder = at(
        Rule::OneOwnerPerIdentity,
        "the holder on the first primary finishes",
        &id,
    );
    let marked = holder
        .ledger()
        .mark_committed(&id, holder_version, &outcome("first"))
        .await;
    expect_ok(marked, at_holder);
    expect_ok(holder.commit().await, at_holder);
    // The store may tell the rival at its next statement or only at its commit.
    let found = rival.ledger().find(&id).await;
    let marked = match found {
        Ok(Some(record)) => rival
            .ledger()
            .mark_committed(&id, record.version, &outcome("second"))
            .await
            .map(|_| ()),
        Ok(None) => at(
            Rule::NoTransactionOfItsOwn,
            "the rival reads its own claim",
            &id,
        )
        .fail(
            "Ok(Some(record))",
            Ok::<_, LedgerError>(None::<OperationRecord>),
        ),
        Err(error) => Err(error),
    };
    let committed = match marked {
        Ok(()) => rival.commit().await,
        Err(error) => {
            let _ = rival.rollback().await;
            Err(error)
        }
    };
    at(
        Rule::OneOwnerPerIdentity,
        "the rival on another primary commits second",
        &id,
    )
    .eq(
        committed,
        Err(LedgerError::unavailable(
            UnavailableKind::SerializationFailure,
        )),
    );
    let record = replayed(&*store.autocommit(), &id, "x").await;
    at(Rule::ClaimReplays, "claim again after both committed", &id)
        .eq(record.outcome_reference(), Some(&outcome("first")));
}

/// Rule [`Rule::LostConnectionIsUnavailable`]: a unit's connection killed mid-way: nothing
/// half-written, `Unavailable`, and a retry on a new connection succeeds. Needs the fixture's
/// [`ConnectionKiller`](crate::ConnectionKiller) hook.
pub async fn killed_connection_is_unavailable_and_retry_succeeds<F: LedgerFixture>(fixture: &F) {
    let Some(killer) = fixture.connection_killer() else {
        return;
    };
    let store = fixture.fresh_store().await;
    let id = identity("tenant-a", CREATE, "killed");
    let unit = expect_ok(
        store.begin().await,
        at(Rule::LostConnectionIsUnavailable, "begin", &id),
    );
    let version = claim_new(&*unit.ledger(), &id, LONG).await;
    expect_ok(
        unit.business_write("killed").await,
        at(Rule::LostConnectionIsUnavailable, "business write", &id),
    );
    killer.kill_connection(&unit).await;
    let answer = unit
        .ledger()
        .mark_committed(&id, version, &outcome("p"))
        .await;
    let step = "mark committed on the killed connection";
    at(Rule::LostConnectionIsUnavailable, step, &id).check(
        matches!(answer, Err(LedgerError::Unavailable { .. })),
        "Err(Unavailable)",
        answer,
    );
    let _ = unit.rollback().await;
    let step = "look for the claim and the write after the kill";
    at(Rule::LostConnectionIsUnavailable, step, &id)
        .eq(store.autocommit().find(&id).await, Ok(None));
    at(Rule::LostConnectionIsUnavailable, step, &id).eq(store.business_rows("killed").await, 0);

    let retry = expect_ok(
        store.begin().await,
        at(Rule::LostConnectionIsUnavailable, "begin the retry", &id),
    );
    run_keyed_mutation(&retry, &id, "killed").await;
    expect_ok(
        retry.commit().await,
        at(Rule::LostConnectionIsUnavailable, "commit the retry", &id),
    );
    at(
        Rule::LostConnectionIsUnavailable,
        "count the business rows after the retry",
        &id,
    )
    .eq(store.business_rows("killed").await, 1);
}
