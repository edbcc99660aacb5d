//! One unit of work of a guarded call: begin, the protocol's step before the handler, the
//! handler, the protocol's step after, commit or roll back; run to its end in a task of its own.

use std::time::{Duration, Instant};

use grpc_core_api::{
    CallerFingerprint, Completion, GrpcMethod, LedgerUnitsOfWork, OperationRecord,
    REPLAYED_METADATA_KEY, RecordedFailure, RequestFingerprint, Version,
};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Response, Status};

use super::bounds::{AfterCommit, commit_phase, cut_while_working};
use super::{Committed, GuardMode, GuardedHandler, HandlerError, KeyedMutationGuard, Operation};
use crate::metrics::LedgerAnswer;

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// The unit of work of [`run`](Self::run). Claim-first: claim, handler, transition, commit.
    /// Write-once: look the identity up, handler, one record of the finished operation, commit.
    /// A duplicate found at either step is replayed in a read-only unit. A request that says it
    /// is a `resend` is looked up first in a read-only unit under the claiming modes too (see
    /// [`answer_a_resend`](Self::answer_a_resend)).
    pub(super) async fn run_unit<H: GuardedHandler<U::Transaction>>(
        &self,
        mut operation: Operation,
        fingerprint: RequestFingerprint,
        resend: bool,
        message: H::Request,
        handler: &H,
    ) -> Result<Response<H::Response>, Status> {
        // Write-once looks every request up first anyway, in the unit that records it.
        let claims = self.config.mode != GuardMode::WriteOnceInTransactionOnly;
        if resend
            && claims
            && let Some(answer) = self
                .answer_a_resend(&operation, &fingerprint, handler)
                .await
        {
            return answer;
        }
        if self.config.mode == GuardMode::ClaimCommittedFirst {
            return self
                .run_with_committed_claim(operation, fingerprint, message, handler)
                .await;
        }
        let method = operation.method().clone();
        let started = Instant::now();
        let transaction = self.units.begin().await.map_err(Status::from)?;
        let before = match self.config.mode {
            GuardMode::WriteOnceInTransactionOnly => {
                self.look_up_first(&transaction, operation.identity(), &fingerprint)
                    .await
            }
            _ => {
                self.claim_first(&transaction, operation.identity(), &fingerprint)
                    .await
            }
        };
        if let Some(metrics) = &self.metrics {
            metrics.claimed(&method, started.elapsed());
        }
        let claimed = match before {
            Ok(Before::RunHandler { claimed }) => claimed,
            Ok(Before::Replay(record)) => {
                return self
                    .replay_and_roll_back(transaction, *record, handler, &operation)
                    .await;
            }
            Ok(Before::InFlight { retry_after }) => {
                self.roll_back(transaction).await;
                return self
                    .wait_for_twin(&operation, &fingerprint, handler, retry_after)
                    .await;
            }
            Err(status) => {
                return self
                    .refused(&method, operation.identity().caller(), transaction, status)
                    .await;
            }
        };
        operation.taken_over(claimed.is_some_and(|claim| claim.took_over));
        tracing::debug!(method = %method, claimed = claimed.is_some(), "running the handler");
        let handled = handler.handle(&transaction, message, &operation).await;
        let (completion, answer) = match recorded(handled) {
            Ok(recorded) => recorded,
            Err(status) => {
                self.roll_back(transaction).await;
                return Err(status);
            }
        };
        match claimed {
            Some(claim) => {
                self.complete(
                    transaction,
                    operation.identity(),
                    claim.version,
                    &completion,
                )
                .await?;
                answer
            }
            None => {
                self.record_and_commit(
                    transaction,
                    &fingerprint,
                    completion,
                    answer,
                    handler,
                    &operation,
                )
                .await
            }
        }
    }

    /// The ledger's refusal before the handler (ABORTED: an operation in flight;
    /// FAILED_PRECONDITION: a key reused for another request; or the store failing), counted and
    /// logged (the method, the caller's fingerprint, the code: never the key), with the unit
    /// rolled back.
    pub(super) async fn refused<R>(
        &self,
        method: &GrpcMethod,
        caller: &CallerFingerprint,
        transaction: U::Transaction,
        status: Status,
    ) -> Result<Response<R>, Status> {
        match status.code() {
            Code::Aborted => self.answered(method, LedgerAnswer::InFlight),
            Code::FailedPrecondition => self.answered(method, LedgerAnswer::KeyReused),
            _ => {}
        }
        let code = status.code();
        if matches!(code, Code::Unavailable | Code::Internal) {
            tracing::warn!(method = %method, %caller, ?code, "the ledger's store failed before the handler");
        } else {
            tracing::info!(method = %method, %caller, ?code, "refused before the handler");
        }
        self.roll_back(transaction).await;
        Err(status)
    }

    /// Answers a duplicate that the write unit `transaction` found: that unit is rolled back
    /// first (it wrote nothing, and on SQLite it holds the store's one write lock), and the
    /// outcome is replayed in a read-only unit ([`replay_in`](Self::replay_in)).
    pub(super) async fn replay_and_roll_back<H: GuardedHandler<U::Transaction>>(
        &self,
        transaction: U::Transaction,
        record: OperationRecord,
        handler: &H,
        operation: &Operation,
    ) -> Result<Response<H::Response>, Status> {
        self.roll_back(transaction).await;
        let reading = self.units.begin_read().await.map_err(Status::from)?;
        self.replay_in(reading, record, handler, operation).await
    }

    /// Answers a duplicate from `record` (the replayed outcome, or the recorded failure) in the
    /// read-only unit `reading`, which is then rolled back: a replay reads what the operation
    /// left and writes nothing, so it never takes a write lock or waits behind a writer.
    pub(super) async fn replay_in<H: GuardedHandler<U::Transaction>>(
        &self,
        reading: U::Transaction,
        record: OperationRecord,
        handler: &H,
        operation: &Operation,
    ) -> Result<Response<H::Response>, Status> {
        let method = operation.method();
        tracing::info!(
            method = %method,
            caller = %record.identity.caller(),
            state = %record.state(),
            "replaying a finished operation"
        );
        self.answered(method, LedgerAnswer::Replay);
        let answer = match record.finished {
            Some((_, Completion::Committed(outcome))) => handler
                .replay(&reading, outcome, operation)
                .await
                .map(replayed),
            Some((_, Completion::Failed(failure))) => Err(replayed_failure(&failure)),
            None => Err(Status::internal("a completed operation has no outcome")),
        };
        self.roll_back(reading).await;
        answer
    }

    /// Commits the unit of work the guard began, its last, under the commit's own time bound
    /// ([`commit_phase`]); a failed commit is the answer (it did not take effect, or its outcome
    /// is unknown and a keyed retry will find out: `OUTCOME_UNKNOWN`).
    pub(super) async fn commit(&self, transaction: U::Transaction) -> Result<(), Status> {
        self.commit_then(transaction, AfterCommit::Answers).await
    }

    /// [`commit`](Self::commit), saying what the unit does after it.
    pub(super) async fn commit_then(
        &self,
        transaction: U::Transaction,
        after: AfterCommit,
    ) -> Result<(), Status> {
        match commit_phase(after, self.units.commit(transaction)).await {
            Some(committed) => committed.map_err(Status::from),
            // The work's bound cut the unit first: the transaction, never committed, is dropped.
            None => Err(cut_while_working()),
        }
    }

    /// Rolls back the unit of work the guard began. A rollback that fails changes nothing the
    /// caller is told (the store discards an unfinished transaction whose connection ends), so it
    /// is logged and the real answer kept.
    pub(super) async fn roll_back(&self, transaction: U::Transaction) {
        if let Err(error) = self.units.rollback(transaction).await {
            tracing::warn!(%error, "rolling back a unit of work failed; the answer stands");
        }
    }
}

