//! `cargo run -p grpc-ledger-demo`: keyed payments exactly once through lost responses.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use grpc_ledger_demo::{
    ClientOptions, ClientRetries, FaultOptions, faulty_service, run_client, run_demo_in,
};
use grpc_ledger_payments::{Store, open_store, serve};
use grpc_operation_ledger_seaorm::{Pooler, SeaOrmUnitsOfWork};
use grpc_tonic::{GuardMode, RetentionConfig};

/// Runs the payments service on a loopback port and a client that loses responses on purpose,
/// then reconciles the payments table against what the client was told.
#[derive(Debug, Parser)]
#[command(name = "grpc-ledger-demo")]
struct Args {
    /// Keyed payments to send.
    #[arg(long, default_value_t = 2000)]
    payments: u64,
    /// Payments in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Share of responses dropped after the server committed.
    #[arg(long, default_value_t = 0.3)]
    drop_rate: f64,
    /// Share of responses delayed past the client's deadline.
    #[arg(long, default_value_t = 0.02)]
    delay_rate: f64,
    /// The deadline of one payment, retries included, in milliseconds (each attempt is also
    /// limited by the service config's 0.5 s perAttemptRecvTimeout).
    #[arg(long, default_value_t = 3000)]
    deadline_ms: u64,
    /// Every n-th key is resent with a changed body (0: never).
    #[arg(long, default_value_t = 20)]
    changed_body_every: u64,
    /// A database server instead of the embedded SQLite file: PostgreSQL (`postgres://`, e.g.
    /// from `cargo xtask pg url`) or MariaDB (`mysql://` or `mariadb://` with a database name,
    /// e.g. from `cargo xtask mariadb url`).
    #[arg(long)]
    database_url: Option<String>,
    /// The PostgreSQL at `--database-url` is reached directly or through session pooling, never
    /// through a pooler in transaction pooling: statements are prepared once per connection and
    /// cached (faster; behind PgBouncer's `pool_mode = transaction` calls would fail as INTERNAL).
    /// Without it the statements work behind any pooler, and direct connections too.
    #[arg(long, requires = "database_url")]
    direct_connection: bool,
    /// When the guard writes the ledger row: `claim-first` (before the handler; safe for any
    /// handler) or `write-once` (once, finished, after the handler in the same transaction: for
    /// handlers whose every effect is in that transaction, as the demo's is).
    #[arg(long, value_enum, default_value_t = Mode::ClaimFirst)]
    mode: Mode,
    /// Who retries on the client: `channel` (the generated client over a RetryLayer built from
    /// the service config; an unknown outcome is resent under its key, which the server's ledger
    /// answers as a lookup) or `application` (a RetryExecutor that asks ResolvePayment first).
    #[arg(long, value_enum, default_value_t = Retries::Channel)]
    retries: Retries,
    /// The SQLite file (default: a fresh file in the temporary directory, removed afterwards).
    #[arg(long)]
    sqlite: Option<std::path::PathBuf>,
    /// Only serve, on this address, until killed (for fault tests that kill the server).
    #[arg(long, value_name = "ADDR", conflicts_with = "connect")]
    serve: Option<std::net::SocketAddr>,
    /// Only run the client, against a server at this address; reconcile from the same database.
    #[arg(long, value_name = "ADDR")]
    connect: Option<std::net::SocketAddr>,
    /// Names this run's keys and accounts (default: from the clock).
    #[arg(long)]
    run_id: Option<String>,
    /// How long the server keeps a finished operation's record, in seconds: a resend under its
    /// key within this window is answered from the record; later, it is a new payment.
    #[arg(long, default_value_t = 24 * 60 * 60)]
    retention_secs: u64,
    /// Seconds between the retention worker's passes (each jittered by up to a fifth).
    #[arg(long, default_value_t = 60)]
    retention_interval_secs: u64,
    /// Log events as JSON lines (on stderr) instead of text. Which events: `RUST_LOG` (default
    /// `warn`; `info` adds one line per replayed or refused call, with its method and caller).
    #[arg(long)]
    log_json: bool,
}

/// The transport crates, kept at `info` whatever `RUST_LOG` asks: at `debug` and `trace` they
/// log frames and connection details that are no operator's business and that could carry
/// metadata.
const TRANSPORT_CAP: [&str; 4] = ["h2=info", "hyper=info", "hyper_util=info", "tower=info"];

