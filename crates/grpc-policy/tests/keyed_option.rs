//! Keyed mutations declared once, in the `.proto`: the catalog reads
//! `(grpc_safe_retries.v1.keyed_mutation)` from the descriptor set's bytes, so no code marks them
//! and no lint flag names them.

use grpc_core_api::GrpcMethod;
use grpc_policy::{KEYED_MUTATION_OPTION_PROTO, MethodCatalog, MethodClass};

/// `tests/data/keyed/orders.proto` compiled with the option's `.proto` written where its import
/// finds it, as a user's build script does.
fn orders_descriptor_set() -> Vec<u8> {
    // A directory per call: the tests of this file may run at once in one process.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let include = std::env::temp_dir().join(format!("keyed-option-{}-{call}", std::process::id()));
    let options = include.join("grpc_safe_retries/v1");
    std::fs::create_dir_all(&options).unwrap();
    std::fs::write(options.join("options.proto"), KEYED_MUTATION_OPTION_PROTO).unwrap();
    // protox::compile's prost-types set drops extension options when encoded; the compiler's own
    // encoding keeps them (as protoc's --descriptor_set_out does).
    let mut compiler =
        protox::Compiler::new([std::path::Path::new("tests/data/keyed"), include.as_path()])
            .unwrap();
    compiler.include_imports(true);
    compiler
        .open_files(["orders.proto"])
        .expect("the .proto and the option compile");
    std::fs::remove_dir_all(&include).unwrap();
    compiler.encode_file_descriptor_set()
}

fn class(catalog: &MethodCatalog, method: &str) -> (MethodClass, bool) {
    let info = catalog.get(&GrpcMethod::parse(method).unwrap()).unwrap();
    (info.class, info.declared)
}

#[test]
fn a_method_with_the_option_is_a_declared_keyed_mutation_and_the_others_keep_their_class() {
    let catalog = MethodCatalog::from_descriptor_set_bytes(&orders_descriptor_set()).unwrap();
    assert_eq!(
        class(&catalog, "/shop.v1.Orders/CreateOrder"),
        (MethodClass::KeyedMutation, true)
    );
    assert_eq!(
        class(&catalog, "/shop.v1.Orders/CancelOrder"),
        (MethodClass::NonIdempotent, false),
        "the option set to false declares nothing"
    );
    assert_eq!(
        class(&catalog, "/shop.v1.Orders/GetOrder"),
        (MethodClass::NoSideEffects, true)
    );
}

/// The same .proto encoded by way of prost-types (`protox::compile(..).encode_to_vec()`) has lost
/// the option: the catalog then sees no keyed mutation, which is why the guide says to encode
/// with the compiler (or protoc).
#[test]
fn a_descriptor_set_reencoded_through_prost_types_has_lost_the_option() {
    use prost::Message;
    let bytes = orders_descriptor_set();
    let reencoded = prost_types::FileDescriptorSet::decode(bytes.as_slice())
        .unwrap()
        .encode_to_vec();
    let catalog = MethodCatalog::from_descriptor_set_bytes(&reencoded).unwrap();
    assert_eq!(
        class(&catalog, "/shop.v1.Orders/CreateOrder"),
        (MethodClass::NonIdempotent, false)
    );
}
