//! Parsing, emitting and refusing A6 service configs.

use std::time::Duration;

use grpc_policy::{CodeSet, GrpcRetryOwner, GrpcServiceConfigPolicy, MethodName, ServiceConfig};
use tonic::Code;

const GOOD: &str = r#"{
  "methodConfig": [
    {
      "name": [{"service": "payments.v1.Payments", "method": "GetPayment"}, {"service": "payments.v1.Ledger"}],
      "timeout": "1.5s",
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE", 10]
      }
    },
    {
      "name": [{}],
      "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0.05s", "nonFatalStatusCodes": ["unavailable"]}
    }
  ],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}"#;

#[test]
fn a_valid_config_parses_into_the_model() {
    let config = ServiceConfig::parse(GOOD).expect("valid");
    assert_eq!(config.method_configs.len(), 2);
    let first = &config.method_configs[0];
    assert_eq!(first.timeout, Some(Duration::from_millis(1500)));
    assert!(
        matches!(&first.names[0], MethodName::Method(m) if m.as_str() == "/payments.v1.Payments/GetPayment")
    );
    assert_eq!(
        first.names[1],
        MethodName::Service("payments.v1.Ledger".into())
    );
    let retry = first.retry_policy.as_ref().expect("retry policy");
    assert_eq!(retry.max_attempts(), 4);
    assert_eq!(retry.initial_backoff(), Duration::from_millis(100));
    assert_eq!(
        retry.retryable_status_codes(),
        CodeSet::of(&[Code::Unavailable, Code::Aborted])
    );
    assert_eq!(config.method_configs[1].names, vec![MethodName::Default]);
    let hedging = config.method_configs[1]
        .hedging_policy
        .as_ref()
        .expect("hedging");
    assert_eq!(hedging.hedging_delay(), Some(Duration::from_millis(50)));
    let throttling = config.retry_throttling.expect("throttling");
    assert_eq!(
        (throttling.max_tokens(), throttling.token_ratio_milli()),
        (10, 100)
    );
}

#[test]
fn emit_then_parse_gives_the_same_model() {
    let config = ServiceConfig::parse(GOOD).expect("valid");
    let emitted = config.to_json().to_string();
    assert_eq!(
        ServiceConfig::parse(&emitted).expect("emitted config parses"),
        config
    );
    let capped = GOOD.replace("\"maxAttempts\": 4", "\"maxAttempts\": 9");
    let config = ServiceConfig::parse(&capped).expect("valid");
    assert_eq!(
        config.method_configs[0]
            .retry_policy
            .as_ref()
            .unwrap()
            .max_attempts(),
        5
    );
    let again = ServiceConfig::parse(&config.to_json().to_string()).expect("parses");
    assert_eq!(again, config, "the requested value survives the round trip");
}

fn retry_entry(policy: &str) -> String {
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "p.S", "method": "M"}}], "retryPolicy": {policy}}}]}}"#
    )
}

const POLICY: &str = r#"{"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}"#;

