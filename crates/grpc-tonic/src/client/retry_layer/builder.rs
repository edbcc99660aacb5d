//! What a user sets on a [`RetryLayer`], and the one check before it runs: the config as a
//! [`RetryPlan`] for the channel owner.

use std::sync::{Arc, Mutex};

use grpc_core_api::LedgerDurability;
use grpc_policy::{
    Finding, GrpcRetryBudget, GrpcRetryOwner, MethodCatalog, RetryPlan, ServiceConfig,
};
use tonic::metadata::AsciiMetadataKey;

use super::RetryLayer;
use super::service::Shared;
use crate::client::stats::ExecutorStats;
use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};
use crate::metrics::ClientMetrics;
use crate::random::jitter_source;

/// How much of one call's request body is kept to send again, unless set otherwise: 256 KiB, as
/// gRPC C-core's per-call retry buffer. A call whose body passes it is committed (A6).
pub const DEFAULT_PER_CALL_BUFFER: usize = 256 * 1024;

/// Why a [`RetryLayer`] was not built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryLayerError {
    /// The ownership validator found errors in the service config for this catalog.
    #[error("the service config is unsafe for these methods: {}", first_error(.0))]
    UnsafeConfig(Vec<Finding>),
}

fn first_error(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Builds a [`RetryLayer`].
#[derive(Debug)]
pub struct RetryLayerBuilder {
    config: ServiceConfig,
    catalog: MethodCatalog,
    server_ledger: LedgerDurability,
    budget: Option<Arc<GrpcRetryBudget>>,
    buffer_limit: usize,
    stats: Arc<ExecutorStats>,
    target: String,
    metrics: Option<ClientMetrics>,
    key_header: AsciiMetadataKey,
}

impl RetryLayerBuilder {
    pub(super) fn new(config: ServiceConfig, catalog: MethodCatalog) -> Self {
        Self {
            config,
            catalog,
            server_ledger: LedgerDurability::Volatile,
            key_header: AsciiMetadataKey::from_static(IDEMPOTENCY_KEY_HEADER),
            budget: None,
            buffer_limit: DEFAULT_PER_CALL_BUFFER,
            stats: Arc::new(ExecutorStats::default()),
            target: "unknown".to_owned(),
            metrics: None,
        }
    }

    /// The request metadata that carries the key ([`IDEMPOTENCY_KEY_HEADER`] by default); the
    /// server's guard must read the same one.
    pub fn key_header(mut self, name: &str) -> Result<Self, InvalidKeyHeader> {
        self.key_header = key_header(name)?;
        Ok(self)
    }

    /// The server's ledger durability, as the service documents it. Until said, it is taken as
    /// volatile: keyed mutations are not retried once sent.
    pub fn server_ledger(mut self, durability: LedgerDurability) -> Self {
        self.server_ledger = durability;
        self
    }

    /// Shares a retry budget with other channels to the same target; by default the layer has
    /// its own, from the config's `retryThrottling` (none without one: A6 then throttles
    /// nothing).
    pub fn budget(mut self, budget: Arc<GrpcRetryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// How many bytes of one call's request body are kept to send again.
    pub fn per_call_buffer(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// Shares counters with executors or other layers.
    pub fn stats(mut self, stats: Arc<ExecutorStats>) -> Self {
        self.stats = stats;
        self
    }

    /// Names the channel's target (A66's `grpc.target`: the target URI the channel was created
    /// with) in logs and metrics.
    pub fn target(mut self, target: impl Into<String>) -> Self {
        self.target = target.into();
        self
    }

    /// Records gRFC A96's per-call retry metrics (`grpc.client.call.retries`,
    /// `grpc.client.call.transparent_retries`, `grpc.client.call.hedges`,
    /// `grpc.client.call.retry_delay`, labelled `grpc.method` and `grpc.target`) with `meter`.
    #[cfg(feature = "opentelemetry")]
    pub fn meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.metrics = Some(ClientMetrics::new(meter));
        self
    }

    /// The layer, or why it must not be: a config the ownership validator finds errors in for
    /// these methods and this ledger.
    pub fn build(self) -> Result<RetryLayer, RetryLayerError> {
        let plan = RetryPlan::new(
            GrpcRetryOwner::Channel,
            self.config,
            self.catalog,
            self.server_ledger,
        )
        .map_err(|unsafe_config| RetryLayerError::UnsafeConfig(unsafe_config.errors))?;
        let budget = self.budget.or_else(|| plan.budget().map(Arc::new));
        Ok(RetryLayer {
            shared: Arc::new(Shared {
                plan,
                budget,
                buffer_limit: self.buffer_limit,
                random: Mutex::new(jitter_source()),
                stats: self.stats,
                target: self.target,
                metrics: self.metrics,
                key_header: self.key_header,
            }),
        })
    }
}
