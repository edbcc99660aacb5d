//! The channel as the retry owner: gRFC A6 retries and hedging as a `tower` layer under a
//! generated tonic client, driven by a validated service config (ADR 0011).

mod attempt;
mod replay;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grpc_core_api::{GrpcMethod, LedgerDurability, REPLAYED_METADATA_KEY};
use grpc_policy::{
    Evidence, Finding, GrpcRetryBudget, GrpcRetryOwner, GrpcRetryOwnershipValidator, HedgingPolicy,
    LedgerKnowledge, MethodCatalog, MethodClass, Pushback, RefusalReason, RetryPolicy,
    ServiceConfig, Severity, SplitMix64,
};
use http::HeaderValue;
use http_body::Body as HttpBody;
use tokio::task::JoinSet;
use tonic::body::Body;
use tower_service::Service;

use self::attempt::{
    AttemptEnd, BoxError, FinalStatusBody, GRPC_TIMEOUT, PREVIOUS_ATTEMPTS, deadline_passed,
    grpc_timeout, parse_grpc_timeout, send,
};
use self::replay::RequestReplay;
use crate::client::attempts::{CallContext, CallRun, Next, call_deadline, jitter_source};
use crate::client::stats::ExecutorStats;
use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};
use crate::metrics::{CallCounts, ClientMetrics};
use tonic::metadata::AsciiMetadataKey;

/// How much of one call's request body is kept to send again, unless set otherwise: 256 KiB, as
/// gRPC C-core's per-call retry buffer. A call whose body passes it is committed (A6).
pub const DEFAULT_PER_CALL_BUFFER: usize = 256 * 1024;

/// How close to the caller's `grpc-timeout` a first attempt's limit must be for the caller's
/// header to be sent as it is.
const CALLERS_OWN: Duration = Duration::from_millis(1);

/// Why a [`RetryLayer`] was not built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryLayerError {
    /// The ownership validator found errors in the service config for this catalog.
    #[error("the service config is unsafe for these methods: {}", first_error(.0))]
    UnsafeConfig(Vec<Finding>),
}

