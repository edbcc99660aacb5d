//! The tonic adapter: the driving side of the hexagon.
//!
//! - [`KeyedMutationGuard`] (server): reads the idempotency key from request metadata, derives the
//!   caller from an authenticated source, fingerprints the request, and runs the handler inside a
//!   unit of work of the ledger's store: claim, business write, transition, commit. A duplicate
//!   replays the recorded outcome with `idempotent-replayed: true`.
//! - [`RetryExecutor`] (client): retries a call as `grpc_policy` decides, with the shared budget,
//!   jittered backoff and server pushback, and resolves the completion of a keyed mutation whose
//!   outcome is unknown before resending it. Every decision is a `tracing` event with its reason.

mod attempts;
mod caller;
mod commit;
mod executor;
mod guard;
mod method_layer;
mod metrics;
mod retry_layer;
mod transport;

pub use caller::{
    AuthenticatedPrincipal, AuthenticatedPrincipalExtractor, CallerExtractor,
    ClientAssertedHeaderExtractor,
};
pub use commit::{CommitObserver, CommitObserverLayer};
pub use executor::{ExecutorStats, Resolution, RetryExecutor, RetrySettings};
pub use guard::{Committed, GuardConfig, GuardMode, HandlerError, KeyedMutationGuard, Resolved};
pub use method_layer::{MethodFromPath, MethodFromPathLayer};
pub use retry_layer::{
    DEFAULT_PER_CALL_BUFFER, RetryLayer, RetryLayerBuilder, RetryLayerError, RetryService,
};
pub use transport::{TransportFailure, classify as transport_failure};

/// The request metadata that carries the caller's idempotency key, unless configured otherwise.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
