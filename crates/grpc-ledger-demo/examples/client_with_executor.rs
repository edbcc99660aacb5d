//! The application owns retries: each keyed payment through a `RetryExecutor`, which asks the
//! server what became of an unknown outcome (its `ResolvePayment`, which reads the ledger) before
//! it sends anything again. The channel carries no retry policy, so only one layer retries.
//! Against the demo's server, which loses a third of its responses after committing.
//!
//! `cargo run -p grpc-ledger-demo --example client_with_executor`

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use grpc_core_api::{IdempotencyKey, LedgerDurability};
use grpc_ledger_payments::pb::CreatePaymentRequest;
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::{Client, resolve, with_token};
use grpc_policy::{CodeSet, GrpcRetryBudget, GrpcRetryOwner, RetryPolicy, RetryThrottling};
use grpc_tonic::{CommitObserver, RetryExecutor, RetrySettings};
use tonic::Code;
use tonic::metadata::AsciiMetadataValue;

#[path = "shared/demo_server.rs"]
mod demo_server;
use demo_server::DemoServer;

#[tokio::main]
async fn main() -> Result<()> {
    let server = DemoServer::start("executor-example").await?;
    // The retry parameters, owned by the application (the channel's service config has none).
    let policy = RetryPolicy::new(
        5,
        Duration::from_millis(10),
        Duration::from_millis(200),
        2.0,
        CodeSet::of(&[Code::Unavailable, Code::DeadlineExceeded, Code::Aborted]),
    )?;
    let settings = RetrySettings::new(GrpcRetryOwner::Application, policy)
        .with_server_ledger(LedgerDurability::Durable)
        .with_call_timeout(Duration::from_secs(3));
    // One budget per target, shared by every executor calling it.
    let budget = Arc::new(GrpcRetryBudget::new(&RetryThrottling::new(100, 1.0)?));
    let executor = RetryExecutor::new(settings, budget);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))?
        .connect()
        .await?;
    // CommitObserver lets the executor see A6's commit point (response headers); the demo's
    // interceptor adds its bearer token.
    let client: Client =
        PaymentsClient::with_interceptor(CommitObserver::new(channel), with_token as fn(_) -> _);

    let mut acknowledged = 0;
    for n in 0..100 {
        let key_text = format!("executor-order-{n}");
        let key = IdempotencyKey::parse(&key_text)?;
        let key_value: AsciiMetadataValue = key_text.parse()?;
        let message = CreatePaymentRequest {
            account: format!("executor-{n}"),
            amount_minor: 100 + n,
            ..Default::default()
        };
        let answer = executor
            .call_keyed(
                message,
                &key,
                None,
                // Every attempt carries the key; the executor sets it.
                |request| {
                    let mut client = client.clone();
                    async move { client.create_payment(request).await }
                },
                // The lookup: the server's ResolvePayment, as a `Resolution`.
                || resolve(client.clone(), key_value.clone()),
            )
            .await;
        if answer.is_ok() {
            acknowledged += 1;
        }
    }
    let stats = executor.stats();
    println!(
        "acknowledged {acknowledged}/100; attempts {}, resolved first {}, replays {}",
        stats.attempts(),
        stats.resolved_first(),
        stats.replays(),
    );
    ensure!(stats.resolved_first() > 0, "lost responses were looked up");
    ensure!(
        acknowledged == 100,
        "every payment acknowledged: a lookup is not an attempt"
    );
    server.stop();
    Ok(())
}
