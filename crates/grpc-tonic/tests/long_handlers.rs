//! Claim-committed-first on the in-memory units of work: a handler that runs for several leases
//! keeps its claim (every duplicate meanwhile is told it is in flight, none runs the handler), a
//! handler past the longest handler time is cut and rolled back, and a handler that gives up
//! hands its claim straight to the resend. The process-kill case runs on PostgreSQL
//! (`crates/grpc-ledger-demo/tests/long_handlers.rs`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, HandlerError, KeyedMutationGuard,
};
use support::counting::{Asked, Counting};
use support::{Writes, scripted};
use tonic::{Code, Request, Response, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

const LEASE: Duration = Duration::from_millis(300);

fn guard(
    store: &InMemoryStore,
    lease: Duration,
    longest_handler: Duration,
) -> KeyedMutationGuard<InMemoryStore> {
    guard_over(store.clone(), lease, longest_handler)
}

fn guard_over<U: LedgerUnitsOfWork + 'static>(
    units: U,
    lease: Duration,
    longest_handler: Duration,
) -> KeyedMutationGuard<U> {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    let mut config = GuardConfig::new(KeyHasher::Sha256, schema)
        .with_mode(GuardMode::ClaimCommittedFirst)
        .with_longest_handler(longest_handler);
    config.lease = LeaseDuration::new(lease).unwrap();
    KeyedMutationGuard::new(units, config)
}

fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

fn request(key: &str) -> Request<Pay> {
    let mut request = Request::new(Pay { amount: 5 });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
    request
}

fn identity(key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant-a"),
        method(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

/// One call whose handler writes `key` as business and then takes `runs_for`; `ran` counts the
/// handlers that started.
async fn call<U: LedgerUnitsOfWork<Transaction = InMemoryUnit> + 'static>(
    guard: &KeyedMutationGuard<U>,
    key: &str,
    runs_for: Duration,
    ran: &Arc<AtomicUsize>,
) -> Result<Response<()>, Status> {
    let (business, ran) = (key.to_owned(), Arc::clone(ran));
    guard
        .run(
            &method(),
            request(key),
            scripted(
                move |unit: Writes, _pay: Pay| async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    unit.write_business(&business);
                    tokio::time::sleep(runs_for).await;
                    Ok(Committed {
                        response: (),
                        outcome: OutcomeReference::parse("payment").unwrap(),
                    })
                },
                |_outcome: OutcomeReference| async move { Ok(()) },
            ),
        )
        .await
}

