//! The client-side executor over scripted attempts: what it resends, what it resolves first, and
//! what it refuses.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{IdempotencyKey, LedgerDurability, REPLAYED_METADATA_KEY};
use grpc_policy::{
    CodeSet, GrpcRetryBudget, GrpcRetryOwner, MethodClass, RefusalReason, RetryPolicy,
    RetryThrottling,
};
use grpc_tonic::{Resolution, RetryExecutor, RetrySettings};
use tonic::{Code, Request, Response, Status};

fn executor(owner: GrpcRetryOwner, ledger: LedgerDurability) -> RetryExecutor {
    let policy = RetryPolicy::new(
        4,
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        CodeSet::of(&[Code::Unavailable, Code::DeadlineExceeded, Code::Aborted]),
    )
    .unwrap();
    let settings = RetrySettings::new(owner, policy)
        .with_server_ledger(ledger)
        .with_max_resolutions(3);
    RetryExecutor::new(
        settings,
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    )
}

/// What one attempt carried: its idempotency key and `grpc-previous-rpc-attempts`.
type Seen = (Option<String>, Option<String>);

/// A scripted server: each attempt pops the next answer, and records what it was sent.
#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<VecDeque<Result<String, Status>>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Script {
    fn new(answers: Vec<Result<&str, Status>>) -> Self {
        let answers = answers.into_iter().map(|a| a.map(str::to_owned)).collect();
        Self {
            answers: Arc::new(Mutex::new(answers)),
            seen: Arc::default(),
        }
    }

    fn call(
        &self,
    ) -> impl FnMut(Request<u32>) -> std::future::Ready<Result<Response<String>, Status>> + '_ {
        move |request: Request<u32>| {
            let header = |name: &str| {
                request
                    .metadata()
                    .get(name)
                    .map(|v| v.to_str().unwrap().to_owned())
            };
            self.seen.lock().unwrap().push((
                header("idempotency-key"),
                header("grpc-previous-rpc-attempts"),
            ));
            let answer = self
                .answers
                .lock()
                .unwrap()
                .pop_front()
                .expect("no more scripted answers");
            std::future::ready(answer.map(Response::new))
        }
    }

    fn attempts(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn no_resolver() -> impl FnMut() -> std::future::Ready<Result<Resolution<String>, Status>> {
    || panic!("the resolver must not be asked here")
}

#[tokio::test]
async fn an_idempotent_call_is_retried_with_the_same_key_and_attempt_counts() {
    let script = Script::new(vec![
        Err(Status::unavailable("down")),
        Err(Status::unavailable("down")),
        Ok("done"),
    ]);
    let key = IdempotencyKey::parse("k-1").unwrap();
    let executor = executor(GrpcRetryOwner::Application, LedgerDurability::Durable);
    let answer = executor
        .call(
            MethodClass::Idempotent,
            7u32,
            Some(&key),
            None,
            script.call(),
            no_resolver(),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "done");
    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (Some("k-1".into()), None),
            (Some("k-1".into()), Some("1".into())),
            (Some("k-1".into()), Some("2".into())),
        ]
    );
    // A retry is counted when it is sent, the one that succeeded included.
    let stats = executor.stats();
    assert_eq!(stats.attempts(), 3);
    assert_eq!(stats.retries(), 2);
}

#[tokio::test]
async fn a_non_idempotent_call_is_never_resent() {
    let script = Script::new(vec![Err(Status::unavailable("down"))]);
    let executor = executor(GrpcRetryOwner::Application, LedgerDurability::Durable);
    let status = executor
        .call_unkeyed(MethodClass::NonIdempotent, 7u32, None, script.call())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(script.attempts(), 1);
    assert_eq!(
        executor
            .stats()
            .refusals()
            .get(&RefusalReason::NotIdempotent),
        Some(&1)
    );
}

