//! The output formats: text for people and editors, JSON for scripts, SARIF 2.1.0 for code
//! scanning, GitHub Actions annotations for pull requests.

use std::collections::BTreeSet;

use grpc_policy::Severity;
use serde_json::{Value, json};

use crate::{Checked, Format};

pub(crate) fn print(checked: &[Checked], format: Format) {
    let text = match format {
        Format::Text => text(checked),
        Format::Json => format!("{:#}\n", json_report(checked)),
        Format::Sarif => format!("{:#}\n", sarif(checked)),
        Format::Github => github(checked),
    };
    print!("{text}");
}

fn counts(checked: &Checked) -> (usize, usize) {
    let errors = checked
        .findings
        .iter()
        .filter(|f| f.finding.severity == Severity::Error)
        .count();
    (errors, checked.findings.len() - errors)
}

fn totals(checked: &[Checked]) -> (usize, usize) {
    checked
        .iter()
        .map(counts)
        .fold((0, 0), |(e, w), (de, dw)| (e + de, w + dw))
}

/// `file:line:column: severity[rule]: message (at $.path)` per finding, then one summary line per
/// config with findings and a total.
pub(crate) fn text(checked: &[Checked]) -> String {
    let mut out = String::new();
    for config in checked {
        for located in &config.findings {
            let f = &located.finding;
            out.push_str(&format!(
                "{}:{}:{}: {}[{}]: {} (at {})\n",
                config.file.display(),
                located.line,
                located.column,
                f.severity,
                f.rule,
                f.message,
                f.path
            ));
        }
    }
    let with_findings: Vec<&Checked> = checked.iter().filter(|c| !c.findings.is_empty()).collect();
    if checked.len() > 1 {
        for config in &with_findings {
            let (errors, warnings) = counts(config);
            out.push_str(&format!(
                "{}: {errors} error(s), {warnings} warning(s)\n",
                config.file.display()
            ));
        }
    }
    let (errors, warnings) = totals(checked);
    out.push_str(&format!(
        "{} config(s) checked, {} with findings: {errors} error(s), {warnings} warning(s)\n",
        checked.len(),
        with_findings.len()
    ));
    out
}

pub(crate) fn json_report(checked: &[Checked]) -> Value {
    let (errors, warnings) = totals(checked);
    json!({
        "configs": checked.iter().map(|config| json!({
            "file": config.file.display().to_string(),
            "findings": config.findings.iter().map(|located| json!({
                "rule": located.finding.rule,
                "severity": located.finding.severity.to_string(),
                "path": located.finding.path,
                "line": located.line,
                "column": located.column,
                "message": located.finding.message,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "errors": errors,
        "warnings": warnings,
    })
}

/// What each rule checks, for SARIF's rule descriptions.
const RULES: &[(&str, &str)] = &[
    (
        "invalid-config",
        "A value gRPC's clients refuse, so they refuse the whole config.",
    ),
    (
        "stale-name",
        "A name that matches no method of the service: the calls it meant run with defaults.",
    ),
    (
        "empty-service",
        "A name of a service that declares no methods.",
    ),
    (
        "owner",
        "A retry or hedging policy on a channel whose retries are owned elsewhere.",
    ),
    (
        "non-idempotent-retry",
        "A retry covering a method declared non-idempotent.",
    ),
    (
        "undeclared-idempotency",
        "A retry covering a method whose idempotency is not declared.",
    ),
    (
        "keyed-retry",
        "A retry covering a keyed mutation without a known durable ledger.",
    ),
    (
        "shadowed",
        "A name every method of which has a more specific entry.",
    ),
    (
        "max-attempts-capped",
        "maxAttempts above 5, which the clients cap at 5.",
    ),
    (
        "amplification",
        "Retry layers that multiply one call into too many attempts.",
    ),
    (
        "portability",
        "A spelling the reference clients read differently or refuse.",
    ),
];

pub(crate) fn sarif(checked: &[Checked]) -> Value {
    let used: BTreeSet<&str> = checked
        .iter()
        .flat_map(|c| &c.findings)
        .map(|f| f.finding.rule)
        .collect();
    let rules: Vec<Value> = RULES
        .iter()
        .filter(|(id, _)| used.contains(id))
        .map(|(id, description)| json!({"id": id, "shortDescription": {"text": description}}))
        .collect();
    let results: Vec<Value> = checked
        .iter()
        .flat_map(|config| {
            config.findings.iter().map(move |located| {
                json!({
                    "ruleId": located.finding.rule,
                    "level": match located.finding.severity {
                        Severity::Error => "error",
                        Severity::Warning => "warning",
                    },
                    "message": {"text": format!("{} (at {})", located.finding.message, located.finding.path)},
                    "locations": [{
                        "physicalLocation": {
                            "artifactLocation": {"uri": uri(&config.file)},
                            "region": {"startLine": located.line, "startColumn": located.column},
                        },
                    }],
                })
            })
        })
        .collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "grpc-retry-lint",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules,
            }},
            "results": results,
        }],
    })
}

/// A relative path as a URI reference (forward slashes, spaces and percent signs escaped).
fn uri(path: &std::path::Path) -> String {
    path.display()
        .to_string()
        .replace('\\', "/")
        .replace('%', "%25")
        .replace(' ', "%20")
}

/// GitHub Actions workflow commands: one annotation per finding, then the text summary.
pub(crate) fn github(checked: &[Checked]) -> String {
    let escape = |s: &str| {
        s.replace('%', "%25")
            .replace('\r', "%0D")
            .replace('\n', "%0A")
    };
    let property = |s: &str| escape(s).replace(':', "%3A").replace(',', "%2C");
    let mut out = String::new();
    for config in checked {
        for located in &config.findings {
            let f = &located.finding;
            out.push_str(&format!(
                "::{} file={},line={},col={},title={}::{}\n",
                match f.severity {
                    Severity::Error => "error",
                    Severity::Warning => "warning",
                },
                property(&config.file.display().to_string()),
                located.line,
                located.column,
                property(&format!("grpc-retry-lint {}", f.rule)),
                escape(&format!("{} (at {})", f.message, f.path)),
            ));
        }
    }
    let (errors, warnings) = totals(checked);
    out.push_str(&format!(
        "{} config(s) checked: {errors} error(s), {warnings} warning(s)\n",
        checked.len()
    ));
    out
}
