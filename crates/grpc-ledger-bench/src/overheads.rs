//! What the client side costs apart from the store: the RetryLayer on a call that succeeds first
//! time, next to the bare channel's, and the request fingerprint next to SHA-256 of the raw
//! request bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use grpc_core_api::{GrpcMethod, RequestFingerprint, RequestSchema};
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::payments_server::Payments;
use grpc_ledger_payments::pb::{
    CreatePaymentRequest, Payment, ResolvePaymentRequest, ResolvePaymentResponse,
};
use grpc_ledger_payments::{DESCRIPTOR_SET, layered_client, serve, with_token};
use grpc_tonic::IDEMPOTENCY_KEY_HEADER;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::e2e::{CREATE_PAYMENT, bare_call, payment_request};
use crate::{Figure, Op, Plan, compared, figure, interleaved};

/// The demo's API with nothing behind it: every payment is answered at once, so that a client
/// stack's own cost per call is what differs.
struct Echo;

#[tonic::async_trait]
impl Payments for Echo {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let request = request.into_inner();
        Ok(Response::new(Payment {
            payment_id: "echo".to_owned(),
            account: request.account,
            amount_minor: request.amount_minor,
            ..Payment::default()
        }))
    }

    async fn resolve_payment(
        &self,
        _request: Request<ResolvePaymentRequest>,
    ) -> Result<Response<ResolvePaymentResponse>, Status> {
        Err(Status::unimplemented("the echo keeps nothing"))
    }
}

/// What the RetryLayer costs on a call that succeeds first time: the same CreatePayment to a
/// server that answers at once, through the bare generated client and through the client over
/// the layer (the demo's service config, CreatePayment keyed, the key on every call), both with
/// the config's 3 s deadline, at each client count of `plan`. The layer's p50 and throughput, each next to the bare channel's.
pub async fn retry_layer_overhead(plan: &Plan) -> Result<Vec<Figure>> {
    // Both clients send the same deadline: the service config's `timeout` (3 s), which the layer
    // sends on every attempt. A bare call without one would also spare the channel's and the
    // server's deadline timers, which the layer does not add.
    const DEADLINE: Duration = Duration::from_secs(3);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, Echo, std::future::pending()));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let bare = PaymentsClient::with_interceptor(channel.clone(), with_token as fn(_) -> _);
    let (layered, _) = layered_client(channel, &addr.to_string())?;
    let mut figures = Vec::new();
    for &clients in &plan.clients {
        let refused = Arc::new(AtomicU64::new(0));
        let (b, l) = (bare.clone(), layered.clone());
        let (rb, rl) = (Arc::clone(&refused), Arc::clone(&refused));
        let bare_op: Op = Arc::new(move |task, i| {
            let key = format!("echo-b-{task}-{i}");
            Box::pin(bare_call(b.clone(), key, Some(DEADLINE), Arc::clone(&rb)))
        });
        let layer_op: Op = Arc::new(move |task, i| {
            let key = format!("echo-l-{task}-{i}");
            Box::pin(bare_call(l.clone(), key, Some(DEADLINE), Arc::clone(&rl)))
        });
        let [base, through] = interleaved(clients, plan.seconds, [&bare_op, &layer_op]).await?;
        anyhow::ensure!(
            refused.load(Ordering::Relaxed) == 0,
            "the echo server refused calls: the overhead figure would not measure the layer"
        );
        let at = |what: &str| format!("retry layer {what} @{clients}");
        let base_p50 = figure(at("bare channel p50"), "ms", base.p50_ms);
        let base_ops = figure(at("bare channel ops/s"), "ops/s", base.ops_per_second);
        figures.extend([
            compared(at("RetryLayer p50"), "ms", through.p50_ms, &base_p50),
            compared(
                at("RetryLayer ops/s"),
                "ops/s",
                through.ops_per_second,
                &base_ops,
            ),
            base_p50,
            base_ops,
        ]);
        eprintln!("measured the RetryLayer's overhead at {clients} client(s)");
    }
    figures.extend(retry_layer_work(plan.fingerprint_ops).await?);
    Ok(figures)
}

/// An inner service that answers every request at once with a committed response: what is left
/// of a call when the network and the server are taken away.
#[derive(Clone)]
struct AnswersAtOnce;

impl tower_service::Service<http::Request<tonic::body::Body>> for AnswersAtOnce {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        drop(request);
        std::future::ready(Ok(http::Response::new(tonic::body::Body::empty())))
    }
}

