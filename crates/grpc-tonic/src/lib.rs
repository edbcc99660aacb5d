//! The tonic adapter: the driving side of the hexagon.
//!
//! - [`KeyedMutationGuard`] (server): reads the idempotency key from request metadata, derives the
//!   caller from an authenticated source, fingerprints the request, and runs the handler inside a
//!   unit of work of the ledger's store: claim, business write, transition, commit. A duplicate
//!   replays the recorded outcome with `idempotent-replayed: true`.
//! - [`RetryExecutor`] (client): retries a call as `grpc_policy` decides, with the shared budget,
//!   jittered backoff and server pushback, and resolves the completion of a keyed mutation whose
//!   outcome is unknown before resending it. Every decision is a `tracing` event with its reason.
//! - [`RetryLayer`] (client): the channel owns retries, A6 retries and hedging under a generated
//!   client, on the same decisions as the executor.
//!
//! Modules: `client/` (the executor, the RetryLayer, and what both share: one call's attempts,
//! transport evidence, the commit observer, their stats), `server/` (the guard, the caller it
//! derives, the method layer, the retention worker), and three that both sides use and that use
//! neither: `key_header` (the key's metadata name, configurable on both sides), `metrics` and
//! `random` (jitter). Nothing in `client/`
//! imports `server/` or the other way round.
//!
//! A keyed mutation, sent twice under one key: the handler runs once, and the second call is
//! answered from the ledger (here the in-memory double; in production the SeaORM adapter).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! use grpc_core_api::{GrpcMethod, KeyHasher, OutcomeReference, RequestSchema};
//! use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
//! use grpc_tonic::{
//!     AuthenticatedPrincipal, Committed, GuardConfig, GuardedHandler, HandlerError,
//!     KeyedMutationGuard, Operation,
//! };
//! use tonic::{Request, Status};
//!
//! #[derive(Clone, PartialEq, prost::Message)]
//! struct Pay {
//!     #[prost(int64, tag = "1")]
//!     amount: i64,
//! }
//!
//! struct PayOnce;
//!
//! impl GuardedHandler<InMemoryUnit> for PayOnce {
//!     type Request = Pay;
//!     type Response = String;
//!
//!     async fn handle(&self, unit: &InMemoryUnit, pay: Pay, _: &Operation)
//!         -> Result<Committed<String>, HandlerError> {
//!         unit.write_business(&format!("paid {}", pay.amount)); // the business write
//!         Ok(Committed { response: "payment-1".into(), outcome: OutcomeReference::parse("payment-1").unwrap() })
//!     }
//!
//!     async fn replay(&self, _: &InMemoryUnit, outcome: OutcomeReference, _: &Operation)
//!         -> Result<String, Status> {
//!         Ok(outcome.as_str().to_owned())
//!     }
//! }
//!
//! # let descriptors = protox::compile(["guarded.proto"], ["tests/proto"])?;
//! # let schema =
//! #     RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))?;
//! let store = InMemoryStore::new(Duration::from_millis(200));
//! let guard = KeyedMutationGuard::new(store.clone(), GuardConfig::new(KeyHasher::Sha256, schema));
//! let method = GrpcMethod::parse("/payments.v1.Payments/CreatePayment")?;
//! let pay = || {
//!     let mut request = Request::new(Pay { amount: 5 });
//!     request.metadata_mut().insert("idempotency-key", "order-7".parse().unwrap());
//!     // What your authentication layer inserts: the caller is never read from a header.
//!     request.extensions_mut().insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
//!     request
//! };
//! let first = guard.run(&method, pay(), PayOnce).await?;
//! let again = guard.run(&method, pay(), PayOnce).await?;
//! assert_eq!(first.get_ref(), again.get_ref());
//! assert!(again.metadata().get("idempotent-replayed").is_some());
//! assert_eq!(store.committed_business(), ["paid 5"]);
//! # Ok(()) }
//! ```

mod client;
mod key_header;
mod metrics;
mod random;
mod server;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{
    CommitObserver, CommitObserverLayer, DEFAULT_PER_CALL_BUFFER, ExecutorStats, Resolution,
    RetryExecutor, RetryLayer, RetryLayerBuilder, RetryLayerError, RetryService, RetrySettings,
    TransportFailure, transport_failure,
};
pub use server::{
    AuthenticatedPrincipal, AuthenticatedPrincipalExtractor, CallerExtractor,
    ClientAssertedHeaderExtractor, Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError,
    KeyedMutationGuard, MethodFromPath, MethodFromPathLayer, Operation, Resolved, RetentionConfig,
    RetentionPass, RetentionStats, RetentionWorker,
};
#[cfg(feature = "mtls")]
pub use server::{MtlsCallerExtractor, PeerName};

pub use key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader};
