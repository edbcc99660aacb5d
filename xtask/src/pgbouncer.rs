//! A throwaway PgBouncer in front of a test PostgreSQL, as many production deployments run it.
//!
//! Debian's `pgbouncer` (installed with apt-get when missing and running as root), run in the
//! foreground as the clusters' unprivileged user, on a free loopback port, with its files in a
//! temporary directory; stopped and removed on drop, also when a test fails.

use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::host::{free_loopback_port, fresh_temp_dir, install_if_missing, path_str, wait_until};
use crate::server_process::{ServerUser, terminate_by_pid_file};

const BINARY: &str = "/usr/sbin/pgbouncer";

/// How PgBouncer hands server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PoolMode {
    /// A client keeps one server connection for its whole session.
    Session,
    /// A client holds a server connection for one transaction at a time.
    Transaction,
}

impl PoolMode {
    fn name(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer; dropping it stops it and removes its directory.
pub(crate) struct Bouncer {
    child: Child,
    root: std::path::PathBuf,
    url: String,
}

impl Bouncer {
    /// Starts PgBouncer in `mode` in front of the PostgreSQL at `upstream_url`
    /// (`postgres://user@127.0.0.1:PORT/db`, trust authentication).
    pub(crate) fn start(upstream_url: &str, mode: PoolMode) -> Result<Self> {
        install()?;
        let upstream_port = port_of(upstream_url)?;
        let root = fresh_temp_dir()?;
        let port = free_loopback_port()?;
        // Every database on the upstream is reachable under its own name; the pool is large
        // enough for the contract suite's 32 concurrent units plus their admin connections.
        // sqlx sends `extra_float_digits` at startup, which PgBouncer 1.18 refuses unless told
        // to ignore it (the usual setting for any driver that sends it). Every contract case
        // uses a database of its own, and PgBouncer keeps a pool of server connections per
        // database: idle ones are closed after 2 s (not the default 600 s), or the cases' pools
        // would pile up past PostgreSQL's max_connections in session pooling.
        let config = format!(
            "[databases]\n* = host=127.0.0.1 port={upstream_port}\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {root}/userlist.txt\npool_mode = {mode}\n\
             ignore_startup_parameters = extra_float_digits\n\
             default_pool_size = 60\nmax_client_conn = 600\nmax_db_connections = 300\n\
             server_idle_timeout = 2\n\
             logfile = {root}/pgbouncer.log\npidfile = {root}/pgbouncer.pid\n",
            root = path_str(&root)?,
            mode = mode.name(),
        );
        std::fs::write(root.join("pgbouncer.ini"), config)?;
        std::fs::write(root.join("userlist.txt"), "\"postgres\" \"\"\n")?;
        let run_as = ServerUser::prepare()?;
        run_as.own(&root)?;
        let child = run_as
            .command(BINARY, &root)
            .arg(root.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // It logs to its logfile as well, which is shown if it fails to start.
            .stderr(Stdio::null())
            .spawn()
            .context("starting pgbouncer")?;
        let bouncer = Self {
            child,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            root,
        };
        let listening = wait_until(Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if let Err(error) = listening {
            let log =
                std::fs::read_to_string(bouncer.root.join("pgbouncer.log")).unwrap_or_default();
            bail!("pgbouncer did not start: {error:#}\n{log}");
        }
        eprintln!(
            "xtask: PgBouncer ({} pooling) on 127.0.0.1:{port}",
            mode.name()
        );
        Ok(bouncer)
    }

    /// The URL of the upstream's `postgres` database through the pooler.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // PgBouncer runs under runuser when xtask is root; signal it by its pidfile so that it,
        // not only runuser, ends. Unlike MariaDB's stop, this one does not wait for the pid file
        // to go: PgBouncer holds no data that a hurried stop could lose.
        terminate_by_pid_file(&self.root.join("pgbouncer.pid"));
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("xtask: removing {} failed: {error}", self.root.display());
        }
    }
}

/// Installs Debian's `pgbouncer` when it is missing and this process may (root).
fn install() -> Result<()> {
    install_if_missing(
        &[BINARY],
        &["pgbouncer"],
        "the contract suite and the demo also run through a connection pooler",
    )
}

/// The port of a `postgres://user@host:PORT/db` URL.
fn port_of(url: &str) -> Result<u16> {
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .context("a PostgreSQL URL")?;
    authority
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .with_context(|| format!("no port in the PostgreSQL URL {authority}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_the_url() {
        assert_eq!(
            port_of("postgres://postgres@127.0.0.1:5433/postgres").unwrap(),
            5433
        );
        assert_eq!(
            port_of("postgres://u:p@localhost:6000/db?x=y").unwrap(),
            6000
        );
        assert!(port_of("postgres://localhost/db").is_err());
    }
}
