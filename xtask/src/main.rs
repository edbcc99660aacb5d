//! Developer tasks for this workspace, run as `cargo xtask <task>`.
//!
//! - `cargo xtask test`: exactly what CI runs. Format check, clippy with warnings as errors, then
//!   every test of the workspace against a real PostgreSQL (see [`postgres`] for where it comes
//!   from). The PostgreSQL it starts is always stopped and removed, also when a test fails or the
//!   command is interrupted.
//! - `cargo xtask pg start|stop|url`: a development PostgreSQL that outlives the command, for
//!   running single tests with `DATABASE_URL` by hand.
//!
//! `cargo xtask help` lists every task; the command line is defined in [`cli`].

mod chaos;
mod cli;
mod cmd;
mod fuzz;
mod galera;
mod guide;
mod host;
mod kit;
mod mariadb;
mod mutants;
mod package;
mod pgbouncer;
mod postgres;
mod semver;
mod server_process;
mod tidy;

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use cli::{Cli, GaleraAction, MariadbAction, MutantsKind, PgAction, Task};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Help is printed to stderr, as every other message of xtask, and asking for it is no
            // failure; a command line clap refuses (an unknown task or flag) is one.
            eprint!("{error}");
            return match error.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            };
        }
    };
    let Some(task) = cli.task else {
        eprint!("{}", Cli::command().render_help());
        return ExitCode::SUCCESS;
    };
    match run(task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(task: Task) -> Result<()> {
    match task {
        Task::Test => test(),
        Task::Guide => guide::build(&*cmd::install_interrupt_flag()?),
        Task::Semver => semver::check(&*cmd::install_interrupt_flag()?),
        Task::Package => package::check(&*cmd::install_interrupt_flag()?),
        Task::Kit => {
            // The kit's output is shown as it runs.
            kit::check(&kit::repository_root(), &*cmd::install_interrupt_flag()?).map(|_| ())
        }
        Task::Bench { quick, all } => bench(quick, all),
        Task::Fuzz { seconds } => fuzz::fuzz(seconds, &*cmd::install_interrupt_flag()?),
        Task::Chaos { quick } => chaos::chaos(quick, &*cmd::install_interrupt_flag()?),
        Task::Mutants { kind } => match kind {
            MutantsKind::Sql {
                report_only: true, ..
            } => mutants::report_again(),
            MutantsKind::Sql { store, only, .. } => {
                mutants::sql(&store, only.as_deref(), &*cmd::install_interrupt_flag()?)
            }
            MutantsKind::Code {
                report_only: true, ..
            } => mutants::code::report_again(),
            MutantsKind::Code { group, .. } => {
                mutants::code::run(&group, &*cmd::install_interrupt_flag()?)
            }
        },
        Task::Pg { action } => match action {
            PgAction::Start { durable } => postgres::dev_start(durable),
            PgAction::Stop => postgres::dev_stop(),
            PgAction::Url => postgres::dev_url(),
        },
        Task::Mariadb { action } => match action {
            MariadbAction::Start => mariadb::dev_start(),
            MariadbAction::Stop => mariadb::dev_stop(),
            MariadbAction::Url => mariadb::dev_url(),
        },
        Task::Galera { action } => match action {
            GaleraAction::Start => galera::dev_start(),
            GaleraAction::Stop => galera::dev_stop(),
            GaleraAction::Urls => galera::dev_urls(),
            GaleraAction::Test => galera_test(),
            GaleraAction::Chaos { quick } => {
                chaos::galera_only(quick, &*cmd::install_interrupt_flag()?)
            }
        },
    }
}

/// The property tests' seed in `cargo xtask test` unless PROPTEST_RNG_SEED is set.
const PROPTEST_SEED: &str = "20261203";

fn test() -> Result<()> {
    let interrupted = cmd::install_interrupt_flag()?;
    cmd::cargo(&["fmt", "--all", "--check"], &[], &interrupted).context("formatting check")?;
    cmd::cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        &[],
        &interrupted,
    )
    .context("clippy")?;
    // Each store of the SeaORM adapter alone, as a crate outside the workspace that depends on it
    // with one backend builds it (no other store's driver in its tree).
    for backend in ["postgres", "mysql", "sqlite"] {
        cmd::cargo(
            &[
                "clippy",
                "--package",
                "grpc-operation-ledger-seaorm",
                "--no-default-features",
                "--features",
                backend,
                "--",
                "-D",
                "warnings",
            ],
            &[],
            &interrupted,
        )
        .with_context(|| format!("the SeaORM adapter with only its `{backend}` feature"))?;
    }
    // The docs with every feature, as docs.rs builds them: no broken link, no warning.
    cmd::cargo(
        &["doc", "--workspace", "--no-deps", "--all-features"],
        &[("RUSTDOCFLAGS", "-D warnings")],
        &interrupted,
    )
    .context("the documentation")?;
    python_peers().context("installing the Python peers of the tests")?;
    let sarif_schema = sarif_schema().context("fetching the SARIF 2.1.0 schema")?;
    let database = postgres::for_tests()?;
    eprintln!("xtask: tests use PostgreSQL at {}", database.redacted_url());
    let mariadb = mariadb::for_tests()?;
    // The contract suite also runs on a three-node Galera cluster (about 12 s to start).
    let started = std::time::Instant::now();
    let galera = galera::Galera::start().context("starting a Galera cluster")?;
    eprintln!(
        "xtask: tests use a three-node Galera cluster (synced in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    let galera_urls = galera.urls();
    // PgBouncer in transaction pooling, the usual production mode: the contract suite and the
    // demo run through it too.
    let transaction_pooler =
        pgbouncer::Bouncer::start(database.url(), pgbouncer::PoolMode::Transaction)?;
    // And in session pooling: the demo runs behind both, with no flag telling it which.
    let session_pooler = pgbouncer::Bouncer::start(database.url(), pgbouncer::PoolMode::Session)?;
    // Property tests draw from a fixed seed, so a case that fails in CI fails the same way on a
    // developer's machine; set PROPTEST_RNG_SEED to explore other inputs.
    let proptest_seed =
        std::env::var("PROPTEST_RNG_SEED").unwrap_or_else(|_| PROPTEST_SEED.to_owned());
    eprintln!("xtask: property tests use PROPTEST_RNG_SEED={proptest_seed}");
    let outcome = cmd::cargo_tee(
        // Every failing test binary reported in one run, not only the first.
        &["test", "--workspace", "--all-features", "--no-fail-fast"],
        &[
            ("DATABASE_URL", database.url()),
            ("PROPTEST_RNG_SEED", &proptest_seed),
            ("SARIF_SCHEMA", &sarif_schema),
            ("MARIADB_URL", mariadb.url()),
            ("GALERA_URLS", &galera_urls),
            ("PGBOUNCER_TRANSACTION_URL", transaction_pooler.url()),
            ("PGBOUNCER_SESSION_URL", session_pooler.url()),
        ],
        &interrupted,
    );
    // The contract suite again, through PgBouncer, as production often reaches PostgreSQL.
    let pooled = outcome.and_then(|output| {
        let pooled = through_pooler(&session_pooler, &interrupted)?;
        Ok(output + &pooled)
    });
    // The transport-evidence pins against a tonic built as a client only: a build of its own,
    // since within the workspace's build cargo unifies tonic's `server` feature back in.
    let pooled = pooled.and_then(|output| {
        let client_only = cmd::cargo_tee(
            &["test", "--package", "grpc-tonic-client-only"],
            &[("EXPECT_CLIENT_ONLY_TONIC", "1")],
            &interrupted,
        )
        .context("the transport pins against a client-only tonic")?;
        Ok(output + &client_only)
    });
    // The adoption examples a user would copy, run (they check what they show).
    let pooled = pooled.and_then(|output| {
        let mut output = output;
        for example in ADOPTION_EXAMPLES {
            output += &cmd::cargo_tee(
                &[
                    "run",
                    "--quiet",
                    "--package",
                    "grpc-ledger-demo",
                    "--example",
                    example,
                ],
                &[],
                &interrupted,
            )
            .with_context(|| format!("the example {example}"))?;
        }
        // The guide's kit, as a crate of its own outside the workspace.
        output += &kit::check(&kit::repository_root(), &interrupted)?;
        // The guide itself, as a reader gets it.
        guide::build(&interrupted)?;
        Ok(output)
    });
    // The servers are stopped here, before the result is reported, whatever the tests did.
    drop(transaction_pooler);
    drop(session_pooler);
    drop(database);
    drop(mariadb);
    drop(galera);
    let output = pooled.context("tests")?;
    // The quick fault run: the demo's workload through PostgreSQL restarts, killed connections and
    // a killed server, on a cluster of its own.
    chaos::chaos(true, &interrupted).context("chaos --quick")?;
    let (passed, failed) = count_tests(&output);
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// The runnable examples of `crates/grpc-ledger-demo/examples`, each a way to adopt the library.
const ADOPTION_EXAMPLES: [&str; 3] = [
    "guard_on_your_service",
    "client_with_retry_layer",
    "client_with_executor",
];

fn galera_test() -> Result<()> {
    let interrupted = cmd::install_interrupt_flag()?;
    let output = on_galera(&interrupted)?;
    let (passed, failed) = count_tests(&output);
    println!("tests: {passed} passed, {failed} failed");
    Ok(())
}

/// Runs the ledger contract suite on a fresh three-node Galera cluster; returns the test output.
fn on_galera(interrupted: &std::sync::atomic::AtomicBool) -> Result<String> {
    let started = std::time::Instant::now();
    let cluster = galera::Galera::start().context("starting a Galera cluster")?;
    eprintln!(
        "xtask: a three-node Galera cluster synced in {:.1} s; the ledger contract suite on it",
        started.elapsed().as_secs_f64()
    );
    cmd::cargo_tee(
        &[
            "test",
            "--package",
            "grpc-operation-ledger-seaorm",
            "--test",
            "contract_galera",
        ],
        &[("GALERA_URLS", &cluster.urls())],
        interrupted,
    )
    .context("the contract suite on Galera")
}

/// Runs the ledger contract suite on PostgreSQL through `bouncer`, a PgBouncer in session pooling
/// (the workspace's run covers transaction pooling); returns the test output.
fn through_pooler(
    bouncer: &pgbouncer::Bouncer,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<String> {
    eprintln!("xtask: the ledger contract suite through PgBouncer (session pooling)");
    cmd::cargo_tee(
        &[
            "test",
            "--package",
            "grpc-operation-ledger-seaorm",
            "--test",
            "contract_postgres",
        ],
        &[("DATABASE_URL", bouncer.url())],
        interrupted,
    )
    .context("the contract suite through PgBouncer")
}

/// The Python packages the tests use as real peers: `protobuf` (a test fingerprints requests a
/// Python client serialised), `grpcio` (gRPC C-core, the reference of the interop table) and
/// `jsonschema` (the lint's SARIF is validated against the SARIF 2.1.0 schema).
const PYTHON_PEERS: &[(&str, &str)] = &[
    ("protobuf", "google.protobuf"),
    ("grpcio", "grpc"),
    ("jsonschema", "jsonschema"),
];

/// Makes sure every package of [`PYTHON_PEERS`] is importable, installing the missing ones from
/// PyPI with pip and saying so.
fn python_peers() -> Result<()> {
    let importable = |module: &str| {
        std::process::Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .output()
            .is_ok_and(|output| output.status.success())
    };
    let missing: Vec<&str> = PYTHON_PEERS
        .iter()
        .filter(|(_, module)| !importable(module))
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask: installing Python packages {} with pip (real peers of the tests: requests \
         serialised by Python's protobuf, and gRPC C-core's client as the retry reference)",
        missing.join(", ")
    );
    let status = std::process::Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(&missing)
        .status()
        .context("running python3 -m pip (is python3 installed?)")?;
    let still_missing = PYTHON_PEERS.iter().any(|(_, module)| !importable(module));
    if !status.success() || still_missing {
        bail!(
            "`python3 -m pip install {}` did not make them importable",
            missing.join(" ")
        );
    }
    Ok(())
}

/// The OASIS SARIF 2.1.0 JSON schema, which Microsoft's `@microsoft/jest-sarif` npm package ships;
/// fetched once with `npm pack` into the target directory, for the lint's SARIF test.
fn sarif_schema() -> Result<String> {
    const PACKAGE: &str = "@microsoft/jest-sarif@1.0.0-beta.0";
    const MEMBER: &str = "package/lib/schemas/sarif-2.1.0-rtm.5.json";
    let dir = cmd::target_dir()?.join("peers");
    let schema = dir.join(MEMBER);
    if !schema.is_file() {
        std::fs::create_dir_all(&dir)?;
        eprintln!(
            "xtask: fetching the SARIF 2.1.0 schema from the npm registry ({PACKAGE}) for the \
             lint's SARIF test"
        );
        let packed = cmd::output(
            std::process::Command::new("npm")
                .args(["pack", PACKAGE, "--silent", "--pack-destination"])
                .arg(&dir),
        )
        .context("npm pack (is npm installed?)")?;
        let tarball = dir.join(packed.trim());
        cmd::output(
            std::process::Command::new("tar")
                .arg("-xzf")
                .arg(&tarball)
                .arg("-C")
                .arg(&dir)
                .arg(MEMBER),
        )?;
    }
    let schema = std::fs::canonicalize(&schema)?;
    Ok(schema.to_string_lossy().into_owned())
}

/// Sums the `test result: ok. N passed; M failed; ...` lines of cargo test's output.
fn count_tests(output: &str) -> (u64, u64) {
    let number_before = |line: &str, word: &str| {
        line.split(';')
            .find(|part| part.trim_end().ends_with(word))
            .and_then(|part| part.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    output
        .lines()
        .filter(|line| line.starts_with("test result:"))
        .fold((0, 0), |(passed, failed), line| {
            (
                passed + number_before(line, "passed"),
                failed + number_before(line, "failed"),
            )
        })
}

fn bench(quick: bool, all: bool) -> Result<()> {
    let interrupted = cmd::install_interrupt_flag()?;
    cmd::cargo(
        &["build", "--release", "--package", "grpc-ledger-bench"],
        &[],
        &interrupted,
    )
    .context("building the benchmarks")?;
    let target = cmd::target_dir()?;
    let summary = target.join("bench").join("summary.json");
    let database = postgres::for_benchmarks()?;
    eprintln!(
        "xtask: benchmarks use a durable PostgreSQL at {}",
        database.redacted_url()
    );
    // MariaDB and a three-node Galera cluster, with the tests' settings: their log is flushed once
    // a second (innodb_flush_log_at_trx_commit=2), so compare keyed with business within a store,
    // not across stores.
    let mariadb = mariadb::for_tests()?;
    let galera = galera::Galera::start().context("starting a Galera cluster")?;
    let binary = target.join("release").join("grpc-ledger-bench");
    let mut command = std::process::Command::new(binary);
    command
        .env("DATABASE_URL", database.url())
        .env("PG_BIN_DIR", postgres::bin_dir()?)
        .env("MARIADB_URL", mariadb.url())
        .env("GALERA_URLS", galera.urls())
        .arg("--out")
        .arg(&summary);
    if quick {
        command.arg("--quick");
    }
    let outcome = cmd::run(&mut command, &interrupted);
    drop(galera);
    drop(mariadb);
    drop(database);
    outcome.context("the ledger benchmarks")?;
    if all {
        policy_benches(&summary)?;
    }
    eprintln!("xtask: figures in {}", summary.display());
    Ok(())
}

/// Runs the policy benchmarks and appends their figures (ours against tower's) to the summary,
/// read from criterion's own results (`target/criterion/<id>/new/benchmark.json` and
/// `estimates.json`: each benchmark's full id and median), not from its printed text.
fn policy_benches(summary: &std::path::Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = std::process::Command::new(cargo);
    command.args(["bench", "-p", "grpc-policy", "--bench", "policy"]);
    cmd::output(&mut command).context("the policy benchmarks")?;
    let figures = criterion_medians(&cmd::target_dir()?.join("criterion"))?;
    let mut entries = Vec::new();
    for (name, ns) in &figures {
        // Each of our budget figures is compared with tower's in the same group.
        let baseline = name.contains("GrpcRetryBudget").then(|| {
            let group = name.split('/').take(2).collect::<Vec<_>>().join("/");
            figures
                .iter()
                .find(|(n, _)| n.starts_with(&group) && n.contains("tower"))
        });
        let baseline = baseline.flatten();
        let ratio = baseline.map(|(_, tower)| tower / ns);
        entries.push(serde_json::json!({
            "name": format!("policy: {name}"),
            "unit": "ns",
            "value": ns,
            "baseline": baseline.map(|(n, _)| n),
            "ratio": ratio,
        }));
        let throughput = ratio
            .map(|r| format!(" (throughput {r:.2}x the baseline)"))
            .unwrap_or_default();
        println!("policy: {name}: {ns:.1} ns{throughput}");
    }
    // The ledger benchmarks' figures are there already; a summary that does not parse is an
    // error, never silently replaced.
    let mut all: Vec<serde_json::Value> = match std::fs::read_to_string(summary) {
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("{} is not a JSON list of figures", summary.display()))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    all.extend(entries);
    std::fs::write(summary, serde_json::to_string_pretty(&all)? + "\n")?;
    Ok(())
}

/// Every benchmark criterion measured under `root`: its full id and its median in nanoseconds.
fn criterion_medians(root: &std::path::Path) -> Result<Vec<(String, f64)>> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if !path.is_dir() {
                continue;
            }
            let (benchmark, estimates) = (path.join("benchmark.json"), path.join("estimates.json"));
            if path.ends_with("new") && benchmark.is_file() && estimates.is_file() {
                let read = |file: &std::path::Path| -> Result<serde_json::Value> {
                    Ok(serde_json::from_str(&std::fs::read_to_string(file)?)?)
                };
                let id = read(&benchmark)?["full_id"]
                    .as_str()
                    .context("criterion's benchmark.json has no full_id")?
                    .to_owned();
                let median = read(&estimates)?["median"]["point_estimate"]
                    .as_f64()
                    .context("criterion's estimates.json has no median")?;
                found.push((id, median));
            } else {
                dirs.push(path);
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    anyhow::ensure!(
        !found.is_empty(),
        "criterion wrote no results under {}",
        root.display()
    );
    Ok(found)
}

#[cfg(test)]
mod tests {
    /// The layout criterion 0.8 writes: `<group>/<function>/new/{benchmark,estimates}.json`
    /// (and `base/` and `report/` beside it, which are not read).
    #[test]
    fn criterion_results_are_read_from_its_json() {
        let root = std::env::temp_dir().join(format!("xtask-criterion-{}", std::process::id()));
        let write = |dir: &str, id: &str, median: f64| {
            for state in ["new", "base"] {
                let dir = root.join(dir).join(state);
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(
                    dir.join("benchmark.json"),
                    format!(r#"{{"full_id": "{id}"}}"#),
                )
                .unwrap();
                let median = if state == "new" { median } else { 1e9 };
                std::fs::write(
                    dir.join("estimates.json"),
                    format!(r#"{{"mean": {{"point_estimate": 1.0}}, "median": {{"point_estimate": {median}}}}}"#),
                )
                .unwrap();
            }
        };
        write(
            "budget/one thread/ours",
            "budget/one thread/GrpcRetryBudget",
            12.5,
        );
        write(
            "budget/one thread/tower",
            "budget/one thread/tower TpsBudget",
            40.0,
        );
        std::fs::create_dir_all(root.join("report")).unwrap();
        let found = super::criterion_medians(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            found,
            [
                ("budget/one thread/GrpcRetryBudget".to_owned(), 12.5),
                ("budget/one thread/tower TpsBudget".to_owned(), 40.0),
            ]
        );
    }

    #[test]
    fn test_counts_are_summed_from_cargo_output() {
        let output = "running 2 tests\ntest result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
                      test result: ok. 16 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.49s\n";
        assert_eq!(super::count_tests(output), (18, 1));
    }
}
