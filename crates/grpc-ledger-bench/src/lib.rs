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
mod e2e;

pub use cores::{CoreSplit, cpus_allowed, split_cores};
pub use e2e::retry_layer_overhead;
mod figures;
mod mariadb;
mod pgbench;
mod pooler;
mod sqlite_c;

use cpu::CpuTimes;
pub use figures::{Figure, Plan, json, table};
pub(crate) use figures::{compared, figure};
pub use mariadb::mariadb_family;
use pgbench::{
    PgbenchRun, REPLAY_KEYS_TABLE, pgbench, pgbench_business_script, pgbench_commit_once_script,
    pgbench_keyed_script, pgbench_keyed_unbounded_script, pgbench_last_statement,
    pgbench_replay_scripts,
};

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

const METHOD: &str = "/payments.v1.Payments/CreatePayment";
const BUSINESS_INSERT: &str = "INSERT INTO bench_business (business_key, amount) VALUES ($1, $2)";
const PLAIN_READ: &str = "SELECT business_key, amount FROM bench_business WHERE business_key = $1";

fn identity(caller: usize, key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(format!("caller-{}", caller % 8).as_bytes()),
        GrpcMethod::parse(METHOD).expect("valid method"),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).expect("valid key")),
    )
}

fn lease() -> LeaseDuration {
    LeaseDuration::new(Duration::from_secs(30)).expect("valid lease")
}

fn business_statement(backend: DbBackend, key: &str, amount: i64) -> Statement {
    let sql = in_dialect(backend, BUSINESS_INSERT).expect("a store the ledger supports");
    Statement::from_sql_and_values(backend, sql, [key.into(), amount.into()])
}

/// One business write in its own transaction: the floor.
async fn business_op(db: &DatabaseConnection, key: &str) -> Result<()> {
    let txn = db.begin().await?;
    txn.execute_raw(business_statement(db.get_database_backend(), key, 1))
        .await?;
    txn.commit().await?;
    Ok(())
}

/// The units of work the guard runs on `db`: begun as `KeyedMutationGuard` begins them (on
/// PostgreSQL with the claim wait as the transaction's lock bound, sent once after `BEGIN`; on
/// SQLite `BEGIN IMMEDIATE`; on MariaDB at READ COMMITTED), with the adapter's default claim wait.
fn guard_units(db: &DatabaseConnection) -> SeaOrmUnitsOfWork {
    SeaOrmUnitsOfWork::new(db.clone(), &LedgerConfig::default())
}

/// Claim + business write + mark_committed through the adapter, in one unit of work begun as the
/// guard begins it.
async fn keyed_op(db: &DatabaseConnection, caller: usize, key: &str) -> Result<()> {
    let units = guard_units(db);
    let txn = units.begin().await?;
    keyed_write(&units, &txn, caller, key).await?;
    units.commit(txn).await?;
    Ok(())
}

/// The write-once mode through the adapter: business write, then the finished row recorded in
/// one insert, in one unit of work begun as the guard begins it.
async fn write_once_op(db: &DatabaseConnection, caller: usize, key: &str) -> Result<()> {
    let id = identity(caller, key);
    let units = guard_units(db);
    let txn = units.begin().await?;
    txn.execute_raw(business_statement(db.get_database_backend(), key, 1))
        .await?;
    let recorded = units
        .ledger(&txn)
        .record_finished(
            &id,
            &RequestFingerprint::of(key.as_bytes()),
            lease(),
            &Completion::Committed(OutcomeReference::parse(key)?),
        )
        .await?;
    if !matches!(recorded, RecordOutcome::Recorded(_)) {
        bail!("a fresh key was not recorded");
    }
    units.commit(txn).await?;
    Ok(())
}

/// Claim, business write and mark_committed of a fresh key on `txn`, a unit of `units`.
async fn keyed_write(
    units: &SeaOrmUnitsOfWork,
    txn: &DatabaseTransaction,
    caller: usize,
    key: &str,
) -> Result<()> {
    let id = identity(caller, key);
    let ledger = units.ledger(txn);
    let claimed = ledger
        .claim(&id, &RequestFingerprint::of(key.as_bytes()), lease())
        .await?;
    let ClaimOutcome::Claimed { version, .. } = claimed else {
        bail!("a fresh key was not claimed")
    };
    txn.execute_raw(business_statement(txn.get_database_backend(), key, 1))
        .await?;
    ledger
        .mark_committed(&id, version, &OutcomeReference::parse(key)?)
        .await?;
    Ok(())
}

/// The claim's `lock_timeout` (the adapter's default claim wait), as the claim statement binds it.
const CLAIM_WAIT_SETTING: &str = "2000ms";

/// The adapter's statement named `name` on `backend` (the names of `statements`), found by its
/// name so that a change in the order of the adapter's list cannot hand the bench another one.
pub(crate) fn adapter_statement(backend: DbBackend, name: &str) -> Result<&'static str> {
    statements(backend)
        .with_context(|| format!("{backend:?} is not a store the ledger supports"))?
        .into_iter()
        .find_map(|(named, text)| (named == name).then_some(text))
        .with_context(|| format!("the adapter has no statement named {name:?}"))
}

