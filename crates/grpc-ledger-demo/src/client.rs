//! The client workload and the reconciliation.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use grpc_core_api::{IdempotencyKey, LedgerUnitsOfWork};
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::{CreatePaymentRequest, Payment};
use grpc_ledger_payments::{
    Client, LayeredClient, layered_client, resolve, retry_settings, statement, with_token,
};
use grpc_operation_ledger_seaorm::SeaOrmUnitsOfWork;
use grpc_tonic::{CommitObserver, IDEMPOTENCY_KEY_HEADER, RetryExecutor};
use sea_orm::ConnectionTrait;
use tokio::sync::Semaphore;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::DemoReport;

/// The workload.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How many keyed payments to send.
    pub payments: u64,
    /// How many in flight at once.
    pub concurrency: usize,
    /// The deadline of one payment, retries included.
    pub deadline: Duration,
    /// Every n-th acknowledged key is resent with a changed body (0: never).
    pub changed_body_every: u64,
    /// Names this run's keys and accounts, so reruns on one database stay apart.
    pub run_id: String,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Who retries the payments.
    pub retries: ClientRetries,
    /// Mutual TLS to the server (`--tls-dir`): the CA it trusts and the client's certificate;
    /// `None`: plain HTTP/2 with the demo's bearer token.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Who retries the client's payments: one owner, never both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRetries {
    /// The channel: the generated client over a [`RetryLayer`](grpc_tonic::RetryLayer) built from the service config. An
    /// unknown outcome is resolved by resending under the same key, which the server's ledger
    /// answers as a lookup.
    Channel,
    /// The application: each payment through a [`RetryExecutor`](grpc_tonic::RetryExecutor) with the same retry parameters,
    /// which asks the server's ResolvePayment what became of an unknown outcome before resending.
    Application,
}

/// One acknowledged payment: what the client was told.
pub(crate) struct Acknowledged {
    pub(crate) account: String,
    pub(crate) payment_id: String,
    /// The posting it made, when the service is chained to a postings service.
    pub(crate) posting_id: String,
}

/// Sends the workload to the server at `addr` and reconciles the result against the store of
/// `units`.
pub async fn run_client(
    addr: SocketAddr,
    options: &ClientOptions,
    units: &SeaOrmUnitsOfWork,
) -> Result<DemoReport> {
    let mut workload = send_payments(addr, options, &Arc::default()).await?;
    reconcile_until_reachable(
        units,
        &options.run_id,
        &workload.acknowledged,
        &mut workload.report,
    )
    .await?;
    Ok(workload.report)
}

/// What the client sent and was told, before any reconciliation.
pub(crate) struct Workload {
    /// The client's side of the report (reconciliation not yet done).
    pub(crate) report: DemoReport,
    /// The payments it was told succeeded.
    pub(crate) acknowledged: Vec<Acknowledged>,
    /// The numbers of the payments it was not (its key, account and body follow from the number).
    pub(crate) unacknowledged: Vec<u64>,
}

/// The client's channel and its retry owner for `options`, and the owner's counters.
async fn connect(
    addr: SocketAddr,
    options: &ClientOptions,
) -> Result<(Client, Retrier, Arc<grpc_tonic::ExecutorStats>)> {
    let channel = match &options.tls {
        None => Channel::from_shared(format!("http://{addr}"))?,
        Some(tls) => Channel::from_shared(format!("https://{addr}"))?.tls_config(tls.clone())?,
    }
    .connect()
    .await?;
    let client: Client = PaymentsClient::with_interceptor(
        CommitObserver::new(channel.clone()),
        with_token as fn(_) -> _,
    );
    let (retrier, stats) = match options.retries {
        ClientRetries::Channel => {
            let (layered, layer) = layered_client(channel, &addr.to_string())?;
            let stats = Arc::clone(layer.stats());
            (Retrier::Channel(layered), stats)
        }
        ClientRetries::Application => {
            let (settings, budget) = retry_settings()?;
            let executor = Arc::new(RetryExecutor::new(settings, budget));
            let stats = Arc::clone(executor.stats());
            (Retrier::Application(executor), stats)
        }
    };
    Ok((client, retrier, stats))
}

