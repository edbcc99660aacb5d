//! Running child commands so that an interrupt still lets the caller clean up.

use std::process::{Command, Stdio};
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

/// Runs `cargo` with the given arguments and extra environment, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)], interrupted: &AtomicBool) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args(args);
    for (key, value) in env {
        command.env(key, value);
    }
    run(&mut command, interrupted)
}

/// Runs a command with inherited output; kills it if an interrupt arrives.
pub(crate) fn run(command: &mut Command, interrupted: &AtomicBool) -> Result<()> {
    let shown = format!("{command:?}");
    eprintln!("xtask: $ {shown}");
    let mut child = command
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
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

/// Like [`cargo`], but also returns the child's stdout, which is still shown as it comes.
pub(crate) fn cargo_tee(
    args: &[&str],
    env: &[(&str, &str)],
    interrupted: &AtomicBool,
) -> Result<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args(args).stdout(Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let shown = format!("{command:?}");
    eprintln!("xtask: $ {shown}");
    let mut child = command
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
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
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if interrupted.load(Ordering::SeqCst) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("interrupted while running {shown}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let seen = reader.join().unwrap_or_default();
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(seen)
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
