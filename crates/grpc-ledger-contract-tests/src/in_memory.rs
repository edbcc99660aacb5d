//! `InMemoryOperationLedger`: the double that passes the contract suite honestly.
//!
//! It models what the contract relies on in a real database: an atomic insert-if-absent, versioned
//! conditional transitions, units of work whose writes stay invisible to others until commit and
//! vanish on rollback, and row locks, so that a duplicate claim behind another unit's uncommitted
//! claim waits at most the configured bound and then answers `InFlight`. Its durability is
//! `Volatile`: the retry policy will not let keyed mutations retry on it.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, Completion, GrpcMethod, GrpcOperationIdentity,
    GrpcOperationLedger, IdempotencyKey, KeyHasher, LeaseDuration, LedgerDurability, LedgerError,
    OperationRecord, OperationState, OutcomeReference, RecordedFailure, RequestFingerprint,
    UnavailableKind, Version,
};
use tokio::sync::{Notify, OwnedRwLockWriteGuard, RwLock};

use crate::broken::Defect;
use crate::{
    Capabilities, ConnectionKiller, HeldTableLock, LedgerFixture, LedgerStore, RawRow,
    TableLocking, UnitOfWork,
};

#[derive(Default)]
struct Committed {
    rows: HashMap<String, OperationRecord>,
    business: Vec<String>,
    /// Row locks: storage key -> the unit holding it until it commits or rolls back.
    locks: HashMap<String, u64>,
}

struct Shared {
    committed: Mutex<Committed>,
    released: Notify,
    claim_wait: Duration,
    next_unit: AtomicU64,
    defect: Option<Defect>,
    /// The whole table's lock: writes share it, and a [`TableLocking`] hook holds it alone, as
    /// DDL or `LOCK TABLE` would.
    table: Arc<RwLock<()>>,
}

impl Shared {
    fn committed(&self) -> MutexGuard<'_, Committed> {
        // A panic while holding the lock leaves consistent data (every update is one insert or
        // one assignment), so a poisoned lock is still usable.
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Default)]
struct Pending {
    rows: HashMap<String, OperationRecord>,
    business: Vec<String>,
}

struct UnitState {
    id: u64,
    pending: Mutex<Pending>,
    finished: AtomicBool,
    /// Set when the unit's "connection" was killed: its writes are gone and every later call
    /// fails as a broken connection would.
    killed: AtomicBool,
}

impl UnitState {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A store of committed rows shared by every unit of work begun on it.
#[derive(Clone)]
pub struct InMemoryStore {
    shared: Arc<Shared>,
}

impl InMemoryStore {
    /// An empty store whose duplicate claims wait at most `claim_wait`.
    pub fn new(claim_wait: Duration) -> Self {
        Self::build(claim_wait, None)
    }

    pub(crate) fn build(claim_wait: Duration, defect: Option<Defect>) -> Self {
        Self {
            shared: Arc::new(Shared {
                committed: Mutex::default(),
                released: Notify::new(),
                claim_wait,
                next_unit: AtomicU64::new(1),
                defect,
                table: Arc::default(),
            }),
        }
    }

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

    /// A ledger whose every call is a unit of work of its own that commits at once.
    pub fn ledger(&self) -> InMemoryOperationLedger {
        InMemoryOperationLedger {
            shared: Arc::clone(&self.shared),
            unit: None,
        }
    }
}

/// A unit of work on an [`InMemoryStore`]. Dropping it without commit rolls it back.
pub struct InMemoryUnit {
    shared: Arc<Shared>,
    state: Arc<UnitState>,
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

