//! `cargo xtask chaos [--quick]`: the demo's workload (keyed payments through the tonic guard and
//! the retry executor, 20% of responses lost after commit) while faults hit its PostgreSQL and its
//! server, each scenario reconciled from the database.
//!
//! This module runs the catalogue in order, on the servers each of its parts needs. Not the
//! catalogue itself ([`scenarios`]), the demo's processes ([`supervise`]), the fault injectors
//! ([`faults`]), the checks and the printed report ([`report`]), or the failover proxy
//! ([`proxy`]).

mod faults;
mod proxy;
mod report;
mod scenarios;
mod supervise;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::galera::Galera;
use crate::host::free_loopback_port;
use crate::pgbouncer;
use crate::postgres::{self, Cluster};
use proxy::Proxy;
use report::Summary;
use scenarios::{ChainSide, GaleraNodeKilled, Periodic, PostgresFault, Scenario};
use supervise::{DemoRun, DemoServer};

/// How much a run puts through each scenario.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// Keyed payments the demo sends.
    payments: u32,
    /// How many times a repeated fault (a restart, a killed server) strikes.
    rounds: u32,
}

impl Load {
    fn new(quick: bool) -> Self {
        Self {
            payments: if quick { 1000 } else { 4000 },
            rounds: if quick { 1 } else { 4 },
        }
    }
}

pub(crate) fn chaos(quick: bool, interrupted: &AtomicBool) -> Result<()> {
    let demo = supervise::build_demo(interrupted)?;
    let cluster = postgres::cluster_for_chaos()?;
    let load = Load::new(quick);
    let mut summaries = Vec::new();
    let mut orphans_after_failover = None;
    for scenario in scenarios::ON_POSTGRES {
        let (summary, orphans) = on_postgres(&scenario, &demo, &cluster, load, interrupted)?;
        summaries.push(summary);
        orphans_after_failover = orphans.or(orphans_after_failover);
    }
    summaries.extend(on_galera(&demo, load.payments, interrupted)?);

    let mut failed = report::print_summaries(&summaries);
    let orphans = report::orphans(&cluster)?;
    let postings_orphans = report::orphans_at(&cluster, &postings_database(&cluster)?)?;
    let orphans_after_failover =
        orphans_after_failover.context("the chaos catalogue has no failover scenario")?;
    report::print_orphans(
        &orphans,
        &postings_orphans,
        &orphans_after_failover,
        &mut failed,
    );
    report::verdict(&failed)
}

/// `cargo xtask galera chaos`: only the Galera scenarios of the chaos run.
pub(crate) fn galera_only(quick: bool, interrupted: &AtomicBool) -> Result<()> {
    let demo = supervise::build_demo(interrupted)?;
    let summaries = on_galera(&demo, Load::new(quick).payments, interrupted)?;
    let failed = report::print_summaries(&summaries);
    report::verdict(&failed)
}

/// Runs one scenario of [`scenarios::ON_POSTGRES`] on `cluster` (the failover on servers of its
/// own); its summary, and for the failover the orphaned claims found on the promoted standby.
fn on_postgres(
    scenario: &Scenario<PostgresFault>,
    demo: &Path,
    cluster: &Cluster,
    load: Load,
    interrupted: &AtomicBool,
) -> Result<(Summary, Option<String>)> {
    let run_id = scenario.run_id();
    let run = DemoRun {
        binary: demo,
        url: cluster.url(),
        payments: load.payments,
        run_id: &run_id,
        retry_owner: scenario.retry_owner,
        postings_url: None,
    };
    let summary = match scenario.fault {
        PostgresFault::RestartFast { at } => {
            let restart = |tick| faults::restart_fast(cluster, tick, at, load.rounds);
            in_one_process(scenario, run, interrupted, restart)?
        }
        PostgresFault::KillBackends {
            pooler: None,
            every,
            share,
        } => {
            let kill = |tick| faults::kill_backends(cluster, tick, every, share);
            in_one_process(scenario, run, interrupted, kill)?
        }
        PostgresFault::KillBackends {
            pooler: Some(mode),
            every,
            share,
        } => {
            let bouncer = pgbouncer::Bouncer::start(cluster.url(), mode)?;
            // No pooler flag in either mode: the demo's defaults work behind any pooler.
            let run = DemoRun {
                url: bouncer.url(),
                ..run
            };
            let kill = |tick| faults::kill_backends(cluster, tick, every, share);
            in_one_process(scenario, run, interrupted, kill)?
        }
        PostgresFault::KillServer { at, downtime } => {
            let kill = KillSchedule {
                at,
                downtime,
                rounds: load.rounds,
            };
            server_killed(scenario, run, kill, interrupted)?
        }
        PostgresFault::KillChainServer { side, at, downtime } => {
            let postings_url = postings_database(cluster)?;
            let run = DemoRun {
                postings_url: Some(&postings_url),
                ..run
            };
            let kill = KillSchedule {
                at,
                downtime,
                rounds: load.rounds,
            };
            chain_server_killed(scenario, run, side, kill, interrupted)?
        }
        PostgresFault::FailOverToStandby { at } => {
            let (summary, orphans) = failover(scenario, run, at, interrupted)?;
            return Ok((summary, Some(orphans)));
        }
    };
    Ok((summary, None))
}

