//! The eligibility table over the whole cross product, as a snapshot a reviewer can read, plus the
//! rules the cross product holds fixed.

use std::fmt::Write;
use std::time::Duration;

use expect_test::expect_file;
use grpc_core_api::LedgerDurability;
use grpc_policy::{
    ALL_CODES, AttemptFacts, CodeSet, Evidence, GrpcRetryEligibility, GrpcRetryOwner, MethodClass,
    RefusalReason, Verdict,
};
use tonic::Code;

const CLASSES: [MethodClass; 4] = [
    MethodClass::NoSideEffects,
    MethodClass::Idempotent,
    MethodClass::KeyedMutation,
    MethodClass::NonIdempotent,
];
const EVIDENCE: [Evidence; 4] = [
    Evidence::NotSent,
    Evidence::Sent,
    Evidence::SentNoAnswer,
    Evidence::PrefixDelivered,
];

fn retryable() -> CodeSet {
    CodeSet::of(&[
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Aborted,
    ])
}

fn facts(class: MethodClass, evidence: Evidence, code: Code) -> AttemptFacts {
    AttemptFacts::new(GrpcRetryOwner::Application, class, code)
        .with_evidence(evidence)
        .with_retryable(retryable())
        .with_key(true)
        .with_ledger(LedgerDurability::Durable)
        .with_sent_attempts(1)
        .with_max_attempts(3)
        .with_remaining_deadline(Some(Duration::from_secs(10)))
        .with_next_backoff(Duration::from_millis(100))
        .with_budget_allows(true)
}

/// Every class x evidence x status code x key x durability, with the owner Application, attempt 1
/// of 3, an ample deadline, a budget that allows, and UNAVAILABLE, DEADLINE_EXCEEDED,
/// RESOURCE_EXHAUSTED and ABORTED retryable.
#[test]
fn cross_product_matches_the_snapshot() {
    let mut table = String::new();
    let mut rows = 0;
    for class in CLASSES {
        for evidence in EVIDENCE {
            for code in ALL_CODES {
                for has_key in [true, false] {
                    for ledger in [LedgerDurability::Durable, LedgerDurability::Volatile] {
                        let f = facts(class, evidence, code)
                            .with_key(has_key)
                            .with_ledger(ledger);
                        let verdict = GrpcRetryEligibility::decide(&f);
                        writeln!(table, "{}", GrpcRetryEligibility::explain(&f, verdict)).unwrap();
                        rows += 1;
                    }
                }
            }
        }
    }
    assert_eq!(rows, 4 * 4 * 17 * 2 * 2);
    expect_file!["snapshots/eligibility.txt"].assert_eq(&table);
}

#[test]
fn rules_held_fixed_by_the_cross_product() {
    use RefusalReason::*;
    let base = facts(MethodClass::Idempotent, Evidence::Sent, Code::Unavailable);
    let cases: Vec<(&str, AttemptFacts, Verdict)> = vec![
        ("baseline", base, Verdict::Retry),
        (
            "mesh owns retries",
            base.with_owner(GrpcRetryOwner::Mesh),
            Verdict::Refuse(NotOwner),
        ),
        (
            "nobody retries",
            base.with_owner(GrpcRetryOwner::None)
                .with_evidence(Evidence::NotSent),
            Verdict::Refuse(NotOwner),
        ),
        (
            "channel owner",
            base.with_owner(GrpcRetryOwner::Channel),
            Verdict::Retry,
        ),
        (
            "attempts used up",
            base.with_sent_attempts(3),
            Verdict::Refuse(AttemptsExhausted),
        ),
        (
            "unsent attempt does not count",
            base.with_sent_attempts(2)
                .with_evidence(Evidence::NotSent)
                .with_class(MethodClass::NonIdempotent),
            Verdict::Retry,
        ),
        (
            "deadline before backoff ends",
            base.with_remaining_deadline(Some(Duration::from_millis(50))),
            Verdict::Refuse(DeadlineTooClose),
        ),
        (
            // The design's table: only a deadline *shorter* than the backoff refuses.
            "deadline exactly the backoff",
            base.with_remaining_deadline(Some(base.next_backoff)),
            Verdict::Retry,
        ),
        (
            "deadline bounds unsent too",
            base.with_remaining_deadline(Some(Duration::from_millis(50)))
                .with_evidence(Evidence::NotSent),
            Verdict::Refuse(DeadlineTooClose),
        ),
        (
            "no deadline",
            base.with_remaining_deadline(None),
            Verdict::Retry,
        ),
        (
            "budget exhausted",
            base.with_budget_allows(false),
            Verdict::Refuse(BudgetExhausted),
        ),
        (
            "unsent costs no budget",
            base.with_budget_allows(false)
                .with_evidence(Evidence::NotSent),
            Verdict::Retry,
        ),
        (
            "keyed resolve needs no budget",
            base.with_budget_allows(false)
                .with_class(MethodClass::KeyedMutation),
            Verdict::ResolveCompletionFirst,
        ),
        (
            "keyed aborted retries",
            base.with_class(MethodClass::KeyedMutation)
                .with_code(Code::Aborted),
            Verdict::Retry,
        ),
    ];
    for (what, f, expected) in cases {
        assert_eq!(GrpcRetryEligibility::decide(&f), expected, "{what}");
    }
}