#[tokio::test]
async fn a_keyed_mutation_with_unknown_outcome_is_resolved_not_resent() {
    let script = Script::new(vec![Err(Status::deadline_exceeded("lost"))]);
    let key = IdempotencyKey::parse("k-2").unwrap();
    let executor = executor(GrpcRetryOwner::Application, LedgerDurability::Durable);
    let answers = Arc::new(Mutex::new(VecDeque::from([
        Resolution::InProgress(Duration::from_millis(1)),
        Resolution::Committed("payment-2".to_owned()),
    ])));
    let answer = executor
        .call(
            MethodClass::KeyedMutation,
            7u32,
            Some(&key),
            Some(Duration::from_secs(5)),
            script.call(),
            || std::future::ready(Ok(answers.lock().unwrap().pop_front().unwrap())),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "payment-2");
    assert_eq!(
        answer.metadata().get(REPLAYED_METADATA_KEY).unwrap(),
        "true"
    );
    assert_eq!(script.attempts(), 1, "resolved from the record, not resent");
}

#[tokio::test]
async fn a_keyed_mutation_that_never_committed_is_resent_with_the_same_key() {
    let script = Script::new(vec![Err(Status::unavailable("lost")), Ok("payment-3")]);
    let key = IdempotencyKey::parse("k-3").unwrap();
    let executor = executor(GrpcRetryOwner::Application, LedgerDurability::Durable);
    let answer = executor
        .call(
            MethodClass::KeyedMutation,
            7u32,
            Some(&key),
            None,
            script.call(),
            || std::future::ready(Ok(Resolution::NotFound)),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "payment-3");
    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen[1].0.as_deref(), Some("k-3"));
    assert_eq!(executor.stats().resolved_first(), 1);
}

#[tokio::test]
async fn keyed_mutations_are_refused_without_a_durable_ledger_or_a_key_and_mesh_owns_nothing_here()
{
    let key = IdempotencyKey::parse("k-4").unwrap();
    let cases = [
        (
            GrpcRetryOwner::Application,
            LedgerDurability::Volatile,
            Some(&key),
            RefusalReason::NoDurableLedger,
        ),
        (
            GrpcRetryOwner::Application,
            LedgerDurability::Durable,
            None,
            RefusalReason::MissingKey,
        ),
        (
            GrpcRetryOwner::Mesh,
            LedgerDurability::Durable,
            Some(&key),
            RefusalReason::NotOwner,
        ),
    ];
    for (owner, ledger, key, reason) in cases {
        let script = Script::new(vec![Err(Status::unavailable("lost"))]);
        let executor = executor(owner, ledger);
        executor
            .call(
                MethodClass::KeyedMutation,
                7u32,
                key,
                None,
                script.call(),
                no_resolver(),
            )
            .await
            .unwrap_err();
        assert_eq!(script.attempts(), 1);
        assert_eq!(
            executor.stats().refusals().get(&reason),
            Some(&1),
            "{reason}"
        );
    }
}

#[tokio::test]
async fn server_pushback_that_says_stop_is_obeyed() {
    let mut status = Status::unavailable("overloaded");
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
    let script = Script::new(vec![Err(status)]);
    let executor = executor(GrpcRetryOwner::Application, LedgerDurability::Durable);
    executor
        .call_unkeyed(MethodClass::Idempotent, 7u32, None, script.call())
        .await
        .unwrap_err();
    assert_eq!(script.attempts(), 1);
}

fn executor_with(settings: impl FnOnce(&mut RetrySettings)) -> RetryExecutor {
    let policy = RetryPolicy::new(
        4,
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        CodeSet::of(&[Code::Unavailable, Code::DeadlineExceeded]),
    )
    .unwrap();
    let mut values = RetrySettings::new(GrpcRetryOwner::Channel, policy)
        .with_server_ledger(LedgerDurability::Durable)
        .with_max_resolutions(3);
    settings(&mut values);
    RetryExecutor::new(
        values,
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    )
}

/// One attempt's answer, as a boxed future.
type Answer = std::pin::Pin<Box<dyn Future<Output = Result<Response<String>, Status>> + Send>>;

/// An attempt that takes `delay(n)` for the n-th attempt, then answers; counts attempts.
fn slow(
    attempts: &AtomicU32,
    delay: impl Fn(u32) -> Duration,
) -> impl FnMut(Request<u32>) -> Answer {
    move |_request| {
        let n = attempts.fetch_add(1, Ordering::SeqCst);
        let delay = delay(n);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(Response::new(format!("attempt {n}")))
        })
    }
}

