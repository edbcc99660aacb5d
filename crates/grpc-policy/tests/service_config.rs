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

/// The model of a config, without the notes about how its text was spelled.
fn model(mut config: ServiceConfig) -> ServiceConfig {
    config.portability.clear();
    config
}

#[test]
fn emit_then_parse_gives_the_same_model() {
    let config = model(ServiceConfig::parse(GOOD).expect("valid"));
    let emitted = config.to_json().to_string();
    assert_eq!(
        model(ServiceConfig::parse(&emitted).expect("emitted config parses")),
        config
    );
    let capped = GOOD.replace("\"maxAttempts\": 4", "\"maxAttempts\": 9");
    let config = model(ServiceConfig::parse(&capped).expect("valid"));
    assert_eq!(
        config.method_configs[0]
            .retry_policy
            .as_ref()
            .unwrap()
            .max_attempts(),
        5
    );
    let again = model(ServiceConfig::parse(&config.to_json().to_string()).expect("parses"));
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
        (r#"{"methodConfig": {}}"#.into(), "$.methodConfig".into()),
        (r#"{"methodConfig": [{"name": [{}], "timeout": "-1s"}]}"#.into(), "$.methodConfig[0].timeout".into()),
        (r#"{"methodConfig": [{"name": [{}], "timeout": "315576000001s"}]}"#.into(), "$.methodConfig[0].timeout".into()),
        (r#"{"methodConfig": [{"name": [{}], "timeout": ".s"}]}"#.into(), "$.methodConfig[0].timeout".into()),
        (r#"{"methodConfig": [{"name": [{}], "waitForReady": "yes"}]}"#.into(), "$.methodConfig[0].waitForReady".into()),
        (r#"{"methodConfig": [{"name": [{}], "maxRequestMessageBytes": -1}]}"#.into(), "$.methodConfig[0].maxRequestMessageBytes".into()),
        (with("perAttemptRecvTimeout", "\"0s\""), format!("{rp}.perAttemptRecvTimeout")),
        (r#"{"retryThrottling": {"maxTokens": 10.5, "tokenRatio": 0.1}}"#.into(), "$.retryThrottling.maxTokens".into()),
        (r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0004}}"#.into(), "$.retryThrottling.tokenRatio".into()),
        (r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#.into(), "$.retryThrottling.maxTokens".into()),
        (r#"{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}"#.into(), "$.retryThrottling.maxTokens".into()),
        (r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}"#.into(), "$.retryThrottling.tokenRatio".into()),
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

/// The shapes the reference clients accept (or read differently), probed one by one: accepted
/// here as the most lenient client does, with a note naming who differs where they disagree.
#[test]
fn what_the_reference_clients_accept_is_accepted_and_disagreements_are_noted() {
    let parse = |json: &str| ServiceConfig::parse(json).unwrap_or_else(|e| panic!("{json}: {e}"));
    let notes = |config: &ServiceConfig| -> Vec<String> {
        config
            .portability
            .iter()
            .map(|n| format!("{}: {}", n.path, n.message))
            .collect()
    };

    // tokenRatio beyond 3 decimals is truncated (A6, grpc-java, C-core), not refused.
    let config = parse(r#"{"retryThrottling": {"maxTokens": 10.0, "tokenRatio": 0.5466}}"#);
    let throttling = config.retry_throttling.unwrap();
    assert_eq!(
        (throttling.max_tokens(), throttling.token_ratio_milli()),
        (10, 546)
    );
    assert!(notes(&config)[0].starts_with("$.retryThrottling.tokenRatio: 0.5466 is used as 0.546"));

    // Durations the clients' number parsers read; zero is a valid call timeout.
    for (text, expected) in [
        (".5s", Duration::from_millis(500)),
        ("1.s", Duration::from_secs(1)),
        ("+1s", Duration::from_secs(1)),
        ("0s", Duration::ZERO),
        ("315576000000s", Duration::from_secs(315_576_000_000)),
    ] {
        let config = parse(&format!(
            r#"{{"methodConfig": [{{"name": [{{}}], "timeout": "{text}"}}]}}"#
        ));
        assert_eq!(config.method_configs[0].timeout, Some(expected), "{text}");
    }

    // An entry that names nothing is skipped by grpc-go and grpc-java: it covers no call.
    for entry in [r#"{"timeout": "1s"}"#, r#"{"name": [], "timeout": "1s"}"#] {
        let config = parse(&format!(r#"{{"methodConfig": [{entry}]}}"#));
        let method = grpc_core_api::GrpcMethod::parse("/p.S/M").unwrap();
        assert!(config.entry_for(&method).is_none(), "{entry}");
        assert!(notes(&config)[0].contains("grpc-go and grpc-java skip it"));
    }

    // Lower-case status names: A6 says case-insensitive, grpc-go and grpc-java refuse.
    let config = parse(&retry_entry(&POLICY.replace("UNAVAILABLE", "unavailable")));
    assert_eq!(
        config.method_configs[0]
            .retry_policy
            .as_ref()
            .unwrap()
            .retryable_status_codes(),
        CodeSet::of(&[Code::Unavailable])
    );
    assert!(notes(&config)[0].contains("grpc-go and grpc-java refuse the whole config"));

    // A key that differs only in case is applied by grpc-go, so the owner check must see it.
    let lower = r#"{"methodConfig": [{"name": [{"service": "p.S"}], "retrypolicy": RP}]}"#
        .replace("RP", POLICY);
    let config = parse(&lower);
    assert!(config.method_configs[0].retry_policy.is_some());
    assert!(notes(&config)[0].contains("grpc-go"));
    let refused = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Application)
        .parse(&lower)
        .expect_err("an Application-owned channel must not carry grpc-go's retries");
    assert_eq!(refused.path, "$.methodConfig[0].retryPolicy");
}

/// Every field of a method config survives emit: parse, emit, parse loses nothing.
#[test]
fn every_field_survives_a_round_trip() {
    let json = r#"{
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": "p.S"},
        "methodConfig": [{
            "name": [{"service": "p.S"}],
            "waitForReady": true,
            "timeout": "2s",
            "maxRequestMessageBytes": 1048576,
            "maxResponseMessageBytes": 4194304,
            "retryPolicy": {
                "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"],
                "perAttemptRecvTimeout": "0.5s"
            },
            "x-team-owner": "payments"
        }]
    }"#;
    let config = ServiceConfig::parse(json).unwrap();
    let entry = &config.method_configs[0];
    assert_eq!(entry.wait_for_ready, Some(true));
    assert_eq!(entry.max_request_message_bytes, Some(1_048_576));
    assert_eq!(
        entry
            .retry_policy
            .as_ref()
            .unwrap()
            .per_attempt_recv_timeout(),
        Some(Duration::from_millis(500))
    );
    let emitted = config.to_json();
    let original: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        emitted["loadBalancingConfig"],
        original["loadBalancingConfig"]
    );
    assert_eq!(emitted["healthCheckConfig"], original["healthCheckConfig"]);
    for field in [
        "waitForReady",
        "maxRequestMessageBytes",
        "maxResponseMessageBytes",
        "x-team-owner",
        "timeout",
    ] {
        assert_eq!(
            emitted["methodConfig"][0][field], original["methodConfig"][0][field],
            "{field}"
        );
    }
    // Durations are written in proto3 JSON's canonical form ("0.5s" comes back as "0.500s").
    let duration = |value: &serde_json::Value| {
        value
            .as_str()
            .unwrap()
            .parse::<prost_types::Duration>()
            .unwrap()
    };
    assert_eq!(
        duration(&emitted["methodConfig"][0]["retryPolicy"]["perAttemptRecvTimeout"]),
        duration(&original["methodConfig"][0]["retryPolicy"]["perAttemptRecvTimeout"])
    );
    assert_eq!(
        emitted["methodConfig"][0]["retryPolicy"]["perAttemptRecvTimeout"],
        "0.500s"
    );
    assert_eq!(
        model(ServiceConfig::from_json(&emitted).unwrap()),
        model(config)
    );
}