/// Installs the process's subscriber: `RUST_LOG` (default `warn`), text or JSON, on stderr so
/// that the report on stdout stays clean.
fn init_logging(json: bool) {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    for directive in TRANSPORT_CAP {
        filter = filter.add_directive(directive.parse().expect("a valid directive"));
    }
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// The client's retry owner on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Retries {
    Channel,
    Application,
}

impl From<Retries> for ClientRetries {
    fn from(retries: Retries) -> Self {
        match retries {
            Retries::Channel => ClientRetries::Channel,
            Retries::Application => ClientRetries::Application,
        }
    }
}

/// The guard's modes on the command line.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Mode {
    ClaimFirst,
    WriteOnce,
    ClaimCommittedFirst,
}

impl From<Mode> for GuardMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::ClaimFirst => GuardMode::ClaimFirst,
            Mode::WriteOnce => GuardMode::WriteOnceInTransactionOnly,
            Mode::ClaimCommittedFirst => GuardMode::ClaimCommittedFirst,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(args.log_json);
    let run_id = args.run_id.clone().unwrap_or_else(|| {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        format!("{millis:x}")
    });
    let temporary = std::env::temp_dir().join(format!("grpc-ledger-demo-{run_id}.sqlite"));
    let store = match (&args.database_url, &args.sqlite) {
        (Some(url), _) => Store::Server {
            url: url.clone(),
            pooler: if args.direct_connection {
                Pooler::None
            } else {
                Pooler::Unknown
            },
        },
        (None, Some(path)) => Store::Sqlite(path.clone()),
        (None, None) => Store::Sqlite(temporary.clone()),
    };
    let faults = FaultOptions {
        drop_rate: args.drop_rate,
        delay_rate: args.delay_rate,
    };
    let client = ClientOptions {
        payments: args.payments,
        concurrency: args.concurrency,
        deadline: Duration::from_millis(args.deadline_ms),
        changed_body_every: args.changed_body_every,
        run_id: run_id.clone(),
        progress: args.serve.is_none() && args.connect.is_none(),
        retries: args.retries.into(),
    };
    eprintln!("store: {store}");
    let outcome = match (args.serve, args.connect) {
        (Some(addr), _) => {
            let retention = RetentionConfig::new(Duration::from_secs(args.retention_secs))
                .with_interval(Duration::from_secs(args.retention_interval_secs.max(1)));
            serve_only(&store, args.mode.into(), faults, retention, addr, &run_id)
                .await
                .map(|()| None)
        }
        (None, Some(addr)) => connect_only(&store, addr, &client).await.map(Some),
        (None, None) => run_demo_in(args.mode.into(), &store, faults, &client)
            .await
            .map(Some),
    };
    if args.database_url.is_none() && args.sqlite.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", temporary.display()));
        }
    }
    match outcome {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some(report)) => {
            println!("{report}");
            if report.reconciled() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("grpc-ledger-demo: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Serves until interrupted or killed.
async fn serve_only(
    store: &Store,
    mode: GuardMode,
    faults: FaultOptions,
    retention: RetentionConfig,
    addr: std::net::SocketAddr,
    run_id: &str,
) -> anyhow::Result<()> {
    // A restarted server must not reuse a payment id of the process it replaces.
    let process = std::process::id();
    let prefix = format!("pay-{run_id}-{process}");
    let (_db, _config, service, _faults) =
        faulty_service(store, mode, faults, &retention, u64::from(process), &prefix).await?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let (stop_retention, retention_stopped) = tokio::sync::oneshot::channel::<()>();
    let retention = service.retention_worker(retention).spawn(async {
        let _ = retention_stopped.await;
    });
    let served = serve(listener, service, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    // The server has stopped taking calls: let the worker end its batch, then stop.
    let _ = stop_retention.send(());
    retention.await?;
    served
}

/// Runs the client against a server elsewhere and reconciles from the same database.
async fn connect_only(
    store: &Store,
    addr: std::net::SocketAddr,
    client: &ClientOptions,
) -> anyhow::Result<grpc_ledger_demo::DemoReport> {
    let (db, config) = open_store(store).await?;
    let units = SeaOrmUnitsOfWork::new(db.clone(), &config);
    let report = run_client(addr, client, &units).await?;
    db.close().await?;
    Ok(report)
}
