//! What a failed attempt's server said about retrying it, read once for both retry owners.

use std::time::Duration;

use grpc_policy::Pushback;
use tonic::Status;
use tonic_types::StatusExt;

/// gRFC A6's pushback header.
const PUSHBACK: &str = "grpc-retry-pushback-ms";

/// A failed attempt's advice from its server: A6's `grpc-retry-pushback-ms` (which decides when
/// present), and a `google.rpc.RetryInfo` delay in the status's details, which is how the guard
/// (and Google's APIs) say when an operation in flight is worth asking about again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerAdvice {
    /// The pushback, if the response carried one (valid or not).
    pub(crate) pushback: Option<Pushback>,
    /// The `RetryInfo` delay, if the status's details carried one that decodes.
    pub(crate) retry_info: Option<Duration>,
}

impl ServerAdvice {
    /// The advice of a failed attempt answered with `status`, its pushback among `headers` (the
    /// trailers-only response's headers, or the status's metadata).
    pub(crate) fn of(status: &Status, headers: &http::HeaderMap) -> Self {
        Self {
            pushback: Pushback::from_values(
                headers
                    .get_all(PUSHBACK)
                    .iter()
                    .map(|value| value.to_str().unwrap_or("")),
            ),
            retry_info: status
                .get_details_retry_info()
                .and_then(|info| info.retry_delay),
        }
    }
}
