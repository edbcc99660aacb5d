//! The guard in write-once mode on the in-memory double: the handler first, then one record of the
//! finished operation in the same unit.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use support::payments::*;
use tonic::Code;

/// Write-once mode: the handler runs first and the ledger row is written once, finished; a retry
/// of a finished operation replays without running the handler again, and a key reused with
/// another request is refused.
#[tokio::test]
async fn write_once_mode_replays_duplicates_and_runs_the_handler_once() {
    let (store, guard) = write_once_guard(Duration::from_millis(200));
    let runs = Arc::new(AtomicU32::new(0));
    let first = pay_ok(&guard, 10, "k-once", &runs).await;
    assert!(first.metadata().get(REPLAYED_METADATA_KEY).is_none());
    let again = pay_ok(&guard, 10, "k-once", &runs).await;
    assert_eq!(again.get_ref(), "payment-10");
    assert!(again.metadata().get(REPLAYED_METADATA_KEY).is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let reused = pay(
        &guard,
        request(99, Some("k-once"), Some("tenant-a")),
        &runs,
        Ok(()),
    )
    .await
    .unwrap_err();
    assert_eq!(reused.code(), Code::FailedPrecondition);
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::business_rows(&store, "payment-10").await,
        1
    );
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::ledger_rows(&store).await,
        1
    );
}

/// Write-once mode under duplicates that arrive together: each may run the handler, but exactly
/// one commits its effect; the others roll theirs back and replay it (or are told to retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn write_once_mode_commits_one_effect_under_concurrent_duplicates() {
    let (store, guard) = write_once_guard(Duration::from_millis(500));
    let runs = Arc::new(AtomicU32::new(0));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (guard, runs) = (guard.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                pay(
                    &guard,
                    request(10, Some("k-race"), Some("tenant-a")),
                    &runs,
                    Ok(()),
                )
                .await
            })
        })
        .collect();
    let mut answered = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(response) => {
                assert_eq!(response.get_ref(), "payment-10");
                answered += 1;
            }
            Err(status) => assert!(
                matches!(status.code(), Code::Aborted | Code::Unavailable),
                "{status:?}"
            ),
        }
    }
    assert!(answered >= 1);
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::business_rows(&store, "payment-10").await,
        1,
        "one effect committed, whatever ran"
    );
}