    fn connection_lost(&self) -> Result<(), LedgerError> {
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

/// The ledger port on an [`InMemoryStore`], bound to a unit of work or committing each call.
pub struct InMemoryOperationLedger {
    shared: Arc<Shared>,
    unit: Option<Arc<UnitState>>,
}

impl InMemoryOperationLedger {
    /// A ledger on a fresh store of its own, each call committing at once; for unit tests.
    pub fn new() -> Self {
        InMemoryStore::new(Duration::from_secs(1)).ledger()
    }
}

impl Default for InMemoryOperationLedger {
    fn default() -> Self {
        Self::new()
    }
}

/// The outcome of waiting for a row lock.
enum Lock {
    Held,
    TimedOut,
}

impl InMemoryOperationLedger {
    /// Runs `op`, a write, once the table is not locked by anyone else, waiting at most the claim
    /// wait; past it, `timed_out`.
    async fn writing<T>(
        &self,
        timed_out: LedgerError,
        op: impl Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        let table = self.shared.table.read();
        let _shared = if self.shared.defect == Some(Defect::UnboundedTableLockWait) {
            table.await
        } else {
            match tokio::time::timeout(self.shared.claim_wait, table).await {
                Ok(guard) => guard,
                Err(_) => return Err(timed_out),
            }
        };
        op.await
    }

    /// Runs `op` inside this ledger's unit, or inside a unit of its own that commits at once.
    async fn in_unit<T, F>(&self, op: F) -> Result<T, LedgerError>
    where
        F: AsyncFnOnce(&UnitState) -> Result<T, LedgerError>,
    {
        match &self.unit {
            Some(unit) if unit.killed.load(Ordering::SeqCst) => {
                Err(LedgerError::unavailable(UnavailableKind::ConnectionLost))
            }
            Some(unit) => op(unit).await,
            None => {
                let unit = InMemoryStore {
                    shared: Arc::clone(&self.shared),
                }
                .begin_unit();
                let result = op(&unit.state).await;
                unit.commit_unit();
                result
            }
        }
    }

    /// The row as `unit` sees it: its own uncommitted write, or the committed row.
    fn visible(&self, unit: &UnitState, key: &str) -> Option<OperationRecord> {
        if let Some(own) = unit.pending().rows.get(key) {
            return Some(own.clone());
        }
        self.shared.committed().rows.get(key).cloned()
    }

    /// Whether another unit has inserted `key` and not committed it yet.
    fn uncommitted_elsewhere(&self, unit: &UnitState, key: &str) -> bool {
        let committed = self.shared.committed();
        !committed.rows.contains_key(key)
            && committed
                .locks
                .get(key)
                .is_some_and(|holder| *holder != unit.id)
    }

    /// Takes the row lock on `key` for `unit`, waiting at most the claim wait.
    async fn lock(&self, unit: &UnitState, key: &str) -> Lock {
        let deadline = tokio::time::Instant::now() + self.shared.claim_wait;
        loop {
            let released = self.shared.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut committed = self.shared.committed();
                let holder = *committed.locks.entry(key.to_owned()).or_insert(unit.id);
                if holder == unit.id {
                    return Lock::Held;
                }
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Lock::TimedOut;
            }
        }
    }

    async fn claim_in(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let key = identity.storage_key();
        let in_flight = || LedgerError::InFlight {
            retry_after: self.shared.claim_wait,
        };
        let fresh_version = || {
            if self.shared.defect == Some(Defect::RepeatingVersions) {
                return Version::from_stored(1).expect("1 is a version");
            }
            Version::fresh(
                millis_since_epoch(SystemTime::now()),
                Version::random_salt(),
            )
        };
        let fresh_row = |version: Version| {
            let now = SystemTime::now();
            OperationRecord {
                identity: identity.clone(),
                request_fingerprint: *request,
                version,
                claimed_at: now,
                lease_expires_at: now + lease.get(),
                finished: None,
            }
        };
        match self.shared.defect {
            Some(Defect::InFlightOnUniqueViolation) if self.visible(unit, &key).is_none() => {
                // Read found nothing, so insert; an insert that meets a row once its holder has
                // committed is a unique violation, answered as if the holder were still busy.
                if let Lock::TimedOut = self.lock(unit, &key).await {
                    return Err(in_flight());
                }
                if self.visible(unit, &key).is_some() {
                    return Err(in_flight());
                }
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            Some(Defect::UpsertClaim) => {
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            Some(Defect::ReadThenInsertClaim) if self.visible(unit, &key).is_none() => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            _ => {}
        }
        // Insert-if-absent: a row another unit inserted and has not committed blocks us, as a
        // unique index does, until that unit ends or the bound runs out.
        if self.uncommitted_elsewhere(unit, &key)
            && let Lock::TimedOut = self.lock(unit, &key).await
        {
            return Err(in_flight());
        }
        let existing = match self.visible(unit, &key) {
            Some(row) => row,
            None => {
                if let Lock::TimedOut = self.lock(unit, &key).await {
                    return Err(in_flight());
                }
                // Look again under the lock: a unit may have committed this key in between,
                // and inserting now would overwrite its row.
                match self.visible(unit, &key) {
                    Some(row) => row,
                    None => {
                        let version = fresh_version();
                        unit.pending().rows.insert(key, fresh_row(version));
                        return Ok(ClaimOutcome::Claimed {
                            version,
                            took_over: false,
                        });
                    }
                }
            }
        };
        if existing.request_fingerprint != *request {
            return Err(LedgerError::KeyReusedWithDifferentRequest);
        }
        if existing.state().is_terminal() {
            return Ok(ClaimOutcome::Completed(existing));
        }
        let now = SystemTime::now();
        if let Ok(left) = existing.lease_expires_at.duration_since(now)
            && !left.is_zero()
        {
            return Ok(ClaimOutcome::InProgress {
                record: existing,
                retry_after: left,
            });
        }
        // Fenced takeover: lock the row, then update only if it is still the version we read.
        let fenced = !matches!(
            self.shared.defect,
            Some(Defect::UnfencedTakeover | Defect::TakeoverFencedOnLeaseOnly)
        );
        if !fenced {
            // The round trip between a real store's read and its update, where another taker
            // gets in.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if let Lock::TimedOut = self.lock(unit, &key).await {
            return Err(in_flight());
        }
        let still_ours = |current: &OperationRecord| match self.shared.defect {
            Some(Defect::UnfencedTakeover) => true,
            Some(Defect::TakeoverFencedOnLeaseOnly) => {
                current.lease_expires_at <= SystemTime::now()
            }
            _ => current.version == existing.version,
        };
        match self.visible(unit, &key) {
            Some(current) if still_ours(&current) && !current.state().is_terminal() => {
                let version = existing.version.next();
                unit.pending().rows.insert(key, fresh_row(version));
                Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: true,
                })
            }
            Some(current) if current.state().is_terminal() => Ok(ClaimOutcome::Completed(current)),
            Some(current) => Ok(ClaimOutcome::InProgress {
                retry_after: current
                    .lease_expires_at
                    .duration_since(SystemTime::now())
                    .unwrap_or_default(),
                record: current,
            }),
            None => Err(LedgerError::internal(
                "a claimed row vanished during a takeover",
            )),
        }
    }

    /// A transition in this ledger's unit, once the table is not locked by anyone else.
    async fn transition(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: Completion,
    ) -> Result<Version, LedgerError> {
        self.writing(
            LedgerError::unavailable(UnavailableKind::Timeout),
            self.in_unit(async |unit| {
                self.transition_in(unit, identity, version, completion)
                    .await
            }),
        )
        .await
    }

    async fn transition_in(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: Completion,
    ) -> Result<Version, LedgerError> {
        let key = identity.storage_key();
        if let Lock::TimedOut = self.lock(unit, &key).await {
            return Err(LedgerError::unavailable(UnavailableKind::Timeout));
        }
        let Some(mut row) = self.visible(unit, &key) else {
            return Err(LedgerError::NotClaimed);
        };
        if row.state().is_terminal() {
            return Err(LedgerError::AlreadyCompleted { state: row.state() });
        }
        let versioned = self.shared.defect != Some(Defect::UnversionedTransition);
        if versioned && row.version != version {
            return Err(LedgerError::LostOwnership {
                expected: version,
                current: row.version,
            });
        }
        row.version = row.version.next();
        row.finished = Some((SystemTime::now(), completion));
        let new_version = row.version;
        unit.pending().rows.insert(key, row);
        Ok(new_version)
    }
}

#[async_trait]
impl GrpcOperationLedger for InMemoryOperationLedger {
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let busy = LedgerError::InFlight {
            retry_after: self.shared.claim_wait,
        };
        self.writing(
            busy,
            self.in_unit(async |unit| self.claim_in(unit, identity, request, lease).await),
        )
        .await
    }

