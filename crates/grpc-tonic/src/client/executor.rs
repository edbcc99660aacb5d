//! The client side: retry a call exactly as the policy says, and never resend a mutation whose
//! outcome is unknown before asking what became of it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grpc_core_api::{
    IdempotencyKey, LedgerDurability, REPLAYED_METADATA_KEY, says_outcome_unknown,
};
use grpc_policy::{
    Evidence, GrpcRetryBudget, GrpcRetryOwner, MethodClass, RetryPlan, RetryPolicy, SplitMix64,
};
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataValue};
use tonic::{Code, Request, Response, Status};

use super::advice::ServerAdvice;
use super::attempts::{CallContext, CallRun, Next, call_deadline};
use super::commit::AttemptProgress;
use super::stats::ExecutorStats;
use super::transport::{TransportFailure, classify, reset_status};
use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};
use crate::random::jitter_source;

/// What became of an operation whose outcome was unknown, as the user's resolver found out.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new variant would be a new answer every
/// caller must handle, so it should break their `match` rather than fall into a wildcard.
#[derive(Debug)]
pub enum Resolution<R> {
    /// It committed: this is its response, rebuilt from the record.
    Committed(R),
    /// It failed terminally: this is the recorded failure.
    Failed(Status),
    /// It is still running somewhere; ask again after this long.
    InProgress(Duration),
    /// It never committed: sending it again with the same key is safe.
    NotFound,
}

/// The status the caller is given once the call's deadline has passed: tonic reports the expiry
/// of the timeout this executor set as CANCELLED ("Timeout expired"), and the executor's own timer
/// ends an attempt without a status; both are the call running out of time, DEADLINE_EXCEEDED as
/// every gRPC client reports it. A cancel from anywhere else is left alone.
fn deadline_status(status: Status, timed_out: bool) -> Status {
    if timed_out && matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded) {
        Status::deadline_exceeded("the call's deadline passed")
    } else {
        status
    }
}

/// The retry parameters of one method, from a validated A6 service config or given directly.
///
/// `#[non_exhaustive]`: built with [`new`](Self::new) or
/// [`from_plan`](Self::from_plan) and the `with_` methods, so that a new
/// parameter (with its default) breaks no caller. The fields stay public to read and to set.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RetrySettings {
    /// Who owns retries on the channel. The executor retries only as `Application`, or as
    /// `Channel` with parameters read from the service config.
    pub owner: GrpcRetryOwner,
    /// The method's retry policy.
    pub policy: RetryPolicy,
    /// The server's ledger durability, as the service documents it.
    pub server_ledger: LedgerDurability,
    /// How many times a resolution that says "in progress" is asked again before giving up.
    pub max_resolutions: u32,
    /// The deadline of the whole call, every attempt and lookup included (the service config's
    /// `timeout`); the call's deadline is the earlier of this and the caller's.
    pub call_timeout: Option<Duration>,
    /// A time limit for each attempt, only when asked for explicitly (the service config's
    /// `perAttemptRecvTimeout`, as grpc-java implements it).
    pub per_attempt_timeout: Option<Duration>,
    /// The request metadata that carries the key ([`IDEMPOTENCY_KEY_HEADER`] unless set with
    /// [`with_key_header`](Self::with_key_header)); the server's guard must read the same one
    /// (`GuardConfig::with_key_header`).
    pub key_header: AsciiMetadataKey,
}

impl RetrySettings {
    /// `policy` for a channel owned by `owner`; the server's ledger taken as volatile (keyed
    /// mutations are then never resent once sent), 10 lookups of an in-progress operation, no
    /// call timeout, and the policy's own `perAttemptRecvTimeout`.
    pub fn new(owner: GrpcRetryOwner, policy: RetryPolicy) -> Self {
        Self {
            owner,
            server_ledger: LedgerDurability::Volatile,
            max_resolutions: 10,
            call_timeout: None,
            per_attempt_timeout: policy.per_attempt_recv_timeout(),
            policy,
            key_header: AsciiMetadataKey::from_static(IDEMPOTENCY_KEY_HEADER),
        }
    }

    /// The request metadata that carries the key, or why `name` cannot be one (upper case,
    /// spaces, a `-bin` suffix: gRPC metadata keys are lower-case ASCII).
    pub fn with_key_header(mut self, name: &str) -> Result<Self, InvalidKeyHeader> {
        self.key_header = key_header(name)?;
        Ok(self)
    }

    /// The server's ledger durability, as the service documents it.
    pub fn with_server_ledger(mut self, durability: LedgerDurability) -> Self {
        self.server_ledger = durability;
        self
    }

