//! Clients that listen to the server: a guard whose claim commits before a long handler answers
//! every duplicate ABORTED with a `google.rpc.RetryInfo` delay (the lease left), and the
//! RetryLayer and the executor wait that long before their next attempt instead of their own short
//! backoff. With a 10 ms initial backoff and five attempts, a client deaf to RetryInfo spends every
//! attempt in under a fifth of a second and gives up while the first handler still runs; one that
//! listens is answered with the replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::{IdempotencyKey, LedgerDurability, REPLAYED_METADATA_KEY};
use grpc_interop_tests::guarded::{GuardedOptions, GuardedProbe, keyed_layer_client};
use grpc_interop_tests::{lazy_channel, pb};
use grpc_policy::{CodeSet, GrpcRetryBudget, GrpcRetryOwner, RetryPolicy, RetryThrottling};
use grpc_tonic::{GuardMode, Resolution, RetryExecutor, RetrySettings};
use tonic::{Code, Request, Response, Status};

/// The lease of the guard's claims; a duplicate is told to come back after what is left of it.
const LEASE: Duration = Duration::from_millis(600);
/// How long the first call's handler runs: several leases.
const HANDLER: Duration = Duration::from_millis(1500);

/// Starts the guarded probe, its claims committed before a handler that takes `delay MS`, on a
/// loopback port; returns its address and its handler count.
async fn guarded_server() -> (std::net::SocketAddr, Arc<AtomicU32>) {
    let probe = GuardedProbe::start(GuardedOptions {
        mode: GuardMode::ClaimCommittedFirst,
        lease: LEASE,
        ..GuardedOptions::default()
    })
    .await
    .unwrap();
    (probe.addr, probe.handlers)
}

fn keyed(call_id: &str, script: &str, key: &str) -> Request<pb::ProbeRequest> {
    let mut request = Request::new(pb::ProbeRequest {
        call_id: call_id.to_owned(),
        script: script.to_owned(),
        request_id: String::new(),
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

/// Starts the first call (a long handler) on a plain client, and waits until its claim is made.
async fn first_call(
    addr: std::net::SocketAddr,
    key: &str,
    handlers: &AtomicU32,
) -> tokio::task::JoinHandle<Result<Response<pb::ProbeReply>, Status>> {
    let mut plain = pb::probe_client::ProbeClient::new(lazy_channel(addr));
    let request = keyed("pay", &format!("delay {}", HANDLER.as_millis()), key);
    let first = tokio::spawn(async move { plain.call(request).await });
    while handlers.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first
}

fn replayed<R>(response: &Response<R>) -> bool {
    response.metadata().get(REPLAYED_METADATA_KEY).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_retry_layer_waits_as_the_guards_retry_info_says_and_gets_the_replay() {
    let (addr, handlers) = guarded_server().await;
    let first = first_call(addr, "k-layer", &handlers).await;

    let mut client = keyed_layer_client(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "5s", "backoffMultiplier": 2, "retryableStatusCodes": ["ABORTED"]}}]}"#,
        addr,
    );
    let duplicate = client
        .call(keyed(
            "pay",
            &format!("delay {}", HANDLER.as_millis()),
            "k-layer",
        ))
        .await
        .expect("the duplicate outlasts the first handler by waiting as the server said");
    assert!(
        replayed(&duplicate),
        "the duplicate is answered with the replay"
    );
    let first = first.await.unwrap().expect("the first call commits");
    assert!(!replayed(&first));
    assert_eq!(handlers.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_executor_waits_as_the_guards_retry_info_says_and_gets_the_replay() {
    let (addr, handlers) = guarded_server().await;
    let first = first_call(addr, "k-executor", &handlers).await;

    let policy = RetryPolicy::new(
        5,
        Duration::from_millis(10),
        Duration::from_secs(5),
        2.0,
        CodeSet::of(&[Code::Aborted]),
    )
    .unwrap();
    let executor = RetryExecutor::new(
        RetrySettings::new(GrpcRetryOwner::Application, policy)
            .with_server_ledger(LedgerDurability::Durable),
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    );
    let client = pb::probe_client::ProbeClient::new(lazy_channel(addr));
    let message = pb::ProbeRequest {
        call_id: "pay".to_owned(),
        script: format!("delay {}", HANDLER.as_millis()),
        request_id: String::new(),
    };
    let duplicate = executor
        .call_keyed(
            message,
            &IdempotencyKey::parse("k-executor").unwrap(),
            None,
            |request| {
                let mut client = client.clone();
                async move { client.call(request).await }
            },
            || async { Ok(Resolution::<pb::ProbeReply>::NotFound) },
        )
        .await
        .expect("the duplicate outlasts the first handler by waiting as the server said");
    assert!(replayed(&duplicate));
    first.await.unwrap().expect("the first call commits");
    assert_eq!(handlers.load(Ordering::SeqCst), 1, "the handler ran once");
}
