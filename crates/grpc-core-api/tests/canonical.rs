//! The request fingerprint over a real .proto with maps at every depth, oneofs, packed scalars,
//! proto3 optional and `google.protobuf.Any`: equal for equal requests however they were encoded,
//! different for different ones.

use std::collections::HashSet;

use grpc_core_api::{GrpcMethod, RequestFingerprint, RequestSchema, SchemaError};
use proptest::prelude::*;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use prost_reflect::{DynamicMessage, MapKey, MessageDescriptor, Value};

fn descriptor_set() -> Vec<u8> {
    protox::compile(["orders.proto"], ["tests/proto"])
        .expect("orders.proto compiles")
        .encode_to_vec()
}

fn schema() -> RequestSchema {
    RequestSchema::from_file_descriptor_set(&descriptor_set()).expect("a valid descriptor set")
}

fn create_order() -> GrpcMethod {
    GrpcMethod::parse("/orders.v1.Orders/CreateOrder").unwrap()
}

fn fingerprint(bytes: &[u8]) -> RequestFingerprint {
    schema().fingerprint(&create_order(), bytes).unwrap()
}

fn message_type(name: &str) -> MessageDescriptor {
    prost_reflect::DescriptorPool::decode(descriptor_set().as_slice())
        .unwrap()
        .get_message_by_name(name)
        .unwrap()
}

/// Hand-written wire encoding, so tests choose the order of fields and map entries.
#[derive(Default)]
struct Wire(Vec<u8>);

impl Wire {
    fn varint(mut self, tag: u32, value: u64) -> Self {
        encode_key(tag, WireType::Varint, &mut self.0);
        encode_varint(value, &mut self.0);
        self
    }
    fn bytes(mut self, tag: u32, value: &[u8]) -> Self {
        encode_key(tag, WireType::LengthDelimited, &mut self.0);
        encode_varint(value.len() as u64, &mut self.0);
        self.0.extend_from_slice(value);
        self
    }
    fn string(self, tag: u32, value: &str) -> Self {
        self.bytes(tag, value.as_bytes())
    }
    fn message(self, tag: u32, value: Wire) -> Self {
        self.bytes(tag, &value.0)
    }
    /// A `map<string, string>` field, entries in the order given.
    fn string_map(self, tag: u32, entries: &[(&str, &str)]) -> Self {
        entries.iter().fold(self, |wire, (key, value)| {
            wire.message(tag, Wire::default().string(1, key).string(2, value))
        })
    }
}

#[test]
fn map_entries_in_another_wire_order_give_the_same_fingerprint() {
    let entries = [
        ("team", "payments"),
        ("env", "prod"),
        ("region", "eu-west-1"),
    ];
    let mut reversed = entries;
    reversed.reverse();
    let a = Wire::default().string(1, "acct-1").string_map(3, &entries);
    let b = Wire::default().string(1, "acct-1").string_map(3, &reversed);
    assert_ne!(a.0, b.0, "the test needs two different encodings");
    assert_eq!(fingerprint(&a.0), fingerprint(&b.0));
}

#[test]
fn fields_in_another_wire_order_give_the_same_fingerprint() {
    let a = Wire::default().string(1, "acct-1").varint(2, 500);
    let b = Wire::default().varint(2, 500).string(1, "acct-1");
    assert_eq!(fingerprint(&a.0), fingerprint(&b.0));
}

#[test]
fn an_implicit_default_sent_explicitly_is_the_same_request() {
    let omitted = Wire::default().string(1, "acct-1");
    let explicit = Wire::default()
        .string(1, "acct-1")
        .varint(2, 0)
        .varint(8, 0)
        .string(13, "");
    assert_eq!(fingerprint(&omitted.0), fingerprint(&explicit.0));
}

