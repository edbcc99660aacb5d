//! The server side: the keyed mutation guard, the caller it derives, the layer that puts the
//! called method where the guard reads it, and the retention worker that runs beside the guard.

mod caller;
mod guard;
mod method_layer;
#[cfg(feature = "mtls")]
mod mtls;
mod retention;

pub use caller::{
    AuthenticatedPrincipal, AuthenticatedPrincipalExtractor, CallerExtractor,
    ClientAssertedHeaderExtractor,
};
pub use guard::{
    Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError, KeyedMutationGuard, Operation,
    Resolved,
};
pub use method_layer::{MethodFromPath, MethodFromPathLayer};
#[cfg(feature = "mtls")]
pub use mtls::{MtlsCallerExtractor, PeerName};
pub use retention::{RetentionConfig, RetentionPass, RetentionStats, RetentionWorker};
