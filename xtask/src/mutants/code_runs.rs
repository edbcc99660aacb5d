//! What `cargo xtask mutants code` mutates and what a run of it found: the groups of mutated
//! files with the tests that judge them, and each mutant's verdict as cargo-mutants'
//! `outcomes.json` reports it.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// Mutated files, with the package whose tests judge them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Group {
    /// `grpc-core-api`: identity, canonical fingerprint, fingerprint, key.
    Core,
    /// `grpc-policy`: eligibility, budget, backoff.
    Policy,
    /// `grpc-tonic`: the server guard (`src/server/guard`).
    Guard,
    /// The in-memory double (`grpc-operation-ledger-memory`), judged by the contract suite on it
    /// and on its broken variants.
    Memory,
    /// The SeaORM adapter's ledger, units and error classification, judged by its own tests and
    /// the contract suite on SQLite and on PostgreSQL.
    Seaorm,
}

impl Group {
    pub(crate) const ALL: [Group; 5] = [
        Group::Core,
        Group::Policy,
        Group::Guard,
        Group::Memory,
        Group::Seaorm,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Group::Core => "core",
            Group::Policy => "policy",
            Group::Guard => "guard",
            Group::Memory => "memory",
            Group::Seaorm => "seaorm",
        }
    }

    /// The package whose tests judge the group's mutants.
    pub(crate) fn package(self) -> &'static str {
        match self {
            Group::Core => "grpc-core-api",
            Group::Policy => "grpc-policy",
            Group::Guard => "grpc-tonic",
            Group::Memory => "grpc-operation-ledger-memory",
            Group::Seaorm => "grpc-operation-ledger-seaorm",
        }
    }

    /// The tests of [`Group::package`] that judge it (all when empty): an adapter is judged by
    /// the contract suite, not by the slower end-to-end tests around it.
    pub(crate) fn tests(self) -> &'static [&'static str] {
        match self {
            Group::Core | Group::Policy | Group::Guard => &[],
            // The honest double must pass every case, and each broken variant (its defects live
            // in the same files) must still be caught by its case.
            Group::Memory => &["--test", "contract", "--test", "broken_doubles"],
            Group::Seaorm => &[
                "--lib",
                "--test",
                "contract_sqlite",
                "--test",
                "contract_postgres",
            ],
        }
    }

    /// Whether its tests need the development PostgreSQL.
    pub(crate) fn on_postgres(self) -> bool {
        self == Group::Seaorm
    }

    /// The mutated files, relative to the workspace: listed, or every `.rs` of a directory.
    pub(crate) fn files(self, root: &Path) -> Result<Vec<String>> {
        let listed: &[&str] = match self {
            Group::Core => &[
                "crates/grpc-core-api/src/identity.rs",
                "crates/grpc-core-api/src/canonical.rs",
                "crates/grpc-core-api/src/fingerprint.rs",
                "crates/grpc-core-api/src/key.rs",
            ],
            Group::Policy => &[
                "crates/grpc-policy/src/eligibility.rs",
                "crates/grpc-policy/src/budget.rs",
                "crates/grpc-policy/src/backoff.rs",
            ],
            Group::Memory => &[
                "crates/grpc-operation-ledger-memory/src/ledger.rs",
                "crates/grpc-operation-ledger-memory/src/store.rs",
                "crates/grpc-operation-ledger-memory/src/units.rs",
            ],
            Group::Seaorm => &[
                "crates/grpc-operation-ledger-seaorm/src/ledger/mod.rs",
                "crates/grpc-operation-ledger-seaorm/src/ledger/port.rs",
                "crates/grpc-operation-ledger-seaorm/src/ledger/rows.rs",
                "crates/grpc-operation-ledger-seaorm/src/units.rs",
                "crates/grpc-operation-ledger-seaorm/src/error.rs",
            ],
            Group::Guard => {
                let dir = "crates/grpc-tonic/src/server/guard";
                let mut files: Vec<String> = std::fs::read_dir(root.join(dir))
                    .with_context(|| format!("listing {dir}"))?
                    .filter_map(|entry| entry.ok())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .filter(|name| name.ends_with(".rs"))
                    .map(|name| format!("{dir}/{name}"))
                    .collect();
                files.sort();
                return Ok(files);
            }
        };
        Ok(listed.iter().map(|file| (*file).to_owned()).collect())
    }
}

