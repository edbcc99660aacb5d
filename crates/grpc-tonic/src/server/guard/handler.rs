//! The guarded handler's trait, what it returns, and what the guard tells a resolve RPC.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::{LedgerError, OutcomeReference, RecordedFailure};
use prost::Message;
use tonic::Status;

use super::Operation;

/// A keyed mutation's handler: what the guard runs once per operation, inside the unit of work
/// `Tx` (the store's transaction) that also holds the operation's claim, and how a duplicate is
/// answered from what the first run recorded.
///
/// The guard owns the transaction and lends it for each call: it commits or rolls it back itself
/// afterwards, so nothing of the handler can outlive its unit. Both methods run in a task of the
/// guard's own, so their futures must be `Send`; write them as `async fn` in the impl.
///
/// ```
/// use grpc_core_api::OutcomeReference;
/// use grpc_tonic::{Committed, GuardedHandler, HandlerError, Operation};
/// use tonic::Status;
///
/// /// The request and response of a `Transfer` method (prost would generate these).
/// #[derive(Clone, PartialEq, prost::Message)]
/// pub struct TransferRequest {
///     #[prost(int64, tag = "1")]
///     pub amount: i64,
/// }
///
/// struct Transfer;
///
/// impl<Tx: Send + Sync> GuardedHandler<Tx> for Transfer {
///     type Request = TransferRequest;
///     type Response = String;
///
///     async fn handle(
///         &self,
///         _txn: &Tx,
///         request: TransferRequest,
///         _operation: &Operation,
///     ) -> Result<Committed<String>, HandlerError> {
///         if request.amount <= 0 {
///             return Err(HandlerError::Terminal(Status::invalid_argument("no amount")));
///         }
///         // The business write on `_txn`, then what a replay rebuilds the answer from.
///         let id = "transfer-1";
///         Ok(Committed {
///             response: id.to_owned(),
///             outcome: OutcomeReference::parse(id).expect("a short printable id"),
///         })
///     }
///
///     async fn replay(
///         &self,
///         _txn: &Tx,
///         outcome: OutcomeReference,
///         _operation: &Operation,
///     ) -> Result<String, Status> {
///         Ok(outcome.as_str().to_owned())
///     }
/// }
/// ```
pub trait GuardedHandler<Tx: Send + Sync>: Send + Sync + 'static {
    /// The method's request message (its fingerprint is taken by the guard).
    type Request: Message + Send + 'static;
    /// The method's response.
    type Response: Send + 'static;

    /// Runs the operation: its business writes on `txn`, its answer and the reference a replay
    /// rebuilds the answer from. Runs at most once per operation that commits (claim-committed-
    /// first may run it again after a takeover: see [`Operation::took_over`]).
    fn handle(
        &self,
        txn: &Tx,
        request: Self::Request,
        operation: &Operation,
    ) -> impl Future<Output = Result<Committed<Self::Response>, HandlerError>> + Send;

    /// Answers a duplicate of an operation that committed with `outcome`: reads what the first
    /// run stored and rebuilds the response. `txn` is a read-only unit the guard begins for the
    /// replay and rolls back (`LedgerUnitsOfWork::begin_read`: on PostgreSQL and MariaDB a
    /// write there fails), never the unit that found the duplicate, so a replay holds no write
    /// lock.
    fn replay(
        &self,
        txn: &Tx,
        outcome: OutcomeReference,
        operation: &Operation,
    ) -> impl Future<Output = Result<Self::Response, Status>> + Send;
}

/// A shared handler is a handler: a service can keep one `Arc` and hand a clone to each call.
impl<Tx: Send + Sync, H: GuardedHandler<Tx>> GuardedHandler<Tx> for Arc<H> {
    type Request = H::Request;
    type Response = H::Response;

    fn handle(
        &self,
        txn: &Tx,
        request: Self::Request,
        operation: &Operation,
    ) -> impl Future<Output = Result<Committed<Self::Response>, HandlerError>> + Send {
        (**self).handle(txn, request, operation)
    }

    fn replay(
        &self,
        txn: &Tx,
        outcome: OutcomeReference,
        operation: &Operation,
    ) -> impl Future<Output = Result<Self::Response, Status>> + Send {
        (**self).replay(txn, outcome, operation)
    }
}

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
    /// it does not mean to keep, since the unit of work commits. Its code must be one a retry
    /// cannot change: a code that says "try again" ([`HandlerError::is_transient_code`]:
    /// UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, CANCELLED) recorded for ever
    /// would replay a passing fault as final, so the guard refuses it (INTERNAL, nothing
    /// recorded, the unit rolled back).
    Terminal(Status),
    /// Not the operation's answer: a fault a retry may not meet again (a dependency timed out),
    /// or a store error in the handler's own statements. The unit of work rolls back, claim
    /// included, nothing is recorded, and the status goes to the caller: a retry runs afresh if
    /// the caller's policy retries its code (UNAVAILABLE, say, but not INTERNAL).
    Transient(Status),
}

impl From<LedgerError> for HandlerError {
    /// A store error of the handler's own statements, as the ledger classifies it
    /// (`grpc_operation_ledger_seaorm::store_error` for a SeaORM error): never recorded, and
    /// answered with the classified status. UNAVAILABLE only when the store failed;
    /// `OUTCOME_UNKNOWN` when a commit got no verdict; INTERNAL for a bug such as a duplicate
    /// primary key, which a retry would only meet again. So `insert(&txn).await.map_err(store_error)?`
    /// never turns a bug into "the store is down".
    fn from(error: LedgerError) -> Self {
        HandlerError::Transient(error.into())
    }
}

impl HandlerError {
    /// Whether `code` says a retry may succeed, so that no terminal failure may carry it.
    pub fn is_transient_code(code: tonic::Code) -> bool {
        use tonic::Code::*;
        matches!(
            code,
            Unavailable | Aborted | DeadlineExceeded | ResourceExhausted | Cancelled
        )
    }
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
