//! The metrics, read back from OpenTelemetry's in-memory exporter: gRFC A96's per-call retry
//! metrics and A66's attempt and call instruments from the RetryLayer (labelled as A66 says), and
//! the retention worker's. (The guard's own are read back in `grpc-tonic/tests/guard_metrics.rs`.)

use std::collections::BTreeMap;
use std::time::Duration;

use grpc_core_api::{GrpcMethod, KeyHasher, OutcomeReference, RequestSchema};
use grpc_interop_tests::raw_h2::{raw_server, refuse_first};
use grpc_interop_tests::{DESCRIPTOR_SET, METHOD, ProbeServer, lazy_channel, pb};
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_policy::{GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog};
use grpc_tonic::{GuardConfig, KeyedMutationGuard, RetryLayer};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tonic::Code;

/// A meter provider whose every data point can be read back.
struct Recorded {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

/// One data point: its labels (`name=value`, sorted) and its value (a sum or an integer gauge's
/// value, a histogram's count and sum, or a float gauge's value second).
type Points = BTreeMap<String, Vec<(Vec<String>, (u64, f64))>>;

impl Recorded {
    fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Self { provider, exporter }
    }

    fn meter(&self) -> opentelemetry::metrics::Meter {
        self.provider.meter("grpc-safe-retries")
    }

    /// The bucket boundaries of the histogram `name` in the last export.
    fn boundaries(&self, name: &str) -> Vec<f64> {
        self.provider.force_flush().unwrap();
        let finished = self.exporter.get_finished_metrics().unwrap();
        let latest = finished.last().expect("one export after the flush");
        for metric in latest.scope_metrics().flat_map(|scope| scope.metrics()) {
            if metric.name() != name {
                continue;
            }
            return match metric.data() {
                AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                    .data_points()
                    .next()
                    .map(|p| p.bounds().collect())
                    .unwrap_or_default(),
                AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                    .data_points()
                    .next()
                    .map(|p| p.bounds().collect())
                    .unwrap_or_default(),
                other => panic!("{name} is not a histogram: {other:?}"),
            };
        }
        panic!("no metric {name}")
    }

    /// Every metric's points, by name.
    fn points(&self) -> Points {
        self.provider.force_flush().unwrap();
        let mut points = Points::new();
        let finished = self.exporter.get_finished_metrics().unwrap();
        let latest = finished.last().expect("one export after the flush");
        for scope in latest.scope_metrics() {
            for metric in scope.metrics() {
                let entry = points.entry(metric.name().to_owned()).or_default();
                let labels = |attributes: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                    let mut labels: Vec<String> = attributes
                        .map(|kv| format!("{}={}", kv.key, kv.value))
                        .collect();
                    labels.sort();
                    labels
                };
                match metric.data() {
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            entry.push((labels(&mut p.attributes()), (p.count(), p.sum() as f64)));
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        for p in h.data_points() {
                            entry.push((labels(&mut p.attributes()), (p.count(), p.sum())));
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Sum(s)) => {
                        for p in s.data_points() {
                            entry.push((labels(&mut p.attributes()), (p.value(), 0.0)));
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Gauge(g)) => {
                        for p in g.data_points() {
                            entry.push((labels(&mut p.attributes()), (p.value(), 0.0)));
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Gauge(g)) => {
                        for p in g.data_points() {
                            entry.push((labels(&mut p.attributes()), (0, p.value())));
                        }
                    }
                    other => panic!("unexpected data for {}: {other:?}", metric.name()),
                }
            }
        }
        points
    }
}

fn layer(config: &str, recorded: &Recorded, target: &str) -> RetryLayer {
    let config = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel)
        .parse(config)
        .unwrap();
    let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET).unwrap();
    RetryLayer::builder(config, catalog)
        .target(target)
        .meter(&recorded.meter())
        .build()
        .unwrap()
}

fn client(
    addr: std::net::SocketAddr,
    layer: &RetryLayer,
) -> pb::probe_client::ProbeClient<grpc_tonic::RetryService<tonic::transport::Channel>> {
    let channel = lazy_channel(addr);
    pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(layer, channel))
}

fn probe(call_id: &str, script: &str) -> pb::ProbeRequest {
    pb::ProbeRequest {
        call_id: call_id.to_owned(),
        script: script.to_owned(),
        request_id: String::new(),
    }
}

