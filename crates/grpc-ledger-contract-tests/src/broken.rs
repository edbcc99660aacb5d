//! The double's deliberately broken behaviours, for the suite's own tests that prove it catches
//! each one. Only those tests enable the `broken-doubles` feature (a dev-dependency of this crate
//! on itself); without it nothing here is public, and the double users get is never broken.

/// A deliberately broken behaviour of the double.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "broken-doubles"), allow(dead_code, unreachable_pub))]
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
}

#[cfg(feature = "broken-doubles")]
mod constructors {
    use std::time::Duration;

    use super::Defect;
    use crate::{InMemoryFixture, InMemoryStore};

    impl InMemoryStore {
        /// An empty store with `defect`.
        pub fn with_defect(claim_wait: Duration, defect: Defect) -> Self {
            Self::build(claim_wait, Some(defect))
        }
    }

    impl InMemoryFixture {
        /// Fresh stores with `defect`.
        pub fn with_defect(claim_wait: Duration, defect: Defect) -> Self {
            Self {
                claim_wait,
                defect: Some(defect),
            }
        }
    }
}