#[test]
fn an_optional_field_set_to_its_default_differs_from_an_unset_one() {
    // `optional int32 tip_minor = 7`: the handler sees Some(0) or None, so these differ.
    let unset = Wire::default().string(1, "acct-1");
    let zero = Wire::default().string(1, "acct-1").varint(7, 0);
    assert_ne!(fingerprint(&unset.0), fingerprint(&zero.0));
}

#[test]
fn packed_and_unpacked_repeated_scalars_are_the_same_request() {
    let unpacked = Wire::default().varint(6, 3).varint(6, 1).varint(6, 2);
    let mut packed_body = Vec::new();
    for coupon in [3u64, 1, 2] {
        encode_varint(coupon, &mut packed_body);
    }
    let packed = Wire::default().bytes(6, &packed_body);
    assert_eq!(fingerprint(&unpacked.0), fingerprint(&packed.0));
    // Order within a repeated field is meaningful.
    let reordered = Wire::default().varint(6, 1).varint(6, 3).varint(6, 2);
    assert_ne!(fingerprint(&unpacked.0), fingerprint(&reordered.0));
}

#[test]
fn maps_inside_repeated_nested_and_oneof_messages_are_canonical() {
    let line = |entries: &[(&str, &str)]| {
        Wire::default()
            .string(1, "sku-1")
            .varint(2, 2)
            .string_map(3, entries)
    };
    let by_id_entry =
        |id: u64, entries: &[(&str, &str)]| Wire::default().varint(1, id).message(2, line(entries));
    let request = |attrs: &[(&str, &str)], ids: [u64; 2]| {
        let shipping = Wire::default()
            .string(1, "1 Main St")
            .message(2, by_id_entry(ids[0], attrs))
            .message(2, by_id_entry(ids[1], attrs));
        let invoice = Wire::default()
            .message(2, by_id_entry(ids[1], attrs))
            .message(2, by_id_entry(ids[0], attrs));
        Wire::default()
            .message(4, line(attrs))
            .message(5, shipping)
            .message(10, invoice)
    };
    let a = request(&[("colour", "red"), ("size", "L")], [7, 9]);
    let b = request(&[("size", "L"), ("colour", "red")], [9, 7]);
    assert_ne!(a.0, b.0);
    assert_eq!(fingerprint(&a.0), fingerprint(&b.0));
    let c = request(&[("size", "M"), ("colour", "red")], [9, 7]);
    assert_ne!(fingerprint(&a.0), fingerprint(&c.0));
}

/// The failure the issue measured: a request with a map decoded and re-encoded by a library whose
/// maps iterate in random order gives new bytes every time, and must still give one fingerprint.
#[test]
fn one_logical_request_built_fifty_times_has_one_fingerprint() {
    let descriptor = message_type("orders.v1.CreateOrderRequest");
    let labels: Vec<(String, String)> = (0..8)
        .map(|i| (format!("label-{i}"), format!("value-{i}")))
        .collect();
    let mut encodings = HashSet::new();
    let mut fingerprints = HashSet::new();
    for round in 0..50 {
        let mut message = DynamicMessage::new(descriptor.clone());
        message.set_field_by_name("account", Value::String("acct-1".into()));
        let mut rotated = labels.clone();
        rotated.rotate_left(round % labels.len());
        let map = rotated
            .into_iter()
            .map(|(k, v)| (MapKey::String(k), Value::String(v)))
            .collect();
        message.set_field_by_name("labels", Value::Map(map));
        let bytes = message.encode_to_vec();
        fingerprints.insert(fingerprint(&bytes));
        encodings.insert(bytes);
    }
    assert!(
        encodings.len() > 1,
        "the encodings should vary with map order"
    );
    assert_eq!(fingerprints.len(), 1);
}

