//! The client side: retry a call exactly as the policy says, and never resend a mutation whose
//! outcome is unknown before asking what became of it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use grpc_core_api::{IdempotencyKey, LedgerDurability, REPLAYED_METADATA_KEY};
use grpc_policy::{
    AttemptFacts, Backoff, Evidence, GrpcRetryBudget, GrpcRetryEligibility, GrpcRetryOwner,
    MethodClass, RefusalReason, RetryPolicy, ServiceConfig, SplitMix64, Verdict, parse_pushback,
};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::{Code, Request, Response, Status};

use crate::IDEMPOTENCY_KEY_HEADER;

/// What became of an operation whose outcome was unknown, as the user's resolver found out.
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

/// The status code the policy should judge. tonic reports its own client-side timeout as
/// CANCELLED ("Timeout expired"); an attempt cancelled once its time limit had passed ran out of
/// time, which is DEADLINE_EXCEEDED to the policy: its outcome is unknown, not abandoned.
fn observed_code(status: &Status, elapsed: Duration, limit: Option<Duration>) -> Code {
    match (status.code(), limit) {
        (Code::Cancelled, Some(limit)) if elapsed >= limit => Code::DeadlineExceeded,
        (code, _) => code,
    }
}

/// Counters a caller can read to see what the executor did.
#[derive(Debug, Default)]
pub struct ExecutorStats {
    /// Attempts sent.
    pub attempts: AtomicU64,
    /// Attempts after the first.
    pub retries: AtomicU64,
    /// Times the completion of an unknown outcome was resolved before deciding.
    pub resolved_first: AtomicU64,
    /// Answers that were replays of an earlier attempt's outcome.
    pub replays: AtomicU64,
    refusals: Mutex<BTreeMap<String, u64>>,
}

impl ExecutorStats {
    fn refused(&self, reason: RefusalReason) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        *refusals.entry(format!("{reason:?}")).or_default() += 1;
    }

    /// Refusals by reason.
    pub fn refusals(&self) -> BTreeMap<String, u64> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The retry parameters of one method, from a validated A6 service config or given directly.
#[derive(Debug, Clone)]
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
    /// The time limit of one attempt (the service config's `timeout`); the call's own deadline
    /// still bounds the whole call.
    pub attempt_timeout: Option<Duration>,
}

impl RetrySettings {
    /// Reads the retry policy that applies to `method` in a service config.
    pub fn from_service_config(
        config: &ServiceConfig,
        method: &grpc_core_api::GrpcMethod,
        owner: GrpcRetryOwner,
        server_ledger: LedgerDurability,
    ) -> Option<Self> {
        let (_, entry) = config.entry_for(method)?;
        Some(Self {
            owner,
            policy: entry.retry_policy.clone()?,
            server_ledger,
            max_resolutions: 10,
            attempt_timeout: entry.timeout,
        })
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
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed)
            ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            settings,
            budget,
            random: Mutex::new(SplitMix64::from_seed(seed)),
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

