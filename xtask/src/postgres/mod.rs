//! A real PostgreSQL for the tests.
//!
//! Where it comes from, first match wins:
//! 1. `DATABASE_URL` when set: used as it is, nothing is started or stopped.
//! 2. The machine's PostgreSQL binaries (Debian's `postgresql-15`; installed with apt-get when
//!    missing and running as root): a throwaway cluster in a temporary directory on a free loopback
//!    port, run as an unprivileged system user when this process is root (PostgreSQL refuses to
//!    run as root), stopped and removed on drop.
//!
//! A container is not one of the ways: the tests here also need MariaDB, Galera and PgBouncer
//! from the same packages. An adapter author without them runs the contract suite against a
//! container through `grpc_ledger_contract_tests::servers` (testcontainers, feature
//! `containers`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::host::{free_loopback_port, fresh_temp_dir, path_str, running_as_root};
use crate::server_process::ServerUser;

mod dev;
pub(crate) use dev::{dev_start, dev_stop, dev_url};

/// Server settings for test clusters. Durability is off because no test crashes the machine:
/// tests kill connections and restart the server, and a fast shutdown or a killed backend does
/// not lose committed data even with fsync off. Benchmarks use their own settings.
const TEST_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "off"),
    ("full_page_writes", "off"),
    ("max_connections", "400"),
    ("shared_buffers", "256MB"),
];

/// Server settings for measurements: durable as a production server would be.
const DURABLE_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "on"),
    ("max_connections", "400"),
    ("shared_buffers", "256MB"),
];

/// The database the tests run against; dropping it stops and removes whatever was started.
pub(crate) enum TestDatabase {
    External(String),
    Cluster(Cluster),
}

impl TestDatabase {
    pub(crate) fn url(&self) -> &str {
        match self {
            Self::External(url) => url,
            Self::Cluster(cluster) => &cluster.url,
        }
    }

    /// The URL without its password, for printing.
    pub(crate) fn redacted_url(&self) -> String {
        redact(self.url())
    }
}

/// Settings for a primary whose commits wait for a synchronous standby.
pub(crate) const SYNCHRONOUS_PRIMARY_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "on"),
    ("synchronous_standby_names", "'*'"),
    ("max_connections", "400"),
    ("shared_buffers", "128MB"),
];

/// Settings for its standby: after promotion it must not wait for a standby of its own.
pub(crate) const STANDBY_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "off"),
    ("synchronous_commit", "on"),
    ("synchronous_standby_names", "''"),
    ("max_connections", "400"),
    ("shared_buffers", "128MB"),
    ("hot_standby", "on"),
];

/// A throwaway primary for the failover scenario.
pub(crate) fn synchronous_primary() -> Result<Cluster> {
    Cluster::start(fresh_temp_dir()?, SYNCHRONOUS_PRIMARY_SETTINGS, true)
}

/// A throwaway cluster of the machine's binaries, for fault tests that restart it.
pub(crate) fn cluster_for_chaos() -> Result<Cluster> {
    Cluster::start(fresh_temp_dir()?, TEST_SETTINGS, true)
}

/// A throwaway cluster with production-like durability, for measurements.
pub(crate) fn for_benchmarks() -> Result<TestDatabase> {
    let root = fresh_temp_dir()?;
    Cluster::start(root, DURABLE_SETTINGS, true).map(TestDatabase::Cluster)
}

