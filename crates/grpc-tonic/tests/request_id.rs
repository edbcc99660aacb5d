//! Keys in the request (AIP-155's `request_id`): a method configured to take its idempotency key
//! from a string field of its request gets exactly what a metadata key gets (validation, hashing,
//! isolation per caller, replay), and a request that carries a key in both places must carry the
//! same one.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_memory::InMemoryStore;
use grpc_tonic::{AuthenticatedPrincipal, Committed, GuardConfig, KeyedMutationGuard};
use support::{Writes, scripted};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

#[derive(Clone, PartialEq, prost::Message)]
struct Order {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(int64, tag = "2")]
    amount: i64,
    #[prost(string, repeated, tag = "3")]
    tags: Vec<String>,
}

fn method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreateOrder").unwrap()
}

fn config() -> GuardConfig {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    let schema =
        RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors))
            .unwrap();
    GuardConfig::new(KeyHasher::hmac_sha256(&[9; 32]).unwrap(), schema)
}

fn guard(store: &InMemoryStore) -> KeyedMutationGuard<InMemoryStore> {
    let config = config().with_key_field(&method(), "request_id").unwrap();
    KeyedMutationGuard::new(store.clone(), config)
}

fn order(request_id: &str, header: Option<&str>, caller: &[u8]) -> Request<Order> {
    let mut request = Request::new(Order {
        request_id: request_id.to_owned(),
        amount: 12,
        tags: vec![],
    });
    if let Some(key) = header {
        request
            .metadata_mut()
            .insert("idempotency-key", key.parse().unwrap());
    }
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(caller.to_vec()));
    request
}

async fn create(
    guard: &KeyedMutationGuard<InMemoryStore>,
    request: Request<Order>,
    ran: &Arc<AtomicU32>,
) -> Result<bool, Status> {
    let ran = Arc::clone(ran);
    let response = guard
        .run(
            &method(),
            request,
            scripted(
                move |unit: Writes, order: Order| async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    unit.write_business(&format!("order {}", order.amount));
                    Ok(Committed {
                        response: (),
                        outcome: OutcomeReference::parse("order").unwrap(),
                    })
                },
                |_outcome| async move { Ok(()) },
            ),
        )
        .await?;
    Ok(response.metadata().get(REPLAYED_METADATA_KEY).is_some())
}

fn reason(status: &Status) -> String {
    status
        .get_details_error_info()
        .map(|info| info.reason)
        .unwrap_or_default()
}

#[tokio::test]
async fn a_key_in_the_request_runs_the_handler_once_and_replays_the_resend() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    let ran = Arc::new(AtomicU32::new(0));
    let id = "5f0c7e1a-8d4b-4e3a-9b61-2c7d9e0f1a23";
    assert!(
        !create(&guard, order(id, None, b"tenant-a"), &ran)
            .await
            .unwrap()
    );
    assert!(
        create(&guard, order(id, None, b"tenant-a"), &ran)
            .await
            .unwrap(),
        "replayed"
    );
    // The same key in the metadata too: it agrees, so it is the same operation.
    assert!(
        create(&guard, order(id, Some(id), b"tenant-a"), &ran)
            .await
            .unwrap()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);

    // Isolated per caller, as a metadata key is: another caller's request_id is its own.
    assert!(
        !create(&guard, order(id, None, b"tenant-b"), &ran)
            .await
            .unwrap()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    // Hashed with the deployment's secret, as a metadata key is: the ledger holds no key.
    let stored = KeyHasher::hmac_sha256(&[9; 32])
        .unwrap()
        .hash(&IdempotencyKey::parse(id).unwrap());
    let identity = GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant-a"),
        method(),
        stored,
    );
    assert!(store.ledger().find(&identity).await.unwrap().is_some());
}

#[tokio::test]
async fn keys_that_disagree_are_missing_or_malformed_are_refused_before_anything_is_written() {
    let store = InMemoryStore::new(Duration::from_millis(50));
    let guard = guard(&store);
    let ran = Arc::new(AtomicU32::new(0));
    let cases = [
        (
            order("key-in-body", Some("key-in-header"), b"t"),
            "IDEMPOTENCY_KEY_INVALID",
        ),
        (order("", None, b"t"), "IDEMPOTENCY_KEY_MISSING"),
        (order("has a space", None, b"t"), "IDEMPOTENCY_KEY_INVALID"),
        (
            order(&"x".repeat(256), None, b"t"),
            "IDEMPOTENCY_KEY_INVALID",
        ),
    ];
    for (request, expected) in cases {
        let status = create(&guard, request, &ran).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(reason(&status), expected, "{status:?}");
        assert!(
            !status.message().contains("key-in"),
            "no key in the message: {status:?}"
        );
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert!(store.committed_business().is_empty());
    // An empty request_id with the key in the metadata: the metadata's key is the key.
    assert!(
        !create(&guard, order("", Some("header-only"), b"t"), &ran)
            .await
            .unwrap()
    );
    // The key is not part of the request it names: a resend that also carries it in the body is
    // the same request, and replays.
    assert!(
        create(
            &guard,
            order("header-only", Some("header-only"), b"t"),
            &ran
        )
        .await
        .unwrap()
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn only_a_singular_string_field_can_hold_the_key_and_aip155_fields_are_found_by_descriptor() {
    for field in ["amount", "tags", "no_such_field"] {
        let refused = config().with_key_field(&method(), field).unwrap_err();
        assert!(
            matches!(refused, SchemaError::KeyFieldNotAString { .. }),
            "{field}: {refused:?}"
        );
    }
    let (config, found) = config().with_aip155_request_ids();
    assert_eq!(found, vec![method()]);
    assert_eq!(
        config.key_fields.get(method().as_str()).map(String::as_str),
        Some("request_id")
    );
}
