//! `grpc-ledger-bench [--quick] [--out FILE] [--only units|e2e|replay|...]`: run by `cargo xtask bench`,
//! which starts a durable
//! PostgreSQL and sets `DATABASE_URL` (and `MARIADB_URL`, `GALERA_URLS` for the MariaDB and
//! Galera figures). Prints a table and writes the figures as JSON.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use grpc_ledger_bench::{Plan, mariadb_family, retry_layer_overhead, run_all};

/// The ledger's benchmarks against the stores `cargo xtask bench` starts.
#[derive(Debug, Parser)]
struct Args {
    /// 3 s per figure instead of 15 (every ratio of the full run, less steady).
    #[arg(long)]
    quick: bool,
    /// Where the figures are written as JSON.
    #[arg(long, default_value = "target/bench/summary.json")]
    out: PathBuf,
    /// The PostgreSQL to measure (its `postgres` database is the admin connection); every run
    /// but `--only retry-layer` needs it.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Only these figures.
    #[arg(long, value_enum)]
    only: Option<Only>,
    /// These client counts instead of the plan's 1, 8 and 32 (comma-separated, each once), to
    /// measure one of them alone.
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
}

/// Figures that run alone.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Only {
    /// The RetryLayer's cost on a call that succeeds first time, next to the bare channel (no
    /// database).
    RetryLayer,
    /// What the pooler-safe default statements cost next to cached ones, on PostgreSQL.
    Pooler,
    /// SQLite's figures: the adapter's keyed and business units, the same through SQLite's C
    /// library, and the end-to-end calls (no server).
    Sqlite,
    /// MariaDB's figures (`MARIADB_URL`): keyed and business units, and the same run by
    /// mariadb-slap.
    Mariadb,
    /// The write units on PostgreSQL at each client count: the business insert, the adapter
    /// claim-first and write-once, the same statements through sqlx, and pgbench running them.
    Units,
    /// The end-to-end gRPC figures on PostgreSQL, the variants interleaved: unguarded (inline and
    /// in a task), the ledger without the guard, claim-first, write-once and through the executor.
    E2e,
    /// A duplicate's answer (the claim of a committed identity, and a resend's read first)
    /// next to a primary-key read, on PostgreSQL.
    Replay,
    /// The transitions' cost in the table and its indexes by fillfactor (HOT updates), on
    /// PostgreSQL.
    Transitions,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        quick,
        out,
        database_url,
        only,
        clients,
    } = Args::parse();
    let mut plan = if quick { Plan::quick() } else { Plan::full() };
    if let Some(clients) = clients {
        let mut distinct = clients.clone();
        distinct.sort_unstable();
        distinct.dedup();
        anyhow::ensure!(
            !clients.is_empty() && !clients.contains(&0) && distinct.len() == clients.len(),
            "--clients takes one or more different counts, each at least 1"
        );
        plan.clients = clients;
    }
    if let Some(Only::RetryLayer) = only {
        let figures = retry_layer_overhead(&plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::Mariadb) = only {
        let url = std::env::var("MARIADB_URL")
            .context("MARIADB_URL names the MariaDB to measure (`cargo xtask mariadb url`)")?;
        let figures = mariadb_family("mariadb", &[url], &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::Sqlite) = only {
        let figures = grpc_ledger_bench::sqlite_cost(&plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    let url =
        database_url.context("DATABASE_URL (or --database-url) names the PostgreSQL to measure")?;
    if let Some(Only::Units) = only {
        let figures = grpc_ledger_bench::units_cost(&url, &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::E2e) = only {
        let figures = grpc_ledger_bench::end_to_end_cost(&url, &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::Pooler) = only {
        let figures = grpc_ledger_bench::pooler_cost(&url, &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::Transitions) = only {
        let figures = grpc_ledger_bench::transitions_cost(&url, &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    if let Some(Only::Replay) = only {
        let figures = grpc_ledger_bench::replay_cost(&url, &plan).await?;
        println!("{}", grpc_ledger_bench::table(&figures));
        return Ok(());
    }
    let mut figures = run_all(&url, &plan).await?;
    // MariaDB and a Galera cluster, when `cargo xtask bench` started them.
    let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(url) = variable("MARIADB_URL") {
        figures.extend(mariadb_family("mariadb", &[url], &plan).await?);
    }
    if let Some(urls) = variable("GALERA_URLS") {
        let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
        figures.extend(mariadb_family("galera (3 nodes)", &urls, &plan).await?);
    }
    println!("{}", grpc_ledger_bench::table(&figures));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&grpc_ledger_bench::json(&figures))?,
    )?;
    eprintln!("figures written to {}", out.display());
    Ok(())
}
