//! The fault injectors of the chaos run. Each is called on every tick (one every 100 ms while the
//! demo runs, from 1), decides from the tick whether its fault strikes now, strikes, and returns
//! how many faults it made.
//!
//! Not which scenario gets which fault, nor the faults' parameters ([`super::scenarios`]), nor
//! starting, waiting for and restarting the demo's processes ([`super::supervise`]).

use std::time::Duration;

use anyhow::Result;

use super::proxy::Proxy;
use super::scenarios::{GaleraNodeKilled, Periodic};
use super::supervise::DemoServer;
use crate::galera::Galera;
use crate::postgres::Cluster;

/// Restarts `cluster` fast (`pg_ctl restart -m fast`: active connections are cut, committed work
/// survives) at ticks `at` while fewer than `rounds` rounds of `at.period` ticks have passed.
pub(super) fn restart_fast(cluster: &Cluster, tick: u32, at: Periodic, rounds: u32) -> Result<u32> {
    if at.due(tick) && tick / at.period < rounds {
        cluster.restart_fast()?;
        return Ok(1);
    }
    Ok(0)
}

/// Every `every` ticks, kills each client backend of `cluster` (but psql's own) with probability
/// `share`; the backends killed.
pub(super) fn kill_backends(cluster: &Cluster, tick: u32, every: u32, share: f64) -> Result<u32> {
    if !tick.is_multiple_of(every) {
        return Ok(0);
    }
    let killed = cluster.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND random() < {share}"
    ))?;
    Ok(killed.parse().unwrap_or(0))
}

/// Kills the demo's server (SIGKILL) at ticks `at` until it has been killed `rounds` times
/// (`kills` so far), each time starting a replacement after `downtime`.
pub(super) fn kill_server(
    server: &mut DemoServer<'_>,
    tick: u32,
    at: Periodic,
    downtime: Duration,
    kills: u32,
    rounds: u32,
) -> Result<u32> {
    if at.due(tick) && kills < rounds {
        server.kill_and_restart(downtime)?;
        return Ok(1);
    }
    Ok(0)
}

/// At tick `at`, stops `primary` at once, as a crash would (no shutdown checkpoint), promotes
/// `standby`, and switches `proxy` to it, which cuts every connection it forwards.
pub(super) fn fail_over(
    primary: &Cluster,
    standby: &Cluster,
    proxy: &Proxy,
    tick: u32,
    at: u32,
) -> Result<u32> {
    if tick == at {
        primary.stop_immediately()?;
        standby.promote()?;
        proxy.switch_to(standby.port()?);
        return Ok(1);
    }
    Ok(0)
}

/// At tick `fault.kill_at`, kills the victim node (SIGKILL, as a crash or an out-of-memory kill
/// would) and switches `proxy`, when the demo goes through one, to the node it fails over to; at
/// `fault.rejoin_at`, starts the victim again and returns once it has rejoined.
pub(super) fn kill_galera_node(
    cluster: &mut Galera,
    proxy: Option<&Proxy>,
    fault: &GaleraNodeKilled,
    tick: u32,
) -> Result<()> {
    if tick == fault.kill_at {
        cluster.kill_node(fault.victim)?;
        if let (Some(proxy), Some(node)) = (proxy, fault.proxy_fails_over_to) {
            proxy.switch_to(cluster.port(node));
        }
    } else if tick == fault.rejoin_at {
        cluster.restart_node(fault.victim)?;
    }
    Ok(())
}
