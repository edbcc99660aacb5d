//! What the guard and the executor cost per gRPC call: the demo's `CreatePayment` over tonic on
//! loopback, its handler inserting one payment row, measured in six variants in one run:
//! - an unguarded handler (the baseline: the same insert in its own unit of work);
//! - the same with its unit in a task of its own, as the guard runs a unit (the task's cost,
//!   apart from the ledger);
//! - the ledger without the guard: that task running the guarded unit's statements, the claim
//!   and its transition called on the adapter directly (the statements' cost in this process,
//!   apart from the guard's own work);
//! - the guarded handler claim-first (claim, insert, transition, commit) and write-once (insert,
//!   one record of the finished operation, commit);
//! - the claim-first handler called through the `RetryExecutor` instead of the bare generated
//!   client.
//!
//! The variants run interleaved, each for half its time in one order and half in the reverse
//! order ([`interleaved`]), so that a drift of the machine during the run does not land on one
//! variant: in runs where they ran one after another for their whole time, the baseline at 8
//! clients moved by 40% between runs while the guarded call did not.
//!
//! Plus the request fingerprint's cost next to SHA-256 of the raw request bytes, and the
//! RetryLayer's cost on a call that succeeds first time, next to the bare channel's.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, KeyHasher,
    LeaseDuration, LedgerUnitsOfWork, OutcomeReference, RequestFingerprint,
};
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::payments_server::Payments;
use grpc_ledger_payments::pb::{
    CreatePaymentRequest, Payment, ResolvePaymentRequest, ResolvePaymentResponse,
};
use grpc_ledger_payments::{
    Client, Faults, insert_payment, resolve, retry_settings, serve, with_token,
};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmUnitsOfWork};
use grpc_tonic::{CommitObserver, GuardMode, IDEMPOTENCY_KEY_HEADER, RetryExecutor};
use sea_orm::DatabaseConnection;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::{Figure, Measured, Op, Plan, compared, figure, interleaved};

pub(crate) const CREATE_PAYMENT: &str = "/payments.v1.Payments/CreatePayment";

/// How a baseline handler runs its unit of work.
#[derive(Clone, Copy, PartialEq, Eq)]
enum UnitShape {
    /// The business insert in a unit of its own, on the request's task: the baseline.
    Inline,
    /// The same unit in a task of its own under a time bound, as the guard runs every guarded
    /// unit (`to_the_end`): what that task costs a call, apart from the ledger.
    InATask,
    /// The guarded unit's statements without the guard: in a task of its own, the ledger's claim
    /// of the call's identity, the business insert and the claim's transition, called on the
    /// adapter directly. What the ledger's statements cost a call in this process, apart from
    /// the guard's own work (the schema-aware fingerprint, its checks, tracing and metrics).
    LedgerInATask,
}

/// The demo's API without the guard: the business insert in a unit of work shaped as `shape`
/// says, and with [`UnitShape::LedgerInATask`] the ledger's statements around it.
struct Unguarded {
    units: Arc<SeaOrmUnitsOfWork>,
    /// The payment ids' prefix, one for each variant and client count: all of them write to the
    /// same table.
    ids: String,
    next_id: AtomicU64,
    shape: UnitShape,
    /// The guarded service's key hasher, so that the key is hashed as the guard hashes it.
    hasher: KeyHasher,
}

/// The unguarded unit: the payment inserted in a unit of work of its own.
async fn insert_in_a_unit(units: &SeaOrmUnitsOfWork, payment: &Payment) -> Result<(), Status> {
    let txn = units.begin().await.map_err(Status::from)?;
    insert_payment(&txn, payment)
        .await
        .map_err(|_| Status::unavailable("the payments store failed"))?;
    units.commit(txn).await.map_err(Status::from)
}

