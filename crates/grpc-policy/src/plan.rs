//! From a service config, its retry owner and the methods it configures to each method's retry
//! parameters: the one way, so that the one-owner rule and the ownership validator run once, in
//! one place, whichever layer then retries (the channel's `RetryLayer` or the application's
//! executor).

use std::fmt;
use std::time::Duration;

use grpc_core_api::{GrpcMethod, LedgerDurability};

use crate::{
    Finding, GrpcRetryBudget, GrpcRetryOwner, GrpcRetryOwnershipValidator, HedgingPolicy,
    MethodCatalog, MethodClass, RetryPolicy, ServiceConfig, Severity,
};

/// Why a service config may not be applied: the validator's errors, in its order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the service config is unsafe for these methods: {}", Errors(.errors))]
pub struct UnsafeRetryConfig {
    /// Every error the ownership validator found (warnings are on the plan).
    pub errors: Vec<Finding>,
}

struct Errors<'a>(&'a [Finding]);

impl fmt::Display for Errors<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, finding) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{finding}")?;
        }
        Ok(())
    }
}

/// A service config checked once for the layer that applies its retries.
///
/// Who applies the config's `retryPolicy`, `hedgingPolicy` and `retryThrottling` is the owner's
/// to say:
/// - [`GrpcRetryOwner::Channel`]: the channel, with the whole config.
/// - [`GrpcRetryOwner::Application`]: the application's executor, in place of the channel. The
///   parameters are checked exactly as a channel's would be (they drive the same attempts), and
///   the channel is given the config without them ([`channel_config`](Self::channel_config)),
///   so that one layer retries.
/// - [`GrpcRetryOwner::Mesh`] or [`GrpcRetryOwner::None`]: nobody in the process; a config that
///   retries is refused by the one-owner rule.
#[derive(Debug, Clone)]
pub struct RetryPlan {
    owner: GrpcRetryOwner,
    server_ledger: LedgerDurability,
    config: ServiceConfig,
    catalog: MethodCatalog,
    warnings: Vec<Finding>,
}

/// What a plan says of one method.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct MethodRetry<'a> {
    /// The method's class, from the catalog (non-idempotent when the catalog lacks it).
    pub class: MethodClass,
    /// The method's retry policy, if its entry has one.
    pub retry_policy: Option<&'a RetryPolicy>,
    /// The method's hedging policy, if its entry has one.
    pub hedging_policy: Option<&'a HedgingPolicy>,
    /// The deadline of the whole call (`timeout`), if its entry has one.
    pub timeout: Option<Duration>,
}

impl RetryPlan {
    /// Checks `config` against `catalog`, the one-owner rule for `owner` and the server's ledger
    /// durability; refused on any error the validator finds, kept with its warnings otherwise.
    pub fn new(
        owner: GrpcRetryOwner,
        config: ServiceConfig,
        catalog: MethodCatalog,
        server_ledger: LedgerDurability,
    ) -> Result<Self, UnsafeRetryConfig> {
        // An application owner applies the config's retries in the channel's place: the
        // validator sees the layer that sends the attempts, which is the channel's role.
        let applies = match owner {
            GrpcRetryOwner::Application => GrpcRetryOwner::Channel,
            other => other,
        };
        let (errors, warnings) = GrpcRetryOwnershipValidator::new(applies)
            .with_ledger(server_ledger.into())
            .validate(&config, &catalog)
            .into_iter()
            .partition::<Vec<_>, _>(|finding| finding.severity == Severity::Error);
        if !errors.is_empty() {
            return Err(UnsafeRetryConfig { errors });
        }
        Ok(Self {
            owner,
            server_ledger,
            config,
            catalog,
            warnings,
        })
    }

    /// Who applies the config's retries.
    pub fn owner(&self) -> GrpcRetryOwner {
        self.owner
    }

    /// The server's ledger durability the plan was checked for.
    pub fn server_ledger(&self) -> LedgerDurability {
        self.server_ledger
    }

    /// The validator's warnings: worth a look, not a reason to refuse.
    pub fn warnings(&self) -> &[Finding] {
        &self.warnings
    }

    /// The methods the config was checked against.
    pub fn catalog(&self) -> &MethodCatalog {
        &self.catalog
    }

