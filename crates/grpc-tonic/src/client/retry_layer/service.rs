//! The tower service a [`RetryLayer`](super::RetryLayer) puts around a channel: per call, the
//! method's plan, the deadline, the kept body, and the hand-over to the retry or hedging loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use grpc_core_api::{GrpcMethod, REPLAYED_METADATA_KEY};
use grpc_policy::{
    GrpcRetryBudget, GrpcRetryOwner, MethodClass, RetryPlan, RetryPolicy, SplitMix64,
};
use http::HeaderValue;
use http_body::Body as HttpBody;
use tonic::body::Body;
use tonic::metadata::AsciiMetadataKey;
use tower_service::Service;

use super::attempt::{
    AttemptEnd, Attempts, BoxError, GRPC_TIMEOUT, PREVIOUS_ATTEMPTS, grpc_timeout,
    parse_grpc_timeout, send,
};
use super::measured::{Measured, call_ended, call_measured};
use super::replay::RequestReplay;
use crate::client::attempts::{CallContext, call_deadline};
use crate::client::stats::ExecutorStats;
use crate::metrics::{CallCounts, CallLabels, ClientMetrics};

/// How close to the caller's `grpc-timeout` a first attempt's limit must be for the caller's
/// header to be sent as it is.
const CALLERS_OWN: Duration = Duration::from_millis(1);

/// The service a [`RetryLayer`](super::RetryLayer) wraps around a channel.
#[derive(Debug, Clone)]
pub struct RetryService<S> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared>,
}

/// What every call through one layer shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) plan: RetryPlan,
    pub(super) budget: Option<Arc<GrpcRetryBudget>>,
    pub(super) buffer_limit: usize,
    pub(super) random: Mutex<SplitMix64>,
    pub(super) stats: Arc<ExecutorStats>,
    pub(super) target: String,
    pub(super) metrics: Option<ClientMetrics>,
    pub(super) key_header: AsciiMetadataKey,
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
pub(super) struct Call {
    pub(super) method: GrpcMethod,
    /// The `grpc-timeout` the caller sent, if any.
    pub(super) callers_timeout: Option<Duration>,
    pub(super) class: MethodClass,
    pub(super) has_key: bool,
    pub(super) deadline: Option<Instant>,
    pub(super) head: http::request::Parts,
    pub(super) replay: RequestReplay,
}

impl Call {
    /// The request of one attempt: the call's head, `previous` attempts, the time `limit` the
    /// server is told, and the body from its first byte.
    pub(super) fn attempt(&self, previous: u32, limit: Option<Duration>) -> http::Request<Body> {
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

    pub(super) fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

impl Shared {
    /// One call, its attempts and itself measured when the layer has a meter (A66).
    async fn run(
        &self,
        channel: impl Attempts,
        request: http::Request<Body>,
    ) -> Result<http::Response<Body>, BoxError> {
        let method = GrpcMethod::parse(request.uri().path()).ok();
        let (Some(metrics), Some(method)) = (&self.metrics, &method) else {
            return self.run_call(channel, request, method, None).await;
        };
        let labels = metrics.labels(method, &self.target);
        // Dropped with this future if the caller abandons the call: CANCELLED.
        let ended = call_ended(metrics, labels.clone());
        let measured = Measured {
            inner: channel,
            metrics: metrics.clone(),
            labels: labels.clone(),
        };
        let answer = self
            .run_call(measured, request, Some(method.clone()), Some(&labels))
            .await;
        call_measured(answer, ended)
    }

    /// One call: its method's entry, its deadline and key, then the loop its policy asks for.
    async fn run_call(
        &self,
        mut channel: impl Attempts,
        request: http::Request<Body>,
        method: Option<GrpcMethod>,
        labels: Option<&CallLabels>,
    ) -> Result<http::Response<Body>, BoxError> {
        let entry =
            method.and_then(|method| Some((self.plan.config().entry_for(&method)?.1, method)));
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
        let class = self.plan.method(&method).class;
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
        if let (Some(metrics), Some(labels)) = (&self.metrics, labels) {
            metrics.record(labels, counts);
        }
        if let Ok(response) = &answer
            && response.headers().contains_key(REPLAYED_METADATA_KEY)
        {
            self.stats.replays.fetch_add(1, Ordering::Relaxed);
        }
        answer
    }

    pub(super) fn context<'a>(&'a self, call: &Call, policy: &'a RetryPolicy) -> CallContext<'a> {
        CallContext {
            owner: GrpcRetryOwner::Channel,
            class: call.class,
            has_key: call.has_key,
            ledger: self.plan.server_ledger(),
            policy,
            budget: self.budget.as_deref(),
            random: &self.random,
            stats: &self.stats,
        }
    }
}
