//! What tonic's transport errors prove, pinned against raw HTTP/2 servers (the `h2` crate) and a
//! real `tonic::transport::Channel`: a refused stream, a stream above a GOAWAY's last stream and a
//! refused connection never reached the server application; a server that dies mid-call leaves
//! the outcome unknown. A tonic, hyper or h2 upgrade that changes these shapes fails here, before
//! it silently changes what the executor retries.
//!
//! `grpc-tonic-client-only` compiles this file again against a tonic built without its `server`
//! feature, where tonic reports some of these failures with other codes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::{IdempotencyKey, LedgerDurability};
// By path rather than through the crate, so that grpc-tonic-client-only compiles this file
// against a client-only tonic without the probe server's dependencies.
#[path = "../src/raw_h2.rs"]
#[allow(unreachable_pub)]
mod raw_h2;

use grpc_policy::{
    CodeSet, GrpcRetryBudget, GrpcRetryOwner, MethodClass, RetryPolicy, RetryThrottling,
};
use grpc_tonic::{
    CommitObserver, Resolution, RetryExecutor, RetrySettings, TransportFailure, transport_failure,
};
use http::uri::PathAndQuery;
use raw_h2::{
    Behaviour, Note, Script, die_mid_first_call, goaway_then, raw_server, refuse_first,
    reset_first_after_request,
};
use tonic::{Code, Request, Response, Status};

/// A channel to `addr` on loopback, connecting on its first call. (This file is also compiled in
/// `grpc-tonic-client-only`, without the interop crate's library, so it keeps its own.)
fn lazy_channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback address is a valid URI")
        .connect_lazy()
}

/// One unary call on a real tonic Channel.
async fn call(addr: SocketAddr) -> Result<Response<Note>, Status> {
    let channel = lazy_channel(addr);
    unary(channel, Request::new(Note { text: "hi".into() })).await
}

/// One unary call on `channel`, wrapped as the executor's users wrap it (so that it sees A6's
/// commit point).
async fn unary(
    channel: tonic::transport::Channel,
    request: Request<Note>,
) -> Result<Response<Note>, Status> {
    let mut grpc = tonic::client::Grpc::new(CommitObserver::new(channel));
    grpc.ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(
        request,
        PathAndQuery::from_static("/notes.v1.Notes/Write"),
        tonic_prost::ProstCodec::<Note, Note>::default(),
    )
    .await
}

/// The errors in `status`'s source chain, by type name, for the pins below.
fn chain_has<E: std::error::Error + 'static>(status: &Status, check: impl Fn(&E) -> bool) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.downcast_ref::<E>().is_some_and(&check) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Whether tonic was built as a client only: its `server` feature is what maps a bare h2 error to
/// a code by its reason. Within the workspace's build cargo unifies that feature in; `cargo xtask
/// test` builds grpc-tonic-client-only on its own with `EXPECT_CLIENT_ONLY_TONIC=1`, and the test
/// below then checks that the build it runs in really is client-only.
fn client_only_tonic() -> bool {
    let bare = tonic::Status::from_error(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
    bare.code() != Code::Unavailable
}

/// The code differs by tonic's features: with `server`, tonic maps the h2 reason
/// (REFUSED_STREAM is UNAVAILABLE); a client-only tonic does not, and says UNKNOWN. The evidence,
/// read from the error chain, is the same in both, which is why the executor reads the chain.
#[tokio::test]
async fn a_refused_stream_never_reached_the_application() {
    if std::env::var_os("EXPECT_CLIENT_ONLY_TONIC").is_some() {
        assert!(
            client_only_tonic(),
            "tonic's server feature is on in this build"
        );
    }
    let (addr, _) = raw_server(|_| Behaviour::Refuse).await;
    let status = call(addr).await.unwrap_err();
    assert!(
        chain_has::<h2::Error>(&status, |e| e.is_remote()
            && e.is_reset()
            && e.reason() == Some(h2::Reason::REFUSED_STREAM)),
        "the shape changed: {status:?}"
    );
    let expected = if client_only_tonic() {
        Code::Unknown
    } else {
        Code::Unavailable
    };
    assert_eq!(status.code(), expected);
    assert_eq!(transport_failure(&status), TransportFailure::NotProcessed);
}

#[tokio::test]
async fn a_refused_connection_never_reached_the_server() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let status = call(addr).await.unwrap_err();
    assert!(
        chain_has::<tonic::ConnectError>(&status, |_| true),
        "the shape changed: {status:?}"
    );
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        transport_failure(&status),
        TransportFailure::NeverLeftClient
    );
}

