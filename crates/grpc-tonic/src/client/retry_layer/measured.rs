//! gRFC A66's per-attempt and per-call instruments: every attempt the layer starts (transparent
//! retries and hedges included) is counted, and its duration recorded with the status it ended
//! with; the call's duration, with the status its caller sees. An answered attempt, like the call
//! it answers, ends when its trailers arrive, not at its head; one dropped unfinished (a hedged
//! copy that lost, a call its caller abandoned) ends CANCELLED.
//!
//! Only built when the layer has a meter: without one the channel is used as it is, and nothing
//! here runs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::{Code, Status};

use super::attempt::{AttemptEnd, BoxError, http_error_code};
use super::service::Attempts;
use crate::metrics::{CallLabels, ClientMetrics};

/// A call's attempts, measured as A66 says.
pub(super) struct Measured<A> {
    pub(super) inner: A,
    pub(super) metrics: ClientMetrics,
    pub(super) labels: CallLabels,
}

impl<A: Attempts> Attempts for Measured<A> {
    fn send(
        &mut self,
        request: http::Request<Body>,
        limit: Option<Duration>,
    ) -> Pin<Box<dyn Future<Output = AttemptEnd> + Send + 'static>> {
        self.metrics.attempt_started(&self.labels);
        let started = Instant::now();
        let attempt = self.inner.send(request, limit);
        let (metrics, labels) = (self.metrics.clone(), self.labels.clone());
        // An attempt dropped unfinished (a hedge that lost, a call its caller abandoned) ends
        // CANCELLED.
        let mut ended = EndOnce::new(move |code| {
            metrics.attempt_ended(&labels, code, started.elapsed());
        });
        Box::pin(async move {
            match attempt.await {
                AttemptEnd::Answered(response) => AttemptEnd::Answered(when_ended(response, ended)),
                end => {
                    ended.end(end.code());
                    end
                }
            }
        })
    }
}

/// The call's end, recorded with the status its caller gets once that status is known (and as
/// CANCELLED if the call is dropped before).
pub(super) fn call_ended(metrics: &ClientMetrics, labels: CallLabels) -> EndOnce {
    let (metrics, started) = (metrics.clone(), Instant::now());
    EndOnce::new(move |code| metrics.call_ended(&labels, code, started.elapsed()))
}

/// `answer`, its call's end recorded by `ended`.
pub(super) fn call_measured(
    answer: Result<http::Response<Body>, BoxError>,
    mut ended: EndOnce,
) -> Result<http::Response<Body>, BoxError> {
    match answer {
        Ok(response) => Ok(when_ended(response, ended)),
        // A channel error tonic reports as it can; nothing proven, so UNKNOWN (as
        // `AttemptEnd::code` says of it).
        Err(error) => {
            ended.end(Code::Unknown);
            Err(error)
        }
    }
}

/// Calls its function once, with the final status; with CANCELLED if dropped before.
pub(super) struct EndOnce(Option<Box<dyn FnOnce(Code) + Send>>);

impl EndOnce {
    fn new(ended: impl FnOnce(Code) + Send + 'static) -> Self {
        Self(Some(Box::new(ended)))
    }

    fn end(&mut self, code: Code) {
        if let Some(ended) = self.0.take() {
            ended(code);
        }
    }
}

impl Drop for EndOnce {
    fn drop(&mut self) {
        self.end(Code::Cancelled);
    }
}

/// `response`, `ended` called with its final status: at once when its head carries one
/// (trailers-only) or is an HTTP error (the status gRPC maps it to), else when its trailers
/// arrive or its body fails; CANCELLED if the caller drops it before either.
fn when_ended(response: http::Response<Body>, mut ended: EndOnce) -> http::Response<Body> {
    if let Some(status) = Status::from_header_map(response.headers()) {
        ended.end(status.code());
        return response;
    }
    if response.status() != http::StatusCode::OK {
        ended.end(http_error_code(response.status()));
        return response;
    }
    response.map(|inner| Body::new(EndObserved { inner, ended }))
}

/// A response body that reports the final status it carries.
struct EndObserved {
    inner: Body,
    ended: EndOnce,
}

impl HttpBody for EndObserved {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code =
                        Status::from_header_map(trailers).map_or(Code::Unknown, |s| s.code());
                    this.ended.end(code);
                }
            }
            Poll::Ready(Some(Err(status))) => this.ended.end(status.code()),
            // The body ended without trailers: no status, which tonic reports as UNKNOWN.
            Poll::Ready(None) => this.ended.end(Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
