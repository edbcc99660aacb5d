//! The gRFC A6 service config: parse, refuse what A6 refuses (naming the JSON path), emit.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use grpc_core_api::GrpcMethod;
use serde_json::{Map, Value, json};

use crate::{CodeSet, GrpcRetryOwner, code_name, parse_code};

/// A6 caps `maxAttempts` at 5; a larger value is used as 5 and reported by the validator.
pub const MAX_ATTEMPTS_CAP: u32 = 5;

/// A service config value refused, with the JSON path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Where, as `$.methodConfig[0].retryPolicy.maxAttempts`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

fn refuse<T>(path: &str, message: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        path: path.to_owned(),
        message: message.into(),
    })
}

/// A parsed service config. Fields this crate does not interpret (`loadBalancingConfig`,
/// `healthCheckConfig`, ...) are kept as they were and emitted again, so that parse, emit, parse
/// loses nothing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceConfig {
    /// The method configs, in order.
    pub method_configs: Vec<MethodConfig>,
    /// The channel-wide retry throttling, if any.
    pub retry_throttling: Option<RetryThrottling>,
    /// The top-level fields not interpreted here, as they were.
    pub other_fields: Map<String, Value>,
    /// What this parser accepted that some reference client (grpc-go, grpc-java, gRPC C-core)
    /// refuses or reads differently; the validator reports each as a finding.
    pub portability: Vec<PortabilityNote>,
}

/// Something a config does that the reference clients do not agree on: accepted here (as the
/// most lenient of them does), and reported so that a config shared across languages stays
/// safe everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortabilityNote {
    /// Where, as `$.methodConfig[0].retryPolicy.retryableStatusCodes[0]`.
    pub path: String,
    /// What differs, naming the clients.
    pub message: String,
}

/// Which calls a method config applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MethodName {
    /// `{}`: every method of every service not named elsewhere.
    Default,
    /// `{"service": "pkg.Svc"}`: every method of the service not named elsewhere.
    Service(String),
    /// `{"service": "pkg.Svc", "method": "M"}`: one method.
    Method(GrpcMethod),
}

impl MethodName {
    /// How specific the name is: a method beats its service, which beats the default.
    pub fn specificity(&self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Service(_) => 1,
            Self::Method(_) => 2,
        }
    }

    /// Whether this name covers `method`.
    pub fn covers(&self, method: &GrpcMethod) -> bool {
        match self {
            Self::Default => true,
            Self::Service(service) => method.service() == service,
            Self::Method(named) => named == method,
        }
    }
}

/// One `methodConfig` entry. Retry and hedging on one entry are refused, so an entry has at most
/// one of them.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    /// The names it applies to.
    pub names: Vec<MethodName>,
    /// The deadline of the whole call, every attempt included (`timeout`).
    pub timeout: Option<Duration>,
    /// `waitForReady`.
    pub wait_for_ready: Option<bool>,
    /// `maxRequestMessageBytes`.
    pub max_request_message_bytes: Option<u64>,
    /// `maxResponseMessageBytes`.
    pub max_response_message_bytes: Option<u64>,
    /// The retry policy.
    pub retry_policy: Option<RetryPolicy>,
    /// The hedging policy.
    pub hedging_policy: Option<HedgingPolicy>,
    /// The entry's fields not interpreted here, as they were.
    pub other_fields: Map<String, Value>,
}

/// A6 `retryPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    max_attempts_requested: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    backoff_multiplier: f64,
    retryable_status_codes: CodeSet,
    per_attempt_recv_timeout: Option<Duration>,
}

impl RetryPolicy {
    /// Checks and builds a policy as A6 does; `path` names it in errors.
    pub fn new(
        max_attempts: u32,
        initial_backoff: Duration,
        max_backoff: Duration,
        backoff_multiplier: f64,
        retryable_status_codes: CodeSet,
    ) -> Result<Self, ConfigError> {
        let path = "retryPolicy";
        if max_attempts < 2 {
            return refuse(path, "maxAttempts must be at least 2");
        }
        if initial_backoff.is_zero() || max_backoff.is_zero() {
            return refuse(path, "backoffs must be positive");
        }
        if !(backoff_multiplier.is_finite() && backoff_multiplier > 0.0) {
            return refuse(path, "backoffMultiplier must be greater than 0");
        }
        if retryable_status_codes.is_empty() {
            return refuse(path, "retryableStatusCodes must not be empty");
        }
        Ok(Self {
            max_attempts_requested: max_attempts,
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            retryable_status_codes,
            per_attempt_recv_timeout: None,
        })
    }

