//! Who owns a version: claims racing with leases so short that takeovers never stop, outside
//! units of work and inside them, and duplicates that waited behind a claim.
//!
//! These cases look for defects that only show under real concurrency: a takeover whose UPDATE
//! re-checks the lease but not the version it read, a takeover that takes the new version from
//! the row it read, a takeover that does not check the row is still in progress, and a claim that
//! reads, then inserts, and calls the unique violation it meets after a wait "in flight".

use super::*;

/// How many identities the contended cases race on, tasks per identity, and claims per task.
const CONTENDED_IDENTITIES: usize = 2;
const CONTENDERS: usize = 24;
const ROUNDS: usize = 30;

/// Who was handed a version: (task, round).
type Owner = (usize, usize);

/// What the contenders of one identity saw, gathered while they ran and judged afterwards.
#[derive(Default)]
struct Contention {
    /// Every version handed to an owner, with the owner (task, round) it was handed to.
    owners: HashMap<Version, Owner>,
    /// A version handed to a second owner: (version, first owner, second owner).
    handed_twice: Vec<(Version, Owner, Owner)>,
    /// The outcome of every owner that finished the operation.
    finishers: Vec<String>,
    /// The outcome every replay carried.
    replays: Vec<Option<String>>,
    /// Owners whose own transition, in their own unit, was refused (LostOwnership, or
    /// AlreadyCompleted: they were handed an operation already finished).
    not_owners: Vec<String>,
    /// Answers no contended claim may give.
    unexpected: Vec<String>,
}

