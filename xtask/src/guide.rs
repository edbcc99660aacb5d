//! `cargo xtask guide`: the guide (`docs/guide`), built with mdBook into `target/guide`. mdBook
//! comes from crates.io, installed when missing (said aloud); the Rust blocks of the chapters are
//! compiled by the doc tests of `grpc-ledger-demo`, so the build here checks the book's structure
//! (every chapter of the summary exists, no chapter outside it).

use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// The mdBook release the guide is built with.
const MDBOOK: &str = "0.5.4";

/// Builds the guide; fails on a chapter the summary names and the tree lacks, or the reverse.
pub(crate) fn build(interrupted: &AtomicBool) -> Result<()> {
    let root = crate::kit::repository_root();
    let book = root.join("docs").join("guide");
    check_summary(&book.join("src"))?;
    let mdbook = installed(interrupted)?;
    let mut command = std::process::Command::new(mdbook);
    command.arg("build").arg(&book);
    cmd::run(&mut command, interrupted).context("mdbook build")?;
    eprintln!(
        "xtask: the guide is at {}",
        root.join("target/guide/index.html").display()
    );
    Ok(())
}

/// The mdbook binary, installed with `cargo install` (without its server, watcher and search
/// index) when it is not there.
fn installed(interrupted: &AtomicBool) -> Result<std::path::PathBuf> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".cargo")))
        .context("no CARGO_HOME or HOME")?;
    let mdbook = cargo_home.join("bin").join("mdbook");
    let current = std::process::Command::new(&mdbook)
        .arg("--version")
        .output()
        .ok()
        .filter(|out| String::from_utf8_lossy(&out.stdout).contains(MDBOOK));
    if current.is_none() {
        eprintln!(
            "xtask: installing mdbook {MDBOOK} from crates.io (cargo install, without its server, \
             watcher and search)"
        );
        cmd::cargo(
            &[
                "install",
                "mdbook",
                "--locked",
                "--version",
                MDBOOK,
                "--no-default-features",
            ],
            &[],
            interrupted,
        )?;
    }
    Ok(mdbook)
}

/// Every chapter `SUMMARY.md` links exists, and every chapter file is linked from it.
fn check_summary(src: &std::path::Path) -> Result<()> {
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).context("SUMMARY.md")?;
    let linked = chapters_linked(&summary);
    let mut problems = Vec::new();
    for chapter in &linked {
        if !src.join(chapter).exists() {
            problems.push(format!("SUMMARY.md links {chapter}, which does not exist"));
        }
    }
    for entry in std::fs::read_dir(src)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" && !linked.contains(&name) {
            problems.push(format!("{name} is in no chapter of SUMMARY.md"));
        }
    }
    if !problems.is_empty() {
        bail!("the guide's summary: {}", problems.join("; "));
    }
    Ok(())
}

/// The files `summary` links, in its order (`[title](file.md)`).
fn chapters_linked(summary: &str) -> Vec<String> {
    summary
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')'))
        .map(|(target, _)| target.to_owned())
        .filter(|target| target.ends_with(".md"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guides_summary_and_its_chapters_agree() {
        let src = crate::kit::repository_root().join("docs/guide/src");
        check_summary(&src).unwrap();
        assert!(
            chapters_linked(&std::fs::read_to_string(src.join("SUMMARY.md")).unwrap()).len() >= 10
        );
    }

    #[test]
    fn a_summary_is_read_for_its_links() {
        let summary = "# Summary\n\n[Intro](introduction.md)\n\n- [A](a.md)\n- [B](b.md)\n";
        assert_eq!(
            chapters_linked(summary),
            ["introduction.md", "a.md", "b.md"]
        );
    }
}
