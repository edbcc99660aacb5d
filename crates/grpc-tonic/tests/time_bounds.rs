//! The unit's time bounds tell the truth: the lease bounds the work (claim, handler, transition)
//! and a unit cut there is rolled back and said to be; a COMMIT has a bound of its own, so a slow
//! one is not cut by the lease, and one that outlives its own bound is an unknown outcome
//! (`OUTCOME_UNKNOWN`), which a resend with the same key settles. On the in-memory units of work,
//! whose COMMIT here takes as long as the test says.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::*;
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, KeyedMutationGuard};
use support::{Writes, scripted};
use tonic::{Code, Request, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

/// The in-memory units, whose COMMIT waits `commit_takes_ms` before it applies.
#[derive(Clone)]
struct SlowCommits {
    store: InMemoryStore,
    commit_takes_ms: Arc<AtomicU64>,
}

#[async_trait]
impl LedgerUnitsOfWork for SlowCommits {
    type Transaction = InMemoryUnit;

    async fn begin(&self) -> Result<InMemoryUnit, LedgerError> {
        self.store.begin().await
    }

    fn ledger<'t>(&self, transaction: &'t InMemoryUnit) -> Box<dyn GrpcOperationLedger + 't> {
        LedgerUnitsOfWork::ledger(&self.store, transaction)
    }

    async fn commit(&self, transaction: InMemoryUnit) -> Result<(), LedgerError> {
        let takes = self.commit_takes_ms.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(takes)).await;
        self.store.commit(transaction).await
    }

    async fn rollback(&self, transaction: InMemoryUnit) -> Result<(), LedgerError> {
        self.store.rollback(transaction).await
    }

    fn durability(&self) -> LedgerDurability {
        self.store.durability()
    }
}

struct Setup {
    store: InMemoryStore,
    commit_takes_ms: Arc<AtomicU64>,
    guard: KeyedMutationGuard<SlowCommits>,
    runs: Arc<AtomicUsize>,
}

fn setup(mode: GuardMode, lease: Duration, commit_wait: Duration) -> Setup {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let commit_takes_ms = Arc::new(AtomicU64::new(0));
    let units = SlowCommits {
        store: store.clone(),
        commit_takes_ms: Arc::clone(&commit_takes_ms),
    };
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    let mut config = GuardConfig::new(KeyHasher::Sha256, schema)
        .with_mode(mode)
        .with_commit_wait(commit_wait);
    config.lease = LeaseDuration::new(lease).unwrap();
    Setup {
        store,
        commit_takes_ms,
        guard: KeyedMutationGuard::new(units, config),
        runs: Arc::new(AtomicUsize::new(0)),
    }
}

/// A payment under `key` whose handler takes `handler_takes`, then writes its business row.
async fn pay(setup: &Setup, key: &str, handler_takes: Duration) -> Result<String, Status> {
    let mut request = Request::new(Pay { amount: 5 });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
    let runs = Arc::clone(&setup.runs);
    let payment = format!("payment {key}");
    setup
        .guard
        .run(
            &GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap(),
            request,
            scripted(
                move |unit: Writes, _pay: Pay| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(handler_takes).await;
                    unit.write_business(&payment);
                    Ok(Committed {
                        response: "paid".to_owned(),
                        outcome: OutcomeReference::parse("paid").unwrap(),
                    })
                },
                |_outcome| async move { Ok("paid".to_owned()) },
            ),
        )
        .await
        .map(tonic::Response::into_inner)
}

const MODES: [GuardMode; 3] = [
    GuardMode::ClaimFirst,
    GuardMode::WriteOnceInTransactionOnly,
    GuardMode::ClaimCommittedFirst,
];

/// (Not claim-committed-first: there a claim whose own COMMIT outlasts its lease is no longer
/// safely its owner's, and the handler is rightly cut before it starts.) Ten times in each mode:
/// when the slow COMMIT returns, the work's bound is long past, and a bound that still watched
/// the finished unit would race its answer and sometimes cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_slower_than_the_lease_is_not_cut_by_it() {
    for (mode, n) in [GuardMode::ClaimFirst, GuardMode::WriteOnceInTransactionOnly]
        .into_iter()
        .flat_map(|mode| (0..10).map(move |n| (mode, n)))
    {
        let setup = setup(mode, Duration::from_millis(50), Duration::from_secs(5));
        setup.commit_takes_ms.store(120, Ordering::SeqCst);
        let answer = pay(&setup, "slow-commit", Duration::ZERO).await;
        assert_eq!(
            answer.map_err(|s| (s.code(), s.message().to_owned())),
            Ok("paid".to_owned()),
            "{mode:?} run {n}"
        );
        assert_eq!(
            setup.store.committed_business(),
            ["payment slow-commit"],
            "{mode:?} run {n}"
        );
    }
}

#[tokio::test]
async fn a_commit_past_its_own_bound_is_an_unknown_outcome_that_a_resend_settles() {
    for mode in MODES {
        let setup = setup(mode, Duration::from_secs(5), Duration::from_millis(100));
        setup.commit_takes_ms.store(2_000, Ordering::SeqCst);
        let status = pay(&setup, "stuck-commit", Duration::ZERO)
            .await
            .expect_err("the commit outlived its bound");
        assert_eq!(status.code(), Code::Unavailable, "{mode:?}");
        assert!(
            says_outcome_unknown(&status),
            "{mode:?}: a COMMIT cut in flight may have taken effect: {status:?}"
        );
        assert!(!status.message().contains("rolled back"), "{mode:?}");
        // The client resends with the same key; the store answers commits at once again.
        setup.commit_takes_ms.store(0, Ordering::SeqCst);
        let resent = loop {
            match pay(&setup, "stuck-commit", Duration::ZERO).await {
                // Claim-committed-first: the claim whose commit was cut holds its lease.
                Err(status) if status.code() == Code::Aborted => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other,
            }
        };
        assert_eq!(
            resent.map_err(|s| s.code()),
            Ok("paid".to_owned()),
            "{mode:?}"
        );
        assert_eq!(
            setup.store.committed_business(),
            ["payment stuck-commit"],
            "{mode:?}: one payment"
        );
    }
}

#[tokio::test]
async fn a_handler_past_its_lease_is_rolled_back_and_said_to_be() {
    for mode in [GuardMode::ClaimFirst, GuardMode::WriteOnceInTransactionOnly] {
        let setup = setup(mode, Duration::from_millis(100), Duration::from_secs(5));
        let status = pay(&setup, "slow-handler", Duration::from_secs(2))
            .await
            .expect_err("the handler outlived the lease");
        assert_eq!(status.code(), Code::Unavailable, "{mode:?}");
        assert!(!says_outcome_unknown(&status), "{mode:?}: {status:?}");
        assert!(status.message().contains("rolled back"), "{mode:?}");
        assert!(setup.store.committed_business().is_empty(), "{mode:?}");
        assert_eq!(setup.runs.load(Ordering::SeqCst), 1);
    }
}

/// Claim-committed-first commits its claim, then works on: the commit's short bound ends with
/// that commit, and the handler after it runs under the work's bound (the longest handler), not
/// the commit's.
#[tokio::test]
async fn the_commit_bound_ends_with_the_claims_commit() {
    let setup = setup(
        GuardMode::ClaimCommittedFirst,
        Duration::from_secs(2),
        Duration::from_millis(100),
    );
    let answer = pay(&setup, "long-after-claim", Duration::from_millis(400)).await;
    assert_eq!(answer.map_err(|s| s.code()), Ok("paid".to_owned()));
    assert_eq!(
        setup.store.committed_business(),
        ["payment long-after-claim"]
    );
}
