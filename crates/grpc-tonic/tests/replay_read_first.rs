//! A resend is answered by one read. A request that says it is a resend
//! (`grpc-previous-rpc-attempts`, which gRPC's clients send on every attempt after the first) is
//! looked up by its key before any claim, in a read-only unit; every replay runs in one. A finished operation is replayed, or refused for
//! another request, from that read alone. Anything else (no record, or one in progress) goes on
//! to the insert-first claim, which alone decides who runs the handler. The ledger here counts
//! its claims and reads.

mod support;

use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_tonic::{AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, KeyedMutationGuard};
use support::counting::{Asked, Counting};
use support::{Writes, scripted};
use tokio::sync::Notify;
use tonic::{Code, Request, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn schema() -> RequestSchema {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors)).unwrap()
}

fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

fn guarded() -> (KeyedMutationGuard<Counting>, InMemoryStore, Arc<Asked>) {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let asked = Arc::new(Asked::default());
    let units = Counting {
        store: store.clone(),
        asked: Arc::clone(&asked),
    };
    let hasher = KeyHasher::hmac_sha256(&[7; 32]).unwrap();
    let guard = KeyedMutationGuard::new(units, GuardConfig::new(hasher, schema()));
    (guard, store, asked)
}

/// A payment of `amount` under `key`, as attempt `previous + 1` (gRPC sends the header only
/// after the first).
fn request(key: &str, amount: i64, previous: u32) -> Request<Pay> {
    let mut request = Request::new(Pay { amount });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    if previous > 0 {
        request.metadata_mut().insert(
            "grpc-previous-rpc-attempts",
            previous.to_string().parse().unwrap(),
        );
    }
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
    request
}

/// Runs the payment: its handler writes `payment {key}` and, when `hold` is given, waits for it
/// before committing (`started` says it has begun).
async fn pay(
    guard: &KeyedMutationGuard<Counting>,
    key: &str,
    amount: i64,
    previous: u32,
    hold: Option<(Arc<Notify>, Arc<Notify>)>,
) -> Result<tonic::Response<String>, Status> {
    let payment = format!("payment {key}");
    guard
        .run(
            &method(),
            request(key, amount, previous),
            scripted(
                move |unit: Writes, _pay: Pay| async move {
                    if let Some((started, release)) = hold {
                        started.notify_one();
                        release.notified().await;
                    }
                    unit.write_business(&payment);
                    Ok(Committed {
                        response: "paid".to_owned(),
                        outcome: OutcomeReference::parse("payment").unwrap(),
                    })
                },
                |_outcome| async move { Ok("paid (replayed)".to_owned()) },
            ),
        )
        .await
}

/// The read-only units the guard has begun.
fn reads(asked: &Asked) -> u32 {
    asked.reads.load(std::sync::atomic::Ordering::SeqCst)
}

fn replayed(response: &tonic::Response<String>) -> bool {
    response.metadata().get(REPLAYED_METADATA_KEY).is_some()
}

#[tokio::test]
async fn a_resend_of_a_committed_operation_is_answered_by_one_read_without_a_claim() {
    let (guard, store, asked) = guarded();
    let first = pay(&guard, "pay-1", 5, 0, None).await.unwrap();
    assert!(!replayed(&first));
    assert_eq!(asked.counts(), (1, 0), "the first attempt claims");
    assert_eq!(reads(&asked), 0, "and begins no read-only unit");

    let resend = pay(&guard, "pay-1", 5, 1, None).await.unwrap();
    assert!(replayed(&resend));
    assert_eq!(resend.get_ref(), "paid (replayed)");
    assert_eq!(asked.counts(), (1, 1), "one read, no claim");
    assert_eq!(
        reads(&asked),
        1,
        "the read and the replay in one read-only unit"
    );
    assert_eq!(store.committed_business(), ["payment pay-1"]);

    // A duplicate that does not say it is a resend takes the claim's path to the same answer.
    let duplicate = pay(&guard, "pay-1", 5, 0, None).await.unwrap();
    assert!(replayed(&duplicate));
    assert_eq!(asked.counts(), (2, 1));
    assert_eq!(
        reads(&asked),
        2,
        "the claim's unit is rolled back and the replay runs in a read-only unit"
    );
}

