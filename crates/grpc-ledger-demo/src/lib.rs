//! The demo: a payments service whose `CreatePayment` is a keyed mutation guarded by the ledger,
//! and a client that sends keyed payments through a fault layer that loses responses after the
//! server committed, delays some past the client's deadline, and resends some keys with a changed
//! body. At the end the payments table is reconciled against what the client was told.

mod chain;
mod client;
pub mod tls;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use grpc_ledger_payments::{Faults, PaymentsService, Store, open_store, serve, service};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmUnitsOfWork};
use grpc_tonic::{GuardMode, RetentionConfig};
use sea_orm::DatabaseConnection;

pub use chain::{
    ChainFaults, ChainReport, ChainStores, check_chain_mode, connect_chain, open_postings_store,
    payments_server, postings_server, run_chain,
};
pub use client::{ClientOptions, ClientRetries, run_client};

// Every Rust block of the README and of the guide compiles (and the adoption examples in
// `examples/` run in `cargo xtask test`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The guide's chapters (`docs/guide/src`), each a doc test as the README is.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../../docs/guide/src/adoption.md")]
    struct Adoption;
    #[doc = include_str!("../../../docs/guide/src/lint.md")]
    struct Lint;
    #[doc = include_str!("../../../docs/guide/src/ledger.md")]
    struct Ledger;
    #[doc = include_str!("../../../docs/guide/src/operating.md")]
    struct Operating;
    #[doc = include_str!("../../../docs/guide/src/adapters.md")]
    struct Adapters;
    #[doc = include_str!("../../../docs/guide/src/running.md")]
    struct Running;
    #[doc = include_str!("../../../docs/guide/src/requests.md")]
    struct Requests;
    #[doc = include_str!("../../../docs/guide/src/reliability.md")]
    struct Reliability;
    #[doc = include_str!("../../../docs/guide/src/performance.md")]
    struct Performance;
}

/// What a run did and what the database says about it.
#[derive(Debug, Default, Clone)]
pub struct DemoReport {
    /// Who owned the client's retries.
    pub retries_owned_by: Option<ClientRetries>,
    /// Payments the client asked for.
    pub calls: u64,
    /// Payments the client was told succeeded.
    pub acknowledged: u64,
    /// Payments that ended in an error for the client.
    pub failed: u64,
    /// Those failures by the status the client was left with (code and message).
    pub failures: std::collections::BTreeMap<String, u64>,
    /// Attempts sent.
    pub attempts: u64,
    /// Attempts after the first.
    pub retries: u64,
    /// Answers replayed from the ledger (by the server or through a resolution).
    pub replays: u64,
    /// Unknown outcomes resolved before deciding to resend.
    pub resolved_first: u64,
    /// Refusals to retry, by reason.
    pub refused: Vec<(grpc_policy::RefusalReason, u64)>,
    /// Responses the fault layer dropped after commit.
    pub dropped_responses: u64,
    /// Responses the fault layer delayed past the deadline.
    pub delayed_responses: u64,
    /// Keys resent with a changed body and refused with FAILED_PRECONDITION.
    pub changed_body_refused: u64,
    /// Keys resent with a changed body and (wrongly) accepted.
    pub changed_body_accepted: u64,
    /// Median and 99th percentile latency of a payment, retries included.
    pub p50: Duration,
    /// 99th percentile latency.
    pub p99: Duration,
    /// Payments rows of this run.
    pub payment_rows: u64,
    /// Accounts of this run with more than one payment row.
    pub duplicates: u64,
    /// Acknowledged payments whose row is missing, or whose ledger record disagrees.
    pub losses: u64,
}

impl DemoReport {
    /// Retries the budget refused.
    pub fn budget_throttled(&self) -> u64 {
        self.refused
            .iter()
            .filter(|(reason, _)| *reason == grpc_policy::RefusalReason::BudgetExhausted)
            .map(|(_, count)| count)
            .sum()
    }

