//! A three-node MariaDB Galera cluster (synchronous multi-primary replication) on loopback, for
//! the ledger's contract suite with its units spread over the nodes: Debian's `mariadb-server`
//! and `galera-4` (with `rsync` for state transfer), installed with apt-get when missing and
//! running as root; each node run as the clusters' unprivileged user with small buffers, node 1
//! bootstrapping and the others joining one at a time; stopped and removed on drop.
//!
//! Reads wait for causality (`wsrep_sync_wait=1`): without it a node applies other nodes' commits
//! a moment later, so a replay read on one node could miss an operation another node just
//! committed (safe for the ledger, whose insert would then fail certification, but a needless
//! retry for the client). Deployments of the ledger on Galera should set it too (ADR 0008).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::cmd;
use crate::host::{free_loopback_port, fresh_temp_dir, install_if_missing, path_str, wait_until};
use crate::mariadb::{CLIENT, DEV_DATABASE, INSTALL_DB, PASSWORD, SERVER, USER, install};
use crate::server_process::{ServerUser, terminate_by_pid_file};

const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

struct Node {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

/// A running three-node cluster; dropping it stops every node and removes their directories.
pub(crate) struct Galera {
    root: PathBuf,
    nodes: Vec<Node>,
    run_as: ServerUser,
    user: String,
    /// Whether dropping the value leaves the cluster running (the development cluster).
    keep: bool,
}

impl Galera {
    /// Bootstraps node 1, joins nodes 2 and 3 by state transfer, and creates the test account, in
    /// a fresh temporary directory.
    pub(crate) fn start() -> Result<Self> {
        Self::start_in(fresh_temp_dir()?)
    }

