//! The one-owner rule on a service config.

use super::{ConfigError, ServiceConfig, refuse};
use crate::GrpcRetryOwner;

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

    /// Refuses `config` if it carries retries its owner may not have.
    pub fn check(&self, config: &ServiceConfig) -> Result<(), ConfigError> {
        if self.owner.allows_service_config_retry() {
            return Ok(());
        }
        for (i, entry) in config.method_configs.iter().enumerate() {
            let (field, present) = if entry.retry_policy.is_some() {
                ("retryPolicy", true)
            } else {
                ("hedgingPolicy", entry.hedging_policy.is_some())
            };
            if present {
                return refuse(
                    &format!("$.methodConfig[{i}].{field}"),
                    format!(
                        "the retry owner is {}; only the channel owner may retry in the service config",
                        self.owner
                    ),
                );
            }
        }
        Ok(())
    }

    /// Parses and checks in one step.
    pub fn parse(&self, json: &str) -> Result<ServiceConfig, ConfigError> {
        let config = ServiceConfig::parse(json)?;
        self.check(&config)?;
        Ok(config)
    }
}
