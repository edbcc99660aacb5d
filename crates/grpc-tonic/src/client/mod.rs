//! The client side: who retries a call and how.
//!
//! - [`RetryLayer`]: the channel owns retries (A6 retries and hedging as a tower layer under a
//!   generated client).
//! - [`RetryExecutor`]: the application owns them, and resolves an unknown outcome first.
//! - Shared by both: `attempts` (one call's retry state and decisions), [`transport`] evidence,
//!   [`CommitObserver`] (when a response has passed the commit point), [`ExecutorStats`].

mod advice;
mod attempts;
mod commit;
mod executor;
mod retry_layer;
mod stats;
pub(crate) mod transport;

pub use commit::{CommitObserver, CommitObserverLayer};
pub use executor::{Resolution, RetryExecutor, RetrySettings};
pub use retry_layer::{
    DEFAULT_PER_CALL_BUFFER, RetryLayer, RetryLayerBuilder, RetryLayerError, RetryService,
};
pub use stats::ExecutorStats;
pub use transport::{TransportFailure, classify as transport_failure};
