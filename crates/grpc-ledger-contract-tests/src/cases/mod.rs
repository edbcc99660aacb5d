//! The contract's cases, one public async function each. Every case begins with a fresh store.
//! A case fails by panicking with a message that names the [`Rule`] it saw broken, the step it
//! was at, the identity, and what it expected against what it saw.

use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, Completion, GrpcMethod, GrpcOperationIdentity,
    GrpcOperationLedger, IdempotencyKey, KeyHasher, LeaseDuration, LedgerCensus, LedgerError,
    OperationRecord, OperationState, OutcomeReference, RecordOutcome, RecordedFailure,
    RequestFingerprint, UnavailableKind, Version,
};

use std::io::Write;

use crate::{Capabilities, LedgerFixture, LedgerStore, RawRow, UnitOfWork};

mod claims;
mod clock;
mod commit;
mod concurrency;
mod isolation;
mod ownership;
mod renewal;
mod rules;
mod store;
mod transitions;
mod write_once;

pub use claims::*;
pub use clock::*;
pub use commit::*;
pub use concurrency::*;
pub use isolation::*;
pub use ownership::*;
pub use renewal::*;
pub use rules::Rule;
pub use store::*;
pub use transitions::*;
pub use write_once::*;

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

/// The key each identity the cases made was built from, by key hash, so that a failure can say
/// which operation it was about in the case's own words.
fn key_labels() -> &'static Mutex<HashMap<String, String>> {
    static LABELS: std::sync::OnceLock<Mutex<HashMap<String, String>>> = std::sync::OnceLock::new();
    LABELS.get_or_init(Mutex::default)
}

fn identity(caller: &str, method: &str, key: &str) -> GrpcOperationIdentity {
    let hash = KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).expect("valid key"));
    key_labels()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(hash.to_hex(), key.to_owned());
    GrpcOperationIdentity::new(
        CallerFingerprint::parse(caller).expect("valid caller"),
        GrpcMethod::parse(method).expect("valid method"),
        hash,
    )
}

/// An identity as a failure message names it: caller, method, and the case's key.
fn describe(id: &GrpcOperationIdentity) -> String {
    let hash = id.key_hash().to_hex();
    let key = key_labels()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&hash)
        .cloned()
        .unwrap_or_else(|| format!("hash {}...", &hash[..12]));
    format!(
        "caller {}, method {}, key {key:?}",
        id.caller().as_str(),
        id.method().as_str()
    )
}

/// Where a case is: the rule it checks, the step it is at, and the identity it is about.
#[derive(Clone, Copy)]
struct At<'a> {
    rule: Rule,
    step: &'a str,
    id: Option<&'a GrpcOperationIdentity>,
}

/// The rule `rule`, checked at `step` on `id`.
fn at<'a>(rule: Rule, step: &'a str, id: &'a GrpcOperationIdentity) -> At<'a> {
    At {
        rule,
        step,
        id: Some(id),
    }
}

/// The rule `rule`, checked at `step` on no single identity.
fn at_store(rule: Rule, step: &str) -> At<'_> {
    At {
        rule,
        step,
        id: None,
    }
}

impl At<'_> {
    /// Fails the case: the rule broke here, `expected` against `seen`.
    #[track_caller]
    fn fail(self, expected: impl Display, seen: impl Debug) -> ! {
        let identity = self
            .id
            .map(|id| format!("\n  identity: {}", describe(id)))
            .unwrap_or_default();
        panic!(
            "rule {} broken\n  step: {}{identity}\n  expected: {expected}\n  seen: {seen:?}",
            self.rule, self.step
        )
    }

    /// Fails the case unless `seen == expected`.
    #[track_caller]
    fn eq<T: PartialEq + Debug>(self, seen: T, expected: T) {
        if seen != expected {
            self.fail(format_args!("{expected:?}"), seen)
        }
    }

    /// Fails the case unless `holds`; `expected` says what should have held.
    #[track_caller]
    fn check(self, holds: bool, expected: impl Display, seen: impl Debug) {
        if !holds {
            self.fail(expected, seen)
        }
    }
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
    let answer = ledger.claim(id, &request("x"), lease(lease_millis)).await;
    match answer {
        Ok(ClaimOutcome::Claimed {
            version,
            took_over: false,
        }) => version,
        other => at(Rule::ClaimNew, "claim an identity that has no row", id)
            .fail("Ok(Claimed { version, took_over: false })", other),
    }
}

