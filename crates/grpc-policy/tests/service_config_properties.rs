//! Property tests of the service config parser: emitted configs parse back to the same model,
//! and arbitrary input never panics.

use std::time::Duration;

use grpc_policy::{ALL_CODES, ServiceConfig};
use proptest::prelude::*;
use serde_json::json;

fn duration_text() -> impl Strategy<Value = String> {
    (0u64..30, 0u32..1_000_000_000, any::<bool>()).prop_map(|(secs, nanos, whole)| {
        let d = Duration::new(secs, if whole { 0 } else { nanos });
        let d = if d.is_zero() {
            Duration::from_millis(1)
        } else {
            d
        };
        let fraction = format!("{:09}", d.subsec_nanos());
        let fraction = fraction.trim_end_matches('0');
        if fraction.is_empty() {
            format!("{}s", d.as_secs())
        } else {
            format!("{}.{fraction}s", d.as_secs())
        }
    })
}

fn codes() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(1usize..17, 1..5).prop_map(|numbers| {
        numbers
            .into_iter()
            .map(|n| grpc_policy::code_name(ALL_CODES[n]).to_owned())
            .collect()
    })
}

fn entry(index: usize) -> impl Strategy<Value = serde_json::Value> {
    (any::<bool>(), 2u32..9, duration_text(), duration_text(), 1u32..50, codes(), prop::option::of(duration_text()))
        .prop_map(move |(hedge, attempts, initial, max, multiplier, codes, timeout)| {
            let mut entry = json!({"name": [{"service": format!("pkg.Svc{index}"), "method": "M"}]});
            if let Some(timeout) = timeout {
                entry["timeout"] = json!(timeout);
            }
            if hedge {
                entry["hedgingPolicy"] = json!({"maxAttempts": attempts, "hedgingDelay": initial, "nonFatalStatusCodes": codes});
            } else {
                entry["retryPolicy"] = json!({
                    "maxAttempts": attempts, "initialBackoff": initial, "maxBackoff": max,
                    "backoffMultiplier": f64::from(multiplier) / 10.0, "retryableStatusCodes": codes,
                });
            }
            entry
        })
}

proptest! {
    #[test]
    fn emitted_configs_parse_back_to_the_same_model(
        entries in prop::collection::vec(0usize..1, 0..4).prop_flat_map(|v| {
            (0..v.len()).map(entry).collect::<Vec<_>>()
        }),
        tokens in 1u32..=1000,
        ratio_milli in 1u32..5000,
    ) {
        let json = json!({
            "methodConfig": entries,
            "retryThrottling": {"maxTokens": tokens, "tokenRatio": f64::from(ratio_milli) / 1000.0},
        });
        let parsed = ServiceConfig::parse(&json.to_string()).expect("a generated config is valid");
        let again = ServiceConfig::parse(&parsed.to_json().to_string()).expect("an emitted config is valid");
        prop_assert_eq!(again, parsed);
    }

    /// The parser is written by hand (it must accept, with a note, spellings the reference
    /// clients accept and protobuf's own parser refuses); here it is held to
    /// `prost_types::Duration` on every duration text protobuf reads, and on every text protobuf
    /// writes.
    #[test]
    fn durations_read_as_protobufs_own_parser_reads_them(
        seconds in 0i64..400_000_000_000,
        nanos in 0i32..1_000_000_000,
        digits in 0usize..10,
        spelled in any::<bool>(),
    ) {
        let text = if spelled {
            // Any number of fractional digits protobuf's parser takes (0 to 9).
            let fraction = format!("{nanos:09}");
            if digits == 0 { format!("{seconds}s") } else { format!("{seconds}.{}s", &fraction[..digits]) }
        } else {
            prost_types::Duration { seconds, nanos }.to_string()
        };
        let theirs = text.parse::<prost_types::Duration>().ok().filter(|d| d.seconds <= 315_576_000_000);
        let config = format!(r#"{{"methodConfig": [{{"name": [{{}}], "timeout": "{text}"}}]}}"#);
        let ours = ServiceConfig::parse(&config).ok().and_then(|c| c.method_configs[0].timeout);
        let theirs = theirs.map(|d| Duration::new(d.seconds as u64, d.nanos as u32));
        prop_assert_eq!(ours, theirs, "{}", text);
    }

    #[test]
    fn arbitrary_text_never_panics_and_errors_name_a_path(text in "\\PC{0,200}") {
        if let Err(error) = ServiceConfig::parse(&text) {
            prop_assert!(error.path.starts_with('$'));
        }
    }

    #[test]
    fn arbitrary_json_shapes_never_panic(value in json_value()) {
        if let Err(error) = ServiceConfig::from_json(&json!({"methodConfig": [value]})) {
            prop_assert!(error.path.starts_with("$.methodConfig[0]"));
        }
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zA-Z0-9._/ -]{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let keys = prop::sample::select(vec![
            "name",
            "service",
            "method",
            "retryPolicy",
            "hedgingPolicy",
            "timeout",
            "maxAttempts",
            "initialBackoff",
            "maxBackoff",
            "backoffMultiplier",
            "retryableStatusCodes",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(keys, inner, 0..5).prop_map(|m| {
                serde_json::Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}
