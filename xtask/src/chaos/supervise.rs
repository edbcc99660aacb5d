//! Supervision of the chaos run's own processes: building the demo, starting it (its service and
//! client in one process, or its server and its client apart), waiting for it while a fault is
//! injected every 100 ms, and killing its server and starting it again.
//!
//! Not the databases' processes (the postgres, mariadb, galera and pgbouncer modules own those),
//! not when a fault strikes ([`super::faults`]), and not what the demo's report means
//! ([`super::report`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::scenarios::RetryOwner;
use crate::cmd;

/// Builds the demo; its binary's path.
pub(super) fn build_demo(interrupted: &AtomicBool) -> Result<PathBuf> {
    cmd::cargo(
        &["build", "--package", "grpc-ledger-demo"],
        &[],
        interrupted,
    )?;
    Ok(cmd::target_dir()?.join("debug").join("grpc-ledger-demo"))
}

/// One scenario's demo: its binary, the database it reaches, how many payments it sends, its run
/// id and who owns its client's retries; for a chain (`--chain`), the postings service's
/// database.
#[derive(Debug, Clone, Copy)]
pub(super) struct DemoRun<'a> {
    pub(super) binary: &'a Path,
    pub(super) url: &'a str,
    pub(super) payments: u32,
    pub(super) run_id: &'a str,
    pub(super) retry_owner: RetryOwner,
    pub(super) postings_url: Option<&'a str>,
}

impl DemoRun<'_> {
    /// The demo's command line: its keyed payments lose 20% of their responses after commit, and
    /// 1% come after the client's deadline.
    fn command(&self) -> Command {
        let mut command = Command::new(self.binary);
        command.args(["--database-url", self.url, "--run-id", self.run_id]);
        command.args(["--retries", self.retry_owner.demo_retries()]);
        command.args([
            "--payments",
            &self.payments.to_string(),
            "--drop-rate",
            "0.2",
            "--delay-rate",
            "0.01",
        ]);
        if let Some(postings) = self.postings_url {
            command.args(["--chain", "--postings-database-url", postings]);
        }
        command
    }

    /// Starts the demo, its service and its client in one process, with `args` added; its report
    /// comes on the child's stdout.
    pub(super) fn spawn(&self, args: &[&str]) -> Result<Child> {
        self.command()
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the demo")
    }

    /// Starts the demo's client alone, against its server at `addr`; it reconciles from the same
    /// database, and its report comes on the child's stdout.
    pub(super) fn spawn_client(&self, addr: &str) -> Result<Child> {
        self.command()
            .args(["--connect", addr])
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the demo client")
    }
}

/// One of the demo's servers in a process of its own, started with `args` (`--serve` and its
/// address, or a chain's `--serve-postings`); dropping it kills the process.
pub(super) struct DemoServer<'a> {
    run: DemoRun<'a>,
    args: Vec<String>,
    child: Child,
}

impl<'a> DemoServer<'a> {
    /// Starts the payments server on `addr`; returns once it says it is listening.
    pub(super) fn start(run: DemoRun<'a>, addr: &str) -> Result<Self> {
        Self::start_with(run, &["--serve", addr])
    }

    /// Starts the server `args` name; returns once it says it is listening.
    pub(super) fn start_with(run: DemoRun<'a>, args: &[&str]) -> Result<Self> {
        let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        let child = Self::spawn(run, &args)?;
        Ok(Self { run, args, child })
    }

    fn spawn(run: DemoRun<'_>, args: &[String]) -> Result<Child> {
        let mut command = run.command();
        let mut server = command
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the demo server")?;
        let mut line = String::new();
        let stdout = server.stdout.as_mut().context("server stdout")?;
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)?;
        if !line.starts_with("listening on") {
            bail!("the demo server did not start: {line}");
        }
        Ok(server)
    }

    /// Kills the server with SIGKILL (no graceful shutdown: transactions die with the process),
    /// waits `downtime`, as a real crash has some, and starts a replacement on the same address.
    pub(super) fn kill_and_restart(&mut self, downtime: Duration) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        std::thread::sleep(downtime);
        self.child = Self::spawn(self.run, &self.args)?;
        Ok(())
    }
}

impl Drop for DemoServer<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `child`, calling `every_100ms` meanwhile; returns its stdout, failing on a non-zero
/// exit.
pub(super) fn wait_with(
    mut child: Child,
    interrupted: &AtomicBool,
    mut every_100ms: impl FnMut() -> Result<()>,
) -> Result<String> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                std::io::Read::read_to_string(&mut stdout, &mut out)?;
            }
            println!("{out}");
            if !status.success() {
                bail!("the demo exited with {status}");
            }
            return Ok(out);
        }
        if interrupted.load(Ordering::SeqCst) || started.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            bail!("interrupted or timed out");
        }
        every_100ms()?;
        std::thread::sleep(Duration::from_millis(100));
    }
}
