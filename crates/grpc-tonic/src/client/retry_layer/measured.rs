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
use std::time::{Duration, Instant};

use tonic::Code;
use tonic::body::Body;

use super::attempt::{AttemptEnd, Attempts, BoxError};
use super::final_status::{Ending, OnEnding, on_final_status};
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
        let mut ended = OnEnding::new(move |ending| {
            metrics.attempt_ended(&labels, code_of(ending), started.elapsed());
        });
        Box::pin(async move {
            match attempt.await {
                AttemptEnd::Answered(response) => {
                    AttemptEnd::Answered(on_final_status(response, ended))
                }
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
pub(super) fn call_ended(metrics: &ClientMetrics, labels: CallLabels) -> OnEnding {
    let (metrics, started) = (metrics.clone(), Instant::now());
    OnEnding::new(move |ending| metrics.call_ended(&labels, code_of(ending), started.elapsed()))
}

/// A66's status of an ending: a response its caller dropped unfinished is CANCELLED.
fn code_of(ending: Ending) -> Code {
    match ending {
        Ending::Status(code) => code,
        Ending::Dropped => Code::Cancelled,
    }
}

/// `answer`, its call's end recorded by `ended`.
pub(super) fn call_measured(
    answer: Result<http::Response<Body>, BoxError>,
    mut ended: OnEnding,
) -> Result<http::Response<Body>, BoxError> {
    match answer {
        Ok(response) => Ok(on_final_status(response, ended)),
        // A channel error tonic reports as it can; nothing proven, so UNKNOWN (as
        // `AttemptEnd::code` says of it).
        Err(error) => {
            ended.end(Code::Unknown);
            Err(error)
        }
    }
}
