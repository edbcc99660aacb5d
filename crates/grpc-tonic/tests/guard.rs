//! The server-side guard on the in-memory units of work: replays, refusals, resolves, a caller
//! that goes away and a unit cut at its lease. Its answers to ledger faults are in
//! `guard_faults.rs`, write-once mode in `write_once.rs`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_tonic::{AuthenticatedPrincipal, Committed, HandlerError, KeyedMutationGuard, Resolved};
use support::payments::*;
use support::{Writes, scripted};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

#[tokio::test]
async fn a_duplicate_replays_and_the_handler_runs_once() {
    let (store, guard, runs) = fresh();
    let first = pay_ok(&guard, 10, "k-1", &runs).await;
    assert_eq!(first.get_ref(), "payment-10");
    assert!(first.metadata().get(REPLAYED_METADATA_KEY).is_none());
    let again = pay_ok(&guard, 10, "k-1", &runs).await;
    assert_eq!(again.get_ref(), "payment-10");
    assert_eq!(again.metadata().get(REPLAYED_METADATA_KEY).unwrap(), "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.committed_business(), vec!["payment-10"]);
}

/// The exactly-once failure a map field used to cause: one request's bytes, decoded afresh for
/// every retry (as tonic does), re-encode in another map order each time. Every retry must be
/// recognised as the same request and replayed, never refused as a reused key.
#[tokio::test]
async fn retries_of_a_request_with_a_map_replay_whatever_order_the_map_decodes_in() {
    let (store, guard, runs) = fresh();
    let labels = (0..8).map(|i| (format!("label-{i}"), format!("value-{i}")));
    let sent = Pay {
        amount: 10,
        labels: labels.collect(),
    };
    let wire = prost::Message::encode_to_vec(&sent);
    let mut reencodings = std::collections::HashSet::new();
    for _ in 0..50 {
        let decoded: Pay = prost::Message::decode(wire.as_slice()).unwrap();
        reencodings.insert(prost::Message::encode_to_vec(&decoded));
        let mut request = Request::new(decoded);
        request
            .metadata_mut()
            .insert("idempotency-key", "k-map".parse().unwrap());
        request
            .extensions_mut()
            .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
        let answer = pay(&guard, request, &runs, Ok(())).await.unwrap();
        assert_eq!(answer.get_ref(), "payment-10");
    }
    assert!(reencodings.len() > 1, "prost's map order should vary");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.committed_business(), vec!["payment-10"]);
}

