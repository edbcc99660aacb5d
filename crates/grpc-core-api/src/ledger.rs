//! The operation ledger port.

use std::num::NonZeroU32;
use std::time::Duration;

use async_trait::async_trait;

use crate::{
    ClaimOutcome, Completion, GrpcOperationIdentity, LeaseDuration, LedgerError, OperationRecord,
    OutcomeReference, RecordOutcome, RecordedFailure, RequestFingerprint, Version,
};

/// Whether a ledger's records survive a restart of the process that wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerDurability {
    /// Records survive a process restart (a database).
    Durable,
    /// Records die with the process (the in-memory double). The retry policy refuses
    /// keyed-mutation retries on such a ledger, since a restart would forget what ran.
    Volatile,
}

/// The durable record of keyed operations that makes a mutation run exactly once even when its
/// response is lost and the caller retries.
///
/// An adapter is correct exactly when it passes the contract suite in
/// `grpc-ledger-contract-tests`; each sentence below is one or more cases there.
///
/// # Claim
///
/// - `claim` MUST be one atomic insert-if-absent on the identity (in SQL, one
///   `INSERT ... ON CONFLICT DO NOTHING`) followed, only when nothing was inserted, by a read of
///   the existing row. It MUST NOT be an upsert, an ORM save of an entity with a caller-assigned
///   key, or a read followed by an insert.
/// - When no row exists, `claim` MUST insert one in `IN_PROGRESS` at a fresh version
///   ([`Version::fresh`] of the store's clock) and return `Claimed { version, took_over: false }`.
///   A version MUST never repeat for an identity, even after its row was purged: a stalled owner
///   of a purged claim MUST get `LostOwnership` from the fresh claim's row.
/// - When a row exists with a different request fingerprint, `claim` MUST return
///   `KeyReusedWithDifferentRequest` and MUST leave the row untouched, whatever its state.
/// - When the row is `COMMITTED` or `FAILED_TERMINAL`, `claim` MUST return `Completed` with the
///   stored record, and MUST NOT change its outcome, failure or version.
/// - When the row is `IN_PROGRESS` and its lease has not expired by the store's clock, `claim`
///   MUST return `InProgress` with the time left on the lease.
/// - When the row is `IN_PROGRESS` and its lease has expired by the store's clock, `claim` MUST
///   take it over with one conditional update on the old version, and return
///   `Claimed { version: old + 1, took_over: true }`; the previous owner's transitions then fail
///   with `LostOwnership`.
/// - When another unit of work holds an uncommitted claim of the same identity, `claim` MUST wait
///   no longer than the adapter's configured bound, then return `InFlight`.
///
/// # Transitions
///
/// - `mark_finished` (which `mark_committed` and `mark_failed` call) MUST be one conditional
///   update of the row in `IN_PROGRESS` at the given version, setting the state, the outcome or
///   failure and the completion time and bumping the version; it returns the new version.
/// - When that update changes nothing, it MUST NOT report success: it MUST return `NotClaimed`
///   when there is no row, `AlreadyCompleted` when the row finished (leaving its outcome
///   unchanged) and `LostOwnership` when the row is in progress at another version, whichever
///   completion it was given.
///
/// # Transactions
///
/// - An adapter MUST NOT open a transaction of its own for `claim` or the transitions inside the
///   transaction its caller gave it: it runs on that transaction, so that the claim, the business
///   write and the transition commit or roll back together. Given a bare connection or pool, each
///   call commits before it returns (it may wrap that one call's statements in a short
///   transaction of its own, for example to bound its lock waits).
/// - A claim MUST NOT wait for a lock (another unit's uncommitted claim, a lock on the whole
///   table, the store's write lock) longer than the adapter's configured claim wait: past it, it
///   answers `InFlight` (behind another claim) or `Unavailable`.
/// - A store fault MUST be returned as `Unavailable` (never `Internal`, never a panic), and the
///   unit of work MUST then be safe to retry from the start.
///
/// # Lease renewal
///
/// - `renew_lease` MUST be one conditional update of the row in `IN_PROGRESS` at the given
///   version, setting its lease to end `lease` from now by the store's clock and changing nothing
///   else: not the version (the owner's transition still names it), not the claim time.
/// - It MUST succeed for the owner whose lease already ran out when nobody took the claim over:
///   the version, not the clock, says who owns an operation.
/// - When that update changes nothing, it MUST NOT report success: it answers as a transition
///   does (`NotClaimed`, `AlreadyCompleted`, `LostOwnership`), and the row is left as it was.
/// - Renewing to [`LeaseDuration::SHORTEST`] releases the claim: the next claim takes it over.
///
/// # Other operations
///
/// - `find` MUST return the stored record, or `None`; `look_up` the same with the time the lease
///   has left by the store's clock.
/// - `purge` MUST delete at most `limit` rows that are `COMMITTED` or `FAILED_TERMINAL` and
///   completed more than `retention` ago by the store's clock (never the caller's), MUST NOT
///   delete an `IN_PROGRESS` row, and returns the count.
/// - `census(retention)` MUST count, in one read and by the store's clock, the operations in
///   progress, those of them whose lease has run out, the age of the oldest in progress, and the
///   finished operations completed more than `retention` ago (what `purge` has yet to delete).
/// - `durability` MUST be `Durable` only if records survive a process restart.
#[cfg_attr(feature = "mock", mockall::automock)]
#[async_trait]
pub trait GrpcOperationLedger: Send + Sync {
    /// Claims an operation for the caller, or says why it cannot (see the trait's contract).
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError>;