#[test]
fn every_a6_refusal_names_the_json_path() {
    let with = |field: &str, value: &str| {
        let mut policy: serde_json::Value = serde_json::from_str(POLICY).unwrap();
        policy[field] = serde_json::from_str(value).unwrap();
        retry_entry(&policy.to_string())
    };
    let without = |field: &str| {
        let mut policy: serde_json::Value = serde_json::from_str(POLICY).unwrap();
        policy.as_object_mut().unwrap().remove(field);
        retry_entry(&policy.to_string())
    };
    let rp = "$.methodConfig[0].retryPolicy";
    let cases: Vec<(String, String)> = vec![
        (with("maxAttempts", "1"), format!("{rp}.maxAttempts")),
        (with("maxAttempts", "0"), format!("{rp}.maxAttempts")),
        (with("maxAttempts", "\"3\""), format!("{rp}.maxAttempts")),
        (without("maxAttempts"), format!("{rp}.maxAttempts")),
        (with("initialBackoff", "\"0s\""), format!("{rp}.initialBackoff")),
        (with("initialBackoff", "\"-1s\""), format!("{rp}.initialBackoff")),
        (with("initialBackoff", "\"100ms\""), format!("{rp}.initialBackoff")),
        (with("initialBackoff", "0.1"), format!("{rp}.initialBackoff")),
        (with("initialBackoff", "\"0.1234567891s\""), format!("{rp}.initialBackoff")),
        (with("maxBackoff", "\"s\""), format!("{rp}.maxBackoff")),
        (without("maxBackoff"), format!("{rp}.maxBackoff")),
        (with("backoffMultiplier", "0"), format!("{rp}.backoffMultiplier")),
        (with("backoffMultiplier", "-2"), format!("{rp}.backoffMultiplier")),
        (with("retryableStatusCodes", "[]"), format!("{rp}.retryableStatusCodes")),
        (with("retryableStatusCodes", "[\"UNAVAILABLE\", \"BOGUS\"]"), format!("{rp}.retryableStatusCodes[1]")),
        (with("retryableStatusCodes", "[17]"), format!("{rp}.retryableStatusCodes[0]")),
        (with("retryableStatusCodes", "[\"OK\"]"), format!("{rp}.retryableStatusCodes[0]")),
        (
            r#"{"methodConfig": [{"name": [{"service": "p.S"}], "retryPolicy": RP, "hedgingPolicy": {"maxAttempts": 2}}]}"#.replace("RP", POLICY),
            "$.methodConfig[0]".into(),
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "p.S"}]}, {"name": [{"service": "p.S"}]}]}"#.into(),
            "$.methodConfig[1].name[0]".into(),
        ),
        (
            r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#.into(),
            "$.methodConfig[0].name[0]".into(),
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "p S", "method": "M"}]}]}"#.into(),
            "$.methodConfig[0].name[0]".into(),
        ),
        (r#"{"methodConfig": [{"name": []}]}"#.into(), "$.methodConfig[0].name".into()),
        (r#"{"methodConfig": {}}"#.into(), "$.methodConfig".into()),
        (r#"{"methodConfig": [{"name": [{}], "timeout": "0s"}]}"#.into(), "$.methodConfig[0].timeout".into()),
        (r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#.into(), "$.retryThrottling.maxTokens".into()),
        (r#"{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}"#.into(), "$.retryThrottling.maxTokens".into()),
        (r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}"#.into(), "$.retryThrottling.tokenRatio".into()),
        (r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1234}}"#.into(), "$.retryThrottling.tokenRatio".into()),
        (r#"{"retryThrottling": {"maxTokens": 10}}"#.into(), "$.retryThrottling.tokenRatio".into()),
        ("[1, 2]".into(), "$".into()),
        ("{not json".into(), "$".into()),
    ];
    for (json, path) in cases {
        let error = ServiceConfig::parse(&json).expect_err(&json);
        assert_eq!(error.path, path, "{json}\n-> {error}");
    }
}

#[test]
fn only_the_channel_owner_may_carry_retries_in_the_service_config() {
    let retrying = retry_entry(POLICY);
    let plain = r#"{"methodConfig": [{"name": [{}], "timeout": "2s"}]}"#;
    for owner in [
        GrpcRetryOwner::Application,
        GrpcRetryOwner::Mesh,
        GrpcRetryOwner::None,
    ] {
        let error = GrpcServiceConfigPolicy::new(owner)
            .parse(&retrying)
            .expect_err("refused");
        assert_eq!(error.path, "$.methodConfig[0].retryPolicy");
        assert!(GrpcServiceConfigPolicy::new(owner).parse(plain).is_ok());
    }
    assert!(
        GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel)
            .parse(&retrying)
            .is_ok()
    );
}

/// Found by `cargo xtask fuzz`: a huge `backoffMultiplier` came back from emit-then-parse one ulp
/// off, because JSON floats were not parsed to the nearest double. Emitting must be exact.
#[test]
fn fuzz_regression_huge_multipliers_round_trip_exactly() {
    for file in ["huge_multiplier_1.json", "huge_multiplier_2.json"] {
        let text = std::fs::read_to_string(format!("tests/data/fuzz_regressions/{file}")).unwrap();
        let config = ServiceConfig::parse(&text).expect("valid");
        assert_eq!(
            ServiceConfig::parse(&config.to_json().to_string()).expect("emitted parses"),
            config,
            "{file}"
        );
    }
}
