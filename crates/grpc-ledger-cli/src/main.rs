//! `grpc-ledger`: what an on-call engineer needs of an operation ledger without writing SQL. See
//! the guide's "Operating the ledger" chapter (docs/guide/src/operating.md); every command takes `--url` (or
//! `GRPC_LEDGER_URL`): `postgres://…`, `mysql://…/db` or `mariadb://…/db`, or `sqlite:PATH`.
//!
//! Exit codes, for scripts: 0 done; 1 refused (no such operation, a live lease, a version that
//! moved on); 2 bad input; 3 the store failed or cannot be reached.

mod commands;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::commands::{Cli, Failure};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The store drivers' events (a lost connection, a slow statement) for an operator who asks
    // with RUST_LOG; stdout stays the command's output. No event here carries a key: the CLI
    // reads one only for `show`, and hashes it before any statement.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("grpc-ledger: {failure}");
            ExitCode::from(match failure {
                Failure::Refused(_) => 1,
                Failure::BadInput(_) => 2,
                Failure::Store(_) => 3,
            })
        }
    }
}
