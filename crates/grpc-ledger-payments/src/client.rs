//! The client's side of the payments wire: the token, the service config and the retry owner
//! (the channel's RetryLayer or the application's executor), and the resolve-first lookup.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use grpc_core_api::LedgerDurability;
use grpc_policy::{GrpcRetryBudget, GrpcRetryOwner, MethodCatalog, RetryPlan, ServiceConfig};
use grpc_tonic::{
    CommitObserver, IDEMPOTENCY_KEY_HEADER, Resolution, RetryLayer, RetryService, RetrySettings,
};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::pb::payments_client::PaymentsClient;
use crate::pb::resolve_payment_response::State;
use crate::pb::{Payment, ResolvePaymentRequest};
use crate::server::create_payment_method;
use crate::{DEMO_TOKEN, DESCRIPTOR_SET, SERVICE_CONFIG};

/// The generated client over a channel the executor can see A6's commit point through, with the
/// demo's token.
pub type Client = PaymentsClient<
    tonic::service::interceptor::InterceptedService<
        CommitObserver<Channel>,
        fn(Request<()>) -> Result<Request<()>, Status>,
    >,
>;

/// Adds the demo's bearer token, as its server's interceptor expects.
pub fn with_token(mut request: Request<()>) -> Result<Request<()>, Status> {
    let value: AsciiMetadataValue = format!("Bearer {DEMO_TOKEN}")
        .parse()
        .map_err(|_| Status::internal("token is not valid metadata"))?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

/// The demo's service config and the catalog of its methods (CreatePayment a keyed mutation, as
/// its .proto declares), as they are: whichever layer applies them checks them, once.
pub fn channel_config() -> Result<(ServiceConfig, MethodCatalog)> {
    let config = ServiceConfig::parse(SERVICE_CONFIG)?;
    let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET)?;
    Ok((config, catalog))
}

/// The executor's settings for the application owner: the service config's retry parameters for
/// CreatePayment and its throttling, planned for the application (its channel then runs without
/// them, so only one layer retries).
pub fn retry_settings() -> Result<(RetrySettings, Arc<GrpcRetryBudget>)> {
    let (config, catalog) = channel_config()?;
    let plan = RetryPlan::new(
        GrpcRetryOwner::Application,
        config,
        catalog,
        LedgerDurability::Durable,
    )?;
    let settings = RetrySettings::from_plan(&plan, &create_payment_method())
        .context("the service config has no retry policy for CreatePayment")?;
    let budget = plan
        .budget()
        .context("the service config has no retryThrottling")?;
    Ok((settings, Arc::new(budget)))
}

/// The generated client over the channel with a [`RetryLayer`] from the service config, and the
/// layer (for its counters).
pub fn layered_client(channel: Channel, target: &str) -> Result<(LayeredClient, RetryLayer)> {
    let (config, catalog) = channel_config()?;
    let layer = RetryLayer::builder(config, catalog)
        .server_ledger(LedgerDurability::Durable)
        .target(target)
        .build()?;
    let client = PaymentsClient::with_interceptor(
        tower_layer::Layer::layer(&layer, channel),
        with_token as fn(_) -> _,
    );
    Ok((client, layer))
}

/// The generated client over a channel whose retries a [`RetryLayer`] owns, with the demo's
/// token.
pub type LayeredClient = PaymentsClient<
    tonic::service::interceptor::InterceptedService<
        RetryService<Channel>,
        fn(Request<()>) -> Result<Request<()>, Status>,
    >,
>;

/// Asks the server what became of the payment with idempotency key `key` (the executor's
/// resolve-first lookup).
pub async fn resolve(
    mut client: Client,
    key: AsciiMetadataValue,
) -> Result<Resolution<Payment>, Status> {
    let mut request = Request::new(ResolvePaymentRequest {});
    request.metadata_mut().insert(IDEMPOTENCY_KEY_HEADER, key);
    request.set_timeout(Duration::from_secs(2));
    let answer = client.resolve_payment(request).await?.into_inner();
    Ok(match answer.state() {
        State::Committed => match answer.payment {
            Some(payment) => Resolution::Committed(payment),
            None => {
                return Err(Status::internal(
                    "a committed payment came without its payment",
                ));
            }
        },
        State::Failed => Resolution::Failed(Status::new(
            Code::from_i32(answer.failure_code),
            answer.failure_message,
        )),
        State::InProgress => {
            Resolution::InProgress(Duration::from_millis(answer.retry_after_ms.max(1) as u64))
        }
        State::NotFound => Resolution::NotFound,
        State::Unspecified => return Err(Status::internal("the server answered no state")),
    })
}
