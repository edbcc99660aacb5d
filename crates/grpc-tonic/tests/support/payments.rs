//! The guard's payment calls on the in-memory double: the request type of
//! `tests/proto/guarded.proto`, a guard over a store, and a payment whose handler writes one
//! business row named after its amount.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, HandlerError, KeyedMutationGuard,
};
use tonic::{Request, Status};

use super::{Writes, scripted};

/// The request type of `tests/proto/guarded.proto`, as prost generates it (maps decode into a
/// `HashMap`, whose iteration order differs between instances).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Pay {
    #[prost(int64, tag = "1")]
    pub(crate) amount: i64,
    #[prost(map = "string, string", tag = "2")]
    pub(crate) labels: std::collections::HashMap<String, String>,
}

pub(crate) fn guard_config() -> GuardConfig {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    GuardConfig::new(KeyHasher::Sha256, schema)
}

pub(crate) fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

pub(crate) fn request(amount: i64, key: Option<&str>, principal: Option<&str>) -> Request<Pay> {
    let mut request = Request::new(Pay {
        amount,
        labels: Default::default(),
    });
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    if let Some(principal) = principal {
        request
            .extensions_mut()
            .insert(AuthenticatedPrincipal(principal.as_bytes().to_vec()));
    }
    request
}

pub(crate) fn guard(store: &InMemoryStore) -> KeyedMutationGuard<InMemoryStore> {
    KeyedMutationGuard::new(store.clone(), guard_config())
}

/// A payment of `amount` with key `key` by tenant-a that the handler lets through, answered.
pub(crate) async fn pay_ok(
    guard: &KeyedMutationGuard<InMemoryStore>,
    amount: i64,
    key: &str,
    runs: &Arc<AtomicU32>,
) -> tonic::Response<String> {
    pay(
        guard,
        request(amount, Some(key), Some("tenant-a")),
        runs,
        Ok(()),
    )
    .await
    .unwrap()
}

/// A fresh in-memory store (with `claim_wait`) and a guard over it in write-once mode.
pub(crate) fn write_once_guard(
    claim_wait: Duration,
) -> (InMemoryStore, KeyedMutationGuard<InMemoryStore>) {
    let store = InMemoryStore::new(claim_wait);
    let guard = KeyedMutationGuard::new(
        store.clone(),
        guard_config().with_mode(GuardMode::WriteOnceInTransactionOnly),
    );
    (store, guard)
}

/// A fresh store (duplicates wait 200 ms behind a claim), a claim-first guard over it, and a
/// counter of handler runs.
pub(crate) fn fresh() -> (
    InMemoryStore,
    KeyedMutationGuard<InMemoryStore>,
    Arc<AtomicU32>,
) {
    let store = InMemoryStore::new(Duration::from_millis(200));
    let guard = guard(&store);
    (store, guard, Arc::new(AtomicU32::new(0)))
}

/// Runs a payment through the guard; the handler writes one business row named after the amount.
pub(crate) async fn pay(
    guard: &KeyedMutationGuard<InMemoryStore>,
    request: Request<Pay>,
    runs: &Arc<AtomicU32>,
    outcome: Result<(), HandlerError>,
) -> Result<tonic::Response<String>, Status> {
    let runs = Arc::clone(runs);
    guard
        .run(
            &method(),
            request,
            scripted(
                |unit: Writes, pay: Pay| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    outcome?;
                    unit.write_business(&format!("payment-{}", pay.amount));
                    Ok(Committed {
                        response: format!("payment-{}", pay.amount),
                        outcome: OutcomeReference::parse(&format!("payment-{}", pay.amount))
                            .unwrap(),
                    })
                },
                |outcome: OutcomeReference| async move { Ok(outcome.as_str().to_owned()) },
            ),
        )
        .await
}
