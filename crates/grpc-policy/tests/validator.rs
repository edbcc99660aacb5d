//! The ownership validator on a real descriptor set compiled from a .proto (protox) and real
//! service configs.

use grpc_core_api::GrpcMethod;
use grpc_policy::{
    Finding, GrpcRetryOwner, GrpcRetryOwnershipValidator, MethodCatalog, MethodClass,
    ServiceConfig, Severity,
};
use prost::Message;

fn catalog() -> MethodCatalog {
    let set = protox::compile(["payments.proto"], ["tests/data"]).expect("the .proto compiles");
    let bytes = set.encode_to_vec();
    let mut catalog = MethodCatalog::from_descriptor_set_bytes(&bytes).expect("a descriptor set");
    catalog
        .mark_keyed_mutation(&GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap())
        .unwrap();
    catalog
}

fn config(file: &str) -> ServiceConfig {
    ServiceConfig::parse(&std::fs::read_to_string(format!("tests/data/{file}")).unwrap()).unwrap()
}

fn render(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("{f}\n")).collect()
}

#[test]
fn the_catalog_reads_classes_and_streaming_from_the_descriptor_set() {
    let mut catalog = catalog();
    let class = |name: &str| {
        catalog
            .get(&GrpcMethod::parse(name).unwrap())
            .map(|m| m.class)
    };
    assert_eq!(
        class("/payments.v1.Payments/GetPayment"),
        Some(MethodClass::NoSideEffects)
    );
    assert_eq!(
        class("/payments.v1.Payments/CancelPayment"),
        Some(MethodClass::Idempotent)
    );
    assert_eq!(
        class("/payments.v1.Payments/CreatePayment"),
        Some(MethodClass::KeyedMutation)
    );
    assert_eq!(
        class("/payments.v1.Payments/Transfer"),
        Some(MethodClass::NonIdempotent)
    );
    let list = catalog
        .get(&GrpcMethod::parse("/payments.v1.Payments/ListPayments").unwrap())
        .unwrap();
    assert!(list.server_streaming && !list.client_streaming);
    assert!(
        catalog
            .mark_keyed_mutation(&GrpcMethod::parse("/payments.v1.Payments/Nope").unwrap())
            .is_err()
    );
    assert!(MethodCatalog::from_descriptor_set_bytes(b"\xff\xff not protobuf").is_err());
}

#[test]
fn a_clean_config_has_no_errors() {
    let findings = GrpcRetryOwnershipValidator::new(GrpcRetryOwner::Channel)
        .validate(&config("retry_get_and_cancel.json"), &catalog());
    assert!(
        findings.iter().all(|f| f.severity == Severity::Warning),
        "{}",
        render(&findings)
    );
}

#[test]
fn a_renamed_method_is_flagged() {
    let findings = GrpcRetryOwnershipValidator::new(GrpcRetryOwner::Channel)
        .validate(&config("renamed_method.json"), &catalog());
    expect_test::expect![[r#"
        error $.methodConfig[0].name[0]: /payments.v1.Payments/FetchPayment matches no method of the service (renamed or removed?); the calls it meant run with defaults
    "#]]
    .assert_eq(&render(&findings));
}

#[test]
fn a_service_wide_retry_over_a_non_idempotent_method_is_flagged() {
    let findings = GrpcRetryOwnershipValidator::new(GrpcRetryOwner::Channel)
        .validate(&config("service_wide_retry.json"), &catalog());
    expect_test::expect![[r#"
        warning $.methodConfig[0].retryPolicy: retryPolicy covers keyed mutation /payments.v1.Payments/CreatePayment (through payments.v1.Payments/*): safe only if every call carries a key and the server's ledger is durable
        warning $.methodConfig[0].retryPolicy: retryPolicy covers /payments.v1.Payments/Transfer (through payments.v1.Payments/*), whose idempotency is not declared: a sent call may run twice unless it is safe to repeat. Declare it in the .proto (option idempotency_level = IDEMPOTENT or NO_SIDE_EFFECTS), or as a keyed mutation (--keyed)
    "#]]
    .assert_eq(&render(&findings));
}

#[test]
fn owner_shadowing_cap_and_amplification_are_flagged() {
    let json = r#"{"methodConfig": [
        {"name": [{}], "timeout": "1s"},
        {"name": [{"service": "payments.v1.Payments"}], "timeout": "2s"},
        {"name": [
            {"service": "payments.v1.Payments", "method": "GetPayment"},
            {"service": "payments.v1.Payments", "method": "ListPayments"},
            {"service": "payments.v1.Payments", "method": "CancelPayment"},
            {"service": "payments.v1.Payments", "method": "CreatePayment"},
            {"service": "payments.v1.Payments", "method": "Transfer"}],
         "retryPolicy": {"maxAttempts": 7, "initialBackoff": "0.1s", "maxBackoff": "1s",
                         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
    let config = ServiceConfig::parse(json).unwrap();
    let findings = GrpcRetryOwnershipValidator::new(GrpcRetryOwner::Mesh)
        .with_layer("application", 3)
        .with_layer("mesh", 3)
        .validate(&config, &catalog());
    expect_test::expect![[r#"
        error $.methodConfig[2].retryPolicy: the channel's retry owner is mesh; the service config must not retry
        error $: one call can become 45 attempts (channel 5 x application 3 x mesh 3), above the bound of 10; let one layer own retries
        warning $.methodConfig[0].name[0]: (default) is shadowed: every method it covers has a more specific entry
        warning $.methodConfig[1].name[0]: payments.v1.Payments/* is shadowed: every method it covers has a more specific entry
        warning $.methodConfig[2].retryPolicy.maxAttempts: 7 attempts are capped at 5
        warning $.methodConfig[2].retryPolicy: retryPolicy covers keyed mutation /payments.v1.Payments/CreatePayment (directly): safe only if every call carries a key and the server's ledger is durable
        warning $.methodConfig[2].retryPolicy: retryPolicy covers /payments.v1.Payments/Transfer (directly), whose idempotency is not declared: a sent call may run twice unless it is safe to repeat. Declare it in the .proto (option idempotency_level = IDEMPOTENT or NO_SIDE_EFFECTS), or as a keyed mutation (--keyed)
    "#]]
    .assert_eq(&render(&findings));
}