    async fn mark_committed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        outcome: &OutcomeReference,
    ) -> Result<Version, LedgerError> {
        let completion = Completion::Committed(outcome.clone());
        self.transition(identity, version, completion).await
    }

    async fn mark_failed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        failure: &RecordedFailure,
    ) -> Result<Version, LedgerError> {
        let completion = Completion::Failed(failure.clone());
        self.transition(identity, version, completion).await
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        let key = identity.storage_key();
        self.in_unit(async |unit| Ok(self.visible(unit, &key)))
            .await
    }

    /// The double's store clock is the process's.
    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        let now = SystemTime::now();
        Ok(self.find(identity).await?.map(|record| {
            let left = match record.finished {
                Some(_) => Duration::ZERO,
                None => record
                    .lease_expires_at
                    .duration_since(now)
                    .unwrap_or_default(),
            };
            (record, left)
        }))
    }

    /// Deletes committed rows directly: purge in the double is not part of a unit of work.
    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        let completed_before = SystemTime::now()
            .checked_sub(retention)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut committed = self.shared.committed();
        let doomed: Vec<String> = committed
            .rows
            .iter()
            .filter(|(key, row)| {
                let old = match row.completed_at() {
                    Some(at) => at < completed_before,
                    None if self.shared.defect == Some(Defect::PurgeInProgress) => {
                        row.lease_expires_at < completed_before
                    }
                    None => false,
                };
                old && !committed.locks.contains_key(*key)
            })
            .map(|(key, _)| key.clone())
            .take(limit.get() as usize)
            .collect();
        for key in &doomed {
            committed.rows.remove(key);
        }
        Ok(doomed.len() as u64)
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Volatile
    }
}