    /// Keeps a claimed operation's lease alive for its owner: the lease ends `lease` from now by
    /// the store's clock, at the same version (see the trait's contract). A guard whose claim
    /// commits before its handler renews it while the handler runs, so that no other attempt
    /// takes the operation over from a live owner.
    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError>;

    /// Finishes a claimed operation as `completion` says (committed with its outcome, or failed
    /// terminally): one update fenced on `version`; returns the row's new version (see the
    /// trait's contract). The one transition an adapter writes; the two below call it.
    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError>;

    /// Finishes a claimed operation successfully: [`mark_finished`](Self::mark_finished) with
    /// the outcome.
    async fn mark_committed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        outcome: &OutcomeReference,
    ) -> Result<Version, LedgerError> {
        let completion = Completion::Committed(outcome.clone());
        self.mark_finished(identity, version, &completion).await
    }

    /// Finishes a claimed operation with a terminal failure: [`mark_finished`](Self::mark_finished)
    /// with the failure.
    async fn mark_failed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        failure: &RecordedFailure,
    ) -> Result<Version, LedgerError> {
        let completion = Completion::Failed(failure.clone());
        self.mark_finished(identity, version, &completion).await
    }

    /// Records an operation as finished in one step, inside the unit of work that has already
    /// made its effects (the guard's write-once mode): the row is written once, as `completion`
    /// says, instead of claimed first and finished later. A unit that finds the identity
    /// finished by another gets that record back (roll back and replay it); one that finds it in
    /// progress gets `InProgress`; a different request under the key is
    /// `KeyReusedWithDifferentRequest`; an expired claim is taken over as `claim` does. While
    /// another unit's uncommitted record of the same identity exists, the call waits for it at
    /// most the claim wait, then answers `InFlight`.
    ///
    /// The default claims and finishes in the same unit ([`record_by_claim`]); an adapter
    /// overrides it with a single insert of the finished row where its store allows.
    async fn record_finished(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        completion: &Completion,
    ) -> Result<RecordOutcome, LedgerError> {
        record_by_claim(self, identity, request, lease, completion).await
    }

    /// Reads an operation's record.
    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError>;

    /// Reads an operation's record with the time its lease has left (zero once it finished or
    /// expired) by the store's clock, read in the same statement as the row: for a caller asking
    /// what became of it. There is no default, because only the adapter can read its store's
    /// clock (a store without a clock of its own, like the in-memory double, uses the process's).
    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError>;

    /// Counts the operations as gauges and an operator's overview need them (see the trait's
    /// contract): never a key, a row or anything but counts and an age.
    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError>;

    /// Deletes at most `limit` finished operations completed more than `retention` ago by the
    /// store's clock.
    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError>;

    /// Whether records survive a restart.
    fn durability(&self) -> LedgerDurability;
}

/// A ledger's operations counted by the store's clock ([`GrpcOperationLedger::census`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LedgerCensus {
    /// Operations claimed and not finished.
    pub in_progress: u64,
    /// Operations in progress whose lease has run out: their owner died or hangs, and the next
    /// resend under their key takes them over.
    pub expired_leases: u64,
    /// The age of the oldest operation in progress (`None` when there is none).
    pub oldest_in_progress: Option<Duration>,
    /// Finished operations completed longer than the retention ago: what purge has yet to delete.
    pub past_retention: u64,
}

impl LedgerCensus {
    /// A census of these counts.
    pub fn new(
        in_progress: u64,
        expired_leases: u64,
        oldest_in_progress: Option<Duration>,
        past_retention: u64,
    ) -> Self {
        Self {
            in_progress,
            expired_leases,
            oldest_in_progress,
            past_retention,
        }
    }
}