/// The call's deadline is the earlier of the service config's `timeout` (grpc-go wraps the call
/// in it) and the caller's: one slow attempt, then DEADLINE_EXCEEDED, never a retry.
#[tokio::test]
async fn the_earlier_of_the_config_timeout_and_the_callers_deadline_ends_the_call() {
    let rows = [
        ("config timeout", Duration::from_millis(100), None),
        (
            "caller's deadline",
            Duration::from_secs(30),
            Some(Duration::from_millis(80)),
        ),
    ];
    for (row, config_timeout, callers_deadline) in rows {
        let attempts = AtomicU32::new(0);
        let executor = executor_with(|s| s.call_timeout = Some(config_timeout));
        let slow_attempts = slow(&attempts, |_| Duration::from_secs(1));
        let status = executor
            .call_unkeyed(
                MethodClass::Idempotent,
                7u32,
                callers_deadline,
                slow_attempts,
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{row}");
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "{row}");
    }
}

/// A per-attempt limit exists only when asked for (`perAttemptRecvTimeout`): a slow first attempt
/// is cut off and retried within the call's deadline.
#[tokio::test]
async fn a_per_attempt_limit_cuts_a_slow_attempt_and_retries_it() {
    let attempts = AtomicU32::new(0);
    let executor = executor_with(|s| {
        s.call_timeout = Some(Duration::from_secs(5));
        s.per_attempt_timeout = Some(Duration::from_millis(50));
    });
    let answer = executor
        .call_unkeyed(
            MethodClass::Idempotent,
            7u32,
            None,
            slow(&attempts, |n| {
                if n == 0 {
                    Duration::from_secs(2)
                } else {
                    Duration::ZERO
                }
            }),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "attempt 1");
}

/// Only a cancel that came from the executor's own timer is rewritten: a server's CANCELLED is
/// returned as it is.
#[tokio::test]
async fn a_cancel_from_elsewhere_is_not_rewritten() {
    let script = Script::new(vec![Err(Status::cancelled("the server gave up"))]);
    let executor = executor_with(|s| s.call_timeout = Some(Duration::from_secs(5)));
    let status = executor
        .call_unkeyed(MethodClass::Idempotent, 7u32, None, script.call())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Cancelled);
    assert_eq!(status.message(), "the server gave up");
}

/// The deadline also bounds the lookup of an unknown outcome.
#[tokio::test]
async fn the_deadline_bounds_the_lookups_of_an_unknown_outcome() {
    let script = Script::new(vec![Err(Status::unavailable("lost"))]);
    let executor = executor_with(|s| s.call_timeout = Some(Duration::from_millis(100)));
    let key = IdempotencyKey::parse("k-lookup").unwrap();
    let status = executor
        .call(
            MethodClass::KeyedMutation,
            7u32,
            Some(&key),
            None,
            script.call(),
            std::future::pending::<Result<Resolution<String>, Status>>,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(
        script.attempts(),
        1,
        "never resent while the outcome is unknown"
    );
}

/// More than one `grpc-retry-pushback-ms` value means do not retry, and that answer costs a
/// budget token even though its status is not retryable (A6 counts it as a failure).
#[tokio::test]
async fn repeated_pushback_values_stop_retries_and_count_against_the_budget() {
    let mut status = Status::unavailable("busy");
    status
        .metadata_mut()
        .append("grpc-retry-pushback-ms", "10".parse().unwrap());
    status
        .metadata_mut()
        .append("grpc-retry-pushback-ms", "10".parse().unwrap());
    let script = Script::new(vec![Err(status)]);
    let budget = Arc::new(GrpcRetryBudget::new(
        &RetryThrottling::new(10, 0.1).unwrap(),
    ));
    let executor = RetryExecutor::new(
        RetrySettings::new(
            GrpcRetryOwner::Channel,
            RetryPolicy::new(
                4,
                Duration::from_millis(1),
                Duration::from_millis(5),
                2.0,
                CodeSet::of(&[Code::Aborted]),
            )
            .unwrap(),
        )
        .with_server_ledger(LedgerDurability::Durable)
        .with_max_resolutions(3),
        Arc::clone(&budget),
    );
    let answer = executor
        .call_unkeyed(MethodClass::Idempotent, 7u32, None, script.call())
        .await
        .unwrap_err();
    assert_eq!(answer.code(), Code::Unavailable);
    assert_eq!(script.attempts(), 1);
    assert_eq!(
        budget.milli_tokens(),
        9_000,
        "the stop counted as a failure"
    );
}

/// A valid pushback (here `+5`, a signed decimal) sets the delay of the next retry.
#[tokio::test]
async fn a_signed_pushback_is_obeyed() {
    let mut status = Status::unavailable("busy");
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", "+5".parse().unwrap());
    let script = Script::new(vec![Err(status), Ok("done")]);
    let executor = executor_with(|_| {});
    let answer = executor
        .call_unkeyed(MethodClass::Idempotent, 7u32, None, script.call())
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "done");
    assert_eq!(script.attempts(), 2);
}