/// Runs the demo, its service and its client in one process, while `fault` is called every
/// 100 ms with the tick count.
fn in_one_process(
    scenario: &Scenario<PostgresFault>,
    run: DemoRun<'_>,
    interrupted: &AtomicBool,
    mut fault: impl FnMut(u32) -> Result<u32>,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: {}", scenario.announced);
    let child = run.spawn(&[])?;
    let mut faults = 0;
    let mut tick = 0;
    let demo_report = supervise::wait_with(child, interrupted, || {
        tick += 1;
        faults += fault(tick)?;
        Ok(())
    })?;
    Ok(Summary {
        scenario: scenario.name,
        faults,
        report: demo_report,
    })
}

/// The demo's server in a process of its own, killed (SIGKILL) mid-load and started again on the
/// same port: its uncommitted claims roll back with its connections, and the client, in another
/// process, resolves or resends.
fn server_killed(
    scenario: &Scenario<PostgresFault>,
    run: DemoRun<'_>,
    kill: KillSchedule,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: {}", scenario.announced);
    let addr = format!("127.0.0.1:{}", free_loopback_port()?);
    let mut server = DemoServer::start(run, &addr)?;
    client_while_killing(scenario, run, &addr, &mut server, kill, interrupted)
}

/// Runs the demo's client against `addr` while `victim` is killed and restarted on `kill`'s
/// schedule; the scenario's summary.
fn client_while_killing(
    scenario: &Scenario<PostgresFault>,
    run: DemoRun<'_>,
    addr: &str,
    victim: &mut DemoServer<'_>,
    kill: KillSchedule,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    let client = run.spawn_client(addr)?;
    let mut kills = 0;
    let mut tick = 0u32;
    let demo_report = supervise::wait_with(client, interrupted, || {
        tick += 1;
        kills += faults::kill_server(victim, tick, kill.at, kill.downtime, kills, kill.rounds)?;
        Ok(())
    })?;
    Ok(Summary {
        scenario: scenario.name,
        faults: kills,
        report: demo_report,
    })
}

/// The database of the chained demo's postings service on `cluster` (created if missing); its
/// URL.
fn postings_database(cluster: &Cluster) -> Result<String> {
    const DATABASE: &str = "chain_postings";
    let found = cluster.psql(&format!(
        "SELECT count(*) FROM pg_database WHERE datname = '{DATABASE}'"
    ))?;
    if found == "0" {
        cluster.psql(&format!("CREATE DATABASE {DATABASE}"))?;
    }
    let (server, _) = cluster
        .url()
        .rsplit_once('/')
        .context("the cluster's URL names no database")?;
    Ok(format!("{server}/{DATABASE}"))
}

/// When a killed server is killed, how long it stays down, and how many times.
#[derive(Debug, Clone, Copy)]
struct KillSchedule {
    at: Periodic,
    downtime: Duration,
    rounds: u32,
}

/// The chained demo in three processes (postings server, payments server, client), the server on
/// `side` killed (SIGKILL) mid-load and started again on its port; the client settles and
/// reconciles both databases.
fn chain_server_killed(
    scenario: &Scenario<PostgresFault>,
    run: DemoRun<'_>,
    side: ChainSide,
    kill: KillSchedule,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    eprintln!("xtask: chaos scenario: {}", scenario.announced);
    let postings_addr = format!("127.0.0.1:{}", free_loopback_port()?);
    let payments_addr = format!("127.0.0.1:{}", free_loopback_port()?);
    let postings = DemoServer::start_with(run, &["--serve-postings", &postings_addr])?;
    let payments = DemoServer::start_with(
        run,
        &["--serve", &payments_addr, "--postings-at", &postings_addr],
    )?;
    let mut servers = [payments, postings];
    let victim = match side {
        ChainSide::Payments => 0,
        ChainSide::Postings => 1,
    };
    client_while_killing(
        scenario,
        run,
        &payments_addr,
        &mut servers[victim],
        kill,
        interrupted,
    )
}

