//! The state of an operation as the ledger records it.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::{GrpcOperationIdentity, InvalidInput, RequestFingerprint};

/// Where an operation is in its life. Stored by name (`IN_PROGRESS`, `COMMITTED`,
/// `FAILED_TERMINAL`), never as an ordinal, so that adding a state cannot relabel stored rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationState {
    /// Claimed; its owner has not finished it.
    InProgress,
    /// Finished successfully; the outcome reference says where the result is.
    Committed,
    /// Finished with a failure that a retry must replay, not redo.
    FailedTerminal,
}

impl OperationState {
    /// Every state, in lifecycle order.
    pub const ALL: [Self; 3] = [Self::InProgress, Self::Committed, Self::FailedTerminal];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "IN_PROGRESS",
            Self::Committed => "COMMITTED",
            Self::FailedTerminal => "FAILED_TERMINAL",
        }
    }

    /// Whether the operation has finished (committed or failed terminally).
    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::InProgress)
    }
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OperationState {
    type Err = InvalidInput;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
            .ok_or(InvalidInput::StateUnknown)
    }
}

/// The version of a ledger row: the fencing token a transition must name, so that only the current
/// owner can finish an operation.
///
/// A fresh claim's version is the claim time by the store's clock, in milliseconds, shifted left
/// by [`CLAIM_TIME_SHIFT`](Self::CLAIM_TIME_SHIFT) bits, plus a random salt below
/// 2^[`SALT_BITS`](Self::SALT_BITS); each takeover or transition adds one. So a version never
/// repeats for an identity, even when its row is purged and the identity claimed afresh: the new
/// claim happens after the purge, which happens after the old row completed, so by a store clock
/// that does not run backwards its version exceeds every version the old row ever had (the
/// shift leaves room for almost a million transitions per claim). Should the store's clock step
/// back (a failover to a host whose clock lags), the salt still makes a repeat a 1-in-65536 event
/// for the one stale owner that would also have to complete in that window. The reasoning is in
/// `docs/adr/0007-fences-that-never-repeat.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(u64);

impl Version {
    /// How far a fresh claim's time is shifted left in its version.
    pub const CLAIM_TIME_SHIFT: u32 = 20;
    /// How many low bits of a fresh version are random salt.
    pub const SALT_BITS: u32 = 16;

    /// The version of a claim made at `claimed_at_millis` (milliseconds since the Unix epoch by
    /// the store's clock) with `salt`; stores that compute it in SQL use the same formula
    /// (`now * 2^20 + salt`).
    pub fn fresh(claimed_at_millis: i64, salt: u16) -> Self {
        let millis = u64::try_from(claimed_at_millis.max(0)).unwrap_or(0);
        Self(((millis << Self::CLAIM_TIME_SHIFT) | u64::from(salt)).max(1))
    }

    /// A random salt for [`fresh`](Self::fresh), from the standard library's per-process random
    /// hash keys (it needs to be unpredictable across restarts, not secret).
    pub fn random_salt() -> u16 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        );
        hasher.finish() as u16
    }

    /// A version as stored (a `BIGINT`): at least 1.
    pub fn from_stored(stored: i64) -> Result<Self, InvalidInput> {
        u64::try_from(stored)
            .ok()
            .filter(|v| *v >= 1)
            .map(Self)
            .ok_or(InvalidInput::VersionOutOfRange)
    }

    /// The version as stored.
    pub fn to_stored(self) -> i64 {
        // A fresh version is below 2^63 until the year 2248; i64::MAX transitions cannot happen.
        i64::try_from(self.0).unwrap_or(i64::MAX)
    }

    /// The version after one more transition.
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How long a claim protects its owner before another attempt may take it over: more than zero,
/// at most one day, in whole milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseDuration(Duration);

impl LeaseDuration {
    const MAX: Duration = Duration::from_secs(24 * 60 * 60);

    /// The shortest lease, one millisecond: renewing a claim to it ends the claim's protection at
    /// once, so the next attempt takes it over instead of waiting out the lease (how an owner
    /// that gives up hands its operation on).
    pub const SHORTEST: Self = Self(Duration::from_millis(1));

