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
