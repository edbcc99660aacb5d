//! `cargo run -p grpc-ledger-demo`: keyed payments exactly once through lost responses.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use grpc_ledger_demo::{ClientOptions, FaultOptions, Store, run_demo};

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
    /// limited by the service config's 0.5 s timeout).
    #[arg(long, default_value_t = 3000)]
    deadline_ms: u64,
    /// Every n-th key is resent with a changed body (0: never).
    #[arg(long, default_value_t = 20)]
    changed_body_every: u64,
    /// PostgreSQL instead of the embedded SQLite file (e.g. from `cargo xtask pg url`).
    #[arg(long)]
    database_url: Option<String>,
    /// The SQLite file (default: a fresh file in the temporary directory, removed afterwards).
    #[arg(long)]
    sqlite: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let run_id = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let temporary = std::env::temp_dir().join(format!("grpc-ledger-demo-{run_id}.sqlite"));
    let store = match (&args.database_url, &args.sqlite) {
        (Some(url), _) => Store::Postgres(url.clone()),
        (None, Some(path)) => Store::Sqlite(path.clone()),
        (None, None) => Store::Sqlite(temporary.clone()),
    };
    let client = ClientOptions {
        payments: args.payments,
        concurrency: args.concurrency,
        deadline: Duration::from_millis(args.deadline_ms),
        changed_body_every: args.changed_body_every,
        run_id,
        progress: true,
    };
    let faults = FaultOptions {
        drop_rate: args.drop_rate,
        delay_rate: args.delay_rate,
    };
    eprintln!(
        "store: {}",
        match &store {
            Store::Sqlite(p) => format!("SQLite {}", p.display()),
            Store::Postgres(_) => "PostgreSQL".to_owned(),
        }
    );
    let outcome = run_demo(&store, faults, &client).await;
    if args.database_url.is_none() && args.sqlite.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", temporary.display()));
        }
    }
    match outcome {
        Ok(report) => {
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
