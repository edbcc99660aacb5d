//! The keyed mutation guard: a keyed mutation runs exactly once, whatever the client resends.
//!
//! Here: the guard's public face (identity from metadata, `run`, `resolve`). Each protocol's
//! steps around the handler have their module, `claim_first` (claim, then finish the claim) and
//! `write_once` (look up, then record the finished operation once); `unit` runs one unit of work
//! through either (begin, the step before, the handler, the step after, commit or roll back) in
//! a task of its own. `committed_claim` runs the third protocol, whose claim commits in a unit of
//! its own before the handler, with `lease_keeper` renewing the claim while the handler runs. `config` is what a service sets; `handler` the types its handler speaks.

mod bounds;
mod claim_first;
mod committed_claim;
mod config;
mod handler;
mod in_flight;
mod lease_keeper;
mod operation;
mod unit;
mod write_once;

pub use config::{GuardConfig, GuardMode};
pub use handler::{Committed, GuardedHandler, HandlerError, Resolved};
pub use operation::Operation;

use std::sync::Arc;

use grpc_core_api::{
    Completion, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, InvalidInput, LedgerError,
    LedgerUnitsOfWork, RequestFingerprint,
};
use prost::Message;
use tonic::metadata::MetadataMap;
use tonic::{Extensions, Request, Response, Status};

use self::bounds::to_the_end;
use super::caller::{AuthenticatedPrincipalExtractor, CallerExtractor};
use super::retention::{RetentionConfig, RetentionWorker};
use crate::metrics::{LedgerAnswer, ServerMetrics};

/// Runs keyed mutations exactly once, inside units of work of the ledger's store.
pub struct KeyedMutationGuard<U> {
    units: Arc<U>,
    config: GuardConfig,
    callers: Arc<dyn CallerExtractor>,
    metrics: Option<ServerMetrics>,
}

