//! A call whose operation another attempt holds (a hedged copy, a resend that overtook its first
//! attempt) under claim-committed-first: it waits, holding nothing, for that attempt to finish
//! and answers with its outcome; past `GuardConfig::in_flight_wait` it is told the operation is
//! in flight (ABORTED, retry after the lease left), and a claim given up meanwhile is said free
//! (a retry delay of zero). The handler runs once in every case.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use grpc_core_api::{
    KeyHasher, LeaseDuration, LedgerUnitsOfWork, OutcomeReference, REPLAYED_METADATA_KEY,
};
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{Committed, GuardConfig, GuardMode, HandlerError, KeyedMutationGuard};
use support::counting::{Asked, Counting};
use support::{Writes, create_payment, guarded_schema, keyed, scripted};
use tokio::sync::Notify;
use tonic::{Code, Response, Status};
use tonic_types::StatusExt;

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn guard<U: LedgerUnitsOfWork + 'static>(
    units: U,
    in_flight_wait: Duration,
) -> KeyedMutationGuard<U> {
    let mut config = GuardConfig::new(KeyHasher::Sha256, guarded_schema())
        .with_mode(GuardMode::ClaimCommittedFirst)
        .with_in_flight_wait(in_flight_wait);
    config.lease = LeaseDuration::new(Duration::from_secs(4)).unwrap();
    KeyedMutationGuard::new(units, config)
}

/// What the first attempt's handler does once released.
#[derive(Clone, Copy)]
enum Ends {
    Commits,
    FailsTransiently,
}

/// A payment under `key` whose handler counts itself in `ran`, says `started`, and waits for
/// `release` before it ends as `ends` says.
async fn pay<U: LedgerUnitsOfWork<Transaction = InMemoryUnit> + 'static>(
    guard: KeyedMutationGuard<U>,
    key: &'static str,
    ran: Arc<AtomicUsize>,
    started: Arc<Notify>,
    release: Arc<Notify>,
    ends: Ends,
) -> Result<Response<String>, Status> {
    let handler = scripted(
        move |writes: Writes, pay: Pay| async move {
            ran.fetch_add(1, Ordering::SeqCst);
            started.notify_one();
            release.notified().await;
            if let Ends::FailsTransiently = ends {
                return Err(HandlerError::Transient(Status::unavailable(
                    "the payment provider timed out",
                )));
            }
            writes.write_business(&format!("payment-{}", pay.amount));
            Ok(Committed {
                response: format!("payment-{}", pay.amount),
                outcome: OutcomeReference::parse(&format!("payment-{}", pay.amount)).unwrap(),
            })
        },
        |outcome: OutcomeReference| async move { Ok(outcome.as_str().to_owned()) },
    );
    let request = keyed(Pay { amount: 7 }, key, b"tenant-a");
    guard.run(&create_payment(), request, handler).await
}

/// The first attempt, running and held; its twin, sent while it runs; and the first's release.
struct Twins {
    first: tokio::task::JoinHandle<Result<Response<String>, Status>>,
    twin: tokio::task::JoinHandle<Result<Response<String>, Status>>,
    release: Arc<Notify>,
    ran: Arc<AtomicUsize>,
}

async fn twins<U: LedgerUnitsOfWork<Transaction = InMemoryUnit> + 'static>(
    guard: &KeyedMutationGuard<U>,
    key: &'static str,
    ends: Ends,
) -> Twins {
    let ran = Arc::new(AtomicUsize::new(0));
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let first = tokio::spawn(pay(
        guard.clone(),
        key,
        Arc::clone(&ran),
        Arc::clone(&started),
        Arc::clone(&release),
        ends,
    ));
    started.notified().await;
    // The twin's handler would say so if it ran; it must not.
    let twin = tokio::spawn(pay(
        guard.clone(),
        key,
        Arc::clone(&ran),
        Arc::new(Notify::new()),
        Arc::clone(&release),
        Ends::Commits,
    ));
    Twins {
        first,
        twin,
        release,
        ran,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_twin_answers_with_the_outcome_of_the_attempt_in_flight() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(store.clone(), Duration::from_secs(1));
    let twins = twins(&guard, "k-twin", Ends::Commits).await;
    // The twin found the claim and waits: it has not answered.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!twins.twin.is_finished(), "the twin waits for the first");
    twins.release.notify_one();
    let first = twins.first.await.unwrap().unwrap();
    let twin = twins.twin.await.unwrap().unwrap();
    assert_eq!(first.get_ref(), "payment-7");
    assert_eq!(
        twin.get_ref(),
        "payment-7",
        "the twin ends with the payment"
    );
    assert!(twin.metadata().get(REPLAYED_METADATA_KEY).is_some());
    assert_eq!(twins.ran.load(Ordering::SeqCst), 1);
    assert_eq!(store.committed_business(), vec!["payment-7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_its_wait_a_twin_is_told_the_operation_is_in_flight() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(store.clone(), Duration::from_millis(100));
    let twins = twins(&guard, "k-long", Ends::Commits).await;
    let refused = twins.twin.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    let retry = refused
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .expect("a retry delay");
    assert!(
        retry > Duration::from_secs(1),
        "retry after the lease left: {retry:?}"
    );
    twins.release.notify_one();
    assert_eq!(twins.first.await.unwrap().unwrap().get_ref(), "payment-7");
    assert_eq!(twins.ran.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_no_wait_a_twin_is_told_at_once() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(store.clone(), Duration::ZERO);
    let twins = twins(&guard, "k-now", Ends::Commits).await;
    let refused = tokio::time::timeout(Duration::from_secs(1), twins.twin)
        .await
        .expect("answered at once")
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), Code::Aborted);
    twins.release.notify_one();
    twins.first.await.unwrap().unwrap();
    assert_eq!(twins.ran.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_twin_of_an_attempt_that_gave_up_is_told_the_claim_is_free() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(store.clone(), Duration::from_secs(1));
    let twins = twins(&guard, "k-gave-up", Ends::FailsTransiently).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    twins.release.notify_one();
    let first = twins.first.await.unwrap().unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);
    let refused = twins.twin.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    let retry = refused
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .unwrap_or_default();
    assert!(
        retry < Duration::from_millis(50),
        "the claim is free: retry at once ({retry:?})"
    );
    assert_eq!(twins.ran.load(Ordering::SeqCst), 1);
    assert!(store.committed_business().is_empty());
}

/// A twin looks at the operation at pauses that double from 5 ms to 100 ms: over half a second
/// of waiting, about ten looks, not a busy loop on the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_twin_looks_at_doubling_pauses_not_in_a_busy_loop() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let asked = Arc::new(Asked::default());
    let units = Counting {
        store: store.clone(),
        asked: Arc::clone(&asked),
    };
    let guard = guard(units, Duration::from_secs(2));
    let twins = twins(&guard, "k-patient", Ends::Commits).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    twins.release.notify_one();
    assert_eq!(twins.twin.await.unwrap().unwrap().get_ref(), "payment-7");
    twins.first.await.unwrap().unwrap();
    let looks = asked.reads.load(Ordering::SeqCst);
    assert!(
        (2..=20).contains(&looks),
        "{looks} looks over half a second (5, 10, 20, 40, 80, then every 100 ms)"
    );
}
