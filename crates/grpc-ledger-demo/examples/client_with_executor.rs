//! The application owns retries: each keyed payment through a `RetryExecutor`, which asks the
//! server what became of an unknown outcome (its `ResolvePayment`, which reads the ledger) before
//! it sends anything again. The channel carries no retry policy, so only one layer retries.
//! Against the demo's server, which loses a third of its responses after committing.
//!
//! `cargo run -p grpc-ledger-demo --example client_with_executor`

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Result, ensure};
use grpc_core_api::{IdempotencyKey, LedgerDurability};
use grpc_ledger_demo::pb::payments_client::PaymentsClient;
use grpc_ledger_demo::pb::resolve_payment_response::State;
use grpc_ledger_demo::pb::{CreatePaymentRequest, Payment, ResolvePaymentRequest};
use grpc_policy::{CodeSet, GrpcRetryBudget, GrpcRetryOwner, RetryPolicy, RetryThrottling};
use grpc_tonic::{CommitObserver, Resolution, RetryExecutor, RetrySettings};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

#[path = "shared/demo_server.rs"]
mod demo_server;
use demo_server::DemoServer;

type Client = PaymentsClient<CommitObserver<Channel>>;

/// What became of the payment under `key`: the server's ResolvePayment, as a `Resolution`.
async fn resolve(mut client: Client, key: &str) -> Result<Resolution<Payment>, Status> {
    let mut request = Request::new(ResolvePaymentRequest {});
    with_auth(&mut request, key)?;
    let answer = client.resolve_payment(request).await?.into_inner();
    Ok(match answer.state() {
        State::Committed => Resolution::Committed(
            answer
                .payment
                .ok_or_else(|| Status::internal("committed without its payment"))?,
        ),
        State::Failed => Resolution::Failed(Status::new(
            Code::from_i32(answer.failure_code),
            answer.failure_message,
        )),
        State::InProgress => {
            Resolution::InProgress(Duration::from_millis(answer.retry_after_ms.max(1) as u64))
        }
        State::NotFound => Resolution::NotFound,
        State::Unspecified => return Err(Status::internal("no state")),
    })
}

fn with_auth<M>(request: &mut Request<M>, key: &str) -> Result<(), Status> {
    let invalid = |_| Status::invalid_argument("not valid metadata");
    let metadata = request.metadata_mut();
    metadata.insert(
        "authorization",
        "Bearer demo-client-token".parse().map_err(invalid)?,
    );
    metadata.insert("idempotency-key", key.parse().map_err(invalid)?);
    Ok(())
}

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
    // CommitObserver lets the executor see A6's commit point (response headers).
    let client: Client = PaymentsClient::new(CommitObserver::new(channel));

    let mut acknowledged = 0;
    for n in 0..100 {
        let key_text = format!("executor-order-{n}");
        let key = IdempotencyKey::parse(&key_text)?;
        let message = CreatePaymentRequest {
            account: format!("executor-{n}"),
            amount_minor: 100 + n,
            labels: Default::default(),
        };
        let answer = executor
            .call_keyed(
                message,
                &key,
                None,
                |mut request| {
                    let (mut client, key_text) = (client.clone(), key_text.clone());
                    async move {
                        with_auth(&mut request, &key_text)?;
                        client.create_payment(request).await
                    }
                },
                || resolve(client.clone(), &key_text),
            )
            .await;
        if answer.is_ok() {
            acknowledged += 1;
        }
    }
    let stats = executor.stats();
    let count = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    println!(
        "acknowledged {acknowledged}/100; attempts {}, resolved first {}, replays {}",
        count(&stats.attempts),
        count(&stats.resolved_first),
        count(&stats.replays),
    );
    ensure!(
        count(&stats.resolved_first) > 0,
        "lost responses were looked up"
    );
    ensure!(
        acknowledged == 100,
        "every payment acknowledged: a lookup is not an attempt"
    );
    server.stop();
    Ok(())
}
