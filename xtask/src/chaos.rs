//! `cargo xtask chaos [--quick]`: the demo's workload (keyed payments through the tonic guard and
//! the retry executor, 20% of responses lost after commit) while faults hit its PostgreSQL and its
//! server, each scenario reconciled from the database.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::galera::Galera;
use crate::postgres::{self, Cluster};
use crate::{cmd, pgbouncer};

const ORPHANS: &str = "SELECT count(*) FROM grpc_operation_ledger WHERE state = 'IN_PROGRESS' \
     AND lease_expires_at < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

struct Summary {
    scenario: &'static str,
    faults: u32,
    report: String,
}

pub(crate) fn chaos(quick: bool, interrupted: &AtomicBool) -> Result<()> {
    let demo = build_demo(interrupted)?;
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
    for mode in [
        pgbouncer::PoolMode::Session,
        pgbouncer::PoolMode::Transaction,
    ] {
        summaries.push(through_pgbouncer(
            &demo,
            &cluster,
            mode,
            payments,
            interrupted,
        )?);
    }
    summaries.push(server_killed(
        &demo,
        &cluster,
        payments,
        rounds,
        interrupted,
    )?);
    let (failover, orphans_after_failover) = failover(&demo, payments, interrupted)?;
    summaries.push(failover);
    summaries.extend(galera_scenarios(&demo, payments, interrupted)?);

    let mut failed = print_summaries(&summaries);
    let orphans = cluster.psql(ORPHANS)?;
    println!(
        "IN_PROGRESS rows without a live lease: {orphans} (and {orphans_after_failover} on the promoted standby)"
    );
    if orphans != "0" || orphans_after_failover != "0" {
        failed.push("orphaned claims");
    }
    if !failed.is_empty() {
        bail!("chaos found duplicates or losses in: {}", failed.join(", "));
    }
    Ok(())
}