/// Contenders claim `id` over and over with leases of 1 to 3 ms, so that leases run out between
/// one contender's read and its update; in the last rounds, some owners finish the operation. In units when
/// `in_units` (each claim its own unit, committed), else on the autocommit ledger.
async fn contend<S: LedgerStore + 'static>(
    store: Arc<S>,
    caps: Capabilities,
    id: GrpcOperationIdentity,
    in_units: bool,
) -> Contention {
    let seen = Arc::new(Mutex::new(Contention::default()));
    let tasks: Vec<_> = (0..CONTENDERS)
        .map(|task| {
            let (store, id, seen) = (Arc::clone(&store), id.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let short = lease(1 + (round % 3) as u64);
                    // Owners finish only in the last rounds, so that takeovers race for most
                    // of the run; then the finished row must stay finished.
                    let finishes = round >= ROUNDS - 5 && (task + round) % 5 == 0;
                    let reference = format!("t{task}-r{round}");
                    let (answer, finished) = if in_units {
                        claim_in_unit(&*store, &id, short, finishes.then_some(&reference)).await
                    } else {
                        let ledger = store.autocommit();
                        let answer = ledger.claim(&id, &request("x"), short).await;
                        let finished = match (&answer, finishes) {
                            (Ok(ClaimOutcome::Claimed { version, .. }), true) => ledger
                                .mark_committed(&id, *version, &outcome(&reference))
                                .await
                                .is_ok(),
                            _ => false,
                        };
                        (answer, finished)
                    };
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    match &answer {
                        Ok(ClaimOutcome::Claimed { version, .. }) => {
                            if let Some(first) = seen.owners.insert(*version, (task, round)) {
                                seen.handed_twice.push((*version, first, (task, round)));
                            }
                            if finished {
                                seen.finishers.push(reference);
                            }
                        }
                        Ok(ClaimOutcome::Completed(record)) => seen
                            .replays
                            .push(record.outcome_reference().map(|o| o.as_str().to_owned())),
                        other if losing_answer_allowed(other, &caps) => {}
                        Err(
                            lost @ (LedgerError::LostOwnership { .. }
                            | LedgerError::AlreadyCompleted { .. }),
                        ) if in_units => seen
                            .not_owners
                            .push(format!("task {task} round {round}: {lost:?}")),
                        other => seen.unexpected.push(format!("{other:?}")),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a contender task panicked");
    }
    Arc::try_unwrap(seen)
        .ok()
        .expect("every contender has ended")
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
}

/// One claim in a unit of its own, finished with `reference` when given; the unit is committed
/// when the claim owns the identity. A claim whose unit did not commit was never handed out.
async fn claim_in_unit<S: LedgerStore>(
    store: &S,
    id: &GrpcOperationIdentity,
    short: LeaseDuration,
    reference: Option<&String>,
) -> (Result<ClaimOutcome, LedgerError>, bool) {
    let unit = match store.begin().await {
        Ok(unit) => unit,
        Err(error) => return (Err(error), false),
    };
    let answer = unit.ledger().claim(id, &request("x"), short).await;
    let Ok(ClaimOutcome::Claimed { version, .. }) = &answer else {
        let _ = unit.rollback().await;
        return (answer, false);
    };
    let finished = match reference {
        Some(reference) => {
            let marked = unit
                .ledger()
                .mark_committed(id, *version, &outcome(reference))
                .await;
            if let Err(error) = marked {
                // An owner that cannot finish its own claim inside its own unit was not the
                // owner: reported as the answer the claim amounted to.
                let _ = unit.rollback().await;
                return (Err(error), false);
            }
            true
        }
        None => false,
    };
    match unit.commit().await {
        Ok(()) => (answer, finished),
        Err(error) => (Err(error), false),
    }
}

/// Judges what the contenders of `id` saw, then the row they left.
async fn judge<S: LedgerStore>(store: &S, id: &GrpcOperationIdentity, seen: Contention, how: &str) {
    let step = format!("{CONTENDERS} tasks x {ROUNDS} claims with 1-3 ms leases, {how}");
    if let Some(unexpected) = seen.unexpected.first() {
        at(Rule::ContentionIsRetryable, &step, id).fail(
            "Claimed, Completed, InProgress, InFlight or a retryable Unavailable",
            format_args!(
                "{unexpected} ({} such answers in all)",
                seen.unexpected.len()
            ),
        );
    }
    if let Some((version, first, second)) = seen.handed_twice.first() {
        at(Rule::OneOwnerPerVersion, &step, id).fail(
            "every Claimed answer carries a version no other owner was handed",
            format_args!(
                "version {} handed to task {} (round {}) and to task {} (round {}); {} versions \
                 handed twice out of {} owners",
                version.to_stored(),
                first.0,
                first.1,
                second.0,
                second.1,
                seen.handed_twice.len(),
                seen.owners.len() + seen.handed_twice.len()
            ),
        );
    }
    if let Some(refused) = seen.not_owners.first() {
        at(Rule::OneOwnerPerVersion, &step, id).fail(
            "an owner finishes its own claim inside its own unit",
            format_args!(
                "{refused}: the version it was handed had moved on or was already finished ({} \
                 such owners)",
                seen.not_owners.len()
            ),
        );
    }
    at(Rule::FinishedOnce, &step, id).check(
        seen.finishers.len() <= 1,
        "at most one owner marks the operation committed",
        format_args!(
            "{} owners committed it: {:?}",
            seen.finishers.len(),
            seen.finishers
        ),
    );
    let row = store.autocommit().find(id).await;
    let row = expect_ok(row, at(Rule::FinishedOnce, "read the contended row", id));
    let recorded = row
        .as_ref()
        .and_then(|row| row.outcome_reference().map(|o| o.as_str().to_owned()));
    at(
        Rule::FinishedOnce,
        "compare the row with the owner that finished it",
        id,
    )
    .eq(recorded.clone(), seen.finishers.first().cloned());
    if let Some(replay) = seen.replays.iter().find(|replay| **replay != recorded) {
        at(
            Rule::FinishedOnce,
            "compare every replay with the stored outcome",
            id,
        )
        .fail(format_args!("{recorded:?}"), replay);
    }
}

/// Rule [`Rule::OneOwnerPerVersion`], outside units of work (the claim-first mode): claims with
/// leases so short that takeovers race constantly never hand one version to two owners, and at
/// most one owner finishes the operation.
pub async fn contended_claims_never_hand_a_version_twice<F: LedgerFixture>(fixture: &F) {
    let caps = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    for n in 0..CONTENDED_IDENTITIES {
        let id = identity("tenant-a", CREATE, &format!("contended-{n}"));
        let seen = contend(Arc::clone(&store), caps, id.clone(), false).await;
        judge(&*store, &id, seen, "each claim committing on its own").await;
    }
}

/// Rule [`Rule::OneOwnerPerVersion`] inside units of work: the same race, each claim (and the
/// finishing transition, when there is one) in a unit of its own that commits.
pub async fn contended_claims_in_units_never_hand_a_version_twice<F: LedgerFixture>(fixture: &F) {
    let caps = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    for n in 0..CONTENDED_IDENTITIES {
        let id = identity("tenant-a", CREATE, &format!("contended-in-units-{n}"));
        let seen = contend(Arc::clone(&store), caps, id.clone(), true).await;
        judge(&*store, &id, seen, "each claim in a unit of its own").await;
    }
}

/// Rule [`Rule::WaiterReplaysTheCommit`]: a duplicate claim that waits behind another unit's
/// uncommitted claim, and is still waiting when that unit commits, replays the committed
/// operation. Five rounds, so that the duplicate has certainly been waiting in some.
pub async fn duplicate_that_waited_replays_once_the_holder_commits<F: LedgerFixture>(fixture: &F) {
    let caps = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    for round in 0..5 {
        let key = format!("waited-{round}");
        let id = identity("tenant-a", CREATE, &key);
        let holder = expect_ok(
            store.begin().await,
            at(Rule::WaiterReplaysTheCommit, "begin the holder's unit", &id),
        );
        let version = claim_new(&*holder.ledger(), &id, LONG).await;
        expect_ok(
            holder.business_write(&key).await,
            at(
                Rule::WaiterReplaysTheCommit,
                "the holder's business write",
                &id,
            ),
        );
        let waiter = {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let unit = store.begin().await?;
                let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
                let waited = started.elapsed();
                // On another primary the duplicate does not wait: it claims too. Which of two
                // such owners may commit is `duplicate_behind_uncommitted_claim_is_in_flight`'s
                // question; here the rival steps back so that the holder's commit is the one.
                let _ = unit.rollback().await;
                Ok::<_, LedgerError>((answer, waited))
            })
        };
        // The duplicate is now waiting behind the holder's claim; the holder commits well within
        // the claim wait.
        tokio::time::sleep(caps.claim_wait / 4).await;
        let committed = holder
            .ledger()
            .mark_committed(&id, version, &outcome(&key))
            .await;
        expect_ok(
            committed,
            at(
                Rule::WaiterReplaysTheCommit,
                "the holder marks its claim committed",
                &id,
            ),
        );
        expect_ok(
            holder.commit().await,
            at(
                Rule::WaiterReplaysTheCommit,
                "the holder commits its unit",
                &id,
            ),
        );
        let step = "the duplicate that waited behind the holder answers after the holder committed";
        let waited = tokio::time::timeout(caps.claim_wait + Duration::from_secs(5), waiter).await;
        let Ok(joined) = waited else {
            at(Rule::BoundedWaitBehindAClaim, step, &id).fail(
                "an answer within the claim wait",
                format_args!(
                    "no answer after {:?}",
                    caps.claim_wait + Duration::from_secs(5)
                ),
            );
        };
        let (answer, waited) = match joined.expect("the waiter's task panicked") {
            Ok((answer, waited)) => (answer, waited),
            Err(error) => (Err(error), Duration::ZERO),
        };
        // The holder commits a quarter of the claim wait in; a loaded machine can stall it past
        // the wait, and then a retryable answer after the full wait keeps the other rule.
        let held_too_long = waited >= caps.claim_wait.mul_f64(0.9);
        match answer {
            Ok(ClaimOutcome::Completed(record)) => {
                at(Rule::WaiterReplaysTheCommit, step, &id).eq(
                    record.outcome_reference().map(OutcomeReference::as_str),
                    Some(key.as_str()),
                );
            }
            Ok(ClaimOutcome::Claimed { .. }) if caps.multi_primary => {}
            // On another primary, the holder's commit arriving can end the waiter's own insert.
            Err(LedgerError::Unavailable {
                kind: UnavailableKind::SerializationFailure,
            }) if caps.multi_primary => {}
            Err(LedgerError::InFlight { .. } | LedgerError::Unavailable { .. })
                if held_too_long => {}
            // A single-writer store's unit may wait for the write lock when it begins and give
            // up before the holder commits.
            Err(LedgerError::Unavailable { .. } | LedgerError::InFlight { .. })
                if !caps.concurrent_writers => {}
            other => at(Rule::WaiterReplaysTheCommit, step, &id)
                .fail("Ok(Completed(the holder's record))", other),
        }
        let rows = store.business_rows(&key).await;
        at(
            Rule::OneOwnerPerIdentity,
            "count the operation's business rows",
            &id,
        )
        .eq(rows, 1);
    }
}

/// Rule [`Rule::BoundedWaitBehindTheTable`]: while another connection holds a lock on the whole
/// ledger table (DDL, `LOCK TABLE`, an index build), a claim of a fresh identity, on its own and
/// inside a unit of work, answers a retryable error within the claim wait (plus two seconds of
/// slack) instead of waiting for the lock's holder; once the lock is released, claims work.
/// Needs the fixture's [`TableLocking`](crate::TableLocking) hook.
pub async fn claims_are_bounded_behind_a_table_lock<F: LedgerFixture>(fixture: &F) {
    let Some(locking) = fixture.table_locking() else {
        return;
    };
    let caps = fixture.capabilities();
    let store = Arc::new(fixture.fresh_store().await);
    let allowed = caps.claim_wait + Duration::from_secs(2);
    let held = locking.lock_ledger_table(&store).await;
    let mut answers = Vec::new();
    for (how, in_unit) in [("on its own", false), ("inside a unit of work", true)] {
        let id = identity("tenant-a", CREATE, &format!("behind-the-table-{in_unit}"));
        let started = Instant::now();
        let claim = {
            let (store, id) = (Arc::clone(&store), id.clone());
            tokio::spawn(async move {
                if in_unit {
                    let unit = store.begin().await?;
                    let answer = unit.ledger().claim(&id, &request("x"), lease(LONG)).await;
                    let _ = unit.rollback().await;
                    answer
                } else {
                    store
                        .autocommit()
                        .claim(&id, &request("x"), lease(LONG))
                        .await
                }
            })
        };
        // Bounded here too, so that a claim that waits for ever fails the case at once instead
        // of hanging it; the task is left to end when the lock is released.
        let answer = tokio::time::timeout(allowed + Duration::from_secs(3), claim).await;
        let waited = started.elapsed();
        answers.push((
            how,
            id,
            answer.map(|joined| joined.expect("claim task")),
            waited,
        ));
    }
    held.release().await;
    for (how, id, answer, waited) in answers {
        let step = format!("claim a fresh identity {how} while the ledger table is locked");
        let at = at(Rule::BoundedWaitBehindTheTable, &step, &id);
        match answer {
            Ok(Err(LedgerError::InFlight { .. } | LedgerError::Unavailable { .. })) => at.check(
                waited <= allowed,
                format_args!("an answer within {allowed:?}"),
                format_args!("an answer after {waited:?}"),
            ),
            Ok(other) => at.fail("Err(InFlight) or Err(Unavailable)", other),
            Err(_) => at.fail(
                format_args!("an answer within {allowed:?}"),
                format_args!("no answer after {waited:?}"),
            ),
        }
    }
    let id = identity("tenant-a", CREATE, "after-the-table-lock");
    claim_new(&*store.autocommit(), &id, LONG).await;
}
