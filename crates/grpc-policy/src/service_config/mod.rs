//! The gRFC A6 service config: the model here; reading it in `parse`, writing it in `emit`, the
//! one-owner rule in `owner_rule`.

mod emit;
mod owner_rule;
mod parse;

pub use owner_rule::GrpcServiceConfigPolicy;
pub(crate) use owner_rule::owner_violations;

use std::fmt;
use std::time::Duration;

use grpc_core_api::GrpcMethod;
use serde_json::{Map, Value};

use crate::CodeSet;

/// A6 caps `maxAttempts` at 5; a larger value is used as 5 and reported by the validator.
pub const MAX_ATTEMPTS_CAP: u32 = 5;

/// A service config value refused, with the JSON path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Where, as `$.methodConfig[0].retryPolicy.maxAttempts`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

pub(crate) fn refuse<T>(path: &str, message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        path: path.to_owned(),
        message: message.into(),
    })
}

/// A parsed service config. Fields this crate does not interpret (`loadBalancingConfig`,
/// `healthCheckConfig`, ...) are kept as they were and emitted again, so that parse, emit, parse
/// loses nothing.
///
/// `#[non_exhaustive]`: read with [`parse`](Self::parse) (or start from `default()`), so that a
/// field A6 adds breaks no caller.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// The method configs, in order.
    pub method_configs: Vec<MethodConfig>,
    /// The channel-wide retry throttling, if any.
    pub retry_throttling: Option<RetryThrottling>,
    /// The top-level fields not interpreted here, as they were.
    pub other_fields: Map<String, Value>,
    /// What this parser accepted that some reference client (grpc-go, grpc-java, gRPC C-core)
    /// refuses or reads differently; the validator reports each as a finding.
    pub portability: Vec<PortabilityNote>,
}

/// Something a config does that the reference clients do not agree on: accepted here (as the
/// most lenient of them does), and reported so that a config shared across languages stays
/// safe everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortabilityNote {
    /// Where, as `$.methodConfig[0].retryPolicy.retryableStatusCodes[0]`.
    pub path: String,
    /// What differs, naming the clients.
    pub message: String,
}

/// Which calls a method config applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MethodName {
    /// `{}`: every method of every service not named elsewhere.
    Default,
    /// `{"service": "pkg.Svc"}`: every method of the service not named elsewhere.
    Service(String),
    /// `{"service": "pkg.Svc", "method": "M"}`: one method.
    Method(GrpcMethod),
}

impl MethodName {
    /// How specific the name is: a method beats its service, which beats the default.
    pub fn specificity(&self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Service(_) => 1,
            Self::Method(_) => 2,
        }
    }

    /// Whether this name covers `method`.
    pub fn covers(&self, method: &GrpcMethod) -> bool {
        match self {
            Self::Default => true,
            Self::Service(service) => method.service() == service,
            Self::Method(named) => named == method,
        }
    }
}

/// One `methodConfig` entry. Retry and hedging on one entry are refused, so an entry has at most
/// one of them. `#[non_exhaustive]`: entries come from the parser.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MethodConfig {
    /// The names it applies to.
    pub names: Vec<MethodName>,
    /// Where each of `names` stands in the JSON `name` array, when the reader refused some (a
    /// refused name leaves a gap); empty when every name is at its own index. The parser's
    /// bookkeeping for [`name_path`](Self::name_path), not part of the model.
    pub(crate) name_positions: Vec<usize>,
    /// The deadline of the whole call, every attempt included (`timeout`).
    pub timeout: Option<Duration>,
    /// `waitForReady`.
    pub wait_for_ready: Option<bool>,
    /// `maxRequestMessageBytes`.
    pub max_request_message_bytes: Option<u64>,
    /// `maxResponseMessageBytes`.
    pub max_response_message_bytes: Option<u64>,
    /// The retry policy.
    pub retry_policy: Option<RetryPolicy>,
    /// The hedging policy.
    pub hedging_policy: Option<HedgingPolicy>,
    /// The entry's fields not interpreted here, as they were.
    pub other_fields: Map<String, Value>,
}

/// A6 `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    max_attempts_requested: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    backoff_multiplier: f64,
    retryable_status_codes: CodeSet,
    per_attempt_recv_timeout: Option<Duration>,
}

impl RetryPolicy {
    /// Checks and builds a policy as A6 does; `path` names it in errors.
    pub fn new(
        max_attempts: u32,
        initial_backoff: Duration,
        max_backoff: Duration,
        backoff_multiplier: f64,
        retryable_status_codes: CodeSet,
    ) -> Result<Self, ConfigError> {
        let path = "retryPolicy";
        if max_attempts < 2 {
            return refuse(path, "maxAttempts must be at least 2");
        }
        if initial_backoff.is_zero() || max_backoff.is_zero() {
            return refuse(path, "backoffs must be positive");
        }
        if !(backoff_multiplier.is_finite() && backoff_multiplier > 0.0) {
            return refuse(path, "backoffMultiplier must be greater than 0");
        }
        if retryable_status_codes.is_empty() {
            return refuse(path, "retryableStatusCodes must not be empty");
        }
        Ok(Self {
            max_attempts_requested: max_attempts,
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            retryable_status_codes,
            per_attempt_recv_timeout: None,
        })
    }