/// Units of work on a ledger's store, each with the ledger bound to it: what a server-side guard
/// needs to run the claim, the business write and the transition in one transaction, without
/// naming the store.
///
/// `Transaction` is the store's own transaction (a SeaORM `DatabaseTransaction`, say); the guard
/// hands it to the business code so that its writes join the same unit of work.
#[async_trait]
pub trait LedgerUnitsOfWork: Send + Sync {
    /// The store's transaction.
    type Transaction: Send + Sync;

    /// Begins a unit of work.
    async fn begin(&self) -> Result<Self::Transaction, LedgerError>;

    /// Begins a unit of work that only reads (a resolve RPC's look-up): read-only where the store
    /// has such transactions, and never holding a write lock (SQLite's single writer is left to
    /// the claims). Roll it back when done. The default begins an ordinary unit, for stores where
    /// a read costs nothing more in one.
    async fn begin_read(&self) -> Result<Self::Transaction, LedgerError> {
        self.begin().await
    }

    /// The ledger running inside `transaction`.
    fn ledger<'t>(&self, transaction: &'t Self::Transaction) -> Box<dyn GrpcOperationLedger + 't>;

    /// Commits the unit of work.
    async fn commit(&self, transaction: Self::Transaction) -> Result<(), LedgerError>;

    /// Rolls the unit of work back.
    async fn rollback(&self, transaction: Self::Transaction) -> Result<(), LedgerError>;

    /// Whether the store's records survive a restart.
    fn durability(&self) -> LedgerDurability;
}

/// Shared units of work are units of work: a guard and the tasks it starts (the one that keeps a
/// claim's lease alive) hold one store between them.
#[async_trait]
impl<U: LedgerUnitsOfWork> LedgerUnitsOfWork for std::sync::Arc<U> {
    type Transaction = U::Transaction;

    async fn begin(&self) -> Result<Self::Transaction, LedgerError> {
        (**self).begin().await
    }

    async fn begin_read(&self) -> Result<Self::Transaction, LedgerError> {
        (**self).begin_read().await
    }

    fn ledger<'t>(&self, transaction: &'t Self::Transaction) -> Box<dyn GrpcOperationLedger + 't> {
        (**self).ledger(transaction)
    }

    async fn commit(&self, transaction: Self::Transaction) -> Result<(), LedgerError> {
        (**self).commit(transaction).await
    }

    async fn rollback(&self, transaction: Self::Transaction) -> Result<(), LedgerError> {
        (**self).rollback(transaction).await
    }

    fn durability(&self) -> LedgerDurability {
        (**self).durability()
    }
}

/// [`GrpcOperationLedger::record_finished`] in two steps: `claim`, then the transition, in the
/// caller's unit of work (the claimed row is never seen by another unit before the commit). The
/// trait's default, and an adapter's way when its one-step insert finds the identity taken.
pub async fn record_by_claim<L: GrpcOperationLedger + ?Sized>(
    ledger: &L,
    identity: &GrpcOperationIdentity,
    request: &RequestFingerprint,
    lease: LeaseDuration,
    completion: &Completion,
) -> Result<RecordOutcome, LedgerError> {
    match ledger.claim(identity, request, lease).await? {
        ClaimOutcome::Claimed { version, .. } => Ok(RecordOutcome::Recorded(
            ledger.mark_finished(identity, version, completion).await?,
        )),
        ClaimOutcome::Completed(record) => Ok(RecordOutcome::Completed(Box::new(record))),
        ClaimOutcome::InProgress { retry_after, .. } => {
            Ok(RecordOutcome::InProgress { retry_after })
        }
    }
}

/// Why a transition naming `version` changed no row, from the row as it is now (`current`, read
/// after the conditional UPDATE matched nothing): `NotClaimed` without a row, `AlreadyCompleted`
/// for a finished one, `LostOwnership` when another version holds it. A zero-row transition is
/// never success; a row that is still in progress at `version` means the UPDATE's condition is
/// wrong, which is `Internal`.
///
/// ```
/// use grpc_core_api::{LedgerError, Version, unmatched_transition};
/// let version = Version::fresh(1_764_700_000_000, 7);
/// assert_eq!(unmatched_transition(None, version), LedgerError::NotClaimed);
/// ```
pub fn unmatched_transition(current: Option<&OperationRecord>, version: Version) -> LedgerError {
    match current {
        None => LedgerError::NotClaimed,
        Some(record) if record.state().is_terminal() => LedgerError::AlreadyCompleted {
            state: record.state(),
        },
        Some(record) if record.version != version => LedgerError::LostOwnership {
            expected: version,
            current: record.version,
        },
        Some(_) => {
            LedgerError::internal("a transition matched no row although the claim is current")
        }
    }
}