/// How the ledger records what a handler returned, with this caller's answer; `Err` is an answer
/// that is not recorded (see [`terminal_failure`]): the unit is rolled back and the status is the
/// answer.
#[allow(clippy::type_complexity)]
pub(super) fn recorded<R>(
    handled: Result<Committed<R>, HandlerError>,
) -> Result<(Completion, Result<Response<R>, Status>), Status> {
    match handled {
        Ok(Committed { response, outcome }) => {
            Ok((Completion::Committed(outcome), Ok(Response::new(response))))
        }
        Err(failed) => {
            let (failure, status) = terminal_failure(failed)?;
            Ok((Completion::Failed(failure), Err(status)))
        }
    }
}

/// A handler's failure as the ledger records it, with the status this caller gets; `Err` is a
/// failure that is not recorded (a transient one, or a terminal one without an error code): the
/// unit is rolled back and the status is the answer. A message too long or with NUL is recorded
/// in a form the store keeps, while this caller still gets the handler's status as it was.
fn terminal_failure(failed: HandlerError) -> Result<(RecordedFailure, Status), Status> {
    match failed {
        HandlerError::Terminal(status) if HandlerError::is_transient_code(status.code()) => {
            tracing::error!(
                code = ?status.code(),
                "a handler returned a terminal failure with a code that says a retry may succeed; \
                 it is not recorded (return HandlerError::Transient for a passing fault)"
            );
            Err(Status::internal(format!(
                "the handler's terminal failure carries {:?}, which says a retry may succeed: not \
                 recorded, and nothing of the call took effect",
                status.code()
            )))
        }
        HandlerError::Terminal(status) => match RecordedFailure::from_status(&status) {
            Some(failure) => Ok((failure, status)),
            None => Err(Status::internal("a terminal failure needs a non-OK status")),
        },
        HandlerError::Transient(status) => Err(status),
    }
}

fn replayed<R>(response: R) -> Response<R> {
    let mut response = Response::new(response);
    response
        .metadata_mut()
        .insert(REPLAYED_METADATA_KEY, MetadataValue::from_static("true"));
    response
}

fn replayed_failure(failure: &RecordedFailure) -> Status {
    let mut metadata = MetadataMap::new();
    metadata.insert(REPLAYED_METADATA_KEY, MetadataValue::from_static("true"));
    failure.to_status(metadata)
}

/// The claim a unit holds while its handler runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim {
    /// Its version, which fences its transition.
    pub(super) version: Version,
    /// Whether it was taken over from an attempt whose lease ran out.
    pub(super) took_over: bool,
}

/// What the step before the handler decided.
pub(super) enum Before {
    /// Run the handler; `claimed` is the claim (claim-first), or `None` (write-once).
    RunHandler { claimed: Option<Claim> },
    /// The operation already finished: replay this record.
    Replay(Box<OperationRecord>),
    /// Another attempt holds the operation, its lease this long from running out: wait for it
    /// ([`wait_for_twin`](KeyedMutationGuard::wait_for_twin)).
    InFlight { retry_after: Duration },
}
