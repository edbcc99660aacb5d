//! What a guarded handler returns, and what the guard tells a resolve RPC.

use std::time::Duration;

use grpc_core_api::{OutcomeReference, RecordedFailure};
use tonic::Status;

/// What a handler returns when its business write succeeded: the response, and the reference a
/// replay will rebuild it from.
#[derive(Debug, Clone)]
pub struct Committed<R> {
    /// The response to send.
    pub response: R,
    /// Where the result lives (a payment id), stored with the committed claim.
    pub outcome: OutcomeReference,
}

/// How a handler failed.
#[derive(Debug, Clone)]
pub enum HandlerError {
    /// A business refusal that a retry must see again (insufficient funds): recorded with the
    /// claim, committed, and replayed to every duplicate. The handler should have written nothing
    /// it does not mean to keep, since the unit of work commits.
    Terminal(Status),
    /// A fault that a retry may not meet again (a dependency timed out): the unit of work rolls
    /// back, claim included, so a retry runs afresh.
    Transient(Status),
}

/// What became of a keyed operation, as the ledger records it: what a service's resolve RPC
/// answers, and what the client's resolve-first lookup needs.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new variant would be a new answer every
/// caller must handle, so it should break their `match` rather than fall into a wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The ledger has no such operation: it never committed, and a resend with the same key is
    /// safe.
    NotFound,
    /// Another attempt holds it; ask again after this long (its lease, by the store's clock).
    InProgress {
        /// When its lease runs out.
        retry_after: Duration,
    },
    /// It committed; its result is where this reference says.
    Committed(OutcomeReference),
    /// It failed terminally, with this failure (the status a replay returns).
    Failed(RecordedFailure),
}