/// An executor told to send the key under another metadata name sends it there, on every
/// attempt, and not under the default name.
#[tokio::test]
async fn the_key_goes_under_the_configured_header() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let executor = executor_with(|settings| {
        *settings = settings.clone().with_key_header("x-request-id").unwrap();
    });
    let key = IdempotencyKey::parse("k-custom").unwrap();
    let mut answers = VecDeque::from([Err(Status::unavailable("down")), Ok("done".to_owned())]);
    let record = Arc::clone(&seen);
    let answer = executor
        .call(
            MethodClass::Idempotent,
            7u32,
            Some(&key),
            None,
            move |request: Request<u32>| {
                let header = |name: &str| {
                    request
                        .metadata()
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                };
                record
                    .lock()
                    .unwrap()
                    .push((header("x-request-id"), header("idempotency-key")));
                std::future::ready(answers.pop_front().unwrap().map(Response::new))
            },
            no_resolver(),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "done");
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(Some("k-custom".to_owned()), None); 2]
    );
    let policy = RetryPolicy::new(
        2,
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        CodeSet::of(&[Code::Unavailable]),
    )
    .unwrap();
    assert!(
        RetrySettings::new(GrpcRetryOwner::Application, policy)
            .with_key_header("Idempotency-Key")
            .is_err()
    );
}

/// A server that answers "my commit got no verdict" (`OUTCOME_UNKNOWN`) is asked what became of
/// the operation before anything else, even where the policy does not retry UNAVAILABLE; a plain
/// UNAVAILABLE ("did not take effect") under that policy is not retried at all.
#[tokio::test]
async fn an_outcome_the_server_could_not_confirm_is_resolved_before_anything_else() {
    let policy = RetryPolicy::new(
        4,
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        CodeSet::of(&[Code::Aborted]),
    )
    .unwrap();
    let executor = || {
        executor_with(|settings| {
            settings.owner = GrpcRetryOwner::Application;
            settings.policy = policy.clone();
        })
    };
    let unknown = || {
        Status::from(grpc_core_api::LedgerError::outcome_unknown(
            grpc_core_api::UnavailableKind::ConnectionLost,
        ))
    };
    let key = IdempotencyKey::parse("k-unknown").unwrap();

    let script = Script::new(vec![Err(unknown())]);
    let resolver = executor();
    let answer = resolver
        .call(
            MethodClass::KeyedMutation,
            7u32,
            Some(&key),
            Some(Duration::from_secs(5)),
            script.call(),
            || std::future::ready(Ok(Resolution::Committed("payment-u".to_owned()))),
        )
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "payment-u");
    assert_eq!(script.attempts(), 1);
    assert_eq!(resolver.stats().resolved_first(), 1);

    let script = Script::new(vec![Err(Status::from(
        grpc_core_api::LedgerError::unavailable(grpc_core_api::UnavailableKind::ConnectionLost),
    ))]);
    let refused = executor()
        .call(
            MethodClass::KeyedMutation,
            7u32,
            Some(&key),
            Some(Duration::from_secs(5)),
            script.call(),
            no_resolver(),
        )
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(script.attempts(), 1);
}
