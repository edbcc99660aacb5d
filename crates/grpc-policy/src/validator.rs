//! Compares a service config with the method catalog and the declared retry layers.

use std::fmt;

use crate::service_config::owner_violations;
use crate::{
    GrpcRetryOwner, MAX_ATTEMPTS_CAP, MethodCatalog, MethodClass, MethodConfig, MethodName,
    ServiceConfig,
};

/// How bad a finding is: errors fail a lint run, warnings are reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Worth a look.
    Warning,
    /// Unsafe or wrong; a lint run fails.
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Warning => "warning",
            Self::Error => "error",
        })
    }
}

/// One finding, at a JSON path of the service config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Which check found it: a stable id for suppressions, SARIF rules and dashboards
    /// (`stale-name`, `empty-service`, `invalid-config`, `owner`, `non-idempotent-retry`,
    /// `undeclared-idempotency`, `keyed-retry`, `shadowed`, `max-attempts-capped`,
    /// `amplification`, `portability`).
    pub rule: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// Where, as `$.methodConfig[0].name[1]`.
    pub path: String,
    /// What and why.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.severity, self.path, self.message)
    }
}

/// What the validator knows of the ledger behind keyed mutations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerKnowledge {
    /// Not said.
    Unknown,
    /// The server keeps a durable operation ledger.
    Durable,
    /// The server has no durable ledger.
    None,
}

/// What a server's ledger durability tells the validator: a durable ledger is one; a volatile one
/// (the in-memory double) is none for retries' purposes.
impl From<grpc_core_api::LedgerDurability> for LedgerKnowledge {
    fn from(durability: grpc_core_api::LedgerDurability) -> Self {
        match durability {
            grpc_core_api::LedgerDurability::Durable => LedgerKnowledge::Durable,
            grpc_core_api::LedgerDurability::Volatile => LedgerKnowledge::None,
        }
    }
}

/// Checks that a service config fits the service it configures and the channel's one owner.
#[derive(Debug, Clone)]
pub struct GrpcRetryOwnershipValidator {
    owner: GrpcRetryOwner,
    /// Whether a retry covering a method of undeclared idempotency is an error, not a warning.
    strict: bool,
    /// What is known of the server's ledger, for keyed mutations.
    ledger: LedgerKnowledge,
    /// Retry layers outside the service config (application, mesh), by name and attempts.
    other_layers: Vec<(String, u32)>,
    amplification_bound: u32,
}

impl GrpcRetryOwnershipValidator {
    /// A validator for a channel owned by `owner`, with no other declared layers and an
    /// amplification bound of 10 attempts per call.
    pub fn new(owner: GrpcRetryOwner) -> Self {
        Self {
            owner,
            strict: false,
            ledger: LedgerKnowledge::Unknown,
            other_layers: Vec::new(),
            amplification_bound: 10,
        }
    }

    /// Makes a retry covering a method of undeclared idempotency an error.
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    /// Says what is known of the server's ledger: a retry covering a keyed mutation is expected
    /// with a durable one, an error without, and a warning when unknown.
    pub fn with_ledger(mut self, ledger: LedgerKnowledge) -> Self {
        self.ledger = ledger;
        self
    }

    /// Declares another layer that retries the same calls (`"mesh"`, 3 attempts).
    pub fn with_layer(mut self, name: &str, attempts: u32) -> Self {
        self.other_layers.push((name.to_owned(), attempts));
        self
    }

    /// Sets the largest acceptable number of attempts one call can turn into across layers.
    pub fn with_amplification_bound(mut self, bound: u32) -> Self {
        self.amplification_bound = bound;
        self
    }

    /// Every finding, errors first, each group in config order.
    pub fn validate(&self, config: &ServiceConfig, catalog: &MethodCatalog) -> Vec<Finding> {
        self.validate_with_problems(config, &[], catalog)
    }

    /// Every finding of a config read with [`ServiceConfig::parse_collecting`]: each problem the
    /// reading found (an error: the clients refuse the whole config) and every finding on the
    /// parts that could be read.
    pub fn validate_with_problems(
        &self,
        config: &ServiceConfig,
        problems: &[crate::ConfigError],
        catalog: &MethodCatalog,
    ) -> Vec<Finding> {
        let mut findings = Findings::default();
        findings.reading(config, problems);
        let mut violations = owner_violations(self.owner, config).peekable();
        for (i, entry) in config.method_configs.iter().enumerate() {
            findings.names(config, catalog, i, entry);
            if let Some((_, violation)) = violations.next_if(|(at, _)| *at == i) {
                findings.add("owner", Severity::Error, violation.path, violation.message);
            }
            findings.attempts_cap(i, entry);
        }
        self.unsafe_coverage(&mut findings, config, catalog);
        self.amplification(&mut findings, config);
        let mut findings = findings.0;
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        findings
    }

