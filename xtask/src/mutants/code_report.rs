//! The code mutants' report (`docs/mutants/code.md`) and the reviewed list of survivors that are
//! equivalent (`docs/mutants/code-equivalent.md`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::code_runs::{Group, GroupRun, Verdict};

/// How the report names the groups it has no run of (read back by the freshness test).
pub(crate) const NOT_RUN: &str = "Not run yet: ";

/// The reviewed explanations: rows `` | `file: change` | why | `` of the equivalence file.
pub(crate) struct Equivalents(Vec<(String, String)>);

impl Equivalents {
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
        };
        let rows = text
            .lines()
            .filter(|line| line.starts_with("| `"))
            .filter_map(|line| {
                let (mutant, why) = line.trim_matches('|').split_once(" | ")?;
                Some((
                    mutant.trim().trim_matches('`').to_owned(),
                    why.trim().to_owned(),
                ))
            })
            .collect();
        Ok(Self(rows))
    }

    /// Why the mutant named `key` survives, if the file says.
    pub(crate) fn why(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(mutant, _)| mutant == key)
            .map(|(_, why)| why.as_str())
    }
}

/// Killed (a test failed, or the tests hung past the bound) and viable mutants of one run.
pub(crate) fn killed_of_viable(run: &GroupRun) -> (usize, usize) {
    let count =
        |wanted: fn(&Verdict) -> bool| run.mutants.iter().filter(|m| wanted(&m.verdict)).count();
    let killed = count(|v| matches!(v, Verdict::Killed | Verdict::TimedOut));
    let viable = count(|v| !matches!(v, Verdict::Unviable));
    (killed, viable)
}

struct Counts {
    mutants: usize,
    unviable: usize,
    killed: usize,
    timed_out: usize,
    explained: usize,
    survived: usize,
}

fn counts<'a>(verdicts: impl Iterator<Item = &'a Verdict>) -> Counts {
    let mut counts = Counts {
        mutants: 0,
        unviable: 0,
        killed: 0,
        timed_out: 0,
        explained: 0,
        survived: 0,
    };
    for verdict in verdicts {
        counts.mutants += 1;
        match verdict {
            Verdict::Killed => counts.killed += 1,
            Verdict::TimedOut => counts.timed_out += 1,
            Verdict::Unviable => counts.unviable += 1,
            Verdict::Explained(_) => counts.explained += 1,
            Verdict::Survived => counts.survived += 1,
        }
    }
    counts
}

fn ratio(counts: &Counts) -> String {
    let viable = counts.mutants - counts.unviable;
    if viable == 0 {
        return "-".to_owned();
    }
    format!(
        "{:.1}%",
        100.0 * (counts.killed + counts.timed_out) as f64 / viable as f64
    )
}

fn row(out: &mut String, name: &str, counts: &Counts, tail: &str) {
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} | {} | {} |{tail}",
        counts.mutants,
        counts.unviable,
        counts.killed,
        counts.timed_out,
        counts.explained,
        counts.survived,
        ratio(counts),
    );
}

/// One line per group, for the terminal.
pub(crate) fn summary(runs: &[GroupRun]) -> String {
    runs.iter()
        .map(|run| {
            let c = counts(run.mutants.iter().map(|m| &m.verdict));
            format!(
                "{:?}: {} mutants, {} unviable, {} killed, {} timed out, {} explained, {} \
                 unexplained; {} of the viable killed",
                run.group,
                c.mutants,
                c.unviable,
                c.killed,
                c.timed_out,
                c.explained,
                c.survived,
                ratio(&c)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The report in Markdown.
pub(crate) fn render(runs: &[GroupRun], goal: f64) -> String {
    let mut out = format!(
        "# Code mutants of the decision code and the adapters\n\n\
         Written by `cargo xtask mutants code` (do not edit by hand): cargo-mutants mutates the \
         server guard (`grpc-tonic`), the retry policy's eligibility, budget and backoff \
         (`grpc-policy`), the core types' identity, canonical fingerprint and key handling \
         (`grpc-core-api`), and the adapters' own code (the in-memory double; the SeaORM \
         adapter's ledger, units and error classification) one change at a time (a function's \
         body replaced by a plausible value, an operator swapped, a condition negated, a match arm \
         deleted) and runs the tests of the mutated crate against each (an adapter: the contract \
         suite on its stores). A mutant is *killed* when a test fails, *timed out* when the \
         tests hang past cargo-mutants' bound (counted as killed), *unviable* when it does not \
         compile (not counted). The goal: at least {:.0}% of the viable mutants of each group \
         killed, and every survivor explained in `code-equivalent.md` (reviewed like code) or a \
         hole to close. The SQL the adapters send has a report of its own (`sql.md`).\n\n\
         ## Summary\n\n\
         | group | mutants | unviable | killed | timed out | explained | unexplained | killed of viable |\n\
         |---|---|---|---|---|---|---|---|\n",
        goal * 100.0
    );
    for run in runs {
        let c = counts(run.mutants.iter().map(|m| &m.verdict));
        let name = format!("{:?} (`{}` tests)", run.group, run.group.package());
        row(&mut out, &name, &c, "");
    }
    let not_run: Vec<&str> = Group::ALL
        .iter()
        .filter(|group| !runs.iter().any(|run| run.group == **group))
        .map(|group| group.name())
        .collect();
    if !not_run.is_empty() {
        let _ = writeln!(out, "\n{NOT_RUN}{}.", not_run.join(", "));
    }
    out.push_str("\n## By file\n\n| file | mutants | unviable | killed | timed out | explained | unexplained | killed of viable |\n|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        for (file, _) in &run.sources {
            let c = counts(
                run.mutants
                    .iter()
                    .filter(|m| &m.file == file)
                    .map(|m| &m.verdict),
            );
            row(&mut out, &format!("`{file}`"), &c, "");
        }
    }
    out.push_str("\n## Survivors\n\n| mutant | line | why it survives |\n|---|---|---|\n");
    for run in runs {
        for mutant in &run.mutants {
            let why = match &mutant.verdict {
                Verdict::Explained(why) => why.clone(),
                Verdict::Survived => "**unexplained**".to_owned(),
                _ => continue,
            };
            let _ = writeln!(out, "| `{}` | {} | {why} |", mutant.key(), mutant.line);
        }
    }
    out.push_str(
        "\n## Sources\n\n`cargo xtask`'s test `the_code_mutation_report_is_about_the_sources_as_they_are` \
         fails when a mutated file no longer has the digest recorded here: change one, run \
         `cargo xtask mutants code --group <its group>` again.\n\n\
         | file | sha256 |\n|---|---|\n",
    );
    for run in runs {
        for (file, digest) in &run.sources {
            let _ = writeln!(out, "| `{file}` | `{digest}` |");
        }
    }
    out.push_str("\n## Runs\n\n| group | wall time |\n|---|---|\n");
    for run in runs {
        let _ = writeln!(out, "| {:?} | {:.0} s |", run.group, run.seconds);
    }
    out
}