/// GOAWAY with last-stream-id 0 while the client's stream 1 is already in the server's socket:
/// the stream is above the last one the server will process.
#[tokio::test]
async fn a_stream_above_the_goaway_never_reached_the_application() {
    let (addr, _) = goaway_then(|_| Behaviour::Answer).await;
    let status = call(addr).await.unwrap_err();
    assert!(
        chain_has::<h2::Error>(&status, |e| e.is_go_away() && e.is_remote()),
        "the shape changed: {status:?}"
    );
    assert_eq!(transport_failure(&status), TransportFailure::NotProcessed);
}

#[tokio::test]
async fn a_server_dying_mid_call_leaves_the_outcome_unknown() {
    let (addr, _) = raw_server(|_| Behaviour::DieMidCall).await;
    let status = call(addr).await.unwrap_err();
    assert!(
        chain_has::<std::io::Error>(&status, |_| true),
        "the shape changed: {status:?}"
    );
    assert_ne!(
        status.code(),
        Code::Unavailable,
        "tonic still reports a dead server as something no policy retries"
    );
    assert_eq!(transport_failure(&status), TransportFailure::ConnectionLost);
}

fn executor(retryable: &[Code]) -> RetryExecutor {
    let policy = RetryPolicy::new(
        3,
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        CodeSet::of(retryable),
    )
    .unwrap();
    RetryExecutor::new(
        RetrySettings::new(GrpcRetryOwner::Channel, policy)
            .with_server_ledger(LedgerDurability::Durable)
            .with_max_resolutions(3)
            .with_call_timeout(Duration::from_secs(10)),
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    )
}

/// One unkeyed call of `class` through `executor` to the server at `addr` (nothing to resolve).
async fn unkeyed_call(
    executor: &RetryExecutor,
    addr: SocketAddr,
    class: MethodClass,
) -> Result<Response<Note>, Status> {
    let channel = lazy_channel(addr);
    executor
        .call_unkeyed(
            class,
            Note {
                text: "a call".into(),
            },
            None,
            |request| unary(channel.clone(), request),
        )
        .await
}

/// A refused stream is resent once at once, even for a method that is never retried and a policy
/// that does not list the code: nothing reached the application.
#[tokio::test]
async fn the_executor_resends_a_refused_stream_once_transparently_whatever_the_method() {
    let (addr, streams) = raw_server(refuse_first).await;
    let executor = executor(&[Code::Aborted]);
    let answer = unkeyed_call(&executor, addr, MethodClass::NonIdempotent)
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), &Note::default());
    assert_eq!(streams.load(Ordering::SeqCst), 2);
    let stats = executor.stats();
    assert_eq!(stats.transparent_retries(), 1);
    assert_eq!(stats.retries(), 0, "not a policy retry");
}

/// A stream refused again after its transparent resend reaches the caller as UNAVAILABLE, as
/// gRPC's own clients report it, whatever code tonic gave it (which depends on tonic's features).
#[tokio::test]
async fn the_executor_reports_a_refused_stream_as_unavailable() {
    let (addr, streams) = raw_server(|_| Behaviour::Refuse).await;
    let executor = executor(&[Code::Aborted]);
    let status = unkeyed_call(&executor, addr, MethodClass::Idempotent)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(streams.load(Ordering::SeqCst), 2, "one transparent resend");
}

/// A keyed mutation whose server died mid-call has an unknown outcome: the executor asks what
/// became of it before resending, with the same key.
#[tokio::test]
async fn a_keyed_mutation_cut_off_by_a_dead_server_is_resolved_first() {
    let (addr, streams) = raw_server(die_mid_first_call).await;
    let channel = lazy_channel(addr);
    let executor = executor(&[Code::Unavailable]);
    let key = IdempotencyKey::parse("k-dead").unwrap();
    let lookups = AtomicU32::new(0);
    let answer = executor
        .call_keyed(
            Note { text: "pay".into() },
            &key,
            None,
            |request| unary(channel.clone(), request),
            || {
                lookups.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Status>(Resolution::<Note>::NotFound) }
            },
        )
        .await
        .unwrap();
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        1,
        "resolved before resending"
    );
    assert_eq!(answer.get_ref(), &Note::default());
    assert_eq!(streams.load(Ordering::SeqCst), 2);
    assert_eq!(executor.stats().resolved_first(), 1);
}

