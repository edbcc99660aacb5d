//! The mapping from ledger answers to gRPC statuses, with google.rpc error details.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{InvalidInput, LedgerError};

/// The `google.rpc.ErrorInfo` domain of every status this workspace produces.
pub const ERROR_INFO_DOMAIN: &str = "grpc-safe-retries";

/// Response metadata set on an answer replayed from the ledger rather than produced afresh.
pub const REPLAYED_METADATA_KEY: &str = "idempotent-replayed";

/// The `google.rpc.ErrorInfo` reason of a ledger answer: a stable, machine-readable name that
/// clients can branch on without parsing messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorReason {
    /// A keyed mutation arrived without a key.
    IdempotencyKeyMissing,
    /// The key, method or caller of the identity was refused.
    IdempotencyKeyInvalid,
    /// Another argument (outcome reference, failure, lease) was refused.
    ArgumentInvalid,
    /// The key was reused with a different request.
    IdempotencyKeyReused,
    /// The operation is in progress elsewhere.
    IdempotencyInFlight,
    /// A transition found no claim.
    IdempotencyNotClaimed,
    /// A transition found the operation already finished.
    IdempotencyAlreadyCompleted,
    /// A transition found that the claim was taken over.
    IdempotencyOwnershipLost,
    /// The ledger store could not be used; the unit of work did not take effect.
    LedgerUnavailable,
    /// The unit of work was sent to commit and no verdict came back: it may have taken effect.
    /// A resend with the same key finds out.
    OutcomeUnknown,
    /// Anything else.
    LedgerInternal,
}

impl ErrorReason {
    /// The reason as sent in `ErrorInfo.reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "IDEMPOTENCY_KEY_MISSING",
            Self::IdempotencyKeyInvalid => "IDEMPOTENCY_KEY_INVALID",
            Self::ArgumentInvalid => "ARGUMENT_INVALID",
            Self::IdempotencyKeyReused => "IDEMPOTENCY_KEY_REUSED",
            Self::IdempotencyInFlight => "IDEMPOTENCY_IN_FLIGHT",
            Self::IdempotencyNotClaimed => "IDEMPOTENCY_NOT_CLAIMED",
            Self::IdempotencyAlreadyCompleted => "IDEMPOTENCY_ALREADY_COMPLETED",
            Self::IdempotencyOwnershipLost => "IDEMPOTENCY_OWNERSHIP_LOST",
            Self::LedgerUnavailable => "LEDGER_UNAVAILABLE",
            Self::OutcomeUnknown => "OUTCOME_UNKNOWN",
            Self::LedgerInternal => "LEDGER_INTERNAL",
        }
    }
}

impl LedgerError {
    /// The gRPC code and `ErrorInfo` reason of this answer.
    pub fn code_and_reason(&self) -> (Code, ErrorReason) {
        match self {
            Self::InvalidArgument(invalid) => (Code::InvalidArgument, reason_for_invalid(invalid)),
            Self::KeyReusedWithDifferentRequest => {
                (Code::FailedPrecondition, ErrorReason::IdempotencyKeyReused)
            }
            Self::InFlight { .. } => (Code::Aborted, ErrorReason::IdempotencyInFlight),
            // A transition without a claim is the server's own sequencing error; retrying the
            // call cannot fix it, so it is not ABORTED.
            Self::NotClaimed => (Code::FailedPrecondition, ErrorReason::IdempotencyNotClaimed),
            // Both of these mean another attempt decided the operation; a retry of the call
            // replays that decision, which is what ABORTED tells a client to do.
            Self::AlreadyCompleted { .. } => {
                (Code::Aborted, ErrorReason::IdempotencyAlreadyCompleted)
            }
            Self::LostOwnership { .. } => (Code::Aborted, ErrorReason::IdempotencyOwnershipLost),
            Self::Unavailable { .. } => (Code::Unavailable, ErrorReason::LedgerUnavailable),
            Self::OutcomeUnknown { .. } => (Code::Unavailable, ErrorReason::OutcomeUnknown),
            Self::Internal { .. } => (Code::Internal, ErrorReason::LedgerInternal),
        }
    }
}

fn reason_for_invalid(invalid: &InvalidInput) -> ErrorReason {
    use InvalidInput::*;
    match invalid {
        KeyMissing => ErrorReason::IdempotencyKeyMissing,
        KeyEmpty
        | KeyMismatch
        | KeyTooLong { .. }
        | KeyByteNotVisibleAscii { .. }
        | MethodMalformed { .. }
        | CallerEmpty
        | CallerTooLong { .. }
        | CallerByteNotAllowed { .. } => ErrorReason::IdempotencyKeyInvalid,
        SecretTooShort { .. }
        | DigestMalformed { .. }
        | OutcomeReferenceEmpty
        | OutcomeReferenceMalformed
        | FailureCodeIsOk
        | FailureMessageMalformed
        | FailureDetailsTooLong { .. }
        | LeaseOutOfRange
        | DownstreamLabelMalformed
        | StateUnknown
        | VersionOutOfRange => ErrorReason::ArgumentInvalid,
    }
}

impl From<LedgerError> for Status {
    /// The status a server returns for a ledger answer: the code from the contract, the error's
    /// message (which never holds key material), a `google.rpc.ErrorInfo` with the reason, and a
    /// `google.rpc.RetryInfo` when the caller should come back later.
    fn from(error: LedgerError) -> Self {
        let (code, reason) = error.code_and_reason();
        let mut details =
            ErrorDetails::with_error_info(reason.as_str(), ERROR_INFO_DOMAIN, HashMap::new());
        if let LedgerError::InFlight { retry_after } = &error {
            details.set_retry_info(Some(*retry_after));
        }
        Status::with_error_details(code, error.to_string(), details)
    }
}

impl ErrorReason {
    /// Every reason.
    pub const ALL: [ErrorReason; 11] = [
        Self::IdempotencyKeyMissing,
        Self::IdempotencyKeyInvalid,
        Self::ArgumentInvalid,
        Self::IdempotencyKeyReused,
        Self::IdempotencyInFlight,
        Self::IdempotencyNotClaimed,
        Self::IdempotencyAlreadyCompleted,
        Self::IdempotencyOwnershipLost,
        Self::LedgerUnavailable,
        Self::OutcomeUnknown,
        Self::LedgerInternal,
    ];

    /// The reason `status` carries in its `google.rpc.ErrorInfo`, when it is one of this
    /// workspace's (its domain is [`ERROR_INFO_DOMAIN`]).
    pub fn of(status: &Status) -> Option<ErrorReason> {
        let info = status.get_details_error_info()?;
        if info.domain != ERROR_INFO_DOMAIN {
            return None;
        }
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == info.reason)
    }
}

/// Whether `status` says that its call's outcome is unknown: the server sent the unit of work to
/// commit and got no verdict (`ErrorInfo` reason `OUTCOME_UNKNOWN` in this workspace's domain).
/// A client treats it as an attempt that got no answer: a keyed call resolves it by resending
/// with its key before anything else; nothing reports it as "did not happen".
pub fn says_outcome_unknown(status: &Status) -> bool {
    status.code() == Code::Unavailable
        && ErrorReason::of(status) == Some(ErrorReason::OutcomeUnknown)
}

/// Whether `status` is a guard's answer to a copy of an operation another attempt is running
/// (ABORTED, `IDEMPOTENCY_IN_FLIGHT`): not the operation's answer, which that other attempt will
/// give.
pub fn says_in_flight(status: &Status) -> bool {
    status.code() == Code::Aborted
        && ErrorReason::of(status) == Some(ErrorReason::IdempotencyInFlight)
}
