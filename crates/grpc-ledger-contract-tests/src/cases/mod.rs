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

mod claims;
mod concurrency;
mod store;
mod transitions;
mod write_once;

pub use claims::*;
pub use concurrency::*;
pub use store::*;
pub use transitions::*;
pub use write_once::*;

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

/// The row of `id`, read outside any unit of work; the case fails if there is none.
async fn stored<S: LedgerStore>(store: &S, id: &GrpcOperationIdentity) -> OperationRecord {
    store
        .autocommit()
        .find(id)
        .await
        .expect("find")
        .expect("the operation has a row")
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
