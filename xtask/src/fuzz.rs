//! `cargo xtask fuzz [--seconds N]`: runs every cargo-fuzz target for N seconds (default 60),
//! seeded from `fuzz/seeds`, installing cargo-fuzz when it is missing.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};

use crate::cmd;

const TARGETS: [&str; 4] = ["service_config", "method", "key", "request_fingerprint"];

pub(crate) fn fuzz(seconds: u64, interrupted: &AtomicBool) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let installed = Command::new(&cargo)
        .args(["fuzz", "--version"])
        .output()
        .map(|out| out.status.success())
        .unwrap_or(false);
    if !installed {
        cmd::cargo(&["install", "cargo-fuzz", "--locked"], &[], interrupted)
            .context("installing cargo-fuzz")?;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("fuzz");
    for target in TARGETS {
        let corpus = format!("corpus/{target}");
        let seeds = format!("seeds/{target}");
        std::fs::create_dir_all(dir.join(&corpus))?;
        let mut command = Command::new(&cargo);
        command
            .current_dir(&dir)
            .args(["fuzz", "run", target, &corpus, &seeds, "--"])
            .arg(format!("-max_total_time={seconds}"))
            // cargo-fuzz builds with -Zsanitizer=address; this lets the stable toolchain of these
            // machines (the only one they can have) accept it.
            .env("RUSTC_BOOTSTRAP", "1");
        if let Err(error) = cmd::run(&mut command, interrupted) {
            bail!(
                "fuzz target {target} failed: {error:#}\nthe crashing input is under fuzz/artifacts/{target}; \
                 fix the parser and keep the input in fuzz/regressions/{target}, which every \
                 `cargo xtask test` replays"
            );
        }
        eprintln!("xtask: fuzz target {target}: no crash in {seconds} s");
    }
    Ok(())
}
