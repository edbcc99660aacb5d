//! What the chaos run checks and prints: each scenario's demo report (its own reconciliation:
//! every acknowledged payment exactly once) compacted to one line, the claims left in progress
//! without a live lease, on Galera the same payments on every node, and the verdict.
//!
//! Not running scenarios, processes or faults (the other modules of [`super`]).

use anyhow::{Context, Result, bail};

use crate::galera::Galera;
use crate::postgres::Cluster;

/// One scenario's outcome: its name, the faults injected and the demo's report.
pub(super) struct Summary {
    pub(super) scenario: &'static str,
    pub(super) faults: u32,
    pub(super) report: String,
}

const ORPHANS: &str = "SELECT count(*) FROM grpc_operation_ledger WHERE state = 'IN_PROGRESS' \
     AND lease_expires_at < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// The number of claims in progress on `cluster` whose lease has expired (`0` when none).
pub(super) fn orphans(cluster: &Cluster) -> Result<String> {
    cluster.psql(ORPHANS)
}

/// The same count in the cluster's database at `url` (the chained demo's postings ledger).
pub(super) fn orphans_at(cluster: &Cluster, url: &str) -> Result<String> {
    cluster.psql_at(url, ORPHANS)
}

/// Prints one line per scenario; returns the scenarios whose demo did not reconcile.
pub(super) fn print_summaries(summaries: &[Summary]) -> Vec<&'static str> {
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
                    "duplicate postings",
                    "lost postings",
                    "orphan postings after settling",
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

/// Prints the orphaned claims on the chaos cluster (the payments ledger, then the chained
/// demo's postings ledger) and on the promoted standby; adds them to `failed` when there are any.
pub(super) fn print_orphans(
    orphans: &str,
    postings_orphans: &str,
    orphans_after_failover: &str,
    failed: &mut Vec<&'static str>,
) {
    println!(
        "IN_PROGRESS rows without a live lease: {orphans}, {postings_orphans} in the postings ledger (and {orphans_after_failover} on the promoted standby)"
    );
    if [orphans, postings_orphans, orphans_after_failover]
        .iter()
        .any(|count| *count != "0")
    {
        failed.push("orphaned claims");
    }
}

/// Fails naming the scenarios (or checks) in `failed`, if there are any.
pub(super) fn verdict(failed: &[&str]) -> Result<()> {
    if !failed.is_empty() {
        bail!("chaos found duplicates or losses in: {}", failed.join(", "));
    }
    Ok(())
}

/// Every node of `cluster` holds the payments of run `run_id` the demo reported, each once, and
/// no claim in progress whose lease has expired.
pub(super) fn same_payments_on_every_node(
    cluster: &Galera,
    run_id: &str,
    report: &str,
) -> Result<()> {
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
