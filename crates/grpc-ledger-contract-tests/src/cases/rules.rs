//! The rules the cases check, each with a stable name that failure messages and the adapter
//! author's guide (`docs/adapters.md`) use.

use std::fmt;

/// One rule of the ledger's contract. Every case failure names the rule it saw broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// A claim of an identity without a row inserts it IN_PROGRESS and owns it at a fresh version.
    ClaimNew,
    /// A claim of a finished identity replays the stored record and rewrites nothing.
    ClaimReplays,
    /// Caller, method and key hash together name an operation; change one and it is another.
    IdentityHasThreeParts,
    /// A different request under an existing identity is refused and the row is untouched.
    RequestMustMatch,
    /// `look_up` answers the record with the lease left by the store's clock (zero when finished).
    LookUpLeaseLeft,
    /// A live lease answers InProgress with a retry delay no longer than the lease.
    LiveLeaseIsInProgress,
    /// An expired lease is taken over at the next version, and the previous owner is fenced off.
    ExpiredLeaseTakenOver,
    /// A version, once handed to an owner, is never handed to another owner of the identity.
    OneOwnerPerVersion,
    /// At most one owner ever finishes an operation: a finished row is never claimed again.
    FinishedOnce,
    /// A transition of an identity without a row is NotClaimed and writes nothing.
    TransitionNeedsClaim,
    /// A transition of a finished row is AlreadyCompleted and leaves its outcome as it was.
    TransitionOfFinished,
    /// A transition naming a version that is not current is LostOwnership.
    TransitionFenced,
    /// A transition sets the state and completion and moves the version on by one.
    TransitionRecords,
    /// A version never repeats for an identity, not even after its row was purged.
    VersionsNeverRepeat,
    /// A renewal moves the lease's end alone, at the same version, also after an untaken lapse.
    RenewalKeepsTheOwner,
    /// A renewal by an owner that lost or finished the claim is refused and changes nothing.
    RenewalFenced,
    /// A renewal to the shortest lease hands the operation to the next claim at once.
    ShortestLeaseReleases,
    /// Claim, business write and transition commit or roll back together with the caller's unit,
    /// and so does a purge.
    NoTransactionOfItsOwn,
    /// Concurrent claims of a new identity have exactly one owner.
    OneOwnerPerIdentity,
    /// Concurrent transitions of one claim have exactly one winner.
    OneTransitionWins,
    /// A duplicate behind an uncommitted claim answers InFlight within the claim wait.
    BoundedWaitBehindAClaim,
    /// A duplicate that waited behind an uncommitted claim replays once the holder commits.
    WaiterReplaysTheCommit,
    /// A claim behind a lock on the whole table answers a retryable error within the claim wait.
    BoundedWaitBehindTheTable,
    /// A lost connection is Unavailable, writes nothing half-way, and a retry succeeds.
    LostConnectionIsUnavailable,
    /// A contended claim answers InProgress, InFlight or a retryable error, never Internal.
    ContentionIsRetryable,
    /// Purge deletes at most `limit` finished rows older than the retention, never IN_PROGRESS.
    PurgeOnlyOldFinished,
    /// `census` counts in progress, expired leases, the oldest's age and finished rows past the
    /// retention, by the store's clock.
    CensusCounts,
    /// The store itself refuses rows a replay could not use (CHECK constraints).
    StoreRefusesIllegalRows,
    /// Sixteen starts at once (each on connections of its own) all migrate, and the ledger then
    /// works.
    ConcurrentMigrations,
    /// Hostile text is stored verbatim through bound parameters.
    BoundParameters,
    /// `record_finished` writes the finished row once and replays a duplicate.
    RecordOnce,
    /// Every time the ledger writes or judges comes from the store's clock, never the process's.
    StoresClockOnly,
    /// A COMMIT whose answer was lost is reported as an unknown outcome, never as "did not take
    /// effect", and what it did is then found by the identity.
    UnknownOutcomeIsSaid,
}

