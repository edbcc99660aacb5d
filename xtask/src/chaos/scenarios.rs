//! The chaos catalogue: every scenario's name, run tag, retry owner, and what the demo runs
//! against and which fault hits it, with its parameters, as data.
//!
//! Not how a scenario is run (the parent module), how a fault is injected ([`super::faults`]),
//! how the demo's processes are run ([`super::supervise`]) or what is checked and printed
//! ([`super::report`]).

use std::time::Duration;

use crate::pgbouncer::PoolMode;

/// Who owns the demo client's retries in a scenario: about half the scenarios give them to each,
/// so that faults meet both owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RetryOwner {
    /// The application's RetryExecutor, which asks ResolvePayment first.
    Executor,
    /// The generated client over a RetryLayer built from the service config; an unknown outcome
    /// is resent under its key, which the server's ledger answers as a lookup.
    RetryLayer,
}

impl RetryOwner {
    /// The demo's `--retries` value for this owner.
    pub(super) fn demo_retries(self) -> &'static str {
        match self {
            Self::Executor => "application",
            Self::RetryLayer => "channel",
        }
    }
}

/// One scenario of the catalogue; `F` is what the demo runs against and which fault hits it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scenario<F> {
    /// Its name in the report.
    pub(super) name: &'static str,
    /// How `xtask: chaos scenario: …` announces it when it starts.
    pub(super) announced: &'static str,
    /// The start of its run id (the process id follows), which names its keys and accounts, so
    /// that its reconciliation counts only its payments.
    pub(super) tag: &'static str,
    /// Who owns the demo client's retries.
    pub(super) retry_owner: RetryOwner,
    /// What the demo runs against and which fault hits it.
    pub(super) fault: F,
}

impl<F> Scenario<F> {
    /// This scenario's run id in this process.
    pub(super) fn run_id(&self) -> String {
        format!("{}{}", self.tag, std::process::id())
    }
}

/// Ticks `first`, `first + period`, `first + 2 * period`, … (ticks come every 100 ms while the
/// demo runs, from 1).
#[derive(Debug, Clone, Copy)]
pub(super) struct Periodic {
    pub(super) period: u32,
    pub(super) first: u32,
}

impl Periodic {
    /// Whether `tick` is one of these ticks.
    pub(super) fn due(self, tick: u32) -> bool {
        tick % self.period == self.first
    }
}

/// A fault hitting a single PostgreSQL (or the demo's server in front of it). Ticks come every
/// 100 ms while the demo runs, from 1.
#[derive(Debug, Clone, Copy)]
pub(super) enum PostgresFault {
    /// The demo in one process on the chaos cluster, which restarts fast (`pg_ctl restart -m
    /// fast`: connections cut, committed work kept) at ticks `at` while fewer than the run's
    /// rounds of `at.period` ticks have passed.
    RestartFast { at: Periodic },
    /// The demo in one process on the chaos cluster, directly or through PgBouncer in `pooler`;
    /// every `every` ticks each client backend is killed (`pg_terminate_backend`) with
    /// probability `share`, behind the pooler's back when there is one.
    KillBackends {
        pooler: Option<PoolMode>,
        every: u32,
        share: f64,
    },
    /// The demo's server in a process of its own, killed (SIGKILL) at ticks `at` until it was
    /// killed the run's rounds of times, and started again on the same port after `downtime`;
    /// its client in another process.
    KillServer { at: Periodic, downtime: Duration },
    /// The chained demo (`--chain`): its postings server, its payments server and its client in
    /// three processes, payments and postings each in a database of its own on the chaos
    /// cluster; the server on `side` is killed (SIGKILL) at ticks `at` until it was killed the
    /// run's rounds of times, and started again on the same port after `downtime`.
    KillChainServer {
        side: ChainSide,
        at: Periodic,
        downtime: Duration,
    },
    /// A primary with a synchronous standby of its own (not the chaos cluster), reached through
    /// a TCP proxy; at tick `at` the primary is stopped as if it crashed, the standby promoted
    /// and the proxy switched to it.
    FailOverToStandby { at: u32 },
}

