//! The guard's metrics (feature `opentelemetry`), read back from OpenTelemetry's in-memory
//! exporter: the keyed calls it answered without running the handler, by answer, and how long
//! each claim took.
#![cfg(feature = "opentelemetry")]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::{GrpcMethod, KeyHasher, OutcomeReference, RequestSchema};
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_tonic::{AuthenticatedPrincipal, Committed, GuardConfig, KeyedMutationGuard};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use support::{Writes, scripted};
use tokio::sync::Notify;
use tonic::{Code, Request};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

fn pay(amount: i64, key: &str) -> Request<Pay> {
    let mut request = Request::new(Pay { amount });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
    request
}

/// The answers counter by `grpc.ledger.answer`, and the number of claims timed, as exported.
fn exported(
    provider: &SdkMeterProvider,
    exporter: &InMemoryMetricExporter,
) -> (BTreeMap<String, u64>, u64) {
    provider.force_flush().unwrap();
    let finished = exporter.get_finished_metrics().unwrap();
    let latest = finished.last().expect("one export after the flush");
    let (mut answers, mut claims) = (BTreeMap::new(), 0);
    for metric in latest.scope_metrics().flat_map(|scope| scope.metrics()) {
        match (metric.name(), metric.data()) {
            ("grpc.server.ledger.answers", AggregatedMetrics::U64(MetricData::Sum(sum))) => {
                for point in sum.data_points() {
                    let labels: Vec<String> = point
                        .attributes()
                        .map(|kv| format!("{}={}", kv.key, kv.value))
                        .collect();
                    assert!(
                        labels.contains(&"grpc.method=payments.v1.Payments/CreatePayment".into()),
                        "{labels:?}"
                    );
                    let answer = point
                        .attributes()
                        .find(|kv| kv.key.as_str() == "grpc.ledger.answer")
                        .map(|kv| kv.value.to_string())
                        .expect("an answer label");
                    answers.insert(answer, point.value());
                }
            }
            (
                "grpc.server.ledger.claim_duration",
                AggregatedMetrics::F64(MetricData::Histogram(histogram)),
            ) => claims += histogram.data_points().map(|p| p.count()).sum::<u64>(),
            _ => {}
        }
    }
    (answers, claims)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guard_records_the_ledgers_answers_and_claim_latency() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    let guard = KeyedMutationGuard::new(
        InMemoryStore::new(Duration::from_millis(50)),
        GuardConfig::new(KeyHasher::Sha256, schema),
    )
    .with_meter(&provider.meter("grpc-safe-retries"));
    // `hold`: the handler says it runs (its claim is made), then waits to be released.
    type Hold = Option<(Arc<Notify>, Arc<Notify>)>;
    let run = |request: Request<Pay>, hold: Hold| {
        let guard = guard.clone();
        async move {
            guard
                .run(
                    &method(),
                    request,
                    scripted(
                        |_: Writes, message: Pay| async move {
                            if let Some((running, release)) = hold {
                                running.notify_one();
                                release.notified().await;
                            }
                            let id = format!("payment-{}", message.amount);
                            Ok(Committed {
                                outcome: OutcomeReference::parse(&id).unwrap(),
                                response: id,
                            })
                        },
                        |outcome| async move { Ok(outcome.as_str().to_owned()) },
                    ),
                )
                .await
        }
    };
    run(pay(1, "k-1"), None).await.unwrap();
    // A retry replays; the same key with another request is refused.
    run(pay(1, "k-1"), None).await.unwrap();
    assert_eq!(
        run(pay(2, "k-1"), None).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // A duplicate while the first is still running is told it is in flight.
    let (running, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let first = tokio::spawn(run(
        pay(3, "k-3"),
        Some((Arc::clone(&running), Arc::clone(&release))),
    ));
    running.notified().await;
    assert_eq!(
        run(pay(3, "k-3"), None).await.unwrap_err().code(),
        Code::Aborted
    );
    release.notify_one();
    first.await.unwrap().unwrap();

    let (answers, claims) = exported(&provider, &exporter);
    assert_eq!(
        answers,
        BTreeMap::from([
            ("in_flight".to_owned(), 1),
            ("key_reused".to_owned(), 1),
            ("replay".to_owned(), 1),
        ])
    );
    assert_eq!(claims, 5, "every guarded call's claim was timed");
}
