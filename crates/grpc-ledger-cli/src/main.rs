//! `grpc-ledger`: what an on-call engineer needs of an operation ledger without writing SQL. See
//! the README's "Operating the ledger" section; every command takes `--url` (or
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
