//! Identity isolation: two identities that differ in exactly one part (caller, method or key) are
//! two operations to every port call. An adapter whose primary key holds all three parts but one
//! of whose statements leaves a part out of its WHERE clause (or whose digest of the identity
//! leaves it out) passes a claim of a fresh identity and fails here: the neighbour's `find`
//! returns the other's row, its resend replays the other's outcome, its transition finishes the
//! other's claim.
//!
//! Each case runs every neighbour pair in both orders (A is the base identity and B its
//! neighbour, then the other way round), each pair under keys of its own.

use super::*;

/// The part in which two neighbouring identities differ (named in their keys, so that a failure
/// message's identity says which pair it was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Caller,
    Method,
    Key,
}

const REFUND: &str = "/payments.v1.Payments/Refund";

/// A pair of neighbours: `a` and `b` agree in every part but one.
struct Pair {
    a: GrpcOperationIdentity,
    b: GrpcOperationIdentity,
}

impl Pair {
    /// The rule every isolation check names, at `step`, about `id`.
    fn at<'a>(&self, step: &'a str, id: &'a GrpcOperationIdentity) -> At<'a> {
        at(Rule::IdentityHasThreeParts, step, id)
    }

    /// A's resend replays A's committed outcome `a`, and B's replays B's own, committed as
    /// `b_outcome`.
    async fn each_replays_its_own(&self, ledger: &dyn GrpcOperationLedger, b_outcome: &str) {
        let step = "each replays its own outcome";
        let replay_a = replayed(ledger, &self.a, BODY).await;
        self.at(step, &self.a)
            .eq(replay_a.outcome_reference(), Some(&outcome("a")));
        let replay_b = replayed(ledger, &self.b, BODY).await;
        self.at(step, &self.b)
            .eq(replay_b.outcome_reference(), Some(&outcome(b_outcome)));
    }
}

/// The base identity under `key` and its neighbour that differs from it in `part` alone.
fn neighbours(part: Part, key: &str) -> (GrpcOperationIdentity, GrpcOperationIdentity) {
    let base = identity("tenant-a", CREATE, key);
    let neighbour = match part {
        Part::Caller => identity("tenant-b", CREATE, key),
        Part::Method => identity("tenant-a", REFUND, key),
        Part::Key => identity("tenant-a", CREATE, &format!("{key}-other")),
    };
    (base, neighbour)
}

/// Every neighbour pair of the case `case`, in both orders (the base identity as A, then as B):
/// six pairs, each under keys no other pair of the case uses, so that they can share one store.
fn pairs(case: &str) -> Vec<Pair> {
    let mut pairs = Vec::new();
    for part in [Part::Caller, Part::Method, Part::Key] {
        let (base, neighbour) = neighbours(part, &format!("{case}-{part:?}"));
        pairs.push(Pair {
            a: base,
            b: neighbour,
        });
        let (base, neighbour) = neighbours(part, &format!("{case}-{part:?}-reversed"));
        pairs.push(Pair {
            a: neighbour,
            b: base,
        });
    }
    pairs
}

/// Both identities send the same request body: the worst case, where a read that matched the
/// neighbour's row would find a matching fingerprint and replay the neighbour's outcome.
const BODY: &str = "same-body";

async fn claim_version(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    lease_millis: u64,
    at: At<'_>,
) -> Version {
    match ledger.claim(id, &request(BODY), lease(lease_millis)).await {
        Ok(ClaimOutcome::Claimed {
            version,
            took_over: false,
        }) => version,
        other => at.fail(
            "Ok(Claimed { version, took_over: false }): a new operation",
            other,
        ),
    }
}

