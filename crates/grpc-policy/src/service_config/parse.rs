//! Reading a service config. Everything A6 refuses is found, each at its JSON path, and every
//! other part is still read, so that a lint reports every finding; the runtime parser refuses the
//! whole config at the first problem, as gRPC's clients do.

use std::collections::HashSet;
use std::time::Duration;

use grpc_core_api::GrpcMethod;
use serde_json::{Map, Value};

use super::{
    ConfigError, HedgingPolicy, MethodConfig, MethodName, PortabilityNote, RetryPolicy,
    RetryThrottling, ServiceConfig, refuse,
};
use crate::{CodeSet, code_name, parse_code};

impl ServiceConfig {
    /// Parses the standard JSON, refusing the whole config at its first problem (as gRPC's
    /// clients do), with the JSON path of the offending value.
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let (config, problems) = Self::parse_collecting(json)?;
        match problems.into_iter().next() {
            Some(first) => Err(first),
            None => Ok(config),
        }
    }

    /// Reads an already-parsed JSON value, as [`parse`](Self::parse) does.
    pub fn from_json(value: &Value) -> Result<Self, ConfigError> {
        let (config, problems) = Self::from_json_collecting(value)?;
        match problems.into_iter().next() {
            Some(first) => Err(first),
            None => Ok(config),
        }
    }

    /// Parses as far as the text allows: the config with every part that could be read (a refused
    /// name, policy or field is left out, an unreadable entry kept empty so indices stay true),
    /// and every problem at its own path. Fails only when the text is not a JSON object.
    pub fn parse_collecting(json: &str) -> Result<(Self, Vec<ConfigError>), ConfigError> {
        let value: Value =
            serde_json::from_str(json).or_else(|e| refuse("$", format!("not JSON: {e}")))?;
        Self::from_json_collecting(&value)
    }

    /// [`parse_collecting`](Self::parse_collecting) of an already-parsed JSON value.
    pub fn from_json_collecting(value: &Value) -> Result<(Self, Vec<ConfigError>), ConfigError> {
        let root = object(value, "$")?;
        let mut reader = Reader::default();
        let mut config = ServiceConfig::default();
        let mut fields = Fields::new(root, "$", &mut reader.notes);
        let method_configs = fields.take("methodConfig");
        let throttling = fields.take("retryThrottling");
        config.other_fields = fields.rest();
        if let Some((entries, path)) = method_configs
            && let Some(entries) = reader.keep(array(entries, &path))
        {
            for (i, entry) in entries.iter().enumerate() {
                let entry = reader.method_config(entry, &format!("{path}[{i}]"));
                config.method_configs.push(entry);
            }
        }
        if let Some((throttling, path)) = throttling {
            config.retry_throttling = reader.throttling(throttling, &path);
        }
        config.portability = reader.notes;
        Ok((config, reader.problems))
    }
}

/// What reading found besides the config: portability notes and problems.
#[derive(Default)]
struct Reader {
    notes: Vec<PortabilityNote>,
    problems: Vec<ConfigError>,
    /// Names met so far: A6 refuses a name that appears twice.
    seen: HashSet<MethodName>,
}

impl Reader {
    /// The value, or `None` with the problem recorded.
    fn keep<T>(&mut self, result: Result<T, ConfigError>) -> Option<T> {
        result.map_err(|problem| self.problems.push(problem)).ok()
    }

    /// One `methodConfig` entry. An entry that names nothing (no `name`, or an empty list) is kept
    /// but covers no call, as grpc-go and grpc-java skip it; so is an entry that is not an object.
    fn method_config(&mut self, value: &Value, path: &str) -> MethodConfig {
        let empty = MethodConfig {
            names: Vec::new(),
            name_positions: Vec::new(),
            timeout: None,
            wait_for_ready: None,
            max_request_message_bytes: None,
            max_response_message_bytes: None,
            retry_policy: None,
            hedging_policy: None,
            other_fields: Map::new(),
        };
        let Some(entry) = self.keep(object(value, path)) else {
            return empty;
        };
        let mut fields = Fields::new(entry, path, &mut self.notes);
        let name_list = fields.take("name");
        let timeout = fields.take("timeout");
        let wait_for_ready = fields.take("waitForReady");
        let max_request = fields.take("maxRequestMessageBytes");
        let max_response = fields.take("maxResponseMessageBytes");
        let retry = fields.take("retryPolicy");
        let hedging = fields.take("hedgingPolicy");
        let other_fields = fields.rest();
        let (mut names, mut name_positions) = (Vec::new(), Vec::new());
        if let Some((list, list_path)) = name_list
            && let Some(list) = self.keep(array(list, &list_path))
        {
            for (j, name) in list.iter().enumerate() {
                let name_path = format!("{list_path}[{j}]");
                let Some(name) = self.keep(parse_name(name, &name_path)) else {
                    continue;
                };
                if !self.seen.insert(name.clone()) {
                    self.problems.push(ConfigError {
                        path: name_path,
                        message: format!("{name} appears in more than one place"),
                    });
                    continue;
                }
                names.push(name);
                name_positions.push(j);
            }
        }
        if name_positions.iter().enumerate().all(|(i, j)| i == *j) {
            name_positions.clear();
        }
        if names.is_empty() {
            self.notes.push(PortabilityNote {
                path: format!("{path}.name"),
                message: "names no method, so the entry applies to nothing (grpc-go and \
                          grpc-java skip it)"
                    .to_owned(),
            });
        }
        let timeout = timeout.and_then(|(t, p)| {
            let parsed = duration(t, &p, &mut self.notes);
            self.keep(parsed)
        });
        let wait_for_ready = wait_for_ready.and_then(|(v, p)| {
            self.keep(
                v.as_bool()
                    .map_or_else(|| refuse(&p, "must be true or false"), Ok),
            )
        });
        let max_request_message_bytes = max_request.and_then(|(v, p)| self.keep(byte_count(v, &p)));
        let max_response_message_bytes =
            max_response.and_then(|(v, p)| self.keep(byte_count(v, &p)));
        let both = retry.is_some() && hedging.is_some();
        let retry_policy = retry.and_then(|(p, path)| self.retry_policy(p, &path));
        let hedging_policy = hedging.and_then(|(p, path)| self.hedging_policy(p, &path));
        if both {
            self.problems.push(ConfigError {
                path: path.to_owned(),
                message: "retryPolicy and hedgingPolicy cannot both be set on one entry".to_owned(),
            });
        }
        MethodConfig {
            names,
            name_positions,
            timeout,
            wait_for_ready,
            max_request_message_bytes,
            max_response_message_bytes,
            retry_policy,
            hedging_policy,
            other_fields,
        }
    }

