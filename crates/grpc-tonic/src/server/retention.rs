//! Retention that runs: a task beside the guard that deletes finished operations older than the
//! retention window, in bounded batches, on the store's clock, until the server shuts down.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use grpc_core_api::{
    GrpcOperationLedger, LedgerCensus, LedgerError, LedgerUnitsOfWork, UnavailableKind, UnitPerCall,
};
use grpc_policy::{RandomSource, SplitMix64};

use crate::metrics::{PassEnd, RetentionMetrics};
use crate::random::jitter_source;

/// How the ledger's retention runs.
///
/// `#[non_exhaustive]`: built with [`new`](Self::new) and the `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionConfig {
    /// How long a finished operation is kept after it completed: the window in which a resend
    /// under its key is answered from the record. Past it, a resend runs as a new operation, so
    /// the window must be longer than any client retries or resolves (publish it to clients).
    pub retention: Duration,
    /// The time between passes; each pass waits this, give or take a fifth at random, so that
    /// replicas started together do not purge in step.
    pub interval: Duration,
    /// The most rows one statement deletes: each batch is a short unit of work of its own, so
    /// that a purge never holds many row locks, or a long transaction, beside live claims.
    pub batch: NonZeroU32,
    /// The most batches in one pass: a backlog is worked off over several passes rather than in
    /// one long burst.
    pub max_batches: u32,
    /// Whether each pass ends with a census of the ledger (operations in progress, expired
    /// leases, the oldest in progress, finished ones past the retention) for
    /// [`RetentionStats::census`] and the gauges: one aggregate read of the whole table per pass.
    pub census: bool,
}

impl RetentionConfig {
    /// Keep finished operations for `retention`; a pass every minute, 1000 rows a batch, at most
    /// 100 batches a pass.
    pub fn new(retention: Duration) -> Self {
        Self {
            retention,
            interval: Duration::from_secs(60),
            batch: NonZeroU32::new(1000).expect("1000 is not zero"),
            max_batches: 100,
            census: true,
        }
    }

    /// No census after each pass: for a table so large that one aggregate read a pass costs more
    /// than the gauges are worth (the gauges then report nothing).
    pub fn without_census(mut self) -> Self {
        self.census = false;
        self
    }

    /// The time between passes (jittered by up to a fifth either way).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The most rows one batch deletes.
    pub fn with_batch(mut self, batch: NonZeroU32) -> Self {
        self.batch = batch;
        self
    }

    /// The most batches in one pass (at least one).
    pub fn with_max_batches(mut self, batches: u32) -> Self {
        self.max_batches = batches.max(1);
        self
    }
}

/// What the retention worker has done, readable by anyone holding it (a health endpoint, a
/// gauge), written only by the worker.
#[derive(Debug, Default)]
pub struct RetentionStats {
    purged: AtomicU64,
    passes: AtomicU64,
    failed_passes: AtomicU64,
    backlogged_passes: AtomicU64,
    census: Mutex<Option<LedgerCensus>>,
}

