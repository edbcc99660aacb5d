//! The chained demo driven by a foreign client: Python's grpcio (gRPC C-core) sends each payment
//! with its AIP-155 `request_id` as its only key, and retries as its own service config says.
//! The payments service (its guard reading the key from the body) posts to the postings service
//! under the key it derives from the payment's operation, while 30% of the payments' responses
//! and 20% of the postings' are lost after commit, 5% of the postings' streams are reset, and 15%
//! of payments fail after their posting committed. The client sends every payment it was not told
//! about again, same bytes; in the end each payment is acknowledged, with one payment row and one
//! posting in the two stores, the ones the client was told of.
//!
//! Needs `python3` with `grpcio` (`cargo xtask test` installs it with pip); fails, never skips,
//! without it.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use grpc_ledger_demo::{INJECTED_DELAY, open_postings_store, payments_server, postings_server};
use grpc_ledger_payments::{Faults, Store, UnitFailures, open_store, statement};
use grpc_tonic::GuardMode;
use grpc_tonic::testing::AfterCommitFaults;
use sea_orm::ConnectionTrait;

const PAYMENTS: usize = 60;

/// C-core's own reading of a retry policy for CreatePayment (it has no perAttemptRecvTimeout).
const CORE_CONFIG: &str = r#"{"methodConfig": [{"name": [{"service": "payments.v1.Payments", "method": "CreatePayment"}], "timeout": "5s", "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.01s", "maxBackoff": "0.2s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "ABORTED"]}}]}"#;

/// `sql`'s rows as (first column, second column) strings.
async fn pairs(db: &impl ConnectionTrait, sql: &str, run_id: &str) -> Vec<(String, String)> {
    let pattern = format!("acct-{run_id}-%");
    db.query_all_raw(statement(db, sql, vec![pattern.into()]))
        .await
        .unwrap()
        .iter()
        .map(|row| {
            (
                row.try_get_by_index(0).unwrap(),
                row.try_get_by_index(1).unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grpcio_client_keying_by_request_id_gets_one_payment_and_one_posting_each() {
    let dir = std::env::temp_dir();
    let process = std::process::id();
    let (payments_file, postings_file) = (
        dir.join(format!("chain-grpcio-payments-{process}.sqlite")),
        dir.join(format!("chain-grpcio-postings-{process}.sqlite")),
    );
    let (payments_store, postings_store) = (
        Store::Sqlite(payments_file.clone()),
        Store::Sqlite(postings_file.clone()),
    );
    let run_id = format!("grpcio{process}");
    let postings_faults = Arc::new(AfterCommitFaults::new(0.2, 0.05, 11));
    let payments_faults = Arc::new(Faults::new(0.3, 0.0, INJECTED_DELAY, 12));
    let unit_failures = Arc::new(UnitFailures::new(0.15, 13));

    let postings_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let postings_addr = postings_listener.local_addr().unwrap();
    let postings = tokio::spawn(postings_server(
        postings_store.clone(),
        GuardMode::ClaimFirst,
        Arc::clone(&postings_faults),
        format!("post-{run_id}"),
        postings_listener,
    ));
    let payments_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let payments_addr = payments_listener.local_addr().unwrap();
    let payments = tokio::spawn(payments_server(
        payments_store.clone(),
        GuardMode::ClaimFirst,
        Arc::clone(&payments_faults),
        Arc::clone(&unit_failures),
        postings_addr,
        format!("pay-{run_id}"),
        payments_listener,
    ));

    let (addr, client_run) = (payments_addr.to_string(), run_id.clone());
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg("python/grpcio_payments.py")
            .args([&addr, CORE_CONFIG, &client_run, &PAYMENTS.to_string(), "20"])
            .output()
            .expect("python3 must be installed to run this test")
    })
    .await
    .unwrap();
    payments.abort();
    postings.abort();
    assert!(
        output.status.success(),
        "the grpcio client failed (is grpcio installed? `python3 -m pip install grpcio`): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    let resent = results.iter().filter(|r| r["rounds"] != 1).count();
    println!(
        "{PAYMENTS} payments, {resent} sent again by the client; {} responses lost, {} postings \
         lost and {} reset, {} payments failed after posting",
        payments_faults.dropped.load(Ordering::Relaxed),
        postings_faults.dropped(),
        postings_faults.reset(),
        unit_failures.injected()
    );

    let (payments_db, _) = open_store(&payments_store).await.unwrap();
    let (postings_db, _) = open_postings_store(&postings_store).await.unwrap();
    let payment_rows = pairs(
        &payments_db,
        "SELECT p.account, l.posting_id FROM demo_payments p \
         JOIN demo_payment_postings l ON l.payment_id = p.payment_id WHERE p.account LIKE $1",
        &run_id,
    )
    .await;
    let posting_rows = pairs(
        &postings_db,
        "SELECT account, posting_id FROM demo_postings WHERE account LIKE $1",
        &run_id,
    )
    .await;
    let payment_ids = pairs(
        &payments_db,
        "SELECT account, payment_id FROM demo_payments WHERE account LIKE $1",
        &run_id,
    )
    .await;
    payments_db.close().await.unwrap();
    postings_db.close().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", payments_file.display()));
        let _ = std::fs::remove_file(format!("{}{suffix}", postings_file.display()));
    }

    let payment_of: BTreeMap<String, String> = payment_ids.into_iter().collect();
    let posting_of: BTreeMap<String, String> = posting_rows.iter().cloned().collect();
    assert_eq!(payment_rows.len(), PAYMENTS, "one payment row each");
    assert_eq!(payment_of.len(), PAYMENTS, "no account paid twice");
    assert_eq!(posting_rows.len(), PAYMENTS, "one posting each");
    assert_eq!(posting_of.len(), PAYMENTS, "no account posted twice");
    for result in &results {
        let account = result["account"].as_str().unwrap();
        assert_eq!(result["code"], "OK", "acknowledged in the end: {result}");
        assert_eq!(
            payment_of.get(account).map(String::as_str),
            result["payment_id"].as_str(),
            "the payment the client was told of: {result}"
        );
        assert_eq!(
            posting_of.get(account).map(String::as_str),
            result["posting_id"].as_str(),
            "the posting the client was told of: {result}"
        );
    }
    for (account, posting_id) in &payment_rows {
        assert_eq!(posting_of.get(account), Some(posting_id), "{account}");
    }
    assert!(payments_faults.dropped.load(Ordering::Relaxed) > 5);
    assert!(postings_faults.dropped() > 3);
    assert!(unit_failures.injected() > 3);
}
