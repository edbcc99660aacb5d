//! The contract's cases, one public async function each. Every case begins with a fresh store.
//! A case fails by panicking with a message that says which rule was broken.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, Completion, GrpcMethod, GrpcOperationIdentity,
    GrpcOperationLedger, IdempotencyKey, KeyHasher, LeaseDuration, LedgerError, OperationRecord,
    OperationState, OutcomeReference, RecordOutcome, RecordedFailure, RequestFingerprint,
    UnavailableKind, Version,
};

use std::io::Write;

use crate::{Capabilities, LedgerFixture, LedgerStore, RawRow, UnitOfWork};

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

fn identity(caller: &str, method: &str, key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::parse(caller).expect("valid caller"),
        GrpcMethod::parse(method).expect("valid method"),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).expect("valid key")),
    )
}

fn request(body: &str) -> RequestFingerprint {
    RequestFingerprint::of(body.as_bytes())
}

fn lease(millis: u64) -> LeaseDuration {
    LeaseDuration::new(Duration::from_millis(millis)).expect("valid lease")
}

fn outcome(reference: &str) -> OutcomeReference {
    OutcomeReference::parse(reference).expect("valid outcome")
}

fn failure(message: &str) -> RecordedFailure {
    RecordedFailure::new(tonic::Code::FailedPrecondition, message).expect("valid failure")
}

const LONG: u64 = 60_000;

/// Claims a new identity and returns the owner's version, failing the case on any other answer.
async fn claim_new(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    lease_millis: u64,
) -> Version {
    match ledger.claim(id, &request("x"), lease(lease_millis)).await {
        Ok(ClaimOutcome::Claimed {
            version,
            took_over: false,
        }) => version,
        other => panic!("a claim of a new identity must own it, got {other:?}"),
    }
}

/// Claims a new identity and commits it with `reference`; returns the version after the commit.
async fn claim_and_commit(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    reference: &str,
) -> Version {
    let version = claim_new(ledger, id, LONG).await;
    ledger
        .mark_committed(id, version, &outcome(reference))
        .await
        .expect("the owner commits")
}

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
    let record = store
        .autocommit()
        .find(&id)
        .await
        .expect("find")
        .expect("row");
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
    let record = store
        .autocommit()
        .find(&id)
        .await
        .expect("find")
        .expect("row");
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

/// `purge` deletes only finished rows completed more than the retention ago by the store's
/// clock, at most `limit`, never an in-progress one.
pub async fn purge_deletes_only_old_finished_rows<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    for n in 0..5 {
        let id = identity("tenant-a", CREATE, &format!("old-{n}"));
        let version = claim_new(&*ledger, &id, LONG).await;
        if n % 2 == 0 {
            ledger
                .mark_committed(&id, version, &outcome("p"))
                .await
                .expect("commit");
        } else {
            ledger
                .mark_failed(&id, version, &failure("f"))
                .await
                .expect("fail");
        }
    }
    let open = identity("tenant-a", CREATE, "open");
    claim_new(&*ledger, &open, 1).await;
    // The old rows age past the retention by the store's clock; the young one is finished just
    // before the purge, well within it.
    let retention = Duration::from_millis(1_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let young = identity("tenant-a", CREATE, "young");
    claim_and_commit(&*ledger, &young, "p").await;

    let limit = |n| NonZeroU32::new(n).expect("non-zero");
    assert_eq!(ledger.purge(retention, limit(3)).await, Ok(3));
    assert_eq!(ledger.purge(retention, limit(100)).await, Ok(2));
    assert_eq!(ledger.purge(retention, limit(100)).await, Ok(0));
    assert!(
        ledger.find(&open).await.expect("find").is_some(),
        "IN_PROGRESS is never purged"
    );
    assert!(
        ledger.find(&young).await.expect("find").is_some(),
        "rows younger than the retention stay"
    );
    assert_eq!(store.ledger_rows().await, 2);
}

/// Rows written around the adapter (a support script, a backfill) that a replay could not use are
/// refused by the store itself; a legal one is accepted, so the refusals are the rules at work.
pub async fn store_refuses_rows_it_could_not_replay<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let committed = |outcome| RawRow {
        state: "COMMITTED",
        completed: true,
        outcome_reference: outcome,
        failure_code: None,
        failure_message: None,
    };
    let failed = |code, message| RawRow {
        state: "FAILED_TERMINAL",
        completed: true,
        outcome_reference: None,
        failure_code: code,
        failure_message: message,
    };
    assert!(
        store.write_raw_row(committed(Some("payment-1"))).await,
        "a legal committed row must be accepted"
    );
    assert!(
        store.write_raw_row(failed(Some(9), Some(""))).await,
        "a failure with an empty message is legal"
    );
    let too_long = "\u{e9}".repeat(600); // 1200 bytes
    let illegal = [
        ("a committed row with an empty outcome", committed(Some(""))),
        ("a committed row without an outcome", committed(None)),
        ("an outcome over 1024 bytes", committed(Some(&too_long))),
        ("a failure with code OK", failed(Some(0), Some("m"))),
        ("a failure without a code", failed(None, Some("m"))),
        (
            "a failure message over 1024 bytes",
            failed(Some(9), Some(&too_long)),
        ),
        (
            "a finished row without a completion time",
            RawRow {
                completed: false,
                ..committed(Some("p"))
            },
        ),
        (
            "an unknown state",
            RawRow {
                state: "DONE",
                ..committed(Some("p"))
            },
        ),
        (
            "a state stored as an ordinal",
            RawRow {
                state: "1",
                ..committed(Some("p"))
            },
        ),
    ];
    for (what, row) in illegal {
        assert!(!store.write_raw_row(row).await, "the store accepted {what}");
    }
    assert_eq!(
        store.ledger_rows().await,
        2,
        "only the legal rows are stored"
    );
}

