//! The properties each fuzz target checks, one function per target, each panicking when its
//! property breaks. The cargo-fuzz targets (`fuzz/fuzz_targets`) call them on generated inputs;
//! `tests/replay.rs` calls them on every seed and every kept regression in each `cargo xtask
//! test`, so a change that breaks a case found once fails CI in seconds.

use std::sync::OnceLock;

use grpc_core_api::{GrpcMethod, IdempotencyKey, RequestSchema};
use grpc_policy::ServiceConfig;
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};

/// The fuzz targets, by name (their folders under `fuzz/seeds` and `fuzz/regressions`).
pub const TARGETS: [&str; 4] = ["service_config", "method", "key", "request_fingerprint"];

/// Runs target `name`'s check on `data`.
pub fn check(name: &str, data: &[u8]) {
    match name {
        "service_config" => service_config(data),
        "method" => method(data),
        "key" => key(data),
        "request_fingerprint" => request_fingerprint(data),
        other => panic!("no fuzz target named {other}"),
    }
}

/// Any text: the parser answers without panicking, every refusal names a JSON path, and an
/// accepted config emits JSON that parses back to the same model and emits the same JSON again.
/// The emitted JSON is canonical, so what the parser noted about the input's spelling (its
/// portability notes: a status code in lower case, a duration spelled loosely) is not carried:
/// the models are compared without those notes, and the emitted config has none of its own making.
pub fn service_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ServiceConfig::parse(text) {
        Ok(config) => {
            let emitted = config.to_json();
            let again =
                ServiceConfig::parse(&emitted.to_string()).expect("an emitted config parses");
            assert_eq!(again.to_json(), emitted, "emitting is idempotent");
            let without_notes = |config: &ServiceConfig| {
                let mut config = config.clone();
                config.portability.clear();
                config
            };
            assert_eq!(without_notes(&again), without_notes(&config));
            for note in &again.portability {
                assert!(
                    config.portability.iter().any(|kept| kept.path == note.path),
                    "the emitted config gained a portability note: {note:?}"
                );
            }
        }
        Err(error) => assert!(error.path.starts_with('$')),
    }
}

/// Any text: a method name is accepted only in its canonical form, and its parts rebuild it.
pub fn method(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(method) = GrpcMethod::parse(text) {
        assert_eq!(method.as_str(), text);
        assert_eq!(
            GrpcMethod::from_parts(method.service(), method.method()).as_ref(),
            Ok(&method)
        );
    }
}

/// Any bytes: a key is accepted only as 1 to 255 bytes of visible ASCII, and a refusal's message
/// depends only on the key's length and where it went wrong, never on its content.
pub fn key(data: &[u8]) {
    match IdempotencyKey::parse_bytes(data) {
        Ok(key) => {
            assert!((1..=255).contains(&data.len()));
            assert!(data.iter().all(|b| (0x21..=0x7e).contains(b)));
            assert_eq!(key.expose().as_bytes(), data);
        }
        Err(error) => {
            let masked: Vec<u8> = data
                .iter()
                .map(|b| if b.is_ascii_graphic() { b'x' } else { *b })
                .collect();
            let masked_error =
                IdempotencyKey::parse_bytes(&masked).expect_err("the same shape is refused");
            assert_eq!(error.to_string(), masked_error.to_string());
        }
    }
}

const ORDERS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/orders.pb"));

/// The encoded descriptor set of the request shape [`request_fingerprint`] reads.
pub fn orders_descriptor_set() -> &'static [u8] {
    ORDERS
}
const CREATE_ORDER: &str = "/orders.v1.Orders/CreateOrder";

fn orders() -> &'static (RequestSchema, DescriptorPool) {
    static ORDERS_SCHEMA: OnceLock<(RequestSchema, DescriptorPool)> = OnceLock::new();
    ORDERS_SCHEMA.get_or_init(|| {
        (
            RequestSchema::from_file_descriptor_set(ORDERS).expect("the orders schema"),
            DescriptorPool::decode(ORDERS).expect("the orders descriptors"),
        )
    })
}

/// Any bytes, read as a request to a method whose input has maps, nested and repeated messages,
/// a oneof, an optional field, an enum and `Any`: the canonical fingerprint is an answer or a
/// clear refusal, never a panic; and the same message encoded again (another field order,
/// other map order, packed or not) has the same fingerprint and the same canonical form.
pub fn request_fingerprint(data: &[u8]) {
    let (schema, pool) = orders();
    let method = GrpcMethod::parse(CREATE_ORDER).expect("a method");
    let Ok(fingerprint) = schema.fingerprint(&method, data) else {
        return;
    };
    let input = pool
        .get_message_by_name("orders.v1.CreateOrderRequest")
        .expect("the request type");
    let message = DynamicMessage::decode(input, data).expect("bytes the schema read decode");
    let encoded_again = message.encode_to_vec();
    assert_eq!(
        schema.canonical_form(&method, &encoded_again).ok(),
        schema.canonical_form(&method, data).ok(),
        "the same message encoded again has another canonical form"
    );
    assert_eq!(
        schema.fingerprint(&method, &encoded_again).ok(),
        Some(fingerprint),
        "the same message encoded again has another fingerprint"
    );
}
