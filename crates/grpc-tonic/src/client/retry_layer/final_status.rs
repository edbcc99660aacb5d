//! A response's final status, seen once: in its head (trailers-only, or an HTTP error), else in
//! its trailers or the error its body fails with, or not at all if the caller drops it first.
//! The budget (A6 throttling counts a call's end, not its head) and A66's durations both wait
//! for it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use tonic::body::Body;
use tonic::{Code, Status};

/// How a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// With this status (a body that ended without trailers: UNKNOWN, as tonic reports it).
    Status(Code),
    /// Dropped by its caller before its status arrived.
    Dropped,
}

/// Calls its function once, with how the response ended; with [`Ending::Dropped`] if dropped
/// before.
pub(super) struct OnEnding(Option<Box<dyn FnOnce(Ending) + Send>>);

impl OnEnding {
    pub(super) fn new(ended: impl FnOnce(Ending) + Send + 'static) -> Self {
        Self(Some(Box::new(ended)))
    }

    pub(super) fn end(&mut self, code: Code) {
        self.finish(Ending::Status(code));
    }

    fn finish(&mut self, ending: Ending) {
        if let Some(ended) = self.0.take() {
            ended(ending);
        }
    }
}

impl Drop for OnEnding {
    fn drop(&mut self) {
        self.finish(Ending::Dropped);
    }
}

/// `response`, `ended` told its final status: at once when its head carries one (trailers-only)
/// or is an HTTP error (the status gRPC maps it to), else when its trailers arrive or its body
/// fails.
pub(super) fn on_final_status(
    response: http::Response<Body>,
    mut ended: OnEnding,
) -> http::Response<Body> {
    if let Some(status) = Status::from_header_map(response.headers()) {
        ended.end(status.code());
        return response;
    }
    if response.status() != http::StatusCode::OK {
        ended.end(http_error_code(response.status()));
        return response;
    }
    response.map(|inner| Body::new(StatusWatched { inner, ended }))
}

/// A response body that reports the final status it carries.
struct StatusWatched {
    inner: Body,
    ended: OnEnding,
}

impl HttpBody for StatusWatched {
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

/// The gRPC code of an HTTP error without a gRPC status, as gRPC's HTTP-to-gRPC status mapping
/// (doc/http-grpc-status-mapping.md in grpc/grpc) gives it.
pub(super) fn http_error_code(status: http::StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}