/// The guarded unit's statements, called on the adapter without the guard: claim `identity`,
/// insert the payment, finish the claim with the payment's id as its outcome, commit. A call
/// whose claim finds the identity taken is refused as ABORTED (the bench sends fresh keys only).
async fn insert_under_a_claim(
    units: &SeaOrmUnitsOfWork,
    identity: &GrpcOperationIdentity,
    request: &RequestFingerprint,
    payment: &Payment,
) -> Result<(), Status> {
    let lease = LeaseDuration::new(Duration::from_secs(30)).expect("a valid lease");
    let txn = units.begin().await.map_err(Status::from)?;
    let ledger = units.ledger(&txn);
    let ClaimOutcome::Claimed { version, .. } = ledger
        .claim(identity, request, lease)
        .await
        .map_err(Status::from)?
    else {
        return Err(Status::aborted("the identity was already claimed"));
    };
    insert_payment(&txn, payment)
        .await
        .map_err(|_| Status::unavailable("the payments store failed"))?;
    let outcome = OutcomeReference::parse(&payment.payment_id)
        .map_err(|_| Status::internal("a payment id is not an outcome reference"))?;
    ledger
        .mark_committed(identity, version, &outcome)
        .await
        .map_err(Status::from)?;
    drop(ledger);
    units.commit(txn).await.map_err(Status::from)
}

/// The operation identity of a call to [`Unguarded`] with [`UnitShape::LedgerInATask`]: one
/// caller, the demo's method, the key header hashed with `hasher`.
fn identity_of(
    request: &Request<CreatePaymentRequest>,
    hasher: &KeyHasher,
) -> Result<GrpcOperationIdentity, Status> {
    let key = request
        .metadata()
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|key| IdempotencyKey::parse(key).ok())
        .ok_or_else(|| Status::invalid_argument("a keyed call needs its key"))?;
    Ok(GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"bench-caller"),
        GrpcMethod::parse(CREATE_PAYMENT).expect("the demo's method"),
        hasher.hash(&key),
    ))
}

#[tonic::async_trait]
impl Payments for Unguarded {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let identity = match self.shape {
            UnitShape::LedgerInATask => Some(identity_of(&request, &self.hasher)?),
            UnitShape::Inline | UnitShape::InATask => None,
        };
        let request = request.into_inner();
        // The request's fingerprint as the ledger keeps it, of its encoded bytes: the cheap one,
        // so that the guard's schema-aware fingerprint stays among the guard's own costs.
        let claim = identity.map(|identity| {
            let encoded = prost::Message::encode_to_vec(&request);
            (identity, RequestFingerprint::of(&encoded))
        });
        let payment = Payment {
            payment_id: format!(
                "{}-{}",
                self.ids,
                self.next_id.fetch_add(1, Ordering::Relaxed)
            ),
            account: request.account,
            amount_minor: request.amount_minor,
            ..Payment::default()
        };
        if self.shape == UnitShape::Inline {
            insert_in_a_unit(&self.units, &payment).await?;
            return Ok(Response::new(payment));
        }
        let units = Arc::clone(&self.units);
        let unit = async move {
            match claim {
                Some((identity, fingerprint)) => {
                    insert_under_a_claim(&units, &identity, &fingerprint, &payment).await?
                }
                None => insert_in_a_unit(&units, &payment).await?,
            }
            Ok::<_, Status>(payment)
        };
        let bounded = tokio::spawn(tokio::time::timeout(Duration::from_secs(30), unit));
        match bounded.await {
            Ok(Ok(answer)) => answer.map(Response::new),
            Ok(Err(_)) => Err(Status::unavailable("the unit outlived its time bound")),
            Err(_) => Err(Status::internal("the unit's task failed")),
        }
    }

    async fn resolve_payment(
        &self,
        _request: Request<ResolvePaymentRequest>,
    ) -> Result<Response<ResolvePaymentResponse>, Status> {
        Err(Status::unimplemented("the baseline keeps no ledger"))
    }
}

/// A server on a loopback port and a client of it; the server stops accepting calls when this is
/// dropped, so that the services of one client count, and the pool they hold, end with it.
pub(crate) struct LoopbackServer {
    client: Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Serves `service` on a loopback port until the returned [`LoopbackServer`] is dropped.
pub(crate) async fn serve_on_loopback(service: impl Payments) -> Result<LoopbackServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // The sender is never used: its drop ends the wait.
    tokio::spawn(serve(listener, service, async {
        let _ = stopped.await;
    }));
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok(LoopbackServer {
        client: PaymentsClient::with_interceptor(
            CommitObserver::new(channel),
            with_token as fn(_) -> _,
        ),
        _stop: stop,
    })
}

