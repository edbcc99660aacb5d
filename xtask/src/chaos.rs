//! `cargo xtask chaos [--quick]`: the demo's workload (keyed payments through the tonic guard and
//! the retry executor, 20% of responses lost after commit) while faults hit its PostgreSQL and its
//! server, each scenario reconciled from the database.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::postgres::{self, Cluster};

struct Summary {
    scenario: &'static str,
    faults: u32,
    report: String,
}

pub(crate) fn chaos(quick: bool, interrupted: &AtomicBool) -> Result<()> {
    cmd::cargo(
        &["build", "--package", "grpc-ledger-demo"],
        &[],
        interrupted,
    )?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let demo = root.join("target").join("debug").join("grpc-ledger-demo");
    let cluster = postgres::cluster_for_chaos()?;
    let payments = if quick { 1000 } else { 4000 };
    let rounds = if quick { 1 } else { 4 };
    let mut summaries = Vec::new();

    summaries.push(scenario(
        "postgres fast restart",
        &demo,
        &cluster,
        payments,
        interrupted,
        |cluster, tick| {
            if tick % 15 == 5 && tick / 15 < rounds {
                cluster.restart_fast()?;
                return Ok(1);
            }
            Ok(0)
        },
    )?);
    summaries.push(scenario(
        "connections killed",
        &demo,
        &cluster,
        payments,
        interrupted,
        |cluster, tick| {
            if tick % 3 != 0 {
                return Ok(0);
            }
            let killed = cluster.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND random() < 0.3",
            )?;
            Ok(killed.parse().unwrap_or(0))
        },
    )?);
    summaries.push(server_killed(
        &demo,
        &cluster,
        payments,
        rounds,
        interrupted,
    )?);

    println!("\n{:<24} {:>7}  demo report", "scenario", "faults");
    let mut failed = Vec::new();
    for summary in &summaries {
        let compact: Vec<String> = summary
            .report
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim_end().rsplit_once(char::is_whitespace)?;
                [
                    "calls",
                    "acknowledged",
                    "attempts",
                    "retries",
                    "resolved first",
                    "duplicates",
                    "losses",
                ]
                .contains(&name.trim())
                .then(|| format!("{}={}", name.trim().replace(' ', "-"), value.trim()))
            })
            .collect();
        println!(
            "{:<24} {:>7}  {}",
            summary.scenario,
            summary.faults,
            compact.join(" ")
        );
        if !summary
            .report
            .contains("OK: every acknowledged payment exactly once")
        {
            failed.push(summary.scenario);
        }
    }
    let orphans = cluster.psql(
        "SELECT count(*) FROM grpc_operation_ledger WHERE state = 'IN_PROGRESS' \
         AND lease_expires_at < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    )?;
    println!("IN_PROGRESS rows without a live lease: {orphans}");
    if orphans != "0" {
        failed.push("orphaned claims");
    }
    if !failed.is_empty() {
        bail!("chaos found duplicates or losses in: {}", failed.join(", "));
    }
    Ok(())
}

fn demo_command(demo: &Path, cluster: &Cluster, payments: u32, run_id: &str) -> Command {
    let mut command = Command::new(demo);
    command.args(["--database-url", cluster.url(), "--run-id", run_id]);
    command.args([
        "--payments",
        &payments.to_string(),
        "--drop-rate",
        "0.2",
        "--delay-rate",
        "0.01",
    ]);
    command
}

/// Runs the in-process demo while `fault` is called every 100 ms with a tick count; returns the
/// demo's report.
fn scenario(
    name: &'static str,
    demo: &Path,
    cluster: &Cluster,
    payments: u32,
    interrupted: &AtomicBool,
    mut fault: impl FnMut(&Cluster, u32) -> Result<u32>,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: {name}");
    let run_id = format!(
        "{}{}",
        name.split_whitespace().next().unwrap_or("x"),
        std::process::id()
    );
    let child = demo_command(demo, cluster, payments, &run_id)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo")?;
    let mut faults = 0;
    let mut tick = 0;
    let child = wait_with(child, interrupted, || {
        tick += 1;
        faults += fault(cluster, tick)?;
        Ok(())
    })?;
    Ok(Summary {
        scenario: name,
        faults,
        report: child,
    })
}

/// Waits for `child`, calling `every_100ms` meanwhile; returns its stdout, failing on a non-zero
/// exit.
fn wait_with(
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

/// The server process is killed (SIGKILL) mid-load and started again on the same port: its
/// uncommitted claims roll back with its connections, and the client resolves or resends.
fn server_killed(
    demo: &Path,
    cluster: &Cluster,
    payments: u32,
    rounds: u32,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: server killed");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let run_id = format!("server{}", std::process::id());
    let start_server = || -> Result<Child> {
        let mut server = demo_command(demo, cluster, payments, &run_id)
            .args(["--serve", &addr])
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
    };
    let mut server = start_server()?;
    let client = demo_command(demo, cluster, payments, &run_id)
        .args(["--connect", &addr])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo client")?;
    let mut kills = 0;
    let mut tick = 0u32;
    let report = wait_with(client, interrupted, || {
        tick += 1;
        if tick % 15 == 5 && kills < rounds {
            server.kill()?; // SIGKILL: no graceful shutdown, transactions die with the process
            server.wait()?;
            kills += 1;
            std::thread::sleep(Duration::from_millis(300));
            server = start_server()?;
        }
        Ok(())
    });
    let _ = server.kill();
    let _ = server.wait();
    Ok(Summary {
        scenario: "server killed",
        faults: kills,
        report: report?,
    })
}
