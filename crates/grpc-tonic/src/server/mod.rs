//! The server side: the keyed mutation guard, the caller it derives, and the layer that puts the
//! called method where the guard reads it.

mod caller;
mod guard;
mod method_layer;

pub use caller::{
    AuthenticatedPrincipal, AuthenticatedPrincipalExtractor, CallerExtractor,
    ClientAssertedHeaderExtractor,
};
pub use guard::{Committed, GuardConfig, GuardMode, HandlerError, KeyedMutationGuard, Resolved};
pub use method_layer::{MethodFromPath, MethodFromPathLayer};
