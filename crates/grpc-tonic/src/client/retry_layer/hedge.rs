//! A call under a `hedgingPolicy`: copies `hedgingDelay` apart, the first to commit is the answer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grpc_core_api::{says_in_flight, says_outcome_unknown};
use grpc_policy::{GrpcRetryEligibility, HedgingPolicy, Pushback};
use tokio::task::JoinSet;
use tonic::body::Body;

use super::attempt::Attempts;
use super::attempt::{AttemptEnd, BoxError, counted_by_budget, deadline_passed};
use super::service::{Call, Shared};
use crate::client::advice::ServerAdvice;
use crate::metrics::CallCounts;

impl Shared {
    /// The call under a `hedgingPolicy`: copies `hedgingDelay` apart, the first to commit wins.
    pub(super) async fn hedge(
        &self,
        mut channel: impl Attempts,
        call: &Call,
        hedging: &HedgingPolicy,
    ) -> (Result<http::Response<Body>, BoxError>, CallCounts) {
        let safe =
            GrpcRetryEligibility::may_hedge(call.class, call.has_key, self.plan.server_ledger());
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
                        let response = counted_by_budget(response, self.budget.as_ref(), non_fatal);
                        return (Ok(response), counts(sent, idle));
                    }
                    // A copy that met its own twin in flight (the guard's ABORTED), or whose
                    // commit got no verdict, is not the operation's answer while another copy is
                    // out: that copy holds the claim, or may yet answer. Wait for it.
                    if waits_for_a_twin(&end) && !attempts.is_empty() {
                        tracing::info!(method = %call.method, ?code, "hedging decision: another copy holds the operation; wait for it");
                        last = Some(end);
                        continue;
                    }
                    if !non_fatal.contains(code) && !waits_for_a_twin(&end) {
                        tracing::info!(method = %call.method, ?code, "hedging decision: a fatal status is the answer");
                        return (end.into_answer(), counts(sent, idle));
                    }
                    if let Some(budget) = &self.budget {
                        budget.record_failure();
                    }
                    match &end {
                        AttemptEnd::Failed { advice: ServerAdvice { pushback: Some(Pushback::DoNotRetry), .. }, .. } => stop_sending = true,
                        AttemptEnd::Failed { advice: ServerAdvice { pushback: Some(Pushback::RetryAfter(wait)), .. }, .. } => next_at = Instant::now() + *wait,
                        // The server's RetryInfo (the lease left of a copy in flight), as the
                        // retry loop honours it.
                        AttemptEnd::Failed { advice: ServerAdvice { retry_info: Some(wait), .. }, .. } => next_at = Instant::now() + *wait,
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
}

/// Whether `end` is a keyed copy's non-answer: the guard's "another attempt is running it"
/// (ABORTED, `IDEMPOTENCY_IN_FLIGHT`), or "my commit got no verdict" (`OUTCOME_UNKNOWN`).
fn waits_for_a_twin(end: &AttemptEnd) -> bool {
    matches!(end, AttemptEnd::Failed { status, .. }
        if says_in_flight(status) || says_outcome_unknown(status))
}

async fn sleep_until_deadline(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