impl Rule {
    /// Every rule, in the order the guide lists them.
    pub const ALL: &'static [Rule] = &[
        Rule::ClaimNew,
        Rule::ClaimReplays,
        Rule::IdentityHasThreeParts,
        Rule::RequestMustMatch,
        Rule::LookUpLeaseLeft,
        Rule::LiveLeaseIsInProgress,
        Rule::ExpiredLeaseTakenOver,
        Rule::OneOwnerPerVersion,
        Rule::FinishedOnce,
        Rule::TransitionNeedsClaim,
        Rule::TransitionOfFinished,
        Rule::TransitionFenced,
        Rule::TransitionRecords,
        Rule::VersionsNeverRepeat,
        Rule::RenewalKeepsTheOwner,
        Rule::RenewalFenced,
        Rule::ShortestLeaseReleases,
        Rule::NoTransactionOfItsOwn,
        Rule::OneOwnerPerIdentity,
        Rule::OneTransitionWins,
        Rule::BoundedWaitBehindAClaim,
        Rule::WaiterReplaysTheCommit,
        Rule::BoundedWaitBehindTheTable,
        Rule::LostConnectionIsUnavailable,
        Rule::ContentionIsRetryable,
        Rule::PurgeOnlyOldFinished,
        Rule::CensusCounts,
        Rule::StoreRefusesIllegalRows,
        Rule::ConcurrentMigrations,
        Rule::BoundParameters,
        Rule::RecordOnce,
        Rule::StoresClockOnly,
        Rule::UnknownOutcomeIsSaid,
    ];

    /// The rule's stable name, as the guide's headings use it.
    pub fn name(self) -> &'static str {
        match self {
            Rule::ClaimNew => "claim-new",
            Rule::ClaimReplays => "claim-replays",
            Rule::IdentityHasThreeParts => "identity-has-three-parts",
            Rule::RequestMustMatch => "request-must-match",
            Rule::LookUpLeaseLeft => "look-up-lease-left",
            Rule::LiveLeaseIsInProgress => "live-lease-is-in-progress",
            Rule::ExpiredLeaseTakenOver => "expired-lease-taken-over",
            Rule::OneOwnerPerVersion => "one-owner-per-version",
            Rule::FinishedOnce => "finished-once",
            Rule::TransitionNeedsClaim => "transition-needs-claim",
            Rule::TransitionOfFinished => "transition-of-finished",
            Rule::TransitionFenced => "transition-fenced",
            Rule::TransitionRecords => "transition-records",
            Rule::VersionsNeverRepeat => "versions-never-repeat",
            Rule::RenewalKeepsTheOwner => "renewal-keeps-the-owner",
            Rule::RenewalFenced => "renewal-fenced",
            Rule::ShortestLeaseReleases => "shortest-lease-releases",
            Rule::NoTransactionOfItsOwn => "no-transaction-of-its-own",
            Rule::OneOwnerPerIdentity => "one-owner-per-identity",
            Rule::OneTransitionWins => "one-transition-wins",
            Rule::BoundedWaitBehindAClaim => "bounded-wait-behind-a-claim",
            Rule::WaiterReplaysTheCommit => "waiter-replays-the-commit",
            Rule::BoundedWaitBehindTheTable => "bounded-wait-behind-the-table",
            Rule::LostConnectionIsUnavailable => "lost-connection-is-unavailable",
            Rule::ContentionIsRetryable => "contention-is-retryable",
            Rule::PurgeOnlyOldFinished => "purge-only-old-finished",
            Rule::CensusCounts => "census-counts",
            Rule::StoreRefusesIllegalRows => "store-refuses-illegal-rows",
            Rule::ConcurrentMigrations => "concurrent-migrations",
            Rule::BoundParameters => "bound-parameters",
            Rule::RecordOnce => "record-once",
            Rule::StoresClockOnly => "stores-clock-only",
            Rule::UnknownOutcomeIsSaid => "unknown-outcome-is-said",
        }
    }

    /// What the rule says.
    pub fn text(self) -> &'static str {
        match self {
            Rule::ClaimNew => {
                "a claim of an identity without a row inserts it IN_PROGRESS and owns it at a \
                 fresh version"
            }
            Rule::ClaimReplays => {
                "a claim of a finished identity replays the stored record and rewrites nothing"
            }
            Rule::IdentityHasThreeParts => "caller, method and key hash together name an operation",
            Rule::RequestMustMatch => {
                "a different request under an existing identity is KeyReusedWithDifferentRequest \
                 and the row is untouched"
            }
            Rule::LookUpLeaseLeft => {
                "look_up answers the record and the lease left by the store's clock (zero once \
                 finished)"
            }
            Rule::LiveLeaseIsInProgress => {
                "a claim of an IN_PROGRESS row whose lease is live answers InProgress, retry \
                 delay at most the lease"
            }
            Rule::ExpiredLeaseTakenOver => {
                "an expired lease is taken over at version + 1 (took_over: true) and the previous \
                 owner's transitions are LostOwnership"
            }
            Rule::OneOwnerPerVersion => {
                "a version, once handed to an owner, is never handed to another owner of the same \
                 identity: a takeover holds only if its UPDATE is conditional on the version it \
                 read and on the lease having run out by the store's clock"
            }
            Rule::FinishedOnce => {
                "at most one owner finishes an operation: a finished row is never taken over, and \
                 every replay carries the one recorded outcome"
            }
            Rule::TransitionNeedsClaim => {
                "a transition of an identity without a row is NotClaimed and writes nothing"
            }
            Rule::TransitionOfFinished => {
                "a transition of a finished row is AlreadyCompleted and its outcome stays"
            }
            Rule::TransitionFenced => {
                "a transition naming a version that is not current is LostOwnership { expected, \
                 current } and writes nothing"
            }
            Rule::TransitionRecords => {
                "a transition sets the state, the completion and version + 1, in one conditional \
                 UPDATE"
            }
            Rule::VersionsNeverRepeat => {
                "a version never repeats for an identity, not even after its row was purged"
            }
            Rule::RenewalKeepsTheOwner => {
                "renew_lease of an IN_PROGRESS row at the owner's version moves the lease's end \
                 to `lease` from now by the store's clock and changes nothing else (version, \
                 claim time); it holds for an owner whose lease lapsed untaken, too"
            }
            Rule::RenewalFenced => {
                "renew_lease by an owner that no longer holds the claim is LostOwnership, \
                 AlreadyCompleted or NotClaimed, and writes nothing"
            }
            Rule::ShortestLeaseReleases => {
                "renew_lease to LeaseDuration::SHORTEST lets the next claim take the operation \
                 over at once; inside a unit it commits or rolls back with the unit"
            }
            Rule::NoTransactionOfItsOwn => {
                "the ledger runs in the caller's unit of work: claim, business write and \
                 transition commit or roll back together, and so does a purge"
            }
            Rule::OneOwnerPerIdentity => {
                "concurrent claims of a new identity have exactly one owner (one atomic \
                 insert-if-absent, never read-then-insert or an upsert)"
            }
            Rule::OneTransitionWins => {
                "concurrent transitions of one claim have exactly one winner"
            }
            Rule::BoundedWaitBehindAClaim => {
                "a duplicate behind another unit's uncommitted claim answers InFlight within the \
                 claim wait"
            }
            Rule::WaiterReplaysTheCommit => {
                "a duplicate that waited behind an uncommitted claim replays once the holder \
                 commits (a unique violation after the wait is a replay, not InFlight)"
            }
            Rule::BoundedWaitBehindTheTable => {
                "a claim behind a lock on the whole ledger table answers InFlight or Unavailable \
                 within the claim wait, whatever holds the lock"
            }
            Rule::LostConnectionIsUnavailable => {
                "a lost connection is Unavailable, nothing is half-written, and a retry succeeds"
            }
            Rule::ContentionIsRetryable => {
                "a contended claim answers Claimed, InProgress, InFlight or a retryable \
                 Unavailable, never Internal"
            }
            Rule::PurgeOnlyOldFinished => {
                "purge deletes at most `limit` finished rows completed longer than the retention \
                 ago by the store's clock, and never an IN_PROGRESS row"
            }
            Rule::CensusCounts => {
                "census counts, by the store's clock, the operations in progress, those whose \
                 lease ran out, the oldest one's age, and the finished operations completed \
                 longer than the retention ago (never one in progress)"
            }
            Rule::StoreRefusesIllegalRows => {
                "the store itself refuses rows a replay could not use (unknown state, COMMITTED \
                 without an outcome, finished without a completion time, ...)"
            }
            Rule::ConcurrentMigrations => {
                "processes starting together all apply the migrations, and the ledger then works"
            }
            Rule::BoundParameters => {
                "hostile text is stored verbatim through bound parameters, never executed"
            }
            Rule::RecordOnce => {
                "record_finished inserts the finished row once; a duplicate replays it, another \
                 request is refused, a live claim is in progress"
            }
            Rule::StoresClockOnly => {
                "every time the ledger writes or judges (claim time, lease end, completion, \
                 takeover, renewal, purge cutoff, census) is read from the store's clock, never \
                 the process's, so a store on another host's clock changes nothing"
            }
            Rule::UnknownOutcomeIsSaid => {
                "a commit whose answer never came back is an unknown outcome (OutcomeUnknown), \
                 never Unavailable (\"did not take effect\"), and the operation's row then says \
                 what happened"
            }
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` ({})", self.name(), self.text())
    }
}