fn first_error(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A6 retries and hedging for every call through a channel, as a `tower` layer: a generated
/// client gets them with no change at its call sites.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// use grpc_policy::{GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog};
/// use grpc_tonic::RetryLayer;
/// use tower::ServiceBuilder;
///
/// let config = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel).parse(r#"{
///   "methodConfig": [{"name": [{"service": "pkg.Svc"}],
///     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?;
/// let catalog = MethodCatalog::new(); // from the service's descriptor set, in real use
/// let layer = RetryLayer::builder(config, catalog).build()?;
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let retrying = ServiceBuilder::new().layer(layer).service(channel);
/// // SvcClient::new(retrying): every call now retried as the config says.
/// # Ok(()) }
/// ```
///
/// For each call it finds the method's config (method, then service, then the default entry):
/// - `retryPolicy`: an attempt that failed with a status before its response head committed it
///   is judged by the policy of this crate (`grpc_policy::GrpcRetryEligibility`): the method's
///   class from the catalog, the status, the attempts, the deadline, the server's pushback and
///   the target's budget. The jittered backoff is A6's; `grpc-previous-rpc-attempts` is set.
/// - `hedgingPolicy`: up to `maxAttempts` copies, `hedgingDelay` apart (the next at once after
///   a non-fatal status); the first to commit or fail fatally is the answer, and the others are
///   cancelled. Only methods safe to repeat are hedged: reads, idempotent methods, and keyed
///   mutations that carry a key against a durable ledger.
/// - Transparent retries: an attempt that provably never reached the server application is sent
///   again without a token and without counting toward `maxAttempts`.
/// - The call's deadline is the earlier of the caller's `grpc-timeout` and the config's
///   `timeout`; each attempt tells the server what is left of it.
///
/// A6's commit point: once a response head without a status arrives (the server application
/// answered), the call is committed and the response is the caller's, whatever follows; the
/// budget counts the call's final status from its trailers. A request body over the per-call
/// buffer ([`DEFAULT_PER_CALL_BUFFER`]) commits the call too.
///
/// A keyed mutation's every attempt carries the caller's key: when the policy says "resolve
/// the completion first", the layer sends the call again under the same key, which a server
/// with a durable ledger answers as a lookup (the recorded outcome, or ABORTED while it is in
/// flight). Without a durable ledger such a call is not retried once sent.
#[derive(Debug, Clone)]
pub struct RetryLayer {
    shared: Arc<Shared>,
}

/// Builds a [`RetryLayer`].
#[derive(Debug)]
pub struct RetryLayerBuilder {
    config: ServiceConfig,
    catalog: MethodCatalog,
    server_ledger: LedgerDurability,
    budget: Option<Arc<GrpcRetryBudget>>,
    buffer_limit: usize,
    stats: Arc<ExecutorStats>,
    target: String,
    metrics: Option<ClientMetrics>,
    key_header: AsciiMetadataKey,
}

impl RetryLayer {
    /// Starts a layer configured by `config`, for the methods of `catalog` (a method the
    /// catalog lacks is non-idempotent: never retried once sent). The layer makes the channel
    /// the retry owner ([`GrpcRetryOwner::Channel`]): a channel whose retries another owner has
    /// (the application's executor, a mesh) gets no RetryLayer at all, so there is no owner to
    /// pass.
    pub fn builder(config: ServiceConfig, catalog: MethodCatalog) -> RetryLayerBuilder {
        RetryLayerBuilder {
            config,
            catalog,
            server_ledger: LedgerDurability::Volatile,
            key_header: AsciiMetadataKey::from_static(IDEMPOTENCY_KEY_HEADER),
            budget: None,
            buffer_limit: DEFAULT_PER_CALL_BUFFER,
            stats: Arc::new(ExecutorStats::default()),
            target: "unknown".to_owned(),
            metrics: None,
        }
    }

    /// What the layer has done, over every call.
    pub fn stats(&self) -> &Arc<ExecutorStats> {
        &self.shared.stats
    }
}

impl RetryLayerBuilder {
    /// The request metadata that carries the key ([`IDEMPOTENCY_KEY_HEADER`] by default); the
    /// server's guard must read the same one.
    pub fn key_header(mut self, name: &str) -> Result<Self, InvalidKeyHeader> {
        self.key_header = key_header(name)?;
        Ok(self)
    }

    /// The server's ledger durability, as the service documents it. Until said, it is taken as
    /// volatile: keyed mutations are not retried once sent.
    pub fn server_ledger(mut self, durability: LedgerDurability) -> Self {
        self.server_ledger = durability;
        self
    }

    /// Shares a retry budget with other channels to the same target; by default the layer has
    /// its own, from the config's `retryThrottling` (none without one: A6 then throttles
    /// nothing).
    pub fn budget(mut self, budget: Arc<GrpcRetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// How many bytes of one call's request body are kept to send again.
    pub fn per_call_buffer(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// Shares counters with executors or other layers.
    pub fn stats(mut self, stats: Arc<ExecutorStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Names the channel's target (A66's `grpc.target`: the target URI the channel was created
    /// with) in logs and metrics.
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self
    }

    /// Records gRFC A96's per-call retry metrics (`grpc.client.call.retries`,
    /// `grpc.client.call.transparent_retries`, `grpc.client.call.hedges`,
    /// `grpc.client.call.retry_delay`, labelled `grpc.method` and `grpc.target`) with `meter`.
    #[cfg(feature = "opentelemetry")]
    pub fn meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.metrics = Some(ClientMetrics::new(meter));
        self
    }

    /// The layer, or why it must not be: a config the ownership validator finds errors in for
    /// these methods and this ledger.
    pub fn build(self) -> Result<RetryLayer, RetryLayerError> {
        let errors: Vec<Finding> = GrpcRetryOwnershipValidator::new(GrpcRetryOwner::Channel)
            .with_ledger(LedgerKnowledge::from(self.server_ledger))
            .validate(&self.config, &self.catalog)
            .into_iter()
            .filter(|finding| finding.severity == Severity::Error)
            .collect();
        if !errors.is_empty() {
            return Err(RetryLayerError::UnsafeConfig(errors));
        }
        let budget = self.budget.or_else(|| {
            self.config
                .retry_throttling
                .as_ref()
                .map(|throttling| Arc::new(GrpcRetryBudget::new(throttling)))
        });
        Ok(RetryLayer {
            shared: Arc::new(Shared {
                config: self.config,
                catalog: self.catalog,
                server_ledger: self.server_ledger,
                budget,
                buffer_limit: self.buffer_limit,
                random: Mutex::new(jitter_source()),
                stats: self.stats,
                target: self.target,
                metrics: self.metrics,
                key_header: self.key_header,
            }),
        })
    }
}

impl<S> tower_layer::Layer<S> for RetryLayer {
    type Service = RetryService<S>;

    fn layer(&self, inner: S) -> RetryService<S> {
        RetryService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service a [`RetryLayer`] wraps around a channel.
#[derive(Debug, Clone)]
pub struct RetryService<S> {
    inner: S,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: ServiceConfig,
    catalog: MethodCatalog,
    server_ledger: LedgerDurability,
    budget: Option<Arc<GrpcRetryBudget>>,
    buffer_limit: usize,
    random: Mutex<SplitMix64>,
    stats: Arc<ExecutorStats>,
    target: String,
    metrics: Option<ClientMetrics>,
    key_header: AsciiMetadataKey,
}

impl<S, B> Service<http::Request<Body>> for RetryService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The service `poll_ready` readied goes to this call (tower's idiom: a clone is not
        // ready); `self` keeps a fresh clone for the next.
        let ready = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, ready);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { shared.run(ChannelFor::new(ready), request).await })
    }
}

/// The channel for each attempt of one call: the readied one for the first, clones (readied
/// when sent) for the others.
struct ChannelFor<S> {
    ready: Option<S>,
    template: S,
}

impl<S: Clone> ChannelFor<S> {
    fn new(ready: S) -> Self {
        Self {
            template: ready.clone(),
            ready: Some(ready),
        }
    }
}

/// Sends one call's attempts: what the retry loop needs of the channel, whatever its type.
trait Attempts: Send {
    /// Sends `request` as the next attempt; its end, read at the response head within `limit`.
    fn send(
        &mut self,
        request: http::Request<Body>,
        limit: Option<Duration>,
    ) -> Pin<Box<dyn Future<Output = AttemptEnd> + Send + 'static>>;
}

impl<S, B> Attempts for ChannelFor<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn send(
        &mut self,
        request: http::Request<Body>,
        limit: Option<Duration>,
    ) -> Pin<Box<dyn Future<Output = AttemptEnd> + Send + 'static>> {
        let channel = self.ready.take().unwrap_or_else(|| self.template.clone());
        Box::pin(send(channel, request, limit))
    }
}

