//! A suite that cannot fail is worthless: each deliberately broken variant of the in-memory double
//! (feature `broken-doubles`) must be caught, by the cases named here.

use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_contract_tests::{CASES, Defect, SuiteReport, run_report};
use grpc_operation_ledger_memory::InMemoryFixture;

/// The suite's report on the double with `defect`.
async fn caught_for(defect: Defect) -> SuiteReport {
    run_report(Arc::new(InMemoryFixture::with_defect(
        Duration::from_millis(300),
        defect,
    )))
    .await
}

/// Fails unless `case` failed in `report`, for rule `rule`.
fn assert_caught_for(report: &SuiteReport, case: &str, rule: &str) {
    let failures = report.failures();
    let Some((_, why)) = failures.iter().find(|(failed, _)| *failed == case) else {
        panic!("{case} did not catch it; caught by {failures:?}");
    };
    assert!(
        why.contains(&format!("rule `{rule}`")),
        "{case} caught it for another reason than `{rule}`: {why}"
    );
}

async fn caught(defect: Defect) -> Vec<&'static str> {
    let fixture = Arc::new(InMemoryFixture::with_defect(
        Duration::from_millis(300),
        defect,
    ));
    let report = run_report(fixture).await;
    let failures = report.failures();
    for (case, why) in &failures {
        eprintln!("{defect:?} caught by {case}: {why}");
    }
    failures.into_iter().map(|(case, _)| case).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_an_upserting_claim() {
    let cases = caught(Defect::UpsertClaim).await;
    for expected in [
        "claim_after_commit_replays",
        "key_reused_with_another_request_is_refused",
    ] {
        assert!(
            cases.contains(&expected),
            "{expected} did not catch it; caught by {cases:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_read_then_insert_claim() {
    let cases = caught(Defect::ReadThenInsertClaim).await;
    assert!(
        cases.contains(&"concurrent_claims_have_exactly_one_owner"),
        "the race was not caught; caught by {cases:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_an_unversioned_transition() {
    let cases = caught(Defect::UnversionedTransition).await;
    for expected in [
        "transitions_with_stale_version_lose_ownership",
        "expired_lease_is_taken_over_and_old_owner_fenced",
    ] {
        assert!(
            cases.contains(&expected),
            "{expected} did not catch it; caught by {cases:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_an_unfenced_takeover() {
    let cases = caught(Defect::UnfencedTakeover).await;
    assert!(
        cases.contains(&"racing_takeovers_of_an_expired_claim_have_one_winner"),
        "two takers of one expired claim were not caught; caught by {cases:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_versions_that_repeat_after_purge() {
    let cases = caught(Defect::RepeatingVersions).await;
    assert!(
        cases.contains(&"stale_owner_cannot_complete_a_claim_made_after_purge"),
        "a stale owner completing a fresh claim was not caught; caught by {cases:?}"
    );
}

/// The first of the three defects an adapter written outside the repository got past the suite:
/// the takeover's UPDATE re-checks the lease, not the version it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_takeover_fenced_on_the_lease_only() {
    let report = caught_for(Defect::TakeoverFencedOnLeaseOnly).await;
    for expected in [
        "contended_claims_never_hand_a_version_twice",
        "contended_claims_in_units_never_hand_a_version_twice",
    ] {
        assert_caught_for(&report, expected, "one-owner-per-version");
    }
}

/// The second: the takeover takes the new version from the row it read and is not conditional on
/// it at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_takeover_whose_version_comes_from_its_read() {
    let report = caught_for(Defect::UnfencedTakeover).await;
    for expected in [
        "contended_claims_never_hand_a_version_twice",
        "contended_claims_in_units_never_hand_a_version_twice",
    ] {
        assert_caught_for(&report, expected, "one-owner-per-version");
    }
}

/// The third: read-then-insert, with the unique violation met after a wait answered InFlight.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_unique_violation_answered_in_flight() {
    let report = caught_for(Defect::InFlightOnUniqueViolation).await;
    assert_caught_for(
        &report,
        "duplicate_that_waited_replays_once_the_holder_commits",
        "waiter-replays-the-commit",
    );
}

/// A write that waits for a table lock as long as it is held fails its case quickly (the case
/// bounds its own wait), not by the suite's two-minute timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_an_unbounded_wait_behind_a_table_lock() {
    let started = std::time::Instant::now();
    let report = caught_for(Defect::UnboundedTableLockWait).await;
    assert_caught_for(
        &report,
        "claims_are_bounded_behind_a_table_lock",
        "bounded-wait-behind-the-table",
    );
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "the case waited for the suite's timeout instead of bounding its own wait"
    );
}

/// A renewal that moves the version on leaves its owner unable to finish: caught where the owner
/// renews, and where it finishes after renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_renewal_that_moves_the_version() {
    let report = caught_for(Defect::RenewalBumpsVersion).await;
    assert_caught_for(
        &report,
        "renewed_lease_keeps_its_owner_and_version",
        "renewal-keeps-the-owner",
    );
    assert_caught_for(
        &report,
        "renewal_to_the_shortest_lease_releases_the_claim",
        "shortest-lease-releases",
    );
}

