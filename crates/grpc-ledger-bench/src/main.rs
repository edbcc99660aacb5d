//! `grpc-ledger-bench [--quick] [--out FILE] [--only units|e2e|replay|...] [--clients 8]
//! [--split-cores]`: run by `cargo xtask bench`, which starts a durable PostgreSQL and sets
//! `DATABASE_URL` (and `MARIADB_URL`, `GALERA_URLS` for the MariaDB and Galera figures). Prints a
//! table, and writes the figures as JSON: the full run's to `target/bench/summary.json` unless
//! `--out` names another file, a group's under `--only` only to `--out`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use grpc_ledger_bench::{Plan, mariadb_family, retry_layer_overhead, run_all};

/// Where the full run's figures go unless `--out` says otherwise; `cargo xtask bench` reads them
/// there.
const FULL_SUMMARY: &str = "target/bench/summary.json";

/// The ledger's benchmarks against the stores `cargo xtask bench` starts.
#[derive(Debug, Parser)]
struct Args {
    /// 3 s per figure instead of 15 (every ratio of the full run, less steady).
    #[arg(long)]
    quick: bool,
    /// Where the figures are written as JSON: by default `target/bench/summary.json` for the
    /// full run, and nowhere for `--only` unless given.
    #[arg(long)]
    out: Option<PathBuf>,
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
    /// With `--only` of a PostgreSQL group: the PostgreSQL measured (which must run on this
    /// machine) on the first half of the cores and this process, pgbench included, on the rest,
    /// for as long as the run lasts (a run killed leaves the server there until it restarts), so
    /// that the client's own CPU is not taken from the store's.
    #[arg(long, requires = "only")]
    split_cores: bool,
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

impl Only {
    /// Whether the group measures PostgreSQL (the one `--split-cores` can pin).
    fn on_postgres(self) -> bool {
        !matches!(self, Only::RetryLayer | Only::Mariadb | Only::Sqlite)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Args {
        quick,
        out,
        database_url,
        only,
        clients,
        split_cores,
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
    let split = match (split_cores, only) {
        (false, _) => None,
        (true, Some(only)) if only.on_postgres() => {
            Some(grpc_ledger_bench::split_cores(&postgres_url(database_url.clone())?).await?)
        }
        (true, _) => anyhow::bail!(
            "--split-cores splits the cores with PostgreSQL: it needs --only units, e2e, replay, \
             pooler or transitions"
        ),
    };
    let figures = match only {
        Some(only) => only_these(only, database_url, &plan).await?,
        None => {
            let url = postgres_url(database_url)?;
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
            figures.extend(grpc_ledger_bench::units_on_split_cores(&url, &plan).await?);
            figures
        }
    };
    let figures = match split {
        Some(split) => {
            drop(split);
            grpc_ledger_bench::on_split_cores(figures)
        }
        None => figures,
    };
    println!("{}", grpc_ledger_bench::table(&figures));
    // A run of some figures only writes them where it is told to, never over the full run's
    // summary by default.
    let Some(out) = out.or_else(|| only.is_none().then(|| PathBuf::from(FULL_SUMMARY))) else {
        return Ok(());
    };
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

/// The figures of one group of `--only`.
async fn only_these(
    only: Only,
    database_url: Option<String>,
    plan: &Plan,
) -> anyhow::Result<Vec<grpc_ledger_bench::Figure>> {
    use grpc_ledger_bench as bench;
    let url = || postgres_url(database_url.clone());
    Ok(match only {
        Only::RetryLayer => retry_layer_overhead(plan).await?,
        Only::Mariadb => {
            let url = std::env::var("MARIADB_URL")
                .context("MARIADB_URL names the MariaDB to measure (`cargo xtask mariadb url`)")?;
            mariadb_family("mariadb", &[url], plan).await?
        }
        Only::Sqlite => bench::sqlite_cost(plan).await?,
        Only::Units => bench::units_cost(&url()?, plan).await?,
        Only::E2e => bench::end_to_end_cost(&url()?, plan).await?,
        Only::Pooler => bench::pooler_cost(&url()?, plan).await?,
        Only::Transitions => bench::transitions_cost(&url()?, plan).await?,
        Only::Replay => bench::replay_cost(&url()?, plan).await?,
    })
}

fn postgres_url(database_url: Option<String>) -> anyhow::Result<String> {
    database_url.context("DATABASE_URL (or --database-url) names the PostgreSQL to measure")
}
