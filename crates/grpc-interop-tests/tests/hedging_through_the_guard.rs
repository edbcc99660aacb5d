//! A hedged keyed call through the real guard ends with the payment: the first copy claims and
//! runs the handler, the copies sent after it meet their twin in flight (the guard's ABORTED,
//! `IDEMPOTENCY_IN_FLIGHT`), and the RetryLayer's hedge waits for the copy that holds the claim
//! instead of ending on the guard's answer, in both guard modes, with ABORTED not among the
//! hedging policy's non-fatal codes. The handler runs once.

use std::sync::atomic::Ordering;

use grpc_interop_tests::guarded::{GuardedOptions, GuardedProbe, keyed_layer_client};
use grpc_interop_tests::pb;
use grpc_tonic::GuardMode;
use tonic::Request;

const HEDGED: &str = r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}],
    "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#;

async fn a_hedged_payment_ends_with_the_payment(mode: GuardMode) {
    let probe = GuardedProbe::start(GuardedOptions {
        mode,
        ..GuardedOptions::default()
    })
    .await
    .unwrap();
    let mut client = keyed_layer_client(HEDGED, probe.addr);
    for n in 0..5 {
        let mut request = Request::new(pb::ProbeRequest {
            call_id: format!("hedged-{n}"),
            // Longer than the hedging delay, so that the other copies arrive while it runs.
            script: "delay 400".to_owned(),
            request_id: String::new(),
        });
        request.metadata_mut().insert(
            "idempotency-key",
            format!("hedged-{mode:?}-{n}").parse().unwrap(),
        );
        let answer = client.call(request).await;
        assert!(answer.is_ok(), "{mode:?} call {n}: {answer:?}");
    }
    assert_eq!(
        probe.handlers.load(Ordering::SeqCst),
        5,
        "{mode:?}: one handler run per payment"
    );
    assert!(
        probe.attempts.load(Ordering::SeqCst) > 5,
        "{mode:?}: the calls were hedged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hedged_payment_ends_with_the_payment_under_claim_first() {
    a_hedged_payment_ends_with_the_payment(GuardMode::ClaimFirst).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hedged_payment_ends_with_the_payment_under_claim_committed_first() {
    a_hedged_payment_ends_with_the_payment(GuardMode::ClaimCommittedFirst).await;
}