#[tokio::test]
async fn a_resend_with_another_body_is_refused_by_the_read() {
    let (guard, _store, asked) = guarded();
    pay(&guard, "pay-2", 5, 0, None).await.unwrap();
    let refused = pay(&guard, "pay-2", 6, 2, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(asked.counts(), (1, 1), "refused from the read, no claim");
    assert_eq!(reads(&asked), 1);
}

#[tokio::test]
async fn a_resend_the_store_has_no_record_of_is_claimed_and_runs_once() {
    // The first attempt never reached the server; its resend is the first the store sees.
    let (guard, store, asked) = guarded();
    let answer = pay(&guard, "pay-3", 5, 1, None).await.unwrap();
    assert!(!replayed(&answer));
    assert_eq!(asked.counts(), (1, 1), "read, found nothing, claimed");
    assert_eq!(reads(&asked), 1, "the read's unit, then the claim's");
    assert_eq!(store.committed_business(), ["payment pay-3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_of_an_operation_in_flight_goes_on_to_the_claim() {
    let (guard, store, asked) = guarded();
    let guard = Arc::new(guard);
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let first = {
        let (guard, hold) = (
            Arc::clone(&guard),
            (Arc::clone(&started), Arc::clone(&release)),
        );
        tokio::spawn(async move { pay(&guard, "pay-4", 5, 0, Some(hold)).await })
    };
    started.notified().await;
    // The in-memory claim is visible once made; the first unit holds it, uncommitted.
    let in_flight = pay(&guard, "pay-4", 5, 1, None).await.unwrap_err();
    assert_eq!(in_flight.code(), Code::Aborted);
    assert_eq!(
        asked.counts(),
        (2, 1),
        "the read found no finished record; the claim decided"
    );
    release.notify_one();
    first.await.unwrap().unwrap();
    let resend = pay(&guard, "pay-4", 5, 2, None).await.unwrap();
    assert!(replayed(&resend));
    assert_eq!(store.committed_business(), ["payment pay-4"]);
}

#[tokio::test]
async fn a_header_that_is_not_a_positive_count_is_no_resend() {
    let (guard, _store, asked) = guarded();
    pay(&guard, "pay-5", 5, 0, None).await.unwrap();
    for (n, header) in ["many", "0", "-1"].into_iter().enumerate() {
        let mut request = request("pay-5", 5, 0);
        request
            .metadata_mut()
            .insert("grpc-previous-rpc-attempts", header.parse().unwrap());
        let answer = guard
            .run(
                &method(),
                request,
                scripted(
                    |_unit: Writes, _pay: Pay| async move {
                        Ok(Committed {
                            response: String::new(),
                            outcome: OutcomeReference::parse("payment").unwrap(),
                        })
                    },
                    |_outcome| async move { Ok("paid (replayed)".to_owned()) },
                ),
            )
            .await
            .unwrap();
        assert!(replayed(&answer));
        assert_eq!(
            asked.counts(),
            (2 + n as u32, 0),
            "{header}: the claim's path, as for a first attempt"
        );
    }
}

/// In write-once mode the guard never claims: it looks the identity up, runs the handler and
/// records the finished operation once, in the handler's unit.
#[tokio::test]
async fn write_once_mode_looks_up_and_never_claims() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let asked = Arc::new(Asked::default());
    let units = Counting {
        store: store.clone(),
        asked: Arc::clone(&asked),
    };
    let config = GuardConfig::new(KeyHasher::Sha256, schema())
        .with_mode(GuardMode::WriteOnceInTransactionOnly);
    let guard = KeyedMutationGuard::new(units, config);
    let first = pay(&guard, "pay-6", 5, 0, None).await.unwrap();
    assert!(!replayed(&first));
    let again = pay(&guard, "pay-6", 5, 0, None).await.unwrap();
    assert!(replayed(&again));
    assert_eq!(asked.counts(), (0, 2), "a read each, no claim");
    assert_eq!(reads(&asked), 1, "the replay, in a read-only unit");
    assert_eq!(store.committed_business(), ["payment pay-6"]);
}
