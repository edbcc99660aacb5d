//! The store and the load generator on cores of their own (`--split-cores`).
//!
//! On a machine where PostgreSQL and the client share every core, each microsecond of CPU the
//! client spends on a unit of work is one the server cannot spend on the next, so the adapter's
//! rate next to pgbench's mixes two things: what its statements cost the store, and what its
//! client stack costs the cores they share. A team runs its database on machines of its own.
//! Split, the server's processes run on the first half of the cores and this process (its
//! tokio workers, and pgbench, which inherits its cores) on the rest, so each client's rate is
//! what the store gives it with the client's own CPU out of the store's way.
//!
//! The halves are by CPU number, as this process may use them: on a machine with SMT, siblings
//! of one physical core may land in different halves. The client's threads are not reduced to
//! its half: tokio's workers and pgbench's threads (`-j`) stay as many as without the split, on
//! both sides alike.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use sea_orm::sqlx::{self, postgres::PgPoolOptions};

use crate::cpu::stat_field;

/// The CPUs each side was given, as `taskset` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Halves {
    store: String,
    client: String,
}

/// The store and this process on cores of their own, until this is dropped: then each goes
/// back to the CPUs it had before, so that neither a server left running nor the rest of this
/// process stays pinned.
pub struct CoreSplit {
    postmaster: u32,
    its_cpus_before: String,
    our_cpus_before: String,
}

impl Drop for CoreSplit {
    fn drop(&mut self) {
        if let Err(error) = pin(std::process::id(), &self.our_cpus_before) {
            eprintln!("split cores: this process stays on its half: {error:#}");
        }
        // The postmaster first, so that a backend it forks meanwhile is not left behind.
        let restored =
            pin(self.postmaster, &self.its_cpus_before).and_then(|()| children_of(self.postmaster));
        match restored {
            Ok(children) => {
                for pid in children {
                    // A process that ended since the listing needs nothing.
                    let _ = pin(pid, &self.its_cpus_before);
                }
            }
            Err(error) => eprintln!(
                "split cores: PostgreSQL's postmaster {} may be left on its half of the cores \
                 until it restarts: {error:#}",
                self.postmaster
            ),
        }
    }
}

/// The CPUs of a list as `taskset` and `/proc` write them (`0-3,6,8-9`), in order.
fn parse_cpu_list(list: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        let (from, to): (usize, usize) = (from.parse()?, to.parse()?);
        ensure!(from <= to, "{part} is not a range of CPUs");
        cpus.extend(from..=to);
    }
    Ok(cpus)
}

/// The first half of `cpus` for the store, the rest for the client.
fn halves(cpus: &[usize]) -> Result<Halves> {
    ensure!(
        cpus.len() >= 2,
        "--split-cores needs at least two cores, and this process may run on {}",
        cpus.len()
    );
    let list = |cpus: &[usize]| {
        cpus.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let (store, client) = cpus.split_at(cpus.len() / 2);
    Ok(Halves {
        store: list(store),
        client: list(client),
    })
}

/// The CPUs process `pid` (or `self`) may run on, as `/proc/<pid>/status` lists them.
pub fn cpus_allowed(pid: &str) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .with_context(|| format!("no Cpus_allowed_list in /proc/{pid}/status"))?;
    Ok(list.trim().to_owned())
}

/// The postmaster of the PostgreSQL on `pool`, checked to be a process of this machine: the
/// parent of this connection's backend, and the process the first line of `postmaster.pid` in
/// the server's data directory names. A server in a container or on another host has pids of
/// its own, which may name an unrelated process here.
async fn local_postmaster(pool: &sqlx::PgPool) -> Result<u32> {
    let (backend, data_directory): (i32, String) =
        sqlx::query_as("SELECT pg_backend_pid(), current_setting('data_directory')")
            .fetch_one(pool)
            .await?;
    let not_local = || {
        format!(
            "--split-cores pins the store's processes, so the PostgreSQL measured must run on \
             this machine; its backend {backend} and data directory {data_directory} are not \
             found here as one"
        )
    };
    let postmaster = parent_of(backend as u32).with_context(not_local)?;
    let pid_file = std::fs::read_to_string(Path::new(&data_directory).join("postmaster.pid"))
        .with_context(not_local)?;
    let named = pid_file
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<u32>().ok());
    ensure!(named == Some(postmaster), not_local());
    Ok(postmaster)
}

/// Moves the PostgreSQL at `url` (its postmaster, and every process it has started, so every
/// backend it forks from now on too) onto the first half of the cores this process may use, and
/// this process onto the rest. The server must run on this machine: the postmaster is found as the
/// parent of this connection's backend, in `/proc`.
pub async fn split_cores(url: &str) -> Result<CoreSplit> {
    let our_cpus_before = cpus_allowed("self")?;
    let split = halves(&parse_cpu_list(&our_cpus_before)?)?;
    let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let postmaster = local_postmaster(&pool).await;
    pool.close().await;
    let postmaster = postmaster?;
    let restore = CoreSplit {
        postmaster,
        its_cpus_before: cpus_allowed(&postmaster.to_string())?,
        our_cpus_before,
    };
    pin(postmaster, &split.store)?;
    let mut pinned = 0;
    for child in children_of(postmaster)? {
        // A process that ended since the listing needs no pinning.
        if pin(child, &split.store).is_ok() {
            pinned += 1;
        }
    }
    pin(std::process::id(), &split.client)?;
    eprintln!(
        "split cores: PostgreSQL's postmaster {postmaster} and its {pinned} processes on CPU \
         {}, this process and pgbench on CPU {}",
        split.store, split.client
    );
    Ok(restore)
}

/// The parent process of `pid` (field 4 of its `stat` line).
fn parent_of(pid: u32) -> Result<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    Ok(stat_field(&stat, 4)? as u32)
}

/// Every process whose parent is `parent`.
fn children_of(parent: u32) -> Result<Vec<u32>> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if parent_of(pid).is_ok_and(|p| p == parent) {
            children.push(pid);
        }
    }
    Ok(children)
}

/// Every thread of `pid` onto `cpus`; threads and processes it starts later inherit them.
fn pin(pid: u32, cpus: &str) -> Result<()> {
    let output = Command::new("taskset")
        .args(["--all-tasks", "--pid", "--cpu-list", cpus, &pid.to_string()])
        .output()
        .context("running taskset (util-linux)")?;
    if !output.status.success() {
        bail!(
            "taskset could not move process {pid} onto CPU {cpus}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_gets_the_first_half_of_the_cores() {
        let split = |list: &str| {
            let split = halves(&parse_cpu_list(list).unwrap()).unwrap();
            (split.store, split.client)
        };
        assert_eq!(split("0-1"), ("0".into(), "1".into()));
        assert_eq!(split("0-7"), ("0,1,2,3".into(), "4,5,6,7".into()));
        assert_eq!(split("2,4-5"), ("2".into(), "4,5".into()));
        assert!(halves(&parse_cpu_list("3").unwrap()).is_err());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }

    #[test]
    fn a_process_is_found_as_its_parents_child() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let found = children_of(std::process::id()).unwrap();
        assert_eq!(parent_of(child.id()).unwrap(), std::process::id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found.contains(&child.id()), "{found:?}");
    }
}
