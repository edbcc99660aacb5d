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
    /// It was sent and nothing came back from the server's application: the connection broke or
    /// the server reset the stream after the request reached it, or the attempt's time ran out.
    /// Whatever status the transport gives it, the outcome is unknown.
    SentNoAnswer,
    /// The response stream delivered a prefix (headers of a non-trailers-only response, or at
    /// least one message): the call is committed and can no longer be retried.
    PrefixDelivered,
}

/// Everything the verdict depends on, for one failed attempt.
///
/// Built with [`new`](Self::new) and the `with_` methods (`#[non_exhaustive]`: a new fact, with
/// its default, breaks no caller); the fields stay public to read. The defaults are the cautious
/// ones: no retryable codes, one attempt of one and a budget that refuses each refuse on their
/// own, so facts a caller forgot to give end in a refusal, not a retry.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
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

impl AttemptFacts {
    /// An attempt of a `class` method that ended with `code`, on a channel owned by `owner`. The
    /// other facts start at their refusing defaults: evidence [`Evidence::Sent`], no retryable
    /// codes, no key, a volatile ledger, 1 attempt sent of at most 1, no deadline, no backoff,
    /// and a budget that refuses.
    pub fn new(owner: GrpcRetryOwner, class: MethodClass, code: Code) -> Self {
        Self {
            owner,
            class,
            evidence: Evidence::Sent,
            code,
            retryable: CodeSet::EMPTY,
            has_key: false,
            ledger: LedgerDurability::Volatile,
            sent_attempts: 1,
            max_attempts: 1,
            remaining_deadline: None,
            next_backoff: Duration::ZERO,
            budget_allows: false,
        }
    }

    /// Who owns retries on the channel.
    pub fn with_owner(mut self, owner: GrpcRetryOwner) -> Self {
        self.owner = owner;
        self
    }

    /// The method's class.
    pub fn with_class(mut self, class: MethodClass) -> Self {
        self.class = class;
        self
    }

    /// The attempt's status.
    pub fn with_code(mut self, code: Code) -> Self {
        self.code = code;
        self
    }

    /// What is known about the attempt.
    pub fn with_evidence(mut self, evidence: Evidence) -> Self {
        self.evidence = evidence;
        self
    }

    /// The codes the method's retry policy retries.
    pub fn with_retryable(mut self, retryable: CodeSet) -> Self {
        self.retryable = retryable;
        self
    }

    /// Whether the call carries a caller idempotency key.
    pub fn with_key(mut self, has_key: bool) -> Self {
        self.has_key = has_key;
        self
    }

    /// The server's ledger durability.
    pub fn with_ledger(mut self, ledger: LedgerDurability) -> Self {
        self.ledger = ledger;
        self
    }

    /// Attempts sent so far (this one included if it was sent).
    pub fn with_sent_attempts(mut self, sent: u32) -> Self {
        self.sent_attempts = sent;
        self
    }

    /// The retry policy's maximum number of attempts.
    pub fn with_max_attempts(mut self, max: u32) -> Self {
        self.max_attempts = max;
        self
    }

    /// Time left before the call's deadline (`None`: the call has none).
    pub fn with_remaining_deadline(mut self, remaining: Option<Duration>) -> Self {
        self.remaining_deadline = remaining;
        self
    }

    /// The backoff before the next attempt.
    pub fn with_next_backoff(mut self, backoff: Duration) -> Self {
        self.next_backoff = backoff;
        self
    }

    /// Whether the retry budget allows a retry now.
    pub fn with_budget_allows(mut self, allows: bool) -> Self {
        self.budget_allows = allows;
        self
    }
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
    /// Whether a call may go out as several copies at once (A6 hedging): only when running it
    /// more than once is harmless. Reads and idempotent methods are; a keyed mutation is when it
    /// carries its key and the server's ledger is durable (the ledger answers every copy after
    /// the first from its record); anything else gets one attempt.
    pub fn may_hedge(class: MethodClass, has_key: bool, ledger: LedgerDurability) -> bool {
        match class {
            MethodClass::NoSideEffects | MethodClass::Idempotent => true,
            MethodClass::KeyedMutation => has_key && ledger == LedgerDurability::Durable,
            MethodClass::NonIdempotent => false,
        }
    }

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
        // 4a. A keyed mutation with a key and a durable ledger whose attempt got no answer has an
        // unknown outcome whatever the status (a reset stream is INTERNAL): look it up. A lookup
        // is not a blind resend, so the policy's codes do not gate it; without a key or a ledger
        // the rules below decide, as for any other sent attempt.
        if facts.class == MethodClass::KeyedMutation
            && facts.evidence == Evidence::SentNoAnswer
            && facts.has_key
            && facts.ledger == LedgerDurability::Durable
        {
            return Verdict::ResolveCompletionFirst;
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
