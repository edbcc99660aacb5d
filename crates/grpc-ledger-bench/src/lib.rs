//! The ledger's write-path benchmarks, as a library so that a smoke test can run the harness with
//! tiny counts. Every variant of one group runs against the same server in the same run, and is
//! reported as a ratio to its baseline. The write units (pgbench's among them), the end-to-end
//! calls, the RetryLayer's pair, the pooler pair and the adapter's keyed and business units on
//! MariaDB and SQLite run interleaved, half their time in one order and half in the reverse
//! order, so that a drift of the machine weighs on every variant of a group alike. The store's
//! own clients for SQLite (the C library) and MariaDB (mariadb-slap) run after the adapter's pair,
//! not between its halves.

mod cores;
mod cpu;
mod database;
mod drive;
mod e2e;
mod growth;
mod ops;
mod overheads;
mod replay;
mod sqlite;
mod writes;

pub use cores::{CoreSplit, cpus_allowed, split_cores};
pub use overheads::retry_layer_overhead;
mod figures;
mod mariadb;
mod pgbench;
mod pooler;
mod sqlite_c;

use cpu::CpuTimes;
use database::*;
use drive::*;
pub use figures::{Figure, Plan, json, table};
pub(crate) use figures::{compared, figure};
pub use growth::transitions_cost;
use growth::*;
pub use mariadb::mariadb_family;
use ops::*;
use pgbench::{
    PgbenchRun, REPLAY_KEYS_TABLE, pgbench, pgbench_business_script, pgbench_commit_once_script,
    pgbench_keyed_script, pgbench_keyed_unbounded_script, pgbench_last_statement,
    pgbench_replay_scripts,
};
pub use replay::replay_cost;
use replay::*;
pub use sqlite::sqlite_cost;
use sqlite::*;
use writes::*;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, Completion, GrpcMethod, GrpcOperationIdentity,
    GrpcOperationLedger, IdempotencyKey, KeyHasher, LeaseDuration, LedgerUnitsOfWork,
    OutcomeReference, RecordOutcome, RequestFingerprint, Version,
};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, Pooler, SeaOrmOperationLedger, SeaOrmUnitsOfWork, claim_as_sent, connect_mysql,
    connect_postgres, database_url, in_dialect, lock_timeout_statement, open_sqlite, statements,
};
use sea_orm::sqlx::{self, postgres::PgPoolOptions};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, Statement,
    TransactionTrait,
};

/// Runs every benchmark of `plan` against the PostgreSQL at `url` (a fresh database is created on
/// it) and a SQLite file, printing what it runs.
pub async fn run_all(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let store = WriteStore::open(url, plan).await?;
    let mut figures = store.write_figures(plan).await?;
    let (db, url) = (&store.db, store.bench_db.url.as_str());
    figures.extend(pooler::pooler_safe_cost(url, plan).await?);
    figures.extend(replay(db, url, plan).await?);
    figures.extend(growth(db, plan).await?);
    figures.extend(end_to_end_on_postgres(url, plan).await?);
    figures.extend(sqlite(plan).await?);
    figures.extend(overheads::fingerprint_cost(plan.fingerprint_ops)?);
    figures.extend(retry_layer_overhead(plan).await?);
    store.close().await?;
    Ok(figures)
}

/// Only the write units (`grpc-ledger-bench --only units`): the business insert, the adapter
/// claim-first and write-once, the same statements through sqlx, and pgbench's scripts, at each
/// client count of the plan, on a fresh database of the PostgreSQL at `url`.
pub async fn units_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let store = WriteStore::open(url, plan).await?;
    let figures = store.write_figures(plan).await?;
    store.close().await?;
    Ok(figures)
}

/// What the figures of a run with the store on cores of its own ([`split_cores`]) add to their
/// names, so that they are never read as the shared run's.
pub const ON_SPLIT_CORES: &str = ", the store on cores of its own";

/// `figures` renamed as measured with the store on cores of its own, baselines included.
pub fn on_split_cores(figures: Vec<Figure>) -> Vec<Figure> {
    figures
        .into_iter()
        .map(|f| Figure {
            name: format!("{}{ON_SPLIT_CORES}", f.name),
            baseline: f.baseline.map(|b| format!("{b}{ON_SPLIT_CORES}")),
            ..f
        })
        .collect()
}

/// The full run's last figures: the write units at 8 clients once more, with PostgreSQL on the
/// first half of the cores and this process, pgbench included, on the rest, then the store
/// given every core again. On two shared cores each microsecond the client spends is one the
/// server loses; split, the adapter's rate next to pgbench's says what its statements cost the
/// store alone. A PostgreSQL that is not on this machine, or a machine of one core, cannot be
/// split: that is said and nothing is measured.
pub async fn units_on_split_cores(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let split = match split_cores(url).await {
        Ok(split) => split,
        Err(error) => {
            eprintln!("the write units were not measured on split cores: {error:#}");
            return Ok(Vec::new());
        }
    };
    let at_eight = Plan {
        clients: vec![8],
        ..plan.clone()
    };
    let figures = units_cost(url, &at_eight).await;
    drop(split);
    Ok(on_split_cores(figures?))
}

/// `pool` with every connection it may hold opened, before anything is measured on it: a fresh
/// pool opens its connections as callers first ask for them, and the server forks a process
/// for each, which would fall on the first variant measured.
async fn opened(pool: &sqlx::PgPool) -> Result<()> {
    let mut held = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        held.push(pool.acquire().await?);
    }
    Ok(())
}

/// Only the end-to-end gRPC figures on PostgreSQL (`grpc-ledger-bench --only e2e`), on a fresh
/// database of the PostgreSQL at `url`, with statements cached as in the full run.
pub async fn end_to_end_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let bench_db = BenchDatabase::create(url).await?;
    let db = connect_postgres(&bench_db.url, &cached_statements(1)).await?;
    grpc_operation_ledger_seaorm::migrate(&db).await?;
    db.close().await?;
    let figures = end_to_end_on_postgres(&bench_db.url, plan).await?;
    bench_db.drop_it().await?;
    Ok(figures)
}

/// The end-to-end figures on the migrated PostgreSQL database at `url`, at each client count of
/// `plan`, each count on a pool of its own two connections larger than the count, as the write
/// units' ([`WriteStore::write_figures`]).
async fn end_to_end_on_postgres(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    for &clients in &plan.clients {
        let config = cached_statements(clients as u32 + 2);
        let db = connect_postgres(url, &config).await?;
        opened(db.get_postgres_connection_pool()).await?;
        figures.extend(e2e::end_to_end("postgres", &db, &config, clients, plan).await?);
        db.close().await?;
    }
    Ok(figures)
}

/// Only what surviving any pooler costs (`grpc-ledger-bench --only pooler`), on a fresh database
/// of the PostgreSQL at `url`.
pub async fn pooler_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let bench_db = BenchDatabase::create(url).await?;
    let db = connect_postgres(&bench_db.url, &LedgerConfig::default()).await?;
    grpc_operation_ledger_seaorm::migrate(&db).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    db.close().await?;
    let figures = pooler::pooler_safe_cost(&bench_db.url, plan).await?;
    bench_db.drop_it().await?;
    Ok(figures)
}
