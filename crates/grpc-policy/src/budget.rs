//! gRFC A6 retry throttling: a token bucket per target, lock-free.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::RetryThrottling;

/// Tokens are kept in thousandths so that a token ratio with three decimals is exact.
const SCALE: u32 = 1000;

/// A6 retry throttling for one target: tokens start at `maxTokens`; each failed attempt takes one
/// token, each success gives back `tokenRatio`; tokens stay within `[0, maxTokens]`; a retry is
/// allowed only while tokens are above half of `maxTokens`. When everything fails, retries stop
/// after about `maxTokens / 2` failures and come back only as successes refill the bucket, which is
/// what gives a failing dependency room to recover.
///
/// The whole state is one `AtomicU32` of milli-tokens, so a budget is `Send + Sync` and shared by
/// reference (or `Arc`) between every task calling the target.
#[derive(Debug)]
pub struct GrpcRetryBudget {
    milli_tokens: AtomicU32,
    max_milli_tokens: u32,
    ratio_milli_tokens: u32,
}

impl GrpcRetryBudget {
    /// A full bucket for the given throttling parameters.
    pub fn new(throttling: &RetryThrottling) -> Self {
        let max = throttling.max_tokens() * SCALE;
        Self {
            milli_tokens: AtomicU32::new(max),
            max_milli_tokens: max,
            ratio_milli_tokens: throttling.token_ratio_milli(),
        }
    }

    /// Whether a retry is allowed now: tokens above half the maximum.
    pub fn allows_retry(&self) -> bool {
        self.milli_tokens.load(Ordering::Relaxed) > self.max_milli_tokens / 2
    }

    /// Records a failed attempt (a retryable or non-fatal status): one token less, not below 0.
    pub fn record_failure(&self) {
        // The closure never returns None, so the update cannot fail.
        let _ = self
            .milli_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(SCALE))
            });
    }

    /// Records a successful attempt: `tokenRatio` tokens more, not above the maximum.
    pub fn record_success(&self) {
        let (ratio, max) = (self.ratio_milli_tokens, self.max_milli_tokens);
        let _ = self
            .milli_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(ratio).min(max))
            });
    }

    /// The tokens left, in thousandths.
    pub fn milli_tokens(&self) -> u32 {
        self.milli_tokens.load(Ordering::Relaxed)
    }
}
