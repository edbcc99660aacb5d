//! The server side: a keyed mutation runs exactly once, whatever the client resends.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grpc_core_api::{
    ClaimOutcome, Completion, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, InvalidInput,
    KeyHasher, LeaseDuration, LedgerError, LedgerUnitsOfWork, OperationRecord, OutcomeReference,
    REPLAYED_METADATA_KEY, RecordOutcome, RecordedFailure, RequestFingerprint, RequestSchema,
    Version,
};
use prost::Message;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Extensions, Request, Response, Status};

use super::caller::{AuthenticatedPrincipalExtractor, CallerExtractor};
use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};
use crate::metrics::{LedgerAnswer, ServerMetrics};

/// How the guard reads and protects keyed mutations.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GuardConfig {
    /// The request metadata holding the idempotency key.
    pub key_header: String,
    /// How long a claim protects its owner before another attempt may take it over. With the
    /// claim, the business write and the transition in one transaction, the lease matters only if
    /// that transaction outlives it.
    pub lease: LeaseDuration,
    /// How keys are hashed before they are stored; keyed hashing with a server secret keeps a
    /// stolen ledger from revealing short keys.
    pub hasher: KeyHasher,
    /// The service's request types, read from its descriptor set: the request fingerprint is
    /// computed over their canonical form, so that a retry whose maps arrive in another order
    /// (or from another client library) is recognised as the same request.
    pub request_schema: Arc<RequestSchema>,
    /// When the ledger row is written: before the handler (the default), or once, finished, after
    /// it (only for handlers whose every effect is in the unit's transaction).
    pub mode: GuardMode,
}

/// When the guard writes an operation's ledger row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuardMode {
    /// Claim before the handler runs, finish the claim after: a duplicate arriving while the
    /// handler runs waits (or is told it is in flight) and never runs the handler. Safe for any
    /// handler, including one with effects outside the transaction (a call to another service).
    #[default]
    ClaimFirst,
    /// Run the handler first, then write the ledger row once, already finished, in the same
    /// transaction just before the commit: one row write instead of two. The price: duplicates
    /// that arrive together each run the handler until one commits; the others then find the
    /// committed row, roll their transaction back (their effects with it) and replay. So this mode
    /// is only for handlers whose **every** effect is in the unit's transaction; an effect
    /// anywhere else (a message sent, another service called) would happen once per duplicate.
    /// A finished operation is looked up before the handler runs, so a retry of one that already
    /// committed replays without running it.
    WriteOnceInTransactionOnly,
}

impl GuardConfig {
    /// The default header and a 30 s lease, with `hasher` and the service's `request_schema`.
    pub fn new(hasher: KeyHasher, request_schema: RequestSchema) -> Self {
        Self {
            key_header: IDEMPOTENCY_KEY_HEADER.to_owned(),
            lease: LeaseDuration::new(Duration::from_secs(30)).expect("30 s is a valid lease"),
            hasher,
            request_schema: Arc::new(request_schema),
            mode: GuardMode::ClaimFirst,
        }
    }

    /// This configuration in `mode`.
    pub fn with_mode(mut self, mode: GuardMode) -> Self {
        self.mode = mode;
        self
    }

