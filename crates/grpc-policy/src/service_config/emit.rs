//! Writing a service config as the standard JSON, every field kept.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{MethodConfig, MethodName, ServiceConfig};
use crate::{CodeSet, code_name};

impl ServiceConfig {
    /// The standard JSON of this config.
    pub fn to_json(&self) -> Value {
        let mut root = self.other_fields.clone();
        if !self.method_configs.is_empty() {
            let entries = self.method_configs.iter().map(emit_method_config).collect();
            root.insert("methodConfig".into(), Value::Array(entries));
        }
        if let Some(t) = &self.retry_throttling {
            root.insert(
                "retryThrottling".into(),
                json!({
                    "maxTokens": t.max_tokens,
                    "tokenRatio": f64::from(t.token_ratio_milli) / 1000.0,
                }),
            );
        }
        Value::Object(root)
    }
}

/// Writes a duration as proto3 JSON does (`"0.500s"`: 0, 3, 6 or 9 fractional digits), through
/// `prost_types::Duration`, the form every gRPC client reads.
fn emit_duration(duration: Duration) -> Value {
    match prost_types::Duration::try_from(duration) {
        Ok(proto) => Value::String(proto.to_string()),
        // Beyond protobuf's range (a parsed config never is): its largest value.
        Err(_) => Value::String(format!("{}s", super::parse::MAX_DURATION_SECONDS)),
    }
}

fn emit_codes(codes: CodeSet) -> Value {
    Value::Array(
        codes
            .codes()
            .map(|c| Value::String(code_name(c).into()))
            .collect(),
    )
}

fn emit_method_config(entry: &MethodConfig) -> Value {
    let names: Vec<Value> = entry
        .names
        .iter()
        .map(|name| match name {
            MethodName::Default => json!({}),
            MethodName::Service(service) => json!({ "service": service }),
            MethodName::Method(m) => json!({ "service": m.service(), "method": m.method() }),
        })
        .collect();
    let mut out = entry.other_fields.clone();
    out.insert("name".into(), Value::Array(names));
    if let Some(timeout) = entry.timeout {
        out.insert("timeout".into(), emit_duration(timeout));
    }
    if let Some(wait) = entry.wait_for_ready {
        out.insert("waitForReady".into(), Value::Bool(wait));
    }
    if let Some(bytes) = entry.max_request_message_bytes {
        out.insert("maxRequestMessageBytes".into(), json!(bytes));
    }
    if let Some(bytes) = entry.max_response_message_bytes {
        out.insert("maxResponseMessageBytes".into(), json!(bytes));
    }
    if let Some(p) = &entry.retry_policy {
        let mut policy = json!({
            "maxAttempts": p.max_attempts_requested,
            "initialBackoff": emit_duration(p.initial_backoff),
            "maxBackoff": emit_duration(p.max_backoff),
            "backoffMultiplier": p.backoff_multiplier,
            "retryableStatusCodes": emit_codes(p.retryable_status_codes),
        });
        if let Some(limit) = p.per_attempt_recv_timeout {
            policy["perAttemptRecvTimeout"] = emit_duration(limit);
        }
        out.insert("retryPolicy".into(), policy);
    }
    if let Some(h) = &entry.hedging_policy {
        let mut hedging = Map::new();
        hedging.insert("maxAttempts".into(), json!(h.max_attempts_requested));
        if let Some(delay) = h.hedging_delay {
            hedging.insert("hedgingDelay".into(), emit_duration(delay));
        }
        if !h.non_fatal_status_codes.is_empty() {
            hedging.insert(
                "nonFatalStatusCodes".into(),
                emit_codes(h.non_fatal_status_codes),
            );
        }
        out.insert("hedgingPolicy".into(), Value::Object(hedging));
    }
    Value::Object(out)
}
