//! The store's clock, when it disagrees with the process's: every time the ledger writes or
//! judges comes from the store. A store on another host keeps its own time; an adapter that binds
//! `SystemTime::now()` into a lease, a takeover's condition, a purge cutoff or a census passes
//! every other case (the tests and the store share one host clock) and fails these, which run on
//! stores whose clock is an hour ahead of, then behind, the process's ([`SkewedClock`]).
//!
//! [`SkewedClock`]: crate::SkewedClock

use std::time::SystemTime;

use super::*;
use crate::ClockSkew;

/// How far from the store's time (the process's time shifted by the skew) a time the ledger
/// wrote may be: far less than the hour of skew, far more than a slow test machine's delays.
const CLOSE_ENOUGH: Duration = Duration::from_secs(600);

/// Why a clock case cannot run without the hook.
pub(super) const NO_HOOK: &str =
    "the fixture cannot skew the store's clock (LedgerFixture::skewed_clock)";

/// A name for `skew` that a key may carry.
fn label(skew: ClockSkew) -> &'static str {
    match skew {
        ClockSkew::Ahead(_) => "store-ahead",
        ClockSkew::Behind(_) => "store-behind",
    }
}

/// Fails under `at` unless `written` is within [`CLOSE_ENOUGH`] of the store's time now.
#[track_caller]
fn near_store_time(at: At<'_>, skew: ClockSkew, written: SystemTime) {
    let store_now = skew.store_time(SystemTime::now());
    let apart = match written.duration_since(store_now) {
        Ok(late) => late,
        Err(early) => early.duration(),
    };
    at.check(
        apart < CLOSE_ENOUGH,
        format_args!(
            "a time from the store's clock ({skew:?} of the process's), within {CLOSE_ENOUGH:?} \
             of it"
        ),
        format_args!("{apart:?} away from the store's time"),
    );
}

/// Fails under `at` unless `left`, a lease's time left by the store's clock, is more than half
/// of `LONG` and at most `LONG`.
#[track_caller]
fn most_of_a_long_lease(at: At<'_>, left: Duration) {
    at.check(
        left <= Duration::from_millis(LONG) && left > Duration::from_millis(LONG / 2),
        format_args!("at most {LONG} ms and more than half of it left"),
        left,
    );
}

/// Rule [`Rule::StoresClockOnly`]: with the store's clock an hour ahead of the process's, then an
/// hour behind, a claim's times are the store's, a live lease is in progress with its whole time
/// left, an expired one is taken over and its old owner fenced, and a renewed one lives on.
pub async fn leases_follow_the_stores_clock_when_clocks_disagree<F: LedgerFixture>(fixture: &F) {
    let Some(hook) = fixture.skewed_clock() else {
        return say_not_applicable(
            "leases_follow_the_stores_clock_when_clocks_disagree",
            NO_HOOK,
        );
    };
    let rule = Rule::StoresClockOnly;
    for skew in ClockSkew::CASES {
        let store = hook.fresh_store_with_clock(skew).await;
        let ledger = store.autocommit();
        let live = identity("tenant-a", CREATE, &format!("{}-live", label(skew)));
        let version = claim_new(&*ledger, &live, LONG).await;
        let row = stored(&store, &live).await;
        near_store_time(at(rule, "the claim's time", &live), skew, row.claimed_at);
        let lease_written = row.lease_expires_at.duration_since(row.claimed_at);
        at(rule, "the claim's lease, from claim time to its end", &live).check(
            lease_written
                .as_ref()
                .is_ok_and(|lease| lease.abs_diff(Duration::from_millis(LONG)) < CLOSE_ENOUGH),
            format_args!("{LONG} ms"),
            lease_written,
        );
        let step = "claim the live operation again";
        match ledger.claim(&live, &request("x"), lease(LONG)).await {
            Ok(ClaimOutcome::InProgress { retry_after, .. }) => {
                most_of_a_long_lease(at(rule, step, &live), retry_after)
            }
            other => at(rule, step, &live).fail("Ok(InProgress { .. })", other),
        }
        let step = "look the live operation up";
        match ledger.look_up(&live).await {
            Ok(Some((record, left))) if record.version == version => {
                most_of_a_long_lease(at(rule, step, &live), left)
            }
            other => at(rule, step, &live).fail("Ok(Some((record, lease left)))", other),
        }

        // A lease that ran out by the store's clock is taken over; the old owner is fenced.
        let lapsed = identity("tenant-a", CREATE, &format!("{}-lapsed", label(skew)));
        let old = claim_new(&*ledger, &lapsed, 200).await;
        // A lease renewed by its owner lives on past its first end.
        let renewed = identity("tenant-a", CREATE, &format!("{}-renewed", label(skew)));
        let renewed_version = claim_new(&*ledger, &renewed, 300).await;
        let renewal = ledger
            .renew_lease(&renewed, renewed_version, lease(LONG))
            .await;
        expect_ok(renewal, at(rule, "renew the lease to a long one", &renewed));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let step = "claim the operation whose lease ran out";
        let taken = match ledger.claim(&lapsed, &request("x"), lease(LONG)).await {
            Ok(ClaimOutcome::Claimed {
                version,
                took_over: true,
            }) => version,
            other => at(rule, step, &lapsed).fail("Ok(Claimed { took_over: true, .. })", other),
        };
        at(rule, step, &lapsed).eq(taken, old.next());
        at(rule, "the old owner finishes after the takeover", &lapsed).eq(
            ledger.mark_committed(&lapsed, old, &outcome("stale")).await,
            Err(LedgerError::LostOwnership {
                expected: old,
                current: taken,
            }),
        );
        let step = "claim the renewed operation past its first lease";
        match ledger.claim(&renewed, &request("x"), lease(LONG)).await {
            Ok(ClaimOutcome::InProgress { retry_after, .. }) => {
                most_of_a_long_lease(at(rule, step, &renewed), retry_after)
            }
            other => at(rule, step, &renewed).fail("Ok(InProgress { .. })", other),
        }
        let finished = ledger
            .mark_committed(&renewed, renewed_version, &outcome("p"))
            .await;
        expect_ok(finished, at(rule, "the renewed owner commits", &renewed));
        let row = stored(&store, &renewed).await;
        let completed = row.finished.as_ref().map(|(at, _)| *at);
        let Some(completed) = completed else {
            at(rule, "read the committed row", &renewed).fail("a completion time", row);
        };
        near_store_time(at(rule, "the completion's time", &renewed), skew, completed);
    }
}

