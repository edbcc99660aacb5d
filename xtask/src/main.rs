//! Developer tasks for this workspace, run as `cargo xtask <task>`.
//!
//! - `cargo xtask test`: exactly what CI runs. Format check, clippy with warnings as errors, then
//!   every test of the workspace against a real PostgreSQL (see [`postgres`] for where it comes
//!   from). The PostgreSQL it starts is always stopped and removed, also when a test fails or the
//!   command is interrupted.
//! - `cargo xtask pg start|stop|url`: a development PostgreSQL that outlives the command, for
//!   running single tests with `DATABASE_URL` by hand.

mod cmd;
mod postgres;
mod tidy;

use std::process::ExitCode;

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  test              format check, clippy -D warnings, all tests against a real PostgreSQL
  pg start          start a development PostgreSQL (kept until `pg stop`) and print its URL;
                    fsync is off unless `--durable` (use that for measurements)
  pg stop           stop and remove the development PostgreSQL
  pg url            print the development PostgreSQL's URL
";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["test"] => test(),
        ["pg", "start"] => postgres::dev_start(false),
        ["pg", "start", "--durable"] => postgres::dev_start(true),
        ["pg", "stop"] => postgres::dev_stop(),
        ["pg", "url"] => postgres::dev_url(),
        ["help" | "--help" | "-h"] | [] => {
            eprint!("{USAGE}");
            Ok(())
        }
        _ => bail!("unknown task {:?}\n{USAGE}", args.join(" ")),
    }
}

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
    let database = postgres::for_tests()?;
    eprintln!("xtask: tests use PostgreSQL at {}", database.redacted_url());
    let outcome = cmd::cargo(
        &["test", "--workspace", "--all-features"],
        &[("DATABASE_URL", database.url())],
        &interrupted,
    );
    // The cluster is stopped here, before the result is reported, whatever the tests did.
    drop(database);
    outcome.context("tests")
}