impl RetentionStats {
    /// The ledger as the last pass's census counted it, by the store's clock; `None` before the
    /// first census, when the last one failed (a stale count would mislead), or without censuses.
    pub fn census(&self) -> Option<LedgerCensus> {
        *self.census.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn counted(&self, census: Option<LedgerCensus>) {
        *self.census.lock().unwrap_or_else(|p| p.into_inner()) = census;
    }

    /// Rows deleted, over every pass.
    pub fn purged(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }

    /// Passes that ended, however they ended.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Passes the store refused (the next pass tries again).
    pub fn failed_passes(&self) -> u64 {
        self.failed_passes.load(Ordering::Relaxed)
    }

    /// Passes that stopped at `max_batches` with rows left to purge: retention is lagging (a
    /// larger batch, more batches or a shorter interval would catch up).
    pub fn backlogged_passes(&self) -> u64 {
        self.backlogged_passes.load(Ordering::Relaxed)
    }
}

/// How many times one batch is sent while the store aborts it as conflicting with another unit
/// (InnoDB's deadlock between two replicas' deletes on the same index range, a Galera
/// certification failure, PostgreSQL's 40001/40P01): a purge is a conditional delete, so sending
/// it again can only delete what is still there to delete. (A commit whose outcome the store could
/// not tell, PostgreSQL's 40003 or Galera's 1180, may have taken effect: its rows are then gone
/// but missing from the pass's count.) A batch aborted this many times fails the pass, and the
/// next pass tries again.
const BATCH_ATTEMPTS: u32 = 4;

/// The longest wait before a batch the store aborted is sent again, taken at random up to it so
/// that the workers that collided do not collide again in step.
const CONFLICT_BACKOFF: Duration = Duration::from_millis(20);

/// How one pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPass {
    /// Rows deleted.
    pub purged: u64,
    /// Whether the pass stopped at `max_batches` with rows possibly left.
    pub backlogged: bool,
}

/// Deletes the ledger's finished operations past their retention, beside a guard on the same
/// store ([`KeyedMutationGuard::retention_worker`](crate::KeyedMutationGuard::retention_worker)).
///
/// Safe to run on every replica at once: each batch is one conditional delete of finished rows
/// (never an operation in progress, whatever its age) in a unit of work of its own, bounded like
/// a claim by the store's lock wait, so workers racing on the same rows delete each once and a
/// worker that waits too long fails its pass and tries again at the next. A batch the store
/// aborts as conflicting with another worker's is sent again, a few times, within the pass. The
/// age is judged by
/// the store's clock, so replicas with skewed clocks agree.
pub struct RetentionWorker<U> {
    units: Arc<U>,
    config: RetentionConfig,
    stats: Arc<RetentionStats>,
    random: Mutex<SplitMix64>,
    metrics: Option<RetentionMetrics>,
}

