//! A call under a `retryPolicy`: one attempt at a time, each failure judged by the policy.

use grpc_policy::{RefusalReason, RetryPolicy};
use tonic::body::Body;

use super::attempt::Attempts;
use super::attempt::{AttemptEnd, BoxError, counted_by_budget, deadline_passed};
use super::service::{Call, Shared};
use crate::client::advice::ServerAdvice;
use crate::client::attempts::{CallRun, Next};
use crate::metrics::CallCounts;

impl Shared {
    /// The call under a `retryPolicy`: one attempt at a time.
    pub(super) async fn retry(
        &self,
        mut channel: impl Attempts,
        call: &Call,
        policy: &RetryPolicy,
    ) -> (Result<http::Response<Body>, BoxError>, CallCounts) {
        let mut run = CallRun::new(self.context(call, policy), call.deadline);
        loop {
            let limit = run.attempt_limit(policy.per_attempt_recv_timeout());
            run.attempt_starts();
            let end = channel
                .send(call.attempt(run.previous_attempts(), limit), limit)
                .await;
            if let AttemptEnd::Answered(response) = end {
                let response = counted_by_budget(
                    response,
                    self.budget.as_ref(),
                    policy.retryable_status_codes(),
                );
                return (Ok(response), run.counts());
            }
            let code = end.code();
            let (failure, advice) = match &end {
                AttemptEnd::Failed { advice, .. } => (None, *advice),
                AttemptEnd::Transport { failure, .. } => (Some(*failure), ServerAdvice::default()),
                AttemptEnd::Answered(_) | AttemptEnd::TimedOut => (None, ServerAdvice::default()),
            };
            let replayable = call.replay.replayable();
            if let Some(failure) = failure
                && replayable
                && run.resend_transparently(failure, code).await
            {
                continue;
            }
            if !replayable {
                tracing::info!(
                    method = %call.method,
                    "retry decision: refuse: the request body passed the per-call buffer, the call is committed"
                );
                self.stats.refused(RefusalReason::PrefixDelivered);
                return (end.into_answer(), run.counts());
            }
            match run.judge(code, advice, end.evidence()) {
                Next::Retry(backoff) => run.pause(backoff).await,
                Next::Stop => return (end.into_answer(), run.counts()),
                Next::ResolveFirst(backoff) => {
                    if !run.may_resend() {
                        return (end.into_answer(), run.counts());
                    }
                    // The layer has no lookup of its own: a resend under the same key is one,
                    // answered from the server's durable ledger (ADR 0011).
                    tracing::info!(
                        method = %call.method,
                        "outcome unknown: resending under the same key, which the server's ledger answers as a lookup"
                    );
                    run.pause(backoff).await;
                }
            }
            if run.deadline_passed() {
                return (Ok(deadline_passed().into_http()), run.counts());
            }
        }
    }
}
