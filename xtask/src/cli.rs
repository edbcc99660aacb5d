//! The command line of `cargo xtask`, parsed by clap: every task, its subcommands and its flags,
//! with the help text that explains them.
//!
//! Not what the tasks do (the `run` of `main.rs` hands each to its module), and not the
//! command lines of the programs xtask starts.

use clap::{Parser, Subcommand};

/// Developer tasks for this workspace, run as `cargo xtask <task>`.
#[derive(Debug, Parser)]
#[command(name = "xtask", bin_name = "cargo xtask")]
pub(crate) struct Cli {
    /// The task; none prints this help.
    #[command(subcommand)]
    pub(crate) task: Option<Task>,
}

/// The tasks.
#[derive(Debug, Subcommand)]
pub(crate) enum Task {
    /// Format check, clippy -D warnings, all tests against a real PostgreSQL: exactly what CI
    /// runs.
    ///
    /// The tests also run against MariaDB, a three-node Galera cluster and PgBouncer, then
    /// `chaos --quick` runs. Every server started is stopped and removed, also when a test fails
    /// or the command is interrupted.
    Test,
    /// The demo's workload while PostgreSQL restarts, connections are killed and the server is
    /// killed; reconciled after each (the quick run is part of `test`).
    Chaos {
        /// The quick run: fewer payments per scenario, one round of each repeated fault.
        #[arg(long)]
        quick: bool,
    },
    /// The guide's "From an empty crate" kit, written as a crate outside the workspace, built and
    /// run (also part of `test`).
    Kit,
    /// The guide (`docs/guide`) built with mdBook into `target/guide` (also part of `test`).
    Guide,
    /// cargo-semver-checks on the publishable library crates against the commit recorded in
    /// `docs/semver-baseline` (not part of `test`: run it before each version bump).
    Semver,
    /// `cargo package`, verified, for every crate that may be published (not part of `test`:
    /// run it before each version bump).
    Package,
    /// Every cargo-fuzz target (service config, method, key parsers) for N s each.
    Fuzz {
        /// How long each target runs, in seconds.
        #[arg(long, value_name = "N", default_value_t = 60)]
        seconds: u64,
    },
    /// The ledger benchmarks on a durable throwaway PostgreSQL (and SQLite); figures in
    /// target/bench/summary.json.
    Bench {
        /// Shorter measurements.
        #[arg(long)]
        quick: bool,
        /// Adds the policy benchmarks (ours against tower's).
        #[arg(long)]
        all: bool,
    },
    /// Mutation testing: how many mutants of the adapters the contract suite kills, as a report
    /// in docs/mutants/ (an hour or more; CI checks only that the report is current).
    Mutants {
        #[command(subcommand)]
        kind: MutantsKind,
    },
    /// A development PostgreSQL that outlives the command, for running single tests with
    /// `DATABASE_URL` by hand.
    Pg {
        #[command(subcommand)]
        action: PgAction,
    },
    /// A development MariaDB (Debian's mariadb-server), as `pg` keeps a PostgreSQL.
    Mariadb {
        #[command(subcommand)]
        action: MariadbAction,
    },
    /// A three-node MariaDB Galera cluster on loopback: for development, for the ledger's
    /// contract suite, and for chaos.
    Galera {
        #[command(subcommand)]
        action: GaleraAction,
    },
}

/// Which mutants `cargo xtask mutants` runs.
#[derive(Debug, Subcommand)]
pub(crate) enum MutantsKind {
    /// Every statement the SeaORM adapter sends, mutated one change at a time, and each check of
    /// a statement's result ignored; the contract suite against each on PostgreSQL, SQLite and
    /// MariaDB (servers started and removed as `test` does). Writes docs/mutants/sql.md when
    /// every store ran; fails on a survivor not explained in docs/mutants/sql-equivalent.md.
    Sql {
        /// Only these stores (repeatable; default: all three). A partial run writes its report
        /// under target/mutants/.
        #[arg(long, value_enum)]
        store: Vec<crate::mutants::SqlStore>,
        /// Only the statement of this name (as the report names it).
        #[arg(long)]
        only: Option<String>,
        /// Run nothing: render the last run's results (target/mutants/results.json) again with
        /// the equivalence file as it is now.
        #[arg(long, conflicts_with_all = ["store", "only"])]
        report_only: bool,
    },
    /// cargo-mutants (installed when missing) on the server guard, the policy's eligibility,
    /// budget and backoff, and the core types' identity, canonical fingerprint and key; each
    /// crate's tests against each mutant. Writes docs/mutants/code.md when every group ran; fails
    /// when a group kills under 90% of its viable mutants or a survivor is not explained in
    /// docs/mutants/code-equivalent.md.
    Code {
        /// Only these groups (repeatable; default: all three); the others keep their last run.
        #[arg(long, value_enum)]
        group: Vec<crate::mutants::code_runs::Group>,
        /// Run nothing: render the last runs again with the equivalence file as it is now.
        #[arg(long, conflicts_with = "group")]
        report_only: bool,
    },
}

