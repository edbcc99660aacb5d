//! Tidy checks: ordinary tests that keep the workspace's rules true at every commit.

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
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

    /// A crate's dependencies on other workspace crates: (for its code, for its tests only).
    type WorkspaceEdges = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

    /// Every workspace crate's dependencies on the others, as `cargo metadata` lists them: normal
    /// and build dependencies for its code, dev-dependencies (not already normal) for its tests.
    fn workspace_edges() -> WorkspaceEdges {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = Command::new(cargo)
            .current_dir(workspace_root())
            .args([
                "metadata",
                "--no-deps",
                "--format-version",
                "1",
                "--offline",
            ])
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
        let packages = metadata["packages"].as_array().expect("a package list");
        let members: BTreeSet<String> = packages
            .iter()
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        let mut edges = WorkspaceEdges::new();
        for package in packages {
            let name = package["name"].as_str().expect("a package name").to_owned();
            let (mut code, mut tests) = (BTreeSet::new(), BTreeSet::new());
            for dependency in package["dependencies"].as_array().into_iter().flatten() {
                let Some(on) = dependency["name"].as_str().filter(|d| members.contains(*d)) else {
                    continue;
                };
                match dependency["kind"].as_str() {
                    Some("dev") => tests.insert(on.to_owned()),
                    _ => code.insert(on.to_owned()),
                };
            }
            let tests = tests.difference(&code).cloned().collect();
            edges.insert(name, (code, tests));
        }
        edges
    }

    /// The table under `## Crate dependencies` in docs/architecture.md, read the same way.
    fn documented_edges(architecture: &str) -> WorkspaceEdges {
        let section = architecture
            .split("\n## Crate dependencies\n")
            .nth(1)
            .expect("docs/architecture.md has a `## Crate dependencies` section");
        let section = section.split("\n## ").next().unwrap_or_default();
        let crates_in = |cell: &str| -> BTreeSet<String> {
            cell.split(',')
                .map(|name| name.trim().trim_matches('`').to_owned())
                .filter(|name| !name.is_empty() && name != "—")
                .collect()
        };
        let mut edges = WorkspaceEdges::new();
        for row in section.lines().filter(|line| line.starts_with("| `")) {
            let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
            assert_eq!(cells.len(), 3, "a row of three cells: {row}");
            let name = cells[0].trim().trim_matches('`').to_owned();
            let previous = edges.insert(name.clone(), (crates_in(cells[1]), crates_in(cells[2])));
            assert!(previous.is_none(), "{name} has two rows");
        }
        edges
    }

    /// docs/architecture.md: its dependency table is the code's, crate for crate and edge for
    /// edge, so the picture of the house cannot drift from the house.
    #[test]
    fn every_crate_dependency_is_in_the_architecture() {
        let architecture = std::fs::read_to_string(workspace_root().join("docs/architecture.md"))
            .expect("docs/architecture.md readable");
        let documented = documented_edges(&architecture);
        let actual = workspace_edges();
        assert!(
            actual.len() >= 10,
            "cargo metadata listed the workspace ({})",
            actual.len()
        );
        let mut differences = Vec::new();
        for name in actual
            .keys()
            .chain(documented.keys())
            .collect::<BTreeSet<_>>()
        {
            match (actual.get(name), documented.get(name)) {
                (Some(_), None) => differences.push(format!("{name}: no row in the table")),
                (None, Some(_)) => differences.push(format!("{name}: a row, but no such crate")),
                (Some(real), Some(said)) if real != said => differences.push(format!(
                    "{name}: depends on {:?}, its tests also on {:?}; the table says {:?} and {:?}",
                    real.0, real.1, said.0, said.1
                )),
                _ => {}
            }
        }
        assert!(
            differences.is_empty(),
            "docs/architecture.md's crate dependencies differ from Cargo's:\n{}",
            differences.join("\n")
        );
    }

    #[test]
    fn the_dependency_table_is_read_as_written() {
        let table = "x\n## Crate dependencies\n\n| crate | depends on | its tests also use |\n\
                     |---|---|---|\n| `a` | — | — |\n| `b` | `a`, `c` | `d` |\n\n## Next\n| `z` | — | — |\n";
        let edges = documented_edges(table);
        assert_eq!(edges.len(), 2, "{edges:?}");
        assert!(edges["a"].0.is_empty() && edges["a"].1.is_empty());
        assert_eq!(
            edges["b"].0,
            BTreeSet::from(["a".to_owned(), "c".to_owned()])
        );
        assert_eq!(edges["b"].1, BTreeSet::from(["d".to_owned()]));
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

    /// The distinct crates in `package`'s normal dependency tree (itself included) with `features`
    /// (`None`: its defaults), as `cargo tree -e normal` prints them.
    fn tree_of(package: &str, features: Option<&str>) -> BTreeSet<String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let mut command = Command::new(cargo);
        command.current_dir(workspace_root()).args([
            "tree",
            "--quiet",
            "--package",
            package,
            "--edges",
            "normal",
            "--prefix",
            "none",
        ]);
        if let Some(features) = features {
            command.args(["--no-default-features", "--features", features]);
        }
        let out = command.output().expect("cargo tree runs");
        assert!(out.status.success(), "cargo tree failed for {package}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|line| line.trim_end_matches(" (*)").to_owned())
            .collect()
    }

    /// The README's table of library crates says how many crates each one's tree holds: what
    /// cargo tree counts today, for its defaults and for each store of the SeaORM adapter alone.
    #[test]
    fn the_readmes_dependency_counts_are_cargo_trees() {
        let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
        let mut rows = 0;
        for line in readme.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let [_, name, features, count, _] = cells[..] else {
                continue;
            };
            let Ok(count) = count.parse::<usize>() else {
                continue;
            };
            let package = name.split('`').nth(1).expect("a crate name in backquotes");
            rows += 1;
            assert_eq!(
                tree_of(package, None).len(),
                count,
                "{package}: the README's dependency count is stale"
            );
            if let Some(alone) = features
                .split_once("each alone: ")
                .map(|(_, rest)| rest.trim_end_matches(')'))
            {
                let stores = ["postgres", "mysql", "sqlite"];
                for (store, count) in stores.iter().zip(alone.split(", ")) {
                    assert_eq!(
                        tree_of(package, Some(store)).len().to_string(),
                        count,
                        "{package} with only `{store}`: the README's count is stale"
                    );
                }
            }
        }
        assert_eq!(
            rows, 8,
            "the README's table of library crates, read as written"
        );
    }

    /// A crate that depends on the SeaORM adapter with one store gets that store's driver and no
    /// other's (no SQLite C library without `sqlite`).
    #[test]
    fn each_store_of_the_seaorm_adapter_brings_only_its_driver() {
        let drivers = [
            ("postgres", "sqlx-postgres"),
            ("mysql", "sqlx-mysql"),
            ("sqlite", "sqlx-sqlite"),
        ];
        for (feature, driver) in drivers {
            let tree = tree_of("grpc-operation-ledger-seaorm", Some(feature));
            let has = |name: &str| {
                tree.iter()
                    .any(|line| line.starts_with(&format!("{name} ")))
            };
            assert!(has(driver), "with `{feature}`: no {driver}");
            for (_, other) in drivers.iter().filter(|(f, _)| *f != feature) {
                assert!(!has(other), "with only `{feature}`: {other} is in the tree");
            }
            assert_eq!(
                has("libsqlite3-sys"),
                feature == "sqlite",
                "with only `{feature}`: SQLite's C library"
            );
        }
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
