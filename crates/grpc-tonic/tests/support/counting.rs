//! The in-memory store with a ledger that counts what the guard asks of it: claims, finds, lease
//! renewals and read units.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration,
    LedgerCensus, LedgerDurability, LedgerError, LedgerUnitsOfWork, OperationRecord, RecordOutcome,
    RequestFingerprint, Version,
};
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};

/// What the guard asked of the ledger.
#[derive(Debug, Default)]
pub(crate) struct Asked {
    pub(crate) claims: AtomicU32,
    pub(crate) finds: AtomicU32,
    /// Lease renewals (the lease keeper's, and releases).
    pub(crate) renewals: AtomicU32,
    /// Read-only units begun (a resolve, or a twin's look at an operation in flight).
    pub(crate) reads: AtomicU32,
}

impl Asked {
    /// Claims and finds.
    pub(crate) fn counts(&self) -> (u32, u32) {
        (
            self.claims.load(Ordering::SeqCst),
            self.finds.load(Ordering::SeqCst),
        )
    }
}

/// The in-memory store's units, their ledger counting claims and reads.
pub(crate) struct Counting {
    pub(crate) store: InMemoryStore,
    pub(crate) asked: Arc<Asked>,
}

struct CountingLedger<'t> {
    inner: Box<dyn GrpcOperationLedger + 't>,
    asked: Arc<Asked>,
}

#[async_trait]
impl LedgerUnitsOfWork for Counting {
    type Transaction = InMemoryUnit;

    async fn begin(&self) -> Result<InMemoryUnit, LedgerError> {
        self.store.begin().await
    }

    async fn begin_read(&self) -> Result<InMemoryUnit, LedgerError> {
        self.asked.reads.fetch_add(1, Ordering::SeqCst);
        self.store.begin_read().await
    }

    fn ledger<'t>(&self, transaction: &'t InMemoryUnit) -> Box<dyn GrpcOperationLedger + 't> {
        Box::new(CountingLedger {
            inner: LedgerUnitsOfWork::ledger(&self.store, transaction),
            asked: Arc::clone(&self.asked),
        })
    }

    async fn commit(&self, transaction: InMemoryUnit) -> Result<(), LedgerError> {
        self.store.commit(transaction).await
    }

    async fn rollback(&self, transaction: InMemoryUnit) -> Result<(), LedgerError> {
        self.store.rollback(transaction).await
    }

    fn durability(&self) -> LedgerDurability {
        self.store.durability()
    }
}

#[async_trait]
impl GrpcOperationLedger for CountingLedger<'_> {
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        self.asked.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(identity, request, lease).await
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        self.inner
            .mark_finished(identity, version, completion)
            .await
    }

    /// The store's own single write (not counted as a claim).
    async fn record_finished(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        completion: &Completion,
    ) -> Result<RecordOutcome, LedgerError> {
        self.inner
            .record_finished(identity, request, lease, completion)
            .await
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        self.asked.renewals.fetch_add(1, Ordering::SeqCst);
        self.inner.renew_lease(identity, version, lease).await
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        self.asked.finds.fetch_add(1, Ordering::SeqCst);
        self.inner.find(identity).await
    }

    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        self.inner.look_up(identity).await
    }

    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        self.inner.census(retention).await
    }

    async fn purge(
        &self,
        retention: Duration,
        limit: std::num::NonZeroU32,
    ) -> Result<u64, LedgerError> {
        self.inner.purge(retention, limit).await
    }

    fn durability(&self) -> LedgerDurability {
        self.inner.durability()
    }
}