/// Prints one line per scenario; returns the scenarios whose demo did not reconcile.
fn print_summaries(summaries: &[Summary]) -> Vec<&'static str> {
    println!("\n{:<30} {:>7}  demo report", "scenario", "faults");
    let mut failed = Vec::new();
    for summary in summaries {
        let compact: Vec<String> = summary
            .report
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim_end().rsplit_once(char::is_whitespace)?;
                [
                    "client retries owned by",
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
            "{:<30} {:>7}  {}",
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
    failed
}

/// `cargo xtask galera chaos`: only the Galera scenarios of the chaos run.
pub(crate) fn galera_only(quick: bool, interrupted: &AtomicBool) -> Result<()> {
    let demo = build_demo(interrupted)?;
    let summaries = galera_scenarios(&demo, if quick { 1000 } else { 4000 }, interrupted)?;
    let failed = print_summaries(&summaries);
    if !failed.is_empty() {
        bail!("chaos found duplicates or losses in: {}", failed.join(", "));
    }
    Ok(())
}

/// Builds the demo; its binary's path.
fn build_demo(interrupted: &AtomicBool) -> Result<std::path::PathBuf> {
    cmd::cargo(
        &["build", "--package", "grpc-ledger-demo"],
        &[],
        interrupted,
    )?;
    Ok(cmd::target_dir()?.join("debug").join("grpc-ledger-demo"))
}

fn demo_command(demo: &Path, cluster: &Cluster, payments: u32, run_id: &str) -> Command {
    demo_command_at(demo, cluster.url(), payments, run_id)
}

fn demo_command_at(demo: &Path, url: &str, payments: u32, run_id: &str) -> Command {
    let mut command = Command::new(demo);
    command.args(["--database-url", url, "--run-id", run_id]);
    command.args(["--retries", client_retries(run_id)]);
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

/// The scenarios (by tag: the run id without its process id) whose demo client has the executor
/// own its retries; the others run it over the RetryLayer, so that faults meet both owners.
const EXECUTOR_SCENARIOS: [&str; 4] = [
    "connectionskilled",
    "pgbouncertransactionkilled",
    "server",
    "galeranodekilledrejoined",
];

/// Who owns the demo client's retries in the scenario of `run_id`.
fn client_retries(run_id: &str) -> &'static str {
    let tag = run_id.trim_end_matches(|c: char| c.is_ascii_digit());
    if EXECUTOR_SCENARIOS.contains(&tag) {
        "application"
    } else {
        "channel"
    }
}

/// Runs the in-process demo while `fault` is called every 100 ms with a tick count; returns the
/// demo's report.
fn scenario(
    name: &'static str,
    demo: &Path,
    cluster: &Cluster,
    payments: u32,
    interrupted: &AtomicBool,
    fault: impl FnMut(&Cluster, u32) -> Result<u32>,
) -> Result<Summary> {
    scenario_at(
        name,
        demo,
        cluster,
        (cluster.url(), &[]),
        payments,
        interrupted,
        fault,
    )
}

/// [`scenario`] with the demo reaching the cluster at `url` (through a proxy or a pooler), with
/// `args` added to its command line.
fn scenario_at(
    name: &'static str,
    demo: &Path,
    cluster: &Cluster,
    (url, args): (&str, &[&str]),
    payments: u32,
    interrupted: &AtomicBool,
    mut fault: impl FnMut(&Cluster, u32) -> Result<u32>,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: {name}");
    // Each scenario's accounts are its own, so its reconciliation counts only its payments.
    let tag: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
    let run_id = format!("{tag}{}", std::process::id());
    let child = demo_command_at(demo, url, payments, &run_id)
        .args(args)
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

/// The demo reaches PostgreSQL through PgBouncer in `mode` while server backends are killed
/// behind the pooler's back: the pooler must pass the broken connections on as failures the
/// ledger reports as UNAVAILABLE, and the claim's bounded wait must hold without any setting on
/// the connection (in transaction pooling, also with server connections changing hands).
fn through_pgbouncer(
    demo: &Path,
    cluster: &Cluster,
    mode: pgbouncer::PoolMode,
    payments: u32,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    let bouncer = pgbouncer::Bouncer::start(cluster.url(), mode)?;
    let (name, args): (_, &[&str]) = match mode {
        pgbouncer::PoolMode::Session => ("pgbouncer session, killed", &[]),
        pgbouncer::PoolMode::Transaction => {
            ("pgbouncer transaction, killed", &["--transaction-pooler"])
        }
    };
    scenario_at(
        name,
        demo,
        cluster,
        (bouncer.url(), args),
        payments,
        interrupted,
        |cluster, tick| {
            if tick % 5 != 0 {
                return Ok(0);
            }
            let killed = cluster.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() \
                 AND random() < 0.2",
            )?;
            Ok(killed.parse().unwrap_or(0))
        },
    )
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
            // Some downtime, as a real crash has, before the replacement comes up.
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

/// A primary with a synchronous standby (streaming replication between two local clusters); the
/// demo reaches them through a TCP proxy. Mid-load the primary is stopped as if it crashed, the
/// standby is promoted and the proxy sends new connections to it. Returns the demo's summary and
/// the orphaned claims found on the promoted standby.
fn failover(demo: &Path, payments: u32, interrupted: &AtomicBool) -> Result<(Summary, String)> {
    eprintln!("xtask: chaos scenario: failover to a synchronous standby");
    let primary = postgres::synchronous_primary()?;
    let standby = primary.start_standby(postgres::STANDBY_SETTINGS)?;
    let started = Instant::now();
    while primary.psql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")? != "1"
    {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the standby never became synchronous");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let proxy = proxy::Proxy::start(primary.port()?)?;
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let run_id = format!("failover{}", std::process::id());
    let child = demo_command_at(demo, &url, payments, &run_id)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the demo")?;
    let mut tick = 0;
    let mut faults = 0;
    let report = wait_with(child, interrupted, || {
        tick += 1;
        if tick == 8 {
            primary.stop_immediately()?;
            standby.promote()?;
            proxy.switch_to(standby.port()?);
            faults += 1;
        }
        Ok(())
    })?;
    let orphans = standby.psql(ORPHANS)?;
    Ok((
        Summary {
            scenario: "failover to standby",
            faults,
            report,
        },
        orphans,
    ))
}

/// The demo on a three-node Galera cluster: first with its server on node 1 while node 3 is
/// killed and rejoins; then through a TCP proxy (a load balancer's part) to node 1, which is
/// killed, the proxy failing over to node 2, and node 1 later rejoining. After each, every node
/// must hold the same payments, and no claim may be left in progress without a live lease.
fn galera_scenarios(demo: &Path, payments: u32, interrupted: &AtomicBool) -> Result<Vec<Summary>> {
    let started = Instant::now();
    let mut cluster = Galera::start().context("starting a Galera cluster")?;
    eprintln!(
        "xtask: chaos on a three-node Galera cluster (synced in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    cluster.sql(0, "CREATE DATABASE demo")?;
    let mut summaries = Vec::new();

    let scenarios: [(&str, Option<proxy::Proxy>, usize); 2] = [
        // Node 3 dies under a server that talks to node 1.
        ("galera, node killed, rejoined", None, 2),
        // Node 1, the server's own, dies behind a proxy that then fails over to node 2.
        (
            "galera, failover",
            Some(proxy::Proxy::start(cluster.port(0))?),
            0,
        ),
    ];
    for (name, proxy, victim) in scenarios {
        eprintln!("xtask: chaos scenario: {name}");
        let url = match &proxy {
            None => cluster.url(0, "demo"),
            Some(proxy) => format!(
                "mysql://{}:{}@127.0.0.1:{}/demo",
                crate::mariadb::USER,
                crate::mariadb::PASSWORD,
                proxy.port()
            ),
        };
        let tag: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
        let run_id = format!("{tag}{}", std::process::id());
        let child = demo_command_at(demo, &url, payments, &run_id)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the demo")?;
        let mut tick = 0;
        let report = wait_with(child, interrupted, || {
            tick += 1;
            match tick {
                5 => {
                    cluster.kill_node(victim)?;
                    if let Some(proxy) = &proxy {
                        proxy.switch_to(cluster.port(1));
                    }
                    Ok(())
                }
                30 => cluster.restart_node(victim),
                _ => Ok(()),
            }
        })?;
        if !cluster.is_running(victim) {
            cluster.restart_node(victim)?;
        }
        same_payments_on_every_node(&cluster, &run_id, &report)?;
        summaries.push(Summary {
            scenario: name,
            faults: 1,
            report,
        });
    }
    Ok(summaries)
}

/// Every node of `cluster` holds the payments of run `run_id` the demo reported, each once, and
/// no claim in progress whose lease has expired.
fn same_payments_on_every_node(cluster: &Galera, run_id: &str, report: &str) -> Result<()> {
    let reported = report
        .lines()
        .find_map(|line| line.strip_prefix("payments rows"))
        .map(str::trim)
        .context("the demo reported no payment rows")?;
    for n in 0..cluster.len() {
        let counts = cluster.sql(
            n,
            &format!(
                "SELECT COUNT(*), COUNT(DISTINCT account) FROM demo.demo_payments \
                 WHERE account LIKE 'acct-{run_id}-%'"
            ),
        )?;
        let expected = format!("{reported}\t{reported}");
        if counts.trim() != expected {
            bail!(
                "node {} holds {counts:?} payments and accounts of {run_id}, the demo reported {reported}",
                n + 1
            );
        }
        let orphans = cluster.sql(
            n,
            "SELECT COUNT(*) FROM demo.grpc_operation_ledger WHERE state = 'IN_PROGRESS' \
             AND lease_expires_at < TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) DIV 1000",
        )?;
        if orphans.trim() != "0" {
            bail!(
                "node {} has {} claims in progress without a live lease",
                n + 1,
                orphans.trim()
            );
        }
    }
    eprintln!(
        "xtask: every node holds the {reported} payments of {run_id}, none twice, no orphaned claim"
    );
    Ok(())
}

mod proxy {
    //! A TCP forwarder on loopback whose target can be switched; switching cuts every forwarded
    //! connection, as a failover cuts clients off the old primary.

    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
    use std::time::Duration;

    use anyhow::Result;

    pub(crate) struct Proxy {
        port: u16,
        target: Arc<AtomicU16>,
        generation: Arc<AtomicU64>,
    }

    impl Proxy {
        pub(crate) fn start(target: u16) -> Result<Self> {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let port = listener.local_addr()?.port();
            let target = Arc::new(AtomicU16::new(target));
            let generation = Arc::new(AtomicU64::new(0));
            let (t, g) = (Arc::clone(&target), Arc::clone(&generation));
            // The accept thread lives until xtask exits; it holds only loopback sockets.
            std::thread::spawn(move || {
                for client in listener.incoming().flatten() {
                    let (target, generation) = (t.load(Ordering::SeqCst), Arc::clone(&g));
                    std::thread::spawn(move || forward(client, target, generation));
                }
            });
            Ok(Self {
                port,
                target,
                generation,
            })
        }

        pub(crate) fn port(&self) -> u16 {
            self.port
        }

        pub(crate) fn switch_to(&self, target: u16) {
            self.target.store(target, Ordering::SeqCst);
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn forward(client: TcpStream, target: u16, generation: Arc<AtomicU64>) {
        let born = generation.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        let pump = |mut from: TcpStream, mut to: TcpStream| {
            std::thread::spawn(move || {
                let mut buffer = [0u8; 16 * 1024];
                while let Ok(n) = from.read(&mut buffer) {
                    if n == 0 || to.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
            })
        };
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        let up = pump(c2, s2);
        let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        let down = pump(s3, c3);
        while !up.is_finished() || !down.is_finished() {
            if generation.load(Ordering::SeqCst) != born {
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    /// About half the scenarios give the client's retries to the executor, by the tag their
    /// names make.
    #[test]
    fn faults_meet_both_retry_owners() {
        let tag = |name: &str| -> String {
            name.chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
                + "4242"
        };
        let owners: Vec<&str> = [
            "postgres fast restart",
            "connections killed",
            "pgbouncer session, killed",
            "pgbouncer transaction, killed",
            "failover",
            "galera, node killed, rejoined",
            "galera, failover",
        ]
        .iter()
        .map(|name| super::client_retries(&tag(name)))
        .collect();
        assert_eq!(
            owners,
            [
                "channel",
                "application",
                "channel",
                "application",
                "channel",
                "application",
                "channel"
            ]
        );
        assert_eq!(super::client_retries("server4242"), "application");
    }
}
