//! A twin of an operation in flight: a hedged copy, or a resend that overtook its first attempt,
//! meets a claim another attempt holds. Rather than answer ABORTED at once (which ends a hedged
//! call with that copy's failure while the copy that holds the claim is about to commit), the
//! guard waits a bounded while for the operation to finish and answers with its outcome.

use std::time::Duration;

use grpc_core_api::{LedgerError, LedgerUnitsOfWork, RequestFingerprint};
use tokio::time::Instant;
use tonic::{Response, Status};

use super::{GuardedHandler, KeyedMutationGuard, Operation};
use crate::metrics::LedgerAnswer;

/// The first pause between two looks at an operation in flight; each pause doubles, up to
/// [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(5);
const LONGEST_PAUSE: Duration = Duration::from_millis(100);

/// What one look at an operation in flight found.
enum Found {
    /// It finished: this unit (a read unit) can replay it.
    Finished(Box<grpc_core_api::OperationRecord>),
    /// Still held, its lease this long from running out.
    Held(Duration),
    /// Nobody holds it: its owner released it or its lease ran out (or it was purged), so a
    /// new attempt may claim it.
    Free,
}

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// Answers a call whose operation another attempt holds (its lease `retry_after` from running
    /// out): its outcome once it finishes within [`GuardConfig::in_flight_wait`] (at most half the
    /// lease)
    /// (`idempotent-replayed`, as any replay); else ABORTED, retry after what is left of the
    /// lease (zero when the claim came free: the next attempt claims it). The unit that found it
    /// must already be rolled back: nothing is held while waiting.
    ///
    /// [`GuardConfig::in_flight_wait`]: super::GuardConfig::in_flight_wait
    pub(super) async fn wait_for_twin<H: GuardedHandler<U::Transaction>>(
        &self,
        operation: &Operation,
        fingerprint: &RequestFingerprint,
        handler: &H,
        retry_after: Duration,
    ) -> Result<Response<H::Response>, Status> {
        let gives_up = Instant::now() + self.config.in_flight_bound();
        let mut pause = FIRST_PAUSE;
        let mut retry_after = retry_after;
        while Instant::now() < gives_up {
            tokio::time::sleep(pause.min(gives_up - Instant::now())).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
            let transaction = self.units.begin_read().await.map_err(Status::from)?;
            match self
                .look_at_twin(&transaction, operation, fingerprint)
                .await
            {
                Ok(Found::Finished(record)) => {
                    return self
                        .replay_and_roll_back(transaction, *record, handler, operation)
                        .await;
                }
                Ok(Found::Held(left)) => {
                    retry_after = left;
                    self.roll_back(transaction).await;
                }
                Ok(Found::Free) => {
                    retry_after = Duration::ZERO;
                    self.roll_back(transaction).await;
                    break;
                }
                Err(status) => {
                    self.roll_back(transaction).await;
                    return Err(status);
                }
            }
        }
        let method = operation.method();
        self.answered(method, LedgerAnswer::InFlight);
        tracing::info!(
            method = %method,
            caller = %operation.identity().caller(),
            ?retry_after,
            "refused: the operation is in flight in another attempt"
        );
        Err(LedgerError::InFlight { retry_after }.into())
    }

    /// One look at the operation in flight, on a read unit.
    async fn look_at_twin(
        &self,
        transaction: &U::Transaction,
        operation: &Operation,
        fingerprint: &RequestFingerprint,
    ) -> Result<Found, Status> {
        let found = self
            .units
            .ledger(transaction)
            .look_up(operation.identity())
            .await?;
        Ok(match found {
            None => Found::Free,
            Some((record, _)) if record.request_fingerprint != *fingerprint => {
                self.answered(operation.method(), LedgerAnswer::KeyReused);
                return Err(LedgerError::KeyReusedWithDifferentRequest.into());
            }
            Some((record, _)) if record.state().is_terminal() => Found::Finished(Box::new(record)),
            Some((_, left)) if left.is_zero() => Found::Free,
            Some((_, left)) => Found::Held(left),
        })
    }
}
