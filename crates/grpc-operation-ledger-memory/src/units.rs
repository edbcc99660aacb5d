//! Units of work: writes kept apart until commit, gone on rollback, and a "connection" that can
//! be killed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use grpc_core_api::{
    GrpcOperationLedger, LedgerDurability, LedgerError, OperationRecord, UnavailableKind,
};

use crate::InMemoryOperationLedger;
use crate::store::{InMemoryStore, Shared};

#[derive(Default)]
pub(crate) struct Pending {
    pub(crate) rows: HashMap<String, OperationRecord>,
    pub(crate) business: Vec<String>,
    /// Rows this unit deleted (locked by it until it ends).
    pub(crate) deleted: HashSet<String>,
}

pub(crate) struct UnitState {
    pub(crate) id: u64,
    pub(crate) pending: Mutex<Pending>,
    pub(crate) finished: AtomicBool,
    /// Set when the unit's "connection" was killed: its writes are gone and every later call
    /// fails as a broken connection would.
    pub(crate) killed: AtomicBool,
}

impl UnitState {
    /// The row as this unit sees it: its own uncommitted write, or the committed row.
    pub(crate) fn visible(&self, shared: &Shared, key: &str) -> Option<OperationRecord> {
        let pending = self.pending();
        if let Some(own) = pending.rows.get(key) {
            return Some(own.clone());
        }
        if pending.deleted.contains(key) {
            return None;
        }
        drop(pending);
        shared.committed().rows.get(key).cloned()
    }

    /// The storage keys of every row this unit sees, in order.
    pub(crate) fn visible_keys(&self, shared: &Shared) -> Vec<String> {
        let pending = self.pending();
        let mut keys: Vec<String> = pending.rows.keys().cloned().collect();
        let deleted = pending.deleted.clone();
        drop(pending);
        keys.extend(
            shared
                .committed()
                .rows
                .keys()
                .filter(|key| !deleted.contains(*key))
                .cloned(),
        );
        keys.sort();
        keys.dedup();
        keys
    }

    pub(crate) fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A unit of work on an [`InMemoryStore`]. Dropping it without commit rolls it back.
pub struct InMemoryUnit {
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: Arc<UnitState>,
}

impl InMemoryUnit {
    /// The ledger bound to this unit.
    pub fn ledger(&self) -> InMemoryOperationLedger {
        InMemoryOperationLedger {
            shared: Arc::clone(&self.shared),
            unit: Some(Arc::clone(&self.state)),
        }
    }

    /// Records a business row inside the unit.
    pub fn write_business(&self, key: &str) {
        self.state.pending().business.push(key.to_owned());
    }

    /// Simulates the unit's connection dying: the writes roll back, the locks are released, and
    /// every later call on the unit answers `Unavailable`.
    pub fn kill(&self) {
        self.state.killed.store(true, Ordering::SeqCst);
        self.finish();
    }

    pub(crate) fn connection_lost(&self) -> Result<(), LedgerError> {
        if self.state.killed.load(Ordering::SeqCst) {
            return Err(LedgerError::unavailable(UnavailableKind::ConnectionLost));
        }
        Ok(())
    }

    /// Makes the unit's writes visible and releases its locks.
    pub fn commit_unit(self) {
        let pending = std::mem::take(&mut *self.state.pending());
        {
            let mut committed = self.shared.committed();
            for key in &pending.deleted {
                committed.rows.remove(key);
            }
            committed.rows.extend(pending.rows);
            committed.business.extend(pending.business);
        }
        self.finish();
    }

    /// Discards the unit's writes and releases its locks.
    pub fn rollback_unit(self) {
        self.finish();
    }

    fn finish(&self) {
        if self.state.finished.swap(true, Ordering::SeqCst) {
            return;
        }
        *self.state.pending() = Pending::default();
        let id = self.state.id;
        self.shared
            .committed()
            .locks
            .retain(|_, holder| *holder != id);
        self.shared.released.notify_waiters();
    }
}

impl Drop for InMemoryUnit {
    fn drop(&mut self) {
        self.finish();
    }
}

#[async_trait]
impl grpc_core_api::LedgerUnitsOfWork for InMemoryStore {
    type Transaction = InMemoryUnit;

    async fn begin(&self) -> Result<InMemoryUnit, LedgerError> {
        Ok(self.begin_unit())
    }

    fn ledger<'t>(&self, unit: &'t InMemoryUnit) -> Box<dyn GrpcOperationLedger + 't> {
        Box::new(unit.ledger())
    }

    async fn commit(&self, unit: InMemoryUnit) -> Result<(), LedgerError> {
        unit.connection_lost()?;
        unit.commit_unit();
        Ok(())
    }

    async fn rollback(&self, unit: InMemoryUnit) -> Result<(), LedgerError> {
        unit.rollback_unit();
        Ok(())
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Volatile
    }
}

impl InMemoryStore {
    /// Begins a unit of work.
    pub fn begin_unit(&self) -> InMemoryUnit {
        InMemoryUnit {
            shared: Arc::clone(&self.shared),
            state: Arc::new(UnitState {
                id: self.shared.next_unit.fetch_add(1, Ordering::Relaxed),
                pending: Mutex::default(),
                finished: AtomicBool::new(false),
                killed: AtomicBool::new(false),
            }),
        }
    }
}