/// Sixteen processes start together on a store without the ledger's schema and each applies the
/// migrations: every start succeeds, and the ledger then works. Runs on stores with the
/// `migrations` capability.
pub async fn concurrent_starts_migrate_once<F: LedgerFixture>(fixture: &F) {
    if !applies("concurrent_starts_migrate_once", &fixture.capabilities()) {
        return;
    }
    let store = Arc::new(fixture.fresh_unmigrated_store().await);
    let starts: Vec<_> = (0..16)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for start in starts {
        start
            .await
            .expect("task")
            .expect("every concurrent start migrates");
    }
    claim_and_commit(
        &*store.autocommit(),
        &identity("tenant-a", CREATE, "migrated"),
        "p",
    )
    .await;
}

/// Bad input is refused by the checked constructors before any call, so nothing is written.
pub async fn bad_input_never_writes_a_row<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let bad_keys = ["", " ", "k\n", "caf\u{e9}", &"k".repeat(256)];
    let bad_methods = [
        "Svc/M",
        "/Svc",
        "//M",
        "/a.B/",
        "/a B/M",
        "/a.B/M;DROP TABLE x",
    ];
    let bad_callers = ["", "a|b", "tenant a"];
    for key in bad_keys {
        assert!(
            IdempotencyKey::parse(key).is_err(),
            "key {key:?} must be refused"
        );
    }
    for method in bad_methods {
        assert!(
            GrpcMethod::parse(method).is_err(),
            "method {method:?} must be refused"
        );
    }
    for caller in bad_callers {
        assert!(
            CallerFingerprint::parse(caller).is_err(),
            "caller {caller:?} must be refused"
        );
    }
    assert!(OutcomeReference::parse("").is_err());
    // Hostile but valid text is stored verbatim through bound parameters, never executed.
    let hostile = identity("x';DROP_TABLE--", CREATE, "k';DELETE/**/FROM/**/t;--");
    let version = claim_new(&*ledger, &hostile, LONG).await;
    let evil = outcome("'); DROP TABLE grpc_operation_ledger; --");
    ledger
        .mark_committed(&hostile, version, &evil)
        .await
        .expect("commit");
    let record = ledger.find(&hostile).await.expect("find").expect("row");
    assert_eq!(record.outcome_reference(), Some(&evil));
    assert_eq!(
        store.ledger_rows().await,
        1,
        "only the one valid claim was written"
    );
}

/// How one case ended on one store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseOutcome {
    /// Every rule the case checks held.
    Passed,
    /// A rule was broken: the case's panic message (or a timeout).
    Failed(String),
    /// The store cannot run the case (a capability it lacks), with why.
    NotApplicable(&'static str),
}

/// How every case ended on one store, in the order they ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteReport {
    /// Each case's name and outcome.
    pub cases: Vec<(&'static str, CaseOutcome)>,
}

impl SuiteReport {
    /// The cases that failed, with their messages.
    pub fn failures(&self) -> Vec<(&'static str, &str)> {
        self.cases
            .iter()
            .filter_map(|(case, outcome)| match outcome {
                CaseOutcome::Failed(why) => Some((*case, why.as_str())),
                _ => None,
            })
            .collect()
    }

    /// The cases the store could not run.
    pub fn not_applicable(&self) -> Vec<&'static str> {
        self.cases
            .iter()
            .filter(|(_, outcome)| matches!(outcome, CaseOutcome::NotApplicable(_)))
            .map(|(case, _)| *case)
            .collect()
    }
}

// --- write-once: the finished row recorded in one step (`record_finished`) --------------------

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
    let record = store
        .autocommit()
        .find(&id)
        .await
        .expect("find")
        .expect("row");
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
    let row = store
        .autocommit()
        .find(&id)
        .await
        .expect("find")
        .expect("row");
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
    let record = store
        .autocommit()
        .find(&id)
        .await
        .expect("find")
        .expect("row");
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

