//! The SQL mutants' report (`docs/mutants/sql.md`) and the reviewed list of survivors that are
//! equivalent (`docs/mutants/sql-equivalent.md`).

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{SqlStore, StoreRuns};

/// How one mutant ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A case failed: the suite sees the mutant.
    Killed {
        /// The first case that failed.
        case: String,
        /// The first lines of its failure.
        why: String,
    },
    /// Every case passed, and the equivalence file says why that is right.
    Equivalent(String),
    /// Every case passed, and nothing says why.
    Survived,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Killed { case, .. } => write!(f, "killed by `{case}`"),
            Outcome::Equivalent(_) => f.write_str("survived: equivalent"),
            Outcome::Survived => f.write_str("SURVIVED"),
        }
    }
}

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("docs")
        .join("mutants")
}

/// Where the full run's report goes.
pub(crate) fn report_path() -> PathBuf {
    docs().join("sql.md")
}

/// The reviewed list of equivalent survivors.
pub(crate) fn equivalents_path() -> PathBuf {
    docs().join("sql-equivalent.md")
}

/// The reviewed explanations: rows `| store | statement | mutant | why |` of the equivalence
/// file's table, the store `*` for every store.
pub(crate) struct Equivalents(Vec<[String; 4]>);

impl Equivalents {
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
        };
        let rows = text
            .lines()
            .filter(|line| line.starts_with("| ") && !line.starts_with("| store"))
            .filter_map(|line| {
                let cells: Vec<String> = line
                    .trim_matches('|')
                    .split(" | ")
                    .map(|cell| cell.trim().trim_matches('`').to_owned())
                    .collect();
                <[String; 4]>::try_from(cells).ok()
            })
            .collect();
        Ok(Self(rows))
    }

    /// Why `label` of `statement` survives on `store`, if the file says.
    pub(crate) fn why(&self, store: SqlStore, statement: &str, label: &str) -> Option<&str> {
        let store = store.report_name();
        self.0
            .iter()
            .find(|[s, st, l, _]| (s == "*" || *s == store) && st == statement && l == label)
            .map(|row| row[3].as_str())
    }
}

/// The counts of one store's runs: killed, equivalent, unexplained.
fn counts(runs: &StoreRuns) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for run in &runs.runs {
        match run.outcome {
            Outcome::Killed { .. } => counts.0 += 1,
            Outcome::Equivalent(_) => counts.1 += 1,
            Outcome::Survived => counts.2 += 1,
        }
    }
    counts
}

/// One line per store.
pub(crate) fn summary(all: &[StoreRuns]) -> String {
    all.iter()
        .map(|runs| {
            let (killed, equivalent, survived) = counts(runs);
            format!(
                "{:?}: {} mutants, {killed} killed, {equivalent} equivalent, {survived} survived \
                 unexplained ({:.0} s)",
                runs.store,
                runs.runs.len(),
                runs.seconds
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A template's digest, as the report records it (the adapter's test recomputes it).
fn digest(template: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(template.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The runs as JSON, for [`from_json`] (`cargo xtask mutants sql --report-only`).
pub(crate) fn to_json(all: &[StoreRuns]) -> String {
    let stores: Vec<serde_json::Value> = all
        .iter()
        .map(|runs| {
            let runs_json: Vec<serde_json::Value> = runs
                .runs
                .iter()
                .map(|run| {
                    let (kind, case, why) = match &run.outcome {
                        Outcome::Killed { case, why } => ("killed", case.as_str(), why.as_str()),
                        Outcome::Equivalent(_) | Outcome::Survived => ("survived", "", ""),
                    };
                    serde_json::json!({
                        "statement": run.statement, "label": run.label,
                        "outcome": kind, "case": case, "why": why,
                    })
                })
                .collect();
            serde_json::json!({
                "store": format!("{:?}", runs.store),
                "statements": runs.statements,
                "runs": runs_json,
                "seconds": runs.seconds,
            })
        })
        .collect();
    serde_json::Value::Array(stores).to_string()
}

/// The runs [`to_json`] wrote (every survivor as unexplained, until the equivalence file is read).
pub(crate) fn from_json(text: &str) -> Result<Vec<StoreRuns>> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    let text_of = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    value
        .as_array()
        .context("a list of stores")?
        .iter()
        .map(|store| {
            let name = text_of(&store["store"]);
            let store_kind = SqlStore::ALL
                .into_iter()
                .find(|s| format!("{s:?}") == name)
                .with_context(|| format!("an unknown store {name}"))?;
            let statements = store["statements"]
                .as_array()
                .context("statements")?
                .iter()
                .map(|pair| (text_of(&pair[0]), text_of(&pair[1])))
                .collect();
            let runs = store["runs"]
                .as_array()
                .context("runs")?
                .iter()
                .map(|run| super::Run {
                    statement: text_of(&run["statement"]),
                    label: text_of(&run["label"]),
                    outcome: match run["outcome"].as_str() {
                        Some("killed") => Outcome::Killed {
                            case: text_of(&run["case"]),
                            why: text_of(&run["why"]),
                        },
                        _ => Outcome::Survived,
                    },
                })
                .collect();
            Ok(StoreRuns {
                store: store_kind,
                statements,
                runs,
                seconds: store["seconds"].as_f64().unwrap_or_default(),
            })
        })
        .collect()
}

/// The report in Markdown.
pub(crate) fn render(all: &[StoreRuns]) -> String {
    let mut out = String::from(
        "# SQL mutants of the ledger adapters\n\n\
         Written by `cargo xtask mutants sql` (do not edit by hand): every statement each \
         adapter sends (the SeaORM adapter on PostgreSQL, SQLite and MariaDB; the sqlx example \
         on PostgreSQL), mutated one change at a time (a condition dropped, a comparison \
         flipped, an assignment dropped, a conflict clause dropped, a limit off by one), and \
         each check of a statement's result the adapter relies on ignored; the contract suite \
         run against each mutant on the real store until its first failing case. A survivor is \
         either explained in `sql-equivalent.md` (reviewed like code) or a hole in the suite. \
         The run column is each store's wall time; the stores run side by side. Mutants of the \
         Rust code (cargo-mutants) are not part of this report.\n\n\
         ## Summary\n\n\
         | store | mutants | killed | equivalent | survived unexplained | run |\n\
         |---|---|---|---|---|---|\n",
    );
    for runs in all {
        let (killed, equivalent, survived) = counts(runs);
        out += &format!(
            "| {:?} | {} | {killed} | {equivalent} | {survived} | {:.0} s |\n",
            runs.store,
            runs.runs.len(),
            runs.seconds
        );
    }
    out += "\n## Statement digests\n\nThe adapter's test `mutation_report` fails when a \
            statement no longer has the digest recorded here: change a statement, run `cargo \
            xtask mutants sql` again.\n\n| store | statement | sha256 of the template |\n\
            |---|---|---|\n";
    for runs in all {
        for (name, template) in &runs.statements {
            out += &format!("| {:?} | {name} | `{}` |\n", runs.store, digest(template));
        }
    }
    for runs in all {
        out += &format!(
            "\n## {:?}\n\n| statement | mutant | outcome |\n|---|---|---|\n",
            runs.store
        );
        for run in &runs.runs {
            let outcome = match &run.outcome {
                Outcome::Equivalent(why) => format!("equivalent: {why}"),
                other => other.to_string(),
            };
            out += &format!(
                "| {} | `{}` | {} |\n",
                run.statement,
                run.label.replace('|', "\\|"),
                outcome.replace('|', "\\|")
            );
        }
    }
    out
}