    /// The deadline of the whole call (the earlier of it and the caller's wins).
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// How many times an "in progress" resolution is asked again before giving up.
    pub fn with_max_resolutions(mut self, resolutions: u32) -> Self {
        self.max_resolutions = resolutions;
        self
    }

    /// The retry policy and `timeout` a [`RetryPlan`] gives `method`, for the plan's owner and
    /// its server ledger: `None` when the method's entry has no `retryPolicy` (or no entry
    /// names it).
    ///
    /// The plan is the one place a service config becomes retry parameters: an application
    /// that owns retries plans with [`GrpcRetryOwner::Application`] and gives its channel
    /// [`RetryPlan::channel_config`], so that only the executor retries.
    pub fn from_plan(plan: &RetryPlan, method: &grpc_core_api::GrpcMethod) -> Option<Self> {
        let method = plan.method(method);
        let mut settings = Self::new(plan.owner(), method.retry_policy?.clone())
            .with_server_ledger(plan.server_ledger());
        settings.call_timeout = method.timeout;
        Some(settings)
    }
}

/// Retries calls on a generated tonic client as the policy decides.
pub struct RetryExecutor {
    settings: RetrySettings,
    budget: Arc<GrpcRetryBudget>,
    random: Mutex<SplitMix64>,
    stats: Arc<ExecutorStats>,
}

impl RetryExecutor {
    /// An executor sharing `budget` with every other executor calling the same target.
    pub fn new(settings: RetrySettings, budget: Arc<GrpcRetryBudget>) -> Self {
        Self {
            settings,
            budget,
            random: Mutex::new(jitter_source()),
            stats: Arc::new(ExecutorStats::default()),
        }
    }

    /// Shares counters with other executors (one summary for a whole client).
    pub fn with_stats(mut self, stats: Arc<ExecutorStats>) -> Self {
        self.stats = stats;
        self
    }

    /// What the executor has done.
    pub fn stats(&self) -> &Arc<ExecutorStats> {
        &self.stats
    }

    /// A keyed mutation: [`call`](Self::call) with `key` on every attempt, and `resolve` asked
    /// what became of the operation whenever an attempt's outcome is unknown.
    pub async fn call_keyed<M, R, C, CF, S, SF>(
        &self,
        message: M,
        key: &IdempotencyKey,
        deadline: Option<Duration>,
        call: C,
        resolve: S,
    ) -> Result<Response<R>, Status>
    where
        M: Clone,
        C: FnMut(Request<M>) -> CF,
        CF: Future<Output = Result<Response<R>, Status>>,
        S: FnMut() -> SF,
        SF: Future<Output = Result<Resolution<R>, Status>>,
    {
        self.call(
            MethodClass::KeyedMutation,
            message,
            Some(key),
            deadline,
            call,
            resolve,
        )
        .await
    }

    /// A call without an idempotency key (`class` says whether it is safe to repeat): nothing
    /// can be looked up, so an attempt whose outcome is unknown is retried only if the policy
    /// allows it for the class, never resolved.
    pub async fn call_unkeyed<M, R, C, CF>(
        &self,
        class: MethodClass,
        message: M,
        deadline: Option<Duration>,
        call: C,
    ) -> Result<Response<R>, Status>
    where
        M: Clone,
        C: FnMut(Request<M>) -> CF,
        CF: Future<Output = Result<Response<R>, Status>>,
    {
        // The policy resolves only calls that carry a key; this lookup is never asked.
        let no_lookup = || async {
            Err::<Resolution<R>, Status>(Status::internal("an unkeyed call has nothing to look up"))
        };
        self.call(class, message, None, deadline, call, no_lookup)
            .await
    }

