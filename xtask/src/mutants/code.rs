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

use super::code_runs::{Group, GroupRun, Verdict, parse_outcomes};
use crate::cmd;

/// The share of viable mutants each group's tests must kill; the rest must be explained.
const GOAL: f64 = 0.90;

/// The cargo-mutants release the report was made with, installed when missing.
const CARGO_MUTANTS: &str = "27.1.0";

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
    cmd::cargo_tool("mutants", CARGO_MUTANTS, &[], interrupted)?;
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
}