#[test]
fn any_of_a_known_type_is_canonicalised_and_its_url_host_does_not_matter() {
    let line =
        |entries: &[(&str, &str)]| Wire::default().string(1, "sku-1").string_map(3, entries).0;
    let any = |url: &str, value: Vec<u8>| Wire::default().string(1, url).bytes(2, &value);
    let a = Wire::default().message(
        11,
        any(
            "type.googleapis.com/orders.v1.Line",
            line(&[("a", "1"), ("b", "2")]),
        ),
    );
    let b = Wire::default().message(
        11,
        any(
            "example.com/orders.v1.Line",
            line(&[("b", "2"), ("a", "1")]),
        ),
    );
    assert_eq!(fingerprint(&a.0), fingerprint(&b.0));
    let other = Wire::default().message(
        11,
        any(
            "type.googleapis.com/orders.v1.Line",
            line(&[("a", "1"), ("b", "3")]),
        ),
    );
    assert_ne!(fingerprint(&a.0), fingerprint(&other.0));
}

#[test]
fn any_of_an_unknown_type_is_taken_as_its_url_and_bytes() {
    let any = |value: &[u8]| {
        Wire::default().message(
            11,
            Wire::default()
                .string(1, "type.googleapis.com/elsewhere.v1.Thing")
                .bytes(2, value),
        )
    };
    assert_eq!(
        fingerprint(&any(b"\x08\x01").0),
        fingerprint(&any(b"\x08\x01").0)
    );
    assert_ne!(
        fingerprint(&any(b"\x08\x01").0),
        fingerprint(&any(b"\x08\x02").0)
    );
}

/// A hostile request of `Any`s nested thousands deep: fingerprinted quickly and without
/// exhausting the stack (unpacking stops after eight levels; deeper ones count by their bytes),
/// and still different when the innermost value differs.
#[test]
fn anys_nested_thousands_deep_are_fingerprinted_without_unbounded_work() {
    let nested = |innermost: &str| {
        let mut value = Wire::default().string(1, innermost).0;
        for _ in 0..5_000 {
            value = Wire::default()
                .string(1, "type.googleapis.com/google.protobuf.Any")
                .bytes(2, &value)
                .0;
        }
        Wire::default().message(
            11,
            Wire::default()
                .string(1, "type.googleapis.com/google.protobuf.Any")
                .bytes(2, &value),
        )
    };
    let (a, b) = (nested("x"), nested("y"));
    assert!(
        a.0.len() > 100_000,
        "the request is deep: {} bytes",
        a.0.len()
    );
    assert_eq!(fingerprint(&a.0), fingerprint(&nested("x").0));
    assert_ne!(fingerprint(&a.0), fingerprint(&b.0));
}

/// Unpacking stops after eight nested `Any`s: the eighth's value is still canonical (its map in
/// another wire order is the same request), the ninth's is taken as its bytes (another order is
/// another request), and a request nested thousands deep is fingerprinted without recursing
/// through every level.
#[test]
fn anys_are_unpacked_eight_deep_and_taken_as_bytes_below() {
    const ORDER: &str = "type.googleapis.com/orders.v1.CreateOrderRequest";
    // `depth` requests, each the `extension` of the one above; the innermost has labels.
    let nested = |depth: usize, labels: &[(&str, &str)]| {
        let mut request = Wire::default().string_map(3, labels).0;
        for _ in 0..depth {
            let any = Wire::default().string(1, ORDER).bytes(2, &request);
            request = Wire::default().message(11, any).0;
        }
        request
    };
    let (ab, ba) = ([("a", "1"), ("b", "2")], [("b", "2"), ("a", "1")]);
    for depth in 1..=8 {
        assert_eq!(
            fingerprint(&nested(depth, &ab)),
            fingerprint(&nested(depth, &ba)),
            "the Any {depth} deep is unpacked"
        );
    }
    assert_ne!(
        fingerprint(&nested(9, &ab)),
        fingerprint(&nested(9, &ba)),
        "the ninth Any is taken as its bytes"
    );
    let deep = nested(5_000, &ab);
    assert_eq!(fingerprint(&deep), fingerprint(&nested(5_000, &ab)));
    assert_ne!(
        fingerprint(&deep),
        fingerprint(&nested(5_000, &[("a", "2")]))
    );
}