/// The adapter's statements as a guarded call sends them (the unit's lock bound, the claim, the
/// business insert, the transition), directly through sqlx: the adapter's ideal.
async fn raw_op(pool: &sqlx::PgPool, caller: usize, key: &str) -> Result<()> {
    let commit = adapter_statement(DbBackend::Postgres, "mark committed")?;
    let claim = claim_as_sent(DbBackend::Postgres).context("PostgreSQL")?;
    let id = identity(caller, key);
    let digest = id.storage_digest().to_vec();
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(lock_timeout_statement(
        LedgerConfig::default().claim_wait,
    )))
    .execute(&mut *tx)
    .await?;
    // The claim answers `inserted` (and the fresh `version`), or the row it met.
    let claimed: Option<(bool, Option<i64>)> = sqlx::query_as(claim)
        .bind(&digest)
        .bind(id.caller().as_str())
        .bind(id.method().as_str())
        .bind(id.key_hash().as_bytes().as_slice())
        .bind(RequestFingerprint::of(key.as_bytes()).as_bytes().as_slice())
        .bind(lease().as_millis())
        .bind(i32::from(Version::random_salt()))
        .bind(CLAIM_WAIT_SETTING)
        .fetch_optional(&mut *tx)
        .await?;
    let version = claimed.and_then(|(inserted, version)| version.filter(|_| inserted));
    let Some(version) = version else {
        bail!("a fresh key was not claimed");
    };
    sqlx::query(BUSINESS_INSERT)
        .bind(key)
        .bind(1i64)
        .execute(&mut *tx)
        .await?;
    sqlx::query(commit)
        .bind(&digest)
        .bind(version)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

type Op = Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// `op(db, client, key)` as an [`Op`], each call with a fresh key named after `tag`.
fn fresh_keys<F, Fut>(db: &DatabaseConnection, tag: String, op: F) -> Op
where
    F: Fn(DatabaseConnection, usize, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let db = db.clone();
    Arc::new(move |task, i| Box::pin(op(db.clone(), task, format!("{tag}-{task}-{i}"))))
}

/// Throughput and latency of `op` with `clients` tasks for `seconds`.
pub(crate) struct Measured {
    pub(crate) ops_per_second: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// This process's CPU time over the run, every thread, for each call: the client's cost of
    /// a call when this process only drives it (the server's side runs elsewhere).
    pub(crate) cpu_us_per_op: f64,
}

/// What one run of a variant did: every call's latency, how long the run took, and the CPU time
/// this process used meanwhile.
struct Run {
    latencies: Vec<Duration>,
    elapsed: Duration,
    cpu: Duration,
}

impl Measured {
    /// The figures of several runs of one variant taken together: the rate over their summed
    /// time, the percentiles over every call of them all.
    fn of(runs: Vec<Run>) -> Measured {
        let elapsed: f64 = runs.iter().map(|r| r.elapsed.as_secs_f64()).sum();
        let cpu: f64 = runs.iter().map(|r| r.cpu.as_secs_f64()).sum();
        let mut latencies: Vec<Duration> = runs.into_iter().flat_map(|r| r.latencies).collect();
        let calls = latencies.len().max(1) as f64;
        Measured {
            ops_per_second: latencies.len() as f64 / elapsed,
            p50_ms: percentile(&mut latencies, 0.50),
            p99_ms: percentile(&mut latencies, 0.99),
            cpu_us_per_op: cpu * 1e6 / calls,
        }
    }
}

async fn drive(clients: usize, seconds: Duration, op: Op) -> Result<Measured> {
    Ok(Measured::of(vec![run_for(clients, seconds, op).await?]))
}

