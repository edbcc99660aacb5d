//! What a failed call's transport error proves about the request, read from the error's source
//! chain (tonic keeps the transport error behind the `Status` it builds).
//!
//! Only positive evidence counts. The shapes below were pinned against a raw HTTP/2 server in
//! `crates/grpc-interop-tests/tests/transport_evidence.rs`, so a tonic, hyper or h2 upgrade that
//! changes them fails there instead of silently changing what is retried.

use std::error::Error;
use std::io::ErrorKind;

use tonic::Status;

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
    /// Anything else, including a status the server sent.
    Other,
}

impl TransportFailure {
    /// Whether the server application cannot have seen the request.
    pub fn never_processed(self) -> bool {
        matches!(self, Self::NeverLeftClient | Self::NotProcessed)
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
