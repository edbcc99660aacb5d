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
const EVIDENCE: [Evidence; 3] = [Evidence::NotSent, Evidence::Sent, Evidence::PrefixDelivered];

fn retryable() -> CodeSet {
    CodeSet::of(&[
        Code::Unavailable,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Aborted,
    ])
}

fn facts(class: MethodClass, evidence: Evidence, code: Code) -> AttemptFacts {
    AttemptFacts {
        owner: GrpcRetryOwner::Application,
        class,
        evidence,
        code,
        retryable: retryable(),
        has_key: true,
        ledger: LedgerDurability::Durable,
        sent_attempts: 1,
        max_attempts: 3,
        remaining_deadline: Some(Duration::from_secs(10)),
        next_backoff: Duration::from_millis(100),
        budget_allows: true,
    }
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
                        let f = AttemptFacts {
                            has_key,
                            ledger,
                            ..facts(class, evidence, code)
                        };
                        let verdict = GrpcRetryEligibility::decide(&f);
                        writeln!(table, "{}", GrpcRetryEligibility::explain(&f, verdict)).unwrap();
                        rows += 1;
                    }
                }
            }
        }
    }
    assert_eq!(rows, 4 * 3 * 17 * 2 * 2);
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
            AttemptFacts {
                owner: GrpcRetryOwner::Mesh,
                ..base
            },
            Verdict::Refuse(NotOwner),
        ),
        (
            "nobody retries",
            AttemptFacts {
                owner: GrpcRetryOwner::None,
                evidence: Evidence::NotSent,
                ..base
            },
            Verdict::Refuse(NotOwner),
        ),
        (
            "channel owner",
            AttemptFacts {
                owner: GrpcRetryOwner::Channel,
                ..base
            },
            Verdict::Retry,
        ),
        (
            "attempts used up",
            AttemptFacts {
                sent_attempts: 3,
                ..base
            },
            Verdict::Refuse(AttemptsExhausted),
        ),
        (
            "unsent attempt does not count",
            AttemptFacts {
                sent_attempts: 2,
                evidence: Evidence::NotSent,
                class: MethodClass::NonIdempotent,
                ..base
            },
            Verdict::Retry,
        ),
        (
            "deadline before backoff ends",
            AttemptFacts {
                remaining_deadline: Some(Duration::from_millis(50)),
                ..base
            },
            Verdict::Refuse(DeadlineTooClose),
        ),
        (
            "deadline bounds unsent too",
            AttemptFacts {
                remaining_deadline: Some(Duration::from_millis(50)),
                evidence: Evidence::NotSent,
                ..base
            },
            Verdict::Refuse(DeadlineTooClose),
        ),
        (
            "no deadline",
            AttemptFacts {
                remaining_deadline: None,
                ..base
            },
            Verdict::Retry,
        ),
        (
            "budget exhausted",
            AttemptFacts {
                budget_allows: false,
                ..base
            },
            Verdict::Refuse(BudgetExhausted),
        ),
        (
            "unsent costs no budget",
            AttemptFacts {
                budget_allows: false,
                evidence: Evidence::NotSent,
                ..base
            },
            Verdict::Retry,
        ),
        (
            "keyed resolve needs no budget",
            AttemptFacts {
                budget_allows: false,
                class: MethodClass::KeyedMutation,
                ..base
            },
            Verdict::ResolveCompletionFirst,
        ),
        (
            "keyed aborted retries",
            AttemptFacts {
                class: MethodClass::KeyedMutation,
                code: Code::Aborted,
                ..base
            },
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
}