/// Claims a new identity and commits it with `reference`; returns the version after the commit.
async fn claim_and_commit(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    reference: &str,
) -> Version {
    let version = claim_new(ledger, id, LONG).await;
    let committed = ledger
        .mark_committed(id, version, &outcome(reference))
        .await;
    match committed {
        Ok(next) => next,
        Err(error) => at(
            Rule::TransitionRecords,
            "the owner marks its own claim committed",
            id,
        )
        .fail("Ok(version + 1)", Err::<Version, _>(error)),
    }
}

/// Unwraps a call the case needs to go on, failing it with `rule` and `step` when the store
/// answered an error.
#[track_caller]
fn expect_ok<T>(result: Result<T, LedgerError>, at: At<'_>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => at.fail("Ok(..)", Err::<(), _>(error)),
    }
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

/// Whether `answer` to a racing claim is one of the answers the contract allows a claim that
/// did not win (besides `Claimed` and `Completed`, which the caller handles).
fn losing_answer_allowed(answer: &Result<ClaimOutcome, LedgerError>, caps: &Capabilities) -> bool {
    match answer {
        Ok(ClaimOutcome::InProgress { .. }) | Err(LedgerError::InFlight { .. }) => true,
        Err(LedgerError::Unavailable {
            kind: UnavailableKind::SerializationFailure,
        }) => true,
        Err(LedgerError::Unavailable { .. }) => !caps.concurrent_writers,
        _ => false,
    }
}

/// Runs `futures` concurrently on the current task and returns their outputs in order (for hooks
/// that borrow the fixture, which cannot move to tasks of their own).
async fn join_all<T, Fut: std::future::Future<Output = T>>(
    futures: impl IntoIterator<Item = Fut>,
) -> Vec<T> {
    let mut pending: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<T>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot
                && let std::task::Poll::Ready(value) = future.as_mut().poll(cx)
            {
                *output = Some(value);
                *slot = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Claims `id` again (with request `body`) and expects the finished record back: a replay.
async fn replayed(
    ledger: &dyn GrpcOperationLedger,
    id: &GrpcOperationIdentity,
    body: &str,
) -> OperationRecord {
    match ledger.claim(id, &request(body), lease(LONG)).await {
        Ok(ClaimOutcome::Completed(record)) => record,
        other => at(
            Rule::ClaimReplays,
            "claim a finished operation again with the same request",
            id,
        )
        .fail("Ok(Completed(record))", other),
    }
}

/// The row of `id`, read outside any unit of work; the case fails (under `rule`) if there is none.
async fn stored<S: LedgerStore>(store: &S, id: &GrpcOperationIdentity) -> OperationRecord {
    let found = store.autocommit().find(id).await;
    match found {
        Ok(Some(record)) => record,
        other => at(
            Rule::ClaimNew,
            "read the operation's row back with `find`",
            id,
        )
        .fail("Ok(Some(record))", other),
    }
}

/// A committed completion with `reference` as its outcome.
fn done(reference: &str) -> Completion {
    Completion::Committed(outcome(reference))
}

/// Why `case` cannot run with `fixture`, or `None` when it can: a case that needs a hook the
/// fixture does not offer (see [`LedgerFixture::migrations`] and the others).
pub fn not_applicable<F: LedgerFixture>(case: &str, fixture: &F) -> Option<&'static str> {
    match case {
        "killed_connection_is_unavailable_and_retry_succeeds"
            if fixture.connection_killer().is_none() =>
        {
            Some("the fixture offers no connection killer (LedgerFixture::connection_killer)")
        }
        "concurrent_starts_migrate_once" if fixture.migrations().is_none() => {
            Some("the fixture offers no migrations (LedgerFixture::migrations)")
        }
        "claims_are_bounded_behind_a_table_lock" if fixture.table_locking().is_none() => {
            Some("the fixture cannot lock the ledger table (LedgerFixture::table_locking)")
        }
        "leases_follow_the_stores_clock_when_clocks_disagree"
        | "purge_and_census_follow_the_stores_clock_when_clocks_disagree"
            if fixture.skewed_clock().is_none() =>
        {
            Some(clock::NO_HOOK)
        }
        "a_commit_whose_answer_is_lost_is_an_unknown_outcome"
            if fixture.lost_commit().is_none() =>
        {
            Some(commit::NO_LOST_COMMIT)
        }
        "a_neighbours_uncommitted_claim_does_not_hold_a_claim_back"
        | "a_renewal_committed_while_a_taker_waits_keeps_the_owner"
            if !fixture.capabilities().concurrent_writers =>
        {
            Some(
                "the store has one writer at a time: a second writer waits for the write lock \
                 before it reads anything",
            )
        }
        _ => None,
    }
}

/// Says on the test output, past the test harness's capture, that `case` did not run and why,
/// so that a case that did not run is never mistaken for one that passed.
fn say_not_applicable(case: &str, why: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "contract case `{case}`: NOT APPLICABLE to this store: {why}"
    );
}

