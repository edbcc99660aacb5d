//! Typed errors. Messages start lowercase and never contain key material: an invalid key is
//! described by its length or the position of the offending byte, never by its bytes.

use std::time::Duration;

use crate::{OperationState, Version};

/// A value refused by a checked constructor, before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The request carried no idempotency key where one is required.
    #[error("idempotency key is missing")]
    KeyMissing,
    /// The request carried its idempotency key twice, in its metadata and in its body, and the two
    /// differ.
    #[error("the idempotency key in the metadata and the one in the request differ")]
    KeyMismatch,
    /// The idempotency key is empty.
    #[error("idempotency key is empty")]
    KeyEmpty,
    /// The idempotency key is longer than 255 bytes.
    #[error("idempotency key is {len} bytes long; at most 255 are allowed")]
    KeyTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The idempotency key holds a byte outside visible ASCII (0x21..=0x7E).
    #[error("idempotency key byte at position {position} is not visible ASCII")]
    KeyByteNotVisibleAscii {
        /// Zero-based position of the first offending byte.
        position: usize,
    },
    /// The server secret for keyed hashing is too short.
    #[error("server secret is {len} bytes long; at least 16 are required")]
    SecretTooShort {
        /// Its length in bytes.
        len: usize,
    },
    /// The full method name is not `/package.Service/Method`.
    #[error("method name is malformed: {reason}")]
    MethodMalformed {
        /// What is wrong.
        reason: &'static str,
    },
    /// The caller fingerprint is empty.
    #[error("caller fingerprint is empty")]
    CallerEmpty,
    /// The caller fingerprint is longer than 128 bytes.
    #[error("caller fingerprint is {len} bytes long; at most 128 are allowed")]
    CallerTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The caller fingerprint holds a byte outside visible ASCII, or `|`.
    #[error("caller fingerprint byte at position {position} is not visible ASCII or is '|'")]
    CallerByteNotAllowed {
        /// Zero-based position of the first offending byte.
        position: usize,
    },
    /// A stored digest is not 64 lower-case hex digits.
    #[error("{what} is not 64 lower-case hex digits")]
    DigestMalformed {
        /// Which digest.
        what: &'static str,
    },
    /// The outcome reference of a commit is empty.
    #[error("outcome reference is empty")]
    OutcomeReferenceEmpty,
    /// The outcome reference is longer than 1024 bytes or holds NUL.
    #[error("outcome reference is longer than 1024 bytes or contains NUL")]
    OutcomeReferenceMalformed,
    /// A recorded failure must carry a status code other than OK.
    #[error("a recorded failure needs a status code other than OK")]
    FailureCodeIsOk,
    /// The failure message is longer than 1024 bytes or holds NUL.
    #[error("failure message is longer than 1024 bytes or contains NUL")]
    FailureMessageMalformed,
    /// The failure's binary details are longer than 8 KiB.
    #[error("failure details are {len} bytes long; at most 8192 are allowed")]
    FailureDetailsTooLong {
        /// Their length in bytes.
        len: usize,
    },
    /// A downstream call's label is empty, too long, or holds a byte a label may not.
    #[error("downstream label is not 1 to 64 bytes of ASCII letters, digits, '.', '_' and '-'")]
    DownstreamLabelMalformed,
    /// A lease must be between 1 ms and one day.
    #[error("lease must be between 1 ms and 24 h")]
    LeaseOutOfRange,
    /// A stored state name is not one of the known states.
    #[error("stored state is not one of IN_PROGRESS, COMMITTED, FAILED_TERMINAL")]
    StateUnknown,
    /// A stored version is below 1.
    #[error("stored version is below 1")]
    VersionOutOfRange,
}

/// Why the store could not be used. Every kind is transient: retrying later may succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnavailableKind {
    /// The connection to the store broke or could not be made.
    ConnectionLost,
    /// No pooled connection became free in time.
    PoolTimeout,
    /// The store aborted the transaction to keep it serialisable; retry the whole unit of work.
    SerializationFailure,
    /// A statement ran past its time limit.
    Timeout,
    /// The store is shutting down, starting up, read-only (a standby), out of disk or memory, or
    /// otherwise refusing work.
    StoreNotReady,
    /// The store's single write lock stayed taken by other units of work past the wait bound
    /// (SQLite): busy, not a duplicate of this request.
    StoreBusy,
    /// The store itself said it cannot tell whether the statement completed (PostgreSQL's 40003).
    CompletionUnknown,
}