#[test]
fn verdicts_say_why() {
    assert_eq!(
        Verdict::Refuse(RefusalReason::NoDurableLedger).to_string(),
        "refuse: a keyed mutation needs a durable ledger to be retried"
    );
    assert_eq!(Verdict::Retry.to_string(), "retry");
    // Every reason says its own why.
    let reasons = [
        RefusalReason::NotOwner,
        RefusalReason::PrefixDelivered,
        RefusalReason::AttemptsExhausted,
        RefusalReason::DeadlineTooClose,
        RefusalReason::NonRetryableStatus,
        RefusalReason::NotIdempotent,
        RefusalReason::MissingKey,
        RefusalReason::NoDurableLedger,
        RefusalReason::BudgetExhausted,
    ];
    let texts: std::collections::HashSet<String> =
        reasons.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), reasons.len(), "{texts:?}");
    assert!(texts.iter().all(|text| text.len() > 10), "{texts:?}");
}

#[test]
fn facts_left_at_their_defaults_end_in_a_refusal() {
    for class in CLASSES {
        for code in ALL_CODES {
            let bare = AttemptFacts::new(GrpcRetryOwner::Application, class, code);
            assert!(
                matches!(GrpcRetryEligibility::decide(&bare), Verdict::Refuse(_)),
                "{class:?} {code:?}"
            );
        }
    }
    // Each cautious default refuses on its own, every other fact allowing a retry.
    let allowed = facts(MethodClass::Idempotent, Evidence::Sent, Code::Unavailable);
    assert_eq!(GrpcRetryEligibility::decide(&allowed), Verdict::Retry);
    let defaults = AttemptFacts::new(
        GrpcRetryOwner::Application,
        MethodClass::Idempotent,
        Code::Unavailable,
    );
    for (fact, one_default) in [
        (
            "retryable codes",
            allowed.with_retryable(defaults.retryable),
        ),
        (
            "max attempts",
            allowed.with_max_attempts(defaults.max_attempts),
        ),
        ("budget", allowed.with_budget_allows(defaults.budget_allows)),
    ] {
        assert!(
            matches!(
                GrpcRetryEligibility::decide(&one_default),
                Verdict::Refuse(_)
            ),
            "{fact} at its default"
        );
    }
}

#[test]
fn only_calls_safe_to_run_twice_are_hedged() {
    use LedgerDurability::{Durable, Volatile};
    for (class, has_key, ledger, hedged) in [
        (MethodClass::NoSideEffects, false, Volatile, true),
        (MethodClass::Idempotent, false, Volatile, true),
        (MethodClass::KeyedMutation, true, Durable, true),
        (MethodClass::KeyedMutation, false, Durable, false),
        (MethodClass::KeyedMutation, true, Volatile, false),
        (MethodClass::NonIdempotent, true, Durable, false),
    ] {
        assert_eq!(
            GrpcRetryEligibility::may_hedge(class, has_key, ledger),
            hedged,
            "{class:?} key={has_key} {ledger:?}"
        );
    }
}
