//! `cargo xtask semver`: cargo-semver-checks (crates.io) on every publishable library crate of the
//! workspace, against the baseline recorded in `docs/semver-baseline`: the commit whose public API
//! the next release is judged against (the last release's, once there is one). A change that
//! breaks a user of that API and is released without the version bump the versioning policy of
//! `CHANGELOG.md` asks for fails here.
//!
//! Not part of `cargo xtask test`: it builds the rustdoc of every library crate twice (the
//! baseline's and the tree's), about a quarter of an hour on this machine's two cores. It runs
//! before each version bump, and the baseline moves to the released commit after it.

use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// The cargo-semver-checks release the check is made with, installed when missing.
const CARGO_SEMVER_CHECKS: &str = "0.51.0";

/// The file that records the baseline commit.
const BASELINE_FILE: &str = "docs/semver-baseline";

/// Checks the tree against the recorded baseline.
pub(crate) fn check(interrupted: &AtomicBool) -> Result<()> {
    let baseline = recorded_baseline()?;
    cmd::cargo_tool("semver-checks", CARGO_SEMVER_CHECKS, &[], interrupted)?;
    eprintln!("xtask: the public API of the library crates against {baseline} ({BASELINE_FILE})");
    // `--workspace` checks the packages that may be published: apps, tests and benches are
    // `publish = false` and are left out.
    cmd::cargo(
        &[
            "semver-checks",
            "check-release",
            "--workspace",
            "--baseline-rev",
            &baseline,
        ],
        &[],
        interrupted,
    )
}

/// The baseline commit: the first line of [`BASELINE_FILE`] that is not a comment, 40 hex digits.
fn recorded_baseline() -> Result<String> {
    let path = crate::kit::repository_root().join(BASELINE_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {BASELINE_FILE}"))?;
    parse_baseline(&text)
}

fn parse_baseline(text: &str) -> Result<String> {
    let Some(line) = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
    else {
        bail!("{BASELINE_FILE} names no commit");
    };
    if line.len() != 40 || !line.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        bail!("{BASELINE_FILE}: {line:?} is not a 40-digit commit id");
    }
    Ok(line.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_baseline_is_a_commit_of_this_repository() {
        let baseline = recorded_baseline().unwrap();
        let root = crate::kit::repository_root();
        let kind = cmd::output(
            std::process::Command::new("git")
                .current_dir(&root)
                .args(["cat-file", "-t", &baseline]),
        )
        .expect("the baseline is in this repository's history");
        assert_eq!(kind.trim(), "commit");
    }

    #[test]
    fn a_baseline_is_forty_hex_digits_after_the_comments() {
        let commit = "d3bd758f".repeat(5);
        assert_eq!(
            parse_baseline(&format!("# the last release\n\n{commit}\n")).unwrap(),
            commit
        );
        assert!(parse_baseline("# nothing\n").is_err());
        assert!(parse_baseline("main\n").is_err());
    }
}
