//! One attempt on the channel, read at its response head: the head is where A6 commits a call.

use std::error::Error;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use grpc_core_api::says_outcome_unknown;
use grpc_policy::{CodeSet, Evidence, GrpcRetryBudget};
use http::HeaderValue;
use http_body::Body as HttpBody;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;

use super::final_status::{Ending, OnEnding, http_error_code, on_final_status};
use crate::client::advice::ServerAdvice;
use crate::client::transport::{TransportFailure, classify_chain, reset_status};

/// The boxed error a channel fails with.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

pub(super) const GRPC_TIMEOUT: &str = "grpc-timeout";
pub(super) const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// Sends one call's attempts: what the retry loop needs of the channel, whatever its type.
pub(super) trait Attempts: Send {
    /// Sends `request` as the next attempt; its end, read at the response head within `limit`.
    fn send(
        &mut self,
        request: http::Request<Body>,
        limit: Option<Duration>,
    ) -> Pin<Box<dyn Future<Output = AttemptEnd> + Send + 'static>>;
}

/// How one attempt ended, as far as the retry decision needs.
pub(super) enum AttemptEnd {
    /// The response head arrived without a status (A6's commit point), or with status OK: the
    /// call's answer, whatever follows.
    Answered(http::Response<Body>),
    /// A status arrived before any message: in a trailers-only response, or as an HTTP error.
    Failed {
        status: Status,
        advice: ServerAdvice,
        response: http::Response<Body>,
    },
    /// The channel failed before a response head, with what that proves about the request.
    Transport {
        error: BoxError,
        failure: TransportFailure,
    },
    /// The attempt's time ran out before its response head.
    TimedOut,
}

impl AttemptEnd {
    /// The status the retry decision reads: a transport failure that proves something is
    /// UNAVAILABLE, as grpc-go and gRPC C-core report it (tonic would say UNKNOWN).
    pub(super) fn code(&self) -> Code {
        match self {
            Self::Answered(_) => Code::Ok,
            Self::Failed { status, .. } => status.code(),
            Self::Transport {
                failure: TransportFailure::Other,
                ..
            } => Code::Unknown,
            Self::Transport {
                error,
                failure: TransportFailure::StreamReset,
            } => reset_status(Some(&**error)).map_or(Code::Internal, |status| status.code()),
            Self::Transport { .. } => Code::Unavailable,
            Self::TimedOut => Code::DeadlineExceeded,
        }
    }

    /// What the attempt's end says of its request: nothing came back from the server's
    /// application (the connection broke, the stream was reset, its time ran out, or the server
    /// itself answered that its commit got no verdict: `OUTCOME_UNKNOWN`), or it was answered
    /// with a status.
    pub(super) fn evidence(&self) -> Evidence {
        match self {
            Self::Transport { failure, .. } if failure.outcome_unknown() => Evidence::SentNoAnswer,
            Self::Failed { status, .. } if says_outcome_unknown(status) => Evidence::SentNoAnswer,
            Self::TimedOut => Evidence::SentNoAnswer,
            _ => Evidence::Sent,
        }
    }

    /// The end as the caller receives it when no attempt follows.
    pub(super) fn into_answer(self) -> Result<http::Response<Body>, BoxError> {
        match self {
            Self::Answered(response) | Self::Failed { response, .. } => Ok(response),
            // Nothing proven: the channel's own error, as tonic would have reported it.
            Self::Transport {
                error,
                failure: TransportFailure::Other,
            } => Err(error),
            // The status gRPC gives the reset's reason, whatever tonic's features would say.
            Self::Transport {
                error,
                failure: TransportFailure::StreamReset,
            } => Ok(reset_status(Some(&*error))
                .unwrap_or_else(|| Status::internal(format!("stream reset: {error}")))
                .into_http()),
            Self::Transport { error, .. } => {
                Ok(Status::unavailable(format!("transport failure: {error}")).into_http())
            }
            Self::TimedOut => Ok(deadline_passed().into_http()),
        }
    }
}

/// The status of a call whose deadline passed.
pub(super) fn deadline_passed() -> Status {
    Status::deadline_exceeded("the call's deadline passed")
}

/// Sends `request` on `service` and waits for its response head, for at most `limit`.
pub(super) async fn send<S, B>(
    mut service: S,
    request: http::Request<Body>,
    limit: Option<Duration>,
) -> AttemptEnd
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let started = std::time::Instant::now();
    let head = async {
        poll_fn(|cx| service.poll_ready(cx)).await?;
        service.call(request).await
    };
    let answer = match limit {
        None => head.await,
        Some(limit) => match tokio::time::timeout(limit, head).await {
            Ok(answer) => answer,
            Err(_) => return AttemptEnd::TimedOut,
        },
    };
    match answer {
        Ok(response) => match read_head(response.map(Body::new)) {
            // The server enforces the grpc-timeout it was sent and may answer first that the
            // attempt ran out (tonic says CANCELLED): the attempt's time is up either way.
            AttemptEnd::Failed { status, .. }
                if matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded)
                    && limit.is_some_and(|limit| started.elapsed() >= limit) =>
            {
                AttemptEnd::TimedOut
            }
            end => end,
        },
        Err(error) => {
            let error: BoxError = error.into();
            // The channel's own timer (the grpc-timeout set on the attempt) ran out first.
            if chain(&*error).any(|e| e.is::<tonic::TimeoutExpired>()) {
                return AttemptEnd::TimedOut;
            }
            let failure = classify_chain(Some(&*error));
            AttemptEnd::Transport { error, failure }
        }
    }
}