    /// Whether reconciliation found nothing wrong.
    pub fn reconciled(&self) -> bool {
        self.duplicates == 0 && self.losses == 0 && self.changed_body_accepted == 0
    }
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows: Vec<(&str, String)> = vec![
            (
                "client retries owned by",
                self.retries_owned_by
                    .map_or_else(String::new, |owner| owner.to_string()),
            ),
            ("calls", self.calls.to_string()),
            ("acknowledged", self.acknowledged.to_string()),
            ("failed (client saw an error)", self.failed.to_string()),
            ("attempts", self.attempts.to_string()),
            ("retries", self.retries.to_string()),
            ("replays", self.replays.to_string()),
            ("resolved first", self.resolved_first.to_string()),
            ("budget throttled", self.budget_throttled().to_string()),
            (
                "responses dropped after commit",
                self.dropped_responses.to_string(),
            ),
            (
                "responses delayed past deadline",
                self.delayed_responses.to_string(),
            ),
            (
                "changed body refused (FAILED_PRECONDITION)",
                self.changed_body_refused.to_string(),
            ),
            (
                "changed body accepted",
                self.changed_body_accepted.to_string(),
            ),
            ("latency p50", format!("{:.1?}", self.p50)),
            ("latency p99", format!("{:.1?}", self.p99)),
            ("payments rows", self.payment_rows.to_string()),
            ("duplicates", self.duplicates.to_string()),
            ("losses", self.losses.to_string()),
        ];
        writeln!(f, "{:<44} {:>10}", "", "")?;
        for (name, value) in rows {
            writeln!(f, "{name:<44} {value:>10}")?;
        }
        for (reason, count) in &self.refused {
            writeln!(f, "{:<44} {count:>10}", format!("refused: {reason}"))?;
        }
        for (code, count) in &self.failures {
            writeln!(f, "failed with {code}: {count}")?;
        }
        let verdict = if self.reconciled() {
            "OK: every acknowledged payment exactly once"
        } else {
            "FAILED"
        };
        write!(f, "{:<44} {verdict:>10}", "reconciliation")
    }
}

/// The faults the server injects after commit.
#[derive(Debug, Clone, Copy)]
pub struct FaultOptions {
    /// Share of responses dropped after the server committed.
    pub drop_rate: f64,
    /// Share of responses delayed past the client's deadline.
    pub delay_rate: f64,
}

/// The delay the fault layer adds: past the service config's per-attempt limit
/// (`perAttemptRecvTimeout`, 0.5 s), within the call's deadline.
pub const INJECTED_DELAY: Duration = Duration::from_millis(600);

/// Starts the server on a loopback port, runs the client workload through the faults, reconciles
/// from the database, and stops the server.
pub async fn run_demo(
    store: &Store,
    faults: FaultOptions,
    client: &ClientOptions,
) -> anyhow::Result<DemoReport> {
    run_demo_in(GuardMode::ClaimFirst, store, faults, client).await
}

/// The payments service on `store`, its guard in `mode`, with the demo's fault layer (seeded
/// with `seed`) after each commit, payment ids under `id_prefix`, and `retention`'s window told
/// to clients in every ResolvePayment answer: what both a whole run and `--serve` put behind
/// their port. Also the connection and the ledger's configuration, for the
/// reconciliation, and the fault layer, for its counts.
pub async fn faulty_service(
    store: &Store,
    mode: GuardMode,
    faults: FaultOptions,
    retention: &RetentionConfig,
    seed: u64,
    id_prefix: &str,
) -> anyhow::Result<(
    DatabaseConnection,
    LedgerConfig,
    PaymentsService,
    Arc<Faults>,
)> {
    let (db, config) = open_store(store).await?;
    let fault_layer = Arc::new(Faults::new(
        faults.drop_rate,
        faults.delay_rate,
        INJECTED_DELAY,
        seed,
    ));
    let service = service(&db, &config, mode, Arc::clone(&fault_layer), id_prefix)?
        .with_retention(retention.retention);
    Ok((db, config, service, fault_layer))
}

/// How long the demo server keeps a finished operation, and how often it purges older ones: a day,
/// every minute (`--retention-secs`, `--retention-interval-secs`). A client must not resend a key
/// later than this: past it the key is forgotten and a resend is a new payment.
pub fn demo_retention() -> RetentionConfig {
    RetentionConfig::new(Duration::from_secs(24 * 60 * 60)).with_interval(Duration::from_secs(60))
}

/// [`run_demo`] with the guard in `mode`.
pub async fn run_demo_in(
    mode: GuardMode,
    store: &Store,
    faults: FaultOptions,
    client: &ClientOptions,
) -> anyhow::Result<DemoReport> {
    let seed = 0x5eed_u64 ^ client.run_id.len() as u64;
    let prefix = format!("pay-{}", client.run_id);
    let retention = demo_retention();
    let (db, config, service, fault_layer) =
        faulty_service(store, mode, faults, &retention, seed, &prefix).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (stop_retention, retention_stopped) = tokio::sync::oneshot::channel::<()>();
    // Beside the server, as a deployment runs it (the run is far shorter than the window).
    let retention = service.retention_worker(retention).spawn(async {
        let _ = retention_stopped.await;
    });
    let server = tokio::spawn(serve(listener, service, async {
        let _ = stopped.await;
    }));
    let units = SeaOrmUnitsOfWork::new(db.clone(), &config);
    let report = run_client(addr, client, &units).await;
    let _ = stop.send(());
    let _ = stop_retention.send(());
    server.await??;
    retention.await?;
    let mut report = report?;
    report.dropped_responses = fault_layer.dropped.load(Ordering::Relaxed);
    report.delayed_responses = fault_layer.delayed.load(Ordering::Relaxed);
    db.close().await?;
    Ok(report)
}