/// Sends the workload to the server at `addr`, counting finished payments in `finished`.
pub(crate) async fn send_payments(
    addr: SocketAddr,
    options: &ClientOptions,
    finished: &Arc<AtomicU64>,
) -> Result<Workload> {
    let (client, retrier, stats) = connect(addr, options).await?;
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = Vec::new();
    // indicatif draws only on a terminal: piped into a log or CI, stderr gets no frames.
    let bar = if options.progress {
        indicatif::ProgressBar::new(options.payments)
    } else {
        indicatif::ProgressBar::hidden()
    };
    for n in 0..options.payments {
        let permit = Arc::clone(&gate).acquire_owned().await?;
        let (client, retrier, task_options) = (client.clone(), retrier.clone(), options.clone());
        let (bar, finished) = (bar.clone(), Arc::clone(finished));
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let outcome = pay_once(n, client, &retrier, &task_options, true).await;
            bar.inc(1);
            finished.fetch_add(1, Ordering::Relaxed);
            outcome
        }));
    }
    let mut report = DemoReport {
        retries_owned_by: Some(options.retries),
        calls: options.payments,
        ..DemoReport::default()
    };
    let mut latencies = Vec::new();
    let mut acknowledged = Vec::new();
    let mut unacknowledged = Vec::new();
    for (n, task) in (0..).zip(tasks) {
        let outcome = task.await?;
        latencies.push(outcome.latency);
        match (outcome.acknowledged, outcome.failure) {
            (Some(ack), _) => acknowledged.push(ack),
            (None, failure) => {
                report.failed += 1;
                unacknowledged.push(n);
                let failure = failure.unwrap_or_else(|| "no status".to_owned());
                *report.failures.entry(failure).or_default() += 1;
            }
        }
        report.changed_body_refused += outcome.changed_body_refused;
        report.changed_body_accepted += outcome.changed_body_accepted;
    }
    bar.finish_and_clear();
    report.acknowledged = acknowledged.len() as u64;
    report.attempts = stats.attempts();
    report.retries = stats.retries();
    report.replays = stats.replays();
    report.resolved_first = stats.resolved_first();
    report.refused = stats.refusals().into_iter().collect();
    latencies.sort();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    report.p50 = percentile(0.50);
    report.p99 = percentile(0.99);
    Ok(Workload {
        report,
        acknowledged,
        unacknowledged,
    })
}

