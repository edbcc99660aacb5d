//! `cargo xtask mutants sql`: the contract suite's strength against the SeaORM adapter's
//! statements, as a figure. Every statement the adapter sends on a store is mutated one change at
//! a time ([`operators`]), and each check of a statement's result the adapter relies on is
//! ignored one at a time; the suite runs against each mutant on the real store (one `sql-mutants`
//! build, the mutant in the test process's environment, stopping at the first case that fails).
//! The report goes to `docs/mutants/sql.md`; survivors are killed by a new case or explained in
//! `docs/mutants/sql-equivalent.md`.

pub(crate) mod code;
mod code_report;
pub(crate) mod code_runs;
mod operators;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::{cmd, mariadb, postgres};

pub(crate) use report::Outcome;

/// An adapter on a store: the SeaORM adapter on each of its three, and the sqlx example on
/// PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SqlStore {
    Postgres,
    Sqlite,
    Mariadb,
    SqlxExample,
}

impl SqlStore {
    pub(crate) const ALL: [SqlStore; 4] = [
        SqlStore::Postgres,
        SqlStore::Sqlite,
        SqlStore::Mariadb,
        SqlStore::SqlxExample,
    ];

    /// The crate whose `mutant` harness runs it.
    fn package(self) -> &'static str {
        match self {
            SqlStore::SqlxExample => "grpc-ledger-adapter-example-sqlx",
            _ => "grpc-operation-ledger-seaorm",
        }
    }

    /// Its name in the equivalence file.
    pub(crate) fn report_name(self) -> &'static str {
        match self {
            SqlStore::SqlxExample => "sqlx-example",
            other => other.harness_name(),
        }
    }

    /// Whether it needs the PostgreSQL server.
    fn on_postgres(self) -> bool {
        matches!(self, SqlStore::Postgres | SqlStore::SqlxExample)
    }

    /// The harness's `MUTANT_STORE`.
    fn harness_name(self) -> &'static str {
        match self {
            SqlStore::Postgres | SqlStore::SqlxExample => "postgres",
            SqlStore::Sqlite => "sqlite",
            SqlStore::Mariadb => "mariadb",
        }
    }

    /// The store's name in a mutant file's header (the adapter's backend).
    fn backend_name(self) -> &'static str {
        match self {
            SqlStore::Mariadb => "mysql",
            other => other.harness_name(),
        }
    }
}

/// One mutant run on one store.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) statement: String,
    pub(crate) label: String,
    pub(crate) outcome: Outcome,
}

/// One store's runs, with the statements they mutated (name, template).
#[derive(Debug, Clone)]
pub(crate) struct StoreRuns {
    pub(crate) store: SqlStore,
    pub(crate) statements: Vec<(String, String)>,
    pub(crate) runs: Vec<Run>,
    pub(crate) seconds: f64,
}