/// What `cargo xtask pg` does.
#[derive(Debug, Subcommand)]
pub(crate) enum PgAction {
    /// Start a development PostgreSQL (kept until `pg stop`) and print its URL.
    Start {
        /// Durable settings (fsync on; use them for measurements); fsync is off without it.
        #[arg(long)]
        durable: bool,
    },
    /// Stop and remove the development PostgreSQL.
    Stop,
    /// Print the development PostgreSQL's URL.
    Url,
}

/// What `cargo xtask mariadb` does.
#[derive(Debug, Subcommand)]
pub(crate) enum MariadbAction {
    /// Start a development MariaDB (kept until `mariadb stop`) and print its URL.
    Start,
    /// Stop and remove the development MariaDB.
    Stop,
    /// Print the development MariaDB's URL, naming its `ledger` database (ready for the demo's
    /// `--database-url`).
    Url,
}

/// What `cargo xtask galera` does.
#[derive(Debug, Subcommand)]
pub(crate) enum GaleraAction {
    /// Start a development three-node Galera cluster on loopback (kept until `galera stop`) and
    /// print its nodes' URLs.
    Start,
    /// Stop and remove the development Galera cluster.
    Stop,
    /// Print the development cluster's node URLs, comma-separated, as GALERA_URLS takes them,
    /// each naming the cluster's `ledger` database.
    Urls,
    /// The ledger's contract suite on a fresh three-node Galera cluster, its units spread over
    /// the nodes (also part of `test`).
    Test,
    /// The demo on a three-node Galera cluster while a node is killed and rejoins, and while the
    /// server's node is killed and a proxy fails over (also part of `chaos`).
    Chaos {
        /// The quick run: fewer payments per scenario.
        #[arg(long)]
        quick: bool,
    },
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    /// clap's own consistency checks of the command line.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn tasks_and_flags_parse() {
        let task = |args: &[&str]| {
            let cli = Cli::try_parse_from(args.iter().copied()).unwrap();
            format!("{:?}", cli.task)
        };
        assert_eq!(task(&["xtask"]), "None");
        assert_eq!(task(&["xtask", "test"]), "Some(Test)");
        assert_eq!(
            task(&["xtask", "pg", "start", "--durable"]),
            "Some(Pg { action: Start { durable: true } })"
        );
        assert_eq!(
            task(&["xtask", "pg", "start"]),
            "Some(Pg { action: Start { durable: false } })"
        );
        assert_eq!(task(&["xtask", "fuzz"]), "Some(Fuzz { seconds: 60 })");
        assert_eq!(
            task(&["xtask", "fuzz", "--seconds", "5"]),
            "Some(Fuzz { seconds: 5 })"
        );
        assert_eq!(
            task(&["xtask", "bench", "--all", "--quick"]),
            "Some(Bench { quick: true, all: true })"
        );
        assert_eq!(
            task(&["xtask", "galera", "chaos", "--quick"]),
            "Some(Galera { action: Chaos { quick: true } })"
        );
        for unknown in [
            &["xtask", "deploy"][..],
            &["xtask", "pg"],
            &["xtask", "bench", "--fast"],
            &["xtask", "fuzz", "--seconds", "many"],
        ] {
            assert!(
                Cli::try_parse_from(unknown.iter().copied()).is_err(),
                "{unknown:?}"
            );
        }
    }
}
