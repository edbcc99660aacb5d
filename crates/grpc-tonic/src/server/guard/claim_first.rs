//! Claim-first (the default protocol): the claim before the handler, so that a duplicate never
//! runs it; the claim finished, fenced on its version, after.

use std::time::Instant;

use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, LedgerUnitsOfWork, RequestFingerprint, Version,
};
use tonic::{Response, Status};

use super::KeyedMutationGuard;
use super::handler::GuardedHandler;
use super::operation::Operation;
use super::unit::{Before, Claim};

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// A resend's read first (ADR 0016), in a read-only unit: a finished operation (the likely
    /// case, since its first answer was lost) is replayed there, or refused for another request,
    /// from that one read, with no insert attempt and no write lock. `None` when nothing finished
    /// is recorded (no record, one in progress): the insert-first claim, which alone decides who
    /// runs the handler, comes next. The read is only ever a shortcut to an answer the store
    /// already holds.
    pub(super) async fn answer_a_resend<H: GuardedHandler<U::Transaction>>(
        &self,
        operation: &Operation,
        fingerprint: &RequestFingerprint,
        handler: &H,
    ) -> Option<Result<Response<H::Response>, Status>> {
        let started = Instant::now();
        let reading = match self.units.begin_read().await {
            Ok(reading) => reading,
            Err(error) => return Some(Err(error.into())),
        };
        let found = self
            .look_up_first(&reading, operation.identity(), fingerprint)
            .await;
        let (method, caller) = (operation.method(), operation.identity().caller());
        match found {
            Ok(Before::Replay(record)) => {
                if let Some(metrics) = &self.metrics {
                    metrics.claimed(method, started.elapsed());
                }
                Some(self.replay_in(reading, *record, handler, operation).await)
            }
            Ok(_) => {
                self.roll_back(reading).await;
                None
            }
            Err(status) => Some(self.refused(method, caller, reading, status).await),
        }
    }

    /// Claim-first's step before the handler: the insert-first claim.
    pub(super) async fn claim_first(
        &self,
        transaction: &U::Transaction,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
    ) -> Result<Before, Status> {
        let claim = self
            .units
            .ledger(transaction)
            .claim(identity, fingerprint, self.config.lease)
            .await?;
        match claim {
            ClaimOutcome::Claimed { version, took_over } => Ok(Before::RunHandler {
                claimed: Some(Claim { version, took_over }),
            }),
            ClaimOutcome::Completed(record) => Ok(Before::Replay(Box::new(record))),
            ClaimOutcome::InProgress { retry_after, .. } => Ok(Before::InFlight { retry_after }),
        }
    }

    /// Records how the claimed operation ended and commits the unit of work; if the ledger refuses
    /// the transition (ownership lost, store down), rolls everything back and says why.
    pub(super) async fn complete(
        &self,
        transaction: U::Transaction,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<(), Status> {
        let marked = self
            .units
            .ledger(&transaction)
            .mark_finished(identity, version, completion)
            .await;
        match marked {
            Ok(_) => self.commit(transaction).await,
            Err(error) => {
                self.roll_back(transaction).await;
                Err(error.into())
            }
        }
    }
}