/// Which server of the chained demo a scenario kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChainSide {
    /// The payments server, mid-payment (its claims and payments roll back; postings it made
    /// stay, to be taken up by the resends).
    Payments,
    /// The postings server, under the payments handlers' calls.
    Postings,
}

/// A Galera node killed (SIGKILL) under the demo, and started again to rejoin by state transfer.
#[derive(Debug, Clone, Copy)]
pub(super) struct GaleraNodeKilled {
    /// The node (from 0) the demo's server talks to, directly or through the proxy.
    pub(super) node: usize,
    /// When the demo reaches `node` through a TCP proxy (a load balancer's part): the node the
    /// proxy fails over to once the victim is killed.
    pub(super) proxy_fails_over_to: Option<usize>,
    /// The node killed.
    pub(super) victim: usize,
    /// The tick the victim is killed at.
    pub(super) kill_at: u32,
    /// The tick the victim is started again at.
    pub(super) rejoin_at: u32,
}

/// The scenarios on PostgreSQL, in the order they run.
pub(super) const ON_POSTGRES: [Scenario<PostgresFault>; 8] = [
    Scenario {
        name: "postgres fast restart",
        announced: "postgres fast restart",
        tag: "postgresfastrestart",
        retry_owner: RetryOwner::RetryLayer,
        fault: PostgresFault::RestartFast {
            at: Periodic {
                period: 15,
                first: 5,
            },
        },
    },
    Scenario {
        name: "connections killed",
        announced: "connections killed",
        tag: "connectionskilled",
        retry_owner: RetryOwner::Executor,
        fault: PostgresFault::KillBackends {
            pooler: None,
            every: 3,
            share: 0.3,
        },
    },
    // The pooler must pass the broken connections on as failures the ledger reports as
    // UNAVAILABLE, and the claim's bounded wait must hold without any setting on the connection
    // (in transaction pooling, also with server connections changing hands).
    Scenario {
        name: "pgbouncer session, killed",
        announced: "pgbouncer session, killed",
        tag: "pgbouncersessionkilled",
        retry_owner: RetryOwner::RetryLayer,
        fault: PostgresFault::KillBackends {
            pooler: Some(PoolMode::Session),
            every: 5,
            share: 0.2,
        },
    },
    Scenario {
        name: "pgbouncer transaction, killed",
        announced: "pgbouncer transaction, killed",
        tag: "pgbouncertransactionkilled",
        retry_owner: RetryOwner::Executor,
        fault: PostgresFault::KillBackends {
            pooler: Some(PoolMode::Transaction),
            every: 5,
            share: 0.2,
        },
    },
    // Its uncommitted claims roll back with its connections, and the client resolves or resends.
    Scenario {
        name: "server killed",
        announced: "server killed",
        tag: "server",
        retry_owner: RetryOwner::Executor,
        fault: PostgresFault::KillServer {
            at: Periodic {
                period: 15,
                first: 5,
            },
            downtime: Duration::from_millis(300),
        },
    },
    // A killed server on each side of the chain: exactly one payment and one posting for every
    // acknowledged payment, and every posting orphaned by a killed payment taken up on resend.
    Scenario {
        name: "chain, payments killed",
        announced: "chain, payments server killed",
        tag: "chainpaymentskilled",
        retry_owner: RetryOwner::Executor,
        fault: PostgresFault::KillChainServer {
            side: ChainSide::Payments,
            at: Periodic {
                period: 15,
                first: 5,
            },
            downtime: Duration::from_millis(300),
        },
    },
    Scenario {
        name: "chain, postings killed",
        announced: "chain, postings server killed",
        tag: "chainpostingskilled",
        retry_owner: RetryOwner::RetryLayer,
        fault: PostgresFault::KillChainServer {
            side: ChainSide::Postings,
            at: Periodic {
                period: 15,
                first: 5,
            },
            downtime: Duration::from_millis(300),
        },
    },
    Scenario {
        name: "failover to standby",
        announced: "failover to a synchronous standby",
        tag: "failover",
        retry_owner: RetryOwner::RetryLayer,
        fault: PostgresFault::FailOverToStandby { at: 8 },
    },
];