async fn run_for(clients: usize, seconds: Duration, op: Op) -> Result<Run> {
    let cpu_before = CpuTimes::now()?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|task| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut i = 0u64;
                while started.elapsed() < seconds {
                    let one = Instant::now();
                    op(task, i).await?;
                    latencies.push(one.elapsed());
                    i += 1;
                }
                Ok::<_, anyhow::Error>(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    Ok(Run {
        latencies,
        elapsed,
        cpu: CpuTimes::now()?.since(cpu_before).own,
    })
}

/// Each of `ops` driven for `seconds` in all, in two halves: once in the order given, then in the
/// reverse order, each variant's figure the mean of its two halves. A drift of the machine during
/// the run (a checkpoint, another process, a cache warming) then weighs on every variant about
/// equally, where variants run one after another for the whole time would each meet a different
/// part of it; the ratios between them are the point. The second half numbers its calls on from
/// 2^40, so an op that names its keys by the call's number never sends one twice.
pub(crate) async fn interleaved<const N: usize>(
    clients: usize,
    seconds: Duration,
    ops: [&Op; N],
) -> Result<[Measured; N]> {
    let half = seconds / 2;
    let mut runs: [Vec<Run>; N] = std::array::from_fn(|_| Vec::with_capacity(2));
    for (i, op) in ops.iter().enumerate() {
        runs[i].push(run_for(clients, half, Arc::clone(op)).await?);
    }
    for (i, op) in ops.iter().enumerate().rev() {
        runs[i].push(run_for(clients, half, numbered_on(op, 1 << 40)).await?);
    }
    Ok(runs.map(Measured::of))
}

/// `op` with its calls numbered on from `from`, for a second run that must not repeat a key.
fn numbered_on(op: &Op, from: u64) -> Op {
    let op = Arc::clone(op);
    Arc::new(move |task, i| op(task, i + from))
}

fn percentile(latencies: &mut [Duration], p: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort();
    let index = ((latencies.len() - 1) as f64 * p).round() as usize;
    latencies[index].as_secs_f64() * 1000.0
}

async fn count(db: &DatabaseConnection, sql: &str) -> Result<i64> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .context("a count")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

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
    figures.extend(e2e::fingerprint_cost(plan.fingerprint_ops)?);
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

/// A fresh database on the PostgreSQL under measure, the ledger migrated into it, and the
/// adapter's pool with statements cached, sized for the plan's largest client count.
struct WriteStore {
    bench_db: BenchDatabase,
    db: DatabaseConnection,
}

/// Straight to PostgreSQL, statements cached: the store's own limit. What the pooler-safe default
/// costs over it is measured on its own (`pooler::pooler_safe_cost`).
fn cached_statements(connections: u32) -> LedgerConfig {
    LedgerConfig::default()
        .with_max_connections(connections)
        .with_pooler(Pooler::None)
}

impl WriteStore {
    async fn open(url: &str, plan: &Plan) -> Result<WriteStore> {
        let bench_db = BenchDatabase::create(url).await?;
        let max_clients = plan.clients.iter().copied().max().unwrap_or(1) as u32;
        let config = cached_statements(max_clients + 2);
        let db = connect_postgres(&bench_db.url, &config).await?;
        grpc_operation_ledger_seaorm::migrate(&db).await?;
        db.execute_unprepared(BUSINESS_TABLE).await?;
        Ok(WriteStore { bench_db, db })
    }

    /// The write variants at each client count of `plan`, after printing what they send.
    ///
    /// Each count has pools of its own, two connections larger than the count, as pgbench opens
    /// one connection for each client. sqlx's pool hands out its idle connections first in,
    /// first out, and pings each one on its way back, so a pool far larger than the load spreads
    /// it over more server processes than it needs, which ADR 0019 measured against pgbench.
    async fn write_figures(&self, plan: &Plan) -> Result<Vec<Figure>> {
        print_statements()?;
        let url = &self.bench_db.url;
        let mut figures = Vec::new();
        for &clients in &plan.clients {
            let connections = clients as u32 + 2;
            let db = connect_postgres(url, &cached_statements(connections)).await?;
            opened(db.get_postgres_connection_pool()).await?;
            // Without a ping on every acquire, as the adapter's pool (`connect_postgres`).
            let pool = PgPoolOptions::new()
                .max_connections(connections)
                .test_before_acquire(false)
                .connect(url)
                .await?;
            opened(&pool).await?;
            let writes = measure_writes(&db, &pool, url, clients, plan).await?;
            figures.extend(writes.figures(clients));
            pool.close().await;
            db.close().await?;
            eprintln!("measured {clients} client(s)");
        }
        Ok(figures)
    }

    async fn close(self) -> Result<()> {
        self.db.close().await?;
        self.bench_db.drop_it().await
    }
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

const BUSINESS_TABLE: &str =
    "CREATE TABLE bench_business (business_key VARCHAR(128) PRIMARY KEY, amount BIGINT NOT NULL)";

/// A database of the benchmarks' own on a PostgreSQL server, dropped at the end of the run.
struct BenchDatabase {
    admin: DatabaseConnection,
    name: String,
    url: String,
}

impl BenchDatabase {
    /// A database named for this process and for this one of its runs, so that two runs of one
    /// process (two tests at once) never drop each other's.
    async fn create(server_url: &str) -> Result<Self> {
        static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("ledger_bench_{}_{run}", std::process::id());
        let admin = Database::connect(server_url).await?;
        admin
            .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
            .await?;
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await?;
        let url = database_url(server_url, &name)?;
        Ok(Self { admin, name, url })
    }

    async fn drop_it(self) -> Result<()> {
        self.admin
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}

/// What the keyed variant sends, so that a reader of the figures can check that pgbench and the
/// raw-sql variant send the same.
fn print_statements() -> Result<()> {
    eprintln!("statements of the keyed variant (the raw-sql and pgbench variants send the same):");
    for (what, sql) in statements(DbBackend::Postgres).context("PostgreSQL")? {
        eprintln!("  {what}: {sql}");
    }
    eprintln!(
        "  claim, as the adapter sends it: {}",
        claim_as_sent(DbBackend::Postgres).context("PostgreSQL")?
    );
    eprintln!("  business: {BUSINESS_INSERT}");
    eprintln!(
        "pgbench script of the keyed variant:\n{}",
        pgbench_keyed_script()?
    );
    Ok(())
}

/// Every write variant at one client count, its two halves taken together (`measure_writes`).
struct Writes {
    business: Measured,
    keyed: Measured,
    write_once: Measured,
    raw: Measured,
    pgbench_keyed: f64,
    pgbench_keyed_latency: f64,
    pgbench_keyed_unbounded: f64,
    pgbench_business: f64,
    pgbench_commit_once: f64,
    /// pgbench's own CPU time for each keyed and each business transaction.
    pgbench_keyed_cpu_us: f64,
    pgbench_business_cpu_us: f64,
    /// The adapter's and pgbench's keyed and business rates in each half on its own: the first
    /// runs the adapter's units before pgbench, the second pgbench before the adapter's units.
    halves: [Half; 2],
}

/// One half of a write run: the rates reported for it on its own.
struct Half {
    keyed: f64,
    pgbench_keyed: f64,
    business: f64,
    pgbench_business: f64,
}

/// One write variant of a run: the in-process op, or pgbench's script, of that index.
#[derive(Debug, Clone, Copy)]
enum Load {
    Driven(usize),
    Pgbench(usize),
}

/// Runs the write variants with `clients` clients: the business insert alone, the adapter
/// claim-first and write-once, the same statements as raw SQL, and pgbench's three scripts.
/// pgbench runs in between, in both halves, as [`interleaved`] runs in-process variants: a drift of
/// the machine then weighs on the adapter and on pgbench alike, and the adapter/pgbench ratios are
/// the point of these figures.
async fn measure_writes(
    db: &DatabaseConnection,
    pool: &sqlx::PgPool,
    url: &str,
    clients: usize,
    plan: &Plan,
) -> Result<Writes> {
    let run = |variant: &'static str| format!("{variant}-{clients}-{}", std::process::id());
    let business = fresh_keys(db, run("b"), |db, _, key| async move {
        business_op(&db, &key).await
    });
    let keyed = fresh_keys(db, run("k"), |db, task, key| async move {
        keyed_op(&db, task, &key).await
    });
    let write_once = fresh_keys(db, run("w"), |db, task, key| async move {
        write_once_op(&db, task, &key).await
    });
    let (pool, tag) = (pool.clone(), run("r"));
    let raw: Op = Arc::new(move |task, i| {
        let (pool, key) = (pool.clone(), format!("{tag}-{task}-{i}"));
        Box::pin(async move { raw_op(&pool, task, &key).await })
    });
    let driven = [&business, &keyed, &write_once, &raw];
    let scripts = [
        pgbench_keyed_script()?,
        pgbench_keyed_unbounded_script()?,
        pgbench_business_script(),
        pgbench_commit_once_script(),
    ];
    let loads: Vec<Load> = (0..driven.len())
        .map(Load::Driven)
        .chain((0..scripts.len()).map(Load::Pgbench))
        .collect();
    let dir = std::env::temp_dir();
    let half = plan.half();
    // Each variant's halves, in the order they ran: the adapter's first, pgbench's first.
    let mut drove: [Vec<Run>; 4] = Default::default();
    let mut pgbench_runs: [Vec<PgbenchRun>; 4] = Default::default();
    let forth_then_back = loads
        .iter()
        .map(|load| (load, 0))
        .chain(loads.iter().rev().map(|load| (load, 1 << 40)));
    for (&load, numbered_from) in forth_then_back {
        match load {
            Load::Driven(i) => {
                let op = numbered_on(driven[i], numbered_from);
                drove[i].push(run_for(clients, half, op).await?);
            }
            Load::Pgbench(i) => {
                pgbench_runs[i].push(pgbench(url, &scripts[i], clients, half, &dir)?);
            }
        }
    }
    let rate = |run: &Run| run.latencies.len() as f64 / run.elapsed.as_secs_f64();
    let halves = [0, 1].map(|half| Half {
        keyed: rate(&drove[1][half]),
        pgbench_keyed: pgbench_runs[0][half].tps,
        business: rate(&drove[0][half]),
        pgbench_business: pgbench_runs[2][half].tps,
    });
    let [business, keyed, write_once, raw] = drove.map(Measured::of);
    let [keyed_pg, unbounded, business_pg, commit_once] = pgbench_runs.map(PgbenchRun::together);
    Ok(Writes {
        business,
        keyed,
        write_once,
        raw,
        pgbench_keyed: keyed_pg.tps,
        pgbench_keyed_latency: keyed_pg.mean_ms,
        pgbench_keyed_unbounded: unbounded.tps,
        pgbench_business: business_pg.tps,
        pgbench_commit_once: commit_once.tps,
        pgbench_keyed_cpu_us: keyed_pg.cpu_us_per_transaction(),
        pgbench_business_cpu_us: business_pg.cpu_us_per_transaction(),
        halves,
    })
}

impl Writes {
    /// The figures of one client count, each ratio against its baseline of the same run.
    fn figures(&self, clients: usize) -> Vec<Figure> {
        let at = |what: &str| format!("write c={clients} {what}");
        let business_fig = figure(at("business"), "ops/s", self.business.ops_per_second);
        let raw_fig = figure(at("raw-sql"), "ops/s", self.raw.ops_per_second);
        let pg_keyed_fig = figure(at("pgbench keyed"), "tps", self.pgbench_keyed);
        let pg_business_fig = figure(at("pgbench business"), "tps", self.pgbench_business);
        let pg_unbounded_fig = figure(
            at("pgbench keyed without the unit's lock bound"),
            "tps",
            self.pgbench_keyed_unbounded,
        );
        let raw_p50 = figure(at("raw-sql p50"), "ms", self.raw.p50_ms);
        let keyed_fig = figure(
            at("keyed (claim-first)"),
            "ops/s",
            self.keyed.ops_per_second,
        );
        let (keyed, write_once) = (&self.keyed, &self.write_once);
        let mut figures = vec![
            compared(at("keyed"), "ops/s", keyed.ops_per_second, &business_fig),
            compared(
                at("keyed vs raw-sql"),
                "ops/s",
                keyed.ops_per_second,
                &raw_fig,
            ),
            compared(
                at("keyed vs pgbench keyed"),
                "ops/s",
                keyed.ops_per_second,
                &pg_keyed_fig,
            ),
            // The same statements with neither sea-orm nor the adapter in the way: how much of
            // the gap to pgbench the Rust side leaves by itself (sqlx on tokio, the harness's
            // driver, and the digest and fingerprint hashed in the client).
            compared(
                at("raw-sql vs pgbench keyed"),
                "ops/s",
                self.raw.ops_per_second,
                &pg_keyed_fig,
            ),
            compared(
                at("business vs pgbench business"),
                "ops/s",
                self.business.ops_per_second,
                &pg_business_fig,
            ),
            compared(
                at("keyed write-once"),
                "ops/s",
                write_once.ops_per_second,
                &business_fig,
            ),
            compared(
                at("keyed write-once vs claim-first"),
                "ops/s",
                write_once.ops_per_second,
                &keyed_fig,
            ),
            figure(at("keyed write-once p50"), "ms", write_once.p50_ms),
            compared(at("keyed p50"), "ms", keyed.p50_ms, &raw_p50),
            figure(at("keyed p99"), "ms", keyed.p99_ms),
            compared(
                at("pgbench keyed vs business"),
                "tps",
                self.pgbench_keyed,
                &pg_business_fig,
            ),
            compared(
                at("pgbench keyed without the unit's lock bound vs business"),
                "tps",
                self.pgbench_keyed_unbounded,
                &pg_business_fig,
            ),
            compared(
                at("pgbench keyed vs the same without the unit's lock bound"),
                "tps",
                self.pgbench_keyed,
                &pg_unbounded_fig,
            ),
            figure(
                at("pgbench keyed mean latency"),
                "ms",
                self.pgbench_keyed_latency,
            ),
            compared(
                at("pgbench commit-once vs business"),
                "tps",
                self.pgbench_commit_once,
                &pg_business_fig,
            ),
        ];
        figures.extend([
            business_fig,
            raw_fig,
            raw_p50,
            pg_keyed_fig,
            pg_business_fig,
            pg_unbounded_fig,
        ]);
        figures.push(figure(at("business p50"), "ms", self.business.p50_ms));
        figures.push(figure(at("business p99"), "ms", self.business.p99_ms));
        // The client's own CPU for each unit: this process for the adapter's, pgbench's for its.
        let pg_keyed_cpu = figure(
            at("pgbench keyed client CPU per transaction"),
            "µs",
            self.pgbench_keyed_cpu_us,
        );
        let pg_business_cpu = figure(
            at("pgbench business client CPU per transaction"),
            "µs",
            self.pgbench_business_cpu_us,
        );
        figures.extend([
            compared(
                at("keyed client CPU per op vs pgbench"),
                "µs",
                self.keyed.cpu_us_per_op,
                &pg_keyed_cpu,
            ),
            compared(
                at("business client CPU per op vs pgbench"),
                "µs",
                self.business.cpu_us_per_op,
                &pg_business_cpu,
            ),
            figure(
                at("raw-sql client CPU per op"),
                "µs",
                self.raw.cpu_us_per_op,
            ),
            pg_keyed_cpu,
            pg_business_cpu,
        ]);
        // Each half's adapter/pgbench ratios on their own: when the order of the runs moves them,
        // the two halves disagree, and only their mean above is a fair comparison.
        let orders = ["the adapter first", "pgbench first"];
        for (half, order) in self.halves.iter().zip(orders) {
            let pg_keyed = figure(
                at(&format!("pgbench keyed, {order}")),
                "tps",
                half.pgbench_keyed,
            );
            let pg_business = figure(
                at(&format!("pgbench business, {order}")),
                "tps",
                half.pgbench_business,
            );
            figures.extend([
                compared(
                    at(&format!("keyed vs pgbench keyed, {order}")),
                    "ops/s",
                    half.keyed,
                    &pg_keyed,
                ),
                compared(
                    at(&format!("business vs pgbench business, {order}")),
                    "ops/s",
                    half.business,
                    &pg_business,
                ),
                pg_keyed,
                pg_business,
            ]);
        }
        figures
    }
}

/// The duplicate's cost: a claim of a committed identity and a resend's read first, each against
/// a plain primary-key read, and the store's own price for the resend's read, measured by pgbench
/// on the same rows.
async fn replay(db: &DatabaseConnection, url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let keys: Vec<String> = (0..plan.replay_ops)
        .map(|i| format!("replay-{}-{i}", std::process::id()))
        .collect();
    for key in &keys {
        keyed_op(db, 0, key).await?;
    }
    let ledger = SeaOrmOperationLedger::new(db);
    let (mut claims, mut finds, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    // The three are measured key by key, in an order that turns with each key, so that none of
    // them always finds the pages the one before it brought into the cache.
    for (i, key) in keys.iter().enumerate() {
        for step in 0..3 {
            let started = Instant::now();
            match (i + step) % 3 {
                0 => {
                    let answer = ledger
                        .claim(
                            &identity(0, key),
                            &RequestFingerprint::of(key.as_bytes()),
                            lease(),
                        )
                        .await?;
                    claims.push(started.elapsed());
                    if !matches!(answer, ClaimOutcome::Completed(_)) {
                        bail!("a committed identity was not replayed");
                    }
                }
                // What a resend is answered with under the guard: the record read by its key
                // (the claim follows only when no finished record is found).
                1 => {
                    let found = ledger.find(&identity(0, key)).await?;
                    finds.push(started.elapsed());
                    if !found.is_some_and(|record| record.state().is_terminal()) {
                        bail!("a committed identity was not found finished");
                    }
                }
                _ => {
                    db.query_one_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        PLAIN_READ,
                        [key.as_str().into()],
                    ))
                    .await?
                    .context("the business row")?;
                    reads.push(started.elapsed());
                }
            }
        }
    }
    let read = figure(
        "replay: primary-key read p50".into(),
        "ms",
        percentile(&mut reads, 0.5),
    );
    let mut figures = vec![
        compared(
            "replay: claim of a committed identity p50".into(),
            "ms",
            percentile(&mut claims, 0.5),
            &read,
        ),
        compared(
            "replay: read first of a committed identity (a resend) p50".into(),
            "ms",
            percentile(&mut finds, 0.5),
            &read,
        ),
        read,
    ];
    figures.extend(replay_at_the_store(db, url, &keys, plan).await?);
    Ok(figures)
}

/// The store's own price for a resend's read: pgbench, one client, reading the same committed
/// rows as the adapter's replay, by their primary keys in the ledger (the adapter's statement)
/// and in the business table. Each script runs half the plan's time twice, in turning order;
/// each read, the script's last statement, is timed on its own (`-r`), after a look-up both
/// scripts share.
async fn replay_at_the_store(
    db: &DatabaseConnection,
    url: &str,
    keys: &[String],
    plan: &Plan,
) -> Result<Vec<Figure>> {
    let measured = read_at_the_store(db, url, keys, plan).await;
    // Dropped whatever happened, so that nothing of it stays in the database the next
    // figures measure; a failed measurement's error is the one reported.
    let dropped = db
        .execute_unprepared(&format!("DROP TABLE IF EXISTS {REPLAY_KEYS_TABLE}"))
        .await;
    let [ledger_read, business_read] = measured?;
    dropped?;
    let read = figure(
        "replay: pgbench, primary-key read mean".into(),
        "ms",
        business_read,
    );
    Ok(vec![
        compared(
            "replay: pgbench, the ledger's read of a committed identity mean".into(),
            "ms",
            ledger_read,
            &read,
        ),
        read,
    ])
}

/// [`replay_at_the_store`]'s two mean latencies in ms, the ledger's read and the business
/// table's, after checking that every key of [`REPLAY_KEYS_TABLE`] finds its row in both tables:
/// a read that finds nothing would be timed as a fast one.
async fn read_at_the_store(
    db: &DatabaseConnection,
    url: &str,
    keys: &[String],
    plan: &Plan,
) -> Result<[f64; 2]> {
    db.execute_unprepared(&format!(
        "CREATE TABLE {REPLAY_KEYS_TABLE} (n INTEGER PRIMARY KEY, identity_digest BYTEA NOT NULL, \
         business_key VARCHAR(128) NOT NULL)"
    ))
    .await?;
    let txn = db.begin().await?;
    for (n, key) in (1i32..).zip(keys) {
        txn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!("INSERT INTO {REPLAY_KEYS_TABLE} VALUES ($1, $2, $3)"),
            [
                n.into(),
                identity(0, key).storage_digest().to_vec().into(),
                key.as_str().into(),
            ],
        ))
        .await?;
    }
    txn.commit().await?;
    let found = count(
        db,
        &format!(
            "SELECT count(*) FROM {REPLAY_KEYS_TABLE} \
             JOIN grpc_operation_ledger USING (identity_digest) \
             JOIN bench_business USING (business_key)"
        ),
    )
    .await?;
    if found != keys.len() as i64 {
        bail!(
            "{found} of the {} replayed keys have both their rows for pgbench to read",
            keys.len()
        );
    }
    let scripts = pgbench_replay_scripts(keys.len())?;
    let dir = std::env::temp_dir();
    let mut runs: [Vec<PgbenchRun>; 2] = Default::default();
    for i in [0, 1, 1, 0] {
        runs[i].push(pgbench_last_statement(url, &scripts[i], plan.half(), &dir)?);
    }
    Ok(runs.map(|runs| PgbenchRun::together(runs).mean_ms))
}