fn chain<'a>(error: &'a (dyn Error + 'static)) -> impl Iterator<Item = &'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn Error + 'static)| (*e).source())
}

/// Reads a response head: a status in the headers (trailers-only), an HTTP error, or a commit.
fn read_head(response: http::Response<Body>) -> AttemptEnd {
    let status = match Status::from_header_map(response.headers()) {
        Some(status) => status,
        None if response.status() == http::StatusCode::OK => {
            return AttemptEnd::Answered(response);
        }
        None => Status::new(
            http_error_code(response.status()),
            format!("HTTP status {} from the server", response.status()),
        ),
    };
    if status.code() == Code::Ok {
        return AttemptEnd::Answered(response);
    }
    AttemptEnd::Failed {
        advice: ServerAdvice::of(&status, response.headers()),
        status,
        response,
    }
}

/// Reads a `grpc-timeout` value (at most 8 digits and a unit, as gRPC's HTTP/2 protocol says).
pub(super) fn parse_grpc_timeout(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Writes a `grpc-timeout` value: the finest unit whose amount fits in 8 digits (rounded up, so
/// the server never sees a shorter deadline than the attempt has).
pub(super) fn grpc_timeout(limit: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let nanos = limit.as_nanos();
    let units: [(u128, &str); 6] = [
        (1, "n"),
        (1_000, "u"),
        (1_000_000, "m"),
        (1_000_000_000, "S"),
        (60_000_000_000, "M"),
        (3_600_000_000_000, "H"),
    ];
    let (amount, unit) = units
        .iter()
        .map(|&(size, unit)| (nanos.div_ceil(size), unit))
        .find(|&(amount, _)| amount <= MAX)
        .unwrap_or((MAX, "H"));
    HeaderValue::from_str(&format!("{amount}{unit}")).expect("digits and a unit are a header value")
}

/// A committed response whose final status is given to the budget when it is known (A6
/// throttling counts the call's end, not its head): OK is a success, a status of `failing` a
/// failure, and a response its caller dropped unfinished is neither.
pub(super) fn counted_by_budget(
    response: http::Response<Body>,
    budget: Option<&Arc<GrpcRetryBudget>>,
    failing: CodeSet,
) -> http::Response<Body> {
    let Some(budget) = budget else {
        return response;
    };
    let budget = Arc::clone(budget);
    on_final_status(
        response,
        OnEnding::new(move |ending| match ending {
            Ending::Status(Code::Ok) => budget.record_success(),
            Ending::Status(code) if failing.contains(code) => budget.record_failure(),
            Ending::Status(_) | Ending::Dropped => {}
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_read_back_as_at_least_what_was_written() {
        for limit in [
            Duration::from_nanos(1),
            Duration::from_micros(1500),
            Duration::from_millis(500),
            Duration::from_secs(3),
            Duration::from_secs(200_000),
            Duration::from_secs(u64::MAX / 4),
        ] {
            let value = grpc_timeout(limit);
            let read = parse_grpc_timeout(&value).unwrap();
            assert!(
                read >= limit.min(Duration::from_secs(99_999_999 * 3600)),
                "{limit:?} -> {value:?}"
            );
            assert!(value.len() <= 9, "{value:?}");
        }
    }

    #[test]
    fn grpc_timeouts_that_break_the_protocol_are_refused() {
        for bad in ["", "5", "m", "123456789m", "5x", "-5m", "5 m"] {
            assert_eq!(
                parse_grpc_timeout(&HeaderValue::from_static(bad)),
                None,
                "{bad}"
            );
        }
        assert_eq!(
            parse_grpc_timeout(&HeaderValue::from_static("30000000u")),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn http_errors_without_a_grpc_status_map_as_grpc_says() {
        let codes: Vec<_> = [400, 401, 403, 404, 429, 500, 502, 503, 504]
            .into_iter()
            .map(|s| http_error_code(http::StatusCode::from_u16(s).unwrap()))
            .collect();
        use Code::*;
        assert_eq!(
            codes,
            [
                Internal,
                Unauthenticated,
                PermissionDenied,
                Unimplemented,
                Unavailable,
                Unknown,
                Unavailable,
                Unavailable,
                Unavailable
            ]
        );
    }
}