/// Rule [`Rule::IdentityHasThreeParts`]: while A is finished, its neighbour B (same key under
/// another caller, the same caller and key under another method, or another key) finds no row,
/// looks up none, cannot finish or renew with A's versions, and then claims, finishes and replays
/// an operation of its own; A's row is untouched throughout.
pub async fn neighbours_of_a_finished_operation_see_nothing_of_it<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    for pair in pairs("finished") {
        let (a, b) = (&pair.a, &pair.b);
        let a_claimed = claim_version(&*ledger, a, LONG, pair.at("A claims", a)).await;
        let a_done = ledger.mark_committed(a, a_claimed, &outcome("a")).await;
        let a_done = expect_ok(a_done, at(Rule::TransitionRecords, "A commits", a));
        let a_row = stored(&store, a).await;
        let step = "B reads while only A (its neighbour) has a row";
        pair.at(step, b).eq(ledger.find(b).await, Ok(None));
        pair.at(step, b).eq(ledger.look_up(b).await, Ok(None));
        for a_version in [a_claimed, a_done] {
            let step = "B, which has no row, finishes or renews with one of A's versions";
            pair.at(step, b).eq(
                ledger.mark_committed(b, a_version, &outcome("b")).await,
                Err(LedgerError::NotClaimed),
            );
            pair.at(step, b).eq(
                ledger.mark_failed(b, a_version, &failure("b")).await,
                Err(LedgerError::NotClaimed),
            );
            pair.at(step, b).eq(
                ledger.renew_lease(b, a_version, lease(LONG)).await,
                Err(LedgerError::NotClaimed),
            );
        }
        pair.at("A's row after B's refused calls", a)
            .eq(stored(&store, a).await, a_row.clone());
        // B's first claim is a new operation at a version of its own, and finishes on its own.
        let b_claimed = claim_version(&*ledger, b, LONG, pair.at("B claims", b)).await;
        pair.at("B's fresh version", b).check(
            b_claimed != a_claimed && b_claimed != a_done,
            "a version none of A's owners held",
            (b_claimed, a_claimed, a_done),
        );
        let b_done = ledger.mark_failed(b, b_claimed, &failure("b")).await;
        expect_ok(b_done, at(Rule::TransitionRecords, "B fails terminally", b));
        pair.at("A's row after B finished", a)
            .eq(stored(&store, a).await, a_row.clone());
        let step = "each replays its own outcome";
        let replay_a = replayed(&*ledger, a, BODY).await;
        pair.at(step, a)
            .eq(replay_a.outcome_reference(), Some(&outcome("a")));
        let replay_b = replayed(&*ledger, b, BODY).await;
        pair.at(step, b).eq(replay_b.failure(), Some(&failure("b")));
    }
}

/// Rule [`Rule::IdentityHasThreeParts`]: A's live claim does not hold its neighbour back: B's
/// claim owns an operation of its own, B's resend sees B's claim, A's version used on B's row is
/// refused as a lost ownership and leaves A's row alone, and once A commits, B's resend is still
/// in progress (never a replay of A's outcome).
pub async fn neighbours_of_a_live_claim_are_not_held_by_it<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    for pair in pairs("live") {
        let (a, b) = (&pair.a, &pair.b);
        let a_version = claim_version(&*ledger, a, LONG, pair.at("A claims", a)).await;
        let b_version =
            claim_version(&*ledger, b, LONG, pair.at("B claims while A is live", b)).await;
        let a_row = stored(&store, a).await;
        let step = "B resends while A and B are both live";
        match ledger.claim(b, &request(BODY), lease(LONG)).await {
            Ok(ClaimOutcome::InProgress { record, .. }) if record.version == b_version => {}
            other => pair
                .at(step, b)
                .fail("Ok(InProgress) with B's own record", other),
        }
        let step = "B reads its row while A is live";
        let b_found = expect_ok(ledger.find(b).await, pair.at(step, b));
        pair.at(step, b)
            .eq(b_found.map(|row| row.version), Some(b_version));
        let b_looked_up = expect_ok(ledger.look_up(b).await, pair.at(step, b));
        pair.at(step, b)
            .eq(b_looked_up.map(|(row, _)| row.version), Some(b_version));
        let lost = LedgerError::LostOwnership {
            expected: a_version,
            current: b_version,
        };
        let step = "B's row finished or renewed with A's version";
        pair.at(step, b).eq(
            ledger.mark_committed(b, a_version, &outcome("b")).await,
            Err(lost.clone()),
        );
        pair.at(step, b).eq(
            ledger.mark_failed(b, a_version, &failure("b")).await,
            Err(lost.clone()),
        );
        pair.at(step, b).eq(
            ledger.renew_lease(b, a_version, lease(LONG)).await,
            Err(lost),
        );
        pair.at("A's row after B's refused calls", a)
            .eq(stored(&store, a).await, a_row);
        let a_done = ledger.mark_committed(a, a_version, &outcome("a")).await;
        expect_ok(a_done, at(Rule::TransitionRecords, "A commits", a));
        let step = "B resends after A committed";
        match ledger.claim(b, &request(BODY), lease(LONG)).await {
            Ok(ClaimOutcome::InProgress { record, .. }) if record.version == b_version => {}
            other => pair.at(step, b).fail(
                "Ok(InProgress) with B's own record (never A's outcome)",
                other,
            ),
        }
        let renewed = ledger.renew_lease(b, b_version, lease(LONG)).await;
        expect_ok(
            renewed,
            at(Rule::RenewalKeepsTheOwner, "B renews its own lease", b),
        );
        let b_done = ledger.mark_committed(b, b_version, &outcome("b")).await;
        expect_ok(
            b_done,
            at(Rule::TransitionRecords, "B commits its own claim", b),
        );
        pair.each_replays_its_own(&*ledger, "b").await;
    }
}

