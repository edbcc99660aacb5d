//! The channel owns retries: a generated client over a `RetryLayer` built from a validated
//! service config, with no change at the call sites. Against the demo's server, which loses a
//! third of its responses after committing, 100 keyed payments: an unknown outcome is resent
//! under the same key, and the server's ledger answers the resend as a lookup.
//!
//! `cargo run -p grpc-ledger-demo --example client_with_retry_layer`

use std::time::Duration;

use anyhow::{Result, ensure};
use grpc_core_api::LedgerDurability;
use grpc_ledger_payments::pb::CreatePaymentRequest;
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::{DESCRIPTOR_SET, SERVICE_CONFIG};
use grpc_policy::{GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog};
use grpc_tonic::RetryLayer;
use tonic::Request;
use tower::ServiceBuilder;

#[tokio::main]
async fn main() -> Result<()> {
    let server = DemoServer::start("layer-example").await?;
    let addr = server.addr;

    // The config the channel runs with, checked against the service's own descriptor set, whose
    // .proto declares CreatePayment a keyed mutation ((grpc_safe_retries.v1.keyed_mutation)).
    let config = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel).parse(SERVICE_CONFIG)?;
    let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET)?;
    let layer = RetryLayer::builder(config, catalog)
        .server_ledger(LedgerDurability::Durable) // refused for keyed mutations otherwise
        .target(format!("http://{addr}"))
        .build()?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client =
        PaymentsClient::new(ServiceBuilder::new().layer(layer.clone()).service(channel));

    let mut acknowledged = 0;
    for n in 0..100 {
        let mut request = Request::new(CreatePaymentRequest {
            account: format!("layer-{n}"),
            amount_minor: 100 + n,
            ..Default::default()
        });
        let metadata = request.metadata_mut();
        metadata.insert("authorization", "Bearer demo-client-token".parse()?);
        metadata.insert("idempotency-key", format!("layer-order-{n}").parse()?);
        request.set_timeout(Duration::from_secs(3));
        if client.create_payment(request).await.is_ok() {
            acknowledged += 1;
        }
    }
    let stats = layer.stats();
    println!(
        "acknowledged {acknowledged}/100; attempts {}, retries {}, resolved by resending under the key {}, replays {}",
        stats.attempts(),
        stats.retries(),
        stats.resolved_first(),
        stats.replays(),
    );
    ensure!(
        stats.replays() > 0,
        "lost responses were answered from the ledger"
    );
    ensure!(acknowledged >= 90, "nearly every payment acknowledged");
    server.stop();
    Ok(())
}

#[path = "shared/demo_server.rs"]
mod demo_server;
use demo_server::DemoServer;