    /// A `retryPolicy`: every field is checked, each problem at its own path; the policy is kept
    /// only when it has none.
    fn retry_policy(&mut self, value: &Value, path: &str) -> Option<RetryPolicy> {
        let policy = self.keep(object(value, path))?;
        let before = self.problems.len();
        let required = |name: &str| -> Result<(&Value, String), ConfigError> {
            let field_path = format!("{path}.{name}");
            match policy.get(name) {
                Some(value) => Ok((value, field_path)),
                None => refuse(&field_path, "is required"),
            }
        };
        let max_attempts = self.keep(max_attempts(policy, path));
        let initial = self.keep(required("initialBackoff")).and_then(|(v, p)| {
            let parsed = positive_duration(v, &p, &mut self.notes);
            self.keep(parsed)
        });
        let max = self.keep(required("maxBackoff")).and_then(|(v, p)| {
            let parsed = positive_duration(v, &p, &mut self.notes);
            self.keep(parsed)
        });
        let multiplier = self
            .keep(required("backoffMultiplier"))
            .and_then(|(v, p)| self.keep(multiplier(v, &p)));
        let codes_path = format!("{path}.retryableStatusCodes");
        let codes = status_codes(
            policy.get("retryableStatusCodes"),
            &codes_path,
            true,
            &mut self.notes,
        );
        let codes = self.keep(codes);
        let per_attempt = policy.get("perAttemptRecvTimeout").and_then(|d| {
            let parsed =
                positive_duration(d, &format!("{path}.perAttemptRecvTimeout"), &mut self.notes);
            self.keep(parsed)
        });
        if self.problems.len() > before {
            return None;
        }
        let policy = RetryPolicy::new(max_attempts?, initial?, max?, multiplier?, codes?);
        let policy = self.keep(policy.map_err(|e| ConfigError {
            path: path.to_owned(),
            message: e.message,
        }))?;
        Some(match per_attempt {
            Some(limit) => policy.with_per_attempt_recv_timeout(limit),
            None => policy,
        })
    }

    fn hedging_policy(&mut self, value: &Value, path: &str) -> Option<HedgingPolicy> {
        let policy = self.keep(object(value, path))?;
        let max_attempts_requested = self.keep(max_attempts(policy, path));
        let hedging_delay = policy.get("hedgingDelay").and_then(|d| {
            let parsed = duration(d, &format!("{path}.hedgingDelay"), &mut self.notes);
            self.keep(parsed)
        });
        let codes = status_codes(
            policy.get("nonFatalStatusCodes"),
            &format!("{path}.nonFatalStatusCodes"),
            false,
            &mut self.notes,
        );
        let non_fatal_status_codes = self.keep(codes)?;
        Some(HedgingPolicy {
            max_attempts_requested: max_attempts_requested?,
            hedging_delay,
            non_fatal_status_codes,
        })
    }

    fn throttling(&mut self, value: &Value, path: &str) -> Option<RetryThrottling> {
        let parsed = parse_throttling(value, path, &mut self.notes);
        self.keep(parsed)
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

/// A `backoffMultiplier`: a number greater than 0.
fn multiplier(value: &Value, path: &str) -> Result<f64, ConfigError> {
    match value.as_f64() {
        Some(m) if m > 0.0 && m.is_finite() => Ok(m),
        Some(_) => refuse(path, "must be greater than 0"),
        None => refuse(path, "must be a number"),
    }
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
pub(super) const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

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