/// A renewal that ignores the version lets a stalled owner keep the new owner's lease alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_an_unfenced_renewal() {
    let report = caught_for(Defect::UnfencedRenewal).await;
    assert_caught_for(
        &report,
        "renewal_of_a_lost_claim_is_refused",
        "renewal-fenced",
    );
}

/// A renewal that counts the lease from the claim lets a live owner's operation be taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_renewal_counted_from_the_claim() {
    let report = caught_for(Defect::RenewalFromClaimTime).await;
    assert_caught_for(
        &report,
        "renewed_lease_keeps_its_owner_and_version",
        "renewal-keeps-the-owner",
    );
}

/// A census that counts operations in progress as waiting for purge is caught by the census case.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_census_counting_in_progress_as_purgeable() {
    let report = caught_for(Defect::CensusCountsInProgressAsPurgeable).await;
    assert_caught_for(
        &report,
        "census_counts_by_the_stores_clock",
        "census-counts",
    );
}

/// A purge on a connection of its own deletes even when the caller's unit rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_purge_outside_the_unit() {
    let report = caught_for(Defect::PurgeOutsideTheUnit).await;
    assert_caught_for(
        &report,
        "purge_in_a_unit_rolls_back_with_it",
        "no-transaction-of-its-own",
    );
}

/// A takeover fenced on the version alone overrides a renewal committed after the taker's read:
/// the survivor of the SQL mutants (`docs/mutants/`) that the race case was written for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_takeover_that_ignores_a_renewal_after_its_read() {
    let report = caught_for(Defect::TakeoverFencedOnVersionOnly).await;
    assert_caught_for(
        &report,
        "a_renewal_committed_while_a_taker_waits_keeps_the_owner",
        "one-owner-per-version",
    );
}

/// The defect the seed ADR calls load-bearing: the caller left out of the reads' and the
/// transitions' WHERE clauses while the primary key holds all three parts. Each isolation case
/// catches it for its own rule, in every situation it sets up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_reads_and_transitions_blind_to_the_caller() {
    let report = caught_for(Defect::CallerBlindReads).await;
    for expected in ISOLATION_CASES {
        assert_caught_for(&report, expected, "identity-has-three-parts");
    }
    assert_blind_to(&report, "tenant-b");
}

/// The same hole for the method: a key reused under another method.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_reads_and_transitions_blind_to_the_method() {
    let report = caught_for(Defect::MethodBlindReads).await;
    for expected in ISOLATION_CASES {
        assert_caught_for(&report, expected, "identity-has-three-parts");
    }
    assert_blind_to(&report, "Refund");
}

/// A claim that locks the key hash alone makes one tenant wait behind another's uncommitted
/// claim of the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_claim_that_locks_the_key_alone() {
    let report = caught_for(Defect::ClaimLocksTheKeyAlone).await;
    assert_caught_for(
        &report,
        "a_neighbours_uncommitted_claim_does_not_hold_a_claim_back",
        "identity-has-three-parts",
    );
}

/// The isolation cases that a read or a transition blind to one part must fail (the uncommitted
/// neighbour's case is about waits, which a blind read does not change in the double).
const ISOLATION_CASES: [&str; 4] = [
    "neighbours_of_a_finished_operation_see_nothing_of_it",
    "neighbours_of_a_live_claim_are_not_held_by_it",
    "neighbours_of_an_expired_claim_do_not_take_it_over",
    "neighbours_are_recorded_purged_and_counted_apart",
];