/// Runs the SQL mutants on `stores` (only the statement named `only`, when given) and writes the
/// report; fails when a survivor is not explained.
pub(crate) fn sql(stores: &[SqlStore], only: Option<&str>, interrupted: &AtomicBool) -> Result<()> {
    let stores = if stores.is_empty() {
        SqlStore::ALL.to_vec()
    } else {
        stores.to_vec()
    };
    let mut harnesses = Vec::new();
    for store in &stores {
        if !harnesses
            .iter()
            .any(|(package, _)| *package == store.package())
        {
            harnesses.push((store.package(), build_harness(store.package())?));
        }
    }
    let work = cmd::target_dir()?.join("mutants");
    std::fs::create_dir_all(&work)?;
    let database = stores
        .iter()
        .any(|store| store.on_postgres())
        .then(postgres::for_tests)
        .transpose()?;
    let maria = stores
        .contains(&SqlStore::Mariadb)
        .then(mariadb::for_tests)
        .transpose()?;
    let mut env: Vec<(&str, String)> = Vec::new();
    if let Some(database) = &database {
        env.push(("DATABASE_URL", database.url().to_owned()));
    }
    if let Some(maria) = &maria {
        env.push(("MARIADB_URL", maria.url().to_owned()));
    }
    let equivalents = report::Equivalents::read(&report::equivalents_path())?;
    // The stores' runs are independent (servers and files of their own), and mostly wait on
    // leases and locks: they run side by side.
    let all: Vec<StoreRuns> = std::thread::scope(|scope| {
        let handles: Vec<_> = stores
            .iter()
            .copied()
            .map(|store| {
                let harness = harnesses
                    .iter()
                    .find(|(package, _)| *package == store.package())
                    .map(|(_, exe)| exe.as_path())
                    .expect("a harness for every store");
                let (env, work, equivalents) = (&env, &work, &equivalents);
                scope.spawn(move || -> Result<StoreRuns> {
                    let started = Instant::now();
                    let harness = Harness {
                        exe: harness,
                        store,
                        env,
                        work,
                    };
                    let mut runs = harness.run_all(only, interrupted)?;
                    for run in &mut runs {
                        if run.outcome == Outcome::Survived
                            && let Some(why) = equivalents.why(store, &run.statement, &run.label)
                        {
                            run.outcome = Outcome::Equivalent(why.to_owned());
                        }
                    }
                    Ok(StoreRuns {
                        store,
                        statements: harness.statements()?,
                        runs,
                        seconds: started.elapsed().as_secs_f64(),
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a store's run panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    drop(database);
    drop(maria);
    // A partial run updates what it ran in the results of earlier runs: a statement run again
    // replaces its mutants (`--only`), a store run again replaces the store.
    let results = work.join("results.json");
    let mut merged = match std::fs::read_to_string(&results) {
        Ok(text) => report::from_json(&text)?,
        Err(_) => Vec::new(),
    };
    for fresh in all {
        match merged.iter_mut().find(|old| old.store == fresh.store) {
            Some(old) if only.is_some() => {
                old.runs.retain(|run| Some(run.statement.as_str()) != only);
                old.runs.extend(fresh.runs);
                old.seconds += fresh.seconds;
            }
            Some(old) => *old = fresh,
            None => merged.push(fresh),
        }
    }
    std::fs::write(&results, report::to_json(&merged))?;
    report_again()
}

/// Renders the last run's results again (`target/mutants/results.json`) with the equivalence
/// file as it is now: after a review adds explanations, without running the mutants again.
pub(crate) fn report_again() -> Result<()> {
    let work = cmd::target_dir()?.join("mutants");
    let results = work.join("results.json");
    let text = std::fs::read_to_string(&results)
        .with_context(|| format!("reading {} (run the mutants first)", results.display()))?;
    let mut all = report::from_json(&text)?;
    let equivalents = report::Equivalents::read(&report::equivalents_path())?;
    for runs in &mut all {
        for run in &mut runs.runs {
            if matches!(run.outcome, Outcome::Survived | Outcome::Equivalent(_)) {
                run.outcome = match equivalents.why(runs.store, &run.statement, &run.label) {
                    Some(why) => Outcome::Equivalent(why.to_owned()),
                    None => Outcome::Survived,
                };
            }
        }
    }
    let complete = all.len() == SqlStore::ALL.len();
    write_report(all, complete, &work)
}

/// Writes the report (to docs/ when every store ran in full) and fails on unexplained survivors.
fn write_report(all: Vec<StoreRuns>, complete: bool, work: &Path) -> Result<()> {
    let stores: Vec<SqlStore> = all.iter().map(|runs| runs.store).collect();
    let text = report::render(&all);
    let path = if complete {
        report::report_path()
    } else {
        let names: Vec<_> = stores.iter().map(|store| store.report_name()).collect();
        work.join(format!("sql-{}.md", names.join("-")))
    };
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", report::summary(&all));
    println!("xtask: the report is at {}", path.display());
    let unexplained: Vec<_> = all
        .iter()
        .flat_map(|store| {
            store
                .runs
                .iter()
                .filter(|run| run.outcome == Outcome::Survived)
                .map(move |run| format!("{:?} {}: {}", store.store, run.statement, run.label))
        })
        .collect();
    if !unexplained.is_empty() {
        bail!(
            "{} mutant(s) survived without an explanation in {}:\n{}",
            unexplained.len(),
            report::equivalents_path().display(),
            unexplained.join("\n")
        );
    }
    Ok(())
}

/// Builds `package`'s mutant harness (`sql-mutants`) once; returns its executable.
fn build_harness(package: &str) -> Result<PathBuf> {
    let args = [
        "test",
        "--package",
        package,
        "--features",
        "sql-mutants",
        "--test",
        "mutant",
        "--no-run",
        "--message-format=json",
    ];
    let out = cmd::output(&mut cmd::cargo_command(&args, &[])).context("building the harness")?;
    out.lines()
        .filter(|line| line.contains("\"name\":\"mutant\""))
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo built no executable for the mutant harness")
}

/// The harness on one store.
struct Harness<'a> {
    exe: &'a Path,
    store: SqlStore,
    env: &'a [(&'a str, String)],
    work: &'a Path,
}

impl Harness<'_> {
    fn command(&self) -> Command {
        let mut command = Command::new(self.exe);
        command.env("MUTANT_STORE", self.store.harness_name());
        command.env_remove("GRPC_LEDGER_SQL_MUTANT");
        command.env_remove("GRPC_LEDGER_CHECK_MUTANT");
        for (name, value) in self.env {
            command.env(name, value);
        }
        command
    }

    /// The statements the adapter sends on the store (name, template).
    fn statements(&self) -> Result<Vec<(String, String)>> {
        Ok(self.listed()?.0)
    }

    /// The harness's `--list`: the statements, and the checks a mutant may ignore.
    #[allow(clippy::type_complexity)]
    fn listed(&self) -> Result<(Vec<(String, String)>, Vec<String>)> {
        let out = cmd::output(self.command().arg("--list"))?;
        let mut statements = Vec::new();
        let mut checks = Vec::new();
        for line in out.lines() {
            let mut fields = line.splitn(3, '\t');
            match (fields.next(), fields.next(), fields.next()) {
                (Some("statement"), Some(name), Some(template)) => {
                    statements.push((name.to_owned(), template.to_owned()));
                }
                (Some("check"), Some(name), None) => checks.push(name.to_owned()),
                _ => {}
            }
        }
        Ok((statements, checks))
    }

    /// The baseline (it must pass), then every statement mutant and every ignored check.
    fn run_all(&self, only: Option<&str>, interrupted: &AtomicBool) -> Result<Vec<Run>> {
        let store = self.store;
        eprintln!("xtask: mutants on {store:?}: the unmutated adapter first");
        if let Outcome::Killed { case, why } = self.run_one(self.command())? {
            bail!("the unmutated adapter fails the suite on {store:?}: {case}: {why}");
        }
        let (statements, checks) = self.listed()?;
        let mut runs = Vec::new();
        for (name, template) in &statements {
            if only.is_some_and(|only| only != name) {
                continue;
            }
            let mutants = operators::mutants(template, store != SqlStore::Mariadb);
            for (n, mutant) in mutants.iter().enumerate() {
                if interrupted.load(std::sync::atomic::Ordering::SeqCst) {
                    bail!("interrupted");
                }
                // One file per store, so that runs on several stores at once never share one.
                let file = self
                    .work
                    .join(format!("mutant-{}.sql", store.harness_name()));
                let header = format!("{}\t{name}", store.backend_name());
                std::fs::write(&file, format!("{header}\n{}", mutant.template))?;
                let mut command = self.command();
                command.env("GRPC_LEDGER_SQL_MUTANT", &file);
                let outcome = self.run_one(command)?;
                eprintln!(
                    "xtask: {store:?} {name} {}/{}: {}: {outcome}",
                    n + 1,
                    mutants.len(),
                    mutant.label
                );
                runs.push(Run {
                    statement: name.clone(),
                    label: mutant.label.clone(),
                    outcome,
                });
            }
        }
        if only.is_none() {
            for check in checks {
                let mut command = self.command();
                command.env("GRPC_LEDGER_CHECK_MUTANT", &check);
                let outcome = self.run_one(command)?;
                eprintln!("xtask: {store:?} check ignored: {check}: {outcome}");
                runs.push(Run {
                    statement: "(result check)".to_owned(),
                    label: format!("check ignored: {check}"),
                    outcome,
                });
            }
        }
        Ok(runs)
    }

    /// Runs the suite against whatever `command`'s environment names; a run that ends without a
    /// verdict (a panic outside a case, a crash) kills the mutant too, and says so.
    fn run_one(&self, mut command: Command) -> Result<Outcome> {
        let out = command
            .stdin(std::process::Stdio::null())
            .output()
            .context("running the mutant harness")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        for line in stdout.lines() {
            if line == "mutant: survived" {
                return Ok(Outcome::Survived);
            }
            if let Some(rest) = line.strip_prefix("mutant: killed\t") {
                let (case, why) = rest.split_once('\t').unwrap_or((rest, ""));
                return Ok(Outcome::Killed {
                    case: case.to_owned(),
                    why: why.to_owned(),
                });
            }
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Ok(Outcome::Killed {
            case: "(the harness)".to_owned(),
            why: format!("ended with {} without a verdict: {last}", out.status),
        })
    }
}