/// The scenarios on a three-node Galera cluster, in the order they run on the same cluster.
pub(super) const ON_GALERA: [Scenario<GaleraNodeKilled>; 2] = [
    // Node 3 dies under a server that talks to node 1.
    Scenario {
        name: "galera, node killed, rejoined",
        announced: "galera, node killed, rejoined",
        tag: "galeranodekilledrejoined",
        retry_owner: RetryOwner::Executor,
        fault: GaleraNodeKilled {
            node: 0,
            proxy_fails_over_to: None,
            victim: 2,
            kill_at: 5,
            rejoin_at: 30,
        },
    },
    // Node 1, the server's own, dies behind a proxy that then fails over to node 2.
    Scenario {
        name: "galera, failover",
        announced: "galera, failover",
        tag: "galerafailover",
        retry_owner: RetryOwner::RetryLayer,
        fault: GaleraNodeKilled {
            node: 0,
            proxy_fails_over_to: Some(1),
            victim: 0,
            kill_at: 5,
            rejoin_at: 30,
        },
    },
];

#[cfg(test)]
mod tests {
    use super::{ON_GALERA, ON_POSTGRES, RetryOwner};

    /// Every scenario: its name, tag and retry owner, in the order they run.
    fn catalogue() -> Vec<(&'static str, &'static str, RetryOwner)> {
        let mut all = Vec::new();
        for scenario in ON_POSTGRES {
            all.push((scenario.name, scenario.tag, scenario.retry_owner));
        }
        for scenario in ON_GALERA {
            all.push((scenario.name, scenario.tag, scenario.retry_owner));
        }
        all
    }

    /// About half the scenarios give the client's retries to the executor, the others to the
    /// RetryLayer, so that faults meet both owners.
    #[test]
    fn faults_meet_both_retry_owners() {
        let owners: Vec<(&str, RetryOwner)> = catalogue()
            .into_iter()
            .map(|(name, _, owner)| (name, owner))
            .collect();
        assert_eq!(
            owners,
            [
                ("postgres fast restart", RetryOwner::RetryLayer),
                ("connections killed", RetryOwner::Executor),
                ("pgbouncer session, killed", RetryOwner::RetryLayer),
                ("pgbouncer transaction, killed", RetryOwner::Executor),
                ("server killed", RetryOwner::Executor),
                ("chain, payments killed", RetryOwner::Executor),
                ("chain, postings killed", RetryOwner::RetryLayer),
                ("failover to standby", RetryOwner::RetryLayer),
                ("galera, node killed, rejoined", RetryOwner::Executor),
                ("galera, failover", RetryOwner::RetryLayer),
            ]
        );
        assert_eq!(RetryOwner::Executor.demo_retries(), "application");
        assert_eq!(RetryOwner::RetryLayer.demo_retries(), "channel");
    }

    /// Run tags are the names' letters and digits (the server's and the failover's are shorter),
    /// and no two scenarios share one, so each reconciliation counts only its own payments.
    #[test]
    fn run_tags_are_distinct() {
        let catalogue = catalogue();
        for (name, tag, _) in &catalogue {
            let letters: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
            let shorter = ["server", "failover"].contains(tag) && letters.starts_with(tag);
            assert!(letters == *tag || shorter, "{name}: tag {tag}");
        }
        let mut tags: Vec<&str> = catalogue.iter().map(|(_, tag, _)| *tag).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), catalogue.len());
    }
}
