//! The harness: clients driving an operation for a time, variants interleaved in both orders, and
//! the rates and percentiles they give.

use super::*;

pub(crate) type Op =
    Arc<dyn Fn(usize, u64) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// `op(db, client, key)` as an [`Op`], each call with a fresh key named after `tag`.
pub(crate) fn fresh_keys<F, Fut>(db: &DatabaseConnection, tag: String, op: F) -> Op
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
pub(crate) struct Run {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) elapsed: Duration,
    pub(crate) cpu: Duration,
}

impl Measured {
    /// The figures of several runs of one variant taken together: the rate over their summed
    /// time, the percentiles over every call of them all.
    pub(crate) fn of(runs: Vec<Run>) -> Measured {
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

pub(crate) async fn drive(clients: usize, seconds: Duration, op: Op) -> Result<Measured> {
    Ok(Measured::of(vec![run_for(clients, seconds, op).await?]))
}

pub(crate) async fn run_for(clients: usize, seconds: Duration, op: Op) -> Result<Run> {
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
pub(crate) fn numbered_on(op: &Op, from: u64) -> Op {
    let op = Arc::clone(op);
    Arc::new(move |task, i| op(task, i + from))
}

pub(crate) fn percentile(latencies: &mut [Duration], p: f64) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort();
    let index = ((latencies.len() - 1) as f64 * p).round() as usize;
    latencies[index].as_secs_f64() * 1000.0
}

pub(crate) async fn count(db: &DatabaseConnection, sql: &str) -> Result<i64> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .context("a count")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}
