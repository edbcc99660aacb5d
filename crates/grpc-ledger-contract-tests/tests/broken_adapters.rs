//! A suite that cannot fail is worthless: each deliberately broken double must be caught, by the
//! cases named here.

use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_contract_tests::Defect;
use grpc_ledger_contract_tests::{CASES, InMemoryFixture, run_report};

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