/// The canonical form is a stored format: a fingerprint a ledger holds must be computed the same
/// way by every later release, or a resend after an upgrade is refused as a reused key. This pins
/// it byte for byte, with a length past one varint byte (200: 0xC8 0x01).
#[test]
fn the_canonical_form_is_pinned_byte_for_byte() {
    let request = Wire::default().varint(2, 300).string(1, &"a".repeat(200)).0;
    let name = b"orders.v1.CreateOrderRequest";
    // The form's version tag, then the type's name, then each field by number.
    let mut expected = b"grpc-safe-retries/canonical-request/v1\0".to_vec();
    expected.push(name.len() as u8);
    expected.extend_from_slice(name);
    expected.extend_from_slice(&[1, 0xC8, 0x01]);
    expected.extend_from_slice("a".repeat(200).as_bytes());
    expected.push(2);
    expected.extend_from_slice(&300_i64.to_le_bytes());
    assert_eq!(
        schema().canonical_form(&create_order(), &request).unwrap(),
        expected
    );
    assert_eq!(
        fingerprint(&request).to_hex(),
        "931a944641e2695e363363721674b3d482e78e59cfc5d416bb574187be4aedb1"
    );
}

#[test]
fn fields_the_schema_does_not_declare_are_not_part_of_the_request() {
    let known = Wire::default().string(1, "acct-1");
    let with_unknown = Wire::default()
        .string(1, "acct-1")
        .string(99, "from a newer client");
    assert_eq!(fingerprint(&known.0), fingerprint(&with_unknown.0));
}

#[test]
fn every_kind_of_change_gives_another_fingerprint() {
    let base = || Wire::default().string(1, "acct-1").varint(2, 500);
    let variants = [
        base(),
        Wire::default().string(1, "acct-2").varint(2, 500),
        Wire::default().string(1, "acct-1").varint(2, 501),
        base().string_map(3, &[("k", "v")]),
        base().string_map(3, &[("k", "w")]),
        base().string_map(3, &[("j", "v")]),
        base().varint(8, 1),
        base().string(9, "tok"),
        base().message(10, Wire::default()),
        base().string(13, "n"),
        base().bytes(12, &Wire::default().varint(1, 1).0),
        // The same bytes in another field of the same type.
        Wire::default()
            .string(1, "acct-1")
            .varint(2, 500)
            .string(9, "x"),
        Wire::default()
            .string(1, "acct-1")
            .varint(2, 500)
            .message(5, Wire::default().string(1, "x")),
    ];
    let distinct: HashSet<_> = variants.iter().map(|v| fingerprint(&v.0)).collect();
    assert_eq!(distinct.len(), variants.len());
}

#[test]
fn schema_mistakes_are_named_without_request_data() {
    let schema = schema();
    let unknown = GrpcMethod::parse("/orders.v1.Orders/Cancel").unwrap();
    assert_eq!(
        schema.fingerprint(&unknown, b""),
        Err(SchemaError::MethodNotInSchema {
            method: "/orders.v1.Orders/Cancel".into()
        })
    );
    assert_eq!(
        schema.fingerprint(&create_order(), b"\x0a\xff"),
        Err(SchemaError::RequestDoesNotMatchSchema {
            message_type: "orders.v1.CreateOrderRequest".into()
        })
    );
    assert!(matches!(
        RequestSchema::from_file_descriptor_set(b"\x0a\x03abc"),
        Err(SchemaError::DescriptorSetInvalid { .. })
    ));
    let status = tonic::Status::from(SchemaError::MethodNotInSchema {
        method: "/a.B/C".into(),
    });
    assert_eq!(status.code(), tonic::Code::Internal);
}

fn labels_strategy() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 0..12)
        .prop_map(|map| map.into_iter().collect())
}

