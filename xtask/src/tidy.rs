//! Tidy checks: ordinary tests that keep the workspace's rules true at every commit.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn workspace_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives in the workspace root")
            .to_path_buf()
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() && name != "target" && name != ".git" {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                out.push(path);
            }
        }
    }

    /// Every normal dependency of `package` with its enabled features, one `name features` line each.
    fn dependency_tree(package: &str) -> Vec<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .current_dir(workspace_root())
            .args([
                "tree",
                "--package",
                package,
                "--edges",
                "normal",
                "--prefix",
                "none",
            ])
            .args(["--format", "{p} [{f}]", "--all-features"])
            .output()
            .expect("cargo tree runs");
        assert!(
            out.status.success(),
            "cargo tree failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Whether `name` (a crate in a dependency tree) is a database driver or ORM.
    fn is_database_crate(name: &str) -> bool {
        ["tokio-postgres", "rusqlite", "mysql_async"].contains(&name)
            || name.starts_with("sea-orm")
            || name.starts_with("sea-query")
            || name.starts_with("sqlx")
    }

    /// docs/architecture.md: the core, the policy, the tonic adapter, the lint and the contract
    /// suite name no database (only the SeaORM adapter, and the applications built on it, do).
    #[test]
    fn only_the_storage_adapter_and_its_applications_name_a_database() {
        for package in [
            "grpc-core-api",
            "grpc-policy",
            "grpc-tonic",
            "grpc-retry-lint",
            "grpc-ledger-contract-tests",
        ] {
            let tree = dependency_tree(package);
            assert!(
                tree.len() > 1,
                "{package}: cargo tree printed nothing useful"
            );
            for line in &tree {
                let name = line.split_whitespace().next().unwrap_or_default();
                assert!(
                    !is_database_crate(name),
                    "{package} depends on the database crate {line}"
                );
            }
        }
        let adapter = dependency_tree("grpc-operation-ledger-seaorm");
        assert!(
            adapter.iter().any(|line| line.starts_with("sea-orm ")),
            "the check itself still sees sea-orm where it is"
        );
    }

    /// docs/architecture.md: the core and the policy pull in no tokio runtime.
    #[test]
    fn pure_crates_pull_in_no_tokio_runtime() {
        for package in ["grpc-core-api", "grpc-policy"] {
            for line in dependency_tree(package) {
                if line.split_whitespace().next() == Some("tokio") {
                    let features = line.rsplit('[').next().unwrap_or_default();
                    assert!(
                        !features
                            .trim_end_matches(']')
                            .split(',')
                            .any(|f| f == "rt" || f == "rt-multi-thread"),
                        "{package} pulls in tokio's runtime: {line}"
                    );
                }
            }
        }
    }

    /// docs/architecture.md: in the contract suite stores differ only by capability, never by
    /// name: no case's code names a store (comments may, as examples).
    #[test]
    fn the_contract_cases_name_no_store() {
        let dir = workspace_root().join("crates/grpc-ledger-contract-tests/src/cases");
        let mut read = 0;
        for file in std::fs::read_dir(&dir).expect("the cases directory") {
            let path = file.expect("a directory entry").path();
            let text = std::fs::read_to_string(&path).expect("a case file readable");
            read += 1;
            for (number, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default().to_lowercase();
                for store in ["postgres", "sqlite", "mariadb", "mysql", "galera"] {
                    assert!(
                        !code.contains(store),
                        "{}:{}: a case names the store {store}: {line}",
                        path.display(),
                        number + 1
                    );
                }
            }
        }
        assert!(read >= 6, "the suite's case files were read ({read})");
    }

    /// docs/architecture.md: xtask drives cargo and the databases from outside; it depends on
    /// none of the workspace's crates.
    #[test]
    fn xtask_depends_on_no_workspace_crate() {
        for line in dependency_tree("xtask").iter().skip(1) {
            assert!(
                !line.starts_with("grpc-"),
                "xtask depends on the workspace crate {line}"
            );
        }
    }

    #[test]
    fn no_should_panic_ignore_todo_or_dbg() {
        // Spelled in pieces so that this file does not match itself.
        let forbidden = [
            concat!("#[should", "_panic"),
            concat!("#[ig", "nore"),
            concat!("to", "do!("),
            concat!("d", "bg!("),
        ];
        let root = workspace_root();
        let mut files = Vec::new();
        rust_files(&root.join("crates"), &mut files);
        rust_files(&root.join("xtask"), &mut files);
        assert!(files.len() > 10, "found only {} Rust files", files.len());
        let mut offences = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source is UTF-8");
            for (number, line) in text.lines().enumerate() {
                for pattern in forbidden {
                    if line.contains(pattern) {
                        offences.push(format!("{}:{}: {pattern}", file.display(), number + 1));
                    }
                }
            }
        }
        assert!(
            offences.is_empty(),
            "forbidden constructs:\n{}",
            offences.join("\n")
        );
    }

    #[test]
    fn every_adr_has_a_status_line() {
        let dir = workspace_root().join("docs").join("adr");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).expect("docs/adr exists").flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("ADR is UTF-8");
            assert!(
                text.lines()
                    .any(|line| line.starts_with("- Status: ") || line.starts_with("Status: ")),
                "{} has no Status line",
                path.display()
            );
            checked += 1;
        }
        assert!(checked >= 4, "expected at least four ADRs, found {checked}");
    }

    #[test]
    fn every_crate_takes_the_workspace_lints() {
        let root = workspace_root();
        let mut manifests = vec![root.join("xtask").join("Cargo.toml")];
        for entry in std::fs::read_dir(root.join("crates"))
            .expect("crates/ exists")
            .flatten()
        {
            manifests.push(entry.path().join("Cargo.toml"));
        }
        for manifest in manifests {
            let text = std::fs::read_to_string(&manifest).expect("manifest readable");
            assert!(
                text.contains("[lints]\nworkspace = true"),
                "{} does not use the workspace lints",
                manifest.display()
            );
        }
    }
}
