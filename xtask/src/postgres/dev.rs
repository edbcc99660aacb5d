//! The development cluster of `cargo xtask pg start|stop|url`: one that outlives the command,
//! under the target directory, for running single tests by hand.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Cluster, DURABLE_SETTINGS, TEST_SETTINGS, bin_dir};
use crate::cmd;
use crate::server_process::ServerUser;

fn dev_root() -> PathBuf {
    cmd::target_dir()
        .unwrap_or_else(|_| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
        .join("xtask")
        .join("pg")
}

/// Reattaches to the development cluster's directory without starting anything.
fn dev_cluster() -> Result<Option<(Cluster, u16)>> {
    let root = dev_root();
    let Ok(port) = std::fs::read_to_string(root.join("port")) else {
        return Ok(None);
    };
    let port: u16 = port
        .trim()
        .parse()
        .context("reading the development cluster's port")?;
    let cluster = Cluster {
        bin: bin_dir()?,
        root: std::fs::canonicalize(&root)?,
        // The cluster's user exists already (the cluster was started with it), so nothing is
        // created here, unlike `Cluster::prepare`.
        user: ServerUser::current()?,
        url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        throwaway: false,
    };
    Ok(Some((cluster, port)))
}

pub(crate) fn dev_start(durable: bool) -> Result<()> {
    if let Some((cluster, _)) = dev_cluster()? {
        if cluster.is_running() {
            println!("{}", cluster.url);
            return Ok(());
        }
        // A stale directory from a stopped or crashed cluster: start afresh.
        std::fs::remove_dir_all(&cluster.root)?;
    }
    let root = dev_root();
    std::fs::create_dir_all(&root)?;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
    let root = std::fs::canonicalize(root)?;
    let settings = if durable {
        DURABLE_SETTINGS
    } else {
        TEST_SETTINGS
    };
    let cluster = Cluster::start(root, settings, false)?;
    eprintln!("xtask: development PostgreSQL started; stop it with `cargo xtask pg stop`");
    println!("{}", cluster.url);
    Ok(())
}

pub(crate) fn dev_stop() -> Result<()> {
    match dev_cluster()? {
        Some((mut cluster, _)) => {
            // Dropping a throwaway cluster stops it and removes its directory.
            cluster.throwaway = true;
            drop(cluster);
            eprintln!("xtask: development PostgreSQL stopped and removed");
        }
        None => eprintln!("xtask: no development PostgreSQL to stop"),
    }
    Ok(())
}

pub(crate) fn dev_url() -> Result<()> {
    match dev_cluster()? {
        Some((cluster, _)) if cluster.is_running() => {
            println!("{}", cluster.url);
            Ok(())
        }
        _ => bail!("no development PostgreSQL is running; start one with `cargo xtask pg start`"),
    }
}
