//! The lint CLI on a real descriptor set compiled from a .proto (protox) and real service configs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use prost::Message;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../grpc-policy/tests/data");

/// Compiles the payments .proto into a descriptor set file once per test.
fn descriptor_set(dir: &Path) -> PathBuf {
    let set = protox::compile(["payments.proto"], [DATA]).expect("the .proto compiles");
    let path = dir.join("payments.pb");
    std::fs::write(&path, set.encode_to_vec()).unwrap();
    path
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grpc-retry-lint-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn lint(config: &Path, descriptors: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpc-retry-lint"))
        .arg("--service-config")
        .arg(config)
        .arg("--descriptor-set")
        .arg(descriptors)
        .args(["--keyed", "/payments.v1.Payments/CreatePayment"])
        .args(extra)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_clean_config_exits_zero() {
    let dir = temp_dir("clean");
    let out = lint(
        &Path::new(DATA).join("retry_get_and_cancel.json"),
        &descriptor_set(&dir),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).ends_with("0 error(s), 0 warning(s)\n"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_renamed_method_exits_one_and_names_the_entry() {
    let dir = temp_dir("renamed");
    let out = lint(
        &Path::new(DATA).join("renamed_method.json"),
        &descriptor_set(&dir),
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains(
            "renamed_method.json:4:16: error[stale-name]: /payments.v1.Payments/FetchPayment matches no method"
        ),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_retry_over_a_method_declared_non_idempotent_exits_one_in_json_too() {
    let dir = temp_dir("nonidempotent");
    let out = lint(
        &Path::new(DATA).join("service_wide_retry.json"),
        &descriptor_set(&dir),
        &[
            "--format",
            "json",
            "--non-idempotent",
            "/payments.v1.Payments/Transfer",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON output");
    let first = &report["configs"][0]["findings"][0];
    assert_eq!(first["severity"], "error");
    assert_eq!(first["rule"], "non-idempotent-retry");
    assert_eq!(first["path"], "$.methodConfig[0].retryPolicy");
    assert!(first["line"].as_u64().unwrap() > 1);
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .contains("non-idempotent /payments.v1.Payments/Transfer")
    );
}

/// Undeclared idempotency is the common case in real protos: a warning with the fix, an error
/// only under --strict, and exit 1 on warnings only under --deny warnings.
#[test]
fn undeclared_idempotency_is_a_warning_unless_strict_or_denied() {
    let dir = temp_dir("undeclared");
    let config = Path::new(DATA).join("service_wide_retry.json");
    let out = lint(&config, &descriptor_set(&dir), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).contains("warning[undeclared-idempotency]"));
    assert!(stdout(&out).contains("option idempotency_level = IDEMPOTENT"));
    let strict = lint(&config, &descriptor_set(&dir), &["--strict"]);
    assert_eq!(strict.status.code(), Some(1));
    assert!(stdout(&strict).contains("error[undeclared-idempotency]"));
    let denied = lint(&config, &descriptor_set(&dir), &["--deny", "warnings"]);
    assert_eq!(denied.status.code(), Some(1));
}

#[test]
fn the_wrong_owner_and_stacked_layers_exit_one() {
    let dir = temp_dir("owner");
    let config = Path::new(DATA).join("retry_get_and_cancel.json");
    let out = lint(&config, &descriptor_set(&dir), &["--owner", "mesh"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("retry owner is mesh"));
    let out = lint(
        &config,
        &descriptor_set(&dir),
        &["--layer", "application=3", "--layer", "mesh=3"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("one call can become 27 attempts"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_config_a6_refuses_is_an_error_finding_at_its_path() {
    let dir = temp_dir("refused");
    let config = dir.join("bad.json");
    std::fs::write(&config, r#"{"methodConfig": [{"name": [{"service": "payments.v1.Payments"}], "retryPolicy": {"maxAttempts": 1}}]}"#).unwrap();
    let out = lint(&config, &descriptor_set(&dir), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("error[invalid-config]: must be at least 2"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn unreadable_inputs_exit_two_with_a_clear_message() {
    let dir = temp_dir("unreadable");
    let descriptors = descriptor_set(&dir);
    let not_json = dir.join("not.json");
    std::fs::write(&not_json, "{ nope").unwrap();
    let not_descriptors = dir.join("not.pb");
    std::fs::write(&not_descriptors, b"\xff\xff\xff garbage").unwrap();
    let good = Path::new(DATA).join("retry_get_and_cancel.json");
    let cases: Vec<(PathBuf, PathBuf, &[&str], &str)> = vec![
        (
            dir.join("missing.json"),
            descriptors.clone(),
            &[],
            "cannot read",
        ),
        (not_json, descriptors.clone(), &[], "not JSON"),
        (
            good.clone(),
            not_descriptors,
            &[],
            "not a protobuf FileDescriptorSet",
        ),
        (
            good.clone(),
            descriptors.clone(),
            &["--keyed", "/payments.v1.Payments/Nope"],
            "no such method",
        ),
        (
            good.clone(),
            descriptors.clone(),
            &["--non-idempotent", "/paymnets.v1.Payments/Transfer"],
            "matches no service",
        ),
        (
            good,
            descriptors,
            &["--layer", "mesh"],
            "expected NAME=ATTEMPTS",
        ),
    ];
    for (config, descriptor_set, extra, message) in cases {
        let out = lint(&config, &descriptor_set, extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
    }
}

/// A keyed mutation declared in the .proto with `(grpc_safe_retries.v1.keyed_mutation)` needs no
/// `--keyed`: the lint reads the option (its .proto is bundled, so the import resolves without
/// vendoring it). Retrying it is clean with a durable ledger and an error without one; the same
/// config over the same method without the option is the undeclared-idempotency warning.
#[test]
fn a_keyed_mutation_declared_in_the_proto_needs_no_flag() {
    let dir = temp_dir("keyed-option");
    let proto = |option: &str| {
        format!(
            "syntax = \"proto3\";\npackage shop.v1;\nimport \"grpc_safe_retries/v1/options.proto\";\n\
             service Orders {{\n  rpc CreateOrder(Order) returns (Order) {{ {option} }}\n}}\n\
             message Order {{ string id = 1; }}\n"
        )
    };
    let config = dir.join("retry_create.json");
    std::fs::write(
        &config,
        r#"{"methodConfig": [{"name": [{"service": "shop.v1.Orders"}], "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
    )
    .unwrap();
    let run = |option: &str, ledger: &str| {
        std::fs::write(dir.join("orders.proto"), proto(option)).unwrap();
        Command::new(env!("CARGO_BIN_EXE_grpc-retry-lint"))
            .arg("--service-config")
            .arg(&config)
            .arg("--proto")
            .arg(dir.join("orders.proto"))
            .arg("--include")
            .arg(&dir)
            .args(["--ledger", ledger])
            .output()
            .unwrap()
    };
    let keyed = "option (grpc_safe_retries.v1.keyed_mutation) = true;";
    let durable = run(keyed, "durable");
    assert_eq!(
        durable.status.code(),
        Some(0),
        "{}{}",
        stdout(&durable),
        String::from_utf8_lossy(&durable.stderr)
    );
    assert!(
        stdout(&durable).ends_with("0 error(s), 0 warning(s)\n"),
        "{}",
        stdout(&durable)
    );
    let without_ledger = run(keyed, "none");
    assert_eq!(
        without_ledger.status.code(),
        Some(1),
        "{}",
        stdout(&without_ledger)
    );
    assert!(
        stdout(&without_ledger).contains("keyed"),
        "{}",
        stdout(&without_ledger)
    );
    let undeclared = run("", "durable");
    assert!(
        stdout(&undeclared).contains("undeclared-idempotency"),
        "{}",
        stdout(&undeclared)
    );
}
