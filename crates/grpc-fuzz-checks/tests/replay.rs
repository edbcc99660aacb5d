//! Every fuzz target's seeds (`fuzz/seeds/<target>`) and kept regressions
//! (`fuzz/regressions/<target>`: inputs the fuzzer once broke a property with) through the
//! target's check: no fuzzing, seconds, in every `cargo xtask test`.

use std::path::Path;

use grpc_fuzz_checks::{TARGETS, check};

#[test]
fn every_seed_and_regression_passes_its_targets_check() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut failures = Vec::new();
    let mut replayed = 0;
    for target in TARGETS {
        let mut inputs = 0;
        for folder in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(folder).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                let data = std::fs::read(&path).expect("an input");
                inputs += 1;
                if let Err(panic) = std::panic::catch_unwind(|| check(target, &data)) {
                    let why = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_default();
                    failures.push(format!("{}: {why}", path.display()));
                }
            }
        }
        assert!(inputs > 0, "fuzz target {target} has no seeds");
        replayed += inputs;
    }
    assert!(
        failures.is_empty(),
        "{} of {replayed} inputs broke their target's property:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The kept service-config regression is the case the fuzzer found: a status code spelled
/// `UnAVAILABLE` is accepted with a portability note that the canonical emitted config no longer
/// has, which the old round-trip property (models equal, notes included) called a failure.
#[test]
fn the_mixed_case_status_code_regression_is_the_case_found() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/regressions/service_config/mixed_case_status_code.json"
    );
    let text = std::fs::read_to_string(path).expect("the regression");
    let config = grpc_policy::ServiceConfig::parse(&text).expect("accepted");
    assert!(!config.portability.is_empty(), "{config:?}");
    let again = grpc_policy::ServiceConfig::parse(&config.to_json().to_string()).expect("parses");
    assert!(again.portability.is_empty());
}

/// The fingerprint target's seeds are requests the schema reads, so fuzzing starts from the deep
/// path (decode, canonical form, re-encoding) rather than from refusals.
#[test]
fn the_fingerprint_seeds_are_requests_the_schema_reads() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/request_fingerprint"
    );
    let descriptors = grpc_fuzz_checks::orders_descriptor_set();
    let schema = grpc_core_api::RequestSchema::from_file_descriptor_set(descriptors).unwrap();
    let method = grpc_core_api::GrpcMethod::parse("/orders.v1.Orders/CreateOrder").unwrap();
    for entry in std::fs::read_dir(dir).expect("seeds") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        assert!(
            schema.fingerprint(&method, &data).is_ok(),
            "{}",
            path.display()
        );
    }
}
