//! The guard's answers to every fault of the ledger port, driven by a mocked ledger: what the
//! caller is told, and what was run, committed and rolled back.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::*;
use grpc_tonic::{Committed, KeyedMutationGuard};
use support::payments::*;
use support::scripted;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Units of work whose ledger is a mock, to drive the fault paths.
struct MockUnits {
    make: Box<dyn Fn() -> MockGrpcOperationLedger + Send + Sync>,
    commits: AtomicU32,
    rollbacks: AtomicU32,
    rollback_fails: bool,
}

#[async_trait]
impl LedgerUnitsOfWork for MockUnits {
    type Transaction = ();
    async fn begin(&self) -> Result<(), LedgerError> {
        Ok(())
    }
    fn ledger<'t>(&self, _: &'t ()) -> Box<dyn GrpcOperationLedger + 't> {
        Box::new((self.make)())
    }
    async fn commit(&self, _: ()) -> Result<(), LedgerError> {
        self.commits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    async fn rollback(&self, _: ()) -> Result<(), LedgerError> {
        self.rollbacks.fetch_add(1, Ordering::SeqCst);
        if self.rollback_fails {
            return Err(LedgerError::unavailable(UnavailableKind::ConnectionLost));
        }
        Ok(())
    }
    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}

fn claimed() -> ClaimOutcome {
    ClaimOutcome::Claimed {
        version: Version::fresh(1_764_700_000_000, 1),
        took_over: false,
    }
}

async fn run_mocked_with(
    make: impl Fn() -> MockGrpcOperationLedger + Send + Sync + 'static,
    rollback_fails: bool,
) -> (Result<tonic::Response<String>, Status>, u32, u32, u32) {
    let units = MockUnits {
        make: Box::new(make),
        commits: AtomicU32::new(0),
        rollbacks: AtomicU32::new(0),
        rollback_fails,
    };
    let guard = KeyedMutationGuard::new(units, guard_config());
    let runs = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&runs);
    let answer = guard
        .run(
            &method(),
            request(1, Some("k"), Some("a")),
            scripted(
                |_unit, _pay: Pay| async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    Ok(Committed {
                        response: "ok".to_owned(),
                        outcome: OutcomeReference::parse("p").unwrap(),
                    })
                },
                |_outcome| async move { Ok("replayed".to_owned()) },
            ),
        )
        .await;
    let units = guard.units();
    (
        answer,
        runs.load(Ordering::SeqCst),
        units.commits.load(Ordering::SeqCst),
        units.rollbacks.load(Ordering::SeqCst),
    )
}

/// One fault of the ledger port, and what the guard must make of it.
struct Fault {
    name: &'static str,
    /// What the claim answers.
    claim: fn() -> Result<ClaimOutcome, LedgerError>,
    /// What recording the completion answers, if the handler gets that far.
    finish: Option<fn() -> Result<Version, LedgerError>>,
    /// Whether the rollback itself fails (the connection is gone).
    rollback_fails: bool,
    /// The status the caller gets, and the `ErrorInfo` reason it must carry, if one.
    code: Code,
    reason: Option<&'static str>,
    /// The `RetryInfo` delay the status must carry, if any.
    retry_delay: Option<Duration>,
    /// Handler runs, commits and rollbacks.
    effects: (u32, u32, u32),
}

fn unavailable<T>() -> Result<T, LedgerError> {
    Err(LedgerError::unavailable(UnavailableKind::ConnectionLost))
}

#[tokio::test]
async fn ledger_faults_roll_everything_back_and_answer_the_right_status() {
    let faults = [
        Fault {
            name: "unavailable during the claim: nothing runs",
            claim: unavailable,
            finish: None,
            rollback_fails: false,
            code: Code::Unavailable,
            reason: None,
            retry_delay: None,
            effects: (0, 0, 1),
        },
        Fault {
            name: "unavailable while recording: the business write is rolled back with the claim",
            claim: || Ok(claimed()),
            finish: Some(unavailable),
            rollback_fails: false,
            code: Code::Unavailable,
            reason: None,
            retry_delay: None,
            effects: (1, 0, 1),
        },
        Fault {
            name: "ownership lost while recording",
            claim: || Ok(claimed()),
            finish: Some(|| {
                Err(LedgerError::LostOwnership {
                    expected: Version::fresh(1_764_700_000_000, 1),
                    current: Version::fresh(1_764_700_000_000, 1).next(),
                })
            }),
            rollback_fails: false,
            code: Code::Aborted,
            reason: Some("IDEMPOTENCY_OWNERSHIP_LOST"),
            retry_delay: None,
            effects: (1, 0, 1),
        },
        Fault {
            name: "in flight elsewhere: ABORTED with the lease as the retry delay",
            claim: || {
                Err(LedgerError::InFlight {
                    retry_after: Duration::from_millis(1500),
                })
            },
            finish: None,
            rollback_fails: false,
            code: Code::Aborted,
            reason: None,
            retry_delay: Some(Duration::from_millis(1500)),
            effects: (0, 0, 1),
        },
        Fault {
            name: "a failing rollback keeps the real answer",
            claim: || Err(LedgerError::KeyReusedWithDifferentRequest),
            finish: None,
            rollback_fails: true,
            code: Code::FailedPrecondition,
            reason: Some("IDEMPOTENCY_KEY_REUSED"),
            retry_delay: None,
            effects: (0, 0, 1),
        },
    ];
    for fault in faults {
        let (claim, finish) = (fault.claim, fault.finish);
        let (answer, runs, commits, rollbacks) = run_mocked_with(
            move || {
                let mut ledger = MockGrpcOperationLedger::new();
                ledger.expect_claim().returning(move |_, _, _| claim());
                if let Some(finish) = finish {
                    ledger
                        .expect_mark_finished()
                        .returning(move |_, _, _| finish());
                }
                ledger
            },
            fault.rollback_fails,
        )
        .await;
        let status = answer.unwrap_err();
        assert_eq!(status.code(), fault.code, "{}", fault.name);
        if let Some(reason) = fault.reason {
            let info = status.get_details_error_info();
            assert_eq!(
                info.map(|info| info.reason).as_deref(),
                Some(reason),
                "{}",
                fault.name
            );
        }
        if let Some(delay) = fault.retry_delay {
            let info = status.get_details_retry_info();
            assert_eq!(
                info.and_then(|info| info.retry_delay),
                Some(delay),
                "{}",
                fault.name
            );
        }
        assert_eq!((runs, commits, rollbacks), fault.effects, "{}", fault.name);
    }
}