    /// Checks that the lease is at least one millisecond and at most a day.
    pub fn new(lease: Duration) -> Result<Self, InvalidInput> {
        if lease < Duration::from_millis(1) || lease > Self::MAX {
            return Err(InvalidInput::LeaseOutOfRange);
        }
        Ok(Self(Duration::from_millis(lease.as_millis() as u64)))
    }

    /// The lease as a duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// The lease in whole milliseconds.
    pub fn as_millis(self) -> i64 {
        // At most a day, so it fits.
        self.0.as_millis() as i64
    }
}

/// Where the result of a committed operation can be found (a payment id, a row key), so that a
/// replay can rebuild the response: 1 to 1024 bytes, no NUL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutcomeReference(String);

impl OutcomeReference {
    const MAX_LEN: usize = 1024;

    /// Checks the reference. An empty one is refused: a committed row without an outcome could
    /// never be replayed.
    pub fn parse(reference: &str) -> Result<Self, InvalidInput> {
        if reference.is_empty() {
            return Err(InvalidInput::OutcomeReferenceEmpty);
        }
        if reference.len() > Self::MAX_LEN || reference.contains('\0') {
            return Err(InvalidInput::OutcomeReferenceMalformed);
        }
        Ok(Self(reference.to_owned()))
    }

    /// The reference.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A terminal failure recorded for replay: a gRPC status code other than OK, a message of at
/// most 1024 bytes without NUL, and the status's binary details (`grpc-status-details-bin`, an
/// encoded `google.rpc.Status`) of at most 8 KiB, possibly empty. A replay returns all three, so a
/// duplicate sees what the first caller saw. The message and details are shown to callers on
/// replay, so they must hold no key material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedFailure {
    code: tonic::Code,
    message: String,
    details: Vec<u8>,
}

impl RecordedFailure {
    const MAX_MESSAGE_LEN: usize = 1024;
    /// The most detail bytes a failure keeps.
    pub const MAX_DETAILS_LEN: usize = 8 * 1024;

    /// Checks and builds a recorded failure.
    pub fn new(code: tonic::Code, message: &str) -> Result<Self, InvalidInput> {
        if code == tonic::Code::Ok {
            return Err(InvalidInput::FailureCodeIsOk);
        }
        if message.len() > Self::MAX_MESSAGE_LEN || message.contains('\0') {
            return Err(InvalidInput::FailureMessageMalformed);
        }
        Ok(Self {
            code,
            message: message.to_owned(),
            details: Vec::new(),
        })
    }

    /// The same failure with the status's binary details; details over
    /// [`MAX_DETAILS_LEN`](Self::MAX_DETAILS_LEN) bytes are refused.
    pub fn with_details(mut self, details: &[u8]) -> Result<Self, InvalidInput> {
        if details.len() > Self::MAX_DETAILS_LEN {
            return Err(InvalidInput::FailureDetailsTooLong { len: details.len() });
        }
        self.details = details.to_vec();
        Ok(self)
    }

    /// A failure that can always be recorded: the message with NUL replaced by U+FFFD and cut at
    /// a character boundary to at most 1024 bytes; `None` only for the code OK, which is not a
    /// failure. The caller that produced the failure still gets its full status; replays get
    /// this form.
    pub fn lossy(code: tonic::Code, message: &str) -> Option<Self> {
        if code == tonic::Code::Ok {
            return None;
        }
        let mut kept = message.replace('\0', "\u{fffd}");
        if kept.len() > Self::MAX_MESSAGE_LEN {
            let mut end = Self::MAX_MESSAGE_LEN;
            while !kept.is_char_boundary(end) {
                end -= 1;
            }
            kept.truncate(end);
        }
        Some(Self {
            code,
            message: kept,
            details: Vec::new(),
        })
    }

    /// The failure a tonic status stands for, in the form the store keeps
    /// ([`lossy`](Self::lossy) message; details kept when they fit, dropped otherwise); `None`
    /// for OK.
    pub fn from_status(status: &tonic::Status) -> Option<Self> {
        let failure = Self::lossy(status.code(), status.message())?;
        Some(
            failure
                .clone()
                .with_details(status.details())
                .unwrap_or(failure),
        )
    }

    /// The status a replay returns: code, message and details as recorded, with `metadata`.
    pub fn to_status(&self, metadata: tonic::metadata::MetadataMap) -> tonic::Status {
        tonic::Status::with_details_and_metadata(
            self.code,
            self.message.clone(),
            self.details.clone().into(),
            metadata,
        )
    }

