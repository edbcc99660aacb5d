//! One retry verdict from the method, the evidence and the status together.

use std::fmt;
use std::time::Duration;

use grpc_core_api::LedgerDurability;
use tonic::Code;

use crate::{CodeSet, GrpcRetryOwner, MethodClass, code_name};

/// What is known about the failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Evidence {
    /// It failed before any byte left the process: the server cannot have seen it.
    NotSent,
    /// It was sent; no response headers (other than a trailers-only response) and no message came
    /// back.
    Sent,
    /// The response stream delivered a prefix (headers of a non-trailers-only response, or at
    /// least one message): the call is committed and can no longer be retried.
    PrefixDelivered,
}

/// Everything the verdict depends on, for one failed attempt.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts {
    /// Who owns retries on the channel.
    pub owner: GrpcRetryOwner,
    /// The method's class.
    pub class: MethodClass,
    /// What is known about the attempt.
    pub evidence: Evidence,
    /// The attempt's status.
    pub code: Code,
    /// The codes the method's retry policy retries.
    pub retryable: CodeSet,
    /// Whether the call carries a caller idempotency key.
    pub has_key: bool,
    /// The server's ledger durability, as the ledger port reports it.
    pub ledger: LedgerDurability,
    /// Attempts that were sent so far, this one included if it was sent. Attempts that were never
    /// sent do not count (as A6's transparent retries).
    pub sent_attempts: u32,
    /// The retry policy's maximum number of attempts.
    pub max_attempts: u32,
    /// Time left before the call's deadline, if it has one.
    pub remaining_deadline: Option<Duration>,
    /// The backoff before the next attempt.
    pub next_backoff: Duration,
    /// Whether the retry budget allows a retry now ([`crate::GrpcRetryBudget::allows_retry`]).
    pub budget_allows: bool,
}

/// Why a retry was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RefusalReason {
    /// The owner is the mesh or nobody: nothing in the process retries.
    NotOwner,
    /// The response stream delivered a prefix: the call is committed.
    PrefixDelivered,
    /// The retry policy's attempts are used up.
    AttemptsExhausted,
    /// The deadline would pass before the next attempt could start.
    DeadlineTooClose,
    /// The status is not retryable for this method.
    NonRetryableStatus,
    /// The method is not idempotent and was sent.
    NotIdempotent,
    /// A keyed mutation without a caller key cannot be deduplicated.
    MissingKey,
    /// A keyed mutation needs a durable ledger on the server to be retried safely.
    NoDurableLedger,
    /// The retry budget is exhausted: the dependency is given room to recover.
    BudgetExhausted,
}

impl RefusalReason {
    fn describe(self) -> &'static str {
        match self {
            Self::NotOwner => "the channel's retry owner is not in this process",
            Self::PrefixDelivered => "the response already delivered a prefix",
            Self::AttemptsExhausted => "the retry policy's attempts are used up",
            Self::DeadlineTooClose => "the deadline would pass during the backoff",
            Self::NonRetryableStatus => "the status is not retryable for this method",
            Self::NotIdempotent => "the method is not idempotent and was sent",
            Self::MissingKey => "a keyed mutation arrived without an idempotency key",
            Self::NoDurableLedger => "a keyed mutation needs a durable ledger to be retried",
            Self::BudgetExhausted => "the retry budget is exhausted",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// The decision for one failed attempt, with its reason.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): a new variant would be a new answer every
/// caller must handle, so it should break their `match` rather than fall into a wildcard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Send the call again.
    Retry,
    /// The outcome is unknown: ask the server (or its ledger) what became of the operation before
    /// deciding whether to send it again with the same key.
    ResolveCompletionFirst,
    /// Do not retry, for this reason.
    Refuse(RefusalReason),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry => f.write_str("retry"),
            Self::ResolveCompletionFirst => {
                f.write_str("resolve completion first: the mutation's outcome is unknown")
            }
            Self::Refuse(reason) => write!(f, "refuse: {reason}"),
        }
    }
}

/// The retry decision table (ADR 0001: one decision over the method's class, the evidence about
/// the attempt and the status), first matching rule wins.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcRetryEligibility;

impl GrpcRetryEligibility {
    /// The verdict for one failed attempt.
    pub fn decide(facts: &AttemptFacts) -> Verdict {
        use RefusalReason::*;
        // 1. Only an in-process owner retries in-process.
        if !facts.owner.allows_in_process_retry() {
            return Verdict::Refuse(NotOwner);
        }
        // 2. A delivered prefix commits the call.
        if facts.evidence == Evidence::PrefixDelivered {
            return Verdict::Refuse(PrefixDelivered);
        }
        // 3. Attempts and deadline bound every retry, transparent ones included.
        if facts.sent_attempts >= facts.max_attempts {
            return Verdict::Refuse(AttemptsExhausted);
        }
        if facts
            .remaining_deadline
            .is_some_and(|left| left < facts.next_backoff)
        {
            return Verdict::Refuse(DeadlineTooClose);
        }
        // 4. Nothing reached the server: resending cannot duplicate anything.
        if facts.evidence == Evidence::NotSent {
            return Verdict::Retry;
        }
        // 5. The method's policy decides which statuses are worth another attempt.
        if !facts.retryable.contains(facts.code) {
            return Verdict::Refuse(NonRetryableStatus);
        }
        match facts.class {
            // 6. A sent non-idempotent call may have run.
            MethodClass::NonIdempotent => return Verdict::Refuse(NotIdempotent),
            // 7. A keyed mutation is safe to repeat only with a key and a durable ledger.
            MethodClass::KeyedMutation if !facts.has_key => return Verdict::Refuse(MissingKey),
            MethodClass::KeyedMutation if facts.ledger != LedgerDurability::Durable => {
                return Verdict::Refuse(NoDurableLedger);
            }
            // 8. The outcome of a sent mutation that timed out or lost its transport is unknown.
            MethodClass::KeyedMutation
                if matches!(facts.code, Code::DeadlineExceeded | Code::Unavailable) =>
            {
                return Verdict::ResolveCompletionFirst;
            }
            _ => {}
        }
        // 9. Everything else is a retry, if the budget still allows one.
        if facts.budget_allows {
            Verdict::Retry
        } else {
            Verdict::Refuse(BudgetExhausted)
        }
    }

    /// One line describing a decision, for logs and snapshots.
    pub fn explain(facts: &AttemptFacts, verdict: Verdict) -> String {
        format!(
            "{:?} {:?} {} key={} ledger={:?} -> {verdict}",
            facts.class,
            facts.evidence,
            code_name(facts.code),
            if facts.has_key { "yes" } else { "no" },
            facts.ledger,
        )
    }
}
