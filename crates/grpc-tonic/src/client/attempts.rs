//! One call's retry state and its decisions, shared by the [`RetryExecutor`](crate::RetryExecutor)
//! and the [`RetryLayer`](crate::RetryLayer): the two differ in where they see an attempt end (a
//! `Status` from a generated client, or an HTTP response head from the channel), never in what
//! they decide about it.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grpc_core_api::LedgerDurability;
use grpc_policy::{
    AttemptFacts, Backoff, BackoffSequence, Evidence, GrpcRetryBudget, GrpcRetryEligibility,
    GrpcRetryOwner, MethodClass, Pushback, RefusalReason, RetryPolicy, SplitMix64, Verdict,
};
use tonic::Code;

use super::advice::ServerAdvice;
use super::stats::ExecutorStats;
use super::transport::TransportFailure;
use crate::metrics::CallCounts;

/// How many times an attempt that never left the process is resent transparently in one call:
/// A6 allows any number, bounded by the deadline; a call without a deadline needs a bound too.
const MAX_UNSENT_RESENDS: u32 = 5;

/// The pause before resending an attempt that never left the process (its connection is being
/// replaced).
const UNSENT_RESEND_DELAY: Duration = Duration::from_millis(10);

/// The deadline of a call starting now: the earlier of the caller's and the config's `timeout`.
pub(crate) fn call_deadline(
    callers: Option<Duration>,
    config: Option<Duration>,
) -> Option<Instant> {
    let limit = match (callers, config) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    limit.map(|limit| Instant::now() + limit)
}

/// What does not change during one call.
pub(crate) struct CallContext<'a> {
    pub(crate) owner: GrpcRetryOwner,
    pub(crate) class: MethodClass,
    pub(crate) has_key: bool,
    pub(crate) ledger: LedgerDurability,
    pub(crate) policy: &'a RetryPolicy,
    /// The target's retry budget; none when the config has no `retryThrottling` (A6: nothing
    /// throttles then).
    pub(crate) budget: Option<&'a GrpcRetryBudget>,
    pub(crate) random: &'a Mutex<SplitMix64>,
    pub(crate) stats: &'a ExecutorStats,
}

impl CallContext<'_> {
    /// Whether the budget allows a retry (always, without one).
    pub(crate) fn budget_allows(&self) -> bool {
        self.budget.is_none_or(GrpcRetryBudget::allows_retry)
    }

    /// Takes a token for a failed attempt.
    pub(crate) fn record_failure(&self) {
        if let Some(budget) = self.budget {
            budget.record_failure();
        }
    }
}

/// What to do after a sent attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send again after this backoff.
    Retry(Duration),
    /// The outcome is unknown: find out what became of the operation (then, if it never
    /// committed, resend after this backoff).
    ResolveFirst(Duration),
    /// The failure is the call's answer.
    Stop,
}

/// One call in progress: its attempts so far, its deadline and its backoff.
pub(crate) struct CallRun<'a> {
    context: CallContext<'a>,
    backoff: BackoffSequence,
    deadline: Option<Instant>,
    /// Attempts that counted toward `maxAttempts`.
    sent_attempts: u32,
    unsent_resends: u32,
    refused_resent: bool,
    /// A retry was decided; it is counted when its attempt starts.
    retry_pending: bool,
    /// Retries that counted toward `maxAttempts` (A96's `grpc.client.call.retries`).
    retries: u32,
    /// Transparent retries (A96's `grpc.client.call.transparent_retries`).
    transparent_retries: u32,
    /// Time spent with no attempt in flight, waiting to send the next (A96's
    /// `grpc.client.call.retry_delay`).
    retry_delay: Duration,
}

impl<'a> CallRun<'a> {
    /// A call starting now, with `deadline` (the earlier of the caller's and the config's).
    pub(crate) fn new(context: CallContext<'a>, deadline: Option<Instant>) -> Self {
        Self {
            backoff: Backoff::of(context.policy).sequence(),
            context,
            deadline,
            sent_attempts: 0,
            unsent_resends: 0,
            refused_resent: false,
            retry_pending: false,
            retries: 0,
            transparent_retries: 0,
            retry_delay: Duration::ZERO,
        }
    }

    /// What the call did so far, as A96 counts it.
    pub(crate) fn counts(&self) -> CallCounts {
        CallCounts {
            retries: self.retries,
            transparent_retries: self.transparent_retries,
            hedges: 0,
            retry_delay: self.retry_delay,
        }
    }

