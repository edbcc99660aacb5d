//! A key carried in the request's body (AIP-155's `request_id`): only a singular top-level string
//! field can hold one, the empty string is "no key", and the fingerprint is of the request without
//! its key.

use grpc_core_api::{GrpcMethod, RequestSchema, SchemaError};
use prost::Message;

fn schema() -> RequestSchema {
    let set = protox::compile(["keyed.proto"], ["tests/proto"]).expect("keyed.proto compiles");
    RequestSchema::from_file_descriptor_set(&set.encode_to_vec()).expect("a valid descriptor set")
}

fn method(name: &str) -> GrpcMethod {
    GrpcMethod::parse(&format!("/keyed.v1.Transfers/{name}")).unwrap()
}

#[derive(Clone, PartialEq, prost::Message)]
struct CreateTransferRequest {
    #[prost(string, tag = "1")]
    request_id: String,
    #[prost(string, tag = "2")]
    account: String,
}

fn create(request_id: &str, account: &str) -> CreateTransferRequest {
    CreateTransferRequest {
        request_id: request_id.into(),
        account: account.into(),
    }
}

#[test]
fn only_a_singular_top_level_string_field_can_carry_the_key() {
    let schema = schema();
    let create_transfer = method("CreateTransfer");
    assert_eq!(
        schema.check_key_field(&create_transfer, "request_id"),
        Ok(())
    );
    assert_eq!(schema.check_key_field(&create_transfer, "account"), Ok(()));
    for field in ["tags", "labels", "amount_minor", "no_such_field"] {
        assert_eq!(
            schema.check_key_field(&create_transfer, field),
            Err(SchemaError::KeyFieldNotAString {
                message_type: "keyed.v1.CreateTransferRequest".into(),
                field: field.into(),
            }),
            "{field} cannot carry a key"
        );
    }
    assert_eq!(
        schema.check_key_field(&method("TagTransfer"), "request_id"),
        Err(SchemaError::KeyFieldNotAString {
            message_type: "keyed.v1.TagTransferRequest".into(),
            field: "request_id".into(),
        })
    );
    let unknown = GrpcMethod::parse("/keyed.v1.Transfers/Refund").unwrap();
    assert_eq!(
        schema.check_key_field(&unknown, "request_id"),
        Err(SchemaError::MethodNotInSchema {
            method: "/keyed.v1.Transfers/Refund".into(),
        })
    );
}

/// What `grpc-retry-lint` and the guard's set-up list: the methods whose request has a singular
/// string `request_id`, in name order (not the repeated one, not a method without the field).
#[test]
fn the_methods_with_a_request_id_are_those_whose_request_id_is_a_string() {
    assert_eq!(
        schema().methods_with_request_id(),
        vec![method("CreateTransfer")]
    );
}

#[test]
fn the_key_is_read_from_the_body_and_left_out_of_the_fingerprint() {
    let schema = schema();
    let create_transfer = method("CreateTransfer");
    let keyed = |request: &CreateTransferRequest| {
        schema
            .fingerprint_message_with_key(&create_transfer, request, Some("request_id"))
            .unwrap()
    };
    let (first, key) = keyed(&create("k-1", "acct-1"));
    assert_eq!(key.as_deref(), Some("k-1"));
    let (second, other_key) = keyed(&create("k-2", "acct-1"));
    assert_eq!(other_key.as_deref(), Some("k-2"));
    assert_eq!(first, second, "the key is not part of the request it names");
    // proto3's empty string is "not set": no key, and the same request.
    let (unkeyed, none) = keyed(&create("", "acct-1"));
    assert_eq!(none, None);
    assert_eq!(unkeyed, first);
    assert_ne!(keyed(&create("k-1", "acct-2")).0, first);
    // Without a key field named, the key is part of the body like any field.
    let plain = |request: &CreateTransferRequest| {
        schema
            .fingerprint_message_with_key(&create_transfer, request, None)
            .unwrap()
    };
    assert_eq!(plain(&create("k-1", "acct-1")).1, None);
    assert_ne!(
        plain(&create("k-1", "acct-1")).0,
        plain(&create("k-2", "acct-1")).0
    );
    assert_eq!(
        schema.fingerprint_message(&create_transfer, &create("k-1", "acct-1")),
        Ok(plain(&create("k-1", "acct-1")).0)
    );
}