    /// The config as it was checked.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// What applies to `method`: its class, and its entry's policies and timeout (none when no
    /// entry names it).
    pub fn method(&self, method: &GrpcMethod) -> MethodRetry<'_> {
        let class = self
            .catalog
            .get(method)
            .map_or(MethodClass::NonIdempotent, |info| info.class);
        let entry = self.config.entry_for(method).map(|(_, entry)| entry);
        MethodRetry {
            class,
            retry_policy: entry.and_then(|e| e.retry_policy.as_ref()),
            hedging_policy: entry.and_then(|e| e.hedging_policy.as_ref()),
            timeout: entry.and_then(|e| e.timeout),
        }
    }

    /// A fresh budget from the config's `retryThrottling`, if it has one (A6 throttles nothing
    /// without). Share it between every caller of the same target.
    pub fn budget(&self) -> Option<GrpcRetryBudget> {
        self.config
            .retry_throttling
            .as_ref()
            .map(GrpcRetryBudget::new)
    }

    /// What the channel may be given: the whole config when the channel owns retries; otherwise
    /// the config without `retryPolicy`, `hedgingPolicy` and `retryThrottling`, everything else
    /// (timeouts, `waitForReady`, message limits, load balancing) as it was.
    pub fn channel_config(&self) -> ServiceConfig {
        let mut config = self.config.clone();
        if !self.owner.allows_service_config_retry() {
            config.retry_throttling = None;
            for entry in &mut config.method_configs {
                entry.retry_policy = None;
                entry.hedging_policy = None;
            }
        }
        config
    }

    /// The config and catalog, to a channel layer that owns retries.
    pub fn into_parts(self) -> (ServiceConfig, MethodCatalog) {
        (self.config, self.catalog)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MethodInfo;

    const CONFIG: &str = r#"{
      "methodConfig": [{"name": [{"service": "pkg.Svc"}], "timeout": "2s",
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}],
      "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#;

    fn catalog(class: MethodClass) -> MethodCatalog {
        let mut catalog = MethodCatalog::new();
        catalog.declare(MethodInfo {
            method: method(),
            class,
            declared: true,
            client_streaming: false,
            server_streaming: false,
        });
        catalog
    }

    fn method() -> GrpcMethod {
        GrpcMethod::parse("/pkg.Svc/Create").expect("a method")
    }

    fn plan(owner: GrpcRetryOwner, class: MethodClass) -> Result<RetryPlan, UnsafeRetryConfig> {
        let config = ServiceConfig::parse(CONFIG).expect("parses");
        RetryPlan::new(owner, config, catalog(class), LedgerDurability::Durable)
    }

    #[test]
    fn the_channel_is_given_the_whole_config() {
        let plan = plan(GrpcRetryOwner::Channel, MethodClass::Idempotent).expect("safe");
        assert_eq!(plan.channel_config(), *plan.config());
        let method = plan.method(&method());
        assert_eq!(method.retry_policy.map(RetryPolicy::max_attempts), Some(3));
        assert_eq!(method.timeout, Some(Duration::from_secs(2)));
        assert!(plan.budget().is_some());
    }

    #[test]
    fn an_application_owner_takes_the_retries_and_the_channel_gets_none() {
        let plan = plan(GrpcRetryOwner::Application, MethodClass::Idempotent).expect("safe");
        assert!(plan.method(&method()).retry_policy.is_some());
        let channel = plan.channel_config();
        assert!(channel.retry_throttling.is_none());
        assert!(
            channel
                .method_configs
                .iter()
                .all(|e| e.retry_field().is_none())
        );
        assert_eq!(
            channel.method_configs[0].timeout,
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn an_owner_outside_the_process_refuses_a_retrying_config_by_the_one_owner_rule() {
        for owner in [GrpcRetryOwner::Mesh, GrpcRetryOwner::None] {
            let refused = plan(owner, MethodClass::Idempotent).expect_err("refused");
            assert_eq!(refused.errors[0].rule, "owner", "{owner}");
        }
    }

    #[test]
    fn an_application_owner_is_held_to_the_channels_safety_rules() {
        let refused =
            plan(GrpcRetryOwner::Application, MethodClass::NonIdempotent).expect_err("refused");
        assert_eq!(refused.errors[0].rule, "non-idempotent-retry");
        assert!(
            refused
                .to_string()
                .contains("non-idempotent /pkg.Svc/Create"),
            "{refused}"
        );
    }
}
