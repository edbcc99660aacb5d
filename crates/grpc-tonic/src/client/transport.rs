//! What a failed call's transport error proves about the request, read from the error's source
//! chain (tonic keeps the transport error behind the `Status` it builds).
//!
//! Only positive evidence counts. The shapes below were pinned against a raw HTTP/2 server in
//! `crates/grpc-interop-tests/tests/transport_evidence.rs`, so a tonic, hyper or h2 upgrade that
//! changes them fails there instead of silently changing what is retried.

use std::error::Error;
use std::io::ErrorKind;

use tonic::{Code, Status};

/// What the transport error of a failed attempt proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportFailure {
    /// The request never left this process: no connection could be made (`tonic::ConnectError`),
    /// or hyper dropped it unsent because its connection was closing. gRFC A6 lets such an
    /// attempt be resent transparently any number of times.
    NeverLeftClient,
    /// The request reached the server but not its application: the server refused the stream
    /// (RST_STREAM REFUSED_STREAM), or the stream was above the last one a GOAWAY let through.
    /// A6 lets such an attempt be resent transparently once.
    NotProcessed,
    /// The connection broke after the request may have been sent (hyper reports the socket's
    /// broken pipe or reset, or h2 an I/O error mid-body): the outcome is unknown. gRPC's clients
    /// report it as UNAVAILABLE.
    ConnectionLost,
    /// The server reset the stream (RST_STREAM with any reason but REFUSED_STREAM) after the
    /// request reached it, without answering: it may have run the request (a handler that
    /// committed and then failed, a proxy's timeout), so the outcome is unknown. The caller gets
    /// the status gRPC gives the reset's reason (INTERNAL for INTERNAL_ERROR, CANCELLED for
    /// CANCEL), as grpc-go and C-core report it.
    StreamReset,
    /// Anything else, including a status the server sent.
    Other,
}

impl TransportFailure {
    /// Whether the server application cannot have seen the request.
    pub fn never_processed(self) -> bool {
        matches!(self, Self::NeverLeftClient | Self::NotProcessed)
    }

    /// Whether the request may have run but no answer came back: the connection broke or the
    /// stream was reset after it was sent.
    pub fn outcome_unknown(self) -> bool {
        matches!(self, Self::ConnectionLost | Self::StreamReset)
    }
}

/// Reads what `status`'s source chain proves about the request (the executor's evidence for
/// transparent retries and for unknown outcomes; public for callers with loops of their own).
pub fn classify(status: &Status) -> TransportFailure {
    classify_chain(status.source())
}

/// Reads what an error chain, from `first` down its sources, proves about the request (the
/// [`RetryLayer`](crate::RetryLayer) sees the channel's error itself, not a `Status`).
pub(crate) fn classify_chain(first: Option<&(dyn Error + 'static)>) -> TransportFailure {
    let mut lost = false;
    let mut cause = first;
    while let Some(error) = cause {
        if error.downcast_ref::<tonic::ConnectError>().is_some() {
            return TransportFailure::NeverLeftClient;
        }
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            if h2.is_remote() && h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                return TransportFailure::NotProcessed;
            }
            // h2 fails a stream above the GOAWAY's last-stream-id with the GOAWAY itself; a
            // stream at or below it that the connection's end then cut gets an I/O error.
            if h2.is_remote() && h2.is_go_away() {
                return TransportFailure::NotProcessed;
            }
            if h2.is_remote() && h2.is_reset() {
                return TransportFailure::StreamReset;
            }
            lost |= h2.is_io();
        }
        // hyper dropped the request before it was written: the connection closed while it
        // waited in hyper's queue.
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return TransportFailure::NeverLeftClient;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            lost |= matches!(
                io.kind(),
                ErrorKind::BrokenPipe
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::UnexpectedEof
                    | ErrorKind::NotConnected
            );
        }
        cause = error.source();
    }
    if lost {
        TransportFailure::ConnectionLost
    } else {
        TransportFailure::Other
    }
}

/// The status of a stream the server reset ([`TransportFailure::StreamReset`]) as gRPC's HTTP/2
/// protocol maps the reset's reason (`doc/PROTOCOL-HTTP2.md`, "Errors"), and as grpc-go and C-core
/// report it: INTERNAL for most reasons, CANCELLED for CANCEL, RESOURCE_EXHAUSTED for
/// ENHANCE_YOUR_CALM, PERMISSION_DENIED for INADEQUATE_SECURITY. tonic's own conversion depends
/// on its features (UNKNOWN without them), so it is not used. `None` when the chain holds no
/// remote reset.
pub(crate) fn reset_status(first: Option<&(dyn Error + 'static)>) -> Option<Status> {
    let mut cause = first;
    while let Some(error) = cause {
        if let Some(h2) = error.downcast_ref::<h2::Error>()
            && h2.is_remote()
            && h2.is_reset()
        {
            let reason = h2.reason().unwrap_or(h2::Reason::INTERNAL_ERROR);
            let code = match reason {
                h2::Reason::REFUSED_STREAM => Code::Unavailable,
                h2::Reason::CANCEL => Code::Cancelled,
                h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
                h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
                _ => Code::Internal,
            };
            return Some(Status::new(
                code,
                format!("the server reset the stream ({reason:?}) before answering"),
            ));
        }
        cause = error.source();
    }
    None
}