fn encode_labels(account: &str, labels: &[(String, String)]) -> Vec<u8> {
    let entries: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    Wire::default()
        .string(1, account)
        .string_map(3, &entries)
        .message(4, Wire::default().string_map(3, &entries))
        .0
}

proptest! {
    #[test]
    fn random_maps_in_random_orders_give_one_fingerprint(
        labels in labels_strategy(),
        order in any::<proptest::sample::Index>(),
        seed in any::<u64>(),
    ) {
        let mut shuffled = labels.clone();
        // A deterministic shuffle driven by proptest's inputs.
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13; state ^= state >> 7; state ^= state << 17;
            shuffled.swap(i, (state as usize) % (i + 1));
        }
        if !shuffled.is_empty() {
            let pivot = order.index(shuffled.len());
            shuffled.rotate_left(pivot);
        }
        prop_assert_eq!(
            fingerprint(&encode_labels("acct", &labels)),
            fingerprint(&encode_labels("acct", &shuffled))
        );
    }

    #[test]
    fn any_changed_entry_gives_another_fingerprint(
        labels in labels_strategy().prop_filter("needs an entry", |l| !l.is_empty()),
        which in any::<proptest::sample::Index>(),
        change_key in any::<bool>(),
    ) {
        let mut changed = labels.clone();
        let entry = &mut changed[which.index(labels.len())];
        if change_key { entry.0.push('~'); } else { entry.1.push('~'); }
        prop_assert_ne!(
            fingerprint(&encode_labels("acct", &labels)),
            fingerprint(&encode_labels("acct", &changed))
        );
    }
}

/// The server's request type has a field its descriptor set lacks (the set is older than the
/// code): two requests differing only there would share a fingerprint and the second would
/// replay the first, so the guard's fingerprint refuses, at any depth.
#[test]
fn a_request_type_newer_than_the_schema_is_refused_not_hashed() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct NewerLine {
        #[prost(string, tag = "1")]
        sku: String,
        #[prost(string, tag = "77")]
        gift_note: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct NewerOrder {
        #[prost(string, tag = "1")]
        account: String,
        #[prost(message, repeated, tag = "4")]
        lines: Vec<NewerLine>,
        #[prost(message, optional, tag = "5")]
        shipping: Option<NewerShipping>,
        #[prost(int64, tag = "99")]
        loyalty_points: i64,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct NewerShipping {
        #[prost(map = "int64, message", tag = "2")]
        by_id: std::collections::HashMap<i64, NewerLine>,
    }
    let line = |note: &str| NewerLine {
        sku: "sku-1".into(),
        gift_note: note.into(),
    };
    let schema = schema();
    let order = |points, note: &str| NewerOrder {
        account: "acct-1".into(),
        lines: vec![line(note)],
        shipping: None,
        loyalty_points: points,
    };
    // The new field inside a map's value.
    let shipped = |note: &str| NewerOrder {
        account: "acct-1".into(),
        lines: Vec::new(),
        shipping: Some(NewerShipping {
            by_id: [(7, line(note))].into(),
        }),
        loyalty_points: 0,
    };
    let refused = Err(SchemaError::RequestTypeDiffersFromSchema {
        message_type: "orders.v1.CreateOrderRequest".into(),
    });
    assert_eq!(
        schema.fingerprint_message(&create_order(), &order(5, "")),
        refused
    );
    assert_eq!(
        schema.fingerprint_message(&create_order(), &order(0, "hi")),
        refused
    );
    assert_eq!(
        schema.fingerprint_message(&create_order(), &shipped("hi")),
        refused
    );
    // With the new fields at their defaults nothing unknown is on the wire: nothing to refuse.
    assert!(
        schema
            .fingerprint_message(&create_order(), &order(0, ""))
            .is_ok()
    );
    assert!(
        schema
            .fingerprint_message(&create_order(), &shipped(""))
            .is_ok()
    );
}