/// The suite's fixture for the double.
pub struct InMemoryFixture {
    pub(crate) claim_wait: Duration,
    pub(crate) defect: Option<Defect>,
}

impl InMemoryFixture {
    /// Fresh stores whose duplicate claims wait at most `claim_wait`.
    pub fn new(claim_wait: Duration) -> Self {
        Self {
            claim_wait,
            defect: None,
        }
    }
}

#[async_trait]
impl LedgerFixture for InMemoryFixture {
    type Store = InMemoryStore;

    /// Nothing to migrate: the double's schema is its types, so it offers no migration hook.
    fn capabilities(&self) -> Capabilities {
        Capabilities::new(self.claim_wait).with_concurrent_claim_identities(200)
    }

    async fn fresh_store(&self) -> InMemoryStore {
        InMemoryStore::build(self.claim_wait, self.defect)
    }

    fn connection_killer(&self) -> Option<&dyn ConnectionKiller<Unit = InMemoryUnit>> {
        Some(self)
    }

    fn table_locking(&self) -> Option<&dyn TableLocking<Store = InMemoryStore>> {
        Some(self)
    }
}

#[async_trait]
impl ConnectionKiller for InMemoryFixture {
    type Unit = InMemoryUnit;

    async fn kill_connection(&self, unit: &InMemoryUnit) {
        unit.kill();
    }
}

#[async_trait]
impl TableLocking for InMemoryFixture {
    type Store = InMemoryStore;

