//! Exactly once across a chain: a payments handler that posts to a postings service through the
//! executor, under the key the guard derives for that call. When the payments unit fails after
//! the posting committed, the resend runs the payments handler again, which sends the same
//! derived key, and the postings guard replays the posting instead of making a second one.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_policy::{CodeSet, GrpcRetryBudget, GrpcRetryOwner, RetryPolicy, RetryThrottling};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardedHandler, HandlerError,
    KeyedMutationGuard, Operation, Resolution, RetryExecutor, RetrySettings,
};
use support::{Writes, scripted};
use tonic::{Code, Request, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn schema() -> RequestSchema {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors)).unwrap()
}

fn guard(store: &InMemoryStore, secret: u8) -> KeyedMutationGuard<InMemoryStore> {
    let hasher = KeyHasher::hmac_sha256(&[secret; 32]).unwrap();
    KeyedMutationGuard::new(store.clone(), GuardConfig::new(hasher, schema()))
}

/// Both services guard the same request type; only the method names differ.
fn payments_method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

fn postings_method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/PostEntry").unwrap()
}

fn request(key: &str, principal: &[u8]) -> Request<Pay> {
    let mut request = Request::new(Pay { amount: 5 });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(principal.to_vec()));
    request
}

fn executor() -> RetryExecutor {
    let policy = RetryPolicy::new(
        3,
        Duration::from_millis(5),
        Duration::from_millis(50),
        2.0,
        CodeSet::of(&[Code::Unavailable, Code::Aborted]),
    )
    .unwrap();
    RetryExecutor::new(
        RetrySettings::new(GrpcRetryOwner::Application, policy)
            .with_server_ledger(LedgerDurability::Durable),
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    )
}

/// The two services: payments (its guard, its store) posting through the executor to postings
/// (its own guard and store).
struct Chain {
    payments: KeyedMutationGuard<InMemoryStore>,
    payments_store: InMemoryStore,
    postings: KeyedMutationGuard<InMemoryStore>,
    postings_store: InMemoryStore,
    posting_handlers: Arc<AtomicU32>,
    executor: Arc<RetryExecutor>,
}

impl Chain {
    fn new() -> Self {
        let (payments_store, postings_store) = (
            InMemoryStore::new(Duration::from_millis(50)),
            InMemoryStore::new(Duration::from_millis(50)),
        );
        Self {
            payments: guard(&payments_store, 1),
            postings: guard(&postings_store, 2),
            payments_store,
            postings_store,
            posting_handlers: Arc::default(),
            executor: Arc::new(executor()),
        }
    }

    /// The postings service's handler for one call: a posting row named after the key it got.
    async fn post(&self, request: Request<Pay>) -> Result<tonic::Response<String>, Status> {
        let key = request
            .metadata()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut request = request;
        request
            .extensions_mut()
            .insert(AuthenticatedPrincipal(b"payments-service".to_vec()));
        let runs = Arc::clone(&self.posting_handlers);
        self.postings
            .run(
                &postings_method(),
                request,
                scripted(
                    move |unit: Writes, _pay: Pay| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        unit.write_business(&format!("posting {key}"));
                        Ok(Committed {
                            response: format!("posting {key}"),
                            outcome: OutcomeReference::parse("posting").unwrap(),
                        })
                    },
                    |_outcome| async move { Ok("posting (replayed)".to_owned()) },
                ),
            )
            .await
    }

    /// One payment under `key`: the handler posts under its derived key, writes the payment, and
    /// fails transiently after the posting while `fail_after_posting` says so.
    async fn pay(self: &Arc<Self>, key: &str, fail_after_posting: bool) -> Result<(), Status> {
        let handler = PayThroughPostings {
            chain: Arc::clone(self),
            payment: format!("payment {key}"),
            fail_after_posting,
        };
        self.payments
            .run(&payments_method(), request(key, b"tenant-a"), handler)
            .await
            .map(|_| ())
    }
}

/// The payments service's handler: a posting through the executor, under the key its operation
/// derives for the label `postings`, then the payment row.
struct PayThroughPostings {
    chain: Arc<Chain>,
    payment: String,
    fail_after_posting: bool,
}

impl GuardedHandler<InMemoryUnit> for PayThroughPostings {
    type Request = Pay;
    type Response = ();

    async fn handle(
        &self,
        unit: &InMemoryUnit,
        pay: Pay,
        operation: &Operation,
    ) -> Result<Committed<()>, HandlerError> {
        let posting_key = operation.downstream_key(&DownstreamLabel::parse("postings").unwrap());
        let chain = &self.chain;
        let posted = chain
            .executor
            .call_keyed(
                pay,
                &posting_key,
                None,
                |request| chain.post(request),
                || async { Ok(Resolution::<String>::NotFound) },
            )
            .await
            .map_err(HandlerError::Transient)?;
        assert!(posted.get_ref().starts_with("posting"));
        unit.write_business(&self.payment);
        if self.fail_after_posting {
            return Err(HandlerError::Transient(Status::unavailable(
                "the payments unit failed after the posting committed",
            )));
        }
        Ok(Committed {
            response: (),
            outcome: OutcomeReference::parse("payment").unwrap(),
        })
    }

    async fn replay(
        &self,
        _unit: &InMemoryUnit,
        _outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<(), Status> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resend_after_the_payment_failed_reuses_the_posting_instead_of_repeating_it() {
    let chain = Arc::new(Chain::new());
    let failed = chain.pay("pay-1", true).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
    assert!(
        chain.payments_store.committed_business().is_empty(),
        "the payment rolled back"
    );
    assert_eq!(
        chain.postings_store.committed_business().len(),
        1,
        "the posting committed"
    );

    chain.pay("pay-1", false).await.expect("the resend commits");
    chain
        .pay("pay-1", false)
        .await
        .expect("a later resend replays");
    assert_eq!(
        chain.posting_handlers.load(Ordering::SeqCst),
        1,
        "one posting ever made"
    );
    assert_eq!(chain.postings_store.committed_business().len(), 1);
    assert_eq!(
        chain.payments_store.committed_business(),
        vec!["payment pay-1".to_owned()]
    );

    // Another payment is another operation: its own posting, under its own derived key.
    chain.pay("pay-2", false).await.unwrap();
    let postings = chain.postings_store.committed_business();
    assert_eq!(postings.len(), 2);
    assert_ne!(postings[0], postings[1]);
    for posting in &postings {
        assert!(
            !posting.contains("pay-"),
            "the caller's key never travels downstream: {posting}"
        );
    }
}