/// A primary with a synchronous standby (streaming replication between two local clusters); the
/// demo reaches them through a TCP proxy. Mid-load the primary is stopped as if it crashed, the
/// standby is promoted and the proxy sends new connections to it. Returns the demo's summary and
/// the orphaned claims found on the promoted standby.
fn failover(
    scenario: &Scenario<PostgresFault>,
    run: DemoRun<'_>,
    at: u32,
    interrupted: &AtomicBool,
) -> Result<(Summary, String)> {
    eprintln!("xtask: chaos scenario: {}", scenario.announced);
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
    let proxy = Proxy::start(primary.port()?)?;
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let run = DemoRun { url: &url, ..run };
    let child = run.spawn(&[])?;
    let mut tick = 0;
    let mut failovers = 0;
    let demo_report = supervise::wait_with(child, interrupted, || {
        tick += 1;
        failovers += faults::fail_over(&primary, &standby, &proxy, tick, at)?;
        Ok(())
    })?;
    let orphans = report::orphans(&standby)?;
    Ok((
        Summary {
            scenario: scenario.name,
            faults: failovers,
            report: demo_report,
        },
        orphans,
    ))
}

/// The demo on a three-node Galera cluster: first with its server on node 1 while node 3 is
/// killed and rejoins; then through a TCP proxy (a load balancer's part) to node 1, which is
/// killed, the proxy failing over to node 2, and node 1 later rejoining. After each, every node
/// must hold the same payments, and no claim may be left in progress without a live lease.
fn on_galera(demo: &Path, payments: u32, interrupted: &AtomicBool) -> Result<Vec<Summary>> {
    let started = Instant::now();
    let mut cluster = Galera::start().context("starting a Galera cluster")?;
    eprintln!(
        "xtask: chaos on a three-node Galera cluster (synced in {:.1} s)",
        started.elapsed().as_secs_f64()
    );
    cluster.sql(0, "CREATE DATABASE demo")?;
    let mut summaries = Vec::new();
    for scenario in scenarios::ON_GALERA {
        let summary = galera_node_killed(&scenario, &mut cluster, demo, payments, interrupted)?;
        summaries.push(summary);
    }
    Ok(summaries)
}

/// Runs one scenario of [`scenarios::ON_GALERA`] on `cluster`, then checks that every node holds
/// the same payments.
fn galera_node_killed(
    scenario: &Scenario<GaleraNodeKilled>,
    cluster: &mut Galera,
    demo: &Path,
    payments: u32,
    interrupted: &AtomicBool,
) -> Result<Summary> {
    let fault = &scenario.fault;
    eprintln!("xtask: chaos scenario: {}", scenario.announced);
    let proxy = if fault.proxy_fails_over_to.is_some() {
        Some(Proxy::start(cluster.port(fault.node))?)
    } else {
        None
    };
    let url = match &proxy {
        None => cluster.url(fault.node, "demo"),
        Some(proxy) => format!(
            "mysql://{}:{}@127.0.0.1:{}/demo",
            crate::mariadb::USER,
            crate::mariadb::PASSWORD,
            proxy.port()
        ),
    };
    let run_id = scenario.run_id();
    let run = DemoRun {
        binary: demo,
        url: &url,
        payments,
        run_id: &run_id,
        retry_owner: scenario.retry_owner,
        postings_url: None,
    };
    let child = run.spawn(&[])?;
    let mut tick = 0;
    let demo_report = supervise::wait_with(child, interrupted, || {
        tick += 1;
        faults::kill_galera_node(cluster, proxy.as_ref(), fault, tick)
    })?;
    if !cluster.is_running(fault.victim) {
        cluster.restart_node(fault.victim)?;
    }
    report::same_payments_on_every_node(cluster, &run_id, &demo_report)?;
    Ok(Summary {
        scenario: scenario.name,
        faults: 1,
        report: demo_report,
    })
}
