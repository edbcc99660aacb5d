//! The channel as the retry owner: gRFC A6 retries and hedging as a `tower` layer under a
//! generated tonic client, driven by a service config checked once as a
//! [`RetryPlan`](grpc_policy::RetryPlan) (ADR 0011).
//!
//! Each job has its module: `builder` (what a user sets, and the check), `service` (the tower
//! service and what every attempt of a call shares), `retry` (one attempt at a time under a
//! `retryPolicy`), `hedge` (copies under a `hedgingPolicy`), `attempt` (sending one attempt and
//! reading its end) and `replay` (the request body kept to send again).

mod attempt;
mod builder;
mod final_status;
mod hedge;
mod measured;
mod replay;
mod retry;
mod service;

use std::sync::Arc;

use grpc_policy::MethodCatalog;
use grpc_policy::ServiceConfig;

pub use self::builder::{DEFAULT_PER_CALL_BUFFER, RetryLayerBuilder, RetryLayerError};
pub use self::service::RetryService;
use self::service::Shared;
use crate::client::stats::ExecutorStats;

/// A6 retries and hedging for every call through a channel, as a `tower` layer: a generated
/// client gets them with no change at its call sites.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// use grpc_policy::{GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog};
/// use grpc_tonic::RetryLayer;
/// use tower::ServiceBuilder;
///
/// let config = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel).parse(r#"{
///   "methodConfig": [{"name": [{"service": "pkg.Svc"}],
///     "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
///                     "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#)?;
/// let catalog = MethodCatalog::new(); // from the service's descriptor set, in real use
/// let layer = RetryLayer::builder(config, catalog).build()?;
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051").connect_lazy();
/// let retrying = ServiceBuilder::new().layer(layer).service(channel);
/// // SvcClient::new(retrying): every call now retried as the config says.
/// # Ok(()) }
/// ```
///
/// For each call it finds the method's config (method, then service, then the default entry):
/// - `retryPolicy`: an attempt that failed with a status before its response head committed it
///   is judged by the policy of this crate (`grpc_policy::GrpcRetryEligibility`): the method's
///   class from the catalog, the status, the attempts, the deadline, the server's pushback and
///   the target's budget. The jittered backoff is A6's; `grpc-previous-rpc-attempts` is set.
/// - `hedgingPolicy`: up to `maxAttempts` copies, `hedgingDelay` apart (the next at once after
///   a non-fatal status); the first to commit or fail fatally is the answer, and the others are
///   cancelled. Only methods safe to repeat are hedged: reads, idempotent methods, and keyed
///   mutations that carry a key against a durable ledger.
/// - Transparent retries: an attempt that provably never reached the server application is sent
///   again without a token and without counting toward `maxAttempts`.
/// - The call's deadline is the earlier of the caller's `grpc-timeout` and the config's
///   `timeout`; each attempt tells the server what is left of it.
///
/// A6's commit point: once a response head without a status arrives (the server application
/// answered), the call is committed and the response is the caller's, whatever follows; the
/// budget counts the call's final status from its trailers. A request body over the per-call
/// buffer ([`DEFAULT_PER_CALL_BUFFER`]) commits the call too.
///
/// A keyed mutation's every attempt carries the caller's key: when the policy says "resolve
/// the completion first", the layer sends the call again under the same key, which a server
/// with a durable ledger answers as a lookup (the recorded outcome, or ABORTED while it is in
/// flight). Without a durable ledger such a call is not retried once sent.
#[derive(Debug, Clone)]
pub struct RetryLayer {
    shared: Arc<Shared>,
}

impl RetryLayer {
    /// Starts a layer configured by `config`, for the methods of `catalog` (a method the
    /// catalog lacks is non-idempotent: never retried once sent). The layer makes the channel
    /// the retry owner ([`GrpcRetryOwner::Channel`](grpc_policy::GrpcRetryOwner::Channel)): a
    /// channel whose retries another owner has (the application's executor, a mesh) gets no
    /// RetryLayer at all, so there is no owner to pass.
    pub fn builder(config: ServiceConfig, catalog: MethodCatalog) -> RetryLayerBuilder {
        RetryLayerBuilder::new(config, catalog)
    }

    /// What the layer has done, over every call.
    pub fn stats(&self) -> &Arc<ExecutorStats> {
        &self.shared.stats
    }
}

impl<S> tower_layer::Layer<S> for RetryLayer {
    type Service = RetryService<S>;

    fn layer(&self, inner: S) -> RetryService<S> {
        RetryService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