#[tokio::test]
async fn a_changed_body_under_the_same_key_is_failed_precondition() {
    let (_store, guard, runs) = fresh();
    pay_ok(&guard, 10, "k-1", &runs).await;
    let status = pay(
        &guard,
        request(99, Some("k-1"), Some("tenant-a")),
        &runs,
        Ok(()),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(
        status.get_details_error_info().unwrap().reason,
        "IDEMPOTENCY_KEY_REUSED"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_missing_or_bad_key_is_invalid_argument_and_runs_nothing() {
    let (_store, guard, runs) = fresh();
    let missing = pay(&guard, request(10, None, Some("tenant-a")), &runs, Ok(()))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(
        missing.get_details_error_info().unwrap().reason,
        "IDEMPOTENCY_KEY_MISSING"
    );
    let long = "k".repeat(256);
    let bad = pay(
        &guard,
        request(10, Some(&long), Some("tenant-a")),
        &runs,
        Ok(()),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(
        bad.get_details_error_info().unwrap().reason,
        "IDEMPOTENCY_KEY_INVALID"
    );
    assert!(
        !bad.message().contains(&long),
        "no key material in messages"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A client cannot pick its caller identity with a header: the default extractor reads only what
/// an authentication layer put in the extensions, so another caller's operation is neither
/// replayed to it nor blocked by it.
#[tokio::test]
async fn a_fake_caller_header_cannot_replay_or_block_another_callers_operation() {
    let (_store, guard, runs) = fresh();
    pay_ok(&guard, 10, "shared", &runs).await;
    let mut forged = request(10, Some("shared"), Some("tenant-b"));
    forged
        .metadata_mut()
        .insert("x-caller", "tenant-a".parse().unwrap());
    let answer = pay(&guard, forged, &runs, Ok(())).await.unwrap();
    assert!(
        answer.metadata().get(REPLAYED_METADATA_KEY).is_none(),
        "not tenant-a's replay"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "tenant-b's payment ran as its own"
    );
    let anonymous = pay(&guard, request(10, Some("shared"), None), &runs, Ok(()))
        .await
        .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn a_terminal_failure_is_recorded_and_replayed_a_transient_one_rolls_back() {
    let (_store, guard, runs) = fresh();
    let refused = Status::failed_precondition("insufficient funds");
    let first = pay(
        &guard,
        request(10, Some("t"), Some("a")),
        &runs,
        Err(HandlerError::Terminal(refused)),
    )
    .await
    .unwrap_err();
    assert_eq!(
        (first.code(), first.message()),
        (Code::FailedPrecondition, "insufficient funds")
    );
    let replay = pay(&guard, request(10, Some("t"), Some("a")), &runs, Ok(()))
        .await
        .unwrap_err();
    assert_eq!(
        (replay.code(), replay.message()),
        (Code::FailedPrecondition, "insufficient funds")
    );
    assert_eq!(
        replay.metadata().get(REPLAYED_METADATA_KEY).unwrap(),
        "true"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let flaky = Status::unavailable("dependency timed out");
    pay(
        &guard,
        request(20, Some("u"), Some("a")),
        &runs,
        Err(HandlerError::Transient(flaky)),
    )
    .await
    .unwrap_err();
    let retried = pay(&guard, request(20, Some("u"), Some("a")), &runs, Ok(()))
        .await
        .unwrap();
    assert_eq!(retried.get_ref(), "payment-20", "the retry ran afresh");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A terminal refusal whose message the store cannot hold as it is (over 1024 bytes, with NUL) is
/// still recorded, so a retry replays it instead of running the handler again; the first caller
/// gets the handler's status unchanged.
#[tokio::test]
async fn an_oversized_terminal_failure_is_recorded_and_replayed() {
    let (_store, guard, runs) = fresh();
    let message = format!("declined\0{}", "\u{e9}".repeat(700)); // 1409 bytes
    let refusal = || HandlerError::Terminal(Status::failed_precondition(message.clone()));
    let first = pay(
        &guard,
        request(5, Some("k-long"), Some("tenant-a")),
        &runs,
        Err(refusal()),
    )
    .await
    .unwrap_err();
    assert_eq!(first.code(), Code::FailedPrecondition);
    assert_eq!(first.message(), message);
    let replay = pay(
        &guard,
        request(5, Some("k-long"), Some("tenant-a")),
        &runs,
        Err(refusal()),
    )
    .await
    .unwrap_err();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(replay.code(), Code::FailedPrecondition);
    assert_eq!(
        replay.metadata().get(REPLAYED_METADATA_KEY).unwrap(),
        "true"
    );
    assert!(replay.message().len() <= 1024);
    assert!(replay.message().starts_with("declined\u{fffd}\u{e9}"));
    assert!(!replay.message().contains('\0'));
}

/// A replayed failure carries what the first answer carried: code, message and error details.
#[tokio::test]
async fn a_replayed_failure_carries_the_original_error_details() {
    let (_store, guard, runs) = fresh();
    let refusal = || {
        HandlerError::Terminal(Status::with_error_details(
            Code::FailedPrecondition,
            "insufficient funds",
            tonic_types::ErrorDetails::with_error_info(
                "INSUFFICIENT_FUNDS",
                "payments.example",
                [("shortfall_minor".to_owned(), "250".to_owned())],
            ),
        ))
    };
    let first = pay(
        &guard,
        request(5, Some("k-d"), Some("tenant-a")),
        &runs,
        Err(refusal()),
    )
    .await
    .unwrap_err();
    let replay = pay(
        &guard,
        request(5, Some("k-d"), Some("tenant-a")),
        &runs,
        Err(refusal()),
    )
    .await
    .unwrap_err();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        replay.metadata().get(REPLAYED_METADATA_KEY).unwrap(),
        "true"
    );
    assert_eq!(replay.code(), first.code());
    assert_eq!(replay.message(), first.message());
    let info = replay.get_details_error_info().expect("ErrorInfo replayed");
    assert_eq!(info.reason, "INSUFFICIENT_FUNDS");
    assert_eq!(
        info.metadata.get("shortfall_minor").map(String::as_str),
        Some("250")
    );
}

/// A resolve RPC's answer from the guard: not found before, committed after, in progress while a
/// claim-first owner holds the lease, the recorded failure after a terminal refusal.
#[tokio::test]
async fn resolve_reports_what_became_of_the_operation() {
    let (store, guard, runs) = fresh();
    let look = |key: &str| {
        let request = request(1, Some(key), Some("tenant-a"));
        let (metadata, extensions, _) = request.into_parts();
        let guard = guard.clone();
        async move {
            guard
                .resolve(&method(), &metadata, &extensions)
                .await
                .unwrap()
        }
    };
    assert_eq!(look("k-r").await, Resolved::NotFound);
    pay_ok(&guard, 1, "k-r", &runs).await;
    assert_eq!(
        look("k-r").await,
        Resolved::Committed(OutcomeReference::parse("payment-1").unwrap())
    );
    let refusal = HandlerError::Terminal(Status::failed_precondition("insufficient funds"));
    let _ = pay(
        &guard,
        request(1, Some("k-f"), Some("tenant-a")),
        &runs,
        Err(refusal),
    )
    .await;
    let Resolved::Failed(failure) = look("k-f").await else {
        panic!("a terminal refusal is recorded");
    };
    assert_eq!(failure.code(), Code::FailedPrecondition);
    // A claim held by another owner (claim-first, committed on its own) is in progress.
    let identity = guard
        .identity(
            &method(),
            request(1, Some("k-p"), Some("tenant-a")).metadata(),
            request(1, Some("k-p"), Some("tenant-a")).extensions(),
        )
        .unwrap();
    grpc_ledger_contract_tests::LedgerStore::autocommit(&store)
        .claim(
            &identity,
            &RequestFingerprint::of(b"held"),
            LeaseDuration::new(Duration::from_secs(30)).unwrap(),
        )
        .await
        .unwrap();
    let Resolved::InProgress { retry_after } = look("k-p").await else {
        panic!("a held claim is in progress");
    };
    assert!(retry_after > Duration::from_secs(20) && retry_after <= Duration::from_secs(30));
    // The same refusals as a guarded call: no key is INVALID_ARGUMENT.
    let (metadata, extensions, _) = request(1, None, Some("tenant-a")).into_parts();
    assert_eq!(
        guard
            .resolve(&method(), &metadata, &extensions)
            .await
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
}

/// A caller that goes away in the middle of the handler (its deadline, a client's cancel) drops
/// the guard's future; the unit of work still runs to its end in its own task: the handler
/// finishes, the operation commits, and a retry with the same key replays it.
#[tokio::test]
async fn a_caller_that_goes_away_mid_handler_does_not_cut_the_unit_short() {
    let store = InMemoryStore::new(Duration::from_millis(200));
    let guard = guard(&store);
    let finished = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&finished);
    let method = method();
    let call = guard.run(
        &method,
        request(10, Some("k-gone"), Some("tenant-a")),
        scripted(
            move |unit: Writes, pay: Pay| async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                unit.write_business(&format!("payment-{}", pay.amount));
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(Committed {
                    response: "payment-10".to_owned(),
                    outcome: OutcomeReference::parse("payment-10").unwrap(),
                })
            },
            |outcome: OutcomeReference| async move { Ok(outcome.as_str().to_owned()) },
        ),
    );
    // The caller gives up after 30 ms, while the handler sleeps.
    assert!(
        tokio::time::timeout(Duration::from_millis(30), call)
            .await
            .is_err()
    );
    // The unit goes on in its own task: wait for its commit (bounded) rather than guess how long.
    let waited = std::time::Instant::now();
    while grpc_ledger_contract_tests::LedgerStore::ledger_rows(&store).await == 0
        && waited.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "the handler ran to its end"
    );
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::business_rows(&store, "payment-10").await,
        1
    );
    let runs = Arc::new(AtomicU32::new(0));
    let retry = pay_ok(&guard, 10, "k-gone", &runs).await;
    assert_eq!(retry.get_ref(), "payment-10");
    assert!(retry.metadata().get(REPLAYED_METADATA_KEY).is_some());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the retry was a replay");
}

/// `run_request` takes the method `MethodFromPathLayer` put in the extensions, and refuses a
/// request without it rather than guess.
#[tokio::test]
async fn run_request_needs_the_method_from_the_path_layer() {
    let store = InMemoryStore::new(Duration::from_millis(200));
    let guard = guard(&store);
    let handler = |_unit: Writes, pay: Pay| async move {
        Ok(Committed {
            response: format!("payment-{}", pay.amount),
            outcome: OutcomeReference::parse("payment-1").unwrap(),
        })
    };
    let replay = |outcome: OutcomeReference| async move { Ok(outcome.as_str().to_owned()) };
    let without = guard
        .run_request(
            request(1, Some("k-path"), Some("tenant-a")),
            scripted(handler, replay),
        )
        .await
        .unwrap_err();
    assert_eq!(without.code(), Code::Internal);
    let mut with = request(1, Some("k-path"), Some("tenant-a"));
    with.extensions_mut().insert(method());
    let answer = guard
        .run_request(with, scripted(handler, replay))
        .await
        .unwrap();
    assert_eq!(answer.get_ref(), "payment-1");
}

/// A unit that outlives its claim's lease (a handler waiting on something that never answers) is
/// cut there and rolled back: it does not hold its connection and its row for ever.
#[tokio::test]
async fn a_unit_is_cut_at_its_lease_and_rolled_back() {
    let store = InMemoryStore::new(Duration::from_millis(200));
    let mut config = guard_config();
    config.lease = LeaseDuration::new(Duration::from_millis(100)).unwrap();
    let guard = KeyedMutationGuard::new(store.clone(), config);
    let method = method();
    let answer = guard
        .run(
            &method,
            request(10, Some("k-hung"), Some("tenant-a")),
            scripted(
                |unit: Writes, _pay: Pay| async move {
                    unit.write_business("payment-hung");
                    std::future::pending::<()>().await;
                    Ok(Committed {
                        response: String::new(),
                        outcome: OutcomeReference::parse("never").unwrap(),
                    })
                },
                |outcome: OutcomeReference| async move { Ok(outcome.as_str().to_owned()) },
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(answer.code(), Code::Unavailable, "{answer:?}");
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::business_rows(&store, "payment-hung").await,
        0
    );
    assert_eq!(
        grpc_ledger_contract_tests::LedgerStore::ledger_rows(&store).await,
        0
    );
}

/// A guard told to read another metadata key reads the key there, and only there: a duplicate
/// under the configured header replays, and a request that carries the key under the default
/// header is refused as missing its key.
#[tokio::test]
async fn the_guard_reads_the_key_header_it_is_configured_with() {
    let store = InMemoryStore::new(Duration::from_millis(200));
    let config = guard_config().with_key_header("x-request-id").unwrap();
    let guard = KeyedMutationGuard::new(store.clone(), config);
    let runs = Arc::new(AtomicU32::new(0));
    let keyed = |amount| {
        let mut request = request(amount, None, Some("tenant-a"));
        request
            .metadata_mut()
            .insert("x-request-id", "k-custom".parse().unwrap());
        request
    };
    pay(&guard, keyed(10), &runs, Ok(())).await.unwrap();
    let replay = pay(&guard, keyed(10), &runs, Ok(())).await.unwrap();
    assert_eq!(
        replay.metadata().get(REPLAYED_METADATA_KEY).unwrap(),
        "true"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let default_header = pay(
        &guard,
        request(11, Some("k-2"), Some("tenant-a")),
        &runs,
        Ok(()),
    )
    .await
    .unwrap_err();
    assert_eq!(default_header.code(), Code::InvalidArgument);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(guard_config().with_key_header("X-Request-Id").is_err());
}

/// A terminal failure with a code that says "try again" would replay a passing fault as final:
/// the guard refuses to record it (INTERNAL, nothing of the call committed), and the resend runs
/// the handler afresh.
#[tokio::test]
async fn a_terminal_failure_with_a_transient_code_is_refused_not_recorded() {
    for code in [
        Code::Unavailable,
        Code::Aborted,
        Code::DeadlineExceeded,
        Code::ResourceExhausted,
        Code::Cancelled,
    ] {
        let (store, guard, runs) = fresh();
        let refused = pay(
            &guard,
            request(11, Some("transient-terminal"), Some("a")),
            &runs,
            Err(HandlerError::Terminal(Status::new(code, "store down"))),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code(), Code::Internal, "{code:?}");
        assert!(refused.message().contains("retry may succeed"), "{code:?}");
        let resent = pay(
            &guard,
            request(11, Some("transient-terminal"), Some("a")),
            &runs,
            Ok(()),
        )
        .await
        .unwrap();
        assert_eq!(resent.get_ref(), "payment-11", "{code:?}");
        assert_eq!(store.committed_business(), ["payment-11"], "{code:?}");
    }
    assert!(!HandlerError::is_transient_code(Code::FailedPrecondition));
    assert!(!HandlerError::is_transient_code(Code::InvalidArgument));
}