    /// Calls `call` with `message` until it succeeds or the policy refuses a retry; the general
    /// form of [`call_keyed`](Self::call_keyed) and [`call_unkeyed`](Self::call_unkeyed).
    ///
    /// Every attempt carries the same `key` (when given) and `grpc-previous-rpc-attempts`; the
    /// request is cloned per attempt. When the policy answers "resolve the completion first",
    /// `resolve` is asked what became of the operation: a committed outcome is returned without
    /// resending, a recorded failure is returned as it is, "in progress" is asked again after a
    /// delay, and "not found" resends with the same key (through the budget).
    ///
    /// The call's deadline is the earlier of `deadline` and the settings' `call_timeout`, counted
    /// from now; it bounds every attempt (response body included) and every lookup, and when it
    /// passes the caller gets DEADLINE_EXCEEDED. An attempt that provably never reached the
    /// server application is resent whatever the method, without a budget token and without
    /// counting toward `maxAttempts`: up to 5 times (10 ms apart, within the deadline) when it
    /// never left the process (no connection, dropped unsent), once when the server refused it
    /// before its application saw it (REFUSED_STREAM, above a GOAWAY's last stream). A
    /// connection that broke after the request was sent is UNAVAILABLE with an unknown outcome,
    /// as grpc-go and gRPC C-core report it.
    ///
    /// An attempt whose response headers arrived before it failed (A6's commit point) is the
    /// call's answer and is never retried, when the calls go through a channel wrapped in a
    /// [`CommitObserver`](crate::CommitObserver); without one the executor cannot see headers.
    pub async fn call<M, R, C, CF, S, SF>(
        &self,
        class: MethodClass,
        message: M,
        key: Option<&IdempotencyKey>,
        deadline: Option<Duration>,
        mut call: C,
        mut resolve: S,
    ) -> Result<Response<R>, Status>
    where
        M: Clone,
        C: FnMut(Request<M>) -> CF,
        CF: Future<Output = Result<Response<R>, Status>>,
        S: FnMut() -> SF,
        SF: Future<Output = Result<Resolution<R>, Status>>,
    {
        let call_deadline = call_deadline(deadline, self.settings.call_timeout);
        let key_value: Option<AsciiMetadataValue> =
            match key {
                Some(key) => Some(key.expose().parse().map_err(|_| {
                    Status::invalid_argument("idempotency key is not valid metadata")
                })?),
                None => None,
            };
        let durable_ledger = self.settings.server_ledger == LedgerDurability::Durable;
        let mut run = CallRun::new(
            CallContext {
                owner: self.settings.owner,
                class,
                has_key: key.is_some(),
                ledger: self.settings.server_ledger,
                policy: &self.settings.policy,
                budget: Some(&self.budget),
                random: &self.random,
                stats: &self.stats,
            },
            call_deadline,
        );
        loop {
            // A lookup or a backoff may have used up the rest of the deadline: send nothing then.
            if run.deadline_passed() {
                return Err(Status::deadline_exceeded("the call's deadline passed"));
            }
            let (request, attempt_limit, progress) =
                self.attempt_request(message.clone(), key_value.as_ref(), &run);
            run.attempt_starts();
            let (answer, timed_out) = within(attempt_limit, call(request)).await;
            let status = match answer {
                Ok(response) => {
                    run.succeeded();
                    if response.metadata().get(REPLAYED_METADATA_KEY).is_some() {
                        self.stats.replays.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(response);
                }
                Err(status) => status,
            };
            // A6's commit point: once response headers arrived, the attempt reached the
            // application and is the call's answer, whatever broke after.
            let committed = progress.committed();
            let (status, failure) = attempt_status(status, timed_out);
            if !committed && run.resend_transparently(failure, status.code()).await {
                continue;
            }
            let advice = ServerAdvice::of(&status, status.metadata().as_ref());
            // A keyed mutation against a durable ledger is the exception to A6's commit rule:
            // its outcome, once headers arrived, is still asked for rather than given up on (a
            // lookup is not a resend, and a resend under the same key is a replay).
            let evidence = if committed && !(key.is_some() && durable_ledger) {
                Evidence::PrefixDelivered
            } else if timed_out || failure.outcome_unknown() || says_outcome_unknown(&status) {
                // No answer, or the server's own "my commit got no verdict": look it up first.
                Evidence::SentNoAnswer
            } else {
                Evidence::Sent
            };
            match run.judge(status.code(), advice, evidence) {
                Next::Retry(backoff) => run.pause(backoff).await,
                Next::Stop => return Err(status),
                Next::ResolveFirst(backoff) => {
                    match self.resolve(&mut resolve, call_deadline).await? {
                        Some(response) => return Ok(response),
                        None if run.may_resend() => {
                            tracing::info!(
                                "operation never committed; resending with the same key"
                            );
                            run.pause(backoff).await;
                        }
                        None => return Err(status),
                    }
                }
            }
        }
    }

    /// The request of the run's next attempt: the message, the key, the attempts before it, the
    /// time limit the server is told (also returned, to bound the attempt here), and the marker
    /// a [`CommitObserver`](crate::CommitObserver) sets when the response headers arrive.
    fn attempt_request<M>(
        &self,
        message: M,
        key: Option<&AsciiMetadataValue>,
        run: &CallRun<'_>,
    ) -> (Request<M>, Option<Duration>, AttemptProgress) {
        let mut request = Request::new(message);
        if let Some(value) = key {
            request
                .metadata_mut()
                .insert(self.settings.key_header.clone(), value.clone());
        }
        if run.previous_attempts() > 0 {
            request.metadata_mut().insert(
                "grpc-previous-rpc-attempts",
                MetadataValue::from(run.previous_attempts()),
            );
        }
        let attempt_limit = run.attempt_limit(self.settings.per_attempt_timeout);
        if let Some(limit) = attempt_limit {
            // Tells the server (grpc-timeout); the executor's timer bounds the whole attempt.
            request.set_timeout(limit);
        }
        let progress = AttemptProgress::default();
        request.extensions_mut().insert(progress.clone());
        (request, attempt_limit, progress)
    }

    /// Asks what became of the operation; `Some` is the final answer, `None` means resend. Every
    /// lookup is bounded by the call's deadline.
    async fn resolve<R, S, SF>(
        &self,
        resolve: &mut S,
        call_deadline: Option<Instant>,
    ) -> Result<Option<Response<R>>, Status>
    where
        S: FnMut() -> SF,
        SF: Future<Output = Result<Resolution<R>, Status>>,
    {
        let left = || call_deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let out_of_time = || {
            Status::deadline_exceeded(
                "the call's deadline passed while its outcome was being looked up",
            )
        };
        for round in 0..self.settings.max_resolutions.max(1) {
            let (answer, timed_out) = within(left(), resolve()).await;
            if timed_out {
                return Err(out_of_time());
            }
            let answer = match answer {
                Ok(answer) => answer,
                // The lookup itself failed on the way (the server restarting, say): the outcome
                // is still unknown, so ask again rather than give up or resend.
                Err(status)
                    if matches!(
                        status.code(),
                        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
                    ) || classify(&status) != TransportFailure::Other =>
                {
                    let wait = Duration::from_millis(50 * (u64::from(round) + 1));
                    if left().is_some_and(|left| left < wait) {
                        return Err(out_of_time());
                    }
                    tracing::info!(code = ?status.code(), ?wait, "the lookup failed; asking again");
                    tokio::time::sleep(wait).await;
                    continue;
                }
                Err(status) => return Err(status),
            };
            match answer {
                Resolution::Committed(response) => {
                    tracing::info!("resolved: the operation committed; returning its outcome");
                    self.stats.replays.fetch_add(1, Ordering::Relaxed);
                    let mut response = Response::new(response);
                    response
                        .metadata_mut()
                        .insert(REPLAYED_METADATA_KEY, MetadataValue::from_static("true"));
                    return Ok(Some(response));
                }
                Resolution::Failed(status) => {
                    tracing::info!(code = ?status.code(), "resolved: the operation failed terminally");
                    return Err(status);
                }
                Resolution::NotFound => return Ok(None),
                Resolution::InProgress(wait) => {
                    if left().is_some_and(|left| left < wait) {
                        return Err(Status::deadline_exceeded(
                            "the operation is still in progress at the deadline",
                        ));
                    }
                    tracing::info!(?wait, "resolved: still in progress; asking again");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        Err(Status::aborted(
            "the operation stayed in progress; its outcome is unknown",
        ))
    }
}

/// A failed attempt's status as every gRPC client reports it, and what the transport says of
/// it: the call running out of time is DEADLINE_EXCEEDED; a broken connection, and a stream
/// refused or cut off by a GOAWAY, are UNAVAILABLE, and a stream the server reset has the status
/// of its reason (INTERNAL for INTERNAL_ERROR), as grpc-go and C-core report them (tonic says
/// UNKNOWN or INTERNAL, depending on its features).
fn attempt_status(status: Status, timed_out: bool) -> (Status, TransportFailure) {
    let failure = classify(&status);
    let status = deadline_status(status, timed_out);
    let status = match failure {
        TransportFailure::Other => status,
        _ if timed_out => status,
        TransportFailure::StreamReset => {
            reset_status(std::error::Error::source(&status)).unwrap_or(status)
        }
        _ => Status::unavailable(format!("transport failure: {}", status.message())),
    };
    (status, failure)
}

/// Runs `future` for at most `limit`; the flag says whether the limit ran out first.
async fn within<T>(
    limit: Option<Duration>,
    future: impl Future<Output = Result<T, Status>>,
) -> (Result<T, Status>, bool) {
    match limit {
        None => (future.await, false),
        Some(limit) => match tokio::time::timeout(limit, future).await {
            Ok(answer) => {
                // tonic's own timer (the grpc-timeout this executor set) fires as CANCELLED.
                let expired = matches!(&answer, Err(s) if s.code() == Code::Cancelled && s.message().contains("Timeout expired"));
                (answer, expired)
            }
            Err(_) => (
                Err(Status::deadline_exceeded("the call's deadline passed")),
                true,
            ),
        },
    }
}
