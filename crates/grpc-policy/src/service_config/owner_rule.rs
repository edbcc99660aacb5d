//! The one-owner rule on a service config, written once: [`owner_violations`] is what the
//! parser-side check ([`GrpcServiceConfigPolicy`]) refuses and what the ownership validator
//! reports as its `owner` finding.

use super::{ConfigError, ServiceConfig};
use crate::GrpcRetryOwner;

/// Every entry of `config` that retries although `owner` is not the channel, by index, with the
/// error at its `retryPolicy` or `hedgingPolicy`: none when the channel owns retries.
pub(crate) fn owner_violations(
    owner: GrpcRetryOwner,
    config: &ServiceConfig,
) -> impl Iterator<Item = (usize, ConfigError)> + '_ {
    config
        .method_configs
        .iter()
        .enumerate()
        .filter(move |_| !owner.allows_service_config_retry())
        .filter_map(move |(i, entry)| {
            let field = entry.retry_field()?;
            let violation = ConfigError {
                path: format!("$.methodConfig[{i}].{field}"),
                message: format!(
                    "the channel's retry owner is {owner}; the service config must not retry"
                ),
            };
            Some((i, violation))
        })
}

/// Applies the one-owner rule to a service config: `retryPolicy` and `hedgingPolicy` are refused
/// unless the channel owns retries.
#[derive(Debug, Clone, Copy)]
pub struct GrpcServiceConfigPolicy {
    owner: GrpcRetryOwner,
}

impl GrpcServiceConfigPolicy {
    /// The policy for a channel owned by `owner`.
    pub fn new(owner: GrpcRetryOwner) -> Self {
        Self { owner }
    }

    /// Refuses `config` if it carries retries its owner may not have (the first such entry).
    pub fn check(&self, config: &ServiceConfig) -> Result<(), ConfigError> {
        match owner_violations(self.owner, config).next() {
            Some((_, violation)) => Err(violation),
            None => Ok(()),
        }
    }

    /// Parses and checks in one step.
    pub fn parse(&self, json: &str) -> Result<ServiceConfig, ConfigError> {
        let config = ServiceConfig::parse(json)?;
        self.check(&config)?;
        Ok(config)
    }
}
