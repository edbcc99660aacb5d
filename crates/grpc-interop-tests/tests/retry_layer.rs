//! The RetryLayer beyond the interop table (which holds it to gRPC C-core and the executor):
//! hedging, keyed mutations, streams, the retry buffer, and the configs it refuses, against the
//! scripted tonic probe server.

use std::time::{Duration, Instant};

use grpc_core_api::{GrpcMethod, LedgerDurability};
use grpc_interop_tests::{DESCRIPTOR_SET, METHOD, ProbeServer, lazy_channel, pb};
use grpc_policy::{
    GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog, MethodClass, MethodInfo, RefusalReason,
};
use grpc_tonic::{RetryLayer, RetryLayerBuilder, RetryLayerError, RetryService};
use tonic::transport::Channel;
use tonic::{Code, Request};

type Client = pb::probe_client::ProbeClient<RetryService<Channel>>;

const RETRY: &str = r#""retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#;

fn config(method_config: &str) -> grpc_policy::ServiceConfig {
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "interop.v1.Probe"}}], {method_config}}}]}}"#
    );
    GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel)
        .parse(&json)
        .expect("a valid config")
}

fn catalog() -> MethodCatalog {
    MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET).unwrap()
}

/// The probe's `Call` marked as a keyed mutation.
fn keyed_catalog() -> MethodCatalog {
    let mut catalog = catalog();
    catalog
        .mark_keyed_mutation(&GrpcMethod::parse(METHOD).unwrap())
        .unwrap();
    catalog
}

fn client(server: &ProbeServer, builder: RetryLayerBuilder) -> (Client, RetryLayer) {
    let layer = builder.build().expect("the layer accepts the config");
    let channel = lazy_channel(server.addr());
    let client = pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(&layer, channel));
    (client, layer)
}

fn probe(call_id: &str, script: &str) -> pb::ProbeRequest {
    pb::ProbeRequest {
        call_id: call_id.to_owned(),
        script: script.to_owned(),
        request_id: String::new(),
    }
}

fn with_key(message: pb::ProbeRequest, key: &str) -> Request<pb::ProbeRequest> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
}