    fn start_in(root: PathBuf) -> Result<Self> {
        install()?;
        install_if_missing(
            &[PROVIDER, "/usr/bin/wsrep_sst_rsync"],
            &["galera-4", "rsync"],
            "a three-node Galera cluster",
        )?;
        let run_as = ServerUser::prepare()?;
        let user = run_as.name()?;
        let group_ports: Vec<u16> = (0..3)
            .map(|_| free_loopback_port())
            .collect::<Result<_>>()?;
        let cluster_address = format!(
            "gcomm://{}",
            group_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut galera = Self {
            root: root.clone(),
            nodes: Vec::new(),
            run_as,
            user,
            keep: false,
        };
        for (n, group_port) in group_ports.iter().enumerate() {
            let dir = root.join(format!("node{}", n + 1));
            std::fs::create_dir_all(&dir)?;
            let port = free_loopback_port()?;
            let (ist, sst) = (free_loopback_port()?, free_loopback_port()?);
            let config = format!(
                "[mysqld]\ndatadir={data}\nsocket={dir}/mariadb.sock\npid-file={dir}/mariadb.pid\n\
                 log-error={dir}/error.log\ntmpdir={dir}\nport={port}\nbind-address=127.0.0.1\n\
                 skip-name-resolve\ninnodb_buffer_pool_size=64M\ninnodb_log_file_size=48M\n\
                 innodb_flush_log_at_trx_commit=2\nmax_connections=300\nbinlog_format=ROW\n\
                 innodb_autoinc_lock_mode=2\nwsrep_on=ON\nwsrep_provider={PROVIDER}\n\
                 wsrep_sync_wait=1\n\
                 wsrep_cluster_name=grpc_ledger\nwsrep_cluster_address={cluster_address}\n\
                 wsrep_node_address=127.0.0.1:{group_port}\n\
                 wsrep_provider_options=\"gmcast.listen_addr=tcp://127.0.0.1:{group_port};\
                 ist.recv_addr=127.0.0.1:{ist};gcache.size=64M;\
                 evs.suspect_timeout=PT2S;evs.inactive_timeout=PT3S;\
                 evs.inactive_check_period=PT0.5S;evs.keepalive_period=PT0.5S\"\n\
                 wsrep_sst_receive_address=127.0.0.1:{sst}\nwsrep_sst_method=rsync\n",
                data = path_str(&dir.join("data"))?,
                dir = path_str(&dir)?,
            );
            std::fs::write(dir.join("my.cnf"), config)?;
            galera.nodes.push(Node {
                dir,
                port,
                child: None,
            });
        }
        // Once every node's configuration is written, the whole tree is given to the user.
        run_as.own(&root)?;
        for n in 0..3 {
            galera.start_node(n, n == 0)?;
        }
        galera
            .sql(
                0,
                &format!(
                    "CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'; \
                 GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'127.0.0.1' WITH GRANT OPTION;"
                ),
            )
            .context("creating the test account")?;
        Ok(galera)
    }

    fn start_node(&mut self, n: usize, bootstrap: bool) -> Result<()> {
        let node = &self.nodes[n];
        let data = node.dir.join("data");
        if !data.exists() {
            cmd::output(
                self.run_as
                    .command(INSTALL_DB, &node.dir)
                    .args([
                        "--no-defaults",
                        "--skip-test-db",
                        "--auth-root-authentication-method=socket",
                    ])
                    .arg(format!("--datadir={}", path_str(&data)?))
                    .arg(format!("--user={}", self.user)),
            )
            .with_context(|| format!("mariadb-install-db for node {}", n + 1))?;
        }
        let config = node.dir.join("my.cnf");
        let mut command = self.run_as.command(SERVER, &node.dir);
        command.arg(format!("--defaults-file={}", path_str(&config)?));
        if bootstrap {
            command.arg("--wsrep-new-cluster");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting node {}", n + 1))?;
        self.nodes[n].child = Some(child);
        let synced = wait_until(Duration::from_secs(90), || {
            self.sql(n, "SHOW STATUS LIKE 'wsrep_local_state_comment'")
                .is_ok_and(|out| out.contains("Synced"))
        });
        if let Err(error) = synced {
            let log =
                std::fs::read_to_string(self.nodes[n].dir.join("error.log")).unwrap_or_default();
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            bail!(
                "Galera node {} did not sync: {error:#}\n{}",
                n + 1,
                tail.join("\n")
            );
        }
        Ok(())
    }

    /// Kills node `n`'s server with SIGKILL, as a crash or an out-of-memory kill would.
    pub(crate) fn kill_node(&mut self, n: usize) -> Result<()> {
        let node = &mut self.nodes[n];
        let pid = std::fs::read_to_string(node.dir.join("mariadb.pid"))
            .with_context(|| format!("node {}'s pid file", n + 1))?;
        cmd::output(Command::new("kill").args(["-KILL", pid.trim()]))?;
        if let Some(mut child) = node.child.take() {
            child.wait()?;
        }
        Ok(())
    }

    /// Starts node `n` again after [`kill_node`](Self::kill_node): it recovers its position and
    /// rejoins the cluster by state transfer; returns once it is synced.
    pub(crate) fn restart_node(&mut self, n: usize) -> Result<()> {
        self.start_node(n, false)
    }

    /// Whether node `n`'s server runs (it was not killed, or was restarted).
    pub(crate) fn is_running(&self, n: usize) -> bool {
        self.nodes[n].child.is_some()
    }

    /// Node `n`'s client port.
    pub(crate) fn port(&self, n: usize) -> u16 {
        self.nodes[n].port
    }

    /// Node `n`'s URL for `database`.
    pub(crate) fn url(&self, n: usize, database: &str) -> String {
        format!(
            "mysql://{USER}:{PASSWORD}@127.0.0.1:{}/{database}",
            self.nodes[n].port
        )
    }

    /// Runs `statement` on node `n` with the command-line client; its tab-separated output.
    pub(crate) fn sql(&self, n: usize, statement: &str) -> Result<String> {
        let node = &self.nodes[n];
        cmd::output(
            self.run_as
                .command(CLIENT, &node.dir)
                .arg("--no-defaults")
                .arg(format!(
                    "--socket={}",
                    node.dir.join("mariadb.sock").display()
                ))
                .arg(format!("--user={}", self.user))
                .args(["-N", "-e", statement]),
        )
    }

    /// The number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The nodes' URLs (`mysql://user:password@127.0.0.1:PORT`), comma-separated.
    pub(crate) fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for Galera {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // Stopped in reverse order, so that the bootstrap node leaves last.
        for node in self.nodes.iter_mut().rev() {
            let pid_file = node.dir.join("mariadb.pid");
            if terminate_by_pid_file(&pid_file) {
                let _ = wait_until(Duration::from_secs(30), || !pid_file.exists());
            }
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            eprintln!("xtask: removing {} failed: {error}", self.root.display());
        }
    }
}

// --- the development cluster ------------------------------------------------------------------

fn dev_root() -> PathBuf {
    std::env::temp_dir().join("grpc-safe-retries-dev-galera")
}

/// `cargo xtask galera start`: a cluster that outlives the command; prints the nodes' URLs.
pub(crate) fn dev_start() -> Result<()> {
    let root = dev_root();
    if root.join("urls").is_file() {
        bail!("a development Galera cluster is already running; `cargo xtask galera stop` first");
    }
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let mut cluster = Galera::start_in(root.clone())?;
    // The nodes outlive this command: their processes are not waited for, and `stop` ends them
    // by their pid files.
    for node in &mut cluster.nodes {
        drop(node.child.take());
    }
    cluster.keep = true;
    // Created on node 1, replicated to the others.
    cluster.sql(0, &format!("CREATE DATABASE IF NOT EXISTS {DEV_DATABASE}"))?;
    let urls = (0..cluster.len())
        .map(|n| cluster.url(n, DEV_DATABASE))
        .collect::<Vec<_>>()
        .join(",");
    std::fs::write(root.join("urls"), &urls)?;
    println!("{urls}");
    eprintln!("xtask: development Galera cluster started; stop it with `cargo xtask galera stop`");
    Ok(())
}

/// `cargo xtask galera stop`: stops the development cluster and removes its files.
pub(crate) fn dev_stop() -> Result<()> {
    let root = dev_root();
    if !root.exists() {
        eprintln!("xtask: no development Galera cluster is running");
        return Ok(());
    }
    let nodes = (1..=3)
        .map(|n| Node {
            dir: root.join(format!("node{n}")),
            port: 0,
            child: None,
        })
        .collect();
    // Dropping stops the nodes by their pid files and runs nothing as the servers' user, so
    // neither `run_as` nor `user` matters here.
    drop(Galera {
        root,
        nodes,
        run_as: ServerUser::Invoker,
        user: String::new(),
        keep: false,
    });
    eprintln!("xtask: development Galera cluster stopped and removed");
    Ok(())
}

/// `cargo xtask galera urls`: the development cluster's node URLs, comma-separated.
pub(crate) fn dev_urls() -> Result<()> {
    let urls = std::fs::read_to_string(dev_root().join("urls"))
        .context("no development Galera cluster; `cargo xtask galera start` first")?;
    println!("{urls}");
    Ok(())
}