    /// The same policy with a time limit per attempt (`perAttemptRecvTimeout`, as grpc-java
    /// implements it); without one, only the call's deadline bounds an attempt.
    pub fn with_per_attempt_recv_timeout(mut self, limit: Duration) -> Self {
        self.per_attempt_recv_timeout = Some(limit);
        self
    }

    /// `perAttemptRecvTimeout`.
    pub fn per_attempt_recv_timeout(&self) -> Option<Duration> {
        self.per_attempt_recv_timeout
    }

    /// The attempts used: the requested value capped at 5.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts_requested.min(MAX_ATTEMPTS_CAP)
    }

    /// The value the config asked for (reported when above the cap).
    pub fn max_attempts_requested(&self) -> u32 {
        self.max_attempts_requested
    }

    /// `initialBackoff`.
    pub fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// `maxBackoff`.
    pub fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// `backoffMultiplier`.
    pub fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// `retryableStatusCodes`.
    pub fn retryable_status_codes(&self) -> CodeSet {
        self.retryable_status_codes
    }
}

/// A6 `hedgingPolicy`.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingPolicy {
    max_attempts_requested: u32,
    hedging_delay: Option<Duration>,
    non_fatal_status_codes: CodeSet,
}

impl HedgingPolicy {
    /// The attempts used: the requested value capped at 5.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts_requested.min(MAX_ATTEMPTS_CAP)
    }

    /// The value the config asked for.
    pub fn max_attempts_requested(&self) -> u32 {
        self.max_attempts_requested
    }

    /// `hedgingDelay`.
    pub fn hedging_delay(&self) -> Option<Duration> {
        self.hedging_delay
    }

    /// `nonFatalStatusCodes`.
    pub fn non_fatal_status_codes(&self) -> CodeSet {
        self.non_fatal_status_codes
    }
}

/// A6 `retryThrottling`: `maxTokens` in (0, 1000], `tokenRatio` > 0, kept to 3 decimals (further
/// decimals are truncated, as A6, grpc-java and gRPC C-core do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryThrottling {
    max_tokens: u32,
    token_ratio_milli: u32,
}

impl RetryThrottling {
    /// Checks and builds the throttling parameters; a ratio with more than 3 decimals is
    /// truncated to 3 (0.5466 is 0.546).
    pub fn new(max_tokens: u32, token_ratio: f64) -> Result<Self, ConfigError> {
        if !(1..=1000).contains(&max_tokens) {
            return refuse("retryThrottling.maxTokens", "must be in (0, 1000]");
        }
        if !(token_ratio.is_finite() && token_ratio > 0.0)
            || token_ratio * 1000.0 > f64::from(u32::MAX)
        {
            return refuse("retryThrottling.tokenRatio", "must be greater than 0");
        }
        // A hair of tolerance so that 0.1 (0.1000000000000000055...) stays 100 thousandths.
        let milli = (token_ratio * 1000.0 + 1e-9).floor();
        if milli < 1.0 {
            return refuse(
                "retryThrottling.tokenRatio",
                "is 0 once truncated to 3 decimals; it must be at least 0.001",
            );
        }
        Ok(Self {
            max_tokens,
            token_ratio_milli: milli as u32,
        })
    }