    /// The same policy with a time limit per attempt (`perAttemptRecvTimeout`, as grpc-java
    /// implements it); without one, only the call's deadline bounds an attempt.
    pub fn with_per_attempt_recv_timeout(mut self, limit: Duration) -> Self {
        self.per_attempt_recv_timeout = Some(limit);
        self
    }

    /// `perAttemptRecvTimeout`.
    pub fn per_attempt_recv_timeout(&self) -> Option<Duration> {
        self.per_attempt_recv_timeout
    }

    /// The attempts used: the requested value capped at 5.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts_requested.min(MAX_ATTEMPTS_CAP)
    }

    /// The value the config asked for (reported when above the cap).
    pub fn max_attempts_requested(&self) -> u32 {
        self.max_attempts_requested
    }

    /// `initialBackoff`.
    pub fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// `maxBackoff`.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// `backoffMultiplier`.
    pub fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// `retryableStatusCodes`.
    pub fn retryable_status_codes(&self) -> CodeSet {
        self.retryable_status_codes
    }
}

/// A6 `hedgingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingPolicy {
    max_attempts_requested: u32,
    hedging_delay: Option<Duration>,
    non_fatal_status_codes: CodeSet,
}

impl HedgingPolicy {
    /// The attempts used: the requested value capped at 5.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts_requested.min(MAX_ATTEMPTS_CAP)
    }

    /// The value the config asked for.
    pub fn max_attempts_requested(&self) -> u32 {
        self.max_attempts_requested
    }

    /// `hedgingDelay`.
    pub fn hedging_delay(&self) -> Option<Duration> {
        self.hedging_delay
    }

    /// `nonFatalStatusCodes`.
    pub fn non_fatal_status_codes(&self) -> CodeSet {
        self.non_fatal_status_codes
    }
}

/// A6 `retryThrottling`: `maxTokens` in (0, 1000], `tokenRatio` > 0, kept to 3 decimals (further
/// decimals are truncated, as A6, grpc-java and gRPC C-core do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryThrottling {
    max_tokens: u32,
    token_ratio_milli: u32,
}

impl RetryThrottling {
    /// Checks and builds the throttling parameters; a ratio with more than 3 decimals is
    /// truncated to 3 (0.5466 is 0.546).
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(1..=1000).contains(&max_tokens) {
            return refuse("retryThrottling.maxTokens", "must be in (0, 1000]");
        }
        if !(token_ratio.is_finite() && token_ratio > 0.0)
            || token_ratio * 1000.0 > f64::from(u32::MAX)
        {
            return refuse("retryThrottling.tokenRatio", "must be greater than 0");
        }
        // A hair of tolerance so that 0.1 (0.1000000000000000055...) stays 100 thousandths.
        let milli = (token_ratio * 1000.0 + 1e-9).floor();
        if milli < 1.0 {
            return refuse(
                "retryThrottling.tokenRatio",
                "is 0 once truncated to 3 decimals; it must be at least 0.001",
            );
        }
        Ok(Self {
            max_tokens,
            token_ratio_milli: milli as u32,
        })
    }

    /// `maxTokens`.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio` in thousandths.
    pub fn token_ratio_milli(&self) -> u32 {
        self.token_ratio_milli
    }
}

impl MethodConfig {
    /// The field that makes this entry retry (`retryPolicy` or `hedgingPolicy`), if any.
    pub fn retry_field(&self) -> Option<&'static str> {
        if self.retry_policy.is_some() {
            Some("retryPolicy")
        } else if self.hedging_policy.is_some() {
            Some("hedgingPolicy")
        } else {
            None
        }
    }

    /// The attempts the entry's retry or hedging policy allows (capped at 5), if it has one.
    pub fn max_attempts(&self) -> Option<u32> {
        self.retry_policy
            .as_ref()
            .map(RetryPolicy::max_attempts)
            .or(self
                .hedging_policy
                .as_ref()
                .map(HedgingPolicy::max_attempts))
    }

    /// The attempts the entry's policy asked for, before the cap.
    pub fn max_attempts_requested(&self) -> Option<u32> {
        self.retry_policy
            .as_ref()
            .map(RetryPolicy::max_attempts_requested)
            .or(self
                .hedging_policy
                .as_ref()
                .map(HedgingPolicy::max_attempts_requested))
    }

    /// The JSON path of the `j`-th of `names`, in the entry at `entry_path`.
    pub fn name_path(&self, entry_path: &str, j: usize) -> String {
        let position = self.name_positions.get(j).copied().unwrap_or(j);
        format!("{entry_path}.name[{position}]")
    }
}

impl ServiceConfig {
    /// The entry that applies to `method` (most specific name wins), with its index.
    pub fn entry_for(&self, method: &GrpcMethod) -> Option<(usize, &MethodConfig)> {
        self.method_configs
            .iter()
            .enumerate()
            .filter_map(|(i, entry)| {
                entry
                    .names
                    .iter()
                    .filter(|name| name.covers(method))
                    .map(MethodName::specificity)
                    .max()
                    .map(|specificity| (specificity, i, entry))
            })
            .max_by_key(|(specificity, _, _)| *specificity)
            .map(|(_, i, entry)| (i, entry))
    }
}
impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("(default)"),
            Self::Service(service) => write!(f, "{service}/*"),
            Self::Method(method) => write!(f, "{method}"),
        }
    }
}