/// The demo's request shape: an account, an amount and five labels.
pub(crate) fn payment_request(key: &str) -> CreatePaymentRequest {
    let labels: HashMap<String, String> = [
        ("channel", "web"),
        ("country", "DE"),
        ("order", key),
        ("campaign", "c-3"),
        ("device", "desktop"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    CreatePaymentRequest {
        account: format!("acct-{key}"),
        amount_minor: 100,
        labels,
        ..CreatePaymentRequest::default()
    }
}

/// One call by the bare client with a fresh key.
///
/// A call the server refuses as busy or in flight (UNAVAILABLE, ABORTED: SQLite's one writer at a
/// time can keep a unit waiting past its busy timeout under 32 writers) is counted in `refused`,
/// not retried, and does not stop the measurement.
pub(crate) async fn bare_call<T>(
    mut client: PaymentsClient<T>,
    key: String,
    deadline: Option<Duration>,
    refused: Arc<AtomicU64>,
) -> Result<()>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut request = Request::new(payment_request(&key));
    let value: AsciiMetadataValue = key.parse()?;
    request.metadata_mut().insert(IDEMPOTENCY_KEY_HEADER, value);
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    match client.create_payment(request).await {
        Ok(_) => Ok(()),
        Err(status) if matches!(status.code(), Code::Unavailable | Code::Aborted) => {
            refused.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(status) => Err(status.into()),
    }
}

/// One call through the executor with a fresh key, as the demo's client makes it (its service
/// config: Channel owner, a 0.5 s limit per attempt, keyed mutation resolved first when an
/// attempt's outcome is unknown, through the server's ResolvePayment).
///
/// A call the executor gives up on (its 10 s deadline passed, or the last attempt was refused
/// as busy or in flight: SQLite's one writer at a time is not fair to 32 writers on two busy
/// cores) is counted in `gave_up` and does not stop the measurement, as the bare calls' refusals.
async fn executor_call(
    client: Client,
    executor: Arc<RetryExecutor>,
    key: String,
    gave_up: Arc<AtomicU64>,
) -> Result<()> {
    let idempotency_key = IdempotencyKey::parse(&key)?;
    let key_value: AsciiMetadataValue = key.parse()?;
    let answer = executor
        .call_keyed(
            payment_request(&key),
            &idempotency_key,
            Some(Duration::from_secs(10)),
            |request| {
                let mut client = client.clone();
                async move { client.create_payment(request).await }
            },
            || resolve(client.clone(), key_value.clone()),
        )
        .await;
    match answer {
        Ok(_) => Ok(()),
        Err(status)
            if matches!(
                status.code(),
                Code::DeadlineExceeded | Code::Unavailable | Code::Aborted
            ) =>
        {
            gave_up.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(status) => Err(status.into()),
    }
}

/// The end-to-end figures at `clients` clients, each variant served by a server of its own on
/// `db` for this count only: the caller sizes `db`'s pool to the count, as the write units'.
pub(crate) async fn end_to_end(
    label: &str,
    db: &DatabaseConnection,
    config: &LedgerConfig,
    clients: usize,
    plan: &Plan,
) -> Result<Vec<Figure>> {
    grpc_ledger_payments::prepare_database(db).await?;
    let units = Arc::new(SeaOrmUnitsOfWork::new(db.clone(), config));
    let hasher = grpc_ledger_payments::key_hasher()?;
    let baseline = |variant: &str, shape: UnitShape| Unguarded {
        units: Arc::clone(&units),
        ids: format!("{variant}-{clients}"),
        next_id: AtomicU64::new(1),
        shape,
        hasher: hasher.clone(),
    };
    let unguarded = serve_on_loopback(baseline("u", UnitShape::Inline)).await?;
    let unguarded_in_a_task = serve_on_loopback(baseline("t", UnitShape::InATask)).await?;
    let ledger_without_guard = serve_on_loopback(baseline("l", UnitShape::LedgerInATask)).await?;
    let no_faults = Arc::new(Faults::new(0.0, 0.0, Duration::ZERO, 1));
    let run = std::process::id();
    let guarded = serve_on_loopback(grpc_ledger_payments::service(
        db,
        config,
        GuardMode::ClaimFirst,
        Arc::clone(&no_faults),
        &format!("g-{label}-{clients}-{run}"),
    )?)
    .await?;
    let write_once = serve_on_loopback(grpc_ledger_payments::service(
        db,
        config,
        GuardMode::WriteOnceInTransactionOnly,
        no_faults,
        &format!("w-{label}-{clients}-{run}"),
    )?)
    .await?;
    let (settings, budget) = retry_settings()?;
    let executor = Arc::new(RetryExecutor::new(settings, budget));
    let mut figures = Vec::new();
    let tag = |variant: &str| format!("{label}-{variant}-{clients}-{run}");
    let bare = |client: &Client, variant: &str, refused: &Arc<AtomicU64>| -> Op {
        let (client, prefix, refused) = (client.clone(), tag(variant), Arc::clone(refused));
        Arc::new(move |task, i| {
            Box::pin(bare_call(
                client.clone(),
                format!("{prefix}-{task}-{i}"),
                None,
                Arc::clone(&refused),
            ))
        })
    };
    let refused: [Arc<AtomicU64>; 6] = Default::default();
    let (client, prefix, through) = (guarded.client.clone(), tag("e"), Arc::clone(&executor));
    let gave_up = Arc::clone(&refused[5]);
    let via_executor: Op = Arc::new(move |task, i| {
        Box::pin(executor_call(
            client.clone(),
            Arc::clone(&through),
            format!("{prefix}-{task}-{i}"),
            Arc::clone(&gave_up),
        ))
    });
    let [base, tasked, bare_ledger, keyed, once, executed] = interleaved(
        clients,
        plan.seconds,
        [
            &bare(&unguarded.client, "u", &refused[0]),
            &bare(&unguarded_in_a_task.client, "t", &refused[3]),
            &bare(&ledger_without_guard.client, "l", &refused[4]),
            &bare(&guarded.client, "g", &refused[1]),
            &bare(&write_once.client, "w", &refused[2]),
            &via_executor,
        ],
    )
    .await?;
    let at = |what: &str| format!("e2e {label} {what} @{clients}");
    let base_fig = figure(at("unguarded ops/s"), "ops/s", base.ops_per_second);
    // Each throughput of a variant next to its baseline in the same run.
    let rate = |what: &str, of: &Measured, baseline: &Figure| {
        compared(at(what), "ops/s", of.ops_per_second, baseline)
    };
    let keyed_fig = rate("guarded ops/s", &keyed, &base_fig);
    let tasked_fig = rate("unguarded in a task ops/s", &tasked, &base_fig);
    let keyed_vs_tasked = rate("guarded vs unguarded in a task ops/s", &keyed, &tasked_fig);
    let bare_ledger_fig = rate("ledger without the guard ops/s", &bare_ledger, &base_fig);
    let keyed_vs_bare_ledger = rate(
        "guarded vs ledger without the guard ops/s",
        &keyed,
        &bare_ledger_fig,
    );
    let once_fig = rate("guarded write-once ops/s", &once, &base_fig);
    let once_vs_claim_first = rate("write-once vs claim-first ops/s", &once, &keyed_fig);
    let executed_fig = rate("guarded via executor ops/s", &executed, &keyed_fig);
    let base_p50 = figure(at("unguarded p50"), "ms", base.p50_ms);
    let keyed_p50 = compared(at("guarded p50"), "ms", keyed.p50_ms, &base_p50);
    figures.extend([
        base_fig,
        keyed_fig,
        tasked_fig,
        keyed_vs_tasked,
        bare_ledger_fig,
        keyed_vs_bare_ledger,
        once_fig,
        once_vs_claim_first,
        executed_fig,
        base_p50,
        keyed_p50,
        figure(at("unguarded p99"), "ms", base.p99_ms),
        figure(at("guarded p99"), "ms", keyed.p99_ms),
        figure(at("guarded via executor p50"), "ms", executed.p50_ms),
        figure(at("guarded write-once p50"), "ms", once.p50_ms),
    ]);
    for (counted, refused) in [
        "unguarded refused busy",
        "guarded refused busy",
        "guarded write-once refused busy",
        "unguarded in a task refused busy",
        "ledger without the guard refused busy",
        "guarded via executor given up",
    ]
    .into_iter()
    .zip(&refused)
    {
        let count = refused.load(Ordering::Relaxed) as f64;
        figures.push(figure(at(counted), "calls", count));
    }
    eprintln!("measured end to end on {label} at {clients} client(s)");
    Ok(figures)
}