    async fn lock_ledger_table(&self, store: &InMemoryStore) -> Box<dyn HeldTableLock> {
        Box::new(HeldInMemoryTable(
            Arc::clone(&store.shared.table).write_owned().await,
        ))
    }
}

/// The double's table, held alone until released.
struct HeldInMemoryTable(#[allow(dead_code)] OwnedRwLockWriteGuard<()>);

#[async_trait]
impl HeldTableLock for HeldInMemoryTable {
    async fn release(self: Box<Self>) {}
}

#[async_trait]
impl LedgerStore for InMemoryStore {
    type Unit = InMemoryUnit;

    async fn begin(&self) -> Result<InMemoryUnit, LedgerError> {
        Ok(self.begin_unit())
    }

    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(self.ledger())
    }

    async fn business_rows(&self, key: &str) -> u64 {
        self.shared
            .committed()
            .business
            .iter()
            .filter(|k| *k == key)
            .count() as u64
    }

    async fn ledger_rows(&self) -> u64 {
        self.shared.committed().rows.len() as u64
    }

    /// The double's rows are typed records, so its "constraints" are the checked constructors:
    /// a raw row is stored only if it converts into a record.
    async fn write_raw_row(&self, row: RawRow<'_>) -> bool {
        let Some(record) = raw_record(&row, self.shared.next_unit.fetch_add(1, Ordering::Relaxed))
        else {
            return false;
        };
        let key = record.identity.storage_key();
        self.shared.committed().rows.insert(key, record);
        true
    }
}

/// The record a raw row stands for, under a new identity numbered `n`; `None` if it breaks a rule.
fn raw_record(row: &RawRow<'_>, n: u64) -> Option<OperationRecord> {
    let now = SystemTime::now();
    let finished = match row.state.parse::<OperationState>().ok()? {
        OperationState::InProgress => None,
        OperationState::Committed => Some(Completion::Committed(
            OutcomeReference::parse(row.outcome_reference?).ok()?,
        )),
        OperationState::FailedTerminal => Some(Completion::Failed(
            RecordedFailure::from_stored(row.failure_code?, row.failure_message?).ok()?,
        )),
    };
    let finished = match finished {
        Some(completion) if row.completed => Some((now, completion)),
        Some(_) => return None,
        None => None,
    };
    let identity = GrpcOperationIdentity::new(
        CallerFingerprint::parse("raw-rows").ok()?,
        GrpcMethod::parse("/raw.v1.Rows/Write").ok()?,
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(&format!("raw-{n}")).ok()?),
    );
    Some(OperationRecord {
        identity,
        request_fingerprint: RequestFingerprint::of(b"raw"),
        version: Version::fresh(millis_since_epoch(now), 0),
        claimed_at: now,
        lease_expires_at: now,
        finished,
    })
}

#[async_trait]
impl UnitOfWork for InMemoryUnit {
    fn ledger(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(InMemoryUnit::ledger(self))
    }

    async fn business_write(&self, key: &str) -> Result<(), LedgerError> {
        self.connection_lost()?;
        self.write_business(key);
        Ok(())
    }

    async fn commit(self) -> Result<(), LedgerError> {
        self.connection_lost()?;
        self.commit_unit();
        Ok(())
    }

    async fn rollback(self) -> Result<(), LedgerError> {
        self.rollback_unit();
        Ok(())
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
        UnitOfWork::commit(unit).await
    }

    async fn rollback(&self, unit: InMemoryUnit) -> Result<(), LedgerError> {
        UnitOfWork::rollback(unit).await
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Volatile
    }
}

impl InMemoryStore {
    /// The business rows committed so far, in commit order.
    pub fn committed_business(&self) -> Vec<String> {
        self.shared.committed().business.clone()
    }
}

/// Milliseconds since the Unix epoch: the double's store clock, in the unit fresh versions use.
fn millis_since_epoch(time: SystemTime) -> i64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}