pub(crate) fn for_tests() -> Result<TestDatabase> {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.is_empty()
    {
        eprintln!("xtask: DATABASE_URL is set; using it and starting nothing");
        return Ok(TestDatabase::External(url));
    }
    let root = fresh_temp_dir()?;
    Cluster::start(root, TEST_SETTINGS, true).map(TestDatabase::Cluster)
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// A PostgreSQL cluster run from the machine's binaries.
pub(crate) struct Cluster {
    bin: PathBuf,
    root: PathBuf,
    user: ServerUser,
    url: String,
    /// Whether dropping the value stops the server and deletes `root`.
    throwaway: bool,
}

impl Cluster {
    /// Initialises a cluster in `root/data` and starts it on a free loopback port.
    fn start(root: PathBuf, settings: &[(&str, &str)], throwaway: bool) -> Result<Self> {
        let cluster = Self::prepare(root, throwaway)?;
        cluster.init()?;
        cluster.start_anywhere(settings)
    }

    /// A cluster directory owned by the cluster's user, nothing in it yet.
    fn prepare(root: PathBuf, throwaway: bool) -> Result<Self> {
        let bin = bin_dir()?;
        let user = ServerUser::prepare()?;
        user.own(&root)?;
        Ok(Self {
            bin,
            root,
            user,
            url: String::new(),
            throwaway,
        })
    }

    /// Starts the cluster on a free loopback port.
    fn start_anywhere(mut self, settings: &[(&str, &str)]) -> Result<Self> {
        let cluster = &mut self;
        // A free port can be taken between our probe and the server's bind; try a few.
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_loopback_port()?;
            match cluster.start_on(port, settings) {
                Ok(()) => {
                    cluster.url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
                    return Ok(self);
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("no attempt was made")))
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    /// A command for one of the PostgreSQL binaries, run as the cluster's user in its root.
    fn pg_command(&self, program: &str) -> Command {
        self.user.command(self.bin.join(program), &self.root)
    }

    fn init(&self) -> Result<()> {
        cmd::output(
            self.pg_command("initdb")
                .arg("--pgdata")
                .arg(self.data_dir())
                .args([
                    "--username=postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ]),
        )
        .context("initdb")?;
        Ok(())
    }

    fn start_on(&self, port: u16, settings: &[(&str, &str)]) -> Result<()> {
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={}",
            path_str(&self.root)?
        );
        for (name, value) in settings {
            options.push_str(&format!(" -c {name}={value}"));
        }
        let started = cmd::output(
            self.pg_command("pg_ctl")
                .arg("--pgdata")
                .arg(self.data_dir())
                .arg("--log")
                .arg(self.log_file())
                .args(["--wait", "--timeout=60", "-o", &options, "start"]),
        );
        if let Err(error) = started {
            let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("{error:#}\npostgres log:\n{}", tail.join("\n"));
        }
        std::fs::write(self.root.join("port"), port.to_string())?;
        Ok(())
    }

    fn stop(&self) -> Result<()> {
        let stop = |mode: &str| {
            cmd::output(
                self.pg_command("pg_ctl")
                    .arg("--pgdata")
                    .arg(self.data_dir())
                    .args(["--wait", "--timeout=60", "--mode", mode, "stop"]),
            )
        };
        stop("fast").or_else(|_| stop("immediate")).map(|_| ())
    }

    /// A streaming-replication standby of this cluster, from `pg_basebackup`, started on a free
    /// port with the same settings.
    pub(crate) fn start_standby(&self, settings: &[(&str, &str)]) -> Result<Cluster> {
        let standby = Self::prepare(fresh_temp_dir()?, true)?;
        cmd::output(
            standby
                .pg_command("pg_basebackup")
                .args(["--dbname", &self.url, "--pgdata"])
                .arg(standby.data_dir())
                .args([
                    "--write-recovery-conf",
                    "--wal-method=stream",
                    "--checkpoint=fast",
                ]),
        )
        .context("pg_basebackup")?;
        standby.start_anywhere(settings)
    }

    /// Promotes a standby to primary.
    pub(crate) fn promote(&self) -> Result<()> {
        cmd::output(
            self.pg_command("pg_ctl")
                .arg("--pgdata")
                .arg(self.data_dir())
                .args(["--wait", "--timeout=60", "promote"]),
        )
        .map(|_| ())
    }

    /// Stops the server at once, as a crash would (no shutdown checkpoint).
    pub(crate) fn stop_immediately(&self) -> Result<()> {
        cmd::output(
            self.pg_command("pg_ctl")
                .arg("--pgdata")
                .arg(self.data_dir())
                .args(["--wait", "--timeout=60", "--mode", "immediate", "stop"]),
        )
        .map(|_| ())
    }

    /// The port the server listens on.
    pub(crate) fn port(&self) -> Result<u16> {
        self.url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|port| port.parse().ok())
            .context("the cluster URL has no port")
    }

    /// `pg_ctl restart -m fast`: active connections are cut, committed work survives.
    pub(crate) fn restart_fast(&self) -> Result<()> {
        cmd::output(
            self.pg_command("pg_ctl")
                .arg("--pgdata")
                .arg(self.data_dir())
                .arg("--log")
                .arg(self.log_file())
                .args(["--wait", "--timeout=60", "--mode", "fast", "restart"]),
        )
        .map(|_| ())
    }

    /// Runs one SQL statement with psql and returns its unaligned output. psql is a client over
    /// TCP that needs none of the cluster's files, so it runs as the invoker, not as the cluster's
    /// user.
    pub(crate) fn psql(&self, sql: &str) -> Result<String> {
        self.psql_at(&self.url, sql)
    }

    /// [`psql`](Self::psql) on another database of the cluster, named by its `url`.
    pub(crate) fn psql_at(&self, url: &str, sql: &str) -> Result<String> {
        cmd::output(Command::new(self.bin.join("psql")).args([url, "-Atqc", sql]))
            .map(|out| out.trim().to_owned())
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    fn is_running(&self) -> bool {
        self.pg_command("pg_ctl")
            .arg("--pgdata")
            .arg(self.data_dir())
            .arg("status")
            .output()
            .map(|out| out.status.success())
            .unwrap_or(false)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.throwaway {
            return;
        }
        if self.is_running()
            && let Err(error) = self.stop()
        {
            eprintln!("xtask: stopping PostgreSQL failed: {error:#}");
        }
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("xtask: removing {} failed: {error}", self.root.display());
        }
    }
}

/// The directory of `initdb`, `pg_ctl`, `postgres` and `pgbench` (the newest major version),
/// installing Debian's package when missing and running as root.
pub(crate) fn bin_dir() -> Result<PathBuf> {
    if let Some(found) = find_bin_dir() {
        return Ok(found);
    }
    if !running_as_root()? {
        bail!(
            "no PostgreSQL server binaries found (looked in /usr/lib/postgresql/*/bin and for \
             pg_config); install postgresql-15, or set DATABASE_URL to a PostgreSQL you run"
        );
    }
    eprintln!("xtask: PostgreSQL binaries missing; installing postgresql-15 with apt-get");
    cmd::output(Command::new("apt-get").arg("update"))?;
    let installed = cmd::output(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "postgresql-15"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .or_else(|_| {
        cmd::output(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "postgresql"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    });
    installed.context("installing PostgreSQL")?;
    find_bin_dir().context("PostgreSQL was installed but its binaries were not found")
}

fn find_bin_dir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("pg_ctl").is_file() && dir.join("initdb").is_file();
    // Debian keeps one directory per major version; prefer the newest.
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut majors: Vec<(u32, PathBuf)> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| {
                let major = entry.file_name().to_str()?.parse().ok()?;
                Some((major, entry.path().join("bin")))
            })
            .filter(|(_, bin)| has_server(bin))
            .collect();
        majors.sort();
        if let Some((_, bin)) = majors.pop() {
            return Some(bin);
        }
    }
    let from_pg_config = Command::new("pg_config").arg("--bindir").output().ok()?;
    let bin = PathBuf::from(String::from_utf8_lossy(&from_pg_config.stdout).trim());
    has_server(&bin).then_some(bin)
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_only_the_password() {
        assert_eq!(
            redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact("postgres://u@h:5/db"), "postgres://u@h:5/db");
        assert_eq!(redact("sqlite://file.db"), "sqlite://file.db");
    }
}