/// How long a case may run before it fails as timed out: every wait in the suite is bounded.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long [`LedgerFixture::after_case`] may take.
pub const AFTER_CASE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `case` (named `name`) on its own task, bounded by [`CASE_TIMEOUT`], then the fixture's
/// [`LedgerFixture::after_case`], bounded too, and says how the case ended. For
/// [`ledger_contract_tests!`](crate::ledger_contract_tests) and [`run_report`].
#[doc(hidden)]
pub async fn run_case<F, C, Fut>(name: &'static str, fixture: Arc<F>, case: C) -> CaseOutcome
where
    F: LedgerFixture + 'static,
    C: FnOnce(Arc<F>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if let Some(why) = not_applicable(name, &*fixture) {
        return CaseOutcome::NotApplicable(why);
    }
    let mut task = tokio::spawn(case(Arc::clone(&fixture)));
    let outcome = match tokio::time::timeout(CASE_TIMEOUT, &mut task).await {
        Ok(Ok(())) => CaseOutcome::Passed,
        Ok(Err(error)) => CaseOutcome::Failed(panic_message(error)),
        Err(_) => {
            task.abort();
            CaseOutcome::Failed(format!(
                "timed out after {CASE_TIMEOUT:?}: a wait the contract bounds did not end"
            ))
        }
    };
    if tokio::time::timeout(AFTER_CASE_TIMEOUT, fixture.after_case(name))
        .await
        .is_err()
    {
        return CaseOutcome::Failed(format!(
            "the fixture's after_case hook took longer than {AFTER_CASE_TIMEOUT:?} (case outcome: \
             {outcome:?})"
        ));
    }
    outcome
}

/// Turns a case's outcome into a test's: a failure panics with its message; a case that does
/// not apply prints why.
#[doc(hidden)]
pub fn conclude(name: &'static str, outcome: CaseOutcome) {
    match outcome {
        CaseOutcome::Passed => {}
        CaseOutcome::NotApplicable(why) => say_not_applicable(name, why),
        CaseOutcome::Failed(why) => panic!("contract case `{name}` failed: {why}"),
    }
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The names of every case, in the order `run_all` runs them.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];

        /// Runs every case that applies to the store on its own task and reports how each ended.
        pub async fn run_report<F: LedgerFixture + 'static>(fixture: Arc<F>) -> SuiteReport {
            let mut cases = Vec::new();
            $(
                let outcome = run_case(stringify!($case), Arc::clone(&fixture), |f| async move {
                    $case(&*f).await
                })
                .await;
                cases.push((stringify!($case), outcome));
            )*
            SuiteReport { cases }
        }

        /// Runs the cases that apply in order and stops at the first that fails, returning its
        /// name and message; `None` when every case that applies passed. For mutation testing
        /// (`cargo xtask mutants`): a mutant of an adapter is killed by the first case that sees
        /// it, and only a survivor costs a whole run.
        pub async fn first_failure<F: LedgerFixture + 'static>(
            fixture: Arc<F>,
        ) -> Option<(&'static str, String)> {
            $(
                let outcome = run_case(stringify!($case), Arc::clone(&fixture), |f| async move {
                    $case(&*f).await
                })
                .await;
                if let CaseOutcome::Failed(why) = outcome {
                    return Some((stringify!($case), why));
                }
            )*
            None
        }

        /// Generates one named `#[tokio::test]` per case. `$fixture` is an expression (not a
        /// future) evaluated once per test, whose value is the [`LedgerFixture`]. Each test runs
        /// its case on a task of its own, bounded by [`CASE_TIMEOUT`](crate::cases::CASE_TIMEOUT),
        /// then the fixture's `after_case` hook; a case the store cannot run prints
        /// `NOT APPLICABLE` with the reason.
        ///
        /// The tests use tokio's multi-threaded runtime and test macro: the adapter's
        /// dev-dependencies need `tokio = { version = "1", features = ["macros", "rt-multi-thread"] }`.
        #[macro_export]
        macro_rules! ledger_contract_tests {
            ($fixture:expr) => {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $case() {
                        let fixture = ::std::sync::Arc::new($fixture);
                        let outcome = $crate::cases::run_case(
                            stringify!($case),
                            fixture,
                            |f| async move { $crate::cases::$case(&*f).await },
                        )
                        .await;
                        $crate::cases::conclude(stringify!($case), outcome);
                    }
                )*
            };
        }
    };
}

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

