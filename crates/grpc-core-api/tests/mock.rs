//! The mockall mock of the ledger port, as other crates' unit tests use it.
#![cfg(feature = "mock")]

use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, GrpcMethod, GrpcOperationIdentity, GrpcOperationLedger,
    IdempotencyKey, KeyHasher, LeaseDuration, LedgerDurability, LedgerError,
    MockGrpcOperationLedger, RequestFingerprint, UnavailableKind, Version,
};
use std::sync::Arc;
use std::time::Duration;

fn identity() -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::parse("tenant-a").unwrap(),
        GrpcMethod::parse("/p.S/Create").unwrap(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse("k-1").unwrap()),
    )
}

#[test]
fn the_mock_stands_in_for_the_port_behind_an_arc_dyn() {
    let mut mock = MockGrpcOperationLedger::new();
    mock.expect_durability()
        .return_const(LedgerDurability::Durable);
    mock.expect_claim().times(1).returning(|_, _, _| {
        Ok(ClaimOutcome::Claimed {
            version: Version::fresh(1_764_700_000_000, 1),
            took_over: false,
        })
    });
    mock.expect_mark_committed()
        .returning(|_, _, _| Err(LedgerError::unavailable(UnavailableKind::ConnectionLost)));
    let ledger: Arc<dyn GrpcOperationLedger> = Arc::new(mock);

    assert_eq!(ledger.durability(), LedgerDurability::Durable);
    let lease = LeaseDuration::new(Duration::from_secs(30)).unwrap();
    let claimed =
        futures_lite_block_on(ledger.claim(&identity(), &RequestFingerprint::of(b"r"), lease));
    assert_eq!(
        claimed,
        Ok(ClaimOutcome::Claimed {
            version: Version::fresh(1_764_700_000_000, 1),
            took_over: false
        })
    );
    let outcome = grpc_core_api::OutcomeReference::parse("payment-1").unwrap();
    let committed = futures_lite_block_on(ledger.mark_committed(
        &identity(),
        Version::fresh(1_764_700_000_000, 1),
        &outcome,
    ));
    assert_eq!(
        committed,
        Err(LedgerError::unavailable(UnavailableKind::ConnectionLost))
    );
}

/// Polls a future that never waits (the mock answers at once) without a runtime: this crate
/// promises not to need one.
fn futures_lite_block_on<F: std::future::Future>(future: F) -> F::Output {
    use std::task::{Context, Poll, Waker};
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}