    /// `maxTokens`.
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio` in thousandths.
    pub fn token_ratio_milli(&self) -> u32 {
        self.token_ratio_milli
    }
}

impl ServiceConfig {
    /// Parses the standard JSON, refusing every value A6 refuses with the JSON path of the value.
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let value: Value =
            serde_json::from_str(json).or_else(|e| refuse("$", format!("not JSON: {e}")))?;
        Self::from_json(&value)
    }

    /// Reads an already-parsed JSON value.
    pub fn from_json(value: &Value) -> Result<Self, ConfigError> {
        let root = object(value, "$")?;
        let mut config = ServiceConfig::default();
        let mut fields = Fields::new(root, "$", &mut config.portability);
        let mut seen = HashSet::new();
        let method_configs = fields.take("methodConfig");
        let throttling = fields.take("retryThrottling");
        config.other_fields = fields.rest();
        if let Some((entries, path)) = method_configs {
            for (i, entry) in array(entries, &path)?.iter().enumerate() {
                let entry_path = format!("{path}[{i}]");
                let entry =
                    parse_method_config(entry, &entry_path, &mut seen, &mut config.portability)?;
                config.method_configs.push(entry);
            }
        }
        if let Some((throttling, path)) = throttling {
            config.retry_throttling = Some(parse_throttling(
                throttling,
                &path,
                &mut config.portability,
            )?);
        }
        Ok(config)
    }

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

    /// The entry that applies to `method` (most specific name wins), with its index.
    pub fn entry_for(&self, method: &GrpcMethod) -> Option<(usize, &MethodConfig)> {
        self.method_configs
            .iter()
            .enumerate()
            .filter_map(|(i, entry)| {
                entry
                    .names
                    .iter()
                    .filter(|name| name.covers(method))
                    .map(MethodName::specificity)
                    .max()
                    .map(|specificity| (specificity, i, entry))
            })
            .max_by_key(|(specificity, _, _)| *specificity)
            .map(|(_, i, entry)| (i, entry))
    }
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ConfigError> {
    value
        .as_object()
        .map_or_else(|| refuse(path, "must be an object"), Ok)
}

fn array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, ConfigError> {
    value
        .as_array()
        .map_or_else(|| refuse(path, "must be an array"), Ok)
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, ConfigError> {
    value
        .as_str()
        .map_or_else(|| refuse(path, "must be a string"), Ok)
}

/// One `methodConfig` entry. An entry that names nothing (no `name`, or an empty list) is kept
/// but covers no call, as grpc-go and grpc-java skip it.
fn parse_method_config(
    value: &Value,
    path: &str,
    seen: &mut HashSet<MethodName>,
    notes: &mut Vec<PortabilityNote>,
) -> Result<MethodConfig, ConfigError> {
    let entry = object(value, path)?;
    let mut fields = Fields::new(entry, path, notes);
    let name_list = fields.take("name");
    let timeout = fields.take("timeout");
    let wait_for_ready = fields.take("waitForReady");
    let max_request = fields.take("maxRequestMessageBytes");
    let max_response = fields.take("maxResponseMessageBytes");
    let retry = fields.take("retryPolicy");
    let hedging = fields.take("hedgingPolicy");
    let other_fields = fields.rest();
    let mut names = Vec::new();
    if let Some((list, list_path)) = name_list {
        for (j, name) in array(list, &list_path)?.iter().enumerate() {
            let name_path = format!("{list_path}[{j}]");
            let name = parse_name(name, &name_path)?;
            if !seen.insert(name.clone()) {
                return refuse(&name_path, "the same name appears in more than one place");
            }
            names.push(name);
        }
    }
    if names.is_empty() {
        // Kept, so that every entry keeps its index in the JSON; it covers no call.
        notes.push(PortabilityNote {
            path: format!("{path}.name"),
            message: "names no method, so the entry applies to nothing (grpc-go and grpc-java \
                      skip it)"
                .to_owned(),
        });
    }
    let timeout = timeout.map(|(t, p)| duration(t, &p, notes)).transpose()?;
    let wait_for_ready = wait_for_ready
        .map(|(v, p)| {
            v.as_bool()
                .map_or_else(|| refuse(&p, "must be true or false"), Ok)
        })
        .transpose()?;
    let max_request_message_bytes = max_request.map(|(v, p)| byte_count(v, &p)).transpose()?;
    let max_response_message_bytes = max_response.map(|(v, p)| byte_count(v, &p)).transpose()?;
    let retry_policy = retry
        .map(|(p, path)| parse_retry_policy(p, &path, notes))
        .transpose()?;
    let hedging_policy = hedging
        .map(|(p, path)| parse_hedging_policy(p, &path, notes))
        .transpose()?;
    if retry_policy.is_some() && hedging_policy.is_some() {
        return refuse(
            path,
            "retryPolicy and hedgingPolicy cannot both be set on one entry",
        );
    }
    Ok(MethodConfig {
        names,
        timeout,
        wait_for_ready,
        max_request_message_bytes,
        max_response_message_bytes,
        retry_policy,
        hedging_policy,
        other_fields,
    })
}

/// The fields of one JSON object, looked up by their A6 names: an exact match first, else a key
/// that differs only in case, which grpc-go's JSON decoder matches (and so applies) while
/// grpc-java and C-core ignore it. Accepting it here means an owner check sees a retry policy
/// that grpc-go would run; the note says who differs.
struct Fields<'a, 'n> {
    object: &'a Map<String, Value>,
    path: &'a str,
    taken: HashSet<&'a str>,
    notes: &'n mut Vec<PortabilityNote>,
}

impl<'a, 'n> Fields<'a, 'n> {
    fn new(
        object: &'a Map<String, Value>,
        path: &'a str,
        notes: &'n mut Vec<PortabilityNote>,
    ) -> Self {
        Self {
            object,
            path,
            taken: HashSet::new(),
            notes,
        }
    }

    /// The value of field `name` and its JSON path.
    fn take(&mut self, name: &str) -> Option<(&'a Value, String)> {
        let (key, value) = match self.object.get_key_value(name) {
            Some(found) => found,
            None => {
                let (key, value) = self
                    .object
                    .iter()
                    .find(|(key, _)| key.eq_ignore_ascii_case(name))?;
                self.notes.push(PortabilityNote {
                    path: format!("{}.{key}", self.path),
                    message: format!(
                        "is read as \"{name}\" here and by grpc-go, whose JSON decoder ignores case; \
                         grpc-java and gRPC C-core ignore it"
                    ),
                });
                (key, value)
            }
        };
        self.taken.insert(key.as_str());
        Some((value, format!("{}.{name}", self.path)))
    }

    /// The fields not taken, as they were.
    fn rest(self) -> Map<String, Value> {
        self.object
            .iter()
            .filter(|(key, _)| !self.taken.contains(key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }
}

/// A non-negative whole number of bytes.
fn byte_count(value: &Value, path: &str) -> Result<u64, ConfigError> {
    whole_number(value).map_or_else(|| refuse(path, "must be a non-negative integer"), Ok)
}

/// A JSON number that is a whole non-negative number, written `10` or `10.0`.
fn whole_number(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}

fn parse_name(value: &Value, path: &str) -> Result<MethodName, ConfigError> {
    let name = object(value, path)?;
    let service = name
        .get("service")
        .map(|s| string(s, &format!("{path}.service")))
        .transpose()?;
    let method = name
        .get("method")
        .map(|m| string(m, &format!("{path}.method")))
        .transpose()?;
    match (
        service.filter(|s| !s.is_empty()),
        method.filter(|m| !m.is_empty()),
    ) {
        (None, None) => Ok(MethodName::Default),
        (None, Some(_)) => refuse(path, "a method needs its service"),
        (Some(service), None) => GrpcMethod::from_parts(service, "Any")
            .map(|_| MethodName::Service(service.to_owned()))
            .or_else(|_| refuse(&format!("{path}.service"), "is not a protobuf service name")),
        (Some(service), Some(method)) => GrpcMethod::from_parts(service, method)
            .map(MethodName::Method)
            .or_else(|e| refuse(path, e.to_string())),
    }
}

fn max_attempts(policy: &Map<String, Value>, path: &str) -> Result<u32, ConfigError> {
    let path = format!("{path}.maxAttempts");
    let value = policy
        .get("maxAttempts")
        .map_or_else(|| refuse(&path, "is required"), Ok)?;
    match whole_number(value) {
        Some(n) if n >= 2 => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
        Some(_) => refuse(&path, "must be at least 2"),
        None => refuse(&path, "must be an integer of at least 2"),
    }
}

fn status_codes(
    value: Option<&Value>,
    path: &str,
    required: bool,
    notes: &mut Vec<PortabilityNote>,
) -> Result<CodeSet, ConfigError> {
    let Some(value) = value else {
        return if required {
            refuse(path, "is required")
        } else {
            Ok(CodeSet::EMPTY)
        };
    };
    let list = array(value, path)?;
    if list.is_empty() && required {
        return refuse(path, "must not be empty");
    }
    let mut set = CodeSet::EMPTY;
    for (k, code) in list.iter().enumerate() {
        let code_path = format!("{path}[{k}]");
        let parsed = match code {
            Value::String(name) => {
                let parsed = parse_code(name);
                if parsed.is_some_and(|code| code_name(code) != name) {
                    notes.push(PortabilityNote {
                        path: code_path.clone(),
                        message: format!(
                            "\"{name}\" is read as {} here and by gRPC C-core (A6 names are \
                             case-insensitive); grpc-go and grpc-java refuse the whole config",
                            parsed.map(code_name).unwrap_or_default()
                        ),
                    });
                }
                parsed
            }
            Value::Number(n) => n
                .as_u64()
                .filter(|n| *n <= 16)
                .map(|n| crate::ALL_CODES[n as usize]),
            _ => None,
        };
        match parsed {
            Some(tonic::Code::Ok) => return refuse(&code_path, "OK is not a failure"),
            Some(code) => set = set.with(code),
            None => return refuse(&code_path, "is not a gRPC status code"),
        }
    }
    Ok(set)
}

fn parse_retry_policy(
    value: &Value,
    path: &str,
    notes: &mut Vec<PortabilityNote>,
) -> Result<RetryPolicy, ConfigError> {
    let policy = object(value, path)?;
    let field = |name: &str| (policy.get(name), format!("{path}.{name}"));
    let max_attempts = max_attempts(policy, path)?;
    let (initial, initial_path) = field("initialBackoff");
    let initial = positive_duration(
        initial.map_or_else(|| refuse(&initial_path, "is required"), Ok)?,
        &initial_path,
        notes,
    )?;
    let (max, max_path) = field("maxBackoff");
    let max = positive_duration(
        max.map_or_else(|| refuse(&max_path, "is required"), Ok)?,
        &max_path,
        notes,
    )?;
    let (multiplier, multiplier_path) = field("backoffMultiplier");
    let multiplier = multiplier.and_then(Value::as_f64).map_or_else(
        || refuse(&multiplier_path, "is required and must be a number"),
        Ok,
    )?;
    if multiplier <= 0.0 {
        return refuse(&multiplier_path, "must be greater than 0");
    }
    let (codes, codes_path) = field("retryableStatusCodes");
    let codes = status_codes(codes, &codes_path, true, notes)?;
    let (per_attempt, per_attempt_path) = field("perAttemptRecvTimeout");
    let per_attempt = per_attempt
        .map(|d| positive_duration(d, &per_attempt_path, notes))
        .transpose()?;
    let policy = RetryPolicy::new(max_attempts, initial, max, multiplier, codes).map_err(|e| {
        ConfigError {
            path: path.to_owned(),
            message: e.message,
        }
    })?;
    Ok(match per_attempt {
        Some(limit) => policy.with_per_attempt_recv_timeout(limit),
        None => policy,
    })
}

fn parse_hedging_policy(
    value: &Value,
    path: &str,
    notes: &mut Vec<PortabilityNote>,
) -> Result<HedgingPolicy, ConfigError> {
    let policy = object(value, path)?;
    let max_attempts_requested = max_attempts(policy, path)?;
    let hedging_delay = policy
        .get("hedgingDelay")
        .map(|d| duration(d, &format!("{path}.hedgingDelay"), notes))
        .transpose()?;
    let non_fatal_status_codes = status_codes(
        policy.get("nonFatalStatusCodes"),
        &format!("{path}.nonFatalStatusCodes"),
        false,
        notes,
    )?;
    Ok(HedgingPolicy {
        max_attempts_requested,
        hedging_delay,
        non_fatal_status_codes,
    })
}

fn parse_throttling(
    value: &Value,
    path: &str,
    notes: &mut Vec<PortabilityNote>,
) -> Result<RetryThrottling, ConfigError> {
    let throttling = object(value, path)?;
    let max_tokens = throttling
        .get("maxTokens")
        .map_or_else(|| refuse(&format!("{path}.maxTokens"), "is required"), Ok)?;
    let max_tokens = match whole_number(max_tokens) {
        Some(n) if (1..=1000).contains(&n) => n as u32,
        _ => {
            return refuse(
                &format!("{path}.maxTokens"),
                "must be a whole number in (0, 1000]",
            );
        }
    };
    let ratio = throttling
        .get("tokenRatio")
        .and_then(Value::as_f64)
        .map_or_else(
            || {
                refuse(
                    &format!("{path}.tokenRatio"),
                    "is required and must be a number",
                )
            },
            Ok,
        )?;
    let parsed = RetryThrottling::new(max_tokens, ratio).map_err(|e| ConfigError {
        path: format!("$.{}", e.path),
        message: e.message,
    })?;
    if (f64::from(parsed.token_ratio_milli) / 1000.0 - ratio).abs() > 1e-9 {
        notes.push(PortabilityNote {
            path: format!("{path}.tokenRatio"),
            message: format!(
                "{ratio} is used as {} (truncated to 3 decimals, as A6, grpc-java and gRPC C-core \
                 do)",
                f64::from(parsed.token_ratio_milli) / 1000.0
            ),
        });
    }
    Ok(parsed)
}

/// The largest protobuf `Duration`: 10,000 years of seconds.
const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

/// A protobuf JSON duration: a decimal number of seconds with up to 9 fractional digits and an `s`
/// suffix, within `google.protobuf.Duration`'s range. The spellings the reference clients' number
/// parsers accept are accepted too (`+1s`, `.5s`, `1.s`), with a note; negative durations are
/// refused, since no field here can use one.
fn duration(
    value: &Value,
    path: &str,
    notes: &mut Vec<PortabilityNote>,
) -> Result<Duration, ConfigError> {
    let text = string(value, path)?;
    let malformed = || ConfigError {
        path: path.to_owned(),
        message: "must be a duration like \"0.5s\"".to_owned(),
    };
    let Some(number) = text.strip_suffix('s') else {
        return Err(malformed());
    };
    if number.starts_with('-') {
        return refuse(path, "must not be negative");
    }
    let unsigned = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty())
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > 9
    {
        return Err(malformed());
    }
    let trailing_point = unsigned.contains('.') && fraction.is_empty();
    if number.starts_with('+') || whole.is_empty() || trailing_point {
        notes.push(PortabilityNote {
            path: path.to_owned(),
            message: format!(
                "\"{text}\" is not in protobuf's canonical JSON form; it is read here as the \
                 reference clients' number parsers read it, but a strict proto3 JSON parser \
                 refuses it"
            ),
        });
    }
    let seconds: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| malformed())?
    };
    if seconds > MAX_DURATION_SECONDS {
        return refuse(path, "is beyond the range of google.protobuf.Duration");
    }
    let nanos: u32 = format!("{fraction:0<9}").parse().map_err(|_| malformed())?;
    Ok(Duration::new(seconds, nanos))
}

fn positive_duration(
    value: &Value,
    path: &str,
    notes: &mut Vec<PortabilityNote>,
) -> Result<Duration, ConfigError> {
    let parsed = duration(value, path, notes)?;
    if parsed.is_zero() {
        return refuse(path, "must be positive");
    }
    Ok(parsed)
}

fn emit_duration(duration: Duration) -> Value {
    let nanos = duration.subsec_nanos();
    if nanos == 0 {
        return Value::String(format!("{}s", duration.as_secs()));
    }
    let fraction = format!("{nanos:09}");
    Value::String(format!(
        "{}.{}s",
        duration.as_secs(),
        fraction.trim_end_matches('0')
    ))
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

/// Applies the one-owner rule to a service config: `retryPolicy` and `hedgingPolicy` are refused
/// unless the channel owns retries.
#[derive(Debug, Clone, Copy)]
pub struct GrpcServiceConfigPolicy {
    owner: GrpcRetryOwner,
}

impl GrpcServiceConfigPolicy {
    /// The policy for a channel owned by `owner`.
    pub fn new(owner: GrpcRetryOwner) -> Self {
        Self { owner }
    }

    /// Refuses `config` if it carries retries its owner may not have.
    pub fn check(&self, config: &ServiceConfig) -> Result<(), ConfigError> {
        if self.owner.allows_service_config_retry() {
            return Ok(());
        }
        for (i, entry) in config.method_configs.iter().enumerate() {
            let (field, present) = if entry.retry_policy.is_some() {
                ("retryPolicy", true)
            } else {
                ("hedgingPolicy", entry.hedging_policy.is_some())
            };
            if present {
                return refuse(
                    &format!("$.methodConfig[{i}].{field}"),
                    format!(
                        "the retry owner is {}; only the channel owner may retry in the service config",
                        self.owner
                    ),
                );
            }
        }
        Ok(())
    }

    /// Parses and checks in one step.
    pub fn parse(&self, json: &str) -> Result<ServiceConfig, ConfigError> {
        let config = ServiceConfig::parse(json)?;
        self.check(&config)?;
        Ok(config)
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default => f.write_str("(default)"),
            Self::Service(service) => write!(f, "{service}/*"),
            Self::Method(method) => write!(f, "{method}"),
        }
    }
}