/// Rule [`Rule::IdentityHasThreeParts`]: an expired claim is taken over only by a resend of its
/// own identity: B's claim next to A's expired one is a new operation, A's resend takes over A's
/// row alone (B's owner still finishes its own), and A's old owner is fenced off A only.
pub async fn neighbours_of_an_expired_claim_do_not_take_it_over<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let pairs = pairs("expired");
    let mut a_versions = Vec::new();
    for pair in &pairs {
        a_versions.push(claim_version(&*ledger, &pair.a, 100, pair.at("A claims", &pair.a)).await);
    }
    // Every A's lease runs out (one wait for all six pairs).
    tokio::time::sleep(Duration::from_millis(400)).await;
    for (pair, a_version) in pairs.iter().zip(a_versions) {
        let (a, b) = (&pair.a, &pair.b);
        let b_version = claim_version(
            &*ledger,
            b,
            LONG,
            pair.at(
                "B claims next to A's expired claim (a new operation, no takeover)",
                b,
            ),
        )
        .await;
        let step = "A's resend takes over A's expired claim";
        let taken = match ledger.claim(a, &request(BODY), lease(LONG)).await {
            Ok(ClaimOutcome::Claimed {
                version,
                took_over: true,
            }) => version,
            other => pair
                .at(step, a)
                .fail("Ok(Claimed { version: A's + 1, took_over: true })", other),
        };
        pair.at(step, a).eq(taken, a_version.next());
        let step = "B's row after A's takeover";
        let b_row = expect_ok(ledger.find(b).await, pair.at(step, b));
        pair.at(step, b)
            .eq(b_row.map(|row| row.version), Some(b_version));
        let step = "A's old owner finishes after the takeover";
        pair.at(step, a).eq(
            ledger.mark_committed(a, a_version, &outcome("stale")).await,
            Err(LedgerError::LostOwnership {
                expected: a_version,
                current: taken,
            }),
        );
        let step = "B's row renewed with A's new version";
        pair.at(step, b).eq(
            ledger.renew_lease(b, taken, lease(LONG)).await,
            Err(LedgerError::LostOwnership {
                expected: taken,
                current: b_version,
            }),
        );
        let b_done = ledger.mark_committed(b, b_version, &outcome("b")).await;
        expect_ok(b_done, pair.at("B's owner commits its own claim", b));
        let a_done = ledger.mark_committed(a, taken, &outcome("a")).await;
        expect_ok(a_done, pair.at("A's new owner commits", a));
        pair.each_replays_its_own(&*ledger, "b").await;
    }
}