/// Rule [`Rule::StoresClockOnly`]: with the store's clock an hour ahead of the process's, then an
/// hour behind, the census ages and counts by the store's clock, and purge's cutoff is the
/// store's: a young finished row survives a minute's retention, and one past a short retention
/// is counted and deleted.
pub async fn purge_and_census_follow_the_stores_clock_when_clocks_disagree<F: LedgerFixture>(
    fixture: &F,
) {
    let Some(hook) = fixture.skewed_clock() else {
        return say_not_applicable(
            "purge_and_census_follow_the_stores_clock_when_clocks_disagree",
            NO_HOOK,
        );
    };
    let rule = Rule::StoresClockOnly;
    let limit = NonZeroU32::new(100).expect("nonzero");
    for skew in ClockSkew::CASES {
        let store = hook.fresh_store_with_clock(skew).await;
        let ledger = store.autocommit();
        let finished = identity("tenant-a", CREATE, &format!("{}-finished", label(skew)));
        claim_and_commit(&*ledger, &finished, "p").await;
        let open = identity("tenant-a", CREATE, &format!("{}-open", label(skew)));
        claim_new(&*ledger, &open, LONG).await;

        let step = "count within a minute's retention";
        let census = expect_ok(
            ledger.census(Duration::from_secs(60)).await,
            at_store(rule, step),
        );
        at_store(rule, step).eq(
            (
                census.in_progress,
                census.expired_leases,
                census.past_retention,
            ),
            (1, 0, 0),
        );
        at_store(rule, step).check(
            matches!(census.oldest_in_progress, Some(age) if age < Duration::from_secs(60)),
            "the oldest in progress, claimed moments ago by the store's clock",
            census.oldest_in_progress,
        );
        let step = "purge with a minute's retention";
        let purged = ledger.purge(Duration::from_secs(60), limit).await;
        at_store(rule, step).eq(purged, Ok(0));

        tokio::time::sleep(Duration::from_millis(400)).await;
        let step = "count 400 ms later with a 100 ms retention";
        let census = expect_ok(
            ledger.census(Duration::from_millis(100)).await,
            at_store(rule, step),
        );
        at_store(rule, step).eq((census.in_progress, census.past_retention), (1, 1));
        let step = "purge 400 ms later with a 100 ms retention";
        let purged = ledger.purge(Duration::from_millis(100), limit).await;
        at_store(rule, step).eq(purged, Ok(1));
        at(rule, step, &finished).eq(ledger.find(&finished).await, Ok(None));
        let open_row = expect_ok(ledger.find(&open).await, at(rule, step, &open));
        at(rule, step, &open).eq(
            open_row.map(|row| row.state()),
            Some(OperationState::InProgress),
        );
    }
}