const LABELS: [&str; 2] = ["grpc.method=interop.v1.Probe/Call", "grpc.target=probe"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_layer_records_a96_retry_metrics() {
    let recorded = Recorded::new();
    let server = ProbeServer::start().await;
    let retrying = layer(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.02s", "maxBackoff": "0.1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
        &recorded,
        "probe",
    );
    let mut retried = client(server.addr(), &retrying);
    retried
        .call(probe("twice", "fail UNAVAILABLE 2"))
        .await
        .unwrap();
    retried.call(probe("first-time", "ok")).await.unwrap();
    // A stream the server refuses is resent transparently.
    let (refusing, _) = raw_server(refuse_first).await;
    client(refusing, &retrying)
        .call(probe("refused", "ok"))
        .await
        .unwrap();
    let hedging = layer(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
        &recorded,
        "probe",
    );
    client(server.addr(), &hedging)
        .call(probe("hedged", "delay 200"))
        .await
        .unwrap();

    let points = recorded.points();
    let labels: Vec<String> = LABELS.iter().map(|l| l.to_string()).collect();
    // A96: a call without retries reports no 0; two calls retried (2 and 0 of them transparent).
    assert_eq!(
        points["grpc.client.call.retries"],
        [(labels.clone(), (1, 2.0))],
        "one call with two retries"
    );
    assert_eq!(
        points["grpc.client.call.transparent_retries"],
        [(labels.clone(), (1, 1.0))]
    );
    assert_eq!(
        points["grpc.client.call.hedges"],
        [(labels.clone(), (1, 2.0))]
    );
    let (delay_labels, (delays, seconds)) = &points["grpc.client.call.retry_delay"][0];
    assert_eq!(delay_labels, &labels);
    assert_eq!(
        *delays, 3,
        "the retried, the transparently retried and the hedged call"
    );
    // Two backoffs (0.02 s and 0.04 s, jittered by ±20%) and a 10 ms pause before the
    // transparent resend; hedged copies leave no gap with nothing in flight.
    assert!((0.045..0.5).contains(seconds), "retry delay {seconds} s");

    // A96's recommended bucket boundaries (and A66's latency buckets for the delay).
    assert_eq!(
        recorded.boundaries("grpc.client.call.retries"),
        [1.0, 2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(
        recorded.boundaries("grpc.client.call.hedges"),
        [1.0, 2.0, 3.0, 4.0, 5.0]
    );
    assert_eq!(
        recorded.boundaries("grpc.client.call.transparent_retries"),
        [1.0, 2.0, 3.0, 4.0, 5.0, 10.0]
    );
    let latency = recorded.boundaries("grpc.client.call.retry_delay");
    assert_eq!(latency.len(), 41);
    assert_eq!((latency[0], latency[1], latency[40]), (0.0, 0.00001, 100.0));
}

/// gRFC A66's instruments: every attempt started (transparent resends included), each attempt's
/// duration with the status it ended with, and each call's with the status its caller got, the
/// answered ones once their trailers arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_layer_records_a66_attempt_and_call_metrics() {
    let recorded = Recorded::new();
    let server = ProbeServer::start().await;
    let retrying = layer(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
        &recorded,
        "probe",
    );
    let mut retried = client(server.addr(), &retrying);
    retried
        .call(probe("twice", "fail UNAVAILABLE 2"))
        .await
        .unwrap();
    let refused = retried
        .call(probe("invalid", "fail INVALID_ARGUMENT 1"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let (refusing, _) = raw_server(refuse_first).await;
    client(refusing, &retrying)
        .call(probe("refused", "ok"))
        .await
        .unwrap();
    // Three copies in flight; the first answers, and the two that lost end CANCELLED.
    let hedging = layer(
        r#"{"methodConfig": [{"name": [{"service": "interop.v1.Probe"}], "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.02s", "nonFatalStatusCodes": ["UNAVAILABLE"]}}]}"#,
        &recorded,
        "probe",
    );
    client(server.addr(), &hedging)
        .call(probe("hedged", "delay 300"))
        .await
        .unwrap();

    // The losing copies' tasks are aborted when the call returns, and dropped by the runtime a
    // moment later: wait until all 9 attempts have ended.
    let ended = |points: &Points| -> u64 {
        points
            .get("grpc.client.attempt.duration")
            .map_or(0, |points| points.iter().map(|(_, (count, _))| count).sum())
    };
    let mut points = recorded.points();
    for _ in 0..100 {
        if ended(&points) == 9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        points = recorded.points();
    }
    let labels: Vec<String> = LABELS.iter().map(|l| l.to_string()).collect();
    let with_status = |status: &str| {
        let mut labels = labels.clone();
        labels.push(format!("grpc.status={status}"));
        labels.sort();
        labels
    };
    assert_eq!(
        points["grpc.client.attempt.started"],
        [(labels.clone(), (9, 0.0))],
        "3 attempts, 1, a refused stream resent transparently, and 3 hedged copies"
    );
    let counts = |name: &str| -> BTreeMap<Vec<String>, u64> {
        points[name]
            .iter()
            .map(|(labels, (count, _))| (labels.clone(), *count))
            .collect()
    };
    assert_eq!(
        counts("grpc.client.attempt.duration"),
        BTreeMap::from([
            (with_status("CANCELLED"), 2),
            (with_status("INVALID_ARGUMENT"), 1),
            (with_status("OK"), 3),
            (with_status("UNAVAILABLE"), 3),
        ])
    );
    assert_eq!(
        counts("grpc.client.call.duration"),
        BTreeMap::from([(with_status("INVALID_ARGUMENT"), 1), (with_status("OK"), 3)])
    );
    // The retried call took its two backoffs (10 ms and 20 ms, jittered by ±20%) at least.
    let (_, (_, ok_seconds)) = points["grpc.client.call.duration"]
        .iter()
        .find(|(labels, _)| labels.contains(&"grpc.status=OK".to_owned()))
        .unwrap();
    assert!(*ok_seconds > 0.024, "call durations {ok_seconds} s");
    for name in ["grpc.client.attempt.duration", "grpc.client.call.duration"] {
        let latency = recorded.boundaries(name);
        assert_eq!(latency.len(), 41, "{name}");
        assert_eq!((latency[0], latency[1], latency[40]), (0.0, 0.00001, 100.0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_worker_records_rows_purged_and_how_each_pass_ended() {
    use grpc_tonic::RetentionConfig;

    let recorded = Recorded::new();
    let store = InMemoryStore::new(Duration::from_millis(50));
    for n in 0..5 {
        claim_in(&store, &format!("k-{n}"), 30_000, true).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let config = GuardConfig::new(
        KeyHasher::Sha256,
        RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET).unwrap(),
    );
    let worker = KeyedMutationGuard::new(store, config)
        .retention_worker(
            RetentionConfig::new(Duration::from_millis(10))
                .with_batch(std::num::NonZeroU32::new(2).unwrap())
                .with_max_batches(2),
        )
        .with_meter(&recorded.meter());
    assert!(
        worker.run_once().await.unwrap().backlogged,
        "4 of 5, rows left"
    );
    assert!(!worker.run_once().await.unwrap().backlogged, "the last one");

    let points = recorded.points();
    let (_, (purged, _)) = &points["grpc.server.ledger.purged"][0];
    assert_eq!(*purged, 5);
    let passes: BTreeMap<String, u64> = points["grpc.server.ledger.retention.passes"]
        .iter()
        .map(|(labels, (value, _))| (labels.join(","), *value))
        .collect();
    assert_eq!(
        passes,
        BTreeMap::from([
            ("grpc.ledger.retention.outcome=backlogged".to_owned(), 1),
            ("grpc.ledger.retention.outcome=complete".to_owned(), 1),
        ])
    );
}

/// The census gauges, from the retention worker's census after each pass: operations in progress
/// (one of them with its lease run out), the oldest one's age, and what purge has yet to delete,
/// falling to zero as the passes catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_worker_reports_the_ledger_census_as_gauges() {
    use grpc_tonic::RetentionConfig;

    let recorded = Recorded::new();
    let store = InMemoryStore::new(Duration::from_millis(50));
    for n in 0..5 {
        claim_in(&store, &format!("done-{n}"), 30_000, true).await;
    }
    claim_in(&store, "running", 30_000, false).await;
    claim_in(&store, "dead", 1, false).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let config = GuardConfig::new(
        KeyHasher::Sha256,
        RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET).unwrap(),
    );
    let worker = KeyedMutationGuard::new(store, config)
        .retention_worker(
            RetentionConfig::new(Duration::from_millis(10))
                .with_batch(std::num::NonZeroU32::new(2).unwrap())
                .with_max_batches(1),
        )
        .with_meter(&recorded.meter());
    let gauge = |points: &Points, name: &str| -> (u64, f64) {
        let values = &points[name];
        assert_eq!(values.len(), 1, "{name}: one unlabelled point");
        values[0].1
    };

    worker.run_once().await.unwrap();
    let points = recorded.points();
    assert_eq!(gauge(&points, "grpc.server.ledger.in_progress").0, 2);
    assert_eq!(gauge(&points, "grpc.server.ledger.expired_leases").0, 1);
    assert_eq!(
        gauge(&points, "grpc.server.ledger.past_retention").0,
        3,
        "5 past, 2 purged"
    );
    let oldest = gauge(&points, "grpc.server.ledger.oldest_in_progress.age").1;
    assert!(oldest > 0.0 && oldest < 60.0, "{oldest} s");

    worker.run_once().await.unwrap();
    worker.run_once().await.unwrap();
    let points = recorded.points();
    assert_eq!(
        gauge(&points, "grpc.server.ledger.past_retention").0,
        0,
        "purge caught up"
    );
    assert_eq!(
        gauge(&points, "grpc.server.ledger.in_progress").0,
        2,
        "never purged"
    );
}

/// Claims `key` on `store` with a lease of `lease_ms`, committed; finished as committed too when
/// `finish` says so.
async fn claim_in(store: &InMemoryStore, key: &str, lease_ms: u64, finish: bool) {
    use grpc_core_api::{
        CallerFingerprint, ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger,
        IdempotencyKey, LeaseDuration, RequestFingerprint,
    };
    let identity = GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant"),
        GrpcMethod::parse(METHOD).unwrap(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    );
    let unit = store.begin_unit();
    let ledger = unit.ledger();
    let lease = LeaseDuration::new(Duration::from_millis(lease_ms)).unwrap();
    let ClaimOutcome::Claimed { version, .. } = ledger
        .claim(&identity, &RequestFingerprint::of(b"r"), lease)
        .await
        .unwrap()
    else {
        panic!("a fresh claim");
    };
    if finish {
        let done = Completion::Committed(OutcomeReference::parse("done").unwrap());
        ledger
            .mark_finished(&identity, version, &done)
            .await
            .unwrap();
    }
    unit.commit_unit();
}
