//! The demo: a payments service whose `CreatePayment` is a keyed mutation guarded by the ledger,
//! and a client that sends keyed payments through a fault layer that loses responses after the
//! server committed, delays some past the client's deadline, and resends some keys with a changed
//! body. At the end the payments table is reconciled against what the client was told.

pub mod pb {
    //! The generated protobuf and tonic code of `proto/payments.proto`.
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/payments.v1.rs"));
}

mod client;
mod server;

use std::fmt;
use std::time::Duration;

pub use client::{
    Client, ClientOptions, ClientRetries, LayeredClient, channel_config, layered_client, resolve,
    retry_settings, run_client, with_token,
};
pub use server::{
    Faults, PaymentsService, authenticate, insert_payment, load_payment, prepare_database,
};

// Every Rust block of the README compiles (and the adoption examples in `examples/` run in
// `cargo xtask test`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// The descriptor set of the demo's .proto, compiled by protox at build time.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/payments.pb"));

/// The service config (gRFC A6) the client's channel runs with.
pub const SERVICE_CONFIG: &str = include_str!("../service_config.json");

/// The bearer token the demo's single client authenticates with.
pub const DEMO_TOKEN: &str = "demo-client-token";

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

/// Where the demo keeps its ledger and payments.
#[derive(Debug, Clone)]
pub enum Store {
    /// An embedded SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A database server: PostgreSQL (`postgres://`), or MariaDB/MySQL (`mysql://`).
    Server {
        /// Its URL.
        url: String,
        /// What stands between the demo and PostgreSQL.
        pooler: grpc_operation_ledger_seaorm::Pooler,
    },
}

/// The faults the server injects after commit.
#[derive(Debug, Clone, Copy)]
pub struct FaultOptions {
    /// Share of responses dropped after the server committed.
    pub drop_rate: f64,
    /// Share of responses delayed past the client's deadline.
    pub delay_rate: f64,
}

/// Opens the store (creating the SQLite file, or applying the ledger's migrations on PostgreSQL)
/// and the demo's business table.
pub async fn open_store(
    store: &Store,
) -> anyhow::Result<(
    sea_orm::DatabaseConnection,
    grpc_operation_ledger_seaorm::LedgerConfig,
)> {
    use grpc_operation_ledger_seaorm::{
        LedgerConfig, connect_mysql, connect_postgres, open_sqlite,
    };

    let mut config = LedgerConfig::default().with_max_connections(32);
    let db = match store {
        Store::Sqlite(path) => open_sqlite(path, &config).await?,
        Store::Server { url, pooler } => {
            config.pooler = *pooler;
            let db = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
                connect_mysql(&url.replacen("mariadb://", "mysql://", 1), &config).await?
            } else {
                connect_postgres(url, &config).await?
            };
            grpc_operation_ledger_seaorm::migrate_with(&db, &config).await?;
            db
        }
    };
    prepare_database(&db).await?;
    Ok((db, config))
}

/// The payments service on `db`, its guard in `mode`, with the fault layer `faults` after each
/// commit.
pub fn service(
    db: &sea_orm::DatabaseConnection,
    config: &grpc_operation_ledger_seaorm::LedgerConfig,
    mode: grpc_tonic::GuardMode,
    faults: std::sync::Arc<Faults>,
    id_prefix: &str,
) -> anyhow::Result<PaymentsService> {
    // The demo hashes keys with a server secret, as a production deployment should.
    let hasher = grpc_core_api::KeyHasher::hmac_sha256(b"demo-server-secret-change-me-0123")?;
    let guard = grpc_tonic::KeyedMutationGuard::new(
        grpc_operation_ledger_seaorm::SeaOrmUnitsOfWork::new(db.clone(), config),
        grpc_tonic::GuardConfig::new(
            hasher,
            grpc_core_api::RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET)?,
        )
        // Write-once fits the demo's handler: its one effect is the payment row, in the unit.
        .with_mode(mode),
    );
    Ok(PaymentsService::new(guard, faults, id_prefix))
}

/// The delay the fault layer adds: past the service config's per-attempt limit
/// (`perAttemptRecvTimeout`, 0.5 s), within the call's deadline.
pub const INJECTED_DELAY: Duration = Duration::from_millis(600);

/// Serves `service` (the demo's, or another implementation of its API, as the benchmarks' baseline)
/// on `listener`, behind the demo's token check, until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: impl pb::payments_server::Payments,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        // The guard reads each call's method from its path, checked once here.
        .layer(grpc_tonic::MethodFromPathLayer)
        .add_service(pb::payments_server::PaymentsServer::with_interceptor(
            service,
            authenticate,
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await?;
    Ok(())
}

/// Starts the server on a loopback port, runs the client workload through the faults, reconciles
/// from the database, and stops the server.
pub async fn run_demo(
    store: &Store,
    faults: FaultOptions,
    client: &ClientOptions,
) -> anyhow::Result<DemoReport> {
    run_demo_in(grpc_tonic::GuardMode::ClaimFirst, store, faults, client).await
}

/// [`run_demo`] with the guard in `mode`.
pub async fn run_demo_in(
    mode: grpc_tonic::GuardMode,
    store: &Store,
    faults: FaultOptions,
    client: &ClientOptions,
) -> anyhow::Result<DemoReport> {
    let (db, config) = open_store(store).await?;
    let fault_layer = std::sync::Arc::new(Faults::new(
        faults.drop_rate,
        faults.delay_rate,
        INJECTED_DELAY,
        0x5eed_u64 ^ client.run_id.len() as u64,
    ));
    let service = service(
        &db,
        &config,
        mode,
        std::sync::Arc::clone(&fault_layer),
        &format!("pay-{}", client.run_id),
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, service, async {
        let _ = stopped.await;
    }));
    let units = grpc_operation_ledger_seaorm::SeaOrmUnitsOfWork::new(db.clone(), &config);
    let report = run_client(addr, client, &units).await;
    let _ = stop.send(());
    server.await??;
    let mut report = report?;
    report.dropped_responses = fault_layer
        .dropped
        .load(std::sync::atomic::Ordering::Relaxed);
    report.delayed_responses = fault_layer
        .delayed
        .load(std::sync::atomic::Ordering::Relaxed);
    db.close().await?;
    Ok(report)
}
