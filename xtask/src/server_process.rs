//! How xtask runs the processes of every local server it starts (PostgreSQL, MariaDB, Galera's
//! nodes, PgBouncer): as an unprivileged system user, through `runuser`, when xtask runs as root
//! (PostgreSQL and MariaDB refuse root), and directly as the invoking user otherwise; with the
//! server's directory owned by that user, and stopped by the pid in its pid file.
//!
//! Not for finding, installing or configuring the servers (their own modules do that), nor for
//! clients that reach a server over TCP (they need none of its files and run as the invoker), nor
//! for the machine's other needs (ports, scratch directories: [`crate::host`]).

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::cmd;
use crate::host::{path_str, running_as_root};

/// The unprivileged system user that runs the servers when xtask runs as root.
const UNPRIVILEGED_USER: &str = "grpc-ledger-pg";

/// Who runs the servers this process starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerUser {
    /// xtask runs as root: servers run as [`UNPRIVILEGED_USER`], through `runuser -u USER --`.
    Unprivileged,
    /// xtask runs as an ordinary user: servers run as that user, started directly.
    Invoker,
}

impl ServerUser {
    /// Who runs the servers of this process; when it runs as root, the unprivileged user, created
    /// first when missing.
    pub(crate) fn prepare() -> Result<Self> {
        if running_as_root()? {
            ensure_system_user()?;
            Ok(Self::Unprivileged)
        } else {
            Ok(Self::Invoker)
        }
    }

    /// Like [`prepare`](Self::prepare), but creates nothing: for reattaching to a server that an
    /// earlier command started (and so whose user exists already).
    pub(crate) fn current() -> Result<Self> {
        Ok(if running_as_root()? {
            Self::Unprivileged
        } else {
            Self::Invoker
        })
    }

    /// Gives `dir` and everything under it to the unprivileged user (`chown -R`), so that a server
    /// run through runuser can write there; nothing to do for the invoker, who owns it already.
    pub(crate) fn own(self, dir: &Path) -> Result<()> {
        if self == Self::Unprivileged {
            cmd::output(Command::new("chown").args([
                "-R",
                &format!("{UNPRIVILEGED_USER}:"),
                path_str(dir)?,
            ]))?;
        }
        Ok(())
    }

    /// A command for `program` run as this user (`runuser -u USER -- PROGRAM` for the
    /// unprivileged user, `PROGRAM` for the invoker), in `dir`: the unprivileged user may not be
    /// able to enter the caller's working directory. Every copy this replaced used this same
    /// form and added no environment; runuser passes the caller's on, setting only HOME, SHELL,
    /// USER and LOGNAME for the user.
    pub(crate) fn command(self, program: impl AsRef<OsStr>, dir: &Path) -> Command {
        let mut command = match self {
            Self::Unprivileged => {
                let mut command = Command::new("runuser");
                command.args(["-u", UNPRIVILEGED_USER, "--"]).arg(program);
                command
            }
            Self::Invoker => Command::new(program),
        };
        command.current_dir(dir);
        command
    }

    /// The user's login name (MariaDB's `--user` takes it).
    pub(crate) fn name(self) -> Result<String> {
        match self {
            Self::Unprivileged => Ok(UNPRIVILEGED_USER.to_owned()),
            Self::Invoker => {
                let name = cmd::output(Command::new("id").arg("-un"))?;
                Ok(name.trim().to_owned())
            }
        }
    }
}

/// Creates [`UNPRIVILEGED_USER`] when it does not exist (only root may).
fn ensure_system_user() -> Result<()> {
    let exists = Command::new("id")
        .args(["-u", UNPRIVILEGED_USER])
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    if !exists {
        eprintln!(
            "xtask: creating system user {UNPRIVILEGED_USER} to run PostgreSQL (it refuses root)"
        );
        cmd::output(Command::new("useradd").args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            UNPRIVILEGED_USER,
        ]))?;
    }
    Ok(())
}

/// Sends SIGTERM to the server whose pid `pid_file` holds; whether the file was there (a failed
/// `kill` is ignored: the server may be gone already). A server started through runuser is
/// runuser's child, so killing the spawned [`std::process::Child`] would end only runuser; the
/// pid file names the server itself.
pub(crate) fn terminate_by_pid_file(pid_file: &Path) -> bool {
    let Ok(pid) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    let _ = Command::new("kill").args(["-TERM", pid.trim()]).status();
    true
}
