//! The lint on fixtures made after what real service configs do (Google's public API configs, each
//! checked against its own protos): a retryPolicy without maxAttempts with stale names behind it, a
//! service name with a trailing dot, a method name with a leading space, a repeated name, a service
//! that declares no methods, and retries over methods whose idempotency is not declared. Every
//! format's output is a golden file (`UPDATE_EXPECT=1 cargo test` rewrites them).

use std::process::{Command, Output};

use expect_test::expect_file;

const CONFIGS: &str = "tests/fixtures/realworld/configs";

/// The lint on `configs` against the fixtures' protos.
fn lint_on(configs: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpc-retry-lint"))
        .arg(configs)
        .args([
            "--proto",
            "tests/fixtures/realworld/proto/shop/v1/shop.proto",
            "--include",
            "tests/fixtures/realworld/proto",
        ])
        .args(extra)
        .output()
        .expect("the lint runs")
}

fn lint(extra: &[&str]) -> Output {
    lint_on(CONFIGS, extra)
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

#[test]
fn every_stale_name_is_named_at_its_path_whatever_else_is_wrong() {
    let out = lint(&["--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let mut stale: Vec<String> = report["configs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|config| {
            let file = config["file"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .next()
                .unwrap()
                .to_owned();
            config["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["rule"] == "stale-name")
                .map(move |f| format!("{file} {}", f["path"].as_str().unwrap()))
                .collect::<Vec<_>>()
        })
        .collect();
    stale.sort();
    assert_eq!(
        stale,
        [
            "leading_space_grpc_service_config.json $.methodConfig[0].name[1]",
            "missing_max_attempts_grpc_service_config.json $.methodConfig[0].name[1]",
            "missing_max_attempts_grpc_service_config.json $.methodConfig[0].name[2]",
            "repeated_names_grpc_service_config.json $.methodConfig[1].name[1]",
            "trailing_dot_grpc_service_config.json $.methodConfig[0].name[2]",
        ]
    );
}

#[test]
fn text_output_points_editors_at_each_finding() {
    expect_file!["fixtures/realworld/expected/text.txt"].assert_eq(&stdout(&lint(&[])));
}

#[test]
fn json_output() {
    expect_file!["fixtures/realworld/expected/report.json"]
        .assert_eq(&stdout(&lint(&["--format", "json"])));
}

#[test]
fn github_actions_annotations() {
    expect_file!["fixtures/realworld/expected/github.txt"]
        .assert_eq(&stdout(&lint(&["--format", "github"])));
}

#[test]
fn sarif_output() {
    let out = stdout(&lint(&["--format", "sarif"]));
    expect_file!["fixtures/realworld/expected/report.sarif"].assert_eq(&out);
    check_sarif(&serde_json::from_str(&out).expect("SARIF is JSON"));
    validate_against_the_sarif_schema(&out);
}

/// Validates `sarif` against the OASIS SARIF 2.1.0 JSON schema (SARIF_SCHEMA, which
/// `cargo xtask test` fetches) with Python's `jsonschema`.
fn validate_against_the_sarif_schema(sarif: &str) {
    let schema = std::env::var("SARIF_SCHEMA").expect(
        "SARIF_SCHEMA is not set: run `cargo xtask test`, which fetches the SARIF 2.1.0 schema, \
         or point SARIF_SCHEMA at sarif-2.1.0-rtm.5.json",
    );
    let file = std::env::temp_dir().join(format!("grpc-retry-lint-{}.sarif", std::process::id()));
    std::fs::write(&file, sarif).unwrap();
    let output = Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[2]))\n\
             jsonschema.validators.validator_for(schema)(schema).validate(json.load(open(sys.argv[1])))",
        ])
        .arg(&file)
        .arg(&schema)
        .output()
        .expect("python3 with jsonschema (which `cargo xtask test` installs)");
    let _ = std::fs::remove_file(&file);
    assert!(
        output.status.success(),
        "the SARIF does not validate against {schema}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The SARIF 2.1.0 schema's requirements on what the lint emits: the version and a run with a
/// named driver; each result a known level, a message with text, a rule id the driver declares,
/// and a physical location with a relative URI and a 1-based region.
fn check_sarif(sarif: &serde_json::Value) {
    assert_eq!(sarif["version"], "2.1.0");
    assert_eq!(
        sarif["$schema"],
        "https://json.schemastore.org/sarif-2.1.0.json"
    );
    let runs = sarif["runs"].as_array().expect("runs is an array");
    assert_eq!(runs.len(), 1);
    let driver = &runs[0]["tool"]["driver"];
    assert!(driver["name"].is_string());
    let rules: Vec<&str> = driver["rules"]
        .as_array()
        .expect("rules is an array")
        .iter()
        .map(|rule| {
            assert!(rule["shortDescription"]["text"].is_string());
            rule["id"].as_str().expect("a rule has an id")
        })
        .collect();
    let results = runs[0]["results"].as_array().expect("results is an array");
    assert!(!results.is_empty());
    for result in results {
        assert!(["none", "note", "warning", "error"].contains(&result["level"].as_str().unwrap()));
        assert!(result["message"]["text"].is_string());
        assert!(rules.contains(&result["ruleId"].as_str().unwrap()));
        let location = &result["locations"][0]["physicalLocation"];
        let uri = location["artifactLocation"]["uri"].as_str().unwrap();
        assert!(!uri.starts_with('/') && !uri.contains('\\') && !uri.contains(' '));
        assert!(location["region"]["startLine"].as_u64().unwrap() >= 1);
        assert!(location["region"]["startColumn"].as_u64().unwrap() >= 1);
    }
}

#[test]
fn exit_codes_follow_the_worst_finding() {
    let run =
        |file: &str, extra: &[&str]| lint_on(&format!("{CONFIGS}/{file}"), extra).status.code();
    let warnings_only = "undeclared_grpc_service_config.json";
    assert_eq!(run(warnings_only, &[]), Some(0));
    assert_eq!(run(warnings_only, &["--deny", "warnings"]), Some(1));
    assert_eq!(run(warnings_only, &["--strict"]), Some(1));
    assert_eq!(run("empty_service_grpc_service_config.json", &[]), Some(0));
    assert_eq!(run("trailing_dot_grpc_service_config.json", &[]), Some(1));
    assert_eq!(run("no_such_file.json", &[]), Some(2));
}
