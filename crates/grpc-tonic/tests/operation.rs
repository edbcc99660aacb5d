//! What a handler is told of its operation (`Operation`): the method and identity the guard took,
//! the request's metadata and extensions, the downstream keys of its identity, and whether this
//! run took the claim over; a replay is told the same of the resend it answers.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{
    CallerFingerprint, DownstreamLabel, GrpcOperationIdentity, IdempotencyKey, KeyHasher,
    LeaseDuration, OutcomeReference,
};
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::{
    Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError, KeyedMutationGuard, Operation,
};
use support::{create_payment, guarded_schema, keyed};
use tonic::{Code, Request, Status};

#[derive(Clone, PartialEq, prost::Message)]
struct Pay {
    #[prost(int64, tag = "1")]
    amount: i64,
}

/// An extension a server layer of the service's own puts in the request.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Region(u16);

/// What one call of the handler (or of its replay) saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    replay: bool,
    identity: GrpcOperationIdentity,
    took_over: bool,
    trace: Option<String>,
    region: Option<Region>,
    posting_key: String,
}

impl Seen {
    fn of(operation: &Operation, replay: bool) -> Self {
        assert_eq!(operation.method(), operation.identity().method());
        Self {
            replay,
            identity: operation.identity().clone(),
            took_over: operation.took_over(),
            trace: operation
                .metadata()
                .get("x-trace")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
            region: operation.extensions().get::<Region>().copied(),
            posting_key: operation
                .downstream_key(&DownstreamLabel::parse("postings").unwrap())
                .expose()
                .to_owned(),
        }
    }
}

/// A handler that records what it saw, and fails transiently while `fails` says so.
#[derive(Clone, Default)]
struct Recording {
    seen: Arc<Mutex<Vec<Seen>>>,
    fails: bool,
}

impl GuardedHandler<InMemoryUnit> for Recording {
    type Request = Pay;
    type Response = String;

    async fn handle(
        &self,
        _unit: &InMemoryUnit,
        _pay: Pay,
        operation: &Operation,
    ) -> Result<Committed<String>, HandlerError> {
        self.seen.lock().unwrap().push(Seen::of(operation, false));
        if self.fails {
            return Err(HandlerError::Transient(Status::unavailable("try again")));
        }
        Ok(Committed {
            response: "paid".to_owned(),
            outcome: OutcomeReference::parse("payment-1").unwrap(),
        })
    }

    async fn replay(
        &self,
        _unit: &InMemoryUnit,
        _outcome: OutcomeReference,
        operation: &Operation,
    ) -> Result<String, Status> {
        self.seen.lock().unwrap().push(Seen::of(operation, true));
        Ok("paid".to_owned())
    }
}

fn guard(mode: GuardMode) -> KeyedMutationGuard<InMemoryStore> {
    let mut config = GuardConfig::new(KeyHasher::Sha256, guarded_schema()).with_mode(mode);
    config.lease = LeaseDuration::new(Duration::from_secs(2)).unwrap();
    KeyedMutationGuard::new(InMemoryStore::new(Duration::from_millis(50)), config)
}

/// A payment under `key` with the trace header `trace` and the extension `region`.
fn pay(key: &str, trace: &str, region: u16) -> Request<Pay> {
    let mut request = keyed(Pay { amount: 3 }, key, b"tenant-a");
    request
        .metadata_mut()
        .insert("x-trace", trace.parse().unwrap());
    request.extensions_mut().insert(Region(region));
    request
}

fn identity(key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant-a"),
        create_payment(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

#[tokio::test]
async fn the_handler_and_the_replay_see_the_operation_the_guard_took() {
    let guard = guard(GuardMode::ClaimFirst);
    let handler = Recording::default();
    guard
        .run(&create_payment(), pay("k-op", "t-1", 7), handler.clone())
        .await
        .unwrap();
    guard
        .run(&create_payment(), pay("k-op", "t-2", 9), handler.clone())
        .await
        .unwrap();
    let expected = identity("k-op");
    let posting_key = KeyHasher::Sha256
        .downstream_key(&expected, &DownstreamLabel::parse("postings").unwrap())
        .expose()
        .to_owned();
    let seen = handler.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            Seen {
                replay: false,
                identity: expected.clone(),
                took_over: false,
                trace: Some("t-1".to_owned()),
                region: Some(Region(7)),
                posting_key: posting_key.clone(),
            },
            Seen {
                replay: true,
                identity: expected,
                took_over: false,
                trace: Some("t-2".to_owned()),
                region: Some(Region(9)),
                posting_key,
            },
        ]
    );
}

#[tokio::test]
async fn a_run_that_took_the_claim_over_is_told_so() {
    let guard = guard(GuardMode::ClaimCommittedFirst);
    let failing = Recording {
        fails: true,
        ..Recording::default()
    };
    let first = guard
        .run(&create_payment(), pay("k-again", "t-1", 1), failing.clone())
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);
    // The failed run released its claim to the shortest lease: the resend takes it over.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let resend = Recording {
        seen: Arc::clone(&failing.seen),
        fails: false,
    };
    guard
        .run(&create_payment(), pay("k-again", "t-2", 1), resend)
        .await
        .unwrap();
    let took_over: Vec<bool> = failing
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|seen| seen.took_over)
        .collect();
    assert_eq!(
        took_over,
        [false, true],
        "the first run claimed, the resend took over"
    );
}