/// Resends the payments numbered `numbers` (same key, same body, `options.concurrency` at once),
/// each until it is answered or `within` has passed; the ones acknowledged.
pub(crate) async fn resend_until_answered(
    addr: SocketAddr,
    options: &ClientOptions,
    numbers: &[u64],
    within: Duration,
) -> Result<Vec<Acknowledged>> {
    if numbers.is_empty() {
        return Ok(Vec::new());
    }
    let (client, retrier, _) = connect(addr, options).await?;
    let until = Instant::now() + within;
    let gate = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = Vec::new();
    for &n in numbers {
        let permit = Arc::clone(&gate).acquire_owned().await?;
        let (client, retrier, options) = (client.clone(), retrier.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            loop {
                let outcome = pay_once(n, client.clone(), &retrier, &options, false).await;
                if outcome.acknowledged.is_some() || Instant::now() >= until {
                    return outcome.acknowledged;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    let mut acknowledged = Vec::new();
    for task in tasks {
        acknowledged.extend(task.await?);
    }
    Ok(acknowledged)
}

/// How long [`reconcile_until_reachable`] waits for the store. A Galera node that rejoins after a
/// kill refuses work until it has caught up with the cluster, and on two shared cores that took
/// longer than ten seconds (a fresh cluster's first sync takes about as long).
const RECONCILE_PATIENCE: Duration = Duration::from_secs(60);

/// [`reconcile`], waited for while the store is unreachable (it may be restarting, or rejoining
/// its cluster, under a fault test), for at most [`RECONCILE_PATIENCE`].
async fn reconcile_until_reachable(
    units: &SeaOrmUnitsOfWork,
    run_id: &str,
    acknowledged: &[Acknowledged],
    report: &mut DemoReport,
) -> Result<()> {
    let until = Instant::now() + RECONCILE_PATIENCE;
    while let Err(error) = reconcile(units, run_id, acknowledged, report).await {
        if Instant::now() >= until {
            return Err(error.context("reconciling from the database"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

struct PaymentOutcome {
    latency: Duration,
    acknowledged: Option<Acknowledged>,
    /// The status the client was left with, when not acknowledged: its code and message.
    failure: Option<String>,
    changed_body_refused: u64,
    changed_body_accepted: u64,
}

impl std::fmt::Display for ClientRetries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // As the demo's `--retries` flag names them.
        f.write_str(match self {
            Self::Channel => "channel",
            Self::Application => "application",
        })
    }
}

/// The payments' retry owner, ready to send.
#[derive(Clone)]
enum Retrier {
    Channel(LayeredClient),
    Application(Arc<RetryExecutor>),
}

impl Retrier {
    /// Sends `message` under `key` within `deadline`, retried by this owner.
    async fn create_payment(
        &self,
        client: &Client,
        message: CreatePaymentRequest,
        key: &IdempotencyKey,
        deadline: Duration,
    ) -> Result<tonic::Response<Payment>, Status> {
        let key_value: AsciiMetadataValue = key
            .expose()
            .parse()
            .map_err(|_| Status::invalid_argument("the key is not valid metadata"))?;
        match self {
            Self::Channel(layered) => {
                let mut request = Request::new(message);
                request
                    .metadata_mut()
                    .insert(IDEMPOTENCY_KEY_HEADER, key_value);
                request.set_timeout(deadline);
                layered.clone().create_payment(request).await
            }
            Self::Application(executor) => {
                executor
                    .call_keyed(
                        message,
                        key,
                        Some(deadline),
                        |request| {
                            let mut client = client.clone();
                            async move { client.create_payment(request).await }
                        },
                        || resolve(client.clone(), key_value.clone()),
                    )
                    .await
            }
        }
    }
}

/// Payment `n` of the run (its key, account and body follow from `n`); then, if `changed_body`
/// and `n` is due, a resend of its key with another body.
async fn pay_once(
    n: u64,
    client: Client,
    retrier: &Retrier,
    options: &ClientOptions,
    changed_body: bool,
) -> PaymentOutcome {
    let key_text = format!("{}-order-{n}", options.run_id);
    let key = IdempotencyKey::parse(&key_text).expect("demo keys are visible ASCII");
    let key_value: AsciiMetadataValue = key_text.parse().expect("demo keys are valid metadata");
    let account = format!("acct-{}-{n}", options.run_id);
    let message = CreatePaymentRequest {
        account: account.clone(),
        amount_minor: 100 + n as i64,
        labels: labels(n),
        ..CreatePaymentRequest::default()
    };
    let started = Instant::now();
    let answer = retrier
        .create_payment(&client, message.clone(), &key, options.deadline)
        .await;
    let latency = started.elapsed();
    let mut outcome = PaymentOutcome {
        latency,
        acknowledged: None,
        failure: None,
        changed_body_refused: 0,
        changed_body_accepted: 0,
    };
    let response = match answer {
        Ok(response) => response,
        Err(status) => {
            let message: String = status.message().chars().take(90).collect();
            outcome.failure = Some(format!("{:?}: {message}", status.code()));
            return outcome;
        }
    };
    let payment = response.into_inner();
    outcome.acknowledged = Some(Acknowledged {
        account,
        payment_id: payment.payment_id,
        posting_id: payment.posting_id,
    });
    if changed_body
        && options.changed_body_every > 0
        && n.is_multiple_of(options.changed_body_every)
    {
        let mut changed = Request::new(CreatePaymentRequest {
            amount_minor: message.amount_minor + 1,
            ..message
        });
        changed
            .metadata_mut()
            .insert(IDEMPOTENCY_KEY_HEADER, key_value);
        changed.set_timeout(Duration::from_secs(2));
        match client.clone().create_payment(changed).await {
            Err(status) if status.code() == Code::FailedPrecondition => {
                outcome.changed_body_refused = 1
            }
            Ok(_) => outcome.changed_body_accepted = 1,
            // A dropped response or a timeout is not an answer about the key; it says nothing.
            Err(_) => {}
        }
    }
    outcome
}

/// Every acknowledged payment must exist exactly once with the id the client was told; no account
/// of this run may have two payments.
///
/// It reads in a unit of work of the ledger's units, as every statement must behind a
/// transaction pooler.
pub(crate) async fn reconcile(
    units: &SeaOrmUnitsOfWork,
    run_id: &str,
    acknowledged: &[Acknowledged],
    report: &mut DemoReport,
) -> Result<()> {
    report.duplicates = 0;
    let pattern = format!("acct-{run_id}-%");
    let txn = units.begin().await?;
    let rows = txn
        .query_all_raw(statement(
            &txn,
            "SELECT payment_id, account FROM demo_payments WHERE account LIKE $1",
            vec![pattern.into()],
        ))
        .await?;
    units.commit(txn).await?;
    let mut ids = HashSet::new();
    let mut accounts = HashSet::new();
    for row in &rows {
        let id: String = row.try_get("", "payment_id")?;
        let account: String = row.try_get("", "account")?;
        ids.insert((id, account.clone()));
        if !accounts.insert(account) {
            report.duplicates += 1;
        }
    }
    report.payment_rows = rows.len() as u64;
    report.losses = acknowledged
        .iter()
        .filter(|ack| !ids.contains(&(ack.payment_id.clone(), ack.account.clone())))
        .count() as u64;
    Ok(())
}

/// Labels of payment `n`: enough entries that their order on the wire differs between attempts.
fn labels(n: u64) -> std::collections::HashMap<String, String> {
    [
        ("channel", "web".to_owned()),
        (
            "country",
            ["DE", "FR", "KR", "US"][(n % 4) as usize].to_owned(),
        ),
        ("order", format!("order-{n}")),
        ("campaign", format!("c-{}", n % 7)),
        ("device", "desktop".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}
