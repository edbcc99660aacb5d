//! `cargo run -p grpc-ledger-demo`: keyed payments exactly once through lost responses.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use std::sync::Arc;

use anyhow::Context;
use grpc_ledger_demo::tls::TlsDir;
use grpc_ledger_demo::{
    ChainFaults, ChainStores, ClientOptions, ClientRetries, FaultOptions, INJECTED_DELAY,
    check_chain_mode, connect_chain, faulty_service, payments_server, postings_server, run_chain,
    run_client, run_demo_in,
};
use grpc_ledger_payments::{Faults, Store, UnitFailures, open_store, serve, serve_mtls};
use grpc_operation_ledger_seaorm::{Pooler, SeaOrmUnitsOfWork};
use grpc_tonic::testing::AfterCommitFaults;
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
    /// Chain the payments service to a postings service (each with its own guard and store):
    /// every payment posts once, inside its unit of work, under a key derived from the payment's
    /// operation. Faults strike both hops, payments fail after their posting committed, and each
    /// server is killed once mid-run; both stores are reconciled, and the postings whose payment
    /// never committed are settled by the client's resends under the same keys.
    #[arg(long)]
    chain: bool,
    /// The postings service's database server (as `--database-url`; default: an SQLite file of
    /// its own, `--postings-sqlite`).
    #[arg(long, requires = "chain")]
    postings_database_url: Option<String>,
    /// The postings service's SQLite file (default: a fresh file in the temporary directory,
    /// removed afterwards).
    #[arg(long, requires = "chain")]
    postings_sqlite: Option<std::path::PathBuf>,
    /// Share of the postings' responses lost after the posting committed.
    #[arg(long, default_value_t = 0.2)]
    postings_drop_rate: f64,
    /// Share of the postings' streams reset after the posting committed.
    #[arg(long, default_value_t = 0.05)]
    postings_reset_rate: f64,
    /// Share of payments whose unit fails (rolls back) after their posting committed.
    #[arg(long, default_value_t = 0.1)]
    fail_after_posting_rate: f64,
    /// Do not kill the servers of a chained run.
    #[arg(long, requires = "chain")]
    no_kill: bool,
    /// Only serve the postings service of a chain, on this address, until killed.
    #[arg(long, value_name = "ADDR", requires = "chain", conflicts_with_all = ["serve", "connect"])]
    serve_postings: Option<std::net::SocketAddr>,
    /// The postings server the payments server of a chain (`--serve`) posts to.
    #[arg(long, value_name = "ADDR", requires = "serve")]
    postings_at: Option<std::net::SocketAddr>,
    /// Mutual TLS for `--serve` and `--connect`: the server requires a client certificate signed
    /// by the directory's CA and names each caller by its SPIFFE ID (its URI SAN under
    /// `spiffe://grpc-ledger-demo/`) instead of the demo's token; the client presents its own.
    /// Files: ca.pem, server.pem, server.key, client.pem, client.key (`--make-tls-dir` writes
    /// them).
    #[arg(long, value_name = "DIR", conflicts_with = "chain")]
    tls_dir: Option<std::path::PathBuf>,
    /// Writes a fresh CA, a server certificate for `localhost` and a client certificate into
    /// DIR, for `--tls-dir`, then exits.
    #[arg(long, value_name = "DIR", exclusive = true)]
    make_tls_dir: Option<std::path::PathBuf>,
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
    if let Some(dir) = &args.make_tls_dir {
        return match TlsDir::make(dir) {
            Ok(_) => {
                println!(
                    "wrote a CA, a server certificate (localhost) and a client certificate \
                     (spiffe://grpc-ledger-demo/client) into {}",
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("grpc-ledger-demo: {error:#}");
                ExitCode::from(2)
            }
        };
    }
    let run_id = args.run_id.clone().unwrap_or_else(|| {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        format!("{millis:x}")
    });
    let temporary = std::env::temp_dir().join(format!("grpc-ledger-demo-{run_id}.sqlite"));
    let postings_temporary =
        std::env::temp_dir().join(format!("grpc-ledger-demo-{run_id}-postings.sqlite"));
    let pooler = if args.direct_connection {
        Pooler::None
    } else {
        Pooler::Unknown
    };
    let store = store_of(&args.database_url, &args.sqlite, &temporary, pooler);
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
        tls: None,
    };
    eprintln!("store: {store}");
    let outcome = if args.chain {
        let stores = ChainStores {
            payments: store,
            postings: store_of(
                &args.postings_database_url,
                &args.postings_sqlite,
                &postings_temporary,
                pooler,
            ),
        };
        eprintln!("postings store: {}", stores.postings);
        run_chained(&args, &stores, faults, &client, &run_id).await
    } else {
        run_single(&args, &store, faults, &client, &run_id).await
    };
    for (url, file, path) in [
        (&args.database_url, &args.sqlite, &temporary),
        (
            &args.postings_database_url,
            &args.postings_sqlite,
            &postings_temporary,
        ),
    ] {
        if url.is_none() && file.is_none() {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
    match outcome {
        Ok(None) => ExitCode::SUCCESS,
        Ok(Some((report, reconciled))) => {
            println!("{report}");
            if reconciled {
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

/// A store from the command line: the database server at `url`, else the SQLite `file`, else
/// the `temporary` SQLite file.
fn store_of(
    url: &Option<String>,
    file: &Option<std::path::PathBuf>,
    temporary: &std::path::Path,
    pooler: Pooler,
) -> Store {
    match (url, file) {
        (Some(url), _) => Store::Server {
            url: url.clone(),
            pooler,
        },
        (None, Some(path)) => Store::Sqlite(path.clone()),
        (None, None) => Store::Sqlite(temporary.to_path_buf()),
    }
}

/// What a run printed, and whether it reconciled (`None` for a server that only served).
type Outcome = anyhow::Result<Option<(String, bool)>>;

/// The single service: a whole run, its server alone, or its client alone.
async fn run_single(
    args: &Args,
    store: &Store,
    faults: FaultOptions,
    client: &ClientOptions,
    run_id: &str,
) -> Outcome {
    let apart = args.serve.is_some() || args.connect.is_some();
    // A process apart reconciles from, or serves, the store the other process uses: a temporary
    // file is each process's own, and reconciling against an empty one reports every payment lost.
    if apart && args.database_url.is_none() && args.sqlite.is_none() {
        anyhow::bail!(
            "--serve and --connect run in two processes that must share their store: name it in \
             both (--database-url URL or --sqlite FILE)"
        );
    }
    let tls = match &args.tls_dir {
        Some(_) if !apart => anyhow::bail!(
            "--tls-dir secures the network between --serve and --connect; a whole run in one \
             process has none"
        ),
        dir => dir.as_ref().map(TlsDir::new),
    };
    let report = match (args.serve, args.connect) {
        (Some(addr), _) => {
            let retention = RetentionConfig::new(Duration::from_secs(args.retention_secs))
                .with_interval(Duration::from_secs(args.retention_interval_secs.max(1)));
            let mode = args.mode.into();
            serve_only(store, mode, faults, retention, addr, run_id, tls).await?;
            return Ok(None);
        }
        (None, Some(addr)) => {
            let client = ClientOptions {
                tls: tls.map(|dir| dir.client()).transpose()?,
                ..client.clone()
            };
            connect_only(store, addr, &client).await?
        }
        (None, None) => run_demo_in(args.mode.into(), store, faults, client).await?,
    };
    Ok(Some((report.to_string(), report.reconciled())))
}

/// The chain: a whole run, one of its servers alone (each until killed), or its client alone.
async fn run_chained(
    args: &Args,
    stores: &ChainStores,
    faults: FaultOptions,
    client: &ClientOptions,
    run_id: &str,
) -> Outcome {
    let mode = GuardMode::from(args.mode);
    check_chain_mode(mode)?;
    // Processes apart must share their stores: a temporary file is each process's own.
    let named =
        |url: &Option<String>, file: &Option<std::path::PathBuf>| url.is_some() || file.is_some();
    let payments_named = named(&args.database_url, &args.sqlite);
    let postings_named = named(&args.postings_database_url, &args.postings_sqlite);
    let apart = args.serve.is_some() || args.serve_postings.is_some() || args.connect.is_some();
    if apart
        && !((args.serve_postings.is_some() || payments_named)
            && (args.serve.is_some() || postings_named))
    {
        anyhow::bail!(
            "a chain's processes must share their stores: name the payments store \
             (--database-url or --sqlite) for --serve and --connect, and the postings store \
             (--postings-database-url or --postings-sqlite) for --serve-postings and --connect"
        );
    }
    // A restarted server must not reuse an id of the process it replaces.
    let process = std::process::id();
    if let Some(addr) = args.serve_postings {
        let faults = Arc::new(AfterCommitFaults::new(
            args.postings_drop_rate,
            args.postings_reset_rate,
            u64::from(process),
        ));
        let listener = listening_on(addr).await?;
        let prefix = format!("post-{run_id}-{process}");
        postings_server(stores.postings.clone(), mode, faults, prefix, listener).await?;
        return Ok(None);
    }
    if let Some(addr) = args.serve {
        let postings = args
            .postings_at
            .context("a chained payments server needs --postings-at")?;
        let payments_faults = Arc::new(Faults::new(
            faults.drop_rate,
            faults.delay_rate,
            INJECTED_DELAY,
            u64::from(process),
        ));
        let unit_failures = Arc::new(UnitFailures::new(
            args.fail_after_posting_rate,
            u64::from(process).rotate_left(31),
        ));
        let listener = listening_on(addr).await?;
        let prefix = format!("pay-{run_id}-{process}");
        let server = payments_server(
            stores.payments.clone(),
            mode,
            payments_faults,
            unit_failures,
            postings,
            prefix,
            listener,
        );
        server.await?;
        return Ok(None);
    }
    let report = match args.connect {
        Some(addr) => connect_chain(addr, stores, client).await?,
        None => {
            let chain_faults = ChainFaults {
                postings_drop_rate: args.postings_drop_rate,
                postings_reset_rate: args.postings_reset_rate,
                fail_after_posting_rate: args.fail_after_posting_rate,
                kill_servers: !args.no_kill,
            };
            run_chain(mode, stores, faults, chain_faults, client).await?
        }
    };
    Ok(Some((report.to_string(), report.reconciled())))
}

/// Binds `addr` and says so on stdout (what the fault tests wait for).
async fn listening_on(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    Ok(listener)
}

/// Serves until interrupted or killed.
async fn serve_only(
    store: &Store,
    mode: GuardMode,
    faults: FaultOptions,
    retention: RetentionConfig,
    addr: std::net::SocketAddr,
    run_id: &str,
    tls: Option<TlsDir>,
) -> anyhow::Result<()> {
    // A restarted server must not reuse a payment id of the process it replaces.
    let process = std::process::id();
    let prefix = format!("pay-{run_id}-{process}");
    let (_db, _config, service, _faults) =
        faulty_service(store, mode, faults, &retention, u64::from(process), &prefix).await?;
    let listener = listening_on(addr).await?;
    let (stop_retention, retention_stopped) = tokio::sync::oneshot::channel::<()>();
    let retention = service.retention_worker(retention).spawn(async {
        let _ = retention_stopped.await;
    });
    let stopped = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let served = match tls {
        None => serve(listener, service, stopped).await,
        Some(dir) => {
            let service = service.with_caller_extractor(TlsDir::callers());
            serve_mtls(listener, service, dir.server()?, stopped).await
        }
    };
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