    /// Reads a failure as stored: the numeric code and the message.
    pub fn from_stored(code: i32, message: &str) -> Result<Self, InvalidInput> {
        if !(1..=16).contains(&code) {
            return Err(InvalidInput::FailureCodeIsOk);
        }
        Self::new(tonic::Code::from_i32(code), message)
    }

    /// The status code.
    pub fn code(&self) -> tonic::Code {
        self.code
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The status's binary details; empty when it had none.
    pub fn details(&self) -> &[u8] {
        &self.details
    }
}

/// How a finished operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Committed, with the reference a replay rebuilds the response from.
    Committed(OutcomeReference),
    /// Failed terminally, with the failure a replay returns.
    Failed(RecordedFailure),
}

/// One row of the ledger, as read.
///
/// The types carry the row's invariants: a version is at least 1, a committed row has an outcome
/// reference and a finished row has a completion time (both live in [`Completion`] and
/// `completed_at` together).
///
/// Deliberately exhaustive (not `#[non_exhaustive]`), and built by adapters from their rows: a
/// new field would be a new fact every adapter must store and read back, so it should break
/// them at compile time rather than default silently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationRecord {
    /// Which operation.
    pub identity: GrpcOperationIdentity,
    /// The fingerprint of the request that claimed it.
    pub request_fingerprint: RequestFingerprint,
    /// The row's current version.
    pub version: Version,
    /// When the current owner claimed it (by the store's clock).
    pub claimed_at: SystemTime,
    /// When the current owner's lease runs out (by the store's clock).
    pub lease_expires_at: SystemTime,
    /// When and how it finished; `None` while in progress.
    pub finished: Option<(SystemTime, Completion)>,
}

impl OperationRecord {
    /// The state, derived from whether and how the operation finished.
    pub fn state(&self) -> OperationState {
        match &self.finished {
            None => OperationState::InProgress,
            Some((_, Completion::Committed(_))) => OperationState::Committed,
            Some((_, Completion::Failed(_))) => OperationState::FailedTerminal,
        }
    }

    /// The outcome reference of a committed operation.
    pub fn outcome_reference(&self) -> Option<&OutcomeReference> {
        match &self.finished {
            Some((_, Completion::Committed(reference))) => Some(reference),
            _ => None,
        }
    }

    /// The recorded failure of an operation that failed terminally.
    pub fn failure(&self) -> Option<&RecordedFailure> {
        match &self.finished {
            Some((_, Completion::Failed(failure))) => Some(failure),
            _ => None,
        }
    }

    /// When it finished.
    pub fn completed_at(&self) -> Option<SystemTime> {
        self.finished.as_ref().map(|(at, _)| *at)
    }
}

/// The answer to a claim.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new variant would be a new answer every
/// caller must handle, so it should break their `match` rather than fall into a wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller owns the operation at `version` and must finish it with that version (its
    /// fencing token).
    /// `took_over` is true when an earlier owner's lease had expired and this claim fenced it off.
    Claimed {
        /// The version the owner's transition must name.
        version: Version,
        /// Whether an expired claim was taken over.
        took_over: bool,
    },
    /// Another owner holds a live lease; come back after `retry_after` (derived from the lease,
    /// by the store's clock).
    InProgress {
        /// The row as read.
        record: OperationRecord,
        /// How long until the lease runs out.
        retry_after: Duration,
    },
    /// The operation already finished: replay the record's outcome or failure.
    Completed(OperationRecord),
}

/// The answer to [`record_finished`](crate::GrpcOperationLedger::record_finished): whether this
/// unit of work's finished operation is the one recorded.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new variant would be a new answer every
/// caller must handle, so it should break their `match` rather than fall into a wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The operation is recorded as finished at this version: commit the unit of work.
    Recorded(Version),
    /// Another unit finished this operation first: roll this one back and replay the record.
    Completed(Box<OperationRecord>),
    /// Another unit holds the operation in progress (a claim-first owner): roll back, and come
    /// back after `retry_after`.
    InProgress {
        /// How long until that owner's lease runs out.
        retry_after: Duration,
    },
}
