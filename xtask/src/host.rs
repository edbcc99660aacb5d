//! What every local server xtask starts needs of the machine: a free loopback port, a private
//! scratch directory, a bounded wait for readiness, Debian's packages, and whether this process is
//! root.
//!
//! Not for running a server's processes as the unprivileged user (that is
//! [`crate::server_process`]).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

use crate::cmd;

pub(crate) fn path_str(path: &Path) -> Result<&str> {
    path.to_str().context("path is not UTF-8")
}

pub(crate) fn running_as_root() -> Result<bool> {
    // The owner of /proc/self is the effective user of this process.
    Ok(std::fs::metadata("/proc/self")?.uid() == 0)
}

pub(crate) fn free_loopback_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

pub(crate) fn fresh_temp_dir() -> Result<PathBuf> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let dir = std::env::temp_dir().join(format!("xtask-pg-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok(dir)
}

pub(crate) fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("not ready after {limit:?}")
}

/// Installs Debian's `packages` when any of `required` is missing, if this process may (root);
/// otherwise says which file is missing and what to install.
pub(crate) fn install_if_missing(required: &[&str], packages: &[&str], why: &str) -> Result<()> {
    let Some(missing) = required
        .iter()
        .find(|file| !std::path::Path::new(file).is_file())
    else {
        return Ok(());
    };
    if !running_as_root()? {
        bail!(
            "{missing} is missing; install Debian's {}",
            packages
                .iter()
                .map(|package| format!("`{package}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    apt_install(packages, why)
}

/// Installs Debian `packages` with apt-get, saying first what and `why`; refreshes the package
/// lists and tries again when the first attempt fails (a machine whose lists are stale or empty).
/// Only for a process running as root; callers check.
pub(crate) fn apt_install(packages: &[&str], why: &str) -> Result<()> {
    eprintln!(
        "xtask: installing Debian's {} with apt-get ({why})",
        packages.join(", ")
    );
    let install = || {
        cmd::output(
            Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends"])
                .args(packages)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    install()
        .or_else(|_| {
            cmd::output(Command::new("apt-get").arg("update"))?;
            install()
        })
        .with_context(|| format!("installing {}", packages.join(", ")))?;
    Ok(())
}
