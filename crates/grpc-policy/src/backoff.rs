//! gRFC A6 backoff as revised in 2024 (grpc/proposal#452) and implemented by grpc-go and
//! grpc-java: an exponential ceiling with ±20% jitter, and the server's pushback.

use std::time::Duration;

use crate::RetryPolicy;

/// A source of uniform random numbers in `[0, 1)`, injected so that tests are deterministic.
pub trait RandomSource {
    /// The next number in `[0, 1)`.
    fn next_unit(&mut self) -> f64;
}

/// SplitMix64: small, fast and statistically sound enough for jitter (not for secrets).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from a seed; seed it differently per client so that clients do not retry in
    /// step.
    pub fn from_seed(seed: u64) -> Self {
        Self(seed)
    }
}

impl RandomSource for SplitMix64 {
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits make a double in [0, 1).
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The backoff of a retry policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    multiplier: f64,
}

impl Backoff {
    /// The backoff of `policy`.
    pub fn of(policy: &RetryPolicy) -> Self {
        Self {
            initial: policy.initial_backoff(),
            max: policy.max_backoff(),
            multiplier: policy.backoff_multiplier(),
        }
    }

    /// The ceiling before retry `n` (1 for the first retry):
    /// `min(initialBackoff * multiplier^(n-1), maxBackoff)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        let seconds = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        if seconds.is_finite() && seconds < self.max.as_secs_f64() {
            Duration::from_secs_f64(seconds)
        } else {
            self.max
        }
    }

    /// The jittered delay before retry `n`: `ceiling(n) * U[0.8, 1.2)`. Never zero for a positive
    /// ceiling, so a retry never follows a failure at once.
    pub fn delay(&self, retry: u32, random: &mut impl RandomSource) -> Duration {
        self.ceiling(retry).mul_f64(0.8 + 0.4 * random.next_unit())
    }

    /// The delay before retry `n`, honouring a server pushback when there is one: the pushback
    /// replaces the jittered delay, and a pushback that says "do not retry" is `None`. (A caller
    /// that makes several retries uses [`BackoffSequence`], which also restarts the exponent
    /// after a pushback.)
    pub fn delay_with_pushback(
        &self,
        retry: u32,
        pushback: Option<Pushback>,
        random: &mut impl RandomSource,
    ) -> Option<Duration> {
        match pushback {
            None => Some(self.delay(retry, random)),
            Some(Pushback::RetryAfter(delay)) => Some(delay),
            Some(Pushback::DoNotRetry) => None,
        }
    }

    /// The delays of one call's retries, starting with the first.
    pub fn sequence(&self) -> BackoffSequence {
        BackoffSequence {
            backoff: *self,
            since_pushback: 0,
        }
    }
}

/// The delays of one call's retries: the n-th retry since the last valid pushback waits
/// `min(initialBackoff * multiplier^(n-1), maxBackoff) * U[0.8, 1.2)`; a valid pushback sets the
/// next delay exactly and restarts the sequence at `initialBackoff` (gRFC A6).
#[derive(Debug, Clone)]
pub struct BackoffSequence {
    backoff: Backoff,
    since_pushback: u32,
}

impl BackoffSequence {
    /// The delay before the next retry, or `None` when the server's pushback says not to retry.
    pub fn next_delay(
        &mut self,
        pushback: Option<Pushback>,
        random: &mut impl RandomSource,
    ) -> Option<Duration> {
        self.next_delay_advised(pushback, None, random)
    }

    /// The delay before the next retry with all the server said: A6's pushback, when there is
    /// one, decides (exactly that delay, or no retry); otherwise a `google.rpc.RetryInfo` delay
    /// from the status's details is the next delay, kept between `initialBackoff` (so a server
    /// answering "now" over and over cannot make a client retry in a tight loop) and `maxBackoff`
    /// (so it cannot park a client past its policy), and like a pushback it restarts the
    /// exponent; otherwise the jittered exponential delay.
    pub fn next_delay_advised(
        &mut self,
        pushback: Option<Pushback>,
        retry_info: Option<Duration>,
        random: &mut impl RandomSource,
    ) -> Option<Duration> {
        match (pushback, retry_info) {
            (Some(Pushback::DoNotRetry), _) => None,
            (Some(Pushback::RetryAfter(delay)), _) => {
                self.since_pushback = 0;
                Some(delay)
            }
            (None, Some(delay)) => {
                self.since_pushback = 0;
                Some(delay.clamp(self.backoff.initial.min(self.backoff.max), self.backoff.max))
            }
            (None, None) => {
                self.since_pushback = self.since_pushback.saturating_add(1);
                Some(self.backoff.delay(self.since_pushback, random))
            }
        }
    }
}

/// What a server said in `grpc-retry-pushback-ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// Retry after exactly this long.
    RetryAfter(Duration),
    /// Do not retry: a negative, unreadable, out-of-range or repeated value (gRFC A6).
    DoNotRetry,
}

impl Pushback {
    /// The pushback of a response that carried `values` of `grpc-retry-pushback-ms`: none when
    /// absent, do-not-retry when there is more than one.
    pub fn from_values<'a>(mut values: impl Iterator<Item = &'a str>) -> Option<Self> {
        let first = values.next()?;
        if values.next().is_some() {
            return Some(Self::DoNotRetry);
        }
        Some(parse_pushback(first))
    }
}

/// Reads one `grpc-retry-pushback-ms` value: a signed 32-bit decimal integer of milliseconds, as
/// gRPC's clients read it (`+5` is five; a negative value, or one that does not fit in 32 bits,
/// means do not retry).
pub fn parse_pushback(value: &str) -> Pushback {
    match value.parse::<i32>() {
        Ok(millis) if millis >= 0 => Pushback::RetryAfter(Duration::from_millis(millis as u64)),
        _ => Pushback::DoNotRetry,
    }
}
