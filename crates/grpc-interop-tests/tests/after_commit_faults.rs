//! grpc-tonic's public test helpers, used as an adopter would: `AfterCommitFaults` in front of a
//! guarded service loses 30% of the committed responses and resets the stream of 10% more, a
//! generated client over the RetryLayer retries only UNAVAILABLE, and `reconcile` then compares
//! what the client was told with the effects the handler made. Reset streams reach the client as
//! INTERNAL, which its policy does not list; they are resent under their key anyway (an unknown
//! outcome of a keyed mutation), so the run is exactly once.

use std::sync::Arc;

use grpc_interop_tests::guarded::{GuardedOptions, GuardedProbe, keyed_layer_client};
use grpc_interop_tests::pb;
use grpc_tonic::testing::{AfterCommitFaults, reconcile};
use tonic::Request;

const CALLS: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_responses_and_reset_streams_after_commit_reconcile_exactly_once() {
    let faults = Arc::new(AfterCommitFaults::new(0.3, 0.1, 0x5eed));
    let probe = GuardedProbe::start(GuardedOptions {
        after_commit_faults: Some(Arc::clone(&faults)),
        ..GuardedOptions::default()
    })
    .await
    .unwrap();
    let client = keyed_layer_client(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.005s", "maxBackoff": "0.05s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
        probe.addr,
    );

    let mut acknowledged = Vec::new();
    for n in 0..CALLS {
        let call_id = format!("payment-{n}");
        let mut request = Request::new(pb::ProbeRequest {
            call_id: call_id.clone(),
            script: "ok".into(),
            request_id: String::new(),
        });
        request
            .metadata_mut()
            .insert("idempotency-key", call_id.parse().unwrap());
        if client.clone().call(request).await.is_ok() {
            acknowledged.push(call_id);
        }
    }
    eprintln!(
        "{} of {CALLS} acknowledged; {} responses lost and {} streams reset after commit",
        acknowledged.len(),
        faults.dropped(),
        faults.reset()
    );
    let effects = probe.effects.lock().unwrap().clone();
    let report = reconcile(acknowledged.iter().cloned(), effects);
    assert!(report.exactly_once(), "{report:?}");
    assert!(
        faults.dropped() > 30 && faults.reset() > 10,
        "the faults struck: {} lost, {} reset",
        faults.dropped(),
        faults.reset()
    );
    assert!(
        acknowledged.len() >= CALLS * 95 / 100,
        "{} of {CALLS} acknowledged ({} lost, {} reset)",
        acknowledged.len(),
        faults.dropped(),
        faults.reset()
    );
}
