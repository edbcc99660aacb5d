//! The `request_fingerprint` property of `grpc_fuzz_checks` (see there): any bytes as a request
//! against a schema with maps, nested, repeated, oneof, optional, enum and `Any` fields; every
//! seed and kept regression is also replayed by `cargo xtask test`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| grpc_fuzz_checks::request_fingerprint(data));