    /// Calls `call` with `message` until it succeeds or the policy refuses a retry.
    ///
    /// Every attempt carries the same `key` (when given) and `grpc-previous-rpc-attempts`; the
    /// request is cloned per attempt. When the policy answers "resolve the completion first",
    /// `resolve` is asked what became of the operation: a committed outcome is returned without
    /// resending, a recorded failure is returned as it is, "in progress" is asked again after a
    /// delay, and "not found" resends with the same key (through the budget).
    ///
    /// Attempts whose failure does not prove the request stayed in the process count as sent: a
    /// transport error from tonic cannot tell "never written" from "written, then lost", and the
    /// safe reading is the one that never duplicates.
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
        let started = Instant::now();
        let retryable = self.settings.policy.retryable_status_codes();
        let backoff = Backoff::of(&self.settings.policy);
        let key_value: Option<AsciiMetadataValue> =
            match key {
                Some(key) => Some(key.expose().parse().map_err(|_| {
                    Status::invalid_argument("idempotency key is not valid metadata")
                })?),
                None => None,
            };
        let mut sent_attempts = 0u32;
        loop {
            let remaining = deadline.map(|d| d.saturating_sub(started.elapsed()));
            let mut request = Request::new(message.clone());
            if let Some(value) = &key_value {
                request
                    .metadata_mut()
                    .insert(IDEMPOTENCY_KEY_HEADER, value.clone());
            }
            if sent_attempts > 0 {
                request.metadata_mut().insert(
                    "grpc-previous-rpc-attempts",
                    MetadataValue::from(sent_attempts),
                );
                self.stats.retries.fetch_add(1, Ordering::Relaxed);
            }
            let attempt_limit = match (remaining, self.settings.attempt_timeout) {
                (Some(remaining), Some(limit)) => Some(remaining.min(limit)),
                (remaining, limit) => remaining.or(limit),
            };
            if let Some(limit) = attempt_limit {
                request.set_timeout(limit);
            }
            sent_attempts += 1;
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let attempt_started = Instant::now();
            let status = match call(request).await {
                Ok(response) => {
                    self.budget.record_success();
                    if response.metadata().get(REPLAYED_METADATA_KEY).is_some() {
                        self.stats.replays.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(response);
                }
                Err(status) => status,
            };
            let code = observed_code(&status, attempt_started.elapsed(), attempt_limit);
            if retryable.contains(code) {
                self.budget.record_failure();
            }
            let pushback = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .map(|v| parse_pushback(v.to_str().unwrap_or("")));
            let next_backoff = {
                let mut random = self.random.lock().unwrap_or_else(|p| p.into_inner());
                backoff.delay_with_pushback(sent_attempts, pushback, &mut *random)
            };
            let Some(next_backoff) = next_backoff else {
                tracing::info!(code = ?status.code(), "server pushback says do not retry");
                return Err(status);
            };
            let facts = AttemptFacts {
                owner: self.settings.owner,
                class,
                evidence: Evidence::Sent,
                code,
                retryable,
                has_key: key.is_some(),
                ledger: self.settings.server_ledger,
                sent_attempts,
                max_attempts: self.settings.policy.max_attempts(),
                remaining_deadline: deadline.map(|d| d.saturating_sub(started.elapsed())),
                next_backoff,
                budget_allows: self.budget.allows_retry(),
            };
            let verdict = GrpcRetryEligibility::decide(&facts);
            tracing::info!(
                attempt = sent_attempts,
                code = ?code,
                class = ?class,
                %verdict,
                "retry decision"
            );
            match verdict {
                Verdict::Retry => tokio::time::sleep(next_backoff).await,
                Verdict::Refuse(reason) => {
                    self.stats.refused(reason);
                    return Err(status);
                }
                Verdict::ResolveCompletionFirst => {
                    self.stats.resolved_first.fetch_add(1, Ordering::Relaxed);
                    match self.resolve(&mut resolve, started, deadline).await? {
                        Some(response) => return Ok(response),
                        None if self.budget.allows_retry() => {
                            tracing::info!(
                                "operation never committed; resending with the same key"
                            );
                            tokio::time::sleep(next_backoff).await;
                        }
                        None => {
                            self.stats.refused(RefusalReason::BudgetExhausted);
                            return Err(status);
                        }
                    }
                }
            }
        }
    }

    /// Asks what became of the operation; `Some` is the final answer, `None` means resend.
    async fn resolve<R, S, SF>(
        &self,
        resolve: &mut S,
        started: Instant,
        deadline: Option<Duration>,
    ) -> Result<Option<Response<R>>, Status>
    where
        S: FnMut() -> SF,
        SF: Future<Output = Result<Resolution<R>, Status>>,
    {
        for round in 0..self.settings.max_resolutions.max(1) {
            let answer = match resolve().await {
                Ok(answer) => answer,
                // The lookup itself failed on the way (the server restarting, say): the outcome
                // is still unknown, so ask again rather than give up or resend.
                Err(status)
                    if matches!(
                        status.code(),
                        Code::Unavailable | Code::DeadlineExceeded | Code::Aborted
                    ) =>
                {
                    let wait = Duration::from_millis(50 * (u64::from(round) + 1));
                    let left = deadline.map(|d| d.saturating_sub(started.elapsed()));
                    if left.is_some_and(|left| left < wait) {
                        return Err(status);
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
                    let left = deadline.map(|d| d.saturating_sub(started.elapsed()));
                    if left.is_some_and(|left| left < wait) {
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