    /// The methods a retrying entry really governs (directly or through a wider name) that are
    /// not safe to send twice: non-idempotent, of undeclared idempotency, or keyed without a
    /// known durable ledger.
    fn unsafe_coverage(
        &self,
        findings: &mut Findings,
        config: &ServiceConfig,
        catalog: &MethodCatalog,
    ) {
        for info in catalog.methods() {
            let Some((i, entry)) = config.entry_for(&info.method) else {
                continue;
            };
            let Some(field) = entry.retry_field() else {
                continue;
            };
            let path = format!("$.methodConfig[{i}].{field}");
            let method = &info.method;
            let via = entry
                .names
                .iter()
                .filter(|n| n.covers(method))
                .max_by_key(|n| n.specificity())
                .map(|n| match n {
                    MethodName::Method(_) => "directly".to_owned(),
                    other => format!("through {other}"),
                })
                .unwrap_or_default();
            match (info.class, info.declared) {
                (MethodClass::NonIdempotent, true) => findings.add(
                    "non-idempotent-retry",
                    Severity::Error,
                    path,
                    format!("{field} covers non-idempotent {method} ({via}): a sent call may run twice"),
                ),
                (MethodClass::NonIdempotent, false) => findings.add(
                    "undeclared-idempotency",
                    if self.strict {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    path,
                    format!(
                        "{field} covers {method} ({via}), whose idempotency is not declared: a sent call \
                         may run twice unless it is safe to repeat. Declare it in the .proto \
                         (option idempotency_level = IDEMPOTENT or NO_SIDE_EFFECTS), or as a keyed \
                         mutation (--keyed)"
                    ),
                ),
                (MethodClass::KeyedMutation, _) if self.ledger != LedgerKnowledge::Durable => findings.add(
                    "keyed-retry",
                    if self.ledger == LedgerKnowledge::None {
                        Severity::Error
                    } else {
                        Severity::Warning
                    },
                    path,
                    format!(
                        "{field} covers keyed mutation {method} ({via}): safe only if every call carries a key and the server's ledger is durable"
                    ),
                ),
                _ => {}
            }
        }
    }

    /// One call's worst case across every declared layer, against the bound.
    fn amplification(&self, findings: &mut Findings, config: &ServiceConfig) {
        let channel_attempts = config
            .method_configs
            .iter()
            .filter_map(MethodConfig::max_attempts)
            .max()
            .unwrap_or(1);
        let mut layers = vec![("channel".to_owned(), channel_attempts)];
        layers.extend(self.other_layers.iter().cloned());
        let worst: u64 = layers.iter().map(|(_, a)| u64::from((*a).max(1))).product();
        if worst > u64::from(self.amplification_bound) {
            let shown: Vec<String> = layers.iter().map(|(n, a)| format!("{n} {a}")).collect();
            findings.add(
                "amplification",
                Severity::Error,
                "$".to_owned(),
                format!(
                    "one call can become {worst} attempts ({}), above the bound of {}; let one layer own retries",
                    shown.join(" x "),
                    self.amplification_bound
                ),
            );
        }
    }
}

/// The findings of one validation, in the order they are found.
#[derive(Default)]
struct Findings(Vec<Finding>);

impl Findings {
    fn add(&mut self, rule: &'static str, severity: Severity, path: String, message: String) {
        self.0.push(Finding {
            rule,
            severity,
            path,
            message,
        });
    }

    /// What reading the config found: problems the clients refuse it for, and what the
    /// reference clients read differently.
    fn reading(&mut self, config: &ServiceConfig, problems: &[crate::ConfigError]) {
        for problem in problems {
            self.add(
                "invalid-config",
                Severity::Error,
                problem.path.clone(),
                format!(
                    "{} (gRPC's clients refuse the whole config)",
                    problem.message
                ),
            );
        }
        for note in &config.portability {
            self.add(
                "portability",
                Severity::Warning,
                note.path.clone(),
                note.message.clone(),
            );
        }
    }

    /// The names of entry `i` that configure nothing: a name for no method (stale), for a
    /// service that declares none, or one every method of which a more specific entry takes.
    fn names(
        &mut self,
        config: &ServiceConfig,
        catalog: &MethodCatalog,
        i: usize,
        entry: &MethodConfig,
    ) {
        let path = format!("$.methodConfig[{i}]");
        for (j, name) in entry.names.iter().enumerate() {
            let service = match name {
                MethodName::Default => None,
                MethodName::Service(service) => Some(service.as_str()),
                MethodName::Method(method) => Some(method.service()),
            };
            let empty_service = service.is_some_and(|service| {
                catalog.declares_service(service) && !catalog.has_service(service)
            });
            let missing = match name {
                MethodName::Default => false,
                MethodName::Service(service) => !catalog.has_service(service),
                MethodName::Method(method) => catalog.get(method).is_none(),
            };
            if empty_service {
                self.add(
                    "empty-service",
                    Severity::Warning,
                    entry.name_path(&path, j),
                    format!(
                        "{name}: the service declares no methods, so this name configures nothing"
                    ),
                );
            } else if missing {
                self.add(
                    "stale-name",
                    Severity::Error,
                    entry.name_path(&path, j),
                    format!(
                        "{name} matches no method of the service (renamed or removed?); the calls it meant run with defaults"
                    ),
                );
            }
            let governs_any = catalog.methods().any(|m| {
                name.covers(&m.method)
                    && config
                        .entry_for(&m.method)
                        .is_some_and(|(winner, _)| winner == i)
            });
            if !missing && name.specificity() < 2 && !governs_any {
                self.add(
                    "shadowed",
                    Severity::Warning,
                    entry.name_path(&path, j),
                    format!("{name} is shadowed: every method it covers has a more specific entry"),
                );
            }
        }
    }

    /// A `maxAttempts` above A6's cap, which the clients lower without a word.
    fn attempts_cap(&mut self, i: usize, entry: &MethodConfig) {
        let (Some(field), Some(requested)) = (entry.retry_field(), entry.max_attempts_requested())
        else {
            return;
        };
        if requested > MAX_ATTEMPTS_CAP {
            self.add(
                "max-attempts-capped",
                Severity::Warning,
                format!("$.methodConfig[{i}].{field}.maxAttempts"),
                format!("{requested} attempts are capped at {MAX_ATTEMPTS_CAP}"),
            );
        }
    }
}