/// Claims `id` again (with request `body`) and expects the finished record back: a replay.
async fn replayed(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    body: &str,
) -> OperationRecord {
    match ledger.claim(id, &request(body), lease(LONG)).await {
        Ok(ClaimOutcome::Completed(record)) => record,
        other => panic!("a claim of a finished operation must replay it, got {other:?}"),
    }
}

/// A committed completion with `reference` as its outcome.
fn done(reference: &str) -> Completion {
    Completion::Committed(outcome(reference))
}

/// Why `case` cannot run on a store with `capabilities`, or `None` when it can.
pub fn not_applicable(case: &str, capabilities: &Capabilities) -> Option<&'static str> {
    match case {
        "killed_connection_is_unavailable_and_retry_succeeds" if !capabilities.kill_connection => {
            Some("the store cannot kill a unit of work's connection from outside")
        }
        "concurrent_starts_migrate_once" if !capabilities.migrations => {
            Some("the store has no schema to migrate")
        }
        _ => None,
    }
}

/// Whether `case` applies; when it does not, says so on the test output, past the test
/// harness's capture, so that a case that did not run is never mistaken for one that passed.
fn applies(case: &str, capabilities: &Capabilities) -> bool {
    let Some(why) = not_applicable(case, capabilities) else {
        return true;
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "contract case `{case}`: NOT APPLICABLE to this store: {why}"
    );
    false
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The names of every case, in the order `run_all` runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every case that applies to the store on its own task and reports how each ended.
        pub async fn run_report<F: LedgerFixture + 'static>(fixture: Arc<F>) -> SuiteReport {
            let capabilities = fixture.capabilities();
            let mut cases = Vec::new();
            $(
                let outcome = match not_applicable(stringify!($case), &capabilities) {
                    Some(why) => CaseOutcome::NotApplicable(why),
                    None => {
                        let f = Arc::clone(&fixture);
                        let task = tokio::spawn(async move { $case(&*f).await });
                        match tokio::time::timeout(CASE_TIMEOUT, task).await {
                            Ok(Ok(())) => CaseOutcome::Passed,
                            Ok(Err(error)) => CaseOutcome::Failed(panic_message(error)),
                            Err(_) => CaseOutcome::Failed("timed out".to_owned()),
                        }
                    }
                };
                cases.push((stringify!($case), outcome));
            )*
            SuiteReport { cases }
        }

        /// Generates one named `#[tokio::test]` per case, each on a fixture from `$fixture`
        /// (an async expression evaluated per test). A case the store cannot run prints
        /// `NOT APPLICABLE` with the reason.
        #[macro_export]
        macro_rules! ledger_contract_tests {
            ($fixture:expr) => {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $case() {
                        let fixture = $fixture;
                        $crate::cases::$case(&fixture).await;
                    }
                )*
            };
        }
    };
}

const CASE_TIMEOUT: Duration = Duration::from_secs(120);

fn panic_message(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "panicked".to_owned()),
        Err(error) => error.to_string(),
    }
}

/// Runs the whole suite and panics listing every case that failed; lists the cases the store
/// could not run.
pub async fn run_all<F: LedgerFixture + 'static>(fixture: Arc<F>) {
    let report = run_report(fixture).await;
    for (case, outcome) in &report.cases {
        if let CaseOutcome::NotApplicable(why) = outcome {
            let _ = writeln!(
                std::io::stdout().lock(),
                "contract case `{case}`: NOT APPLICABLE to this store: {why}"
            );
        }
    }
    let failures = report.failures();
    assert!(
        failures.is_empty(),
        "the store broke the ledger contract in {} case(s):\n{}",
        failures.len(),
        failures
            .iter()
            .map(|(case, why)| format!("- {case}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

suite!(
    claim_new_identity,
    claim_after_commit_replays,
    claim_after_failure_replays_the_failure,
    other_caller_or_method_is_independent,
    key_reused_with_another_request_is_refused,
    transitions_without_claim_are_not_claimed,
    transitions_twice_are_already_completed,
    transitions_with_stale_version_lose_ownership,
    expired_lease_is_taken_over_and_old_owner_fenced,
    stale_owner_cannot_complete_a_claim_made_after_purge,
    racing_takeovers_of_an_expired_claim_have_one_winner,
    claims_under_contention_never_answer_internal,
    store_refuses_rows_it_could_not_replay,
    concurrent_starts_migrate_once,
    co_commit_rolls_back_and_commits_together,
    concurrent_claims_have_exactly_one_owner,
    concurrent_transitions_have_exactly_one_winner,
    duplicate_behind_uncommitted_claim_is_in_flight,
    killed_connection_is_unavailable_and_retry_succeeds,
    purge_deletes_only_old_finished_rows,
    bad_input_never_writes_a_row,
    record_finished_writes_once_and_replays,
    record_finished_with_another_request_is_refused,
    record_finished_over_a_live_claim_is_in_progress,
    concurrent_records_have_exactly_one_winner,
);