impl<U> Clone for KeyedMutationGuard<U> {
    fn clone(&self) -> Self {
        Self {
            units: Arc::clone(&self.units),
            config: self.config.clone(),
            callers: Arc::clone(&self.callers),
            metrics: self.metrics.clone(),
        }
    }
}

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// A guard over `units` that takes the caller from an [`crate::AuthenticatedPrincipal`].
    pub fn new(units: U, config: GuardConfig) -> Self {
        Self {
            units: Arc::new(units),
            config,
            callers: Arc::new(AuthenticatedPrincipalExtractor),
            metrics: None,
        }
    }

    /// Records the ledger's side with `meter`: `grpc.server.ledger.answers` (keyed calls answered
    /// without running the handler, by `grpc.ledger.answer`: `replay`, `in_flight`,
    /// `key_reused`) and `grpc.server.ledger.claim_duration` (seconds from the unit's start to
    /// the ledger's answer on whether the handler runs), labelled `grpc.method`.
    #[cfg(feature = "opentelemetry")]
    pub fn with_meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.metrics = Some(ServerMetrics::new(meter));
        self
    }

    fn answered(&self, method: &GrpcMethod, answer: LedgerAnswer) {
        if let Some(metrics) = &self.metrics {
            metrics.answered(method, answer);
        }
    }

    /// Replaces how the caller is derived.
    pub fn with_caller_extractor(mut self, callers: impl CallerExtractor + 'static) -> Self {
        self.callers = Arc::new(callers);
        self
    }

    /// A retention worker on this guard's store: it deletes finished operations past
    /// `config.retention`; start it with [`RetentionWorker::spawn`] beside the server.
    pub fn retention_worker(&self, config: RetentionConfig) -> RetentionWorker<U> {
        RetentionWorker::new(Arc::clone(&self.units), config)
    }

    /// The units of work, for handlers that need the store outside a guarded call.
    pub fn units(&self) -> &U {
        &self.units
    }

    /// The identity of a call to `method`: its caller (from an authenticated source), the method,
    /// and the hash of its idempotency key from the key header. Refusals are INVALID_ARGUMENT with
    /// `ErrorInfo`. (A method that takes its key from its request's body has it read by
    /// [`run`](Self::run), which sees the message, and handed to the handler in its
    /// [`Operation`].)
    pub fn identity(
        &self,
        method: &GrpcMethod,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<GrpcOperationIdentity, Status> {
        self.identity_with_body_key(method, metadata, extensions, None)
    }

    /// The identity, its key from the key header or `body_key` (the request's key field): one is
    /// enough, and two must agree.
    fn identity_with_body_key(
        &self,
        method: &GrpcMethod,
        metadata: &MetadataMap,
        extensions: &Extensions,
        body_key: Option<&str>,
    ) -> Result<GrpcOperationIdentity, Status> {
        let header = metadata.get(self.config.key_header.as_str());
        let key = match (header, body_key) {
            (Some(header), Some(body)) if header.as_bytes() != body.as_bytes() => {
                return Err(LedgerError::from(InvalidInput::KeyMismatch).into());
            }
            (Some(header), _) => header.as_bytes(),
            (None, Some(body)) => body.as_bytes(),
            (None, None) => return Err(LedgerError::from(InvalidInput::KeyMissing).into()),
        };
        let key = IdempotencyKey::parse_bytes(key).map_err(LedgerError::from)?;
        let caller = self.callers.caller(metadata, extensions).ok_or_else(|| {
            Status::unauthenticated("a keyed mutation needs an authenticated caller")
        })?;
        Ok(GrpcOperationIdentity::new(
            caller,
            method.clone(),
            self.config.hasher.hash(&key),
        ))
    }

    /// The request's fingerprint, and its key field's text where `method` names one.
    fn fingerprint_and_body_key<M: Message>(
        &self,
        method: &GrpcMethod,
        message: &M,
    ) -> Result<(RequestFingerprint, Option<String>), Status> {
        let field = self
            .config
            .key_fields
            .get(method.as_str())
            .map(String::as_str);
        Ok(self
            .config
            .request_schema
            .fingerprint_message_with_key(method, message, field)?)
    }

    /// Runs `handler` once per identity: claim, [`GuardedHandler::handle`] (its writes on the
    /// unit's transaction), transition, commit. A duplicate gets [`GuardedHandler::replay`] of the
    /// stored outcome (or the stored failure) with `idempotent-replayed: true`; a key reused with
    /// another request is FAILED_PRECONDITION; an operation still in flight is ABORTED with a
    /// retry delay. A request that says it is a resend (`grpc-previous-rpc-attempts` above 0) is
    /// looked up by its key first: a finished operation is answered from that one read, anything
    /// else goes on to the claim (ADR 0016).
    ///
    /// The unit of work runs in a task of its own, so that once begun it reaches its commit or
    /// rollback even when the caller goes away (a client's cancel or deadline drops this future):
    /// a unit dropped in the middle of a statement would leave its pooled connection in a state
    /// the next user inherits (on MariaDB, a transaction still open there, error 1568 for the
    /// next unit on that connection), and its claim's fate to the driver. That is why the
    /// handler is moved in (`'static`): keep its shared state in an `Arc`.
    pub async fn run<H>(
        &self,
        method: &GrpcMethod,
        request: Request<H::Request>,
        handler: H,
    ) -> Result<Response<H::Response>, Status>
    where
        H: GuardedHandler<U::Transaction>,
    {
        let (metadata, extensions, message) = request.into_parts();
        let (fingerprint, body_key) = self.fingerprint_and_body_key(method, &message)?;
        let identity =
            self.identity_with_body_key(method, &metadata, &extensions, body_key.as_deref())?;
        let resend = says_it_is_a_resend(&metadata);
        let operation = Operation::new(identity, metadata, extensions, self.config.hasher.clone());
        let guard = self.clone();
        to_the_end(
            self.config.unit_time_bound(),
            self.config.commit_wait,
            async move {
                guard
                    .run_unit(operation, fingerprint, resend, message, &handler)
                    .await
            },
        )
        .await
    }

    /// [`run`](Self::run) for the method [`MethodFromPathLayer`](crate::MethodFromPathLayer) read
    /// from the request's path (the layer must be installed on the server; without it the call is
    /// refused as INTERNAL, never guessed).
    pub async fn run_request<H>(
        &self,
        request: Request<H::Request>,
        handler: H,
    ) -> Result<Response<H::Response>, Status>
    where
        H: GuardedHandler<U::Transaction>,
    {
        let method = request
            .extensions()
            .get::<GrpcMethod>()
            .cloned()
            .ok_or_else(|| {
                Status::internal("the server has no MethodFromPathLayer to name the method")
            })?;
        self.run(&method, request, handler).await
    }

    /// What became of the `method` operation named by this request's key and caller, read from
    /// the ledger, its lease judged by the store's clock: the body of a resolve RPC, without
    /// reaching into the store. Key and caller are read and refused as [`run`](Self::run) does,
    /// the key from the key header only (a resolve RPC's request is not the mutation's, so a
    /// method keyed by a request field is resolved by sending that key in the header).
    pub async fn resolve(
        &self,
        method: &GrpcMethod,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Resolved, Status> {
        let identity = self.identity(method, metadata, extensions)?;
        let guard = self.clone();
        // In a task of its own, for the reason `run` gives.
        let found = to_the_end(
            self.config.lease.get(),
            self.config.commit_wait,
            async move {
                // A read-only unit: a look-up takes no write lock (SQLite's one writer stays
                // with the claims).
                let transaction = guard.units.begin_read().await.map_err(Status::from)?;
                let found = guard.units.ledger(&transaction).look_up(&identity).await;
                guard.roll_back(transaction).await;
                found.map_err(Status::from)
            },
        )
        .await?;
        Ok(match found {
            None => Resolved::NotFound,
            Some((record, retry_after)) => match record.finished {
                None => Resolved::InProgress { retry_after },
                Some((_, Completion::Committed(outcome))) => Resolved::Committed(outcome),
                Some((_, Completion::Failed(failure))) => Resolved::Failed(failure),
            },
        })
    }
}

/// Whether the request says it is a resend: gRPC's clients (C-core, grpc-go, grpc-java, the
/// RetryLayer and the executor) send `grpc-previous-rpc-attempts` on every attempt after the
/// first (gRFC A6). Only a hint for where the unit looks first; never trusted for more.
fn says_it_is_a_resend(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata
        .get("grpc-previous-rpc-attempts")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u32>().ok())
        .is_some_and(|previous| previous > 0)
}
