//! The store and its locks: committed rows, business rows, row locks held by units until they
//! end, and a lock on the whole table (which writes share and a table-lock hook holds alone).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use grpc_core_api::{LedgerError, OperationRecord};
use tokio::sync::{Notify, RwLock};

use grpc_ledger_contract_tests::{ClockSkew, Defect};

#[derive(Default)]
pub(crate) struct Committed {
    pub(crate) rows: HashMap<String, OperationRecord>,
    pub(crate) business: Vec<String>,
    /// Row locks: storage key -> the unit holding it until it commits or rolls back.
    pub(crate) locks: HashMap<String, u64>,
}

pub(crate) struct Shared {
    pub(crate) committed: Mutex<Committed>,
    pub(crate) released: Notify,
    pub(crate) claim_wait: Duration,
    pub(crate) next_unit: AtomicU64,
    pub(crate) defect: Option<Defect>,
    /// The whole table's lock: writes share it, and a [`TableLocking`] hook holds it alone, as
    /// DDL or `LOCK TABLE` would.
    pub(crate) table: Arc<RwLock<()>>,
    /// How far the store's clock is from the process's (`None`: the process's own clock).
    pub(crate) clock_skew: Option<ClockSkew>,
    /// Set by a [`LostCommit`](grpc_ledger_contract_tests::LostCommit) hook's switch: the next
    /// commit takes effect and its answer is lost.
    pub(crate) lose_next_commit: AtomicBool,
}

impl Shared {
    /// The store's clock: what every time the double writes or judges is read from.
    pub(crate) fn now(&self) -> SystemTime {
        let process = SystemTime::now();
        self.clock_skew
            .map_or(process, |skew| skew.store_time(process))
    }

    /// The clock the double judges leases, renewals, look-ups, the census and purge by: the
    /// store's, except in the broken variant that reads the process's.
    pub(crate) fn judging_now(&self) -> SystemTime {
        if self.defect == Some(Defect::ProcessClock) {
            SystemTime::now()
        } else {
            self.now()
        }
    }

    pub(crate) fn committed(&self) -> MutexGuard<'_, Committed> {
        // A panic while holding the lock leaves consistent data (every update is one insert or
        // one assignment), so a poisoned lock is still usable.
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Shared {
    /// Runs `op`, a write, once the table is not locked by anyone else, waiting at most the claim
    /// wait; past it, `timed_out`.
    pub(crate) async fn writing<T>(
        &self,
        timed_out: LedgerError,
        op: impl Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let table = self.table.read();
        let _shared = if self.defect == Some(Defect::UnboundedTableLockWait) {
            table.await
        } else {
            match tokio::time::timeout(self.claim_wait, table).await {
                Ok(guard) => guard,
                Err(_) => return Err(timed_out),
            }
        };
        op.await
    }

    /// Whether a unit other than `unit_id` has inserted `key` and not committed it yet.
    pub(crate) fn uncommitted_elsewhere(&self, unit_id: u64, key: &str) -> bool {
        let committed = self.committed();
        !committed.rows.contains_key(key)
            && committed
                .locks
                .get(key)
                .is_some_and(|holder| *holder != unit_id)
    }

    /// Takes the row lock on `key` for the unit `unit_id`, waiting at most the claim wait.
    pub(crate) async fn lock(&self, unit_id: u64, key: &str) -> Lock {
        let deadline = tokio::time::Instant::now() + self.claim_wait;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut committed = self.committed();
                let holder = *committed.locks.entry(key.to_owned()).or_insert(unit_id);
                if holder == unit_id {
                    return Lock::Held;
                }
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Lock::TimedOut;
            }
        }
    }
}

/// The outcome of waiting for a row lock.
pub(crate) enum Lock {
    Held,
    TimedOut,
}

/// A store of committed rows shared by every unit of work begun on it.
#[derive(Clone)]
pub struct InMemoryStore {
    pub(crate) shared: Arc<Shared>,
}

impl InMemoryStore {
    /// An empty store whose duplicate claims wait at most `claim_wait`.
    pub fn new(claim_wait: Duration) -> Self {
        Self::build(claim_wait, None)
    }

    pub(crate) fn build(claim_wait: Duration, defect: Option<Defect>) -> Self {
        Self::build_with_clock(claim_wait, defect, None)
    }

    /// An empty store whose clock reads `clock_skew` away from the process's.
    pub(crate) fn build_with_clock(
        claim_wait: Duration,
        defect: Option<Defect>,
        clock_skew: Option<ClockSkew>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                committed: Mutex::default(),
                released: Notify::new(),
                claim_wait,
                next_unit: AtomicU64::new(1),
                defect,
                table: Arc::default(),
                clock_skew,
                lose_next_commit: AtomicBool::new(false),
            }),
        }
    }
}

impl InMemoryStore {
    /// The business rows committed so far, in commit order.
    pub fn committed_business(&self) -> Vec<String> {
        self.shared.committed().business.clone()
    }
}

/// Milliseconds since the Unix epoch: the double's store clock, in the unit fresh versions use.
pub(crate) fn millis_since_epoch(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
