//! A6's commit point, seen from the channel: an attempt whose response headers arrived (a
//! response that is not trailers-only) is committed, and is never retried.
//!
//! The executor's calls go through a generated client, which turns every failure into a bare
//! `Status`: a failure in a trailers-only response (the server refused the call before its
//! application answered) and one in the trailers after headers (the application had begun its
//! response) look the same there. [`CommitObserver`], wrapped around the channel, sees the
//! response head and marks the attempt the executor tagged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

/// The executor's tag on one attempt's request: set once the attempt's response headers arrived.
#[derive(Debug, Clone, Default)]
pub(crate) struct AttemptProgress(Arc<AtomicBool>);

impl AttemptProgress {
    /// Whether the attempt is committed (its response headers arrived).
    pub(crate) fn committed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn commit(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Wraps a channel (any HTTP service a generated tonic client can call) so that the
/// [`RetryExecutor`](crate::RetryExecutor) sees A6's commit point: an attempt that failed after
/// its response headers arrived is not retried. Without it, the executor cannot tell such a
/// failure from one in a trailers-only response and treats both as a plain failed attempt.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let observed = grpc_tonic::CommitObserver::new(channel);
/// // PaymentsClient::new(observed), and its calls through RetryExecutor::call.
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CommitObserver<S> {
    inner: S,
}

impl<S> CommitObserver<S> {
    /// `inner`, observed.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

/// The [`CommitObserver`] as a `tower` layer, for a `ServiceBuilder` stack.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitObserverLayer;

impl<S> tower_layer::Layer<S> for CommitObserverLayer {
    type Service = CommitObserver<S>;

    fn layer(&self, inner: S) -> CommitObserver<S> {
        CommitObserver::new(inner)
    }
}

/// Whether a response head commits the call: a gRPC response (HTTP 200) that carries no status
/// in its headers. A trailers-only response (status in the headers) or an HTTP error commits
/// nothing.
fn commits<B>(response: &http::Response<B>) -> bool {
    response.status() == http::StatusCode::OK && !response.headers().contains_key("grpc-status")
}

impl<S, RequestBody, ResponseBody> tower_service::Service<http::Request<RequestBody>>
    for CommitObserver<S>
where
    S: tower_service::Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    ResponseBody: Send + 'static,
{
    type Response = http::Response<ResponseBody>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<http::Response<ResponseBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let progress = request.extensions().get::<AttemptProgress>().cloned();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(progress) = progress.filter(|_| commits(&response)) {
                progress.commit();
            }
            Ok(response)
        })
    }
}
