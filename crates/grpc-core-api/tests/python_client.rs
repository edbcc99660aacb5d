//! The fingerprint of a request built by another client library: Python's protobuf runtime (what
//! grpcio clients serialise with) builds one logical request with its maps filled in several
//! orders; every serialization, and the same request built here in Rust, has one fingerprint.
//!
//! Needs `python3` with the `protobuf` package (`cargo xtask test` installs it with pip); fails,
//! never skips, without it.

use std::process::Command;

use grpc_core_api::{GrpcMethod, RequestSchema};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, MapKey, Value};

fn descriptor_set() -> Vec<u8> {
    protox::compile(["orders.proto"], ["tests/proto"])
        .expect("orders.proto compiles")
        .encode_to_vec()
}

/// The request the Python script builds, built here with prost-reflect (whose maps iterate in
/// hash order).
fn rust_request(pool: &DescriptorPool) -> Vec<u8> {
    let message = |name: &str| DynamicMessage::new(pool.get_message_by_name(name).unwrap());
    let strings = |pairs: &[(&str, &str)]| {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (MapKey::String((*k).into()), Value::String((*v).into())))
                .collect(),
        )
    };
    let attributes = [("colour", "red"), ("size", "L"), ("fit", "slim")];
    let line = |sku: &str, quantity: i32| {
        let mut line = message("orders.v1.Line");
        line.set_field_by_name("sku", Value::String(sku.into()));
        if quantity != 0 {
            line.set_field_by_name("quantity", Value::I32(quantity));
        }
        line.set_field_by_name("attributes", strings(&attributes));
        line
    };
    let labels: Vec<(String, String)> = (0..8)
        .map(|i| (format!("label-{i}"), format!("value-{i}")))
        .collect();
    let labels: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut shipping = message("orders.v1.Shipping");
    shipping.set_field_by_name(
        "by_id",
        Value::Map(
            [7i64, 9]
                .into_iter()
                .map(|id| {
                    (
                        MapKey::I64(id),
                        Value::Message(line(&format!("sku-{id}"), 0)),
                    )
                })
                .collect(),
        ),
    );
    let mut any = message("google.protobuf.Any");
    any.set_field_by_name(
        "type_url",
        Value::String("type.googleapis.com/orders.v1.Line".into()),
    );
    any.set_field_by_name(
        "value",
        Value::Bytes(line("in-any", 0).encode_to_vec().into()),
    );
    let mut request = message("orders.v1.CreateOrderRequest");
    request.set_field_by_name("account", Value::String("acct-1".into()));
    request.set_field_by_name("amount_minor", Value::I64(500));
    request.set_field_by_name("labels", strings(&labels));
    request.set_field_by_name("lines", Value::List(vec![Value::Message(line("sku-1", 2))]));
    request.set_field_by_name("shipping", Value::Message(shipping));
    request.set_field_by_name(
        "coupons",
        Value::List(vec![Value::I32(3), Value::I32(1), Value::I32(2)]),
    );
    request.set_field_by_name("extension", Value::Message(any));
    request.encode_to_vec()
}

#[test]
fn a_python_protobuf_client_and_a_rust_client_get_one_fingerprint() {
    let descriptors = descriptor_set();
    let file = std::env::temp_dir().join(format!("orders-{}.pb", std::process::id()));
    std::fs::write(&file, &descriptors).unwrap();
    let output = Command::new("python3")
        .arg("tests/python/build_orders.py")
        .arg(&file)
        .output()
        .expect("python3 must be installed to run this test");
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "the Python client failed (is the `protobuf` package installed? `python3 -m pip install \
         protobuf`, which `cargo xtask test` does): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let encodings: Vec<Vec<u8>> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            (0..line.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    assert_eq!(encodings.len(), 3, "one serialization per insertion order");

    let schema = RequestSchema::from_file_descriptor_set(&descriptors).unwrap();
    let method = GrpcMethod::parse("/orders.v1.Orders/CreateOrder").unwrap();
    let pool = DescriptorPool::decode(descriptors.as_slice()).unwrap();
    let rust = schema.fingerprint(&method, &rust_request(&pool)).unwrap();
    for (n, python) in encodings.iter().enumerate() {
        assert_eq!(
            schema.fingerprint(&method, python).unwrap(),
            rust,
            "Python serialization {n} differs from the Rust request"
        );
    }
    // And a changed value is a different request for both libraries.
    let mut changed = encodings[0].clone();
    let at = changed
        .windows(7)
        .position(|w| w == b"value-3")
        .expect("a label value");
    changed[at + 6] = b'4';
    assert_ne!(schema.fingerprint(&method, &changed).unwrap(), rust);
}