/// The parts of a call every attempt shares.
struct Call {
    method: GrpcMethod,
    /// The `grpc-timeout` the caller sent, if any.
    callers_timeout: Option<Duration>,
    class: MethodClass,
    has_key: bool,
    deadline: Option<Instant>,
    head: http::request::Parts,
    replay: RequestReplay,
}

impl Call {
    /// The request of one attempt: the call's head, `previous` attempts, the time `limit` the
    /// server is told, and the body from its first byte.
    fn attempt(&self, previous: u32, limit: Option<Duration>) -> http::Request<Body> {
        let mut head = self.head.clone();
        if previous > 0 {
            head.headers
                .insert(PREVIOUS_ATTEMPTS, HeaderValue::from(previous));
        }
        // A first attempt bound by the caller's own deadline keeps the caller's header: the
        // microseconds since it was written are not worth a value HPACK cannot index.
        let callers_own = previous == 0
            && self
                .callers_timeout
                .zip(limit)
                .is_some_and(|(callers, limit)| callers.saturating_sub(limit) < CALLERS_OWN);
        if let Some(limit) = limit.filter(|_| !callers_own) {
            head.headers.insert(GRPC_TIMEOUT, grpc_timeout(limit));
        }
        http::Request::from_parts(head, self.replay.attempt_body())
    }

    fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

impl Shared {
    async fn run(
        &self,
        mut channel: impl Attempts,
        request: http::Request<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        let entry = GrpcMethod::parse(request.uri().path())
            .ok()
            .and_then(|method| Some((self.config.entry_for(&method)?.1, method)));
        let Some((entry, method)) = entry else {
            // No config for the method (or not a gRPC path): the channel as it is.
            return match channel.send(request, None).await {
                AttemptEnd::Transport { error, .. } => Err(error),
                end => end.into_answer(),
            };
        };
        let callers = request
            .headers()
            .get(GRPC_TIMEOUT)
            .and_then(parse_grpc_timeout);
        let deadline = call_deadline(callers, entry.timeout);
        let class = self
            .catalog
            .get(&method)
            .map_or(MethodClass::NonIdempotent, |info| info.class);
        let has_key = request.headers().contains_key(self.key_header.as_str());
        let (head, body) = request.into_parts();
        let call = Call {
            method,
            callers_timeout: callers,
            class,
            has_key,
            deadline,
            head,
            replay: RequestReplay::new(body, self.buffer_limit),
        };
        let (answer, counts) = match (&entry.retry_policy, &entry.hedging_policy) {
            (Some(policy), _) => self.retry(channel, &call, policy).await,
            (None, Some(hedging)) => self.hedge(channel, &call, hedging).await,
            (None, None) => {
                self.stats.attempts.fetch_add(1, Ordering::Relaxed);
                let request = call.attempt(0, call.remaining());
                let end = channel.send(request, call.remaining()).await;
                (end.into_answer(), CallCounts::default())
            }
        };
        tracing::debug!(
            grpc.method = %call.method,
            grpc.target = %self.target,
            retries = counts.retries,
            transparent_retries = counts.transparent_retries,
            hedges = counts.hedges,
            retry_delay = ?counts.retry_delay,
            "call ended"
        );
        if let Some(metrics) = &self.metrics {
            metrics.record(&call.method, &self.target, counts);
        }
        if let Ok(response) = &answer
            && response.headers().contains_key(REPLAYED_METADATA_KEY)
        {
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    /// The call under a `retryPolicy`: one attempt at a time.
    async fn retry(
        &self,
        mut channel: impl Attempts,
        call: &Call,
        policy: &RetryPolicy,
    ) -> (Result<http::Response<Body>, BoxError>, CallCounts) {
        let mut run = CallRun::new(self.context(call, policy), call.deadline);
        loop {
            let limit = run.attempt_limit(policy.per_attempt_recv_timeout());
            run.attempt_starts();
            let end = channel
                .send(call.attempt(run.previous_attempts(), limit), limit)
                .await;
            if let AttemptEnd::Answered(response) = end {
                let response = FinalStatusBody::wrap(
                    response,
                    self.budget.as_ref(),
                    policy.retryable_status_codes(),
                );
                return (Ok(response), run.counts());
            }
            let code = end.code();
            let (failure, pushback) = match &end {
                AttemptEnd::Failed { pushback, .. } => (None, *pushback),
                AttemptEnd::Transport { failure, .. } => (Some(*failure), None),
                AttemptEnd::Answered(_) | AttemptEnd::TimedOut => (None, None),
            };
            let replayable = call.replay.replayable();
            if let Some(failure) = failure
                && replayable
                && run.resend_transparently(failure, code).await
            {
                continue;
            }
            if !replayable {
                tracing::info!(
                    method = %call.method,
                    "retry decision: refuse: the request body passed the per-call buffer, the call is committed"
                );
                self.stats.refused(RefusalReason::PrefixDelivered);
                return (end.into_answer(), run.counts());
            }
            match run.judge(code, pushback, Evidence::Sent) {
                Next::Retry(backoff) => run.pause(backoff).await,
                Next::Stop => return (end.into_answer(), run.counts()),
                Next::ResolveFirst(backoff) => {
                    if !run.may_resend() {
                        return (end.into_answer(), run.counts());
                    }
                    // The layer has no lookup of its own: a resend under the same key is one,
                    // answered from the server's durable ledger (ADR 0011).
                    tracing::info!(
                        method = %call.method,
                        "outcome unknown: resending under the same key, which the server's ledger answers as a lookup"
                    );
                    run.pause(backoff).await;
                }
            }
            if run.deadline_passed() {
                return (Ok(deadline_passed().into_http()), run.counts());
            }
        }
    }

    /// The call under a `hedgingPolicy`: copies `hedgingDelay` apart, the first to commit wins.
    async fn hedge(
        &self,
        mut channel: impl Attempts,
        call: &Call,
        hedging: &HedgingPolicy,
    ) -> (Result<http::Response<Body>, BoxError>, CallCounts) {
        let safe = match call.class {
            MethodClass::NoSideEffects | MethodClass::Idempotent => true,
            MethodClass::KeyedMutation => {
                call.has_key && self.server_ledger == LedgerDurability::Durable
            }
            MethodClass::NonIdempotent => false,
        };
        let max_attempts = if safe { hedging.max_attempts() } else { 1 };
        if !safe {
            tracing::info!(method = %call.method, class = ?call.class, "hedging decision: refuse: the method is not safe to send twice; one attempt");
        }
        // A6: without `hedgingDelay` every copy goes at once.
        let delay = hedging.hedging_delay().unwrap_or(Duration::ZERO);
        let non_fatal = hedging.non_fatal_status_codes();
        let budget_allows = || self.budget.as_ref().is_none_or(|b| b.allows_retry());
        let mut attempts = JoinSet::new();
        let (mut sent, mut next_at, mut stop_sending) = (0u32, Instant::now(), false);
        let mut last: Option<AttemptEnd> = None;
        // A96's retry delay for hedging: the time after the first copy with none in flight.
        let (mut idle_since, mut idle) = (None::<Instant>, Duration::ZERO);
        let counts = |sent: u32, idle: Duration| CallCounts {
            hedges: sent.saturating_sub(1),
            retry_delay: idle,
            ..CallCounts::default()
        };
        loop {
            if call.deadline.is_some_and(|d| Instant::now() >= d) {
                return (Ok(deadline_passed().into_http()), counts(sent, idle));
            }
            let may_send = sent < max_attempts
                && !stop_sending
                && call.replay.replayable()
                && (sent == 0 || budget_allows());
            if may_send && Instant::now() >= next_at {
                let request = call.attempt(sent, call.remaining());
                attempts.spawn(channel.send(request, call.remaining()));
                if let Some(since) = idle_since.take() {
                    idle += since.elapsed();
                }
                self.stats.attempts.fetch_add(1, Ordering::Relaxed);
                if sent > 0 {
                    self.stats.hedges.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(method = %call.method, attempt = sent + 1, "hedging decision: send another copy");
                }
                sent += 1;
                next_at = Instant::now() + delay;
                continue;
            }
            if attempts.is_empty() && !may_send {
                let answer = match last {
                    Some(end) => end.into_answer(),
                    None => Ok(deadline_passed().into_http()),
                };
                return (answer, counts(sent, idle));
            }
            if attempts.is_empty() && idle_since.is_none() && sent > 0 {
                idle_since = Some(Instant::now());
            }
            let deadline = call.deadline.map(tokio::time::Instant::from_std);
            tokio::select! {
                joined = attempts.join_next(), if !attempts.is_empty() => {
                    let end = match joined.expect("the set is not empty") {
                        Ok(end) => end,
                        Err(failed) => return (Err(failed.into()), counts(sent, idle)),
                    };
                    let code = end.code();
                    if let AttemptEnd::Answered(response) = end {
                        // Dropping the set cancels every other copy.
                        let response = FinalStatusBody::wrap(response, self.budget.as_ref(), non_fatal);
                        return (Ok(response), counts(sent, idle));
                    }
                    if !non_fatal.contains(code) {
                        tracing::info!(method = %call.method, ?code, "hedging decision: a fatal status is the answer");
                        return (end.into_answer(), counts(sent, idle));
                    }
                    if let Some(budget) = &self.budget {
                        budget.record_failure();
                    }
                    match &end {
                        AttemptEnd::Failed { pushback: Some(Pushback::DoNotRetry), .. } => stop_sending = true,
                        AttemptEnd::Failed { pushback: Some(Pushback::RetryAfter(wait)), .. } => next_at = Instant::now() + *wait,
                        // A6: after a non-fatal status the next copy goes at once.
                        _ => next_at = Instant::now(),
                    }
                    last = Some(end);
                }
                _ = tokio::time::sleep_until(next_at.into()), if may_send => {}
                _ = sleep_until_deadline(deadline) => {
                    return (Ok(deadline_passed().into_http()), counts(sent, idle));
                }
            }
        }
    }

    fn context<'a>(&'a self, call: &Call, policy: &'a RetryPolicy) -> CallContext<'a> {
        CallContext {
            owner: GrpcRetryOwner::Channel,
            class: call.class,
            has_key: call.has_key,
            ledger: self.server_ledger,
            policy,
            budget: self.budget.as_deref(),
            random: &self.random,
            stats: &self.stats,
        }
    }
}

async fn sleep_until_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
