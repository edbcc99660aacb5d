//! `grpc-ledger-bench [--quick] [--out FILE]`: run by `cargo xtask bench`, which starts a durable
//! PostgreSQL and sets `DATABASE_URL` (and `MARIADB_URL`, `GALERA_URLS` for the MariaDB and
//! Galera figures). Prints a table and writes the figures as JSON.

use std::path::PathBuf;

use grpc_ledger_bench::{Plan, mariadb_family, run_all};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/bench/summary.json"));
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow::anyhow!("DATABASE_URL is not set; run `cargo xtask bench`"))?;
    let plan = if quick { Plan::quick() } else { Plan::full() };
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
