//! The write units at each client count: the business insert, the adapter's claim-first and
//! write-once, the same statements as raw SQL, and pgbench's scripts, run interleaved.

use super::*;

/// A fresh database on the PostgreSQL under measure, the ledger migrated into it, and the
/// adapter's pool with statements cached, sized for the plan's largest client count.
pub(crate) struct WriteStore {
    pub(crate) bench_db: BenchDatabase,
    pub(crate) db: DatabaseConnection,
}

/// Straight to PostgreSQL, statements cached: the store's own limit. What the pooler-safe default
/// costs over it is measured on its own (`pooler::pooler_safe_cost`).
pub(crate) fn cached_statements(connections: u32) -> LedgerConfig {
    LedgerConfig::default()
        .with_max_connections(connections)
        .with_pooler(Pooler::None)
}

impl WriteStore {
    pub(crate) async fn open(url: &str, plan: &Plan) -> Result<WriteStore> {
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
    pub(crate) async fn write_figures(&self, plan: &Plan) -> Result<Vec<Figure>> {
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

    pub(crate) async fn close(self) -> Result<()> {
        self.db.close().await?;
        self.bench_db.drop_it().await
    }
}

/// What the keyed variant sends, so that a reader of the figures can check that pgbench and the
/// raw-sql variant send the same.
pub(crate) fn print_statements() -> Result<()> {
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
pub(crate) struct Writes {
    pub(crate) business: Measured,
    pub(crate) keyed: Measured,
    pub(crate) write_once: Measured,
    pub(crate) raw: Measured,
    pub(crate) pgbench_keyed: f64,
    pub(crate) pgbench_keyed_latency: f64,
    pub(crate) pgbench_keyed_unbounded: f64,
    pub(crate) pgbench_business: f64,
    pub(crate) pgbench_commit_once: f64,
    /// pgbench's own CPU time for each keyed and each business transaction.
    pub(crate) pgbench_keyed_cpu_us: f64,
    pub(crate) pgbench_business_cpu_us: f64,
    /// The adapter's and pgbench's keyed and business rates in each half on its own: the first
    /// runs the adapter's units before pgbench, the second pgbench before the adapter's units.
    pub(crate) halves: [Half; 2],
}

/// One half of a write run: the rates reported for it on its own.
pub(crate) struct Half {
    pub(crate) keyed: f64,
    pub(crate) pgbench_keyed: f64,
    pub(crate) business: f64,
    pub(crate) pgbench_business: f64,
}

/// One write variant of a run: the in-process op, or pgbench's script, of that index.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Load {
    Driven(usize),
    Pgbench(usize),
}

/// Runs the write variants with `clients` clients: the business insert alone, the adapter
/// claim-first and write-once, the same statements as raw SQL, and pgbench's three scripts.
/// pgbench runs in between, in both halves, as [`interleaved`] runs in-process variants: a drift of
/// the machine then weighs on the adapter and on pgbench alike, and the adapter/pgbench ratios are
/// the point of these figures.
pub(crate) async fn measure_writes(
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
    pub(crate) fn figures(&self, clients: usize) -> Vec<Figure> {
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