/// What the ledger's transitions cost in the table and its indexes, by the table's fillfactor:
/// for 100 (PostgreSQL's default, every page filled by the claims' inserts) and 80 (a fifth of
/// each page left for the transitions' new row versions), keyed writes through the adapter
/// (claim, business insert, transition, commit) at 8 clients, each on a database of its own.
/// The share of transitions that were heap-only (HOT: no new index entry, the old version
/// pruned within its page), the bytes per row the table and its indexes hold afterwards, and the
/// throughput.
pub async fn transitions_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let mut baseline: Option<Figure> = None;
    for fillfactor in [100, 80] {
        let bench_db = BenchDatabase::create(url).await?;
        let db = connect_postgres(
            &bench_db.url,
            &LedgerConfig::default()
                .with_max_connections(10)
                .with_pooler(Pooler::None),
        )
        .await?;
        grpc_operation_ledger_seaorm::migrate(&db).await?;
        db.execute_unprepared(BUSINESS_TABLE).await?;
        db.execute_unprepared(&format!(
            "ALTER TABLE grpc_operation_ledger SET (fillfactor = {fillfactor})"
        ))
        .await?;
        const WAL_POSITION: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT";
        if fillfactor == 100 {
            // The baseline's WAL: the business insert alone, in a transaction of its own.
            let wal_before = count(&db, WAL_POSITION).await?;
            let run = format!("walb-{}", std::process::id());
            drive(
                8,
                plan.seconds,
                fresh_keys(&db, run, |db, _, key| async move {
                    business_op(&db, &key).await
                }),
            )
            .await?;
            let wal = (count(&db, WAL_POSITION).await? - wal_before) as f64;
            let writes = count(&db, "SELECT COUNT(*) FROM bench_business")
                .await?
                .max(1) as f64;
            figures.push(figure(
                "transitions: WAL bytes per business write @8".into(),
                "B",
                wal / writes,
            ));
        }
        let wal_before = count(&db, WAL_POSITION).await?;
        let business_before = count(&db, "SELECT COUNT(*) FROM bench_business").await?;
        let run = format!("hot{fillfactor}-{}", std::process::id());
        let keyed = drive(
            8,
            plan.seconds,
            fresh_keys(&db, run, |db, task, key| async move {
                keyed_op(&db, task, &key).await
            }),
        )
        .await?;
        let wal = (count(&db, WAL_POSITION).await? - wal_before) as f64;
        let keyed_writes = (count(&db, "SELECT COUNT(*) FROM bench_business").await?
            - business_before)
            .max(1) as f64;
        // Backends report their counts when idle, at most once a second (PostgreSQL 15).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Both counts from one row, so that no flush falls between them.
        let hot_per_mille = count(
            &db,
            "SELECT (1000 * n_tup_hot_upd / GREATEST(n_tup_upd, 1))::BIGINT \
             FROM pg_stat_user_tables WHERE relname = 'grpc_operation_ledger'",
        )
        .await? as f64;
        let rows = count(&db, "SELECT COUNT(*) FROM grpc_operation_ledger")
            .await?
            .max(1) as f64;
        let table = count(&db, "SELECT pg_relation_size('grpc_operation_ledger')").await? as f64;
        let indexes = count(&db, "SELECT pg_indexes_size('grpc_operation_ledger')").await? as f64;
        if fillfactor == 100 {
            figures.extend(column_bytes(&db).await?);
        }
        db.close().await?;
        bench_db.drop_it().await?;
        let at = |what: &str| format!("transitions at fillfactor {fillfactor}: {what}");
        let ops = figure(at("keyed ops/s @8"), "ops/s", keyed.ops_per_second);
        figures.push(match &baseline {
            Some(base) => compared(at("keyed ops/s @8"), "ops/s", keyed.ops_per_second, base),
            None => {
                baseline = Some(ops.clone());
                ops
            }
        });
        figures.push(figure(
            at("HOT share of transitions"),
            "%",
            hot_per_mille / 10.0,
        ));
        figures.push(figure(
            at("WAL bytes per keyed write (business insert included)"),
            "B",
            wal / keyed_writes,
        ));
        figures.push(figure(at("table bytes per row"), "B", table / rows));
        figures.push(figure(at("index bytes per row"), "B", indexes / rows));
        eprintln!("measured the transitions at fillfactor {fillfactor} ({rows} rows)");
    }
    Ok(figures)
}

