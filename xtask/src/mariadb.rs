//! A real MariaDB for the tests: Debian's `mariadb-server` (installed with apt-get when missing
//! and running as root), initialised in a temporary directory and run as the clusters'
//! unprivileged user on a free loopback port; stopped and removed on drop, also when a test fails
//! or the command is interrupted. `cargo xtask mariadb start|stop|url` keeps one for development.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::host::{free_loopback_port, fresh_temp_dir, install_if_missing, path_str, wait_until};
use crate::server_process::{ServerUser, terminate_by_pid_file};

pub(crate) const SERVER: &str = "/usr/sbin/mariadbd";
pub(crate) const INSTALL_DB: &str = "/usr/bin/mariadb-install-db";
pub(crate) const CLIENT: &str = "/usr/bin/mariadb";

/// The account the tests connect with over TCP (the server listens on loopback only).
pub(crate) const USER: &str = "ledger";
pub(crate) const PASSWORD: &str = "ledger";

/// A running MariaDB; dropping it stops it and removes its directory (unless it is the
/// development server, which `cargo xtask mariadb stop` removes).
pub(crate) struct MariaDb {
    root: PathBuf,
    child: Option<Child>,
    url: String,
    throwaway: bool,
}

impl MariaDb {
    /// Initialises and starts a server in `root` (which it then owns).
    fn start(root: PathBuf, throwaway: bool) -> Result<Self> {
        install()?;
        let run_as = ServerUser::prepare()?;
        run_as.own(&root)?;
        let user = run_as.name()?;
        let data = root.join("data");
        cmd::output(
            run_as
                .command(INSTALL_DB, &root)
                .args([
                    "--no-defaults",
                    "--skip-test-db",
                    "--auth-root-authentication-method=socket",
                ])
                .arg(format!("--datadir={}", path_str(&data)?))
                .arg(format!("--user={user}")),
        )
        .context("mariadb-install-db")?;
        let port = free_loopback_port()?;
        let socket = root.join("mariadb.sock");
        let child = run_as
            .command(SERVER, &root)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", path_str(&data)?))
            .arg(format!("--socket={}", path_str(&socket)?))
            .arg(format!(
                "--pid-file={}",
                path_str(&root.join("mariadb.pid"))?
            ))
            .arg(format!(
                "--log-error={}",
                path_str(&root.join("error.log"))?
            ))
            .arg(format!("--tmpdir={}", path_str(&root)?))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=48M",
                "--max-connections=400",
                // No test crashes the machine; a killed server keeps what it committed.
                "--innodb-flush-log-at-trx-commit=2",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mariadbd")?;
        let mut server = Self {
            root,
            child: Some(child),
            url: format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{port}"),
            throwaway,
        };
        let sql = |statement: &str| {
            cmd::output(
                run_as
                    .command(CLIENT, &server.root)
                    .arg("--no-defaults")
                    .arg(format!("--socket={}", socket.display()))
                    .arg(format!("--user={user}"))
                    .args(["-e", statement]),
            )
        };
        if let Err(error) = wait_until(Duration::from_secs(60), || sql("SELECT 1").is_ok()) {
            let log = std::fs::read_to_string(server.root.join("error.log")).unwrap_or_default();
            server.child.take().map(|mut c| c.kill());
            bail!("MariaDB did not start: {error:#}\n{log}");
        }
        sql(&format!(
            "CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
             GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION;"
        ))
        .context("creating the test account")?;
        // The database a URL from `cargo xtask mariadb url` names (tests create their own).
        sql(&format!("CREATE DATABASE IF NOT EXISTS {DEV_DATABASE}"))
            .context("creating the development database")?;
        std::fs::write(server.root.join("url"), server.url_of(DEV_DATABASE))?;
        Ok(server)
    }

    /// `mysql://user:password@127.0.0.1:PORT` (no database: tests create their own).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The server's URL for `database`, as an application is given it.
    fn url_of(&self, database: &str) -> String {
        format!("{}/{database}", self.url)
    }

    fn stop(&mut self) {
        let pid_file = self.root.join("mariadb.pid");
        if terminate_by_pid_file(&pid_file) {
            let _ = wait_until(Duration::from_secs(30), || !pid_file.exists());
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        if !self.throwaway {
            return;
        }
        self.stop();
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("xtask: removing {} failed: {error}", self.root.display());
        }
    }
}

/// The load generator the bench measures MariaDB's own limit with (`mariadb-client`).
pub(crate) const SLAP: &str = "/usr/bin/mariadb-slap";

/// Installs Debian's `mariadb-server` (and `mariadb-client`, which holds `mariadb-slap` and which
/// `mariadb-server` depends on anyway) when either is missing and this process may (root).
pub(crate) fn install() -> Result<()> {
    install_if_missing(
        &[SERVER, INSTALL_DB, SLAP],
        &["mariadb-server", "mariadb-client"],
        "the ledger's contract suite runs on MariaDB too, and the bench measures its limit",
    )
}

/// A throwaway server for `cargo xtask test`.
pub(crate) fn for_tests() -> Result<MariaDb> {
    let server = MariaDb::start(fresh_temp_dir()?, true)?;
    eprintln!("xtask: tests use MariaDB at {}", redact(server.url()));
    Ok(server)
}

fn redact(url: &str) -> String {
    url.replace(&format!(":{PASSWORD}@"), ":***@")
}

// --- the development server -------------------------------------------------------------------

/// The database the development servers' URLs name (`cargo xtask mariadb url`, `galera urls`), so
/// that the URL is one an application can use as it is: the demo's `--database-url`, say.
pub(crate) const DEV_DATABASE: &str = "ledger";

fn dev_root() -> PathBuf {
    std::env::temp_dir().join("grpc-safe-retries-dev-mariadb")
}

pub(crate) fn dev_start() -> Result<()> {
    let root = dev_root();
    if root.join("url").is_file() {
        bail!("a development MariaDB is already running; `cargo xtask mariadb stop` first");
    }
    std::fs::create_dir_all(&root)?;
    let mut server = MariaDb::start(root, false)?;
    // Outlives this command: the process is not waited for, and `stop` ends it by its pid file.
    drop(server.child.take());
    println!("{}", server.url_of(DEV_DATABASE));
    eprintln!("xtask: development MariaDB started; stop it with `cargo xtask mariadb stop`");
    Ok(())
}

pub(crate) fn dev_stop() -> Result<()> {
    let root = dev_root();
    if !root.exists() {
        eprintln!("xtask: no development MariaDB is running");
        return Ok(());
    }
    let mut server = MariaDb {
        root: root.clone(),
        child: None,
        url: String::new(),
        throwaway: true,
    };
    server.stop();
    drop(server);
    eprintln!("xtask: development MariaDB stopped and removed");
    Ok(())
}

pub(crate) fn dev_url() -> Result<()> {
    let url = std::fs::read_to_string(dev_root().join("url"))
        .context("no development MariaDB; `cargo xtask mariadb start` first")?;
    println!("{url}");
    Ok(())
}