/// A server that read the request and then reset the stream (RST_STREAM INTERNAL_ERROR) may have
/// run it: the evidence is an unknown outcome, and the caller is told INTERNAL, as grpc-go and
/// C-core report that reason, whatever tonic's features say. An idempotent call whose policy does
/// not list INTERNAL is not retried.
#[tokio::test]
async fn a_stream_reset_after_the_request_is_internal_with_an_unknown_outcome() {
    let (addr, streams) = raw_server(|_| Behaviour::ResetAfterRequest).await;
    let status = call(addr).await.unwrap_err();
    assert!(
        chain_has::<h2::Error>(&status, |e| e.is_remote()
            && e.is_reset()
            && e.reason() == Some(h2::Reason::INTERNAL_ERROR)),
        "the shape changed: {status:?}"
    );
    assert_eq!(transport_failure(&status), TransportFailure::StreamReset);
    assert!(TransportFailure::StreamReset.outcome_unknown());

    let executor = executor(&[Code::Unavailable]);
    let status = unkeyed_call(&executor, addr, MethodClass::Idempotent)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert_eq!(
        streams.load(Ordering::SeqCst),
        2,
        "the pin's call and one attempt"
    );
}

/// A keyed mutation whose stream was reset after its request has an unknown outcome even though
/// its status (INTERNAL) is in no retry policy: against a durable ledger the executor asks what
/// became of it, then resends under the same key.
#[tokio::test]
async fn a_keyed_mutation_whose_stream_was_reset_is_resolved_first() {
    let (addr, streams) = raw_server(reset_first_after_request).await;
    let channel = lazy_channel(addr);
    let executor = executor(&[Code::Unavailable]);
    let key = IdempotencyKey::parse("k-reset").unwrap();
    let lookups = AtomicU32::new(0);
    let answer = executor
        .call_keyed(
            Note { text: "pay".into() },
            &key,
            None,
            |request| unary(channel.clone(), request),
            || {
                lookups.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Status>(Resolution::<Note>::NotFound) }
            },
        )
        .await
        .expect("resolved, then resent under the same key");
    assert_eq!(answer.get_ref(), &Note::default());
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
    assert_eq!(streams.load(Ordering::SeqCst), 2);
}

/// A6's commit point: UNAVAILABLE in the trailers after response headers is the call's answer and
/// is not retried (the application began answering), while the same status in a trailers-only
/// response is retried as the policy says.
#[tokio::test]
async fn a_failure_after_response_headers_is_committed_and_never_retried() {
    let cases: [(&str, Script, u32); 2] = [
        ("after headers", |_| Behaviour::UnavailableAfterHeaders, 1),
        ("trailers-only", |_| Behaviour::UnavailableTrailersOnly, 3),
    ];
    for (case, script, expected_streams) in cases {
        let (addr, streams) = raw_server(script).await;
        let executor = executor(&[Code::Unavailable]);
        let status = unkeyed_call(&executor, addr, MethodClass::Idempotent)
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(streams.load(Ordering::SeqCst), expected_streams, "{case}");
        let committed = executor
            .stats()
            .refusals()
            .get(&grpc_policy::RefusalReason::PrefixDelivered)
            .copied();
        assert_eq!(committed, (expected_streams == 1).then_some(1), "{case}");
    }
}

/// A keyed mutation whose response headers arrived before the call failed is not given up on:
/// against a durable ledger its outcome is looked up (a lookup is not a retry), and resent under
/// the same key only if nothing was recorded.
#[tokio::test]
async fn a_keyed_mutation_failing_after_response_headers_is_looked_up() {
    let (addr, _) = raw_server(|_| Behaviour::UnavailableAfterHeaders).await;
    let channel = lazy_channel(addr);
    let executor = executor(&[Code::Unavailable]);
    let key = IdempotencyKey::parse("k-headers").unwrap();
    let lookups = AtomicU32::new(0);
    let answer = executor
        .call_keyed(
            Note { text: "pay".into() },
            &key,
            None,
            |request| unary(channel.clone(), request),
            || {
                lookups.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok::<_, Status>(Resolution::Committed(Note {
                        text: "paid".into(),
                    }))
                }
            },
        )
        .await
        .unwrap();
    assert_eq!(lookups.load(Ordering::SeqCst), 1, "looked up once");
    assert_eq!(answer.get_ref().text, "paid", "the recorded outcome");
}
