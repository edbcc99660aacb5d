//! `UnitPerCall`: every call in a unit of its own, committed when the call succeeded and rolled
//! back when it failed, with the call's own answer returned either way.
#![cfg(feature = "mock")]

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, GrpcMethod, GrpcOperationIdentity, GrpcOperationLedger,
    IdempotencyKey, KeyHasher, LeaseDuration, LedgerDurability, LedgerError, LedgerUnitsOfWork,
    MockGrpcOperationLedger, RequestFingerprint, UnavailableKind, UnitPerCall, Version,
};

/// Units of work that record what happened to each, and whose ledger's claim answers `answer`.
struct RecordingUnits {
    events: Mutex<Vec<String>>,
    next: Mutex<u32>,
    claim_fails: bool,
    commit_fails: bool,
}

impl RecordingUnits {
    fn new(claim_fails: bool, commit_fails: bool) -> Self {
        Self {
            events: Mutex::new(Vec::new()),
            next: Mutex::new(0),
            claim_fails,
            commit_fails,
        }
    }

    fn events(&self) -> Vec<String> {
        self.events.lock().unwrap().clone()
    }
}

fn version() -> Version {
    Version::fresh(1_764_700_000_000, 7)
}

fn unavailable() -> LedgerError {
    LedgerError::unavailable(UnavailableKind::ConnectionLost)
}

#[async_trait]
impl LedgerUnitsOfWork for RecordingUnits {
    type Transaction = u32;

    async fn begin(&self) -> Result<u32, LedgerError> {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        self.events.lock().unwrap().push(format!("begin {next}"));
        Ok(*next)
    }

    fn ledger<'t>(&self, transaction: &'t u32) -> Box<dyn GrpcOperationLedger + 't> {
        self.events
            .lock()
            .unwrap()
            .push(format!("ledger of {transaction}"));
        let mut mock = MockGrpcOperationLedger::new();
        let fails = self.claim_fails;
        mock.expect_claim().returning(move |_, _, _| {
            if fails {
                Err(unavailable())
            } else {
                Ok(ClaimOutcome::Claimed {
                    version: version(),
                    took_over: false,
                })
            }
        });
        mock.expect_purge().returning(|_, _| Ok(3));
        Box::new(mock)
    }

    async fn commit(&self, transaction: u32) -> Result<(), LedgerError> {
        self.events
            .lock()
            .unwrap()
            .push(format!("commit {transaction}"));
        if self.commit_fails {
            return Err(unavailable());
        }
        Ok(())
    }

    async fn rollback(&self, transaction: u32) -> Result<(), LedgerError> {
        self.events
            .lock()
            .unwrap()
            .push(format!("rollback {transaction}"));
        Ok(())
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}

fn identity() -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::parse("tenant-a").unwrap(),
        GrpcMethod::parse("/p.S/Create").unwrap(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse("k-1").unwrap()),
    )
}

async fn claim(ledger: &UnitPerCall<RecordingUnits>) -> Result<ClaimOutcome, LedgerError> {
    ledger
        .claim(
            &identity(),
            &RequestFingerprint::of(b"request"),
            LeaseDuration::new(Duration::from_secs(5)).unwrap(),
        )
        .await
}

#[tokio::test]
async fn a_call_that_succeeds_is_committed_in_a_unit_of_its_own() {
    let ledger = UnitPerCall::new(RecordingUnits::new(false, false));
    assert!(matches!(
        claim(&ledger).await,
        Ok(ClaimOutcome::Claimed {
            took_over: false,
            ..
        })
    ));
    assert_eq!(
        ledger
            .purge(Duration::from_secs(60), 10.try_into().unwrap())
            .await,
        Ok(3)
    );
    assert_eq!(
        ledger.units().events(),
        [
            "begin 1",
            "ledger of 1",
            "commit 1",
            "begin 2",
            "ledger of 2",
            "commit 2"
        ]
    );
    assert_eq!(ledger.durability(), LedgerDurability::Durable);
}

#[tokio::test]
async fn a_call_that_fails_is_rolled_back_and_its_error_returned() {
    let ledger = UnitPerCall::new(RecordingUnits::new(true, false));
    assert_eq!(claim(&ledger).await, Err(unavailable()));
    assert_eq!(
        ledger.units().events(),
        ["begin 1", "ledger of 1", "rollback 1"]
    );
}

#[tokio::test]
async fn a_commit_that_fails_fails_the_call() {
    let ledger = UnitPerCall::new(RecordingUnits::new(false, true));
    assert_eq!(claim(&ledger).await, Err(unavailable()));
    assert_eq!(
        ledger.units().events(),
        ["begin 1", "ledger of 1", "commit 1"]
    );
}