/// The ledger's columns as the adapter wrote them: the mean bytes each one takes in a row
/// (`pg_column_size`: the value with its length header, no alignment padding), and the whole
/// row's data.
async fn column_bytes(db: &DatabaseConnection) -> Result<Vec<Figure>> {
    let columns = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT column_name::TEXT AS name FROM information_schema.columns \
             WHERE table_name = 'grpc_operation_ledger' ORDER BY ordinal_position",
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<String>("", "name"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut figures = Vec::new();
    for column in columns.iter().map(String::as_str).chain(["row"]) {
        let value = if column == "row" { "l.*" } else { column };
        // Column names read from the catalog, not from input.
        let mean = db
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                format!(
                    "SELECT COALESCE(AVG(pg_column_size({value})), 0)::FLOAT8 AS mean \
                     FROM grpc_operation_ledger AS l"
                ),
            ))
            .await?
            .context("a mean")?
            .try_get::<f64>("", "mean")?;
        figures.push(figure(
            format!("ledger bytes per row in column {column}"),
            "B",
            mean,
        ));
    }
    Ok(figures)
}

/// Only the replay's figures, on a database of their own on the PostgreSQL at `url`.
pub async fn replay_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let bench_db = BenchDatabase::create(url).await?;
    let db = connect_postgres(
        &bench_db.url,
        &LedgerConfig::default().with_pooler(Pooler::None),
    )
    .await?;
    grpc_operation_ledger_seaorm::migrate(&db).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    let figures = replay(&db, &bench_db.url, plan).await?;
    db.close().await?;
    bench_db.drop_it().await?;
    Ok(figures)
}