/// Fails unless some isolation failure names an identity that carries `part_value` (the part
/// the defect ignores), so that the message points at the pair that differs in it.
fn assert_blind_to(report: &SuiteReport, part_value: &str) {
    let failures = report.failures();
    assert!(
        failures
            .iter()
            .any(|(case, why)| ISOLATION_CASES.contains(case) && why.contains(part_value)),
        "no isolation failure names an identity with {part_value}: {failures:?}"
    );
}

/// An adapter that writes with the store's clock but judges by the process's passes every case
/// where both clocks are one host's, and fails both clock cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_judging_time_by_the_process_clock() {
    let report = caught_for(Defect::ProcessClock).await;
    for expected in [
        "leases_follow_the_stores_clock_when_clocks_disagree",
        "purge_and_census_follow_the_stores_clock_when_clocks_disagree",
    ] {
        assert_caught_for(&report, expected, "stores-clock-only");
    }
    let unskewed: Vec<_> = report
        .failures()
        .into_iter()
        .filter(|(case, _)| !case.contains("stores_clock_when_clocks_disagree"))
        .collect();
    assert_eq!(
        unskewed,
        Vec::<(&str, &str)>::new(),
        "on one host's clock the defect is invisible; only the clock cases can see it"
    );
}

/// An adapter that reports a commit whose answer was lost as "unavailable" passes every case
/// but the lost-commit one, which names its rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_suite_catches_a_lost_commit_said_not_to_have_happened() {
    let report = caught_for(Defect::LostCommitSaidUnavailable).await;
    assert_caught_for(
        &report,
        "a_commit_whose_answer_is_lost_is_an_unknown_outcome",
        "unknown-outcome-is-said",
    );
    assert_eq!(report.failures().len(), 1, "{:?}", report.failures());
}

/// Every case's failure names its rule, its step and (where there is one) the identity. The
/// suite runs on each broken double at once (each on a store of its own): the runs mostly wait
/// out leases and bounds, one after another they took a minute and a half.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_name_the_rule_the_step_and_the_identity() {
    let runs: Vec<_> = [
        Defect::UpsertClaim,
        Defect::ReadThenInsertClaim,
        Defect::UnversionedTransition,
        Defect::RepeatingVersions,
        Defect::RenewalBumpsVersion,
        Defect::UnfencedRenewal,
        Defect::CallerBlindReads,
        Defect::ProcessClock,
        Defect::LostCommitSaidUnavailable,
    ]
    .into_iter()
    .map(|defect| (defect, tokio::spawn(caught_for(defect))))
    .collect();
    for (defect, run) in runs {
        let report = run.await.expect("the suite's run");
        assert!(!report.failures().is_empty(), "{defect:?} was not caught");
        for (case, why) in report.failures() {
            assert!(
                why.starts_with("rule `")
                    && why.contains("\n  step: ")
                    && why.contains("expected: ")
                    && why.contains("seen: "),
                "{defect:?} in {case}: the message does not name rule, step, expected and seen: {why}"
            );
        }
    }
}

/// A purge that deletes IN_PROGRESS rows is named as such, not as a wrong count.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purge_of_in_progress_rows_is_named_as_such() {
    let report = caught_for(Defect::PurgeInProgress).await;
    let failures = report.failures();
    let why = failures
        .iter()
        .find(|(case, _)| *case == "purge_deletes_only_old_finished_rows")
        .map(|(_, why)| *why)
        .unwrap_or_else(|| panic!("the purge case did not catch it: {failures:?}"));
    assert!(
        why.contains("purge-only-old-finished") && why.contains("IN_PROGRESS row"),
        "{why}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_honest_double_passes_every_case() {
    let fixture = Arc::new(InMemoryFixture::new(Duration::from_millis(300)));
    let report = run_report(fixture).await;
    assert_eq!(report.failures(), Vec::<(&str, &str)>::new());
    // The double has no schema to migrate: that case is reported, not passed.
    assert_eq!(
        report.not_applicable(),
        vec!["concurrent_starts_migrate_once"]
    );
    assert_eq!(report.cases.len(), CASES.len());
}
