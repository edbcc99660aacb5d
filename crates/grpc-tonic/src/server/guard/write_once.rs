//! Write-once (for handlers whose every effect is in the unit's transaction): a finished
//! operation looked up before the handler, and one record of the finished operation after it.

use grpc_core_api::{
    Completion, GrpcOperationIdentity, LedgerError, LedgerUnitsOfWork, RecordOutcome,
    RequestFingerprint,
};
use tonic::{Response, Status};

use super::unit::Before;
use super::{GuardedHandler, KeyedMutationGuard, Operation};
use crate::metrics::LedgerAnswer;

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// Write-once's step before the handler: a retry of an operation that already finished
    /// replays without running the handler (whose own write could collide with the first one's).
    pub(super) async fn look_up_first(
        &self,
        transaction: &U::Transaction,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
    ) -> Result<Before, Status> {
        let found = self.units.ledger(transaction).find(identity).await?;
        match found.filter(|record| record.state().is_terminal()) {
            Some(record) if record.request_fingerprint != *fingerprint => {
                Err(LedgerError::KeyReusedWithDifferentRequest.into())
            }
            Some(record) => Ok(Before::Replay(Box::new(record))),
            None => Ok(Before::RunHandler { claimed: None }),
        }
    }

    /// Write-once's step after the handler: record the finished operation and commit, or, when
    /// another unit finished it first, roll back and replay that one.
    pub(super) async fn record_and_commit<H: GuardedHandler<U::Transaction>>(
        &self,
        transaction: U::Transaction,
        fingerprint: &RequestFingerprint,
        completion: Completion,
        answer: Result<Response<H::Response>, Status>,
        handler: &H,
        operation: &Operation,
    ) -> Result<Response<H::Response>, Status> {
        let (method, identity) = (operation.method(), operation.identity());
        let recorded = self
            .units
            .ledger(&transaction)
            .record_finished(identity, fingerprint, self.config.lease, &completion)
            .await;
        match recorded {
            Ok(RecordOutcome::Recorded(_)) => {
                self.commit(transaction).await?;
                answer
            }
            Ok(RecordOutcome::Completed(record)) => {
                tracing::debug!(method = %method, "a duplicate finished first; its effect stands");
                self.replay_and_roll_back(transaction, *record, handler, operation)
                    .await
            }
            Ok(RecordOutcome::InProgress { retry_after }) => {
                self.answered(method, LedgerAnswer::InFlight);
                self.roll_back(transaction).await;
                Err(LedgerError::InFlight { retry_after }.into())
            }
            Err(error) => {
                if matches!(error, LedgerError::KeyReusedWithDifferentRequest) {
                    self.answered(method, LedgerAnswer::KeyReused);
                }
                self.roll_back(transaction).await;
                Err(error.into())
            }
        }
    }
}