/// Claim latency as the ledger grows, and its size per row.
async fn growth(db: &DatabaseConnection, plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures: Vec<Figure> = Vec::new();
    let ledger = SeaOrmOperationLedger::new(db);
    for &size in &plan.growth {
        let have = count(db, "SELECT COUNT(*) FROM grpc_operation_ledger").await? as u64;
        if have < size {
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO grpc_operation_ledger (identity_digest, caller_fingerprint, \
                 full_method_name, idempotency_key_hash, request_fingerprint, state, version, \
                 claimed_at, lease_expires_at, completed_at, outcome_reference) \
                 SELECT sha256(convert_to(c || '|' || $3 || '|' || h, 'UTF8')), c, $3, \
                 decode(h, 'hex'), sha256(convert_to('r' || i, 'UTF8')), 'COMMITTED', 2, 1, 2, 3, \
                 'p' FROM (SELECT i, md5('bulk' || (i % 8)) || md5((i % 8) || 'bulk') AS c, \
                 md5('g' || i) || md5('h' || i) AS h \
                 FROM generate_series($1::bigint, $2::bigint) AS i) AS bulk",
                [
                    (have as i64 + 1).into(),
                    (size as i64).into(),
                    METHOD.into(),
                ],
            ))
            .await?;
            db.execute_unprepared("ANALYZE grpc_operation_ledger")
                .await?;
        }
        let mut claims = Vec::new();
        for i in 0..plan.growth_ops {
            let key = format!("growth-{size}-{i}");
            let started = Instant::now();
            ledger
                .claim(
                    &identity(i, &key),
                    &RequestFingerprint::of(key.as_bytes()),
                    lease(),
                )
                .await?;
            claims.push(started.elapsed());
        }
        let rows = count(db, "SELECT COUNT(*) FROM grpc_operation_ledger")
            .await?
            .max(1) as f64;
        let table = count(db, "SELECT pg_relation_size('grpc_operation_ledger')").await? as f64;
        let indexes = count(db, "SELECT pg_indexes_size('grpc_operation_ledger')").await? as f64;
        let p50 = percentile(&mut claims, 0.5);
        let name = format!("growth: claim p50 at {size} rows");
        let fig = match figures.first() {
            Some(smallest) => compared(name, "ms", p50, smallest),
            None => figure(name, "ms", p50),
        };
        figures.push(fig);
        figures.push(figure(
            format!("growth: table bytes per row at {size}"),
            "B",
            table / rows,
        ));
        figures.push(figure(
            format!("growth: index bytes per row at {size}"),
            "B",
            indexes / rows,
        ));
        figures.push(figure(
            format!("growth: ledger bytes per row (table + indexes) at {size}"),
            "B",
            (table + indexes) / rows,
        ));
    }
    Ok(figures)
}