/// Rule [`Rule::IdentityHasThreeParts`]: `record_finished`, `purge` and `census` keep neighbours
/// apart: B's one-step record next to A's live claim is B's own (A's resend still sees A's
/// claim), B's claim next to A's recorded row is a new operation, the census counts each as what
/// it is, and a purge of A's finished row leaves B's live claim to finish. On a fresh store per
/// pair, since purge and census see the whole store.
pub async fn neighbours_are_recorded_purged_and_counted_apart<F: LedgerFixture>(fixture: &F) {
    let limit = NonZeroU32::new(100).expect("nonzero");
    for pair in pairs("store-wide") {
        let store = fixture.fresh_store().await;
        let ledger = store.autocommit();
        let (a, b) = (&pair.a, &pair.b);
        let a_version = claim_version(&*ledger, a, LONG, pair.at("A claims", a)).await;
        let step = "B records its operation as finished in one step while A is live";
        let recorded = ledger
            .record_finished(b, &request(BODY), lease(LONG), &done("b"))
            .await;
        pair.at(step, b).check(
            matches!(recorded, Ok(RecordOutcome::Recorded(_))),
            "Ok(Recorded(version)), never InProgress behind A",
            &recorded,
        );
        let step = "A resends after B recorded its operation";
        match ledger.claim(a, &request(BODY), lease(LONG)).await {
            Ok(ClaimOutcome::InProgress { record, .. }) if record.version == a_version => {}
            other => pair.at(step, a).fail(
                "Ok(InProgress) with A's own record (never B's outcome)",
                other,
            ),
        }
        let a_done = ledger.mark_committed(a, a_version, &outcome("a")).await;
        expect_ok(a_done, at(Rule::TransitionRecords, "A commits", a));
        // Both finished; a purge once both are past a zero retention takes both.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let step = "purge both finished rows";
        let purged = ledger.purge(Duration::ZERO, limit).await;
        at_store(Rule::PurgeOnlyOldFinished, step).eq(purged, Ok(2));

        // A recorded in one step, then B claims next to it: A finished, B live.
        let step = "A records its operation as finished in one step";
        let recorded = ledger
            .record_finished(a, &request(BODY), lease(LONG), &done("a"))
            .await;
        pair.at(step, a).check(
            matches!(recorded, Ok(RecordOutcome::Recorded(_))),
            "Ok(Recorded(version))",
            &recorded,
        );
        let b_version = claim_version(
            &*ledger,
            b,
            LONG,
            pair.at("B claims next to A's finished row", b),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let step = "count A finished and B in progress";
        let census = expect_ok(ledger.census(Duration::ZERO).await, pair.at(step, b));
        pair.at(step, b).eq(
            (
                census.in_progress,
                census.expired_leases,
                census.past_retention,
            ),
            (1, 0, 1),
        );
        let step = "purge A's finished row next to B's live claim";
        let purged = expect_ok(ledger.purge(Duration::ZERO, limit).await, pair.at(step, a));
        pair.at(step, a).eq(purged, 1);
        pair.at(step, a).eq(ledger.find(a).await, Ok(None));
        let b_row = expect_ok(ledger.find(b).await, pair.at(step, b));
        pair.at(step, b).eq(
            b_row.map(|row| (row.state(), row.version)),
            Some((OperationState::InProgress, b_version)),
        );
        let b_done = ledger
            .mark_committed(b, b_version, &outcome("b-claimed"))
            .await;
        expect_ok(
            b_done,
            pair.at("B commits its live claim after the purge", b),
        );
        let replay_b = replayed(&*ledger, b, BODY).await;
        pair.at("B replays its own outcome", b)
            .eq(replay_b.outcome_reference(), Some(&outcome("b-claimed")));
    }
}

/// Rule [`Rule::IdentityHasThreeParts`]: another unit's uncommitted claim of a neighbour holds
/// nobody back: B's claim in a second unit owns B at once (no wait, no `InFlight`) and B's `find`
/// there sees no row of A's; both units commit and each row is its owner's. Not applicable to a
/// store with one writer at a time, where the second unit waits for the write lock whatever
/// identity it claims.
pub async fn a_neighbours_uncommitted_claim_does_not_hold_a_claim_back<F: LedgerFixture>(
    fixture: &F,
) {
    let store = fixture.fresh_store().await;
    for pair in pairs("uncommitted") {
        let (a, b) = (&pair.a, &pair.b);
        let unit_a = expect_ok(store.begin().await, pair.at("begin A's unit", a));
        let a_version = claim_version(
            &*unit_a.ledger(),
            a,
            LONG,
            pair.at("A claims in its unit", a),
        )
        .await;
        let unit_b = expect_ok(store.begin().await, pair.at("begin B's unit", b));
        // A claim that waited behind A's row would answer InFlight (A commits only after B).
        let step = "B claims in a second unit while A's claim is uncommitted";
        let b_version = claim_version(&*unit_b.ledger(), b, LONG, pair.at(step, b)).await;
        let step = "B reads in its unit while A's claim is uncommitted";
        let b_row = expect_ok(unit_b.ledger().find(b).await, pair.at(step, b));
        pair.at(step, b)
            .eq(b_row.map(|row| row.version), Some(b_version));
        expect_ok(unit_b.commit().await, pair.at("commit B's unit", b));
        expect_ok(unit_a.commit().await, pair.at("commit A's unit", a));
        let step = "each row is its owner's";
        pair.at(step, a)
            .eq(stored(&store, a).await.version, a_version);
        pair.at(step, b)
            .eq(stored(&store, b).await.version, b_version);
    }
}
