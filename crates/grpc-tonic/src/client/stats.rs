//! What the client's retry machinery did, for callers to read.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use grpc_policy::RefusalReason;

/// Counters a caller can read to see what the executor or the `RetryLayer` did; only they write
/// them.
#[derive(Debug, Default)]
pub struct ExecutorStats {
    /// Attempts sent.
    pub(crate) attempts: AtomicU64,
    /// Attempts after the first that counted toward `maxAttempts`.
    pub(crate) retries: AtomicU64,
    /// Attempts resent because the one before provably never reached the server application
    /// (transparent retries: no budget token, not counted toward `maxAttempts`).
    pub(crate) transparent_retries: AtomicU64,
    /// Hedged attempts sent after a call's first (the [`RetryLayer`](crate::RetryLayer) under a
    /// `hedgingPolicy`).
    pub(crate) hedges: AtomicU64,
    /// Times the completion of an unknown outcome was resolved before deciding.
    pub(crate) resolved_first: AtomicU64,
    /// Answers that were replays of an earlier attempt's outcome.
    pub(crate) replays: AtomicU64,
    refusals: Mutex<BTreeMap<RefusalReason, u64>>,
}

impl ExecutorStats {
    /// Attempts sent.
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Attempts after the first that counted toward `maxAttempts`.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Attempts resent because the one before provably never reached the server application.
    pub fn transparent_retries(&self) -> u64 {
        self.transparent_retries.load(Ordering::Relaxed)
    }

    /// Hedged attempts sent after a call's first.
    pub fn hedges(&self) -> u64 {
        self.hedges.load(Ordering::Relaxed)
    }

    /// Times the completion of an unknown outcome was resolved before deciding.
    pub fn resolved_first(&self) -> u64 {
        self.resolved_first.load(Ordering::Relaxed)
    }

    /// Answers that were replays of an earlier attempt's outcome.
    pub fn replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self, reason: RefusalReason) {
        let mut refusals = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        *refusals.entry(reason).or_default() += 1;
    }

    /// Refusals by reason.
    pub fn refusals(&self) -> BTreeMap<RefusalReason, u64> {
        self.refusals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
