//! A foreign client with its key in the request body: Python's grpcio (gRPC C-core) sends each
//! payment's AIP-155 `request_id` in the request, no idempotency metadata at all, and retries
//! UNAVAILABLE as its service config says. The guarded probe reads the key from `request_id` and
//! loses the first response of every call after its unit committed; C-core resends the same
//! bytes, and the guard answers each resend from its ledger. Every call ends OK and every handler
//! ran once.
//!
//! Needs `python3` with `grpcio` (`cargo xtask test` installs it with pip); fails, never skips,
//! without it.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use grpc_interop_tests::guarded::{GuardedOptions, GuardedProbe};

const CALLS: u32 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_keying_by_request_id_gets_each_payment_once_through_lost_responses() {
    let probe = GuardedProbe::start(GuardedOptions {
        key_field: Some("request_id"),
        lose_first_responses: true,
        lease: Duration::from_secs(5),
        ..GuardedOptions::default()
    })
    .await
    .unwrap();
    let config = r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
    let calls: Vec<serde_json::Value> = (0..CALLS)
        .map(|n| {
            serde_json::json!({
                "call_id": format!("payment-{n}"),
                "script": "ok",
                "timeout_s": 10.0,
                "request_id": format!("8f14e45f-ceea-4e7a-9f2b-{n:012}"),
            })
        })
        .collect();
    let addr = probe.addr.to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg("python/grpcio_client.py")
            .arg(addr)
            .arg(config)
            .arg(serde_json::Value::Array(calls).to_string())
            .output()
            .expect("python3 must be installed to run this test")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the grpcio client failed (is grpcio installed? `python3 -m pip install grpcio`): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let codes: Vec<&str> = results
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        vec!["OK"; CALLS as usize],
        "every payment acknowledged"
    );
    assert_eq!(
        probe.lost.load(Ordering::SeqCst),
        CALLS,
        "every first response was lost"
    );
    assert_eq!(
        probe.handlers.load(Ordering::SeqCst),
        CALLS,
        "each payment ran once"
    );
    assert_eq!(
        probe.attempts.load(Ordering::SeqCst),
        2 * CALLS,
        "each resend was answered from the ledger"
    );
}
