//! The retention worker beside a guard, on the in-memory units of work: what a pass deletes and
//! keeps, its batches and its limit, several workers at once, and a clean stop.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, KeyedMutationGuard, RetentionConfig,
};
use tonic::Request;

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn guard(store: &InMemoryStore) -> KeyedMutationGuard<InMemoryStore> {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    KeyedMutationGuard::new(store.clone(), GuardConfig::new(KeyHasher::Sha256, schema))
}

fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

/// `count` payments through the guard, each committed, keys `{tag}-N`.
async fn paid(guard: &KeyedMutationGuard<InMemoryStore>, tag: &str, count: usize) {
    for n in 0..count {
        let mut request = Request::new(Pay { amount: n as i64 });
        request
            .metadata_mut()
            .insert("idempotency-key", format!("{tag}-{n}").parse().unwrap());
        request
            .extensions_mut()
            .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
        let business = format!("payment-{tag}-{n}");
        guard
            .run(
                &method(),
                request,
                |unit: Arc<InMemoryUnit>, _pay: Pay| async move {
                    unit.write_business(&business);
                    Ok(Committed {
                        response: (),
                        outcome: OutcomeReference::parse("payment").unwrap(),
                    })
                },
                |_unit, _outcome: OutcomeReference| async move { Ok(()) },
            )
            .await
            .expect("the payment commits");
    }
}

fn identity(key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant-b"),
        method(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

/// An operation claimed and left in progress (its handler still running, or dead), committed.
async fn in_progress(store: &InMemoryStore, key: &str) {
    let unit = store.begin_unit();
    let lease = LeaseDuration::new(Duration::from_millis(1)).unwrap();
    let claim = unit
        .ledger()
        .claim(&identity(key), &RequestFingerprint::of(b"r"), lease)
        .await
        .unwrap();
    assert!(matches!(claim, ClaimOutcome::Claimed { .. }));
    unit.commit_unit();
}

async fn rows(store: &InMemoryStore, keys: &[String]) -> usize {
    let unit = store.begin_unit();
    let mut found = 0;
    for key in keys {
        if unit.ledger().find(&identity(key)).await.unwrap().is_some() {
            found += 1;
        }
    }
    found
}

fn batch(rows: u32) -> NonZeroU32 {
    NonZeroU32::new(rows).unwrap()
}

#[tokio::test]
async fn a_pass_deletes_finished_operations_past_retention_in_batches_and_keeps_the_rest() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    paid(&guard, "old", 25).await;
    in_progress(&store, "stuck").await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    // Within a retention of an hour, nothing is old enough.
    let keeping = guard.retention_worker(RetentionConfig::new(Duration::from_secs(3600)));
    assert_eq!(keeping.run_once().await.unwrap().purged, 0);

    let worker = guard
        .retention_worker(RetentionConfig::new(Duration::from_millis(10)).with_batch(batch(7)));
    let pass = worker.run_once().await.unwrap();
    assert_eq!(
        pass.purged, 25,
        "four batches: 7, 7, 7 and a short one of 4"
    );
    assert!(!pass.backlogged);
    // An operation in progress is never purged, however old: its owner may still commit.
    assert_eq!(rows(&store, &["stuck".to_owned()]).await, 1);
    assert_eq!(worker.run_once().await.unwrap().purged, 0);
    let stats = worker.stats();
    assert_eq!(
        (stats.purged(), stats.passes(), stats.failed_passes()),
        (25, 2, 0)
    );
}

#[tokio::test]
async fn a_pass_stops_at_its_batch_limit_and_counts_the_lag() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    paid(&guard, "backlog", 25).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let worker = guard.retention_worker(
        RetentionConfig::new(Duration::from_millis(10))
            .with_batch(batch(5))
            .with_max_batches(2),
    );
    let pass = worker.run_once().await.unwrap();
    assert_eq!(pass.purged, 10);
    assert!(pass.backlogged, "rows are left after the pass's last batch");
    assert_eq!(worker.stats().backlogged_passes(), 1);
    // The next passes work the backlog off.
    assert_eq!(worker.run_once().await.unwrap().purged, 10);
    let last = worker.run_once().await.unwrap();
    assert_eq!((last.purged, last.backlogged), (5, false));
}

#[tokio::test]
async fn workers_on_every_replica_delete_each_row_once() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    paid(&guard, "shared", 40).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let config = RetentionConfig::new(Duration::from_millis(10)).with_batch(batch(3));
    let replicas: Vec<_> = (0..4)
        .map(|_| {
            let worker = guard.retention_worker(config);
            tokio::spawn(async move { worker.run_once().await.unwrap().purged })
        })
        .collect();
    let mut purged = 0;
    for replica in replicas {
        purged += replica.await.unwrap();
    }
    assert_eq!(purged, 40);
}

#[tokio::test]
async fn a_spawned_worker_purges_on_its_interval_and_stops_on_shutdown() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    paid(&guard, "spawned", 12).await;
    let worker = guard.retention_worker(
        RetentionConfig::new(Duration::from_millis(10)).with_interval(Duration::from_millis(20)),
    );
    let stats = worker.stats();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = worker.spawn(async {
        let _ = stopped.await;
    });
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while stats.purged() < 12 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the worker purged {} of 12 within 10 s",
        stats.purged()
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), running)
        .await
        .expect("the worker stops once shut down")
        .unwrap();
    let passes = stats.passes();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(stats.passes(), passes, "no pass after the stop");
}
