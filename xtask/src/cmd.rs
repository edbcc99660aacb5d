//! Running child commands so that an interrupt still lets the caller clean up.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Set when SIGINT or SIGTERM arrives. The handler only records the signal: the running child is
/// then killed by [`run`] and every guard's `Drop` (the PostgreSQL cluster's above all) still runs.
pub(crate) fn install_interrupt_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&flag);
    ctrlc::set_handler(move || setter.store(true, Ordering::SeqCst))
        .context("installing the interrupt handler")?;
    Ok(flag)
}

/// A `cargo` command (the one running xtask) with the given arguments and extra environment.
pub(crate) fn cargo_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// Runs `cargo` with the given arguments and extra environment, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)], interrupted: &AtomicBool) -> Result<()> {
    run(&mut cargo_command(args, env), interrupted)
}

/// Like [`cargo`], but also returns the child's stdout, which is still shown as it comes.
pub(crate) fn cargo_tee(
    args: &[&str],
    env: &[(&str, &str)],
    interrupted: &AtomicBool,
) -> Result<String> {
    let mut command = cargo_command(args, env);
    let (mut child, shown) = spawn(command.stdout(Stdio::piped()))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let reader = std::thread::spawn(move || {
        let mut seen = String::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            println!("{line}");
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    });
    wait(child, &shown, interrupted)?;
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("reading the output of {shown} failed"))
}

/// Runs a command with inherited output; kills it if an interrupt arrives.
pub(crate) fn run(command: &mut Command, interrupted: &AtomicBool) -> Result<()> {
    let (child, shown) = spawn(command)?;
    wait(child, &shown, interrupted)
}

fn spawn(command: &mut Command) -> Result<(Child, String)> {
    let shown = format!("{command:?}");
    eprintln!("xtask: $ {shown}");
    let child = command
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    Ok((child, shown))
}

/// Waits for `child`, failing on a non-zero exit; kills it if an interrupt arrives.
fn wait(mut child: Child, shown: &str, interrupted: &AtomicBool) -> Result<()> {
    loop {
        if let Some(status) = child.try_wait()? {
            if status.success() {
                return Ok(());
            }
            bail!("{shown} failed with {status}");
        }
        if interrupted.load(Ordering::SeqCst) {
            // The child may already have died of the same signal; killing it twice is harmless.
            let _ = child.kill();
            let _ = child.wait();
            bail!("interrupted while running {shown}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a command to completion, capturing its output; fails with its stderr on a non-zero exit.
pub(crate) fn output(command: &mut Command) -> Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `cargo metadata` of the workspace's own packages (no dependencies), as JSON.
pub(crate) fn workspace_metadata() -> Result<String> {
    output(&mut cargo_command(
        &["metadata", "--format-version", "1", "--no-deps"],
        &[],
    ))
    .context("cargo metadata")
}

/// Where cargo puts build output: `cargo metadata` knows (`CARGO_TARGET_DIR`, `build.target-dir`
/// in any config file, or the workspace's `target`), so xtask never guesses.
pub(crate) fn target_dir() -> Result<std::path::PathBuf> {
    let metadata = workspace_metadata()?;
    let key = "\"target_directory\":\"";
    let start = metadata
        .find(key)
        .map(|at| at + key.len())
        .context("cargo metadata names no target directory")?;
    let end = metadata[start..]
        .find('"')
        .map(|len| start + len)
        .context("cargo metadata's target directory is cut short")?;
    Ok(std::path::PathBuf::from(
        metadata[start..end].replace("\\\\", "\\"),
    ))
}

/// A cargo subcommand from crates.io (`cargo-{name}`, version `version`), installed with
/// `cargo install --locked` and `extra` when `cargo {name} --version` does not answer with that
/// version, saying so: the tools the xtask commands run are pinned, like the workspace's
/// dependencies.
pub(crate) fn cargo_tool(
    name: &str,
    version: &str,
    extra: &[&str],
    interrupted: &AtomicBool,
) -> Result<()> {
    let installed = output(&mut cargo_command(&[name, "--version"], &[]))
        .is_ok_and(|answer| answer.contains(version));
    if installed {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-{name} {version} from crates.io (cargo install)");
    let package = format!("cargo-{name}");
    let mut args = vec![
        "install",
        package.as_str(),
        "--locked",
        "--version",
        version,
    ];
    args.extend_from_slice(extra);
    cargo(&args, &[], interrupted)
}