fn replayed(response: &Response<()>) -> bool {
    response.metadata().get(REPLAYED_METADATA_KEY).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_longer_than_several_leases_runs_once_while_duplicates_are_told_to_wait() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store, LEASE, Duration::from_secs(60));
    let ran = Arc::new(AtomicUsize::new(0));
    let first = {
        let (guard, ran) = (guard.clone(), Arc::clone(&ran));
        tokio::spawn(async move { call(&guard, "long", 6 * LEASE, &ran).await })
    };
    tokio::time::sleep(LEASE / 3).await;
    let claimed = store.ledger().find(&identity("long")).await.unwrap();
    let claimed = claimed.expect("the claim committed before the handler ran");
    assert_eq!(claimed.state(), OperationState::InProgress);

    // Duplicates throughout the handler's six leases: each told it is in flight, none runs it.
    let mut in_flight = 0;
    while !first.is_finished() {
        match call(&guard, "long", Duration::ZERO, &ran).await {
            Err(status) if status.code() == Code::Aborted => in_flight += 1,
            Ok(response) if replayed(&response) => break,
            other => panic!("a duplicate of a running handler got {other:?}"),
        }
        tokio::time::sleep(LEASE / 2).await;
    }
    let answer = first.await.unwrap().expect("the long handler commits");
    assert!(!replayed(&answer));
    assert!(in_flight >= 6, "{in_flight} duplicates were told to wait");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(store.committed_business(), vec!["long".to_owned()]);

    // Finished at the version it was claimed at: renewed, never taken over.
    let record = store
        .ledger()
        .find(&identity("long"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), OperationState::Committed);
    assert_eq!(record.version, claimed.version.next());
    let resend = call(&guard, "long", Duration::ZERO, &ran).await.unwrap();
    assert!(replayed(&resend));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_past_the_longest_handler_time_is_cut_and_its_work_rolled_back() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store, LEASE, LEASE);
    let ran = Arc::new(AtomicUsize::new(0));
    let cut = tokio::time::timeout(
        Duration::from_secs(30),
        call(&guard, "endless", Duration::from_secs(3600), &ran),
    )
    .await
    .expect("the guard cuts the handler");
    let status = cut.expect_err("a cut handler is not answered as a success");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("longest handler"), "{status:?}");
    assert!(
        store.committed_business().is_empty(),
        "the cut handler's write is rolled back"
    );

    // Its claim was not renewed past the longest handler time: a resend takes it over and runs.
    let resend = loop {
        match call(&guard, "endless", Duration::ZERO, &ran).await {
            Err(status) if status.code() == Code::Aborted => {
                tokio::time::sleep(LEASE / 3).await;
            }
            other => break other,
        }
    };
    assert!(!replayed(&resend.expect("the resend commits")));
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert_eq!(store.committed_business(), vec!["endless".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_fails_transiently_hands_its_claim_to_the_resend_at_once() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    // A lease far longer than the test: the resend runs only because the claim was released.
    let guard = guard(&store, Duration::from_secs(600), Duration::from_secs(600));

    let failed = guard
        .run(
            &method(),
            request("flaky"),
            scripted(
                |unit: Writes, _pay: Pay| async move {
                    unit.write_business("flaky-first");
                    Err::<Committed<()>, _>(HandlerError::Transient(Status::unavailable(
                        "the payment provider timed out",
                    )))
                },
                |_outcome: OutcomeReference| async move { Ok(()) },
            ),
        )
        .await;
    assert_eq!(failed.unwrap_err().code(), Code::Unavailable);
    let ran = Arc::new(AtomicUsize::new(0));
    // The release leaves the shortest lease (a millisecond): a resend within it is told to retry
    // after what is left of it, and the next one takes the claim over.
    let mut resend = call(&guard, "flaky", Duration::ZERO, &ran).await;
    if let Err(status) = &resend
        && status.code() == Code::Aborted
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
        resend = call(&guard, "flaky", Duration::ZERO, &ran).await;
    }
    assert!(!replayed(
        &resend.expect("the resend takes the released claim over")
    ));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(store.committed_business(), vec!["flaky".to_owned()]);
    let record = store
        .ledger()
        .find(&identity("flaky"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state(), OperationState::Committed);
}

/// A renewal stuck behind the store (here a lock on the whole ledger table, with a claim wait far
/// longer than the lease) does not let the handler run on past its lease: it is cut when the lease
/// it holds runs out, its write rolled back, and the call is answered long before the renewal's
/// own wait would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_whose_renewal_is_stuck_is_cut_when_its_lease_runs_out() {
    use grpc_ledger_contract_tests::LedgerFixture;
    use grpc_operation_ledger_memory::InMemoryFixture;

    let fixture = InMemoryFixture::new(Duration::from_secs(60));
    let store = fixture.fresh_store().await;
    let guard = guard(&store, LEASE, Duration::from_secs(60));
    let ran = Arc::new(AtomicUsize::new(0));
    let call = {
        let (guard, ran) = (guard.clone(), Arc::clone(&ran));
        tokio::spawn(async move { call(&guard, "stuck", Duration::from_secs(3600), &ran).await })
    };
    while ran.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = fixture
        .table_locking()
        .expect("the double can lock its table")
        .lock_ledger_table(&store)
        .await;
    let answer = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("cut at its lease, not after the renewal's 60 s wait")
        .unwrap();
    let status = answer.expect_err("a cut handler is not a success");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("could not be renewed"),
        "{status:?}"
    );
    held.release().await;
    assert!(
        store.committed_business().is_empty(),
        "its write is rolled back"
    );
}

/// A handler that panics under a committed claim: its caller gets INTERNAL, its work is rolled
/// back, and its claim is handed on as the unit unwinds, so a resend takes over at once instead
/// of being told to wait out the lease (5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_that_panics_hands_its_claim_to_the_resend_at_once() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store, Duration::from_secs(5), Duration::from_secs(60));
    let panicked = guard
        .run(
            &method(),
            request("pay-panics"),
            scripted(
                |unit: Writes, _pay: Pay| async move {
                    unit.write_business("pay-panics");
                    // Opaque to the compiler, so that the answer after it is not unreachable code.
                    if std::hint::black_box(true) {
                        panic!("the handler panics after its write");
                    }
                    Ok(Committed {
                        response: (),
                        outcome: OutcomeReference::parse("unreachable").unwrap(),
                    })
                },
                |_outcome| async move { Ok(()) },
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(panicked.code(), Code::Internal, "{panicked:?}");
    assert!(
        store.committed_business().is_empty(),
        "its write rolled back"
    );

    let ran = Arc::new(AtomicUsize::new(0));
    let started = std::time::Instant::now();
    let resent = loop {
        match call(&guard, "pay-panics", Duration::ZERO, &ran).await {
            Err(status)
                if status.code() == Code::Aborted && started.elapsed() < Duration::from_secs(1) =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            answer => break answer,
        }
    };
    let resent = resent.expect("the resend took the claim over well within the lease");
    assert!(!replayed(&resent));
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(store.committed_business(), ["pay-panics"]);
}

/// The lease keeper renews about every third of the lease, no more: a handler that runs three
/// leases costs about nine renewals, not a renewal loop on the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_lease_is_renewed_every_third_of_it_and_no_more_often() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let asked = Arc::new(Asked::default());
    let units = Counting {
        store: store.clone(),
        asked: Arc::clone(&asked),
    };
    let guard = guard_over(units, LEASE, Duration::from_secs(60));
    let ran = Arc::new(AtomicUsize::new(0));
    call(&guard, "renewed", 3 * LEASE, &ran)
        .await
        .expect("the handler outlives its first lease and commits");
    let renewals = asked.renewals.load(Ordering::SeqCst);
    assert!(
        (3..=15).contains(&renewals),
        "{renewals} renewals over three leases (one every third of a lease)"
    );
}
