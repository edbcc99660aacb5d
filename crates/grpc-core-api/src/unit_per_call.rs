//! A ledger whose every call is a unit of work of its own.

use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration,
    LedgerCensus, LedgerDurability, LedgerError, LedgerUnitsOfWork, OperationRecord, RecordOutcome,
    RequestFingerprint, Version,
};

/// The ledger on `U`'s store with each call in a unit of work of its own: begun, run, then
/// committed, or rolled back if the call failed.
///
/// It is "statements that commit on their own" for a store whose connections cannot be trusted
/// outside a transaction: behind a transaction pooler (PgBouncer in transaction pooling), a
/// driver that prepares a statement in one round trip and executes it in the next may find its
/// server connection handed to another client in between, while inside a transaction the
/// connection stays its own until the commit. A call's effect is what it would be on an
/// autocommit connection: a claim's row is committed when `claim` returns.
#[derive(Debug, Clone)]
pub struct UnitPerCall<U> {
    units: U,
}

impl<U: LedgerUnitsOfWork> UnitPerCall<U> {
    /// The ledger of `units`, one unit per call.
    pub fn new(units: U) -> Self {
        Self { units }
    }

    /// The units of work the calls run in.
    pub fn units(&self) -> &U {
        &self.units
    }

    /// Commits `transaction` if the call that ran in it succeeded, else rolls it back and
    /// returns the call's error (a failing rollback only abandons a unit the store rolls back
    /// anyway, so it is not what the caller needs to hear).
    async fn finish<T>(
        &self,
        transaction: U::Transaction,
        answer: Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        match answer {
            Ok(value) => {
                self.units.commit(transaction).await?;
                Ok(value)
            }
            Err(error) => {
                let _ = self.units.rollback(transaction).await;
                Err(error)
            }
        }
    }
}

#[async_trait]
impl<U: LedgerUnitsOfWork> GrpcOperationLedger for UnitPerCall<U> {
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self
            .units
            .ledger(&transaction)
            .claim(identity, request, lease)
            .await;
        self.finish(transaction, answer).await
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self
            .units
            .ledger(&transaction)
            .mark_finished(identity, version, completion)
            .await;
        self.finish(transaction, answer).await
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self
            .units
            .ledger(&transaction)
            .renew_lease(identity, version, lease)
            .await;
        self.finish(transaction, answer).await
    }

    async fn record_finished(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        completion: &Completion,
    ) -> Result<RecordOutcome, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self
            .units
            .ledger(&transaction)
            .record_finished(identity, request, lease, completion)
            .await;
        self.finish(transaction, answer).await
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self.units.ledger(&transaction).find(identity).await;
        self.finish(transaction, answer).await
    }

    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self.units.ledger(&transaction).look_up(identity).await;
        self.finish(transaction, answer).await
    }

    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self.units.ledger(&transaction).census(retention).await;
        self.finish(transaction, answer).await
    }

    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        let transaction = self.units.begin().await?;
        let answer = self
            .units
            .ledger(&transaction)
            .purge(retention, limit)
            .await;
        self.finish(transaction, answer).await
    }

    fn durability(&self) -> LedgerDurability {
        self.units.durability()
    }
}
