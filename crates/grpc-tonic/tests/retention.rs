//! The retention worker beside a guard, on the in-memory units of work: what a pass deletes and
//! keeps, its batches and its limit, several workers at once, and a clean stop.

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, KeyedMutationGuard, RetentionConfig,
};
use support::{Writes, scripted};
use tonic::Request;

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn guard(store: &InMemoryStore) -> KeyedMutationGuard<InMemoryStore> {
    guard_on(store.clone())
}

fn guard_on<U: LedgerUnitsOfWork + 'static>(units: U) -> KeyedMutationGuard<U> {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    KeyedMutationGuard::new(units, GuardConfig::new(KeyHasher::Sha256, schema))
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
                scripted(
                    |unit: Writes, _pay: Pay| async move {
                        unit.write_business(&business);
                        Ok(Committed {
                            response: (),
                            outcome: OutcomeReference::parse("payment").unwrap(),
                        })
                    },
                    |_outcome: OutcomeReference| async move { Ok(()) },
                ),
            )
            .await
            .expect("the payment commits");
    }
}

/// The identity of `key` for the caller `principal`: `paid` pays as `tenant-a`, `in_progress`
/// claims as `tenant-b`.
fn identity(principal: &[u8], key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(principal),
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
        .claim(
            &identity(b"tenant-b", key),
            &RequestFingerprint::of(b"r"),
            lease,
        )
        .await
        .unwrap();
    assert!(matches!(claim, ClaimOutcome::Claimed { .. }));
    unit.commit_unit();
}

async fn rows(store: &InMemoryStore, principal: &[u8], keys: &[String]) -> usize {
    let unit = store.begin_unit();
    let mut found = 0;
    for key in keys {
        if unit
            .ledger()
            .find(&identity(principal, key))
            .await
            .unwrap()
            .is_some()
        {
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
    assert_eq!(rows(&store, b"tenant-b", &["stuck".to_owned()]).await, 1);
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

/// The in-memory store, with its next `conflicts` commits aborted as conflicting with another
/// unit (what InnoDB answers to one of two replicas' deletes that deadlocked, or Galera to a
/// write set that failed certification): the unit is rolled back and took no effect.
struct AbortingCommits {
    store: InMemoryStore,
    conflicts: std::sync::atomic::AtomicU32,
}

#[async_trait::async_trait]
impl LedgerUnitsOfWork for AbortingCommits {
    type Transaction = InMemoryUnit;

    async fn begin(&self) -> Result<Self::Transaction, LedgerError> {
        LedgerUnitsOfWork::begin(&self.store).await
    }

    fn ledger<'t>(&self, transaction: &'t Self::Transaction) -> Box<dyn GrpcOperationLedger + 't> {
        LedgerUnitsOfWork::ledger(&self.store, transaction)
    }

    async fn commit(&self, transaction: Self::Transaction) -> Result<(), LedgerError> {
        use std::sync::atomic::Ordering;
        let abort = self
            .conflicts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if abort {
            LedgerUnitsOfWork::rollback(&self.store, transaction).await?;
            return Err(LedgerError::unavailable(
                UnavailableKind::SerializationFailure,
            ));
        }
        LedgerUnitsOfWork::commit(&self.store, transaction).await
    }

    async fn rollback(&self, transaction: Self::Transaction) -> Result<(), LedgerError> {
        LedgerUnitsOfWork::rollback(&self.store, transaction).await
    }

    fn durability(&self) -> LedgerDurability {
        LedgerUnitsOfWork::durability(&self.store)
    }
}

#[tokio::test]
async fn a_batch_the_store_aborts_as_a_conflict_is_sent_again_within_the_pass() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    paid(&guard(&store), "conflict", 9).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let config = RetentionConfig::new(Duration::from_millis(10)).with_batch(batch(4));
    let aborting = |conflicts| {
        guard_on(AbortingCommits {
            store: store.clone(),
            conflicts: std::sync::atomic::AtomicU32::new(conflicts),
        })
        .retention_worker(config)
    };

    // Three aborts in a row: the first batch goes through on its fourth sending, and the pass
    // deletes every finished operation, each once.
    let worker = aborting(3);
    let pass = worker
        .run_once()
        .await
        .expect("the pass goes through the conflicts");
    assert_eq!((pass.purged, pass.backlogged), (9, false));
    assert_eq!(rows(&store, b"tenant-a", &keys("conflict", 9)).await, 0);
    assert_eq!(worker.stats().failed_passes(), 0);

    // A batch aborted on every sending fails the pass, with the store's answer, and deletes
    // nothing.
    paid(&guard(&store), "always", 5).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let worker = aborting(u32::MAX);
    let failed = worker.run_once().await.expect_err("every sending aborted");
    assert_eq!(
        failed,
        LedgerError::unavailable(UnavailableKind::SerializationFailure)
    );
    assert_eq!(worker.stats().failed_passes(), 1);
    assert_eq!(rows(&store, b"tenant-a", &keys("always", 5)).await, 5);
}

fn keys(tag: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{tag}-{n}")).collect()
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
