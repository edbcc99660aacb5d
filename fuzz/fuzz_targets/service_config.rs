//! The `service_config` property of `grpc_fuzz_checks` (see there), on generated inputs; every seed and
//! kept regression is also replayed by `cargo xtask test` (`crates/grpc-fuzz-checks/tests`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| grpc_fuzz_checks::service_config(data));