/// Removes a SQLite file of the bench's with its WAL and shared-memory files.
fn remove_sqlite_file(file: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// Only SQLite's figures (`grpc-ledger-bench --only sqlite`): no server needed.
pub async fn sqlite_cost(plan: &Plan) -> Result<Vec<Figure>> {
    sqlite(plan).await
}

/// The embedded default: keyed against business, one writer, each next to the same unit run
/// through SQLite's C library (`sqlite_c`), the store's own limit for the shape.
async fn sqlite(plan: &Plan) -> Result<Vec<Figure>> {
    let file = std::env::temp_dir().join(format!("ledger-bench-{}.sqlite", std::process::id()));
    let db = open_sqlite(&file, &LedgerConfig::default()).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    let business = fresh_keys(&db, "sb".into(), |db, _, key| async move {
        business_op(&db, &key).await
    });
    let keyed = fresh_keys(&db, "sk".into(), |db, _, key| async move {
        keyed_op(&db, 0, &key).await
    });
    let [business, keyed] = interleaved(1, plan.seconds, [&business, &keyed]).await?;
    let mut end_to_end = Vec::new();
    for &clients in &plan.clients {
        let config = LedgerConfig::default();
        end_to_end.extend(e2e::end_to_end("sqlite", &db, &config, clients, plan).await?);
    }
    db.close().await?;
    let (c_business, c_keyed) = sqlite_c::c_library_limit(plan.seconds).await?;
    remove_sqlite_file(&file);
    let base = figure(
        "sqlite: business, one writer".into(),
        "ops/s",
        business.ops_per_second,
    );
    let c_base = figure(
        "sqlite: C library business, one writer".into(),
        "ops/s",
        c_business,
    );
    let c_keyed_fig = figure(
        "sqlite: C library keyed, one writer".into(),
        "ops/s",
        c_keyed,
    );
    let mut figures = vec![
        compared(
            "sqlite: keyed, one writer".into(),
            "ops/s",
            keyed.ops_per_second,
            &base,
        ),
        compared(
            "sqlite: C library keyed vs business, one writer".into(),
            "ops/s",
            c_keyed,
            &c_base,
        ),
        compared(
            "sqlite: keyed vs C library keyed, one writer".into(),
            "ops/s",
            keyed.ops_per_second,
            &c_keyed_fig,
        ),
        compared(
            "sqlite: business vs C library business, one writer".into(),
            "ops/s",
            business.ops_per_second,
            &c_base,
        ),
        base,
        c_base,
        c_keyed_fig,
    ];
    figures.extend(end_to_end);
    Ok(figures)
}