impl UnavailableKind {
    fn describe(self) -> &'static str {
        match self {
            Self::ConnectionLost => "connection to the ledger store was lost",
            Self::PoolTimeout => "no ledger store connection became free in time",
            Self::SerializationFailure => "the ledger store aborted a conflicting transaction",
            Self::Timeout => "a ledger statement timed out",
            Self::StoreNotReady => "the ledger store is not accepting work",
            Self::StoreBusy => "the ledger store is busy with other writers",
            Self::CompletionUnknown => "the ledger store could not tell whether it completed",
        }
    }
}

impl std::fmt::Display for UnavailableKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Everything a ledger operation can answer besides success. The gRPC status of each variant is
/// documented on it and implemented by `From<LedgerError> for tonic::Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// A value was refused before any write. INVALID_ARGUMENT.
    #[error(transparent)]
    InvalidArgument(#[from] InvalidInput),
    /// The identity was claimed with a different request fingerprint: the caller reused a key for
    /// another request. The stored row is untouched. FAILED_PRECONDITION.
    #[error("idempotency key was already used with a different request")]
    KeyReusedWithDifferentRequest,
    /// Another attempt holds the operation and is still working on it, or a duplicate waited the
    /// configured bound behind another transaction's uncommitted claim. ABORTED, with a retry
    /// delay.
    #[error("operation is in flight; retry after {retry_after:?}")]
    InFlight {
        /// When a retry may find it finished.
        retry_after: Duration,
    },
    /// A transition named an operation that was never claimed. FAILED_PRECONDITION.
    #[error("operation was not claimed")]
    NotClaimed,
    /// A transition named an operation that already finished; the stored outcome is unchanged.
    /// ABORTED: a retry of the call replays the stored outcome.
    #[error("operation already completed as {state}")]
    AlreadyCompleted {
        /// The state it finished in.
        state: OperationState,
    },
    /// A transition named a version that is no longer current: the lease expired and another
    /// attempt took the operation over. ABORTED.
    #[error("ownership was lost: expected version {expected}, found {current}")]
    LostOwnership {
        /// The version the caller named.
        expected: Version,
        /// The version stored now.
        current: Version,
    },
    /// The store could not be used, and the unit of work did not take effect: it failed before
    /// its COMMIT was sent, or the store said the COMMIT was refused. UNAVAILABLE, never
    /// INTERNAL. A failure while committing whose outcome nobody can know is
    /// [`OutcomeUnknown`](Self::OutcomeUnknown) instead.
    #[error("ledger unavailable: {kind}")]
    Unavailable {
        /// What failed.
        kind: UnavailableKind,
    },
    /// The unit of work's COMMIT was sent and no verdict came back: the connection broke while
    /// committing, the store said it cannot tell (PostgreSQL's 40003
    /// `statement_completion_unknown`), or the commit's own time bound ran out. It may have taken
    /// effect or not, and nothing on this side can say which. UNAVAILABLE with the `ErrorInfo`
    /// reason `OUTCOME_UNKNOWN`: a resend with the same key finds out (it replays what committed,
    /// or claims afresh what did not); a caller without a key must look the effect up before it
    /// tells anyone the call failed.
    #[error("the ledger unit's outcome is unknown: {kind} while committing")]
    OutcomeUnknown {
        /// What broke while committing.
        kind: UnavailableKind,
    },
    /// Anything else: a corrupt row, a bug. INTERNAL. The message holds no key material.
    #[error("ledger internal error: {message}")]
    Internal {
        /// What went wrong.
        message: String,
    },
}

impl LedgerError {
    /// Shorthand for [`LedgerError::Unavailable`].
    pub fn unavailable(kind: UnavailableKind) -> Self {
        Self::Unavailable { kind }
    }

    /// Shorthand for [`LedgerError::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal {
            message: message.into(),
        }
    }

    /// Shorthand for [`LedgerError::OutcomeUnknown`].
    pub fn outcome_unknown(kind: UnavailableKind) -> Self {
        Self::OutcomeUnknown { kind }
    }

    /// This error as the answer to a COMMIT: only a refusal the store stated (a serialisation
    /// failure, which rolls the unit back; SQLite's busy write lock, which leaves it uncommitted)
    /// or an error that means a bug keeps its meaning; any other failure of the store while
    /// committing leaves the outcome unknown.
    pub fn at_commit(self) -> Self {
        match self {
            Self::Unavailable {
                kind: UnavailableKind::SerializationFailure | UnavailableKind::StoreBusy,
            } => self,
            Self::Unavailable { kind } => Self::OutcomeUnknown { kind },
            other => other,
        }
    }

    /// Whether a retry of the whole unit of work may succeed. Not for
    /// [`OutcomeUnknown`](Self::OutcomeUnknown): the unit may have taken effect, and only a
    /// resend that the ledger deduplicates (the same key) may follow it.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::InFlight { .. })
    }

    /// Whether the unit of work may have taken effect although this error was the answer.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Self::OutcomeUnknown { .. })
    }
}
