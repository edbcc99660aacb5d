//! Jitter for both sides: backoffs on the client, retention passes on the server.

use std::time::{SystemTime, UNIX_EPOCH};

use grpc_policy::SplitMix64;

/// A source for jitter, seeded from the clock and the process so that clients (or replicas)
/// started together do not act in step.
pub(crate) fn jitter_source() -> SplitMix64 {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
        ^ u64::from(std::process::id()).rotate_left(32);
    SplitMix64::from_seed(seed)
}
