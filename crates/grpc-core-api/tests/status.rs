//! Every ledger answer maps to the gRPC code, ErrorInfo reason and RetryInfo of the contract.

use std::fmt::Write;
use std::time::Duration;

use expect_test::expect;
use grpc_core_api::{
    ERROR_INFO_DOMAIN, InvalidInput, LedgerError, OperationState, UnavailableKind, Version,
};
use tonic::Status;
use tonic_types::StatusExt;

#[test]
fn ledger_errors_map_to_the_contract_statuses() {
    let errors = [
        LedgerError::from(InvalidInput::KeyMissing),
        InvalidInput::KeyTooLong { len: 300 }.into(),
        InvalidInput::MethodMalformed {
            reason: "method is empty",
        }
        .into(),
        InvalidInput::CallerEmpty.into(),
        InvalidInput::OutcomeReferenceEmpty.into(),
        LedgerError::KeyReusedWithDifferentRequest,
        LedgerError::InFlight {
            retry_after: Duration::from_millis(1500),
        },
        LedgerError::NotClaimed,
        LedgerError::AlreadyCompleted {
            state: OperationState::Committed,
        },
        LedgerError::LostOwnership {
            expected: Version::fresh(1_764_700_000_000, 1),
            current: Version::fresh(1_764_700_000_000, 1).next(),
        },
        LedgerError::unavailable(UnavailableKind::ConnectionLost),
        LedgerError::unavailable(UnavailableKind::PoolTimeout),
        LedgerError::internal("stored state is not one of the known states"),
    ];
    let mut table = String::new();
    for error in errors {
        let status = Status::from(error);
        let info = status
            .get_details_error_info()
            .expect("every status has ErrorInfo");
        assert_eq!(info.domain, ERROR_INFO_DOMAIN);
        let retry = status
            .get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .map(|d| format!(" retry={d:?}"))
            .unwrap_or_default();
        writeln!(
            table,
            "{:?} {}{retry}: {}",
            status.code(),
            info.reason,
            status.message()
        )
        .unwrap();
    }
    expect![[r#"
        InvalidArgument IDEMPOTENCY_KEY_MISSING: idempotency key is missing
        InvalidArgument IDEMPOTENCY_KEY_INVALID: idempotency key is 300 bytes long; at most 255 are allowed
        InvalidArgument IDEMPOTENCY_KEY_INVALID: method name is malformed: method is empty
        InvalidArgument IDEMPOTENCY_KEY_INVALID: caller fingerprint is empty
        InvalidArgument ARGUMENT_INVALID: outcome reference is empty
        FailedPrecondition IDEMPOTENCY_KEY_REUSED: idempotency key was already used with a different request
        Aborted IDEMPOTENCY_IN_FLIGHT retry=1.5s: operation is in flight; retry after 1.5s
        FailedPrecondition IDEMPOTENCY_NOT_CLAIMED: operation was not claimed
        Aborted IDEMPOTENCY_ALREADY_COMPLETED: operation already completed as COMMITTED
        Aborted IDEMPOTENCY_OWNERSHIP_LOST: ownership was lost: expected version 1850422067200000001, found 1850422067200000002
        Unavailable LEDGER_UNAVAILABLE: ledger unavailable: connection to the ledger store was lost
        Unavailable LEDGER_UNAVAILABLE: ledger unavailable: no ledger store connection became free in time
        Internal LEDGER_INTERNAL: ledger internal error: stored state is not one of the known states
    "#]]
    .assert_eq(&table);
}

#[test]
fn only_store_faults_and_in_flight_are_transient() {
    assert!(LedgerError::unavailable(UnavailableKind::Timeout).is_transient());
    assert!(
        LedgerError::InFlight {
            retry_after: Duration::ZERO
        }
        .is_transient()
    );
    assert!(!LedgerError::KeyReusedWithDifferentRequest.is_transient());
    assert!(!LedgerError::internal("x").is_transient());
    assert!(!LedgerError::NotClaimed.is_transient());
}
