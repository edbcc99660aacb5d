//! The catalogue of classic adapter defects the suite proves it catches: each is built into a
//! broken variant of the in-memory double (`grpc-operation-ledger-memory`, feature
//! `broken-doubles`, which only the double's own tests enable), and the double's
//! `tests/broken_doubles.rs` shows the case that catches it and for which rule.

/// A classic defect of a ledger adapter, which some contract case must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Defect {
    /// Claim overwrites an existing row, like an ORM save of an entity with a caller-assigned id.
    UpsertClaim,
    /// Claim reads, then inserts if nothing was there, with a window in between.
    ReadThenInsertClaim,
    /// Transitions ignore the version.
    UnversionedTransition,
    /// A takeover overwrites an expired claim without checking that it is still the version it
    /// read and still expired, so two takers of one expired claim can both win.
    UnfencedTakeover,
    /// A takeover re-checks under the row lock that the lease is still expired and the row still
    /// in progress, but not that it is the version it read, and hands out the read version + 1:
    /// a taker that read before another's takeover, whose new lease then ran out, is handed the
    /// same version.
    TakeoverFencedOnLeaseOnly,
    /// A takeover is conditional on the version it read but not on the lease having run out when
    /// its update runs: a renewal (which keeps the version) committed between the taker's read
    /// and its update is overridden, and a live owner loses its operation.
    TakeoverFencedOnVersionOnly,
    /// Claim reads, and inserts when it found nothing; an insert that meets a row (after waiting
    /// for the unit that inserted it to commit) is answered `InFlight`, so a duplicate that waited
    /// never replays.
    InFlightOnUniqueViolation,
    /// Purge deletes IN_PROGRESS rows whose lease has expired too.
    PurgeInProgress,
    /// A write waits for a lock on the whole table for as long as it is held.
    UnboundedTableLockWait,
    /// A fresh claim starts at version 1 again, so a stalled owner of a purged row can complete
    /// the identity's next claim.
    RepeatingVersions,
    /// A lease renewal moves the version on, as a transition does, so the owner that renewed can
    /// no longer finish its own operation.
    RenewalBumpsVersion,
    /// A lease renewal ignores the version, so a stalled owner whose claim was taken over
    /// extends the new owner's lease (and is told it still owns the operation).
    UnfencedRenewal,
    /// A lease renewal counts the lease from the claim time instead of from now, so a handler
    /// that outlives its first lease is taken over while its owner keeps renewing.
    RenewalFromClaimTime,
    /// The census judges "past the retention" by the claim time for every row, so operations
    /// still in progress count as waiting for purge (and gauges show a backlog purge can never
    /// clear).
    CensusCountsInProgressAsPurgeable,
    /// Purge deletes on a connection of its own instead of in the caller's unit of work, so a
    /// rolled-back purge has deleted anyway.
    PurgeOutsideTheUnit,
    /// The reads and transitions leave the caller out of their WHERE clause (the primary key and
    /// the claim's conflict target still hold all three parts): one tenant's `find`, resend or
    /// transition reaches another tenant's row under the same method and key.
    CallerBlindReads,
    /// The reads and transitions leave the method out of their WHERE clause: a key reused across
    /// two methods reaches the other method's row.
    MethodBlindReads,
    /// The claim serialises on a lock of the key hash alone (an advisory lock taken on it, say),
    /// held until the unit ends: a neighbour under another caller or method waits behind another
    /// tenant's uncommitted claim and is refused as in flight.
    ClaimLocksTheKeyAlone,
    /// Rows are written with the store's clock, but leases, takeovers, renewals, look-ups, the
    /// census and purge's cutoff are judged by the process's clock (`SystemTime::now()` bound as
    /// a parameter), which agrees with the store's only when both run on one host.
    ProcessClock,
    /// A COMMIT whose answer was lost is reported as the store being unavailable ("did not take
    /// effect"), as a driver's connection error is everywhere else, although the store committed.
    LostCommitSaidUnavailable,
}
