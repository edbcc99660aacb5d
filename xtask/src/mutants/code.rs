//! `cargo xtask mutants code`: the tests' strength against the decision code, as a figure.
//! cargo-mutants (crates.io) mutates the guard, the policy's eligibility, budget and backoff, and
//! the core types' identity, canonical fingerprint and key handling one change at a time, and runs
//! each crate's own tests against every mutant. The report goes to `docs/mutants/code.md`, with a
//! digest of every mutated file so that CI can tell a stale report (the test at the end of this
//! file); survivors are killed by a new test or explained in `docs/mutants/code-equivalent.md`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::cmd;

/// The share of viable mutants each group's tests must kill; the rest must be explained.
const GOAL: f64 = 0.90;

/// The cargo-mutants release the report was made with, installed when missing.
const CARGO_MUTANTS: &str = "27.1.0";

/// Mutated files, with the package whose tests judge them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Group {
    /// `grpc-core-api`: identity, canonical fingerprint, fingerprint, key.
    Core,
    /// `grpc-policy`: eligibility, budget, backoff.
    Policy,
    /// `grpc-tonic`: the server guard (`src/server/guard`).
    Guard,
    /// The in-memory double (`grpc-operation-ledger-memory`), judged by the contract suite.
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
    fn tests(self) -> &'static [&'static str] {
        match self {
            Group::Core | Group::Policy | Group::Guard => &[],
            Group::Memory => &["--test", "contract"],
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
    fn on_postgres(self) -> bool {
        self == Group::Seaorm
    }

    /// The mutated files, relative to the workspace: listed, or every `.rs` of a directory.
    fn files(self, root: &Path) -> Result<Vec<String>> {
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

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The SHA-256 of `file` (relative to the workspace), in hex.
fn digest_of(file: &str) -> Result<String> {
    let bytes = std::fs::read(root().join(file)).with_context(|| format!("reading {file}"))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// Runs cargo-mutants on `groups` (all when empty), merges the results with earlier runs of the
/// other groups, and writes the report; fails when a group misses the goal or a survivor is not
/// explained.
pub(crate) fn run(groups: &[Group], interrupted: &AtomicBool) -> Result<()> {
    let groups = if groups.is_empty() {
        Group::ALL.to_vec()
    } else {
        groups.to_vec()
    };
    ensure_cargo_mutants(interrupted)?;
    let target = cmd::target_dir()?;
    let work = target.join("mutants").join("code");
    for group in groups {
        let out = work.join(group.name());
        std::fs::create_dir_all(&out)?;
        let files = group.files(&root())?;
        let sources = files
            .iter()
            .map(|file| Ok(format!("{file}\t{}", digest_of(file)?)))
            .collect::<Result<Vec<_>>>()?;
        let started = Instant::now();
        // Every feature, as `cargo xtask test` builds: the guard's metrics are behind one.
        let mut args: Vec<String> = ["mutants", "--no-shuffle", "--jobs", "1", "--all-features"]
            .map(str::to_owned)
            .to_vec();
        for file in &files {
            args.extend(["--file".to_owned(), file.clone()]);
        }
        args.extend(["--output".to_owned(), out.display().to_string()]);
        if !group.tests().is_empty() {
            args.push("--".to_owned());
            args.extend(group.tests().iter().map(|arg| (*arg).to_owned()));
        }
        let database = group
            .on_postgres()
            .then(crate::postgres::for_tests)
            .transpose()?;
        eprintln!(
            "xtask: cargo-mutants on {} ({} files, the tests of {})",
            group.name(),
            files.len(),
            group.package()
        );
        // Missed mutants make cargo-mutants exit 2 and timeouts 3: the verdict is the report's.
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let target = target.display().to_string();
        let mut env = vec![("CARGO_TARGET_DIR", target.as_str())];
        if let Some(database) = &database {
            env.push(("DATABASE_URL", database.url()));
        }
        let mut command = cmd::cargo_command(&args, &env);
        command.current_dir(root());
        let status = cmd::run(&mut command, interrupted);
        if let Err(error) = status
            && !out.join("mutants.out").join("outcomes.json").exists()
        {
            return Err(error).context("cargo-mutants wrote no outcomes");
        }
        std::fs::write(
            out.join("run.tsv"),
            format!(
                "seconds\t{:.0}\n{}\n",
                started.elapsed().as_secs_f64(),
                sources.join("\n")
            ),
        )?;
    }
    report_again()
}

/// Installs cargo-mutants when `cargo mutants` is not there, saying so.
fn ensure_cargo_mutants(interrupted: &AtomicBool) -> Result<()> {
    if cmd::output(&mut cmd::cargo_command(&["mutants", "--version"], &[])).is_ok() {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-mutants {CARGO_MUTANTS} from crates.io (cargo install)");
    cmd::cargo(
        &[
            "install",
            "cargo-mutants",
            "--locked",
            "--version",
            CARGO_MUTANTS,
        ],
        &[],
        interrupted,
    )
}

/// Renders the report from the last run of each group (`target/mutants/code/`) with the
/// equivalence file as it is now.
pub(crate) fn report_again() -> Result<()> {
    let work = cmd::target_dir()?.join("mutants").join("code");
    let equivalents = super::code_report::Equivalents::read(&equivalents_path())?;
    let mut runs = Vec::new();
    for group in Group::ALL {
        let dir = work.join(group.name());
        let outcomes = dir.join("mutants.out").join("outcomes.json");
        let Ok(text) = std::fs::read_to_string(&outcomes) else {
            continue;
        };
        let meta = std::fs::read_to_string(dir.join("run.tsv"))
            .with_context(|| format!("reading {}", dir.join("run.tsv").display()))?;
        let (seconds, sources) = parse_run(&meta)?;
        let mut mutants = parse_outcomes(&text)?;
        for mutant in &mut mutants {
            if mutant.verdict == Verdict::Survived
                && let Some(why) = equivalents.why(&mutant.key())
            {
                mutant.verdict = Verdict::Explained(why.to_owned());
            }
        }
        runs.push(GroupRun {
            group,
            mutants,
            sources,
            seconds,
        });
    }
    if runs.is_empty() {
        bail!(
            "no results under {} (run the mutants first)",
            work.display()
        );
    }
    // The committed report is rewritten only when no group it holds would be lost (a machine
    // whose target directory lacks an earlier group's run writes beside it instead).
    let committed = std::fs::read_to_string(report_path()).unwrap_or_default();
    let complete = Group::ALL
        .iter()
        .filter(|group| reported(&committed, **group))
        .all(|group| runs.iter().any(|run| run.group == *group));
    let text = super::code_report::render(&runs, GOAL);
    let path = if complete {
        report_path()
    } else {
        work.join("code.md")
    };
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", super::code_report::summary(&runs));
    println!("xtask: the report is at {}", path.display());
    let mut failures = Vec::new();
    for run in &runs {
        let (killed, viable) = super::code_report::killed_of_viable(run);
        if viable > 0 && (killed as f64) < GOAL * viable as f64 {
            failures.push(format!(
                "{}: {killed} of {viable} viable mutants killed, under {:.0}%",
                run.group.name(),
                GOAL * 100.0
            ));
        }
        for mutant in run
            .mutants
            .iter()
            .filter(|m| m.verdict == Verdict::Survived)
        {
            failures.push(format!(
                "unexplained: {}:{} {}",
                mutant.file, mutant.line, mutant.change
            ));
        }
    }
    if !failures.is_empty() {
        bail!(
            "the code mutants miss their goal (explain a survivor in {}):\n{}",
            equivalents_path().display(),
            failures.join("\n")
        );
    }
    Ok(())
}

/// Whether `report` holds a run of `group`.
fn reported(report: &str, group: Group) -> bool {
    !not_run_in(report).contains(&group.name()) && report.contains(&format!("| {group:?} ("))
}

/// The groups `report` says were not run yet.
fn not_run_in(report: &str) -> Vec<&str> {
    report
        .lines()
        .find_map(|line| line.strip_prefix(super::code_report::NOT_RUN))
        .map(|names| names.trim_end_matches('.').split(", ").collect())
        .unwrap_or_default()
}

fn docs() -> PathBuf {
    root().join("docs").join("mutants")
}

pub(crate) fn report_path() -> PathBuf {
    docs().join("code.md")
}

pub(crate) fn equivalents_path() -> PathBuf {
    docs().join("code-equivalent.md")
}

/// `run.tsv`: the run's seconds, then a file and its digest per line.
#[allow(clippy::type_complexity)]
fn parse_run(text: &str) -> Result<(f64, Vec<(String, String)>)> {
    let mut seconds = 0.0;
    let mut sources = Vec::new();
    for line in text.lines() {
        match line.split_once('\t') {
            Some(("seconds", value)) => seconds = value.parse().context("the run's seconds")?,
            Some((file, digest)) => sources.push((file.to_owned(), digest.to_owned())),
            None => {}
        }
    }
    Ok((seconds, sources))
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

    /// The committed report is about the sources as they are: a mutated file changed since (or a
    /// new file in the guard) without a fresh run of `cargo xtask mutants code` fails here. A
    /// group the report says was not run yet is said so in it, and is not checked.
    #[test]
    fn the_code_mutation_report_is_about_the_sources_as_they_are() {
        let report = std::fs::read_to_string(report_path())
            .expect("docs/mutants/code.md (run `cargo xtask mutants code`)");
        let not_run = not_run_in(&report);
        for group in Group::ALL {
            if not_run.contains(&group.name()) {
                continue;
            }
            for file in group.files(&root()).unwrap() {
                let row = format!("| `{file}` | `{}` |", digest_of(&file).unwrap());
                assert!(
                    report.contains(&row),
                    "docs/mutants/code.md is not about {file} as it is now (no row {row}): run \
                     `cargo xtask mutants code --group {}` and review its survivors",
                    group.name()
                );
            }
        }
    }

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