/// For a mutation run's harness (`cargo xtask mutants`): runs the suite until the first case
/// fails ([`first_failure`]) and answers the verdict line the runner reads,
/// `mutant: killed\t<case>\t<the failure's first lines>` or `mutant: survived`.
pub async fn mutant_verdict<F: LedgerFixture + 'static>(fixture: Arc<F>) -> String {
    match first_failure(fixture).await {
        Some((case, why)) => {
            let first = why.lines().take(3).collect::<Vec<_>>().join(" / ");
            format!("mutant: killed\t{case}\t{first}")
        }
        None => "mutant: survived".to_owned(),
    }
}

/// Runs the whole suite and panics listing every case that failed; lists the cases the store
/// could not run.
pub async fn run_all<F: LedgerFixture + 'static>(fixture: Arc<F>) {
    let report = run_report(fixture).await;
    for (case, outcome) in &report.cases {
        if let CaseOutcome::NotApplicable(why) = outcome {
            say_not_applicable(case, why);
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
    renewed_lease_keeps_its_owner_and_version,
    renewal_of_a_lost_claim_is_refused,
    renewal_to_the_shortest_lease_releases_the_claim,
    a_renewal_committed_while_a_taker_waits_keeps_the_owner,
    racing_takeovers_of_an_expired_claim_have_one_winner,
    claims_under_contention_never_answer_internal,
    contended_claims_never_hand_a_version_twice,
    contended_claims_in_units_never_hand_a_version_twice,
    store_refuses_rows_it_could_not_replay,
    concurrent_starts_migrate_once,
    co_commit_rolls_back_and_commits_together,
    concurrent_claims_have_exactly_one_owner,
    concurrent_transitions_have_exactly_one_winner,
    duplicate_behind_uncommitted_claim_is_in_flight,
    duplicate_that_waited_replays_once_the_holder_commits,
    claims_are_bounded_behind_a_table_lock,
    killed_connection_is_unavailable_and_retry_succeeds,
    purge_deletes_only_old_finished_rows,
    purge_in_a_unit_rolls_back_with_it,
    census_counts_by_the_stores_clock,
    bad_input_never_writes_a_row,
    record_finished_writes_once_and_replays,
    record_finished_with_another_request_is_refused,
    record_finished_over_a_live_claim_is_in_progress,
    concurrent_records_have_exactly_one_winner,
    neighbours_of_a_finished_operation_see_nothing_of_it,
    neighbours_of_a_live_claim_are_not_held_by_it,
    neighbours_of_an_expired_claim_do_not_take_it_over,
    neighbours_are_recorded_purged_and_counted_apart,
    a_neighbours_uncommitted_claim_does_not_hold_a_claim_back,
    leases_follow_the_stores_clock_when_clocks_disagree,
    purge_and_census_follow_the_stores_clock_when_clocks_disagree,
    a_commit_whose_answer_is_lost_is_an_unknown_outcome,
);