/// The RetryLayer's own work per call (method lookup, body kept for a resend, head read, budget
/// wrapper), in process: the demo's CreatePayment request to [`AnswersAtOnce`], through the
/// layer and directly, `iterations` calls each; and through the layer with a meter, its A66 and
/// A96 instruments recording into an SDK pipeline, against the layer without one.
async fn retry_layer_work(iterations: u32) -> Result<Vec<Figure>> {
    use opentelemetry::metrics::MeterProvider;

    let builder = || -> Result<grpc_tonic::RetryLayerBuilder> {
        let (config, catalog) = grpc_ledger_payments::channel_config()?;
        Ok(grpc_tonic::RetryLayer::builder(config, catalog)
            .server_ledger(grpc_core_api::LedgerDurability::Durable)
            .target("in-process"))
    };
    let layer = builder()?.build()?;
    // Exported every minute (the default), so never during the run: what is measured is the
    // recording and the in-memory aggregation every reader does.
    let exporter = opentelemetry_sdk::metrics::InMemoryMetricExporter::default();
    let provider = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(exporter).build())
        .build();
    let metered = builder()?
        .meter(&provider.meter("grpc-ledger-bench"))
        .build()?;
    let body = prost::Message::encode_to_vec(&payment_request("order-42"));
    let request = || {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        http::Request::builder()
            .uri(format!("http://in-process{CREATE_PAYMENT}"))
            .header("te", "trailers")
            .header("content-type", "application/grpc")
            .header("grpc-timeout", "3000000u")
            .header(IDEMPOTENCY_KEY_HEADER, "order-42")
            .body(tonic::body::Body::new(http_body_util::Full::new(
                bytes::Bytes::from(framed),
            )))
    };
    let mut direct = AnswersAtOnce;
    let started = Instant::now();
    for _ in 0..iterations {
        let response = tower_service::Service::call(&mut direct, request()?).await?;
        std::hint::black_box(response);
    }
    let direct_ns = started.elapsed().as_nanos() as f64 / f64::from(iterations);
    let mut through = tower_layer::Layer::layer(&layer, AnswersAtOnce);
    let through_ns = nanos_per_call(&mut through, iterations, &request).await?;
    let mut through_metered = tower_layer::Layer::layer(&metered, AnswersAtOnce);
    let metered_ns = nanos_per_call(&mut through_metered, iterations, &request).await?;
    let direct_fig = figure(
        "retry layer in process: the inner service alone".into(),
        "ns",
        direct_ns,
    );
    let through_fig = compared(
        "retry layer in process: through the RetryLayer".into(),
        "ns",
        through_ns,
        &direct_fig,
    );
    let metered_fig = compared(
        "retry layer in process: with A66 and A96 metrics".into(),
        "ns",
        metered_ns,
        &through_fig,
    );
    Ok(vec![metered_fig, through_fig, direct_fig])
}

/// The time of one call through `service`, over `iterations` calls made one after another.
async fn nanos_per_call<S>(
    service: &mut S,
    iterations: u32,
    request: &impl Fn() -> http::Result<http::Request<tonic::body::Body>>,
) -> Result<f64>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
    S::Error: std::fmt::Display,
{
    let started = Instant::now();
    for _ in 0..iterations {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let response = service
            .call(request()?)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        std::hint::black_box(response);
    }
    Ok(started.elapsed().as_nanos() as f64 / f64::from(iterations))
}

/// The canonical request fingerprint of the demo's request (5 labels) against SHA-256 of its
/// encoded bytes, per request.
pub(crate) fn fingerprint_cost(iterations: u32) -> Result<Vec<Figure>> {
    let schema = RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET)?;
    let method = GrpcMethod::parse(CREATE_PAYMENT).context("the demo's method")?;
    let request = payment_request("order-42");
    let started = Instant::now();
    for _ in 0..iterations {
        std::hint::black_box(schema.fingerprint_message(&method, std::hint::black_box(&request))?);
    }
    let canonical = started.elapsed().as_nanos() as f64 / f64::from(iterations);
    let started = Instant::now();
    for _ in 0..iterations {
        let bytes = prost::Message::encode_to_vec(std::hint::black_box(&request));
        std::hint::black_box(RequestFingerprint::of(&bytes));
    }
    let raw = started.elapsed().as_nanos() as f64 / f64::from(iterations);
    let raw_fig = figure(
        "fingerprint: SHA-256 of the encoded request".into(),
        "ns",
        raw,
    );
    let canonical_fig = compared(
        "fingerprint: canonical, schema-aware".into(),
        "ns",
        canonical,
        &raw_fig,
    );
    Ok(vec![raw_fig, canonical_fig])
}