    /// Time left before the call's deadline.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether the call's deadline has passed.
    pub(crate) fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Attempts sent so far that counted toward `maxAttempts` (`grpc-previous-rpc-attempts` of
    /// the next one).
    pub(crate) fn previous_attempts(&self) -> u32 {
        self.sent_attempts
    }

    /// The time limit of the next attempt: the rest of the deadline, or the per-attempt limit
    /// when that is sooner.
    pub(crate) fn attempt_limit(&self, per_attempt: Option<Duration>) -> Option<Duration> {
        match (self.remaining(), per_attempt) {
            (Some(left), Some(limit)) => Some(left.min(limit)),
            (left, limit) => left.or(limit),
        }
    }

    /// Marks the start of an attempt: a retry is counted when it is sent, not when decided (the
    /// deadline may end the call during the backoff).
    pub(crate) fn attempt_starts(&mut self) {
        self.context.stats.attempts.fetch_add(1, Ordering::Relaxed);
        if std::mem::take(&mut self.retry_pending) {
            self.retries += 1;
            self.context.stats.retries.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a sent attempt that succeeded.
    pub(crate) fn succeeded(&self) {
        if let Some(budget) = self.context.budget {
            budget.record_success();
        }
    }

    /// Waits `delay` before the next attempt, counting it as retry delay.
    pub(crate) async fn pause(&mut self, delay: Duration) {
        self.retry_delay += delay;
        tokio::time::sleep(delay).await;
    }

    /// Whether an attempt that failed with `failure` before any response head arrived is resent
    /// transparently (A6: one that never left the client any number of times, here up to 5 and
    /// within the deadline; one the server refused before its application saw it, once). When it
    /// is, waits as a replaced connection needs and counts it.
    pub(crate) async fn resend_transparently(
        &mut self,
        failure: TransportFailure,
        code: Code,
    ) -> bool {
        let resend = !self.deadline_passed()
            && match failure {
                TransportFailure::NeverLeftClient => self.unsent_resends < MAX_UNSENT_RESENDS,
                TransportFailure::NotProcessed => !self.refused_resent,
                _ => false,
            };
        if !resend {
            return false;
        }
        if failure == TransportFailure::NotProcessed {
            self.refused_resent = true;
        } else {
            self.unsent_resends += 1;
            // The connection is being replaced; give it a moment rather than spin.
            self.pause(UNSENT_RESEND_DELAY).await;
        }
        self.transparent_retries += 1;
        self.context
            .stats
            .transparent_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            attempt = self.sent_attempts + 1,
            code = ?code,
            evidence = ?failure,
            "retry decision: transparent retry, the attempt never reached the server application"
        );
        true
    }

    /// Judges a sent attempt that failed with `code`, the server's `advice` (its pushback, and a
    /// `RetryInfo` delay, for the next backoff), and what is known of it (`evidence`): counts it
    /// toward `maxAttempts` and the budget, and asks the policy.
    pub(crate) fn judge(&mut self, code: Code, advice: ServerAdvice, evidence: Evidence) -> Next {
        let pushback = advice.pushback;
        let context = &self.context;
        self.sent_attempts += 1;
        let retryable = context.policy.retryable_status_codes();
        // A6 throttling counts a retryable status, and a pushback that says stop, as failures.
        if retryable.contains(code) || pushback == Some(Pushback::DoNotRetry) {
            context.record_failure();
        }
        let next_backoff = {
            let mut random = context.random.lock().unwrap_or_else(|p| p.into_inner());
            self.backoff
                .next_delay_advised(pushback, advice.retry_info, &mut *random)
        };
        let Some(next_backoff) = next_backoff else {
            tracing::info!(code = ?code, "retry decision: the server's pushback says do not retry");
            return Next::Stop;
        };
        let facts = AttemptFacts::new(context.owner, context.class, code)
            .with_evidence(evidence)
            .with_retryable(retryable)
            .with_key(context.has_key)
            .with_ledger(context.ledger)
            .with_sent_attempts(self.sent_attempts)
            .with_max_attempts(context.policy.max_attempts())
            .with_remaining_deadline(self.remaining())
            .with_next_backoff(next_backoff)
            .with_budget_allows(context.budget_allows());
        let verdict = GrpcRetryEligibility::decide(&facts);
        // A refusal the caller may not expect is a warning: one that leaves an outcome unknown, or
        // one for any reason but the status (a key missing, no durable ledger, the budget, the
        // attempts or the deadline spent). A status the policy does not retry is routine.
        let surprising = matches!(verdict, Verdict::Refuse(reason)
            if evidence == Evidence::SentNoAnswer || reason != RefusalReason::NonRetryableStatus);
        if surprising {
            tracing::warn!(
                attempt = self.sent_attempts,
                code = ?code,
                class = ?context.class,
                ?evidence,
                %verdict,
                "retry decision: not retried"
            );
        } else {
            tracing::info!(
                attempt = self.sent_attempts,
                code = ?code,
                class = ?context.class,
                %verdict,
                "retry decision"
            );
        }
        match verdict {
            Verdict::Retry => {
                self.retry_pending = true;
                Next::Retry(next_backoff)
            }
            Verdict::Refuse(reason) => {
                context.stats.refused(reason);
                Next::Stop
            }
            Verdict::ResolveCompletionFirst => {
                context.stats.resolved_first.fetch_add(1, Ordering::Relaxed);
                Next::ResolveFirst(next_backoff)
            }
        }
    }

    /// Whether an operation found never to have committed may be sent again: a resend is a
    /// retry, so the budget must still allow one (refused and counted otherwise).
    pub(crate) fn may_resend(&mut self) -> bool {
        if self.context.budget_allows() {
            self.retry_pending = true;
            return true;
        }
        self.context.stats.refused(RefusalReason::BudgetExhausted);
        false
    }
}