    /// The request metadata that holds the key ([`IDEMPOTENCY_KEY_HEADER`] by default), or why
    /// `name` cannot be one; the clients' `RetrySettings::with_key_header` or
    /// `RetryLayerBuilder::key_header` must name the same.
    pub fn with_key_header(mut self, name: &str) -> Result<Self, InvalidKeyHeader> {
        self.key_header = key_header(name)?.as_str().to_owned();
        Ok(self)
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

    /// The units of work, for handlers that need the store outside a guarded call.
    pub fn units(&self) -> &U {
        &self.units
    }

    /// The identity of a call to `method`: its caller (from an authenticated source), the method,
    /// and the hash of its idempotency key. Refusals are INVALID_ARGUMENT with `ErrorInfo`.
    pub fn identity(
        &self,
        method: &GrpcMethod,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<GrpcOperationIdentity, Status> {
        let key = metadata
            .get(self.config.key_header.as_str())
            .ok_or(LedgerError::from(InvalidInput::KeyMissing))?;
        let key = IdempotencyKey::parse_bytes(key.as_bytes()).map_err(LedgerError::from)?;
        let caller = self.callers.caller(metadata, extensions).ok_or_else(|| {
            Status::unauthenticated("a keyed mutation needs an authenticated caller")
        })?;
        Ok(GrpcOperationIdentity::new(
            caller,
            method.clone(),
            self.config.hasher.hash(&key),
        ))
    }

    /// Runs `handler` once per identity: claim, handler (its writes on the unit's transaction),
    /// transition, commit. A duplicate gets `replay` of the stored outcome (or the stored
    /// failure) with `idempotent-replayed: true`; a key reused with another request is
    /// FAILED_PRECONDITION; an operation still in flight is ABORTED with a retry delay.
    ///
    /// The handler and the replay receive the unit's transaction as an `Arc`; they must not keep
    /// it past their future, since the guard commits or rolls it back afterwards (a handler that
    /// does gets INTERNAL, and nothing it did is committed). A borrow would let the compiler check
    /// this instead, but the handler's future must be `Send + 'static` to run in the unit's own
    /// task (below), and Rust cannot yet state `Send` for the future of an async closure that
    /// borrows its argument (`AsyncFnOnce` gives that future no nameable type); the `Arc` is the
    /// price of the unit running to its end.
    ///
    /// The unit of work runs in a task of its own, so that once begun it reaches its commit or
    /// rollback even when the caller goes away (a client's cancel or deadline drops this future):
    /// a unit dropped in the middle of a statement would leave its pooled connection in a state
    /// the next user inherits (on MariaDB, a transaction still open there, error 1568 for the
    /// next unit on that connection), and its claim's fate to the driver.
    pub async fn run<M, R, H, HF, P, PF>(
        &self,
        method: &GrpcMethod,
        request: Request<M>,
        handler: H,
        replay: P,
    ) -> Result<Response<R>, Status>
    where
        M: Message + Send + 'static,
        R: Send + 'static,
        H: FnOnce(Arc<U::Transaction>, M) -> HF + Send + 'static,
        HF: Future<Output = Result<Committed<R>, HandlerError>> + Send + 'static,
        P: FnOnce(Arc<U::Transaction>, OutcomeReference) -> PF + Send + 'static,
        PF: Future<Output = Result<R, Status>> + Send + 'static,
    {
        let (metadata, extensions, message) = request.into_parts();
        let identity = self.identity(method, &metadata, &extensions)?;
        let fingerprint = self
            .config
            .request_schema
            .fingerprint_message(method, &message)?;
        let guard = self.clone();
        let method = method.clone();
        to_the_end(self.config.lease.get(), async move {
            guard
                .run_unit(&method, identity, fingerprint, message, handler, replay)
                .await
        })
        .await
    }

    /// Answers a duplicate from `record` (the replayed outcome, or the recorded failure) and rolls
    /// the unit of work back.
    async fn replay_and_roll_back<R, P, PF>(
        &self,
        method: &GrpcMethod,
        transaction: Arc<U::Transaction>,
        record: OperationRecord,
        replay: P,
    ) -> Result<Response<R>, Status>
    where
        P: FnOnce(Arc<U::Transaction>, OutcomeReference) -> PF + Send,
        PF: Future<Output = Result<R, Status>> + Send,
    {
        tracing::debug!(method = %method, state = %record.state(), "replaying a finished operation");
        self.answered(method, LedgerAnswer::Replay);
        let answer = match record.finished {
            Some((_, Completion::Committed(outcome))) => replay(Arc::clone(&transaction), outcome)
                .await
                .map(replayed),
            Some((_, Completion::Failed(failure))) => Err(replayed_failure(&failure)),
            None => Err(Status::internal("a completed operation has no outcome")),
        };
        self.roll_back(transaction).await;
        answer
    }

    /// [`run`](Self::run) for the method [`MethodFromPathLayer`](crate::MethodFromPathLayer) read
    /// from the request's path (the layer must be installed on the server; without it the call is
    /// refused as INTERNAL, never guessed).
    pub async fn run_request<M, R, H, HF, P, PF>(
        &self,
        request: Request<M>,
        handler: H,
        replay: P,
    ) -> Result<Response<R>, Status>
    where
        M: Message + Send + 'static,
        R: Send + 'static,
        H: FnOnce(Arc<U::Transaction>, M) -> HF + Send + 'static,
        HF: Future<Output = Result<Committed<R>, HandlerError>> + Send + 'static,
        P: FnOnce(Arc<U::Transaction>, OutcomeReference) -> PF + Send + 'static,
        PF: Future<Output = Result<R, Status>> + Send + 'static,
    {
        let method = request
            .extensions()
            .get::<GrpcMethod>()
            .cloned()
            .ok_or_else(|| {
                Status::internal("the server has no MethodFromPathLayer to name the method")
            })?;
        self.run(&method, request, handler, replay).await
    }

    /// The unit of work of [`run`](Self::run). Claim-first: claim, handler, transition, commit.
    /// Write-once: look the identity up, handler, one record of the finished operation, commit.
    /// A duplicate found at either step is replayed and the unit rolled back.
    async fn run_unit<M, R, H, HF, P, PF>(
        &self,
        method: &GrpcMethod,
        identity: GrpcOperationIdentity,
        fingerprint: RequestFingerprint,
        message: M,
        handler: H,
        replay: P,
    ) -> Result<Response<R>, Status>
    where
        M: Message + Send,
        R: Send,
        H: FnOnce(Arc<U::Transaction>, M) -> HF + Send,
        HF: Future<Output = Result<Committed<R>, HandlerError>> + Send,
        P: FnOnce(Arc<U::Transaction>, OutcomeReference) -> PF + Send,
        PF: Future<Output = Result<R, Status>> + Send,
    {
        let started = Instant::now();
        let transaction = Arc::new(self.units.begin().await.map_err(Status::from)?);
        let before = match self.config.mode {
            GuardMode::ClaimFirst => {
                self.claim_first(&transaction, &identity, &fingerprint)
                    .await
            }
            GuardMode::WriteOnceInTransactionOnly => {
                self.look_up_first(&transaction, &identity, &fingerprint)
                    .await
            }
        };
        if let Some(metrics) = &self.metrics {
            metrics.claimed(method, started.elapsed());
        }
        let claimed = match before {
            Ok(Before::RunHandler { claimed }) => claimed,
            Ok(Before::Replay(record)) => {
                return self
                    .replay_and_roll_back(method, transaction, *record, replay)
                    .await;
            }
            Err(status) => {
                // Only the ledger refuses here: ABORTED is an operation in flight,
                // FAILED_PRECONDITION a key reused for another request.
                match status.code() {
                    Code::Aborted => self.answered(method, LedgerAnswer::InFlight),
                    Code::FailedPrecondition => self.answered(method, LedgerAnswer::KeyReused),
                    _ => {}
                }
                tracing::debug!(method = %method, code = ?status.code(), "refused before the handler");
                self.roll_back(transaction).await;
                return Err(status);
            }
        };
        tracing::debug!(method = %method, claimed = claimed.is_some(), "running the handler");
        let (completion, answer) = match handler(Arc::clone(&transaction), message).await {
            Ok(Committed { response, outcome }) => {
                (Completion::Committed(outcome), Ok(Response::new(response)))
            }
            // A message too long or with NUL is recorded in a form the store keeps; this caller
            // still gets the handler's status as it was.
            Err(HandlerError::Terminal(status)) => match RecordedFailure::from_status(&status) {
                Some(failure) => (Completion::Failed(failure), Err(status)),
                None => {
                    self.roll_back(transaction).await;
                    return Err(Status::internal("a terminal failure needs a non-OK status"));
                }
            },
            Err(HandlerError::Transient(status)) => {
                self.roll_back(transaction).await;
                return Err(status);
            }
        };
        let Some(version) = claimed else {
            return self
                .record_and_commit(
                    method,
                    transaction,
                    &identity,
                    &fingerprint,
                    completion,
                    answer,
                    replay,
                )
                .await;
        };
        self.complete(transaction, &identity, version, &completion)
            .await?;
        answer
    }

    /// Claim-first's step before the handler: the claim.
    async fn claim_first(
        &self,
        transaction: &U::Transaction,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
    ) -> Result<Before, Status> {
        let claim = self
            .units
            .ledger(transaction)
            .claim(identity, fingerprint, self.config.lease)
            .await?;
        match claim {
            ClaimOutcome::Claimed { version, .. } => Ok(Before::RunHandler {
                claimed: Some(version),
            }),
            ClaimOutcome::Completed(record) => Ok(Before::Replay(Box::new(record))),
            ClaimOutcome::InProgress { retry_after, .. } => {
                Err(LedgerError::InFlight { retry_after }.into())
            }
        }
    }

    /// Write-once's step before the handler: a retry of an operation that already finished
    /// replays without running the handler (whose own write could collide with the first one's).
    async fn look_up_first(
        &self,
        transaction: &U::Transaction,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
    ) -> Result<Before, Status> {
        let found = self.units.ledger(transaction).find(identity).await?;
        match found.filter(|record| record.state().is_terminal()) {
            Some(record) if record.request_fingerprint != *fingerprint => {
                Err(LedgerError::KeyReusedWithDifferentRequest.into())
            }
            Some(record) => Ok(Before::Replay(Box::new(record))),
            None => Ok(Before::RunHandler { claimed: None }),
        }
    }

    /// Write-once's step after the handler: record the finished operation and commit, or, when
    /// another unit finished it first, roll back and replay that one.
    #[allow(clippy::too_many_arguments)]
    async fn record_and_commit<R, P, PF>(
        &self,
        method: &GrpcMethod,
        transaction: Arc<U::Transaction>,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
        completion: Completion,
        answer: Result<Response<R>, Status>,
        replay: P,
    ) -> Result<Response<R>, Status>
    where
        P: FnOnce(Arc<U::Transaction>, OutcomeReference) -> PF + Send,
        PF: Future<Output = Result<R, Status>> + Send,
    {
        let recorded = self
            .units
            .ledger(&transaction)
            .record_finished(identity, fingerprint, self.config.lease, &completion)
            .await;
        match recorded {
            Ok(RecordOutcome::Recorded(_)) => {
                self.commit(transaction).await?;
                answer
            }
            Ok(RecordOutcome::Completed(record)) => {
                tracing::debug!(method = %method, "a duplicate finished first; its effect stands");
                self.replay_and_roll_back(method, transaction, *record, replay)
                    .await
            }
            Ok(RecordOutcome::InProgress { retry_after }) => {
                self.answered(method, LedgerAnswer::InFlight);
                self.roll_back(transaction).await;
                Err(LedgerError::InFlight { retry_after }.into())
            }
            Err(error) => {
                if matches!(error, LedgerError::KeyReusedWithDifferentRequest) {
                    self.answered(method, LedgerAnswer::KeyReused);
                }
                self.roll_back(transaction).await;
                Err(error.into())
            }
        }
    }

    /// What became of the `method` operation named by this request's key and caller, read from
    /// the ledger, its lease judged by the store's clock: the body of a resolve RPC, without
    /// reaching into the store. Key and caller are read and refused as [`run`](Self::run) does.
    pub async fn resolve(
        &self,
        method: &GrpcMethod,
        metadata: &MetadataMap,
        extensions: &Extensions,
    ) -> Result<Resolved, Status> {
        let identity = self.identity(method, metadata, extensions)?;
        let guard = self.clone();
        // In a task of its own, for the reason `run` gives.
        let found = to_the_end(self.config.lease.get(), async move {
            let transaction = Arc::new(guard.units.begin().await.map_err(Status::from)?);
            let found = guard.units.ledger(&transaction).look_up(&identity).await;
            guard.roll_back(transaction).await;
            found.map_err(Status::from)
        })
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

    /// Records how the claimed operation ended and commits the unit of work; if the ledger refuses
    /// the transition (ownership lost, store down), rolls everything back and says why.
    async fn complete(
        &self,
        transaction: Arc<U::Transaction>,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<(), Status> {
        let marked = self
            .units
            .ledger(&transaction)
            .mark_finished(identity, version, completion)
            .await;
        match marked {
            Ok(_) => self.commit(transaction).await,
            Err(error) => {
                self.roll_back(transaction).await;
                Err(error.into())
            }
        }
    }

    /// Commits the unit of work the guard began; a failed commit is the answer (the outcome did
    /// not take effect, or is unknown and a keyed retry will find out).
    async fn commit(&self, transaction: Arc<U::Transaction>) -> Result<(), Status> {
        let transaction = Arc::try_unwrap(transaction).map_err(|_| {
            Status::internal("a handler kept the unit of work's transaction past its call")
        })?;
        self.units.commit(transaction).await.map_err(Status::from)
    }

    /// Rolls back the unit of work the guard began. A rollback that fails changes nothing the
    /// caller is told (the store discards an unfinished transaction whose connection ends), so it
    /// is logged and the real answer kept.
    async fn roll_back(&self, transaction: Arc<U::Transaction>) {
        let Ok(transaction) = Arc::try_unwrap(transaction) else {
            tracing::error!("a handler kept the unit of work's transaction past its call");
            return;
        };
        if let Err(error) = self.units.rollback(transaction).await {
            tracing::warn!(%error, "rolling back a unit of work failed; the answer stands");
        }
    }
}

fn replayed<R>(response: R) -> Response<R> {
    let mut response = Response::new(response);
    response
        .metadata_mut()
        .insert(REPLAYED_METADATA_KEY, MetadataValue::from_static("true"));
    response
}

fn replayed_failure(failure: &RecordedFailure) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(REPLAYED_METADATA_KEY, MetadataValue::from_static("true"));
    failure.to_status(metadata)
}

/// What the step before the handler decided.
enum Before {
    /// Run the handler; `claimed` is the claim's version (claim-first), or `None` (write-once).
    RunHandler { claimed: Option<Version> },
    /// The operation already finished: replay this record.
    Replay(Box<OperationRecord>),
}

/// Runs `unit` to its end in a task of its own, whatever becomes of the caller's future, but for
/// at most `lease`: a unit that outlives its claim's lease (a handler waiting on something that
/// never answers) is dropped and so rolled back, since by then another attempt may take its claim
/// over and its commit would be fenced anyway; it must not hold its connection and its row lock
/// for ever. A unit that panicked, or was cut off by the runtime shutting down, is an error of
/// the server.
async fn to_the_end<T: Send + 'static>(
    lease: Duration,
    unit: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    let bounded = async move {
        tokio::time::timeout(lease, unit).await.unwrap_or_else(|_| {
            Err(Status::unavailable(
                "the unit of work outlived its lease and was rolled back",
            ))
        })
    };
    match tokio::spawn(bounded).await {
        Ok(answer) => answer,
        Err(error) if error.is_panic() => Err(Status::internal("the unit of work panicked")),
        Err(_) => Err(Status::unavailable("the server is shutting down")),
    }
}
