//! The guide's "From an empty crate" kit (`docs/guide/src/adoption.md`), checked as a newcomer
//! would use it: every block marked
//! `<!-- kit: PATH -->` is written to PATH in a crate outside the workspace, the option's `.proto`
//! is copied where the chapter says, and the crate is built and run. Only the path of this
//! repository (the chapter's `../grpc-safe-retries`) is rewritten; nothing else of the text is.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Where the kit's paths say this repository is, relative to the new crate.
const REPOSITORY: &str = "../grpc-safe-retries";

/// The guide's chapter that holds the kit.
const CHAPTER: &str = "docs/guide/src/adoption.md";

/// The files the kit must have.
const FILES: [&str; 4] = [
    "Cargo.toml",
    "build.rs",
    "src/main.rs",
    "proto/your/v1/orders.proto",
];

/// Each `<!-- kit: PATH -->` marker's path and the fenced block that follows it.
pub(crate) fn blocks(readme: &str) -> Result<Vec<(String, String)>> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        let Some(path) = line
            .trim()
            .strip_prefix("<!-- kit: ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        if !fence.starts_with("```") {
            bail!("the kit block {path} does not start with a fence right after its marker");
        }
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        blocks.push((path.to_owned(), body.join("\n") + "\n"));
    }
    for file in FILES {
        if !blocks.iter().any(|(path, _)| path == file) {
            bail!("the guide's kit has no block for {file}");
        }
    }
    Ok(blocks)
}

/// Writes the kit beside a stand-in for this repository, builds it and runs it.
pub(crate) fn check(root: &Path, interrupted: &AtomicBool) -> Result<String> {
    let readme = std::fs::read_to_string(root.join(CHAPTER)).context(CHAPTER)?;
    let base = std::env::temp_dir().join(format!("grpc-safe-retries-kit-{}", std::process::id()));
    let krate = base.join("your-orders");
    let _ = std::fs::remove_dir_all(&base);
    for (path, text) in blocks(&readme)? {
        let text = text.replace(REPOSITORY, &root.display().to_string());
        let file = krate.join(&path);
        std::fs::create_dir_all(file.parent().expect("a file in a directory"))?;
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    // The chapter's copy step.
    let options = Path::new("proto/grpc_safe_retries/v1/options.proto");
    std::fs::create_dir_all(krate.join(options.parent().expect("a directory")))?;
    std::fs::copy(
        root.join("crates/grpc-policy").join(options),
        krate.join(options),
    )
    .context("copying the option's .proto")?;
    // The workspace's lock, so the kit builds with the versions the workspace was tested with
    // (and reuses their builds in the shared target directory).
    std::fs::copy(root.join("Cargo.lock"), krate.join("Cargo.lock"))?;
    let manifest = krate.join("Cargo.toml");
    let target = root.join("target");
    let output = cmd::cargo_tee(
        &[
            "run",
            "--quiet",
            "--manifest-path",
            &manifest.display().to_string(),
        ],
        &[("CARGO_TARGET_DIR", &target.display().to_string())],
        interrupted,
    )
    .context("the guide's kit, built and run as a new crate")?;
    let _ = std::fs::remove_dir_all(&base);
    Ok(output)
}

/// The repository this xtask belongs to.
pub(crate) fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the repository")
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guide_has_every_file_of_the_kit() {
        let readme = std::fs::read_to_string(repository_root().join(CHAPTER)).unwrap();
        let blocks = blocks(&readme).unwrap();
        let cargo = &blocks
            .iter()
            .find(|(path, _)| path == "Cargo.toml")
            .unwrap()
            .1;
        assert!(
            cargo.contains(REPOSITORY),
            "the kit's dependencies name the repository"
        );
        assert!(
            !cargo.contains("workspace = true"),
            "a new crate has no workspace to inherit"
        );
    }

    /// The adoption section's first handler is the one `examples/guard_on_your_service.rs` runs
    /// (two payments from one account, a replay, a refusal, a business failure replayed): the
    /// README cannot teach a handler that was only compiled.
    #[test]
    fn the_readme_handler_is_the_one_the_example_runs() {
        let root = repository_root();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let example = std::fs::read_to_string(
            root.join("crates/grpc-ledger-demo/examples/guard_on_your_service.rs"),
        )
        .unwrap();
        let handler = |text: &str| -> String {
            let start = text
                .find("impl GuardedHandler<DatabaseTransaction> for CreatePayment {")
                .expect("the CreatePayment handler");
            let end = text[start..].find("\n}\n").expect("the impl's end") + start;
            text[start..end].to_owned()
        };
        assert_eq!(
            handler(&readme),
            handler(&example),
            "the README's CreatePayment handler differs from the example's: copy one to the other"
        );
    }
}
