//! `cargo xtask package`: `cargo package` (verified: each crate built from its packaged files
//! alone, against the others as packaged) for every library crate the workspace may publish, the
//! ones whose manifest does not say `publish = false`. Not part of `cargo xtask test` (about four
//! minutes here after a full build, most of it building the packaged crates again); it runs
//! before each version bump, with `cargo xtask semver`.

use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// Packages and verifies every publishable crate.
pub(crate) fn check(interrupted: &AtomicBool) -> Result<()> {
    let publishable = publishable(&cmd::workspace_metadata()?)?;
    if publishable.is_empty() {
        bail!("no crate of the workspace may be published");
    }
    eprintln!("xtask: packaging {}", publishable.join(", "));
    let mut args = vec!["package"];
    for name in &publishable {
        args.extend(["--package", name.as_str()]);
    }
    cmd::cargo(&args, &[], interrupted)
}

/// The names of the workspace's packages that may be published, from `cargo metadata`: `publish`
/// is `null` (anywhere) or a list of registries, `[]` for `publish = false`.
fn publishable(metadata: &str) -> Result<Vec<String>> {
    let value: serde_json::Value = serde_json::from_str(metadata).context("cargo metadata")?;
    let packages = value["packages"]
        .as_array()
        .context("cargo metadata lists no packages")?;
    let mut names: Vec<String> = packages
        .iter()
        .filter(|package| {
            package["publish"]
                .as_array()
                .is_none_or(|registries| !registries.is_empty())
        })
        .filter_map(|package| package["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The crates that package are exactly the library crates the README's table lists, apps,
    /// benches, tests and examples staying `publish = false`.
    #[test]
    fn the_publishable_crates_are_the_library_crates() {
        assert_eq!(
            publishable(&cmd::workspace_metadata().unwrap()).unwrap(),
            [
                "grpc-core-api",
                "grpc-ledger-cli",
                "grpc-ledger-contract-tests",
                "grpc-operation-ledger-memory",
                "grpc-operation-ledger-seaorm",
                "grpc-policy",
                "grpc-retry-lint",
                "grpc-tonic",
            ]
        );
    }

    #[test]
    fn publish_false_is_an_empty_list_and_null_is_anywhere() {
        let metadata = r#"{"packages":[
            {"name":"b","publish":null},{"name":"a","publish":[]},{"name":"c","publish":["mine"]}]}"#;
        assert_eq!(publishable(metadata).unwrap(), ["b", "c"]);
    }
}