/// How one mutant ended, as the report counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A test failed.
    Killed,
    /// The tests ran past cargo-mutants' bound (a mutant that makes a loop endless): detected.
    TimedOut,
    /// It does not compile: not viable, not counted.
    Unviable,
    /// Every test passed, and the equivalence file says why that is right.
    Explained(String),
    /// Every test passed, and nothing says why.
    Survived,
}

/// One mutant: its file, its line and what cargo-mutants changed.
#[derive(Debug, Clone)]
pub(crate) struct Mutant {
    pub(crate) file: String,
    pub(crate) line: u64,
    pub(crate) change: String,
    pub(crate) verdict: Verdict,
}

impl Mutant {
    /// How the equivalence file names it: its file and change, without the line, so an
    /// explanation outlives an edit above it.
    pub(crate) fn key(&self) -> String {
        format!("{}: {}", self.file, self.change)
    }
}

/// One group's run.
#[derive(Debug, Clone)]
pub(crate) struct GroupRun {
    pub(crate) group: Group,
    pub(crate) mutants: Vec<Mutant>,
    /// Each mutated file and the SHA-256 of its source as mutated.
    pub(crate) sources: Vec<(String, String)>,
    pub(crate) seconds: f64,
}

/// The mutants of cargo-mutants' `outcomes.json`, in its order.
pub(crate) fn parse_outcomes(text: &str) -> Result<Vec<Mutant>> {
    let value: serde_json::Value = serde_json::from_str(text).context("outcomes.json")?;
    let outcomes = value["outcomes"]
        .as_array()
        .context("outcomes.json has no outcomes")?;
    let mut mutants = Vec::new();
    for outcome in outcomes {
        let Some(mutant) = outcome["scenario"].get("Mutant") else {
            continue; // the baseline
        };
        let file = mutant["file"]
            .as_str()
            .context("a mutant's file")?
            .to_owned();
        let line = mutant["span"]["start"]["line"].as_u64().unwrap_or(0);
        let name = mutant["name"].as_str().context("a mutant's name")?;
        // The name is `file:line:column: change`.
        let change = name
            .strip_prefix(file.as_str())
            .and_then(|rest| rest.splitn(4, ':').nth(3))
            .map(|change| change.trim().to_owned())
            .with_context(|| format!("a mutant name not of the form file:line:col: {name}"))?;
        let verdict = match outcome["summary"].as_str() {
            Some("CaughtMutant") => Verdict::Killed,
            Some("MissedMutant") => Verdict::Survived,
            Some("Unviable") => Verdict::Unviable,
            Some("Timeout") => Verdict::TimedOut,
            other => bail!("an outcome cargo-mutants did not document: {other:?}"),
        };
        mutants.push(Mutant {
            file,
            line,
            change,
            verdict,
        });
    }
    Ok(mutants)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_read_with_their_change_apart_from_the_place() {
        let text = r#"{"outcomes":[
            {"scenario":"Baseline","summary":"Success"},
            {"scenario":{"Mutant":{"name":"crates/a/src/b.rs:12:9: replace f -> bool with true",
              "file":"crates/a/src/b.rs","span":{"start":{"line":12,"column":9}}}},
             "summary":"MissedMutant"},
            {"scenario":{"Mutant":{"name":"crates/a/src/b.rs:3:1: delete ! in g",
              "file":"crates/a/src/b.rs","span":{"start":{"line":3,"column":1}}}},
             "summary":"Timeout"}]}"#;
        let mutants = parse_outcomes(text).unwrap();
        assert_eq!(mutants.len(), 2);
        assert_eq!(
            mutants[0].key(),
            "crates/a/src/b.rs: replace f -> bool with true"
        );
        assert_eq!(mutants[0].line, 12);
        assert_eq!(mutants[0].verdict, Verdict::Survived);
        assert_eq!(mutants[1].verdict, Verdict::TimedOut);
        assert!(parse_outcomes(r#"{"outcomes":[{"scenario":{"Mutant":{"name":"x","file":"y","span":{}}},"summary":"CaughtMutant"}]}"#).is_err());
    }
}
