//! The contract suite's fixture for the double, with every hook the suite offers.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use grpc_core_api::{
    CallerFingerprint, Completion, GrpcMethod, GrpcOperationIdentity, GrpcOperationLedger,
    IdempotencyKey, KeyHasher, LedgerError, OperationRecord, OperationState, OutcomeReference,
    RecordedFailure, RequestFingerprint, UnavailableKind, Version,
};
use grpc_ledger_contract_tests::{
    Capabilities, ClockSkew, CommitCut, ConnectionKiller, HeldTableLock, LedgerFixture,
    LedgerStore, LostCommit, RawRow, SkewedClock, TableLocking, UnitOfWork,
};
use tokio::sync::OwnedRwLockWriteGuard;

use crate::store::{InMemoryStore, millis_since_epoch};
use crate::units::InMemoryUnit;
use grpc_ledger_contract_tests::Defect;

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

    fn skewed_clock(&self) -> Option<&dyn SkewedClock<Store = InMemoryStore>> {
        Some(self)
    }

    fn lost_commit(&self) -> Option<&dyn LostCommit<Store = InMemoryStore>> {
        Some(self)
    }
}

#[async_trait]
impl LostCommit for InMemoryFixture {
    type Store = InMemoryStore;

    /// The double has no connection to cut: its switch makes the next commit apply and then
    /// answer as a cut connection would have.
    async fn fresh_store_losing_commits(&self) -> (InMemoryStore, Box<dyn CommitCut>) {
        let store = InMemoryStore::build(self.claim_wait, self.defect);
        let switch = LosesNextCommit(Arc::clone(&store.shared));
        (store, Box::new(switch))
    }
}

/// The double's [`CommitCut`].
struct LosesNextCommit(Arc<crate::store::Shared>);

impl CommitCut for LosesNextCommit {
    fn arm(&self) {
        self.0.lose_next_commit.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl SkewedClock for InMemoryFixture {
    type Store = InMemoryStore;

    /// The double's clock is a field of its store: the process's, shifted by `skew`.
    async fn fresh_store_with_clock(&self, skew: ClockSkew) -> InMemoryStore {
        InMemoryStore::build_with_clock(self.claim_wait, self.defect, Some(skew))
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
        let answer_lost = self.shared.lose_next_commit.swap(false, Ordering::SeqCst);
        let defect = self.shared.defect;
        self.commit_unit();
        if !answer_lost {
            return Ok(());
        }
        Err(if defect == Some(Defect::LostCommitSaidUnavailable) {
            LedgerError::unavailable(UnavailableKind::ConnectionLost)
        } else {
            LedgerError::outcome_unknown(UnavailableKind::ConnectionLost)
        })
    }

    async fn rollback(self) -> Result<(), LedgerError> {
        self.rollback_unit();
        Ok(())
    }
}