impl<U> RetentionWorker<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    pub(crate) fn new(units: Arc<U>, config: RetentionConfig) -> Self {
        Self {
            units,
            config,
            stats: Arc::new(RetentionStats::default()),
            random: Mutex::new(jitter_source()),
            metrics: None,
        }
    }

    /// Records the worker's work with `meter`: `grpc.server.ledger.purged` (operations deleted)
    /// and `grpc.server.ledger.retention.passes` by `grpc.ledger.retention.outcome` (`complete`,
    /// `backlogged`: retention lags, `failed`); and, from each pass's census, the gauges
    /// `grpc.server.ledger.in_progress`, `grpc.server.ledger.expired_leases` (in progress with
    /// their lease run out: a dead or hung handler), `grpc.server.ledger.oldest_in_progress.age`
    /// (seconds) and `grpc.server.ledger.past_retention` (finished operations purge has yet to
    /// delete: it falls back towards zero after each pass when retention keeps up). The gauges
    /// report nothing while there is no fresh census.
    #[cfg(feature = "opentelemetry")]
    pub fn with_meter(mut self, meter: &opentelemetry::metrics::Meter) -> Self {
        self.metrics = Some(RetentionMetrics::new(meter, Arc::clone(&self.stats)));
        self
    }

    /// The worker's counters, to read while it runs.
    pub fn stats(&self) -> Arc<RetentionStats> {
        Arc::clone(&self.stats)
    }

    /// One pass: batches until one comes back short of `batch` rows, or `max_batches` ran.
    pub async fn run_once(&self) -> Result<RetentionPass, LedgerError> {
        let mut pass = RetentionPass {
            purged: 0,
            backlogged: false,
        };
        let outcome = async {
            for batch in 1..=self.config.max_batches {
                let deleted = self.purge_batch_through_conflicts().await?;
                pass.purged += deleted;
                if deleted < u64::from(self.config.batch.get()) {
                    return Ok(());
                }
                pass.backlogged = batch == self.config.max_batches;
            }
            Ok(())
        }
        .await;
        self.stats.passes.fetch_add(1, Ordering::Relaxed);
        self.stats.purged.fetch_add(pass.purged, Ordering::Relaxed);
        if let Some(metrics) = &self.metrics {
            let end = match (&outcome, pass.backlogged) {
                (Err(_), _) => PassEnd::Failed,
                (Ok(()), true) => PassEnd::Backlogged,
                (Ok(()), false) => PassEnd::Complete,
            };
            metrics.record(pass.purged, end);
        }
        if self.config.census {
            self.take_census().await;
        }
        match outcome {
            Ok(()) => {
                if pass.backlogged {
                    self.stats.backlogged_passes.fetch_add(1, Ordering::Relaxed);
                }
                Ok(pass)
            }
            Err(error) => {
                self.stats.failed_passes.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }

    /// Counts the ledger for the gauges, in a unit of work of its own; a failed count leaves no
    /// count rather than a stale one.
    async fn take_census(&self) {
        let census = UnitPerCall::new(Arc::clone(&self.units))
            .census(self.config.retention)
            .await;
        match census {
            Ok(census) => {
                tracing::debug!(?census, "ledger census");
                self.stats.counted(Some(census));
            }
            Err(error) => {
                tracing::warn!(%error, "the ledger's census failed; the gauges report nothing");
                self.stats.counted(None);
            }
        }
    }

    /// One batch, sent again (after a short random wait) while the store aborts it as a conflict,
    /// at most [`BATCH_ATTEMPTS`] times.
    async fn purge_batch_through_conflicts(&self) -> Result<u64, LedgerError> {
        let mut attempt = 1;
        loop {
            match self.purge_batch().await {
                Err(LedgerError::Unavailable {
                    kind: UnavailableKind::SerializationFailure,
                }) if attempt < BATCH_ATTEMPTS => {
                    attempt += 1;
                    tracing::debug!(
                        attempt,
                        "a purge batch conflicted with another unit; sending it again"
                    );
                    tokio::time::sleep(CONFLICT_BACKOFF.mul_f64(self.next_random_unit())).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// One batch in a unit of work of its own.
    async fn purge_batch(&self) -> Result<u64, LedgerError> {
        let transaction = self.units.begin().await?;
        let deleted = self
            .units
            .ledger(&transaction)
            .purge(self.config.retention, self.config.batch)
            .await;
        match deleted {
            Ok(deleted) => {
                self.units.commit(transaction).await?;
                Ok(deleted)
            }
            Err(error) => {
                if let Err(rollback) = self.units.rollback(transaction).await {
                    tracing::warn!(error = %rollback, "rolling back a purge batch failed");
                }
                Err(error)
            }
        }
    }

    /// The wait before the next pass: `interval`, give or take a fifth.
    fn next_wait(&self) -> Duration {
        self.config
            .interval
            .mul_f64(0.8 + 0.4 * self.next_random_unit())
    }

    fn next_random_unit(&self) -> f64 {
        let mut random = self.random.lock().unwrap_or_else(|p| p.into_inner());
        random.next_unit()
    }

    /// Runs a pass after each wait until `shutdown` completes, on a task of its own; the handle
    /// ends when the worker has stopped. A pass under way when `shutdown` completes runs to its
    /// end (at most `max_batches` short units) before the worker stops: a unit of work is never
    /// dropped in the middle of a statement.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(self.next_wait()) => {}
                }
                match self.run_once().await {
                    Ok(pass) if pass.backlogged => tracing::warn!(
                        purged = pass.purged,
                        "retention pass stopped at its batch limit with rows left: retention is lagging"
                    ),
                    Ok(pass) => tracing::debug!(purged = pass.purged, "retention pass"),
                    Err(error) => {
                        tracing::warn!(%error, "retention pass failed; the next pass tries again")
                    }
                }
            }
            tracing::debug!("retention worker stopped");
        })
    }
}
