//! Claim-first (the default protocol): the claim before the handler, so that a duplicate never
//! runs it; the claim finished, fenced on its version, after.

use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, LedgerUnitsOfWork, RequestFingerprint, Version,
};
use tonic::Status;

use super::KeyedMutationGuard;
use super::unit::{Before, Claim};

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// Claim-first's step before the handler: the claim. For a request that says it is a
    /// `resend`, first a read of the identity's record by its key: a finished operation (the
    /// likely case, since its first answer was lost) is replayed, or refused for another
    /// request, from that one read, without the claim's insert attempt. Anything else (no
    /// record, one in progress) goes on to the insert-first claim, which alone decides who runs
    /// the handler: the read is only ever a shortcut to an answer the store already holds.
    pub(super) async fn claim_first(
        &self,
        transaction: &U::Transaction,
        identity: &GrpcOperationIdentity,
        fingerprint: &RequestFingerprint,
        resend: bool,
    ) -> Result<Before, Status> {
        if resend {
            let found = self
                .look_up_first(transaction, identity, fingerprint)
                .await?;
            if let Before::Replay(record) = found {
                return Ok(Before::Replay(record));
            }
        }
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