#[test]
fn the_layer_is_built_only_for_a_safe_config() {
    // (The layer makes the channel the retry owner: there is no other owner to refuse.)
    // A retry covering a keyed mutation on a server without a durable ledger is refused.
    let refused = RetryLayer::builder(config(RETRY), keyed_catalog())
        .server_ledger(LedgerDurability::Volatile)
        .build()
        .unwrap_err();
    assert!(
        matches!(&refused, RetryLayerError::UnsafeConfig(findings) if !findings.is_empty()),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_mutation_is_resent_under_its_key_when_its_outcome_is_unknown() {
    let server = ProbeServer::start().await;
    let builder = RetryLayer::builder(config(RETRY), keyed_catalog())
        .server_ledger(LedgerDurability::Durable);
    let (mut client, layer) = client(&server, builder);
    let answer = client
        .call(with_key(probe("keyed", "fail UNAVAILABLE 1"), "order-1"))
        .await
        .unwrap();
    assert_eq!(answer.get_ref().attempt, 2);
    let keys: Vec<_> = server
        .attempts("keyed")
        .iter()
        .map(|a| (a.key.clone(), a.previous_attempts))
        .collect();
    assert_eq!(
        keys,
        [
            (Some("order-1".to_owned()), None),
            (Some("order-1".to_owned()), Some(1))
        ]
    );
    let stats = layer.stats();
    assert_eq!(
        stats.resolved_first(),
        1,
        "the unknown outcome was resolved by a resend under the same key"
    );

    // Without its key, a keyed mutation that was sent is never sent again.
    let status = client
        .call(probe("unkeyed", "fail UNAVAILABLE 1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.attempts("unkeyed").len(), 1);
    assert_eq!(
        stats.refusals().get(&RefusalReason::MissingKey),
        Some(&1),
        "{:?}",
        stats.refusals()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_not_declared_safe_is_never_resent_once_sent() {
    let method = GrpcMethod::parse(METHOD).unwrap();
    // Declared non-idempotent: a retry policy covering it is refused outright.
    let mut declared = catalog();
    declared.mark_non_idempotent(&method).unwrap();
    let refused = RetryLayer::builder(config(RETRY), declared)
        .build()
        .unwrap_err();
    assert!(refused.to_string().contains("non-idempotent"), "{refused}");
    // Undeclared (the .proto says nothing): the validator only warns, and the layer treats it
    // as non-idempotent, never sending a sent call again.
    let server = ProbeServer::start().await;
    let mut undeclared = catalog();
    undeclared.declare(MethodInfo {
        method,
        class: MethodClass::NonIdempotent,
        declared: false,
        client_streaming: false,
        server_streaming: false,
    });
    let (mut client, layer) = client(&server, RetryLayer::builder(config(RETRY), undeclared));
    let status = client
        .call(probe("non-idempotent", "fail UNAVAILABLE 1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.attempts("non-idempotent").len(), 1);
    assert_eq!(
        layer.stats().refusals().get(&RefusalReason::NotIdempotent),
        Some(&1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_is_replayed_whole_on_the_next_attempt() {
    let server = ProbeServer::start().await;
    let builder = RetryLayer::builder(config(RETRY), catalog());
    let (mut client, _) = client(&server, builder);
    let messages = vec![
        probe("upload", "fail UNAVAILABLE 1"),
        probe("", "second"),
        probe("", "third"),
    ];
    let answer = client
        .upload(tokio_stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((answer.attempt, answer.messages), (2, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_past_the_buffer_commits_the_call() {
    let server = ProbeServer::start().await;
    let builder = RetryLayer::builder(config(RETRY), catalog()).per_call_buffer(8);
    let (mut client, layer) = client(&server, builder);
    let status = client
        .call(probe("too-big-to-keep", "fail UNAVAILABLE 1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.attempts("too-big-to-keep").len(), 1);
    assert_eq!(
        layer
            .stats()
            .refusals()
            .get(&RefusalReason::PrefixDelivered),
        Some(&1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_after_its_first_messages_is_not_retried() {
    let server = ProbeServer::start().await;
    let builder = RetryLayer::builder(config(RETRY), catalog());
    let (mut client, _) = client(&server, builder);
    let mut stream = client
        .watch(probe("watch", "stream 2 UNAVAILABLE"))
        .await
        .expect("the response head commits the call")
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert!(stream.message().await.unwrap().is_some());
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.attempts("watch").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_without_a_config_passes_through() {
    let server = ProbeServer::start().await;
    // Only Upload is configured; Call is not retried.
    let json = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "interop.v1.Probe", "method": "Upload"}}], {RETRY}}}]}}"#
    );
    let config = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel)
        .parse(&json)
        .unwrap();
    let (mut client, _) = client(&server, RetryLayer::builder(config, catalog()));
    let status = client
        .call(probe("unconfigured", "fail UNAVAILABLE 1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(server.attempts("unconfigured").len(), 1);
}

const HEDGING: &str = r#""hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.1s", "nonFatalStatusCodes": ["UNAVAILABLE"]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedging_sends_copies_apart_and_the_first_answer_wins() {
    let server = ProbeServer::start().await;
    let (mut client, layer) = client(&server, RetryLayer::builder(config(HEDGING), catalog()));
    // Every copy takes 0.35 s: copies go at 0, 0.1 and 0.2 s, and the first answers at 0.35 s.
    let started = Instant::now();
    let answer = client.call(probe("slow", "delay 350")).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(answer.get_ref().attempt, 1, "the first copy answered first");
    let attempts = server.attempts("slow");
    assert_eq!(
        attempts
            .iter()
            .map(|a| a.previous_attempts)
            .collect::<Vec<_>>(),
        [None, Some(1), Some(2)]
    );
    let gap = attempts[1].at.duration_since(attempts[0].at);
    assert!(
        gap >= Duration::from_millis(90),
        "hedgingDelay apart: {gap:?}"
    );
    assert!(elapsed < Duration::from_millis(700), "{elapsed:?}");
    assert_eq!(layer.stats().hedges(), 2);

    // A non-fatal status sends the next copy at once; a fatal one is the answer.
    let started = Instant::now();
    let answer = client
        .call(probe("non-fatal", "fail UNAVAILABLE 1"))
        .await
        .unwrap();
    assert_eq!(answer.get_ref().attempt, 2);
    assert!(started.elapsed() < Duration::from_millis(90), "at once");
    let status = client
        .call(probe("fatal", "fail INTERNAL always"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(server.attempts("fatal").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_methods_safe_to_send_twice_are_hedged() {
    let server = ProbeServer::start().await;
    // A keyed mutation on a durable ledger is hedged with its key, and only with it.
    let builder = RetryLayer::builder(config(HEDGING), keyed_catalog())
        .server_ledger(LedgerDurability::Durable);
    let (mut client, _) = client(&server, builder);
    client
        .call(with_key(probe("keyed-hedged", "delay 250"), "order-9"))
        .await
        .unwrap();
    let keys: Vec<_> = server
        .attempts("keyed-hedged")
        .iter()
        .map(|a| a.key.clone())
        .collect();
    assert_eq!(keys, vec![Some("order-9".to_owned()); 3]);
    client
        .call(probe("keyless-hedged", "delay 250"))
        .await
        .unwrap();
    assert_eq!(
        server.attempts("keyless-hedged").len(),
        1,
        "no key: one copy"
    );
}

/// A server that read a keyed mutation and then reset its stream (RST_STREAM INTERNAL_ERROR) may
/// have committed it. The caller would see INTERNAL, which the policy does not list, but the
/// outcome is unknown: with its key and a durable ledger the layer resends it under the same key,
/// which the ledger answers. Without a key the caller gets INTERNAL, as grpc-go reports that reset.
#[tokio::test]
async fn a_keyed_mutation_whose_stream_was_reset_is_resent_under_its_key() {
    use grpc_interop_tests::raw_h2::{raw_server, reset_first_after_request};

    let (addr, streams) = raw_server(reset_first_after_request).await;
    let layer = RetryLayer::builder(config(RETRY), keyed_catalog())
        .server_ledger(LedgerDurability::Durable)
        .build()
        .unwrap();
    let mut client =
        pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(&layer, lazy_channel(addr)));
    client
        .call(with_key(probe("reset", "ok"), "k-reset"))
        .await
        .expect("resent under its key and answered");
    assert_eq!(streams.load(std::sync::atomic::Ordering::SeqCst), 2);

    let (addr, streams) = raw_server(reset_first_after_request).await;
    let mut client =
        pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(&layer, lazy_channel(addr)));
    let status = client
        .call(Request::new(probe("reset", "ok")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(streams.load(std::sync::atomic::Ordering::SeqCst), 1);
}
